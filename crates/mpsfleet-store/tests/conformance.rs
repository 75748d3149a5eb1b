//! The `Store` conformance suite: behaviour every backend must share, written once against `&dyn Store`
//! and run against `MemoryStore`, a file-backed `SqliteStore` and an in-memory `SqliteStore`.
//! and against an `EtcdStore` on the test etcd cluster. A new backend gets the same coverage by
//! adding one line to `backends!` below.

use std::collections::BTreeMap;
use std::time::Duration;

use mpsfleet_store::etcd::Writers;
use mpsfleet_store::{
    decode, Change, EtcdConfig, EtcdStore, MemoryStore, Op, Precondition, Record, Revision, SqliteStore,
    Store, StoreError,
};

const KIND: &str = "task";

fn put(key: &str, value: &str) -> Op {
    Op::put(KIND, key, value, Precondition::Any)
}

fn keys(records: &[Record]) -> Vec<&str> {
    records.iter().map(|r| r.key.as_str()).collect()
}

/// Everything observable about a store, for "nothing changed" assertions.
fn snapshot(store: &dyn Store, kinds: &[&str]) -> (Revision, BTreeMap<String, Vec<Record>>) {
    let mut objects = BTreeMap::new();
    for kind in kinds {
        objects.insert((*kind).to_owned(), store.list(kind).expect("list"));
    }
    (store.revision().expect("revision"), objects)
}

fn assert_conflict(
    result: Result<Revision, StoreError>,
    kind: &str,
    key: &str,
    expected: Precondition,
    actual: Option<Revision>,
) {
    match result {
        Err(StoreError::Conflict { kind: k, key: y, expected: e, actual: a }) => {
            assert_eq!((k.as_str(), y.as_str(), e, a), (kind, key, expected, actual));
        }
        other => panic!("expected a conflict on {kind}/{key}, got {other:?}"),
    }
}

fn put_get_list_ordering(store: &dyn Store) {
    assert_eq!(store.revision().expect("revision"), 0);
    assert_eq!(store.get(KIND, "a").expect("get"), None);
    assert!(store.list(KIND).expect("list").is_empty());

    store
        .commit(&[
            put("c", "3"),
            put("a", "1"),
            Op::put("host", "h1", "x", Precondition::Any),
            put("b", "2"),
            put("a/nested", "4"),
        ])
        .expect("commit");

    let a = store.get(KIND, "a").expect("get").expect("a exists");
    assert_eq!(a, Record { kind: KIND.into(), key: "a".into(), value: b"1".to_vec(), version: 1 });
    assert_eq!(store.get("host", "a").expect("get"), None, "kinds are separate namespaces");
    let listed = store.list(KIND).expect("list");
    assert_eq!(keys(&listed), ["a", "a/nested", "b", "c"]);
    assert_eq!(listed[3].value, b"3");
    assert!(listed.iter().all(|r| r.kind == KIND));
    assert_eq!(keys(&store.list("host").expect("list")), ["h1"]);
    assert!(store.list("nothing").expect("list").is_empty());
}

fn versions_equal_commit_revision(store: &dyn Store) {
    let r1 = store.commit(&[put("x", "1"), put("y", "1")]).expect("commit");
    assert_eq!(r1, 1);
    let r2 = store.commit(&[put("y", "2")]).expect("commit");
    assert_eq!(r2, 2);
    let r3 = store.commit(&[put("z", "1")]).expect("commit");
    assert_eq!(r3, 3);
    assert_eq!(store.revision().expect("revision"), 3);
    let version = |k: &str| store.get(KIND, k).expect("get").expect("exists").version;
    assert_eq!((version("x"), version("y"), version("z")), (1, 2, 3));
    // An empty batch is allowed and spends no revision.
    assert_eq!(store.commit(&[]).expect("empty commit"), 3);
    assert_eq!(store.revision().expect("revision"), 3);
}

