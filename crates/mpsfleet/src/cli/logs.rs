//! `task logs` and `service logs`: a task's output as its agent keeps it (or the last snapshot
//! the server has), and every replica of a service interleaved by time, each line prefixed
//! with the task it came from (as `kubectl logs -l … --prefix` does).

use super::*;
use mpsfleet_types::logs::{LogStreams, OutputLine, OutputStream, TaskLogs};
use std::collections::BTreeMap;
use std::io::Write;

/// The most output one call asks of the agent (the server's limit).
const MAX_LOG_BYTES: u64 = 16 << 20;

/// How often `--follow` asks for new output.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What `task logs` and `service logs` take.
#[derive(Args, Clone, Debug)]
pub struct LogOptions {
    /// The container [default: the task's first].
    #[arg(long)]
    pub container: Option<String>,
    /// Which output: stdout, stderr, or all (both, interleaved in the order written, each
    /// printed to its own stream) [default: all].
    #[arg(long, conflicts_with = "stderr")]
    pub stream: Option<LogStreams>,
    /// The same as --stream stderr.
    #[arg(long)]
    pub stderr: bool,
    /// Only the last N lines (of each task) [default: all the agent returns].
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// How many bytes from the end the agent returns (at most 16 MiB); raised to fit
    /// --tail at 1 KiB a line.
    #[arg(long, value_name = "BYTES", default_value_t = 65536)]
    pub limit_bytes: u64,
    /// Only output written this recently: 30s, 10m, 2h, 1h30m.
    #[arg(long, value_name = "AGE")]
    pub since: Option<String>,
    /// Begin each line with the time the agent read it (RFC 3339, UTC).
    #[arg(long)]
    pub timestamps: bool,
    /// Keep printing new output as it is written: until the task is STOPPED (`task logs`) or
    /// Ctrl-C.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

impl LogOptions {
    fn streams(&self) -> LogStreams {
        match (self.stream, self.stderr) {
            (_, true) => LogStreams::Stderr,
            (Some(s), false) => s,
            (None, false) => LogStreams::All,
        }
    }

    fn bytes(&self) -> u64 {
        self.tail.map_or(self.limit_bytes, |n| self.limit_bytes.max(n as u64 * 1024)).min(MAX_LOG_BYTES)
    }

    /// The time `--since` names, in ms since the epoch.
    fn since_ms(&self) -> Result<Option<u64>> {
        let Some(age) = self.since.as_deref() else { return Ok(None) };
        Ok(Some(watch::ago_ms(watch::parse_age(age)?)))
    }

