//! A task's recent output: the [`RecentOutput`] ring (both streams of every container,
//! interleaved in the order read, each line timestamped and tagged, within
//! [`SNAPSHOT_MAX_BYTES`]) and the [`LogTail`] that feeds it from a container's framed
//! `output.log`.
//!
//! Nothing here knows how a task runs: a runtime only has to write each chunk of its
//! containers' output, in the order it read it, as a frame ([`encode_frame`]) to one file per
//! container (the shim does, from its pipes). Files are opened without following symlinks and
//! only when they are regular files with one link, so a task that replaces its log with a link
//! to another file (`/etc/shadow`) gets nothing read from it.

use mpsfleet_types::logs::{
    tail_boundary, LogSnapshot, OutputLine, OutputStream, LINE_OVERHEAD_BYTES, SNAPSHOT_MAX_BYTES,
};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The most read from one file in one pass; more than a snapshot holds is skipped over.
const READ_MAX: u64 = SNAPSHOT_MAX_BYTES as u64;

/// The last output of one task, oldest first.
#[derive(Debug, Clone)]
pub struct RecentOutput {
    lines: VecDeque<OutputLine>,
    cost: usize,
    max: usize,
    dropped_bytes: u64,
    /// Bumped on every change, so a reporter can tell whether there is anything new.
    seq: u64,
}

impl Default for RecentOutput {
    fn default() -> RecentOutput {
        RecentOutput::with_bound(SNAPSHOT_MAX_BYTES)
    }
}

impl RecentOutput {
    /// A ring that keeps at most `max` bytes (as [`LogSnapshot::cost`] counts them).
    pub fn with_bound(max: usize) -> RecentOutput {
        RecentOutput { lines: VecDeque::new(), cost: 0, max, dropped_bytes: 0, seq: 0 }
    }

    /// Adds what a container wrote to a stream, split into lines (each keeps its newline; a
    /// last piece without one is kept as it is), all stamped `at_ms`.
    pub fn push(&mut self, at_ms: u64, container: &str, stream: OutputStream, text: &str) {
        for piece in text.split_inclusive('\n') {
            let mut line =
                OutputLine { at_ms, container: container.to_string(), stream, text: piece.to_string() };
            if line.cost() > self.max {
                let cut = tail_boundary(&line.text, self.max.saturating_sub(LINE_OVERHEAD_BYTES));
                self.dropped_bytes += cut as u64;
                line.text.drain(..cut);
            }
            while self.cost + line.cost() > self.max {
                let Some(old) = self.lines.pop_front() else { break };
                self.cost -= old.cost();
                self.dropped_bytes += old.text.len() as u64;
            }
            self.cost += line.cost();
            self.lines.push_back(line);
            self.seq += 1;
        }
    }

    /// Counts output that was skipped without being read (more than a snapshot holds).
    pub fn skipped(&mut self, bytes: u64) {
        if bytes > 0 {
            self.dropped_bytes += bytes;
            self.seq += 1;
        }
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn snapshot(&self, now_ms: u64) -> LogSnapshot {
        LogSnapshot {
            taken_at_ms: now_ms,
            lines: self.lines.iter().cloned().collect(),
            dropped_bytes: self.dropped_bytes,
        }
    }
}

/// Why a log file is not read.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    #[error("{}: not a regular file with a single link; not read", path.display())]
    NotPlain { path: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Opens a log file for reading without following a symlink (nor blocking on a FIFO), and only
/// if it is a regular file with one link. `Ok(None)` when it does not exist yet. The directory
/// it is in is trusted; [`open_log_beneath`] follows no link below a trusted root either.
pub fn open_log(path: &Path) -> Result<Option<File>, TailError> {
    let (root, name) = match (path.parent(), path.file_name()) {
        (Some(root), Some(name)) => (root, Path::new(name)),
        _ => return Err(TailError::NotPlain { path: path.to_path_buf() }),
    };
    open_log_beneath(root, name)
}

/// [`open_log`] of `root`/`rel`, where no component of `rel` (directories included) is
/// followed when it is a link: a link anywhere below `root` is refused.
pub fn open_log_beneath(root: &Path, rel: &Path) -> Result<Option<File>, TailError> {
    use std::os::unix::fs::MetadataExt;
    let path = root.join(rel);
    let refused = |e: &io::Error| {
        matches!(e.raw_os_error(), Some(libc_flags::ELOOP) | Some(libc_flags::ENOTDIR))
            || e.kind() == io::ErrorKind::InvalidInput
    };
    let io = |source| TailError::Io { path: path.clone(), source };
    let (parent, name) =
        crate::safe_fs::split(rel).map_err(|_| TailError::NotPlain { path: path.clone() })?;
    let dir = match crate::safe_fs::Dir::open_beneath(root, parent) {
        Ok(Some(dir)) => dir,
        Ok(None) => return Ok(None),
        Err(e) if refused(&e) => return Err(TailError::NotPlain { path }),
        Err(e) => return Err(io(e)),
    };
    let file = match dir.open_file(name) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) if refused(&e) => return Err(TailError::NotPlain { path }),
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        return Err(TailError::NotPlain { path });
    }
    Ok(Some(file))
}

