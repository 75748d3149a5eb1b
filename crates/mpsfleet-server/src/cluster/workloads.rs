//! The workloads room: task definitions (register, describe, deregister, delete, tags) and
//! tasks (run, describe, list, stop, protect, their logs), with the idempotency of RunTask
//! (`idempotency.rs`). A request that creates tasks places them in its own commit, so its
//! answer shows them placed, as ECS's RunTask does; everything after is the controllers'.

use super::catalog::*;
use super::idempotency::*;
use super::logs::*;
use super::register::*;
use super::*;
use crate::auth;
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::api::RegisterTaskDefResponse;
use mpsfleet_types::labels::{check_tags, merge_tags, Tag};
use mpsfleet_types::labels::{DEFAULT_PROTECTION_MINUTES, MAX_PROTECTION_MINUTES};
use mpsfleet_types::Family;
use mpsfleet_types::{PoolName, TaskId};
use std::collections::BTreeSet;
use std::sync::Arc;

impl Cluster {
    pub fn stop_task(&mut self, id: &str, reason: Option<String>) -> Result<Task, Error> {
        let task = self.read().task(id)?;
        if task.desired_status == TaskStatus::Stopped {
            return Ok(task);
        }
        if task.draining.is_some() {
            // Already leaving traffic: its service stops it when its delay is over.
            return Ok(task);
        }
        let reason = reason.unwrap_or_else(|| "stopped by the user".to_string());
        // A service's replica in traffic leaves it first, as a planned stop does.
        let delay = task.group.as_ref().and_then(|g| self.state.services().get(g));
        let delay = delay.map_or(0, |s| s.value.deregistration_delay_seconds);
        let t = self.read().planned_stop(&task, delay, StopCode::UserInitiated, &reason, self.now());
        if matches!(self.broken, broken::Switch::LostStops) {
            return Ok(t);
        }
        self.writing(|w| w.write_tasks(vec![t]))?;
        // Its service (if any) starts a replacement on the next pass of the work queue; the
        // stop, committed, is not answered with an error of that reconcile.
        self.writer().ask_for_group(task.group.as_ref());
        self.read().task(id)
    }

    pub fn tasks(&self, filter: &TaskFilter) -> Vec<Task> {
        if let Some(stale) = self.broken.stale_tasks(filter) {
            return stale;
        }
        let mut out: Vec<&TaskEntry> = self.read().matching_tasks(filter).collect();
        if filter.newest_first {
            out.sort_by_key(|e| std::cmp::Reverse(e.seq));
        } else {
            out.sort_by_key(|e| e.seq);
        }
        out.into_iter().skip(filter.skip).take(filter.limit).map(|e| e.task.clone()).collect()
    }

    /// A task run whose tasks carry `started_by`.
    pub(super) fn run_tasks_started_by(
        &mut self,
        req: RunTask,
        started_by: String,
    ) -> Result<RunOutcome, Error> {
        if req.count == 0 || req.count > MAX_RUN_COUNT {
            return Err(Error::invalid(
                "count",
                format!("must be an integer from 1 to {MAX_RUN_COUNT}, got {}", req.count),
            ));
        }
        let pool = pool_name(&self.state, "pool", &req.pool)?;
        let td = self.read().taskdef_to_run("taskDefinition", &req.task_definition)?;
        self.check_task_secrets(td)?;
        self.read().check_task_policy(&pool, td)?;
        let labels = run_labels(&req, td)?;
        let priority = place::priority_for(req.priority, &req.tags, td)?;
        let td = td.reference();
        let spec = NewTasks {
            task_definition: td,
            pool,
            group: None,
            started_by,
            labels,
            deployment: None,
            priority,
            recovery_from: None,
            enable_execute_command: req.enable_execute_command.unwrap_or(true),
        };
        let tasks = self.writing(|w| w.start_tasks(spec, req.count))?;
        let placed = tasks.iter().filter(|t| t.host_id.is_some()).count() as u32;
        Ok(RunOutcome { pending: tasks.len() as u32 - placed, placed, tasks })
    }

