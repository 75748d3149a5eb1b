//! `mpsfleet server`: open the data directory, serve the API until SIGINT or SIGTERM. Hosts
//! that a `local` provider started keep running when the server stops, like the machines of
//! any other provider; the next server on the same data directory adopts them.

mod ha;

use anyhow::{Context, Result};
use clap::Args;
use mpsfleet_core::clock::{Clock, SystemClock};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct ServerArgs {
    /// How log lines are written to standard error: `text`, or `json` (one object a line,
    /// with each API request's id) for log collectors.
    #[arg(long, value_enum, default_value = "text")]
    log_format: crate::LogFormat,
    /// The account id (12 digits) in the ARNs of the ECS-compatible API (`POST /`,
    /// docs/ecs-api.md).
    #[arg(long, default_value = mpsfleet_server::ecs::DEFAULT_ACCOUNT_ID)]
    aws_account_id: String,
    /// The one region ECS-compatible calls may be signed for (e.g. `us-east-1`); unset: any,
    /// and the ARNs of each answer name the region its call was signed for.
    #[arg(long)]
    aws_region: Option<String>,
    /// For running moto's ECS test suite against this server only: the suite's public key
    /// `FOOBARKEY`/`FOOBARSECRET` becomes an admin key, ARNs carry its account 123456789012, and
    /// `POST /moto-api/reset` empties the pools, task definitions, services and tasks. Never
    /// on a server anyone relies on.
    #[arg(long)]
    ecs_conformance: bool,
    /// Address to listen on; port 0 picks a free port (the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Serve plain HTTP instead of HTTPS: nothing on the wire is protected, tokens included.
    /// Only on a loopback address (127.0.0.1, ::1).
    #[arg(long)]
    insecure_http: bool,
    /// A DNS name or IP address clients reach this server by, for its certificate (repeat it
    /// for more); localhost, the loopback addresses, this machine's host name and the listen
    /// address (unless 0.0.0.0 or ::) are always in it (docs/security.md, "TLS").
    #[arg(long = "tls-san", value_name = "NAME")]
    tls_san: Vec<String>,
    /// The cluster's CA certificate (PEM), when the operator gives it rather than letting the
    /// cluster make one: taken on the cluster's first start, with --ca-key; afterwards it must
    /// be the cluster's CA (replacing it is `mpsfleet cluster ca rotate`).
    #[arg(long, value_name = "FILE", requires = "ca_key")]
    ca_cert: Option<PathBuf>,
    /// The private key of --ca-cert (PKCS#8 PEM). Read once; the cluster keeps it encrypted
    /// under the server key.
    #[arg(long, value_name = "FILE", requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// Where the state lives: `sqlite` (one server, `<data dir>/state.db`) or `etcd` (any
    /// number of servers on one etcd cluster; one is elected leader and serves, the others
    /// wait to take over: docs/ha.md).
    #[arg(long, value_enum, default_value = "sqlite")]
    store: StoreKind,
    /// The etcd members' client URLs, comma-separated (with --store etcd).
    #[arg(long, env = "MPSFLEET_ETCD_ENDPOINTS", value_name = "URL[,URL...]")]
    etcd_endpoints: Option<String>,
    /// Every key the cluster keeps in etcd starts with this.
    #[arg(long, default_value = "/mpsfleet")]
    etcd_prefix: String,
    /// The CA (PEM) that etcd's https:// endpoints are verified against.
    #[arg(long, value_name = "FILE")]
    etcd_ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for etcd's --client-cert-auth, with --etcd-key-file.
    #[arg(long, value_name = "FILE", requires = "etcd_key_file")]
    etcd_cert_file: Option<PathBuf>,
    /// The key of --etcd-cert-file (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert_file")]
    etcd_key_file: Option<PathBuf>,
    /// The leader's lease TTL in seconds (at least 2): a leader that dies is replaced within
    /// about this long; a shorter one fails over faster and renews more often.
    #[arg(long, default_value_t = 3)]
    leader_ttl: u64,
    /// Tests only: commit without the fence, so that a deposed leader's writes are kept. Refused
    /// in release builds and without MPSFLEET_ALLOW_UNFENCED=1 (the nemesis test proves with it
    /// that its checker can fail).
    #[arg(long, hide = true)]
    unfenced_for_tests: bool,
    /// Tests only: break one promise of docs/ha.md on purpose (stale-reads: the leader's task
    /// list stops following its commits; lost-stops: StopTask is acknowledged and never
    /// committed). Refused in release builds and without MPSFLEET_ALLOW_BROKEN=1 (the nemesis
    /// tests prove with it that their checker can fail).
    #[arg(long, hide = true, value_name = "BUG")]
    broken_for_tests: Option<mpsfleet_server::cluster::broken::Broken>,
    /// Tests only (debug builds): this server's wall clock runs this many milliseconds ahead
    /// (negative: behind) of the machine's, as a server with a skewed clock would (--store etcd).
    #[arg(long, hide = true, default_value_t = 0, allow_negative_numbers = true)]
    clock_skew_ms: i64,
    /// The URL clients and agents reach this server at, as the leader key shows it
    /// [default: https://<listen address>].
    #[arg(long, value_name = "URL")]
    advertise_url: Option<String>,
    /// This server's name among the servers of one store [default: <hostname>:<port>].
    #[arg(long)]
    server_id: Option<String>,
    /// Directory for the state database and the tokens.
    #[arg(long, env = "MPSFLEET_DATA_DIR", default_value = ".mpsfleet")]
    data_dir: PathBuf,
    /// Extra `mpsfleet agent` arguments for hosts that `local` providers start, as one
    /// whitespace-separated string (for example "--emulate-gpus H200:143771:2").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    local_agent_args: String,
    /// The server's configuration file (JSON): the exec capacity providers that pools may
    /// name (docs/providers.md). Only its owner (this server's user or root) may write it.
    #[arg(long, env = "MPSFLEET_CONFIG")]
    config: Option<PathBuf>,
    /// An https:// (or http://) URL that gets each incident.* and host.health event POSTed
    /// as JSON, signed (three attempts each; see docs/api.md, "Events and webhook").
    #[arg(long)]
    webhook: Option<String>,
    /// A CA (PEM) to verify an https:// webhook receiver with, besides the system's roots.
    #[arg(long)]
    webhook_ca_file: Option<PathBuf>,
    /// Events kept for readers that were not listening (`events list`, `GET /v1/events
    /// ?since_ms=`): those of the last hour, at most this many. 0 keeps none (streams and the
    /// webhook still get each event as it happens); see docs/api.md, "Events and webhook".
    #[arg(long, env = "MPSFLEET_EVENTS_HISTORY", value_name = "N",
          default_value_t = mpsfleet_server::events::history::HISTORY_EVENTS)]
    events_history: usize,
    /// Close a `task exec` session after this many seconds without input or output (1 to
    /// 86400; AWS Session Manager's default).
    #[arg(long, value_name = "SECONDS", default_value_t = 1200,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    exec_idle_timeout: u64,
    /// The most `task exec` sessions open on one task at once.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    exec_sessions_per_task: u64,
    /// The most `task exec` sessions one token (or the admin) has open at once.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    exec_sessions_per_token: u64,
    /// Answer service discovery over DNS (UDP and TCP) on HOST:PORT: SRV records
    /// `_<port>._tcp.<service>.<pool>.mpsfleet.` a load balancer reads (docs/traffic.md). DNS
    /// carries no credentials: whoever reaches it reads the replicas' addresses.
    #[arg(long, env = "MPSFLEET_DNS_LISTEN")]
    dns_listen: Option<std::net::SocketAddr>,
    /// Publish only these pools in DNS (comma-separated); all when not given.
    #[arg(long, value_delimiter = ',', requires = "dns_listen")]
    dns_pools: Vec<String>,
    /// The secret webhook deliveries are signed with (64 hex digits); default
    /// `<data dir>/webhook.secret`, made at the first start that needs it.
    #[arg(long)]
    webhook_secret_file: Option<PathBuf>,
    /// Longest a client may take to send a request's headers (docs/api.md, "Limits").
    #[arg(long, env = "MPSFLEET_HTTP_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    http_header_timeout_ms: u64,
    /// Longest a client may take to send a request's body once its headers are in.
    #[arg(long, env = "MPSFLEET_HTTP_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    http_body_timeout_ms: u64,
    /// How long a keep-alive connection with nothing in flight stays open.
    #[arg(long, env = "MPSFLEET_HTTP_IDLE_TIMEOUT_MS", default_value_t = 60_000)]
    http_idle_timeout_ms: u64,
    /// Connections open at once; more wait until one closes.
    #[arg(long, env = "MPSFLEET_HTTP_MAX_CONNECTIONS", default_value_t = 10_000)]
    http_max_connections: usize,
    /// Requests a second the admin token may make on average; 0 means no limit. Past it (and
    /// its burst), requests are answered 429 with Retry-After (docs/api.md, "Limits").
    #[arg(long, env = "MPSFLEET_HTTP_RATE_ADMIN", default_value_t = 10_000)]
    http_rate_admin: u32,
    /// Requests the admin token may make at once, above its rate.
    #[arg(long, env = "MPSFLEET_HTTP_BURST_ADMIN", default_value_t = 20_000)]
    http_burst_admin: u32,
    /// Requests a second the join token may make (registrations); 0 means no limit.
    #[arg(long, env = "MPSFLEET_HTTP_RATE_JOIN", default_value_t = 20_000)]
    http_rate_join: u32,
    /// Requests the join token may make at once.
    #[arg(long, env = "MPSFLEET_HTTP_BURST_JOIN", default_value_t = 40_000)]
    http_burst_join: u32,
    /// Requests a second each host credential (and each one-time replacement or launch token)
    /// may make; 0 means no limit.
    #[arg(long, env = "MPSFLEET_HTTP_RATE_HOST", default_value_t = 100)]
    http_rate_host: u32,
    /// Requests each host credential may make at once (a host starting hundreds of tasks).
    #[arg(long, env = "MPSFLEET_HTTP_BURST_HOST", default_value_t = 2_000)]
    http_burst_host: u32,
    /// Requests a second with a missing or unknown token from one IP address; 0 means no limit.
    #[arg(long, env = "MPSFLEET_HTTP_RATE_UNKNOWN", default_value_t = 10)]
    http_rate_unknown: u32,
    /// Requests with a missing or unknown token one IP address may make at once.
    #[arg(long, env = "MPSFLEET_HTTP_BURST_UNKNOWN", default_value_t = 500)]
    http_burst_unknown: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    Sqlite,
    Etcd,
}

