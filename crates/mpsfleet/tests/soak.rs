//! A short `mpsfleet bench soak` in CI: the whole system (a server, local hosts with the real
//! MPS daemon, process and Docker tasks, a fenced and two restart services) under random
//! faults for a minute, with no invariant broken. The long run is the benchmark
//! (docs/benchmarks.md "Soak").

mod common;

use common::*;

#[test]
fn a_minute_of_random_faults_breaks_no_invariant() {
    let Some(mps) = mps_control() else { return };
    let docker = docker_env();
    let restart = format!("bash {}/../../scripts/docker-env.sh restart-engine", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["bench", "soak", "--minutes", "1", "--fault-every", "3", "--seed", "3", "--mps-control"])
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
    assert!(last["faults"].as_u64().unwrap_or(0) >= 3, "too few faults to judge: {last}");
    assert!(!stdout.contains("VIOLATION"), "{stdout}");
}