    pub fn run_tasks(&mut self, req: RunTask) -> Result<RunOutcome, Error> {
        let started_by = format!("run:{:016x}", auth::random_u64()?);
        self.run_tasks_started_by(req, started_by)
    }

    /// ECS's StartTask: one task of `req` on host `host`, placed now, or why it does not fit
    /// there (nothing is made then). The host must be in `req.pool`.
    pub fn start_task_on(
        &mut self,
        req: &RunTask,
        host: &str,
    ) -> Result<Result<Task, mpsfleet_core::scheduler::Unplaced>, Error> {
        let pool = pool_name(&self.state, "cluster", &req.pool)?;
        let ix = self.read().host_ix(host)?;
        if self.state.hosts()[ix as usize].host().pool != pool {
            return Err(Error::not_found("host", host));
        }
        let td = self.read().taskdef_to_run("taskDefinition", &req.task_definition)?;
        self.check_task_secrets(td)?;
        self.read().check_task_policy(&pool, td)?;
        let labels = run_labels(req, td)?;
        let priority = place::priority_for(req.priority, &req.tags, td)?;
        let reference = td.reference();
        let started_by = format!("run:{:016x}", auth::random_u64()?);
        let mut task = Task::new(self.writer().next_task_id(), reference, pool, None, started_by, self.now());
        task.labels = labels;
        task.priority = priority;
        task.enable_execute_command = req.enable_execute_command.unwrap_or(true);
        self.writing(|w| w.start_one_on(task, ix))
    }

    // ---- pools --------------------------------------------------------------------------

    // ---- task definitions ---------------------------------------------------------------

    /// Parses and registers a definition. The API parses before it takes the cluster lock and
    /// calls [`Cluster::register_valid_taskdef`].
    pub fn register_taskdef(&mut self, body: &[u8]) -> Result<RegisterTaskDefResponse, Error> {
        self.register_valid_taskdef(ValidTaskDef::parse(body)?)
    }
}

impl Cluster {
    /// Registers a validated definition as the next revision of its family.
    pub fn register_valid_taskdef(&mut self, v: ValidTaskDef) -> Result<RegisterTaskDefResponse, Error> {
        let family = v.parsed.definition.family.clone();
        let revision = latest_revision(&self.state, &family).map_or(1, |r| r + 1);
        let registered_at_ms = self.now();
        let value = v.record(&family, revision, registered_at_ms)?;
        let key = super::taskdef_key(&family, revision);
        let mut td = v.parsed.definition;
        td.revision = revision;
        td.registered_at_ms = registered_at_ms;
        let reference = td.reference();
        let op = Op::Put { kind: TASKDEF.into(), key, value, expect: Precondition::Absent };
        self.write(&[op], [Change::TaskDef(Arc::new(td))])?;
        Ok(RegisterTaskDefResponse { task_definition: reference, ignored_fields: v.parsed.ignored_fields })
    }
}

