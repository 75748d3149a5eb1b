//! `mpsfleet task exec`: a session's terminal end. Stdin (with `-i`) and the terminal's size
//! (with `-t`) go to the command as frames; its stdout and stderr come back to this process's;
//! its exit code becomes this process's ([`ExitWith`]).

use anyhow::Context;
use mpsfleet_client::exec::{read_frame, write_frame};
use mpsfleet_client::Client;
use mpsfleet_types::exec::{ExecSpec, Frame, MAX_FRAME};
use std::io::{IsTerminal, Read, Write};
use std::sync::Arc;
use tokio::sync::Mutex;

/// The exit code of a session that ended without the command's (its task stopped, it was
/// idle too long, the connection broke), as ssh answers a lost connection.
pub const SESSION_LOST: u8 = 255;

/// The process is to exit with this code, and print nothing more.
#[derive(Debug)]
pub struct ExitWith(pub u8);

impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit code {}", self.0)
    }
}

impl std::error::Error for ExitWith {}

/// Runs the session; what it returns is the process's end: [`ExitWith`] the command's code,
/// or the error that kept it from running.
pub async fn run(c: &Client, id: &str, spec: ExecSpec) -> anyhow::Error {
    match session(c, id, spec).await {
        Ok(code) => ExitWith(code).into(),
        Err(e) => e,
    }
}

/// This terminal's size, columns and rows, if stdout is one.
fn terminal_size() -> Option<(u16, u16)> {
    let w = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    (w.ws_col > 0 && w.ws_row > 0).then_some((w.ws_col, w.ws_row))
}

/// The terminal in raw mode while held: keys go to the command as typed (Ctrl-C included).
struct RawMode(rustix::termios::Termios);

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        use rustix::termios::{tcgetattr, tcsetattr, OptionalActions};
        let before = tcgetattr(std::io::stdin()).context("reading the terminal's settings")?;
        let mut raw = before.clone();
        raw.make_raw();
        tcsetattr(std::io::stdin(), OptionalActions::Now, &raw).context("setting the terminal raw")?;
        Ok(RawMode(before))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(std::io::stdin(), rustix::termios::OptionalActions::Now, &self.0);
    }
}

async fn session(c: &Client, id: &str, mut spec: ExecSpec) -> anyhow::Result<u8> {
    if spec.tty {
        if let Some((cols, rows)) = terminal_size() {
            (spec.cols, spec.rows) = (Some(cols), Some(rows));
        }
    }
    let stream = c.exec(id, &spec).await?;
    let (mut rd, wr) = tokio::io::split(stream);
    let wr = Arc::new(Mutex::new(wr));
    // Raw only when keys go to the command (`-it`), as docker does: with `-t` alone, Ctrl-C
    // still ends the CLI.
    let keys = spec.tty && spec.interactive && std::io::stdin().is_terminal();
    let raw = if keys { Some(RawMode::enter()?) } else { None };
    if spec.interactive {
        forward_stdin(wr.clone());
    }
    if spec.tty {
        forward_resizes(wr.clone());
    }
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    loop {
        match read_frame(&mut rd).await {
            Ok(Some(Frame::Stdout(b))) => {
                out.write_all(&b).and_then(|()| out.flush()).context("writing stdout")?;
            }
            Ok(Some(Frame::Stderr(b))) => {
                err.write_all(&b).and_then(|()| err.flush()).context("writing stderr")?;
            }
            Ok(Some(Frame::Exit(code))) => return Ok(u8::try_from(code).unwrap_or(SESSION_LOST)),
            Ok(Some(Frame::Ended(why))) => {
                drop(raw);
                eprintln!("mpsfleet: the session ended: {why}");
                return Ok(SESSION_LOST);
            }
            Ok(Some(_)) => {} // not the server's to send
            Ok(None) => {
                drop(raw);
                eprintln!("mpsfleet: the server closed the session without an exit code");
                return Ok(SESSION_LOST);
            }
            Err(e) => {
                drop(raw);
                eprintln!("mpsfleet: the session broke: {e}");
                return Ok(SESSION_LOST);
            }
        }
    }
}

type Writer = Arc<Mutex<tokio::io::WriteHalf<mpsfleet_client::exec::ExecStream>>>;

/// Copies stdin to the command, then says it has ended. A plain thread reads it (a read that
/// blocks must not hold the runtime up when the session ends).
fn forward_stdin(wr: Writer) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Option<Vec<u8>>>(4);
    let _ = std::thread::Builder::new().name("exec-stdin".into()).spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; MAX_FRAME];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        while let Some(chunk) = rx.recv().await {
            let f = match chunk {
                Some(b) => Frame::Stdin(b),
                None => Frame::StdinEnd,
            };
            let last = f == Frame::StdinEnd;
            if write_frame(&mut *wr.lock().await, &f).await.is_err() || last {
                return;
            }
        }
    });
}

/// Sends the terminal's new size each time it changes.
fn forward_resizes(wr: Writer) {
    tokio::spawn(async move {
        let Ok(mut changes) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        else {
            return;
        };
        while changes.recv().await.is_some() {
            if let Some((cols, rows)) = terminal_size() {
                if write_frame(&mut *wr.lock().await, &Frame::Resize { cols, rows }).await.is_err() {
                    return;
                }
            }
        }
    });
}
