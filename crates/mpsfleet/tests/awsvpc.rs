//! `awsvpc` on Docker Engine, end to end: the real server and agent binaries on the private
//! engine of `scripts/docker-env.sh` (`eval "$(bash scripts/docker-env.sh env)"` first). Each
//! task has its own address (its pause container's, on the engine's awsvpc network), its
//! containers share it and reach each other on localhost, its ports are reached there from
//! the host, and `service endpoints` lists them.

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// A server, one pool and one docker agent (stopped containers removed after 3 s). Dropping
/// it stops the agent and removes whatever container of its host is left.
struct Fleet {
    agent: Option<Agent>,
    host: HostId,
    docker: DockerEnv,
    admin: Client,
    pool: String,
    server: Server,
    dir: tempfile::TempDir,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.agent = None;
        self.docker.remove_containers_of_host(self.host.as_str());
    }
}

const AGENT_ARGS: &[&str] = &["--container-retention-s", "3"];

impl Fleet {
    async fn start(pool: &str) -> Fleet {
        let docker = docker_env();
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, pool).await;
        let agent = Agent::start_docker(
            &server,
            &dir.path().join("a0"),
            pool,
            &format!("{pool}-h0"),
            &docker,
            AGENT_ARGS,
        );
        let p = pool.to_string();
        let hosts = eventually(WAIT, &format!("an ACTIVE host in {pool}"), || async {
            admin
                .list_hosts(Some(&p))
                .await
                .ok()
                .filter(|h| h.len() == 1 && h.iter().all(|h| h.status == HostStatus::Active))
        })
        .await;
        let host = hosts[0].id.clone();
        Fleet { agent: Some(agent), host, docker, admin, pool: pool.to_string(), server, dir }
    }

    fn restart_agent(&mut self) {
        self.agent = Some(Agent::start_docker(
            &self.server,
            &self.dir.path().join("a0"),
            &self.pool,
            &format!("{}-h0", self.pool),
            &self.docker,
            AGENT_ARGS,
        ));
    }

    fn logs(&self) -> String {
        self.agent.as_ref().map(Agent::log).unwrap_or_default()
    }

    async fn task_in(&self, id: &TaskId, status: TaskStatus) -> Task {
        task_reaching(&self.admin, id, status, WAIT, |_| true, || self.logs()).await
    }

    /// Ids of the host's containers, running or not (the pause containers too).
    fn containers(&self) -> Vec<String> {
        self.docker.containers_labelled("io.mpsfleet.host", self.host.as_str())
    }
}

/// A task definition in awsvpc mode: `web` serves its task id over HTTP on 8080; `side`
/// fetches it from `web` over localhost and serves what it got on 9090.
fn web_and_side(family: &str, image: &str) -> serde_json::Value {
    serde_json::json!({
        "family": family,
        "networkMode": "awsvpc",
        "cpu": "0.5 vCPU",
        "memory": "256",
        "containerDefinitions": [
            {
                "name": "web", "image": image, "essential": true,
                "entryPoint": ["sh", "-c"],
                "command": ["mkdir -p /www && echo \"web of $MPSFLEET_TASK_ID\" > /www/index.html && exec httpd -f -p 8080 -h /www"],
                "portMappings": [{"containerPort": 8080, "hostPort": 8080}],
            },
            {
                "name": "side", "image": image, "essential": true, "memory": 64,
                "entryPoint": ["sh", "-c"],
                "command": ["mkdir -p /www && until wget -q -O /www/index.html http://127.0.0.1:8080/; do sleep 0.2; done; exec httpd -f -p 9090 -h /www"],
                "portMappings": [{"containerPort": 9090}],
            },
        ],
    })
}

/// The body of `GET /` from `addr`, over a real TCP connection; None when it does not answer.
fn http_get(addr: &str) -> Option<String> {
    let sock: std::net::SocketAddr = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.trim().to_string())
}

