//! `task exec`: what a session asks for, and the frames its upgraded connection carries.
//!
//! The CLI asks the server (`POST /v1/tasks/{id}/exec?spec=JSON`, `Upgrade: mpsfleet-exec`),
//! the server asks the task's agent the same way, and once both have answered `101 Switching
//! Protocols` the two connections carry frames: one byte of kind, four of length (big-endian),
//! then the payload. The server reads every frame that passes (for the session's idle time and
//! its exit code) and passes it on unchanged.

use serde::{Deserialize, Serialize};

/// The protocol named in the `Upgrade` header.
pub const UPGRADE: &str = "mpsfleet-exec";
/// The most arguments a command may have.
pub const MAX_ARGS: usize = 1024;
/// The most bytes of a whole command line (its arguments together).
pub const MAX_COMMAND_BYTES: usize = 64 << 10;
/// The largest payload a frame may carry; a sender splits larger output.
pub const MAX_FRAME: usize = 64 << 10;
/// The largest terminal side (columns or rows) a resize may ask for.
pub const MAX_TERMINAL_SIDE: u16 = 4096;

/// What a session runs: the query parameter `spec`, as JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecSpec {
    /// The container to run in (default: the task definition's first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The command and its arguments; the first is looked up in the task's `PATH`.
    pub command: Vec<String>,
    /// Pass the client's stdin (`-i`); without it the command's stdin is empty.
    #[serde(default)]
    pub interactive: bool,
    /// Run the command on a terminal (`-t`): stdout and stderr are then one stream.
    #[serde(default)]
    pub tty: bool,
    /// The terminal's first size, with `tty`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
}

impl ExecSpec {
    /// Checks the spec's bounds; the error names the field and the limit.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(("command", "is empty: name the command to run after `--`".into()));
        }
        if self.command.len() > MAX_ARGS {
            return Err(("command", format!("has {} arguments, more than {MAX_ARGS}", self.command.len())));
        }
        let bytes: usize = self.command.iter().map(|a| a.len() + 1).sum();
        if bytes > MAX_COMMAND_BYTES {
            return Err(("command", format!("is {bytes} bytes long, more than {MAX_COMMAND_BYTES}")));
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return Err(("command", "holds a NUL byte, which no argument can carry".into()));
        }
        if let Some(c) = &self.container {
            crate::check_name("container name", c).map_err(|e| ("container", e.to_string()))?;
        }
        for (name, v) in [("cols", self.cols), ("rows", self.rows)] {
            if v.is_some_and(|v| v == 0 || v > MAX_TERMINAL_SIDE) {
                return Err((name, format!("must be from 1 to {MAX_TERMINAL_SIDE}")));
            }
        }
        Ok(())
    }

    /// The command line as a shell would read it back (for the audit log and messages).
    pub fn command_line(&self) -> String {
        self.command.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
    }
}

/// `arg` quoted for a POSIX shell where it needs to be.
fn shell_quote(arg: &str) -> String {
    let plain =
        !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The kinds of frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Client to command: stdin bytes.
    Stdin = 0,
    /// Command to client: stdout bytes (a terminal's whole output with `tty`).
    Stdout = 1,
    /// Command to client: stderr bytes.
    Stderr = 2,
    /// Client to command: stdin has ended.
    StdinEnd = 3,
    /// Client to command: the terminal's new size, columns then rows (two bytes each).
    Resize = 4,
    /// Command to client: the command exited with this code (four bytes, signed); the last
    /// frame of a session.
    Exit = 5,
    /// To client: the session ended without an exit code, for the reason in the payload (UTF-8);
    /// the last frame of a session.
    Ended = 6,
}

