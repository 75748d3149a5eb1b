//! Drills (docs/drills.md): a real fault injected through the agents of chosen hosts, handled
//! by the pool's owner exactly as a real failure, and measured against the pool's bounds.
//!
//! `start_drill` checks the safety conditions (the cluster-wide switch, no incident open in
//! the pool, never its last healthy host, within the storm breaker's budget, agents that
//! accept injected faults), picks the targets and commits the drill RUNNING; a dry run stops
//! before the commit and answers the targets and the expected timeline. From then on the
//! drill controller (`Work::Drill`) passes over it: the faults it asks for go out in the
//! targets' heartbeat answers while it runs ([`Cluster::faults_for`]), and the controller
//! (`controllers/drills.rs`) follows it to its verdict. The lifecycle is
//! `mpsfleet_core::lifecycle::drill`.

use super::controllers::drills::SELF_MANAGED_HOLD_MS;
use super::kinds::{DRILL, DRILL_SWITCH};
use super::*;
use mpsfleet_core::lifecycle::drill::Event as DrillEvent;
use mpsfleet_types::bounds::KindBounds;
use mpsfleet_types::drill::*;

/// Drills kept; the oldest ended ones leave when a new one starts.
pub const MAX_DRILLS: usize = 100;
/// Beyond the bound it measures, how long a drill waits for the owner before it takes the
/// fault back.
pub const DRILL_SLACK_MS: u64 = 60_000;
const SWITCH_KEY: &str = "cluster";

/// What `POST /v1/drills` did.
#[derive(Debug, Clone)]
pub enum DrillStarted {
    /// A dry run: what it would strike and expect.
    Plan(DrillPlan),
    Started(Box<Drill>),
}

