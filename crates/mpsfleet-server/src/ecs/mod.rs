//! The ECS-compatible API: Amazon ECS's own wire protocol (AWS JSON 1.1) at `POST /` on the
//! server's port, so that `aws ecs ...`, boto3 and the AWS SDKs work against mpsfleet unchanged.
//!
//! A call names its operation in `X-Amz-Target` (`AmazonEC2ContainerServiceV20141113.RunTask`)
//! and is signed with SigV4 by an access key that is an mpsfleet token (`token create --aws`).
//! The handler looks the key up before it reads the body, verifies the signature over the
//! body, then charges the key's rate limit (a call whose key is unknown or whose signature
//! fails is charged to its address instead), then translates the call to the same `Cluster`
//! operations the REST API calls, under the same roles, pool scopes and audit log. What ECS
//! names a cluster is a pool, a container instance is a host; services and tasks are what they
//! are. Errors become ECS's (`__type`) in one place, [`error`]; the shapes of ECS's answers are
//! built in [`shapes`]; ARNs in [`arn`].

pub mod arn;
mod capacity;
mod clusters;
mod conformance;
mod deployments;
mod error;
mod instances;
mod page;
mod protection;
mod services;
mod shapes;
mod tags;
mod taskdefs;
mod tasks;

use crate::api::{self, AppState};
use crate::auth::Principal;
use crate::cluster::{AuditContext, Cluster, Error, Touch};
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
pub use conformance::{
    ACCOUNT_ID as CONFORMANCE_ACCOUNT_ID, KEY_ID as CONFORMANCE_KEY_ID, SECRET as CONFORMANCE_SECRET,
};
pub use error::EcsError;
use mpsfleet_core::sigv4;
use mpsfleet_types::{Task, TaskDefinition};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;

/// The prefix of every ECS operation's `X-Amz-Target`.
pub const TARGET_PREFIX: &str = "AmazonEC2ContainerServiceV20141113.";
/// The content type of AWS JSON 1.1 requests and answers.
pub const CONTENT_TYPE: &str = "application/x-amz-json-1.1";
/// How far a request's `X-Amz-Date` may be from the server's clock, as AWS allows.
pub const MAX_SKEW_MS: u64 = 15 * 60 * 1000;
/// The most bytes of a call's body: a task definition's limit, as the REST API's.
pub const BODY_LIMIT: usize = 2 << 20;
/// The headers every signature must cover.
const SIGNED_AT_LEAST: &[&str] = &["host", "x-amz-date", "x-amz-target"];

/// How the ECS-compatible API names this cluster.
#[derive(Debug, Clone)]
pub struct EcsOptions {
    /// The account id in every ARN: 12 digits.
    pub account_id: String,
    /// The one region requests may be signed for; none: any, and each answer's ARNs name the
    /// region its request was signed for.
    pub region: Option<String>,
    /// Conformance mode, for running the moto ECS test suite against the server: accepts the
    /// suite's fixed key, and `POST /moto-api/reset` empties the ECS-visible state. Never on by
    /// default.
    pub conformance: bool,
}

/// The account id ARNs use unless told otherwise.
pub const DEFAULT_ACCOUNT_ID: &str = "000000000000";

impl Default for EcsOptions {
    fn default() -> Self {
        EcsOptions { account_id: DEFAULT_ACCOUNT_ID.into(), region: None, conformance: false }
    }
}

impl EcsOptions {
    /// Checks the account id (12 digits) and region (a lowercase AWS-style name).
    pub fn check(&self) -> Result<(), String> {
        if self.account_id.len() != 12 || !self.account_id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("--aws-account-id must be 12 digits, got {:?}", self.account_id));
        }
        if let Some(r) = &self.region {
            if !arn::valid_region(r) {
                return Err(format!("--aws-region must look like us-east-1, got {r:?}"));
            }
        }
        Ok(())
    }
}

/// What serving ECS calls needs of the server: its state, and the HTTP layer's body read
/// timeout and rate limits (the REST API's own, charged to the same buckets).
#[derive(Clone)]
pub struct Serving {
    pub state: AppState,
    pub body_read_timeout: std::time::Duration,
    pub rate_limits: crate::ratelimit::RateLimits,
    pub limiter: Arc<crate::ratelimit::RateLimiter>,
}

#[derive(Clone)]
struct Ecs {
    serving: Serving,
    options: Arc<EcsOptions>,
    keys: Arc<Keys>,
}

/// The access keys recent calls were signed with, opened, by access key id: a call signed by
/// one again is verified without the cluster lock while its copy holds
/// ([`crate::cluster::KeyValidity`]: no API token changed since, and it has not expired).
#[derive(Default)]
struct Keys(std::sync::Mutex<std::collections::HashMap<String, crate::cluster::AwsKey>>);

