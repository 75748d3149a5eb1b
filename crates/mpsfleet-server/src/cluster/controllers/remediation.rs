//! The remediation controller (`Work::Incident`): one unresolved incident planned by core's
//! pure planner (`mpsfleet_core::remediation::plan`) and its actions executed until nothing
//! more can happen now: cordon, drain (a replica in traffic on a host an operator drains
//! leaves it first), move the tasks, ask for a replacement host and the old one's termination,
//! record each step, resolve. Provider calls are not made here: they leave as `ProviderJob`s
//! for the controllers' loop, and their outcome comes back through `Cluster::provider_done`.
//! A decided call's progress is this controller's memory (`ProviderProgress`, lent to each
//! reconcile); the timeline is the durable record. Each pass also judges the incident against
//! its recovery bounds (`Writer::judge_incident`).

use super::services;
use super::services::tasks_of;
use super::Ctx;
use crate::auth;
use crate::cluster::error::Error;
use crate::cluster::intervals::intervals;
use crate::cluster::kinds::TASK;
use crate::cluster::read::{PoolCounts, Reader};
use crate::cluster::work::Work;
use crate::cluster::write::Writer;
use crate::cluster::write_tasks::Batch;
use crate::cluster::write_tasks::NewTasks;
use crate::provider::Retry;
use mpsfleet_core::controller::Action as Requeue;
use mpsfleet_core::health::Verdict;
use mpsfleet_core::lifecycle::host as host_lifecycle;
use mpsfleet_core::remediation::{
    self, Action, HostState, HostTask, MoveTask, PoolView, ReplacementState, TaskOwner, TerminationState,
    WorldView,
};
use mpsfleet_core::scheduler::HostIx;
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::bounds::{BoundBreach, BreachCause, RecoveryPhase};
use mpsfleet_types::policy::ResumptionBoundary;
use mpsfleet_types::service::{ObjectEvent, SchedulingStrategy};
use mpsfleet_types::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use crate::cluster::intervals::INCIDENT_RESYNC_MS;

/// How long a replacement's one-time registration token is valid after it is minted.
pub const REPLACEMENT_TOKEN_TTL_MS: u64 = 60 * 60 * 1000;

/// A provider call the remediation wants made, outside the cluster lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderJob {
    /// `token` is the one-time registration token of an incident's replacement (the launched
    /// host joins with it instead of the join token); None for launches that keep a pool at
    /// its size.
    Launch {
        incident: String,
        pool: PoolName,
        name: String,
        token: Option<RegistrationToken>,
    },
    Terminate {
        incident: String,
        pool: PoolName,
        name: String,
    },
}

/// A secret that joins one host: shown to the provider once, never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistrationToken(pub String);

impl std::fmt::Debug for RegistrationToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What a provider call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderOutcome {
    Done,
    Failed(String),
}

/// In-memory progress of one incident's provider calls (the timeline is the durable record;
/// after a restart, a requested replacement that never joined is requested again).
#[derive(Debug, Clone, Default)]
pub(in crate::cluster) struct ProviderProgress {
    pub launch: Option<Result<(), String>>,
    pub launching: bool,
    pub terminate: Option<Result<(), String>>,
    pub terminating: bool,
    /// Terminations of the old host that failed in a row, and when to ask again: a provider
    /// that keeps failing is asked less and less often, not in a tight loop.
    pub terminate_failures: u32,
    pub terminate_retry_at_ms: u64,
}

/// How a failed termination of an old host is asked for again: 5 s, doubling up to 5 min.
pub(in crate::cluster) const TERMINATE_RETRY: Retry = Retry {
    initial_backoff: std::time::Duration::from_secs(5),
    max_backoff: std::time::Duration::from_secs(300),
    max_attempts: u32::MAX,
};

/// The name the replacement host of an incident joins under (deterministic, so a restarted
/// server recognises it).
pub fn replacement_name(incident: &Incident) -> String {
    format!("{}-r", incident.id)
}

/// Tasks moved off a host: the old copy, its replacement, and where that was placed.
type Moved = Vec<(TaskId, TaskId, Option<HostId>)>;

/// The most launches whose start is remembered (for how long each took to join).
const MAX_LAUNCHES_TRACKED: usize = 10_000;

/// What a reconcile borrows beyond its context: its memory of provider calls, whether the
/// incident's pool has a capacity provider, when launches were asked for (managed scaling's
/// launch times), and where the provider calls it decides go.
pub(in crate::cluster) struct Lent<'a> {
    pub(in crate::cluster) progress: &'a mut HashMap<String, ProviderProgress>,
    pub(in crate::cluster) has_provider: bool,
    pub(in crate::cluster) launches_asked: &'a mut HashMap<(PoolName, String), u64>,
    pub(in crate::cluster) jobs: &'a mut Vec<ProviderJob>,
}

