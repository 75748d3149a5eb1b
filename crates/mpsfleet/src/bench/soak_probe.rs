//! What `bench soak` measures with: its faults, their schedule and how each is injected (the
//! server it kills and restarts among them), the `/proc` sampler that records every copy of
//! every task (processes and Docker containers alike), and the fleet's files. What the
//! records are judged by is in `soak_judge`.

use super::recovery::epoch_ms;
use super::soak_faults::*;
use super::soak_judge::{Copy, Observation};
use anyhow::{Context, Result};
use mpsfleet_types::HostView;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the sampler reads `/proc`: four looks a second catch a copy that lasts one.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The variable every task of the soak carries: `<run dir>/service/<service>`. It names the
/// run (two soaks on one machine never read each other's tasks) and the service, so a copy is
/// known for what it is the moment it is seen, whoever started it; being a path under the run
/// dir, it also lets the clean-up find a container's processes.
pub const SERVICE_ENV: &str = "MPSFLEET_SOAK_SERVICE";
/// The variable the agent gives every task's processes (and containers): its task id.
const TASK_ENV: &str = "MPSFLEET_TASK_ID";

/// A planned kind that found no target this many times is given up (and reported).
pub const MAX_MISSES: u32 = 3;

/// Which fault comes next: first every planned kind once, in an order drawn from the seed (a
/// kind that found no target is drawn again, up to [`MAX_MISSES`] times), so a run of any length
/// judges every kind; then kinds at random while there is time.
pub struct Schedule {
    pub planned: Vec<FaultKind>,
    owed: Vec<FaultKind>,
    misses: BTreeMap<FaultKind, u32>,
}

impl Schedule {
    pub fn new(planned: Vec<FaultKind>, rng: &mut super::Rng) -> Schedule {
        let mut owed = planned.clone();
        for i in (1..owed.len()).rev() {
            owed.swap(i, rng.below(i as u64 + 1) as usize);
        }
        Schedule { planned, owed, misses: BTreeMap::new() }
    }

    /// The next kind; None once every kind was judged and there is no time left.
    pub fn next(&mut self, rng: &mut super::Rng, time_left: bool) -> Option<FaultKind> {
        if let Some(&k) = self.owed.first() {
            return Some(k);
        }
        (time_left && !self.planned.is_empty())
            .then(|| self.planned[rng.below(self.planned.len() as u64) as usize])
    }

    pub fn record(&mut self, kind: FaultKind, happened: bool) {
        let misses = self.misses.entry(kind).or_default();
        if !happened {
            *misses += 1;
        }
        if happened || *misses >= MAX_MISSES {
            self.owed.retain(|k| *k != kind);
        }
    }
}

/// The value of [`SERVICE_ENV`] for `service`'s tasks in the run at `dir`.
pub fn service_tag(dir: &Path, service: &str) -> String {
    format!("{}/service/{service}", dir.display())
}

/// One look at `/proc`: every live process of the run's tasks whose parent is not the same
/// task's (a task's shim or a container's init, with what they started below them), with its
/// service and task. A Docker container is found as a process is: its init carries the
/// task's environment.
pub fn scan(dir: &Path) -> Vec<Copy> {
    let prefix = format!("{SERVICE_ENV}={}", service_tag(dir, ""));
    let procs = mpsfleet_proc::processes();
    let mut tagged: BTreeMap<u32, (String, String)> = BTreeMap::new();
    for (pid, st) in &procs {
        if st.is_dead() {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let (mut service, mut task) = (None, None);
        for item in env.split(|b| *b == 0) {
            let item = String::from_utf8_lossy(item);
            if let Some(s) = item.strip_prefix(&prefix) {
                service = Some(s.to_owned());
            } else if let Some(t) = item.strip_prefix(TASK_ENV).and_then(|t| t.strip_prefix('=')) {
                task = Some(t.to_owned());
            }
        }
        if let (Some(s), Some(t)) = (service, task) {
            tagged.insert(*pid, (s, t));
        }
    }
    let parent: BTreeMap<u32, u32> = procs.iter().map(|(pid, st)| (*pid, st.ppid)).collect();
    let mut copies: Vec<Copy> = tagged
        .iter()
        .filter(|(pid, tag)| parent.get(pid).and_then(|pp| tagged.get(pp)) != Some(tag))
        .map(|(pid, (service, task))| Copy { service: service.clone(), task: task.clone(), pid: *pid })
        .collect();
    copies.sort();
    copies
}

/// Reads `/proc` every [`SAMPLE_EVERY`] and records what it saw: a new [`Observation`] each
/// time the set of copies changes, the last one stretched while it does not.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(Vec<Observation>, u64)>>,
}

