//! Process tests of secrets, private registries and log drivers: the real server, CLI and
//! agent binaries, the agent running tasks on the private Docker Engine and registry of
//! `scripts/docker-env.sh` (`eval "$(bash scripts/docker-env.sh env)"` first).

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::api::RunTaskResponse;
use mpsfleet_types::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// A value no other test or fixture holds.
fn unique_value(what: &str) -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().map(|d| d.as_nanos()).unwrap_or_default();
    format!("{what}-{nanos:x}-{}", std::process::id())
}

/// A server logging at debug level into `<data dir>.log`, one pool, one docker agent.
struct Fleet {
    agent: Option<Agent>,
    host: HostId,
    docker: DockerEnv,
    admin: Client,
    pool: String,
    server: Server,
    server_log: PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.agent = None;
        self.docker.remove_containers_of_host(self.host.as_str());
    }
}

impl Fleet {
    async fn start(pool: &str) -> Fleet {
        let docker = docker_env();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("server");
        let server_log = dir.path().join("server.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .env("MPSFLEET_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&server_log).unwrap())
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
        let url = rx.recv_timeout(Duration::from_secs(30)).expect("the server did not start");
        let server = Server { child, url, data_dir: data };
        let admin = server.admin();
        create_pool(&admin, pool).await;
        let agent =
            Agent::start_docker(&server, &dir.path().join("a0"), pool, &format!("{pool}-h0"), &docker, &[]);
        let pool_name = pool.to_string();
        let hosts = eventually(WAIT, "the docker host to be ACTIVE", || async {
            admin
                .list_hosts(Some(&pool_name))
                .await
                .ok()
                .filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
        })
        .await;
        Fleet {
            agent: Some(agent),
            host: hosts[0].id.clone(),
            docker,
            admin,
            pool: pool.to_string(),
            server,
            server_log,
            dir,
        }
    }

    fn agent_log(&self) -> String {
        self.agent.as_ref().map(Agent::log).unwrap_or_default()
    }

    /// Runs the CLI against the server; its output, and whether it succeeded.
    fn cli(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(args)
            .env("MPSFLEET_SERVER", &self.server.url)
            .env("MPSFLEET_TOKEN", self.server.admin_token())
            .env("MPSFLEET_CA_FILE", self.server.ca_file())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the CLI");
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    fn cli_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.cli(args, stdin);
        assert!(ok, "mpsfleet {args:?} failed: {err}");
        out
    }

    async fn register(&self, def: serde_json::Value) {
        self.admin.register_taskdef(taskdef(def)).await.unwrap();
    }

    async fn run(&self, family: &str) -> Result<RunTaskResponse, mpsfleet_client::ClientError> {
        self.admin
            .run_task(&RunTask {
                task_definition: family.into(),
                count: 1,
                pool: self.pool.clone(),
                client_token: None,
                ..Default::default()
            })
            .await
    }

    async fn task_in(&self, id: &TaskId, status: TaskStatus) -> Task {
        task_reaching(&self.admin, id, status, WAIT, |_| true, || self.agent_log()).await
    }

    async fn output_with(&self, id: &TaskId, needle: &str) -> String {
        let what = format!("task {id} to print {needle:?}");
        logs_containing(
            &self.admin,
            &id.to_string(),
            mpsfleet_types::logs::LogStreams::Stdout,
            needle,
            WAIT,
            &what,
        )
        .await
        .output()
    }
}

/// Collects the server's event stream (`GET /v1/events`) into a buffer.
fn collect_events(server: &Server, token: &str) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let (url, token, out) = (format!("{}/v1/events", server.url), token.to_string(), buf.clone());
    let http = server.http();
    tokio::spawn(async move {
        let Ok(mut resp) = http.get(url).bearer_auth(token).send().await else { return };
        while let Ok(Some(chunk)) = resp.chunk().await {
            out.lock().unwrap().extend_from_slice(&chunk);
        }
    });
    buf
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t)
                    if t.is_file()
                        && std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) =>
                {
                    found.push(p)
                }
                _ => {}
            }
        }
    }
    found
}

