//! `mpsfleet bench …`: benchmarks that print one JSON object as their last line.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

mod browser;
mod console;
mod failover;
mod fleet;
mod ingest;
mod kill;
mod metrics;
mod recovery;
mod register;
mod scaling;
mod soak;
mod soak_faults;
mod soak_judge;
mod soak_probe;
mod start;
mod submit;
mod timeline;
mod traffic;
use ingest::{ingest, IngestBench};
use mpsfleet_core::scheduler::{GpuSpec, HostSpec, Needs, PoolConfig, Request, Scheduler};
use mpsfleet_types::{GpuDemand, GpuUuid, HostId, PlacementStrategy, PoolName, Task, TaskDefRef, TaskId};
use recovery::{recovery, RecoveryBench};
use register::{register, RegisterBench};
use start::{start, StartBench};
use std::time::Instant;
use submit::{submit, SubmitBench};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Place a mixed workload on an emulated fleet with the real scheduler.
    Scheduler(SchedulerBench),
    /// Kill an MPS daemon for good in a managed pool and time detection, decision and recovery.
    Recovery(RecoveryBench),
    /// Heartbeats with checks from many simulated hosts to the real server, over HTTP.
    Ingest(IngestBench),
    /// `task run` batches to the real server until a number of tasks are placed and committed.
    Submit(SubmitBench),
    /// Host registrations from concurrent clients to the real server, until all are committed.
    Register(RegisterBench),
    /// Task accepted to RUNNING on a local host, next to `docker run` of the same image.
    Start(StartBench),
    /// Three servers on etcd; SIGKILL the leader again and again while clients submit.
    Failover(failover::FailoverBench),
    /// A follower takes over a store of 10,000 hosts and 200,000 tasks: election to first write.
    Takeover(failover::TakeoverBench),
    /// The server's /metrics scraped at 20,000 hosts of 8 GPUs: scrape time, size and series.
    Metrics(metrics::MetricsBench),
    /// The web console's first render of 10,000 hosts in headless Chromium.
    Console(console::ConsoleBench),
    /// Managed scaling's decision for 100,000 waiting tasks on a 10,000-host pool.
    Scaling(scaling::ScalingBench),
    /// The whole system under random faults from a seed, checked at the process level.
    Soak(soak::SoakBench),
    /// Failed requests through HAProxy reading the server's DNS, through deployments,
    /// scale-ins, host drains and a daemon killed for good (a drill).
    Traffic(traffic::TrafficBench),
}

#[derive(Args)]
pub struct SchedulerBench {
    /// Hosts in the emulated fleet.
    #[arg(long, default_value_t = 10_000)]
    hosts: u32,
    /// GPUs per emulated host.
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// Tasks to place, one after another.
    #[arg(long, default_value_t = 1_000_000)]
    tasks: u32,
    /// GPU memory in MiB (default: an H200's 143,771 MiB).
    #[arg(long, default_value_t = 143_771)]
    gpu_memory_mib: u64,
    /// The pool's placement strategy.
    #[arg(long, value_parser = ["binpack", "spread"], default_value = "binpack")]
    strategy: String,
    /// Seed of the generated workload; the same seed gives the same tasks.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Instead: fill every GPU with `--tasks` / (hosts x GPUs) tasks of random priorities
    /// (1 to 80), then time this many preempting decisions for a priority-90 task of half a
    /// GPU that fits nowhere (`Scheduler::preempt`).
    #[arg(long, default_value_t = 0)]
    preempt: u32,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Scheduler(b) => scheduler(b),
        BenchCommand::Recovery(b) => recovery(b),
        BenchCommand::Ingest(b) => ingest(b),
        BenchCommand::Submit(b) => submit(b),
        BenchCommand::Register(b) => register(b),
        BenchCommand::Start(b) => start(b),
        BenchCommand::Failover(b) => failover::failover(b),
        BenchCommand::Takeover(b) => failover::takeover(b),
        BenchCommand::Metrics(b) => metrics::metrics(b),
        BenchCommand::Console(b) => console::console(b),
        BenchCommand::Scaling(b) => scaling::scaling(b),
        BenchCommand::Soak(b) => soak::soak(b),
        BenchCommand::Traffic(b) => traffic::traffic(b),
    }
}

