//! Service discovery as a load balancer reads it: the server's DNS (`--dns-listen`) answers
//! SRV and A records for a service's replicas over UDP and TCP, and stock HAProxy, with the
//! configuration shipped in deploy/haproxy/, finds the replicas through it alone.

mod common;

use common::dns::{ask, srv};
use common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use mpsfleet_types::discovery::TrafficState;
use mpsfleet_types::service::RolloutState;
use mpsfleet_types::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// Stock HAProxy with deploy/haproxy/haproxy.cfg, pointed at `dns`, fronting `port`, for
/// `srv_name`. Killed when dropped.
struct Haproxy(Child);

impl Haproxy {
    fn start(dir: &Path, dns: &str, front: u16, srv_name: &str) -> Haproxy {
        let shipped =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/haproxy/haproxy.cfg"))
                .expect("deploy/haproxy/haproxy.cfg");
        let socket = dir.join("haproxy.sock");
        let cfg = shipped
            .replace("nameserver mpsfleet 127.0.0.1:8600", &format!("nameserver mpsfleet {dns}"))
            .replace("bind 127.0.0.1:8080", &format!("bind 127.0.0.1:{front}"))
            .replace("/tmp/haproxy-mpsfleet.sock", &socket.display().to_string())
            .replace("_http._tcp.web.default.mpsfleet", srv_name);
        assert!(cfg.contains(srv_name) && cfg.contains(dns), "the shipped configuration changed shape");
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("haproxy (Debian's haproxy package; scripts/test.sh installs it)");
        Haproxy(child)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server answering DNS, one Docker host in pool `gpu`, and service `service` of `desired`
/// replicas, each answering with its container's hostname on a port Docker picks (mapping
/// `http`). Dropped in field order: the agent before the server.
struct Web {
    agent: Agent,
    _server: Server,
    admin: mpsfleet_client::Client,
    dns: String,
    dir: tempfile::TempDir,
}

impl Web {
    async fn start(service: &str, desired: u32) -> Web {
        let dir = tempfile::tempdir().unwrap();
        let dns = format!("127.0.0.1:{}", free_port());
        let server = Server::start_with(&dir.path().join("server"), "127.0.0.1:0", &["--dns-listen", &dns]);
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let docker = docker_env();
        let agent = Agent::start_docker(&server, &dir.path().join("a"), "gpu", "h1", &docker, &[]);
        let td = serde_json::json!({
            "family": "web",
            "networkMode": "bridge",
            "containerDefinitions": [{
                "name": "main",
                "image": docker.image,
                "command": ["/bin/sh", "-c", "hostname > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
                "portMappings": [{"containerPort": 8080, "name": "http"}],
                "stopTimeout": 2,
            }]
        });
        admin.register_taskdef(td.to_string().into_bytes()).await.unwrap();
        let create = CreateService {
            name: service.into(),
            pool: "gpu".into(),
            task_definition: "web".into(),
            desired_count: desired,
            ..Default::default()
        };
        let created = admin.create_service(&create).await.unwrap();
        assert_eq!(created.service.deregistration_delay_seconds, 2, "2 s when not given");
        Web { agent, _server: server, admin, dns, dir }
    }

    /// The SRV answer for the service's `http` port, once it has `n` targets.
    async fn published(&self, n: usize) -> Message {
        let what = format!("{n} replica(s) in DNS");
        eventually(WAIT, &what, || async {
            let m = ask(&self.dns, SRV_NAME, RecordType::SRV, false).await;
            (m.answers.len() == n).then_some(m)
        })
        .await
    }
}

/// The SRV name of the `web` service's `http` port in pool `gpu`.
const SRV_NAME: &str = "_http._tcp.web.gpu.mpsfleet.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_finds_a_services_replicas_through_the_servers_dns_alone() {
    within(async {
        let web = Web::start("Web", 2).await;
        let (admin, dns, dir) = (&web.admin, &web.dns, web.dir.path());
        // The replicas, once running, are published: SRV by their port's name, each target's
        // address in the additional section, over UDP and TCP alike; names without case.
        let m = web.published(2).await;
        let endpoints = admin.service_endpoints("Web").await.unwrap();
        let mut published = srv(&m);
        published.sort();
        let mut expected: Vec<(String, u16)> =
            endpoints.iter().map(|e| (format!("{}.web.gpu.mpsfleet.", e.task_id), e.host_port)).collect();
        expected.sort();
        assert_eq!(published, expected, "what `service endpoints` shows");
        assert!(m.metadata.authoritative && m.answers.iter().all(|r| r.ttl == 0));
        assert_eq!(m.additionals.len(), 2, "{m:?}");
        for a in &m.additionals {
            assert!(expected.iter().any(|(t, _)| *t == a.name.to_ascii()), "{a:?}");
            assert!(matches!(a.data, RData::A(ip) if !ip.0.is_unspecified()), "{a:?}");
        }
        let mut over_tcp = srv(&ask(dns, "_HTTP._TCP.WEB.GPU.MPSFLEET.", RecordType::SRV, true).await);
        over_tcp.iter_mut().for_each(|(t, _)| *t = t.to_lowercase());
        over_tcp.sort();
        assert_eq!(over_tcp, expected);
        let a = ask(dns, "web.gpu.mpsfleet.", RecordType::A, true).await;
        assert_eq!(a.answers.len(), 1, "both replicas are on one host: one address {a:?}");
        let nx = ask(dns, "api.gpu.mpsfleet.", RecordType::A, false).await;
        assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(
            ask(dns, "example.com.", RecordType::A, false).await.metadata.response_code,
            ResponseCode::Refused
        );

        // HAProxy knows nothing but the DNS address and the SRV name.
        let front = free_port();
        let _haproxy = Haproxy::start(dir, dns, front, "_http._tcp.web.gpu.mpsfleet");
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{front}/");
        // Round robin over both replicas: two different answers.
        let answered = std::sync::Mutex::new(std::collections::BTreeSet::new());
        eventually(WAIT, "requests served through HAProxy by both replicas", || async {
            let r = http.get(&url).send().await.ok()?;
            let ok = r.status().is_success();
            let body = r.text().await.ok()?;
            let mut seen = answered.lock().unwrap();
            if ok {
                seen.insert(body.trim().to_string());
            }
            (seen.len() == 2).then_some(())
        })
        .await;

        // Scaled to 0: the replica leaves DNS, and HAProxy stops sending it requests.
        let update = UpdateService { desired_count: Some(0), ..Default::default() };
        admin.update_service("Web", &update).await.unwrap();
        web.published(0).await;
        eventually(WAIT, "HAProxy without a replica", || async {
            let r = http.get(&url).send().await.ok()?;
            (r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE).then_some(())
        })
        .await;
    })
    .await;
}

/// A rolling deployment under a steady request rate through stock HAProxy fails no request:
/// each old replica leaves DNS (weight 0) before it is stopped, and each new one joins only once
/// it runs and is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deployment_under_load_fails_no_request() {
    within(async {
        let web = Web::start("web", 2).await;
        let (admin, dns, dir) = (&web.admin, &web.dns, web.dir.path());
        web.published(2).await;
        let front = free_port();
        let _haproxy = Haproxy::start(dir, dns, front, "_http._tcp.web.gpu.mpsfleet");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
        let url = format!("http://127.0.0.1:{front}/");
        eventually(WAIT, "HAProxy serving", || async {
            http.get(&url).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;

        // 50 requests a second, each sent at its time whatever the others do (open loop).
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let load = {
            let (http, url, stop) = (http.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sent = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_millis(20));
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    tick.tick().await;
                    let (http, url) = (http.clone(), url.clone());
                    sent.push(tokio::spawn(async move {
                        match http.get(&url).send().await {
                            Ok(r) => r.status().as_u16(),
                            Err(_) => 0,
                        }
                    }));
                }
                let mut statuses = Vec::new();
                for s in sent {
                    statuses.push(s.await.unwrap_or(0));
                }
                statuses
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let update = UpdateService { force_new_deployment: true, ..Default::default() };
        admin.update_service("web", &update).await.unwrap();
        // While it rolls, DNS shows a replica leaving (weight 0) before it goes.
        let saw_leaving = std::sync::atomic::AtomicBool::new(false);
        eventually(
            Duration::from_secs(120),
            "the deployment to complete with the old tasks gone",
            || async {
                let m = ask(dns, SRV_NAME, RecordType::SRV, false).await;
                if m.answers.iter().any(|r| matches!(&r.data, RData::SRV(s) if s.weight == 0)) {
                    saw_leaving.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                let d = admin.service_deployments("web").await.ok()?;
                let live = admin.list_tasks(&Default::default()).await.ok()?;
                let running = live.iter().filter(|t| t.last_status != TaskStatus::Stopped).count();
                (d[0].deployment.rollout_state == RolloutState::Completed && running == 2).then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let statuses = load.await.unwrap();
        let failed: Vec<&u16> = statuses.iter().filter(|s| **s != 200).collect();
        assert!(statuses.len() > 100, "{} requests", statuses.len());
        assert!(failed.is_empty(), "{} of {} requests failed: {failed:?}", failed.len(), statuses.len());
        assert!(saw_leaving.into_inner(), "no replica was seen leaving with weight 0");
    })
    .await;
}

/// The replica `id` once it is STOPPED.
async fn stopped(admin: &mpsfleet_client::Client, id: &TaskId) -> Task {
    eventually(WAIT, "the replica stopped", || async {
        let t = admin.describe_task(&id.to_string()).await.ok()?;
        (t.last_status == TaskStatus::Stopped).then_some(t)
    })
    .await
}

/// Whether the SRV answer holds a target with weight 0 (a replica leaving traffic).
fn leaving(m: &Message) -> bool {
    m.answers.iter().any(|r| matches!(&r.data, RData::SRV(s) if s.weight == 0))
}

/// An operator's `task stop` of a service's replica and a host's drain are planned stops: the
/// replica leaves DNS (weight 0) for the service's delay before it gets its stop, as a
/// deployment's are; ECS sees it DEACTIVATING, desired STOPPED, meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_stop_and_a_host_drain_take_the_replica_out_of_traffic_first() {
    within(async {
        let web = Web::start("web", 2).await;
        let admin = &web.admin;
        web.published(2).await;
        let live = |tasks: Vec<Task>| -> Vec<Task> {
            tasks
                .into_iter()
                .filter(|t| t.last_status == TaskStatus::Running && t.draining.is_none())
                .collect()
        };

        // `task stop`: weight 0 at once, the stop 2 s later, a replacement in its place.
        let victim = live(admin.list_tasks(&Default::default()).await.unwrap()).remove(0);
        let answered = admin.stop_task(&victim.id.to_string(), None).await.unwrap();
        let d = answered.draining.clone().expect("a replica in traffic drains before its stop");
        assert_eq!((d.stop_code, d.until_ms - d.since_ms), (StopCode::UserInitiated, 2_000));
        assert_eq!(answered.desired_status, TaskStatus::Running, "it runs on while it drains");
        // Within its 2 s out of traffic (the zone is rebuilt at most every 50 ms).
        eventually(Duration::from_millis(1_500), "the stopped replica at weight 0", || async {
            leaving(&ask(&web.dns, SRV_NAME, RecordType::SRV, false).await).then_some(())
        })
        .await;
        // What `service describe` shows is what DNS publishes: the stopped one leaving, the
        // other in.
        let shown = admin.describe_service("web").await.unwrap().traffic;
        let state_of =
            |id: &TaskId| shown.iter().find(|r| &r.task_id == id).map(|r| (r.state, r.why.clone()));
        let (state, why) = state_of(&victim.id).expect("the stopped replica is listed");
        assert_eq!(state, TrafficState::Leaving, "{shown:?}");
        assert!(why.contains("stopped by the user"), "{why}");
        assert!(
            shown.iter().any(|r| r.task_id != victim.id && r.state == TrafficState::In && r.why.is_empty()),
            "{shown:?}"
        );
        let t = stopped(admin, &victim.id).await;
        assert_eq!(t.stop_code, Some(StopCode::UserInitiated));
        assert!(t.stopped_at_ms.is_some_and(|at| at >= d.until_ms), "{t:?} stopped before {}", d.until_ms);
        web.published(2).await;

        // A host's drain: its replicas move to a second host, leaving traffic before they stop.
        let docker = docker_env();
        let _h2 = Agent::start_docker(&web._server, &web.dir.path().join("b"), "gpu", "h2", &docker, &[]);
        let hosts = eventually(WAIT, "h2 ACTIVE", || async {
            let hosts = admin.list_hosts(None).await.ok()?;
            let id = |name: &str| hosts.iter().find(|h| h.hostname == name).map(|h| (h.id.clone(), h.status));
            match (id("h1"), id("h2")) {
                (Some((h1, _)), Some((h2, HostStatus::Active))) => Some((h1, h2)),
                _ => None,
            }
        })
        .await;
        let (h1, h2) = hosts;
        let on_h1 = live(admin.list_tasks(&Default::default()).await.unwrap());
        assert!(on_h1.iter().all(|t| t.host_id.as_ref() == Some(&h1)), "{on_h1:?}");
        admin.host_action(h1.as_str(), "drain").await.unwrap();
        let drained = eventually(WAIT, "h1's replicas leaving traffic", || async {
            let tasks = admin.list_tasks(&Default::default()).await.ok()?;
            let leaving: Vec<Task> = (tasks.into_iter())
                .filter(|t| t.draining.as_ref().is_some_and(|d| d.stop_code == StopCode::HostReplaced))
                .collect();
            (!leaving.is_empty()).then_some(leaving)
        })
        .await;
        for t in drained {
            let d = t.draining.clone().unwrap();
            assert_eq!(d.stop_code, StopCode::HostReplaced, "{t:?}");
            let s = stopped(admin, &t.id).await;
            assert_eq!(s.stop_code, Some(StopCode::HostReplaced));
            assert!(
                s.stopped_at_ms.is_some_and(|at| at >= d.until_ms),
                "{s:?} stopped before {}",
                d.until_ms
            );
        }
        web.published(2).await;
        let on: Vec<Option<HostId>> = live(admin.list_tasks(&Default::default()).await.unwrap())
            .into_iter()
            .map(|t| t.host_id)
            .collect();
        assert!(on.iter().all(|h| h.as_ref() == Some(&h2)), "{on:?}");
        // Each replica was moved once, not again while it drained: 2 first, 1 replacing the
        // stopped one, 2 moved.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let all = admin.list_tasks(&Default::default()).await.unwrap();
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(admin.describe_host(h1.as_str()).await.unwrap().status, HostStatus::Draining);
        // The drain's incident says when they left traffic, before their stop.
        let incident = admin.list_incidents().await.unwrap().into_iter().find(|i| i.incident.host_id == h1);
        let incident = incident.expect("the drain's incident").incident;
        let left = incident.timeline.iter().find(|e| e.step == Step::LeftTraffic);
        let left = left.unwrap_or_else(|| panic!("no LEFT_TRAFFIC: {:?}", incident.timeline));
        assert!(left.detail.starts_with("2 replica(s) left service discovery"), "{}", left.detail);
    })
    .await;
}

/// A host whose agent stops answering takes its replicas out of DNS at its first missed
/// heartbeats, long before the server's grace declares the host (no incident yet), while the
/// container still runs; heartbeats again bring the replica back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_host_leaves_dns_before_it_is_declared() {
    within(async {
        let web = Web::start("web", 1).await;
        let admin = &web.admin;
        web.published(1).await;
        let pid = web.agent.child.id().to_string();
        assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
        web.published(0).await;
        assert!(admin.list_incidents().await.unwrap().is_empty(), "the host is not declared yet");
        let shown = admin.describe_service("web").await.unwrap().traffic;
        assert_eq!(shown.len(), 1, "{shown:?}");
        assert_eq!(shown[0].state, TrafficState::Out, "{shown:?}");
        assert!(shown[0].why.contains("missed 3 heartbeats"), "{shown:?}");
        // And the CLI says so, under "Traffic by replica".
        let s = &web._server;
        let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["service", "describe", "web"])
            .args(["--server", &s.url, "--token", &s.admin_token(), "--ca-file", &s.ca_file()])
            .output()
            .expect("run the CLI");
        let text = String::from_utf8_lossy(&out.stdout);
        let section =
            text.split("\nTraffic by replica:\n").nth(1).unwrap_or_else(|| panic!("no section: {text}"));
        assert!(section.contains(&format!("{}", shown[0].task_id)) && section.contains("OUT"), "{text}");
        let task = admin.list_tasks(&Default::default()).await.unwrap().remove(0);
        assert_eq!(task.last_status, TaskStatus::Running, "the replica itself runs on");
        assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
        web.published(1).await;
        let shown = admin.describe_service("web").await.unwrap().traffic;
        assert_eq!(shown[0].state, TrafficState::In, "{shown:?}");
    })
    .await;
}

/// The wall clock in milliseconds since the Unix epoch (the server's clock on this machine).
fn wall_ms() -> u64 {
    mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock)
}

/// The incident of a host that stops answering records when its replicas left service
/// discovery, and that time is the one a DNS client saw: after the agent stopped, no later
/// than the first answer without the replica, before DETECTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_hosts_incident_records_when_its_replicas_left_traffic() {
    within(async {
        let web = Web::start("web", 1).await;
        let admin = &web.admin;
        web.published(1).await;
        let pid = web.agent.child.id().to_string();
        let stopped_at = wall_ms();
        assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
        let seen_out_at = loop {
            if ask(&web.dns, SRV_NAME, RecordType::SRV, false).await.answers.is_empty() {
                break wall_ms();
            }
            assert!(wall_ms() < stopped_at + 30_000, "the replica never left DNS");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let incident = eventually(WAIT, "the host declared bad", || async {
            admin.list_incidents().await.ok()?.into_iter().next()
        })
        .await
        .incident;
        assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
        let steps: Vec<(u64, Step)> = incident.timeline.iter().map(|e| (e.at_ms, e.step)).collect();
        let left = incident.timeline.iter().find(|e| e.step == Step::LeftTraffic).unwrap_or_else(|| {
            panic!("no LEFT_TRAFFIC in {steps:?}");
        });
        assert!(
            left.detail.contains("1 replica(s) of web") && left.detail.contains("missed 3 heartbeats"),
            "{}",
            left.detail
        );
        assert!(
            left.at_ms > stopped_at && left.at_ms <= seen_out_at,
            "left traffic at {} but the agent stopped at {stopped_at} and DNS dropped it by {seen_out_at}",
            left.at_ms
        );
        let at = |s: Step| steps.iter().position(|(_, x)| *x == s).unwrap();
        assert!(at(Step::LeftTraffic) < at(Step::Detected), "{steps:?}");
    })
    .await;
}

/// The traffic benchmark's short run, as CI runs it: one of each planned event through the
/// shipped HAProxy, every request counted, none failed.
#[test]
fn the_traffic_bench_counts_every_request_through_each_event() {
    let docker = docker_env();
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["bench", "traffic", "--runs", "1", "--rate", "50", "--image", &docker.image])
        .env("DOCKER_HOST", format!("unix://{}", docker.socket.display()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let events = last["events"].as_array().unwrap();
    let names: Vec<&str> = events.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(names, ["deployment", "scale-in", "drain", "drill"]);
    for e in events {
        // 50 a second through each event's window (it lasts a few seconds at least).
        assert!(e["sent"].as_u64().unwrap() >= 50, "{e}");
        assert_eq!(e["failed"], 0, "{e}");
        assert!(e["p99_ms"].as_f64().unwrap() > 0.0, "{e}");
    }
    // A deployment replaces every replica: the old ones served until they left, the new ones
    // after they joined.
    assert!(events[0]["last_served_by_leaving_ms"].is_number(), "{}", events[0]);
    assert!(events[0]["first_served_by_new_ms"].is_number(), "{}", events[0]);
    assert_eq!(last["sent"], events.iter().map(|e| e["sent"].as_u64().unwrap()).sum::<u64>());
    // The drill killed the daemon under one replica for good: that replica left, and a new
    // one served in its place.
    assert!(events[3]["last_served_by_leaving_ms"].is_number(), "{}", events[3]);
    assert!(events[3]["first_served_by_new_ms"].is_number(), "{}", events[3]);
}

/// The configuration shipped in deploy/haproxy/ is one HAProxy accepts as it is.
#[test]
fn the_shipped_haproxy_configuration_is_valid() {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/haproxy/haproxy.cfg");
    let out = Command::new("haproxy").args(["-c", "-f", cfg]).output().expect("haproxy");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("Configuration file is valid"), "{text}");
}
