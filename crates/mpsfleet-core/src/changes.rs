//! What a change to a task or host record means in words: the entries of the objects' events
//! (`task describe`, `host describe`, `task.event` and `host.event` on `/v1/events`).
//!
//! Pure: each function compares the record before and after one change and names what
//! happened, with a stable CamelCase reason and a message for people. The server records
//! them in the objects' bounded histories; a repeat folds into a count there.

use mpsfleet_types::{
    GpuUuid, HealthStatus, History, Host, HostCheck, HostId, HostStatus, ObjectEvent, Task, TaskHealth,
    TaskStatus,
};

/// What happened to a task, kept compact: the words come from the task's record when the
/// event is shown ([`render`]); a task is placed once, and its stop reason and containers do
/// not change after the fact. Only a waiting reason, which does change, is kept as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskChange {
    Placed,
    Unplaced(String),
    /// Container `name`'s image was resolved to a digest.
    Pulled(String),
    Started,
    Ready,
    NotReady,
    Unhealthy,
    Healthy,
    Stopping,
    Stopped,
    /// Chosen to stop to make room for a higher-priority task (the words name both).
    Preempted(String),
}

impl mpsfleet_types::HistoryEvent for TaskChange {}

/// The changes of one task change; `old` is None for a new task. A task placed as it was
/// created gets no `Placed` here: its record implies it (see [`task_events`]), so that a
/// submit of many tasks keeps nothing more than their records.
pub fn task_changes(old: Option<&Task>, new: &Task) -> Vec<TaskChange> {
    let mut out = Vec::new();
    if let (Some(o), Some(_)) = (old, &new.host_id) {
        if o.host_id.is_none() {
            out.push(TaskChange::Placed);
        }
    }
    if new.host_id.is_none() && new.last_status != TaskStatus::Stopped {
        if let Some(why) = &new.pending_reason {
            if old.and_then(|o| o.pending_reason.as_ref()) != Some(why) {
                out.push(TaskChange::Unplaced(why.clone()));
            }
        }
    }
    let containers_before = old.map_or(&[][..], |o| &o.containers[..]);
    for c in &new.containers {
        let before = containers_before.iter().find(|b| b.name == c.name);
        if c.image.is_some()
            && c.image_digest.is_some()
            && before.and_then(|b| b.image_digest.as_ref()).is_none()
        {
            out.push(TaskChange::Pulled(c.name.clone()));
        }
    }
    let (last, desired, health, ready) = match old {
        Some(o) => (Some(o.last_status), o.desired_status, o.health_status, o.ready),
        None => (None, TaskStatus::Running, TaskHealth::Unknown, false),
    };
    if new.last_status == TaskStatus::Running && last != Some(TaskStatus::Running) {
        out.push(TaskChange::Started);
    }
    let live = new.last_status == TaskStatus::Running && new.desired_status != TaskStatus::Stopped;
    if live && new.ready != ready {
        out.push(if new.ready { TaskChange::Ready } else { TaskChange::NotReady });
    }
    if live && new.health_status != health {
        match new.health_status {
            TaskHealth::Unhealthy => out.push(TaskChange::Unhealthy),
            TaskHealth::Healthy => out.push(TaskChange::Healthy),
            TaskHealth::Unknown => {}
        }
    }
    if new.desired_status == TaskStatus::Stopped
        && desired != TaskStatus::Stopped
        && new.last_status != TaskStatus::Stopped
    {
        out.push(TaskChange::Stopping);
    }
    if new.last_status == TaskStatus::Stopped && last != Some(TaskStatus::Stopped) {
        out.push(TaskChange::Stopped);
    }
    out
}

