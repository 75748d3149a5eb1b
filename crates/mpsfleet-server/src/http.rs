//! The HTTP layer under the API: connections with header, body and idle timeouts and a cap on
//! how many are open, per-token rate limits and authentication before a request body is read,
//! per-route body limits, and the JSON error format for the HTTP layer's own refusals.

use crate::api::{self, AppState};
use crate::auth::{self, Principal};
use crate::cluster::Error;
use crate::error::ApiError;
use crate::ratelimit::{RateLimiter, RateLimits};
use axum::body::{Body, HttpBody};
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// How long connections may take and how many may be open (see docs/api.md, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// From the first byte of a request to the end of its headers.
    pub header_read_timeout: Duration,
    /// From the end of a request's headers to the end of its body.
    pub body_read_timeout: Duration,
    /// How long a keep-alive connection with no request in flight and no traffic stays open.
    pub idle_timeout: Duration,
    /// Connections open at once; past it, new ones wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
        }
    }
}

/// Request bodies of task definitions: the largest one any route takes. Documents over
/// [`mpsfleet_core::taskdef::MAX_DOCUMENT_BYTES`] are refused by the parser, naming `$`.
pub const TASKDEF_BODY_LIMIT: usize = 2 << 20;
/// Task state reports: an output snapshot of 16 KiB, escaped, and the containers.
pub const TASK_REPORT_BODY_LIMIT: usize = 512 << 10;
/// Host registrations (64 GPUs at most) and host status reports.
pub const AGENT_BODY_LIMIT: usize = 256 << 10;
/// New secrets: a 64 KiB value, escaped, and its name.
pub const SECRET_BODY_LIMIT: usize = 512 << 10;
/// Every other route.
pub const SMALL_BODY_LIMIT: usize = 64 << 10;
/// The longest body over its route's limit the server still reads (and drops) to answer
/// 413 on a connection it keeps; past it the connection is closed after the answer.
pub const DRAIN_LIMIT: u64 = 16 << 20;

/// Reads and drops `body`, up to [`DRAIN_LIMIT`] bytes and within `timeout`; whether it ended.
/// (A body dropped before its end makes the connection close.)
async fn drain(body: Body, timeout: Duration) -> bool {
    use futures_util::StreamExt as _;
    let mut stream = body.into_data_stream();
    let read = async {
        let mut total = 0u64;
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else { return false };
            total += chunk.len() as u64;
            if total > DRAIN_LIMIT {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(timeout, read).await.unwrap_or(false)
}

/// The routes anyone may call, without a token.
/// (`/v1/events/replica` and `/v1/discovery/replica` check their own caller: a server of the
/// cluster, by a signed header; `/v1/console/session` takes a one-time sign-in code instead of
/// a token.)
pub const PUBLIC_ROUTES: &[&str] = &[
    "/v1/healthz",
    "/v1/cluster/ca",
    "/v1/openapi.json",
    "/v1/events/replica",
    "/v1/discovery/replica",
    "/v1/console/session",
];

/// Who may call a route with a body, and the longest body it takes.
fn route_rules(path: &str) -> (fn(&Principal) -> bool, usize) {
    match path {
        "/v1/taskdefs" => (api::operator, TASKDEF_BODY_LIMIT),
        "/v1/agent/register" => (api::joiner, AGENT_BODY_LIMIT),
        "/v1/agent/status" => (api::host, AGENT_BODY_LIMIT),
        "/v1/agent/tasks/{id}/status" => (api::host, TASK_REPORT_BODY_LIMIT),
        "/v1/secrets" => (api::admin, SECRET_BODY_LIMIT),
        "/v1/console/links" => (api::viewer, SMALL_BODY_LIMIT),
        // Takes no body and no token (a code in a header); whoever sends one anyway reaches the
        // handler, which asks for the code.
        "/v1/console/session" => (|_| true, SMALL_BODY_LIMIT),
        "/v1/pools"
        | "/v1/pools/{name}"
        | "/v1/tokens"
        | "/v1/join-tokens"
        | "/v1/hosts/{id}/revoke-credential"
        | "/v1/admin-token/rotate"
        | "/v1/cluster/certificate/rotate"
        | "/v1/cluster/ca/rotation"
        | "/v1/cluster/ca/rotation/activate" => (api::admin, SMALL_BODY_LIMIT),
        // Tasks, services, hosts and incidents.
        _ => (api::operator, SMALL_BODY_LIMIT),
    }
}

/// Whether the request announces a body (a non-zero length, or chunks).
fn has_body(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() != "0")
}

/// A refusal sent before the body was read: the connection cannot be reused, so it is closed.
fn refuse_closing(e: ApiError) -> Response {
    let mut resp = e.into_response();
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A refusal for the caller's rate, with its `Retry-After`.
fn too_many_requests(e: ApiError) -> Response {
    let retry_after = match &e {
        ApiError::TooManyRequests { retry_after_s, .. } => *retry_after_s,
        _ => 1,
    };
    let mut resp = e.into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after.max(1)));
    resp
}

