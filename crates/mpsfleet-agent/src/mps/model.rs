//! An in-process model of the MPS control protocol behind the same [`MpsControl`] seam, for the
//! simulator and unit tests: daemons that answer, hang (commands time out at once, as the real
//! client would after its timeout), die or fail to start; a server per daemon that stays in
//! FAULT until its clients exit; a per-GPU client limit. Never a substitute for testing the real
//! daemon.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mpsfleet_core::mps_model;
use mpsfleet_types::DEFAULT_MAX_MPS_CLIENTS;

use super::{DaemonConfig, ExitInfo, LogEvent, MpsControl, MpsDaemon, MpsError};

/// Why the model refused a client connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientRefused {
    /// No daemon: a real CUDA program would run without MPS and without limits.
    #[error("no mps control daemon on {}", pipe_dir.display())]
    NoDaemon { pipe_dir: PathBuf },
    #[error("mps control daemon on {} does not answer", pipe_dir.display())]
    Hung { pipe_dir: PathBuf },
    #[error("mps server {server_pid} is in FAULT until its clients exit")]
    Fault { server_pid: u32 },
    #[error("mps server {server_pid} has its {max} clients")]
    ClientLimit { server_pid: u32, max: u32 },
    #[error("mps server {server_pid} serves user {uid}")]
    OtherUser { server_pid: u32, uid: u32 },
}

/// The server of a daemon: its process and clients (its state is the daemon's `model`).
#[derive(Debug)]
struct ModelServer {
    pid: u32,
    uid: u32,
    clients: Vec<u32>,
}

#[derive(Debug)]
struct DaemonState {
    pid: u32,
    cfg: DaemonConfig,
    exit: Option<ExitInfo>,
    /// The daemon's process and its server's state, by core's rules (`mps_model`): the
    /// simulator runs the same ones.
    model: mps_model::Daemon,
    default_percentage: f64,
    default_pinned: HashMap<String, String>,
    server: Option<ModelServer>,
    log: Vec<LogEvent>,
}

impl DaemonState {
    fn alive(&self) -> bool {
        self.model.alive()
    }

    fn hung(&self) -> bool {
        self.model.process() == mps_model::Process::Hung
    }

    /// The daemon exits, and its server with it.
    fn die(&mut self, exit: ExitInfo) {
        self.exit = Some(exit);
        self.model.exit();
        self.server = None;
    }

    fn end_server(&mut self, status: i32) {
        self.model.end_server();
        if let Some(server) = self.server.take() {
            if status != 0 {
                self.log.push(LogEvent::ServerExited {
                    server_pid: server.pid,
                    status,
                    line: format!(
                        "[model Control {}] Server {} exited with status {status}",
                        self.pid, server.pid
                    ),
                });
            }
        }
    }
}

#[derive(Debug)]
struct World {
    next_pid: u32,
    max_clients: u32,
    daemons: HashMap<PathBuf, Arc<Mutex<DaemonState>>>,
    start_failures: HashMap<PathBuf, String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The model; clones share one world. Faults are injected by pipe directory.
#[derive(Debug, Clone)]
pub struct ModelMps {
    world: Arc<Mutex<World>>,
}

impl Default for ModelMps {
    fn default() -> Self {
        Self::new()
    }
}

impl ModelMps {
    pub fn new() -> Self {
        Self::with_max_clients(DEFAULT_MAX_MPS_CLIENTS)
    }

    /// A world whose servers take at most `max_clients` clients each.
    pub fn with_max_clients(max_clients: u32) -> Self {
        Self {
            world: Arc::new(Mutex::new(World {
                next_pid: 40_000,
                max_clients,
                daemons: HashMap::new(),
                start_failures: HashMap::new(),
            })),
        }
    }

    fn daemon(&self, pipe_dir: &Path) -> Option<Arc<Mutex<DaemonState>>> {
        lock(&self.world).daemons.get(pipe_dir).cloned()
    }

