//! Preemption against the real cluster, in virtual time: the pool's policy, who may be a
//! victim, what a victim's record and its service say, and the room held for the preemptor.
//! (The choice of victims itself is core's, tested in `scheduler/preempt_tests.rs`; the
//! recovery path with the real MPS daemon is `tests/recovery.rs`.)

use super::recovery_tests::World;
use super::service_tests::agents;
use super::*;
use mpsfleet_types::Preemption;

/// One 1-GPU host (an emulated H200, 143,771 MiB) and definitions of 100,000 MiB (`big`) and
/// 40,000 MiB (`small`): two bigs never share the GPU.
fn world() -> (World, HostId) {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let join = w.join_token.clone();
    let host = w.join("h0", &join).unwrap();
    for (family, memory) in [("big", 100_000), ("small", 40_000)] {
        let td = format!(
            r#"{{"family": "{family}", "containerDefinitions": [{{"name": "c", "command": ["sleep", "3600"],
                "resourceRequirements": [{{"type": "GPU",
                    "sharingStrategy": {{"nvidiaMps": {{"memory": {memory}, "maxComputePercent": 10}}}}}}]}}]}}"#
        );
        w.c.register_taskdef(td.as_bytes()).unwrap();
    }
    (w, host)
}

fn run(w: &mut World, family: &str, priority: u32) -> Task {
    let req = RunTask {
        task_definition: family.into(),
        count: 1,
        pool: "p".into(),
        priority: Some(priority),
        ..Default::default()
    };
    w.c.run_tasks(req).unwrap().tasks.remove(0)
}

fn policy(w: &mut World, p: Preemption) {
    w.c.update_pool("p", UpdatePool { preemption: Some(p), ..Default::default() }).unwrap();
    w.c.run_work();
}

fn settle(w: &mut World) {
    w.c.run_work();
    agents(w, |_| false, &mut |_| {});
    w.c.run_work();
}

fn task(w: &World, t: &Task) -> Task {
    w.c.read().task(&t.id.to_string()).unwrap()
}

