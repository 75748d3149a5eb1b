//! Host health evaluation on the server: turns an agent's reported checks and its heartbeats
//! into evaluated checks, the host's `healthStatus` and a verdict (healthy, impaired, declared
//! bad). Pure: the caller passes the previous evaluation and the time.
//!
//! The server calls [`evaluate`] on every heartbeat or status report and on a periodic tick
//! ([`next_change_at_ms`] says when the next tick can change anything). Rules:
//!
//! - `AGENT` is computed here, never taken from the agent: INSUFFICIENT_DATA until the first
//!   heartbeat (while the registration is younger than the grace), OK while heartbeats arrive
//!   within `agentHeartbeatGraceMs`, IMPAIRED after that.
//! - Reported checks (`MPS_DAEMON`, `GPU`, per GPU) count as reported while the agent talks,
//!   and as INSUFFICIENT_DATA while it is silent: stale reports prove nothing either way.
//! - The host's status is the most severe check (`IMPAIRED > INSUFFICIENT_DATA > INITIALIZING >
//!   OK`). Any IMPAIRED check makes the verdict [`Verdict::Impaired`] at once (no new
//!   placements); one that stays IMPAIRED for `toleration_ms` makes it
//!   [`Verdict::DeclaredBad`], which opens an incident. A shorter failure opens none.
//! - Times are the server's: a check's `since_ms` is when the server first saw its current
//!   status, so agent clock skew cannot shorten the toleration. The agent's own `since_ms` is
//!   kept as evidence (and a change of it means the check flipped in between two reports).
//!   A server restart starts the toleration again for checks already IMPAIRED, and the
//!   server passes its load time as `registered_at_ms` when that is later, so agents get their
//!   heartbeat grace again instead of being counted silent since they registered.
//! - Once declared bad, the verdict keeps its first trigger while any check is IMPAIRED, so
//!   one episode opens one incident; it returns to healthy only when no check is IMPAIRED.

use mpsfleet_types::{GpuUuid, HealthPolicy, HealthStatus, HostCheck, Trigger};

pub const AGENT: &str = "AGENT";
pub const MPS_DAEMON: &str = "MPS_DAEMON";
pub const GPU: &str = "GPU";

/// What the server knows of a host at evaluation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthInput<'a> {
    /// The agent's latest reported checks (an `AGENT` entry among them is ignored).
    pub checks: &'a [HostCheck],
    pub last_heartbeat_ms: Option<u64>,
    pub registered_at_ms: u64,
    /// When `checks` arrived (server clock): the ages they carry are counted back from it.
    pub reported_at_ms: Option<u64>,
}

/// One check as the server evaluates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvaluatedCheck {
    pub name: String,
    pub gpu_id: Option<GpuUuid>,
    pub status: HealthStatus,
    pub reason: String,
    /// When the server first saw `status` (server clock).
    pub since_ms: u64,
    /// The agent's `since_ms` for a reported check (agent clock); for AGENT, the last
    /// heartbeat (or the registration before the first one).
    pub reported_since_ms: u64,
    /// The first failed signal of the failure going on (server clock): the report's arrival
    /// minus the age the agent gave; for AGENT, the last heartbeat. None when unknown.
    pub first_failure_at_ms: Option<u64>,
    /// The local repairs of that failure (server clock), oldest first.
    pub repairs_at_ms: Vec<u64>,
}

impl EvaluatedCheck {
    /// As the API shows it.
    pub fn to_host_check(&self) -> HostCheck {
        HostCheck {
            name: self.name.clone(),
            gpu_id: self.gpu_id.clone(),
            status: self.status,
            reason: self.reason.clone(),
            since_ms: self.since_ms,
            restarts: 0,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        }
    }

    fn same_check(&self, name: &str, gpu_id: Option<&GpuUuid>) -> bool {
        self.name == name && self.gpu_id.as_ref() == gpu_id
    }
}

/// What the server should do about the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No check is IMPAIRED (the host may still be starting: see [`HostHealth::accepts_work`]).
    Healthy,
    /// A check is IMPAIRED, since `since_ms` (the earliest one): place nothing new here.
    Impaired { since_ms: u64 },
    /// A check has been IMPAIRED for the toleration window: open an incident (once).
    /// `impaired_since_ms` is when the server first saw the trigger IMPAIRED: the incident's
    /// DETECTED time.
    DeclaredBad { trigger: Trigger, impaired_since_ms: u64 },
}

