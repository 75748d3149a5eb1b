//! A recorded history of client operations against the control plane, and the checker that
//! decides it against a model of what the API promises (docs/ha.md "What the nemesis checks"),
//! as Jepsen's and etcd's robustness checkers do.
//!
//! Each operation is recorded with its invocation and completion times (milliseconds on the
//! test's clock), its outcome, and the `mpsfleet-fence` and `mpsfleet-revision` headers of its
//! answer. An outcome is `Ok`, `Failed` (the server answered a refusal: nothing happened), or
//! `Unknown` (no answer, a timeout, a 5xx: it may have happened, at any time after it was
//! invoked). The promises, each a rule below:
//!
//! - **Every answer says who gave it**: an acknowledged answer carries both headers.
//! - **Exactly once per client token**: every acknowledged RunTask of a token names the same
//!   task, that task exists, and no token ever has more than one task (acknowledged or not).
//! - **Reads are linearizable**: a read contains (in any status) every task whose RunTask was
//!   acknowledged before the read was invoked, and none whose RunTask was first invoked after
//!   the read completed; a task whose StopTask was acknowledged before the read was invoked is
//!   desired STOPPED in it; a service's desired count, and a host's status (drain and
//!   activate), is the value of a write not superseded before the read was invoked (the last
//!   acknowledged one, one that overlaps it, or one whose outcome is unknown).
//! - **Reads never go back**: a read invoked after another read completed (any client) shows a
//!   revision at least as new (`mpsfleet-revision`).
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
    /// Every task, in any status.
    Read,
    /// The service `steady`: its desired count.
    ReadService,
    /// The host: its status.
    ReadHost {
        host: String,
    },
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskSeen {
    pub id: String,
    pub started_by: String,
    pub stopped: bool,
    pub desired_stopped: bool,
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
    /// ReadService: the desired count; ReadHost: the status.
    pub value: Option<String>,
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
            value: None,
        }
    }

    fn ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    fn reads_tasks(&self) -> bool {
        self.ok() && matches!(self.op, Op::Read | Op::ReadAll)
    }

    fn what(&self) -> String {
        format!(
            "{:?} by client {} at {} ({:.0}-{:.0} ms)",
            self.op, self.client, self.server, self.invoked_ms, self.completed_ms
        )
    }
}

/// The initial values of the registers the history writes: the service's desired count and
/// the host's status before any client wrote them.
pub const INITIAL_DESIRED: &str = "1";
pub const INITIAL_HOST_STATUS: &str = "ACTIVE";

/// What the checker found: each broken promise with the entries that show it.
#[derive(Debug, Default)]
pub struct Verdict {
    pub operations: usize,
    pub acknowledged: usize,
    pub unknown: usize,
    /// Acknowledged reads judged against the model, by what they read.
    pub reads_judged: BTreeMap<&'static str, usize>,
    pub violations: Vec<String>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Violations of one rule: the first ten in full, then a count.
struct Found<'a> {
    out: &'a mut Vec<String>,
    n: usize,
    rule: &'static str,
}

impl<'a> Found<'a> {
    fn new(out: &'a mut Vec<String>, rule: &'static str) -> Found<'a> {
        Found { out, n: 0, rule }
    }
    fn push(&mut self, what: String) {
        self.n += 1;
        if self.n <= 10 {
            self.out.push(what);
        }
    }
}

impl Drop for Found<'_> {
    fn drop(&mut self) {
        if self.n > 10 {
            self.out.push(format!("{}: {} more", self.rule, self.n - 10));
        }
    }
}

