//! Rolling deployments of a service, as ECS rolls them.
//!
//! A service's replicas are of its current definition (the PRIMARY deployment's) or of an
//! older one. [`plan`] says, from where every replica stands, which to stop and how many new
//! ones to start, so that the service moves to its desired count of current replicas without
//! ever leaving the bounds of its `deploymentConfiguration`:
//!
//! - **at least `min_healthy` healthy replicas**: a healthy replica is stopped only while
//!   the others that stay healthy are still enough; replicas that are not healthy (waiting,
//!   starting, failing) serve nobody and may go at any time;
//! - **at most `max_total` replicas** waiting, running or stopping: a new one starts only in
//!   a free slot, and a stopping one keeps its slot until it has stopped, so a `fenced`
//!   service (whose bound is its desired count) never has a replica and its replacement at
//!   once.
//!
//! It is pure and is called again on every change, so a rollout is the sequence of these
//! steps: what the bounds allow now, and the rest once tasks have started, turned healthy or
//! stopped.

use mpsfleet_types::service::DeploymentConfiguration;

/// Where one replica of a service stands, as the rollout counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReplicaState {
    /// Not placed yet.
    Waiting,
    /// Placed, not (yet) healthy.
    Starting,
    /// Running, ready and passing its health check (if it has one).
    Healthy,
    /// Asked to stop and not stopped yet: it keeps its slot of `max_total`.
    Stopping,
}

/// One replica: `current` when it runs the PRIMARY deployment's definition; `seq` orders
/// replicas by age (lower is older).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica<Id> {
    pub id: Id,
    pub current: bool,
    pub state: ReplicaState,
    pub seq: u64,
}

/// The numbers a rollout keeps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub desired: u32,
    /// The fewest healthy replicas while replacing healthy ones.
    pub min_healthy: u32,
    /// The most replicas waiting, running or stopping.
    pub max_total: u32,
    /// The configured bounds left no room to replace anything, and the minimum was lowered by
    /// one so that replicas are replaced one at a time.
    pub one_at_a_time: bool,
}

impl Bounds {
    /// ECS's rounding: the minimum rounds up, the maximum down (and is never below the
    /// desired count). A `fenced` service's maximum is its desired count: each replica stops
    /// before its replacement starts.
    pub fn new(desired: u32, config: &DeploymentConfiguration, fenced: bool) -> Bounds {
        let min_pct = u64::from(config.minimum_healthy_percent.min(100));
        let max_pct = u64::from(config.maximum_percent);
        let d = u64::from(desired);
        let mut min_healthy = (d * min_pct).div_ceil(100) as u32;
        let max_total = if fenced { desired } else { ((d * max_pct / 100) as u32).max(desired) };
        let one_at_a_time = desired > 0 && min_healthy >= max_total;
        if one_at_a_time {
            min_healthy = max_total - 1;
        }
        Bounds { desired, min_healthy, max_total, one_at_a_time }
    }
}

/// Why a replica is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopWhy {
    /// It runs an older definition.
    Replaced,
    /// There are more current replicas than desired.
    ScaledIn,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<Id> {
    pub stop: Vec<(Id, StopWhy)>,
    /// New replicas of the current definition to start.
    pub start: u32,
}

