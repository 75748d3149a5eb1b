//! A new user's first half hour, as the docs tell it: `mpsfleet up` on this machine (Docker
//! Engine from the test environment, the real MPS daemon when installed), then every command of
//! README.md's "A first session" exactly as written there, then the examples of docs/cli.md.
//! Nothing here is a copy of the docs: both files are read and run, so neither can drift from
//! what the CLI does.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// docs/cli.md examples this test does not run, and why. Everything else runs.
const NOT_RUN: &[(&str, &str)] = &[
    ("up", "the session is an `up` already"),
    ("server", "a second control plane beside `up`'s"),
    ("agent", "a host needs a join token and a data dir of its own"),
    ("host drain", "takes a host of the session out of service"),
    ("host replace", "takes a host of the session out of service"),
    ("host activate", "needs a drained host"),
    ("host forget", "needs a deregistered host"),
    ("host revoke-credential", "cuts a host of the session off"),
    ("incident describe", "the session has no incident"),
    ("incident acknowledge", "the session has no incident"),
    ("incident resolve", "the session has no incident"),
    ("drill describe", "the session runs no drill (its example is a dry run)"),
    ("drill abort", "the session runs no drill (its example is a dry run)"),
    ("token revoke", "names a token id of another cluster"),
    ("token rotate-admin", "would end the admin token the session uses"),
    ("join-token revoke", "names a join token id of another cluster"),
    ("cluster rotate-certificate", "changes the certificate the session's clients see"),
    ("cluster ca rotate", "changes the CA the session's hosts trust"),
    ("cluster ca activate", "needs a CA rotation"),
    ("cluster ca cancel", "needs a CA rotation"),
    ("bench scheduler", "a benchmark: docs/benchmarks.md"),
    ("bench recovery", "a benchmark: docs/benchmarks.md"),
    ("bench ingest", "a benchmark: docs/benchmarks.md"),
    ("bench submit", "a benchmark: docs/benchmarks.md"),
    ("bench register", "a benchmark: docs/benchmarks.md"),
    ("bench start", "a benchmark: docs/benchmarks.md"),
    ("bench failover", "a benchmark against etcd: docs/benchmarks.md"),
    ("bench takeover", "a benchmark against etcd: docs/benchmarks.md"),
    ("bench metrics", "a benchmark of many hosts: docs/benchmarks.md"),
    ("bench console", "a benchmark of many hosts in a browser: docs/benchmarks.md"),
    ("bench soak", "20 minutes of faults: docs/benchmarks.md; a minute of it is tests/soak.rs"),
    ("bench traffic", "a benchmark through HAProxy: docs/benchmarks.md; CI runs it in tests/traffic.rs"),
];

/// The placeholders docs/cli.md uses for a task and a host.
const TASK_PLACEHOLDER: &str = "t-00000000000000a1";
const HOST_PLACEHOLDER: &str = "h-5f1c";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shell commands of the ```sh blocks between `## A first session` and the next `## `,
/// one per line, with a here-document kept whole with its command.
fn readme_session() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("## A first session").expect("README has a first session");
    let rest = &readme[start + 3..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut heredoc: Option<(String, String)> = None; // (terminator, text so far)
    for line in section.lines() {
        if let Some((end, text)) = heredoc.as_mut() {
            text.push_str(line);
            text.push('\n');
            if line.trim() == end {
                commands.push(heredoc.take().unwrap().1);
            }
            continue;
        }
        if line.starts_with("```") {
            in_block = line.trim() == "```sh";
            continue;
        }
        if !in_block || line.trim().is_empty() {
            continue;
        }
        if let Some(i) = line.find("<<'") {
            let end = line[i + 3..].split('\'').next().unwrap().to_string();
            heredoc = Some((end, format!("{line}\n")));
            continue;
        }
        commands.push(line.to_string());
    }
    commands
}

/// docs/cli.md's examples: (command path, example), in the page's order.
fn cli_examples() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(repo().join("docs/cli.md")).unwrap();
    let mut out = Vec::new();
    let mut path: Option<String> = None;
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if let Some(p) = line.strip_prefix("### `mpsfleet ").and_then(|p| p.strip_suffix('`')) {
            path = Some(p.to_string());
        } else if line == "```sh" {
            let example = lines.next().unwrap().to_string();
            out.push((path.take().expect("an example under a command heading"), example));
        }
    }
    out
}

/// What a README line says its output shows: `# prints web:1` -> "web:1".
fn promised(line: &str) -> Option<String> {
    let comment = line.split_once("  # ")?.1;
    comment.strip_prefix("prints ").map(|p| p.split(';').next().unwrap().trim().to_string())
}

