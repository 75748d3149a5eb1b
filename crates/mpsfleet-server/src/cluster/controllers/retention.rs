//! Retention, a controller of one key (`Work::Retention`): what keeps a long-running
//! cluster's state bounded. Every [`RETENTION_INTERVAL_MS`] once the server serves:
//! - the change feed keeps at most `FEED_MAX_REVISIONS` revisions, none older than
//!   `FEED_MAX_AGE_MS`, and at most `FEED_MAX_BYTES` of values (`Writer::compact_feed`);
//! - a STOPPED task is kept [`STOPPED_TASK_RETENTION_MS`] after it stopped, and at most the
//!   newest [`MAX_STOPPED_TASKS`];
//! - a RESOLVED incident is kept [`RESOLVED_INCIDENT_RETENTION_MS`] after it resolved, and at
//!   most the newest [`MAX_RESOLVED_INCIDENTS`], unless a launch for it is still in flight;
//! - a deleted pool or service (ECS's INACTIVE) is kept `deleted::KEPT_MS`;
//! - the scheduler forgets the spread groups of deployments no service keeps.

use super::Ctx;
use crate::cluster::deleted::KEPT_MS;
use crate::cluster::error::Error;
use crate::cluster::kinds::{DELETED, INCIDENT, TASK};
use crate::cluster::state::Change;
use mpsfleet_core::controller::Action;
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::{IncidentState, ServiceName, TaskStatus};

/// How long a STOPPED task stays listed after it stopped.
pub const STOPPED_TASK_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;
/// The most STOPPED tasks kept (the newest).
pub const MAX_STOPPED_TASKS: usize = 10_000;
/// How long a RESOLVED incident stays listed after it resolved.
pub const RESOLVED_INCIDENT_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;
/// The most RESOLVED incidents kept (the newest).
pub const MAX_RESOLVED_INCIDENTS: usize = 1_000;
/// The most records one pruning commit deletes.
const PRUNE_BATCH: usize = 500;

/// How often retention runs once started (and how long it waits after a failure at most, the
/// queue's backoff aside).
pub const RETENTION_INTERVAL_MS: u64 = 5_000;

/// The retention controller. It keeps nothing between its runs.
pub(in crate::cluster) struct Retention;

impl Retention {
    /// Compacts the feed, then removes what is past its retention, oldest first, a batch at a
    /// time; one failed batch is logged and left for the next run. `launching`: whether an
    /// incident's replacement launch is still in flight (its record is kept: the launch's
    /// answer needs it). Returns the incidents it removed, with when to run again.
    pub(in crate::cluster) fn reconcile(
        ctx: &mut Ctx<'_>,
        launching: &dyn Fn(&str) -> bool,
    ) -> Result<(Action, Vec<String>), Error> {
        ctx.w.compact_feed()?;
        let now = ctx.now_ms;
        let services = ctx.w.state.services();
        ctx.w.sched.forget_groups(|group| match group.split_once('/') {
            None => true,
            Some((svc, d)) => ServiceName::new(svc)
                .ok()
                .and_then(|n| services.get(&n))
                .is_some_and(|s| s.value.deployments.iter().any(|x| x.id == d)),
        });
        let state = ctx.w.state();
        let stopped = (state.tasks().values())
            .filter(|e| e.task.last_status == TaskStatus::Stopped)
            .map(|e| (e.task.stopped_at_ms.unwrap_or(0), e.task.id))
            .collect();
        let tasks = past_retention(stopped, MAX_STOPPED_TASKS, STOPPED_TASK_RETENTION_MS, now);
        for chunk in tasks.chunks(PRUNE_BATCH) {
            let state = ctx.w.state();
            let keys = chunk.iter().filter_map(|id| {
                state.tasks().get(id).map(|e| (id.to_string(), Precondition::Version(e.version)))
            });
            delete(ctx, TASK, keys.collect(), chunk.iter().map(|id| Change::TaskRemoved(*id)));
        }
        let resolved = (ctx.w.state().incidents().values())
            .filter(|v| v.value.state == IncidentState::Resolved && !launching(&v.value.id))
            .map(|v| (v.value.resolved_at_ms.unwrap_or(0), v.value.id.clone()))
            .collect();
        let incidents = past_retention(resolved, MAX_RESOLVED_INCIDENTS, RESOLVED_INCIDENT_RETENTION_MS, now);
        let mut removed = Vec::new();
        for chunk in incidents.chunks(PRUNE_BATCH) {
            let state = ctx.w.state();
            let keys = chunk.iter().filter_map(|id| {
                state.incidents().get(id).map(|v| (id.clone(), Precondition::Version(v.version)))
            });
            // Its replacement tokens leave the index with it (`State::apply`).
            let changes = chunk.iter().map(|id| Change::IncidentRemoved(id.clone()));
            if delete(ctx, INCIDENT, keys.collect(), changes) {
                removed.extend_from_slice(chunk);
            }
        }
        let since = now.saturating_sub(KEPT_MS);
        let deleted = ctx.w.state().deleted().iter().filter(|(_, d)| d.deleted_at_ms < since);
        let old: Vec<(String, Precondition)> = deleted.map(|(k, _)| (k.clone(), Precondition::Any)).collect();
        let changes: Vec<Change> = old.iter().map(|(k, _)| Change::DeletedRemoved(k.clone())).collect();
        delete(ctx, DELETED, old, changes);
        Ok((Action::RequeueAfter(RETENTION_INTERVAL_MS), removed))
    }
}

/// Deletes these records (each under its precondition) in one commit and applies `changes`;
/// false, logged, when the commit fails.
fn delete(
    ctx: &mut Ctx<'_>,
    kind: &str,
    keys: Vec<(String, Precondition)>,
    changes: impl IntoIterator<Item = Change>,
) -> bool {
    if keys.is_empty() {
        return false;
    }
    let ops: Vec<Op> = keys.into_iter().map(|(k, p)| Op::delete(kind, k, p)).collect();
    match ctx.w.write(&ops, changes) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(kind, error = %e, "pruning failed; retrying at the next run");
            false
        }
    }
}

/// Of records `(when they ended, key)`, those past `age_ms` at `now`, and the oldest beyond
/// the newest `max`, oldest first.
fn past_retention<K>(mut ended: Vec<(u64, K)>, max: usize, age_ms: u64, now: u64) -> Vec<K>
where
    K: Ord,
{
    ended.sort_unstable();
    let excess = ended.len().saturating_sub(max);
    ended
        .into_iter()
        .enumerate()
        .filter(|(k, (at, _))| *k < excess || now.saturating_sub(*at) > age_ms)
        .map(|(_, (_, key))| key)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::past_retention;

    /// Past the age, or beyond the newest `max`: oldest first either way.
    #[test]
    fn retention_by_age_and_by_count() {
        let ended = vec![(50, 'c'), (10, 'a'), (40, 'b'), (90, 'd')];
        assert_eq!(past_retention(ended.clone(), 10, 30, 100), ['a', 'b', 'c']);
        assert_eq!(past_retention(ended.clone(), 2, 1_000, 100), ['a', 'b']);
        assert_eq!(past_retention(ended, 3, 55, 100), ['a', 'b']);
    }
}
