//! Watches a daemon's `control.log` for server failures: reads the lines added since the last
//! call and turns the ones that matter into [`LogEvent`]s.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// At most this much of the log is read per call; a burst beyond it is skipped, not buffered.
const MAX_READ_PER_POLL: u64 = 1 << 20;

/// Something in control.log that health cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEvent {
    /// `Server 17910 exited with status 1`: a server ended with a non-zero status.
    ServerExited { server_pid: u32, status: i32, line: String },
    /// A fatal-exception line (`Server encountered a fatal exception. Shutting down`).
    Fatal { line: String },
}

impl LogEvent {
    /// The log line, for a check's reason.
    pub fn line(&self) -> &str {
        match self {
            LogEvent::ServerExited { line, .. } | LogEvent::Fatal { line } => line,
        }
    }
}

/// Reads new lines of one log file; survives the file not existing yet and truncation.
#[derive(Debug)]
pub struct ControlLogWatcher {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl ControlLogWatcher {
    /// Watches `path` from its beginning.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), offset: 0, partial: Vec::new() }
    }

    /// Watches `path` from its current end: only lines written from now on count.
    pub fn from_end(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        Self { path, offset, partial: Vec::new() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The complete lines written since the last call.
    pub fn new_lines(&mut self) -> Vec<String> {
        let Ok(mut file) = File::open(&self.path) else { return Vec::new() };
        let Ok(len) = file.metadata().map(|m| m.len()) else { return Vec::new() };
        if len < self.offset {
            // Truncated or replaced: start over.
            self.offset = 0;
            self.partial.clear();
        }
        if len - self.offset > MAX_READ_PER_POLL {
            self.offset = len - MAX_READ_PER_POLL;
            self.partial.clear();
        }
        if len == self.offset || file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut buf = Vec::new();
        let Ok(n) = file.take(len - self.offset).read_to_end(&mut buf) else { return Vec::new() };
        self.offset += n as u64;
        self.partial.extend_from_slice(&buf);
        let Some(last_newline) = self.partial.iter().rposition(|&b| b == b'\n') else { return Vec::new() };
        let rest = self.partial.split_off(last_newline + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        String::from_utf8_lossy(&complete).lines().map(str::to_string).collect()
    }

    /// The events among the lines written since the last call.
    pub fn poll(&mut self) -> Vec<LogEvent> {
        self.new_lines().iter().filter_map(|l| parse_line(l)).collect()
    }
}

/// One control.log line, e.g. `[2026-11-29 13:36:43.039 Control 17873] Server 17910 exited with
/// status 1`; `None` for lines health does not care about.
pub fn parse_line(line: &str) -> Option<LogEvent> {
    let message = match line.find("] ") {
        Some(i) if line.starts_with('[') => &line[i + 2..],
        _ => line,
    };
    if let Some(rest) = message.strip_prefix("Server ") {
        if let Some((pid, status)) = rest.split_once(" exited with status ") {
            let server_pid = pid.trim().parse().ok()?;
            let status: i32 = status.trim().parse().ok()?;
            return (status != 0).then(|| LogEvent::ServerExited {
                server_pid,
                status,
                line: line.to_string(),
            });
        }
    }
    let lower = message.to_ascii_lowercase();
    if lower.contains("fatal") || lower.contains("exception") {
        return Some(LogEvent::Fatal { line: line.to_string() });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn check(line: &str, want: Option<LogEvent>) {
        assert_eq!(parse_line(line), want, "{line}");
    }

    #[test]
    fn parses_the_lines_that_matter() {
        let exited = "[2026-11-29 13:36:43.039 Control 17873] Server 17910 exited with status 1";
        check(exited, Some(LogEvent::ServerExited { server_pid: 17910, status: 1, line: exited.into() }));
        check("[2026-11-29 13:36:43.039 Control 17873] Server 17910 exited with status 0", None);
        let fatal =
            "[2026-11-29 13:36:43.039 Control 17873] Server encountered a fatal exception. Shutting down";
        check(fatal, Some(LogEvent::Fatal { line: fatal.into() }));
        check("[2026-11-29 13:36:43.039 Control 17873] Starting new server 17910 for user 0", None);
        check("[2026-11-29 13:36:43.039 Control 17873] Cmd:get_server_list", None);
        check("", None);
        check("[garbage", None);
        check("Server x exited with status 1", None);
    }

    #[test]
    fn reads_only_new_complete_lines_and_survives_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.log");
        let mut w = ControlLogWatcher::new(&path);
        assert!(w.poll().is_empty(), "no file yet");

        let mut f = std::fs::File::create(&path).unwrap();
        write!(f, "[t Control 1] Server 5 exited with status 1\n[t Control 1] Server 6 exi").unwrap();
        let events = w.poll();
        assert_eq!(events.len(), 1);
        assert!(matches!(events[0], LogEvent::ServerExited { server_pid: 5, status: 1, .. }));
        writeln!(f, "ted with status 2").unwrap();
        let events = w.poll();
        assert!(
            matches!(events[..], [LogEvent::ServerExited { server_pid: 6, status: 2, .. }]),
            "{events:?}"
        );
        assert!(w.poll().is_empty(), "nothing new");

        // Truncated and rewritten: read from the start again.
        std::fs::write(&path, "[t Control 1] Server encountered a fatal exception. Shutting down\n").unwrap();
        assert!(matches!(w.poll()[..], [LogEvent::Fatal { .. }]));
    }

    #[test]
    fn from_end_skips_what_is_already_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.log");
        std::fs::write(&path, "[t Control 1] Server 5 exited with status 1\n").unwrap();
        let mut w = ControlLogWatcher::from_end(&path);
        assert!(w.poll().is_empty());
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(f, "[t Control 1] Server 7 exited with status 1").unwrap();
        assert!(matches!(w.poll()[..], [LogEvent::ServerExited { server_pid: 7, .. }]));
    }
}