impl Cluster {
    /// Adds `add` to the tags of what `target` names (a key there takes the new value) and
    /// removes the keys in `remove`; at most 50 tags stay.
    pub fn retag(&mut self, target: &Tagged, add: &[Tag], remove: &[String]) -> Result<Vec<Tag>, Error> {
        check_tags("tags", add).map_err(invalid)?;
        let change = |tags: &mut Vec<Tag>| -> Result<(), Error> {
            merge_tags(tags, add);
            tags.retain(|t| !remove.contains(&t.key));
            check_tags("tags", tags).map_err(invalid)
        };
        match target {
            Tagged::CapacityProvider(n) => self.retag_capacity_provider(n, add, remove),
            Tagged::Pool(p) => {
                let current = self.state.pools().get(&pool_name(&self.state, "resourceArn", p)?).cloned();
                let current = current.ok_or_else(|| Error::not_found("pool", p))?;
                let mut pool = current.value.clone();
                change(&mut pool.tags)?;
                let tags = pool.tags.clone();
                self.writing(|w| write_pool(w, pool, current.version))?;
                Ok(tags)
            }
            Tagged::TaskDef(r) => {
                let current = taskdef_revision(&self.state, r)?;
                let mut td = (*current.value).clone();
                change(&mut td.tags)?;
                Ok(self.writing(|w| write_taskdef(w, td, current.version))?.tags.clone())
            }
            Tagged::Service(s) => {
                let mut svc = service_record(&self.state, s)?.value;
                change(&mut svc.tags)?;
                let tags = svc.tags.clone();
                self.writing(|w| controllers::services::write_service(w, svc))?;
                Ok(tags)
            }
            Tagged::Task(t) => {
                let mut task = self.read().task(t)?;
                let labels = task.labels.get_or_insert_with(Default::default);
                change(&mut labels.tags)?;
                if labels.is_empty() {
                    task.labels = None;
                }
                let version = self.state.tasks().get(&task.id).map_or(0, |e| e.version);
                let op = Op::put_json(TASK, task.id.to_string(), &task, Precondition::Version(version))?;
                let tags = task.tags().to_vec();
                let placement = self.state.tasks().get(&task.id).and_then(|e| e.placement.clone());
                self.write(&[op], [Change::Task(task, placement)])?;
                Ok(tags)
            }
        }
    }

    /// The tags of what `target` names.
    pub fn tags_of(&self, target: &Tagged) -> Result<Vec<Tag>, Error> {
        Ok(match target {
            Tagged::Pool(p) => self.read().pool(p)?.tags,
            Tagged::TaskDef(r) => taskdef_revision(&self.state, r)?.value.tags.clone(),
            Tagged::Service(s) => service_record(&self.state, s)?.value.tags,
            Tagged::Task(t) => self.read().task(t)?.tags().to_vec(),
            Tagged::CapacityProvider(n) => self.capacity_provider(n)?.tags,
        })
    }

    /// Marks a task definition revision deregistered: what runs it goes on, nothing new
    /// starts from it, and `family` alone names the latest revision still registered.
    pub fn deregister_taskdef(&mut self, reference: &str) -> Result<Arc<TaskDefinition>, Error> {
        let current = taskdef_revision(&self.state, reference)?;
        if current.value.deregistered_at_ms.is_some() {
            return Ok(current.value);
        }
        let mut td = (*current.value).clone();
        td.deregistered_at_ms = Some(self.now());
        self.writing(|w| write_taskdef(w, td, current.version))
    }

    /// Deletes deregistered task definition revisions (ECS's `DeleteTaskDefinitions`): a
    /// revision still registered is refused, and so is one a task not yet stopped or a
    /// service still runs. Answers each reference's outcome in order.
    pub fn delete_taskdefs(
        &mut self,
        references: &[String],
    ) -> Result<Vec<Result<Arc<TaskDefinition>, String>>, Error> {
        let mut out = Vec::with_capacity(references.len());
        for r in references {
            let Ok(parsed) = TaskDefRef::parse(r) else {
                out.push(Err("The specified task definition identifier is invalid. Specify a valid name or ARN and try again.".to_string()));
                continue;
            };
            let Some(current) = self.state.taskdefs().get(&(parsed.family.clone(), parsed.revision)).cloned()
            else {
                out.push(Err("The specified task definition does not exist. Specify a valid account, family, revision and try again.".to_string()));
                continue;
            };
            if current.value.deregistered_at_ms.is_none() {
                out.push(Err("The specified task definition is still in ACTIVE status. Please deregister the target and try again.".to_string()));
                continue;
            }
            let used = self
                .state
                .tasks()
                .values()
                .any(|e| e.task.task_definition == parsed && e.task.last_status != TaskStatus::Stopped)
                || self
                    .state
                    .services()
                    .values()
                    .any(|s| s.value.deployments.iter().any(|d| d.task_definition == parsed));
            if used {
                out.push(Err(format!("{r} is still used by a task or a service: stop them first")));
                continue;
            }
            self.write(
                &[Op::delete(
                    TASKDEF,
                    taskdef_key(&parsed.family, parsed.revision),
                    Precondition::Version(current.version),
                )],
                [Change::TaskDefRemoved(parsed.family, parsed.revision)],
            )?;
            out.push(Ok(current.value));
        }
        Ok(out)
    }

