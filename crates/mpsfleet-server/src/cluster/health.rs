//! Host health and incidents in the server: evaluates each host's checks on every heartbeat
//! and on a tick, takes impaired hosts out of placement at once, opens an incident when a
//! host is declared bad, and drives each incident with the pure planner of
//! `mpsfleet_core::remediation`, executing its actions and recording them.
//!
//! Capacity provider calls (launch, terminate) are slow and run outside the cluster lock:
//! the planner's actions are turned into [`ProviderJob`]s that the caller runs and reports
//! back with [`Cluster::provider_done`].

use super::*;
use crate::provider::{AttemptRecord, Retry};
use mpsfleet_core::controller::Action as Requeue;
use mpsfleet_core::health::{evaluate, HealthInput, Verdict};
use mpsfleet_core::remediation::{
    self, Action, HostState, HostTask, MoveTask, PoolView, ReplacementState, TaskOwner, TerminationState,
    WorldView,
};
use mpsfleet_types::service::SchedulingStrategy;

pub(super) const INCIDENT: &str = "incident";

/// How often an unresolved incident is planned again when nothing asked for it (the health
/// tick's period: its plan depends on heartbeat ages and on its pool's other hosts).
pub const INCIDENT_RESYNC_MS: u64 = 250;

/// How often a pool with a provider is checked against its host count when nothing asked.
pub const CAPACITY_RESYNC_MS: u64 = 1_000;

/// Tasks moved off a host: the old copy, its replacement, and where that was placed.
type Moved = Vec<(TaskId, TaskId, Option<HostId>)>;

/// The longest a GPU stays closed to MPS tasks after its daemon did not answer, once its
/// check is OK again.
pub const MPS_CLOSED_HOLD_MS: u64 = 1_000;

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

/// A pool's hosts as the storm breaker counts them (see `Cluster::pool_counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PoolCounts {
    pub total: u32,
    pub unhealthy: u32,
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
pub(super) struct ProviderProgress {
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
const TERMINATE_RETRY: Retry = Retry {
    initial_backoff: std::time::Duration::from_secs(5),
    max_backoff: std::time::Duration::from_secs(300),
    max_attempts: u32::MAX,
};

impl Cluster {
    pub(super) fn load_incidents(&mut self) -> Result<(), Error> {
        for r in self.store.list(INCIDENT)? {
            let mut i: Incident = decode(&r)?;
            i.normalize();
            self.apply(r.version, Change::Incident(Box::new(i)));
        }
        Ok(())
    }

    pub fn incidents(&self) -> Vec<Incident> {
        let mut v: Vec<Incident> =
            self.state.incidents().values().map(|v| self.shown(v.value.clone())).collect();
        v.sort_by(|a, b| (a.opened_at_ms, &a.id).cmp(&(b.opened_at_ms, &b.id)));
        v
    }

    pub fn incident(&self, id: &str) -> Result<Incident, Error> {
        self.state
            .incidents()
            .get(id)
            .map(|v| self.shown(v.value.clone()))
            .ok_or_else(|| Error::not_found("incident", id))
    }

    /// An incident as it is shown: a replacement task placed after the incident recorded it
    /// (it waited for capacity, say until the host came back) names the host it landed on.
    pub(super) fn shown(&self, mut i: Incident) -> Incident {
        for a in i.affected_tasks.iter_mut().filter(|a| a.replacement_host.is_none()) {
            a.replacement_host =
                a.replacement.and_then(|r| self.state.tasks().get(&r)).and_then(|e| e.task.host_id.clone());
        }
        i
    }

    pub(super) fn open_incident_of(&self, host: &HostId) -> Option<&Incident> {
        self.state.incidents().unresolved().find(|i| &i.host_id == host)
    }

    /// Commits an incident, then applies it; an incident equal to the stored one is not
    /// written again (nothing to say, nothing to store).
    pub(super) fn write_incident(&mut self, incident: Incident) -> Result<(), Error> {
        let expect = match self.state.incidents().get(&incident.id) {
            Some(v) if v.value == incident => return Ok(()),
            Some(v) => Precondition::Version(v.version),
            None => Precondition::Absent,
        };
        let rev = self.commit(&[Op::put_json(INCIDENT, incident.id.clone(), &incident, expect)?])?;
        self.apply_incident(incident, rev);
        Ok(())
    }

    /// Applies a committed incident: announces what changed and counts it in the metrics.
    pub(super) fn apply_incident(&mut self, incident: Incident, rev: Revision) {
        let old = self.state.incidents().get(&incident.id).map(|v| &v.value);
        self.live.incident(old, &incident);
        self.events.incident(old.map(|o| (&o.state, o.timeline.pushed())), &incident, self.now());
        // Whether the host's verdict opens an incident depends on its incidents.
        if let Some(ix) = self.sched.host(&incident.host_id) {
            self.work.health_due_ms[ix as usize] = 0;
        }
        let pool = incident.pool.clone();
        // A new incident gets its key; one already keyed asks for itself every
        // `INCIDENT_RESYNC_MS` while unresolved, and whoever changes it from outside its
        // reconcile (an operator, a heartbeat, a provider call) asks for it at once. Its own
        // reconcile's writes ask for nothing: it has just planned them.
        if old.is_none() && incident.state != IncidentState::Resolved {
            self.ask(Work::Incident(incident.opened_at_ms, incident.id.clone()));
        }
        self.apply(rev, Change::Incident(Box::new(incident)));
        // A replacement asked for or ready changes what the pool's capacity counts.
        self.ask_capacity(&pool);
    }

    /// Evaluates every host (heartbeat grace runs out without any report) and drives every
    /// incident; returns the provider calls to make.
    pub fn health_tick(&mut self) -> Result<Vec<ProviderJob>, Error> {
        self.run_work();
        let now = self.now();
        for ix in 0..self.state.hosts().len() as HostIx {
            // Only a host whose evaluation can have changed since the last one.
            if self.work.health_due_ms[ix as usize] > now {
                continue;
            }
            // One host's failure (a failed commit) is logged and left for the next tick; the
            // others are evaluated all the same.
            if let Err(e) = self.evaluate_host(ix) {
                let host = &self.state.hosts()[ix as usize].host().id;
                tracing::warn!(host.id = %host, error = %e, "host evaluation failed; retrying at the next tick");
            }
        }
        self.reopen_mps_gpus();
        // What this tick asked for (an incident just opened, a pool whose GPUs opened again)
        // runs now, not a tick later.
        self.run_work();
        Ok(self.take_jobs())
    }

