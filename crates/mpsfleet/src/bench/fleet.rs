//! A server with a managed pool of local hosts (agents as the server's child processes), as
//! the recovery and start benchmarks run it, and the clean-up after a trial.

use anyhow::Result;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A running server whose pool `pool` has `hosts` ACTIVE, healthy local hosts.
pub struct Fleet {
    pub server: std::process::Child,
    pub admin: Client,
    /// The server's data dir (hosts' data dirs are under `hosts/<hostname>`).
    pub data: PathBuf,
}

impl Fleet {
    /// Starts `mpsfleet server` in `dir/server`, whose local agents get `agent_args`, creates
    /// the managed pool and waits (up to 120 s) until its hosts are ACTIVE and OK.
    pub async fn start(
        dir: &Path,
        agent_args: &str,
        pool: &str,
        hosts: u32,
        health: HealthPolicy,
    ) -> Result<Fleet> {
        Fleet::start_with(dir, agent_args, pool, hosts, health, &[]).await
    }

    /// [`Fleet::start`] with more `mpsfleet server` arguments.
    pub async fn start_with(
        dir: &Path,
        agent_args: &str,
        pool: &str,
        hosts: u32,
        health: HealthPolicy,
        server_args: &[&str],
    ) -> Result<Fleet> {
        let create = CreatePool {
            name: pool.into(),
            mode: Some(OwnershipMode::Managed),
            health_policy: Some(health),
            provider: Some(Provider::local(hosts)),
            ..Default::default()
        };
        Fleet::start_pool(dir, agent_args, create, hosts, server_args, false).await
    }

    /// A server whose pool is `create` (managed, with `hosts` local hosts). With `timeline`,
    /// the server and its agents log the recovery path's steps (`mpsfleet_core::timeline!`):
    /// the server's log is `dir/server.log`, each agent's its `agent.log`.
    pub async fn start_pool(
        dir: &Path,
        agent_args: &str,
        create: CreatePool,
        hosts: u32,
        server_args: &[&str],
        timeline: bool,
    ) -> Result<Fleet> {
        std::fs::create_dir_all(dir)?;
        let data = dir.join("server");
        // Quiet unless asked otherwise: the figures are the output.
        let mut log = std::env::var("MPSFLEET_LOG").unwrap_or_else(|_| "error".into());
        let stderr = if timeline {
            log.push_str(",timeline=debug");
            std::process::Stdio::from(std::fs::File::create(dir.join("server.log"))?)
        } else {
            std::process::Stdio::inherit()
        };
        let pool = create.name.clone();
        let mut server = std::process::Command::new(std::env::current_exe()?)
            .args(["server", "--listen", "127.0.0.1:0", "--local-agent-args", agent_args, "--data-dir"])
            .arg(&data)
            .args(server_args)
            .env("MPSFLEET_LOG", log)
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdout = server.stdout.take().ok_or_else(|| anyhow::anyhow!("no server output"))?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("mpsfleet server listening on ").map(str::to_string))
            .ok_or_else(|| anyhow::anyhow!("the server did not start"))?;
        // Keep reading what else the server prints, so that it never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let token = std::fs::read_to_string(data.join("admin.token"))?.trim().to_string();
        let ca = std::fs::read(data.join(mpsfleet_server::CA_FILE))?;
        let admin = Client::with_trust(&url, Some(token), &mpsfleet_client::tls::Trust::Ca(ca))?;
        admin.create_pool(&create).await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let hs = admin.list_hosts(Some(&pool)).await?;
            let ready = hs
                .iter()
                .filter(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok)
                .count();
            if ready == hosts as usize {
                break;
            }
            anyhow::ensure!(tokio::time::Instant::now() < until, "timed out waiting for the hosts");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Fleet { server, admin, data })
    }

    /// Waits (up to `limit`) until `pred` holds for the task, and returns it.
    pub async fn wait_task(&self, id: &str, limit: Duration, pred: impl Fn(&Task) -> bool) -> Result<Task> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let t = self.admin.describe_task(id).await?;
            if pred(&t) {
                return Ok(t);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < until,
                "timed out waiting for task {id} (last status {}, reason {:?})",
                t.last_status.as_str(),
                t.stopped_reason.or(t.pending_reason)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The ids of every host the fleet has had.
    pub async fn host_ids(&self) -> Result<Vec<String>> {
        Ok(self.admin.list_hosts(None).await?.into_iter().map(|h| h.id.to_string()).collect())
    }
}

/// Removes every Docker container of these hosts (a trial leaves none behind); works after
/// the fleet is gone.
pub async fn remove_containers(hosts: Vec<String>, scratch: PathBuf) -> Result<usize> {
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || -> Result<usize> {
        let mut removed = 0;
        for host in hosts {
            let cfg = mpsfleet_agent::docker::DockerConfig::new(host, scratch.clone());
            let rt = mpsfleet_agent::docker::DockerRuntime::connect(cfg, handle.clone())?;
            for (_, outcome) in rt.remove_ours(|_| true)? {
                outcome?;
                removed += 1;
            }
        }
        Ok(removed)
    })
    .await?
}

/// SIGTERM (then SIGKILL) every process that mentions `dir`: a trial's server, agents,
/// daemons and tasks.
pub fn stop_everything_in(dir: &Path) {
    let find = || -> Vec<u32> {
        mpsfleet_proc::processes()
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|&pid| pid != std::process::id() && mpsfleet_proc::mentions(pid, dir))
            .collect()
    };
    for (signal, wait_ms) in [("-TERM", 15_000u64), ("-KILL", 2_000)] {
        for pid in find() {
            let _ = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
        let mut waited = 0;
        while waited < wait_ms && !find().is_empty() {
            std::thread::sleep(Duration::from_millis(100));
            waited += 100;
        }
    }
}

/// The median of `v` (NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `q` quantile of `v` by nearest rank (NaN when empty).
pub fn quantile_f(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((v.len() as f64) * q).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
