//! DAEMON services (ECS's `schedulingStrategy: DAEMON`): one task on each ACTIVE host of the
//! service's pool. The desired count is the pool's ACTIVE hosts, kept up to date at every
//! reconcile; a host that joins gets a task, one that drains or leaves has its task stopped
//! (and not started anywhere else); a new deployment replaces each host's task in place, the
//! old one stopping before the new one starts there. The pure planner is
//! `mpsfleet_core::deployment::plan_daemon`; this file gathers its input and carries out its
//! answer. A host that opens or closes asks for the pool's DAEMON services (`Writer::apply`).

use crate::cluster::error::Error;
use crate::cluster::write::Writer;
use mpsfleet_core::deployment::{self, Bounds, DaemonHost, DaemonStop, Replica};
use mpsfleet_core::scheduler::HostIx;
use mpsfleet_types::service::ObjectEvent;
use mpsfleet_types::{HostStatus, Service, ServiceStatus, StopCode, Task, TaskId};
use std::collections::BTreeMap;

/// One step of a DAEMON service: its desired count follows the pool's ACTIVE hosts, then
/// the planner's stops and starts are written, and the service's events say what was done.
/// Returns the bounds the step kept to, for settling its deployments.
pub(in crate::cluster) fn daemon_step(
    w: &mut Writer<'_>,
    svc: &mut Service,
    may_start: bool,
    now: u64,
) -> Result<Bounds, Error> {
    let deleted = svc.status == ServiceStatus::Draining;
    // Every host of the pool by index, wanted when ACTIVE; then the service's tasks on them.
    let mut hosts: BTreeMap<HostIx, DaemonHost<TaskId>> = BTreeMap::new();
    for (ix, e) in w.state.hosts().iter().enumerate() {
        let h = e.host();
        if h.pool == svc.pool && h.status != HostStatus::Deregistered {
            let wanted = !deleted && h.status == HostStatus::Active;
            let open = w.sched.is_schedulable(ix as HostIx);
            hosts.insert(ix as HostIx, DaemonHost { wanted, open, replicas: Vec::new() });
        }
    }
    let desired = hosts.values().filter(|h| h.wanted).count() as u32;
    if svc.desired_count != desired {
        svc.desired_count = desired;
        if let Some(d) = svc.deployments.first_mut() {
            d.desired_count = desired;
        }
    }
    let bounds = Bounds::new(desired, &svc.deployment_configuration, false);
    // A task on no known host of the pool is stopped, as one whose host left.
    let mut nowhere = DaemonHost { wanted: false, open: false, replicas: Vec::new() };
    let forced_at = svc.deployments.first().and_then(|d| d.forced_at_ms);
    for id in w.state.tasks().of_service(&svc.name) {
        let Some(e) = w.state.tasks().get(id) else { continue };
        let t = &e.task;
        let replica = Replica {
            id: t.id,
            current: t.task_definition == svc.task_definition
                && forced_at.is_none_or(|at| t.created_at_ms >= at),
            state: w.reader().replica_state(t),
            seq: e.seq,
        };
        let on =
            e.placement.as_ref().map(|p| p.host).or_else(|| t.host_id.as_ref().and_then(|h| w.sched.host(h)));
        match on.and_then(|ix| hosts.get_mut(&ix)) {
            Some(h) => h.replicas.push(replica),
            None => nowhere.replicas.push(replica),
        }
    }
    let order: Vec<HostIx> = hosts.keys().copied().collect();
    let mut input: Vec<DaemonHost<TaskId>> = hosts.into_values().collect();
    input.push(nowhere);
    let plan = deployment::plan_daemon(bounds, &input, may_start);

    let mut stops = Vec::with_capacity(plan.stop.len());
    let (mut left, mut extra, mut replaced) = (0, 0, 0);
    for (id, why) in &plan.stop {
        let Some(e) = w.state.tasks().get(id) else { continue };
        let reason = match why {
            DaemonStop::HostLeft => {
                left += 1;
                if deleted { "service deleted" } else { "its host is no longer ACTIVE in the pool" }
                    .to_string()
            }
            DaemonStop::Extra => {
                extra += 1;
                "its host runs another task of the DAEMON service".to_string()
            }
            DaemonStop::Replaced => {
                replaced += 1;
                format!(
                    "replaced by a task of {} (deployment {})",
                    svc.task_definition, svc.deployments[0].id
                )
            }
        };
        stops.push(w.reader().stopped_record(&e.task, StopCode::ServiceSchedulerInitiated, &reason));
    }
    w.write_tasks(stops)?;
    if left > 0 && !deleted {
        let msg = format!("stopped {left} task(s) on hosts no longer ACTIVE in pool {}", svc.pool);
        svc.events.push(now, ObjectEvent::new("ScaledIn", msg));
    }
    if extra > 0 {
        let msg = format!("stopped {extra} task(s) on hosts that ran another task of the service");
        svc.events.push(now, ObjectEvent::new("ScaledIn", msg));
    }
    if replaced > 0 {
        let msg = format!(
            "stopped {replaced} task(s) of older definitions, each host's replacement starting once it has stopped (at least {} of {desired} host(s) kept healthy)",
            bounds.min_healthy
        );
        svc.events.push(now, ObjectEvent::new("TasksReplaced", msg));
    }

    let (mut started, mut unplaced) = (Vec::new(), Vec::new());
    for i in plan.start_on {
        let ix = order[i];
        let task = Task::new(
            w.next_task_id(),
            svc.task_definition.clone(),
            svc.pool.clone(),
            Some(svc.name.clone()),
            format!("service:{}", svc.name),
            now,
        );
        let host = w.sched.host_id(ix).clone();
        match w.start_one_on(task, ix)? {
            Ok(_) => started.push(host.to_string()),
            Err(why) => unplaced.push(format!("{host}: {why}")),
        }
    }
    if !started.is_empty() {
        let msg =
            format!("started {} task(s) of {} on {}", started.len(), svc.task_definition, started.join(", "));
        svc.events.push(now, ObjectEvent::new("TasksStarted", msg));
    }
    if !unplaced.is_empty() {
        let msg = format!("unable to place a task on {} host(s): {}", unplaced.len(), unplaced.join("; "));
        svc.events.push(now, ObjectEvent::new("Unplaceable", msg));
    }
    Ok(bounds)
}