    /// Closes a host's GPUs to new MPS tasks while its agent reports their daemon not OK, or
    /// after a task there was refused because its daemon did not answer (`refused`): a
    /// replacement placed back on that GPU at once would only be refused again. A closed GPU
    /// opens once the hold (the pool's probe interval, at most [`MPS_CLOSED_HOLD_MS`]) has
    /// passed and the host's latest check of it is OK: at worst one refused start per GPU per
    /// hold, never a loop.
    pub(super) fn close_mps_gpus(&mut self, ix: HostIx, refused: &[mpsfleet_core::scheduler::GpuIx]) {
        let e = &self.state.hosts()[ix as usize];
        let hold = self
            .state
            .pools()
            .get(&e.host().pool)
            .map_or(MPS_CLOSED_HOLD_MS, |p| p.value.health_policy.mps_probe_interval_ms)
            .clamp(250, MPS_CLOSED_HOLD_MS);
        let until = self.now() + hold;
        let mut close: Vec<mpsfleet_core::scheduler::GpuIx> = refused.to_vec();
        for (g, inv) in self.sched.host_gpus(ix).zip(&e.host().gpus) {
            if !mps_daemon_ok(&e.checks, &inv.uuid) {
                close.push(g);
            }
        }
        for g in close {
            let at = self.work.mps_closed.entry(g).or_insert(until);
            *at = (*at).max(until);
            self.sched.set_mps_open(g, false);
        }
    }

    /// Opens the closed GPUs whose hold has passed and whose daemon the host reports OK.
    fn reopen_mps_gpus(&mut self) {
        if self.work.mps_closed.is_empty() {
            return;
        }
        let now = self.now();
        let due: Vec<mpsfleet_core::scheduler::GpuIx> =
            self.work.mps_closed.iter().filter(|(_, &at)| now >= at).map(|(&g, _)| g).collect();
        let mut pools = BTreeSet::new();
        for g in due {
            let ix = self.sched.gpu(g).host;
            let e = &self.state.hosts()[ix as usize];
            if e.host().status == HostStatus::Deregistered {
                // Gone: forgotten, and no longer counted as closed (it takes nothing anyway).
                self.work.mps_closed.remove(&g);
                self.sched.set_mps_open(g, true);
                continue;
            }
            let Some(inv) =
                self.sched.host_gpus(ix).zip(&e.host().gpus).find(|(x, _)| *x == g).map(|(_, i)| i)
            else {
                continue;
            };
            if mps_daemon_ok(&e.checks, &inv.uuid) {
                self.work.mps_closed.remove(&g);
                self.sched.set_mps_open(g, true);
                pools.insert(e.host().pool.clone());
            }
        }
        for p in pools {
            self.writer().capacity_opened(p);
        }
    }

    /// A pool with a provider is kept at its desired host count: hosts the provider runs
    /// (replacements included) count, so a replacement in flight is not launched twice. A
    /// self-managed pool's bad host is not terminated automatically, so this never replaces
    /// one there; it only starts the pool's hosts. Asked for when the pool, its hosts, its
    /// incidents or a provider call change, and again every [`CAPACITY_RESYNC_MS`].
    pub(super) fn reconcile_capacity(&mut self, pool: &PoolName) -> Result<Requeue, Error> {
        let Some(desired) = self
            .state
            .pools()
            .get(pool)
            .and_then(|p| p.value.provider.as_ref())
            .map(|prov| prov.desired_hosts)
        else {
            self.work.capacity_launches.remove(pool);
            return Ok(Requeue::AwaitChange);
        };
        if self.provider_for(pool).is_none() {
            return Ok(Requeue::AwaitChange);
        }
        // A scaling pool's desired count is managed scaling's output (`scaling.rs`).
        if let Some(wait) = self.scale(pool)? {
            return Ok(Requeue::RequeueAfter(wait));
        }
        let desired = (self.state.pools().get(pool))
            .and_then(|p| p.value.provider.as_ref())
            .map_or(desired, |prov| prov.desired_hosts);
        // A launched host counts as in flight until it registers (`host_joined`).
        let launching = &self.work.capacity_launches;
        self.creds.launch_tokens.retain(|_, (p, name)| launching.get(p).is_some_and(|l| l.contains(name)));
        // Registered hosts (from the store, so this survives a restart), launches in flight,
        // and replacements requested by incidents that have not joined yet.
        let live = self
            .state
            .hosts()
            .iter()
            .filter(|h| &h.host().pool == pool && h.host().status != HostStatus::Deregistered)
            .count();
        let mut missing = (desired as usize).saturating_sub(live + self.hosts_to_come(pool) as usize);
        let mut k = 0;
        while missing > 0 {
            let name = format!("{pool}-{k}");
            k += 1;
            let taken = self.state.hosts().iter().any(|h| h.host().hostname == name)
                || self.work.capacity_launches.get(pool).is_some_and(|l| l.contains(&name));
            if taken {
                continue;
            }
            self.work.capacity_launches.entry(pool.clone()).or_default().insert(name.clone());
            self.launch_asked(pool, &name);
            let token = self.mint_launch_token(pool, &name);
            self.work.pending_jobs.push(ProviderJob::Launch {
                incident: String::new(),
                pool: pool.clone(),
                name,
                token: Some(token),
            });
            missing -= 1;
        }
        Ok(Requeue::RequeueAfter(CAPACITY_RESYNC_MS))
    }

    /// Hosts asked for and not joined yet: launches to keep the pool at its size, and
    /// replacements its incidents requested.
    pub(super) fn hosts_to_come(&self, pool: &PoolName) -> u32 {
        let in_flight = self.work.capacity_launches.get(pool).map_or(0, |l| l.len());
        let replacing = (self.state.incidents().unresolved())
            .filter(|i| {
                &i.pool == pool && i.has(Step::ReplacementRequested) && !i.has(Step::ReplacementReady)
            })
            .count();
        (in_flight + replacing) as u32
    }

    /// Asks for the capacity of every pool with a provider (the resync's safety net).
    pub(super) fn ask_capacity_everywhere(&mut self) {
        let pools: Vec<PoolName> = self.state.pools().keys().cloned().collect();
        for p in pools {
            self.ask_capacity(&p);
        }
    }

    /// Asks for the pool's capacity when it has a provider.
    pub(super) fn ask_capacity(&mut self, pool: &PoolName) {
        if self.has_provider(pool) {
            self.ask(Work::Capacity(pool.clone()));
        }
    }