/// The most keys [`Keys`] holds; when full it starts afresh.
const KEYS_HELD: usize = 1024;

impl Keys {
    /// The key `id`, when a copy is held and still holds: with the clock's time now.
    fn get(&self, id: &str) -> Option<crate::cluster::AwsKey> {
        let keys = self.0.lock().ok()?;
        let k = keys.get(id)?;
        let now_ms = k.valid.now_ms()?;
        Some(crate::cluster::AwsKey { now_ms, ..k.clone() })
    }

    fn put(&self, id: &str, key: &crate::cluster::AwsKey) {
        if let Ok(mut keys) = self.0.lock() {
            if keys.len() >= KEYS_HELD && !keys.contains_key(id) {
                keys.clear();
            }
            keys.insert(id.to_string(), key.clone());
        }
    }
}

/// `POST /` (and in conformance mode `POST /moto-api/reset`), beside the console's `GET /`.
pub fn router(serving: Serving, options: EcsOptions) -> Router {
    let conformance = options.conformance;
    let mut r = Router::new().route("/", post(handle));
    if conformance {
        r = r.route("/moto-api/reset", post(conformance::reset));
    }
    r.with_state(Ecs { serving, options: Arc::new(options), keys: Arc::default() })
}

/// One call being served: who makes it, and how its answer names things.
pub(crate) struct Call {
    st: AppState,
    digest: String,
    who: Principal,
    arns: arn::Arns,
    audit: Option<AuditContext>,
    /// This server as the caller reached it (`https://HOST`), for `DiscoverPollEndpoint`.
    endpoint: String,
}

impl Call {
    /// Runs `f` under the cluster lock for this caller, as the REST API's handlers do: `allow`
    /// checks its role, `touch` admits what the operation touches for its pool scope, and a
    /// change is written to the audit log.
    async fn run<T: Send + 'static>(
        &self,
        allow: fn(&Principal) -> bool,
        touch: Touch,
        f: impl FnOnce(&mut Cluster, Principal) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, EcsError> {
        let call = self.st.call_digest(self.digest.clone(), allow, touch, f);
        api::AUDIT.scope(self.audit.clone(), call).await.map_err(EcsError::from)
    }

    /// A read of the whole cluster for this caller (lists and batches filter by its pool).
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Cluster, Principal) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, EcsError> {
        self.run(api::viewer, Touch::List, f).await
    }
}

/// Parses a call's request into `T`; a body of the wrong shape is ECS's
/// `SerializationException`, naming what serde found.
fn request<T: DeserializeOwned>(body: Value) -> Result<T, EcsError> {
    serde_json::from_value(body).map_err(|e| EcsError::serialization(e.to_string()))
}

async fn handle(
    State(ecs): State<Ecs>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let id = headers.get(crate::request_id::HEADER).cloned();
    let mut resp = match serve(&ecs, peer, &headers, body).await {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(e) => e.into_response(),
    };
    if let Some(id) = id {
        resp.headers_mut().insert("x-amzn-requestid", id);
    }
    resp
}

