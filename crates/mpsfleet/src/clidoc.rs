//! docs/cli.md, generated from the command tree so that it cannot drift: every command with
//! what `--help` says of it and its options, and an example that the CLI's own parser must
//! accept. `MPSFLEET_WRITE_DOCS=1 cargo test -p mpsfleet --bin mpsfleet cli_reference` writes
//! it; the test fails while the file differs.

use clap::CommandFactory;

/// One example per command (the path after `mpsfleet`), each a command line as typed.
const EXAMPLES: &[(&str, &str)] = &[
    ("up", "mpsfleet up --hosts 2 --gpus-per-host 2"),
    ("server", "mpsfleet server --data-dir /var/lib/mpsfleet --listen 0.0.0.0:7070"),
    ("agent", "mpsfleet agent --server https://10.0.0.5:7070 --join-token-file /etc/mpsfleet/join.token --pool gpu --data-dir /var/lib/mpsfleet-agent"),
    ("taskdef register", "mpsfleet taskdef register --file infer.json"),
    ("taskdef list", "mpsfleet taskdef list"),
    ("taskdef describe", "mpsfleet taskdef describe infer:1 -o yaml"),
    ("task run", "mpsfleet task run --taskdef infer --count 4 --priority 30 --wait --timeout 120"),
    ("task list", "mpsfleet task list --service web --all -o wide"),
    ("task describe", "mpsfleet task describe t-00000000000000a1"),
    ("task protect", "mpsfleet task protect t-00000000000000a1 --minutes 60"),
    ("task exec", "mpsfleet task exec t-00000000000000a1 -- sh -c 'id -u; ls /'"),
    ("task stop", "mpsfleet task stop t-00000000000000a1 --reason retrain --wait"),
    ("task logs", "mpsfleet task logs t-00000000000000a1 --tail 50 --follow"),
    ("host list", "mpsfleet host list --pool default --all"),
    ("host describe", "mpsfleet host describe h-5f1c"),
    ("host cordon", "mpsfleet host cordon h-5f1c"),
    ("host uncordon", "mpsfleet host uncordon h-5f1c"),
    ("host drain", "mpsfleet host drain h-5f1c --wait"),
    ("host replace", "mpsfleet host replace h-5f1c"),
    ("host activate", "mpsfleet host activate h-5f1c"),
    ("host recheck", "mpsfleet host recheck h-5f1c"),
    ("host forget", "mpsfleet host forget h-5f1c"),
    ("host revoke-credential", "mpsfleet host revoke-credential h-5f1c"),
    ("pool create", "mpsfleet pool create batch --mode self-managed --strategy spread --preemption all"),
    ("pool update", "mpsfleet pool update batch --compute-overcommit-percent 150 --preemption off"),
    ("pool list", "mpsfleet pool list"),
    ("pool describe", "mpsfleet pool describe default"),
    ("pool explain", "mpsfleet pool explain default"),
    ("service create", "mpsfleet service create api --pool default --taskdef web:1 --desired 2 --priority 80 --min-healthy-percent 50 --circuit-breaker true --rollback true --wait"),
    ("service update", "mpsfleet service update api --desired 3 --priority 60 --wait --timeout 600"),
    ("service list", "mpsfleet service list"),
    ("service describe", "mpsfleet service describe api"),
    ("service deployments", "mpsfleet service deployments api"),
    ("service endpoints", "mpsfleet service endpoints api"),
    ("service logs", "mpsfleet service logs api --since 10m --timestamps"),
    ("service delete", "mpsfleet service delete api"),
    ("incident list", "mpsfleet incident list -o json"),
    ("incident describe", "mpsfleet incident describe inc-0a1b2c3d4e5f"),
    ("incident acknowledge", "mpsfleet incident acknowledge inc-0a1b2c3d4e5f"),
    ("incident resolve", r#"mpsfleet incident resolve inc-0a1b2c3d4e5f --reason "GPU reseated""#),
    ("drill run", "mpsfleet drill run --pool default --fault daemon-exit --hosts 25% --dry-run"),
    ("drill list", "mpsfleet drill list -o json"),
    ("drill describe", "mpsfleet drill describe drill-0a1b2c3d4e5f"),
    ("drill abort", "mpsfleet drill abort drill-0a1b2c3d4e5f"),
    ("drill switch", "mpsfleet drill switch status"),
    ("secret create", "mpsfleet secret create db-password --from-file ./db-password.txt"),
    ("secret list", "mpsfleet secret list"),
    ("secret delete", "mpsfleet secret delete db-password"),
    ("token create", "mpsfleet token create --role viewer --expires-in 30d --description grafana"),
    ("token list", "mpsfleet token list"),
    ("token revoke", "mpsfleet token revoke tok-3"),
    ("token rotate-admin", "mpsfleet token rotate-admin"),
    ("join-token create", "mpsfleet join-token create --expires-in 1h --description rack-7"),
    ("join-token list", "mpsfleet join-token list"),
    ("join-token revoke", "mpsfleet join-token revoke jt-2"),
    ("audit list", "mpsfleet audit list --limit 20"),
    ("cluster status", "mpsfleet cluster status"),
    ("cluster certificate", "mpsfleet cluster certificate"),
    ("cluster rotate-certificate", "mpsfleet cluster rotate-certificate"),
    ("cluster ca status", "mpsfleet cluster ca status"),
    ("cluster ca rotate", "mpsfleet cluster ca rotate"),
    ("cluster ca activate", "mpsfleet cluster ca activate"),
    ("cluster ca cancel", "mpsfleet cluster ca cancel"),
    ("bench scheduler", "mpsfleet bench scheduler --hosts 10000 --gpus-per-host 8"),
    ("bench recovery", "mpsfleet bench recovery"),
    ("bench ingest", "mpsfleet bench ingest"),
    ("bench submit", "mpsfleet bench submit"),
    ("bench register", "mpsfleet bench register"),
    ("bench start", "mpsfleet bench start"),
    ("bench failover", "mpsfleet bench failover --etcd-endpoints http://127.0.0.1:2379"),
    ("bench takeover", "mpsfleet bench takeover --etcd-endpoints http://127.0.0.1:2379"),
    ("bench metrics", "mpsfleet bench metrics --hosts 20000 --gpus-per-host 8"),
    ("bench console", "mpsfleet bench console --hosts 10000"),
    ("bench scaling", "mpsfleet bench scaling --pending 100000 --hosts 10000"),
    ("bench soak", "mpsfleet bench soak --minutes 20 --seed 1"),
    ("bench traffic", "mpsfleet bench traffic --runs 5 --rate 100"),
    ("sim", "mpsfleet sim --scenario driver-rollout --hosts 30 --duration 1h"),
    ("events", "mpsfleet events --since 10m --kind incident.opened --kind task.stopped"),
    ("console", "mpsfleet console --no-browser"),
    ("completion", "mpsfleet completion bash"),
];

const PREAMBLE: &str = r#"# The mpsfleet command line

Generated from the command tree by `MPSFLEET_WRITE_DOCS=1 cargo test -p mpsfleet --bin mpsfleet
cli_reference`; a test fails when this file and the CLI differ, another parses every example
below with the CLI's own parser, and `crates/mpsfleet/tests/walkthrough.rs` runs them against
a live `mpsfleet up` after the README's first session (which leaves the pool `default`, the
service `web` and the task definitions `web:1` and `infer:1` behind; `t-00000000000000a1` and
`h-5f1c` stand for a task and a host of it). The few it does not run, and why, are listed
there. `mpsfleet COMMAND --help` says the same as this page.

