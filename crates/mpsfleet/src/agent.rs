//! `mpsfleet agent`: the node agent's command line.

use anyhow::{Context, Result};
use clap::Args;
use mpsfleet_agent::docker::{ImagePolicy, PullBehavior};
use mpsfleet_agent::mps::MpsPolicy;
use mpsfleet_agent::{AgentConfig, DockerSettings, MpsMode, RuntimeChoice};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct AgentArgs {
    /// How log lines are written to standard error: `text`, or `json` (one object a line,
    /// with each API request's id) for log collectors.
    #[arg(long, value_enum, default_value = "text")]
    log_format: crate::LogFormat,
    /// The control plane's address.
    #[arg(long, env = "MPSFLEET_SERVER")]
    server: String,
    /// The join token (first start only: the host's own credential is kept in the data dir).
    /// On the command line it is visible to every local user (`ps`): prefer
    /// MPSFLEET_JOIN_TOKEN or --join-token-file.
    #[arg(long, env = "MPSFLEET_JOIN_TOKEN", hide_env_values = true, conflicts_with = "join_token_file")]
    join_token: Option<String>,
    /// A file holding the join token (its first non-blank line, trimmed).
    #[arg(long)]
    join_token_file: Option<PathBuf>,
    /// The cluster CA (PEM) to verify an https:// server with [default: the CA whose hash the
    /// join token carries, fetched at first contact and kept in the data dir].
    #[arg(long, env = "MPSFLEET_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// The pool this host joins.
    #[arg(long, default_value = "default")]
    pool: String,
    /// The agent's state: identity, task table, task logs, MPS pipe and log directories.
    #[arg(long, env = "MPSFLEET_AGENT_DATA_DIR", default_value = ".mpsfleet-agent")]
    data_dir: PathBuf,
    /// The name this host registers under [default: the machine's hostname].
    #[arg(long)]
    hostname: Option<String>,
    /// The zone this host is in, as ECS's `availabilityZone` of its tasks and the
    /// `ecs.availability-zone` attribute of its container instance: at most 64 lowercase
    /// letters, digits, '-' and '_' [default: local].
    #[arg(long, env = "MPSFLEET_AVAILABILITY_ZONE", default_value = "local", value_parser = zone)]
    availability_zone: String,
    /// Declare GPUs when NVML finds none: MODEL:MEMORY_MIB:COUNT, e.g. H200:143771:2.
    #[arg(long)]
    emulate_gpus: Option<String>,
    /// Path of nvidia-cuda-mps-control [default: found on PATH].
    #[arg(long, conflicts_with = "mps_model")]
    mps_control: Option<PathBuf>,
    /// Use the in-process model of MPS instead of the real daemon (the host shows as emulated).
    #[arg(long)]
    mps_model: bool,
    /// One MPS daemon for all GPUs instead of one per GPU.
    #[arg(long)]
    daemon_per_host: bool,
    /// Inject the faults a drill asks for (`mpsfleet drill run`): kill or stop this host's MPS
    /// daemons, fail its GPU check, go silent. Off by default: without it drills cannot strike
    /// this host.
    #[arg(long)]
    allow_fault_injection: bool,
    /// Milliseconds between heartbeats to the server (at least 100).
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// How often each MPS daemon is probed, until the server sends the pool's policy
    /// (healthPolicy.mpsProbeIntervalMs).
    #[arg(long, default_value_t = 5000)]
    mps_probe_interval_ms: u64,
    /// Hard timeout of each MPS probe; a daemon that does not answer in time counts as failed.
    /// Used until the server sends the pool's policy (healthPolicy.mpsProbeTimeoutMs).
    #[arg(long, default_value_t = 3000)]
    mps_probe_timeout_ms: u64,
    /// Consecutive probe failures before the GPU's MPS check turns IMPAIRED, until the server
    /// sends the pool's policy (healthPolicy.mpsFailureThreshold).
    #[arg(long, default_value_t = 3)]
    mps_failure_threshold: u32,
    /// Local daemon restarts (within 10 minutes) before giving up, until the server sends the
    /// pool's policy (healthPolicy.localDaemonRestarts).
    #[arg(long, default_value_t = 3)]
    mps_max_restarts: u32,
    /// Stop every task when the agent stops (by default tasks outlive agent restarts).
    #[arg(long)]
    stop_tasks_on_exit: bool,
    /// Where to serve task logs to the server; use an address the server can reach.
    #[arg(long, default_value = "127.0.0.1:0")]
    logs_listen: std::net::SocketAddr,
    /// How tasks run: `docker` (containers on Docker Engine), `process`, or `auto` (Docker
    /// when its socket answers, else processes; the agent says which).
    #[arg(long, value_parser = ["auto", "docker", "process"], default_value = "auto")]
    runtime: String,
    /// Docker Engine's socket [default: DOCKER_HOST's unix:// path, else /var/run/docker.sock].
    #[arg(long)]
    docker_socket: Option<PathBuf>,
    /// The IP address (IPv4 or IPv6) containers' ports are published on, e.g. 127.0.0.1 to
    /// keep them off the network [default: every address, IPv4 and IPv6, as ECS].
    #[arg(long, value_name = "ADDR", value_parser = parse_publish_address)]
    publish_address: Option<std::net::IpAddr>,
    /// When images are pulled, as ECS_IMAGE_PULL_BEHAVIOR: `default` (pull; on failure use a
    /// cached copy), `always`, `once`, `prefer-cached`.
    #[arg(long, default_value = "default")]
    image_pull_behavior: String,
    /// How long one image pull may take.
    #[arg(long, default_value_t = 300)]
    image_pull_timeout_s: u64,
    /// How long a stopped task's containers are kept before they are removed.
    #[arg(long, default_value_t = 3600)]
    container_retention_s: u64,
    /// Unused images are removed when no task used them for this long (checked every 30 min,
    /// at most 5 per round).
    #[arg(long, default_value_t = 3600)]
    image_min_age_s: u64,
    #[command(flatten)]
    users: Box<TaskUserArgs>,
}

