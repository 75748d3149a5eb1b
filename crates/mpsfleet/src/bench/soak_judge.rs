//! `bench soak`'s judge: a pure function over what the run recorded (its faults, the server's
//! incidents, the sampler's observations, what the live checks saw), so that a history with a
//! broken promise can be fed to it in a test. See docs/benchmarks.md "Soak".

use super::soak_faults::{Bound, Fault, FaultKind};
use mpsfleet_types::bounds::RecoveryBounds;
use mpsfleet_types::HostId;
use std::collections::{BTreeMap, BTreeSet};

/// How far before a fault (by the bench's clock) an incident it caused may say it opened: the
/// server stamps it on the same machine, but not at the same instant.
pub const CLOCK_SLACK_MS: u64 = 1_000;

/// `kind`'s bound under the pool's `bounds`; None where the pool states no total for it.
pub fn bound_for(kind: FaultKind, bounds: &RecoveryBounds, fenced: bool, held_ms: u64) -> Option<Bound> {
    let k = bounds.of(kind.judged_as())?;
    let resume_ms = if fenced { k.total_fenced_ms } else { k.total_ms }?;
    let close_ms = k.total_ms.max(k.total_fenced_ms)?;
    Some(Bound { judged_as: kind.judged_as(), fenced, resume_ms, close_ms, held_ms })
}

/// One live process of a task: a process task's process, a container's init.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Copy {
    pub service: String,
    pub task: String,
    pub pid: u32,
}

/// What the sampler saw from `from_ms` to `to_ms` (epoch ms), every look the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub from_ms: u64,
    pub to_ms: u64,
    pub copies: Vec<Copy>,
}

/// A service as planned.
#[derive(Debug, Clone)]
pub struct ServicePlan {
    pub name: String,
    pub fenced: bool,
    pub replicas: usize,
}

/// An incident as the server recorded it.
#[derive(Debug, Clone)]
pub struct IncidentRecord {
    pub id: String,
    pub host: HostId,
    pub opened_at_ms: u64,
    /// Its breaches: the phase, and the cause when the server named one.
    pub breaches: Vec<(String, Option<String>)>,
}

/// A broken promise, with the fault kind whose recovery it broke (None: no fault's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: Option<FaultKind>,
    pub at_ms: u64,
    pub what: String,
}

/// Everything the run recorded.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub start_ms: u64,
    pub services: Vec<ServicePlan>,
    pub planned: Vec<FaultKind>,
    pub faults: Vec<Fault>,
    pub incidents: Vec<IncidentRecord>,
    pub observations: Vec<Observation>,
    /// What the live checks (GPU accounting, a deregistered host's leftovers, the state's size)
    /// found broken.
    pub seen: Vec<Violation>,
}

/// One fault's recovery against its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It found nothing to inject into: not a fault, not counted.
    NoTarget,
    /// The pool states no bound for it: it cannot be judged (a violation: every fault is).
    Unbounded,
    /// The fleet never settled: a service never back at its replicas, or an incident never closed.
    NeverBack {
        bound_ms: u64,
    },
    Within {
        took_ms: u64,
        bound_ms: u64,
    },
    /// Past a bound (`what`: resumed or closed), and one of its own incidents recorded a
    /// breach with a cause.
    Excused {
        what: &'static str,
        took_ms: u64,
        bound_ms: u64,
        incident: String,
        cause: String,
    },
    /// Past a bound with no cause on any of its own incidents.
    Overrun {
        what: &'static str,
        took_ms: u64,
        bound_ms: u64,
    },
}

impl Verdict {
    pub fn judged(&self) -> bool {
        !matches!(self, Verdict::NoTarget | Verdict::Unbounded)
    }

    pub fn broken(&self) -> bool {
        matches!(self, Verdict::Unbounded | Verdict::NeverBack { .. } | Verdict::Overrun { .. })
    }

