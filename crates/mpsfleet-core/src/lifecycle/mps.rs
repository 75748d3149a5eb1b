//! The health of one GPU's MPS daemon as a pure state machine: `step(state, event, now)` returns
//! the next state and the effects (restart the daemon, report the check) for a shell to run
//! (the agent's supervisor thread, or the simulator's agents). No I/O and no clock reads here.

use std::time::Duration;

use mpsfleet_types::{HealthPolicy, HealthStatus};

fn fmt_duration(d: Duration) -> String {
    crate::health::fmt_ms(d.as_millis() as u64)
}

/// An invalid [`MpsPolicy`]: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid mps policy: {field}: {reason}")]
pub struct PolicyError {
    pub field: &'static str,
    pub reason: String,
}

/// Detection and local-repair policy for one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsPolicy {
    /// How often the daemon is probed.
    pub probe_interval: Duration,
    /// Hard timeout of each probe command; a hang counts as a failure.
    pub probe_timeout: Duration,
    /// Consecutive failures before the check turns IMPAIRED (and a hung daemon is restarted).
    pub failure_threshold: u32,
    /// Local restarts allowed within `restart_window`; beyond it the check stays IMPAIRED.
    pub max_local_restarts: u32,
    pub restart_window: Duration,
    /// Delay before the n-th restart within the window: `restart_backoff * (n - 1)` (the first
    /// restart of a dead daemon is immediate).
    pub restart_backoff: Duration,
}

impl Default for MpsPolicy {
    fn default() -> Self {
        Self {
            probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(3),
            failure_threshold: 3,
            max_local_restarts: 3,
            restart_window: Duration::from_secs(600),
            restart_backoff: Duration::from_secs(1),
        }
    }
}

impl MpsPolicy {
    /// Checks the policy once at start-up; errors name the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let invalid =
            |field: &'static str| Err(PolicyError { field, reason: "must be greater than 0".into() });
        if self.probe_interval.is_zero() {
            return invalid("probe_interval");
        }
        if self.probe_timeout.is_zero() {
            return invalid("probe_timeout");
        }
        if self.failure_threshold == 0 {
            return invalid("failure_threshold");
        }
        if self.restart_window.is_zero() {
            return invalid("restart_window");
        }
        Ok(())
    }
}

/// The MPS policy a pool's health policy asks for: its probe interval and timeout, failure
/// threshold and local restarts; the restart window and backoff stay `base`'s.
pub fn pool_mps_policy(health: &HealthPolicy, base: &MpsPolicy) -> MpsPolicy {
    MpsPolicy {
        probe_interval: Duration::from_millis(health.mps_probe_interval_ms),
        probe_timeout: Duration::from_millis(health.mps_probe_timeout_ms),
        failure_threshold: health.mps_failure_threshold,
        max_local_restarts: health.local_daemon_restarts,
        ..base.clone()
    }
}

/// The daemon's health check as the agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub status: HealthStatus,
    pub reason: String,
    /// When `status` last changed.
    pub since_ms: u64,
    pub consecutive_failures: u32,
    /// Local restarts so far (the first start is not one).
    pub restarts: u32,
    /// The first failed signal (a failed probe, the daemon's exit, a failed start) of the
    /// failure going on now: set at the first failure after the daemon was answering, kept
    /// through local restarts, cleared once the daemon has answered `failure_threshold` probes
    /// in a row again. What an incident's timing starts from.
    pub failing_since_ms: Option<u64>,
    /// When each local restart of that failure was made (at most [`REPAIRS_KEPT`], the latest).
    pub repairs_ms: Vec<u64>,
}

/// Local restarts of one failure a check keeps the times of.
pub const REPAIRS_KEPT: usize = 16;

/// What a check's reason says once the local restarts are used up.
pub const RESTARTS_EXHAUSTED: &str = "local restarts exhausted";