/// A task's events in words, from its compact record: with the `Placed` its record implies
/// first (at its creation) when it was placed as it was created. A task that waited first
/// has an `Unplaced` first (the head of a history is always kept) and its own `Placed` later.
pub fn task_events(t: &Task, kept: &History<TaskChange>) -> History<ObjectEvent> {
    let shown = kept.map(|c| render(c, t));
    let waited = kept.first().is_some_and(|e| matches!(e.event, TaskChange::Unplaced(_)));
    if t.host_id.is_some() && !waited {
        shown.with_first(t.created_at_ms, render(&TaskChange::Placed, t))
    } else {
        shown
    }
}

/// One change in words, as `task describe` shows it.
pub fn render(c: &TaskChange, t: &Task) -> ObjectEvent {
    match c {
        TaskChange::Placed => placed(t.host_id.as_ref(), &t.gpu_ids),
        TaskChange::Unplaced(why) => ObjectEvent::new("FailedPlacement", format!("unable to place: {why}")),
        TaskChange::Pulled(name) => {
            let c = t.containers.iter().find(|c| &c.name == name);
            let image = c.and_then(|c| c.image.as_deref()).unwrap_or("-");
            let digest = c.and_then(|c| c.image_digest.as_deref()).unwrap_or("-");
            ObjectEvent::new("Pulled", format!("container {name}: image {image} is {digest}"))
        }
        TaskChange::Started => {
            let on = t.host_id.as_ref().map_or(String::new(), |h| format!(" on host {h}"));
            ObjectEvent::new("Started", format!("RUNNING{on}"))
        }
        TaskChange::Ready => ObjectEvent::new("Ready", "the readiness check passes"),
        TaskChange::NotReady => {
            ObjectEvent::new("ProbeFailed", "the readiness check fails: the task is not ready")
        }
        TaskChange::Unhealthy => ObjectEvent::new("ProbeFailed", "the health check fails: UNHEALTHY"),
        TaskChange::Healthy => ObjectEvent::new("Healthy", "the health check passes"),
        TaskChange::Stopping => {
            ObjectEvent::new("Stopping", t.stopped_reason.clone().unwrap_or_else(|| "stop requested".into()))
        }
        TaskChange::Stopped => ObjectEvent::new("Stopped", stopped_message(t)),
        TaskChange::Preempted(words) => ObjectEvent::new("Preempted", words.clone()),
    }
}

/// A task's `Placed` in words: where it was placed (what [`render`] says of it, for a reader
/// that kept only the host and GPUs).
pub fn placed(host: Option<&HostId>, gpus: &[GpuUuid]) -> ObjectEvent {
    let gpus = if gpus.is_empty() {
        "no GPU".to_string()
    } else {
        let ids: Vec<&str> = gpus.iter().map(|g| g.as_str()).collect();
        format!("GPU {}", ids.join(", "))
    };
    let host = host.map_or("-", |h| h.as_str());
    ObjectEvent::new("Placed", format!("placed on host {host}, {gpus}"))
}

/// `StopCode: reason; exit codes name=N, ...`.
fn stopped_message(t: &Task) -> String {
    let mut msg = match (t.stop_code, &t.stopped_reason) {
        (Some(c), Some(r)) => format!("{}: {r}", c.as_str()),
        (Some(c), None) => c.as_str().to_string(),
        (None, Some(r)) => r.clone(),
        (None, None) => "STOPPED".to_string(),
    };
    let exits: Vec<String> =
        t.containers.iter().filter_map(|c| c.exit_code.map(|x| format!("{}={x}", c.name))).collect();
    if !exits.is_empty() {
        msg.push_str(&format!("; exit codes {}", exits.join(", ")));
    }
    msg
}

