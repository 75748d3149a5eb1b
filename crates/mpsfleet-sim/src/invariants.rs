//! The invariants a run checks after every step, as pure functions over what the step
//! changed, and the recovery bound.

use crate::timing::{FETCH_LATENCY_MS, HEALTH_TICK_MS, RESYNC_MS, TASK_START_MS};
use crate::world::Demand;
use mpsfleet_server::cluster::SERVICE_RESTART_WINDOW_MS;
use mpsfleet_types::{
    HealthPolicy, Incident, IncidentOwner, IncidentState, OwnershipMode, RemediationPolicy, Step, TaskId,
};
use std::collections::BTreeSet;

/// The first invariant a run broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub at_ms: u64,
    pub detail: String,
}

/// Counts the checks made and remembers which hosts' processes changed since the last step.
#[derive(Debug, Default)]
pub struct Checker {
    pub checks: u64,
    pub dirty_hosts: BTreeSet<usize>,
}

/// What runs on one GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuLoad {
    pub mps_memory_mib: u64,
    pub mps_clients: u32,
    pub whole: u32,
    pub tasks: Vec<TaskId>,
}

impl GpuLoad {
    pub fn add(&mut self, d: Demand, task: TaskId) {
        if d.mps {
            self.mps_memory_mib += d.memory_mib;
            self.mps_clients += 1;
        } else {
            self.whole += 1;
        }
        self.tasks.push(task);
    }
}

/// No GPU over its memory or MPS client limit; MPS and whole-GPU tasks never share a GPU; a
/// whole GPU holds one task; no task runs twice.
pub fn gpu_limits(gpus: &[GpuLoad], memory_mib: u64, max_clients: u32) -> Option<String> {
    for (g, l) in gpus.iter().enumerate() {
        if l.mps_memory_mib > memory_mib {
            return Some(format!(
                "gpu {g} holds {} MiB of MPS tasks, more than its {memory_mib} MiB",
                l.mps_memory_mib
            ));
        }
        if l.mps_clients > max_clients {
            return Some(format!(
                "gpu {g} has {} MPS clients, more than its limit of {max_clients}",
                l.mps_clients
            ));
        }
        if l.whole > 0 && l.mps_clients > 0 {
            return Some(format!(
                "gpu {g} runs {} MPS and {} whole-GPU task(s) at once",
                l.mps_clients, l.whole
            ));
        }
        if l.whole > 1 {
            return Some(format!("gpu {g} is dedicated to {} tasks", l.whole));
        }
        let mut seen = BTreeSet::new();
        if let Some(t) = l.tasks.iter().find(|t| !seen.insert(**t)) {
            return Some(format!("task {t} runs twice on gpu {g}"));
        }
    }
    None
}

/// Every incident carries its detector (trigger, evidence, DETECTED first), its decision
/// (DECIDED before any action, by the owner the pool's mode names), its action (a reason when
/// BLOCKED, RESOLVED with a detail) and its resumption (moved service tasks have replacements
/// and TASKS_RUNNING_AGAIN before the incident resolves); a self-managed pool moves nothing
/// by itself.
pub fn incident_record(i: &Incident, mode: OwnershipMode) -> Option<String> {
    if i.trigger.check.is_empty() || i.trigger.evidence.is_empty() {
        return Some("no detector: the trigger names no check or evidence".into());
    }
    // What came before detection (the first failed signal, local repairs, the replicas
    // leaving service discovery, preemptions made for copies of its replicas started before
    // it opened) may precede it; nothing else may.
    let before = |s: Step| {
        matches!(s, Step::FirstFailure | Step::LocalRepairAttempt | Step::LeftTraffic | Step::Preempted)
    };
    if i.timeline.iter().find(|e| !before(e.step)).map(|e| e.step) != Some(Step::Detected) {
        return Some("the timeline does not start with DETECTED (after the first failure)".into());
    }
    if i.owner != IncidentOwner::for_mode(mode) {
        return Some(format!("owner {} in a {} pool", i.owner.as_str(), mode.as_str()));
    }
    let pos = |s: Step| i.timeline.iter().position(|e| e.step == s);
    if let Some(c) = pos(Step::Cordoned) {
        match pos(Step::Decided) {
            Some(d) if d < c => {}
            _ => return Some("remediation started without a DECIDED step before it".into()),
        }
    }
    let automatic = i.operator_requested.is_none();
    if mode == OwnershipMode::SelfManaged && automatic {
        for s in [Step::Decided, Step::Cordoned, Step::ReplacementRequested, Step::TasksRescheduled] {
            if i.has(s) {
                return Some(format!("self-managed pool, no operator command, yet {}", s.as_str()));
            }
        }
    }
    match &i.state {
        IncidentState::Blocked { reason } if reason.trim().is_empty() => {
            return Some("BLOCKED without a reason".into());
        }
        IncidentState::Resolved => {
            let last = i.timeline.iter().rev().find(|e| e.step == Step::Resolved);
            if last.is_none_or(|e| e.detail.trim().is_empty()) {
                return Some("RESOLVED without a RESOLVED step saying how".into());
            }
            if i.has(Step::TasksRescheduled) && !i.has(Step::TasksRunningAgain) {
                return Some("resolved with tasks moved but no TASKS_RUNNING_AGAIN".into());
            }
            // Tasks listed as waiting were on the host and never moved (they stopped there).
            if let Some(a) =
                i.affected_tasks.iter().find(|a| a.service.is_some() && !a.waiting && a.replacement.is_none())
            {
                return Some(format!("resolved, but moved task {} has no replacement", a.task_id));
            }
            if mode == OwnershipMode::Managed
                && automatic
                && i.has(Step::Cordoned)
                && !i.has(Step::OldHostTerminated)
            {
                return Some("a replaced host resolved without OLD_HOST_TERMINATED".into());
            }
        }
        _ => {}
    }
    None
}

