//! What keeps a long-running cluster's state bounded: the store's change history is compacted
//! by age and size (not only by revision count), stopped tasks and resolved incidents are kept
//! for a documented retention and then removed, and the records' schema version, with the
//! migration that brings an older data directory up to date.
//!
//! Retention (see docs/architecture of state in ARCHITECTURE.md):
//! - the change feed keeps at most [`FEED_MAX_REVISIONS`] revisions, none older than
//!   [`FEED_MAX_AGE_MS`], and at most [`FEED_MAX_BYTES`] of values;
//! - a STOPPED task is kept [`STOPPED_TASK_RETENTION_MS`] after it stopped, and at most the
//!   newest [`MAX_STOPPED_TASKS`];
//! - a RESOLVED incident is kept [`RESOLVED_INCIDENT_RETENTION_MS`] after it resolved, and at
//!   most the newest [`MAX_RESOLVED_INCIDENTS`].

use super::health::INCIDENT;
use super::*;
use std::collections::VecDeque;

/// The most revisions of the change feed kept for watchers.
pub const FEED_MAX_REVISIONS: u64 = 100_000;
/// No change older than this stays in the feed.
pub const FEED_MAX_AGE_MS: u64 = 15 * 60 * 1000;
/// The most bytes of values the feed keeps.
pub const FEED_MAX_BYTES: u64 = 64 * 1024 * 1024;
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

/// The schema of the records this build writes. 1: before histories were bounded (incident
/// timelines as plain arrays); 2: bounded timelines with `reached`.
pub const SCHEMA_VERSION: u64 = 2;
const META: &str = "meta";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SchemaRecord {
    version: u64,
}

/// When each revision of the feed was committed and how many bytes it wrote, oldest first.
/// Revisions from before this process loaded count as committed at the load, with no size.
#[derive(Debug, Default)]
pub(super) struct FeedLedger {
    entries: VecDeque<(Revision, u64, u64)>,
    bytes: u64,
    /// The store holds no change below this revision (compacted by this process).
    pub(super) compacted_before: Revision,
}

impl FeedLedger {
    pub(super) fn record(&mut self, rev: Revision, at_ms: u64, bytes: u64) {
        self.entries.push_back((rev, at_ms, bytes));
        self.bytes += bytes;
    }

    /// The first revision to keep at `now`, given the limits, for a store at `current`.
    fn keep_from(&self, current: Revision, now: u64) -> Revision {
        let mut from = current.saturating_sub(FEED_MAX_REVISIONS) + 1;
        let mut bytes = self.bytes;
        for &(rev, at_ms, b) in &self.entries {
            if now.saturating_sub(at_ms) <= FEED_MAX_AGE_MS && bytes <= FEED_MAX_BYTES {
                break;
            }
            bytes -= b;
            from = from.max(rev + 1);
        }
        from
    }

    fn drop_before(&mut self, rev: Revision) {
        while self.entries.front().is_some_and(|&(r, _, _)| r < rev) {
            if let Some((_, _, b)) = self.entries.pop_front() {
                self.bytes -= b;
            }
        }
    }
}

/// The bytes a batch writes, for the ledger.
pub(super) fn batch_bytes(ops: &[Op]) -> u64 {
    ops.iter()
        .map(|op| match op {
            Op::Put { kind, key, value, .. } => (kind.len() + key.len() + value.len()) as u64,
            Op::Delete { kind, key, .. } => (kind.len() + key.len()) as u64,
        })
        .sum()
}

impl Cluster {
    /// Brings the store's records to [`SCHEMA_VERSION`]; refuses a store written by a newer
    /// build. Runs before anything is loaded.
    pub(super) fn migrate(store: &dyn Store) -> Result<(), Error> {
        let version = match store.get(META, "schema")? {
            Some(r) => decode::<SchemaRecord>(&r)?.version,
            // No schema record: a new store, or one written before records had a schema.
            None if store.revision()? == 0 => 0,
            None => 1,
        };
        if version > SCHEMA_VERSION {
            return Err(Error::StoreCorrupt(format!(
                "the state was written by a newer mpsfleet (schema {version}); this build reads schema \
                 {SCHEMA_VERSION} or older: run the newer build"
            )));
        }
        if version == SCHEMA_VERSION {
            return Ok(());
        }
        if version == 1 {
            // Incident timelines become bounded histories with the steps reached.
            let records = store.list(INCIDENT)?;
            for chunk in records.chunks(PRUNE_BATCH) {
                let mut ops = Vec::with_capacity(chunk.len());
                for r in chunk {
                    let mut i: Incident = decode(r)?;
                    i.normalize();
                    ops.push(Op::put_json(INCIDENT, r.key.clone(), &i, Precondition::Version(r.version))?);
                }
                store.commit(&ops)?;
            }
            tracing::info!(incidents = records.len(), "state migrated from schema 1 to {SCHEMA_VERSION}");
        }
        store.commit(&[Op::put_json(
            META,
            "schema",
            &SchemaRecord { version: SCHEMA_VERSION },
            Precondition::Any,
        )?])?;
        Ok(())
    }

