//! The environment a task's process gets: its own variables plus the GPU and MPS wiring.

use mpsfleet_types::{ContainerDefinition, GpuRequirement, GpuUuid, Task};
use std::path::Path;

/// Builds one container's environment.
///
/// - MPS containers get `CUDA_VISIBLE_DEVICES` set to their GPU (so device 0 is that GPU),
///   `CUDA_MPS_PIPE_DIRECTORY` of that GPU's daemon, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` as
///   `0=<MiB>M` from the declared memory, and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` only when
///   `maxComputePercent` is declared.
/// - Whole-GPU containers get their GPUs in `CUDA_VISIBLE_DEVICES` and no MPS variables.
/// - Containers without a GPU get `CUDA_VISIBLE_DEVICES` empty, so they cannot use a GPU by
///   accident.
///
/// The task's own variables come first and are overridden by these, which the task may not
/// change: they are what enforces its share of the GPU.
pub fn container_env(
    task: &Task,
    container: &ContainerDefinition,
    mps_pipe_dir: Option<&Path>,
) -> Vec<(String, String)> {
    let reserved = |name: &str| name.starts_with("CUDA_MPS_") || name == "CUDA_VISIBLE_DEVICES";
    let mut env: Vec<(String, String)> = container
        .environment
        .iter()
        .filter(|kv| !reserved(&kv.name))
        .map(|kv| (kv.name.clone(), kv.value.clone()))
        .collect();
    env.push(("MPSFLEET_TASK_ID".into(), task.id.to_string()));
    env.push(("MPSFLEET_CONTAINER_NAME".into(), container.name.clone()));
    let devices = |gpus: &[GpuUuid]| gpus.iter().map(GpuUuid::as_str).collect::<Vec<_>>().join(",");
    match container.gpu() {
        Some(GpuRequirement::Mps { sharing_strategy }) => {
            let mps = &sharing_strategy.nvidia_mps;
            env.push(("CUDA_VISIBLE_DEVICES".into(), devices(&task.gpu_ids)));
            if let Some(dir) = mps_pipe_dir {
                env.push(("CUDA_MPS_PIPE_DIRECTORY".into(), dir.display().to_string()));
            }
            env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), format!("0={}M", mps.memory)));
            if let Some(p) = mps.max_compute_percent {
                env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), p.to_string()));
            }
        }
        Some(GpuRequirement::Whole { .. }) => {
            env.push(("CUDA_VISIBLE_DEVICES".into(), devices(&task.gpu_ids)));
        }
        None => env.push(("CUDA_VISIBLE_DEVICES".into(), String::new())),
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(gpus: &[&str]) -> Task {
        serde_json::from_value(serde_json::json!({
            "id": "t-00000000000000aa", "taskDefinition": "f:1", "pool": "p",
            "lastStatus": "PENDING", "desiredStatus": "RUNNING", "healthStatus": "UNKNOWN",
            "hostId": "h-1", "gpuIds": gpus, "startedBy": "run:x", "createdAtMs": 0
        }))
        .unwrap()
    }

    fn container(gpu: serde_json::Value) -> ContainerDefinition {
        serde_json::from_value(serde_json::json!({
            "name": "main", "command": ["x"], "essential": true,
            "environment": [{"name": "A", "value": "1"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "all"}],
            "resourceRequirements": gpu
        }))
        .unwrap()
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn mps_containers_get_their_daemon_and_limits() {
        let c = container(
            serde_json::json!([{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096, "maxComputePercent": 25}}}]),
        );
        let env = container_env(&task(&["GPU-a"]), &c, Some(Path::new("/run/mps/0")));
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), Some("GPU-a"));
        assert_eq!(get(&env, "CUDA_MPS_PIPE_DIRECTORY"), Some("/run/mps/0"));
        assert_eq!(get(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=4096M"));
        assert_eq!(get(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
        assert_eq!(get(&env, "A"), Some("1"));
        assert_eq!(
            env.iter().filter(|(k, _)| k == "CUDA_VISIBLE_DEVICES").count(),
            1,
            "the task cannot override it"
        );
    }

    #[test]
    fn compute_limit_only_when_declared() {
        let c =
            container(serde_json::json!([{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 10}}}]));
        let env = container_env(&task(&["GPU-a"]), &c, Some(Path::new("/p")));
        assert_eq!(get(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), None);
    }

    #[test]
    fn whole_gpu_containers_get_their_gpus_and_no_mps() {
        let c = container(serde_json::json!([{"type": "GPU", "value": "2"}]));
        let env = container_env(&task(&["GPU-a", "GPU-b"]), &c, None);
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), Some("GPU-a,GPU-b"));
        assert!(env.iter().all(|(k, _)| !k.starts_with("CUDA_MPS_")));
    }

    #[test]
    fn gpu_less_containers_see_no_gpu() {
        let c = container(serde_json::json!([]));
        let env = container_env(&task(&[]), &c, None);
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), Some(""));
    }
}
