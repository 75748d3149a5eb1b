//! The operator's commands on hosts and incidents: `host drain`, `host replace`,
//! `host activate`, `incident acknowledge` and `incident resolve`. Each is recorded on the
//! incident's timeline with who ran it (the identity of the token used) and when, and then the
//! same planner as automatic remediation runs (`remediation::plan`), so an operator's command
//! and mpsfleet's own steps read as one record.
//!
//! A command that ends an incident while its replacement host is in flight cancels the
//! replacement: its one-time registration token is revoked (a host that registers with it is
//! refused), and a launch the provider already made is terminated.

use super::health::INCIDENT;
use super::*;

/// What an operator command did, for the CLI to print.
#[derive(Debug, Clone)]
pub struct OperatorOutcome {
    pub incident: Incident,
    /// What happened to the replacement host, when the command affected one.
    pub replacement: Option<String>,
}

impl Cluster {
    /// `host forget`: a host that does not exist (a machine that is gone, or a registration
    /// made with the join token by someone else) leaves the fleet: DEREGISTERED, its tasks
    /// recorded as stopped, its credential revoked and its GPU UUIDs free for the machine that
    /// really has them. Refused while the host heartbeats (it exists) unless `force`.
    pub fn forget_host(&mut self, host: &str, force: bool, by: &str) -> Result<HostView, Error> {
        let ix = self.host_ix(host)?;
        let e = &self.state.hosts()[ix as usize];
        if e.host().status == HostStatus::Deregistered {
            return Err(Error::Conflict(format!("host {} is already deregistered", e.host().id)));
        }
        let grace = self
            .state
            .pools()
            .get(&e.host().pool)
            .map_or(10_000, |p| p.value.health_policy.agent_heartbeat_grace_ms);
        let now = self.now();
        if let Some(at) = e.last_heartbeat_ms.filter(|&at| now.saturating_sub(at) < grace) {
            if !force {
                return Err(Error::Conflict(format!(
                    "host {} sent a heartbeat {} ago, so something runs it: drain or replace it, or pass \
                     --force if it is not the machine it claims to be",
                    e.host().id,
                    mpsfleet_core::health::fmt_ms(now.saturating_sub(at))
                )));
            }
        }
        self.writing(|w| w.deregister(ix, &format!("host forgotten by {by}")))?;
        tracing::warn!(host.id = %self.state.hosts()[ix as usize].host().id, by, force, "host forgotten: its GPUs are free");
        Ok(self.host_view(ix))
    }

    /// `host revoke-credential`: the host's credential is refused from now on (a leaked one,
    /// say). Nothing else changes at once: the host stops reporting, and its pool's health
    /// policy takes it from there (an incident after the heartbeat grace; a managed pool
    /// replaces it). The machine joins again as a new host (`host forget` frees its GPUs).
    pub fn revoke_host_credential(&mut self, host: &str, by: &str) -> Result<HostView, Error> {
        let ix = self.host_ix(host)?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if h.status == HostStatus::Deregistered {
            return Err(Error::Conflict(format!(
                "host {} is deregistered: its credential works no more",
                h.id
            )));
        }
        if h.credential_revoked_at_ms.is_some() {
            return Err(Error::Conflict(format!("host {}'s credential is already revoked", h.id)));
        }
        h.credential_revoked_at_ms = Some(self.now());
        self.write_host(ix, h)?;
        tracing::warn!(host.id = %self.state.hosts()[ix as usize].host().id, by, "host credential revoked");
        Ok(self.host_view(ix))
    }

