//! The incidents room: incidents as the API shows them, the operator's commands on them
//! (acknowledge, resolve), and drills (`drills.rs`: start, abort, the switch). Incidents are
//! opened by the host health controller and driven by the remediation controller
//! (`controllers/`); drills are run by the drills controller.

use super::drills::*;
use super::kinds::INCIDENT;
use super::kinds::{DRILL, DRILL_SWITCH};
use super::operator::*;
use super::*;
use mpsfleet_core::lifecycle::drill::Event as DrillEvent;
use mpsfleet_types::drill::*;

impl Cluster {
    /// `drill abort ID`: takes the fault back now.
    pub fn abort_drill(&mut self, id: &str, by: &str) -> Result<Drill, Error> {
        let d = self.read().drill(id)?;
        if d.status == DrillStatus::Running {
            let abort = DrillEvent::Abort(format!("aborted by {by}"));
            self.writing(|w| controllers::drills::end_run(w, d, abort))?;
        }
        self.ask(Work::Drill(id.to_string()));
        self.read().drill(id)
    }

    /// `drill run`: checks, picks the targets and starts the drill (or, for a dry run, says
    /// what it would do).
    pub fn start_drill(&mut self, req: CreateDrill, by: &str) -> Result<DrillStarted, Error> {
        let fault = DrillFault::parse(&req.fault).ok_or_else(|| {
            let all: Vec<&str> = DrillFault::ALL.iter().map(|f| f.as_str()).collect();
            Error::invalid("fault", format!("must be one of {}, got {:?}", all.join(", "), req.fault))
        })?;
        let pool = pool_name(&self.state, "pool", &req.pool)?;
        let p = self.read().pool(pool.as_str())?;
        if !self.read().drill_switch().enabled {
            return Err(Error::Conflict(
                "drills are switched off cluster-wide: `mpsfleet drill switch on` allows them again".into(),
            ));
        }
        if let Some(i) = self.state.incidents().unresolved().find(|i| i.pool == pool) {
            return Err(Error::Conflict(format!(
                "incident {} is open in pool {pool} (host {}): a drill starts only in a pool without one",
                i.id, i.host_id
            )));
        }
        if let Some(d) = self
            .state
            .drills()
            .values()
            .find(|d| d.value.pool == pool && d.value.status != DrillStatus::Ended)
        {
            return Err(Error::Conflict(format!(
                "drill {} is still {} in pool {pool}",
                d.value.id,
                d.value.status.as_str()
            )));
        }
        let targets = drill_targets(&self.read(), &p, fault, req.hosts.as_deref())?;
        let bounds = super::bounds::intervals();
        let derived = mpsfleet_core::bounds::derive(&p, &bounds);
        let row = *derived.of(fault.kind()).expect("every kind has bounds");
        let owner = derived.owner.clone();
        if req.dry_run {
            let expected = expected_timeline(&row, &owner, fault, req.once);
            return Ok(DrillStarted::Plan(Box::new(DrillPlan {
                pool,
                fault,
                targets,
                owner,
                bounds: row,
                expected,
            })));
        }
        let now = self.now();
        let id = format!("drill-{:012x}", auth::random_u64()? >> 16);
        let deadline_ms = now + drill_time(&row, &owner, req.once);
        let mut drill = Drill {
            id: id.clone(),
            pool: pool.clone(),
            fault,
            once: req.once,
            targets,
            status: DrillStatus::Running,
            verdict: None,
            bounds: row,
            owner,
            incidents: Vec::new(),
            phases: Vec::new(),
            notified_at_ms: None,
            started_at_ms: now,
            deadline_ms,
            ended_at_ms: None,
            by: by.to_string(),
            events: Default::default(),
        };
        let names: Vec<&str> = drill.targets.iter().map(|t| t.hostname.as_str()).collect();
        let what = format!(
            "{} injected on {} by {by}{}; the drill ends by {}",
            fault.as_str(),
            names.join(", "),
            if req.once { ", once" } else { ", until the owner has acted" },
            mpsfleet_types::utc(deadline_ms)
        );
        drill.events.push(now, ObjectEvent::new("DrillStarted", what.clone()));
        // The oldest ended drills leave in the same commit, so that the record stays bounded.
        let mut ended: Vec<&Drill> = self
            .state
            .drills()
            .values()
            .map(|d| &d.value)
            .filter(|d| d.status == DrillStatus::Ended)
            .collect();
        ended.sort_by_key(|d| (d.started_at_ms, d.id.clone()));
        let excess = (self.state.drills().len() + 1).saturating_sub(MAX_DRILLS).min(ended.len());
        let dropped: Vec<String> = ended[..excess].iter().map(|d| d.id.clone()).collect();
        let mut ops = vec![Op::put_json(DRILL, id.clone(), &drill, Precondition::Absent)?];
        ops.extend(dropped.iter().map(|d| Op::delete(DRILL, d.clone(), Precondition::Any)));
        let removed = dropped.into_iter().map(Change::DrillRemoved);
        self.write(&ops, removed.chain([Change::Drill(Box::new(drill.clone()))]))?;
        tracing::warn!(drill.id = %id, pool = %pool, "drill started: {what}");
        self.writing(|w| w.pool_event(&pool, "DrillStarted", format!("drill {id}: {what}")))?;
        self.ask(Work::Drill(id));
        Ok(DrillStarted::Started(Box::new(drill)))
    }

