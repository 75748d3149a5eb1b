//! Roles and the API tokens an admin makes for people and tools.

use serde::{Deserialize, Serialize};

/// What a token may do. Each role may do everything the ones before it may.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read everything (no secret values): list, describe, explain, logs, events.
    Viewer,
    /// Run the fleet's work: task definitions, tasks, services, host drain / replace /
    /// activate / cordon / forget, incidents.
    Operator,
    /// Everything: pools, tokens, secrets.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may do what `needed` may.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role {other:?}: expected viewer, operator or admin")),
        }
    }
}

/// Body of `POST /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateToken {
    pub role: Role,
    /// Seconds until the token stops working; none: it works until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_s: Option<u64>,
    /// Who or what it is for (1 to 256 characters), shown by `token list`.
    #[serde(default)]
    pub description: String,
    /// The one pool it acts in (viewer and operator tokens): it sees and changes that pool's
    /// hosts, tasks, services and incidents only. None: every pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Also an AWS access key for the ECS-compatible API: the answer carries an access key id,
    /// and the token is its secret access key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub aws: bool,
}

/// A token as `token list` shows it: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    pub id: String,
    pub role: Role,
    pub description: String,
    pub created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Who made it (`admin`, or `token:<id>`).
    pub created_by: String,
    /// The one pool it acts in, if it is scoped to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Its AWS access key id (`token create --aws`): the token signs ECS-compatible calls as
    /// that key's secret access key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    /// The token it was made from, for a console sign-in (`admin`: the bootstrap admin
    /// token): it expires no later than that token and is revoked with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// `POST /v1/console/links`: how long the link works.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateConsoleLink {
    /// 1 to 600 seconds (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_seconds: Option<u64>,
}

/// Answer of `POST /v1/console/links`: a one-time code the console trades for a token of its
/// own with the caller's role (`/#login=CODE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsoleLink {
    pub code: String,
    /// The role the console will hold: the caller's.
    pub role: Role,
    pub expires_at_ms: u64,
}

/// Answer of `POST /v1/console/session`: the console's own token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsoleSession {
    pub token: String,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub expires_at_ms: u64,
}

/// Answer of `POST /v1/tokens`: the token, shown this once, and its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub view: TokenView,
}

/// One change made through the API by a person or tool, as `audit list` shows it. Stored as an
/// [`crate::Entry`] (when, and how often in a row the same call with the same result came).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// `admin` (the bootstrap admin token) or `token:<id>`.
    pub actor: String,
    pub role: Role,
    /// Method and route, e.g. `POST /v1/pools/{name}`.
    pub action: String,
    /// The path called, e.g. `/v1/pools/gpu`.
    pub target: String,
    /// The client's address.
    pub from: String,
    /// `ok`, or the error's code and message.
    pub result: String,
    /// The store revision the change was committed in (none for a refused change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// An audit log entry.
pub type AuditEntry = crate::Entry<AuditEvent>;

/// How long a join token works unless told otherwise: a day.
pub const DEFAULT_JOIN_TOKEN_LIFETIME_S: u64 = 86_400;

/// Body of `POST /v1/join-tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateJoinToken {
    /// Seconds until the token stops working (default a day; join tokens always expire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_s: Option<u64>,
    /// Who or what it is for (at most 256 characters), shown by `join-token list`.
    #[serde(default)]
    pub description: String,
}

/// A join token as `join-token list` shows it: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenView {
    pub id: String,
    pub description: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    /// Who made it (`admin`, `token:<id>`, or `first start`).
    pub created_by: String,
}

/// Answer of `POST /v1/join-tokens`: the token with the cluster CA's hash after it, shown
/// this once, and its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedJoinToken {
    pub token: String,
    #[serde(flatten)]
    pub view: JoinTokenView,
}

/// The certificate a server serves (`GET /v1/cluster/certificate`,
/// `POST /v1/cluster/certificate/rotate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerCertificate {
    /// `sha256:<hex>` of the certificate's DER.
    pub sha256: String,
    /// The DNS names and addresses it is valid for.
    pub names: Vec<String>,
    pub not_before_ms: u64,
    pub not_after_ms: u64,
    /// `sha256:<hex>` of the cluster CA it chains to: what join tokens carry.
    pub ca_hash: String,
}

/// One of the cluster's CAs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaInfo {
    /// `sha256:<hex>` of its certificate's DER: what join tokens carry.
    pub sha256: String,
    /// Its subject's common name.
    pub subject: String,
    pub not_after_ms: u64,
    /// Whether the operator gave it (else the cluster made it).
    #[serde(default)]
    pub given: bool,
}

/// The cluster's CAs and where a rotation stands (`GET /v1/cluster/ca/rotation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaRotation {
    /// The CA server certificates are issued under.
    pub active: CaInfo,
    /// The CA a rotation staged: trusted by clients alongside `active`, not signing yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<CaInfo>,
    /// While a rotation is under way: the hosts whose agents have not yet reported that they
    /// trust `next` (activating it before they do would cut them off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts_not_trusting_next: Vec<String>,
}

/// Body of `POST /v1/cluster/ca/rotation`: the next CA, or nothing for the cluster to make one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BeginCaRotation {
    /// The operator's CA certificate, PEM (with `caKeyPem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_pem: Option<String>,
    /// Its private key, PKCS#8 PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_key_pem: Option<String>,
}

/// Body of `POST /v1/cluster/ca/rotation/activate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActivateCa {
    /// Activate even though some hosts have not reported trusting the next CA: they can no
    /// longer reach the server until they are given it (`--ca-file`) or join again.
    #[serde(default)]
    pub force: bool,
}

/// Answer of `POST /v1/admin-token/rotate`: the new bootstrap admin token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RotatedAdminToken {
    pub token: String,
    pub rotated_at_ms: u64,
}

/// Where the control plane's state lives and who leads (`GET /v1/cluster/status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// `sqlite` (one server) or `etcd` (several servers, one elected leader).
    pub store: String,
    /// The store's revision: one more for every commit.
    pub revision: u64,
    /// The server that answered; with etcd, always the leader (followers serve no API).
    pub server_id: String,
    /// The elected leader. With SQLite the one server leads.
    pub leader: LeaderView,
    /// The etcd members this server was given, and how each answered; empty with SQLite.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<EtcdMemberView>,
}

/// The leading server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderView {
    pub id: String,
    /// Where clients reach it (as it advertises itself; absent with SQLite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The etcd lease that keeps its election key (hex, as `etcdctl lease` shows it); absent
    /// with SQLite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The lease's TTL in seconds: how long a dead leader goes unnoticed at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl_seconds: Option<u64>,
    /// The election key's create revision in etcd, which fences the leader's writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_revision: Option<i64>,
}

/// One etcd member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberView {
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub healthy: bool,
    /// Whether this member is etcd's own raft leader.
    pub raft_leader: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_bytes: Option<i64>,
    /// Why it did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
