//! The framed copy of a container's output (`output.log`, as the shim writes it for process
//! containers): where a restarted follower picks up, and the size-capped writer.

use crate::output::{decode_header, encode_frame};
use crate::runtime::shim::{OUTPUT_LOG, OUTPUT_LOG_MAX, OUTPUT_LOG_OLD};
use mpsfleet_types::logs::OutputStream;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where a full `path` goes: `output.1.log` next to an `output.log`, else `<name>.1`.
pub fn rotated_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name == OUTPUT_LOG {
        path.with_file_name(OUTPUT_LOG_OLD)
    } else {
        path.with_file_name(format!("{name}.1"))
    }
}

/// The time of the last whole frame in `path`, if any.
pub fn last_frame_at(path: &Path) -> Option<u64> {
    let buf = std::fs::read(path).ok()?;
    let mut at = None;
    let mut pos = 0;
    while pos < buf.len() {
        match decode_header(&buf[pos..]) {
            Ok(Some((_, at_ms, len, head))) if pos + head + len <= buf.len() => {
                at = Some(at_ms);
                pos += head + len;
            }
            // A torn frame at the end, or bytes that are not a frame: look for the next mark.
            _ => match buf[pos + 1..].iter().position(|&b| b == 0x1e) {
                Some(next) => pos += 1 + next,
                None => break,
            },
        }
    }
    at
}

/// The time of the last frame written for a container, looking at the rotated file when the
/// current one is empty.
pub fn resume_point(path: &Path) -> Option<u64> {
    last_frame_at(path).or_else(|| last_frame_at(&rotated_path(path)))
}

/// Appends frames to `output.log`, starting it again (the full one becomes the rotated file)
/// once it is past [`OUTPUT_LOG_MAX`], as the shim's relay does.
pub struct FramedWriter {
    path: PathBuf,
    file: File,
    len: u64,
}

impl FramedWriter {
    pub fn open(path: PathBuf) -> std::io::Result<FramedWriter> {
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let len = file.metadata()?.len();
        Ok(FramedWriter { path, file, len })
    }

    pub fn append(&mut self, stream: OutputStream, at_ms: u64, bytes: &[u8]) -> std::io::Result<()> {
        let frame = encode_frame(stream, at_ms, bytes);
        self.file.write_all(&frame)?;
        self.len += frame.len() as u64;
        if self.len > OUTPUT_LOG_MAX {
            self.rotate()?;
        }
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        std::fs::rename(&self.path, rotated_path(&self.path))?;
        self.file = OpenOptions::new().append(true).create_new(true).open(&self.path)?;
        self.len = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_point_and_rotation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(OUTPUT_LOG);
        assert_eq!(resume_point(&path), None);
        let mut w = FramedWriter::open(path.clone()).expect("open");
        w.append(OutputStream::Stdout, 10, b"a").expect("append");
        w.append(OutputStream::Stderr, 20, b"b").expect("append");
        assert_eq!(resume_point(&path), Some(20));
        // A torn frame at the end is ignored.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"\x1eo 30 100\nabc"))
            .expect("torn");
        assert_eq!(resume_point(&path), Some(20));
        let chunk = vec![b'x'; 60 << 10];
        let mut w = FramedWriter::open(path.clone()).expect("open");
        for i in 0..20 {
            w.append(OutputStream::Stdout, 100 + i, &chunk).expect("append");
        }
        assert!(dir.path().join(OUTPUT_LOG_OLD).exists());
        assert!(std::fs::metadata(&path).expect("meta").len() <= OUTPUT_LOG_MAX);
        assert_eq!(resume_point(&path), Some(119));
    }
}
