//! The thin shell around [`health::step`]: one thread per GPU that owns the daemon, probes it,
//! watches for its exit and its log, runs the effects (restarts) and publishes the check.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use mpsfleet_core::clock::Clock;
use tokio::sync::watch;

use super::health::{self, DaemonHealth, Effect, Event};
use super::{Check, DaemonConfig, LogEvent, MpsControl, MpsDaemon, MpsError, MpsPolicy};

/// How often the loop wakes to look for new log lines, and for the exit of a daemon whose
/// end it cannot be told of ([`MpsDaemon::notify_exit`]).
const TICK: Duration = Duration::from_millis(100);
/// Check transitions kept for `history`.
const HISTORY: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Shared {
    label: String,
    cfg: DaemonConfig,
    /// The policy in force; [`Supervisor::set_policy`] replaces it, the loop reads it on every
    /// wake.
    policy: Mutex<MpsPolicy>,
    control: Arc<dyn MpsControl>,
    clock: Arc<dyn Clock>,
    daemon: Mutex<Option<Arc<dyn MpsDaemon>>>,
    tx: watch::Sender<Check>,
    history: Mutex<VecDeque<Check>>,
    probes: Mutex<ProbeStats>,
    stopping: Mutex<bool>,
    /// Set by [`Supervisor::rearm`]; the loop takes it as `Event::Rearm`.
    rearm: Mutex<bool>,
    /// A drill's fault on this daemon, while it lasts ([`Supervisor::set_fault`]).
    fault: Mutex<Option<DaemonFault>>,
    /// Set when the daemon's process ended ([`MpsDaemon::notify_exit`]): the loop looks again
    /// at once rather than waiting out its tick.
    exited: AtomicBool,
    wake: Condvar,
}

impl Shared {
    /// Wakes the loop now (`exited` first, so a wake between its look and its wait is kept).
    fn poke(&self) {
        self.exited.store(true, Ordering::SeqCst);
        let _stopping = lock(&self.stopping);
        self.wake.notify_all();
    }
}

/// The daemon's probes so far (for the agent's metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeStats {
    /// How long the last probe took.
    pub last_seconds: Option<f64>,
    /// Probes the daemon answered well, and probes that failed or found its servers unhealthy.
    pub ok: u64,
    pub failed: u64,
}

/// A drill's fault on one daemon: it is killed (`hang: false`) or stopped (`hang: true`);
/// `persistent` strikes again each daemon the agent starts in its place, else only the one
/// running when it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonFault {
    pub hang: bool,
    pub persistent: bool,
    /// The pid of the last daemon struck (the loop's bookkeeping).
    struck: Option<u32>,
    /// A fault injected once that has struck.
    spent: bool,
}

impl DaemonFault {
    pub fn new(hang: bool, persistent: bool) -> DaemonFault {
        DaemonFault { hang, persistent, struck: None, spent: false }
    }
}

/// The supervisors of a host's GPUs, by GPU.
pub type Supervisors =
    std::sync::Arc<std::collections::BTreeMap<mpsfleet_types::GpuUuid, std::sync::Arc<Supervisor>>>;

/// Supervises one GPU's MPS control daemon on its own thread.
pub struct Supervisor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor").field("label", &self.shared.label).field("check", &self.check()).finish()
    }
}

