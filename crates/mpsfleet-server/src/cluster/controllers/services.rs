//! The services controller (`Work::Service`): one service's rollout, replicas and
//! deployments, a reconcile at a time. It takes where every replica stands, asks the pure
//! planner (`mpsfleet_core::deployment::plan`) what the deployment's bounds allow now, stops
//! (a replica in traffic drains first: `Reader::planned_stop`) and starts that, spreads the
//! replicas again once nothing else moves (`rebalance`), and settles the deployments: the
//! PRIMARY one completes once all its desired tasks are healthy and no older task is left; an
//! older one turns INACTIVE when its last task has stopped. A DAEMON service's step is
//! `controllers/daemon.rs`. Creating, updating and deleting a service, and a failed task's
//! count toward the circuit breaker, are requests' and reports' (`cluster/services.rs`).
//! Only core's `lifecycle::service` changes a service's or a deployment's status.

use super::daemon::daemon_step;
use super::Ctx;
use crate::cluster::deleted::DeletedObject;
use crate::cluster::error::Error;
use crate::cluster::kinds::SERVICE;
use crate::cluster::place;
use crate::cluster::state::Change;
use crate::cluster::write::Writer;
use crate::cluster::write_tasks::NewTasks;
use mpsfleet_core::controller::Action;
use mpsfleet_core::deployment::{self, Bounds, Replica, ReplicaState, StopWhy};
use mpsfleet_core::lifecycle::service as service_lifecycle;
use mpsfleet_core::scheduler::{HostIx, Request};
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::event::{EventType, Subject};
use mpsfleet_types::policy::ResumptionBoundary;
use mpsfleet_types::service::{
    Deployment, DeploymentStatus, ObjectEvent, RolloutState, SchedulingStrategy, DEPLOYMENTS_KEPT,
};
use mpsfleet_types::{
    HostId, Service, ServiceName, ServiceStatus, StopCode, Task, TaskDefRef, TaskId, TaskStatus,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// A service whose tasks failed this many times within the window gets no replacement until
/// the oldest failure leaves the window (crash-loop backoff).
pub const SERVICE_RESTART_BURST: usize = 5;
pub const SERVICE_RESTART_WINDOW_MS: u64 = 30_000;

/// The services controller. What it keeps between runs is each service's recent task
/// failures (for the crash-loop hold-back), lent to each reconcile.
pub(in crate::cluster) struct Services;

impl Services {
    /// Takes the step of the service's rollout that its bounds allow now (module docs), then
    /// settles its deployments. A deleted service goes once its last task has stopped. Says
    /// when to run again: when a hold-back or a settle time it waits for ends, or not until
    /// something changes.
    pub(in crate::cluster) fn reconcile(
        ctx: &mut Ctx<'_>,
        name: &ServiceName,
        failures: &mut HashMap<ServiceName, VecDeque<u64>>,
    ) -> Result<Action, Error> {
        let w = &mut ctx.w;
        let Some(mut svc) = w.state.services().get(name).map(|v| v.value.clone()) else {
            return Ok(Action::AwaitChange);
        };
        let before = svc.clone();
        let now = w.now_ms;
        if svc.deployments.is_empty() {
            // A record from before deployments: its current definition is one in progress.
            start_deployment(&mut svc, now, "deployments began".into());
        }
        let failed = svc.deployments[0].rollout_state == RolloutState::Failed;
        let held = !failed && failing_too_fast(failures, name, now);
        // When to run again by itself: once the oldest failure leaves the hold-back's window.
        let mut wake = if held {
            failures.get(name).and_then(|f| f.front()).map(|t| t + SERVICE_RESTART_WINDOW_MS + 1)
        } else {
            None
        };
        if held && svc.events.last().is_none_or(|e| e.reason != "ReplacementsHeldBack") {
            let latest = svc.deployments[0].failures.last().map(|g| g.reason.clone());
            let msg = format!(
                "replacements held back: {SERVICE_RESTART_BURST} task(s) failed within {} s{}; the next start waits until that slows",
                SERVICE_RESTART_WINDOW_MS / 1000,
                latest.map(|r| format!(" (latest: {r})")).unwrap_or_default()
            );
            svc.events.push(now, ObjectEvent::new("ReplacementsHeldBack", msg));
        }
        let may_start = !failed && !held;
        if svc.scheduling_strategy == SchedulingStrategy::Daemon {
            let bounds = daemon_step(w, &mut svc, may_start, now)?;
            let replicas = w.reader().replicas(&svc);
            return settle_and_write(w, svc, before, &replicas, &bounds, wake, now);
        }
        let fenced = svc.resumption == ResumptionBoundary::Fenced;
        let bounds = Bounds::new(svc.desired_count, &svc.deployment_configuration, fenced);
        let live = w.state.tasks().of_service(name);
        svc.moving.retain(|id| live.contains(id));
        let mut replicas = w.reader().replicas(&svc);
        // A replica marked as moving is no longer current.
        if may_start && svc.moving.is_empty() && rebalance(w, &mut svc, &replicas, now) {
            replicas = w.reader().replicas(&svc);
        }
        let mut plan = deployment::plan(bounds, &replicas, may_start);
        // A protected task stays until its protection ends; the service looks again then.
        plan.stop.retain(|(id, _)| match w.state.tasks().get(id).and_then(|e| e.task.protected_until(now)) {
            Some(until) => {
                wake = Some(wake.map_or(until, |w| w.min(until)));
                false
            }
            None => true,
        });
        let unchanged = plan.stop.is_empty() && plan.start == 0;

        let mut to_stop = Vec::with_capacity(plan.stop.len());
        let (mut replaced, mut moved, mut scaled_in) = (0, 0, 0);
        for (id, why) in &plan.stop {
            let Some(e) = w.state.tasks().get(id) else { continue };
            let reason = match why {
                StopWhy::Replaced => {
                    if svc.moving.contains(id) {
                        moved += 1;
                        "moved to spread the service's replicas over daemons".to_string()
                    } else {
                        replaced += 1;
                        format!(
                            "replaced by a task of {} (deployment {})",
                            svc.task_definition, svc.deployments[0].id
                        )
                    }
                }
                StopWhy::ScaledIn => {
                    scaled_in += 1;
                    "service scaled in".to_string()
                }
            };
            let delay = svc.deregistration_delay_seconds;
            let record =
                w.reader().planned_stop(&e.task, delay, StopCode::ServiceSchedulerInitiated, &reason, now);
            if let Some(d) = &record.draining {
                wake = Some(wake.map_or(d.until_ms, |w| w.min(d.until_ms)));
            }
            to_stop.push(record);
        }
        // Replicas whose time out of traffic is over get their stop now.
        for id in w.state.tasks().of_service(name) {
            let Some(e) = w.state.tasks().get(id) else { continue };
            match &e.task.draining {
                Some(d) if e.task.desired_status != TaskStatus::Stopped && d.until_ms <= now => {
                    to_stop.push(w.reader().stopped_record(&e.task, d.stop_code, &d.reason));
                }
                Some(d) if e.task.desired_status != TaskStatus::Stopped => {
                    wake = Some(wake.map_or(d.until_ms, |w| w.min(d.until_ms)));
                }
                _ => {}
            }
        }
        let unchanged = unchanged && to_stop.is_empty();
        w.write_tasks(to_stop)?;
        if replaced > 0 {
            let msg = format!("stopped {replaced} task(s) of older definitions ({})", bounds_words(&bounds));
            svc.events.push(now, ObjectEvent::new("TasksReplaced", msg));
        }
        if moved > 0 {
            let msg = format!(
                "stopped {moved} task(s) to move them to a daemon of their own ({})",
                bounds_words(&bounds)
            );
            svc.events.push(now, ObjectEvent::new("TasksMoved", msg));
        }
        if scaled_in > 0 {
            let msg = format!("stopped {scaled_in} task(s) beyond the desired count");
            svc.events.push(now, ObjectEvent::new("ScaledIn", msg));
        }
        if plan.start > 0 {
            let started = start_replicas(w, &svc, plan.start)?;
            // Replicas on a failed daemon (the pool's `restartCopies`) are not counted: their copies
            // start now, and the service runs more than its count until they stop or their
            // daemon answers again (at least once, never fewer).
            let at_risk = (w.state.tasks().of_service(name).iter())
                .filter_map(|id| w.state.tasks().get(id))
                .filter(|e| e.task.desired_status != TaskStatus::Stopped && w.reader().at_risk(&e.task))
                .count();
            let why = if at_risk > 0 {
                format!(
                    " for {at_risk} replica(s) on a failed MPS daemon (the service runs above its count until \
                     they stop or their daemon answers again)"
                )
            } else {
                String::new()
            };
            push_started(&mut svc, &started, why, now);
        }
        // Tasks stopped or started: their replicas are looked at again.
        let replicas = if unchanged { replicas } else { w.reader().replicas(&svc) };
        settle_and_write(w, svc, before, &replicas, &bounds, wake, now)
    }
}

/// The end of every reconcile: settles the deployments, removes a deleted service whose
/// last task has stopped, writes what changed, and says when to run again (`wake`).
fn settle_and_write(
    w: &mut Writer<'_>,
    mut svc: Service,
    before: Service,
    replicas: &[Replica<TaskId>],
    bounds: &Bounds,
    wake: Option<u64>,
    now: u64,
) -> Result<Action, Error> {
    let name = svc.name.clone();
    settle_deployments(w, &mut svc, replicas, bounds, now);
    if svc.status == ServiceStatus::Draining && w.state.tasks().of_service(&name).is_empty() {
        // Kept as ECS's INACTIVE service for a while, in the commit that removes it.
        let version = w.state.services().get(&name).map_or(0, |v| v.version);
        svc.updated_at_ms = now;
        let (mut ops, kept) = w.keep_deleted(DeletedObject::Service(Box::new(svc)))?;
        ops.push(Op::delete(SERVICE, name.as_str(), Precondition::Version(version)));
        let rev = w.write(&ops, [Change::ServiceRemoved(name.clone())])?;
        w.kept_deleted(rev, kept);
        return Ok(Action::AwaitChange);
    }
    if svc != before {
        svc.updated_at_ms = now;
        write_service(w, svc)?;
    }
    Ok(match wake {
        Some(t) => Action::RequeueAfter(t.saturating_sub(now).max(1)),
        None => Action::AwaitChange,
    })
}

/// Spreads replicas again once nothing else moves (the PRIMARY deployment completed, every
/// replica current and healthy: no recovery of the service under way; a `fenced` service
/// only when its configuration opts in). Replicas are marked as moving, and the rollout
/// replaces them within the deployment bounds:
/// - over hosts first: while the scheduler would place a new replica on a host holding at
///   least two fewer of the service's replicas than the most crowded one, the newest
///   replica there moves; as many at once as the deployment's surge (`maximumPercent`
///   above the desired count) can start, each placed in turn, so a large imbalance is
///   spread in one step rather than one replica per rollout;
/// - else one replica that shares its daemon (a GPU, or a host for a task without GPUs)
///   while the scheduler would place it on a daemon with none.
fn rebalance(w: &mut Writer<'_>, svc: &mut Service, replicas: &[Replica<TaskId>], now: u64) -> bool {
    let fenced = svc.resumption == ResumptionBoundary::Fenced;
    if svc.status != ServiceStatus::Active
        || svc.deployments.first().is_none_or(|d| d.rollout_state != RolloutState::Completed)
        || (fenced && !svc.deployment_configuration.rebalance_fenced)
    {
        return false;
    }
    if replicas.len() != svc.desired_count as usize
        || replicas.iter().any(|r| !r.current || r.state != ReplicaState::Healthy)
    {
        return false;
    }
    let bounds = Bounds::new(svc.desired_count, &svc.deployment_configuration, fenced);
    let at_once = bounds.max_total.saturating_sub(bounds.desired).max(1) as usize;
    let mut per_host: BTreeMap<HostIx, Vec<(u64, TaskId)>> = BTreeMap::new();
    for r in replicas {
        if let Some(p) = w.state.tasks().get(&r.id).and_then(|e| e.placement.as_ref()) {
            per_host.entry(p.host).or_default().push((r.seq, r.id));
        }
    }
    let pinned = awaited_replacements(w);
    let moves = host_moves(w, per_host, at_once, &pinned);
    let msg = match moves.as_slice() {
        [] => match daemon_move(w, replicas, &pinned) {
            Some((id, msg)) => {
                svc.moving.push(id);
                msg
            }
            None => return false,
        },
        [m] => format!(
            "moving task {} off host {}, which holds {} of the service's replicas, to host {}, which holds {}",
            m.task, m.from, m.from_held, m.to, m.to_held
        ),
        many => {
            let listed: Vec<String> = many
                .iter()
                .take(5)
                .map(|m| format!("{} off host {} ({}) to host {} ({})", m.task, m.from, m.from_held, m.to, m.to_held))
                .collect();
            let more = many.len().saturating_sub(listed.len());
            let more = if more > 0 { format!(", and {more} more") } else { String::new() };
            format!(
                "moving {} tasks to spread the service's replicas over hosts (replicas each host held): {}{more}",
                many.len(),
                listed.join(", ")
            )
        }
    };
    svc.moving.extend(moves.iter().map(|m| m.task));
    svc.events.push(now, ObjectEvent::new("ReplicaMoved", msg));
    true
}

/// The replacements unresolved incidents wait for to run (not yet TASKS_RUNNING_AGAIN): a
/// move would stop the very task an incident waits for (a preemptor placed beside its sibling
/// on the one host with room, say), so none of them is moved.
fn awaited_replacements(w: &Writer<'_>) -> BTreeSet<TaskId> {
    (w.state.incidents().unresolved())
        .filter(|i| !i.has(mpsfleet_types::Step::TasksRunningAgain))
        .flat_map(|i| i.affected_tasks.iter().filter_map(|a| a.replacement))
        .collect()
}

/// Up to `at_once` moves that spread the replicas (`per_host`: each host's replicas of the
/// service, with their sequence numbers) over hosts: the newest replica of the most
/// crowded host, to where the scheduler would place it, while that host holds at least two
/// fewer. Each move's placement is held while the next is chosen, then all are given back:
/// the rollout places the replacements.
fn host_moves(
    w: &mut Writer<'_>,
    mut per_host: BTreeMap<HostIx, Vec<(u64, TaskId)>>,
    at_once: usize,
    pinned: &BTreeSet<TaskId>,
) -> Vec<HostMove> {
    let mut held = Vec::new();
    let mut moves = Vec::new();
    let mut arriving: BTreeMap<HostIx, usize> = BTreeMap::new();
    let count = |per_host: &BTreeMap<HostIx, Vec<(u64, TaskId)>>, arriving: &BTreeMap<HostIx, usize>, h| {
        per_host.get(&h).map_or(0, Vec::len) + arriving.get(&h).copied().unwrap_or(0)
    };
    while moves.len() < at_once {
        // The most crowded host (the first among equals) and its newest replica.
        let Some(from) = per_host
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(h, _)| *h)
            .max_by_key(|h| (count(&per_host, &arriving, *h), std::cmp::Reverse(*h)))
        else {
            break;
        };
        let Some(&(_, id)) = per_host[&from].iter().filter(|(_, t)| !pinned.contains(t)).max() else { break };
        let Some(task) = w.state.tasks().get(&id).map(|e| e.task.clone()) else { break };
        let Ok(req) = place::request_for(w.state, w.sched, &task, w.now_ms) else { break };
        // A trial placement, given back below: it names no tenant, so that giving it back
        // cannot take the task's own entry off the scheduler's host.
        let req = Request { tenant: None, ..req };
        let Ok(p) = w.sched.place(&req) else { break };
        let (from_held, to_held) = (count(&per_host, &arriving, from), count(&per_host, &arriving, p.host));
        let to = p.host;
        held.push((req, p));
        if to_held + 2 > from_held {
            break;
        }
        *arriving.entry(to).or_default() += 1;
        if let Some(v) = per_host.get_mut(&from) {
            v.retain(|(_, t)| *t != id);
        }
        let (from, to) = (w.sched.host_id(from).clone(), w.sched.host_id(to).clone());
        moves.push(HostMove { task: id, from, from_held, to, to_held });
    }
    for (req, p) in held.iter().rev() {
        w.sched.release(req, p);
    }
    moves
}

