//! The REST API under `/v1`: routing, authentication and JSON in and out.
//!
//! Handlers are thin: they authenticate, parse, and call one `Cluster` method on a blocking
//! thread (the store commits synchronously), holding the cluster lock for that call only.

use crate::auth::{self, Principal};
use crate::cluster::Error;
use crate::cluster::{
    Cluster, HostRequest, Kind, RegistrationQueue, TaskFilter, Touch, ValidTaskDef, Waiting,
};
use crate::error::ApiError;
use crate::openapi::BearerAuth;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mpsfleet_types::access::{CreateToken, CreatedToken, Role, TokenView};
use mpsfleet_types::api::{
    HostStatusAnswer, HostStatusReport, OperatorCommandResponse, ResolveIncident, RunTaskResponse,
};
use mpsfleet_types::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

tokio::task_local! {
    /// The audit context of the request being served: set by the HTTP layer (`http.rs`) for a
    /// change (POST, PUT, PATCH, DELETE) made by a person's or tool's token, read by
    /// `AppState::call`.
    pub static AUDIT: Option<crate::cluster::AuditContext>;
}

mod access;
mod agent_proxy;
mod agents;
mod drills;
mod events;
mod exec;
mod hosts;
mod incidents;
mod pools;
mod secrets;
mod services;
mod taskdefs;
mod tasks;
use access::*;
use agent_proxy::*;
pub use agent_proxy::{agent_answer_limit, AGENT_ANSWER_SLACK, MAX_LOG_TAIL};
use agents::*;
use drills::*;
use exec::*;
pub use exec::{ExecLimits, ExecSessions, DEFAULT_EXEC_IDLE};
use hosts::*;
use incidents::*;
use pools::*;
use secrets::*;
use services::*;
use taskdefs::*;
use tasks::*;

/// Longest an agent's long-poll may wait.
pub const MAX_WAIT_SECONDS: u64 = 60;

#[derive(Clone)]
pub struct AppState {
    pub cluster: Arc<Mutex<Cluster>>,
    /// For calls to agents (task logs): follows no redirect (see [`agent_client`]).
    pub http: reqwest::Client,
    /// The store revision after the last change; long-polls wait on it.
    pub changed: watch::Sender<u64>,
    /// Committed changes, for `GET /v1/events`.
    pub events: crate::events::Events,
    /// Host registrations waiting for their group commit.
    pub registrations: Arc<RegistrationQueue>,
    /// Set when the server starts to shut down: no provider call starts after it.
    pub stopping: watch::Sender<bool>,
    /// The certificate the server serves, when it serves HTTPS.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// Where the bootstrap admin token is kept for the operator (`<data dir>/admin.token`),
    /// rewritten when it is rotated.
    pub admin_token_file: Option<std::path::PathBuf>,
    /// Who this server is and how it was elected, when several servers share an etcd store.
    pub ha: Option<Arc<crate::HaRole>>,
    /// The metrics' counters and histograms, which the cluster feeds too.
    pub metrics: Arc<crate::metrics::Live>,
    /// Wakes the controllers' pass (the health loop) when a call asked for an incident
    /// (`Cluster::take_wake`): recovery runs at once, outside the request.
    pub wake: Arc<tokio::sync::Notify>,
    /// The controllers' passes run by the health loop, counted under the cluster lock (see
    /// [`AppState::settled`]).
    pub passes: watch::Sender<u64>,
    /// The `task exec` sessions open, and their limits.
    pub exec: Arc<ExecSessions>,
}

/// The longest [`AppState::settled`] waits for the controllers' pass.
const SETTLE_WAIT: Duration = Duration::from_secs(1);

/// The HTTP client for calls to agents: it follows no redirect (an agent's 3xx is an error)
/// and gives up after 10 s (each call sets its own, shorter, timeout too).
/// How the server calls agents: no redirects followed, bounded in time.
fn agent_client_builder(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    builder.redirect(reqwest::redirect::Policy::none()).timeout(Duration::from_secs(10))
}

fn agent_client() -> reqwest::Client {
    agent_client_builder(reqwest::Client::builder()).build().unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot build the HTTP client for agents; using one without a timeout");
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap_or_default()
    })
}

