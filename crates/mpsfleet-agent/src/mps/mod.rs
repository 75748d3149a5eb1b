//! MPS daemon control and supervision: the [`MpsControl`] seam with the real
//! `nvidia-cuda-mps-control` driver ([`RealMps`]) and an in-process model ([`ModelMps`]), the
//! control.log watcher, the pure per-GPU health state machine ([`health`], from
//! `mpsfleet_core::lifecycle::mps`) and the thread that runs it ([`Supervisor`]).

pub use mpsfleet_core::lifecycle::mps as health;
pub mod log;
pub mod model;
pub mod real;
pub mod supervisor;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use health::{Check, MpsPolicy};
pub use log::{ControlLogWatcher, LogEvent};
pub use model::ModelMps;
pub use real::{DaemonRecord, RealMps};
pub use supervisor::Supervisor;

/// Name of the control socket that the daemon creates in its pipe directory (the longest one).
const LONGEST_SOCKET_NAME: &str = "control_privileged";
/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// How to run one MPS control daemon (one per GPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    /// `nvidia-cuda-mps-control`.
    pub control_bin: PathBuf,
    /// `CUDA_MPS_PIPE_DIRECTORY`; keep it short: the socket path must fit in 107 bytes.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`; the daemon's output goes to `control.log` there.
    pub log_dir: PathBuf,
    /// `CUDA_VISIBLE_DEVICES` for the daemon (a GPU UUID); `None` serves all GPUs.
    pub visible_devices: Option<String>,
    /// Applied at start with `set_default_active_thread_percentage`; 1 to 100.
    pub default_active_thread_percentage: Option<u8>,
    /// Applied at start with `set_default_device_pinned_mem_limit 0 <N>M`.
    pub default_pinned_mem_limit_mib: Option<u64>,
    /// Hard timeout of every control command, at start: a running daemon's is changed with
    /// [`MpsDaemon::set_probe_timeout`].
    pub probe_timeout: Duration,
    /// How long `stop` lets the daemon quit (`quit -t`) before killing its process group.
    pub quit_timeout: Duration,
    /// How long `start` waits for a new daemon to answer.
    pub start_timeout: Duration,
}

impl DaemonConfig {
    pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(3);
    pub const DEFAULT_QUIT_TIMEOUT: Duration = Duration::from_secs(5);
    pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(10);

    /// A configuration with the defaults: all GPUs, no limits, 3 s command timeout.
    pub fn new(
        control_bin: impl Into<PathBuf>,
        pipe_dir: impl Into<PathBuf>,
        log_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            control_bin: control_bin.into(),
            pipe_dir: pipe_dir.into(),
            log_dir: log_dir.into(),
            visible_devices: None,
            default_active_thread_percentage: None,
            default_pinned_mem_limit_mib: None,
            probe_timeout: Self::DEFAULT_PROBE_TIMEOUT,
            quit_timeout: Self::DEFAULT_QUIT_TIMEOUT,
            start_timeout: Self::DEFAULT_START_TIMEOUT,
        }
    }

    /// Checks the fields the daemon cannot check for us; errors name the field.
    pub fn validate(&self) -> Result<(), MpsError> {
        let invalid = |field: &'static str, reason: String| Err(MpsError::InvalidConfig { field, reason });
        if self.control_bin.as_os_str().is_empty() {
            return invalid("control_bin", "must not be empty".into());
        }
        if !self.pipe_dir.is_absolute() {
            return invalid("pipe_dir", format!("{} is not an absolute path", self.pipe_dir.display()));
        }
        let socket_len = self.pipe_dir.as_os_str().len() + 1 + LONGEST_SOCKET_NAME.len();
        if socket_len > MAX_SOCKET_PATH {
            return invalid(
                "pipe_dir",
                format!(
                    "{} is too long: its socket path would be {socket_len} bytes, at most {MAX_SOCKET_PATH} fit \
                     (pipe_dir may have at most {} bytes)",
                    self.pipe_dir.display(),
                    MAX_SOCKET_PATH - 1 - LONGEST_SOCKET_NAME.len()
                ),
            );
        }
        if !self.log_dir.is_absolute() {
            return invalid("log_dir", format!("{} is not an absolute path", self.log_dir.display()));
        }
        if let Some(devices) = &self.visible_devices {
            if devices.is_empty() || devices.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return invalid("visible_devices", format!("{devices:?} is not a device list"));
            }
        }
        if let Some(p) = self.default_active_thread_percentage {
            if p == 0 || p > 100 {
                return invalid("default_active_thread_percentage", format!("{p} is not in 1..=100"));
            }
        }
        if self.default_pinned_mem_limit_mib == Some(0) {
            return invalid("default_pinned_mem_limit_mib", "must be greater than 0".into());
        }
        if self.probe_timeout.is_zero() {
            return invalid("probe_timeout", "must be greater than 0".into());
        }
        if self.start_timeout.is_zero() {
            return invalid("start_timeout", "must be greater than 0".into());
        }
        Ok(())
    }

    /// The environment a task needs to reach this daemon (`CUDA_MPS_PIPE_DIRECTORY`).
    pub fn client_env(&self) -> Vec<(String, String)> {
        vec![("CUDA_MPS_PIPE_DIRECTORY".to_string(), self.pipe_dir.display().to_string())]
    }
}

