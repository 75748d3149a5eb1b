//! A drill's lifecycle, `RUNNING -> RESTORING -> ENDED`, as a pure [`step`] over named
//! events, and its verdict from the phases it measured.
//!
//! What it promises:
//! - a drill leaves RUNNING exactly once, for one reason: the owner recovered (or, in a
//!   self-managed pool, detected and notified), its deadline passed, or it was aborted; that
//!   reason decides the verdict, which never changes afterwards;
//! - RESTORING always comes before ENDED: the fault is taken back and what it broke restored
//!   before the drill says it is over;
//! - ENDED is final.
//!
//! [`apply`] is the only writer of a drill's `status`, `verdict` and `ended_at_ms`.

use mpsfleet_types::bounds::{PhaseJudgement, PhaseVerdict, RecoveryPhase};
use mpsfleet_types::drill::{Drill, DrillStatus, DrillVerdict};

/// What happened to a drill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The owner handled the fault (a managed pool: every incident resolved; a self-managed
    /// one: detected and notified; `--once`: repaired locally).
    Handled,
    /// The drill's time ran out before that.
    Deadline,
    /// A stop condition, the cluster-wide switch or an operator ended it.
    Abort(String),
    /// What the fault broke is back (or the restore's own time ran out).
    Restored,
}

/// The next status, or why `event` does not apply.
pub fn step(status: DrillStatus, event: &Event) -> Result<DrillStatus, String> {
    use DrillStatus::*;
    match (status, event) {
        (Running, Event::Handled | Event::Deadline | Event::Abort(_)) => Ok(Restoring),
        // Already taking the fault back: an abort changes nothing more.
        (Restoring, Event::Abort(_)) => Ok(Restoring),
        (Restoring, Event::Restored) => Ok(Ended),
        (s, e) => Err(format!("a {} drill cannot take {e:?}", s.as_str())),
    }
}

/// The verdict of a drill that left RUNNING for `event`, from the phases it measured: the
/// first phase breached, else within bounds; a deadline with nothing breached counts against
/// the phase that was still running.
pub fn verdict(event: &Event, phases: &[PhaseJudgement]) -> DrillVerdict {
    if let Event::Abort(condition) = event {
        return DrillVerdict::Aborted { condition: condition.clone() };
    }
    if let Some(j) = phases.iter().find(|j| j.verdict == PhaseVerdict::Breached) {
        return DrillVerdict::Breached { phase: j.phase, cause: j.cause };
    }
    if *event == Event::Deadline {
        let phase = phases
            .iter()
            .find(|j| j.verdict == PhaseVerdict::Running)
            .map_or(RecoveryPhase::Detect, |j| j.phase);
        return DrillVerdict::Breached { phase, cause: None };
    }
    DrillVerdict::WithinBounds
}

/// Runs `event` on `drill` at `now_ms`: its status, and the verdict when it leaves RUNNING.
pub fn apply(drill: &mut Drill, event: &Event, now_ms: u64) -> Result<(), String> {
    let next = step(drill.status, event)?;
    if drill.status == DrillStatus::Running {
        drill.verdict = Some(verdict(event, &drill.phases));
    }
    if next == DrillStatus::Ended {
        drill.ended_at_ms = Some(now_ms);
    }
    drill.status = next;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::bounds::{BreachCause, FailureKind, KindBounds};
    use mpsfleet_types::drill::DrillFault;
    use mpsfleet_types::PoolName;

    fn judged(phase: RecoveryPhase, verdict: PhaseVerdict, cause: Option<BreachCause>) -> PhaseJudgement {
        PhaseJudgement { phase, bound_ms: Some(1), measured_ms: None, verdict, cause }
    }

    fn drill() -> Drill {
        Drill {
            id: "d-1".into(),
            pool: PoolName::new("p").unwrap(),
            fault: DrillFault::DaemonExit,
            once: false,
            targets: Vec::new(),
            status: DrillStatus::Running,
            verdict: None,
            bounds: KindBounds {
                kind: FailureKind::DaemonExit,
                detect_ms: 1,
                notify_ms: 1,
                decide_ms: None,
                replace_ms: None,
                total_ms: None,
                total_fenced_ms: None,
                total_full_pool_ms: None,
                copies_ms: None,
            },
            owner: "mpsfleet".into(),
            incidents: Vec::new(),
            phases: Vec::new(),
            notified_at_ms: None,
            started_at_ms: 0,
            deadline_ms: 10,
            ended_at_ms: None,
            by: "admin".into(),
            events: Default::default(),
        }
    }

    #[test]
    fn steps() {
        use DrillStatus::*;
        for e in [Event::Handled, Event::Deadline, Event::Abort("x".into())] {
            assert_eq!(step(Running, &e), Ok(Restoring));
        }
        assert_eq!(step(Restoring, &Event::Restored), Ok(Ended));
        assert_eq!(step(Restoring, &Event::Abort("again".into())), Ok(Restoring));
        assert!(step(Running, &Event::Restored).is_err());
        assert!(step(Restoring, &Event::Handled).is_err());
        for e in [Event::Handled, Event::Deadline, Event::Abort("x".into()), Event::Restored] {
            assert!(step(Ended, &e).is_err(), "{e:?}");
        }
    }

    #[test]
    fn verdicts() {
        use PhaseVerdict::*;
        use RecoveryPhase::*;
        let ok = [judged(Detect, Within, None), judged(Total, Within, None)];
        assert_eq!(verdict(&Event::Handled, &ok), DrillVerdict::WithinBounds);
        let slow = [judged(Detect, Within, None), judged(Total, Breached, Some(BreachCause::NoCapacity))];
        assert_eq!(
            verdict(&Event::Handled, &slow),
            DrillVerdict::Breached { phase: Total, cause: Some(BreachCause::NoCapacity) }
        );
        let stuck = [judged(Detect, Within, None), judged(Total, Running, None)];
        assert_eq!(verdict(&Event::Deadline, &stuck), DrillVerdict::Breached { phase: Total, cause: None });
        assert_eq!(
            verdict(&Event::Abort("incident i-2 opened".into()), &slow),
            DrillVerdict::Aborted { condition: "incident i-2 opened".into() }
        );
    }

    /// The verdict is fixed when the drill leaves RUNNING: an abort while restoring keeps it.
    #[test]
    fn apply_keeps_the_first_verdict() {
        let mut d = drill();
        d.phases = vec![judged(RecoveryPhase::Detect, PhaseVerdict::Within, None)];
        apply(&mut d, &Event::Handled, 5).unwrap();
        assert_eq!((d.status, d.verdict.clone()), (DrillStatus::Restoring, Some(DrillVerdict::WithinBounds)));
        apply(&mut d, &Event::Abort("switch".into()), 6).unwrap();
        assert_eq!(d.verdict, Some(DrillVerdict::WithinBounds));
        apply(&mut d, &Event::Restored, 7).unwrap();
        assert_eq!((d.status, d.ended_at_ms), (DrillStatus::Ended, Some(7)));
        assert!(apply(&mut d, &Event::Restored, 8).is_err());
    }
}
