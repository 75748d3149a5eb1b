//! Every scenario as an ordinary test: small fleets, a virtual hour, invariants checked after
//! every step (a broken one fails the test with its seed and minimal trace), plus what each
//! scenario must come to.

use mpsfleet_sim::{run, Config, Outcome, Scenario};

fn sim(scenario: Scenario, seed: u64) -> Outcome {
    let cfg = Config {
        hosts: 12,
        gpus_per_host: 2,
        duration_ms: 40 * 60_000,
        seed,
        fault_rate: 0.0,
        scenario,
        ..Config::default()
    };
    let out = run(&cfg).expect("the simulation runs");
    eprintln!("{}{}", out.report.render(), out.trace.join("\n"));
    if out.violation.is_some() {
        panic!("{}", mpsfleet_sim::failure_text(&cfg, &out));
    }
    out
}

fn count(m: &std::collections::BTreeMap<String, u64>, k: &str) -> u64 {
    m.get(k).copied().unwrap_or(0)
}

/// Every service of the pool is back at its desired count at the end.
fn pool_recovered(o: &Outcome, pool: &str) -> bool {
    o.report
        .services_at_end
        .iter()
        .filter(|(s, ..)| s.starts_with(&format!("{pool}-")))
        .all(|(_, r, d)| r >= d)
}

#[test]
fn steady() {
    let o = sim(Scenario::Steady, 1);
    assert_eq!(o.report.incidents, 0);
    assert_eq!(o.report.tasks_killed, 0);
    assert_eq!(o.report.replicas_running_at_end, o.report.replicas_desired);
}

#[test]
fn daemon_crash() {
    let o = sim(Scenario::DaemonCrash, 2);
    // The replicas a crash kills leave rotation with the agent's report of their exit.
    let r = &o.report;
    assert!(r.out_of_rotation.count > 0 && r.out_of_rotation_max_ms < 1_000, "{}", r.render());
    // Two crashes for good (one per pool); the recoverable ones restart locally, no incident.
    assert_eq!(
        count(&o.report.incidents_by_cause, "daemon-crash-for-good"),
        2,
        "{:?}",
        o.report.incidents_by_cause
    );
    assert_eq!(count(&o.report.incidents_by_cause, "daemon-crash"), 0);
    // Managed: replaced, old host terminated, services back at their count.
    assert_eq!(o.report.replacements_requested, 1);
    assert_eq!(o.report.hosts_terminated, 1);
    assert!(pool_recovered(&o, "gpu"), "{:?}", o.report.services_at_end);
    // Self-managed: nothing moved, the incident waits for the operator.
    assert!(o.trace.iter().any(|l| l.contains("incident on gpu-self-3") && l.contains("owner operator")));
    assert!(!o.trace.iter().any(|l| l.contains("gpu-self-3r")));
    assert_eq!(count(&o.report.incidents_by_state, "OPEN"), 1);
    assert!(o.report.tasks_killed > 0);
}

#[test]
fn hang() {
    let o = sim(Scenario::Hang, 3);
    // A hang a restart cures opens nothing; a daemon that hangs again and again does.
    assert_eq!(count(&o.report.incidents_by_cause, "daemon-hang"), 0, "{:?}", o.report.incidents_by_cause);
    assert_eq!(count(&o.report.incidents_by_cause, "daemon-hang-for-good"), 2);
    assert!(pool_recovered(&o, "gpu"));
}

#[test]
fn server_fault() {
    let o = sim(Scenario::ServerFault, 4);
    // Clients exit and the server recovers; a stuck client keeps it in FAULT: impaired.
    assert_eq!(count(&o.report.incidents_by_cause, "server-fault"), 0, "{:?}", o.report.incidents_by_cause);
    assert_eq!(count(&o.report.incidents_by_cause, "server-fault-stuck"), 1);
    assert!(pool_recovered(&o, "gpu"));
}

