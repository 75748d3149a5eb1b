//! Restart copies: a `restart` service's replicas on a failed MPS daemon get copies on
//! healthy daemons, at the daemon's first exit or once its failure is confirmed (the pool's
//! `restartCopies`), and the extras stop, newest first, once the daemon answers again.

use super::recovery_tests::World;
use super::service_tests::{agents, of_web, world};
use super::*;
use mpsfleet_types::policy::RestartCopies;

/// Once a daemon's failure is confirmed (its check IMPAIRED), a `restart` service starts
/// copies of its tasks on that daemon elsewhere at once, while local repair goes on; when the
/// daemon answers again, the service is above its count and stops the extras, the newest
/// first. A `fenced` service starts nothing until its host's incident says the old copies are
/// gone.
#[test]
fn a_confirmed_daemon_failure_starts_restart_copies_elsewhere_and_repair_stops_the_extras() {
    for resumption in [ResumptionBoundary::Restart, ResumptionBoundary::Fenced] {
        let (mut w, _) = world(2);
        start_web(&mut w, Some(resumption));
        let first: Vec<Task> = of_web(&w.c);
        assert_eq!(first.len(), 2);
        let failed = first[0].host_id.clone().unwrap();
        let on_failed = first.iter().filter(|t| t.host_id.as_ref() == Some(&failed)).count();

        w.heartbeat(&failed, HealthStatus::Impaired);
        w.c.run_work();
        agents(&mut w, |_| false, &mut |_| {});
        let live: Vec<Task> = of_web(&w.c);
        let elsewhere = live.iter().filter(|t| t.host_id.as_ref() != Some(&failed)).count();
        match resumption {
            ResumptionBoundary::Restart => {
                assert_eq!(elsewhere, 2, "{resumption:?}: {live:#?}");
                assert_eq!(live.len(), 2 + on_failed, "the old copies run on while repair tries");
                // Its events say why it runs above its count.
                let events = w.c.read().service("web").unwrap().service.events;
                assert!(
                    events.iter().any(|e| e.reason == "TasksStarted"
                        && e.message.contains(&format!("for {on_failed} replica(s) on a failed MPS daemon"))),
                    "{events:#?}"
                );
            }
            ResumptionBoundary::Fenced => assert_eq!(live.len(), 2, "{resumption:?}: {live:#?}"),
        }

        // Local repair works: the daemon answers again, and the extras go, the newest first.
        repaired_keeps_the_first(&mut w, &failed, &first, &format!("{resumption:?}"));
    }
}

/// With `restartCopies: first-exit` (the default) a daemon's first exit, which local repair
/// answers with a restart at once (the check still OK, its failure's first signal and one
/// repair reported), starts the copies; with `confirmed` it starts none until the check is
/// IMPAIRED. Once the daemon has answered its probes again (no failure reported), the extras
/// stop, the newest first.
#[test]
fn a_first_exit_starts_restart_copies_only_where_the_pool_says_so() {
    for policy in [RestartCopies::FirstExit, RestartCopies::Confirmed] {
        let (mut w, _) = world(2);
        w.c.update_pool("p", UpdatePool { restart_copies: Some(policy), ..Default::default() }).unwrap();
        start_web(&mut w, None);
        let first: Vec<Task> = of_web(&w.c);
        let failed = first[0].host_id.clone().unwrap();
        let on_failed = first.iter().filter(|t| t.host_id.as_ref() == Some(&failed)).count();

        exited_once(&mut w, &failed);
        if policy == RestartCopies::FirstExit {
            assert!(w.c.take_wake(), "the exit wakes the controllers' pass");
        }
        w.c.run_work();
        agents(&mut w, |_| false, &mut |_| {});
        let live: Vec<Task> = of_web(&w.c);
        let elsewhere: Vec<&Task> = live.iter().filter(|t| t.host_id.as_ref() != Some(&failed)).collect();
        match policy {
            RestartCopies::FirstExit => {
                assert_eq!(elsewhere.len(), 2, "{live:#?}");
                assert_eq!(live.len(), 2 + on_failed, "the old copies run on while repair tries");
                let copies = elsewhere.iter().filter(|t| !first.iter().any(|f| f.id == t.id));
                assert!(copies.clone().all(|t| t.recovery_from.as_ref() == Some(&failed)), "{live:#?}");
            }
            RestartCopies::Confirmed => assert_eq!(live.len(), 2, "no copy before confirmation: {live:#?}"),
        }

        // Repaired: the daemon answers and the agent reports no failure any more.
        repaired_keeps_the_first(&mut w, &failed, &first, &format!("{policy:?}"));
    }
}