    pub fn words(&self) -> String {
        match self {
            Verdict::NoTarget => "not injected".into(),
            Verdict::Unbounded => "the pool states no bound for it".into(),
            Verdict::NeverBack { bound_ms } => format!("never back (bound {bound_ms} ms)"),
            Verdict::Within { took_ms, bound_ms } => format!("settled in {took_ms} ms, bound {bound_ms} ms"),
            Verdict::Excused { what, took_ms, bound_ms, incident, cause } => {
                format!("{what} in {took_ms} ms, past its bound {bound_ms} ms; incident {incident} records {cause}")
            }
            Verdict::Overrun { what, took_ms, bound_ms } => {
                format!("{what} in {took_ms} ms, past its bound {bound_ms} ms, no cause on its own incidents")
            }
        }
    }
}

/// Per fault kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindCounts {
    pub planned: bool,
    /// Found a target and was injected.
    pub injected: usize,
    /// Injected and held to its bound.
    pub judged: usize,
    pub no_target: usize,
    pub violations: usize,
    /// Incidents it explains.
    pub incidents: usize,
    /// The slowest back to every replica, and to every incident closed.
    pub slowest_resumed_ms: Option<u64>,
    pub slowest_ms: Option<u64>,
    pub bound_ms: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct Judgement {
    /// One per fault, in order.
    pub verdicts: Vec<Verdict>,
    /// The incidents each fault explains (indices into the history's incidents), per fault.
    pub explains: Vec<Vec<usize>>,
    pub unexplained: usize,
    pub violations: Vec<Violation>,
    pub kinds: BTreeMap<FaultKind, KindCounts>,
    pub max_fenced_copies: usize,
    /// Copies seen per service (distinct task and process): the containers' among them.
    pub copies_seen: BTreeMap<String, usize>,
}

/// The fault that explains an incident: the latest one that hit its host and within whose
/// bound (from the fault, less [`CLOCK_SLACK_MS`]) it opened.
pub fn explained_by(faults: &[Fault], inc: &IncidentRecord) -> Option<usize> {
    faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.covers(&inc.host))
        .filter(|(_, f)| {
            f.bound.is_some_and(|b| {
                inc.opened_at_ms + CLOCK_SLACK_MS >= f.at_ms && inc.opened_at_ms <= f.at_ms + b.closed()
            })
        })
        .max_by_key(|(_, f)| f.at_ms)
        .map(|(i, _)| i)
}

/// A fault's verdict, given the incidents it explains.
pub fn verdict(f: &Fault, own: &[&IncidentRecord]) -> Verdict {
    if !f.happened() {
        return Verdict::NoTarget;
    }
    let Some(bound) = f.bound else { return Verdict::Unbounded };
    let Some(closed) = f.settled_ms else { return Verdict::NeverBack { bound_ms: bound.closed() } };
    let resumed = f.resumed_ms.unwrap_or(closed);
    let past = [("resumed", resumed, bound.resumed()), ("closed", closed, bound.closed())]
        .into_iter()
        .find(|(_, took, bound)| took > bound);
    let Some((what, took_ms, bound_ms)) = past else {
        return Verdict::Within { took_ms: closed, bound_ms: bound.closed() };
    };
    let cause = own.iter().find_map(|i| {
        i.breaches.iter().find_map(|(phase, c)| c.as_ref().map(|c| (i.id.clone(), format!("{phase}: {c}"))))
    });
    match cause {
        Some((incident, cause)) => Verdict::Excused { what, took_ms, bound_ms, incident, cause },
        None => Verdict::Overrun { what, took_ms, bound_ms },
    }
}