#[test]
fn xid() {
    let o = sim(Scenario::Xid, 5);
    assert_eq!(count(&o.report.incidents_by_cause, "gpu-xid"), 2, "{:?}", o.report.incidents_by_cause);
    assert_eq!(o.report.replacements_requested, 1);
    assert!(pool_recovered(&o, "gpu"));
}

#[test]
fn partition() {
    let o = sim(Scenario::Partition, 6);
    // 5s of silence is inside the grace: no incident. The long ones are declared bad; the
    // managed one is replaced (fenced replicas only after the old host is terminated).
    assert_eq!(count(&o.report.incidents_by_cause, "partition"), 2, "{:?}", o.report.incidents_by_cause);
    assert_eq!(o.report.hosts_terminated, 1);
    assert!(pool_recovered(&o, "gpu"));
}

#[test]
fn vanish() {
    let o = sim(Scenario::Vanish, 7);
    assert_eq!(count(&o.report.incidents_by_cause, "vanish"), 3, "{:?}", o.report.incidents_by_cause);
    assert_eq!(o.report.replacements_requested, 2);
    assert!(pool_recovered(&o, "gpu"));
    // A vanished host's replicas leave rotation once it has missed 3 heartbeats (1 s apart),
    // long before its incident: between 2 and 3 s after the fault (a step's slack).
    let (r, hb) = (&o.report, o.report.heartbeat_ms);
    assert!(r.out_of_rotation.count > 0 && r.never_out_of_rotation == 0, "{}", r.render());
    assert!(r.out_of_rotation.median_ms.is_some_and(|m| m >= 2 * hb), "{}", r.render());
    assert!(r.out_of_rotation_max_ms <= 3 * hb + 250, "{}", r.render());
    assert!(r.requests_failed > 0, "{}", r.render());
}

#[test]
fn provider_flaky() {
    let o = sim(Scenario::ProviderFlaky, 8);
    assert!(o.report.provider_attempts_failed > 0, "{}", o.report.render());
    assert_eq!(count(&o.report.incidents_by_cause, "daemon-crash-for-good"), 3);
    // Each incident either got its host replaced (a host that joins after its launch timed out
    // still is the replacement) or is BLOCKED on the failed replacement, waiting for `host
    // replace`: a failed launch is not retried automatically.
    let blocked_at_end: usize = o.report.pools_at_end.iter().map(|p| p.3).sum();
    assert_eq!(o.report.hosts_terminated + blocked_at_end as u64, 3, "{}", o.trace.join("\n"));
    // Calls a minute slower than usual run past the 120 s launch timeout: the replace bound is
    // breached, and the provider named as the cause.
    assert!(count(&o.report.bound_breaches, "replace provider-slow") >= 1, "{}", o.report.render());
    assert!(!o.report.bound_breaches.keys().any(|k| k.ends_with("unexplained")), "{}", o.report.render());
}

#[test]
fn driver_rollout() {
    let o = sim(Scenario::DriverRollout, 9);
    // A third of the managed pool (3 of 8) at once: above the 20% breaker (2 of 8), so the
    // first two incidents proceed and the third is BLOCKED until the storm has passed. Hosts
    // being drained still count as unhealthy, so the breaker holds while incidents start.
    assert_eq!(count(&o.report.incidents_by_cause, "bad-driver"), 3, "{}", o.report.render());
    assert!(o.report.breaker_trips >= 1, "{}\n{}", o.report.render(), o.trace.join("\n"));
    assert!(o.trace.iter().any(|l| l.contains("BLOCKED") && l.contains("storm breaker")));
    // Held back, not dropped: once the first two are replaced, the third is too.
    assert_eq!(o.report.hosts_terminated, 3, "{}", o.report.render());
    assert_eq!(o.report.incident_ties, 0);
    assert!(pool_recovered(&o, "gpu"));
    // The pool's hosts at the end are the hosts it has: the 3 replaced ones are not counted.
    let gpu = o.report.pools_at_end.iter().find(|p| p.0 == "gpu").expect("pool gpu at the end");
    assert_eq!((gpu.1, gpu.2), (8, 8), "{}", o.report.render());
}