/// What the shell observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The daemon answered and its servers are fine.
    ProbeOk,
    /// The daemon did not answer (timed out, not running, error).
    ProbeFailed {
        reason: String,
    },
    /// The daemon answered, but a server is in FAULT or gone: counts as a failure, no restart.
    ServersUnhealthy {
        reason: String,
    },
    /// The daemon process ended.
    DaemonExited {
        reason: String,
    },
    /// control.log reported a server failure (non-zero exit, fatal exception).
    LogFatal {
        line: String,
    },
    RestartSucceeded,
    /// Answers the first `Restart`: instead of starting one, the shell adopted the daemon an
    /// earlier agent left running. Like `RestartSucceeded`, and the check says so.
    Adopted {
        pid: u32,
    },
    RestartFailed {
        reason: String,
    },
    /// Time passed; due restarts happen on ticks.
    Tick,
    /// The operator fixed what made local repair give up (`host recheck`): the restart budget
    /// starts afresh and a daemon given up on is started again now.
    Rearm,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Stop whatever is left of the daemon and start it again (also the very first start);
    /// answer with `RestartSucceeded` or `RestartFailed`.
    Restart,
    /// The check changed: publish it.
    Report(Check),
}

/// Where the daemon's lifecycle stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A (re)start is due at this time.
    StartDue { at_ms: u64 },
    /// `Effect::Restart` was emitted; waiting for its result.
    Starting,
    /// The daemon runs and is probed.
    Running,
    /// Local restarts are used up for now; the check stays IMPAIRED until the window frees one.
    GaveUp,
}

/// The state of one daemon's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonHealth {
    pub phase: Phase,
    pub check: Check,
    /// The first start has not succeeded yet; its attempt is not a restart.
    first_start: bool,
    /// A probe has succeeded at least once.
    ever_ok: bool,
    /// Times of local restarts within the window.
    restart_times_ms: Vec<u64>,
    /// Times of control.log failures within the window.
    log_failure_times_ms: Vec<u64>,
    last_log_failure: String,
    last_failure: String,
    /// PID of the daemon adopted at the first start, until the first probe succeeds.
    adopted: Option<u32>,
    /// Probes answered in a row since the last failure.
    consecutive_oks: u32,
}

const ANSWERING: &str = "daemon answering";

impl DaemonHealth {
    /// A daemon about to be started for the first time: INITIALIZING, start due now.
    pub fn new(now_ms: u64) -> Self {
        Self {
            phase: Phase::StartDue { at_ms: now_ms },
            check: Check {
                status: HealthStatus::Initializing,
                reason: "starting daemon".to_string(),
                since_ms: now_ms,
                consecutive_failures: 0,
                restarts: 0,
                failing_since_ms: None,
                repairs_ms: Vec::new(),
            },
            first_start: true,
            ever_ok: false,
            restart_times_ms: Vec::new(),
            log_failure_times_ms: Vec::new(),
            last_log_failure: String::new(),
            last_failure: String::new(),
            adopted: None,
            consecutive_oks: 0,
        }
    }

    /// Whether the shell should probe now, if it holds a daemon: while it runs, and after
    /// giving up on a hung one (it may come back on its own).
    pub fn wants_probe(&self) -> bool {
        matches!(self.phase, Phase::Running | Phase::GaveUp)
    }
}

