//! This machine as `/proc` shows it, the one place it is read: is a pid still the process that
//! was recorded, which session and process group it is in, whether its command line or
//! environment names a path, how much CPU and memory it used, which users run processes, and
//! the host name. The agent uses it to adopt its tasks; the server's `local` capacity
//! provider to find and end everything a local host ran; the benchmarks to measure processes.
//! [`child`] runs one child
//! process under a hard timeout, for the agent (MPS control commands, exec probes) and the
//! server (exec provider commands) alike.

pub mod child;

pub use child::{ChildError, Limits, Outcome};

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The parts of `/proc/PID/stat` that are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: R, S, D, Z, T, ...
    pub state: char,
    /// Field 4.
    pub ppid: u32,
    /// Field 5: the process group.
    pub pgid: u32,
    /// Field 6: the session.
    pub sid: u32,
    /// Fields 14 and 15: CPU time in user and kernel mode, in clock ticks.
    pub utime: u64,
    pub stime: u64,
    /// Field 22: start time in clock ticks since boot; with the pid it names one process.
    pub start_time: u64,
}

impl ProcStat {
    /// Exited (a zombie holds nothing but its exit status).
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Reads `/proc/PID/stat`; None when there is no such process (or it cannot be parsed).
pub fn stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may itself hold spaces and parentheses,
    // so the fields are counted from after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    let sid = fields.next()?.parse().ok()?;
    // After the session (field 6), fields 14 and 15 are the 8th and 9th, field 22 the 16th.
    let utime = fields.nth(7)?.parse().ok()?;
    let stime = fields.next()?.parse().ok()?;
    let start_time = fields.nth(6)?.parse().ok()?;
    Some(ProcStat { state, ppid, pgid, sid, utime, stime, start_time })
}

/// What became of a recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Running (or stopped), and the start time matches.
    Alive,
    /// Exited, but its parent has not collected the status yet.
    Zombie,
    /// No such process.
    Gone,
    /// The pid now belongs to another process.
    Reused { start_time: u64 },
}

pub fn liveness(pid: u32, start_time: u64) -> Liveness {
    match stat(pid) {
        None => Liveness::Gone,
        Some(s) if s.start_time != start_time => Liveness::Reused { start_time: s.start_time },
        Some(s) if s.is_dead() => Liveness::Zombie,
        Some(_) => Liveness::Alive,
    }
}

/// Every process now in `/proc` (this one included), with its stat; processes that exit
/// while the table is read are left out.
pub fn processes() -> Vec<(u32, ProcStat)> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect()
}

/// This machine's host name (`/proc/sys/kernel/hostname`), if it has one.
pub fn hostname() -> Option<String> {
    let name = fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// The effective uids of every process now (the owners of `/proc/PID`).
pub fn process_uids() -> std::collections::BTreeSet<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir("/proc") else { return Default::default() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

/// The command line of `pid`, its arguments joined by NULs; None when it is gone.
pub fn cmdline(pid: u32) -> Option<Vec<u8>> {
    fs::read(format!("/proc/{pid}/cmdline")).ok()
}

/// This machine's memory in KiB (`MemTotal` of `/proc/meminfo`).
pub fn memory_total_kib() -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, "MemTotal")
}

/// The KiB figure of the `FIELD:` line of a `/proc` status-like text.
fn kib_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A `Vm…:` line of `/proc/PID/status` (this process's when `pid` is None), in KiB: `VmRSS`
/// now, `VmHWM` its high-water mark.
pub fn vm_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    kib_field(&fs::read_to_string(path).ok()?, field)
}

/// Whether the command line or the environment of `pid` names `path` or a path below it: an
/// argument (or the value of a `--flag=` argument or a `NAME=` variable) that is `path` or
/// starts with `path/`. `/a/host-1` is not mentioned by `/a/host-10`. False when the process
/// is gone or its environment cannot be read (another user's).
pub fn mentions(pid: u32, path: &Path) -> bool {
    let path = path.as_os_str().as_bytes();
    ["cmdline", "environ"].iter().any(|file| {
        fs::read(format!("/proc/{pid}/{file}"))
            .is_ok_and(|text| text.split(|b| *b == 0).any(|item| names(item, path)))
    })
}

