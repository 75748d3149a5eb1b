//! A pool's recovery bounds, derived from its policy: for each kind of failure, the longest
//! each phase of the timing record may take (detect, decide, replace, total), and the
//! formulas in words. Pure: the server passes its own intervals in ([`Intervals`]), so the
//! figures shown are the ones its loops run on.
//!
//! Each bound is a worst case over the steps the detector, the agent and the remediation
//! controller take, each step at its slowest: a probe answered just after an interval began,
//! a report waiting a whole heartbeat, an evaluation a whole tick. What the server cannot
//! bound (a task's own start, a machine's boot) is an allowance or the provider's
//! `launchTimeoutSeconds`, named among the inputs.

use crate::health::fmt_ms;
pub use mpsfleet_types::bounds::Intervals;
use mpsfleet_types::bounds::{BoundInputs, FailureKind, FullPoolBounds, KindBounds, RecoveryBounds};
use mpsfleet_types::policy::{ProviderKind, RestartCopies};
use mpsfleet_types::{OwnershipMode, Pool};

/// How long a provider's launch may take before it counts as failed, by default: a local
/// agent starts in seconds, a cloud machine boots in minutes.
pub fn default_launch_timeout_seconds(kind: ProviderKind) -> u32 {
    match kind {
        ProviderKind::Local => 60,
        ProviderKind::Exec | ProviderKind::AwsEc2 => 600,
    }
}

/// The pool's provider's launch timeout in ms, None without a provider.
pub fn launch_timeout_ms(pool: &Pool) -> Option<u64> {
    pool.provider.as_ref().map(|p| {
        u64::from(p.launch_timeout_seconds.unwrap_or_else(|| default_launch_timeout_seconds(p.kind))) * 1000
    })
}

/// The pool's bounds under its policy and `iv`.
pub fn derive(pool: &Pool, iv: &Intervals) -> RecoveryBounds {
    let h = &pool.health_policy;
    let managed = pool.mode == OwnershipMode::Managed;
    let launch = if managed { launch_timeout_ms(pool) } else { None };
    // A changed check waits up to a heartbeat to be reported, and the report reaches the
    // evaluation within a tick.
    let report = iv.agent_heartbeat_ms + iv.health_tick_ms;
    let declare = h.toleration_ms + iv.health_tick_ms;
    // Exits until the check turns IMPAIRED: the threshold, or fewer when the local restarts
    // run out first (the check is IMPAIRED once they have).
    let exits = h.mps_failure_threshold.min(h.local_daemon_restarts + 1);
    let repairs: u64 =
        (1..u64::from(exits)).map(|n| (n - 1) * iv.restart_backoff_ms + iv.daemon_start_ms).sum();
    let hang = u64::from(h.mps_failure_threshold - 1) * h.mps_probe_interval_ms + h.mps_probe_timeout_ms;
    let silent = h.agent_heartbeat_grace_ms + iv.health_tick_ms;
    let decide = managed.then_some(iv.health_tick_ms + iv.incident_pass_ms);
    let replace = launch.map(|l| l + iv.incident_pass_ms);
    let start = iv.incident_pass_ms + iv.health_tick_ms + iv.task_start_ms;
    // A `restart` service's copies: the failure the pool's `restartCopies` acts on, reported,
    // the services' pass (woken at once; a tick at most), the copies' start.
    let first_exit = pool.restart_copies == RestartCopies::FirstExit;
    let copies_after = report + iv.health_tick_ms + iv.task_start_ms;
    let kinds = FailureKind::ALL
        .into_iter()
        .map(|kind| {
            let detect = match kind {
                FailureKind::DaemonExit => repairs + report + declare,
                FailureKind::DaemonHang => hang + report + declare,
                FailureKind::GpuCheckFail => report + declare,
                FailureKind::AgentLost | FailureKind::HostLost => silent + declare,
            };
            let total = decide.map(|d| detect + d + start);
            // Fenced tasks wait for the replacement and the old host's termination, a
            // provider call held to the same limit.
            let total_fenced =
                decide.zip(launch).map(|(d, l)| detect + d + (l + iv.incident_pass_ms) + l + start);
            let copies_ms = match kind {
                FailureKind::DaemonExit if first_exit => Some(iv.daemon_start_ms + copies_after),
                FailureKind::DaemonExit => Some(repairs + copies_after),
                FailureKind::DaemonHang => Some(hang + copies_after),
                _ => None,
            };
            KindBounds {
                kind,
                detect_ms: detect,
                notify_ms: iv.webhook_ms,
                decide_ms: decide,
                replace_ms: replace,
                total_ms: total,
                total_fenced_ms: total_fenced,
                total_full_pool_ms: None,
                copies_ms,
            }
        })
        .collect();
    let inputs = BoundInputs {
        mps_probe_interval_ms: h.mps_probe_interval_ms,
        mps_probe_timeout_ms: h.mps_probe_timeout_ms,
        mps_failure_threshold: h.mps_failure_threshold,
        local_daemon_restarts: h.local_daemon_restarts,
        toleration_ms: h.toleration_ms,
        agent_heartbeat_grace_ms: h.agent_heartbeat_grace_ms,
        launch_timeout_ms: launch,
        intervals: *iv,
    };
    RecoveryBounds {
        owner: if managed { "mpsfleet" } else { "operator" }.to_string(),
        kinds,
        formulas: formulas(managed, launch.is_some(), exits, pool.restart_copies),
        inputs,
        max_resume_ms: pool.max_resume_seconds.map(|s| u64::from(s) * 1000),
        full_pool: None,
        restart_copies: Some(pool.restart_copies),
    }
}

