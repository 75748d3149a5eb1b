//! What `bench soak` measures with: its faults, the `/proc` sampler that catches a task running
//! twice, and the fleet's files.

use mpsfleet_client::Client;
use mpsfleet_types::{FailureKind, HostId, HostView, ResumptionBoundary};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the sampler reads `/proc`: four looks a second catch a copy that lasts one.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    AgentKill,
    AgentStop,
    DaemonKill,
    DaemonHang,
    ServerKill,
    DockerRestart,
    DiskFull,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::AgentKill => "agent-kill",
            FaultKind::AgentStop => "agent-stop",
            FaultKind::DaemonKill => "daemon-kill",
            FaultKind::DaemonHang => "daemon-hang",
            FaultKind::ServerKill => "server-kill",
            FaultKind::DockerRestart => "docker-restart",
            FaultKind::DiskFull => "disk-full",
        }
    }

    /// The failure whose stated bound the recovery is held to; None where the pool states none.
    pub fn failure(self) -> Option<FailureKind> {
        match self {
            FaultKind::AgentKill | FaultKind::AgentStop => Some(FailureKind::AgentLost),
            FaultKind::DaemonKill => Some(FailureKind::DaemonExit),
            FaultKind::DaemonHang => Some(FailureKind::DaemonHang),
            FaultKind::ServerKill | FaultKind::DockerRestart | FaultKind::DiskFull => None,
        }
    }
}

/// One injected fault and what followed it.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    pub host: HostId,
    pub hostname: String,
    pub at_ms: u64,
    /// How long a SIGSTOP or a full disk was held.
    pub held_ms: Option<u64>,
    pub gpu: Option<u32>,
    /// From the fault to every service back at its replicas on live hosts.
    pub settled_ms: Option<u64>,
    /// The stated total bound for its kind, plus the time it was held.
    pub bound_ms: Option<u64>,
    pub incidents: usize,
    pub causes: Vec<String>,
    pub note: Option<String>,
}

impl Fault {
    pub fn new(kind: FaultKind, host: &HostView, at_ms: u64) -> Fault {
        Fault {
            kind,
            host: host.id.clone(),
            hostname: host.hostname.clone(),
            at_ms,
            held_ms: None,
            gpu: None,
            settled_ms: None,
            bound_ms: None,
            incidents: 0,
            causes: Vec::new(),
            note: None,
        }
    }

    pub fn describe(&self) -> String {
        let target = match (self.kind, self.gpu) {
            (FaultKind::ServerKill | FaultKind::DockerRestart, _) => String::new(),
            (FaultKind::DiskFull, _) => " on the hosts' disk".to_owned(),
            (_, Some(g)) => format!(" on host {} GPU {g}", self.host),
            _ => format!(" on host {}", self.host),
        };
        let held = self.held_ms.map_or(String::new(), |ms| format!(" for {ms} ms"));
        let note = self.note.as_ref().map_or(String::new(), |n| format!(" ({n})"));
        format!("{}{target}{held}{note}", self.kind.name())
    }
}

/// The broken invariants, with when they were seen.
#[derive(Clone, Default)]
pub struct Violations(Arc<Mutex<Vec<String>>>);

impl Violations {
    pub fn add(&self, what: String) {
        let at = super::recovery::epoch_ms();
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(format!("at {at}: {what}"));
    }

