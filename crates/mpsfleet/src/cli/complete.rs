//! Dynamic shell completion: `mpsfleet completion bash|zsh|fish` (or clap's own
//! `COMPLETE=bash mpsfleet`) prints a script that calls `mpsfleet` back on each TAB (clap's
//! completion engine, with `COMPLETE=SHELL` set; `MPSFLEET_COMPLETE` is read too),
//! and the arguments that name objects offer the live ones: task, host, incident and drill
//! ids, service, pool and task definition names, each with a word of what it is. The server is
//! asked with the credentials the command line being completed would use (its `--server`,
//! `--token` and `--ca-file`, the environment, then the client config) and
//! [`ASK_TIMEOUT`] to answer; when it does not, only flags and subcommands are offered.

use super::*;
use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};
use std::future::Future;
use std::time::Duration;

/// The variable the completion scripts set when they call `mpsfleet` back: clap's usual name.
pub const VAR: &str = "COMPLETE";

/// The same, under a name of mpsfleet's own.
pub const OWN_VAR: &str = "MPSFLEET_COMPLETE";

/// How long a TAB waits for the server before it offers flags alone.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(1500);

/// The most ids one TAB offers.
const MOST: usize = 200;

/// The value of `--flag V` or `--flag=V` among the words being completed.
fn flag(words: &[String], name: &str) -> Option<String> {
    let eq = format!("{name}=");
    words.iter().enumerate().find_map(|(i, w)| {
        if w == name {
            words.get(i + 1).cloned()
        } else {
            w.strip_prefix(&eq).map(str::to_string)
        }
    })
}

/// The options of the command line being completed, as clap would have read them.
fn opts() -> Opts {
    // The words follow `--` in `mpsfleet -- mpsfleet task describe …`.
    let words: Vec<String> = std::env::args().skip_while(|a| a != "--").skip(1).collect();
    let given = |name: &str, env: &str| flag(&words, name).or_else(|| std::env::var(env).ok());
    Opts {
        server: given("--server", "MPSFLEET_SERVER"),
        ca_file: given("--ca-file", "MPSFLEET_CA_FILE").map(PathBuf::from),
        token: given("--token", "MPSFLEET_TOKEN"),
        output: Format::Table,
        no_headers: false,
        sort_by: None,
        selector: None,
    }
}

/// Asks the server with `list`, within [`ASK_TIMEOUT`]; nothing when it cannot.
fn ask<F, Fut>(list: F) -> Vec<CompletionCandidate>
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = Result<Vec<CompletionCandidate>>>,
{
    let Ok(c) = client(&opts()) else { return Vec::new() };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return Vec::new();
    };
    match rt.block_on(async { tokio::time::timeout(ASK_TIMEOUT, list(c)).await }) {
        Ok(Ok(mut v)) => {
            v.truncate(MOST);
            v
        }
        _ => Vec::new(),
    }
}

fn candidate(value: impl Into<String>, help: String) -> CompletionCandidate {
    CompletionCandidate::new(value.into()).help(Some(help.into()))
}

/// Task ids, newest first, the STOPPED ones left out.
pub fn tasks() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ask(|c| async move {
            let q = TaskQuery { live: true, newest_first: true, limit: Some(MOST), ..TaskQuery::default() };
            Ok(c.list_tasks(&q)
                .await?
                .into_iter()
                .map(|t| {
                    let what = format!("{} {}", t.last_status.as_str(), t.task_definition);
                    candidate(t.id.to_string(), what)
                })
                .collect())
        })
    })
}

/// Host ids, the DEREGISTERED ones left out.
pub fn hosts() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ask(|c| async move {
            Ok(c.list_hosts(None)
                .await?
                .into_iter()
                .filter(|h| h.status != HostStatus::Deregistered)
                .map(|h| candidate(h.id.to_string(), format!("{} {}", h.hostname, h.status.as_str())))
                .collect())
        })
    })
}

/// Incident ids, newest first.
pub fn incidents() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ask(|c| async move {
            let mut v = c.list_incidents().await?;
            v.sort_by_key(|i| std::cmp::Reverse(i.incident.opened_at_ms));
            Ok(v.into_iter()
                .map(|i| {
                    let inc = i.incident;
                    candidate(inc.id.to_string(), format!("{} host {}", inc.state.as_str(), inc.host_id))
                })
                .collect())
        })
    })
}

/// Drill ids.
pub fn drills() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ask(|c| async move {
            Ok(c.list_drills()
                .await?
                .into_iter()
                .map(|d| candidate(d.id.to_string(), d.pool.to_string()))
                .collect())
        })
    })
}

/// Service names.
pub fn services() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ask(|c| async move {
            Ok(c.list_services()
                .await?
                .into_iter()
                .map(|s| candidate(s.service.name.to_string(), format!("pool {}", s.service.pool)))
                .collect())
        })
    })
}

/// Pool names.
pub fn pools() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ask(|c| async move {
            Ok(c.list_pools()
                .await?
                .into_iter()
                .map(|p| candidate(p.name.to_string(), p.mode.as_str().into()))
                .collect())
        })
    })
}

/// Task definition families (their latest revision) .
pub fn taskdefs() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        ask(|c| async move {
            let mut seen = std::collections::BTreeSet::new();
            Ok(c.list_taskdefs(None)
                .await?
                .into_iter()
                .filter(|d| seen.insert(d.family.clone()))
                .map(|d| candidate(d.family.clone(), format!("latest revision {}", d.revision)))
                .collect())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::flag;

    #[test]
    fn flags_are_read_from_the_words_being_completed() {
        let words: Vec<String> = ["mpsfleet", "task", "describe", "--server=https://a:1", "--token", "T", ""]
            .map(String::from)
            .into();
        assert_eq!(flag(&words, "--server").as_deref(), Some("https://a:1"));
        assert_eq!(flag(&words, "--token").as_deref(), Some("T"));
        assert_eq!(flag(&words, "--ca-file"), None);
    }
}
