//! The containers of one task, started in `dependsOn` order and stopped in reverse, as ECS's
//! agent orders them.
//!
//! Each container has a [`ContainerLife`], moved on by [`step`] over named [`LifeEvent`]s. The
//! planner ([`plan`]) looks at every container's life and says which may start now, which can
//! no longer start because a dependency can never be met, and whether the task is past
//! starting; [`stop_order`] gives the waves in which a task's containers stop (dependents
//! first). [`find_cycle`] is the check registration makes.
//!
//! Conditions, as in ECS (the dependency is the container named by `containerName`):
//! - `START`: the dependency has started (one that has already exited counts too);
//! - `COMPLETE`: the dependency has exited, with any status;
//! - `SUCCESS`: the dependency has exited 0; any other exit can never meet it;
//! - `HEALTHY`: the dependency's health check has passed; an exit before that can never meet it.
//!
//! A dependency that never started (its launch failed, or it was itself held back) can meet no
//! condition. For `COMPLETE`, `SUCCESS` and `HEALTHY`, the *dependency's* `startTimeout`
//! (seconds, counted from when it started; none or 0: no limit) bounds the wait: past it, the
//! dependents give up. Times are milliseconds given by the caller; nothing here reads a clock.

use mpsfleet_types::taskdef::{ContainerDefinition, DependencyCondition};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Where one container of a task stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerLife {
    /// Not started: waiting for its dependencies (or for the planner to be asked).
    Waiting,
    /// Its start is under way.
    Starting,
    /// Running since `since_ms`; `healthy` once its health check has passed.
    Running { since_ms: u64, healthy: bool },
    /// It ran and has exited: `code` is its exit status (None: killed by a signal, lost, or
    /// its command could not be run); `healthy` whether its health check had passed.
    Exited { code: Option<i32>, healthy: bool },
    /// It never started and never will: its start failed, or it was held back.
    NotStarted { reason: String },
}

/// What happened to a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifeEvent {
    /// Its start was begun.
    LaunchBegun,
    /// It runs (its start finished, or it was found running after an agent restart).
    Started { at_ms: u64 },
    /// Its health check passed.
    HealthPassed,
    /// It exited (or was found exited after an agent restart).
    Exited { code: Option<i32> },
    /// Its start failed, or it is held back for good.
    NotStarted { reason: String },
}

/// Why an event does not apply to a container's life.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifeError {
    #[error("the container has {state}: {event} does not apply")]
    Final { state: &'static str, event: &'static str },
    #[error("the container is {state}: {event} does not apply")]
    OutOfOrder { state: &'static str, event: &'static str },
}

impl ContainerLife {
    pub fn name(&self) -> &'static str {
        match self {
            ContainerLife::Waiting => "waiting",
            ContainerLife::Starting => "starting",
            ContainerLife::Running { .. } => "running",
            ContainerLife::Exited { .. } => "exited",
            ContainerLife::NotStarted { .. } => "not started",
        }
    }

    /// Exited or never to start: nothing more happens to it.
    pub fn is_final(&self) -> bool {
        matches!(self, ContainerLife::Exited { .. } | ContainerLife::NotStarted { .. })
    }

    /// Past starting: running, exited or never to start.
    pub fn is_settled(&self) -> bool {
        !matches!(self, ContainerLife::Waiting | ContainerLife::Starting)
    }
}

impl LifeEvent {
    fn name(&self) -> &'static str {
        match self {
            LifeEvent::LaunchBegun => "a start",
            LifeEvent::Started { .. } => "a started report",
            LifeEvent::HealthPassed => "a passed health check",
            LifeEvent::Exited { .. } => "an exit",
            LifeEvent::NotStarted { .. } => "a failed start",
        }
    }
}

