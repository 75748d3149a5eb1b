//! The real [`MpsControl`]: runs `nvidia-cuda-mps-control -f` as a child of the agent in its own
//! process group (so its exit is seen at once) and talks to it by running the same binary in
//! client mode, every command under a hard timeout ([`mpsfleet_proc::child::run`]). A daemon
//! that an earlier agent left running is adopted through its [`DaemonRecord`] and then driven
//! by the same [`RealDaemon`] code as one started here.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

// Hard timeouts on real child processes follow the real monotonic clock (a paused test clock
// or the simulator's clock must never stretch them); everything that is health logic reads
// time through the Clock.
use mpsfleet_proc::child::{self, monotonic_now, ChildError, Limits};

use super::log::ControlLogWatcher;
use super::{DaemonConfig, ExitInfo, LogEvent, MpsControl, MpsDaemon, MpsError};

const PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
const LOG_ENV: &str = "CUDA_MPS_LOG_DIRECTORY";
const DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";
const NOT_RUNNING: &str = "Cannot find MPS control daemon process";
/// Files the daemon leaves in its pipe directory (observed: they survive a kill, and the sockets
/// even survive `quit`).
const PIPE_FILES: [&str; 4] = ["control", "control_privileged", "control_lock", "log"];
/// control.log is moved aside to control.log.1 at start once it is this big.
const LOG_ROTATE_BYTES: u64 = 16 << 20;
/// How often blocking waits look at a child.
const POLL: Duration = Duration::from_millis(10);
/// How long `stop` of an adopted daemon waits for it to vanish after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// At most this much of a control command's stdout and of its stderr is kept (every command
/// prints far less; the rest is read and dropped, so a chatty one cannot stall).
const MAX_CONTROL_OUTPUT: usize = 1 << 20;
/// How long a control client's output pipes may stay open once it has ended.
const CONTROL_DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Drives the real `nvidia-cuda-mps-control`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealMps;

impl MpsControl for RealMps {
    fn start(&self, cfg: &DaemonConfig) -> Result<Box<dyn MpsDaemon>, MpsError> {
        Ok(Box::new(RealDaemon::start(cfg)?))
    }

    fn adopt(&self, cfg: &DaemonConfig) -> Result<Option<Box<dyn MpsDaemon>>, MpsError> {
        Ok(RealDaemon::adopt(cfg)?.map(|d| Box::new(d) as Box<dyn MpsDaemon>))
    }

    fn quit_existing(&self, cfg: &DaemonConfig) -> Result<bool, MpsError> {
        cfg.validate()?;
        match run_control(cfg, "quit") {
            Err(MpsError::NotRunning { .. }) => return Ok(false),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let started = monotonic_now();
        let limit = cfg.quit_timeout + cfg.probe_timeout;
        loop {
            match run_control(cfg, "get_server_list") {
                Err(MpsError::NotRunning { .. }) => return Ok(true),
                Err(e @ MpsError::Timeout { .. }) => return Err(e),
                _ if started.elapsed() >= limit => {
                    return Err(MpsError::AlreadyRunning { pipe_dir: cfg.pipe_dir.clone() })
                }
                _ => std::thread::sleep(POLL * 5),
            }
        }
    }
}

/// Runs one control command in client mode: the command on stdin, the answer on stdout, all
/// within `cfg.probe_timeout`; on timeout the client is killed (with its process group) and
/// reaped. Both output pipes are read while the client runs, so an answer of any size arrives.
pub fn run_control(cfg: &DaemonConfig, command: &str) -> Result<String, MpsError> {
    run_control_within(cfg, command, cfg.probe_timeout)
}

/// [`run_control`] with `timeout` instead of `cfg.probe_timeout`.
pub fn run_control_within(cfg: &DaemonConfig, command: &str, timeout: Duration) -> Result<String, MpsError> {
    let mut client = Command::new(&cfg.control_bin);
    client.env(PIPE_ENV, &cfg.pipe_dir).env(LOG_ENV, &cfg.log_dir);
    let limits = Limits { timeout, max_output: MAX_CONTROL_OUTPUT, drain_grace: CONTROL_DRAIN_GRACE };
    let outcome =
        child::run(client, Some(format!("{command}\n").into_bytes()), limits).map_err(|e| match e {
            ChildError::Spawn { source } => MpsError::Spawn { bin: cfg.control_bin.clone(), source },
            ChildError::Thread { source } | ChildError::Wait { source, .. } => {
                MpsError::Io { path: cfg.control_bin.clone(), source }
            }
        })?;
    let Some(status) = outcome.status else {
        return Err(MpsError::Timeout { command: command.to_string(), timeout });
    };
    if outcome.stdout.dropped > 0 {
        tracing::warn!(command, dropped = outcome.stdout.dropped, "mps control output cut short");
    }
    classify(cfg, command, status, outcome.stdout.text().trim(), outcome.stderr.text().trim())
}

fn classify(
    cfg: &DaemonConfig,
    command: &str,
    status: ExitStatus,
    stdout: &str,
    stderr: &str,
) -> Result<String, MpsError> {
    let output = match (stdout.is_empty(), stderr.is_empty()) {
        (_, true) => stdout.to_string(),
        (true, false) => stderr.to_string(),
        (false, false) => format!("{stdout}\n{stderr}"),
    };
    if output.contains(NOT_RUNNING) {
        return Err(MpsError::NotRunning { pipe_dir: cfg.pipe_dir.clone() });
    }
    if !status.success() {
        return Err(MpsError::CommandFailed {
            command: command.to_string(),
            status: describe_status(status),
            output,
        });
    }
    // Observed: an unknown command exits 0 and says so on stdout.
    if output.lines().any(|l| l.trim_start().starts_with("Unknown command")) {
        return Err(MpsError::UnknownCommand { command: command.to_string() });
    }
    Ok(output)
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "unknown status".to_string(),
    }
}

