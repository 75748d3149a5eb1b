//! What a run is made of: the fleet, the scenario, and the injected faults it plans from the
//! seed.

use crate::rng::Rng;
use std::fmt;

/// The ready-made situations a run can play.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// No faults: the fleet comes up, services reach their count and stay there.
    Steady,
    /// MPS control daemons die: most come back with a local restart, some never do.
    DaemonCrash,
    /// Daemons stop answering (probes time out): some recover on restart, one never does.
    Hang,
    /// An MPS server goes to FAULT: its clients exit (or one is stuck and keeps it there).
    ServerFault,
    /// A GPU reports an Xid error: its `GPU` check turns IMPAIRED for good.
    Xid,
    /// Agents lose the control plane for a while (heartbeats and reports stop), then come back.
    Partition,
    /// Hosts vanish and are never heard from again.
    Vanish,
    /// The capacity provider is slow and fails often while daemons die for good.
    ProviderFlaky,
    /// A bad driver rollout takes out a third of the managed pool at once.
    DriverRollout,
    /// The control plane restarts (reloads from its store) in the middle of incidents.
    ControlPlaneRestart,
    /// Every fault kind at `fault_rate`, plus a control-plane restart every six hours.
    Mixed,
    /// One managed pool (preemption `recovery`) filled to its MPS memory by high-priority and
    /// low-priority services; daemons die for good on a few hosts, so the high-priority
    /// replicas they held can only come back by preempting low-priority ones until the
    /// replacement hosts join.
    FullPool,
}

impl Scenario {
    pub const ALL: [Scenario; 12] = [
        Scenario::Steady,
        Scenario::DaemonCrash,
        Scenario::Hang,
        Scenario::ServerFault,
        Scenario::Xid,
        Scenario::Partition,
        Scenario::Vanish,
        Scenario::ProviderFlaky,
        Scenario::DriverRollout,
        Scenario::ControlPlaneRestart,
        Scenario::Mixed,
        Scenario::FullPool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Steady => "steady",
            Scenario::DaemonCrash => "daemon-crash",
            Scenario::Hang => "hang",
            Scenario::ServerFault => "server-fault",
            Scenario::Xid => "xid",
            Scenario::Partition => "partition",
            Scenario::Vanish => "vanish",
            Scenario::ProviderFlaky => "provider-flaky",
            Scenario::DriverRollout => "driver-rollout",
            Scenario::ControlPlaneRestart => "control-plane-restart",
            Scenario::Mixed => "mixed",
            Scenario::FullPool => "full-pool",
        }
    }

    pub fn parse(s: &str) -> Result<Scenario, String> {
        Scenario::ALL.into_iter().find(|x| x.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Scenario::ALL.iter().map(|x| x.name()).collect();
            format!("unknown scenario {s:?}; one of {}", names.join(", "))
        })
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One injected fault. Host faults name a slot: initial host `k` of the fleet and, after it is
/// replaced, its replacement (so the fault rate stays per host as the fleet turns over).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub at_ms: u64,
    pub slot: u32,
    pub kind: FaultKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The GPU's control daemon exits; `for_good`: it can never be started again.
    DaemonCrash { gpu: u32, for_good: bool },
    /// The daemon stops answering (SIGSTOP-like); `for_good`: a restarted one hangs too.
    DaemonHang { gpu: u32, for_good: bool },
    /// The GPU's MPS server goes to FAULT; its clients exit unless one is stuck.
    ServerFault { gpu: u32, stuck_client: bool },
    /// An Xid error: the GPU is unusable and its `GPU` check IMPAIRED.
    GpuXid { gpu: u32 },
    /// The agent cannot reach the control plane for `for_ms`.
    Partition { for_ms: u64 },
    /// The host is gone and never heard from again.
    Vanish,
    /// One host of a bad driver rollout: every daemon of the host dies for good.
    BadDriver,
    /// The control plane restarts (the slot is ignored).
    ControlPlaneRestart,
    /// The capacity provider fails `fail_percent`% of calls and is `extra_delay_ms` slower,
    /// for `for_ms` (the slot is ignored).
    ProviderDegraded { fail_percent: u32, extra_delay_ms: u64, for_ms: u64 },
}

