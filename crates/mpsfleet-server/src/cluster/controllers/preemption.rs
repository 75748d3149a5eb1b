//! Preemption, the placement controller's last resort (docs/pools.md "Priorities and
//! preemption"): a waiting task that fits nowhere, in a pool whose `preemption` policy lets it,
//! asks the scheduler which lower-priority tasks to stop (`Scheduler::preempt`, pure). Their
//! stop is planned as any other (out of discovery for their service's deregistration delay,
//! then SIGTERM and their `stopTimeout`), and the room they free is held for the preemptor
//! ([`Holds`]) so that nothing else takes it; the preemptor is placed there once they have
//! stopped. A victim's reason names the preemptor and both priorities; its service, the pool
//! and the incident the preemptor recovers from record the preemption, and it is counted.
//!
//! What this keeps between runs (lent by the dispatch) is the holds: the scheduler's
//! reservations, in memory. A server that restarts loses them; its placement asks again, and
//! the scheduler counts the victims already stopping as room coming free, so nothing more is
//! stopped for the same task.

use super::services::write_service;
use crate::cluster::error::Error;
use crate::cluster::state::PREEMPTION_NOTES;
use crate::cluster::write::Writer;
use mpsfleet_core::scheduler::{Placement, Preemption, Request, Tenant};
use mpsfleet_types::service::ObjectEvent;
use mpsfleet_types::{HostId, PoolName, ServiceName, Step, StopCode, Task, TaskId, TaskStatus};
use std::collections::{BTreeMap, HashMap};

/// Room held for a preemptor until its victims have stopped.
pub(in crate::cluster) struct Hold {
    pool: PoolName,
    /// The hold's own request (the preemptor's, as a hold), reserved at `placement`.
    req: Request,
    placement: Placement,
    /// The tasks whose stop frees the room.
    waits_for: Vec<TaskId>,
}

/// What a hold says when its task is looked at again.
pub(in crate::cluster) enum Held {
    /// The victims have stopped: the task takes the room (the hold is given back first).
    Ready(Placement),
    /// Still waiting, with the reason the task shows.
    Waiting(String),
    /// The hold no longer stands (host closed, a victim not stopping): given back; the task
    /// is placed as any other.
    Gone,
}

/// The preemptors' holds, by task.
#[derive(Default)]
pub(in crate::cluster) struct Holds(HashMap<TaskId, Hold>);

/// The most victim searches one placement pass makes: each scans the pool (a few ms at
/// 10,000 hosts), and a backlog of waiting tasks must not hold the controllers long. The
/// tasks a pass does not reach are searched for in the next (the next change of capacity, or
/// the resync within 5 s); a search that found nothing is not repeated in the same pass for a
/// task asking the same at no higher priority.
pub(in crate::cluster) const SEARCHES_PER_PASS: usize = 16;