/// The step to take now. `may_start` is false while new replicas are held back (tasks
/// failing too fast, or a deployment whose circuit breaker tripped without a rollback); then
/// no healthy older replica is stopped either, since nothing would replace it.
pub fn plan<Id: Copy>(bounds: Bounds, replicas: &[Replica<Id>], may_start: bool) -> Plan<Id> {
    let desired = bounds.desired as usize;
    let mut stop = Vec::new();
    let live = || replicas.iter().filter(|r| r.state != ReplicaState::Stopping);

    // Current replicas beyond the desired count: waiting ones first, then starting, then
    // healthy; the newest first within each.
    let mut current: Vec<&Replica<Id>> = live().filter(|r| r.current).collect();
    current.sort_by_key(|r| (r.state, std::cmp::Reverse(r.seq)));
    let extra = current.len().saturating_sub(desired);
    let mut healthy_stopped = 0;
    for r in &current[..extra] {
        healthy_stopped += usize::from(r.state == ReplicaState::Healthy);
        stop.push((r.id, StopWhy::ScaledIn));
    }
    let current_kept = current.len() - extra;

    // Older replicas that are not healthy serve nobody: they go at once. Healthy ones go,
    // oldest first, as far as the minimum allows.
    let mut older: Vec<&Replica<Id>> = live().filter(|r| !r.current).collect();
    older.sort_by_key(|r| (r.state == ReplicaState::Healthy, r.seq));
    let healthy = live().filter(|r| r.state == ReplicaState::Healthy).count() - healthy_stopped;
    let mut budget = healthy.saturating_sub(bounds.min_healthy as usize);
    for r in older {
        if r.state != ReplicaState::Healthy {
            stop.push((r.id, StopWhy::Replaced));
        } else if may_start && budget > 0 {
            budget -= 1;
            stop.push((r.id, StopWhy::Replaced));
        }
    }

    // New replicas in the free slots: every replica not yet stopped holds one.
    let start = if may_start {
        let missing = desired.saturating_sub(current_kept);
        let free = (bounds.max_total as usize).saturating_sub(replicas.len());
        missing.min(free) as u32
    } else {
        0
    };
    Plan { stop, start }
}

/// One host of a DAEMON service's pool, with the service's replicas there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonHost<Id> {
    /// ACTIVE in the pool (and the service not deleted): it should run one replica.
    pub wanted: bool,
    /// Open to new placements now (not cordoned, not impaired).
    pub open: bool,
    pub replicas: Vec<Replica<Id>>,
}

/// Why a DAEMON service's replica is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonStop {
    /// Its host is no longer ACTIVE in the pool (draining, gone), or it has none.
    HostLeft,
    /// Its host runs another replica of the service.
    Extra,
    /// It runs an older definition.
    Replaced,
}

/// What a DAEMON service does now: the replicas to stop, and the hosts (by their index in
/// the planner's input) to start one on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonPlan<Id> {
    pub stop: Vec<(Id, DaemonStop)>,
    pub start_on: Vec<usize>,
}

