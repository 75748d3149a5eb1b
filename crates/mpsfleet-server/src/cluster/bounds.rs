//! Recovery bounds on the server: each pool's, derived by `mpsfleet_core::bounds` from its
//! policy and the intervals this server runs on; the bounds an incident is held to when it
//! opens; and the judgement of every unresolved incident on each of its controller's passes,
//! which records a phase seen past its bound once, with its cause when the server can name
//! one, on the incident, in the pool's events and in the metrics.

use super::*;
use mpsfleet_core::bounds::{self as core_bounds, Intervals};
use mpsfleet_types::bounds::{
    BoundBreach, BreachCause, FailureKind, IncidentBounds, RecoveryBounds, RecoveryPhase,
};

/// The agent's heartbeat interval by default (`mpsfleet agent --heartbeat-ms`).
pub const AGENT_HEARTBEAT_MS: u64 = 1_000;
/// The longest heartbeat interval an agent's report is taken at (the longest grace).
pub(super) const MAX_HEARTBEAT_MS: u64 = 600_000;
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
        incident_pass_ms: super::controllers::remediation::INCIDENT_RESYNC_MS,
        task_start_ms: TASK_START_ALLOWANCE_MS,
        webhook_ms: webhook.as_millis() as u64,
    }
}

/// Why `pool`'s policy is refused for `maxResumeSeconds`, if it is.
pub(super) fn check_max_resume(pool: &Pool) -> Result<(), Error> {
    if pool.max_resume_seconds.is_some_and(|s| !(1..=86_400).contains(&s)) {
        return Err(Error::invalid(
            "maxResumeSeconds",
            format!("must be between 1 and 86400, got {}", pool.max_resume_seconds.unwrap_or(0)),
        ));
    }
    let bounds = core_bounds::derive(pool, &intervals());
    core_bounds::check_max_resume(&bounds).map_err(|why| Error::invalid("maxResumeSeconds", why))
}

/// What changed between two pools' bounds, in words; None when nothing did.
pub(super) fn bounds_change(before: &RecoveryBounds, after: &RecoveryBounds) -> Option<String> {
    let mut changed = Vec::new();
    for (b, a) in before.kinds.iter().zip(&after.kinds) {
        let fig = |k: &mpsfleet_types::KindBounds| {
            [
                ("detect", Some(k.detect_ms)),
                ("decide", k.decide_ms),
                ("replace", k.replace_ms),
                ("total", k.total_ms),
            ]
        };
        for ((name, x), (_, y)) in fig(b).into_iter().zip(fig(a)) {
            if x != y {
                let s = |v: Option<u64>| v.map_or_else(|| "none".to_string(), mpsfleet_types::time::secs);
                changed.push(format!("{} {name} {} -> {}", b.kind, s(x), s(y)));
            }
        }
    }
    (!changed.is_empty() || before.max_resume_ms != after.max_resume_ms).then(|| {
        let max = |m: Option<u64>| m.map_or_else(|| "none".to_string(), mpsfleet_types::time::secs);
        let mut words = changed.join(", ");
        if before.max_resume_ms != after.max_resume_ms {
            if !words.is_empty() {
                words.push_str("; ");
            }
            words.push_str(&format!(
                "maxResumeSeconds {} -> {}",
                max(before.max_resume_ms),
                max(after.max_resume_ms)
            ));
        }
        words
    })
}

impl Cluster {
    /// The pool's bounds as `pool explain` shows them.
    pub fn pool_bounds(&self, name: &str) -> Result<RecoveryBounds, Error> {
        Ok(core_bounds::derive(&self.pool(name)?, &intervals()))
    }

    /// The bounds an incident on host `ix` with `trigger` is held to: its kind's row of the
    /// pool's bounds, with the fenced total when any service task on the host is fenced.
    pub(super) fn incident_bounds(
        &self,
        pool: &Pool,
        ix: HostIx,
        trigger: &Trigger,
    ) -> Option<IncidentBounds> {
        let kind = FailureKind::of_trigger(&trigger.check, &trigger.reason);
        // An agent that heartbeats less often than the default waits longer to report.
        let reported = self.state.hosts()[ix as usize].heartbeat_ms.unwrap_or(0).min(MAX_HEARTBEAT_MS);
        let iv = Intervals { agent_heartbeat_ms: reported.max(AGENT_HEARTBEAT_MS), ..intervals() };
        let bounds = core_bounds::derive(pool, &iv);
        let fenced = self.state.tasks().on_host(ix).iter().any(|id| {
            self.state
                .tasks()
                .get(id)
                .and_then(|e| e.task.group.as_ref())
                .and_then(|s| self.state.services().get(s))
                .is_some_and(|s| s.value.resumption == ResumptionBoundary::Fenced)
        });
        bounds.of(kind).map(|k| IncidentBounds::of(k, fenced))
    }
}