/// splitmix64: a small, seedable generator so that a run is the same workload every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The workload mix: mostly single-client MPS tasks of several sizes and compute limits,
/// some two-client MPS tasks, 1% whole-GPU tasks, and a tenth of the tasks in services.
fn workload_item(rng: &mut Rng) -> (GpuDemand, bool) {
    const MEMORY: [(u64, u64); 6] =
        [(2048, 25), (4096, 25), (8192, 20), (16384, 15), (24576, 10), (40960, 5)];
    const COMPUTE: [u32; 4] = [100, 25, 50, 100];
    let roll = rng.below(1000);
    let demand = if roll < 7 {
        GpuDemand::Whole { count: 1 }
    } else if roll < 10 {
        GpuDemand::Whole { count: 2 }
    } else {
        let mut pick = rng.below(100);
        let memory = MEMORY
            .iter()
            .find(|(_, w)| {
                let hit = pick < *w;
                pick = pick.saturating_sub(*w);
                hit
            })
            .map_or(2048, |(m, _)| *m);
        let compute = COMPUTE[rng.below(4) as usize];
        if roll < 200 {
            GpuDemand::Mps { memory_mib: memory, clients: 2, compute_percent: 2 * compute }
        } else {
            GpuDemand::Mps { memory_mib: memory, clients: 1, compute_percent: compute }
        }
    };
    (demand, rng.below(10) == 0)
}

