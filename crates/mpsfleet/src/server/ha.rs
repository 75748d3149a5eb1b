//! `mpsfleet server --store etcd`: one of several servers sharing an etcd store. It campaigns
//! for leadership; while another server leads it only keeps its replica of the state warm
//! (and serves no API, so clients and agents given several addresses move on to the leader);
//! once elected it loads the cluster from that replica and serves until it stops or loses the
//! leadership, then campaigns again. See docs/ha.md.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use mpsfleet_core::clock::SystemClock;
use mpsfleet_store::etcd::{Candidate, Writers};
use mpsfleet_store::{EtcdConfig, EtcdStore, Store};

use super::{lead, shutdown_signal, ServerArgs};

/// How many times in a row an elected server may fail to open the cluster before it exits.
const OPEN_ATTEMPTS: u32 = 3;

pub(super) async fn run(args: &ServerArgs, given_ca: Option<mpsfleet_server::tls::GivenCa>) -> Result<()> {
    let endpoints = args
        .etcd_endpoints
        .as_deref()
        .context("--store etcd needs --etcd-endpoints URL[,URL...] (or MPSFLEET_ETCD_ENDPOINTS)")?;
    anyhow::ensure!(args.leader_ttl >= 2, "--leader-ttl must be at least 2 (seconds; etcd's shortest lease)");
    let mut config = EtcdConfig::new(endpoints);
    config.prefix = args.etcd_prefix.clone();
    if let Some(ca) = &args.etcd_ca_file {
        config.ca_pem =
            Some(std::fs::read(ca).with_context(|| format!("--etcd-ca-file: cannot read {}", ca.display()))?);
    }
    if let (Some(cert), Some(key)) = (&args.etcd_cert_file, &args.etcd_key_file) {
        let mut pem = std::fs::read(cert)
            .with_context(|| format!("--etcd-cert-file: cannot read {}", cert.display()))?;
        pem.push(b'\n');
        pem.extend(
            std::fs::read(key).with_context(|| format!("--etcd-key-file: cannot read {}", key.display()))?,
        );
        config.identity_pem = Some(pem);
    }
    let listen: std::net::SocketAddr = tokio::net::lookup_host(&args.listen)
        .await
        .with_context(|| format!("--listen {}", args.listen))?
        .next()
        .with_context(|| format!("--listen {} names no address", args.listen))?;
    anyhow::ensure!(
        listen.port() != 0,
        "--listen needs a fixed port with --store etcd: clients and agents keep every server's address"
    );
    let scheme = if args.insecure_http { "http" } else { "https" };
    let url = args.advertise_url.clone().unwrap_or_else(|| format!("{scheme}://{listen}"));
    let id = args.server_id.clone().unwrap_or_else(|| format!("{}:{}", hostname(), listen.port()));
    let me = Candidate { id, url };
    let ttl = Duration::from_secs(args.leader_ttl);
    let store = tokio::task::spawn_blocking(move || EtcdStore::open(&config, Writers::Leader))
        .await?
        .with_context(|| format!("cannot open the etcd store at {endpoints}"))?;
    let store = Arc::new(store);
    if args.unfenced_for_tests {
        anyhow::ensure!(
            cfg!(debug_assertions) && std::env::var("MPSFLEET_ALLOW_UNFENCED").as_deref() == Ok("1"),
            "--unfenced-for-tests breaks the store's safety: it is refused outside debug builds and without MPSFLEET_ALLOW_UNFENCED=1"
        );
        store.unfence_for_tests();
    }
    anyhow::ensure!(
        args.clock_skew_ms == 0 || cfg!(debug_assertions),
        "--clock-skew-ms is for tests: it is refused outside debug builds"
    );
    let clock: Arc<dyn mpsfleet_core::clock::Clock> = match args.clock_skew_ms {
        0 => Arc::new(SystemClock),
        skew_ms => {
            tracing::warn!(skew_ms, "this server's wall clock is skewed (a test switch)");
            Arc::new(mpsfleet_core::clock::SkewedClock { skew_ms })
        }
    };
    tracing::info!(id = %me.id, url = %me.url, revision = store.revision().unwrap_or(0), "etcd store open; campaigning");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        stop_tx.send_replace(true);
    });
    let mut failed_opens = 0;
    // The events' history outlives each term: copied while following, gone on with as leader.
    let history = Arc::new(mpsfleet_server::events::history::History::with_limit(args.events_history));
    loop {
        let stop = Arc::new(AtomicBool::new(false));
        let campaign = {
            let (store, me, stop) = (store.clone(), me.clone(), stop.clone());
            tokio::task::spawn_blocking(move || store.campaign(&me, ttl, &stop))
        };
        if let Ok(Some(l)) = store.leader() {
            say(&format!("following: {} leads ({})", l.candidate.id, l.candidate.url));
        }
        // While it follows, the server forwards every request to the leader.
        let follower = match forward(args, &store, &me, listen, history.clone()).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "not forwarding to the leader while following");
                None
            }
        };
        let mut stopping = stop_rx.clone();
        let outcome = tokio::select! {
            r = campaign => Some(r),
            _ = stopping.wait_for(|s| *s) => None,
        };
        if let Some((handle, stop_forwarding, dns)) = follower {
            let _ = stop_forwarding.send(());
            let abort = handle.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), handle).await.is_err() {
                abort.abort(); // requests still in flight (long polls) end here
            }
            // Its DNS sockets are closed before a leader's bind the same address.
            if let Some(dns) = dns {
                dns.abort();
                let _ = dns.await;
            }
        }
        let leadership = match outcome {
            Some(r) => match r?.context("campaign for leadership")? {
                Some(l) => l,
                None => return Ok(()),
            },
            None => {
                stop.store(true, Ordering::Relaxed);
                return Ok(());
            }
        };
        say(&format!("elected leader: {} ({}), lease {:x}", me.id, me.url, leadership.lease()));
        let opened = {
            let (dir, s, ca) = (args.data_dir.clone(), store.clone() as Arc<dyn Store>, given_ca.clone());
            let clock = clock.clone();
            tokio::task::spawn_blocking(move || mpsfleet_server::open_store(&dir, s, clock, ca.as_ref()))
                .await?
        };
        let opened = match opened {
            Ok(o) => o,
            Err(e) => {
                leadership.resign();
                failed_opens += 1;
                anyhow::ensure!(failed_opens < OPEN_ATTEMPTS, "cannot open the cluster from etcd: {e}");
                tracing::error!(error = %e, "cannot open the cluster from etcd; stepped down, campaigning again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        failed_opens = 0;
        let listener = bind(listen).await?;
        let leadership = Arc::new(leadership);
        let role = Arc::new(mpsfleet_server::HaRole {
            store: store.clone(),
            me: me.clone(),
            lease: leadership.lease(),
            ttl,
            leadership: leadership.clone(),
            events_history: history.clone(),
        });
        let lost = leadership.lost();
        let mut stopping = stop_rx.clone();
        let shutdown = async move {
            tokio::select! {
                reason = lost => tracing::warn!(%reason, "lost the leadership; stepping down"),
                _ = stopping.wait_for(|s| *s) => {}
            }
        };
        lead(args, opened, listener, Some(role), shutdown).await?;
        if *stop_rx.borrow() {
            leadership.resign();
            return Ok(());
        }
        say(&format!(
            "stepped down: {}; campaigning again",
            leadership.lost_reason().unwrap_or_else(|| "leadership lost".to_owned())
        ));
    }
}

/// A follower's server: every request forwarded to the leader (`mpsfleet_server::forward`),
/// the leader's event history copied into `history`, and DNS (`--dns-listen`) answered from a
/// copy of what the leader publishes (`mpsfleet_server::dns::serve_copy`). `None` until the
/// cluster has its CA and this server has the shared `server.key`, which the follower needs
/// to serve TLS and to sign the peers it forwards.
async fn forward(
    args: &ServerArgs,
    store: &Arc<EtcdStore>,
    me: &Candidate,
    listen: std::net::SocketAddr,
    history: Arc<mpsfleet_server::events::history::History>,
) -> Result<Option<Follower>> {
    let key_file = args.data_dir.join(mpsfleet_server::SERVER_KEY_FILE);
    if !key_file.exists() {
        tracing::warn!(path = %key_file.display(), "no server.key yet (copy the first server's): not forwarding");
        return Ok(None);
    }
    let key = mpsfleet_server::auth::ServerKey::load_or_create(&key_file)?;
    let now = mpsfleet_core::clock::Clock::now_ms(&SystemClock);
    let cas = match mpsfleet_server::tls::CaSet::load_or_create(store.as_ref(), &key, None, now) {
        Ok(cas) => cas,
        Err(e) => {
            tracing::info!(error = %e, "the cluster has no CA yet: not forwarding");
            return Ok(None);
        }
    };
    let ca_pem = cas.bundle_pem();
    let acceptor = if args.insecure_http {
        None
    } else {
        let names = mpsfleet_server::tls::default_names(listen, &args.tls_san);
        Some(mpsfleet_server::tls::ServerTls::new(cas, names, now, None)?.acceptor()?)
    };
    let lookup: Arc<dyn mpsfleet_server::forward::LeaderLookup> =
        Arc::new(EtcdLeader(store.clone(), me.url.clone()));
    let app = mpsfleet_server::forward::router(lookup.clone(), ca_pem.as_bytes(), &key)?;
    // Forwarding goes on without DNS, if its address cannot be had.
    let dns = match follower_dns(args, lookup.clone(), ca_pem.as_bytes(), &key).await {
        Ok(dns) => dns,
        Err(e) => {
            tracing::warn!(error = %e, "not answering DNS while following");
            None
        }
    };
    let listener = bind(listen).await?;
    let copier = {
        let ca_pem = ca_pem.clone();
        tokio::spawn(async move {
            if let Err(e) =
                mpsfleet_server::forward::copy_events(lookup, ca_pem.as_bytes(), &key, history).await
            {
                tracing::warn!(error = %e, "not copying the leader's event history");
            }
        })
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let limits = mpsfleet_server::http::HttpLimits::default();
    let handle = tokio::spawn(mpsfleet_server::http::serve(listener, app, acceptor, limits, async move {
        let _ = rx.await;
        copier.abort();
    }));
    say(&format!("forwarding requests to the leader on {listen}"));
    Ok(Some((handle, tx, dns)))
}

/// What follows while this server follows: its forwarding server, what stops it, and its DNS.
type Follower = (
    tokio::task::JoinHandle<std::io::Result<()>>,
    tokio::sync::oneshot::Sender<()>,
    Option<tokio::task::JoinHandle<()>>,
);

/// Answers DNS on `--dns-listen`, if given, from a copy of what the leader publishes. The
/// address was a leader's a moment ago perhaps: it is tried for a few seconds.
async fn follower_dns(
    args: &ServerArgs,
    lookup: Arc<dyn mpsfleet_server::forward::LeaderLookup>,
    ca_pem: &[u8],
    key: &mpsfleet_server::auth::ServerKey,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = args.dns_listen else { return Ok(None) };
    let mut bound = mpsfleet_server::dns::bind(addr).await;
    for _ in 0..20 {
        if bound.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        bound = mpsfleet_server::dns::bind(addr).await;
    }
    let bound = bound.with_context(|| format!("cannot answer DNS on {addr} (--dns-listen)"))?;
    let copier = Arc::new(mpsfleet_server::forward::DiscoveryCopier::new(lookup, ca_pem, key)?);
    let pools = (!args.dns_pools.is_empty()).then(|| args.dns_pools.iter().cloned().collect());
    say(&format!("answering DNS on {addr} from the leader's records"));
    Ok(Some(tokio::spawn(mpsfleet_server::dns::serve_copy(bound, pools, move || {
        let copier = copier.clone();
        async move { copier.fetch().await }
    }))))
}

/// The leader's URL, as its election key has it; never this server's own.
struct EtcdLeader(Arc<EtcdStore>, String);

impl mpsfleet_server::forward::LeaderLookup for EtcdLeader {
    /// Never this server's own URL: it was just elected and is about to serve itself.
    fn leader_url(&self) -> Option<String> {
        self.0.leader().ok().flatten().map(|l| l.candidate.url).filter(|url| *url != self.1)
    }
}

/// Binds the API port; the previous term's listener may take a moment to be released.
async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    let mut last = None;
    for _ in 0..50 {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last.map_or_else(
        || anyhow::anyhow!("cannot listen on {addr}"),
        |e| anyhow::anyhow!("cannot listen on {addr}: {e}"),
    ))
}

/// One line to stdout (ignored if nobody reads it), for the operator watching the servers.
fn say(line: &str) {
    use std::io::Write;
    tracing::info!("{line}");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn hostname() -> String {
    mpsfleet_proc::hostname().unwrap_or_else(|| "server".to_owned())
}