impl FaultKind {
    /// The cause an incident is filed under when this fault was on its host.
    pub fn cause(&self) -> &'static str {
        match self {
            FaultKind::DaemonCrash { for_good: false, .. } => "daemon-crash",
            FaultKind::DaemonCrash { for_good: true, .. } => "daemon-crash-for-good",
            FaultKind::DaemonHang { for_good: false, .. } => "daemon-hang",
            FaultKind::DaemonHang { for_good: true, .. } => "daemon-hang-for-good",
            FaultKind::ServerFault { stuck_client: false, .. } => "server-fault",
            FaultKind::ServerFault { stuck_client: true, .. } => "server-fault-stuck",
            FaultKind::GpuXid { .. } => "gpu-xid",
            FaultKind::Partition { .. } => "partition",
            FaultKind::Vanish => "vanish",
            FaultKind::BadDriver => "bad-driver",
            FaultKind::ControlPlaneRestart => "control-plane-restart",
            FaultKind::ProviderDegraded { .. } => "provider-degraded",
        }
    }

    /// Faults of the whole system rather than of one host.
    pub fn is_global(&self) -> bool {
        matches!(self, FaultKind::ControlPlaneRestart | FaultKind::ProviderDegraded { .. })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", fmt_time(self.at_ms), self.kind.cause())?;
        match &self.kind {
            FaultKind::DaemonCrash { gpu, .. }
            | FaultKind::DaemonHang { gpu, .. }
            | FaultKind::ServerFault { gpu, .. }
            | FaultKind::GpuXid { gpu } => write!(f, " slot {} gpu {gpu}", self.slot),
            FaultKind::Partition { for_ms } => write!(f, " slot {} for {}", self.slot, fmt_time(*for_ms)),
            FaultKind::Vanish | FaultKind::BadDriver => write!(f, " slot {}", self.slot),
            FaultKind::ControlPlaneRestart => Ok(()),
            FaultKind::ProviderDegraded { fail_percent, extra_delay_ms, for_ms } => write!(
                f,
                " {fail_percent}% failures, +{} per call, for {}",
                fmt_time(*extra_delay_ms),
                fmt_time(*for_ms)
            ),
        }
    }
}

/// `HH:MM:SS.mmm` of virtual time.
pub fn fmt_time(ms: u64) -> String {
    format!("{:02}:{:02}:{:02}.{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

/// Parses `24h`, `90m`, `30s`, `1500ms` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}: expected e.g. 24h, 90m, 30s"))?;
    let mult = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("bad duration {s:?}: unit must be ms, s, m, h or d")),
    };
    Ok(n * mult)
}

/// How the simulated capacity provider behaves when no fault degrades it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderModel {
    /// How long a launch call takes, then how long the new host takes to register.
    pub launch_ms: (u64, u64),
    pub boot_ms: (u64, u64),
    pub terminate_ms: (u64, u64),
    /// Chance that one call fails (after its delay).
    pub failure_probability: f64,
}

impl Default for ProviderModel {
    fn default() -> Self {
        ProviderModel {
            launch_ms: (20_000, 60_000),
            boot_ms: (10_000, 30_000),
            terminate_ms: (5_000, 30_000),
            failure_probability: 0.0,
        }
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Config {
    pub hosts: u32,
    pub gpus_per_host: u32,
    pub duration_ms: u64,
    pub seed: u64,
    /// Random host faults per host per virtual hour, of the kinds the scenario uses.
    pub fault_rate: f64,
    pub scenario: Scenario,
    /// How often agents heartbeat; the agent's own default, 1s, unless a run trades fidelity
    /// for speed (anything within the 10s grace keeps hosts healthy).
    pub heartbeat_ms: u64,
    pub provider: ProviderModel,
    /// The managed pool's `provider.launchTimeoutSeconds`: by default longer than the slowest
    /// launch and boot of [`ProviderModel`], so that a replacement fails only when the
    /// provider does.
    pub launch_timeout_seconds: u32,
    /// The share of the managed pool a `driver-rollout` takes out.
    pub rollout_percent: u32,
    /// The pools' `preemption`; None: `recovery` for `full-pool` (said), the server's default
    /// otherwise. `off` shows what a full pool does without it.
    pub preemption: Option<mpsfleet_types::Preemption>,
    /// Replay exactly these faults instead of planning them from the seed.
    pub faults: Option<Vec<Fault>>,
    /// Stop the run at this virtual time (a replayed prefix).
    pub stop_at_ms: Option<u64>,
    /// Look for the shortest reproducing trace when an invariant breaks.
    pub minimise: bool,
    /// Test builds only (`cfg(test)` or the `broken-invariant` feature): a deliberate bug in
    /// the simulated agents, which the checker must catch.
    pub sabotage: Option<Sabotage>,
}

/// A deliberate bug in the simulated agents, for the tests that show an invariant can fail.
/// Ignored outside test builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// Agents start MPS tasks without checking that the GPU's daemon answers (fail open):
    /// breaks `mps-fail-closed`.
    FailOpen,
    /// Once the first fault is in, agents take a service task's start and never start it (a
    /// lost start): its service stays below its count, which breaks `service-recovery`.
    LoseServiceStarts,
    /// Agents lose every stop the service scheduler asks for (a replica moved to spread its
    /// service, an extra copy) and go on running the task: the first move never completes,
    /// the rebalancer waits for it for good, and the hosts the fleet's first placements
    /// crowded stay crowded, which breaks `service-spread`.
    LoseSchedulerStops,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hosts: 30,
            gpus_per_host: 8,
            duration_ms: 3_600_000,
            seed: 1,
            fault_rate: 0.01,
            scenario: Scenario::Steady,
            heartbeat_ms: 1_000,
            provider: ProviderModel::default(),
            launch_timeout_seconds: 120,
            rollout_percent: 33,
            preemption: None,
            faults: None,
            stop_at_ms: None,
            minimise: true,
            sabotage: None,
        }
    }
}

