//! What the etcd store does beyond the conformance suite, against the test etcd cluster
//! (`scripts/etcd-env.sh`): batches larger than one etcd request, several stores on one
//! prefix, loading from the materialized objects after compaction, and the election's fence.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mpsfleet_store::etcd::{Candidate, Writers};
use mpsfleet_store::{EtcdConfig, EtcdStore, Op, Precondition, Store, StoreError};

fn endpoints() -> String {
    std::env::var("MPSFLEET_TEST_ETCD").unwrap_or_else(|_| {
        panic!("MPSFLEET_TEST_ETCD is not set: bash scripts/etcd-env.sh start; eval \"$(bash scripts/etcd-env.sh env)\"")
    })
}

fn config(prefix: &str) -> EtcdConfig {
    let mut c = EtcdConfig::new(&endpoints());
    c.prefix = prefix.to_owned();
    c
}

fn prefix(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos());
    format!("/etcd-test/{name}-{}-{n}-{nanos}", std::process::id())
}

fn etcdctl(args: &[&str]) -> String {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints().replace("http://", "")))
        .args(args)
        .output()
        .expect("run etcdctl (Debian's etcd-client)");
    assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

fn task(i: usize, bytes: usize) -> Op {
    Op::put("task", format!("t{i:05}"), noise(i as u64, bytes), Precondition::Absent)
}

/// Bytes that do not compress, so that a large batch stays large on the wire.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_batch_of_1000_tasks_larger_than_one_etcd_request_commits_as_one_revision() {
    let p = prefix("batch");
    let store = EtcdStore::open(&config(&p), Writers::Anyone).expect("open");
    // 1,000 tasks of 2 KiB: over 2 MiB, above etcd's 1.5 MiB request limit and 128 operations.
    let ops: Vec<Op> = (0..1_000).map(|i| task(i, 2_048)).collect();
    assert_eq!(store.commit(&ops).expect("commit"), 1);
    assert_eq!(store.list("task").expect("list").len(), 1_000);
    let chunks = etcdctl(&["get", &format!("{p}/chunk/"), "--prefix", "--keys-only"]);
    assert!(
        chunks.lines().filter(|l| !l.is_empty()).count() >= 2,
        "the batch must have been chunked: {chunks}"
    );
    assert_eq!(store.changes_since(0, 1).expect("feed").len(), 1_000, "one revision, never split");

    // A store opened afresh sees the whole batch, read back from its chunks.
    let fresh = EtcdStore::open(&config(&p), Writers::Anyone).expect("open again");
    assert_eq!(fresh.revision().expect("revision"), 1);
    assert_eq!(fresh.list("task").expect("list"), store.list("task").expect("list"));

    // A batch that fails its precondition writes nothing, however large.
    let mut ops: Vec<Op> = (1_000..2_000).map(|i| task(i, 2_048)).collect();
    ops.push(task(7, 1)); // exists already
    assert!(matches!(store.commit(&ops), Err(StoreError::Conflict { .. })));
    assert_eq!(store.revision().expect("revision"), 1);
    assert_eq!(
        EtcdStore::open(&config(&p), Writers::Anyone).expect("open").list("task").expect("list").len(),
        1_000
    );
}

#[test]
fn after_compaction_a_new_store_loads_from_the_materialized_objects() {
    let p = prefix("compact");
    let store = EtcdStore::open(&config(&p), Writers::Anyone).expect("open");
    for i in 0..300 {
        store.commit(&[task(i, 100)]).expect("commit");
    }
    store.commit(&[Op::delete("task", "t00003", Precondition::Any)]).expect("delete");
    let rev = store.revision().expect("revision");
    // Wait for the copy into the object keys, then drop the log below the head.
    eventually("the log to be materialized", || {
        etcdctl(&["get", &format!("{p}/applied"), "--print-value-only"]).trim() == rev.to_string()
    });
    store.compact(rev).expect("compact");
    let log_keys = etcdctl(&["get", &format!("{p}/log/"), "--prefix", "--keys-only"]);
    assert_eq!(
        log_keys.lines().filter(|l| !l.is_empty()).count(),
        1,
        "only the newest entry is left: {log_keys}"
    );

    let fresh = EtcdStore::open(&config(&p), Writers::Anyone).expect("open after compaction");
    assert_eq!(fresh.revision().expect("revision"), rev);
    assert_eq!(fresh.list("task").expect("list"), store.list("task").expect("list"));
    assert!(fresh.get("task", "t00003").expect("get").is_none());
    assert!(matches!(fresh.changes_since(0, 10), Err(StoreError::Compacted { .. })));
    // And it carries on from there.
    assert_eq!(fresh.commit(&[task(999, 1)]).expect("commit"), rev + 1);
}