/// How a daemon process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    /// Exited with this status.
    Status(i32),
    /// Killed by this signal.
    Signal(i32),
    /// An adopted daemon (started by an earlier agent, so not our child) is gone; without
    /// `waitpid` its status cannot be known.
    Vanished,
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitInfo::Status(code) => write!(f, "daemon exited (status {code})"),
            ExitInfo::Signal(sig) => write!(f, "daemon exited (signal {sig})"),
            ExitInfo::Vanished => write!(f, "daemon exited (not a child of this agent; status unknown)"),
        }
    }
}

/// State of one MPS server as `get_server_status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    Initializing,
    Active,
    /// A fatal GPU fault: refuses new clients until all its clients exit.
    Fault,
    /// Listed by `get_server_list`, but its process is gone.
    Gone,
    /// Running, state not known (the daemon lacks `get_server_status`, as driver 535 does).
    Unknown,
}

/// One server seen by a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub pid: u32,
    pub state: ServerState,
}

/// What a probe found when the daemon answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub servers: Vec<ServerInfo>,
}

impl ProbeOutcome {
    /// Healthy: no server in FAULT, no listed server gone.
    pub fn healthy(&self) -> bool {
        self.problem().is_none()
    }

    /// The first problem found, for a check's reason.
    pub fn problem(&self) -> Option<String> {
        self.servers.iter().find_map(|s| match s.state {
            ServerState::Fault => Some(format!("mps server {} in FAULT", s.pid)),
            ServerState::Gone => Some(format!("mps server {} listed but not running", s.pid)),
            _ => None,
        })
    }
}

/// Errors of MPS control.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("invalid mps daemon config: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {bin}: {source}")]
    Spawn {
        bin: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The daemon did not answer within the hard timeout (a wedged daemon).
    #[error("probe timed out after {}", fmt_duration(*timeout))]
    Timeout { command: String, timeout: Duration },
    /// No daemon listens on the pipe directory.
    #[error("mps control daemon not running on {}", pipe_dir.display())]
    NotRunning { pipe_dir: PathBuf },
    #[error("another mps control daemon already runs on {}", pipe_dir.display())]
    AlreadyRunning { pipe_dir: PathBuf },
    #[error("mps control daemon does not know command {command:?}")]
    UnknownCommand { command: String },
    #[error("mps control command {command:?} failed ({status}): {output}")]
    CommandFailed { command: String, status: String, output: String },
    #[error("unexpected output of mps control command {command:?}: {output:?}")]
    Protocol { command: String, output: String },
    #[error("mps server {pid} not found")]
    ServerNotFound { pid: u32 },
    #[error("terminate_client {client_pid} of mps server {server_pid} failed: {output:?}")]
    TerminateFailed { server_pid: u32, client_pid: u32, output: String },
    #[error("{exit} while starting on {}: {output}", pipe_dir.display())]
    ExitedAtStart { pipe_dir: PathBuf, exit: ExitInfo, output: String },
    #[error("mps control daemon {pid} did not answer within {} of start: {last}", fmt_duration(*waited))]
    StartTimeout { pid: u32, waited: Duration, last: String },
    #[error("configuring mps control daemon {pid}: {source}")]
    Configure {
        pid: u32,
        #[source]
        source: Box<MpsError>,
    },
    #[error("mps daemon {label} not answering after {attempts} attempts: {reason}")]
    NotAnswering { label: String, attempts: u32, reason: String },
    #[error("mps daemon {label} is not running: {reason}")]
    NoDaemon { label: String, reason: String },
    #[error("cannot start the mps supervisor thread for {label}: {source}")]
    Thread {
        label: String,
        #[source]
        source: std::io::Error,
    },
}

