//! Rolling deployments against the real cluster, in virtual time: simulated agents answer
//! every placement, and the service's bounds are checked after every transition the server
//! makes (every report it takes and every step it plans).

use super::recovery_tests::World;
use super::*;
use mpsfleet_types::service::{CircuitBreaker, DeploymentConfiguration, DeploymentStatus, RolloutState};

/// `app:1` (healthy), `app:2` (healthy), `bad:` revisions fail their health check.
pub(super) fn world(hosts: usize) -> (World, Vec<HostId>) {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let join = w.join_token.clone();
    let ids = (0..hosts).map(|i| w.join(&format!("h{i}"), &join).unwrap()).collect();
    let td = |family: &str| {
        format!(
            r#"{{"family": "{family}", "containerDefinitions": [{{"name": "c", "command": ["sleep", "3600"],
                "healthCheck": {{"command": ["CMD", "true"]}},
                "resourceRequirements": [{{"type": "GPU",
                    "sharingStrategy": {{"nvidiaMps": {{"memory": 1000, "maxComputePercent": 10}}}}}}]}}]}}"#
        )
    };
    for f in ["app", "app"] {
        w.c.register_taskdef(td(f).as_bytes()).unwrap();
    }
    (w, ids)
}

/// What an agent does, one report at a time: a placed task starts (RUNNING, then its health
/// check answers), a task asked to stop stops. `fails` says which definitions fail their
/// check. After each report: `check(&cluster)`. Returns when nothing is left to report.
pub(super) fn agents(w: &mut World, fails: impl Fn(&TaskDefRef) -> bool, check: &mut impl FnMut(&Cluster)) {
    for _ in 0..10_000 {
        let next = w.c.state.tasks().values().find_map(|e| {
            let t = &e.task;
            let host = t.host_id.clone()?;
            let report = if t.desired_status == TaskStatus::Stopped {
                (t.last_status != TaskStatus::Stopped).then(|| TaskStateReport {
                    last_status: TaskStatus::Stopped,
                    stop_code: None,
                    ..report(TaskStatus::Stopped)
                })
            } else if t.last_status < TaskStatus::Running {
                Some(TaskStateReport { ready: Some(true), ..report(TaskStatus::Running) })
            } else if t.health_status == TaskHealth::Unknown {
                Some(if fails(&t.task_definition) {
                    TaskStateReport {
                        health_status: Some(TaskHealth::Unhealthy),
                        stop_code: Some(StopCode::Unhealthy),
                        stopped_reason: Some("health check of container c failed".into()),
                        ..report(TaskStatus::Stopped)
                    }
                } else {
                    TaskStateReport {
                        health_status: Some(TaskHealth::Healthy),
                        ..report(TaskStatus::Running)
                    }
                })
            } else {
                None
            };
            report.map(|r| (host, t.id, r))
        });
        let Some((host, id, r)) = next else { return };
        w.c.report_task(&host, &id.to_string(), r).unwrap();
        // The tick that follows: the services the report asked for are reconciled.
        w.c.run_work();
        w.advance(100);
        check(&w.c);
    }
    panic!("the agents never ran out of reports");
}

pub(super) fn report(status: TaskStatus) -> TaskStateReport {
    TaskStateReport {
        last_status: status,
        health_status: None,
        ready: None,
        stop_code: None,
        stopped_reason: None,
        output: None,
        containers: None,
        pull: None,
    }
}

fn service(w: &mut World, desired: u32, config: DeploymentConfiguration) {
    w.c.create_service(CreateService {
        name: "web".into(),
        pool: "p".into(),
        task_definition: "app:1".into(),
        desired_count: desired,
        deployment_configuration: Some(config),
        ..Default::default()
    })
    .unwrap();
    w.c.run_work();
}

fn update(w: &mut World, taskdef: &str) {
    let req = UpdateService { task_definition: Some(taskdef.into()), ..Default::default() };
    w.c.update_service("web", req).unwrap();
    w.c.run_work();
}

/// Healthy replicas and all live replicas of the service.
fn counts(c: &Cluster) -> (usize, usize) {
    let name = ServiceName::new("web").unwrap();
    let live: Vec<&Task> = c
        .state
        .tasks()
        .of_service(&name)
        .iter()
        .filter_map(|id| c.state.tasks().get(id))
        .map(|e| &e.task)
        .collect();
    let healthy = live.iter().filter(|t| c.read().replica_state(t) == ReplicaState::Healthy).count();
    (healthy, live.len())
}

use mpsfleet_core::deployment::ReplicaState;

