//! A pool's health policy, remediation policy and capacity provider, plus a service's
//! resumption boundary: the configuration that `pool explain` turns into the responsibility
//! record. Every struct loads with defaults when a stored pool predates it.

pub use crate::policy_error::PolicyError;
use crate::policy_error::{err, in_range};
use serde::{Deserialize, Serialize};

/// How a pool detects an unhealthy host and when it declares it bad.
///
/// The probe fields are what agents in the pool use for their MPS daemons; the server uses
/// the heartbeat grace and the toleration window (see `mpsfleet_core::health`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct HealthPolicy {
    /// How long an agent may stay silent before its AGENT check turns IMPAIRED.
    /// 1s to 10m; default 10s (two missed 5s heartbeats).
    pub agent_heartbeat_grace_ms: u64,
    /// How often each MPS control daemon is probed. 1s to 5m; default 5s.
    pub mps_probe_interval_ms: u64,
    /// Hard timeout of one probe; a hang counts as a failure. 100ms to 60s and less than the
    /// interval; default 3s.
    pub mps_probe_timeout_ms: u64,
    /// Consecutive probe failures before the MPS_DAEMON check turns IMPAIRED. 1 to 100;
    /// default 3.
    pub mps_failure_threshold: u32,
    /// Local daemon restarts the agent tries before it gives up. 0 to 100; default 3.
    pub local_daemon_restarts: u32,
    /// How long a check must stay IMPAIRED before the host is declared bad; a shorter failure
    /// opens no incident. 0 to 1h; default 2s. The agent is the first guard against flapping:
    /// it reports a daemon IMPAIRED only after `mpsFailureThreshold` consecutive failures, and
    /// at that moment restarts it (killing the failed daemon at once, then probing the new one
    /// at once), so a local repair that works clears the check well within 2s. What stays
    /// IMPAIRED past that is a daemon that will not come back (local restarts exhausted), a
    /// GPU fault, or an agent silent past its grace (declared bad 12s after its last
    /// heartbeat by default).
    pub toleration_ms: u64,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            agent_heartbeat_grace_ms: 10_000,
            mps_probe_interval_ms: 5_000,
            mps_probe_timeout_ms: 3_000,
            mps_failure_threshold: 3,
            local_daemon_restarts: 3,
            toleration_ms: 2_000,
        }
    }
}

impl HealthPolicy {
    /// Checks every field; the error names the first bad one and its allowed range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let p = "healthPolicy";
        in_range(&format!("{p}.agentHeartbeatGraceMs"), self.agent_heartbeat_grace_ms, 1_000, 600_000, "ms")?;
        in_range(&format!("{p}.mpsProbeIntervalMs"), self.mps_probe_interval_ms, 1_000, 300_000, "ms")?;
        in_range(&format!("{p}.mpsProbeTimeoutMs"), self.mps_probe_timeout_ms, 100, 60_000, "ms")?;
        if self.mps_probe_timeout_ms >= self.mps_probe_interval_ms {
            return Err(err(
                &format!("{p}.mpsProbeTimeoutMs"),
                format!(
                    "must be less than {p}.mpsProbeIntervalMs ({}ms), got {}ms",
                    self.mps_probe_interval_ms, self.mps_probe_timeout_ms
                ),
            ));
        }
        in_range(&format!("{p}.mpsFailureThreshold"), self.mps_failure_threshold.into(), 1, 100, "")?;
        in_range(&format!("{p}.localDaemonRestarts"), self.local_daemon_restarts.into(), 0, 100, "")?;
        in_range(&format!("{p}.tolerationMs"), self.toleration_ms, 0, 3_600_000, "ms")
    }
}

/// At most `max` replacements requested per `per_ms` in one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RateLimit {
    /// 1 to 1000; default 5.
    pub max: u32,
    /// 1m to 24h; default 10m.
    pub per_ms: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self { max: 5, per_ms: 600_000 }
    }
}

