//! Replays of what a holder of the join token could do to the fleet, against the real server
//! and CLI: squat on a GPU UUID so that the real host cannot join, and leave secrets in the
//! server's state for anyone who reads the database.

mod common;

use common::*;

fn cli(server: &Server, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(args)
        .args(["--server", &server.url, "--token", &server.admin_token(), "--ca-file", &server.ca_file()])
        .output()
        .expect("run the mpsfleet CLI")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_uuid_squatted_with_the_join_token_is_freed_by_host_forget() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    create_pool(&server.admin(), "gpu").await;
    let joiner = server.client(Some(server.join_token()));

    // The squatter registers first with the real machine's GPU UUID, and never heartbeats.
    let squat = joiner.register_host(&registration("gpu", "squatter", "real", 1)).await.expect("squat");
    // The real machine is refused, and told who holds its GPU and how to free it.
    let real = registration("gpu", "real-machine", "real", 1);
    let e = joiner.register_host(&real).await.unwrap_err();
    assert_eq!(e.code(), Some("AlreadyExists"), "{e}");
    let message = e.to_string();
    assert!(message.contains(&format!("registered to host {} (squatter)", squat.host_id)), "{message}");
    assert!(message.contains(&format!("mpsfleet host forget {}", squat.host_id)), "{message}");

    // The operator forgets the host that does not exist.
    let out = cli(&server, &["host", "forget", squat.host_id.as_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("DEREGISTERED"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Its credential is revoked, and the real machine joins with its GPU.
    let squatter = server.client(Some(squat.credential.clone()));
    let e = squatter.assignments(0, 0).await.unwrap_err();
    assert_eq!(e.code(), Some("Unauthorized"), "{e}");
    let joined = joiner.register_host(&real).await.expect("the real machine joins once its GPU is free");
    // A forgotten host stays forgotten, and a second forget says so.
    let out = cli(&server, &["host", "forget", squat.host_id.as_str()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already deregistered"));

    // A host that heartbeats exists: forgetting it needs --force (an impostor that heartbeats).
    let (live, _agent_client) = add_host(&server, "gpu", "live", 1).await;
    let out = cli(&server, &["host", "forget", live.as_str()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sent a heartbeat") && stderr.contains("--force"), "{stderr}");
    let out = cli(&server, &["host", "forget", live.as_str(), "--force"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hosts = server.admin().list_hosts(None).await.unwrap();
    let status = |id: &str| hosts.iter().find(|h| h.id.as_str() == id).map(|h| h.status);
    assert_eq!(status(live.as_str()), Some(mpsfleet_types::HostStatus::Deregistered));
    assert_eq!(status(joined.host_id.as_str()), Some(mpsfleet_types::HostStatus::Onboarding));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_holds_no_token_an_agent_or_a_launched_host_could_be_called_or_joined_with() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    create_pool(&server.admin(), "gpu").await;
    let joiner = server.client(Some(server.join_token()));
    let answer = joiner.register_host(&registration("gpu", "n1", "n1", 1)).await.unwrap();
    let agent_token = answer.agent_token.clone();
    assert!(agent_token.starts_with("mpsf_agent_"), "{agent_token}");
    server.kill9();

    // Neither the database nor its WAL holds a token in the clear: not the agent token, the
    // host credential, the admin or the join token.
    let mut state = Vec::new();
    for file in ["state.db", "state.db-wal"] {
        if let Ok(bytes) = std::fs::read(dir.path().join(file)) {
            state.extend(bytes);
        }
    }
    assert!(!state.is_empty());
    let admin = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();
    let join = std::fs::read_to_string(dir.path().join("join.token")).unwrap();
    for (what, secret) in [
        ("agent token", agent_token.as_str()),
        ("host credential", answer.credential.as_str()),
        ("admin token", admin.trim()),
        ("join token", join.trim()),
    ] {
        let found = state.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!found, "the {what} is stored in the clear");
    }
    // The key the agent token is derived under is the owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("server.key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 50 registrations with 1.9 MB model strings once added 200 MB to the server: now each is
/// refused before it is stored (the body is over the route's limit, or a field over its own),
/// the server's memory stays where it was, and no host is added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_with_huge_fields_are_refused_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    create_pool(&server.admin(), "gpu").await;
    let joiner = server.client(Some(server.join_token()));
    let before = rss_kib(server.child.id());
    for i in 0..50 {
        let mut reg = registration("gpu", &format!("big-{i}"), &format!("big-{i}"), 1);
        reg.gpus[0].model = "x".repeat(1_900_000);
        let e = joiner.register_host(&reg).await.unwrap_err();
        assert_eq!(e.code(), Some("PayloadTooLarge"), "{e}");
    }
    // Under the body limit, over the field's: refused naming the field and the limit.
    let mut reg = registration("gpu", "long-model", "long-model", 1);
    reg.gpus[0].model = "x".repeat(200_000);
    let e = joiner.register_host(&reg).await.unwrap_err();
    assert_eq!(e.code(), Some("InvalidParameter"), "{e}");
    assert!(e.to_string().contains("gpus[0].model: must be at most 255 bytes, got 200000 bytes"), "{e}");
    let after = rss_kib(server.child.id());
    assert!(after < before + 50 * 1024, "the server grew from {before} KiB to {after} KiB");
    assert!(server.admin().list_hosts(None).await.unwrap().is_empty());
}
