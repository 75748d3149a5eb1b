//! The Docker container runtime: runs a task's containers in Docker Engine, over its Unix
//! socket (bollard), the way the ECS container agent does (shared/design/ecs-on-docker.md).
//!
//! [`spec`] maps a container definition to Docker's create call; [`DockerRuntime`] pulls,
//! creates, starts, watches, stops, finds again and removes containers, follows their output
//! and cleans up unused images. Every method blocks the calling thread (the task loop calls
//! them from worker threads) and runs its Docker calls on the tokio runtime given at
//! [`DockerRuntime::connect`], each under a wall-clock limit.
//!
//! Containers are named deterministically ([`spec::container_name`]) and labelled with the
//! host, task and container, so that after a restart they are found by name
//! ([`DockerRuntime::adopt`]) or by label ([`DockerRuntime::list_ours`]).

pub mod awsvpc;
mod exec;
mod follow;
mod images;
pub mod logdriver;
pub mod names;
pub mod options;
mod records;
pub mod spec;
mod volumes;

use crate::runtime::{ContainerState, ExitRecord, StopOutcome};
use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum, EventMessage};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, EventsOptions, InspectContainerOptions,
    ListContainersOptions, ListImagesOptions, LogsOptions, RemoveContainerOptions, RemoveImageOptions,
    StopContainerOptions,
};
use bollard::{ClientVersion, Docker};
use futures_util::StreamExt;
use mpsfleet_core::clock::{Clock, SystemClock};
use mpsfleet_types::logs::OutputStream;
use mpsfleet_types::secret::RegistryAuth;
use mpsfleet_types::task::StopCode;
use mpsfleet_types::{NetworkBinding, Protocol};
use records::{ImageRecord, ImageRecords};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

pub use follow::{resume_point, rotated_path, FramedWriter};
pub use images::{image_record, normalize_reference};
pub use spec::{container_name, create_body, launch_notes};
pub use volumes::engine_plugins;

/// The Docker API version spoken: Docker 20.10 (API 1.41) refuses newer clients, and nothing
/// used here needs more.
pub const API_VERSION: ClientVersion = ClientVersion { major_version: 1, minor_version: 41 };
/// The socket when neither the configuration nor `DOCKER_HOST` names one.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// Wall-clock limits on Docker calls (ECS's create and start limits).
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(4 * 60);
pub const START_TIMEOUT: Duration = Duration::from_secs(3 * 60);
pub const INSPECT_TIMEOUT: Duration = Duration::from_secs(30);
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
pub const LIST_TIMEOUT: Duration = Duration::from_secs(60);
pub const LOGS_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// How long past the stop timeout a stop call may take before it is given up (ECS: 2 min).
pub const STOP_GRACE: Duration = Duration::from_secs(2 * 60);
/// How often a container that may have been killed for its memory limit, without Docker
/// Engine having recorded it yet, is inspected again: Engine sets `State.OOMKilled` from its
/// own OOM event, which can arrive after the exit (hundreds of milliseconds later on a busy
/// host).
pub const OOM_EVENT_WAIT: Duration = Duration::from_millis(100);
/// An exit older than this has had time for its OOM event: it is taken as it reads.
const OOM_EVENT_LATEST_MS: u64 = 2_000;
/// [`DockerRuntime::status`] inspects a running container at least this often even when no
/// event said it changed (events can be missed while the stream reconnects).
pub const STATUS_REFRESH: Duration = Duration::from_secs(5);
/// What [`DockerRuntime::exec`] keeps of the command's output.
pub const EXEC_OUTPUT_MAX: usize = 4 << 10;

/// ECS's `ECS_IMAGE_PULL_BEHAVIOR` (section 3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullBehavior {
    /// Always pull; when the pull fails, use a cached image if there is one.
    #[default]
    Default,
    /// Always pull; a failed pull fails the launch.
    Always,
    /// Pull unless a pull of this reference succeeded before; a failed pull fails the launch.
    Once,
    /// Pull only when the image is not there.
    PreferCached,
}

impl PullBehavior {
    pub fn as_str(self) -> &'static str {
        match self {
            PullBehavior::Default => "default",
            PullBehavior::Always => "always",
            PullBehavior::Once => "once",
            PullBehavior::PreferCached => "prefer-cached",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown image pull behavior {0:?}: expected default, always, once or prefer-cached")]
pub struct UnknownPullBehavior(pub String);

impl FromStr for PullBehavior {
    type Err = UnknownPullBehavior;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(PullBehavior::Default),
            "always" => Ok(PullBehavior::Always),
            "once" => Ok(PullBehavior::Once),
            "prefer-cached" => Ok(PullBehavior::PreferCached),
            other => Err(UnknownPullBehavior(other.to_string())),
        }
    }
}

/// How a real GPU reaches a container (ecs-on-docker.md section 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuWiring {
    /// `HostConfig.Runtime` = this runtime and `NVIDIA_VISIBLE_DEVICES` = the GPUs' UUIDs.
    NvidiaRuntime { runtime: String },
    /// One device request with capabilities `[["gpu"]]` and the UUIDs as device ids.
    DeviceRequests,
}

#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Docker Engine's Unix socket.
    pub socket: PathBuf,
    /// This host's id: part of every container's name and labels.
    pub host_id: String,
    pub pull: PullBehavior,
    pub pull_timeout: Duration,
    /// None: decided from `docker info` (a runtime named `nvidia` means
    /// [`GpuWiring::NvidiaRuntime`], else [`GpuWiring::DeviceRequests`]).
    pub gpu_wiring: Option<GpuWiring>,
    /// The runtime's own records (see `records.rs`).
    pub data_dir: PathBuf,
    /// Where bridge ports are published; None: every address, IPv4 and IPv6, as ECS.
    pub publish_address: Option<std::net::IpAddr>,
}

impl DockerConfig {
    /// A configuration with ECS's defaults and the socket from [`socket_from_env`].
    pub fn new(host_id: impl Into<String>, data_dir: PathBuf) -> DockerConfig {
        DockerConfig {
            socket: socket_from_env(),
            host_id: host_id.into(),
            pull: PullBehavior::Default,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
            gpu_wiring: None,
            data_dir,
            publish_address: None,
        }
    }
}

/// The socket named by `DOCKER_HOST=unix://PATH`, else [`DEFAULT_SOCKET`].
pub fn socket_from_env() -> PathBuf {
    socket_from(std::env::var("DOCKER_HOST").ok().as_deref())
}

/// [`socket_from_env`] for a given value of `DOCKER_HOST`.
pub fn socket_from(docker_host: Option<&str>) -> PathBuf {
    match docker_host.and_then(|h| h.strip_prefix("unix://")) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from(DEFAULT_SOCKET),
    }
}