## Conventions

- **Server, token, CA.** Every client command takes `--server`/`MPSFLEET_SERVER` (one address
  or several, `A,B,C`: the CLI finds the leader; an address without a scheme is `https://`),
  `--token`/`MPSFLEET_TOKEN` and `--ca-file`/`MPSFLEET_CA_FILE`; without them the client config
  `~/.config/mpsfleet/config.json` (`up` writes it), else `./.mpsfleet/admin.token` and
  `./.mpsfleet/ca.pem`. These flags may come before or after the command
  (`mpsfleet --token T host list`).
- **Output.** `-o table` (the default) fits the columns to the terminal (cells cut with `…`;
  nothing is cut when the output is not a terminal, unless `COLUMNS` is set); `-o wide` never
  cuts and shows more columns in `task list` and `host list`; `-o json` is the API's JSON
  with an RFC 3339 UTC time added next to every epoch-milliseconds field (`createdAtMs` gets
  `createdAt`); `-o yaml` is the same as YAML. Times in tables and describe views are UTC.
  Text that came from elsewhere (hostnames, reasons, task output) is shown with control
  characters as visible escapes (`\x1b`); JSON and YAML keep it exact, escaped.
- **Output for scripts**, as kubectl's: `-o name` prints `KIND/NAME` per object
  (`task/t-…`); `-o jsonpath=TEMPLATE` prints a template of the API's JSON, a list given as
  `{"items": [...]}` (`-o jsonpath='{.items[*].id}'`,
  `-o jsonpath='{range .items[*]}{.id}{"\t"}{.hostId}{"\n"}{end}'`; paths are RFC 9535
  JSONPath written from `.`, or `$` for the root); `-o custom-columns=ID:.id,HOST:.hostId`
  prints those columns. `--no-headers` leaves tables' header line out; `--sort-by PATH`
  sorts a list by the value at that path of each item (`--sort-by .createdAtMs`); `-l
  key=value` keeps the objects whose tags match (`key!=value`, `key` alone, several
  comma-separated, all must hold; a task's tags are its run's).
