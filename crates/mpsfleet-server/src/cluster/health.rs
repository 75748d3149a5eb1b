//! Host health and incidents in the server: evaluates each host's checks on every heartbeat
//! and on a tick, takes impaired hosts out of placement at once, opens an incident when a
//! host is declared bad, and drives each incident with the pure planner of
//! `mpsfleet_core::remediation`, executing its actions and recording them.
//!
//! Capacity provider calls (launch, terminate) are slow and run outside the cluster lock:
//! the planner's actions are turned into [`ProviderJob`]s that the caller runs and reports
//! back with [`Cluster::provider_done`].

use super::*;
use crate::provider::AttemptRecord;
use mpsfleet_core::health::{evaluate, HealthInput, Verdict};
use mpsfleet_core::remediation::{
    self, Action, HostState, HostTask, MoveTask, PoolView, ReplacementState, TaskOwner, TerminationState,
    WorldView,
};

pub(super) const INCIDENT: &str = "incident";

/// Tasks moved off a host: the old copy, its replacement, and where that was placed.
type Moved = Vec<(TaskId, TaskId, Option<HostId>)>;

/// A provider call the remediation wants made, outside the cluster lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderJob {
    Launch { incident: String, pool: PoolName, name: String },
    Terminate { incident: String, pool: PoolName, name: String },
}

/// A pool's hosts as the storm breaker counts them (see `Cluster::pool_counts`).
#[derive(Debug, Clone, Copy, Default)]
struct PoolCounts {
    total: u32,
    unhealthy: u32,
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
}

impl Cluster {
    pub(super) fn load_incidents(&mut self) -> Result<(), ApiError> {
        for r in self.store.list(INCIDENT)? {
            let i: Incident = decode(&r)?;
            self.incidents.insert(i.id.clone(), Versioned { value: i, version: r.version });
        }
        Ok(())
    }

    pub fn incidents(&self) -> Vec<Incident> {
        let mut v: Vec<Incident> = self.incidents.values().map(|v| v.value.clone()).collect();
        v.sort_by(|a, b| (a.opened_at_ms, &a.id).cmp(&(b.opened_at_ms, &b.id)));
        v
    }

    pub fn incident(&self, id: &str) -> Result<Incident, ApiError> {
        self.incidents.get(id).map(|v| v.value.clone()).ok_or_else(|| ApiError::not_found("incident", id))
    }

    fn open_incident_of(&self, host: &HostId) -> Option<&Incident> {
        self.incidents
            .values()
            .map(|v| &v.value)
            .find(|i| &i.host_id == host && i.state != IncidentState::Resolved)
    }

    fn write_incident(&mut self, incident: Incident) -> Result<(), ApiError> {
        let expect = match self.incidents.get(&incident.id) {
            Some(v) => Precondition::Version(v.version),
            None => Precondition::Absent,
        };
        let rev = self.commit(&[Op::put_json(INCIDENT, incident.id.clone(), &incident, expect)?])?;
        let old = self.incidents.get(&incident.id).map(|v| (&v.value.state, v.value.timeline.len()));
        self.events.incident(old, &incident, self.now());
        self.incidents.insert(incident.id.clone(), Versioned { value: incident, version: rev });
        Ok(())
    }

    /// Evaluates every host (heartbeat grace runs out without any report) and drives every
    /// incident; returns the provider calls to make.
    pub fn health_tick(&mut self) -> Result<Vec<ProviderJob>, ApiError> {
        for ix in 0..self.hosts.len() as HostIx {
            self.evaluate_host(ix)?;
        }
        let mut jobs = self.remediate()?;
        jobs.extend(self.keep_capacity());
        Ok(jobs)
    }

