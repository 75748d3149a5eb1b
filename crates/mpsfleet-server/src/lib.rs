//! The mpsfleet control plane: opens the state store, rebuilds the cluster from it, and serves
//! the REST API until told to stop.

pub mod api;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod console;
pub mod dns;
pub mod ecs;
pub mod error;
pub mod events;
pub mod files;
pub mod forward;
pub mod http;
pub mod loops;
pub use loops::{HEALTH_INTERVAL, RESYNC_INTERVAL};
pub mod metrics;
pub mod openapi;
pub mod provider;
pub mod ratelimit;
pub mod request_id;
pub mod tls;

use cluster::Error;
use cluster::{Cluster, FirstStart};
use files::{create_private_dir, restrict, write_public};
use mpsfleet_core::clock::Clock;
use mpsfleet_store::etcd::Candidate;
use mpsfleet_store::{EtcdStore, SqliteStore, Store};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// File names inside the data directory.
pub const STATE_FILE: &str = "state.db";
pub const ADMIN_TOKEN_FILE: &str = "admin.token";
pub const JOIN_TOKEN_FILE: &str = "join.token";
/// The key agent and launch tokens are derived under (auth.rs).
pub const SERVER_KEY_FILE: &str = "server.key";
/// The secret webhook deliveries are signed with, unless `--webhook-secret-file` names another.
pub const WEBHOOK_SECRET_FILE: &str = "webhook.secret";
/// The cluster CA's certificate (public), for clients: `--ca-file`, `MPSFLEET_CA_FILE`.
pub const CA_FILE: &str = "ca.pem";

/// How many recent revisions of the change feed are kept for watchers.
pub const FEED_RETAINED_REVISIONS: u64 = 100_000;

/// A cluster opened from its data directory.
pub struct Opened {
    pub cluster: Cluster,
    /// Set on first start: the tokens to show once.
    pub first_start: Option<FirstStart>,
    /// The cluster's CAs: this server's certificates are issued under the active one.
    pub ca: tls::CaSet,
}

/// Opens (creating if needed) the data directory and its SQLite state, rebuilding the cluster.
/// On first start the admin and join tokens are written 0600 next to the state; the join token
/// carries the cluster CA's hash. The CA's certificate is written to `ca.pem` for clients.
pub fn open(data_dir: &Path, clock: Arc<dyn Clock>) -> Result<Opened, Error> {
    open_with(data_dir, clock, None)
}

/// [`open`], with the CA the operator gives (`--ca-cert`, `--ca-key`): the cluster's CA on its
/// first start; refused later unless it is the cluster's CA already.
pub fn open_with(data_dir: &Path, clock: Arc<dyn Clock>, ca: Option<&tls::GivenCa>) -> Result<Opened, Error> {
    private_data_dir(data_dir)?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data_dir.join(STATE_FILE))?);
    // The state holds every host's credential digest and the agents' tokens: the owner's only,
    // whatever the files' modes were before (SQLite gives its WAL and shared-memory files the
    // database's mode).
    for file in [STATE_FILE.to_string(), format!("{STATE_FILE}-wal"), format!("{STATE_FILE}-shm")] {
        restrict(&data_dir.join(&file), 0o600).map_err(|e| {
            Error::StoreUnavailable(format!("cannot make {} private: {e}", data_dir.join(&file).display()))
        })?;
    }
    open_store(data_dir, store, clock, ca)
}

/// Creates the data directory 0700 (or makes an existing one 0700).
fn private_data_dir(data_dir: &Path) -> Result<(), Error> {
    create_private_dir(data_dir)
        .map_err(|e| Error::StoreUnavailable(format!("cannot create data dir {}: {e}", data_dir.display())))
}

