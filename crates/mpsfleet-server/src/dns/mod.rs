//! Service discovery over DNS (docs/traffic.md): the names of `zone.rs`, answered by
//! `answer.rs`, served over UDP and TCP on `--dns-listen` by [`serve`].
//!
//! The zone is rebuilt from the cluster's state after committed changes (at most every 50 ms,
//! so a burst of commits is one rebuild) and every second (for what changes without a
//! commit: a host's missed heartbeats), outside the request path: a query reads the latest
//! zone and never takes the cluster's lock. DNS carries no credentials: whoever
//! reaches the listener reads the published addresses (docs/security.md); `--dns-pools`
//! publishes only the pools named.
//!
//! A follower of an HA cluster answers from a copy of what the leader publishes
//! ([`serve_copy`]), fetched every [`COPY_EVERY`]; a copy older than [`COPY_STALE_MS`] (the
//! leader gone, or not reached) is not answered from: the query gets SERVFAIL, and the load
//! balancer asks another of its nameservers. So no answer is more than that out of date.

pub mod answer;
pub mod zone;

use crate::api::AppState;
use mpsfleet_types::discovery::DiscoveredService;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use zone::Zone;

/// How the server answers DNS.
#[derive(Debug, Clone)]
pub struct DnsOptions {
    pub listen: SocketAddr,
    /// Publish these pools only; all when None.
    pub pools: Option<BTreeSet<String>>,
    /// Whether the server must not start without it (an address asked for); otherwise (a
    /// default address another process took meanwhile) it starts without DNS, saying so.
    pub required: bool,
}

/// The most a TCP client may keep a connection open without asking.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// The most TCP connections answered at once.
const TCP_MAX: usize = 64;
/// How often the zone is rebuilt even when nothing was committed.
const REFRESH: Duration = Duration::from_secs(1);
/// The least time between two rebuilds: a burst of commits (a fleet's task reports) is one
/// rebuild, and a rebuild holds the cluster's lock at most a small share of the time. A load
/// balancer asking every 200 ms sees a change within this and its own period.
const MIN_GAP: Duration = Duration::from_millis(50);

/// How often a follower copies what the leader publishes.
pub const COPY_EVERY: Duration = Duration::from_millis(200);
/// The oldest copy a follower answers from; past it, SERVFAIL.
pub const COPY_STALE_MS: u64 = 2_000;

/// What a leader publishes, as a follower copies it (`GET /v1/discovery/replica`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryCopy {
    /// The leader's state revision it was read at: the zone's SOA serial.
    pub revision: u64,
    pub services: Vec<DiscoveredService>,
}

/// The zone a listener answers from, and until when it is true (a leader's always is, once
/// built).
struct Served {
    zone: RwLock<Arc<Zone>>,
    fresh_until_ms: AtomicU64,
}

impl Served {
    fn new(fresh_until_ms: u64) -> Arc<Served> {
        Arc::new(Served {
            zone: RwLock::new(Arc::new(Zone::default())),
            fresh_until_ms: AtomicU64::new(fresh_until_ms),
        })
    }

    fn set(&self, zone: Zone) {
        if let Ok(mut w) = self.zone.write() {
            *w = Arc::new(zone);
        }
    }

    /// The zone to answer from now; None once it is out of date.
    fn current(&self, now_ms: u64) -> Option<Arc<Zone>> {
        if now_ms > self.fresh_until_ms.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.zone.read().map(|z| z.clone()).unwrap_or_default())
    }

    fn answer(&self, request: &[u8], udp: bool) -> Option<Vec<u8>> {
        match self.current(mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock)) {
            Some(zone) => answer::answer(&zone, request, udp),
            None => answer::unavailable(request),
        }
    }
}

/// The sockets of a DNS listener, bound before serving (so a port in use fails the start).
pub struct Bound {
    udp: UdpSocket,
    tcp: TcpListener,
}

/// Binds UDP and TCP on `addr` (port 0: one port free on both).
pub async fn bind(addr: SocketAddr) -> std::io::Result<Bound> {
    let udp = UdpSocket::bind(addr).await?;
    let tcp = TcpListener::bind(udp.local_addr()?).await?;
    Ok(Bound { udp, tcp })
}

impl Bound {
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.udp.local_addr()
    }
}

/// Serves DNS from the cluster in `state` until `state.stopping` is set, or until this future
/// is dropped: its sockets close with it (a leadership that ends frees the port for the next).
pub async fn serve(bound: Bound, state: AppState, pools: Option<BTreeSet<String>>) {
    // Nothing is answered from before the first zone is built (SERVFAIL, not an empty zone's
    // NXDOMAIN): a server just elected would otherwise deny every name for a moment.
    let served = Served::new(0);
    let mut stopping = state.stopping.subscribe();
    tokio::select! {
        () = refresh_loop(state.clone(), pools, served.clone()) => {}
        () = udp_loop(bound.udp, served.clone()) => {}
        () = tcp_loop(bound.tcp, served) => {}
        _ = stopping.wait_for(|s| *s) => {}
    }
}

