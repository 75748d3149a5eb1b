//! Task scale-in protection (ECS's `UpdateTaskProtection`, `GetTaskProtection`): a task that
//! asks not to be disrupted (a job mid-way through its work) is neither scaled in nor
//! replaced by its service's deployment until its protection expires; the service waits for
//! it and looks again then (`services.rs`). A host with any task is never scaled in anyway
//! (`scaling.rs`). The protection is kept with the task's labels, in its record.

use super::*;
use mpsfleet_types::labels::{DEFAULT_PROTECTION_MINUTES, MAX_PROTECTION_MINUTES};

impl Cluster {
    /// Protects the tasks `ids` for `minutes` (default 120, at most 2880), or ends their
    /// protection (`enabled` false). Every id is checked before anything is written: a task
    /// that is not found or has stopped refuses the whole call, naming it.
    pub fn protect_tasks(
        &mut self,
        ids: &[String],
        enabled: bool,
        minutes: Option<u32>,
    ) -> Result<Vec<Task>, Error> {
        let minutes = minutes.unwrap_or(DEFAULT_PROTECTION_MINUTES);
        if enabled && !(1..=MAX_PROTECTION_MINUTES).contains(&minutes) {
            return Err(Error::invalid(
                "expiresInMinutes",
                format!("must be from 1 to {MAX_PROTECTION_MINUTES}, got {minutes}"),
            ));
        }
        let now = self.now();
        let until = enabled.then(|| now + u64::from(minutes) * 60_000);
        let mut changed = Vec::with_capacity(ids.len());
        for id in ids {
            let mut t = self.task(id)?;
            if t.desired_status == TaskStatus::Stopped {
                return Err(Error::Conflict(format!(
                    "task {id} is stopped or stopping: it cannot be protected"
                )));
            }
            let labels = t.labels.get_or_insert_with(Default::default);
            labels.protected_until_ms = until;
            if labels.is_empty() {
                t.labels = None;
            }
            changed.push(t);
        }
        let groups: BTreeSet<ServiceName> = changed.iter().filter_map(|t| t.group.clone()).collect();
        self.writing(|w| w.write_tasks(changed.clone()))?;
        // Its service may stop it now that its protection has ended.
        for g in groups {
            self.ask(super::work::Work::Service(g));
        }
        Ok(changed)
    }
}
