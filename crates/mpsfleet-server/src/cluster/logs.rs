//! The last output snapshot of each task, as its agent reported it, so that `task logs` has
//! something to show once the task's host is gone or its agent does not answer.
//! The operations are `Cluster`'s, in `workloads.rs` and `hosts.rs`; what they share is here.
//!
//! Agents send a task's snapshot with its state reports when the output changed (at most
//! every 30 s) and always with the STOPPED report; the latest one per task is kept here.
//!
//! - **Bounds.** A snapshot is trimmed to [`SNAPSHOT_MAX_BYTES`] (16 KiB, newest lines kept);
//!   all of them together stay within [`SNAPSHOTS_MAX_BYTES`] (64 MiB, about 4000 full
//!   snapshots; each also counts [`ENTRY_OVERHEAD_BYTES`], and empty ones are not kept). Over budget, the snapshots that came with a STOPPED report go first, the
//!   oldest first, then the others, least recently received first.
//! - **In memory only.** Snapshots are not written to the store: a server restart loses the
//!   snapshots of tasks whose agent is gone (a live agent sends its running tasks' snapshots
//!   again with their next change). One snapshot is far below etcd's 1.5 MiB per write, so
//!   keeping them under a kind of their own in the store remains possible.

use mpsfleet_types::logs::{LogSnapshot, SNAPSHOT_MAX_BYTES};
use mpsfleet_types::TaskId;
use std::collections::{BTreeSet, HashMap};

/// The most all kept snapshots may cost together: [`LogSnapshot::cost`] plus
/// [`ENTRY_OVERHEAD_BYTES`] each.
pub const SNAPSHOTS_MAX_BYTES: usize = 64 << 20;
/// What keeping one snapshot costs beyond its lines (its key, indexes, allocation).
pub const ENTRY_OVERHEAD_BYTES: usize = 128;

pub(super) struct Kept {
    pub(super) snapshot: LogSnapshot,
    pub(super) received_at_ms: u64,
    pub(super) key: EvictKey,
}

/// Eviction order: final snapshots (false sorts first), then by when they were received.
pub(super) type EvictKey = (bool, u64, u64, TaskId);

/// The latest snapshot of each task, within the fleet-wide budget.
pub struct LogSnapshots {
    pub(super) by_task: HashMap<TaskId, Kept>,
    pub(super) order: BTreeSet<EvictKey>,
    pub(super) total: usize,
    pub(super) max: usize,
    /// Tie-breaker so that keys are unique and follow arrival order.
    pub(super) seq: u64,
}

impl Default for LogSnapshots {
    fn default() -> LogSnapshots {
        LogSnapshots::with_budget(SNAPSHOTS_MAX_BYTES)
    }
}

impl LogSnapshots {
    pub fn with_budget(max: usize) -> LogSnapshots {
        LogSnapshots { by_task: HashMap::new(), order: BTreeSet::new(), total: 0, max, seq: 0 }
    }

    /// Keeps `snapshot` as the task's latest, `last` when it came with the STOPPED report. An
    /// empty one (nothing was ever written) is not kept.
    pub fn keep(&mut self, id: TaskId, mut snapshot: LogSnapshot, last: bool, now_ms: u64) {
        if snapshot.lines.is_empty() && snapshot.dropped_bytes == 0 {
            return;
        }
        self.remove(&id);
        snapshot.trim_to(SNAPSHOT_MAX_BYTES);
        self.seq += 1;
        let key = (!last, now_ms, self.seq, id);
        self.total += snapshot.cost() + ENTRY_OVERHEAD_BYTES;
        self.order.insert(key);
        self.by_task.insert(id, Kept { snapshot, received_at_ms: now_ms, key });
        while self.total > self.max {
            let Some(oldest) = self.order.first().copied() else { break };
            self.remove(&oldest.3);
        }
    }

    pub(super) fn remove(&mut self, id: &TaskId) {
        if let Some(old) = self.by_task.remove(id) {
            self.order.remove(&old.key);
            self.total -= old.snapshot.cost() + ENTRY_OVERHEAD_BYTES;
        }
    }

