//! Capacity providers, as ECS's (`CreateCapacityProvider`, `DescribeCapacityProviders`,
//! `UpdateCapacityProvider`, `DeleteCapacityProvider`, `PutClusterCapacityProviders`), mapped
//! to named managed-scaling policies that a pool's own provider takes
//! (`cluster/capacity_providers.rs`). Fargate is not one: a pool runs on its own hosts.

use super::page::page;
use super::shapes;
use super::*;
use crate::cluster::capacity_providers::CapacityProvider;
use mpsfleet_types::labels::Tag;
use mpsfleet_types::scaling::{ManagedScaling, ScalingStatus};
use serde::Deserialize;
use serde_json::json;

/// ECS's `managedScaling`: the fields given replace those of `base`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Scaling {
    status: Option<String>,
    target_capacity: Option<u32>,
    minimum_scaling_step_size: Option<u32>,
    maximum_scaling_step_size: Option<u32>,
    instance_warmup_period: Option<u32>,
}

impl Scaling {
    fn over(self, base: ManagedScaling) -> Result<ManagedScaling, EcsError> {
        let status = match self.status.as_deref() {
            None => base.status,
            Some("ENABLED") => ScalingStatus::Enabled,
            Some("DISABLED") => ScalingStatus::Disabled,
            Some(other) => {
                return Err(EcsError::invalid(format!(
                    "managedScaling.status must be ENABLED or DISABLED, got {other}"
                )))
            }
        };
        Ok(ManagedScaling {
            status,
            target_capacity: self.target_capacity.unwrap_or(base.target_capacity),
            minimum_scaling_step_size: self
                .minimum_scaling_step_size
                .unwrap_or(base.minimum_scaling_step_size),
            maximum_scaling_step_size: self
                .maximum_scaling_step_size
                .unwrap_or(base.maximum_scaling_step_size),
            instance_warmup_period: self.instance_warmup_period.unwrap_or(base.instance_warmup_period),
            ..base
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct GroupProvider {
    auto_scaling_group_arn: Option<String>,
    managed_scaling: Option<Scaling>,
    managed_termination_protection: Option<String>,
}

/// A capacity provider as ECS answers it.
fn shape(arns: &arn::Arns, p: &CapacityProvider) -> Value {
    let m = &p.managed_scaling;
    let mut v = json!({
        "capacityProviderArn": arns.capacity_provider(&p.name),
        "name": p.name,
        "status": "ACTIVE",
        "autoScalingGroupProvider": {
            "autoScalingGroupArn": p.auto_scaling_group_arn,
            "managedScaling": {
                "status": if m.enabled() { "ENABLED" } else { "DISABLED" },
                "targetCapacity": m.target_capacity,
                "minimumScalingStepSize": m.minimum_scaling_step_size,
                "maximumScalingStepSize": m.maximum_scaling_step_size,
                "instanceWarmupPeriod": m.instance_warmup_period,
            },
            "managedTerminationProtection": p.managed_termination_protection,
        },
    });
    if !p.tags.is_empty() {
        v["tags"] = shapes::tags(&p.tags);
    }
    v
}

/// ECS's own capacity providers, which are not mpsfleet's.
fn refuse_fargate(name: &str) -> Result<(), EcsError> {
    if name == "FARGATE" || name == "FARGATE_SPOT" {
        return Err(EcsError::invalid(format!(
            "{name} is not served: an mpsfleet pool runs its tasks on its own hosts"
        )));
    }
    Ok(())
}

fn termination_protection(given: Option<String>) -> Result<String, EcsError> {
    match given.as_deref() {
        None => Ok("DISABLED".into()),
        Some("ENABLED" | "DISABLED") => Ok(given.unwrap_or_default()),
        Some(other) => Err(EcsError::invalid(format!(
            "managedTerminationProtection must be ENABLED or DISABLED, got {other}"
        ))),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Create {
    name: String,
    auto_scaling_group_provider: GroupProvider,
    #[serde(default)]
    tags: Vec<Tag>,
}

pub(super) async fn create(call: &Call, r: Create) -> Result<Value, EcsError> {
    refuse_fargate(&r.name)?;
    let g = r.auto_scaling_group_provider;
    let asg = g
        .auto_scaling_group_arn
        .ok_or_else(|| EcsError::invalid("autoScalingGroupProvider.autoScalingGroupArn is required"))?;
    // Without a managedScaling block, scaling is off, as ECS's.
    let off = ManagedScaling { status: ScalingStatus::Disabled, ..Default::default() };
    let scaling = match g.managed_scaling {
        Some(s) => s.over(ManagedScaling::default())?,
        None => off,
    };
    let p = CapacityProvider {
        name: r.name,
        auto_scaling_group_arn: asg,
        managed_scaling: scaling,
        managed_termination_protection: termination_protection(g.managed_termination_protection)?,
        tags: r.tags,
        created_at_ms: 0,
    };
    let arns = call.arns.clone();
    call.run(api::admin, Touch::Cluster, move |c, _| {
        let p = c.create_capacity_provider(p)?;
        Ok(json!({ "capacityProvider": shape(&arns, &p) }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Update {
    name: String,
    auto_scaling_group_provider: GroupProvider,
}

pub(super) async fn update(call: &Call, r: Update) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let name = arns.short("capacity-provider", &r.name).unwrap_or(&r.name).to_string();
    call.run(api::admin, Touch::Cluster, move |c, _| {
        let current = c.capacity_provider(&name)?;
        let scaling = match r.auto_scaling_group_provider.managed_scaling {
            Some(s) => {
                s.over(current.managed_scaling).map_err(|e| Error::invalid("managedScaling", e.message))?
            }
            None => current.managed_scaling,
        };
        let p = c.update_capacity_provider(&name, scaling)?;
        Ok(json!({ "capacityProvider": shape(&arns, &p) }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Delete {
    capacity_provider: String,
}

pub(super) async fn delete(call: &Call, r: Delete) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let name =
        arns.short("capacity-provider", &r.capacity_provider).unwrap_or(&r.capacity_provider).to_string();
    call.run(api::admin, Touch::Cluster, move |c, _| {
        let p = c.delete_capacity_provider(&name)?;
        Ok(json!({ "capacityProvider": shape(&arns, &p) }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Describe {
    #[serde(default)]
    capacity_providers: Vec<String>,
    next_token: Option<String>,
    max_results: Option<i64>,
}

pub(super) async fn describe(call: &Call, r: Describe) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let (found, failures): (Vec<CapacityProvider>, Vec<Value>) = call
        .read(move |c, _| {
            let all = c.capacity_providers()?;
            if r.capacity_providers.is_empty() {
                return Ok((all, Vec::new()));
            }
            let (mut found, mut failures) = (Vec::new(), Vec::new());
            for given in &r.capacity_providers {
                let name = arns.short("capacity-provider", given).unwrap_or(given);
                match all.iter().find(|p| p.name == name) {
                    Some(p) => found.push(p.clone()),
                    None => failures.push(failure(&arns.missing_capacity_provider(name), "MISSING", None)),
                }
            }
            Ok((found, failures))
        })
        .await?;
    let (found, next) = page(found, |p| p.name.clone(), r.next_token.as_deref(), r.max_results)?;
    let providers: Vec<Value> = found.iter().map(|p| shape(&call.arns, p)).collect();
    Ok(json!({ "capacityProviders": providers, "failures": failures, "nextToken": next }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PutCluster {
    cluster: String,
    capacity_providers: Vec<String>,
    #[serde(default)]
    default_capacity_provider_strategy: Vec<Value>,
}

pub(super) async fn put_cluster(call: &Call, r: PutCluster) -> Result<Value, EcsError> {
    for n in &r.capacity_providers {
        refuse_fargate(n)?;
    }
    let arns = call.arns.clone();
    call.run(api::admin, Touch::List, move |c, who| {
        let name = pool_in(c, &who, &arns, Some(&r.cluster))?;
        c.read().admit(&who, &Touch::Object(crate::cluster::Kind::Pool, name.clone()))?;
        let names: Vec<String> = (r.capacity_providers.iter())
            .map(|n| arns.short("capacity-provider", n).unwrap_or(n).to_string())
            .collect();
        c.put_pool_capacity_providers(&name, &names)?;
        let strategy = serde_json::Value::Array(r.default_capacity_provider_strategy);
        let pool =
            c.keep_pool_fields(&name, [("defaultCapacityProviderStrategy".to_string(), strategy)].into())?;
        Ok(json!({ "cluster": shapes::cluster(&arns, &pool, &c.read().pool_contents(&name)?, false) }))
    })
    .await
}
