//! What a run counts while it goes, and the report it prints at the end.

use crate::config::{fmt_time, Config};
use crate::invariants::Violation;
use mpsfleet_types::{Incident, IncidentState, Step};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Why a desired service replica is not running: every replica-second below desired after
/// the warm-up is counted under one of these (see [`crate::engine`]'s classification).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shortfall {
    /// Its task is on a host of a self-managed pool with an open incident: nothing moves it
    /// until the operator acts.
    OperatorHold,
    /// Its task is on a host whose incident is BLOCKED (storm breaker, replacement rate limit,
    /// failed provider call).
    RemediationBlocked,
    /// Its task is on a bad host of a fenced service: no replacement until the old host is
    /// terminated.
    FencedTermination,
    /// Its task is on a bad host being drained or replaced (restart boundary).
    OnBadHost,
    /// Its task is on a host that has vanished or lost the control plane, not yet declared bad.
    HostUnreachable,
    /// Its task waits for placement and no host in the pool has room, while a replacement
    /// host is being launched or is joining.
    ReplacementHost,
    /// Its task waits for placement and no host in the pool has room.
    NoCapacity,
    /// Its task waits for placement although a healthy host in the pool has room.
    UnplacedWithRoom,
    /// Its task is placed and starting (assignment on its way, process starting).
    Starting,
    /// No task exists for it: its service's tasks failed too fast, and replacing them waits.
    CrashLoopHoldBack,
    /// Anything else (a replacement not created yet outside a crash loop, a report in flight).
    Other,
}

impl Shortfall {
    pub const ALL: [Shortfall; 11] = [
        Shortfall::OperatorHold,
        Shortfall::RemediationBlocked,
        Shortfall::FencedTermination,
        Shortfall::OnBadHost,
        Shortfall::HostUnreachable,
        Shortfall::ReplacementHost,
        Shortfall::NoCapacity,
        Shortfall::UnplacedWithRoom,
        Shortfall::Starting,
        Shortfall::CrashLoopHoldBack,
        Shortfall::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Shortfall::OperatorHold => "operator-hold",
            Shortfall::RemediationBlocked => "remediation-blocked",
            Shortfall::FencedTermination => "fenced-termination",
            Shortfall::OnBadHost => "on-bad-host",
            Shortfall::HostUnreachable => "host-unreachable",
            Shortfall::ReplacementHost => "replacement-host",
            Shortfall::NoCapacity => "no-capacity",
            Shortfall::UnplacedWithRoom => "unplaced-with-room",
            Shortfall::Starting => "starting",
            Shortfall::CrashLoopHoldBack => "crash-loop-hold-back",
            Shortfall::Other => "other",
        }
    }

    /// What the report says about it.
    pub fn describe(self) -> &'static str {
        match self {
            Shortfall::OperatorHold => "self-managed host held for the operator",
            Shortfall::RemediationBlocked => "incident blocked (storm breaker, rate limit, provider)",
            Shortfall::FencedTermination => "fenced: waiting for the old host's termination",
            Shortfall::OnBadHost => "on a bad host being drained or replaced",
            Shortfall::HostUnreachable => "on an unreachable host, not yet declared bad",
            Shortfall::ReplacementHost => "no room; replacement host launching or joining",
            Shortfall::NoCapacity => "no room in the pool",
            Shortfall::UnplacedWithRoom => "unplaced although the pool has room",
            Shortfall::Starting => "placed, starting",
            Shortfall::CrashLoopHoldBack => "crash-loop hold-back",
            Shortfall::Other => "other or unknown",
        }
    }
}

/// One incident as the simulator saw it open, and how it ended.
#[derive(Debug, Clone, Default)]
struct IncStat {
    cause: &'static str,
    onset_ms: Option<u64>,
    opened_ms: u64,
    recover_ms: Option<u64>,
    state: &'static str,
    replacement_requested: bool,
    host_terminated: bool,
    breaker: bool,
}

