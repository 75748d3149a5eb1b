//! `mpsfleet sim`: runs the fleet simulation (crate `mpsfleet-sim`) and prints its report.

use crate::output::Format;
use anyhow::{anyhow, bail};
use mpsfleet_sim::{parse_duration, Config, Scenario};

#[derive(clap::Args)]
pub struct SimArgs {
    /// Simulated hosts (two thirds in a managed pool, the rest self-managed).
    #[arg(long, default_value_t = 50)]
    hosts: u32,
    /// Simulated GPUs per host.
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// Virtual time to simulate, e.g. 24h, 90m.
    #[arg(long, default_value = "1h")]
    duration: String,
    /// Seed of the random faults and workload; the same seed replays the same run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run this many seeds, from --seed on, and report each: a sweep (no minimising; replay a
    /// seed that broke with --seed alone). Exits non-zero if any broke.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    seeds: u64,
    /// Runs of a sweep at once [default: the machine's cores].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    jobs: Option<u64>,
    /// Random host faults per host per virtual hour, of the scenario's kinds.
    #[arg(long, default_value_t = 0.01)]
    fault_rate: f64,
    /// steady, daemon-crash, hang, server-fault, xid, partition, vanish, provider-flaky,
    /// driver-rollout, control-plane-restart, full-pool (a full pool recovering by preemption)
    /// or mixed; or scaling (managed scaling under a day of demand: --hosts is the pool's
    /// maxHosts, --duration 24h for a whole day).
    #[arg(long, default_value = "mixed")]
    scenario: String,
    /// How often simulated agents heartbeat (the agent's own default is 1000).
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// The managed pool's provider.launchTimeoutSeconds (10 to 3600): the simulated provider
    /// takes up to 90 s to launch and boot a host, so less than that makes replacements count
    /// as failed and their incidents breach their replace bound.
    #[arg(long, default_value_t = 120)]
    launch_timeout_seconds: u32,
    /// Print the whole event trace after the report.
    #[arg(long)]
    trace: bool,
    /// On a broken invariant, print the run's trace without looking for a shorter one (each
    /// try replays the run up to the failure).
    #[arg(long)]
    no_minimise: bool,
    /// Output format: `json` prints the report as one JSON line.
    #[arg(short = 'o', long, value_parser = crate::output::parse_format, default_value = "table")]
    output: Format,
}