/// The remediation controller.
pub(in crate::cluster) struct Remediation;

impl Remediation {
    /// The remediation controller's reconcile of one incident: plans and executes it until
    /// nothing more can happen now. Provider calls it decided go to the caller (decided ones
    /// stay even when a later round fails: their progress markers are set). An unresolved
    /// incident is planned again after [`INCIDENT_RESYNC_MS`]: its plan depends on heartbeat
    /// ages and on the other hosts of its pool, which no one change announces; anything that
    /// writes it, or a heartbeat that changed something, asks for it at once.
    pub(in crate::cluster) fn reconcile(
        ctx: &mut Ctx<'_>,
        id: &str,
        l: &mut Lent<'_>,
    ) -> Result<Requeue, Error> {
        let w = &mut ctx.w;
        let mut jobs = Vec::new();
        let result = remediate_one(w, l, id, &mut jobs).and_then(|()| w.judge_incident(id));
        l.jobs.extend(jobs);
        if let Err(e) = result {
            // Counted again on the next pass: a failed round may have changed what they count.
            if let Some(i) = w.state.incidents().get(id) {
                w.breaker_counts.remove(&i.value.pool);
            }
            return Err(e);
        }
        Ok(match w.state.incidents().get(id) {
            Some(i) if i.value.state != IncidentState::Resolved => Requeue::RequeueAfter(INCIDENT_RESYNC_MS),
            _ => Requeue::AwaitChange,
        })
    }
}