/// The host's daemon answers again with no failure reported: the extras stop, the newest
/// first, and `web` runs exactly its `first` replicas.
/// Service "web" (2 replicas of app:1 in pool "p"), its replicas placed and RUNNING.
fn start_web(w: &mut World, resumption: Option<ResumptionBoundary>) {
    w.c.create_service(CreateService {
        name: "web".into(),
        pool: "p".into(),
        task_definition: "app:1".into(),
        desired_count: 2,
        resumption,
        ..Default::default()
    })
    .unwrap();
    w.c.run_work();
    agents(w, |_| false, &mut |_| {});
}

fn repaired_keeps_the_first(w: &mut World, failed: &HostId, first: &[Task], case: &str) {
    w.heartbeat(failed, HealthStatus::Ok);
    w.c.run_work();
    agents(w, |_| false, &mut |_| {});
    let mut live: Vec<TaskId> = of_web(&w.c).into_iter().map(|t| t.id).collect();
    live.sort();
    let mut kept: Vec<TaskId> = first.iter().map(|t| t.id).collect();
    kept.sort();
    assert_eq!(live, kept, "{case}: the first copies stay, the newer ones stopped");
}

/// A heartbeat right after the host's daemon exited once: the check OK (one failure, under
/// the threshold), its failure's first signal and the local restart it made at once.
fn exited_once(w: &mut World, host: &HostId) {
    let check = HostCheck {
        reason: "daemon exited: killed by signal 9".into(),
        restarts: 1,
        first_failure_age_ms: Some(0),
        repair_ages_ms: vec![0],
        ..w.mps_check(host, HealthStatus::Ok)
    };
    let report = w.report(vec![check]);
    w.c.host_status(host, &report).unwrap();
}

/// An incident's named replacement that stops before it runs (here an operator's stop; a
/// service's scale-in of one too many does the same) is followed no further: once the service
/// runs its count again without it, off the bad host, the incident records its tasks RUNNING
/// again instead of waiting on the stopped one for ever.
#[test]
fn an_incident_whose_replacement_stopped_resumes_once_its_service_is_at_count() {
    let mut w = World::new(OwnershipMode::Managed);
    let join = w.join_token.clone();
    let hosts: Vec<HostId> = ["a", "b", "c"].iter().map(|h| w.join(h, &join).unwrap()).collect();
    let td = r#"{"family": "app", "containerDefinitions": [{"name": "c", "command": ["sleep", "3600"],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1000}}}]}]}"#;
    w.c.register_taskdef(td.as_bytes()).unwrap();
    start_web(&mut w, None);
    let bad = of_web(&w.c)[0].host_id.clone().unwrap();
    let heartbeats = |s: HealthStatus| -> Vec<(HostId, HealthStatus)> {
        hosts.iter().map(|h| (h.clone(), if *h == bad { s } else { HealthStatus::Ok })).collect()
    };
    // The daemon fails for good: the incident opens and moves the replicas off the host.
    w.run(5, &heartbeats(HealthStatus::Impaired), |_| ProviderOutcome::Done);
    let i = w.only_incident();
    let named: Vec<TaskId> = i.affected_tasks.iter().filter_map(|a| a.replacement).collect();
    assert!(!named.is_empty(), "{i:#?}");
    // The replacements are stopped before they run; the service starts others.
    for r in &named {
        w.c.stop_task(&r.to_string(), Some("not this one".into())).unwrap();
    }
    w.run(2, &heartbeats(HealthStatus::Impaired), |_| ProviderOutcome::Done);
    agents(&mut w, |_| false, &mut |_| {});
    w.run(2, &heartbeats(HealthStatus::Impaired), |_| ProviderOutcome::Done);
    let live = of_web(&w.c);
    assert!(live.iter().filter(|t| t.host_id.as_ref() != Some(&bad)).count() >= 2, "{live:#?}");
    let i = w.only_incident();
    assert!(i.has(Step::TasksRunningAgain), "{:#?}", i.timeline);
    let resumed = i.resumed_at_ms.expect("resumed");
    let started = live.iter().filter_map(|t| t.started_at_ms).max().unwrap();
    assert!(resumed <= started, "resumed {resumed}, the replicas started by {started}");
}
