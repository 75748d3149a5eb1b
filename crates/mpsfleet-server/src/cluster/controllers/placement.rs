//! The placement controller (`Work::Placement`): a pool's waiting tasks placed where they
//! now fit, highest priority first and then oldest first, in one commit, by the rules of
//! `cluster/place.rs`. A task that fits nowhere may preempt lower-priority tasks where its pool
//! lets it (`controllers/preemption.rs`): it then waits, holding the room, until they have
//! stopped. Nothing here writes a host; a waiting task's reason is derived state, refreshed in
//! memory, not written on every try.

use super::preemption::{Held, Holds, Preempted};
use super::Ctx;
use crate::cluster::error::Error;
use crate::cluster::kinds::TASK;
use crate::cluster::place::{apply_placement, request_for, scaling_note, waiting_reason};
use mpsfleet_core::changes::TaskChange;
use mpsfleet_core::controller::Action;
use mpsfleet_core::scheduler::{Placement, Request};
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::{PendingCode, PoolName, Task, TaskStatus};
use std::cmp::Reverse;

/// What placement knows beyond the state: managed scaling's launches in progress for the pool,
/// and whether a `local` provider's agents run containers.
pub(in crate::cluster) struct Outlook {
    pub(in crate::cluster) launching: usize,
    pub(in crate::cluster) local_runs_images: bool,
}

/// The placement controller. What it keeps between runs is the preemptors' holds, lent to
/// each reconcile.
pub(in crate::cluster) struct Placer;

impl Placer {
    /// Tries to place the waiting tasks of `pool`, highest priority first, then oldest, in
    /// one batch; a failed commit gives back what the batch reserved.
    pub(in crate::cluster) fn reconcile(
        ctx: &mut Ctx<'_>,
        pool: &PoolName,
        o: &Outlook,
        holds: &mut Holds,
    ) -> Result<Action, Error> {
        let now = ctx.now_ms;
        let w = &mut ctx.w;
        holds.settle(w, pool);
        let mut waiting = w.state.tasks().pending_in(pool);
        waiting.sort_by_key(|id| Reverse(w.state.tasks().get(id).map_or(0, |e| e.task.priority)));
        let (scaling, scaling_out) = scaling_note(w.state, pool, o.launching);
        let mut placed: Vec<(Task, Placement, Request)> = Vec::new();
        let mut ops = Vec::new();
        let mut preempted = Preempted::default();
        for id in waiting {
            let Some(e) = w.state.tasks().get(&id) else { continue };
            if e.task.desired_status == TaskStatus::Stopped {
                continue;
            }
            let mut task = e.task.clone();
            let version = e.version;
            let req = request_for(w.state, w.sched, &task, now)?;
            let outcome = match holds.check(w, &id) {
                Some(Held::Waiting(why)) => {
                    if w.state.set_pending_reason(&id, &why, PendingCode::Preempting, false) {
                        w.record_task(id, vec![TaskChange::Unplaced(why)]);
                    }
                    continue;
                }
                Some(Held::Ready(p)) => {
                    w.sched.reserve(&req, &p);
                    Ok(p)
                }
                Some(Held::Gone) | None => w.sched.place(&req),
            };
            match outcome {
                Ok(p) => {
                    apply_placement(w.state, w.sched, now, &mut task, &Ok(p.clone()), o.local_runs_images);
                    ops.push(Op::put_json(TASK, id.to_string(), &task, Precondition::Version(version))?);
                    placed.push((task, p, req));
                }
                Err(unplaced) => {
                    let (why, code) = match holds.make_room(w, &task, &req, &mut preempted) {
                        Some(why) => (why, PendingCode::Preempting),
                        None => {
                            let (why, code, unplaceable) =
                                waiting_reason(w.state, &task, &unplaced, o.local_runs_images);
                            let why = format!("{why}{scaling}");
                            let code = if scaling_out { PendingCode::ScalingOut } else { code };
                            if w.state.set_pending_reason(&id, &why, code, unplaceable) {
                                w.record_task(id, vec![TaskChange::Unplaced(why)]);
                            }
                            continue;
                        }
                    };
                    if w.state.set_pending_reason(&id, &why, code, false) {
                        w.record_task(id, vec![TaskChange::Unplaced(why)]);
                    }
                }
            }
        }
        if !preempted.is_empty() {
            if let Err(e) = preempted.write_or_undo(w, pool, holds) {
                if !placed.is_empty() {
                    w.write_placed(&ops, placed)?;
                }
                return Err(e);
            }
        }
        if placed.is_empty() {
            return Ok(Action::AwaitChange);
        }
        for (t, _, _) in &placed {
            mpsfleet_core::timeline!("placed", task = t.id);
        }
        w.write_placed(&ops, placed)?;
        Ok(Action::AwaitChange)
    }
}
