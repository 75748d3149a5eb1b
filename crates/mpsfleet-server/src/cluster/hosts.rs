//! The hosts room: what agents and operators do to hosts. Registration (one host, or a batch
//! of them in one commit), heartbeats (the quiet path that commits nothing, and the full one
//! that hands the host to the host health controller), the tasks a host should run and its
//! reports about them, the host views, and the operator's host commands (cordon, drain,
//! activate, recheck, forget, revoke). What the methods here share lives beside them:
//! `register.rs` (batching), `operator.rs`, `local_fleet.rs`, `logs.rs`.

use super::agent_reports::*;
use super::controllers::health::{self, HostHealth};
use super::logs::*;
use super::operator::*;
use super::register::*;
use super::*;
use crate::auth::{self, Principal};
use mpsfleet_core::scheduler::MAX_GPUS;
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::api::RegisterHostResponse;
use mpsfleet_types::policy::RestartCopies;
use mpsfleet_types::{GpuUuid, Host, HostId, HostRegistration, Incident};
use mpsfleet_types::{HostStatus, PoolName};
use std::collections::BTreeSet;

impl Cluster {
    // ---- tasks --------------------------------------------------------------------------

    /// An agent's report about one of its tasks.
    pub fn report_task(
        &mut self,
        host: &HostId,
        id: &str,
        mut report: TaskStateReport,
    ) -> Result<Task, Error> {
        let task = self.read().task(id)?;
        if task.host_id.as_ref() != Some(host) {
            return Err(Error::Forbidden(format!("task {id} is not placed on host {host}")));
        }
        if let Some(output) = report.output.take() {
            self.output.keep(task.id, output, report.last_status == TaskStatus::Stopped, self.now());
        }
        // A stopped task never comes back (late reports change nothing); none moves back.
        if task_lifecycle::is_terminal(task.last_status) {
            return Ok(task);
        }
        let now = self.now();
        let mut t = task.clone();
        // The health the report carries is the task's last word before its status moves
        // (a STOPPED report's too).
        if let Some(h) = report.health_status {
            task_lifecycle::report_health(&mut t, h);
        }
        let reported = task_lifecycle::Event::AgentReported(report.last_status);
        if let Err(e) = task_lifecycle::apply(&mut t, reported) {
            return Err(Error::Conflict(format!("task {id}: {e}")));
        }
        if let Some(r) = report.ready {
            t.ready = r;
        }
        if let Some(containers) = report.containers.take() {
            check_container_reports(&containers)?;
            t.containers = containers;
            let stopped = t.last_status == TaskStatus::Stopped;
            t.attachments = mpsfleet_types::Attachment::of_containers(&t.containers, stopped);
        }
        // The agent says how long ago its pulls began; placed on this clock at the report's
        // arrival, never after now.
        if let Some(p) = report.pull {
            let start = *t.pull_started_at_ms.get_or_insert(now.saturating_sub(p.began_ago_ms));
            t.pull_stopped_at_ms = Some(start.saturating_add(p.took_ms).min(now));
        }
        if t.last_status == TaskStatus::Running && t.started_at_ms.is_none() {
            mpsfleet_core::timeline!("running-received", task = t.id);
            t.started_at_ms = Some(now);
        }
        if t.last_status == TaskStatus::Stopped {
            t.ready = false;
            mpsfleet_core::lifecycle::service::detach(&mut t);
            t.stopped_at_ms = Some(now);
            if let Some(code) = report.stop_code {
                t.stop_code = Some(code);
            }
            if let Some(reason) = report.stopped_reason {
                t.stopped_reason = Some(reason);
            }
            t.stop_code.get_or_insert(StopCode::EssentialContainerExited);
        }
        if t == task {
            return Ok(task);
        }
        // Refused because its daemon did not answer: its GPU takes no MPS task until the daemon
        // is seen answering, so the service's replacement goes elsewhere (or waits) instead of
        // being refused on the same GPU again.
        if report.stop_code == Some(StopCode::MpsDaemonUnavailable) {
            let placed = self.state.tasks().get(&task.id).and_then(|e| e.placement.clone());
            if let Some(p) = placed {
                self.close_mps_gpus(p.host, &p.gpus);
            }
        }
        let code = t.stop_code;
        let reason = t.stopped_reason.clone();
        let was = self.read().replica_state(&task);
        let now_state = self.read().replica_state(&t);
        // On a daemon that is failing (or whose failure is confirmed), the exit is the daemon's.
        let daemon_failed = self.read().at_risk(&task) || self.read().daemon_failing_since(&task).is_some();
        self.writing(|w| w.write_tasks(vec![t]))?;
        if report.last_status == TaskStatus::Stopped {
            // The host's faults (a daemon that did not answer or failed under it, a drain, a
            // replacement) are not the task's, nor is a stop that was asked for: they do not count toward its
            // service's crash-loop hold-back or its deployment's circuit breaker.
            let failed = task.desired_status != TaskStatus::Stopped
                && !daemon_failed
                && !matches!(
                    code,
                    Some(
                        StopCode::UserInitiated
                            | StopCode::ServiceSchedulerInitiated
                            | StopCode::HostReplaced
                            | StopCode::HostDrained
                            | StopCode::MpsDaemonUnavailable
                    )
                );
            if let (true, Some(g)) = (failed, &task.group) {
                self.work.service_failures.entry(g.clone()).or_default().push_back(now);
                self.note_service_failure(&task, reason.as_deref().unwrap_or("no reason given"))?;
            }
            self.writer().ask_for_group(task.group.as_ref());
        } else if was != now_state {
            // Turned healthy (or stopped being): the rollout may take its next step.
            self.writer().ask_for_group(task.group.as_ref());
        }
        self.read().task(id)
    }

