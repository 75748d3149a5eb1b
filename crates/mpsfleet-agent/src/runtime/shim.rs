//! The shim: the small process that owns one container's process, so that the task outlives
//! the agent and its exit status is written down even while no agent is running.
//!
//! The agent spawns `mpsfleet shim --dir DIR [--uid N --gid N] [--workdir W] -- ARGV...` in a
//! process group of its own. The shim starts ARGV in a *new* process group (its pgid is the
//! task's pid, which is what a stop signals), with stdout and stderr appended to
//! `DIR/stdout.log` and `DIR/stderr.log` through pipes the shim reads (see [`relay`]: each chunk
//! also goes, with its stream and time, to `DIR/output.log`, in the order read, for the agent's
//! snapshots of recent output), the working directory W (`/` without one) and the shim's own
//! environment. The shim runs as the agent's user: every file it writes is its own, mode 0600,
//! and the task (another uid) never gets a path to them, only the pipes. It then writes
//! `DIR/proc.json` (pid and start times) and `DIR/pid`, waits for the process and writes
//! `DIR/exit.json`.
//!
//! **Who starts the task.** An agent may die between spawning a shim and the shim recording
//! the pid; the next agent must then know whether that shim will still start the task. The agent
//! writes `DIR/launch` (a fresh id) before it spawns the shim with `--launch ID`; the shim holds
//! `DIR/launch.lock` (flock) from before it starts the task until it exits, and starts it only if
//! it got the lock at once and `DIR/launch` still holds its id. A later agent that finds
//! neither record takes the same lock: if a shim holds it, the records follow; if it gets it,
//! it removes `DIR/launch` while holding it, and no shim will ever start that launch (see
//! [`super::Runtime::settle_launch`]). Every record is written to a temporary file and renamed into place, so a
//! reader sees the whole record or none of it. The shim is never in the task's process group,
//! so stopping a task never kills the shim before it has recorded the exit.

use mpsfleet_core::clock::{Clock, SystemClock};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// File names inside a container's state directory.
pub const STDOUT_LOG: &str = "stdout.log";
pub const STDERR_LOG: &str = "stderr.log";
/// Both streams, framed, in the order read (see [`crate::output::encode_frame`]).
pub const OUTPUT_LOG: &str = "output.log";
/// Where `output.log` goes once it is over [`OUTPUT_LOG_MAX`], replacing the one before.
pub const OUTPUT_LOG_OLD: &str = "output.1.log";
/// `output.log` starts again past this size, so that the framed copy stays bounded on disk.
pub const OUTPUT_LOG_MAX: u64 = 1 << 20;
/// How long the shim waits, after the task's process exits, for the output still in its pipes.
const RELAY_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);
/// The shim's own diagnostics (what it prints before and after the task runs).
pub const SHIM_LOG: &str = "shim.log";
pub const PROC_RECORD: &str = "proc.json";
pub const PID_FILE: &str = "pid";
pub const EXIT_RECORD: &str = "exit.json";
/// The id of the launch the agent last asked for; a shim starts the task only under its id.
pub const LAUNCH_RECORD: &str = "launch";
/// Held (flock) by the shim that won the launch, from before it starts the task until it exits.
pub const LAUNCH_LOCK: &str = "launch.lock";

/// The shim's exit code when it could not do its job (bad arguments, unwritable state dir).
pub const SHIM_FAILURE: i32 = 125;

/// Arguments of `mpsfleet shim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShimArgs {
    /// The container's state directory (must exist).
    pub dir: PathBuf,
    /// Run the task as this uid and gid (only when the shim runs as root). Supplementary groups
    /// are cleared, as std does when it switches uid from root.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The task's working directory (`/` when None).
    pub workdir: Option<PathBuf>,
    /// The task's argv; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<OsString>,
    /// The launch this shim is for (`DIR/launch` must hold it); None starts without the check.
    pub launch: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShimArgsError {
    #[error("shim: missing --dir")]
    MissingDir,
    #[error("shim: missing `--` and the command to run after it")]
    MissingCommand,
    #[error("shim: {flag} needs a value")]
    MissingValue { flag: String },
    #[error("shim: {flag} must be a number, got {value:?}")]
    BadNumber { flag: String, value: String },
    #[error("shim: --uid and --gid must be given together")]
    UidWithoutGid,
    #[error("shim: unknown argument {arg:?}")]
    Unknown { arg: String },
}