impl Supervisor {
    /// Starts supervising: the thread adopts the daemon that an earlier agent left running for
    /// this configuration ([`MpsControl::adopt`]: after an agent restart, even `kill -9`, its
    /// tasks keep their daemon), or else starts one (a failing start is retried and reported
    /// through the check, not returned here). `cfg.probe_timeout` is replaced by
    /// `policy.probe_timeout`. `label` names the GPU in logs and errors.
    pub fn spawn(
        label: impl Into<String>,
        control: Arc<dyn MpsControl>,
        mut cfg: DaemonConfig,
        policy: MpsPolicy,
        clock: Arc<dyn Clock>,
    ) -> Result<Supervisor, MpsError> {
        let label = label.into();
        cfg.probe_timeout = policy.probe_timeout;
        cfg.validate()?;
        policy.validate()?;
        let state = DaemonHealth::new(clock.now_ms());
        let (tx, _) = watch::channel(state.check.clone());
        let shared = Arc::new(Shared {
            label: label.clone(),
            cfg,
            policy: Mutex::new(policy),
            control,
            clock,
            daemon: Mutex::new(None),
            tx,
            history: Mutex::new(VecDeque::from([state.check.clone()])),
            probes: Mutex::new(ProbeStats::default()),
            stopping: Mutex::new(false),
            rearm: Mutex::new(false),
            fault: Mutex::new(None),
            exited: AtomicBool::new(false),
            wake: Condvar::new(),
        });
        let thread = std::thread::Builder::new()
            .name(format!("mps-{label}"))
            .spawn({
                let shared = shared.clone();
                move || run(&shared, state)
            })
            .map_err(|source| MpsError::Thread { label, source })?;
        Ok(Supervisor { shared, thread: Some(thread) })
    }

    /// Replaces the policy without restarting anything: the next probe runs with the new
    /// interval and timeout (a control command already running keeps its timeout), and the
    /// state machine keeps its counters, so a lowered failure threshold applies from the next
    /// failure on and a raised restart budget frees a daemon given up on. `cfg`'s start,
    /// quit and log settings stay as they are. An invalid policy is refused and the old one
    /// stays in force.
    pub fn set_policy(&self, policy: MpsPolicy) -> Result<(), MpsError> {
        policy.validate()?;
        let timeout = policy.probe_timeout;
        {
            let mut current = lock(&self.shared.policy);
            if *current == policy {
                return Ok(());
            }
            tracing::info!(gpu = %self.shared.label, from = ?*current, to = ?policy, "mps policy changed");
            *current = policy;
        }
        // For `ensure_answering` and `control` at once; the loop also sets it before each probe,
        // which covers a daemon started while this ran.
        if let Some(d) = self.current() {
            d.set_probe_timeout(timeout);
        }
        self.shared.wake.notify_all();
        Ok(())
    }

    /// The policy in force.
    pub fn policy(&self) -> MpsPolicy {
        lock(&self.shared.policy).clone()
    }

    /// The probes so far.
    pub fn probes(&self) -> ProbeStats {
        *lock(&self.shared.probes)
    }

    /// The operator fixed what made local repair give up (`host recheck`): the restart budget
    /// starts afresh and a daemon given up on is started again at once.
    pub fn rearm(&self) {
        *lock(&self.shared.rearm) = true;
        self.shared.wake.notify_all();
    }

    /// A drill's fault on this daemon, or none: a hung daemon the fault stopped is resumed
    /// when the fault goes (one restarted meanwhile is a new daemon). Setting the same fault
    /// again changes nothing.
    pub fn set_fault(&self, fault: Option<DaemonFault>) {
        let mut current = lock(&self.shared.fault);
        let same = |a: &DaemonFault, b: &DaemonFault| a.hang == b.hang && a.persistent == b.persistent;
        match (current.as_ref(), fault.as_ref()) {
            (Some(a), Some(b)) if same(a, b) => return,
            (None, None) => return,
            _ => {}
        }
        if let Some(old) = current.take() {
            if old.hang {
                if let Some(d) = lock(&self.shared.daemon).clone().filter(|d| Some(d.pid()) == old.struck) {
                    if let Err(e) = d.inject(super::Injected::Resume) {
                        tracing::warn!(gpu = %self.shared.label, error = %e, "resuming the stopped mps daemon");
                    }
                }
            }
            tracing::info!(gpu = %self.shared.label, "drill fault taken back");
        }
        *current = fault;
        drop(current);
        self.shared.wake.notify_all();
    }

    /// The latest check.
    pub fn check(&self) -> Check {
        self.shared.tx.borrow().clone()
    }