/// A secret (one by its ARN, one by a plain name from stdin) reaches its container's
/// environment and nowhere else: not the store's files, describe output, the event stream, the
/// server's or the agent's logs or files, nor any API answer; deleted, it is gone, and a task
/// naming it is refused at run.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_reaches_its_container_and_appears_nowhere_else() {
    within(async {
        let fleet = Fleet::start("sec-env").await;
        let events = collect_events(&fleet.server, &fleet.server.admin_token());
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-pass-AbCdEf";
        let plain = "api-key";
        let (db_pass, api_key) = (unique_value("dbpass"), unique_value("apikey"));
        let file = fleet.dir.path().join("db-pass.txt");
        std::fs::write(&file, format!("{db_pass}\n")).unwrap();
        let created = fleet.cli_ok(&["secret", "create", arn, "--from-file", file.to_str().unwrap()], None);
        std::fs::remove_file(&file).unwrap();
        assert!(created.contains(arn) && !created.contains(&db_pass), "{created}");
        fleet.cli_ok(&["secret", "create", plain, "--from-file", "-"], Some(&api_key));
        // A name already stored is refused.
        let (ok, _, err) = fleet.cli(&["secret", "create", plain, "--from-file", "-"], Some("other"));
        assert!(!ok && err.contains("AlreadyExists"), "{err}");

        // The container prints each value with a '-' after every character, so that its own
        // output does not hold the value.
        fleet
            .register(serde_json::json!({
                "family": "sec-env",
                "containerDefinitions": [{
                    "name": "app",
                    "image": fleet.docker.image,
                    "command": ["sh", "-c",
                        "echo \"db=$(echo \"$DB_PASS\" | sed 's/./&-/g') key=$(echo \"$API_KEY\" | sed 's/./&-/g')\"; sleep 300"],
                    "secrets": [{"name": "DB_PASS", "valueFrom": arn}, {"name": "API_KEY", "valueFrom": plain}]
                }]
            }))
            .await;
        let task = fleet.run("sec-env").await.unwrap().tasks.remove(0);
        let running = fleet.task_in(&task.id, TaskStatus::Running).await;
        let dashed = |v: &str| v.chars().map(|c| format!("{c}-")).collect::<String>();
        let out = fleet.output_with(&task.id, "key=").await;
        assert!(out.contains(&format!("db={}", dashed(&db_pass))), "{out}");
        assert!(out.contains(&format!("key={}", dashed(&api_key))), "{out}");
        // Docker holds the variable, as it holds every container's environment.
        let id = running.containers[0].runtime_id.clone().unwrap();
        let env = fleet.docker.inspect(&id, "{{json .Config.Env}}").unwrap();
        assert!(env.contains(&format!("DB_PASS={db_pass}")), "{env}");

        // Nowhere else.
        let id_s = task.id.to_string();
        let looked_at = [
            ("task describe -o json", fleet.cli_ok(&["task", "describe", &id_s, "-o", "json"], None)),
            ("taskdef describe", fleet.cli_ok(&["taskdef", "describe", "sec-env"], None)),
            ("secret list", fleet.cli_ok(&["secret", "list"], None)),
            ("secret list -o json", fleet.cli_ok(&["secret", "list", "-o", "json"], None)),
            ("task list -o json", fleet.cli_ok(&["task", "list", "-o", "json"], None)),
        ];
        for (what, text) in &looked_at {
            for v in [&db_pass, &api_key] {
                assert!(!text.contains(v.as_str()), "{what} shows a secret's value: {text}");
            }
        }
        let listed = &looked_at[2].1;
        assert!(listed.contains(arn) && listed.contains(plain), "{listed}");
        // The agent's route is for host credentials only.
        let r = fleet
            .server
            .http()
            .get(format!("{}/v1/agent/tasks/{id_s}/secrets", fleet.server.url))
            .bearer_auth(fleet.server.admin_token())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);

        fleet.admin.stop_task(&id_s, None).await.unwrap();
        fleet.task_in(&task.id, TaskStatus::Stopped).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let events = String::from_utf8_lossy(&events.lock().unwrap()).into_owned();
        assert!(events.contains(&id_s), "the event stream saw nothing of the task: {events}");
        let server_log = std::fs::read_to_string(&fleet.server_log).unwrap();
        assert!(server_log.contains("secret stored"), "{server_log}");
        for v in [&db_pass, &api_key] {
            assert!(!events.contains(v.as_str()), "the event stream has a secret's value");
            assert!(!server_log.contains(v.as_str()), "the server's log has a secret's value");
            assert!(!fleet.agent_log().contains(v.as_str()), "the agent's log has a secret's value");
            // The store (state.db and its WAL), the tokens, the agent's task files.
            let found = files_containing(fleet.dir.path(), v.as_bytes());
            assert!(found.is_empty(), "files hold a secret's value: {found:?}");
        }

        // Deleted: gone from the list, and a task naming it is refused at run.
        fleet.cli_ok(&["secret", "delete", arn], None);
        let listed = fleet.cli_ok(&["secret", "list", "-o", "json"], None);
        assert!(!listed.contains(arn) && listed.contains(plain), "{listed}");
        let e = fleet.run("sec-env").await.unwrap_err();
        assert_eq!(e.code(), Some("InvalidParameter"), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("containerDefinitions[0].secrets[0].valueFrom") && msg.contains(arn), "{msg}");
        let (ok, _, err) = fleet.cli(&["secret", "delete", arn], None);
        assert!(!ok && err.contains("NotFound"), "{err}");
    })
    .await;
}

