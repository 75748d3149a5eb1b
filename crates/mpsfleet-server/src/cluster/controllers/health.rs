//! Host health, a controller keyed by host (`HostIx`): evaluates a host's checks and
//! heartbeat age against its pool's health policy (`mpsfleet_core::health::evaluate`), writes
//! a changed health status (which takes an impaired host out of placement at once), and opens
//! an incident when the host is declared bad; the remediation controller drives it from there.
//!
//! Its keys are dense: `Writer::health_due_ms` holds, by host, when its evaluation can next
//! change without a report (`next_evaluation_ms`), or 0 once something it depends on changed
//! (its record, its pool, an incident about it). The health tick ([`HostHealth::tick`])
//! evaluates the hosts that are due; a full heartbeat evaluates its host at once
//! ([`HostHealth::reconcile`]), and a quiet one keeps an evaluation that cannot change
//! ([`evaluation_holds`], [`stays_healthy`]).
//!
//! It also closes a GPU to new MPS tasks while its daemon does not answer, and opens it again
//! once the hold has passed and the daemon answers ([`HostHealth::close_mps_gpus`]).

use super::Ctx;
use crate::cluster::error::Error;
use crate::cluster::intervals::{intervals, AGENT_HEARTBEAT_MS, MAX_HEARTBEAT_MS};
use crate::cluster::read::Reader;
use crate::cluster::state::State;
use crate::cluster::write::Writer;
use mpsfleet_core::bounds::{self as core_bounds, Intervals};
use mpsfleet_core::controller::Action;
use mpsfleet_core::health::{evaluate, HealthInput, Verdict};
use mpsfleet_core::lifecycle::host as host_lifecycle;
use mpsfleet_core::scheduler::{GpuIx, HostIx};
use mpsfleet_types::bounds::{FailureKind, IncidentBounds};
use mpsfleet_types::drill::DrillStatus;
use mpsfleet_types::{
    GpuUuid, HealthStatus, HostCheck, HostId, HostStatus, Incident, IncidentOwner, Pool, ResumptionBoundary,
    Step, Trigger,
};
use std::collections::{BTreeSet, HashMap};

/// The server's evaluation of a host (core's name for it).
type Evaluation = mpsfleet_core::health::HostHealth;

/// The longest a GPU stays closed to MPS tasks after its daemon did not answer, once its
/// check is OK again.
pub const MPS_CLOSED_HOLD_MS: u64 = 1_000;

/// The host health controller. It keeps the GPUs it closed to MPS tasks, and when each may
/// open again.
#[derive(Default)]
pub(in crate::cluster) struct HostHealth {
    mps_closed: HashMap<GpuIx, u64>,
}

impl HostHealth {
    /// Evaluates every host whose evaluation is due (a host's failure, a failed commit, is
    /// logged and left for the next tick; the others are evaluated all the same), then opens
    /// the closed GPUs whose hold has passed.
    pub(in crate::cluster) fn tick(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now_ms;
        for ix in 0..ctx.w.health_due_ms.len() as HostIx {
            // Only a host whose evaluation can have changed since the last one.
            if ctx.w.health_due_ms[ix as usize] > now {
                continue;
            }
            if let Err(e) = Self::reconcile(&mut ctx.w, ix) {
                let host = &ctx.w.state.hosts()[ix as usize].host().id;
                tracing::warn!(host.id = %host, error = %e, "host evaluation failed; retrying at the next tick");
            }
        }
        self.reopen_mps_gpus(&mut ctx.w);
    }

    /// Evaluates host `ix` again: a changed health status is written (and so applied to
    /// placement at once); a host declared bad gets an incident (one per episode). Its next
    /// evaluation is due when the action says.
    pub(in crate::cluster) fn reconcile(w: &mut Writer<'_>, ix: HostIx) -> Result<Action, Error> {
        let action = Self::evaluate(w, ix)?;
        requeue(w, ix, action);
        Ok(action)
    }

    /// Keeps an evaluation a heartbeat made in memory (`Cluster::quiet_heartbeat`), and when
    /// the host is due again.
    pub(in crate::cluster) fn keep(w: &mut Writer<'_>, ix: HostIx, health: Option<Evaluation>) {
        if let Some(h) = health {
            set_evaluation(w, ix, h);
        }
        let action = next_evaluation(&w.reader(), ix);
        requeue(w, ix, action);
    }

