//! Process tests of the agent's `GPU` check: the real server and an agent with emulated GPUs
//! (and the in-process MPS model), fed Xids through the agent's `gpu-events` file.

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use std::io::Write;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// Appends `line` to the agent's `gpu-events`.
fn inject(agent: &Agent, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(agent.data_dir.join("gpu-events"))
        .expect("open gpu-events");
    writeln!(f, "{line}").expect("append to gpu-events");
}

/// The host's `GPU` check for the GPU with `index`.
fn gpu_check(view: &HostView, index: u32) -> Option<HostCheck> {
    let gpu = view.gpus.iter().find(|g| g.index == index)?;
    view.checks.iter().find(|c| c.name == "GPU" && c.gpu_id.as_ref() == Some(&gpu.gpu_id)).cloned()
}

async fn the_host(admin: &Client) -> Option<HostView> {
    let hosts = admin.list_hosts(None).await.ok()?;
    admin.describe_host(hosts.first()?.id.as_str()).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_fatal_xid_impairs_the_gpu_and_an_application_xid_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let agent = Agent::start_with_model(&server, &dir.path().join("a"), 2);

    // Every GPU reports its GPU check, OK, naming the events file.
    let view = eventually(WAIT, "both GPU checks OK on an OK host", || async {
        let view = the_host(&admin).await?;
        let both_ok = (0..2).all(|i| gpu_check(&view, i).is_some_and(|c| c.status == HealthStatus::Ok));
        (both_ok && view.health_status == HealthStatus::Ok).then_some(view)
    })
    .await;
    let check = gpu_check(&view, 0).unwrap();
    assert!(
        check.reason.starts_with("emulated GPU: events from ") && check.reason.ends_with("gpu-events"),
        "{check:?}"
    );
    assert!(view.checks.iter().any(|c| c.name == "MPS_DAEMON"), "{:?}", view.checks);

    // An application Xid (a CUDA program faulted) leaves the GPU and the host OK.
    inject(&agent, "1 13");
    eventually(WAIT, "the agent to read Xid 13", || async {
        agent.log().contains("Xid not counted against the GPU").then_some(())
    })
    .await;
    // A few heartbeats later the server still sees every check OK.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let view = the_host(&admin).await.unwrap();
    assert_eq!(view.health_status, HealthStatus::Ok, "{:?}", view.checks);
    assert_eq!(gpu_check(&view, 1).unwrap().status, HealthStatus::Ok, "{:?}", view.checks);

    // Xid 79 (fallen off the bus) impairs GPU 0 and the host; GPU 1 stays OK.
    inject(&agent, "0 79");
    let view = eventually(WAIT, "GPU 0's GPU check to be IMPAIRED", || async {
        let view = the_host(&admin).await?;
        (gpu_check(&view, 0)?.status == HealthStatus::Impaired).then_some(view)
    })
    .await;
    let check = gpu_check(&view, 0).unwrap();
    assert!(check.reason.contains("79"), "{check:?}");
    assert_eq!(gpu_check(&view, 1).unwrap().status, HealthStatus::Ok, "{:?}", view.checks);
    let view = eventually(WAIT, "the host to be IMPAIRED", || async {
        the_host(&admin).await.filter(|v| v.health_status == HealthStatus::Impaired)
    })
    .await;

    // It stays IMPAIRED: a GPU that threw a fatal Xid needs a reset.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = the_host(&admin).await.unwrap();
    let check = gpu_check(&later, 0).unwrap();
    assert_eq!(check.status, HealthStatus::Impaired, "{:?}\n{}", later.checks, agent.log());
    assert!(check.reason.contains("79"), "{check:?}");
    assert_eq!(view.health_status, HealthStatus::Impaired);
}
