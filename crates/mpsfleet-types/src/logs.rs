//! Recent task output: the snapshot an agent reports with its task states (so that the output
//! of a task outlives its host), and the answer of `GET /v1/tasks/{id}/logs`.
//!
//! One shape for every runtime: whatever runs a task (processes under a shim today) feeds its
//! output into the agent's ring, which reports a [`LogSnapshot`].

use crate::ids::TaskId;
use serde::{Deserialize, Serialize};

/// The most output one snapshot holds, counted as [`LogSnapshot::cost`]: the text of its
/// lines plus [`LINE_OVERHEAD_BYTES`] per line. Its JSON stays well under 1.5 MiB (etcd's
/// request limit) even when every byte needs escaping.
pub const SNAPSHOT_MAX_BYTES: usize = 16 << 10;

/// What each line costs against [`SNAPSHOT_MAX_BYTES`] beyond its text: its time, container
/// and stream, so that many short lines cannot make a large snapshot.
pub const LINE_OVERHEAD_BYTES: usize = 32;

/// Which of a container's streams a line was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// One line (with its newline) or, at the end of what was written so far, part of one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputLine {
    /// When the agent read it, in milliseconds since the epoch.
    pub at_ms: u64,
    pub container: String,
    pub stream: OutputStream,
    pub text: String,
}

impl OutputLine {
    pub fn cost(&self) -> usize {
        self.text.len() + LINE_OVERHEAD_BYTES
    }
}

/// The last output of a task, both streams of every container interleaved in the order they
/// were read, oldest first, within [`SNAPSHOT_MAX_BYTES`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogSnapshot {
    /// When the agent took it.
    pub taken_at_ms: u64,
    pub lines: Vec<OutputLine>,
    /// Bytes of older output left out to stay within the bound.
    #[serde(default)]
    pub dropped_bytes: u64,
}

impl LogSnapshot {
    /// What the snapshot counts against [`SNAPSHOT_MAX_BYTES`].
    pub fn cost(&self) -> usize {
        self.lines.iter().map(OutputLine::cost).sum()
    }

    /// Drops the oldest lines (and cuts a single line that is too long to its end) until the
    /// snapshot costs at most `max` bytes.
    pub fn trim_to(&mut self, max: usize) {
        let mut cost = self.cost();
        let mut drop = 0;
        while cost > max && drop < self.lines.len() {
            let line = &self.lines[drop];
            if drop + 1 == self.lines.len() {
                break;
            }
            cost -= line.cost();
            self.dropped_bytes += line.text.len() as u64;
            drop += 1;
        }
        self.lines.drain(..drop);
        if cost > max {
            if let Some(last) = self.lines.last_mut() {
                let keep = max.saturating_sub(LINE_OVERHEAD_BYTES);
                let cut = tail_boundary(&last.text, keep);
                self.dropped_bytes += cut as u64;
                last.text.drain(..cut);
            }
        }
    }

    /// Every line's text, in order.
    pub fn text(&self) -> String {
        self.lines.iter().map(|l| l.text.as_str()).collect()
    }
}

/// The byte index from which `s` keeps at most `keep` bytes, on a character boundary.
pub fn tail_boundary(s: &str, keep: usize) -> usize {
    let mut cut = s.len().saturating_sub(keep);
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    cut
}

/// Where the output in a [`TaskLogs`] answer comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogsSource {
    /// The task's agent, asked now: the tail of the stream asked for.
    Agent,
    /// The last snapshot the agent reported: both streams, interleaved.
    Snapshot,
}

/// Which output `GET /v1/tasks/{id}/logs` asks for: one stream, or both interleaved in the
/// order written. Reads the `"stdout"` and `"stderr"` that answers carried before `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogStreams {
    #[default]
    Stdout,
    Stderr,
    All,
}

/// A `stream` value that is none of `stdout`, `stderr` and `all`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLogStreams(pub String);

impl std::fmt::Display for BadLogStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream must be stdout, stderr or all, got {:?}", self.0)
    }
}

impl std::error::Error for BadLogStreams {}

