//! The `CONTAINER_RUNTIME` check (ECS's name): Docker Engine answering a ping within a timeout.
//! A hung or stopped engine impairs the host as a hung MPS daemon does: after `threshold`
//! consecutive failed pings the check turns IMPAIRED; one answer makes it OK again.
//!
//! [`RuntimeCheck`] is the pure part; [`watch`] pings on an interval and keeps the check that
//! the heartbeat reports.

use crate::docker::DockerRuntime;
use mpsfleet_core::backoff::Backoff;
use mpsfleet_core::clock::Clock;
use mpsfleet_types::{HealthStatus, HostCheck};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const CHECK: &str = "CONTAINER_RUNTIME";

/// How the engine is pinged: every `interval`, each ping failing after `timeout`, IMPAIRED after
/// `threshold` failures in a row. ECS's daemon checks use a 3 s timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingPolicy {
    pub interval: Duration,
    pub timeout: Duration,
    pub threshold: u32,
}

impl Default for PingPolicy {
    fn default() -> Self {
        PingPolicy { interval: Duration::from_secs(5), timeout: Duration::from_secs(3), threshold: 3 }
    }
}

/// The check's state from the pings seen so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCheck {
    check: HostCheck,
    failures: u32,
    threshold: u32,
}

impl RuntimeCheck {
    /// INITIALIZING until the first ping answers or fails.
    pub fn new(threshold: u32, now_ms: u64) -> RuntimeCheck {
        RuntimeCheck {
            check: HostCheck {
                name: CHECK.into(),
                gpu_id: None,
                status: HealthStatus::Initializing,
                reason: "Docker Engine not pinged yet".into(),
                since_ms: now_ms,
                restarts: 0,
                first_failure_age_ms: None,
                repair_ages_ms: Vec::new(),
            },
            failures: 0,
            threshold: threshold.max(1),
        }
    }

    /// Takes one ping's result: the engine's version, or why it failed.
    pub fn observe(&mut self, result: Result<String, String>, now_ms: u64) {
        let (status, reason) = match result {
            Ok(version) => {
                self.failures = 0;
                (HealthStatus::Ok, format!("Docker Engine {version} answers"))
            }
            Err(why) => {
                self.failures += 1;
                let status = if self.failures >= self.threshold {
                    HealthStatus::Impaired
                } else if self.check.status == HealthStatus::Initializing {
                    HealthStatus::Initializing
                } else {
                    self.check.status
                };
                (status, format!("Docker Engine failed {} ping(s) in a row: {why}", self.failures))
            }
        };
        if status != self.check.status {
            self.check.since_ms = now_ms;
        }
        self.check.status = status;
        self.check.reason = reason;
    }

    pub fn check(&self) -> &HostCheck {
        &self.check
    }
}

/// The check as the heartbeat reads it.
pub type SharedCheck = Arc<Mutex<RuntimeCheck>>;

/// Pings the engine forever, on a blocking thread each time so that a hung engine never holds
/// up the runtime's workers; a ping that overruns its timeout counts as failed.
pub async fn watch(rt: DockerRuntime, policy: PingPolicy, check: SharedCheck, clock: Arc<dyn Clock>) {
    // A failing engine is logged at most every minute, not on every ping.
    let mut quiet = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
    let mut logged_at: Option<u64> = None;
    loop {
        let rt2 = rt.clone();
        let timeout = policy.timeout;
        let ping = tokio::task::spawn_blocking(move || rt2.ping(timeout));
        let result = match tokio::time::timeout(timeout + Duration::from_millis(500), ping).await {
            Ok(Ok(Ok(version))) => Ok(version),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(e)) => Err(format!("the ping failed: {e}")),
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        };
        let now = clock.now_ms();
        if let Err(why) = &result {
            if logged_at.is_none_or(|at| now.saturating_sub(at) >= quiet.peek().as_millis() as u64) {
                tracing::warn!(error = %why, "Docker Engine does not answer");
                logged_at = Some(now);
            }
        } else {
            quiet.reset();
            logged_at = None;
        }
        if let Ok(mut c) = check.lock() {
            c.observe(result, now);
        }
        tokio::time::sleep(policy.interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impaired_after_the_threshold_and_ok_after_one_answer() {
        let mut c = RuntimeCheck::new(3, 0);
        assert_eq!(c.check().status, HealthStatus::Initializing);
        c.observe(Ok("20.10.24".into()), 10);
        assert_eq!((c.check().status, c.check().since_ms), (HealthStatus::Ok, 10));
        c.observe(Err("timed out".into()), 20);
        c.observe(Err("timed out".into()), 30);
        assert_eq!(c.check().status, HealthStatus::Ok, "two failures are tolerated");
        assert!(c.check().reason.contains("2 ping(s)"), "{}", c.check().reason);
        c.observe(Err("timed out".into()), 40);
        assert_eq!((c.check().status, c.check().since_ms), (HealthStatus::Impaired, 40));
        assert_eq!(c.check().name, "CONTAINER_RUNTIME");
        c.observe(Err("timed out".into()), 50);
        assert_eq!(c.check().since_ms, 40, "still impaired since the third failure");
        c.observe(Ok("20.10.24".into()), 60);
        assert_eq!((c.check().status, c.check().since_ms), (HealthStatus::Ok, 60));
        assert!(c.check().reason.contains("20.10.24"));
    }

    #[test]
    fn an_engine_that_never_answered_stays_initializing_until_the_threshold() {
        let mut c = RuntimeCheck::new(2, 0);
        c.observe(Err("connection refused".into()), 1);
        assert_eq!(c.check().status, HealthStatus::Initializing);
        c.observe(Err("connection refused".into()), 2);
        assert_eq!(c.check().status, HealthStatus::Impaired);
    }
}