/// Adds to `b` (the pool's bounds) how a full pool recovers: where the pool's `preemption`
/// lets recovery preempt, a recovering replica waits for its victims' stop (`victim_stop_ms`,
/// the longest over the pool's running tasks) instead of a launch: total = detect + decide +
/// victim stop + incidentPassMs + healthTickMs + taskStartMs; else a launched host: total =
/// detect + decide + replace + incidentPassMs + healthTickMs + taskStartMs; else none.
/// Victims get no shorter grace than a planned stop gives them: a shorter one would fail
/// their in-flight requests, one service's outage turned into another's errors.
pub fn add_full_pool(b: &mut RecoveryBounds, pool: &Pool, iv: &Intervals, victim_stop_ms: u64) {
    let preempts = pool.preemption.allows(true) && pool.mode == OwnershipMode::Managed;
    let by = if preempts {
        "preemption"
    } else if b.kinds.iter().any(|k| k.replace_ms.is_some()) {
        "launch"
    } else {
        "none"
    };
    let start = iv.incident_pass_ms + iv.health_tick_ms + iv.task_start_ms;
    for k in &mut b.kinds {
        let make_room = if preempts { Some(victim_stop_ms) } else { k.replace_ms };
        k.total_full_pool_ms = k.decide_ms.zip(make_room).map(|(d, r)| k.detect_ms + d + r + start);
    }
    b.formulas.push(match by {
        "preemption" => format!(
            "total (full pool, preemption {}) = detect + decide + victim stop ({}: the victims' \
             deregistrationDelaySeconds + stopTimeout, longest over the pool's running tasks) + incidentPassMs + \
             healthTickMs + taskStartMs",
            pool.preemption.as_str(),
            fmt_ms(victim_stop_ms)
        ),
        "launch" => format!(
            "total (full pool, preemption {}) = detect + decide + replace + incidentPassMs + healthTickMs + \
             taskStartMs: a launched host makes the room",
            pool.preemption.as_str()
        ),
        _ => format!(
            "total (full pool, preemption {}): none; nothing makes room, the replicas wait for capacity",
            pool.preemption.as_str()
        ),
    });
    b.full_pool = Some(FullPoolBounds {
        preemption: pool.preemption,
        by: by.to_string(),
        victim_stop_ms: preempts.then_some(victim_stop_ms),
    });
}

