//! Pools: create, update (checked, and the provider built again when its configuration changed),
//! describe, explain, and a pool's settings as the scheduler takes them.

use super::capacity_providers::CapacityProvider;
use super::capacity_providers::*;
use super::catalog::*;
use super::deleted::{Deleted, DeletedObject, DELETED, KEPT_MS};
use super::intervals::intervals;
use super::providers::*;
use super::*;
use crate::provider::Ec2Provider;
use mpsfleet_core::bounds as core_bounds;
use mpsfleet_types::bounds::RecoveryBounds;
use mpsfleet_types::labels::{check_tags, Tag};
use mpsfleet_types::scaling::ManagedScaling;
use std::collections::BTreeMap;

impl Cluster {
    pub fn create_pool(&mut self, req: CreatePool) -> Result<Pool, Error> {
        let name = PoolName::new(req.name).map_err(|e| Error::invalid("name", e.to_string()))?;
        mpsfleet_types::labels::check_tags("tags", &req.tags).map_err(|(f, m)| Error::invalid(f, m))?;
        if self.state.pools().contains_key(&name) {
            return Err(Error::AlreadyExists { kind: "pool", id: name.to_string() });
        }
        let mode = req.mode.unwrap_or(OwnershipMode::Managed);
        let pool = Pool {
            name: name.clone(),
            mode,
            strategy: req.strategy.unwrap_or_default(),
            compute_overcommit_percent: req.compute_overcommit_percent,
            health_policy: req.health_policy.unwrap_or_default(),
            remediation_policy: req.remediation_policy.unwrap_or_default(),
            // A managed pool without a provider is repaired by draining only; `up` sets `local`.
            provider: req.provider,
            allow_task_users: req.allow_task_users.unwrap_or(false),
            task_policy: req.task_policy.unwrap_or_default(),
            max_resume_seconds: req.max_resume_seconds,
            preemption: req.preemption.unwrap_or_default(),
            restart_copies: req.restart_copies.unwrap_or_default(),
            events: Default::default(),
            created_at_ms: self.now(),
            tags: req.tags,
            kept_fields: req.kept_fields,
        };
        check_pool(&pool)?;
        self.providers.check_provider_configured(&pool)?;
        self.write(
            &[Op::put_json(POOL, name.as_str(), &pool, Precondition::Absent)?],
            [Change::Pool(pool.clone())],
        )?;
        self.sched.upsert_pool(name.as_str(), pool_config(&pool));
        self.ask(Work::Capacity(pool.name.clone()));
        self.work.health_due_ms.fill(0);
        Ok(pool)
    }

