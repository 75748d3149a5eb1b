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
//!
//! Who a task runs as is decided before it starts ([`TaskUsers`]): a process container whose
//! definition names a `user` starts only when the pool allows it (`allowTaskUsers`), and, when
//! the agent runs as root, a task with a process container that names none gets a uid of its
//! own from the range (kept in its record, so that an adopted task keeps it, and never given to
//! a second task while the first has not stopped) and its own directory for `HOME`, removed
//! when it stops. An MPS task (a process container without `user` given an MPS share) gets
//! instead the uid its GPU's MPS tasks share, one of the last uids of the range: an MPS
//! daemon runs one server at a time, for one uid, so MPS tasks of one GPU run at the same time
//! only under one uid.

use crate::env::container_env;
use crate::mps::Supervisor;
use crate::output::{LogTail, RecentOutput};
use crate::runtime::engine::{Adopted, Engine, Handle, Launch};
use crate::runtime::identity::{in_passwd, process_uids};
use crate::runtime::probes::ProbeTarget;
use crate::runtime::probes::{ContainerProbes, ProbeEvent, ProbeRunner, Transition};
use crate::runtime::shim::{EXIT_RECORD, OUTPUT_LOG, PROC_RECORD};
use crate::runtime::Settled;
use crate::runtime::{
    task_state, ContainerState, ContainerView, ExecContext, ExitRecord, TaskPhase, TaskUser, UidRange,
    DEFAULT_STOP_TIMEOUT,
};
use mpsfleet_client::{Client, ClientError};
use mpsfleet_core::backoff::Backoff;
use mpsfleet_core::clock::Clock;
use mpsfleet_core::lifecycle::dependencies::{self as deps, ContainerLife, LifeEvent};
use mpsfleet_types::api::Assignments;
use mpsfleet_types::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

mod users;
use users::{make_home, pick_user, release_user, HostUids, Pick};
pub use users::{MpsUid, TaskUsers};

/// How often running containers are looked at.
const TICK: Duration = Duration::from_millis(100);
/// The longest wait between tries of a report the server did not take.
const REPORT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The fail-closed check before an MPS task starts: this many retries, this far apart.
const MPS_CHECK_RETRIES: u32 = 2;
const MPS_CHECK_DELAY: Duration = Duration::from_millis(300);
/// A task's recent output goes with its reports when it changed, at most this often (and
/// always with the final STOPPED report).
pub const OUTPUT_REPORT_EVERY: Duration = Duration::from_secs(30);

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
    /// One container's launch ended.
    Launched {
        id: TaskId,
        container: String,
        result: Result<Box<Handle>, (StopCode, String)>,
    },
    Stopped {
        id: TaskId,
        states: BTreeMap<String, ContainerState>,
    },
    Probe {
        id: TaskId,
        event: ProbeEvent,
    },
    Shutdown {
        stop_tasks: bool,
    },
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
    /// The task's own uid and home, while it has them (see [`TaskUsers`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task_user: Option<TaskUser>,
    /// The uid of `task_user` is the one its GPU's MPS tasks share, not the task's alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    shared_uid: bool,
}

impl Record {
    /// A task just assigned: PENDING, nothing known of its health or user yet.
    fn new(task: Task, definition: TaskDefinition) -> Self {
        Record {
            task,
            definition,
            status: TaskStatus::Pending,
            health: TaskHealth::Unknown,
            ready: false,
            stop_code: None,
            reason: None,
            reported: None,
            task_user: None,
            shared_uid: false,
        }
    }

    fn current(&self) -> Reported {
        Reported { status: self.status, health: self.health, ready: self.ready }
    }
}

/// A task in memory: its record and what only lives while the agent does.
struct Local {
    rec: Record,
    handles: BTreeMap<String, Handle>,
    /// Each container as reported (runtime id, bindings, exit), and whether they changed since
    /// the server last took them.
    reports: BTreeMap<String, ContainerReport>,
    reports_unsent: bool,
    /// Containers that are no longer running, and how they ended.
    ended: BTreeMap<String, ContainerState>,
    probes: Vec<ProbeRunner>,
    /// A launch or a stop is in flight on a worker thread.
    busy: bool,
    /// A stop asked for while a launch was in flight.
    stop_after_launch: Option<(StopCode, String)>,
    /// Where each container stands in the start order (`dependsOn`), and the containers whose
    /// launch is in flight.
    lives: BTreeMap<String, ContainerLife>,
    launching: BTreeSet<String>,
    /// Startup checks that have not passed yet, by container.
    starting: BTreeSet<String>,
    not_ready: BTreeSet<String>,
    /// The task's recent output, and the log files that feed it.
    output: RecentOutput,
    tails: Vec<LogTail>,
    /// The output's sequence number and the time when it was last acknowledged.
    output_sent: Option<(u64, u64)>,
    /// Its image pulls on the loop's clock: the first one's start and the last one's end.
    pulls: Option<(u64, u64)>,
}

pub struct TaskLoop {
    tx: Sender<Input>,
    thread: Option<JoinHandle<()>>,
    /// Says why, when the loop ends without being asked to (it panicked, or its body failed).
    died: Option<tokio::sync::oneshot::Receiver<String>>,
    view: TasksView,
}

/// The tasks as the metrics see them, refreshed by the loop on every tick.
pub type TasksView = Arc<std::sync::Mutex<Vec<TaskGauge>>>;

