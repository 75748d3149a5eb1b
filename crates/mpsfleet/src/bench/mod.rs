//! `mpsfleet bench …`: benchmarks that print one JSON object as their last line.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

mod recovery;
use mpsfleet_core::scheduler::{GpuSpec, HostSpec, PoolConfig, Request, Scheduler};
use mpsfleet_types::{GpuDemand, GpuUuid, HostId, PlacementStrategy, PoolName, Task, TaskDefRef, TaskId};
use recovery::{recovery, RecoveryBench};
use std::time::Instant;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Place a mixed workload on an emulated fleet with the real scheduler.
    Scheduler(SchedulerBench),
    /// Kill an MPS daemon for good in a managed pool and time detection, decision and recovery.
    Recovery(RecoveryBench),
}

#[derive(Args)]
pub struct SchedulerBench {
    #[arg(long, default_value_t = 10_000)]
    hosts: u32,
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    #[arg(long, default_value_t = 1_000_000)]
    tasks: u32,
    /// GPU memory in MiB (default: an H200's 143,771 MiB).
    #[arg(long, default_value_t = 143_771)]
    gpu_memory_mib: u64,
    #[arg(long, value_parser = ["binpack", "spread"], default_value = "binpack")]
    strategy: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Scheduler(b) => scheduler(b),
        BenchCommand::Recovery(b) => recovery(b),
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
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn scheduler(b: SchedulerBench) -> Result<()> {
    if b.hosts == 0 || b.gpus_per_host == 0 {
        bail!("--hosts and --gpus-per-host must be at least 1");
    }
    let strategy =
        if b.strategy == "spread" { PlacementStrategy::Spread } else { PlacementStrategy::Binpack };
    let mut s = Scheduler::new();
    let pool = s.upsert_pool("bench", PoolConfig { strategy, compute_bound: None });
    let build = Instant::now();
    let mut uuids: Vec<GpuUuid> = Vec::with_capacity((b.hosts * b.gpus_per_host) as usize);
    for h in 0..b.hosts {
        let gpus = vec![GpuSpec { memory_mib: b.gpu_memory_mib, max_clients: 48 }; b.gpus_per_host as usize];
        let ix =
            s.add_host(HostSpec { id: HostId::new(format!("h-{h:08x}"))?, pool, mps_available: true, gpus })?;
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
            Request { pool, demand, group }
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