impl From<health::PolicyError> for MpsError {
    fn from(e: health::PolicyError) -> Self {
        MpsError::InvalidConfig { field: e.field, reason: e.reason }
    }
}

/// "3s", "1.5s", "500ms", "10m": durations as people write them in reasons (the server's
/// format).
pub fn fmt_duration(d: Duration) -> String {
    mpsfleet_core::health::fmt_ms(d.as_millis() as u64)
}

/// Starts MPS control daemons: the seam between the agent and `nvidia-cuda-mps-control`.
pub trait MpsControl: Send + Sync {
    /// Starts a daemon as configured, waits until it answers and applies the defaults.
    fn start(&self, cfg: &DaemonConfig) -> Result<Box<dyn MpsDaemon>, MpsError>;

    /// Asks whatever daemon answers on `cfg.pipe_dir` (one left by an earlier agent) to quit;
    /// returns whether one answered. Use before `start` to take a pipe directory over.
    fn quit_existing(&self, cfg: &DaemonConfig) -> Result<bool, MpsError>;

    /// Takes over the daemon that an earlier agent (killed, even with `kill -9`, or restarted)
    /// left running for `cfg`, without disturbing it or its clients: its settings are kept, the
    /// configured defaults are not applied again. `Ok(None)` when there is none to adopt (stale
    /// records are cleaned up); then `start` as usual. A daemon that is there but does not
    /// answer is adopted all the same: the supervisor's probes restart it the normal way.
    fn adopt(&self, cfg: &DaemonConfig) -> Result<Option<Box<dyn MpsDaemon>>, MpsError> {
        let _ = cfg;
        Ok(None)
    }
}

/// One running MPS control daemon. Every method is bounded in time and safe to call from
/// several threads.
/// What a drill does to a daemon (see [`MpsDaemon::inject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    Exit,
    Hang,
    Resume,
}

pub trait MpsDaemon: Send + Sync {
    /// The daemon's process id (the model's is made up).
    fn pid(&self) -> u32;

    /// `CUDA_MPS_PIPE_DIRECTORY` of this daemon, for the environment of its tasks.
    fn pipe_dir(&self) -> &Path;

    /// Runs one control command with the hard timeout and returns its output, trimmed.
    /// `Unknown command` and `Cannot find MPS control daemon process` are errors.
    fn control(&self, command: &str) -> Result<String, MpsError>;

    /// Non-blocking: how the daemon ended, once it has.
    fn try_exit(&self) -> Option<ExitInfo>;

    /// Calls `notify` once the daemon's process has ended (from a thread of its own, without
    /// reaping it), so that its supervisor sees the exit at once instead of at its next tick.
    /// False where it cannot be watched (an adopted daemon, the model): the tick finds it.
    fn notify_exit(&self, _notify: Box<dyn FnOnce() + Send>) -> bool {
        false
    }

    /// Stops the daemon with `quit -t`, waits a bounded time, then kills its process group and
    /// reaps it. Idempotent.
    fn stop(&self) -> Result<(), MpsError>;

