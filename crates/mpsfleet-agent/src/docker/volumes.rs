//! The Docker volumes of tasks, as ECS's agent keeps them: a task-scoped volume is created
//! before the first container that mounts it and removed once no container of its task is
//! left; a shared volume is used by name, created only with `autoprovision`, never removed.
//! Also the engine's volume and log drivers, which the agent reports at registration.

use super::options::{volumes_needed, VolumeSource, LABEL_VOLUME};
use super::{spec, DockerError, DockerLaunch, DockerRuntime, INSPECT_TIMEOUT, LIST_TIMEOUT, REMOVE_TIMEOUT};
use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{ListVolumesOptions, RemoveVolumeOptions};
use mpsfleet_types::task::StopCode;
use mpsfleet_types::RuntimePlugins;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// A task volume whose task has no container is removed with the task's last container, or,
/// left by a launch that never made its container (an agent stopped in between), once it is
/// this old: a younger one may belong to a launch in progress.
pub const ORPHAN_VOLUME_AGE: Duration = Duration::from_secs(10 * 60);

/// The most driver names of each kind kept from the engine's answer (the server bounds them too).
pub const MAX_PLUGINS: usize = 64;

/// The volume and log drivers of the engine at `socket` (`docker info`'s `Plugins`), sorted and
/// bounded; `local` is always among the volume drivers. Call it from async code.
pub async fn engine_plugins(socket: &std::path::Path, timeout: Duration) -> Result<RuntimePlugins, String> {
    let mut cfg = super::DockerConfig::new("probe", std::env::temp_dir());
    cfg.socket = socket.to_path_buf();
    let rt = DockerRuntime::connect(cfg, tokio::runtime::Handle::current()).map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || rt.plugins(timeout).map_err(|e| e.to_string()))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

fn bounded(names: Option<Vec<String>>, always: Option<&str>) -> Vec<String> {
    let mut v: Vec<String> = names
        .unwrap_or_default()
        .into_iter()
        .filter(|n| !n.is_empty() && n.len() <= 255 && n.bytes().all(|b| b.is_ascii_graphic()))
        .collect();
    if let Some(a) = always {
        v.push(a.to_string());
    }
    v.sort();
    v.dedup();
    v.truncate(MAX_PLUGINS);
    v
}

impl DockerRuntime {
    /// The engine's volume and log drivers.
    pub fn plugins(&self, timeout: Duration) -> Result<RuntimePlugins, DockerError> {
        let info = self.block("info", timeout, self.inner.docker.info())?;
        let p = info.plugins.unwrap_or_default();
        Ok(RuntimePlugins { volume: bounded(p.volume, Some("local")), log: bounded(p.log, None) })
    }

    /// Makes sure every Docker volume the container mounts is there: creates the task's own
    /// (Docker answers with the existing one when it is there already) and a missing shared
    /// one with `autoprovision`; a missing shared one without it fails the launch.
    pub(super) fn ensure_volumes(&self, l: &DockerLaunch) -> Result<(), (StopCode, String)> {
        let failed =
            |why: String| (StopCode::TaskFailedToStart, format!("ResourceInitializationError: {why}"));
        for v in volumes_needed(l, &self.inner.cfg.host_id) {
            let (name, request) = match v {
                VolumeSource::Task { docker_name, driver, driver_opts, labels } => {
                    (docker_name.clone(), request(docker_name, driver, driver_opts, labels))
                }
                VolumeSource::Shared { docker_name, autoprovision, driver, driver_opts, labels } => {
                    match self.block(
                        "inspect volume",
                        INSPECT_TIMEOUT,
                        self.inner.docker.inspect_volume(&docker_name),
                    ) {
                        Ok(_) => continue,
                        Err(e) if e.status() == Some(404) && autoprovision => {
                            (docker_name.clone(), request(docker_name, driver, driver_opts, labels))
                        }
                        Err(e) if e.status() == Some(404) => {
                            return Err(failed(format!(
                                "shared volume {docker_name} does not exist on this host and its \
                                 dockerVolumeConfiguration has no autoprovision"
                            )))
                        }
                        Err(e) => {
                            return Err(failed(format!(
                                "cannot inspect volume {docker_name}: {}",
                                e.message()
                            )))
                        }
                    }
                }
                VolumeSource::HostPath(_) | VolumeSource::AwsOnly(_) => continue,
            };
            self.block("create volume", INSPECT_TIMEOUT, self.inner.docker.create_volume(request))
                .map_err(|e| failed(format!("cannot create volume {name}: {}", e.message())))?;
        }
        Ok(())
    }

    /// Removes this host's task-scoped volumes whose task has no container left: those of the
    /// tasks in `ended` (whose containers were just removed), and any older than
    /// [`ORPHAN_VOLUME_AGE`]. Each failure is logged and tried again at the next call.
    pub fn remove_task_volumes_left(&self, ended: &HashSet<String>) -> Result<Vec<String>, DockerError> {
        let host = self.inner.cfg.host_id.clone();
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{}={host}", spec::LABEL_HOST), LABEL_VOLUME.to_string()],
        )]);
        let list = self.block(
            "list volumes",
            LIST_TIMEOUT,
            self.inner.docker.list_volumes(Some(ListVolumesOptions { filters: Some(filters) })),
        )?;
        let volumes = list.volumes.unwrap_or_default();
        if volumes.is_empty() {
            return Ok(Vec::new());
        }
        let live: HashSet<String> = self.list_ours()?.into_iter().map(|c| c.task_id).collect();
        let mut removed = Vec::new();
        for v in volumes {
            let Some(task) = v.labels.get(spec::LABEL_TASK) else { continue };
            if live.contains(task) {
                continue;
            }
            // The creation time as Docker writes it, whatever type the client gives it.
            let created_ms = serde_json::to_value(&v.created_at)
                .ok()
                .and_then(|c| c.as_str().and_then(super::parse_docker_time));
            let old = created_ms
                .is_some_and(|c| super::now_ms().saturating_sub(c) >= ORPHAN_VOLUME_AGE.as_millis() as u64);
            if !ended.contains(task) && !old {
                continue;
            }
            match self.block(
                "remove volume",
                REMOVE_TIMEOUT,
                self.inner.docker.remove_volume(&v.name, Some(RemoveVolumeOptions { force: false })),
            ) {
                Ok(()) => removed.push(v.name),
                Err(e) if e.status() == Some(404) => {}
                Err(e) => tracing::warn!(volume = %v.name, error = %e, "cannot remove the task's volume"),
            }
        }
        Ok(removed)
    }
}

fn request(
    name: String,
    driver: String,
    driver_opts: HashMap<String, String>,
    labels: HashMap<String, String>,
) -> VolumeCreateRequest {
    VolumeCreateRequest {
        name: Some(name),
        driver: Some(driver),
        driver_opts: (!driver_opts.is_empty()).then_some(driver_opts),
        labels: Some(labels),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_lists_are_sorted_bounded_and_local_is_always_there() {
        let v = bounded(
            Some(vec!["rexray".into(), "".into(), "bad name".into(), "rexray".into()]),
            Some("local"),
        );
        assert_eq!(v, ["local", "rexray"]);
        let many: Vec<String> = (0..100).map(|i| format!("d{i:03}")).collect();
        assert_eq!(bounded(Some(many), None).len(), MAX_PLUGINS);
        assert!(bounded(None, None).is_empty());
    }
}