    /// Empties what the ECS-compatible API shows (pools, task definitions, services, tasks):
    /// the conformance suite's reset before each of its tests. Hosts, tokens and the audit log
    /// stay. Only a server started for the suite (`--ecs-conformance`) offers it.
    pub fn empty_for_conformance(&mut self) -> Result<(), Error> {
        let pools: Vec<PoolName> = self.state.pools().keys().cloned().collect();
        let defs: Vec<(Family, u32)> = self.state.taskdefs().keys().cloned().collect();
        let services: Vec<ServiceName> = self.state.services().keys().cloned().collect();
        let tasks: Vec<TaskId> = self.state.tasks().values().map(|e| e.task.id).collect();
        let mut ops: Vec<Op> =
            pools.iter().map(|p| Op::delete(POOL, p.as_str(), Precondition::Any)).collect();
        ops.extend(defs.iter().map(|(f, r)| Op::delete(TASKDEF, taskdef_key(f, *r), Precondition::Any)));
        ops.extend(services.iter().map(|s| Op::delete(SERVICE, s.as_str(), Precondition::Any)));
        ops.extend(tasks.iter().map(|t| Op::delete(TASK, t.to_string(), Precondition::Any)));
        ops.extend(self.capacity_provider_deletes()?);
        if ops.is_empty() {
            return Ok(());
        }
        let mut placed = Vec::new();
        for id in &tasks {
            if let Some(e) = self.state.tasks().get(id) {
                if let (Some(p), Ok(req)) = (
                    e.placement.clone(),
                    place::request_for(&self.state, &mut self.sched, &e.task.clone(), 0),
                ) {
                    placed.push((req, p));
                }
            }
        }
        let changes = (tasks.into_iter().map(Change::TaskRemoved))
            .chain(services.into_iter().map(Change::ServiceRemoved))
            .chain(defs.into_iter().map(|(f, r)| Change::TaskDefRemoved(f, r)))
            .chain(pools.into_iter().map(Change::PoolRemoved));
        self.write(&ops, changes)?;
        for (req, p) in placed {
            self.sched.release(&req, &p);
        }
        let deleted: Vec<String> = self.state.deleted().keys().cloned().collect();
        forget_deleted(&mut self.writer(), deleted);
        Ok(())
    }
}

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
            let mut t = self.read().task(id)?;
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

impl Cluster {
    /// `task run` with its client token, if any, for `actor`.
    pub fn run_tasks_as(&mut self, mut req: RunTask, actor: &str) -> Result<RunOutcome, Error> {
        let token = req.client_token.take();
        let started_by = format!("run:{:016x}", crate::auth::random_u64()?);
        let replay = Replay::Tasks { started_by: started_by.clone() };
        self.idempotent(
            (actor, "POST /v1/tasks", token),
            req,
            replay,
            |c, req| c.run_tasks_started_by(req, started_by),
            |c, replay| match replay {
                Replay::Tasks { started_by } => Ok(tasks_started_by(&c.state, &started_by)),
                Replay::Service { .. } => Err(mismatched()),
            },
        )
    }
}

