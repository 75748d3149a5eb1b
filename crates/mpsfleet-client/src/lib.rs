//! A typed client of the mpsfleet REST API.

pub mod exec;
mod stream;
pub mod tls;

pub use stream::{EventQuery, EventStream, StreamItem};

use mpsfleet_types::api::*;
use mpsfleet_types::*;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{} ({code}, HTTP {status})", body.message, code = body.code)]
    Api { status: u16, body: ErrorBody },
    /// The server refused the request for its token's rate (HTTP 429, code `TooManyRequests`):
    /// nothing was done; the same request may be sent again after `retry_after`.
    #[error("{} ({code}, HTTP 429)", body.message, code = body.code)]
    RateLimited { body: ErrorBody, retry_after: Duration },
    /// The server could not be reached or the connection broke.
    #[error("cannot reach the mpsfleet server at {url}: {message}")]
    Transport { url: String, message: String },
    /// The server is not the one this client trusts (its CA is not the pinned one).
    #[error("refusing the server at {url}: {message}")]
    UntrustedServer { url: String, message: String },
    /// The server's answer was not what this client understands.
    #[error("unexpected answer from {url}: {message}")]
    Decode { url: String, message: String },
}

/// What `POST /v1/drills` answered.
#[derive(Debug, Clone)]
pub enum DrillAnswer {
    Started(Box<mpsfleet_types::drill::Drill>),
    /// A dry run: nothing injected.
    Plan(Box<mpsfleet_types::drill::DrillPlan>),
}

impl ClientError {
    /// The API error code, when the server answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { body, .. } | ClientError::RateLimited { body, .. } => Some(&body.code),
            _ => None,
        }
    }

    /// How long to wait before sending the request again, when the server said so (a rate
    /// limit's `Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

#[derive(Debug, Clone)]
pub struct Client {
    /// Shared by every clone, so that [`Client::set_trust`] changes them all.
    http: std::sync::Arc<std::sync::RwLock<reqwest::Client>>,
    /// The servers' addresses: one, or several servers of which one leads (docs/ha.md).
    bases: std::sync::Arc<Vec<String>>,
    /// The address that answered last; requests start there.
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    token: Option<String>,
}

/// Query filters of `task list`.
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    pub pool: Option<String>,
    pub service: Option<String>,
    pub host: Option<String>,
    pub status: Option<String>,
    pub limit: Option<usize>,
    /// Leave out this many first (paging).
    pub skip: Option<usize>,
    /// Newest first (the server's default is creation order).
    pub newest_first: bool,
    /// Leave out STOPPED tasks.
    pub live: bool,
}

impl TaskQuery {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let limit = self.limit.map(|l| l.to_string());
        let skip = self.skip.map(|l| l.to_string());
        let order = self.newest_first.then(|| "newest".to_string());
        let live = self.live.then(|| "true".to_string());
        [
            ("pool", &self.pool),
            ("service", &self.service),
            ("host", &self.host),
            ("status", &self.status),
            ("limit", &limit),
            ("skip", &skip),
            ("order", &order),
            ("live", &live),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
    }
}

impl Client {
    /// A client of a plain-HTTP server (one started with `--insecure-http`), such as
    /// `http://127.0.0.1:7070`; an `https://` address is refused, as nothing would verify it.
    pub fn new(base: &str, token: Option<String>) -> Result<Self> {
        Self::with_trust(base, token, &tls::Trust::PlainHttp)
    }

    /// A client of the server at `base` that trusts what `trust` names: for an `https://`
    /// server, its cluster's CA.
    ///
    /// `base` may list several servers, comma-separated (`https://a:7070,https://b:7070`): a
    /// request goes to the one that answered last, and moves on to the next while a server
    /// cannot be reached (only then: a request that reached a server is never sent twice).
    pub fn with_trust(base: &str, token: Option<String>, trust: &tls::Trust) -> Result<Self> {
        let bases: Vec<String> = base
            .split(',')
            .map(|b| b.trim().trim_end_matches('/').to_string())
            .filter(|b| !b.is_empty())
            .collect();
        let first = bases.first().cloned().unwrap_or_default();
        for b in &bases {
            Self::http_client(b, trust)?;
        }
        let http = Self::http_client(&first, trust)?;
        Ok(Client {
            http: std::sync::Arc::new(std::sync::RwLock::new(http)),
            bases: std::sync::Arc::new(if bases.is_empty() { vec![first] } else { bases }),
            current: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            token,
        })
    }