    /// What a heartbeat is answered with: the host's pool's health policy.
    pub(super) fn status_answer(&self, ix: HostIx) -> HostStatusAnswer {
        let pool = &self.state.hosts()[ix as usize].host().pool;
        let health_policy =
            self.state.pools().get(pool).map(|p| p.value.health_policy.clone()).unwrap_or_default();
        let entry = &self.state.hosts()[ix as usize];
        HostStatusAnswer {
            health_policy,
            cluster_ca_sha256: self.state.cas().to_vec(),
            rechecks: entry.host().rechecks,
            checks_rev: entry.checks_rev,
            faults: faults_for(&self.state, &entry.host().id),
        }
    }

    /// A heartbeat that commits nothing and leaves remediation nothing to do, applied in
    /// memory: the host's report is kept and its health re-evaluated, exactly as
    /// [`Cluster::host_status`] would. Answers `None`, changing nothing, when it would
    /// commit (onboarding, a changed health status, a new incident) or while an unresolved
    /// incident is about this host or names it as a replacement (remediation then runs with it).
    pub fn quiet_heartbeat(
        &mut self,
        host: &HostId,
        report: &HostStatusReport,
    ) -> Result<Option<HostStatusAnswer>, Error> {
        let ix = self.read().host_ix_of(host)?;
        let e = &self.state.hosts()[ix as usize];
        if !e.holds_checks_of(report) {
            // It repeats checks this server does not hold (it restarted, or is a new leader):
            // nothing is taken from it, and the answer, without `checksRev`, asks for them.
            return Ok(Some(HostStatusAnswer { checks_rev: None, ..self.status_answer(ix) }));
        }
        if (report.onboarded && e.host().status == HostStatus::Onboarding)
            || (!report.checks_unchanged
                && !mpsfleet_core::changes::local_restarts(&e.checks, &report.checks).is_empty())
        {
            return Ok(None);
        }
        let now = self.now();
        if report.checks_unchanged
            && health::evaluation_holds(&self.state, ix, self.work.health_due_ms[ix as usize], now)
        {
            // The checks it was evaluated from, its agent heard from in time, and no time has
            // come at which they could evaluate otherwise (`health_due_ms`): evaluating them
            // with this heartbeat gives the health the host has, but for the time of the
            // agent's last heartbeat. Remediation, which watches this host if an incident is
            // about it, has nothing new to see.
            let entry = self.state.host_mut(ix);
            entry.last_heartbeat_ms = Some(now);
            entry.keep_reported(report);
            // `AGENT` is the first check of an evaluation.
            if let Some(c) = entry.health.checks.first_mut() {
                c.reported_since_ms = now;
            }
            return Ok(Some(self.status_answer(ix)));
        }
        // A heartbeat of a host an unresolved incident is about (the bad host, its replacement)
        // is taken in full: what it changes asks for the incidents at once.
        if self.state.incidents().engages(host) {
            return Ok(None);
        }
        let same_checks = || report.checks_unchanged || e.checks_match(&report.checks);
        if e.evaluated && same_checks() && health::stays_healthy(&self.state, ix, now) {
            // The same checks, all OK: evaluating them with this heartbeat gives the health the
            // host has, but for the time of the agent's last heartbeat.
            let entry = self.state.host_mut(ix);
            entry.last_heartbeat_ms = Some(now);
            entry.take_checks(report, now);
            entry.keep_reported(report);
            // `AGENT` is the first check of an evaluation.
            if let Some(c) = entry.health.checks.first_mut() {
                c.reported_since_ms = now;
            }
            return Ok(Some(self.status_answer(ix)));
        }
        let (checks, reported_at) = match report.checks_unchanged {
            true => (e.checks.as_slice(), e.checks_at_ms),
            false => (report.checks.as_slice(), Some(now)),
        };
        let health = health::assess(&self.read(), ix, checks, Some(now), reported_at);
        if let Some(h) = &health {
            let declared_bad = matches!(h.verdict, mpsfleet_core::health::Verdict::DeclaredBad { .. });
            if h.status != e.host().health_status || declared_bad {
                return Ok(None);
            }
        }
        let entry = self.state.host_mut(ix);
        entry.last_heartbeat_ms = Some(now);
        entry.take_checks(report, now);
        entry.keep_reported(report);
        entry.evaluated = health.is_some();
        self.daemons_changed(ix);
        HostHealth::keep(&mut self.writer(), ix, health);
        Ok(Some(self.status_answer(ix)))
    }

    /// A heartbeat; `onboarded` moves an ONBOARDING host to ACTIVE. Answers with the host's
    /// pool's current health policy, which the agent applies to its MPS daemons.
    pub fn host_status(
        &mut self,
        host: &HostId,
        report: &HostStatusReport,
    ) -> Result<HostStatusAnswer, Error> {
        if let Some(answer) = self.quiet_heartbeat(host, report)? {
            return Ok(answer);
        }
        let ix = self.read().host_ix_of(host)?;
        let now = self.now();
        let revision = self.state.revision();
        let entry = self.state.host_mut(ix);
        let restarts = mpsfleet_core::changes::local_restarts(&entry.checks, entry.reported_checks(report));
        entry.last_heartbeat_ms = Some(now);
        entry.take_checks(report, now);
        let onboarded = report.onboarded;
        entry.keep_reported(report);
        entry.evaluated = false;
        let entry = &self.state.hosts()[ix as usize];
        if !restarts.is_empty() {
            let mut h = entry.host().clone();
            for ev in restarts {
                h.events.push(now, ev);
            }
            self.writing(|w| w.write_host(ix, h))?;
        }
        self.daemons_changed(ix);
        self.close_mps_gpus(ix, &[]);
        let entry = self.state.host_mut(ix);
        if onboarded && entry.host().status == HostStatus::Onboarding {
            let mut h = entry.host().clone();
            host_lifecycle::apply(&mut h, host_lifecycle::Event::Onboarded)
                .map_err(|e| Error::Conflict(format!("host {}: {e}", h.id)))?;
            self.writing(|w| w.write_host(ix, h))?;
        }
        self.writing(|w| HostHealth::reconcile(w, ix))?;
        // What this heartbeat changed (a new incident, a health status, an onboarded
        // replacement) asks for the incidents, which the controllers plan at once (the server
        // wakes them after this call); a heartbeat that committed nothing leaves them to
        // their own requeue.
        if self.state.revision() != revision {
            self.writer().ask_incidents();
        }
        Ok(self.status_answer(ix))
    }