/// ECS's image cleanup (`ECS_IMAGE_CLEANUP_INTERVAL` 30 min, `ECS_IMAGE_MINIMUM_CLEANUP_AGE`
/// 1 h, `ECS_NUM_IMAGES_DELETE_PER_CYCLE` 5): every `interval`, remove up to `max_per_cycle`
/// images that this runtime launched, that no container (running or stopped) uses, and that
/// no launch used for `min_age`. Images the runtime never launched are left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePolicy {
    pub interval: Duration,
    pub min_age: Duration,
    pub max_per_cycle: usize,
}

impl Default for ImagePolicy {
    fn default() -> Self {
        ImagePolicy {
            interval: Duration::from_secs(30 * 60),
            min_age: Duration::from_secs(60 * 60),
            max_per_cycle: 5,
        }
    }
}

/// One container to launch.
#[derive(Debug, Clone)]
pub struct DockerLaunch {
    pub task: mpsfleet_types::Task,
    pub definition: mpsfleet_types::TaskDefinition,
    pub container: mpsfleet_types::ContainerDefinition,
    /// The container's environment (`crate::env::container_env`).
    pub env: Vec<(String, String)>,
    /// The MPS daemon's pipe directory, for an MPS container: mounted at the same path.
    pub mps_pipe_dir: Option<PathBuf>,
    /// The task's GPUs are emulated: no GPU runtime or device request is set.
    pub gpus_emulated: bool,
    pub stop_timeout: Duration,
}

/// A launched (or adopted) container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerHandle {
    pub id: String,
    pub name: String,
    pub pid: Option<u32>,
    pub ip: Option<String>,
    pub image_digest: Option<String>,
    pub network_bindings: Vec<NetworkBinding>,
    /// awsvpc: the task's address, held by its pause container (the attachment's id).
    pub network_interfaces: Vec<mpsfleet_types::NetworkInterface>,
    pub notes: Vec<String>,
    /// Its launch pulled the image: how long before the launch returned the pull began, and
    /// how long it took, in ms.
    pub pull: Option<mpsfleet_types::PullTiming>,
}

/// One container [`DockerRuntime::remove_ours`] removed, or failed to.
pub type Removal = (OurContainer, Result<(), DockerError>);

/// A container labelled for this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OurContainer {
    pub task_id: String,
    pub container: String,
    pub id: String,
    pub running: bool,
    pub finished_at_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    pub exit_code: i64,
    /// The last [`EXEC_OUTPUT_MAX`] bytes of stdout and stderr, as read.
    pub output: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("cannot reach docker at {socket}: {reason}")]
    Unreachable { socket: PathBuf, reason: String },
    #[error("docker {what} timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("docker {what}: {message} (status {status})")]
    Api { what: String, status: u16, message: String },
    #[error("docker {what}: {message}")]
    Other { what: String, message: String },
}