    /// Whether lines are needed one by one, with their times (else a stream's plain text will
    /// do, as the agent answers it for one stream).
    fn by_line(&self) -> bool {
        self.timestamps || self.since.is_some() || self.streams() == LogStreams::All
    }
}

/// One line as printed: from which task and container (for `service logs`), when, and what.
fn print_line(prefix: Option<&str>, timestamps: bool, line: &OutputLine) -> std::io::Result<()> {
    let mut text = String::new();
    if let Some(p) = prefix {
        text.push_str(p);
        text.push(' ');
    }
    if timestamps {
        text.push_str(&output::utc_time(line.at_ms));
        text.push(' ');
    }
    text.push_str(&sanitize_text(&line.text));
    if !text.ends_with('\n') {
        text.push('\n');
    }
    match line.stream {
        OutputStream::Stdout => std::io::stdout().write_all(text.as_bytes()),
        OutputStream::Stderr => std::io::stderr().write_all(text.as_bytes()),
    }
}

/// The lines of an answer that `want` asks for (the snapshot's when it is one); `None` when it
/// carries plain text.
fn lines_of(logs: &TaskLogs, want: LogStreams, since_ms: Option<u64>) -> Option<Vec<OutputLine>> {
    let lines = match (&logs.snapshot, &logs.lines) {
        (Some(snapshot), _) => &snapshot.lines,
        (None, Some(lines)) => lines,
        (None, None) => return None,
    };
    let stream_ok = |l: &OutputLine| match want {
        LogStreams::All => true,
        LogStreams::Stdout => l.stream == OutputStream::Stdout,
        LogStreams::Stderr => l.stream == OutputStream::Stderr,
    };
    Some(lines.iter().filter(|l| stream_ok(l) && since_ms.is_none_or(|s| l.at_ms >= s)).cloned().collect())
}

/// The last `n` of `v` (all when `None`).
fn last(mut v: Vec<OutputLine>, n: Option<usize>) -> Vec<OutputLine> {
    let keep = n.unwrap_or(v.len()).min(v.len());
    v.drain(..v.len() - keep);
    v
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> &str {
    let body = text.strip_suffix('\n').unwrap_or(text);
    match body.rmatch_indices('\n').nth(n.saturating_sub(1)) {
        Some((i, _)) if n > 0 => &text[i + 1..],
        _ if n == 0 => "",
        _ => text,
    }
}

/// `task logs`: prints what there is; with `--follow`, then asks every [`FOLLOW_EVERY`] for
/// what was written after the last output printed, until the task is STOPPED (printing the
/// rest) or Ctrl-C.
pub(super) async fn task_logs(c: &Client, f: Format, id: &str, o: &LogOptions) -> Result<()> {
    let want = o.streams();
    let ask = if o.by_line() { LogStreams::All } else { want };
    let since_ms = o.since_ms()?;
    // Lines are cut from the first answer only; what follows is printed whole.
    let mut lines = o.tail;
    // Following starts from the beginning of what the agent keeps (within the bytes asked).
    let mut cursor = since_ms.or(o.follow.then_some(0));
    let mut noted = false;
    let mut ending = false;
    loop {
        let logs = c.task_logs(id, o.container.as_deref(), ask, o.bytes(), cursor).await?;
        let n = lines.take();
        if f.is_data() {
            output::print(f, &logs, &[], Vec::new());
        } else {
            if let (Some(snapshot), false) = (&logs.snapshot, noted) {
                noted = true;
                eprintln!(
                    "showing the last snapshot reported at {} ({})",
                    output::utc_time(logs.reported_at_ms.unwrap_or(snapshot.taken_at_ms)),
                    sanitize(logs.note.as_deref().unwrap_or("the agent was not asked"))
                );
            }
            match lines_of(&logs, want, since_ms) {
                Some(got) => {
                    for line in last(got, n) {
                        print_line(None, o.timestamps, &line)?;
                    }
                }
                None => {
                    let text = logs.output();
                    let text = n.map_or(text.as_str(), |n| last_lines(&text, n));
                    std::io::stdout().write_all(sanitize_text(text).as_bytes())?;
                }
            }
            std::io::stdout().flush()?;
        }
        if !o.follow || ending {
            return Ok(());
        }
        if let Some(at) = logs.last_at_ms {
            cursor = Some(at);
        }
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        // Once it is STOPPED, one more call prints what it wrote last.
        ending = c.describe_task(id).await?.last_status == TaskStatus::Stopped;
    }
}

/// A line of `service logs -o json`: the task's line and whose it is.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceLine<'a> {
    task_id: &'a str,
    #[serde(flatten)]
    line: &'a OutputLine,
}

/// `service logs`: the output of every task the service runs, interleaved by the time each
/// line was read, each prefixed `[task/ID/CONTAINER]`; with `--follow`, new output as it is
/// written (and new replicas as they start) until Ctrl-C.
pub(super) async fn service_logs(c: &Client, f: Format, name: &str, o: &LogOptions) -> Result<()> {
    let want = o.streams();
    let since_ms = o.since_ms()?;
    c.describe_service(name).await?; // a service that does not exist is an error, not silence
                                     // Where each task's output was printed up to; a task not yet seen starts at `since_ms`.
    let mut cursors: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let mut first = true;
    loop {
        let q = TaskQuery { service: Some(name.to_string()), live: true, ..TaskQuery::default() };
        let tasks = c.list_tasks(&q).await?;
        if first && tasks.is_empty() && !o.follow {
            eprintln!("service {} runs no task", sanitize(name));
        }
        let mut round: Vec<(String, OutputLine)> = Vec::new();
        for t in &tasks {
            let id = t.id.to_string();
            let seen = cursors.contains_key(&id);
            let cursor = cursors.get(&id).copied().flatten().or(since_ms).or((!first).then_some(0));
            let logs =
                match c.task_logs(&id, o.container.as_deref(), LogStreams::All, o.bytes(), cursor).await {
                    Ok(l) => l,
                    Err(e) => {
                        if !seen {
                            eprintln!("warning: no output of task {id}: {e}");
                        }
                        cursors.entry(id).or_insert(cursor);
                        continue;
                    }
                };
            let got = lines_of(&logs, want, since_ms).unwrap_or_default();
            let got = if seen { got } else { last(got, o.tail) };
            cursors.insert(id.clone(), logs.last_at_ms.or(cursor));
            round.extend(got.into_iter().map(|l| (id.clone(), l)));
        }
        // Lines of several tasks interleave by the time they were read; one task's keep order.
        round.sort_by_key(|(_, l)| l.at_ms);
        for (id, line) in &round {
            if f.is_data() {
                println!("{}", serde_json::to_string(&ServiceLine { task_id: id, line })?);
            } else {
                let prefix = format!("[task/{id}/{}]", sanitize(&line.container));
                print_line(Some(&prefix), o.timestamps, line)?;
            }
        }
        std::io::stdout().flush()?;
        if !o.follow {
            return Ok(());
        }
        first = false;
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at_ms: u64, stream: OutputStream) -> OutputLine {
        OutputLine { at_ms, container: "main".into(), stream, text: format!("{at_ms}\n") }
    }

    #[test]
    fn lines_are_chosen_by_stream_and_time_and_cut_to_the_tail() {
        let logs = TaskLogs {
            lines: Some(vec![
                line(1, OutputStream::Stdout),
                line(2, OutputStream::Stderr),
                line(3, OutputStream::Stdout),
            ]),
            ..serde_json::from_value(serde_json::json!({"taskId": "t-00000000000000a1", "source": "agent"}))
                .unwrap()
        };
        let at = |v: Vec<OutputLine>| v.iter().map(|l| l.at_ms).collect::<Vec<_>>();
        assert_eq!(at(lines_of(&logs, LogStreams::All, None).unwrap()), [1, 2, 3]);
        assert_eq!(at(lines_of(&logs, LogStreams::Stdout, None).unwrap()), [1, 3]);
        assert_eq!(at(lines_of(&logs, LogStreams::All, Some(2)).unwrap()), [2, 3]);
        assert_eq!(at(last(lines_of(&logs, LogStreams::All, None).unwrap(), Some(1))), [3]);
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(last_lines("a\nb\n", 5), "a\nb\n");
        assert_eq!(last_lines("a\nb\n", 0), "");
        assert_eq!(last_lines("", 3), "");
    }
}