impl Sampler {
    pub fn start(dir: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut seen, mut samples): (Vec<Observation>, u64) = (Vec::new(), 0);
            while !s.load(Ordering::Relaxed) {
                let copies = scan(&dir);
                let now = epoch_ms();
                samples += 1;
                match seen.last_mut() {
                    Some(last) if last.copies == copies => last.to_ms = now,
                    _ => seen.push(Observation { from_ms: now, to_ms: now, copies }),
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            (seen, samples)
        });
        Sampler { stop, thread: Some(thread) }
    }

    /// Stops sampling; what it saw, and how many looks it took.
    pub fn stop(mut self) -> (Vec<Observation>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

/// The server, restartable on its port and data dir.
pub struct ServerProc {
    child: std::process::Child,
    listen: String,
    data: PathBuf,
    agent_args: String,
}

impl ServerProc {
    pub fn start(data: &Path, listen: &str, agent_args: &str) -> Result<(ServerProc, String)> {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["server", "--listen", listen, "--local-agent-args", agent_args, "--data-dir"])
            .arg(data)
            .env("MPSFLEET_LOG", std::env::var("MPSFLEET_LOG").unwrap_or_else(|_| "error".into()))
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("no server output")?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("mpsfleet server listening on ").map(str::to_string))
            .context("the server did not start")?;
        std::thread::spawn(move || lines.for_each(drop));
        let listen = url.trim_start_matches("https://").to_owned();
        Ok((ServerProc { child, listen, data: data.to_path_buf(), agent_args: agent_args.into() }, url))
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let (again, _) = ServerProc::start(&self.data, &self.listen, &self.agent_args)?;
        *self = again;
        Ok(())
    }
}

/// Injects `fault` (into `host` for a host's fault); one that finds nothing to hit says so in
/// its target.
pub async fn inject(
    fault: &mut Fault,
    host: Option<&HostView>,
    server: &mut ServerProc,
    hosts_dir: &Path,
    restart_docker: Option<&str>,
    rng: &mut super::Rng,
) -> Result<()> {
    let host_dir = hosts_dir.join(host.map_or("", |h| h.hostname.as_str()));
    let hold = Duration::from_millis(3_000 + rng.below(22_000));
    let started = epoch_ms();
    match fault.kind {
        FaultKind::AgentKill | FaultKind::AgentStop => {
            let agent = processes_of(&host_dir).into_iter().find(|(_, cmd)| cmd.contains(" agent "));
            let Some((pid, _)) = agent else {
                fault.target = Target::Missed(format!("no agent process under {}", host_dir.display()));
                return Ok(());
            };
            kill_or_pause(pid, fault.kind == FaultKind::AgentKill, hold, fault).await;
        }
        FaultKind::DaemonKill | FaultKind::DaemonHang => {
            let gpu = rng.below(2);
            let record = host_dir.join(format!("mps/log/{gpu}/daemon.json"));
            let pid = std::fs::read(&record)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["pid"].as_u64())
                .and_then(|p| u32::try_from(p).ok())
                .filter(|&p| {
                    mpsfleet_proc::cmdline(p)
                        .is_some_and(|c| String::from_utf8_lossy(&c).contains("mps-control"))
                });
            let Some(pid) = pid else {
                fault.target = Target::Missed(format!("no live daemon in {}", record.display()));
                return Ok(());
            };
            if let Target::Host { gpu: g, .. } = &mut fault.target {
                *g = Some(gpu as u32);
            }
            kill_or_pause(pid, fault.kind == FaultKind::DaemonKill, hold, fault).await;
        }
        FaultKind::ServerKill => {
            server.kill();
            tokio::time::sleep(Duration::from_millis(500 + rng.below(2_500))).await;
            server.restart()?;
            fault.held_ms = Some(epoch_ms() - started);
        }
        FaultKind::DockerRestart => {
            let cmd = restart_docker.unwrap_or("true");
            let ok = std::process::Command::new("sh").args(["-c", cmd]).status().is_ok_and(|s| s.success());
            anyhow::ensure!(ok, "--restart-docker failed: {cmd}");
            fault.held_ms = Some(epoch_ms() - started);
        }
        FaultKind::DiskFull => {
            let filler = fill_disk(hosts_dir, 1 << 20)?;
            tokio::time::sleep(hold).await;
            let _ = std::fs::remove_file(filler);
            fault.held_ms = Some(epoch_ms() - started);
        }
    }
    Ok(())
}