/// The safety limits on automatic remediation in a managed pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RemediationPolicy {
    /// No automatic replacement for hosts beyond `max(1, ceil(total * percent / 100))`
    /// unhealthy ones: when more of the pool is unhealthy than that, the cause is more likely
    /// shared (network, driver roll-out, control plane) than the hosts. 1 to 100; default 20.
    pub storm_breaker_percent: u32,
    /// Replacements in flight at once in the pool. 1 to 100; default 2: two independent
    /// failures recover in parallel, and with the default breaker a 10-host pool may have two
    /// unhealthy hosts anyway.
    pub max_in_flight: u32,
    /// Default 5 per 10m: enough for a few genuine failures, few enough that a detector bug
    /// cannot churn through a pool.
    pub rate_limit: RateLimit,
}

impl Default for RemediationPolicy {
    fn default() -> Self {
        Self { storm_breaker_percent: 20, max_in_flight: 2, rate_limit: RateLimit::default() }
    }
}

impl RemediationPolicy {
    /// Checks every field; the error names the first bad one and its allowed range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let p = "remediationPolicy";
        in_range(&format!("{p}.stormBreakerPercent"), self.storm_breaker_percent.into(), 1, 100, "")?;
        in_range(&format!("{p}.maxInFlight"), self.max_in_flight.into(), 1, 100, "")?;
        in_range(&format!("{p}.rateLimit.max"), self.rate_limit.max.into(), 1, 1_000, "")?;
        in_range(&format!("{p}.rateLimit.perMs"), self.rate_limit.per_ms, 60_000, 86_400_000, "ms")
    }
}

/// What launches and terminates hosts of a managed pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Agents as child processes of the server (`mpsfleet up`).
    #[default]
    Local,
    /// Operator-supplied commands.
    Exec,
    /// EC2 instances, launched through EC2's API by the server.
    #[serde(rename = "aws-ec2")]
    AwsEc2,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Exec => "exec",
            ProviderKind::AwsEc2 => "aws-ec2",
        }
    }

    /// Whether the kind names one of the server's configured providers (`provider.name`).
    pub fn is_named(self) -> bool {
        matches!(self, ProviderKind::Exec | ProviderKind::AwsEc2)
    }
}

/// The commands of an `exec` provider as older servers took them in a pool. Read from stored
/// pools, refused in requests: commands are the server's configuration (docs/providers.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ExecCommands {
    pub launch: Vec<String>,
    pub terminate: Vec<String>,
    pub describe: Vec<String>,
}

/// The longest name of an exec provider in the server's configuration.
pub const MAX_PROVIDER_NAME: usize = 64;

/// A managed pool's capacity provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Provider {
    pub kind: ProviderKind,
    /// For `exec`: which of the exec providers in the server's configuration file
    /// (`providers.<name>`) launches the pool's hosts; for `aws-ec2`, which of its EC2
    /// providers (`ec2Providers.<name>`). The API chooses among them; it never supplies
    /// commands or cloud settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Commands an older server stored in the pool; refused in requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecCommands>,
    /// Hosts the provider keeps in the pool. 0 to 10000.
    #[serde(default)]
    pub desired_hosts: u32,
    /// What a host it launches has: lets `task run` and `service create` refuse a task that
    /// no host of the pool, present or to come, could ever hold. Without it, only the pool's
    /// hosts are judged (and a pool without hosts waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_shape: Option<HostShape>,
    /// How long a launch may take, from the request to the new host joining, before it counts
    /// as failed: the incident is BLOCKED until `host replace` asks again (a host that joins
    /// later still becomes the replacement). 10 to 3600; default 60 for `local`, 600 for
    /// `exec` and `aws-ec2`. The pool's replace bound is built from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_timeout_seconds: Option<u32>,
    /// The host count follows the pool's demand (needs `hostShape`): `desiredHosts` is then
    /// the scaling controller's output ([`crate::scaling::ManagedScaling`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_scaling: Option<crate::scaling::ManagedScaling>,
}