/// The step a DAEMON service takes now: each wanted host keeps one replica (a current one
/// first, then a healthy one, then the oldest) and the others there stop; a host that is not
/// wanted keeps none. A wanted, open host with no replica at all (not even one still
/// stopping, which holds its GPU and ports) gets one. An older replica is replaced in place:
/// it stops first and its host gets a new one once it has stopped (`maximumPercent` 100);
/// unhealthy ones at once, healthy ones while at least `bounds.min_healthy` hosts keep a
/// healthy replica. `may_start` false (held back, or a failed deployment) starts nothing and
/// replaces nothing.
pub fn plan_daemon<Id: Copy + PartialEq>(
    bounds: Bounds,
    hosts: &[DaemonHost<Id>],
    may_start: bool,
) -> DaemonPlan<Id> {
    let mut plan = DaemonPlan { stop: Vec::new(), start_on: Vec::new() };
    let mut healthy = 0u32;
    let mut older: Vec<&Replica<Id>> = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let live = || h.replicas.iter().filter(|r| r.state != ReplicaState::Stopping);
        if !h.wanted {
            plan.stop.extend(live().map(|r| (r.id, DaemonStop::HostLeft)));
            continue;
        }
        let keep = live().min_by_key(|r| (!r.current, r.state != ReplicaState::Healthy, r.seq));
        let Some(keep) = keep else {
            if may_start && h.open && h.replicas.is_empty() {
                plan.start_on.push(i);
            }
            continue;
        };
        plan.stop.extend(live().filter(|r| r.id != keep.id).map(|r| (r.id, DaemonStop::Extra)));
        healthy += u32::from(keep.state == ReplicaState::Healthy);
        if !keep.current {
            older.push(keep);
        }
    }
    if may_start {
        older.sort_by_key(|r| (r.state == ReplicaState::Healthy, r.seq));
        for r in older {
            if r.state != ReplicaState::Healthy {
                plan.stop.push((r.id, DaemonStop::Replaced));
            } else if healthy > bounds.min_healthy {
                healthy -= 1;
                plan.stop.push((r.id, DaemonStop::Replaced));
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplicaState::*;

    fn config(min: u32, max: u32) -> DeploymentConfiguration {
        DeploymentConfiguration { minimum_healthy_percent: min, maximum_percent: max, ..Default::default() }
    }

    /// Runs a rollout to its end, one step at a time, the way the server does: the planned
    /// stops take effect (stopping, then gone) and started replicas become healthy one step
    /// later. Checks the bounds after every step and returns the number of steps.
    fn roll(bounds: Bounds, mut replicas: Vec<Replica<u32>>) -> usize {
        let mut next = 1000;
        for step in 1..100 {
            // What was stopping has stopped; what was starting is healthy.
            replicas.retain(|r| r.state != Stopping);
            for r in &mut replicas {
                if r.state == Starting || r.state == Waiting {
                    r.state = Healthy;
                }
            }
            let p = plan(bounds, &replicas, true);
            if p.stop.is_empty() && p.start == 0 {
                assert!(replicas.iter().all(|r| r.current && r.state == Healthy));
                assert_eq!(replicas.len(), bounds.desired as usize);
                return step;
            }
            for (id, _) in &p.stop {
                replicas.iter_mut().find(|r| r.id == *id).unwrap().state = Stopping;
            }
            for _ in 0..p.start {
                next += 1;
                replicas.push(Replica { id: next, current: true, state: Waiting, seq: u64::from(next) });
            }
            let healthy = replicas.iter().filter(|r| r.state == Healthy).count();
            assert!(healthy >= bounds.min_healthy as usize, "step {step}: {healthy} healthy, {replicas:?}");
            assert!(replicas.len() <= bounds.max_total as usize, "step {step}: {} replicas", replicas.len());
        }
        panic!("the rollout did not end");
    }

    fn old(n: u32) -> Vec<Replica<u32>> {
        (0..n).map(|i| Replica { id: i, current: false, state: Healthy, seq: u64::from(i) }).collect()
    }

    #[test]
    fn bounds_round_as_ecs_does() {
        let b = Bounds::new(6, &config(50, 100), false);
        assert_eq!((b.min_healthy, b.max_total, b.one_at_a_time), (3, 6, false));
        let b = Bounds::new(5, &config(50, 150), false);
        assert_eq!((b.min_healthy, b.max_total), (3, 7));
        let b = Bounds::new(3, &DeploymentConfiguration::default(), false);
        assert_eq!((b.min_healthy, b.max_total), (3, 6));
        // Fenced: no surge; the default minimum would leave no room, so one at a time.
        let b = Bounds::new(3, &DeploymentConfiguration::default(), true);
        assert_eq!((b.min_healthy, b.max_total, b.one_at_a_time), (2, 3, true));
        assert_eq!(Bounds::new(0, &config(100, 100), false).min_healthy, 0);
    }

    #[test]
    fn half_healthy_no_surge_replaces_three_then_three() {
        let b = Bounds::new(6, &config(50, 100), false);
        let p = plan(b, &old(6), true);
        assert_eq!(p.stop.len(), 3);
        assert_eq!(p.start, 0, "no free slot until the stopped ones have stopped");
        assert!(roll(b, old(6)) <= 6);
    }

    #[test]
    fn the_default_surges_then_stops_old_ones_as_new_ones_turn_healthy() {
        let b = Bounds::new(6, &DeploymentConfiguration::default(), false);
        let p = plan(b, &old(6), true);
        assert_eq!((p.stop.len(), p.start), (0, 6));
        roll(b, old(6));
    }

    #[test]
    fn every_configuration_keeps_its_bounds_to_the_end() {
        for desired in [1, 2, 3, 6, 10] {
            for (min, max) in [(0, 100), (50, 100), (100, 200), (50, 150), (100, 100), (0, 200), (100, 101)] {
                for fenced in [false, true] {
                    roll(Bounds::new(desired, &config(min, max), fenced), old(desired));
                }
            }
        }
    }

    #[test]
    fn fenced_never_has_more_than_the_desired_count() {
        let b = Bounds::new(4, &DeploymentConfiguration::default(), true);
        let p = plan(b, &old(4), true);
        assert_eq!((p.stop.len(), p.start), (1, 0));
        roll(b, old(4));
    }

    #[test]
    fn unhealthy_older_replicas_go_at_once_and_extras_go_waiting_first() {
        let b = Bounds::new(2, &config(100, 200), false);
        let mut r = old(2);
        r[0].state = Starting;
        let p = plan(b, &r, true);
        assert_eq!(p.stop, vec![(0, StopWhy::Replaced)]);
        let r = vec![
            Replica { id: 1, current: true, state: Healthy, seq: 1 },
            Replica { id: 2, current: true, state: Waiting, seq: 2 },
            Replica { id: 3, current: true, state: Healthy, seq: 3 },
        ];
        let p = plan(Bounds::new(1, &config(100, 200), false), &r, true);
        assert_eq!(p.stop, vec![(2, StopWhy::ScaledIn), (3, StopWhy::ScaledIn)]);
    }

    #[test]
    fn held_back_starts_nothing_and_keeps_healthy_older_replicas() {
        let b = Bounds::new(3, &config(0, 100), false);
        let p = plan(b, &old(3), false);
        assert_eq!(p, Plan { stop: vec![], start: 0 });
    }

    fn host(replicas: Vec<Replica<u32>>) -> DaemonHost<u32> {
        DaemonHost { wanted: true, open: true, replicas }
    }

    fn one(id: u32, current: bool, state: ReplicaState) -> Replica<u32> {
        Replica { id, current, state, seq: u64::from(id) }
    }

    #[test]
    fn a_daemon_starts_one_per_wanted_open_host_and_stops_the_rest() {
        let b = Bounds::new(4, &DeploymentConfiguration::daemon(), false);
        let hosts = vec![
            host(vec![]),
            host(vec![one(1, true, Healthy), one(2, true, Starting)]),
            DaemonHost { wanted: false, open: true, replicas: vec![one(3, true, Healthy)] },
            DaemonHost { wanted: true, open: false, replicas: vec![] },
            host(vec![one(4, true, Stopping)]),
        ];
        let p = plan_daemon(b, &hosts, true);
        assert_eq!(p.start_on, vec![0], "not the closed host, nor the one whose replica is still stopping");
        assert_eq!(p.stop, vec![(2, DaemonStop::Extra), (3, DaemonStop::HostLeft)]);
        assert_eq!(plan_daemon(b, &hosts, false).start_on, Vec::<usize>::new());
    }

    /// A daemon rollout, step by step as the server runs it: stopped replicas are gone at the
    /// next step, new ones healthy the step after. Never fewer healthy hosts than the minimum
    /// (once it is reached), never two replicas on a host.
    #[test]
    fn a_daemon_replaces_in_place_within_its_minimum() {
        for (min, n) in [(0, 4), (50, 4), (75, 4), (100, 3), (50, 1)] {
            let config =
                DeploymentConfiguration { minimum_healthy_percent: min, ..DeploymentConfiguration::daemon() };
            let b = Bounds::new(n, &config, false);
            let mut hosts: Vec<DaemonHost<u32>> =
                (0..n).map(|i| host(vec![one(i, false, Healthy)])).collect();
            let mut next = 100;
            let mut done = false;
            for _ in 0..20 {
                for h in &mut hosts {
                    h.replicas.retain(|r| r.state != Stopping);
                    h.replicas.iter_mut().filter(|r| r.state == Starting).for_each(|r| r.state = Healthy);
                }
                let p = plan_daemon(b, &hosts, true);
                if p.stop.is_empty() && p.start_on.is_empty() {
                    done = true;
                    break;
                }
                for (id, why) in &p.stop {
                    assert_eq!(*why, DaemonStop::Replaced);
                    let r =
                        hosts.iter_mut().flat_map(|h| h.replicas.iter_mut()).find(|r| r.id == *id).unwrap();
                    r.state = Stopping;
                }
                for &i in &p.start_on {
                    next += 1;
                    hosts[i].replicas.push(one(next, true, Starting));
                }
                let healthy = hosts.iter().filter(|h| h.replicas.iter().any(|r| r.state == Healthy)).count();
                assert!(healthy as u32 >= b.min_healthy, "min {min}: {healthy} healthy hosts");
                assert!(hosts.iter().all(|h| h.replicas.len() <= 1));
            }
            assert!(done, "min {min}, {n} hosts: the rollout did not end");
            assert!(hosts.iter().all(|h| h.replicas.len() == 1 && h.replicas[0].current));
        }
    }
}
