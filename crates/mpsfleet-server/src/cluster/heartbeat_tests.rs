//! Heartbeats that leave their checks out (`checksUnchanged`) against the ones that carry
//! them: the server must come to the same health, the same incidents at the same times, and
//! ask for the checks when it does not hold them.

use super::recovery_tests::World;
use super::*;
use std::time::Duration;

/// One MPS check per GPU of `w`'s host: OK, or IMPAIRED since `failed_at` (agent time, which
/// here is the server's) with its age counted at `now`.
fn checks(gpu: &GpuUuid, failed_at: Option<u64>, now: u64) -> Vec<HostCheck> {
    let status = if failed_at.is_some() { HealthStatus::Impaired } else { HealthStatus::Ok };
    vec![HostCheck {
        name: "MPS_DAEMON".into(),
        gpu_id: Some(gpu.clone()),
        status,
        reason: format!("daemon {}", status.as_str()),
        since_ms: failed_at.unwrap_or(5),
        restarts: 0,
        first_failure_age_ms: failed_at.map(|t| now - t),
        repair_ages_ms: Vec::new(),
    }]
}

fn full(checks: Vec<HostCheck>, rev: u64) -> HostStatusReport {
    HostStatusReport { onboarded: true, checks, checks_rev: Some(rev), ..HostStatusReport::default() }
}

fn repeat(rev: u64) -> HostStatusReport {
    HostStatusReport {
        onboarded: true,
        checks_rev: Some(rev),
        checks_unchanged: true,
        ..HostStatusReport::default()
    }
}

/// An incident as these tests compare it: state, opened, first failure.
type Seen = (IncidentState, u64, Option<u64>);

/// What a user sees of the host and its incidents.
fn seen(w: &World, host: &HostId) -> (HealthStatus, Vec<Seen>, String) {
    let view = w.c.read().host(host.as_str()).unwrap();
    let incidents =
        w.c.read()
            .incidents()
            .into_iter()
            .map(|i| (i.state.clone(), i.opened_at_ms, i.timing().first_failure_at_ms))
            .collect();
    let checks = format!("{:?}", w.c.state.hosts()[0].health);
    (view.health_status, incidents, checks)
}

#[test]
fn a_heartbeat_without_its_checks_gives_what_the_full_one_gives() {
    let mut lean = World::new(OwnershipMode::SelfManaged);
    let mut wide = World::new(OwnershipMode::SelfManaged);
    let reg = lean.registration("h");
    let gpu = reg.gpus[0].uuid.clone();
    let a = lean.c.register_host(reg.clone()).unwrap().host_id;
    let b = wide.c.register_host(reg).unwrap().host_id;
    let start = lean.clock.now_ms();
    // The daemon fails 3 s after the start, for good; heartbeats every second, the health
    // tick every 250 ms, for two minutes (past the toleration: an incident opens).
    let failed_at = start + 3_000;
    let mut rev = 0;
    let mut held = None;
    let mut last: Option<Vec<HostCheck>> = None;
    for step in 0..480u64 {
        for w in [&mut lean, &mut wide] {
            w.clock.advance(Duration::from_millis(250));
        }
        let now = lean.clock.now_ms();
        if step % 4 == 0 {
            let now_checks = checks(&gpu, (now >= failed_at).then_some(failed_at), now);
            wide.c.host_status(&b, &full(now_checks.clone(), 1)).unwrap();
            // The same failure with older ages keeps its number.
            let same = last.as_ref().is_some_and(|l| l[0].status == now_checks[0].status);
            if !same {
                rev += 1;
                last = Some(now_checks.clone());
            }
            let report = if held == Some(rev) { repeat(rev) } else { full(now_checks, rev) };
            held = lean.c.host_status(&a, &report).unwrap().checks_rev;
            assert_eq!(held, Some(rev), "step {step}: the server holds what it was sent");
        }
        for w in [&mut lean, &mut wide] {
            w.c.health_tick().unwrap();
        }
        assert_eq!(seen(&lean, &a), seen(&wide, &b), "step {step}");
    }
    let (status, incidents, _) = seen(&lean, &a);
    assert_eq!(status, HealthStatus::Impaired);
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0].2, Some(failed_at), "timed from the first failure the agent reported");
}

#[test]
fn a_server_that_does_not_hold_the_checks_asks_for_them_and_takes_nothing() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let reg = w.registration("h");
    let gpu = reg.gpus[0].uuid.clone();
    let host = w.c.register_host(reg).unwrap().host_id;
    let now = w.clock.now_ms();
    let answer = w.c.host_status(&host, &full(checks(&gpu, None, now), 3)).unwrap();
    assert_eq!(answer.checks_rev, Some(3));
    w.clock.advance(Duration::from_secs(1));
    let answer = w.c.host_status(&host, &repeat(3)).unwrap();
    assert_eq!(answer.checks_rev, Some(3));
    assert_eq!(
        w.c.state.hosts()[0].last_heartbeat_ms,
        Some(w.clock.now_ms()),
        "a held repeat is a heartbeat"
    );
    // Another number (the agent restarted and counts again, or the answer was lost): the
    // server asks, and the heartbeat counts for nothing.
    w.clock.advance(Duration::from_secs(1));
    let before = w.c.state.hosts()[0].last_heartbeat_ms;
    let answer = w.c.host_status(&host, &repeat(4)).unwrap();
    assert_eq!(answer.checks_rev, None);
    assert_eq!(w.c.state.hosts()[0].last_heartbeat_ms, before);
    // A server loaded again from the store holds no checks at all.
    let store = w.c.store.clone();
    let mut again = Cluster::load(store, w.clock.clone(), |_| Ok(())).unwrap();
    assert_eq!(again.host_status(&host, &repeat(3)).unwrap().checks_rev, None);
    assert_eq!(again.host_status(&host, &full(checks(&gpu, None, now), 3)).unwrap().checks_rev, Some(3));
    assert_eq!(again.host_status(&host, &repeat(3)).unwrap().checks_rev, Some(3));
}

