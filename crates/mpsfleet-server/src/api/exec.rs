//! `task exec`: `POST /v1/tasks/{id}/exec?spec=JSON` with `Upgrade: mpsfleet-exec`
//! ([`mpsfleet_types::exec`]). Operators and admins only (a pool-scoped operator in its pool),
//! on a RUNNING task whose `enableExecuteCommand` is on. The server asks the task's agent the
//! same way over its pinned connection (`/v1/exec/{task}`), answers the client `101`, and
//! passes frames between the two until the command exits, the task stops, the session is idle
//! for [`ExecLimits::idle`], or either side leaves. Each session writes two audit entries:
//! its start (who, the task, the command line) and its end (the exit code or why it ended).
//! Output is passed on, never recorded.

use super::*;
use crate::cluster::{AgentEndpoint, AuditContext, Error};
use mpsfleet_client::exec::{open_upgrade, read_frame, write_frame};
use mpsfleet_types::exec::{ExecSpec, Frame, UPGRADE};
use tokio::sync::mpsc;

/// How many sessions may be open at once, and when an idle one is closed.
#[derive(Debug, Clone, Copy)]
pub struct ExecLimits {
    /// Sessions open on one task at once.
    pub per_task: usize,
    /// Sessions one token (or the admin) has open at once.
    pub per_token: usize,
    /// A session with no frame either way for this long is closed.
    pub idle: Duration,
}

/// AWS Session Manager's default idle timeout, which ECS Exec users know.
pub const DEFAULT_EXEC_IDLE: Duration = Duration::from_secs(20 * 60);

impl Default for ExecLimits {
    fn default() -> Self {
        ExecLimits { per_task: 4, per_token: 8, idle: DEFAULT_EXEC_IDLE }
    }
}

/// The sessions open on this server, counted per task and per caller.
#[derive(Debug, Default)]
pub struct ExecSessions {
    pub limits: ExecLimits,
    open: Mutex<(HashMap<TaskId, usize>, HashMap<String, usize>)>,
}

/// One open session's place in [`ExecSessions`], given back when dropped.
struct Seat {
    sessions: Arc<ExecSessions>,
    task: TaskId,
    actor: String,
}

impl ExecSessions {
    pub fn new(limits: ExecLimits) -> Self {
        ExecSessions { limits, open: Mutex::default() }
    }

    /// A seat for `actor` on `task`, or why not (the limit reached, named).
    fn admit(self: &Arc<Self>, task: &TaskId, actor: &str) -> Result<Seat, Error> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let on_task = open.0.get(task).copied().unwrap_or(0);
        if on_task >= self.limits.per_task {
            return Err(Error::Conflict(format!(
                "task {task} has {on_task} exec sessions open, the most one task may have \
                 (--exec-sessions-per-task); end one first"
            )));
        }
        let mine = open.1.get(actor).copied().unwrap_or(0);
        if mine >= self.limits.per_token {
            return Err(Error::Conflict(format!(
                "{actor} has {mine} exec sessions open, the most one token may have \
                 (--exec-sessions-per-token); end one first"
            )));
        }
        *open.0.entry(*task).or_default() += 1;
        *open.1.entry(actor.to_string()).or_default() += 1;
        Ok(Seat { sessions: self.clone(), task: *task, actor: actor.to_string() })
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut open = self.sessions.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.0.get_mut(&self.task) {
            *n -= 1;
            if *n == 0 {
                open.0.remove(&self.task);
            }
        }
        if let Some(n) = open.1.get_mut(&self.actor) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.actor);
            }
        }
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ExecQuery {
    /// The session as JSON: `{"command": [...], "container": "...", "interactive": bool,
    /// "tty": bool, "cols": N, "rows": N}`.
    spec: Option<String>,
}