- **Watching.** `task list --watch` and `host list --watch` (`-w`) print the list, then each
  object again, as a new row, whenever it changes (kubectl's `get -w`; `task list --all
  --watch` to see tasks stop), from the server's live event stream. `mpsfleet events` prints
  the cluster's events the server keeps (the last hour, at most 10,000; `--since 10m` for
  fewer), oldest first, and ends; `--follow` (`-f`) then goes on as they happen (`--kind` to
  choose, `--limit N` to stop after N, `-o json` for a JSON line each).
- **Logs.** `task logs ID` prints a task's output (`--since 10m`, `--timestamps`, `--tail N`,
  `--follow`); `service logs NAME` prints every replica's, interleaved by time, each line
  prefixed `[task/ID/CONTAINER]` as `kubectl logs -l … --prefix` does, `--follow` picking up
  replicas that start meanwhile.
- **Pools.** `--pool` may be left out of `task run` and `service create` when
  `MPSFLEET_POOL` is set or the server has one pool.
- **Lists** are newest first; `task list` hides STOPPED tasks and `host list` DEREGISTERED
  hosts unless `--all` (or a `--status`); `--limit` and `--skip` page.
- **Waiting.** `--wait` (with `--timeout SECONDS`, default 300) on `task run`, `task stop`,
  `service create`, `service update` and `host drain` prints progress on standard error,
  then a final line saying what was reached (`deployment d-2 of api completed: 3 of 3
  healthy`; `3 of 3 running (no health check)` for tasks without a health check), and exits
  0 when done, 1 when it cannot finish (a task stopped instead of running, a deployment
  failed, a task that can never be placed as the pool is) and 124 at the timeout. A
  service's progress names the stop reasons of its failed tasks, grouped (`2 stopped:
  CannotPullContainerError: …`), and why its waiting tasks wait (`2 waiting: no schedulable
  host in pool default runs containers, which containerDefinitions[0].image … needs`); a task
  nothing will place by itself (no host of the pool runs what it needs, and its provider
  launches none) ends the wait at once with that reason. A scale-down waits until the tasks
  beyond the desired count have STOPPED.
- **Colour.** Logs (`server`, `agent`, `up`) are coloured only when standard error is a
  terminal and `NO_COLOR` is not set: log files never carry escape codes.
- **Shell completion.** `source <(mpsfleet completion bash)` in `~/.bashrc` (also `zsh`;
  fish: `mpsfleet completion fish | source`). The script calls `mpsfleet` back on each TAB
  (clap's dynamic completion: `COMPLETE=SHELL`, also read as `MPSFLEET_COMPLETE`; `source
  <(COMPLETE=bash mpsfleet)` registers it too): commands and flags, and the ids and
  names of live objects (tasks, hosts, incidents, drills, services, pools, task definition
  families) from the server, asked with the credentials of the line being completed (its
  `--server`, `--token`, `--ca-file`, else the environment, else the client config) within
  1.5 s; a server that does not answer leaves flags alone. `--static` prints a script of flags
  and subcommands that never runs `mpsfleet`.
"#;

/// The command paths of the tree's leaves (commands without subcommands), depth first.
pub fn leaves(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    let subs: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| s.get_name() != "help").collect();
    if subs.is_empty() {
        out.push((path.trim().to_string(), cmd.clone()));
    }
    for s in subs {
        leaves(s, &format!("{path} {}", s.get_name()), out);
    }
}

fn example(path: &str) -> Option<&'static str> {
    EXAMPLES.iter().find(|(p, _)| *p == path).map(|(_, e)| *e)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// The whole of docs/cli.md.
pub fn render() -> String {
    let root = crate::Cli::command();
    let mut all = Vec::new();
    leaves(&root, "", &mut all);
    let mut out = String::from(PREAMBLE);
    let mut group = String::new();
    for (path, cmd) in &all {
        let top = path.split(' ').next().unwrap_or_default().to_string();
        if top != group {
            let about = root.find_subcommand(&top).and_then(|c| c.get_about()).map(|a| a.to_string());
            out.push_str(&format!("\n## {top}\n\n{}\n", one_line(&about.unwrap_or_default())));
            group = top;
        }
        out.push_str(&format!("\n### `mpsfleet {path}`\n\n"));
        let about = cmd.get_long_about().or(cmd.get_about()).map(|a| a.to_string()).unwrap_or_default();
        out.push_str(&format!("{}\n\n", about.trim()));
        if let Some(e) = example(path) {
            out.push_str(&format!("```sh\n{e}\n```\n\n"));
        }
        let mut rows = Vec::new();
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            // The client commands' global flags are described once, in the preamble; hidden
            // flags are for tests.
            if id == "help" || id == "version" || a.is_global_set() || a.is_hide_set() {
                continue;
            }
            let name = match (a.get_long(), a.get_short()) {
                (Some(l), Some(s)) => format!("`-{s}`, `--{l}`"),
                (Some(l), None) => format!("`--{l}`"),
                (None, Some(s)) => format!("`-{s}`"),
                (None, None) => format!("`{}`", id.to_uppercase()),
            };
            let help =
                a.get_help().or(a.get_long_help()).map(|h| one_line(&h.to_string())).unwrap_or_default();
            rows.push(format!("| {name} | {help} |"));
        }
        if !rows.is_empty() {
            out.push_str("| Option | What it does |\n|---|---|\n");
            out.push_str(&rows.join("\n"));
            out.push('\n');
        }
    }
    out
}

/// `line` split into words as a shell would: on blanks, with "double quotes" grouping.
pub fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn every_command_has_an_example_the_parser_accepts() {
        let mut all = Vec::new();
        leaves(&crate::Cli::command(), "", &mut all);
        let mut missing = Vec::new();
        for (path, _) in &all {
            match example(path) {
                None => missing.push(path.clone()),
                Some(e) => {
                    let words = shell_words(e);
                    let words: Vec<&str> = words.iter().map(String::as_str).collect();
                    assert_eq!(words[0], "mpsfleet", "{e}");
                    let argv = crate::hoist_global_flags(words.iter().map(Into::into).collect());
                    if let Err(err) = crate::Cli::try_parse_from(argv) {
                        panic!("the example of `{path}` does not parse: {e}\n{err}");
                    }
                    let shown: Vec<&str> = words[1..].iter().take(path.split(' ').count()).copied().collect();
                    assert_eq!(shown.join(" "), *path, "the example of `{path}` runs another command: {e}");
                }
            }
        }
        assert!(missing.is_empty(), "commands without an example:\n{}", missing.join("\n"));
        for (p, _) in EXAMPLES {
            assert!(all.iter().any(|(q, _)| q == p), "an example for no command: {p}");
        }
    }

    #[test]
    fn cli_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");
        let want = render();
        if std::env::var_os("MPSFLEET_WRITE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/cli.md is not what the CLI says; regenerate it: MPSFLEET_WRITE_DOCS=1 cargo test -p mpsfleet --bin mpsfleet cli_reference"
        );
    }
}