/// One replica that shares its daemon with another, when the scheduler would place it on
/// a daemon with none of the service's replicas; with the event's message.
fn daemon_move(
    w: &mut Writer<'_>,
    replicas: &[Replica<TaskId>],
    pinned: &BTreeSet<TaskId>,
) -> Option<(TaskId, String)> {
    let daemon = |id: &TaskId| {
        w.state.tasks().get(id).and_then(|e| e.placement.as_ref()).map(|p| (p.host, p.gpus.first().copied()))
    };
    let mut on: BTreeMap<Daemon, Vec<(u64, TaskId)>> = BTreeMap::new();
    for r in replicas {
        if let Some(d) = daemon(&r.id) {
            on.entry(d).or_default().push((r.seq, r.id));
        }
    }
    let &(_, id) = (on.values().filter(|v| v.len() > 1))
        .find_map(|v| v.iter().filter(|(_, t)| !pinned.contains(t)).max())?;
    let task = w.state.tasks().get(&id).map(|e| e.task.clone())?;
    // A trial placement (given back at once): no tenant, as in `host_moves`.
    let req = Request { tenant: None, ..place::request_for(w.state, w.sched, &task, w.now_ms).ok()? };
    // Where a new replica would go; given back at once.
    let p = w.sched.place(&req).ok()?;
    w.sched.release(&req, &p);
    if on.contains_key(&(p.host, p.gpus.first().copied())) {
        return None;
    }
    let from = match (&task.host_id, task.gpu_ids.first()) {
        (Some(h), Some(g)) => format!("GPU {g} of host {h}"),
        (Some(h), None) => format!("host {h}"),
        _ => return None,
    };
    let to = w.sched.host_id(p.host).clone();
    Some((id, format!("moving task {id} off {from}, which it shares with another replica, to a daemon with none (on host {to})")))
}