/// Counters kept during a run.
#[derive(Debug, Default)]
pub struct Stats {
    pub faults: BTreeMap<&'static str, u64>,
    pub heartbeats: u64,
    pub reports: u64,
    pub rejected_reports: u64,
    pub server_errors: u64,
    pub provider_launches: u64,
    pub provider_terminations: u64,
    pub provider_failures: u64,
    pub provider_attempts_failed: u64,
    pub control_plane_restarts: u64,
    pub tasks_killed: u64,
    pub fail_closed: u64,
    pub incident_ties: u64,
    /// Recovery bounds breached, by phase and cause (`unexplained` without one).
    pub breaches: BTreeMap<String, u64>,
    pub work_lost_ms: u128,
    pub deficit_ms: u128,
    /// `deficit_ms` by cause; the parts add up to it.
    pub shortfall_ms: BTreeMap<Shortfall, u128>,
    pub replicas_running_at_end: u32,
    pub replicas_desired: u32,
    pub services_at_end: Vec<(String, u32, u32)>,
    /// (pool, ACTIVE hosts, hosts not DEREGISTERED, incidents BLOCKED)
    pub pools_at_end: Vec<(String, usize, usize, usize)>,
    /// `service-spread`: hosts seen crowded, the longest one stayed so while timed, and the
    /// largest pool bound.
    pub spread: SpreadStats,
    /// By incident id (the server's, random): only ever read in an order of our own.
    incidents: BTreeMap<String, IncStat>,
    /// Replicas struck by a fault while in rotation: how long each stayed in it (`engine/traffic.rs`).
    rotation: RotationStats,
    /// What preemption did (`engine/preempt.rs`).
    pub preemption: PreemptionStats,
}

/// What preemption did, as the world saw it (`engine/preempt.rs` says how it is counted).
#[derive(Debug, Default)]
pub struct PreemptionStats {
    /// Victims stopped to make room for a higher-priority task.
    pub preemptions: u64,
    /// High-priority (70 and above) services: from a replica's loss once faults start to the
    /// service running one more again, each.
    pub high_recovery_ms: Vec<u64>,
    /// Such losses not back by the end.
    pub high_not_back: u64,
    /// Victims' services: from each victim's stop until its service ran one more again (or
    /// the end), summed.
    pub preempted_lost_ms: u128,
    pub victims_back: u64,
    pub victims_not_back: u64,
    /// The bound a high-priority replica's recovery in a full pool is held to
    /// (`engine::full_pool_bound_ms`).
    pub bound_ms: u64,
}

/// What the traffic model saw: each struck replica's time in rotation after its fault, and
/// the requests it was sent meanwhile.
#[derive(Debug, Default)]
struct RotationStats {
    ms: Vec<u64>,
    /// Still in rotation when the run ended.
    never_out: u64,
    /// Requests sent to replicas that could not answer, at the model's rate (thousandths).
    failed_milli: u128,
}

impl Stats {
    pub fn breach(&mut self, phase: &str, cause: &str) {
        *self.breaches.entry(format!("{phase} {cause}")).or_default() += 1;
    }

    /// A replica struck by a fault stayed in rotation `ms` after it (`never_out`: until the
    /// end of the run), one of its service's `replicas`.
    pub fn out_of_rotation(&mut self, ms: u64, replicas: u32, never_out: bool) {
        self.rotation.ms.push(ms);
        self.rotation.never_out += u64::from(never_out);
        let rate = u128::from(crate::engine::REQUESTS_PER_SECOND);
        self.rotation.failed_milli += u128::from(ms) * rate / u128::from(replicas.max(1));
    }

    pub fn fault(&mut self, cause: &'static str) {
        *self.faults.entry(cause).or_default() += 1;
    }

    pub fn incident_opened(
        &mut self,
        id: &str,
        cause: &'static str,
        onset: Option<u64>,
        opened: u64,
        _label: String,
    ) {
        self.incidents.insert(
            id.to_string(),
            IncStat { cause, onset_ms: onset, opened_ms: opened, state: "OPEN", ..IncStat::default() },
        );
    }

    pub fn incident_final(&mut self, id: &str, i: &Incident) {
        let Some(s) = self.incidents.get_mut(id) else { return };
        s.state = i.state.as_str();
        s.recover_ms = if i.state == IncidentState::Resolved { i.durations().recover_ms } else { None };
        s.replacement_requested = i.has(Step::ReplacementRequested);
        s.host_terminated = i.has(Step::OldHostTerminated);
        s.breaker = i.timeline.iter().any(|e| e.step == Step::Blocked && e.detail.contains("storm breaker"));
    }
}

/// How crowded hosts fared against `service-spread` (docs/sim.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpreadStats {
    /// A service seen over ceil(replicas / hosts with room) on a host, counted once per spell.
    pub crowded: u64,
    /// The longest such spell, timed from when capacity came back.
    pub longest_ms: u64,
    pub bound_ms: u64,
}

/// Median and 99th percentile, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Percentiles {
    pub count: usize,
    pub median_ms: Option<u64>,
    pub p99_ms: Option<u64>,
}

