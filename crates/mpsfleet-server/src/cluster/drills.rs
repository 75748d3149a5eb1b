//! Drills (docs/drills.md): a real fault injected through the agents of chosen hosts, handled
//! by the pool's owner exactly as a real failure, and measured against the pool's bounds.
//! The operations are `Cluster`'s, in `incidents.rs`; what they share is here.
//!
//! `start_drill` checks the safety conditions (the cluster-wide switch, no incident open in
//! the pool, never its last healthy host, within the storm breaker's budget, agents that
//! accept injected faults), picks the targets and commits the drill RUNNING; a dry run stops
//! before the commit and answers the targets and the expected timeline. From then on the
//! drill controller (`Work::Drill`) passes over it: the faults it asks for go out in the
//! targets' heartbeat answers while it runs ([`Cluster::faults_for`]), and the controller
//! (`controllers/drills.rs`) follows it to its verdict. The lifecycle is
//! `mpsfleet_core::lifecycle::drill`.

use super::controllers::drills::SELF_MANAGED_HOLD_MS;
use mpsfleet_types::bounds::KindBounds;
use mpsfleet_types::drill::*;

/// Drills kept; the oldest ended ones leave when a new one starts.
pub const MAX_DRILLS: usize = 100;
/// Beyond the bound it measures, how long a drill waits for the owner before it takes the
/// fault back.
pub const DRILL_SLACK_MS: u64 = 60_000;
pub(super) const SWITCH_KEY: &str = "cluster";

/// What `POST /v1/drills` did.
#[derive(Debug, Clone)]
pub enum DrillStarted {
    /// A dry run: what it would strike and expect.
    Plan(Box<DrillPlan>),
    Started(Box<Drill>),
}

/// `hosts`: a count (`2`) or a share (`25%`, rounded up) of the pool's `total` ACTIVE hosts.
pub(super) fn parse_count(s: &str, total: usize) -> Result<usize, String> {
    let bad = || format!("must be a count of hosts (1 or more) or a percentage (1% to 100%), got {s:?}");
    let n = match s.strip_suffix('%') {
        Some(p) => {
            let p: usize = p.parse().map_err(|_| bad())?;
            if !(1..=100).contains(&p) {
                return Err(bad());
            }
            (total * p).div_ceil(100).max(1)
        }
        None => s.parse().map_err(|_| bad())?,
    };
    if n == 0 {
        return Err(bad());
    }
    Ok(n)
}

/// How long a drill waits for the owner, from its start: the bound it measures and slack.
pub(super) fn drill_time(b: &KindBounds, owner: &str, once: bool) -> u64 {
    let measured = if once || owner == "operator" {
        b.detect_ms + b.notify_ms
    } else {
        b.total_fenced_ms.or(b.total_ms).unwrap_or(b.detect_ms + b.decide_ms.unwrap_or(0))
            + b.replace_ms.unwrap_or(0)
    };
    measured + DRILL_SLACK_MS
}

/// The timeline the bounds promise, in words, each step with its latest time.
pub(super) fn expected_timeline(b: &KindBounds, owner: &str, fault: DrillFault, once: bool) -> Vec<String> {
    let s = mpsfleet_types::time::secs;
    let mut v = vec![format!("+0.0s  {} injected by the targets' agents", fault.as_str())];
    if once {
        v.push(
            "the agent restarts the daemon itself; no incident is expected unless local repair fails".into(),
        );
    }
    v.push(format!(
        "{}  detected: the incident opens (the check IMPAIRED for the toleration)",
        s(b.detect_ms)
    ));
    v.push(format!("{}  notified: the incident's event delivered", s(b.detect_ms + b.notify_ms)));
    if owner == "operator" {
        v.push(format!(
            "the operator decides and acts (not the drill's to do): the drill takes the fault back {} after \
             the notification and the host returns as it was",
            s(SELF_MANAGED_HOLD_MS)
        ));
        return v;
    }
    if let Some(d) = b.decide_ms {
        v.push(format!("{}  decided: mpsfleet cordons and drains the host", s(b.detect_ms + d)));
    }
    if let Some(t) = b.total_ms {
        v.push(format!("{}  resumed: restart-mode service tasks running again elsewhere", s(t)));
    }
    if let (Some(d), Some(r)) = (b.decide_ms, b.replace_ms) {
        v.push(format!("{}  replacement host ready", s(b.detect_ms + d + r)));
    }
    if let Some(t) = b.total_fenced_ms {
        v.push(format!(
            "{}  resumed: fenced service tasks running again, once the old host is terminated",
            s(t)
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::parse_count;

    #[test]
    fn host_counts_and_shares() {
        assert_eq!(parse_count("2", 10), Ok(2));
        assert_eq!(parse_count("25%", 10), Ok(3));
        assert_eq!(parse_count("1%", 3), Ok(1));
        for bad in ["0", "-1", "x", "0%", "101%", "%", "1.5"] {
            assert!(parse_count(bad, 10).unwrap_err().contains("must be a count"), "{bad}");
        }
    }
}