fn peak_rss_mib() -> f64 {
    mpsfleet_proc::vm_kib(None, "VmHWM").map_or(0.0, |kb| kb as f64 / 1024.0)
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn scheduler(b: SchedulerBench) -> Result<()> {
    if b.hosts == 0 || b.gpus_per_host == 0 {
        bail!("--hosts and --gpus-per-host must be at least 1");
    }
    if b.preempt > 0 {
        return preempt(b);
    }
    let strategy =
        if b.strategy == "spread" { PlacementStrategy::Spread } else { PlacementStrategy::Binpack };
    let mut s = Scheduler::new();
    let pool = s.upsert_pool("bench", PoolConfig { strategy, compute_bound: None });
    let build = Instant::now();
    let mut uuids: Vec<GpuUuid> = Vec::with_capacity((b.hosts * b.gpus_per_host) as usize);
    for h in 0..b.hosts {
        let gpus = vec![GpuSpec { memory_mib: b.gpu_memory_mib, max_clients: 48 }; b.gpus_per_host as usize];
        let ix = s.add_host(HostSpec {
            id: HostId::new(format!("h-{h:08x}"))?,
            pool,
            mps_available: true,
            runs_images: false,
            gpus,
        })?;
        s.set_schedulable(ix, true);
        for g in 0..b.gpus_per_host {
            uuids.push(GpuUuid::new(format!("GPU-{h:08x}-{g:04x}"))?);
        }
    }
    let build_s = build.elapsed().as_secs_f64();

    // The workload is generated before the clock starts: the figure is placement alone,
    // plus the task records the server would keep.
    let mut rng = Rng(b.seed);
    let services: Vec<_> = (0..100).map(|i| s.group(&format!("svc-{i}"))).collect();
    let requests: Vec<Request> = (0..b.tasks)
        .map(|_| {
            let (demand, in_service) = workload_item(&mut rng);
            let group = in_service.then(|| services[rng.below(services.len() as u64) as usize]);
            Request { pool, demand, group, needs: Needs::NONE, tenant: None }
        })
        .collect();
    let family = TaskDefRef::parse("bench:1")?;
    let pool_name = PoolName::new("bench")?;

    let start = Instant::now();
    let mut records: Vec<Task> = Vec::with_capacity(requests.len());
    let (mut placed, mut unplaced) = (0u64, 0u64);
    for (i, r) in requests.iter().enumerate() {
        let outcome = s.place(r);
        let mut task = Task::new(TaskId(i as u64), family.clone(), pool_name.clone(), None, String::new(), 0);
        match outcome {
            Ok(p) => {
                placed += 1;
                task.host_id = Some(s.host_id(p.host).clone());
                task.gpu_ids = p.gpus.iter().map(|&g| uuids[g as usize].clone()).collect();
            }
            Err(why) => {
                unplaced += 1;
                task.pending_reason = Some(why.to_string());
            }
        }
        records.push(task);
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = b.tasks as f64 / secs;
    let report = serde_json::json!({
        "bench": "scheduler",
        "hosts": b.hosts,
        "gpus": b.hosts * b.gpus_per_host,
        "tasks": b.tasks,
        "strategy": b.strategy,
        "placed": placed,
        "unplaced": unplaced,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "placements_per_sec": rate.round(),
        "fleet_build_seconds": (build_s * 1000.0).round() / 1000.0,
        "peak_rss_mib": peak_rss_mib().round(),
    });
    println!("{report}");
    drop(records);
    Ok(())
}

/// `bench scheduler --preempt N`: a full fleet of tenants with priorities, then N decisions
/// of who to preempt for a task that fits nowhere, each timed alone.
#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn preempt(b: SchedulerBench) -> Result<()> {
    use mpsfleet_core::scheduler::Tenant;
    let gpus = u64::from(b.hosts) * u64::from(b.gpus_per_host);
    let per_gpu = (u64::from(b.tasks) / gpus).max(1);
    let mut s = Scheduler::new();
    let pool = s.upsert_pool("bench", PoolConfig::default());
    for h in 0..b.hosts {
        let spec = GpuSpec { memory_mib: b.gpu_memory_mib, max_clients: 48 };
        let ix = s.add_host(HostSpec {
            id: HostId::new(format!("h-{h:08x}"))?,
            pool,
            mps_available: true,
            runs_images: false,
            gpus: vec![spec; b.gpus_per_host as usize],
        })?;
        s.set_schedulable(ix, true);
    }
    let mut rng = Rng(b.seed);
    let memory = b.gpu_memory_mib / per_gpu;
    let mps = |memory_mib| GpuDemand::Mps { memory_mib, clients: 1, compute_percent: 10 };
    let mut placed = 0u64;
    for id in 0..gpus * per_gpu {
        let priority = 1 + rng.below(80) as u8;
        let tenant = Tenant { id, priority, since_ms: id, shield_until_ms: 0, hold: false };
        let r = Request { pool, demand: mps(memory), group: None, needs: Needs::NONE, tenant: Some(tenant) };
        placed += u64::from(s.place(&r).is_ok());
    }
    let tenant = Tenant { id: u64::MAX, priority: 90, since_ms: 0, shield_until_ms: 0, hold: false };
    let req = Request {
        pool,
        demand: mps(b.gpu_memory_mib / 2),
        group: None,
        needs: Needs::NONE,
        tenant: Some(tenant),
    };
    if s.place(&Request { tenant: None, ..req }).is_ok() {
        bail!("the fleet is not full: raise --tasks");
    }
    let mut ms: Vec<f64> = Vec::with_capacity(b.preempt as usize);
    let mut victims = 0;
    for _ in 0..b.preempt {
        let start = Instant::now();
        let got = s.preempt(&req, 0);
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        victims = got.map_or(0, |p| p.victims.len());
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    let report = serde_json::json!({
        "bench": "preempt",
        "hosts": b.hosts,
        "gpus": gpus,
        "tasks": placed,
        "decisions": b.preempt,
        "victims": victims,
        "median_ms": (at(0.5) * 1000.0).round() / 1000.0,
        "p99_ms": (at(0.99) * 1000.0).round() / 1000.0,
        "max_ms": (at(1.0) * 1000.0).round() / 1000.0,
    });
    println!("{report}");
    Ok(())
}

/// A real `mpsfleet server` process on 127.0.0.1 with its data dir in a temporary directory,
/// killed and removed on drop.
struct ServerProcess {
    child: std::process::Child,
    dir: std::path::PathBuf,
    addr: Endpoint,
    url: String,
    admin_token: String,
    join_token: String,
}

/// Where the load generator connects: the server's address, over TLS verified against its
/// cluster CA (the server serves HTTPS by default, so the figures include TLS).
#[derive(Clone)]
struct Endpoint {
    addr: std::net::SocketAddr,
    /// `None` for a server started with `--insecure-http`.
    tls: Option<tokio_rustls::TlsConnector>,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.addr.fmt(f)
    }
}

impl Endpoint {
    fn new(addr: std::net::SocketAddr, ca_pem: Option<&[u8]>) -> Result<Endpoint> {
        let Some(ca_pem) = ca_pem else { return Ok(Endpoint { addr, tls: None }) };
        let mut roots = rustls::RootCertStore::empty();
        for cert in mpsfleet_client::tls::certificates(ca_pem).map_err(anyhow::Error::msg)? {
            roots.add(cert)?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Endpoint { addr, tls: Some(tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))) })
    }
}

impl ServerProcess {
    fn start(name: &str, insecure_http: bool) -> Result<ServerProcess> {
        ServerProcess::start_with(name, insecure_http, "127.0.0.1:0", &[])
    }