    /// The cluster-wide switch: off blocks new drills and aborts the running ones.
    pub fn set_drill_switch(&mut self, enabled: bool, by: &str) -> Result<DrillSwitch, Error> {
        let s = DrillSwitch { enabled, changed_by: Some(by.to_string()), changed_at_ms: Some(self.now()) };
        let expect = match self.state.drill_switch() {
            Some(v) => Precondition::Version(v.version),
            None => Precondition::Absent,
        };
        self.write(&[Op::put_json(DRILL_SWITCH, SWITCH_KEY, &s, expect)?], [Change::DrillSwitch(s.clone())])?;
        if !enabled {
            for id in running_drills(&self.state) {
                self.ask(Work::Drill(id));
            }
        }
        Ok(s)
    }
}

impl Cluster {
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
        let mut i = self.read().incident(id)?;
        if i.state == IncidentState::Resolved {
            return Err(Error::Conflict(format!("incident {id} is already resolved")));
        }
        let now = self.now();
        let (replacement, job) = self.work.cancel_replacement(&mut i, now);
        mpsfleet_core::remediation::resolve(&mut i, now, format!("resolved by operator: {reason}"), by);
        self.writing(|w| w.write_incident(i.clone()))?;
        self.work.pending_jobs.extend(job);
        Ok(OperatorOutcome { incident: shown(&self.state, i), replacement })
    }

    /// `incident acknowledge`: an operator has taken the incident; nothing else changes.
    pub fn acknowledge_incident(&mut self, id: &str, by: &str) -> Result<Incident, Error> {
        let mut i = self.read().incident(id)?;
        if i.state == IncidentState::Resolved {
            return Err(Error::Conflict(format!("incident {id} is already resolved")));
        }
        if i.acknowledged_by.as_deref() == Some(by) {
            return Ok(i);
        }
        i.acknowledged_by = Some(by.to_string());
        i.push(self.now(), Step::Acknowledged, "acknowledged by operator", Some(by.to_string()));
        self.writing(|w| w.write_incident(i))?;
        self.read().incident(id)
    }
}

pub(super) fn load_incidents(store: &dyn Store, state: &mut State) -> Result<(), Error> {
    for r in store.list(INCIDENT)? {
        let mut i: Incident = decode(&r)?;
        i.normalize();
        state.apply(r.version, Change::Incident(Box::new(i)));
    }
    Ok(())
}

/// An incident as it is shown: a replacement task placed after the incident recorded it
/// (it waited for capacity, say until the host came back) names the host it landed on.
pub(super) fn shown(state: &State, mut i: Incident) -> Incident {
    for a in i.affected_tasks.iter_mut().filter(|a| a.replacement_host.is_none()) {
        a.replacement_host =
            a.replacement.and_then(|r| state.tasks().get(&r)).and_then(|e| e.task.host_id.clone());
    }
    i
}

