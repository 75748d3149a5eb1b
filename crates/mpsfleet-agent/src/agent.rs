//! The agent's main loop: register (or reuse the identity in the data dir), supervise the MPS
//! daemons, heartbeat with their checks, long-poll for assignments, and run them.
//!
//! Three activities share one [`Shared`] state:
//! - the heartbeat (async): posts the host's checks every `heartbeat` interval;
//! - the assignments long-poll (async): hands each new answer to the task loop;
//! - the task loop (a thread, see [`crate::tasks`]): starts, watches, probes, stops and
//!   reports tasks. Everything it decides is written to the task table in the data dir first,
//!   so an agent restart (even kill -9) adopts running tasks and reports what happened while
//!   it was down.

use crate::container_health::{PingPolicy, RuntimeCheck, SharedCheck};
use crate::discovery::{self, Discovered};
use crate::docker::{DockerConfig, DockerRuntime};
use crate::gpu_health::GpuWatch;
use crate::mps::supervisor::Supervisors;
use crate::mps::{DaemonConfig, ModelMps, MpsControl, MpsPolicy, RealMps, Supervisor};
use crate::runtime::engine::Engine;
use crate::tasks::{Gpus, TaskLoop};
use mpsfleet_client::tls::Trust;
use mpsfleet_client::Client;
use mpsfleet_core::clock::{Clock, SystemClock};
pub use mpsfleet_core::lifecycle::mps::pool_mps_policy;
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Which MPS control the agent drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpsMode {
    /// The real `nvidia-cuda-mps-control` at this path.
    Real(PathBuf),
    /// The in-process model of the MPS protocol (for trying mpsfleet without the binary).
    Model,
    /// No MPS: the host takes only whole-GPU and GPU-less tasks.
    Unavailable,
}

/// Which task runtime the agent uses (`--runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeChoice {
    /// Docker when its socket answers, else processes; the agent says which.
    Auto,
    Process,
    Docker,
}

/// How the agent reaches and uses Docker Engine.
#[derive(Debug, Clone)]
pub struct DockerSettings {
    pub socket: PathBuf,
    pub pull: crate::docker::PullBehavior,
    pub pull_timeout: Duration,
    /// How long a stopped task's containers are kept (for `docker inspect` and their logs)
    /// before they are removed.
    pub container_retention: Duration,
    pub images: crate::docker::ImagePolicy,
    /// Where bridge ports are published (`--publish-address`); None: every address, as ECS.
    pub publish_address: Option<std::net::IpAddr>,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub server: String,
    /// Needed the first time only: afterwards the host's credential is in the data dir. For
    /// an `https://` server it carries the cluster CA's hash after its secret
    /// ([`mpsfleet_client::tls`]), unless `ca_file` names the CA.
    pub join_token: Option<String>,
    /// The cluster CA (PEM) to verify the server with; by default the one pinned by the join
    /// token's hash at first contact, kept in the data dir.
    pub ca_file: Option<PathBuf>,
    pub pool: String,
    pub data_dir: PathBuf,
    pub hostname: String,
    /// The zone this host reports (ECS's `availabilityZone` of its tasks).
    pub availability_zone: String,
    /// `MODEL:MEMORY_MIB:COUNT`, used when NVML finds no GPU.
    pub emulate_gpus: Option<String>,
    pub mps: MpsMode,
    /// One daemon for all GPUs instead of one per GPU.
    pub daemon_per_host: bool,
    /// The MPS policy until the server sends the pool's (the answer to the first heartbeat);
    /// from then on the pool's health policy decides the probe interval and timeout, the
    /// failure threshold and the local restarts, and this keeps only the restart window and
    /// backoff.
    pub policy: MpsPolicy,
    pub heartbeat: Duration,
    /// Inject the faults a drill asks for (`--allow-fault-injection`); off, they are ignored.
    pub allow_fault_injection: bool,
    /// Stop every task when the agent stops (what `mpsfleet up` wants); by default tasks keep
    /// running across agent restarts.
    pub stop_tasks_on_exit: bool,
    /// The command that runs a task's shim: `[<mpsfleet binary>, "shim"]`.
    pub shim: Vec<OsString>,
    /// Where the agent serves task logs to the server (port 0: any free port).
    pub logs_listen: std::net::SocketAddr,
    pub runtime: RuntimeChoice,
    pub docker: DockerSettings,
    /// The uids tasks get when the agent runs as root (`--task-uid-range`); checked against the
    /// agent's own uid at start.
    pub task_uids: crate::runtime::UidRange,
    /// What tasks of other uids must reach (their own directories, the MPS pipe directories)
    /// when the agent runs as root: `--run-dir`, else [`default_run_dir`].
    pub run_dir: Option<PathBuf>,
}

