//! A recorded history of client operations against the control plane, and the checker that
//! decides whether it is one the API's promises allow (docs/ha.md "What the nemesis checks").
//!
//! Each operation is recorded with its invocation and completion times (milliseconds on the
//! test's clock), its outcome, and the `mpsfleet-fence` and `mpsfleet-revision` headers of its
//! answer. An outcome is `Ok`, `Failed` (the server answered a refusal: nothing happened), or
//! `Unknown` (no answer, a timeout, a 5xx: it may or may not have happened). The promises:
//!
//! - **Exactly once per client token**: every acknowledged RunTask of a token names the same
//!   task, that task exists, and no token ever has more than one task (acknowledged or not).
//! - **Reads never go back**: a read invoked after another read completed (any client) shows a
//!   revision at least as new (`mpsfleet-revision`). Per client this is monotonic reads; across
//!   clients it is the real-time order of linearizable reads of the whole state.
//! - **Leaderships never go back**: an answer invoked after another answer completed carries a
//!   fence at least as new: a deposed leader acknowledges nothing once its successor has.
//! - **GPU memory is never over-committed**: in every read, the MPS memory of the tasks not
//!   STOPPED on each GPU fits the GPU.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Run {
        token: String,
    },
    Stop {
        task: String,
    },
    Scale {
        desired: u32,
    },
    /// `host drain` (moves its tasks off: an operator's incident) and `host activate`.
    Drain {
        host: String,
    },
    Activate {
        host: String,
    },
    /// Every task not STOPPED.
    Read,
    /// Every task (the settled state at the end).
    ReadAll,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ok,
    Failed(String),
    Unknown(String),
}

/// What a read showed of one task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSeen {
    pub id: String,
    pub started_by: String,
    pub stopped: bool,
    pub gpus: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub client: usize,
    pub server: String,
    pub op: Op,
    pub invoked_ms: f64,
    pub completed_ms: f64,
    pub outcome: Outcome,
    pub fence: Option<i64>,
    pub revision: Option<u64>,
    /// RunTask: the tasks the answer named.
    pub tasks: Vec<String>,
    /// Read: what it showed.
    pub seen: Vec<TaskSeen>,
}

impl Entry {
    pub fn new(client: usize, server: &str, op: Op, invoked_ms: f64) -> Entry {
        Entry {
            client,
            server: server.to_owned(),
            op,
            invoked_ms,
            completed_ms: invoked_ms,
            outcome: Outcome::Unknown("not completed".into()),
            fence: None,
            revision: None,
            tasks: Vec::new(),
            seen: Vec::new(),
        }
    }

    fn ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }
}