/// Completes the PRIMARY deployment once its desired tasks are all healthy and no older
/// task is left; retires an older deployment whose last task has stopped.
fn settle_deployments(
    w: &Writer<'_>,
    svc: &mut Service,
    replicas: &[Replica<TaskId>],
    bounds: &Bounds,
    now: u64,
) {
    let healthy_current =
        replicas.iter().filter(|r| r.current && r.state == ReplicaState::Healthy).count() as u32;
    let older_left = replicas.iter().any(|r| !r.current);
    let live_defs: BTreeSet<&TaskDefRef> = w
        .state
        .tasks()
        .of_service(&svc.name)
        .iter()
        .filter_map(|id| w.state.tasks().get(id))
        .map(|e| &e.task.task_definition)
        .collect();
    let primary_def = svc.task_definition.clone();
    let moving = !svc.moving.is_empty();
    let mut events = Vec::new();
    for (i, d) in svc.deployments.iter_mut().enumerate() {
        if i == 0 {
            let done = healthy_current >= bounds.desired && !older_left && !moving;
            if d.rollout_state == RolloutState::InProgress && done {
                let reason = format!("all {} task(s) of {} are healthy", bounds.desired, d.task_definition);
                let completed = service_lifecycle::DeploymentEvent::Completed { reason };
                if let Err(e) = service_lifecycle::apply_deployment(d, completed, now) {
                    tracing::warn!(deployment = %d.id, "{e}");
                    continue;
                }
                let msg = format!("deployment {} completed: the service reached a steady state", d.id);
                events.push(ObjectEvent::new("DeploymentCompleted", msg));
            }
            continue;
        }
        if d.status == DeploymentStatus::Active
            && (d.task_definition == primary_def || !live_defs.contains(&&d.task_definition))
        {
            if let Err(e) =
                service_lifecycle::apply_deployment(d, service_lifecycle::DeploymentEvent::Drained, now)
            {
                tracing::warn!(deployment = %d.id, "{e}");
            }
        }
    }
    for e in events {
        svc.events.push(now, e);
    }
    trim_deployments(svc);
}