    fn evaluate(w: &mut Writer<'_>, ix: HostIx) -> Result<Action, Error> {
        let now = w.now_ms;
        let e = &w.state.hosts()[ix as usize];
        if e.evaluated && stays_healthy(w.state, ix, now) {
            return Ok(next_evaluation(&w.reader(), ix));
        }
        let Some(health) = assess(&w.reader(), ix, &e.checks, e.last_heartbeat_ms, e.checks_at_ms) else {
            // Not evaluated in its status: a change of its record or pool makes it due again.
            return Ok(Action::AwaitChange);
        };
        w.state.host_mut(ix).evaluated = true;
        let e = &w.state.hosts()[ix as usize];
        // A server that has just loaded the state (a restart, a new leader) has heard nothing
        // from the hosts yet: "waiting for the first heartbeat" is its own news, not the host's.
        // The stored health stands until the host reports or its grace, counted from the load,
        // runs out; writing it would cost one commit per host at every start and takeover.
        let not_heard_since_load = e.last_heartbeat_ms.is_none()
            && e.host().registered_at_ms < w.loaded_at_ms
            && health.status == HealthStatus::InsufficientData;
        let changed = health.status != e.host().health_status && !not_heard_since_load;
        let verdict = health.verdict.clone();
        set_evaluation(w, ix, health);
        if changed {
            let e = &w.state.hosts()[ix as usize];
            let mut h = e.host().clone();
            tracing::info!(host.id = %h.id, from = h.health_status.as_str(), to = e.health.status.as_str(), "host health changed");
            host_lifecycle::set_health(&mut h, e.health.status);
            w.write_host(ix, h)?;
        }
        if let Verdict::DeclaredBad { trigger, impaired_since_ms } = verdict {
            open_incident(w, ix, trigger, impaired_since_ms)?;
        }
        Ok(next_evaluation(&w.reader(), ix))
    }

    /// Closes a host's GPUs to new MPS tasks while its agent reports their daemon not OK, all
    /// of them while one of its daemons has been restarted for a failure still going on (a
    /// host whose daemon exited is suspect: a restart copy placed on its other GPU would move
    /// again if the host is replaced), or after a task there was refused because its daemon
    /// did not answer (`refused`): a replacement placed back on that GPU at once would only be
    /// refused again. A closed GPU opens once the hold (the pool's probe interval, at most
    /// [`MPS_CLOSED_HOLD_MS`]) has passed and the host's latest check of it is OK: at worst one
    /// refused start per GPU per hold, never a loop.
    pub(in crate::cluster) fn close_mps_gpus(&mut self, w: &mut Writer<'_>, ix: HostIx, refused: &[GpuIx]) {
        let e = &w.state.hosts()[ix as usize];
        let hold = (w.state.pools().get(&e.host().pool))
            .map_or(MPS_CLOSED_HOLD_MS, |p| p.value.health_policy.mps_probe_interval_ms)
            .clamp(250, MPS_CLOSED_HOLD_MS);
        let until = w.now_ms + hold;
        let mut close: Vec<GpuIx> = refused.to_vec();
        let repairing = mps_daemon_repairing(&e.checks);
        for (g, inv) in w.sched.host_gpus(ix).zip(&e.host().gpus) {
            if repairing || !mps_daemon_ok(&e.checks, &inv.uuid) {
                close.push(g);
            }
        }
        for g in close {
            let at = self.mps_closed.entry(g).or_insert(until);
            *at = (*at).max(until);
            w.sched.set_mps_open(g, false);
        }
    }

    /// Opens the closed GPUs whose hold has passed and whose daemon the host reports OK.
    fn reopen_mps_gpus(&mut self, w: &mut Writer<'_>) {
        if self.mps_closed.is_empty() {
            return;
        }
        let now = w.now_ms;
        let due: Vec<GpuIx> = self.mps_closed.iter().filter(|(_, &at)| now >= at).map(|(&g, _)| g).collect();
        let mut pools = BTreeSet::new();
        for g in due {
            let ix = w.sched.gpu(g).host;
            let e = &w.state.hosts()[ix as usize];
            if e.host().status == HostStatus::Deregistered {
                // Gone: forgotten, and no longer counted as closed (it takes nothing anyway).
                self.mps_closed.remove(&g);
                w.sched.set_mps_open(g, true);
                continue;
            }
            let Some(inv) = w.sched.host_gpus(ix).zip(&e.host().gpus).find(|(x, _)| *x == g).map(|(_, i)| i)
            else {
                continue;
            };
            if mps_daemon_ok(&e.checks, &inv.uuid) {
                self.mps_closed.remove(&g);
                w.sched.set_mps_open(g, true);
                pools.insert(e.host().pool.clone());
            }
        }
        for p in pools {
            w.capacity_opened(p);
        }
    }
}