pub(super) fn open_incident_of<'a>(state: &'a State, host: &HostId) -> Option<&'a Incident> {
    state.incidents().unresolved().find(|i| &i.host_id == host)
}

pub(super) fn running_drills(state: &State) -> Vec<String> {
    state
        .drills()
        .values()
        .filter(|d| d.value.status == DrillStatus::Running)
        .map(|d| d.value.id.clone())
        .collect()
}

/// The faults the running drills ask `host`'s agent to inject.
pub(super) fn faults_for(state: &State, host: &HostId) -> Vec<InjectedFault> {
    state.drills().values().flat_map(|d| d.value.faults_for(host)).collect()
}

/// The hosts a drill strikes: healthy ACTIVE hosts of the pool whose agents accept
/// injected faults, the busiest first (a fault where no work runs would go unseen), and
/// on each the GPU with the most tasks. Refuses what would break a safety condition.
pub(super) fn drill_targets(
    r: &Reader<'_>,
    pool: &Pool,
    fault: DrillFault,
    hosts: Option<&str>,
) -> Result<Vec<DrillTarget>, Error> {
    let live: Vec<(HostIx, &HostEntry)> = r
        .state
        .hosts()
        .iter()
        .enumerate()
        .map(|(ix, e)| (ix as HostIx, e))
        .filter(|(_, e)| e.host().pool == pool.name && e.host().status == HostStatus::Active)
        .collect();
    let healthy: Vec<(HostIx, &HostEntry)> = live
        .iter()
        .copied()
        .filter(|(_, e)| e.host().health_status == HealthStatus::Ok && !e.host().cordoned)
        .collect();
    let want = match hosts.map(str::trim) {
        None | Some("") => 1,
        Some(s) => parse_count(s, live.len()).map_err(|why| Error::invalid("hosts", why))?,
    };
    if want >= healthy.len() {
        return Err(Error::Conflict(format!(
            "a drill never strikes a pool's last healthy host: pool {} has {} healthy ACTIVE host(s), so \
             a drill may strike at most {}, not {want}",
            pool.name,
            healthy.len(),
            healthy.len().saturating_sub(1)
        )));
    }
    if pool.mode == OwnershipMode::Managed {
        let counts = r.pool_counts(&pool.name);
        let allowed =
            mpsfleet_core::remediation::storm_breaker_allowed(counts.total, &pool.remediation_policy);
        if u64::from(counts.unhealthy) + want as u64 > allowed {
            return Err(Error::Conflict(format!(
                "striking {want} host(s) would exceed the storm breaker's budget: {} of {} hosts are \
                 unhealthy and remediationPolicy.stormBreakerPercent ({}%) lets {allowed} be replaced at once",
                counts.unhealthy, counts.total, pool.remediation_policy.storm_breaker_percent
            )));
        }
    }
    let mut eligible: Vec<(usize, &HostEntry, Option<GpuUuid>)> = Vec::new();
    let mut refused = Vec::new();
    for (ix, e) in healthy {
        if !e.accepts_faults {
            refused.push(e.host().hostname.clone());
            continue;
        }
        if fault.per_gpu()
            && (e.host().gpus.is_empty() || (fault != DrillFault::GpuCheckFail && !e.host().mps_available))
        {
            continue;
        }
        let live_tasks: Vec<&Task> = r
            .state
            .tasks()
            .on_host(ix)
            .iter()
            .filter_map(|id| r.state.tasks().get(id))
            .map(|t| &t.task)
            .filter(|t| t.desired_status != TaskStatus::Stopped)
            .collect();
        let gpu = fault.per_gpu().then(|| {
            e.host()
                .gpus
                .iter()
                .map(|g| (live_tasks.iter().filter(|t| t.gpu_ids.contains(&g.uuid)).count(), &g.uuid))
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)))
                .map(|(_, u)| u.clone())
        });
        eligible.push((live_tasks.len(), e, gpu.flatten()));
    }
    if eligible.len() < want {
        let why = if refused.is_empty() {
            "they have no GPU the fault could strike".to_string()
        } else {
            format!(
                "the agents of {} do not accept injected faults: start them with --allow-fault-injection",
                refused.join(", ")
            )
        };
        return Err(Error::Conflict(format!(
            "pool {} has {} host(s) a drill can strike, fewer than {want}: {why}",
            pool.name,
            eligible.len()
        )));
    }
    eligible.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.host().id.cmp(&b.1.host().id)));
    Ok(eligible
        .into_iter()
        .take(want)
        .map(|(_, e, gpu_id)| DrillTarget {
            host_id: e.host().id.clone(),
            hostname: e.host().hostname.clone(),
            gpu_id,
        })
        .collect())
}