    fn with_daemon<R>(&self, pipe_dir: &Path, f: impl FnOnce(&mut DaemonState) -> R) -> Option<R> {
        self.daemon(pipe_dir).map(|d| f(&mut lock(&d)))
    }

    fn next_pid(&self) -> u32 {
        let mut world = lock(&self.world);
        world.next_pid += 1;
        world.next_pid
    }

    /// Whether a daemon runs (answering or hung) on `pipe_dir`.
    pub fn daemon_alive(&self, pipe_dir: &Path) -> bool {
        self.with_daemon(pipe_dir, |d| d.alive()).unwrap_or(false)
    }

    /// The daemon dies, as from `kill -SIGNAL`.
    pub fn kill_daemon(&self, pipe_dir: &Path, signal: i32) {
        self.with_daemon(pipe_dir, |d| {
            if d.alive() {
                d.die(ExitInfo::Signal(signal));
            }
        });
    }

    /// The daemon stops answering (SIGSTOP): every command times out.
    pub fn hang_daemon(&self, pipe_dir: &Path) {
        self.with_daemon(pipe_dir, |d| d.model.hang());
    }

    /// The daemon answers again (SIGCONT).
    pub fn resume_daemon(&self, pipe_dir: &Path) {
        self.with_daemon(pipe_dir, |d| d.model.resume());
    }

    /// Every start on `pipe_dir` fails with `reason` until cleared with `None`.
    pub fn set_start_failure(&self, pipe_dir: &Path, reason: Option<&str>) {
        let mut world = lock(&self.world);
        match reason {
            Some(r) => world.start_failures.insert(pipe_dir.to_path_buf(), r.to_string()),
            None => world.start_failures.remove(pipe_dir),
        };
    }

    /// A CUDA program connects: starts the server if there is none; returns the server's PID.
    pub fn connect_client(&self, pipe_dir: &Path, client_pid: u32, uid: u32) -> Result<u32, ClientRefused> {
        let max = lock(&self.world).max_clients;
        let new_pid = self.next_pid();
        let daemon =
            self.daemon(pipe_dir).ok_or_else(|| ClientRefused::NoDaemon { pipe_dir: pipe_dir.into() })?;
        let mut d = lock(&daemon);
        match d.model.connect() {
            Err(mps_model::Refused::NoDaemon) => {
                return Err(ClientRefused::NoDaemon { pipe_dir: pipe_dir.into() })
            }
            Err(mps_model::Refused::Hung) => return Err(ClientRefused::Hung { pipe_dir: pipe_dir.into() }),
            Err(mps_model::Refused::Fault) => {
                let server_pid = d.server.as_ref().map_or(0, |s| s.pid);
                return Err(ClientRefused::Fault { server_pid });
            }
            Ok(()) => {}
        }
        let server = d.server.get_or_insert(ModelServer { pid: new_pid, uid, clients: Vec::new() });
        if server.uid != uid {
            return Err(ClientRefused::OtherUser { server_pid: server.pid, uid: server.uid });
        }
        if server.clients.len() as u32 >= max {
            return Err(ClientRefused::ClientLimit { server_pid: server.pid, max });
        }
        if !server.clients.contains(&client_pid) {
            server.clients.push(client_pid);
        }
        Ok(server.pid)
    }

    /// A client process ends. A server in FAULT exits once its last client is gone.
    pub fn disconnect_client(&self, pipe_dir: &Path, client_pid: u32) {
        self.with_daemon(pipe_dir, |d| {
            let Some(server) = d.server.as_mut() else { return };
            server.clients.retain(|&c| c != client_pid);
            if server.clients.is_empty() && d.model.last_client_gone() {
                d.end_server(1);
            }
        });
    }

    /// A fatal GPU fault: the server goes to FAULT and says so in control.log.
    pub fn fault_server(&self, pipe_dir: &Path) {
        self.with_daemon(pipe_dir, |d| {
            let pid = d.pid;
            if d.model.fault() {
                d.log.push(LogEvent::Fatal {
                    line: format!(
                        "[model Control {pid}] Server encountered a fatal exception. Shutting down"
                    ),
                });
            }
        });
    }