/// The next life of a container after `event`. A repeated health pass changes nothing.
pub fn step(life: &ContainerLife, event: LifeEvent) -> Result<ContainerLife, LifeError> {
    use ContainerLife as L;
    use LifeEvent as E;
    let wrong = |state: &ContainerLife, event: &LifeEvent| {
        if state.is_final() {
            LifeError::Final { state: state.name(), event: event.name() }
        } else {
            LifeError::OutOfOrder { state: state.name(), event: event.name() }
        }
    };
    match (life, event) {
        (L::Waiting, E::LaunchBegun) => Ok(L::Starting),
        // Found running (or exited) after an agent restart: it was started before.
        (L::Waiting | L::Starting, E::Started { at_ms }) => {
            Ok(L::Running { since_ms: at_ms, healthy: false })
        }
        (L::Waiting, E::Exited { code }) => Ok(L::Exited { code, healthy: false }),
        (L::Waiting | L::Starting, E::NotStarted { reason }) => Ok(L::NotStarted { reason }),
        (L::Running { since_ms, .. }, E::HealthPassed) => {
            Ok(L::Running { since_ms: *since_ms, healthy: true })
        }
        (L::Running { healthy, .. }, E::Exited { code }) => Ok(L::Exited { code, healthy: *healthy }),
        (state, event) => Err(wrong(state, &event)),
    }
}

/// One container as the planner sees it.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub def: &'a ContainerDefinition,
    pub life: &'a ContainerLife,
}

/// Why a dependency can never be met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmet {
    /// No container of the task has that name (registration refuses this).
    Missing,
    /// The dependency never started.
    NeverStarted { reason: String },
    /// `SUCCESS`: it exited with another status (`code` None: killed or lost).
    ExitedNonZero { code: Option<i32> },
    /// `HEALTHY`: it exited before its health check passed.
    ExitedUnhealthy { code: Option<i32> },
    /// Its `startTimeout` passed before the condition was met.
    TimedOut { start_timeout_s: u32 },
}

/// A container that can never start: `dependency` can never meet `condition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependencyFailure {
    pub container: String,
    pub essential: bool,
    pub dependency: String,
    pub condition: DependencyCondition,
    pub unmet: Unmet,
}

fn exit_words(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exited with status {c}"),
        None => "exited without a status (killed or lost)".to_string(),
    }
}

impl fmt::Display for DependencyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, d, cond) = (&self.container, &self.dependency, self.condition.as_str());
        write!(f, "container {c} was not started: dependency {d} ")?;
        match &self.unmet {
            Unmet::Missing => write!(f, "is not a container of the task ({cond})"),
            Unmet::NeverStarted { reason } => write!(f, "never started, so it cannot reach {cond}: {reason}"),
            Unmet::ExitedNonZero { code } => write!(f, "{}, not 0 as SUCCESS needs", exit_words(*code)),
            Unmet::ExitedUnhealthy { code } => {
                write!(f, "{} before its health check passed (HEALTHY)", exit_words(*code))
            }
            Unmet::TimedOut { start_timeout_s } => {
                write!(f, "did not reach {cond} within startTimeout {start_timeout_s}s")
            }
        }
    }
}

/// What the planner says of a task's containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Waiting containers whose dependencies are all met: start them now.
    pub start: Vec<String>,
    /// Waiting containers that can never start, with the first dependency that cannot be met.
    pub failed: Vec<DependencyFailure>,
    /// Every container is past starting (running, exited or never to start).
    pub settled: bool,
}

/// Whether one dependency is met, can never be met, or may still be.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Met,
    Pending,
    Never(Unmet),
}

fn judge(condition: DependencyCondition, dep: Option<&Member<'_>>, now_ms: u64) -> Verdict {
    use DependencyCondition as C;
    let Some(dep) = dep else { return Verdict::Never(Unmet::Missing) };
    let timed_out = |since_ms: u64| -> Option<Unmet> {
        let secs = dep.def.start_timeout.filter(|s| *s > 0)?;
        let limit = since_ms.saturating_add(u64::from(secs) * 1000);
        (now_ms >= limit).then_some(Unmet::TimedOut { start_timeout_s: secs })
    };
    match (condition, dep.life) {
        (_, ContainerLife::NotStarted { reason }) => {
            Verdict::Never(Unmet::NeverStarted { reason: reason.clone() })
        }
        (_, ContainerLife::Waiting | ContainerLife::Starting) => Verdict::Pending,
        (C::Start, ContainerLife::Running { .. } | ContainerLife::Exited { .. }) => Verdict::Met,
        (C::Complete, ContainerLife::Exited { .. }) => Verdict::Met,
        (C::Success, ContainerLife::Exited { code: Some(0), .. }) => Verdict::Met,
        (C::Success, ContainerLife::Exited { code, .. }) => {
            Verdict::Never(Unmet::ExitedNonZero { code: *code })
        }
        (C::Healthy, ContainerLife::Running { healthy: true, .. }) => Verdict::Met,
        // Healthy once is enough: HEALTHY is only checked at start-up, as in ECS.
        (C::Healthy, ContainerLife::Exited { healthy: true, .. }) => Verdict::Met,
        (C::Healthy, ContainerLife::Exited { code, .. }) => {
            Verdict::Never(Unmet::ExitedUnhealthy { code: *code })
        }
        (C::Complete | C::Success | C::Healthy, ContainerLife::Running { since_ms, .. }) => {
            timed_out(*since_ms).map_or(Verdict::Pending, Verdict::Never)
        }
    }
}