/// Whether a service's tasks have failed so often lately that replacing them again now
/// would only feed a crash loop: at most `SERVICE_RESTART_BURST` failures per
/// `SERVICE_RESTART_WINDOW_MS`; the periodic resync replaces them once the window allows.
fn failing_too_fast(
    failures: &mut HashMap<ServiceName, VecDeque<u64>>,
    name: &ServiceName,
    now: u64,
) -> bool {
    let Some(failures) = failures.get_mut(name) else { return false };
    while failures.front().is_some_and(|&t| now.saturating_sub(t) > SERVICE_RESTART_WINDOW_MS) {
        failures.pop_front();
    }
    let too_fast = failures.len() >= SERVICE_RESTART_BURST;
    if too_fast {
        tracing::warn!(service = %name, failures = failures.len(), "tasks failing fast; replacement held back");
    }
    too_fast
}
pub(in crate::cluster) fn write_service(w: &mut Writer<'_>, svc: Service) -> Result<(), Error> {
    let version = w.state.services().get(&svc.name).map_or(0, |v| v.version);
    let op = Op::put_json(SERVICE, svc.name.as_str(), &svc, Precondition::Version(version))?;
    let seen = w.state.services().get(&svc.name).map_or(0, |v| v.value.events.pushed());
    w.write(&[op], [Change::Service(svc.clone())])?;
    publish_service_events(w, seen, &svc);
    Ok(())
}