impl DockerError {
    fn status(&self) -> Option<u16> {
        match self {
            DockerError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// What Docker said, without our prefix.
    pub fn message(&self) -> String {
        match self {
            DockerError::Api { message, .. } | DockerError::Other { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

/// What the runtime remembers of one container between [`DockerRuntime::status`] calls.
#[derive(Debug, Clone)]
struct Watched {
    state: ContainerState,
    inspected_at_ms: u64,
    /// An event said the container changed since the last inspect.
    changed: bool,
}

struct Inner {
    docker: Docker,
    cfg: DockerConfig,
    handle: tokio::runtime::Handle,
    wiring: OnceLock<GpuWiring>,
    /// The engine's log drivers (`docker info`: `Plugins.Log`), asked once.
    log_drivers: OnceLock<Vec<String>>,
    watched: Mutex<HashMap<String, Watched>>,
    /// Containers Engine sent an `oom` event for (until they are destroyed): Engine's own
    /// `State.OOMKilled` can miss an OOM kill whose event and exit cross, its event cannot.
    oom_events: Mutex<HashSet<String>>,
    watcher: OnceLock<()>,
    records: Mutex<()>,
    /// Held while a pause container or the awsvpc network is looked for or made.
    awsvpc: Mutex<()>,
}

/// The Docker runtime; cheap to clone.
#[derive(Clone)]
pub struct DockerRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DockerRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerRuntime")
            .field("socket", &self.inner.cfg.socket)
            .field("host_id", &self.inner.cfg.host_id)
            .finish()
    }
}

/// Docker Engine's version when the engine at `socket` answers within `timeout`, else why not.
/// Call it from async code: the ping runs on a blocking thread.
pub async fn engine_version(socket: &std::path::Path, timeout: Duration) -> Result<String, String> {
    if !socket.exists() {
        return Err("no such socket".into());
    }
    let mut cfg = DockerConfig::new("probe", std::env::temp_dir());
    cfg.socket = socket.to_path_buf();
    let rt = DockerRuntime::connect(cfg, tokio::runtime::Handle::current()).map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || rt.ping(timeout).map_err(|e| e.to_string()))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

/// SIGKILL to an exec's process, and to its process group when it leads one (a shell's
/// children go with it).
fn kill_exec(pid: i64) {
    use nix::sys::signal::{kill, killpg, Signal};
    use nix::unistd::{getpgid, Pid};
    let Ok(raw) = i32::try_from(pid) else { return };
    let pid = Pid::from_raw(raw);
    if getpgid(Some(pid)).is_ok_and(|g| g == pid) {
        let _ = killpg(pid, Signal::SIGKILL);
    }
    let _ = kill(pid, Signal::SIGKILL);
}

fn now_ms() -> u64 {
    SystemClock.now_ms()
}

fn map_err(socket: &std::path::Path, what: &str, e: bollard::errors::Error) -> DockerError {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError { status_code, message } => {
            DockerError::Api { what: what.to_string(), status: status_code, message }
        }
        E::DockerStreamError { error } => DockerError::Other { what: what.to_string(), message: error },
        E::RequestTimeoutError => DockerError::Timeout { what: what.to_string(), after: Duration::ZERO },
        e @ (E::SocketNotFoundError(_)
        | E::IOError { .. }
        | E::HyperResponseError { .. }
        | E::HyperLegacyError { .. }
        | E::HttpClientError { .. }) => {
            DockerError::Unreachable { socket: socket.to_path_buf(), reason: format!("{what}: {e}") }
        }
        e => DockerError::Other { what: what.to_string(), message: e.to_string() },
    }
}

/// `2026-12-01T08:50:12.123456789Z` (RFC 3339, as Docker writes times) in ms since the epoch;
/// None for Docker's zero time and anything unparsable.
pub fn parse_docker_time(s: &str) -> Option<u64> {
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let (y, mo, da): (i64, i64, i64) =
        (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    if y < 1970 {
        return None;
    }
    let (clock, offset_s) = match time.find(['Z', '+', '-']) {
        Some(i) => {
            let (c, z) = time.split_at(i);
            let off = if z == "Z" {
                0
            } else {
                let sign = if z.starts_with('-') { -1 } else { 1 };
                let (h, m) = z[1..].split_once(':')?;
                sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
            };
            (c, off)
        }
        None => (time, 0),
    };
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut t = hms.splitn(3, ':');
    let (h, mi, se): (i64, i64, i64) =
        (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    let ms: i64 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().take(3).collect();
        format!("{digits:0<3}").parse().ok()?
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + da - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    u64::try_from(secs * 1000 + ms).ok()
}

/// Whether an inspect may show a container the kernel killed for its memory limit before
/// Docker Engine recorded it: it exited on SIGKILL (137) under a memory limit within
/// [`OOM_EVENT_LATEST_MS`] (or Engine has not written its `FinishedAt` yet), and
/// `State.OOMKilled` is not set.
fn oom_may_be_unrecorded(info: &ContainerInspectResponse, now_ms: u64) -> bool {
    let limited = info.host_config.as_ref().and_then(|h| h.memory).is_some_and(|m| m > 0);
    let Some(s) = &info.state else { return false };
    let finished = s.finished_at.as_deref().and_then(parse_docker_time);
    limited
        && s.running != Some(true)
        && s.exit_code == Some(137)
        && s.oom_killed != Some(true)
        && finished.is_none_or(|t| now_ms.saturating_sub(t) < OOM_EVENT_LATEST_MS)
}

/// The container's state as the task loop sees it, from an inspect.
fn state_of(name: &str, info: &ContainerInspectResponse) -> ContainerState {
    let Some(s) = &info.state else {
        return ContainerState::Lost { reason: format!("docker reports no state for container {name}") };
    };
    let pid = s.pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
    match s.status {
        Some(ContainerStateStatusEnum::RUNNING)
        | Some(ContainerStateStatusEnum::PAUSED)
        | Some(ContainerStateStatusEnum::RESTARTING) => ContainerState::Running { pid },
        Some(ContainerStateStatusEnum::CREATED) => ContainerState::Exited(ExitRecord {
            code: None,
            signal: None,
            finished_at_ms: now_ms(),
            error: Some(
                s.error
                    .clone()
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "created but never started".into()),
            ),
            oom_killed: false,
        }),
        _ if s.running == Some(true) => ContainerState::Running { pid },
        _ => ContainerState::Exited(ExitRecord {
            code: s.exit_code.and_then(|c| i32::try_from(c).ok()),
            signal: None,
            finished_at_ms: s.finished_at.as_deref().and_then(parse_docker_time).unwrap_or_else(now_ms),
            error: s.error.clone().filter(|e| !e.is_empty()),
            oom_killed: s.oom_killed.unwrap_or(false),
        }),
    }
}

fn handle_of(info: &ContainerInspectResponse, name: &str, notes: Vec<String>) -> DockerHandle {
    let settings = info.network_settings.as_ref();
    let ip = settings
        .and_then(|n| n.networks.as_ref())
        .and_then(|nets| nets.values().filter_map(|e| e.ip_address.clone()).find(|ip| !ip.is_empty()));
    let mut network_bindings = Vec::new();
    for (key, bindings) in settings.and_then(|n| n.ports.as_ref()).into_iter().flatten() {
        let Some((port, proto)) = key.split_once('/') else { continue };
        let (Ok(container_port), protocol) = (port.parse::<u16>(), proto) else { continue };
        let protocol = match protocol {
            "udp" => Protocol::Udp,
            "tcp" => Protocol::Tcp,
            _ => continue,
        };
        let mut port: Vec<NetworkBinding> = Vec::new();
        for b in bindings.iter().flatten() {
            let bind_ip = b.host_ip.clone().unwrap_or_default();
            let Some(host_port) = b.host_port.as_deref().and_then(|p| p.parse::<u16>().ok()) else {
                continue;
            };
            // An empty address is Docker's every-address binding (engines before 20.10).
            let bind_ip = if bind_ip.is_empty() { "0.0.0.0".to_string() } else { bind_ip };
            port.push(NetworkBinding { bind_ip, container_port, host_port, protocol });
        }
        // IPv4 bindings, as ECS reports them: Docker's every-address publication is `0.0.0.0`
        // and `::`, reported as `0.0.0.0`. A port published on an IPv6 address only keeps
        // its IPv6 bindings.
        let is_v4 = |b: &NetworkBinding| b.bind_ip.parse::<std::net::Ipv4Addr>().is_ok();
        if port.iter().any(is_v4) {
            port.retain(is_v4);
        }
        network_bindings.extend(port);
    }
    network_bindings.sort();
    network_bindings.dedup();
    DockerHandle {
        id: info.id.clone().unwrap_or_default(),
        name: name.to_string(),
        pid: info.state.as_ref().and_then(|s| s.pid).and_then(|p| u32::try_from(p).ok()).filter(|&p| p > 0),
        ip,
        image_digest: info.image.clone(),
        network_bindings,
        network_interfaces: Vec::new(),
        notes,
        pull: None,
    }
}

impl DockerRuntime {
    /// Makes the client; nothing is sent to Docker until the first call.
    pub fn connect(cfg: DockerConfig, handle: tokio::runtime::Handle) -> Result<DockerRuntime, DockerError> {
        let path = cfg.socket.display().to_string();
        // bollard's own per-request limit is set high: every call has its own limit here.
        let docker = Docker::connect_with_unix(&path, 3600, &API_VERSION)
            .map_err(|e| DockerError::Unreachable { socket: cfg.socket.clone(), reason: e.to_string() })?;
        let wiring = OnceLock::new();
        if let Some(w) = &cfg.gpu_wiring {
            let _ = wiring.set(w.clone());
        }
        Ok(DockerRuntime {
            inner: Arc::new(Inner {
                docker,
                cfg,
                handle,
                wiring,
                log_drivers: OnceLock::new(),
                watched: Mutex::new(HashMap::new()),
                oom_events: Mutex::new(HashSet::new()),
                watcher: OnceLock::new(),
                records: Mutex::new(()),
                awsvpc: Mutex::new(()),
            }),
        })
    }

    pub fn config(&self) -> &DockerConfig {
        &self.inner.cfg
    }

    /// The host id in this runtime's container names and labels.
    pub fn host_id(&self) -> &str {
        &self.inner.cfg.host_id
    }

    /// Runs `fut` on the runtime's tokio runtime, under `limit`.
    fn block<T>(
        &self,
        what: &str,
        limit: Duration,
        fut: impl Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<T, DockerError> {
        let socket = self.inner.cfg.socket.clone();
        self.run(async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(r) => r.map_err(|e| map_err(&socket, what, e)),
                Err(_) => Err(DockerError::Timeout { what: what.to_string(), after: limit }),
            }
        })
    }

    /// Runs `fut` to completion on the runtime's tokio runtime. The caller is a plain thread
    /// or a `spawn_blocking` one (the task loop's workers); an async task must not call this
    /// (tokio refuses to block inside one).
    fn run<T>(&self, fut: impl Future<Output = Result<T, DockerError>>) -> Result<T, DockerError> {
        self.inner.handle.block_on(fut)
    }

    /// Docker's engine version, e.g. `20.10.24+dfsg1`.
    pub fn ping(&self, timeout: Duration) -> Result<String, DockerError> {
        let v = self.block("version", timeout, self.inner.docker.version())?;
        Ok(v.version.unwrap_or_default())
    }

    /// How a real GPU is wired: as configured, else from `docker info`.
    pub fn gpu_wiring(&self) -> Result<GpuWiring, DockerError> {
        if let Some(w) = self.inner.wiring.get() {
            return Ok(w.clone());
        }
        let info = self.block("info", INSPECT_TIMEOUT, self.inner.docker.info())?;
        let nvidia = info.runtimes.as_ref().is_some_and(|r| r.contains_key("nvidia"));
        let w = if nvidia {
            GpuWiring::NvidiaRuntime { runtime: "nvidia".into() }
        } else {
            GpuWiring::DeviceRequests
        };
        Ok(self.inner.wiring.get_or_init(|| w).clone())
    }

    /// The engine's log drivers, from `docker info` the first time it answers (Docker's own
    /// `json-file` and `local` while it does not).
    pub fn log_drivers(&self) -> Vec<String> {
        if let Some(d) = self.inner.log_drivers.get() {
            return d.clone();
        }
        match self.block("info", INSPECT_TIMEOUT, self.inner.docker.info()) {
            Ok(info) => {
                let drivers = info.plugins.and_then(|p| p.log).unwrap_or_default();
                self.inner.log_drivers.get_or_init(|| drivers).clone()
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask the engine for its log drivers");
                vec!["json-file".into(), "local".into()]
            }
        }
    }

    fn inspect(&self, name_or_id: &str) -> Result<Option<ContainerInspectResponse>, DockerError> {
        match self.block(
            "inspect container",
            INSPECT_TIMEOUT,
            self.inner.docker.inspect_container(name_or_id, None::<InspectContainerOptions>),
        ) {
            Ok(info) => Ok(Some(info)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Inspects a container whose state is to be read. A fresh SIGKILL exit under a memory
    /// limit without `OOMKilled` waits, looking again every [`OOM_EVENT_WAIT`], until Engine
    /// records the OOM kill, its `oom` event for the container has come, or the exit is
    /// [`OOM_EVENT_LATEST_MS`] old; an exited container Engine sent an `oom` event for reads
    /// as OOM-killed even where `OOMKilled` missed it. Only such exits wait, at most that long.
    fn inspect_state(&self, name_or_id: &str) -> Result<Option<ContainerInspectResponse>, DockerError> {
        self.start_watcher();
        let Some(mut info) = self.inspect(name_or_id)? else { return Ok(None) };
        // Bounded by its own clock too: an exit without a time would otherwise never be old.
        let give_up = now_ms().saturating_add(OOM_EVENT_LATEST_MS);
        while oom_may_be_unrecorded(&info, now_ms()) && !self.oom_event_seen(&info) && now_ms() < give_up {
            std::thread::sleep(OOM_EVENT_WAIT);
            match self.inspect(name_or_id)? {
                Some(again) => info = again,
                None => break,
            }
        }
        if self.oom_event_seen(&info) {
            if let Some(s) = info.state.as_mut().filter(|s| s.running != Some(true)) {
                s.oom_killed = Some(true);
            }
        }
        Ok(Some(info))
    }

    /// Whether Engine sent an `oom` event for the inspected container.
    fn oom_event_seen(&self, info: &ContainerInspectResponse) -> bool {
        let Some(id) = info.id.as_deref() else { return false };
        self.inner.oom_events.lock().unwrap_or_else(|p| p.into_inner()).contains(id)
    }

    fn remove_quietly(&self, name: &str) {
        if let Err(e) = self.remove_by_name(name) {
            tracing::warn!(container = name, error = %e, "cannot remove a half-made container");
        }
    }

    /// Pulls (per the pull behaviour), creates and starts the container.
    pub fn launch(&self, l: &DockerLaunch) -> Result<DockerHandle, (StopCode, String)> {
        // Watching before the container exists: its death can come before the first inspect.
        self.start_watcher();
        let failed = |prefix: &str, e: DockerError| {
            (StopCode::TaskFailedToStart, format!("{prefix}: {}", e.message()))
        };
        let Some(image) = l.container.image.as_deref().filter(|i| !i.is_empty()) else {
            return Err((
                StopCode::TaskFailedToStart,
                format!("CannotCreateContainerError: container {} has no image", l.container.name),
            ));
        };
        let reference = normalize_reference(image);
        let mut notes = launch_notes(l);
        let auth = l.container.repository_credentials.as_ref().and_then(|r| r.resolved.as_ref());
        let pull_began = mpsfleet_core::clock::Stopwatch::start();
        let pulled_ms = self.ensure_image(&reference, auth, &mut notes)?;
        mpsfleet_core::timeline!("image-ready", task = l.task.id);
        self.ensure_volumes(l)?;
        let needs_wiring = l.container.gpu().is_some() && !l.gpus_emulated && !l.task.gpu_ids.is_empty();
        let wiring = if needs_wiring {
            self.gpu_wiring().map_err(|e| failed("CannotCreateContainerError", e))?
        } else {
            GpuWiring::DeviceRequests
        };
        if l.definition.effective_network_mode() == mpsfleet_types::NetworkMode::Awsvpc
            || options::shares_namespaces(&l.definition)
        {
            self.ensure_pause_retried(l).map_err(|e| failed("CannotCreateContainerError", e))?;
        }
        let (name, mut body) =
            create_body(l, &self.inner.cfg.host_id, &wiring, self.inner.cfg.publish_address);
        body.image = Some(reference.clone());
        let (log, log_note) = logdriver::log_config(l, &self.log_drivers());
        if let Some(hc) = body.host_config.as_mut() {
            hc.log_config = Some(log);
        }
        notes.extend(log_note);
        self.update_records(|r| r.images.entry(reference.clone()).or_default().last_used_ms = now_ms());
        self.start_watcher();

        let create = |body| {
            self.block(
                "create container",
                CREATE_TIMEOUT,
                self.inner.docker.create_container(
                    Some(CreateContainerOptions { name: Some(name.clone()), ..Default::default() }),
                    body,
                ),
            )
        };
        let created = match create(body.clone()) {
            // Left from a launch that did not finish (a crash between create and start).
            Err(e) if e.status() == Some(409) => {
                self.remove_by_name(&name).map_err(|e| failed("CannotCreateContainerError", e))?;
                create(body)
            }
            other => other,
        };
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                if matches!(e, DockerError::Timeout { .. }) {
                    self.remove_quietly(&name);
                }
                return Err(failed("CannotCreateContainerError", e));
            }
        };
        mpsfleet_core::timeline!("container-created", task = l.task.id);
        for w in created.warnings.iter().filter(|w| !w.is_empty()) {
            notes.push(format!("docker: {w}"));
        }
        if let Err(e) = self.block(
            "start container",
            START_TIMEOUT,
            self.inner
                .docker
                .start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>),
        ) {
            self.remove_quietly(&name);
            return Err(failed("CannotStartContainerError", e));
        }
        mpsfleet_core::timeline!("container-started", task = l.task.id);
        let handle = match self.inspect_state(&created.id) {
            Ok(Some(info)) => {
                let state = state_of(&name, &info);
                self.remember(&created.id, state);
                let mut h = handle_of(&info, &name, notes);
                self.join_task_network(&info, &mut h);
                h
            }
            Ok(None) | Err(_) => DockerHandle {
                id: created.id.clone(),
                name: name.clone(),
                pid: None,
                ip: None,
                image_digest: None,
                network_bindings: Vec::new(),
                network_interfaces: Vec::new(),
                notes,
                pull: None,
            },
        };
        let digest = self
            .block("inspect image", INSPECT_TIMEOUT, self.inner.docker.inspect_image(&reference))
            .ok()
            .and_then(|i| {
                i.repo_digests
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|d| d.split_once('@').map(|(_, digest)| digest.to_string()))
            });
        Ok(DockerHandle {
            image_digest: digest.or(handle.image_digest.clone()),
            pull: pulled_ms
                .map(|took_ms| mpsfleet_types::PullTiming { began_ago_ms: pull_began.elapsed_ms(), took_ms }),
            ..handle
        })
    }

    /// The awsvpc network's id: made when missing ([`awsvpc::network_request`]). Agents sharing
    /// one engine may make it at once (API 1.41 allows two networks of one name): each then
    /// takes the oldest, and one that made a network that is not the oldest removes it.
    fn ensure_network(&self) -> Result<String, DockerError> {
        use bollard::query_parameters::ListNetworksOptions;
        let list = || -> Result<Vec<(u64, String)>, DockerError> {
            let filters = HashMap::from([
                ("name".to_string(), vec![awsvpc::NETWORK_NAME.to_string()]),
                (
                    "label".to_string(),
                    vec![format!("{}={}", awsvpc::NETWORK_LABEL, awsvpc::NETWORK_LABEL_VALUE)],
                ),
            ]);
            let nets = self.block(
                "list networks",
                LIST_TIMEOUT,
                self.inner.docker.list_networks(Some(ListNetworksOptions { filters: Some(filters) })),
            )?;
            let mut out: Vec<(u64, String)> = nets
                .into_iter()
                .filter(|n| n.name.as_deref() == Some(awsvpc::NETWORK_NAME))
                .filter_map(|n| {
                    let created = n.created.as_deref().and_then(parse_docker_time).unwrap_or(u64::MAX);
                    Some((created, n.id?))
                })
                .collect();
            out.sort();
            Ok(out)
        };
        if let Some((_, id)) = list()?.into_iter().next() {
            return Ok(id);
        }
        let made = self
            .block(
                "create network",
                CREATE_TIMEOUT,
                self.inner.docker.create_network(awsvpc::network_request()),
            )?
            .id;
        let oldest = list()?.into_iter().next().map(|(_, id)| id).unwrap_or_else(|| made.clone());
        if oldest != made {
            let _ = self.block("remove network", REMOVE_TIMEOUT, self.inner.docker.remove_network(&made));
        } else {
            tracing::info!(network = awsvpc::NETWORK_NAME, id = %made, "made the docker network for awsvpc tasks");
        }
        Ok(oldest)
    }

    /// Imports the pause image ([`awsvpc::pause_image`]) when the engine lacks it: a rootfs
    /// tar of one static executable, for the engine's architecture.
    fn ensure_pause_image(&self) -> Result<(), DockerError> {
        let reference = awsvpc::pause_image();
        if self.image_present(&reference)? {
            return Ok(());
        }
        let info = self.block("info", INSPECT_TIMEOUT, self.inner.docker.info())?;
        let arch = info.architecture.unwrap_or_default();
        let elf = awsvpc::pause_elf(&arch).ok_or_else(|| DockerError::Other {
            what: "pause image".into(),
            message: format!("awsvpc tasks need an x86_64 or aarch64 engine, this one is {arch:?}"),
        })?;
        let tar = awsvpc::one_file_tar(awsvpc::PAUSE_PATH.trim_start_matches('/'), &elf);
        let (repo, tag) = reference.split_once(':').unwrap_or((&reference, "latest"));
        let options = CreateImageOptions {
            from_src: Some("-".into()),
            repo: Some(repo.to_string()),
            tag: Some(tag.to_string()),
            changes: vec![format!("CMD [\"{}\"]", awsvpc::PAUSE_PATH)],
            ..Default::default()
        };
        let docker = self.inner.docker.clone();
        let socket = self.inner.cfg.socket.clone();
        self.run(async move {
            let work = async {
                let mut stream =
                    docker.create_image(Some(options), Some(bollard::body_full(tar.into())), None);
                while let Some(item) = stream.next().await {
                    let info = item.map_err(|e| map_err(&socket, "import pause image", e))?;
                    if let Some(detail) = info.error_detail {
                        let message = detail.message.unwrap_or_else(|| "import failed".into());
                        return Err(DockerError::Other { what: "import pause image".into(), message });
                    }
                }
                Ok(())
            };
            match tokio::time::timeout(CREATE_TIMEOUT, work).await {
                Ok(r) => r,
                Err(_) => {
                    Err(DockerError::Timeout { what: "import pause image".into(), after: CREATE_TIMEOUT })
                }
            }
        })?;
        tracing::info!(image = %reference, "imported the pause image for awsvpc tasks");
        Ok(())
    }

    /// Makes sure the task's pause container runs: one that runs is kept (another container
    /// of the task made it, or it was adopted); one that does not is replaced.
    /// [`DockerRuntime::ensure_pause`], tried again while another agent of the engine is
    /// removing the copy of the awsvpc network it made at the same moment as this one: while
    /// two networks share the name, Docker refuses to start a container on either ("network
    /// mpsfleet-awsvpc is ambiguous").
    fn ensure_pause_retried(&self, l: &DockerLaunch) -> Result<(), DockerError> {
        let mut attempt = 0;
        loop {
            match self.ensure_pause(l) {
                Err(e) if attempt < 5 && e.to_string().contains("is ambiguous") => {
                    attempt += 1;
                    tracing::debug!(attempt, error = %e, "the awsvpc network has a twin for now; trying again");
                    self.remove_network_twins();
                    std::thread::sleep(Duration::from_millis(200 * attempt));
                }
                other => return other,
            }
        }
    }

    /// Removes every awsvpc network but the oldest that no container uses (what a crash
    /// between making a twin and removing it leaves behind).
    fn remove_network_twins(&self) {
        use bollard::query_parameters::ListNetworksOptions;
        let filters = HashMap::from([("name".to_string(), vec![awsvpc::NETWORK_NAME.to_string()])]);
        let Ok(nets) = self.block(
            "list networks",
            LIST_TIMEOUT,
            self.inner.docker.list_networks(Some(ListNetworksOptions { filters: Some(filters) })),
        ) else {
            return;
        };
        let mut ours: Vec<(u64, String)> = nets
            .into_iter()
            .filter(|n| n.name.as_deref() == Some(awsvpc::NETWORK_NAME))
            .filter_map(|n| {
                Some((n.created.as_deref().and_then(parse_docker_time).unwrap_or(u64::MAX), n.id?))
            })
            .collect();
        ours.sort();
        for (_, id) in ours.into_iter().skip(1) {
            let used = self
                .block("inspect network", INSPECT_TIMEOUT, self.inner.docker.inspect_network(&id, None))
                .ok()
                .and_then(|n| n.containers)
                .is_some_and(|c| !c.is_empty());
            if !used {
                let _ = self.block("remove network", REMOVE_TIMEOUT, self.inner.docker.remove_network(&id));
            }
        }
    }

    fn ensure_pause(&self, l: &DockerLaunch) -> Result<(), DockerError> {
        let _lock = self.inner.awsvpc.lock().unwrap_or_else(|p| p.into_inner());
        let name = awsvpc::pause_name(&self.inner.cfg.host_id, &l.task.id.to_string());
        if let Some(info) = self.inspect(&name)? {
            if info.state.as_ref().and_then(|s| s.running) == Some(true) {
                return Ok(());
            }
            self.remove_by_name(&name)?;
        }
        self.ensure_pause_image()?;
        // An awsvpc task's pause container holds its network; another task's (pidMode or
        // ipcMode task) holds only the PID and IPC namespaces, on the task's own network.
        let mode = l.definition.effective_network_mode();
        let network = match mode {
            mpsfleet_types::NetworkMode::Awsvpc => self.ensure_network()?,
            m => m.as_str().to_string(),
        };
        let (_, mut body) = awsvpc::pause_body(&l.task, &l.definition, &self.inner.cfg.host_id, &network);
        if let Some(hc) = body.host_config.as_mut() {
            options::pause_namespaces(&l.definition, hc);
        }
        let created = self.block(
            "create pause container",
            CREATE_TIMEOUT,
            self.inner.docker.create_container(
                Some(CreateContainerOptions { name: Some(name.clone()), ..Default::default() }),
                body,
            ),
        )?;
        if let Err(e) = self.block(
            "start pause container",
            START_TIMEOUT,
            self.inner
                .docker
                .start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>),
        ) {
            self.remove_quietly(&name);
            return Err(e);
        }
        Ok(())
    }

    /// For a container that joined another's namespace (`container:<id>`) when that one is a
    /// task's pause container: the task's address (as the container's) and its interface.
    fn join_task_network(&self, info: &ContainerInspectResponse, h: &mut DockerHandle) {
        let Some(target) = info
            .host_config
            .as_ref()
            .and_then(|hc| hc.network_mode.as_deref())
            .and_then(|m| m.strip_prefix("container:"))
        else {
            return;
        };
        let Ok(Some(pause)) = self.inspect(target) else { return };
        let is_pause = pause
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(awsvpc::LABEL_ROLE))
            .is_some_and(|r| r == awsvpc::ROLE_PAUSE);
        if !is_pause {
            return;
        }
        let p = handle_of(&pause, "", Vec::new());
        if let Some(ip) = p.ip {
            h.ip = Some(ip.clone());
            h.network_interfaces =
                vec![mpsfleet_types::NetworkInterface { attachment_id: p.id, private_ipv4_address: ip }];
        }
    }

