//! Process tests of what a process task can reach on its host, with the real agent, real task
//! processes and the real MPS control daemon (no GPU needed). They need root, as the agent
//! does to run tasks as other uids (tests run as root here and on CI).
//!
//! - A task whose definition names no `user` runs as a uid of its own from
//!   `--task-uid-range`, in a home of its own; it cannot read the agent's identity, another
//!   task's logs or home, nor make `task logs` read /etc/shadow through a link.
//! - A definition's `user` is honoured only in a pool with `allowTaskUsers`.
//! - A task uid is never given to a second task while the first runs, and stays the task's
//!   across an agent restart.
//! - An MPS task reaches its GPU's daemon through the pipe directory.
//! - MPS tasks of one GPU share one uid (its daemon runs one server, for one uid, at a time),
//!   one of the last of the range; MPS tasks of another GPU and every other task get other
//!   uids, and no non-MPS task ever gets a kept one.

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::logs::LogStreams;
use mpsfleet_types::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// A server with pool "gpu", one ACTIVE agent on the real MPS daemon with `uids` as its task
/// uid range, `gpus` emulated GPUs and its run dir in the test's directory. Fields drop in
/// order: the agent first, the directory last.
struct Fleet {
    agent: Agent,
    admin: Client,
    server: Server,
    mps: PathBuf,
    uids: String,
    gpus: u32,
    dir: tempfile::TempDir,
}

impl Fleet {
    /// A fleet with one GPU; None when the test cannot run here (not root, or no MPS binary,
    /// outside CI).
    async fn start(uids: &str) -> Option<Fleet> {
        Fleet::start_with_gpus(uids, 1).await
    }

    async fn start_with_gpus(uids: &str, gpus: u32) -> Option<Fleet> {
        if !nix::unistd::Uid::current().is_root() {
            assert!(!on_ci(), "these tests need root, and CI runs them as root");
            println!("skipped: running tasks as other uids needs root");
            return None;
        }
        let mps = mps_control()?;
        let dir = tempfile::tempdir().unwrap();
        // Tasks pass through the test's directory to their run dir (nothing here is listable).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let run = dir.path().join("run");
        let args = ["--task-uid-range", uids, "--run-dir", run.to_str().unwrap()];
        let agent = Agent::start(&server, &dir.path().join("agent"), gpus, &mps, &args);
        let fleet = Fleet { agent, admin, server, mps, uids: uids.to_string(), gpus, dir };
        let admin = fleet.admin.clone();
        eventually(WAIT, "the host to be ACTIVE", || async {
            admin.list_hosts(None).await.ok().filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
        })
        .await;
        Some(fleet)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("agent")
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// Starts the agent (again) on the same data dir, without stopping tasks when it is killed.
    fn restart_agent(&mut self) {
        let run = self.run_dir();
        let args = ["--task-uid-range", &self.uids, "--run-dir", run.to_str().unwrap()];
        self.agent.kill9();
        self.agent = Agent::start(&self.server, &self.data_dir(), self.gpus, &self.mps, &args);
    }

    async fn register(&self, family: &str, container: serde_json::Value) {
        let mut c = container;
        c["name"] = "main".into();
        c["stopTimeout"] = 2.into();
        self.admin
            .register_taskdef(taskdef(serde_json::json!({"family": family, "containerDefinitions": [c]})))
            .await
            .unwrap();
    }

    /// Registers `family` running `/bin/sh -c SCRIPT`.
    async fn register_script(&self, family: &str, script: &str) {
        self.register(family, serde_json::json!({"command": ["/bin/sh", "-c", script]})).await;
    }

    async fn run(&self, family: &str) -> String {
        let out = self
            .admin
            .run_task(&RunTask {
                task_definition: family.into(),
                count: 1,
                pool: "gpu".into(),
                client_token: None,
                ..Default::default()
            })
            .await
            .unwrap();
        out.tasks[0].id.to_string()
    }

    /// Waits for `id`'s stdout to hold `needle`; the whole stdout.
    async fn stdout_with(&self, id: &str, needle: &str) -> String {
        let what = format!("task {id} to print {needle:?}");
        logs_containing(&self.admin, id, LogStreams::Stdout, needle, WAIT, &what).await.output()
    }

    async fn stopped(&self, id: &str) -> Task {
        let admin = self.admin.clone();
        eventually(WAIT, &format!("task {id} to stop"), || async {
            admin.describe_task(id).await.ok().filter(|t| t.last_status == TaskStatus::Stopped)
        })
        .await
    }

    async fn running(&self, id: &str) -> Task {
        let admin = self.admin.clone();
        eventually(WAIT, &format!("task {id} to run"), || async {
            admin.describe_task(id).await.ok().filter(|t| t.last_status == TaskStatus::Running)
        })
        .await
    }
}

/// The value printed after `key=` on a line of `out`.
fn value<'a>(out: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    out.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= in the output: {out}"))
}