    /// `host drain` or `host replace`: recorded on the host's incident (one is opened if there
    /// is none), then the same steps as a managed pool's run. `host replace` is refused up
    /// front where the pool has no capacity provider to launch a replacement.
    pub fn operator_action(
        &mut self,
        host: &str,
        action: OperatorAction,
        by: &str,
    ) -> Result<Incident, Error> {
        let ix = self.host_ix(host)?;
        let h = self.state.hosts()[ix as usize].host().clone();
        if h.status == HostStatus::Deregistered {
            return Err(Error::Conflict(format!("host {} is already deregistered", h.id)));
        }
        if action == OperatorAction::Replace && !self.has_provider(&h.pool) {
            return Err(Error::Conflict(format!(
                "pool {} has no capacity provider, so mpsfleet cannot launch a replacement for host {}: \
                 repair the host and run `mpsfleet host activate {}`, or run `mpsfleet host drain {}` \
                 and remove the machine yourself",
                h.pool, h.id, h.id, h.id
            )));
        }
        let now = self.now();
        let mut incident = match self.open_incident_of(&h.id) {
            Some(i) => i.clone(),
            None => {
                let owner = self
                    .state
                    .pools()
                    .get(&h.pool)
                    .map_or(IncidentOwner::Operator, |p| IncidentOwner::for_mode(p.value.mode));
                let trigger = Trigger {
                    check: "OPERATOR".into(),
                    gpu_id: None,
                    reason: format!("operator asked to {} the host", action.as_str()),
                    evidence: String::new(),
                    first_failure_at_ms: None,
                    local_repairs_at_ms: Vec::new(),
                    earlier_repairs_at_ms: Vec::new(),
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
        incident.push(now, Step::OperatorCommand, format!("host {}", action.as_str()), Some(by.to_string()));
        // A failed replacement is tried again on an explicit `replace`.
        if action == OperatorAction::Replace {
            if let Some(p) = self.work.provider_progress.get_mut(&incident.id) {
                if matches!(p.launch, Some(Err(_))) {
                    p.launch = None;
                }
            }
        }
        let id = incident.id.clone();
        // Written and asked for: the controllers carry the command out at once.
        let key = Work::Incident(incident.opened_at_ms, incident.id.clone());
        self.writing(|w| w.write_incident(incident))?;
        self.ask(key);
        self.incident(&id)
    }

    /// `host activate`: returns a repaired host to ACTIVE and schedulable. Refused, naming the
    /// checks, while any check is not OK. An open incident about the host is resolved (the
    /// host is healthy and in service again), cancelling a replacement in flight.
    pub fn activate_host(
        &mut self,
        host: &str,
        by: &str,
    ) -> Result<(HostView, Option<OperatorOutcome>), Error> {
        let ix = self.host_ix(host)?;
        let e = &self.state.hosts()[ix as usize];
        let h = e.host().clone();
        let mut activated = h.clone();
        host_lifecycle::apply(&mut activated, host_lifecycle::Event::Activate)
            .map_err(|err| Error::Conflict(format!("host {} cannot be activated: {err}", h.id)))?;
        activated.cordoned = false;
        let not_ok: Vec<String> = e
            .health
            .host_checks()
            .into_iter()
            .chain(e.checks.iter().cloned())
            .filter(|c| c.status != HealthStatus::Ok)
            .map(|c| match &c.gpu_id {
                Some(g) => format!("{} on {g} is {}: {}", c.name, c.status.as_str(), c.reason),
                None => format!("{} is {}: {}", c.name, c.status.as_str(), c.reason),
            })
            .collect();
        let healthy = matches!(e.health.verdict, mpsfleet_core::health::Verdict::Healthy)
            && e.host().health_status == HealthStatus::Ok;
        if !not_ok.is_empty() || !healthy {
            let mut why = not_ok;
            why.dedup();
            if why.is_empty() {
                why.push(format!("host health is {}", e.host().health_status.as_str()));
            }
            return Err(Error::Conflict(format!(
                "host {} is not healthy, so it stays out of service: {}; repair it and try again",
                h.id,
                why.join("; ")
            )));
        }
        let now = self.now();
        let mut outcome = None;
        if let Some(open) = self.open_incident_of(&h.id).cloned() {
            let terminating = self.work.provider_progress.get(&open.id).is_some_and(|p| p.terminating);
            if terminating {
                return Err(Error::Conflict(format!(
                    "host {} is being terminated by the pool's provider (incident {}); it cannot return to service",
                    h.id, open.id
                )));
            }
            let mut i = open;
            i.push(now, Step::HostActivated, "host returned to ACTIVE by operator", Some(by.to_string()));
            let (replacement, job) = self.cancel_replacement(&mut i, now);
            mpsfleet_core::remediation::resolve(&mut i, now, "host is healthy and active again", by);
            // The host and the incident in one commit: the host is never active under an
            // incident that says it is being drained.
            self.write_host_and_incident(ix, activated, i.clone())?;
            self.work.pending_jobs.extend(job);
            outcome = Some(OperatorOutcome { incident: self.shown(i), replacement });
        } else if h.status != activated.status || h.cordoned {
            self.write_host(ix, activated)?;
        }
        self.ask_placement_everywhere();
        Ok((self.host_view(ix), outcome))
    }

    /// `host recheck`: the operator fixed what made the agent's local repair give up (a daemon
    /// it stopped restarting). The host's recheck count goes up; its agent sees it in the next
    /// heartbeat answer and gives every daemon it gave up on a fresh restart budget, starting
    /// it again at once. The host's health then follows from its checks as usual (`host
    /// activate` returns a drained host to service once they are OK). Recorded on the open
    /// incident's timeline (OPERATOR_COMMAND, by) and in the host's events.
    pub fn recheck_host(&mut self, host: &str, by: &str) -> Result<(HostView, Option<Incident>), Error> {
        let ix = self.host_ix(host)?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if h.status == HostStatus::Deregistered {
            return Err(Error::Conflict(format!("host {} is deregistered: no agent runs it", h.id)));
        }
        let now = self.now();
        h.rechecks += 1;
        let what = "host recheck: the agent re-arms its local repair and restarts what it gave up on";
        h.events.push(now, ObjectEvent::new("RecheckRequested", format!("{what} (by {by})")));
        let incident = match self.open_incident_of(&h.id).cloned() {
            Some(mut i) => {
                i.push(now, Step::OperatorCommand, what, Some(by.to_string()));
                self.write_host_and_incident(ix, h, i.clone())?;
                Some(self.shown(i))
            }
            None => {
                self.write_host(ix, h)?;
                None
            }
        };
        tracing::info!(host.id = %self.state.hosts()[ix as usize].host().id, by, "host recheck");
        Ok((self.host_view(ix), incident))
    }

    /// `incident acknowledge`: an operator has taken the incident; nothing else changes.
    pub fn acknowledge_incident(&mut self, id: &str, by: &str) -> Result<Incident, Error> {
        let mut i = self.incident(id)?;
        if i.state == IncidentState::Resolved {
            return Err(Error::Conflict(format!("incident {id} is already resolved")));
        }
        if i.acknowledged_by.as_deref() == Some(by) {
            return Ok(i);
        }
        i.acknowledged_by = Some(by.to_string());
        i.push(self.now(), Step::Acknowledged, "acknowledged by operator", Some(by.to_string()));
        self.writing(|w| w.write_incident(i))?;
        self.incident(id)
    }

    /// `incident resolve --reason`: the operator closes the incident. The host is left as it
    /// is (a drained host stays cordoned and DRAINING until `host activate`); a replacement in
    /// flight is cancelled.
    pub fn resolve_incident(&mut self, id: &str, reason: &str, by: &str) -> Result<OperatorOutcome, Error> {
        let reason = reason.trim();
        if reason.is_empty() || reason.len() > 1024 {
            return Err(Error::invalid(
                "reason",
                "must be 1 to 1024 characters: say why the incident is resolved",
            ));
        }
        let mut i = self.incident(id)?;
        if i.state == IncidentState::Resolved {
            return Err(Error::Conflict(format!("incident {id} is already resolved")));
        }
        let now = self.now();
        let (replacement, job) = self.cancel_replacement(&mut i, now);
        mpsfleet_core::remediation::resolve(&mut i, now, format!("resolved by operator: {reason}"), by);
        self.writing(|w| w.write_incident(i.clone()))?;
        self.work.pending_jobs.extend(job);
        Ok(OperatorOutcome { incident: self.shown(i), replacement })
    }

    /// Ends the incident's replacement before it is used: revokes its token (in the record the
    /// caller commits) and, when the provider launched it, gives the termination to ask for once
    /// that commit is done (one still launching is terminated when it reports back). Says what
    /// it did.
    fn cancel_replacement(&mut self, i: &mut Incident, now: u64) -> (Option<String>, Option<ProviderJob>) {
        let Some(b) = i.replacement.as_ref() else { return (None, None) };
        if let Some(host) = b.host_id.clone() {
            return (Some(format!("replacement host {host} stays in the pool as an ordinary host")), None);
        }
        if b.revoked {
            return (None, None);
        }
        let name = b.name.clone();
        if let Some(b) = i.replacement.as_mut() {
            b.revoked = true;
        }
        let progress = self.work.provider_progress.get(&i.id);
        let launching = progress.is_some_and(|p| p.launching);
        let launched = progress.is_some_and(|p| matches!(p.launch, Some(Ok(()))));
        let job = (launched && !launching).then(|| ProviderJob::Terminate {
            incident: i.id.clone(),
            pool: i.pool.clone(),
            name: name.clone(),
        });
        let detail = if launched || launching {
            format!(
                "replacement {name} cancelled: its registration token is revoked and the provider is asked \
                 to terminate it"
            )
        } else {
            format!("replacement {name} cancelled: its registration token is revoked")
        };
        i.push(now, Step::ReplacementCancelled, detail.clone(), None);
        (Some(detail), job)
    }
}

impl Cluster {
    /// Commits a host and an incident about it as one batch, then applies both.
    fn write_host_and_incident(
        &mut self,
        ix: HostIx,
        mut host: Host,
        incident: Incident,
    ) -> Result<(), Error> {
        self.writer().record_host_changes(ix, &mut host);
        // The incident's new steps are the host's news too (drained, replaced, ...).
        let seen = self.state.incidents().get(&incident.id).map_or(0, |v| v.value.timeline.pushed());
        for s in incident.timeline.since(seen) {
            let msg = format!("incident {}: {} {}", incident.id, s.step.as_str(), s.detail);
            host.events.push(s.latest_ms(), ObjectEvent::new("Remediation", msg));
        }
        let e = &self.state.hosts()[ix as usize];
        let expect = match self.state.incidents().get(&incident.id) {
            Some(v) => Precondition::Version(v.version),
            None => Precondition::Absent,
        };
        let ops = [
            Op::put_json(HOST, host.id.as_str(), &host, Precondition::Version(e.version()))?,
            Op::put_json(INCIDENT, incident.id.clone(), &incident, expect)?,
        ];
        self.write(&ops, [Change::Incident(Box::new(incident)), Change::Host(ix, host)])?;
        Ok(())
    }
}