/// One task of this host, for the agent's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskGauge {
    pub id: TaskId,
    pub status: TaskStatus,
    pub health: TaskHealth,
    pub ready: bool,
    pub gpus: Vec<mpsfleet_types::GpuUuid>,
    /// The MPS memory its containers declare (the limit each runs under), and how many MPS
    /// clients they are; None for a task that does not share its GPU.
    pub mps: Option<(u64, u32)>,
    /// Its containers' processes (a container's first one).
    pub pids: Vec<u32>,
}

/// How one container of a task is launched (a seam for tests; [`launch`] in production).
type LaunchFn = fn(
    &Engine,
    &Record,
    &ContainerDefinition,
    Option<(String, Option<Arc<Supervisor>>)>,
    &Path,
) -> Result<Handle, (StopCode, String)>;

impl TaskLoop {
    /// Loads the task table from `dir`, adopts the tasks that still run, and starts the loop.
    pub fn start(
        dir: PathBuf,
        runtime: Engine,
        gpus: Gpus,
        users: TaskUsers,
        client: Client,
        handle: tokio::runtime::Handle,
        clock: Arc<dyn Clock>,
    ) -> std::io::Result<TaskLoop> {
        crate::safe_fs::private_dir(&dir, 0o700)?;
        if users.range.is_some() {
            crate::safe_fs::private_dir(&users.home_root, 0o711)?;
        }
        let (tx, rx) = channel();
        let view = TasksView::default();
        let mut state = State {
            view: view.clone(),
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
            report_backoff: Backoff::new(TICK, REPORT_BACKOFF_MAX),
            launch,
            users,
            last_uid: None,
        };
        // Loading adopts containers, which asks Docker: a blocking call, so it runs on the
        // loop's own thread, never on the caller's (an async task).
        let mut l = TaskLoop::spawn(tx, rx, move |rx| {
            state.load();
            state.run(rx)
        })?;
        l.view = view;
        Ok(l)
    }

    /// The tasks as the loop last saw them.
    pub fn view(&self) -> TasksView {
        self.view.clone()
    }