/// Where a root agent keeps what its tasks must reach: `/run/mpsfleet-agent/<key of the data
/// dir>` (short, so that MPS socket paths fit; `/run` only root may write).
pub fn default_run_dir(data_dir: &Path) -> PathBuf {
    PathBuf::from("/run/mpsfleet-agent").join(host_key(data_dir))
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Discovery(#[from] discovery::DiscoveryError),
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("this host is not registered yet and no join token was given (--join-token)")]
    NoJoinToken,
    /// Nothing says which CA to trust the `https://` server with, or the server is not the
    /// cluster the join token names.
    #[error("cannot trust the server {server}: {why}")]
    Trust { server: String, why: String },
    #[error("the data dir {} belongs to a host of server {theirs}, not {ours}", path.display())]
    OtherServer { path: PathBuf, theirs: String, ours: String },
    #[error("cannot register with {server}: {source}")]
    Register { server: String, source: mpsfleet_client::ClientError },
    #[error(transparent)]
    Client(#[from] mpsfleet_client::ClientError),
    #[error("mps: {0}")]
    Mps(#[from] crate::mps::MpsError),
    #[error("task runtime: {0}")]
    Runtime(String),
    #[error("{0}; exiting so that the agent is restarted")]
    TaskLoopDied(String),
    #[error("--runtime docker: Docker Engine does not answer on {socket}: {reason}")]
    NoDocker { socket: PathBuf, reason: String },
    #[error("{0}")]
    Config(String),
}

/// What the agent keeps about itself in its data dir (`identity.json`, mode 0600): the host
/// credential it presents, and only the digest of the token the server presents to it.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Identity {
    host_id: HostId,
    credential: String,
    /// The SHA-256 hex digest of what the server presents when it fetches logs from this agent.
    #[serde(default)]
    agent_token_sha256: String,
    /// The token itself, as agents before digests wrote it: replaced by its digest on load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_token: Option<String>,
    server: String,
    /// The runtime the host registered with; it stays the host's runtime across restarts.
    /// Identities written before containers existed are process hosts.
    #[serde(default)]
    runtime: RuntimeKind,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("host_id", &self.host_id)
            .field("server", &self.server)
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

const IDENTITY_FILE: &str = "identity.json";
/// The cluster CA the agent trusts, pinned at first contact.
const CA_FILE: &str = "ca.pem";

/// The CAs the agent trusts its server by, as its heartbeats report them, and whether the
/// agent keeps them itself (in its data dir, pinned at join) and so follows the cluster's CA
/// rotations, or was given them (`--ca-file`, which the operator updates).
#[derive(Debug, Clone, Default)]
struct CaTrust {
    hashes: Vec<String>,
    kept: Option<PathBuf>,
}

impl CaTrust {
    fn of(pem: &[u8], kept: Option<PathBuf>) -> CaTrust {
        CaTrust { hashes: mpsfleet_client::tls::ca_hashes(pem).unwrap_or_default(), kept }
    }
}

/// Whether `a` and `b` name the same CAs, in any order.
fn same_cas(a: &[String], b: &[String]) -> bool {
    let norm =
        |v: &[String]| v.iter().map(|h| h.to_ascii_lowercase()).collect::<std::collections::BTreeSet<_>>();
    norm(a) == norm(b)
}

/// Whom the agent trusts its server to be. A plain `http://` server is not verified. For an
/// `https://` one: the CAs of `--ca-file`; else those kept in the data dir (pinned at an
/// earlier first contact, then followed through CA rotations), unless the agent has not
/// registered yet and its join token names another CA; else the CA the server hands out, if
/// its hash is the one in the join token (then kept).
async fn trust(cfg: &AgentConfig) -> Result<(Trust, CaTrust), AgentError> {
    let refuse = |why: String| AgentError::Trust { server: cfg.server.clone(), why };
    let pin = cfg.join_token.as_deref().and_then(|t| mpsfleet_client::tls::split_pin(t).1);
    if !cfg.server.starts_with("https://") {
        if pin.is_some() {
            tracing::warn!(server = %cfg.server, "plain HTTP server: nothing is verified, and the CA hash in the join token is not used");
        }
        return Ok((Trust::PlainHttp, CaTrust::default()));
    }
    if let Some(path) = &cfg.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| refuse(format!("cannot read --ca-file {}: {e}", path.display())))?;
        let trust = CaTrust::of(&pem, None);
        return Ok((Trust::Ca(pem), trust));
    }
    let kept_path = cfg.data_dir.join(CA_FILE);
    let kept = crate::safe_fs::read_beneath(&cfg.data_dir, Path::new(CA_FILE), 1 << 20)
        .map_err(|e| refuse(format!("cannot read {}: {e}", kept_path.display())))?;
    if let Some(pem) = kept {
        let hashes = mpsfleet_client::tls::ca_hashes(&pem)
            .map_err(|e| refuse(format!("{}: {e}", kept_path.display())))?;
        let registered = cfg.data_dir.join(IDENTITY_FILE).exists();
        match &pin {
            Some(pin) if !registered && !hashes.iter().any(|h| h.eq_ignore_ascii_case(pin)) => {
                tracing::info!(
                    kept = ?hashes, token = %pin,
                    "the join token names another CA than the ones kept; fetching the server's"
                )
            }
            _ => return Ok((Trust::Ca(pem), CaTrust { hashes, kept: Some(kept_path) })),
        }
    }
    let Some(pin) = pin else {
        return Err(refuse(
            "the join token carries no CA hash (mpsf_join_….sha256:…) and no --ca-file was given: \
             nothing says which CA to trust"
                .into(),
        ));
    };
    let mut delay = Duration::from_millis(200);
    let pem = loop {
        match mpsfleet_client::tls::fetch_pinned_ca(&cfg.server, &pin).await {
            Ok(pem) => break pem,
            Err(e @ mpsfleet_client::ClientError::Transport { .. }) if delay < Duration::from_secs(10) => {
                tracing::warn!(error = %e, "cannot fetch the server's CA; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => return Err(refuse(e.to_string())),
        }
    };
    crate::safe_fs::write_atomic(&kept_path, &pem).map_err(io("cannot keep the cluster CA", &kept_path))?;
    tracing::info!(ca = %pin, "trusting the cluster CA the join token names");
    let trust = CaTrust::of(&pem, Some(kept_path));
    Ok((Trust::Ca(pem), trust))
}

/// Follows a CA rotation: fetches the CAs the cluster trusts now over the connection the agent
/// verifies already, checks they are the ones its heartbeat answer named (`wanted`), keeps them
/// and trusts them from the next request on, in every loop of the agent.
async fn follow_cas(agent: &Client, wanted: &[String], kept: &Path) -> Result<Vec<String>, String> {
    let pem = agent.cluster_ca_bundle().await.map_err(|e| e.to_string())?;
    if pem.len() > 1 << 20 {
        return Err(format!("the server's CA bundle is {} bytes, more than 1 MiB", pem.len()));
    }
    let got = mpsfleet_client::tls::ca_hashes(&pem)?;
    if !same_cas(&got, wanted) {
        return Err(format!("the server serves the CAs {got:?}, not the {wanted:?} its answer named"));
    }
    crate::safe_fs::write_atomic(kept, &pem)
        .map_err(|e| format!("cannot keep the CAs in {}: {e}", kept.display()))?;
    agent.set_trust(&Trust::Ca(pem)).map_err(|e| e.to_string())?;
    Ok(got)
}

/// The longest pipe directory whose socket path still fits in `sun_path`.
const MAX_PIPE_DIR: usize = 88;

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> AgentError + 'a {
    move |source| AgentError::Io { what, path: path.to_path_buf(), source }
}

/// Runs the agent until `shutdown` completes.
pub async fn run(cfg: AgentConfig, shutdown: impl Future<Output = ()> + Send) -> Result<(), AgentError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // The agent's alone, whatever it was before: identity, task records and logs.
    crate::safe_fs::private_dir(&cfg.data_dir, 0o700)
        .map_err(io("cannot create the data dir", &cfg.data_dir))?;
    let identity_path = cfg.data_dir.join(IDENTITY_FILE);
    if std::fs::symlink_metadata(&identity_path).is_ok() {
        crate::safe_fs::set_file_mode(&identity_path, 0o600)
            .map_err(io("cannot make the host identity 0600", &identity_path))?;
    }
    let found = discovery::discover(cfg.emulate_gpus.as_deref(), &host_key(&cfg.data_dir))?;
    let users = task_users(&cfg, &found)?;
    let (trust, ca_trust) = trust(&cfg).await?;
    let client = Client::with_trust(&cfg.server, None, &trust)?;
    let engine_version = match registered_runtime(&cfg) {
        // A host keeps the runtime it registered with: the server places by it. A Docker host
        // whose engine does not answer now is impaired (CONTAINER_RUNTIME), not a process host.
        Some(RuntimeKind::Docker) => Some(match choose_runtime_docker(&cfg).await {
            Ok(v) => v,
            Err(why) => {
                tracing::warn!(error = %why, "registered with Docker, which does not answer: the CONTAINER_RUNTIME check says so until it does");
                "unknown".into()
            }
        }),
        Some(RuntimeKind::Process) => {
            if cfg.runtime == RuntimeChoice::Docker {
                tracing::warn!("this host registered as a process host and stays one; --runtime docker takes effect for a new data dir");
            }
            tracing::info!(
                runtime = "process",
                "tasks run as processes (the runtime this host registered with)"
            );
            None
        }
        None => choose_runtime(&cfg).await?,
    };
    let identity = identity(&cfg, &client, &found, &engine_version).await?;
    let agent = client.with_token(identity.credential.clone());
    tracing::info!(host.id = %identity.host_id, gpus = found.gpus.len(), emulated = found.emulated, "registered");

    let supervisors = start_supervisors(&cfg, &found, users.range.is_some(), clock.clone())?;
    let gpu_watch = Arc::new(
        GpuWatch::start(&found, &cfg.data_dir, clock.clone())
            .map_err(|e| AgentError::Runtime(e.to_string()))?,
    );
    let gpus = Gpus::new(&supervisors);
    let runtime_check: Option<SharedCheck>;
    let mut docker_rt: Option<DockerRuntime> = None;
    let mut background = Vec::new();
    let runtime = match &engine_version {
        None => {
            runtime_check = None;
            Engine::Process(
                crate::runtime::Runtime::new(cfg.shim.clone())
                    .map_err(|e| AgentError::Runtime(e.to_string()))?,
            )
        }
        Some(_) => {
            let rt = connect_docker(&cfg, Some(identity.host_id.to_string()))?;
            let policy = PingPolicy::default();
            let check: SharedCheck =
                Arc::new(std::sync::Mutex::new(RuntimeCheck::new(policy.threshold, clock.now_ms())));
            runtime_check = Some(check.clone());
            background.push(tokio::spawn(crate::container_health::watch(
                rt.clone(),
                policy,
                check,
                clock.clone(),
            )));
            background.push(tokio::spawn(janitor(rt.clone(), cfg.docker.clone(), clock.clone())));
            let process = crate::runtime::Runtime::new(cfg.shim.clone())
                .map_err(|e| AgentError::Runtime(e.to_string()))?;
            docker_rt = Some(rt.clone());
            Engine::Docker { rt, process, gpus_emulated: found.emulated }
        }
    };
    let mut task_loop = TaskLoop::start(
        cfg.data_dir.join("tasks"),
        runtime,
        gpus,
        users,
        agent.clone(),
        tokio::runtime::Handle::current(),
        clock.clone(),
    )
    .map_err(|e| AgentError::Runtime(e.to_string()))?;

    let listener = tokio::net::TcpListener::bind(cfg.logs_listen).await.map_err(|source| AgentError::Io {
        what: "cannot listen for logs on",
        path: cfg.logs_listen.to_string().into(),
        source,
    })?;
    let logs_addr = listener.local_addr().map_err(|e| AgentError::Runtime(e.to_string()))?;
    let sources = Arc::new(crate::metrics::Sources {
        supervisors: supervisors.clone(),
        gpu_watch: gpu_watch.clone(),
        runtime: runtime_check.clone(),
        inventory: found.gpus.clone(),
        tasks: task_loop.view(),
        gpu_use: crate::gpu_use::Source::new(found.emulated, &cfg.data_dir),
    });
    let app = crate::logs::router(
        cfg.data_dir.join("tasks"),
        identity.agent_token_sha256.clone(),
        engine_version.as_ref().and_then(|_| connect_docker(&cfg, Some(identity.host_id.to_string())).ok()),
    )
    .merge(crate::metrics::router(sources.clone(), identity.agent_token_sha256.clone()))
    .merge(crate::exec::router(
        cfg.data_dir.join("tasks"),
        identity.agent_token_sha256.clone(),
        engine_version.as_ref().and_then(|_| connect_docker(&cfg, Some(identity.host_id.to_string())).ok()),
        cfg.shim.first().cloned().unwrap_or_else(|| "mpsfleet".into()),
    ));
    // HTTPS with a certificate of its own, pinned by the server (crate::endpoint); plain HTTP
    // only for a plain-HTTP server.
    let (logs_url, logs_cert, logs) = if cfg.server.starts_with("https://") {
        let cert = crate::endpoint::EndpointCert::generate().map_err(AgentError::Runtime)?;
        let tls = crate::endpoint::TlsListener::new(listener, &cert).map_err(|source| AgentError::Io {
            what: "cannot listen for logs on",
            path: cfg.logs_listen.to_string().into(),
            source,
        })?;
        let served = tokio::spawn(async move {
            if let Err(e) = axum::serve(tls, app).await {
                tracing::error!(error = %e, "logs endpoint stopped");
            }
        });
        (format!("https://{logs_addr}"), Some(cert.sha256), served)
    } else {
        let served = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "logs endpoint stopped");
            }
        });
        (format!("http://{logs_addr}"), None, served)
    };
    let heartbeat = tokio::spawn(heartbeat_loop(
        agent.clone(),
        sources,
        Arc::new(crate::faults::Injector::new(cfg.allow_fault_injection, Arc::new(SystemClock))),
        cfg.heartbeat,
        Reported { logs_url, logs_cert_sha256: logs_cert, cas: ca_trust },
        cfg.policy.clone(),
    ));
    let assignments = tokio::spawn(assignments_loop(agent.clone(), task_loop.sender()));
    let ended = until_shutdown(shutdown, task_loop.died()).await;
    tracing::info!("stopping");
    heartbeat.abort();
    assignments.abort();
    logs.abort();
    for b in &background {
        b.abort();
    }
    if let Err(e) = ended {
        // Exit for the supervisor to restart the agent; tasks and MPS daemons keep running for
        // the next agent to adopt, so the daemons are not stopped here.
        std::mem::forget(supervisors);
        return Err(e);
    }
    // Wait until both are gone, so that their references to the supervisors are dropped.
    let _ = heartbeat.await;
    let _ = assignments.await;
    let stop_tasks = cfg.stop_tasks_on_exit;
    tokio::task::spawn_blocking(move || {
        task_loop.shutdown(stop_tasks);
        // Stopping everything (what `mpsfleet up` asks) leaves no stopped container behind:
        // no agent of this host may come back to remove it.
        if let (true, Some(rt)) = (stop_tasks, &docker_rt) {
            remove_stopped_containers(rt, |_| true);
        }
        // Every other holder is gone now; a supervisor shared by several GPUs (one daemon per
        // host) is shut down when its last reference is taken.
        let map = Arc::into_inner(supervisors).unwrap_or_default();
        for s in map.into_values() {
            if let Some(s) = Arc::into_inner(s) {
                if let Err(e) = s.shutdown() {
                    tracing::warn!(error = %e, "mps daemon did not stop cleanly");
                }
            }
        }
    })
    .await
    .map_err(|e| AgentError::Runtime(e.to_string()))?;
    Ok(())
}

