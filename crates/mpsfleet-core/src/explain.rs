//! `pool explain`: the responsibility record of a pool, derived from its configuration.
//!
//! Every sentence is built from the pool's actual policy values, so the record cannot drift
//! from what the detector, the agents and the remediation controller do.

use crate::health::fmt_ms;
use mpsfleet_types::policy::{Provider, ProviderKind};
use mpsfleet_types::{OwnershipMode, Pool};
use serde::{Deserialize, Serialize};

/// One step of the record: who is responsible, and what exactly happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Responsibility {
    /// `mpsfleet`, `agent` or `operator`.
    pub who: String,
    pub what: String,
    /// The configuration values the sentence was built from.
    pub settings: serde_json::Value,
}

/// The record, with the keys the API and `-o json` promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub pool: String,
    pub mode: String,
    /// Who owns host recovery: `mpsfleet` or `operator`.
    pub owner: String,
    pub detector: Responsibility,
    pub decision: Responsibility,
    pub local_repair: Responsibility,
    pub replacement: Responsibility,
    pub resumption: Responsibility,
    pub safety_limits: Responsibility,
    /// How long each phase of a recovery may take under this policy, per kind of failure,
    /// with the inputs and formulas (docs/pools.md "Recovery bounds").
    pub bounds: mpsfleet_types::bounds::RecoveryBounds,
    /// Managed scaling, when the pool's provider has it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<Responsibility>,
    /// The scaling controller's last decision and why, as the server last made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scaling_decision: Option<String>,
    /// The provider's measured launches (ask to join), beside its launchTimeoutSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_launches: Option<String>,
}

