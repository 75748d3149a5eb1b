//! What a follower serves: every request forwarded to the elected leader, so that a client or
//! agent given any one server's address reaches the cluster. The follower adds who the peer
//! was (`x-mpsfleet-forwarded-peer`, signed with a key derived from `server.key`, which all
//! servers of one store share); the leader believes that header only with a valid signature,
//! so it still reaches an agent at the address its heartbeats come from and rate-limits
//! unknown tokens per real address. Bodies are streamed both ways: long polls and event
//! streams pass through, and the leader applies its own limits to what it receives.

use crate::cluster::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::TryStreamExt;

use crate::auth::ServerKey;
use crate::error::ApiError;

/// The header a follower names the original peer in: `IP:PORT;SIGNATURE`.
pub const FORWARDED_PEER: &str = "x-mpsfleet-forwarded-peer";

/// The header a follower names the `Host` the client sent in: `HOST;SIGNATURE`. The leader
/// puts it back, so that what the client signed over its Host (an ECS call's SigV4) still
/// verifies after forwarding.
pub const FORWARDED_HOST: &str = "x-mpsfleet-forwarded-host";

/// The header a follower signs its copy of the event history's request with:
/// `TIME_MS;SIGNATURE` (see [`replica_header`]).
pub const REPLICA: &str = "x-mpsfleet-replica";

/// How far a replica header's time may be from the leader's clock.
const REPLICA_SKEW_MS: u64 = 5 * 60 * 1000;

/// The purpose the forwarding key is derived for.
const KEY_PURPOSE: &str = "forwarded-peer";

/// Headers that describe one connection, not the request: never passed on.
const HOP_BY_HOP: [&str; 8] =
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"];

/// The key forwarded-peer headers are signed with.
pub fn forwarding_key(key: &ServerKey) -> [u8; 32] {
    key.derive_key(KEY_PURPOSE)
}

fn signature(key: &[u8; 32], peer: &str) -> String {
    crate::auth::hex(&crate::auth::hmac_sha256(key, peer.as_bytes()))
}

/// The header value naming `peer`, signed.
pub fn forwarded_peer(key: &[u8; 32], peer: SocketAddr) -> String {
    let peer = peer.to_string();
    format!("{peer};{}", signature(key, &peer))
}

/// The peer a signed header names; `None` when it is malformed or not signed with `key`.
pub fn verify_forwarded_peer(key: &[u8; 32], value: &str) -> Option<SocketAddr> {
    let (peer, sig) = value.split_once(';')?;
    let expected = signature(key, peer);
    // Compare in constant time: the signature is a secret until it is right.
    if expected.len() != sig.len()
        || expected.bytes().zip(sig.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) != 0
    {
        return None;
    }
    peer.parse().ok()
}

/// The header value naming the client's `host`, signed (apart from peers: a peer's
/// signature never passes for a host's).
pub fn forwarded_host(key: &[u8; 32], host: &str) -> String {
    format!("{host};{}", signature(key, &format!("host {host}")))
}

/// The host a signed header names; `None` when it is malformed or not signed with `key`.
pub fn verify_forwarded_host(key: &[u8; 32], value: &str) -> Option<String> {
    let (host, sig) = value.rsplit_once(';')?;
    let expected = signature(key, &format!("host {host}"));
    if expected.len() != sig.len()
        || expected.bytes().zip(sig.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) != 0
    {
        return None;
    }
    Some(host.to_string())
}

/// The header a follower asks for the leader's event history with, at `now_ms`.
pub fn replica_header(key: &[u8; 32], now_ms: u64) -> String {
    format!("{now_ms};{}", signature(key, &format!("replica {now_ms}")))
}

/// Whether `value` is a replica header signed with `key` within [`REPLICA_SKEW_MS`] of `now_ms`.
pub fn verify_replica(key: &[u8; 32], value: &str, now_ms: u64) -> bool {
    let Some((at, sig)) = value.split_once(';') else { return false };
    let Ok(at_ms) = at.parse::<u64>() else { return false };
    let expected = signature(key, &format!("replica {at_ms}"));
    expected.len() == sig.len()
        && expected.bytes().zip(sig.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
        && at_ms.abs_diff(now_ms) <= REPLICA_SKEW_MS
}

/// Where the follower sends what it receives.
pub trait LeaderLookup: Send + Sync + 'static {
    /// The leader's URL (`https://HOST:PORT`), if one is elected and it is not this server
    /// (which has just been elected and is about to serve itself).
    fn leader_url(&self) -> Option<String>;
}

struct Forwarder {
    http: reqwest::Client,
    leader: Arc<dyn LeaderLookup>,
    key: [u8; 32],
}

/// The follower's whole API: everything is forwarded to the leader.
pub fn router(leader: Arc<dyn LeaderLookup>, ca_pem: &[u8], key: &ServerKey) -> Result<Router, ApiError> {
    let http = leader_client(ca_pem)?;
    let state = Arc::new(Forwarder { http, leader, key: forwarding_key(key) });
    Ok(Router::new().fallback(forward).with_state(state))
}

