//! The nemesis: three servers on the three-member etcd of `scripts/etcd-env.sh`, clients that
//! run tasks with client tokens, stop them, scale a service and read, every operation recorded
//! (tests/history), while faults arrive from a seed, one after another and overlapping: the
//! leader SIGKILLed and restarted, the leader SIGSTOPped past its lease and resumed, the
//! leader partitioned from etcd, a server partitioned from its clients, a follower restarted
//! with a skewed clock, an etcd member SIGKILLed and restarted. The history is then checked
//! against a model of the API's promises (tests/history, docs/ha.md "The nemesis").
//! Partitions drop packets in the kernel (tests/partition: nftables DROP rules on ports of
//! relays on 127.0.0.1): every server reaches etcd, and is reached, only through its own.
//!
//! CI runs it for `MPSFLEET_NEMESIS_SECONDS` (default 45) with `MPSFLEET_NEMESIS_SEED` (default
//! 1); the server faults come in an order drawn from the seed, each kind before any repeats, and
//! the run goes on past the figure (at most a minute) until every kind has happened, which the
//! test asserts per kind. A longer run is the same test with a larger figure:
//!
//! ```sh
//! MPSFLEET_NEMESIS_SECONDS=900 cargo test -p mpsfleet --test nemesis -- --nocapture faults
//! ```
//!
//! Three more tests break a promise on purpose under a fixed schedule and require the checker
//! to fail, for the named reason, and to pass without the switch: fencing
//! (`--unfenced-for-tests`), a leader whose reads stop following its commits and a StopTask
//! acknowledged and never committed (`--broken-for-tests stale-reads|lost-stops`).

mod common;
mod history;
mod partition;

use common::*;
use history::{Entry, Op, Outcome, TaskSeen};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const TTL: u64 = 2;

/// The two tests share the etcd cluster, whose members one of them kills: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// Each task declares this much of a GPU: three fit on one 143,771 MiB H200.
const TASK_MIB: u64 = 40_000;
const PER_GPU: usize = 3;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn etcd_endpoints() -> String {
    std::env::var("MPSFLEET_TEST_ETCD").unwrap_or_else(|_| {
        panic!("MPSFLEET_TEST_ETCD is not set: bash scripts/etcd-env.sh start; eval \"$(bash scripts/etcd-env.sh env)\"")
    })
}

/// A small deterministic generator (xorshift64*), so that a seed gives the same schedule.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

/// The servers of one etcd prefix, each restartable on its port and data dir.
struct Servers {
    ports: Vec<u16>,
    dirs: Vec<PathBuf>,
    prefix: String,
    children: Vec<Option<Child>>,
    extra: Vec<String>,
    /// Each server's clock skew (ms), from its next start on.
    skew: Vec<i64>,
    /// Each server's relays to the etcd members (cut: partitioned from etcd).
    to_etcd: Vec<Vec<partition::Relay>>,
    /// Each server's relay for its clients, agents and the other servers (cut: partitioned
    /// from them); its advertised address.
    from_clients: Vec<partition::Relay>,
    _firewall: Arc<partition::Firewall>,
}

impl Servers {
    async fn start(root: &Path, n: usize, extra: &[&str]) -> Servers {
        let prefix = format!("/nemesis/{}-{}", std::process::id(), free_port());
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let members: Vec<std::net::SocketAddr> = etcd_endpoints()
            .split(',')
            .map(|u| u.trim_start_matches("http://").parse().expect("an etcd endpoint host:port"))
            .collect();
        let (mut to_etcd, mut from_clients) = (Vec::new(), Vec::new());
        let firewall = partition::Firewall::new();
        for port in &ports {
            let mut relays = Vec::new();
            for m in &members {
                relays.push(partition::Relay::start(&firewall, *m).await);
            }
            to_etcd.push(relays);
            from_clients.push(partition::Relay::start(&firewall, ([127, 0, 0, 1], *port).into()).await);
        }
        let mut s = Servers {
            ports,
            dirs: (0..n).map(|i| root.join(format!("s{i}"))).collect(),
            prefix,
            children: (0..n).map(|_| None).collect(),
            extra: extra.iter().map(|a| a.to_string()).collect(),
            skew: vec![0; n],
            to_etcd,
            from_clients,
            _firewall: firewall,
        };
        let rx = s.spawn(0);
        wait_for_line(&rx, "mpsfleet server listening on ");
        for d in &s.dirs[1..] {
            std::fs::create_dir_all(d).expect("dir");
            std::fs::copy(s.dirs[0].join("server.key"), d.join("server.key")).expect("copy server.key");
        }
        for i in 1..n {
            let rx = s.spawn(i);
            wait_for_line(&rx, "forwarding requests to the leader on ");
        }
        s
    }