#[test]
fn a_rolling_update_keeps_half_healthy_and_never_exceeds_the_desired_count() {
    let (mut w, _) = world(6);
    let config =
        DeploymentConfiguration { minimum_healthy_percent: 50, maximum_percent: 100, ..Default::default() };
    service(&mut w, 6, config);
    agents(&mut w, |_| false, &mut |_| {});
    assert_eq!(counts(&w.c), (6, 6));
    let first = w.c.read().service_deployments("web").unwrap();
    assert_eq!(first[0].deployment.rollout_state, RolloutState::Completed);

    update(&mut w, "app:2");
    let mut transitions = 0;
    let mut lowest = usize::MAX;
    agents(&mut w, |_| false, &mut |c| {
        let (healthy, live) = counts(c);
        transitions += 1;
        lowest = lowest.min(healthy);
        assert!(healthy >= 3, "{healthy} healthy after transition {transitions}");
        assert!(live <= 6, "{live} replicas after transition {transitions}");
    });
    assert_eq!(lowest, 3, "the rollout used the room its minimum gave it");
    assert!(transitions >= 12);
    let d = w.c.read().service_deployments("web").unwrap();
    assert_eq!(d[0].deployment.task_definition.to_string(), "app:2");
    assert_eq!(d[0].deployment.rollout_state, RolloutState::Completed);
    assert_eq!(d[0].healthy_count, 6);
    assert_eq!(d[1].deployment.status, DeploymentStatus::Inactive);
    let svc = w.c.read().service("web").unwrap().service;
    let reasons: Vec<&str> = svc.events.iter().map(|e| e.reason.as_str()).collect();
    for r in ["DeploymentStarted", "TasksReplaced", "TasksStarted", "DeploymentCompleted"] {
        assert!(reasons.contains(&r), "{r} missing from {reasons:?}");
    }
}

#[test]
fn failing_new_tasks_trip_the_breaker_and_roll_back() {
    let (mut w, _) = world(6);
    let breaker = CircuitBreaker { enable: true, rollback: true };
    let config = DeploymentConfiguration { deployment_circuit_breaker: breaker, ..Default::default() };
    service(&mut w, 4, config);
    agents(&mut w, |_| false, &mut |_| {});
    update(&mut w, "app:2");
    let mut lowest = usize::MAX;
    agents(&mut w, |td| td.revision == 2, &mut |c| lowest = lowest.min(counts(c).0));
    assert_eq!(lowest, 4, "the old tasks kept serving throughout");
    let d = w.c.read().service_deployments("web").unwrap();
    assert_eq!(d[0].deployment.task_definition.to_string(), "app:1", "{d:#?}");
    assert_eq!(d[0].deployment.rollout_state, RolloutState::Completed);
    let failed = d.iter().find(|d| d.deployment.task_definition.revision == 2).unwrap();
    assert_eq!(failed.deployment.rollout_state, RolloutState::Failed);
    assert_eq!(failed.deployment.failed_tasks, CircuitBreaker::threshold(4));
    assert_eq!(counts(&w.c), (4, 4));
    let svc = w.c.read().service("web").unwrap().service;
    assert_eq!(svc.task_definition.to_string(), "app:1");
    assert!(svc.events.iter().any(|e| e.reason == "DeploymentRolledBack"));
}

#[test]
fn a_tripped_breaker_without_rollback_starts_nothing_more() {
    let (mut w, _) = world(4);
    let breaker = CircuitBreaker { enable: true, rollback: false };
    let config = DeploymentConfiguration { deployment_circuit_breaker: breaker, ..Default::default() };
    service(&mut w, 2, config);
    agents(&mut w, |_| false, &mut |_| {});
    update(&mut w, "app:2");
    agents(&mut w, |td| td.revision == 2, &mut |_| {});
    w.advance(60_000);
    w.c.resync().unwrap();
    agents(&mut w, |td| td.revision == 2, &mut |_| {});
    let d = w.c.read().service_deployments("web").unwrap();
    assert_eq!(d[0].deployment.rollout_state, RolloutState::Failed);
    assert_eq!(d[0].deployment.failed_tasks, 3);
    assert_eq!(counts(&w.c), (2, 2), "the old tasks still run");
    // Why, where the user looks: the deployment's failure groups, the breaker's reason and the
    // service's events all name the tasks' stop reason.
    let why = "health check of container c failed";
    assert_eq!(d[0].deployment.failures.len(), 1, "{:#?}", d[0].deployment.failures);
    // Counted as they stop: a task started before the breaker tripped may fail after it.
    assert_eq!(d[0].deployment.failures[0].reason, why);
    assert!(d[0].deployment.failures[0].count >= 3, "{:#?}", d[0].deployment.failures);
    assert!(
        d[0].deployment.rollout_state_reason.ends_with(&format!("(threshold 3): 3 stopped: {why}")),
        "{}",
        d[0].deployment.rollout_state_reason
    );
    let svc = w.c.read().service("web").unwrap().service;
    let failed: Vec<&str> =
        svc.events.iter().filter(|e| e.reason == "TasksFailed").map(|e| e.message.as_str()).collect();
    assert_eq!(failed.first(), Some(&format!("1 task(s) of app:2 stopped: {why}").as_str()), "{failed:?}");
    assert_eq!(failed.get(2), Some(&format!("3 task(s) of app:2 stopped: {why}").as_str()), "{failed:?}");
    let tripped = svc.events.iter().find(|e| e.reason == "DeploymentFailed").unwrap();
    assert!(tripped.message.contains(why), "{}", tripped.message);
}

