//! `task exec` on this host: `POST /v1/exec/{task}?spec=JSON` with `Upgrade: mpsfleet-exec`,
//! for the server only (the token it issued at registration, as for logs). The agent answers
//! `101 Switching Protocols` and runs the command:
//! - in the task's container when it runs on Docker Engine (Docker's exec API: the container's
//!   own user, environment and working directory);
//! - for a process, as the task's process runs: its uid and gid, its environment (its MPS
//!   variables included) and its working directory, read from `/proc` of the task's process
//!   (checked against its recorded start time, so a reused pid is never taken for it).
//!
//! Frames ([`mpsfleet_types::exec`]) then pass both ways; output goes through channels of a
//! few frames, so a command that writes faster than the client reads waits for it. The
//! command is killed when the connection ends (the client left, the server closed an idle
//! session or one whose task stopped).

mod process;

use crate::docker::DockerRuntime;
use crate::logs::{first_container, from_server};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use mpsfleet_client::exec::{read_frame, write_frame};
use mpsfleet_types::exec::{ExecSpec, Frame, UPGRADE};
use mpsfleet_types::TaskId;
use serde::Deserialize;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

pub use process::tty_main;

/// Frames of output waiting for the client, at most.
pub(crate) const OUTPUT_QUEUE: usize = 8;
/// The most bytes read from a command's output at once (one frame).
pub(crate) const READ_CHUNK: usize = 32 << 10;

/// What the client sends to a running command.
#[derive(Debug)]
pub(crate) enum Input {
    Stdin(Vec<u8>),
    StdinEnd,
    Resize { cols: u16, rows: u16 },
}

/// A command started for a session: where its input goes, where its output comes from (ending
/// with `Exit` or `Ended`), and how to kill it when the session ends first.
pub(crate) struct Running {
    pub(crate) input: mpsc::Sender<Input>,
    pub(crate) output: mpsc::Receiver<Frame>,
    pub(crate) kill: Box<dyn FnOnce() + Send>,
}

struct ExecState {
    tasks_dir: PathBuf,
    token_sha256: String,
    docker: Option<DockerRuntime>,
    /// The `mpsfleet` binary: a terminal session starts the command through its `exec-tty`.
    exe: OsString,
}

#[derive(Deserialize)]
struct ExecQuery {
    spec: String,
}

/// The exec endpoint (see the module's docs).
pub fn router(
    tasks_dir: PathBuf,
    token_sha256: String,
    docker: Option<DockerRuntime>,
    exe: OsString,
) -> Router {
    Router::new().route("/v1/exec/{task}", post(exec)).with_state(Arc::new(ExecState {
        tasks_dir,
        token_sha256,
        docker,
        exe,
    }))
}

fn plain(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

async fn exec(
    State(st): State<Arc<ExecState>>,
    headers: HeaderMap,
    Path(task): Path<String>,
    Query(q): Query<ExecQuery>,
    mut req: Request,
) -> Response {
    if !from_server(&st.token_sha256, &headers) {
        return plain(StatusCode::UNAUTHORIZED, "only the server may run commands here".into());
    }
    let Ok(id) = TaskId::parse(&task) else {
        return plain(StatusCode::BAD_REQUEST, format!("bad task id {task:?}"));
    };
    let spec: ExecSpec = match serde_json::from_str(&q.spec) {
        Ok(s) => s,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("spec: {e}")),
    };
    if let Err((field, why)) = spec.check() {
        return plain(StatusCode::BAD_REQUEST, format!("{field} {why}"));
    }
    if !headers.get("upgrade").and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case(UPGRADE))
    {
        return plain(StatusCode::BAD_REQUEST, format!("ask for `Upgrade: {UPGRADE}`"));
    }
    let container = match spec.container.clone().or_else(|| first_container(&st.tasks_dir, &id)) {
        Some(c) => c,
        None => return plain(StatusCode::NOT_FOUND, format!("task {id} is not known on this host")),
    };
    let started = match start(&st, &id, &container, &spec).await {
        Ok(r) => r,
        Err(why) => return plain(StatusCode::NOT_FOUND, why),
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => serve(hyper_util::rt::TokioIo::new(io), started).await,
            Err(e) => {
                tracing::debug!(task.id = %id, error = %e, "exec: the upgrade failed");
                (started.kill)();
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", UPGRADE)
        .body(axum::body::Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Starts the command: in Docker when the container runs there, else beside the task's
/// process. Err says why it cannot run.
async fn start(st: &ExecState, id: &TaskId, container: &str, spec: &ExecSpec) -> Result<Running, String> {
    if let Some(rt) = &st.docker {
        match rt.exec_session(id, container, spec).await {
            Ok(Some(r)) => return Ok(r),
            Ok(None) => {} // no such container in Docker: a process, or nothing
            Err(e) => return Err(e),
        }
    }
    let dir = crate::tasks::container_rel(id, container);
    let (tasks_dir, exe, spec) = (st.tasks_dir.clone(), st.exe.clone(), spec.clone());
    let who = format!("container {container:?} of task {id}");
    tokio::task::spawn_blocking(move || process::start(&tasks_dir, &dir, &exe, &spec, &who))
        .await
        .map_err(|e| format!("exec failed: {e}"))?
}

/// Passes frames between the connection and the command until the command ends or the
/// connection does; the command is killed in the second case.
async fn serve<IO>(io: IO, running: Running)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Running { input, mut output, kill } = running;
    let (mut rd, mut wr) = tokio::io::split(io);
    // Client frames go to the command on a task of their own, so that a command not reading
    // its stdin never stops its output from flowing.
    let mut reader = tokio::spawn(async move {
        loop {
            let sent = match read_frame(&mut rd).await {
                Ok(Some(Frame::Stdin(b))) => input.send(Input::Stdin(b)).await,
                Ok(Some(Frame::StdinEnd)) => input.send(Input::StdinEnd).await,
                Ok(Some(Frame::Resize { cols, rows })) => input.send(Input::Resize { cols, rows }).await,
                Ok(Some(_)) => Ok(()), // nothing else is the client's to send
                Ok(None) | Err(_) => return,
            };
            if sent.is_err() {
                // The command no longer reads: wait for the connection to end.
                while let Ok(Some(_)) = read_frame(&mut rd).await {}
                return;
            }
        }
    });
    let mut finished = false;
    loop {
        tokio::select! {
            f = output.recv() => {
                let f = f.unwrap_or_else(|| Frame::Ended("the command's output ended without an exit code".into()));
                let last = matches!(f, Frame::Exit(_) | Frame::Ended(_));
                if write_frame(&mut wr, &f).await.is_err() {
                    break;
                }
                if last {
                    finished = true;
                    break;
                }
            }
            _ = &mut reader => break,
        }
    }
    reader.abort();
    if !finished {
        kill();
    }
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
}
