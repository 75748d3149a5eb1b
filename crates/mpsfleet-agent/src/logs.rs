//! The agent's one endpoint: task logs, for the server to fetch on behalf of `task logs`.
//! Only the server may call it, with the token it issued at registration.
//!
//! `GET /v1/logs/{task}?container=C&stream=stdout|stderr|all&tail=BYTES&since_ms=MS`:
//! - `stream=stdout|stderr` without `since_ms`: the tail of that stream as plain text; from
//!   Docker's own log when the container runs on Docker, else from the container's
//!   `stdout.log`/`stderr.log`, else (a Docker container already removed) from its framed
//!   `output.log`.
//! - `stream=all`, or any stream with `since_ms`: decoded from the framed `output.log` (after
//!   the rotated `output.1.log`), which both runtimes write: only frames of the streams asked
//!   for and, with `since_ms`, written strictly after it. `all` answers a JSON array of
//!   [`OutputLine`]s, both streams interleaved in the order written; one stream answers its
//!   text. Header `x-mpsfleet-last-ms` carries the time of the last frame returned (the
//!   `since_ms` asked for when there is none).
//!
//! `tail` counts bytes of output from the end (default and most: [`TAIL_MAX`]); no more than
//! a bounded part of any file is read. Nothing below the tasks dir is followed when it is a
//! link (see [`crate::safe_fs`]): not the task's or the container's directory, not a log.
//!
//! The agent keeps only the SHA-256 digest of the token; the one presented is hashed and the
//! digests compared in constant time.

use crate::docker::{DockerError, DockerRuntime};
use crate::output::{decode_header, open_log_beneath, FRAME_MAX};
use crate::runtime::shim::{OUTPUT_LOG, OUTPUT_LOG_MAX, OUTPUT_LOG_OLD};
use crate::runtime::{logs_beneath, LogStream};
use crate::safe_fs::{read_beneath, Dir};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mpsfleet_types::logs::{tail_boundary, LogStreams, OutputLine, OutputStream};
use mpsfleet_types::{TaskDefinition, TaskId};
use serde::Deserialize;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

/// The most output bytes one answer carries (the server's own limit, `MAX_LOG_TAIL`).
pub const TAIL_MAX: u64 = 16 << 20;

/// The header that carries the time of the last frame in an answer.
pub const LAST_MS_HEADER: &str = "x-mpsfleet-last-ms";

/// The most read of one framed file: a file is rotated once it is past [`OUTPUT_LOG_MAX`],
/// so it holds at most that and one more frame.
const FRAMED_READ_MAX: u64 = OUTPUT_LOG_MAX + 2 * FRAME_MAX as u64;

struct LogsState {
    tasks_dir: PathBuf,
    /// The SHA-256 hex digest of the token the server presents.
    token_sha256: String,
    docker: Option<DockerRuntime>,
}

#[derive(Deserialize)]
struct LogsQuery {
    container: Option<String>,
    stream: Option<String>,
    tail: Option<String>,
    since_ms: Option<String>,
}

/// The logs endpoint; `token_sha256` is the digest ([`token_digest`]) of the token the server
/// presents; `docker` is the runtime to ask first for a container's stdout or stderr when the
/// agent runs tasks on Docker Engine.
pub fn router(tasks_dir: PathBuf, token_sha256: String, docker: Option<DockerRuntime>) -> Router {
    Router::new().route("/v1/logs/{task}", get(task_logs)).with_state(Arc::new(LogsState {
        tasks_dir,
        token_sha256,
        docker,
    }))
}