#[test]
fn driver_rollout_of_half_a_pool_trips_the_breaker() {
    let cfg = Config {
        hosts: 22,
        gpus_per_host: 2,
        duration_ms: 30 * 60_000,
        seed: 9,
        fault_rate: 0.0,
        scenario: Scenario::DriverRollout,
        rollout_percent: 50,
        ..Config::default()
    };
    let o = run(&cfg).expect("runs");
    assert!(o.violation.is_none(), "{}", mpsfleet_sim::failure_text(&cfg, &o));
    // 8 of 15 hosts: the first three (20% of 15) proceed, the others are BLOCKED by the breaker
    // and, once the storm is over, by the rate limit.
    assert!(o.report.breaker_trips >= 1, "{}\n{}", o.report.render(), o.trace.join("\n"));
    let storm_blocked =
        o.trace.iter().filter(|l| l.contains("BLOCKED") && l.contains("storm breaker")).count();
    assert!(storm_blocked >= 1);
    assert_eq!(o.report.incident_ties, 0);
    // Held back, not dropped: by the end every bad host is replaced.
    assert_eq!(o.report.hosts_terminated, 8, "{}", o.report.render());
}

#[test]
fn control_plane_restart() {
    let o = sim(Scenario::ControlPlaneRestart, 10);
    assert_eq!(o.report.control_plane_restarts, 4);
    assert_eq!(o.report.server_errors, 0);
    assert!(o.report.replacements_requested >= 1);
    assert!(pool_recovered(&o, "gpu"), "{:?}", o.report.services_at_end);
}

#[test]
fn a_restarted_control_plane_waits_for_slow_heartbeats() {
    // 5 s heartbeats, longer than the 2 s toleration: after each of the four reloads the
    // server must give the agents their grace again, not count their silence from
    // registration. The same run with 1 s heartbeats opens the same incidents.
    let run_with = |heartbeat_ms| {
        let cfg = Config {
            hosts: 12,
            gpus_per_host: 2,
            duration_ms: 40 * 60_000,
            seed: 10,
            fault_rate: 0.0,
            scenario: Scenario::ControlPlaneRestart,
            heartbeat_ms,
            ..Config::default()
        };
        let o = run(&cfg).expect("runs");
        assert!(o.violation.is_none(), "{}", mpsfleet_sim::failure_text(&cfg, &o));
        o
    };
    let (slow, fast) = (run_with(5_000), run_with(1_000));
    assert_eq!(slow.report.control_plane_restarts, 4);
    assert_eq!(slow.report.incidents_by_cause, fast.report.incidents_by_cause, "{}", slow.report.render());
    assert_eq!(count(&slow.report.incidents_by_cause, "no injected fault"), 0, "{}", slow.report.render());
}