    /// Runs `body` as the task loop thread. When it returns an error or panics, [`TaskLoop::died`]
    /// says why: the agent then exits rather than heartbeat while running nothing.
    pub fn spawn(
        tx: Sender<Input>,
        rx: Receiver<Input>,
        body: impl FnOnce(Receiver<Input>) -> Result<(), String> + Send + 'static,
    ) -> std::io::Result<TaskLoop> {
        let (died_tx, died) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new().name("tasks".into()).spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || body(rx)));
            let why = match outcome {
                Ok(Ok(())) => return,
                Ok(Err(e)) => format!("the task loop stopped: {e}"),
                Err(panic) => format!("the task loop panicked: {}", panic_message(&*panic)),
            };
            tracing::error!(error = %why, "task loop died");
            let _ = died_tx.send(why);
        })?;
        Ok(TaskLoop { tx, thread: Some(thread), died: Some(died), view: TasksView::default() })
    }

    /// Completes, with the reason, if the loop dies; never when it is shut down.
    pub fn died(&mut self) -> impl std::future::Future<Output = String> + Send + 'static {
        let died = self.died.take();
        async move {
            match died {
                Some(rx) => match rx.await {
                    Ok(why) => why,
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        }
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
    view: TasksView,
    dir: PathBuf,
    runtime: Arc<Engine>,
    gpus: Gpus,
    client: Client,
    handle: tokio::runtime::Handle,
    clock: Arc<dyn Clock>,
    tx: Sender<Input>,
    tasks: BTreeMap<TaskId, Local>,
    /// The last assignments received; None until the first answer.
    assignments: Option<Assignments>,
    report_after_ms: u64,
    report_backoff: Backoff,
    launch: LaunchFn,
    users: TaskUsers,
    /// The task uid handed out last: the next one is looked for after it, so that a uid is
    /// reused as late as possible.
    last_uid: Option<u32>,
}

impl State {
    fn run(mut self, rx: Receiver<Input>) -> Result<(), String> {
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
                Err(RecvTimeoutError::Disconnected) => return Err("its input channel closed".into()),
            }
            if let Some(stop_tasks) = shutting_down {
                self.shutdown(stop_tasks, &rx);
                return Ok(());
            }
            self.watch();
            self.report();
            self.publish();
        }
    }

    /// Refreshes the metrics' view of the tasks.
    fn publish(&self) {
        let view: Vec<TaskGauge> = self
            .tasks
            .values()
            .filter(|l| l.rec.status != TaskStatus::Stopped)
            .map(|l| TaskGauge {
                id: l.rec.task.id,
                status: l.rec.status,
                health: l.rec.health,
                ready: l.rec.ready,
                gpus: l.rec.task.gpu_ids.clone(),
                mps: match l.rec.definition.gpu_demand() {
                    mpsfleet_types::GpuDemand::Mps { memory_mib, clients, .. } => Some((memory_mib, clients)),
                    _ => None,
                },
                pids: l.handles.values().filter_map(Handle::pid).collect(),
            })
            .collect();
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = view;
    }

    fn record_path(&self, id: &TaskId) -> PathBuf {
        self.dir.join(id.to_string()).join("record.json")
    }

    fn persist(&self, rec: &Record) {
        let path = self.record_path(&rec.task.id);
        let res = crate::safe_fs::private_dir(path.parent().unwrap_or(&self.dir), 0o700).and_then(|()| {
            let bytes = serde_json::to_vec_pretty(rec).map_err(std::io::Error::other)?;
            crate::safe_fs::write_atomic(&path, &bytes)
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
            if let Some(u) = rec.task_user.as_ref().filter(|_| !rec.shared_uid) {
                self.last_uid = self.last_uid.max(Some(u.uid));
            }
            let mut local = new_local(rec);
            if local.rec.status == TaskStatus::Stopped {
                release_user(&mut local.rec);
            }
            follow_logs(&self.dir, &mut local, true);
            let was_starting = local.rec.status == TaskStatus::Pending;
            if local.rec.status != TaskStatus::Stopped {
                let now = self.clock.now_ms();
                let defs = local.rec.definition.container_definitions.clone();
                for c in &defs {
                    let dir = self.container_dir(&id, &c.name);
                    // A task still starting when the agent went down: what was started is
                    // adopted, what was not is started in its turn.
                    let process = runs_as_process(&self.runtime, c);
                    if was_starting
                        && process
                        && !dir.join(PROC_RECORD).exists()
                        && !dir.join(EXIT_RECORD).exists()
                        && self.runtime.processes().settle_launch(&dir).ok() == Some(Settled::Withdrawn)
                    {
                        let _ = crate::safe_fs::remove_tree(&dir);
                        continue;
                    }
                    let adopted = self.runtime.adopt(&dir, &id.to_string(), c);
                    if was_starting && !process && matches!(adopted, Adopted::Ended { handle: None, .. }) {
                        continue;
                    }
                    let event = match &adopted {
                        Adopted::Running(_) => LifeEvent::Started { at_ms: now },
                        Adopted::Ended { state, .. } => LifeEvent::Exited { code: exit_code(state) },
                    };
                    step_life(&mut local, &c.name, event);
                    match adopted {
                        Adopted::Running(handle) => {
                            local.reports.insert(c.name.clone(), handle.report(c));
                            local.reports_unsent = true;
                            local.handles.insert(c.name.clone(), handle);
                        }
                        Adopted::Ended { state, handle } => {
                            let mut report = match &handle {
                                Some(h) => h.report(c),
                                None => ContainerReport {
                                    name: c.name.clone(),
                                    image: c.image.clone(),
                                    ..ContainerReport::default()
                                },
                            };
                            ended_report(&mut report, &state);
                            local.reports.insert(c.name.clone(), report);
                            local.reports_unsent = true;
                            local.ended.insert(c.name.clone(), state);
                        }
                    }
                }
                follow_container_output(&self.runtime, &self.dir, &mut local);
                tracing::info!(task.id = %id, running = local.handles.len(), ended = local.ended.len(), "adopted");
            }
            if was_starting {
                init_checks(&mut local);
            }
            self.tasks.insert(id, local);
            // A task still starting goes on in its order at the next look ([`State::advance`]).
            if self
                .tasks
                .get(&id)
                .is_some_and(|l| matches!(l.rec.status, TaskStatus::Running | TaskStatus::Pending))
            {
                self.start_probes(id);
            }
        }
    }

    fn handle_input(&mut self, input: Input) {
        match input {
            Input::Assignments(a) => self.reconcile(a),
            Input::Launched { id, container, result } => self.launched(id, container, result),
            Input::Stopped { id, states } => self.stopped(id, states),
            Input::Probe { id, event } => self.probe_event(id, event),
            Input::Shutdown { .. } => {}
        }
    }

    /// Compares what the server assigns with what runs here.
    fn reconcile(&mut self, a: Assignments) {
        let allow_task_users = a.allow_task_users;
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
            // A task run's overrides apply to the definition its containers start from.
            let def = t.overrides().map_or_else(|| (*def).clone(), |o| o.apply(def));
            mpsfleet_core::timeline!("start-received", task = t.id);
            let mut rec = Record::new(t.clone(), def);
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
            let refused = match rec.status {
                TaskStatus::Pending => self.choose_user(&mut rec, allow_task_users).err(),
                _ => None,
            };
            self.persist(&rec);
            let starting = rec.status == TaskStatus::Pending;
            self.tasks.insert(t.id, new_local(rec));
            match refused {
                Some(reason) => self.refused(t.id, StopCode::TaskFailedToStart, reason),
                None if starting => self.begin_launch(t.id),
                None => {}
            }
        }
        // Running here but no longer assigned: the server has stopped it.
        let orphans: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(id, l)| {
                !assigned.contains(id) && matches!(l.rec.status, TaskStatus::Running | TaskStatus::Pending)
            })
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

    /// Decides who the task's process containers run as ([`pick_user`]) and makes the task's
    /// own home directory. Err is the reason the task does not start.
    fn choose_user(&mut self, rec: &mut Record, allow_task_users: bool) -> Result<(), String> {
        let host = HostUids { in_passwd: &in_passwd, processes: &process_uids };
        let pick =
            pick_user(&self.users, &self.runtime, &self.tasks, self.last_uid, rec, allow_task_users, &host)?;
        let (uid, shared) = match pick {
            Pick::NoTaskUid => return Ok(()),
            Pick::Own(uid) => {
                self.last_uid = Some(uid);
                (uid, false)
            }
            Pick::SharedMps(uid) => (uid, true),
        };
        let home = self.users.home_root.join(rec.task.id.to_string());
        make_home(&home, uid)
            .map_err(|e| format!("cannot make the task's directory {}: {e}", home.display()))?;
        if shared {
            tracing::info!(task.id = %rec.task.id, uid, home = %home.display(), "the MPS task runs as the uid its GPU's MPS tasks share");
        } else {
            tracing::info!(task.id = %rec.task.id, uid, home = %home.display(), "the task runs as a uid of its own");
        }
        rec.task_user = Some(TaskUser { uid, home });
        rec.shared_uid = shared;
        Ok(())
    }

    /// Starts the task's containers in their `dependsOn` order: those with no dependency at
    /// once, the others as [`State::advance`] finds their dependencies met.
    fn begin_launch(&mut self, id: TaskId) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        init_checks(local);
        follow_logs(&self.dir, local, false);
        self.advance(id);
    }

    /// Asks the dependency planner about a starting task: launches the containers whose
    /// dependencies are met, gives up on those whose dependencies can never be (the task stops,
    /// naming the container, the dependency and the condition, when such a container is
    /// essential), and marks the task RUNNING once every container is past starting.
    fn advance(&mut self, id: TaskId) {
        let now = self.clock.now_ms();
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if local.rec.status != TaskStatus::Pending || local.stop_after_launch.is_some() {
            return;
        }
        let mut stop = None;
        let plan = loop {
            let waiting = ContainerLife::Waiting;
            let members: Vec<deps::Member<'_>> = local
                .rec
                .definition
                .container_definitions
                .iter()
                .map(|def| deps::Member { def, life: local.lives.get(&def.name).unwrap_or(&waiting) })
                .collect();
            let plan = deps::plan(&members, now);
            if plan.failed.is_empty() {
                break plan;
            }
            // Held back for good; its own dependents are looked at again.
            for f in plan.failed {
                let reason = f.to_string();
                tracing::warn!(task.id = %id, container = %f.container, %reason, "container not started");
                step_life(local, &f.container, LifeEvent::NotStarted { reason: reason.clone() });
                not_started(local, &f.container, &reason, now);
                if f.essential && stop.is_none() {
                    stop = Some(reason);
                }
            }
        };
        if let Some(reason) = stop {
            self.begin_stop(id, StopCode::TaskFailedToStart, reason);
            return;
        }
        for name in plan.start {
            self.launch_container(id, name);
        }
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if local.rec.status == TaskStatus::Pending && local.lives.values().all(ContainerLife::is_settled) {
            local.rec.status = TaskStatus::Running;
            local.rec.task.started_at_ms = Some(now);
            local.rec.ready = local.not_ready.is_empty() && local.starting.is_empty();
            let rec = local.rec.clone();
            self.persist(&rec);
            mpsfleet_core::timeline!("task-started", task = id);
            tracing::info!(task.id = %id, "running");
        }
    }

    /// Launches one container of the task on a worker thread (after the fail-closed MPS check
    /// for an MPS task).
    fn launch_container(&mut self, id: TaskId, name: String) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        let Some(def) = local.rec.definition.container_definitions.iter().find(|c| c.name == name).cloned()
        else {
            return;
        };
        step_life(local, &name, LifeEvent::LaunchBegun);
        local.launching.insert(name.clone());
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
        let dir = self.container_dir(&id, &name);
        let launch = self.launch;
        let container = name.clone();
        let failed = move |why: String| Input::Launched {
            id,
            container,
            result: Err((StopCode::TaskFailedToStart, format!("the launch failed: {why}"))),
        };
        let (client, handle) = (self.client.clone(), self.handle.clone());
        let job = move || {
            // The container's secrets, into this worker's copy only (never the record).
            let mut def = def;
            let result = match crate::secrets::fetch_into(&handle, &client, &id, &mut def) {
                Ok(()) => launch(&runtime, &rec, &def, supervisor, &dir),
                Err(failure) => Err(failure),
            };
            Input::Launched { id, container: name, result: result.map(Box::new) }
        };
        if let Err(input) = spawn_worker(self.tx.clone(), "launch", job, failed) {
            self.handle_input(input);
        }
    }

    /// A task that does not start at all: STOPPED with `reason`, each container reported with it.
    fn refused(&mut self, id: TaskId, code: StopCode, reason: String) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        tracing::warn!(task.id = %id, code = code.as_str(), %reason, "not started");
        for c in &local.rec.definition.container_definitions {
            local.reports_unsent = true;
            local.reports.entry(c.name.clone()).or_insert_with(|| ContainerReport {
                name: c.name.clone(),
                image: c.image.clone(),
                reason: Some(reason.clone()),
                ..ContainerReport::default()
            });
        }
        local.rec.status = TaskStatus::Stopped;
        local.rec.stop_code = Some(code);
        local.rec.reason = Some(reason);
        release_user(&mut local.rec);
        let rec = local.rec.clone();
        self.persist(&rec);
    }

    fn launched(&mut self, id: TaskId, name: String, result: Result<Box<Handle>, (StopCode, String)>) {
        let now = self.clock.now_ms();
        let Some(local) = self.tasks.get_mut(&id) else { return };
        local.launching.remove(&name);
        local.busy = !local.launching.is_empty();
        let def = local.rec.definition.container_definitions.iter().find(|c| c.name == name).cloned();
        match result {
            Ok(handle) => {
                let handle = *handle;
                if let Some(p) = handle.pull() {
                    let start = now.saturating_sub(p.began_ago_ms);
                    let stop = start.saturating_add(p.took_ms);
                    local.pulls = Some(match local.pulls {
                        Some((a, b)) => (a.min(start), b.max(stop)),
                        None => (start, stop),
                    });
                }
                if let Some(def) = &def {
                    local.reports.insert(name.clone(), handle.report(def));
                    local.reports_unsent = true;
                }
                step_life(local, &name, LifeEvent::Started { at_ms: now });
                follow_output_of(&self.runtime, &self.dir, &id, &name, &handle);
                local.handles.insert(name.clone(), handle);
                tracing::info!(task.id = %id, container = %name, "container started");
            }
            Err((code, reason)) => {
                tracing::warn!(task.id = %id, container = %name, code = code.as_str(), %reason, "container not started");
                step_life(local, &name, LifeEvent::NotStarted { reason: reason.clone() });
                not_started(local, &name, &reason, now);
                // A non-essential container that cannot start leaves the task to go on, as on ECS.
                if def.as_ref().is_none_or(|d| d.essential) {
                    local.stop_after_launch.get_or_insert((code, reason));
                }
            }
        }
        // Its probes start now, whatever else is still launching: the last launch to finish
        // is not the only container that has checks.
        let probe = local.handles.contains_key(&name) && local.stop_after_launch.is_none();
        let waiting = !local.launching.is_empty();
        if probe {
            self.start_container_probes(id, &name);
        }
        if waiting {
            return;
        }
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if let Some((code, reason)) = local.stop_after_launch.take() {
            self.begin_stop(id, code, reason);
            return;
        }
        self.advance(id);
    }

    /// Starts the probes of every running container of the task.
    fn start_probes(&mut self, id: TaskId) {
        let Some(local) = self.tasks.get(&id) else { return };
        let names: Vec<String> = local.handles.keys().cloned().collect();
        for name in names {
            self.start_container_probes(id, &name);
        }
    }

    /// Starts the probes of one running container (its health check is what `HEALTHY` waits for).
    fn start_container_probes(&mut self, id: TaskId, name: &str) {
        let clock = self.clock.clone();
        let tx = self.tx.clone();
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if let Some(c) = local.rec.definition.container_definitions.iter().find(|c| c.name == name) {
            let probes = match ContainerProbes::from_definition(c) {
                Ok(p) if p.is_empty() => return,
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(task.id = %id, container = %c.name, error = %e, "probes not started");
                    return;
                }
            };
            let host_network = local.rec.definition.effective_network_mode() == NetworkMode::Host;
            let in_container =
                local.handles.get(&c.name).and_then(|h| self.runtime.probe_target(h, host_network));
            let target = match in_container {
                Some(target) => target,
                None => {
                    let env = container_env(&local.rec.task, c, None);
                    match ExecContext::new(&env, c.user.as_deref(), local.rec.task_user.as_ref()) {
                        Ok(ctx) => ProbeTarget::Host(ctx),
                        Err(e) => {
                            tracing::error!(task.id = %id, container = %c.name, error = %e, "probes not started");
                            return;
                        }
                    }
                }
            };
            let tx = tx.clone();
            let sink = move |event| {
                let _ = tx.send(Input::Probe { id, event });
            };
            match ProbeRunner::start(c.name.clone(), probes, target, clock.clone(), sink) {
                Ok(r) => local.probes.push(r),
                Err(e) => {
                    tracing::error!(task.id = %id, container = %c.name, error = %e, "probes not started")
                }
            }
        }
    }

    fn probe_event(&mut self, id: TaskId, event: ProbeEvent) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if !matches!(local.rec.status, TaskStatus::Running | TaskStatus::Pending) {
            return;
        }
        let container = event.container;
        let mut healthy = false;
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
                if local.lives.get(&container).is_some_and(|l| matches!(l, ContainerLife::Running { .. })) {
                    step_life(local, &container, LifeEvent::HealthPassed);
                    healthy = true;
                }
                None
            }
            Transition::Unhealthy { reason } => {
                let essential = local
                    .rec
                    .definition
                    .container_definitions
                    .iter()
                    .any(|c| c.name == container && c.essential);
                if essential {
                    local.rec.health = TaskHealth::Unhealthy;
                    Some((
                        StopCode::Unhealthy,
                        format!("health check of container {container} failed: {reason}"),
                    ))
                } else {
                    // As in ECS, only essential containers make the task unhealthy.
                    tracing::info!(task.id = %id, container, %reason, "health check of a non-essential container failed");
                    None
                }
            }
        };
        local.rec.ready = local.not_ready.is_empty() && local.starting.is_empty();
        let rec = local.rec.clone();
        self.persist(&rec);
        if let Some((code, reason)) = stop {
            self.begin_stop(id, code, reason);
        } else if healthy {
            self.advance(id);
        }
    }

    /// Looks at every running or starting task: an essential container that exited stops the
    /// task; a starting task goes on in its order.
    fn watch(&mut self) {
        let mut to_stop = Vec::new();
        let mut starting = Vec::new();
        for (id, local) in self.tasks.iter_mut() {
            read_output(id, local);
            if !matches!(local.rec.status, TaskStatus::Running | TaskStatus::Pending) {
                continue;
            }
            let names: Vec<String> = local.handles.keys().cloned().collect();
            for name in names {
                let state = match local.handles.get(&name) {
                    Some(h) => self.runtime.status(h),
                    None => continue,
                };
                if !state.is_running() {
                    step_life(local, &name, LifeEvent::Exited { code: exit_code(&state) });
                    local.handles.remove(&name);
                    if let Some(r) = local.reports.get_mut(&name) {
                        ended_report(r, &state);
                        local.reports_unsent = true;
                    }
                    local.ended.insert(name, state);
                }
            }
            if let TaskPhase::Stopped { code, reason } = phase(local) {
                to_stop.push((*id, code, reason));
            } else if local.rec.status == TaskStatus::Pending {
                starting.push(*id);
            }
        }
        for (id, code, reason) in to_stop {
            self.begin_stop(id, code, reason);
        }
        for id in starting {
            self.advance(id);
        }
    }

    /// Stops what still runs of a task (terminate_client first for MPS clients), on a worker
    /// thread, in the reverse of the start order: a container stops only once every container
    /// that depends on it has stopped, each within its own `stopTimeout`. The first stop reason
    /// wins; a stop asked for while containers are being launched waits for those launches.
    fn begin_stop(&mut self, id: TaskId, code: StopCode, reason: String) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        if !local.launching.is_empty() && local.rec.status == TaskStatus::Pending {
            local.stop_after_launch.get_or_insert((code, reason));
            return;
        }
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
        let waves: Vec<Vec<(String, Handle, Duration)>> =
            deps::stop_order(&rec.definition.container_definitions)
                .into_iter()
                .map(|wave| {
                    wave.into_iter()
                        .filter_map(|name| {
                            let h = local.handles.get(&name)?.clone();
                            let timeout = rec
                                .definition
                                .container_definitions
                                .iter()
                                .find(|c| c.name == name)
                                .map_or(DEFAULT_STOP_TIMEOUT, stop_timeout);
                            Some((name, h, timeout))
                        })
                        .collect::<Vec<_>>()
                })
                .filter(|wave| !wave.is_empty())
                .collect();
        let handles: Vec<&(String, Handle, Duration)> = waves.iter().flatten().collect();
        let pids: Vec<u32> = handles.iter().filter_map(|(_, h, _)| h.pid()).collect();
        let names: Vec<String> = handles.iter().map(|(name, _, _)| name.clone()).collect();
        self.persist(&rec);
        let supervisor = match rec.definition.gpu_demand() {
            GpuDemand::Mps { .. } => rec.task.gpu_ids.first().and_then(|g| self.gpus.supervisor(g).cloned()),
            _ => None,
        };
        let runtime = self.runtime.clone();
        let failed = move |why: String| Input::Stopped {
            id,
            states: names
                .iter()
                .map(|n| (n.clone(), ContainerState::Lost { reason: format!("the stop failed: {why}") }))
                .collect(),
        };
        let job = move || {
            if let Some(s) = &supervisor {
                terminate_clients(s, pids.into_iter());
            }
            let mut states = BTreeMap::new();
            for wave in waves {
                states.extend(stop_wave(&runtime, wave));
            }
            runtime.end_task(&id.to_string());
            Input::Stopped { id, states }
        };
        if let Err(input) = spawn_worker(self.tx.clone(), "stop", job, failed) {
            self.handle_input(input);
        }
    }

    fn stopped(&mut self, id: TaskId, states: BTreeMap<String, ContainerState>) {
        let Some(local) = self.tasks.get_mut(&id) else { return };
        local.busy = false;
        local.handles.clear();
        // A container whose stop went wrong says so in the task's reason.
        let lost: Vec<String> = states
            .iter()
            .filter_map(|(name, st)| match st {
                ContainerState::Lost { reason } => Some(format!("container {name}: {reason}")),
                _ => None,
            })
            .collect();
        if !lost.is_empty() {
            let reason = local.rec.reason.take().unwrap_or_else(|| "stopped".into());
            local.rec.reason = Some(format!("{reason} ({})", lost.join("; ")));
        }
        for (name, state) in &states {
            if let Some(r) = local.reports.get_mut(name) {
                ended_report(r, state);
                local.reports_unsent = true;
            }
        }
        local.ended.extend(states);
        // Containers never started (still waiting for their dependencies) say why.
        let why = local.rec.reason.clone().unwrap_or_else(|| "stopped".into());
        for c in &local.rec.definition.container_definitions {
            if !local.reports.contains_key(&c.name) {
                local.reports.insert(
                    c.name.clone(),
                    ContainerReport {
                        name: c.name.clone(),
                        image: c.image.clone(),
                        reason: Some(format!("not started: the task stopped first ({why})")),
                        ..ContainerReport::default()
                    },
                );
                local.reports_unsent = true;
            }
        }
        local.rec.status = TaskStatus::Stopped;
        local.rec.ready = false;
        release_user(&mut local.rec);
        // What the containers wrote last goes with the STOPPED report.
        read_output(&id, local);
        local.tails.clear();
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
            .filter(|(_, l)| {
                reportable(l.rec.status)
                    && (l.rec.reported.as_ref() != Some(&l.rec.current())
                        || output_due(l, now)
                        || l.reports_unsent)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(local) = self.tasks.get(&id) else { continue };
            let rec = &local.rec;
            let stopped = rec.status == TaskStatus::Stopped;
            let with_output = (stopped && local.output.seq() > 0) || output_due(local, now);
            let output_seq = local.output.seq();
            let containers =
                local.reports_unsent.then(|| local.reports.values().cloned().collect::<Vec<_>>());
            let with_containers = containers.is_some();
            let report = TaskStateReport {
                last_status: rec.status,
                health_status: Some(rec.health),
                ready: Some(rec.ready),
                stop_code: if stopped { rec.stop_code } else { None },
                stopped_reason: if stopped { rec.reason.clone() } else { None },
                output: with_output.then(|| local.output.snapshot(now)),
                containers,
                pull: local.pulls.map(|(start, stop)| PullTiming {
                    began_ago_ms: now.saturating_sub(start),
                    took_ms: stop.saturating_sub(start),
                }),
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
                self.report_backoff.reset();
                if let Some(local) = self.tasks.get_mut(&id) {
                    if with_output {
                        local.output_sent = Some((output_seq, now));
                    }
                    if with_containers {
                        local.reports_unsent = false;
                    }
                    if local.rec.status == TaskStatus::Stopped {
                        // The server keeps the last snapshot now.
                        local.output = RecentOutput::default();
                        local.output_sent = Some((local.output.seq(), now));
                        local.tails.clear();
                    }
                    if local.rec.reported.as_ref() != Some(&local.rec.current()) {
                        if local.rec.status == TaskStatus::Running {
                            mpsfleet_core::timeline!("running-reported", task = id);
                        }
                        local.rec.reported = Some(local.rec.current());
                        let rec = local.rec.clone();
                        self.persist(&rec);
                    }
                }
            }
        }
    }

    fn back_off(&mut self, now: u64, why: &str) {
        let wait = self.report_backoff.fail();
        tracing::warn!(error = why, retry_in_ms = wait.as_millis() as u64, "cannot report tasks");
        self.report_after_ms = now + wait.as_millis() as u64;
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

/// Runs `job` on a worker thread and sends its result to the loop. A job that panics sends
/// `failed(why)` instead, so that its task is never left waiting for an answer; when no thread
/// can be started, `failed(why)` is returned for the caller to handle at once.
fn spawn_worker<F>(
    tx: Sender<Input>,
    what: &'static str,
    job: impl FnOnce() -> Input + Send + 'static,
    failed: F,
) -> Result<(), Input>
where
    F: FnOnce(String) -> Input + Send + Clone + 'static,
{
    let on_panic = failed.clone();
    let spawned = std::thread::Builder::new().name(format!("task-{what}")).spawn(move || {
        let input = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
            Ok(input) => input,
            Err(panic) => {
                let why = format!("the {what} worker panicked: {}", panic_message(&*panic));
                tracing::error!(error = %why, "task worker failed");
                on_panic(why)
            }
        };
        let _ = tx.send(input);
    });
    spawned.map(|_| ()).map_err(|e| failed(format!("cannot start the {what} worker: {e}")))
}

/// The message of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

fn new_local(rec: Record) -> Local {
    Local {
        handles: BTreeMap::new(),
        reports: BTreeMap::new(),
        reports_unsent: false,
        ended: BTreeMap::new(),
        probes: Vec::new(),
        busy: false,
        stop_after_launch: None,
        lives: rec
            .definition
            .container_definitions
            .iter()
            .map(|c| (c.name.clone(), ContainerLife::Waiting))
            .collect(),
        launching: BTreeSet::new(),
        starting: BTreeSet::new(),
        not_ready: BTreeSet::new(),
        output: RecentOutput::default(),
        tails: Vec::new(),
        output_sent: None,
        pulls: None,
        rec,
    }
}

/// The containers whose startup and readiness checks are yet to pass, as the task starts.
fn init_checks(local: &mut Local) {
    let defs = &local.rec.definition.container_definitions;
    local.starting = defs.iter().filter(|c| c.startup_check.is_some()).map(|c| c.name.clone()).collect();
    local.not_ready = defs
        .iter()
        .filter(|c| c.startup_check.is_some() || c.readiness_check.is_some())
        .map(|c| c.name.clone())
        .collect();
}

/// Moves a container's life on ([`deps::step`]); an event that does not apply is logged and
/// changes nothing.
fn step_life(local: &mut Local, name: &str, event: LifeEvent) {
    let Some(life) = local.lives.get_mut(name) else { return };
    match deps::step(life, event) {
        Ok(next) => *life = next,
        Err(e) => {
            tracing::debug!(task.id = %local.rec.task.id, container = name, error = %e, "container life unchanged")
        }
    }
}

/// A container that never started: ended (it counts as exited for the task's verdict) and
/// reported with why.
fn not_started(local: &mut Local, name: &str, reason: &str, now_ms: u64) {
    let exit = ExitRecord {
        code: None,
        signal: None,
        finished_at_ms: now_ms,
        error: Some(reason.to_string()),
        oom_killed: false,
    };
    local.ended.insert(name.to_string(), ContainerState::Exited(exit));
    let image = local
        .rec
        .definition
        .container_definitions
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.image.clone());
    let report = local.reports.entry(name.to_string()).or_insert_with(|| ContainerReport {
        name: name.to_string(),
        image,
        ..ContainerReport::default()
    });
    report.reason = Some(reason.to_string());
    local.reports_unsent = true;
}

