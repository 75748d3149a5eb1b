//! The agents' own endpoints: registration (batched commits), heartbeats (the quiet path outside the cluster lock when it can), assignments and task reports.

use super::*;
use crate::cluster::Error;

#[utoipa::path(
    post,
    path = "/v1/agent/register",
    tag = "agent",
    summary = "Register a host (join, launch or replacement token).",
    request_body = HostRegistration,
    responses((status = 201, description = "OK.", body = mpsfleet_types::api::RegisterHostResponse), crate::openapi::Errors),
    security(("bearer" = []))
)]
pub(super) async fn register_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let reg: HostRegistration = parse(&body)?;
    let token = auth::bearer(headers.get("authorization").and_then(|v| v.to_str().ok()))?;
    let token_sha256 = auth::digest(token);
    let request = HostRequest::new(reg)?;
    let (answer, answered) = tokio::sync::oneshot::channel();
    if st.registrations.push(Waiting { token_sha256, request, answer }) {
        let st = st.clone();
        tokio::task::spawn_blocking(move || commit_registrations(&st));
    }
    let answer = answered
        .await
        .map_err(|_| ApiError::from(Error::Internal("the registration commit stopped unanswered".into())))?;
    Ok(created(answer?))
}

/// Group commit of host registrations: takes every registration waiting, registers them with
/// one store commit under the cluster lock, answers each, and repeats until none waits. Those
/// that arrive during a commit make the next group.
pub(super) fn commit_registrations(st: &AppState) {
    loop {
        let group = st.registrations.take();
        if group.is_empty() {
            return;
        }
        let answers = {
            let Ok(mut c) = st.cluster.lock() else {
                for w in group {
                    let _ = w.answer.send(Err(Error::Internal(
                        "state lock poisoned by an earlier failure; restart the server".into(),
                    )));
                }
                continue;
            };
            let before = c.read().revision();
            let mut requests = Vec::with_capacity(group.len());
            let mut refused = Vec::new();
            let mut senders = Vec::with_capacity(group.len());
            for w in group {
                let allowed = c.authenticate_digest(&w.token_sha256).and_then(|who| {
                    if joiner(&who) {
                        Ok(who)
                    } else {
                        Err(Error::Forbidden(format!("this endpoint is not open to {}", who.describe())))
                    }
                });
                match allowed {
                    Ok(who) => {
                        requests.push((who, w.request));
                        senders.push(w.answer);
                    }
                    Err(e) => refused.push((w.answer, e)),
                }
            }
            let results = c.register_hosts(requests);
            if c.read().revision() != before {
                st.changed.send_replace(c.read().revision());
            }
            if c.take_wake() {
                st.wake.notify_one();
            }
            let answers: Vec<_> = senders
                .into_iter()
                .zip(results)
                .chain(refused.into_iter().map(|(tx, e)| (tx, Err(e))))
                .collect();
            answers
        };
        for (tx, result) in answers {
            let _ = tx.send(result);
        }
    }
}

/// `POST /v1/agent/status`. The agent's logs address is built here: the address the request
/// comes from, with the port of the `logsUrl` it reports (see [`agent_logs_url`]).
#[utoipa::path(
    post,
    path = "/v1/agent/status",
    tag = "agent",
    summary = "A host's heartbeat and checks (host credential).",
    request_body(content = Option<mpsfleet_types::api::HostStatusReport>, description = "May be empty."),
    responses((status = 200, description = "OK.", body = mpsfleet_types::api::HostStatusAnswer), crate::openapi::Errors),
    security(("bearer" = []))
)]
pub(super) async fn host_status(
    State(st): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<HostStatusAnswer>, ApiError> {
    let mut report: HostStatusReport =
        if body.is_empty() { HostStatusReport::default() } else { parse(&body)? };
    report.logs_url = report.logs_url.as_deref().map(|u| agent_logs_url(peer.ip(), u)).transpose()?;
    check_report_hashes(&report)?;
    let token = auth::bearer(headers.get("authorization").and_then(|v| v.to_str().ok()))?;
    // The lock is mostly held for microseconds (by a heartbeat on the other thread): serve
    // other connections for a moment and try again, a few times, before the longer way round.
    for _ in 0..4 {
        match quiet_heartbeat(&st, token, &report) {
            Quiet::Done(answer) => return answer.map(Json),
            Quiet::Commits => break,
            Quiet::Busy => {}
        }
        tokio::task::yield_now().await;
    }
    Ok(Json(
        st.call(&headers, host, Touch::Cluster, move |c, who| c.host_status(&host_id(who)?, &report)).await?,
    ))
}

/// Longest `logsUrl` a heartbeat may carry.
pub(super) const MAX_LOGS_URL_BYTES: usize = 256;

/// Where the server fetches an agent's logs: `SCHEME://PEER:PORT`, PEER the address the
/// agent's heartbeat came from (IPv6 in brackets), SCHEME and PORT those of the `logsUrl` it
/// reported, which must be `https://HOST:PORT` (or `http://HOST:PORT`), a port from 1 to
/// 65535, no path. HOST is never used: the server calls no address an agent names.
pub(super) fn agent_logs_url(peer: IpAddr, reported: &str) -> Result<String, ApiError> {
    let bad = |why: &str| {
        ApiError::invalid("logsUrl", format!("must be https://HOST:PORT (or http://), {why}: {reported:?}"))
    };
    if reported.len() > MAX_LOGS_URL_BYTES {
        return Err(ApiError::invalid(
            "logsUrl",
            format!("is at most {MAX_LOGS_URL_BYTES} bytes, got {}", reported.len()),
        ));
    }
    let (scheme, authority) = match (reported.strip_prefix("https://"), reported.strip_prefix("http://")) {
        (Some(a), _) => ("https", a),
        (None, Some(a)) => ("http", a),
        (None, None) => return Err(bad("with scheme https or http")),
    };
    if authority.contains(['/', '?', '#', '@'])
        || authority.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad("with no path, query or user"));
    }
    let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("with a port"))?;
    let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    if host.is_empty() || (host.contains(':') && !bracketed) || (!bracketed && host.contains(['[', ']'])) {
        return Err(bad("with a host"));
    }
    let port = match port.parse::<u16>() {
        Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(bad("with a port from 1 to 65535")),
    };
    Ok(format!("{scheme}://{}", SocketAddr::new(peer.to_canonical(), port)))
}