/// The evaluated health of one host; feed it back into the next [`evaluate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostHealth {
    /// AGENT first, then the reported checks by name and GPU.
    pub checks: Vec<EvaluatedCheck>,
    pub status: HealthStatus,
    /// When `status` last changed.
    pub status_since_ms: u64,
    pub verdict: Verdict,
}

impl HostHealth {
    /// The state before the first evaluation: INITIALIZING, no checks.
    pub fn new(registered_at_ms: u64) -> Self {
        Self {
            checks: Vec::new(),
            status: HealthStatus::Initializing,
            status_since_ms: registered_at_ms,
            verdict: Verdict::Healthy,
        }
    }

    /// Whether new work may be placed here: every check OK.
    pub fn accepts_work(&self) -> bool {
        self.status == HealthStatus::Ok
    }

    pub fn check(&self, name: &str, gpu_id: Option<&GpuUuid>) -> Option<&EvaluatedCheck> {
        self.checks.iter().find(|c| c.same_check(name, gpu_id))
    }

    /// The checks as the API shows them.
    pub fn host_checks(&self) -> Vec<HostCheck> {
        self.checks.iter().map(EvaluatedCheck::to_host_check).collect()
    }
}

/// Severity for "the most severe check wins".
pub fn severity(status: HealthStatus) -> u8 {
    match status {
        HealthStatus::Ok => 0,
        HealthStatus::Initializing => 1,
        HealthStatus::InsufficientData => 2,
        HealthStatus::Impaired => 3,
    }
}

/// One evaluation: see the module documentation for the rules.
pub fn evaluate(
    prev: &HostHealth,
    input: &HealthInput<'_>,
    policy: &HealthPolicy,
    now_ms: u64,
) -> HostHealth {
    let grace = policy.agent_heartbeat_grace_ms;
    let (agent_status, agent_reason, agent_seen) = match input.last_heartbeat_ms {
        None => {
            let waited = now_ms.saturating_sub(input.registered_at_ms);
            if waited <= grace {
                (
                    HealthStatus::InsufficientData,
                    "waiting for the first heartbeat".to_string(),
                    input.registered_at_ms,
                )
            } else {
                let reason = format!(
                    "no heartbeat since registration {} ago (grace {})",
                    fmt_ms(waited),
                    fmt_ms(grace)
                );
                (HealthStatus::Impaired, reason, input.registered_at_ms)
            }
        }
        Some(at) => {
            let silent = now_ms.saturating_sub(at);
            if silent <= grace {
                (HealthStatus::Ok, "heartbeats arriving".to_string(), at)
            } else {
                let reason = format!("no heartbeat for {} (grace {})", fmt_ms(silent), fmt_ms(grace));
                (HealthStatus::Impaired, reason, at)
            }
        }
    };
    let agent_silent = agent_status == HealthStatus::Impaired;

    let mut agent = carry(prev, AGENT, None, agent_status, agent_reason, agent_seen, now_ms);
    agent.first_failure_at_ms = (agent_status == HealthStatus::Impaired).then_some(agent_seen);
    let mut checks = vec![agent];
    let mut reported: Vec<&HostCheck> = input.checks.iter().filter(|c| c.name != AGENT).collect();
    reported.sort_by(|a, b| (&a.name, &a.gpu_id).cmp(&(&b.name, &b.gpu_id)));
    for c in reported {
        let (status, reason) = if agent_silent {
            let reason = format!("agent silent; last reported {}: {}", c.status.as_str(), c.reason);
            (HealthStatus::InsufficientData, reason)
        } else {
            (c.status, c.reason.clone())
        };
        let mut e = carry(prev, &c.name, c.gpu_id.as_ref(), status, reason, c.since_ms, now_ms);
        // Ages count back from the report's arrival, on this clock: no skew enters.
        let back = |age: u64| input.reported_at_ms.map(|at| at.saturating_sub(age));
        e.first_failure_at_ms = c.first_failure_age_ms.and_then(back);
        e.repairs_at_ms = c.repair_ages_ms.iter().rev().filter_map(|&a| back(a)).collect();
        e.repairs_at_ms.sort_unstable();
        checks.push(e);
    }

    let status = checks.iter().map(|c| c.status).max_by_key(|s| severity(*s)).unwrap_or(HealthStatus::Ok);
    let status_since_ms = if status == prev.status { prev.status_since_ms } else { now_ms };
    let verdict = verdict(prev, &checks, policy, now_ms);
    HostHealth { checks, status, status_since_ms, verdict }
}