fn exit_info(status: ExitStatus) -> ExitInfo {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitInfo::Status(code),
        (None, Some(sig)) => ExitInfo::Signal(sig),
        (None, None) => ExitInfo::Status(-1),
    }
}

/// The pipe directory's mode: every uid may pass through it to the daemon's sockets (which the
/// daemon makes 0666), none but the agent's may list or change it.
pub const PIPE_DIR_MODE: u32 = 0o711;
/// The log directory's mode: control.log and the daemon's record are the agent's alone.
pub const LOG_DIR_MODE: u32 = 0o700;

/// Creates the pipe directory (and its parents) with [`PIPE_DIR_MODE`], so that MPS clients
/// and servers of every uid can reach the daemon, and warns about ancestors they cannot
/// traverse (servers crash-loop on those).
fn prepare_pipe_dir(dir: &Path) -> Result<(), MpsError> {
    let io = |source| MpsError::Io { path: dir.to_path_buf(), source };
    DirBuilder::new().recursive(true).mode(PIPE_DIR_MODE).create(dir).map_err(io)?;
    let meta = fs::metadata(dir).map_err(io)?;
    if meta.permissions().mode() & 0o7777 != PIPE_DIR_MODE {
        if let Err(e) = fs::set_permissions(dir, fs::Permissions::from_mode(PIPE_DIR_MODE)) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make the mps directory traversable");
        }
    }
    for ancestor in dir.ancestors().skip(1) {
        if let Ok(meta) = fs::metadata(ancestor) {
            if meta.permissions().mode() & 0o001 == 0 {
                tracing::warn!(
                    dir = %ancestor.display(),
                    "others cannot traverse this directory: an mps server running as another user will crash-loop"
                );
            }
        }
    }
    Ok(())
}

/// Creates the log directory (and its parents) with [`LOG_DIR_MODE`], whatever its mode was.
fn prepare_log_dir(dir: &Path) -> Result<(), MpsError> {
    let io = |source| MpsError::Io { path: dir.to_path_buf(), source };
    DirBuilder::new().recursive(true).mode(LOG_DIR_MODE).create(dir).map_err(io)?;
    if fs::metadata(dir).map_err(io)?.permissions().mode() & 0o7777 != LOG_DIR_MODE {
        fs::set_permissions(dir, fs::Permissions::from_mode(LOG_DIR_MODE)).map_err(io)?;
    }
    Ok(())
}

/// The daemon starts `nvidia-cuda-mps-server` through PATH. When the control binary comes from
/// an unpacked package (`.../usr/bin`) whose `../sbin` holds the server, that folder goes first
/// on the daemon's PATH.
fn server_path(control_bin: &Path) -> Option<std::ffi::OsString> {
    let sbin = control_bin.parent()?.parent()?.join("sbin");
    if !sbin.join("nvidia-cuda-mps-server").is_file() {
        return None;
    }
    let mut dirs = vec![sbin];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).ok()
}

/// Removes what a dead daemon left in its pipe directory.
fn remove_stale_files(pipe_dir: &Path) -> Result<(), MpsError> {
    for name in PIPE_FILES {
        let path = pipe_dir.join(name);
        match fs::remove_file(&path) {
            Ok(()) => tracing::debug!(path = %path.display(), "removed stale mps pipe file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(MpsError::Io { path, source }),
        }
    }
    Ok(())
}

/// Opens control.log for appending, moving a big one aside first.
fn open_log(path: &Path) -> Result<File, MpsError> {
    if fs::metadata(path).map(|m| m.len() > LOG_ROTATE_BYTES).unwrap_or(false) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        let _ = fs::rename(path, PathBuf::from(old));
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| MpsError::Io { path: path.to_path_buf(), source })
}

/// What the daemon wrote to its log since `offset`, the last few lines.
fn log_tail(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = f.take(64 << 10).read_to_string(&mut text);
        }
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(5)..].join("; ");
    if tail.is_empty() {
        "no output".to_string()
    } else {
        tail
    }
}