/// The whole judgement.
pub fn judge(h: &History) -> Judgement {
    let mut j = Judgement { explains: vec![Vec::new(); h.faults.len()], ..Default::default() };
    let mut violations = h.seen.clone();
    for (n, inc) in h.incidents.iter().enumerate().filter(|(_, i)| i.opened_at_ms >= h.start_ms) {
        match explained_by(&h.faults, inc) {
            Some(f) => j.explains[f].push(n),
            None => {
                j.unexplained += 1;
                violations.push(Violation {
                    kind: None,
                    at_ms: inc.opened_at_ms,
                    what: format!(
                        "incident {} on host {} opened with no fault on its host within that fault's bound",
                        inc.id, inc.host
                    ),
                });
            }
        }
    }
    for (f, explains) in h.faults.iter().zip(&j.explains) {
        let own: Vec<&IncidentRecord> = explains.iter().map(|&i| &h.incidents[i]).collect();
        let v = verdict(f, &own);
        if v.broken() {
            violations.push(Violation {
                kind: Some(f.kind),
                at_ms: f.at_ms,
                what: format!("{}: {}", f.describe(), v.words()),
            });
        }
        let k = j.kinds.entry(f.kind).or_default();
        if f.happened() {
            k.injected += 1;
            k.incidents += explains.len();
            k.slowest_resumed_ms = k.slowest_resumed_ms.max(f.resumed_ms);
            k.slowest_ms = k.slowest_ms.max(f.settled_ms);
            k.bound_ms = k.bound_ms.max(f.bound.map(|b| b.closed()));
        } else {
            k.no_target += 1;
        }
        k.judged += usize::from(v.judged());
        j.verdicts.push(v);
    }
    violations.extend(overlaps(h, &mut j));
    for &kind in &h.planned {
        let k = j.kinds.entry(kind).or_default();
        k.planned = true;
        if k.judged == 0 {
            violations.push(Violation {
                kind: Some(kind),
                at_ms: h.start_ms,
                what: format!(
                    "{} was planned and never judged ({} found no target)",
                    kind.name(),
                    k.no_target
                ),
            });
        }
    }
    for v in &violations {
        if let Some(kind) = v.kind {
            j.kinds.entry(kind).or_default().violations += 1;
        }
    }
    violations.sort_by_key(|v| v.at_ms);
    j.violations = violations;
    j
}

/// Copies past what is allowed, in every observation: a task with more than one live copy,
/// a fenced service with more live copies than replicas. Each stretch of one breach is one
/// violation, charged to the fault injected last before it began.
fn overlaps(h: &History, j: &mut Judgement) -> Vec<Violation> {
    let fenced: BTreeMap<&str, usize> =
        h.services.iter().filter(|s| s.fenced).map(|s| (s.name.as_str(), s.replicas)).collect();
    let mut seen: BTreeMap<&str, BTreeSet<(&str, u32)>> = BTreeMap::new();
    // The breaches going on in the last observation: key → where it began.
    let mut going: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut out = Vec::new();
    let mut close = |(from, what): (u64, String), to: u64| {
        let kind = h
            .faults
            .iter()
            .filter(|f| f.happened() && f.at_ms <= from)
            .max_by_key(|f| f.at_ms)
            .map(|f| f.kind);
        out.push(Violation { kind, at_ms: from, what: format!("{what}, seen for {} ms", to - from) });
    };
    for o in &h.observations {
        let mut now: BTreeMap<String, String> = BTreeMap::new();
        let mut per_task: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        let mut per_service: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for c in &o.copies {
            seen.entry(&c.service).or_default().insert((&c.task, c.pid));
            per_task.entry(&c.task).or_default().push(c.pid);
            per_service.entry(&c.service).or_default().push(c.pid);
        }
        for (task, pids) in per_task.iter().filter(|(_, p)| p.len() > 1) {
            now.insert(format!("task {task}"), format!("task {task} runs {} copies: {pids:?}", pids.len()));
        }
        for (service, pids) in &per_service {
            let Some(&replicas) = fenced.get(service) else { continue };
            j.max_fenced_copies = j.max_fenced_copies.max(pids.len());
            if pids.len() > replicas {
                now.insert(
                    format!("service {service}"),
                    format!(
                        "fenced service {service} has {} live copies for {replicas} replicas: {pids:?}",
                        pids.len()
                    ),
                );
            }
        }
        let ended: Vec<String> = going.keys().filter(|k| !now.contains_key(*k)).cloned().collect();
        for key in ended {
            let began = going.remove(&key).unwrap_or_default();
            close(began, o.from_ms);
        }
        for (key, what) in now {
            going.entry(key).or_insert((o.from_ms, what));
        }
    }
    let last = h.observations.last().map_or(0, |o| o.to_ms);
    for began in std::mem::take(&mut going).into_values() {
        close(began, last);
    }
    j.copies_seen = seen.into_iter().map(|(s, c)| (s.to_owned(), c.len())).collect();
    out
}

