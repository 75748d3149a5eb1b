//! Launching, watching, stopping and re-adopting container processes through their shims.
//!
//! The runtime keeps no state that matters across an agent restart: everything it knows about
//! a container is in the container's state directory (see [`super::shim`]). A handle is a
//! cached copy of `proc.json`; [`Runtime::adopt`] rebuilds one from the directory alone.

use super::identity::{ExecContext, TaskUser, UserError};
use super::procfs::{self, Liveness};
use super::shim::{
    ExitRecord, ProcRecord, ShimArgs, EXIT_RECORD, LAUNCH_RECORD, PROC_RECORD, SHIM_LOG, STDERR_LOG,
    STDOUT_LOG,
};
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// ECS's default time between SIGTERM and SIGKILL.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `launch` waits for the shim to record the task's pid.
const LAUNCH_WAIT: Duration = Duration::from_secs(30);
/// How long to wait for a shim whose task has gone to write the exit record.
const EXIT_RECORD_WAIT: Duration = Duration::from_secs(5);
/// How long to wait for a process group to go after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// Everything needed to start one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLaunch {
    pub task_id: String,
    pub container: String,
    /// `entryPoint ++ command`, as given; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// The task's environment plus what the agent adds (MPS variables, ...). See
    /// [`super::identity`] for the few basics added underneath.
    pub env: Vec<(String, String)>,
    /// ECS `user`: honoured only when the agent runs as root, refused otherwise.
    pub user: Option<String>,
    /// The task's own uid and home (without `user`, when the agent runs as root): the process
    /// runs as it, with `HOME` and its working directory there.
    pub task_user: Option<TaskUser>,
    pub stop_timeout: Duration,
    /// A fresh directory for this container of this task run; created if missing.
    pub state_dir: PathBuf,
}

/// A container the runtime launched or adopted.
#[derive(Debug, Clone)]
pub struct ContainerHandle {
    state_dir: PathBuf,
    /// None when the command could not be executed (the exit record says why).
    proc: Option<ProcRecord>,
    /// Set once the shim (our child, when we launched it) has exited.
    shim_exited: Option<Arc<AtomicBool>>,
}

impl ContainerHandle {
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
    /// The task process's pid (also its process group id).
    pub fn pid(&self) -> Option<u32> {
        self.proc.map(|p| p.pid)
    }
}

/// What a container is doing now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    Running {
        pid: u32,
    },
    /// Exited, or never started (`exit.error` is set).
    Exited(ExitRecord),
    /// The process is gone and nobody recorded how it ended, or the pid is someone else's now.
    Lost {
        reason: String,
    },
}

impl ContainerState {
    pub fn is_running(&self) -> bool {
        matches!(self, ContainerState::Running { .. })
    }
}

/// What [`Runtime::adopt`] found in a state directory.
#[derive(Debug, Clone)]
pub enum AdoptedState {
    /// Still running: poll and stop it through `handle`.
    Running {
        pid: u32,
        handle: ContainerHandle,
    },
    Exited(ExitRecord),
    Lost {
        reason: String,
    },
}

/// What [`Runtime::settle_launch`] found in a state directory with neither a pid nor an exit
/// record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// A shim holds the launch: it has started or is starting the task, and its records follow.
    Claimed,
    /// No shim holds it, and none ever will: the launch was withdrawn, the task never ran, and
    /// it may be started afresh.
    Withdrawn,
}

/// How a stop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// `Exited` (usually by signal 15 or 9) or `Lost`.
    pub state: ContainerState,
    /// Whether the stop timeout ran out and SIGKILL was sent.
    pub killed: bool,
}

/// Which log of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogStream {
    Stdout,
    Stderr,
}