impl Holds {
    /// Gives back the holds of `pool` whose task no longer waits (placed, stopped, removed).
    pub(in crate::cluster) fn settle(&mut self, w: &mut Writer<'_>, pool: &PoolName) {
        let gone: Vec<TaskId> = (self.0.iter())
            .filter(|(id, h)| {
                &h.pool == pool
                    && w.state.tasks().get(id).is_none_or(|e| {
                        e.task.host_id.is_some() || e.task.desired_status == TaskStatus::Stopped
                    })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(h) = self.0.remove(&id) {
                w.sched.release(&h.req, &h.placement);
            }
        }
    }

    /// Where the task's hold stands, if it has one.
    pub(in crate::cluster) fn check(&mut self, w: &mut Writer<'_>, id: &TaskId) -> Option<Held> {
        let h = self.0.get(id)?;
        let tasks = w.state.tasks();
        let left: Vec<TaskId> = (h.waits_for.iter())
            .filter(|v| tasks.get(v).is_some_and(|e| e.task.last_status != TaskStatus::Stopped))
            .copied()
            .collect();
        let broken = left.iter().any(|v| {
            tasks
                .get(v)
                .is_some_and(|e| e.task.desired_status != TaskStatus::Stopped && e.task.draining.is_none())
        });
        let open = w.sched.is_schedulable(h.placement.host)
            && h.placement.gpus.iter().all(|&g| !w.sched.gpu(g).mps_closed);
        if !left.is_empty() && !broken && open {
            let host = w.sched.host_id(h.placement.host);
            let names: Vec<String> = left.iter().map(|v| v.to_string()).collect();
            return Some(Held::Waiting(format!(
                "preempted {} task(s) on host {host} to make room; waits for {} to stop",
                h.waits_for.len(),
                names.join(", ")
            )));
        }
        let h = self.0.remove(id)?;
        w.sched.release(&h.req, &h.placement);
        Some(if left.is_empty() && open { Held::Ready(h.placement) } else { Held::Gone })
    }

    /// Makes room for `task` (which fits nowhere) if its pool lets it and a set of victims
    /// exists: their stops are added to `stops` (marked stopping in the scheduler at once, so
    /// that the next preemptor of the pass counts their room as taken), the room is held, and
    /// the reason the task waits with is returned.
    pub(in crate::cluster) fn make_room(
        &mut self,
        w: &mut Writer<'_>,
        task: &Task,
        req: &Request,
        done: &mut Preempted,
    ) -> Option<String> {
        let pool = w.state.pools().get(&task.pool)?;
        if !pool.value.preemption.allows(task.recovery_from.is_some()) {
            return None;
        }
        // A search that found nothing for a priority finds nothing for a lower one asking the
        // same: it is not made again in this pass.
        let no_set_for =
            |(p, d): &(u8, Request)| *p >= task.priority && d.demand == req.demand && d.needs == req.needs;
        if done.fruitless.iter().any(no_set_for) {
            return None;
        }
        if done.searches >= SEARCHES_PER_PASS {
            return None;
        }
        done.searches += 1;
        let Some(Preemption { placement, victims, awaits, .. }) = w.sched.preempt(req, w.now_ms) else {
            done.fruitless.push((task.priority, *req));
            return None;
        };
        // Every victim must be a live task placed there: the scheduler's tenants follow the
        // records, and a mismatch is refused rather than acted on.
        let host_ix = placement.host;
        let live_there = |id: &u64| {
            w.state.tasks().get(&TaskId(*id)).is_some_and(|e| {
                e.task.last_status != TaskStatus::Stopped
                    && e.placement.as_ref().is_some_and(|p| p.host == host_ix)
            })
        };
        if !victims.iter().chain(&awaits).all(live_there) {
            tracing::error!(task.id = %task.id, "preemption chose a task that is not placed there; not acted on");
            return None;
        }
        let hold_req = Request { tenant: req.tenant.map(|t| Tenant { hold: true, ..t }), ..*req };
        w.sched.reserve(&hold_req, &placement);
        let host = w.sched.host_id(placement.host).clone();
        let mut waits_for: Vec<TaskId> = awaits.into_iter().map(TaskId).collect();
        for v in victims.into_iter().map(TaskId) {
            let Some(e) = w.state.tasks().get(&v) else { continue };
            let victim = e.task.clone();
            let reason = format!(
                "preempted: stopped to make room on host {host} for task {} (priority {}), this task's priority \
                 being {}",
                task.id, task.priority, victim.priority
            );
            let delay = (victim.group.as_ref())
                .and_then(|g| w.state.services().get(g))
                .map_or(0, |s| s.value.deregistration_delay_seconds);
            let record = w.reader().planned_stop(&victim, delay, StopCode::Preempted, &reason, w.now_ms);
            let protected = victim.labels.as_ref().and_then(|l| l.protected_until_ms).unwrap_or(0);
            w.sched.set_tenant(placement.host, v.0, true, protected, victim.priority);
            done.stops.push(record);
            done.notes.push(Note {
                victim: v,
                victim_priority: victim.priority,
                service: victim.group.clone(),
                host: host.clone(),
                preemptor: task.id,
                priority: task.priority,
                recovery_from: task.recovery_from.clone(),
            });
            waits_for.push(v);
        }
        let names: Vec<String> = waits_for.iter().map(|v| v.to_string()).collect();
        let why = format!(
            "preempted {} task(s) on host {host} to make room; waits for {} to stop",
            waits_for.len(),
            names.join(", ")
        );
        self.0.insert(task.id, Hold { pool: task.pool.clone(), req: hold_req, placement, waits_for });
        Some(why)
    }

    /// Gives back the holds of `preemptors`, whose victims' stops were not committed, and
    /// counts the victims as their records say again.
    fn undo(&mut self, w: &mut Writer<'_>, preemptors: &[TaskId], victims: &[TaskId]) {
        for p in preemptors {
            if let Some(h) = self.0.remove(p) {
                w.sched.release(&h.req, &h.placement);
            }
        }
        for v in victims {
            if let Some(e) = w.state.tasks().get(v) {
                let t = &e.task;
                if let Some(p) = &e.placement {
                    let protected = t.labels.as_ref().and_then(|l| l.protected_until_ms).unwrap_or(0);
                    let stopping = t.desired_status == TaskStatus::Stopped || t.draining.is_some();
                    w.sched.set_tenant(p.host, v.0, stopping, protected, t.priority);
                }
            }
        }
    }
}

/// One preemption, as its records and events tell it.
pub(in crate::cluster) struct Note {
    victim: TaskId,
    victim_priority: u8,
    service: Option<ServiceName>,
    host: HostId,
    preemptor: TaskId,
    priority: u8,
    recovery_from: Option<HostId>,
}

impl Note {
    fn words(&self) -> String {
        format!(
            "preempted {} (priority {}) on {} to make room for {} (priority {})",
            self.victim, self.victim_priority, self.host, self.preemptor, self.priority
        )
    }
}

/// A placement pass's preemptions: the victims' stops, what to record of each, and the
/// searches made.
#[derive(Default)]
pub(in crate::cluster) struct Preempted {
    stops: Vec<Task>,
    notes: Vec<Note>,
    searches: usize,
    /// Requests (with their priority) for which no set exists now.
    fruitless: Vec<(u8, Request)>,
}

impl Preempted {
    pub(in crate::cluster) fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// [`Preempted::write`]; when the victims' stops are not committed, the holds made for
    /// them are given back and the victims counted as before.
    pub(in crate::cluster) fn write_or_undo(
        self,
        w: &mut Writer<'_>,
        pool: &PoolName,
        holds: &mut Holds,
    ) -> Result<(), Error> {
        let preemptors: Vec<TaskId> = self.notes.iter().map(|n| n.preemptor).collect();
        let victims: Vec<TaskId> = self.notes.iter().map(|n| n.victim).collect();
        let committed = w.write_tasks(self.stops.clone());
        if let Err(e) = committed {
            holds.undo(w, &preemptors, &victims);
            return Err(e);
        }
        Preempted { stops: Vec::new(), notes: self.notes, ..Default::default() }.record(w, pool)
    }