fn absent_precondition(store: &dyn Store) {
    let r = store.commit(&[Op::put(KIND, "a", "1", Precondition::Absent)]).expect("create");
    assert_conflict(
        store.commit(&[Op::put(KIND, "a", "2", Precondition::Absent)]),
        KIND,
        "a",
        Precondition::Absent,
        Some(r),
    );
    assert_eq!(store.get(KIND, "a").expect("get").expect("a").value, b"1");
    // Absent is per object: the same key under another kind is a different object.
    store.commit(&[Op::put("other", "a", "1", Precondition::Absent)]).expect("create in another kind");
}

fn version_precondition(store: &dyn Store) {
    let r1 = store.commit(&[put("a", "1")]).expect("commit");
    let r2 = store
        .commit(&[Op::put(KIND, "a", "2", Precondition::Version(r1))])
        .expect("cas with the current version");
    assert_eq!(store.get(KIND, "a").expect("get").expect("a").version, r2);

    assert_conflict(
        store.commit(&[Op::put(KIND, "a", "3", Precondition::Version(r1))]),
        KIND,
        "a",
        Precondition::Version(r1),
        Some(r2),
    );
    assert_conflict(
        store.commit(&[Op::put(KIND, "missing", "3", Precondition::Version(r1))]),
        KIND,
        "missing",
        Precondition::Version(r1),
        None,
    );
    assert_conflict(
        store.commit(&[Op::delete(KIND, "a", Precondition::Version(r1))]),
        KIND,
        "a",
        Precondition::Version(r1),
        Some(r2),
    );
    assert_eq!(store.get(KIND, "a").expect("get").expect("a").value, b"2");
    assert_eq!(store.revision().expect("revision"), r2);

    store
        .commit(&[Op::delete(KIND, "a", Precondition::Version(r2))])
        .expect("delete with the current version");
    assert_eq!(store.get(KIND, "a").expect("get"), None);
}

fn failing_precondition_applies_nothing(store: &dyn Store) {
    let base = store.commit(&[put("keep", "1"), put("doomed", "1"), put("old", "1")]).expect("seed");
    let before = snapshot(store, &[KIND, "bulk"]);

    // Many effective ops, then a failing one at the end.
    let mut ops: Vec<Op> =
        (0..500).map(|i| Op::put("bulk", format!("k{i:04}"), "v", Precondition::Absent)).collect();
    ops.push(Op::put(KIND, "keep", "2", Precondition::Version(base)));
    ops.push(Op::delete(KIND, "doomed", Precondition::Any));
    ops.push(Op::put(KIND, "old", "2", Precondition::Version(base + 7)));
    assert_conflict(store.commit(&ops), KIND, "old", Precondition::Version(base + 7), Some(base));
    assert_eq!(snapshot(store, &[KIND, "bulk"]), before);
    assert!(store.changes_since(base, 10_000).expect("changes").is_empty());

    // A failing op in the middle of the batch.
    let mut ops: Vec<Op> =
        (0..250).map(|i| Op::put("bulk", format!("k{i:04}"), "v", Precondition::Any)).collect();
    ops.push(Op::put(KIND, "keep", "x", Precondition::Absent));
    ops.extend((250..500).map(|i| Op::put("bulk", format!("k{i:04}"), "v", Precondition::Any)));
    assert_conflict(store.commit(&ops), KIND, "keep", Precondition::Absent, Some(base));
    assert_eq!(snapshot(store, &[KIND, "bulk"]), before);
    assert!(store.changes_since(base, 10_000).expect("changes").is_empty());

    // The store still works after refusals, and the next revision is base + 1.
    assert_eq!(store.commit(&[put("after", "1")]).expect("commit"), base + 1);
}