    pub fn list(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Which tasks belong to a fenced service, and how many replicas it has; the soak's loop
/// refreshes it from the API.
#[derive(Default)]
struct Fenced {
    tasks: BTreeMap<String, String>,
    replicas: BTreeMap<String, usize>,
}

/// Reads `/proc` every [`SAMPLE_EVERY`]: a task with two live processes, or a fenced service
/// with more live processes than replicas, is a violation the moment it is seen.
pub struct Sampler {
    fenced: Arc<Mutex<Fenced>>,
    stop: Arc<AtomicBool>,
    max_copies: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub fn start(hosts_dir: PathBuf, violations: Violations) -> Sampler {
        let fenced = Arc::new(Mutex::new(Fenced::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let max_copies = Arc::new(AtomicUsize::new(0));
        let (f, s, m) = (fenced.clone(), stop.clone(), max_copies.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                sample(&hosts_dir, &f, &m, &violations);
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        Sampler { fenced, stop, max_copies, thread: Some(thread) }
    }

    /// Learns the fenced services' tasks (errors leave the last known ones).
    pub async fn watch(&self, admin: &Client, services: &[(&str, ResumptionBoundary, u32)]) {
        let Ok(tasks) = admin.list_tasks(&Default::default()).await else { return };
        let mut f = self.fenced.lock().unwrap_or_else(|p| p.into_inner());
        for (name, _, replicas) in services.iter().filter(|s| s.1 == ResumptionBoundary::Fenced) {
            f.replicas.insert(name.to_string(), *replicas as usize);
            for t in tasks.iter().filter(|t| t.group.as_ref().is_some_and(|g| g.as_str() == *name)) {
                f.tasks.insert(t.id.to_string(), name.to_string());
            }
        }
    }

    /// Stops sampling; the most live processes a fenced service had at once.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max_copies.load(Ordering::Relaxed)
    }
}

/// One look at `/proc`: each shim under the hosts' directory names its task; the shim's live
/// child is the task's process.
fn sample(hosts_dir: &Path, fenced: &Mutex<Fenced>, max_copies: &AtomicUsize, violations: &Violations) {
    let procs = mpsfleet_proc::processes();
    let mut shims: BTreeMap<u32, String> = BTreeMap::new();
    for (pid, st) in &procs {
        if st.is_dead() {
            continue;
        }
        let Some(cmd) = mpsfleet_proc::cmdline(*pid) else { continue };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if !args.iter().any(|a| *a == b"shim") {
            continue;
        }
        let dir = args
            .windows(2)
            .find(|w| w[0] == b"--dir")
            .map(|w| Path::new(std::str::from_utf8(w[1]).unwrap_or("")));
        if let Some(task) = dir.filter(|d| d.starts_with(hosts_dir)).and_then(task_of) {
            shims.insert(*pid, task);
        }
    }
    let mut copies: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (pid, st) in &procs {
        if let Some(task) = shims.get(&st.ppid).filter(|_| !st.is_dead()) {
            copies.entry(task).or_default().push(*pid);
        }
    }
    for (task, pids) in &copies {
        if pids.len() > 1 {
            violations.add(format!("task {task} runs {} copies: {pids:?}", pids.len()));
        }
    }
    let f = fenced.lock().unwrap_or_else(|p| p.into_inner());
    let mut per_service: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for (task, pids) in &copies {
        if let Some(service) = f.tasks.get(*task) {
            per_service.entry(service).or_default().extend(pids);
        }
    }
    for (service, pids) in per_service {
        max_copies.fetch_max(pids.len(), Ordering::Relaxed);
        let replicas = f.replicas.get(service).copied().unwrap_or(0);
        if pids.len() > replicas {
            violations.add(format!(
                "fenced service {service} has {} live copies for {replicas} replicas: {pids:?}",
                pids.len()
            ));
        }
    }
}

/// `…/<task id>/containers/<name>` → the task id.
fn task_of(dir: &Path) -> Option<String> {
    let parts: Vec<_> = dir.components().collect();
    let i = parts.iter().rposition(|c| c.as_os_str() == "containers")?;
    Some(parts.get(i.checked_sub(1)?)?.as_os_str().to_string_lossy().into_owned())
}

/// Live processes whose command line or environment names `dir` (or a path below it), with
/// their command lines.
pub fn processes_of(dir: &Path) -> Vec<(u32, String)> {
    mpsfleet_proc::processes()
        .into_iter()
        .filter(|(pid, st)| !st.is_dead() && mpsfleet_proc::mentions(*pid, dir))
        .map(|(pid, _)| {
            let cmd = mpsfleet_proc::cmdline(pid).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmd).replace('\0', " ").trim().to_owned())
        })
        .collect()
}

/// Fills the file system of `dir` until `leave` bytes are free; returns the file to remove.
pub fn fill_disk(dir: &Path, leave: u64) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    let st = nix::sys::statvfs::statvfs(dir)?;
    let free = st.blocks_available() * st.fragment_size();
    let path = dir.join(".soak-fill");
    let mut file = std::fs::File::create(&path)?;
    let chunk = vec![0u8; 4 << 20];
    let mut left = free.saturating_sub(leave);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if file.write_all(&chunk[..n]).is_err() {
            break; // full already: what the fault is
        }
        left -= n as u64;
    }
    Ok(path)
}

/// The bytes of every file under `dir` (symbolic links not followed).
pub fn data_dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => data_dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shims_directory_names_its_task() {
        let dir = Path::new("/tmp/s/server/hosts/h1/tasks/t-00000000000000a1/containers/main");
        assert_eq!(task_of(dir).as_deref(), Some("t-00000000000000a1"));
        assert_eq!(task_of(Path::new("/tmp/x")), None);
    }

    /// A stand-in shim (a shell whose arguments are a shim's) with two live children: the
    /// sampler sees the task run twice, and a fenced service over its replicas.
    #[test]
    fn the_sampler_sees_a_task_running_twice() {
        let tmp = std::env::temp_dir().join(format!("soak-probe-{}", std::process::id()));
        let dir = tmp.join("hosts/h1/tasks/t-00000000000000a1/containers/main");
        let mut shim = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & sleep 60 & wait", "shim", "--dir"])
            .arg(&dir)
            .spawn()
            .expect("sh");
        let violations = Violations::default();
        let fenced = Mutex::new(Fenced::default());
        {
            let mut f = fenced.lock().unwrap();
            f.tasks.insert("t-00000000000000a1".into(), "pinned".into());
            f.replicas.insert("pinned".into(), 1);
        }
        let max = AtomicUsize::new(0);
        for _ in 0..100 {
            sample(&tmp.join("hosts"), &fenced, &max, &violations);
            if !violations.list().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::process::Command::new("pkill").args(["-P", &shim.id().to_string()]).status();
        let _ = shim.kill();
        let _ = shim.wait();
        let all = violations.list().join("\n");
        assert!(all.contains("task t-00000000000000a1 runs 2 copies"), "{all}");
        assert!(all.contains("fenced service pinned has 2 live copies for 1 replicas"), "{all}");
        assert_eq!(max.load(Ordering::Relaxed), 2);
    }
}
