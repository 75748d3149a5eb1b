//! `mpsfleet up`: a server and N local hosts on this machine, for trying everything out.

use anyhow::{Context, Result};
use clap::Args;
use mpsfleet_core::clock::{Clock, SystemClock};
use mpsfleet_server::cluster::ProviderContext;
use mpsfleet_server::provider::{terminate_with_retries, CapacityProvider, LocalProvider, Retry};
use mpsfleet_types::policy::{HostShape, Provider};
use mpsfleet_types::scaling::ManagedScaling;
use mpsfleet_types::{CreatePool, HostStatus, OwnershipMode, PoolName, RuntimeKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct UpArgs {
    /// How log lines are written to standard error: `text`, or `json` (one object a line,
    /// with each API request's id) for log collectors.
    #[arg(long, value_enum, default_value = "text")]
    log_format: crate::LogFormat,
    /// Local hosts to start (agents as child processes).
    #[arg(long, default_value_t = 2)]
    hosts: u32,
    /// Let the pool grow to this many hosts when tasks wait for room, and shrink back to
    /// --hosts once hosts have been empty for --scale-in-after (managed scaling; managed mode
    /// only). A restarted `up` brings back the hosts the pool had.
    #[arg(long)]
    max_hosts: Option<u32>,
    /// Seconds a host stays empty before managed scaling removes it (with --max-hosts).
    #[arg(long, default_value_t = 900, requires = "max_hosts")]
    scale_in_after: u32,
    /// Emulated GPUs per host when NVML finds none.
    #[arg(long, default_value_t = 2)]
    gpus_per_host: u32,
    /// The emulated GPU: MODEL:MEMORY_MIB (an H200 by default).
    #[arg(long, default_value = "H200:143771")]
    gpu: String,
    /// Ownership mode of the pool `up` creates.
    #[arg(long, value_parser = ["managed", "self-managed"], default_value = "managed")]
    mode: String,
    /// The pool the local hosts join (created on first run).
    #[arg(long, default_value = "default")]
    pool: String,
    /// Address the server listens on (HTTPS), HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Where service discovery answers DNS (UDP and TCP), HOST:PORT, or `off`. Not given:
    /// 127.0.0.1:8600 (Consul's port), skipped with a note when it is in use.
    #[arg(long)]
    dns_listen: Option<String>,
    /// The server's state (cluster data, CA, admin token) and the local hosts' directories.
    #[arg(long, default_value = ".mpsfleet")]
    data_dir: PathBuf,
    /// Path of nvidia-cuda-mps-control (default: PATH, then target/mps from scripts/install-mps.sh).
    #[arg(long)]
    mps_control: Option<PathBuf>,
}

/// Where the CLI looks for its server and token when neither flag nor variable is given.
pub fn client_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("mpsfleet").join("config.json"))
}

/// Terminates every host recorded under the provider's directory, those of earlier runs
/// included, all at once; each termination ends the agent, its shims, tasks and MPS daemons.
async fn stop_hosts(provider: Arc<LocalProvider>) -> Result<()> {
    let names = provider.close();
    // Stopping goes on when nobody reads the output any more (a closed terminal).
    say(&format!("stopping {} host(s): agents, their tasks and MPS daemons...", names.len()));
    let stops: Vec<_> = names
        .into_iter()
        .map(|name| {
            let provider = provider.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = provider_terminate(&provider, &name) {
                    eprintln!("warning: {e}");
                }
            })
        })
        .collect();
    for stop in stops {
        stop.await?;
    }
    Ok(())
}

/// A termination with the provider's retries (processes that outlast SIGKILL for a moment).
fn provider_terminate(provider: &LocalProvider, name: &str) -> Result<()> {
    let policy = Retry {
        initial_backoff: Duration::from_millis(500),
        max_backoff: Duration::from_secs(2),
        max_attempts: 3,
    };
    terminate_with_retries(provider, name, &policy, |_, backoff| std::thread::sleep(backoff))
        .into_result()
        .map(|_| ())
        .map_err(Into::into)
}

/// Finds the real MPS control binary: the flag, PATH, or the copy scripts/install-mps.sh makes.
pub fn find_mps_control(flag: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = flag {
        return Some(p.to_path_buf());
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|d| d.join("nvidia-cuda-mps-control")).find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let local = PathBuf::from("target/mps/usr/bin/nvidia-cuda-mps-control");
        local.is_file().then(|| local.canonicalize().unwrap_or(local))
    })
}