/// The SHA-256 of a token, in lower-case hex.
pub fn token_digest(token: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `presented` is the token whose digest is `digest`, comparing the digests in
/// constant time; an empty digest matches nothing.
pub fn token_matches(digest: &str, presented: Option<&str>) -> bool {
    let Some(presented) = presented else { return false };
    let got = token_digest(presented);
    if digest.is_empty() || got.len() != digest.len() {
        return false;
    }
    got.bytes().zip(digest.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Whether a request to the agent's endpoint carries the server's token (`Authorization:
/// Bearer`), whose digest is `digest`.
pub fn from_server(digest: &str, headers: &HeaderMap) -> bool {
    let presented =
        headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    token_matches(digest, presented)
}

/// The most read of a task's record.json for its first container's name.
const RECORD_READ_MAX: u64 = 4 << 20;

/// The first container of task `id`'s definition, from its record under `tasks_dir`; None
/// when the task is not known here.
pub(crate) fn first_container(tasks_dir: &FsPath, id: &TaskId) -> Option<String> {
    let record = FsPath::new(&id.to_string()).join("record.json");
    let bytes = read_beneath(tasks_dir, &record, RECORD_READ_MAX).ok().flatten()?;
    #[derive(Deserialize)]
    struct Rec {
        definition: TaskDefinition,
    }
    serde_json::from_slice::<Rec>(&bytes)
        .ok()?
        .definition
        .container_definitions
        .first()
        .map(|c| c.name.clone())
}

fn plain(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

/// A whole-number parameter; the message names it when it is not one.
fn number(name: &str, value: Option<&str>) -> Result<Option<u64>, String> {
    match value {
        None => Ok(None),
        Some(v) => {
            v.parse::<u64>().map(Some).map_err(|_| format!("{name} must be a whole number, got {v:?}"))
        }
    }
}

/// One frame of `output.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    stream: OutputStream,
    at_ms: u64,
    bytes: Vec<u8>,
}

/// What an answer holds, before it becomes a response.
enum Answer {
    Text(Vec<u8>),
    Lines(Vec<OutputLine>),
}

async fn task_logs(
    State(st): State<Arc<LogsState>>,
    headers: HeaderMap,
    Path(task): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Response {
    if !from_server(&st.token_sha256, &headers) {
        return plain(StatusCode::UNAUTHORIZED, "only the server may read logs here".into());
    }
    let Ok(id) = TaskId::parse(&task) else {
        return plain(StatusCode::BAD_REQUEST, format!("bad task id {task:?}"));
    };
    let streams = match q.stream.as_deref().unwrap_or("stdout").parse::<LogStreams>() {
        Ok(s) => s,
        Err(e) => return plain(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let tail = match number("tail", q.tail.as_deref()) {
        Ok(t) => t.unwrap_or(TAIL_MAX),
        Err(e) => return plain(StatusCode::BAD_REQUEST, e),
    };
    if tail == 0 || tail > TAIL_MAX {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("tail must be from 1 to {TAIL_MAX} bytes, got {tail}"),
        );
    }
    let since_ms = match number("since_ms", q.since_ms.as_deref()) {
        Ok(s) => s,
        Err(e) => return plain(StatusCode::BAD_REQUEST, e),
    };
    if !matches!(Dir::open_beneath(&st.tasks_dir, FsPath::new(&id.to_string())), Ok(Some(_))) {
        return plain(StatusCode::NOT_FOUND, format!("task {id} is not known on this host"));
    }
    let container = match q.container.or_else(|| first_container(&st.tasks_dir, &id)) {
        Some(c) => c,
        None => return plain(StatusCode::NOT_FOUND, format!("task {id} is not known on this host")),
    };
    if let Err(e) = mpsfleet_types::check_name("container name", &container) {
        return plain(StatusCode::BAD_REQUEST, e.to_string());
    }
    let tasks_dir = st.tasks_dir.clone();
    let rel = crate::tasks::container_rel(&id, &container);
    let docker = st.docker.clone();
    // A plain thread, not a runtime worker: the Docker runtime blocks on its own runtime.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("logs-read".into()).spawn(move || {
        let read = || -> Result<(Answer, Option<u64>), String> {
            let dir = match Dir::open_beneath(&tasks_dir, &rel) {
                Ok(Some(dir)) => dir,
                Ok(None) => return Err(format!("no container {container:?} of task {id} on this host")),
                Err(e) => return Err(format!("container {container:?} of task {id}: {e} (not followed)")),
            };
            let one = match streams {
                LogStreams::Stdout => Some(LogStream::Stdout),
                LogStreams::Stderr => Some(LogStream::Stderr),
                LogStreams::All => None,
            };
            if let (Some(one), None) = (one, since_ms) {
                if let Some(rt) = &docker {
                    let (out, err) = (one == LogStream::Stdout, one == LogStream::Stderr);
                    match rt.logs(&id.to_string(), &container, out, err, Some(tail)) {
                        Ok(bytes) => return Ok((Answer::Text(bytes), None)),
                        Err(DockerError::Api { status: 404, .. }) => {}
                        Err(e) => {
                            tracing::debug!(task.id = %id, container = %container, error = %e, "docker logs; reading the files")
                        }
                    }
                }
                if !matches!(dir.open_file(one.file_name()), Ok(None)) {
                    return logs_beneath(&tasks_dir, &rel, one, Some(tail))
                        .map(|b| (Answer::Text(b), None))
                        .map_err(|e| e.to_string());
                }
            }
            let chunks = read_frames(&tasks_dir, &rel, streams, since_ms, tail)?;
            let last = chunks.last().map(|c| c.at_ms).or(since_ms);
            let answer = match one {
                Some(_) => Answer::Text(tail_bytes(chunks.into_iter().flat_map(|c| c.bytes).collect(), tail)),
                None => Answer::Lines(tail_lines(to_lines(&container, chunks), tail)),
            };
            Ok((answer, last))
        };
        let _ = tx.send(read());
    });
    if let Err(e) = spawned {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot start a thread to read logs: {e}"));
    }
    let read = rx.await;
    let (answer, last) = match read {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return plain(StatusCode::NOT_FOUND, e),
        Err(_) => {
            return plain(StatusCode::INTERNAL_SERVER_ERROR, "the log reader ended without an answer".into())
        }
    };
    let mut resp = match answer {
        Answer::Text(bytes) => ([("content-type", "text/plain; charset=utf-8")], bytes).into_response(),
        Answer::Lines(lines) => axum::Json(lines).into_response(),
    };
    if let Some(last) = last {
        resp.headers_mut().insert(LAST_MS_HEADER, last.into());
    }
    resp
}

/// The frames of the `output.1.log` then `output.log` of the container dir `root`/`rel` of the
/// streams in `streams`, written after `since_ms` when given, oldest first. The older file is
/// read only when the newer one does not already reach back far enough (past `since_ms`, or
/// `tail` bytes of output). No link below `root` is followed.
fn read_frames(
    root: &FsPath,
    rel: &FsPath,
    streams: LogStreams,
    since_ms: Option<u64>,
    tail: u64,
) -> Result<Vec<Chunk>, String> {
    let keep = |c: &Chunk| streams.includes(c.stream) && since_ms.is_none_or(|s| c.at_ms > s);
    let current = read_framed_file(root, &rel.join(OUTPUT_LOG))?;
    let reaches_back = match (since_ms, current.first()) {
        (_, None) => false,
        (Some(since), Some(first)) => first.at_ms <= since,
        (None, Some(_)) => false,
    };
    let mut out: Vec<Chunk> = current.into_iter().filter(keep).collect();
    let enough = out.iter().map(|c| c.bytes.len() as u64).sum::<u64>() >= tail;
    if !reaches_back && !enough {
        let mut old: Vec<Chunk> =
            read_framed_file(root, &rel.join(OUTPUT_LOG_OLD))?.into_iter().filter(keep).collect();
        old.append(&mut out);
        out = old;
    }
    Ok(out)
}

/// The whole frames in the last [`FRAMED_READ_MAX`] bytes of one framed file; none when it
/// does not exist. Reading that starts mid-file skips to the first frame.
fn read_framed_file(root: &FsPath, rel: &FsPath) -> Result<Vec<Chunk>, String> {
    let path = root.join(rel);
    let Some(mut file) = open_log_beneath(root, rel).map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let io = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let len = file.metadata().map_err(io)?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(FRAMED_READ_MAX))).map_err(io)?;
    let mut buf = Vec::new();
    file.take(FRAMED_READ_MAX).read_to_end(&mut buf).map_err(io)?;
    Ok(decode_frames(&buf))
}

/// Every whole frame in `buf`; bytes that do not start a frame are skipped.
fn decode_frames(buf: &[u8]) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        match decode_header(&buf[at..]) {
            Err(()) => at += 1,
            Ok(None) => break,
            Ok(Some((stream, at_ms, len, head))) => {
                let Some(bytes) = buf.get(at + head..at + head + len) else { break };
                out.push(Chunk { stream, at_ms, bytes: bytes.to_vec() });
                at += head + len;
            }
        }
    }
    out
}