fn uid_of(out: &str) -> u32 {
    value(out, "uid").trim().parse().unwrap_or_else(|_| panic!("uid in {out}"))
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode()
        & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_task_runs_as_its_own_uid_and_reaches_nothing_of_the_agent_or_other_tasks() {
    let Some(fleet) = Fleet::start("230000-230009").await else { return };
    let data = fleet.data_dir();
    let tasks = data.join("tasks");
    // The first task keeps a secret in its home and in its logs, and tries the agent's identity.
    let keeper = format!(
        "echo uid=$(id -u); echo gid=$(id -g) groups=$(id -G); echo home=$HOME; echo pwd=$(pwd); \
         echo kept-in-home > $HOME/secret && echo wrote-home=yes; echo err-secret-of-keeper >&2; \
         echo identity=$(cat {id} 2>&1); echo tasks=$(ls {tasks} 2>&1); echo done=1; exec sleep 600",
        id = data.join("identity.json").display(),
        tasks = tasks.display(),
    );
    fleet.register_script("keeper", &keeper).await;
    let keeper_id = fleet.run("keeper").await;
    let out = fleet.stdout_with(&keeper_id, "done=1").await;
    let keeper_uid = uid_of(&out);
    assert!((230_000..=230_009).contains(&keeper_uid), "{out}");
    assert_eq!(value(&out, "gid"), format!("{keeper_uid} groups={keeper_uid}"), "no other group: {out}");
    let home = fleet.run_dir().join("home").join(&keeper_id);
    assert_eq!(value(&out, "home"), home.to_str().unwrap(), "{out}");
    assert_eq!(value(&out, "pwd"), home.to_str().unwrap(), "{out}");
    assert_eq!(value(&out, "wrote-home"), "yes", "{out}");
    assert!(value(&out, "identity").contains("Permission denied"), "{out}");
    assert!(value(&out, "tasks").contains("Permission denied"), "{out}");
    let meta = std::fs::metadata(&home).unwrap();
    assert_eq!((meta.uid(), meta.gid(), mode(&home)), (keeper_uid, keeper_uid, 0o700));

    // A second task, at the same time: another uid, and none of the first one's files.
    let keeper_dir = tasks.join(&keeper_id).join("containers/main");
    let prier = format!(
        "echo uid=$(id -u); echo log=$(cat {log} 2>&1); echo out=$(cat {out} 2>&1); \
         echo home=$(cat {home}/secret 2>&1); echo list=$(ls {home} 2>&1); echo done=1; exec sleep 600",
        log = keeper_dir.join("stderr.log").display(),
        out = keeper_dir.join("output.log").display(),
        home = home.display(),
    );
    fleet.register_script("prier", &prier).await;
    let prier_id = fleet.run("prier").await;
    let out = fleet.stdout_with(&prier_id, "done=1").await;
    let prier_uid = uid_of(&out);
    assert!((230_000..=230_009).contains(&prier_uid) && prier_uid != keeper_uid, "{out}");
    for key in ["log", "out", "home", "list"] {
        assert!(value(&out, key).contains("Permission denied"), "{key}: {out}");
    }
    assert!(!out.contains("err-secret-of-keeper") && !out.contains("kept-in-home"), "{out}");

    // A task that puts a link to /etc/shadow in place of its stderr log cannot even enter its
    // log directory, and `task logs --stderr` shows what it wrote, not the shadow file.
    let linker = format!(
        "echo attack=$(ln -sf /etc/shadow {tasks}/$MPSFLEET_TASK_ID/containers/main/stderr.log 2>&1; echo rc=$?); \
         echo own-dir=$(ls {tasks}/$MPSFLEET_TASK_ID 2>&1); echo linker-stderr >&2; echo done=1; exec sleep 600",
        tasks = tasks.display(),
    );
    fleet.register_script("linker", &linker).await;
    let linker_id = fleet.run("linker").await;
    let out = fleet.stdout_with(&linker_id, "done=1").await;
    assert!(value(&out, "attack").contains("Permission denied"), "{out}");
    assert!(!value(&out, "attack").ends_with("rc=0"), "{out}");
    assert!(value(&out, "own-dir").contains("Permission denied"), "{out}");
    let logs =
        logs_containing(&fleet.admin, &linker_id, LogStreams::Stderr, "linker-stderr", WAIT, "stderr").await;
    assert_eq!(logs.output(), "linker-stderr\n");
    let stderr_log = tasks.join(&linker_id).join("containers/main/stderr.log");
    let meta = std::fs::symlink_metadata(&stderr_log).unwrap();
    assert!(meta.file_type().is_file(), "the log is still the agent's own file");
    assert_eq!((meta.uid(), mode(&stderr_log)), (0, 0o600));

    // What the agent keeps: its data dir 0700, its identity 0600 with the agent token's
    // digest only (and the server still reads logs with the token: the digests matched).
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&tasks), 0o700);
    assert_eq!(mode(&tasks.join(&keeper_id)), 0o700);
    assert_eq!(mode(&keeper_dir), 0o700);
    for name in ["stdout.log", "stderr.log", "output.log"] {
        assert_eq!(mode(&keeper_dir.join(name)), 0o600, "{name}");
    }
    let identity_path = data.join("identity.json");
    assert_eq!(mode(&identity_path), 0o600);
    let identity: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&identity_path).unwrap()).unwrap();
    assert!(identity.get("agentToken").is_none(), "{identity}");
    let digest = identity["agentTokenSha256"].as_str().unwrap_or_default();
    assert!(digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()), "{identity}");
    assert!(identity["credential"].as_str().is_some_and(|c| !c.is_empty()));
    // Neither the credential nor the token is in the agent's log.
    let log = fleet.agent.log();
    assert!(!log.contains(identity["credential"].as_str().unwrap()), "the credential is logged");
    assert!(!log.contains(&fleet.server.join_token()), "the join token is logged");

    // Stopped, the task's home goes.
    fleet.admin.stop_task(&keeper_id, None).await.unwrap();
    fleet.stopped(&keeper_id).await;
    assert!(std::fs::symlink_metadata(&home).is_err(), "the stopped task's home is still there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definitions_user_runs_only_in_a_pool_that_allows_it() {
    let Some(fleet) = Fleet::start("230100-230109").await else { return };
    fleet
        .register(
            "as-root",
            serde_json::json!({"user": "root", "command": ["/bin/sh", "-c", "echo uid=$(id -u); exec sleep 600"]}),
        )
        .await;
    let refused = fleet.run("as-root").await;
    let task = fleet.stopped(&refused).await;
    assert_eq!(task.stop_code, Some(StopCode::TaskFailedToStart));
    assert_eq!(
        task.stopped_reason.as_deref(),
        Some(
            "containerDefinitions[0].user: pool gpu does not let process tasks choose their user \
             (pool update gpu --allow-task-users true)"
        ),
        "{task:?}"
    );
    let update = UpdatePool { allow_task_users: Some(true), ..Default::default() };
    fleet.admin.update_pool("gpu", &update).await.unwrap();
    let allowed = fleet.run("as-root").await;
    let out = fleet.stdout_with(&allowed, "uid=").await;
    assert_eq!(uid_of(&out), 0, "{out}");
    // A definition without `user` still runs as a uid of its own there.
    fleet.register_script("plain", "echo uid=$(id -u); exec sleep 600").await;
    let plain = fleet.run("plain").await;
    let out = fleet.stdout_with(&plain, "uid=").await;
    assert!((230_100..=230_109).contains(&uid_of(&out)), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_uid_is_never_shared_while_the_task_runs_and_survives_an_agent_restart() {
    // Two uids for three tasks (the range's last, 230202, is kept for the GPU's MPS tasks).
    let Some(mut fleet) = Fleet::start("230200-230202").await else { return };
    fleet.register_script("sleeper", "echo uid=$(id -u); exec sleep 600").await;
    let first = fleet.run("sleeper").await;
    let second = fleet.run("sleeper").await;
    let (a, b) =
        (uid_of(&fleet.stdout_with(&first, "uid=").await), uid_of(&fleet.stdout_with(&second, "uid=").await));
    assert_ne!(a, b);
    assert!([a, b].iter().all(|u| (230_200..=230_201).contains(u)), "{a} {b}");

    // The agent dies and comes back: both tasks are adopted with their uids, so a third finds
    // none free and does not start.
    fleet.restart_agent();
    fleet.running(&first).await;
    fleet.running(&second).await;
    let third = fleet.run("sleeper").await;
    let task = fleet.stopped(&third).await;
    assert_eq!(task.stop_code, Some(StopCode::TaskFailedToStart), "{task:?}");
    let reason = task.stopped_reason.unwrap_or_default();
    assert!(reason.starts_with("no free uid in --task-uid-range 230200-230202"), "{reason}");
    assert!(reason.ends_with("the last 1 are kept for MPS tasks)"), "{reason}");
    let records: Vec<u32> = [&first, &second]
        .iter()
        .map(|id| {
            let path = fleet.data_dir().join("tasks").join(id).join("record.json");
            let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            rec["taskUser"]["uid"].as_u64().unwrap() as u32
        })
        .collect();
    assert_eq!(records, [a, b], "the records keep the uids");

    // Once the first has stopped, its uid goes to the next task.
    fleet.admin.stop_task(&first, None).await.unwrap();
    fleet.stopped(&first).await;
    let fourth = fleet.run("sleeper").await;
    assert_eq!(uid_of(&fleet.stdout_with(&fourth, "uid=").await), a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_task_under_its_gpus_uid_reaches_its_daemon() {
    let Some(fleet) = Fleet::start("230300-230309").await else { return };
    let script = format!(
        "echo uid=$(id -u); echo answer=$(echo get_default_active_thread_percentage | {mps} 2>&1; echo rc=$?); \
         echo servers=$(echo get_server_list | {mps} 2>&1; echo rc=$?); \
         echo logs=$(ls {logs} 2>&1); echo done=1; exec sleep 600",
        mps = fleet.mps.display(),
        logs = fleet.data_dir().join("mps/log/0").display(),
    );
    fleet
        .register(
            "mps-client",
            serde_json::json!({
                "command": ["/bin/sh", "-c", script],
                "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]
            }),
        )
        .await;
    let id = fleet.run("mps-client").await;
    let out = fleet.stdout_with(&id, "done=1").await;
    assert_eq!(uid_of(&out), 230_309, "the last uid of the range is GPU 0's: {out}");
    assert_eq!(value(&out, "answer"), "100.0 rc=0", "{out}");
    assert_eq!(value(&out, "servers"), "rc=0", "{out}");
    assert!(value(&out, "logs").contains("Permission denied"), "{out}");
    // The pipe directory lets every uid through and no one else list or change it.
    let pipe = fleet.run_dir().join("mps/0");
    assert_eq!(mode(&pipe), 0o711);
    assert_eq!(std::fs::metadata(&pipe).unwrap().uid(), 0);
    assert_eq!(mode(&fleet.data_dir().join("mps/log/0")), 0o700);
}

/// The index of the GPU `task` was placed on.
async fn gpu_index(fleet: &Fleet, task: &Task) -> u32 {
    let hosts = fleet.admin.list_hosts(None).await.unwrap();
    let gpu = task.gpu_ids.first().unwrap_or_else(|| panic!("no GPU: {task:?}"));
    hosts[0].gpus.iter().find(|g| &g.gpu_id == gpu).unwrap_or_else(|| panic!("GPU {gpu} of {hosts:?}")).index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_tasks_of_one_gpu_share_its_uid_and_no_other_task_gets_it() {
    // Two GPUs: 230503 is kept for GPU 0's MPS tasks, 230502 for GPU 1's; 230500 and 230501
    // are for the other tasks.
    let Some(mut fleet) = Fleet::start_with_gpus("230500-230503", 2).await else { return };
    let tasks = fleet.data_dir().join("tasks");

    // Non-MPS tasks get uids of their own and, once those are held, none of the kept ones
    // (no process runs as those yet: only the kept status keeps them from a third task).
    fleet.register_script("plain", "echo uid=$(id -u); exec sleep 600").await;
    let plain = [fleet.run("plain").await, fleet.run("plain").await];
    let mut own = Vec::new();
    for id in &plain {
        own.push(uid_of(&fleet.stdout_with(id, "uid=").await));
    }
    own.sort();
    assert_eq!(own, [230_500, 230_501]);
    let third = fleet.run("plain").await;
    let task = fleet.stopped(&third).await;
    assert_eq!(task.stop_code, Some(StopCode::TaskFailedToStart), "{task:?}");
    assert_eq!(
        task.stopped_reason.as_deref(),
        Some(
            "no free uid in --task-uid-range 230500-230503 (2 tasks hold one; the others are in the \
             password database or run processes; the last 2 are kept for MPS tasks)"
        )
    );
    fleet.admin.stop_task(&plain[0], None).await.unwrap();
    fleet.stopped(&plain[0]).await;

    // 60,000 MiB each: binpack puts two on one H200 and the third on the other GPU.
    let mps_task = |extra: String| {
        let script = format!(
            "echo uid=$(id -u); echo home=$HOME; echo pipe=$CUDA_MPS_PIPE_DIRECTORY; \
             echo answer=$(echo get_default_active_thread_percentage | {mps} 2>&1; echo rc=$?); \
             echo identity=$(cat {identity} 2>&1); {extra} echo done=1; exec sleep 600",
            mps = fleet.mps.display(),
            identity = fleet.data_dir().join("identity.json").display(),
        );
        serde_json::json!({
            "command": ["/bin/sh", "-c", script],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 60_000}}}]
        })
    };
    fleet.register("mps-keeper", mps_task("echo kept-by-mps > $HOME/secret && echo wrote=yes;".into())).await;
    let keeper = fleet.run("mps-keeper").await;
    let keeper_out = fleet.stdout_with(&keeper, "done=1").await;
    let keeper_task = fleet.running(&keeper).await;
    let gpu = gpu_index(&fleet, &keeper_task).await;
    let shared = 230_503 - gpu;
    assert_eq!(uid_of(&keeper_out), shared, "GPU {gpu}'s uid: {keeper_out}");
    assert_eq!(value(&keeper_out, "wrote"), "yes", "{keeper_out}");
    assert_eq!(value(&keeper_out, "answer"), "100.0 rc=0", "it reaches its daemon: {keeper_out}");
    let pipe = fleet.run_dir().join("mps").join(gpu.to_string());
    assert_eq!(value(&keeper_out, "pipe"), pipe.to_str().unwrap(), "{keeper_out}");
    assert!(value(&keeper_out, "identity").contains("Permission denied"), "{keeper_out}");
    // Its own home still, 0700, owned by the shared uid.
    let keeper_home = fleet.run_dir().join("home").join(&keeper);
    assert_eq!(value(&keeper_out, "home"), keeper_home.to_str().unwrap(), "{keeper_out}");
    let meta = std::fs::metadata(&keeper_home).unwrap();
    assert_eq!((meta.uid(), meta.gid(), mode(&keeper_home)), (shared, shared, 0o700));

    // Two more MPS tasks that look at the keeper's home and logs.
    let keeper_dir = tasks.join(&keeper).join("containers/main");
    let pry = format!(
        "echo peer-read=$(cat {home}/secret 2>&1); echo log=$(cat {log} 2>&1);",
        home = keeper_home.display(),
        log = keeper_dir.join("stdout.log").display(),
    );
    fleet.register("mps-peer", mps_task(pry.clone())).await;
    let peer = fleet.run("mps-peer").await;
    let peer_out = fleet.stdout_with(&peer, "done=1").await;
    let other = fleet.run("mps-peer").await;
    let other_out = fleet.stdout_with(&other, "done=1").await;
    let (peer_task, other_task) = (fleet.running(&peer).await, fleet.running(&other).await);
    assert_eq!(peer_task.gpu_ids, keeper_task.gpu_ids, "binpack: the keeper's GPU");
    assert_ne!(other_task.gpu_ids, keeper_task.gpu_ids, "the keeper's GPU is full");
    let other_gpu = gpu_index(&fleet, &other_task).await;
    // The same GPU: the same uid, at the same time, both reaching the daemon; and the keeper's
    // home is the peer's to read (what MPS sharing gives up), its logs are not.
    assert_eq!(uid_of(&peer_out), shared, "{peer_out}");
    assert_eq!(value(&peer_out, "answer"), "100.0 rc=0", "{peer_out}");
    assert_eq!(value(&peer_out, "peer-read"), "kept-by-mps", "{peer_out}");
    assert!(value(&peer_out, "log").contains("Permission denied"), "{peer_out}");
    assert!(value(&peer_out, "identity").contains("Permission denied"), "{peer_out}");
    // The other GPU: its own kept uid, its own daemon, and nothing of the keeper's.
    assert_eq!(uid_of(&other_out), 230_503 - other_gpu, "{other_out}");
    assert_ne!(uid_of(&other_out), shared);
    assert_eq!(value(&other_out, "answer"), "100.0 rc=0", "{other_out}");
    let other_pipe = fleet.run_dir().join("mps").join(other_gpu.to_string());
    assert_eq!(value(&other_out, "pipe"), other_pipe.to_str().unwrap(), "{other_out}");
    assert!(value(&other_out, "peer-read").contains("Permission denied"), "{other_out}");
    assert!(value(&other_out, "log").contains("Permission denied"), "{other_out}");

    // A non-MPS task now gets the uid the stopped one freed, not a kept one (processes run as
    // those now), and cannot read the MPS task's home.
    fleet.register_script("prier", &format!("echo uid=$(id -u); {pry} echo done=1; exec sleep 600")).await;
    let prier = fleet.run("prier").await;
    let prier_out = fleet.stdout_with(&prier, "done=1").await;
    assert!(own.contains(&uid_of(&prier_out)), "{prier_out}");
    assert!(value(&prier_out, "peer-read").contains("Permission denied"), "{prier_out}");
    // ... and the MPS tasks cannot read its home.
    let prier_home = fleet.run_dir().join("home").join(&prier);
    assert_eq!(std::fs::metadata(&prier_home).unwrap().uid(), uid_of(&prier_out));
    assert_eq!(mode(&prier_home), 0o700);

    // After an agent restart the tasks are adopted with their uids (kept in their records), and
    // the next MPS task of a GPU shares that GPU's uid with them.
    fleet.restart_agent();
    for id in [&keeper, &peer, &other, &prier] {
        fleet.running(id).await;
    }
    for (id, uid, shared_uid) in
        [(&keeper, shared, true), (&other, 230_503 - other_gpu, true), (&prier, uid_of(&prier_out), false)]
    {
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(tasks.join(id).join("record.json")).unwrap()).unwrap();
        assert_eq!(rec["taskUser"]["uid"].as_u64(), Some(u64::from(uid)), "{rec}");
        assert_eq!(rec["sharedUid"].as_bool().unwrap_or(false), shared_uid, "{rec}");
    }
    let late = fleet.run("mps-peer").await;
    let late_out = fleet.stdout_with(&late, "done=1").await;
    let late_task = fleet.running(&late).await;
    assert_eq!(late_task.gpu_ids, other_task.gpu_ids, "the only GPU with room");
    assert_eq!(uid_of(&late_out), uid_of(&other_out), "{late_out}");
    assert_eq!(value(&late_out, "answer"), "100.0 rc=0", "{late_out}");

    // A stopped MPS task's home goes; its peers' stay.
    fleet.admin.stop_task(&keeper, None).await.unwrap();
    fleet.stopped(&keeper).await;
    assert!(std::fs::symlink_metadata(&keeper_home).is_err(), "the stopped task's home is still there");
    assert!(fleet.run_dir().join("home").join(&peer).is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_range_without_room_for_each_gpus_mps_uid_and_one_more_is_refused() {
    let Some(fleet) = Fleet::start("230600-230609").await else { return };
    let data = fleet.dir.path().join("small");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["agent", "--server", &fleet.server.url, "--join-token", &fleet.server.join_token()])
        .arg("--data-dir")
        .arg(&data)
        .args(["--emulate-gpus", &format!("H200:{H200_MIB}:2"), "--task-uid-range", "230610-230611"])
        .arg("--run-dir")
        .arg(fleet.dir.path().join("small-run"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--task-uid-range 230610-230611 holds 2 uids: the last 2 are kept for MPS tasks (one per MPS \
             daemon of this host) and tasks need at least one more; give it at least 3 uids"
        ),
        "{stderr}"
    );
    assert_eq!(fleet.admin.list_hosts(None).await.unwrap().len(), 1, "the refused agent did not register");
}

/// Starts `mpsfleet agent` with `args` and `env` (its log in `DATA_DIR.log`).
fn start_agent(data_dir: &Path, args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Agent {
    let log = std::fs::File::create(data_dir.with_extension("log")).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .arg("agent")
        .args(args)
        .envs(env.iter().copied())
        .env("MPSFLEET_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start mpsfleet agent");
    Agent { child, data_dir: data_dir.to_path_buf() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_join_token_comes_from_a_file_or_the_environment_and_reaches_no_child_of_the_agent() {
    let Some(fleet) = Fleet::start("230400-230409").await else { return };
    let token = fleet.server.join_token();
    let token_file = fleet.dir.path().join("join.token");
    std::fs::write(&token_file, format!("\n  {token}  \n")).unwrap();
    let heartbeat_and_gpus = format!("H200:{H200_MIB}:1");
    let start = |name: &str, with_file: bool| {
        let data = fleet.dir.path().join(name);
        let run = fleet.dir.path().join(format!("{name}-run"));
        let mut args: Vec<std::ffi::OsString> =
            ["--server", &fleet.server.url, "--pool", "gpu", "--hostname", name]
                .iter()
                .map(Into::into)
                .collect();
        args.extend(["--data-dir".into(), data.clone().into_os_string()]);
        args.extend([
            "--emulate-gpus".into(),
            heartbeat_and_gpus.clone().into(),
            "--heartbeat-ms".into(),
            "200".into(),
        ]);
        args.extend(["--mps-control".into(), fleet.mps.clone().into_os_string()]);
        args.extend([
            "--task-uid-range".into(),
            "230410-230419".into(),
            "--run-dir".into(),
            run.into_os_string(),
        ]);
        if with_file {
            args.extend(["--join-token-file".into(), token_file.clone().into_os_string()]);
        }
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let env: Vec<(&str, &str)> = if with_file { vec![] } else { vec![("MPSFLEET_JOIN_TOKEN", &token)] };
        (start_agent(&data, &args, &env), data)
    };
    let (from_file, file_dir) = start("from-file", true);
    let (from_env, env_dir) = start("from-env", false);
    let admin = fleet.admin.clone();
    eventually(WAIT, "both hosts to be ACTIVE", || async {
        let hosts = admin.list_hosts(None).await.ok()?;
        let active = |n: &str| hosts.iter().any(|h| h.hostname == n && h.status == HostStatus::Active);
        (active("from-file") && active("from-env")).then_some(())
    })
    .await;
    for (agent, data) in [(&from_file, &file_dir), (&from_env, &env_dir)] {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", agent.child.id())).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(&token), "the token is in the agent's argv");
        let record = data.join("mps/log/0/daemon.json");
        let record: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        let daemon = record["pid"].as_u64().unwrap();
        let environ = std::fs::read(format!("/proc/{daemon}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.contains(&token), "the MPS daemon inherited the join token: {environ}");
        assert!(!agent.log().contains(&token), "the join token is in the agent's log");
    }
    // An empty file is refused, naming the flag.
    let empty = fleet.dir.path().join("empty.token");
    std::fs::write(&empty, "\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["agent", "--server", &fleet.server.url, "--join-token-file"])
        .arg(&empty)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--join-token-file"), "{out:?}");
}