    /// A daemon failed (at its first exit, or once its failure is confirmed: the pool's
    /// `restartCopies`) or answers again: the `restart` services with tasks on its GPU are
    /// asked for, at once, to start copies elsewhere now (or to stop the extras).
    pub(super) fn daemons_changed(&mut self, ix: HostIx) {
        let entry = &self.state.hosts()[ix as usize];
        // The pool is looked up only while a check reports a failure (not on every heartbeat).
        let first_exit = entry.checks.iter().any(|c| c.first_failure_age_ms.is_some())
            && (self.state.pools().get(&entry.host().pool))
                .is_none_or(|p| p.value.restart_copies == RestartCopies::FirstExit);
        let now = failed_daemons(&entry.checks, &entry.failed_daemons, first_exit);
        if now == entry.failed_daemons {
            return;
        }
        let changed: BTreeSet<GpuUuid> = now.symmetric_difference(&entry.failed_daemons).cloned().collect();
        if now.is_empty() {
            self.work.failed_daemon_hosts.remove(&ix);
        } else {
            self.work.failed_daemon_hosts.insert(ix);
        }
        let since = match (entry.failed_daemons_since_ms, now.is_empty()) {
            (_, true) => None,
            (Some(at), false) => Some(at),
            (None, false) => Some(self.now()),
        };
        let newly = now.difference(&entry.failed_daemons).count();
        for g in now.difference(&entry.failed_daemons) {
            mpsfleet_core::timeline!("daemon-failed", host = entry.host().id, gpu = g);
        }
        let e = self.state.host_mut(ix);
        e.failed_daemons = now;
        e.failed_daemons_since_ms = since;
        let services: BTreeSet<ServiceName> = self
            .state
            .tasks()
            .on_host(ix)
            .iter()
            .filter_map(|id| self.state.tasks().get(id))
            .filter(|e| e.task.gpu_ids.iter().any(|g| changed.contains(g)))
            .filter_map(|e| e.task.group.clone())
            .collect();
        for s in services {
            self.ask_now(Work::Service(s));
        }
        if newly > 0 {
            // No new MPS task there while it fails (nor its replicas' copies).
            self.close_mps_gpus(ix, &[]);
        }
        self.recover_exits_on(ix, &changed);
    }

    /// A daemon's failure just confirmed: the replicas that exited on its GPU shortly before
    /// (their processes died with it, reported before the failure was known) were lost to
    /// it, so their services' waiting replacements are recovery (`Task::recovery_from`) and
    /// may make room in a full pool. Best effort: a failed write leaves them ordinary starts.
    fn recover_exits_on(&mut self, ix: HostIx, confirmed: &BTreeSet<GpuUuid>) {
        let now = self.now();
        let host = self.state.hosts()[ix as usize].host().id.clone();
        let exits = std::mem::take(&mut self.state.host_mut(ix).recent_exits);
        let (theirs, keep): (Vec<_>, Vec<_>) = exits.into_iter().partition(|(g, _, _)| confirmed.contains(g));
        self.state.host_mut(ix).recent_exits = keep;
        let mut lost: BTreeMap<ServiceName, Vec<u64>> = BTreeMap::new();
        for (_, svc, at) in theirs {
            if at + EXIT_BEFORE_CONFIRMATION_MS >= now {
                lost.entry(svc).or_default().push(at);
            }
        }
        let mut marked = Vec::new();
        for (svc, times) in lost {
            // Not the tasks' failures: out of the crash-loop hold-back's count.
            if let Some(f) = self.work.service_failures.get_mut(&svc) {
                for at in &times {
                    if let Some(i) = f.iter().position(|x| x == at) {
                        f.remove(i);
                    }
                }
            }
            let waiting: Vec<Task> = (self.state.tasks().of_service(&svc).iter())
                .filter_map(|id| self.state.tasks().get(id))
                .filter(|e| e.task.host_id.is_none() && e.task.recovery_from.is_none())
                .filter(|e| e.task.desired_status != TaskStatus::Stopped)
                .take(times.len())
                .map(|e| Task { recovery_from: Some(host.clone()), ..e.task.clone() })
                .collect();
            // Those not replaced yet (held back) are replaced as recovery when they are.
            for _ in waiting.len()..times.len() {
                self.state.note_lost_replica(&svc, host.clone(), now);
            }
            marked.extend(waiting);
            self.ask(Work::Service(svc));
        }
        let pools: BTreeSet<PoolName> = marked.iter().map(|t| t.pool.clone()).collect();
        if let Err(e) = self.writing(|w| w.write_tasks(marked)) {
            tracing::warn!(host.id = %host, "replacements not marked as recovery: {e}");
        }
        for p in pools {
            self.ask(Work::Placement(p));
        }
    }
}