    /// Pools with a provider are kept at their desired host count: hosts the provider runs
    /// (replacements included) count, so a replacement in flight is not launched twice. A
    /// self-managed pool's bad host is not terminated automatically, so this never replaces
    /// one there; it only starts the pool's hosts.
    fn keep_capacity(&mut self) -> Vec<ProviderJob> {
        let pools: Vec<(PoolName, u32)> = self
            .pools
            .values()
            .filter_map(|p| p.value.provider.as_ref().map(|prov| (p.value.name.clone(), prov.desired_hosts)))
            .collect();
        let mut jobs = Vec::new();
        for (pool, desired) in pools {
            if self.provider_for(&pool).is_none() {
                continue;
            }
            // A launched host counts as in flight until it registers.
            let registered: BTreeSet<String> = self.hosts.iter().map(|h| h.host.hostname.clone()).collect();
            if let Some(l) = self.capacity_launches.get_mut(&pool) {
                l.retain(|name| !registered.contains(name));
            }
            // Registered hosts (from the store, so this survives a restart), launches in flight,
            // and replacements requested by incidents that have not joined yet.
            let live = self
                .hosts
                .iter()
                .filter(|h| h.host.pool == pool && h.host.status != HostStatus::Deregistered)
                .count();
            let in_flight = self.capacity_launches.get(&pool).map_or(0, |l| l.len());
            let replacing = self
                .incidents
                .values()
                .filter(|i| i.value.pool == pool && i.value.state != IncidentState::Resolved)
                .filter(|i| i.value.has(Step::ReplacementRequested) && !i.value.has(Step::ReplacementReady))
                .count();
            let mut missing = (desired as usize).saturating_sub(live + in_flight + replacing);
            let mut k = 0;
            while missing > 0 {
                let name = format!("{pool}-{k}");
                k += 1;
                let taken = self.hosts.iter().any(|h| h.host.hostname == name)
                    || self.capacity_launches.get(&pool).is_some_and(|l| l.contains(&name));
                if taken {
                    continue;
                }
                self.capacity_launches.entry(pool.clone()).or_default().insert(name.clone());
                jobs.push(ProviderJob::Launch { incident: String::new(), pool: pool.clone(), name });
                missing -= 1;
            }
        }
        jobs
    }

    /// What the health of an ACTIVE or DRAINING host comes to with these checks and last
    /// heartbeat; `None` for a host that is not evaluated (other statuses, or no pool).
    pub(super) fn assess_host(
        &self,
        ix: HostIx,
        checks: &[HostCheck],
        last_heartbeat_ms: Option<u64>,
        now: u64,
    ) -> Option<mpsfleet_core::health::HostHealth> {
        let e = &self.hosts[ix as usize];
        if !matches!(e.host.status, HostStatus::Active | HostStatus::Draining) {
            return None;
        }
        let policy = &self.pools.get(&e.host.pool)?.value.health_policy;
        let registered_at_ms = e.host.registered_at_ms.max(self.loaded_at_ms);
        let input = HealthInput { checks, last_heartbeat_ms, registered_at_ms };
        Some(evaluate(&e.health, &input, policy, now))
    }

    /// Whether evaluating the host again, with the report and heartbeat it was last evaluated
    /// from, must give the same health: every check OK and the last heartbeat within the grace
    /// (the only input that moves with time while all is OK).
    pub(super) fn stays_healthy(&self, ix: HostIx, now: u64) -> bool {
        let e = &self.hosts[ix as usize];
        let Some(pool) = self.pools.get(&e.host.pool) else { return false };
        e.health.status == HealthStatus::Ok
            && e.host.health_status == HealthStatus::Ok
            && matches!(e.health.verdict, Verdict::Healthy)
            && matches!(e.host.status, HostStatus::Active | HostStatus::Draining)
            && e.last_heartbeat_ms
                .is_some_and(|t| now.saturating_sub(t) <= pool.value.health_policy.agent_heartbeat_grace_ms)
    }