impl AppState {
    pub fn new(cluster: Cluster) -> Self {
        let rev = cluster.read().revision();
        let events = cluster.events().clone();
        let metrics = cluster.live_metrics();
        AppState {
            metrics,
            cluster: Arc::new(Mutex::new(cluster)),
            http: agent_client(),
            changed: watch::Sender::new(rev),
            events,
            registrations: Arc::new(RegistrationQueue::default()),
            stopping: watch::Sender::new(false),
            tls: None,
            admin_token_file: None,
            ha: None,
            wake: Arc::default(),
            passes: watch::Sender::new(0),
            exec: Arc::default(),
        }
    }

    /// Waits (at most [`SETTLE_WAIT`]) for a controllers' pass that took the cluster lock after
    /// this call: what an earlier call of the same request asked for (an operator's command
    /// on an incident) has then been carried out, and its answer can say so.
    pub async fn settled(&self) {
        let mut passes = self.passes.subscribe();
        let seen = *passes.borrow_and_update();
        self.wake.notify_one();
        let _ = tokio::time::timeout(SETTLE_WAIT, passes.wait_for(|n| *n > seen)).await;
    }

    /// Reads the cluster on a blocking thread, for a request already authenticated and
    /// audited by its own call.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Cluster) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, ApiError> {
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || {
            let c = cluster.lock().map_err(|_| Error::Internal("state lock poisoned".into()))?;
            f(&c)
        })
        .await
        .map_err(|e| ApiError::from(Error::Internal(format!("request handler failed: {e}"))))?
        .map_err(ApiError::from)
    }

    /// Runs `f` on the cluster on a blocking thread, after authenticating `headers`, checking
    /// the caller is allowed by `allow`, and admitting what the operation touches (`touch`:
    /// a pool-scoped token reaches its pool only, `cluster/scope.rs`) under the lock `f` runs
    /// under. Wakes long-polls if anything changed.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        headers: &HeaderMap,
        allow: fn(&Principal) -> bool,
        touch: Touch,
        f: impl FnOnce(&mut Cluster, Principal) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, ApiError> {
        let token = auth::bearer(headers.get("authorization").and_then(|v| v.to_str().ok()))?;
        self.call_digest(auth::digest(token), allow, touch, f).await
    }

    /// [`AppState::call`] for the caller whose token has `digest`: the REST API's bearer token,
    /// or the token of an AWS access key whose signature the ECS-compatible API verified.
    pub(crate) async fn call_digest<T: Send + 'static>(
        &self,
        digest: String,
        allow: fn(&Principal) -> bool,
        touch: Touch,
        f: impl FnOnce(&mut Cluster, Principal) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, ApiError> {
        // A change by a person or tool is written to the audit log with its first commit.
        let audit = AUDIT.try_with(Clone::clone).ok().flatten();
        let cluster = self.cluster.clone();
        let changed = self.changed.clone();
        let wake = self.wake.clone();
        // What the cluster logs for this call carries its request id.
        let span = tracing::Span::current();
        let out = tokio::task::spawn_blocking(move || {
            let _request = span.enter();
            let mut c = cluster.lock().map_err(|_| {
                ApiError::from(Error::Internal(
                    "state lock poisoned by an earlier failure; restart the server".into(),
                ))
            })?;
            let who = c.authenticate_digest(&digest)?;
            if !allow(&who) {
                return Err(ApiError::from(Error::Forbidden(format!(
                    "this endpoint is not open to {}",
                    who.describe()
                ))));
            }
            c.read().admit(&who, &touch)?;
            let before = c.read().revision();
            c.begin_audit(audit);
            let out = f(&mut c, who).map_err(ApiError::from);
            c.end_audit(out.as_ref().err().map(|e| format!("{}: {e}", e.status_and_code().1)));
            if c.read().revision() != before {
                changed.send_replace(c.read().revision());
            }
            // An incident asked for, or a provider call decided: the controllers' loop runs it.
            if c.take_wake() {
                wake.notify_one();
            }
            Ok(out)
        })
        .await
        .map_err(|e| ApiError::from(Error::Internal(format!("request handler failed: {e}"))))??;
        out
    }
}

/// The pool a list is filtered by: `asked`, or for a token scoped to one pool that pool (and
/// another one asked for is refused).
fn scoped_pool(who: &Principal, asked: Option<String>) -> Result<Option<String>, Error> {
    match (who.scope(), asked) {
        (None, asked) => Ok(asked),
        (Some(scope), Some(asked)) if asked != scope => {
            Err(crate::cluster::scope::outside(who, &format!("pool {asked:?}")))
        }
        (Some(scope), _) => Ok(Some(scope.to_string())),
    }
}

