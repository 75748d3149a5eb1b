//! The revision notifier behind `wait_for_revision`: a Mutex+Condvar that commits publish to.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::{Revision, StoreError};

/// The latest revision committed through this process, with a condvar woken on every commit.
pub(crate) struct RevisionWatch {
    latest: Mutex<Revision>,
    changed: Condvar,
}

impl RevisionWatch {
    pub(crate) fn new(initial: Revision) -> RevisionWatch {
        RevisionWatch { latest: Mutex::new(initial), changed: Condvar::new() }
    }

    /// Records that the store reached `revision` and wakes every waiter.
    pub(crate) fn publish(&self, revision: Revision) {
        // A poisoned lock only means a waiter panicked; the revision it guards is still valid.
        let mut latest = self.latest.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if revision > *latest {
            *latest = revision;
        }
        drop(latest);
        self.changed.notify_all();
    }

    /// Blocks until the published revision is > `after` or `timeout` passes; returns the published revision.
    pub(crate) fn wait(&self, after: Revision, timeout: Duration) -> Revision {
        let latest = self.latest.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (latest, _timed_out) = self
            .changed
            .wait_timeout_while(latest, timeout, |rev| *rev <= after)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *latest
    }
}

/// Maps a poisoned store lock to a backend error naming the operation.
pub(crate) fn poisoned(op: &'static str) -> StoreError {
    StoreError::Backend { op, message: "store lock poisoned by a panic in another thread".to_owned() }
}