/// SIGKILL, or SIGSTOP held for `hold` and then SIGCONT.
async fn kill_or_pause(pid: u32, kill: bool, hold: Duration, fault: &mut Fault) {
    use nix::sys::signal::Signal;
    if kill {
        signal(pid, Signal::SIGKILL);
    } else {
        signal(pid, Signal::SIGSTOP);
        tokio::time::sleep(hold).await;
        signal(pid, Signal::SIGCONT);
        fault.held_ms = Some(hold.as_millis() as u64);
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
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

    /// Every kind is drawn once, in the seed's order, before any is drawn again; a kind that
    /// found no target is drawn again until it gives up; with no time left the run ends.
    #[test]
    fn the_schedule_owes_every_planned_kind_once() {
        let planned = vec![FaultKind::AgentKill, FaultKind::DaemonKill, FaultKind::DiskFull];
        let mut rng = super::super::Rng(7);
        let mut s = Schedule::new(planned.clone(), &mut rng);
        let mut drawn = Vec::new();
        while let Some(k) = s.next(&mut rng, false) {
            let happened = k != FaultKind::DiskFull;
            s.record(k, happened);
            drawn.push(k);
        }
        for k in &planned {
            let n = drawn.iter().filter(|d| *d == k).count();
            assert_eq!(n, if *k == FaultKind::DiskFull { MAX_MISSES as usize } else { 1 }, "{drawn:?}");
        }
        assert!(s.next(&mut rng, true).is_some_and(|k| planned.contains(&k)));
    }

    /// Two stand-ins for one task of the fenced service (shells carrying a task's environment,
    /// each with a child that carries it too): the scan finds two copies, the children not.
    #[test]
    fn the_scan_finds_every_copy_of_a_task_by_its_environment() {
        let dir = std::env::temp_dir().join(format!("soak-probe-{}", std::process::id()));
        let spawn = |task: &str| {
            std::process::Command::new("sh")
                .args(["-c", "sleep 60 & wait"])
                .env(SERVICE_ENV, service_tag(&dir, "pinned"))
                .env(TASK_ENV, task)
                .spawn()
                .expect("sh")
        };
        let mut shells =
            [spawn("t-00000000000000a1"), spawn("t-00000000000000a1"), spawn("t-00000000000000a2")];
        let mut copies = Vec::new();
        for _ in 0..100 {
            copies = scan(&dir);
            if copies.len() >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let pids: Vec<u32> = shells.iter().map(|s| s.id()).collect();
        for s in &mut shells {
            let _ = std::process::Command::new("pkill").args(["-P", &s.id().to_string()]).status();
            let _ = s.kill();
            let _ = s.wait();
        }
        let mut want: Vec<(u32, &str)> = pids
            .iter()
            .copied()
            .zip(["t-00000000000000a1", "t-00000000000000a1", "t-00000000000000a2"])
            .collect();
        want.sort();
        let got: Vec<(u32, &str)> = copies.iter().map(|c| (c.pid, c.task.as_str())).collect();
        assert_eq!(got, want, "{copies:?}");
        assert!(copies.iter().all(|c| c.service == "pinned"));
        assert!(scan(&dir.join("other")).is_empty(), "another run's tasks are not this one's");
    }
}
