//! How `pool explain` prints a pool's responsibility record and its recovery bounds.

use super::*;
use mpsfleet_core::explain::Explanation;
use mpsfleet_types::bounds::RecoveryBounds;
use mpsfleet_types::policy::RestartCopies;

pub(super) fn print_explain(f: Format, e: &Explanation) {
    if f.is_data() {
        output::print(f, e, &[], vec![]);
        return;
    }
    println!(
        "pool {} ({}): host recovery is owned by {}\n",
        sanitize(&e.pool),
        sanitize(&e.mode),
        sanitize(&e.owner)
    );
    let rows = e
        .steps()
        .iter()
        .map(|(step, r)| vec![step.to_string(), r.who.clone(), r.what.clone()])
        .collect::<Vec<_>>();
    print!("{}", output::table(&["STEP", "WHO", "WHAT"], &rows));
    if let Some(m) = &e.measured_launches {
        println!("\nmeasured launches: {}", sanitize(m));
    }
    if let Some(s) = &e.scaling {
        println!("\nscaling ({}): {}", sanitize(&s.who), sanitize(&s.what));
        let last = e.last_scaling_decision.as_deref().unwrap_or("none yet");
        println!("last scaling decision: {}", sanitize(last));
    }
    print!("\n{}", bounds_words(&e.bounds));
}

/// The bounds as a table per failure kind, then the formulas and their inputs.
pub(crate) fn bounds_words(b: &RecoveryBounds) -> String {
    let s = |ms: Option<u64>| ms.map_or_else(|| "-".to_string(), mpsfleet_types::time::secs);
    let rows: Vec<Vec<String>> = b
        .kinds
        .iter()
        .map(|k| {
            vec![
                k.kind.as_str().into(),
                s(Some(k.detect_ms)),
                s(Some(k.notify_ms)),
                s(k.decide_ms),
                s(k.replace_ms),
                s(k.total_ms),
                s(k.total_fenced_ms),
                s(k.total_full_pool_ms),
                s(k.copies_ms),
            ]
        })
        .collect();
    let mut out = String::from("recovery bounds (worst case from the policy; '-': ");
    out.push_str(if b.owner == "operator" {
        "the operator's, in a self-managed pool)\n"
    } else {
        "nothing to bound: no provider)\n"
    });
    out.push_str(&output::table(
        &[
            "FAILURE",
            "DETECT",
            "NOTIFY",
            "DECIDE",
            "REPLACE",
            "TOTAL (RESTART)",
            "TOTAL (FENCED)",
            "TOTAL (FULL POOL)",
            "COPIES (RESTART)",
        ],
        &rows,
    ));
    if let Some(c) = b.restart_copies {
        let when = match c {
            RestartCopies::FirstExit => "at an MPS daemon's first exit, while local repair goes on",
            RestartCopies::Confirmed => "once an MPS daemon's failure is confirmed",
        };
        out.push_str(&format!(
            "restart copies (restartCopies {}): a restart service's replicas on a failed daemon get copies elsewhere {when}; \
             the extras stop, newest first, once the daemon answers again\n",
            c.as_str()
        ));
    }
    if let Some(f) = &b.full_pool {
        let how = match (f.by.as_str(), f.victim_stop_ms) {
            ("preemption", Some(ms)) => format!(
                "by preemption: lower-priority tasks stop to make room, at most {} (their deregistration delay + stopTimeout)",
                mpsfleet_types::time::secs(ms)
            ),
            ("launch", _) => "by a launched host (no preemption)".to_string(),
            _ => "nothing makes room: the replicas wait for capacity".to_string(),
        };
        out.push_str(&format!("full pool (preemption {}): {how}\n", f.preemption.as_str()));
    }
    if let Some(max) = b.max_resume_ms {
        out.push_str(&format!("maxResumeSeconds: {}\n", mpsfleet_types::time::secs(max)));
    }
    out.push_str("\nhow:\n");
    for f in &b.formulas {
        out.push_str(&format!("  {f}\n"));
    }
    let i = &b.inputs;
    let iv = &i.intervals;
    let launch = i.launch_timeout_ms.map_or_else(|| "none (no provider)".into(), |ms| format!("{ms}"));
    out.push_str(&format!(
        "inputs (ms): mpsProbeIntervalMs {}, mpsProbeTimeoutMs {}, mpsFailureThreshold {}, \
         localDaemonRestarts {}, tolerationMs {}, agentHeartbeatGraceMs {}, launchTimeoutMs {launch}, \
         agentHeartbeatMs {}, restartBackoffMs {}, daemonStartMs {}, healthTickMs {}, incidentPassMs {}, \
         taskStartMs {}, webhookMs {}\n",
        i.mps_probe_interval_ms,
        i.mps_probe_timeout_ms,
        i.mps_failure_threshold,
        i.local_daemon_restarts,
        i.toleration_ms,
        i.agent_heartbeat_grace_ms,
        iv.agent_heartbeat_ms,
        iv.restart_backoff_ms,
        iv.daemon_start_ms,
        iv.health_tick_ms,
        iv.incident_pass_ms,
        iv.task_start_ms,
        iv.webhook_ms
    ));
    out
}
