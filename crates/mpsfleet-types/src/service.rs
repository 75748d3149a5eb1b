//! Services: keep N tasks of a task definition running in a pool.

use crate::ids::{PoolName, ServiceName, TaskDefRef};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServiceStatus {
    Active,
    /// Deleted: tasks are being stopped; the record goes when none is left.
    Draining,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    pub name: ServiceName,
    pub pool: PoolName,
    pub task_definition: TaskDefRef,
    pub desired_count: u32,
    /// When tasks on a bad host are started elsewhere: at once, or after it is terminated.
    #[serde(default)]
    pub resumption: crate::policy::ResumptionBoundary,
    pub status: ServiceStatus,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

/// A service as the API returns it: the record plus counts derived from its tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    #[serde(flatten)]
    pub service: Service,
    pub running_count: u32,
    pub pending_count: u32,
}

/// Body of `POST /v1/services`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateService {
    pub name: String,
    pub pool: String,
    pub task_definition: String,
    pub desired_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumption: Option<crate::policy::ResumptionBoundary>,
    /// Makes the call idempotent (see `RunTask::client_token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_token: Option<String>,
}

/// Body of `PATCH /v1/services/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateService {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_definition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_count: Option<u32>,
    /// Makes the call idempotent (see `RunTask::client_token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_token: Option<String>,
}

/// Where one running replica of a service can be reached: `mpsfleet service endpoints NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEndpoint {
    pub task_id: crate::ids::TaskId,
    pub host_id: crate::ids::HostId,
    pub container: String,
    /// `HOST:PORT` to connect to: the host's address with the binding's host port.
    pub address: String,
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: crate::taskdef::Protocol,
    /// The task passes its readiness check (true without one).
    pub ready: bool,
    pub health_status: crate::task::TaskHealth,
}