/// One step of the machine.
pub fn step(
    mut s: DaemonHealth,
    event: Event,
    now_ms: u64,
    policy: &MpsPolicy,
) -> (DaemonHealth, Vec<Effect>) {
    let before = s.check.clone();
    let window_ms = policy.restart_window.as_millis() as u64;
    match event {
        Event::Tick => {}
        Event::Rearm => {
            s.restart_times_ms.clear();
            if s.phase == Phase::GaveUp {
                s.phase = Phase::StartDue { at_ms: now_ms };
            }
        }
        Event::ProbeOk => {
            // A hung daemon that was given up on may still come back on its own.
            if matches!(s.phase, Phase::Running | Phase::GaveUp) {
                s.ever_ok = true;
                s.adopted = None;
                s.check.consecutive_failures = 0;
                s.phase = Phase::Running;
                s.consecutive_oks += 1;
                if s.consecutive_oks >= policy.failure_threshold {
                    s.check.failing_since_ms = None;
                    s.check.repairs_ms.clear();
                }
            }
        }
        Event::ProbeFailed { reason } => {
            if s.phase == Phase::GaveUp {
                fail(&mut s, reason, now_ms);
            } else if s.phase == Phase::Running {
                fail(&mut s, reason, now_ms);
                // A hung or unreachable daemon is restarted only once it has failed often
                // enough: a restart takes its servers, and their clients, down with it.
                if s.check.consecutive_failures >= policy.failure_threshold {
                    schedule_restart(&mut s, now_ms, policy);
                }
            }
        }
        Event::ServersUnhealthy { reason } => {
            if s.phase == Phase::Running {
                fail(&mut s, reason, now_ms);
            }
        }
        Event::DaemonExited { reason } => {
            if s.phase == Phase::Running {
                fail(&mut s, reason, now_ms);
                schedule_restart(&mut s, now_ms, policy);
            }
        }
        Event::LogFatal { line } => {
            s.log_failure_times_ms.push(now_ms);
            s.last_log_failure = line;
        }
        Event::RestartSucceeded => {
            if s.phase == Phase::Starting {
                s.first_start = false;
                s.phase = Phase::Running;
            }
        }
        Event::Adopted { pid } => {
            if s.phase == Phase::Starting {
                s.first_start = false;
                s.adopted = Some(pid);
                s.phase = Phase::Running;
            }
        }
        Event::RestartFailed { reason } => {
            if s.phase == Phase::Starting {
                fail(&mut s, format!("daemon failed to start: {reason}"), now_ms);
                s.phase = Phase::Running; // so that schedule_restart takes it
                schedule_restart(&mut s, now_ms, policy);
            }
        }
    }

    // Time-driven part, on every event.
    s.restart_times_ms.retain(|&t| t + window_ms > now_ms);
    s.log_failure_times_ms.retain(|&t| t + window_ms > now_ms);
    let mut effects = Vec::new();
    if s.phase == Phase::GaveUp && (s.restart_times_ms.len() as u32) < policy.max_local_restarts {
        s.phase = Phase::StartDue { at_ms: now_ms };
    }
    if let Phase::StartDue { at_ms } = s.phase {
        if now_ms >= at_ms {
            if !s.first_start || s.check.consecutive_failures > 0 {
                s.restart_times_ms.push(now_ms);
                s.check.restarts += 1;
                if s.check.failing_since_ms.is_some() {
                    if s.check.repairs_ms.len() >= REPAIRS_KEPT {
                        s.check.repairs_ms.remove(0);
                    }
                    s.check.repairs_ms.push(now_ms);
                }
            }
            s.phase = Phase::Starting;
            effects.push(Effect::Restart);
        }
    }

    let (status, reason) = evaluate(&s, policy);
    if status != s.check.status {
        s.check.since_ms = now_ms;
    }
    s.check.status = status;
    s.check.reason = reason;
    if s.check != before {
        // Published before a restart runs: the server learns of the failure at once, not
        // after the restart (which may take a while) is over.
        effects.insert(0, Effect::Report(s.check.clone()));
    }
    (s, effects)
}

fn fail(s: &mut DaemonHealth, reason: String, now_ms: u64) {
    s.check.consecutive_failures += 1;
    s.consecutive_oks = 0;
    s.check.failing_since_ms.get_or_insert(now_ms);
    s.last_failure = reason;
}

/// Restart now or after the backoff, or give up when the window's restarts are used.
fn schedule_restart(s: &mut DaemonHealth, now_ms: u64, policy: &MpsPolicy) {
    if s.phase != Phase::Running {
        return;
    }
    let used = s.restart_times_ms.len() as u32;
    if used >= policy.max_local_restarts {
        s.phase = Phase::GaveUp;
        return;
    }
    let delay = policy.restart_backoff.as_millis() as u64 * u64::from(used);
    s.phase = Phase::StartDue { at_ms: now_ms + delay };
}