/// The evaluated check, keeping the previous `since_ms` while the status (and the agent's own
/// since time) stay the same.
fn carry(
    prev: &HostHealth,
    name: &str,
    gpu_id: Option<&GpuUuid>,
    status: HealthStatus,
    reason: String,
    reported_since_ms: u64,
    now_ms: u64,
) -> EvaluatedCheck {
    let kept = prev.check(name, gpu_id).filter(|p| {
        // A reported check whose agent-side since time moved changed in between two reports.
        p.status == status && (name == AGENT || p.reported_since_ms == reported_since_ms)
    });
    EvaluatedCheck {
        name: name.to_string(),
        gpu_id: gpu_id.cloned(),
        status,
        reason,
        since_ms: kept.map_or(now_ms, |p| p.since_ms),
        reported_since_ms,
        first_failure_at_ms: None,
        repairs_at_ms: Vec::new(),
    }
}

fn verdict(prev: &HostHealth, checks: &[EvaluatedCheck], policy: &HealthPolicy, now_ms: u64) -> Verdict {
    let impaired: Vec<&EvaluatedCheck> =
        checks.iter().filter(|c| c.status == HealthStatus::Impaired).collect();
    let Some(earliest) = impaired.iter().min_by_key(|c| c.since_ms) else {
        return Verdict::Healthy;
    };
    if let Verdict::DeclaredBad { .. } = prev.verdict {
        return prev.verdict.clone();
    }
    if now_ms.saturating_sub(earliest.since_ms) < policy.toleration_ms {
        return Verdict::Impaired { since_ms: earliest.since_ms };
    }
    let c = earliest;
    let lasted = now_ms.saturating_sub(c.since_ms);
    let evidence = if c.name == AGENT {
        format!(
            "last heartbeat (or registration) at {}; IMPAIRED on the server for {} (toleration {})",
            mpsfleet_types::utc(c.reported_since_ms),
            fmt_ms(lasted),
            fmt_ms(policy.toleration_ms)
        )
    } else {
        format!(
            "agent reported {}{} IMPAIRED since {} (agent clock): {}; IMPAIRED on the server for {} \
             (toleration {})",
            c.name,
            c.gpu_id.as_ref().map(|g| format!(" on {g}")).unwrap_or_default(),
            mpsfleet_types::utc(c.reported_since_ms),
            c.reason,
            fmt_ms(lasted),
            fmt_ms(policy.toleration_ms)
        )
    };
    Verdict::DeclaredBad {
        trigger: Trigger {
            check: c.name.clone(),
            gpu_id: c.gpu_id.clone(),
            reason: c.reason.clone(),
            evidence,
            // The agent's first failed signal when it said; else when the check turned IMPAIRED
            // on the agent (its clock, kept from before agents said), never after detection.
            first_failure_at_ms: Some(c.first_failure_at_ms.unwrap_or(c.reported_since_ms).min(c.since_ms)),
            local_repairs_at_ms: c.repairs_at_ms.clone(),
            earlier_repairs_at_ms: Vec::new(),
        },
        impaired_since_ms: c.since_ms,
    }
}

/// When a tick could next change the evaluation without any new report: the heartbeat grace
/// running out, or an IMPAIRED check reaching the toleration. None when only a report can.
pub fn next_change_at_ms(health: &HostHealth, input: &HealthInput<'_>, policy: &HealthPolicy) -> Option<u64> {
    let grace_ends =
        input.last_heartbeat_ms.unwrap_or(input.registered_at_ms) + policy.agent_heartbeat_grace_ms + 1;
    let agent_ok = health.check(AGENT, None).is_some_and(|c| c.status != HealthStatus::Impaired);
    let grace = agent_ok.then_some(grace_ends);
    let toleration = match health.verdict {
        Verdict::Impaired { since_ms } => Some(since_ms + policy.toleration_ms),
        Verdict::Healthy | Verdict::DeclaredBad { .. } => None,
    };
    grace.into_iter().chain(toleration).min()
}