    /// The task has ended: its pause container (awsvpc) is stopped, to be removed with its
    /// other containers. Nothing to do for other tasks.
    pub fn end_task(&self, task_id: &str) -> Result<(), DockerError> {
        let name = awsvpc::pause_name(&self.inner.cfg.host_id, task_id);
        match self.block(
            "stop pause container",
            STOP_GRACE,
            self.inner.docker.stop_container(&name, Some(StopContainerOptions { t: Some(1), signal: None })),
        ) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.status(), Some(304) | Some(404)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn remember(&self, id: &str, state: ContainerState) {
        let mut w = self.inner.watched.lock().unwrap_or_else(|p| p.into_inner());
        // An event that arrived between the inspect and now still counts.
        let changed = w.get(id).is_some_and(|seen| seen.changed);
        w.insert(id.to_string(), Watched { state, inspected_at_ms: now_ms(), changed });
    }

    /// The container's state: from the last inspect while no event said it changed and that
    /// inspect is less than [`STATUS_REFRESH`] old, else from a new inspect.
    pub fn status(&self, h: &DockerHandle) -> Result<ContainerState, DockerError> {
        self.start_watcher();
        {
            let w = self.inner.watched.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(seen) = w.get(&h.id) {
                let fresh = now_ms().saturating_sub(seen.inspected_at_ms) < STATUS_REFRESH.as_millis() as u64;
                if !seen.changed && (fresh || !seen.state.is_running()) {
                    return Ok(seen.state.clone());
                }
            }
        }
        // Cleared before the inspect, so that an event during it is not lost.
        if let Some(seen) = self.inner.watched.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&h.id) {
            seen.changed = false;
        }
        let state = match self.inspect_state(&h.id)? {
            Some(info) => state_of(&h.name, &info),
            None => ContainerState::Lost { reason: format!("container {} no longer exists", h.name) },
        };
        let mut w = self.inner.watched.lock().unwrap_or_else(|p| p.into_inner());
        let entry = w.entry(h.id.clone()).or_insert(Watched {
            state: state.clone(),
            inspected_at_ms: now_ms(),
            changed: false,
        });
        entry.state = state.clone();
        entry.inspected_at_ms = now_ms();
        Ok(state)
    }

