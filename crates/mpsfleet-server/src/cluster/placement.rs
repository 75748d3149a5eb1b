//! Placement: what a task asks of the scheduler, the placement it holds, and placing a pool's
//! waiting tasks (the placement controller's reconcile, `Work::Placement`).

use super::*;

impl Cluster {
    pub(super) fn request_for(&mut self, task: &Task) -> Result<Request, Error> {
        let pool = self.sched.pool(task.pool.as_str()).ok_or_else(|| {
            Error::StoreCorrupt(format!("task {} names unknown pool {}", task.id, task.pool))
        })?;
        let (demand, needs) = self
            .state
            .taskdefs()
            .get(&(task.task_definition.family.clone(), task.task_definition.revision))
            .map(|v| {
                let td = &v.value;
                // More static host ports than one task may hold make a task that waits with
                // that reason (`Unplaced::TooManyHostPorts`), not a refused call.
                let needs = mpsfleet_core::scheduler::Needs::new(
                    td.needs_container_runtime(),
                    &td.static_host_ports(),
                );
                (td.gpu_demand(), needs)
            })
            .ok_or_else(|| {
                Error::StoreCorrupt(format!("task {} names unknown {}", task.id, task.task_definition))
            })?;
        let group = task.group.as_ref().map(|g| self.sched.group(g.as_str()));
        Ok(Request { pool, demand, group, needs })
    }

    /// The scheduler placement a stored task holds (host and GPU uuids mapped to indices).
    pub(super) fn placement_of(&self, task: &Task) -> Option<Placement> {
        let host = self.sched.host(task.host_id.as_ref()?)?;
        let inv = &self.state.hosts()[host as usize].host().gpus;
        let first = self.sched.host_gpus(host).start;
        let gpus = task
            .gpu_ids
            .iter()
            .filter_map(|u| inv.iter().position(|g| &g.uuid == u).map(|p| first + p as u32))
            .collect();
        Some(Placement { host, gpus })
    }

    pub(super) fn apply_placement(
        &self,
        task: &mut Task,
        outcome: &Result<Placement, mpsfleet_core::scheduler::Unplaced>,
    ) {
        match outcome {
            Ok(p) => {
                let entry = &self.state.hosts()[p.host as usize];
                let first = self.sched.host_gpus(p.host).start;
                if task.host_id.as_ref() != Some(&entry.host().id) {
                    task.placed_at_ms = Some(self.now());
                }
                task.host_id = Some(entry.host().id.clone());
                task.gpu_ids =
                    p.gpus.iter().map(|&g| entry.host().gpus[(g - first) as usize].uuid.clone()).collect();
                task.pending_reason = None;
                task.pending_code = None;
            }
            Err(why) => {
                task.host_id = None;
                task.placed_at_ms = None;
                task.gpu_ids.clear();
                task.pending_reason = Some(why.to_string());
                task.pending_code = Some(why.code());
            }
        }
    }

    /// Tries to place the waiting tasks of a pool, oldest first, in one batch.
    pub fn place_pending(&mut self, pool: &PoolName) -> Result<(), Error> {
        let waiting = self.state.tasks().pending_in(pool);
        let (scaling, scaling_out) = self.scaling_note(pool);
        let mut placed: Vec<(Task, Placement, Request)> = Vec::new();
        let mut ops = Vec::new();
        for id in waiting {
            let Some(e) = self.state.tasks().get(&id) else { continue };
            if e.task.desired_status == TaskStatus::Stopped {
                continue;
            }
            let mut task = e.task.clone();
            let version = e.version;
            let req = self.request_for(&task)?;
            match self.sched.place(&req) {
                Ok(p) => {
                    self.apply_placement(&mut task, &Ok(p.clone()));
                    ops.push(Op::put_json(TASK, id.to_string(), &task, Precondition::Version(version))?);
                    placed.push((task, p, req));
                }
                // The reason is derived state: refreshed in memory, not written on every retry.
                Err(unplaced) => {
                    let why = format!("{unplaced}{scaling}");
                    let code = if scaling_out { PendingCode::ScalingOut } else { unplaced.code() };
                    if self.state.set_pending_reason(&id, &why, code) {
                        let news = vec![mpsfleet_core::changes::TaskChange::Unplaced(why)];
                        self.record_task(id, pool.clone(), news);
                    }
                }
            }
        }
        if placed.is_empty() {
            return Ok(());
        }
        let rev = match self.commit(&ops) {
            Ok(rev) => rev,
            Err(e) => {
                for (_, p, req) in placed.iter().rev() {
                    self.sched.release(req, p);
                }
                return Err(e);
            }
        };
        for (task, p, _) in placed {
            self.state.host_mut(p.host).epoch = rev;
            self.put_task(task, rev, Some(p));
        }
        Ok(())
    }
}