impl LogStream {
    pub fn file_name(self) -> &'static str {
        match self {
            LogStream::Stdout => STDOUT_LOG,
            LogStream::Stderr => STDERR_LOG,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("task {task_id} container {container}: the command is empty (no entryPoint or command)")]
    EmptyCommand { task_id: String, container: String },
    #[error("task {task_id} container {container}: {source}")]
    User { task_id: String, container: String, source: UserError },
    #[error("the shim command is empty")]
    NoShim,
    #[error("state directory {dir} already holds a container's records; use a fresh one per run")]
    StateDirInUse { dir: PathBuf },
    #[error("no container state directory at {dir}")]
    NoStateDir { dir: PathBuf },
    #[error("cannot {what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    #[error("cannot start the shim {program:?} for {dir}: {source}")]
    ShimSpawn { program: OsString, dir: PathBuf, source: io::Error },
    #[error("the shim for {dir} exited before recording a pid; its log says: {log}")]
    ShimDied { dir: PathBuf, log: String },
    #[error("the shim for {dir} recorded no pid within {}s", LAUNCH_WAIT.as_secs())]
    ShimSilent { dir: PathBuf },
    #[error("bad record {path}: {reason}")]
    BadRecord { path: PathBuf, reason: String },
    #[error("cannot send {signal} to process group {pid}: {errno}")]
    Signal { pid: u32, signal: &'static str, errno: Errno },
    #[error("process group {pid} of {dir} still runs {}s after SIGKILL", KILL_WAIT.as_secs())]
    Unkillable { pid: u32, dir: PathBuf },
}

/// Starts containers under shims and finds them again.
#[derive(Debug, Clone)]
pub struct Runtime {
    shim: Vec<OsString>,
}

impl Runtime {
    /// `shim` is the command that runs [`super::shim::shim_main`] with the arguments appended to
    /// it: in the agent `[current_exe, "shim"]` (see [`Runtime::from_current_exe`]).
    pub fn new(shim: Vec<OsString>) -> Result<Runtime, RuntimeError> {
        if shim.is_empty() {
            return Err(RuntimeError::NoShim);
        }
        Ok(Runtime { shim })
    }

    /// The production runtime: the shim is `<this executable> shim`.
    pub fn from_current_exe() -> Result<Runtime, RuntimeError> {
        let exe = std::env::current_exe().map_err(|source| RuntimeError::Io {
            what: "find the current executable",
            path: PathBuf::from("/proc/self/exe"),
            source,
        })?;
        Runtime::new(vec![exe.into_os_string(), OsString::from("shim")])
    }

