//! The task runtime seam: the task loop runs every container through an [`Engine`], either
//! processes under shims ([`super::container::Runtime`]) or containers on Docker Engine
//! ([`crate::docker::DockerRuntime`]). Both give the same [`ContainerState`]s, so the task's
//! verdict ([`super::task::task_state`]) does not depend on the runtime.
//!
//! A Docker host runs every container that names an `image` on Docker; a container with a
//! command and no image runs as a process there too, as it would on a process host.

use super::container::{
    AdoptedState, ContainerHandle, ContainerLaunch, ContainerState, Runtime, StopOutcome,
};
use super::identity::TaskUser;
use super::probes::{ProbeResult, ProbeTarget};
use crate::docker::{DockerHandle, DockerLaunch, DockerRuntime};
use mpsfleet_types::{ContainerDefinition, ContainerReport, RuntimeKind, StopCode, Task, TaskDefinition};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// One container to start, whichever runtime starts it.
pub struct Launch<'a> {
    pub task: &'a Task,
    pub definition: &'a TaskDefinition,
    pub container: &'a ContainerDefinition,
    /// The container's environment (`crate::env::container_env`).
    pub env: Vec<(String, String)>,
    /// The GPU's MPS pipe directory, for a container of an MPS task.
    pub pipe_dir: Option<PathBuf>,
    /// Who a process runs as (a container's image says for itself).
    pub task_user: Option<&'a TaskUser>,
    pub stop_timeout: Duration,
    /// The container's state directory under the task's.
    pub state_dir: &'a Path,
}

/// How this host runs its tasks.
pub enum Engine {
    Process(Runtime),
    /// `gpus_emulated`: the host's GPUs are declared, not real, so containers get no GPU
    /// runtime or device request (their reports say so).
    Docker {
        rt: DockerRuntime,
        process: Runtime,
        gpus_emulated: bool,
    },
}

/// One running container of either runtime.
#[derive(Debug, Clone)]
pub enum Handle {
    Process(ContainerHandle),
    Docker(DockerHandle),
}

/// What adoption after an agent restart found for one container.
#[derive(Debug, Clone)]
pub enum Adopted {
    Running(Handle),
    /// It has ended; `handle` still names it when the runtime keeps it (a stopped Docker
    /// container), for its report.
    Ended {
        state: ContainerState,
        handle: Option<Handle>,
    },
}

impl Handle {
    /// The process to name to the MPS server (`terminate_client`): the task's process, or the
    /// container's first process.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Handle::Process(h) => h.pid(),
            Handle::Docker(h) => h.pid,
        }
    }

    /// The container as the task's report shows it while it runs.
    /// The image pull its launch made, if it made one.
    pub fn pull(&self) -> Option<mpsfleet_types::PullTiming> {
        match self {
            Handle::Process(_) => None,
            Handle::Docker(h) => h.pull,
        }
    }

    pub fn report(&self, def: &ContainerDefinition) -> ContainerReport {
        match self {
            Handle::Process(h) => ContainerReport {
                name: def.name.clone(),
                image: def.image.clone(),
                runtime_id: h.pid().map(|p| format!("pid {p}")),
                notes: process_notes(def),
                ..ContainerReport::default()
            },
            Handle::Docker(h) => ContainerReport {
                name: def.name.clone(),
                image: def.image.clone(),
                image_digest: h.image_digest.clone(),
                runtime_id: Some(h.id.clone()),
                network_bindings: h.network_bindings.clone(),
                network_interfaces: h.network_interfaces.clone(),
                notes: h.notes.clone(),
                ..ContainerReport::default()
            },
        }
    }
}

/// What a process host does differently from the definition.
pub fn process_notes(def: &ContainerDefinition) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(image) = &def.image {
        notes.push(format!(
            "image {image} is not used: this host runs the command as a process (start the agent \
             with --runtime docker to run images)"
        ));
    }
    if !def.port_mappings.is_empty() {
        // Nothing is published, so the report has no bindings; the note says why.
        notes.push(
            "portMappings are not published: a process shares the host's network and is reached \
             on the address and port it listens on"
                .to_string(),
        );
    }
    notes
}

impl Engine {
    /// Whether `c` runs as an image on Docker here; otherwise it runs as a process.
    pub fn runs_image(&self, c: &ContainerDefinition) -> bool {
        matches!(self, Engine::Docker { .. }) && c.image.is_some()
    }