/// How long before its daemon's failure is confirmed a replica's exit counts as the daemon's
/// (the local restarts, probes and report the confirmation waits for, with room to spare).
const EXIT_BEFORE_CONFIRMATION_MS: u64 = 30_000;

impl Cluster {
    /// Registers hosts, each for the caller beside it, with one store commit. Each request is
    /// checked against the state and
    /// the earlier requests of the list (of two claiming one GPU, the second is refused); one
    /// that fails its checks gets its error and does not affect the others. The ones that pass
    /// are committed as one batch and indexed only after the commit returns. Should that commit
    /// fail, each is committed on its own, so that one record's failure fails only its request.
    /// Answers are in the order of `requests`.
    pub fn register_hosts(
        &mut self,
        requests: Vec<(Principal, HostRequest)>,
    ) -> Vec<Result<RegisterHostResponse, Error>> {
        let mut out: Vec<Result<RegisterHostResponse, Error>> = Vec::with_capacity(requests.len());
        let mut batch = HostBatch::default();
        // Incidents whose replacement registers in this batch, with the updated record.
        let mut bound: Vec<Incident> = Vec::new();
        for (slot, (who, req)) in requests.into_iter().enumerate() {
            // A placeholder until the batch is committed.
            out.push(Err(Error::Internal("registration not committed".into())));
            let binding = match &who {
                Principal::Replacement(incident) if bound.iter().any(|i| &i.id == incident) => {
                    out[slot] = Err(Error::Unauthorized("this replacement token was already used"));
                    continue;
                }
                Principal::Replacement(incident) => {
                    match bind_replacement(&self.state, incident, &req.id, &req.reg.pool) {
                        Ok(i) => i,
                        Err(e) => {
                            out[slot] = Err(e);
                            continue;
                        }
                    }
                }
                _ => None,
            };
            let admitted =
                self.admit_host(&who, req, &batch).and_then(|(host, answer)| batch.add(host, answer, slot));
            match admitted {
                Err(e) => out[slot] = Err(e),
                Ok(()) => bound.extend(binding),
            }
        }
        if batch.members.is_empty() {
            return out;
        }
        let mut ops: Vec<Op> = batch.members.iter().map(|m| m.op.clone()).collect();
        for i in &bound {
            let version = self.state.incidents().get(&i.id).map_or(0, |v| v.version);
            match Op::put_json(super::kinds::INCIDENT, i.id.clone(), i, Precondition::Version(version)) {
                Ok(op) => ops.push(op),
                Err(e) => {
                    // Never a replacement without its binding: nothing of this batch commits.
                    tracing::error!(incident.id = %i.id, error = %e, "encoding a replacement binding failed");
                    for m in &batch.members {
                        out[m.slot] = Err(Error::Internal(format!("encoding a replacement binding: {e}")));
                    }
                    return out;
                }
            }
        }
        match self.write(&ops, bound.iter().map(spend_replacement_token)) {
            Ok(rev) => {
                for m in batch.members {
                    out[m.slot] = self.index_host(m.host, rev).map(|_| m.answer);
                }
            }
            Err(e) if batch.members.len() == 1 => {
                let slot = batch.members[0].slot;
                out[slot] = Err(e);
            }
            Err(_) => {
                for m in batch.members {
                    // A replacement commits with its incident's binding, or not at all.
                    let binding =
                        bound.iter().position(|i| i.is_replacement(&m.host.id)).map(|k| bound.remove(k));
                    let mut ops = vec![m.op.clone()];
                    if let Some(i) = &binding {
                        let version = self.state.incidents().get(&i.id).map_or(0, |v| v.version);
                        match Op::put_json(
                            super::kinds::INCIDENT,
                            i.id.clone(),
                            i,
                            Precondition::Version(version),
                        ) {
                            Ok(op) => ops.push(op),
                            Err(e) => {
                                out[m.slot] = Err(e.into());
                                continue;
                            }
                        }
                    }
                    out[m.slot] = match self.write(&ops, binding.iter().map(spend_replacement_token)) {
                        Ok(rev) => self.index_host(m.host, rev).map(|_| m.answer),
                        Err(e) => Err(e),
                    };
                }
            }
        }
        out
    }
}

impl Cluster {
    /// `host recheck`: the operator fixed what made the agent's local repair give up (a daemon
    /// it stopped restarting). The host's recheck count goes up; its agent sees it in the next
    /// heartbeat answer and gives every daemon it gave up on a fresh restart budget, starting
    /// it again at once. The host's health then follows from its checks as usual (`host
    /// activate` returns a drained host to service once they are OK). Recorded on the open
    /// incident's timeline (OPERATOR_COMMAND, by) and in the host's events.
    pub fn recheck_host(&mut self, host: &str, by: &str) -> Result<(HostView, Option<Incident>), Error> {
        let ix = self.read().host_ix(host)?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if h.status == HostStatus::Deregistered {
            return Err(Error::Conflict(format!("host {} is deregistered: no agent runs it", h.id)));
        }
        let now = self.now();
        h.rechecks += 1;
        let what = "host recheck: the agent re-arms its local repair and restarts what it gave up on";
        h.events.push(now, ObjectEvent::new("RecheckRequested", format!("{what} (by {by})")));
        let incident = match open_incident_of(&self.state, &h.id).cloned() {
            Some(mut i) => {
                i.push(now, Step::OperatorCommand, what, Some(by.to_string()));
                self.writing(|w| write_host_and_incident(w, ix, h, i.clone()))?;
                Some(shown(&self.state, i))
            }
            None => {
                self.writing(|w| w.write_host(ix, h))?;
                None
            }
        };
        tracing::info!(host.id = %self.state.hosts()[ix as usize].host().id, by, "host recheck");
        Ok((self.read().host_view(ix), incident))
    }

