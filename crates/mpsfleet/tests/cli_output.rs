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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_print_names_templates_and_columns_sorted() {
    let tmp = tempfile::tempdir().expect("tmp");
    let server = Server::start(tmp.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("infer", 1024)).await.expect("register");
    let (host, _agent) = add_host(&server, "gpu", "node-a", 2).await;
    let run = RunTask { task_definition: "infer".into(), count: 3, pool: "gpu".into(), ..Default::default() };
    let tasks = admin.run_task(&run).await.expect("run").tasks;
    let mut ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
    ids.sort();

    // -o name: KIND/ID per line, every task.
    let names = cli(&server, &["task", "list", "-o", "name", "--sort-by", ".id"]);
    let want: Vec<String> = ids.iter().map(|i| format!("task/{i}")).collect();
    assert_eq!(names.lines().collect::<Vec<_>>(), want);

    // -o jsonpath: a list is {"items": [...]}, as in kubectl; sorted by --sort-by.
    let line = cli(&server, &["task", "list", "-o", "jsonpath={.items[*].id}", "--sort-by", ".id"]);
    assert_eq!(line.trim_end(), ids.join(" "));
    let ranged =
        cli(&server, &["task", "list", "-o", r#"jsonpath={range .items[*]}{.id}{"\t"}{.hostId}{"\n"}{end}"#]);
    assert_eq!(ranged.lines().count(), 3, "{ranged}");
    assert!(ranged.lines().all(|l| l.ends_with(&format!("\t{host}"))), "{ranged}");
    // One object is the root itself.
    let one = cli(&server, &["task", "describe", &ids[0], "-o", "jsonpath={.id} {.lastStatus}"]);
    assert!(one.starts_with(&format!("{} ", ids[0])), "{one}");

    // -o custom-columns, with and without the header line.
    let table =
        cli(&server, &["task", "list", "-o", "custom-columns=ID:.id,HOST:.hostId", "--sort-by", ".id"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["ID", "HOST"]);
    for (row, id) in rows[1..].iter().zip(&ids) {
        assert_eq!(row, &[id.as_str(), host.as_str()]);
    }
    let bare =
        cli(&server, &["task", "list", "-o", "custom-columns=ID:.id", "--no-headers", "--sort-by", ".id"]);
    assert_eq!(bare.lines().map(str::trim).collect::<Vec<_>>(), ids);
    // Tables with a time have an AGE column, kubectl's way.
    for list in [&["task", "list"][..], &["host", "list"], &["service", "list"]] {
        let header = cli(&server, list);
        assert!(header.lines().next().is_some_and(|h| h.trim_end().ends_with("AGE")), "{list:?}: {header}");
    }
    let age = cli(&server, &["task", "list", "--no-headers"]);
    assert!(age.lines().all(|l| l.trim_end().ends_with('s')), "just made, seconds old: {age}");
    let plain = cli(&server, &["host", "list", "--no-headers"]);
    assert!(plain.lines().next().is_some_and(|l| l.starts_with(host.as_str())), "{plain}");

    // --sort-by orders the human table too.
    let newest_first = cli(&server, &["task", "list", "-o", "wide", "--sort-by", ".id", "--no-headers"]);
    let firsts: Vec<&str> = newest_first.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(firsts, ids);

    // -l selects by tag: a task's are its run's (and `task run -o name` names what it ran).
    let ml = cli(
        &server,
        &["task", "run", "--taskdef", "infer", "--pool", "gpu", "--tag", "team=ml", "-o", "name"],
    );
    let ml = ml.trim().strip_prefix("task/").unwrap_or_else(|| panic!("task run -o name: {ml}")).to_string();
    assert_eq!(cli(&server, &["task", "list", "-l", "team=ml", "-o", "name"]).trim(), format!("task/{ml}"));
    let others = cli(
        &server,
        &["task", "list", "-l", "team!=ml", "-o", "jsonpath={.items[*].id}", "--sort-by", ".id"],
    );
    assert_eq!(others.trim_end(), ids.join(" "));
    assert_eq!(cli(&server, &["task", "list", "-l", "team=web", "--no-headers"]), "");
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
    let tmp = tempfile::tempdir().expect("tmp");
    let server = Server::start(tmp.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    admin.register_taskdef(mps_taskdef("infer", 1024)).await.expect("register");
    let _host = add_host(&server, "gpu", "node-a", 1).await;
    let run = RunTask { task_definition: "infer".into(), count: 1, pool: "gpu".into(), ..Default::default() };
    let first = admin.run_task(&run).await.expect("run").tasks[0].id.to_string();

    // task list --watch: the list, then the task again when it is stopped.
    let (mut watching, lines) = spawn_cli(&server, &["task", "list", "--all", "--watch", "--no-headers"]);
    line_where(&lines, |l| l.starts_with(&first));
    // events: the next task event, as JSON.
    let (mut events, event_lines) =
        spawn_cli(&server, &["events", "--kind", "task.event", "--limit", "1", "-o", "json"]);
    std::thread::sleep(std::time::Duration::from_millis(500)); // both streams are open
    admin.stop_task(&first, Some("watched".into())).await.expect("stop");
    let changed = line_where(&lines, |l| l.starts_with(&first) && l.contains("STOPPED"));
    assert!(changed.split_whitespace().count() > 3, "{changed}");
    let second = admin.run_task(&run).await.expect("run again").tasks[0].id.to_string();
    let ev: serde_json::Value =
        serde_json::from_str(&line_where(&event_lines, |l| l.starts_with('{'))).expect("JSON");
    assert_eq!(ev["type"], "task.event", "{ev}");
    assert!(ev["subject"]["id"] == first || ev["subject"]["id"] == second, "{ev}");
    assert!(events.wait().expect("events ends after --limit").success());
    let _ = watching.kill();
    let _ = watching.wait();
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