fn delete_semantics(store: &dyn Store) {
    let r1 = store.commit(&[put("a", "1"), put("b", "1")]).expect("seed");

    // Deleting a missing object with Any (or Absent) is a no-op that spends no revision.
    assert_eq!(store.commit(&[Op::delete(KIND, "missing", Precondition::Any)]).expect("no-op delete"), r1);
    assert_eq!(store.commit(&[Op::delete(KIND, "missing", Precondition::Absent)]).expect("no-op delete"), r1);
    assert_eq!(store.revision().expect("revision"), r1);
    assert!(store.changes_since(r1, 100).expect("changes").is_empty());

    // Deleting an existing object with Absent is a conflict.
    assert_conflict(
        store.commit(&[Op::delete(KIND, "a", Precondition::Absent)]),
        KIND,
        "a",
        Precondition::Absent,
        Some(r1),
    );

    // A real delete spends a revision and emits a tombstone; a no-op delete in the same batch emits nothing.
    let r2 = store
        .commit(&[Op::delete(KIND, "missing", Precondition::Any), Op::delete(KIND, "a", Precondition::Any)])
        .expect("delete");
    assert_eq!(r2, r1 + 1);
    assert_eq!(store.get(KIND, "a").expect("get"), None);
    assert_eq!(keys(&store.list(KIND).expect("list")), ["b"]);
    assert_eq!(
        store.changes_since(r1, 100).expect("changes"),
        vec![Change { revision: r2, kind: KIND.into(), key: "a".into(), value: None }]
    );

    // A deleted object can be re-created with Absent, and gets the new revision as its version.
    let r3 = store.commit(&[Op::put(KIND, "a", "again", Precondition::Absent)]).expect("re-create");
    assert_eq!(store.get(KIND, "a").expect("get").expect("a").version, r3);
}

fn change(revision: Revision, key: &str, value: Option<&str>) -> Change {
    Change { revision, kind: KIND.into(), key: key.into(), value: value.map(|v| v.as_bytes().to_vec()) }
}

fn changes_since_order_and_paging(store: &dyn Store) {
    store.commit(&[put("c", "1"), put("a", "1"), put("b", "1")]).expect("r1");
    store.commit(&[put("a", "2")]).expect("r2");
    store.commit(&[put("d", "1"), Op::delete(KIND, "c", Precondition::Any)]).expect("r3");
    let all = vec![
        // Within a revision, changes keep the batch's op order.
        change(1, "c", Some("1")),
        change(1, "a", Some("1")),
        change(1, "b", Some("1")),
        change(2, "a", Some("2")),
        change(3, "d", Some("1")),
        change(3, "c", None),
    ];
    assert_eq!(store.changes_since(0, 100).expect("changes"), all);
    assert_eq!(store.changes_since(0, usize::MAX).expect("changes"), all);

    // Pages never split a revision: a limit smaller than a revision still returns all of it.
    assert_eq!(store.changes_since(0, 1).expect("changes"), all[..3]);
    assert_eq!(store.changes_since(0, 2).expect("changes"), all[..3]);
    assert_eq!(store.changes_since(0, 3).expect("changes"), all[..3]);
    assert_eq!(store.changes_since(0, 4).expect("changes"), all[..4]);
    assert_eq!(store.changes_since(0, 5).expect("changes"), all[..6]);
    assert_eq!(store.changes_since(1, 1).expect("changes"), all[3..4]);
    assert_eq!(store.changes_since(2, 1).expect("changes"), all[4..]);
    assert!(store.changes_since(3, 100).expect("changes").is_empty());
    assert!(store.changes_since(99, 100).expect("changes").is_empty());
    assert!(store.changes_since(0, 0).expect("changes").is_empty());

    // Following the feed page by page with a tiny limit reproduces it exactly.
    let mut followed = Vec::new();
    let mut after = 0;
    loop {
        let page = store.changes_since(after, 1).expect("changes");
        let Some(last) = page.last() else { break };
        after = last.revision;
        followed.extend(page);
    }
    assert_eq!(followed, all);
    assert_eq!(after, store.revision().expect("revision"));
}