/// How a follower calls the leader: the cluster's CA only, no redirects.
fn leader_client(ca_pem: &[u8]) -> Result<reqwest::Client, ApiError> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(2));
    for der in mpsfleet_client::tls::certificates(ca_pem)
        .map_err(|e| ApiError::from(Error::Internal(format!("cluster CA: {e}"))))?
    {
        let cert = reqwest::Certificate::from_der(&der)
            .map_err(|e| ApiError::from(Error::Internal(format!("cluster CA: {e}"))))?;
        builder = builder.add_root_certificate(cert);
    }
    builder.build().map_err(|e| ApiError::from(Error::Internal(format!("forwarding client: {e}"))))
}

/// While this server follows: copies the leader's event history into `history` as it grows
/// (`GET /v1/events/replica` from the last event it has), reconnecting a second after the
/// leader goes or changes, so that once elected it goes on from the same past. Runs until
/// aborted.
pub async fn copy_events(
    leader: Arc<dyn LeaderLookup>,
    ca_pem: &[u8],
    key: &ServerKey,
    history: Arc<crate::events::history::History>,
) -> Result<(), ApiError> {
    let http = leader_client(ca_pem)?;
    let key = forwarding_key(key);
    loop {
        let lookup = leader.clone();
        if let Some(url) = tokio::task::spawn_blocking(move || lookup.leader_url()).await.ok().flatten() {
            let copied = copy_from(&http, &key, &url, &history).await;
            tracing::debug!(leader = %url, copied, "the leader's event stream ended; copying again shortly");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Fetches what the leader publishes in DNS (`GET /v1/discovery/replica`), for a follower
/// answering DNS from a copy (`dns::serve_copy`).
pub struct DiscoveryCopier {
    http: reqwest::Client,
    key: [u8; 32],
    leader: Arc<dyn LeaderLookup>,
    /// The leader last copied from: looked up again only once a copy from it fails.
    url: std::sync::Mutex<Option<String>>,
}

impl DiscoveryCopier {
    pub fn new(leader: Arc<dyn LeaderLookup>, ca_pem: &[u8], key: &ServerKey) -> Result<Self, ApiError> {
        let http = leader_client(ca_pem)?;
        Ok(DiscoveryCopier { http, key: forwarding_key(key), leader, url: Default::default() })
    }

    /// The leader's published services now; None when no leader answers in time.
    pub async fn fetch(&self) -> Option<crate::dns::DiscoveryCopy> {
        let known = self.url.lock().ok().and_then(|u| u.clone());
        let url = match known {
            Some(u) => u,
            None => {
                let lookup = self.leader.clone();
                tokio::task::spawn_blocking(move || lookup.leader_url()).await.ok().flatten()?
            }
        };
        let copy = self.fetch_from(&url).await;
        if let Ok(mut u) = self.url.lock() {
            *u = copy.is_some().then_some(url);
        }
        copy
    }

    async fn fetch_from(&self, url: &str) -> Option<crate::dns::DiscoveryCopy> {
        let now_ms = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
        let resp = (self.http)
            .get(format!("{}/v1/discovery/replica", url.trim_end_matches('/')))
            .header(REPLICA, replica_header(&self.key, now_ms))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            tracing::warn!(leader = %url, status = resp.status().as_u16(), "the leader refused to share what it publishes in DNS");
            return None;
        }
        resp.json().await.ok()
    }
}

/// Copies from the leader at `url` until its stream ends or fails; returns how many events.
async fn copy_from(
    http: &reqwest::Client,
    key: &[u8; 32],
    url: &str,
    history: &crate::events::history::History,
) -> u64 {
    let now_ms = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
    let endpoint = format!("{}/v1/events/replica", url.trim_end_matches('/'));
    let request = http
        .get(&endpoint)
        .query(&[("after", history.last().to_string())])
        .header(REPLICA, replica_header(key, now_ms));
    let resp = match request.send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            tracing::warn!(leader = %url, status = r.status().as_u16(), "the leader refused to share its event history");
            return 0;
        }
        Err(_) => return 0,
    };
    let mut stream = mpsfleet_client::EventStream::new(endpoint, resp);
    let mut copied = 0;
    while let Ok(Some(item)) = stream.next().await {
        match item {
            mpsfleet_client::StreamItem::Event(ev) => copied += u64::from(history.copy(*ev)),
            // Fell behind: ask again from the last event copied (the history still has the rest).
            mpsfleet_client::StreamItem::Lagged(_) => break,
        }
    }
    copied
}