/// A log driver the engine lacks falls back to json-file with a note on the container, the
/// task runs and `task logs` works; drivers the engine has pass through with their options.
#[tokio::test(flavor = "multi_thread")]
async fn log_drivers_pass_through_or_fall_back_with_a_note() {
    within(async {
        let fleet = Fleet::start("sec-logs").await;
        let def = |family: &str, log: serde_json::Value| {
            serde_json::json!({
                "family": family,
                "containerDefinitions": [{
                    "name": "app",
                    "image": fleet.docker.image,
                    "command": ["sh", "-c", format!("echo hello-from-{family}; sleep 300")],
                    "logConfiguration": log
                }]
            })
        };
        let cases = [
            (
                "sec-firelens",
                serde_json::json!({"logDriver": "awsfirelens", "options": {"Name": "cloudwatch"}}),
            ),
            (
                "sec-awslogs",
                serde_json::json!({"logDriver": "awslogs", "options": {"awslogs-group": "/ecs/x"}}),
            ),
            (
                "sec-jsonfile",
                serde_json::json!({"logDriver": "json-file", "options": {"max-size": "2m", "max-file": "2"}}),
            ),
            ("sec-local", serde_json::json!({"logDriver": "local"})),
        ];
        for (family, log) in &cases {
            fleet.register(def(family, log.clone())).await;
        }
        for (family, _) in &cases {
            let task = fleet.run(family).await.unwrap().tasks.remove(0);
            let t = fleet.task_in(&task.id, TaskStatus::Running).await;
            let out = fleet.output_with(&task.id, &format!("hello-from-{family}")).await;
            assert!(out.contains(family), "{out}");
            let id = t.containers[0].runtime_id.clone().unwrap();
            let log = fleet.docker.inspect(&id, "{{json .HostConfig.LogConfig}}").unwrap();
            let log: serde_json::Value = serde_json::from_str(&log).unwrap();
            let notes = t.containers[0].notes.join("\n");
            match *family {
                "sec-firelens" | "sec-awslogs" => {
                    let driver = if *family == "sec-firelens" { "awsfirelens" } else { "awslogs" };
                    assert_eq!(log["Type"], "json-file", "{log}");
                    assert_eq!(log["Config"]["max-size"], "10m", "{log}");
                    assert!(
                        notes.contains(&format!("log driver {driver} is not available on this host"))
                            && notes.contains("json-file used; task logs work"),
                        "{notes}"
                    );
                }
                "sec-jsonfile" => {
                    assert_eq!(log["Type"], "json-file", "{log}");
                    assert_eq!(
                        (&log["Config"]["max-size"], &log["Config"]["max-file"]),
                        (&"2m".into(), &"2".into())
                    );
                    assert!(!notes.contains("log driver"), "{notes}");
                }
                _ => {
                    assert_eq!(log["Type"], "local", "{log}");
                    assert!(!notes.contains("log driver"), "{notes}");
                }
            }
            // `task describe` shows the note too.
            if family.contains("firelens") {
                let shown = fleet.cli_ok(&["task", "describe", &task.id.to_string()], None);
                assert!(shown.contains("log driver awsfirelens is not available"), "{shown}");
            }
            fleet.admin.stop_task(&task.id.to_string(), None).await.unwrap();
            fleet.task_in(&task.id, TaskStatus::Stopped).await;
        }
    })
    .await;
}

/// bcrypt of [`REGISTRY_PASSWORD`] (as `htpasswd -B` writes it), for a registry that requires
/// a login.
const REGISTRY_USER: &str = "puller";
const REGISTRY_PASSWORD: &str = "mpsfleet-registry-pw";
const REGISTRY_BCRYPT: &str = "$2b$05$injzBxt0hLMCMlGircgjaeUVUFuG/QFlVLCHo2xNXiYH/c0ISBTpG";

