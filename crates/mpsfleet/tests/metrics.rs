//! The metrics against a real Prometheus (Debian's `prometheus`): it scrapes a server and, through
//! the server's service discovery, an agent with the real MPS daemon; PromQL then reads back the
//! MPS memory the tasks on a GPU declared, and what a task uses of its GPU (the declared source of
//! emulated GPUs). `promtool check metrics` passes on both endpoints, `promtool check rules` on
//! deploy/'s rules, and every query of deploy/'s dashboard evaluates.

mod common;

use common::*;
use mpsfleet_client::TaskQuery;
use mpsfleet_types::access::{CreateToken, Role};
use mpsfleet_types::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
const MIB: u64 = 1 << 20;

fn tool(name: &str) -> PathBuf {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("{name} is not installed: apt-get install prometheus (scripts/test.sh installs it)")
    })
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// A Prometheus server, killed when dropped.
struct Prometheus {
    child: std::process::Child,
    url: String,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &Path, config: &str) -> Prometheus {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus");
        Prometheus { child, url: format!("http://127.0.0.1:{port}"), log }
    }

    /// The result vector of an instant query, or the error Prometheus gave.
    async fn query(&self, http: &reqwest::Client, q: &str) -> Result<Vec<serde_json::Value>, String> {
        let resp = http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", q)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let v: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(format!("{q}: {v}"));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The single value of an instant query, once it has one.
    async fn value(&self, http: &reqwest::Client, q: &str) -> Option<f64> {
        let r = self.query(http, q).await.ok()?;
        match r.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Waits until `q` has the single value `want`; fails with Prometheus's targets and log.
    async fn wait_for(&self, http: &reqwest::Client, q: &str, want: f64) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut last = None;
        while tokio::time::Instant::now() < deadline {
            last = self.value(http, q).await;
            if last == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let targets = match http.get(format!("{}/api/v1/targets", self.url)).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        panic!("{q}: wanted {want}, last {last:?}\ntargets: {targets}\nlog: {}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `promtool check metrics` on an exposition: exit status and what it said.
fn promtool_check_metrics(text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

async fn get_text(server: &Server, token: &str, path: &str) -> String {
    let resp = server.http().get(format!("{}{path}", server.url)).bearer_auth(token).send().await.unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.text().await.unwrap()
}

fn pid_of(t: &Task) -> u32 {
    let id = t.containers[0].runtime_id.as_deref().expect("a process task reports its pid");
    id.strip_prefix("pid ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("runtime id {id:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reads_the_mps_memory_tasks_declared_and_what_they_use() {
    let Some(mps) = mps_control() else { return };
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let agent_dir = dir.path().join("a");
        let agent = Agent::start(&server, &agent_dir, 2, &mps, &[]);
        let host = eventually(WAIT, "the host to be ACTIVE", || async {
            let hosts = admin.list_hosts(None).await.ok()?;
            hosts.into_iter().find(|h| h.status == HostStatus::Active)
        })
        .await;

        // Two standalone tasks and a service replica, each declaring its MPS memory.
        admin.register_taskdef(mps_taskdef("small", 1024)).await.unwrap();
        admin.register_taskdef(mps_taskdef("big", 2048)).await.unwrap();
        let mut ids = Vec::new();
        for family in ["small", "big"] {
            let run = RunTask {
                task_definition: family.into(),
                count: 1,
                pool: "gpu".into(),
                client_token: None,
                ..Default::default()
            };
            ids.push(admin.run_task(&run).await.unwrap().tasks[0].id);
        }
        admin
            .create_service(&CreateService {
                name: "web".into(),
                pool: "gpu".into(),
                task_definition: "small".into(),
                desired_count: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        let tasks: Vec<Task> = eventually(WAIT, "three RUNNING tasks", || async {
            let all = admin.list_tasks(&TaskQuery::default()).await.ok()?;
            (all.len() == 3 && all.iter().all(|t| t.last_status == TaskStatus::Running)).then_some(all)
        })
        .await;
        let declared = |t: &Task| if t.task_definition.family.as_str() == "big" { 2048 } else { 1024 };
        let mut by_gpu: BTreeMap<String, u64> = BTreeMap::new();
        for t in &tasks {
            *by_gpu.entry(t.gpu_ids[0].to_string()).or_default() += declared(t);
        }
        let small = tasks.iter().find(|t| t.id == ids[0]).unwrap();
        // What the small task uses, as the declared source of emulated GPUs says.
        let gpu_use = serde_json::json!([
            {"gpu": small.gpu_ids[0], "pid": pid_of(small), "memoryMiB": 700, "smPercent": 35},
            {"gpu": small.gpu_ids[0], "pid": 1, "memoryMiB": 5000, "smPercent": 90}
        ]);
        std::fs::write(agent_dir.join("gpu-use.json"), gpu_use.to_string()).unwrap();

        let viewer = admin
            .create_token(&CreateToken {
                role: Role::Viewer,
                description: "prometheus".into(),
                expires_in_s: None,
                pool: None,
                aws: false,
            })
            .await
            .unwrap()
            .token;
        let token_file = dir.path().join("viewer.token");
        std::fs::write(&token_file, &viewer).unwrap();
        // deploy/'s scrape configuration, pointed at this server, every 1 s, with deploy/'s rules.
        let addr = server.url.trim_start_matches("https://").to_string();
        let config = std::fs::read_to_string(repo("deploy/prometheus/prometheus.yml"))
            .unwrap()
            .replace("mpsfleet.example:7443", &addr)
            .replace("/etc/prometheus/mpsfleet-ca.pem", &server.ca_file())
            .replace("/etc/prometheus/mpsfleet.token", &token_file.display().to_string())
            .replace(
                "mpsfleet-rules.yml",
                &repo("deploy/prometheus/mpsfleet-rules.yml").display().to_string(),
            )
            .replace("15s", "1s")
            .replace("refresh_interval: 30s", "refresh_interval: 1s");
        let prom_dir = dir.path().join("prometheus");
        std::fs::create_dir_all(&prom_dir).unwrap();
        let prom = Prometheus::start(&prom_dir, &config);
        let out = Command::new(tool("promtool"))
            .arg("check")
            .arg("config")
            .arg(prom_dir.join("prometheus.yml"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();

        // The MPS memory reserved on each GPU is exactly what its tasks declared.
        for (gpu, mib) in &by_gpu {
            let q = format!("mpsfleet_agent_mps_memory_reserved_bytes{{gpu=\"{gpu}\"}}");
            prom.wait_for(&http, &q, (mib * MIB) as f64).await;
        }
        let total: u64 = by_gpu.values().sum();
        let q = "sum(mpsfleet_mps_memory_reserved_bytes{pool=\"gpu\"})";
        prom.wait_for(&http, q, (total * MIB) as f64).await;
        // The agent's series carry the host's labels from the discovery.
        let q = format!("count(mpsfleet_agent_gpu_info{{host_id=\"{}\", pool=\"gpu\"}})", host.id);
        assert_eq!(prom.value(&http, &q).await, Some(2.0), "{q}");
        let up = prom.query(&http, "up").await.unwrap();
        assert_eq!(up.len(), 2, "{up:?}");
        assert!(up.iter().all(|s| s["value"][1] == "1"), "{up:?}");

        // What the small task uses, its processes matched by pid; pid 1 is no task's.
        let q = format!("mpsfleet_agent_task_gpu_memory_used_bytes{{task=\"{}\"}}", small.id);
        prom.wait_for(&http, &q, (700 * MIB) as f64).await;
        let q = format!("mpsfleet_agent_task_sm_utilization_ratio{{task=\"{}\"}}", small.id);
        assert_eq!(prom.value(&http, &q).await, Some(0.35), "{q}");
        let q = "sum(mpsfleet_agent_task_gpu_memory_used_bytes)";
        assert_eq!(prom.value(&http, q).await, Some((700 * MIB) as f64), "{q}");
        // And `task describe` shows it next to what the task declared.
        let describe = eventually(WAIT, "task describe to show the GPU use", || async {
            let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
                .args(["task", "describe", &small.id.to_string(), "--server", &server.url])
                .args(["--token", &server.admin_token(), "--ca-file", &server.ca_file()])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.contains("700 MiB of 1024 MiB declared, SM 35%").then_some(text)
        })
        .await;
        assert!(describe.contains(&format!("GPU use:          {}", small.gpu_ids[0])), "{describe}");

        // promtool's lint passes on both endpoints.
        for path in ["/metrics".to_string(), format!("/v1/hosts/{}/metrics", host.id)] {
            let text = get_text(&server, &viewer, &path).await;
            let (ok, said) = promtool_check_metrics(&text);
            assert!(ok && said.trim().is_empty(), "promtool check metrics {path}: {said}\n{text}");
        }
        let rules = repo("deploy/prometheus/mpsfleet-rules.yml");
        let out = Command::new(tool("promtool")).args(["check", "rules"]).arg(&rules).output().unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The rules' own unit tests: a scaling pool's unmet demand fires, a fixed pool's does not.
        let tests = repo("deploy/prometheus/mpsfleet-rules-test.yml");
        let out = Command::new(tool("promtool")).args(["test", "rules"]).arg(&tests).output().unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        // Every query of the dashboard evaluates; each has data, but those that need an
        // incident to have happened. The rate() windows need two scrapes.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let dash: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(repo("deploy/grafana/mpsfleet-dashboard.json")).unwrap(),
        )
        .unwrap();
        let panels = dash["panels"].as_array().unwrap();
        assert!(panels.len() >= 20, "{}", panels.len());
        let needs_an_incident = [
            "incident_detect",
            "incident_decide",
            "incident_recover",
            "incidents_opened",
            "incidents_resolved",
        ];
        for p in panels {
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                let result =
                    prom.query(&http, expr).await.unwrap_or_else(|e| panic!("panel {}: {e}", p["title"]));
                if !needs_an_incident.iter().any(|n| expr.contains(n)) {
                    assert!(!result.is_empty(), "panel {}: {expr} has no data", p["title"]);
                }
            }
        }
        drop(agent);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_viewer_and_name_no_object_of_the_fleet() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let resp = server.http().get(format!("{}/metrics", server.url)).send().await.unwrap();
        assert_eq!(resp.status(), 401);
        // A host credential is not a viewer.
        let (host, _agent) = add_host(&server, "gpu", "h-1", 2).await;
        let text = get_text(&server, &server.admin_token(), "/metrics").await;
        assert!(text.contains("mpsfleet_hosts{pool=\"gpu\",status=\"ACTIVE\",health=\"OK\"} 1"), "{text}");
        assert!(!text.contains(host.as_str()), "a host id in the server's metrics:\n{text}");
        // Requests are counted by route template, not by path.
        let _ = admin.describe_host(host.as_str()).await.unwrap();
        let text = get_text(&server, &server.admin_token(), "/metrics").await;
        assert!(text.contains("route=\"/v1/hosts/{id}\",code=\"200\""), "{text}");
        // An agent that reported no endpoint cannot be scraped: the answer says why.
        let resp = server
            .http()
            .get(format!("{}/v1/hosts/{host}/metrics", server.url))
            .bearer_auth(server.admin_token())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 409);
        assert!(resp.text().await.unwrap().contains("has not reported where it serves its endpoint"));
    })
    .await;
}