/// Plans and executes one incident until nothing more can happen now.
fn remediate_one(
    w: &mut Writer<'_>,
    l: &mut Lent<'_>,
    id: &str,
    jobs: &mut Vec<ProviderJob>,
) -> Result<(), Error> {
    resume_launch(w, l, id, jobs)?;
    // A few rounds: executing one action can make the next possible at once.
    for _ in 0..8 {
        let mark = jobs.len();
        match remediate_round(w, l, id, jobs) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                // The round's record was not committed, so the provider calls it decided
                // are not made (a launch whose token binding is not stored could never
                // join) and their progress markers are reset: the next pass decides again.
                for job in jobs.drain(mark..) {
                    if let Some(p) = l.progress.get_mut(id) {
                        match job {
                            ProviderJob::Launch { .. } => p.launching = false,
                            ProviderJob::Terminate { .. } => p.terminating = false,
                        }
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Plans the incident once and executes and records the plan; false when there was
/// nothing to do.
fn remediate_round(
    w: &mut Writer<'_>,
    l: &mut Lent<'_>,
    id: &str,
    jobs: &mut Vec<ProviderJob>,
) -> Result<bool, Error> {
    let now = w.now_ms;
    // Planned from the stored record; copied only when there is something to do (most
    // passes plan nothing for most incidents).
    let (plan, mut incident) = {
        let Some(incident) = w.state.incidents().get(id).map(|v| &v.value) else { return Ok(false) };
        // The pool's storm-breaker counts, kept between passes and worked out again only
        // after something they count changed (`Cluster::breaker_counts`): incidents that
        // wait (most of them, most of the time) do not walk every host on every tick.
        let c = match w.breaker_counts.get(&incident.pool) {
            Some(c) => {
                debug_assert_eq!(*c, w.reader().pool_counts(&incident.pool), "stale breaker counts");
                *c
            }
            None => {
                let c = w.reader().pool_counts(&incident.pool);
                w.breaker_counts.insert(incident.pool.clone(), c);
                c
            }
        };
        let Some(world) = world_of(w, l, incident, c) else { return Ok(false) };
        let Some(pool) = w.state.pools().get(&incident.pool).map(|p| &p.value) else {
            return Ok(false);
        };
        let plan = remediation::plan(incident, &world, &pool.remediation_policy, pool.mode, now);
        if plan.actions.is_empty() {
            return Ok(false);
        }
        (plan, incident.clone())
    };
    w.breaker_counts.remove(&incident.pool);
    note_affected(w, &mut incident);
    for planned in &plan.actions {
        let moved = execute(w, l, &mut incident, &planned.action, jobs)?;
        remediation::record(&mut incident, planned, now);
        if planned.action == Action::Record(Step::TasksRunningAgain) {
            incident.resumed_at_ms = replacements_running_since(w, &incident);
        }
        // The affected tasks exist once recorded: note where each one went.
        for (old, new, host) in moved {
            incident.set_replacement(old, new, host);
        }
    }
    if incident.state == IncidentState::Resolved {
        incident.resolved_at_ms.get_or_insert(now);
    }
    w.write_incident(incident)?;
    Ok(true)
}

/// Lists every live task on the incident's host as affected once the host is being
/// drained, so the record shows all of them (fenced tasks waiting for termination too),
/// not only those already moved or stopped.
fn note_affected(w: &Writer<'_>, incident: &mut Incident) {
    if !incident.has(Step::Cordoned) {
        return;
    }
    let Some(ix) = w.sched.host(&incident.host_id) else { return };
    for id in w.state.tasks().on_host(ix) {
        if let Some(t) = w.state.tasks().get(id).filter(|t| t.task.desired_status != TaskStatus::Stopped) {
            incident.note_affected(*id, t.task.group.clone());
        }
    }
}

/// After a server restart the provider calls in flight are forgotten: a replacement the
/// timeline says was requested, and that has not joined, is asked for again (launch is
/// idempotent by name) with a new registration token (only the token's digest was kept,
/// so the old one can no longer be handed out; it is superseded).
fn resume_launch(
    w: &mut Writer<'_>,
    l: &mut Lent<'_>,
    id: &str,
    jobs: &mut Vec<ProviderJob>,
) -> Result<(), Error> {
    let Some(i) = w.state.incidents().get(id).map(|v| &v.value) else { return Ok(()) };
    // A token that expired before its machine joined is minted again, and the machine
    // asked for again, once no launch is in flight.
    let expired = i
        .replacement
        .as_ref()
        .is_some_and(|b| b.host_id.is_none() && !b.revoked && w.now_ms >= b.expires_at_ms);
    let progress = l.progress.get(id);
    if (progress.is_some() && !expired)
        || progress.is_some_and(|p| p.launching)
        || !i.has(Step::ReplacementRequested)
        || i.has(Step::ReplacementReady)
        || i.replacement.as_ref().is_some_and(|r| r.host_id.is_some() || r.revoked)
    {
        return Ok(());
    }
    // Copied only when a launch may be asked for again (rare), not at every pass.
    if !l.has_provider {
        return Ok(());
    }
    let Some(mut i) = w.state.incidents().get(id).map(|v| v.value.clone()) else { return Ok(()) };
    let job = mint_replacement(w, l, &mut i)?;
    w.write_incident(i)?;
    let p = l.progress.entry(id.to_string()).or_default();
    p.launching = true;
    p.launch = None;
    jobs.push(job);
    Ok(())
}

/// Mints the one-time registration token of the incident's replacement, binds its digest
/// to the incident (replacing any earlier one), and returns the launch to request. The
/// caller writes the incident.
fn mint_replacement(
    w: &mut Writer<'_>,
    l: &mut Lent<'_>,
    incident: &mut Incident,
) -> Result<ProviderJob, Error> {
    let token = auth::new_token("mpsf_repl_")?;
    let digest = auth::digest(&token);
    // Tokens minted before stay valid: the machine launched with one may still be booting
    // (a relaunch by name returns that machine).
    let mut earlier = Vec::new();
    if let Some(old) = incident.replacement.take() {
        earlier = old.earlier_token_sha256;
        earlier.push(old.token_sha256);
        if earlier.len() > 8 {
            earlier.remove(0);
        }
    }
    let name = replacement_name(incident);
    let pool = incident.pool.clone();
    launch_asked(l.launches_asked, &pool, &name, w.now_ms);
    incident.replacement = Some(ReplacementBinding {
        name: name.clone(),
        token_sha256: digest.clone(),
        earlier_token_sha256: earlier,
        expires_at_ms: w.now_ms + REPLACEMENT_TOKEN_TTL_MS,
        host_id: None,
        revoked: false,
    });
    Ok(ProviderJob::Launch {
        incident: incident.id.clone(),
        pool: incident.pool.clone(),
        name,
        token: Some(RegistrationToken(token)),
    })
}

/// What the planner needs to know about an incident's host, pool, tasks and provider.
fn world_of(w: &Writer<'_>, l: &Lent<'_>, incident: &Incident, counts: PoolCounts) -> Option<WorldView> {
    let ix = w.sched.host(&incident.host_id)?;
    let e = &w.state.hosts()[ix as usize];
    let mut open: Vec<&Incident> = w
        .state
        .incidents()
        .unresolved()
        .filter(|i| i.pool == incident.pool)
        .filter(|i| i.id == incident.id || i.operator_requested != Some(OperatorAction::Drain))
        .collect();
    // Earliest opened first; incidents opened in the same millisecond by their hosts'
    // registration order (not by their random ids), so the ranking is reproducible.
    let seq_of =
        |i: &Incident| w.sched.host(&i.host_id).map_or(u64::MAX, |x| w.state.hosts()[x as usize].host().seq);
    open.sort_by_cached_key(|&i| (i.opened_at_ms, seq_of(i), i.id.as_str()));
    let rank = open.iter().position(|i| i.id == incident.id).unwrap_or(0) as u32;
    let in_flight = open
        .iter()
        .filter(|i| {
            i.id != incident.id && i.has(Step::ReplacementRequested) && !i.has(Step::ReplacementReady)
        })
        .count() as u32;
    let recent: Vec<u64> = w.state.incidents().replacement_requests(&incident.pool).collect();
    let pool = w.state.pools().get(&incident.pool)?;
    let grace = pool.value.health_policy.agent_heartbeat_grace_ms;
    let now = w.now_ms;
    let agent_reachable = e.last_heartbeat_ms.is_some_and(|t| now.saturating_sub(t) <= grace)
        && e.host().status != HostStatus::Deregistered;
    // The host's live tasks (stopped ones matter to no step), from its own index rather than
    // a scan of every task record.
    let tasks: Vec<HostTask> = w
        .state
        .tasks()
        .on_host(ix)
        .iter()
        .filter_map(|id| w.state.tasks().get(id))
        .map(|t| HostTask {
            id: t.task.id,
            // A DAEMON service's task belongs to its host: it is not moved elsewhere (the
            // service starts one on the replacement once that is ACTIVE).
            owner: match t.task.group.as_ref().map(|g| (g, w.state.services().get(g))) {
                Some((_, Some(s))) if s.value.scheduling_strategy == SchedulingStrategy::Daemon => {
                    TaskOwner::Standalone
                }
                Some((g, s)) => TaskOwner::Service {
                    name: g.clone(),
                    boundary: s.map(|s| s.value.resumption).unwrap_or_default(),
                },
                None => TaskOwner::Standalone,
            },
            last_status: t.task.last_status,
            // A replica leaving traffic is told to stop: its service stops it after its
            // delay, and it is not moved again.
            desired_status: match t.task.draining {
                Some(_) => TaskStatus::Stopped,
                None => t.task.desired_status,
            },
        })
        .collect();
    let progress = l.progress.get(&incident.id).cloned().unwrap_or_default();
    // Only the host that registered with this incident's token is its replacement.
    let joined = incident
        .replacement
        .as_ref()
        .and_then(|r| r.host_id.as_ref())
        .and_then(|id| w.sched.host(id))
        .map(|x| &w.state.hosts()[x as usize])
        .filter(|h| h.host().pool == incident.pool)
        .filter(|h| h.host().status == HostStatus::Active && h.host().health_status == HealthStatus::Ok);
    // A launch whose host has not joined within the provider's `launchTimeoutSeconds`
    // counts as failed (a host that joins later still becomes the replacement).
    let timeout_ms =
        w.state.pools().get(&incident.pool).and_then(|p| mpsfleet_core::bounds::launch_timeout_ms(&p.value));
    let overdue = incident
        .first(Step::ReplacementRequested)
        .zip(timeout_ms)
        .filter(|&(at, t)| w.now_ms.saturating_sub(at) > t);
    let replacement = match (joined, &progress.launch) {
        (Some(h), _) => ReplacementState::Ready { host_id: Some(h.host().id.clone()) },
        (None, Some(Err(reason))) => ReplacementState::Failed { reason: reason.clone() },
        (None, _) if overdue.is_some() => ReplacementState::Failed {
            reason: format!(
                "the provider's host did not join within launchTimeoutSeconds ({})",
                mpsfleet_core::health::fmt_ms(overdue.map_or(0, |(_, t)| t))
            ),
        },
        (None, Some(Ok(()))) => ReplacementState::Requested,
        (None, None) if progress.launching => ReplacementState::Requested,
        (None, None) if incident.has(Step::ReplacementRequested) && !l.has_provider => {
            ReplacementState::Failed { reason: "the pool has no capacity provider".into() }
        }
        (None, None) if incident.has(Step::ReplacementRequested) => ReplacementState::Requested,
        (None, None) => ReplacementState::NotRequested,
    };
    let termination = if e.host().status == HostStatus::Deregistered {
        TerminationState::Confirmed
    } else if progress.terminating || progress.terminate.is_some() {
        // A failed termination is requested again (terminate is idempotent) once its
        // backoff has passed.
        let failed = matches!(progress.terminate, Some(Err(_))) && !progress.terminating;
        if failed && now >= progress.terminate_retry_at_ms {
            TerminationState::NotRequested
        } else {
            TerminationState::Requested
        }
    } else {
        TerminationState::NotRequested
    };
    // A replacement its service stopped (or that stopped) counts as RUNNING once the service
    // runs its count without it (`service_at_count_since`).
    let covered = |a: &mpsfleet_types::AffectedTask| {
        a.service.as_ref().and_then(|s| service_at_count_since(w, s, &incident.host_id)).is_some()
    };
    let replacement_tasks = incident
        .affected_tasks
        .iter()
        .filter_map(|a| Some((a, a.replacement?)))
        // A replacement counts as RUNNING once it is also ready (its readiness check
        // passes, where it declares one): that is when the work has resumed.
        .filter_map(|(a, r)| w.state.tasks().get(&r).map(|e| (a, r, &e.task)))
        .map(|(a, r, t)| match t.last_status {
            _ if t.desired_status == TaskStatus::Stopped && covered(a) => (r, TaskStatus::Running),
            TaskStatus::Running if !t.ready => (r, TaskStatus::Activating),
            s => (r, s),
        })
        .collect();
    Some(WorldView {
        pool: PoolView {
            total_hosts: counts.total,
            unhealthy_hosts: counts.unhealthy,
            replacements_in_flight: in_flight,
            recent_replacements_ms: recent,
            incident_rank: rank,
        },
        host: HostState {
            status: e.host().status,
            cordoned: e.host().cordoned,
            healthy: matches!(e.health.verdict, Verdict::Healthy)
                && e.host().health_status == HealthStatus::Ok,
            agent_reachable,
        },
        tasks,
        replacement,
        termination,
        replacement_tasks,
    })
}

/// Executes one action; returns the (old, new, host) of tasks it moved.
fn execute(
    w: &mut Writer<'_>,
    l: &mut Lent<'_>,
    incident: &mut Incident,
    action: &Action,
    jobs: &mut Vec<ProviderJob>,
) -> Result<Moved, Error> {
    let Some(ix) = w.sched.host(&incident.host_id) else { return Ok(Vec::new()) };
    let mut moved = Vec::new();
    match action {
        Action::Record(_) | Action::Resolve | Action::Block { .. } => {}
        Action::Cordon => {
            let mut h = w.state.hosts()[ix as usize].host().clone();
            h.cordoned = true;
            w.write_host(ix, h)?;
        }
        Action::MarkDraining => {
            let mut h = w.state.hosts()[ix as usize].host().clone();
            match host_lifecycle::apply(&mut h, host_lifecycle::Event::Drain) {
                Ok(_) => w.write_host(ix, h)?,
                // A host already gone is not drained again.
                Err(e) => tracing::warn!(host.id = %h.id, "not drained: {e}"),
            }
        }
        Action::RequestReplacement => match l.has_provider {
            true => {
                let job = mint_replacement(w, l, incident)?;
                l.progress.entry(incident.id.clone()).or_default().launching = true;
                jobs.push(job);
            }
            false => {
                l.progress.entry(incident.id.clone()).or_default().launch =
                    Some(Err("the pool has no capacity provider".into()));
            }
        },
        Action::StartReplacements { tasks } => {
            moved = move_tasks(w, ix, tasks, &incident.id)?;
            // An operator's drain takes replicas in traffic out of it before their stop.
            let draining = (tasks.iter())
                .filter_map(|m| w.state.tasks().get(&m.task_id))
                .filter(|e| e.task.draining.is_some() && e.task.desired_status != TaskStatus::Stopped)
                .count();
            if draining > 0 {
                let detail = format!(
                    "{draining} replica(s) left service discovery (weight 0) for their service's \
                     deregistration delay before their stop"
                );
                incident.push(w.now_ms, Step::LeftTraffic, detail, None);
            }
        }
        Action::StopStandalone { task_ids, stop_code } => {
            let gone = w.state.hosts()[ix as usize].host().status == HostStatus::Deregistered;
            let reason = match stop_code {
                StopCode::HostDrained => {
                    format!("host {} drained by operator (incident {})", incident.host_id, incident.id)
                }
                _ => format!("host {} was replaced (incident {})", incident.host_id, incident.id),
            };
            let stopped: Vec<Task> = task_ids
                .iter()
                .filter_map(|id| w.state.tasks().get(id))
                .map(|e| w.reader().forced_stop(&e.task, *stop_code, &reason, gone))
                .collect();
            w.write_tasks(stopped)?;
        }
        Action::TerminateOldHost => {
            if l.has_provider {
                l.progress.entry(incident.id.clone()).or_default().terminating = true;
                jobs.push(ProviderJob::Terminate {
                    incident: incident.id.clone(),
                    pool: incident.pool.clone(),
                    name: w.state.hosts()[ix as usize].host().hostname.clone(),
                });
            } else {
                // Without a provider nothing can confirm the machine is gone, so nothing
                // is moved on the strength of it: the termination counts as failed (asked
                // again after a backoff) until the operator removes the machine and
                // resolves the incident.
                let now = w.now_ms;
                let p = l.progress.entry(incident.id.clone()).or_default();
                p.terminate = Some(Err("the pool has no capacity provider to terminate the host".into()));
                p.terminate_failures += 1;
                p.terminate_retry_at_ms =
                    now + TERMINATE_RETRY.backoff_after(p.terminate_failures).as_millis() as u64;
            }
        }
    }
    Ok(moved)
}

/// Moves service tasks off a host in one commit: each old copy is stopped
/// (`HostReplaced`) and a new task of its service is created and placed elsewhere.
fn move_tasks(w: &mut Writer<'_>, ix: HostIx, moves: &[MoveTask], incident: &str) -> Result<Moved, Error> {
    let gone = w.state.hosts()[ix as usize].host().status == HostStatus::Deregistered;
    let host_id = w.state.hosts()[ix as usize].host().id.clone();
    let reason = format!("moved off host {host_id} (incident {incident})");
    let mut batch = Batch::default();
    let mut stops = Vec::new();
    let mut pairs = Vec::new();
    // Copies already named as some moved task's replacement.
    let mut taken: BTreeSet<TaskId> = w
        .state
        .incidents()
        .get(incident)
        .map(|i| i.value.affected_tasks.iter().filter_map(|a| a.replacement).collect())
        .unwrap_or_default();
    // Copies started since the failure's first signal can stand in for a moved task.
    let since = w.state.incidents().get(incident).map_or(u64::MAX, |i| {
        let t = i.value.timing();
        t.first_failure_at_ms.or(t.detected_at_ms).unwrap_or(u64::MAX)
    });
    // An operator's drain is planned: a replica in traffic on a host that still answers
    // leaves traffic for its service's delay before it stops (`planned_stop`), while its
    // replacement starts elsewhere. A failure's move stops at once.
    let planned = !gone
        && (w.state.incidents().get(incident))
            .is_some_and(|i| i.value.operator_requested == Some(OperatorAction::Drain));
    let now = w.now_ms;
    for m in moves {
        let Some(old) = w.state.tasks().get(&m.task_id).map(|e| e.task.clone()) else { continue };
        let Some(svc) = w.state.services().get(&m.service).map(|s| s.value.clone()) else { continue };
        let stopped = if planned {
            let delay = svc.deregistration_delay_seconds;
            w.reader().planned_stop(&old, delay, StopCode::HostReplaced, &reason, now)
        } else {
            w.reader().forced_stop(&old, StopCode::HostReplaced, &reason, gone)
        };
        let version = w.state.tasks().get(&old.id).map_or(0, |e| e.version);
        batch.ops.push(Op::put_json(TASK, old.id.to_string(), &stopped, Precondition::Version(version))?);
        stops.push(stopped);
        // A `restart` service that started a copy elsewhere once this task's daemon failed
        // gets no second one: the old copy stops, and that copy is its replacement.
        if let Some((copy, host)) = early_copy(w, &svc, &old, &taken, since) {
            taken.insert(copy);
            pairs.push((old.id, copy, host));
            continue;
        }
        // The replacement of a replica lost to the host's failure: under the pool's
        // `recovery` preemption, it may make room in a full pool.
        let spec = NewTasks { recovery_from: old.host_id.clone(), ..tasks_of(&svc) };
        let before = batch.created.len();
        if let Err(e) = w.create_tasks(&spec, 1, &mut batch) {
            w.rollback(&batch);
            return Err(e);
        }
        if let Some((new, _, _)) = batch.created.get(before) {
            pairs.push((old.id, new.id, new.host_id.clone()));
        }
    }
    let rev = w.write_batch(&[], [], &batch)?;
    for t in stops {
        // Its service stops a replica leaving traffic once its delay is over.
        if let Some(g) = t.group.as_ref().filter(|_| t.draining.is_some()) {
            w.ask(Work::Service(g.clone()));
        }
        w.apply_task_update(t, rev)?;
    }
    for (task, placement, _) in batch.created {
        w.insert_task(task, rev, placement, true);
    }
    tell_services_of_moves(w, &pairs, moves, &host_id, incident)?;
    Ok(pairs)
}

/// Each service whose tasks an incident moved says so in its events: which task went
/// where, and why (the service's describe shows a move it did not make itself).
fn tell_services_of_moves(
    w: &mut Writer<'_>,
    pairs: &Moved,
    moves: &[MoveTask],
    from: &HostId,
    incident: &str,
) -> Result<(), Error> {
    let mut by_service: BTreeMap<ServiceName, Vec<String>> = BTreeMap::new();
    for (old, new, host) in pairs {
        let Some(m) = moves.iter().find(|m| m.task_id == *old) else { continue };
        let to = host.as_ref().map_or_else(|| "waiting for a host".to_string(), |h| format!("on host {h}"));
        by_service.entry(m.service.clone()).or_default().push(format!("{old} -> {new} ({to})"));
    }
    let now = w.now_ms;
    for (name, words) in by_service {
        let Some(mut svc) = w.state.services().get(&name).map(|s| s.value.clone()) else { continue };
        let msg = format!(
            "incident {incident} moved {} task(s) off host {from}: {}",
            words.len(),
            words.join(", ")
        );
        svc.events.push(now, ObjectEvent::new("TasksMovedByIncident", msg));
        services::write_service(w, svc)?;
    }
    Ok(())
}

/// When the last replacement of the incident's moved service tasks started RUNNING, when
/// every one has (None when one has not, or none was started). A replacement that stopped
/// (its service scaled it in as one too many, moved it, or it failed and was replaced) is
/// followed no further: its task counts as resumed once its service runs its desired count
/// on healthy daemons off the incident's host, at the start of the replica that made the
/// count.
fn replacements_running_since(w: &Writer<'_>, incident: &Incident) -> Option<u64> {
    let mut last = None;
    for a in incident.affected_tasks.iter().filter(|a| a.service.is_some() && !a.waiting) {
        let t = &w.state.tasks().get(&a.replacement?)?.task;
        let at = match t.desired_status {
            TaskStatus::Stopped => service_at_count_since(w, a.service.as_ref()?, &incident.host_id)?,
            _ => t.started_at_ms?,
        };
        last = last.max(Some(at));
    }
    last
}

/// When `service` last reached its desired count of RUNNING replicas on healthy daemons off
/// `host` (the start of the replica that made the count), if it runs that many now.
fn service_at_count_since(w: &Writer<'_>, service: &ServiceName, host: &HostId) -> Option<u64> {
    let desired = w.state.services().get(service)?.value.desired_count as usize;
    let mut started: Vec<u64> = (w.state.tasks().of_service(service).iter())
        .filter_map(|id| w.state.tasks().get(id))
        .map(|e| &e.task)
        .filter(|t| t.desired_status == TaskStatus::Running && t.last_status == TaskStatus::Running)
        .filter(|t| t.host_id.as_ref() != Some(host) && !w.reader().at_risk(t))
        .filter_map(|t| t.started_at_ms)
        .collect();
    if desired == 0 || started.len() < desired {
        return None;
    }
    started.sort_unstable();
    Some(started[desired - 1])
}

/// The copy a `restart` service already started elsewhere for `old` (on a failed daemon):
/// when the service's counted replicas, `old` left out, already make its desired count, the
/// newest of them created `since` the failure's first signal (or started for its host's
/// failure), not on `old`'s host and not yet named as a replacement.
fn early_copy(
    w: &Writer<'_>,
    svc: &Service,
    old: &Task,
    taken: &BTreeSet<TaskId>,
    since: u64,
) -> Option<(TaskId, Option<HostId>)> {
    if svc.resumption != ResumptionBoundary::Restart {
        return None;
    }
    let counted: Vec<&Task> = w
        .state
        .tasks()
        .of_service(&svc.name)
        .iter()
        .filter_map(|id| w.state.tasks().get(id))
        .map(|e| &e.task)
        .filter(|t| t.id != old.id && t.desired_status != TaskStatus::Stopped && !w.reader().at_risk(t))
        .collect();
    if (counted.len() as u32) < svc.desired_count {
        return None;
    }
    // A copy started for this host's failure says so (`recovery_from`): it counts even when
    // the failure's first signal, placed on this clock from a later report, reads a few
    // milliseconds after the copy's creation.
    let for_this = |t: &Task| t.recovery_from.is_some() && t.recovery_from == old.host_id;
    counted
        .into_iter()
        .filter(|t| t.host_id != old.host_id && !taken.contains(&t.id))
        .filter(|t| t.created_at_ms >= since || for_this(t))
        .max_by_key(|t| (t.created_at_ms, t.id))
        .map(|t| (t.id, t.host_id.clone()))
}

/// A launch of host `name` into `pool` was asked for at `now` (the first ask counts: a
/// relaunch by name is the same machine).
pub(in crate::cluster) fn launch_asked(
    asked: &mut HashMap<(PoolName, String), u64>,
    pool: &PoolName,
    name: &str,
    now: u64,
) {
    if asked.len() < MAX_LAUNCHES_TRACKED {
        asked.entry((pool.clone(), name.to_string())).or_insert(now);
    }
}

/// Each pass judges its incident against the bounds it is held to.
impl Writer<'_> {
    /// Records the phases of incident `id` that have run past their bound since the last
    /// pass: on the incident (committed with it), in its pool's events and the metrics.
    pub(in crate::cluster) fn judge_incident(&mut self, id: &str) -> Result<(), Error> {
        let now = self.now_ms;
        let Some(incident) = self.state.incidents().get(id).map(|v| &v.value) else { return Ok(()) };
        let found = incident.new_breaches(now);
        if found.is_empty() {
            return Ok(());
        }
        let mut incident = incident.clone();
        let mut words = Vec::new();
        for (phase, measured_ms, bound_ms) in found {
            let cause = self.reader().breach_cause(&incident, phase);
            let breach = BoundBreach { phase, at_ms: now, bound_ms, measured_ms, cause };
            let detail = format!("recovery bound breached: {}", breach.words());
            incident.push(now, Step::BoundBreached, detail, None);
            words.push(breach.words());
            incident.breaches.push(breach);
        }
        let pool = incident.pool.clone();
        let message = format!("incident {} on host {}: {}", incident.id, incident.host_id, words.join("; "));
        tracing::warn!(incident.id = %incident.id, pool = %pool, "{message}");
        self.write_incident(incident)?;
        self.pool_event(&pool, "RecoveryBoundBreached", message)
    }
}

impl Reader<'_> {
    /// Why `phase` of `incident` ran long, when the record or the world says.
    pub(in crate::cluster) fn breach_cause(
        &self,
        incident: &Incident,
        phase: RecoveryPhase,
    ) -> Option<BreachCause> {
        let t = incident.timing();
        let began = match phase {
            RecoveryPhase::Detect | RecoveryPhase::Total => t.first_failure_at_ms.or(t.detected_at_ms),
            RecoveryPhase::Decide => t.detected_at_ms,
            RecoveryPhase::Replace => t.decided_at_ms,
        };
        if began.is_some_and(|b| b < self.loaded_at_ms) {
            return Some(BreachCause::ControlPlaneRestart);
        }
        if incident.has(Step::Blocked) && phase != RecoveryPhase::Detect {
            let provider =
                incident.timeline.iter().any(|e| e.step == Step::Blocked && e.detail.contains("provider"));
            return Some(if provider { BreachCause::ProviderSlow } else { BreachCause::BreakerOpen });
        }
        match phase {
            RecoveryPhase::Detect => self.slower_failure(incident),
            RecoveryPhase::Decide => None,
            // A launch not joined within its timeout counts as failed: the provider's.
            RecoveryPhase::Replace => Some(BreachCause::ProviderSlow),
            RecoveryPhase::Total => {
                let replacements: Vec<&Task> = incident
                    .affected_tasks
                    .iter()
                    .filter_map(|a| a.replacement.and_then(|r| self.state.tasks().get(&r)).map(|e| &e.task))
                    .collect();
                let waiting =
                    incident.affected_tasks.iter().any(|a| a.service.is_some() && a.replacement.is_none());
                if replacements.iter().any(|t| t.host_id.is_none() && t.last_status != TaskStatus::Stopped) {
                    Some(BreachCause::NoCapacity)
                } else if waiting && incident.has(Step::ProviderRetry) {
                    Some(BreachCause::ProviderSlow)
                } else if !replacements.is_empty() && replacements.iter().all(|t| t.host_id.is_some()) {
                    Some(BreachCause::TaskSlowToStart)
                } else {
                    None
                }
            }
        }
    }

    /// A daemon whose local restarts came further apart than the `daemon-exit` bound counts
    /// (each restart killed again at once, the n-th after (n-1) x restartBackoffMs and its
    /// start): the failure, not the server, took the time.
    fn slower_failure(&self, incident: &Incident) -> Option<BreachCause> {
        if incident.bounds?.kind != mpsfleet_types::bounds::FailureKind::DaemonExit {
            return None;
        }
        let first = incident.trigger.first_failure_at_ms?;
        let last = *incident.trigger.local_repairs_at_ms.last()?;
        let h = &self.state.pools().get(&incident.pool)?.value.health_policy;
        let iv = intervals();
        let exits = h.mps_failure_threshold.min(h.local_daemon_restarts + 1);
        let assumed: u64 =
            (1..u64::from(exits)).map(|n| (n - 1) * iv.restart_backoff_ms + iv.daemon_start_ms).sum();
        (last.saturating_sub(first) > assumed).then_some(BreachCause::SlowerFailure)
    }
}