impl LogStreams {
    pub fn as_str(self) -> &'static str {
        match self {
            LogStreams::Stdout => "stdout",
            LogStreams::Stderr => "stderr",
            LogStreams::All => "all",
        }
    }

    /// Whether output written to `stream` is part of it.
    pub fn includes(self, stream: OutputStream) -> bool {
        match self {
            LogStreams::Stdout => stream == OutputStream::Stdout,
            LogStreams::Stderr => stream == OutputStream::Stderr,
            LogStreams::All => true,
        }
    }
}

impl std::str::FromStr for LogStreams {
    type Err = BadLogStreams;

    fn from_str(s: &str) -> Result<LogStreams, BadLogStreams> {
        match s {
            "stdout" => Ok(LogStreams::Stdout),
            "stderr" => Ok(LogStreams::Stderr),
            "all" => Ok(LogStreams::All),
            other => Err(BadLogStreams(other.to_string())),
        }
    }
}

/// Response of `GET /v1/tasks/{id}/logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskLogs {
    pub task_id: TaskId,
    pub source: LogsSource,
    /// Why the snapshot is shown instead of the agent's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// From the agent: the container and stream asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<LogStreams>,
    /// From the agent, for one stream: the tail of that stream (not valid UTF-8 is replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// From the agent, for `all`: the tail of both streams, interleaved in the order written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<Vec<OutputLine>>,
    /// The time of the last output in the answer (ms since the epoch), or the `since_ms` asked
    /// for when there is none: what the next call passes as `since_ms` to get only newer output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_at_ms: Option<u64>,
    /// From the snapshot: when the server received it, and the snapshot itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<LogSnapshot>,
}

impl TaskLogs {
    /// The output shown, whichever the source.
    pub fn output(&self) -> String {
        match (&self.text, &self.lines, &self.snapshot) {
            (Some(t), _, _) => t.clone(),
            (None, Some(lines), _) => lines.iter().map(|l| l.text.as_str()).collect(),
            (None, None, Some(s)) => s.text(),
            (None, None, None) => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> OutputLine {
        OutputLine { at_ms: 1, container: "app".into(), stream: OutputStream::Stdout, text: text.into() }
    }

    #[test]
    fn trim_keeps_the_newest_lines_within_the_bound() {
        let mut s = LogSnapshot {
            taken_at_ms: 1,
            lines: vec![line("aaaa\n"), line("bbbb\n"), line("cccc\n")],
            dropped_bytes: 0,
        };
        s.trim_to(2 * (5 + LINE_OVERHEAD_BYTES));
        assert_eq!(s.text(), "bbbb\ncccc\n");
        assert_eq!(s.dropped_bytes, 5);
        // One line longer than the bound keeps its end, on a character boundary.
        let mut s = LogSnapshot { taken_at_ms: 1, lines: vec![line("xx"), line("héllo")], dropped_bytes: 0 };
        s.trim_to(LINE_OVERHEAD_BYTES + 4);
        assert_eq!(s.text(), "llo");
        assert!(s.cost() <= LINE_OVERHEAD_BYTES + 4);
        assert_eq!(s.dropped_bytes, 2 + 3);
    }

    #[test]
    fn logs_answers_from_before_all_still_read() {
        let old = r#"{"taskId":"t-0123456789abcdef","source":"agent","stream":"stderr","text":"x"}"#;
        let l: TaskLogs = serde_json::from_str(old).unwrap();
        assert_eq!(l.stream, Some(LogStreams::Stderr));
        assert_eq!((l.last_at_ms, l.lines.as_ref()), (None, None));
        assert_eq!(serde_json::to_string(&l).unwrap(), old);
        for (s, want) in
            [("stdout", LogStreams::Stdout), ("stderr", LogStreams::Stderr), ("all", LogStreams::All)]
        {
            assert_eq!(s.parse::<LogStreams>(), Ok(want));
            assert_eq!(want.as_str(), s);
        }
        assert_eq!(
            "both".parse::<LogStreams>().unwrap_err().to_string(),
            r#"stream must be stdout, stderr or all, got "both""#
        );
        assert!(LogStreams::All.includes(OutputStream::Stderr));
        assert!(!LogStreams::Stdout.includes(OutputStream::Stderr));
    }

    #[test]
    fn report_without_output_reads_as_before() {
        let old = r#"{"lastStatus":"RUNNING"}"#;
        let r: crate::TaskStateReport = serde_json::from_str(old).unwrap();
        assert_eq!(r.output, None);
        assert_eq!(serde_json::to_string(&r).unwrap(), old);
    }
}
