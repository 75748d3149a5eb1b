//! The CLI's output for scripts against a real server: `-o name`, `-o jsonpath=` and
//! `-o custom-columns=` in kubectl's syntax, `--no-headers`, `--sort-by` and `-l`, on lists and
//! on one object.

mod common;

use common::*;
use mpsfleet_types::*;
use std::process::Command;

/// The CLI with `args`, as the server's admin.
fn command(server: &Server, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mpsfleet"));
    c.args(args).args([
        "--server",
        &server.url,
        "--token",
        &server.admin_token(),
        "--ca-file",
        &server.ca_file(),
    ]);
    c
}

fn cli(server: &Server, args: &[&str]) -> String {
    let out = command(server, args).output().expect("run the CLI");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A server with pool "gpu", task definition "infer" and one emulated host of `gpus` GPUs,
/// running `count` tasks. Fields drop in order: the host's client, the server, the data dir.
struct Fleet {
    host: HostId,
    _agent: mpsfleet_client::Client,
    admin: mpsfleet_client::Client,
    run: RunTask,
    /// The tasks started, their ids sorted.
    ids: Vec<String>,
    server: Server,
    _tmp: tempfile::TempDir,
}

async fn fleet(gpus: u32, count: u32) -> Fleet {
    let tmp = tempfile::tempdir().expect("tmp");
    let server = Server::start(tmp.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("infer", 1024)).await.expect("register");
    let (host, agent) = add_host(&server, "gpu", "node-a", gpus).await;
    let run = RunTask { task_definition: "infer".into(), count, pool: "gpu".into(), ..Default::default() };
    let mut ids: Vec<String> =
        admin.run_task(&run).await.expect("run").tasks.iter().map(|t| t.id.to_string()).collect();
    ids.sort();
    Fleet { host, _agent: agent, admin, run, ids, server, _tmp: tmp }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_print_names_templates_and_columns_sorted() {
    let f = fleet(2, 3).await;
    let (server, host, ids) = (&f.server, &f.host, f.ids.clone());

    // -o name: KIND/ID per line, every task.
    let names = cli(server, &["task", "list", "-o", "name", "--sort-by", ".id"]);
    let want: Vec<String> = ids.iter().map(|i| format!("task/{i}")).collect();
    assert_eq!(names.lines().collect::<Vec<_>>(), want);

    // -o jsonpath: a list is {"items": [...]}, as in kubectl; sorted by --sort-by.
    let line = cli(server, &["task", "list", "-o", "jsonpath={.items[*].id}", "--sort-by", ".id"]);
    assert_eq!(line.trim_end(), ids.join(" "));
    let ranged =
        cli(server, &["task", "list", "-o", r#"jsonpath={range .items[*]}{.id}{"\t"}{.hostId}{"\n"}{end}"#]);
    assert_eq!(ranged.lines().count(), 3, "{ranged}");
    assert!(ranged.lines().all(|l| l.ends_with(&format!("\t{host}"))), "{ranged}");
    // One object is the root itself.
    let one = cli(server, &["task", "describe", &ids[0], "-o", "jsonpath={.id} {.lastStatus}"]);
    assert!(one.starts_with(&format!("{} ", ids[0])), "{one}");

    // -o custom-columns, with and without the header line.
    let table =
        cli(server, &["task", "list", "-o", "custom-columns=ID:.id,HOST:.hostId", "--sort-by", ".id"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["ID", "HOST"]);
    for (row, id) in rows[1..].iter().zip(&ids) {
        assert_eq!(row, &[id.as_str(), host.as_str()]);
    }
    let bare =
        cli(server, &["task", "list", "-o", "custom-columns=ID:.id", "--no-headers", "--sort-by", ".id"]);
    assert_eq!(bare.lines().map(str::trim).collect::<Vec<_>>(), ids);
    // Tables with a time have an AGE column, kubectl's way.
    for list in [&["task", "list"][..], &["host", "list"], &["service", "list"]] {
        let header = cli(server, list);
        assert!(header.lines().next().is_some_and(|h| h.trim_end().ends_with("AGE")), "{list:?}: {header}");
    }
    let age = cli(server, &["task", "list", "--no-headers"]);
    assert!(age.lines().all(|l| l.trim_end().ends_with('s')), "just made, seconds old: {age}");
    let plain = cli(server, &["host", "list", "--no-headers"]);
    assert!(plain.lines().next().is_some_and(|l| l.starts_with(host.as_str())), "{plain}");

    // --sort-by orders the human table too.
    let newest_first = cli(server, &["task", "list", "-o", "wide", "--sort-by", ".id", "--no-headers"]);
    let firsts: Vec<&str> = newest_first.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(firsts, ids);

    // -l selects by tag: a task's are its run's (and `task run -o name` names what it ran).
    let ml = cli(
        server,
        &["task", "run", "--taskdef", "infer", "--pool", "gpu", "--tag", "team=ml", "-o", "name"],
    );
    let ml = ml.trim().strip_prefix("task/").unwrap_or_else(|| panic!("task run -o name: {ml}")).to_string();
    assert_eq!(cli(server, &["task", "list", "-l", "team=ml", "-o", "name"]).trim(), format!("task/{ml}"));
    let others =
        cli(server, &["task", "list", "-l", "team!=ml", "-o", "jsonpath={.items[*].id}", "--sort-by", ".id"]);
    assert_eq!(others.trim_end(), ids.join(" "));
    assert_eq!(cli(server, &["task", "list", "-l", "team=web", "--no-headers"]), "");
}

/// A CLI command left running, its output lines read as they come.
fn spawn_cli(server: &Server, args: &[&str]) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut child = command(server, args).stdout(std::process::Stdio::piped()).spawn().expect("run the CLI");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Waits for a line `want` accepts, failing after 30 s with every line seen.
fn line_where(rx: &std::sync::mpsc::Receiver<String>, want: impl Fn(&str) -> bool) -> String {
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(l) if want(&l) => return l,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no such line within 30 s; saw:\n{}", seen.join("\n")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_events_print_changes_as_they_happen() {
    let f = fleet(1, 1).await;
    let (server, admin, run, first) = (&f.server, &f.admin, &f.run, f.ids[0].clone());

    // task list --watch: the list, then the task again when it is stopped.
    let (mut watching, lines) = spawn_cli(server, &["task", "list", "--all", "--watch", "--no-headers"]);
    line_where(&lines, |l| l.starts_with(&first));
    // events --follow: the next task event, as JSON.
    let (mut events, event_lines) =
        spawn_cli(server, &["events", "--follow", "--kind", "task.event", "--limit", "1", "-o", "json"]);
    std::thread::sleep(std::time::Duration::from_millis(500)); // both streams are open
    admin.stop_task(&first, Some("watched".into())).await.expect("stop");
    let changed = line_where(&lines, |l| l.starts_with(&first) && l.contains("STOPPED"));
    assert!(changed.split_whitespace().count() > 3, "{changed}");
    let second = admin.run_task(run).await.expect("run again").tasks[0].id.to_string();
    let ev: serde_json::Value =
        serde_json::from_str(&line_where(&event_lines, |l| l.starts_with('{'))).expect("JSON");
    assert_eq!(ev["type"], "task.event", "{ev}");
    assert!(ev["subject"]["id"] == first || ev["subject"]["id"] == second, "{ev}");
    assert!(events.wait().expect("events ends after --limit").success());
    let _ = watching.kill();
    let _ = watching.wait();

    // events without --follow: the past the server keeps, oldest first, then it ends; the
    // first task's whole story is there though nobody was listening when it began.
    let out = command(
        server,
        &["events", "--since", "10m", "--kind", "task.event", "--kind", "task.stopped", "-o", "json"],
    )
    .output()
    .expect("events");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let past: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let of_first: Vec<&serde_json::Value> =
        past.iter().filter(|e| e["subject"]["id"] == first || e["task"]["id"] == first).collect();
    let reasons: Vec<&str> = of_first.iter().filter_map(|e| e["event"]["reason"].as_str()).collect();
    assert_eq!(reasons, ["Placed", "Stopping"], "{of_first:?}");
    let ids: Vec<&str> = past.iter().map(|e| e["id"].as_str().expect("an id")).collect();
    let mut sorted = ids.clone();
    sorted.sort_by_key(|id| id.rsplit('-').next().and_then(|n| n.parse::<u64>().ok()));
    assert_eq!(ids, sorted, "oldest first");
    let table = command(server, &["events", "--since", "10m"]).output().expect("events");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.lines().any(|l| l.contains(&format!("task/{first}"))), "{text}");
}

#[test]
fn a_bad_template_or_path_is_refused_before_anything_is_sent() {
    for (args, says) in [
        (vec!["task", "list", "-o", "jsonpath={.items"], "unclosed"),
        (vec!["task", "list", "-o", "custom-columns=ID"], "HEADER:PATH"),
        (vec!["task", "list", "-o", "xml"], "not an output format"),
        (vec!["task", "list", "--sort-by", "id"], "not a path"),
        (vec!["task", "list", "-l", "=ml"], "no tag key"),
        (vec!["events", "--kind", "task.exploded"], "not an event type"),
        (vec!["events", "--since", "10x"], "--since"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(&args)
            .args(["--server", "https://127.0.0.1:9"])
            .output()
            .expect("run the CLI");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    }
}

/// What bash's TAB gets for `words` (the last one being completed): the script of
/// `mpsfleet completion bash` sourced in a real bash, its function called as bash calls it,
/// COMPREPLY printed a line each.
fn bash_completes(env: &[(&str, String)], words: &[&str]) -> Vec<String> {
    let script =
        Command::new(env!("CARGO_BIN_EXE_mpsfleet")).args(["completion", "bash"]).output().expect("script");
    assert!(script.status.success());
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("mpsfleet.bash");
    std::fs::write(&file, &script.stdout).expect("write the script");
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let body = format!(
        "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_TYPE=9; \
         _clap_complete_mpsfleet mpsfleet {} {}; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        file.display(),
        quoted.join(" "),
        words.len() - 1,
        quoted[words.len() - 1],
        quoted[words.len() - 2],
    );
    let out = Command::new("bash")
        .args(["--norc", "-c", &body])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("bash");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_offers_live_ids_and_falls_back_to_flags() {
    let f = fleet(1, 2).await;
    let (server, host, tasks) = (&f.server, &f.host, f.ids.clone());
    let env = vec![
        ("MPSFLEET_SERVER", server.url.clone()),
        ("MPSFLEET_TOKEN", server.admin_token()),
        ("MPSFLEET_CA_FILE", server.ca_file()),
    ];

    // bash: live task ids, host ids, pool and family names where the command takes them.
    let mut got = bash_completes(&env, &["mpsfleet", "task", "describe", ""]);
    got.retain(|w| w.starts_with("t-"));
    got.sort();
    assert_eq!(got, tasks);
    let prefix = &tasks[0][..tasks[0].len() - 2];
    let narrowed = bash_completes(&env, &["mpsfleet", "task", "stop", prefix]);
    assert!(narrowed.contains(&tasks[0]) && narrowed.iter().all(|w| w.starts_with(prefix)), "{narrowed:?}");
    assert_eq!(bash_completes(&env, &["mpsfleet", "host", "cordon", "h-"]), [host.to_string()]);
    assert_eq!(bash_completes(&env, &["mpsfleet", "task", "run", "--pool", ""]), ["gpu"]);
    assert_eq!(bash_completes(&env, &["mpsfleet", "task", "run", "--taskdef", "inf"]), ["infer"]);
    // The credentials on the command line being completed are the ones used.
    let flags_only = vec![("MPSFLEET_SERVER", "https://127.0.0.1:9".to_string())];
    let on_line = bash_completes(
        &flags_only,
        &[
            "mpsfleet",
            "task",
            "describe",
            "--server",
            &server.url,
            "--token",
            &server.admin_token(),
            "--ca-file",
            &server.ca_file(),
            "t-",
        ],
    );
    assert_eq!(on_line.len(), 2, "{on_line:?}");

    // zsh's protocol: value:description lines.
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["--", "mpsfleet", "task", "describe", ""])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("COMPLETE", "zsh")
        .env("_CLAP_COMPLETE_INDEX", "3")
        .env("_CLAP_IFS", "\n")
        .output()
        .expect("zsh completion");
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    for t in &tasks {
        assert!(lines.lines().any(|l| l.starts_with(&format!("{t}:")) && l.contains("infer")), "{lines}");
    }

    // mpsfleet's own name for the variable answers the same.
    let own = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["--", "mpsfleet", "host", "describe", ""])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("MPSFLEET_COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", "3")
        .env("_CLAP_IFS", "\n")
        .output()
        .expect("bash completion");
    assert!(String::from_utf8_lossy(&own.stdout).lines().any(|l| l == host.to_string()), "{own:?}");
    // clap's usual registration prints the same kind of script.
    let script =
        Command::new(env!("CARGO_BIN_EXE_mpsfleet")).env("COMPLETE", "bash").output().expect("script");
    assert!(String::from_utf8_lossy(&script.stdout).contains("_clap_complete_"), "{script:?}");

    // A server that accepts and never answers: the TAB gives up and offers the flags.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let silent_env = vec![("MPSFLEET_SERVER", format!("https://{}", silent.local_addr().unwrap()))];
    let started = tokio::time::Instant::now();
    let flags = bash_completes(&silent_env, &["mpsfleet", "task", "describe", "-"]);
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(flags.contains(&"-o".to_string()) && flags.contains(&"--server".to_string()), "{flags:?}");
    assert!(bash_completes(&silent_env, &["mpsfleet", "task", "describe", ""])
        .iter()
        .all(|w| w.starts_with('-')));
    drop(silent);
}
