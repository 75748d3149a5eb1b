//! Recovery bounds on the server: each pool's, derived by `mpsfleet_core::bounds` from its
//! policy and the intervals this server runs on; the bounds an incident is held to when it
//! opens; and the judgement of every unresolved incident on each of its controller's passes,
//! which records a phase seen past its bound once, with its cause when the server can name
//! one, on the incident, in the pool's events and in the metrics.
//! The operations are `Cluster`'s, in `pools.rs` (an incident's own bounds are set where it
//! opens, `controllers/health.rs`); what they share is here.

use super::*;
use mpsfleet_core::bounds as core_bounds;
use mpsfleet_types::bounds::RecoveryBounds;

pub use super::intervals::{intervals, AGENT_HEARTBEAT_MS, DAEMON_START_MS, TASK_START_ALLOWANCE_MS};

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
