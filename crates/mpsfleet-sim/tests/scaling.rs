//! The managed-scaling scenario: the pool follows a burst and a diurnal curve of demand, every
//! task is placed, the pool grows and shrinks, and the same seed gives the same report.

use mpsfleet_sim::scaling::{run, ScalingConfig};

#[test]
fn the_pool_follows_its_demand_and_a_seed_replays_the_same_run() {
    // 12 hours: the morning burst at 09:00 and the climb to noon.
    let cfg =
        ScalingConfig { max_hosts: 8, min_hosts: 2, gpus_per_host: 4, duration_ms: 12 * 3_600_000, seed: 7 };
    let a = run(&cfg).unwrap();
    assert_eq!(a.server_errors, 0, "{a:?}");
    assert!(a.tasks_submitted > 500 && a.tasks_still_waiting == 0, "{a:?}");
    assert!(a.scale_out_steps >= 2 && a.peak_hosts > 2, "it grew: {a:?}");
    assert!(a.scale_in_hosts >= 1, "it shrank after the burst: {a:?}");
    assert!(a.pending_p99_s <= 300.0, "tasks waited for booting hosts only: {a:?}");
    assert!(a.host_hours >= a.oracle_host_hours * 0.9, "the oracle is the floor: {a:?}");
    let b = run(&cfg).unwrap();
    assert_eq!(a.render(), b.render(), "the same seed, the same run");
}