impl Config {
    /// The managed and the self-managed pool's sizes: [`pool_sizes`], except that `full-pool`
    /// puts every host in the managed pool (it measures one pool's preemption).
    pub fn pools(&self) -> (u32, u32) {
        if self.scenario == Scenario::FullPool {
            (self.hosts, 0)
        } else {
            pool_sizes(self.hosts)
        }
    }
}

/// When scripted faults start: the fleet has settled by then.
pub const WARMUP_MS: u64 = 10 * 60_000;

/// When the scripted and random faults start: at the end of the warm-up, or a quarter into a
/// shorter run.
pub fn faults_start_ms(cfg: &Config) -> u64 {
    WARMUP_MS.min(cfg.duration_ms / 4)
}

/// The managed pool and the self-managed pool: two thirds of the hosts are managed.
pub fn pool_sizes(hosts: u32) -> (u32, u32) {
    if hosts < 3 {
        return (hosts, 0);
    }
    let managed = (hosts * 2).div_ceil(3);
    (managed, hosts - managed)
}

/// The faults of a run, planned from the seed: the scenario's scripted ones, then random host
/// faults at `fault_rate`, in time order.
pub fn plan_faults(cfg: &Config) -> Vec<Fault> {
    let (managed, _) = cfg.pools();
    let gpus = cfg.gpus_per_host.max(1);
    let t0 = faults_start_ms(cfg);
    let mut out = Vec::new();
    let mut at = |at_ms: u64, slot: u32, kind: FaultKind| out.push(Fault { at_ms, slot, kind });
    // Scripted faults hit managed slots from the front and self-managed slots from the back.
    let last = cfg.hosts.saturating_sub(1);
    match cfg.scenario {
        Scenario::Steady | Scenario::Mixed => {}
        Scenario::DaemonCrash => {
            at(t0, 0, FaultKind::DaemonCrash { gpu: 0, for_good: true });
            at(t0 + 60_000, 1, FaultKind::DaemonCrash { gpu: 1, for_good: false });
            at(t0 + 120_000, 2, FaultKind::DaemonCrash { gpu: 0, for_good: false });
            at(t0 + 180_000, last, FaultKind::DaemonCrash { gpu: 0, for_good: true });
        }
        Scenario::Hang => {
            at(t0, 0, FaultKind::DaemonHang { gpu: 0, for_good: false });
            at(t0 + 60_000, 1, FaultKind::DaemonHang { gpu: 2, for_good: true });
            at(t0 + 120_000, last, FaultKind::DaemonHang { gpu: 0, for_good: true });
        }
        Scenario::ServerFault => {
            at(t0, 0, FaultKind::ServerFault { gpu: 0, stuck_client: false });
            at(t0 + 60_000, 1, FaultKind::ServerFault { gpu: 0, stuck_client: true });
        }
        Scenario::Xid => {
            at(t0, 0, FaultKind::GpuXid { gpu: 0 });
            at(t0 + 60_000, last, FaultKind::GpuXid { gpu: 1 });
        }
        Scenario::Partition => {
            at(t0, 0, FaultKind::Partition { for_ms: 5_000 });
            at(t0 + 60_000, 1, FaultKind::Partition { for_ms: 600_000 });
            at(t0 + 120_000, last, FaultKind::Partition { for_ms: 300_000 });
        }
        Scenario::Vanish => {
            at(t0, 0, FaultKind::Vanish);
            at(t0 + 400_000, 1, FaultKind::Vanish);
            at(t0 + 60_000, last, FaultKind::Vanish);
        }
        Scenario::ProviderFlaky => {
            let for_ms = cfg.duration_ms;
            at(t0 - 1, 0, FaultKind::ProviderDegraded { fail_percent: 70, extra_delay_ms: 60_000, for_ms });
            for s in 0..3.min(managed) {
                at(t0 + u64::from(s) * 30_000, s, FaultKind::DaemonCrash { gpu: 0, for_good: true });
            }
        }
        Scenario::DriverRollout => {
            // `rollout_percent` of the managed pool at the same instant.
            for s in 0..(managed * cfg.rollout_percent).div_ceil(100).min(managed) {
                at(t0, s, FaultKind::BadDriver);
            }
        }
        Scenario::ControlPlaneRestart => {
            at(t0, 0, FaultKind::DaemonCrash { gpu: 0, for_good: true });
            at(t0 + 20_000, 0, FaultKind::ControlPlaneRestart);
            at(t0 + 60_000, 1, FaultKind::Partition { for_ms: 900_000 });
            at(t0 + 75_000, 0, FaultKind::ControlPlaneRestart);
            at(t0 + 95_000, 0, FaultKind::ControlPlaneRestart);
            at(t0 + 200_000, last, FaultKind::DaemonCrash { gpu: 0, for_good: true });
            at(t0 + 215_000, 0, FaultKind::ControlPlaneRestart);
        }
        Scenario::FullPool => {
            // Two hosts 20 s apart lose one GPU's daemon for good (their replacements
            // overlap); once the pool is whole again a third loses every daemon at once.
            at(t0, 0, FaultKind::DaemonCrash { gpu: 0, for_good: true });
            at(t0 + 20_000, 1.min(last), FaultKind::DaemonCrash { gpu: 1.min(gpus - 1), for_good: true });
            at(t0 + 300_000, 2.min(last), FaultKind::BadDriver);
        }
    }
    if cfg.scenario == Scenario::Mixed {
        let mut t = 6 * 3_600_000;
        while t < cfg.duration_ms {
            at(t, 0, FaultKind::ControlPlaneRestart);
            t += 6 * 3_600_000;
        }
    }
    // Random host faults: a Poisson process per host at `fault_rate` per hour.
    if cfg.scenario != Scenario::Steady && cfg.fault_rate > 0.0 {
        let mean_gap = 3_600_000.0 / cfg.fault_rate;
        for slot in 0..cfg.hosts {
            let mut r = Rng::fork(cfg.seed, &format!("faults/{slot}"));
            let mut t = t0 as f64;
            loop {
                t += r.exp(mean_gap);
                if t >= cfg.duration_ms as f64 {
                    break;
                }
                let kind = random_kind(cfg.scenario, &mut r, gpus);
                at(t as u64, slot, kind);
            }
        }
    }
    out.sort_by_key(|f| (f.at_ms, f.slot));
    out
}