/// Authenticates, reads and verifies a call, then serves it.
async fn serve(ecs: &Ecs, peer: SocketAddr, headers: &HeaderMap, body: Body) -> Result<String, EcsError> {
    let st = &ecs.serving.state;
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let authorization = text("authorization").ok_or_else(EcsError::missing_token)?;
    let auth = sigv4::parse_authorization(authorization).map_err(EcsError::from)?;
    // A key a recent call was signed with is taken from the copy while it holds; else it is
    // looked up on this thread while the cluster lock is free (as bearer tokens are), on a
    // blocking thread otherwise.
    let found = match ecs.keys.get(&auth.access_key_id) {
        Some(held) => Ok(Some(held)),
        None => {
            let fast = (st.cluster.try_lock().ok())
                .map(|c| c.aws_key(&auth.access_key_id).map_err(crate::error::ApiError::from));
            let found = match fast {
                Some(found) => found,
                None => {
                    let key = auth.access_key_id.clone();
                    st.read(move |c| c.aws_key(&key)).await
                }
            };
            if let Ok(Some(key)) = &found {
                ecs.keys.put(&auth.access_key_id, key);
            }
            found
        }
    };
    let s = &ecs.serving;
    // A caller is charged to its key's bucket only once its signature holds: whoever knows an
    // access key id (no secret) cannot spend that key's limit. Until then it is unknown, and
    // an unknown key or a signature that fails is charged to its address, as REST charges an
    // unknown token.
    let unknown = |e: EcsError| {
        let anonymous = Err(crate::error::ApiError::from(Error::Unauthorized("unknown access key")));
        match crate::ratelimit::charge(&s.rate_limits, &s.limiter, &anonymous, Some(peer.ip())) {
            Ok(()) => e,
            Err(refused) => EcsError::from(refused),
        }
    };
    let key = match found {
        Ok(Some(key)) => key,
        Ok(None) => return Err(unknown(EcsError::unknown_key())),
        Err(crate::error::ApiError::Domain(Error::Unauthorized(why))) => {
            return Err(unknown(EcsError::expired_key(why)))
        }
        Err(e) => return Err(EcsError::from(e)),
    };
    let crate::cluster::AwsKey { who, secret, digest, now_ms, .. } = key;
    let bytes = read_body(ecs, body).await?;
    let target = text("x-amz-target").unwrap_or("");
    let pairs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())).collect();
    let req = sigv4::Request { method: "POST", path: "/", query: "", headers: &pairs, body: &bytes };
    let expect = sigv4::Expect {
        service: "ecs",
        region: ecs.options.region.as_deref(),
        required_headers: SIGNED_AT_LEAST,
        now_ms,
        max_skew_ms: MAX_SKEW_MS,
    };
    sigv4::verify(&req, &auth, &secret, &expect).map_err(|e| unknown(EcsError::from(e)))?;
    crate::ratelimit::charge(&s.rate_limits, &s.limiter, &Ok((who.clone(), digest.clone())), Some(peer.ip()))
        .map_err(EcsError::from)?;
    let op =
        target.strip_prefix(TARGET_PREFIX).ok_or_else(|| EcsError::unknown_operation(target))?.to_string();
    let body: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| EcsError::serialization(format!("the body is not JSON: {e}")))?
    };
    if !body.is_object() {
        return Err(EcsError::serialization("the body must be a JSON object".into()));
    }
    let audit = (!is_read(&op)).then(|| AuditContext {
        actor: api::actor(&who),
        role: who.role().unwrap_or(mpsfleet_types::access::Role::Viewer),
        action: format!("ECS {op}"),
        target: "/".into(),
        from: peer.ip().to_string(),
    });
    let arns = arn::Arns { region: auth.region.clone(), account: ecs.options.account_id.clone() };
    let scheme = if st.tls.is_some() { "https" } else { "http" };
    let endpoint = format!("{scheme}://{}", text("host").unwrap_or("localhost"));
    let call = Call { st: st.clone(), digest, who, arns, audit, endpoint };
    dispatch(&call, &op, body).await
}

/// Reads a call's body within the server's body read timeout and [`BODY_LIMIT`].
async fn read_body(ecs: &Ecs, body: Body) -> Result<axum::body::Bytes, EcsError> {
    let timeout = ecs.serving.body_read_timeout;
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Err(_) => Err(EcsError::client(format!(
            "the request body was not received within {} ms",
            timeout.as_millis()
        ))),
        Ok(Err(e)) => Err(EcsError::client(format!(
            "the request body could not be read (at most {BODY_LIMIT} bytes): {e}"
        ))),
        Ok(Ok(b)) => Ok(b),
    }
}

/// Whether an operation only reads.
fn is_read(op: &str) -> bool {
    op.starts_with("Describe") || op.starts_with("List") || op.starts_with("Get")
}

