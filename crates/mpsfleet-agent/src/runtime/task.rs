//! A task as the sum of its containers: when it is running, and why it stopped.

use super::container::ContainerState;
use super::shim::ExitRecord;
use mpsfleet_types::task::StopCode;

/// One container of a task, as [`task_state`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct ContainerView<'a> {
    pub name: &'a str,
    pub essential: bool,
    pub state: &'a ContainerState,
}

/// A task's phase derived from its containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskPhase {
    Running,
    /// The task is over; the caller stops whatever containers still run.
    Stopped {
        code: StopCode,
        reason: String,
    },
}

/// The stop code and reason for a container that ended on its own. A container the kernel
/// killed for its memory limit stops the task with [`StopCode::OutOfMemory`] (ECS:
/// `OutOfMemoryError: Container killed due to memory usage`).
pub fn stop_for_exit(container: &str, exit: &ExitRecord) -> (StopCode, String) {
    if exit.oom_killed {
        return (
            StopCode::OutOfMemory,
            format!("container {container} was killed: out of memory (went past its memory limit)"),
        );
    }
    match &exit.error {
        Some(error) => {
            (StopCode::TaskFailedToStart, format!("container {container} failed to start: {error}"))
        }
        None => (
            StopCode::EssentialContainerExited,
            format!("essential container {container} exited: {}", exit.reason()),
        ),
    }
}

/// RUNNING while every essential container runs; STOPPED as soon as one has exited (a failure
/// to start wins over an ordinary exit), or when no container runs at all.
pub fn task_state(containers: &[ContainerView<'_>]) -> TaskPhase {
    if containers.is_empty() {
        return TaskPhase::Stopped {
            code: StopCode::TaskFailedToStart,
            reason: "task has no containers".into(),
        };
    }
    let verdict = |c: &ContainerView<'_>| -> Option<(StopCode, String)> {
        if !c.essential {
            return None;
        }
        match c.state {
            ContainerState::Running { .. } => None,
            ContainerState::Exited(exit) => Some(stop_for_exit(c.name, exit)),
            ContainerState::Lost { reason } => Some((
                StopCode::EssentialContainerExited,
                format!("essential container {} exited with an unknown status: {reason}", c.name),
            )),
        }
    };
    let verdicts: Vec<(StopCode, String)> = containers.iter().filter_map(verdict).collect();
    // A failure to start says more than an ordinary exit.
    if let Some((code, reason)) =
        verdicts.iter().find(|(code, _)| *code == StopCode::TaskFailedToStart).or(verdicts.first())
    {
        return TaskPhase::Stopped { code: *code, reason: reason.clone() };
    }
    if containers.iter().all(|c| !c.state.is_running()) {
        return TaskPhase::Stopped {
            code: StopCode::EssentialContainerExited,
            reason: "all containers exited".into(),
        };
    }
    TaskPhase::Running
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32) -> ContainerState {
        ContainerState::Exited(ExitRecord {
            code: Some(code),
            signal: None,
            finished_at_ms: 1,
            error: None,
            oom_killed: false,
        })
    }
    fn killed(signal: i32) -> ContainerState {
        ContainerState::Exited(ExitRecord {
            code: None,
            signal: Some(signal),
            finished_at_ms: 1,
            error: None,
            oom_killed: false,
        })
    }
    fn not_started() -> ContainerState {
        ContainerState::Exited(ExitRecord {
            code: None,
            signal: None,
            finished_at_ms: 1,
            error: Some("no such file or directory: foo".into()),
            oom_killed: false,
        })
    }
    fn oom() -> ContainerState {
        ContainerState::Exited(ExitRecord {
            code: Some(137),
            signal: None,
            finished_at_ms: 1,
            error: None,
            oom_killed: true,
        })
    }
    fn running() -> ContainerState {
        ContainerState::Running { pid: 42 }
    }

    fn check(containers: &[(&str, bool, ContainerState)], expected: TaskPhase) {
        let views: Vec<ContainerView<'_>> = containers
            .iter()
            .map(|(name, essential, state)| ContainerView { name, essential: *essential, state })
            .collect();
        assert_eq!(task_state(&views), expected, "containers: {containers:?}");
    }

    fn stopped(code: StopCode, reason: &str) -> TaskPhase {
        TaskPhase::Stopped { code, reason: reason.into() }
    }

    #[test]
    fn task_state_table() {
        use StopCode::*;
        check(&[("app", true, running())], TaskPhase::Running);
        check(&[("app", true, running()), ("side", false, exited(0))], TaskPhase::Running);
        check(
            &[("app", true, exited(3)), ("side", false, running())],
            stopped(EssentialContainerExited, "essential container app exited: exit status 3"),
        );
        check(
            &[("app", true, running()), ("db", true, killed(9))],
            stopped(EssentialContainerExited, "essential container db exited: killed by signal 9 (SIGKILL)"),
        );
        check(
            &[("a", true, exited(0)), ("b", true, not_started())],
            stopped(TaskFailedToStart, "container b failed to start: no such file or directory: foo"),
        );
        check(
            &[("app", true, ContainerState::Lost { reason: "pid reused".into() })],
            stopped(
                EssentialContainerExited,
                "essential container app exited with an unknown status: pid reused",
            ),
        );
        check(
            &[("a", false, exited(0)), ("b", false, exited(1))],
            stopped(EssentialContainerExited, "all containers exited"),
        );
        check(&[], stopped(TaskFailedToStart, "task has no containers"));
        check(
            &[("app", true, oom()), ("side", false, running())],
            stopped(OutOfMemory, "container app was killed: out of memory (went past its memory limit)"),
        );
        // A non-essential container killed for memory does not stop the task.
        check(&[("app", true, running()), ("side", false, oom())], TaskPhase::Running);
    }
}