/// A service updated to a definition whose tasks fail their health check as soon as they
/// start, after five seconds of resyncs.
fn crash_looping() -> World {
    let (mut w, _) = world(2);
    service(&mut w, 2, DeploymentConfiguration::default());
    agents(&mut w, |_| false, &mut |_| {});
    update(&mut w, "app:2");
    agents(&mut w, |td| td.revision == 2, &mut |_| {});
    for _ in 0..5 {
        w.advance(1000);
        w.c.resync().unwrap();
        agents(&mut w, |td| td.revision == 2, &mut |_| {});
    }
    w
}

/// Tasks that fail as fast as they are started are held back, and the service's events say so
/// with the reason, once per hold, not once per resync.
#[test]
fn a_crash_loop_is_held_back_and_says_why() {
    let w = crash_looping();
    let svc = w.c.read().service("web").unwrap().service;
    let held: Vec<_> = svc.events.iter().filter(|e| e.reason == "ReplacementsHeldBack").collect();
    let failures = svc.events.iter().filter(|e| e.reason == "TasksFailed").count();
    assert!(!held.is_empty() && held.len() < failures, "{:#?}", svc.events);
    assert!(held.iter().all(|e| e.count == 1), "once per hold, not once per resync: {held:#?}");
    assert!(held[0].message.contains("(latest: health check of container c failed)"), "{}", held[0].message);
    assert_eq!(counts(&w.c), (2, 2), "the old tasks still run");
}

/// A held-back service asks for itself again when the hold-back's window has passed: the next
/// start comes from the work queue at a health tick, with no resync.
#[test]
fn a_held_back_service_starts_again_when_its_window_passes_without_a_resync() {
    let mut w = crash_looping();
    let events = |w: &World, reason: &str| {
        w.c.read()
            .service("web")
            .unwrap()
            .service
            .events
            .iter()
            .filter(|e| e.reason == reason)
            .map(|e| e.count)
            .sum::<u64>()
    };
    assert!(events(&w, "ReplacementsHeldBack") > 0);
    let tasks = |w: &World| w.c.state.tasks().values().count();
    let before = tasks(&w);
    // Only health ticks from here: nothing starts while the window holds, then a start comes.
    let mut waited = 0;
    while tasks(&w) == before {
        assert!(waited <= SERVICE_RESTART_WINDOW_MS + 1_000, "no start {waited} ms after the hold-back");
        w.advance(250);
        waited += 250;
        w.c.health_tick().unwrap();
    }
    assert!(waited > 5_000, "started {waited} ms after the last failure, inside the window");
    // Its key is not left queued (the unresolved incidents' keys requeue on their own).
    let keys = w.c.work.work_keys();
    assert!(!keys.iter().any(|k| k.starts_with("Service")), "{keys:?}");
}

#[test]
fn a_fenced_service_stops_each_task_before_its_replacement_starts() {
    let (mut w, _) = world(3);
    w.c.create_service(CreateService {
        name: "web".into(),
        pool: "p".into(),
        task_definition: "app:1".into(),
        desired_count: 3,
        resumption: Some(ResumptionBoundary::Fenced),
        ..Default::default()
    })
    .unwrap();
    w.c.run_work();
    agents(&mut w, |_| false, &mut |_| {});
    update(&mut w, "app:2");
    agents(&mut w, |_| false, &mut |c| assert!(counts(c).1 <= 3));
    let d = w.c.read().service_deployments("web").unwrap();
    assert_eq!(d[0].deployment.rollout_state, RolloutState::Completed);
    let svc = w.c.read().service("web").unwrap().service;
    let started = svc.events.iter().rfind(|e| e.reason == "DeploymentStarted").unwrap();
    assert!(
        started.message.contains("fenced: each old task stops before its replacement starts"),
        "{}",
        started.message
    );
}