/// [`open_with`] on a store opened by the caller (an [`EtcdStore`] this server leads). The data
/// directory still holds the tokens, `server.key` and `ca.pem`; servers sharing one store must
/// share `server.key`, which seals the CA's key and derives the agents' tokens.
pub fn open_store(
    data_dir: &Path,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ca: Option<&tls::GivenCa>,
) -> Result<Opened, Error> {
    private_data_dir(data_dir)?;
    let key = auth::ServerKey::load_or_create(&data_dir.join(SERVER_KEY_FILE))?;
    restrict(&data_dir.join(SERVER_KEY_FILE), 0o600).map_err(|e| {
        Error::StoreUnavailable(format!(
            "cannot make {} private: {e}",
            data_dir.join(SERVER_KEY_FILE).display()
        ))
    })?;
    let ca = tls::CaSet::load_or_create(store.as_ref(), &key, ca, clock.now_ms())?;
    let ca_path = data_dir.join(CA_FILE);
    write_public(&ca_path, &ca.bundle_pem())
        .map_err(|e| Error::StoreUnavailable(format!("cannot write {}: {e}", ca_path.display())))?;
    let mut first_start = None;
    let mut cluster = Cluster::load(store, clock, |tokens| {
        let join = mpsfleet_client::tls::pinned(&tokens.join_token, &ca.active.hash());
        for (file, token) in [(ADMIN_TOKEN_FILE, &tokens.admin_token), (JOIN_TOKEN_FILE, &join)] {
            let path = data_dir.join(file);
            files::write_secret(&path, token)
                .map_err(|e| Error::StoreUnavailable(format!("cannot write {}: {e}", path.display())))?;
        }
        first_start = Some(FirstStart { admin_token: tokens.admin_token.clone(), join_token: join });
        Ok(())
    })?;
    cluster.set_server_key(key);
    settle_admin_token(data_dir, &cluster)?;
    Ok(Opened { cluster, first_start, ca })
}

/// Where a rotated admin token is written before it is committed.
pub(crate) fn staged_admin_token(admin_token_file: &Path) -> std::path::PathBuf {
    admin_token_file.with_extension("token.new")
}

/// Finishes an admin token rotation a crash interrupted: `admin.token.new` becomes
/// `admin.token` if it holds the committed token, and is removed if it does not.
fn settle_admin_token(data_dir: &Path, cluster: &Cluster) -> Result<(), Error> {
    let file = data_dir.join(ADMIN_TOKEN_FILE);
    let staged = staged_admin_token(&file);
    let Ok(token) = std::fs::read_to_string(&staged) else { return Ok(()) };
    let unavailable = |e: std::io::Error| Error::StoreUnavailable(format!("{}: {e}", staged.display()));
    if cluster.read().admin_digest().is(&auth::digest(token.trim())) {
        tracing::warn!(path = %file.display(), "finishing an admin token rotation a crash interrupted");
        std::fs::rename(&staged, &file).map_err(unavailable)
    } else {
        std::fs::remove_file(&staged).map_err(unavailable)
    }
}

/// This server's part in a control plane of several servers on one etcd store: who it is and
/// the leadership it holds while it serves.
pub struct HaRole {
    pub store: Arc<EtcdStore>,
    pub me: Candidate,
    pub lease: i64,
    pub ttl: Duration,
    /// The leadership this server serves under: its fence, and whether it is still current.
    pub leadership: Arc<mpsfleet_store::etcd::Leadership>,
    /// The events' history: copied from the leader while this server followed, and gone on
    /// with while it leads.
    pub events_history: Arc<events::history::History>,
}

impl std::fmt::Debug for HaRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaRole")
            .field("me", &self.me)
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("fence", &self.leadership.fence())
            .finish()
    }
}

impl HaRole {
    /// Whether this server may answer as the leader now (see `Leadership::is_current`); a
    /// store unfenced for tests answers regardless.
    pub fn may_answer(&self) -> bool {
        self.leadership.is_current() || self.store.is_unfenced()
    }

