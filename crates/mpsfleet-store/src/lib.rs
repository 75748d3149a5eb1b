//! The `Store` trait and its vocabulary (revisions, records, ops, changes, errors), modelled on etcd v3.
//!
//! Every object is addressed by `(kind, key)` and holds opaque bytes (callers store JSON). The store has
//! one global [`Revision`] that starts at 0 and grows by exactly 1 for every commit that changes
//! something; an object's [`Record::version`] is the revision of the commit that last wrote it (etcd's
//! `mod_revision`). Commits are atomic batches of [`Op`]s guarded by [`Precondition`]s, and every commit
//! appends its [`Change`]s to a feed that watchers page through with [`Store::changes_since`].
//!
//! Three implementations live here: [`MemoryStore`] (tests, simulator), [`SqliteStore`] (one durable
//! file) and [`EtcdStore`] (several servers on one etcd cluster, with leader election).

pub mod etcd;
mod memory;
mod sqlite;
mod watch;

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use etcd::{EtcdConfig, EtcdStore};
pub use memory::MemoryStore;
pub use sqlite::SqliteStore;

/// A point in the store's history. 0 is the empty store; each effective commit adds exactly 1.
pub type Revision = u64;

/// One live object as read from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: String,
    pub key: String,
    pub value: Vec<u8>,
    /// The revision of the commit that last wrote this object (etcd's `mod_revision`).
    pub version: Revision,
}

/// What an op requires of its object's current state for the batch to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// No requirement.
    Any,
    /// The object must not exist.
    Absent,
    /// The object must exist with exactly this version.
    Version(Revision),
}

impl Precondition {
    /// Whether an object whose current version is `actual` (`None` = absent) satisfies this precondition.
    pub fn holds(self, actual: Option<Revision>) -> bool {
        match self {
            Precondition::Any => true,
            Precondition::Absent => actual.is_none(),
            Precondition::Version(v) => actual == Some(v),
        }
    }
}

impl fmt::Display for Precondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Precondition::Any => f.write_str("any"),
            Precondition::Absent => f.write_str("absent"),
            Precondition::Version(v) => write!(f, "version {v}"),
        }
    }
}

/// One write in a [`Store::commit`] batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create or replace the object.
    Put { kind: String, key: String, value: Vec<u8>, expect: Precondition },
    /// Remove the object. With [`Precondition::Any`] (or `Absent`) on a missing object this is a no-op.
    Delete { kind: String, key: String, expect: Precondition },
}

impl Op {
    pub fn put(
        kind: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<Vec<u8>>,
        expect: Precondition,
    ) -> Op {
        Op::Put { kind: kind.into(), key: key.into(), value: value.into(), expect }
    }

    pub fn delete(kind: impl Into<String>, key: impl Into<String>, expect: Precondition) -> Op {
        Op::Delete { kind: kind.into(), key: key.into(), expect }
    }

    /// A put whose value is `value` serialized as JSON.
    pub fn put_json<T: Serialize + ?Sized>(
        kind: impl Into<String>,
        key: impl Into<String>,
        value: &T,
        expect: Precondition,
    ) -> Result<Op, StoreError> {
        let kind = kind.into();
        let key = key.into();
        match serde_json::to_vec(value) {
            Ok(bytes) => Ok(Op::Put { kind, key, value: bytes, expect }),
            Err(e) => Err(StoreError::Encode { kind, key, message: e.to_string() }),
        }
    }

    pub fn kind(&self) -> &str {
        match self {
            Op::Put { kind, .. } | Op::Delete { kind, .. } => kind,
        }
    }

    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } => key,
        }
    }

    pub fn expect(&self) -> Precondition {
        match self {
            Op::Put { expect, .. } | Op::Delete { expect, .. } => *expect,
        }
    }
}

/// One entry of the change feed: the state an object was left in by the commit at `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub revision: Revision,
    pub kind: String,
    pub key: String,
    /// The new value; `None` means the object was deleted.
    pub value: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A precondition failed; nothing of the batch was applied.
    #[error("conflict on {kind}/{key}: expected {expected}, found {}", ActualVersion(*.actual))]
    Conflict { kind: String, key: String, expected: Precondition, actual: Option<Revision> },
    /// The same object appeared twice in one batch; nothing was applied.
    #[error("{kind}/{key} appears more than once in one commit batch")]
    DuplicateKey { kind: String, key: String },
    /// The backend failed (I/O, SQLite error, disk full, poisoned lock...).
    #[error("store backend failed during {op}: {message}")]
    Backend { op: &'static str, message: String },
    /// Stored data could not be decoded.
    #[error("stored object {kind}/{key} is corrupt: {message}")]
    Corrupt { kind: String, key: String, message: String },
    /// A value could not be encoded before writing it.
    #[error("could not encode {kind}/{key}: {message}")]
    Encode { kind: String, key: String, message: String },
    /// The store is shared and this process may not write to it: it is not (or no longer) the
    /// elected leader. Nothing was applied.
    #[error("not the leader: {message}")]
    Fenced { message: String },
    /// The commit was sent and no answer came: it may or may not have been applied. The caller
    /// must reload before trusting its own view of the state again.
    #[error("the outcome of {op} is unknown: {message}")]
    Indeterminate { op: &'static str, message: String },
    /// `changes_since` asked for revisions that were compacted away.
    #[error("changes after revision {requested} were compacted; the oldest retained revision is {oldest}")]
    Compacted { requested: Revision, oldest: Revision },
}

/// Displays an object's current version for conflict messages.
struct ActualVersion(Option<Revision>);

impl fmt::Display for ActualVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, "version {v}"),
            None => f.write_str("absent"),
        }
    }
}