    /// What the health of an ACTIVE or DRAINING host comes to with these checks (reported at
    /// `reported_at_ms`) and last heartbeat; `None` for a host that is not evaluated (other
    /// statuses, or no pool).
    pub(super) fn assess_host(
        &self,
        ix: HostIx,
        checks: &[HostCheck],
        last_heartbeat_ms: Option<u64>,
        reported_at_ms: Option<u64>,
        now: u64,
    ) -> Option<mpsfleet_core::health::HostHealth> {
        let e = &self.state.hosts()[ix as usize];
        if !matches!(e.host().status, HostStatus::Active | HostStatus::Draining) {
            return None;
        }
        let policy = &self.state.pools().get(&e.host().pool)?.value.health_policy;
        let registered_at_ms = e.host().registered_at_ms.max(self.loaded_at_ms);
        let input = HealthInput { checks, last_heartbeat_ms, registered_at_ms, reported_at_ms };
        Some(evaluate(&e.health, &input, policy, now))
    }

    /// Whether a heartbeat that repeats the checks host `ix` was last evaluated from leaves
    /// its health as it is: the evaluation is current (its record's health is the evaluated
    /// one, in a status that is evaluated), its agent was heard from in time (so one more
    /// heartbeat changes nothing), and no time at which it could change has come.
    pub(super) fn evaluation_holds(&self, ix: HostIx, now: u64) -> bool {
        let e = &self.state.hosts()[ix as usize];
        e.evaluated
            && now < self.work.health_due_ms[ix as usize]
            && e.host().health_status == e.health.status
            && matches!(e.host().status, HostStatus::Active | HostStatus::Draining)
            && e.health.checks.first().is_some_and(|c| {
                c.gpu_id.is_none() && c.name == mpsfleet_core::health::AGENT && c.status == HealthStatus::Ok
            })
    }

    /// Whether evaluating the host again, with the report and heartbeat it was last evaluated
    /// from, must give the same health: every check OK and the last heartbeat within the grace
    /// (the only input that moves with time while all is OK).
    pub(super) fn stays_healthy(&self, ix: HostIx, now: u64) -> bool {
        let e = &self.state.hosts()[ix as usize];
        let Some(pool) = self.state.pools().get(&e.host().pool) else { return false };
        e.health.status == HealthStatus::Ok
            && e.host().health_status == HealthStatus::Ok
            && matches!(e.health.verdict, Verdict::Healthy)
            && matches!(e.host().status, HostStatus::Active | HostStatus::Draining)
            && e.last_heartbeat_ms
                .is_some_and(|t| now.saturating_sub(t) <= pool.value.health_policy.agent_heartbeat_grace_ms)
    }

    /// Re-evaluates one host: a changed health status is written and applied to placement at
    /// once; a host declared bad gets an incident (one per episode).
    pub(super) fn evaluate_host(&mut self, ix: HostIx) -> Result<(), Error> {
        let now = self.now();
        let e = &self.state.hosts()[ix as usize];
        if e.evaluated && self.stays_healthy(ix, now) {
            self.work.health_due_ms[ix as usize] = self.next_evaluation_ms(ix);
            return Ok(());
        }
        let Some(health) = self.assess_host(ix, &e.checks, e.last_heartbeat_ms, e.checks_at_ms, now) else {
            // Not evaluated in its status: a change of its record or pool makes it due again.
            self.work.health_due_ms[ix as usize] = u64::MAX;
            return Ok(());
        };
        self.state.host_mut(ix).evaluated = true;
        let e = &self.state.hosts()[ix as usize];
        // A server that has just loaded the state (a restart, a new leader) has heard nothing
        // from the hosts yet: "waiting for the first heartbeat" is its own news, not the host's.
        // The stored health stands until the host reports or its grace, counted from the load,
        // runs out; writing it would cost one commit per host at every start and takeover.
        let not_heard_since_load = e.last_heartbeat_ms.is_none()
            && e.host().registered_at_ms < self.loaded_at_ms
            && health.status == HealthStatus::InsufficientData;
        let changed = health.status != e.host().health_status && !not_heard_since_load;
        let verdict = health.verdict.clone();
        self.set_evaluation(ix, health);
        if changed {
            let mut h = self.state.hosts()[ix as usize].host().clone();
            tracing::info!(host.id = %h.id, from = h.health_status.as_str(), to = self.state.hosts()[ix as usize].health.status.as_str(), "host health changed");
            host_lifecycle::set_health(&mut h, self.state.hosts()[ix as usize].health.status);
            self.write_host(ix, h)?;
        }
        if let Verdict::DeclaredBad { mut trigger, impaired_since_ms } = verdict {
            // The restarts an earlier failure of the daemon used of the same budget.
            if let (Some(g), Some(first)) = (&trigger.gpu_id, trigger.first_failure_at_ms) {
                trigger.earlier_repairs_at_ms = self.state.hosts()[ix as usize].repairs_before(g, first);
            }
            let host_id = self.state.hosts()[ix as usize].host().id.clone();
            let pool = &self.state.hosts()[ix as usize].host().pool;
            let Some(mode) = self.state.pools().get(pool).map(|p| p.value.mode) else { return Ok(()) };
            if self.open_incident_of(&host_id).is_none() {
                let id = format!("inc-{:012x}", auth::random_u64()? >> 16);
                let owner = IncidentOwner::for_mode(mode);
                let bounds =
                    self.state.pools().get(pool).and_then(|p| self.incident_bounds(&p.value, ix, &trigger));
                let mut incident =
                    Incident::open(id, host_id.clone(), pool.clone(), owner, trigger, impaired_since_ms, now);
                incident.bounds = bounds;
                incident.drill = self.drill_striking(&host_id);
                tracing::warn!(incident.id = %incident.id, host.id = %host_id, owner = owner.as_str(), "host declared bad");
                self.write_incident(incident)?;
            }
        }
        self.work.health_due_ms[ix as usize] = self.next_evaluation_ms(ix);
        Ok(())
    }

    /// When evaluating host `ix` again, with what it was last evaluated from, can next give
    /// another health (its heartbeat grace running out, an IMPAIRED check reaching the
    /// toleration); `u64::MAX` when only a report or a change of its record can.
    pub(super) fn next_evaluation_ms(&self, ix: HostIx) -> u64 {
        let e = &self.state.hosts()[ix as usize];
        let Some(pool) = self.state.pools().get(&e.host().pool) else { return u64::MAX };
        let input = HealthInput {
            checks: &e.checks,
            last_heartbeat_ms: e.last_heartbeat_ms,
            registered_at_ms: e.host().registered_at_ms.max(self.loaded_at_ms),
            reported_at_ms: e.checks_at_ms,
        };
        mpsfleet_core::health::next_change_at_ms(&e.health, &input, &pool.value.health_policy)
            .unwrap_or(u64::MAX)
    }