fn formulas(managed: bool, provider: bool, exits: u32, copies: RestartCopies) -> Vec<String> {
    let copies_exit = match copies {
        RestartCopies::FirstExit => {
            "copies (daemon-exit, restartCopies first-exit) = daemonStartMs (the exit \
             seen and its first local restart) + agentHeartbeatMs + healthTickMs + healthTickMs + \
             taskStartMs: a restart service's copies start at the daemon's first exit"
                .to_string()
        }
        RestartCopies::Confirmed => format!(
            "copies (daemon-exit, restartCopies confirmed) = the local restarts before the check turns \
             IMPAIRED (at most {}) + agentHeartbeatMs + healthTickMs + healthTickMs + taskStartMs",
            exits.saturating_sub(1)
        ),
    };
    let mut f = vec![
        format!(
            "detect (daemon-exit) = the local restarts before the check turns IMPAIRED (at most {} for \
             one failure, fewer when an earlier one used the 10-minute budget: the n-th after (n-1) x \
             restartBackoffMs, each taking daemonStartMs) + agentHeartbeatMs + \
             healthTickMs + tolerationMs + healthTickMs",
            exits.saturating_sub(1)
        ),
        "detect (daemon-hang) = (mpsFailureThreshold - 1) x mpsProbeIntervalMs + mpsProbeTimeoutMs + \
         agentHeartbeatMs + healthTickMs + tolerationMs + healthTickMs"
            .into(),
        "detect (gpu-check-fail) = agentHeartbeatMs + healthTickMs + tolerationMs + healthTickMs".into(),
        "detect (agent-lost, host-lost) = agentHeartbeatGraceMs + healthTickMs + tolerationMs + \
         healthTickMs, counted from the last heartbeat"
            .into(),
        "notify = webhookMs after detection (every attempt, its timeout and backoff)".into(),
        copies_exit,
        "copies (daemon-hang) = (mpsFailureThreshold - 1) x mpsProbeIntervalMs + mpsProbeTimeoutMs + \
         agentHeartbeatMs + healthTickMs + healthTickMs + taskStartMs: at the failure confirmed"
            .into(),
    ];
    if managed {
        f.push("decide = healthTickMs + incidentPassMs".into());
        if provider {
            f.push(
                "replace = launchTimeoutMs + incidentPassMs (a launch not joined by then counts as failed)"
                    .into(),
            );
        }
        f.push(
            "total (restart) = detect + decide + incidentPassMs + healthTickMs + taskStartMs, given room \
             on the pool's healthy hosts"
                .into(),
        );
        if provider {
            f.push(
                "total (fenced) = detect + decide + replace + launchTimeoutMs (the old host's \
                 termination) + incidentPassMs + healthTickMs + taskStartMs"
                    .into(),
            );
        }
    } else {
        f.push(
            "decide, replace and total: the operator's (a self-managed pool states detect and notify only)"
                .into(),
        );
    }
    f
}

