//! `bench scaling`: the managed scaling decision for a pool with many waiting tasks: packing
//! them onto the provider's host shape and deciding the step (`mpsfleet_core::scaling`).

use super::{workload_item, Rng};
use anyhow::{bail, Result};
use clap::Args;
use mpsfleet_core::scaling::{decide, pack, Input, Shape, Step};
use mpsfleet_types::scaling::ManagedScaling;
use std::time::Instant;

#[derive(Args)]
pub struct ScalingBench {
    /// Waiting tasks, drawn from the scheduler benchmark's mix.
    #[arg(long, default_value_t = 100_000)]
    pending: u32,
    /// Hosts in the pool: nine in ten busy, the rest empty long enough to be removed.
    #[arg(long, default_value_t = 10_000)]
    hosts: u32,
    /// GPUs per host of the provider's shape.
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// GPU memory in MiB (default: an H200's 143,771 MiB).
    #[arg(long, default_value_t = 143_771)]
    gpu_memory_mib: u64,
    /// Decisions to time (the median and the slowest are reported).
    #[arg(long, default_value_t = 7)]
    runs: u32,
    /// Seed of the generated workload.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
pub fn scaling(b: ScalingBench) -> Result<()> {
    if b.hosts == 0 || b.gpus_per_host == 0 || b.runs == 0 {
        bail!("--hosts, --gpus-per-host and --runs must be at least 1");
    }
    let mut rng = Rng(b.seed);
    let waiting: Vec<_> = (0..b.pending).map(|_| workload_item(&mut rng).0).collect();
    let shape = Shape {
        gpus: b.gpus_per_host,
        gpu_memory_mib: b.gpu_memory_mib,
        max_clients: 48,
        compute_bound: None,
        cpu: None,
        memory_mib: None,
    };
    let policy = ManagedScaling { min_hosts: 1, max_hosts: 10_000, ..Default::default() };
    let busy = b.hosts - b.hosts / 10;
    let empty: Vec<(u64, u64)> = (0..u64::from(b.hosts / 10)).map(|i| (i, 3_600_000)).collect();
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..b.runs {
        let start = Instant::now();
        let input = Input {
            hosts: b.hosts,
            busy,
            empty_for_ms: empty.clone(),
            packing: pack(&shape, &waiting),
            ..Default::default()
        };
        let step = decide(&policy, &input);
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        last = Some((input.packing, step));
    }
    times.sort_by(f64::total_cmp);
    let (packing, step) = last.expect("at least one run");
    let (target, what) = match &step {
        Step::Hold { target, .. } => (*target, "hold".to_string()),
        Step::Out { target, add, .. } => (*target, format!("add {add}")),
        Step::In { target, remove, .. } => (*target, format!("remove {}", remove.len())),
    };
    let report = serde_json::json!({
        "pending": b.pending,
        "hosts": b.hosts,
        "gpusPerHost": b.gpus_per_host,
        "runs": b.runs,
        "medianMs": times[times.len() / 2],
        "maxMs": times[times.len() - 1],
        "newHostsPacked": packing.hosts,
        "neverFit": packing.never_fit,
        "target": target,
        "step": what,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