/// The GPUs of the hosts a provider launches, all alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostShape {
    /// GPUs per host, 1 to 64.
    pub gpus: u32,
    /// Memory of each GPU in MiB, 1 to 16777216.
    pub gpu_memory_mib: u64,
    /// MPS clients each GPU accepts, 1 to 48 (default 48).
    #[serde(default = "default_shape_clients")]
    pub max_mps_clients: u32,
    /// The host's CPU in ECS's units (1024 per vCPU) and memory in MiB, 128 to 1048576 and
    /// 512 to 16777216: managed scaling packs tasks' `cpu` and `memory` onto them. Unset, a
    /// host is taken to hold any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
}

fn default_shape_clients() -> u32 {
    48
}

impl Provider {
    /// The pool's managed scaling, when it is on.
    pub fn scaling(&self) -> Option<&crate::scaling::ManagedScaling> {
        self.managed_scaling.as_ref().filter(|m| m.enabled())
    }

    /// A `local` provider keeping `desired_hosts`.
    pub fn local(desired_hosts: u32) -> Self {
        Provider {
            kind: ProviderKind::Local,
            name: None,
            exec: None,
            desired_hosts,
            host_shape: None,
            launch_timeout_seconds: None,
            managed_scaling: None,
        }
    }

    /// The exec provider `name` of the server's configuration, keeping `desired_hosts`.
    pub fn exec(name: impl Into<String>, desired_hosts: u32) -> Self {
        Provider {
            kind: ProviderKind::Exec,
            name: Some(name.into()),
            exec: None,
            desired_hosts,
            host_shape: None,
            launch_timeout_seconds: None,
            managed_scaling: None,
        }
    }

    /// Checks the provider of a request; the error names the first bad field. Whether the
    /// name is configured is the server's to check.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.exec.is_some() {
            return Err(err(
                "provider.exec",
                "commands cannot be set through the API: define them in the server's configuration \
                 file (providers.<name>, see docs/providers.md) and give provider.name"
                    .into(),
            ));
        }
        match (self.kind, &self.name) {
            (ProviderKind::Local, Some(_)) => {
                return Err(err(
                    "provider.name",
                    "only allowed when provider.kind is \"exec\" or \"aws-ec2\"".into(),
                ));
            }
            (ProviderKind::Exec, None) => {
                return Err(err(
                    "provider.name",
                    "required when provider.kind is \"exec\": the name of an exec provider in the \
                     server's configuration file"
                        .into(),
                ));
            }
            (ProviderKind::AwsEc2, None) => {
                return Err(err(
                    "provider.name",
                    "required when provider.kind is \"aws-ec2\": the name of an EC2 provider in the \
                     server's configuration file (ec2Providers.<name>)"
                        .into(),
                ));
            }
            (ProviderKind::Exec | ProviderKind::AwsEc2, Some(name)) => {
                if let Some(problem) = provider_name_problem(name) {
                    return Err(err("provider.name", problem));
                }
            }
            (ProviderKind::Local, None) => {}
        }
        if let Some(shape) = &self.host_shape {
            in_range("provider.hostShape.gpus", shape.gpus.into(), 1, 64, "")?;
            in_range("provider.hostShape.gpuMemoryMib", shape.gpu_memory_mib, 1, 16_777_216, " MiB")?;
            in_range("provider.hostShape.maxMpsClients", shape.max_mps_clients.into(), 1, 48, "")?;
            if let Some(cpu) = shape.cpu {
                in_range("provider.hostShape.cpu", cpu.into(), 128, 1_048_576, "")?;
            }
            if let Some(m) = shape.memory_mib {
                in_range("provider.hostShape.memoryMib", m, 512, 16_777_216, " MiB")?;
            }
        }
        if let Some(t) = self.launch_timeout_seconds {
            in_range("provider.launchTimeoutSeconds", t.into(), 10, 3_600, "")?;
        }
        if let Some(m) = &self.managed_scaling {
            m.validate()?;
            if m.enabled() && self.host_shape.is_none() {
                return Err(err(
                    "provider.hostShape",
                    "required with managedScaling: scaling packs waiting tasks onto hosts of this shape"
                        .into(),
                ));
            }
        }
        in_range("provider.desiredHosts", self.desired_hosts.into(), 0, 10_000, "")
    }
}

