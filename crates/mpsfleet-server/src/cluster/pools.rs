//! Pools: create, update (checked, and the provider built again when its configuration changed),
//! describe, explain, and a pool's settings as the scheduler takes them.

use super::*;

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
            events: Default::default(),
            created_at_ms: self.now(),
            tags: req.tags,
            kept_fields: req.kept_fields,
        };
        check_pool(&pool)?;
        self.check_provider_configured(&pool)?;
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
        if let Some(max) = req.max_resume_seconds {
            pool.max_resume_seconds = (max > 0).then_some(max);
        }
        check_pool(&pool)?;
        self.check_provider_configured(&pool)?;
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

    /// An exec or aws-ec2 provider a pool names is one of the server's configuration.
    pub(super) fn check_provider_configured(&self, pool: &Pool) -> Result<(), Error> {
        let Some(provider) = pool.provider.as_ref() else { return Ok(()) };
        let Some(name) = provider.name.as_ref() else { return Ok(()) };
        let ctx = self.providers.ctx.as_ref();
        let (what, known): (&str, Vec<&str>) = match provider.kind {
            ProviderKind::AwsEc2 => (
                "aws-ec2 provider",
                ctx.map(|c| c.ec2_providers.keys().map(String::as_str).collect()).unwrap_or_default(),
            ),
            // A name with `local` is refused by the pool's own validation.
            ProviderKind::Exec | ProviderKind::Local => (
                "exec provider",
                ctx.map(|c| c.exec_providers.keys().map(String::as_str).collect()).unwrap_or_default(),
            ),
        };
        if known.contains(&name.as_str()) {
            return Ok(());
        }
        let configured = match (known.is_empty(), provider.kind) {
            (true, ProviderKind::AwsEc2) => {
                "it has none (define ec2Providers in the file of --config FILE, see docs/providers.md)"
                    .to_string()
            }
            (true, _) => "it has none (start it with --config FILE, see docs/providers.md)".to_string(),
            (false, _) => format!("it has {}", known.join(", ")),
        };
        Err(Error::invalid(
            "provider.name",
            format!("the server's configuration has no {what} {name:?}: {configured}"),
        ))
    }

    pub fn explain_pool(&self, name: &str) -> Result<mpsfleet_core::explain::Explanation, Error> {
        let pool = self.pool(name)?;
        let mut e = mpsfleet_core::explain::explain(&pool, &bounds::intervals());
        e.measured_launches = self.launch_times(&pool.name);
        if e.scaling.is_some() {
            e.last_scaling_decision = self
                .last_scaling_decision(&pool.name)
                .map(|(at, why)| format!("{}: {why}", mpsfleet_types::time::utc(at)));
        }
        Ok(e)
    }

    pub fn pools(&self) -> Vec<Pool> {
        self.state.pools().values().map(|p| p.value.clone()).collect()
    }

    pub fn pool(&self, name: &str) -> Result<Pool, Error> {
        self.state
            .pools()
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, p)| p.value.clone())
            .ok_or_else(|| Error::not_found("pool", name))
    }

    pub(super) fn pool_name(&self, field: &str, name: &str) -> Result<PoolName, Error> {
        let p = PoolName::new(name).map_err(|e| Error::invalid(field, e.to_string()))?;
        if !self.state.pools().contains_key(&p) {
            return Err(Error::invalid(
                field,
                format!("pool {p} does not exist; create it with 'mpsfleet pool create {p}'"),
            ));
        }
        Ok(p)
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
