//! GPU-only: a CUDA program run by the agent as an MPS task cannot allocate past the memory its
//! task definition declares. Skipped, with the reason printed, where there is no NVIDIA GPU.

mod common;

use common::*;
use mpsfleet_types::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const PROGRAM: &str = r#"
#include <cstdio>
#include <cuda_runtime.h>
int main() {
    void *p = nullptr;
    // The task declares 1024 MiB: 1536 MiB must fail, 512 MiB must succeed.
    cudaError_t over = cudaMalloc(&p, 1536ull << 20);
    if (over == cudaSuccess) cudaFree(p);
    cudaError_t under = cudaMalloc(&p, 512ull << 20);
    printf("over_limit=%s under_limit=%s\n", over == cudaSuccess ? "ok" : "fail",
           under == cudaSuccess ? "ok" : "fail");
    return 0;
}
"#;

fn which(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cuda_program_cannot_allocate_past_its_declared_memory() {
    if let Err(e) = mpsfleet_agent::discovery::nvml() {
        println!("skipped: no NVIDIA GPU on this machine ({e})");
        return;
    }
    let Some(nvcc) = which("nvcc") else {
        println!("skipped: a GPU is present but nvcc (CUDA toolkit) is not on PATH");
        return;
    };
    let Some(mps) = mps_control() else { return };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("alloc.cu");
    let bin = dir.path().join("alloc");
    std::fs::write(&src, PROGRAM).unwrap();
    assert!(Command::new(nvcc).arg(&src).arg("-o").arg(&bin).status().unwrap().success(), "nvcc failed");

    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let _agent = Agent::start(&server, &dir.path().join("a"), 1, &mps, &[]);
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "alloc",
            "containerDefinitions": [{"name": "main", "command": [bin.display().to_string()],
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]
        })))
        .await
        .unwrap();
    eventually(Duration::from_secs(120), "an ACTIVE host", || async {
        admin.list_hosts(None).await.ok().filter(|h| h.iter().any(|h| h.status == HostStatus::Active))
    })
    .await;
    let t = admin
        .run_task(&RunTask {
            task_definition: "alloc".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let id = t.tasks[0].id.to_string();
    let done = eventually(Duration::from_secs(120), "the CUDA task to finish", || async {
        admin.describe_task(&id).await.ok().filter(|t| t.last_status == TaskStatus::Stopped)
    })
    .await;
    let out = admin
        .task_logs(&id, None, mpsfleet_types::logs::LogStreams::Stdout, 4096, None)
        .await
        .unwrap()
        .output();
    println!("task {id}: {:?}; output: {out}", done.stopped_reason);
    assert!(out.contains("over_limit=fail under_limit=ok"), "{out}");
}

/// GPU-only: an MPS container on a real GPU gets that GPU by UUID (through the NVIDIA runtime
/// or a device request, whichever the engine has), its daemon's pipe directory mounted at the
/// same path, and the MPS limits in its environment; inside it the daemon's control socket is
/// there. Skipped, with the reason printed, where there is no NVIDIA GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_container_gets_its_gpu_by_uuid_and_its_daemons_pipe_directory() {
    if let Err(e) = mpsfleet_agent::discovery::nvml() {
        println!("skipped: no NVIDIA GPU on this machine ({e})");
        return;
    }
    let docker = docker_env();
    let Some(mps) = mps_control() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let mps_arg = mps.display().to_string();
    // NVML finds the real GPUs (declared ones are used only where it finds none).
    let _agent = Agent::start_docker(
        &server,
        &dir.path().join("a"),
        "gpu",
        "gpu-docker",
        &docker,
        &["--mps-control", &mps_arg],
    );
    let command = "echo pipe=$CUDA_MPS_PIPE_DIRECTORY limit=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT \
                   pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; ls $CUDA_MPS_PIPE_DIRECTORY; sleep 600";
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "mpsc",
            "containerDefinitions": [{"name": "main", "image": docker.image, "entryPoint": ["sh", "-c"],
                "command": [command],
                "resourceRequirements": [{"type": "GPU",
                    "sharingStrategy": {"nvidiaMps": {"memory": 2048, "maxComputePercent": 40}}}]}]
        })))
        .await
        .unwrap();
    eventually(Duration::from_secs(120), "an ACTIVE docker host", || async {
        admin.list_hosts(None).await.ok().filter(|h| {
            h.iter()
                .any(|h| h.status == HostStatus::Active && h.runtime == RuntimeKind::Docker && !h.emulated)
        })
    })
    .await;
    let t = admin
        .run_task(&RunTask {
            task_definition: "mpsc".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let id = t.tasks[0].id.to_string();
    let running = eventually(Duration::from_secs(180), "the MPS container to run", || async {
        admin.describe_task(&id).await.ok().filter(|t| t.last_status == TaskStatus::Running)
    })
    .await;
    let uuid = running.gpu_ids[0].to_string();
    let cid = running.containers[0].runtime_id.clone().expect("a container id");
    let runtime = docker.inspect(&cid, "{{.HostConfig.Runtime}}").unwrap_or_default();
    let env = docker.inspect(&cid, "{{json .Config.Env}}").unwrap_or_default();
    let requests = docker.inspect(&cid, "{{json .HostConfig.DeviceRequests}}").unwrap_or_default();
    let binds = docker.inspect(&cid, "{{json .HostConfig.Binds}}").unwrap_or_default();
    println!("runtime={runtime} env={env} device_requests={requests} binds={binds}");
    if runtime == "nvidia" {
        assert!(env.contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}")), "{env}");
    } else {
        assert!(requests.contains(&uuid) && requests.contains("gpu"), "{requests}");
    }
    let out = eventually(Duration::from_secs(30), "the container's output", || async {
        let logs =
            admin.task_logs(&id, None, mpsfleet_types::logs::LogStreams::Stdout, 4096, None).await.ok()?;
        let text = logs.output();
        text.contains("control").then_some(text)
    })
    .await;
    assert!(out.contains("limit=0=2048M") && out.contains("pct=40"), "{out}");
    let pipe = out.split("pipe=").nth(1).and_then(|s| s.split_whitespace().next()).unwrap_or("").to_string();
    assert!(!pipe.is_empty() && binds.contains(&format!("{pipe}:{pipe}")), "pipe {pipe}, binds {binds}");
    admin.stop_task(&id, None).await.unwrap();
    docker.remove_containers_of_host(running.host_id.as_ref().map_or("", |h| h.as_str()));
}

/// GPU-only: what an MPS task holds on its GPU, through NVML's MPS-aware per-process queries
/// matched to the task's processes, reaches `host describe`'s GPU use and the agent's
/// metrics. A CUDA program allocates 512 MiB (under the 1024 MiB it declares) and holds it.
/// Skipped, with the reason printed, where there is no NVIDIA GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_gpu_memory_is_attributed_to_it_through_nvml() {
    const HOLD: &str = r#"
#include <cstdio>
#include <unistd.h>
#include <cuda_runtime.h>
int main() {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, 512ull << 20);
    printf("alloc=%s\n", e == cudaSuccess ? "ok" : "fail");
    fflush(stdout);
    sleep(600);
    return 0;
}
"#;
    if let Err(e) = mpsfleet_agent::discovery::nvml() {
        println!("skipped: no NVIDIA GPU on this machine ({e})");
        return;
    }
    let Some(nvcc) = which("nvcc") else {
        println!("skipped: a GPU is present but nvcc (CUDA toolkit) is not on PATH");
        return;
    };
    let Some(mps) = mps_control() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (src, bin) = (dir.path().join("hold.cu"), dir.path().join("hold"));
    std::fs::write(&src, HOLD).unwrap();
    assert!(Command::new(nvcc).arg(&src).arg("-o").arg(&bin).status().unwrap().success(), "nvcc failed");
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let _agent = Agent::start(&server, &dir.path().join("a"), 1, &mps, &[]);
    admin
        .register_taskdef(taskdef(serde_json::json!({
            "family": "hold",
            "containerDefinitions": [{"name": "main", "command": [bin.display().to_string()],
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]
        })))
        .await
        .unwrap();
    let host = eventually(Duration::from_secs(120), "an ACTIVE host", || async {
        admin.list_hosts(None).await.ok()?.into_iter().find(|h| h.status == HostStatus::Active)
    })
    .await;
    let run = RunTask {
        task_definition: "hold".into(),
        count: 1,
        pool: "gpu".into(),
        client_token: None,
        ..Default::default()
    };
    let id = admin.run_task(&run).await.unwrap().tasks[0].id;
    let used = eventually(Duration::from_secs(120), "the task's GPU memory in its host's report", || async {
        let h = admin.describe_host(host.id.as_str()).await.ok()?;
        h.gpu_use.into_iter().find(|u| u.task_id == id && u.memory_used_mib >= 512)
    })
    .await;
    println!("task {id} uses {used:?}");
    assert_eq!(used.memory_limit_mib, Some(1024));
    let text = server
        .http()
        .get(format!("{}/v1/hosts/{}/metrics", server.url, host.id))
        .bearer_auth(server.admin_token())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("mpsfleet_agent_task_gpu_memory_used_bytes") && l.contains(&id.to_string()))
        .unwrap_or_else(|| panic!("no GPU memory series for {id}:\n{text}"));
    let bytes: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes >= (512u64 << 20) as f64, "{line}");
}