/// Why `name` cannot name an exec or EC2 provider: 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`.
pub fn provider_name_problem(name: &str) -> Option<String> {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > MAX_PROVIDER_NAME || !name.chars().all(ok) {
        Some(format!(
            "must be 1 to {MAX_PROVIDER_NAME} characters of a-z, 0-9, '-', '_' and '.', got {name:?}"
        ))
    } else {
        None
    }
}

/// When a service's tasks on a bad host are started elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResumptionBoundary {
    /// At once, while the old copy may still run (at-least-once).
    #[default]
    Restart,
    /// Only once the old host is confirmed terminated or has fenced itself (at-most-once).
    Fenced,
}

/// When a pool's `restart` services start copies of their replicas on a failing MPS daemon
/// elsewhere (docs/pools.md "Restart copies").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RestartCopies {
    /// At the daemon's first exit (or failed start): its servers ended and took their
    /// clients' GPU contexts with them, so the replicas there need replacing whatever local
    /// repair does. The copies beyond the service's count stop again, newest first, once
    /// local repair has the daemon answering. The default.
    #[default]
    FirstExit,
    /// Once the daemon's failure is confirmed (`mpsFailureThreshold` failures in a row, or
    /// local repair given up): no copy for a failure that local repair mends, at the cost of
    /// its restarts and backoffs.
    Confirmed,
}

impl RestartCopies {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartCopies::FirstExit => "first-exit",
            RestartCopies::Confirmed => "confirmed",
        }
    }
}

impl std::str::FromStr for RestartCopies {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "first-exit" => Ok(RestartCopies::FirstExit),
            "confirmed" => Ok(RestartCopies::Confirmed),
            _ => Err(format!("restartCopies must be first-exit or confirmed, got '{s}'")),
        }
    }
}