/// A replica leaves traffic at its daemon's first failed signal, while the check is still OK
/// (a probe failed below the threshold, or local repair is restarting the daemon), timed at
/// that signal on the server's clock; it is back once the failure is over, and a replica on
/// another GPU of the host is not touched.
#[test]
fn a_replica_leaves_traffic_at_its_daemons_first_failed_signal() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let mut reg = w.registration("h");
    reg.gpus.push(GpuInventory::emulated_h200(GpuUuid::new("GPU-other").unwrap(), 1));
    let (gpu, other) = (reg.gpus[0].uuid.clone(), reg.gpus[1].uuid.clone());
    let host = w.c.register_host(reg).unwrap().host_id;
    w.heartbeat(&host, HealthStatus::Ok);
    let mut task = Task::new(
        TaskId(7),
        TaskDefRef::parse("web:1").unwrap(),
        PoolName::new("p").unwrap(),
        None,
        "x".into(),
        0,
    );
    (task.host_id, task.gpu_ids, task.last_status, task.ready) =
        (Some(host.clone()), vec![gpu.clone()], TaskStatus::Running, true);
    let mut neighbour = task.clone();
    neighbour.gpu_ids = vec![other];
    assert_eq!(w.c.read().daemon_failing_since(&task), None);

    // A failed probe 300 ms before the report: the check still says OK.
    w.advance(1_000);
    let reported_at = w.clock.now_ms();
    let check = HostCheck { first_failure_age_ms: Some(300), ..w.mps_check(&host, HealthStatus::Ok) };
    w.c.host_status(&host, &w.report(vec![check])).unwrap();
    let r = w.c.read();
    assert_eq!(r.daemon_failing_since(&task), Some(reported_at - 300));
    let (state, why) = r.traffic_of(&task);
    assert_eq!(state, mpsfleet_types::discovery::TrafficState::Out, "{why}");
    assert!(why.contains("first signal"), "{why}");
    assert_eq!(r.daemon_failing_since(&neighbour), None, "another GPU's replica stays");

    // The failure is over: its daemon no longer keeps the replica out.
    w.advance(1_000);
    w.heartbeat(&host, HealthStatus::Ok);
    assert_eq!(w.c.read().daemon_failing_since(&task), None);
    // (Out still, here, for its want of an address: a task record made up for the test.)
    let why = w.c.read().traffic_of(&task).1;
    assert!(!why.contains("MPS daemon"), "{why}");
}

/// A pool's rooms (`Reader::host_rooms`) say what its host views say: status, cordon, the
/// GPUs' figures, and whether each GPU's MPS daemon is OK by the view's checks, before the
/// first heartbeat, with the reported checks, and with the evaluation of a failure.
#[test]
fn a_hosts_room_reads_as_its_view() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let mut reg = w.registration("h");
    reg.gpus.push(GpuInventory::emulated_h200(GpuUuid::new("GPU-other").unwrap(), 1));
    let host = w.c.register_host(reg).unwrap().host_id;
    let pool = w.c.read().host(host.as_str()).unwrap().pool;
    let agree = |w: &World| {
        let (views, rooms) = (w.c.read().hosts(Some(pool.as_str())), w.c.read().host_rooms(pool.as_str()));
        assert_eq!(views.len(), rooms.len());
        for (v, r) in views.iter().zip(&rooms) {
            let host = (&v.id, v.status, v.health_status, v.cordoned, v.mps_available);
            assert_eq!(host, (&r.id, r.status, r.health_status, r.cordoned, r.mps_available));
            assert_eq!(v.gpus.len(), r.gpus.len());
            for (g, room) in v.gpus.iter().zip(&r.gpus) {
                let ok = (v.checks.iter())
                    .filter(|c| c.name == "MPS_DAEMON" && c.gpu_id.as_ref() == Some(&g.gpu_id))
                    .all(|c| c.status == HealthStatus::Ok);
                let figures = (g.sharing_mode, g.remaining_memory_mib, g.client_count, g.max_clients);
                assert_eq!(
                    figures,
                    (room.sharing_mode, room.remaining_memory_mib, room.client_count, room.max_clients)
                );
                assert_eq!((g.compute_percent_sum, ok), (room.compute_percent_sum, room.daemon_ok));
            }
        }
        rooms
    };
    agree(&w);
    w.heartbeat(&host, HealthStatus::Ok);
    agree(&w);
    w.advance(1_000);
    w.heartbeat(&host, HealthStatus::Impaired);
    w.c.health_tick().unwrap();
    let rooms = agree(&w);
    assert_eq!(rooms[0].gpus.iter().map(|g| g.daemon_ok).collect::<Vec<_>>(), [false, true]);
}
