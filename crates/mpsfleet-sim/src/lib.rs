//! A deterministic fleet simulation: the real control plane (`mpsfleet_server::cluster::Cluster`
//! over a `MemoryStore`, on a `ManualClock`) against many simulated hosts in one process, with
//! faults injected from a seed and invariants checked after every step.
//!
//! - [`config`]: the fleet, the scenarios, the faults they plan from the seed.
//! - [`engine`]: the loop; simulated agents (heartbeats with `MPS_DAEMON` and `GPU` checks, the
//!   agent's own MPS health state machine, tasks), the capacity provider, the MPS model; the
//!   invariant checks after every step and the shortfall breakdown in its submodules.
//! - `world`: the simulated hosts, their daemons and task processes, and the indexes the loop
//!   finds them by (host id, name, fault slot; running task to host).
//! - [`invariants`]: what must hold after every step, and the service recovery bound.
//! - [`preemption`]: the preemption invariants, over the preemptions the records show.
//! - [`report`]: counters and the report.
//!
//! Same configuration and seed, same run: the report and the trace are equal byte for byte
//! (the wall time is reported apart). See docs/sim.md.

pub mod config;
pub mod engine;
pub mod invariants;
pub mod preemption;
pub mod report;
pub mod rng;
pub mod scaling;
pub mod timing;
mod world;

pub use config::{parse_duration, Config, Fault, FaultKind, ProviderModel, Sabotage, Scenario};
pub use invariants::Violation;
pub use report::Report;

/// What a run came to.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub report: Report,
    /// The run's events in virtual time: injected faults and what the fleet did about them.
    pub trace: Vec<String>,
    /// The faults the run injected.
    pub faults: Vec<Fault>,
    pub violation: Option<Violation>,
    /// When an invariant broke: the fewest faults, replayed up to the failure, that still
    /// break it, and that replay's trace.
    pub minimal: Option<Minimal>,
    /// Wall time of the run itself (not of the minimisation), in ms; not part of the report.
    pub wall_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Minimal {
    pub faults: Vec<Fault>,
    pub trace: Vec<String>,
    pub replays: u32,
}

/// Runs one simulation; on a broken invariant, minimises the trace when the config asks.
pub fn run(cfg: &Config) -> Result<Outcome, String> {
    let started = wall_clock_ms();
    let mut sim = engine::Sim::new(cfg.clone())?;
    sim.run();
    let wall_ms = wall_clock_ms().saturating_sub(started);
    let report = Report::build(cfg, &sim.stats, sim.checker.checks, sim.steps, sim.violation.as_ref());
    let violation = sim.violation.clone();
    let faults = sim.faults.clone();
    let minimal = match &violation {
        Some(v) if cfg.minimise => Some(minimise(cfg, &faults, v)?),
        _ => None,
    };
    Ok(Outcome { report, trace: std::mem::take(&mut sim.trace), faults, violation, minimal, wall_ms })
}

/// Replays `faults` up to the failure and reports whether the same invariant breaks.
fn reproduces(cfg: &Config, faults: &[Fault], v: &Violation) -> Result<Option<Vec<String>>, String> {
    // Up to the failure, with some slack: without a fault the same failure may come later.
    let stop_at_ms = Some(v.at_ms + REPLAY_SLACK_MS);
    let replay = Config { faults: Some(faults.to_vec()), stop_at_ms, minimise: false, ..cfg.clone() };
    let mut sim = engine::Sim::new(replay)?;
    sim.run();
    Ok(sim.violation.as_ref().filter(|x| x.invariant == v.invariant).map(|_| std::mem::take(&mut sim.trace)))
}

/// How far past the original failure a replay may run and still count.
pub const REPLAY_SLACK_MS: u64 = 60_000;

/// The most replays one minimisation makes.
pub const MAX_REPLAYS: u32 = 64;