/// Waits for `shutdown`; fails when the task loop dies first, so that the agent exits (and is
/// restarted) instead of heartbeating while it runs nothing.
async fn until_shutdown(
    shutdown: impl Future<Output = ()> + Send,
    died: impl Future<Output = String> + Send,
) -> Result<(), AgentError> {
    tokio::select! {
        () = shutdown => Ok(()),
        why = died => Err(AgentError::TaskLoopDied(why)),
    }
}

/// A short, stable key for this host's emulated GPU UUIDs, derived from its data dir.
fn host_key(data_dir: &Path) -> String {
    let abs = data_dir.canonicalize().unwrap_or_else(|_| data_dir.to_path_buf());
    let h = abs
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{:08x}", h as u32)
}

async fn identity(
    cfg: &AgentConfig,
    client: &Client,
    found: &Discovered,
    engine_version: &Option<String>,
) -> Result<Identity, AgentError> {
    let path = cfg.data_dir.join(IDENTITY_FILE);
    if let Some(id) = load_identity(&path)? {
        if id.server.trim_end_matches('/') != cfg.server.trim_end_matches('/') {
            tracing::warn!(theirs = %id.server, ours = %cfg.server, "server address changed; keeping the identity");
        }
        return Ok(id);
    }
    let join = cfg.join_token.clone().ok_or(AgentError::NoJoinToken)?;
    // A Docker host reports its engine's volume and log drivers: the server refuses tasks
    // needing a volume driver no host of the pool has.
    let plugins = match engine_version {
        Some(_) => crate::docker::engine_plugins(&cfg.docker.socket, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot ask Docker for its volume and log drivers");
                Default::default()
            }),
        None => Default::default(),
    };
    let reg = HostRegistration {
        pool: PoolName::new(cfg.pool.clone()).map_err(|e| AgentError::Runtime(e.to_string()))?,
        hostname: cfg.hostname.clone(),
        gpus: found.gpus.clone(),
        mps_available: cfg.mps != MpsMode::Unavailable,
        emulated: found.emulated || cfg.mps == MpsMode::Model,
        runtime: if engine_version.is_some() { RuntimeKind::Docker } else { RuntimeKind::Process },
        runtime_version: engine_version.clone(),
        plugins,
        platform: platform(&cfg.availability_zone),
    };
    // The secret only: the CA hash after it has done its part (see [`trust`]).
    let joiner = client.with_token(mpsfleet_client::tls::split_pin(&join).0.to_string());
    let mut delay = Duration::from_millis(200);
    let resp = loop {
        match joiner.register_host(&reg).await {
            Ok(r) => break r,
            // The server may still be starting: retry transport errors, not refusals.
            Err(e @ mpsfleet_client::ClientError::Transport { .. }) if delay < Duration::from_secs(10) => {
                tracing::warn!(error = %e, "cannot reach the server; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            // Past the join token's rate: wait as long as the server says.
            Err(e @ mpsfleet_client::ClientError::RateLimited { .. }) => {
                tracing::warn!(error = %e, "registration rate-limited; retrying");
                tokio::time::sleep(e.retry_after().unwrap_or(Duration::from_secs(1))).await;
            }
            Err(source) => return Err(AgentError::Register { server: cfg.server.clone(), source }),
        }
    };
    let id = Identity {
        host_id: resp.host_id,
        credential: resp.credential,
        agent_token_sha256: crate::logs::token_digest(&resp.agent_token),
        agent_token: None,
        server: cfg.server.clone(),
        runtime: reg.runtime,
    };
    let bytes = serde_json::to_vec_pretty(&id).map_err(|e| AgentError::Runtime(e.to_string()))?;
    crate::safe_fs::write_atomic(&path, &bytes).map_err(io("cannot write the host identity", &path))?;
    Ok(id)
}

/// Records another runtime in the identity of the host whose data dir is `data_dir`, for its
/// next start (`mpsfleet up`, when the machine's Docker Engine started or went since the host
/// registered; the server's record is changed with it). False when there is no identity.
pub fn set_registered_runtime(data_dir: &Path, runtime: RuntimeKind) -> Result<bool, AgentError> {
    let path = data_dir.join(IDENTITY_FILE);
    let Some(mut id) = load_identity(&path)? else { return Ok(false) };
    if id.runtime == runtime {
        return Ok(true);
    }
    id.runtime = runtime;
    let bytes = serde_json::to_vec_pretty(&id).map_err(|e| AgentError::Runtime(e.to_string()))?;
    crate::safe_fs::write_atomic(&path, &bytes).map_err(io("cannot write the host identity", &path))?;
    Ok(true)
}

/// The identity in `path`, if there is one. One written by an older agent with the agent token
/// itself is converted: its digest is written in its place.
fn load_identity(path: &Path) -> Result<Option<Identity>, AgentError> {
    let bytes = match crate::safe_fs::read_beneath(
        path.parent().unwrap_or(Path::new(".")),
        Path::new(path.file_name().unwrap_or_default()),
        1 << 20,
    ) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(AgentError::Io {
                what: "cannot read the host identity",
                path: path.into(),
                source: e,
            })
        }
    };
    let mut id: Identity = serde_json::from_slice(&bytes).map_err(|e| AgentError::Io {
        what: "cannot read the host identity",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    if let Some(token) = id.agent_token.take() {
        id.agent_token_sha256 = crate::logs::token_digest(&token);
        let bytes = serde_json::to_vec_pretty(&id).map_err(|e| AgentError::Runtime(e.to_string()))?;
        crate::safe_fs::write_atomic(path, &bytes).map_err(io("cannot write the host identity", path))?;
        tracing::info!(path = %path.display(), "the host identity now keeps the agent token's digest only");
    }
    if id.agent_token_sha256.is_empty() {
        tracing::warn!(path = %path.display(), "the host identity holds no agent token digest: the server cannot read task logs here");
    }
    Ok(Some(id))
}

/// Who tasks run as: as root, uids of `--task-uid-range` (checked against the agent's own uid,
/// and to hold one uid per MPS daemon of the host, kept for its MPS tasks, and one more) with
/// their directories in the run dir's `home`; otherwise the agent's own user.
fn task_users(cfg: &AgentConfig, found: &Discovered) -> Result<crate::tasks::TaskUsers, AgentError> {
    let me = nix::unistd::Uid::current();
    cfg.task_uids.validate(me.as_raw()).map_err(AgentError::Config)?;
    let home_root = if me.is_root() {
        Some(run_dir(cfg)?.join("home"))
    } else {
        tracing::info!(uid = me.as_raw(), "the agent does not run as root: tasks run as its user");
        None
    };
    let users = crate::tasks::TaskUsers::new(cfg.task_uids, home_root, &found.gpus, cfg.daemon_per_host)
        .map_err(AgentError::Config)?;
    for (gpu, m) in &users.mps {
        if crate::runtime::identity::in_passwd(m.uid) {
            tracing::warn!(gpu = %gpu, uid = m.uid, "the uid kept for this GPU's MPS tasks is in the password database: its MPS tasks will not start (--task-uid-range)");
        }
    }
    Ok(users)
}

/// The run dir of a root agent, made root's and 0711 (others may pass through, not list it).
fn run_dir(cfg: &AgentConfig) -> Result<PathBuf, AgentError> {
    use std::os::unix::fs::MetadataExt;
    let run = cfg.run_dir.clone().unwrap_or_else(|| default_run_dir(&cfg.data_dir));
    if !run.is_absolute() {
        return Err(AgentError::Config(format!("--run-dir must be an absolute path, got {}", run.display())));
    }
    crate::safe_fs::private_dir(&run, 0o711).map_err(io("cannot create the run dir (--run-dir)", &run))?;
    let meta = std::fs::symlink_metadata(&run).map_err(io("cannot read the run dir (--run-dir)", &run))?;
    if meta.uid() != 0 {
        return Err(AgentError::Config(format!(
            "--run-dir {} belongs to uid {}, not root: tasks could change what the agent keeps there",
            run.display(),
            meta.uid()
        )));
    }
    for ancestor in run.ancestors().skip(1) {
        use std::os::unix::fs::PermissionsExt;
        if std::fs::metadata(ancestor).is_ok_and(|m| m.permissions().mode() & 0o001 == 0) {
            tracing::warn!(
                dir = %ancestor.display(),
                "others cannot pass through this directory: tasks of their own uid will not start (--run-dir)"
            );
        }
    }
    Ok(run)
}

/// One supervisor per GPU (or one for the host), keyed by GPU UUID.
fn start_supervisors(
    cfg: &AgentConfig,
    found: &Discovered,
    task_uids: bool,
    clock: Arc<dyn Clock>,
) -> Result<Supervisors, AgentError> {
    let (control, bin): (Arc<dyn MpsControl>, PathBuf) = match &cfg.mps {
        MpsMode::Real(bin) => (Arc::new(RealMps), bin.clone()),
        MpsMode::Model => (Arc::new(ModelMps::new()), PathBuf::from("nvidia-cuda-mps-control")),
        MpsMode::Unavailable => return Ok(Arc::new(BTreeMap::new())),
    };
    let mps_root = cfg.data_dir.canonicalize().unwrap_or_else(|_| cfg.data_dir.clone()).join("mps");
    let pipe_root = if task_uids {
        // Tasks of other uids must reach the pipe directory; the data dir is the agent's alone.
        let root = run_dir(cfg)?.join("mps");
        crate::safe_fs::private_dir(&root, 0o711).map_err(io("cannot create the mps pipe root", &root))?;
        if root.as_os_str().len() + 4 > MAX_PIPE_DIR {
            return Err(AgentError::Config(format!(
                "--run-dir {} is too long for MPS sockets: {} may have at most {MAX_PIPE_DIR} bytes with a GPU's \
                 directory",
                cfg.run_dir.as_deref().unwrap_or(Path::new("")).display(),
                root.display()
            )));
        }
        root
    } else if mps_root.as_os_str().len() + 4 <= MAX_PIPE_DIR {
        mps_root.clone()
    } else {
        // Socket paths must fit in 108 bytes: fall back to a short directory of our own.
        std::env::temp_dir().join(format!("mpsf-{}", host_key(&cfg.data_dir)))
    };
    let mut out = BTreeMap::new();
    let groups: Vec<(String, Vec<&GpuInventory>)> = if cfg.daemon_per_host {
        vec![("all".to_string(), found.gpus.iter().collect())]
    } else {
        found.gpus.iter().map(|g| (g.index.to_string(), vec![g])).collect()
    };
    for (name, gpus) in groups {
        let mut dc = DaemonConfig::new(bin.clone(), pipe_root.join(&name), mps_root.join("log").join(&name));
        dc.visible_devices = Some(gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(","));
        dc.probe_timeout = cfg.policy.probe_timeout;
        dc.validate()?;
        let label = if gpus.len() == 1 { gpus[0].uuid.to_string() } else { format!("host daemon {name}") };
        let sup = Arc::new(Supervisor::spawn(label, control.clone(), dc, cfg.policy.clone(), clock.clone())?);
        for g in gpus {
            out.insert(g.uuid.clone(), sup.clone());
        }
    }
    Ok(Arc::new(out))
}

/// The host's checks now: one `MPS_DAEMON` check per GPU (with MPS), then one `GPU` check per
/// GPU. The MPS checks carry the ages of their failure's first signal and local restarts at
/// `now_ms` (the agent's clock, which the supervisors' times come from).
fn checks(
    supervisors: &Supervisors,
    gpu_watch: &GpuWatch,
    runtime: Option<&SharedCheck>,
    now_ms: u64,
) -> Vec<HostCheck> {
    let runtime = runtime.and_then(|c| c.lock().ok().map(|c| c.check().clone()));
    supervisors
        .iter()
        .map(|(gpu, s)| {
            let c = s.check();
            HostCheck {
                name: "MPS_DAEMON".into(),
                gpu_id: Some(gpu.clone()),
                status: c.status,
                reason: c.reason,
                since_ms: c.since_ms,
                restarts: c.restarts,
                first_failure_age_ms: c.failing_since_ms.map(|t| now_ms.saturating_sub(t)),
                repair_ages_ms: c.repairs_ms.iter().map(|t| now_ms.saturating_sub(*t)).collect(),
            }
        })
        .chain(gpu_watch.checks())
        .chain(runtime)
        .collect()
}

/// Onboarded once no check is INITIALIZING: every daemon has answered (a host without MPS at
/// once) and every GPU is watched.
fn onboarded(checks: &[HostCheck]) -> bool {
    checks.iter().all(|c| c.status != HealthStatus::Initializing)
}

/// What the agent's heartbeats report besides its checks: where it serves logs, and the CAs
/// it trusts (which it follows through CA rotations).
struct Reported {
    logs_url: String,
    /// The hash of the certificate an `https://` logs endpoint serves.
    logs_cert_sha256: Option<String>,
    cas: CaTrust,
}

/// How often the heartbeat loop looks for a changed check between heartbeats (a GPU's or the
/// runtime's; an MPS daemon's supervisor wakes it at once).
const CHANGE_POLL: Duration = Duration::from_millis(100);

/// Posts the host's checks every `every`, and at once when a check's status changes; each answer carries the pool's health policy, which
/// is applied to every supervisor when it differs from `policy`, the one in force (an invalid
/// one is logged and ignored).
async fn heartbeat_loop(
    agent: Client,
    sources: Arc<crate::metrics::Sources>,
    faults: Arc<crate::faults::Injector>,
    every: Duration,
    mut reported: Reported,
    mut policy: MpsPolicy,
) {
    // Wakes every `CHANGE_POLL`, and as soon as an MPS supervisor publishes a check, to see
    // whether a check's status changed or a failure began or ended, which is reported at once
    // (a daemon's exit reaches the server in milliseconds, not at the next heartbeat);
    // otherwise a heartbeat goes every `every`.
    let mut tick = tokio::time::interval(CHANGE_POLL.min(every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let published = Arc::new(tokio::sync::Notify::new());
    // Dropped with the loop, which ends its watchers.
    let mut watchers = tokio::task::JoinSet::new();
    for s in sources.supervisors.values() {
        let (mut rx, published) = (s.subscribe(), published.clone());
        watchers.spawn(async move {
            while rx.changed().await.is_ok() {
                published.notify_one();
            }
        });
    }
    let mut last_sent: Option<(tokio::time::Instant, Vec<(HealthStatus, bool)>)> = None;
    let mut failing_since_logged = false;
    // The server's count of `host recheck`s, as of the last answer (None before the first).
    let mut rechecks: Option<u64> = None;
    // The last policy refused, so that it is logged once, not on every heartbeat.
    let mut refused: Option<MpsPolicy> = None;
    let mut ca_file_warned = false;
    let mut sent_checks = crate::reported_checks::ReportedChecks::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = published.notified() => {}
        }
        if faults.silent() {
            // A drill's agent-stop: the host goes silent as a lost agent would.
            continue;
        }
        let now_ms = SystemClock.now_ms();
        let checks = checks(&sources.supervisors, &sources.gpu_watch, sources.runtime.as_ref(), now_ms);
        let statuses: Vec<(HealthStatus, bool)> =
            checks.iter().map(|c| (c.status, c.first_failure_age_ms.is_some())).collect();
        let due = match &last_sent {
            None => true,
            Some((at, sent)) => at.elapsed() >= every || *sent != statuses,
        };
        if !due {
            continue;
        }
        last_sent = Some((tokio::time::Instant::now(), statuses));
        let gpu_use = {
            let sources = sources.clone();
            tokio::task::spawn_blocking(move || crate::metrics::reported_use(&sources))
                .await
                .unwrap_or_default()
        };
        let mut report = HostStatusReport {
            onboarded: onboarded(&checks),
            logs_url: Some(reported.logs_url.clone()),
            logs_cert_sha256: reported.logs_cert_sha256.clone(),
            trusted_ca_sha256: reported.cas.hashes.clone(),
            gpu_use,
            heartbeat_ms: Some(every.as_millis() as u64),
            accepts_faults: faults.allowed(),
            ..HostStatusReport::default()
        };
        sent_checks.fill(&mut report, checks, now_ms);
        mpsfleet_core::timeline!("checks-sent");
        let mut result = agent.report_host_status(&report).await;
        mpsfleet_core::timeline!("checks-answered");
        if let Ok(answer) = &result {
            if sent_checks.answered(&report, answer) {
                // The server does not hold the checks this heartbeat left out: send them now.
                sent_checks.refill(&mut report, now_ms);
                result = agent.report_host_status(&report).await;
                if let Ok(answer) = &result {
                    sent_checks.answered(&report, answer);
                }
            }
        }
        match result {
            Ok(answer) => {
                failing_since_logged = false;
                // `host recheck`: the operator fixed what made local repair give up.
                if rechecks.is_some_and(|seen| answer.rechecks > seen) {
                    tracing::info!(
                        rechecks = answer.rechecks,
                        "re-arming local repair, as the operator asked"
                    );
                    for s in sources.supervisors.values() {
                        s.rearm();
                    }
                }
                rechecks = Some(answer.rechecks);
                faults.apply(&answer.faults, &sources.supervisors, &sources.gpu_watch);
                let wanted = pool_mps_policy(&answer.health_policy, &policy);
                if wanted != policy && refused.as_ref() != Some(&wanted) {
                    match apply_policy(&sources.supervisors, &wanted) {
                        Ok(()) => {
                            tracing::info!(policy = ?wanted, "applied the pool's mps health policy");
                            policy = wanted;
                            refused = None;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, policy = ?wanted, "ignoring the pool's mps health policy");
                            refused = Some(wanted);
                        }
                    }
                }
                let cluster_cas = &answer.cluster_ca_sha256;
                let cas = &mut reported.cas;
                if !cluster_cas.is_empty() && !same_cas(cluster_cas, &cas.hashes) {
                    match &cas.kept {
                        Some(kept) => match follow_cas(&agent, cluster_cas, kept).await {
                            Ok(hashes) => {
                                tracing::info!(cas = ?hashes, "trusting the cluster's CAs as they are now");
                                cas.hashes = hashes;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot follow the cluster's CA rotation; retrying")
                            }
                        },
                        None if !ca_file_warned => {
                            tracing::warn!(cluster = ?cluster_cas, ca_file = ?cas.hashes, "the cluster trusts other CAs than --ca-file holds: update it (GET /v1/cluster/ca) before the rotation is activated");
                            ca_file_warned = true;
                        }
                        None => {}
                    }
                }
            }
            Err(e) if !failing_since_logged => {
                tracing::warn!(error = %e, "heartbeat failed; retrying every interval");
                failing_since_logged = true;
            }
            Err(_) => {}
        }
    }
}

