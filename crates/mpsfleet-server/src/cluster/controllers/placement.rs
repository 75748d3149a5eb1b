//! The placement controller (`Work::Placement`): a pool's waiting tasks placed where they
//! now fit, oldest first, in one commit, by the rules of `cluster/place.rs`. Nothing here
//! writes a host; a waiting task's reason is derived state, refreshed in memory, not written
//! on every try.

use super::Ctx;
use crate::cluster::error::Error;
use crate::cluster::kinds::TASK;
use crate::cluster::place::{apply_placement, request_for, scaling_note, waiting_reason};
use mpsfleet_core::changes::TaskChange;
use mpsfleet_core::controller::Action;
use mpsfleet_core::scheduler::{Placement, Request};
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::{PendingCode, PoolName, Task, TaskStatus};

/// What placement knows beyond the state: managed scaling's launches in progress for the pool,
/// and whether a `local` provider's agents run containers.
pub(in crate::cluster) struct Outlook {
    pub(in crate::cluster) launching: usize,
    pub(in crate::cluster) local_runs_images: bool,
}

/// The placement controller. It keeps nothing between its runs.
pub(in crate::cluster) struct Placer;

impl Placer {
    /// Tries to place the waiting tasks of `pool`, oldest first, in one batch; a failed commit
    /// gives back what the batch reserved.
    pub(in crate::cluster) fn reconcile(
        ctx: &mut Ctx<'_>,
        pool: &PoolName,
        o: &Outlook,
    ) -> Result<Action, Error> {
        let w = &mut ctx.w;
        let waiting = w.state.tasks().pending_in(pool);
        let (scaling, scaling_out) = scaling_note(w.state, pool, o.launching);
        let mut placed: Vec<(Task, Placement, Request)> = Vec::new();
        let mut ops = Vec::new();
        for id in waiting {
            let Some(e) = w.state.tasks().get(&id) else { continue };
            if e.task.desired_status == TaskStatus::Stopped {
                continue;
            }
            let mut task = e.task.clone();
            let version = e.version;
            let req = request_for(w.state, w.sched, &task)?;
            match w.sched.place(&req) {
                Ok(p) => {
                    apply_placement(
                        w.state,
                        w.sched,
                        ctx.now_ms,
                        &mut task,
                        &Ok(p.clone()),
                        o.local_runs_images,
                    );
                    ops.push(Op::put_json(TASK, id.to_string(), &task, Precondition::Version(version))?);
                    placed.push((task, p, req));
                }
                Err(unplaced) => {
                    let (why, code, unplaceable) =
                        waiting_reason(w.state, &task, &unplaced, o.local_runs_images);
                    let why = format!("{why}{scaling}");
                    let code = if scaling_out { PendingCode::ScalingOut } else { code };
                    if w.state.set_pending_reason(&id, &why, code, unplaceable) {
                        w.record_task(id, pool.clone(), vec![TaskChange::Unplaced(why)]);
                    }
                }
            }
        }
        if placed.is_empty() {
            return Ok(Action::AwaitChange);
        }
        w.write_placed(&ops, placed)?;
        Ok(Action::AwaitChange)
    }
}