/// Opens an incident for host `ix`, declared bad by `trigger`, unless one is open already.
fn open_incident(
    w: &mut Writer<'_>,
    ix: HostIx,
    mut trigger: Trigger,
    impaired_since_ms: u64,
) -> Result<(), Error> {
    let e = &w.state.hosts()[ix as usize];
    // The restarts an earlier failure of the daemon used of the same budget.
    if let (Some(g), Some(first)) = (&trigger.gpu_id, trigger.first_failure_at_ms) {
        trigger.earlier_repairs_at_ms = e.repairs_before(g, first);
    }
    let host_id = e.host().id.clone();
    let pool = e.host().pool.clone();
    let Some(p) = w.state.pools().get(&pool) else { return Ok(()) };
    if w.state.incidents().unresolved().any(|i| i.host_id == host_id) {
        return Ok(());
    }
    let id = format!("inc-{:012x}", crate::auth::random_u64()? >> 16);
    let owner = IncidentOwner::for_mode(p.value.mode);
    let bounds = incident_bounds(w.state, &p.value, ix, &trigger);
    let mut incident = Incident::open(id, host_id.clone(), pool, owner, trigger, impaired_since_ms, w.now_ms);
    incident.bounds = bounds;
    incident.drill = drill_striking(w.state, &host_id);
    if let Some((at, detail)) = w.reader().left_traffic(ix) {
        incident.record_before_open(at, Step::LeftTraffic, detail);
    }
    // Preemptions made for the host's replicas before the incident opened (restart copies).
    let notes = std::mem::take(&mut w.state.host_mut(ix).preemptions);
    for (at, words) in notes.into_iter().filter(|(at, _)| at + PREEMPTION_NOTE_TTL_MS >= w.now_ms) {
        incident.record_before_open(at, Step::Preempted, words);
    }
    tracing::warn!(incident.id = %incident.id, host.id = %host_id, owner = owner.as_str(), "host declared bad");
    w.write_incident(incident)
}

/// How long a preemption note waits for an incident about its host to open.
const PREEMPTION_NOTE_TTL_MS: u64 = 600_000;

/// The bounds an incident on host `ix` with `trigger` is held to: its kind's row of the pool's
/// bounds, with the fenced total when any service task on the host is fenced.
fn incident_bounds(state: &State, pool: &Pool, ix: HostIx, trigger: &Trigger) -> Option<IncidentBounds> {
    let kind = FailureKind::of_trigger(&trigger.check, &trigger.reason);
    // An agent that heartbeats less often than the default waits longer to report.
    let reported = state.hosts()[ix as usize].heartbeat_ms.unwrap_or(0).min(MAX_HEARTBEAT_MS);
    let iv = Intervals { agent_heartbeat_ms: reported.max(AGENT_HEARTBEAT_MS), ..intervals() };
    let bounds = core_bounds::derive(pool, &iv);
    let fenced = state.tasks().on_host(ix).iter().any(|id| {
        (state.tasks().get(id))
            .and_then(|e| e.task.group.as_ref())
            .and_then(|s| state.services().get(s))
            .is_some_and(|s| s.value.resumption == ResumptionBoundary::Fenced)
    });
    // Where recovery may preempt, a recovery that did is held to the victims' stop as well.
    let preempt_ms = (pool.preemption.allows(true) && pool.mode == mpsfleet_types::OwnershipMode::Managed)
        .then(|| crate::cluster::place::victim_stop_ms(state, &pool.name));
    bounds.of(kind).map(|k| IncidentBounds { preempt_ms, ..IncidentBounds::of(k, fenced) })
}

/// The running drill striking `host`, if one is.
fn drill_striking(state: &State, host: &HostId) -> Option<String> {
    (state.drills().values())
        .find(|d| {
            d.value.status == DrillStatus::Running && d.value.targets.iter().any(|t| &t.host_id == host)
        })
        .map(|d| d.value.id.clone())
}

/// What the health of an ACTIVE or DRAINING host comes to with these checks (reported at
/// `reported_at_ms`) and last heartbeat; `None` for a host that is not evaluated (other
/// statuses, or no pool).
pub(in crate::cluster) fn assess(
    r: &Reader<'_>,
    ix: HostIx,
    checks: &[HostCheck],
    last_heartbeat_ms: Option<u64>,
    reported_at_ms: Option<u64>,
) -> Option<Evaluation> {
    let e = &r.state.hosts()[ix as usize];
    if !matches!(e.host().status, HostStatus::Active | HostStatus::Draining) {
        return None;
    }
    let policy = &r.state.pools().get(&e.host().pool)?.value.health_policy;
    let registered_at_ms = e.host().registered_at_ms.max(r.loaded_at_ms);
    let input = HealthInput { checks, last_heartbeat_ms, registered_at_ms, reported_at_ms };
    Some(evaluate(&e.health, &input, policy, r.now_ms))
}

