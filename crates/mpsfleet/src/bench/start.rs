//! `mpsfleet bench start`: how long a task takes from accepted (`task run` answered) to RUNNING
//! on a local host, and, with `--runtime docker`, the same image started by `docker run` in the
//! same run, sample for sample, as the baseline.

use super::fleet::{quantile_f, remove_containers, stop_everything_in, Fleet};
use anyhow::{Context, Result};
use clap::Args;
use std::time::Duration;

#[derive(Args)]
pub struct StartBench {
    /// Tasks started one after the other (each is stopped before the next).
    #[arg(long, default_value_t = 20)]
    samples: u32,
    /// `docker`: containers of `--image` on the Docker Engine at DOCKER_HOST, each sample
    /// followed by `docker run -d` of the same image and command; `process`: processes.
    #[arg(long, value_parser = ["process", "docker"], default_value = "docker")]
    runtime: String,
    /// The image to start [default: MPSFLEET_TEST_IMAGE]; it must be pulled already or
    /// pullable (the host uses `prefer-cached`, as `docker run` does).
    #[arg(long, env = "MPSFLEET_TEST_IMAGE")]
    image: Option<String>,
    /// The docker CLI for the baseline.
    #[arg(long, default_value = "docker")]
    docker: String,
}

#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn start(b: StartBench) -> Result<()> {
    anyhow::ensure!((1..=1000).contains(&b.samples), "--samples must be from 1 to 1000, got {}", b.samples);
    let docker = b.runtime == "docker";
    anyhow::ensure!(!docker || b.image.is_some(), "--runtime docker needs --image (or MPSFLEET_TEST_IMAGE)");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let dir = std::env::temp_dir().join(format!("mpsf-bench-start-{}", std::process::id()));
    let result = rt.block_on(run(&b, &dir));
    stop_everything_in(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let (ours, baseline) = result?;
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let p50 = quantile_f(ours.clone(), 0.5);
    let mut report = serde_json::json!({
        "bench": "start",
        "runtime": b.runtime,
        "samples": b.samples,
        "image": b.image,
        "accepted_to_running_ms": {"p50": round(p50), "p99": round(quantile_f(ours, 0.99))},
    });
    if let Some(base) = baseline {
        let base_p50 = quantile_f(base.clone(), 0.5);
        report["docker_run_ms"] =
            serde_json::json!({"p50": round(base_p50), "p99": round(quantile_f(base, 0.99))});
        report["p50_ratio"] = serde_json::json!((p50 / base_p50 * 100.0).round() / 100.0);
    }
    println!("{report}");
    Ok(())
}

async fn run(b: &StartBench, dir: &std::path::Path) -> Result<(Vec<f64>, Option<Vec<f64>>)> {
    use mpsfleet_types::*;
    let docker = b.runtime == "docker";
    let agent_args = format!(
        "--emulate-gpus H200:143771:1 --heartbeat-ms 200 --stop-tasks-on-exit --runtime {} --image-pull-behavior prefer-cached",
        b.runtime
    );
    let fleet = Fleet::start(dir, &agent_args, "bench", 1, HealthPolicy::default()).await?;
    let mut container = serde_json::json!({"name": "main", "command": ["sleep", "3600"], "stopTimeout": 2});
    if let (true, Some(image)) = (docker, &b.image) {
        container["image"] = image.clone().into();
    }
    let td = serde_json::json!({"family": "start", "containerDefinitions": [container]});
    fleet.admin.register_taskdef(td.to_string().into_bytes()).await?;
    let (mut ours, mut baseline) = (Vec::new(), Vec::new());
    let measured = async {
        for i in 0..b.samples {
            let run = RunTask {
                task_definition: "start".into(),
                count: 1,
                pool: "bench".into(),
                client_token: None,
                ..Default::default()
            };
            let t = fleet.admin.run_task(&run).await?.tasks.remove(0);
            let accepted = now();
            let id = t.id.to_string();
            fleet.wait_task(&id, Duration::from_secs(60), |t| t.last_status == TaskStatus::Running).await?;
            let running = now();
            ours.push(ms(running - accepted));
            fleet.admin.stop_task(&id, None).await?;
            fleet.wait_task(&id, Duration::from_secs(60), |t| t.last_status == TaskStatus::Stopped).await?;
            if docker {
                baseline.push(docker_run(b, i).await?);
            }
        }
        anyhow::Ok(())
    }
    .await;
    if docker {
        let hosts = fleet.host_ids().await?;
        remove_containers(hosts, dir.join("docker")).await?;
    }
    let mut server = fleet.server;
    let _ = server.kill();
    let _ = server.wait();
    measured?;
    Ok((ours, docker.then_some(baseline)))
}

/// `docker run -d IMAGE sleep 3600` timed until the CLI returns (the container has started),
/// then the container removed.
async fn docker_run(b: &StartBench, i: u32) -> Result<f64> {
    let image = b.image.clone().unwrap_or_default();
    let name = format!("mpsf-bench-start-{}-{i}", std::process::id());
    let cli = b.docker.clone();
    tokio::task::spawn_blocking(move || -> Result<f64> {
        let began = now();
        let out = std::process::Command::new(&cli)
            .args(["run", "-d", "--name", &name, &image, "sleep", "3600"])
            .output()
            .with_context(|| format!("cannot run {cli}"))?;
        let took = ms(now() - began);
        anyhow::ensure!(
            out.status.success(),
            "docker run failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let _ = std::process::Command::new(&cli).args(["rm", "-f", &name]).output();
        Ok(took)
    })
    .await?
}