/// The exit status of a container that has ended (None: killed by a signal, lost, or never run).
fn exit_code(state: &ContainerState) -> Option<i32> {
    match state {
        ContainerState::Exited(exit) if exit.error.is_none() && exit.signal.is_none() => exit.code,
        _ => None,
    }
}

/// Stops one wave of a task's containers at the same time, each within its own timeout; how
/// each ended. A container whose stop thread cannot be started is stopped here in turn.
fn stop_wave(runtime: &Engine, wave: Vec<(String, Handle, Duration)>) -> BTreeMap<String, ContainerState> {
    std::thread::scope(|s| {
        let mut running = Vec::new();
        let mut states = BTreeMap::new();
        for (name, handle, timeout) in &wave {
            let spawned = std::thread::Builder::new()
                .name(format!("stop-{name}"))
                .spawn_scoped(s, move || runtime.stop(handle, *timeout));
            match spawned {
                Ok(t) => running.push((name.clone(), t)),
                Err(_) => {
                    states.insert(name.clone(), runtime.stop(handle, *timeout));
                }
            }
        }
        for (name, t) in running {
            let state =
                t.join().unwrap_or_else(|_| ContainerState::Lost { reason: "its stop panicked".into() });
            states.insert(name, state);
        }
        states
    })
}

/// Follows the output of every container of the task: from its start for a container just
/// launched, from its last snapshot's worth for one adopted after a restart.
fn follow_logs(tasks_dir: &Path, local: &mut Local, from_end: bool) {
    let id = local.rec.task.id;
    local.tails = local
        .rec
        .definition
        .container_definitions
        .iter()
        .map(|c| {
            let rel = container_rel(&id, &c.name).join(OUTPUT_LOG);
            LogTail::beneath(tasks_dir.to_path_buf(), rel, &c.name, from_end)
        })
        .collect();
}

