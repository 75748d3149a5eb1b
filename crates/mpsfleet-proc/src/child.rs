//! Running one child process under a hard timeout: in a process group of its own, its input
//! written and both of its output pipes read while it runs (so that neither a child that never
//! reads nor one that writes more than a pipe holds can block the wait), and its whole group
//! killed when the time is up, and also after it exits, so that nothing it started outlives it.
//!
//! The timeout follows the real monotonic clock: a paused test clock or a simulated one must
//! never stretch the life of a real process. [`monotonic_now`] is the one place that reads it.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;

/// Once the child's group is gone, how long to wait by default for its output pipes to close
/// (a process that left the group may still hold them).
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The real monotonic clock, for hard timeouts on real processes only; everything that is
/// health or scheduling logic reads time through `mpsfleet_core::clock::Clock`.
#[allow(clippy::disallowed_methods)]
pub fn monotonic_now() -> Instant {
    Instant::now()
}

/// The bounds of one [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From the spawn; when it passes, the child's process group is killed.
    pub timeout: Duration,
    /// At most this many bytes of each of stdout and stderr are kept; the rest is read and
    /// dropped (and counted).
    pub max_output: usize,
    /// After the group is killed, how long to wait for the output pipes to close.
    pub drain_grace: Duration,
}

impl Limits {
    /// `timeout` and `max_output` with [`DEFAULT_DRAIN_GRACE`].
    pub fn new(timeout: Duration, max_output: usize) -> Self {
        Limits { timeout, max_output, drain_grace: DEFAULT_DRAIN_GRACE }
    }
}

/// What one stream of the child wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first [`Limits::max_output`] bytes.
    pub bytes: Vec<u8>,
    /// How many bytes after those were read and dropped.
    pub dropped: u64,
    /// Whether the pipe was read to its end; false when something still held it open after
    /// [`Limits::drain_grace`].
    pub complete: bool,
}

impl Captured {
    /// The kept bytes as text, invalid UTF-8 replaced.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.bytes)
    }
}

/// How a [`run`] ended.
#[derive(Debug)]
pub struct Outcome {
    /// How the child exited; `None` when it timed out and was killed.
    pub status: Option<ExitStatus>,
    pub stdout: Captured,
    pub stderr: Captured,
    /// The timeout passed, and the child's group was killed.
    pub timed_out: bool,
    /// From the spawn until the child was reaped and its output read.
    pub elapsed: Duration,
}

/// Why a [`run`] produced no [`Outcome`].
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The child could not be started (no such program, not executable, ...).
    #[error("cannot start the process: {source}")]
    Spawn {
        #[source]
        source: std::io::Error,
    },
    /// Started, but no thread could be started to feed or watch it; its group was killed and
    /// the child reaped.
    #[error("cannot start a thread to watch the process: {source}")]
    Thread {
        #[source]
        source: std::io::Error,
    },
    /// Started, but waiting for it failed; its group was killed and the child reaped.
    #[error("cannot wait for process {pid}: {source}")]
    Wait {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// Runs `cmd` to its end or until `limits.timeout`, whichever is first.
///
/// The child leads a process group of its own. `stdin`, when given, is written on a thread
/// and the pipe closed (a child that never reads it does not block anything); otherwise stdin
/// is `/dev/null`. Stdout and stderr are read on threads while it runs. When the timeout
/// passes, the group is sent SIGKILL and the child reaped; when the child exits in time, what
/// is left of its group is sent SIGKILL too. The leader is reaped only after the group is
/// signalled, so the group id cannot have been reused by then.
pub fn run(mut cmd: Command, stdin: Option<Vec<u8>>, limits: Limits) -> Result<Outcome, ChildError> {
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let started = monotonic_now();
    let mut child = cmd.spawn().map_err(|source| ChildError::Spawn { source })?;
    let pid = child.id();
    let kill_group = || {
        // The leader is not reaped yet, so the group id is still this child's.
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
    };

    let (drained_tx, drained_rx) = mpsc::channel();
    let threads = (|| {
        if let (Some(mut pipe), Some(input)) = (child.stdin.take(), stdin) {
            spawn_thread("child-stdin", move || {
                // A child that exits (or closes stdin) without reading it makes this fail
                // with EPIPE; its status tells the story.
                let _ = pipe.write_all(&input);
            })?;
        }
        let stdout = drain(child.stdout.take(), limits.max_output, drained_tx.clone())?;
        let stderr = drain(child.stderr.take(), limits.max_output, drained_tx)?;
        let exited = watch_exit(pid)?;
        Ok((stdout, stderr, exited))
    })();
    let (stdout, stderr, exited) = match threads {
        Ok(threads) => threads,
        Err(source) => {
            kill_group();
            let _ = child.wait();
            return Err(ChildError::Thread { source });
        }
    };

    let exited = match exited.recv_timeout(limits.timeout) {
        Ok(Ok(())) => Ok(true),
        Ok(Err(errno)) => Err(std::io::Error::from(errno)),
        Err(mpsc::RecvTimeoutError::Timeout) => Ok(false),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(std::io::Error::other("the thread waiting for the child ended without an answer"))
        }
    };
    kill_group();
    let reaped = child.wait();
    let deadline = monotonic_now() + limits.drain_grace;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(monotonic_now());
        if drained_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    let (stdout, stderr) = (take(&stdout), take(&stderr));
    let elapsed = started.elapsed();

    match (exited, reaped) {
        (Err(source), _) | (Ok(_), Err(source)) => Err(ChildError::Wait { pid, source }),
        (Ok(true), Ok(status)) => {
            Ok(Outcome { status: Some(status), stdout, stderr, timed_out: false, elapsed })
        }
        (Ok(false), Ok(_)) => Ok(Outcome { status: None, stdout, stderr, timed_out: true, elapsed }),
    }
}

