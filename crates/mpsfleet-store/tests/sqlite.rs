//! SQLite-only behaviour: the file survives reopening, opening checks its directory and schema, and
//! damaged rows surface as `Corrupt`.

use std::path::Path;

use mpsfleet_store::{Change, Op, Precondition, SqliteStore, Store, StoreError};

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path).expect("open sqlite store")
}

#[test]
fn reopen_finds_objects_revision_and_feed_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.db");
    let (objects, feed, revision) = {
        let store = open(&path);
        store
            .commit(&[
                Op::put("task", "a", "1", Precondition::Absent),
                Op::put("task", "b", "1", Precondition::Absent),
                Op::put("host", "h", "1", Precondition::Absent),
            ])
            .expect("r1");
        store
            .commit(&[
                Op::put("task", "a", "2", Precondition::Version(1)),
                Op::delete("task", "b", Precondition::Any),
            ])
            .expect("r2");
        store.commit(&[Op::put("task", "c", "1", Precondition::Absent)]).expect("r3");
        store.compact(2).expect("compact");
        (
            store.list("task").expect("list"),
            store.changes_since(1, 100).expect("changes"),
            store.revision().expect("revision"),
        )
    };
    assert_eq!(revision, 3);

    let store = open(&path);
    assert_eq!(store.revision().expect("revision"), 3);
    assert_eq!(store.list("task").expect("list"), objects);
    assert_eq!(store.list("host").expect("list").len(), 1);
    assert_eq!(store.changes_since(1, 100).expect("changes"), feed);
    assert_eq!(
        feed.last(),
        Some(&Change { revision: 3, kind: "task".into(), key: "c".into(), value: Some(b"1".to_vec()) })
    );
    assert!(matches!(store.changes_since(0, 100), Err(StoreError::Compacted { oldest: 2, .. })));
    // Preconditions and the revision counter carry on from the reopened state.
    assert_eq!(store.commit(&[Op::put("task", "a", "3", Precondition::Version(2))]).expect("r4"), 4);
}

#[test]
fn open_requires_an_existing_directory_and_names_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("missing-dir").join("store.db");
    match SqliteStore::open(&path) {
        Err(e @ StoreError::Backend { op: "open", .. }) => {
            let message = e.to_string();
            assert!(message.contains("missing-dir"), "message should name the path: {message}");
        }
        Err(other) => panic!("expected an open error, got {other}"),
        Ok(_) => panic!("expected an open error, got a store"),
    }
    assert!(!dir.path().join("missing-dir").exists(), "open must not create directories");
}

#[test]
fn open_refuses_a_file_that_is_not_a_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.db");
    std::fs::write(&path, vec![b'x'; 8192]).expect("write junk");
    match SqliteStore::open(&path) {
        Err(e @ StoreError::Backend { .. }) => {
            assert!(e.to_string().contains("store.db"), "message should name the path: {e}");
        }
        Err(other) => panic!("expected a backend error, got {other}"),
        Ok(_) => panic!("opened a junk file as a store"),
    }
}

#[test]
fn open_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.db");
    drop(open(&path));
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    conn.execute("UPDATE meta SET value = 99 WHERE name = 'schema_version'", []).expect("bump schema");
    drop(conn);
    match SqliteStore::open(&path) {
        Err(e @ StoreError::Backend { op: "open", .. }) => {
            assert!(e.to_string().contains("schema version 99"), "{e}");
        }
        Err(other) => panic!("expected a schema error, got {other}"),
        Ok(_) => panic!("opened a store with a newer schema"),
    }
}

#[test]
fn damaged_rows_are_reported_as_corrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.db");
    {
        let store = open(&path);
        store
            .commit(&[
                Op::put("task", "good", "1", Precondition::Any),
                Op::put("task", "bad", "1", Precondition::Any),
            ])
            .expect("commit");
    }
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    conn.execute("UPDATE objects SET version = -5 WHERE key = 'bad'", []).expect("damage a row");
    drop(conn);

    let store = open(&path);
    assert_eq!(store.get("task", "good").expect("get").expect("good").version, 1);
    for result in [store.get("task", "bad").map(|_| ()), store.list("task").map(|_| ())] {
        match result {
            Err(StoreError::Corrupt { kind, key, .. }) => {
                assert_eq!((kind.as_str(), key.as_str()), ("task", "bad"));
            }
            other => panic!("expected corrupt task/bad, got {other:?}"),
        }
    }
}

#[test]
fn store_files_are_in_wal_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.db");
    let store = open(&path);
    store.commit(&[Op::put("task", "a", "1", Precondition::Any)]).expect("commit");
    // WAL mode is persistent in the file; a second connection sees it.
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).expect("journal mode");
    assert_eq!(mode.to_lowercase(), "wal");
    assert!(dir.path().join("store.db-wal").exists());
}