/// The runtime recorded in the data dir's identity, if the host is registered already.
fn registered_runtime(cfg: &AgentConfig) -> Option<RuntimeKind> {
    let bytes = crate::safe_fs::read_beneath(&cfg.data_dir, Path::new(IDENTITY_FILE), 1 << 20).ok()??;
    serde_json::from_slice::<Identity>(&bytes).ok().map(|i| i.runtime)
}

/// Docker Engine's version, when it answers within 3 s.
async fn choose_runtime_docker(cfg: &AgentConfig) -> Result<String, String> {
    crate::docker::engine_version(&cfg.docker.socket, Duration::from_secs(3)).await
}

/// Picks the task runtime: `Some(engine version)` for Docker, None for processes. `auto` takes
/// Docker when its socket answers within 3 s and says which it chose either way.
async fn choose_runtime(cfg: &AgentConfig) -> Result<Option<String>, AgentError> {
    if cfg.runtime == RuntimeChoice::Process {
        tracing::info!(runtime = "process", "tasks run as processes (--runtime process)");
        return Ok(None);
    }
    let socket = cfg.docker.socket.clone();
    let probe = choose_runtime_docker(cfg).await;
    match (cfg.runtime, probe) {
        (_, Ok(version)) => {
            let publish =
                cfg.docker.publish_address.map_or_else(|| "every address".to_string(), |ip| ip.to_string());
            tracing::info!(runtime = "docker", socket = %socket.display(), version = %version, ports_published_on = %publish, "tasks run as containers on Docker Engine");
            Ok(Some(version))
        }
        (RuntimeChoice::Docker, Err(reason)) => Err(AgentError::NoDocker { socket, reason }),
        (_, Err(reason)) => {
            tracing::info!(
                runtime = "process",
                socket = %socket.display(),
                why = %reason,
                "Docker Engine does not answer: tasks run as processes; tasks that need an image wait for a \
                 host with --runtime docker (install docker.io and start it, or point DOCKER_HOST at its socket)"
            );
            Ok(None)
        }
    }
}