/// `bounds` within the pool's `maxResumeSeconds`, or why not, in words naming the field.
pub fn check_max_resume(bounds: &RecoveryBounds) -> Result<(), String> {
    let (Some(max), Some((kind, total))) = (bounds.max_resume_ms, bounds.longest_total()) else {
        return Ok(());
    };
    if total <= max {
        return Ok(());
    }
    Err(format!(
        "the pool's policy bounds the time from first failure to resumed at {} ({kind}), more than \
         maxResumeSeconds ({}): shorten the probe interval, failure threshold, toleration, heartbeat \
         grace or the provider's launchTimeoutSeconds, or raise maxResumeSeconds",
        fmt_ms(total),
        fmt_ms(max)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::policy::{HealthPolicy, Provider};
    use mpsfleet_types::*;

    const IV: Intervals = Intervals {
        agent_heartbeat_ms: 1_000,
        restart_backoff_ms: 1_000,
        daemon_start_ms: 1_000,
        health_tick_ms: 250,
        incident_pass_ms: 250,
        task_start_ms: 30_000,
        webhook_ms: 33_500,
    };

    fn pool(mode: OwnershipMode, provider: Option<Provider>) -> Pool {
        Pool {
            name: PoolName::new("gpu").unwrap(),
            mode,
            strategy: PlacementStrategy::Binpack,
            compute_overcommit_percent: None,
            health_policy: HealthPolicy::default(),
            remediation_policy: Default::default(),
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

    /// Restart copies: at the first exit, the exit seen and restarted (daemonStartMs), reported
    /// (a heartbeat and a tick), the services' pass (a tick) and the start: 32.5 s; once
    /// confirmed, the two restarts before IMPAIRED (1 s + 2 s) instead: 34.5 s. A hang's copies
    /// wait for its confirmation under either policy; other kinds have none.
    #[test]
    fn restart_copies_are_bounded_from_the_first_exit_or_the_confirmation() {
        let mut p = pool(OwnershipMode::Managed, None);
        let at = |p: &Pool, kind| derive(p, &IV).of(kind).unwrap().copies_ms;
        assert_eq!(p.restart_copies, RestartCopies::FirstExit);
        assert_eq!(at(&p, FailureKind::DaemonExit), Some(1_000 + 1_250 + 250 + 30_000));
        let hang = at(&p, FailureKind::DaemonHang);
        assert_eq!(hang, Some(2 * 5_000 + 3_000 + 1_250 + 250 + 30_000));
        assert_eq!(at(&p, FailureKind::HostLost), None);
        p.restart_copies = RestartCopies::Confirmed;
        assert_eq!(at(&p, FailureKind::DaemonExit), Some(3_000 + 1_250 + 250 + 30_000));
        assert_eq!(at(&p, FailureKind::DaemonHang), hang);
        let b = derive(&p, &IV);
        assert_eq!(b.restart_copies, Some(RestartCopies::Confirmed));
        assert!(b.formulas.iter().any(|f| f.contains("restartCopies confirmed")), "{:?}", b.formulas);
    }

    /// The default policy's figures, worked by hand from the formulas.
    #[test]
    fn default_managed_pool() {
        let b = derive(&pool(OwnershipMode::Managed, Some(Provider::local(2))), &IV);
        let exit = b.of(FailureKind::DaemonExit).unwrap();
        // Restarts 1 and 2 (0s and 1s backoff, 1s each) + heartbeat 1s and a tick + toleration
        // 2s + a tick.
        assert_eq!(exit.detect_ms, 3_000 + 1_250 + 2_000 + 250);
        assert_eq!(exit.decide_ms, Some(500));
        assert_eq!(exit.replace_ms, Some(60_250));
        assert_eq!(exit.total_ms, Some(6_500 + 500 + 250 + 250 + 30_000));
        assert_eq!(exit.total_fenced_ms, Some(6_500 + 500 + 60_250 + 60_000 + 30_500));
        let hang = b.of(FailureKind::DaemonHang).unwrap();
        assert_eq!(hang.detect_ms, 2 * 5_000 + 3_000 + 1_250 + 2_000 + 250);
        assert_eq!(b.of(FailureKind::GpuCheckFail).unwrap().detect_ms, 3_500);
        assert_eq!(b.of(FailureKind::AgentLost).unwrap().detect_ms, 10_000 + 250 + 2_000 + 250);
        assert_eq!(b.of(FailureKind::HostLost).unwrap().detect_ms, 12_500);
        assert_eq!(b.inputs.launch_timeout_ms, Some(60_000));
        assert_eq!(b.owner, "mpsfleet");
        assert_eq!(b.kinds.len(), FailureKind::ALL.len());
    }

    /// A full pool recovers by preemption (the victims' stop in place of a launch), by a
    /// launch when its policy is `off`, and not at all without a provider.
    #[test]
    fn a_full_pool_is_bounded_by_the_victims_stop_or_the_launch() {
        let mut p = pool(OwnershipMode::Managed, Some(Provider::local(2)));
        let mut b = derive(&p, &IV);
        add_full_pool(&mut b, &p, &IV, 32_000);
        let exit = b.of(FailureKind::DaemonExit).unwrap();
        assert_eq!(exit.total_full_pool_ms, Some(6_500 + 500 + 32_000 + 250 + 250 + 30_000));
        let f = b.full_pool.clone().unwrap();
        assert_eq!((f.by.as_str(), f.victim_stop_ms), ("preemption", Some(32_000)));
        assert!(b.formulas.last().unwrap().contains("victim stop (32s"), "{:?}", b.formulas.last());
        p.preemption = mpsfleet_types::Preemption::Off;
        let mut b = derive(&p, &IV);
        add_full_pool(&mut b, &p, &IV, 32_000);
        let exit = b.of(FailureKind::DaemonExit).unwrap();
        assert_eq!(exit.total_full_pool_ms, Some(6_500 + 500 + 60_250 + 250 + 250 + 30_000));
        assert_eq!(b.full_pool.unwrap().by, "launch");
        p.provider = None;
        let mut b = derive(&p, &IV);
        add_full_pool(&mut b, &p, &IV, 32_000);
        assert_eq!(b.of(FailureKind::DaemonExit).unwrap().total_full_pool_ms, None);
        assert_eq!(b.full_pool.unwrap().by, "none");
    }

    #[test]
    fn the_probe_interval_moves_the_hang_bound_by_threshold_minus_one_intervals() {
        let mut p = pool(OwnershipMode::Managed, None);
        let before = derive(&p, &IV);
        p.health_policy.mps_probe_interval_ms += 1_000;
        let after = derive(&p, &IV);
        let d = |b: &RecoveryBounds, k| b.of(k).unwrap().detect_ms;
        assert_eq!(d(&after, FailureKind::DaemonHang) - d(&before, FailureKind::DaemonHang), 2 * 1_000);
        assert_eq!(d(&after, FailureKind::DaemonExit), d(&before, FailureKind::DaemonExit));
        // Without a provider nothing is replaced and fenced tasks have no bound.
        let exit = after.of(FailureKind::DaemonExit).unwrap();
        assert_eq!((exit.replace_ms, exit.total_fenced_ms), (None, None));
        assert!(exit.total_ms.is_some());
    }

    #[test]
    fn restarts_running_out_first_turn_the_check_impaired_sooner() {
        let mut p = pool(OwnershipMode::Managed, None);
        p.health_policy.local_daemon_restarts = 0;
        assert_eq!(derive(&p, &IV).of(FailureKind::DaemonExit).unwrap().detect_ms, 3_500);
        p.health_policy.local_daemon_restarts = 1;
        assert_eq!(derive(&p, &IV).of(FailureKind::DaemonExit).unwrap().detect_ms, 4_500);
    }

    #[test]
    fn a_self_managed_pool_states_detect_and_notify_only() {
        let b = derive(&pool(OwnershipMode::SelfManaged, Some(Provider::local(1))), &IV);
        assert_eq!(b.owner, "operator");
        for k in &b.kinds {
            assert!(k.detect_ms > 0 && k.notify_ms == 33_500);
            assert_eq!((k.decide_ms, k.replace_ms, k.total_ms, k.total_fenced_ms), (None, None, None, None));
        }
        assert!(b.formulas.iter().any(|f| f.contains("the operator's")));
        assert_eq!(check_max_resume(&b), Ok(()));
    }

    #[test]
    fn max_resume_refuses_a_policy_that_cannot_meet_it() {
        let mut p = pool(OwnershipMode::Managed, Some(Provider::local(1)));
        p.max_resume_seconds = Some(60);
        let err = check_max_resume(&derive(&p, &IV)).unwrap_err();
        assert!(err.contains("more than maxResumeSeconds (1m)"), "{err}");
        p.max_resume_seconds = Some(3_600);
        assert_eq!(check_max_resume(&derive(&p, &IV)), Ok(()));
        p.provider = None;
        p.max_resume_seconds = Some(60);
        assert_eq!(check_max_resume(&derive(&p, &IV)), Ok(()));
    }

    #[test]
    fn launch_timeouts_default_by_kind() {
        let mut p = pool(OwnershipMode::Managed, Some(Provider::exec("ec2", 1)));
        assert_eq!(launch_timeout_ms(&p), Some(600_000));
        p.provider.as_mut().unwrap().launch_timeout_seconds = Some(90);
        assert_eq!(launch_timeout_ms(&p), Some(90_000));
    }
}
