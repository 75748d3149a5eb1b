//! A `task exec` command beside a process task: as the task's uid and gid, with its
//! environment and working directory, on pipes or (with `tty`) on a pseudo-terminal whose
//! controlling process is the command (`mpsfleet exec-tty`, [`tty_main`]).

use super::{Input, Running, OUTPUT_QUEUE, READ_CHUNK};
use crate::runtime::shim::{ProcRecord, EXIT_RECORD, PROC_RECORD};
use crate::safe_fs::read_beneath;
use mpsfleet_types::exec::{ExecSpec, Frame};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The task's process as a command beside it should run.
struct Identity {
    uid: u32,
    gid: u32,
    env: Vec<(OsString, OsString)>,
    cwd: PathBuf,
}

/// Reads how the task's process runs, once it is known to be the recorded one and alive.
fn identity(tasks_dir: &Path, dir: &Path, who: &str) -> Result<Identity, String> {
    let not_running = || format!("{who} is not running on this host");
    if matches!(read_beneath(tasks_dir, &dir.join(EXIT_RECORD), 1 << 16), Ok(Some(_))) {
        return Err(format!("{who} has exited"));
    }
    let rec = match read_beneath(tasks_dir, &dir.join(PROC_RECORD), 1 << 16) {
        Ok(Some(b)) => serde_json::from_slice::<ProcRecord>(&b).map_err(|e| format!("{who}: {e}"))?,
        _ => return Err(not_running()),
    };
    if !matches!(mpsfleet_proc::liveness(rec.pid, rec.start_time), mpsfleet_proc::Liveness::Alive) {
        return Err(format!("{who} has exited"));
    }
    let proc = PathBuf::from(format!("/proc/{}", rec.pid));
    let status = std::fs::read_to_string(proc.join("status")).map_err(|_| not_running())?;
    let id_of = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| format!("{who}: no {key} in its /proc status"))
    };
    let (uid, gid) = (id_of("Uid:")?, id_of("Gid:")?);
    let environ = std::fs::read(proc.join("environ")).map_err(|e| format!("{who}: its environment: {e}"))?;
    let env = environ
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|b| *b == b'=')?;
            Some((OsStr::from_bytes(&kv[..eq]).to_owned(), OsStr::from_bytes(&kv[eq + 1..]).to_owned()))
        })
        .collect();
    let cwd = std::fs::read_link(proc.join("cwd")).unwrap_or_else(|_| PathBuf::from("/"));
    // Read after the rest: a process that exited meanwhile (its pid perhaps reused) is not
    // taken for the task.
    if !matches!(mpsfleet_proc::liveness(rec.pid, rec.start_time), mpsfleet_proc::Liveness::Alive) {
        return Err(format!("{who} has exited"));
    }
    Ok(Identity { uid, gid, env, cwd })
}

/// Starts `spec`'s command beside the task's process whose records are in `tasks_dir`/`dir`.
pub(super) fn start(
    tasks_dir: &Path,
    dir: &Path,
    exe: &OsStr,
    spec: &ExecSpec,
    who: &str,
) -> Result<Running, String> {
    let id = identity(tasks_dir, dir, who)?;
    let Some(program) = find_program(&spec.command[0], &id.env) else {
        return Ok(failed(127, format!("{:?}: not found in the task's PATH\n", spec.command[0])));
    };
    let mut cmd = if spec.tty {
        let mut c = Command::new(exe);
        c.arg("exec-tty").arg("--path").arg(&program).arg("--").args(&spec.command);
        c
    } else {
        let mut c = Command::new(&program);
        std::os::unix::process::CommandExt::arg0(&mut c, &spec.command[0]);
        c.args(&spec.command[1..]);
        // Its own group, so that the session's end reaches what it started too.
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        c
    };
    cmd.env_clear().envs(id.env.iter().map(|(k, v)| (k, v))).current_dir(&id.cwd);
    if nix::unistd::geteuid().is_root() && id.uid != 0 {
        std::os::unix::process::CommandExt::uid(&mut cmd, id.uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, id.gid);
    }
    if spec.tty {
        tty(cmd, spec)
    } else {
        pipes(cmd, spec)
    }
}