/// Reads what the task's containers wrote since the last look into its ring.
fn read_output(id: &TaskId, local: &mut Local) {
    for tail in &mut local.tails {
        if let Err(e) = tail.poll(&mut local.output) {
            tracing::warn!(task.id = %id, error = %e, "task output not captured");
        }
    }
}

/// Whether the task's output changed since it was last reported, and that was long enough ago.
fn output_due(local: &Local, now: u64) -> bool {
    match local.output_sent {
        None => local.output.seq() > 0,
        Some((seq, at)) => {
            seq != local.output.seq() && now.saturating_sub(at) >= OUTPUT_REPORT_EVERY.as_millis() as u64
        }
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

/// Launches one container of a task. Fail closed: a container of an MPS task starts only when
/// its GPU's daemon answers, checked right before it is created.
fn launch(
    engine: &Engine,
    rec: &Record,
    c: &ContainerDefinition,
    mps: Option<(String, Option<Arc<Supervisor>>)>,
    dir: &Path,
) -> Result<Handle, (StopCode, String)> {
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
            mpsfleet_core::timeline!("daemon-checked", task = rec.task.id);
            Some(s.pipe_dir().to_path_buf())
        }
    };
    let stop_timeout = stop_timeout(c);
    let env = container_env(&rec.task, c, pipe_dir.as_deref());
    engine.launch(&Launch {
        task: &rec.task,
        definition: &rec.definition,
        container: c,
        env,
        pipe_dir,
        task_user: rec.task_user.as_ref(),
        stop_timeout,
        state_dir: dir,
    })
}