/// A random host fault of the scenario's kind (`mixed`: any kind).
fn random_kind(scenario: Scenario, r: &mut Rng, gpus: u32) -> FaultKind {
    let gpu = r.range(0, u64::from(gpus - 1)) as u32;
    let pick = match scenario {
        Scenario::DaemonCrash
        | Scenario::ProviderFlaky
        | Scenario::ControlPlaneRestart
        | Scenario::FullPool => {
            if r.chance(0.8) {
                0
            } else {
                1
            }
        }
        Scenario::Hang => 2,
        Scenario::ServerFault => 3,
        Scenario::Xid => 4,
        Scenario::Partition => 5,
        Scenario::Vanish => 6,
        Scenario::DriverRollout => 1,
        Scenario::Steady | Scenario::Mixed => {
            let x = r.unit();
            // Recoverable crashes dominate; the others are rarer, as in the field.
            [0.55, 0.65, 0.75, 0.82, 0.87, 0.95, 1.0].iter().position(|&c| x < c).unwrap_or(0)
        }
    };
    match pick {
        0 => FaultKind::DaemonCrash { gpu, for_good: false },
        1 => FaultKind::DaemonCrash { gpu, for_good: true },
        2 => FaultKind::DaemonHang { gpu, for_good: r.chance(0.3) },
        3 => FaultKind::ServerFault { gpu, stuck_client: r.chance(0.3) },
        4 => FaultKind::GpuXid { gpu },
        5 => FaultKind::Partition { for_ms: r.range(5_000, 900_000) },
        _ => FaultKind::Vanish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("24h"), Ok(86_400_000));
        assert_eq!(parse_duration("90m"), Ok(5_400_000));
        assert_eq!(parse_duration("1500ms"), Ok(1_500));
        assert_eq!(parse_duration("7"), Ok(7_000));
        assert!(parse_duration("7y").is_err());
        assert_eq!(fmt_time(3_723_004), "01:02:03.004");
    }

    #[test]
    fn fault_plan_is_a_function_of_the_seed() {
        let cfg = Config { scenario: Scenario::Mixed, fault_rate: 0.5, ..Config::default() };
        assert_eq!(plan_faults(&cfg), plan_faults(&cfg));
        let other = Config { seed: 2, ..cfg.clone() };
        assert_ne!(plan_faults(&cfg), plan_faults(&other));
        assert!(plan_faults(&cfg).windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }
}