    /// Re-evaluates one host: a changed health status is written and applied to placement at
    /// once; a host declared bad gets an incident (one per episode).
    pub(super) fn evaluate_host(&mut self, ix: HostIx) -> Result<(), ApiError> {
        let now = self.now();
        let e = &self.hosts[ix as usize];
        if e.evaluated && self.stays_healthy(ix, now) {
            return Ok(());
        }
        let Some(health) = self.assess_host(ix, &e.checks, e.last_heartbeat_ms, now) else { return Ok(()) };
        self.hosts[ix as usize].evaluated = true;
        let e = &self.hosts[ix as usize];
        let changed = health.status != e.host.health_status;
        let verdict = health.verdict.clone();
        self.hosts[ix as usize].health = health;
        if changed {
            let mut h = self.hosts[ix as usize].host.clone();
            tracing::info!(host.id = %h.id, from = h.health_status.as_str(), to = self.hosts[ix as usize].health.status.as_str(), "host health changed");
            h.health_status = self.hosts[ix as usize].health.status;
            self.write_host(ix, h)?;
        }
        if let Verdict::DeclaredBad { trigger, impaired_since_ms } = verdict {
            let host_id = self.hosts[ix as usize].host.id.clone();
            let pool = &self.hosts[ix as usize].host.pool;
            let Some(mode) = self.pools.get(pool).map(|p| p.value.mode) else { return Ok(()) };
            if self.open_incident_of(&host_id).is_none() {
                let id = format!("inc-{:012x}", auth::random_u64()? >> 16);
                let owner = IncidentOwner::for_mode(mode);
                let incident =
                    Incident::open(id, host_id.clone(), pool.clone(), owner, trigger, impaired_since_ms, now);
                tracing::warn!(incident.id = %incident.id, host.id = %host_id, owner = owner.as_str(), "host declared bad");
                self.write_incident(incident)?;
            }
        }
        Ok(())
    }

    /// An operator's `host drain` or `host replace`: recorded on the host's incident (one is
    /// opened if there is none), then the same steps as a managed pool's run.
    pub fn operator_action(&mut self, host: &str, action: OperatorAction) -> Result<Incident, ApiError> {
        let ix = self.host_ix(host)?;
        let h = self.hosts[ix as usize].host.clone();
        if h.status == HostStatus::Deregistered {
            return Err(ApiError::Conflict(format!("host {} is already deregistered", h.id)));
        }
        let now = self.now();
        let mut incident = match self.open_incident_of(&h.id) {
            Some(i) => i.clone(),
            None => {
                let owner = self
                    .pools
                    .get(&h.pool)
                    .map_or(IncidentOwner::Operator, |p| IncidentOwner::for_mode(p.value.mode));
                let trigger = Trigger {
                    check: "OPERATOR".into(),
                    gpu_id: None,
                    reason: format!("operator asked to {} the host", action.as_str()),
                    evidence: String::new(),
                    first_failure_at_ms: None,
                };
                Incident::open(
                    format!("inc-{:012x}", auth::random_u64()? >> 16),
                    h.id.clone(),
                    h.pool.clone(),
                    owner,
                    trigger,
                    now,
                    now,
                )
            }
        };
        incident.operator_requested = Some(action);
        // A failed replacement is tried again on an explicit `replace`.
        if action == OperatorAction::Replace {
            if let Some(p) = self.provider_progress.get_mut(&incident.id) {
                if matches!(p.launch, Some(Err(_))) {
                    p.launch = None;
                }
            }
        }
        let id = incident.id.clone();
        self.write_incident(incident)?;
        let jobs = self.remediate()?;
        self.pending_jobs.extend(jobs);
        self.incident(&id)
    }