/// The container's `stopTimeout`, or ECS's default.
fn stop_timeout(c: &ContainerDefinition) -> Duration {
    c.stop_timeout.map_or(DEFAULT_STOP_TIMEOUT, |s| Duration::from_secs(u64::from(s)))
}

/// A container's report once it has ended: its exit code and why.
fn ended_report(report: &mut ContainerReport, state: &ContainerState) {
    match state {
        ContainerState::Running { .. } => {}
        ContainerState::Exited(exit) => {
            report.exit_code = exit.code.map(i64::from);
            report.reason = Some(exit.reason());
        }
        ContainerState::Lost { reason } => report.reason = Some(reason.clone()),
    }
}

/// Copies what a Docker container writes into its state directory's framed output log, where
/// the task's output ring reads it (the shim does the same for a process).
fn follow_container_output(engine: &Engine, tasks_dir: &Path, local: &mut Local) {
    let id = local.rec.task.id;
    for (name, handle) in &local.handles {
        follow_output_of(engine, tasks_dir, &id, name, handle);
    }
}

/// [`follow_container_output`] of one container.
fn follow_output_of(engine: &Engine, tasks_dir: &Path, id: &TaskId, name: &str, handle: &Handle) {
    if !engine.copies_output(handle) {
        return;
    }
    let dir = container_dir(tasks_dir, id, name);
    if let Err(e) = crate::safe_fs::private_dir(&dir, 0o700) {
        tracing::warn!(task.id = %id, container = %name, error = %e, "task output not captured");
        return;
    }
    if let Err(e) = engine.follow_output(handle, dir.join(OUTPUT_LOG)) {
        tracing::warn!(task.id = %id, container = %name, error = %e, "task output not captured");
    }
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
    tasks_dir.join(container_rel(id, container))
}

/// [`container_dir`] relative to the tasks dir.
pub fn container_rel(id: &TaskId, container: &str) -> PathBuf {
    Path::new(&id.to_string()).join("containers").join(container)
}

/// Whether this container runs as a process here (not in Docker): its `user` is then the
/// agent's business.
fn runs_as_process(engine: &Engine, c: &ContainerDefinition) -> bool {
    !engine.runs_image(c)
}

#[cfg(test)]
mod tests;