/// Histories with one broken promise each: the judge must name it; the clean one passes.
#[cfg(test)]
mod tests {
    use super::super::soak::figures;
    use super::super::soak_faults::{Scope, Target};
    use super::*;
    use FaultKind::*;

    /// Stated totals (restart, fenced).
    const AGENT_LOST_MS: (u64, u64) = (40_000, 160_000);
    const DAEMON_EXIT_MS: (u64, u64) = (30_000, 120_000);

    fn host(n: u32) -> HostId {
        HostId::new(format!("h-{n}")).unwrap()
    }

    fn fault(kind: FaultKind, on: u32, at_ms: u64, settled_ms: Option<u64>) -> Fault {
        let (resume_ms, close_ms) = if kind == DaemonKill { DAEMON_EXIT_MS } else { AGENT_LOST_MS };
        let target = match kind.scope() {
            Scope::Host => Target::Host { id: host(on), gpu: None },
            Scope::Fleet => Target::Fleet,
        };
        let mut f = Fault::new(kind, target, at_ms);
        (f.resumed_ms, f.settled_ms) = (settled_ms, settled_ms);
        f.bound = Some(Bound { judged_as: kind.judged_as(), fenced: false, resume_ms, close_ms, held_ms: 0 });
        f
    }

    fn incident(id: &str, on: u32, opened_at_ms: u64, breaches: &[(&str, Option<&str>)]) -> IncidentRecord {
        IncidentRecord {
            id: id.into(),
            host: host(on),
            opened_at_ms,
            breaches: breaches.iter().map(|(p, c)| (p.to_string(), c.map(str::to_string))).collect(),
        }
    }

    fn copies(at_ms: u64, tasks: &[(&str, &str, u32)]) -> Observation {
        let copies = tasks
            .iter()
            .map(|(service, task, pid)| Copy {
                service: service.to_string(),
                task: task.to_string(),
                pid: *pid,
            })
            .collect();
        Observation { from_ms: at_ms, to_ms: at_ms + 250, copies }
    }

    /// An agent killed on h-1 (an incident there, back within its bound) and a daemon killed on
    /// h-2 (repaired on the host); the fenced service never past its 2 replicas.
    fn clean() -> History {
        let steady = [("steady", "t-1", 101), ("steady", "t-2", 102)];
        let pinned = [("pinned", "t-3", 103), ("pinned", "t-4", 104)];
        History {
            start_ms: 1_000,
            services: vec![
                ServicePlan { name: "steady".into(), fenced: false, replicas: 2 },
                ServicePlan { name: "pinned".into(), fenced: true, replicas: 2 },
            ],
            planned: vec![AgentKill, DaemonKill],
            faults: vec![
                fault(AgentKill, 1, 10_000, Some(20_000)),
                fault(DaemonKill, 2, 300_000, Some(8_000)),
            ],
            incidents: vec![incident("inc-1", 1, 22_500, &[])],
            observations: vec![
                copies(2_000, &[steady[0], steady[1], pinned[0], pinned[1]]),
                // t-4 gone with its host, its replacement t-5 started after.
                copies(25_000, &[steady[0], steady[1], pinned[0]]),
                copies(26_000, &[steady[0], steady[1], pinned[0], ("pinned", "t-5", 105)]),
            ],
            seen: Vec::new(),
        }
    }

    fn broken(h: &History) -> Vec<String> {
        judge(h).violations.into_iter().map(|v| v.what).collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let h = clean();
        let j = judge(&h);
        assert!(j.violations.is_empty(), "{:?}", j.violations);
        assert_eq!(j.explains, vec![vec![0], vec![]]);
        assert_eq!(j.max_fenced_copies, 2);
        let agent = &j.kinds[&AgentKill];
        assert_eq!(
            (agent.planned, agent.injected, agent.judged, agent.no_target, agent.incidents),
            (true, 1, 1, 0, 1)
        );
        assert_eq!(j.verdicts[1], Verdict::Within { took_ms: 8_000, bound_ms: DAEMON_EXIT_MS.1 });
        assert_eq!(figures(&h, &j)["faults"], 2);
    }

