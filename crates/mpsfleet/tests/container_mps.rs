//! The real MPS daemon through a container: an MPS task run by a Docker host talks, from inside
//! its container, to its GPU's real `nvidia-cuda-mps-control` daemon through the pipe directory
//! the agent mounts. The control binary (and the libraries it needs) is put into a test image
//! built here, offline, from the host's files.

mod common;

use common::*;
use mpsfleet_types::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Builds `reference`: busybox, and the control binary at /usr/bin with its shared libraries
/// at their paths, imported into the engine (no registry involved).
fn build_client_image(docker: &DockerEnv, control: &Path, reference: &str) {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for d in ["bin", "usr/bin", "tmp"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", r.join("bin/busybox"))
        .expect("Debian's busybox-static (scripts/docker-env.sh installs it)");
    for applet in ["sh", "echo", "sleep", "ls"] {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(applet)).unwrap();
    }
    std::fs::copy(control, r.join("usr/bin/nvidia-cuda-mps-control")).unwrap();
    let ldd = Command::new("ldd").arg(control).output().expect("ldd");
    for lib in String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
        let dest = r.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(lib, &dest).unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
    let mut tar =
        Command::new("tar").arg("-C").arg(r).args(["-c", "."]).stdout(Stdio::piped()).spawn().unwrap();
    let out = Command::new("/usr/bin/docker")
        .arg("-H")
        .arg(format!("unix://{}", docker.socket.display()))
        .args(["import", "--change", "ENV PATH=/bin:/usr/bin", "-", reference])
        .stdin(tar.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(tar.wait().unwrap().success(), "tar of the image's root failed");
    assert!(out.status.success(), "docker import: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_container_reaches_its_real_daemon_through_the_mounted_pipe_directory() {
    let docker = docker_env();
    let Some(mps) = mps_control() else { return };
    let reference = format!("mpsfleet-test/mps-client:{}", std::process::id());
    build_client_image(&docker, &mps, &reference);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "mpsc").await;
    let mps_arg = mps.display().to_string();
    let _agent = Agent::start_docker(
        &server,
        &dir.path().join("a"),
        "mpsc",
        "mpsc-h0",
        &docker,
        &["--mps-control", &mps_arg, "--image-pull-behavior", "prefer-cached"],
    );
    let script = "echo pipe=$CUDA_MPS_PIPE_DIRECTORY limit=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; \
                  echo get_default_active_thread_percentage | nvidia-cuda-mps-control; \
                  echo control-exit=$?; exec sleep 600";
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "mpsclient",
            "containerDefinitions": [{"name": "main", "image": reference, "entryPoint": ["sh", "-c"],
                "command": [script], "stopTimeout": 2,
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}]}]
        })))
        .await
        .unwrap();
    eventually(Duration::from_secs(90), "an ACTIVE host with MPS answering", || async {
        let hosts = admin.list_hosts(Some("mpsc")).await.ok()?;
        hosts.into_iter().find(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok)
    })
    .await;
    let run = RunTask {
        task_definition: "mpsclient".into(),
        count: 1,
        pool: "mpsc".into(),
        client_token: None,
        ..Default::default()
    };
    let id = admin.run_task(&run).await.unwrap().tasks[0].id.to_string();
    let logs = logs_containing(
        &admin,
        &id,
        mpsfleet_types::logs::LogStreams::Stdout,
        "control-exit=",
        Duration::from_secs(90),
        "the client's answer",
    )
    .await;
    let out = logs.output();
    // The daemon answered the client in the container: its default thread percentage, and the
    // client's exit status 0 (1 with "Cannot find MPS control daemon process" otherwise).
    assert!(out.contains("100.0") && out.contains("control-exit=0"), "{out}");
    assert!(out.contains("limit=0=4096M"), "{out}");
    let task = admin.describe_task(&id).await.unwrap();
    assert_eq!(task.last_status, TaskStatus::Running, "{task:?}");
    admin.stop_task(&id, None).await.unwrap();
    if let Some(h) = &task.host_id {
        docker.remove_containers_of_host(h.as_str());
    }
    let _ = docker.cli(&["rmi", "-f", &reference]);
}