    /// `host activate`: returns a repaired host to ACTIVE and schedulable. Refused, naming the
    /// checks, while any check is not OK. An open incident about the host is resolved (the
    /// host is healthy and in service again), cancelling a replacement in flight.
    pub fn activate_host(
        &mut self,
        host: &str,
        by: &str,
    ) -> Result<(HostView, Option<OperatorOutcome>), Error> {
        let ix = self.read().host_ix(host)?;
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
        if let Some(open) = open_incident_of(&self.state, &h.id).cloned() {
            let terminating = self.work.provider_progress.get(&open.id).is_some_and(|p| p.terminating);
            if terminating {
                return Err(Error::Conflict(format!(
                    "host {} is being terminated by the pool's provider (incident {}); it cannot return to service",
                    h.id, open.id
                )));
            }
            let mut i = open;
            i.push(now, Step::HostActivated, "host returned to ACTIVE by operator", Some(by.to_string()));
            let (replacement, job) = self.work.cancel_replacement(&mut i, now);
            mpsfleet_core::remediation::resolve(&mut i, now, "host is healthy and active again", by);
            // The host and the incident in one commit: the host is never active under an
            // incident that says it is being drained.
            self.writing(|w| write_host_and_incident(w, ix, activated, i.clone()))?;
            self.work.pending_jobs.extend(job);
            outcome = Some(OperatorOutcome { incident: shown(&self.state, i), replacement });
        } else if h.status != activated.status || h.cordoned {
            self.writing(|w| w.write_host(ix, activated))?;
        }
        self.writer().ask_placement_everywhere();
        Ok((self.read().host_view(ix), outcome))
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
        let ix = self.read().host_ix(host)?;
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
        let mut incident = match open_incident_of(&self.state, &h.id) {
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
        self.read().incident(&id)
    }

    /// `host revoke-credential`: the host's credential is refused from now on (a leaked one,
    /// say). Nothing else changes at once: the host stops reporting, and its pool's health
    /// policy takes it from there (an incident after the heartbeat grace; a managed pool
    /// replaces it). The machine joins again as a new host (`host forget` frees its GPUs).
    pub fn revoke_host_credential(&mut self, host: &str, by: &str) -> Result<HostView, Error> {
        let ix = self.read().host_ix(host)?;
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
        self.writing(|w| w.write_host(ix, h))?;
        tracing::warn!(host.id = %self.state.hosts()[ix as usize].host().id, by, "host credential revoked");
        Ok(self.read().host_view(ix))
    }

    /// `host forget`: a host that does not exist (a machine that is gone, or a registration
    /// made with the join token by someone else) leaves the fleet: DEREGISTERED, its tasks
    /// recorded as stopped, its credential revoked and its GPU UUIDs free for the machine that
    /// really has them. Refused while the host heartbeats (it exists) unless `force`.
    pub fn forget_host(&mut self, host: &str, force: bool, by: &str) -> Result<HostView, Error> {
        let ix = self.read().host_ix(host)?;
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
        Ok(self.read().host_view(ix))
    }
}

impl Cluster {
    /// A host whose machine is gone for good, known by its owner (`up`, whose hosts' directories
    /// are gone), leaves the fleet quietly: DEREGISTERED with `reason` in its events, its tasks
    /// recorded as stopped. No incident is opened; unlike `host forget`, the caller vouches that
    /// nothing runs it.
    pub fn retire_host(&mut self, id: &HostId, reason: &str) -> Result<(), Error> {
        let ix = self.read().host_ix(id.as_str())?;
        if self.state.hosts()[ix as usize].host().status == HostStatus::Deregistered {
            return Ok(());
        }
        self.writing(|w| w.deregister(ix, reason))?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        h.events.push(self.now(), ObjectEvent::new("Retired", reason));
        self.writing(|w| w.write_host(ix, h))
    }

    /// Brings one of `up`'s hosts back with another runtime (see the module's documentation):
    /// the caller has not started the host yet and vouches that nothing of it runs, so its
    /// tasks are recorded as STOPPED with `reason` (their services start them again, where
    /// the new runtime fits).
    pub fn change_local_host_runtime(
        &mut self,
        id: &HostId,
        runtime: RuntimeKind,
        version: Option<String>,
        plugins: RuntimePlugins,
        reason: &str,
    ) -> Result<(), Error> {
        let ix = self.read().host_ix(id.as_str())?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if h.runtime == runtime || h.status == HostStatus::Deregistered {
            return Ok(());
        }
        let now = self.now();
        let stopped: Vec<Task> = (self.state.tasks().values())
            .map(|e| &e.task)
            .filter(|t| t.host_id.as_ref() == Some(id) && t.last_status != TaskStatus::Stopped)
            .map(|t| {
                let mut t = self.read().stopped_record(t, StopCode::UserInitiated, reason);
                force_stop(&mut t);
                t.stopped_at_ms.get_or_insert(now);
                t
            })
            .collect();
        self.writing(|w| w.write_tasks(stopped))?;
        let what = format!("{} runtime, was {}: {reason}", runtime.as_str(), h.runtime.as_str());
        h.events.push(now, ObjectEvent::new("RuntimeChanged", what));
        h.runtime = runtime;
        h.runtime_version = version;
        h.plugins = plugins;
        self.writing(|w| w.write_host(ix, h))?;
        self.sched.set_runs_images(ix, runtime.runs_images());
        self.ask(Work::Placement(self.state.hosts()[ix as usize].host().pool.clone()));
        Ok(())
    }