impl Cluster {
    pub(super) fn load_drills(&mut self) -> Result<(), Error> {
        for r in self.store.list(DRILL)? {
            let d: Drill = decode(&r)?;
            let running = d.status != DrillStatus::Ended;
            let id = d.id.clone();
            self.state.apply(r.version, Change::Drill(Box::new(d)));
            if running {
                self.ask(Work::Drill(id));
            }
        }
        if let Some(r) = self.store.get(DRILL_SWITCH, SWITCH_KEY)? {
            let s: DrillSwitch = decode(&r)?;
            self.state.apply(r.version, Change::DrillSwitch(s));
        }
        Ok(())
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
        controllers::drills::switch(&self.state)
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
            for id in self.running_drills() {
                self.ask(Work::Drill(id));
            }
        }
        Ok(s)
    }

    fn running_drills(&self) -> Vec<String> {
        self.state
            .drills()
            .values()
            .filter(|d| d.value.status == DrillStatus::Running)
            .map(|d| d.value.id.clone())
            .collect()
    }

    /// The faults the running drills ask `host`'s agent to inject.
    pub(super) fn faults_for(&self, host: &HostId) -> Vec<InjectedFault> {
        self.state.drills().values().flat_map(|d| d.value.faults_for(host)).collect()
    }

    /// `drill run`: checks, picks the targets and starts the drill (or, for a dry run, says
    /// what it would do).
    pub fn start_drill(&mut self, req: CreateDrill, by: &str) -> Result<DrillStarted, Error> {
        let fault = DrillFault::parse(&req.fault).ok_or_else(|| {
            let all: Vec<&str> = DrillFault::ALL.iter().map(|f| f.as_str()).collect();
            Error::invalid("fault", format!("must be one of {}, got {:?}", all.join(", "), req.fault))
        })?;
        let pool = self.pool_name("pool", &req.pool)?;
        let p = self.pool(pool.as_str())?;
        if !self.drill_switch().enabled {
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
        let targets = self.drill_targets(&p, fault, req.hosts.as_deref())?;
        let bounds = super::bounds::intervals();
        let derived = mpsfleet_core::bounds::derive(&p, &bounds);
        let row = *derived.of(fault.kind()).expect("every kind has bounds");
        let owner = derived.owner.clone();
        if req.dry_run {
            let expected = expected_timeline(&row, &owner, fault, req.once);
            return Ok(DrillStarted::Plan(DrillPlan { pool, fault, targets, owner, bounds: row, expected }));
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

    /// The hosts a drill strikes: healthy ACTIVE hosts of the pool whose agents accept
    /// injected faults, the busiest first (a fault where no work runs would go unseen), and
    /// on each the GPU with the most tasks. Refuses what would break a safety condition.
    fn drill_targets(
        &self,
        pool: &Pool,
        fault: DrillFault,
        hosts: Option<&str>,
    ) -> Result<Vec<DrillTarget>, Error> {
        let live: Vec<(HostIx, &HostEntry)> = self
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
            let counts = self.reader().pool_counts(&pool.name);
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
                && (e.host().gpus.is_empty()
                    || (fault != DrillFault::GpuCheckFail && !e.host().mps_available))
            {
                continue;
            }
            let live_tasks: Vec<&Task> = self
                .state
                .tasks()
                .on_host(ix)
                .iter()
                .filter_map(|id| self.state.tasks().get(id))
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

    /// `drill abort ID`: takes the fault back now.
    pub fn abort_drill(&mut self, id: &str, by: &str) -> Result<Drill, Error> {
        let d = self.drill(id)?;
        if d.status == DrillStatus::Running {
            let abort = DrillEvent::Abort(format!("aborted by {by}"));
            self.writing(|w| controllers::drills::end_run(w, d, abort))?;
        }
        self.ask(Work::Drill(id.to_string()));
        self.drill(id)
    }
}

/// `hosts`: a count (`2`) or a share (`25%`, rounded up) of the pool's `total` ACTIVE hosts.
fn parse_count(s: &str, total: usize) -> Result<usize, String> {
    let bad = || format!("must be a count of hosts (1 or more) or a percentage (1% to 100%), got {s:?}");
    let n = match s.strip_suffix('%') {
        Some(p) => {
            let p: usize = p.parse().map_err(|_| bad())?;
            if !(1..=100).contains(&p) {
                return Err(bad());
            }
            (total * p).div_ceil(100).max(1)
        }
        None => s.parse().map_err(|_| bad())?,
    };
    if n == 0 {
        return Err(bad());
    }
    Ok(n)
}

/// How long a drill waits for the owner, from its start: the bound it measures and slack.
fn drill_time(b: &KindBounds, owner: &str, once: bool) -> u64 {
    let measured = if once || owner == "operator" {
        b.detect_ms + b.notify_ms
    } else {
        b.total_fenced_ms.or(b.total_ms).unwrap_or(b.detect_ms + b.decide_ms.unwrap_or(0))
            + b.replace_ms.unwrap_or(0)
    };
    measured + DRILL_SLACK_MS
}

/// The timeline the bounds promise, in words, each step with its latest time.
fn expected_timeline(b: &KindBounds, owner: &str, fault: DrillFault, once: bool) -> Vec<String> {
    let s = mpsfleet_types::time::secs;
    let mut v = vec![format!("+0.0s  {} injected by the targets' agents", fault.as_str())];
    if once {
        v.push(
            "the agent restarts the daemon itself; no incident is expected unless local repair fails".into(),
        );
    }
    v.push(format!(
        "{}  detected: the incident opens (the check IMPAIRED for the toleration)",
        s(b.detect_ms)
    ));
    v.push(format!("{}  notified: the incident's event delivered", s(b.detect_ms + b.notify_ms)));
    if owner == "operator" {
        v.push(format!(
            "the operator decides and acts (not the drill's to do): the drill takes the fault back {} after \
             the notification and the host returns as it was",
            s(SELF_MANAGED_HOLD_MS)
        ));
        return v;
    }
    if let Some(d) = b.decide_ms {
        v.push(format!("{}  decided: mpsfleet cordons and drains the host", s(b.detect_ms + d)));
    }
    if let Some(t) = b.total_ms {
        v.push(format!("{}  resumed: restart-mode service tasks running again elsewhere", s(t)));
    }
    if let (Some(d), Some(r)) = (b.decide_ms, b.replace_ms) {
        v.push(format!("{}  replacement host ready", s(b.detect_ms + d + r)));
    }
    if let Some(t) = b.total_fenced_ms {
        v.push(format!(
            "{}  resumed: fenced service tasks running again, once the old host is terminated",
            s(t)
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::parse_count;

    #[test]
    fn host_counts_and_shares() {
        assert_eq!(parse_count("2", 10), Ok(2));
        assert_eq!(parse_count("25%", 10), Ok(3));
        assert_eq!(parse_count("1%", 3), Ok(1));
        for bad in ["0", "-1", "x", "0%", "101%", "%", "1.5"] {
            assert!(parse_count(bad, 10).unwrap_err().contains("must be a count"), "{bad}");
        }
    }
}
