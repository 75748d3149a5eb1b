//! Deliberate bugs, for the tests that show the nemesis checker can fail (crates/mpsfleet/
//! tests/nemesis.rs): each makes the server break one promise of docs/ha.md while it keeps
//! answering as if it kept it. The server refuses the switch outside debug builds and without
//! `MPSFLEET_ALLOW_BROKEN=1` (`mpsfleet server --broken-for-tests`).

use mpsfleet_types::{Task, TaskStatus};
use std::str::FromStr;

/// Which promise to break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// The leader stops applying commits to the task list it answers from: its reads show the
    /// tasks as they were when the switch turned on, while its writes are still committed and
    /// acknowledged (and its revision header still moves).
    StaleReads,
    /// StopTask is acknowledged with the task shown desired STOPPED, and never committed.
    LostStops,
}

impl FromStr for Broken {
    type Err = String;

    fn from_str(s: &str) -> Result<Broken, String> {
        match s {
            "stale-reads" => Ok(Broken::StaleReads),
            "lost-stops" => Ok(Broken::LostStops),
            _ => Err(format!("must be stale-reads or lost-stops, got {s:?}")),
        }
    }
}

/// A switch turned on, with what it keeps.
#[derive(Debug, Default)]
pub(super) enum Switch {
    #[default]
    Off,
    /// The task list frozen when the switch turned on, in creation order.
    StaleReads(Vec<Task>),
    LostStops,
}

impl Switch {
    /// The frozen task list `filter` would show, while reads are stale. Only the filters the
    /// nemesis uses are honoured (`live`, `skip`, `limit`, creation order).
    pub(super) fn stale_tasks(&self, filter: &crate::cluster::TaskFilter) -> Option<Vec<Task>> {
        let Switch::StaleReads(frozen) = self else { return None };
        let shown = frozen.iter().filter(|t| !filter.live || t.last_status != TaskStatus::Stopped);
        Some(shown.skip(filter.skip).take(filter.limit).cloned().collect())
    }
}