/// `--scenario scaling`: managed scaling under a day of demand (`mpsfleet_sim::scaling`);
/// `--hosts` is the pool's maxHosts.
fn run_scaling(args: &SimArgs) -> anyhow::Result<()> {
    let cfg = mpsfleet_sim::scaling::ScalingConfig {
        max_hosts: args.hosts.max(2),
        min_hosts: 2,
        gpus_per_host: args.gpus_per_host,
        duration_ms: parse_duration(&args.duration).map_err(|e| anyhow!("--duration: {e}"))?,
        seed: args.seed,
    };
    if !(1..=64).contains(&cfg.gpus_per_host) || cfg.max_hosts > 1_000 {
        bail!(
            "--scenario scaling takes --hosts up to 1000 (the pool's maxHosts) and --gpus-per-host 1 to 64"
        );
    }
    let report =
        mpsfleet_sim::scaling::run(&cfg).map_err(|e| anyhow!("the simulation could not start: {e}"))?;
    match args.output {
        Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
            println!("{}", serde_json::to_string(&report)?)
        }
        Format::Table | Format::Wide => print!("{}", report.render()),
    }
    if report.server_errors > 0 {
        bail!("{} calls to the control plane failed", report.server_errors);
    }
    Ok(())
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    if args.scenario == "scaling" {
        return run_scaling(&args);
    }
    let cfg = Config {
        hosts: args.hosts,
        gpus_per_host: args.gpus_per_host,
        duration_ms: parse_duration(&args.duration).map_err(|e| anyhow!("--duration: {e}"))?,
        seed: args.seed,
        fault_rate: args.fault_rate,
        scenario: Scenario::parse(&args.scenario).map_err(|e| anyhow!("--scenario: {e}"))?,
        heartbeat_ms: args.heartbeat_ms,
        launch_timeout_seconds: args.launch_timeout_seconds,
        minimise: !args.no_minimise,
        ..Config::default()
    };
    if !(cfg.fault_rate >= 0.0 && cfg.fault_rate.is_finite()) {
        bail!("--fault-rate must be a number of faults per host per hour, 0 or more");
    }
    if !(100..=10_000).contains(&cfg.heartbeat_ms) {
        bail!("--heartbeat-ms must be from 100 to 10000 (the pool's heartbeat grace is 10s)");
    }
    if !(10..=3600).contains(&cfg.launch_timeout_seconds) {
        bail!("--launch-timeout-seconds must be from 10 to 3600, got {}", cfg.launch_timeout_seconds);
    }
    if args.seeds > 1 {
        return sweep(&cfg, args.seeds, args.jobs);
    }
    let out = mpsfleet_sim::run(&cfg).map_err(|e| anyhow!("the simulation could not start: {e}"))?;
    match args.output {
        Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
            let mut v = serde_json::to_value(&out.report)?;
            v["wallMs"] = serde_json::json!(out.wall_ms);
            println!("{}", serde_json::to_string(&v)?);
        }
        Format::Table | Format::Wide => {
            print!("{}", out.report.render());
            println!("wall time:            {:.1}s", out.wall_ms as f64 / 1000.0);
            if args.trace {
                for line in &out.trace {
                    println!("{line}");
                }
            }
        }
    }
    if out.violation.is_some() {
        eprint!("{}", mpsfleet_sim::failure_text(&cfg, &out));
        bail!("an invariant broke (seed {})", cfg.seed);
    }
    Ok(())
}

/// `--seeds N`: the run of `cfg` at each of N seeds from its own, `jobs` at a time, a line a
/// seed in seed order; an error naming the seeds that broke an invariant.
fn sweep(cfg: &Config, seeds: u64, jobs: Option<u64>) -> anyhow::Result<()> {
    let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let first = cfg.seed;
    let next = std::sync::atomic::AtomicU64::new(0);
    let results = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let watch = mpsfleet_core::clock::Stopwatch::start();
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(seeds) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= seeds {
                    break;
                }
                let one = Config { seed: first + i, minimise: false, ..cfg.clone() };
                let line = match mpsfleet_sim::run(&one) {
                    Ok(out) => match &out.violation {
                        None => Ok(format!(
                            "seed {}: invariants held ({} incidents, {:.1}s)",
                            one.seed,
                            out.report.incidents,
                            out.wall_ms as f64 / 1000.0
                        )),
                        Some(v) => Err(format!(
                            "seed {}: INVARIANT BROKEN: {} at {}: {}",
                            one.seed,
                            v.invariant,
                            mpsfleet_sim::config::fmt_time(v.at_ms),
                            v.detail
                        )),
                    },
                    Err(e) => Err(format!("seed {}: could not start: {e}", one.seed)),
                };
                results.lock().unwrap_or_else(|p| p.into_inner()).insert(one.seed, line);
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let broken: Vec<u64> = results.iter().filter(|(_, r)| r.is_err()).map(|(s, _)| *s).collect();
    for line in results.values() {
        match line {
            Ok(l) | Err(l) => println!("{l}"),
        }
    }
    println!(
        "{seeds} seeds from {first} ({} hosts, {} GPUs each, {}, fault rate {}, scenario {}): {} held, {} broken; wall time {:.1}s",
        cfg.hosts,
        cfg.gpus_per_host,
        mpsfleet_sim::config::fmt_time(cfg.duration_ms),
        cfg.fault_rate,
        cfg.scenario,
        seeds - broken.len() as u64,
        broken.len(),
        watch.seconds()
    );
    if !broken.is_empty() {
        bail!(
            "invariants broke at seeds {broken:?}: replay one with --seed S (it looks for the fewest faults)"
        );
    }
    Ok(())
}