/// The identity recorded on timelines for a command made with this token.
pub(crate) fn actor(p: &Principal) -> String {
    match p {
        Principal::Admin => "admin".into(),
        Principal::Token { id, .. } => format!("token:{id}"),
        Principal::Joiner => "join-token".into(),
        Principal::Host(h) => format!("host:{h}"),
        Principal::Replacement(i) => format!("replacement:{i}"),
        Principal::Launch { name, .. } => format!("launch:{name}"),
    }
}

/// The role of a person's or tool's token: the bootstrap admin token is an admin's.
pub(crate) fn role_of(p: &Principal) -> Option<Role> {
    p.role()
}

/// Read-only routes.
pub(crate) fn viewer(p: &Principal) -> bool {
    role_of(p).is_some_and(|r| r.allows(Role::Viewer))
}

/// Routes that run the fleet's work: task definitions, tasks, services, hosts, incidents.
pub(crate) fn operator(p: &Principal) -> bool {
    role_of(p).is_some_and(|r| r.allows(Role::Operator))
}

/// Pools, tokens, secrets.
pub(crate) fn admin(p: &Principal) -> bool {
    role_of(p).is_some_and(|r| r.allows(Role::Admin))
}

pub(crate) fn joiner(p: &Principal) -> bool {
    p.may_join()
}

pub(crate) fn host(p: &Principal) -> bool {
    p.is_host()
}

fn host_id(p: Principal) -> Result<HostId, Error> {
    match p {
        Principal::Host(h) => Ok(h),
        _ => Err(Error::Forbidden("only a host credential may report for a host".into())),
    }
}

/// A query string parsed into `T`, refused with a JSON error naming the problem.
pub(crate) struct Q<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Q(v)),
            Err(e) => Err(ApiError::invalid("query", e.body_text())),
        }
    }
}

/// A request body: always a JSON object (serde would also fill a struct from an array).
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::MalformedBody("expected a JSON object".into()));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::MalformedBody(e.to_string()))
}

/// The OpenAPI document's operations: every handler the router serves (a test below,
/// `every_route_of_the_router_is_in_the_document`, holds the two to each other).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "mpsfleet",
        description = "The mpsfleet control plane: GPU workloads that share NVIDIA GPUs through MPS, from ECS task definitions."
    ),
    paths(
        openapi_document,
        healthz,
        metrics,
        cluster_ca,
        server_certificate,
        rotate_certificate,
        rotate_admin_token,
        get_ca_rotation,
        cluster_status,
        begin_ca_rotation,
        activate_ca,
        cancel_ca_rotation,
        create_token,
        list_tokens,
        create_console_link,
        open_console_session,
        revoke_token,
        create_join_token,
        list_join_tokens,
        revoke_join_token,
        list_audit,
        register_taskdef,
        list_taskdefs,
        describe_taskdef,
        create_pool,
        list_pools,
        describe_pool,
        update_pool,
        explain_pool,
        list_hosts,
        describe_host,
        host_metrics,
        metrics_targets,
        cordon_host,
        uncordon_host,
        drain_host,
        replace_host,
        activate_host,
        recheck_host,
        forget_host,
        revoke_host_credential,
        acknowledge_incident,
        resolve_incident,
        list_incidents,
        describe_incident,
        run_drill,
        list_drills,
        drill_switch,
        set_drill_switch,
        describe_drill,
        abort_drill,
        run_tasks,
        list_tasks,
        describe_task,
        task_events,
        stop_task,
        protect_task,
        task_logs,
        task_exec,
        create_service,
        list_services,
        describe_service,
        service_endpoints,
        service_deployments,
        update_service,
        delete_service,
        create_secret,
        list_secrets,
        delete_secret,
        register_host,
        host_status,
        assignments,
        report_task,
        task_secrets,
        events::stream,
        events::replica,
        events::discovery_replica
    ),
    components(schemas(mpsfleet_types::api::ErrorBody, mpsfleet_types::access::AuditEvent)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiPaths;

/// The document, built once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOC: std::sync::OnceLock<utoipa::openapi::OpenApi> = std::sync::OnceLock::new();
    DOC.get_or_init(<ApiPaths as utoipa::OpenApi>::openapi)
}