    /// Starts the container and returns once its shim has recorded the pid (or that the command
    /// could not be executed; [`Runtime::status`] then says `Exited` with `error` set).
    pub fn launch(&self, l: &ContainerLaunch) -> Result<ContainerHandle, RuntimeError> {
        if l.argv.is_empty() || l.argv[0].is_empty() {
            return Err(RuntimeError::EmptyCommand {
                task_id: l.task_id.clone(),
                container: l.container.clone(),
            });
        }
        let task_user = if l.user.is_none() { l.task_user.as_ref() } else { None };
        let ctx = ExecContext::new(&l.env, l.user.as_deref(), task_user).map_err(|source| {
            RuntimeError::User { task_id: l.task_id.clone(), container: l.container.clone(), source }
        })?;
        // The agent's alone: the task writes its logs through the shim's pipes, never by path.
        crate::safe_fs::private_dir(&l.state_dir, 0o700).map_err(|source| RuntimeError::Io {
            what: "create state directory",
            path: l.state_dir.clone(),
            source,
        })?;
        let dir = fs::canonicalize(&l.state_dir).map_err(|source| RuntimeError::Io {
            what: "resolve state directory",
            path: l.state_dir.clone(),
            source,
        })?;
        if dir.join(PROC_RECORD).exists() || dir.join(EXIT_RECORD).exists() {
            return Err(RuntimeError::StateDirInUse { dir });
        }
        let shim_log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(dir.join(SHIM_LOG))
            .map_err(|source| RuntimeError::Io { what: "open", path: dir.join(SHIM_LOG), source })?;
        let shim_err = shim_log.try_clone().map_err(|source| RuntimeError::Io {
            what: "open",
            path: dir.join(SHIM_LOG),
            source,
        })?;
        // Written before the shim exists: a later agent finds the launch even if this one dies
        // before the shim records anything, and settles it with the shim (`settle_launch`).
        let launch = launch_id();
        crate::safe_fs::write_atomic(&dir.join(LAUNCH_RECORD), launch.as_bytes())
            .map_err(|source| RuntimeError::Io { what: "write", path: dir.join(LAUNCH_RECORD), source })?;
        let args = ShimArgs {
            dir: dir.clone(),
            uid: ctx.user.as_ref().map(|u| u.uid),
            gid: ctx.user.as_ref().map(|u| u.gid),
            workdir: task_user.map(|t| t.home.clone()),
            argv: l.argv.iter().map(OsString::from).collect(),
            launch: Some(launch),
        };
        let mut cmd = Command::new(&self.shim[0]);
        cmd.args(&self.shim[1..])
            .args(args.to_args())
            .env_clear()
            .envs(ctx.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(shim_log)
            .stderr(shim_err)
            .current_dir("/");
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|source| RuntimeError::ShimSpawn {
            program: self.shim[0].clone(),
            dir: dir.clone(),
            source,
        })?;
        // Reap the shim whenever it exits; while the agent lives the shim is its child.
        let shim_exited = Arc::new(AtomicBool::new(false));
        let flag = shim_exited.clone();
        let reaper = thread::Builder::new().name("shim-reaper".into()).spawn(move || {
            let _ = child.wait();
            flag.store(true, Ordering::SeqCst);
        });
        if let Err(source) = reaper {
            return Err(RuntimeError::Io { what: "start the shim reaper for", path: dir, source });
        }
        let mut waited = Duration::ZERO;
        // The shim records the task's pid within milliseconds: looked for often at first, then
        // every `POLL`.
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(proc) = read_proc(&dir)? {
                tracing::info!(task.id = %l.task_id, container = %l.container, pid = proc.pid, dir = %dir.display(), "container started");
                return Ok(ContainerHandle {
                    state_dir: dir,
                    proc: Some(proc),
                    shim_exited: Some(shim_exited),
                });
            }
            if let Some(exit) = read_exit(&dir)? {
                tracing::warn!(task.id = %l.task_id, container = %l.container, reason = %exit.reason(), "container did not start");
                return Ok(ContainerHandle { state_dir: dir, proc: None, shim_exited: Some(shim_exited) });
            }
            if shim_exited.load(Ordering::SeqCst) {
                // One more look: the shim may have written its records just before exiting.
                if read_proc(&dir)?.is_some() || read_exit(&dir)?.is_some() {
                    continue;
                }
                let log = tail_string(&dir.join(SHIM_LOG), 2048);
                return Err(RuntimeError::ShimDied { dir, log });
            }
            if waited >= LAUNCH_WAIT {
                return Err(RuntimeError::ShimSilent { dir });
            }
            thread::sleep(pause);
            waited += pause;
            pause = (pause * 2).min(POLL);
        }
    }