impl FrameKind {
    pub fn from_byte(b: u8) -> Option<FrameKind> {
        Some(match b {
            0 => FrameKind::Stdin,
            1 => FrameKind::Stdout,
            2 => FrameKind::Stderr,
            3 => FrameKind::StdinEnd,
            4 => FrameKind::Resize,
            5 => FrameKind::Exit,
            6 => FrameKind::Ended,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Stdin(Vec<u8>),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    StdinEnd,
    Resize { cols: u16, rows: u16 },
    Exit(i32),
    Ended(String),
}

impl Frame {
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Stdin(_) => FrameKind::Stdin,
            Frame::Stdout(_) => FrameKind::Stdout,
            Frame::Stderr(_) => FrameKind::Stderr,
            Frame::StdinEnd => FrameKind::StdinEnd,
            Frame::Resize { .. } => FrameKind::Resize,
            Frame::Exit(_) => FrameKind::Exit,
            Frame::Ended(_) => FrameKind::Ended,
        }
    }

    /// The frame's bytes: kind, length, payload. A payload over [`MAX_FRAME`] is cut there
    /// (output is split by its senders before it gets here; a reason is short).
    pub fn encode(&self) -> Vec<u8> {
        let payload: std::borrow::Cow<'_, [u8]> = match self {
            Frame::Stdin(b) | Frame::Stdout(b) | Frame::Stderr(b) => b.as_slice().into(),
            Frame::StdinEnd => (&[][..]).into(),
            Frame::Resize { cols, rows } => {
                let mut v = cols.to_be_bytes().to_vec();
                v.extend_from_slice(&rows.to_be_bytes());
                v.into()
            }
            Frame::Exit(code) => code.to_be_bytes().to_vec().into(),
            Frame::Ended(why) => why.as_bytes().into(),
        };
        let payload = &payload[..payload.len().min(MAX_FRAME)];
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(self.kind() as u8);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// The frame of `kind` with `payload`; Err says what is wrong with it.
    pub fn decode(kind: u8, payload: Vec<u8>) -> Result<Frame, String> {
        let kind = FrameKind::from_byte(kind).ok_or_else(|| format!("unknown frame kind {kind}"))?;
        let fixed = |n: usize| {
            if payload.len() == n {
                Ok(())
            } else {
                Err(format!("a {kind:?} frame of {} bytes, not {n}", payload.len()))
            }
        };
        Ok(match kind {
            FrameKind::Stdin => Frame::Stdin(payload),
            FrameKind::Stdout => Frame::Stdout(payload),
            FrameKind::Stderr => Frame::Stderr(payload),
            FrameKind::StdinEnd => {
                fixed(0)?;
                Frame::StdinEnd
            }
            FrameKind::Resize => {
                fixed(4)?;
                Frame::Resize {
                    cols: u16::from_be_bytes([payload[0], payload[1]]),
                    rows: u16::from_be_bytes([payload[2], payload[3]]),
                }
            }
            FrameKind::Exit => {
                fixed(4)?;
                Frame::Exit(i32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]))
            }
            FrameKind::Ended => Frame::Ended(String::from_utf8_lossy(&payload).into_owned()),
        })
    }
}

/// Splits the five bytes of a frame's header into its kind and payload length; Err when the
/// length is over [`MAX_FRAME`].
pub fn header(h: [u8; 5]) -> Result<(u8, usize), String> {
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    if len > MAX_FRAME {
        return Err(format!("a frame of {len} bytes, more than {MAX_FRAME}"));
    }
    Ok((h[0], len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_as_written() {
        for f in [
            Frame::Stdin(b"ls\n".to_vec()),
            Frame::Stdout(vec![0; MAX_FRAME]),
            Frame::Stderr(Vec::new()),
            Frame::StdinEnd,
            Frame::Resize { cols: 132, rows: 43 },
            Frame::Exit(-9),
            Frame::Ended("task t-1 stopped".into()),
        ] {
            let bytes = f.encode();
            let (kind, len) = header(bytes[..5].try_into().unwrap()).unwrap();
            assert_eq!(len, bytes.len() - 5);
            assert_eq!(Frame::decode(kind, bytes[5..].to_vec()).unwrap(), f);
        }
        assert!(header([1, 0, 1, 0, 1]).unwrap_err().contains("more than"));
        assert!(Frame::decode(9, vec![]).unwrap_err().contains("unknown frame kind 9"));
        assert!(Frame::decode(5, vec![1]).unwrap_err().contains("not 4"));
    }

    #[test]
    fn a_spec_past_its_bounds_names_the_field() {
        let ok = ExecSpec { command: vec!["sh".into()], ..Default::default() };
        assert!(ok.check().is_ok());
        let empty = ExecSpec::default();
        assert_eq!(empty.check().unwrap_err().0, "command");
        let long = ExecSpec { command: vec!["x".repeat(MAX_COMMAND_BYTES)], ..Default::default() };
        assert!(long.check().unwrap_err().1.contains("more than 65536"));
        let bad = ExecSpec { container: Some("a/b".into()), ..ok.clone() };
        assert_eq!(bad.check().unwrap_err().0, "container");
        let wide = ExecSpec { cols: Some(0), ..ok };
        assert_eq!(wide.check().unwrap_err().0, "cols");
    }

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let s = ExecSpec {
            command: vec!["sh".into(), "-c".into(), "echo 'hi'; id -u".into()],
            ..Default::default()
        };
        assert_eq!(s.command_line(), r#"sh -c 'echo '\''hi'\''; id -u'"#);
    }
}