/// Keeps the prefix of faults up to the failure, then drops faults, in halves and then one
/// at a time, while the same invariant still breaks.
pub fn minimise(cfg: &Config, faults: &[Fault], v: &Violation) -> Result<Minimal, String> {
    let mut replays = 0;
    let mut cur: Vec<Fault> = faults.iter().filter(|f| f.at_ms <= v.at_ms).cloned().collect();
    replays += 1;
    let Some(mut trace) = reproduces(cfg, &cur, v)? else {
        // Not reproducible from the prefix alone: the full run is the shortest we know.
        return Ok(Minimal { faults: faults.to_vec(), trace: Vec::new(), replays });
    };
    let mut chunk = cur.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        while i < cur.len() && replays < MAX_REPLAYS {
            let end = (i + chunk).min(cur.len());
            let candidate: Vec<Fault> = cur[..i].iter().chain(&cur[end..]).cloned().collect();
            replays += 1;
            match reproduces(cfg, &candidate, v)? {
                Some(t) => {
                    cur = candidate;
                    trace = t;
                }
                None => i = end,
            }
        }
        if chunk == 1 || replays >= MAX_REPLAYS {
            break;
        }
        chunk = chunk.div_ceil(2);
    }
    Ok(Minimal { faults: cur, trace, replays })
}

/// How a failed run is shown: the seed, the invariant, and the minimal trace.
pub fn failure_text(cfg: &Config, o: &Outcome) -> String {
    let Some(v) = &o.violation else { return String::new() };
    let mut s = format!(
        "invariant {} broken at {} (seed {}, scenario {}): {}\n",
        v.invariant,
        config::fmt_time(v.at_ms),
        cfg.seed,
        cfg.scenario,
        v.detail
    );
    if o.minimal.is_none() {
        s.push_str(&format!(
            "trace ({} injected fault(s)):\n",
            o.faults.iter().filter(|f| f.at_ms <= v.at_ms).count()
        ));
        let tail = o.trace.len().saturating_sub(40);
        for line in &o.trace[tail..] {
            s.push_str(&format!("  {line}\n"));
        }
    }
    if let Some(m) = &o.minimal {
        s.push_str(&format!(
            "shortest reproducing trace: {} of {} injected fault(s) ({} replays):\n",
            m.faults.len(),
            o.faults.len(),
            m.replays
        ));
        for f in &m.faults {
            s.push_str(&format!("  inject {f}\n"));
        }
        let tail = m.trace.len().saturating_sub(40);
        if tail > 0 {
            s.push_str(&format!("  ... {tail} earlier events\n"));
        }
        for line in &m.trace[tail..] {
            s.push_str(&format!("  {line}\n"));
        }
    }
    s.push_str(&format!(
        "replay: mpsfleet sim --hosts {} --gpus-per-host {} --duration {}ms --seed {} --fault-rate {} --scenario {}\n",
        cfg.hosts, cfg.gpus_per_host, cfg.duration_ms, cfg.seed, cfg.fault_rate, cfg.scenario
    ));
    s
}