    /// The remediation controller's reconcile of one incident: plans and executes it until
    /// nothing more can happen now. Provider calls it decided go to the caller (decided ones
    /// stay even when a later round fails: their progress markers are set). An unresolved
    /// incident is planned again after [`INCIDENT_RESYNC_MS`]: its plan depends on heartbeat
    /// ages and on the other hosts of its pool, which no one change announces; anything that
    /// writes it, or a heartbeat that changed something, asks for it at once.
    pub(super) fn reconcile_incident(&mut self, id: &str) -> Result<Requeue, Error> {
        let mut jobs = Vec::new();
        let result = self.remediate_one(id, &mut jobs).and_then(|()| self.judge_incident(id));
        self.work.pending_jobs.extend(jobs);
        if let Err(e) = result {
            // Counted again on the next pass: a failed round may have changed what they count.
            if let Some(i) = self.state.incidents().get(id) {
                self.work.breaker_counts.remove(&i.value.pool);
            }
            return Err(e);
        }
        Ok(match self.state.incidents().get(id) {
            Some(i) if i.value.state != IncidentState::Resolved => Requeue::RequeueAfter(INCIDENT_RESYNC_MS),
            _ => Requeue::AwaitChange,
        })
    }

    /// Asks for every unresolved incident (a heartbeat changed something, a provider call
    /// ended).
    pub(super) fn ask_incidents(&mut self) {
        let keys: Vec<Work> = self
            .state
            .incidents()
            .unresolved()
            .map(|i| Work::Incident(i.opened_at_ms, i.id.clone()))
            .collect();
        for k in keys {
            self.ask(k);
        }
    }