    /// Changes a pool's placement settings or policies; nothing restarts. Placement changes
    /// apply to the next placement, policy changes to the next evaluation.
    pub fn update_pool(&mut self, name: &str, req: UpdatePool) -> Result<Pool, Error> {
        let current = self
            .state
            .pools()
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| Error::not_found("pool", name))?;
        let mut pool = current.value.clone();
        if let Some(s) = req.strategy {
            pool.strategy = s;
        }
        if req.compute_overcommit_percent.is_some() {
            pool.compute_overcommit_percent = req.compute_overcommit_percent;
        }
        if let Some(h) = req.health_policy {
            pool.health_policy = h;
        }
        if let Some(r) = req.remediation_policy {
            pool.remediation_policy = r;
        }
        if req.provider.is_some() {
            pool.provider = req.provider;
        }
        if let Some(allow) = req.allow_task_users {
            pool.allow_task_users = allow;
        }
        if let Some(policy) = req.task_policy {
            pool.task_policy = policy;
        }
        if let Some(p) = req.preemption {
            pool.preemption = p;
        }
        if let Some(r) = req.restart_copies {
            pool.restart_copies = r;
        }
        if let Some(max) = req.max_resume_seconds {
            pool.max_resume_seconds = (max > 0).then_some(max);
        }
        check_pool(&pool)?;
        self.providers.check_provider_configured(&pool)?;
        let before = mpsfleet_core::bounds::derive(&current.value, &bounds::intervals());
        let after = mpsfleet_core::bounds::derive(&pool, &bounds::intervals());
        let changed = bounds::bounds_change(&before, &after).map(|w| ObjectEvent::new("BoundsChanged", w));
        if let Some(entry) = &changed {
            pool.events.push(self.now(), entry.clone());
        }
        if pool != current.value {
            let expect = Precondition::Version(current.version);
            self.write(&[Op::put_json(POOL, name, &pool, expect)?], [Change::Pool(pool.clone())])?;
            // A provider built from the old configuration is built again from the new one
            // (providers set from outside, such as the simulator's, stay).
            if pool.provider != current.value.provider && !self.providers.fixed.contains(&pool.name) {
                self.providers.built.remove(&pool.name);
            }
            self.sched.upsert_pool(name, pool_config(&pool));
            if let Some(entry) = changed {
                self.writer().publish_pool_event(&pool.name, entry);
            }
            self.ask(Work::Capacity(pool.name.clone()));
            // Its health policy may have changed: every host is evaluated at the next tick.
            self.work.health_due_ms.fill(0);
            self.ask(Work::Placement(pool.name.clone()));
        }
        Ok(pool)
    }

    pub fn explain_pool(&self, name: &str) -> Result<mpsfleet_core::explain::Explanation, Error> {
        let pool = self.read().pool(name)?;
        let iv = bounds::intervals();
        let mut e = mpsfleet_core::explain::explain(&pool, &iv);
        let victim_stop = place::victim_stop_ms(&self.state, &pool.name);
        mpsfleet_core::bounds::add_full_pool(&mut e.bounds, &pool, &iv, victim_stop);
        e.measured_launches = self.launch_times(&pool.name);
        if e.scaling.is_some() {
            e.last_scaling_decision = self
                .last_scaling_decision(&pool.name)
                .map(|(at, why)| format!("{}: {why}", mpsfleet_types::time::utc(at)));
        }
        Ok(e)
    }
}

/// Checks a pool's settings; errors name the field and its range.
pub(super) fn check_pool(p: &Pool) -> Result<(), Error> {
    if let Some(c) = p.compute_overcommit_percent {
        if !(1..=4800).contains(&c) {
            return Err(Error::invalid(
                "computeOvercommitPercent",
                format!("must be an integer from 1 to 4800, got {c}"),
            ));
        }
    }
    let policy = |e: mpsfleet_types::policy::PolicyError| Error::invalid(e.field, e.message);
    p.health_policy.validate().map_err(policy)?;
    p.remediation_policy.validate().map_err(policy)?;
    if let Some(provider) = &p.provider {
        provider.validate().map_err(policy)?;
    }
    bounds::check_max_resume(p)
}

impl Cluster {
    /// Deleting every capacity provider: for the conformance reset.
    pub(super) fn capacity_provider_deletes(&self) -> Result<Vec<Op>, Error> {
        let names: Vec<String> = self.capacity_providers()?.into_iter().map(|p| p.name).collect();
        Ok(names.iter().map(|n| Op::delete(CAPACITY_PROVIDER, n, Precondition::Any)).collect())
    }

    /// Applies a capacity provider's scaling to the pool's own provider.
    pub(super) fn apply_capacity_provider(
        &mut self,
        pool: &PoolName,
        cp: &CapacityProvider,
    ) -> Result<(), Error> {
        let current =
            self.state.pools().get(pool).cloned().ok_or_else(|| Error::not_found("pool", pool.as_str()))?;
        let mut p = current.value.clone();
        let Some(provider) = p.provider.as_mut() else {
            return Err(Error::invalid(
                "capacityProviders",
                format!(
                    "pool {pool} has no provider to scale: give it one with a hostShape (mpsfleet pool update {pool} \
                     --provider ...), see docs/providers.md"
                ),
            ));
        };
        let mut scaling = cp.managed_scaling;
        // The host bounds are mpsfleet's: a policy from ECS keeps the pool's own.
        if let Some(own) = &provider.managed_scaling {
            scaling.min_hosts = own.min_hosts;
            scaling.max_hosts = own.max_hosts;
            scaling.scale_in_after_seconds = own.scale_in_after_seconds;
            scaling.scale_in_budget_percent = own.scale_in_budget_percent;
        }
        provider.managed_scaling = Some(scaling);
        provider.validate().map_err(|e| Error::invalid("capacityProviders", format!("pool {pool}: {e}")))?;
        self.writing(|w| write_pool(w, p, current.version))?;
        self.ask_capacity(pool);
        Ok(())
    }