async fn forward(
    State(f): State<Arc<Forwarder>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
) -> Response {
    let leader = {
        let lookup = f.leader.clone();
        tokio::task::spawn_blocking(move || lookup.leader_url()).await.ok().flatten()
    };
    let Some(leader) = leader else {
        return unavailable(
            "NoLeader",
            "no server leads at the moment (an election is under way); retry shortly",
        );
    };
    // A request another server forwarded here took this one for the leader: its view is stale
    // or this one's is; passing it on again could only go round in a circle.
    if req.headers().contains_key(FORWARDED_PEER) {
        return unavailable("NoLeader", "the leader is changing; retry shortly");
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut out = f.http.request(req.method().clone(), format!("{}{path}", leader.trim_end_matches('/')));
    for (name, value) in req.headers() {
        if !HOP_BY_HOP.contains(&name.as_str())
            && name.as_str() != FORWARDED_PEER
            && name.as_str() != FORWARDED_HOST
        {
            out = out.header(name, value);
        }
    }
    out = out.header(FORWARDED_PEER, forwarded_peer(&f.key, peer));
    if let Some(host) = req.headers().get(axum::http::header::HOST).and_then(|h| h.to_str().ok()) {
        out = out.header(FORWARDED_HOST, forwarded_host(&f.key, host));
    }
    // An upgrade (`task exec`) is asked for again, and the two connections joined once the
    // leader has switched.
    let upgrade = req.headers().get(axum::http::header::UPGRADE).cloned();
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    if let Some(protocol) = &upgrade {
        out = out.header("connection", "upgrade").header("upgrade", protocol);
    } else {
        let body = req.into_body().into_data_stream().map_err(std::io::Error::other);
        out = out.body(reqwest::Body::wrap_stream(body));
    }
    let answer = match out.send().await {
        Ok(a) => a,
        Err(e) => {
            // Expected while the leader changes; the client is told to retry.
            tracing::debug!(%leader, error = %e, "could not forward a request to the leader");
            return unavailable(
                "LeaderUnavailable",
                &format!("the leader at {leader} did not answer; retry shortly"),
            );
        }
    };
    if let (Some(client), Some(protocol), StatusCode::SWITCHING_PROTOCOLS) =
        (client_upgrade, upgrade, answer.status())
    {
        return join_upgrades(client, protocol, answer).await;
    }
    let mut resp = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            if let (Ok(n), Ok(v)) =
                (HeaderName::from_bytes(name.as_ref()), HeaderValue::from_bytes(value.as_bytes()))
            {
                resp = resp.header(n, v);
            }
        }
    }
    let stream = answer.bytes_stream().map_err(std::io::Error::other);
    resp.body(Body::from_stream(stream)).unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// Answers the client `101` and joins its connection to the leader's, both ways, until either
/// ends.
async fn join_upgrades(
    client: hyper::upgrade::OnUpgrade,
    protocol: HeaderValue,
    answer: reqwest::Response,
) -> Response {
    let leader = match answer.upgrade().await {
        Ok(io) => io,
        Err(e) => return unavailable("LeaderUnavailable", &format!("the leader's upgrade failed: {e}")),
    };
    tokio::spawn(async move {
        if let Ok(client) = client.await {
            let mut client = hyper_util::rt::TokioIo::new(client);
            let mut leader = leader;
            let _ = tokio::io::copy_bidirectional(&mut client, &mut leader).await;
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(axum::http::header::CONNECTION, "upgrade")
        .header(axum::http::header::UPGRADE, protocol)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

fn unavailable(code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "code": code, "message": message });
    (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")], axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_recent_replica_header_signed_with_the_key_passes() {
        let key = [7u8; 32];
        let header = replica_header(&key, 1_000_000);
        assert!(verify_replica(&key, &header, 1_000_000 + 60_000));
        assert!(!verify_replica(&[8u8; 32], &header, 1_000_000), "another key");
        assert!(!verify_replica(&key, &header, 1_000_000 + REPLICA_SKEW_MS + 1), "too old");
        assert!(!verify_replica(&key, &header.replacen("1000000", "1000001", 1), 1_000_000), "another time");
        for bad in ["", "1000000", "1000000;", ";abc", "x;y"] {
            assert!(!verify_replica(&key, bad, 1_000_000), "{bad:?}");
        }
    }

    #[test]
    fn only_a_header_signed_with_the_key_names_a_peer() {
        let key = [7u8; 32];
        let peer: SocketAddr = "10.1.2.3:4567".parse().expect("addr");
        let header = forwarded_peer(&key, peer);
        assert_eq!(verify_forwarded_peer(&key, &header), Some(peer));
        assert_eq!(verify_forwarded_peer(&[8u8; 32], &header), None, "another key");
        let forged = header.replacen("10.1.2.3", "10.9.9.9", 1);
        assert_eq!(verify_forwarded_peer(&key, &forged), None, "another peer, same signature");
        for bad in ["", "10.1.2.3:4567", "10.1.2.3:4567;", ";abc", "x;y"] {
            assert_eq!(verify_forwarded_peer(&key, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_a_host_header_signed_with_the_key_names_the_clients_host() {
        let key = [7u8; 32];
        let header = forwarded_host(&key, "ecs.example:7070");
        assert_eq!(verify_forwarded_host(&key, &header).as_deref(), Some("ecs.example:7070"));
        assert_eq!(verify_forwarded_host(&[8u8; 32], &header), None, "another key");
        let forged = header.replacen("ecs.example", "evil.example", 1);
        assert_eq!(verify_forwarded_host(&key, &forged), None, "another host, same signature");
        // A peer's signed value is no host's.
        let peer = forwarded_peer(&key, "10.1.2.3:4567".parse().expect("addr"));
        assert_eq!(verify_forwarded_host(&key, &peer), None);
    }
}