impl Cluster {
    /// Where to read a task's logs from. A task that is no longer known but has a snapshot (it
    /// was removed) is served from the snapshot; without either it is not found.
    pub fn logs_plan(&self, id: &str) -> Result<LogsPlan, Error> {
        let snapshot = |task_id: &TaskId| self.output.get(task_id).map(|(at, s)| (at, s.clone()));
        let task = match self.read().task(id) {
            Ok(t) => t,
            Err(e) => {
                let Some(task_id) = TaskId::parse(id).ok() else { return Err(e) };
                let Some(snapshot) = snapshot(&task_id) else { return Err(e) };
                return Ok(LogsPlan {
                    task_id,
                    agent: Err(format!("task {id} is no longer known")),
                    snapshot: Some(snapshot),
                });
            }
        };
        let agent = match task.host_id.as_ref() {
            None => Err(format!("task {id} never ran on a host")),
            Some(h) => self.agent_endpoint(h),
        };
        Ok(LogsPlan { task_id: task.id, agent, snapshot: snapshot(&task.id) })
    }
}

/// The newest revision of `family`, deregistered or not: the next one registered follows it.
pub(super) fn latest_revision(state: &State, family: &Family) -> Option<u32> {
    state.taskdefs().range((family.clone(), 0)..=(family.clone(), u32::MAX)).next_back().map(|((_, r), _)| *r)
}

/// The newest revision of `family` still registered.
pub(super) fn latest_active_revision(state: &State, family: &Family) -> Option<u32> {
    state
        .taskdefs()
        .range((family.clone(), 0)..=(family.clone(), u32::MAX))
        .rev()
        .find(|(_, v)| v.value.deregistered_at_ms.is_none())
        .map(|((_, r), _)| *r)
}

pub(super) fn write_taskdef(
    w: &mut Writer<'_>,
    td: TaskDefinition,
    version: Revision,
) -> Result<Arc<TaskDefinition>, Error> {
    let key = taskdef_key(&td.family, td.revision);
    let op = Op::put_json(TASKDEF, &key, &td, Precondition::Version(version))?;
    let td = Arc::new(td);
    w.write(&[op], [Change::TaskDef(td.clone())])?;
    Ok(td)
}

/// A task definition by `family:revision` exactly, with its record's version.
pub(super) fn taskdef_revision(
    state: &State,
    reference: &str,
) -> Result<Versioned<Arc<TaskDefinition>>, Error> {
    let r = TaskDefRef::parse(reference).map_err(|e| Error::invalid("taskDefinition", e.to_string()))?;
    state
        .taskdefs()
        .get(&(r.family, r.revision))
        .cloned()
        .ok_or_else(|| Error::not_found("task definition", reference))
}

pub(super) fn load_client_tokens(store: &dyn Store, state: &mut State) -> Result<(), Error> {
    let mut all = Vec::new();
    for r in store.list(CLIENT_TOKEN)? {
        let rec: ClientTokenRecord = decode(&r)?;
        all.push((r.key.clone(), rec));
    }
    all.sort_by_key(|(k, r)| (r.created_at_ms, k.clone()));
    for (key, rec) in all {
        state.apply(0, Change::ClientToken { key, rec, pruned: Vec::new() });
    }
    Ok(())
}

/// The tasks started with `started_by`, as a task run's answer, in the order they were made.
pub(super) fn tasks_started_by(state: &State, started_by: &str) -> RunOutcome {
    let mut found: Vec<&TaskEntry> =
        state.tasks().values().filter(|e| e.task.started_by == started_by).collect();
    found.sort_by_key(|e| e.seq);
    let tasks: Vec<Task> = found.into_iter().map(|e| e.task.clone()).collect();
    let placed = tasks.iter().filter(|t| t.host_id.is_some()).count() as u32;
    RunOutcome { pending: tasks.len() as u32 - placed, placed, tasks }
}