    /// The task's latest snapshot and when it was received.
    pub fn get(&self, id: &TaskId) -> Option<(u64, &LogSnapshot)> {
        self.by_task.get(id).map(|k| (k.received_at_ms, &k.snapshot))
    }

    #[cfg(test)]
    pub(super) fn total(&self) -> usize {
        self.total
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_task.len()
    }
}

/// An agent's logs endpoint, as its last heartbeat reported it.
pub struct AgentEndpoint {
    /// `https://PEER:PORT` (`http://` for a plain-HTTP cluster).
    pub url: String,
    /// The token the agent accepts.
    pub token: String,
    /// The hash of the certificate an `https://` endpoint serves.
    pub cert_sha256: Option<String>,
}

impl std::fmt::Debug for AgentEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEndpoint")
            .field("url", &self.url)
            .field("cert_sha256", &self.cert_sha256)
            .finish_non_exhaustive()
    }
}

/// Where `task logs` can get a task's output: its agent (address and token), or why not, and
/// the last snapshot its agent reported, with when it was received.
pub struct LogsPlan {
    pub task_id: TaskId,
    pub agent: Result<AgentEndpoint, String>,
    pub snapshot: Option<(u64, LogSnapshot)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::logs::{OutputLine, OutputStream, LINE_OVERHEAD_BYTES};

    fn snap(text: &str) -> LogSnapshot {
        LogSnapshot {
            taken_at_ms: 1,
            lines: vec![OutputLine {
                at_ms: 1,
                container: "app".into(),
                stream: OutputStream::Stdout,
                text: text.into(),
            }],
            dropped_bytes: 0,
        }
    }

    #[test]
    fn a_snapshot_is_trimmed_to_its_bound_and_replaced_by_the_next() {
        let mut s = LogSnapshots::default();
        let big = "z".repeat(3 * SNAPSHOT_MAX_BYTES);
        s.keep(TaskId(1), snap(&big), false, 10);
        let (at, kept) = s.get(&TaskId(1)).unwrap();
        assert_eq!(at, 10);
        assert!(kept.cost() <= SNAPSHOT_MAX_BYTES);
        assert_eq!(s.total(), kept.cost() + ENTRY_OVERHEAD_BYTES);
        s.keep(TaskId(1), snap("new\n"), true, 20);
        assert_eq!(s.get(&TaskId(1)).unwrap().1.text(), "new\n");
        assert_eq!(s.total(), 4 + LINE_OVERHEAD_BYTES + ENTRY_OVERHEAD_BYTES);
        assert_eq!(s.len(), 1);
        // Nothing written, nothing kept (and the last snapshot stays).
        s.keep(TaskId(1), LogSnapshot::default(), true, 30);
        s.keep(TaskId(2), LogSnapshot::default(), true, 30);
        assert_eq!(s.len(), 1);
        assert_eq!(s.get(&TaskId(1)).unwrap().1.text(), "new\n");
    }

    #[test]
    fn over_budget_the_oldest_stopped_tasks_go_first() {
        let one = 10 + LINE_OVERHEAD_BYTES + ENTRY_OVERHEAD_BYTES;
        let mut s = LogSnapshots::with_budget(3 * one);
        s.keep(TaskId(1), snap("running-1\n"), false, 1);
        s.keep(TaskId(2), snap("stopped-2\n"), true, 2);
        s.keep(TaskId(3), snap("stopped-3\n"), true, 3);
        assert_eq!(s.len(), 3);
        s.keep(TaskId(4), snap("running-4\n"), false, 4);
        // The oldest stopped task went, though the running one is older.
        assert!(s.get(&TaskId(2)).is_none());
        assert!(s.get(&TaskId(1)).is_some() && s.get(&TaskId(3)).is_some());
        s.keep(TaskId(5), snap("running-5\n"), false, 5);
        assert!(s.get(&TaskId(3)).is_none());
        // No stopped task left: the least recently received goes.
        s.keep(TaskId(6), snap("running-6\n"), false, 6);
        assert!(s.get(&TaskId(1)).is_none());
        assert_eq!(s.len(), 3);
        assert!(s.total() <= 3 * one);
    }
}