/// The words in capitals of a README line's comment: the columns and states it says the
/// output shows.
fn sample_capitals(line: &str) -> Vec<String> {
    let Some((_, comment)) = line.split_once("  # ") else { return Vec::new() };
    comment
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.len() >= 3 && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(String::from)
        .collect()
}

/// Kills the process whose pid a file names, when dropped (a daemon a README line started).
struct KillPidFile(PathBuf);

impl Drop for KillPidFile {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.0).ok().and_then(|p| p.trim().parse::<i32>().ok()) {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    }
}

/// `mpsfleet up`, stopped as Ctrl-C stops it (then killed) if the test ends early.
struct Up(std::process::Child);

impl Drop for Up {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill").args(["-INT", &self.0.id().to_string()]).status();
            for _ in 0..300 {
                if self.0.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.0.kill();
        }
    }
}

struct Session {
    dir: tempfile::TempDir,
    bin: PathBuf,
    docker: DockerEnv,
}

impl Session {
    /// `program` in the session's directory and environment: its home (where `up` writes the
    /// client config) and the test's Docker Engine.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .env("DOCKER_HOST", format!("unix://{}", self.docker.socket.display()))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs one command line in bash as a user would in the session's directory.
    fn sh(&self, line: &str, limit: Duration) -> (bool, String, String) {
        let child = self
            .command("bash")
            .args(["-o", "pipefail", "-c", line])
            .env("PATH", format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default()))
            .env_remove("MPSFLEET_SERVER")
            .env_remove("MPSFLEET_TOKEN")
            .env_remove("MPSFLEET_CA_FILE")
            .env_remove("MPSFLEET_POOL")
            // A new user's shell: no AWS settings of this machine's (AWS_CA_BUNDLE would win
            // over the profile's ca_bundle).
            .env_remove("AWS_CA_BUNDLE")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("COLUMNS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read on a thread while it runs (a long output must not fill the pipe).
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait_with_output()));
        let out = match rx.recv_timeout(limit) {
            Ok(out) => out.unwrap(),
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                panic!("`{line}` ran past {limit:?}");
            }
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    fn ok(&self, line: &str) -> String {
        let (ok, out, err) = self.sh(line, Duration::from_secs(240));
        assert!(ok, "`{line}` failed:\n{out}\n{err}");
        eprint!("{err}");
        out
    }

    /// The id in the first column of the first row of a table command.
    fn first_id(&self, line: &str) -> String {
        let out = self.ok(line);
        let row = out.lines().nth(1).unwrap_or_else(|| panic!("`{line}` listed nothing:\n{out}"));
        row.split_whitespace().next().unwrap().to_string()
    }
}

