//! Process test of host registration's group commit: concurrent registrations share commits,
//! and of two that claim one GPU, exactly one is registered, whichever commit they land in.

mod common;

use common::*;
use mpsfleet_client::ClientError;
use mpsfleet_types::*;

/// A registration of `name` with GPUs of the given UUIDs.
fn registration(name: &str, uuids: &[String]) -> HostRegistration {
    let gpus: Vec<_> = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| serde_json::json!({"uuid": u, "index": i, "model": "NVIDIA H200", "memoryMib": H200_MIB}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "pool": "gpu", "hostname": name, "gpus": gpus, "mpsAvailable": true, "emulated": true
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_concurrent_registrations_with_one_gpu_exactly_one_is_registered() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let joiner = server.client(Some(server.join_token()));

    // 100 pairs at once; the two of a pair share their second GPU.
    const PAIRS: usize = 100;
    let mut calls = tokio::task::JoinSet::new();
    for p in 0..PAIRS {
        for side in ["a", "b"] {
            let uuids = [format!("GPU-{p}-{side}"), format!("GPU-{p}-shared")];
            let (joiner, reg) = (joiner.clone(), registration(&format!("h-{p}-{side}"), &uuids));
            calls.spawn(async move { (p, joiner.register_host(&reg).await) });
        }
    }
    let mut won = vec![0usize; PAIRS];
    while let Some(done) = calls.join_next().await {
        let (p, answer) = done.unwrap();
        match answer {
            Ok(_) => won[p] += 1,
            Err(ClientError::Api { status, body }) => {
                assert_eq!((status, body.code.as_str()), (409, "AlreadyExists"), "{}", body.message);
                assert!(body.message.contains(&format!("GPU-{p}-shared")), "{}", body.message);
            }
            Err(other) => panic!("registration failed: {other}"),
        }
    }
    assert!(won.iter().all(|&n| n == 1), "registered per pair: {won:?}");

    // The winners are all there, with their GPUs, and each GPU once.
    let hosts = admin.list_hosts(Some("gpu")).await.unwrap();
    assert_eq!(hosts.len(), PAIRS);
    let gpus: std::collections::HashSet<_> =
        hosts.iter().flat_map(|h| h.gpus.iter().map(|g| g.gpu_id.as_str().to_string())).collect();
    assert_eq!(gpus.len(), 2 * PAIRS);

    // A restarted server has the same hosts, and still refuses their GPUs.
    let mut server = server;
    server.kill9();
    let server = Server::start(dir.path());
    assert_eq!(server.admin().list_hosts(Some("gpu")).await.unwrap().len(), PAIRS);
    let joiner = server.client(Some(server.join_token()));
    let again = joiner.register_host(&registration("late", &["GPU-0-shared".to_string()])).await;
    match again {
        Err(ClientError::Api { status: 409, body }) => assert_eq!(body.code, "AlreadyExists"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
}