/// Publishes the entries of a committed service's events after the first `seen`.
pub(in crate::cluster) fn publish_service_events(w: &Writer<'_>, seen: u64, svc: &Service) {
    let news: Vec<ObjectEvent> = svc.events.since(seen).iter().map(|e| e.event.clone()).collect();
    if !news.is_empty() {
        let subject = Subject { id: svc.name.to_string(), pool: svc.pool.clone() };
        w.events.recorded(EventType::ServiceEvent, &subject, &news, w.now_ms);
    }
}

/// A daemon a replica runs under: its host and first GPU, or its host alone without GPUs.
type Daemon = (HostIx, Option<u32>);

/// One replica the rebalancer moves to spread a service over hosts, with the replicas of the
/// service each host held when it was chosen.
struct HostMove {
    task: TaskId,
    from: HostId,
    from_held: usize,
    to: HostId,
    to_held: usize,
}

/// Makes a new PRIMARY deployment of the service's current definition; the previous PRIMARY
/// becomes ACTIVE (its tasks are replaced by the new one's).
pub(in crate::cluster) fn start_deployment(svc: &mut Service, now: u64, reason: String) {
    for d in &mut svc.deployments {
        if d.status == DeploymentStatus::Primary {
            // PRIMARY takes Superseded in every rollout state: this cannot fail.
            let _ =
                service_lifecycle::apply_deployment(d, service_lifecycle::DeploymentEvent::Superseded, now);
        }
    }
    let n = svc.next_deployment.max(1);
    svc.next_deployment = n + 1;
    let id = format!("d-{n}");
    let mut why = reason;
    if svc.resumption == ResumptionBoundary::Fenced {
        why.push_str("; fenced: each old task stops before its replacement starts (at most one copy)");
    }
    let msg = format!("deployment {id} of {}: {why}", svc.task_definition);
    svc.events.push(now, ObjectEvent::new("DeploymentStarted", msg));
    svc.deployments.insert(
        0,
        Deployment {
            id,
            status: DeploymentStatus::Primary,
            task_definition: svc.task_definition.clone(),
            desired_count: svc.desired_count,
            rollout_state: RolloutState::InProgress,
            rollout_state_reason: why,
            failed_tasks: 0,
            created_at_ms: now,
            updated_at_ms: now,
            failures: Vec::new(),
            forced_at_ms: None,
        },
    );
    trim_deployments(svc);
}