/// The audit context of a request by `who`, when it is a change by a person or tool.
fn audit_context(
    req: &Request,
    route: &str,
    who: &Result<(Principal, String), ApiError>,
    peer: Option<std::net::IpAddr>,
) -> Option<crate::cluster::AuditContext> {
    let method = req.method();
    if method == axum::http::Method::GET
        || method == axum::http::Method::HEAD
        || route.starts_with("/v1/agent/")
    {
        return None;
    }
    let (p, _) = who.as_ref().ok()?;
    Some(crate::cluster::AuditContext {
        actor: api::actor(p),
        role: api::role_of(p)?,
        action: format!("{method} {route}"),
        target: req.uri().path().to_string(),
        from: peer.map_or_else(|| "unknown".to_string(), |ip| ip.to_string()),
    })
}

/// What [`guard`] needs.
#[derive(Clone)]
pub struct Guard {
    pub state: AppState,
    pub body_read_timeout: Duration,
    /// The admin token's digest, read without the cluster lock (which a group commit of
    /// registrations holds through its fsync).
    admin: crate::cluster::AdminDigest,
    /// The join tokens, read without the cluster lock.
    joins: crate::cluster::JoinDigests,
    pub rate_limits: RateLimits,
    pub limiter: Arc<RateLimiter>,
}

/// Route middleware. Every request but `GET /v1/healthz` is charged to its caller's rate limit
/// first: a known token to its own bucket, a missing or unknown one to its peer address's
/// (see [`crate::ratelimit`]); past it, the answer is `429` with `Retry-After`. A request with
/// a body is then authenticated for its route (as its handler does) before any of the body is
/// read, and its body is read within the body read timeout and the route's limit. Requests
/// without a body need a known token (but on [`PUBLIC_ROUTES`]) and go on to their handlers,
/// which check its role.
pub async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    let st = &g.state;
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| req.uri().path(), MatchedPath::as_str);
    if route == "/v1/healthz" {
        return next.run(req).await;
    }
    let route = route.to_string();
    let body = has_body(&req);
    let who = identify(st, &g.admin, &g.joins, req.headers()).await;
    let peer = req.extensions().get::<ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
    let audit = audit_context(&req, &route, &who, peer);
    if let Err(e) = charge(&g, &who, peer) {
        // An unread body leaves the connection unusable.
        let mut resp = too_many_requests(e);
        if body {
            resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return resp;
    }
    if !body {
        // The caller is known before anything of its request is looked at: a missing or
        // unknown token is answered 401 whatever its parameters are.
        return match who {
            Err(e) if !PUBLIC_ROUTES.contains(&route.as_str()) => e.into_response(),
            _ => api::AUDIT.scope(audit, next.run(req)).await,
        };
    }
    let (allow, limit) = route_rules(&route);
    let announced: Option<u64> =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse().ok());
    let timeout = g.body_read_timeout;
    // A refusal goes at once. The body of a caller the server knows is read (and dropped)
    // meanwhile when it is announced and not huge, so that a client still writing it gets to
    // read the refusal rather than a broken connection (over TLS above all). An unknown
    // caller's body, one refused to an agent's or a joining host's token, or a huge one, is
    // never read: the connection closes after the refusal.
    let refuse = |e: ApiError, drained: bool, req: Request| {
        if drained && announced.is_some_and(|n| n <= DRAIN_LIMIT) {
            tokio::spawn(drain(req.into_body(), timeout));
            e.into_response()
        } else {
            refuse_closing(e)
        }
    };
    match who {
        Err(e) => return refuse_closing(e),
        Ok((who, _)) if !allow(&who) => {
            let e =
                ApiError::from(Error::Forbidden(format!("this endpoint is not open to {}", who.describe())));
            let person = matches!(who, Principal::Admin | Principal::Token { .. });
            return refuse(e, person, req);
        }
        Ok(_) => {}
    }
    if announced.is_some_and(|n| n > limit as u64) {
        return refuse(ApiError::PayloadTooLarge { route, limit }, true, req);
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return refuse_closing(ApiError::BodyTimeout {
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            })
        }
        Ok(Err(e)) if is_length_limit(&e) => {
            return refuse_closing(ApiError::PayloadTooLarge { route, limit })
        }
        Ok(Err(e)) => {
            return refuse_closing(ApiError::BadRequest(format!("cannot read the request body: {e}")))
        }
        Ok(Ok(b)) => b,
    };
    let run = next.run(Request::from_parts(parts, Body::from(bytes)));
    api::AUDIT.scope(audit, run).await
}