fn percentiles(mut v: Vec<u64>) -> Percentiles {
    v.sort_unstable();
    let at = |q: f64| -> Option<u64> {
        if v.is_empty() {
            return None;
        }
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
        Some(v[i])
    };
    Percentiles { count: v.len(), median_ms: at(0.5), p99_ms: at(0.99) }
}

/// What preemption did and what it cost: shown for `full-pool`, and for any run that
/// preempted.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionReport {
    /// Victims stopped to make room for a higher-priority task.
    pub preemptions: u64,
    /// High-priority (70 and above) services' replicas: from a replica's loss (its process
    /// ended, leaving the service below its count) to the service running one more again,
    /// losses and returns paired first in, first out per service; losses once faults start.
    pub high_recovery: Percentiles,
    pub high_recovery_max_ms: u64,
    /// Such losses the run ended before the service made good.
    pub high_not_back: u64,
    /// Preempted work: for every victim, from its process's stop until its service ran one
    /// more replica again (paired as above), or until the end of the run; in task-hours.
    pub preempted_task_hours_lost: f64,
    pub victims_not_back: u64,
    /// The full-pool recovery bound the high-priority recovery times are held to by the
    /// `full-pool` test: detect + decide + victim stop + incident pass + tick + start.
    pub bound_ms: u64,
}

/// The outcome of a run. Everything here is a function of the configuration and the seed;
/// the wall time is kept apart ([`crate::Outcome::wall_ms`]).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub scenario: String,
    pub seed: u64,
    pub hosts: u32,
    pub gpus_per_host: u32,
    pub duration_ms: u64,
    pub fault_rate: f64,
    pub heartbeat_ms: u64,
    pub steps: u64,
    pub faults_injected: BTreeMap<String, u64>,
    pub incidents: usize,
    pub incidents_by_cause: BTreeMap<String, u64>,
    pub incidents_by_state: BTreeMap<String, u64>,
    /// Incidents opened in the same millisecond as another of their pool (ranked by their
    /// hosts' registration order).
    pub incident_ties: u64,
    /// Recovery bounds breached, by `phase cause` (`unexplained` without a cause).
    pub bound_breaches: BTreeMap<String, u64>,
    /// From the injected fault to the incident opening.
    pub time_to_detect: Percentiles,
    /// From DETECTED to TASKS_RUNNING_AGAIN (or RESOLVED), resolved incidents.
    pub time_to_recover: Percentiles,
    /// Progress of tasks killed by failures or moved off bad hosts (they start again).
    pub task_hours_lost: f64,
    /// Service replicas missing after the warm-up, integrated over time.
    pub replica_hours_below_desired: f64,
    /// The same, by cause ([`Shortfall::as_str`]); causes that never occurred are left out.
    pub replica_hours_by_cause: BTreeMap<String, f64>,
    pub replacements_requested: u64,
    pub hosts_terminated: u64,
    pub breaker_trips: u64,
    pub provider_launches: u64,
    /// Calls that failed after all their attempts, and attempts that failed.
    pub provider_failures: u64,
    pub provider_attempts_failed: u64,
    pub control_plane_restarts: u64,
    pub tasks_killed: u64,
    pub fail_closed_starts: u64,
    pub heartbeats: u64,
    pub task_reports: u64,
    pub rejected_reports: u64,
    pub server_errors: u64,
    pub replicas_running_at_end: u32,
    pub replicas_desired: u32,
    pub services_at_end: Vec<(String, u32, u32)>,
    pub pools_at_end: Vec<(String, usize, usize, usize)>,
    pub spread: SpreadStats,
    /// Replicas a fault stopped from serving: from the fault to out of rotation (what a load
    /// balancer reading the server's DNS keeps sending them), and the requests that fail
    /// meanwhile at the model's rate, without retries.
    pub out_of_rotation: Percentiles,
    pub out_of_rotation_max_ms: u64,
    pub never_out_of_rotation: u64,
    pub requests_failed: u64,
    pub preemption: PreemptionReport,
    pub invariant_checks: u64,
    pub violation: Option<String>,
}

