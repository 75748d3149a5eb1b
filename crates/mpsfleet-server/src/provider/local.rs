//! The local capacity provider: agents as child processes of this machine, each in its own
//! process group, stopped with SIGTERM then SIGKILL after a grace period.

use super::{CapacityProvider, LaunchRequest, LaunchedHost, ProviderError, ProviderHostState};
use std::collections::BTreeMap;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// Agents as local processes: `<exe> agent --data-dir <base>/<name> <join flags>
/// <agent_args…> <the request's agent_args…>`, where the join flags are `--server`,
/// `--join-token`, `--pool` and `--hostname` for the request's non-empty fields. Output goes
/// to `<base>/<name>/agent.log`.
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
}

impl LocalProvider {
    pub fn new(exe: PathBuf, base_dir: PathBuf, agent_args: Vec<String>, grace: Duration) -> Self {
        LocalProvider { exe, base_dir, agent_args, grace, hosts: Mutex::new(Hosts::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hosts> {
        self.hosts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `<base>/<name>/agent.pid`: the agent's pid and process start time.
const PID_FILE: &str = "agent.pid";

/// Field 22 of `/proc/PID/stat`: when the process started, to tell it from a reused pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

fn read_pid_file(path: &std::path::Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut parts = text.split_whitespace();
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

impl LocalProvider {
    /// Stops an agent this process did not start (a restarted server's), by its pid file.
    fn stop_by_pid_file(&self, name: &str) -> Result<String, ProviderError> {
        let Some((pid, start)) = read_pid_file(&self.base_dir.join(name).join(PID_FILE)) else {
            return Err(ProviderError::Unknown(name.to_string()));
        };
        if start_time(pid) != Some(start) {
            return Ok("not running".into());
        }
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let step = Duration::from_millis(50);
        let mut waited = Duration::ZERO;
        while waited < self.grace {
            if start_time(pid) != Some(start) {
                return Ok("stopped with SIGTERM".into());
            }
            std::thread::sleep(step);
            waited += step;
        }
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        Ok(format!("killed with SIGKILL after a {}s grace period", self.grace.as_secs()))
    }
}

impl CapacityProvider for LocalProvider {
    fn launch(&self, req: &LaunchRequest) -> Result<LaunchedHost, ProviderError> {
        let name = req.name.as_str();
        let err = |message: String| ProviderError::Launch { name: name.to_string(), message };
        if self.lock().running.contains_key(name) {
            return Err(ProviderError::AlreadyLaunched(name.to_string()));
        }
        let dir = self.base_dir.join(name);
        // Launch is idempotent by name, across server restarts too: an agent an earlier server
        // started for this name is still this host.
        if let Some((pid, start)) = read_pid_file(&dir.join(PID_FILE)) {
            if start_time(pid) == Some(start) {
                return Ok(LaunchedHost { provider_id: pid.to_string(), state: ProviderHostState::Running });
            }
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
            .args(req.join_flags())
            .args(&self.agent_args)
            .args(&req.agent_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own process group: a Ctrl-C in the terminal reaches `up`, which stops the
            // agents in order, rather than every agent at once.
            .process_group(0)
            .spawn()
            .map_err(|e| err(format!("cannot start {}: {e}", self.exe.display())))?;
        let provider_id = child.id().to_string();
        // So that a restarted server (whose children these no longer are) can stop it.
        if let Some(start) = start_time(child.id()) {
            let _ = std::fs::write(dir.join(PID_FILE), format!("{} {start}\n", child.id()));
        }
        let mut hosts = self.lock();
        hosts.stopped.remove(name);
        hosts.running.insert(name.to_string(), child);
        Ok(LaunchedHost { provider_id, state: ProviderHostState::Running })
    }

    fn terminate(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        let child = {
            let mut hosts = self.lock();
            match hosts.running.remove(name) {
                Some(child) => child,
                None => {
                    if let Some(detail) = hosts.stopped.get(name) {
                        return Ok(ProviderHostState::Terminated { detail: detail.clone() });
                    }
                    drop(hosts);
                    // Launched by an earlier server process: found through its pid file.
                    let detail = self.stop_by_pid_file(name)?;
                    self.lock().stopped.insert(name.to_string(), detail.clone());
                    return Ok(ProviderHostState::Terminated { detail });
                }
            }
        };
        // Not under the lock: stopping may take the whole grace period.
        let mut child = child;
        let detail = stop_child(&mut child, self.grace);
        self.lock().stopped.insert(name.to_string(), detail.clone());
        Ok(ProviderHostState::Terminated { detail })
    }

    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        let mut hosts = self.lock();
        if let Some(child) = hosts.running.get_mut(name) {
            return Ok(match child.try_wait() {
                Ok(None) => ProviderHostState::Running,
                Ok(Some(status)) => ProviderHostState::Terminated { detail: format!("exited: {status}") },
                Err(e) => ProviderHostState::Unknown { detail: format!("cannot check the process: {e}") },
            });
        }
        match hosts.stopped.get(name) {
            Some(detail) => Ok(ProviderHostState::Terminated { detail: detail.clone() }),
            None => Err(ProviderError::Unknown(name.to_string())),
        }
    }

    fn hosts(&self) -> Vec<String> {
        self.lock().running.keys().cloned().collect()
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
    let step = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    while waited < grace {
        if let Ok(Some(status)) = child.try_wait() {
            return format!("stopped with SIGTERM: {}", describe_status(status));
        }
        std::thread::sleep(step);
        waited += step;
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

impl Drop for LocalProvider {
    fn drop(&mut self) {
        for name in self.hosts() {
            let _ = self.terminate(&name);
        }
    }
}