/// The errors `open_log` tells apart, from nix's libc.
mod libc_flags {
    pub const ELOOP: i32 = nix::libc::ELOOP;
    pub const ENOTDIR: i32 = nix::libc::ENOTDIR;
}

/// The start of every frame in `output.log`, so that a reader that starts mid-file (after a
/// restart) finds the next frame.
const FRAME_MARK: u8 = 0x1e;
/// The largest chunk one frame carries (what the shim reads from a pipe at once).
pub const FRAME_MAX: usize = 64 << 10;

/// One chunk of a stream as the shim writes it to `output.log`: `0x1E`, `o` or `e`, the time
/// read in ms, the length, a newline, then the bytes.
pub fn encode_frame(stream: OutputStream, at_ms: u64, bytes: &[u8]) -> Vec<u8> {
    let tag = match stream {
        OutputStream::Stdout => 'o',
        OutputStream::Stderr => 'e',
    };
    let mut out = format!("\u{1e}{tag} {at_ms} {}\n", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    out
}

/// A frame's header at the start of `buf`: stream, time, length and header size; `Ok(None)`
/// when more bytes are needed, `Err(())` when `buf` does not start with a frame.
#[allow(clippy::result_unit_err)]
pub fn decode_header(buf: &[u8]) -> Result<Option<(OutputStream, u64, usize, usize)>, ()> {
    const LONGEST: usize = 2 + 20 + 1 + 10 + 1;
    let Some(&first) = buf.first() else { return Ok(None) };
    if first != FRAME_MARK {
        return Err(());
    }
    let Some(nl) = buf.iter().take(LONGEST + 1).position(|&b| b == b'\n') else {
        return if buf.len() > LONGEST { Err(()) } else { Ok(None) };
    };
    let head = std::str::from_utf8(&buf[1..nl]).map_err(|_| ())?;
    let mut parts = head.split(' ');
    let stream = match parts.next() {
        Some("o") => OutputStream::Stdout,
        Some("e") => OutputStream::Stderr,
        _ => return Err(()),
    };
    let at_ms: u64 = parts.next().and_then(|p| p.parse().ok()).ok_or(())?;
    let len: usize = parts.next().and_then(|p| p.parse().ok()).filter(|&l| l <= FRAME_MAX).ok_or(())?;
    if parts.next().is_some() {
        return Err(());
    }
    Ok(Some((stream, at_ms, len, nl + 1)))
}

/// Follows one container's `output.log` (both streams, framed by the shim in the order it read
/// them) and feeds each chunk, with the time the shim read it, to a [`RecentOutput`].
#[derive(Debug)]
pub struct LogTail {
    /// The trusted directory and the file below it (no link below `root` is followed).
    root: PathBuf,
    rel: PathBuf,
    path: PathBuf,
    container: String,
    file: Option<File>,
    offset: u64,
    /// Start at the last [`SNAPSHOT_MAX_BYTES`] rather than the beginning (after a restart).
    from_end: bool,
    /// Bytes read that do not make a whole frame yet.
    pending: Vec<u8>,
    /// Looking for the next frame mark (after starting or skipping mid-file).
    resync: bool,
    /// The start of a character cut at the end of a chunk, by stream.
    cut: [Vec<u8>; 2],
    /// The file was refused or failed; it is not looked at again.
    failed: bool,
}

impl LogTail {
    /// Follows `path` from its beginning (a container just started), or from its last
    /// [`SNAPSHOT_MAX_BYTES`] with `from_end` (a container adopted after a restart).
    pub fn new(path: PathBuf, container: &str, from_end: bool) -> LogTail {
        let root = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let rel = path.file_name().map(PathBuf::from).unwrap_or_default();
        LogTail::beneath(root, rel, container, from_end)
    }

    /// Follows `root`/`rel`, following no link below `root` (directories included).
    pub fn beneath(root: PathBuf, rel: PathBuf, container: &str, from_end: bool) -> LogTail {
        LogTail {
            path: root.join(&rel),
            root,
            rel,
            container: container.to_string(),
            file: None,
            offset: 0,
            from_end,
            pending: Vec::new(),
            resync: false,
            cut: [Vec::new(), Vec::new()],
            failed: false,
        }
    }

    /// Reads what was appended since the last call into `out`. An error is returned once; the
    /// file is not read again after it.
    pub fn poll(&mut self, out: &mut RecentOutput) -> Result<(), TailError> {
        if self.failed {
            return Ok(());
        }
        let res = self.read_new(out);
        if res.is_err() {
            self.failed = true;
            self.file = None;
        }
        res
    }

    fn read_new(&mut self, out: &mut RecentOutput) -> Result<(), TailError> {
        use std::os::unix::fs::MetadataExt;
        let io = |source| TailError::Io { path: self.path.clone(), source };
        if self.file.is_none() {
            let Some(f) = open_log_beneath(&self.root, &self.rel)? else { return Ok(()) };
            if std::mem::take(&mut self.from_end) {
                let len = f.metadata().map_err(io)?.len();
                self.offset = len.saturating_sub(READ_MAX);
                self.resync = self.offset > 0;
                out.skipped(self.offset);
            }
            self.file = Some(f);
        }
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        let meta = file.metadata().map_err(io)?;
        let len = meta.len();
        if len < self.offset {
            // Truncated: read it again from the start.
            self.offset = 0;
            self.pending.clear();
        }
        if len == self.offset {
            // Read to its end: the shim may have started a new file.
            let now = std::fs::symlink_metadata(&self.path).ok().map(|m| m.ino());
            if now.is_some_and(|ino| ino != meta.ino()) {
                self.file = None;
                self.offset = 0;
                self.pending.clear();
                return self.read_new(out);
            }
            return Ok(());
        }
        if len - self.offset > READ_MAX {
            out.skipped(len - READ_MAX - self.offset);
            self.offset = len - READ_MAX;
            self.pending.clear();
            self.resync = true;
        }
        file.seek(SeekFrom::Start(self.offset)).map_err(io)?;
        let read = file.take(len - self.offset).read_to_end(&mut self.pending).map_err(io)?;
        self.offset += read as u64;
        self.frames(out);
        Ok(())
    }

    /// Feeds every whole frame in `pending` to `out`; keeps the rest.
    fn frames(&mut self, out: &mut RecentOutput) {
        let mut at = 0;
        loop {
            let buf = &self.pending[at..];
            if self.resync {
                match buf.iter().position(|&b| b == FRAME_MARK) {
                    Some(p) => {
                        at += p;
                        self.resync = false;
                    }
                    None => {
                        at = self.pending.len();
                        break;
                    }
                }
                continue;
            }
            match decode_header(buf) {
                Ok(None) => break,
                Err(()) => {
                    // Not a frame here: look for the next one.
                    at += 1;
                    self.resync = true;
                }
                Ok(Some((stream, at_ms, len, head))) => {
                    if buf.len() < head + len {
                        break;
                    }
                    let slot = match stream {
                        OutputStream::Stdout => 0,
                        OutputStream::Stderr => 1,
                    };
                    let mut bytes = std::mem::take(&mut self.cut[slot]);
                    bytes.extend_from_slice(&buf[head..head + len]);
                    // Keep an incomplete character at the end for the stream's next chunk.
                    let complete = match std::str::from_utf8(&bytes) {
                        Ok(_) => bytes.len(),
                        Err(e) if e.error_len().is_none() && bytes.len() - e.valid_up_to() < 4 => {
                            e.valid_up_to()
                        }
                        Err(_) => bytes.len(),
                    };
                    self.cut[slot] = bytes.split_off(complete);
                    if !bytes.is_empty() {
                        out.push(at_ms, &self.container, stream, &String::from_utf8_lossy(&bytes));
                    }
                    at += head + len;
                }
            }
        }
        self.pending.drain(..at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use OutputStream::{Stderr, Stdout};

    fn texts(r: &RecentOutput) -> Vec<(OutputStream, String, u64)> {
        r.snapshot(0).lines.into_iter().map(|l| (l.stream, l.text, l.at_ms)).collect()
    }

    #[test]
    fn ring_interleaves_streams_in_order_with_their_times() {
        let mut r = RecentOutput::default();
        r.push(10, "app", Stdout, "one\ntwo\n");
        r.push(11, "app", Stderr, "oops\n");
        r.push(12, "app", Stdout, "three\npart");
        assert_eq!(
            texts(&r),
            vec![
                (Stdout, "one\n".into(), 10),
                (Stdout, "two\n".into(), 10),
                (Stderr, "oops\n".into(), 11),
                (Stdout, "three\n".into(), 12),
                (Stdout, "part".into(), 12),
            ]
        );
        assert_eq!(r.seq(), 5);
        let s = r.snapshot(99);
        assert_eq!(s.taken_at_ms, 99);
        assert_eq!(s.dropped_bytes, 0);
    }

    #[test]
    fn ring_stays_within_its_bound() {
        let mut r = RecentOutput::default();
        let mut written = 0u64;
        for i in 0..5000 {
            let line = format!("line {i:05}\n");
            written += line.len() as u64;
            r.push(i, "app", if i % 2 == 0 { Stdout } else { Stderr }, &line);
            assert!(r.snapshot(0).cost() <= SNAPSHOT_MAX_BYTES, "over the bound at line {i}");
        }
        let s = r.snapshot(0);
        assert_eq!(s.lines.last().unwrap().text, "line 04999\n");
        let kept: u64 = s.lines.iter().map(|l| l.text.len() as u64).sum();
        assert_eq!(kept + s.dropped_bytes, written);
        // Newest first kept, in order: the lines are consecutive up to the last.
        let first: u64 = s.lines[0].text[5..10].parse().unwrap();
        assert_eq!(first + s.lines.len() as u64, 5000);
        // A single line longer than the bound keeps its end.
        let mut r = RecentOutput::default();
        let long = "x".repeat(3 * SNAPSHOT_MAX_BYTES) + "END\n";
        r.push(1, "app", Stdout, &long);
        let s = r.snapshot(0);
        assert!(s.cost() <= SNAPSHOT_MAX_BYTES);
        assert!(s.lines[0].text.ends_with("END\n"));
    }

    fn frame(stream: OutputStream, at: u64, text: &[u8]) -> Vec<u8> {
        encode_frame(stream, at, text)
    }

    #[test]
    fn tail_reads_frames_as_they_come_and_keeps_split_characters_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let mut r = RecentOutput::default();
        let mut tail = LogTail::new(path.clone(), "app", false);
        tail.poll(&mut r).unwrap(); // not there yet
        assert!(r.is_empty());
        let mut f = File::create(&path).unwrap();
        let bytes = "héllo\n".as_bytes();
        let mut all = frame(Stdout, 2, &bytes[..2]); // "h" and half of "é"
        all.extend(frame(Stderr, 3, b"oops\n"));
        all.extend(frame(Stdout, 4, &bytes[2..]));
        // Written in two pieces that cut a frame in the middle.
        f.write_all(&all[..all.len() - 3]).unwrap();
        tail.poll(&mut r).unwrap();
        assert_eq!(texts(&r), vec![(Stdout, "h".into(), 2), (Stderr, "oops\n".into(), 3)]);
        f.write_all(&all[all.len() - 3..]).unwrap();
        tail.poll(&mut r).unwrap();
        assert_eq!(
            texts(&r),
            vec![(Stdout, "h".into(), 2), (Stderr, "oops\n".into(), 3), (Stdout, "éllo\n".into(), 4)]
        );
    }

    #[test]
    fn tail_after_a_restart_starts_at_the_last_snapshot_worth() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let mut all = Vec::new();
        for i in 0..2000u64 {
            all.extend(frame(
                if i % 2 == 0 { Stdout } else { Stderr },
                i,
                format!("line {i:04}\n").as_bytes(),
            ));
        }
        std::fs::write(&path, &all).unwrap();
        let mut r = RecentOutput::default();
        LogTail::new(path, "app", true).poll(&mut r).unwrap();
        let s = r.snapshot(0);
        // It found the frames again mid-file: whole lines only, ending with the last.
        assert_eq!(s.lines.last().unwrap().text, "line 1999\n");
        assert!(s.lines.iter().all(|l| l.text.starts_with("line ") && l.text.len() == 10), "{s:?}");
        assert!(s.dropped_bytes > 0);
    }

    #[test]
    fn tail_follows_a_new_file_once_the_old_one_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        std::fs::write(&path, frame(Stdout, 1, b"old\n")).unwrap();
        let mut r = RecentOutput::default();
        let mut tail = LogTail::new(path.clone(), "app", false);
        tail.poll(&mut r).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&frame(Stdout, 2, b"last of old\n")).unwrap();
        std::fs::rename(&path, dir.path().join("output.1.log")).unwrap();
        std::fs::write(&path, frame(Stderr, 3, b"new\n")).unwrap();
        tail.poll(&mut r).unwrap();
        tail.poll(&mut r).unwrap();
        let got: Vec<String> = texts(&r).into_iter().map(|t| t.1).collect();
        assert_eq!(got, ["old\n", "last of old\n", "new\n"]);
    }

    #[test]
    fn frames_round_trip_and_bad_headers_are_refused() {
        let f = encode_frame(Stderr, 1_733_000_000_123, b"x\n");
        assert_eq!(f, b"\x1ee 1733000000123 2\nx\n");
        assert_eq!(decode_header(&f), Ok(Some((Stderr, 1_733_000_000_123, 2, f.len() - 2))));
        assert_eq!(decode_header(&f[..5]), Ok(None));
        assert_eq!(decode_header(b"\x1ex 1 2\n"), Err(()));
        assert_eq!(decode_header(b"plain text\n"), Err(()));
        assert_eq!(decode_header(format!("\u{1e}o 1 {}\n", FRAME_MAX + 1).as_bytes()), Err(()));
    }

    #[test]
    fn symlinked_or_linked_logs_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, encode_frame(Stdout, 1, b"root:$6$hash\n")).unwrap();
        for (name, link) in [
            ("symlink", (|a, b| std::os::unix::fs::symlink(a, b)) as fn(&Path, &Path) -> io::Result<()>),
            ("hardlink", |a, b| std::fs::hard_link(a, b)),
        ] {
            let path = dir.path().join(format!("{name}.log"));
            link(&secret, &path).unwrap();
            let mut r = RecentOutput::default();
            let mut tail = LogTail::new(path.clone(), "app", false);
            let err = tail.poll(&mut r).unwrap_err();
            assert!(matches!(err, TailError::NotPlain { .. }), "{name}: {err}");
            assert!(r.is_empty(), "{name}: read {:?}", r.snapshot(0));
            // Refused once, then left alone.
            tail.poll(&mut r).unwrap();
            assert!(r.is_empty());
            std::fs::remove_file(&path).unwrap();
        }
        // The logs endpoint does not follow a symlinked stdout.log either.
        let container = dir.path().join("container");
        std::fs::create_dir(&container).unwrap();
        std::os::unix::fs::symlink(&secret, container.join("stdout.log")).unwrap();
        let read = crate::runtime::logs(&container, crate::runtime::LogStream::Stdout, None);
        assert!(read.is_err(), "read through a symlink: {read:?}");
        // A FIFO is refused without blocking.
        let fifo = dir.path().join("fifo.log");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(matches!(open_log(&fifo), Err(TailError::NotPlain { .. })));
    }
}