/// Charges a request to its caller's bucket ([`crate::ratelimit::charge`]).
fn charge(
    g: &Guard,
    who: &Result<(Principal, String), ApiError>,
    peer: Option<std::net::IpAddr>,
) -> Result<(), ApiError> {
    crate::ratelimit::charge(&g.rate_limits, &g.limiter, who, peer)
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.to_string().contains("length limit exceeded") {
            return true;
        }
        source = s.source();
    }
    false
}

/// Who the bearer token names, and its digest: the lookup `AppState::call` and the agent
/// routes make. The admin and join tokens are recognised without the cluster lock; other tokens
/// are looked up on this thread while the lock is free, on a blocking thread otherwise.
async fn identify(
    st: &AppState,
    admin: &crate::cluster::AdminDigest,
    joins: &crate::cluster::JoinDigests,
    headers: &axum::http::HeaderMap,
) -> Result<(Principal, String), ApiError> {
    let token = auth::bearer(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()))?;
    let digest = auth::digest(token);
    let seen = if admin.is(&digest) {
        Some(Ok(Principal::Admin))
    } else {
        joins.check(&digest).map(|valid| valid.map(|()| Principal::Joiner))
    };
    let fast = seen.or_else(|| st.cluster.try_lock().ok().map(|c| c.authenticate_digest(&digest)));
    let who = match fast {
        Some(who) => who?,
        None => {
            let (cluster, digest) = (st.cluster.clone(), digest.clone());
            tokio::task::spawn_blocking(move || {
                let c = cluster.lock().map_err(|_| {
                    Error::Internal("state lock poisoned by an earlier failure; restart the server".into())
                })?;
                c.authenticate_digest(&digest)
            })
            .await
            .map_err(|e| ApiError::from(Error::Internal(format!("request handler failed: {e}"))))??
        }
    };
    Ok((who, digest))
}

/// Outer middleware: a refusal of the HTTP layer itself (a bad path parameter, a body it could
/// not read), which comes as plain text, becomes the JSON error every other answer uses.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with(crate::ecs::CONTENT_TYPE));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (_, body) = resp.into_parts();
    let text = match axum::body::to_bytes(body, SMALL_BODY_LIMIT).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(e) => e.to_string(),
    };
    let e = match status.as_u16() {
        413 => ApiError::PayloadTooLarge { route: "this route".into(), limit: SMALL_BODY_LIMIT },
        404 => ApiError::not_found("route", "for this method and path"),
        405 => ApiError::MethodNotAllowed,
        _ if status.is_server_error() => ApiError::from(Error::Internal(text)),
        _ => ApiError::BadRequest(text),
    };
    let mut out = e.into_response();
    *out.status_mut() = status;
    out
}

/// The API's router with the HTTP layer's middleware: [`guard`] on every route (not on the
/// fallbacks, so that an unknown path stays a 404), [`json_errors`] around everything.
pub fn app(
    state: AppState,
    limits: &HttpLimits,
    rate_limits: RateLimits,
    ecs: crate::ecs::EcsOptions,
) -> Router {
    app_with(state, limits, rate_limits, Arc::default(), ecs)
}