pub fn run(args: ServerArgs) -> Result<()> {
    crate::init_logging("info", args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(serve(args));
    // A provider call still running (a host's termination waiting out its grace period) is
    // not waited for: the next server plans it again, and the call is idempotent.
    runtime.shutdown_timeout(STOP_WAIT);
    result
}

/// How long a stopping server waits for blocking work still in flight.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

async fn serve(args: ServerArgs) -> Result<()> {
    let given_ca = given_ca(&args)?;
    match args.store {
        StoreKind::Sqlite => {
            let opened = mpsfleet_server::open_with(&args.data_dir, Arc::new(SystemClock), given_ca.as_ref())
                .with_context(|| format!("cannot open the data dir {}", args.data_dir.display()))?;
            let listener = tokio::net::TcpListener::bind(&args.listen)
                .await
                .with_context(|| format!("cannot listen on {}", args.listen))?;
            lead(&args, opened, listener, None, shutdown_signal()).await
        }
        StoreKind::Etcd => ha::run(&args, given_ca).await,
    }
}

/// The CA the operator gives with --ca-cert and --ca-key.
fn given_ca(args: &ServerArgs) -> Result<Option<mpsfleet_server::tls::GivenCa>> {
    let given_ca = match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &PathBuf, flag: &str| {
                std::fs::read_to_string(p).with_context(|| format!("{flag}: cannot read {}", p.display()))
            };
            Some(mpsfleet_server::tls::GivenCa {
                cert_pem: read(cert, "--ca-cert")?,
                key_pem: read(key, "--ca-key")?,
            })
        }
        _ => None,
    };
    anyhow::ensure!(
        given_ca.is_none() || !args.insecure_http,
        "--ca-cert is for a server that serves HTTPS: remove --insecure-http"
    );
    Ok(given_ca)
}

