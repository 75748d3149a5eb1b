//! The task loop: turns assignments into running processes, watches and probes them, stops
//! them, and reports every change to the server.
//!
//! One thread owns the task table. Slow work (the MPS check before a start, launching, the
//! SIGTERM-then-SIGKILL stop) runs on short-lived worker threads that send their result back
//! as an [`Input`], so one hung daemon or slow stop never holds up the other tasks.
//!
//! Every record is written to `<tasks dir>/<task id>/record.json` before it is reported, and
//! reports are retried until the server acknowledges them: what happens while the server is
//! unreachable, or while the agent is down, is reported once both are back.

use crate::env::container_env;
use crate::mps::Supervisor;
use crate::runtime::probes::{ContainerProbes, ProbeEvent, ProbeRunner, Transition};
use crate::runtime::{
    task_state, AdoptedState, ContainerHandle, ContainerLaunch, ContainerState, ContainerView, ExecContext,
    Runtime, TaskPhase, DEFAULT_STOP_TIMEOUT,
};
use mpsfleet_client::{Client, ClientError};
use mpsfleet_core::clock::Clock;
use mpsfleet_types::api::Assignments;
use mpsfleet_types::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often running containers are looked at.
const TICK: Duration = Duration::from_millis(100);
/// The fail-closed check before an MPS task starts: this many retries, this far apart.
const MPS_CHECK_RETRIES: u32 = 2;
const MPS_CHECK_DELAY: Duration = Duration::from_millis(300);

/// The MPS supervisors by GPU.
#[derive(Clone, Default)]
pub struct Gpus {
    supervisors: BTreeMap<GpuUuid, Arc<Supervisor>>,
}

impl Gpus {
    pub fn new(supervisors: &BTreeMap<GpuUuid, Arc<Supervisor>>) -> Gpus {
        Gpus { supervisors: supervisors.clone() }
    }

    fn supervisor(&self, gpu: &GpuUuid) -> Option<&Arc<Supervisor>> {
        self.supervisors.get(gpu)
    }
}

/// What the task loop reacts to.
pub enum Input {
    Assignments(Assignments),
    Launched { id: TaskId, result: Result<BTreeMap<String, ContainerHandle>, (StopCode, String)> },
    Stopped { id: TaskId, states: BTreeMap<String, ContainerState> },
    Probe { id: TaskId, event: ProbeEvent },
    Shutdown { stop_tasks: bool },
}

/// What the server last acknowledged about a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reported {
    status: TaskStatus,
    health: TaskHealth,
    ready: bool,
}

/// The persisted record of one task on this host.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    task: Task,
    definition: TaskDefinition,
    /// PENDING while starting, RUNNING, STOPPING while being stopped, STOPPED.
    status: TaskStatus,
    health: TaskHealth,
    ready: bool,
    stop_code: Option<StopCode>,
    reason: Option<String>,
    reported: Option<Reported>,
}

impl Record {
    fn current(&self) -> Reported {
        Reported { status: self.status, health: self.health, ready: self.ready }
    }
}

/// A task in memory: its record and what only lives while the agent does.
struct Local {
    rec: Record,
    handles: BTreeMap<String, ContainerHandle>,
    /// Containers that are no longer running, and how they ended.
    ended: BTreeMap<String, ContainerState>,
    probes: Vec<ProbeRunner>,
    /// A launch or a stop is in flight on a worker thread.
    busy: bool,
    /// A stop asked for while a launch was in flight.
    stop_after_launch: Option<(StopCode, String)>,
    /// Startup checks that have not passed yet, by container.
    starting: BTreeSet<String>,
    not_ready: BTreeSet<String>,
}

pub struct TaskLoop {
    tx: Sender<Input>,
    thread: Option<JoinHandle<()>>,
}

impl TaskLoop {
    /// Loads the task table from `dir`, adopts the tasks that still run, and starts the loop.
    pub fn start(
        dir: PathBuf,
        runtime: Runtime,
        gpus: Gpus,
        client: Client,
        handle: tokio::runtime::Handle,
        clock: Arc<dyn Clock>,
    ) -> std::io::Result<TaskLoop> {
        std::fs::create_dir_all(&dir)?;
        let (tx, rx) = channel();
        let mut state = State {
            dir,
            runtime: Arc::new(runtime),
            gpus,
            client,
            handle,
            clock,
            tx: tx.clone(),
            tasks: BTreeMap::new(),
            assignments: None,
            report_after_ms: 0,
            report_backoff: TICK,
        };
        state.load();
        let thread = std::thread::Builder::new().name("tasks".into()).spawn(move || state.run(rx))?;
        Ok(TaskLoop { tx, thread: Some(thread) })
    }