    /// Starts one container: on Docker when [`Engine::runs_image`], else as a process under
    /// its shim (which needs a command).
    pub fn launch(&self, l: &Launch<'_>) -> Result<Handle, (StopCode, String)> {
        let c = l.container;
        if let Engine::Docker { rt, gpus_emulated, .. } = self {
            if c.image.is_some() {
                let launch = DockerLaunch {
                    task: l.task.clone(),
                    definition: l.definition.clone(),
                    container: c.clone(),
                    env: l.env.clone(),
                    mps_pipe_dir: if c.gpu().is_some() { l.pipe_dir.clone() } else { None },
                    gpus_emulated: *gpus_emulated,
                    stop_timeout: l.stop_timeout,
                };
                return rt.launch(&launch).map(Handle::Docker);
            }
        }
        if c.command.is_empty() && c.entry_point.is_empty() {
            return Err((
                StopCode::TaskFailedToStart,
                format!(
                    "container {} has no command and this host runs processes, not images \
                     (start the agent with --runtime docker)",
                    c.name
                ),
            ));
        }
        let launch = ContainerLaunch {
            task_id: l.task.id.to_string(),
            container: c.name.clone(),
            argv: c.entry_point.iter().chain(&c.command).cloned().collect(),
            env: l.env.clone(),
            user: c.user.clone(),
            task_user: l.task_user.cloned(),
            stop_timeout: l.stop_timeout,
            state_dir: l.state_dir.to_path_buf(),
        };
        self.processes()
            .launch(&launch)
            .map(Handle::Process)
            .map_err(|e| (StopCode::TaskFailedToStart, format!("container {} failed to start: {e}", c.name)))
    }

    /// Where the probes of a container in Docker run: exec probes inside it, HTTP and TCP
    /// probes of localhost at its own address (none on the host's network). None for a
    /// process, whose probes run on the host.
    pub fn probe_target(&self, handle: &Handle, host_network: bool) -> Option<ProbeTarget> {
        let (Engine::Docker { rt, .. }, Handle::Docker(h)) = (self, handle) else { return None };
        let (rt, h) = (rt.clone(), h.clone());
        let address = if host_network { None } else { h.ip.clone() };
        let exec = move |argv: &[String], timeout: Duration| docker_probe(&rt, &h, argv, timeout);
        Some(ProbeTarget::Container { exec: Arc::new(exec), address })
    }

    /// Whether the agent copies the container's output into its state directory (a Docker
    /// container's; a process's shim writes its own).
    pub fn copies_output(&self, handle: &Handle) -> bool {
        matches!((self, handle), (Engine::Docker { .. }, Handle::Docker(_)))
    }

    /// Starts copying a Docker container's output into `output_log` (framed as the shim
    /// writes it); nothing for a process.
    pub fn follow_output(&self, handle: &Handle, output_log: PathBuf) -> std::io::Result<()> {
        match (self, handle) {
            (Engine::Docker { rt, .. }, Handle::Docker(h)) => rt.follow_output(h, output_log).map(drop),
            _ => Ok(()),
        }
    }

    pub fn kind(&self) -> RuntimeKind {
        match self {
            Engine::Process(_) => RuntimeKind::Process,
            Engine::Docker { .. } => RuntimeKind::Docker,
        }
    }

    /// The container's state now. When Docker cannot be asked, the container is taken to be
    /// still running: an unreachable engine is the `CONTAINER_RUNTIME` check's business, not a
    /// reason to stop tasks that may well still run.
    pub fn status(&self, handle: &Handle) -> ContainerState {
        match (self, handle) {
            (Engine::Process(rt) | Engine::Docker { process: rt, .. }, Handle::Process(h)) => rt.status(h),
            (Engine::Docker { rt, .. }, Handle::Docker(h)) => match rt.status(h) {
                Ok(state) => state,
                Err(e) => {
                    tracing::debug!(container = %h.name, error = %e, "cannot ask Docker; taking the container as running");
                    ContainerState::Running { pid: h.pid.unwrap_or(0) }
                }
            },
            _ => ContainerState::Lost { reason: "the container belongs to another runtime".into() },
        }
    }

    /// SIGTERM (or the image's stop signal), up to `timeout`, then SIGKILL; how it ended.
    pub fn stop(&self, handle: &Handle, timeout: Duration) -> ContainerState {
        let outcome: Result<StopOutcome, String> = match (self, handle) {
            (Engine::Process(rt) | Engine::Docker { process: rt, .. }, Handle::Process(h)) => {
                rt.stop(h, timeout).map_err(|e| e.to_string())
            }
            (Engine::Docker { rt, .. }, Handle::Docker(h)) => stop_docker(rt, h, timeout),
            _ => Err("the container belongs to another runtime".into()),
        };
        match outcome {
            Ok(o) => o.state,
            Err(e) => ContainerState::Lost { reason: format!("stop failed: {e}") },
        }
    }

    /// The task's containers have all ended: what the runtime holds for the task as a whole
    /// goes (on Docker, an awsvpc task's pause container is stopped, to be removed with the
    /// task's containers). Failures are logged: the janitor removes what is left.
    pub fn end_task(&self, task_id: &str) {
        if let Engine::Docker { rt, .. } = self {
            if let Err(e) = rt.end_task(task_id) {
                tracing::warn!(task.id = task_id, error = %e, "cannot stop the task's pause container");
            }
        }
    }