    /// The capacity providers of pool `pool` (ECS's PutClusterCapacityProviders): the first
    /// one's managed scaling becomes the pool provider's. An empty list leaves the pool's
    /// scaling as it is and forgets the names.
    pub fn put_pool_capacity_providers(&mut self, pool: &str, names: &[String]) -> Result<Pool, Error> {
        let pool_name = pool_name(&self.state, "cluster", pool)?;
        let mut chosen = Vec::new();
        for n in names {
            chosen.push(self.capacity_provider(n).map_err(|_| {
                Error::invalid("capacityProviders", format!("capacity provider {n} does not exist"))
            })?);
        }
        if let Some(first) = chosen.first() {
            self.apply_capacity_provider(&pool_name, first)?;
        }
        let current =
            self.state.pools().get(&pool_name).cloned().ok_or_else(|| Error::not_found("pool", pool))?;
        let mut p = current.value.clone();
        p.kept_fields.insert("capacityProviders".into(), serde_json::json!(names));
        self.writing(|w| write_pool(w, p.clone(), current.version))?;
        Ok(p)
    }

    /// Retags capacity provider `name` (ECS's TagResource on its ARN).
    pub fn retag_capacity_provider(
        &mut self,
        name: &str,
        add: &[Tag],
        remove: &[String],
    ) -> Result<Vec<Tag>, Error> {
        let (mut p, version) = self
            .capacity_provider_record(name)?
            .ok_or_else(|| Error::not_found("capacity provider", name))?;
        mpsfleet_types::labels::merge_tags(&mut p.tags, add);
        p.tags.retain(|t| !remove.contains(&t.key));
        check_tags("tags", &p.tags).map_err(|(f, m)| Error::invalid(f, m))?;
        self.write(&[Op::put_json(CAPACITY_PROVIDER, name, &p, Precondition::Version(version))?], [])?;
        Ok(p.tags)
    }

    /// Deletes `name`; refused while a pool uses it.
    pub fn delete_capacity_provider(&mut self, name: &str) -> Result<CapacityProvider, Error> {
        let (p, version) = self
            .capacity_provider_record(name)?
            .ok_or_else(|| Error::not_found("capacity provider", name))?;
        if let Some(pool) = pools_using(&self.state, name).first() {
            return Err(Error::Conflict(format!(
                "capacity provider {name} is used by pool {pool}: put the pool's capacity providers without it first"
            )));
        }
        self.write(&[Op::delete(CAPACITY_PROVIDER, name, Precondition::Version(version))], [])?;
        Ok(p)
    }

    /// Replaces the managed scaling of `name`, and of every pool that uses it.
    pub fn update_capacity_provider(
        &mut self,
        name: &str,
        scaling: ManagedScaling,
    ) -> Result<CapacityProvider, Error> {
        scaling.validate().map_err(|e| Error::invalid(e.field, e.message))?;
        let (mut p, version) = self
            .capacity_provider_record(name)?
            .ok_or_else(|| Error::not_found("capacity provider", name))?;
        p.managed_scaling = scaling;
        self.write(&[Op::put_json(CAPACITY_PROVIDER, name, &p, Precondition::Version(version))?], [])?;
        for pool in pools_using(&self.state, name) {
            self.apply_capacity_provider(&pool, &p)?;
        }
        Ok(p)
    }