/// A second registry, requiring a login, serving a copy of the private registry's images.
struct AuthRegistry {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for AuthRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_auth_registry(docker: &DockerEnv) -> AuthRegistry {
    let dir = tempfile::tempdir().unwrap();
    let storage = docker.socket.parent().unwrap().join("registry");
    assert!(storage.is_dir(), "no registry storage at {}", storage.display());
    let copy = dir.path().join("storage");
    let st = Command::new("cp").arg("-a").arg(&storage).arg(&copy).status().unwrap();
    assert!(st.success());
    std::fs::write(dir.path().join("htpasswd"), format!("{REGISTRY_USER}:{REGISTRY_BCRYPT}\n")).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let config = format!(
        "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
         auth:\n  htpasswd:\n    realm: mpsfleet-test\n    path: {}\nhttp:\n  addr: {addr}\n",
        copy.display(),
        dir.path().join("htpasswd").display()
    );
    std::fs::write(dir.path().join("config.yml"), config).unwrap();
    let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
    let child = Command::new("/usr/bin/docker-registry")
        .arg("serve")
        .arg(dir.path().join("config.yml"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start docker-registry");
    // Killed and waited for when dropped, also if it never listens.
    let registry = AuthRegistry { child, addr: addr.clone(), _dir: dir };
    for _ in 0..100 {
        if std::net::TcpStream::connect(&addr).is_ok() {
            return registry;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the registry did not listen on {addr}");
}

/// `repositoryCredentials` names a stored secret holding the registry's login: the pull from a
/// registry that requires it succeeds with them, and fails without them.
#[tokio::test(flavor = "multi_thread")]
async fn repository_credentials_log_the_pull_in() {
    within(async {
        let fleet = Fleet::start("sec-registry").await;
        let registry = start_auth_registry(&fleet.docker);
        // The same image, by its name in the registry that requires a login.
        let path = fleet.docker.image.split_once('/').unwrap().1;
        let image = format!("{}/{path}", registry.addr);
        let _ = fleet.docker.cli(&["rmi", &image]);
        let creds = serde_json::json!({"username": REGISTRY_USER, "password": REGISTRY_PASSWORD}).to_string();
        let secret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:registry-AbCdEf";
        fleet.cli_ok(&["secret", "create", secret, "--from-file", "-"], Some(&creds));
        let def = |family: &str, creds: Option<&str>| {
            let mut c = serde_json::json!({
                "name": "app", "image": image, "command": ["sh", "-c", "echo pulled; sleep 300"]
            });
            if let Some(s) = creds {
                c["repositoryCredentials"] = serde_json::json!({"credentialsParameter": s});
            }
            serde_json::json!({"family": family, "containerDefinitions": [c]})
        };

        // Without credentials the registry refuses the pull.
        fleet.register(def("sec-nocreds", None)).await;
        let t = fleet.run("sec-nocreds").await.unwrap().tasks.remove(0);
        let stopped = fleet.task_in(&t.id, TaskStatus::Stopped).await;
        assert_eq!(stopped.stop_code, Some(StopCode::CannotPullContainerError), "{stopped:?}");

        // With them, it is pulled and runs.
        fleet.register(def("sec-creds", Some(secret))).await;
        let t = fleet.run("sec-creds").await.unwrap().tasks.remove(0);
        fleet.task_in(&t.id, TaskStatus::Running).await;
        fleet.output_with(&t.id, "pulled").await;
        let log = fleet.agent_log();
        assert!(!log.contains(REGISTRY_PASSWORD), "the agent's log has the registry password");
        let found = files_containing(fleet.dir.path(), REGISTRY_PASSWORD.as_bytes());
        assert!(found.is_empty(), "files hold the registry password: {found:?}");
        fleet.admin.stop_task(&t.id.to_string(), None).await.unwrap();
        fleet.task_in(&t.id, TaskStatus::Stopped).await;
        let _ = fleet.docker.cli(&["rmi", "-f", &image]);
    })
    .await;
}

/// A secret deleted after its task was run, before its container starts (it waits for another
/// container to succeed), stops the task as ECS does, with a reason that names it.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_deleted_before_its_container_starts_stops_the_task() {
    within(async {
        let fleet = Fleet::start("sec-late").await;
        let name = "late-secret";
        fleet.cli_ok(&["secret", "create", name, "--from-file", "-"], Some("v"));
        fleet
            .register(serde_json::json!({
                "family": "sec-late",
                "containerDefinitions": [
                    {"name": "first", "image": fleet.docker.image, "essential": false,
                     "command": ["sh", "-c", "sleep 4"]},
                    {"name": "app", "image": fleet.docker.image, "command": ["sleep", "300"],
                     "dependsOn": [{"containerName": "first", "condition": "SUCCESS"}],
                     "secrets": [{"name": "S", "valueFrom": name}]}
                ]
            }))
            .await;
        let task = fleet.run("sec-late").await.unwrap().tasks.remove(0);
        // "app" is launched once "first" has run for 4 s.
        fleet.cli_ok(&["secret", "delete", name], None);
        let stopped = fleet.task_in(&task.id, TaskStatus::Stopped).await;
        let reason = format!("{:?} {:?}", stopped.stopped_reason, stopped.containers);
        assert!(reason.contains(name) && reason.contains("secrets[0].valueFrom"), "{reason}");
        assert!(reason.contains("ResourceInitializationError: "), "{reason}");
        assert_eq!(stopped.stop_code, Some(StopCode::TaskFailedToStart), "{reason}");
    })
    .await;
}
