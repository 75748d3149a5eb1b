//! The intervals the server and its agents run on, as recovery bounds take them: one place
//! for the figures the remediation controller, the bounds and the simulator share.

use mpsfleet_core::bounds::Intervals;

/// How often an unresolved incident is planned again when nothing asked for it (the health
/// tick's period: its plan depends on heartbeat ages and on its pool's other hosts).
pub const INCIDENT_RESYNC_MS: u64 = 250;

/// The agent's heartbeat interval by default (`mpsfleet agent --heartbeat-ms`).
pub const AGENT_HEARTBEAT_MS: u64 = 1_000;
/// The longest heartbeat interval an agent's report is taken at (the longest grace).
pub(in crate::cluster) const MAX_HEARTBEAT_MS: u64 = 600_000;
/// A daemon's start, and a persistent fault seen again after it.
pub const DAEMON_START_MS: u64 = 1_000;
/// A replacement task's start to RUNNING and ready: its image present, its readiness check
/// passing. A task that takes longer is the task's own (`task-slow-to-start`).
pub const TASK_START_ALLOWANCE_MS: u64 = 30_000;

/// The intervals this server and its agents run on, as the bounds take them.
pub fn intervals() -> Intervals {
    let webhook = crate::events::WEBHOOK_TIMEOUT * crate::events::WEBHOOK_ATTEMPTS as u32
        + crate::events::WEBHOOK_BACKOFF[..crate::events::WEBHOOK_ATTEMPTS - 1]
            .iter()
            .sum::<std::time::Duration>();
    Intervals {
        agent_heartbeat_ms: AGENT_HEARTBEAT_MS,
        restart_backoff_ms: mpsfleet_core::lifecycle::mps::MpsPolicy::default().restart_backoff.as_millis()
            as u64,
        daemon_start_ms: DAEMON_START_MS,
        health_tick_ms: crate::HEALTH_INTERVAL.as_millis() as u64,
        incident_pass_ms: INCIDENT_RESYNC_MS,
        task_start_ms: TASK_START_ALLOWANCE_MS,
        webhook_ms: webhook.as_millis() as u64,
    }
}