/// A thread that blocks in `waitid(WNOWAIT)` until process `pid` (a child) has exited, and
/// then says so, without reaping it; it ends once the child has exited, which the caller
/// brings about by killing it.
fn watch_exit(pid: u32) -> std::io::Result<mpsc::Receiver<nix::Result<()>>> {
    let (tx, rx) = mpsc::channel();
    spawn_thread("child-wait", move || {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
        let result = loop {
            match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
                Err(nix::Error::EINTR) => continue,
                other => break other.map(drop),
            }
        };
        let _ = tx.send(result);
    })?;
    Ok(rx)
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    thread::Builder::new().name(name.to_string()).spawn(f).map(drop)
}

/// Reads `pipe` to its end on a thread, keeping the first `max` bytes and counting the rest;
/// says so on `drained` when the pipe closes.
fn drain(
    pipe: Option<impl Read + Send + 'static>,
    max: usize,
    drained: mpsc::Sender<()>,
) -> std::io::Result<Arc<Mutex<Captured>>> {
    let buf = Arc::new(Mutex::new(Captured::default()));
    let sink = Arc::clone(&buf);
    spawn_thread("child-output", move || {
        if let Some(mut pipe) = pipe {
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut kept = sink.lock().unwrap_or_else(|p| p.into_inner());
                        let room = max.saturating_sub(kept.bytes.len()).min(n);
                        kept.bytes.extend_from_slice(&chunk[..room]);
                        kept.dropped += (n - room) as u64;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
        sink.lock().unwrap_or_else(|p| p.into_inner()).complete = true;
        let _ = drained.send(());
    })?;
    Ok(buf)
}

fn take(buf: &Mutex<Captured>) -> Captured {
    std::mem::take(&mut *buf.lock().unwrap_or_else(|p| p.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script);
        cmd
    }

    fn limits(timeout_ms: u64, max_output: usize) -> Limits {
        Limits::new(Duration::from_millis(timeout_ms), max_output)
    }

    #[test]
    fn a_child_writing_megabytes_to_both_pipes_finishes_and_is_capped() {
        let script = "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2; echo done >&2";
        let out = run(sh(script), None, limits(20_000, 64 * 1024)).expect("run");
        assert!(!out.timed_out);
        assert!(out.status.expect("exited").success());
        assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
        assert_eq!(out.stdout.bytes.len(), 64 * 1024);
        assert_eq!(out.stdout.dropped, 1024 * 1024 - 64 * 1024);
        assert_eq!(out.stderr.bytes.len(), 64 * 1024);
        assert_eq!(out.stderr.dropped, 1024 * 1024 + 5 - 64 * 1024);
        assert!(out.stdout.complete && out.stderr.complete);

        // Uncapped, all of it comes through.
        let out = run(sh(script), None, limits(20_000, 4 << 20)).expect("run");
        assert_eq!(out.stdout.bytes.len(), 1024 * 1024);
        assert_eq!(out.stderr.bytes.len(), 1024 * 1024 + 5);
        assert!(out.stderr.text().ends_with("done\n"));
        assert_eq!((out.stdout.dropped, out.stderr.dropped), (0, 0));
    }

    #[test]
    fn stdin_is_written_and_stdout_read() {
        let out = run(Command::new("cat"), Some(b"hello\n".to_vec()), limits(10_000, 1024)).expect("run");
        assert_eq!(out.stdout.text(), "hello\n");
        assert!(out.status.expect("exited").success());
        // Without input, stdin is /dev/null: cat ends at once.
        let out = run(Command::new("cat"), None, limits(10_000, 1024)).expect("run");
        assert_eq!(out.stdout.bytes, b"");
        assert!(!out.timed_out);
    }

    #[test]
    fn exit_codes_and_signals_come_through() {
        let out = run(sh("echo oops >&2; exit 3"), None, limits(10_000, 1024)).expect("run");
        let status = out.status.expect("exited");
        assert_eq!(status.code(), Some(3));
        assert_eq!(out.stderr.text(), "oops\n");
        let out = run(sh("kill -TERM $$"), None, limits(10_000, 1024)).expect("run");
        let status = out.status.expect("exited");
        assert_eq!((status.code(), status.signal()), (None, Some(15)));
        assert!(!out.timed_out);
    }

    #[test]
    fn spawn_failure_is_a_spawn_error() {
        match run(Command::new("/nonexistent/program"), None, limits(1000, 10)) {
            Err(ChildError::Spawn { source }) => assert_eq!(source.kind(), std::io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
    }

    /// Whether `pid` has ended (SIGKILL is delivered asynchronously), waiting up to 2 s.
    fn ends_soon(pid: u32) -> bool {
        (0..200).any(|_| {
            let gone = crate::stat(pid).is_none_or(|s| s.is_dead());
            if !gone {
                thread::sleep(Duration::from_millis(10));
            }
            gone
        })
    }

    #[test]
    fn a_child_that_never_reads_stdin_is_killed_at_the_timeout_with_its_grandchild() {
        // A large input that nobody reads fills the pipe; the writer thread must not block.
        let input = vec![b'x'; 1 << 20];
        let dir = tempfile_dir();
        let pidfile = dir.join("grandchild");
        let script = format!("sleep 100 & echo $! > {}; echo started; sleep 100", pidfile.display());
        let out = run(sh(&script), Some(input), limits(500, 1024)).expect("run");
        assert!(out.timed_out);
        assert!(out.status.is_none());
        assert!(out.elapsed >= Duration::from_millis(500), "{:?}", out.elapsed);
        assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
        assert_eq!(out.stdout.text(), "started\n", "output written before the timeout is kept");
        let grandchild: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(ends_soon(grandchild), "grandchild {grandchild} still runs: {:?}", crate::stat(grandchild));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_a_child_left_in_its_group_is_killed_after_it_exits() {
        let dir = tempfile_dir();
        let pidfile = dir.join("grandchild");
        // The grandchild's output goes elsewhere, so the pipes close when the child exits.
        let script = format!("sleep 100 >/dev/null 2>&1 & echo $! > {}", pidfile.display());
        let out = run(sh(&script), None, limits(10_000, 1024)).expect("run");
        assert!(out.status.expect("exited").success());
        let grandchild: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(ends_soon(grandchild), "grandchild {grandchild} still runs: {:?}", crate::stat(grandchild));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_pipe_held_by_an_escaped_process_is_given_up_after_the_grace() {
        // setsid leaves the group; the escaped process keeps stdout open. The child waits
        // until it has left, so that killing the group cannot catch it first.
        let dir = tempfile_dir();
        let mark = dir.join("escaped");
        let script = format!(
            "setsid sh -c 'touch {m}; exec sleep 3' & while [ ! -e {m} ]; do sleep 0.01; done; echo hi",
            m = mark.display()
        );
        let limits = Limits { drain_grace: Duration::from_millis(300), ..limits(10_000, 1024) };
        let out = run(sh(&script), None, limits).expect("run");
        assert!(out.status.expect("exited").success());
        assert!(out.elapsed < Duration::from_secs(2), "{:?}", out.elapsed);
        assert_eq!(out.stdout.text(), "hi\n");
        assert!(!out.stdout.complete);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("mpsfleet-proc-child-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn unique() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }
}
