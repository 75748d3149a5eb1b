//! Recovery bounds on the server, in virtual time: a policy change moves the bounds and is
//! recorded, `maxResumeSeconds` refuses a policy that cannot meet it, and an incident whose
//! phase runs past its bound records the breach once, with its cause, on the incident and in
//! the pool's events.

use super::recovery_tests::World;
use super::*;
use mpsfleet_types::bounds::{BreachCause, FailureKind, IncidentBounds, PhaseVerdict, RecoveryPhase};

fn with_provider(launch_timeout_seconds: u32) -> UpdatePool {
    UpdatePool {
        provider: Some(Provider {
            launch_timeout_seconds: Some(launch_timeout_seconds),
            ..Provider::local(1)
        }),
        ..Default::default()
    }
}

#[test]
fn a_policy_change_moves_the_bounds_and_is_recorded() {
    let mut w = World::new(OwnershipMode::Managed);
    let before = w.c.read().pool_bounds("p").unwrap();
    let health = HealthPolicy { mps_probe_interval_ms: 7_000, ..HealthPolicy::default() };
    let p = w.c.update_pool("p", UpdatePool { health_policy: Some(health), ..Default::default() }).unwrap();
    let after = w.c.read().pool_bounds("p").unwrap();
    let hang = |b: &mpsfleet_types::RecoveryBounds| b.of(FailureKind::DaemonHang).unwrap().detect_ms;
    // Two more seconds for each of the (threshold - 1) intervals before the check turns IMPAIRED.
    assert_eq!(hang(&after) - hang(&before), 2 * 2_000);
    let exit = |b: &mpsfleet_types::RecoveryBounds| b.of(FailureKind::DaemonExit).unwrap().detect_ms;
    assert_eq!(exit(&after), exit(&before));
    let last = p.events.iter().last().expect("an event");
    assert_eq!(last.event.reason, "BoundsChanged");
    assert!(last.event.message.contains("daemon-hang detect 16.5s -> 20.5s"), "{}", last.event.message);
    // The same policy again changes nothing and records nothing.
    let again = w
        .c
        .update_pool("p", UpdatePool { health_policy: Some(p.health_policy.clone()), ..Default::default() });
    assert_eq!(again.unwrap().events.len(), p.events.len());
}

#[test]
fn max_resume_seconds_refuses_a_policy_that_cannot_meet_it() {
    let mut w = World::new(OwnershipMode::Managed);
    let err =
        w.c.update_pool("p", UpdatePool { max_resume_seconds: Some(20), ..Default::default() }).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("maxResumeSeconds: the pool's policy bounds"), "{text}");
    assert!(text.contains("(daemon-hang), more than maxResumeSeconds (20s)"), "{text}");
    assert_eq!(w.c.read().pool("p").unwrap().max_resume_seconds, None, "nothing changed");
    // Within it: accepted; a policy that would then exceed it is refused, naming the limit.
    w.c.update_pool("p", UpdatePool { max_resume_seconds: Some(60), ..Default::default() }).unwrap();
    let slow = HealthPolicy { agent_heartbeat_grace_ms: 60_000, ..HealthPolicy::default() };
    let err =
        w.c.update_pool("p", UpdatePool { health_policy: Some(slow), ..Default::default() }).unwrap_err();
    assert!(err.to_string().contains("(agent-lost), more than maxResumeSeconds (1m)"), "{err}");
    let err = w.c.update_pool("p", UpdatePool { max_resume_seconds: Some(86_401), ..Default::default() });
    assert!(err.unwrap_err().to_string().contains("must be between 1 and 86400"));
    // 0 removes the limit.
    w.c.update_pool("p", UpdatePool { max_resume_seconds: Some(0), ..Default::default() }).unwrap();
    assert_eq!(w.c.read().pool("p").unwrap().max_resume_seconds, None);
}

