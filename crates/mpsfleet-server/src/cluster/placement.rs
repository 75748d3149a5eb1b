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
        // A service's tasks spread by deployment: a rollout's new tasks spread among themselves,
        // as they will be once the older ones stop.
        let group = task.group.as_ref().map(|g| match &task.deployment {
            Some(d) => self.sched.group(&format!("{g}/{d}")),
            None => self.sched.group(g.as_str()),
        });
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
                task.unplaceable = false;
            }
            Err(unplaced) => {
                let (why, code, unplaceable) = self.waiting(task, unplaced);
                task.host_id = None;
                task.placed_at_ms = None;
                task.gpu_ids.clear();
                task.pending_reason = Some(why);
                task.pending_code = Some(code);
                task.unplaceable = unplaceable;
            }
        }
    }

    /// Why a task waits: its reason (naming the task definition's field that asks for what no
    /// host offers), its code, and whether nothing will ever place it by itself.
    fn waiting(
        &self,
        task: &Task,
        unplaced: &mpsfleet_core::scheduler::Unplaced,
    ) -> (String, PendingCode, bool) {
        use mpsfleet_core::scheduler::Unplaced as U;
        let field = || {
            let key = (task.task_definition.family.clone(), task.task_definition.revision);
            let td = self.state.taskdefs().get(&key);
            td.and_then(|v| v.value.container_runtime_field()).unwrap_or_else(|| "its task definition".into())
        };
        match unplaced {
            U::NoContainerHost { pool } => {
                let mut why = format!(
                    "no schedulable host in pool {pool} runs containers, which {} needs; start an agent \
                     with --runtime docker",
                    field()
                );
                let never = !self.may_ever_run_containers(&task.pool);
                if never {
                    why += "; no host of the pool runs containers and its provider launches none: nothing \
                            places the task until such a host joins";
                }
                (why, unplaced.code(), never)
            }
            U::NoFittingContainerHost { pool } => (
                format!(
                    "no host in pool {pool} that runs containers has room for the task, which {} needs; \
                     free capacity there or start an agent with --runtime docker",
                    field()
                ),
                unplaced.code(),
                false,
            ),
            other => (other.to_string(), other.code(), false),
        }
    }

    /// Whether a host that runs containers is in the pool (in any state but DEREGISTERED: a
    /// cordoned or impaired one may come back) or may come from its provider: any but a local
    /// one whose agents are started with `--runtime process`.
    fn may_ever_run_containers(&self, pool: &PoolName) -> bool {
        let hosts = self.state.hosts().iter().map(|e| e.host());
        if hosts
            .filter(|h| &h.pool == pool)
            .any(|h| h.status != HostStatus::Deregistered && h.runtime.runs_images())
        {
            return true;
        }
        let kind = self.state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|pr| pr.kind);
        match kind {
            None => false,
            Some(ProviderKind::Local) => self.providers.ctx.as_ref().is_none_or(|ctx| {
                let args = &ctx.local_agent_args;
                !args.windows(2).any(|w| w[0] == "--runtime" && w[1] == "process")
            }),
            Some(_) => true,
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
                    let (why, code, unplaceable) = self.waiting(&task, &unplaced);
                    let why = format!("{why}{scaling}");
                    let code = if scaling_out { PendingCode::ScalingOut } else { code };
                    if self.state.set_pending_reason(&id, &why, code, unplaceable) {
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