impl Explanation {
    /// The steps in order, with their names, for a table.
    pub fn steps(&self) -> [(&'static str, &Responsibility); 6] {
        [
            ("detector", &self.detector),
            ("decision", &self.decision),
            ("local repair", &self.local_repair),
            ("replacement", &self.replacement),
            ("resumption", &self.resumption),
            ("safety limits", &self.safety_limits),
        ]
    }
}

fn r(who: &str, what: String, settings: serde_json::Value) -> Responsibility {
    Responsibility { who: who.to_string(), what, settings }
}

pub fn explain(pool: &Pool, iv: &crate::bounds::Intervals) -> Explanation {
    let h = &pool.health_policy;
    let rem = &pool.remediation_policy;
    let managed = pool.mode == OwnershipMode::Managed;
    let owner = if managed { "mpsfleet" } else { "operator" };

    let detector = r(
        "agent",
        format!(
            "the agent on each host probes every GPU's nvidia-cuda-mps-control every {} with a hard \
             timeout of {} (a daemon that does not answer in time counts as failed), sees the daemon \
             process exit at once, and watches control.log for servers exiting with an error; the \
             GPU's MPS_DAEMON check turns IMPAIRED after {} consecutive failures. The server turns a \
             host's AGENT check IMPAIRED after {} without a heartbeat. GPU checks come from NVML \
             (critical Xid and ECC events) where the agent can read them",
            fmt_ms(h.mps_probe_interval_ms),
            fmt_ms(h.mps_probe_timeout_ms),
            h.mps_failure_threshold,
            fmt_ms(h.agent_heartbeat_grace_ms),
        ),
        serde_json::json!({
            "checks": ["AGENT", "MPS_DAEMON", "GPU"],
            "mpsProbeIntervalMs": h.mps_probe_interval_ms,
            "mpsProbeTimeoutMs": h.mps_probe_timeout_ms,
            "mpsFailureThreshold": h.mps_failure_threshold,
            "agentHeartbeatGraceMs": h.agent_heartbeat_grace_ms,
        }),
    );

    let decision = r(
        owner,
        if managed {
            format!(
                "an impaired host gets no new tasks at once; when a check has stayed IMPAIRED for {}, \
                 mpsfleet declares the host bad and opens an incident, and mpsfleet decides to \
                 replace it; a shorter failure opens no incident",
                fmt_ms(h.toleration_ms)
            )
        } else {
            format!(
                "an impaired host gets no new tasks at once; when a check has stayed IMPAIRED for {}, \
                 mpsfleet opens an incident owned by the operator and reports it (events, webhook); \
                 the operator decides what to do",
                fmt_ms(h.toleration_ms)
            )
        },
        serde_json::json!({ "tolerationMs": h.toleration_ms, "decidedBy": owner }),
    );

    let local_repair = r(
        "agent",
        if h.local_daemon_restarts == 0 {
            "none: the agent does not restart a failed MPS daemon".to_string()
        } else {
            format!(
                "the agent restarts a dead or hung MPS daemon itself (stale sockets cleaned), up to {} \
                 times in 10 minutes (an earlier failure's restarts in that time count; an incident's \
                 timeline numbers each restart so), before its check stays IMPAIRED",
                h.local_daemon_restarts
            )
        },
        serde_json::json!({ "localDaemonRestarts": h.local_daemon_restarts }),
    );

    let replacement = match (managed, &pool.provider) {
        (true, Some(p)) => r(
            "mpsfleet",
            format!(
                "mpsfleet cordons the host, marks it DRAINING, asks the {} provider for a new host \
                 ({}), moves the tasks, then has the provider terminate the old host; the pool is kept \
                 at {} host(s)",
                p.kind.as_str(),
                provider_detail(p),
                p.desired_hosts
            ),
            serde_json::json!({ "provider": p.kind.as_str(), "desiredHosts": p.desired_hosts }),
        ),
        (true, None) => r(
            "mpsfleet",
            "mpsfleet cordons the host, marks it DRAINING and moves the tasks to healthy hosts; no \
             capacity provider is configured, so no new host is launched and the old one is not \
             terminated: the operator adds and removes machines"
                .to_string(),
            serde_json::json!({ "provider": null }),
        ),
        (false, _) => r(
            "operator",
            "none: the operator. Nothing is drained, moved or replaced automatically; the operator \
             runs 'mpsfleet host drain HOST' or 'mpsfleet host replace HOST', which run the same \
             steps on demand and record them on the incident"
                .to_string(),
            serde_json::json!({ "provider": pool.provider.as_ref().map(|p| p.kind.as_str()) }),
        ),
    };

    let resumption = r(
        owner,
        format!(
            "{}: tasks of services move to healthy capacity; a service with resumption 'restart' gets \
             its replacements at once (at-least-once: the old copy may still run on a host that lost \
             only its daemon), one with 'fenced' only after the provider confirms the old host is \
             terminated (at-most-once). Tasks started with 'task run' are stopped with stop code \
             HostReplaced and not restarted. A moved task starts again from its beginning: mpsfleet \
             promises no uninterrupted execution, and application state and re-initialisation stay \
             the application's",
            if managed {
                "automatically, once the host is declared bad"
            } else {
                "only when the operator acts"
            }
        ),
        serde_json::json!({ "services": ["restart", "fenced"], "standaloneTasks": "stopped (HostReplaced)" }),
    );

    let rl = &rem.rate_limit;
    let safety_limits = r(
        "mpsfleet",
        if managed {
            format!(
                "no automatic replacement while more than {}% of the pool's hosts are unhealthy (at \
                 least one host may always be replaced); at most {} replacement(s) in flight and {} per \
                 {}; an incident blocked by a limit says so and why",
                rem.storm_breaker_percent,
                rem.max_in_flight,
                rl.max,
                fmt_ms(rl.per_ms)
            )
        } else {
            "none needed: nothing is replaced automatically in a self-managed pool".to_string()
        },
        serde_json::json!({
            "stormBreakerPercent": rem.storm_breaker_percent,
            "maxInFlight": rem.max_in_flight,
            "rateLimit": { "max": rl.max, "perMs": rl.per_ms },
        }),
    );

    Explanation {
        pool: pool.name.to_string(),
        mode: pool.mode.as_str().to_string(),
        owner: owner.to_string(),
        detector,
        decision,
        local_repair,
        replacement,
        resumption,
        safety_limits,
        bounds: crate::bounds::derive(pool, iv),
        scaling: pool.provider.as_ref().and_then(scaling),
        last_scaling_decision: None,
        measured_launches: None,
    }
}

/// What managed scaling does in this pool, in words.
fn scaling(p: &Provider) -> Option<Responsibility> {
    let (m, shape) = (p.scaling()?, p.host_shape?);
    Some(r(
        "mpsfleet",
        format!(
            "keeps between {} and {} hosts of {} GPU(s) of {} MiB: waiting tasks settle (1 s without a new one,              10 s at most), are packed onto that shape as the scheduler places them, and the pool grows in              one step to {}% reservation (steps of {} to {} hosts; no new step within {} s while launched              hosts have not joined); a host empty of work (DAEMON services' tasks aside) for {} s is              removed, at most {}% of the pool per step, never below {} hosts, never while an incident is              open or a drill runs; repairs are launched apart and never wait for scaling",
            m.min_hosts,
            m.max_hosts,
            shape.gpus,
            shape.gpu_memory_mib,
            m.target_capacity,
            m.minimum_scaling_step_size,
            m.maximum_scaling_step_size,
            m.instance_warmup_period,
            m.scale_in_after_seconds,
            m.scale_in_budget_percent,
            m.min_hosts,
        ),
        serde_json::to_value(m).unwrap_or_default(),
    ))
}

fn provider_detail(p: &Provider) -> String {
    match (p.kind, &p.name) {
        (ProviderKind::Local, _) => "agents as local processes of `mpsfleet up`, which are up's to \
                                     relaunch: Ctrl-C stops them with their tasks ('stopped with up') \
                                     and the next up on the same data dir starts the same hosts again"
            .into(),
        (ProviderKind::Exec, Some(name)) => format!("runs the server's exec provider {name}"),
        (ProviderKind::Exec, None) => "no exec provider named (set provider.name)".into(),
        (ProviderKind::AwsEc2, Some(name)) => {
            format!("EC2 instances, launched through EC2's API by the server's aws-ec2 provider {name}")
        }
        (ProviderKind::AwsEc2, None) => "no aws-ec2 provider named (set provider.name)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::policy::*;
    use mpsfleet_types::*;

    fn pool(mode: OwnershipMode, provider: Option<Provider>) -> Pool {
        Pool {
            name: PoolName::new("gpu").unwrap(),
            mode,
            strategy: PlacementStrategy::Binpack,
            compute_overcommit_percent: None,
            health_policy: HealthPolicy {
                mps_probe_interval_ms: 2_000,
                mps_probe_timeout_ms: 1_500,
                ..Default::default()
            },
            remediation_policy: RemediationPolicy { storm_breaker_percent: 30, ..Default::default() },
            provider,
            allow_task_users: false,
            task_policy: Default::default(),
            max_resume_seconds: None,
            preemption: Default::default(),
            restart_copies: Default::default(),
            events: Default::default(),
            created_at_ms: 0,
            tags: Vec::new(),
            kept_fields: Default::default(),
        }
    }

    fn explain_(p: &Pool) -> Explanation {
        let iv = crate::bounds::Intervals {
            agent_heartbeat_ms: 1_000,
            restart_backoff_ms: 1_000,
            daemon_start_ms: 1_000,
            health_tick_ms: 250,
            incident_pass_ms: 250,
            task_start_ms: 30_000,
            webhook_ms: 31_500,
        };
        explain(p, &iv)
    }

    #[test]
    fn managed_pools_are_repaired_by_mpsfleet_with_their_settings() {
        let p = Provider::local(4);
        let e = explain_(&pool(OwnershipMode::Managed, Some(p)));
        assert_eq!(e.owner, "mpsfleet");
        assert!(
            e.detector.what.contains("every 2s") && e.detector.what.contains("timeout of 1.5s"),
            "{}",
            e.detector.what
        );
        assert_eq!(e.decision.who, "mpsfleet");
        assert!(e.replacement.what.contains("local provider") && e.replacement.what.contains("4 host(s)"));
        assert!(e.replacement.what.contains("up's to relaunch"), "{}", e.replacement.what);
        assert!(e.safety_limits.what.contains("more than 30%"));
        assert!(e.resumption.what.contains("starts again from its beginning"));
    }

    #[test]
    fn self_managed_pools_leave_decision_and_replacement_to_the_operator() {
        let e = explain_(&pool(OwnershipMode::SelfManaged, None));
        assert_eq!(e.owner, "operator");
        assert_eq!(e.decision.who, "operator");
        assert!(e.replacement.what.starts_with("none: the operator"), "{}", e.replacement.what);
        assert!(e.resumption.what.contains("only when the operator acts"));
        let json = serde_json::to_value(&e).unwrap();
        for key in
            ["detector", "decision", "localRepair", "replacement", "resumption", "safetyLimits", "owner"]
        {
            assert!(json.get(key).is_some(), "missing {key}");
        }
    }

    #[test]
    fn no_local_repair_is_said_plainly() {
        let mut p = pool(OwnershipMode::Managed, None);
        p.health_policy.local_daemon_restarts = 0;
        let e = explain_(&p);
        assert!(e.local_repair.what.starts_with("none"));
        assert!(e.replacement.what.contains("no capacity provider"));
    }
}