/// Serves `op`: its answer's JSON. The one list of the operations served: any other name is
/// `UnsupportedOperation`.
async fn dispatch(call: &Call, op: &str, body: Value) -> Result<String, EcsError> {
    // The task operations answer many tasks: they serialize them as they build them.
    match op {
        "RunTask" => return tasks::run(call, request(body)?).await,
        "StartTask" => return tasks::start(call, request(body)?).await,
        "StopTask" => return tasks::stop(call, request(body)?).await,
        "DescribeTasks" => return tasks::describe(call, request(body)?).await,
        _ => {}
    }
    let answer = match op {
        "CreateCluster" => clusters::create(call, request(body)?).await,
        "DeleteCluster" => clusters::delete(call, request(body)?).await,
        "UpdateCluster" => clusters::update(call, request(body)?).await,
        "DescribeClusters" => clusters::describe(call, request(body)?).await,
        "ListClusters" => clusters::list(call, request(body)?).await,
        "RegisterTaskDefinition" => taskdefs::register(call, body).await,
        "DescribeTaskDefinition" => taskdefs::describe(call, request(body)?).await,
        "ListTaskDefinitions" => taskdefs::list(call, request(body)?).await,
        "ListTaskDefinitionFamilies" => taskdefs::families(call, request(body)?).await,
        "DeregisterTaskDefinition" => taskdefs::deregister(call, request(body)?).await,
        "DeleteTaskDefinitions" => taskdefs::delete(call, request(body)?).await,
        "ListTasks" => tasks::list(call, request(body)?).await,
        "CreateService" => services::create(call, request(body)?).await,
        "UpdateService" => services::update(call, request(body)?).await,
        "DeleteService" => services::delete(call, request(body)?).await,
        "DescribeServices" => services::describe(call, request(body)?).await,
        "ListServices" => services::list(call, request(body)?).await,
        "ListServiceDeployments" => deployments::list(call, request(body)?).await,
        "DescribeServiceDeployments" => deployments::describe(call, request(body)?).await,
        "ListContainerInstances" => instances::list(call, request(body)?).await,
        "DescribeContainerInstances" => instances::describe(call, request(body)?).await,
        "UpdateContainerInstancesState" => instances::update_state(call, request(body)?).await,
        "DiscoverPollEndpoint" => instances::poll_endpoint(call).await,
        "TagResource" => tags::tag(call, request(body)?).await,
        "UntagResource" => tags::untag(call, request(body)?).await,
        "ListTagsForResource" => tags::list(call, request(body)?).await,
        "CreateCapacityProvider" => capacity::create(call, request(body)?).await,
        "DescribeCapacityProviders" => capacity::describe(call, request(body)?).await,
        "UpdateCapacityProvider" => capacity::update(call, request(body)?).await,
        "DeleteCapacityProvider" => capacity::delete(call, request(body)?).await,
        "PutClusterCapacityProviders" => capacity::put_cluster(call, request(body)?).await,
        "UpdateTaskProtection" => protection::update(call, request(body)?).await,
        "GetTaskProtection" => protection::get(call, request(body)?).await,
        "ExecuteCommand" => Err(EcsError::execute_command()),
        other => Err(EcsError::unsupported(other)),
    };
    answer.map(|v| v.to_string())
}

/// The pool a call's `cluster` names (a name or an ARN); none: the default cluster, the only
/// pool the caller sees or else the one named `default`. A pool outside the caller's scope is
/// not found, as the REST API answers.
fn pool_in(c: &Cluster, who: &Principal, arns: &arn::Arns, given: Option<&str>) -> Result<String, Error> {
    let name = match given.filter(|g| !g.is_empty()) {
        Some(g) => arns.short("cluster", g).ok_or_else(|| Error::not_found("pool", g))?.to_string(),
        None => {
            let seen: Vec<String> = c
                .read()
                .pools()
                .into_iter()
                .map(|p| p.name.to_string())
                .filter(|p| who.sees_pool(p))
                .collect();
            match seen.as_slice() {
                [only] => only.clone(),
                _ => "default".to_string(),
            }
        }
    };
    if !who.sees_pool(&name) {
        return Err(Error::not_found("pool", name));
    }
    c.read().pool(&name)?;
    Ok(name)
}

/// What task `t` runs: its definition with its run's overrides applied (None when the
/// definition is gone).
fn run_definition<'c>(c: &'c Cluster, t: &Task) -> Option<std::borrow::Cow<'c, TaskDefinition>> {
    let td = c.read().taskdef("taskDefinition", &t.task_definition.to_string()).ok();
    match (td, t.overrides()) {
        (Some(d), Some(o)) => Some(std::borrow::Cow::Owned(o.apply(d))),
        (d, _) => d.map(std::borrow::Cow::Borrowed),
    }
}

/// [`run_definition`], shared: for an answer encoded after the lock.
fn run_definition_shared(c: &Cluster, t: &Task) -> Option<Arc<TaskDefinition>> {
    let td = c.read().taskdef_shared("taskDefinition", &t.task_definition.to_string()).ok();
    match (td, t.overrides()) {
        (Some(d), Some(o)) => Some(Arc::new(o.apply(d))),
        (d, _) => d.cloned(),
    }
}

/// Whether `include` (a Describe call's) asks for the tags.
fn with_tags(include: &[String]) -> bool {
    include.iter().any(|i| i == "TAGS")
}

/// ECS's `failures[]` entry.
fn failure(arn: &str, reason: &str, detail: Option<String>) -> Value {
    let mut v = serde_json::json!({"arn": arn, "reason": reason});
    if let Some(d) = detail {
        v["detail"] = Value::String(d);
    }
    v
}

/// Checks a batch's size: 1 to `max` names. `empty` is ECS's refusal of none (its words).
fn check_batch(field: &str, given: &[String], max: usize, empty: EcsError) -> Result<(), EcsError> {
    if given.is_empty() {
        return Err(empty);
    }
    if given.len() > max {
        return Err(EcsError::invalid(format!(
            "{field} can list at most {max} names or ARNs, got {}",
            given.len()
        )));
    }
    Ok(())
}