    /// Follows the check as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Check> {
        self.shared.tx.subscribe()
    }

    /// The last check transitions, oldest first (for incident timelines and tests).
    pub fn history(&self) -> Vec<Check> {
        lock(&self.shared.history).iter().cloned().collect()
    }

    /// `CUDA_MPS_PIPE_DIRECTORY` for this GPU's tasks.
    pub fn pipe_dir(&self) -> &Path {
        &self.shared.cfg.pipe_dir
    }

    /// The environment an MPS task on this GPU needs to reach the daemon.
    pub fn client_env(&self) -> Vec<(String, String)> {
        self.shared.cfg.client_env()
    }

    /// The PID of the running daemon, if one runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.current().map(|d| d.pid())
    }

    fn current(&self) -> Option<Arc<dyn MpsDaemon>> {
        lock(&self.shared.daemon).clone()
    }

    fn no_daemon(&self) -> MpsError {
        MpsError::NoDaemon { label: self.shared.label.clone(), reason: self.check().reason }
    }

    /// Fail-closed check before an MPS task starts: the daemon must answer a control command
    /// within the probe timeout, in at most `retries + 1` attempts `delay` apart. Blocking.
    pub fn ensure_answering(&self, retries: u32, delay: Duration) -> Result<(), MpsError> {
        let attempts = retries + 1;
        let mut reason = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                std::thread::sleep(delay);
            }
            match self.current() {
                None => reason = format!("daemon not running ({})", self.check().reason),
                Some(d) => match d.control("get_server_list") {
                    Ok(_) => return Ok(()),
                    Err(e) => reason = e.to_string(),
                },
            }
        }
        Err(MpsError::NotAnswering { label: self.shared.label.clone(), attempts, reason })
    }

    /// Runs one control command on the current daemon.
    pub fn control(&self, command: &str) -> Result<String, MpsError> {
        self.current().ok_or_else(|| self.no_daemon())?.control(command)
    }

    /// Ends a client's GPU work safely before its process is killed.
    pub fn terminate_client(&self, server_pid: u32, client_pid: u32) -> Result<(), MpsError> {
        self.current().ok_or_else(|| self.no_daemon())?.terminate_client(server_pid, client_pid)
    }

    /// Stops supervising and stops the daemon cleanly (`quit`, then kill after a bound).
    pub fn shutdown(mut self) -> Result<(), MpsError> {
        self.stop_thread();
        self.stop_daemon()
    }

    /// For agent restarts (exec of a new agent binary, hand-over): stops supervising but leaves
    /// the daemon running, with its record, for the next agent's `spawn` to adopt. Returns the
    /// daemon's PID, if one ran. Without this, dropping the supervisor stops the daemon; an
    /// agent that dies (`kill -9`) leaves it running the same way.
    pub fn detach(mut self) -> Option<u32> {
        self.stop_thread();
        let daemon = lock(&self.shared.daemon).take()?;
        daemon.detach();
        Some(daemon.pid())
    }

    fn stop_thread(&mut self) {
        *lock(&self.shared.stopping) = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    fn stop_daemon(&self) -> Result<(), MpsError> {
        match lock(&self.shared.daemon).take() {
            Some(d) => d.stop(),
            None => Ok(()),
        }
    }

    /// The daemon's log directory (its output is `control.log` there).
    pub fn log_dir(&self) -> PathBuf {
        self.shared.cfg.log_dir.clone()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_thread();
            if let Err(e) = self.stop_daemon() {
                tracing::warn!(gpu = %self.shared.label, error = %e, "stopping mps daemon");
            }
        }
    }
}

