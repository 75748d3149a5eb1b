//! What the server fetches from agents for a client: a task's logs (bounded, pinned to the agent's certificate), a host's metrics and the scrape targets.

use super::*;
use crate::cluster::Error;

/// The most log bytes one call returns.
pub const MAX_LOG_TAIL: u64 = 16 << 20;

#[derive(Deserialize, Serialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct LogsQuery {
    /// Only this container's output (default: every container).
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<String>,
    #[serde(default = "default_stream")]
    stream: String,
    #[serde(default = "default_tail")]
    tail: u64,
    /// Only output written strictly after this time (ms since the epoch); checked in the
    /// handler so that a bad value names the parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    since_ms: Option<String>,
}

pub(super) fn default_stream() -> String {
    "stdout".into()
}

pub(super) fn default_tail() -> u64 {
    64 << 10
}

/// The tail of a container's stdout, stderr or both interleaved (`stream=all`), fetched from
/// the task's agent, with `since_ms` only what was written after that time; when the agent
/// cannot be asked or does not answer (host gone, agent down), the last output snapshot the
/// agent reported, both streams interleaved (with `since_ms`, its later lines). The answer
/// says which it is, and the time of its last output (`lastAtMs`).
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/logs",
    tag = "tasks",
    summary = "A task's output.",
    params(("id" = String, Path, description = "A task id (t- and 16 hex digits)."), LogsQuery),
    responses((status = 200, description = "OK.", body = mpsfleet_types::logs::TaskLogs), crate::openapi::Errors)
)]
pub(super) async fn task_logs(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Q(q): Q<LogsQuery>,
) -> Result<Response, ApiError> {
    use mpsfleet_types::logs::{LogStreams, LogsSource, TaskLogs};
    let streams: LogStreams = q.stream.parse().map_err(|e: mpsfleet_types::logs::BadLogStreams| {
        ApiError::invalid("stream", format!("must be stdout, stderr or all, got {:?}", e.0))
    })?;
    let since_ms = match &q.since_ms {
        None => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            ApiError::invalid("since_ms", format!("must be a time in ms since the epoch, got {v:?}"))
        })?),
    };
    if let Some(c) = &q.container {
        mpsfleet_types::check_name("container name", c)
            .map_err(|e| ApiError::invalid("container", e.to_string()))?;
    }
    if q.tail == 0 || q.tail > MAX_LOG_TAIL {
        return Err(ApiError::invalid(
            "tail",
            format!("must be from 1 to {MAX_LOG_TAIL} bytes, got {}", q.tail),
        ));
    }
    let plan = st
        .call(&headers, viewer, Touch::Object(Kind::Task, id.clone()), move |c, _| c.logs_plan(&id))
        .await?;
    // Why the agent's answer is not shown: the error to return without a snapshot, and the
    // note to show with one; None when the snapshot would not answer the question either.
    let (failure, note) = match &plan.agent {
        // Not the agent failing: there is no agent to ask (409, unlike an agent that does not
        // answer, 502).
        Err(why) => (
            ApiError::from(Error::Conflict(format!("{why}, and its agent reported no output of it"))),
            Some(why.clone()),
        ),
        Ok(agent) => match fetch_agent_logs(&st.http, st.tls.is_some(), agent, &plan.task_id, &q).await {
            Ok(answer) => {
                let (text, lines) = match answer.body {
                    AgentLogsBody::Text(t) => (Some(t), None),
                    AgentLogsBody::Lines(l) => (None, Some(l)),
                };
                return Ok(Json(TaskLogs {
                    task_id: plan.task_id,
                    source: LogsSource::Agent,
                    note: None,
                    container: q.container.clone(),
                    stream: Some(streams),
                    text,
                    lines,
                    last_at_ms: answer.last_at_ms,
                    reported_at_ms: None,
                    snapshot: None,
                })
                .into_response());
            }
            Err(AgentLogsFailure::Unreachable(why)) => {
                let note = format!("host unreachable: {why}");
                (ApiError::from(Error::Unavailable(why)), Some(note))
            }
            Err(AgentLogsFailure::BadAnswer(why)) => {
                let note = format!("the agent's answer was refused: {why}");
                (ApiError::from(Error::Unavailable(why)), Some(note))
            }
            Err(AgentLogsFailure::TaskUnknown(e)) => (e, Some("the agent no longer has the task".into())),
            Err(AgentLogsFailure::Refused(e)) => (e, None),
        },
    };
    let (Some(note), Some((reported_at_ms, mut snapshot))) = (note, plan.snapshot) else {
        return Err(failure);
    };
    if let Some(since) = since_ms {
        snapshot.lines.retain(|l| l.at_ms > since);
    }
    let last_at_ms = snapshot.lines.iter().map(|l| l.at_ms).max().or(since_ms);
    Ok(Json(TaskLogs {
        task_id: plan.task_id,
        source: LogsSource::Snapshot,
        note: Some(note),
        container: None,
        stream: None,
        text: None,
        lines: None,
        last_at_ms,
        reported_at_ms: Some(reported_at_ms),
        snapshot: Some(snapshot),
    })
    .into_response())
}