/// Checks `history` and the state read after the faults stopped (`last`: every task).
/// `per_gpu` is how many tasks fit on one GPU (the one task definition's memory).
pub fn check(history: &[Entry], last: &[TaskSeen], per_gpu: usize) -> Verdict {
    let mut v = Verdict {
        operations: history.len(),
        acknowledged: history.iter().filter(|e| e.ok()).count(),
        unknown: history.iter().filter(|e| matches!(e.outcome, Outcome::Unknown(_))).count(),
        ..Verdict::default()
    };
    v.reads_judged.insert("tasks", history.iter().filter(|e| e.reads_tasks()).count());
    v.reads_judged.insert("service", history.iter().filter(|e| e.ok() && e.op == Op::ReadService).count());
    v.reads_judged
        .insert("host", history.iter().filter(|e| e.ok() && matches!(e.op, Op::ReadHost { .. })).count());
    let out = &mut v.violations;
    headers(history, out);
    exactly_once(history, last, out);
    reads_see_runs(history, out);
    reads_see_stops(history, out);
    registers(history, out);
    never_back(history, "revision", |e| e.revision.map(|r| r as i64), out);
    never_back(history, "fence", |e| e.fence, out);
    for e in history.iter().filter(|e| e.reads_tasks()) {
        over_committed(
            &e.seen,
            per_gpu,
            &format!("read by client {} at {:.0} ms", e.client, e.completed_ms),
            out,
        );
    }
    over_committed(last, per_gpu, "the final read", out);
    v
}

