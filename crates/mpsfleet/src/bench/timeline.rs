//! The steps of one recovery, read back from the `timeline` lines (`mpsfleet_core::timeline!`)
//! that the server and the agents log when `MPSFLEET_LOG` turns the target on: from the first
//! kill to the last copy RUNNING, each step's start and end on the wall clock (one machine, so
//! one clock), along the path of the copy that ran last.

use std::collections::BTreeMap;
use std::path::Path;

/// One `timeline` line: its step, its fields, its wall time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub step: String,
    pub fields: BTreeMap<String, String>,
    pub at_us: u64,
}

impl Line {
    fn field(&self, k: &str) -> Option<&str> {
        self.fields.get(k).map(String::as_str)
    }
}

/// The `timeline` lines of a log, in their order; other lines are skipped.
pub fn parse(log: &str) -> Vec<Line> {
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find(" timeline: ")? + " timeline: ".len()..];
            let mut words = rest.split_whitespace();
            let step = words.next()?.to_string();
            let fields: BTreeMap<String, String> = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let at_us = fields.get("at_us")?.parse().ok()?;
            Some(Line { step, fields, at_us })
        })
        .collect()
}

/// The lines of a file (none when it cannot be read).
pub fn read(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path).map(|s| parse(&s)).unwrap_or_default()
}

fn after(lines: &[Line], from_us: u64) -> impl Iterator<Item = &Line> {
    lines.iter().filter(move |x| x.at_us >= from_us)
}

/// One named step of a recovery and how long it took, in ms.
pub type Steps = Vec<(String, f64)>;

/// What a trial's logs say: the failed daemon's host (`agent`), the server's, every agent's
/// (for the copies' starts), from `killed_us`; `copies`, the tasks started for the replicas
/// on the failed daemon, of which the one RUNNING last is followed; `gpu`, the failed GPU.
pub struct Logs<'a> {
    pub agent: &'a [Line],
    pub server: &'a [Line],
    pub agents: &'a [Line],
    pub gpu: &'a str,
    pub killed_us: u64,
    pub seen_running_us: u64,
}

