//! Request and response shapes of the REST API that are not resources themselves.

use crate::ids::{HostId, TaskDefRef};
use crate::task::Task;
use serde::{Deserialize, Serialize};

/// Every error the API returns: a stable code, a message a person can act on, and the field
/// at fault when there is one. A refused task definition (`InvalidTaskDefinition`) lists every
/// error found in `errors`, at most 100 (`field` is the first's; the message has one line per
/// error, and a last line with the number of the others past 100).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Boxed: every client error carries an `ErrorBody`, and an empty list costs one pointer.
    #[serde(default, skip_serializing_if = "no_errors")]
    pub errors: Box<Vec<FieldError>>,
}

fn no_errors(errors: &[FieldError]) -> bool {
    errors.is_empty()
}

/// One error of a request refused for several: the JSON path of the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// Response of `POST /v1/taskdefs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegisterTaskDefResponse {
    /// `family:revision`.
    pub task_definition: TaskDefRef,
    /// ECS fields accepted but not used by mpsfleet, as JSON paths.
    pub ignored_fields: Vec<String>,
}

/// Response of `POST /v1/tasks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunTaskResponse {
    pub tasks: Vec<Task>,
    pub placed: u32,
    pub pending: u32,
}

/// Response of `POST /v1/agent/register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegisterHostResponse {
    pub host_id: HostId,
    /// Bearer credential for this host only; shown once.
    pub credential: String,
    /// What the server presents when it calls the agent (for task logs); the agent accepts
    /// no other caller.
    pub agent_token: String,
}

/// Body of `POST /v1/agent/status`: a heartbeat, optionally with onboarding done, and the
/// agent's latest checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostStatusReport {
    /// GPUs discovered, daemons started and first probe passed: the host may take work.
    #[serde(default)]
    pub onboarded: bool,
    #[serde(default)]
    pub checks: Vec<crate::host::HostCheck>,
    /// The agent's number for its current checks, which grows whenever they change. A server
    /// that holds them under this number says so in its answer (`checksRev`), and the agent's
    /// next heartbeats may leave them out until they change (`checksUnchanged`), as a
    /// kubelet's lease renews a node without sending its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks_rev: Option<u64>,
    /// `checks` is left out: the agent's checks are still those of `checksRev`, which the
    /// server acknowledged holding. A server that does not hold them (it restarted, or a new
    /// leader answers) takes nothing from the heartbeat and answers without `checksRev`; the
    /// agent then sends them in full.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checks_unchanged: bool,
    /// Where the agent serves task logs (`https://ADDR`; `http://ADDR` for a plain-HTTP
    /// server), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_url: Option<String>,
    /// `sha256:<hex>` of the certificate the agent's `https://` endpoint serves: the server
    /// trusts that certificate there and no other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_cert_sha256: Option<String>,
    /// The hashes (`sha256:<hex>`) of the CAs the agent trusts its server by: a CA rotation
    /// is activated once every host trusts the next CA.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_ca_sha256: Vec<String>,
    /// The agent's heartbeat interval in ms (`--heartbeat-ms`): the bounds an incident on the
    /// host is held to count a report's wait as this long. Kept from the last heartbeat that
    /// carried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    /// The agent was started with `--allow-fault-injection`: it injects the faults a drill
    /// asks for. Sent with `heartbeatMs`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accepts_faults: bool,
    /// What each task uses of its GPU now (at most [`crate::host::MAX_GPU_USE_REPORTS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_use: Vec<crate::host::TaskGpuUse>,
}

/// Response of `POST /v1/agent/status`: what the agent must apply now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostStatusAnswer {
    /// The host's pool's current health policy: the agent probes its MPS daemons with it
    /// (interval, timeout, failure threshold, local restarts) from the next probe on.
    #[serde(default)]
    pub health_policy: crate::policy::HealthPolicy,
    /// The hashes of the CAs the cluster's clients should trust (the active one first): an
    /// agent trusting other ones fetches them (`GET /v1/cluster/ca`) over its verified
    /// connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_ca_sha256: Vec<String>,
    /// How many times an operator asked to re-arm the host's local repair (`host recheck`):
    /// when it goes up, the agent gives every daemon it gave up on a fresh restart budget.
    #[serde(default)]
    pub rechecks: u64,
    /// The `checksRev` of the host's checks the server holds, if it holds any reported with a
    /// number: while it equals the agent's, the agent may send heartbeats without its checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks_rev: Option<u64>,
    /// The faults a running drill asks the agent to inject now; one no longer listed is taken
    /// back (docs/drills.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<crate::drill::InjectedFault>,
}

/// Response of `GET /v1/agent/assignments`: every task placed on the host that is not yet
/// STOPPED, with the definitions they need, and the store revision the answer reflects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignments {
    pub revision: u64,
    pub tasks: Vec<Task>,
    pub task_definitions: Vec<crate::taskdef::TaskDefinition>,
    /// The host's pool lets process tasks run as the `user` their definition names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_task_users: bool,
}

/// Body of `POST /v1/incidents/{id}/resolve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResolveIncident {
    /// Why the operator closes the incident (1 to 1024 characters), kept on its timeline.
    pub reason: String,
}

/// Answer of the operator commands `host activate` and `incident resolve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorCommandResponse {
    /// The host after the command (`host activate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::host::HostView>,
    /// The incident the command changed, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<crate::incident::IncidentView>,
    /// What happened to a replacement host the incident had requested, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
}