fn evaluate(s: &DaemonHealth, policy: &MpsPolicy) -> (HealthStatus, String) {
    if s.phase == Phase::GaveUp {
        return (
            HealthStatus::Impaired,
            format!(
                "{}; {RESTARTS_EXHAUSTED} ({} within {})",
                s.last_failure,
                policy.max_local_restarts,
                fmt_duration(policy.restart_window)
            ),
        );
    }
    if s.check.consecutive_failures >= policy.failure_threshold {
        return (HealthStatus::Impaired, s.last_failure.clone());
    }
    let log_failures = s.log_failure_times_ms.len() as u32;
    if log_failures >= policy.failure_threshold {
        return (
            HealthStatus::Impaired,
            format!(
                "{log_failures} server failures within {}, last: {}",
                fmt_duration(policy.restart_window),
                s.last_log_failure
            ),
        );
    }
    let status = if s.ever_ok { HealthStatus::Ok } else { HealthStatus::Initializing };
    let reason = if s.check.consecutive_failures > 0 {
        s.last_failure.clone()
    } else if let (false, Phase::Running, Some(pid)) = (s.ever_ok, s.phase, s.adopted) {
        format!("adopted running daemon {pid}; waiting for the first probe")
    } else if !s.ever_ok && s.phase == Phase::Running {
        "waiting for the first probe".to_string()
    } else if !s.ever_ok {
        "starting daemon".to_string()
    } else if log_failures > 0 {
        format!("{ANSWERING}; server failure: {}", s.last_log_failure)
    } else {
        ANSWERING.to_string()
    };
    (status, reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Event::*;
    use HealthStatus::*;

    fn policy() -> MpsPolicy {
        MpsPolicy {
            probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(3),
            failure_threshold: 3,
            max_local_restarts: 3,
            restart_window: Duration::from_secs(600),
            restart_backoff: Duration::from_secs(1),
        }
    }

    fn exited() -> Event {
        DaemonExited { reason: "daemon exited (signal 9)".into() }
    }
    fn timed_out() -> Event {
        ProbeFailed { reason: "probe timed out after 3s".into() }
    }

    /// Runs `events` (each at a time in ms) from a fresh state started at 0, answering every
    /// `Restart` with `restart_result` (None: answer nothing), and checks the final check and
    /// the number of restarts emitted.
    fn check(
        name: &str,
        events: &[(u64, Event)],
        restart_result: Option<Event>,
        want: (HealthStatus, &str, u32, u32),
        want_phase: Phase,
    ) {
        let p = policy();
        let mut s = DaemonHealth::new(0);
        let mut pending: Vec<(u64, Event)> = vec![(0, Tick)];
        pending.extend(events.iter().cloned());
        let mut i = 0;
        while i < pending.len() {
            let (t, ev) = pending[i].clone();
            let (next, effects) = step(s, ev, t, &p);
            s = next;
            for e in effects {
                if e == Effect::Restart {
                    if let Some(r) = &restart_result {
                        pending.insert(i + 1, (t, r.clone()));
                    }
                }
            }
            i += 1;
        }
        let (status, reason, failures, restarts) = want;
        assert_eq!(s.check.status, status, "{name}: {:?}", s.check);
        assert!(s.check.reason.contains(reason), "{name}: reason {:?} lacks {reason:?}", s.check.reason);
        assert_eq!(s.check.consecutive_failures, failures, "{name}: failures");
        assert_eq!(s.check.restarts, restarts, "{name}: restarts");
        assert_eq!(s.phase, want_phase, "{name}: phase");
    }

    #[test]
    fn table() {
        let ok = Some(RestartSucceeded);
        let start_fails = Some(RestartFailed { reason: "daemon exited (status 1) while starting".into() });
        check("fresh", &[], None, (Initializing, "starting daemon", 0, 0), Phase::Starting);
        check(
            "first start ok, no probe yet",
            &[],
            ok.clone(),
            (Initializing, "first probe", 0, 0),
            Phase::Running,
        );
        check("first probe ok", &[(10, ProbeOk)], ok.clone(), (Ok, "daemon answering", 0, 0), Phase::Running);
        check(
            "one timeout stays ok but says why",
            &[(10, ProbeOk), (20, timed_out())],
            ok.clone(),
            (Ok, "timed out", 1, 0),
            Phase::Running,
        );
        check(
            "a timeout then ok recovers without a restart",
            &[(10, ProbeOk), (20, timed_out()), (30, ProbeOk)],
            ok.clone(),
            (Ok, "daemon answering", 0, 0),
            Phase::Running,
        );
        check(
            "three timeouts: impaired and restarted",
            &[(10, ProbeOk), (20, timed_out()), (30, timed_out()), (40, timed_out())],
            ok.clone(),
            (Impaired, "probe timed out after 3s", 3, 1),
            Phase::Running,
        );
        check(
            "restart of a hung daemon then ok probe: ok",
            &[(10, ProbeOk), (20, timed_out()), (30, timed_out()), (40, timed_out()), (50, ProbeOk)],
            ok.clone(),
            (Ok, "daemon answering", 0, 1),
            Phase::Running,
        );
        check(
            "kill -9: restarted at once, failure shown",
            &[(10, ProbeOk), (20, exited())],
            ok.clone(),
            (Ok, "signal 9", 1, 1),
            Phase::Running,
        );
        check(
            "kill -9 then ok probe: ok",
            &[(10, ProbeOk), (20, exited()), (25, ProbeOk)],
            ok.clone(),
            (Ok, "daemon answering", 0, 1),
            Phase::Running,
        );
        check(
            "killed over and over: impaired after the threshold",
            &[(10, ProbeOk), (20, exited()), (2000, exited()), (3000, Tick), (5000, exited())],
            ok.clone(),
            (Impaired, "signal 9", 3, 2),
            Phase::StartDue { at_ms: 7000 },
        );
        check(
            "killed beyond the restart budget: impaired, restarts exhausted",
            &[
                (10, ProbeOk),
                (20, exited()),
                (2000, exited()),
                (3000, Tick),
                (5000, exited()),
                (7000, Tick),
                (9000, exited()),
            ],
            ok.clone(),
            (Impaired, "(signal 9); local restarts exhausted (3 within 10m)", 4, 3),
            Phase::GaveUp,
        );
        check(
            "a hung daemon given up on that answers again is ok",
            &[
                (10, ProbeOk),
                (20, exited()),
                (2000, exited()),
                (3000, Tick),
                (5000, exited()),
                (7000, Tick),
                (8000, timed_out()),
                (9000, timed_out()),
                (9500, timed_out()),
                (9600, timed_out()),
                (9700, ProbeOk),
            ],
            ok.clone(),
            (Ok, "daemon answering", 0, 3),
            Phase::Running,
        );
        check(
            "a daemon that never starts: initializing, then impaired, then exhausted",
            &[(1000, Tick), (3000, Tick), (6000, Tick), (10000, Tick)],
            start_fails.clone(),
            (
                Impaired,
                "daemon failed to start: daemon exited (status 1) while starting; local restarts exhausted",
                4,
                3,
            ),
            Phase::GaveUp,
        );
        check(
            "adopted at the first start: no restart, the check says so",
            &[],
            Some(Adopted { pid: 77 }),
            (Initializing, "adopted running daemon 77; waiting for the first probe", 0, 0),
            Phase::Running,
        );
        check(
            "adopted, then answering",
            &[(10, ProbeOk)],
            Some(Adopted { pid: 77 }),
            (Ok, "daemon answering", 0, 0),
            Phase::Running,
        );
        check(
            "start still in progress",
            &[(1000, Tick)],
            None,
            (Initializing, "starting daemon", 0, 0),
            Phase::Starting,
        );
        check(
            "servers in fault count but do not restart",
            &[(10, ProbeOk), (20, ServersUnhealthy { reason: "mps server 7 in FAULT".into() })],
            ok.clone(),
            (Ok, "FAULT", 1, 0),
            Phase::Running,
        );
        check(
            "servers in fault three times: impaired, still no restart",
            &[
                (10, ProbeOk),
                (20, ServersUnhealthy { reason: "mps server 7 in FAULT".into() }),
                (30, ServersUnhealthy { reason: "mps server 7 in FAULT".into() }),
                (40, ServersUnhealthy { reason: "mps server 7 in FAULT".into() }),
            ],
            ok.clone(),
            (Impaired, "mps server 7 in FAULT", 3, 0),
            Phase::Running,
        );
        check(
            "one server failure in the log is noted",
            &[(10, ProbeOk), (20, LogFatal { line: "Server 9 exited with status 1".into() }), (30, ProbeOk)],
            ok.clone(),
            (Ok, "server failure: Server 9 exited", 0, 0),
            Phase::Running,
        );
        let crash = || LogFatal { line: "Server 9 exited with status 1".into() };
        check(
            "a crash-looping server impairs even while the daemon answers",
            &[
                (10, ProbeOk),
                (20, crash()),
                (30, ProbeOk),
                (40, crash()),
                (50, ProbeOk),
                (60, crash()),
                (70, ProbeOk),
            ],
            ok.clone(),
            (Impaired, "3 server failures within 10m, last: Server 9 exited", 0, 0),
            Phase::Running,
        );
        check(
            "server failures age out of the window",
            &[(10, ProbeOk), (20, crash()), (30, crash()), (40, crash()), (700_000, ProbeOk)],
            ok.clone(),
            (Ok, "daemon answering", 0, 0),
            Phase::Running,
        );
        check(
            "probe results during a restart are ignored",
            &[(0, RestartSucceeded), (10, ProbeOk), (20, exited()), (21, timed_out())],
            None,
            (Ok, "signal 9", 1, 1),
            Phase::Starting,
        );
    }

    #[test]
    fn restarts_back_off_and_the_window_frees_them() {
        let p = policy();
        let mut s = DaemonHealth::new(0);
        let run = |s: DaemonHealth, ev: Event, t: u64| step(s, ev, t, &p);
        let (n, e) = run(s, Tick, 0);
        assert_eq!(e.first(), Some(&Effect::Restart));
        s = run(n, RestartSucceeded, 0).0;
        s = run(s, ProbeOk, 10).0;
        // First restart immediate.
        let (n, e) = run(s, exited(), 100);
        assert!(e.contains(&Effect::Restart), "{e:?}");
        s = run(n, RestartSucceeded, 100).0;
        // Second restart waits one backoff.
        let (n, e) = run(s, exited(), 200);
        assert!(!e.contains(&Effect::Restart));
        assert_eq!(n.phase, Phase::StartDue { at_ms: 1200 });
        let (n, e) = run(n, Tick, 1199);
        assert!(!e.contains(&Effect::Restart));
        let (n, e) = run(n, Tick, 1200);
        assert!(e.contains(&Effect::Restart));
        s = run(n, RestartSucceeded, 1200).0;
        // Third waits two backoffs.
        let (n, _) = run(s, exited(), 1300);
        assert_eq!(n.phase, Phase::StartDue { at_ms: 3300 });
        let (n, _) = run(n, Tick, 3300);
        s = run(n, RestartSucceeded, 3300).0;
        // Fourth: none left.
        let (n, e) = run(s, exited(), 4000);
        assert_eq!(n.phase, Phase::GaveUp);
        assert!(e.iter().any(|e| matches!(e, Effect::Report(c) if c.status == Impaired)), "{e:?}");
        // Ten minutes after the first restart, one is free again.
        let (n, e) = run(n, Tick, 100 + 600_000);
        assert!(e.contains(&Effect::Restart), "{e:?}");
        assert_eq!(n.check.restarts, 4);
    }

    #[test]
    fn an_adopted_daemon_that_hangs_is_restarted_the_normal_way() {
        let p = policy();
        let (s, e) = step(DaemonHealth::new(0), Tick, 0, &p);
        assert_eq!(e.first(), Some(&Effect::Restart));
        let (s, e) = step(s, Adopted { pid: 77 }, 1, &p);
        assert!(
            matches!(&e[..], [Effect::Report(c)] if c.reason == "adopted running daemon 77; waiting for the first probe"),
            "{e:?}"
        );
        let (s, _) = step(s, timed_out(), 10, &p);
        let (s, _) = step(s, timed_out(), 20, &p);
        let (s, e) = step(s, timed_out(), 30, &p);
        assert!(e.contains(&Effect::Restart), "{e:?}");
        assert_eq!((s.check.status, s.check.restarts), (Impaired, 1));
        let (s, _) = step(s, RestartSucceeded, 40, &p);
        let (s, _) = step(s, ProbeOk, 50, &p);
        assert_eq!((s.check.status, s.check.reason.as_str()), (Ok, "daemon answering"));
    }

    #[test]
    fn a_lowered_threshold_applies_to_the_next_failure() {
        let p = policy();
        let (s, _) = step(DaemonHealth::new(0), Tick, 0, &p);
        let (s, _) = step(s, RestartSucceeded, 1, &p);
        let (s, _) = step(s, ProbeOk, 10, &p);
        let (s, e) = step(s, timed_out(), 20, &p);
        assert!(!e.contains(&Effect::Restart), "{e:?}");
        assert_eq!((s.check.status, s.check.consecutive_failures), (Ok, 1));
        // The policy changes between steps; the counters carry on.
        let lowered = MpsPolicy { failure_threshold: 2, ..policy() };
        let (s, e) = step(s, timed_out(), 30, &lowered);
        assert!(e.contains(&Effect::Restart), "{e:?}");
        assert_eq!((s.check.status, s.check.consecutive_failures, s.check.restarts), (Impaired, 2, 1));
    }

    #[test]
    fn a_pools_health_policy_sets_probing_and_restarts_and_keeps_the_window() {
        let base = MpsPolicy { restart_window: Duration::from_secs(60), ..policy() };
        let health = HealthPolicy {
            mps_probe_interval_ms: 2_000,
            mps_probe_timeout_ms: 500,
            mps_failure_threshold: 5,
            local_daemon_restarts: 0,
            ..HealthPolicy::default()
        };
        let got = pool_mps_policy(&health, &base);
        assert_eq!(
            got,
            MpsPolicy {
                probe_interval: Duration::from_secs(2),
                probe_timeout: Duration::from_millis(500),
                failure_threshold: 5,
                max_local_restarts: 0,
                restart_window: Duration::from_secs(60),
                restart_backoff: base.restart_backoff,
            }
        );
        assert!(got.validate().is_ok());
    }

    #[test]
    fn policy_validation_names_the_field() {
        assert!(MpsPolicy::default().validate().is_ok());
        let p = MpsPolicy { failure_threshold: 0, ..MpsPolicy::default() };
        assert!(p.validate().unwrap_err().to_string().contains("failure_threshold"));
        let p = MpsPolicy { probe_interval: Duration::ZERO, ..MpsPolicy::default() };
        assert!(p.validate().unwrap_err().to_string().contains("probe_interval"));
        assert_eq!(
            MpsPolicy { restart_window: Duration::ZERO, ..MpsPolicy::default() }
                .validate()
                .unwrap_err()
                .to_string(),
            "invalid mps policy: restart_window: must be greater than 0"
        );
    }

    #[test]
    fn reports_only_changes_and_since_follows_status() {
        let p = policy();
        let (s, _) = step(DaemonHealth::new(0), Tick, 0, &p);
        let (s, _) = step(s, RestartSucceeded, 5, &p);
        let (s, e) = step(s, ProbeOk, 50, &p);
        assert!(matches!(&e[..], [Effect::Report(c)] if c.status == Ok && c.since_ms == 50), "{e:?}");
        let (s, e) = step(s, ProbeOk, 60, &p);
        assert!(e.is_empty(), "{e:?}");
        let (s, e) = step(s, Tick, 70, &p);
        assert!(e.is_empty(), "{e:?}");
        let (s, _) = step(s, timed_out(), 80, &p);
        assert_eq!(s.check.since_ms, 50, "still OK, since unchanged");
    }

    /// A daemon killed again after each local restart: the failure starts at the first kill
    /// and holds through every restart (each timed) until the agent gives up; answering
    /// `failure_threshold` probes in a row ends it.
    #[test]
    fn a_failure_is_timed_from_its_first_signal_through_local_restarts() {
        let p = policy();
        let run = |s: DaemonHealth, ev: Event, t: u64| -> DaemonHealth {
            let (s, effects) = step(s, ev, t, &p);
            if effects.contains(&Effect::Restart) {
                return step(s, RestartSucceeded, t, &p).0;
            }
            s
        };
        let mut s = run(DaemonHealth::new(0), Tick, 0);
        s = run(s, ProbeOk, 100);
        assert_eq!(s.check.failing_since_ms, None);
        s = run(s, exited(), 1_000);
        assert_eq!((s.check.failing_since_ms, s.check.repairs_ms.clone()), (Some(1_000), vec![1_000]));
        s = run(s, ProbeOk, 1_500); // answers once after the restart, then dies again
        s = run(s, exited(), 2_000);
        s = run(s, Tick, 3_000); // the second restart waits its backoff
        s = run(s, exited(), 3_500);
        s = run(s, Tick, 5_500);
        s = run(s, exited(), 6_000);
        assert_eq!(s.phase, Phase::GaveUp);
        assert!(s.check.reason.contains(RESTARTS_EXHAUSTED), "{}", s.check.reason);
        assert_eq!(s.check.failing_since_ms, Some(1_000), "from the first kill");
        assert_eq!(s.check.repairs_ms, vec![1_000, 3_000, 5_500]);
        for t in [7_000, 8_000] {
            s = run(s, ProbeOk, t);
        }
        assert_eq!(s.check.failing_since_ms, Some(1_000), "two answers are not yet the threshold");
        s = run(s, ProbeOk, 9_000);
        assert_eq!((s.check.failing_since_ms, s.check.repairs_ms.len()), (None, 0), "over");
    }

    /// A daemon given up on comes back after `Rearm` once it answers again, and its restart
    /// budget is whole again.
    #[test]
    fn rearm_restarts_a_daemon_given_up_on() {
        let p = policy();
        let mut s = DaemonHealth::new(0);
        let mut t = 0;
        let feed = |s: DaemonHealth, ev: Event, t: u64| {
            let (s, effects) = step(s, ev, t, &p);
            if effects.contains(&Effect::Restart) {
                step(s, RestartSucceeded, t, &p).0
            } else {
                s
            }
        };
        s = feed(s, ProbeOk, t);
        for _ in 0..10 {
            t += 5_000;
            s = feed(s, exited(), t);
            s = feed(s, Tick, t + 2_500);
        }
        assert_eq!(s.phase, Phase::GaveUp, "{s:?}");
        s = feed(s, Rearm, t + 3_000);
        assert_eq!(s.phase, Phase::Running, "restarted at once");
        assert_eq!(s.check.restarts, 4, "one more restart");
        for k in 1..=3 {
            s = feed(s, ProbeOk, t + 3_000 + k * 100);
        }
        assert_eq!((s.check.status, s.check.failing_since_ms), (Ok, None), "{:?}", s.check);
        // A fresh budget: the next failure is restarted again, not given up on.
        s = feed(s, exited(), t + 10_000);
        assert!(matches!(s.phase, Phase::StartDue { .. }), "{s:?}");
    }
}