#[test]
fn bad_deployment_configurations_name_their_field() {
    let (mut w, _) = world(1);
    for (config, field) in [
        (
            DeploymentConfiguration { minimum_healthy_percent: 101, ..Default::default() },
            "minimumHealthyPercent",
        ),
        (DeploymentConfiguration { maximum_percent: 99, ..Default::default() }, "maximumPercent"),
        (
            DeploymentConfiguration {
                deployment_circuit_breaker: CircuitBreaker { enable: false, rollback: true },
                ..Default::default()
            },
            "rollback",
        ),
    ] {
        let e =
            w.c.create_service(CreateService {
                name: "web".into(),
                pool: "p".into(),
                task_definition: "app:1".into(),
                desired_count: 1,
                deployment_configuration: Some(config),
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
    }
    assert!(w.c.read().services().is_empty());
}

/// A task no GPU of the pool could ever hold is refused at `task run`, `service create` and a
/// service's new definition, with the reason and nothing created; one that fits waits.
#[test]
fn a_task_larger_than_any_gpu_is_refused_with_the_reason() {
    let huge = br#"{"family": "huge", "containerDefinitions": [{"name": "c", "command": ["sleep", "1"],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 200000}}}]}]}"#;
    // A pool without hosts has nothing to judge by: the task waits.
    let (mut w, _) = world(0);
    w.c.register_taskdef(huge).unwrap();
    let run = |c: &mut Cluster, td: &str| {
        c.run_tasks(RunTask {
            task_definition: td.into(),
            count: 1,
            pool: "p".into(),
            client_token: None,
            ..Default::default()
        })
    };
    let waiting = run(&mut w.c, "huge").unwrap();
    assert_eq!(waiting.pending, 1);

    let (mut w, _) = world(2);
    w.c.register_taskdef(huge).unwrap();
    let before = w.c.tasks(&TaskFilter { limit: 100, ..Default::default() }).len();
    let e = run(&mut w.c, "huge").unwrap_err().to_string();
    assert!(e.contains("taskDefinition") && e.contains("200000 MiB") && e.contains("143771 MiB"), "{e}");
    let e =
        w.c.create_service(CreateService {
            name: "big".into(),
            pool: "p".into(),
            task_definition: "huge".into(),
            desired_count: 1,
            ..Default::default()
        })
        .unwrap_err();
    assert!(e.to_string().contains("can never be placed"), "{e}");
    service(&mut w, 1, DeploymentConfiguration::default());
    let e = w
        .c
        .update_service("web", UpdateService { task_definition: Some("huge".into()), ..Default::default() });
    w.c.run_work();
    assert!(e.unwrap_err().to_string().contains("can never be placed"));
    assert_eq!(w.c.read().service("web").unwrap().service.task_definition.to_string(), "app:1");
    assert_eq!(
        w.c.tasks(&TaskFilter { limit: 100, ..Default::default() }).len(),
        before + 1,
        "only the service's task"
    );
    assert!(run(&mut w.c, "app:1").is_ok());
}

/// After a daemon failure put every replica on the one GPU left, and the daemons came back,
/// the service moves its replicas back, never below its healthy minimum, until each is on a
/// host (and daemon) of its own: as soon as the hosts take tasks again, with no settle time of
/// its own. With room to surge (`maximumPercent` 200, the default) both moves are one step;
/// without (100), one replica at a time.
#[test]
fn replicas_spread_over_daemons_again_once_capacity_returns() {
    let surge = DeploymentConfiguration::default();
    let no_surge = DeploymentConfiguration { minimum_healthy_percent: 50, maximum_percent: 100, ..surge };
    for (config, steps, lowest_allowed) in [(surge, 1, 3), (no_surge, 2, 2)] {
        spread_again_after_a_failure(config, steps, lowest_allowed);
    }
}

fn spread_again_after_a_failure(config: DeploymentConfiguration, steps: usize, lowest_allowed: usize) {
    let (mut w, hosts) = world(3);
    service(&mut w, 3, config);
    agents(&mut w, |_| false, &mut |_| {});
    let gpus_of = |c: &Cluster| -> Vec<GpuUuid> {
        let name = ServiceName::new("web").unwrap();
        let mut g: Vec<GpuUuid> = c
            .state
            .tasks()
            .of_service(&name)
            .iter()
            .filter_map(|id| c.state.tasks().get(id))
            .filter(|e| e.task.desired_status != TaskStatus::Stopped)
            .flat_map(|e| e.task.gpu_ids.clone())
            .collect();
        g.sort();
        g
    };
    let mut distinct = gpus_of(&w.c);
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "spread from the start");

    // The daemons of hosts 1 and 2 fail: their tasks are refused and replaced on host 0.
    for h in &hosts[1..] {
        w.heartbeat(h, HealthStatus::Impaired);
        let on: Vec<TaskId> =
            w.c.state
                .tasks()
                .values()
                .filter(|e| e.task.host_id.as_ref() == Some(h))
                .map(|e| e.task.id)
                .collect();
        for id in on {
            let r = TaskStateReport {
                stop_code: Some(StopCode::MpsDaemonUnavailable),
                stopped_reason: Some("MPS daemon did not answer".into()),
                ..report(TaskStatus::Stopped)
            };
            w.c.report_task(h, &id.to_string(), r).unwrap();
        }
    }
    w.c.run_work();
    agents(&mut w, |_| false, &mut |_| {});
    let crowded = gpus_of(&w.c);
    assert_eq!(crowded.len(), 3);
    assert!(crowded.windows(2).all(|p| p[0] == p[1]), "all on host 0's GPU: {crowded:?}");

    // They answer again: with nothing else moving, each resync may move one replica, as the
    // server's loops run them, once the move before it has completed.
    for h in &hosts[1..] {
        w.heartbeat(h, HealthStatus::Ok);
    }
    let mut lowest = usize::MAX;
    for _ in 0..40 {
        w.advance(5_000);
        for h in &hosts {
            w.heartbeat(h, HealthStatus::Ok);
        }
        // The health tick opens a GPU whose daemon answers again; the resync reconciles.
        w.c.health_tick().unwrap();
        w.c.resync().unwrap();
        agents(&mut w, |_| false, &mut |c| lowest = lowest.min(counts(c).0));
    }
    let mut after = gpus_of(&w.c);
    after.dedup();
    assert_eq!(after.len(), 3, "one replica per daemon again");
    assert_eq!(lowest, lowest_allowed, "never below the minimum");
    assert_eq!(counts(&w.c), (3, 3));
    let svc = w.c.read().service("web").unwrap().service;
    let moved: Vec<_> = svc.events.iter().filter(|e| e.reason == "ReplicaMoved").collect();
    assert_eq!(moved.len(), steps, "{:#?}", svc.events);
    if steps == 1 {
        assert!(moved[0].message.starts_with("moving 2 tasks to spread"), "{moved:#?}");
    }
    // A move is told as a move, not as a replacement by a newer definition.
    assert!(svc.events.iter().any(|e| e.reason == "TasksMoved"), "{:#?}", svc.events);
    assert!(!svc.events.iter().any(|e| e.reason == "TasksReplaced"), "{:#?}", svc.events);
    assert!(svc.moving.is_empty());
}

/// A service bunched on one host (the others cordoned when it started) is spread by its next
/// rolling deployment: the new tasks spread among themselves while the old ones still run, so
/// the service is one replica per host the moment the deployment completes, with no move of
/// its own.
#[test]
fn a_bunched_service_is_spread_by_its_next_deployment() {
    let (mut w, hosts) = world(3);
    for h in &hosts[1..] {
        w.c.set_cordoned(h.as_str(), true).unwrap();
    }
    service(&mut w, 3, DeploymentConfiguration::default());
    agents(&mut w, |_| false, &mut |_| {});
    let hosts_of = |c: &Cluster| -> Vec<HostId> {
        let mut h: Vec<HostId> = of_web(c)
            .into_iter()
            .filter(|t| t.desired_status != TaskStatus::Stopped)
            .filter_map(|t| t.host_id)
            .collect();
        h.sort();
        h
    };
    assert_eq!(hosts_of(&w.c), vec![hosts[0].clone(); 3], "bunched on the one open host");
    for h in &hosts[1..] {
        w.c.set_cordoned(h.as_str(), false).unwrap();
    }
    update(&mut w, "app:2");
    let mut at_completion = None;
    agents(&mut w, |_| false, &mut |c| {
        let d = c.read().service_deployments("web").unwrap();
        if at_completion.is_none() && d[0].deployment.rollout_state == RolloutState::Completed {
            at_completion = Some(hosts_of(c));
        }
    });
    let mut spread = hosts.clone();
    spread.sort();
    assert_eq!(at_completion, Some(spread), "one replica per host when the deployment completes");
    let svc = w.c.read().service("web").unwrap().service;
    assert!(!svc.events.iter().any(|e| e.reason == "ReplicaMoved"), "{:#?}", svc.events);
    assert!(of_web(&w.c)
        .iter()
        .all(|t| t.deployment.as_deref() == Some("d-2") || t.desired_status == TaskStatus::Stopped));
}

#[test]
fn tasks_hosts_and_services_record_their_events_and_stream_them() {
    let (mut w, hosts) = world(1);
    let mut rx = w.c.events.subscribe();
    service(&mut w, 1, DeploymentConfiguration::default());
    agents(&mut w, |_| false, &mut |_| {});
    let task = w.c.state.tasks().values().next().unwrap().task.clone();
    let events = w.c.read().task_events(&task.id.to_string()).unwrap();
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Placed", "Started", "Ready", "Healthy"], "{events:?}");

    // A local daemon restart, as the agent's heartbeat counts it, lands in the host's
    // durable events.
    let gpu = w.c.state.hosts()[0].host().gpus[0].uuid.clone();
    let beat = |restarts| HostStatusReport {
        onboarded: true,
        checks: vec![HostCheck {
            name: "MPS_DAEMON".into(),
            gpu_id: Some(gpu.clone()),
            status: HealthStatus::Ok,
            reason: "answering".into(),
            since_ms: 5,
            restarts,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        }],
        checks_rev: None,
        checks_unchanged: false,
        logs_url: None,
        logs_cert_sha256: None,
        trusted_ca_sha256: Vec::new(),
        gpu_use: Vec::new(),
        heartbeat_ms: None,
        accepts_faults: false,
    };
    w.c.host_status(&hosts[0], &beat(0)).unwrap();
    w.c.host_status(&hosts[0], &beat(1)).unwrap();
    w.c.host_status(&hosts[0], &beat(1)).unwrap();
    let host = w.c.read().host(hosts[0].as_str()).unwrap();
    let restarted: Vec<_> = host.events.iter().filter(|e| e.reason == "DaemonRestarted").collect();
    assert_eq!(restarted.len(), 1, "{:?}", host.events);
    assert!(restarted[0].message.contains(gpu.as_str()), "{}", restarted[0].message);
    let stored: Host = decode(&w.c.store.get(HOST, hosts[0].as_str()).unwrap().unwrap()).unwrap();
    assert_eq!(stored.events, host.events, "host events are in the stored record");

    // The stream saw all three kinds.
    let mut kinds = BTreeSet::new();
    while let Ok(ev) = rx.try_recv() {
        if let Some(s) = &ev.subject {
            kinds.insert((ev.kind.as_str(), s.id.clone(), ev.event.unwrap().reason));
        }
    }
    let task_id = task.id.to_string();
    assert!(kinds.contains(&("task.event", task_id.clone(), "Started".into())), "{kinds:?}");
    assert!(kinds.contains(&("service.event", "web".into(), "DeploymentCompleted".into())), "{kinds:?}");
    assert!(kinds.contains(&("host.event", hosts[0].to_string(), "DaemonRestarted".into())), "{kinds:?}");
}

/// A store that fails one commit once told how many to let pass first.
struct FlakyStore {
    inner: mpsfleet_store::MemoryStore,
    /// Commits to let pass before the one that fails; negative: none fails.
    pass: std::sync::atomic::AtomicI64,
}

impl mpsfleet_store::Store for FlakyStore {
    fn get(
        &self,
        kind: &str,
        key: &str,
    ) -> Result<Option<mpsfleet_store::Record>, mpsfleet_store::StoreError> {
        self.inner.get(kind, key)
    }
    fn list(&self, kind: &str) -> Result<Vec<mpsfleet_store::Record>, mpsfleet_store::StoreError> {
        self.inner.list(kind)
    }
    fn commit(&self, ops: &[Op]) -> Result<Revision, mpsfleet_store::StoreError> {
        if self.pass.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            return Err(mpsfleet_store::StoreError::Backend { op: "commit", message: "disk full".into() });
        }
        self.inner.commit(ops)
    }
    fn revision(&self) -> Result<Revision, mpsfleet_store::StoreError> {
        self.inner.revision()
    }
    fn changes_since(
        &self,
        after: Revision,
        limit: usize,
    ) -> Result<Vec<mpsfleet_store::Change>, mpsfleet_store::StoreError> {
        self.inner.changes_since(after, limit)
    }
    fn wait_for_revision(
        &self,
        after: Revision,
        timeout: std::time::Duration,
    ) -> Result<Revision, mpsfleet_store::StoreError> {
        self.inner.wait_for_revision(after, timeout)
    }
    fn compact(&self, before: Revision) -> Result<(), mpsfleet_store::StoreError> {
        self.inner.compact(before)
    }
}

