//! The agent's one endpoint: task logs, for the server to fetch on behalf of `task logs`.
//! Only the server may call it, with the token it issued at registration.

use crate::runtime::{logs, LogStream};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mpsfleet_types::{TaskDefinition, TaskId};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;

struct LogsState {
    tasks_dir: PathBuf,
    token: String,
}

#[derive(Deserialize)]
struct LogsQuery {
    container: Option<String>,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    tail: Option<u64>,
}

pub fn router(tasks_dir: PathBuf, token: String) -> Router {
    Router::new()
        .route("/v1/logs/{task}", get(task_logs))
        .with_state(Arc::new(LogsState { tasks_dir, token }))
}

fn plain(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

async fn task_logs(
    State(st): State<Arc<LogsState>>,
    headers: HeaderMap,
    Path(task): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Response {
    let presented =
        headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if st.token.is_empty() || presented != Some(st.token.as_str()) {
        return plain(StatusCode::UNAUTHORIZED, "only the server may read logs here".into());
    }
    let Ok(id) = TaskId::parse(&task) else {
        return plain(StatusCode::BAD_REQUEST, format!("bad task id {task:?}"));
    };
    let stream = match q.stream.as_deref().unwrap_or("stdout") {
        "stdout" => LogStream::Stdout,
        "stderr" => LogStream::Stderr,
        other => {
            return plain(StatusCode::BAD_REQUEST, format!("stream must be stdout or stderr, got {other:?}"))
        }
    };
    if !st.tasks_dir.join(id.to_string()).is_dir() {
        return plain(StatusCode::NOT_FOUND, format!("task {id} is not known on this host"));
    }
    let container = match q.container {
        Some(c) => c,
        None => {
            // The first container of the task's definition.
            let record = st.tasks_dir.join(id.to_string()).join("record.json");
            let first = std::fs::read(&record).ok().and_then(|b| {
                #[derive(Deserialize)]
                struct Rec {
                    definition: TaskDefinition,
                }
                serde_json::from_slice::<Rec>(&b)
                    .ok()?
                    .definition
                    .container_definitions
                    .first()
                    .map(|c| c.name.clone())
            });
            match first {
                Some(c) => c,
                None => return plain(StatusCode::NOT_FOUND, format!("task {id} is not known on this host")),
            }
        }
    };
    if let Err(e) = mpsfleet_types::check_name("container name", &container) {
        return plain(StatusCode::BAD_REQUEST, e.to_string());
    }
    let dir = crate::tasks::container_dir(&st.tasks_dir, &id, &container);
    let read = tokio::task::spawn_blocking(move || {
        if !dir.is_dir() {
            return Err(format!("no container {container:?} of task {id} on this host"));
        }
        logs(&dir, stream, q.tail).map_err(|e| e.to_string())
    })
    .await;
    match read {
        Ok(Ok(bytes)) => ([("content-type", "text/plain; charset=utf-8")], bytes).into_response(),
        Ok(Err(e)) => plain(StatusCode::NOT_FOUND, e),
        Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
