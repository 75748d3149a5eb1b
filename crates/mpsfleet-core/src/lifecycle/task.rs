//! The task lifecycle, in ECS's statuses: `PROVISIONING -> PENDING -> ACTIVATING -> RUNNING ->
//! DEACTIVATING -> STOPPING -> DEPROVISIONING -> STOPPED`, as a pure [`step`] over named events,
//! and the guards ([`can_place`], [`is_live`], [`is_terminal`]) that callers use instead of
//! comparing statuses.
//!
//! What it promises:
//! - a task only moves forward: a report of an earlier status is refused;
//! - a STOPPED task never comes back to life (reports for it change nothing, nothing places it);
//! - an unplaced task stops at once when asked to; a placed one stops when its agent says so,
//!   or when its host is gone ([`Event::ForcedStop`]).
//!
//! It does not record stop codes, reasons or times: the caller does, from the transition.
//!
//! [`apply`] and [`report_health`] are the only writers of a task record's `last_status`,
//! `desired_status` and `health_status` (the architecture test holds every other file to it).

use mpsfleet_types::{Task, TaskHealth, TaskStatus};

/// Where a task stands: its last status, whether a stop was asked for, whether it is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskState {
    pub last: TaskStatus,
    /// `desiredStatus` is STOPPED: the task is on its way out.
    pub stop_requested: bool,
    /// It has a host (and holds capacity there until it stops).
    pub placed: bool,
}

impl TaskState {
    /// A new task: PENDING, desired RUNNING, not placed.
    pub const NEW: TaskState = TaskState { last: TaskStatus::Pending, stop_requested: false, placed: false };

    /// The state of a task record.
    pub fn of(task: &Task) -> TaskState {
        TaskState {
            last: task.last_status,
            stop_requested: task.desired_status == TaskStatus::Stopped,
            placed: task.host_id.is_some(),
        }
    }
}

/// What happened to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The scheduler gave it a host and GPUs.
    Placed,
    /// Its host's agent reports this status.
    AgentReported(TaskStatus),
    /// Someone asked it to stop (the user, its service, a drain).
    StopRequested,
    /// Its host is gone (terminated, deregistered): it stops without its agent.
    ForcedStop,
}

impl Event {
    fn name(self) -> String {
        match self {
            Event::Placed => "placement".to_string(),
            Event::AgentReported(s) => format!("a report of {}", s.as_str()),
            Event::StopRequested => "a stop request".to_string(),
            Event::ForcedStop => "a forced stop".to_string(),
        }
    }
}

/// Why an event does not apply to a task's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The task is STOPPED; it never comes back.
    #[error("STOPPED is final: {event} cannot revive the task")]
    Stopped { event: String },
    /// A report of an earlier status than the task's.
    #[error("{} cannot go back to {}", from.as_str(), to.as_str())]
    Regress { from: TaskStatus, to: TaskStatus },
    /// A report for a task that has no host (no agent runs it).
    #[error("{} is not placed on a host: {event} does not apply", from.as_str())]
    NotPlaced { from: TaskStatus, event: String },
    /// Placement of a task that already has a host.
    #[error("{} is already placed", from.as_str())]
    AlreadyPlaced { from: TaskStatus },
    /// Placement of a task asked to stop.
    #[error("{} is asked to stop: it is not placed again", from.as_str())]
    StopRequested { from: TaskStatus },
}

/// The next state of a task after `event`. Events that change nothing (a repeated report, a
/// second stop request) return the state unchanged; events that would break the lifecycle
/// return why.
pub fn step(s: TaskState, event: Event) -> Result<TaskState, TransitionError> {
    if is_terminal(s.last) {
        return match event {
            // Said again: nothing changes.
            Event::StopRequested | Event::ForcedStop | Event::AgentReported(TaskStatus::Stopped) => Ok(s),
            Event::Placed | Event::AgentReported(_) => Err(TransitionError::Stopped { event: event.name() }),
        };
    }
    match event {
        Event::Placed if s.placed => Err(TransitionError::AlreadyPlaced { from: s.last }),
        Event::Placed if s.stop_requested => Err(TransitionError::StopRequested { from: s.last }),
        Event::Placed => Ok(TaskState { placed: true, ..s }),
        Event::AgentReported(_) if !s.placed => {
            Err(TransitionError::NotPlaced { from: s.last, event: event.name() })
        }
        Event::AgentReported(to) if to < s.last => Err(TransitionError::Regress { from: s.last, to }),
        Event::AgentReported(to) => {
            Ok(TaskState { last: to, stop_requested: s.stop_requested || is_terminal(to), ..s })
        }
        // Nothing runs an unplaced task: it stops at once. A placed one stops when its agent
        // reports it has.
        Event::StopRequested if !s.placed => {
            Ok(TaskState { last: TaskStatus::Stopped, stop_requested: true, ..s })
        }
        Event::StopRequested => Ok(TaskState { stop_requested: true, ..s }),
        Event::ForcedStop => Ok(TaskState { last: TaskStatus::Stopped, stop_requested: true, ..s }),
    }
}

