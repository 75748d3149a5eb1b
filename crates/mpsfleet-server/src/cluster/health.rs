//! Incidents as the API shows them, the health tick's entry, and the ends of provider calls:
//! a host's health is the host health controller's (`controllers/health.rs`), an incident's
//! remediation the remediation controller's (`controllers/remediation.rs`). Provider calls
//! (launch, terminate) are slow and run outside the cluster lock: the controllers'
//! [`ProviderJob`]s come back here with [`Cluster::provider_done`].

use super::*;
use crate::provider::AttemptRecord;

pub(super) use super::controllers::remediation::{ProviderJob, ProviderOutcome, TERMINATE_RETRY};
pub(super) use super::kinds::INCIDENT;

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

    /// Evaluates every host that is due (heartbeat grace runs out without any report) and
    /// drives every incident; returns the provider calls to make.
    pub fn health_tick(&mut self) -> Result<Vec<ProviderJob>, Error> {
        self.run_work();
        let mut health = std::mem::take(&mut self.work.health);
        health.tick(&mut self.controller_ctx());
        self.work.health = health;
        // What this tick asked for (an incident just opened, a pool whose GPUs opened again)
        // runs now, not a tick later.
        self.run_work();
        Ok(self.take_jobs())
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