#[test]
fn full_pool() {
    // Every GPU of the (one, managed) pool is full: priority-90 replicas of half a GPU and
    // priority-10 ones of a quarter. Two hosts lose a daemon for good at 10:00 and 10:20, a third
    // every daemon at 15:00.
    let o = sim(Scenario::FullPool, 42);
    let (r, p) = (&o.report, &o.report.preemption);
    assert_eq!(count(&r.incidents_by_cause, "daemon-crash-for-good"), 2, "{}", r.render());
    assert_eq!(count(&r.incidents_by_cause, "bad-driver"), 1, "{}", r.render());
    // The lost high-priority replicas came back by preempting low-priority ones.
    assert!(p.preemptions >= 1, "{}", r.render());
    assert!(o.trace.iter().any(|l| l.contains("preempted gpu-batch-") && l.contains("for gpu-critical-")));
    // Each within the full pool's bound: detect 6.5 s + decide 0.5 s + the victims' stop 32 s
    // (a 2 s deregistration delay and the 30 s stopTimeout) + incident pass and tick 0.5 s +
    // start 30 s.
    assert_eq!(p.bound_ms, 69_500);
    assert!(p.high_recovery.count >= 4 && p.high_not_back == 0, "{}", r.render());
    assert!(p.high_recovery_max_ms <= p.bound_ms, "{}", r.render());
    // The victims waited for capacity: the replacement hosts joined, and every service,
    // the low-priority ones too, is back at its count; no victim is left waiting.
    assert!(p.preempted_task_hours_lost > 0.0 && p.victims_not_back == 0, "{}", r.render());
    for host in ["gpu-0r", "gpu-1r", "gpu-2r"] {
        assert!(o.trace.iter().any(|l| l.ends_with(&format!("host {host} joined"))), "{host} never joined");
    }
    assert_eq!(r.hosts_terminated, 3, "{}", r.render());
    assert!(pool_recovered(&o, "gpu"), "{:?}", r.services_at_end);
    // A bad driver on a host of 8 GPUs kills 8 of each high-priority service's replicas at
    // once, their exits reported before the daemons' failure is confirmed: they are the
    // daemons' losses all the same (no crash-loop hold-back, recovery replacements).
    let wide = Config {
        hosts: 12,
        gpus_per_host: 8,
        duration_ms: 20 * 60_000,
        seed: 42,
        fault_rate: 0.0,
        scenario: Scenario::FullPool,
        ..Config::default()
    };
    let w = run(&wide).expect("runs");
    assert!(w.violation.is_none(), "{}", mpsfleet_sim::failure_text(&wide, &w));
    let q = &w.report.preemption;
    assert_eq!(count(&w.report.incidents_by_cause, "bad-driver"), 1, "{}", w.report.render());
    assert!(q.high_recovery.count >= 16 && q.high_not_back == 0, "{}", w.report.render());
    assert!(q.high_recovery_max_ms <= q.bound_ms, "{}", w.report.render());
    // Without preemption the same losses wait for the replacement hosts: longer than the bound.
    let cfg = Config {
        hosts: 12,
        gpus_per_host: 2,
        duration_ms: 40 * 60_000,
        seed: 42,
        fault_rate: 0.0,
        scenario: Scenario::FullPool,
        preemption: Some(mpsfleet_types::Preemption::Off),
        ..Config::default()
    };
    let off = run(&cfg).expect("runs");
    assert!(off.violation.is_none(), "{}", mpsfleet_sim::failure_text(&cfg, &off));
    let q = &off.report.preemption;
    assert_eq!(q.preemptions, 0, "{}", off.report.render());
    assert!(q.high_recovery_max_ms > p.bound_ms, "{}", off.report.render());
    assert!(pool_recovered(&off, "gpu"), "{:?}", off.report.services_at_end);
}

#[test]
fn mixed() {
    let cfg = Config {
        hosts: 20,
        gpus_per_host: 2,
        duration_ms: 3_600_000,
        seed: 11,
        fault_rate: 0.5,
        scenario: Scenario::Mixed,
        ..Config::default()
    };
    let o = run(&cfg).expect("runs");
    assert!(o.violation.is_none(), "{}", mpsfleet_sim::failure_text(&cfg, &o));
    assert!(o.report.faults_injected.values().sum::<u64>() > 5);
}

#[test]
fn same_seed_same_report_and_trace() {
    let cfg = Config {
        hosts: 12,
        gpus_per_host: 2,
        duration_ms: 40 * 60_000,
        seed: 12,
        fault_rate: 1.0,
        scenario: Scenario::Mixed,
        ..Config::default()
    };
    let a = run(&cfg).expect("runs");
    let b = run(&cfg).expect("runs");
    assert!(a.report.faults_injected.values().sum::<u64>() > 3, "{}", a.report.render());
    assert_eq!(a.report.render(), b.report.render());
    assert_eq!(serde_json::to_string(&a.report).unwrap(), serde_json::to_string(&b.report).unwrap());
    assert_eq!(a.trace.join("\n"), b.trace.join("\n"));
    let other = mpsfleet_sim::config::plan_faults(&Config { seed: 13, ..cfg.clone() });
    assert_ne!(a.faults, other);
    // Across control-plane restarts too (the cluster is loaded again from the store).
    let restarts = Config { scenario: Scenario::ControlPlaneRestart, fault_rate: 0.0, ..cfg };
    let a = run(&restarts).expect("runs");
    let b = run(&restarts).expect("runs");
    assert_eq!(a.report.control_plane_restarts, 4);
    assert_eq!(a.report.render(), b.report.render());
    assert_eq!(a.trace, b.trace);
}

