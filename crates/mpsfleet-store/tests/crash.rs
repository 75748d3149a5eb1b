//! Durability under SIGKILL: a child process commits batches and acknowledges each on stdout; the parent
//! kills it mid-stream and checks that every acknowledged batch survived and no batch is half there.
//!
//! The child is this same test binary, re-executed with `MPSFLEET_STORE_CRASH_CHILD=<store path>` so
//! that the test function runs the child loop instead of the parent.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mpsfleet_store::{Op, Precondition, Revision, SqliteStore, Store};

const CHILD_ENV: &str = "MPSFLEET_STORE_CRASH_CHILD";
const TEST_NAME: &str = "sigkill_loses_no_acknowledged_commit";
const KIND: &str = "crash";
const BATCH: usize = 200;
/// For each child in turn (all on the same file): how many batches it acknowledges, then how long the
/// parent lets it run on before the kill, so kills land at different points of a commit.
const KILL_AFTER: [(u64, Duration); 8] = [
    (20, Duration::ZERO),
    (21, Duration::from_micros(300)),
    (22, Duration::from_micros(700)),
    (23, Duration::from_micros(1_100)),
    (24, Duration::from_micros(1_600)),
    (25, Duration::from_micros(2_200)),
    (26, Duration::from_micros(2_900)),
    (27, Duration::from_micros(3_700)),
];
/// If the child says nothing for this long, the test fails instead of hanging.
const SILENCE_LIMIT: Duration = Duration::from_secs(60);
/// A child that is never killed (parent died) stops by itself after this many batches.
const CHILD_MAX_BATCHES: u64 = 20_000;

#[test]
fn sigkill_loses_no_acknowledged_commit() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        run_child(Path::new(&path));
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store.db");
    let mut highest_acked: Option<u64> = None;
    for (round, (kill_after, grace)) in KILL_AFTER.into_iter().enumerate() {
        let acked = run_and_kill_child(&path, kill_after, grace);
        assert!(
            highest_acked.is_none_or(|h| acked.first().is_some_and(|&first| first > h)),
            "round {round}: the child restarted at batch {:?} although batch {highest_acked:?} was acknowledged",
            acked.first()
        );
        highest_acked = acked.last().copied().or(highest_acked);
        let full_batches = verify(&path, highest_acked);
        eprintln!(
            "round {round}: killed after {} acks (last acked batch {highest_acked:?}); {full_batches} batches on disk",
            acked.len()
        );
    }
}

/// Child: commit numbered batches forever, acknowledging each only after `commit` returned.
fn run_child(path: &Path) -> ! {
    let store = SqliteStore::open(path).expect("child: open store");
    // Every committed batch is one revision, so the revision is the number of batches already there.
    let mut batch: u64 = store.revision().expect("child: revision");
    let mut stdout = std::io::stdout().lock();
    while batch < CHILD_MAX_BATCHES {
        let ops: Vec<Op> = (0..BATCH)
            .map(|i| {
                Op::put(
                    KIND,
                    format!("b{batch:06}-k{i:03}"),
                    format!("{{\"batch\":{batch},\"item\":{i}}}"),
                    Precondition::Absent,
                )
            })
            .collect();
        let revision = store.commit(&ops).expect("child: commit");
        assert_eq!(revision, batch + 1, "child: unexpected revision");
        // A closed pipe means the parent is gone: stop rather than run on.
        if writeln!(stdout, "acked {batch}").and_then(|()| stdout.flush()).is_err() {
            std::process::exit(0);
        }
        batch += 1;
    }
    std::process::exit(0);
}

/// Kills the child on every exit path, so a failing parent never leaves it running.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a child on `path`, reads acks until `kill_after` of them arrived, lets it run on for `grace`,
/// SIGKILLs it, and returns every acknowledged batch number in order.
fn run_and_kill_child(path: &Path, kill_after: u64, grace: Duration) -> Vec<u64> {
    let exe = std::env::current_exe().expect("current test binary");
    let mut child = Command::new(exe)
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut child = KillOnDrop(child);

    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut acked = Vec::new();
    while (acked.len() as u64) < kill_after {
        let line = match rx.recv_timeout(SILENCE_LIMIT) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("child printed nothing for {SILENCE_LIMIT:?} after {} acks", acked.len())
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("child exited after {} acks without being killed", acked.len())
            }
        };
        acked.extend(parse_ack(&line));
    }
    std::thread::sleep(grace);
    // On Unix, Child::kill sends SIGKILL: no destructors, no flushing, nothing graceful.
    child.0.kill().expect("kill child");
    let status = child.0.wait().expect("wait for child");
    assert!(!status.success(), "child should have died from the kill, got {status}");
    // Acks the child wrote during the grace period are acknowledged commits too.
    reader.join().expect("stdout reader thread");
    acked.extend(rx.try_iter().filter_map(|line| parse_ack(&line)));
    acked
}

/// The batch number in an "acked N" line. libtest may print its own text on the same line
/// ("test name ... acked 0"), so the marker is searched for anywhere.
fn parse_ack(line: &str) -> Option<u64> {
    let at = line.find("acked ")?;
    let n =
        line[at + "acked ".len()..].trim().parse().unwrap_or_else(|e| panic!("bad ack line {line:?}: {e}"));
    Some(n)
}

/// Checks the store after a kill; returns the number of batches on disk.
fn verify(path: &Path, highest_acked: Option<u64>) -> u64 {
    let store = SqliteStore::open(path).expect("reopen after kill");
    let mut batches: BTreeMap<u64, Vec<(String, Vec<u8>, Revision)>> = BTreeMap::new();
    for record in store.list(KIND).expect("list") {
        let batch: u64 =
            record.key[1..7].parse().unwrap_or_else(|e| panic!("unexpected key {}: {e}", record.key));
        batches.entry(batch).or_default().push((record.key, record.value, record.version));
    }
    let full = batches.len() as u64;

    // Batches are committed in order, so what survived must be exactly batches 0..full...
    assert_eq!(
        batches.keys().copied().collect::<Vec<_>>(),
        (0..full).collect::<Vec<_>>(),
        "surviving batches are not a prefix"
    );
    // ...which covers every acknowledged batch (an unacknowledged one may have landed too).
    if let Some(h) = highest_acked {
        assert!(full > h, "acknowledged batch {h} was lost; only {full} batches on disk");
    }
    // Every surviving batch is complete and written by its own revision.
    for (batch, records) in &batches {
        assert_eq!(records.len(), BATCH, "batch {batch} is partially present");
        for (i, (key, value, version)) in records.iter().enumerate() {
            assert_eq!(key, &format!("b{batch:06}-k{i:03}"));
            assert_eq!(value, format!("{{\"batch\":{batch},\"item\":{i}}}").as_bytes(), "value of {key}");
            assert_eq!(*version, batch + 1, "version of {key}");
        }
    }
    // The revision and the feed agree with the objects.
    assert_eq!(store.revision().expect("revision"), full);
    let feed = store.changes_since(0, usize::MAX).expect("changes");
    assert_eq!(feed.len() as u64, full * BATCH as u64);
    for (n, change) in feed.iter().enumerate() {
        assert_eq!(change.revision, n as u64 / BATCH as u64 + 1);
    }
    full
}
