//! Priorities and preemption's vocabulary: a task's or service's `priority` (1 to 100, 50 by
//! default, as Nomad's job priority), the gap a victim must be below its preemptor, and a
//! pool's `preemption` policy. What preemption does is `mpsfleet_core::scheduler::preempt`'s
//! and the placement controller's (docs/pools.md "Priorities and preemption").

use serde::{Deserialize, Serialize};

/// The priority of a task or service that names none.
pub const DEFAULT_PRIORITY: u8 = 50;
/// The lowest priority.
pub const MIN_PRIORITY: u8 = 1;
/// The highest priority.
pub const MAX_PRIORITY: u8 = 100;
/// A task may only preempt tasks at least this far below its own priority: equals and near
/// equals never displace each other, so two services cannot take turns evicting each other.
pub const PREEMPTION_GAP: u8 = 10;
/// A service's replica placed after one of the service's replicas was preempted is not
/// preempted itself during this long after its placement: the replacement of a victim gets
/// time to work before it can be a victim again.
pub const PREEMPTION_BACKOFF_MS: u64 = 60_000;

/// The ECS tag that carries a priority on CreateService, RunTask or a task definition.
pub const PRIORITY_TAG: &str = "mpsfleet:priority";

pub fn default_priority() -> u8 {
    DEFAULT_PRIORITY
}

/// `value` as a priority, or an error naming `field` and the range.
pub fn check_priority(field: &str, value: u32) -> Result<u8, String> {
    if (u32::from(MIN_PRIORITY)..=u32::from(MAX_PRIORITY)).contains(&value) {
        Ok(value as u8)
    } else {
        Err(format!("{field} must be from {MIN_PRIORITY} to {MAX_PRIORITY} (got {value})"))
    }
}

/// A tag's priority text (`mpsfleet:priority`), or an error naming the tag and the range.
pub fn parse_priority_tag(value: &str) -> Result<u8, String> {
    let n: u32 = value.trim().parse().map_err(|_| {
        format!(
            "tag {PRIORITY_TAG} must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} (got {value:?})"
        )
    })?;
    check_priority(&format!("tag {PRIORITY_TAG}"), n)
}

/// The band a priority falls in, for metrics labels: `low` (1-29), `normal` (30-69), `high`
/// (70-100).
pub fn priority_band(p: u8) -> &'static str {
    match p {
        0..=29 => "low",
        30..=69 => "normal",
        _ => "high",
    }
}

/// Which placements of a pool may preempt lower-priority tasks when nothing fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Preemption {
    /// Nothing preempts: a task that finds no room waits for capacity.
    Off,
    /// Only a service replica that replaces one lost to a host's or MPS daemon's failure (a
    /// restart copy, an incident's move) preempts; the default (docs/pools.md).
    #[default]
    Recovery,
    /// Every placement that finds no room may preempt.
    All,
}

impl Preemption {
    pub fn as_str(self) -> &'static str {
        match self {
            Preemption::Off => "off",
            Preemption::Recovery => "recovery",
            Preemption::All => "all",
        }
    }

    pub fn parse(s: &str) -> Option<Preemption> {
        match s {
            "off" => Some(Preemption::Off),
            "recovery" => Some(Preemption::Recovery),
            "all" => Some(Preemption::All),
            _ => None,
        }
    }

    /// Whether a task may preempt under this policy; `recovery`: the task replaces a replica
    /// lost to a failure.
    pub fn allows(self, recovery: bool) -> bool {
        match self {
            Preemption::Off => false,
            Preemption::Recovery => recovery,
            Preemption::All => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_outside_the_range_are_refused_naming_the_field() {
        assert_eq!(check_priority("priority", 1), Ok(1));
        assert_eq!(check_priority("priority", 100), Ok(100));
        let e = check_priority("priority", 0).unwrap_err();
        assert!(e.contains("priority must be from 1 to 100"), "{e}");
        assert!(check_priority("priority", 101).is_err());
        assert_eq!(parse_priority_tag(" 90 "), Ok(90));
        let e = parse_priority_tag("high").unwrap_err();
        assert!(e.contains("mpsfleet:priority"), "{e}");
        assert!(parse_priority_tag("400").unwrap_err().contains("mpsfleet:priority"));
    }

    #[test]
    fn the_policy_says_who_may_preempt() {
        assert!(!Preemption::Off.allows(true));
        assert!(Preemption::Recovery.allows(true));
        assert!(!Preemption::Recovery.allows(false));
        assert!(Preemption::All.allows(false));
        assert_eq!(Preemption::default(), Preemption::Recovery);
        for p in [Preemption::Off, Preemption::Recovery, Preemption::All] {
            assert_eq!(Preemption::parse(p.as_str()), Some(p));
        }
    }
}
