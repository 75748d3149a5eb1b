//! `MemoryStore`: the in-process, non-durable `Store` (BTreeMaps behind a mutex) for tests and the simulator.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::watch::{poisoned, RevisionWatch};
use crate::{
    check_no_duplicates, check_not_compacted, page_full, Change, Op, Record, Revision, Store, StoreError,
};

/// A stored object: its value and the revision that last wrote it.
#[derive(Debug, Clone)]
struct Entry {
    value: Vec<u8>,
    version: Revision,
}

#[derive(Debug, Default)]
struct Inner {
    /// kind -> key -> entry; nested so `list` is a range-free walk of one map.
    objects: BTreeMap<String, BTreeMap<String, Entry>>,
    /// The change feed, ordered by revision (and by op order within one revision).
    changes: Vec<Change>,
    revision: Revision,
    /// Feed entries with revision < this have been dropped.
    compacted_before: Revision,
}

impl Inner {
    fn version_of(&self, kind: &str, key: &str) -> Option<Revision> {
        self.objects.get(kind).and_then(|m| m.get(key)).map(|e| e.version)
    }
}

/// An in-memory [`Store`]; everything is lost when it is dropped.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    watch: RevisionWatch,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore { inner: Mutex::new(Inner::default()), watch: RevisionWatch::new(0) }
    }

    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, Inner>, StoreError> {
        self.inner.lock().map_err(|_| poisoned(op))
    }
}

impl Store for MemoryStore {
    fn get(&self, kind: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let inner = self.lock("get")?;
        Ok(inner.objects.get(kind).and_then(|m| m.get(key)).map(|e| Record {
            kind: kind.to_owned(),
            key: key.to_owned(),
            value: e.value.clone(),
            version: e.version,
        }))
    }

    fn list(&self, kind: &str) -> Result<Vec<Record>, StoreError> {
        let inner = self.lock("list")?;
        let Some(objects) = inner.objects.get(kind) else {
            return Ok(Vec::new());
        };
        Ok(objects
            .iter()
            .map(|(key, e)| Record {
                kind: kind.to_owned(),
                key: key.clone(),
                value: e.value.clone(),
                version: e.version,
            })
            .collect())
    }

    fn commit(&self, ops: &[Op]) -> Result<Revision, StoreError> {
        check_no_duplicates(ops)?;
        let mut inner = self.lock("commit")?;

        // Check every precondition before touching anything, so a failure applies nothing.
        for op in ops {
            let actual = inner.version_of(op.kind(), op.key());
            if !op.expect().holds(actual) {
                return Err(StoreError::Conflict {
                    kind: op.kind().to_owned(),
                    key: op.key().to_owned(),
                    expected: op.expect(),
                    actual,
                });
            }
        }

        let effective = ops.iter().any(|op| match op {
            Op::Put { .. } => true,
            Op::Delete { kind, key, .. } => inner.version_of(kind, key).is_some(),
        });
        if !effective {
            return Ok(inner.revision);
        }
        let revision = inner.revision.checked_add(1).ok_or_else(|| StoreError::Backend {
            op: "commit",
            message: "revision counter overflowed".to_owned(),
        })?;

        for op in ops {
            match op {
                Op::Put { kind, key, value, .. } => {
                    inner
                        .objects
                        .entry(kind.clone())
                        .or_default()
                        .insert(key.clone(), Entry { value: value.clone(), version: revision });
                    inner.changes.push(Change {
                        revision,
                        kind: kind.clone(),
                        key: key.clone(),
                        value: Some(value.clone()),
                    });
                }
                Op::Delete { kind, key, .. } => {
                    let Some(of_kind) = inner.objects.get_mut(kind.as_str()) else {
                        continue;
                    };
                    if of_kind.remove(key.as_str()).is_none() {
                        continue;
                    }
                    if of_kind.is_empty() {
                        inner.objects.remove(kind.as_str());
                    }
                    inner.changes.push(Change {
                        revision,
                        kind: kind.clone(),
                        key: key.clone(),
                        value: None,
                    });
                }
            }
        }
        inner.revision = revision;
        self.watch.publish(revision);
        Ok(revision)
    }

    fn revision(&self) -> Result<Revision, StoreError> {
        Ok(self.lock("revision")?.revision)
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Vec<Change>, StoreError> {
        let inner = self.lock("changes_since")?;
        check_not_compacted(after, inner.compacted_before)?;
        let start = inner.changes.partition_point(|c| c.revision <= after);
        let mut page: Vec<Change> = Vec::new();
        for change in &inner.changes[start..] {
            if page_full(page.len(), limit, page.last().map(|c| c.revision), change.revision) {
                break;
            }
            page.push(change.clone());
        }
        Ok(page)
    }

    fn wait_for_revision(&self, after: Revision, timeout: Duration) -> Result<Revision, StoreError> {
        let current = self.revision()?;
        if current > after {
            return Ok(current);
        }
        Ok(self.watch.wait(after, timeout))
    }

    fn compact(&self, before: Revision) -> Result<(), StoreError> {
        let mut inner = self.lock("compact")?;
        let before = before.min(inner.revision.saturating_add(1));
        if before <= inner.compacted_before {
            return Ok(());
        }
        let cut = inner.changes.partition_point(|c| c.revision < before);
        inner.changes.drain(..cut);
        inner.compacted_before = before;
        Ok(())
    }
}