/// Keeps the newest [`DEPLOYMENTS_KEPT`] deployments, dropping the oldest INACTIVE ones.
pub(in crate::cluster) fn trim_deployments(svc: &mut Service) {
    while svc.deployments.len() > DEPLOYMENTS_KEPT {
        match svc.deployments.iter().rposition(|d| d.status == DeploymentStatus::Inactive) {
            Some(i) => {
                svc.deployments.remove(i);
            }
            None => break,
        }
    }
}

/// The bounds in words, for the service's events.
pub(in crate::cluster) fn bounds_words(b: &Bounds) -> String {
    let mut s = format!("at least {} healthy, at most {} in all", b.min_healthy, b.max_total);
    if b.one_at_a_time {
        s.push_str("; one at a time, since the configured bounds left no room");
    }
    s
}

/// Starts `count` replicas of `svc`; those that replace replicas lost to a failure (a copy of
/// one on a failed MPS daemon, a replica its host or daemon lost) start as recovery, naming
/// that host (`Task::recovery_from`): under the pool's `recovery` preemption only they may
/// make room in a full pool.
fn start_replicas(w: &mut Writer<'_>, svc: &Service, count: u32) -> Result<Vec<Task>, Error> {
    let mut hosts: Vec<HostId> = (w.state.tasks().of_service(&svc.name).iter())
        .filter_map(|id| w.state.tasks().get(id))
        .filter(|e| e.task.desired_status != TaskStatus::Stopped && w.reader().at_risk(&e.task))
        .filter_map(|e| e.task.host_id.clone())
        .take(count as usize)
        .collect();
    let more = count as usize - hosts.len();
    hosts.extend(w.state.take_lost_replicas(&svc.name, more, w.now_ms));
    let mut by_host: BTreeMap<HostId, u32> = BTreeMap::new();
    for h in hosts {
        *by_host.entry(h).or_default() += 1;
    }
    let mut started = Vec::with_capacity(count as usize);
    let mut left = count;
    for (host, n) in by_host {
        started.extend(w.start_tasks(NewTasks { recovery_from: Some(host), ..tasks_of(svc) }, n)?);
        left -= n;
    }
    if left > 0 {
        started.extend(w.start_tasks(tasks_of(svc), left)?);
    }
    for t in &started {
        mpsfleet_core::timeline!("replica-started", task = t.id, placed = t.host_id.is_some());
    }
    Ok(started)
}