/// Where `name` is: itself when it names a path, else the first file of that name in the
/// task's `PATH` (a shell's lookup: a directory the task cannot search does not hide a later
/// one).
fn find_program(name: &str, env: &[(OsString, OsString)]) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone());
    let path = path.unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// What a command that could not be started exits with, as a shell would: 127 not found, 126
/// found but not executable.
fn spawn_failure(e: &std::io::Error, program: &str) -> (i32, String) {
    let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
    (code, format!("cannot run {program:?}: {e}\n"))
}

/// A command that never started: its message on stderr, then its exit code.
fn failed(code: i32, message: String) -> Running {
    let (input, _) = mpsc::channel(1);
    let (tx, output) = mpsc::channel(2);
    let _ = tx.try_send(Frame::Stderr(message.into_bytes()));
    let _ = tx.try_send(Frame::Exit(code));
    Running { input, output, kill: Box::new(|| {}) }
}

/// Reads `r` on a thread of its own into `tx` as frames made by `frame`, until it ends.
fn pump<R: Read + Send + 'static>(
    mut r: R,
    tx: mpsc::Sender<Frame>,
    frame: fn(Vec<u8>) -> Frame,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("exec-output".into()).spawn(move || {
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(frame(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// Writes what the client sends into `w` on a thread of its own; `resize` takes a terminal's
/// size. `w` is closed at the end of stdin.
fn feed<W: Write + Send + 'static>(
    w: Option<W>,
    mut rx: mpsc::Receiver<Input>,
    resize: Option<Arc<OwnedFd>>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("exec-input".into()).spawn(move || {
        let mut w = w;
        while let Some(i) = rx.blocking_recv() {
            match i {
                Input::Stdin(b) => {
                    if let Some(out) = w.as_mut() {
                        if out.write_all(&b).and_then(|()| out.flush()).is_err() {
                            w = None;
                        }
                    }
                }
                // A terminal has no end of input but the EOF character.
                Input::StdinEnd if resize.is_some() => {
                    if let Some(out) = w.as_mut() {
                        let _ = out.write_all(&[4]);
                    }
                }
                Input::StdinEnd => w = None,
                Input::Resize { cols, rows } => {
                    if let Some(fd) = &resize {
                        set_size(fd, cols, rows);
                    }
                }
            }
        }
    })?;
    Ok(())
}

fn set_size(fd: &OwnedFd, cols: u16, rows: u16) {
    let size = rustix::termios::Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    let _ = rustix::termios::tcsetwinsize(fd, size);
}

/// Waits for `child` (and, for at most a second more, for the output still in its pipes),
/// then sends its exit code.
fn wait_then_exit(
    mut child: std::process::Child,
    readers: Vec<std::thread::JoinHandle<()>>,
    tx: mpsc::Sender<Frame>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("exec-wait".into()).spawn(move || {
        let code = match child.wait() {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
            }
            Err(_) => 255,
        };
        // At most 200 looks 5 ms apart: a second.
        let mut looks = 200;
        for r in readers {
            while !r.is_finished() && looks > 0 {
                std::thread::sleep(std::time::Duration::from_millis(5));
                looks -= 1;
            }
        }
        let _ = tx.blocking_send(Frame::Exit(code));
    })?;
    Ok(())
}

/// Kills the process group led by `pid`.
fn killer(pid: u32) -> Box<dyn FnOnce() + Send> {
    Box::new(move || {
        if let Ok(pid) = i32::try_from(pid) {
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    })
}

fn pipes(mut cmd: Command, spec: &ExecSpec) -> Result<Running, String> {
    let stdin = if spec.interactive { Stdio::piped() } else { Stdio::null() };
    cmd.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (code, message) = spawn_failure(&e, &spec.command[0]);
            return Ok(failed(code, message));
        }
    };
    let io = |e: std::io::Error| format!("exec: {e}");
    let (tx, output) = mpsc::channel(OUTPUT_QUEUE);
    let (input, rx) = mpsc::channel(OUTPUT_QUEUE);
    let kill = killer(child.id());
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(pump(out, tx.clone(), Frame::Stdout).map_err(io)?);
    }
    if let Some(err) = child.stderr.take() {
        readers.push(pump(err, tx.clone(), Frame::Stderr).map_err(io)?);
    }
    feed(child.stdin.take(), rx, None).map_err(io)?;
    wait_then_exit(child, readers, tx).map_err(io)?;
    Ok(Running { input, output, kill })
}