/// A service change answers once its own commit is done and never runs the service's
/// reconcile itself: it asks for the service's key and wakes the controllers' pass, which
/// does the rest; a reconcile whose commit fails is tried again after its backoff. A create
/// places its first tasks in its own commit, so its answer shows them, as RunTask's does.
#[test]
fn a_service_change_answers_once_committed_and_leaves_the_rest_to_the_controller() {
    let store = Arc::new(FlakyStore {
        inner: mpsfleet_store::MemoryStore::new(),
        pass: std::sync::atomic::AtomicI64::new(-1),
    });
    let clock = Arc::new(mpsfleet_core::clock::ManualClock::new(1_000_000));
    let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
    c.create_pool(CreatePool { name: "p".into(), ..Default::default() }).unwrap();
    let td = r#"{"family": "app", "containerDefinitions": [{"name": "c", "command": ["sleep", "3600"]}]}"#;
    c.register_taskdef(td.as_bytes()).unwrap();
    let req = CreateService {
        name: "web".into(),
        pool: "p".into(),
        task_definition: "app".into(),
        desired_count: 1,
        ..Default::default()
    };
    let before = c.read().revision();
    let view = c.create_service(req).expect("create");
    assert_eq!(c.read().revision(), before + 1, "the service and its first task are one commit");
    assert_eq!(view.pending_count, 1, "the answer shows its task");
    let name = ServiceName::new("web").unwrap();
    assert_eq!(c.state.tasks().of_service(&name).len(), 1);
    assert!(c.take_wake(), "the request wakes the controllers' pass");
    c.run_work();

    // The update's own commit passes; the next one, its reconcile's, fails.
    store.pass.store(1, std::sync::atomic::Ordering::SeqCst);
    let view = c.update_service("web", UpdateService { desired_count: Some(2), ..Default::default() });
    assert_eq!(view.expect("the request answers: its change is committed").service.desired_count, 2);
    assert_eq!(c.state.tasks().of_service(&name).len(), 1, "the request started nothing itself");
    assert!(c.work.work_keys().iter().any(|k| k.starts_with("Service")), "{:?}", c.work.work_keys());
    assert!(c.take_wake(), "the request wakes the controllers' pass");
    c.run_work();
    assert_eq!(c.state.tasks().of_service(&name).len(), 1, "the reconcile's commit failed");
    assert!(c.work.work_keys().iter().any(|k| k.starts_with("Service")), "{:?}", c.work.work_keys());
    clock.advance(std::time::Duration::from_secs(60));
    c.run_work();
    assert_eq!(c.state.tasks().of_service(&name).len(), 2, "the work queue started its task");
}