/// The loop: wake every tick, look for an exit and log events, probe when due, run effects.
fn run(shared: &Arc<Shared>, mut state: DaemonHealth) {
    // When the last probe ran; `None`: probe at once (a new daemon).
    let mut last_probe_ms: Option<u64> = None;
    let mut events: Vec<Event> = vec![Event::Tick];
    // Only the first start looks for a daemon to adopt; later ones replace a failed daemon.
    let mut adopt = true;
    loop {
        if *lock(&shared.stopping) {
            return;
        }
        let policy = lock(&shared.policy).clone();
        let interval_ms = policy.probe_interval.as_millis() as u64;
        let probe_due = last_probe_ms.is_none_or(|t| shared.clock.now_ms() >= t.saturating_add(interval_ms));
        let daemon = lock(&shared.daemon).clone();
        if let (Some(d), true) = (&daemon, state.wants_probe()) {
            strike(shared, d.as_ref());
        }
        if let Some(d) = &daemon {
            for e in d.poll_log() {
                tracing::warn!(gpu = %shared.label, line = e.line(), "mps server failure");
                match e {
                    LogEvent::ServerExited { line, .. } | LogEvent::Fatal { line } => {
                        events.push(Event::LogFatal { line })
                    }
                }
            }
            if let Some(exit) = d.try_exit() {
                mpsfleet_core::timeline!("daemon-exited", gpu = shared.label);
                // Reap it and kill what is left of its group, then let the machine decide.
                lock(&shared.daemon).take();
                if let Err(e) = d.stop() {
                    tracing::warn!(gpu = %shared.label, error = %e, "reaping the mps daemon");
                }
                events.push(Event::DaemonExited { reason: exit.to_string() });
            } else if state.wants_probe() && probe_due {
                d.set_probe_timeout(policy.probe_timeout);
                let watch = mpsfleet_core::clock::Stopwatch::start();
                let event = match d.probe() {
                    Ok(outcome) => match outcome.problem() {
                        None => Event::ProbeOk,
                        Some(reason) => Event::ServersUnhealthy { reason },
                    },
                    Err(e) => Event::ProbeFailed { reason: e.to_string() },
                };
                {
                    let mut p = lock(&shared.probes);
                    p.last_seconds = Some(watch.seconds());
                    if matches!(event, Event::ProbeOk) {
                        p.ok += 1;
                    } else {
                        p.failed += 1;
                    }
                }
                events.push(event);
                last_probe_ms = Some(shared.clock.now_ms());
            }
        }
        if std::mem::take(&mut *lock(&shared.rearm)) {
            tracing::info!(gpu = %shared.label, "local repair re-armed by the operator");
            events.push(Event::Rearm);
        }
        events.push(Event::Tick);

        while !events.is_empty() {
            for event in std::mem::take(&mut events) {
                let now = shared.clock.now_ms();
                let (next, effects) = health::step(state, event, now, &policy);
                state = next;
                for effect in effects {
                    match effect {
                        Effect::Report(check) => publish(shared, check),
                        Effect::Restart => {
                            if *lock(&shared.stopping) {
                                return;
                            }
                            events.push(restart(shared, &policy, std::mem::take(&mut adopt)));
                            last_probe_ms = None;
                        }
                    }
                }
            }
        }

        let stopping = lock(&shared.stopping);
        if *stopping {
            return;
        }
        if !shared.exited.swap(false, Ordering::SeqCst) {
            drop(shared.wake.wait_timeout(stopping, TICK));
        }
    }
}

/// A drill's fault strikes the running daemon, once per daemon while it lasts.
fn strike(shared: &Shared, d: &dyn MpsDaemon) {
    let mut fault = lock(&shared.fault);
    let Some(f) = fault.as_mut() else { return };
    if f.spent || f.struck == Some(d.pid()) {
        return;
    }
    let what = if f.hang { super::Injected::Hang } else { super::Injected::Exit };
    match d.inject(what) {
        Ok(()) => {
            tracing::warn!(gpu = %shared.label, pid = d.pid(), fault = ?what, "drill: injected a fault into the mps daemon")
        }
        Err(e) => {
            tracing::warn!(gpu = %shared.label, error = %e, "drill: cannot inject a fault into the mps daemon")
        }
    }
    f.struck = Some(d.pid());
    f.spent = !f.persistent;
}