#[test]
fn only_the_pools_policy_lets_a_run_preempt() {
    let (mut w, _) = world();
    let low = run(&mut w, "big", 10);
    settle(&mut w);
    assert_eq!(task(&w, &low).last_status, TaskStatus::Running);
    // `recovery` (the default) and `off`: a run is no recovery, it waits.
    let high = run(&mut w, "big", 90);
    for p in [Preemption::Recovery, Preemption::Off] {
        policy(&mut w, p);
        settle(&mut w);
        assert_eq!(task(&w, &low).desired_status, TaskStatus::Running, "preempted under {p:?}");
        let h = task(&w, &high);
        assert!(h.host_id.is_none() && h.pending_code != Some(PendingCode::Preempting), "{h:?}");
    }
    // `all`: the run makes room; the victim stops saying why, then the run takes the room.
    policy(&mut w, Preemption::All);
    let (l, h) = (task(&w, &low), task(&w, &high));
    assert_eq!(l.desired_status, TaskStatus::Stopped);
    assert_eq!(l.stop_code, Some(StopCode::Preempted));
    let why = l.stopped_reason.clone().unwrap();
    assert!(
        why.contains(&high.id.to_string()) && why.contains("priority 90") && why.contains("being 10"),
        "{why}"
    );
    assert_eq!(h.pending_code, Some(PendingCode::Preempting), "{h:?}");
    assert!(h.pending_reason.as_deref().unwrap().contains(&low.id.to_string()), "{h:?}");
    settle(&mut w);
    let (l, h) = (task(&w, &low), task(&w, &high));
    assert_eq!(
        (l.last_status, l.stop_code),
        (TaskStatus::Stopped, Some(StopCode::Preempted)),
        "a standalone victim ends"
    );
    assert_eq!(h.last_status, TaskStatus::Running, "{h:?}");
    let events = w.c.read().task_events(&low.id.to_string()).unwrap();
    assert!(events.iter().any(|e| e.event.reason == "Preempted"), "{events:?}");
    let pool = w.c.read().pool("p").unwrap();
    assert!(pool.events.iter().any(|e| e.event.reason == "Preempted"), "{:?}", pool.events);
    let text = crate::metrics::render(&w.c.metrics_state(), &w.c.live_metrics());
    let counted = r#"mpsfleet_preemptions_total{pool="p",band="low",for_band="high"} 1"#;
    assert!(
        text.contains(counted),
        "{}",
        text.lines().filter(|l| l.contains("preempt")).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn near_priorities_and_protected_tasks_are_never_victims() {
    let (mut w, _) = world();
    policy(&mut w, Preemption::All);
    let near = run(&mut w, "big", 41);
    settle(&mut w);
    let high = run(&mut w, "big", 50);
    settle(&mut w);
    assert_eq!(task(&w, &near).desired_status, TaskStatus::Running, "41 is 9 below 50");
    assert!(task(&w, &high).host_id.is_none());
    // A task protected from scale-in is protected from preemption too, until it ends.
    w.c.stop_task(&high.id.to_string(), None).unwrap();
    w.c.stop_task(&near.id.to_string(), None).unwrap();
    settle(&mut w);
    let low = run(&mut w, "big", 10);
    settle(&mut w);
    w.c.protect_tasks(&[low.id.to_string()], true, Some(1)).unwrap();
    let top = run(&mut w, "big", 100);
    settle(&mut w);
    assert_eq!(task(&w, &low).desired_status, TaskStatus::Running, "a protected task was preempted");
    assert!(task(&w, &top).host_id.is_none());
    // Nothing changes but the time: the resync's placement pass finds the protection over.
    w.advance(61_000);
    w.c.resync().unwrap();
    settle(&mut w);
    assert_eq!(task(&w, &low).stop_code, Some(StopCode::Preempted));
    assert_eq!(task(&w, &top).last_status, TaskStatus::Running);
}

#[test]
fn a_preempted_service_is_told_waits_for_room_and_is_shielded_afterwards() {
    let (mut w, _) = world();
    policy(&mut w, Preemption::All);
    let svc = CreateService {
        name: "batch".into(),
        pool: "p".into(),
        task_definition: "big".into(),
        desired_count: 1,
        priority: Some(10),
        deregistration_delay_seconds: Some(0),
        ..Default::default()
    };
    w.c.create_service(svc).unwrap();
    settle(&mut w);
    let high = run(&mut w, "big", 90);
    settle(&mut w);
    assert_eq!(task(&w, &high).last_status, TaskStatus::Running);
    let view = w.c.read().service("batch").unwrap();
    assert!(view.service.preempted_at_ms.is_some());
    assert!(view.service.events.iter().any(|e| e.event.reason == "Preempted"), "{:?}", view.service.events);
    // Its replacement waits for room: nothing of priority 10 may be preempted for it.
    let name = ServiceName::new("batch").unwrap();
    let tasks = w.c.state.tasks();
    let live: Vec<Task> =
        tasks.of_service(&name).iter().map(|id| tasks.get(id).unwrap().task.clone()).collect();
    let waiting: Vec<&Task> = live.iter().filter(|t| t.last_status == TaskStatus::Pending).collect();
    assert_eq!(waiting.len(), 1, "{live:?}");
    // Room returns (the high task stops): the replacement runs, and is shielded for the backoff.
    w.c.stop_task(&high.id.to_string(), None).unwrap();
    settle(&mut w);
    let again = task(&w, waiting[0]);
    assert_eq!(again.last_status, TaskStatus::Running);
    let other = run(&mut w, "big", 90);
    settle(&mut w);
    assert_eq!(task(&w, &again).desired_status, TaskStatus::Running, "preempted again within the backoff");
    assert!(task(&w, &other).host_id.is_none());
    // A new priority is the running tasks' at once.
    let up = UpdateService { priority: Some(95), ..Default::default() };
    w.c.update_service("batch", up).unwrap();
    assert_eq!(task(&w, &again).priority, 95);
    let e =
        w.c.update_service("batch", UpdateService { priority: Some(0), ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("priority must be from 1 to 100"), "{e}");
}

#[test]
fn the_room_made_is_held_for_the_preemptor() {
    let (mut w, _) = world();
    policy(&mut w, Preemption::All);
    // Three smalls fill the GPU (120,000 of 143,771 MiB); a big needs two of them gone.
    let smalls: Vec<Task> = (0..3).map(|_| run(&mut w, "small", 10)).collect();
    settle(&mut w);
    let big = run(&mut w, "big", 90);
    w.c.run_work();
    let stopping: Vec<&Task> =
        smalls.iter().filter(|t| task(&w, t).desired_status == TaskStatus::Stopped).collect();
    assert_eq!(stopping.len(), 2, "never more than needed");
    // While they stop, a small of priority 15 (too close to 10 to preempt) would fit in the
    // room they free: it waits.
    let late = run(&mut w, "small", 15);
    settle(&mut w);
    assert_eq!(task(&w, &big).last_status, TaskStatus::Running);
    assert!(task(&w, &late).host_id.is_none(), "the held room was taken");
}