    fn spawn(&mut self, i: usize) -> std::sync::mpsc::Receiver<String> {
        let etcd: Vec<String> = self.to_etcd[i].iter().map(|r| r.url("http")).collect();
        let etcd = etcd.join(",");
        let ttl = TTL.to_string();
        let skew = format!("--clock-skew-ms={}", self.skew[i]);
        let advertise = self.url(i);
        let mut args = vec![
            &skew,
            "--advertise-url",
            &advertise,
            "--store",
            "etcd",
            "--etcd-endpoints",
            &etcd,
            "--etcd-prefix",
            &self.prefix,
            "--leader-ttl",
            &ttl,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        let (child, rx) = Server::spawn(&self.dirs[i], &format!("127.0.0.1:{}", self.ports[i]), &args);
        self.children[i] = Some(child);
        rx
    }

    /// Where clients reach server `i`: through its relay.
    fn url(&self, i: usize) -> String {
        self.from_clients[i].url("https")
    }

    fn pid(&self, i: usize) -> Option<nix::unistd::Pid> {
        self.children[i].as_ref().map(|c| nix::unistd::Pid::from_raw(c.id() as i32))
    }

    fn signal(&self, i: usize, sig: nix::sys::signal::Signal) {
        if let Some(pid) = self.pid(i) {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A handle for the clients: the first server's files (CA, tokens) are the cluster's.
    fn view(&self, urls: &str) -> Server {
        Server {
            child: Command::new("true").spawn().expect("placeholder"),
            url: urls.into(),
            data_dir: self.dirs[0].clone(),
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.signal(i, nix::sys::signal::Signal::SIGCONT);
            self.kill(i);
        }
    }
}

fn wait_for_line(rx: &std::sync::mpsc::Receiver<String>, prefix: &str) -> String {
    loop {
        let line =
            rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no line {prefix:?} in 60 s"));
        if line.starts_with(prefix) {
            return line;
        }
    }
}

/// One operation against one server, recorded.
async fn perform(
    http: &reqwest::Client,
    token: &str,
    url: &str,
    client: usize,
    op: Op,
    t0: Instant,
) -> Entry {
    let mut e = Entry::new(client, url, op.clone(), t0.elapsed().as_secs_f64() * 1000.0);
    let req = match &op {
        Op::Run { token: t } => http.post(format!("{url}/v1/tasks")).json(&serde_json::json!({
            "taskDefinition": "nemesis", "count": 1, "pool": "gpu", "clientToken": t, "startedBy": t
        })),
        Op::Stop { task } => http.post(format!("{url}/v1/tasks/{task}/stop")).json(&serde_json::json!({})),
        Op::Drain { host } => http.post(format!("{url}/v1/hosts/{host}/drain")),
        Op::Activate { host } => http.post(format!("{url}/v1/hosts/{host}/activate")),
        Op::Scale { desired } => http
            .patch(format!("{url}/v1/services/steady"))
            .json(&serde_json::json!({ "desiredCount": desired })),
        // Every task, in any status (GPU accounting is judged on those not STOPPED).
        Op::Read | Op::ReadAll => http.get(format!("{url}/v1/tasks?limit=1000000")),
        Op::ReadService => http.get(format!("{url}/v1/services/steady")),
        Op::ReadHost { host } => http.get(format!("{url}/v1/hosts/{host}")),
    };
    let answer = req.bearer_auth(token).timeout(Duration::from_secs(5)).send().await;
    e.completed_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let resp = match answer {
        Ok(r) => r,
        Err(err) if err.is_connect() => {
            e.outcome = Outcome::Failed(format!("not connected: {err}"));
            return e;
        }
        Err(err) => {
            e.outcome = Outcome::Unknown(err.to_string());
            return e;
        }
    };
    let header = |name: &str| {
        resp.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i64>().ok())
    };
    e.fence = header("mpsfleet-fence");
    e.revision = header("mpsfleet-revision").map(|r| r as u64);
    let status = resp.status();
    let body: serde_json::Value = match resp.bytes().await {
        Ok(b) => serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null),
        Err(err) => {
            e.outcome = Outcome::Unknown(format!("body: {err}"));
            return e;
        }
    };
    e.completed_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if status.is_server_error() {
        e.outcome = Outcome::Unknown(format!("{status}: {body}"));
        return e;
    }
    if !status.is_success() {
        e.outcome = Outcome::Failed(format!("{status}: {body}"));
        return e;
    }
    e.outcome = Outcome::Ok;
    match op {
        Op::Run { .. } => {
            e.tasks = body["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["id"].as_str())
                .map(String::from)
                .collect()
        }
        Op::Read | Op::ReadAll => e.seen = seen_tasks(&body),
        Op::ReadService => e.value = body["desiredCount"].as_u64().map(|d| d.to_string()),
        Op::ReadHost { .. } => e.value = body["status"].as_str().map(String::from),
        _ => {}
    }
    e
}

fn seen_tasks(body: &serde_json::Value) -> Vec<TaskSeen> {
    body.as_array()
        .into_iter()
        .flatten()
        .map(|t| TaskSeen {
            id: t["id"].as_str().unwrap_or_default().to_owned(),
            // The run's own startedBy is among its labels; the task's is the caller.
            started_by: t["labels"]["startedBy"]
                .as_str()
                .or(t["startedBy"].as_str())
                .unwrap_or_default()
                .to_owned(),
            stopped: t["lastStatus"] == "STOPPED",
            desired_stopped: t["desiredStatus"] == "STOPPED",
            gpus: t["gpuIds"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str())
                .map(String::from)
                .collect(),
        })
        .collect()
}

/// What every client shares: where to send, as whom, until when, and the history.
#[derive(Clone)]
struct Run {
    urls: Vec<String>,
    http: reqwest::Client,
    token: String,
    /// Set when the nemesis is done: the clients stop.
    done: Arc<AtomicBool>,
    t0: Instant,
    history: Arc<Mutex<Vec<Entry>>>,
    /// The agent's host, which clients drain and activate.
    host: String,
}

/// A client: random operations at random servers until the nemesis is done.
async fn client_loop(client: usize, seed: u64, run: Run) {
    let Run { urls, http, token, done, t0, history, host } = run;
    let mut rng = Rng::new(seed * 1_000 + client as u64);
    let (mut n, mut unresolved, mut known): (u32, Vec<String>, Vec<String>) = (0, Vec::new(), Vec::new());
    while !done.load(Ordering::SeqCst) {
        let url = &urls[rng.below(urls.len() as u64) as usize];
        let roll = rng.below(100);
        let op = if roll < 30 {
            // Half the time an answer was lost, the token is tried again, as a client would.
            let token = match unresolved.pop() {
                Some(t) if rng.below(2) == 0 => t,
                other => {
                    unresolved.extend(other);
                    n += 1;
                    format!("c{client}-{n}")
                }
            };
            Op::Run { token }
        } else if roll < 55 && !known.is_empty() {
            // Each stop targets a task not stopped before, so that live tasks stay few.
            Op::Stop { task: known.swap_remove(rng.below(known.len() as u64) as usize) }
        } else if roll < 61 {
            Op::Scale { desired: rng.below(3) as u32 }
        } else if roll < 63 {
            Op::Drain { host: host.clone() }
        } else if roll < 67 {
            Op::Activate { host: host.clone() }
        } else if roll < 82 {
            Op::Read
        } else if roll < 91 {
            Op::ReadService
        } else {
            Op::ReadHost { host: host.clone() }
        };
        let e = perform(&http, &token, url, client, op, t0).await;
        match (&e.op, &e.outcome) {
            (Op::Run { token }, Outcome::Unknown(_)) => unresolved.push(token.clone()),
            (Op::Run { .. }, Outcome::Ok) => known.extend(e.tasks.iter().cloned()),
            _ => {}
        }
        history.lock().expect("history").push(e);
        tokio::time::sleep(rng.millis(20, 120)).await;
    }
}

/// The leader as any server that answers sees it: its index.
async fn leader(servers: &Servers, admin: &reqwest::Client, token: &str) -> Option<usize> {
    for i in 0..servers.ports.len() {
        let Ok(r) = admin
            .get(format!("{}/v1/cluster/status", servers.url(i)))
            .bearer_auth(token)
            .timeout(Duration::from_secs(2))
            .send()
            .await
        else {
            continue;
        };
        let Ok(v) = r.json::<serde_json::Value>().await else { continue };
        if let Some(url) = v["leader"]["url"].as_str() {
            return (0..servers.ports.len()).find(|&j| servers.url(j) == url);
        }
    }
    None
}

fn etcd_member(action: &str, n: usize) {
    let dir = std::env::var("MPSFLEET_TEST_ETCD_DIR").expect("MPSFLEET_TEST_ETCD_DIR");
    if action == "kill" {
        let pid = std::fs::read_to_string(format!("{dir}/m{n}.pid")).expect("member pid").trim().to_owned();
        let _ = Command::new("kill").args(["-9", &pid]).status();
    } else {
        // A member started twice (its first copy not yet gone) would fail to bind: end any copy.
        let _ = Command::new("pkill")
            .args(["-9", "-f", &format!("etcd --name m{n} --data-dir {dir}/m{n}")])
            .status();
        std::thread::sleep(Duration::from_millis(200));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/etcd-env.sh");
        let ok = Command::new("bash")
            .args([script, "restart-member", &n.to_string()])
            .env("MPSFLEET_ETCD_DIR", &dir)
            .status();
        assert!(ok.is_ok_and(|s| s.success()), "restart etcd member {n}");
    }
}

fn member_alive(n: usize) -> bool {
    let dir = std::env::var("MPSFLEET_TEST_ETCD_DIR").expect("MPSFLEET_TEST_ETCD_DIR");
    std::fs::read_to_string(format!("{dir}/m{n}.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        // A killed member nobody reaped yet is a zombie: gone, for this purpose.
        .and_then(mpsfleet_proc::stat)
        .is_some_and(|st| !st.is_dead())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_on_servers_and_etcd_keep_the_apis_promises() {
    let _one = ONE_AT_A_TIME.lock().await;
    let seconds = env_or("MPSFLEET_NEMESIS_SECONDS", 45);
    let seed = env_or("MPSFLEET_NEMESIS_SEED", 1);
    let clients = env_or("MPSFLEET_NEMESIS_CLIENTS", 4) as usize;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut servers = Servers::start(tmp.path(), 3, &[]).await;
    let all: Vec<String> = (0..3).map(|i| servers.url(i)).collect();
    let cluster = servers.view(&all.join(","));
    let admin = cluster.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("nemesis", TASK_MIB)).await.expect("register");
    admin
        .create_service(
            &serde_json::from_value(serde_json::json!({
                "name": "steady", "taskDefinition": "nemesis", "pool": "gpu", "desiredCount": 1
            }))
            .expect("service"),
        )
        .await
        .expect("create service");
    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).expect("agent dir");
    let _agent = Agent::start_with_model(&cluster, &agent_dir, 2);
    let hosts = eventually(Duration::from_secs(30), "the host to join", || {
        let admin = admin.clone();
        async move { admin.list_hosts(None).await.ok().filter(|h| !h.is_empty()) }
    })
    .await;

    let http = cluster.http();
    let token = cluster.admin_token();
    let history = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(seconds);
    // Past the figure, the run goes on until every kind of fault has happened, for at most this.
    let deadline = until + Duration::from_secs(60);
    let done = Arc::new(AtomicBool::new(false));
    let run = Run {
        urls: all.clone(),
        http: http.clone(),
        token: token.clone(),
        done: done.clone(),
        t0,
        history: history.clone(),
        host: hosts[0].id.to_string(),
    };
    let workers: Vec<_> = (0..clients).map(|c| tokio::spawn(client_loop(c, seed, run.clone()))).collect();

    // Two nemeses at once: one on the servers, one on etcd's members, so faults overlap. The
    // server faults come in an order drawn from the seed, every kind once before any repeats.
    let mut rng = Rng::new(seed);
    let mut order = Fault::ON_SERVERS.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut turn = 0;
    // Each fault's start (true) and end (false) lines.
    let mut faults: Vec<(u128, Fault, bool, String)> = Vec::new();
    let mut next_member_fault = t0 + rng.millis(4_000, 10_000);
    let mut member_down: Option<(usize, Instant)> = None;
    let at = |t0: Instant| t0.elapsed().as_millis();
    let all_happened =
        |faults: &[(u128, Fault, bool, String)]| Fault::ALL.iter().all(|k| faults.iter().any(|f| f.1 == *k));
    while Instant::now() < deadline
        && (Instant::now() < until || !all_happened(&faults) || member_down.is_some())
    {
        tokio::time::sleep(rng.millis(2_000, 5_000)).await;
        if let Some((m, back)) = member_down {
            if Instant::now() >= back {
                etcd_member("restart", m);
                faults.push((at(t0), Fault::EtcdMemberKilled, false, format!("etcd member m{m} restarted")));
                member_down = None;
            }
        } else if Instant::now() >= next_member_fault
            && (Instant::now() < until || !faults.iter().any(|f| f.1 == Fault::EtcdMemberKilled))
        {
            let m = 1 + rng.below(3) as usize;
            etcd_member("kill", m);
            faults.push((at(t0), Fault::EtcdMemberKilled, true, format!("etcd member m{m} SIGKILLed")));
            member_down = Some((m, Instant::now() + rng.millis(2_000, 6_000)));
            next_member_fault = Instant::now() + rng.millis(8_000, 16_000);
        }
        let server_faults_done = Fault::ON_SERVERS.iter().all(|k| faults.iter().any(|f| f.1 == *k));
        if Instant::now() >= until && server_faults_done {
            continue;
        }
        let Some(l) = leader(&servers, &http, &token).await else { continue };
        let kind = order[turn % order.len()];
        turn += 1;
        let mut note = |start: bool, what: String| faults.push((at(t0), kind, start, what));
        match kind {
            Fault::LeaderCutFromEtcd => {
                // The leader cut off from every etcd member: it steps down on its own clock.
                let hold = Duration::from_millis(TTL * 1_000) + rng.millis(500, 3_000);
                servers.to_etcd[l].iter().for_each(partition::Relay::cut);
                note(true, format!("leader s{l} partitioned from etcd"));
                tokio::time::sleep(hold).await;
                servers.to_etcd[l].iter().for_each(partition::Relay::heal);
                note(false, format!("s{l} reaches etcd again"));
            }
            Fault::ServerCutFromClients => {
                // A server cut off from its clients (and the agent, and the other servers) for
                // less than the agent's heartbeat grace.
                let s = rng.below(3) as usize;
                servers.from_clients[s].cut();
                note(true, format!("s{s} partitioned from its clients"));
                tokio::time::sleep(rng.millis(1_000, 4_000)).await;
                servers.from_clients[s].heal();
                note(false, format!("s{s} reachable again"));
            }
            Fault::FollowerSkewed => {
                // A follower's clock is skewed from its next start on: it leads with it later.
                let f = (l + 1 + rng.below(2) as usize) % 3;
                let skew =
                    (rng.millis(20_000, 90_000).as_millis() as i64) * if rng.below(2) == 0 { 1 } else { -1 };
                servers.skew[f] = skew;
                servers.kill(f);
                servers.spawn(f);
                note(true, format!("follower s{f} restarted with its clock skewed {skew} ms"));
            }
            Fault::LeaderKilled => {
                servers.kill(l);
                note(true, format!("leader s{l} SIGKILLed"));
                tokio::time::sleep(rng.millis(500, 3_000)).await;
                servers.spawn(l);
                note(false, format!("s{l} restarted"));
            }
            Fault::LeaderPaused => {
                servers.signal(l, nix::sys::signal::Signal::SIGSTOP);
                note(true, format!("leader s{l} SIGSTOPped"));
                tokio::time::sleep(Duration::from_millis(TTL * 1_000) + rng.millis(500, 2_500)).await;
                servers.signal(l, nix::sys::signal::Signal::SIGCONT);
                note(false, format!("s{l} resumed"));
            }
            Fault::EtcdMemberKilled => unreachable!("not a server fault"),
        }
    }
    done.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.expect("client");
    }
    // Heal: every member and server back, then the state as it settled.
    for m in 1..=3 {
        if !member_alive(m) {
            etcd_member("restart", m);
        }
    }
    let mut attempt = 0;
    let last = eventually(Duration::from_secs(60), "a leader to answer the final read", || {
        attempt += 1;
        let (http, token, url) = (http.clone(), token.clone(), all[attempt % all.len()].clone());
        async move {
            let e = perform(&http, &token, &url, usize::MAX, Op::ReadAll, t0).await;
            (e.outcome == Outcome::Ok).then_some(e.seen)
        }
    })
    .await;
    let history = history.lock().expect("history").clone();
    let verdict = history::check(&history, &last, PER_GPU);
    // No fault touched the agent or its host: any incident an operator (a client's drain) did
    // not ask for is a false one.
    let incidents = eventually(Duration::from_secs(30), "the incident list", || {
        let admin = admin.clone();
        async move { admin.list_incidents().await.ok() }
    })
    .await;
    let incidents: Vec<_> =
        incidents.into_iter().filter(|i| i.incident.operator_requested.is_none()).collect();
    let mut by_kind: BTreeMap<Fault, usize> = Fault::ALL.iter().map(|k| (*k, 0)).collect();
    for (_, kind, start, _) in &faults {
        *by_kind.entry(*kind).or_default() += usize::from(*start);
    }
    let summary: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {}", k.words())).collect();
    println!(
        "nemesis: seed {seed}, {} s, {clients} clients: {} operations ({} acknowledged, {} unknown), reads judged {:?}, {} tasks at the end; faults: {}; verdict: {}",
        t0.elapsed().as_secs(),
        verdict.operations,
        verdict.acknowledged,
        verdict.unknown,
        verdict.reads_judged,
        last.len(),
        summary.join(", "),
        if verdict.ok() { "ok".to_owned() } else { format!("{} violations", verdict.violations.len()) }
    );
    for (ms, _, _, what) in &faults {
        println!("  {ms} ms: {what}");
    }
    assert!(verdict.ok(), "the history breaks the API's promises:\n{}", verdict.violations.join("\n"));
    assert!(incidents.is_empty(), "incidents with no host fault: {incidents:#?}");
    for (kind, n) in &by_kind {
        assert!(*n >= 1, "the schedule never made this fault happen: {}; faults: {summary:?}", kind.words());
    }
    assert!(verdict.acknowledged > 20, "too little happened to judge: {summary:?}");
    for (read, n) in &verdict.reads_judged {
        assert!(*n >= 3, "too few acknowledged reads of the {read} to judge: {:?}", verdict.reads_judged);
    }
    drop(servers);
}

/// The kinds of fault, each asserted to have happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    LeaderKilled,
    LeaderPaused,
    LeaderCutFromEtcd,
    ServerCutFromClients,
    FollowerSkewed,
    EtcdMemberKilled,
}

impl Fault {
    const ON_SERVERS: [Fault; 5] = [
        Fault::LeaderKilled,
        Fault::LeaderPaused,
        Fault::LeaderCutFromEtcd,
        Fault::ServerCutFromClients,
        Fault::FollowerSkewed,
    ];
    const ALL: [Fault; 6] = [
        Fault::LeaderKilled,
        Fault::LeaderPaused,
        Fault::LeaderCutFromEtcd,
        Fault::ServerCutFromClients,
        Fault::FollowerSkewed,
        Fault::EtcdMemberKilled,
    ];