/// The most CA hashes a heartbeat may say its agent trusts.
pub(super) const MAX_TRUSTED_CAS: usize = 8;

/// Checks the hashes a heartbeat carries: the CAs the agent trusts (at most
/// [`MAX_TRUSTED_CAS`]), and its logs endpoint's certificate: an `https://` endpoint names the
/// hash of its certificate, which the server pins; a plain one names none.
pub(super) fn check_report_hashes(report: &HostStatusReport) -> Result<(), ApiError> {
    use mpsfleet_types::MAX_GPU_USE_REPORTS;
    if report.gpu_use.len() > MAX_GPU_USE_REPORTS {
        return Err(ApiError::invalid(
            "gpuUse",
            format!("holds at most {MAX_GPU_USE_REPORTS} entries, got {}", report.gpu_use.len()),
        ));
    }
    if let Some((i, c)) = report
        .checks
        .iter()
        .enumerate()
        .find(|(_, c)| c.repair_ages_ms.len() > mpsfleet_types::MAX_REPAIR_AGES)
    {
        return Err(ApiError::invalid(
            format!("checks[{i}].repairAgesMs"),
            format!(
                "holds at most {} entries, got {}",
                mpsfleet_types::MAX_REPAIR_AGES,
                c.repair_ages_ms.len()
            ),
        ));
    }
    if report.checks_unchanged && report.checks_rev.is_none() {
        return Err(ApiError::invalid("checksUnchanged", "goes with a checksRev: the checks it repeats"));
    }
    if report.checks_unchanged && !report.checks.is_empty() {
        return Err(ApiError::invalid(
            "checks",
            format!("is left out with checksUnchanged, got {} checks", report.checks.len()),
        ));
    }
    if report.trusted_ca_sha256.len() > MAX_TRUSTED_CAS {
        return Err(ApiError::invalid(
            "trustedCaSha256",
            format!("holds at most {MAX_TRUSTED_CAS} hashes, got {}", report.trusted_ca_sha256.len()),
        ));
    }
    if let Some(bad) = report.trusted_ca_sha256.iter().find(|h| !mpsfleet_client::tls::is_sha256(h)) {
        return Err(ApiError::invalid(
            "trustedCaSha256",
            format!(
                "holds sha256: and 64 hex digits each, got {:?}",
                bad.chars().take(80).collect::<String>()
            ),
        ));
    }
    let field = "logsCertSha256";
    match (report.logs_url.as_deref(), report.logs_cert_sha256.as_deref()) {
        (Some(url), None) if url.starts_with("https://") => Err(ApiError::invalid(
            field,
            "is required with an https:// logsUrl: the server trusts that certificate there and no other",
        )),
        (Some(url), Some(_)) if !url.starts_with("https://") => {
            Err(ApiError::invalid(field, "goes with an https:// logsUrl only"))
        }
        (None, Some(_)) => Err(ApiError::invalid(field, "goes with a logsUrl only")),
        (_, Some(hash)) => {
            if mpsfleet_client::tls::is_sha256(hash) {
                Ok(())
            } else {
                Err(ApiError::invalid(field, format!("must be sha256: and 64 hex digits, got {hash:?}")))
            }
        }
        _ => Ok(()),
    }
}