impl Report {
    pub fn build(
        cfg: &Config,
        stats: &Stats,
        checks: u64,
        steps: u64,
        violation: Option<&Violation>,
    ) -> Report {
        let mut by_cause: BTreeMap<String, u64> = BTreeMap::new();
        let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
        let mut detect = Vec::new();
        let mut recover = Vec::new();
        let (mut replacements, mut terminated, mut breaker) = (0, 0, 0);
        for s in stats.incidents.values() {
            *by_cause.entry(s.cause.to_string()).or_default() += 1;
            *by_state.entry(s.state.to_string()).or_default() += 1;
            if let Some(onset) = s.onset_ms {
                detect.push(s.opened_ms.saturating_sub(onset));
            }
            if let Some(r) = s.recover_ms {
                recover.push(r);
            }
            replacements += u64::from(s.replacement_requested);
            terminated += u64::from(s.host_terminated);
            breaker += u64::from(s.breaker);
        }
        Report {
            scenario: cfg.scenario.name().to_string(),
            seed: cfg.seed,
            hosts: cfg.hosts,
            gpus_per_host: cfg.gpus_per_host,
            duration_ms: cfg.duration_ms,
            fault_rate: cfg.fault_rate,
            heartbeat_ms: cfg.heartbeat_ms,
            steps,
            faults_injected: stats.faults.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            incidents: stats.incidents.len(),
            incidents_by_cause: by_cause,
            incidents_by_state: by_state,
            incident_ties: stats.incident_ties,
            bound_breaches: stats.breaches.clone(),
            time_to_detect: percentiles(detect),
            time_to_recover: percentiles(recover),
            task_hours_lost: hours(stats.work_lost_ms),
            replica_hours_below_desired: hours(stats.deficit_ms),
            replica_hours_by_cause: stats
                .shortfall_ms
                .iter()
                .filter(|(_, &ms)| ms > 0)
                .map(|(c, &ms)| (c.as_str().to_string(), hours(ms)))
                .collect(),
            replacements_requested: replacements,
            hosts_terminated: terminated,
            breaker_trips: breaker,
            provider_launches: stats.provider_launches,
            provider_failures: stats.provider_failures,
            provider_attempts_failed: stats.provider_attempts_failed,
            control_plane_restarts: stats.control_plane_restarts,
            tasks_killed: stats.tasks_killed,
            fail_closed_starts: stats.fail_closed,
            heartbeats: stats.heartbeats,
            task_reports: stats.reports,
            rejected_reports: stats.rejected_reports,
            server_errors: stats.server_errors,
            replicas_running_at_end: stats.replicas_running_at_end,
            replicas_desired: stats.replicas_desired,
            services_at_end: stats.services_at_end.clone(),
            pools_at_end: stats.pools_at_end.clone(),
            spread: stats.spread,
            out_of_rotation: percentiles(stats.rotation.ms.clone()),
            out_of_rotation_max_ms: stats.rotation.ms.iter().copied().max().unwrap_or(0),
            never_out_of_rotation: stats.rotation.never_out,
            requests_failed: (stats.rotation.failed_milli / 1000) as u64,
            preemption: PreemptionReport {
                preemptions: stats.preemption.preemptions,
                high_recovery: percentiles(stats.preemption.high_recovery_ms.clone()),
                high_recovery_max_ms: stats.preemption.high_recovery_ms.iter().copied().max().unwrap_or(0),
                high_not_back: stats.preemption.high_not_back,
                preempted_task_hours_lost: hours(stats.preemption.preempted_lost_ms),
                victims_not_back: stats.preemption.victims_not_back,
                bound_ms: stats.preemption.bound_ms,
            },
            invariant_checks: checks,
            violation: violation.map(|v| format!("{} at {}: {}", v.invariant, fmt_time(v.at_ms), v.detail)),
        }
    }