fn connect_docker(cfg: &AgentConfig, host_id: Option<String>) -> Result<DockerRuntime, AgentError> {
    let d = &cfg.docker;
    let config = DockerConfig {
        socket: d.socket.clone(),
        host_id: host_id.unwrap_or_else(|| "unregistered".into()),
        pull: d.pull,
        pull_timeout: d.pull_timeout,
        gpu_wiring: None,
        data_dir: cfg.data_dir.join("docker"),
        publish_address: d.publish_address,
    };
    DockerRuntime::connect(config, tokio::runtime::Handle::current())
        .map_err(|e| AgentError::NoDocker { socket: d.socket.clone(), reason: e.to_string() })
}

/// Removes this host's containers of stopped tasks once they are older than the retention,
/// and images nothing uses by the image policy; one failure is logged and tried again at the
/// next round. It looks every minute, or as often as the retention when that is shorter (but
/// at most every second).
async fn janitor(rt: DockerRuntime, settings: DockerSettings, clock: Arc<dyn Clock>) {
    let every = settings.container_retention.clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut images_at = clock.now_ms();
    loop {
        tokio::time::sleep(every).await;
        let now = clock.now_ms();
        let retention = settings.container_retention.as_millis() as u64;
        let rt2 = rt.clone();
        let images_due = now.saturating_sub(images_at) >= settings.images.interval.as_millis() as u64;
        let policy = settings.images.clone();
        let round = tokio::task::spawn_blocking(move || {
            remove_stopped_containers(&rt2, |c| {
                c.finished_at_ms.is_none_or(|at| now.saturating_sub(at) >= retention)
            });
            if images_due {
                match rt2.remove_unused_images(&policy, now) {
                    Ok(removed) if !removed.is_empty() => tracing::info!(?removed, "removed unused images"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "cannot remove unused images"),
                }
            }
        });
        let _ = round.await;
        if images_due {
            images_at = now;
        }
    }
}