/// The last `tail` bytes.
fn tail_bytes(mut bytes: Vec<u8>, tail: u64) -> Vec<u8> {
    let keep = usize::try_from(tail).unwrap_or(usize::MAX);
    let start = bytes.len().saturating_sub(keep);
    bytes.drain(..start);
    bytes
}

/// Chunks as lines (each with its newline; the last piece of a chunk without one is kept as
/// it is), a character cut between two chunks of a stream kept whole.
fn to_lines(container: &str, chunks: Vec<Chunk>) -> Vec<OutputLine> {
    let mut cut: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut out = Vec::new();
    for c in chunks {
        let slot = match c.stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        };
        let mut bytes = std::mem::take(&mut cut[slot]);
        bytes.extend_from_slice(&c.bytes);
        let complete = match std::str::from_utf8(&bytes) {
            Ok(_) => bytes.len(),
            Err(e) if e.error_len().is_none() && bytes.len() - e.valid_up_to() < 4 => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        cut[slot] = bytes.split_off(complete);
        for piece in String::from_utf8_lossy(&bytes).split_inclusive('\n') {
            out.push(OutputLine {
                at_ms: c.at_ms,
                container: container.to_string(),
                stream: c.stream,
                text: piece.to_string(),
            });
        }
    }
    out
}