fn tty(mut cmd: Command, spec: &ExecSpec) -> Result<Running, String> {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let io = |e: std::io::Error| format!("exec: a terminal: {e}");
    let master =
        openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).map_err(|e| io(e.into()))?;
    grantpt(&master).map_err(|e| io(e.into()))?;
    unlockpt(&master).map_err(|e| io(e.into()))?;
    let name = ptsname(&master, Vec::new()).map_err(|e| io(e.into()))?;
    // O_NOCTTY: opening the terminal never makes it the agent's.
    let mut open = std::fs::OpenOptions::new();
    std::os::unix::fs::OpenOptionsExt::custom_flags(open.read(true).write(true), nix::libc::O_NOCTTY);
    let slave: OwnedFd = open.open(OsStr::from_bytes(name.as_bytes())).map_err(io)?.into();
    if let (Some(cols), Some(rows)) = (spec.cols, spec.rows) {
        set_size(&master, cols, rows);
    }
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(io);
    cmd.stdin(Stdio::from(dup(&slave)?)).stdout(Stdio::from(dup(&slave)?)).stderr(Stdio::from(slave));
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (code, message) = spawn_failure(&e, &spec.command[0]);
            return Ok(failed(code, message));
        }
    };
    // The command holds the terminal now; the command's end closes it and ends the reader.
    drop(cmd);
    let master = Arc::new(master);
    let (tx, output) = mpsc::channel(OUTPUT_QUEUE);
    let (input, rx) = mpsc::channel(OUTPUT_QUEUE);
    let kill = killer(child.id());
    let reader = pump(std::fs::File::from(dup(&master)?), tx.clone(), Frame::Stdout).map_err(io)?;
    let writer = spec.interactive.then(|| dup(&master)).transpose()?.map(std::fs::File::from);
    feed(writer, rx, Some(master)).map_err(io)?;
    wait_then_exit(child, vec![reader], tx).map_err(io)?;
    Ok(Running { input, output, kill })
}

/// `mpsfleet exec-tty --path PROGRAM -- COMMAND...`: becomes the leader of a new session whose
/// controlling terminal is its stdin (the session's pseudo-terminal), then runs PROGRAM with
/// COMMAND as its argv in its place, so that a shell gets job control and the terminal's
/// signals. Returns only on failure: the exit code a shell gives (127 not found, 126 not
/// runnable).
pub fn tty_main(args: impl Iterator<Item = OsString>) -> i32 {
    use std::os::unix::process::CommandExt;
    let args: Vec<OsString> = args.collect();
    let (Some(flag), Some(path), Some(dashes), Some(argv0)) =
        (args.first(), args.get(1), args.get(2), args.get(3))
    else {
        eprintln!("exec-tty: usage: mpsfleet exec-tty --path PROGRAM -- COMMAND [ARGS...]");
        return 2;
    };
    if flag != "--path" || dashes != "--" {
        eprintln!("exec-tty: usage: mpsfleet exec-tty --path PROGRAM -- COMMAND [ARGS...]");
        return 2;
    }
    if let Err(e) = rustix::process::setsid() {
        eprintln!("exec-tty: setsid: {e}");
        return 126;
    }
    if let Err(e) = rustix::process::ioctl_tiocsctty(std::io::stdin()) {
        eprintln!("exec-tty: cannot take the terminal: {e}");
        return 126;
    }
    let e = Command::new(path).arg0(argv0).args(&args[4..]).exec();
    let (code, message) = spawn_failure(&e, &argv0.to_string_lossy());
    eprint!("{message}");
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_found_in_the_tasks_path_past_a_directory_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let (empty, full) = (dir.path().join("empty"), dir.path().join("full"));
        std::fs::create_dir_all(&empty).unwrap();
        std::fs::create_dir_all(&full).unwrap();
        std::fs::write(full.join("tool"), "").unwrap();
        let path = format!("{}:{}", empty.display(), full.display());
        let env = vec![("PATH".into(), path.into())];
        assert_eq!(find_program("tool", &env), Some(full.join("tool")));
        assert_eq!(find_program("missing", &env), None);
        assert_eq!(find_program("./here", &env), Some(PathBuf::from("./here")));
    }
}