/// The steps, in order, from the first kill to every replica RUNNING as the API shows it:
/// the exit seen; each local restart and the policy's wait before it, until the check the
/// server acts on (the failure confirmed, or the first exit where copies start then); that
/// check reported; the copies decided; placed; the start sent to and received by the agent;
/// the process or container started; RUNNING reported and received; and seen through the API.
/// Err names the line that is missing.
pub fn steps(l: &Logs<'_>) -> Result<Steps, String> {
    let missing = |what: &str| format!("no '{what}' line in the logs");
    let ms = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1000.0;
    let mut out: Steps = Vec::new();
    let on_gpu = |x: &&Line| x.field("gpu") == Some(l.gpu);
    // The server's word that the daemon failed: what the copies follow from.
    let failed = after(l.server, l.killed_us)
        .find(|x| x.step == "daemon-failed" && x.field("gpu") == Some(l.gpu))
        .ok_or_else(|| missing("daemon-failed"))?;
    let daemon: Vec<&Line> =
        after(l.agent, l.killed_us).filter(on_gpu).filter(|x| x.at_us <= failed.at_us).collect();
    let exited = daemon.iter().find(|x| x.step == "daemon-exited").ok_or_else(|| missing("daemon-exited"))?;
    out.push(("exit seen by the agent".into(), ms(l.killed_us, exited.at_us)));
    // The check the server acted on: the failure confirmed (IMPAIRED), or where copies start
    // at the first exit, the first check that says the daemon is failing.
    let check = |f: &dyn Fn(&Line) -> bool| daemon.iter().copied().find(|x| x.step == "check" && f(x));
    let acted = check(&|x| x.field("status") == Some("IMPAIRED"))
        .or_else(|| check(&|x| x.field("failing") == Some("true")))
        .ok_or_else(|| missing("check"))?;
    let mut at = exited.at_us;
    let mut n = 0;
    for x in daemon.iter().filter(|x| x.at_us <= acted.at_us) {
        match x.step.as_str() {
            "daemon-restart" => {
                n += 1;
                out.push((format!("wait before restart {n}"), ms(at, x.at_us)));
                at = x.at_us;
            }
            "daemon-started" => {
                out.push((format!("restart {n}"), ms(at, x.at_us)));
                at = x.at_us;
            }
            "daemon-exited" if x.at_us > exited.at_us => {
                out.push((format!("exit {} seen", n + 1), ms(at, x.at_us)));
                at = x.at_us;
            }
            _ => {}
        }
    }
    let what = if acted.field("status") == Some("IMPAIRED") {
        "failure confirmed"
    } else {
        "first failure published"
    };
    out.push((what.into(), ms(at, acted.at_us)));
    out.push(("reported to the server".into(), ms(acted.at_us, failed.at_us)));
    // The copy that the server saw RUNNING last, of those RUNNING when the benchmark saw every
    // replica run (later starts are the incident's own moves).
    let copies: Vec<&Line> = after(l.server, failed.at_us).filter(|x| x.step == "replica-started").collect();
    let running = |task: &str| {
        after(l.server, failed.at_us).find(|x| x.step == "running-received" && x.field("task") == Some(task))
    };
    let last = copies
        .iter()
        .filter_map(|c| Some((*c, running(c.field("task")?)?)))
        .filter(|(_, r)| r.at_us <= l.seen_running_us)
        .max_by_key(|(_, r)| r.at_us)
        .ok_or_else(|| missing("running-received of a copy"))?;
    let (decided, received_running) = last;
    let task = decided.field("task").unwrap_or_default();
    out.push(("copies decided".into(), ms(failed.at_us, decided.at_us)));
    let placed = if decided.field("placed") == Some("true") {
        decided
    } else {
        after(l.server, decided.at_us)
            .find(|x| x.step == "placed" && x.field("task") == Some(task))
            .ok_or_else(|| missing("placed"))?
    };
    out.push(("placed".into(), ms(decided.at_us, placed.at_us)));
    let received = after(l.agents, placed.at_us)
        .find(|x| x.step == "start-received" && x.field("task") == Some(task))
        .ok_or_else(|| missing("start-received"))?;
    let sent =
        after(l.server, placed.at_us).find(|x| x.step == "assignments-sent" && x.at_us <= received.at_us);
    match sent {
        Some(s) => {
            out.push(("start sent to the agent".into(), ms(placed.at_us, s.at_us)));
            out.push(("start received by the agent".into(), ms(s.at_us, received.at_us)));
        }
        None => out.push(("start received by the agent".into(), ms(placed.at_us, received.at_us))),
    }
    // The start on the agent, as far as its lines tell it: the fail-closed daemon check, then
    // a container's image, create and start, then the task RUNNING there.
    let parts = [
        ("daemon-checked", "MPS daemon checked"),
        ("image-ready", "image ready"),
        ("container-created", "container created"),
        ("container-started", "container started"),
        ("task-started", "started"),
    ];
    let mut at = received.at_us;
    for (step, name) in parts {
        if let Some(x) = after(l.agents, at).find(|x| x.step == step && x.field("task") == Some(task)) {
            out.push((name.into(), ms(at, x.at_us)));
            at = x.at_us;
        } else if step == "task-started" {
            return Err(missing(step));
        }
    }
    out.push(("RUNNING reported".into(), ms(at, received_running.at_us)));
    out.push(("RUNNING seen through the API".into(), ms(received_running.at_us, l.seen_running_us)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at_us: u64, step: &str, fields: &str) -> String {
        format!("2026-12-06T20:00:00.000000Z DEBUG timeline: {step} {fields} at_us={at_us}")
    }

    /// A first-exit recovery as the logs tell it: each step is the time between its line and
    /// the one before, along the copy that ran last; a missing line is named, not guessed.
    #[test]
    fn the_steps_follow_the_copy_that_ran_last() {
        let agent = [
            line(1_010, "daemon-exited", "gpu=G0"),
            line(1_020, "daemon-restart", "gpu=G0"),
            line(1_030, "check", "gpu=G0 status=OK failing=true"),
            line(1_050, "daemon-started", "gpu=G0"),
            "2026-12-06T20:00:00.000000Z  INFO mpsfleet_agent: something else".to_string(),
        ]
        .join("\n");
        let server = [
            line(1_100, "daemon-failed", "host=h-1 gpu=G0"),
            line(1_200, "replica-started", "task=t-1 placed=true"),
            line(1_210, "replica-started", "task=t-2 placed=false"),
            line(1_300, "placed", "task=t-2"),
            line(1_400, "assignments-sent", "host=h-2 revision=9"),
            line(2_000, "running-received", "task=t-1"),
            line(3_000, "running-received", "task=t-2"),
            line(3_200, "replica-started", "task=t-3 placed=true"),
            line(4_000, "running-received", "task=t-3"),
        ]
        .join("\n");
        let agents = [
            line(1_500, "start-received", "task=t-2"),
            line(1_600, "daemon-checked", "task=t-2"),
            line(2_500, "task-started", "task=t-2"),
        ]
        .join("\n");
        let (agent, server, agents) = (parse(&agent), parse(&server), parse(&agents));
        assert_eq!(agent.len(), 4, "the other line is skipped");
        let logs = Logs {
            agent: &agent,
            server: &server,
            agents: &agents,
            gpu: "G0",
            killed_us: 1_000,
            seen_running_us: 3_500,
        };
        let got = steps(&logs).unwrap();
        let want: Vec<(&str, f64)> = vec![
            ("exit seen by the agent", 0.01),
            ("wait before restart 1", 0.01),
            ("first failure published", 0.01),
            ("reported to the server", 0.07),
            ("copies decided", 0.11),
            ("placed", 0.09),
            ("start sent to the agent", 0.1),
            ("start received by the agent", 0.1),
            ("MPS daemon checked", 0.1),
            ("started", 0.9),
            ("RUNNING reported", 0.5),
            ("RUNNING seen through the API", 0.5),
        ];
        let got: Vec<(&str, f64)> =
            got.iter().map(|(n, ms)| (n.as_str(), (ms * 1000.0).round() / 1000.0)).collect();
        assert_eq!(got, want);
        let without: Vec<Line> = agents.iter().filter(|l| l.step != "task-started").cloned().collect();
        let err = steps(&Logs { agents: &without, ..logs }).unwrap_err();
        assert!(err.contains("task-started"), "{err}");
    }
}