#[test]
fn the_readme_session_and_the_cli_examples_run_as_written() {
    let docker = docker_env();
    let dir = tempfile::tempdir().unwrap();
    // `mpsfleet` on PATH, as the README's alias makes it.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_mpsfleet"), bin.join("mpsfleet")).unwrap();
    // The README is run from a checkout: its scripts are where it says.
    std::os::unix::fs::symlink(repo().join("scripts"), dir.path().join("scripts")).unwrap();
    // deploy/haproxy/haproxy.cfg as shipped, but for the DNS and front ports of this run (the
    // README's are taken by whatever else runs on this machine).
    let dns_port = free_port();
    let front_port = free_port();
    let shipped = std::fs::read_to_string(repo().join("deploy/haproxy/haproxy.cfg")).unwrap();
    let cfg = shipped
        .replace("127.0.0.1:8600", &format!("127.0.0.1:{dns_port}"))
        .replace("bind 127.0.0.1:8080", &format!("bind 127.0.0.1:{front_port}"))
        .replace("/tmp/haproxy-mpsfleet.sock", &dir.path().join("haproxy.sock").display().to_string());
    assert!(
        cfg.contains(&dns_port.to_string()) && cfg.contains(&front_port.to_string()),
        "the shipped config changed"
    );
    std::fs::create_dir_all(dir.path().join("deploy/haproxy")).unwrap();
    std::fs::write(dir.path().join("deploy/haproxy/haproxy.cfg"), cfg).unwrap();
    // The AWS CLI and the ECS model where the README's `bash scripts/ecs-env.sh` puts them.
    let aws = ecs_env();
    if let Some(env) = &aws {
        std::fs::create_dir_all(dir.path().join("target")).unwrap();
        std::os::unix::fs::symlink(env, dir.path().join("target/ecs-env")).unwrap();
        std::os::unix::fs::symlink(env.join("cli/bin/aws"), bin.join("aws")).unwrap();
    }
    let s = Session { dir, bin, docker };
    // The README's HAProxy (started with -D) ends with the test, whatever happens (before the
    // session's directory goes).
    let _haproxy = KillPidFile(s.dir.path().join("haproxy.pid"));

    // README's first command, on a port of its own.
    let listen = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    );
    let up = s
        .command(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["up", "--hosts", "2", "--gpus-per-host", "2", "--listen", &listen])
        .args(["--dns-listen", &format!("127.0.0.1:{dns_port}")])
        .args(
            mps_control()
                .map(|p| vec!["--mps-control".to_string(), p.display().to_string()])
                .unwrap_or_default(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut up = Up(up);
    let stdout = up.0.stdout.take().unwrap();
    let printed = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            eprintln!("up: {line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // Up to 2 minutes, every half second.
    for attempt in 1.. {
        let (ok, out, _) = s.sh("mpsfleet host list", Duration::from_secs(30));
        if ok && out.matches(" ACTIVE ").count() == 2 {
            break;
        }
        assert!(attempt < 240, "up's two hosts are not ACTIVE after 2 minutes:\n{out}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // The first session, line by line.
    let host_id = s.first_id("mpsfleet host list");
    let mut web_task = None;
    for line in readme_session() {
        if line.starts_with("alias ") {
            continue; // `mpsfleet` and `aws` are on PATH already
        }
        if line.starts_with("aws ") && aws.is_none() {
            continue; // no AWS CLI here, and not on CI (ecs_env said so)
        }
        let mut cmd = line.replace("<host-id>", &host_id);
        if line.starts_with("curl ") {
            // HAProxy's front end, on this run's port.
            cmd = cmd.replace("http://127.0.0.1:8080/", &format!("http://127.0.0.1:{front_port}/"));
        }
        if cmd.contains("<task-id>") {
            let id = web_task.get_or_insert_with(|| s.first_id("mpsfleet task list --service web")).clone();
            cmd = cmd.replace("<task-id>", &id);
        }
        eprintln!("$ {cmd}");
        let (ok, out, err) = s.sh(&cmd, Duration::from_secs(240));
        assert!(ok, "`{cmd}` failed:\n{out}\n{err}");
        eprint!("{out}{err}");
        if let Some(p) = promised(&line) {
            // `--wait` prints its progress and final line on stderr, the object on stdout.
            assert!(
                out.contains(&p) || err.contains(&p),
                "README says `{line}` prints {p}; it printed:\n{out}{err}"
            );
        }
        if line.contains("curl") {
            assert!(out.contains("hello from t-"), "the demo page: {out}");
        }
        if line.starts_with("mpsfleet task list") {
            assert!(out.contains("RUNNING") && out.contains("HEALTHY"), "{out}");
        }
        // A list's sample output names its columns and states in capitals (`RUNTIME docker`,
        // `RUNNING and HEALTHY`): each one is in what the command printed.
        if line.starts_with("mpsfleet ") && line.split("  # ").next().is_some_and(|c| c.contains(" list")) {
            for word in sample_capitals(&line) {
                assert!(out.contains(&word), "README says `{line}` shows {word}; it printed:\n{out}");
            }
        }
        if line.starts_with("mpsfleet service endpoints") {
            // `up` publishes on 127.0.0.1: the kernel lists each port there and nowhere else.
            for row in out.lines().skip(1) {
                let address = row.split_whitespace().next().unwrap_or_default();
                let port =
                    address.strip_prefix("127.0.0.1:").unwrap_or_else(|| panic!("not on loopback: {out}"));
                let (_, kernel, _) = s.sh(&format!("ss -ltnH 'sport = :{port}'"), Duration::from_secs(10));
                let listening: Vec<&str> =
                    kernel.lines().filter_map(|l| l.split_whitespace().nth(3)).collect();
                assert_eq!(listening, [address], "{out}\n{kernel}");
                assert!(row.contains("loopback"), "{out}");
            }
        }
        if line.starts_with("mpsfleet task exec") {
            // Run inside the replica: its own id, and the page its entrypoint wrote there.
            let id = web_task.clone().unwrap_or_default();
            let mut lines = out.lines();
            assert_eq!(lines.next(), Some(id.as_str()), "{out}");
            assert!(out.contains(&format!("hello from {id}")), "{out}");
        }
        if line.starts_with("mpsfleet task logs") {
            assert!(out.contains("demo: serving /www on port 8080"), "the demo's first line: {out}");
        }
        if line.starts_with("mpsfleet task describe") {
            for want in ["Containers:", "Events:", "Started", "Placed"] {
                assert!(out.contains(want), "task describe lacks {want}:\n{out}");
            }
        }
        if line.starts_with("mpsfleet host describe") {
            for want in ["GPUs:", "NVIDIA_MPS", "Checks:", "MPS_DAEMON", "Events:", "Registered"] {
                assert!(out.contains(want), "host describe lacks {want}:\n{out}");
            }
        }
    }

    // docs/cli.md's examples, with a task and a host of this session for the placeholders.
    std::fs::write(s.dir.path().join("db-password.txt"), "s3cret\n").unwrap();
    let task_id = s.first_id("mpsfleet task list --service web");
    let examples = cli_examples();
    assert!(examples.len() > 50, "docs/cli.md has {} examples", examples.len());
    let mut ran = 0;
    for (path, example) in &examples {
        if let Some((_, why)) = NOT_RUN.iter().find(|(p, _)| p == path) {
            eprintln!("not run: {example} ({why})");
            continue;
        }
        let cmd = example.replace(TASK_PLACEHOLDER, &task_id).replace(HOST_PLACEHOLDER, &host_id);
        eprintln!("$ {cmd}");
        let out = s.ok(&cmd);
        eprint!("{out}");
        ran += 1;
        // What some of them promise, checked.
        match path.as_str() {
            "service update" => {
                let shown = s.ok("mpsfleet service describe api");
                assert!(shown.contains("3 desired, 3 healthy"), "--wait returned early:\n{shown}");
            }
            "pool describe" => {
                assert!(out.contains("Remediation:") && out.contains("storm breaker"), "{out}")
            }
            "task stop" => assert!(s
                .ok(&format!("mpsfleet task describe {task_id}"))
                .contains("Stopped reason:   retrain")),
            // The script calls mpsfleet back for live ids (tests/cli_output.rs completes with it).
            "completion" => {
                assert!(out.contains("_clap_complete_mpsfleet") && out.contains("COMPLETE="), "{out}")
            }
            // Every replica of api, each line with its task and time.
            "service logs" => assert!(
                out.lines().filter(|l| l.starts_with("[task/") && l.contains("demo: serving")).count() >= 2,
                "{out}"
            ),
            // A one-time link, never the session's token.
            "console" => assert!(out.contains("/#login=mpsf_link_"), "{out}"),
            // The task stopped above is in the kept past.
            "events" => {
                assert!(out.contains(&format!("task/{task_id}")) && out.contains("task.stopped"), "{out}")
            }
            _ => {}
        }
    }
    assert!(ran >= 35, "only {ran} examples ran");
    for (p, _) in NOT_RUN {
        assert!(examples.iter().any(|(q, _)| q == p), "NOT_RUN names {p}, which has no example");
    }

    // Ctrl-C stops everything: the service's containers run until then.
    let hosts: Vec<String> = s
        .ok("mpsfleet host list")
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let running = || -> Vec<String> {
        hosts
            .iter()
            .flat_map(|h| s.docker.containers_labelled("io.mpsfleet.host", h))
            .filter(|c| s.docker.inspect(c, "{{.State.Running}}").as_deref() == Some("true"))
            .collect()
    };
    assert!(!running().is_empty(), "web's replicas run before Ctrl-C");
    let pid = up.0.id() as i32;
    Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap();
    for attempt in 1.. {
        if up.0.try_wait().unwrap().is_some() {
            break;
        }
        assert!(attempt < 300, "up did not stop within 60 s of Ctrl-C");
        std::thread::sleep(Duration::from_millis(200));
    }
    let printed = printed.join().unwrap();
    assert!(printed.contains("stopped"), "{printed}");
    assert_eq!(running(), Vec::<String>::new(), "containers still running after up stopped");
}

/// `up` on a port that is taken fails before it writes anything: no tokens, no database.
#[test]
fn up_on_a_port_in_use_writes_nothing() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["up", "--listen", &listen, "--data-dir"])
        .arg(&data)
        .env("HOME", dir.path())
        .env_remove("XDG_CONFIG_HOME")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {listen}")), "{err}");
    assert!(!data.exists(), "up wrote {} before it failed", data.display());
    assert!(!dir.path().join(".config").exists(), "up wrote a client config before it failed");
}

/// The sample check reads the capitals of a comment, and only those: the README's old `host
/// list` line would have asked for an IDLE no output has.
#[test]
fn a_samples_capitals_are_its_columns_and_states() {
    let old =
        "mpsfleet host list                                 # two ACTIVE hosts, RUNTIME docker, GPUs IDLE";
    assert_eq!(sample_capitals(old), ["ACTIVE", "RUNTIME", "IDLE"]);
    assert!(sample_capitals("mpsfleet task list").is_empty());
}
