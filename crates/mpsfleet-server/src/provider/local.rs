//! The local capacity provider: each host is an `mpsfleet agent` process of this machine that
//! leads a session of its own. Terminating a host ends everything the host ran, as a machine's
//! termination would: the agent (SIGTERM, then SIGKILL after a grace period), then every other
//! process of the host: its session (shims, tasks, MPS daemons and servers, which outlive the
//! agent by design), whatever names the host's data dir, their children and process groups.
//! A termination is reported only once `/proc` shows none of them alive.

use super::{CapacityProvider, LaunchRequest, LaunchedHost, ProviderError, ProviderHostState};
use mpsfleet_proc::{Liveness, ProcStat};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// Agents as local processes: `<exe> agent --data-dir <base>/<name> <join flags>
/// <agent_args…> <the request's agent_args…>`, where the join flags are `--server`, `--pool`
/// and `--hostname` for the request's non-empty fields; the join token goes in the agent's
/// environment (`MPSFLEET_JOIN_TOKEN`), never in its argv, where `ps` would show it to every
/// user of the machine. Output goes to `<base>/<name>/agent.log`.
///
/// Hosts are machines: they outlive the provider (and the server that holds it). A provider
/// over the same `base_dir` finds the hosts an earlier one launched through `agent.pid` and
/// adopts them on launch, ends them on terminate and lists them in [`CapacityProvider::hosts`].
/// The variable `mpsfleet agent` reads its join token from.
pub const JOIN_TOKEN_ENV: &str = "MPSFLEET_JOIN_TOKEN";

pub struct LocalProvider {
    exe: PathBuf,
    base_dir: PathBuf,
    agent_args: Vec<String>,
    /// How long an agent gets after SIGTERM before SIGKILL.
    grace: Duration,
    hosts: Mutex<Hosts>,
}

#[derive(Default)]
struct Hosts {
    running: BTreeMap<String, Child>,
    /// Hosts terminated through this provider, with how they ended.
    stopped: BTreeMap<String, String>,
    /// Set by [`LocalProvider::close`]: no more launches.
    closed: bool,
}

/// `<base>/<name>/agent.pid`: `PID START_TIME` of the agent, which leads the host's session
/// (its session id is its pid).
const PID_FILE: &str = "agent.pid";

/// How long the rest of a host gets after SIGTERM, once its agent is gone, before SIGKILL.
const REST_GRACE: Duration = Duration::from_secs(2);

/// How long SIGKILLed processes may take to vanish from `/proc` before termination fails.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// How often a waiting termination looks again: at an agent it started (cheap), and at the
/// whole process table (a few file reads per process on the machine).
const STEP: Duration = Duration::from_millis(20);
const SCAN_STEP: Duration = Duration::from_millis(100);

/// The agent of a host, as its pid file records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AgentRecord {
    pid: u32,
    start_time: u64,
}

impl AgentRecord {
    fn read(dir: &Path) -> Option<AgentRecord> {
        let text = std::fs::read_to_string(dir.join(PID_FILE)).ok()?;
        let mut parts = text.split_whitespace();
        Some(AgentRecord { pid: parts.next()?.parse().ok()?, start_time: parts.next()?.parse().ok()? })
    }

    fn alive(&self) -> bool {
        mpsfleet_proc::liveness(self.pid, self.start_time) == Liveness::Alive
    }

    /// The host's session id, unless the pid now names another process (whose session, if it
    /// leads one, is not this host's: a pid is not reused while a session of its number lives).
    fn session(&self) -> Option<u32> {
        match mpsfleet_proc::liveness(self.pid, self.start_time) {
            Liveness::Reused { .. } => None,
            Liveness::Alive | Liveness::Zombie | Liveness::Gone => Some(self.pid),
        }
    }
}

