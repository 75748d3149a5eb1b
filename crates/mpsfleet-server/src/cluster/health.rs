//! Host health in the server: evaluates each host's checks on every heartbeat and on a tick,
//! takes impaired hosts out of placement at once, and opens an incident when a host is
//! declared bad; the remediation controller (`controllers/remediation.rs`) drives it from
//! there. Provider calls (launch, terminate) are slow and run outside the cluster lock: the
//! controllers' [`ProviderJob`]s come back here with [`Cluster::provider_done`].

use super::*;
use crate::provider::AttemptRecord;
use mpsfleet_core::health::{evaluate, HealthInput, Verdict};

pub(super) use super::controllers::remediation::{ProviderJob, ProviderOutcome, TERMINATE_RETRY};
pub(super) use super::kinds::INCIDENT;

/// The longest a GPU stays closed to MPS tasks after its daemon did not answer, once its
/// check is OK again.
pub const MPS_CLOSED_HOLD_MS: u64 = 1_000;

impl Cluster {
    pub(super) fn load_incidents(&mut self) -> Result<(), Error> {
        for r in self.store.list(INCIDENT)? {
            let mut i: Incident = decode(&r)?;
            i.normalize();
            self.state.apply(r.version, Change::Incident(Box::new(i)));
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
                if let Some((at, detail)) = self.reader().left_traffic(ix) {
                    incident.record_before_open(at, Step::LeftTraffic, detail);
                }
                tracing::warn!(incident.id = %incident.id, host.id = %host_id, owner = owner.as_str(), "host declared bad");
                self.writing(|w| w.write_incident(incident))?;
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

    /// Keeps the server's evaluation of a host; a new verdict drops the storm breaker's counts,
    /// which count verdicts.
    pub(super) fn set_evaluation(&mut self, ix: HostIx, health: mpsfleet_core::health::HostHealth) {
        if health.verdict != self.state.hosts()[ix as usize].health.verdict {
            self.work.breaker_counts.clear();
        }
        self.state.host_mut(ix).health = health;
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
        self.writing(|w| w.write_incident(i))
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
                        self.writing(|w| w.write_incident(i))?;
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
                            self.writing(|w| w.deregister(ix, "the provider terminated the host"))?;
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