/// The local provider of `up --max-hosts`: hosts of the emulated GPUs' shape, scaling between
/// --hosts and `max`.
fn scaling_provider(local: Provider, args: &UpArgs, max: u32) -> Result<Provider> {
    let memory = args.gpu.rsplit_once(':').and_then(|(_, m)| m.parse::<u64>().ok());
    let memory = memory.with_context(|| format!("--gpu must be MODEL:MEMORY_MIB, got {}", args.gpu))?;
    Ok(Provider {
        host_shape: Some(HostShape {
            gpus: args.gpus_per_host,
            gpu_memory_mib: memory,
            max_mps_clients: 48,
            cpu: None,
            memory_mib: None,
        }),
        managed_scaling: Some(ManagedScaling {
            min_hosts: args.hosts,
            max_hosts: max,
            // Local hosts start in seconds.
            instance_warmup_period: 60,
            scale_in_after_seconds: args.scale_in_after,
            ..Default::default()
        }),
        ..local
    })
}

pub fn run(args: UpArgs) -> Result<()> {
    crate::init_logging("warn", args.log_format);
    anyhow::ensure!((1..=64).contains(&args.hosts), "--hosts must be from 1 to 64, got {}", args.hosts);
    anyhow::ensure!(
        (1..=64).contains(&args.gpus_per_host),
        "--gpus-per-host must be from 1 to 64, got {}",
        args.gpus_per_host
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(up(args))
}

async fn up(args: UpArgs) -> Result<()> {
    // The port first: a port in use fails before anything (tokens, a database) is written.
    let listener = tokio::net::TcpListener::bind(&args.listen).await.with_context(|| {
        format!("cannot listen on {} (is another server running? try --listen)", args.listen)
    })?;
    let dir = &args.data_dir;
    let mut opened = mpsfleet_server::open(dir, Arc::new(SystemClock))
        .with_context(|| format!("cannot open the data dir {}", dir.display()))?;
    let mode = if args.mode == "managed" { OwnershipMode::Managed } else { OwnershipMode::SelfManaged };
    // GPUs: real ones when NVML finds them (one host: they are this machine's), else declared.
    let real_gpus = mpsfleet_agent::discovery::nvml().is_ok();
    let hosts = if real_gpus { 1 } else { args.hosts };
    let mut local = mpsfleet_types::policy::Provider::local(hosts);
    if let Some(max) = args.max_hosts {
        anyhow::ensure!(
            mode == OwnershipMode::Managed,
            "--max-hosts needs --mode managed: scaling launches hosts"
        );
        anyhow::ensure!(
            !real_gpus,
            "--max-hosts needs emulated GPUs: every local host would see the same GPUs"
        );
        anyhow::ensure!(
            (hosts..=64).contains(&max),
            "--max-hosts must be from --hosts ({hosts}) to 64, got {max}"
        );
        local = scaling_provider(local, &args, max)?;
        // The hosts the pool had when `up` last stopped come back, not --hosts.
        if opened.cluster.read().pool(&args.pool).is_ok() {
            let had = opened
                .cluster
                .read()
                .hosts(Some(&args.pool))
                .iter()
                .filter(|h| h.status != HostStatus::Deregistered)
                .count();
            local.desired_hosts = (had as u32).clamp(hosts, max);
        }
    }
    if opened.cluster.read().pool(&args.pool).is_err() {
        opened.cluster.create_pool(CreatePool {
            name: args.pool.clone(),
            mode: Some(mode),
            // Managed pools are repaired with new local hosts; self-managed ones by the operator.
            provider: (mode == OwnershipMode::Managed).then_some(local.clone()),
            strategy: None,
            compute_overcommit_percent: None,
            // A local fleet is the operator's own machine: its tasks may use every container
            // option (docs/pools.md "Task policy").
            task_policy: Some(mpsfleet_types::TaskPolicy::permissive()),
            ..Default::default()
        })?;
    } else if mode == OwnershipMode::Managed {
        // The pool of an earlier `up`: keep it at this run's size.
        let update = mpsfleet_types::UpdatePool { provider: Some(local), ..Default::default() };
        opened.cluster.update_pool(&args.pool, update)?;
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_string());
    let admin_token = read(mpsfleet_server::ADMIN_TOKEN_FILE).context("cannot read the admin token")?;

    let addr = listener.local_addr()?;
    let url = format!("https://{addr}");
    let names = mpsfleet_server::tls::default_names(addr, &[]);
    let ca_file = dir.join(mpsfleet_server::CA_FILE);
    let tls =
        mpsfleet_server::tls::ServerTls::new(opened.ca, names, SystemClock.now_ms(), Some(ca_file.clone()))?;
    opened.cluster.set_cluster_cas(tls.cas().hashes());
    let ca_file = ca_file.canonicalize().unwrap_or(ca_file);

    // The server, join token, pool and name come with each launch request; these are the rest.
    // The local fleet takes drills (`mpsfleet drill run`): try the recovery path on it.
    let mut agent_args = vec!["--stop-tasks-on-exit".to_string(), "--allow-fault-injection".to_string()];
    if !real_gpus {
        agent_args.extend(["--emulate-gpus".into(), format!("{}:{}", args.gpu, args.gpus_per_host)]);
    }
    // Containers: Docker when its socket answers, decided here once so that every host (and
    // every replacement) runs the same way; images already on the machine are used as they are.
    let socket = mpsfleet_agent::docker::socket_from_env();
    let docker = mpsfleet_agent::docker::engine_version(&socket, Duration::from_secs(3)).await;
    match &docker {
        Ok(_) => agent_args.extend([
            "--runtime".into(),
            "docker".into(),
            "--docker-socket".into(),
            socket.display().to_string(),
            "--image-pull-behavior".into(),
            "prefer-cached".into(),
            // A demo on a laptop: its ports are reached from this machine, not the network.
            "--publish-address".into(),
            "127.0.0.1".into(),
        ]),
        Err(_) => agent_args.extend(["--runtime".into(), "process".into()]),
    }
    let mps = find_mps_control(args.mps_control.as_deref());
    match &mps {
        Some(p) => agent_args.extend(["--mps-control".into(), p.display().to_string()]),
        None => agent_args.push("--mps-model".into()),
    }
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    // One provider for the first hosts and for the replacements the server launches; Ctrl-C
    // stops every host recorded under the data dir, those of earlier runs included.
    let provider = Arc::new(LocalProvider::new(
        exe.clone(),
        dir.join("hosts"),
        agent_args.clone(),
        Duration::from_secs(40),
    ));
    let pool = PoolName::new(args.pool.clone())?;
    opened.cluster.set_provider(pool, provider.clone());
    opened.cluster.set_provider_context(ProviderContext {
        server_url: url.clone(),
        exec_providers: Default::default(),
        ec2_providers: Default::default(),
        exe,
        hosts_dir: dir.join("hosts"),
        local_agent_args: agent_args,
    });
    let (dns, dns_note) = dns_address(args.dns_listen.as_deref()).await?;
    let options = mpsfleet_server::ServeOptions {
        tls: Some(tls),
        admin_token_file: Some(dir.join(mpsfleet_server::ADMIN_TOKEN_FILE)),
        // The default address may be taken between the check and the bind (another `up`):
        // then the server starts without DNS rather than not at all.
        dns: dns.map(|listen| mpsfleet_server::dns::DnsOptions {
            listen,
            pools: None,
            required: args.dns_listen.is_some(),
        }),
        ..Default::default()
    };
    // The hosts of a self-managed pool join with a join token of this run's own (the data
    // dir's first one expires a day after it was made); the previous run's is revoked.
    const UP_JOIN_TOKEN: &str = "mpsfleet up";
    for old in opened.cluster.read().join_tokens().into_iter().filter(|t| t.description == UP_JOIN_TOKEN) {
        opened.cluster.revoke_join_token(&old.id, "mpsfleet up")?;
    }
    let req =
        mpsfleet_types::access::CreateJoinToken { expires_in_s: None, description: UP_JOIN_TOKEN.into() };
    let join_token = opened.cluster.create_join_token(req, "mpsfleet up")?.token;
    // The hosts of an earlier run come back as themselves (same names, directories and so host
    // ids); one whose directory is gone retires quietly (mpsfleet_server's `local_fleet`).
    let mut launch: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for h in opened.cluster.read().hosts(Some(&args.pool)) {
        if h.status == HostStatus::Deregistered {
            continue;
        }
        if dir.join("hosts").join(&h.hostname).join("identity.json").is_file() {
            launch.insert(h.hostname.clone());
        } else {
            let why = format!("stopped with up: its directory hosts/{} is gone", h.hostname);
            opened.cluster.retire_host(&h.id, &why)?;
            println!("host {} ({}) retired: {why}", h.id, h.hostname);
        }
    }
    // Hosts that registered with another runtime than the machine's now (Docker Engine started
    // or stopped since) come back with this one: the banner's runtime is every host's.
    let runtime = if docker.is_ok() { RuntimeKind::Docker } else { RuntimeKind::Process };
    for h in opened.cluster.read().hosts(Some(&args.pool)) {
        if h.runtime == runtime || !launch.contains(&h.hostname) {
            continue;
        }
        let why = match &docker {
            Ok(_) => "Docker Engine answers on this machine now (mpsfleet up)",
            Err(_) => "Docker Engine does not answer on this machine now (mpsfleet up)",
        };
        mpsfleet_agent::agent::set_registered_runtime(&dir.join("hosts").join(&h.hostname), runtime)
            .with_context(|| format!("cannot change the runtime of host {} ({})", h.id, h.hostname))?;
        let plugins = match &docker {
            Ok(_) => mpsfleet_agent::docker::engine_plugins(&socket, Duration::from_secs(30))
                .await
                .unwrap_or_default(),
            Err(_) => Default::default(),
        };
        opened.cluster.change_local_host_runtime(&h.id, runtime, docker.clone().ok(), plugins, why)?;
        println!(
            "host {} ({}) now runs tasks {} (it registered {}): {why}",
            h.id,
            h.hostname,
            if runtime == RuntimeKind::Docker { "as containers" } else { "as processes" },
            if h.runtime == RuntimeKind::Docker { "with Docker" } else { "as a process host" },
        );
    }
    // A managed pool is kept at its size by the server (through this provider); the hosts of a
    // self-managed pool are the operator's, started here.
    if mode == OwnershipMode::SelfManaged {
        launch.extend((0..hosts).map(|i| format!("local-{i}")));
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(mpsfleet_server::serve(listener, opened.cluster, options, async {
        let _ = stop_rx.await;
    }));
    for name in launch {
        provider.launch(&mpsfleet_server::provider::LaunchRequest {
            name,
            pool: args.pool.clone(),
            server: url.clone(),
            join_token: join_token.clone(),
            agent_args: Vec::new(),
            incident: String::new(),
        })?;
    }

    if let Some(path) = client_config_path() {
        let config = serde_json::json!({ "server": url, "token": admin_token, "caFile": ca_file });
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).ok();
        }
        mpsfleet_server::files::write_secret(&path, &config.to_string())
            .with_context(|| format!("cannot write the client config {}", path.display()))?;
        println!("client config: {} (the CLI in another terminal uses it)", path.display());
    }
    println!("mpsfleet up: server {url}, pool {} ({}), {hosts} host(s)", args.pool, args.mode);
    if let Some(max) = args.max_hosts {
        println!(
            "managed scaling: {hosts} to {max} host(s); a host empty for {} s is removed (mpsfleet pool explain {})",
            args.scale_in_after, args.pool
        );
    }
    if real_gpus {
        println!("GPUs: real, found through NVML (one host: this machine)");
        if args.hosts > 1 {
            println!("note: --hosts {} ignored: every local host would see the same GPUs", args.hosts);
        }
    } else {
        println!(
            "GPUs: emulated, {} x {} per host (no NVIDIA GPU found through NVML)",
            args.gpus_per_host, args.gpu
        );
    }
    match &mps {
        Some(p) => println!("MPS: the real daemon, {}", p.display()),
        None => println!(
            "MPS: emulated by the in-process model (nvidia-cuda-mps-control not found); \
             run 'bash scripts/install-mps.sh' to use the real daemon"
        ),
    }
    match &docker {
        Ok(version) => println!(
            "containers: Docker Engine {version} at {} (images on this machine are used as they are; \
             others are pulled)",
            socket.display()
        ),
        Err(why) => println!(
            "containers: none, tasks run as processes (Docker Engine at {}: {why}); to run images, \
             start an engine (Debian: apt-get install docker.io, then systemctl start docker; or, \
             from the source tree as root, a private one: bash scripts/docker-env.sh start && \
             eval \"$(bash scripts/docker-env.sh env)\"), point DOCKER_HOST at its socket, and \
             start up again",
            socket.display()
        ),
    }
    match dns {
        Some(a) => println!(
            "service discovery: DNS on {a} (UDP and TCP): SRV _<port>._tcp.<service>.{}.mpsfleet.; a load \
             balancer reads it with 'nameserver mpsfleet {a}' (HAProxy: deploy/haproxy/, docs/traffic.md)",
            args.pool
        ),
        None => println!("service discovery: no DNS ({dns_note})"),
    }
    println!("admin token: {admin_token}");
    println!("agent logs: {}/hosts/*/agent.log", dir.display());
    let me = command_name();
    println!("try: {me} host list; the web console: {me} console; press Ctrl-C to stop everything");

    // Ctrl-C, or SIGTERM (a service manager, `kill`): the same orderly stop either way.
    crate::server::shutdown_signal().await;
    // The server first: its controllers stop before any host does, so that the hosts going
    // away open no incident and launch no replacement.
    let _ = stop_tx.send(());
    let served = server.await;
    // The hosts go even when the server ended with an error.
    stop_hosts(provider).await?;
    record_stopped(dir, &args.pool);
    served??;
    say("stopped");
    Ok(())
}

