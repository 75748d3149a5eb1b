//! A short `mpsfleet bench soak` in CI: the whole system (a server, local hosts with the real
//! MPS daemon, process and Docker tasks, a fenced and two restart services) under random
//! faults, with no invariant broken. Every fault kind the run can inject is planned: the soak
//! injects each once before drawing at random, and this test checks, per kind, that it was
//! injected and judged against its bound. The long run is the benchmark (docs/benchmarks.md
//! "Soak"); the judge's own tests (that it catches a broken promise) are unit tests of
//! `bench::soak_judge`.

mod common;

use common::*;

/// Whether this process may mount a tmpfs, as the soak must for its disk-full fault.
fn can_mount_tmpfs() -> bool {
    let dir = std::env::temp_dir().join(format!("soak-mount-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "soak-probe"])
        .arg(&dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let _ = std::process::Command::new("umount").arg(&dir).status();
    }
    let _ = std::fs::remove_dir(&dir);
    mounted
}

#[test]
fn every_planned_fault_kind_is_injected_and_judged_with_no_invariant_broken() {
    let Some(mps) = mps_control() else { return };
    let docker = docker_env();
    let restart = format!("bash {}/../../scripts/docker-env.sh restart-engine", env!("CARGO_MANIFEST_DIR"));
    let mut planned =
        vec!["agent-kill", "agent-stop", "daemon-kill", "daemon-hang", "server-kill", "docker-restart"];
    if can_mount_tmpfs() {
        planned.push("disk-full");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["bench", "soak", "--minutes", "1", "--fault-every", "2", "--seed", "3", "--mps-control"])
        .arg(&mps)
        .args(["--image", &docker.image, "--restart-docker", &restart])
        .env("DOCKER_HOST", format!("unix://{}", docker.socket.display()))
        .output()
        .expect("run the soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "the soak failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("JSON last line");
    assert_eq!(last["violations"], 0, "{last}");
    assert!(!stdout.contains("VIOLATION"), "{stdout}");

    let mut got: Vec<&str> =
        last["planned"].as_array().expect("planned").iter().filter_map(|k| k.as_str()).collect();
    got.sort();
    planned.sort();
    assert_eq!(got, planned, "the kinds the soak planned: {last}");
    let count = |kind: &str, what: &str| last["by_kind"][kind][what].as_u64().unwrap_or(0);
    let mut injected = 0;
    for kind in &planned {
        assert!(count(kind, "injected") >= 1, "{kind} was never injected: {last}");
        assert_eq!(
            count(kind, "judged"),
            count(kind, "injected"),
            "{kind}: every injected fault judged: {last}"
        );
        assert_eq!(count(kind, "violations"), 0, "{kind}: {last}");
        injected += count(kind, "injected");
    }
    // Faults that found no target are reported apart and not counted.
    assert_eq!(last["faults"].as_u64(), Some(injected), "{last}");
    assert_eq!(last["faults_judged"].as_u64(), Some(injected), "{last}");
    assert!(last["faults_no_target"].is_u64(), "{last}");
    assert_eq!(last["unexplained_incidents"], 0, "{last}");
    // Every service's copies were sampled, the Docker service's containers among them.
    for service in ["steady", "pinned", "boxed"] {
        let seen = last["copies_seen"][service].as_u64().unwrap_or(0);
        assert!(seen >= 2, "{service}: {seen} copies sampled: {last}");
    }
    let fenced = last["max_fenced_copies"].as_u64().unwrap_or(0);
    assert!((1..=2).contains(&fenced), "{last}");
}
