//! The one way records are written ([`Writer`]): a change is committed to the store first,
//! then applied to [`State`] (its one writer, `State::apply`), then what depends on it is
//! dropped (the storm breaker's counts) and the feed's ledger told. A failed commit changes
//! nothing in memory. Requests reach it through `Cluster::commit` and `Cluster::apply`,
//! which add the call's riders (its audit entry, its client token); the controllers in
//! `controllers/` hold a `Writer` in their context and never see `Cluster`.

use super::health::PoolCounts;
use super::state::{Change, State};
use super::Error;
use mpsfleet_store::{Op, Revision, Store};
use mpsfleet_types::PoolName;
use std::collections::{BTreeMap, VecDeque};

/// The most revisions of the change feed kept for watchers.
pub const FEED_MAX_REVISIONS: u64 = 100_000;
/// No change older than this stays in the feed.
pub const FEED_MAX_AGE_MS: u64 = 15 * 60 * 1000;
/// The most bytes of values the feed keeps.
pub const FEED_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// When each revision of the feed was committed and how many bytes it wrote, oldest first.
/// Revisions from before this process loaded count as committed at the load, with no size.
#[derive(Debug, Default)]
pub(in crate::cluster) struct FeedLedger {
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

/// What writing a record takes: the store, the state, the feed's ledger, the metrics, and
/// what is dropped when a record it counts changes.
pub(in crate::cluster) struct Writer<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) state: &'a mut State,
    pub(super) feed: &'a mut FeedLedger,
    pub(super) live: &'a crate::metrics::Live,
    pub(super) breaker_counts: &'a mut BTreeMap<PoolName, PoolCounts>,
    pub(super) now_ms: u64,
}

impl Writer<'_> {
    /// The state, to read.
    pub(in crate::cluster) fn state(&self) -> &State {
        self.state
    }

    /// Commits `ops` and applies `changes` at its revision: the one call a controller makes
    /// to write.
    pub(in crate::cluster) fn write(
        &mut self,
        ops: &[Op],
        changes: impl IntoIterator<Item = Change>,
    ) -> Result<Revision, Error> {
        let rev = self.commit(ops)?;
        for c in changes {
            self.apply(rev, c);
        }
        Ok(rev)
    }

    /// One store commit, its duration and outcome counted in the metrics, its size in the
    /// feed's ledger; nothing is applied yet.
    pub(super) fn commit(&mut self, ops: &[Op]) -> Result<Revision, Error> {
        let watch = mpsfleet_core::clock::Stopwatch::start();
        let result = self.store.commit(ops);
        self.live.committed(watch.seconds(), result.is_ok());
        let rev = result?;
        if rev != self.state.revision() {
            self.feed.record(rev, self.now_ms, batch_bytes(ops));
        }
        self.state.committed(rev);
        Ok(rev)
    }

    /// Applies a committed change to the state, and drops the storm breaker's counts when the
    /// change is to what they count: a host or an incident.
    pub(super) fn apply(&mut self, version: Revision, change: Change) {
        if matches!(
            change,
            Change::NewHost(..) | Change::Host(..) | Change::Incident(_) | Change::IncidentRemoved(_)
        ) {
            self.breaker_counts.clear();
        }
        self.state.apply(version, change);
    }

    /// Compacts the store's change feed to what [`FEED_MAX_REVISIONS`], [`FEED_MAX_AGE_MS`] and
    /// [`FEED_MAX_BYTES`] keep.
    pub(in crate::cluster) fn compact_feed(&mut self) -> Result<(), Error> {
        let from = self.feed.keep_from(self.state.revision(), self.now_ms);
        if from > self.feed.compacted_before {
            self.store.compact(from)?;
            self.feed.compacted_before = from;
            self.feed.drop_before(from);
        }
        Ok(())
    }
}