    /// The process runtime: the whole engine of a process host, the one for containers
    /// without an image on a Docker host.
    pub fn processes(&self) -> &Runtime {
        match self {
            Engine::Process(rt) | Engine::Docker { process: rt, .. } => rt,
        }
    }

    /// Finds a container of a task again after an agent restart: from its state directory
    /// (processes) or by its name (Docker, for a container with an image).
    pub fn adopt(&self, state_dir: &Path, task_id: &str, def: &ContainerDefinition) -> Adopted {
        match self {
            Engine::Docker { rt, .. } if def.image.is_some() => adopt_docker(rt, task_id, &def.name),
            _ => match self.processes().adopt(state_dir) {
                Ok(AdoptedState::Running { handle, .. }) => Adopted::Running(Handle::Process(handle)),
                Ok(AdoptedState::Exited(exit)) => {
                    Adopted::Ended { state: ContainerState::Exited(exit), handle: None }
                }
                Ok(AdoptedState::Lost { reason }) => {
                    Adopted::Ended { state: ContainerState::Lost { reason }, handle: None }
                }
                Err(e) => {
                    Adopted::Ended { state: ContainerState::Lost { reason: e.to_string() }, handle: None }
                }
            },
        }
    }
}

/// How many times a Docker stop is tried when Docker does not answer, as ECS does: a
/// container is not given up as stopped while it may still run.
const DOCKER_STOP_TRIES: u32 = 3;

fn stop_docker(rt: &DockerRuntime, h: &DockerHandle, timeout: Duration) -> Result<StopOutcome, String> {
    let mut backoff = mpsfleet_core::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
    let mut tries = 0;
    loop {
        tries += 1;
        match rt.stop(h, timeout) {
            Ok(outcome) => return Ok(outcome),
            Err(e) if tries >= DOCKER_STOP_TRIES => {
                return Err(format!("{e} (after {tries} tries)"));
            }
            Err(e) => {
                let wait = backoff.fail();
                tracing::warn!(container = %h.name, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot stop the container; trying again");
                std::thread::sleep(wait);
            }
        }
    }
}

fn adopt_docker(rt: &DockerRuntime, task_id: &str, container: &str) -> Adopted {
    match rt.adopt(task_id, container) {
        Ok(Some((handle, ContainerState::Running { .. }))) => Adopted::Running(Handle::Docker(handle)),
        Ok(Some((h, state))) => Adopted::Ended { state, handle: Some(Handle::Docker(h)) },
        Ok(None) => Adopted::Ended {
            state: ContainerState::Lost {
                reason: "its container is gone from Docker (removed while the agent was down)".into(),
            },
            handle: None,
        },
        // Docker does not answer now: watch the container by its name; the first look that
        // reaches Docker decides whether it still runs.
        Err(e) => {
            tracing::warn!(task.id = task_id, container, error = %e, "cannot ask Docker; adopting by name");
            let name = crate::docker::container_name(rt.host_id(), task_id, container);
            Adopted::Running(Handle::Docker(DockerHandle {
                id: name.clone(),
                name,
                pid: None,
                ip: None,
                image_digest: None,
                network_bindings: Vec::new(),
                network_interfaces: Vec::new(),
                notes: Vec::new(),
                pull: None,
            }))
        }
    }
}

/// An exec probe inside a Docker container: success on exit status 0, else the status and
/// the end of what it printed.
fn docker_probe(rt: &DockerRuntime, h: &DockerHandle, argv: &[String], timeout: Duration) -> ProbeResult {
    match rt.exec(h, argv, timeout) {
        Ok(out) if out.exit_code == 0 => ProbeResult::Success,
        Ok(out) => {
            let output = out.output.trim();
            let tail: String = output.chars().rev().take(200).collect::<Vec<_>>().into_iter().rev().collect();
            let program = argv.first().map_or("", String::as_str);
            if tail.is_empty() {
                ProbeResult::Failure(format!("{program} exited with status {}", out.exit_code))
            } else {
                ProbeResult::Failure(format!("{program} exited with status {}: {tail}", out.exit_code))
            }
        }
        Err(e) => ProbeResult::Failure(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_says_its_ports_are_not_published() {
        let def: ContainerDefinition = serde_json::from_value(serde_json::json!({
            "name": "web", "essential": true, "command": ["httpd"], "portMappings": [{"containerPort": 8080}],
        }))
        .expect("container json");
        let notes = process_notes(&def);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("portMappings are not published"), "{notes:?}");
        let plain: ContainerDefinition = serde_json::from_value(
            serde_json::json!({"name": "job", "essential": true, "command": ["true"]}),
        )
        .expect("json");
        assert!(process_notes(&plain).is_empty());
    }
}
