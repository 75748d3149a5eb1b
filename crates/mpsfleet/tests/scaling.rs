//! Managed scaling on a whole local fleet, as a user tries it: `up --hosts 1 --max-hosts 4`, a
//! burst of mixed MPS tasks that needs more hosts, the pool grown in one step and every task
//! RUNNING; then the work gone, the quiet time passed, back to one host, and the host whose
//! task still runs never touched (its process checked alive). The real binary, the real MPS
//! daemon, tasks as processes.

mod common;

use common::up::Up;
use common::*;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::*;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);

fn taskdef(family: &str, memory: u64, seconds: u32) -> Vec<u8> {
    serde_json::json!({
        "family": family,
        "containerDefinitions": [{
            "name": "main",
            "command": ["sleep", seconds.to_string()],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": memory, "maxComputePercent": 10}}}]
        }]
    })
    .to_string()
    .into_bytes()
}

async fn live_hosts(admin: &Client) -> Vec<HostView> {
    let hosts = admin.list_hosts(None).await.unwrap();
    hosts.into_iter().filter(|h| h.status != HostStatus::Deregistered).collect()
}

/// Whether a process with exactly this command line runs on this machine.
fn process_runs(cmdline: &[&str]) -> bool {
    let want: Vec<u8> = cmdline.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want))
}

#[test]
#[allow(clippy::disallowed_methods)] // the test's own clock: the burst's time to RUNNING, from outside
fn a_burst_grows_the_pool_in_one_step_and_it_shrinks_back_without_touching_work() {
    if mps_control().is_none() {
        eprintln!("skipped: the real nvidia-cuda-mps-control is not installed (bash scripts/install-mps.sh)");
        assert!(!on_ci(), "CI installs the MPS daemon");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let up = Up::start_with(
        dir.path(),
        &dir.path().join("data"),
        1,
        &["--max-hosts", "4", "--scale-in-after", "5"],
    );
    rt.block_on(async {
        let admin = &up.admin;
        eventually(WAIT, "one ACTIVE host", || async {
            let h = live_hosts(admin).await;
            (h.len() == 1 && h[0].status == HostStatus::Active).then_some(())
        })
        .await;
        admin.register_taskdef(taskdef("m40", 40_000, 600)).await.unwrap();
        admin.register_taskdef(taskdef("m70", 70_000, 600)).await.unwrap();
        admin.register_taskdef(taskdef("keep", 1_000, 6061)).await.unwrap();
        // 12 × 40,000 and 6 × 70,000 MiB: 7 H200s' worth, 4 hosts of 2.
        let burst = Instant::now();
        for (family, count) in [("m40", 12), ("m70", 6)] {
            let req = RunTask {
                task_definition: family.into(),
                count,
                pool: "default".into(),
                ..Default::default()
            };
            admin.run_task(&req).await.unwrap();
        }
        let all = TaskQuery { live: true, ..Default::default() };
        eventually(WAIT, "18 tasks RUNNING", || async {
            let ts = admin.list_tasks(&all).await.ok()?;
            (ts.len() == 18 && ts.iter().all(|t| t.last_status == TaskStatus::Running)).then_some(())
        })
        .await;
        let took = burst.elapsed();
        println!("burst of 18 MPS tasks to the last RUNNING, the pool grown from 1 to 4 hosts: {took:?}");
        let pool = admin.describe_pool("default").await.unwrap();
        let out: Vec<&str> =
            pool.events.iter().filter(|e| e.reason == "ScaledOut").map(|e| e.message.as_str()).collect();
        println!("scale-out: {}", out.join(" | "));
        assert_eq!(out.len(), 1, "one step: {out:?}");
        assert!(out[0].starts_with("1 -> 4 host(s)"), "{out:?}");
        assert_eq!(live_hosts(admin).await.len(), 4);
        let explain = admin.explain_pool("default").await.unwrap();
        assert!(explain.scaling.is_some() && explain.last_scaling_decision.is_some(), "{explain:?}");
        assert!(
            explain.measured_launches.as_deref().is_some_and(|m| m.contains("launch(es)")),
            "{explain:?}"
        );
        println!("measured launches: {}", explain.measured_launches.as_deref().unwrap_or_default());

        // One small task stays; the burst stops. After 5 quiet seconds: one host again, the one
        // with the task, whose process still runs.
        let kept = admin
            .run_task(&RunTask {
                task_definition: "keep".into(),
                count: 1,
                pool: "default".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .tasks
            .remove(0);
        for t in admin.list_tasks(&all).await.unwrap().into_iter().filter(|t| t.id != kept.id) {
            admin.stop_task(&t.id.to_string(), None).await.unwrap();
        }
        let kept = eventually(WAIT, "the kept task RUNNING", || async {
            let t = admin.describe_task(&kept.id.to_string()).await.ok()?;
            (t.last_status == TaskStatus::Running).then_some(t)
        })
        .await;
        let left = eventually(WAIT, "back to one host", || async {
            let h = live_hosts(admin).await;
            (h.len() == 1).then_some(h)
        })
        .await;
        assert_eq!(Some(&left[0].id), kept.host_id.as_ref(), "the host with work stays");
        assert!(process_runs(&["sleep", "6061"]), "the kept task's process still runs");
        let t = admin.describe_task(&kept.id.to_string()).await.unwrap();
        assert_eq!(t.last_status, TaskStatus::Running);
        let pool = admin.describe_pool("default").await.unwrap();
        assert!(pool.events.iter().any(|e| e.reason == "ScaledIn"), "{:?}", pool.events);
        assert_eq!(pool.provider.unwrap().desired_hosts, 1);
    });
}