    /// What `GET /v1/cluster/status` answers: the leader as etcd has it, and every member.
    pub fn status(&self, revision: u64) -> mpsfleet_types::access::ClusterStatus {
        use mpsfleet_types::access::{ClusterStatus, EtcdMemberView, LeaderView};
        let leader = match self.store.leader() {
            Ok(Some(l)) => LeaderView {
                id: l.candidate.id,
                url: Some(l.candidate.url),
                lease: Some(format!("{:x}", l.lease)),
                lease_ttl_seconds: Some(self.ttl.as_secs()),
                fence_revision: Some(l.create_revision),
            },
            // No leader key (it just expired) or etcd did not answer: this server's own view.
            _ => LeaderView {
                id: self.me.id.clone(),
                url: Some(self.me.url.clone()),
                lease: Some(format!("{:x}", self.lease)),
                lease_ttl_seconds: Some(self.ttl.as_secs()),
                fence_revision: None,
            },
        };
        let members = self
            .store
            .members()
            .into_iter()
            .map(|m| EtcdMemberView {
                endpoint: m.endpoint,
                name: m.name,
                healthy: m.healthy,
                raft_leader: m.is_raft_leader,
                version: m.version,
                db_size_bytes: m.db_size_bytes,
                error: m.error,
            })
            .collect();
        ClusterStatus { store: "etcd".into(), revision, server_id: self.me.id.clone(), leader, members }
    }
}

/// How the server runs, beyond its listener and state.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// An `http://` URL that gets each `incident.*` and `host.health` event POSTed as JSON.
    pub webhook: Option<String>,
    /// The secret every webhook delivery is signed with; a random one when `None`.
    pub webhook_secret: Option<[u8; 32]>,
    /// A CA (PEM) an `https://` webhook receiver is verified against, besides the system's.
    pub webhook_ca: Option<Vec<u8>>,
    /// The most events the history keeps (0: none); `None`: [`events::history::HISTORY_EVENTS`].
    /// Under a leadership the history is [`HaRole::events_history`], made with its own limit.
    pub events_history: Option<usize>,
    /// Connection timeouts and cap.
    pub http: http::HttpLimits,
    /// Request rates of each kind of caller.
    pub rate_limits: ratelimit::RateLimits,
    /// The certificate to serve HTTPS with; plain HTTP when `None` (`--insecure-http`).
    pub tls: Option<Arc<tls::ServerTls>>,
    /// The data dir's `admin.token`, rewritten when the admin token is rotated.
    pub admin_token_file: Option<std::path::PathBuf>,
    /// Set when this server leads several on one etcd store.
    pub ha: Option<Arc<HaRole>>,
    /// How the ECS-compatible API (`POST /`) names this cluster.
    pub ecs: ecs::EcsOptions,
    /// `task exec`'s limits.
    pub exec: api::ExecLimits,
    /// Where service discovery is answered over DNS (`dns/`), if anywhere.
    pub dns: Option<dns::DnsOptions>,
}

/// How long requests in flight may take to finish once the server stops; then their
/// connections are closed.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