/// How long `task logs` waits for an agent before it shows the last snapshot instead.
pub(super) const AGENT_LOGS_TIMEOUT: Duration = Duration::from_secs(3);

/// What an agent's answer to `task logs` may carry beyond the `tail` bytes of output asked
/// for (headers are not counted): its framing, and for `stream=all` the JSON of each line.
pub const AGENT_ANSWER_SLACK: u64 = 64 << 10;

/// The most bytes of an agent's answer the server reads: for one stream, the `tail` asked for
/// (the agent answers no more, and at most `MAX_LOG_TAIL`) and [`AGENT_ANSWER_SLACK`]; for
/// `stream=all` (JSON: escaping and each line's time, container and stream), four times the
/// tail and the slack. Past it the server stops reading and the agent's answer is refused.
pub fn agent_answer_limit(stream_all: bool, tail: u64) -> u64 {
    let tail = tail.min(MAX_LOG_TAIL);
    if stream_all {
        4 * tail + AGENT_ANSWER_SLACK
    } else {
        tail + AGENT_ANSWER_SLACK
    }
}

/// Why an agent gave no logs.
pub(super) enum AgentLogsFailure {
    /// It could not be reached, or failed: the snapshot may stand in.
    Unreachable(String),
    /// It answered what no agent answers (a redirect, which is not followed, or more than
    /// [`agent_answer_limit`]): the snapshot may stand in.
    BadAnswer(String),
    /// It does not know the task (its data dir is not the one the task ran in).
    TaskUnknown(ApiError),
    /// It refused the request itself (no such container): the snapshot would not help.
    Refused(ApiError),
}

/// What an agent answered for `task logs`.
pub(super) struct AgentLogs {
    body: AgentLogsBody,
    /// Its `x-mpsfleet-last-ms` header.
    last_at_ms: Option<u64>,
}

/// One stream's text, or both streams' lines (`stream=all`).
pub(super) enum AgentLogsBody {
    Text(String),
    Lines(Vec<mpsfleet_types::logs::OutputLine>),
}

/// The tail of one stream, or both, of a task's container, from its agent.
/// The client to call `agent`'s endpoint with: an https:// endpoint is trusted by the
/// certificate its agent reported, and no other.
pub(super) fn agent_http<'a>(
    plain: &'a reqwest::Client,
    serves_https: bool,
    agent: &crate::cluster::AgentEndpoint,
) -> Result<std::borrow::Cow<'a, reqwest::Client>, String> {
    match (agent.url.starts_with("https://"), agent.cert_sha256.as_deref()) {
        // An HTTPS server sends no agent token in the clear: the agent is older than HTTPS
        // endpoints, or misconfigured.
        (false, _) if serves_https => {
            Err("the agent serves its endpoint over plain HTTP, which an HTTPS server \
             does not call (the agent token would cross the network in the clear): upgrade the agent"
                .into())
        }
        (false, _) => Ok(std::borrow::Cow::Borrowed(plain)),
        (true, None) => Err("the agent reported no certificate for its endpoint".into()),
        (true, Some(hash)) => {
            let builder = mpsfleet_client::tls::pinned_cert_builder(hash).map_err(|e| e.to_string())?;
            Ok(std::borrow::Cow::Owned(agent_client_builder(builder).build().map_err(|e| e.to_string())?))
        }
    }
}

/// The most an agent's metrics answer may hold.
pub(super) const AGENT_METRICS_MAX: usize = 8 << 20;