    #[test]
    fn an_overrun_with_no_cause_is_a_violation() {
        let mut h = clean();
        h.faults[0].settled_ms = Some(AGENT_LOST_MS.1 + 1);
        h.incidents[0].breaches = vec![("total".into(), None)];
        let all = broken(&h);
        assert!(
            all.iter().any(|v| v.contains("agent-kill on host h-1: closed in") && v.contains("no cause")),
            "{all:?}"
        );
        assert_eq!(judge(&h).kinds[&AgentKill].violations, 1);
        // Every incident closed in time, but the services back only after their own total.
        let mut h = clean();
        h.faults[0].resumed_ms = Some(AGENT_LOST_MS.0 + 1);
        let all = broken(&h);
        assert!(all.iter().any(|v| v.contains("agent-kill on host h-1: resumed in 40001 ms")), "{all:?}");
    }

    /// A cause recorded on another incident of the same host (an earlier fault's) excuses
    /// nothing; the same cause on the fault's own incident does.
    #[test]
    fn an_overrun_is_excused_only_by_a_cause_on_its_own_incident() {
        let mut h = clean();
        h.faults.insert(0, fault(AgentStop, 1, 2_000, Some(30_000)));
        h.faults[1].settled_ms = Some(AGENT_LOST_MS.1 + 5_000);
        h.incidents.insert(0, incident("inc-0", 1, 8_000, &[("replace", Some("breaker-open"))]));
        let j = judge(&h);
        assert_eq!(j.explains[0], vec![0], "the earlier incident is the earlier fault's");
        assert!(matches!(j.verdicts[1], Verdict::Overrun { .. }), "{:?}", j.verdicts[1]);
        h.incidents[1].breaches = vec![("replace".into(), Some("breaker-open".into()))];
        let j = judge(&h);
        assert!(
            matches!(&j.verdicts[1], Verdict::Excused { incident, .. } if incident == "inc-1"),
            "{:?}",
            j.verdicts[1]
        );
        assert!(j.violations.is_empty(), "{:?}", j.violations);
    }

    /// An incident long after the only fault on its host, and one on a host no fault hit.
    #[test]
    fn an_incident_is_explained_only_by_a_fault_on_its_host_within_its_bound() {
        let mut h = clean();
        h.incidents.push(incident("inc-late", 1, 10_000 + AGENT_LOST_MS.1 + 1, &[]));
        h.incidents.push(incident("inc-elsewhere", 3, 12_000, &[]));
        h.incidents.push(incident("inc-before", 2, 300_000 - CLOCK_SLACK_MS - 1, &[]));
        let all = broken(&h);
        for id in ["inc-late", "inc-elsewhere", "inc-before"] {
            assert!(all.iter().any(|v| v.contains(&format!("incident {id} "))), "{id}: {all:?}");
        }
        assert_eq!(judge(&h).unexplained, 3);
    }

    /// The fenced service's replacement seen while the copy it replaces still runs, and one
    /// task seen twice (a container and its adopted twin), in the middle of a recovery.
    #[test]
    fn copies_past_what_is_allowed_are_seen_mid_recovery() {
        let mut h = clean();
        let mid = copies(
            24_000,
            &[
                ("steady", "t-1", 101),
                ("steady", "t-1", 201),
                ("pinned", "t-3", 103),
                ("pinned", "t-4", 104),
                ("pinned", "t-5", 105),
            ],
        );
        h.observations.insert(1, mid);
        let j = judge(&h);
        let all: Vec<&str> = j.violations.iter().map(|v| v.what.as_str()).collect();
        assert!(
            all.iter().any(|v| v.starts_with("fenced service pinned has 3 live copies for 2 replicas")),
            "{all:?}"
        );
        assert!(all.iter().any(|v| v.starts_with("task t-1 runs 2 copies")), "{all:?}");
        assert_eq!(j.violations.len(), 2, "one violation per stretch: {all:?}");
        assert!(j.violations.iter().all(|v| v.kind == Some(AgentKill)));
        assert_eq!(j.max_fenced_copies, 3);
    }

