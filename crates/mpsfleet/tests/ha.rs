//! Several servers on one etcd cluster (the test cluster of `scripts/etcd-env.sh`): one leads,
//! the others forward to it; when the leader is killed another takes over, agents and clients
//! find it (through a follower, or given every address), a retried submission with its client
//! token is answered as the first was, and the tasks that were running keep running.

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn etcd_endpoints() -> String {
    std::env::var("MPSFLEET_TEST_ETCD").unwrap_or_else(|_| {
        panic!("MPSFLEET_TEST_ETCD is not set: bash scripts/etcd-env.sh start; eval \"$(bash scripts/etcd-env.sh env)\"")
    })
}

/// Starts `mpsfleet server --store etcd` on `port`; the receiver gets each line it prints.
fn start_server(dir: &Path, port: u16, prefix: &str) -> (Server, std::sync::mpsc::Receiver<String>) {
    start_server_with(dir, port, prefix, &[])
}

fn start_server_with(
    dir: &Path,
    port: u16,
    prefix: &str,
    more: &[&str],
) -> (Server, std::sync::mpsc::Receiver<String>) {
    let etcd = etcd_endpoints();
    let mut args =
        vec!["--store", "etcd", "--etcd-endpoints", &etcd, "--etcd-prefix", prefix, "--leader-ttl", "2"];
    args.extend(more);
    let (child, lines) = Server::spawn(dir, &format!("127.0.0.1:{port}"), &args);
    (Server { child, url: format!("https://127.0.0.1:{port}"), data_dir: dir.to_path_buf() }, lines)
}