/// When host `ix` is due again after `action`.
fn requeue(w: &mut Writer<'_>, ix: HostIx, action: Action) {
    w.health_due_ms[ix as usize] = match action {
        Action::RequeueAfter(ms) => w.now_ms.saturating_add(ms),
        Action::AwaitChange => u64::MAX,
    };
}

/// Whether a heartbeat that repeats the checks host `ix` was last evaluated from leaves its
/// health as it is: the evaluation is current (its record's health is the evaluated one, in a
/// status that is evaluated), its agent was heard from in time (so one more heartbeat changes
/// nothing), and no time at which it could change (`due_ms`, when it is due) has come.
pub(in crate::cluster) fn evaluation_holds(state: &State, ix: HostIx, due_ms: u64, now: u64) -> bool {
    let e = &state.hosts()[ix as usize];
    e.evaluated
        && now < due_ms
        && e.host().health_status == e.health.status
        && matches!(e.host().status, HostStatus::Active | HostStatus::Draining)
        && e.health.checks.first().is_some_and(|c| {
            c.gpu_id.is_none() && c.name == mpsfleet_core::health::AGENT && c.status == HealthStatus::Ok
        })
}

/// Whether evaluating the host again, with the report and heartbeat it was last evaluated
/// from, must give the same health: every check OK and the last heartbeat within the grace
/// (the only input that moves with time while all is OK).
pub(in crate::cluster) fn stays_healthy(state: &State, ix: HostIx, now: u64) -> bool {
    let e = &state.hosts()[ix as usize];
    let Some(pool) = state.pools().get(&e.host().pool) else { return false };
    e.health.status == HealthStatus::Ok
        && e.host().health_status == HealthStatus::Ok
        && matches!(e.health.verdict, Verdict::Healthy)
        && matches!(e.host().status, HostStatus::Active | HostStatus::Draining)
        && e.last_heartbeat_ms
            .is_some_and(|t| now.saturating_sub(t) <= pool.value.health_policy.agent_heartbeat_grace_ms)
}

/// When evaluating host `ix` again, with what it was last evaluated from, can next give
/// another health (its heartbeat grace running out, an IMPAIRED check reaching the
/// toleration); to wait for a change when only a report or a change of its record can.
pub(in crate::cluster) fn next_evaluation(r: &Reader<'_>, ix: HostIx) -> Action {
    let e = &r.state.hosts()[ix as usize];
    let Some(pool) = r.state.pools().get(&e.host().pool) else { return Action::AwaitChange };
    let input = HealthInput {
        checks: &e.checks,
        last_heartbeat_ms: e.last_heartbeat_ms,
        registered_at_ms: e.host().registered_at_ms.max(r.loaded_at_ms),
        reported_at_ms: e.checks_at_ms,
    };
    match mpsfleet_core::health::next_change_at_ms(&e.health, &input, &pool.value.health_policy) {
        Some(at) => Action::RequeueAfter(at.saturating_sub(r.now_ms)),
        None => Action::AwaitChange,
    }
}

/// Keeps the server's evaluation of a host; a new verdict drops the storm breaker's counts,
/// which count verdicts.
fn set_evaluation(w: &mut Writer<'_>, ix: HostIx, health: Evaluation) {
    if health.verdict != w.state.hosts()[ix as usize].health.verdict {
        w.breaker_counts.clear();
    }
    w.state.host_mut(ix).health = health;
}

/// Whether every MPS daemon check the host reports for this GPU (its own, or the host's
/// single daemon) is OK.
fn mps_daemon_ok(checks: &[HostCheck], gpu: &GpuUuid) -> bool {
    checks
        .iter()
        .filter(|c| {
            c.name == mpsfleet_core::health::MPS_DAEMON && c.gpu_id.as_ref().is_none_or(|id| id == gpu)
        })
        .all(|c| c.status == HealthStatus::Ok)
}

/// Whether local repair has restarted one of the host's daemons for a failure still going on
/// (it exited: its check stays OK until the failure threshold).
fn mps_daemon_repairing(checks: &[HostCheck]) -> bool {
    (checks.iter().filter(|c| c.name == mpsfleet_core::health::MPS_DAEMON))
        .any(HostCheck::restarted_for_failure)
}