    /// A fault that found no target is not counted, explains nothing, and a planned kind with
    /// nothing but such faults was never judged.
    #[test]
    fn a_fault_with_no_target_does_not_count() {
        let mut h = clean();
        h.faults[1].target = Target::Missed("no live daemon".into());
        h.incidents.push(incident("inc-2", 2, 301_000, &[]));
        let j = judge(&h);
        assert_eq!(j.verdicts[1], Verdict::NoTarget);
        let k = &j.kinds[&DaemonKill];
        assert_eq!((k.injected, k.judged, k.no_target), (0, 0, 1));
        let all: Vec<&str> = j.violations.iter().map(|v| v.what.as_str()).collect();
        assert!(all.iter().any(|v| v.contains("daemon-kill was planned and never judged")), "{all:?}");
        assert!(all.iter().any(|v| v.contains("incident inc-2 ")), "{all:?}");
        let fig = figures(&h, &j);
        assert_eq!((fig["faults"].as_u64(), fig["faults_no_target"].as_u64()), (Some(1), Some(1)), "{fig}");
    }

    #[test]
    fn a_fault_never_back_or_without_a_bound_is_a_violation() {
        let mut h = clean();
        h.faults[0].settled_ms = None;
        h.faults[1].bound = None;
        let all = broken(&h);
        assert!(all.iter().any(|v| v.contains("agent-kill on host h-1: never back")), "{all:?}");
        assert!(
            all.iter().any(|v| v.contains("daemon-kill on host h-2: the pool states no bound")),
            "{all:?}"
        );
    }

    /// A server kill explains an incident on any host; a live check's finding is charged to
    /// its kind.
    #[test]
    fn a_fleet_fault_covers_every_host() {
        let mut h = clean();
        h.planned.push(ServerKill);
        h.faults.push(fault(ServerKill, 0, 500_000, Some(9_000)));
        h.incidents.push(incident("inc-3", 3, 505_000, &[]));
        h.seen.push(Violation { kind: Some(ServerKill), at_ms: 509_000, what: "accounting".into() });
        let j = judge(&h);
        assert_eq!(j.explains[2], vec![1]);
        assert_eq!(j.kinds[&ServerKill].violations, 1);
        assert_eq!(j.violations.len(), 1, "{:?}", j.violations);
    }

    /// Each kind's bounds are the pool's stated totals (as the server derives them) of the
    /// failure it is judged as, plus its hold.
    #[test]
    fn bounds_come_from_the_pools_stated_totals() {
        use mpsfleet_types::{OwnershipMode, PlacementStrategy, Provider};
        let pool = serde_json::json!({"name": "soak", "mode": OwnershipMode::Managed,
            "strategy": PlacementStrategy::Binpack, "provider": Provider::local(3), "createdAtMs": 0});
        // The server's own intervals, as `pool explain` derives the bounds from them.
        let iv = mpsfleet_server::cluster::bounds::intervals();
        let mut bounds = mpsfleet_core::bounds::derive(&serde_json::from_value(pool).unwrap(), &iv);
        for kind in FaultKind::ALL {
            let stated = bounds.of(kind.judged_as()).unwrap();
            let (restart, fenced) = (stated.total_ms.unwrap(), stated.total_fenced_ms.unwrap());
            assert!(restart < fenced, "{stated:?}");
            let b = bound_for(kind, &bounds, false, 5).unwrap();
            assert_eq!((b.resumed(), b.closed()), (restart + 5, fenced + 5), "{kind:?}");
            let b = bound_for(kind, &bounds, true, 0).unwrap();
            assert_eq!((b.resumed(), b.closed()), (fenced, fenced), "{kind:?}");
        }
        // The docs' figure: a daemon that exits, restart services, 37.5 s.
        assert_eq!(bound_for(DaemonKill, &bounds, false, 0).map(|b| b.resumed()), Some(37_500));
        bounds.kinds.iter_mut().for_each(|k| (k.total_ms, k.total_fenced_ms) = (None, None));
        assert_eq!(bound_for(AgentKill, &bounds, false, 0), None, "a pool that states no total");
    }
}
