//! Drills on the server, in virtual time, with the agents' side played by the test: the
//! safety conditions refuse with their reasons, a dry run changes nothing, a managed drill
//! runs to its verdict through the real remediation path, and a stop condition aborts one.

use super::drills::DrillStarted;
use super::recovery_tests::{launch_token, World};
use super::*;
use mpsfleet_types::drill::*;

fn req(fault: &str) -> CreateDrill {
    CreateDrill { pool: "p".into(), fault: fault.into(), ..Default::default() }
}

fn conflict(w: &mut World, r: CreateDrill) -> String {
    match w.c.start_drill(r, "admin") {
        Err(Error::Conflict(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A managed pool of `n` healthy hosts whose agents accept faults (or not).
fn pool_of(n: usize, accept: bool) -> (World, Vec<HostId>) {
    let mut w = World::new(OwnershipMode::Managed);
    w.accepts_faults = accept;
    let up = UpdatePool {
        provider: Some(Provider { launch_timeout_seconds: Some(60), ..Provider::local(n as u32) }),
        remediation_policy: Some(RemediationPolicy { storm_breaker_percent: 50, ..Default::default() }),
        ..Default::default()
    };
    w.c.update_pool("p", up).unwrap();
    let join = w.join_token.clone();
    let hosts: Vec<HostId> = (0..n).map(|i| w.join(&format!("h{i}"), &join).unwrap()).collect();
    let ok: Vec<(HostId, HealthStatus)> = hosts.iter().map(|h| (h.clone(), HealthStatus::Ok)).collect();
    w.run(2, &ok, |_| ProviderOutcome::Done);
    (w, hosts)
}

#[test]
fn the_safety_conditions_refuse_with_their_reasons() {
    let (mut w, hosts) = pool_of(2, false);
    let why = conflict(&mut w, req("daemon-exit"));
    assert!(
        why.contains("do not accept injected faults") && why.contains("--allow-fault-injection"),
        "{why}"
    );
    w.accepts_faults = true;
    let ok: Vec<(HostId, HealthStatus)> = hosts.iter().map(|h| (h.clone(), HealthStatus::Ok)).collect();
    w.run(1, &ok, |_| ProviderOutcome::Done);
    // Two healthy hosts: one may be struck, never both.
    let why = conflict(&mut w, CreateDrill { hosts: Some("2".into()), ..req("daemon-exit") });
    assert!(why.contains("never strikes a pool's last healthy host") && why.contains("at most 1"), "{why}");
    let why = conflict(&mut w, CreateDrill { hosts: Some("100%".into()), ..req("daemon-exit") });
    assert!(why.contains("at most 1, not 2"), "{why}");
    let e =
        w.c.start_drill(CreateDrill { hosts: Some("0".into()), ..req("daemon-exit") }, "admin").unwrap_err();
    assert!(matches!(&e, Error::InvalidParameter { field, .. } if field == "hosts"), "{e:?}");
    let e = w.c.start_drill(req("melt"), "admin").unwrap_err();
    assert!(
        e.to_string().contains("fault: must be one of daemon-exit, daemon-hang, agent-stop, gpu-check-fail"),
        "{e}"
    );
    // The switch blocks new drills, and says how to allow them again.
    w.c.set_drill_switch(false, "admin").unwrap();
    let why = conflict(&mut w, req("daemon-exit"));
    assert!(why.contains("switched off cluster-wide") && why.contains("drill switch on"), "{why}");
    w.c.set_drill_switch(true, "admin").unwrap();
    // A dry run names a target and the expected timeline, and stores nothing.
    let plan = match w.c.start_drill(CreateDrill { dry_run: true, ..req("daemon-hang") }, "admin").unwrap() {
        DrillStarted::Plan(p) => p,
        DrillStarted::Started(d) => panic!("a dry run started {d:?}"),
    };
    assert_eq!(plan.targets.len(), 1);
    assert!(plan.expected.iter().any(|l| l.contains("detected")), "{:?}", plan.expected);
    assert!(w.c.read().drills().is_empty());
    assert!(hosts.iter().all(|h| faults_for(&w.c.state, h).is_empty()));
    // An open incident in the pool refuses a drill.
    w.run(5, &[(hosts[0].clone(), HealthStatus::Impaired), (hosts[1].clone(), HealthStatus::Ok)], |_| {
        ProviderOutcome::Done
    });
    assert!(!w.c.read().incidents().is_empty());
    let why = conflict(&mut w, req("daemon-exit"));
    assert!(why.contains("is open in pool p"), "{why}");
}

/// The agent's part played by the test: while the target's heartbeat answer carries the
/// fault, the target reports its daemon IMPAIRED. The pool's owner replaces the host as for
/// a real failure; the drill ends within its bounds, its incident marked as the drill's.
#[test]
fn a_managed_drill_runs_to_its_verdict_through_the_real_remediation() {
    let (mut w, hosts) = pool_of(3, true);
    let d = match w.c.start_drill(req("daemon-exit"), "admin").unwrap() {
        DrillStarted::Started(d) => *d,
        DrillStarted::Plan(p) => panic!("{p:?}"),
    };
    assert_eq!((d.status, d.owner.as_str(), d.targets.len()), (DrillStatus::Running, "mpsfleet", 1));
    let target = d.targets[0].host_id.clone();
    let faults = faults_for(&w.c.state, &target);
    assert_eq!(faults.len(), 1);
    assert_eq!(
        (faults[0].fault, faults[0].persistent, &faults[0].drill),
        (DrillFault::DaemonExit, true, &d.id)
    );
    assert!(hosts.iter().filter(|h| **h != target).all(|h| faults_for(&w.c.state, h).is_empty()));

    let mut beats: Vec<(HostId, HealthStatus)> = hosts
        .iter()
        .map(|h| (h.clone(), if *h == target { HealthStatus::Impaired } else { HealthStatus::Ok }))
        .collect();
    let jobs = w.run(6, &beats, |_| ProviderOutcome::Done);
    let incident = w.c.read().incidents().into_iter().find(|i| i.host_id == target).expect("an incident");
    assert_eq!(incident.drill.as_deref(), Some(d.id.as_str()), "marked as the drill's");
    // The replacement joins with its token; the old host is terminated.
    let token = launch_token(&jobs).expect("a replacement launched");
    let r = w.join("replacement", &token).unwrap();
    beats.push((r, HealthStatus::Ok));
    w.run(10, &beats, |_| ProviderOutcome::Done);
    let done = w.c.read().drill(&d.id).unwrap();
    assert_eq!(done.status, DrillStatus::Ended, "{done:#?}");
    assert_eq!(done.verdict, Some(DrillVerdict::WithinBounds), "{:#?}", done.phases);
    assert_eq!(done.incidents, std::slice::from_ref(&incident.id));
    assert!(!done.phases.is_empty());
    assert!(faults_for(&w.c.state, &target).is_empty(), "the fault is taken back");
    let reasons: Vec<String> =
        w.c.read().pool("p").unwrap().events.iter().map(|e| e.event.reason.clone()).collect();
    assert!(
        reasons.contains(&"DrillStarted".into()) && reasons.contains(&"DrillEnded".into()),
        "{reasons:?}"
    );
}

/// Another host of the pool failing while a drill runs aborts it, naming the incident; the
/// fault is taken back and the verdict says why.
#[test]
fn another_incident_aborts_a_running_drill() {
    let (mut w, hosts) = pool_of(3, true);
    let d = match w.c.start_drill(CreateDrill { once: true, ..req("daemon-hang") }, "admin").unwrap() {
        DrillStarted::Started(d) => *d,
        DrillStarted::Plan(p) => panic!("{p:?}"),
    };
    assert!(!faults_for(&w.c.state, &d.targets[0].host_id)[0].persistent, "--once");
    let other = hosts.iter().find(|h| **h != d.targets[0].host_id).unwrap().clone();
    let beats: Vec<(HostId, HealthStatus)> = hosts
        .iter()
        .map(|h| (h.clone(), if *h == other { HealthStatus::Impaired } else { HealthStatus::Ok }))
        .collect();
    w.run(6, &beats, |_| ProviderOutcome::Done);
    let done = w.c.read().drill(&d.id).unwrap();
    match &done.verdict {
        Some(DrillVerdict::Aborted { condition }) => {
            assert!(condition.contains("which the drill did not strike"), "{condition}")
        }
        other => panic!("{other:?}: {done:#?}"),
    }
    assert!(faults_for(&w.c.state, &d.targets[0].host_id).is_empty());
    assert!(
        w.c.read().incidents().iter().all(|i| i.drill.is_none()),
        "the other host's incident is not the drill's"
    );
}