/// Who process tasks run as (boxed: the command's arguments stay small).
#[derive(Args)]
pub struct TaskUserArgs {
    /// The uids process tasks run as when the agent runs as root and their definition names no
    /// `user`: one per running task, FIRST-LAST (may not hold 0 or the agent's own uid); the
    /// last ones are kept for MPS tasks, one per MPS daemon, shared by that GPU's MPS tasks.
    #[arg(long, default_value = "200000-299999")]
    task_uid_range: String,
    /// Where a root agent keeps what tasks of other uids must reach (their own directories,
    /// the MPS pipe directories) [default: /run/mpsfleet-agent/<key of the data dir>].
    #[arg(long)]
    run_dir: Option<PathBuf>,
}

/// `--publish-address`: an IP address, never a name (Docker binds an address, and a name
/// could resolve to another one later).
fn zone(s: &str) -> Result<String, String> {
    if mpsfleet_types::HostPlatform::valid_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "expected 1 to {} lowercase letters, digits, '-' or '_' (such as us-east-1a)",
            mpsfleet_types::HostPlatform::MAX_NAME_BYTES
        ))
    }
}

fn parse_publish_address(s: &str) -> Result<std::net::IpAddr, String> {
    s.parse().map_err(|_| {
        "expected an IP address, IPv4 or IPv6 (such as 127.0.0.1 or ::1), without a port; a hostname \
         is not taken"
            .to_string()
    })
}

/// The join token from `--join-token-file`: its first non-blank line, trimmed.
fn read_join_token(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--join-token-file: cannot read {}", path.display()))?;
    let token = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    anyhow::ensure!(!token.is_empty(), "--join-token-file: {} holds no token", path.display());
    Ok(token.to_string())
}

