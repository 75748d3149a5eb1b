//! The real [`MpsControl`]: runs `nvidia-cuda-mps-control -f` as a child of the agent in its own
//! process group (so its exit is seen at once) and talks to it by running the same binary in
//! client mode, every command under a hard timeout.

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

/// Hard timeouts on real child processes must follow the real monotonic clock (a paused test
/// clock or the simulator's clock must never stretch them), so this is the one place in the
/// MPS code that reads it; everything that is health logic reads time through the Clock.
#[allow(clippy::disallowed_methods)]
fn monotonic_now() -> std::time::Instant {
    std::time::Instant::now()
}

/// Drives the real `nvidia-cuda-mps-control`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealMps;

impl MpsControl for RealMps {
    fn start(&self, cfg: &DaemonConfig) -> Result<Box<dyn MpsDaemon>, MpsError> {
        Ok(Box::new(RealDaemon::start(cfg)?))
    }

    fn adopt(&self, cfg: &DaemonConfig) -> Result<Option<Box<dyn MpsDaemon>>, MpsError> {
        Ok(AdoptedDaemon::adopt(cfg)?.map(|d| Box::new(d) as Box<dyn MpsDaemon>))
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
/// within `cfg.probe_timeout`; on timeout the client is killed and reaped.
///
/// Output is read once the client has ended, so it must fit in a pipe buffer (64 KiB); every
/// control command prints far less.
pub fn run_control(cfg: &DaemonConfig, command: &str) -> Result<String, MpsError> {
    run_control_within(cfg, command, cfg.probe_timeout)
}

/// [`run_control`] with `timeout` instead of `cfg.probe_timeout`.
pub fn run_control_within(cfg: &DaemonConfig, command: &str, timeout: Duration) -> Result<String, MpsError> {
    let mut child = Command::new(&cfg.control_bin)
        .env(PIPE_ENV, &cfg.pipe_dir)
        .env(LOG_ENV, &cfg.log_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| MpsError::Spawn { bin: cfg.control_bin.clone(), source })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A client that already ended makes this fail with EPIPE; its status tells the story.
        let _ = stdin.write_all(format!("{command}\n").as_bytes());
    }
    let started = monotonic_now();
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(MpsError::Timeout { command: command.to_string(), timeout });
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(POLL);
            }
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(MpsError::Io { path: cfg.control_bin.clone(), source });
            }
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    classify(cfg, command, status, stdout.trim(), stderr.trim())
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

/// Creates `dir` (and its parents) with mode 0755 so that the MPS server's UID can traverse it,
/// and warns about ancestors it cannot traverse (servers crash-loop on those).
fn prepare_dir(dir: &Path) -> Result<(), MpsError> {
    let io = |source| MpsError::Io { path: dir.to_path_buf(), source };
    DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(io)?;
    let meta = fs::metadata(dir).map_err(io)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o055 != 0o055 {
        if let Err(e) = fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o755)) {
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
        .mode(0o644)
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
            OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp).map_err(io)?;
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

struct Inner {
    /// `None` once reaped, or once detached.
    child: Option<Child>,
    exit: Option<ExitInfo>,
    /// Start time of the child, for removing only its own record.
    start_time: Option<u64>,
}

/// A control daemon started by [`RealMps`].
pub struct RealDaemon {
    cfg: DaemonConfig,
    /// Starts as `cfg.probe_timeout`.
    timeout: CommandTimeout,
    pid: u32,
    inner: Mutex<Inner>,
    log: Mutex<ControlLogWatcher>,
}