/// A versioned object store with atomic compare-and-swap batches and a change feed (etcd v3 semantics).
///
/// The trait is object safe; callers typically hold an `Arc<dyn Store>`.
pub trait Store: Send + Sync + 'static {
    /// The live object `(kind, key)`, if any.
    fn get(&self, kind: &str, key: &str) -> Result<Option<Record>, StoreError>;

    /// All live objects of a kind, ordered by key.
    fn list(&self, kind: &str) -> Result<Vec<Record>, StoreError>;

    /// Atomically checks every precondition, then applies every op as one revision. All or nothing.
    ///
    /// Returns the store's revision after the commit. A batch that changes nothing (an empty batch,
    /// or only deletes of missing objects) is allowed and returns the current revision without
    /// incrementing it, so every revision in the feed has at least one change. The same
    /// `(kind, key)` may not appear twice in one batch ([`StoreError::DuplicateKey`]).
    /// Durable when it returns `Ok`: a SIGKILL or power loss right after loses nothing.
    fn commit(&self, ops: &[Op]) -> Result<Revision, StoreError>;

    /// The current revision.
    fn revision(&self) -> Result<Revision, StoreError>;

    /// The change feed: changes with revision > `after`, in order, at most `limit` of them, except
    /// that one revision's changes are never split across pages: if they would exceed the limit they
    /// are all included anyway. `limit == 0` returns nothing.
    fn changes_since(&self, after: Revision, limit: usize) -> Result<Vec<Change>, StoreError>;

    /// Blocks until the revision is > `after` or `timeout` passes; returns the current revision.
    fn wait_for_revision(&self, after: Revision, timeout: Duration) -> Result<Revision, StoreError>;

    /// Drops change-feed entries with revision < `before` (objects are unaffected). Compaction never
    /// moves backwards, and `before` is capped at current revision + 1 (drop everything).
    fn compact(&self, before: Revision) -> Result<(), StoreError>;
}

/// Decodes a record's JSON value; [`StoreError::Corrupt`] names the object if it does not parse.
pub fn decode<T: DeserializeOwned>(r: &Record) -> Result<T, StoreError> {
    serde_json::from_slice(&r.value).map_err(|e| StoreError::Corrupt {
        kind: r.kind.clone(),
        key: r.key.clone(),
        message: e.to_string(),
    })
}

/// Refuses a batch that names the same object twice.
pub(crate) fn check_no_duplicates(ops: &[Op]) -> Result<(), StoreError> {
    let mut seen: HashSet<(&str, &str)> = HashSet::with_capacity(ops.len());
    for op in ops {
        if !seen.insert((op.kind(), op.key())) {
            return Err(StoreError::DuplicateKey { kind: op.kind().to_owned(), key: op.key().to_owned() });
        }
    }
    Ok(())
}

/// Whether a feed page being built should stop before a change of revision `next`: the page already
/// holds `len` changes, the last of revision `last`, and must not split a revision.
pub(crate) fn page_full(len: usize, limit: usize, last: Option<Revision>, next: Revision) -> bool {
    len >= limit && last != Some(next)
}

/// Whether a feed read after `after` would miss revisions dropped by compaction below `compacted_before`.
pub(crate) fn check_not_compacted(after: Revision, compacted_before: Revision) -> Result<(), StoreError> {
    if after.saturating_add(1) < compacted_before {
        return Err(StoreError::Compacted { requested: after, oldest: compacted_before });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preconditions_hold_as_documented() {
        assert!(Precondition::Any.holds(None));
        assert!(Precondition::Any.holds(Some(3)));
        assert!(Precondition::Absent.holds(None));
        assert!(!Precondition::Absent.holds(Some(3)));
        assert!(Precondition::Version(3).holds(Some(3)));
        assert!(!Precondition::Version(3).holds(Some(4)));
        assert!(!Precondition::Version(3).holds(None));
    }

    #[test]
    fn error_messages_name_the_object() {
        let e = StoreError::Conflict {
            kind: "task".into(),
            key: "t1".into(),
            expected: Precondition::Version(3),
            actual: None,
        };
        assert_eq!(e.to_string(), "conflict on task/t1: expected version 3, found absent");
    }

    #[test]
    fn put_json_and_decode_round_trip() {
        let op = Op::put_json("task", "t1", &vec![1, 2, 3], Precondition::Any).expect("encode");
        let Op::Put { value, .. } = op else { panic!("expected a put") };
        let rec = Record { kind: "task".into(), key: "t1".into(), value, version: 1 };
        let back: Vec<i32> = decode(&rec).expect("decode");
        assert_eq!(back, vec![1, 2, 3]);
        let bad = Record { value: b"{not json".to_vec(), ..rec };
        match decode::<Vec<i32>>(&bad) {
            Err(StoreError::Corrupt { kind, key, .. }) => {
                assert_eq!((kind, key), ("task".into(), "t1".into()))
            }
            other => panic!("expected corrupt, got {other:?}"),
        }
    }

    #[test]
    fn compaction_bound_is_exclusive() {
        assert!(check_not_compacted(4, 5).is_ok());
        assert!(matches!(check_not_compacted(3, 5), Err(StoreError::Compacted { requested: 3, oldest: 5 })));
    }
}