    /// Records each committed preemption: the victim's event, its service's (with
    /// `preemptedAtMs`, which shields its later replicas for the backoff), the pool's, the
    /// incident about the host the preemptor recovers from (or the host's notes, for an
    /// incident that opens later), and the metric.
    fn record(self, w: &mut Writer<'_>, pool: &PoolName) -> Result<(), Error> {
        let notes = self.notes;
        let now = w.now_ms;
        let mut by_service: BTreeMap<ServiceName, Vec<String>> = BTreeMap::new();
        for n in &notes {
            w.live.preempted(pool, n.victim_priority, n.priority);
            w.record_task(n.victim, vec![mpsfleet_core::changes::TaskChange::Preempted(n.words())]);
            if let Some(s) = &n.service {
                by_service.entry(s.clone()).or_default().push(n.words());
            }
            tracing::info!(task.id = %n.victim, preemptor = %n.preemptor, host.id = %n.host, "preempted");
            if let Some(from) = &n.recovery_from {
                note_for_incident(w, from, now, n.words())?;
            }
        }
        for (name, words) in by_service {
            let Some(mut svc) = w.state.services().get(&name).map(|v| v.value.clone()) else { continue };
            svc.preempted_at_ms = Some(now);
            for msg in words {
                svc.events.push(now, ObjectEvent::new("Preempted", msg));
            }
            write_service(w, svc)?;
            w.ask(crate::cluster::work::Work::Service(name));
        }
        let all: Vec<String> = notes.iter().map(Note::words).collect();
        if !all.is_empty() {
            w.pool_event(pool, "Preempted", all.join("; "))?;
        }
        Ok(())
    }
}

/// Records a preemption on the unresolved incident about `host`, or keeps it on the host for
/// the incident that opens about it (a restart copy starts before the incident opens).
fn note_for_incident(w: &mut Writer<'_>, host: &HostId, at: u64, words: String) -> Result<(), Error> {
    let open = w.state.incidents().unresolved().find(|i| &i.host_id == host).cloned();
    if let Some(mut incident) = open {
        incident.push(at, Step::Preempted, words, None);
        return w.write_incident(incident);
    }
    if let Some(ix) = w.sched.host(host) {
        let notes = &mut w.state.host_mut(ix).preemptions;
        notes.push((at, words));
        if notes.len() > PREEMPTION_NOTES {
            notes.remove(0);
        }
    }
    Ok(())
}