impl std::fmt::Debug for RealDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealDaemon").field("pid", &self.pid).field("pipe_dir", &self.cfg.pipe_dir).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RealDaemon {
    /// Starts `nvidia-cuda-mps-control -f`, waits until it answers, applies the defaults.
    pub fn start(cfg: &DaemonConfig) -> Result<Self, MpsError> {
        cfg.validate()?;
        prepare_dir(&cfg.pipe_dir)?;
        prepare_dir(&cfg.log_dir)?;
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
            inner: Mutex::new(Inner {
                child: Some(child),
                exit: None,
                start_time: record.as_ref().map(|r| r.start_time),
            }),
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

    /// Kills the process group and reaps, without asking the daemon to quit.
    fn kill_now(&self) {
        let mut inner = lock(&self.inner);
        if let Some(mut child) = inner.child.take() {
            let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
            if let Ok(status) = child.wait() {
                inner.exit.get_or_insert(exit_info(status));
            }
            DaemonRecord::remove_if_of(&self.cfg.log_dir, self.pid, inner.start_time);
        }
    }

    pub fn config(&self) -> &DaemonConfig {
        &self.cfg
    }

    /// Stops the daemon: with `ask`, `quit -t` first and a bounded wait; then its process group
    /// is killed and the leader reaped.
    fn end(&self, ask: bool) -> Result<(), MpsError> {
        let mut inner = lock(&self.inner);
        let Some(mut child) = inner.child.take() else { return Ok(()) };
        let pgid = Pid::from_raw(self.pid as i32);
        if ask && peek_exit(self.pid).is_none() {
            let secs = self.cfg.quit_timeout.as_secs().max(1);
            match run_control_within(&self.cfg, &format!("quit -t {secs}"), self.timeout.get()) {
                Ok(_) => {
                    let started = monotonic_now();
                    let limit = self.cfg.quit_timeout + Duration::from_secs(1);
                    while peek_exit(self.pid).is_none() && started.elapsed() < limit {
                        std::thread::sleep(POLL);
                    }
                }
                Err(e) => {
                    tracing::warn!(pid = self.pid, error = %e, "mps daemon did not take quit; killing it")
                }
            }
        }
        // Whatever is left of the group (servers, a daemon that ignored quit) goes now; the
        // unreaped leader keeps the group id ours until then.
        let _ = killpg(pgid, Signal::SIGKILL);
        let status =
            child.wait().map_err(|source| MpsError::Io { path: self.cfg.control_bin.clone(), source })?;
        inner.exit.get_or_insert(exit_info(status));
        DaemonRecord::remove_if_of(&self.cfg.log_dir, self.pid, inner.start_time);
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
        if inner.exit.is_none() && inner.child.is_some() {
            inner.exit = peek_exit(self.pid);
        }
        inner.exit
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

    fn server_running(&self, pid: u32) -> bool {
        process_running(pid)
    }

    fn detach(&self) {
        let mut inner = lock(&self.inner);
        if inner.child.take().is_some() {
            // Dropping the `Child` neither kills nor reaps; the record stays for the next agent.
            tracing::info!(pid = self.pid, pipe_dir = %self.cfg.pipe_dir.display(), "detached mps control daemon");
        }
    }
}

/// Whether a process runs; a zombie has a /proc entry too, but does not count.
fn process_running(pid: u32) -> bool {
    mpsfleet_proc::stat(pid).is_some_and(|s| !s.is_dead())
}

impl Drop for RealDaemon {
    /// Never leaves a daemon behind: a handle dropped without `stop` kills its process group.
    fn drop(&mut self) {
        self.kill_now();
    }
}

struct AdoptedState {
    exit: Option<ExitInfo>,
    /// Stopped or detached: nothing more to do, not even on drop.
    done: bool,
}

/// A control daemon that an earlier agent started and left running (see [`DaemonRecord`]),
/// taken over by [`RealMps::adopt`]. It is not a child of this process: its end is seen by
/// looking at `/proc/PID` (same start time, not a zombie) on every `try_exit`, and reported as
/// [`ExitInfo::Vanished`]; stopping it kills its process group only after checking that the PID
/// still belongs to it. Its output still goes to `control.log`: it inherited the file.
pub struct AdoptedDaemon {
    cfg: DaemonConfig,
    /// Starts as `cfg.probe_timeout`.
    timeout: CommandTimeout,
    record: DaemonRecord,
    state: Mutex<AdoptedState>,
    log: Mutex<ControlLogWatcher>,
}

impl std::fmt::Debug for AdoptedDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdoptedDaemon").field("record", &self.record).finish()
    }
}

impl AdoptedDaemon {
    /// Adopts the daemon recorded in `cfg.log_dir` if it still runs; `Ok(None)` when there is
    /// no record, or a stale one (process gone, PID reused, unreadable record), which is
    /// removed. A recorded daemon on another pipe directory is left alone (`Ok(None)`, with a
    /// warning). Whether it answers is only logged: a hung one is adopted too, for the
    /// supervisor's probes to restart.
    pub fn adopt(cfg: &DaemonConfig) -> Result<Option<AdoptedDaemon>, MpsError> {
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
        let daemon = AdoptedDaemon {
            cfg: cfg.clone(),
            timeout: CommandTimeout::new(cfg.probe_timeout),
            log: Mutex::new(ControlLogWatcher::from_end(cfg.log_dir.join("control.log"))),
            record,
            state: Mutex::new(AdoptedState { exit: None, done: false }),
        };
        match run_control(cfg, "get_server_list") {
            Ok(_) => tracing::info!(pid = daemon.record.pid, "adopted running mps control daemon"),
            Err(e) => tracing::warn!(
                pid = daemon.record.pid,
                error = %e,
                "adopted running mps control daemon, but it does not answer"
            ),
        }
        Ok(Some(daemon))
    }