    /// Records every task that ran on the pool's hosts (placed there and not STOPPED) as
    /// STOPPED by the user with `reason`, now. For after the hosts were stopped with their
    /// tasks while the server was down; a task still waiting for a host is left waiting.
    /// Returns how many were recorded.
    pub fn record_stopped_with_hosts(&mut self, pool: &str, reason: &str) -> Result<usize, Error> {
        let pool = self.read().pool(pool)?.name;
        let now = self.now();
        let stopped: Vec<Task> = (self.state.tasks().values())
            .map(|e| &e.task)
            .filter(|t| t.pool == pool && t.host_id.is_some() && t.last_status != TaskStatus::Stopped)
            .map(|t| {
                let mut t = self.read().stopped_record(t, StopCode::UserInitiated, reason);
                force_stop(&mut t);
                t.stopped_at_ms.get_or_insert(now);
                t
            })
            .collect();
        let n = stopped.len();
        self.writing(|w| w.write_tasks(stopped))?;
        Ok(n)
    }
}

impl Cluster {
    /// Where a host's agent serves its endpoint (logs, metrics), or why it cannot be asked.
    pub fn agent_endpoint(&self, h: &HostId) -> Result<AgentEndpoint, String> {
        let Some(ix) = self.sched.host(h) else { return Err(format!("host {h} is no longer registered")) };
        let e = &self.state.hosts()[ix as usize];
        if e.host().status == HostStatus::Deregistered {
            return Err(format!("host {h} is deregistered"));
        }
        e.logs_url
            .clone()
            .map(|url| AgentEndpoint {
                url,
                token: self.creds.agent_token(&e.host().id, &e.host().legacy_agent_token),
                cert_sha256: e.logs_cert.clone(),
            })
            .ok_or_else(|| format!("the agent of host {h} has not reported where it serves its endpoint"))
    }
}

impl Cluster {
    pub fn set_cordoned(&mut self, id: &str, cordoned: bool) -> Result<HostView, Error> {
        let ix = self.read().host_ix(id)?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if !cordoned && h.status == HostStatus::Draining {
            return Err(Error::Conflict(format!(
                "host {} is DRAINING: uncordon does not return it to service; once it is repaired (every \
                 check OK), run `mpsfleet host activate {}`",
                h.id, h.id
            )));
        }
        if h.cordoned != cordoned {
            h.cordoned = cordoned;
            self.writing(|w| w.write_host(ix, h))?;
        }
        Ok(self.read().host_view(ix))
    }

    pub(super) fn index_host(&mut self, host: Host, version: Revision) -> Result<HostIx, Error> {
        let now = self.now();
        self.work.host_joined(&host.pool, &host.hostname, now);
        let pool = self.sched.pool(host.pool.as_str()).ok_or_else(|| {
            Error::StoreCorrupt(format!("host {} names unknown pool {}", host.id, host.pool))
        })?;
        let ix = self
            .sched
            .add_host(HostSpec {
                id: host.id.clone(),
                pool,
                mps_available: host.mps_available,
                runs_images: host.runtime.runs_images(),
                gpus: host
                    .gpus
                    .iter()
                    .map(|g| GpuSpec { memory_mib: g.memory_mib, max_clients: g.max_mps_clients })
                    .collect(),
            })
            .map_err(|e| Error::invalid("gpus", e.to_string()))?;
        self.sched.set_schedulable(ix, can_place(&host));
        let pool = host.pool.clone();
        self.writer().apply(version, Change::NewHost(ix, host));
        self.ask_capacity(&pool);
        self.work.health_due_ms.push(0);
        Ok(ix)
    }

    /// One registration by `who`: its checks against the state and against the earlier
    /// registrations of its group commit (`batch`), and the host record it makes. The checks
    /// that need no state are in [`HostRequest::new`], done before the lock.
    pub(super) fn admit_host(
        &self,
        who: &Principal,
        req: HostRequest,
        batch: &register::HostBatch,
    ) -> Result<(Host, RegisterHostResponse), Error> {
        let pool = pool_name(&self.state, "pool", req.reg.pool.as_str())?;
        if let Principal::Launch { pool: launched_into, name } = who {
            if launched_into != &pool || name != &req.reg.hostname {
                return Err(Error::Forbidden(format!(
                    "this launch token registers host {name} into pool {launched_into}, not host {} into pool {pool}",
                    req.reg.hostname
                )));
            }
            if self.state.hosts().iter().any(|h| &h.host().hostname == name) || batch.claims_hostname(name) {
                return Err(Error::Unauthorized("this launch token was already used"));
            }
        }
        for g in &req.reg.gpus {
            if let Some(&holder) = self.state.gpu_hosts().get(&g.uuid) {
                let h = self.state.hosts()[holder as usize].host();
                return Err(Error::GpuTaken {
                    uuid: g.uuid.to_string(),
                    host: h.id.to_string(),
                    hostname: h.hostname.clone(),
                });
            }
            if batch.claims_gpu(&g.uuid) {
                return Err(Error::AlreadyExists { kind: "GPU", id: g.uuid.to_string() });
            }
        }
        if !self.read().room_for_gpus(batch, req.reg.gpus.len()) {
            return Err(Error::invalid(
                "gpus",
                format!("the cluster holds at most {} GPUs", mpsfleet_core::scheduler::MAX_GPUS),
            ));
        }
        if self.sched.host(&req.id).is_some() || batch.claims_id(&req.id) {
            return Err(Error::Conflict(format!("host id {} is taken; retry the request", req.id)));
        }
        let HostRequest { reg, id, credential, credential_sha256 } = req;
        let agent_token = self.creds.agent_token(&id, "");
        let mut host = Host {
            id: id.clone(),
            pool,
            hostname: reg.hostname,
            status: HostStatus::Onboarding,
            health_status: HealthStatus::Initializing,
            cordoned: false,
            emulated: reg.emulated,
            mps_available: reg.mps_available,
            gpus: reg.gpus,
            runtime: reg.runtime,
            runtime_version: reg.runtime_version,
            plugins: reg.plugins,
            platform: reg.platform,
            seq: (self.state.hosts().len() + batch.len()) as u64,
            registered_at_ms: self.now(),
            credential_sha256,
            credential_revoked_at_ms: None,
            legacy_agent_token: String::new(),
            events: History::new(),
            rechecks: 0,
        };
        let registered = format!(
            "registered by its agent: {} GPU(s){}, {} runtime",
            host.gpus.len(),
            if host.emulated { " (emulated)" } else { "" },
            host.runtime.as_str()
        );
        host.events.push(host.registered_at_ms, ObjectEvent::new("Registered", registered));
        Ok((host, RegisterHostResponse { host_id: id, credential, agent_token }))
    }