/// The storm breaker's limits on automatic replacements in one pool: at most `maxInFlight`
/// replacements requested and not yet ready, and at most `rateLimit.max` requested within any
/// `rateLimit.perMs` window.
pub fn replacement_limits(pool: &[&Incident], policy: &RemediationPolicy, now_ms: u64) -> Option<String> {
    let automatic = pool.iter().filter(|i| i.operator_requested.is_none());
    let in_flight = automatic
        .clone()
        .filter(|i| i.state != IncidentState::Resolved)
        .filter(|i| i.has(Step::ReplacementRequested) && !i.has(Step::ReplacementReady))
        .count() as u32;
    if in_flight > policy.max_in_flight {
        return Some(format!(
            "{in_flight} replacements in flight, more than remediationPolicy.maxInFlight ({})",
            policy.max_in_flight
        ));
    }
    let per = policy.rate_limit.per_ms;
    let recent = automatic
        .filter_map(|i| i.first(Step::ReplacementRequested))
        .filter(|&t| t <= now_ms && now_ms - t < per)
        .count() as u32;
    if recent > policy.rate_limit.max {
        return Some(format!(
            "{recent} replacements requested within {per} ms, more than remediationPolicy.rateLimit.max ({})",
            policy.rate_limit.max
        ));
    }
    None
}

/// Every phase of an incident within the bound it is held to, unless the server named a
/// cause for the breach: a phase past its bound that the server did not record, or recorded
/// without a cause, is an unexplained breach.
pub fn bounds_held(i: &Incident) -> Option<String> {
    use mpsfleet_types::bounds::PhaseVerdict;
    i.judgement().into_iter().find(|j| j.verdict == PhaseVerdict::Breached && j.cause.is_none()).map(|j| {
        let recorded = i.breaches.iter().any(|b| b.phase == j.phase);
        let start = i.timing().first_failure_at_ms.unwrap_or(i.opened_at_ms);
        let steps: Vec<String> = i
            .timeline
            .iter()
            .map(|e| format!("{} +{}ms", e.step.as_str(), e.at_ms.saturating_sub(start)))
            .collect();
        format!(
            "{} phase ran {} against a bound of {} ({}, {}; timeline {})",
            j.phase,
            j.measured_ms.map_or_else(|| "past its bound".into(), |m| format!("{m} ms")),
            j.bound_ms.map_or_else(|| "-".into(), |b| format!("{b} ms")),
            i.bounds.map_or("?", |b| b.kind.as_str()),
            if recorded { "recorded with no cause" } else { "not recorded by the server" },
            steps.join(", ")
        )
    })
}

/// How long a service may stay below its desired count while its pool has room for the
/// missing tasks, derived from the health policy and the server's constants:
///
/// - detecting a broken GPU the scheduler still places on: `mpsFailureThreshold` probes
///   `mpsProbeIntervalMs` apart, the last timing out (`mpsProbeTimeoutMs`), one heartbeat to
///   report it, `tolerationMs`, one health tick; until then starts there fail closed;
/// - the crash-loop hold-back those failures can trigger (`SERVICE_RESTART_WINDOW_MS`) and
///   the resync that ends it (`RESYNC_INTERVAL`);
/// - the replacement's start: its agent's long-poll answer, a heartbeat, the slowest start;
/// - 10 s of slack for the order in which these land.
pub fn recovery_bound_ms(policy: &HealthPolicy, heartbeat_ms: u64) -> u64 {
    let detect = policy.mps_probe_interval_ms * u64::from(policy.mps_failure_threshold)
        + policy.mps_probe_timeout_ms
        + heartbeat_ms
        + policy.toleration_ms
        + HEALTH_TICK_MS;
    let hold_back = SERVICE_RESTART_WINDOW_MS + RESYNC_MS;
    let start = 2 * FETCH_LATENCY_MS + heartbeat_ms + TASK_START_MS.1;
    detect + hold_back + start + 10_000
}