/// Capacity coming back (hosts uncordoned) asks the pool's services at once: a service bunched
/// on one host starts moving a replica on the next pass of the work queue, not at its next
/// periodic resync.
#[test]
fn capacity_back_asks_the_services_to_spread_at_once() {
    let (mut w, hosts) = world(3);
    for h in &hosts[1..] {
        w.c.set_cordoned(h.as_str(), true).unwrap();
    }
    service(&mut w, 3, DeploymentConfiguration::default());
    agents(&mut w, |_| false, &mut |_| {});
    let moves = |c: &Cluster| {
        c.read().service("web").unwrap().service.events.iter().filter(|e| e.reason == "ReplicaMoved").count()
    };
    assert_eq!(moves(&w.c), 0);
    for h in &hosts[1..] {
        w.c.set_cordoned(h.as_str(), false).unwrap();
    }
    // No resync: only what the uncordon asked for.
    w.c.run_work();
    assert_eq!(moves(&w.c), 1, "{:#?}", w.c.read().service("web").unwrap().service.events);
}

/// A replica an incident moves (here an operator's drain) is told in its service's events:
/// which task went where, and which incident moved it.
#[test]
fn a_replica_moved_by_an_incident_is_in_its_services_events() {
    let (mut w, hosts) = world(2);
    service(&mut w, 2, DeploymentConfiguration::default());
    agents(&mut w, |_| false, &mut |_| {});
    let first = of_web(&w.c);
    let drained = first[0].host_id.clone().unwrap();
    w.c.operator_action(drained.as_str(), OperatorAction::Drain, "admin").unwrap();
    w.c.run_work();
    agents(&mut w, |_| false, &mut |_| {});
    let events = w.c.read().service("web").unwrap().service.events;
    let moved: Vec<&str> =
        events.iter().filter(|e| e.reason == "TasksMovedByIncident").map(|e| e.message.as_str()).collect();
    assert_eq!(moved.len(), 1, "{events:#?}");
    assert!(
        moved[0].contains(&format!("off host {drained}")) && moved[0].contains(&first[0].id.to_string()),
        "{moved:?}"
    );
    assert!(hosts.iter().any(|h| h != &drained && moved[0].contains(h.as_str())), "{moved:?}");
}

