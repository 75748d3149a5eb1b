//! With `--features broken-invariant` the simulated world may break an invariant on purpose;
//! the checker must catch it and name the seed. (The same check runs as a unit test.)
#![cfg(feature = "broken-invariant")]

use mpsfleet_sim::{failure_text, run, Config, Scenario};

#[test]
fn the_checker_catches_the_broken_world() {
    let cfg = Config {
        hosts: 12,
        gpus_per_host: 2,
        duration_ms: 40 * 60_000,
        seed: 77,
        fault_rate: 0.0,
        scenario: Scenario::DaemonCrash,
        break_invariant: true,
        ..Config::default()
    };
    let o = run(&cfg).expect("runs");
    assert!(o.violation.is_some());
    let text = failure_text(&cfg, &o);
    assert!(text.contains("seed 77") && text.contains("shortest reproducing trace"), "{text}");
}