/// A host's agent metrics (`mpsfleet-agent`'s `metrics.rs`), fetched from its agent: per GPU
/// and per task, which the server's own `/metrics` leaves out.
#[utoipa::path(
    get,
    path = "/v1/hosts/{id}/metrics",
    tag = "hosts",
    summary = "The host's agent metrics (Prometheus text format): per GPU and per task.",
    params(("id" = String, Path, description = "Host id.")),
    responses((status = 200, description = "The metrics.", body = String, content_type = "text/plain"), crate::openapi::Errors)
)]
pub(super) async fn host_metrics(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let agent = st
        .call(&headers, viewer, Touch::Object(Kind::Host, id.clone()), move |c, _| {
            let h = c.read().host(&id)?;
            c.agent_endpoint(&h.id).map_err(Error::Conflict)
        })
        .await?;
    let url = format!("{}/metrics", agent.url);
    let unavailable =
        |e: &dyn std::fmt::Display| ApiError::from(Error::Unavailable(format!("cannot fetch {url}: {e}")));
    let http = agent_http(&st.http, st.tls.is_some(), &agent).map_err(|e| unavailable(&e))?;
    let mut resp = http
        .get(&url)
        .bearer_auth(&agent.token)
        .timeout(AGENT_LOGS_TIMEOUT)
        .send()
        .await
        .map_err(|e| unavailable(&mpsfleet_client::chain(&e)))?;
    if !resp.status().is_success() {
        return Err(unavailable(&format!("HTTP {}", resp.status())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| unavailable(&e))? {
        if body.len() + chunk.len() > AGENT_METRICS_MAX {
            return Err(unavailable(&format!("the answer is over {AGENT_METRICS_MAX} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(([(axum::http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response())
}

/// The agents to scrape, in Prometheus's HTTP service discovery format: one target group per
/// host, all at this server, each with `__metrics_path__` set to the host's
/// `/v1/hosts/{id}/metrics` and labels `host_id`, `pool` and `hostname`.
#[utoipa::path(
    get,
    path = "/v1/metrics/targets",
    tag = "server",
    summary = "The hosts' agent metrics as Prometheus HTTP service discovery target groups.",
    responses((status = 200, description = "The target groups: `targets`, this server's address, and `labels`.", body = [Object]), crate::openapi::Errors)
)]
pub(super) async fn metrics_targets(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b)))
        .map(str::to_string);
    let targets = st.call(&headers, viewer, Touch::Cluster, |c, _| Ok(c.read().metrics_targets())).await?;
    // The address the caller reached this server at (Prometheus scrapes it there).
    let Some(host) = host else {
        return Err(ApiError::invalid(
            "Host",
            "the request names no plain host:port to point the targets at",
        ));
    };
    let groups: Vec<serde_json::Value> = targets
        .into_iter()
        .map(|(id, pool, hostname)| {
            serde_json::json!({
                "targets": [host],
                "labels": {
                    "__metrics_path__": format!("/v1/hosts/{id}/metrics"),
                    "host_id": id.to_string(),
                    "pool": pool.to_string(),
                    "hostname": hostname,
                }
            })
        })
        .collect();
    Ok(Json(groups).into_response())
}

pub(super) async fn fetch_agent_logs(
    plain: &reqwest::Client,
    serves_https: bool,
    agent: &crate::cluster::AgentEndpoint,
    task: &TaskId,
    q: &LogsQuery,
) -> Result<AgentLogs, AgentLogsFailure> {
    let url = agent.url.as_str();
    let unreachable = |e: &dyn std::fmt::Display| {
        AgentLogsFailure::Unreachable(format!("cannot fetch logs from {url}: {e}"))
    };
    let http = agent_http(plain, serves_https, agent).map_err(|e| unreachable(&e))?;
    let mut resp = http
        .get(format!("{url}/v1/logs/{task}"))
        .bearer_auth(&agent.token)
        .query(q)
        .timeout(AGENT_LOGS_TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(&mpsfleet_client::chain(&e)))?;
    let status = resp.status();
    let last_at_ms = resp
        .headers()
        .get("x-mpsfleet-last-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if status.is_redirection() {
        return Err(AgentLogsFailure::BadAnswer(format!(
            "{url} answered a redirect (HTTP {status}), which is not followed"
        )));
    }
    let limit = agent_answer_limit(q.stream == "all", q.tail);
    let too_large = || {
        AgentLogsFailure::BadAnswer(format!(
            "{url} answered more than {limit} bytes, the most an agent answers for tail={} (stream {})",
            q.tail, q.stream
        ))
    };
    if resp.content_length().is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    // Read as it comes, so that no more than the limit is ever held.
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| unreachable(&e))? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    let said = String::from_utf8_lossy(&body).trim().to_string();
    if status == StatusCode::NOT_FOUND {
        let e = ApiError::not_found("logs of task", format!("{task} ({said})"));
        // The agent's words for a task it has no record of (see mpsfleet-agent's logs.rs).
        return Err(if said.contains("is not known on this host") {
            AgentLogsFailure::TaskUnknown(e)
        } else {
            AgentLogsFailure::Refused(e)
        });
    }
    if status == StatusCode::BAD_REQUEST {
        return Err(AgentLogsFailure::Refused(ApiError::invalid("query", said)));
    }
    if !status.is_success() {
        return Err(unreachable(&format!("HTTP {status}: {said}")));
    }
    let body = if q.stream == "all" {
        AgentLogsBody::Lines(
            serde_json::from_slice(&body)
                .map_err(|e| unreachable(&format!("a bad answer for stream=all: {e}")))?,
        )
    } else {
        AgentLogsBody::Text(String::from_utf8_lossy(&body).into_owned())
    };
    Ok(AgentLogs { body, last_at_ms })
}

// ---- services ---------------------------------------------------------------------------