    /// Registers one host with `token` as its bearer (the join token, or an incident's
    /// one-time replacement token), as `POST /v1/agent/register` does.
    pub fn register_host_with_token(
        &mut self,
        reg: HostRegistration,
        token: &str,
    ) -> Result<RegisterHostResponse, Error> {
        let who = self.authenticate(token)?;
        if !who.may_join() {
            return Err(Error::Forbidden("this token cannot register hosts".into()));
        }
        let req = HostRequest::new(reg)?;
        self.register_hosts(vec![(who, req)])
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a registration went unanswered".into())))
    }

    // ---- hosts --------------------------------------------------------------------------

    /// Registers one host for the join token. The API checks and mints before it takes the
    /// cluster lock ([`HostRequest::new`]) and registers concurrent hosts with one commit
    /// ([`Cluster::register_hosts`]).
    pub fn register_host(&mut self, reg: HostRegistration) -> Result<RegisterHostResponse, Error> {
        let req = HostRequest::new(reg)?;
        self.register_hosts(vec![(Principal::Joiner, req)])
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a registration went unanswered".into())))
    }
}

/// The incident whose unspent replacement token has this digest: `Ok(None)` when the digest
/// is no replacement token at all; an error naming why when it was one and is not usable.
pub(super) fn replacement_incident(r: &Reader<'_>, digest: &str) -> Result<Option<String>, Error> {
    let Some(id) = r.state.replacement_tokens().get(digest) else { return Ok(None) };
    let Some(i) = r.state.incidents().get(id).map(|v| &v.value) else { return Ok(None) };
    let Some(b) = i.replacement.as_ref().filter(|_| i.has_replacement_token(digest)) else {
        return Ok(None);
    };
    if b.host_id.is_some() {
        return Err(Error::Unauthorized("this replacement token was already used"));
    }
    if b.revoked || i.state == IncidentState::Resolved {
        return Err(Error::Unauthorized("this replacement token was revoked: its incident ended"));
    }
    if r.now_ms >= b.expires_at_ms {
        return Err(Error::Unauthorized("this replacement token has expired"));
    }
    Ok(Some(id.clone()))
}

/// Binds a host that registered with the incident's replacement token: it becomes the
/// replacement, and the token is spent. Returns the updated incident for the caller to
/// commit with the host.
pub(super) fn bind_replacement(
    state: &State,
    incident: &str,
    host: &HostId,
    pool: &PoolName,
) -> Result<Option<Incident>, Error> {
    let Some(mut i) = state.incidents().get(incident).map(|v| v.value.clone()) else {
        return Ok(None);
    };
    if &i.pool != pool {
        return Err(Error::invalid(
            "pool",
            format!("a replacement token joins pool {}, the pool of incident {}, not {pool}", i.pool, i.id),
        ));
    }
    let Some(b) = i.replacement.as_mut() else { return Ok(None) };
    b.host_id = Some(host.clone());
    Ok(Some(i))
}

/// The server's evaluation of a host's checks, with the restart counts the agent reported.
pub(super) fn evaluated_checks(state: &State, ix: HostIx) -> Vec<HostCheck> {
    let e = &state.hosts()[ix as usize];
    let mut out = e.health.host_checks();
    for c in &mut out {
        if let Some(r) = e.checks.iter().find(|r| r.name == c.name && r.gpu_id == c.gpu_id) {
            c.restarts = r.restarts;
        }
    }
    out
}

impl<'a> Reader<'a> {
    /// [`Cluster::host_ix`] of an id already parsed (a heartbeat's): no copy, no second parse.
    pub(super) fn host_ix_of(&self, id: &HostId) -> Result<HostIx, Error> {
        self.sched.host(id).ok_or_else(|| Error::not_found("host", id.as_str()))
    }

    /// The tasks an agent should run (or stop), and the host's change epoch.
    pub fn assignments(&self, host: &HostId) -> Result<(u64, Assignments), Error> {
        let a = self.shared_assignments(host)?;
        let task_definitions = a.definitions.iter().map(|d| TaskDefinition::clone(d)).collect();
        Ok((
            a.epoch,
            Assignments {
                revision: a.epoch,
                tasks: a.tasks,
                task_definitions,
                allow_task_users: a.allow_task_users,
            },
        ))
    }