    /// Kills the daemon's process group at once and reaps it, without asking it to `quit`:
    /// for a daemon that already failed (exited or stopped answering), where `quit` would only
    /// wait out its timeout before the local restart. Idempotent.
    fn kill(&self) -> Result<(), MpsError> {
        self.stop()
    }

    /// A drill's fault: the daemon dies as from `kill -KILL` ([`Injected::Exit`]), stops
    /// answering as from `kill -STOP` ([`Injected::Hang`]), or answers again
    /// ([`Injected::Resume`]). The real daemon gets the signal; the model acts it out.
    fn inject(&self, fault: Injected) -> Result<(), MpsError>;

    /// New events from the daemon's control.log since the last call.
    fn poll_log(&self) -> Vec<LogEvent>;

    /// Whether a server process runs (for servers listed by `get_server_list`).
    fn server_running(&self, pid: u32) -> bool;

    /// For agent restarts: lets the daemon outlive this handle. Afterwards dropping the handle
    /// no longer stops the daemon and its identity record stays, so that the next agent can
    /// [`MpsControl::adopt`] it; do not use the handle any more. A no-op where nothing would
    /// stop the daemon anyway.
    fn detach(&self) {}

    /// Replaces the hard timeout of the control commands that start from now on (the pool's
    /// policy changed); a command already running keeps its own.
    fn set_probe_timeout(&self, timeout: Duration);

    /// Asks the daemon for its servers and their states.
    fn probe(&self) -> Result<ProbeOutcome, MpsError> {
        probe_daemon(self)
    }

    /// Ends a client's GPU work safely (`terminate_client`); kill the process afterwards.
    fn terminate_client(&self, server_pid: u32, client_pid: u32) -> Result<(), MpsError> {
        let output = self.control(&format!("terminate_client {server_pid} {client_pid}"))?;
        parse_terminate_client(server_pid, client_pid, &output)
    }
}

/// `get_server_list`, then `get_server_status PID` for each server.
fn probe_daemon<D: MpsDaemon + ?Sized>(daemon: &D) -> Result<ProbeOutcome, MpsError> {
    let pids = parse_server_list(&daemon.control("get_server_list")?)?;
    let mut servers = Vec::with_capacity(pids.len());
    for pid in pids {
        let state = if !daemon.server_running(pid) {
            ServerState::Gone
        } else {
            match daemon.control(&format!("get_server_status {pid}")) {
                Ok(output) => parse_server_status(&output),
                // Driver 535 has no get_server_status; the process being there is all we know.
                Err(MpsError::UnknownCommand { .. }) => ServerState::Unknown,
                Err(MpsError::ServerNotFound { .. }) => ServerState::Gone,
                Err(e) => return Err(e),
            }
        };
        servers.push(ServerInfo { pid, state });
    }
    Ok(ProbeOutcome { servers })
}

/// PIDs, one per line; empty output means no server.
pub fn parse_server_list(output: &str) -> Result<Vec<u32>, MpsError> {
    output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse::<u32>().map_err(|_| MpsError::Protocol {
                command: "get_server_list".into(),
                output: output.to_string(),
            })
        })
        .collect()
}

/// `INITIALIZING`, `ACTIVE` or `FAULT`, possibly with more words around it.
pub fn parse_server_status(output: &str) -> ServerState {
    let upper = output.to_ascii_uppercase();
    if upper.contains("FAULT") {
        ServerState::Fault
    } else if upper.contains("ACTIVE") {
        ServerState::Active
    } else if upper.contains("INITIALIZING") {
        ServerState::Initializing
    } else if upper.contains("NOT FOUND") {
        ServerState::Gone
    } else {
        ServerState::Unknown
    }
}