    /// The server process dies (its clients break); the daemon notices and logs it.
    pub fn kill_server(&self, pipe_dir: &Path) {
        self.with_daemon(pipe_dir, |d| d.end_server(137));
    }

    /// Clients of the daemon's server.
    pub fn clients(&self, pipe_dir: &Path) -> Vec<u32> {
        self.with_daemon(pipe_dir, |d| d.server.as_ref().map(|s| s.clients.clone()).unwrap_or_default())
            .unwrap_or_default()
    }
}

impl MpsControl for ModelMps {
    fn start(&self, cfg: &DaemonConfig) -> Result<Box<dyn MpsDaemon>, MpsError> {
        cfg.validate()?;
        if let Some(existing) = self.daemon(&cfg.pipe_dir) {
            if lock(&existing).alive() {
                return Err(MpsError::AlreadyRunning { pipe_dir: cfg.pipe_dir.clone() });
            }
        }
        if let Some(reason) = lock(&self.world).start_failures.get(&cfg.pipe_dir) {
            return Err(MpsError::ExitedAtStart {
                pipe_dir: cfg.pipe_dir.clone(),
                exit: ExitInfo::Status(1),
                output: reason.clone(),
            });
        }
        let pid = self.next_pid();
        let state = Arc::new(Mutex::new(DaemonState {
            pid,
            cfg: cfg.clone(),
            exit: None,
            model: {
                let mut m = mps_model::Daemon::down();
                m.start(false);
                m
            },
            default_percentage: 100.0,
            default_pinned: HashMap::new(),
            server: None,
            log: Vec::new(),
        }));
        lock(&self.world).daemons.insert(cfg.pipe_dir.clone(), state.clone());
        let daemon = ModelDaemon { state, pid, pipe_dir: cfg.pipe_dir.clone() };
        if let Some(pct) = cfg.default_active_thread_percentage {
            daemon.control(&format!("set_default_active_thread_percentage {pct}"))?;
        }
        if let Some(mib) = cfg.default_pinned_mem_limit_mib {
            daemon.control(&format!("set_default_device_pinned_mem_limit 0 {mib}M"))?;
        }
        Ok(Box::new(daemon))
    }

    /// A daemon alive on `cfg.pipe_dir` (answering or hung) is adopted as it is.
    fn adopt(&self, cfg: &DaemonConfig) -> Result<Option<Box<dyn MpsDaemon>>, MpsError> {
        cfg.validate()?;
        let Some(state) = self.daemon(&cfg.pipe_dir) else { return Ok(None) };
        let pid = {
            let d = lock(&state);
            if !d.alive() {
                return Ok(None);
            }
            d.pid
        };
        Ok(Some(Box::new(ModelDaemon { state, pid, pipe_dir: cfg.pipe_dir.clone() })))
    }

    fn quit_existing(&self, cfg: &DaemonConfig) -> Result<bool, MpsError> {
        let Some(existing) = self.daemon(&cfg.pipe_dir) else { return Ok(false) };
        let mut d = lock(&existing);
        if !d.alive() {
            return Ok(false);
        }
        if d.hung() {
            return Err(MpsError::Timeout { command: "quit".into(), timeout: cfg.probe_timeout });
        }
        d.die(ExitInfo::Status(0));
        Ok(true)
    }
}

/// A daemon of the model.
#[derive(Debug)]
pub struct ModelDaemon {
    state: Arc<Mutex<DaemonState>>,
    pid: u32,
    pipe_dir: PathBuf,
}

impl MpsDaemon for ModelDaemon {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn pipe_dir(&self) -> &Path {
        &self.pipe_dir
    }