async fn http_get_eventually(addr: &str) -> String {
    let a = addr.to_string();
    eventually(WAIT, &format!("an answer from {addr}"), || {
        let a = a.clone();
        async move { tokio::task::spawn_blocking(move || http_get(&a)).await.ok().flatten() }
    })
    .await
}

fn task_address(t: &Task) -> String {
    assert_eq!(t.attachments.len(), 1, "{t:?}");
    let a = &t.attachments[0];
    assert_eq!(a.kind, "ElasticNetworkInterface");
    a.private_ipv4_address().unwrap_or_else(|| panic!("no address in {a:?}")).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_awsvpc_tasks_on_one_port_each_at_its_own_address_with_containers_on_localhost() {
    within(async {
        let f = Fleet::start("awsvpc-web").await;
        let image = f.docker.image.clone();
        f.admin.register_taskdef(taskdef(web_and_side("awsvpc-web", &image))).await.unwrap();
        f.admin
            .create_service(&CreateService {
                name: "awsvpc-web".into(),
                pool: f.pool.clone(),
                task_definition: "awsvpc-web".into(),
                desired_count: 2,
                resumption: None,
                deployment_configuration: None,
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        // Both replicas run on the one host, both on port 8080: no host port is held.
        let admin = f.admin.clone();
        let endpoints = eventually(WAIT, "4 endpoints of 2 running replicas", || async {
            admin.service_endpoints("awsvpc-web").await.ok().filter(|e| e.len() == 4)
        })
        .await;
        let mut tasks: Vec<TaskId> = endpoints.iter().map(|e| e.task_id).collect();
        tasks.sort();
        tasks.dedup();
        assert_eq!(tasks.len(), 2, "{endpoints:?}");

        let mut addresses = Vec::new();
        for id in &tasks {
            let t = f.task_in(id, TaskStatus::Running).await;
            let ip = task_address(&t);
            assert_eq!(t.attachments[0].status, "ATTACHED");
            // What Docker says: the pause container's address on the awsvpc network, which
            // every container of the task joined.
            let pause = format!("mpsfleet-{}-{id}-.pause", f.host);
            let docker_ip = f
                .docker
                .inspect(&pause, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
                .expect("the task's pause container");
            assert_eq!(ip, docker_ip);
            let networks =
                f.docker.inspect(&pause, "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}");
            assert_eq!(networks.as_deref(), Some("mpsfleet-awsvpc"));
            let pause_id = f.docker.inspect(&pause, "{{.Id}}").expect("pause id");
            for c in &t.containers {
                assert_eq!(c.network_interfaces.len(), 1, "{c:?}");
                assert_eq!(c.network_interfaces[0].private_ipv4_address, ip);
                assert_eq!(c.network_interfaces[0].attachment_id, t.attachments[0].id);
                assert!(c.network_bindings.is_empty(), "no host port: {c:?}");
                let name = format!("mpsfleet-{}-{id}-{}", f.host, c.name);
                let mode = f.docker.inspect(&name, "{{.HostConfig.NetworkMode}}");
                assert_eq!(mode, Some(format!("container:{pause_id}")), "{name}");
            }
            // The task's size: a CPU quota on each container, its memory on one without its own.
            let web = format!("mpsfleet-{}-{id}-web", f.host);
            let side = format!("mpsfleet-{}-{id}-side", f.host);
            assert_eq!(f.docker.inspect(&web, "{{.HostConfig.NanoCpus}}").as_deref(), Some("500000000"));
            assert_eq!(f.docker.inspect(&web, "{{.HostConfig.Memory}}").as_deref(), Some("268435456"));
            assert_eq!(f.docker.inspect(&side, "{{.HostConfig.Memory}}").as_deref(), Some("67108864"));
            // Nothing is published on the host.
            let ports = f.docker.inspect(&pause, "{{range $p, $b := .NetworkSettings.Ports}}{{$b}}{{end}}");
            assert!(!ports.unwrap_or_default().contains("HostPort"));

            // A real TCP connection from here to the task's own address, on each port.
            let web_says = http_get_eventually(&format!("{ip}:8080")).await;
            assert_eq!(web_says, format!("web of {id}"));
            // `side` got it from `web` over localhost, inside the task's namespace.
            let side_says = http_get_eventually(&format!("{ip}:9090")).await;
            assert_eq!(side_says, format!("web of {id}"));

            // service endpoints: the task's address and its container ports.
            let mut mine: Vec<(String, String, u16)> = endpoints
                .iter()
                .filter(|e| e.task_id == *id)
                .map(|e| (e.container.clone(), e.address.clone(), e.container_port))
                .collect();
            mine.sort();
            assert_eq!(
                mine,
                [
                    ("side".to_string(), format!("{ip}:9090"), 9090),
                    ("web".to_string(), format!("{ip}:8080"), 8080)
                ]
            );
            addresses.push(ip);
        }
        assert_ne!(addresses[0], addresses[1], "each task has its own address");

        // Deleting the service stops both; their containers and pause containers all go.
        f.admin.delete_service("awsvpc-web").await.unwrap();
        for id in &tasks {
            let t = f.task_in(id, TaskStatus::Stopped).await;
            assert_eq!(t.attachments.len(), 1);
            assert_eq!(t.attachments[0].status, "DELETED");
        }
        eventually(WAIT, "every container of the host removed", || async {
            f.containers().is_empty().then_some(())
        })
        .await;
        for ip in &addresses {
            let a = format!("{ip}:8080");
            let gone = tokio::task::spawn_blocking(move || http_get(&a)).await.unwrap();
            assert_eq!(gone, None, "{ip} still answers");
        }
        // The network stays, labelled as the agent's.
        let label = f.docker.cli_ok(&[
            "network",
            "inspect",
            "--format",
            "{{index .Labels \"io.mpsfleet.network\"}}",
            "mpsfleet-awsvpc",
        ]);
        assert_eq!(label, "awsvpc");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_restart_adopts_an_awsvpc_task_with_its_pause_container() {
    within(async {
        let mut f = Fleet::start("awsvpc-adopt").await;
        let image = f.docker.image.clone();
        f.admin.register_taskdef(taskdef(web_and_side("awsvpc-adopt", &image))).await.unwrap();
        let run = f
            .admin
            .run_task(&RunTask {
                task_definition: "awsvpc-adopt".into(),
                count: 1,
                pool: f.pool.clone(),
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        let id = run.tasks[0].id;
        let t = f.task_in(&id, TaskStatus::Running).await;
        let ip = task_address(&t);
        assert_eq!(http_get_eventually(&format!("{ip}:9090")).await, format!("web of {id}"));
        let before = f.containers();
        assert_eq!(before.len(), 3, "web, side and the pause container");

        f.agent.as_mut().expect("agent").kill9();
        f.restart_agent();
        // Adopted, not restarted: the same containers, the same address, still answering.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let t = f.task_in(&id, TaskStatus::Running).await;
        assert_eq!(task_address(&t), ip);
        let mut after = f.containers();
        after.sort();
        let mut want = before.clone();
        want.sort();
        assert_eq!(after, want);
        let t = f.admin.describe_task(&id.to_string()).await.unwrap();
        for c in &t.containers {
            assert_eq!(
                c.network_interfaces.first().map(|n| n.private_ipv4_address.as_str()),
                Some(ip.as_str())
            );
        }
        assert_eq!(http_get_eventually(&format!("{ip}:8080")).await, format!("web of {id}"));

        f.admin.stop_task(&id.to_string(), None).await.unwrap();
        f.task_in(&id, TaskStatus::Stopped).await;
        eventually(WAIT, "every container of the host removed", || async {
            f.containers().is_empty().then_some(())
        })
        .await;
    })
    .await;
}