/// Non-blocking and non-reaping: whether `pid` (our child) has ended. Leaving the zombie in place
/// keeps its process-group id from being reused until `stop` kills the group and reaps it.
/// Blocks until the child `pid` has ended (or is no child of ours), without reaping it.
fn await_exit(pid: u32) {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}

fn peek_exit(pid: u32) -> Option<ExitInfo> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
        Ok(WaitStatus::Exited(_, code)) => Some(ExitInfo::Status(code)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(ExitInfo::Signal(sig as i32)),
        _ => None,
    }
}

/// The start time (field 22 of `/proc/PID/stat`) of a process, `None` when there is none.
pub fn process_start_time(pid: u32) -> Option<u64> {
    mpsfleet_proc::stat(pid).map(|s| s.start_time)
}

/// Identity of a daemon started by [`RealDaemon::start`], kept as `daemon.json` in its log
/// directory while it runs so that a later agent (after a restart or `kill -9` of this one) can
/// adopt it instead of disrupting its clients. Written atomically; removed when the daemon is
/// stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonRecord {
    /// The daemon's PID; it leads its own process group, so this is also its group id.
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat` at start: a PID reused by another process has another.
    pub start_time: u64,
    pub pipe_dir: PathBuf,
    pub control_bin: PathBuf,
}

impl DaemonRecord {
    /// The record's file name in the log directory.
    pub const FILE: &'static str = "daemon.json";

    /// Where the record of a daemon with this log directory lives.
    pub fn path(log_dir: &Path) -> PathBuf {
        log_dir.join(Self::FILE)
    }

    /// The record of the running process `pid` as a daemon for `cfg`; `None` when it is gone.
    pub fn of_process(pid: u32, cfg: &DaemonConfig) -> Option<DaemonRecord> {
        Some(DaemonRecord {
            pid,
            start_time: process_start_time(pid)?,
            pipe_dir: cfg.pipe_dir.clone(),
            control_bin: cfg.control_bin.clone(),
        })
    }

    /// Writes the record into `log_dir` atomically (a temporary file renamed over it).
    pub fn write(&self, log_dir: &Path) -> Result<(), MpsError> {
        let path = Self::path(log_dir);
        let tmp = log_dir.join(format!("{}.tmp", Self::FILE));
        let io = |source| MpsError::Io { path: path.clone(), source };
        // Fails only for a path that is not UTF-8.
        let json = serde_json::to_vec_pretty(self)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        let mut file =
            OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io)?;
        file.write_all(&json).and_then(|()| file.sync_all()).map_err(io)?;
        fs::rename(&tmp, &path).map_err(io)
    }

    /// The record in `log_dir`; `Ok(None)` when there is none. One that does not parse is an
    /// `Io` error of kind `InvalidData`.
    pub fn read(log_dir: &Path) -> Result<Option<DaemonRecord>, MpsError> {
        let path = Self::path(log_dir);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(MpsError::Io { path, source }),
        };
        serde_json::from_slice(&text).map(Some).map_err(|e| MpsError::Io {
            path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }

    /// Removes the record in `log_dir`, if there is one.
    pub fn remove(log_dir: &Path) -> Result<(), MpsError> {
        let path = Self::path(log_dir);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(MpsError::Io { path, source }),
        }
    }

    /// Removes the record in `log_dir` if it is still the one of `pid` (never another daemon's).
    fn remove_if_of(log_dir: &Path, pid: u32, start_time: Option<u64>) {
        let ours = match Self::read(log_dir) {
            Ok(Some(r)) => r.pid == pid && start_time.is_none_or(|t| t == r.start_time),
            Ok(None) => false,
            // Unreadable: nobody can adopt from it anyway.
            Err(_) => true,
        };
        if ours {
            if let Err(e) = Self::remove(log_dir) {
                tracing::warn!(error = %e, "removing the mps daemon record");
            }
        }
    }

    /// Whether the recorded process still runs (a zombie or a reused PID does not count).
    pub fn alive(&self) -> bool {
        mpsfleet_proc::stat(self.pid).is_some_and(|s| s.start_time == self.start_time && !s.is_dead())
    }
}

/// A daemon's control-command timeout, changeable while it runs (the pool's policy changed).
#[derive(Debug)]
struct CommandTimeout(AtomicU64);

impl CommandTimeout {
    fn new(timeout: Duration) -> Self {
        Self(AtomicU64::new(timeout.as_millis() as u64))
    }

    fn get(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, timeout: Duration) {
        self.0.store(timeout.as_millis() as u64, Ordering::Relaxed);
    }
}

/// How this agent holds a daemon's process.
#[derive(Debug)]
enum Leader {
    /// Started here: a child of this process, left unreaped until it is stopped, so that its
    /// end is seen at once (`waitid(WNOWAIT)`) and its pid and group id stay its own.
    Child(Child),
    /// Started by an earlier agent and adopted (see [`DaemonRecord`]): not a child of this
    /// process, so its end is seen in `/proc/PID` (same start time, not a zombie) and reported
    /// as [`ExitInfo::Vanished`]. Its output still goes to `control.log`: it inherited the file.
    Adopted,
}

struct Inner {
    /// `None` once stopped (and reaped, if a child), or once detached.
    leader: Option<Leader>,
    exit: Option<ExitInfo>,
}

/// A control daemon driven by [`RealMps`]: one it started ([`RealDaemon::start`]) or one an
/// earlier agent left running and it adopted ([`RealDaemon::adopt`]). Both are probed,
/// configured, watched and stopped by the same code; only how the end of the process is seen,
/// how its group is signalled and how it is reaped depend on the [`Leader`].
pub struct RealDaemon {
    cfg: DaemonConfig,
    /// Starts as `cfg.probe_timeout`.
    timeout: CommandTimeout,
    /// It leads its own process group, so this is also its group id.
    pid: u32,
    /// Start time of the process (field 22 of `/proc/PID/stat`): for telling it from a process
    /// that reuses its pid, and for removing only its own record.
    start_time: Option<u64>,
    inner: Mutex<Inner>,
    log: Mutex<ControlLogWatcher>,
}

impl std::fmt::Debug for RealDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let adopted = matches!(lock(&self.inner).leader, Some(Leader::Adopted));
        f.debug_struct("RealDaemon")
            .field("pid", &self.pid)
            .field("pipe_dir", &self.cfg.pipe_dir)
            .field("adopted", &adopted)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RealDaemon {
    /// Starts `nvidia-cuda-mps-control -f`, waits until it answers, applies the defaults.
    pub fn start(cfg: &DaemonConfig) -> Result<Self, MpsError> {
        cfg.validate()?;
        prepare_pipe_dir(&cfg.pipe_dir)?;
        prepare_log_dir(&cfg.log_dir)?;
        // Only a pipe directory nobody answers on may be cleaned: removing a live daemon's lock
        // file would let a second daemon start beside it.
        match run_control(cfg, "get_server_list") {
            Err(MpsError::NotRunning { .. }) => {}
            Ok(_) | Err(MpsError::Timeout { .. }) => {
                return Err(MpsError::AlreadyRunning { pipe_dir: cfg.pipe_dir.clone() })
            }
            Err(e) => return Err(e),
        }
        remove_stale_files(&cfg.pipe_dir)?;

        let log_path = cfg.log_dir.join("control.log");
        let log_file = open_log(&log_path)?;
        let log_err =
            log_file.try_clone().map_err(|source| MpsError::Io { path: log_path.clone(), source })?;
        let log_start = log_file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut command = Command::new(&cfg.control_bin);
        // Only `-f`: the control binary of driver 535 knows no `-multiuser-server` (given it,
        // with or without `-f`, it acts as a client, finds no daemon and exits 1), so servers
        // stay one uid at a time.
        command
            .arg("-f")
            .env(PIPE_ENV, &cfg.pipe_dir)
            .env(LOG_ENV, &cfg.log_dir)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .process_group(0);
        if let Some(path) = server_path(&cfg.control_bin) {
            command.env("PATH", path);
        }
        match &cfg.visible_devices {
            Some(devices) => command.env(DEVICES_ENV, devices),
            None => command.env_remove(DEVICES_ENV),
        };
        let child =
            command.spawn().map_err(|source| MpsError::Spawn { bin: cfg.control_bin.clone(), source })?;
        let pid = child.id();
        // The child is not reaped before `stop`, so its /proc entry is there even if it died.
        let record = DaemonRecord::of_process(pid, cfg);
        let daemon = RealDaemon {
            cfg: cfg.clone(),
            timeout: CommandTimeout::new(cfg.probe_timeout),
            pid,
            start_time: record.as_ref().map(|r| r.start_time),
            inner: Mutex::new(Inner { leader: Some(Leader::Child(child)), exit: None }),
            log: Mutex::new(ControlLogWatcher::from_end(&log_path)),
        };
        tracing::debug!(pid = daemon.pid, pipe_dir = %cfg.pipe_dir.display(), "started mps control daemon");
        // Recorded before anything can fail or block, so that an agent killed from here on
        // leaves a daemon that the next one can adopt.
        let recorded = match record {
            Some(record) => record.write(&cfg.log_dir),
            None => Err(MpsError::Io {
                path: PathBuf::from(format!("/proc/{pid}/stat")),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no start time"),
            }),
        };
        if let Err(e) = recorded {
            daemon.kill_now();
            return Err(e);
        }

        if let Err(e) = daemon.wait_answering(&log_path, log_start) {
            daemon.kill_now();
            return Err(e);
        }
        if let Err(e) = daemon.apply_defaults() {
            daemon.kill_now();
            return Err(MpsError::Configure { pid: daemon.pid, source: Box::new(e) });
        }
        Ok(daemon)
    }

    fn wait_answering(&self, log_path: &Path, log_start: u64) -> Result<(), MpsError> {
        let started = monotonic_now();
        loop {
            if let Some(exit) = self.try_exit() {
                let output = log_tail(log_path, log_start);
                if output.contains("already running") {
                    return Err(MpsError::AlreadyRunning { pipe_dir: self.cfg.pipe_dir.clone() });
                }
                return Err(MpsError::ExitedAtStart { pipe_dir: self.cfg.pipe_dir.clone(), exit, output });
            }
            let last = match run_control(&self.cfg, "get_server_list") {
                Ok(_) => return Ok(()),
                Err(e @ MpsError::Spawn { .. }) => return Err(e),
                Err(e) => e.to_string(),
            };
            let waited = started.elapsed();
            if waited >= self.cfg.start_timeout {
                return Err(MpsError::StartTimeout { pid: self.pid, waited, last });
            }
            std::thread::sleep(POLL * 2);
        }
    }

    fn apply_defaults(&self) -> Result<(), MpsError> {
        if let Some(pct) = self.cfg.default_active_thread_percentage {
            let command = format!("set_default_active_thread_percentage {pct}");
            let output = self.control(&command)?;
            // Observed: an out-of-range value is not an error, the old value is printed.
            match output.trim().parse::<f64>() {
                Ok(v) if (v - f64::from(pct)).abs() < 0.05 => {}
                _ => return Err(MpsError::Protocol { command, output }),
            }
        }
        if let Some(mib) = self.cfg.default_pinned_mem_limit_mib {
            let command = format!("set_default_device_pinned_mem_limit 0 {mib}M");
            let output = self.control(&command)?;
            // Prints nothing on success. (The getter rounds down to whole GiB, so it cannot verify.)
            if !output.trim().is_empty() {
                return Err(MpsError::Protocol { command, output });
            }
        }
        Ok(())
    }

    /// Adopts the daemon recorded in `cfg.log_dir` if it still runs; `Ok(None)` when there is
    /// no record, or a stale one (process gone, PID reused, unreadable record), which is
    /// removed. A recorded daemon on another pipe directory is left alone (`Ok(None)`, with a
    /// warning). Whether it answers is only logged: a hung one is adopted too, for the
    /// supervisor's probes to restart.
    pub fn adopt(cfg: &DaemonConfig) -> Result<Option<RealDaemon>, MpsError> {
        cfg.validate()?;
        let record = match DaemonRecord::read(&cfg.log_dir) {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(None),
            Err(MpsError::Io { path, source }) if source.kind() == std::io::ErrorKind::InvalidData => {
                tracing::warn!(path = %path.display(), error = %source, "removing an unreadable mps daemon record");
                DaemonRecord::remove(&cfg.log_dir)?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if record.pipe_dir != cfg.pipe_dir {
            tracing::warn!(
                pid = record.pid,
                recorded = %record.pipe_dir.display(),
                configured = %cfg.pipe_dir.display(),
                "the recorded mps daemon serves another pipe directory; not adopting it"
            );
            return Ok(None);
        }
        if !record.alive() {
            tracing::info!(pid = record.pid, "the recorded mps daemon is gone; removing its record");
            DaemonRecord::remove(&cfg.log_dir)?;
            return Ok(None);
        }
        if record.control_bin != cfg.control_bin {
            tracing::warn!(
                pid = record.pid,
                recorded = %record.control_bin.display(),
                configured = %cfg.control_bin.display(),
                "adopting an mps daemon started from another binary"
            );
        }
        let daemon = RealDaemon {
            cfg: cfg.clone(),
            timeout: CommandTimeout::new(cfg.probe_timeout),
            pid: record.pid,
            start_time: Some(record.start_time),
            inner: Mutex::new(Inner { leader: Some(Leader::Adopted), exit: None }),
            log: Mutex::new(ControlLogWatcher::from_end(cfg.log_dir.join("control.log"))),
        };
        match run_control(cfg, "get_server_list") {
            Ok(_) => tracing::info!(pid = daemon.pid, "adopted running mps control daemon"),
            Err(e) => tracing::warn!(
                pid = daemon.pid,
                error = %e,
                "adopted running mps control daemon, but it does not answer"
            ),
        }
        Ok(Some(daemon))
    }

    pub fn config(&self) -> &DaemonConfig {
        &self.cfg
    }

    /// Whether this handle adopted the daemon (rather than starting it).
    pub fn is_adopted(&self) -> bool {
        matches!(lock(&self.inner).leader, Some(Leader::Adopted))
    }

    /// Non-blocking and, for a child, non-reaping: how the process ended, once it has.
    fn exited(&self, leader: &Leader) -> Option<ExitInfo> {
        match leader {
            Leader::Child(_) => peek_exit(self.pid),
            Leader::Adopted => (!self.same_process_runs()).then_some(ExitInfo::Vanished),
        }
    }

    /// Whether the pid still names the daemon's process and it has not exited.
    fn same_process_runs(&self) -> bool {
        mpsfleet_proc::stat(self.pid)
            .is_some_and(|s| self.start_time.is_none_or(|t| t == s.start_time) && !s.is_dead())
    }

    /// SIGKILL to the daemon's process group (its servers too). A child's unreaped leader keeps
    /// the group id its own. An adopted one is signalled only after checking that its pid still
    /// belongs to it; the group id stays taken while any member lives, so with the leader gone
    /// entirely the leftover members are still reached.
    fn kill_group(&self, leader: &Leader) {
        let pid = self.pid;
        let group = Pid::from_raw(pid as i32);
        match leader {
            Leader::Child(_) => {
                let _ = killpg(group, Signal::SIGKILL);
            }
            Leader::Adopted => match mpsfleet_proc::stat(pid) {
                Some(s) if self.start_time.is_some_and(|t| t != s.start_time) => {
                    tracing::warn!(pid, "the adopted mps daemon's pid was reused; not signalling it");
                }
                Some(s) if s.pgid != pid => {
                    // Not a group leader (not started by us?): only the process itself.
                    let _ = nix::sys::signal::kill(group, Signal::SIGKILL);
                }
                _ => {
                    let _ = killpg(group, Signal::SIGKILL);
                }
            },
        }
    }

    /// After [`Self::kill_group`]: reaps a child; waits (bounded) for an adopted one to vanish.
    fn reap(&self, leader: Leader) -> Result<ExitInfo, MpsError> {
        match leader {
            Leader::Child(mut child) => child
                .wait()
                .map(exit_info)
                .map_err(|source| MpsError::Io { path: self.cfg.control_bin.clone(), source }),
            Leader::Adopted => {
                if !self.wait_until_exited(&Leader::Adopted, KILL_WAIT) {
                    tracing::warn!(pid = self.pid, "adopted mps daemon still runs after SIGKILL");
                }
                Ok(ExitInfo::Vanished)
            }
        }
    }

    /// Whether the process ended within `limit`.
    fn wait_until_exited(&self, leader: &Leader, limit: Duration) -> bool {
        let started = monotonic_now();
        loop {
            if self.exited(leader).is_some() {
                return true;
            }
            if started.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Kills the process group and reaps, without asking the daemon to quit.
    fn kill_now(&self) {
        if let Err(e) = self.end(false) {
            tracing::warn!(pid = self.pid, error = %e, "killing the mps control daemon");
        }
    }

    /// Stops the daemon: with `ask`, `quit -t` first and a bounded wait; then its process group
    /// is killed and the leader reaped (a child) or seen gone (an adopted one), and its record
    /// removed.
    fn end(&self, ask: bool) -> Result<(), MpsError> {
        let mut inner = lock(&self.inner);
        let Some(leader) = inner.leader.take() else { return Ok(()) };
        if ask && self.exited(&leader).is_none() {
            let secs = self.cfg.quit_timeout.as_secs().max(1);
            match run_control_within(&self.cfg, &format!("quit -t {secs}"), self.timeout.get()) {
                Ok(_) => {
                    self.wait_until_exited(&leader, self.cfg.quit_timeout + Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::warn!(pid = self.pid, error = %e, "mps daemon did not take quit; killing it")
                }
            }
        }
        // Whatever is left of the group (servers, a daemon that ignored quit) goes now.
        self.kill_group(&leader);
        let reaped = self.reap(leader);
        DaemonRecord::remove_if_of(&self.cfg.log_dir, self.pid, self.start_time);
        let exit = reaped?;
        inner.exit.get_or_insert(exit);
        tracing::debug!(pid = self.pid, exit = ?inner.exit, "stopped mps control daemon");
        Ok(())
    }
}

impl MpsDaemon for RealDaemon {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn pipe_dir(&self) -> &Path {
        &self.cfg.pipe_dir
    }

    fn control(&self, command: &str) -> Result<String, MpsError> {
        run_control_within(&self.cfg, command, self.timeout.get())
    }

    fn set_probe_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    fn try_exit(&self) -> Option<ExitInfo> {
        let mut inner = lock(&self.inner);
        if inner.exit.is_none() {
            if let Some(leader) = &inner.leader {
                inner.exit = self.exited(leader);
            }
        }
        inner.exit
    }

    fn notify_exit(&self, notify: Box<dyn FnOnce() + Send>) -> bool {
        if !matches!(lock(&self.inner).leader, Some(Leader::Child(_))) {
            return false;
        }
        let pid = self.pid;
        let spawned = std::thread::Builder::new().name(format!("mps-exit-{pid}")).spawn(move || {
            await_exit(pid);
            notify();
        });
        spawned.is_ok()
    }

    fn stop(&self) -> Result<(), MpsError> {
        self.end(true)
    }

    fn kill(&self) -> Result<(), MpsError> {
        self.end(false)
    }

    fn poll_log(&self) -> Vec<LogEvent> {
        lock(&self.log).poll()
    }

    fn inject(&self, fault: super::Injected) -> Result<(), MpsError> {
        use nix::sys::signal::{kill, Signal};
        let signal = match fault {
            super::Injected::Exit => Signal::SIGKILL,
            super::Injected::Hang => Signal::SIGSTOP,
            super::Injected::Resume => Signal::SIGCONT,
        };
        // Only a daemon this handle still leads: never a pid that may have been reused.
        if lock(&self.inner).exit.is_some() {
            return Ok(());
        }
        kill(nix::unistd::Pid::from_raw(self.pid as i32), signal)
            .map_err(|e| MpsError::Io { path: self.cfg.pipe_dir.clone(), source: e.into() })
    }

    fn server_running(&self, pid: u32) -> bool {
        process_running(pid)
    }

    fn detach(&self) {
        let mut inner = lock(&self.inner);
        if inner.leader.take().is_some() {
            // Dropping a `Child` neither kills nor reaps; the record stays for the next agent.
            tracing::info!(pid = self.pid, pipe_dir = %self.cfg.pipe_dir.display(), "detached mps control daemon");
        }
    }
}

/// Whether a process runs; a zombie has a /proc entry too, but does not count.
fn process_running(pid: u32) -> bool {
    mpsfleet_proc::stat(pid).is_some_and(|s| !s.is_dead())
}

impl Drop for RealDaemon {
    /// Never leaves a daemon behind: a handle dropped without `stop` (or `detach`) kills its
    /// process group.
    fn drop(&mut self) {
        self.kill_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DaemonRecord::read(dir.path()).unwrap(), None);
        let cfg = DaemonConfig::new("/usr/bin/nvidia-cuda-mps-control", "/run/mps/0", dir.path());
        let me = std::process::id();
        let record = DaemonRecord::of_process(me, &cfg).expect("this process has a start time");
        assert_eq!(record.pid, me);
        assert!(record.start_time > 0);
        assert!(record.alive());
        record.write(dir.path()).unwrap();
        assert_eq!(DaemonRecord::read(dir.path()).unwrap().as_ref(), Some(&record));
        assert!(!dir.path().join("daemon.json.tmp").exists(), "renamed into place");
        let text = fs::read_to_string(dir.path().join("daemon.json")).unwrap();
        assert!(text.contains("\"start_time\"") && text.contains("/run/mps/0"), "{text}");
        // Removal keeps another daemon's record.
        DaemonRecord::remove_if_of(dir.path(), me + 1, None);
        assert!(DaemonRecord::read(dir.path()).unwrap().is_some());
        DaemonRecord::remove_if_of(dir.path(), me, Some(record.start_time + 1));
        assert!(DaemonRecord::read(dir.path()).unwrap().is_some());
        DaemonRecord::remove_if_of(dir.path(), me, Some(record.start_time));
        assert_eq!(DaemonRecord::read(dir.path()).unwrap(), None);
        DaemonRecord::remove(dir.path()).unwrap();

        // A reused PID has another start time; a garbled record is InvalidData.
        let reused = DaemonRecord { start_time: record.start_time + 1, ..record };
        assert!(!reused.alive());
        fs::write(dir.path().join("daemon.json"), "{\"pid\": 1").unwrap();
        match DaemonRecord::read(dir.path()) {
            Err(MpsError::Io { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::InvalidData),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn adopt_cleans_stale_and_garbled_records() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DaemonConfig::new("/nonexistent/nvidia-cuda-mps-control", "/run/mps/0", dir.path());
        assert!(RealDaemon::adopt(&cfg).unwrap().is_none(), "no record");
        fs::write(dir.path().join("daemon.json"), "garbage").unwrap();
        assert!(RealDaemon::adopt(&cfg).unwrap().is_none());
        assert!(!dir.path().join("daemon.json").exists(), "garbled record removed");
        let me = DaemonRecord::of_process(std::process::id(), &cfg).unwrap();
        let stale = DaemonRecord { start_time: me.start_time + 1, ..me.clone() };
        stale.write(dir.path()).unwrap();
        assert!(RealDaemon::adopt(&cfg).unwrap().is_none());
        assert!(!dir.path().join("daemon.json").exists(), "stale record removed");
        // A record for another pipe directory is left alone.
        let other = DaemonRecord { pipe_dir: "/run/mps/1".into(), ..me };
        other.write(dir.path()).unwrap();
        assert!(RealDaemon::adopt(&cfg).unwrap().is_none());
        assert!(dir.path().join("daemon.json").exists());
    }

    /// A stand-in for `nvidia-cuda-mps-control` that speaks just enough of its protocol: `-f`
    /// runs a "daemon" (a sleep that records its pid in the pipe directory); in client mode
    /// `get_server_list` answers nothing, `big` answers 200 KiB, `quit ...` ends the daemon.
    const FAKE_CONTROL: &str = r#"#!/bin/sh
pidfile="$CUDA_MPS_PIPE_DIRECTORY/fake.pid"
if [ "$1" = "-f" ]; then echo $$ > "$pidfile"; exec sleep 1000; fi
read -r cmd
if [ ! -e "$pidfile" ] || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "Cannot find MPS control daemon process"; exit 1
fi
case "$cmd" in
  get_server_list) ;;
  big) head -c 204800 /dev/zero | tr '\0' 'x'; echo ;;
  quit*) kill "$(cat "$pidfile")"; rm -f "$pidfile" ;;
  *) echo "Unknown command $cmd" ;;
esac
"#;

    fn fake_cfg(dir: &Path) -> DaemonConfig {
        let bin = dir.join("fake-mps-control");
        fs::write(&bin, FAKE_CONTROL).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        // Another test thread may have forked while the file was open for writing ("text file
        // busy" until that child execs); wait until it can be run.
        let runs = (0..200).any(|_| {
            match Command::new(&bin).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status()
            {
                Ok(_) => true,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    false
                }
            }
        });
        assert!(runs, "cannot run {}", bin.display());
        let mut cfg = DaemonConfig::new(bin, dir.join("pipe"), dir.join("log"));
        cfg.start_timeout = Duration::from_secs(10);
        cfg.quit_timeout = Duration::from_secs(1);
        cfg
    }

    fn ends_soon(pid: u32) -> bool {
        (0..300).any(|_| {
            let gone = !process_running(pid);
            if !gone {
                std::thread::sleep(Duration::from_millis(10));
            }
            gone
        })
    }

    #[test]
    fn a_control_answer_larger_than_a_pipe_buffer_does_not_stall() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = fake_cfg(dir.path());
        let daemon = RealDaemon::start(&cfg).expect("start the fake daemon");
        let started = monotonic_now();
        let answer = daemon.control("big").expect("a 200 KiB answer");
        assert_eq!(answer.len(), 200 * 1024, "trimmed answer");
        assert!(answer.bytes().all(|b| b == b'x'));
        assert!(started.elapsed() < cfg.probe_timeout, "took {:?}", started.elapsed());
        assert_eq!(run_control(&cfg, "big").unwrap().len(), 200 * 1024);
        assert!(matches!(daemon.control("nope"), Err(MpsError::UnknownCommand { .. })));
        daemon.stop().unwrap();
        assert!(matches!(run_control(&cfg, "get_server_list"), Err(MpsError::NotRunning { .. })));
    }

    #[test]
    fn an_adopted_daemon_is_probed_and_stopped_by_the_same_code_as_a_started_one() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = fake_cfg(dir.path());

        // Started here: its end is its exit status.
        let started = RealDaemon::start(&cfg).expect("start");
        assert!(!started.is_adopted());
        assert_eq!(started.probe().unwrap(), Default::default());
        let pid = started.pid();
        assert_eq!(DaemonRecord::read(&cfg.log_dir).unwrap().map(|r| r.pid), Some(pid));
        nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
        let seen = (0..300).find_map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            started.try_exit()
        });
        assert_eq!(seen, Some(ExitInfo::Signal(9)));
        started.kill().unwrap();
        assert_eq!(DaemonRecord::read(&cfg.log_dir).unwrap(), None, "record removed");

        // Started, detached, adopted: the same probe, and `stop` asks it to quit.
        let first = RealDaemon::start(&cfg).expect("start again");
        let pid = first.pid();
        first.detach();
        drop(first);
        assert!(process_running(pid), "a detached daemon outlives its handle");
        let adopted = RealDaemon::adopt(&cfg).unwrap().expect("a daemon to adopt");
        assert!(adopted.is_adopted());
        assert_eq!(adopted.pid(), pid);
        assert_eq!(adopted.probe().unwrap(), Default::default());
        assert_eq!(adopted.control("big").unwrap().len(), 200 * 1024);
        assert_eq!(adopted.try_exit(), None);
        adopted.stop().unwrap();
        assert!(ends_soon(pid), "the adopted daemon was stopped");
        assert!(!cfg.pipe_dir.join("fake.pid").exists(), "it was asked to quit");
        assert_eq!(adopted.try_exit(), Some(ExitInfo::Vanished));
        assert_eq!(DaemonRecord::read(&cfg.log_dir).unwrap(), None, "record removed");
        adopted.stop().unwrap();

        // An adopted daemon killed from outside is seen gone through /proc, and a handle
        // dropped without stop kills an adopted daemon like a started one.
        let first = RealDaemon::start(&cfg).expect("start a third");
        let pid = first.pid();
        first.detach();
        drop(first);
        let adopted = RealDaemon::adopt(&cfg).unwrap().expect("adopt");
        nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
        assert!(ends_soon(pid));
        assert_eq!(adopted.try_exit(), Some(ExitInfo::Vanished));
        drop(adopted);
        assert_eq!(DaemonRecord::read(&cfg.log_dir).unwrap(), None, "record removed");
        // The fake leaves its pid file behind when killed, and the killed (detached, so
        // never reaped) child stays a zombie that `kill -0` still finds.
        fs::remove_file(cfg.pipe_dir.join("fake.pid")).unwrap();
        let last = RealDaemon::start(&cfg).expect("start a fourth");
        let pid = last.pid();
        last.detach();
        drop(last);
        drop(RealDaemon::adopt(&cfg).unwrap().expect("adopt"));
        assert!(ends_soon(pid), "dropping the adopted handle killed the daemon");
    }
}
