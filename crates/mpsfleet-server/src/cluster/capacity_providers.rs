//! ECS's capacity providers, as mpsfleet maps them: a named managed-scaling policy
//! (`CreateCapacityProvider`, `DescribeCapacityProviders`, `UpdateCapacityProvider`,
//! `DeleteCapacityProvider`) that `PutClusterCapacityProviders` applies to a pool's own
//! provider (`provider.managedScaling`). mpsfleet has no Auto Scaling groups: the pool's
//! provider (`local`, `exec`, `aws-ec2`) launches the hosts, so the group's ARN and
//! `managedTerminationProtection` are kept as given (scale-in never removes a host with work
//! anyway). Records are read from the store when asked for, as secrets are: there are few,
//! and nothing on a hot path reads them.
//! The operations are `Cluster`'s, in `pools.rs`; what they share is here.

use super::*;
use mpsfleet_types::labels::Tag;
use mpsfleet_types::scaling::ManagedScaling;

/// Store kind of capacity providers, keyed by name.
pub(super) const CAPACITY_PROVIDER: &str = "capacity-provider";
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
