//! An etcd member SIGKILLed and restarted while a writer commits through the store: every
//! commit the store acknowledged is there afterwards. Its own test binary, so that no other
//! etcd test runs while a member is down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mpsfleet_store::etcd::Writers;
use mpsfleet_store::{EtcdConfig, EtcdStore, Op, Precondition, Store};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: bash scripts/etcd-env.sh start; eval \"$(bash scripts/etcd-env.sh env)\"")
    })
}

#[test]
fn a_member_killed_and_restarted_under_load_loses_no_acknowledged_commit() {
    let mut config = EtcdConfig::new(&env("MPSFLEET_TEST_ETCD"));
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos());
    config.prefix = format!("/etcd-test/member-loss-{}-{nanos}", std::process::id());
    let store = EtcdStore::open(&config, Writers::Anyone).expect("open");
    let dir = std::path::PathBuf::from(env("MPSFLEET_TEST_ETCD_DIR"));
    let stop = AtomicBool::new(false);
    let (acked, failed) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let (mut acked, mut failed) = (Vec::new(), 0u32);
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{i:06}");
                match store.commit(&[Op::put("task", &key, i.to_string(), Precondition::Absent)]) {
                    Ok(_) => acked.push(key),
                    Err(_) => failed += 1,
                }
                i += 1;
            }
            (acked, failed)
        });
        std::thread::sleep(Duration::from_secs(1));
        // The first endpoint is the member the store talks to first.
        let pid = std::fs::read_to_string(dir.join("m1.pid")).expect("m1.pid").trim().to_owned();
        assert!(std::process::Command::new("kill").args(["-9", &pid]).status().expect("kill").success());
        std::thread::sleep(Duration::from_secs(3));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/etcd-env.sh");
        let restarted = std::process::Command::new("bash")
            .args([script, "restart-member", "1"])
            .env("MPSFLEET_ETCD_DIR", &dir)
            .status()
            .expect("restart the member");
        assert!(restarted.success());
        // Back in the cluster before the writer stops: its health check passes.
        let m1 = env("MPSFLEET_TEST_ETCD").split(',').next().expect("endpoint").replace("http://", "");
        let healthy = (0..60).any(|_| {
            let ok = std::process::Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([&format!("--endpoints={m1}"), "endpoint", "health"])
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                std::thread::sleep(Duration::from_millis(500));
            }
            ok
        });
        assert!(healthy, "the restarted member did not become healthy in 30 s");
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("writer")
    });
    assert!(
        acked.len() > 20,
        "the writer kept committing through the loss: {} acknowledged, {failed} failed",
        acked.len()
    );
    // A store opened afresh, through the restarted member first, has every acknowledged commit.
    let fresh = EtcdStore::open(&config, Writers::Anyone).expect("open again");
    let missing: Vec<&String> =
        acked.iter().filter(|k| fresh.get("task", k).expect("get").is_none()).collect();
    assert!(missing.is_empty(), "{} acknowledged commits lost: {missing:?}", missing.len());
    println!("{} commits acknowledged, {failed} refused or unknown while the member was down", acked.len());
}