/// The most replicas of a service one host may keep (`service-spread`): ceil(replicas /
/// hosts with room). The hosts with room are those that could take one more of the
/// service's tasks (`room_hosts`, holding `on_room` replicas) and the host judged (holding
/// `on_host`, itself among them when `host_has_room`); the replicas, those on these hosts
/// less the service's replicas above its desired count (`excess`: a move's new copy, counted
/// where it runs but not twice in the sum).
///
/// A host over it means a host with room holds at least two fewer replicas of the service
/// than it does: when every host with room holds at least `most - 1` (the server's rebalancer
/// is done), no host is over it.
pub fn spread_bound(
    on_room: u32,
    room_hosts: u32,
    excess: u32,
    on_host: u32,
    host_has_room: bool,
) -> SpreadBound {
    let (replicas, hosts) =
        if host_has_room { (on_room, room_hosts) } else { (on_room + on_host, room_hosts + 1) };
    let replicas = replicas.saturating_sub(excess);
    SpreadBound { replicas, hosts, most: replicas.div_ceil(hosts.max(1)) }
}

/// What [`spread_bound`] counted, and the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpreadBound {
    pub replicas: u32,
    pub hosts: u32,
    pub most: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(mps: &[u64], whole: u32) -> GpuLoad {
        let mut l = GpuLoad::default();
        for (i, &m) in mps.iter().enumerate() {
            l.add(Demand { mps: true, memory_mib: m }, TaskId(i as u64));
        }
        for i in 0..whole {
            l.add(Demand { mps: false, memory_mib: 0 }, TaskId(100 + u64::from(i)));
        }
        l
    }

    #[test]
    fn gpu_limits_table() {
        let check = |gpus: Vec<GpuLoad>, want: Option<&str>| {
            let got = gpu_limits(&gpus, 1000, 2);
            match want {
                None => assert_eq!(got, None),
                Some(w) => assert!(got.as_deref().is_some_and(|g| g.contains(w)), "{got:?} lacks {w}"),
            }
        };
        check(vec![load(&[500, 500], 0)], None);
        check(vec![load(&[], 1)], None);
        check(vec![load(&[600, 500], 0)], Some("more than its 1000 MiB"));
        check(vec![load(&[1, 1, 1], 0)], Some("MPS clients"));
        check(vec![load(&[1], 1)], Some("at once"));
        check(vec![load(&[], 2)], Some("dedicated to 2"));
        let mut twice = load(&[1], 0);
        twice.add(Demand { mps: true, memory_mib: 1 }, TaskId(0));
        check(vec![twice], Some("runs twice"));
    }

    /// The figures of the spread bound, and its promise: a spread the rebalancer is done
    /// with (every host with room within one of the most crowded) is never over it, at every
    /// small fleet.
    #[test]
    fn the_spread_bound_counts_the_hosts_that_could_take_more() {
        // 8 replicas on 4 hosts with room: 2 each at most.
        assert_eq!(spread_bound(8, 4, 0, 3, true), SpreadBound { replicas: 8, hosts: 4, most: 2 });
        // A full host with 3 counts itself and its replicas: ceil(8 / 4) = 2 < 3.
        assert_eq!(spread_bound(5, 3, 0, 3, false).most, 2);
        // During a move the new copy is not counted twice.
        assert_eq!(spread_bound(9, 4, 1, 3, true).most, 2);
        assert_eq!(spread_bound(0, 0, 0, 2, false).most, 2, "alone, a host keeps what it has");
        // Hosts with room, `low` of them holding `most - 1` and the others `most`; the judged
        // host holds `most`, among them or apart (a full host).
        for hosts in 1..6u32 {
            for most in 1..6u32 {
                for low in 0..=hosts {
                    let on_room = low * (most - 1) + (hosts - low) * most;
                    let apart = spread_bound(on_room, hosts, 0, most, false);
                    assert!(most <= apart.most, "{hosts} hosts, {low} low, most {most}: {apart:?}");
                    if low < hosts {
                        let among = spread_bound(on_room, hosts, 0, most, true);
                        assert!(most <= among.most, "{hosts} hosts, {low} low, most {most}: {among:?}");
                    }
                }
            }
        }
        // And one host with room two below is enough to be over it at some fleet.
        assert!(spread_bound(4 + 2, 2, 0, 4, true).most < 4);
    }

    #[test]
    fn the_bound_follows_the_policy() {
        let p = HealthPolicy::default();
        let slower = HealthPolicy { mps_probe_interval_ms: 10_000, ..p.clone() };
        assert_eq!(recovery_bound_ms(&slower, 5_000) - recovery_bound_ms(&p, 5_000), 5_000 * 3);
    }
}
