//! The preemption invariants, as pure functions over the preemptions a run has seen
//! (docs/sim.md, invariants 9 to 11):
//!
//! - `no-preemption-cycle`: once a task of service A preempted a task of service B, no task
//!   of B ever preempts a task of A;
//! - `preempted-within-backoff`: a replica placed after one of its service's replicas was
//!   preempted is not preempted itself within [`PREEMPTION_BACKOFF_MS`] of its placement;
//! - `preemption-gap`: a victim is at least [`PREEMPTION_GAP`] below its preemptor.
//!
//! A preemption is learnt from the victim's task record in the change feed, the way the
//! simulator learns every other change of the server: the record that first carries stop
//! code `Preempted` (as a planned stop, `draining`, or as the stop itself) and the reason
//! naming the preemptor ("… for task t-… (priority P), this task's priority being Q"). The
//! preemptor's service and priority come from its own record.

use mpsfleet_types::priority::{PREEMPTION_BACKOFF_MS, PREEMPTION_GAP};
use mpsfleet_types::{StopCode, Task, TaskId, TaskStatus};
use std::collections::{BTreeMap, BTreeSet};

/// One preemption as the records tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    /// When the server chose the victim (the feed carried its stop).
    pub at_ms: u64,
    pub victim: TaskId,
    /// The victim's service, or `task t-…` for a task run on its own.
    pub victim_owner: String,
    pub victim_priority: u8,
    /// When the victim was placed (None for a record that does not say).
    pub victim_placed_at_ms: Option<u64>,
    pub preemptor: TaskId,
    pub preemptor_owner: String,
    pub preemptor_priority: u8,
}

/// What a victim's record says of its preemption: the preemptor named in its reason, and
/// the two priorities the reason gives (preemptor's, victim's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named {
    pub preemptor: TaskId,
    pub preemptor_priority: u8,
    pub victim_priority: u8,
}

/// Whether `t` is a preemption's victim: its stop, planned or done, carries `Preempted`.
/// Returns the reason that names the preemptor.
pub fn victim_reason(t: &Task) -> Option<&str> {
    if let Some(d) = t.draining.as_ref().filter(|d| d.stop_code == StopCode::Preempted) {
        return Some(&d.reason);
    }
    let stopping = t.desired_status == TaskStatus::Stopped || t.last_status == TaskStatus::Stopped;
    (stopping && t.stop_code == Some(StopCode::Preempted)).then(|| t.stopped_reason.as_deref().unwrap_or(""))
}

/// Reads "… for task t-… (priority P), this task's priority being Q" (the server's words,
/// `controllers/preemption.rs`); None when the reason does not name a preemptor so.
pub fn parse_reason(reason: &str) -> Option<Named> {
    let (_, rest) = reason.split_once("for task ")?;
    let (id, rest) = rest.split_once(" (priority ")?;
    let (p, rest) = rest.split_once(')')?;
    let (_, q) = rest.split_once("priority being ")?;
    let q: String = q.chars().take_while(char::is_ascii_digit).collect();
    Some(Named {
        preemptor: TaskId::parse(id.trim()).ok()?,
        preemptor_priority: p.trim().parse().ok()?,
        victim_priority: q.parse().ok()?,
    })
}

/// Who a task belongs to, for the cycle check: its service, or the task itself.
pub fn owner(t: &Task) -> String {
    t.group.as_ref().map_or_else(|| format!("task {}", t.id), |g| g.to_string())
}

/// The preemptions seen so far, and what the invariants remember of them.
#[derive(Debug, Default)]
pub struct History {
    /// Victims already counted (a victim's record passes through the feed more than once).
    seen: BTreeSet<TaskId>,
    /// (preemptor's owner, victim's owner) of every preemption so far.
    pairs: BTreeSet<(String, String)>,
    /// When each owner's tasks were first preempted.
    first: BTreeMap<String, u64>,
    /// Every preemption, in the order seen.
    pub all: Vec<Preemption>,
}