/// A launch that never joins: after `launchTimeoutSeconds` the replacement counts as failed,
/// and the replace phase is recorded breached once, as the provider's.
#[test]
fn a_replacement_past_its_launch_timeout_breaches_the_replace_bound() {
    let mut w = World::new(OwnershipMode::Managed);
    w.c.update_pool("p", with_provider(10)).unwrap();
    let join = w.join_token.clone();
    let bad = w.join("bad", &join).unwrap();
    w.run(2, &[(bad.clone(), HealthStatus::Ok)], |_| ProviderOutcome::Done);
    w.run(8, &[(bad.clone(), HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    let i = w.c.read().incidents().pop().unwrap();
    let b = i.bounds.expect("bounds fixed at open");
    assert_eq!(b.kind, FailureKind::DaemonHang, "{:?}", i.trigger.reason);
    assert_eq!(b.replace_ms, Some(10_250));
    assert!(i.breaches.is_empty(), "{:?}", i.breaches);
    w.run(20, &[(bad.clone(), HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    let i = w.c.read().incidents().pop().unwrap();
    assert_eq!(i.breaches.len(), 1, "{:?}", i.breaches);
    let breach = &i.breaches[0];
    assert_eq!((breach.phase, breach.cause), (RecoveryPhase::Replace, Some(BreachCause::ProviderSlow)));
    assert!(breach.measured_ms > 10_250 && breach.measured_ms <= 10_750, "{breach:?}");
    assert!(
        matches!(&i.state, IncidentState::Blocked { reason } if reason.contains("launchTimeoutSeconds")),
        "{:?}",
        i.state
    );
    assert_eq!(i.timeline.iter().filter(|e| e.step == Step::BoundBreached).count(), 1);
    let judged = i.judgement();
    let replace = judged.iter().find(|j| j.phase == RecoveryPhase::Replace).unwrap();
    assert_eq!(replace.verdict, PhaseVerdict::Breached);
    let detect = judged.iter().find(|j| j.phase == RecoveryPhase::Detect).unwrap();
    assert_eq!(detect.verdict, PhaseVerdict::Within, "{judged:?}");
    let events: Vec<_> = w.c.read().pool("p").unwrap().events.iter().map(|e| e.event.clone()).collect();
    let breached: Vec<_> = events.iter().filter(|e| e.reason == "RecoveryBoundBreached").collect();
    assert_eq!(breached.len(), 1, "{events:?}");
    assert!(breached[0].message.contains("replace ran") && breached[0].message.contains("(provider-slow)"));
    // Later passes record nothing more.
    w.run(10, &[(bad, HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    assert_eq!(w.c.read().incidents().pop().unwrap().breaches.len(), 1);
}

/// A daemon that exits again only a while after each local restart detects later than the
/// `daemon-exit` bound (which counts each restart killed at once): the breach names the slower
/// failure as its cause, not "unknown". Restarts as fast as the bound assumes name none.
#[test]
fn a_detect_breach_of_a_slower_failure_says_so() {
    let mut w = World::new(OwnershipMode::Managed);
    let join = w.join_token.clone();
    let host = w.join("h", &join).unwrap();
    // Well after the server loaded: the failure is not older than the server.
    w.advance(60_000);
    let now = w.c.now();
    let incident = |repairs: Vec<u64>| {
        let trigger = Trigger {
            check: "MPS_DAEMON".into(),
            gpu_id: None,
            reason: "daemon exited (signal 9)".into(),
            evidence: "e".into(),
            first_failure_at_ms: Some(now - 10_000),
            local_repairs_at_ms: repairs,
            earlier_repairs_at_ms: Vec::new(),
        };
        let pool = PoolName::new("p").unwrap();
        let mut i =
            Incident::open("inc-1".into(), host.clone(), pool, IncidentOwner::Mpsfleet, trigger, now, now);
        let bounds = w.c.read().pool_bounds("p").unwrap();
        i.bounds = Some(IncidentBounds::of(bounds.of(FailureKind::DaemonExit).unwrap(), false));
        i
    };
    // Each kill 1.5 s after its restart: the two restarts end 4.5 s after the first failure,
    // against the 3 s the bound counts for them (a start, then a backoff and a start).
    let slow = incident(vec![now - 8_000, now - 5_500]);
    assert_eq!(w.c.read().breach_cause(&slow, RecoveryPhase::Detect), Some(BreachCause::SlowerFailure));
    let fast = incident(vec![now - 9_000, now - 8_000]);
    assert_eq!(w.c.read().breach_cause(&fast, RecoveryPhase::Detect), None);
}

/// After one repaired crash and then a failure of the same daemon that exhausts its local
/// restarts, the incident numbers each restart as the agent's budget counts them (within 10
/// minutes, the earlier failure's first) and names the earlier failure's: the trigger's `3
/// within 10m`, the timeline and `pool explain`'s `up to 3 times in 10 minutes` agree.
#[test]
fn an_earlier_failures_restart_is_counted_in_the_incidents_timeline() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let join = w.join_token.clone();
    let host = w.join("h", &join).unwrap();
    let report = |w: &World, status: HealthStatus, first: Option<u64>, repairs: Vec<u64>, reason: &str| {
        let check = HostCheck {
            reason: reason.into(),
            restarts: repairs.len() as u32,
            first_failure_age_ms: first,
            repair_ages_ms: repairs,
            ..w.mps_check(&host, status)
        };
        w.report(vec![check])
    };
    // A crash the agent repaired: its restart 500 ms ago, the failure not yet over.
    w.advance(60_000);
    w.c.host_status(&host, &report(&w, HealthStatus::Ok, Some(1_000), vec![500], "daemon OK")).unwrap();
    w.advance(60_000);
    w.c.host_status(&host, &report(&w, HealthStatus::Ok, None, vec![], "daemon OK")).unwrap();
    // A minute later the daemon dies for good: two more restarts, then the budget is spent.
    w.advance(60_000);
    let exhausted = "daemon exited (signal 9); local restarts exhausted (3 within 10m)";
    for _ in 0..20 {
        w.c.host_status(
            &host,
            &report(&w, HealthStatus::Impaired, Some(3_000), vec![2_000, 1_000], exhausted),
        )
        .unwrap();
        w.advance(250);
        w.c.health_tick().unwrap();
    }
    let i = w.c.read().incidents().pop().expect("an incident");
    assert_eq!(i.trigger.earlier_repairs_at_ms.len(), 1, "{:?}", i.trigger);
    let repairs: Vec<&str> =
        i.timeline.iter().filter(|e| e.step == Step::LocalRepairAttempt).map(|e| e.detail.as_str()).collect();
    assert_eq!(repairs.len(), 2, "{:#?}", i.timeline);
    assert!(
        repairs[0].ends_with("(restart 2 within 10 minutes, 1 of them by an earlier failure)"),
        "{repairs:?}"
    );
    assert!(
        repairs[1].ends_with("(restart 3 within 10 minutes, 1 of them by an earlier failure)"),
        "{repairs:?}"
    );
    assert!(i.trigger.reason.contains("3 within 10m"));
    let explained = serde_json::to_string(&w.c.explain_pool("p").unwrap()).unwrap();
    assert!(
        explained.contains("up to 3 times in 10 minutes (an earlier failure's restarts in that time count"),
        "{explained}"
    );
}