/// Moves the task `t` by `event`: [`step`] decides, and its `last_status` and `desired_status`
/// become those of the next state. Gives the state it left, so the caller can record what the
/// transition means (a stop time, a reason); on an error `t` is unchanged.
pub fn apply(t: &mut Task, event: Event) -> Result<TaskState, TransitionError> {
    let from = TaskState::of(t);
    let next = step(from, event)?;
    t.last_status = next.last;
    if next.stop_requested {
        t.desired_status = TaskStatus::Stopped;
    }
    Ok(from)
}

/// The health the task's agent reports (its containers' health checks). A STOPPED task keeps
/// the health it last had.
pub fn report_health(t: &mut Task, health: TaskHealth) {
    if !is_terminal(t.last_status) {
        t.health_status = health;
    }
}

/// STOPPED: nothing happens to the task any more.
pub fn is_terminal(status: TaskStatus) -> bool {
    status == TaskStatus::Stopped
}

/// Not yet STOPPED: a placed live task holds capacity on its host.
pub fn is_live(status: TaskStatus) -> bool {
    !is_terminal(status)
}

/// Waiting to run: not yet RUNNING (and not stopped).
pub fn is_pending(status: TaskStatus) -> bool {
    status < TaskStatus::Running
}

/// Whether the scheduler may place the task: live, unplaced, not asked to stop.
pub fn can_place(s: TaskState) -> bool {
    is_live(s.last) && !s.placed && !s.stop_requested
}