/// Serves DNS, while this server follows, from a copy of what the leader publishes: fetched
/// every [`COPY_EVERY`] by `copy` (None: not reached), answered while at most
/// [`COPY_STALE_MS`] old. Runs until dropped, which closes its sockets.
pub async fn serve_copy<F, Fut>(bound: Bound, pools: Option<BTreeSet<String>>, mut copy: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<DiscoveryCopy>>,
{
    let served = Served::new(0);
    let copier = {
        let served = served.clone();
        async move {
            loop {
                if let Some(c) = copy().await {
                    let published: Vec<DiscoveredService> = (c.services.into_iter())
                        .filter(|s| pools.as_ref().is_none_or(|p| p.contains(s.pool.as_str())))
                        .collect();
                    served.set(Zone::build(&published, c.revision as u32));
                    let now = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
                    served.fresh_until_ms.store(now + COPY_STALE_MS, Ordering::Relaxed);
                }
                tokio::time::sleep(COPY_EVERY).await;
            }
        }
    };
    tokio::select! {
        () = copier => {}
        () = udp_loop(bound.udp, served.clone()) => {}
        () = tcp_loop(bound.tcp, served) => {}
    }
}

/// Rebuilds the zone after every committed change, and every [`REFRESH`].
async fn refresh_loop(state: AppState, pools: Option<BTreeSet<String>>, served: Arc<Served>) {
    let mut changed = state.changed.subscribe();
    let mut skipped_before: Vec<String> = Vec::new();
    loop {
        let st = state.clone();
        let pools = pools.clone();
        let built = tokio::task::spawn_blocking(move || {
            let c = st.cluster.lock().ok()?;
            let published = c.read().discovery(pools.as_ref());
            let serial = c.read().revision() as u32;
            drop(c);
            Some(Zone::build(&published, serial))
        })
        .await
        .ok()
        .flatten();
        if let Some(z) = built {
            for why in z.skipped.iter().filter(|w| !skipped_before.contains(w)) {
                tracing::warn!("not published in DNS: {why}");
            }
            skipped_before.clone_from(&z.skipped);
            served.set(z);
            // The leader's own state: true from now on.
            served.fresh_until_ms.store(u64::MAX, Ordering::Relaxed);
        }
        tokio::time::sleep(MIN_GAP).await;
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}

async fn udp_loop(socket: UdpSocket, served: Arc<Served>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else { continue };
        if let Some(out) = served.answer(&buf[..n], true) {
            let _ = socket.send_to(&out, from).await;
        }
    }
}

async fn tcp_loop(listener: TcpListener, served: Arc<Served>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(TCP_MAX));
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
        let served = served.clone();
        tokio::spawn(async move {
            let _permit = permit;
            // Each message is preceded by its length (RFC 1035 4.2.2).
            loop {
                let mut len = [0u8; 2];
                match tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut len)).await {
                    Ok(Ok(_)) => {}
                    _ => return,
                }
                let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if !matches!(tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut msg)).await, Ok(Ok(_))) {
                    return;
                }
                let Some(out) = served.answer(&msg, false) else { return };
                let Ok(n) = u16::try_from(out.len()) else { return };
                if conn.write_all(&n.to_be_bytes()).await.is_err() || conn.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, Query, ResponseCode};
    use hickory_proto::rr::{Name, RData, RecordType};

    async fn ask(addr: SocketAddr) -> (ResponseCode, Option<u32>) {
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii("nothing.gpu.mpsfleet.").unwrap(), RecordType::A));
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.send_to(&q.to_vec().unwrap(), addr).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf)).await.unwrap().unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(m.metadata.id, q.metadata.id);
        let serial = m.authorities.iter().find_map(|r| match &r.data {
            RData::SOA(s) => Some(s.serial),
            _ => None,
        });
        (m.metadata.response_code, serial)
    }

    /// A follower answers from its copy while it is fresh, and SERVFAIL once the copy is
    /// older than `COPY_STALE_MS` (here the leader answered once, then never again).
    #[tokio::test]
    async fn a_copy_is_answered_from_until_it_is_stale_then_servfail() {
        let bound = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = bound.local_addr().unwrap();
        let mut calls = 0;
        let serving = tokio::spawn(serve_copy(bound, None, move || {
            calls += 1;
            let first = calls == 1;
            async move { first.then(|| DiscoveryCopy { revision: 7, services: Vec::new() }) }
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(ask(addr).await, (ResponseCode::NXDomain, Some(7)), "answered from the copy");
        tokio::time::sleep(Duration::from_millis(COPY_STALE_MS)).await;
        assert_eq!(ask(addr).await, (ResponseCode::ServFail, None), "a stale copy is not answered from");
        serving.abort();
    }

    /// Before a first copy, nothing is answered from (SERVFAIL), not an empty zone.
    #[tokio::test]
    async fn no_copy_yet_is_servfail() {
        let bound = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = bound.local_addr().unwrap();
        let serving = tokio::spawn(serve_copy(bound, None, || async { None }));
        assert_eq!(ask(addr).await, (ResponseCode::ServFail, None));
        serving.abort();
    }
}