/// Which of the task's waiting containers may start now, and which never can, at `now_ms`.
pub fn plan(members: &[Member<'_>], now_ms: u64) -> Plan {
    let by_name: BTreeMap<&str, &Member<'_>> = members.iter().map(|m| (m.def.name.as_str(), m)).collect();
    let mut out = Plan { settled: members.iter().all(|m| m.life.is_settled()), ..Plan::default() };
    for m in members.iter().filter(|m| *m.life == ContainerLife::Waiting) {
        let mut all_met = true;
        let mut failure = None;
        // volumesFrom: the source container is made first (ECS's implicit CREATE dependency;
        // here a container is created and started in one step, so START).
        let implicit =
            m.def.volumes_from.iter().map(|v| (DependencyCondition::Start, v.source_container.as_str()));
        let deps = m.def.depends_on.iter().map(|d| (d.condition, d.container_name.as_str())).chain(implicit);
        for (condition, name) in deps {
            match judge(condition, by_name.get(name).copied(), now_ms) {
                Verdict::Met => {}
                Verdict::Pending => all_met = false,
                Verdict::Never(unmet) => {
                    failure = Some(DependencyFailure {
                        container: m.def.name.clone(),
                        essential: m.def.essential,
                        dependency: name.to_string(),
                        condition,
                        unmet,
                    });
                    break;
                }
            }
        }
        match failure {
            Some(f) => out.failed.push(f),
            None if all_met => out.start.push(m.def.name.clone()),
            None => {}
        }
    }
    out
}

/// The order in which a task's containers stop: waves, each stopped once every container of the
/// waves before it has stopped. A container stops only after every container that depends on
/// it (whatever the condition), so dependents come first. Containers caught in a cycle (which
/// registration refuses) stop together in the last wave.
pub fn stop_order(defs: &[ContainerDefinition]) -> Vec<Vec<String>> {
    let names: BTreeSet<&str> = defs.iter().map(|d| d.name.as_str()).collect();
    // For each container, the containers that depend on it.
    let mut dependents: BTreeMap<&str, BTreeSet<&str>> =
        names.iter().map(|n| (*n, BTreeSet::new())).collect();
    for d in defs {
        // volumesFrom sources stop after the containers using their volumes, as ECS does.
        let sources = d.volumes_from.iter().map(|v| v.source_container.as_str());
        for dep in d.depends_on.iter().map(|dep| dep.container_name.as_str()).chain(sources) {
            if let Some(set) = dependents.get_mut(dep) {
                if dep != d.name {
                    set.insert(d.name.as_str());
                }
            }
        }
    }
    let mut left: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
    let mut stopped: BTreeSet<&str> = BTreeSet::new();
    let mut waves = Vec::new();
    while !left.is_empty() {
        let (wave, rest): (Vec<&str>, Vec<&str>) =
            left.iter().partition(|n| dependents[**n].iter().all(|d| stopped.contains(d)));
        if wave.is_empty() {
            waves.push(rest.iter().map(|s| s.to_string()).collect());
            break;
        }
        stopped.extend(wave.iter().copied());
        waves.push(wave.iter().map(|s| s.to_string()).collect());
        left = rest;
    }
    waves
}

/// A cycle of `dependsOn` (and `volumesFrom`) among the containers, as the indexes of the
/// containers along it with the first repeated at the end (`[0, 2, 0]`: container 0 depends on
/// 2, which depends on 0).
/// Dependencies on names that are not containers of the task are skipped (checked apart).
pub fn find_cycle(defs: &[ContainerDefinition]) -> Option<Vec<usize>> {
    let index: BTreeMap<&str, usize> = defs.iter().enumerate().map(|(i, d)| (d.name.as_str(), i)).collect();
    // Its `dependsOn` and its `volumesFrom` sources (which start first too).
    let edges: Vec<Vec<usize>> = defs
        .iter()
        .map(|d| {
            let sources = d.volumes_from.iter().map(|v| v.source_container.as_str());
            d.depends_on
                .iter()
                .map(|x| x.container_name.as_str())
                .chain(sources)
                .filter_map(|n| index.get(n).copied())
                .collect()
        })
        .collect();
    // 0: not seen, 1: on the current path, 2: done.
    let mut mark = vec![0u8; defs.len()];
    let mut path: Vec<usize> = Vec::new();
    fn visit(v: usize, edges: &[Vec<usize>], mark: &mut [u8], path: &mut Vec<usize>) -> Option<Vec<usize>> {
        mark[v] = 1;
        path.push(v);
        for &w in &edges[v] {
            if mark[w] == 1 {
                let start = path.iter().position(|&p| p == w).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(w);
                return Some(cycle);
            }
            if mark[w] == 0 {
                if let Some(c) = visit(w, edges, mark, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        mark[v] = 2;
        None
    }
    (0..defs.len()).find_map(|v| if mark[v] == 0 { visit(v, &edges, &mut mark, &mut path) } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::taskdef::ContainerDependency;
    use ContainerLife as L;
    use DependencyCondition as C;

    fn def(
        name: &str,
        essential: bool,
        deps: &[(&str, C)],
        start_timeout: Option<u32>,
    ) -> ContainerDefinition {
        ContainerDefinition {
            name: name.into(),
            essential,
            depends_on: deps
                .iter()
                .map(|(n, c)| ContainerDependency { container_name: n.to_string(), condition: *c })
                .collect(),
            start_timeout,
            ..ContainerDefinition::default()
        }
    }

    fn running(since_ms: u64, healthy: bool) -> L {
        L::Running { since_ms, healthy }
    }
    fn exited(code: Option<i32>, healthy: bool) -> L {
        L::Exited { code, healthy }
    }
    fn not_started(why: &str) -> L {
        L::NotStarted { reason: why.into() }
    }

    #[test]
    fn life_transitions_table() {
        let cases: Vec<(L, LifeEvent, Result<L, &str>)> = vec![
            (L::Waiting, LifeEvent::LaunchBegun, Ok(L::Starting)),
            (L::Starting, LifeEvent::Started { at_ms: 5 }, Ok(running(5, false))),
            (L::Waiting, LifeEvent::Started { at_ms: 7 }, Ok(running(7, false))),
            (L::Waiting, LifeEvent::Exited { code: Some(0) }, Ok(exited(Some(0), false))),
            (L::Starting, LifeEvent::NotStarted { reason: "x".into() }, Ok(not_started("x"))),
            (L::Waiting, LifeEvent::NotStarted { reason: "y".into() }, Ok(not_started("y"))),
            (running(5, false), LifeEvent::HealthPassed, Ok(running(5, true))),
            (running(5, true), LifeEvent::HealthPassed, Ok(running(5, true))),
            (running(5, true), LifeEvent::Exited { code: Some(3) }, Ok(exited(Some(3), true))),
            (running(5, false), LifeEvent::Exited { code: None }, Ok(exited(None, false))),
            (L::Starting, LifeEvent::LaunchBegun, Err("the container is starting: a start does not apply")),
            (
                running(1, false),
                LifeEvent::LaunchBegun,
                Err("the container is running: a start does not apply"),
            ),
            (
                L::Waiting,
                LifeEvent::HealthPassed,
                Err("the container is waiting: a passed health check does not apply"),
            ),
            (
                exited(Some(0), false),
                LifeEvent::Started { at_ms: 1 },
                Err("the container has exited: a started report does not apply"),
            ),
            (
                not_started("z"),
                LifeEvent::LaunchBegun,
                Err("the container has not started: a start does not apply"),
            ),
            (
                exited(Some(1), false),
                LifeEvent::Exited { code: Some(1) },
                Err("the container has exited: an exit does not apply"),
            ),
        ];
        for (from, event, want) in cases {
            let got = step(&from, event.clone()).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string), "{from:?} + {event:?}");
        }
    }

    /// `plan` over (definition, life) pairs at `now`.
    fn planned(members: &[(ContainerDefinition, L)], now: u64) -> Plan {
        let views: Vec<Member<'_>> = members.iter().map(|(d, l)| Member { def: d, life: l }).collect();
        plan(&views, now)
    }

    fn failure(container: &str, dependency: &str, condition: C, unmet: Unmet) -> DependencyFailure {
        DependencyFailure {
            container: container.into(),
            essential: true,
            dependency: dependency.into(),
            condition,
            unmet,
        }
    }

    #[test]
    fn planner_table() {
        let app = |c: C| def("app", true, &[("dep", c)], None);
        let dep = |t: Option<u32>| def("dep", false, &[], t);
        // (condition, dependency's startTimeout, dependency's life, now) -> start app? / failure
        type Case = (C, Option<u32>, L, u64, Option<Unmet>, bool);
        let cases: Vec<Case> = vec![
            // START: started, or already exited.
            (C::Start, None, L::Waiting, 0, None, false),
            (C::Start, None, L::Starting, 0, None, false),
            (C::Start, None, running(0, false), 0, None, true),
            (C::Start, None, exited(Some(1), false), 0, None, true),
            (
                C::Start,
                None,
                not_started("boom"),
                0,
                Some(Unmet::NeverStarted { reason: "boom".into() }),
                false,
            ),
            // START never times out.
            (C::Start, Some(1), L::Starting, 999_999, None, false),
            // COMPLETE: any exit.
            (C::Complete, None, running(0, false), 10_000_000, None, false),
            (C::Complete, None, exited(Some(7), false), 0, None, true),
            (C::Complete, None, exited(None, false), 0, None, true),
            (C::Complete, Some(5), running(1000, false), 5999, None, false),
            (
                C::Complete,
                Some(5),
                running(1000, false),
                6000,
                Some(Unmet::TimedOut { start_timeout_s: 5 }),
                false,
            ),
            // SUCCESS: exit 0 only.
            (C::Success, None, exited(Some(0), false), 0, None, true),
            (
                C::Success,
                None,
                exited(Some(2), false),
                0,
                Some(Unmet::ExitedNonZero { code: Some(2) }),
                false,
            ),
            (C::Success, None, exited(None, false), 0, Some(Unmet::ExitedNonZero { code: None }), false),
            (
                C::Success,
                Some(3),
                running(0, false),
                3000,
                Some(Unmet::TimedOut { start_timeout_s: 3 }),
                false,
            ),
            // A startTimeout of 0 is no limit.
            (C::Success, Some(0), running(0, false), 10_000_000, None, false),
            // HEALTHY: the health check passed.
            (C::Healthy, None, running(0, false), 10_000_000, None, false),
            (C::Healthy, None, running(0, true), 0, None, true),
            (C::Healthy, Some(60), running(0, false), 59_999, None, false),
            (
                C::Healthy,
                Some(60),
                running(0, false),
                60_000,
                Some(Unmet::TimedOut { start_timeout_s: 60 }),
                false,
            ),
            // Healthy before the timeout: met, whatever the time now.
            (C::Healthy, Some(60), running(0, true), 100_000, None, true),
            (
                C::Healthy,
                None,
                exited(Some(0), false),
                0,
                Some(Unmet::ExitedUnhealthy { code: Some(0) }),
                false,
            ),
            (C::Healthy, None, exited(Some(0), true), 0, None, true),
            (C::Healthy, None, L::Waiting, 0, None, false),
        ];
        for (cond, timeout, life, now, want_failure, want_start) in cases {
            let members = vec![(app(cond), L::Waiting), (dep(timeout), life.clone())];
            let p = planned(&members, now);
            let ctx = format!("{cond:?} timeout {timeout:?} dep {life:?} now {now}");
            assert_eq!(p.start.contains(&"app".to_string()), want_start, "{ctx}: {p:?}");
            let want = want_failure.map(|u| vec![failure("app", "dep", cond, u)]).unwrap_or_default();
            assert_eq!(p.failed, want, "{ctx}");
        }
    }

    #[test]
    fn plan_starts_free_containers_together_and_settles_once_all_have_started() {
        let defs = [
            def("db", true, &[], None),
            def("cache", false, &[], None),
            def("app", true, &[("db", C::Start), ("cache", C::Start)], None),
            def("missing", true, &[("nobody", C::Start)], None),
        ];
        let m =
            |lives: [L; 4]| -> Vec<(ContainerDefinition, L)> { defs.iter().cloned().zip(lives).collect() };
        let p = planned(&m([L::Waiting, L::Waiting, L::Waiting, L::Waiting]), 0);
        assert_eq!(p.start, ["db", "cache"]);
        assert_eq!(p.failed, vec![failure("missing", "nobody", C::Start, Unmet::Missing)]);
        assert!(!p.settled);
        let p = planned(&m([running(0, false), L::Starting, L::Waiting, not_started("x")]), 0);
        assert!(p.start.is_empty(), "{p:?}");
        let p = planned(&m([running(0, false), exited(Some(0), false), L::Waiting, not_started("x")]), 0);
        assert_eq!(p.start, ["app"]);
        let p =
            planned(&m([running(0, false), exited(Some(0), false), running(1, false), not_started("x")]), 0);
        assert!(p.settled && p.start.is_empty() && p.failed.is_empty(), "{p:?}");
    }

    #[test]
    fn failures_read_as_ecs_says_them() {
        let f = |cond, unmet| failure("app", "db", cond, unmet).to_string();
        assert_eq!(
            f(C::Healthy, Unmet::TimedOut { start_timeout_s: 60 }),
            "container app was not started: dependency db did not reach HEALTHY within startTimeout 60s"
        );
        assert_eq!(
            f(C::Success, Unmet::ExitedNonZero { code: Some(3) }),
            "container app was not started: dependency db exited with status 3, not 0 as SUCCESS needs"
        );
        assert_eq!(
            f(C::Healthy, Unmet::ExitedUnhealthy { code: None }),
            "container app was not started: dependency db exited without a status (killed or lost) before \
             its health check passed (HEALTHY)"
        );
        assert_eq!(
            f(C::Start, Unmet::NeverStarted { reason: "no such image".into() }),
            "container app was not started: dependency db never started, so it cannot reach START: no such image"
        );
    }

    #[test]
    fn stop_order_puts_dependents_first() {
        let defs = [
            def("db", true, &[], None),
            def("init", false, &[], None),
            def("app", true, &[("db", C::Healthy), ("init", C::Success)], None),
            def("proxy", true, &[("app", C::Start)], None),
            def("lone", false, &[], None),
        ];
        let waves = stop_order(&defs);
        assert_eq!(waves, vec![vec!["proxy", "lone"], vec!["app"], vec!["db", "init"]]);
        // A cycle (refused at registration) still stops everything.
        let cyc = [def("a", true, &[("b", C::Start)], None), def("b", true, &[("a", C::Start)], None)];
        assert_eq!(stop_order(&cyc), vec![vec!["a", "b"]]);
        assert_eq!(stop_order(&[def("x", true, &[], None)]), vec![vec!["x"]]);
    }

    #[test]
    fn cycles_are_found_with_their_path() {
        let defs = [
            def("a", true, &[("b", C::Start)], None),
            def("b", true, &[("c", C::Start)], None),
            def("c", true, &[("a", C::Healthy)], None),
        ];
        assert_eq!(find_cycle(&defs), Some(vec![0, 1, 2, 0]));
        let tail = [
            def("x", true, &[("a", C::Start)], None),
            def("a", true, &[("b", C::Start)], None),
            def("b", true, &[("a", C::Start)], None),
        ];
        assert_eq!(find_cycle(&tail), Some(vec![1, 2, 1]));
        let dag = [
            def("a", true, &[("b", C::Start), ("c", C::Start)], None),
            def("b", true, &[("c", C::Start), ("nobody", C::Start)], None),
            def("c", true, &[], None),
        ];
        assert_eq!(find_cycle(&dag), None);
        // volumesFrom orders as a dependency does.
        let mut vf = [def("a", true, &[], None), def("b", true, &[("a", C::Start)], None)];
        vf[0].volumes_from =
            vec![mpsfleet_types::VolumeFrom { source_container: "b".into(), read_only: false }];
        assert_eq!(find_cycle(&vf), Some(vec![0, 1, 0]));
    }
}