/// The events of one host change. `health_why` says why the health is what it is now (the
/// checks that are not OK), for a change of health.
pub fn host_changes(old: &Host, new: &Host, health_why: &str) -> Vec<ObjectEvent> {
    let mut out = Vec::new();
    if old.status != new.status {
        let (reason, msg) = match (old.status, new.status) {
            (HostStatus::Onboarding, HostStatus::Active) => {
                ("Onboarded", "every check answered: the host takes work".to_string())
            }
            (HostStatus::Draining, HostStatus::Active) => {
                ("Activated", "back in service after a drain".to_string())
            }
            (_, HostStatus::Draining) => {
                ("Draining", "no new tasks; its tasks are stopped and placed elsewhere".to_string())
            }
            (_, HostStatus::Deregistered) => ("Deregistered", "left the fleet".to_string()),
            (from, to) => ("StatusChanged", format!("{} -> {}", from.as_str(), to.as_str())),
        };
        out.push(ObjectEvent::new(reason, msg));
    }
    if old.health_status != new.health_status {
        let mut msg = format!("health {} -> {}", old.health_status.as_str(), new.health_status.as_str());
        if new.health_status != HealthStatus::Ok && !health_why.is_empty() {
            msg.push_str(": ");
            msg.push_str(health_why);
        }
        out.push(ObjectEvent::new("HealthChanged", msg));
    }
    if old.cordoned != new.cordoned && old.status == new.status {
        out.push(if new.cordoned {
            ObjectEvent::new("Cordoned", "no new tasks are placed here")
        } else {
            ObjectEvent::new("Uncordoned", "new tasks may be placed here again")
        });
    }
    if old.credential_revoked_at_ms.is_none() && new.credential_revoked_at_ms.is_some() {
        out.push(ObjectEvent::new("CredentialRevoked", "the host's credential is refused from now on"));
    }
    out
}

/// Local repairs a heartbeat reports: a check (an MPS daemon) whose restart count went up
/// since the last report (`DaemonRestarted`: it was restarted), and one whose local restarts
/// ran out since (`LocalRepairExhausted`: the agent gave up after N restarts). A check not
/// reported before is not counted (after a server start the counts are new to it, not the
/// restarts).
pub fn local_restarts(old: &[HostCheck], new: &[HostCheck]) -> Vec<ObjectEvent> {
    let exhausted = |c: &HostCheck| {
        c.status == mpsfleet_types::HealthStatus::Impaired
            && c.reason.contains(crate::lifecycle::mps::RESTARTS_EXHAUSTED)
    };
    new.iter()
        .filter_map(|c| {
            // No restart since the agent started and no given-up daemon (the usual report) is
            // no news, whatever came before: looked at first, it spares every heartbeat the
            // search for the old check.
            if c.restarts == 0 && !exhausted(c) {
                return None;
            }
            Some((old.iter().find(|o| o.name == c.name && o.gpu_id == c.gpu_id)?, c))
        })
        .flat_map(|(before, c)| {
            let what = match &c.gpu_id {
                Some(g) => format!("the {} of GPU {g}", check_subject(&c.name)),
                None => format!("the {}", check_subject(&c.name)),
            };
            let mut out = Vec::new();
            if c.restarts > before.restarts {
                let n = c.restarts - before.restarts;
                let times = if n == 1 { "once".to_string() } else { format!("{n} times") };
                out.push(ObjectEvent::new(
                    "DaemonRestarted",
                    format!(
                        "the agent restarted {what} locally ({times}; {} since the agent started)",
                        c.restarts
                    ),
                ));
            }
            if exhausted(c) && !exhausted(before) {
                out.push(ObjectEvent::new(
                    "LocalRepairExhausted",
                    format!(
                        "the agent gave up on {what} after {} local restart(s): {}",
                        c.restarts, c.reason
                    ),
                ));
            }
            out
        })
        .collect()
}