/// Stops whatever is left of the daemon and starts a new one; with `adopt`, first tries to
/// adopt one an earlier agent left running. The daemon gets `policy`'s probe timeout.
fn restart(shared: &Arc<Shared>, policy: &MpsPolicy, adopt: bool) -> Event {
    mpsfleet_core::timeline!("daemon-restart", gpu = shared.label);
    let cfg = DaemonConfig { probe_timeout: policy.probe_timeout, ..shared.cfg.clone() };
    // A restart only follows a failure (the daemon exited or stopped answering), so `quit`
    // would only wait out its timeout: the old daemon's group is killed at once.
    let old = lock(&shared.daemon).take();
    if let Some(old) = old {
        if let Err(e) = old.kill() {
            tracing::warn!(gpu = %shared.label, error = %e, "stopping the old mps daemon");
        }
    }
    if adopt {
        match shared.control.adopt(&cfg) {
            Ok(Some(d)) => {
                let pid = d.pid();
                tracing::info!(gpu = %shared.label, pid, "adopted running mps control daemon");
                *lock(&shared.daemon) = Some(Arc::from(d));
                return Event::Adopted { pid };
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(gpu = %shared.label, error = %e, "cannot adopt an mps daemon; starting one")
            }
        }
    }
    match shared.control.start(&cfg) {
        Ok(d) => {
            mpsfleet_core::timeline!("daemon-started", gpu = shared.label);
            tracing::info!(gpu = %shared.label, pid = d.pid(), "mps control daemon started");
            let d: Arc<dyn MpsDaemon> = Arc::from(d);
            watch_exit(shared, &d);
            *lock(&shared.daemon) = Some(d);
            Event::RestartSucceeded
        }
        Err(e) => {
            tracing::warn!(gpu = %shared.label, error = %e, "mps control daemon did not start");
            Event::RestartFailed { reason: e.to_string() }
        }
    }
}

/// Has the loop woken as soon as `daemon`'s process ends.
fn watch_exit(shared: &Arc<Shared>, daemon: &Arc<dyn MpsDaemon>) {
    let weak = Arc::downgrade(shared);
    daemon.notify_exit(Box::new(move || {
        if let Some(shared) = weak.upgrade() {
            shared.poke();
        }
    }));
}