#[test]
fn two_stores_on_one_prefix_see_each_other_and_never_both_win() {
    let p = prefix("shared");
    let a = EtcdStore::open(&config(&p), Writers::Anyone).expect("open a");
    let b = EtcdStore::open(&config(&p), Writers::Anyone).expect("open b");
    let r = a.commit(&[task(1, 10)]).expect("commit on a");
    // b follows the log by itself.
    assert_eq!(b.wait_for_revision(r - 1, Duration::from_secs(10)).expect("wait"), r);
    assert_eq!(b.get("task", "t00001").expect("get").expect("seen").version, r);
    // b commits on a stale view once a has moved on: it catches up and plans again.
    a.commit(&[task(2, 10)]).expect("commit on a");
    let r3 = b.commit(&[task(3, 10)]).expect("commit on b");
    assert_eq!(r3, r + 2);

    // Racing creates of one key: exactly one wins, the other gets a conflict.
    let results: Vec<Result<u64, StoreError>> = std::thread::scope(|s| {
        let ha = s.spawn(|| a.commit(&[task(50, 1)]));
        let hb = s.spawn(|| b.commit(&[task(50, 2)]));
        vec![ha.join().expect("a"), hb.join().expect("b")]
    });
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
    assert!(results.iter().any(|r| matches!(r, Err(StoreError::Conflict { .. }))), "{results:?}");
}

fn candidate(id: &str) -> Candidate {
    Candidate { id: id.to_owned(), url: format!("https://{id}.example:7070") }
}

#[test]
fn only_the_leader_commits_and_a_deposed_leader_is_fenced() {
    let p = prefix("election");
    let a = Arc::new(EtcdStore::open(&config(&p), Writers::Leader).expect("open a"));
    let b = Arc::new(EtcdStore::open(&config(&p), Writers::Leader).expect("open b"));
    let stop = AtomicBool::new(false);
    assert!(matches!(a.commit(&[task(1, 1)]), Err(StoreError::Fenced { .. })), "nobody leads yet");

    let la = a.campaign(&candidate("a"), Duration::from_secs(2), &stop).expect("campaign").expect("a leads");
    assert_eq!(a.leader().expect("leader").expect("some").candidate, candidate("a"));
    a.commit(&[task(1, 1)]).expect("the leader commits");
    assert!(matches!(b.commit(&[task(2, 1)]), Err(StoreError::Fenced { .. })), "a follower does not");

    let b2 = b.clone();
    let waiting = std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        b2.campaign(&candidate("b"), Duration::from_secs(2), &stop).expect("campaign").expect("b leads")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "b must wait while a's lease is kept alive");

    // a's lease ends behind its back, as it would while a was paused past its TTL.
    etcdctl(&["lease", "revoke", &format!("{:x}", la.lease())]);
    let lb = waiting.join().expect("b's campaign");
    assert_eq!(b.leader().expect("leader").expect("some").candidate, candidate("b"));

    // a's next commit fails on the fence, and a knows it no longer leads.
    match a.commit(&[task(3, 1)]) {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("a deposed leader's commit must be fenced, got {other:?}"),
    }
    assert!(la.lost_reason().is_some(), "a must step down");
    assert!(a.get("task", "t00003").expect("get").is_none());
    b.commit(&[task(4, 1)]).expect("the new leader commits");

    // Resigning hands over at once.
    lb.resign();
    assert!(matches!(b.commit(&[task(5, 1)]), Err(StoreError::Fenced { .. })));
    let la2 =
        a.campaign(&candidate("a"), Duration::from_secs(2), &stop).expect("campaign").expect("a leads again");
    a.commit(&[task(6, 1)]).expect("commit");
    assert!(a.get("task", "t00004").expect("get").is_some(), "the new leader caught up before leading");
    la2.resign();
}

/// A TCP proxy to one etcd member that can be frozen: it keeps accepting and reading but
/// forwards nothing, as a network that swallowed the packets would.
struct FreezingProxy {
    addr: String,
    frozen: Arc<AtomicBool>,
}

impl FreezingProxy {
    fn start(target: &str) -> FreezingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        let frozen = Arc::new(AtomicBool::new(false));
        let target = target.trim_start_matches("http://").to_owned();
        let f = frozen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&target) else { continue };
                for (mut from, mut to) in [
                    (client.try_clone().expect("clone"), server.try_clone().expect("clone")),
                    (server, client),
                ] {
                    let f = f.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            if !f.load(Ordering::Relaxed) && to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        FreezingProxy { addr, frozen }
    }
}

#[test]
fn a_commit_whose_answer_never_comes_is_indeterminate_and_the_leader_steps_down() {
    let p = prefix("unknown");
    let first = endpoints().split(',').next().expect("an endpoint").to_owned();
    let proxy = FreezingProxy::start(&first);
    let mut c = EtcdConfig::new(&proxy.addr);
    c.prefix = p.clone();
    c.request_timeout = Duration::from_millis(800);
    let store = EtcdStore::open(&c, Writers::Leader).expect("open through the proxy");
    let stop = AtomicBool::new(false);
    let lead =
        store.campaign(&candidate("a"), Duration::from_secs(5), &stop).expect("campaign").expect("leads");
    store.commit(&[task(1, 1)]).expect("commit");

    proxy.frozen.store(true, Ordering::Relaxed);
    match store.commit(&[task(2, 1)]) {
        Err(StoreError::Indeterminate { .. }) => {}
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert!(lead.lost_reason().is_some(), "the leader must step down and reload");
    assert!(matches!(store.commit(&[task(3, 1)]), Err(StoreError::Fenced { .. })));
}