    /// Plans and executes one incident until nothing more can happen now.
    fn remediate_one(&mut self, id: &str, jobs: &mut Vec<ProviderJob>) -> Result<(), Error> {
        self.resume_launch(id, jobs)?;
        // A few rounds: executing one action can make the next possible at once.
        for _ in 0..8 {
            let mark = jobs.len();
            match self.remediate_round(id, jobs) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    // The round's record was not committed, so the provider calls it decided
                    // are not made (a launch whose token binding is not stored could never
                    // join) and their progress markers are reset: the next pass decides again.
                    for job in jobs.drain(mark..) {
                        if let Some(p) = self.work.provider_progress.get_mut(id) {
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
    fn remediate_round(&mut self, id: &str, jobs: &mut Vec<ProviderJob>) -> Result<bool, Error> {
        let now = self.now();
        // Planned from the stored record; copied only when there is something to do (most
        // passes plan nothing for most incidents).
        let (plan, mut incident) = {
            let Some(incident) = self.state.incidents().get(id).map(|v| &v.value) else { return Ok(false) };
            // The pool's storm-breaker counts, kept between passes and worked out again only
            // after something they count changed (`Cluster::breaker_counts`): incidents that
            // wait (most of them, most of the time) do not walk every host on every tick.
            let c = match self.work.breaker_counts.get(&incident.pool) {
                Some(c) => {
                    debug_assert_eq!(*c, self.pool_counts(&incident.pool), "stale breaker counts");
                    *c
                }
                None => {
                    let c = self.pool_counts(&incident.pool);
                    self.work.breaker_counts.insert(incident.pool.clone(), c);
                    c
                }
            };
            let Some(world) = self.world_of(incident, c) else { return Ok(false) };
            let Some(pool) = self.state.pools().get(&incident.pool).map(|p| &p.value) else {
                return Ok(false);
            };
            let plan = remediation::plan(incident, &world, &pool.remediation_policy, pool.mode, now);
            if plan.actions.is_empty() {
                return Ok(false);
            }
            (plan, incident.clone())
        };
        self.work.breaker_counts.remove(&incident.pool);
        self.note_affected(&mut incident);
        for planned in &plan.actions {
            let moved = self.execute(&mut incident, &planned.action, jobs)?;
            remediation::record(&mut incident, planned, now);
            if planned.action == Action::Record(Step::TasksRunningAgain) {
                incident.resumed_at_ms = self.replacements_running_since(&incident);
            }
            // The affected tasks exist once recorded: note where each one went.
            for (old, new, host) in moved {
                incident.set_replacement(old, new, host);
            }
        }
        if incident.state == IncidentState::Resolved {
            incident.resolved_at_ms.get_or_insert(now);
        }
        self.write_incident(incident)?;
        Ok(true)
    }

    /// Lists every live task on the incident's host as affected once the host is being
    /// drained, so the record shows all of them (fenced tasks waiting for termination too),
    /// not only those already moved or stopped.
    fn note_affected(&self, incident: &mut Incident) {
        if !incident.has(Step::Cordoned) {
            return;
        }
        let Some(ix) = self.sched.host(&incident.host_id) else { return };
        for id in self.state.tasks().on_host(ix) {
            if let Some(t) =
                self.state.tasks().get(id).filter(|t| t.task.desired_status != TaskStatus::Stopped)
            {
                incident.note_affected(*id, t.task.group.clone());
            }
        }
    }

    /// After a server restart the provider calls in flight are forgotten: a replacement the
    /// timeline says was requested, and that has not joined, is asked for again (launch is
    /// idempotent by name) with a new registration token (only the token's digest was kept,
    /// so the old one can no longer be handed out; it is superseded).
    fn resume_launch(&mut self, id: &str, jobs: &mut Vec<ProviderJob>) -> Result<(), Error> {
        let Some(i) = self.state.incidents().get(id).map(|v| &v.value) else { return Ok(()) };
        // A token that expired before its machine joined is minted again, and the machine
        // asked for again, once no launch is in flight.
        let expired = i
            .replacement
            .as_ref()
            .is_some_and(|b| b.host_id.is_none() && !b.revoked && self.now() >= b.expires_at_ms);
        let progress = self.work.provider_progress.get(id);
        if (progress.is_some() && !expired)
            || progress.is_some_and(|p| p.launching)
            || !i.has(Step::ReplacementRequested)
            || i.has(Step::ReplacementReady)
            || i.replacement.as_ref().is_some_and(|r| r.host_id.is_some() || r.revoked)
        {
            return Ok(());
        }
        // Copied only when a launch may be asked for again (rare), not at every pass.
        let pool = i.pool.clone();
        if self.provider_for(&pool).is_none() {
            return Ok(());
        }
        let Some(mut i) = self.state.incidents().get(id).map(|v| v.value.clone()) else { return Ok(()) };
        let job = self.mint_replacement(&mut i)?;
        self.write_incident(i)?;
        let p = self.work.provider_progress.entry(id.to_string()).or_default();
        p.launching = true;
        p.launch = None;
        jobs.push(job);
        Ok(())
    }

    /// Mints the one-time registration token of the incident's replacement, binds its digest
    /// to the incident (replacing any earlier one), and returns the launch to request. The
    /// caller writes the incident.
    fn mint_replacement(&mut self, incident: &mut Incident) -> Result<ProviderJob, Error> {
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
        self.launch_asked(&pool, &name);
        incident.replacement = Some(ReplacementBinding {
            name: name.clone(),
            token_sha256: digest.clone(),
            earlier_token_sha256: earlier,
            expires_at_ms: self.now() + REPLACEMENT_TOKEN_TTL_MS,
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

    /// The incident whose unspent replacement token has this digest: `Ok(None)` when the digest
    /// is no replacement token at all; an error naming why when it was one and is not usable.
    pub(super) fn replacement_incident(&self, digest: &str) -> Result<Option<String>, Error> {
        let Some(id) = self.state.replacement_tokens().get(digest) else { return Ok(None) };
        let Some(i) = self.state.incidents().get(id).map(|v| &v.value) else { return Ok(None) };
        let Some(b) = i.replacement.as_ref().filter(|_| i.has_replacement_token(digest)) else {
            return Ok(None);
        };
        if b.host_id.is_some() {
            return Err(Error::Unauthorized("this replacement token was already used"));
        }
        if b.revoked || i.state == IncidentState::Resolved {
            return Err(Error::Unauthorized("this replacement token was revoked: its incident ended"));
        }
        if self.now() >= b.expires_at_ms {
            return Err(Error::Unauthorized("this replacement token has expired"));
        }
        Ok(Some(id.clone()))
    }

    /// Binds a host that registered with the incident's replacement token: it becomes the
    /// replacement, and the token is spent. Returns the updated incident for the caller to
    /// commit with the host.
    pub(super) fn bind_replacement(
        &self,
        incident: &str,
        host: &HostId,
        pool: &PoolName,
    ) -> Result<Option<Incident>, Error> {
        let Some(mut i) = self.state.incidents().get(incident).map(|v| v.value.clone()) else {
            return Ok(None);
        };
        if &i.pool != pool {
            return Err(Error::invalid(
                "pool",
                format!(
                    "a replacement token joins pool {}, the pool of incident {}, not {pool}",
                    i.pool, i.id
                ),
            ));
        }
        let Some(b) = i.replacement.as_mut() else { return Ok(None) };
        b.host_id = Some(host.clone());
        Ok(Some(i))
    }

    /// Applies an incident whose replacement host was committed with it: the token is spent.
    pub(super) fn apply_replacement_binding(&mut self, incident: Incident, rev: Revision) {
        if let Some(b) = &incident.replacement {
            // The digest stays indexed while the incident is kept, so a reuse is refused as
            // such ("already used") rather than as an unknown token.
            tracing::info!(incident.id = %incident.id, host.id = ?b.host_id, "replacement host registered with its token");
        }
        self.apply(rev, Change::Incident(Box::new(incident)));
    }

    /// Keeps the server's evaluation of a host; a new verdict drops the storm breaker's counts,
    /// which count verdicts.
    pub(super) fn set_evaluation(&mut self, ix: HostIx, health: mpsfleet_core::health::HostHealth) {
        if health.verdict != self.state.hosts()[ix as usize].health.verdict {
            self.work.breaker_counts.clear();
        }
        self.state.host_mut(ix).health = health;
    }

    /// The storm breaker's view of a pool: hosts that are ACTIVE or DRAINING, less the
    /// replacements of unresolved incidents (so that joining replacements do not dilute the
    /// share). A host is unhealthy while its health is not, and while an incident about it is
    /// unresolved: a host being drained still counts, so a correlated failure declared host by
    /// host cannot slip past the breaker one incident at a time.
    pub(super) fn pool_counts(&self, pool: &PoolName) -> PoolCounts {
        let open: Vec<&Incident> = self.state.incidents().unresolved().filter(|i| &i.pool == pool).collect();
        let replacements: BTreeSet<&HostId> =
            open.iter().filter_map(|i| i.replacement.as_ref().and_then(|r| r.host_id.as_ref())).collect();
        // A host an operator drained on purpose (maintenance) is not a failure the breaker
        // should count; one that is also unhealthy still counts through its verdict.
        let in_incident: BTreeSet<&HostId> = open
            .iter()
            .filter(|i| i.operator_requested != Some(OperatorAction::Drain))
            .map(|i| &i.host_id)
            .collect();
        let mut c = PoolCounts::default();
        for h in self.state.hosts() {
            if &h.host().pool != pool
                || !matches!(h.host().status, HostStatus::Active | HostStatus::Draining)
                || replacements.contains(&h.host().id)
            {
                continue;
            }
            c.total += 1;
            if !matches!(h.health.verdict, Verdict::Healthy) || in_incident.contains(&h.host().id) {
                c.unhealthy += 1;
            }
        }
        c
    }

    /// What the planner needs to know about an incident's host, pool, tasks and provider.
    fn world_of(&self, incident: &Incident, counts: PoolCounts) -> Option<WorldView> {
        let ix = self.sched.host(&incident.host_id)?;
        let e = &self.state.hosts()[ix as usize];
        let mut open: Vec<&Incident> = self
            .state
            .incidents()
            .unresolved()
            .filter(|i| i.pool == incident.pool)
            .filter(|i| i.id == incident.id || i.operator_requested != Some(OperatorAction::Drain))
            .collect();
        // Earliest opened first; incidents opened in the same millisecond by their hosts'
        // registration order (not by their random ids), so the ranking is reproducible.
        let seq_of = |i: &Incident| {
            self.sched.host(&i.host_id).map_or(u64::MAX, |x| self.state.hosts()[x as usize].host().seq)
        };
        open.sort_by_cached_key(|&i| (i.opened_at_ms, seq_of(i), i.id.as_str()));
        let rank = open.iter().position(|i| i.id == incident.id).unwrap_or(0) as u32;
        let in_flight = open
            .iter()
            .filter(|i| {
                i.id != incident.id && i.has(Step::ReplacementRequested) && !i.has(Step::ReplacementReady)
            })
            .count() as u32;
        let recent: Vec<u64> = self.state.incidents().replacement_requests(&incident.pool).collect();
        let pool = self.state.pools().get(&incident.pool)?;
        let grace = pool.value.health_policy.agent_heartbeat_grace_ms;
        let now = self.now();
        let agent_reachable = e.last_heartbeat_ms.is_some_and(|t| now.saturating_sub(t) <= grace)
            && e.host().status != HostStatus::Deregistered;
        // The host's live tasks (stopped ones matter to no step), from its own index rather than
        // a scan of every task record.
        let tasks: Vec<HostTask> = self
            .state
            .tasks()
            .on_host(ix)
            .iter()
            .filter_map(|id| self.state.tasks().get(id))
            .map(|t| HostTask {
                id: t.task.id,
                // A DAEMON service's task belongs to its host: it is not moved elsewhere (the
                // service starts one on the replacement once that is ACTIVE).
                owner: match t.task.group.as_ref().map(|g| (g, self.state.services().get(g))) {
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
        let progress = self.work.provider_progress.get(&incident.id).cloned().unwrap_or_default();
        // Only the host that registered with this incident's token is its replacement.
        let joined = incident
            .replacement
            .as_ref()
            .and_then(|r| r.host_id.as_ref())
            .and_then(|id| self.sched.host(id))
            .map(|x| &self.state.hosts()[x as usize])
            .filter(|h| h.host().pool == incident.pool)
            .filter(|h| h.host().status == HostStatus::Active && h.host().health_status == HealthStatus::Ok);
        // A launch whose host has not joined within the provider's `launchTimeoutSeconds`
        // counts as failed (a host that joins later still becomes the replacement).
        let timeout_ms = self
            .state
            .pools()
            .get(&incident.pool)
            .and_then(|p| mpsfleet_core::bounds::launch_timeout_ms(&p.value));
        let overdue = incident
            .first(Step::ReplacementRequested)
            .zip(timeout_ms)
            .filter(|&(at, t)| self.now().saturating_sub(at) > t);
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
            (None, None)
                if incident.has(Step::ReplacementRequested) && !self.has_provider(&incident.pool) =>
            {
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
        let replacement_tasks = incident
            .affected_tasks
            .iter()
            .filter_map(|a| a.replacement)
            // A replacement counts as RUNNING once it is also ready (its readiness check
            // passes, where it declares one): that is when the work has resumed.
            .filter_map(|r| self.state.tasks().get(&r).map(|e| (r, &e.task)))
            .map(|(r, t)| match t.last_status {
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
        &mut self,
        incident: &mut Incident,
        action: &Action,
        jobs: &mut Vec<ProviderJob>,
    ) -> Result<Moved, Error> {
        let Some(ix) = self.sched.host(&incident.host_id) else { return Ok(Vec::new()) };
        let mut moved = Vec::new();
        match action {
            Action::Record(_) | Action::Resolve | Action::Block { .. } => {}
            Action::Cordon => {
                let mut h = self.state.hosts()[ix as usize].host().clone();
                h.cordoned = true;
                self.write_host(ix, h)?;
            }
            Action::MarkDraining => {
                let mut h = self.state.hosts()[ix as usize].host().clone();
                match host_lifecycle::apply(&mut h, host_lifecycle::Event::Drain) {
                    Ok(_) => self.write_host(ix, h)?,
                    // A host already gone is not drained again.
                    Err(e) => tracing::warn!(host.id = %h.id, "not drained: {e}"),
                }
            }
            Action::RequestReplacement => match self.provider_for(&incident.pool.clone()) {
                Some(_) => {
                    let job = self.mint_replacement(incident)?;
                    self.work.provider_progress.entry(incident.id.clone()).or_default().launching = true;
                    jobs.push(job);
                }
                None => {
                    self.work.provider_progress.entry(incident.id.clone()).or_default().launch =
                        Some(Err("the pool has no capacity provider".into()));
                }
            },
            Action::StartReplacements { tasks } => moved = self.move_tasks(ix, tasks, &incident.id)?,
            Action::StopStandalone { task_ids, stop_code } => {
                let gone = self.state.hosts()[ix as usize].host().status == HostStatus::Deregistered;
                let reason = match stop_code {
                    StopCode::HostDrained => {
                        format!("host {} drained by operator (incident {})", incident.host_id, incident.id)
                    }
                    _ => format!("host {} was replaced (incident {})", incident.host_id, incident.id),
                };
                let stopped: Vec<Task> = task_ids
                    .iter()
                    .filter_map(|id| self.state.tasks().get(id))
                    .map(|e| self.forced_stop(&e.task, *stop_code, &reason, gone))
                    .collect();
                self.writing(|w| w.write_tasks(stopped))?;
            }
            Action::TerminateOldHost => {
                if self.provider_for(&incident.pool.clone()).is_some() {
                    self.work.provider_progress.entry(incident.id.clone()).or_default().terminating = true;
                    jobs.push(ProviderJob::Terminate {
                        incident: incident.id.clone(),
                        pool: incident.pool.clone(),
                        name: self.state.hosts()[ix as usize].host().hostname.clone(),
                    });
                } else {
                    // Without a provider nothing can confirm the machine is gone, so nothing
                    // is moved on the strength of it: the termination counts as failed (asked
                    // again after a backoff) until the operator removes the machine and
                    // resolves the incident.
                    let now = self.now();
                    let p = self.work.provider_progress.entry(incident.id.clone()).or_default();
                    p.terminate = Some(Err("the pool has no capacity provider to terminate the host".into()));
                    p.terminate_failures += 1;
                    p.terminate_retry_at_ms =
                        now + TERMINATE_RETRY.backoff_after(p.terminate_failures).as_millis() as u64;
                }
            }
        }
        Ok(moved)
    }

    /// A stop that does not wait for an agent that will never answer.
    fn forced_stop(&self, task: &Task, code: StopCode, reason: &str, host_gone: bool) -> Task {
        let mut t = self.reader().stopped_record(task, code, reason);
        if host_gone && t.last_status != TaskStatus::Stopped {
            force_stop(&mut t);
            t.stopped_at_ms = Some(self.now());
        }
        t
    }

    /// Moves service tasks off a host in one commit: each old copy is stopped
    /// (`HostReplaced`) and a new task of its service is created and placed elsewhere.
    fn move_tasks(&mut self, ix: HostIx, moves: &[MoveTask], incident: &str) -> Result<Moved, Error> {
        let gone = self.state.hosts()[ix as usize].host().status == HostStatus::Deregistered;
        let host_id = self.state.hosts()[ix as usize].host().id.clone();
        let reason = format!("moved off host {host_id} (incident {incident})");
        let mut batch = Batch::default();
        let mut stops = Vec::new();
        let mut pairs = Vec::new();
        // Copies already named as some moved task's replacement.
        let mut taken: BTreeSet<TaskId> = self
            .state
            .incidents()
            .get(incident)
            .map(|i| i.value.affected_tasks.iter().filter_map(|a| a.replacement).collect())
            .unwrap_or_default();
        // Copies started since the failure's first signal can stand in for a moved task.
        let since = self.state.incidents().get(incident).map_or(u64::MAX, |i| {
            let t = i.value.timing();
            t.first_failure_at_ms.or(t.detected_at_ms).unwrap_or(u64::MAX)
        });
        // An operator's drain is planned: a replica in traffic on a host that still answers
        // leaves traffic for its service's delay before it stops (`planned_stop`), while its
        // replacement starts elsewhere. A failure's move stops at once.
        let planned = !gone
            && (self.state.incidents().get(incident))
                .is_some_and(|i| i.value.operator_requested == Some(OperatorAction::Drain));
        let now = self.now();
        for m in moves {
            let Some(old) = self.state.tasks().get(&m.task_id).map(|e| e.task.clone()) else { continue };
            let Some(svc) = self.state.services().get(&m.service).map(|s| s.value.clone()) else { continue };
            let stopped = if planned {
                let delay = svc.deregistration_delay_seconds;
                self.reader().planned_stop(&old, delay, StopCode::HostReplaced, &reason, now)
            } else {
                self.forced_stop(&old, StopCode::HostReplaced, &reason, gone)
            };
            let version = self.state.tasks().get(&old.id).map_or(0, |e| e.version);
            batch.ops.push(Op::put_json(TASK, old.id.to_string(), &stopped, Precondition::Version(version))?);
            stops.push(stopped);
            // A `restart` service that started a copy elsewhere once this task's daemon failed
            // gets no second one: the old copy stops, and that copy is its replacement.
            if let Some((copy, host)) = self.early_copy(&svc, &old, &taken, since) {
                taken.insert(copy);
                pairs.push((old.id, copy, host));
                continue;
            }
            let spec = services::tasks_of(&svc);
            let before = batch.created.len();
            if let Err(e) = self.writer().create_tasks(&spec, 1, &mut batch) {
                self.writer().rollback(&batch);
                return Err(e);
            }
            if let Some((new, _, _)) = batch.created.get(before) {
                pairs.push((old.id, new.id, new.host_id.clone()));
            }
        }
        let rev = match self.commit(&batch.ops) {
            Ok(rev) => rev,
            Err(e) => {
                self.writer().rollback(&batch);
                return Err(e);
            }
        };
        for t in stops {
            // Its service stops a replica leaving traffic once its delay is over.
            if let Some(g) = t.group.as_ref().filter(|_| t.draining.is_some()) {
                self.ask(Work::Service(g.clone()));
            }
            self.writer().apply_task_update(t, rev)?;
        }
        for (task, placement, _) in batch.created {
            self.writer().insert_task(task, rev, placement, true);
        }
        self.tell_services_of_moves(&pairs, moves, &host_id, incident)?;
        Ok(pairs)
    }

    /// Each service whose tasks an incident moved says so in its events: which task went
    /// where, and why (the service's describe shows a move it did not make itself).
    fn tell_services_of_moves(
        &mut self,
        pairs: &Moved,
        moves: &[MoveTask],
        from: &HostId,
        incident: &str,
    ) -> Result<(), Error> {
        let mut by_service: BTreeMap<ServiceName, Vec<String>> = BTreeMap::new();
        for (old, new, host) in pairs {
            let Some(m) = moves.iter().find(|m| m.task_id == *old) else { continue };
            let to =
                host.as_ref().map_or_else(|| "waiting for a host".to_string(), |h| format!("on host {h}"));
            by_service.entry(m.service.clone()).or_default().push(format!("{old} -> {new} ({to})"));
        }
        let now = self.now();
        for (name, words) in by_service {
            let Some(mut svc) = self.state.services().get(&name).map(|s| s.value.clone()) else { continue };
            let msg = format!(
                "incident {incident} moved {} task(s) off host {from}: {}",
                words.len(),
                words.join(", ")
            );
            svc.events.push(now, ObjectEvent::new("TasksMovedByIncident", msg));
            self.writing(|w| controllers::services::write_service(w, svc))?;
        }
        Ok(())
    }

    /// When the last replacement of the incident's moved service tasks started RUNNING, when
    /// every one has (None when one has not, or none was started).
    fn replacements_running_since(&self, incident: &Incident) -> Option<u64> {
        let mut last = None;
        for a in incident.affected_tasks.iter().filter(|a| a.service.is_some() && !a.waiting) {
            let t = &self.state.tasks().get(&a.replacement?)?.task;
            last = last.max(Some(t.started_at_ms?));
        }
        last
    }

    /// The copy a `restart` service already started elsewhere for `old` (on a daemon whose
    /// failure was confirmed): when the service's counted replicas, `old` left out, already
    /// make its desired count, the newest of them created `since` the failure's first signal,
    /// not on `old`'s host and not yet named as a replacement.
    fn early_copy(
        &self,
        svc: &Service,
        old: &Task,
        taken: &BTreeSet<TaskId>,
        since: u64,
    ) -> Option<(TaskId, Option<HostId>)> {
        if svc.resumption != ResumptionBoundary::Restart {
            return None;
        }
        let counted: Vec<&Task> = self
            .state
            .tasks()
            .of_service(&svc.name)
            .iter()
            .filter_map(|id| self.state.tasks().get(id))
            .map(|e| &e.task)
            .filter(|t| {
                t.id != old.id && t.desired_status != TaskStatus::Stopped && !self.reader().at_risk(t)
            })
            .collect();
        if (counted.len() as u32) < svc.desired_count {
            return None;
        }
        counted
            .into_iter()
            .filter(|t| t.host_id != old.host_id && !taken.contains(&t.id) && t.created_at_ms >= since)
            .max_by_key(|t| (t.created_at_ms, t.id))
            .map(|t| (t.id, t.host_id.clone()))
    }

    /// The host leaves the fleet: DEREGISTERED, unschedulable, and what still ran there is
    /// recorded as stopped (the machine is gone).
    pub(super) fn deregister(&mut self, ix: HostIx, reason: &str) -> Result<(), Error> {
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if h.status == HostStatus::Deregistered {
            return Ok(());
        }
        host_lifecycle::apply(&mut h, host_lifecycle::Event::Deregister)
            .map_err(|e| Error::Conflict(format!("host {}: {e}", h.id)))?;
        // Its GPUs and credential leave the indexes with the record (`State::apply`).
        self.write_host(ix, h)?;
        let ids: Vec<TaskId> = self.state.tasks().on_host(ix).iter().copied().collect();
        let stopped: Vec<Task> = ids
            .iter()
            .filter_map(|id| self.state.tasks().get(id))
            .filter(|e| e.task.desired_status == TaskStatus::Stopped)
            .map(|e| self.forced_stop(&e.task, StopCode::HostReplaced, reason, true))
            .collect();
        self.writing(|w| w.write_tasks(stopped))
    }

    /// A provider call failed and will be tried again after `failed.backoff_ms`: noted on the
    /// incident's timeline (and so announced as an event) before the wait, so a slow or failing
    /// provider shows while it happens. Calls that keep the pool at its size have no incident;
    /// they are only logged.
    pub fn provider_attempt_failed(
        &mut self,
        job: &ProviderJob,
        failed: &AttemptRecord,
    ) -> Result<(), Error> {
        let (op, incident, name) = match job {
            ProviderJob::Launch { incident, name, .. } => ("launch", incident, name),
            ProviderJob::Terminate { incident, name, .. } => ("terminate", incident, name),
        };
        let retry_in = failed.backoff_ms.map_or_else(
            || "no further attempt".to_string(),
            |ms| format!("next attempt in {}", mpsfleet_core::health::fmt_ms(ms)),
        );
        let detail = format!("{op} {name}: attempt {} failed: {}; {retry_in}", failed.attempt, failed.error);
        tracing::warn!(%incident, "{detail}");
        let Some(mut i) = self.state.incidents().get(incident.as_str()).map(|v| v.value.clone()) else {
            return Ok(());
        };
        i.push(self.now(), Step::ProviderRetry, detail, None);
        self.write_incident(i)
    }

    /// A provider call finished; the incident moves on at the next remediation.
    pub fn provider_done(
        &mut self,
        job: &ProviderJob,
        outcome: ProviderOutcome,
    ) -> Result<Vec<ProviderJob>, Error> {
        let result = match outcome {
            ProviderOutcome::Done => Ok(()),
            ProviderOutcome::Failed(reason) => Err(reason),
        };
        let pool = match job {
            ProviderJob::Launch { pool, .. } | ProviderJob::Terminate { pool, .. } => pool,
        };
        self.ask_capacity(pool);
        match job {
            // A launch to keep the pool at its size (no incident).
            ProviderJob::Launch { incident, pool, name, .. } if incident.is_empty() => {
                // A launched host stays in flight until it registers; a failed one is retried.
                if let Err(reason) = result {
                    if let Some(l) = self.work.capacity_launches.get_mut(pool) {
                        l.remove(name);
                    }
                    self.creds.launch_tokens.retain(|_, (p, n)| !(p == pool && n == name));
                    tracing::error!(pool = %pool, host = %name, %reason, "could not launch a host");
                }
            }
            ProviderJob::Launch { incident, pool, name, .. } => {
                let p = self.work.provider_progress.entry(incident.clone()).or_default();
                p.launching = false;
                let launched = result.is_ok();
                p.launch = Some(result);
                // The incident ended while the launch was in flight: the replacement was
                // cancelled (its token revoked), so the machine the provider made goes again.
                let cancelled = self
                    .state
                    .incidents()
                    .get(incident)
                    .and_then(|i| i.value.replacement.as_ref())
                    .is_some_and(|b| b.revoked && b.host_id.is_none());
                if launched && cancelled {
                    self.work.pending_jobs.push(ProviderJob::Terminate {
                        incident: incident.clone(),
                        pool: pool.clone(),
                        name: name.clone(),
                    });
                }
            }
            // A host scaled in (no incident): it is deregistered already.
            ProviderJob::Terminate { incident, pool, name } if incident.is_empty() => {
                if let Err(reason) = result {
                    let msg =
                        format!("could not terminate scaled-in host {name}: {reason}; terminate it by hand");
                    tracing::error!(pool = %pool, host = %name, %reason, "could not terminate a scaled-in host");
                    self.writing(|w| w.pool_event(pool, "ScaleInTerminateFailed", msg))?;
                }
            }
            ProviderJob::Terminate { incident, name, .. } => {
                let cancelled_replacement = self
                    .state
                    .incidents()
                    .get(incident)
                    .and_then(|i| i.value.replacement.as_ref())
                    .is_some_and(|b| &b.name == name && b.revoked);
                if cancelled_replacement {
                    match &result {
                        Ok(()) => tracing::info!(%incident, host = %name, "cancelled replacement terminated"),
                        Err(reason) => {
                            tracing::error!(%incident, host = %name, %reason, "could not terminate a cancelled replacement; terminate it by hand")
                        }
                    }
                    self.ask_incidents();
                    return Ok(Vec::new());
                }
                let now = self.now();
                let p = self.work.provider_progress.entry(incident.clone()).or_default();
                p.terminating = false;
                p.terminate = Some(result.clone());
                if let Err(reason) = &result {
                    p.terminate_failures += 1;
                    let backoff = TERMINATE_RETRY.backoff_after(p.terminate_failures).as_millis() as u64;
                    p.terminate_retry_at_ms = now + backoff;
                    let detail = format!(
                        "terminate {name} failed: {reason}; asked again in {}",
                        mpsfleet_core::health::fmt_ms(backoff)
                    );
                    if let Some(mut i) =
                        self.state.incidents().get(incident.as_str()).map(|v| v.value.clone())
                    {
                        i.push(now, Step::ProviderRetry, detail, None);
                        self.write_incident(i)?;
                    }
                } else {
                    p.terminate_failures = 0;
                }
                if result.is_ok() {
                    if let Some(host) = self.state.incidents().get(incident).map(|i| i.value.host_id.clone())
                    {
                        // Only the machine the job named: a termination of another (a cancelled
                        // replacement) never deregisters the incident's host.
                        let named = self
                            .sched
                            .host(&host)
                            .filter(|&ix| &self.state.hosts()[ix as usize].host().hostname == name);
                        if let Some(ix) = named {
                            self.deregister(ix, "the provider terminated the host")?;
                        }
                    }
                }
            }
        }
        self.ask_incidents();
        Ok(Vec::new())
    }
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

/// The name the replacement host of an incident joins under (deterministic, so a restarted
/// server recognises it).
pub fn replacement_name(incident: &Incident) -> String {
    format!("{}-r", incident.id)
}