    /// [`ServerProcess::start`] on `listen`, with more `server` arguments (a store on etcd).
    fn start_with(name: &str, insecure_http: bool, listen: &str, extra: &[String]) -> Result<ServerProcess> {
        use std::io::BufRead;
        let dir = std::env::temp_dir().join(format!("mpsf-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let data = dir.join("server");
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["server", "--listen", listen, "--data-dir"])
            .arg(&data)
            .args(insecure_http.then_some("--insecure-http"))
            .args(extra)
            .env("MPSFLEET_LOG", std::env::var("MPSFLEET_BENCH_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.log"))?)
            .spawn()?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no server output"))?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("mpsfleet server listening on ").map(str::to_string));
        // Keep draining what the server prints so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let read = |f: &str| std::fs::read_to_string(data.join(f)).map(|t| t.trim().to_string());
        let ready = url.ok_or_else(|| anyhow::anyhow!("the server did not start")).and_then(|url| {
            let ca = std::fs::read(data.join(mpsfleet_server::CA_FILE))?;
            let authority = url.trim_start_matches("https://").trim_start_matches("http://");
            let addr = Endpoint::new(authority.parse()?, (!insecure_http).then_some(ca.as_slice()))?;
            let tokens = (read(mpsfleet_server::ADMIN_TOKEN_FILE)?, read(mpsfleet_server::JOIN_TOKEN_FILE)?);
            Ok((url, addr, tokens))
        });
        match ready {
            Ok((url, addr, (admin_token, join_token))) => {
                Ok(ServerProcess { child, dir, addr, url, admin_token, join_token })
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{e}; see {}", dir.join("server.log").display())
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn admin(&self) -> Result<mpsfleet_client::Client> {
        self.client(self.admin_token.clone())
    }

    /// A client with `token` that trusts the server's cluster CA (the server serves HTTPS, as
    /// by default, so the figures include TLS).
    fn client(&self, token: String) -> Result<mpsfleet_client::Client> {
        let trust = if self.addr.tls.is_none() {
            mpsfleet_client::tls::Trust::PlainHttp
        } else {
            mpsfleet_client::tls::Trust::Ca(std::fs::read(
                self.dir.join("server").join(mpsfleet_server::CA_FILE),
            )?)
        };
        Ok(mpsfleet_client::Client::with_trust(&self.url, Some(token), &trust)?)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("MPSFLEET_BENCH_KEEP").is_some() {
            eprintln!("kept {} for inspection", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A `Vm…` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in MiB (VmRSS: now, VmHWM: the high-water mark).
fn proc_vm_mib(pid: &str, field: &str) -> f64 {
    pid.parse()
        .ok()
        .and_then(|pid| mpsfleet_proc::vm_kib(Some(pid), field))
        .map_or(0.0, |kb| kb as f64 / 1024.0)
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
fn proc_cpu_seconds(pid: &str) -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let per_second = *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
            .unwrap_or(100.0)
    });
    let stat = pid.parse().ok().and_then(mpsfleet_proc::stat);
    stat.map_or(0.0, |s| (s.utime + s.stime) as f64 / per_second)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The value at quantile `q` of sorted samples.
fn quantile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A keep-alive HTTP/1.1 connection that sends prepared requests and reads one answer per
/// request: the load generator's client, kept minimal so that it costs little next to the
/// server it measures.
struct HttpConn {
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

impl HttpConn {
    async fn connect(to: Endpoint) -> Result<HttpConn> {
        let tcp = tokio::net::TcpStream::connect(to.addr).await?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match &to.tls {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::IpAddress(to.addr.ip().into());
                Box::new(tls.connect(name, tcp).await?)
            }
            None => Box::new(tcp),
        };
        Ok(HttpConn { stream, buf: Vec::with_capacity(16 * 1024) })
    }

    /// A complete request: method, path, bearer token and a JSON body.
    fn request(method: &str, path: &str, host: &str, token: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "{method} {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {token}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    /// Sends `request` and returns the answer's status and body.
    async fn send(&mut self, request: &[u8]) -> Result<(u16, &[u8])> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.stream.write_all(request).await?;
        // A TLS stream may keep the last record in its buffer until flushed: without this, the
        // request can sit unsent while both ends wait for the other.
        self.stream.flush().await?;
        self.buf.clear();
        let (head, length) = loop {
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(self.buf.capacity());
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                bail!("the server closed the connection");
            }
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end])?;
                let length = head
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                    .ok_or_else(|| anyhow::anyhow!("an answer without content-length: {head}"))?;
                break (end + 4, length);
            }
        };
        let status = std::str::from_utf8(self.buf.get(9..12).unwrap_or_default())?.parse::<u16>()?;
        while self.buf.len() < head + length {
            self.buf.reserve(head + length - self.buf.len());
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                bail!("the server closed the connection mid-answer");
            }
        }
        Ok((status, &self.buf[head..head + length]))
    }
}

/// A registration for an emulated host of `gpus` H200s, named by `n`.
fn emulated_host(pool: &str, n: u32, gpus: u32) -> Result<mpsfleet_types::HostRegistration> {
    Ok(mpsfleet_types::HostRegistration {
        pool: PoolName::new(pool)?,
        hostname: format!("bench-{n:06}"),
        gpus: (0..gpus)
            .map(|g| {
                Ok(mpsfleet_types::GpuInventory::emulated_h200(
                    GpuUuid::new(format!("GPU-{n:08x}-{g:04x}"))?,
                    g,
                ))
            })
            .collect::<Result<_>>()?,
        mps_available: true,
        emulated: true,
        runtime: Default::default(),
        runtime_version: None,
        plugins: Default::default(),
        platform: Default::default(),
    })
}

/// What an agent whose daemons all answer reports: onboarded, one `MPS_DAEMON` check per GPU.
fn healthy_report(
    reg: &mpsfleet_types::HostRegistration,
    since_ms: u64,
) -> mpsfleet_types::api::HostStatusReport {
    mpsfleet_types::api::HostStatusReport {
        onboarded: true,
        checks: reg
            .gpus
            .iter()
            .map(|g| mpsfleet_types::HostCheck {
                name: "MPS_DAEMON".into(),
                gpu_id: Some(g.uuid.clone()),
                status: mpsfleet_types::HealthStatus::Ok,
                reason: "daemon answers".into(),
                since_ms,
                restarts: 0,
                first_failure_age_ms: None,
                repair_ages_ms: Vec::new(),
            })
            .collect(),
        // Every heartbeat carries its checks in full, as before agents numbered them: the
        // figures stay comparable with earlier ones, and this is the costlier heartbeat.
        checks_rev: None,
        checks_unchanged: false,
        logs_url: Some("http://127.0.0.1:9".into()),
        logs_cert_sha256: None,
        trusted_ca_sha256: Vec::new(),
        gpu_use: Vec::new(),
        heartbeat_ms: None,
        accepts_faults: false,
    }
}

/// Registers hosts `0..count` through the API with the join token, `parallel` at a time;
/// returns each host's registration and credential, in order.
async fn register_hosts(
    server: &ServerProcess,
    pool: &str,
    count: u32,
    gpus: u32,
    parallel: u32,
) -> Result<Vec<(mpsfleet_types::HostRegistration, String)>> {
    let joiner = server.client(server.join_token.clone())?;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..parallel.max(1) {
        let (joiner, next, pool) = (joiner.clone(), next.clone(), pool.to_string());
        workers.spawn(async move {
            let mut out = Vec::new();
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= count {
                    return Ok::<_, anyhow::Error>(out);
                }
                let reg = emulated_host(&pool, n, gpus)?;
                let answer = joiner.register_host(&reg).await?;
                if (n + 1) % 5000 == 0 {
                    println!("registered {} hosts", n + 1);
                }
                out.push((n, reg, answer.credential));
            }
        });
    }
    let mut all = Vec::with_capacity(count as usize);
    while let Some(done) = workers.join_next().await {
        all.extend(done??);
    }
    all.sort_by_key(|(n, _, _)| *n);
    Ok(all.into_iter().map(|(_, reg, cred)| (reg, cred)).collect())
}

/// Sends each prepared request once over `parallel` keep-alive connections; every answer must
/// be `200 OK`.
async fn send_each_once(
    addr: Endpoint,
    requests: std::sync::Arc<Vec<Vec<u8>>>,
    parallel: usize,
) -> Result<()> {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..parallel.max(1) {
        let (requests, next, addr) = (requests.clone(), next.clone(), addr.clone());
        workers.spawn(async move {
            let mut conn = HttpConn::connect(addr).await?;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(r) = requests.get(i) else { return Ok::<_, anyhow::Error>(()) };
                let (status, body) = conn.send(r).await?;
                if status != 200 {
                    bail!("HTTP {status}: {}", String::from_utf8_lossy(body));
                }
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(())
}

#[allow(clippy::disallowed_methods)] // a benchmark reads the wall clock
fn epoch_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