pub fn run(args: AgentArgs) -> Result<()> {
    // First, before any thread or child exists: a host started by the `local` provider leads
    // its own session, so that its termination can find all it ran.
    let own_session = mpsfleet_proc::start_session_if_asked();
    // Read already (clap): no child of the agent (MPS daemons, shims, tasks) inherits it.
    // Still one thread only, so changing the environment races with no reader.
    std::env::remove_var("MPSFLEET_JOIN_TOKEN");
    crate::init_logging("info", args.log_format);
    match own_session {
        Ok(true) => tracing::debug!("leading a session of its own"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "cannot start a session of its own"),
    }
    let mps = if args.mps_model {
        MpsMode::Model
    } else {
        match crate::up::find_mps_control(args.mps_control.as_deref()) {
            Some(p) => MpsMode::Real(p),
            None => {
                tracing::warn!(
                    "nvidia-cuda-mps-control not found (PATH or --mps-control): this host takes no MPS tasks"
                );
                MpsMode::Unavailable
            }
        }
    };
    let policy = MpsPolicy {
        probe_interval: Duration::from_millis(args.mps_probe_interval_ms),
        probe_timeout: Duration::from_millis(args.mps_probe_timeout_ms),
        failure_threshold: args.mps_failure_threshold,
        max_local_restarts: args.mps_max_restarts,
        ..MpsPolicy::default()
    };
    policy.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    anyhow::ensure!(
        args.heartbeat_ms >= 100,
        "--heartbeat-ms must be at least 100, got {}",
        args.heartbeat_ms
    );
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let hostname =
        args.hostname.unwrap_or_else(|| mpsfleet_proc::hostname().unwrap_or_else(|| "localhost".into()));
    let runtime = match args.runtime.as_str() {
        "docker" => RuntimeChoice::Docker,
        "process" => RuntimeChoice::Process,
        _ => RuntimeChoice::Auto,
    };
    let pull: PullBehavior =
        args.image_pull_behavior.parse().map_err(|e| anyhow::anyhow!("--image-pull-behavior: {e}"))?;
    anyhow::ensure!(
        (1..=3600).contains(&args.image_pull_timeout_s),
        "--image-pull-timeout-s must be 1 to 3600 seconds, got {}",
        args.image_pull_timeout_s
    );
    anyhow::ensure!(
        args.container_retention_s <= 30 * 24 * 3600,
        "--container-retention-s must be at most 30 days (2592000), got {}",
        args.container_retention_s
    );
    let task_uids = mpsfleet_agent::runtime::UidRange::parse(
        &args.users.task_uid_range,
        mpsfleet_agent::runtime::identity::agent_uid(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let join_token = match (&args.join_token_file, args.join_token) {
        (Some(path), _) => Some(read_join_token(path)?),
        (None, token) => token,
    };
    let docker = DockerSettings {
        socket: args.docker_socket.unwrap_or_else(mpsfleet_agent::docker::socket_from_env),
        pull,
        pull_timeout: Duration::from_secs(args.image_pull_timeout_s),
        container_retention: Duration::from_secs(args.container_retention_s),
        images: ImagePolicy { min_age: Duration::from_secs(args.image_min_age_s), ..ImagePolicy::default() },
        publish_address: args.publish_address,
    };
    let cfg = AgentConfig {
        server: args.server,
        join_token,
        ca_file: args.ca_file,
        pool: args.pool,
        data_dir: args.data_dir,
        hostname,
        availability_zone: args.availability_zone,
        emulate_gpus: args.emulate_gpus,
        mps,
        daemon_per_host: args.daemon_per_host,
        policy,
        heartbeat: Duration::from_millis(args.heartbeat_ms),
        allow_fault_injection: args.allow_fault_injection,
        stop_tasks_on_exit: args.stop_tasks_on_exit,
        shim: vec![exe.into_os_string(), "shim".into()],
        logs_listen: args.logs_listen,
        runtime,
        docker,
        task_uids,
        run_dir: args.users.run_dir.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(mpsfleet_agent::run(cfg, crate::server::shutdown_signal()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_publish_address;

    #[test]
    fn the_publish_address_is_an_ip_address() {
        for ok in ["127.0.0.1", "0.0.0.0", "::1", "::", "10.1.2.3", "fd00::5"] {
            assert_eq!(parse_publish_address(ok).map(|ip| ip.to_string()), Ok(ok.to_string()));
        }
        for bad in ["localhost", "127.0.0.1:80", "[::1]", "", "300.1.1.1", "example.com"] {
            let e = parse_publish_address(bad).expect_err(bad);
            assert!(e.starts_with("expected an IP address"), "{bad}: {e}");
        }
    }
}