/// What a service's new tasks are: its definition, in its pool, of its PRIMARY deployment.
pub(in crate::cluster) fn tasks_of(svc: &Service) -> NewTasks {
    NewTasks {
        task_definition: svc.task_definition.clone(),
        pool: svc.pool.clone(),
        group: Some(svc.name.clone()),
        started_by: format!("service:{}", svc.name),
        labels: Default::default(),
        deployment: svc.deployments.first().map(|d| d.id.clone()),
        priority: svc.priority,
        recovery_from: None,
        enable_execute_command: svc.enable_execute_command,
    }
}

/// The service's events for tasks it started (`why`: what the count is for, or empty), and
/// why those it could not place wait.
pub(in crate::cluster) fn push_started(svc: &mut Service, started: &[Task], why: String, now: u64) {
    if started.is_empty() {
        return;
    }
    let msg = format!("started {} task(s) of {}{why}", started.len(), svc.task_definition);
    svc.events.push(now, ObjectEvent::new("TasksStarted", msg));
    if let Some(reason) = started.iter().find_map(|t| t.pending_reason.clone()) {
        let waiting = started.iter().filter(|t| t.host_id.is_none()).count();
        let msg = format!("unable to place {waiting} task(s): {reason}");
        svc.events.push(now, ObjectEvent::new("Unplaceable", msg));
    }
}
