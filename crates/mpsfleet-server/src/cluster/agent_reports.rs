//! What agents tell the server and ask of it: heartbeats (the quiet path that commits nothing,
//! and the full one that evaluates the host and may open an incident), the tasks a host should
//! run, and reports about those tasks, bounded in what they may store.

use super::controllers::health::{self, HostHealth};
use super::*;

impl Cluster {
    /// [`Cluster::host_ix`] of an id already parsed (a heartbeat's): no copy, no second parse.
    pub(super) fn host_ix_of(&self, id: &HostId) -> Result<HostIx, Error> {
        self.sched.host(id).ok_or_else(|| Error::not_found("host", id.as_str()))
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
        let ix = self.host_ix_of(host)?;
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
            self.write_host(ix, h)?;
        }
        self.daemons_changed(ix);
        self.close_mps_gpus(ix, &[]);
        let entry = self.state.host_mut(ix);
        if onboarded && entry.host().status == HostStatus::Onboarding {
            let mut h = entry.host().clone();
            host_lifecycle::apply(&mut h, host_lifecycle::Event::Onboarded)
                .map_err(|e| Error::Conflict(format!("host {}: {e}", h.id)))?;
            self.write_host(ix, h)?;
        }
        self.writing(|w| HostHealth::reconcile(w, ix))?;
        // What this heartbeat changed (a new incident, a health status, an onboarded
        // replacement) asks for the incidents, which the controllers plan at once (the server
        // wakes them after this call); a heartbeat that committed nothing leaves them to
        // their own requeue.
        if self.state.revision() != revision {
            self.ask_incidents();
        }
        Ok(self.status_answer(ix))
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
        let ix = self.host_ix_of(host)?;
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
        let health = health::assess(&self.reader(), ix, checks, Some(now), reported_at);
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