/// The session asked for: its `spec` parameter, checked, on a request that upgrades to the
/// exec protocol.
fn exec_spec(spec: Option<&str>, upgrade: Option<&str>) -> Result<ExecSpec, Error> {
    let spec = spec.ok_or_else(|| Error::invalid("spec", "missing: the session as JSON"))?;
    let spec: ExecSpec = serde_json::from_str(spec).map_err(|e| Error::invalid("spec", e.to_string()))?;
    spec.check().map_err(|(field, why)| Error::invalid(field, why))?;
    if !upgrade.is_some_and(|u| u.eq_ignore_ascii_case(UPGRADE)) {
        return Err(Error::invalid("Upgrade", format!("must be {UPGRADE} (as `mpsfleet task exec` sends)")));
    }
    Ok(spec)
}

/// Where a session runs: the task's agent and the container, checked.
struct ExecPlan {
    agent: AgentEndpoint,
    container: String,
    pool: PoolName,
}

/// Whether a task may have sessions: RUNNING, and not told to stop (a draining replica is).
fn takes_sessions(t: &Task) -> bool {
    t.last_status == TaskStatus::Running && t.desired_status == TaskStatus::Running
}

/// Checks that `id` can take a session in `container` (its first when None).
fn exec_plan(c: &Cluster, id: &str, container: Option<&str>) -> Result<ExecPlan, Error> {
    let task = c.read().task(id)?;
    if !takes_sessions(&task) {
        return Err(Error::Conflict(format!(
            "task {} is {} (desired {}): task exec needs a RUNNING task",
            task.id,
            task.last_status.as_str(),
            task.desired_status.as_str()
        )));
    }
    if !task.enable_execute_command {
        return Err(Error::Conflict(format!(
            "task {} was started with enableExecuteCommand false: start it (or its service) with \
             enableExecuteCommand true (the CLI's --enable-execute-command) to run commands in it",
            task.id
        )));
    }
    let td = c.read().taskdef("taskDefinition", &task.task_definition.to_string())?;
    let names: Vec<&str> = td.container_definitions.iter().map(|c| c.name.as_str()).collect();
    let container = match container {
        None => names.first().map(|s| s.to_string()).unwrap_or_default(),
        Some(c) if names.contains(&c) => c.to_string(),
        Some(c) => {
            return Err(Error::invalid(
                "container",
                format!("task {} has no container {c:?}; its containers: {}", task.id, names.join(", ")),
            ))
        }
    };
    let host = task.host_id.as_ref().ok_or_else(|| Error::Conflict(format!("task {id} has no host")))?;
    let agent = c.agent_endpoint(host).map_err(Error::Unavailable)?;
    Ok(ExecPlan { agent, container, pool: task.pool })
}