fn app_with(
    state: AppState,
    limits: &HttpLimits,
    rate_limits: RateLimits,
    limiter: Arc<RateLimiter>,
    ecs: crate::ecs::EcsOptions,
) -> Router {
    let (admin, joins, forward_key) = state
        .cluster
        .lock()
        .map(|c| {
            (c.read().admin_digest(), c.read().join_digests(), crate::forward::forwarding_key(c.server_key()))
        })
        .expect("the cluster lock at start");
    let guard_state = Guard {
        state: state.clone(),
        body_read_timeout: limits.body_read_timeout,
        admin,
        joins,
        rate_limits,
        limiter,
    };
    let metrics = state.metrics.clone();
    let state_for_leadership = state.clone();
    let ecs_router = crate::ecs::router(
        crate::ecs::Serving {
            state: state.clone(),
            body_read_timeout: guard_state.body_read_timeout,
            rate_limits: guard_state.rate_limits,
            limiter: guard_state.limiter.clone(),
        },
        ecs,
    );
    api::router(state)
        .route_layer(axum::middleware::from_fn_with_state(guard_state, guard))
        .route_layer(axum::middleware::from_fn_with_state(metrics, crate::metrics::observe))
        // The console's page and assets: public, so outside the guard (nothing in them is data).
        .merge(crate::console::router())
        // The ECS-compatible API at `POST /`: it authenticates SigV4 itself (`ecs`).
        .merge(ecs_router)
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn_with_state(state_for_leadership, leadership))
        .layer(axum::middleware::from_fn_with_state(forward_key, forwarded_peer))
        .layer(axum::middleware::from_fn(crate::request_id::middleware))
}

/// The answer's fence header: the fence (the leader key's create revision) of the leadership
/// the answering server serves under. Every write it acknowledged was committed under it.
pub const FENCE_HEADER: &str = "mpsfleet-fence";
/// The answer's revision header: the store revision this server had committed or caught up to
/// when the request arrived; what the answer shows is at least that new.
pub const REVISION_HEADER: &str = "mpsfleet-revision";

/// On a server of several (etcd), every answer says which leadership gave it and from which
/// revision; and a leader that can no longer tell, on its own clock, that it still leads (its
/// lease not renewed for two thirds of the TTL, e.g. after a pause) answers nothing but 503,
/// so that it never shows a state older than one the new leader has shown.
async fn leadership(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(role) = state.ha.clone() else { return next.run(req).await };
    if !role.may_answer() {
        return ApiError::from(Error::StoreUnavailable(
            "this server's leadership is not current (its lease was not renewed in time): retry at the leader".into(),
        ))
        .into_response();
    }
    let revision = *state.changed.borrow();
    let mut answer = next.run(req).await;
    let headers = answer.headers_mut();
    headers.insert(FENCE_HEADER, HeaderValue::from(role.leadership.fence()));
    headers.insert(REVISION_HEADER, HeaderValue::from(revision));
    answer
}

/// A request a follower forwarded (crate::forward) names its original peer and Host in signed
/// headers: that peer becomes the request's `ConnectInfo`, that Host its `Host`. An unsigned or
/// forged header is dropped and the connection's own peer and Host stand.
async fn forwarded_peer(State(key): State<[u8; 32]>, mut req: Request, next: Next) -> Response {
    if let Some(value) = req.headers_mut().remove(crate::forward::FORWARDED_PEER) {
        match value.to_str().ok().and_then(|v| crate::forward::verify_forwarded_peer(&key, v)) {
            Some(peer) => {
                req.extensions_mut().insert(ConnectInfo(peer));
            }
            None => tracing::warn!(
                "a request's forwarded-peer header is not signed by a server of this cluster; ignored"
            ),
        }
    }
    // And the Host the client sent, which its signature may cover (an ECS call's SigV4).
    if let Some(value) = req.headers_mut().remove(crate::forward::FORWARDED_HOST) {
        let host = value.to_str().ok().and_then(|v| crate::forward::verify_forwarded_host(&key, v));
        match host.and_then(|h| HeaderValue::from_str(&h).ok()) {
            Some(h) => {
                req.headers_mut().insert(header::HOST, h);
            }
            None => tracing::warn!(
                "a request's forwarded-host header is not signed by a server of this cluster; ignored"
            ),
        }
    }
    next.run(req).await
}