#[allow(clippy::disallowed_methods)] // measures that the waiter was woken, not timed out
fn wait_for_revision_wakes_on_commit(store: &dyn Store) {
    let current = store.commit(&[put("a", "1")]).expect("seed");
    // Already past `after`: returns at once.
    assert_eq!(store.wait_for_revision(current - 1, Duration::from_secs(600)).expect("wait"), current);

    let long = Duration::from_secs(120);
    let started = std::time::Instant::now();
    let woken = std::thread::scope(|s| {
        let waiter = s.spawn(|| store.wait_for_revision(current, long));
        std::thread::sleep(Duration::from_millis(100));
        store.commit(&[put("b", "1")]).expect("commit");
        waiter.join().expect("waiter thread")
    })
    .expect("wait");
    assert_eq!(woken, current + 1);
    assert!(started.elapsed() < long / 2, "the waiter was not woken by the commit; it ran into its timeout");
}

fn wait_for_revision_times_out(store: &dyn Store) {
    let current = store.commit(&[put("a", "1")]).expect("seed");
    assert_eq!(store.wait_for_revision(current, Duration::from_millis(50)).expect("wait"), current);
    // A refused commit wakes nobody into a new revision either.
    let _ = store.commit(&[Op::put(KIND, "a", "2", Precondition::Absent)]);
    assert_eq!(store.wait_for_revision(current, Duration::from_millis(50)).expect("wait"), current);
}

fn compaction(store: &dyn Store) {
    for i in 1..=5 {
        store.commit(&[put(&format!("k{i}"), "v")]).expect("commit");
    }
    store.compact(3).expect("compact");

    let kept = store.changes_since(2, 100).expect("changes since the compaction bound");
    assert_eq!(kept.iter().map(|c| c.revision).collect::<Vec<_>>(), [3, 4, 5]);
    for after in [0, 1] {
        match store.changes_since(after, 100) {
            Err(StoreError::Compacted { requested, oldest }) => {
                assert_eq!((requested, oldest), (after, 3));
            }
            other => panic!("expected compacted after {after}, got {other:?}"),
        }
    }
    // Objects are unaffected.
    assert_eq!(store.list(KIND).expect("list").len(), 5);
    assert_eq!(store.revision().expect("revision"), 5);

    // Compaction never moves backwards.
    store.compact(1).expect("compact below the bound");
    assert!(matches!(store.changes_since(1, 100), Err(StoreError::Compacted { oldest: 3, .. })));

    // Compacting the future is capped at revision + 1: everything goes, but a reader that is
    // up to date can carry on and sees later commits.
    store.compact(1_000).expect("compact everything");
    assert!(matches!(store.changes_since(4, 100), Err(StoreError::Compacted { oldest: 6, .. })));
    assert!(store.changes_since(5, 100).expect("up to date").is_empty());
    store.commit(&[put("k6", "v")]).expect("commit");
    assert_eq!(store.changes_since(5, 100).expect("changes"), vec![change(6, "k6", Some("v"))]);
}

fn duplicate_key_refused(store: &dyn Store) {
    store.commit(&[put("a", "1")]).expect("seed");
    let before = snapshot(store, &[KIND]);
    match store.commit(&[put("b", "1"), put("a", "2"), Op::delete(KIND, "a", Precondition::Any)]) {
        Err(StoreError::DuplicateKey { kind, key }) => assert_eq!((kind.as_str(), key.as_str()), (KIND, "a")),
        other => panic!("expected a duplicate key error, got {other:?}"),
    }
    assert_eq!(snapshot(store, &[KIND]), before);
    // The same key under two kinds is two objects, not a duplicate.
    store
        .commit(&[put("z", "1"), Op::put("other", "z", "1", Precondition::Any)])
        .expect("same key, different kinds");
}

fn json_helpers(store: &dyn Store) {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Task {
        name: String,
        gpus: u32,
    }
    let task = Task { name: "train".into(), gpus: 4 };
    store.commit(&[Op::put_json(KIND, "t1", &task, Precondition::Absent).expect("encode")]).expect("commit");
    let record = store.get(KIND, "t1").expect("get").expect("t1");
    assert_eq!(decode::<Task>(&record).expect("decode"), task);
    store.commit(&[Op::put(KIND, "t2", "not json", Precondition::Absent)]).expect("commit");
    let bad = store.get(KIND, "t2").expect("get").expect("t2");
    assert!(matches!(
        decode::<Task>(&bad),
        Err(StoreError::Corrupt { ref key, .. }) if key == "t2"
    ));
}