/// The document as JSON, built once.
pub fn document_json() -> &'static str {
    static JSON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    JSON.get_or_init(|| {
        serde_json::to_string(document()).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    })
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi_document))
        .route("/v1/taskdefs", post(register_taskdef).get(list_taskdefs))
        .route("/v1/taskdefs/{reference}", get(describe_taskdef))
        .route("/v1/pools", post(create_pool).get(list_pools))
        .route("/v1/pools/{name}", get(describe_pool).patch(update_pool))
        .route("/v1/pools/{name}/explain", get(explain_pool))
        .route("/v1/hosts", get(list_hosts))
        .route("/v1/hosts/{id}", get(describe_host))
        .route("/v1/hosts/{id}/metrics", get(host_metrics))
        .route("/v1/metrics/targets", get(metrics_targets))
        .route("/v1/hosts/{id}/cordon", post(cordon_host))
        .route("/v1/hosts/{id}/uncordon", post(uncordon_host))
        .route("/v1/hosts/{id}/drain", post(drain_host))
        .route("/v1/hosts/{id}/replace", post(replace_host))
        .route("/v1/hosts/{id}/activate", post(activate_host))
        .route("/v1/hosts/{id}/recheck", post(recheck_host))
        .route("/v1/hosts/{id}/forget", post(forget_host))
        .route("/v1/hosts/{id}/revoke-credential", post(revoke_host_credential))
        .route("/v1/incidents", get(list_incidents))
        .route("/v1/incidents/{id}", get(describe_incident))
        .route("/v1/incidents/{id}/acknowledge", post(acknowledge_incident))
        .route("/v1/incidents/{id}/resolve", post(resolve_incident))
        .route("/v1/drills", post(run_drill).get(list_drills))
        .route("/v1/drills/switch", get(drill_switch).put(set_drill_switch))
        .route("/v1/drills/{id}", get(describe_drill))
        .route("/v1/drills/{id}/abort", post(abort_drill))
        .route("/v1/events", get(events::stream))
        .route("/v1/events/replica", get(events::replica))
        .route("/v1/discovery/replica", get(events::discovery_replica))
        .route("/v1/tasks", post(run_tasks).get(list_tasks))
        .route("/v1/tasks/{id}", get(describe_task))
        .route("/v1/tasks/{id}/stop", post(stop_task))
        .route("/v1/tasks/{id}/protection", post(protect_task))
        .route("/v1/tasks/{id}/logs", get(task_logs))
        .route("/v1/tasks/{id}/exec", post(task_exec))
        .route("/v1/tasks/{id}/events", get(task_events))
        .route("/v1/services", post(create_service).get(list_services))
        .route("/v1/services/{name}/endpoints", get(service_endpoints))
        .route("/v1/services/{name}/deployments", get(service_deployments))
        .route("/v1/services/{name}", get(describe_service).patch(update_service).delete(delete_service))
        .route("/v1/agent/register", post(register_host))
        .route("/v1/agent/status", post(host_status))
        .route("/v1/agent/assignments", get(assignments))
        .route("/v1/agent/tasks/{id}/status", post(report_task))
        .route("/v1/agent/tasks/{id}/secrets", get(task_secrets))
        .route("/v1/secrets", post(create_secret).get(list_secrets))
        .route("/v1/secrets/{*name}", axum::routing::delete(delete_secret))
        .route("/v1/tokens", post(create_token).get(list_tokens))
        .route("/v1/console/links", post(create_console_link))
        .route("/v1/console/session", post(open_console_session))
        .route("/v1/tokens/{id}", axum::routing::delete(revoke_token))
        .route("/v1/join-tokens", post(create_join_token).get(list_join_tokens))
        .route("/v1/join-tokens/{id}", axum::routing::delete(revoke_join_token))
        .route("/v1/admin-token/rotate", post(rotate_admin_token))
        .route("/v1/audit", get(list_audit))
        .route("/v1/cluster/ca", get(cluster_ca))
        .route("/v1/cluster/certificate", get(server_certificate))
        .route("/v1/cluster/certificate/rotate", post(rotate_certificate))
        .route(
            "/v1/cluster/ca/rotation",
            get(get_ca_rotation).post(begin_ca_rotation).delete(cancel_ca_rotation),
        )
        .route("/v1/cluster/ca/rotation/activate", post(activate_ca))
        .route("/v1/cluster/status", get(cluster_status))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("route", "for this method and path")
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "server",
    summary = "This API's OpenAPI 3.1 document.",
    responses((status = 200, description = "The document.", body = Object), crate::openapi::Errors),
    security(())
)]
async fn openapi_document() -> Response {
    let json = document_json();
    ([(axum::http::header::CONTENT_TYPE, "application/json")], json).into_response()
}