impl History {
    /// Whether `victim`'s preemption was counted already.
    pub fn seen(&self, victim: &TaskId) -> bool {
        self.seen.contains(victim)
    }

    /// Adds one preemption and checks it against the invariants and what came before it;
    /// the first broken one, by name, with what was wrong. It is remembered either way.
    pub fn add(&mut self, p: Preemption) -> Option<(&'static str, String)> {
        if !self.seen.insert(p.victim) {
            return None;
        }
        let broken = self.check(&p);
        self.pairs.insert((p.preemptor_owner.clone(), p.victim_owner.clone()));
        self.first.entry(p.victim_owner.clone()).or_insert(p.at_ms);
        self.all.push(p);
        broken
    }

    fn check(&self, p: &Preemption) -> Option<(&'static str, String)> {
        let words = format!(
            "{} ({}, priority {}) preempted {} ({}, priority {})",
            p.preemptor, p.preemptor_owner, p.preemptor_priority, p.victim, p.victim_owner, p.victim_priority
        );
        if u16::from(p.victim_priority) + u16::from(PREEMPTION_GAP) > u16::from(p.preemptor_priority) {
            return Some(("preemption-gap", format!("{words}: less than {PREEMPTION_GAP} below it")));
        }
        if self.pairs.contains(&(p.victim_owner.clone(), p.preemptor_owner.clone())) {
            return Some((
                "no-preemption-cycle",
                format!(
                    "{words}, after a task of {} had preempted one of {}",
                    p.victim_owner, p.preemptor_owner
                ),
            ));
        }
        // Shielded: placed at or after an earlier preemption of its service, and not yet
        // the backoff past its placement.
        let first = self.first.get(&p.victim_owner).copied().filter(|&f| f < p.at_ms);
        if let (Some(first), Some(placed)) = (first, p.victim_placed_at_ms) {
            if placed >= first && p.at_ms.saturating_sub(placed) < PREEMPTION_BACKOFF_MS {
                return Some((
                    "preempted-within-backoff",
                    format!(
                        "{words} {} ms after its placement, which came after {}'s first preemption at {} ms: shielded for {PREEMPTION_BACKOFF_MS} ms",
                        p.at_ms - placed,
                        p.victim_owner,
                        first
                    ),
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{Draining, Family, PoolName, ServiceName, TaskDefRef};

    /// A preemption at `at_s`: the victim (id, owner, priority, placed at), its preemptor
    /// (id, owner, priority).
    fn p(at_s: u64, victim: (u64, &str, u8, u64), by: (u64, &str, u8)) -> Preemption {
        Preemption {
            at_ms: at_s * 1000,
            victim: TaskId(victim.0),
            victim_owner: victim.1.into(),
            victim_priority: victim.2,
            victim_placed_at_ms: Some(victim.3 * 1000),
            preemptor: TaskId(by.0),
            preemptor_owner: by.1.into(),
            preemptor_priority: by.2,
        }
    }

    fn broken(h: &mut History, x: Preemption) -> Option<&'static str> {
        h.add(x).map(|(name, _)| name)
    }

    /// A history where B's task preempts A's after A's preempted B's breaks the cycle
    /// invariant (the priorities are made to allow both, as a priority changed in between
    /// would); other pairs do not.
    #[test]
    fn a_preemption_back_breaks_no_preemption_cycle() {
        let mut h = History::default();
        assert_eq!(broken(&mut h, p(100, (1, "b", 10, 0), (2, "a", 90))), None);
        assert_eq!(broken(&mut h, p(110, (3, "c", 10, 0), (4, "a", 90))), None);
        assert_eq!(broken(&mut h, p(120, (5, "c", 10, 0), (6, "b", 90))), None);
        let (name, why) = h.add(p(900, (7, "a", 10, 0), (8, "b", 90))).expect("a cycle");
        assert_eq!(name, "no-preemption-cycle");
        assert!(why.contains("after a task of a had preempted one of b"), "{why}");
    }

    /// A replica placed after its service's first preemption and preempted within 60 s of
    /// its placement breaks the backoff invariant; one placed before it, or preempted 60 s
    /// after its placement, does not.
    #[test]
    fn a_shielded_replica_preempted_breaks_preempted_within_backoff() {
        let mut h = History::default();
        assert_eq!(broken(&mut h, p(100, (1, "lo", 10, 0), (2, "hi", 90))), None);
        // Placed before the first preemption: not shielded.
        assert_eq!(broken(&mut h, p(120, (3, "lo", 10, 50), (4, "hi", 90))), None);
        // Placed after it, preempted 60 s later: the shield is over.
        assert_eq!(broken(&mut h, p(170, (5, "lo", 10, 110), (6, "hi", 90))), None);
        // Placed after it, preempted 59.999 s later.
        let mut x = p(0, (7, "lo", 10, 200), (8, "hi", 90));
        x.at_ms = 200_000 + PREEMPTION_BACKOFF_MS - 1;
        let (name, why) = h.add(x).expect("inside the backoff");
        assert_eq!(name, "preempted-within-backoff");
        assert!(why.contains("59999 ms after its placement"), "{why}");
        // Another service's first preemption shields nothing of it.
        let mut other = History::default();
        assert_eq!(broken(&mut other, p(100, (1, "lo", 10, 0), (2, "hi", 90))), None);
        assert_eq!(broken(&mut other, p(101, (3, "lo2", 10, 100), (4, "hi", 90))), None);
    }

    /// A victim less than 10 below its preemptor breaks the gap invariant; exactly 10 below
    /// holds.
    #[test]
    fn a_victim_too_close_breaks_preemption_gap() {
        let mut h = History::default();
        assert_eq!(broken(&mut h, p(100, (1, "b", 40, 0), (2, "a", 50))), None);
        let (name, why) = h.add(p(100, (3, "c", 41, 0), (4, "a", 50))).expect("too close");
        assert_eq!(name, "preemption-gap");
        assert!(why.contains("less than 10 below"), "{why}");
    }

    /// The same victim seen twice (its planned stop, then its stop) counts once.
    #[test]
    fn a_victim_counts_once() {
        let mut h = History::default();
        assert_eq!(broken(&mut h, p(100, (1, "b", 10, 0), (2, "a", 90))), None);
        assert_eq!(broken(&mut h, p(101, (1, "b", 10, 0), (2, "a", 90))), None);
        assert_eq!(h.all.len(), 1);
    }

    /// The victim's record, planned or stopped, names its preemptor and both priorities.
    #[test]
    fn the_victim_record_is_read() {
        let reason =
            "preempted: stopped to make room on host h-1 for task t-00000000000000ab (priority 90), \
                      this task's priority being 10";
        let named = parse_reason(reason).expect("parsed");
        assert_eq!(named, Named { preemptor: TaskId(0xab), preemptor_priority: 90, victim_priority: 10 });
        assert_eq!(parse_reason("stopped by the user"), None);
        let mut t = Task::new(
            TaskId(1),
            TaskDefRef { family: Family::new("batch").unwrap(), revision: 1 },
            PoolName::new("gpu").unwrap(),
            Some(ServiceName::new("gpu-batch-a").unwrap()),
            "service:gpu-batch-a".into(),
            0,
        );
        assert_eq!(victim_reason(&t), None);
        t.draining = Some(Draining {
            since_ms: 1,
            until_ms: 2,
            stop_code: StopCode::Preempted,
            reason: reason.into(),
        });
        assert_eq!(victim_reason(&t), Some(reason));
        t.draining = None;
        t.desired_status = TaskStatus::Stopped;
        t.stop_code = Some(StopCode::Preempted);
        t.stopped_reason = Some(reason.into());
        assert_eq!(victim_reason(&t), Some(reason));
        assert_eq!(owner(&t), "gpu-batch-a");
        t.stop_code = Some(StopCode::UserInitiated);
        assert_eq!(victim_reason(&t), None);
    }
}
