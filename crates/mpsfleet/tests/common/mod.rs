//! Shared helpers of the process tests: start the real `mpsfleet server` binary on
//! 127.0.0.1:0 with a temporary data directory, and talk to it over HTTP.

#![allow(dead_code)]

use mpsfleet_client::Client;
use mpsfleet_types::api::{HostStatusReport, RegisterHostResponse};
use mpsfleet_types::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const H200_MIB: u64 = 143_771;

/// A running server process. Killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub data_dir: PathBuf,
}

impl Server {
    /// Starts the binary on a free port and waits until it listens.
    pub fn start(data_dir: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("MPSFLEET_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mpsfleet server");
        let stdout = child.stdout.take().expect("server stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("mpsfleet server listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url =
            rx.recv_timeout(Duration::from_secs(30)).expect("server did not start listening within 30 s");
        Server { child, url, data_dir: data_dir.to_path_buf() }
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("admin.token")).expect("admin.token").trim().to_string()
    }

    pub fn join_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("join.token")).expect("join.token").trim().to_string()
    }

    pub fn admin(&self) -> Client {
        Client::new(&self.url, Some(self.admin_token())).expect("client")
    }

    pub fn anonymous(&self) -> Client {
        Client::new(&self.url, None).expect("client")
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// An MPS task definition of `memory` MiB per task.
pub fn mps_taskdef(family: &str, memory: u64) -> Vec<u8> {
    serde_json::json!({
        "family": family,
        "containerDefinitions": [{
            "name": "main",
            "command": ["sleep", "3600"],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": memory, "maxComputePercent": 50}}}]
        }]
    })
    .to_string()
    .into_bytes()
}

/// Registers a host with `gpus` H200s through the agent API and makes it ACTIVE; returns
/// its id and a client holding its credential.
pub async fn add_host(server: &Server, pool: &str, name: &str, gpus: u32) -> (HostId, Client) {
    let joiner = Client::new(&server.url, Some(server.join_token())).expect("client");
    let reg = HostRegistration {
        pool: PoolName::new(pool).unwrap(),
        hostname: name.to_string(),
        gpus: (0..gpus)
            .map(|i| GpuInventory {
                uuid: GpuUuid::new(format!("GPU-{name}-{i}")).unwrap(),
                index: i,
                model: "NVIDIA H200".into(),
                memory_mib: H200_MIB,
                compute_capability: "9.0".into(),
                max_mps_clients: 48,
            })
            .collect(),
        mps_available: true,
        emulated: true,
    };
    let RegisterHostResponse { host_id, credential } =
        joiner.register_host(&reg).await.expect("register host");
    let agent = joiner.with_token(credential);
    agent.report_host_status(&HostStatusReport { onboarded: true }).await.expect("onboard");
    (host_id, agent)
}

pub async fn create_pool(admin: &Client, name: &str) {
    admin
        .create_pool(&CreatePool {
            name: name.into(),
            mode: None,
            strategy: None,
            compute_overcommit_percent: None,
        })
        .await
        .expect("create pool");
}