/// An acknowledged answer without its fence or revision header: the rules that read them
/// would pass on nothing.
fn headers(history: &[Entry], out: &mut Vec<String>) {
    let mut found = Found::new(out, "answers without their headers");
    for e in history.iter().filter(|e| e.ok()) {
        if e.fence.is_none() || e.revision.is_none() {
            found.push(format!(
                "an answer without its {} header: {}",
                if e.fence.is_none() { "mpsfleet-fence" } else { "mpsfleet-revision" },
                e.what()
            ));
        }
    }
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

/// A read contains every task whose RunTask was acknowledged before it was invoked, and none
/// whose token's first RunTask was invoked after it completed.
fn reads_see_runs(history: &[Entry], out: &mut Vec<String>) {
    let mut first_invoked: BTreeMap<&str, f64> = BTreeMap::new();
    for e in history {
        if let Op::Run { token } = &e.op {
            let at = first_invoked.entry(token).or_insert(e.invoked_ms);
            *at = at.min(e.invoked_ms);
        }
    }
    let runs: Vec<&Entry> = history.iter().filter(|e| e.ok() && matches!(e.op, Op::Run { .. })).collect();
    let mut missing = Found::new(out, "reads missing acknowledged tasks");
    for r in history.iter().filter(|e| e.reads_tasks()) {
        let ids: BTreeSet<&str> = r.seen.iter().map(|t| t.id.as_str()).collect();
        for a in runs.iter().filter(|a| a.completed_ms < r.invoked_ms) {
            for id in a.tasks.iter().filter(|id| !ids.contains(id.as_str())) {
                missing.push(format!(
                    "{} lacks task {id}, whose RunTask was acknowledged before it: {}",
                    r.what(),
                    a.what()
                ));
            }
        }
    }
    drop(missing);
    let mut future = Found::new(out, "reads showing tasks from their future");
    for r in history.iter().filter(|e| e.reads_tasks()) {
        for t in &r.seen {
            if let Some(&at) = first_invoked.get(t.started_by.as_str()) {
                if at > r.completed_ms {
                    future.push(format!(
                        "{} shows task {} of client token {}, whose first RunTask was invoked after it completed, at {at:.0} ms",
                        r.what(),
                        t.id,
                        t.started_by
                    ));
                }
            }
        }
    }
}

/// A task whose StopTask was acknowledged before a read was invoked is desired STOPPED in it.
fn reads_see_stops(history: &[Entry], out: &mut Vec<String>) {
    let stops: Vec<(&Entry, &str)> = history
        .iter()
        .filter(|e| e.ok())
        .filter_map(|e| match &e.op {
            Op::Stop { task } => Some((e, task.as_str())),
            _ => None,
        })
        .collect();
    let mut found = Found::new(out, "reads missing acknowledged stops");
    for r in history.iter().filter(|e| e.reads_tasks()) {
        let by_id: BTreeMap<&str, &TaskSeen> = r.seen.iter().map(|t| (t.id.as_str(), t)).collect();
        for (s, id) in stops.iter().filter(|(s, _)| s.completed_ms < r.invoked_ms) {
            if let Some(t) = by_id.get(id).filter(|t| !t.desired_stopped) {
                found.push(format!(
                    "{} shows task {id} desired {}, whose StopTask was acknowledged before it: {}",
                    r.what(),
                    if t.stopped { "RUNNING (though stopped)" } else { "RUNNING" },
                    s.what()
                ));
            }
        }
    }
}

/// The registers: the service's desired count and the host's status. Each read's value must
/// be one that some write, not superseded before the read was invoked, wrote (or the initial
/// one, while no write was acknowledged before the read). A write is superseded when another
/// acknowledged write was invoked after it completed and completed before the read was
/// invoked; a write whose outcome is unknown may land at any time after its invocation and is
/// never superseded.
fn registers(history: &[Entry], out: &mut Vec<String>) {
    let desired = |e: &Entry| match &e.op {
        Op::Scale { desired } => Some(desired.to_string()),
        _ => None,
    };
    let status = |e: &Entry| match &e.op {
        Op::Drain { .. } => Some("DRAINING".to_owned()),
        Op::Activate { .. } => Some("ACTIVE".to_owned()),
        _ => None,
    };
    register(history, "service desired count", INITIAL_DESIRED, desired, |e| e.op == Op::ReadService, out);
    register(
        history,
        "host status",
        INITIAL_HOST_STATUS,
        status,
        |e| matches!(e.op, Op::ReadHost { .. }),
        out,
    );
}

fn register(
    history: &[Entry],
    what: &'static str,
    initial: &str,
    written: impl Fn(&Entry) -> Option<String>,
    is_read: impl Fn(&Entry) -> bool,
    out: &mut Vec<String>,
) {
    let writes: Vec<(&Entry, String)> = history
        .iter()
        .filter(|e| !matches!(e.outcome, Outcome::Failed(_)))
        .filter_map(|e| written(e).map(|v| (e, v)))
        .collect();
    let mut found = Found::new(out, what);
    for r in history.iter().filter(|e| e.ok() && is_read(e)) {
        let Some(value) = &r.value else {
            found.push(format!("{} answered no {what}", r.what()));
            continue;
        };
        let acked_before = |e: &Entry| e.ok() && e.completed_ms < r.invoked_ms;
        let superseded = |w: &Entry| {
            w.ok() && writes.iter().any(|(w2, _)| acked_before(w2) && w2.invoked_ms > w.completed_ms)
        };
        let mut possible: BTreeSet<&str> = writes
            .iter()
            .filter(|(w, _)| w.invoked_ms < r.completed_ms && !superseded(w))
            .map(|(_, v)| v.as_str())
            .collect();
        if !writes.iter().any(|(w, _)| acked_before(w)) {
            possible.insert(initial);
        }
        if !possible.contains(value.as_str()) {
            let last = writes
                .iter()
                .filter(|(w, _)| acked_before(w))
                .max_by(|a, b| a.0.completed_ms.total_cmp(&b.0.completed_ms));
            found.push(format!(
                "{} shows {what} {value}, not one a write not superseded before it wrote ({possible:?}); the last acknowledged before it: {}",
                r.what(),
                last.map_or_else(|| "none".to_owned(), |(w, v)| format!("{v} by {}", w.what()))
            ));
        }
    }
}

/// For every pair of acknowledged answers a, b with a completed before b was invoked:
/// `value(b) >= value(a)`. A sweep in invocation order over completions.
fn never_back(
    history: &[Entry],
    what: &'static str,
    value: impl Fn(&Entry) -> Option<i64>,
    out: &mut Vec<String>,
) {
    let mut done: Vec<(&Entry, i64)> =
        history.iter().filter(|e| e.ok()).filter_map(|e| value(e).map(|x| (e, x))).collect();
    let mut invoked = done.clone();
    done.sort_by(|a, b| a.0.completed_ms.total_cmp(&b.0.completed_ms));
    invoked.sort_by(|a, b| a.0.invoked_ms.total_cmp(&b.0.invoked_ms));
    let (mut i, mut best): (usize, Option<(&Entry, i64)>) = (0, None);
    let mut found = Found::new(out, what);
    for (e, x) in invoked {
        while i < done.len() && done[i].0.completed_ms < e.invoked_ms {
            if best.is_none_or(|(_, b)| done[i].1 > b) {
                best = Some(done[i]);
            }
            i += 1;
        }
        if let Some((before, b)) = best.filter(|(_, b)| x < *b) {
            found.push(format!(
                "{what} went back: {} answered {what} {x}, after {} answered {b}",
                e.what(),
                before.what()
            ));
        }
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
            gpus: gpus.iter().map(|g| g.to_string()).collect(),
            ..TaskSeen::default()
        }
    }

    fn read(at: (f64, f64), revision: u64, tasks: Vec<TaskSeen>) -> Entry {
        Entry { seen: tasks, ..e(9, Op::Read, at, 7, revision) }
    }

    fn value(op: Op, at: (f64, f64), v: &str) -> Entry {
        Entry { value: Some(v.into()), ..e(8, op, at, 7, 5) }
    }

    fn found(v: &Verdict, what: &str) -> bool {
        v.violations.iter().any(|x| x.contains(what))
    }

    #[test]
    fn a_history_that_keeps_every_promise_passes() {
        let mut run = e(0, Op::Run { token: "a".into() }, (0.0, 5.0), 7, 3);
        run.tasks = vec!["t1".into()];
        let stop = e(0, Op::Stop { task: "t1".into() }, (5.0, 5.5), 7, 3);
        let stopping = TaskSeen { desired_stopped: true, ..seen("t1", "a", &["g0"]) };
        let after = read((6.0, 8.0), 3, vec![stopping.clone()]);
        // Answers that overlap may come in either order: this one started before `after` ended.
        let overlapping = read((7.0, 9.0), 4, vec![stopping.clone()]);
        let early = read((5.5, 10.0), 3, vec![stopping.clone()]);
        // A write that overlaps the read may or may not show; one whose outcome is unknown may
        // land at any time after it was invoked.
        let scale = e(1, Op::Scale { desired: 2 }, (1.0, 2.0), 7, 3);
        let lost = Entry {
            outcome: Outcome::Unknown("timeout".into()),
            ..e(1, Op::Scale { desired: 0 }, (2.5, 7.0), 7, 3)
        };
        let shows_unknown = value(Op::ReadService, (9.0, 9.5), "0");
        let shows_acked = value(Op::ReadService, (9.0, 9.5), "2");
        let drain = e(2, Op::Drain { host: "h".into() }, (3.0, 4.0), 7, 3);
        let during = value(Op::ReadHost { host: "h".into() }, (3.5, 3.6), "ACTIVE");
        let drained = value(Op::ReadHost { host: "h".into() }, (4.5, 4.6), "DRAINING");
        let mut history = [
            run,
            stop,
            after,
            overlapping,
            early,
            scale,
            lost,
            shows_unknown,
            shows_acked,
            drain,
            during,
            drained,
        ];
        // Revisions that move with time, as a leader's do.
        for e in &mut history {
            e.revision = Some(e.invoked_ms as u64);
        }
        let v = check(&history, &[stopping], 1);
        assert!(v.ok(), "{:?}", v.violations);
        assert_eq!((v.operations, v.acknowledged, v.unknown), (12, 11, 1));
        assert_eq!(v.reads_judged.values().sum::<usize>(), 7, "{:?}", v.reads_judged);
    }

    #[test]
    fn each_broken_promise_is_found() {
        // A deposed leader (fence 5) acknowledges after its successor (fence 9) did.
        let new = e(0, Op::Read, (0.0, 1.0), 9, 10);
        let old = e(1, Op::Run { token: "b".into() }, (2.0, 3.0), 5, 11);
        let v = check(&[new.clone(), old], &[], 1);
        assert!(found(&v, "fence went back"), "{:?}", v.violations);
        // A read older than one completed before it.
        let stale = e(1, Op::Read, (2.0, 3.0), 9, 8);
        let v = check(&[new, stale], &[], 1);
        assert!(found(&v, "revision went back"), "{:?}", v.violations);
        // Two tasks for one token; an acknowledged task gone; a GPU holding too many.
        let mut run = e(0, Op::Run { token: "c".into() }, (0.0, 1.0), 1, 1);
        run.tasks = vec!["t9".into()];
        let last = [seen("t1", "c", &["g0"]), seen("t2", "c", &["g0"])];
        let v = check(&[run], &last, 1);
        assert!(
            found(&v, "has 2 tasks") && found(&v, "t9") && found(&v, "GPU g0 holds 2"),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn reads_are_judged_against_the_acknowledged_writes() {
        let mut run = e(0, Op::Run { token: "a".into() }, (0.0, 1.0), 7, 3);
        run.tasks = vec!["t1".into()];
        // A read after the acknowledgement that lacks the task (a stale leader).
        let v = check(&[run.clone(), read((2.0, 3.0), 4, vec![])], &[seen("t1", "a", &[])], 1);
        assert!(found(&v, "lacks task t1"), "{:?}", v.violations);
        // A read that shows a task whose RunTask was invoked after it completed.
        let mut later = e(0, Op::Run { token: "z".into() }, (5.0, 6.0), 7, 5);
        later.tasks = vec!["t2".into()];
        let v = check(&[read((1.0, 2.0), 4, vec![seen("t2", "z", &[])]), later], &[seen("t2", "z", &[])], 1);
        assert!(found(&v, "first RunTask was invoked after it completed"), "{:?}", v.violations);
        // A StopTask acknowledged and not shown (a lost stop).
        let stop = e(0, Op::Stop { task: "t1".into() }, (1.0, 2.0), 7, 4);
        let v =
            check(&[run, stop, read((3.0, 4.0), 4, vec![seen("t1", "a", &[])])], &[seen("t1", "a", &[])], 1);
        assert!(found(&v, "whose StopTask was acknowledged before it"), "{:?}", v.violations);
        // A desired count or host status older than the last acknowledged write.
        let scale = |d: u32, at| e(1, Op::Scale { desired: d }, at, 7, 3);
        let v = check(
            &[scale(2, (0.0, 1.0)), scale(0, (2.0, 3.0)), value(Op::ReadService, (4.0, 5.0), "2")],
            &[],
            1,
        );
        assert!(found(&v, "service desired count 2"), "{:?}", v.violations);
        let v = check(&[value(Op::ReadService, (0.0, 1.0), "3")], &[], 1);
        assert!(found(&v, "service desired count 3"), "{:?}", v.violations);
        let drain = e(2, Op::Drain { host: "h".into() }, (0.0, 1.0), 7, 3);
        let v = check(&[drain, value(Op::ReadHost { host: "h".into() }, (2.0, 3.0), "ACTIVE")], &[], 1);
        assert!(found(&v, "host status ACTIVE"), "{:?}", v.violations);
        // A refused write is not a candidate.
        let refused = Entry { outcome: Outcome::Failed("409".into()), ..scale(2, (0.0, 1.0)) };
        let v = check(&[refused, value(Op::ReadService, (2.0, 3.0), "2")], &[], 1);
        assert!(found(&v, "service desired count 2"), "{:?}", v.violations);
    }

    #[test]
    fn an_answer_without_its_headers_is_a_violation() {
        let mut bare = read((0.0, 1.0), 1, vec![]);
        bare.fence = None;
        let v = check(&[bare], &[], 1);
        assert!(found(&v, "without its mpsfleet-fence header"), "{:?}", v.violations);
        let mut bare = read((0.0, 1.0), 1, vec![]);
        bare.revision = None;
        let v = check(&[bare], &[], 1);
        assert!(found(&v, "without its mpsfleet-revision header"), "{:?}", v.violations);
    }
}