    /// What a heartbeat is answered with: the host's pool's health policy.
    pub(super) fn status_answer(&self, ix: HostIx) -> HostStatusAnswer {
        let pool = &self.state.hosts()[ix as usize].host().pool;
        let health_policy =
            self.state.pools().get(pool).map(|p| p.value.health_policy.clone()).unwrap_or_default();
        let entry = &self.state.hosts()[ix as usize];
        HostStatusAnswer {
            health_policy,
            cluster_ca_sha256: self.cluster_cas.clone(),
            rechecks: entry.host().rechecks,
            checks_rev: entry.checks_rev,
            faults: self.faults_for(&entry.host().id),
        }
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

    // ---- tasks --------------------------------------------------------------------------

    /// An agent's report about one of its tasks.
    pub fn report_task(
        &mut self,
        host: &HostId,
        id: &str,
        mut report: TaskStateReport,
    ) -> Result<Task, Error> {
        let task = self.task(id)?;
        if task.host_id.as_ref() != Some(host) {
            return Err(Error::Forbidden(format!("task {id} is not placed on host {host}")));
        }
        if let Some(output) = report.output.take() {
            self.keep_output(task.id, output, report.last_status == TaskStatus::Stopped);
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
        if t.last_status == TaskStatus::Running {
            t.started_at_ms.get_or_insert(now);
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
        let was = self.reader().replica_state(&task);
        let now_state = self.reader().replica_state(&t);
        self.writing(|w| w.write_tasks(vec![t]))?;
        if report.last_status == TaskStatus::Stopped {
            // The host's faults (a daemon that did not answer, a drain, a replacement) are not
            // the task's, nor is a stop that was asked for: they do not count toward its
            // service's crash-loop hold-back or its deployment's circuit breaker.
            let failed = task.desired_status != TaskStatus::Stopped
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
            self.ask_for_group(task.group.as_ref());
        } else if was != now_state {
            // Turned healthy (or stopped being): the rollout may take its next step.
            self.ask_for_group(task.group.as_ref());
        }
        self.task(id)
    }
}

/// The most containers, notes and network bindings one report may carry, and the longest text
/// of any of their fields: a task has at most 10 containers, each of which publishes at most
/// 100 ports.
const MAX_REPORTED_CONTAINERS: usize = 10;
const MAX_REPORTED_BINDINGS: usize = 200;
const MAX_REPORTED_INTERFACES: usize = 4;
const MAX_REPORTED_NOTES: usize = 16;
const MAX_REPORTED_TEXT: usize = 4096;

/// Bounds what an agent may store in a task's `containers` (the server keeps it).
pub(super) fn check_container_reports(containers: &[ContainerReport]) -> Result<(), Error> {
    if containers.len() > MAX_REPORTED_CONTAINERS {
        return Err(Error::invalid(
            "containers",
            format!("at most {MAX_REPORTED_CONTAINERS} containers, got {}", containers.len()),
        ));
    }
    for (i, c) in containers.iter().enumerate() {
        let texts = [
            Some(&c.name),
            c.image.as_ref(),
            c.image_digest.as_ref(),
            c.runtime_id.as_ref(),
            c.reason.as_ref(),
        ];
        let long = texts.into_iter().flatten().chain(&c.notes).find(|t| t.len() > MAX_REPORTED_TEXT);
        if let Some(t) = long {
            return Err(Error::invalid(
                format!("containers[{i}]"),
                format!("each text is at most {MAX_REPORTED_TEXT} bytes, got {}", t.len()),
            ));
        }
        if c.notes.len() > MAX_REPORTED_NOTES {
            return Err(Error::invalid(
                format!("containers[{i}].notes"),
                format!("at most {MAX_REPORTED_NOTES} notes, got {}", c.notes.len()),
            ));
        }
        if c.network_bindings.len() > MAX_REPORTED_BINDINGS {
            return Err(Error::invalid(
                format!("containers[{i}].networkBindings"),
                format!("at most {MAX_REPORTED_BINDINGS} bindings, got {}", c.network_bindings.len()),
            ));
        }
        if let Some(b) = c.network_bindings.iter().find(|b| b.bind_ip.len() > 64) {
            return Err(Error::invalid(
                format!("containers[{i}].networkBindings"),
                format!("bindIp is at most 64 bytes, got {}", b.bind_ip.len()),
            ));
        }
        if c.network_interfaces.len() > MAX_REPORTED_INTERFACES {
            return Err(Error::invalid(
                format!("containers[{i}].networkInterfaces"),
                format!("at most {MAX_REPORTED_INTERFACES} interfaces, got {}", c.network_interfaces.len()),
            ));
        }
        let long = c
            .network_interfaces
            .iter()
            .find(|n| n.attachment_id.len() > 128 || n.private_ipv4_address.len() > 64);
        if let Some(n) = long {
            return Err(Error::invalid(
                format!("containers[{i}].networkInterfaces"),
                format!(
                    "attachmentId is at most 128 bytes and privateIpv4Address at most 64, got {} and {}",
                    n.attachment_id.len(),
                    n.private_ipv4_address.len()
                ),
            ));
        }
    }
    Ok(())
}

/// The GPUs whose MPS daemon's failure is confirmed, after `checks`: reported IMPAIRED
/// (`mpsFailureThreshold` failures in a row, or local repair given up), or confirmed before
/// (`before`) and still failing in the agent's count (a daemon restarted and killed again
/// flips between OK and IMPAIRED; it is over once it has answered `mpsFailureThreshold`
/// probes in a row, when the agent drops the failure's first signal).
fn confirmed_failures(checks: &[HostCheck], before: &BTreeSet<GpuUuid>) -> BTreeSet<GpuUuid> {
    checks
        .iter()
        .filter(|c| c.name == mpsfleet_core::health::MPS_DAEMON)
        .filter(|c| {
            c.status == HealthStatus::Impaired
                || (c.first_failure_age_ms.is_some() && c.gpu_id.as_ref().is_some_and(|g| before.contains(g)))
        })
        .filter_map(|c| c.gpu_id.clone())
        .collect()
}

impl Cluster {
    /// A daemon's failure confirmed or over: the `restart` services with tasks on its GPU are
    /// asked for, to start copies elsewhere now (or to stop the extras once it answers again).
    fn daemons_changed(&mut self, ix: HostIx) {
        let entry = &self.state.hosts()[ix as usize];
        let now = confirmed_failures(&entry.checks, &entry.failed_daemons);
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
            self.ask(Work::Service(s));
        }
    }
}
