//! SIGKILL the real server in the middle of placement batches: after a restart, everything it
//! acknowledged is there, no batch is half-applied, and GPU accounting matches the tasks.

mod common;

use common::*;
use mpsfleet_client::TaskQuery;
use mpsfleet_types::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BATCH: u32 = 200;
const TASK_MIB: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_batch_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("crash", TASK_MIB)).await.unwrap();
    for h in 0..4 {
        add_host(&server, "gpu", &format!("n{h}"), 8).await;
    }

    // Two writers submit batches back to back; every acknowledged batch is recorded.
    let acked: Arc<Mutex<HashMap<String, Vec<TaskId>>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for _ in 0..2 {
        let (admin, acked, count) = (admin.clone(), acked.clone(), count.clone());
        writers.push(tokio::spawn(async move {
            let req = RunTask {
                task_definition: "crash".into(),
                count: BATCH,
                pool: "gpu".into(),
                client_token: None,
                ..Default::default()
            };
            while let Ok(out) = admin.run_task(&req).await {
                let by = out.tasks[0].started_by.clone();
                acked.lock().unwrap().insert(by, out.tasks.iter().map(|t| t.id).collect());
                count.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while count.load(Ordering::SeqCst) < 12 {
        assert!(tokio::time::Instant::now() < deadline, "the server acknowledged too few batches");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill9();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    // A copy of the data as the crash left it, for the determinism check below.
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }

    let server = Server::start(dir.path());
    let admin = server.admin();
    let tasks = admin.list_tasks(&TaskQuery { limit: Some(1_000_000), ..Default::default() }).await.unwrap();
    let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, t)).collect();

    for (by, ids) in &acked {
        for id in ids {
            let t = by_id.get(id).unwrap_or_else(|| panic!("acknowledged task {id} of {by} was lost"));
            assert_eq!(&t.started_by, by);
        }
    }
    let mut batches: HashMap<&str, u32> = HashMap::new();
    for t in &tasks {
        *batches.entry(t.started_by.as_str()).or_default() += 1;
    }
    for (by, n) in &batches {
        assert_eq!(*n, BATCH, "batch {by} is half-applied: {n} of {BATCH} tasks");
    }
    assert!(batches.len() >= acked.len());

    // GPU accounting rebuilt from the records equals what the tasks hold, within limits.
    let mut used: HashMap<GpuUuid, (u64, u32)> = HashMap::new();
    for t in tasks.iter().filter(|t| t.holds_capacity()) {
        for g in &t.gpu_ids {
            let u = used.entry(g.clone()).or_default();
            u.0 += TASK_MIB;
            u.1 += 1;
        }
    }
    let hosts = admin.list_hosts(None).await.unwrap();
    let mut placed = 0;
    for h in &hosts {
        for g in &h.gpus {
            let (mem, clients) = used.get(&g.gpu_id).copied().unwrap_or_default();
            assert_eq!(g.total_memory_mib - g.remaining_memory_mib, mem, "GPU {} memory", g.gpu_id);
            assert_eq!(g.client_count, clients, "GPU {} clients", g.gpu_id);
            assert!(g.client_count <= g.max_clients && mem <= g.total_memory_mib);
            placed += clients;
        }
    }
    assert!(placed > 0 && tasks.iter().any(|t| t.host_id.is_none()), "the test should fill the fleet");

    // The same state gives the same decisions: the crashed copy and the restarted original
    // place the next batch identically.
    let twin = Server::start(copy.path());
    let req = RunTask {
        task_definition: "crash".into(),
        count: 20,
        pool: "gpu".into(),
        client_token: None,
        ..Default::default()
    };
    admin.stop_task(&tasks[0].id.to_string(), None).await.unwrap();
    twin.admin().stop_task(&tasks[0].id.to_string(), None).await.unwrap();
    let a = admin.run_task(&req).await.unwrap();
    let b = twin.admin().run_task(&req).await.unwrap();
    let where_ = |ts: &[Task]| ts.iter().map(|t| (t.host_id.clone(), t.gpu_ids.clone())).collect::<Vec<_>>();
    assert_eq!(where_(&a.tasks), where_(&b.tasks));
}