/// `0` on the last line is success; "Server N not found" means the server is gone.
pub fn parse_terminate_client(server_pid: u32, client_pid: u32, output: &str) -> Result<(), MpsError> {
    if output.lines().last().map(str::trim) == Some("0") {
        return Ok(());
    }
    if output.contains("not found") && output.contains(&format!("Server {server_pid}")) {
        return Err(MpsError::ServerNotFound { pid: server_pid });
    }
    Err(MpsError::TerminateFailed { server_pid, client_pid, output: output.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        for (ms, want) in [
            (3000, "3s"),
            (500, "500ms"),
            (1500, "1.5s"),
            (1250, "1.25s"),
            (0, "0s"),
            (600_000, "10m"),
            (90_000, "90s"),
        ] {
            assert_eq!(fmt_duration(Duration::from_millis(ms)), want, "{ms} ms");
        }
    }

    #[test]
    fn timeout_error_reads_like_ecs() {
        let e = MpsError::Timeout { command: "get_server_list".into(), timeout: Duration::from_secs(3) };
        assert_eq!(e.to_string(), "probe timed out after 3s");
    }

    #[test]
    fn exit_info_messages() {
        assert_eq!(ExitInfo::Signal(9).to_string(), "daemon exited (signal 9)");
        assert_eq!(ExitInfo::Status(1).to_string(), "daemon exited (status 1)");
        assert_eq!(
            ExitInfo::Vanished.to_string(),
            "daemon exited (not a child of this agent; status unknown)"
        );
    }

    #[test]
    fn config_validation_names_the_field() {
        let ok = DaemonConfig::new("/usr/bin/nvidia-cuda-mps-control", "/run/mps/0", "/var/log/mps/0");
        assert!(ok.validate().is_ok());
        let long = DaemonConfig { pipe_dir: PathBuf::from(format!("/{}", "x".repeat(100))), ..ok.clone() };
        let err = long.validate().unwrap_err().to_string();
        assert!(err.contains("pipe_dir") && err.contains("too long"), "{err}");
        let pct = DaemonConfig { default_active_thread_percentage: Some(0), ..ok.clone() };
        assert!(pct.validate().unwrap_err().to_string().contains("default_active_thread_percentage"));
        let rel = DaemonConfig { pipe_dir: PathBuf::from("mps"), ..ok.clone() };
        assert!(rel.validate().unwrap_err().to_string().contains("absolute"));
        let dev = DaemonConfig { visible_devices: Some("GPU 1".into()), ..ok };
        assert!(dev.validate().unwrap_err().to_string().contains("visible_devices"));
    }

    #[test]
    fn longest_pipe_dir_that_fits_is_accepted() {
        // 107 - 1 - 18 = 88 bytes of pipe directory.
        let fits = DaemonConfig::new("mps", format!("/{}", "x".repeat(87)), "/l");
        assert!(fits.validate().is_ok());
        let too_long = DaemonConfig::new("mps", format!("/{}", "x".repeat(88)), "/l");
        assert!(too_long.validate().is_err());
    }

    #[test]
    fn parses_control_output() {
        assert_eq!(parse_server_list("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_server_list("17910\n17911\n").unwrap(), vec![17910, 17911]);
        assert!(parse_server_list("Server not found").is_err());
        assert_eq!(parse_server_status("ACTIVE"), ServerState::Active);
        assert_eq!(parse_server_status("17910 FAULT"), ServerState::Fault);
        assert_eq!(parse_server_status("INITIALIZING"), ServerState::Initializing);
        assert_eq!(parse_server_status("Server 5 not found"), ServerState::Gone);
        assert!(parse_terminate_client(1, 2, "0").is_ok());
        // Observed from driver 535 for a server that does not exist.
        let gone = parse_terminate_client(1, 2, "Server 1 not found\nServer 1 not found!\n1");
        assert!(matches!(gone, Err(MpsError::ServerNotFound { pid: 1 })), "{gone:?}");
        assert!(matches!(parse_terminate_client(1, 2, "1"), Err(MpsError::TerminateFailed { .. })));
    }

    #[test]
    fn probe_outcome_names_the_problem() {
        let o = ProbeOutcome {
            servers: vec![
                ServerInfo { pid: 10, state: ServerState::Active },
                ServerInfo { pid: 11, state: ServerState::Fault },
            ],
        };
        assert_eq!(o.problem().as_deref(), Some("mps server 11 in FAULT"));
        assert!(ProbeOutcome::default().healthy());
    }
}