    pub fn create_capacity_provider(&mut self, mut p: CapacityProvider) -> Result<CapacityProvider, Error> {
        check_capacity_provider_name(&p.name)?;
        check_tags("tags", &p.tags).map_err(|(f, m)| Error::invalid(f, m))?;
        p.managed_scaling.validate().map_err(|e| Error::invalid(e.field, e.message))?;
        if self.capacity_provider_record(&p.name)?.is_some() {
            return Err(Error::AlreadyExists { kind: "capacity provider", id: p.name });
        }
        if self.store.list(CAPACITY_PROVIDER)?.len() >= MAX_CAPACITY_PROVIDERS {
            return Err(Error::Conflict(format!(
                "there are {MAX_CAPACITY_PROVIDERS} capacity providers already, the most this server keeps"
            )));
        }
        p.created_at_ms = self.now();
        self.write(&[Op::put_json(CAPACITY_PROVIDER, &p.name, &p, Precondition::Absent)?], [])?;
        Ok(p)
    }

    /// Every capacity provider, by name.
    pub fn capacity_providers(&self) -> Result<Vec<CapacityProvider>, Error> {
        let mut out = Vec::new();
        for v in self.store.list(CAPACITY_PROVIDER)? {
            out.push(decode::<CapacityProvider>(&v)?);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The capacity provider `name`.
    pub fn capacity_provider(&self, name: &str) -> Result<CapacityProvider, Error> {
        let found = self.capacity_provider_record(name)?.map(|(p, _)| p);
        found.ok_or_else(|| Error::not_found("capacity provider", name))
    }

    pub(super) fn capacity_provider_record(
        &self,
        name: &str,
    ) -> Result<Option<(CapacityProvider, Revision)>, Error> {
        match self.store.get(CAPACITY_PROVIDER, name)? {
            Some(v) => Ok(Some((decode(&v)?, v.version))),
            None => Ok(None),
        }
    }
}

impl Cluster {
    /// The launch request for a new host of `pool`, without its token: the caller adds the
    /// launch or replacement token of the job (the join token never goes to a provider).
    pub fn launch_request(&self, pool: &PoolName, name: &str) -> LaunchRequest {
        let ctx = self.providers.ctx.as_ref();
        LaunchRequest {
            name: name.to_string(),
            pool: pool.to_string(),
            server: ctx.map(|c| c.server_url.clone()).unwrap_or_default(),
            join_token: String::new(),
            agent_args: Vec::new(),
            incident: String::new(),
        }
    }

    /// The pool's capacity provider, built from its configuration the first time.
    pub fn provider_for(&mut self, pool: &PoolName) -> Option<Arc<dyn crate::provider::CapacityProvider>> {
        if let Some(p) = self.providers.built.get(pool) {
            return Some(p.clone());
        }
        let cfg = self.state.pools().get(pool)?.value.provider.clone()?;
        let ctx = self.providers.ctx.as_ref()?;
        let provider: Arc<dyn crate::provider::CapacityProvider> = match (cfg.kind, &cfg.exec) {
            (ProviderKind::Local, _) => Arc::new(LocalProvider::new(
                ctx.exe.clone(),
                ctx.hosts_dir.clone(),
                ctx.local_agent_args.clone(),
                std::time::Duration::from_secs(40),
            )),
            (ProviderKind::Exec, _) => {
                let Some(name) = cfg.name.as_ref() else {
                    // Commands an older server took through the API are never run.
                    tracing::error!(
                        pool = %pool,
                        "the pool's exec provider has commands of its own, which this server does not run: \
                         define them in the server's configuration and set the pool's provider.name"
                    );
                    return None;
                };
                let Some(config) = ctx.exec_providers.get(name) else {
                    tracing::error!(pool = %pool, provider = %name, "the server's configuration has no such exec provider");
                    return None;
                };
                match ExecProvider::new(config.clone()) {
                    Ok(p) => Arc::new(p),
                    Err(err) => {
                        tracing::error!(pool = %pool, error = %err, "exec provider not usable");
                        return None;
                    }
                }
            }
            (ProviderKind::AwsEc2, _) => {
                let Some(name) = cfg.name.as_ref() else {
                    tracing::error!(pool = %pool, "the pool's aws-ec2 provider has no provider.name");
                    return None;
                };
                let Some(config) = ctx.ec2_providers.get(name) else {
                    tracing::error!(pool = %pool, provider = %name, "the server's configuration has no such aws-ec2 provider");
                    return None;
                };
                // Builds no connection: the first call does (on a blocking thread).
                match Ec2Provider::new(config.clone(), pool.as_str()) {
                    Ok(p) => Arc::new(p),
                    Err(err) => {
                        tracing::error!(pool = %pool, error = %err, "aws-ec2 provider not usable");
                        return None;
                    }
                }
            }
        };
        self.providers.built.insert(pool.clone(), provider.clone());
        Some(provider)
    }

    /// What the server needs to build the providers its pools name.
    pub fn set_provider_context(&mut self, ctx: ProviderContext) {
        self.providers.ctx = Some(ctx);
        self.ask_capacity_everywhere();
    }

    /// Sets the capacity provider of a pool (providers are processes and commands, not records).
    pub fn set_provider(&mut self, pool: PoolName, provider: Arc<dyn crate::provider::CapacityProvider>) {
        self.providers.fixed.insert(pool.clone());
        self.providers.built.insert(pool.clone(), provider);
        self.ask_capacity(&pool);
    }
}

impl Cluster {
    /// The last scaling decision of `pool` in words, and when (`pool explain`).
    pub fn last_scaling_decision(&self, pool: &PoolName) -> Option<(u64, String)> {
        self.work.scaling.get(pool).and_then(|m| m.last.clone())
    }

    /// The pool's measured launches, from the ask to the host joining, in words beside the
    /// provider's `launchTimeoutSeconds` (`pool explain`); None before the first.
    pub fn launch_times(&self, pool: &PoolName) -> Option<String> {
        let times = self.work.launch_times.get(pool).filter(|t| !t.is_empty())?;
        let mut sorted: Vec<u64> = times.iter().copied().collect();
        sorted.sort_unstable();
        let timeout = self.state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|p| {
            p.launch_timeout_seconds.unwrap_or(match p.kind {
                mpsfleet_types::policy::ProviderKind::Local => 60,
                _ => 600,
            })
        });
        Some(format!(
            "the latest {} launch(es) took {} to join (median), {} at most{}",
            sorted.len(),
            mpsfleet_types::time::secs(sorted[sorted.len() / 2]),
            mpsfleet_types::time::secs(sorted[sorted.len() - 1]),
            timeout.map(|t| format!(", against launchTimeoutSeconds {t}")).unwrap_or_default()
        ))
    }
}

impl Cluster {
    /// Replaces the kept ECS fields of pool `name` that `fields` names (ECS's `UpdateCluster`:
    /// `settings`, `configuration`).
    pub fn keep_pool_fields(
        &mut self,
        name: &str,
        fields: BTreeMap<String, serde_json::Value>,
    ) -> Result<Pool, Error> {
        let current = self.state.pools().get(&pool_name(&self.state, "cluster", name)?).cloned();
        let current = current.ok_or_else(|| Error::not_found("pool", name))?;
        let mut pool = current.value.clone();
        pool.kept_fields.extend(fields);
        if pool != current.value {
            self.writing(|w| write_pool(w, pool.clone(), current.version))?;
        }
        Ok(pool)
    }