    /// Settles a launch an earlier agent began in `state_dir` and left without a pid or an exit
    /// record (it died in between): either a shim holds the launch, and this waits (up to the
    /// launch wait) for its records, or none does, and the launch is withdrawn so that no shim
    /// started for it will ever start the task. Only then may the task be started again.
    pub fn settle_launch(&self, state_dir: &Path) -> Result<Settled, RuntimeError> {
        use nix::fcntl::{Flock, FlockArg};
        if !state_dir.is_dir() {
            return Ok(Settled::Withdrawn); // never launched: nothing to settle
        }
        let lock_path = state_dir.join(super::shim::LAUNCH_LOCK);
        let lock = super::shim::open_lock(state_dir).map_err(|source| RuntimeError::Io {
            what: "open",
            path: lock_path.clone(),
            source,
        })?;
        let recorded = |dir: &Path| dir.join(PROC_RECORD).exists() || dir.join(EXIT_RECORD).exists();
        match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
            Ok(_held) => {
                if recorded(state_dir) {
                    return Ok(Settled::Claimed); // a shim ran it to the end and let go
                }
                match fs::remove_file(state_dir.join(LAUNCH_RECORD)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(RuntimeError::Io {
                            what: "withdraw",
                            path: state_dir.join(LAUNCH_RECORD),
                            source,
                        })
                    }
                }
                Ok(Settled::Withdrawn)
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                let mut waited = Duration::ZERO;
                while !recorded(state_dir) && waited < LAUNCH_WAIT {
                    thread::sleep(POLL);
                    waited += POLL;
                }
                Ok(Settled::Claimed)
            }
            Err((_, e)) => Err(RuntimeError::Io { what: "lock", path: lock_path, source: e.into() }),
        }
    }

    /// Finds a container again from its state directory alone, e.g. after an agent restart.
    pub fn adopt(&self, state_dir: &Path) -> Result<AdoptedState, RuntimeError> {
        if !state_dir.is_dir() {
            return Err(RuntimeError::NoStateDir { dir: state_dir.to_path_buf() });
        }
        if let Some(exit) = read_exit(state_dir)? {
            return Ok(AdoptedState::Exited(exit));
        }
        let Some(proc) = read_proc(state_dir)? else {
            return Ok(AdoptedState::Lost {
                reason: format!("{} holds neither a pid nor an exit record", state_dir.display()),
            });
        };
        let handle =
            ContainerHandle { state_dir: state_dir.to_path_buf(), proc: Some(proc), shim_exited: None };
        Ok(match self.status(&handle) {
            ContainerState::Running { pid } => AdoptedState::Running { pid, handle },
            ContainerState::Exited(exit) => AdoptedState::Exited(exit),
            ContainerState::Lost { reason } => AdoptedState::Lost { reason },
        })
    }

    /// The container's state now. May wait up to a few seconds when the process has just gone
    /// and its shim is still writing the exit record.
    pub fn status(&self, handle: &ContainerHandle) -> ContainerState {
        let dir = &handle.state_dir;
        match read_exit(dir) {
            Ok(Some(exit)) => return ContainerState::Exited(exit),
            Ok(None) => {}
            Err(e) => return ContainerState::Lost { reason: e.to_string() },
        }
        let Some(proc) = handle.proc else {
            return ContainerState::Lost {
                reason: format!("{} holds neither a pid nor an exit record", dir.display()),
            };
        };
        match procfs::liveness(proc.pid, proc.start_time) {
            // A zombie has not been reaped by its shim yet: the shim is alive and will record it.
            Liveness::Alive | Liveness::Zombie => return ContainerState::Running { pid: proc.pid },
            Liveness::Reused { start_time } => {
                // The shim may have recorded the exit just before the pid was reused.
                if let Ok(Some(exit)) = read_exit(dir) {
                    return ContainerState::Exited(exit);
                }
                return ContainerState::Lost {
                    reason: format!(
                        "pid {} now belongs to another process (start time {start_time}, recorded {})",
                        proc.pid, proc.start_time
                    ),
                };
            }
            Liveness::Gone => {}
        }
        // The process is gone: give its shim a moment to write the exit record.
        let mut waited = Duration::ZERO;
        loop {
            match read_exit(dir) {
                Ok(Some(exit)) => return ContainerState::Exited(exit),
                Ok(None) => {}
                Err(e) => return ContainerState::Lost { reason: e.to_string() },
            }
            if !shim_alive(handle, &proc) || waited >= EXIT_RECORD_WAIT {
                break;
            }
            thread::sleep(POLL);
            waited += POLL;
        }
        match read_exit(dir) {
            Ok(Some(exit)) => ContainerState::Exited(exit),
            _ => ContainerState::Lost {
                reason: format!("process {} is gone and its shim recorded no exit status", proc.pid),
            },
        }
    }

    /// Stops the container: SIGTERM to its process group, up to `stop_timeout` for it to exit,
    /// then SIGKILL. Whatever is left of the group once the process has exited is killed too.
    /// Stopping a container that has already exited just returns how it ended.
    pub fn stop(
        &self,
        handle: &ContainerHandle,
        stop_timeout: Duration,
    ) -> Result<StopOutcome, RuntimeError> {
        let pid = match self.status(handle) {
            ContainerState::Running { pid } => pid,
            state => return Ok(StopOutcome { state, killed: false }),
        };
        signal_group(pid, Signal::SIGTERM)?;
        let mut state = self.wait_while_running(handle, stop_timeout);
        let mut killed = false;
        if state.is_running() {
            tracing::warn!(pid, dir = %handle.state_dir.display(), timeout_ms = stop_timeout.as_millis() as u64, "container ignored SIGTERM; sending SIGKILL");
            killed = true;
            signal_group(pid, Signal::SIGKILL)?;
            state = self.wait_while_running(handle, KILL_WAIT);
            if state.is_running() {
                return Err(RuntimeError::Unkillable { pid, dir: handle.state_dir.clone() });
            }
        }
        // Leftovers of the group (children that ignored SIGTERM) go too; the group id cannot be
        // reused while any member remains.
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        Ok(StopOutcome { state, killed })
    }

    fn wait_while_running(&self, handle: &ContainerHandle, limit: Duration) -> ContainerState {
        let mut waited = Duration::ZERO;
        loop {
            let state = self.status(handle);
            if !state.is_running() || waited >= limit {
                return state;
            }
            let step = POLL.min(limit - waited);
            thread::sleep(step);
            waited += step;
        }
    }
}

