//! Pools: named groups of hosts with one ownership mode and placement settings.

use crate::ids::PoolName;
use serde::{Deserialize, Serialize};

/// Who owns host recovery in a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnershipMode {
    /// mpsfleet detects, decides, drains, replaces and moves tasks.
    Managed,
    /// mpsfleet detects and reports; the operator acts.
    SelfManaged,
}

impl OwnershipMode {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnershipMode::Managed => "managed",
            OwnershipMode::SelfManaged => "self-managed",
        }
    }
}

/// How the scheduler chooses among GPUs that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlacementStrategy {
    /// Fill the fullest GPU that still fits; keep whole GPUs free.
    #[default]
    Binpack,
    /// Use the emptiest GPU.
    Spread,
}

impl PlacementStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementStrategy::Binpack => "binpack",
            PlacementStrategy::Spread => "spread",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub name: PoolName,
    pub mode: OwnershipMode,
    pub strategy: PlacementStrategy,
    /// Bound on the sum of maxComputePercent over the MPS clients of one GPU (an undeclared
    /// limit counts as 100). None: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_overcommit_percent: Option<u32>,
    pub created_at_ms: u64,
}

/// Body of `POST /v1/pools`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<OwnershipMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PlacementStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_overcommit_percent: Option<u32>,
}