    /// Deletes pool `name` when nothing is in it ([`Cluster::pool_contents`]): no host but
    /// deregistered ones, no service, no task that is not stopped. Its stopped tasks go with it.
    pub fn delete_pool(&mut self, name: &str) -> Result<Pool, Error> {
        let pool = self.read().pool(name)?;
        let n = self.read().pool_contents(name)?;
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
}

pub(super) fn pool_name(state: &State, field: &str, name: &str) -> Result<PoolName, Error> {
    let p = PoolName::new(name).map_err(|e| Error::invalid(field, e.to_string()))?;
    if !state.pools().contains_key(&p) {
        return Err(Error::invalid(
            field,
            format!("pool {p} does not exist; create it with 'mpsfleet pool create {p}'"),
        ));
    }
    Ok(p)
}

/// The pools whose capacity providers name `name`.
pub(super) fn pools_using(state: &State, name: &str) -> Vec<PoolName> {
    (state.pools().values())
        .filter(|p| {
            p.value
                .kept_fields
                .get("capacityProviders")
                .and_then(|v| v.as_array())
                .is_some_and(|a| a.iter().any(|n| n.as_str() == Some(name)))
        })
        .map(|p| p.value.name.clone())
        .collect()
}

pub(super) fn load_deleted(store: &dyn Store, state: &mut State) -> Result<(), Error> {
    for r in store.list(DELETED)? {
        state.apply(r.version, Change::Deleted(Box::new(decode(&r)?)));
    }
    Ok(())
}

/// Deletes these records in one commit (the conformance reset forgets them all).
pub(super) fn forget_deleted(w: &mut Writer<'_>, keys: Vec<String>) {
    if keys.is_empty() {
        return;
    }
    let ops: Vec<Op> = keys.iter().map(|k| Op::delete(DELETED, k.as_str(), Precondition::Any)).collect();
    if let Err(e) = w.write(&ops, keys.into_iter().map(Change::DeletedRemoved)) {
        tracing::warn!(error = %e, "forgetting deleted objects failed; retrying later");
    }
}

/// Commits a changed pool record over the `version` it was read at.
pub(super) fn write_pool(w: &mut Writer<'_>, pool: Pool, version: Revision) -> Result<(), Error> {
    w.write(
        &[Op::put_json(POOL, pool.name.as_str(), &pool, Precondition::Version(version))?],
        [Change::Pool(pool)],
    )?;
    Ok(())
}

impl<'a> Reader<'a> {
    pub fn pool(&self, name: &str) -> Result<Pool, Error> {
        self.state
            .pools()
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, p)| p.value.clone())
            .ok_or_else(|| Error::not_found("pool", name))
    }