    fn http_client(base: &str, trust: &tls::Trust) -> Result<reqwest::Client> {
        trust
            .builder(base)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| ClientError::Transport { url: base.to_string(), message: e.to_string() })
    }

    /// Trusts what `trust` names from the next request on, in this client and every clone of
    /// it (an agent following a CA rotation).
    pub fn set_trust(&self, trust: &tls::Trust) -> Result<()> {
        let http = Self::http_client(self.base(), trust)?;
        *self.http.write().unwrap_or_else(|p| p.into_inner()) = http;
        Ok(())
    }

    /// The server address requests go to now.
    pub fn base(&self) -> &str {
        &self.bases[self.current.load(std::sync::atomic::Ordering::Relaxed) % self.bases.len()]
    }

    /// Every server address this client was given.
    pub fn bases(&self) -> &[String] {
        &self.bases
    }

    /// The same client with another bearer token (an agent's host credential).
    pub fn with_token(&self, token: String) -> Self {
        Client { token: Some(token), ..self.clone() }
    }

    /// Sends a request and returns the body of a successful answer; an error answer becomes
    /// [`ClientError::Api`].
    async fn fetch(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<(String, Vec<u8>)> {
        let http = self.http.read().unwrap_or_else(|p| p.into_inner()).clone();
        // Shared, not copied, by the attempts at each address.
        let body = body.map(bytes::Bytes::from);
        let start = self.current.load(std::sync::atomic::Ordering::Relaxed);
        let mut attempt = 0;
        let (url, resp) = loop {
            let at = (start + attempt) % self.bases.len();
            let url = format!("{}{}", self.bases[at], path);
            let mut req = http.request(method.clone(), &url);
            if !query.is_empty() {
                req = req.query(query);
            }
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            if let Some(b) = &body {
                req = req.header("content-type", "application/json").body(b.clone());
            }
            match req.send().await {
                Ok(resp) => {
                    self.current.store(at, std::sync::atomic::Ordering::Relaxed);
                    break (url, resp);
                }
                // Not connected: the request never reached that server, so another may take it.
                Err(e) if e.is_connect() && attempt + 1 < self.bases.len() => attempt += 1,
                Err(e) => return Err(ClientError::Transport { url, message: chain(&e) }),
            }
        };
        let status = resp.status();
        let retry_after = retry_after(resp.headers());
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Transport { url: url.clone(), message: chain(&e) })?;
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(ClientError::RateLimited { body: error_body(&bytes), retry_after });
        }
        if !status.is_success() {
            return Err(api_error(status.as_u16(), &bytes));
        }
        Ok((url, bytes.to_vec()))
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<T> {
        let (url, bytes) = self.fetch(method, path, query, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode { url, message: e.to_string() })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(Method::GET, path, &[], None).await
    }

    async fn send<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| ClientError::Decode { url: path.into(), message: e.to_string() })?;
        self.call(method, path, &[], Some(bytes)).await
    }

    /// The server's Prometheus metrics (`GET /metrics`), as text.
    pub async fn metrics(&self) -> Result<String> {
        let (_, bytes) = self.fetch(Method::GET, "/metrics", &[], None).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub async fn healthz(&self) -> Result<serde_json::Value> {
        self.get("/v1/healthz").await
    }

    // task definitions
    pub async fn register_taskdef(&self, json: Vec<u8>) -> Result<RegisterTaskDefResponse> {
        self.call(Method::POST, "/v1/taskdefs", &[], Some(json)).await
    }
    pub async fn list_taskdefs(&self, family: Option<&str>) -> Result<Vec<TaskDefinition>> {
        let q: Vec<(&str, String)> = family.map(|f| ("family", f.to_string())).into_iter().collect();
        self.call(Method::GET, "/v1/taskdefs", &q, None).await
    }
    pub async fn describe_taskdef(&self, reference: &str) -> Result<TaskDefinition> {
        self.get(&format!("/v1/taskdefs/{}", seg(reference))).await
    }

    // pools
    pub async fn create_pool(&self, req: &CreatePool) -> Result<Pool> {
        self.send(Method::POST, "/v1/pools", req).await
    }
    pub async fn list_pools(&self) -> Result<Vec<Pool>> {
        self.get("/v1/pools").await
    }
    pub async fn describe_pool(&self, name: &str) -> Result<Pool> {
        self.get(&format!("/v1/pools/{}", seg(name))).await
    }
    pub async fn update_pool(&self, name: &str, req: &UpdatePool) -> Result<Pool> {
        self.send(Method::PATCH, &format!("/v1/pools/{}", seg(name)), req).await
    }
    pub async fn explain_pool(&self, name: &str) -> Result<mpsfleet_core::explain::Explanation> {
        self.get(&format!("/v1/pools/{}/explain", seg(name))).await
    }

    // hosts
    pub async fn list_hosts(&self, pool: Option<&str>) -> Result<Vec<HostView>> {
        let q: Vec<(&str, String)> = pool.map(|p| ("pool", p.to_string())).into_iter().collect();
        self.call(Method::GET, "/v1/hosts", &q, None).await
    }
    pub async fn describe_host(&self, id: &str) -> Result<HostView> {
        self.get(&format!("/v1/hosts/{}", seg(id))).await
    }
    pub async fn cordon_host(&self, id: &str, cordon: bool) -> Result<HostView> {
        let verb = if cordon { "cordon" } else { "uncordon" };
        self.call(Method::POST, &format!("/v1/hosts/{}/{verb}", seg(id)), &[], None).await
    }

    /// `drain` or `replace`: the operator's remediation of a host; returns its incident.
    pub async fn host_action(&self, id: &str, action: &str) -> Result<IncidentView> {
        self.call(Method::POST, &format!("/v1/hosts/{}/{}", seg(id), seg(action)), &[], None).await
    }

    // incidents
    pub async fn list_incidents(&self) -> Result<Vec<IncidentView>> {
        self.get("/v1/incidents").await
    }
    // drills
    /// `drill run`: the drill started, or (`dryRun`) its plan. Both answers are read as JSON
    /// and told apart by their fields (a plan has `expected`, a drill `status`).
    pub async fn run_drill(&self, req: &mpsfleet_types::drill::CreateDrill) -> Result<DrillAnswer> {
        let v: serde_json::Value = self.send(Method::POST, "/v1/drills", req).await?;
        let parsed = if v.get("expected").is_some() {
            serde_json::from_value(v).map(|p| DrillAnswer::Plan(Box::new(p)))
        } else {
            serde_json::from_value(v).map(|d| DrillAnswer::Started(Box::new(d)))
        };
        parsed.map_err(|e| ClientError::Decode { url: "/v1/drills".into(), message: e.to_string() })
    }
    pub async fn list_drills(&self) -> Result<Vec<mpsfleet_types::drill::Drill>> {
        self.get("/v1/drills").await
    }
    pub async fn describe_drill(&self, id: &str) -> Result<mpsfleet_types::drill::Drill> {
        self.get(&format!("/v1/drills/{}", seg(id))).await
    }
    pub async fn abort_drill(&self, id: &str) -> Result<mpsfleet_types::drill::Drill> {
        self.call(Method::POST, &format!("/v1/drills/{}/abort", seg(id)), &[], None).await
    }
    pub async fn drill_switch(&self) -> Result<mpsfleet_types::drill::DrillSwitch> {
        self.get("/v1/drills/switch").await
    }
    pub async fn set_drill_switch(&self, enabled: bool) -> Result<mpsfleet_types::drill::DrillSwitch> {
        let body = mpsfleet_types::drill::DrillSwitch { enabled, changed_by: None, changed_at_ms: None };
        self.send(Method::PUT, "/v1/drills/switch", &body).await
    }

    pub async fn describe_incident(&self, id: &str) -> Result<IncidentView> {
        self.get(&format!("/v1/incidents/{}", seg(id))).await
    }
    /// `incident acknowledge`: the operator takes the incident.
    pub async fn acknowledge_incident(&self, id: &str) -> Result<IncidentView> {
        self.call(Method::POST, &format!("/v1/incidents/{}/acknowledge", seg(id)), &[], None).await
    }
    /// `incident resolve`: the operator closes the incident, saying why.
    pub async fn resolve_incident(&self, id: &str, reason: &str) -> Result<OperatorCommandResponse> {
        let body = ResolveIncident { reason: reason.to_string() };
        self.send(Method::POST, &format!("/v1/incidents/{}/resolve", seg(id)), &body).await
    }
    /// `host activate`: a repaired, healthy host back to ACTIVE (its incident resolves).
    pub async fn activate_host(&self, id: &str) -> Result<OperatorCommandResponse> {
        self.call(Method::POST, &format!("/v1/hosts/{}/activate", seg(id)), &[], None).await
    }
    /// `host recheck`: the agent re-arms its exhausted local repair.
    pub async fn recheck_host(&self, id: &str) -> Result<OperatorCommandResponse> {
        self.call(Method::POST, &format!("/v1/hosts/{}/recheck", seg(id)), &[], None).await
    }
    /// `host forget`: a host that does not exist leaves the fleet and frees its GPU UUIDs
    /// (`force`: even while something heartbeats as it).
    pub async fn revoke_host_credential(&self, id: &str) -> Result<HostView> {
        self.call(Method::POST, &format!("/v1/hosts/{}/revoke-credential", seg(id)), &[], None).await
    }
    pub async fn forget_host(&self, id: &str, force: bool) -> Result<HostView> {
        let query: &[(&str, String)] = if force { &[("force", "true".to_string())] } else { &[] };
        self.call(Method::POST, &format!("/v1/hosts/{}/forget", seg(id)), query, None).await
    }

    // tasks
    pub async fn run_task(&self, req: &RunTask) -> Result<RunTaskResponse> {
        self.send(Method::POST, "/v1/tasks", req).await
    }
    pub async fn list_tasks(&self, q: &TaskQuery) -> Result<Vec<Task>> {
        self.call(Method::GET, "/v1/tasks", &q.pairs(), None).await
    }
    pub async fn describe_task(&self, id: &str) -> Result<Task> {
        self.get(&format!("/v1/tasks/{}", seg(id))).await
    }
    /// The task's events, oldest first.
    pub async fn task_events(
        &self,
        id: &str,
    ) -> Result<mpsfleet_types::History<mpsfleet_types::ObjectEvent>> {
        self.get(&format!("/v1/tasks/{}/events", seg(id))).await
    }
    pub async fn stop_task(&self, id: &str, reason: Option<String>) -> Result<Task> {
        self.send(Method::POST, &format!("/v1/tasks/{}/stop", seg(id)), &StopTask { reason }).await
    }

    /// Protects a task from its service's scale-in and deployments for `minutes`, or ends that.
    pub async fn protect_task(&self, id: &str, req: &mpsfleet_types::ProtectTask) -> Result<Task> {
        self.send(Method::POST, &format!("/v1/tasks/{}/protection", seg(id)), req).await
    }

    /// The tail of a task container's stdout, stderr or both interleaved (fetched by the
    /// server from its agent), with `since_ms` only what was written after that time; or,
    /// when the agent cannot be asked, the last output snapshot it reported. The answer says
    /// which, and the time of its last output for the next `since_ms`.
    pub async fn task_logs(
        &self,
        id: &str,
        container: Option<&str>,
        stream: mpsfleet_types::logs::LogStreams,
        tail: u64,
        since_ms: Option<u64>,
    ) -> Result<mpsfleet_types::logs::TaskLogs> {
        let mut q = vec![("stream", stream.as_str().to_string()), ("tail", tail.to_string())];
        if let Some(c) = container {
            q.push(("container", c.to_string()));
        }
        if let Some(since) = since_ms {
            q.push(("since_ms", since.to_string()));
        }
        self.call(Method::GET, &format!("/v1/tasks/{}/logs", seg(id)), &q, None).await
    }

    // services
    pub async fn create_service(&self, req: &CreateService) -> Result<ServiceView> {
        self.send(Method::POST, "/v1/services", req).await
    }
    pub async fn update_service(&self, name: &str, req: &UpdateService) -> Result<ServiceView> {
        self.send(Method::PATCH, &format!("/v1/services/{}", seg(name)), req).await
    }
    pub async fn list_services(&self) -> Result<Vec<ServiceView>> {
        self.get("/v1/services").await
    }
    pub async fn describe_service(&self, name: &str) -> Result<ServiceView> {
        self.get(&format!("/v1/services/{}", seg(name))).await
    }
    pub async fn service_endpoints(&self, name: &str) -> Result<Vec<ServiceEndpoint>> {
        self.get(&format!("/v1/services/{}/endpoints", seg(name))).await
    }
    pub async fn service_deployments(
        &self,
        name: &str,
    ) -> Result<Vec<mpsfleet_types::service::DeploymentView>> {
        self.get(&format!("/v1/services/{}/deployments", seg(name))).await
    }
    pub async fn delete_service(&self, name: &str) -> Result<ServiceView> {
        self.call(Method::DELETE, &format!("/v1/services/{}", seg(name)), &[], None).await
    }

    // secrets: the API never answers a value, except to the agent of a task's host
    pub async fn create_secret(&self, name: &str, value: String) -> Result<secret::SecretInfo> {
        let req = secret::CreateSecret { name: name.to_string(), value };
        self.send(Method::POST, "/v1/secrets", &req).await
    }
    /// `token create`: the token is in the answer, this once.
    /// A one-time console sign-in link's code, with the caller's role (`mpsfleet console`).
    pub async fn create_console_link(
        &self,
        req: &mpsfleet_types::access::CreateConsoleLink,
    ) -> Result<mpsfleet_types::access::ConsoleLink> {
        self.send(Method::POST, "/v1/console/links", req).await
    }

    pub async fn create_token(
        &self,
        req: &mpsfleet_types::access::CreateToken,
    ) -> Result<mpsfleet_types::access::CreatedToken> {
        self.send(Method::POST, "/v1/tokens", req).await
    }
    /// `audit list`: the newest `limit` entries of the audit log, oldest first.
    pub async fn audit(&self, limit: usize) -> Result<Vec<mpsfleet_types::access::AuditEntry>> {
        self.call(Method::GET, "/v1/audit", &[("limit", limit.to_string())], None).await
    }
    pub async fn create_join_token(
        &self,
        req: &mpsfleet_types::access::CreateJoinToken,
    ) -> Result<mpsfleet_types::access::CreatedJoinToken> {
        self.send(Method::POST, "/v1/join-tokens", req).await
    }
    pub async fn list_join_tokens(&self) -> Result<Vec<mpsfleet_types::access::JoinTokenView>> {
        self.get("/v1/join-tokens").await
    }
    pub async fn revoke_join_token(&self, id: &str) -> Result<mpsfleet_types::access::JoinTokenView> {
        self.call(Method::DELETE, &format!("/v1/join-tokens/{}", seg(id)), &[], None).await
    }
    /// The cluster CAs' certificates (PEM), fetched over this client's verified connection.
    pub async fn cluster_ca_bundle(&self) -> Result<Vec<u8>> {
        let (_, pem) = self.fetch(Method::GET, tls::CA_PATH, &[], None).await?;
        Ok(pem)
    }
    pub async fn cluster_status(&self) -> Result<mpsfleet_types::access::ClusterStatus> {
        self.get("/v1/cluster/status").await
    }
    pub async fn ca_rotation(&self) -> Result<mpsfleet_types::access::CaRotation> {
        self.get("/v1/cluster/ca/rotation").await
    }
    pub async fn begin_ca_rotation(
        &self,
        req: &mpsfleet_types::access::BeginCaRotation,
    ) -> Result<mpsfleet_types::access::CaRotation> {
        self.send(Method::POST, "/v1/cluster/ca/rotation", req).await
    }
    pub async fn activate_ca(&self, force: bool) -> Result<mpsfleet_types::access::CaRotation> {
        let req = mpsfleet_types::access::ActivateCa { force };
        self.send(Method::POST, "/v1/cluster/ca/rotation/activate", &req).await
    }
    pub async fn cancel_ca_rotation(&self) -> Result<mpsfleet_types::access::CaRotation> {
        self.call(Method::DELETE, "/v1/cluster/ca/rotation", &[], None).await
    }
    /// The certificate the server serves now.
    pub async fn server_certificate(&self) -> Result<mpsfleet_types::access::ServerCertificate> {
        self.get("/v1/cluster/certificate").await
    }
    /// Has the server issue itself a new certificate under the cluster CA.
    pub async fn rotate_certificate(&self) -> Result<mpsfleet_types::access::ServerCertificate> {
        self.call(Method::POST, "/v1/cluster/certificate/rotate", &[], None).await
    }
    /// Replaces the bootstrap admin token; the new one is in the answer.
    pub async fn rotate_admin_token(&self) -> Result<mpsfleet_types::access::RotatedAdminToken> {
        self.call(Method::POST, "/v1/admin-token/rotate", &[], None).await
    }
    pub async fn list_tokens(&self) -> Result<Vec<mpsfleet_types::access::TokenView>> {
        self.get("/v1/tokens").await
    }
    pub async fn revoke_token(&self, id: &str) -> Result<mpsfleet_types::access::TokenView> {
        self.call(Method::DELETE, &format!("/v1/tokens/{}", seg(id)), &[], None).await
    }
    pub async fn list_secrets(&self) -> Result<Vec<secret::SecretInfo>> {
        self.get("/v1/secrets").await
    }
    pub async fn delete_secret(&self, name: &str) -> Result<secret::SecretInfo> {
        self.call(Method::DELETE, &format!("/v1/secrets/{}", seg(name)), &[], None).await
    }

    // agent-facing
    /// The secret values task `id`'s definition names (with the credential of its host).
    pub async fn task_secrets(&self, id: &TaskId) -> Result<secret::TaskSecrets> {
        self.get(&format!("/v1/agent/tasks/{id}/secrets")).await
    }
    pub async fn register_host(&self, reg: &HostRegistration) -> Result<RegisterHostResponse> {
        self.send(Method::POST, "/v1/agent/register", reg).await
    }
    /// A heartbeat; the answer carries the pool's current health policy.
    pub async fn report_host_status(&self, report: &HostStatusReport) -> Result<HostStatusAnswer> {
        self.send(Method::POST, "/v1/agent/status", report).await
    }
    /// Long-polls for the host's tasks newer than `after`, waiting up to `wait_seconds`.
    pub async fn assignments(&self, after: u64, wait_seconds: u64) -> Result<Assignments> {
        let q = [("after", after.to_string()), ("waitSeconds", wait_seconds.to_string())];
        self.call(Method::GET, "/v1/agent/assignments", &q, None).await
    }
    pub async fn report_task(&self, id: &TaskId, report: &TaskStateReport) -> Result<Task> {
        self.send(Method::POST, &format!("/v1/agent/tasks/{id}/status"), report).await
    }
}