fn wait_for_line(rx: &std::sync::mpsc::Receiver<String>, prefix: &str) -> String {
    let deadline = std::time::Duration::from_secs(30);
    loop {
        let line =
            rx.recv_timeout(deadline).unwrap_or_else(|_| panic!("no line starting {prefix:?} within 30 s"));
        if line.starts_with(prefix) {
            return line;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_is_killed_and_another_server_takes_over_without_stopping_a_task() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let prefix = format!("/ha-test/{}-{}", std::process::id(), free_port());
    let ports = [free_port(), free_port(), free_port()];
    let dirs: Vec<_> = (1..=3).map(|i| tmp.path().join(format!("s{i}"))).collect();

    let (mut first, rx1) = start_server(&dirs[0], ports[0], &prefix);
    wait_for_line(&rx1, "mpsfleet server listening on ");
    // Every server of one store shares the key that seals the CA and derives agents' tokens.
    for d in &dirs[1..] {
        std::fs::create_dir_all(d).expect("dir");
        std::fs::copy(dirs[0].join("server.key"), d.join("server.key")).expect("copy server.key");
    }
    let (_second, rx2) = start_server(&dirs[1], ports[1], &prefix);
    let (_third, rx3) = start_server(&dirs[2], ports[2], &prefix);
    for rx in [&rx2, &rx3] {
        assert!(wait_for_line(rx, "following: ").contains(&format!(":{} leads", ports[0])));
        wait_for_line(rx, "forwarding requests to the leader on ");
    }
    // A follower forwards every request to the leader: a client given only its address works.
    let via_follower = Server {
        child: Command::new("true").spawn().expect("placeholder"),
        url: format!("https://127.0.0.1:{}", ports[2]),
        data_dir: dirs[0].clone(),
    };
    let status = via_follower.admin().cluster_status().await.expect("status through a follower");
    assert_eq!(status.leader.url.as_deref(), Some(format!("https://127.0.0.1:{}", ports[0]).as_str()));
    create_pool(&via_follower.admin(), "gpu").await;
    // An ECS call signed over the follower's Host verifies on the leader it is forwarded to.
    let req = mpsfleet_types::access::CreateToken {
        role: mpsfleet_types::access::Role::Viewer,
        expires_in_s: None,
        description: "ecs via a follower".into(),
        pool: None,
        aws: true,
    };
    let key = via_follower.admin().create_token(&req).await.expect("an AWS key");
    let key_id = key.view.access_key_id.expect("its id");
    let (status, answer) = ecs_call(
        &via_follower.http(),
        &via_follower.url,
        (&key_id, &key.token),
        "ListClusters",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["clusterArns"], serde_json::json!(["arn:aws:ecs:us-east-1:000000000000:cluster/gpu"]));

    // One client and one agent, each given every address; the first server's files (CA,
    // tokens) are the cluster's.
    let all = ports.iter().map(|p| format!("https://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let cluster = Server {
        child: Command::new("true").spawn().expect("placeholder"),
        url: all.clone(),
        data_dir: dirs[0].clone(),
    };
    let admin: Client = cluster.admin();
    let status = admin.cluster_status().await.expect("cluster status");
    assert_eq!(
        (status.store.as_str(), status.leader.url.as_deref()),
        ("etcd", Some(format!("https://127.0.0.1:{}", ports[0]).as_str()))
    );
    assert_eq!(status.members.len(), 3);
    assert!(status.members.iter().all(|m| m.healthy), "{status:?}");

    admin.register_taskdef(mps_taskdef("infer", 1024)).await.expect("register");
    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).expect("agent dir");
    // The agent knows one follower only: it joins, reports and gets its tasks through it.
    let agent = Agent::start_with_model(&via_follower, &agent_dir, 2);
    let run = RunTask {
        task_definition: "infer".into(),
        count: 1,
        pool: "gpu".into(),
        client_token: Some("submit-1".into()),
        ..Default::default()
    };
    let before = eventually(Duration::from_secs(30), "the host to join and the task to be placed", || {
        let admin = admin.clone();
        let run = run.clone();
        async move { admin.run_task(&run).await.ok().filter(|r| r.placed == 1) }
    })
    .await;
    let task = before.tasks[0].id;
    task_reaching(&admin, &task, TaskStatus::Running, Duration::from_secs(30), |_| true, || agent.log())
        .await;

    // `task exec` through the follower: it passes the upgrade on to the leader, and the
    // command runs with the task's MPS variables, as its process has them.
    let shown = admin.describe_task(&task.to_string()).await.expect("describe");
    let pid =
        shown.containers[0].runtime_id.as_deref().and_then(|r| r.strip_prefix("pid ")).expect("its pid");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the task's environment");
    let pipe = String::from_utf8_lossy(&environ)
        .split('\0')
        .find_map(|kv| kv.strip_prefix("CUDA_MPS_PIPE_DIRECTORY=").map(str::to_string))
        .expect("an MPS task has its daemon's pipe directory");
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["task", "exec", &task.to_string(), "--", "sh", "-c", "echo $CUDA_MPS_PIPE_DIRECTORY; exit 5"])
        .env("MPSFLEET_SERVER", &via_follower.url)
        .env("MPSFLEET_TOKEN", via_follower.admin_token())
        .env("MPSFLEET_CA_FILE", via_follower.ca_file())
        .output()
        .expect("task exec");
    assert_eq!(out.status.code(), Some(5), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{pipe}\n"));

    // The leader dies. Another takes over: it says so, and the client finds it.
    first.kill9();
    let new = eventually(Duration::from_secs(15), "another server to lead", || {
        let admin = admin.clone();
        async move {
            admin
                .cluster_status()
                .await
                .ok()
                .filter(|s| s.leader.url.as_deref() != Some(&format!("https://127.0.0.1:{}", ports[0])))
        }
    })
    .await;
    assert!(new.revision >= status.revision, "the new leader has the whole state: {new:?}");

    // The retried submission is answered as the first was: no second task.
    let again = admin.run_task(&run).await.expect("the retry");
    assert_eq!(again.tasks[0].id, task, "a retry with the same client token must not run another task");
    // The running task was not stopped, and the agent reports to the new leader.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = admin.describe_task(&task.to_string()).await.expect("describe");
    assert_eq!(t.last_status, TaskStatus::Running, "{t:?}\n{}", agent.log());
    let second = admin
        .run_task(&RunTask { client_token: Some("submit-2".into()), ..run.clone() })
        .await
        .expect("a write to the new leader");
    task_reaching(
        &admin,
        &second.tasks[0].id,
        TaskStatus::Running,
        Duration::from_secs(30),
        |_| true,
        || agent.log(),
    )
    .await;
    let tasks = admin.list_tasks(&Default::default()).await.expect("list");
    assert_eq!(tasks.len(), 2, "{tasks:?}");

    // The events' history survived the leader: the new one copied it while it followed, so
    // the first task's start (recorded by the dead leader) is still there, before the second
    // task's (recorded by the new one), and ids still grow.
    let q =
        mpsfleet_client::EventQuery { types: vec!["task.event".into()], since_ms: Some(0), no_follow: true };
    let mut stream = admin.events_from(&q).await.expect("the kept events");
    let mut past = Vec::new();
    while let Some(item) = stream.next().await.expect("an event") {
        if let mpsfleet_client::StreamItem::Event(ev) = item {
            past.push(*ev);
        }
    }
    let started = |id: &TaskId| {
        past.iter().position(|e| {
            e.subject.as_ref().is_some_and(|s| s.id == id.to_string())
                && e.event.as_ref().is_some_and(|w| w.reason == "Started")
        })
    };
    let (a, b) = (started(&task), started(&second.tasks[0].id));
    assert!(a.is_some() && b.is_some() && a < b, "{past:#?}");
    let (old, new) = (past[a.unwrap()].id.clone().unwrap(), past[b.unwrap()].id.clone().unwrap());
    let term = |id: &str| id.split('-').next().and_then(|t| t.parse::<u64>().ok()).expect("TERM-N");
    assert!(term(&old) < term(&new), "a new leadership's events sort after the old one's: {old} {new}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_is_fenced_and_steps_down_when_it_resumes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let prefix = format!("/ha-test/pause-{}-{}", std::process::id(), free_port());
    let ports = [free_port(), free_port()];
    let dirs: Vec<_> = (1..=2).map(|i| tmp.path().join(format!("s{i}"))).collect();
    let (first, rx1) = start_server(&dirs[0], ports[0], &prefix);
    wait_for_line(&rx1, "mpsfleet server listening on ");
    std::fs::create_dir_all(&dirs[1]).expect("dir");
    std::fs::copy(dirs[0].join("server.key"), dirs[1].join("server.key")).expect("copy server.key");
    let (_second, rx2) = start_server(&dirs[1], ports[1], &prefix);
    wait_for_line(&rx2, "following: ");

    let all = ports.iter().map(|p| format!("https://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let cluster = Server {
        child: Command::new("true").spawn().expect("placeholder"),
        url: all,
        data_dir: dirs[0].clone(),
    };
    let admin = cluster.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("infer", 1024)).await.expect("register");

    // A write is sent to the leader, which is paused as it arrives, for longer than its lease:
    // the other server is elected meanwhile.
    let old_leader = Server {
        child: Command::new("true").spawn().expect("placeholder"),
        url: format!("https://127.0.0.1:{}", ports[0]),
        data_dir: dirs[0].clone(),
    };
    let run = RunTask {
        task_definition: "infer".into(),
        count: 1,
        pool: "gpu".into(),
        client_token: Some("paused".into()),
        ..Default::default()
    };
    let in_flight = {
        let (client, run) = (old_leader.admin(), run.clone());
        tokio::spawn(async move { client.run_task(&run).await })
    };
    let pid = nix::unistd::Pid::from_raw(first.child.id() as i32);
    tokio::time::sleep(Duration::from_millis(5)).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    wait_for_line(&rx2, "mpsfleet server listening on ");
    // A paused server's socket still accepts connections and never answers: a client that
    // was talking to it waits for its timeout. This one starts at the new leader.
    let to_new = Server {
        child: Command::new("true").spawn().expect("placeholder"),
        url: format!("https://127.0.0.1:{},https://127.0.0.1:{}", ports[1], ports[0]),
        data_dir: dirs[0].clone(),
    };
    let admin = to_new.admin();
    create_pool(&admin, "after").await; // served by the new leader
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");

    // Resumed, the old leader finds its lease gone and its key no longer its own: it steps
    // down rather than write, and stops serving.
    let line = wait_for_line(&rx1, "stepped down: ");
    assert!(line.contains("lease") || line.contains("leader"), "{line}");
    let status = admin.cluster_status().await.expect("status");
    assert_eq!(status.leader.url.as_deref(), Some(format!("https://127.0.0.1:{}", ports[1]).as_str()));
    let pools = admin.list_pools().await.expect("pools");
    assert_eq!(pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["after", "gpu"]);

    // The write in flight was either committed before the pause (and answered) or refused:
    // the old leader did not write after its lease was gone. Retried with its client token at
    // the new leader, it is one task whichever it was.
    let first_answer = in_flight.await.expect("the request task");
    println!("the paused leader answered the write in flight with {first_answer:?}");
    let retried = admin.run_task(&run).await.expect("the retry at the new leader");
    if let Ok(answer) = &first_answer {
        assert_eq!(answer.tasks[0].id, retried.tasks[0].id, "an acknowledged write must be the one kept");
    }
    let tasks = admin.list_tasks(&Default::default()).await.expect("tasks");
    assert_eq!(
        tasks.len(),
        1,
        "nothing placed twice: {tasks:?} (the paused leader answered {first_answer:?})"
    );
}

/// A follower answers DNS from a copy of the leader's records: the same answers, a change
/// made at the leader seen within a second, and SERVFAIL rather than an old copy once the
/// leader is gone (until this server leads and answers from its own state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods)] // the test's own clock: how long the copy takes, from outside
async fn a_follower_answers_dns_from_the_leaders_records() {
    use common::dns::{ask, soa_serial, try_ask};
    use hickory_proto::op::ResponseCode;
    use hickory_proto::rr::RecordType;
    let tmp = tempfile::tempdir().expect("tempdir");
    let prefix = format!("/ha-test/dns-{}-{}", std::process::id(), free_port());
    let ports = [free_port(), free_port()];
    let dns: Vec<String> = (0..2).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let dirs: Vec<_> = (1..=2).map(|i| tmp.path().join(format!("s{i}"))).collect();
    let (mut first, rx1) = start_server_with(&dirs[0], ports[0], &prefix, &["--dns-listen", &dns[0]]);
    wait_for_line(&rx1, "mpsfleet server listening on ");
    std::fs::create_dir_all(&dirs[1]).expect("dir");
    std::fs::copy(dirs[0].join("server.key"), dirs[1].join("server.key")).expect("copy server.key");
    let (_second, rx2) = start_server_with(&dirs[1], ports[1], &prefix, &["--dns-listen", &dns[1]]);
    wait_for_line(&rx2, "answering DNS on ");

    let leader = Server {
        child: Command::new("true").spawn().expect("placeholder"),
        url: format!("https://127.0.0.1:{}", ports[0]),
        data_dir: dirs[0].clone(),
    };
    let serial = |m: hickory_proto::op::Message| (m.metadata.response_code, soa_serial(&m));
    let name = "nothing.gpu.mpsfleet.";
    // The same answer from both, as the leader's state is now.
    let seen = eventually(Duration::from_secs(5), "the follower's copy", || {
        let dns = dns.clone();
        async move {
            let at_leader = serial(ask(&dns[0], name, RecordType::A, false).await);
            let at_follower = serial(ask(&dns[1], name, RecordType::A, true).await);
            (at_leader == at_follower).then_some(at_leader)
        }
    })
    .await;
    assert_eq!(seen.0, ResponseCode::NXDomain);
    // A change at the leader reaches the follower's answers within a second.
    create_pool(&leader.admin(), "gpu").await;
    let after = serial(ask(&dns[0], name, RecordType::A, false).await);
    assert!(after.1 > seen.1, "the leader's serial follows its revision: {seen:?} {after:?}");
    let copied = std::time::Instant::now();
    eventually(Duration::from_secs(5), "the follower to copy the change", || {
        let dns = dns.clone();
        async move { (serial(ask(&dns[1], name, RecordType::A, false).await) == after).then_some(()) }
    })
    .await;
    assert!(copied.elapsed() < Duration::from_secs(1), "copied in {:?}", copied.elapsed());

    // The leader dies. The follower answers from its copy while it is fresh, then SERVFAIL
    // (`dns::COPY_STALE_MS`; checked on its own in the server's DNS tests), then, leading, from
    // its own state; while it switches its listener over, a query may go unanswered.
    first.kill9();
    let killed = std::time::Instant::now();
    let mut answers = Vec::new();
    loop {
        assert!(killed.elapsed() < Duration::from_secs(30), "the follower never took over: {answers:?}");
        let got = try_ask(&dns[1], name, RecordType::A).await.map(serial);
        answers.push((killed.elapsed(), got));
        if matches!(got, Some((ResponseCode::NXDomain, _))) && killed.elapsed() > Duration::from_secs(3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_line(&rx2, "elected leader: ");
    println!("the follower's answers after the leader's death: {answers:?}");
    for (at, got) in &answers {
        match got {
            Some((ResponseCode::NXDomain, s)) => assert!(*s >= after.1, "at {at:?}: {answers:?}"),
            Some((ResponseCode::ServFail, _)) | None => {}
            Some(other) => panic!("at {at:?}: {other:?} in {answers:?}"),
        }
    }
}