    /// Stops the container as `docker stop -t` does (SIGTERM or the image's STOPSIGNAL,
    /// SIGKILL after `timeout`), then reads how it ended.
    pub fn stop(&self, h: &DockerHandle, timeout: Duration) -> Result<StopOutcome, DockerError> {
        let t = i32::try_from(timeout.as_secs().max(1)).unwrap_or(i32::MAX);
        let started = now_ms();
        match self.block(
            "stop container",
            timeout + STOP_GRACE,
            self.inner.docker.stop_container(&h.id, Some(StopContainerOptions { t: Some(t), signal: None })),
        ) {
            Ok(()) => {}
            // 304: already stopped; 404: gone (the inspect below says so).
            Err(e) if matches!(e.status(), Some(304) | Some(404)) => {}
            Err(e) => return Err(e),
        }
        let took = now_ms().saturating_sub(started);
        if let Some(seen) = self.inner.watched.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&h.id) {
            seen.changed = true;
        }
        let state = self.status(h)?;
        let killed = match &state {
            ContainerState::Exited(exit) => {
                exit.code == Some(137) && !exit.oom_killed && took + 500 >= (t as u64) * 1000
            }
            _ => false,
        };
        Ok(StopOutcome { state, killed })
    }

    /// Finds the container of `task_id`/`container` by its name.
    pub fn adopt(
        &self,
        task_id: &str,
        container: &str,
    ) -> Result<Option<(DockerHandle, ContainerState)>, DockerError> {
        let name = container_name(&self.inner.cfg.host_id, task_id, container);
        let Some(info) = self.inspect_state(&name)? else { return Ok(None) };
        self.start_watcher();
        let state = state_of(&name, &info);
        let mut handle = handle_of(&info, &name, Vec::new());
        self.join_task_network(&info, &mut handle);
        self.remember(&handle.id, state.clone());
        Ok(Some((handle, state)))
    }

    fn remove_by_name(&self, name: &str) -> Result<(), DockerError> {
        match self.block(
            "remove container",
            REMOVE_TIMEOUT,
            self.inner
                .docker
                .remove_container(name, Some(RemoveContainerOptions { v: true, force: true, link: false })),
        ) {
            Ok(()) => Ok(()),
            Err(e) if e.status() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes the container (running or not) with its anonymous volumes; a missing one is Ok.
    pub fn remove(&self, task_id: &str, container: &str) -> Result<(), DockerError> {
        let name = container_name(&self.inner.cfg.host_id, task_id, container);
        let id = self.inspect(&name)?.and_then(|i| i.id);
        self.remove_by_name(&name)?;
        if let Some(id) = id {
            self.inner.watched.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            self.inner.oom_events.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        }
        Ok(())
    }

    /// Removes each of this host's containers that `pick` chooses; says how each removal went.
    /// Then removes the task-scoped volumes of tasks with no container left.
    pub fn remove_ours(&self, pick: impl Fn(&OurContainer) -> bool) -> Result<Vec<Removal>, DockerError> {
        let removals: Vec<Removal> = self
            .list_ours()?
            .into_iter()
            .filter(|c| pick(c))
            .map(|c| {
                let removed = self.remove(&c.task_id, &c.container);
                (c, removed)
            })
            .collect();
        let removed: HashSet<String> =
            removals.iter().filter(|(_, r)| r.is_ok()).map(|(c, _)| c.task_id.clone()).collect();
        match self.remove_task_volumes_left(&removed) {
            Ok(v) if !v.is_empty() => tracing::info!(volumes = ?v, "removed the volumes of removed tasks"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot remove the volumes of removed tasks"),
        }
        Ok(removals)
    }

    /// Every container labelled for this host, running or not.
    pub fn list_ours(&self) -> Result<Vec<OurContainer>, DockerError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{}={}", spec::LABEL_HOST, self.inner.cfg.host_id)],
        )]);
        let list = self.block(
            "list containers",
            LIST_TIMEOUT,
            self.inner.docker.list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            })),
        )?;
        let mut out = Vec::new();
        for c in list {
            let labels = c.labels.unwrap_or_default();
            let (Some(task_id), Some(container), Some(id)) =
                (labels.get(spec::LABEL_TASK), labels.get(spec::LABEL_CONTAINER), c.id)
            else {
                continue;
            };
            let running = matches!(
                c.state,
                Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                    | Some(bollard::models::ContainerSummaryStateEnum::PAUSED)
                    | Some(bollard::models::ContainerSummaryStateEnum::RESTARTING)
            );
            // A container that never ran (created, not started yet) counts from its creation:
            // it may be between its create and its start.
            let finished_at_ms = if running {
                None
            } else {
                self.inspect(&id)?.and_then(|i| {
                    let finished = i.state.and_then(|s| s.finished_at).as_deref().and_then(parse_docker_time);
                    finished.or_else(|| i.created.as_deref().and_then(parse_docker_time))
                })
            };
            out.push(OurContainer {
                task_id: task_id.clone(),
                container: container.clone(),
                id,
                running,
                finished_at_ms,
            });
        }
        out.sort_by(|a, b| (&a.task_id, &a.container).cmp(&(&b.task_id, &b.container)));
        Ok(out)
    }

    /// Runs `argv` in the container (as its user, in its working directory) and waits up to
    /// `timeout` for it to exit.
    pub fn exec(
        &self,
        h: &DockerHandle,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutcome, DockerError> {
        use bollard::exec::{CreateExecOptions, StartExecResults};
        let docker = self.inner.docker.clone();
        let socket = self.inner.cfg.socket.clone();
        let id = h.id.clone();
        let argv = argv.to_vec();
        self.run(async move {
            let m = |e| map_err(&socket, "exec", e);
            let create = docker.create_exec(
                &id,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(argv),
                    ..Default::default()
                },
            );
            let exec = match tokio::time::timeout(timeout, create).await {
                Ok(r) => r.map_err(m)?,
                Err(_) => return Err(DockerError::Timeout { what: "exec".into(), after: timeout }),
            };
            let work = async {
                let mut output: Vec<u8> = Vec::new();
                if let StartExecResults::Attached { output: mut stream, .. } =
                    docker.start_exec(&exec.id, None).await.map_err(m)?
                {
                    while let Some(chunk) = stream.next().await {
                        output.extend_from_slice(&chunk.map_err(m)?.into_bytes());
                        if output.len() > 2 * EXEC_OUTPUT_MAX {
                            output.drain(..output.len() - EXEC_OUTPUT_MAX);
                        }
                    }
                }
                // The stream ends when the process does; its exit code may lag a moment.
                let mut exit = None;
                for _ in 0..50 {
                    let inspect = docker.inspect_exec(&exec.id).await.map_err(m)?;
                    if inspect.running != Some(true) {
                        exit = inspect.exit_code;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let start = output.len().saturating_sub(EXEC_OUTPUT_MAX);
                Ok(ExecOutcome {
                    exit_code: exit.unwrap_or(-1),
                    output: String::from_utf8_lossy(&output[start..]).into_owned(),
                })
            };
            match tokio::time::timeout(timeout, work).await {
                Ok(r) => r,
                Err(_) => {
                    // Docker's API cannot stop an exec: kill its process (a host pid; the agent
                    // runs as root, as Docker requires), so that a hung check does not pile up.
                    if let Ok(Ok(inspect)) =
                        tokio::time::timeout(INSPECT_TIMEOUT, docker.inspect_exec(&exec.id)).await
                    {
                        if let Some(pid) = inspect.pid.filter(|&p| p > 0 && inspect.running == Some(true)) {
                            kill_exec(pid);
                        }
                    }
                    Err(DockerError::Timeout { what: "exec".into(), after: timeout })
                }
            }
        })
    }

    /// The container's log as Docker keeps it (json-file), the two streams interleaved in the
    /// order written; the last `tail_bytes` bytes when given.
    pub fn logs(
        &self,
        task_id: &str,
        container: &str,
        stdout: bool,
        stderr: bool,
        tail_bytes: Option<u64>,
    ) -> Result<Vec<u8>, DockerError> {
        let name = container_name(&self.inner.cfg.host_id, task_id, container);
        let docker = self.inner.docker.clone();
        let socket = self.inner.cfg.socket.clone();
        let keep = tail_bytes.map(|t| usize::try_from(t).unwrap_or(usize::MAX));
        self.run(async move {
            let work = async {
                let mut out = Vec::new();
                let mut stream =
                    docker.logs(&name, Some(LogsOptions { stdout, stderr, ..Default::default() }));
                while let Some(chunk) = stream.next().await {
                    out.extend_from_slice(&chunk.map_err(|e| map_err(&socket, "logs", e))?.into_bytes());
                    if let Some(keep) = keep {
                        if out.len() > keep.saturating_mul(2).max(1 << 16) {
                            out.drain(..out.len() - keep);
                        }
                    }
                }
                if let Some(keep) = keep {
                    let start = out.len().saturating_sub(keep);
                    out.drain(..start);
                }
                Ok(out)
            };
            match tokio::time::timeout(LOGS_TIMEOUT, work).await {
                Ok(r) => r,
                Err(_) => Err(DockerError::Timeout { what: "logs".into(), after: LOGS_TIMEOUT }),
            }
        })
    }

    /// A thread that copies the container's stdout and stderr, from its start (or from just
    /// after the last frame already in `output_log`), as frames stamped with Docker's own
    /// times, to `output_log`, rotating it as the shim does. It ends when Docker's log stream
    /// ends (the container stopped) or cannot be read.
    pub fn follow_output(
        &self,
        h: &DockerHandle,
        output_log: PathBuf,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let mut writer = FramedWriter::open(output_log.clone())?;
        let after_ms = resume_point(&output_log);
        let docker = self.inner.docker.clone();
        let handle = self.inner.handle.clone();
        let id = h.id.clone();
        let name = h.name.clone();
        std::thread::Builder::new().name(format!("docker-follow-{name}")).spawn(move || {
            handle.block_on(async move {
                let since = after_ms.map(|ms| i32::try_from(ms / 1000).unwrap_or(i32::MAX)).unwrap_or(0);
                let mut stream = docker.logs(
                    &id,
                    Some(LogsOptions {
                        follow: true,
                        stdout: true,
                        stderr: true,
                        since,
                        timestamps: true,
                        ..Default::default()
                    }),
                );
                let mut failed = false;
                while let Some(chunk) = stream.next().await {
                    let (stream_kind, message) = match chunk {
                        Ok(bollard::container::LogOutput::StdOut { message })
                        | Ok(bollard::container::LogOutput::Console { message }) => (OutputStream::Stdout, message),
                        Ok(bollard::container::LogOutput::StdErr { message }) => (OutputStream::Stderr, message),
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::debug!(container = %name, error = %e, "docker log stream ended");
                            break;
                        }
                    };
                    let (at_ms, bytes) = split_timestamp(&message);
                    let at_ms = at_ms.unwrap_or_else(now_ms);
                    // Frames up to the last one written are already in the file (a frame
                    // written in the same millisecond as the last one is taken as a repeat).
                    if after_ms.is_some_and(|after| at_ms <= after) {
                        continue;
                    }
                    if let Err(e) = writer.append(stream_kind, at_ms, bytes) {
                        if !failed {
                            failed = true;
                            tracing::warn!(path = %output_log.display(), error = %e, "cannot write container output");
                        }
                    }
                }
            })
        })
    }

    /// Starts the events watcher once: it marks containers of this host as changed when
    /// Docker reports them dead, killed for memory or destroyed, and reconnects with a backoff
    /// when the stream ends (marking every container changed, since events may be lost). Each
    /// connection asks Engine for the events since a little before the last one it saw (the
    /// first: [`EVENTS_REPLAY`] before it started), so that an `oom` sent while it was not yet
    /// or no longer connected still arrives: a container killed at once for its memory limit
    /// dies before the first connection is up.
    fn start_watcher(&self) {
        self.inner.watcher.get_or_init(|| {
            let weak = Arc::downgrade(&self.inner);
            self.inner.handle.spawn(watch_events(weak));
        });
    }
}