/// When a connection last moved a byte, how many of its requests are in flight, and since when
/// it has been reading a request's headers.
#[derive(Default)]
struct Activity {
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// One more than the millisecond (since the connection's epoch) of the first byte read
    /// while no request was in flight, until that request's headers are complete; 0 while no
    /// request is being read. The header read timeout runs from here: from a request's first
    /// byte (from the connection's start, then its TLS handshake's end, for its first request),
    /// not from the end of the previous answer, so that a keep-alive connection waiting for its
    /// next request is closed by the idle timeout only.
    head_since: AtomicU64,
    /// Wakes the connection's loop when a request's first byte arrives.
    head_started: tokio::sync::Notify,
}

impl Activity {
    fn touch(&self, epoch: tokio::time::Instant) -> u64 {
        let ms = ms_since(epoch);
        self.last_ms.store(ms, Ordering::Relaxed);
        ms
    }

    /// Bytes were read: while no request is in flight, they begin one.
    fn read(&self, epoch: tokio::time::Instant) {
        let ms = self.touch(epoch);
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self
                .head_since
                .compare_exchange(0, ms.saturating_add(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.head_started.notify_one();
        }
    }

    /// A request's headers are complete: it is in flight.
    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
    }
}

/// A connection's socket that records its traffic.
struct Tracked {
    io: TcpStream,
    activity: Arc<Activity>,
    epoch: tokio::time::Instant,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read(self.epoch);
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch(self.epoch);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body that counts its request as in flight until it is sent or dropped (a long
/// poll or an event stream is not idle).
struct InFlight {
    body: Body,
    activity: Arc<Activity>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HttpBody for InFlight {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves `app` on `listener` with `limits` until `shutdown` completes; then stops accepting,
/// lets each connection finish the request it is in, and returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        stop_tx.send_replace(true);
    });
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = stop_rx.clone();
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (io, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: wait, rather than spin.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        connections.spawn(connection(io, peer, app.clone(), tls.clone(), limits, stop_rx.clone(), permit));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One connection: its TLS handshake first when the server serves HTTPS (within the header
/// timeout, so a client that never finishes it holds its slot no longer than one that never
/// sends its headers), then HTTP/1.1.
async fn connection(
    io: TcpStream,
    peer: std::net::SocketAddr,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: HttpLimits,
    stop: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let epoch = tokio::time::Instant::now();
    // A new connection's first request (its TLS handshake first) is due from the start.
    let activity = Arc::new(Activity { head_since: AtomicU64::new(1), ..Activity::default() });
    let tracked = Tracked { io, activity: activity.clone(), epoch };
    let Some(acceptor) = tls else {
        return http_connection(tracked, peer, app, activity, epoch, limits, stop, permit).await;
    };
    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(tracked)).await {
        Ok(Ok(stream)) => {
            // The first request's headers are due a header timeout after the handshake (whose
            // last read may have carried the start of them already).
            activity.head_since.store(ms_since(epoch).saturating_add(1), Ordering::Relaxed);
            http_connection(stream, peer, app, activity, epoch, limits, stop, permit).await
        }
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

#[allow(clippy::too_many_arguments)]
async fn http_connection<I>(
    io: I,
    peer: std::net::SocketAddr,
    app: Router,
    activity: Arc<Activity>,
    epoch: tokio::time::Instant,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
    _permit: tokio::sync::OwnedSemaphorePermit,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(io);
    let counted = activity.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        use tower::ServiceExt as _;
        // Counted until its response body is sent (a dropped connection counts no more).
        counted.request_started();
        let (app, activity) = (app.clone(), counted.clone());
        req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
        async move {
            let resp = app.oneshot(req.map(Body::new)).await.unwrap_or_else(|e| match e {});
            Ok::<_, std::convert::Infallible>(resp.map(|body| Body::new(InFlight { body, activity })))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        // The header read timeout is this loop's (from a request's first byte, `Activity`):
        // hyper's own runs from the end of the previous answer, which would close a
        // keep-alive connection after the header timeout instead of the idle timeout.
        .header_read_timeout(None)
        .keep_alive(true)
        .serve_connection(io, service)
        // `task exec` takes its connection over (`api/exec.rs`).
        .with_upgrades();
    tokio::pin!(conn);
    let idle_ms = u64::try_from(limits.idle_timeout.as_millis()).unwrap_or(u64::MAX);
    let header_ms = u64::try_from(limits.header_read_timeout.as_millis()).unwrap_or(u64::MAX);
    let mut closing = false;
    loop {
        let busy = activity.in_flight.load(Ordering::Relaxed) > 0;
        let quiet = quiet_ms(&activity, epoch);
        let check = Duration::from_millis(if busy { idle_ms } else { idle_ms.saturating_sub(quiet).max(1) });
        // A request whose headers are being read: its deadline.
        let head_since = activity.head_since.load(Ordering::Relaxed);
        let head_deadline = (head_since != 0)
            .then(|| epoch + Duration::from_millis((head_since - 1).saturating_add(header_ms)));
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.wait_for(|s| *s), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = activity.head_started.notified(), if head_deadline.is_none() => {}
            () = tokio::time::sleep_until(head_deadline.unwrap_or(epoch)), if head_deadline.is_some() => {
                if activity.head_since.load(Ordering::Relaxed) == head_since
                    && activity.in_flight.load(Ordering::Relaxed) == 0
                {
                    tracing::debug!(%peer, "a request's headers took longer than the header read timeout; closing");
                    return;
                }
            }
            () = tokio::time::sleep(check), if !closing => {
                if quiet_ms(&activity, epoch) >= idle_ms && activity.in_flight.load(Ordering::Relaxed) == 0 {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Milliseconds since the connection last moved a byte.
fn quiet_ms(activity: &Activity, epoch: tokio::time::Instant) -> u64 {
    ms_since(epoch).saturating_sub(activity.last_ms.load(Ordering::Relaxed))
}

/// Milliseconds since the connection's epoch.
fn ms_since(epoch: tokio::time::Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::Limit;
    use tower::ServiceExt as _;

    /// Random tokens are all charged to their peer's one bucket: however many come, the
    /// limiter holds one bucket for them, and refuses them once it is empty.
    #[tokio::test]
    async fn random_tokens_share_their_peers_bucket_and_grow_no_buckets() {
        let clock = Arc::new(mpsfleet_core::clock::ManualClock::new(1_000_000));
        let store = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut admin = None;
        let cluster = crate::cluster::Cluster::load(store, clock, |t| {
            admin = Some(t.admin_token.clone());
            Ok(())
        })
        .unwrap();
        let admin = admin.expect("first start");
        let limits = RateLimits { unknown_per_ip: Limit::new(1, 10), ..RateLimits::default() };
        let limiter = Arc::new(RateLimiter::default());
        let app = app_with(
            AppState::new(cluster),
            &HttpLimits::default(),
            limits,
            limiter.clone(),
            Default::default(),
        );
        let peer: std::net::SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let send = |token: String| {
            let mut req = Request::get("/v1/pools")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .body(Body::empty())
                .unwrap();
            req.extensions_mut().insert(ConnectInfo(peer));
            app.clone().oneshot(req)
        };
        let mut statuses = std::collections::BTreeMap::new();
        for i in 0..5_000 {
            let resp = send(format!("mpsf_adm_random{i:08}")).await.unwrap();
            *statuses.entry(resp.status().as_u16()).or_insert(0) += 1;
        }
        // The burst of 10 answered as unknown (plus any refilled meanwhile), the rest refused.
        assert!((10..=15).contains(&statuses[&401]), "{statuses:?}");
        assert_eq!(statuses[&401] + statuses[&429], 5_000, "{statuses:?}");
        assert_eq!(limiter.bucket_counts(), (0, 1), "one bucket for the peer, none for the tokens");
        // The admin token has its own bucket, and is answered.
        let resp = send(admin).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(limiter.bucket_counts(), (1, 1));
    }
}