    pub fn sender(&self) -> Sender<Input> {
        self.tx.clone()
    }

    /// Stops the loop; with `stop_tasks`, stops every task first and reports it.
    pub fn shutdown(mut self, stop_tasks: bool) {
        let _ = self.tx.send(Input::Shutdown { stop_tasks });
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct State {
    dir: PathBuf,
    runtime: Arc<Runtime>,
    gpus: Gpus,
    client: Client,
    handle: tokio::runtime::Handle,
    clock: Arc<dyn Clock>,
    tx: Sender<Input>,
    tasks: BTreeMap<TaskId, Local>,
    /// The last assignments received; None until the first answer.
    assignments: Option<Assignments>,
    report_after_ms: u64,
    report_backoff: Duration,
}

impl State {
    fn run(mut self, rx: Receiver<Input>) {
        let mut shutting_down: Option<bool> = None;
        loop {
            match rx.recv_timeout(TICK) {
                Ok(input) => {
                    if let Input::Shutdown { stop_tasks } = input {
                        shutting_down = Some(stop_tasks);
                    } else {
                        self.handle_input(input);
                    }
                    while let Ok(more) = rx.try_recv() {
                        match more {
                            Input::Shutdown { stop_tasks } => shutting_down = Some(stop_tasks),
                            other => self.handle_input(other),
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if let Some(stop_tasks) = shutting_down {
                self.shutdown(stop_tasks, &rx);
                return;
            }
            self.watch();
            self.report();
        }
    }

    fn record_path(&self, id: &TaskId) -> PathBuf {
        self.dir.join(id.to_string()).join("record.json")
    }

    fn persist(&self, rec: &Record) {
        let path = self.record_path(&rec.task.id);
        let res = std::fs::create_dir_all(path.parent().unwrap_or(&self.dir)).and_then(|()| {
            let bytes = serde_json::to_vec_pretty(rec).map_err(std::io::Error::other)?;
            crate::agent::write_atomic(&path, &bytes)
        });
        if let Err(e) = res {
            tracing::error!(task.id = %rec.task.id, error = %e, path = %path.display(), "cannot write the task record");
        }
    }

    fn container_dir(&self, id: &TaskId, container: &str) -> PathBuf {
        container_dir(&self.dir, id, container)
    }

    /// Loads the task table and adopts what still runs; exits that happened while the agent was
    /// down become STOPPED records, reported at the first chance.
    fn load(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path().join("record.json");
            let Ok(bytes) = std::fs::read(&path) else { continue };
            let rec: Record = match serde_json::from_slice(&bytes) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "unreadable task record; skipped");
                    continue;
                }
            };
            if rec.status == TaskStatus::Stopped && rec.reported.as_ref() == Some(&rec.current()) {
                continue; // finished and acknowledged: nothing left to do
            }
            let id = rec.task.id;
            let mut local = new_local(rec);
            if local.rec.status != TaskStatus::Stopped {
                for c in &local.rec.definition.container_definitions {
                    let dir = self.container_dir(&id, &c.name);
                    match self.runtime.adopt(&dir) {
                        Ok(AdoptedState::Running { handle, .. }) => {
                            local.handles.insert(c.name.clone(), handle);
                        }
                        Ok(AdoptedState::Exited(exit)) => {
                            local.ended.insert(c.name.clone(), ContainerState::Exited(exit));
                        }
                        Ok(AdoptedState::Lost { reason }) => {
                            local.ended.insert(c.name.clone(), ContainerState::Lost { reason });
                        }
                        Err(e) => {
                            local
                                .ended
                                .insert(c.name.clone(), ContainerState::Lost { reason: e.to_string() });
                        }
                    }
                }
                tracing::info!(task.id = %id, running = local.handles.len(), ended = local.ended.len(), "adopted");
            }
            let was_starting = local.rec.status == TaskStatus::Pending;
            self.tasks.insert(id, local);
            if was_starting {
                self.begin_stop(
                    id,
                    StopCode::TaskFailedToStart,
                    "the agent restarted while starting the task".into(),
                );
            } else if self.tasks.get(&id).is_some_and(|l| l.rec.status == TaskStatus::Running) {
                self.start_probes(id);
            }
        }
    }

    fn handle_input(&mut self, input: Input) {
        match input {
            Input::Assignments(a) => self.reconcile(a),
            Input::Launched { id, result } => self.launched(id, result),
            Input::Stopped { id, states } => self.stopped(id, states),
            Input::Probe { id, event } => self.probe_event(id, event),
            Input::Shutdown { .. } => {}
        }
    }

    /// Compares what the server assigns with what runs here.
    fn reconcile(&mut self, a: Assignments) {
        let defs: BTreeMap<TaskDefRef, &TaskDefinition> =
            a.task_definitions.iter().map(|d| (d.reference(), d)).collect();
        let assigned: BTreeSet<TaskId> = a.tasks.iter().map(|t| t.id).collect();
        for t in &a.tasks {
            if let Some(local) = self.tasks.get_mut(&t.id) {
                if t.desired_status == TaskStatus::Stopped && local.rec.status != TaskStatus::Stopped {
                    let code = t.stop_code.unwrap_or(StopCode::UserInitiated);
                    let reason = t.stopped_reason.clone().unwrap_or_else(|| "stopped by the server".into());
                    if local.busy && local.rec.status == TaskStatus::Pending {
                        local.stop_after_launch = Some((code, reason));
                    } else if !local.busy {
                        self.begin_stop(t.id, code, reason);
                    }
                }
                continue;
            }
            let Some(def) = defs.get(&t.task_definition) else {
                tracing::error!(task.id = %t.id, taskdef = %t.task_definition, "assignment without its task definition");
                continue;
            };
            let mut rec = Record {
                task: t.clone(),
                definition: (*def).clone(),
                status: TaskStatus::Pending,
                health: TaskHealth::Unknown,
                ready: false,
                stop_code: None,
                reason: None,
                reported: None,
            };
            if t.desired_status == TaskStatus::Stopped {
                rec.status = TaskStatus::Stopped;
                rec.stop_code = Some(t.stop_code.unwrap_or(StopCode::UserInitiated));
                rec.reason = Some("stopped before it started".into());
            } else if t.last_status > TaskStatus::Pending {
                // The server thinks it started here, but this agent has no record of it (its
                // data dir was lost): say so rather than start it a second time.
                rec.status = TaskStatus::Stopped;
                rec.stop_code = Some(StopCode::HostLost);
                rec.reason = Some("the agent has no record of this task; its data dir was lost".into());
            }
            self.persist(&rec);
            let starting = rec.status == TaskStatus::Pending;
            self.tasks.insert(t.id, new_local(rec));
            if starting {
                self.begin_launch(t.id);
            }
        }
        // Running here but no longer assigned: the server has stopped it.
        let orphans: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(id, l)| !assigned.contains(id) && l.rec.status == TaskStatus::Running && !l.busy)
            .map(|(id, _)| *id)
            .collect();
        for id in orphans {
            self.begin_stop(
                id,
                StopCode::UserInitiated,
                "the server no longer assigns this task here".into(),
            );
        }
        self.assignments = Some(a);
    }

    /// Checks the MPS daemon (fail closed), then launches every container, on a worker thread.
    fn begin_launch(&mut self, id: TaskId) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        local.busy = true;
        let rec = local.rec.clone();
        let runtime = self.runtime.clone();
        let supervisor = match rec.definition.gpu_demand() {
            GpuDemand::Mps { .. } => {
                let gpu = rec.task.gpu_ids.first();
                let label = gpu.map_or_else(|| "(none assigned)".to_string(), ToString::to_string);
                Some((label, gpu.and_then(|g| self.gpus.supervisor(g).cloned())))
            }
            _ => None,
        };
        let dirs: Vec<PathBuf> =
            rec.definition.container_definitions.iter().map(|c| self.container_dir(&id, &c.name)).collect();
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            let result = launch(&runtime, &rec, supervisor, &dirs);
            let _ = tx.send(Input::Launched { id, result });
        });
    }

    fn launched(
        &mut self,
        id: TaskId,
        result: Result<BTreeMap<String, ContainerHandle>, (StopCode, String)>,
    ) {
        let now = self.clock.now_ms();
        let Some(local) = self.tasks.get_mut(&id) else { return };
        local.busy = false;
        match result {
            Ok(handles) => {
                local.handles = handles;
                local.rec.status = TaskStatus::Running;
                local.rec.task.started_at_ms = Some(now);
                let probes: Vec<(String, bool, bool)> = local
                    .rec
                    .definition
                    .container_definitions
                    .iter()
                    .map(|c| (c.name.clone(), c.startup_check.is_some(), c.readiness_check.is_some()))
                    .collect();
                local.starting = probes.iter().filter(|p| p.1).map(|p| p.0.clone()).collect();
                local.not_ready = probes.iter().filter(|p| p.1 || p.2).map(|p| p.0.clone()).collect();
                local.rec.ready = local.not_ready.is_empty();
                let rec = local.rec.clone();
                let pending_stop = local.stop_after_launch.take();
                self.persist(&rec);
                tracing::info!(task.id = %id, "running");
                match pending_stop {
                    Some((code, reason)) => self.begin_stop(id, code, reason),
                    None => self.start_probes(id),
                }
            }
            Err((code, reason)) => {
                tracing::warn!(task.id = %id, code = code.as_str(), %reason, "not started");
                local.rec.status = TaskStatus::Stopped;
                local.rec.stop_code = Some(code);
                local.rec.reason = Some(reason);
                let rec = local.rec.clone();
                self.persist(&rec);
            }
        }
    }

    fn start_probes(&mut self, id: TaskId) {
        let clock = self.clock.clone();
        let tx = self.tx.clone();
        let Some(local) = self.tasks.get_mut(&id) else { return };
        for c in &local.rec.definition.container_definitions {
            let probes = match ContainerProbes::from_definition(c) {
                Ok(p) if p.is_empty() => continue,
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(task.id = %id, container = %c.name, error = %e, "probes not started");
                    continue;
                }
            };
            let env = container_env(&local.rec.task, c, None);
            let ctx = match ExecContext::new(&env, c.user.as_deref()) {
                Ok(ctx) => ctx,
                Err(e) => {
                    tracing::error!(task.id = %id, container = %c.name, error = %e, "probes not started");
                    continue;
                }
            };
            let tx = tx.clone();
            let sink = move |event| {
                let _ = tx.send(Input::Probe { id, event });
            };
            match ProbeRunner::start(c.name.clone(), probes, ctx, clock.clone(), sink) {
                Ok(r) => local.probes.push(r),
                Err(e) => {
                    tracing::error!(task.id = %id, container = %c.name, error = %e, "probes not started")
                }
            }
        }
    }

    fn probe_event(&mut self, id: TaskId, event: ProbeEvent) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if local.rec.status != TaskStatus::Running {
            return;
        }
        let container = event.container;
        let stop = match event.transition {
            Transition::StartupPassed => {
                local.starting.remove(&container);
                let has_readiness = local
                    .rec
                    .definition
                    .container_definitions
                    .iter()
                    .any(|c| c.name == container && c.readiness_check.is_some());
                if !has_readiness {
                    local.not_ready.remove(&container);
                }
                None
            }
            Transition::StartupFailed { reason } => Some((
                StopCode::Unhealthy,
                format!("startup check of container {container} failed: {reason}"),
            )),
            Transition::Ready => {
                local.not_ready.remove(&container);
                None
            }
            Transition::NotReady { .. } => {
                local.not_ready.insert(container);
                None
            }
            Transition::Healthy => {
                local.rec.health = TaskHealth::Healthy;
                None
            }
            Transition::Unhealthy { reason } => {
                local.rec.health = TaskHealth::Unhealthy;
                Some((StopCode::Unhealthy, format!("health check of container {container} failed: {reason}")))
            }
        };
        local.rec.ready = local.not_ready.is_empty() && local.starting.is_empty();
        let rec = local.rec.clone();
        self.persist(&rec);
        if let Some((code, reason)) = stop {
            self.begin_stop(id, code, reason);
        }
    }

    /// Looks at every running task: an essential container that exited stops the task.
    fn watch(&mut self) {
        let mut to_stop = Vec::new();
        for (id, local) in self.tasks.iter_mut() {
            if local.rec.status != TaskStatus::Running || local.busy {
                continue;
            }
            let names: Vec<String> = local.handles.keys().cloned().collect();
            for name in names {
                let state = match local.handles.get(&name) {
                    Some(h) => self.runtime.status(h),
                    None => continue,
                };
                if !state.is_running() {
                    local.handles.remove(&name);
                    local.ended.insert(name, state);
                }
            }
            if let TaskPhase::Stopped { code, reason } = phase(local) {
                to_stop.push((*id, code, reason));
            }
        }
        for (id, code, reason) in to_stop {
            self.begin_stop(id, code, reason);
        }
    }

    /// Stops what still runs of a task (terminate_client first for MPS clients), on a worker
    /// thread; the first stop reason wins.
    fn begin_stop(&mut self, id: TaskId, code: StopCode, reason: String) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if local.busy || local.rec.status == TaskStatus::Stopped {
            return;
        }
        local.busy = true;
        local.rec.stop_code.get_or_insert(code);
        local.rec.reason.get_or_insert(reason);
        local.rec.status = TaskStatus::Stopping;
        for p in local.probes.drain(..) {
            drop(p);
        }
        let rec = local.rec.clone();
        let handles: Vec<(String, ContainerHandle, Duration)> = local
            .handles
            .iter()
            .map(|(name, h)| {
                let timeout = rec
                    .definition
                    .container_definitions
                    .iter()
                    .find(|c| &c.name == name)
                    .and_then(|c| c.stop_timeout)
                    .map_or(DEFAULT_STOP_TIMEOUT, |s| Duration::from_secs(u64::from(s)));
                (name.clone(), h.clone(), timeout)
            })
            .collect();
        self.persist(&rec);
        let supervisor = match rec.definition.gpu_demand() {
            GpuDemand::Mps { .. } => rec.task.gpu_ids.first().and_then(|g| self.gpus.supervisor(g).cloned()),
            _ => None,
        };
        let runtime = self.runtime.clone();
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            if let Some(s) = &supervisor {
                terminate_clients(s, handles.iter().filter_map(|(_, h, _)| h.pid()));
            }
            let mut states = BTreeMap::new();
            for (name, handle, timeout) in handles {
                let state = match runtime.stop(&handle, timeout) {
                    Ok(outcome) => outcome.state,
                    Err(e) => ContainerState::Lost { reason: format!("stop failed: {e}") },
                };
                states.insert(name, state);
            }
            let _ = tx.send(Input::Stopped { id, states });
        });
    }

    fn stopped(&mut self, id: TaskId, states: BTreeMap<String, ContainerState>) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        local.busy = false;
        local.handles.clear();
        local.ended.extend(states);
        local.rec.status = TaskStatus::Stopped;
        local.rec.ready = false;
        let rec = local.rec.clone();
        tracing::info!(task.id = %id, code = ?rec.stop_code, reason = ?rec.reason, "stopped");
        self.persist(&rec);
    }

    /// Reports every task whose state the server has not acknowledged yet.
    fn report(&mut self) {
        let now = self.clock.now_ms();
        if now < self.report_after_ms {
            return;
        }
        let due: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, l)| reportable(l.rec.status) && l.rec.reported.as_ref() != Some(&l.rec.current()))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(local) = self.tasks.get(&id) else { continue };
            let rec = &local.rec;
            let report = TaskStateReport {
                last_status: rec.status,
                health_status: Some(rec.health),
                ready: Some(rec.ready),
                stop_code: if rec.status == TaskStatus::Stopped { rec.stop_code } else { None },
                stopped_reason: if rec.status == TaskStatus::Stopped { rec.reason.clone() } else { None },
            };
            let client = self.client.clone();
            let result = self.handle.block_on(async move {
                tokio::time::timeout(Duration::from_secs(5), client.report_task(&id, &report)).await
            });
            let acknowledged = match result {
                Ok(Ok(_)) => true,
                // The server will never take this report (task gone, moved, or further along):
                // stop retrying it.
                Ok(Err(ClientError::Api { status, body })) if status != 503 && status < 500 => {
                    tracing::warn!(task.id = %id, code = %body.code, message = %body.message, "report refused");
                    true
                }
                Ok(Err(e)) => {
                    self.back_off(now, &e.to_string());
                    return;
                }
                Err(_) => {
                    self.back_off(now, "report timed out after 5s");
                    return;
                }
            };
            if acknowledged {
                self.report_backoff = TICK;
                if let Some(local) = self.tasks.get_mut(&id) {
                    local.rec.reported = Some(local.rec.current());
                    let rec = local.rec.clone();
                    self.persist(&rec);
                }
            }
        }
    }

    fn back_off(&mut self, now: u64, why: &str) {
        tracing::warn!(
            error = why,
            retry_in_ms = self.report_backoff.as_millis() as u64,
            "cannot report tasks"
        );
        self.report_after_ms = now + self.report_backoff.as_millis() as u64;
        self.report_backoff = (self.report_backoff * 2).min(Duration::from_secs(5));
    }

    fn shutdown(&mut self, stop_tasks: bool, rx: &Receiver<Input>) {
        for local in self.tasks.values_mut() {
            for p in local.probes.drain(..) {
                drop(p);
            }
        }
        if !stop_tasks {
            return;
        }
        let ids: Vec<TaskId> = self.tasks.keys().copied().collect();
        for id in ids {
            self.begin_stop(id, StopCode::UserInitiated, "the agent was stopped".into());
        }
        // Wait for the stops (bounded by the longest stop timeout), then report once.
        let limit = Duration::from_secs(130);
        let mut waited = Duration::ZERO;
        while self.tasks.values().any(|l| l.busy) && waited < limit {
            match rx.recv_timeout(TICK) {
                Ok(input) => self.handle_input(input),
                Err(RecvTimeoutError::Timeout) => waited += TICK,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.report_after_ms = 0;
        self.report();
    }
}

fn new_local(rec: Record) -> Local {
    Local {
        rec,
        handles: BTreeMap::new(),
        ended: BTreeMap::new(),
        probes: Vec::new(),
        busy: false,
        stop_after_launch: None,
        starting: BTreeSet::new(),
        not_ready: BTreeSet::new(),
    }
}

/// The task's phase from its containers.
fn phase(local: &Local) -> TaskPhase {
    let running = ContainerState::Running { pid: 0 };
    let views: Vec<ContainerView<'_>> = local
        .rec
        .definition
        .container_definitions
        .iter()
        .map(|c| ContainerView {
            name: &c.name,
            essential: c.essential,
            state: local.ended.get(&c.name).unwrap_or(&running),
        })
        .collect();
    task_state(&views)
}

/// Statuses the server is told about (starting is the server's PENDING already).
fn reportable(s: TaskStatus) -> bool {
    matches!(s, TaskStatus::Running | TaskStatus::Stopped)
}

/// Fail closed: an MPS task starts only when its GPU's daemon answers.
fn launch(
    runtime: &Runtime,
    rec: &Record,
    mps: Option<(String, Option<Arc<Supervisor>>)>,
    dirs: &[PathBuf],
) -> Result<BTreeMap<String, ContainerHandle>, (StopCode, String)> {
    let pipe_dir: Option<PathBuf> = match &mps {
        None => None,
        Some((gpu, None)) => {
            return Err((
                StopCode::MpsDaemonUnavailable,
                format!("no MPS daemon runs for GPU {gpu} on this host"),
            ))
        }
        Some((gpu, Some(s))) => {
            s.ensure_answering(MPS_CHECK_RETRIES, MPS_CHECK_DELAY).map_err(|e| {
                (StopCode::MpsDaemonUnavailable, format!("not started without MPS limits: GPU {gpu}: {e}"))
            })?;
            Some(s.pipe_dir().to_path_buf())
        }
    };
    let mut handles = BTreeMap::new();
    for (c, dir) in rec.definition.container_definitions.iter().zip(dirs) {
        let argv: Vec<String> = c.entry_point.iter().chain(&c.command).cloned().collect();
        let launch = ContainerLaunch {
            task_id: rec.task.id.to_string(),
            container: c.name.clone(),
            argv,
            env: container_env(&rec.task, c, pipe_dir.as_deref()),
            user: c.user.clone(),
            stop_timeout: c.stop_timeout.map_or(DEFAULT_STOP_TIMEOUT, |s| Duration::from_secs(u64::from(s))),
            state_dir: dir.clone(),
        };
        match runtime.launch(&launch) {
            Ok(h) => {
                handles.insert(c.name.clone(), h);
            }
            Err(e) => {
                for h in handles.values() {
                    let _ = runtime.stop(h, Duration::from_secs(5));
                }
                return Err((
                    StopCode::TaskFailedToStart,
                    format!("container {} failed to start: {e}", c.name),
                ));
            }
        }
    }
    Ok(handles)
}

/// Asks the MPS server to end the clients' GPU work before their processes are signalled.
/// Best effort: with no server (nothing used the GPU yet) there is nothing to end.
fn terminate_clients(s: &Supervisor, pids: impl Iterator<Item = u32>) {
    let Ok(list) = s.control("get_server_list") else { return };
    let servers: Vec<u32> = list.lines().filter_map(|l| l.trim().parse().ok()).collect();
    for pid in pids {
        for &server in &servers {
            let _ = s.terminate_client(server, pid);
        }
    }
}

/// The state directory (logs included) of a task's container under an agent's tasks dir.
pub fn container_dir(tasks_dir: &Path, id: &TaskId, container: &str) -> PathBuf {
    tasks_dir.join(id.to_string()).join("containers").join(container)
}