    /// [`Cluster::assignments`] with the definitions shared rather than copied, for a caller
    /// that encodes them after the lock: a definition may be 256 KiB, and every change wakes
    /// every host's long-poll.
    pub fn shared_assignments(&self, host: &HostId) -> Result<HostAssignments, Error> {
        let ix = self.host_ix(host.as_str())?;
        let e = &self.state.hosts()[ix as usize];
        let tasks: Vec<Task> = self
            .state
            .tasks()
            .on_host(ix)
            .iter()
            .filter_map(|id| self.state.tasks().get(id))
            .map(|t| t.task.clone())
            .collect();
        let refs: BTreeSet<TaskDefRef> = tasks.iter().map(|t| t.task_definition.clone()).collect();
        let task_definitions = refs
            .iter()
            .filter_map(|r| self.state.taskdefs().get(&(r.family.clone(), r.revision)))
            .map(|v| v.value.clone())
            .collect();
        let allow_task_users =
            self.state.pools().get(&e.host().pool).is_some_and(|p| p.value.allow_task_users);
        Ok(HostAssignments { epoch: e.epoch, tasks, definitions: task_definitions, allow_task_users })
    }

    /// Whether the scheduler has room for `gpus` more GPUs after the batch's.
    pub(super) fn room_for_gpus(&self, batch: &HostBatch, gpus: usize) -> bool {
        self.sched.gpu_count() + batch.gpu_count() + gpus <= MAX_GPUS
    }

    /// The hosts whose agents can be scraped (through `GET /v1/hosts/{id}/metrics`): every
    /// registered host with an endpoint, with its pool and hostname.
    pub fn metrics_targets(&self) -> Vec<(HostId, PoolName, String)> {
        self.state
            .hosts()
            .iter()
            .filter(|e| e.host().status != HostStatus::Deregistered && e.logs_url.is_some())
            .map(|e| (e.host().id.clone(), e.host().pool.clone(), e.host().hostname.clone()))
            .collect()
    }

    pub(super) fn host_ix(&self, id: &str) -> Result<HostIx, Error> {
        HostId::new(id).ok().and_then(|h| self.sched.host(&h)).ok_or_else(|| Error::not_found("host", id))
    }

    pub fn host_view(&self, ix: HostIx) -> HostView {
        let e = &self.state.hosts()[ix as usize];
        let gpus = self
            .sched
            .host_gpus(ix)
            .zip(&e.host().gpus)
            .map(|(g, inv)| {
                let s = self.sched.gpu(g);
                GpuView {
                    gpu_id: inv.uuid.clone(),
                    index: inv.index,
                    model: inv.model.clone(),
                    sharing_mode: s.mode(),
                    total_memory_mib: s.total_mib,
                    remaining_memory_mib: s.remaining_mib(),
                    client_count: s.clients,
                    max_clients: s.max_clients,
                    compute_percent_sum: s.compute_percent,
                }
            })
            .collect();
        HostView {
            id: e.host().id.clone(),
            pool: e.host().pool.clone(),
            hostname: e.host().hostname.clone(),
            status: e.host().status,
            health_status: e.host().health_status,
            cordoned: e.host().cordoned,
            emulated: e.host().emulated,
            mps_available: e.host().mps_available,
            runtime: e.host().runtime,
            runtime_version: e.host().runtime_version.clone(),
            plugins: e.host().plugins.clone(),
            platform: e.host().platform.clone(),
            gpus,
            gpu_use: if e.host().status == HostStatus::Deregistered { Vec::new() } else { e.gpu_use.clone() },
            task_count: self.state.tasks().on_host(ix).len() as u32,
            registered_at_ms: e.host().registered_at_ms,
            last_heartbeat_ms: e.last_heartbeat_ms,
            checks: if e.health.checks.is_empty() {
                e.checks.clone()
            } else {
                evaluated_checks(self.state, ix)
            },
            logs_url: e.logs_url.clone(),
            logs_cert_sha256: e.logs_cert.clone(),
            credential_revoked_at_ms: e.host().credential_revoked_at_ms,
            events: Default::default(),
        }
    }

    pub fn hosts(&self, pool: Option<&str>) -> Vec<HostView> {
        self.hosts_page(pool, false, 0, usize::MAX).0
    }

    /// Hosts `skip..skip + limit` in registration order (of `pool`; without the DEREGISTERED
    /// ones when `live`), and how many there are in all: only the page's views are built.
    pub fn hosts_page(
        &self,
        pool: Option<&str>,
        live: bool,
        skip: usize,
        limit: usize,
    ) -> (Vec<HostView>, usize) {
        let shown = |ix: &HostIx| {
            let h = self.state.hosts()[*ix as usize].host();
            pool.is_none_or(|p| h.pool.as_str() == p) && !(live && h.status == HostStatus::Deregistered)
        };
        let all = (0..self.state.hosts().len() as HostIx).filter(shown);
        let total = all.clone().count();
        (all.skip(skip).take(limit).map(|ix| self.host_view(ix)).collect(), total)
    }

    /// One host, with its events (lists leave them out).
    /// How host `id` stands for the tasks on it (ECS's task `connectivity`): whether its
    /// agent's heartbeats come within its pool's heartbeat grace, its last heartbeat, and its
    /// platform. None for an unknown host.
    pub fn agent_link(&self, id: &HostId) -> Option<AgentLink> {
        let ix = self.host_ix(id.as_str()).ok()?;
        let e = &self.state.hosts()[ix as usize];
        let grace = self
            .state
            .pools()
            .get(&e.host().pool)
            .map_or(0, |p| p.value.health_policy.agent_heartbeat_grace_ms);
        let connected = e.host().status != HostStatus::Deregistered
            && e.last_heartbeat_ms.is_some_and(|at| self.now_ms.saturating_sub(at) <= grace);
        Some(AgentLink {
            connected,
            last_heartbeat_ms: e.last_heartbeat_ms,
            platform: e.host().platform.clone(),
        })
    }

    pub fn host(&self, id: &str) -> Result<HostView, Error> {
        let ix = self.host_ix(id)?;
        Ok(HostView { events: self.state.hosts()[ix as usize].host().events.clone(), ..self.host_view(ix) })
    }
}
