//! Service discovery over DNS (docs/traffic.md): the names of `zone.rs`, answered by
//! `answer.rs`, served over UDP and TCP on `--dns-listen` by [`serve`].
//!
//! The zone is rebuilt from the cluster's state after committed changes (at most every 50 ms,
//! so a burst of commits is one rebuild) and every second (for what changes without a
//! commit: a host's missed heartbeats), outside the request path: a query reads the latest
//! zone and never takes the cluster's lock. DNS carries no credentials: whoever
//! reaches the listener reads the published addresses (docs/security.md); `--dns-pools`
//! publishes only the pools named.

pub mod answer;
pub mod zone;

use crate::api::AppState;
use std::collections::BTreeSet;
use std::net::SocketAddr;
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
    let zone = Arc::new(RwLock::new(Arc::new(Zone::default())));
    let mut stopping = state.stopping.subscribe();
    tokio::select! {
        () = refresh_loop(state.clone(), pools, zone.clone()) => {}
        () = udp_loop(bound.udp, zone.clone()) => {}
        () = tcp_loop(bound.tcp, zone) => {}
        _ = stopping.wait_for(|s| *s) => {}
    }
}

/// Rebuilds the zone after every committed change, and every [`REFRESH`].
async fn refresh_loop(state: AppState, pools: Option<BTreeSet<String>>, zone: Arc<RwLock<Arc<Zone>>>) {
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
            if let Ok(mut w) = zone.write() {
                *w = Arc::new(z);
            }
        }
        tokio::time::sleep(MIN_GAP).await;
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}

fn current(zone: &RwLock<Arc<Zone>>) -> Arc<Zone> {
    zone.read().map(|z| z.clone()).unwrap_or_default()
}

async fn udp_loop(socket: UdpSocket, zone: Arc<RwLock<Arc<Zone>>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else { continue };
        if let Some(out) = answer::answer(&current(&zone), &buf[..n], true) {
            let _ = socket.send_to(&out, from).await;
        }
    }
}

async fn tcp_loop(listener: TcpListener, zone: Arc<RwLock<Arc<Zone>>>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(TCP_MAX));
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
        let zone = zone.clone();
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
                let Some(out) = answer::answer(&current(&zone), &msg, false) else { return };
                let Ok(n) = u16::try_from(out.len()) else { return };
                if conn.write_all(&n.to_be_bytes()).await.is_err() || conn.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}
