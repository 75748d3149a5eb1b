//! A pool's managed scaling: its provider's host count follows the pool's demand (ECS's
//! capacity provider `managedScaling`, with mpsfleet's scale-in limits). The decision is
//! `mpsfleet_core::scaling`; docs/providers.md "Managed scaling".

use crate::policy_error::{err, in_range, PolicyError};
use serde::{Deserialize, Serialize};

/// Whether managed scaling acts (ECS's `managedScaling.status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ScalingStatus {
    #[default]
    Enabled,
    Disabled,
}

/// A pool's managed scaling. With status ENABLED, the provider's `desiredHosts` is the
/// controller's output, no longer set by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedScaling {
    #[serde(default)]
    pub status: ScalingStatus,
    /// The hosts in use as a percentage of the hosts in the pool that scaling aims for: 100
    /// keeps no spare host, 90 keeps about 10% spare. 1 to 100, default 100.
    #[serde(default = "hundred")]
    pub target_capacity: u32,
    /// Hosts one scale-out step adds at least and at most. 1 to 10000; defaults 1 and 10000.
    #[serde(default = "one")]
    pub minimum_scaling_step_size: u32,
    #[serde(default = "ten_thousand")]
    pub maximum_scaling_step_size: u32,
    /// Seconds after a scale-out step during which no further step is taken while its hosts
    /// have not all joined. 0 to 10000, default 300.
    #[serde(default = "three_hundred")]
    pub instance_warmup_period: u32,
    /// The fewest and most hosts scaling keeps. 0 to 10000; defaults 0 and 10.
    #[serde(default)]
    pub min_hosts: u32,
    #[serde(default = "ten")]
    pub max_hosts: u32,
    /// How long a host must have been empty (no task but DAEMON services' tasks) before
    /// scale-in removes it. 0 to 86400, default 900.
    #[serde(default = "nine_hundred")]
    pub scale_in_after_seconds: u32,
    /// The most of the pool's hosts one scale-in step removes, in percent (at least one
    /// host). 1 to 100, default 50.
    #[serde(default = "fifty")]
    pub scale_in_budget_percent: u32,
}

fn hundred() -> u32 {
    100
}
fn one() -> u32 {
    1
}
fn ten_thousand() -> u32 {
    10_000
}
fn three_hundred() -> u32 {
    300
}
fn ten() -> u32 {
    10
}
fn nine_hundred() -> u32 {
    900
}
fn fifty() -> u32 {
    50
}

impl Default for ManagedScaling {
    fn default() -> Self {
        ManagedScaling {
            status: ScalingStatus::Enabled,
            target_capacity: 100,
            minimum_scaling_step_size: 1,
            maximum_scaling_step_size: 10_000,
            instance_warmup_period: 300,
            min_hosts: 0,
            max_hosts: 10,
            scale_in_after_seconds: 900,
            scale_in_budget_percent: 50,
        }
    }
}

impl ManagedScaling {
    pub fn enabled(&self) -> bool {
        self.status == ScalingStatus::Enabled
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let f = |name: &str| format!("provider.managedScaling.{name}");
        in_range(&f("targetCapacity"), self.target_capacity.into(), 1, 100, "")?;
        in_range(&f("minimumScalingStepSize"), self.minimum_scaling_step_size.into(), 1, 10_000, "")?;
        in_range(&f("maximumScalingStepSize"), self.maximum_scaling_step_size.into(), 1, 10_000, "")?;
        if self.minimum_scaling_step_size > self.maximum_scaling_step_size {
            return Err(err(
                &f("minimumScalingStepSize"),
                format!(
                    "must not exceed maximumScalingStepSize ({}), got {}",
                    self.maximum_scaling_step_size, self.minimum_scaling_step_size
                ),
            ));
        }
        in_range(&f("instanceWarmupPeriod"), self.instance_warmup_period.into(), 0, 10_000, " s")?;
        in_range(&f("minHosts"), self.min_hosts.into(), 0, 10_000, "")?;
        in_range(&f("maxHosts"), self.max_hosts.into(), 1, 10_000, "")?;
        if self.min_hosts > self.max_hosts {
            return Err(err(
                &f("minHosts"),
                format!("must not exceed maxHosts ({}), got {}", self.max_hosts, self.min_hosts),
            ));
        }
        in_range(&f("scaleInAfterSeconds"), self.scale_in_after_seconds.into(), 0, 86_400, " s")?;
        in_range(&f("scaleInBudgetPercent"), self.scale_in_budget_percent.into(), 1, 100, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ecs_and_bad_fields_are_named() {
        let s: ManagedScaling = serde_json::from_str("{}").unwrap();
        assert_eq!(s, ManagedScaling::default());
        assert!(s.validate().is_ok() && s.enabled());
        let bad = |json: &str| {
            let s: ManagedScaling = serde_json::from_str(json).unwrap();
            s.validate().unwrap_err().field
        };
        assert_eq!(bad(r#"{"targetCapacity": 0}"#), "provider.managedScaling.targetCapacity");
        assert_eq!(bad(r#"{"minHosts": 5, "maxHosts": 4}"#), "provider.managedScaling.minHosts");
        assert_eq!(
            bad(r#"{"minimumScalingStepSize": 5, "maximumScalingStepSize": 4}"#),
            "provider.managedScaling.minimumScalingStepSize"
        );
        assert!(serde_json::from_str::<ManagedScaling>(r#"{"maxHost": 3}"#).is_err(), "a misspelt field");
    }
}
