//! Capacity providers: what launches and terminates hosts. `local` runs agents as child
//! processes of this machine (used by `mpsfleet up` and tests).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("cannot launch host {name}: {message}")]
    Launch { name: String, message: String },
    #[error("unknown host {0}")]
    Unknown(String),
}

/// What a provider knows about one of its hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderHostState {
    Running,
    Terminated { detail: String },
}

/// Launches and terminates hosts that run `mpsfleet agent`.
pub trait CapacityProvider: Send + Sync {
    /// Starts a new host called `name`; returns when its agent process is started, not when
    /// it has joined (the server sees it join).
    fn launch(&self, name: &str) -> Result<(), ProviderError>;
    /// Stops the host; returns once it is gone.
    fn terminate(&self, name: &str) -> Result<(), ProviderError>;
    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError>;
    /// Names of the hosts this provider launched and has not terminated.
    fn hosts(&self) -> Vec<String>;
}

/// Agents as local processes: `<exe> agent --data-dir <base>/<name> <agent_args…>`.
pub struct LocalProvider {
    exe: PathBuf,
    base_dir: PathBuf,
    agent_args: Vec<String>,
    /// How long an agent gets after SIGTERM before SIGKILL.
    grace: Duration,
    children: Mutex<BTreeMap<String, Child>>,
}

impl LocalProvider {
    pub fn new(exe: PathBuf, base_dir: PathBuf, agent_args: Vec<String>, grace: Duration) -> Self {
        LocalProvider { exe, base_dir, agent_args, grace, children: Mutex::new(BTreeMap::new()) }
    }

    fn children(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Child>> {
        self.children.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl CapacityProvider for LocalProvider {
    fn launch(&self, name: &str) -> Result<(), ProviderError> {
        let err = |message: String| ProviderError::Launch { name: name.to_string(), message };
        let dir = self.base_dir.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))
            .map_err(|e| err(format!("cannot open the agent log in {}: {e}", dir.display())))?;
        let log2 = log.try_clone().map_err(|e| err(e.to_string()))?;
        use std::os::unix::process::CommandExt;
        let child = Command::new(&self.exe)
            .arg("agent")
            .arg("--data-dir")
            .arg(&dir)
            .arg("--hostname")
            .arg(name)
            .args(&self.agent_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own process group: a Ctrl-C in the terminal reaches `up`, which stops the
            // agents in order, rather than every agent at once.
            .process_group(0)
            .spawn()
            .map_err(|e| err(format!("cannot start {}: {e}", self.exe.display())))?;
        self.children().insert(name.to_string(), child);
        Ok(())
    }

    fn terminate(&self, name: &str) -> Result<(), ProviderError> {
        let mut child =
            self.children().remove(name).ok_or_else(|| ProviderError::Unknown(name.to_string()))?;
        stop_child(&mut child, self.grace);
        Ok(())
    }

    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        let mut children = self.children();
        let child = children.get_mut(name).ok_or_else(|| ProviderError::Unknown(name.to_string()))?;
        Ok(match child.try_wait() {
            Ok(None) => ProviderHostState::Running,
            Ok(Some(status)) => ProviderHostState::Terminated { detail: status.to_string() },
            Err(e) => ProviderHostState::Terminated { detail: e.to_string() },
        })
    }

    fn hosts(&self) -> Vec<String> {
        self.children().keys().cloned().collect()
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL; always reaps.
fn stop_child(child: &mut Child, grace: Duration) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let step = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    while waited < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(step);
        waited += step;
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for LocalProvider {
    fn drop(&mut self) {
        let names = self.hosts();
        for n in names {
            let _ = self.terminate(&n);
        }
    }
}