/// How far back the events watcher's first connection asks Engine to replay.
const EVENTS_REPLAY: Duration = Duration::from_secs(60);

async fn watch_events(inner: Weak<Inner>) {
    let mut backoff = Duration::from_millis(100);
    // Seconds since the epoch: where the next connection asks Engine to start from.
    let mut since_s = (now_ms() / 1000).saturating_sub(EVENTS_REPLAY.as_secs());
    loop {
        let (docker, host) = match inner.upgrade() {
            Some(i) => (i.docker.clone(), i.cfg.host_id.clone()),
            None => return,
        };
        let filters = HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            ("label".to_string(), vec![format!("{}={host}", spec::LABEL_HOST)]),
            ("event".to_string(), vec!["die".to_string(), "oom".to_string(), "destroy".to_string()]),
        ]);
        let options =
            EventsOptions { filters: Some(filters), since: Some(since_s.to_string()), ..Default::default() };
        let mut stream = docker.events(Some(options));
        let mut got_any = false;
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { break };
            got_any = true;
            backoff = Duration::from_millis(100);
            // A second back: events of the same second as the last may come after it.
            if let Some(t) = event.time.and_then(|t| u64::try_from(t).ok()) {
                since_s = since_s.max(t.saturating_sub(1));
            }
            let Some(inner) = inner.upgrade() else { return };
            mark_changed(&inner, &event);
        }
        drop(stream);
        let Some(i) = inner.upgrade() else { return };
        for w in i.watched.lock().unwrap_or_else(|p| p.into_inner()).values_mut() {
            w.changed = true;
        }
        drop(i);
        if !got_any {
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        tokio::time::sleep(backoff).await;
    }
}