/// Runs a command in a running task's container, its stdin, stdout and stderr carried by the
/// upgraded connection; see `mpsfleet task exec`.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/exec",
    tag = "tasks",
    summary = "Runs a command in a task's container (an HTTP/1.1 upgrade to mpsfleet-exec).",
    params(("id" = String, Path, description = "A task id."), ExecQuery),
    responses((status = 101, description = "Switching to the session's frames."), crate::openapi::Errors)
)]
pub(super) async fn task_exec(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Q(q): Q<ExecQuery>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    // Checked once the caller is known to be allowed: a viewer is refused whatever it sends.
    let upgrade = headers.get(axum::http::header::UPGRADE).and_then(|v| v.to_str().ok());
    let asked = exec_spec(q.spec.as_deref(), upgrade);
    // The session's audit entries name its command line.
    let audit = AUDIT.try_with(Clone::clone).ok().flatten().map(|mut ctx| {
        if let Ok(spec) = &asked {
            ctx.target = format!("{} -- {}", ctx.target, spec.command_line());
        }
        ctx
    });
    let sessions = st.exec.clone();
    let task = id.clone();
    let started = AUDIT.scope(audit.clone(), async {
        st.call(&headers, operator, Touch::Object(Kind::Task, id.clone()), move |c, who| {
            let spec = asked?;
            let plan = exec_plan(c, &task, spec.container.as_deref())?;
            let task_id = TaskId::parse(&task).map_err(|e| Error::invalid("id", e.to_string()))?;
            let seat = sessions.admit(&task_id, &actor(&who))?;
            c.end_audit(Some(format!(
                "session started in container {} (pool {})",
                plan.container, plan.pool
            )));
            Ok((plan, seat, task_id, spec))
        })
        .await
    });
    let (plan, seat, task_id, mut spec) = started.await?;
    spec.container = Some(plan.container.clone());
    let agent_url = format!("{}/v1/exec/{task_id}", plan.agent.url);
    let http = agent_http(&st.http, st.tls.is_some(), &plan.agent)
        .map_err(|e| ApiError::from(Error::Unavailable(format!("cannot reach the task's agent: {e}"))));
    let agent_io = match http {
        Ok(http) => {
            let asked = open_upgrade(http.post(&agent_url).bearer_auth(&plan.agent.token), &spec);
            match tokio::time::timeout(AGENT_ANSWER, asked).await {
                Ok(answer) => answer.map_err(|e| agent_refused(&task_id, e)),
                Err(_) => Err(ApiError::from(Error::Unavailable(format!(
                    "the agent of task {task_id} did not answer within {} s",
                    AGENT_ANSWER.as_secs()
                )))),
            }
        }
        Err(e) => Err(e),
    };
    let agent_io = match agent_io {
        Ok(io) => io,
        Err(e) => {
            finish(&st, audit, format!("ended before it began: {e}")).await;
            return Err(e);
        }
    };
    let client_upgrade = hyper::upgrade::on(&mut req);
    let session = Session { st: st.clone(), task: task_id, audit, _seat: seat };
    tokio::spawn(async move {
        match client_upgrade.await {
            Ok(client) => session.run(hyper_util::rt::TokioIo::new(client), agent_io).await,
            Err(e) => {
                finish(&session.st, session.audit, format!("ended: the client's upgrade failed: {e}")).await
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(axum::http::header::CONNECTION, "upgrade")
        .header(axum::http::header::UPGRADE, UPGRADE)
        .body(axum::body::Body::empty())
        .map_err(|e| ApiError::from(Error::Internal(e.to_string())))
}

/// An agent's refusal as the client's error: its 404 (no such container running there) and
/// 400 keep their meaning, anything else is the agent being unavailable.
fn agent_refused(task: &TaskId, e: mpsfleet_client::exec::UpgradeError) -> ApiError {
    use mpsfleet_client::exec::UpgradeError;
    match e {
        UpgradeError::Refused { status: 404, body, .. } => ApiError::from(Error::Conflict(format!(
            "the agent of task {task} cannot run it: {}",
            String::from_utf8_lossy(&body).trim()
        ))),
        UpgradeError::Refused { status: 400, body, .. } => {
            ApiError::invalid("spec", String::from_utf8_lossy(&body).trim().to_string())
        }
        e => ApiError::from(Error::Unavailable(format!(
            "the agent of task {task} did not take the session: {e}"
        ))),
    }
}

/// Writes a session's last audit entry.
async fn finish(st: &AppState, audit: Option<AuditContext>, result: String) {
    let Some(ctx) = audit else { return };
    let cluster = st.cluster.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Ok(mut c) = cluster.lock() {
            c.begin_audit(Some(ctx));
            c.end_audit(Some(result));
        }
    })
    .await;
}

/// How long the agent has to start the command and switch protocols.
const AGENT_ANSWER: Duration = Duration::from_secs(10);

/// How often an open session looks at its task and its idle time.
const WATCH_EVERY: Duration = Duration::from_millis(500);

struct Session {
    st: AppState,
    task: TaskId,
    audit: Option<AuditContext>,
    /// Held for the session's life.
    _seat: Seat,
}

/// Reads frames from `r` into a channel until it ends; the channel's end says so.
fn frames<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    mut r: R,
) -> (mpsc::Receiver<Frame>, AbortOnDrop) {
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(async move {
        while let Ok(Some(f)) = read_frame(&mut r).await {
            if tx.send(f).await.is_err() {
                return;
            }
        }
    });
    (rx, AbortOnDrop(task))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Session {
    async fn run<C>(self, client: C, agent: mpsfleet_client::exec::ExecStream)
    where
        C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (client_rd, mut client_wr) = tokio::io::split(client);
        let (agent_rd, mut agent_wr) = tokio::io::split(agent);
        let (mut from_client, _c) = frames(client_rd);
        let (mut from_agent, _a) = frames(agent_rd);
        let started = tokio::time::Instant::now();
        let mut last = started;
        let mut watch = tokio::time::interval(WATCH_EVERY);
        let idle = self.st.exec.limits.idle;
        let result = loop {
            tokio::select! {
                f = from_agent.recv() => {
                    last = tokio::time::Instant::now();
                    let Some(f) = f else {
                        let why = "the agent closed the session without an exit code".to_string();
                        let _ = write_frame(&mut client_wr, &Frame::Ended(why.clone())).await;
                        break format!("ended: {why}");
                    };
                    let end = match &f {
                        Frame::Exit(code) => Some(format!("ended: exit code {code}")),
                        Frame::Ended(why) => Some(format!("ended: {why}")),
                        Frame::Stdout(_) | Frame::Stderr(_) => None,
                        _ => continue, // not the agent's to send
                    };
                    if write_frame(&mut client_wr, &f).await.is_err() {
                        break "ended: the client left".to_string();
                    }
                    if let Some(end) = end {
                        break end;
                    }
                }
                f = from_client.recv() => {
                    last = tokio::time::Instant::now();
                    match f {
                        Some(f @ (Frame::Stdin(_) | Frame::StdinEnd | Frame::Resize { .. })) => {
                            if write_frame(&mut agent_wr, &f).await.is_err() {
                                let why = "the agent's connection broke".to_string();
                                let _ = write_frame(&mut client_wr, &Frame::Ended(why.clone())).await;
                                break format!("ended: {why}");
                            }
                        }
                        Some(_) => {} // not the client's to send
                        None => break "ended: the client left".to_string(),
                    }
                }
                _ = watch.tick() => {
                    let why = if last.elapsed() >= idle {
                        Some(format!("closed after {} s without input or output", idle.as_secs()))
                    } else {
                        self.stopped().await
                    };
                    if let Some(why) = why {
                        let _ = write_frame(&mut client_wr, &Frame::Ended(why.clone())).await;
                        break format!("ended: {why}");
                    }
                }
            }
        };
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut client_wr).await;
        let took = started.elapsed().as_secs_f64();
        finish(&self.st, self.audit.clone(), format!("{result} after {took:.1} s")).await;
    }

    /// Why the session's task can no longer take it, if it cannot.
    async fn stopped(&self) -> Option<String> {
        let id = self.task.to_string();
        let task = self.st.read(move |c| c.read().task(&id)).await;
        match task {
            Ok(t) if takes_sessions(&t) => None,
            Ok(t) => Some(format!(
                "task {} stopped{}",
                t.id,
                t.stopped_reason.map(|r| format!(" ({r})")).unwrap_or_default()
            )),
            Err(_) => Some(format!("task {} is no longer known", self.task)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seats_are_bounded_per_task_and_per_caller_and_given_back() {
        let s =
            Arc::new(ExecSessions::new(ExecLimits { per_task: 2, per_token: 3, idle: DEFAULT_EXEC_IDLE }));
        let (t1, t2) = (TaskId(1), TaskId(2));
        let a = s.admit(&t1, "token:a").unwrap();
        let _b = s.admit(&t1, "token:b").unwrap();
        let full = s.admit(&t1, "token:c").err().unwrap().to_string();
        assert!(full.contains("--exec-sessions-per-task"), "{full}");
        drop(a);
        let _a = s.admit(&t1, "token:a").unwrap();
        let _c = s.admit(&t2, "token:a").unwrap();
        let _d = s.admit(&t2, "token:a").unwrap();
        let mine = s.admit(&TaskId(3), "token:a").err().unwrap().to_string();
        assert!(mine.contains("--exec-sessions-per-token"), "{mine}");
        drop((_a, _b, _c, _d));
        let open = s.open.lock().unwrap();
        assert!(open.0.is_empty() && open.1.is_empty(), "every seat given back");
    }
}