/// The wall clock, read only to report how long a run took.
#[allow(clippy::disallowed_methods)] // measuring the simulator itself, never the simulated time
fn wall_clock_ms() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checker that can fail: `cfg` (with its sabotage) breaks `invariant`, and the same run
    /// without the sabotage holds every invariant. Returns both runs for the caller's checks.
    fn breaks_then_holds(cfg: &Config, invariant: &str) -> (Outcome, Outcome) {
        assert!(cfg.sabotage.is_some(), "a run to break needs its sabotage");
        let broken = run(cfg).expect("runs");
        let v = broken
            .violation
            .as_ref()
            .unwrap_or_else(|| panic!("the checker misses {:?}: {}", cfg.sabotage, broken.report.render()));
        assert_eq!(v.invariant, invariant, "{}", v.detail);
        let held = run(&Config { sabotage: None, ..cfg.clone() }).expect("runs");
        assert!(held.violation.is_none(), "{:?}", held.violation);
        (broken, held)
    }

    /// The deliberately broken world (agents start MPS tasks without their daemon) is caught, reported with its seed, and minimised to a trace shorter than the run's.
    #[test]
    fn a_broken_invariant_is_caught_with_its_seed_and_a_short_trace() {
        let cfg = Config {
            hosts: 8,
            gpus_per_host: 2,
            duration_ms: 40 * 60_000,
            seed: 2,
            fault_rate: 0.05,
            scenario: Scenario::DaemonCrash,
            sabotage: Some(Sabotage::FailOpen),
            ..Config::default()
        };
        let (o, _) = breaks_then_holds(&cfg, "mps-fail-closed");
        let v = o.violation.as_ref().expect("broken");
        assert!(v.detail.contains("without its limits"), "{}", v.detail);
        // A run stopped early still reports its shortfall, and the causes add up to it.
        let r = &o.report;
        let parts: f64 = r.replica_hours_by_cause.values().sum();
        assert!(r.replica_hours_below_desired > 0.0, "{}", r.render());
        assert!((parts - r.replica_hours_below_desired).abs() < 0.005, "{}", r.render());
        let m = o.minimal.as_ref().expect("minimised");
        assert!(!m.faults.is_empty() && m.faults.len() < o.faults.len(), "{:?}", m.faults);
        // The run stops at the failure: a prefix of the 40 minutes, replayed from one fault.
        assert!(v.at_ms < cfg.duration_ms);
        assert!(m.trace.len() <= o.trace.len());
        assert!(m.faults.iter().all(|f| matches!(f.kind, FaultKind::DaemonCrash { .. })));
        let text = failure_text(&cfg, &o);
        assert!(text.contains("seed 2"), "{text}");
        assert!(
            text.contains(&format!(
                "shortest reproducing trace: {} of {} injected",
                m.faults.len(),
                o.faults.len()
            )),
            "{text}"
        );
    }

    /// A lost start (agents that take a service task's start and never run it) keeps its
    /// service below its count with room in its pool: `service-recovery` breaks, naming the
    /// service and the bound. The same run without the bug holds.
    #[test]
    fn a_service_kept_below_its_count_breaks_service_recovery() {
        let cfg = Config {
            hosts: 12,
            gpus_per_host: 2,
            duration_ms: 30 * 60_000,
            seed: 3,
            fault_rate: 0.5,
            scenario: Scenario::DaemonCrash,
            sabotage: Some(Sabotage::LoseServiceStarts),
            minimise: false,
            ..Config::default()
        };
        let (o, _) = breaks_then_holds(&cfg, "service-recovery");
        let v = o.violation.as_ref().expect("broken");
        assert!(v.detail.contains("below its desired count") && v.detail.contains("bound"), "{}", v.detail);
    }

    /// Agents that lose the stops the service scheduler asks for (`Sabotage::LoseSchedulerStops`)
    /// leave the server's first move of a replica unfinished for good: the rebalancer waits
    /// for it, and the hosts the fleet's first placements crowded (its tasks were placed as
    /// the first hosts turned ACTIVE) stay crowded. `service-spread` breaks after the pool's
    /// bound, naming the service and the host; the same run without the bug spreads its
    /// replicas and holds.
    #[test]
    fn replicas_kept_crowded_break_service_spread() {
        let cfg = Config {
            hosts: 12,
            gpus_per_host: 4,
            duration_ms: 15 * 60_000,
            seed: 1,
            fault_rate: 0.0,
            scenario: Scenario::Steady,
            sabotage: Some(Sabotage::LoseSchedulerStops),
            minimise: false,
            ..Config::default()
        };
        let (o, ok) = breaks_then_holds(&cfg, "service-spread");
        let v = o.violation.as_ref().expect("broken");
        assert!(
            v.detail.contains("service gpu-infer keeps") && v.detail.contains("hosts with room"),
            "{}",
            v.detail
        );
        // Timed from the first resync after the warm-up, and broken once past the bound.
        let bound = o.report.spread.bound_ms;
        assert!(v.at_ms > config::WARMUP_MS + bound && v.at_ms <= config::WARMUP_MS + bound + 5_000, "{v:?}");
        assert!(
            o.trace.iter().any(|l| l.contains("service gpu-infer crowded on")),
            "no crowding in the trace"
        );
        assert_eq!(ok.report.spread.longest_ms, 0, "{}", ok.report.render());
    }
}