/// Serves the API from the opened cluster on `listener` until `shutdown` completes: the whole
/// life of a SQLite server, one term of an elected etcd leader.
pub(crate) async fn lead(
    args: &ServerArgs,
    opened: mpsfleet_server::Opened,
    listener: tokio::net::TcpListener,
    ha: Option<Arc<mpsfleet_server::HaRole>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let limit = |rate: u32, burst: u32, name: &str| {
        anyhow::ensure!(
            rate == 0 || burst >= 1,
            "--http-burst-{name} must be at least 1 when --http-rate-{name} is above 0 (0 means no limit)"
        );
        Ok(mpsfleet_server::ratelimit::Limit::new(rate, burst))
    };
    let rate_limits = mpsfleet_server::ratelimit::RateLimits {
        admin: limit(args.http_rate_admin, args.http_burst_admin, "admin")?,
        join: limit(args.http_rate_join, args.http_burst_join, "join")?,
        host: limit(args.http_rate_host, args.http_burst_host, "host")?,
        unknown_per_ip: limit(args.http_rate_unknown, args.http_burst_unknown, "unknown")?,
    };
    let config = match &args.config {
        Some(path) => mpsfleet_server::config::ServerConfig::load(path)?,
        None => mpsfleet_server::config::ServerConfig::default(),
    };
    for name in &args.tls_san {
        mpsfleet_server::tls::check_name(name).map_err(|e| anyhow::anyhow!("--tls-san: {e}"))?;
    }
    let addr = listener.local_addr()?;
    anyhow::ensure!(
        !args.insecure_http || addr.ip().is_loopback(),
        "--insecure-http serves plain HTTP and is only allowed on a loopback address (127.0.0.1 or ::1), \
         not {addr}: remove it to serve HTTPS"
    );
    let tls = if args.insecure_http {
        None
    } else {
        let names = mpsfleet_server::tls::default_names(addr, &args.tls_san);
        let ca_file = args.data_dir.join(mpsfleet_server::CA_FILE);
        Some(mpsfleet_server::tls::ServerTls::new(opened.ca, names, SystemClock.now_ms(), Some(ca_file))?)
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut cluster = opened.cluster;
    if let Some(b) = args.broken_for_tests {
        anyhow::ensure!(
            cfg!(debug_assertions) && std::env::var("MPSFLEET_ALLOW_BROKEN").as_deref() == Ok("1"),
            "--broken-for-tests breaks a promise of the API on purpose: it is refused outside debug builds and without MPSFLEET_ALLOW_BROKEN=1"
        );
        cluster.break_for_tests(b);
    }
    if let Some(t) = &tls {
        cluster.set_cluster_cas(t.cas().hashes());
    }
    // Pools that name a provider get one built from this context when they first need it.
    cluster.set_provider_context(mpsfleet_server::cluster::ProviderContext {
        server_url: ha.as_ref().map_or_else(|| format!("{scheme}://{addr}"), |h| h.me.url.clone()),
        exec_providers: config.providers,
        ec2_providers: config.ec2_providers,
        exe: std::env::current_exe().context("cannot find this program's path")?,
        hosts_dir: args.data_dir.join("hosts"),
        local_agent_args: args.local_agent_args.split_whitespace().map(String::from).collect(),
    });
    let dir = args.data_dir.display();
    // The banner goes to stdout; a reader that has gone away (a closed pipe) must not stop the
    // server, so write errors are ignored rather than panicking like `println!`.
    let mut banner = String::new();
    if let Some(first) = &opened.first_start {
        banner +=
            &format!("first start: created the admin and join tokens (shown once; kept 0600 in {dir})\n");
        banner += &format!(
            "admin token: {}\njoin token:  {} (expires in 24 h; `mpsfleet join-token create` makes more)\n",
            first.admin_token, first.join_token
        );
    }
    banner += &format!("mpsfleet server listening on {scheme}://{addr}\n");
    match &tls {
        Some(t) => {
            banner += &format!(
                "cluster CA: {dir}/{} ({})\nuse the CLI from another terminal:\n",
                mpsfleet_server::CA_FILE,
                t.ca().hash()
            );
            banner += &format!(
                "  export MPSFLEET_SERVER=https://{addr} MPSFLEET_CA_FILE={dir}/{} MPSFLEET_TOKEN=$(cat {dir}/admin.token)\n",
                mpsfleet_server::CA_FILE
            );
        }
        None => {
            banner += "WARNING: plain HTTP (--insecure-http): tokens cross the wire unprotected\n";
            banner += "use the CLI from another terminal:\n";
            banner +=
                &format!("  export MPSFLEET_SERVER=http://{addr} MPSFLEET_TOKEN=$(cat {dir}/admin.token)\n");
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
    drop(out);
    tracing::info!(listen = %addr, data_dir = %dir, "serving");
    anyhow::ensure!(args.http_max_connections >= 1, "--http-max-connections must be at least 1");
    let ms = std::time::Duration::from_millis;
    let http = mpsfleet_server::http::HttpLimits {
        header_read_timeout: ms(args.http_header_timeout_ms.max(1)),
        body_read_timeout: ms(args.http_body_timeout_ms.max(1)),
        idle_timeout: ms(args.http_idle_timeout_ms.max(1)),
        max_connections: args.http_max_connections,
    };
    let webhook_ca = match &args.webhook_ca_file {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("cannot read --webhook-ca-file {}", path.display()))?,
        ),
        None => None,
    };
    let webhook_secret = match &args.webhook {
        None => None,
        Some(_) => {
            let path = args
                .webhook_secret_file
                .clone()
                .unwrap_or_else(|| args.data_dir.join(mpsfleet_server::WEBHOOK_SECRET_FILE));
            Some(
                mpsfleet_server::auth::webhook_secret(&path)
                    .with_context(|| format!("cannot read or make the webhook secret {}", path.display()))?,
            )
        }
    };
    let options = mpsfleet_server::ServeOptions {
        webhook: args.webhook.clone(),
        webhook_secret,
        webhook_ca,
        events_history: Some(args.events_history),
        exec: mpsfleet_server::api::ExecLimits {
            per_task: args.exec_sessions_per_task as usize,
            per_token: args.exec_sessions_per_token as usize,
            idle: std::time::Duration::from_secs(args.exec_idle_timeout),
        },
        http,
        rate_limits,
        tls,
        admin_token_file: Some(args.data_dir.join(mpsfleet_server::ADMIN_TOKEN_FILE)),
        ha,
        ecs: mpsfleet_server::ecs::EcsOptions {
            account_id: if args.ecs_conformance {
                mpsfleet_server::ecs::CONFORMANCE_ACCOUNT_ID.to_string()
            } else {
                args.aws_account_id.clone()
            },
            region: args.aws_region.clone(),
            conformance: args.ecs_conformance,
        },
        dns: args.dns_listen.map(|listen| mpsfleet_server::dns::DnsOptions {
            listen,
            pools: (!args.dns_pools.is_empty()).then(|| args.dns_pools.iter().cloned().collect()),
            required: true,
        }),
    };
    mpsfleet_server::serve(listener, cluster, options, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