    /// The identity of the adopted daemon.
    pub fn record(&self) -> &DaemonRecord {
        &self.record
    }

    pub fn config(&self) -> &DaemonConfig {
        &self.cfg
    }

    /// SIGKILL to the daemon's process group (its servers too), unless its PID now belongs to
    /// another process. The group id stays taken while any member lives, so with the leader gone
    /// entirely the leftover members are still reached.
    fn kill_group(&self) {
        let pid = self.record.pid;
        match mpsfleet_proc::stat(pid) {
            Some(s) if s.start_time != self.record.start_time => {
                tracing::warn!(pid, "the adopted mps daemon's pid was reused; not signalling it");
            }
            Some(s) if s.pgid != pid => {
                // Not a group leader (not started by us?): only the process itself.
                let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            _ => {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }

    fn wait_gone(&self, limit: Duration) -> bool {
        let started = monotonic_now();
        while self.record.alive() {
            if started.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(POLL);
        }
        true
    }

    /// Like [`RealDaemon`]'s: `quit -t` first only with `ask`.
    fn end(&self, ask: bool) -> Result<(), MpsError> {
        let mut state = lock(&self.state);
        if state.done {
            return Ok(());
        }
        let pid = self.record.pid;
        if ask && self.record.alive() {
            let secs = self.cfg.quit_timeout.as_secs().max(1);
            match run_control_within(&self.cfg, &format!("quit -t {secs}"), self.timeout.get()) {
                Ok(_) => {
                    self.wait_gone(self.cfg.quit_timeout + Duration::from_secs(1));
                }
                Err(e) => tracing::warn!(pid, error = %e, "adopted mps daemon did not take quit; killing it"),
            }
        }
        self.kill_group();
        if !self.wait_gone(KILL_WAIT) {
            tracing::warn!(pid, "adopted mps daemon still runs after SIGKILL");
        }
        state.exit.get_or_insert(ExitInfo::Vanished);
        state.done = true;
        DaemonRecord::remove_if_of(&self.cfg.log_dir, pid, Some(self.record.start_time));
        tracing::debug!(pid, "stopped adopted mps control daemon");
        Ok(())
    }
}

impl MpsDaemon for AdoptedDaemon {
    fn pid(&self) -> u32 {
        self.record.pid
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
        let mut state = lock(&self.state);
        if state.exit.is_none() && !self.record.alive() {
            state.exit = Some(ExitInfo::Vanished);
        }
        state.exit
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

    fn server_running(&self, pid: u32) -> bool {
        process_running(pid)
    }

    fn detach(&self) {
        lock(&self.state).done = true;
    }
}

impl Drop for AdoptedDaemon {
    /// Like [`RealDaemon`]: a handle dropped without `stop` (or `detach`) kills the daemon.
    fn drop(&mut self) {
        let state = lock(&self.state);
        if !state.done {
            self.kill_group();
            DaemonRecord::remove_if_of(&self.cfg.log_dir, self.record.pid, Some(self.record.start_time));
        }
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
        assert!(AdoptedDaemon::adopt(&cfg).unwrap().is_none(), "no record");
        fs::write(dir.path().join("daemon.json"), "garbage").unwrap();
        assert!(AdoptedDaemon::adopt(&cfg).unwrap().is_none());
        assert!(!dir.path().join("daemon.json").exists(), "garbled record removed");
        let me = DaemonRecord::of_process(std::process::id(), &cfg).unwrap();
        let stale = DaemonRecord { start_time: me.start_time + 1, ..me.clone() };
        stale.write(dir.path()).unwrap();
        assert!(AdoptedDaemon::adopt(&cfg).unwrap().is_none());
        assert!(!dir.path().join("daemon.json").exists(), "stale record removed");
        // A record for another pipe directory is left alone.
        let other = DaemonRecord { pipe_dir: "/run/mps/1".into(), ..me };
        other.write(dir.path()).unwrap();
        assert!(AdoptedDaemon::adopt(&cfg).unwrap().is_none());
        assert!(dir.path().join("daemon.json").exists());
    }
}