fn check_subject(name: &str) -> &str {
    match name {
        crate::health::MPS_DAEMON => "MPS daemon",
        "CONTAINER_RUNTIME" => "container runtime",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{ContainerReport, GpuUuid, HostId, PoolName, StopCode, TaskDefRef, TaskId};

    fn task() -> Task {
        let td = TaskDefRef::parse("infer:1").unwrap();
        Task::new(TaskId(7), td, PoolName::new("gpu").unwrap(), None, "run:1".into(), 1)
    }

    fn reasons(v: &[ObjectEvent]) -> Vec<&str> {
        v.iter().map(|e| e.reason.as_str()).collect()
    }

    #[test]
    fn a_task_life_in_events() {
        let mut t = task();
        t.pending_reason = Some("no GPU has 9000 MiB free".into());
        let mut kept = History::new();
        let mut record = |old: Option<&Task>, new: &Task| {
            let got = task_changes(old, new);
            for c in got.iter().cloned() {
                kept.push(1, c);
            }
            got
        };
        assert_eq!(record(None, &t), [TaskChange::Unplaced("no GPU has 9000 MiB free".into())]);
        // The same reason again is no news.
        assert!(record(Some(&t), &t).is_empty());

        let mut placed = t.clone();
        placed.pending_reason = None;
        placed.host_id = Some(HostId::new("h-1").unwrap());
        placed.gpu_ids = vec![GpuUuid::new("GPU-a").unwrap()];
        assert_eq!(record(Some(&t), &placed), [TaskChange::Placed]);

        let mut running = placed.clone();
        running.last_status = TaskStatus::Running;
        running.ready = true;
        running.containers = vec![ContainerReport {
            name: "web".into(),
            image: Some("busybox".into()),
            image_digest: Some("sha256:ab".into()),
            ..Default::default()
        }];
        let got = record(Some(&placed), &running);
        assert_eq!(got, [TaskChange::Pulled("web".into()), TaskChange::Started, TaskChange::Ready]);

        let mut sick = running.clone();
        sick.health_status = TaskHealth::Unhealthy;
        assert_eq!(record(Some(&running), &sick), [TaskChange::Unhealthy]);

        let mut stopping = sick.clone();
        stopping.desired_status = TaskStatus::Stopped;
        stopping.stopped_reason = Some("replaced".into());
        assert_eq!(record(Some(&sick), &stopping), [TaskChange::Stopping]);

        let mut stopped = stopping.clone();
        stopped.last_status = TaskStatus::Stopped;
        stopped.stop_code = Some(StopCode::Unhealthy);
        stopped.containers[0].exit_code = Some(137);
        assert_eq!(record(Some(&stopping), &stopped), [TaskChange::Stopped]);

        // In words, from the record.
        let shown = task_events(&stopped, &kept);
        let words: Vec<(&str, &str)> =
            shown.iter().map(|e| (e.reason.as_str(), e.message.as_str())).collect();
        assert_eq!(
            words,
            [
                ("FailedPlacement", "unable to place: no GPU has 9000 MiB free"),
                ("Placed", "placed on host h-1, GPU GPU-a"),
                ("Pulled", "container web: image busybox is sha256:ab"),
                ("Started", "RUNNING on host h-1"),
                ("Ready", "the readiness check passes"),
                ("ProbeFailed", "the health check fails: UNHEALTHY"),
                ("Stopping", "replaced"),
                ("Stopped", "Unhealthy: replaced; exit codes web=137"),
            ]
        );
    }

    #[test]
    fn a_task_placed_as_it_was_created_keeps_nothing_but_shows_placed() {
        let mut t = task();
        t.host_id = Some(HostId::new("h-1").unwrap());
        assert!(task_changes(None, &t).is_empty(), "nothing kept on the submit path");
        let shown = task_events(&t, &History::new());
        assert_eq!(shown.len(), 1);
        assert_eq!((shown[0].at_ms, shown[0].reason.as_str()), (t.created_at_ms, "Placed"));
        assert_eq!(shown[0].message, "placed on host h-1, no GPU");
    }

    #[test]
    fn placed_shows_once_however_long_the_history_grows() {
        let mut t = task();
        t.host_id = Some(HostId::new("h-1").unwrap());
        // Placed as created, then a health check that flaps past the history's bound.
        let mut kept = History::new();
        for i in 0..100 {
            kept.push(i, if i % 2 == 0 { TaskChange::Unhealthy } else { TaskChange::Healthy });
        }
        assert!(kept.elided() > 0);
        let placed = |h: &History<ObjectEvent>| h.iter().filter(|e| e.reason == "Placed").count();
        let shown = task_events(&t, &kept);
        assert_eq!((placed(&shown), shown[0].reason.as_str()), (1, "Placed"));
        // Waited first, then placed after many changing reasons: its own Placed is elided, and
        // none is implied at its creation.
        let mut kept = History::new();
        for i in 0..70 {
            kept.push(i, TaskChange::Unplaced(format!("reason {i}")));
        }
        kept.push(70, TaskChange::Placed);
        for i in 71..150 {
            kept.push(i, if i % 2 == 0 { TaskChange::Unhealthy } else { TaskChange::Healthy });
        }
        let shown = task_events(&t, &kept);
        assert_eq!(placed(&shown), 0, "the Placed entry was left out, and none is made up");
        assert_eq!(shown[0].reason, "FailedPlacement");
    }

    fn host() -> Host {
        serde_json::from_value(serde_json::json!({
            "id": "h-1", "pool": "gpu", "hostname": "n1", "status": "ACTIVE", "healthStatus": "OK",
            "cordoned": false, "emulated": true, "mpsAvailable": true, "gpus": [], "seq": 0,
            "registeredAtMs": 1, "credentialSha256": ""
        }))
        .unwrap()
    }

    #[test]
    fn host_changes_name_what_moved() {
        let a = host();
        let mut b = a.clone();
        b.health_status = HealthStatus::Impaired;
        let ev = host_changes(&a, &b, "MPS_DAEMON GPU-a: no answer in 2000 ms");
        assert_eq!(ev[0].message, "health OK -> IMPAIRED: MPS_DAEMON GPU-a: no answer in 2000 ms");
        let mut c = b.clone();
        c.status = HostStatus::Draining;
        c.cordoned = true;
        // Cordoning is part of the drain, not news of its own.
        assert_eq!(reasons(&host_changes(&b, &c, "")), ["Draining"]);
        let mut d = a.clone();
        d.cordoned = true;
        assert_eq!(reasons(&host_changes(&a, &d, "")), ["Cordoned"]);
        assert!(host_changes(&a, &a, "").is_empty());
    }

    #[test]
    fn restarts_count_only_when_they_go_up() {
        let check = |restarts| HostCheck {
            name: "MPS_DAEMON".into(),
            gpu_id: Some(GpuUuid::new("GPU-a").unwrap()),
            status: HealthStatus::Ok,
            reason: "answering".into(),
            since_ms: 1,
            restarts,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        };
        let ev = local_restarts(&[check(1)], &[check(2)]);
        assert_eq!(ev.len(), 1);
        assert_eq!(
            ev[0].message,
            "the agent restarted the MPS daemon of GPU GPU-a locally (once; 2 since the agent started)"
        );
        // Restarted, then killed again and given up on: both said, each as it happened.
        let gave_up = HostCheck {
            status: HealthStatus::Impaired,
            reason: "daemon exited (signal 9); local restarts exhausted (3 within 10m)".into(),
            ..check(3)
        };
        let ev = local_restarts(&[check(2)], std::slice::from_ref(&gave_up));
        assert_eq!(reasons(&ev), ["DaemonRestarted", "LocalRepairExhausted"]);
        assert_eq!(
            ev[1].message,
            "the agent gave up on the MPS daemon of GPU GPU-a after 3 local restart(s): daemon exited (signal 9); \
             local restarts exhausted (3 within 10m)"
        );
        assert!(
            local_restarts(std::slice::from_ref(&gave_up), std::slice::from_ref(&gave_up)).is_empty(),
            "said once"
        );
        assert!(local_restarts(&[check(2)], &[check(2)]).is_empty());
        // A new agent counts from 0; a first report is not a restart.
        assert!(local_restarts(&[check(3)], &[check(0)]).is_empty());
        assert!(local_restarts(&[], &[check(4)]).is_empty());
    }
}