fn names(item: &[u8], path: &[u8]) -> bool {
    let under = |s: &[u8]| s.strip_prefix(path).is_some_and(|rest| rest.is_empty() || rest[0] == b'/');
    under(item) || item.iter().position(|b| *b == b'=').is_some_and(|eq| under(&item[eq + 1..]))
}

/// The environment variable that asks `mpsfleet agent` to start its own session
/// ([`start_session_if_asked`]), so that everything it starts can be found by session id.
pub const NEW_SESSION_ENV: &str = "MPSFLEET_NEW_SESSION";

/// When [`NEW_SESSION_ENV`] is `1`, makes this process the leader of a new session (and
/// process group), detached from any terminal: the processes it starts, and theirs, share its
/// session id even after it has exited. Returns whether it now leads a session.
pub fn start_session_if_asked() -> Result<bool, nix::Error> {
    if std::env::var_os(NEW_SESSION_ENV).as_deref() != Some(OsStr::new("1")) {
        return Ok(false);
    }
    match nix::unistd::setsid() {
        Ok(_) => Ok(true),
        // Already a process group leader: only a session leader may be one, or a process
        // started with a group of its own; either way there is nothing to detach from here.
        Err(nix::Error::EPERM) => Ok(nix::unistd::getsid(None)? == nix::unistd::getpid()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let line = "1234 (a b) c)) S 1 1234 1230 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                state: 'S',
                ppid: 1,
                pgid: 1234,
                sid: 1230,
                utime: 1,
                stime: 2,
                start_time: 987654
            })
        );
        assert_eq!(parse_stat("1 (x) Z 0"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_process_has_a_command_line_memory_and_an_owner() {
        let me = std::process::id();
        assert!(cmdline(me).is_some_and(|c| !c.is_empty()));
        let rss = vm_kib(Some(me), "VmRSS").expect("VmRSS");
        assert!(rss > 0 && vm_kib(None, "VmHWM").expect("VmHWM") >= rss);
        assert_eq!(vm_kib(None, "VmNoSuchField"), None);
        use std::os::unix::fs::MetadataExt;
        assert!(process_uids().contains(&fs::metadata("/proc/self").unwrap().uid()));
        assert!(hostname().is_none_or(|h| !h.is_empty() && h == h.trim()));
    }

    #[test]
    fn own_process_is_alive() {
        let me = std::process::id();
        let s = stat(me).expect("own stat");
        assert_eq!(liveness(me, s.start_time), Liveness::Alive);
        assert_eq!(liveness(me, s.start_time + 1), Liveness::Reused { start_time: s.start_time });
        assert_eq!(s.sid, nix::unistd::getsid(None).unwrap().as_raw() as u32);
        // The state letter may change between two readings; the identity does not.
        assert!(processes()
            .iter()
            .any(|(pid, p)| *pid == me && (p.sid, p.start_time) == (s.sid, s.start_time)));
    }

    #[test]
    fn mentions_whole_path_components_only() {
        for (item, path, expected) in [
            ("/a/host-1", "/a/host-1", true),
            ("/a/host-1/tasks/7", "/a/host-1", true),
            ("--data-dir=/a/host-1", "/a/host-1", true),
            ("CUDA_MPS_PIPE_DIRECTORY=/a/host-1/mps/0", "/a/host-1", true),
            ("/a/host-10", "/a/host-1", false),
            ("X=/a/host-10/y", "/a/host-1", false),
            ("/a", "/a/host-1", false),
            ("", "/a/host-1", false),
        ] {
            assert_eq!(names(item.as_bytes(), path.as_bytes()), expected, "{item} names {path}");
        }
        let child = std::process::Command::new("sleep")
            .arg("30")
            .env("MPSFLEET_PROC_TEST", "/tmp/mpsfleet-proc-test/x")
            .spawn()
            .expect("start sleep");
        let pid = child.id();
        // Until it has exec'd, the child's environment is still this test's.
        let seen = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            mentions(pid, Path::new("/tmp/mpsfleet-proc-test"))
        });
        assert!(seen, "the variable naming /tmp/mpsfleet-proc-test/x was not seen");
        assert!(!mentions(pid, Path::new("/tmp/mpsfleet-proc")));
        let mut child = child;
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!mentions(pid, Path::new("/tmp/mpsfleet-proc-test")), "a reaped process mentions nothing");
    }
}