impl super::write::Writer<'_> {
    /// Records the phases of incident `id` that have run past their bound since the last
    /// pass: on the incident (committed with it), in its pool's events and the metrics.
    pub(in crate::cluster) fn judge_incident(&mut self, id: &str) -> Result<(), Error> {
        let now = self.now_ms;
        let Some(incident) = self.state.incidents().get(id).map(|v| &v.value) else { return Ok(()) };
        let found = incident.new_breaches(now);
        if found.is_empty() {
            return Ok(());
        }
        let mut incident = incident.clone();
        let mut words = Vec::new();
        for (phase, measured_ms, bound_ms) in found {
            let cause = self.reader().breach_cause(&incident, phase);
            let breach = BoundBreach { phase, at_ms: now, bound_ms, measured_ms, cause };
            let detail = format!("recovery bound breached: {}", breach.words());
            incident.push(now, Step::BoundBreached, detail, None);
            words.push(breach.words());
            incident.breaches.push(breach);
        }
        let pool = incident.pool.clone();
        let message = format!("incident {} on host {}: {}", incident.id, incident.host_id, words.join("; "));
        tracing::warn!(incident.id = %incident.id, pool = %pool, "{message}");
        self.write_incident(incident)?;
        self.pool_event(&pool, "RecoveryBoundBreached", message)
    }
}

impl super::read::Reader<'_> {
    /// Why `phase` of `incident` ran long, when the record or the world says.
    pub(in crate::cluster) fn breach_cause(
        &self,
        incident: &Incident,
        phase: RecoveryPhase,
    ) -> Option<BreachCause> {
        let t = incident.timing();
        let began = match phase {
            RecoveryPhase::Detect | RecoveryPhase::Total => t.first_failure_at_ms.or(t.detected_at_ms),
            RecoveryPhase::Decide => t.detected_at_ms,
            RecoveryPhase::Replace => t.decided_at_ms,
        };
        if began.is_some_and(|b| b < self.loaded_at_ms) {
            return Some(BreachCause::ControlPlaneRestart);
        }
        if incident.has(Step::Blocked) && phase != RecoveryPhase::Detect {
            let provider =
                incident.timeline.iter().any(|e| e.step == Step::Blocked && e.detail.contains("provider"));
            return Some(if provider { BreachCause::ProviderSlow } else { BreachCause::BreakerOpen });
        }
        match phase {
            RecoveryPhase::Detect => self.slower_failure(incident),
            RecoveryPhase::Decide => None,
            // A launch not joined within its timeout counts as failed: the provider's.
            RecoveryPhase::Replace => Some(BreachCause::ProviderSlow),
            RecoveryPhase::Total => {
                let replacements: Vec<&Task> = incident
                    .affected_tasks
                    .iter()
                    .filter_map(|a| a.replacement.and_then(|r| self.state.tasks().get(&r)).map(|e| &e.task))
                    .collect();
                let waiting =
                    incident.affected_tasks.iter().any(|a| a.service.is_some() && a.replacement.is_none());
                if replacements.iter().any(|t| t.host_id.is_none() && t.last_status != TaskStatus::Stopped) {
                    Some(BreachCause::NoCapacity)
                } else if waiting && incident.has(Step::ProviderRetry) {
                    Some(BreachCause::ProviderSlow)
                } else if !replacements.is_empty() && replacements.iter().all(|t| t.host_id.is_some()) {
                    Some(BreachCause::TaskSlowToStart)
                } else {
                    None
                }
            }
        }
    }

    /// A daemon whose local restarts came further apart than the `daemon-exit` bound counts
    /// (each restart killed again at once, the n-th after (n-1) x restartBackoffMs and its
    /// start): the failure, not the server, took the time.
    fn slower_failure(&self, incident: &Incident) -> Option<BreachCause> {
        if incident.bounds?.kind != mpsfleet_types::bounds::FailureKind::DaemonExit {
            return None;
        }
        let first = incident.trigger.first_failure_at_ms?;
        let last = *incident.trigger.local_repairs_at_ms.last()?;
        let h = &self.state.pools().get(&incident.pool)?.value.health_policy;
        let iv = intervals();
        let exits = h.mps_failure_threshold.min(h.local_daemon_restarts + 1);
        let assumed: u64 =
            (1..u64::from(exits)).map(|n| (n - 1) * iv.restart_backoff_ms + iv.daemon_start_ms).sum();
        (last.saturating_sub(first) > assumed).then_some(BreachCause::SlowerFailure)
    }
}