/// What the checker found: each broken promise with the entries that show it.
#[derive(Debug, Default)]
pub struct Verdict {
    pub operations: usize,
    pub acknowledged: usize,
    pub unknown: usize,
    pub violations: Vec<String>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks `history` and the state read after the faults stopped (`last`: every task).
/// `per_gpu` is how many tasks fit on one GPU (the one task definition's memory).
pub fn check(history: &[Entry], last: &[TaskSeen], per_gpu: usize) -> Verdict {
    let mut v = Verdict {
        operations: history.len(),
        acknowledged: history.iter().filter(|e| e.ok()).count(),
        unknown: history.iter().filter(|e| matches!(e.outcome, Outcome::Unknown(_))).count(),
        violations: Vec::new(),
    };
    exactly_once(history, last, &mut v.violations);
    never_back(history, "revision", |e| e.revision.map(|r| r as i64), &mut v.violations);
    never_back(history, "fence", |e| e.fence, &mut v.violations);
    for e in history.iter().filter(|e| e.ok() && matches!(e.op, Op::Read | Op::ReadAll)) {
        over_committed(
            &e.seen,
            per_gpu,
            &format!("read by client {} at {:.0} ms", e.client, e.completed_ms),
            &mut v.violations,
        );
    }
    over_committed(last, per_gpu, "the final read", &mut v.violations);
    v
}

fn exactly_once(history: &[Entry], last: &[TaskSeen], out: &mut Vec<String>) {
    let mut acked: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut issued: BTreeSet<&str> = BTreeSet::new();
    for e in history {
        if let Op::Run { token } = &e.op {
            issued.insert(token);
            if e.ok() {
                acked.entry(token).or_default().extend(e.tasks.iter().map(String::as_str));
            }
        }
    }
    let mut kept: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for t in last.iter().filter(|t| issued.contains(t.started_by.as_str())) {
        kept.entry(&t.started_by).or_default().push(&t.id);
    }
    for (token, ids) in &kept {
        if ids.len() > 1 {
            out.push(format!("client token {token} has {} tasks: {ids:?}", ids.len()));
        }
    }
    for (token, ids) in &acked {
        if ids.len() != 1 {
            out.push(format!("client token {token} was acknowledged as different tasks: {ids:?}"));
        }
        let have = kept.get(token).cloned().unwrap_or_default();
        for id in ids {
            if !have.contains(id) {
                out.push(format!(
                    "task {id} of client token {token} was acknowledged and is gone (kept: {have:?})"
                ));
            }
        }
    }
}

/// For every pair of acknowledged answers a, b with a completed before b was invoked:
/// `value(b) >= value(a)`. A sweep in invocation order over completions.
fn never_back(history: &[Entry], what: &str, value: impl Fn(&Entry) -> Option<i64>, out: &mut Vec<String>) {
    let mut done: Vec<(&Entry, i64)> =
        history.iter().filter(|e| e.ok()).filter_map(|e| value(e).map(|x| (e, x))).collect();
    let mut invoked = done.clone();
    done.sort_by(|a, b| a.0.completed_ms.total_cmp(&b.0.completed_ms));
    invoked.sort_by(|a, b| a.0.invoked_ms.total_cmp(&b.0.invoked_ms));
    let (mut i, mut best): (usize, Option<(&Entry, i64)>) = (0, None);
    let mut reported = 0;
    for (e, x) in invoked {
        while i < done.len() && done[i].0.completed_ms < e.invoked_ms {
            if best.is_none_or(|(_, b)| done[i].1 > b) {
                best = Some(done[i]);
            }
            i += 1;
        }
        if let Some((before, b)) = best.filter(|(_, b)| x < *b) {
            reported += 1;
            if reported <= 10 {
                out.push(format!(
                    "{what} went back: {:?} by client {} at {} answered {what} {x} ({:.0}-{:.0} ms), after {:?} by client {} at {} answered {b} (completed {:.0} ms)",
                    e.op, e.client, e.server, e.invoked_ms, e.completed_ms, before.op, before.client, before.server, before.completed_ms
                ));
            }
        }
    }
    if reported > 10 {
        out.push(format!("{what} went back {} more times", reported - 10));
    }
}

fn over_committed(seen: &[TaskSeen], per_gpu: usize, at: &str, out: &mut Vec<String>) {
    let mut on: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for t in seen.iter().filter(|t| !t.stopped) {
        for g in &t.gpus {
            on.entry(g).or_default().push(&t.id);
        }
    }
    for (gpu, ids) in on {
        if ids.len() > per_gpu {
            out.push(format!("{at}: GPU {gpu} holds {} tasks, room for {per_gpu}: {ids:?}", ids.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(client: usize, op: Op, at: (f64, f64), fence: i64, revision: u64) -> Entry {
        Entry {
            completed_ms: at.1,
            outcome: Outcome::Ok,
            fence: Some(fence),
            revision: Some(revision),
            ..Entry::new(client, "s", op, at.0)
        }
    }

    fn seen(id: &str, by: &str, gpus: &[&str]) -> TaskSeen {
        TaskSeen {
            id: id.into(),
            started_by: by.into(),
            stopped: false,
            gpus: gpus.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn a_history_that_keeps_every_promise_passes() {
        let mut run = e(0, Op::Run { token: "a".into() }, (0.0, 5.0), 7, 3);
        run.tasks = vec!["t1".into()];
        let mut read = e(1, Op::Read, (6.0, 8.0), 7, 3);
        read.seen = vec![seen("t1", "a", &["g0"])];
        // Answers that overlap may come in either order: this one started before `read` ended.
        let overlapping = e(0, Op::Read, (7.0, 9.0), 9, 4);
        let early = e(2, Op::Read, (5.5, 10.0), 7, 3);
        let v = check(&[run, read, overlapping, early], &[seen("t1", "a", &["g0"])], 1);
        assert!(v.ok(), "{:?}", v.violations);
        assert_eq!((v.operations, v.acknowledged), (4, 4));
    }

    #[test]
    fn each_broken_promise_is_found() {
        // A deposed leader (fence 5) acknowledges after its successor (fence 9) did.
        let new = e(0, Op::Read, (0.0, 1.0), 9, 10);
        let old = e(1, Op::Run { token: "b".into() }, (2.0, 3.0), 5, 11);
        let v = check(&[new.clone(), old], &[], 1);
        assert!(v.violations.iter().any(|x| x.starts_with("fence went back")), "{:?}", v.violations);
        // A read older than one completed before it.
        let stale = e(1, Op::Read, (2.0, 3.0), 9, 8);
        let v = check(&[new, stale], &[], 1);
        assert!(v.violations.iter().any(|x| x.starts_with("revision went back")), "{:?}", v.violations);
        // Two tasks for one token; an acknowledged task gone; a GPU holding too many.
        let mut run = e(0, Op::Run { token: "c".into() }, (0.0, 1.0), 1, 1);
        run.tasks = vec!["t9".into()];
        let last = [seen("t1", "c", &["g0"]), seen("t2", "c", &["g0"])];
        let v = check(&[run], &last, 1);
        let all = v.violations.join("\n");
        assert!(all.contains("has 2 tasks") && all.contains("t9") && all.contains("GPU g0 holds 2"), "{all}");
    }
}
