//! Process tests of the API: the real binary on 127.0.0.1, real SQLite, driven over HTTP.

mod common;

use common::*;
use mpsfleet_client::{ClientError, TaskQuery};
use mpsfleet_types::*;
use std::time::Duration;

fn api_error(e: ClientError) -> (u16, String, Option<String>, String) {
    match e {
        ClientError::Api { status, body } => (status, body.code, body.field, body.message),
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;

    // Task definitions: the status, the code and the field at fault.
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"{"family":"x","containerDefinitions":[{"name":"a","command":["x"],"resourceRequirements":[{"type":"GPU","value":"1","sharingStrategy":{"nvidiaMps":{"memory":1}}}]}]}"#,
            "containerDefinitions[0].resourceRequirements[0]",
            "cannot be used together",
        ),
        (
            r#"{"family":"x","containerDefinitions":[{"name":"a","command":["x"],"resourceRequirements":[{"type":"GPU","sharingStrategy":{"nvidiaMps":{"memory":0}}}]}]}"#,
            "containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.memory",
            "got 0",
        ),
        (
            r#"{"family":"x","containerDefinitions":[{"name":"a","command":["x"],"resourceRequirements":[{"type":"GPU","sharingStrategy":{"nvidiaMps":{"memory":10,"maxComputePercent":101}}}]}]}"#,
            "containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.maxComputePercent",
            "1 to 100",
        ),
        (
            r#"{"family":"x","containerDefinitions":[{"name":"a","command":["x"],"healthCheck":{"command":["CMD","true"],"interval":4}}]}"#,
            "containerDefinitions[0].healthCheck.interval",
            "5 to 300",
        ),
        (
            r#"{"family":"x","containerDefinitions":[{"name":"a","comand":["x"]}]}"#,
            "containerDefinitions[0].comand",
            "unknown field",
        ),
        ("{not json", "$", "invalid json"),
    ];
    for (json, field, fragment) in cases {
        let (status, code, got_field, message) =
            api_error(admin.register_taskdef(json.as_bytes().to_vec()).await.unwrap_err());
        assert_eq!((status, code.as_str()), (400, "InvalidTaskDefinition"), "{json}");
        assert_eq!(got_field.as_deref(), Some(*field), "{json}");
        assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
    }
    assert!(admin.list_taskdefs(None).await.unwrap().is_empty(), "a refused definition was stored");

    admin.register_taskdef(mps_taskdef("infer", 1000)).await.unwrap();
    let run = |count: u32, pool: &str, td: &str| RunTask {
        task_definition: td.into(),
        count,
        pool: pool.into(),
        client_token: None,
        ..Default::default()
    };
    for (req, field) in [
        (run(0, "gpu", "infer"), "count"),
        (run(10_001, "gpu", "infer"), "count"),
        (run(1, "nope", "infer"), "pool"),
        (run(1, "gpu", "infer:x"), "taskDefinition"),
    ] {
        let (status, code, got_field, _) = api_error(admin.run_task(&req).await.unwrap_err());
        assert_eq!((status, code.as_str(), got_field.as_deref()), (400, "InvalidParameter", Some(field)));
    }
    let (status, code, _, _) = api_error(admin.run_task(&run(1, "gpu", "other")).await.unwrap_err());
    assert_eq!((status, code.as_str()), (404, "NotFound"));
    assert!(admin.list_tasks(&TaskQuery::default()).await.unwrap().is_empty(), "a refused run left tasks");

    // A body that is not JSON, or misses a field, is refused by name.
    let (status, code, _, message) = api_error(
        admin
            .create_pool(&CreatePool {
                name: "bad name".into(),
                mode: None,
                strategy: None,
                compute_overcommit_percent: None,
                ..Default::default()
            })
            .await
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (400, "InvalidParameter"));
    assert!(message.contains("letters, digits"), "{message}");
    let (_, _, field, _) = api_error(
        admin
            .create_pool(&CreatePool {
                name: "p2".into(),
                mode: None,
                strategy: None,
                compute_overcommit_percent: Some(0),
                ..Default::default()
            })
            .await
            .unwrap_err(),
    );
    assert_eq!(field.as_deref(), Some("computeOvercommitPercent"));
    let (status, code, _, _) = api_error(
        admin
            .create_service(&CreateService {
                name: "s".into(),
                pool: "gpu".into(),
                task_definition: "infer".into(),
                desired_count: 10_001,
                resumption: None,
                deployment_configuration: None,
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (400, "InvalidParameter"));
    assert!(admin.list_services().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_limit_who_may_do_what() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("infer", 1000)).await.unwrap();

    let (status, code, _, _) = api_error(server.anonymous().list_pools().await.unwrap_err());
    assert_eq!((status, code.as_str()), (401, "Unauthorized"));
    let wrong = server.client(Some("mpsf_adm_nope".into()));
    assert_eq!(api_error(wrong.list_pools().await.unwrap_err()).0, 401);

    let (host_a, agent_a) = add_host(&server, "gpu", "a", 1).await;
    let (_host_b, agent_b) = add_host(&server, "gpu", "b", 1).await;
    // A host credential is not an admin token.
    assert_eq!(api_error(agent_a.list_pools().await.unwrap_err()).0, 403);
    // The join token registers hosts and nothing else.
    let joiner = server.client(Some(server.join_token()));
    assert_eq!(api_error(joiner.list_tasks(&TaskQuery::default()).await.unwrap_err()).0, 403);

    let out = admin
        .run_task(&RunTask {
            task_definition: "infer".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let task = &out.tasks[0];
    let (on, other) =
        if task.host_id.as_ref() == Some(&host_a) { (&agent_a, &agent_b) } else { (&agent_b, &agent_a) };
    let report = TaskStateReport {
        last_status: TaskStatus::Running,
        health_status: None,
        ready: None,
        stop_code: None,
        stopped_reason: None,
        output: None,
        containers: None,
        pull: None,
    };
    let (status, code, _, _) = api_error(other.report_task(&task.id, &report).await.unwrap_err());
    assert_eq!((status, code.as_str()), (403, "Forbidden"), "a host reported for a task of another host");
    let running = on.report_task(&task.id, &report).await.unwrap();
    assert_eq!(running.last_status, TaskStatus::Running);
    assert!(running.started_at_ms.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_wait_with_a_reason_and_are_placed_when_capacity_appears() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("big", 100_000)).await.unwrap();

    let out = admin
        .run_task(&RunTask {
            task_definition: "big:1".into(),
            count: 3,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((out.placed, out.pending), (0, 3));
    assert!(out
        .tasks
        .iter()
        .all(|t| t.pending_reason.as_deref() == Some("no ACTIVE, uncordoned, healthy host in pool gpu")));

    // One host with two H200s takes two 100,000 MiB tasks (one per GPU); the third waits.
    // Placement runs on the server's next health tick (every 250 ms) after the host opens.
    let (host, agent) = add_host(&server, "gpu", "n1", 2).await;
    let tasks = eventually(Duration::from_secs(5), "two tasks placed on the new host", || async {
        let tasks = admin.list_tasks(&TaskQuery::default()).await.unwrap();
        (tasks.iter().filter(|t| t.host_id.is_some()).count() == 2).then_some(tasks)
    })
    .await;
    let placed: Vec<&Task> = tasks.iter().filter(|t| t.host_id.is_some()).collect();
    assert_eq!(placed.len(), 2);
    assert_ne!(placed[0].gpu_ids, placed[1].gpu_ids, "two 100,000 MiB tasks on one 143,771 MiB GPU");
    let waiting = tasks.iter().find(|t| t.host_id.is_none()).unwrap();
    assert_eq!(
        waiting.pending_reason.as_deref(),
        Some("no GPU in pool gpu has 100000 MiB free for 1 MPS client(s); the largest free is 43771 MiB")
    );
    let view = admin.describe_host(host.as_str()).await.unwrap();
    assert!(view
        .gpus
        .iter()
        .all(|g| g.sharing_mode == SharingMode::NvidiaMps && g.remaining_memory_mib == 43_771));

    // The agent long-polls and sees its two tasks; a stop frees a GPU and the third is placed.
    let a = agent.assignments(0, 1).await.unwrap();
    assert_eq!(a.tasks.len(), 2);
    assert_eq!(a.task_definitions.len(), 1);
    let stopped = admin.stop_task(&placed[0].id.to_string(), None).await.unwrap();
    assert_eq!((stopped.desired_status, stopped.last_status), (TaskStatus::Stopped, TaskStatus::Pending));
    let report = TaskStateReport {
        last_status: TaskStatus::Stopped,
        health_status: None,
        ready: None,
        stop_code: Some(StopCode::UserInitiated),
        stopped_reason: None,
        output: None,
        containers: None,
        pull: None,
    };
    agent.report_task(&placed[0].id, &report).await.unwrap();
    let third = eventually(Duration::from_secs(5), "the waiting task placed on the freed GPU", || async {
        let t = admin.describe_task(&waiting.id.to_string()).await.unwrap();
        t.host_id.is_some().then_some(t)
    })
    .await;
    assert_eq!(third.host_id.as_ref(), Some(&host));
    assert_eq!(third.gpu_ids, placed[0].gpu_ids, "the freed GPU takes the waiting task");

    // Cordoned hosts take nothing new.
    admin.cordon_host(host.as_str(), true).await.unwrap();
    admin.register_taskdef(mps_taskdef("small", 10)).await.unwrap();
    let out = admin
        .run_task(&RunTask {
            task_definition: "small".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.pending, 1);
    admin.cordon_host(host.as_str(), false).await.unwrap();
    eventually(Duration::from_secs(5), "uncordoning to place the waiting task", || async {
        admin.describe_task(&out.tasks[0].id.to_string()).await.unwrap().host_id
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_when_a_task_is_assigned() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("infer", 1000)).await.unwrap();
    let (_, agent) = add_host(&server, "gpu", "n1", 1).await;
    let first = agent.assignments(0, 0).await.unwrap();
    assert!(first.tasks.is_empty());

    let poll = tokio::spawn(async move { agent.assignments(first.revision, 30).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "the long-poll answered before anything changed");
    admin
        .run_task(&RunTask {
            task_definition: "infer".into(),
            count: 1,
            pool: "gpu".into(),
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("long-poll did not wake")
        .unwrap()
        .unwrap();
    assert_eq!(got.tasks.len(), 1);
    assert!(got.revision > first.revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_keep_their_count_and_spread_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("web", 1000)).await.unwrap();
    let (h1, a1) = add_host(&server, "gpu", "n1", 2).await;
    let (h2, a2) = add_host(&server, "gpu", "n2", 2).await;

    let svc = admin
        .create_service(&CreateService {
            name: "web".into(),
            pool: "gpu".into(),
            task_definition: "web".into(),
            desired_count: 4,
            resumption: None,
            deployment_configuration: None,
            client_token: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(svc.pending_count, 4);
    let q = TaskQuery { service: Some("web".into()), ..Default::default() };
    let tasks = admin.list_tasks(&q).await.unwrap();
    assert_eq!(tasks.len(), 4);
    let on = |h: &HostId| tasks.iter().filter(|t| t.host_id.as_ref() == Some(h)).count();
    assert_eq!((on(&h1), on(&h2)), (2, 2), "replicas spread over both hosts");
    let mut gpus: Vec<&GpuUuid> = tasks.iter().flat_map(|t| &t.gpu_ids).collect();
    gpus.sort();
    gpus.dedup();
    assert_eq!(gpus.len(), 4, "one replica per GPU");

    // A replica that exits is replaced.
    let victim = &tasks[0];
    let agent = if victim.host_id.as_ref() == Some(&h1) { &a1 } else { &a2 };
    let exited = TaskStateReport {
        last_status: TaskStatus::Stopped,
        health_status: None,
        ready: None,
        stop_code: Some(StopCode::EssentialContainerExited),
        stopped_reason: Some("exit status 1".into()),
        output: None,
        containers: None,
        pull: None,
    };
    agent.report_task(&victim.id, &exited).await.unwrap();
    // The report asks for the service; the next health tick (250 ms) reconciles it.
    let mut live: Vec<Task> = Vec::new();
    for _ in 0..40 {
        live = admin
            .list_tasks(&q)
            .await
            .unwrap()
            .into_iter()
            .filter(|t| t.desired_status == TaskStatus::Running)
            .collect();
        if live.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(live.len(), 4, "the service did not replace its stopped task within 2 s");
    assert!(live.iter().all(|t| t.id != victim.id));

    // Scale in: extras are asked to stop; scale to zero and delete.
    let svc = admin
        .update_service("web", &UpdateService { desired_count: Some(1), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(svc.service.desired_count, 1);
    let live = admin
        .list_tasks(&q)
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.desired_status == TaskStatus::Running)
        .count();
    assert_eq!(live, 1);
    let deleted = admin.delete_service("web").await.unwrap();
    assert_eq!(deleted.service.status, ServiceStatus::Draining);
    let all_stopping =
        admin.list_tasks(&q).await.unwrap().iter().all(|t| t.desired_status == TaskStatus::Stopped);
    assert!(all_stopping);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_json_with_a_code() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let http = server.http();
    let token = server.admin_token();
    let anonymous = http.get(format!("{}/v1/agent/assignments", server.url)).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let cases = [
        (reqwest::Method::GET, "/v1/tasks?limit=lots", 400, "InvalidParameter"),
        (reqwest::Method::GET, "/v1/agent/assignments?after=x", 400, "InvalidParameter"),
        (reqwest::Method::DELETE, "/v1/pools", 405, "MethodNotAllowed"),
        (reqwest::Method::GET, "/v1/nothing-here", 404, "NotFound"),
        (reqwest::Method::POST, "/v1/pools", 400, "MalformedBody"),
    ];
    for (method, path, status, code) in cases {
        let resp = http
            .request(method.clone(), format!("{}{path}", server.url))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{method} {path}");
        let body: mpsfleet_types::api::ErrorBody =
            resp.json().await.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(body.code, code, "{method} {path}: {}", body.message);
        assert!(!body.message.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_policies_are_validated_updated_and_explained() {
    use mpsfleet_types::policy::*;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();

    let bad = |health: HealthPolicy| CreatePool {
        name: "p".into(),
        health_policy: Some(health),
        ..Default::default()
    };
    let cases = [
        (
            HealthPolicy { mps_probe_timeout_ms: 6_000, ..Default::default() },
            "healthPolicy.mpsProbeTimeoutMs",
        ),
        (HealthPolicy { mps_failure_threshold: 0, ..Default::default() }, "healthPolicy.mpsFailureThreshold"),
        (
            HealthPolicy { agent_heartbeat_grace_ms: 10, ..Default::default() },
            "healthPolicy.agentHeartbeatGraceMs",
        ),
    ];
    for (policy, field) in cases {
        let (status, code, got, message) = api_error(admin.create_pool(&bad(policy)).await.unwrap_err());
        assert_eq!(
            (status, code.as_str(), got.as_deref()),
            (400, "InvalidParameter", Some(field)),
            "{message}"
        );
    }
    let breaker = CreatePool {
        name: "p".into(),
        remediation_policy: Some(RemediationPolicy { storm_breaker_percent: 101, ..Default::default() }),
        ..Default::default()
    };
    let (_, _, field, _) = api_error(admin.create_pool(&breaker).await.unwrap_err());
    assert_eq!(field.as_deref(), Some("remediationPolicy.stormBreakerPercent"));
    assert!(admin.list_pools().await.unwrap().is_empty(), "a refused pool was stored");

    let managed = CreatePool {
        name: "gpu".into(),
        mode: Some(OwnershipMode::Managed),
        provider: Some(Provider::local(3)),
        ..Default::default()
    };
    admin.create_pool(&managed).await.unwrap();
    let e = admin.explain_pool("gpu").await.unwrap();
    assert_eq!(e.owner, "mpsfleet");
    assert!(e.detector.what.contains("every 5s"), "{}", e.detector.what);

    // A policy change takes effect at once, without restarting anything.
    let faster = UpdatePool {
        health_policy: Some(HealthPolicy {
            mps_probe_interval_ms: 2_000,
            mps_probe_timeout_ms: 1_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = admin.update_pool("gpu", &faster).await.unwrap();
    assert_eq!(p.health_policy.mps_probe_interval_ms, 2_000);
    let e = admin.explain_pool("gpu").await.unwrap();
    assert!(
        e.detector.what.contains("every 2s") && e.detector.what.contains("timeout of 1s"),
        "{}",
        e.detector.what
    );
    let wrong = UpdatePool {
        health_policy: Some(HealthPolicy {
            mps_probe_timeout_ms: 2_000,
            mps_probe_interval_ms: 2_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        api_error(admin.update_pool("gpu", &wrong).await.unwrap_err()).2.as_deref(),
        Some("healthPolicy.mpsProbeTimeoutMs")
    );
    assert_eq!(
        admin.describe_pool("gpu").await.unwrap().health_policy.mps_probe_interval_ms,
        2_000,
        "a refused update changed the pool"
    );

    admin
        .create_pool(&CreatePool {
            name: "ops".into(),
            mode: Some(OwnershipMode::SelfManaged),
            ..Default::default()
        })
        .await
        .unwrap();
    let e = admin.explain_pool("ops").await.unwrap();
    assert_eq!((e.owner.as_str(), e.decision.who.as_str()), ("operator", "operator"));
    assert!(e.replacement.what.starts_with("none: the operator"));
}

/// A task run retried with its client token after the server was killed gets the first run's
/// tasks: the token was committed with them. Through the CLI, as a script retrying would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_run_retried_with_its_client_token_after_a_crash_starts_nothing_new() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::start(dir.path());
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        admin.register_taskdef(mps_taskdef("infer", 1000)).await.unwrap();
        let run = |server: &Server, count: &str| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
                .args(["task", "run", "--taskdef", "infer", "--pool", "gpu", "--count", count])
                .args(["--client-token", "nightly-2026-12-01", "-o", "json", "--server", &server.url])
                .args(["--token", &server.admin_token(), "--ca-file", &server.ca_file()])
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let ids = |json: &str| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            v["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_string()).collect()
        };
        let (ok, first, err) = run(&server, "3");
        assert!(ok, "{err}");
        let listen = server.addr();
        server.kill9();
        let server = Server::start_on(dir.path(), &listen);
        let (ok, again, err) = run(&server, "3");
        assert!(ok, "{err}");
        assert_eq!(ids(&again), ids(&first));
        let all = server.admin().list_tasks(&mpsfleet_client::TaskQuery::default()).await.unwrap();
        assert_eq!(all.len(), 3, "the retry started nothing");
        let (ok, _, err) = run(&server, "4");
        assert!(!ok && err.contains("another request"), "{err}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_are_listed_a_page_at_a_time_with_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    create_pool(&server.admin(), "gpu").await;
    for n in 0..5 {
        add_host(&server, "gpu", &format!("h{n}"), 1).await;
    }
    let get = |q: &'static str| {
        server.http().get(format!("{}/v1/hosts{q}", server.url)).bearer_auth(server.admin_token()).send()
    };
    let resp = get("?limit=2&skip=1").await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-total-count"], "5");
    let page: Vec<HostView> = resp.json().await.unwrap();
    assert_eq!(page.iter().map(|h| h.hostname.as_str()).collect::<Vec<_>>(), ["h1", "h2"]);
    let all: Vec<HostView> = get("").await.unwrap().json().await.unwrap();
    assert_eq!(all.len(), 5, "no limit: every host");
    for (q, field) in [("?limit=0", "limit"), ("?limit=x", "limit"), ("?skip=-1", "skip")] {
        let resp = get(q).await.unwrap();
        assert_eq!(resp.status(), 400, "{q}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["field"], field, "{q}: {body}");
    }
}

/// A definition with several mistakes is refused with all of them in one answer: the first as
/// `field` and at the head of the message, every one in `errors` and on a line of the message,
/// and `taskdef register` prints them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_definition_lists_every_error_in_one_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("server"));
    let admin = server.admin();
    let mps = "containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps";
    let doc = serde_json::json!({
        "family": "several",
        "containerDefinitions": [{
            "name": "a", "command": ["x"], "cpu": -1,
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps":
                {"computePercentage": 50, "memoryMiB": 20480}}}]
        }]
    })
    .to_string();
    let e = admin.register_taskdef(doc.clone().into_bytes()).await.unwrap_err();
    let ClientError::Api { status, body } = e else { panic!("expected an API error") };
    assert_eq!((status, body.code.as_str()), (400, "InvalidTaskDefinition"));
    assert_eq!(body.field.as_deref(), Some("containerDefinitions[0].cpu"));
    let fields: Vec<String> = body.errors.iter().map(|e| e.field.clone()).collect();
    let want = [
        "containerDefinitions[0].cpu".to_string(),
        format!("{mps}.computePercentage"),
        format!("{mps}.memoryMiB"),
        format!("{mps}.memory"),
    ];
    assert_eq!(fields, want, "{body:?}");
    assert_eq!(body.errors[2].message, "unknown field; valid names here: maxComputePercent, memory");
    let lines: Vec<&str> = body.message.lines().collect();
    assert_eq!(lines.len(), 4, "{}", body.message);
    assert!(
        lines[0].starts_with("containerDefinitions[0].cpu: must be an integer from 0 to 262144"),
        "{lines:?}"
    );
    assert_eq!(lines[3], format!("{mps}.memory: is required"));
    assert!(admin.list_taskdefs(None).await.unwrap().is_empty(), "a refused definition was stored");

    // The CLI prints every error.
    let file = dir.path().join("several.json");
    std::fs::write(&file, &doc).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["taskdef", "register", "--file"])
        .arg(&file)
        .env("MPSFLEET_SERVER", &server.url)
        .env("MPSFLEET_TOKEN", server.admin_token())
        .env("MPSFLEET_CA_FILE", server.ca_file())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // One line each, the first after "error: ".
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), want.len(), "{stderr}");
    assert!(lines[0].starts_with(&format!("error: {}: ", want[0])), "{stderr}");
    for (line, field) in lines.iter().zip(&want).skip(1) {
        assert!(line.starts_with(&format!("{field}: ")), "{field} missing from {stderr}");
    }
    assert!(stderr.contains("InvalidTaskDefinition"), "{stderr}");
}