/// What became of a heartbeat tried on the calling thread.
pub(super) enum Quiet {
    /// Applied (or refused, as the usual path would).
    Done(Result<HostStatusAnswer, ApiError>),
    /// The cluster lock was taken (or poisoned, which the usual path reports).
    Busy,
    /// It has something to commit: the usual path applies it.
    Commits,
}

/// Most heartbeats commit nothing (see [`Cluster::quiet_heartbeat`]): such a one is applied
/// right here, without a trip to a blocking thread, when the cluster lock is free at once.
pub(super) fn quiet_heartbeat(st: &AppState, token: &str, report: &HostStatusReport) -> Quiet {
    let digest = auth::digest(token);
    let Ok(mut c) = st.cluster.try_lock() else { return Quiet::Busy };
    let who = match c.authenticate_digest(&digest) {
        Ok(Principal::Host(h)) => h,
        Ok(other) => {
            return Quiet::Done(Err(ApiError::from(Error::Forbidden(format!(
                "this endpoint is not open to {}",
                other.describe()
            )))))
        }
        Err(e) => return Quiet::Done(Err(e.into())),
    };
    match c.quiet_heartbeat(&who, report) {
        Ok(Some(answer)) => Quiet::Done(Ok(answer)),
        Ok(None) => Quiet::Commits,
        Err(e) => Quiet::Done(Err(e.into())),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(super) struct AssignmentsQuery {
    /// The epoch the agent already has; the call waits until there is a newer one.
    #[serde(default)]
    after: u64,
    #[serde(default)]
    wait_seconds: u64,
}

/// [`mpsfleet_types::api::Assignments`] as it is encoded, over shared definitions.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AssignmentsOut<'a> {
    pub(super) revision: u64,
    pub(super) tasks: &'a [Task],
    pub(super) task_definitions: Vec<&'a TaskDefinition>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) allow_task_users: bool,
}

/// Long-poll: answers at once if the host's assignments changed after `after`, otherwise
/// when they change or `waitSeconds` pass.
#[utoipa::path(
    get,
    path = "/v1/agent/assignments",
    tag = "agent",
    summary = "The host's tasks, long-polled (host credential).",
    params(AssignmentsQuery),
    responses((status = 200, description = "OK.", body = mpsfleet_types::api::Assignments), crate::openapi::Errors),
    security(("bearer" = []))
)]
pub(super) async fn assignments(
    State(st): State<AppState>,
    headers: HeaderMap,
    Q(q): Q<AssignmentsQuery>,
) -> Result<Response, ApiError> {
    if q.wait_seconds > MAX_WAIT_SECONDS {
        return Err(ApiError::invalid(
            "waitSeconds",
            format!("must be at most {MAX_WAIT_SECONDS}, got {}", q.wait_seconds),
        ));
    }
    let mut changes = st.changed.subscribe();
    let mut stopping = st.stopping.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(q.wait_seconds);
    loop {
        let (id, a) = st
            .call(&headers, host, Touch::Cluster, |c, who| {
                let id = host_id(who)?;
                Ok((id.clone(), c.read().shared_assignments(&id)?))
            })
            .await?;
        let epoch = a.epoch;
        // A stopping server answers at once, so that it is not kept waiting for the poll.
        if epoch > q.after || *stopping.borrow() || tokio::time::Instant::now() >= deadline {
            mpsfleet_core::timeline!("assignments-sent", host = id, revision = epoch);
            let out = AssignmentsOut {
                revision: epoch,
                tasks: &a.tasks,
                task_definitions: a.definitions.iter().map(AsRef::as_ref).collect(),
                allow_task_users: a.allow_task_users,
            };
            return Ok(Json(out).into_response());
        }
        // Timed out, changed or stopping: look again, and answer with what there is.
        tokio::select! {
            _ = tokio::time::timeout_at(deadline, changes.changed()) => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/agent/tasks/{id}/status",
    tag = "agent",
    summary = "A task's state, as its agent reports it (host credential).",
    request_body = TaskStateReport,
    params(("id" = String, Path, description = "A task id (t- and 16 hex digits).")),
    responses((status = 200, description = "OK.", body = Task), crate::openapi::Errors),
    security(("bearer" = []))
)]
pub(super) async fn report_task(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Task>, ApiError> {
    let report: TaskStateReport = parse(&body)?;
    Ok(Json(
        st.call(&headers, host, Touch::Cluster, move |c, who| c.report_task(&host_id(who)?, &id, report))
            .await?,
    ))
}