impl<'a> Reader<'a> {
    /// [`Cluster::taskdef`] for a new task or deployment: a deregistered revision starts
    /// nothing new.
    pub(super) fn taskdef_to_run(&self, field: &str, reference: &str) -> Result<&'a TaskDefinition, Error> {
        let td = self.taskdef(field, reference)?;
        if td.deregistered_at_ms.is_some() {
            return Err(Error::invalid(
                field,
                format!("{} is deregistered (INACTIVE): register a new revision", td.reference()),
            ));
        }
        Ok(td)
    }

    /// Resolves `family` (latest revision) or `family:revision`.
    pub fn taskdef(&self, field: &str, reference: &str) -> Result<&'a TaskDefinition, Error> {
        self.taskdef_shared(field, reference).map(|td| td.as_ref())
    }

    /// [`Reader::taskdef`], shared: for a caller that encodes it after the lock.
    pub fn taskdef_shared(&self, field: &str, reference: &str) -> Result<&'a Arc<TaskDefinition>, Error> {
        let (family, revision) = match reference.rsplit_once(':') {
            Some(_) => {
                let r = TaskDefRef::parse(reference).map_err(|e| Error::invalid(field, e.to_string()))?;
                (r.family, Some(r.revision))
            }
            None => (Family::new(reference).map_err(|e| Error::invalid(field, e.to_string()))?, None),
        };
        let revision = revision.or_else(|| latest_active_revision(self.state, &family));
        revision
            .and_then(|r| self.state.taskdefs().get(&(family.clone(), r)))
            .map(|v| &v.value)
            .ok_or_else(|| Error::not_found("task definition", reference))
    }

    /// The definitions (of `family`), shared: the caller encodes them after the lock.
    pub fn taskdefs(&self, family: Option<&str>) -> Vec<Arc<TaskDefinition>> {
        self.state
            .taskdefs()
            .values()
            .filter(|v| family.is_none_or(|f| v.value.family.as_str() == f))
            .map(|v| v.value.clone())
            .collect()
    }

    /// A task's events in words, oldest first.
    pub fn task_events(&self, id: &str) -> Result<History<ObjectEvent>, Error> {
        let id = TaskId::parse(id).map_err(|_| Error::not_found("task", id))?;
        let e = self.state.tasks().get(&id).ok_or_else(|| Error::not_found("task", id.to_string()))?;
        Ok(mpsfleet_core::changes::task_events(&e.task, &e.events))
    }

    pub fn task(&self, id: &str) -> Result<Task, Error> {
        TaskId::parse(id)
            .ok()
            .and_then(|id| self.state.tasks().get(&id))
            .map(|e| e.task.clone())
            .ok_or_else(|| Error::not_found("task", id))
    }

    /// Every task `filter` matches, unordered, read in place (nothing is copied): for counts
    /// and for lists that keep a few fields of each. `skip`, `limit` and the order are the
    /// caller's.
    pub fn visit_tasks(&self, filter: &TaskFilter, mut f: impl FnMut(&Task)) {
        self.matching_tasks(filter).for_each(|e| f(&e.task));
    }

    pub(super) fn matching_tasks<'f>(
        &self,
        filter: &'f TaskFilter,
    ) -> impl Iterator<Item = &'a TaskEntry> + 'f
    where
        'a: 'f,
    {
        (self.state.tasks())
            .values()
            .filter(|e| filter.pool.as_deref().is_none_or(|p| e.task.pool.as_str() == p))
            .filter(|e| {
                filter
                    .service
                    .as_deref()
                    .is_none_or(|s| e.task.group.as_ref().is_some_and(|g| g.as_str() == s))
            })
            .filter(|e| {
                filter
                    .host
                    .as_deref()
                    .is_none_or(|h| e.task.host_id.as_ref().is_some_and(|x| x.as_str() == h))
            })
            .filter(|e| filter.status.is_none_or(|s| e.task.last_status == s))
            .filter(|e| !filter.live || e.task.last_status != TaskStatus::Stopped)
    }

    pub fn client_token_count(&self) -> usize {
        self.state.client_tokens().by_key.len()
    }
}