    /// Plans and executes every unresolved incident until nothing more can happen now.
    pub fn remediate(&mut self) -> Result<Vec<ProviderJob>, ApiError> {
        let mut jobs = Vec::new();
        // Unresolved incidents, earliest opened first (the same order as `incidents()`, without
        // cloning the history of resolved ones).
        let mut open: Vec<(u64, String)> = self
            .incidents
            .values()
            .filter(|v| v.value.state != IncidentState::Resolved)
            .map(|v| (v.value.opened_at_ms, v.value.id.clone()))
            .collect();
        open.sort();
        // Each pool's storm-breaker counts, worked out once per pool and again only after an
        // incident of that pool acted: incidents that wait (most of them, most of the time) do
        // not each walk every host of the pool on every tick.
        let mut counts: BTreeMap<PoolName, PoolCounts> = BTreeMap::new();
        for (_, id) in open {
            self.resume_launch(&id, &mut jobs);
            // A few rounds: executing one action can make the next possible at once.
            for _ in 0..8 {
                let Some(incident) = self.incidents.get(&id).map(|v| v.value.clone()) else { break };
                let c = match counts.get(&incident.pool) {
                    Some(c) => *c,
                    None => {
                        let c = self.pool_counts(&incident.pool);
                        counts.insert(incident.pool.clone(), c);
                        c
                    }
                };
                let Some(world) = self.world_of(&incident, c) else { break };
                let Some(pool) = self.pools.get(&incident.pool).map(|p| p.value.clone()) else { break };
                let now = self.now();
                let plan = remediation::plan(&incident, &world, &pool.remediation_policy, pool.mode, now);
                if plan.actions.is_empty() {
                    break;
                }
                counts.remove(&incident.pool);
                let mut incident = incident;
                for planned in &plan.actions {
                    let moved = self.execute(&mut incident, &planned.action, &mut jobs)?;
                    remediation::record(&mut incident, planned, now);
                    // The affected tasks exist once recorded: note where each one went.
                    for (old, new, host) in moved {
                        incident.set_replacement(old, new, host);
                    }
                }
                if incident.state == IncidentState::Resolved {
                    incident.resolved_at_ms.get_or_insert(now);
                }
                self.write_incident(incident)?;
            }
        }
        Ok(jobs)
    }

    /// After a server restart the provider calls in flight are forgotten: a replacement the
    /// timeline says was requested, and that has not joined, is asked for again (launch is
    /// idempotent by name).
    fn resume_launch(&mut self, id: &str, jobs: &mut Vec<ProviderJob>) {
        let Some(i) = self.incidents.get(id).map(|v| v.value.clone()) else { return };
        if self.provider_progress.contains_key(id)
            || !i.has(Step::ReplacementRequested)
            || i.has(Step::ReplacementReady)
            || self.provider_for(&i.pool).is_none()
        {
            return;
        }
        self.provider_progress.entry(id.to_string()).or_default().launching = true;
        jobs.push(ProviderJob::Launch {
            incident: id.to_string(),
            pool: i.pool.clone(),
            name: replacement_name(&i),
        });
    }

    /// The storm breaker's view of a pool: hosts that are ACTIVE or DRAINING, less the
    /// replacements of unresolved incidents (so that joining replacements do not dilute the
    /// share). A host is unhealthy while its health is not, and while an incident about it is
    /// unresolved: a host being drained still counts, so a correlated failure declared host by
    /// host cannot slip past the breaker one incident at a time.
    fn pool_counts(&self, pool: &PoolName) -> PoolCounts {
        let open = self.incidents.values().map(|v| &v.value);
        let open: Vec<&Incident> =
            open.filter(|i| &i.pool == pool && i.state != IncidentState::Resolved).collect();
        let replacements: BTreeSet<String> = open.iter().map(|i| replacement_name(i)).collect();
        let in_incident: BTreeSet<&HostId> = open.iter().map(|i| &i.host_id).collect();
        let mut c = PoolCounts::default();
        for h in &self.hosts {
            if &h.host.pool != pool
                || !matches!(h.host.status, HostStatus::Active | HostStatus::Draining)
                || replacements.contains(&h.host.hostname)
            {
                continue;
            }
            c.total += 1;
            if !matches!(h.health.verdict, Verdict::Healthy) || in_incident.contains(&h.host.id) {
                c.unhealthy += 1;
            }
        }
        c
    }