    fn control(&self, command: &str) -> Result<String, MpsError> {
        let mut d = lock(&self.state);
        if !d.alive() {
            return Err(MpsError::NotRunning { pipe_dir: self.pipe_dir.clone() });
        }
        if d.hung() {
            return Err(MpsError::Timeout { command: command.to_string(), timeout: d.cfg.probe_timeout });
        }
        answer(&mut d, command)
    }

    fn try_exit(&self) -> Option<ExitInfo> {
        lock(&self.state).exit
    }

    fn set_probe_timeout(&self, timeout: Duration) {
        lock(&self.state).cfg.probe_timeout = timeout;
    }

    fn stop(&self) -> Result<(), MpsError> {
        let mut d = lock(&self.state);
        if d.alive() {
            // A hung daemon does not take quit; the process group is killed.
            let exit = if d.hung() { ExitInfo::Signal(9) } else { ExitInfo::Status(0) };
            d.die(exit);
        }
        Ok(())
    }

    fn inject(&self, fault: super::Injected) -> Result<(), MpsError> {
        let mut d = lock(&self.state);
        if d.alive() {
            match fault {
                super::Injected::Exit => d.die(ExitInfo::Signal(9)),
                super::Injected::Hang => d.model.hang(),
                super::Injected::Resume => d.model.resume(),
            }
        }
        Ok(())
    }

    fn poll_log(&self) -> Vec<LogEvent> {
        std::mem::take(&mut lock(&self.state).log)
    }

