//! What the ECS-compatible API needs beyond creating and running: deleting an empty pool
//! (ECS's `DeleteCluster`; a deleted pool stays discoverable as INACTIVE for an hour, as
//! ECS's deleted clusters do: `deleted.rs`), deregistering a task definition (`DeregisterTaskDefinition`: it
//! stays, marked, and starts nothing new), and tagging pools, task definitions, services and
//! tasks (`TagResource`, `UntagResource`). Each is one committed change of the object's record.

use super::deleted::{Deleted, DeletedObject, DELETED, KEPT_MS};
use super::*;
use mpsfleet_types::labels::{check_tags, merge_tags, Tag};
use std::collections::BTreeMap;

/// What a pool holds ([`Cluster::pool_contents`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolContents {
    /// Hosts but deregistered ones.
    pub hosts: usize,
    /// Services, active or being deleted; and the active ones.
    pub services: usize,
    pub active_services: usize,
    /// Tasks running; waiting to (placed or not); on their way to STOPPED.
    pub running: usize,
    pub pending: usize,
    pub stopping: usize,
}

impl PoolContents {
    /// Tasks not stopped.
    pub fn live_tasks(&self) -> usize {
        self.running + self.pending + self.stopping
    }
}

/// What a tag change names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tagged {
    Pool(String),
    TaskDef(String),
    Service(String),
    Task(String),
    CapacityProvider(String),
}

impl Tagged {
    /// What reading (`change`: changing) its tags touches, for a pool-scoped caller.
    pub fn touch(&self, change: bool) -> Touch {
        match self {
            Tagged::Pool(p) => Touch::Object(Kind::Pool, p.clone()),
            Tagged::Service(s) => Touch::Object(Kind::Service, s.clone()),
            Tagged::Task(t) => Touch::Object(Kind::Task, t.clone()),
            // Task definitions belong to no pool: every caller reads them, and changing one
            // reaches beyond one pool, as registering does.
            Tagged::TaskDef(_) | Tagged::CapacityProvider(_) if change => Touch::Cluster,
            Tagged::TaskDef(_) | Tagged::CapacityProvider(_) => Touch::NoPool,
        }
    }
}

fn invalid((field, message): (String, String)) -> Error {
    Error::InvalidParameter { field, message }
}

impl Cluster {
    /// What pool `name` holds, read in place: its hosts but deregistered ones, its services
    /// (active or being deleted) and its tasks by phase. What a pool must be empty of to be
    /// deleted, and what ECS's DescribeClusters counts.
    pub fn pool_contents(&self, name: &str) -> Result<PoolContents, Error> {
        let pool = self.pool_name("cluster", name).map_err(|_| Error::not_found("pool", name))?;
        let hosts = self
            .state
            .hosts()
            .iter()
            .filter(|e| e.host().pool == pool && e.host().status != HostStatus::Deregistered)
            .count();
        let mut n = PoolContents { hosts, ..Default::default() };
        for s in self.state.services().values().filter(|s| s.value.pool == pool) {
            n.services += 1;
            n.active_services += usize::from(s.value.status == ServiceStatus::Active);
        }
        for e in self.state.tasks().values().filter(|e| e.task.pool == pool) {
            match e.task.last_status {
                TaskStatus::Stopped => {}
                TaskStatus::Running => n.running += 1,
                s if s < TaskStatus::Running => n.pending += 1,
                _ => n.stopping += 1,
            }
        }
        Ok(n)
    }

    /// Deletes pool `name` when nothing is in it ([`Cluster::pool_contents`]): no host but
    /// deregistered ones, no service, no task that is not stopped. Its stopped tasks go with it.
    pub fn delete_pool(&mut self, name: &str) -> Result<Pool, Error> {
        let pool = self.pool(name)?;
        let n = self.pool_contents(name)?;
        let refuse = |what: String| Err(Error::Conflict(format!("pool {name} has {what}")));
        if n.hosts > 0 {
            return refuse(format!("{} host(s): deregister them first (`mpsfleet host forget`)", n.hosts));
        }
        if n.services > 0 {
            return refuse(format!("{} service(s): delete them first", n.services));
        }
        if n.live_tasks() > 0 {
            return refuse(format!("{} task(s) not stopped: stop them first", n.live_tasks()));
        }
        let tasks: Vec<TaskId> =
            self.state.tasks().values().filter(|e| e.task.pool == pool.name).map(|e| e.task.id).collect();
        let (mut ops, kept) = self.writer().keep_deleted(DeletedObject::Pool(Box::new(pool.clone())))?;
        ops.push(Op::delete(POOL, name, Precondition::Any));
        ops.extend(tasks.iter().map(|id| Op::delete(TASK, id.to_string(), Precondition::Any)));
        let removed = tasks.into_iter().map(Change::TaskRemoved);
        let rev = self.write(&ops, removed.chain([Change::PoolRemoved(pool.name.clone())]))?;
        self.writer().kept_deleted(rev, kept);
        tracing::info!(pool = %name, "pool deleted");
        Ok(pool)
    }

    /// Replaces the kept ECS fields of pool `name` that `fields` names (ECS's `UpdateCluster`:
    /// `settings`, `configuration`).
    pub fn keep_pool_fields(
        &mut self,
        name: &str,
        fields: BTreeMap<String, serde_json::Value>,
    ) -> Result<Pool, Error> {
        let current = self.state.pools().get(&self.pool_name("cluster", name)?).cloned();
        let current = current.ok_or_else(|| Error::not_found("pool", name))?;
        let mut pool = current.value.clone();
        pool.kept_fields.extend(fields);
        if pool != current.value {
            self.write_pool(pool.clone(), current.version)?;
        }
        Ok(pool)
    }