impl ShimArgs {
    /// Parses what follows `shim` on the command line:
    /// `--dir DIR [--uid N --gid N] -- ARGV...`.
    pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<ShimArgs, ShimArgsError> {
        let mut args = args.into_iter();
        let (mut dir, mut uid, mut gid, mut workdir, mut launch) = (None, None, None, None, None);
        loop {
            let Some(arg) = args.next() else { return Err(ShimArgsError::MissingCommand) };
            let flag = arg.to_string_lossy().into_owned();
            match flag.as_str() {
                "--" => break,
                "--dir" => {
                    dir = Some(PathBuf::from(
                        args.next().ok_or(ShimArgsError::MissingValue { flag: flag.clone() })?,
                    ))
                }
                "--workdir" => {
                    workdir = Some(PathBuf::from(
                        args.next().ok_or(ShimArgsError::MissingValue { flag: flag.clone() })?,
                    ))
                }
                "--launch" => {
                    let value = args.next().ok_or(ShimArgsError::MissingValue { flag: flag.clone() })?;
                    launch = Some(value.to_string_lossy().into_owned())
                }
                "--uid" | "--gid" => {
                    let value = args.next().ok_or(ShimArgsError::MissingValue { flag: flag.clone() })?;
                    let value = value.to_string_lossy().into_owned();
                    let n = value
                        .parse::<u32>()
                        .map_err(|_| ShimArgsError::BadNumber { flag: flag.clone(), value })?;
                    if flag == "--uid" {
                        uid = Some(n)
                    } else {
                        gid = Some(n)
                    }
                }
                _ => return Err(ShimArgsError::Unknown { arg: flag }),
            }
        }
        let argv: Vec<OsString> = args.collect();
        let dir = dir.ok_or(ShimArgsError::MissingDir)?;
        if argv.is_empty() {
            return Err(ShimArgsError::MissingCommand);
        }
        if uid.is_some() != gid.is_some() {
            return Err(ShimArgsError::UidWithoutGid);
        }
        Ok(ShimArgs { dir, uid, gid, workdir, argv, launch })
    }

    /// The inverse of [`ShimArgs::parse`].
    pub fn to_args(&self) -> Vec<OsString> {
        let mut out = vec![OsString::from("--dir"), self.dir.clone().into_os_string()];
        if let (Some(uid), Some(gid)) = (self.uid, self.gid) {
            out.extend(["--uid".into(), uid.to_string().into(), "--gid".into(), gid.to_string().into()]);
        }
        if let Some(w) = &self.workdir {
            out.extend(["--workdir".into(), w.clone().into_os_string()]);
        }
        if let Some(id) = &self.launch {
            out.extend(["--launch".into(), id.into()]);
        }
        out.push("--".into());
        out.extend(self.argv.iter().cloned());
        out
    }
}

/// `DIR/proc.json`: which process is the task, and how to tell it from a later process that
/// reuses its pid (the start time, field 22 of `/proc/PID/stat`, in clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcRecord {
    pub pid: u32,
    pub start_time: u64,
    pub shim_pid: u32,
    pub shim_start_time: u64,
}

/// `DIR/exit.json`: how the task's process ended, or why it never started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitRecord {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub finished_at_ms: u64,
    /// Set when the command could not be executed at all (nothing ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The kernel killed it for going past its memory limit (Docker's `State.OOMKilled`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
}

impl ExitRecord {
    /// Whether the command could not be started (as opposed to ran and exited).
    pub fn failed_to_start(&self) -> bool {
        self.error.is_some()
    }

    /// A short human reason: `exit status 3`, `killed by signal 9 (SIGKILL)`,
    /// `failed to start: no such file or directory: foo`.
    pub fn reason(&self) -> String {
        if let Some(error) = &self.error {
            return format!("failed to start: {error}");
        }
        match (self.code, self.signal) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
                Ok(s) => format!("killed by signal {sig} ({})", s.as_str()),
                Err(_) => format!("killed by signal {sig}"),
            },
            (None, None) => "exited with an unknown status".to_string(),
        }
    }
}