/// The hosts stopped their tasks as they exited, with the server already down: the state says
/// so, so that the next `up` starts from what really runs (services start their replicas
/// again; standalone tasks stay STOPPED, "stopped with up").
fn record_stopped(dir: &Path, pool: &str) {
    let recorded = mpsfleet_server::open(dir, Arc::new(SystemClock))
        .and_then(|mut opened| opened.cluster.record_stopped_with_hosts(pool, STOPPED_WITH_UP));
    match recorded {
        Ok(0) => {}
        Ok(n) => say(&format!("{n} task(s) recorded as stopped with up")),
        Err(e) => eprintln!("warning: cannot record the tasks as stopped with up: {e}"),
    }
}

/// The stop reason of the tasks `up` stopped with its hosts.
pub const STOPPED_WITH_UP: &str = "stopped with up";

/// Prints a line to standard output, ignoring a closed one.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// How a user at this shell runs this binary: `mpsfleet` when that name on PATH is this
/// binary, else its path (`./target/release/mpsfleet` under the working directory).
fn command_name() -> String {
    let Ok(me) = std::env::current_exe().and_then(std::fs::canonicalize) else { return "mpsfleet".into() };
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("mpsfleet")).find(|p| p.is_file()));
    if on_path.and_then(|p| std::fs::canonicalize(p).ok()).is_some_and(|p| p == me) {
        return "mpsfleet".into();
    }
    let here = std::env::current_dir().and_then(std::fs::canonicalize).ok();
    match here.as_deref().and_then(|h| me.strip_prefix(h).ok()) {
        Some(rel) => format!("./{}", rel.display()),
        None => me.display().to_string(),
    }
}

/// Where `up` answers DNS: the address asked for (which must be free), none for `off`, and by
/// default 127.0.0.1:8600 when it is free (with why not otherwise).
async fn dns_address(asked: Option<&str>) -> anyhow::Result<(Option<std::net::SocketAddr>, String)> {
    match asked {
        Some("off") => Ok((None, "--dns-listen off".into())),
        Some(a) => {
            let addr = a.parse().with_context(|| format!("--dns-listen {a:?}: not HOST:PORT (or off)"))?;
            Ok((Some(addr), String::new()))
        }
        None => {
            let default: std::net::SocketAddr = ([127, 0, 0, 1], 8600).into();
            // Free on both UDP and TCP now; the server binds it again at once.
            match mpsfleet_server::dns::bind(default).await {
                Ok(_) => Ok((Some(default), String::new())),
                Err(e) => Ok((None, format!("{default} is in use ({e}); pass --dns-listen HOST:PORT"))),
            }
        }
    }
}