/// Serves the API on `listener` until `shutdown` completes.
///
/// Shutting down stops the controllers first: the health and resync loops finish the tick they
/// are in and stop, and no provider call starts any more. Only then does the server stop
/// accepting connections, so that it never judges hosts by the heartbeats it no longer takes
/// (a restarted server gives them their heartbeat grace again). Agents' long polls answer at
/// once; other requests in flight get [`SHUTDOWN_DRAIN`].
pub async fn serve(
    listener: TcpListener,
    mut cluster: Cluster,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let webhook = match &options.webhook {
        Some(url) => {
            let secret = match options.webhook_secret {
                Some(s) => s,
                None => auth::ServerKey::random().map_err(|e| std::io::Error::other(e.to_string()))?.bytes(),
            };
            Some(
                events::Webhook::new(url, secret, options.webhook_ca.clone())
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
            )
        }
        None => None,
    };
    let deliver = webhook.clone().map(|w| tokio::spawn(w.run()));
    // Under a leadership, events go on from the history this server copied while it followed.
    let (history, term) = match &options.ha {
        Some(h) => (h.events_history.clone(), u64::try_from(h.leadership.fence()).unwrap_or(0)),
        None => {
            let limit = options.events_history.unwrap_or(events::history::HISTORY_EVENTS);
            (Arc::new(events::history::History::with_limit(limit)), 0)
        }
    };
    let events = events::Events::new(webhook, history, term);
    cluster.set_events(events.clone());
    cluster.start_retention();
    let acceptor = options.tls.as_ref().map(|t| t.acceptor()).transpose().map_err(std::io::Error::other)?;
    options.ecs.check().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // The conformance suite's public key works only while the flag is on, and only for
    // callers on this machine.
    let conformance = options.ecs.conformance.then_some((ecs::CONFORMANCE_KEY_ID, ecs::CONFORMANCE_SECRET));
    if conformance.is_some() && !listener.local_addr()?.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "--ecs-conformance serves a public admin key: listen on a loopback address only \
                 (--listen 127.0.0.1:PORT), not {}",
                listener.local_addr()?
            ),
        ));
    }
    cluster.set_conformance_key(conformance).map_err(|e| std::io::Error::other(e.to_string()))?;
    if conformance.is_some() {
        tracing::warn!("ECS conformance mode: the public key FOOBARKEY is an admin key, and POST /moto-api/reset empties the cluster");
    }
    // Bound before anything is served: a DNS address in use fails the start.
    let dns = match &options.dns {
        Some(d) => match dns::bind(d.listen).await {
            Ok(bound) => {
                tracing::info!(address = %bound.local_addr()?, "answering DNS for service discovery");
                Some((bound, d.pools.clone()))
            }
            Err(e) if d.required => {
                let why = format!("cannot answer DNS on {} (--dns-listen): {e}", d.listen);
                return Err(std::io::Error::new(e.kind(), why));
            }
            Err(e) => {
                tracing::warn!(address = %d.listen, error = %e, "not answering DNS: the address is taken");
                None
            }
        },
        None => None,
    };
    let mut state = api::AppState::new(cluster);
    state.tls = options.tls.clone();
    state.admin_token_file = options.admin_token_file.clone();
    state.ha = options.ha.clone();
    state.exec = Arc::new(api::ExecSessions::new(options.exec));
    let stopping = state.stopping.clone();
    // Aborted when `serve` returns, whatever ends it: the DNS port is free again at once.
    let _dns = dns.map(|(bound, pools)| AbortOnDrop(tokio::spawn(dns::serve(bound, state.clone(), pools))));
    let resync = tokio::spawn(loops::resync_loop(state.clone(), stopping.subscribe()));
    let health = tokio::spawn(loops::health_loop(state.clone(), stopping.subscribe()));
    let app = http::app(state, &options.http, options.rate_limits, options.ecs.clone());
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: stopping the controllers");
        stopping.send_replace(true);
        for (name, controller) in [("health", health), ("resync", resync)] {
            if let Err(e) = controller.await {
                tracing::error!(controller = name, error = %e, "controller failed");
            }
        }
        events.stop(); // open event streams end, so that the graceful shutdown can finish
        tracing::info!("controllers stopped; no longer accepting connections");
        let _ = drain_tx.send(());
    };
    // Each request knows its peer's address: the server reaches an agent at the address its
    // heartbeats come from, never at one it reports.
    // (`http::serve` gives each request its `ConnectInfo<SocketAddr>`.)
    let served = http::serve(listener, app, acceptor, options.http, shutdown);
    let drained = async {
        if drain_rx.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_DRAIN).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let result = tokio::select! {
        result = served => result,
        () = drained => {
            tracing::info!(drain = ?SHUTDOWN_DRAIN, "requests still in flight after the drain; closing them");
            Ok(())
        }
    };
    if let Some(d) = deliver {
        d.abort();
    }
    result
}

/// Where the data directory lives when none is given.
pub fn default_data_dir() -> PathBuf {
    PathBuf::from(".mpsfleet")
}

/// A spawned task that is aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