/// Runs the shim; returns the shim's own exit code (0 once the exit record is written, even if
/// the task failed; [`SHIM_FAILURE`] when the shim itself could not work).
pub fn shim_main(args: ShimArgs) -> i32 {
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mpsfleet shim: {e}");
            SHIM_FAILURE
        }
    }
}

/// Parses `args` (what follows `shim`) and runs the shim; prints argument errors to stderr.
pub fn shim_main_from_args<I: IntoIterator<Item = OsString>>(args: I) -> i32 {
    match ShimArgs::parse(args) {
        Ok(a) => shim_main(a),
        Err(e) => {
            eprintln!("mpsfleet {e}");
            SHIM_FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ShimError {
    #[error("no command to run for {dir}")]
    EmptyCommand { dir: PathBuf },
    #[error("cannot {what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    #[error("not starting the task of {dir}: {why}")]
    NotOurs { dir: PathBuf, why: &'static str },
}

/// Takes the launch of `args.dir` for this shim: the lock, held while the returned file is
/// open, and the check that the launch is still the one the agent asked for. The task is not
/// started when it fails.
fn win_launch(args: &ShimArgs, id: &str) -> Result<nix::fcntl::Flock<File>, ShimError> {
    use nix::fcntl::{Flock, FlockArg};
    let lock = open_lock(&args.dir).map_err(|source| ShimError::Io {
        what: "open",
        path: args.dir.join(LAUNCH_LOCK),
        source,
    })?;
    let not_ours = |why| ShimError::NotOurs { dir: args.dir.clone(), why };
    let held = Flock::lock(lock, FlockArg::LockExclusiveNonblock)
        .map_err(|_| not_ours("another process holds its launch"))?;
    let asked = std::fs::read_to_string(args.dir.join(LAUNCH_RECORD)).unwrap_or_default();
    if asked.trim() != id {
        return Err(not_ours("the launch was withdrawn (its agent stopped before the task started)"));
    }
    if args.dir.join(PROC_RECORD).exists() || args.dir.join(EXIT_RECORD).exists() {
        return Err(not_ours("it has already run"));
    }
    Ok(held)
}

/// Opens (creating) `dir/launch.lock`, close-on-exec so that the task never inherits it.
pub(crate) fn open_lock(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(dir.join(LAUNCH_LOCK))
}

fn run(args: &ShimArgs) -> Result<(), ShimError> {
    let Some(program) = args.argv.first() else {
        return Err(ShimError::EmptyCommand { dir: args.dir.clone() });
    };
    // Held until the shim exits: a later agent that finds it held waits for the records.
    let _launch = args.launch.as_deref().map(|id| win_launch(args, id)).transpose()?;
    let open_log = |name: &str| {
        use std::os::unix::fs::OpenOptionsExt;
        let path = args.dir.join(name);
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| ShimError::Io { what: "open log", path, source })
    };
    let stdout = open_log(STDOUT_LOG)?;
    let stderr = open_log(STDERR_LOG)?;
    let output = open_log(OUTPUT_LOG)?;
    let mut cmd = Command::new(program);
    cmd.args(&args.argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .current_dir(args.workdir.as_deref().unwrap_or(Path::new("/")))
        .process_group(0);
    if let (Some(uid), Some(gid)) = (args.uid, args.gid) {
        cmd.uid(uid).gid(gid);
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let record = ExitRecord {
                code: None,
                signal: None,
                finished_at_ms: SystemClock.now_ms(),
                error: Some(describe_spawn_error(&e, program)),
                oom_killed: false,
            };
            return write_json(&args.dir.join(EXIT_RECORD), &record);
        }
    };
    let pipes: [(Option<Box<dyn std::io::Read + Send>>, File); 2] = [
        (child.stdout.take().map(|p| Box::new(p) as _), stdout),
        (child.stderr.take().map(|p| Box::new(p) as _), stderr),
    ];
    let relay = relay::start(&args.dir, output, pipes);
    let pid = child.id();
    let shim_pid = std::process::id();
    // The child cannot be reaped before we wait for it, so its /proc entry is there.
    let record = ProcRecord {
        pid,
        start_time: super::procfs::stat(pid).map(|s| s.start_time).unwrap_or(0),
        shim_pid,
        shim_start_time: super::procfs::stat(shim_pid).map(|s| s.start_time).unwrap_or(0),
    };
    if let Err(e) = write_json(&args.dir.join(PROC_RECORD), &record)
        .and_then(|()| write_atomic(&args.dir.join(PID_FILE), format!("{pid}\n").as_bytes()))
    {
        // Without the record nobody can find the process: do not leave it running unseen.
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let status = child.wait().map_err(|source| ShimError::Io {
        what: "wait for the task process of",
        path: args.dir.clone(),
        source,
    })?;
    // What the task wrote last is in the logs before its exit is recorded (children it left
    // behind may hold the pipes open: they are not waited for).
    relay.drain(RELAY_DRAIN);
    let record = ExitRecord {
        code: status.code(),
        signal: status.signal(),
        finished_at_ms: SystemClock.now_ms(),
        error: None,
        oom_killed: false,
    };
    write_json(&args.dir.join(EXIT_RECORD), &record)
}

/// Copies the task's stdout and stderr from their pipes to `stdout.log` and `stderr.log`, and
/// every chunk, framed with its stream and the time it was read, to `output.log`, in the order
/// read: two threads, one per pipe, each writing its chunk under one lock. A write that fails
/// is reported once on the shim's own log and the pipe is still read, so the task never
/// blocks on a full pipe.
mod relay {
    use super::{OUTPUT_LOG, OUTPUT_LOG_MAX, OUTPUT_LOG_OLD};
    use crate::output::encode_frame;
    use mpsfleet_core::clock::{Clock, SystemClock};
    use mpsfleet_types::logs::OutputStream;
    use std::fs::{File, OpenOptions};
    use std::io::{Read, Write};
    use std::path::{Path, PathBuf};
    use std::sync::mpsc::{channel, Receiver};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    struct Framed {
        dir: PathBuf,
        file: File,
        len: u64,
        failed: bool,
    }

    impl Framed {
        fn append(&mut self, stream: OutputStream, bytes: &[u8]) {
            let frame = encode_frame(stream, SystemClock.now_ms(), bytes);
            match self.file.write_all(&frame) {
                Ok(()) => self.len += frame.len() as u64,
                Err(e) if !self.failed => {
                    self.failed = true;
                    eprintln!("mpsfleet shim: cannot write {}: {e}", self.dir.join(OUTPUT_LOG).display());
                }
                Err(_) => {}
            }
            if self.len > OUTPUT_LOG_MAX {
                self.rotate();
            }
        }

        /// Starts `output.log` again; the full one becomes `output.1.log`. A new file is only
        /// created where nothing is (no link is followed); otherwise writing goes on where it was.
        fn rotate(&mut self) {
            let (path, old) = (self.dir.join(OUTPUT_LOG), self.dir.join(OUTPUT_LOG_OLD));
            if std::fs::rename(&path, &old).is_err() {
                return;
            }
            use std::os::unix::fs::OpenOptionsExt;
            match OpenOptions::new().append(true).create_new(true).mode(0o600).open(&path) {
                Ok(f) => {
                    self.file = f;
                    self.len = 0;
                }
                Err(e) => {
                    eprintln!("mpsfleet shim: cannot start {} again: {e}", path.display());
                    self.len = 0;
                }
            }
        }
    }

    /// The copying threads; [`Relay::drain`] waits for them.
    pub struct Relay {
        done: Receiver<()>,
        threads: usize,
    }

    pub fn start(dir: &Path, output: File, pipes: [(Option<Box<dyn Read + Send>>, File); 2]) -> Relay {
        let len = output.metadata().map(|m| m.len()).unwrap_or(0);
        let framed =
            Arc::new(Mutex::new(Framed { dir: dir.to_path_buf(), file: output, len, failed: false }));
        let (tx, done) = channel();
        let mut threads = 0;
        for ((pipe, mut log), stream) in pipes.into_iter().zip([OutputStream::Stdout, OutputStream::Stderr]) {
            let Some(mut pipe) = pipe else { continue };
            let (framed, tx) = (framed.clone(), tx.clone());
            let name = dir.join(stream.as_str());
            let copy = move || {
                let mut buf = vec![0u8; 64 << 10];
                let mut failed = false;
                loop {
                    let n = match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    };
                    // One lock for both writes, so that the two files agree on the order.
                    let mut framed = framed.lock().unwrap_or_else(|p| p.into_inner());
                    if let Err(e) = log.write_all(&buf[..n]) {
                        if !failed {
                            failed = true;
                            eprintln!("mpsfleet shim: cannot write the {} log: {e}", name.display());
                        }
                    }
                    framed.append(stream, &buf[..n]);
                }
                let _ = tx.send(());
            };
            match std::thread::Builder::new().name(format!("relay-{}", stream.as_str())).spawn(copy) {
                Ok(_) => threads += 1,
                Err(e) => eprintln!("mpsfleet shim: cannot relay {}: {e}", stream.as_str()),
            }
        }
        Relay { done, threads }
    }

    impl Relay {
        /// Waits up to `limit` for both pipes to be read to their end.
        pub fn drain(self, limit: Duration) {
            let deadline = SystemClock.now_ms() + limit.as_millis() as u64;
            for _ in 0..self.threads {
                let left = deadline.saturating_sub(SystemClock.now_ms());
                if self.done.recv_timeout(Duration::from_millis(left)).is_err() {
                    return;
                }
            }
        }
    }
}

fn describe_spawn_error(e: &io::Error, program: &OsString) -> String {
    let program = program.to_string_lossy();
    match e.kind() {
        io::ErrorKind::NotFound => format!("no such file or directory: {program}"),
        io::ErrorKind::PermissionDenied => format!("permission denied: {program}"),
        _ => format!("cannot execute {program}: {e}"),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ShimError> {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ShimError> {
    crate::safe_fs::write_atomic(path, bytes).map_err(|source| ShimError::Io {
        what: "write",
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn parse_round_trips() {
        let a = ShimArgs {
            dir: "/var/lib/x".into(),
            uid: Some(65534),
            gid: Some(65534),
            workdir: Some("/run/home/t-1".into()),
            argv: os(&["sh", "-c", "echo -- hi"]),
            launch: Some("42-7".into()),
        };
        assert_eq!(ShimArgs::parse(a.to_args()), Ok(a.clone()));
        let b = ShimArgs { uid: None, gid: None, workdir: None, launch: None, ..a };
        assert_eq!(ShimArgs::parse(b.to_args()), Ok(b));
    }

    #[test]
    fn parse_rejects_bad_input() {
        let check = |args: &[&str], want: ShimArgsError| assert_eq!(ShimArgs::parse(os(args)), Err(want));
        check(&["--", "true"], ShimArgsError::MissingDir);
        check(&["--dir", "/x"], ShimArgsError::MissingCommand);
        check(&["--dir", "/x", "--"], ShimArgsError::MissingCommand);
        check(&["--dir"], ShimArgsError::MissingValue { flag: "--dir".into() });
        check(
            &["--dir", "/x", "--uid", "abc", "--", "true"],
            ShimArgsError::BadNumber { flag: "--uid".into(), value: "abc".into() },
        );
        check(&["--dir", "/x", "--uid", "1", "--", "true"], ShimArgsError::UidWithoutGid);
        check(&["--bogus"], ShimArgsError::Unknown { arg: "--bogus".into() });
    }

    #[test]
    fn exit_reasons() {
        let rec = |code, signal, error: Option<&str>| ExitRecord {
            code,
            signal,
            finished_at_ms: 0,
            error: error.map(str::to_string),
            oom_killed: false,
        };
        assert_eq!(rec(Some(3), None, None).reason(), "exit status 3");
        assert_eq!(rec(None, Some(9), None).reason(), "killed by signal 9 (SIGKILL)");
        assert_eq!(rec(None, Some(15), None).reason(), "killed by signal 15 (SIGTERM)");
        assert_eq!(
            rec(None, None, Some("no such file or directory: foo")).reason(),
            "failed to start: no such file or directory: foo"
        );
    }
}