/// The live tasks of the service `web`.
pub(super) fn of_web(c: &Cluster) -> Vec<Task> {
    let name = ServiceName::new("web").unwrap();
    c.state
        .tasks()
        .of_service(&name)
        .iter()
        .filter_map(|id| c.state.tasks().get(id))
        .map(|e| e.task.clone())
        .filter(|t| t.desired_status != TaskStatus::Stopped)
        .collect()
}

/// A protected task is neither scaled in nor replaced until its protection ends; then it is.
#[test]
fn a_protected_task_outlives_scale_in_and_deployments_until_it_expires() {
    let (mut w, _) = world(3);
    service(&mut w, 3, DeploymentConfiguration::default());
    agents(&mut w, |_| false, &mut |_| {});
    let name = ServiceName::new("web").unwrap();
    let ids: Vec<TaskId> = w.c.state.tasks().of_service(&name).iter().copied().collect();
    let kept = ids[0].to_string();
    w.c.protect_tasks(std::slice::from_ref(&kept), true, Some(10)).unwrap();
    let e = w.c.protect_tasks(std::slice::from_ref(&kept), true, Some(0)).unwrap_err().to_string();
    assert!(e.contains("expiresInMinutes"), "{e}");

    w.c.update_service("web", UpdateService { desired_count: Some(1), ..Default::default() }).unwrap();
    w.c.run_work();
    agents(&mut w, |_| false, &mut |_| {});
    let live =
        |w: &World| w.c.state.tasks().of_service(&name).iter().map(|t| t.to_string()).collect::<Vec<_>>();
    assert_eq!(live(&w), std::slice::from_ref(&kept), "scale-in stops the unprotected ones");
    update(&mut w, "app:2");
    agents(&mut w, |_| false, &mut |_| {});
    assert!(live(&w).contains(&kept), "a deployment does not replace it while protected");
    // Ten minutes on: the service's wake-up replaces it.
    w.advance(10 * 60_000 + 1);
    w.c.run_work();
    agents(&mut w, |_| false, &mut |_| {});
    assert!(!live(&w).contains(&kept), "{:?}", live(&w));
    assert_eq!(counts(&w.c), (1, 1));
}