fn publish(shared: &Shared, check: Check) {
    mpsfleet_core::timeline!(
        "check",
        gpu = shared.label,
        status = check.status.as_str(),
        failing = check.failing_since_ms.is_some()
    );
    tracing::info!(
        gpu = %shared.label,
        status = check.status.as_str(),
        reason = %check.reason,
        failures = check.consecutive_failures,
        restarts = check.restarts,
        "mps daemon check"
    );
    {
        let mut history = lock(&shared.history);
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(check.clone());
    }
    shared.tx.send_replace(check);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mps::ModelMps;
    use mpsfleet_core::clock::SystemClock;
    use mpsfleet_types::HealthStatus;

    fn policy() -> MpsPolicy {
        MpsPolicy {
            probe_interval: Duration::from_millis(50),
            probe_timeout: Duration::from_secs(3),
            failure_threshold: 3,
            max_local_restarts: 3,
            restart_window: Duration::from_secs(600),
            restart_backoff: Duration::from_millis(10),
        }
    }

    fn wait_for(sup: &Supervisor, what: &str, f: impl Fn(&Check) -> bool) -> Check {
        for _ in 0..300 {
            let c = sup.check();
            if f(&c) {
                return c;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("timed out waiting for {what}: {:?}", sup.history());
    }

    fn start(model: &ModelMps, dir: &str) -> (Supervisor, PathBuf) {
        let cfg = DaemonConfig::new("mps", format!("/model/{dir}"), "/model/log");
        let pipe = cfg.pipe_dir.clone();
        let sup =
            Supervisor::spawn(dir, Arc::new(model.clone()), cfg, policy(), Arc::new(SystemClock)).unwrap();
        (sup, pipe)
    }

    #[test]
    fn starts_probes_and_recovers_from_a_kill() {
        let model = ModelMps::new();
        let (sup, pipe) = start(&model, "s1");
        wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        assert!(sup.ensure_answering(0, Duration::ZERO).is_ok());
        model.kill_daemon(&pipe, 9);
        let c = wait_for(&sup, "restart", |c| c.restarts == 1 && c.consecutive_failures == 0);
        assert_eq!(c.status, HealthStatus::Ok);
        assert!(sup.history().iter().any(|c| c.reason == "daemon exited (signal 9)"), "{:?}", sup.history());
        sup.shutdown().unwrap();
        assert!(!model.daemon_alive(&pipe));
    }

    /// A drill's persistent fault strikes the daemon and each one started in its place until
    /// local repair gives up; taken back and re-armed, a new daemon answers. Injected once, a
    /// fault is repaired by the first restart.
    #[test]
    fn a_drill_fault_strikes_each_new_daemon_while_it_persists() {
        let model = ModelMps::new();
        let (sup, _) = start(&model, "s7");
        wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        sup.set_fault(Some(DaemonFault::new(false, true)));
        let c = wait_for(&sup, "given up", |c| c.reason.contains(super::super::health::RESTARTS_EXHAUSTED));
        assert_eq!((c.status, c.restarts), (HealthStatus::Impaired, 3), "{:?}", sup.history());
        sup.set_fault(None);
        sup.rearm();
        wait_for(&sup, "ok again", |c| c.status == HealthStatus::Ok);

        let (once, _) = start(&model, "s8");
        wait_for(&once, "ok", |c| c.status == HealthStatus::Ok);
        once.set_fault(Some(DaemonFault::new(true, false)));
        let c = wait_for(&once, "repaired", |c| c.restarts == 1 && c.status == HealthStatus::Ok);
        assert_eq!(c.consecutive_failures, 0);
        assert!(once.history().iter().any(|c| c.status == HealthStatus::Impaired), "{:?}", once.history());
    }

    #[test]
    fn a_hang_impairs_then_restarts() {
        let model = ModelMps::new();
        let (sup, pipe) = start(&model, "s2");
        wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        model.hang_daemon(&pipe);
        // The restart replaces the hung daemon; the new one answers.
        let c = wait_for(&sup, "restart", |c| c.restarts == 1 && c.status == HealthStatus::Ok);
        assert_eq!(c.consecutive_failures, 0);
        assert!(sup
            .history()
            .iter()
            .any(|c| c.status == HealthStatus::Impaired && c.reason.contains("timed out")));
        drop(sup);
        assert!(!model.daemon_alive(&pipe), "drop stops the daemon");
    }

    #[test]
    fn ensure_answering_fails_closed_on_a_hung_daemon() {
        let model = ModelMps::new();
        let cfg = DaemonConfig::new("mps", "/model/s5", "/model/log");
        let slow = MpsPolicy { probe_interval: Duration::from_secs(3600), ..policy() };
        let sup = Supervisor::spawn("s5", Arc::new(model.clone()), cfg, slow, Arc::new(SystemClock)).unwrap();
        wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        assert_eq!(sup.pipe_dir(), Path::new("/model/s5"));
        model.hang_daemon(sup.pipe_dir());
        let err = sup.ensure_answering(1, Duration::from_millis(1)).unwrap_err().to_string();
        assert_eq!(err, "mps daemon s5 not answering after 2 attempts: probe timed out after 3s");
        model.resume_daemon(sup.pipe_dir());
        assert!(sup.ensure_answering(0, Duration::ZERO).is_ok());
        sup.shutdown().unwrap();
    }

    #[test]
    fn set_policy_applies_at_the_next_probe_without_restarting_the_daemon() {
        let model = ModelMps::new();
        let (sup, pipe) = start(&model, "s7");
        wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        let pid = sup.daemon_pid().expect("a daemon");

        let invalid = MpsPolicy { failure_threshold: 0, ..policy() };
        assert!(sup.set_policy(invalid).unwrap_err().to_string().contains("failure_threshold"));
        assert_eq!(sup.policy(), policy(), "an invalid policy changes nothing");

        // One failure is enough now, with the new timeout, and no restart is allowed.
        let strict = MpsPolicy {
            probe_timeout: Duration::from_millis(700),
            failure_threshold: 1,
            max_local_restarts: 0,
            ..policy()
        };
        sup.set_policy(strict.clone()).unwrap();
        assert_eq!(sup.policy(), strict);
        assert_eq!(sup.daemon_pid(), Some(pid), "setting the policy restarts nothing");
        model.hang_daemon(&pipe);
        let c = wait_for(&sup, "impaired", |c| c.status == HealthStatus::Impaired);
        assert_eq!((c.consecutive_failures, c.restarts), (1, 0), "{c:?}");
        assert!(c.reason.contains("probe timed out after 700ms"), "{c:?}");
        let err = sup.ensure_answering(0, Duration::ZERO).unwrap_err().to_string();
        assert!(err.ends_with("probe timed out after 700ms"), "{err}");
        assert_eq!(sup.daemon_pid(), Some(pid), "the same daemon, never restarted");

        // It comes back on its own; the counters carried on.
        model.resume_daemon(&pipe);
        let c = wait_for(&sup, "ok again", |c| c.status == HealthStatus::Ok);
        assert_eq!((c.consecutive_failures, c.restarts), (0, 0), "{c:?}");
        assert_eq!(sup.daemon_pid(), Some(pid));
        sup.shutdown().unwrap();
    }

    #[test]
    fn a_new_supervisor_adopts_the_daemon_left_running() {
        let model = ModelMps::new();
        let (sup, pipe) = start(&model, "s6");
        wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        sup.control("set_default_active_thread_percentage 40").unwrap();
        let pid = sup.detach().expect("a daemon");
        assert!(model.daemon_alive(&pipe), "detach leaves it running");

        let (sup, _) = start(&model, "s6");
        let c = wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        assert_eq!((c.restarts, c.consecutive_failures), (0, 0));
        assert_eq!(sup.daemon_pid(), Some(pid), "the same daemon");
        assert_eq!(sup.control("get_default_active_thread_percentage").unwrap(), "40.0");
        let adopted = format!("adopted running daemon {pid}; waiting for the first probe");
        assert!(sup.history().iter().any(|c| c.reason == adopted), "{:?}", sup.history());
        // Later restarts start a new daemon.
        model.kill_daemon(&pipe, 9);
        wait_for(&sup, "restart", |c| c.restarts == 1 && c.status == HealthStatus::Ok);
        assert_ne!(sup.daemon_pid(), Some(pid));
        sup.shutdown().unwrap();
        assert!(!model.daemon_alive(&pipe));
    }

    #[test]
    fn a_daemon_that_never_starts_ends_impaired() {
        let model = ModelMps::new();
        model.set_start_failure(Path::new("/model/s3"), Some("boom"));
        let (sup, _) = start(&model, "s3");
        let c = wait_for(&sup, "exhausted", |c| c.reason.contains("exhausted"));
        assert_eq!(c.status, HealthStatus::Impaired);
        assert!(c.reason.contains("boom"), "{c:?}");
        assert!(matches!(sup.ensure_answering(0, Duration::ZERO), Err(MpsError::NotAnswering { .. })));
        assert!(matches!(sup.terminate_client(1, 2), Err(MpsError::NoDaemon { .. })));
        sup.shutdown().unwrap();
    }

    #[test]
    fn server_fault_is_reported() {
        let model = ModelMps::new();
        let (sup, pipe) = start(&model, "s4");
        wait_for(&sup, "ok", |c| c.status == HealthStatus::Ok);
        let server = model.connect_client(&pipe, 10, 0).unwrap();
        model.fault_server(&pipe);
        let c = wait_for(&sup, "impaired", |c| c.status == HealthStatus::Impaired);
        assert!(c.reason.contains("FAULT"), "{c:?}");
        assert_eq!(c.restarts, 0, "a server fault does not restart the daemon");
        sup.terminate_client(server, 10).unwrap();
        wait_for(&sup, "ok again", |c| c.status == HealthStatus::Ok && c.consecutive_failures == 0);
        sup.shutdown().unwrap();
    }
}