/// Milliseconds for people: `800ms`, `12s`, `1.5s`, `10m`, `90s`.
pub fn fmt_ms(ms: u64) -> String {
    let (secs, sub_ms) = (ms / 1000, ms % 1000);
    let (mins, sub_min_s) = (secs / 60, secs % 60);
    if sub_ms == 0 && sub_min_s == 0 && mins > 0 {
        if mins % 60 == 0 {
            format!("{}h", mins / 60)
        } else {
            format!("{mins}m")
        }
    } else if sub_ms == 0 {
        format!("{secs}s")
    } else if secs == 0 {
        format!("{ms}ms")
    } else {
        let s = format!("{secs}.{sub_ms:03}");
        format!("{}s", s.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthStatus::*;

    fn gpu(n: u32) -> Option<GpuUuid> {
        Some(GpuUuid::new(format!("GPU-{n}")).unwrap())
    }

    fn reported(name: &str, g: Option<GpuUuid>, status: HealthStatus, since_ms: u64) -> HostCheck {
        HostCheck {
            name: name.into(),
            gpu_id: g,
            status,
            reason: format!("{name} says {}", status.as_str()),
            since_ms,
            restarts: 0,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        }
    }

    /// One moment of the world: time, last heartbeat, reported checks.
    struct At {
        now: u64,
        heartbeat: Option<u64>,
        checks: Vec<HostCheck>,
    }

    fn at(now: u64, heartbeat: Option<u64>, checks: Vec<HostCheck>) -> At {
        At { now, heartbeat, checks }
    }

    /// What the last evaluation must show.
    enum Want {
        Healthy,
        Impaired {
            since_ms: u64,
        },
        /// The trigger's check name and GPU, and the DETECTED time.
        Bad {
            check: &'static str,
            gpu: Option<GpuUuid>,
            since_ms: u64,
        },
    }

    /// Evaluates `steps` in order from a fresh host registered at 0 (grace 10s, toleration 10s) and checks the final host status, verdict and per-check statuses (name,
    /// status, reason fragment).
    #[track_caller]
    fn check(
        name: &str,
        steps: &[At],
        want_status: HealthStatus,
        want: Want,
        want_checks: &[(&str, HealthStatus, &str)],
    ) {
        let policy = HealthPolicy { toleration_ms: 10_000, ..HealthPolicy::default() };
        let mut h = HostHealth::new(0);
        for s in steps {
            let input = HealthInput {
                checks: &s.checks,
                last_heartbeat_ms: s.heartbeat,
                registered_at_ms: 0,
                reported_at_ms: s.heartbeat,
            };
            h = evaluate(&h, &input, &policy, s.now);
        }
        assert_eq!(h.status, want_status, "{name}: {h:#?}");
        match (&h.verdict, want) {
            (Verdict::Healthy, Want::Healthy) => {}
            (Verdict::Impaired { since_ms }, Want::Impaired { since_ms: want }) => {
                assert_eq!(*since_ms, want, "{name}: impaired since")
            }
            (Verdict::DeclaredBad { trigger, impaired_since_ms }, Want::Bad { check, gpu, since_ms }) => {
                assert_eq!((trigger.check.as_str(), &trigger.gpu_id), (check, &gpu), "{name}: {trigger:?}");
                assert_eq!(*impaired_since_ms, since_ms, "{name}: detected at");
            }
            (got, _) => panic!("{name}: unexpected verdict {got:?}"),
        }
        let got: Vec<(&str, HealthStatus)> = h.checks.iter().map(|c| (c.name.as_str(), c.status)).collect();
        let want_names: Vec<(&str, HealthStatus)> = want_checks.iter().map(|&(n, s, _)| (n, s)).collect();
        assert_eq!(got, want_names, "{name}: checks");
        for (c, (_, _, fragment)) in h.checks.iter().zip(want_checks) {
            assert!(
                c.reason.contains(fragment),
                "{name}: {} reason {:?} lacks {fragment:?}",
                c.name,
                c.reason
            );
        }
    }

    #[test]
    fn heartbeat_grace() {
        check(
            "before the first heartbeat",
            &[at(5_000, None, vec![])],
            InsufficientData,
            Want::Healthy,
            &[(AGENT, InsufficientData, "waiting for the first heartbeat")],
        );
        check(
            "never heard from",
            &[at(12_000, None, vec![])],
            Impaired,
            Want::Impaired { since_ms: 12_000 },
            &[(AGENT, Impaired, "no heartbeat since registration 12s ago (grace 10s)")],
        );
        check(
            "heartbeat within grace",
            &[at(1_000, Some(1_000), vec![]), at(11_000, Some(1_000), vec![])],
            Ok,
            Want::Healthy,
            &[(AGENT, Ok, "heartbeats arriving")],
        );
        check(
            "grace exceeded",
            &[at(1_000, Some(1_000), vec![]), at(13_000, Some(1_000), vec![])],
            Impaired,
            Want::Impaired { since_ms: 13_000 },
            &[(AGENT, Impaired, "no heartbeat for 12s (grace 10s)")],
        );
        check(
            "silent past grace and toleration",
            &[
                at(1_000, Some(1_000), vec![]),
                at(13_000, Some(1_000), vec![]),
                at(23_000, Some(1_000), vec![]),
            ],
            Impaired,
            Want::Bad { check: AGENT, gpu: None, since_ms: 13_000 },
            &[(AGENT, Impaired, "no heartbeat for 22s")],
        );
        check(
            "heartbeat comes back before toleration",
            &[at(13_000, Some(1_000), vec![]), at(20_000, Some(20_000), vec![])],
            Ok,
            Want::Healthy,
            &[(AGENT, Ok, "heartbeats arriving")],
        );
    }

    #[test]
    fn reported_checks() {
        let mps_ok = || reported(MPS_DAEMON, gpu(0), Ok, 500);
        let mps_bad = |since| reported(MPS_DAEMON, gpu(0), Impaired, since);
        check(
            "mps impaired, short: no declaration",
            &[at(1_000, Some(1_000), vec![mps_ok()]), at(5_000, Some(5_000), vec![mps_bad(4_900)])],
            Impaired,
            Want::Impaired { since_ms: 5_000 },
            &[(AGENT, Ok, ""), (MPS_DAEMON, Impaired, "MPS_DAEMON says IMPAIRED")],
        );
        check(
            "mps impaired shorter than toleration, then ok: nothing",
            &[
                at(5_000, Some(5_000), vec![mps_bad(4_900)]),
                at(14_000, Some(14_000), vec![mps_bad(4_900)]),
                at(15_000, Some(15_000), vec![reported(MPS_DAEMON, gpu(0), Ok, 14_500)]),
            ],
            Ok,
            Want::Healthy,
            &[(AGENT, Ok, ""), (MPS_DAEMON, Ok, "")],
        );
        check(
            "mps impaired for the toleration: declared bad with that check",
            &[
                at(5_000, Some(5_000), vec![mps_ok(), reported(GPU, gpu(0), Ok, 0)]),
                at(6_000, Some(6_000), vec![mps_bad(5_900), reported(GPU, gpu(0), Ok, 0)]),
                at(16_000, Some(16_000), vec![mps_bad(5_900), reported(GPU, gpu(0), Ok, 0)]),
            ],
            Impaired,
            Want::Bad { check: MPS_DAEMON, gpu: gpu(0), since_ms: 6_000 },
            &[(AGENT, Ok, ""), (GPU, Ok, ""), (MPS_DAEMON, Impaired, "")],
        );
        check(
            "a flip in between two reports restarts the toleration",
            &[at(6_000, Some(6_000), vec![mps_bad(5_900)]), at(16_000, Some(16_000), vec![mps_bad(15_000)])],
            Impaired,
            Want::Impaired { since_ms: 16_000 },
            &[(AGENT, Ok, ""), (MPS_DAEMON, Impaired, "")],
        );
        check(
            "declared bad sticks while impaired, with its first trigger",
            &[
                at(6_000, Some(6_000), vec![mps_bad(5_900)]),
                at(16_000, Some(16_000), vec![mps_bad(5_900)]),
                at(30_000, Some(16_000), vec![mps_bad(5_900)]),
            ],
            Impaired,
            Want::Bad { check: MPS_DAEMON, gpu: gpu(0), since_ms: 6_000 },
            &[(AGENT, Impaired, "no heartbeat for 14s"), (MPS_DAEMON, InsufficientData, "agent silent")],
        );
        check(
            "recovery resets",
            &[
                at(6_000, Some(6_000), vec![mps_bad(5_900)]),
                at(16_000, Some(16_000), vec![mps_bad(5_900)]),
                at(17_000, Some(17_000), vec![reported(MPS_DAEMON, gpu(0), Ok, 16_900)]),
                at(20_000, Some(20_000), vec![mps_bad(19_900)]),
            ],
            Impaired,
            Want::Impaired { since_ms: 20_000 },
            &[(AGENT, Ok, ""), (MPS_DAEMON, Impaired, "")],
        );
        check(
            "agent silent: reports are insufficient data",
            &[
                at(1_000, Some(1_000), vec![mps_ok(), reported(GPU, gpu(0), Ok, 0)]),
                at(12_000, Some(1_000), vec![mps_ok(), reported(GPU, gpu(0), Ok, 0)]),
            ],
            Impaired,
            Want::Impaired { since_ms: 12_000 },
            &[
                (AGENT, Impaired, "no heartbeat for 11s"),
                (GPU, InsufficientData, "agent silent; last reported OK"),
                (MPS_DAEMON, InsufficientData, "agent silent"),
            ],
        );
        check(
            "an AGENT check from the agent is ignored",
            &[at(1_000, Some(1_000), vec![reported(AGENT, None, Impaired, 0)])],
            Ok,
            Want::Healthy,
            &[(AGENT, Ok, "heartbeats arriving")],
        );
    }

    #[test]
    fn most_severe_wins() {
        let hb = Some(1_000);
        let with = |statuses: &[HealthStatus]| -> Vec<HostCheck> {
            statuses.iter().enumerate().map(|(i, s)| reported(MPS_DAEMON, gpu(i as u32), *s, 0)).collect()
        };
        for (statuses, want) in [
            (vec![Ok, Ok], Ok),
            (vec![Ok, Initializing], Initializing),
            (vec![Initializing, InsufficientData, Ok], InsufficientData),
            (vec![Ok, InsufficientData, Impaired, Initializing], Impaired),
        ] {
            let checks = with(&statuses);
            let h = evaluate(
                &HostHealth::new(0),
                &HealthInput {
                    checks: &checks,
                    last_heartbeat_ms: hb,
                    registered_at_ms: 0,
                    reported_at_ms: hb,
                },
                &HealthPolicy::default(),
                1_000,
            );
            assert_eq!(h.status, want, "{statuses:?}");
            assert_eq!(h.accepts_work(), want == Ok, "{statuses:?}");
        }
    }

    #[test]
    fn zero_toleration_declares_at_once_and_since_times_carry() {
        let policy = HealthPolicy { toleration_ms: 0, ..HealthPolicy::default() };
        let checks = vec![reported(MPS_DAEMON, gpu(0), Impaired, 900)];
        let input = HealthInput {
            checks: &checks,
            last_heartbeat_ms: Some(1_000),
            registered_at_ms: 0,
            reported_at_ms: Some(1_000),
        };
        let h = evaluate(&HostHealth::new(0), &input, &policy, 1_000);
        let Verdict::DeclaredBad { trigger, impaired_since_ms: 1_000 } = &h.verdict else {
            panic!("{:?}", h.verdict)
        };
        assert_eq!(trigger.first_failure_at_ms, Some(900));
        assert!(
            trigger.evidence.contains("IMPAIRED since 1970-01-01T00:00:00.900Z (agent clock)"),
            "{}",
            trigger.evidence
        );
        assert_eq!((h.status_since_ms, h.host_checks()[1].since_ms), (1_000, 1_000));
        let later = evaluate(&h, &HealthInput { last_heartbeat_ms: Some(2_000), ..input }, &policy, 2_000);
        assert_eq!((later.status_since_ms, later.checks[1].since_ms), (1_000, 1_000));
    }

    #[test]
    fn next_change() {
        let policy = HealthPolicy::default();
        let checks = vec![reported(MPS_DAEMON, gpu(0), Impaired, 900)];
        let input = HealthInput {
            checks: &checks,
            last_heartbeat_ms: Some(1_000),
            registered_at_ms: 0,
            reported_at_ms: Some(1_000),
        };
        let h = evaluate(&HostHealth::new(0), &input, &policy, 1_000);
        // Toleration ends at 3_000, before the grace (11_001).
        assert_eq!(next_change_at_ms(&h, &input, &policy), Some(3_000));
        let ok = evaluate(&HostHealth::new(0), &HealthInput { checks: &[], ..input }, &policy, 1_000);
        assert_eq!(next_change_at_ms(&ok, &HealthInput { checks: &[], ..input }, &policy), Some(11_001));
    }

    #[test]
    fn durations_read_well() {
        for (ms, want) in
            [(800, "800ms"), (12_000, "12s"), (1_500, "1.5s"), (600_000, "10m"), (90_000, "90s")]
        {
            assert_eq!(fmt_ms(ms), want);
        }
        assert_eq!(fmt_ms(3_600_000), "1h");
    }
}