    /// What the planner needs to know about an incident's host, pool, tasks and provider.
    fn world_of(&self, incident: &Incident, counts: PoolCounts) -> Option<WorldView> {
        let ix = self.sched.host(&incident.host_id)?;
        let e = &self.hosts[ix as usize];
        let mut open: Vec<&Incident> = self
            .incidents
            .values()
            .map(|v| &v.value)
            .filter(|i| i.pool == incident.pool && i.state != IncidentState::Resolved)
            .collect();
        // Earliest opened first; incidents opened in the same millisecond by their hosts'
        // registration order (not by their random ids), so the ranking is reproducible.
        let seq_of =
            |i: &Incident| self.sched.host(&i.host_id).map_or(u64::MAX, |x| self.hosts[x as usize].host.seq);
        open.sort_by_cached_key(|i| (i.opened_at_ms, seq_of(i), i.id.clone()));
        let rank = open.iter().position(|i| i.id == incident.id).unwrap_or(0) as u32;
        let in_flight = open
            .iter()
            .filter(|i| {
                i.id != incident.id && i.has(Step::ReplacementRequested) && !i.has(Step::ReplacementReady)
            })
            .count() as u32;
        let recent: Vec<u64> = self
            .incidents
            .values()
            .filter(|v| v.value.pool == incident.pool)
            .filter_map(|v| v.value.first(Step::ReplacementRequested).map(|t| t.at_ms))
            .collect();
        let pool = self.pools.get(&incident.pool)?;
        let grace = pool.value.health_policy.agent_heartbeat_grace_ms;
        let now = self.now();
        let agent_reachable = e.last_heartbeat_ms.is_some_and(|t| now.saturating_sub(t) <= grace)
            && e.host.status != HostStatus::Deregistered;
        // The host's live tasks (stopped ones matter to no step), from its own index rather than
        // a scan of every task record.
        let tasks: Vec<HostTask> = e
            .tasks
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .map(|t| HostTask {
                id: t.task.id,
                owner: match &t.task.group {
                    Some(g) => TaskOwner::Service {
                        name: g.clone(),
                        boundary: self.services.get(g).map(|s| s.value.resumption).unwrap_or_default(),
                    },
                    None => TaskOwner::Standalone,
                },
                last_status: t.task.last_status,
                desired_status: t.task.desired_status,
            })
            .collect();
        let progress = self.provider_progress.get(&incident.id).cloned().unwrap_or_default();
        let replacement_name = replacement_name(incident);
        let joined = self
            .hosts
            .iter()
            .find(|h| h.host.hostname == replacement_name && h.host.pool == incident.pool)
            .filter(|h| h.host.status == HostStatus::Active && h.host.health_status == HealthStatus::Ok);
        let replacement = match (joined, &progress.launch) {
            (Some(h), _) => ReplacementState::Ready { host_id: Some(h.host.id.clone()) },
            (None, Some(Err(reason))) => ReplacementState::Failed { reason: reason.clone() },
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
        let termination = if e.host.status == HostStatus::Deregistered {
            TerminationState::Confirmed
        } else if progress.terminating || progress.terminate.is_some() {
            // A failed termination is requested again at the next plan (terminate is idempotent).
            if matches!(progress.terminate, Some(Err(_))) && !progress.terminating {
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
            .filter_map(|r| self.tasks.get(&r).map(|t| (r, t.task.last_status)))
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
                status: e.host.status,
                cordoned: e.host.cordoned,
                healthy: matches!(e.health.verdict, Verdict::Healthy)
                    && e.host.health_status == HealthStatus::Ok,
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
    ) -> Result<Moved, ApiError> {
        let Some(ix) = self.sched.host(&incident.host_id) else { return Ok(Vec::new()) };
        let mut moved = Vec::new();
        match action {
            Action::Record(_) | Action::Resolve | Action::Block { .. } => {}
            Action::Cordon => {
                let mut h = self.hosts[ix as usize].host.clone();
                h.cordoned = true;
                self.write_host(ix, h)?;
            }
            Action::MarkDraining => {
                let mut h = self.hosts[ix as usize].host.clone();
                h.status = HostStatus::Draining;
                self.write_host(ix, h)?;
            }
            Action::RequestReplacement => match self.provider_for(&incident.pool.clone()) {
                Some(_) => {
                    self.provider_progress.entry(incident.id.clone()).or_default().launching = true;
                    jobs.push(ProviderJob::Launch {
                        incident: incident.id.clone(),
                        pool: incident.pool.clone(),
                        name: replacement_name(incident),
                    });
                }
                None => {
                    self.provider_progress.entry(incident.id.clone()).or_default().launch =
                        Some(Err("the pool has no capacity provider".into()));
                }
            },
            Action::StartReplacements { tasks } => moved = self.move_tasks(ix, tasks, &incident.id)?,
            Action::StopStandalone { task_ids, stop_code } => {
                let gone = self.hosts[ix as usize].host.status == HostStatus::Deregistered;
                let reason = format!("host {} was replaced (incident {})", incident.host_id, incident.id);
                let stopped: Vec<Task> = task_ids
                    .iter()
                    .filter_map(|id| self.tasks.get(id))
                    .map(|e| self.forced_stop(&e.task, *stop_code, &reason, gone))
                    .collect();
                self.write_tasks(stopped)?;
            }
            Action::TerminateOldHost => {
                if self.provider_for(&incident.pool.clone()).is_some() {
                    self.provider_progress.entry(incident.id.clone()).or_default().terminating = true;
                    jobs.push(ProviderJob::Terminate {
                        incident: incident.id.clone(),
                        pool: incident.pool.clone(),
                        name: self.hosts[ix as usize].host.hostname.clone(),
                    });
                } else {
                    // Without a provider the operator removes the machine; the host leaves the
                    // fleet's records now so the incident can finish.
                    self.deregister(ix, "no capacity provider: the operator removes the machine")?;
                }
            }
        }
        Ok(moved)
    }

    /// A stop that does not wait for an agent that will never answer.
    fn forced_stop(&self, task: &Task, code: StopCode, reason: &str, host_gone: bool) -> Task {
        let mut t = self.stopped_record(task, code, reason);
        if host_gone && t.last_status != TaskStatus::Stopped {
            t.last_status = TaskStatus::Stopped;
            t.stopped_at_ms = Some(self.now());
        }
        t
    }

    /// Moves service tasks off a host in one commit: each old copy is stopped
    /// (`HostReplaced`) and a new task of its service is created and placed elsewhere.
    fn move_tasks(&mut self, ix: HostIx, moves: &[MoveTask], incident: &str) -> Result<Moved, ApiError> {
        let gone = self.hosts[ix as usize].host.status == HostStatus::Deregistered;
        let host_id = self.hosts[ix as usize].host.id.clone();
        let reason = format!("moved off host {host_id} (incident {incident})");
        let mut batch = Batch::default();
        let mut stops = Vec::new();
        let mut pairs = Vec::new();
        for m in moves {
            let Some(old) = self.tasks.get(&m.task_id).map(|e| e.task.clone()) else { continue };
            let Some(svc) = self.services.get(&m.service).map(|s| s.value.clone()) else { continue };
            let stopped = self.forced_stop(&old, StopCode::HostReplaced, &reason, gone);
            let version = self.tasks.get(&old.id).map_or(0, |e| e.version);
            batch.ops.push(Op::put_json(TASK, old.id.to_string(), &stopped, Precondition::Version(version))?);
            stops.push(stopped);
            let spec = NewTasks {
                task_definition: svc.task_definition.clone(),
                pool: svc.pool.clone(),
                group: Some(svc.name.clone()),
                started_by: format!("service:{}", svc.name),
            };
            let before = batch.created.len();
            if let Err(e) = self.create_tasks(&spec, 1, &mut batch) {
                self.rollback(&batch);
                return Err(e);
            }
            if let Some((new, _, _)) = batch.created.get(before) {
                pairs.push((old.id, new.id, new.host_id.clone()));
            }
        }
        let rev = match self.commit(&batch.ops) {
            Ok(rev) => rev,
            Err(e) => {
                self.rollback(&batch);
                return Err(e);
            }
        };
        for t in stops {
            self.apply_task_update(t, rev)?;
        }
        for (task, placement, _) in batch.created {
            self.insert_task(task, rev, placement);
        }
        Ok(pairs)
    }

    /// The host leaves the fleet: DEREGISTERED, unschedulable, and what still ran there is
    /// recorded as stopped (the machine is gone).
    fn deregister(&mut self, ix: HostIx, reason: &str) -> Result<(), ApiError> {
        let mut h = self.hosts[ix as usize].host.clone();
        if h.status == HostStatus::Deregistered {
            return Ok(());
        }
        h.status = HostStatus::Deregistered;
        self.write_host(ix, h)?;
        let ids: Vec<TaskId> = self.hosts[ix as usize].tasks.iter().copied().collect();
        let stopped: Vec<Task> = ids
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .filter(|e| e.task.desired_status == TaskStatus::Stopped)
            .map(|e| self.forced_stop(&e.task, StopCode::HostReplaced, reason, true))
            .collect();
        self.write_tasks(stopped)
    }

    /// A provider call failed and will be tried again after `failed.backoff_ms`: noted on the
    /// incident's timeline (and so announced as an event) before the wait, so a slow or failing
    /// provider shows while it happens. Calls that keep the pool at its size have no incident;
    /// they are only logged.
    pub fn provider_attempt_failed(
        &mut self,
        job: &ProviderJob,
        failed: &AttemptRecord,
    ) -> Result<(), ApiError> {
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
        let Some(mut i) = self.incidents.get(incident.as_str()).map(|v| v.value.clone()) else {
            return Ok(());
        };
        i.timeline.push(TimelineEntry { at_ms: self.now(), step: Step::ProviderRetry, detail });
        self.write_incident(i)
    }

    /// A provider call finished; the incident moves on at the next remediation.
    pub fn provider_done(
        &mut self,
        job: &ProviderJob,
        outcome: ProviderOutcome,
    ) -> Result<Vec<ProviderJob>, ApiError> {
        let result = match outcome {
            ProviderOutcome::Done => Ok(()),
            ProviderOutcome::Failed(reason) => Err(reason),
        };
        match job {
            // A launch to keep the pool at its size (no incident).
            ProviderJob::Launch { incident, pool, name } if incident.is_empty() => {
                // A launched host stays in flight until it registers; a failed one is retried.
                if let Err(reason) = result {
                    if let Some(l) = self.capacity_launches.get_mut(pool) {
                        l.remove(name);
                    }
                    tracing::error!(pool = %pool, host = %name, %reason, "could not launch a host");
                }
            }
            ProviderJob::Launch { incident, .. } => {
                let p = self.provider_progress.entry(incident.clone()).or_default();
                p.launching = false;
                p.launch = Some(result);
            }
            ProviderJob::Terminate { incident, .. } => {
                let p = self.provider_progress.entry(incident.clone()).or_default();
                p.terminating = false;
                p.terminate = Some(result.clone());
                if result.is_ok() {
                    if let Some(host) = self.incidents.get(incident).map(|i| i.value.host_id.clone()) {
                        if let Some(ix) = self.sched.host(&host) {
                            self.deregister(ix, "the provider terminated the host")?;
                        }
                    }
                }
            }
        }
        self.remediate()
    }
}

/// The name the replacement host of an incident joins under (deterministic, so a restarted
/// server recognises it).
pub fn replacement_name(incident: &Incident) -> String {
    format!("{}-r", incident.id)
}

/// Whether `hostname` is [`replacement_name`] of the incident, without building the name
/// (this runs for every unresolved incident on every heartbeat).
pub(super) fn is_replacement_of(hostname: &str, incident: &Incident) -> bool {
    hostname.strip_suffix("-r") == Some(incident.id.as_str())
}