    /// Compacts the change feed by count, age and size.
    pub fn compact_history(&mut self) -> Result<(), Error> {
        let from = self.feed.keep_from(self.state.revision(), self.now());
        if from > self.feed.compacted_before {
            self.store.compact(from)?;
            self.feed.compacted_before = from;
            self.feed.drop_before(from);
        }
        Ok(())
    }

    /// Removes stopped tasks and resolved incidents past their retention, oldest first, a
    /// batch at a time; one failed batch is logged and left for the next resync.
    pub fn prune(&mut self) -> Result<(), Error> {
        // The spread groups of deployments no service keeps any more (placement.rs).
        let services = self.state.services();
        self.sched.forget_groups(|group| match group.split_once('/') {
            None => true,
            Some((svc, d)) => ServiceName::new(svc)
                .ok()
                .and_then(|n| services.get(&n))
                .is_some_and(|s| s.value.deployments.iter().any(|x| x.id == d)),
        });
        let now = self.now();
        let stopped = self
            .state
            .tasks()
            .values()
            .filter(|e| e.task.last_status == TaskStatus::Stopped)
            .map(|e| (e.task.stopped_at_ms.unwrap_or(0), e.task.id))
            .collect();
        let tasks = past_retention(stopped, MAX_STOPPED_TASKS, STOPPED_TASK_RETENTION_MS, now);
        for chunk in tasks.chunks(PRUNE_BATCH) {
            let keys =
                chunk.iter().filter_map(|id| self.state.tasks().get(id).map(|e| (id.to_string(), e.version)));
            let keys: Vec<(String, Revision)> = keys.collect();
            if self.commit_deletes(TASK, &keys) {
                for id in chunk {
                    self.apply(self.state.revision(), Change::TaskRemoved(*id));
                }
            }
        }
        let resolved = self
            .state
            .incidents()
            .values()
            .filter(|v| v.value.state == IncidentState::Resolved)
            // Kept while a cancelled replacement's launch is still in flight: its answer needs
            // the record to know the machine is to be terminated.
            .filter(|v| !self.work.provider_progress.get(&v.value.id).is_some_and(|p| p.launching))
            .map(|v| (v.value.resolved_at_ms.unwrap_or(0), v.value.id.clone()))
            .collect();
        let incidents = past_retention(resolved, MAX_RESOLVED_INCIDENTS, RESOLVED_INCIDENT_RETENTION_MS, now);
        for chunk in incidents.chunks(PRUNE_BATCH) {
            let keys =
                chunk.iter().filter_map(|id| self.state.incidents().get(id).map(|v| (id.clone(), v.version)));
            let keys: Vec<(String, Revision)> = keys.collect();
            if !self.commit_deletes(INCIDENT, &keys) {
                continue;
            }
            for id in chunk {
                // Its replacement tokens leave the index with it (`State::apply`).
                if self.state.incidents().get(id).is_some() {
                    self.apply(self.state.revision(), Change::IncidentRemoved(id.clone()));
                }
                self.work.provider_progress.remove(id);
            }
        }
        self.prune_deleted();
        Ok(())
    }

    /// Deletes these records (at these versions) in one commit; false, logged, when it fails.
    fn commit_deletes(&mut self, kind: &str, keys: &[(String, Revision)]) -> bool {
        let ops: Vec<Op> =
            keys.iter().map(|(k, v)| Op::delete(kind, k.clone(), Precondition::Version(*v))).collect();
        match self.commit(&ops) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(kind, error = %e, "pruning failed; retrying at the next resync");
                false
            }
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