/// A launch's id: unique among the launches of one state directory.
fn launch_id() -> String {
    use mpsfleet_core::clock::Clock;
    static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = LAUNCHES.fetch_add(1, Ordering::Relaxed);
    format!("{}-{}-{n}", std::process::id(), mpsfleet_core::clock::SystemClock.now_ms())
}

fn shim_alive(handle: &ContainerHandle, proc: &ProcRecord) -> bool {
    if let Some(flag) = &handle.shim_exited {
        if flag.load(Ordering::SeqCst) {
            return false;
        }
    }
    // A zombie shim (exited, not yet reaped by its parent) has finished writing.
    procfs::liveness(proc.shim_pid, proc.shim_start_time) == Liveness::Alive
}

fn signal_group(pid: u32, signal: Signal) -> Result<(), RuntimeError> {
    let raw = Pid::from_raw(pid as i32);
    match killpg(raw, signal) {
        Ok(()) => Ok(()),
        // The process left its group (setsid/setpgid): signal it alone.
        Err(Errno::ESRCH) => match kill(raw, signal) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(errno) => Err(RuntimeError::Signal { pid, signal: signal.as_str(), errno }),
        },
        Err(errno) => Err(RuntimeError::Signal { pid, signal: signal.as_str(), errno }),
    }
}

/// The most read of one record (they are a few hundred bytes).
const RECORD_MAX: u64 = 64 << 10;

/// A record of the state dir, read without following a link.
fn read_record<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, RuntimeError> {
    let path = dir.join(name);
    match crate::safe_fs::read_beneath(dir, Path::new(name), RECORD_MAX) {
        Ok(Some(bytes)) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| RuntimeError::BadRecord { path, reason: e.to_string() }),
        Ok(None) => Ok(None),
        Err(source) => Err(RuntimeError::Io { what: "read", path, source }),
    }
}

fn read_exit(dir: &Path) -> Result<Option<ExitRecord>, RuntimeError> {
    read_record(dir, EXIT_RECORD)
}

fn read_proc(dir: &Path) -> Result<Option<ProcRecord>, RuntimeError> {
    read_record(dir, PROC_RECORD)
}

/// The last `tail_bytes` bytes of a container's log (all of it when None); empty when the
/// container has written nothing yet. A log that is not a plain file (a task replaced it with
/// a symlink, say) is refused, not followed.
pub fn logs(state_dir: &Path, stream: LogStream, tail_bytes: Option<u64>) -> Result<Vec<u8>, RuntimeError> {
    logs_beneath(state_dir, Path::new(""), stream, tail_bytes)
}

/// [`logs`] of the container whose state dir is `root`/`rel`, following no link below `root`
/// (directories included).
pub fn logs_beneath(
    root: &Path,
    rel: &Path,
    stream: LogStream,
    tail_bytes: Option<u64>,
) -> Result<Vec<u8>, RuntimeError> {
    let rel = rel.join(stream.file_name());
    let path = root.join(&rel);
    let io = |what, source| RuntimeError::Io { what, path: path.clone(), source };
    let mut file = match crate::output::open_log_beneath(root, &rel) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(io("open", io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))),
    };
    if let Some(tail) = tail_bytes {
        let len = file.metadata().map_err(|e| io("stat", e))?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(tail))).map_err(|e| io("seek", e))?;
    }
    let mut out = Vec::new();
    file.read_to_end(&mut out).map_err(|e| io("read", e))?;
    Ok(out)
}

/// The last `max` bytes of a log of the agent's, as text; a link in its place is not followed.
fn tail_string(path: &Path, max: u64) -> String {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let mut file = match crate::output::open_log(path) {
        Ok(Some(f)) => f,
        Ok(None) | Err(_) => return format!("(no log in {})", dir.display()),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut out = String::new();
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_ok() {
        out = String::from_utf8_lossy(&bytes).trim().to_string();
    }
    if out.is_empty() {
        "(empty)".to_string()
    } else {
        out
    }
}