    fn server_running(&self, pid: u32) -> bool {
        lock(&self.state).server.as_ref().is_some_and(|s| s.pid == pid)
    }
}

/// The daemon's answer to one command, as driver 535 prints it (plus `get_server_status`, which
/// newer drivers have).
fn answer(d: &mut DaemonState, command: &str) -> Result<String, MpsError> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let unknown = || MpsError::UnknownCommand { command: command.to_string() };
    let pid_arg = |i: usize| words.get(i).and_then(|w| w.parse::<u32>().ok());
    let server_pid = d.server.as_ref().map(|s| s.pid);
    let out = match words.as_slice() {
        ["get_server_list"] => server_pid.map(|p| p.to_string()).unwrap_or_default(),
        ["get_server_status", _] => match (&d.server, pid_arg(1)) {
            (Some(s), Some(p)) if s.pid == p => {
                if d.model.server() == mps_model::Server::Fault { "FAULT" } else { "ACTIVE" }.to_string()
            }
            _ => format!("Server {} not found", words[1]),
        },
        ["get_client_list", _] => match (&d.server, pid_arg(1)) {
            (Some(s), Some(p)) if s.pid == p => {
                s.clients.iter().map(u32::to_string).collect::<Vec<_>>().join("\n")
            }
            _ => format!("Server {} not found", words[1]),
        },
        ["get_default_active_thread_percentage"] => format!("{:.1}", d.default_percentage),
        ["set_default_active_thread_percentage", p] => {
            if let Ok(v) = p.parse::<f64>() {
                if v > 0.0 && v <= 100.0 {
                    d.default_percentage = v;
                }
            }
            format!("{:.1}", d.default_percentage)
        }
        ["set_default_device_pinned_mem_limit", dev, value] => {
            d.default_pinned.insert(dev.to_string(), value.to_string());
            String::new()
        }
        ["get_default_device_pinned_mem_limit", dev] => {
            d.default_pinned.get(*dev).cloned().unwrap_or_default()
        }
        ["terminate_client", s, c] => {
            let (sp, cp) = (s.parse::<u32>().ok(), c.parse::<u32>().ok());
            match d.server.as_mut() {
                Some(server) if Some(server.pid) == sp => match cp {
                    Some(cp) if server.clients.contains(&cp) => {
                        server.clients.retain(|&x| x != cp);
                        if server.clients.is_empty() && d.model.last_client_gone() {
                            d.end_server(1);
                        }
                        "0".to_string()
                    }
                    _ => format!("Invalid process {c}!\n1"),
                },
                _ => format!("Server {s} not found\nServer {s} not found!\n1"),
            }
        }
        ["start_server", "-uid", uid] => {
            let uid = uid.parse::<u32>().map_err(|_| unknown())?;
            if d.server.is_none() {
                // The model has no GPU problems: the server comes up.
                let pid = d.pid + 1_000 + uid;
                d.model.start_server();
                d.server = Some(ModelServer { pid, uid, clients: Vec::new() });
            }
            String::new()
        }
        ["shutdown_server", p] | ["shutdown_server", p, "-f"] => {
            if d.server.as_ref().map(|s| s.pid.to_string()).as_deref() == Some(*p) {
                d.end_server(0);
                String::new()
            } else {
                format!("Server {p} not found")
            }
        }
        ["ps"] | ["ps", "-p", _] => {
            if d.server.is_none() {
                "Server not found".to_string()
            } else {
                String::new()
            }
        }
        ["quit"] | ["quit", "-t", _] => {
            d.die(ExitInfo::Status(0));
            String::new()
        }
        _ => return Err(unknown()),
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mps::ServerState;

    fn cfg(dir: &str) -> DaemonConfig {
        DaemonConfig::new("nvidia-cuda-mps-control", format!("/model/{dir}"), format!("/model/{dir}/log"))
    }

    #[test]
    fn answers_like_the_real_daemon() {
        let model = ModelMps::new();
        let d =
            model.start(&DaemonConfig { default_active_thread_percentage: Some(25), ..cfg("a") }).unwrap();
        assert_eq!(d.control("get_default_active_thread_percentage").unwrap(), "25.0");
        assert_eq!(d.control("set_default_active_thread_percentage 50").unwrap(), "50.0");
        assert_eq!(
            d.control("set_default_active_thread_percentage 0").unwrap(),
            "50.0",
            "invalid keeps the old value"
        );
        assert_eq!(d.control("get_server_list").unwrap(), "");
        assert!(matches!(d.control("bogus"), Err(MpsError::UnknownCommand { .. })));
        assert!(matches!(d.terminate_client(1, 2), Err(MpsError::ServerNotFound { pid: 1 })));
        assert!(d.probe().unwrap().healthy());
    }

    #[test]
    fn second_daemon_on_a_pipe_dir_refuses_until_the_first_is_gone() {
        let model = ModelMps::new();
        let first = model.start(&cfg("b")).unwrap();
        assert!(matches!(model.start(&cfg("b")), Err(MpsError::AlreadyRunning { .. })));
        assert!(model.start(&cfg("c")).is_ok(), "another pipe dir is fine");
        first.stop().unwrap();
        assert_eq!(first.try_exit(), Some(ExitInfo::Status(0)));
        assert!(model.start(&cfg("b")).is_ok());
    }

    #[test]
    fn hang_times_out_and_kill_is_an_exit() {
        let model = ModelMps::new();
        let c = cfg("d");
        let d = model.start(&c).unwrap();
        model.hang_daemon(&c.pipe_dir);
        assert_eq!(d.probe().unwrap_err().to_string(), "probe timed out after 3s");
        model.resume_daemon(&c.pipe_dir);
        assert!(d.probe().is_ok());
        assert_eq!(d.try_exit(), None);
        model.kill_daemon(&c.pipe_dir, 9);
        assert_eq!(d.try_exit().map(|e| e.to_string()).as_deref(), Some("daemon exited (signal 9)"));
        assert!(matches!(d.probe(), Err(MpsError::NotRunning { .. })));
        // A hung daemon is killed by stop.
        let d2 = model.start(&c).unwrap();
        model.hang_daemon(&c.pipe_dir);
        d2.stop().unwrap();
        assert_eq!(d2.try_exit(), Some(ExitInfo::Signal(9)));
    }

    #[test]
    fn a_live_daemon_is_adopted_with_its_state() {
        let model = ModelMps::new();
        let c = cfg("h");
        assert!(model.adopt(&c).unwrap().is_none(), "nothing to adopt");
        let d = model.start(&c).unwrap();
        d.control("set_default_active_thread_percentage 40").unwrap();
        let adopted = model.adopt(&c).unwrap().expect("adopted");
        assert_eq!(adopted.pid(), d.pid());
        assert_eq!(adopted.control("get_default_active_thread_percentage").unwrap(), "40.0");
        model.hang_daemon(&c.pipe_dir);
        assert!(model.adopt(&c).unwrap().is_some(), "a hung daemon is adopted too");
        model.kill_daemon(&c.pipe_dir, 9);
        assert!(model.adopt(&c).unwrap().is_none(), "a dead one is not");
        assert_eq!(adopted.try_exit(), Some(ExitInfo::Signal(9)));
    }

    #[test]
    fn fault_holds_until_clients_exit() {
        let model = ModelMps::new();
        let c = cfg("e");
        let d = model.start(&c).unwrap();
        let server = model.connect_client(&c.pipe_dir, 100, 1000).unwrap();
        assert_eq!(model.connect_client(&c.pipe_dir, 101, 1000), Ok(server));
        model.fault_server(&c.pipe_dir);
        let probe = d.probe().unwrap();
        assert_eq!(probe.servers[0].state, ServerState::Fault);
        assert!(probe.problem().unwrap().contains("FAULT"));
        assert!(matches!(d.poll_log()[..], [LogEvent::Fatal { .. }]));
        assert_eq!(
            model.connect_client(&c.pipe_dir, 102, 1000),
            Err(ClientRefused::Fault { server_pid: server })
        );
        d.terminate_client(server, 100).unwrap();
        model.disconnect_client(&c.pipe_dir, 100);
        assert!(!d.probe().unwrap().healthy(), "one client left");
        model.disconnect_client(&c.pipe_dir, 101);
        assert!(d.probe().unwrap().servers.is_empty(), "the faulted server exited");
        assert!(matches!(d.poll_log()[..], [LogEvent::ServerExited { status: 1, .. }]));
        assert!(model.connect_client(&c.pipe_dir, 103, 1000).is_ok(), "a new server serves");
    }

    #[test]
    fn client_limit_and_users() {
        let model = ModelMps::with_max_clients(2);
        let c = cfg("f");
        let _d = model.start(&c).unwrap();
        let s = model.connect_client(&c.pipe_dir, 1, 0).unwrap();
        model.connect_client(&c.pipe_dir, 2, 0).unwrap();
        assert_eq!(
            model.connect_client(&c.pipe_dir, 3, 0),
            Err(ClientRefused::ClientLimit { server_pid: s, max: 2 })
        );
        assert_eq!(
            model.connect_client(&c.pipe_dir, 4, 7),
            Err(ClientRefused::OtherUser { server_pid: s, uid: 0 })
        );
        assert_eq!(model.clients(&c.pipe_dir), vec![1, 2]);
        assert!(matches!(
            model.connect_client(Path::new("/model/none"), 5, 0),
            Err(ClientRefused::NoDaemon { .. })
        ));
    }

    #[test]
    fn killed_server_is_logged_and_start_failures_are_injected() {
        let model = ModelMps::new();
        let c = cfg("g");
        let d = model.start(&c).unwrap();
        model.connect_client(&c.pipe_dir, 1, 0).unwrap();
        model.kill_server(&c.pipe_dir);
        assert!(matches!(d.poll_log()[..], [LogEvent::ServerExited { status: 137, .. }]));
        d.stop().unwrap();
        model.set_start_failure(&c.pipe_dir, Some("An instance of this daemon is already running"));
        let err = model.start(&c).err().unwrap().to_string();
        assert!(err.contains("daemon exited (status 1)"), "{err}");
        model.set_start_failure(&c.pipe_dir, None);
        assert!(model.start(&c).is_ok());
        assert!(model.quit_existing(&c).unwrap());
        assert!(!model.quit_existing(&c).unwrap());
    }
}