fn mark_changed(inner: &Inner, event: &EventMessage) {
    let Some(id) = event.actor.as_ref().and_then(|a| a.id.as_deref()) else { return };
    match event.action.as_deref() {
        Some("oom") => {
            inner.oom_events.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string());
        }
        Some("destroy") => {
            inner.oom_events.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        }
        _ => {}
    }
    // Also for a container not seen yet: a launch may be between its inspect and remembering
    // the result. The entry goes when the container is removed.
    let mut watched = inner.watched.lock().unwrap_or_else(|p| p.into_inner());
    watched
        .entry(id.to_string())
        .or_insert_with(|| Watched {
            state: ContainerState::Lost { reason: "not inspected yet".into() },
            inspected_at_ms: 0,
            changed: true,
        })
        .changed = true;
}

/// Splits Docker's `timestamps=true` prefix (`2026-12-01T08:50:12.123456789Z `) off a log
/// entry.
fn split_timestamp(message: &[u8]) -> (Option<u64>, &[u8]) {
    let Some(space) = message.iter().take(40).position(|&b| b == b' ') else { return (None, message) };
    match std::str::from_utf8(&message[..space]).ok().and_then(parse_docker_time) {
        Some(ms) => (Some(ms), &message[space + 1..]),
        None => (None, message),
    }
}

#[cfg(test)]
mod tests;