/// Removes this host's stopped containers that `due` picks; each failure is logged.
fn remove_stopped_containers(rt: &DockerRuntime, due: impl Fn(&crate::docker::OurContainer) -> bool) {
    let removed = match rt.remove_ours(|c| !c.running && due(c)) {
        Ok(removed) => removed,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this host's containers");
            return;
        }
    };
    for (c, outcome) in removed {
        match outcome {
            Ok(()) => {
                tracing::info!(task.id = %c.task_id, container = %c.container, "removed the stopped container")
            }
            Err(e) => {
                tracing::warn!(task.id = %c.task_id, container = %c.container, error = %e, "cannot remove the stopped container")
            }
        }
    }
}

/// Sets `policy` on every supervisor; an invalid one is refused before any is changed.
fn apply_policy(supervisors: &Supervisors, policy: &MpsPolicy) -> Result<(), crate::mps::MpsError> {
    policy.validate()?;
    for s in supervisors.values() {
        s.set_policy(policy.clone())?;
    }
    Ok(())
}

/// Long-polls the server for this host's tasks and hands every answer to the task loop.
/// Backs off on errors (server restarts, network trouble) up to 5 s.
async fn assignments_loop(agent: Client, tx: std::sync::mpsc::Sender<crate::tasks::Input>) {
    let mut after = 0;
    let mut backoff =
        mpsfleet_core::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match agent.assignments(after, 30).await {
            Ok(a) => {
                backoff.reset();
                after = a.revision;
                if tx.send(crate::tasks::Input::Assignments(a)).is_err() {
                    return;
                }
            }
            Err(e) => {
                let wait = backoff.fail();
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "assignments long-poll failed");
                // A restarted server starts epochs again: ask for everything.
                after = 0;
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// This machine as ECS names a container instance: its architecture (`x86_64`, `arm64`), the
/// zone it was given, its cores as CPU units (1,024 each) and its memory in MiB.
fn platform(zone: &str) -> mpsfleet_types::HostPlatform {
    let cpu_architecture = match std::env::consts::ARCH {
        "aarch64" => "arm64",
        other => other,
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get() as u64);
    mpsfleet_types::HostPlatform {
        cpu_architecture: cpu_architecture.to_string(),
        availability_zone: zone.to_string(),
        cpu_units: cores * 1024,
        memory_mib: mpsfleet_proc::memory_total_kib().unwrap_or(0) / 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_with_the_agent_token_is_converted_to_its_digest() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(IDENTITY_FILE);
        let legacy = serde_json::json!({
            "hostId": "h-1", "credential": "mpsf_host_abc", "agentToken": "mpsf_agt_secret",
            "server": "http://127.0.0.1:7070", "runtime": "process"
        });
        std::fs::write(&path, serde_json::to_vec(&legacy).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let id = load_identity(&path).unwrap().expect("an identity");
        assert_eq!(id.agent_token_sha256, crate::logs::token_digest("mpsf_agt_secret"));
        assert_eq!(id.credential, "mpsf_host_abc");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("mpsf_agt_secret") && !text.contains("\"agentToken\""), "{text}");
        assert!(text.contains(&id.agent_token_sha256), "{text}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // Loading it again changes nothing; Debug shows no secret.
        let again = load_identity(&path).unwrap().unwrap();
        assert_eq!(again.agent_token_sha256, id.agent_token_sha256);
        let shown = format!("{again:?}");
        assert!(!shown.contains("mpsf_host_abc") && !shown.contains(&id.agent_token_sha256), "{shown}");
        assert!(load_identity(&dir.path().join("none.json")).unwrap().is_none());
        // A link in place of the identity is not followed.
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(load_identity(&link).is_err());
    }

    #[test]
    fn the_default_run_dir_is_short_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let run = default_run_dir(dir.path());
        assert!(run.starts_with("/run/mpsfleet-agent"));
        assert_eq!(run, default_run_dir(dir.path()));
        assert!(run.join("mps").as_os_str().len() + 4 <= MAX_PIPE_DIR);
    }

    #[tokio::test]
    async fn a_dead_task_loop_ends_the_agent_with_an_error() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut dead = TaskLoop::spawn(tx, rx, |_| panic!("injected loop fault")).unwrap();
        let ended = tokio::time::timeout(
            Duration::from_secs(10),
            until_shutdown(std::future::pending(), dead.died()),
        )
        .await
        .expect("the agent noticed the dead loop");
        match ended {
            Err(e @ AgentError::TaskLoopDied(_)) => assert_eq!(
                e.to_string(),
                "the task loop panicked: injected loop fault; exiting so that the agent is restarted"
            ),
            other => panic!("expected TaskLoopDied, got {other:?}"),
        }
        // A shutdown while the loop lives ends it cleanly.
        let (tx, rx) = std::sync::mpsc::channel();
        let mut alive = TaskLoop::spawn(tx, rx, |rx| {
            let _ = rx.recv();
            Ok(())
        })
        .unwrap();
        assert!(until_shutdown(std::future::ready(()), alive.died()).await.is_ok());
        alive.shutdown(false);
    }
}