fn api_error(status: u16, bytes: &[u8]) -> ClientError {
    ClientError::Api { status, body: error_body(bytes) }
}

fn error_body(bytes: &[u8]) -> ErrorBody {
    serde_json::from_slice::<ErrorBody>(bytes).unwrap_or_else(|_| ErrorBody {
        code: "Unknown".into(),
        message: String::from_utf8_lossy(bytes).trim().to_string(),
        field: None,
        errors: Box::default(),
    })
}

/// A `Retry-After` of whole seconds, at least 1 s and at most a minute; 1 s when it is missing
/// or an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    let secs = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .unwrap_or(1);
    Duration::from_secs(secs.clamp(1, 60))
}

/// Escapes one path segment.
fn seg(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An error with its causes, `: ` between them.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_within_bounds() {
        let with = |v: &str| {
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(reqwest::header::RETRY_AFTER, v.parse().unwrap());
            retry_after(&h)
        };
        assert_eq!(with("3"), Duration::from_secs(3));
        assert_eq!(with("0"), Duration::from_secs(1));
        assert_eq!(with("86400"), Duration::from_secs(60));
        assert_eq!(with("Wed, 21 Oct 2015 07:28:00 GMT"), Duration::from_secs(1));
        assert_eq!(retry_after(&reqwest::header::HeaderMap::new()), Duration::from_secs(1));
        let e = ClientError::RateLimited {
            body: error_body(
                br#"{"code":"TooManyRequests","message":"rate limit for the admin token exceeded"}"#,
            ),
            retry_after: Duration::from_secs(2),
        };
        assert_eq!(e.code(), Some("TooManyRequests"));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(e.to_string(), "rate limit for the admin token exceeded (TooManyRequests, HTTP 429)");
    }
}
