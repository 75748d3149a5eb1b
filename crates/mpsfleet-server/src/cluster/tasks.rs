//! The task records and every index derived from them, in one type with one path in and out.
//!
//! [`TaskTable::put`] is the only way a committed task record enters (new or updated) and
//! [`TaskTable::remove`] the only way one leaves; both keep the indexes in step with the
//! records, so nothing after a commit can leave a task in one index and not another:
//!
//! - `pending`: live tasks with no placement, by pool, in creation order;
//! - `by_host`: live placed tasks, by the host the scheduler accounted them on;
//! - `by_service`: live tasks, by their service.
//!
//! A STOPPED task is in no index. The scheduler's capacity accounting is not here: the
//! cluster reserves and releases it around the calls (a placement is what it hands in).

use super::TaskEntry;
use mpsfleet_core::changes::TaskChange;
use mpsfleet_core::scheduler::{HostIx, Placement};
use mpsfleet_store::Revision;
use mpsfleet_types::{PendingCode, PoolName, ServiceName, Task, TaskId, TaskStatus};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Default)]
pub(super) struct TaskTable {
    entries: HashMap<TaskId, TaskEntry>,
    pending: BTreeMap<PoolName, BTreeMap<u64, TaskId>>,
    by_host: HashMap<HostIx, BTreeSet<TaskId>>,
    by_service: HashMap<ServiceName, BTreeSet<TaskId>>,
    next_seq: u64,
}

static NONE: BTreeSet<TaskId> = BTreeSet::new();

impl TaskTable {
    pub(super) fn get(&self, id: &TaskId) -> Option<&TaskEntry> {
        self.entries.get(id)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &TaskEntry> {
        self.entries.values()
    }

    /// Puts a committed record at `version`, held by the scheduler at `placement` (None when it
    /// holds nothing: waiting, or stopped). An existing task keeps its creation order.
    /// Returns the entry it replaced.
    pub(super) fn put(
        &mut self,
        task: Task,
        version: Revision,
        placement: Option<Placement>,
    ) -> Option<TaskEntry> {
        let id = task.id;
        let mut old = self.remove(&id);
        let events = old.as_mut().map(|o| std::mem::take(&mut o.events)).unwrap_or_default();
        let seq = match &old {
            Some(o) => o.seq,
            None => {
                self.next_seq += 1;
                self.next_seq - 1
            }
        };
        if task.last_status != TaskStatus::Stopped {
            match &placement {
                Some(p) => {
                    self.by_host.entry(p.host).or_default().insert(id);
                }
                None => {
                    self.pending.entry(task.pool.clone()).or_default().insert(seq, id);
                }
            }
            if let Some(g) = &task.group {
                self.by_service.entry(g.clone()).or_default().insert(id);
            }
        }
        self.entries.insert(id, TaskEntry { task, version, seq, placement, events });
        old
    }

    /// Takes a record out, and out of every index.
    pub(super) fn remove(&mut self, id: &TaskId) -> Option<TaskEntry> {
        let old = self.entries.remove(id)?;
        if let Some(p) = &old.placement {
            if let Some(s) = self.by_host.get_mut(&p.host) {
                s.remove(id);
                if s.is_empty() {
                    self.by_host.remove(&p.host);
                }
            }
        }
        if let Some(q) = self.pending.get_mut(&old.task.pool) {
            q.remove(&old.seq);
            if q.is_empty() {
                self.pending.remove(&old.task.pool);
            }
        }
        if let Some(g) = &old.task.group {
            if let Some(s) = self.by_service.get_mut(g) {
                s.remove(id);
                if s.is_empty() {
                    self.by_service.remove(g);
                }
            }
        }
        Some(old)
    }

    /// Why a waiting task waits: derived state, refreshed in memory on every placement retry.
    /// True when the reason changed.
    pub(super) fn set_pending_reason(
        &mut self,
        id: &TaskId,
        reason: &str,
        code: PendingCode,
        unplaceable: bool,
    ) -> bool {
        match self.entries.get_mut(id) {
            Some(e) if e.task.pending_reason.as_deref() != Some(reason) => {
                e.task.pending_reason = Some(reason.to_string());
                e.task.pending_code = Some(code);
                e.task.unplaceable = unplaceable;
                true
            }
            _ => false,
        }
    }

    /// Records changes in a task's events (kept in memory only).
    pub(super) fn record(&mut self, id: &TaskId, now: u64, entries: Vec<TaskChange>) {
        if let Some(e) = self.entries.get_mut(id) {
            for ev in entries {
                e.events.push(now, ev);
            }
        }
    }

    /// Live tasks placed on the host.
    pub(super) fn on_host(&self, ix: HostIx) -> &BTreeSet<TaskId> {
        self.by_host.get(&ix).unwrap_or(&NONE)
    }

    /// Live tasks of the service.
    pub(super) fn of_service(&self, name: &ServiceName) -> &BTreeSet<TaskId> {
        self.by_service.get(name).unwrap_or(&NONE)
    }

    /// Waiting tasks of the pool, oldest first.
    pub(super) fn pending_in(&self, pool: &PoolName) -> Vec<TaskId> {
        self.pending.get(pool).map(|q| q.values().copied().collect()).unwrap_or_default()
    }

    /// Pools with waiting tasks.
    pub(super) fn pools_with_pending(&self) -> Vec<PoolName> {
        self.pending.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{Family, TaskDefRef};

    fn task(id: u64, status: TaskStatus, group: Option<&str>) -> Task {
        let mut t = Task::new(
            TaskId(id),
            TaskDefRef { family: Family::new("f").unwrap(), revision: 1 },
            PoolName::new("p").unwrap(),
            group.map(|g| ServiceName::new(g).unwrap()),
            "test".into(),
            0,
        );
        t.last_status = status;
        t
    }

    fn placed(host: HostIx) -> Option<Placement> {
        Some(Placement { host, gpus: Vec::new() })
    }

    /// Every move a task makes (waiting, placed, moved, stopped, removed) leaves it in exactly
    /// the indexes its record says.
    #[test]
    fn indexes_follow_the_record_through_its_life() {
        let mut t = TaskTable::default();
        let p = PoolName::new("p").unwrap();
        let web = ServiceName::new("web").unwrap();
        t.put(task(1, TaskStatus::Pending, Some("web")), 1, None);
        t.put(task(2, TaskStatus::Pending, None), 1, None);
        assert_eq!(t.pending_in(&p), [TaskId(1), TaskId(2)]);
        assert!(t.of_service(&web).contains(&TaskId(1)));
        // Placed: out of the queue, onto the host; the order it was created in is kept.
        t.put(task(1, TaskStatus::Pending, Some("web")), 2, placed(3));
        assert_eq!(t.pending_in(&p), [TaskId(2)]);
        assert_eq!(t.on_host(3).iter().copied().collect::<Vec<_>>(), [TaskId(1)]);
        assert_eq!(t.get(&TaskId(1)).unwrap().seq, 0);
        t.put(task(1, TaskStatus::Running, Some("web")), 3, placed(3));
        assert_eq!(t.on_host(3).len(), 1);
        // Stopped: in no index, still a record.
        t.put(task(1, TaskStatus::Stopped, Some("web")), 4, None);
        assert!(t.on_host(3).is_empty() && t.of_service(&web).is_empty());
        assert_eq!(t.get(&TaskId(1)).unwrap().version, 4);
        assert_eq!(t.pools_with_pending(), std::slice::from_ref(&p));
        t.remove(&TaskId(2));
        assert!(t.pools_with_pending().is_empty());
        assert!(t.remove(&TaskId(1)).is_some() && t.values().count() == 0);
    }
}