/// A service discovery cannot publish says so in its events when it is created: a name that
/// is not a DNS label, or one another service of its pool has but for case.
#[test]
fn a_service_dns_cannot_publish_says_why() {
    let (mut w, _) = world(1);
    let create = |w: &mut World, name: &str| {
        let req = CreateService {
            name: name.into(),
            pool: "p".into(),
            task_definition: "app:1".into(),
            desired_count: 0,
            ..Default::default()
        };
        w.c.create_service(req).unwrap().service.events
    };
    let said = |events: &mpsfleet_types::History<ObjectEvent>| {
        events.iter().filter(|e| e.reason == "NotInDiscovery").map(|e| e.message.clone()).collect::<Vec<_>>()
    };
    assert_eq!(said(&create(&mut w, "web")), Vec::<String>::new());
    let twin = said(&create(&mut w, "Web"));
    assert!(
        matches!(&twin[..], [m] if m.contains("service web of pool p has the same name but for case")),
        "{twin:?}"
    );
    let underscore = said(&create(&mut w, "api_v2"));
    assert!(
        matches!(&underscore[..], [m] if m.contains("\"api_v2\"") && m.contains("not a DNS label")),
        "{underscore:?}"
    );
}

/// A replica that takes traffic counts as started only while discovery publishes it: when its
/// host goes silent (heartbeats missed, long before any incident) its rollout counts it as
/// starting, and healthy again once the host is heard; a replica without ports is not touched.
#[test]
fn a_replica_counts_as_started_only_while_it_is_in_discovery() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let mut reg = w.registration("h");
    reg.runtime = mpsfleet_types::RuntimeKind::Docker;
    let host = w.c.register_host(reg).unwrap().host_id;
    w.heartbeat(&host, HealthStatus::Ok);
    for (family, ports) in [("web", r#""portMappings": [{"containerPort": 8080}],"#), ("batch", "")] {
        let td = format!(
            r#"{{"family": "{family}", "containerDefinitions": [{{"name": "c", "image": "demo", {ports}
                "resourceRequirements": [{{"type": "GPU",
                    "sharingStrategy": {{"nvidiaMps": {{"memory": 1000, "maxComputePercent": 10}}}}}}]}}]}}"#
        );
        w.c.register_taskdef(td.as_bytes()).unwrap();
        let req = CreateService {
            name: family.into(),
            pool: "p".into(),
            task_definition: format!("{family}:1"),
            desired_count: 1,
            ..Default::default()
        };
        w.c.create_service(req).unwrap();
    }
    w.c.run_work();
    agents(&mut w, |_| false, &mut |_| {});
    let states = |c: &Cluster| -> Vec<ReplicaState> {
        ["web", "batch"]
            .iter()
            .map(|s| {
                let svc = c.state.services().get(&ServiceName::new(*s).unwrap()).unwrap().value.clone();
                let replicas = c.read().replicas(&svc);
                assert_eq!(replicas.len(), 1, "{s}: {replicas:?}");
                replicas[0].state
            })
            .collect()
    };
    assert_eq!(states(&w.c), [ReplicaState::Healthy, ReplicaState::Healthy]);
    // Three heartbeats missed: the replica with a port is out of discovery, and so not started.
    w.advance(3_500);
    let web = of_service(&w.c, "web");
    assert!(w.c.read().discovered(&web).is_none(), "out of discovery");
    assert_eq!(states(&w.c), [ReplicaState::Starting, ReplicaState::Healthy]);
    // Heard again: in discovery and started again.
    w.heartbeat(&host, HealthStatus::Ok);
    assert_eq!(states(&w.c), [ReplicaState::Healthy, ReplicaState::Healthy]);
}

fn of_service(c: &Cluster, name: &str) -> Task {
    let name = ServiceName::new(name).unwrap();
    let id = *c.state.tasks().of_service(&name).iter().next().unwrap();
    c.state.tasks().get(&id).unwrap().task.clone()
}