impl ResumptionBoundary {
    pub fn as_str(self) -> &'static str {
        match self {
            ResumptionBoundary::Restart => "restart",
            ResumptionBoundary::Fenced => "fenced",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Validates the three policies built from defaults with `patch` (a JSON object keyed
    /// `healthPolicy`, `remediationPolicy`, `provider`) merged in; `want` is None for valid or
    /// `(field, message)`.
    #[track_caller]
    fn check(patch: serde_json::Value, want: Option<(&str, &str)>) {
        let part = |key: &str| patch.get(key).cloned().unwrap_or(json!({}));
        let health: HealthPolicy = serde_json::from_value(part("healthPolicy")).unwrap();
        let remediation: RemediationPolicy = serde_json::from_value(part("remediationPolicy")).unwrap();
        let provider: Provider =
            serde_json::from_value(patch.get("provider").cloned().unwrap_or(json!({"kind": "local"})))
                .unwrap();
        let got = health.validate().and_then(|()| remediation.validate()).and_then(|()| provider.validate());
        match (got, want) {
            (Ok(()), None) => {}
            (Ok(()), Some((field, message))) => panic!("accepted {patch}, want {field}: {message}"),
            (Err(e), None) => panic!("refused {patch}: {e}"),
            (Err(e), Some((field, message))) => {
                assert_eq!(e.field, field, "{patch}: {e}");
                assert_eq!(e.message, message, "{patch}");
                assert_eq!(e.to_string(), format!("{field}: {message}"));
            }
        }
    }

    #[test]
    fn validation_table() {
        let h = |v| json!({ "healthPolicy": v });
        let r = |v| json!({ "remediationPolicy": v });
        let p = |v| json!({ "provider": v });
        check(json!({}), None);
        check(h(json!({"agentHeartbeatGraceMs": 1000, "tolerationMs": 0, "localDaemonRestarts": 0})), None);
        check(h(json!({"mpsProbeIntervalMs": 300000, "mpsProbeTimeoutMs": 60000})), None);
        check(
            h(json!({"agentHeartbeatGraceMs": 999})),
            Some(("healthPolicy.agentHeartbeatGraceMs", "must be between 1000ms and 600000ms, got 999ms")),
        );
        check(
            h(json!({"agentHeartbeatGraceMs": 600001})),
            Some(("healthPolicy.agentHeartbeatGraceMs", "must be between 1000ms and 600000ms, got 600001ms")),
        );
        check(
            h(json!({"mpsProbeIntervalMs": 300001})),
            Some(("healthPolicy.mpsProbeIntervalMs", "must be between 1000ms and 300000ms, got 300001ms")),
        );
        check(
            h(json!({"mpsProbeTimeoutMs": 99})),
            Some(("healthPolicy.mpsProbeTimeoutMs", "must be between 100ms and 60000ms, got 99ms")),
        );
        check(
            h(json!({"mpsProbeTimeoutMs": 5000})),
            Some((
                "healthPolicy.mpsProbeTimeoutMs",
                "must be less than healthPolicy.mpsProbeIntervalMs (5000ms), got 5000ms",
            )),
        );
        check(
            h(json!({"mpsFailureThreshold": 0})),
            Some(("healthPolicy.mpsFailureThreshold", "must be between 1 and 100, got 0")),
        );
        check(
            h(json!({"localDaemonRestarts": 101})),
            Some(("healthPolicy.localDaemonRestarts", "must be between 0 and 100, got 101")),
        );
        check(
            h(json!({"tolerationMs": 3600001})),
            Some(("healthPolicy.tolerationMs", "must be between 0ms and 3600000ms, got 3600001ms")),
        );
        check(r(json!({"stormBreakerPercent": 100, "maxInFlight": 100})), None);
        check(
            r(json!({"stormBreakerPercent": 0})),
            Some(("remediationPolicy.stormBreakerPercent", "must be between 1 and 100, got 0")),
        );
        check(
            r(json!({"maxInFlight": 0})),
            Some(("remediationPolicy.maxInFlight", "must be between 1 and 100, got 0")),
        );
        check(
            r(json!({"rateLimit": {"max": 1001}})),
            Some(("remediationPolicy.rateLimit.max", "must be between 1 and 1000, got 1001")),
        );
        check(
            r(json!({"rateLimit": {"perMs": 59999}})),
            Some((
                "remediationPolicy.rateLimit.perMs",
                "must be between 60000ms and 86400000ms, got 59999ms",
            )),
        );
        let exec =
            json!({"launch": ["/bin/launch"], "terminate": ["/bin/term", "x"], "describe": ["/bin/d"]});
        check(p(json!({"kind": "local", "desiredHosts": 10000})), None);
        check(p(json!({"kind": "exec", "name": "ec2-gpu"})), None);
        check(p(json!({"kind": "local", "launchTimeoutSeconds": 3600})), None);
        check(
            p(json!({"kind": "local", "launchTimeoutSeconds": 9})),
            Some(("provider.launchTimeoutSeconds", "must be between 10 and 3600, got 9")),
        );
        check(
            p(json!({"kind": "local", "desiredHosts": 10001})),
            Some(("provider.desiredHosts", "must be between 0 and 10000, got 10001")),
        );
        let no_commands =
            "commands cannot be set through the API: define them in the server's configuration \
                           file (providers.<name>, see docs/providers.md) and give provider.name";
        check(
            p(json!({"kind": "exec", "name": "x", "exec": exec.clone()})),
            Some(("provider.exec", no_commands)),
        );
        check(p(json!({"kind": "local", "exec": exec})), Some(("provider.exec", no_commands)));
        check(
            p(json!({"kind": "local", "name": "x"})),
            Some(("provider.name", "only allowed when provider.kind is \"exec\" or \"aws-ec2\"")),
        );
        check(p(json!({"kind": "aws-ec2", "name": "gpu"})), None);
        check(
            p(json!({"kind": "aws-ec2"})),
            Some((
                "provider.name",
                "required when provider.kind is \"aws-ec2\": the name of an EC2 provider in the \
                 server's configuration file (ec2Providers.<name>)",
            )),
        );
        check(
            p(json!({"kind": "aws-ec2", "name": "Bad"})),
            Some(("provider.name", "must be 1 to 64 characters of a-z, 0-9, '-', '_' and '.', got \"Bad\"")),
        );
        check(
            p(json!({"kind": "exec"})),
            Some((
                "provider.name",
                "required when provider.kind is \"exec\": the name of an exec provider in the server's \
                 configuration file",
            )),
        );
        check(
            p(json!({"kind": "exec", "name": "Bad Name"})),
            Some((
                "provider.name",
                "must be 1 to 64 characters of a-z, 0-9, '-', '_' and '.', got \"Bad Name\"",
            )),
        );
    }

    #[test]
    fn provider_kinds_keep_their_spelling() {
        for (kind, text) in
            [(ProviderKind::Local, "local"), (ProviderKind::Exec, "exec"), (ProviderKind::AwsEc2, "aws-ec2")]
        {
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(text));
            assert_eq!(serde_json::from_value::<ProviderKind>(json!(text)).unwrap(), kind);
            assert_eq!(kind.as_str(), text);
        }
        assert!(serde_json::from_value::<ProviderKind>(json!("awsec2")).is_err());
    }

    #[test]
    fn older_records_load_with_defaults() {
        #[derive(Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "camelCase")]
        struct OldPool {
            #[serde(default)]
            health_policy: HealthPolicy,
            #[serde(default)]
            remediation_policy: RemediationPolicy,
            #[serde(default)]
            resumption_boundary: ResumptionBoundary,
        }
        let old: OldPool = serde_json::from_str(r#"{"name": "p"}"#).unwrap();
        assert_eq!(old.health_policy, HealthPolicy::default());
        assert_eq!(old.remediation_policy, RemediationPolicy::default());
        assert_eq!(old.resumption_boundary, ResumptionBoundary::Restart);
        let partial: RemediationPolicy = serde_json::from_str(r#"{"rateLimit": {"max": 9}}"#).unwrap();
        assert_eq!(partial.rate_limit, RateLimit { max: 9, per_ms: 600_000 });
        assert_eq!(partial.max_in_flight, 2);
        HealthPolicy::default().validate().unwrap();
        RemediationPolicy::default().validate().unwrap();
    }

    #[test]
    fn json_names() {
        let v = serde_json::to_value(HealthPolicy::default()).unwrap();
        assert_eq!(
            v,
            json!({"agentHeartbeatGraceMs": 10000, "mpsProbeIntervalMs": 5000, "mpsProbeTimeoutMs": 3000,
                   "mpsFailureThreshold": 3, "localDaemonRestarts": 3, "tolerationMs": 2000})
        );
        let v = serde_json::to_value(RemediationPolicy::default()).unwrap();
        assert_eq!(
            v,
            json!({"stormBreakerPercent": 20, "maxInFlight": 2, "rateLimit": {"max": 5, "perMs": 600000}})
        );
        assert_eq!(serde_json::to_value(ResumptionBoundary::Fenced).unwrap(), json!("fenced"));
        assert_eq!(serde_json::to_value(ResumptionBoundary::Restart).unwrap(), json!("restart"));
        let p = Provider::local(2);
        assert_eq!(serde_json::to_value(p).unwrap(), json!({"kind": "local", "desiredHosts": 2}));
    }
}