impl LocalProvider {
    pub fn new(exe: PathBuf, base_dir: PathBuf, agent_args: Vec<String>, grace: Duration) -> Self {
        LocalProvider { exe, base_dir, agent_args, grace, hosts: Mutex::new(Hosts::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hosts> {
        self.hosts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Refuses launches from now on and returns every host still to terminate (as
    /// [`CapacityProvider::hosts`]): for an owner that stops everything it started, so that a
    /// launch in flight cannot leave a host behind.
    pub fn close(&self) -> Vec<String> {
        self.lock().closed = true;
        self.hosts()
    }

    /// Names of the hosts with a pid file under `base_dir`.
    fn recorded(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.base_dir) else { return Vec::new() };
        entries
            .flatten()
            .filter(|e| e.path().join(PID_FILE).is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    }
}

/// Every live process of the host whose data dir is `dir`, from one reading of `/proc`: its
/// agent, the members of its session, the processes that name `dir` (in an argument or a
/// variable), and, transitively, their children and the members of the process groups they
/// lead. Zombies and this process are left out.
fn host_processes(dir: &Path, agent: Option<AgentRecord>, table: &[(u32, ProcStat)]) -> BTreeSet<u32> {
    let me = std::process::id();
    let session = agent.and_then(|a| a.session());
    let live = || table.iter().filter(|(pid, s)| *pid != me && !s.is_dead());
    let agent = agent.filter(|a| live().any(|(pid, s)| *pid == a.pid && s.start_time == a.start_time));
    let mut members: BTreeSet<u32> = live()
        .filter(|(pid, s)| {
            Some(*pid) == agent.map(|a| a.pid) || Some(s.sid) == session || mpsfleet_proc::mentions(*pid, dir)
        })
        .map(|(pid, _)| *pid)
        .collect();
    loop {
        let more: Vec<u32> = live()
            .filter(|(pid, s)| {
                !members.contains(pid) && (members.contains(&s.ppid) || members.contains(&s.pgid))
            })
            .map(|(pid, _)| *pid)
            .collect();
        if more.is_empty() {
            return members;
        }
        members.extend(more);
    }
}

fn signal(pids: &BTreeSet<u32>, sig: nix::sys::signal::Signal) {
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid as i32), sig);
    }
}

impl LocalProvider {
    /// Ends every process of the host in `dir` but its agent (handled by the caller), and the
    /// `known` ones (pid, start time) seen before the agent went (its children then): SIGTERM,
    /// [`REST_GRACE`], then SIGKILL until `/proc` shows none. Returns how many there were and
    /// how many needed SIGKILL; fails naming the survivors.
    fn end_the_rest(
        &self,
        name: &str,
        dir: &Path,
        known: &[(u32, u64)],
    ) -> Result<(usize, usize), ProviderError> {
        use nix::sys::signal::Signal;
        let agent = AgentRecord::read(dir);
        let scan = || {
            let mut found = host_processes(dir, agent, &mpsfleet_proc::processes());
            let still =
                known.iter().filter(|(pid, start)| mpsfleet_proc::liveness(*pid, *start) == Liveness::Alive);
            found.extend(still.map(|(pid, _)| *pid));
            found
        };
        let first = scan();
        if first.is_empty() {
            return Ok((0, 0));
        }
        signal(&first, Signal::SIGTERM);
        let mut waited = Duration::ZERO;
        let mut left = first.clone();
        while !left.is_empty() && waited < REST_GRACE.min(self.grace) {
            std::thread::sleep(SCAN_STEP);
            waited += SCAN_STEP;
            left = scan();
        }
        let mut killed = BTreeSet::new();
        let mut waited = Duration::ZERO;
        while !left.is_empty() {
            if waited >= KILL_WAIT {
                return Err(ProviderError::Lingering {
                    name: name.to_string(),
                    pids: left.into_iter().collect(),
                });
            }
            // Each round also reaches what the processes started since the last one.
            signal(&left, Signal::SIGKILL);
            killed.extend(left.iter().copied());
            std::thread::sleep(SCAN_STEP);
            waited += SCAN_STEP;
            left = scan();
        }
        Ok((first.union(&killed).count(), killed.len()))
    }

    /// Terminates the host whose agent, if this provider started it, is `child`.
    fn stop_host(&self, name: &str, child: Option<Child>) -> Result<String, ProviderError> {
        let dir = self.base_dir.join(name);
        // Before the agent goes: its children are found by their parent while it lives.
        let table = mpsfleet_proc::processes();
        let start = |pid: u32| table.iter().find(|(p, _)| *p == pid).map(|(_, s)| s.start_time);
        let agent_pid = AgentRecord::read(&dir).map(|a| a.pid);
        let known: Vec<(u32, u64)> = host_processes(&dir, AgentRecord::read(&dir), &table)
            .into_iter()
            .filter(|pid| Some(*pid) != agent_pid)
            .filter_map(|pid| Some((pid, start(pid)?)))
            .collect();
        let agent = match child {
            Some(mut child) => stop_child(&mut child, self.grace),
            // Launched by an earlier provider: found through its pid file.
            None => match AgentRecord::read(&dir) {
                Some(record) if record.alive() => self.stop_by_record(record),
                Some(_) => "not running".to_string(),
                None if dir.is_dir() => "not running".to_string(),
                None => return Err(ProviderError::Unknown(name.to_string())),
            },
        };
        let (ended, killed) = self.end_the_rest(name, &dir, &known)?;
        Ok(match (ended, killed) {
            (0, _) => agent,
            (n, 0) => format!("agent {agent}; {n} other process(es) of the host stopped with SIGTERM"),
            (n, k) => format!("agent {agent}; {n} other process(es) of the host ended, {k} with SIGKILL"),
        })
    }

    /// SIGTERM, wait up to the grace period, then SIGKILL, for an agent this process did not
    /// start (and so cannot reap).
    fn stop_by_record(&self, record: AgentRecord) -> String {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(record.pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let mut waited = Duration::ZERO;
        while waited < self.grace {
            if !record.alive() {
                return "stopped with SIGTERM".into();
            }
            std::thread::sleep(STEP);
            waited += STEP;
        }
        if record.alive() {
            let _ = kill(pid, Signal::SIGKILL);
        }
        format!("killed with SIGKILL after a {}s grace period", self.grace.as_secs_f64())
    }
}

impl CapacityProvider for LocalProvider {
    fn launch(&self, req: &LaunchRequest) -> Result<LaunchedHost, ProviderError> {
        let name = req.name.as_str();
        let err = |message: String| ProviderError::Launch { name: name.to_string(), message };
        // Held while the agent starts (milliseconds), so that `close` sees every launch.
        let mut hosts = self.lock();
        if hosts.closed {
            return Err(err("the provider is shutting down".into()));
        }
        if hosts.running.contains_key(name) {
            return Err(ProviderError::AlreadyLaunched(name.to_string()));
        }
        let dir = self.base_dir.join(name);
        // Launch is idempotent by name, across server restarts too: an agent an earlier server
        // started for this name is still this host.
        if let Some(record) = AgentRecord::read(&dir).filter(AgentRecord::alive) {
            return Ok(LaunchedHost {
                provider_id: record.pid.to_string(),
                state: ProviderHostState::Running,
            });
        }
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))
            .map_err(|e| err(format!("cannot open the agent log in {}: {e}", dir.display())))?;
        let log2 = log.try_clone().map_err(|e| err(e.to_string()))?;
        let child = Command::new(&self.exe)
            .arg("agent")
            .arg("--data-dir")
            .arg(&dir)
            .args(req.join_flags(false))
            .args(&self.agent_args)
            .args(&req.agent_args)
            .env_remove(JOIN_TOKEN_ENV)
            .envs((!req.join_token.is_empty()).then_some((JOIN_TOKEN_ENV, req.join_token.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // A session of its own: everything the host starts carries its session id, even
            // after the agent is gone, and a Ctrl-C in the terminal reaches `up` (which stops
            // the hosts itself) rather than every agent at once.
            .env(mpsfleet_proc::NEW_SESSION_ENV, "1")
            .spawn()
            .map_err(|e| err(format!("cannot start {}: {e}", self.exe.display())))?;
        let provider_id = child.id().to_string();
        // So that a restarted server (whose children these no longer are) can find the host.
        if let Some(s) = mpsfleet_proc::stat(child.id()) {
            let _ = std::fs::write(dir.join(PID_FILE), format!("{} {}\n", child.id(), s.start_time));
        }
        hosts.stopped.remove(name);
        hosts.running.insert(name.to_string(), child);
        Ok(LaunchedHost { provider_id, state: ProviderHostState::Running })
    }

    /// Idempotent: every call ends whatever of the host still runs, and answers `Terminated`
    /// only once nothing does.
    fn terminate(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        let (child, earlier) = {
            let mut hosts = self.lock();
            let child = hosts.running.remove(name);
            (child, hosts.stopped.get(name).cloned())
        };
        // Not under the lock: stopping may take the whole grace period.
        let detail = match (child, earlier) {
            (None, Some(detail)) => {
                self.end_the_rest(name, &self.base_dir.join(name), &[])?;
                detail
            }
            (child, _) => self.stop_host(name, child)?,
        };
        self.lock().stopped.insert(name.to_string(), detail.clone());
        Ok(ProviderHostState::Terminated { detail })
    }

    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        let dir = self.base_dir.join(name);
        let rest = || host_processes(&dir, AgentRecord::read(&dir), &mpsfleet_proc::processes()).len();
        let gone = |how: String| match rest() {
            0 => ProviderHostState::Terminated { detail: how },
            n => {
                ProviderHostState::Unknown { detail: format!("{how}; {n} process(es) of the host still run") }
            }
        };
        let mut hosts = self.lock();
        if let Some(child) = hosts.running.get_mut(name) {
            return Ok(match child.try_wait() {
                Ok(None) => ProviderHostState::Running,
                Ok(Some(status)) => gone(format!("exited: {status}")),
                Err(e) => ProviderHostState::Unknown { detail: format!("cannot check the process: {e}") },
            });
        }
        if let Some(detail) = hosts.stopped.get(name) {
            return Ok(gone(detail.clone()));
        }
        drop(hosts);
        match AgentRecord::read(&dir) {
            Some(record) if record.alive() => Ok(ProviderHostState::Running),
            Some(_) => Ok(gone("the agent is not running".into())),
            None => Err(ProviderError::Unknown(name.to_string())),
        }
    }

    /// The hosts this provider launched and was not asked to terminate, and those an earlier
    /// provider over the same directory launched that still have live processes.
    fn hosts(&self) -> Vec<String> {
        let mut names: BTreeSet<String> = self.lock().running.keys().cloned().collect();
        let table = mpsfleet_proc::processes();
        for name in self.recorded() {
            let dir = self.base_dir.join(&name);
            if !names.contains(&name) && !host_processes(&dir, AgentRecord::read(&dir), &table).is_empty() {
                names.insert(name);
            }
        }
        names.into_iter().collect()
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL; always reaps. Returns how the process ended.
fn stop_child(child: &mut Child, grace: Duration) -> String {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if let Ok(Some(status)) = child.try_wait() {
        return format!("exited before it was stopped: {status}");
    }
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let mut waited = Duration::ZERO;
    while waited < grace {
        if let Ok(Some(status)) = child.try_wait() {
            return format!("stopped with SIGTERM: {}", describe_status(status));
        }
        std::thread::sleep(STEP);
        waited += STEP;
    }
    let _ = child.kill();
    match child.wait() {
        Ok(status) => format!(
            "killed with SIGKILL after a {}s grace period: {}",
            grace.as_secs_f64(),
            describe_status(status)
        ),
        Err(e) => {
            format!("killed with SIGKILL after a {}s grace period; cannot reap: {e}", grace.as_secs_f64())
        }
    }
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => match nix::sys::signal::Signal::try_from(signal) {
            Ok(s) => format!("signal {signal} ({})", s.as_str()),
            Err(_) => format!("signal {signal}"),
        },
        (None, None) => status.to_string(),
    }
}