    /// The human report (every line a function of the seed and the configuration).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let ms = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |x| format!("{:.1}s", x as f64 / 1000.0));
        let _ = writeln!(
            s,
            "scenario {}  seed {}  hosts {} x {} GPUs  duration {}  fault rate {}/host/h  heartbeat {}ms",
            self.scenario,
            self.seed,
            self.hosts,
            self.gpus_per_host,
            fmt_time(self.duration_ms),
            self.fault_rate,
            self.heartbeat_ms
        );
        let list = |m: &BTreeMap<String, u64>| {
            if m.is_empty() {
                "none".to_string()
            } else {
                m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
            }
        };
        let _ = writeln!(s, "faults injected:      {}", list(&self.faults_injected));
        let _ = writeln!(s, "incidents:            {} ({})", self.incidents, list(&self.incidents_by_state));
        let _ = writeln!(s, "  by cause:           {}", list(&self.incidents_by_cause));
        if self.incident_ties > 0 {
            let _ = writeln!(
                s,
                "  same-ms openings:   {} (ranked by host registration order)",
                self.incident_ties
            );
        }
        let _ = writeln!(s, "bound breaches:       {}", list(&self.bound_breaches));
        let _ = writeln!(
            s,
            "time to detect:       median {}  p99 {}  (n={})",
            ms(self.time_to_detect.median_ms),
            ms(self.time_to_detect.p99_ms),
            self.time_to_detect.count
        );
        let _ = writeln!(
            s,
            "time to recover:      median {}  p99 {}  (n={})",
            ms(self.time_to_recover.median_ms),
            ms(self.time_to_recover.p99_ms),
            self.time_to_recover.count
        );
        let _ = writeln!(
            s,
            "task-hours lost:      {:.2} of work killed, {:.2} replica-hours below desired",
            self.task_hours_lost, self.replica_hours_below_desired
        );
        for c in Shortfall::ALL {
            if let Some(h) = self.replica_hours_by_cause.get(c.as_str()) {
                let _ = writeln!(s, "  {:<20} {h:>9.2} replica-hours  {}", c.as_str(), c.describe());
            }
        }
        let _ = writeln!(
            s,
            "replacements:         {} requested, {} old hosts terminated, {} provider launches ({} calls failed, {} attempts)",
            self.replacements_requested,
            self.hosts_terminated,
            self.provider_launches,
            self.provider_failures,
            self.provider_attempts_failed
        );
        let _ = writeln!(s, "breaker trips:        {}", self.breaker_trips);
        let _ = writeln!(
            s,
            "out of rotation:      median {}  p99 {}  max {}  (n={}, {} never)  {} requests failed at {}/s per service, no retries",
            ms(self.out_of_rotation.median_ms),
            ms(self.out_of_rotation.p99_ms),
            ms(Some(self.out_of_rotation_max_ms)),
            self.out_of_rotation.count,
            self.never_out_of_rotation,
            self.requests_failed,
            crate::engine::REQUESTS_PER_SECOND
        );
        let p = &self.preemption;
        if self.scenario == crate::Scenario::FullPool.name() || p.preemptions > 0 {
            let _ = writeln!(
                s,
                "preemptions:          {} (lower-priority tasks stopped to make room for one at least 10 above)",
                p.preemptions
            );
            let _ = writeln!(
                s,
                "  high-priority back: median {}  p99 {}  max {}  (n={}, {} not back by the end; full-pool bound {}): a replica's loss to its service running one more",
                ms(p.high_recovery.median_ms),
                ms(p.high_recovery.p99_ms),
                ms(Some(p.high_recovery_max_ms)),
                p.high_recovery.count,
                p.high_not_back,
                ms(Some(p.bound_ms).filter(|&b| b > 0))
            );
            let _ = writeln!(
                s,
                "  preempted work:     {:.2} task-hours lost: each victim's stop to its service running one more ({} not back by the end, counted to it)",
                p.preempted_task_hours_lost, p.victims_not_back
            );
        }
        let _ = writeln!(
            s,
            "tasks:                {} killed by faults, {} refused to start without their daemon",
            self.tasks_killed, self.fail_closed_starts
        );
        let _ = writeln!(
            s,
            "replicas at end:      {} of {} running",
            self.replicas_running_at_end, self.replicas_desired
        );
        for (pool, active, total, blocked) in &self.pools_at_end {
            let _ =
                writeln!(s, "  pool {pool}: {active} of {total} hosts ACTIVE, {blocked} incident(s) BLOCKED");
        }
        let _ = writeln!(
            s,
            "spread:               {} crowded host(s), longest {} of a {} bound",
            self.spread.crowded,
            ms(Some(self.spread.longest_ms)),
            ms(Some(self.spread.bound_ms))
        );
        let _ = writeln!(
            s,
            "control plane:        {} heartbeats, {} task reports ({} refused), {} errors, {} restarts",
            self.heartbeats,
            self.task_reports,
            self.rejected_reports,
            self.server_errors,
            self.control_plane_restarts
        );
        let _ = writeln!(s, "invariant checks:     {} over {} steps", self.invariant_checks, self.steps);
        match &self.violation {
            None => {
                let _ = writeln!(s, "invariants:           all held");
            }
            Some(v) => {
                let _ = writeln!(s, "INVARIANT BROKEN:     {v}");
            }
        }
        s
    }
}

fn hours(ms: u128) -> f64 {
    (ms as f64 / 3_600_000.0 * 100.0).round() / 100.0
}