    pub fn pools(&self) -> Vec<Pool> {
        self.state.pools().values().map(|p| p.value.clone()).collect()
    }

    /// The pool's bounds as `pool explain` shows them.
    pub fn pool_bounds(&self, name: &str) -> Result<RecoveryBounds, Error> {
        Ok(core_bounds::derive(&self.pool(name)?, &intervals()))
    }

    /// Every deleted record still within `deleted::KEPT_MS`, oldest first.
    pub(super) fn recently_deleted(&self) -> impl Iterator<Item = &'a Deleted> {
        let since = self.now_ms.saturating_sub(KEPT_MS);
        self.state.deleted().values().filter(move |d| d.deleted_at_ms >= since)
    }

    /// The pools deleted within `deleted::KEPT_MS` whose name no live pool has taken again, oldest
    /// first (ECS's INACTIVE clusters).
    pub fn deleted_pools(&self) -> impl Iterator<Item = &'a Pool> {
        let state = self.state;
        self.recently_deleted().filter_map(move |d| match &d.object {
            DeletedObject::Pool(p) if !state.pools().contains_key(&p.name) => Some(p.as_ref()),
            _ => None,
        })
    }

    /// The services of `pool` deleted within `deleted::KEPT_MS`, oldest first, each with when
    /// (ECS's INACTIVE services; a live service may have the name again).
    pub fn deleted_services<'p>(&self, pool: &'p str) -> impl Iterator<Item = (&'a Service, u64)> + 'p
    where
        'a: 'p,
    {
        self.recently_deleted().filter_map(move |d| match &d.object {
            DeletedObject::Service(s) if s.pool.as_str() == pool => Some((s.as_ref(), d.deleted_at_ms)),
            _ => None,
        })
    }

    /// What pool `name` holds, read in place: its hosts but deregistered ones, its services
    /// (active or being deleted) and its tasks by phase. What a pool must be empty of to be
    /// deleted, and what ECS's DescribeClusters counts.
    pub fn pool_contents(&self, name: &str) -> Result<PoolContents, Error> {
        let pool = pool_name(self.state, "cluster", name).map_err(|_| Error::not_found("pool", name))?;
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
}