fn large_values_and_batches(store: &dyn Store) {
    let value = vec![0xABu8; 64 * 1024];
    let ops: Vec<Op> = (0..2_000)
        .map(|i| Op::put(KIND, format!("t{i:05}"), value[..(i % 700) + 1].to_vec(), Precondition::Absent))
        .collect();
    let r = store.commit(&ops).expect("big batch");
    store.commit(&[Op::put(KIND, "huge", value.clone(), Precondition::Absent)]).expect("large value");
    let listed = store.list(KIND).expect("list");
    assert_eq!(listed.len(), 2_001);
    assert!(listed.iter().all(|rec| rec.version == r || rec.key == "huge"));
    let t1234 = listed.iter().find(|rec| rec.key == "t01234").expect("t01234");
    assert_eq!(t1234.value.len(), (1234 % 700) + 1);
    assert_eq!(store.get(KIND, "huge").expect("get").expect("huge").value, value);
    assert_eq!(store.changes_since(0, 1).expect("changes").len(), 2_000);
}

/// Generates one `#[test]` per (backend, conformance function).
macro_rules! backends {
    ($($backend:ident => $make:expr;)*) => {
        $(
            mod $backend {
                #[allow(unused_imports)]
                use super::*;

                fn run(check: fn(&dyn Store)) {
                    let (_guard, store) = $make;
                    check(&store);
                }

                #[test] fn put_get_list_ordering() { run(super::put_get_list_ordering) }
                #[test] fn versions_equal_commit_revision() { run(super::versions_equal_commit_revision) }
                #[test] fn absent_precondition() { run(super::absent_precondition) }
                #[test] fn version_precondition() { run(super::version_precondition) }
                #[test] fn failing_precondition_applies_nothing() { run(super::failing_precondition_applies_nothing) }
                #[test] fn delete_semantics() { run(super::delete_semantics) }
                #[test] fn changes_since_order_and_paging() { run(super::changes_since_order_and_paging) }
                #[test] fn wait_for_revision_wakes_on_commit() { run(super::wait_for_revision_wakes_on_commit) }
                #[test] fn wait_for_revision_times_out() { run(super::wait_for_revision_times_out) }
                #[test] fn compaction() { run(super::compaction) }
                #[test] fn duplicate_key_refused() { run(super::duplicate_key_refused) }
                #[test] fn json_helpers() { run(super::json_helpers) }
                #[test] fn large_values_and_batches() { run(super::large_values_and_batches) }
            }
        )*
    };
}

fn sqlite_file() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("store.db")).expect("open sqlite store");
    (dir, store)
}

/// A store on the test etcd cluster (`scripts/etcd-env.sh`), under a prefix of its own, so
/// each test starts from an empty store. Nothing here is adapted for etcd: the store keeps its
/// own revision counter, so revisions start at 0 and move by exactly 1 per commit on etcd too.
fn etcd() -> ((), EtcdStore) {
    let endpoints = std::env::var("MPSFLEET_TEST_ETCD").unwrap_or_else(|_| {
        panic!("MPSFLEET_TEST_ETCD is not set: bash scripts/etcd-env.sh start; eval \"$(bash scripts/etcd-env.sh env)\"")
    });
    let mut config = EtcdConfig::new(&endpoints);
    config.prefix = format!("/conformance/{}", unique());
    ((), EtcdStore::open(&config, Writers::Anyone).expect("open the etcd store"))
}

fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos());
    format!("{}-{n}-{nanos}", std::process::id())
}

backends! {
    etcd => etcd();
    memory => ((), MemoryStore::new());
    sqlite => sqlite_file();
    sqlite_in_memory => ((), SqliteStore::open_in_memory().expect("open in-memory sqlite store"));
}