    fn words(self) -> &'static str {
        match self {
            Fault::LeaderKilled => "leader killed",
            Fault::LeaderPaused => "leader paused past its lease",
            Fault::LeaderCutFromEtcd => "leader partitioned from etcd",
            Fault::ServerCutFromClients => "server partitioned from its clients",
            Fault::FollowerSkewed => "follower restarted with a skewed clock",
            Fault::EtcdMemberKilled => "etcd member killed",
        }
    }
}

/// The fixed schedule of the fencing check: the leader paused past its lease, a new leader
/// elected and acknowledging a write, writes sent to the paused one, which is then resumed.
async fn paused_leader_schedule(unfenced: bool) -> history::Verdict {
    let tmp = tempfile::tempdir().expect("tempdir");
    let extra: &[&str] = if unfenced { &["--unfenced-for-tests"] } else { &[] };
    let servers = Servers::start(tmp.path(), 2, extra).await;
    let (old, new) = (servers.url(0), servers.url(1));
    let cluster = servers.view(&format!("{old},{new}"));
    let admin = cluster.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("nemesis", TASK_MIB)).await.expect("register");
    let (http, token, t0) = (cluster.http(), cluster.admin_token(), Instant::now());
    let mut history = Vec::new();
    // Connections to the leader opened now, so that requests sent while it is paused wait in
    // them rather than in a TLS handshake.
    let warm: Vec<_> = (0..8)
        .map(|c| {
            let (http, token, old) = (http.clone(), token.clone(), old.clone());
            tokio::spawn(async move { perform(&http, &token, &old, c, Op::Read, t0).await })
        })
        .collect();
    for w in warm {
        history.push(w.await.expect("request"));
    }
    servers.signal(0, nix::sys::signal::Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(TTL * 1_000 + 1_500)).await;
    // A read the new leader answered (a write there would take the audit log's next key,
    // which the deposed leader's writes would then collide on: a fence of its own).
    let elected = eventually(Duration::from_secs(20), "the other server to lead", || {
        let (http, token, new) = (http.clone(), token.clone(), new.clone());
        async move {
            let e = perform(&http, &token, &new, 100, Op::Read, t0).await;
            (e.outcome == Outcome::Ok).then_some(e)
        }
    })
    .await;
    history.push(elected);
    let to_old: Vec<_> = (0..8)
        .map(|c| {
            let (http, token, old) = (http.clone(), token.clone(), old.clone());
            tokio::spawn(async move {
                perform(&http, &token, &old, c, Op::Run { token: format!("at-old-{c}") }, t0).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    servers.signal(0, nix::sys::signal::Signal::SIGCONT);
    for t in to_old {
        history.push(t.await.expect("request"));
    }
    let last = perform(&http, &token, &new, 200, Op::ReadAll, t0).await;
    assert_eq!(last.outcome, Outcome::Ok, "{last:?}");
    let verdict = history::check(&history, &last.seen, PER_GPU);
    for e in &history {
        println!(
            "  {:?} at {} -> {:?} fence {:?} revision {:?}",
            e.op, e.server, e.outcome, e.fence, e.revision
        );
    }
    drop(servers);
    verdict
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_fails_when_fencing_is_broken_and_passes_when_it_is_not() {
    let _one = ONE_AT_A_TIME.lock().await;
    std::env::set_var("MPSFLEET_ALLOW_UNFENCED", "1");
    let broken = paused_leader_schedule(true).await;
    println!("unfenced: {:?}", broken.violations);
    assert!(!broken.ok(), "with fencing broken, the deposed leader's writes must break a promise");
    let intact = paused_leader_schedule(false).await;
    assert!(intact.ok(), "with fencing, the same schedule keeps every promise: {:?}", intact.violations);
}

/// The fixed schedule of the two "broken promise" checks: one server leads (on etcd, so that
/// its answers carry their headers); a client reads, runs a task, stops it and reads again,
/// each acknowledged before the next is invoked.
async fn run_stop_read(broken: Option<&str>) -> history::Verdict {
    let tmp = tempfile::tempdir().expect("tempdir");
    let extra: Vec<&str> = broken.map_or_else(Vec::new, |b| vec!["--broken-for-tests", b]);
    let servers = Servers::start(tmp.path(), 1, &extra).await;
    let url = servers.url(0);
    let cluster = servers.view(&url);
    let admin = cluster.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("nemesis", TASK_MIB)).await.expect("register");
    let (http, token, t0) = (cluster.http(), cluster.admin_token(), Instant::now());
    let mut history = vec![perform(&http, &token, &url, 0, Op::Read, t0).await];
    let run = perform(&http, &token, &url, 0, Op::Run { token: "once".into() }, t0).await;
    let task = run.tasks.first().cloned().unwrap_or_else(|| panic!("RunTask named no task: {run:?}"));
    history.push(run);
    history.push(perform(&http, &token, &url, 0, Op::Stop { task }, t0).await);
    history.push(perform(&http, &token, &url, 0, Op::Read, t0).await);
    let last = perform(&http, &token, &url, 1, Op::ReadAll, t0).await;
    for e in history.iter().chain([&last]) {
        assert_eq!(e.outcome, Outcome::Ok, "{e:?}");
    }
    drop(servers);
    history::check(&history, &last.seen, PER_GPU)
}

/// The checker of a broken server finds `reason` among its violations; of an intact one,
/// nothing.
async fn the_checker_finds(broken: &str, reason: &str) {
    std::env::set_var("MPSFLEET_ALLOW_BROKEN", "1");
    let v = run_stop_read(Some(broken)).await;
    println!("{broken}: {:?}", v.violations);
    assert!(
        v.violations.iter().any(|x| x.contains(reason)),
        "with --broken-for-tests {broken}, the checker must find {reason:?}: {:?}",
        v.violations
    );
    let intact = run_stop_read(None).await;
    assert!(intact.ok(), "without the switch the same schedule keeps every promise: {:?}", intact.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_fails_when_the_leaders_reads_stop_following_its_commits() {
    let _one = ONE_AT_A_TIME.lock().await;
    // The switch is refused outside tests: without MPSFLEET_ALLOW_BROKEN=1 the server does not
    // start with it.
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path())
        .args(["--broken-for-tests", "stale-reads"])
        .env_remove("MPSFLEET_ALLOW_BROKEN")
        .output()
        .expect("run the server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("MPSFLEET_ALLOW_BROKEN=1"), "{stderr}");
    the_checker_finds("stale-reads", "whose RunTask was acknowledged before it").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_fails_when_an_acknowledged_stop_is_never_committed() {
    let _one = ONE_AT_A_TIME.lock().await;
    the_checker_finds("lost-stops", "whose StopTask was acknowledged before it").await;
}