impl<'a> Reader<'a> {
    pub fn incidents(&self) -> Vec<Incident> {
        let mut v: Vec<Incident> =
            self.state.incidents().values().map(|v| shown(self.state, v.value.clone())).collect();
        v.sort_by(|a, b| (a.opened_at_ms, &a.id).cmp(&(b.opened_at_ms, &b.id)));
        v
    }

    pub fn incident(&self, id: &str) -> Result<Incident, Error> {
        self.state
            .incidents()
            .get(id)
            .map(|v| shown(self.state, v.value.clone()))
            .ok_or_else(|| Error::not_found("incident", id))
    }

    pub fn drills(&self) -> Vec<Drill> {
        let mut v: Vec<Drill> = self.state.drills().values().map(|d| d.value.clone()).collect();
        v.sort_by(|a, b| (b.started_at_ms, &b.id).cmp(&(a.started_at_ms, &a.id)));
        v
    }

    pub fn drill(&self, id: &str) -> Result<Drill, Error> {
        self.state.drills().get(id).map(|d| d.value.clone()).ok_or_else(|| Error::not_found("drill", id))
    }

    pub fn drill_switch(&self) -> DrillSwitch {
        controllers::drills::switch(self.state)
    }
}

/// Commits a host and an incident about it as one batch, then applies both.
pub(super) fn write_host_and_incident(
    w: &mut Writer<'_>,
    ix: HostIx,
    mut host: Host,
    incident: Incident,
) -> Result<(), Error> {
    w.record_host_changes(ix, &mut host);
    // The incident's new steps are the host's news too (drained, replaced, ...).
    let seen = w.state.incidents().get(&incident.id).map_or(0, |v| v.value.timeline.pushed());
    for s in incident.timeline.since(seen) {
        let msg = format!("incident {}: {} {}", incident.id, s.step.as_str(), s.detail);
        host.events.push(s.latest_ms(), ObjectEvent::new("Remediation", msg));
    }
    let e = &w.state.hosts()[ix as usize];
    let expect = match w.state.incidents().get(&incident.id) {
        Some(v) => Precondition::Version(v.version),
        None => Precondition::Absent,
    };
    let ops = [
        Op::put_json(HOST, host.id.as_str(), &host, Precondition::Version(e.version()))?,
        Op::put_json(INCIDENT, incident.id.clone(), &incident, expect)?,
    ];
    w.write(&ops, [Change::Incident(Box::new(incident)), Change::Host(ix, host)])?;
    Ok(())
}

/// Loads the drills and the switch; returns the drills still running (their keys are asked
/// for once loaded).
pub(super) fn load_drills(store: &dyn Store, state: &mut State) -> Result<Vec<String>, Error> {
    let mut running = Vec::new();
    for r in store.list(DRILL)? {
        let d: Drill = decode(&r)?;
        if d.status != DrillStatus::Ended {
            running.push(d.id.clone());
        }
        state.apply(r.version, Change::Drill(Box::new(d)));
    }
    if let Some(r) = store.get(DRILL_SWITCH, SWITCH_KEY)? {
        let s: DrillSwitch = decode(&r)?;
        state.apply(r.version, Change::DrillSwitch(s));
    }
    Ok(running)
}