    /// Commits a changed pool record over the `version` it was read at.
    pub(super) fn write_pool(&mut self, pool: Pool, version: Revision) -> Result<(), Error> {
        self.write(
            &[Op::put_json(POOL, pool.name.as_str(), &pool, Precondition::Version(version))?],
            [Change::Pool(pool)],
        )?;
        Ok(())
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

    /// Marks a task definition revision deregistered: what runs it goes on, nothing new
    /// starts from it, and `family` alone names the latest revision still registered.
    pub fn deregister_taskdef(&mut self, reference: &str) -> Result<Arc<TaskDefinition>, Error> {
        let current = self.taskdef_revision(reference)?;
        if current.value.deregistered_at_ms.is_some() {
            return Ok(current.value);
        }
        let mut td = (*current.value).clone();
        td.deregistered_at_ms = Some(self.now());
        self.write_taskdef(td, current.version)
    }

    fn write_taskdef(&mut self, td: TaskDefinition, version: Revision) -> Result<Arc<TaskDefinition>, Error> {
        let key = taskdef_key(&td.family, td.revision);
        let op = Op::put_json(TASKDEF, &key, &td, Precondition::Version(version))?;
        let td = Arc::new(td);
        self.write(&[op], [Change::TaskDef(td.clone())])?;
        Ok(td)
    }

    /// The tags of what `target` names.
    pub fn tags_of(&self, target: &Tagged) -> Result<Vec<Tag>, Error> {
        Ok(match target {
            Tagged::Pool(p) => self.pool(p)?.tags,
            Tagged::TaskDef(r) => self.taskdef_revision(r)?.value.tags.clone(),
            Tagged::Service(s) => self.service_record(s)?.value.tags,
            Tagged::Task(t) => self.task(t)?.tags().to_vec(),
            Tagged::CapacityProvider(n) => self.capacity_provider(n)?.tags,
        })
    }

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
                let current = self.state.pools().get(&self.pool_name("resourceArn", p)?).cloned();
                let current = current.ok_or_else(|| Error::not_found("pool", p))?;
                let mut pool = current.value.clone();
                change(&mut pool.tags)?;
                let tags = pool.tags.clone();
                self.write_pool(pool, current.version)?;
                Ok(tags)
            }
            Tagged::TaskDef(r) => {
                let current = self.taskdef_revision(r)?;
                let mut td = (*current.value).clone();
                change(&mut td.tags)?;
                Ok(self.write_taskdef(td, current.version)?.tags.clone())
            }
            Tagged::Service(s) => {
                let mut svc = self.service_record(s)?.value;
                change(&mut svc.tags)?;
                let tags = svc.tags.clone();
                self.writing(|w| controllers::services::write_service(w, svc))?;
                Ok(tags)
            }
            Tagged::Task(t) => {
                let mut task = self.task(t)?;
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

    /// A task definition by `family:revision` exactly, with its record's version.
    fn taskdef_revision(&self, reference: &str) -> Result<Versioned<Arc<TaskDefinition>>, Error> {
        let r = TaskDefRef::parse(reference).map_err(|e| Error::invalid("taskDefinition", e.to_string()))?;
        self.state
            .taskdefs()
            .get(&(r.family, r.revision))
            .cloned()
            .ok_or_else(|| Error::not_found("task definition", reference))
    }
}

impl Cluster {
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
                if let (Some(p), Ok(req)) =
                    (e.placement.clone(), place::request_for(&self.state, &mut self.sched, &e.task.clone()))
                {
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
        self.forget_deleted(deleted);
        Ok(())
    }
}

/// Deleted pools and services as the API shows them (`deleted.rs`: the records).
impl Cluster {
    pub(super) fn load_deleted(&mut self) -> Result<(), Error> {
        for r in self.store.list(DELETED)? {
            self.state.apply(r.version, Change::Deleted(Box::new(decode(&r)?)));
        }
        Ok(())
    }

    /// Every deleted record still within `deleted::KEPT_MS`, oldest first.
    fn recently_deleted(&self) -> impl Iterator<Item = &Deleted> {
        let since = self.now().saturating_sub(KEPT_MS);
        self.state.deleted().values().filter(move |d| d.deleted_at_ms >= since)
    }

    /// The pools deleted within `deleted::KEPT_MS` whose name no live pool has taken again, oldest
    /// first (ECS's INACTIVE clusters).
    pub fn deleted_pools(&self) -> impl Iterator<Item = &Pool> {
        self.recently_deleted().filter_map(|d| match &d.object {
            DeletedObject::Pool(p) if !self.state.pools().contains_key(&p.name) => Some(p.as_ref()),
            _ => None,
        })
    }

    /// The services of `pool` deleted within `deleted::KEPT_MS`, oldest first, each with when
    /// (ECS's INACTIVE services; a live service may have the name again).
    pub fn deleted_services<'a>(&'a self, pool: &'a str) -> impl Iterator<Item = (&'a Service, u64)> + 'a {
        self.recently_deleted().filter_map(move |d| match &d.object {
            DeletedObject::Service(s) if s.pool.as_str() == pool => Some((s.as_ref(), d.deleted_at_ms)),
            _ => None,
        })
    }

    /// Deletes these records in one commit (the conformance reset forgets them all).
    pub(super) fn forget_deleted(&mut self, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        let ops: Vec<Op> = keys.iter().map(|k| Op::delete(DELETED, k.as_str(), Precondition::Any)).collect();
        if let Err(e) = self.write(&ops, keys.into_iter().map(Change::DeletedRemoved)) {
            tracing::warn!(error = %e, "forgetting deleted objects failed; retrying later");
        }
    }
}