/// The replica-hours below desired, by cause: the parts add up to the total (each is rounded
/// to 0.01 h), and the text and JSON reports carry them.
fn shortfall(o: &Outcome, cause: &str) -> f64 {
    let parts = &o.report.replica_hours_by_cause;
    let sum: f64 = parts.values().sum();
    let total = o.report.replica_hours_below_desired;
    assert!((sum - total).abs() <= 0.01 * parts.len() as f64 + 1e-9, "{parts:?} do not add up to {total}");
    let json = serde_json::to_value(&o.report).unwrap();
    assert_eq!(json["replicaHoursByCause"].as_object().map(|m| m.len()), Some(parts.len()), "{json}");
    let got = parts.get(cause).copied().unwrap_or(0.0);
    if got > 0.0 {
        assert!(o.report.render().contains(cause), "{}", o.report.render());
    }
    got
}

#[test]
fn the_shortfall_is_broken_down_by_cause() {
    use mpsfleet_sim::{Fault, FaultKind};
    // Two hosts vanish at 15 min: the first managed one (its replicas wait to be declared lost,
    // the fenced ones until the host is terminated) and the first self-managed one (its
    // replicas are held for the operator, to the end of the run).
    let (managed, _) = mpsfleet_sim::config::pool_sizes(12);
    let faults = vec![
        Fault { at_ms: 15 * 60_000, slot: 0, kind: FaultKind::Vanish },
        Fault { at_ms: 15 * 60_000, slot: managed, kind: FaultKind::Vanish },
    ];
    let cfg = Config {
        hosts: 12,
        gpus_per_host: 2,
        duration_ms: 40 * 60_000,
        seed: 14,
        fault_rate: 0.0,
        scenario: Scenario::Vanish,
        faults: Some(faults),
        ..Config::default()
    };
    let o = run(&cfg).expect("runs");
    assert!(o.violation.is_none(), "{}", mpsfleet_sim::failure_text(&cfg, &o));
    let r = &o.report;
    assert!(r.replica_hours_below_desired > 0.0, "{}", r.render());
    // The self-managed host's replicas: 25 minutes each, all of it held for the operator.
    let held = shortfall(&o, "operator-hold");
    let missing_at_end = r.replicas_desired - r.replicas_running_at_end;
    assert!(missing_at_end > 0, "{}", r.render());
    let want = f64::from(missing_at_end) * 25.0 / 60.0;
    assert!((held - want).abs() < 0.05 * want, "operator-hold {held}, want about {want}\n{}", r.render());
    // The server still counts them RUNNING: nobody has said otherwise.
    assert!(pool_recovered(&o, "gpu-self"), "{:?}", r.services_at_end);
    // The managed host: unreachable until declared bad, then fenced replicas wait for its
    // termination; by the end its services are whole again.
    assert!(shortfall(&o, "host-unreachable") > 0.0, "{}", r.render());
    assert!(shortfall(&o, "fenced-termination") > 0.0, "{}", r.render());
    assert!(pool_recovered(&o, "gpu"), "{:?}", r.services_at_end);
    // Nothing goes unexplained, and no replica waited for placement while there was room.
    assert_eq!(shortfall(&o, "other"), 0.0, "{}", r.render());
    assert_eq!(shortfall(&o, "unplaced-with-room"), 0.0, "{}", r.render());
}
