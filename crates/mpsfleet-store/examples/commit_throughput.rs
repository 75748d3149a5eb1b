//! A rough throughput check for `SqliteStore` (not a test; timings depend on the machine and its disk).
//!
//! Commits batches of ~500-byte JSON task objects durably, then lists them all back and pages the feed:
//!
//! ```text
//! cargo run --release -p mpsfleet-store --example commit_throughput -- [DIR] [TOTAL] [BATCH]
//! ```
//!
//! DIR defaults to a temporary directory (put it on the disk you care about), TOTAL to 200000 objects,
//! BATCH to 5000 objects per commit.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mpsfleet_store::{Op, Precondition, SqliteStore, Store};

fn arg<T: std::str::FromStr>(n: usize, default: T) -> T {
    std::env::args().nth(n).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn rate(count: usize, took: Duration) -> f64 {
    count as f64 / took.as_secs_f64().max(1e-9)
}

#[allow(clippy::disallowed_methods)] // a benchmark reads the wall clock by definition
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir: PathBuf = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| tmp.path().to_path_buf());
    let total: usize = arg(2, 200_000);
    let batch: usize = arg(3, 5_000).max(1);
    let path = dir.join("commit_throughput.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = SqliteStore::open(&path)?;

    let padding = "x".repeat(380);
    let started = Instant::now();
    let mut written = 0;
    while written < total {
        let n = batch.min(total - written);
        let ops: Vec<Op> = (written..written + n)
            .map(|i| {
                let value = format!(
                    r#"{{"id":"task-{i:08}","pool":"default","state":"pending","gpus":1,"priority":5,"pad":"{padding}"}}"#
                );
                Op::put("task", format!("task-{i:08}"), value, Precondition::Absent)
            })
            .collect();
        store.commit(&ops)?;
        written += n;
    }
    let took = started.elapsed();
    println!(
        "commit: {written} objects in {} batches of {batch}: {took:.2?} ({:.0} objects/s)",
        written.div_ceil(batch),
        rate(written, took)
    );

    let started = Instant::now();
    let listed = store.list("task")?;
    let took = started.elapsed();
    println!("list:   {} objects: {took:.2?} ({:.0} objects/s)", listed.len(), rate(listed.len(), took));
    drop(listed);

    let started = Instant::now();
    let (mut after, mut changes) = (0, 0);
    loop {
        let page = store.changes_since(after, 10_000)?;
        let Some(last) = page.last() else { break };
        after = last.revision;
        changes += page.len();
    }
    let took = started.elapsed();
    println!("feed:   {changes} changes: {took:.2?} ({:.0} changes/s)", rate(changes, took));
    Ok(())
}