/// The newest lines that hold at most `tail` bytes of text; the oldest one kept may be cut to
/// its end (on a character boundary).
fn tail_lines(mut lines: Vec<OutputLine>, tail: u64) -> Vec<OutputLine> {
    let mut total: u64 = lines.iter().map(|l| l.text.len() as u64).sum();
    let mut drop = 0;
    while total > tail && drop < lines.len() {
        let len = lines[drop].text.len() as u64;
        if total - len < tail {
            // Cut this one rather than drop it.
            let keep = usize::try_from(tail - (total - len)).unwrap_or(usize::MAX);
            let line = &mut lines[drop];
            let cut = tail_boundary(&line.text, keep);
            line.text.drain(..cut);
            break;
        }
        total -= len;
        drop += 1;
    }
    lines.drain(..drop);
    lines.retain(|l| !l.text.is_empty());
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::encode_frame;
    use OutputStream::{Stderr, Stdout};

    fn frames(list: &[(OutputStream, u64, &str)]) -> Vec<u8> {
        list.iter().flat_map(|(s, at, t)| encode_frame(*s, *at, t.as_bytes())).collect()
    }

    fn texts(lines: &[OutputLine]) -> Vec<(OutputStream, u64, &str)> {
        lines.iter().map(|l| (l.stream, l.at_ms, l.text.as_str())).collect()
    }

    #[test]
    fn frames_come_back_filtered_by_stream_and_time_across_the_rotation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(OUTPUT_LOG_OLD), frames(&[(Stdout, 1, "a\n"), (Stderr, 2, "b\n")]))
            .unwrap();
        std::fs::write(dir.path().join(OUTPUT_LOG), frames(&[(Stdout, 3, "c\nd\n"), (Stderr, 4, "e")]))
            .unwrap();
        let here = FsPath::new("");
        let all = read_frames(dir.path(), here, LogStreams::All, None, TAIL_MAX).unwrap();
        let lines = to_lines("app", all);
        assert_eq!(
            texts(&lines),
            vec![
                (Stdout, 1, "a\n"),
                (Stderr, 2, "b\n"),
                (Stdout, 3, "c\n"),
                (Stdout, 3, "d\n"),
                (Stderr, 4, "e")
            ]
        );
        assert!(lines.iter().all(|l| l.container == "app"));
        // Strictly after since_ms; the old file is not needed once the new one reaches back.
        let later = read_frames(dir.path(), here, LogStreams::All, Some(3), TAIL_MAX).unwrap();
        assert_eq!(later, vec![Chunk { stream: Stderr, at_ms: 4, bytes: b"e".to_vec() }]);
        let later = read_frames(dir.path(), here, LogStreams::Stderr, Some(1), TAIL_MAX).unwrap();
        assert_eq!(later.iter().map(|c| c.at_ms).collect::<Vec<_>>(), [2, 4]);
        let out = read_frames(dir.path(), here, LogStreams::Stdout, None, TAIL_MAX).unwrap();
        assert_eq!(out.into_iter().flat_map(|c| c.bytes).collect::<Vec<_>>(), b"a\nc\nd\n");
        // Nothing there yet.
        let empty = tempfile::tempdir().unwrap();
        assert!(read_frames(empty.path(), here, LogStreams::All, Some(0), 10).unwrap().is_empty());
    }

    #[test]
    fn the_token_is_checked_against_its_digest() {
        let digest = token_digest("mpsf_agt_1");
        assert_eq!(digest.len(), 64);
        assert_eq!(digest, token_digest("mpsf_agt_1"));
        assert!(token_matches(&digest, Some("mpsf_agt_1")));
        assert!(!token_matches(&digest, Some("mpsf_agt_2")));
        assert!(!token_matches(&digest, Some(&digest)), "the digest itself is no token");
        assert!(!token_matches(&digest, None));
        assert!(!token_matches("", Some("")));
        assert!(!token_matches("", Some("x")));
    }

    #[test]
    fn numbers_name_their_parameter() {
        assert_eq!(number("tail", None), Ok(None));
        assert_eq!(number("tail", Some("12")), Ok(Some(12)));
        assert_eq!(
            number("since_ms", Some("-1")),
            Err(r#"since_ms must be a whole number, got "-1""#.into())
        );
    }

    #[test]
    fn reading_mid_file_finds_the_next_frame() {
        let mut buf = b"garbage \x1eo 1 2\n".to_vec();
        buf.truncate(buf.len() - 3); // a header cut short
        buf.extend(frames(&[(Stdout, 5, "x\n")]));
        let mut cut = frames(&[(Stderr, 6, "half")]);
        cut.truncate(cut.len() - 2);
        buf.extend(cut);
        assert_eq!(decode_frames(&buf), vec![Chunk { stream: Stdout, at_ms: 5, bytes: b"x\n".to_vec() }]);
    }

    #[test]
    fn tails_keep_the_newest_bytes_and_whole_characters() {
        assert_eq!(tail_bytes(b"hello".to_vec(), 3), b"llo");
        assert_eq!(tail_bytes(b"hi".to_vec(), 30), b"hi");
        let line = |s, t: &str| OutputLine { at_ms: 1, container: "c".into(), stream: s, text: t.into() };
        let lines = vec![line(Stdout, "one\n"), line(Stderr, "héllo\n"), line(Stdout, "x\n")];
        assert_eq!(texts(&tail_lines(lines.clone(), 100)).len(), 3);
        assert_eq!(texts(&tail_lines(lines.clone(), 9)), vec![(Stderr, 1, "héllo\n"), (Stdout, 1, "x\n")]);
        assert_eq!(texts(&tail_lines(lines.clone(), 8)), vec![(Stderr, 1, "éllo\n"), (Stdout, 1, "x\n")]);
        // Cutting into "é" keeps the character whole by keeping less.
        assert_eq!(texts(&tail_lines(lines.clone(), 7)), vec![(Stderr, 1, "llo\n"), (Stdout, 1, "x\n")]);
        assert_eq!(texts(&tail_lines(lines, 2)), vec![(Stdout, 1, "x\n")]);
    }

    #[test]
    fn a_character_split_between_chunks_stays_whole() {
        let e = "é".as_bytes();
        let chunks = vec![
            Chunk { stream: Stdout, at_ms: 1, bytes: [b"h".as_slice(), &e[..1]].concat() },
            Chunk { stream: Stderr, at_ms: 2, bytes: b"!\n".to_vec() },
            Chunk { stream: Stdout, at_ms: 3, bytes: [&e[1..], b"\n".as_slice()].concat() },
        ];
        let lines = to_lines("c", chunks);
        assert_eq!(texts(&lines), vec![(Stdout, 1, "h"), (Stderr, 2, "!\n"), (Stdout, 3, "é\n")]);
    }
}
