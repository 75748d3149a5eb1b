//! ECS's capacity providers, as mpsfleet maps them: a named managed-scaling policy
//! (`CreateCapacityProvider`, `DescribeCapacityProviders`, `UpdateCapacityProvider`,
//! `DeleteCapacityProvider`) that `PutClusterCapacityProviders` applies to a pool's own
//! provider (`provider.managedScaling`). mpsfleet has no Auto Scaling groups: the pool's
//! provider (`local`, `exec`, `aws-ec2`) launches the hosts, so the group's ARN and
//! `managedTerminationProtection` are kept as given (scale-in never removes a host with work
//! anyway). Records are read from the store when asked for, as secrets are: there are few,
//! and nothing on a hot path reads them.

use super::*;
use mpsfleet_types::labels::{check_tags, Tag};
use mpsfleet_types::scaling::ManagedScaling;

/// Store kind of capacity providers, keyed by name.
const CAPACITY_PROVIDER: &str = "capacity-provider";
/// The most capacity providers the server keeps.
pub const MAX_CAPACITY_PROVIDERS: usize = 100;

/// A capacity provider as stored and answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityProvider {
    pub name: String,
    /// The Auto Scaling group's ARN, kept as given.
    pub auto_scaling_group_arn: String,
    pub managed_scaling: ManagedScaling,
    /// `ENABLED` or `DISABLED`, kept as given.
    pub managed_termination_protection: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<Tag>,
    pub created_at_ms: u64,
}

/// ECS's rule for a capacity provider's name: 1 to 255 letters, digits, `-` and `_`, not
/// starting with `aws`, `ecs` or `fargate` (any case).
pub fn check_capacity_provider_name(name: &str) -> Result<(), Error> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.is_empty() || name.len() > 255 || !name.chars().all(ok) {
        return Err(Error::invalid(
            "name",
            format!("must be 1 to 255 letters, digits, '-' and '_', got {name:?}"),
        ));
    }
    let lower = name.to_ascii_lowercase();
    if ["aws", "ecs", "fargate"].iter().any(|p| lower.starts_with(p)) {
        return Err(Error::invalid("name", format!("must not start with aws, ecs or fargate, got {name:?}")));
    }
    Ok(())
}

impl Cluster {
    fn capacity_provider_record(&self, name: &str) -> Result<Option<(CapacityProvider, Revision)>, Error> {
        match self.store.get(CAPACITY_PROVIDER, name)? {
            Some(v) => Ok(Some((decode(&v)?, v.version))),
            None => Ok(None),
        }
    }

    /// The capacity provider `name`.
    pub fn capacity_provider(&self, name: &str) -> Result<CapacityProvider, Error> {
        let found = self.capacity_provider_record(name)?.map(|(p, _)| p);
        found.ok_or_else(|| Error::not_found("capacity provider", name))
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
        for pool in self.pools_using(name) {
            self.apply_capacity_provider(&pool, &p)?;
        }
        Ok(p)
    }

    /// Deletes `name`; refused while a pool uses it.
    pub fn delete_capacity_provider(&mut self, name: &str) -> Result<CapacityProvider, Error> {
        let (p, version) = self
            .capacity_provider_record(name)?
            .ok_or_else(|| Error::not_found("capacity provider", name))?;
        if let Some(pool) = self.pools_using(name).first() {
            return Err(Error::Conflict(format!(
                "capacity provider {name} is used by pool {pool}: put the pool's capacity providers without it first"
            )));
        }
        self.write(&[Op::delete(CAPACITY_PROVIDER, name, Precondition::Version(version))], [])?;
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

    /// The capacity providers of pool `pool` (ECS's PutClusterCapacityProviders): the first
    /// one's managed scaling becomes the pool provider's. An empty list leaves the pool's
    /// scaling as it is and forgets the names.
    pub fn put_pool_capacity_providers(&mut self, pool: &str, names: &[String]) -> Result<Pool, Error> {
        let pool_name = self.pool_name("cluster", pool)?;
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
        self.write_pool(p.clone(), current.version)?;
        Ok(p)
    }

    /// Applies a capacity provider's scaling to the pool's own provider.
    fn apply_capacity_provider(&mut self, pool: &PoolName, cp: &CapacityProvider) -> Result<(), Error> {
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
        self.write_pool(p, current.version)?;
        self.ask_capacity(pool);
        Ok(())
    }

    /// Deleting every capacity provider: for the conformance reset.
    pub(super) fn capacity_provider_deletes(&self) -> Result<Vec<Op>, Error> {
        let names: Vec<String> = self.capacity_providers()?.into_iter().map(|p| p.name).collect();
        Ok(names.iter().map(|n| Op::delete(CAPACITY_PROVIDER, n, Precondition::Any)).collect())
    }

    /// The pools whose capacity providers name `name`.
    fn pools_using(&self, name: &str) -> Vec<PoolName> {
        (self.state.pools().values())
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
}