/// Whether the task holds capacity on a host: placed and live.
pub fn holds_capacity(s: TaskState) -> bool {
    s.placed && is_live(s.last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskStatus::*;

    fn st(last: TaskStatus, stop_requested: bool, placed: bool) -> TaskState {
        TaskState { last, stop_requested, placed }
    }

    /// One transition: `want` is the next state, or a piece of the error's message.
    fn check(from: TaskState, event: Event, want: Result<TaskState, &str>) {
        let got = step(from, event);
        match (&got, want) {
            (Ok(next), Ok(w)) => assert_eq!(*next, w, "{from:?} + {event:?}"),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{from:?} + {event:?}: {e} lacks {w:?}"),
            _ => panic!("{from:?} + {event:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn transitions() {
        let new = TaskState::NEW;
        let placed = st(Pending, false, true);
        let running = st(Running, false, true);
        let stopped = st(Stopped, true, true);
        // Placement.
        check(new, Event::Placed, Ok(placed));
        check(st(Provisioning, false, false), Event::Placed, Ok(st(Provisioning, false, true)));
        check(placed, Event::Placed, Err("PENDING is already placed"));
        check(st(Pending, true, false), Event::Placed, Err("asked to stop"));
        // Reports move forward, one status or many at once.
        check(placed, Event::AgentReported(Activating), Ok(st(Activating, false, true)));
        check(placed, Event::AgentReported(Running), Ok(running));
        check(running, Event::AgentReported(Running), Ok(running));
        check(running, Event::AgentReported(Stopping), Ok(st(Stopping, false, true)));
        check(running, Event::AgentReported(Stopped), Ok(stopped));
        check(running, Event::AgentReported(Pending), Err("RUNNING cannot go back to PENDING"));
        check(
            st(Stopping, true, true),
            Event::AgentReported(Running),
            Err("STOPPING cannot go back to RUNNING"),
        );
        check(new, Event::AgentReported(Running), Err("not placed"));
        // Stop requests.
        check(new, Event::StopRequested, Ok(st(Stopped, true, false)));
        check(placed, Event::StopRequested, Ok(st(Pending, true, true)));
        check(running, Event::StopRequested, Ok(st(Running, true, true)));
        check(st(Running, true, true), Event::StopRequested, Ok(st(Running, true, true)));
        check(st(Running, true, true), Event::AgentReported(Stopped), Ok(stopped));
        // The host is gone.
        check(running, Event::ForcedStop, Ok(stopped));
        check(placed, Event::ForcedStop, Ok(st(Stopped, true, true)));
        // A stopped task never comes back to life; saying it stopped again changes nothing.
        check(stopped, Event::AgentReported(Running), Err("STOPPED is final: a report of RUNNING"));
        check(stopped, Event::AgentReported(Pending), Err("cannot revive"));
        check(stopped, Event::Placed, Err("STOPPED is final: placement"));
        check(st(Stopped, true, false), Event::Placed, Err("STOPPED is final"));
        check(stopped, Event::AgentReported(Stopped), Ok(stopped));
        check(stopped, Event::StopRequested, Ok(stopped));
        check(stopped, Event::ForcedStop, Ok(stopped));
    }

    #[test]
    fn guards() {
        for (s, place, capacity) in [
            (TaskState::NEW, true, false),
            (st(Pending, false, true), false, true),
            (st(Running, false, true), false, true),
            (st(Running, true, true), false, true),
            (st(Pending, true, false), false, false),
            (st(Stopped, true, true), false, false),
        ] {
            assert_eq!(can_place(s), place, "can_place {s:?}");
            assert_eq!(holds_capacity(s), capacity, "holds_capacity {s:?}");
        }
        assert!(is_terminal(Stopped) && !is_live(Stopped));
        for s in [Provisioning, Pending, Activating, Running, Deactivating, Stopping, Deprovisioning] {
            assert!(is_live(s) && !is_terminal(s), "{s:?}");
        }
        assert!(is_pending(Pending) && is_pending(Activating) && !is_pending(Running));
    }

    /// `apply` writes what `step` decides, and nothing when it refuses.
    #[test]
    fn apply_writes_the_next_state_into_the_record() {
        let mut t = Task::new(
            mpsfleet_types::TaskId(1),
            mpsfleet_types::TaskDefRef { family: mpsfleet_types::Family::new("f").unwrap(), revision: 1 },
            mpsfleet_types::PoolName::new("p").unwrap(),
            None,
            "test".into(),
            0,
        );
        // Unplaced: a stop request stops it at once.
        let before = t.clone();
        assert_eq!(apply(&mut t, Event::AgentReported(Running)).map_err(|_| ()), Err(()));
        assert_eq!(t, before, "a refused event changes nothing");
        assert_eq!(apply(&mut t, Event::StopRequested).unwrap(), TaskState::NEW);
        assert_eq!((t.last_status, t.desired_status), (Stopped, Stopped));
        // Placed: it runs, is asked to stop, and stops when its agent says so.
        let mut t = before.clone();
        t.host_id = Some(mpsfleet_types::HostId::new("h-1").unwrap());
        apply(&mut t, Event::AgentReported(Running)).unwrap();
        report_health(&mut t, TaskHealth::Healthy);
        assert_eq!(
            (t.last_status, t.desired_status, t.health_status),
            (Running, Running, TaskHealth::Healthy)
        );
        apply(&mut t, Event::StopRequested).unwrap();
        assert_eq!((t.last_status, t.desired_status), (Running, Stopped));
        apply(&mut t, Event::AgentReported(Stopped)).unwrap();
        report_health(&mut t, TaskHealth::Unhealthy);
        assert_eq!(
            (t.last_status, t.health_status),
            (Stopped, TaskHealth::Healthy),
            "health is kept once stopped"
        );
    }

    /// Whatever happens to a task, it never leaves STOPPED and never moves back.
    #[test]
    fn no_sequence_of_events_revives_a_stopped_task_or_moves_one_back() {
        let statuses =
            [Provisioning, Pending, Activating, Running, Deactivating, Stopping, Deprovisioning, Stopped];
        let mut events = vec![Event::Placed, Event::StopRequested, Event::ForcedStop];
        events.extend(statuses.iter().map(|&s| Event::AgentReported(s)));
        // Every state reachable from NEW in four events.
        let mut frontier = vec![TaskState::NEW];
        for _ in 0..4 {
            let mut next = Vec::new();
            for s in &frontier {
                for &e in &events {
                    if let Ok(n) = step(*s, e) {
                        assert!(n.last >= s.last, "{s:?} + {e:?} went back to {n:?}");
                        if is_terminal(s.last) {
                            assert_eq!(n, *s, "{s:?} + {e:?}");
                        }
                        assert!(!s.placed || n.placed, "{s:?} + {e:?} lost its host");
                        next.push(n);
                    }
                }
            }
            next.dedup();
            frontier = next;
        }
    }
}