#[utoipa::path(
    get,
    path = "/v1/healthz",
    tag = "server",
    summary = "Whether the server answers.",
    responses((status = 200, description = "It answers.", body = Object), crate::openapi::Errors),
    security(())
)]
async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// The Prometheus metrics (`crate::metrics`; docs/metrics.md).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "server",
    summary = "Prometheus metrics of the cluster (text format 0.0.4): aggregates by pool, and the server's counters.",
    responses((status = 200, description = "The metrics.", body = String, content_type = "text/plain"), crate::openapi::Errors)
)]
async fn metrics(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let state = st.call(&headers, viewer, Touch::Cluster, |c, _| Ok(c.metrics_state())).await?;
    let text = crate::metrics::render(&state, &st.metrics);
    Ok(([(axum::http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

fn created<T: Serialize>(value: T) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

// ---- TLS --------------------------------------------------------------------------------

fn serving_tls(st: &AppState) -> Result<Arc<crate::tls::ServerTls>, ApiError> {
    st.tls.clone().ok_or_else(|| {
        ApiError::from(Error::Conflict(
            "this server serves plain HTTP (--insecure-http): it has no certificate".into(),
        ))
    })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PoolQuery {
    /// Only this pool's hosts.
    pool: Option<String>,
    /// At most this many (1 to 1000000; default: all). The answer's `X-Total-Count` says how
    /// many there are in all.
    #[param(value_type = Option<usize>, minimum = 1, maximum = 1000000)]
    limit: Option<String>,
    /// Leave out this many first, in registration order (paging; default 0).
    #[param(value_type = Option<usize>)]
    skip: Option<String>,
    /// `true`: leave out DEREGISTERED hosts (as `host list` does without `--all`).
    live: Option<bool>,
}

/// A list's `limit` (1 to 1,000,000; `default` when absent) and `skip`, checked.
fn paging(limit: Option<&String>, skip: Option<&String>, default: usize) -> Result<(usize, usize), ApiError> {
    let limit = match limit {
        None => default,
        Some(l) => l.parse::<usize>().ok().filter(|l| (1..=1_000_000).contains(l)).ok_or_else(|| {
            ApiError::invalid("limit", format!("must be an integer from 1 to 1000000, got {l:?}"))
        })?,
    };
    let skip = match skip {
        None => 0,
        Some(n) => n
            .parse::<usize>()
            .map_err(|_| ApiError::invalid("skip", format!("must be a non-negative integer, got {n:?}")))?,
    };
    Ok((limit, skip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The long-poll's answer, encoded from shared definitions, is what `Assignments` encodes.
    #[test]
    fn assignments_out_encodes_as_assignments() {
        let body = br#"{"family": "web", "containerDefinitions": [{"name": "main", "command": ["run"],
            "environment": [{"name": "A", "value": "b"}]}]}"#;
        let mut td = mpsfleet_core::taskdef::parse_task_definition(body).unwrap().definition;
        td.revision = 3;
        let task = Task::new(TaskId(7), td.reference(), PoolName::new("p").unwrap(), None, "me".into(), 5);
        let want = mpsfleet_types::api::Assignments {
            revision: 9,
            tasks: vec![task.clone()],
            task_definitions: vec![td.clone()],
            allow_task_users: true,
        };
        let shared = [Arc::new(td)];
        let tasks = [task];
        let out = AssignmentsOut {
            revision: 9,
            tasks: &tasks,
            task_definitions: shared.iter().map(AsRef::as_ref).collect(),
            allow_task_users: true,
        };
        assert_eq!(serde_json::to_value(&out).unwrap(), serde_json::to_value(&want).unwrap());
    }

    /// A pool-scoped token's call is admitted under the lock its operation takes, against the
    /// object the operation names: another pool's is answered as one that does not exist;
    /// one of the token's pool is served.
    #[tokio::test]
    async fn a_scoped_call_is_admitted_under_the_operations_lock() {
        use crate::cluster::Kind;
        let store = Arc::new(mpsfleet_store::MemoryStore::new());
        let clock = Arc::new(mpsfleet_core::clock::ManualClock::new(1_000_000));
        let mut c = Cluster::load(store, clock, |_| Ok(())).unwrap();
        for name in ["a", "b"] {
            c.create_pool(CreatePool { name: name.into(), ..Default::default() }).unwrap();
        }
        let ask = CreateToken {
            role: Role::Viewer,
            expires_in_s: None,
            description: "scoped".into(),
            pool: Some("a".into()),
            aws: false,
        };
        let token = c.create_api_token(ask, "admin").unwrap().token;
        let st = AppState::new(c);
        let mut headers = HeaderMap::new();
        headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        let describe = |name: &'static str| {
            st.call(&headers, viewer, Touch::Object(Kind::Pool, name.into()), move |c, _| c.read().pool(name))
        };
        let other = describe("b").await.unwrap_err();
        assert!(matches!(other, ApiError::Domain(Error::NotFound { kind: "pool", .. })), "{other}");
        assert_eq!(describe("a").await.unwrap().name.as_str(), "a");
    }

    /// A heartbeat's local-restart ages are bounded: the field and the limit are named.
    #[test]
    fn a_check_with_too_many_repair_ages_is_refused() {
        let check = |n: usize| HostCheck {
            name: "MPS_DAEMON".into(),
            gpu_id: None,
            status: HealthStatus::Impaired,
            reason: "daemon exited".into(),
            since_ms: 1,
            restarts: n as u32,
            first_failure_age_ms: Some(5_000),
            repair_ages_ms: (0..n as u64).collect(),
        };
        let report = |n| HostStatusReport { checks: vec![check(1), check(n)], ..Default::default() };
        assert!(check_report_hashes(&report(mpsfleet_types::MAX_REPAIR_AGES)).is_ok());
        let e = check_report_hashes(&report(mpsfleet_types::MAX_REPAIR_AGES + 1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            ApiError::invalid("checks[1].repairAgesMs", "holds at most 16 entries, got 17").to_string()
        );
        // A heartbeat that leaves its checks out names which ones it means, and carries none.
        let repeat = |rev, checks| HostStatusReport {
            checks_unchanged: true,
            checks_rev: rev,
            checks,
            ..Default::default()
        };
        assert!(check_report_hashes(&repeat(Some(2), Vec::new())).is_ok());
        let e = check_report_hashes(&repeat(None, Vec::new())).unwrap_err();
        assert_eq!(
            e.to_string(),
            ApiError::invalid("checksUnchanged", "goes with a checksRev: the checks it repeats").to_string()
        );
        let e = check_report_hashes(&repeat(Some(2), vec![check(1)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            ApiError::invalid("checks", "is left out with checksUnchanged, got 1 checks").to_string()
        );
    }

    /// `(METHOD, path)` of every route `api::router` serves, read from its source (a wildcard
    /// `{*name}` is the document's `{name}`).
    fn router_routes() -> BTreeSet<(String, String)> {
        let source = include_str!("api.rs");
        let router = &source[source.find("pub fn router").expect("the router")..];
        let router = &router[..router.find(".fallback(").expect("its end")];
        // Without whitespace, a call rustfmt split over lines reads as one.
        let router: String = router.split_whitespace().collect();
        let mut routes = BTreeSet::new();
        for part in router.split(".route(\"").skip(1) {
            let path = part[..part.find('"').unwrap()].replace("{*", "{");
            let handlers = &part[part.find('"').unwrap()..];
            for method in ["get", "post", "patch", "delete", "put"] {
                let call = format!("{method}(");
                if [",", ".", "::", "("].iter().any(|before| handlers.contains(&format!("{before}{call}"))) {
                    routes.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        routes
    }

    fn document_routes() -> BTreeSet<(String, String)> {
        let doc = serde_json::to_value(document()).unwrap();
        let mut routes = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().unwrap().keys() {
                routes.insert((method.to_uppercase(), path.clone()));
            }
        }
        routes
    }

    #[test]
    fn every_route_of_the_router_is_in_the_document() {
        let (router, doc) = (router_routes(), document_routes());
        assert!(router.len() >= 40, "{router:?}");
        let undocumented: Vec<_> = router.difference(&doc).collect();
        let unserved: Vec<_> = doc.difference(&router).collect();
        assert!(undocumented.is_empty(), "routes missing from the OpenAPI document: {undocumented:?}");
        assert!(unserved.is_empty(), "documented routes the router does not serve: {unserved:?}");
    }

    #[test]
    fn the_document_is_openapi_3_1_with_every_schema_it_refers_to() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        let text = document_json();
        let mut missing = BTreeSet::new();
        for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            if !schemas.contains_key(name) {
                missing.insert(name.to_string());
            }
        }
        assert!(missing.is_empty(), "referred to but not defined: {missing:?}");
        // Public routes need no token; every other one does.
        assert_eq!(doc["paths"]["/v1/healthz"]["get"]["security"], serde_json::json!([{}]));
        assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    }
}
