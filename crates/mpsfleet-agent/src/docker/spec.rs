//! The pure mapping from a task's container to Docker's container-create call, as the ECS
//! container agent renders it (shared/design/ecs-on-docker.md sections 1, 2, 3.10 and 4).
//!
//! Nothing here does I/O: [`create_body`] returns the name and the body, and the tests below
//! pin every field.

pub use super::names::*;
use super::{DockerLaunch, GpuWiring};
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, HostConfigLogConfig, PortBinding, RestartPolicy,
    RestartPolicyNameEnum,
};
use mpsfleet_types::{GpuRequirement, NetworkMode};
use std::collections::HashMap;
use std::net::IpAddr;

/// The NVIDIA container runtime's variable naming the GPUs a container gets.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// Docker CPU shares bounds on Linux (ECS clamps to these: unset, 0 and 1 become 2).
pub const CPU_SHARES_MIN: i64 = 2;
pub const CPU_SHARES_MAX: i64 = 262_144;
/// ECS raises a non-zero memory limit below this to it.
pub const MEMORY_MIN_MIB: u64 = 4;
const MIB: i64 = 1 << 20;
/// Docker's json-file log, capped: at most `max-file` files of `max-size` each.
pub const LOG_MAX_SIZE: &str = "10m";
pub const LOG_MAX_FILE: &str = "3";

/// Whether the container is given a GPU, and which (the task's GPUs, by UUID).
fn gpu_uuids(l: &DockerLaunch) -> Vec<String> {
    match l.container.gpu() {
        Some(_) => l.task.gpu_ids.iter().map(|g| g.as_str().to_string()).collect(),
        None => Vec::new(),
    }
}

/// What the runtime does differently from the definition, for the container's report.
pub fn launch_notes(l: &DockerLaunch) -> Vec<String> {
    let mut notes: Vec<String> = Vec::new();
    if l.gpus_emulated {
        notes.extend(
            gpu_uuids(l)
                .into_iter()
                .map(|uuid| format!("GPU {uuid} is emulated: no GPU runtime or device request was set")),
        );
    }
    notes.extend(super::options::notes(l));
    notes
}

/// The container's name and Docker's create body.
///
/// - `Image` as given; `Entrypoint` and `Cmd` only when given. Docker keeps the image's `Cmd`
///   only when neither is given: an `entryPoint` without `command` runs the entry point with
///   no arguments (the image's `Cmd` is dropped, as `docker run --entrypoint` does), which is
///   what ECS gets by sending `Entrypoint` alone.
/// - `Env` as `K=V` from `l.env` (already the task's variables plus the MPS ones), `User`,
///   `WorkingDir`, `Labels` = `dockerLabels` plus ours, which win.
/// - `HostConfig`: CPU shares clamped to [2, 262144]; memory in bytes (a non-zero limit below
///   4 MiB raised to 4 MiB); memory reservation in bytes; `Init` (Docker's tiny init is PID 1,
///   forwards SIGTERM to the task's process and reaps orphans, so a shell entry point still
///   stops on `docker stop`); a size-capped json-file log; restart policy `no` (the task loop
///   decides what happens after an exit); network mode bridge, host or none, or for
///   `awsvpc` `container:<the task's pause container>` (see [`super::awsvpc`]).
/// - The task-level `cpu` as a CPU quota (`NanoCpus`, 1024 units = one CPU) on every
///   container, the task-level `memory` as the hard limit of a container without its own.
/// - Ports: every mapping is exposed as `port/proto`; in bridge mode each is published on
///   `publish` (the agent's `--publish-address`) or, without one, on every address as ECS does
///   (`HostIp` empty: Docker binds `0.0.0.0` and `::`), on its `hostPort` or on one Docker
///   chooses (`HostPort` empty); host mode
///   publishes nothing (the ports are the host's), `none` has no ports to publish, nor has
///   `awsvpc` (the ports are on the task's own address; Docker refuses ports on a container
///   that joins another's namespace).
/// - GPU containers on a real GPU: [`GpuWiring::NvidiaRuntime`] sets `Runtime` and
///   `NVIDIA_VISIBLE_DEVICES=<uuid,...>` (ECS on EC2); [`GpuWiring::DeviceRequests`] sets one
///   device request with capabilities `[["gpu"]]` and the UUIDs as device ids, no driver and
///   no count (ECS Anywhere). Emulated GPUs get neither (see [`launch_notes`]).
/// - MPS containers also get the daemon's pipe directory bind-mounted at the same path.
/// - Volumes and Linux options: see [`super::options::apply`].
pub fn create_body(
    l: &DockerLaunch,
    host_id: &str,
    wiring: &GpuWiring,
    publish: Option<IpAddr>,
) -> (String, ContainerCreateBody) {
    let c = &l.container;
    let task_id = l.task.id.to_string();
    let name = container_name(host_id, &task_id, &c.name);

    let mut labels: HashMap<String, String> = c.docker_labels.clone().into_iter().collect();
    let family = l.definition.family.as_str().to_string();
    let revision = l.definition.revision.to_string();
    for (k, v) in [
        (LABEL_HOST, host_id.to_string()),
        (LABEL_TASK, task_id.clone()),
        (LABEL_CONTAINER, c.name.clone()),
        (LABEL_FAMILY, family.clone()),
        (LABEL_REVISION, revision.clone()),
        (ECS_LABEL_CONTAINER, c.name.clone()),
        (ECS_LABEL_FAMILY, family),
        (ECS_LABEL_REVISION, revision),
    ] {
        labels.insert(k.to_string(), v);
    }

    let uuids = gpu_uuids(l);
    let real_gpu = !uuids.is_empty() && !l.gpus_emulated;
    // Which GPUs a container sees is the agent's to say, never the definition's: on a host
    // whose default runtime is NVIDIA's, a task's own NVIDIA_VISIBLE_DEVICES=all would hand it
    // every GPU of the host.
    let mut env: Vec<String> =
        l.env.iter().filter(|(k, _)| k != NVIDIA_VISIBLE_DEVICES).map(|(k, v)| format!("{k}={v}")).collect();
    let mut runtime = None;
    let mut device_requests = None;
    if !real_gpu {
        // No GPU for this container, whatever runtime the engine uses by default.
        env.push(format!("{NVIDIA_VISIBLE_DEVICES}=void"));
    } else {
        match wiring {
            GpuWiring::NvidiaRuntime { runtime: r } => {
                env.push(format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(",")));
                runtime = Some(r.clone());
            }
            GpuWiring::DeviceRequests => {
                device_requests = Some(vec![DeviceRequest {
                    driver: None,
                    count: None,
                    device_ids: Some(uuids.clone()),
                    capabilities: Some(vec![vec!["gpu".to_string()]]),
                    options: None,
                }]);
            }
        }
    }

    let binds = match (&l.mps_pipe_dir, c.gpu()) {
        (Some(dir), Some(GpuRequirement::Mps { .. })) => {
            let d = dir.display();
            Some(vec![format!("{d}:{d}")])
        }
        _ => None,
    };

    let mode = l.definition.effective_network_mode();
    let exposed: Vec<String> =
        c.port_mappings.iter().map(|p| format!("{}/{}", p.container_port, p.protocol.as_str())).collect();
    let port_bindings = match mode {
        NetworkMode::Bridge if !c.port_mappings.is_empty() => {
            // Empty: every address, IPv4 and IPv6, as ECS leaves it.
            let host_ip = publish.map(|ip| ip.to_string()).unwrap_or_default();
            let mut map = HashMap::new();
            for p in &c.port_mappings {
                let host_port = match p.host_port {
                    Some(h) if h != 0 => h.to_string(),
                    _ => String::new(),
                };
                map.insert(
                    format!("{}/{}", p.container_port, p.protocol.as_str()),
                    Some(vec![PortBinding { host_ip: Some(host_ip.clone()), host_port: Some(host_port) }]),
                );
            }
            Some(map)
        }
        _ => None,
    };

    let cpu_shares = i64::from(c.cpu.unwrap_or(0)).clamp(CPU_SHARES_MIN, CPU_SHARES_MAX);
    // The task's own size: a CPU quota on each container, and its memory as the hard limit of a
    // container that sets none itself.
    let (task_nano_cpus, task_memory) = super::awsvpc::task_limits(&l.definition);
    let memory = c.memory.filter(|&m| m > 0).map(|m| mib_to_bytes(m.max(MEMORY_MIN_MIB))).or(task_memory);
    // awsvpc: the container joins its task's namespace, held by the task's pause container.
    let network_mode = match mode {
        NetworkMode::Awsvpc => format!("container:{}", super::awsvpc::pause_name(host_id, &task_id)),
        m => m.as_str().to_string(),
    };
    let memory_reservation = c.memory_reservation.filter(|&m| m > 0).map(mib_to_bytes);

    let mut host_config = HostConfig {
        cpu_shares: Some(cpu_shares),
        memory,
        memory_reservation,
        nano_cpus: task_nano_cpus,
        init: Some(true),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([
                ("max-size".to_string(), LOG_MAX_SIZE.to_string()),
                ("max-file".to_string(), LOG_MAX_FILE.to_string()),
            ])),
        }),
        network_mode: Some(network_mode),
        port_bindings,
        restart_policy: Some(RestartPolicy {
            name: Some(RestartPolicyNameEnum::NO),
            maximum_retry_count: None,
        }),
        binds,
        runtime,
        device_requests,
        ..Default::default()
    };

    let hostname = super::options::apply(l, host_id, &mut host_config);

    let body = ContainerCreateBody {
        image: c.image.clone(),
        entrypoint: (!c.entry_point.is_empty()).then(|| c.entry_point.clone()),
        cmd: (!c.command.is_empty()).then(|| c.command.clone()),
        env: Some(env),
        user: c.user.clone(),
        working_dir: c.working_directory.clone(),
        labels: Some(labels),
        exposed_ports: (!exposed.is_empty() && matches!(mode, NetworkMode::Bridge | NetworkMode::Host))
            .then_some(exposed),
        stop_timeout: Some(i64::try_from(l.stop_timeout.as_secs()).unwrap_or(i64::MAX)),
        host_config: Some(host_config),
        hostname,
        ..Default::default()
    };
    (name, body)
}

fn mib_to_bytes(mib: u64) -> i64 {
    i64::try_from(mib).unwrap_or(i64::MAX).saturating_mul(MIB)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{ContainerDefinition, Task, TaskDefinition};
    use std::path::PathBuf;
    use std::time::Duration;

    fn task(gpus: &[&str]) -> Task {
        serde_json::from_value(serde_json::json!({
            "id": "t-00000000000000aa", "taskDefinition": "fam:3", "pool": "p",
            "lastStatus": "PENDING", "desiredStatus": "RUNNING", "healthStatus": "UNKNOWN",
            "gpuIds": gpus, "startedBy": "run:x", "createdAtMs": 1,
        }))
        .expect("task json")
    }

    fn container(json: serde_json::Value) -> ContainerDefinition {
        let mut base = serde_json::json!({"name": "app", "image": "busybox", "essential": true});
        if let (Some(b), Some(extra)) = (base.as_object_mut(), json.as_object()) {
            b.extend(extra.clone());
        }
        serde_json::from_value(base).expect("container json")
    }

    fn launch(c: ContainerDefinition, network_mode: Option<&str>, gpus: &[&str]) -> DockerLaunch {
        let definition: TaskDefinition = serde_json::from_value(serde_json::json!({
            "family": "fam", "revision": 3, "containerDefinitions": [],
            "networkMode": network_mode,
        }))
        .expect("definition json");
        DockerLaunch {
            task: task(gpus),
            definition,
            container: c,
            env: vec![("A".into(), "1".into())],
            mps_pipe_dir: None,
            gpus_emulated: false,
            stop_timeout: Duration::from_secs(30),
        }
    }

    fn body(l: &DockerLaunch) -> ContainerCreateBody {
        create_body(l, "h1", &GpuWiring::NvidiaRuntime { runtime: "nvidia".into() }, None).1
    }

    fn hc(l: &DockerLaunch) -> HostConfig {
        body(l).host_config.expect("host config")
    }

    #[test]
    fn names_are_deterministic_and_sanitised() {
        let check = |h: &str, t: &str, c: &str, want: &str| assert_eq!(container_name(h, t, c), want);
        check("h1", "t-01", "app", "mpsfleet-h1-t-01-app");
        check("host 1", "t/01", "a:b", "mpsfleet-host-1-t-01-a-b");
        check("h.1_x", "t", "é", "mpsfleet-h.1_x-t--");
    }

    #[test]
    fn image_command_entrypoint() {
        let check = |json: serde_json::Value, ep: Option<Vec<&str>>, cmd: Option<Vec<&str>>| {
            let b = body(&launch(container(json.clone()), None, &[]));
            let own = |v: Option<Vec<&str>>| v.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(b.image.as_deref(), Some("busybox"), "{json}");
            assert_eq!(b.entrypoint, own(ep), "{json}");
            assert_eq!(b.cmd, own(cmd), "{json}");
        };
        check(serde_json::json!({}), None, None);
        check(serde_json::json!({"command": ["echo", "hi"]}), None, Some(vec!["echo", "hi"]));
        check(serde_json::json!({"entryPoint": ["/bin/sh", "-c"]}), Some(vec!["/bin/sh", "-c"]), None);
        check(
            serde_json::json!({"entryPoint": ["sh", "-c"], "command": ["echo hi"]}),
            Some(vec!["sh", "-c"]),
            Some(vec!["echo hi"]),
        );
    }

    #[test]
    fn env_user_workdir_labels() {
        let c = container(serde_json::json!({
            "user": "1000:1000", "workingDirectory": "/work",
            "dockerLabels": {"team": "ml", "io.mpsfleet.task": "forged", "com.amazonaws.ecs.container-name": "x"},
        }));
        let b = body(&launch(c, None, &[]));
        assert_eq!(b.env, Some(vec!["A=1".to_string(), "NVIDIA_VISIBLE_DEVICES=void".to_string()]));
        assert_eq!(b.user.as_deref(), Some("1000:1000"));
        assert_eq!(b.working_dir.as_deref(), Some("/work"));
        let labels = b.labels.expect("labels");
        let want: HashMap<String, String> = [
            ("team", "ml"),
            (LABEL_HOST, "h1"),
            (LABEL_TASK, "t-00000000000000aa"),
            (LABEL_CONTAINER, "app"),
            (LABEL_FAMILY, "fam"),
            (LABEL_REVISION, "3"),
            (ECS_LABEL_CONTAINER, "app"),
            (ECS_LABEL_FAMILY, "fam"),
            (ECS_LABEL_REVISION, "3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, want);
        assert_eq!(b.stop_timeout, Some(30));
    }

    #[test]
    fn cpu_and_memory() {
        // (cpu, memory MiB, reservation MiB) -> (shares, memory bytes, reservation bytes)
        let table: &[(serde_json::Value, i64, Option<i64>, Option<i64>)] = &[
            (serde_json::json!({}), 2, None, None),
            (serde_json::json!({"cpu": 0}), 2, None, None),
            (serde_json::json!({"cpu": 1}), 2, None, None),
            (serde_json::json!({"cpu": 512}), 512, None, None),
            (serde_json::json!({"cpu": 300000}), 262_144, None, None),
            (serde_json::json!({"memory": 512}), 2, Some(512 * MIB), None),
            (serde_json::json!({"memory": 2}), 2, Some(4 * MIB), None),
            (serde_json::json!({"memory": 0}), 2, None, None),
            (
                serde_json::json!({"memory": 256, "memoryReservation": 128}),
                2,
                Some(256 * MIB),
                Some(128 * MIB),
            ),
        ];
        for (json, shares, memory, reservation) in table {
            let h = hc(&launch(container(json.clone()), None, &[]));
            assert_eq!(h.cpu_shares, Some(*shares), "{json}");
            assert_eq!(h.memory, *memory, "{json}");
            assert_eq!(h.memory_reservation, *reservation, "{json}");
        }
    }

    #[test]
    fn fixed_host_config() {
        let h = hc(&launch(container(serde_json::json!({})), None, &[]));
        assert_eq!(h.init, Some(true));
        let log = h.log_config.expect("log config");
        assert_eq!(log.typ.as_deref(), Some("json-file"));
        let opts = log.config.expect("log options");
        assert_eq!(opts.get("max-size").map(String::as_str), Some("10m"));
        assert_eq!(opts.get("max-file").map(String::as_str), Some("3"));
        assert_eq!(opts.len(), 2);
        assert_eq!(h.restart_policy.and_then(|r| r.name), Some(RestartPolicyNameEnum::NO));
        assert_eq!(h.runtime, None);
        assert_eq!(h.device_requests, None);
        assert_eq!(h.binds, None);
    }

    #[test]
    fn network_modes_and_ports() {
        let ports = serde_json::json!({"portMappings": [
            {"containerPort": 8080},
            {"containerPort": 53, "hostPort": 5353, "protocol": "udp"},
        ]});
        let binding = |port: &str| {
            Some(vec![PortBinding { host_ip: Some(String::new()), host_port: Some(port.into()) }])
        };
        let exposed = Some(vec!["8080/tcp".to_string(), "53/udp".to_string()]);
        /// (networkMode, Docker's NetworkMode, ExposedPorts, PortBindings)
        type Row<'a> = (Option<&'a str>, &'a str, Option<Vec<String>>, Option<bollard::models::PortMap>);
        let table: Vec<Row<'_>> = vec![
            (
                None,
                "bridge",
                exposed.clone(),
                Some(HashMap::from([("8080/tcp".into(), binding("")), ("53/udp".into(), binding("5353"))])),
            ),
            (
                Some("bridge"),
                "bridge",
                exposed.clone(),
                Some(HashMap::from([("8080/tcp".into(), binding("")), ("53/udp".into(), binding("5353"))])),
            ),
            (Some("awsvpc"), "container:mpsfleet-h1-t-00000000000000aa-.pause", None, None),
            (Some("host"), "host", exposed.clone(), None),
            (Some("none"), "none", None, None),
        ];
        for (mode, docker_mode, want_exposed, want_bindings) in table {
            let b = body(&launch(container(ports.clone()), mode, &[]));
            let h = b.host_config.clone().expect("host config");
            assert_eq!(h.network_mode.as_deref(), Some(docker_mode), "{mode:?}");
            assert_eq!(b.exposed_ports, want_exposed, "{mode:?}");
            assert_eq!(h.port_bindings, want_bindings, "{mode:?}");
        }
        // No mappings: nothing exposed or published.
        let b = body(&launch(container(serde_json::json!({})), None, &[]));
        assert_eq!(b.exposed_ports, None);
        assert_eq!(b.host_config.and_then(|h| h.port_bindings), None);
    }

    #[test]
    fn ports_are_published_on_the_publish_address() {
        let ports = serde_json::json!({"portMappings": [
            {"containerPort": 8080},
            {"containerPort": 53, "hostPort": 5353, "protocol": "udp"},
        ]});
        let bindings = |publish: Option<&str>| {
            let l = launch(container(ports.clone()), None, &[]);
            let ip = publish.map(|p| p.parse::<IpAddr>().expect("address"));
            let (_, b) = create_body(&l, "h1", &GpuWiring::DeviceRequests, ip);
            let map = b.host_config.and_then(|h| h.port_bindings).expect("bindings");
            let mut out: Vec<(String, String, String)> = map
                .into_iter()
                .flat_map(|(key, list)| {
                    list.unwrap_or_default().into_iter().map(move |p| {
                        (key.clone(), p.host_ip.unwrap_or_default(), p.host_port.unwrap_or_default())
                    })
                })
                .collect();
            out.sort();
            out
        };
        let row = |key: &str, ip: &str, port: &str| (key.to_string(), ip.to_string(), port.to_string());
        // (--publish-address, the HostIp of each binding): none is every address, as ECS.
        let table = [
            (None, ""),
            (Some("127.0.0.1"), "127.0.0.1"),
            (Some("::1"), "::1"),
            (Some("0.0.0.0"), "0.0.0.0"),
        ];
        for (publish, host_ip) in table {
            assert_eq!(
                bindings(publish),
                vec![row("53/udp", host_ip, "5353"), row("8080/tcp", host_ip, "")],
                "{publish:?}"
            );
        }
        // Host mode publishes nothing, whatever the address.
        let l = launch(container(ports.clone()), Some("host"), &[]);
        let (_, b) = create_body(&l, "h1", &GpuWiring::DeviceRequests, Some(IpAddr::from([127, 0, 0, 1])));
        assert_eq!(b.host_config.and_then(|h| h.port_bindings), None);
    }

    const GPU: &str = "GPU-11111111-2222-3333-4444-555555555555";
    const GPU2: &str = "GPU-aaaaaaaa-2222-3333-4444-555555555555";

    fn mps_launch(compute: Option<u8>) -> DockerLaunch {
        let mut mps = serde_json::json!({"memory": 2048});
        if let Some(p) = compute {
            mps["maxComputePercent"] = p.into();
        }
        let c = container(serde_json::json!({
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": mps}}],
        }));
        let dir = PathBuf::from("/run/mpsfleet/mps/gpu0");
        let mut l = launch(c, None, &[GPU]);
        l.env = crate::env::container_env(&l.task, &l.container, Some(&dir));
        l.mps_pipe_dir = Some(dir);
        l
    }

    fn env_of(b: &ContainerCreateBody) -> Vec<String> {
        b.env.clone().unwrap_or_default()
    }

    #[test]
    fn mps_container_nvidia_runtime() {
        let l = mps_launch(Some(25));
        let (_, b) = create_body(&l, "h1", &GpuWiring::NvidiaRuntime { runtime: "nvidia".into() }, None);
        let h = b.host_config.clone().expect("host config");
        assert_eq!(h.runtime.as_deref(), Some("nvidia"));
        assert_eq!(h.device_requests, None);
        assert_eq!(h.binds, Some(vec!["/run/mpsfleet/mps/gpu0:/run/mpsfleet/mps/gpu0".to_string()]));
        let env = env_of(&b);
        for want in [
            format!("NVIDIA_VISIBLE_DEVICES={GPU}"),
            "CUDA_MPS_PIPE_DIRECTORY=/run/mpsfleet/mps/gpu0".to_string(),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M".to_string(),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string(),
        ] {
            assert!(env.contains(&want), "{want} not in {env:?}");
        }
        assert!(launch_notes(&l).is_empty());
    }

    #[test]
    fn mps_container_device_requests() {
        let l = mps_launch(None);
        let (_, b) = create_body(&l, "h1", &GpuWiring::DeviceRequests, None);
        let h = b.host_config.clone().expect("host config");
        assert_eq!(h.runtime, None);
        assert_eq!(
            h.device_requests,
            Some(vec![DeviceRequest {
                driver: None,
                count: None,
                device_ids: Some(vec![GPU.to_string()]),
                capabilities: Some(vec![vec!["gpu".to_string()]]),
                options: None,
            }])
        );
        assert_eq!(h.binds, Some(vec!["/run/mpsfleet/mps/gpu0:/run/mpsfleet/mps/gpu0".to_string()]));
        let env = env_of(&b);
        assert!(env.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M".to_string()), "{env:?}");
        assert!(env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/run/mpsfleet/mps/gpu0".to_string()), "{env:?}");
        assert!(!env.iter().any(|e| e.starts_with("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=")), "{env:?}");
        assert!(!env.iter().any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=")), "{env:?}");
    }

    #[test]
    fn a_container_without_a_gpu_sees_none_whatever_its_environment_says() {
        let c = container(serde_json::json!({}));
        let mut l = launch(c, None, &[]);
        l.env.push(("NVIDIA_VISIBLE_DEVICES".into(), "all".into()));
        for wiring in [GpuWiring::NvidiaRuntime { runtime: "nvidia".into() }, GpuWiring::DeviceRequests] {
            let (_, b) = create_body(&l, "h1", &wiring, None);
            let env = env_of(&b);
            let nvidia: Vec<&String> =
                env.iter().filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=")).collect();
            assert_eq!(nvidia, vec!["NVIDIA_VISIBLE_DEVICES=void"], "{env:?}");
            let h = b.host_config.expect("host config");
            assert_eq!((h.runtime, h.device_requests), (None, None));
        }
        // A GPU container sees exactly its own GPU, not the one its environment names.
        let gpu = container(serde_json::json!({"resourceRequirements": [{"type": "GPU", "value": "1"}]}));
        let mut l = launch(gpu, None, &[GPU]);
        l.env.push(("NVIDIA_VISIBLE_DEVICES".into(), "all".into()));
        let (_, b) = create_body(&l, "h1", &GpuWiring::NvidiaRuntime { runtime: "nvidia".into() }, None);
        let env = env_of(&b);
        let nvidia: Vec<&String> = env.iter().filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=")).collect();
        assert_eq!(nvidia, vec![&format!("NVIDIA_VISIBLE_DEVICES={GPU}")], "{env:?}");
    }

    #[test]
    fn whole_gpus_both_wirings() {
        let c = container(serde_json::json!({"resourceRequirements": [{"type": "GPU", "value": "2"}]}));
        let l = launch(c, None, &[GPU, GPU2]);
        let (_, b) =
            create_body(&l, "h1", &GpuWiring::NvidiaRuntime { runtime: "nvidia-custom".into() }, None);
        let h = b.host_config.clone().expect("host config");
        assert_eq!(h.runtime.as_deref(), Some("nvidia-custom"));
        assert_eq!(h.binds, None);
        assert!(env_of(&b).contains(&format!("NVIDIA_VISIBLE_DEVICES={GPU},{GPU2}")));
        let (_, b) = create_body(&l, "h1", &GpuWiring::DeviceRequests, None);
        let h = b.host_config.expect("host config");
        assert_eq!(h.runtime, None);
        let req = h.device_requests.expect("device requests");
        assert_eq!(req.len(), 1);
        assert_eq!(req[0].device_ids, Some(vec![GPU.to_string(), GPU2.to_string()]));
        assert_eq!(req[0].capabilities, Some(vec![vec!["gpu".to_string()]]));
    }

    #[test]
    fn emulated_gpu_gets_no_wiring_and_a_note() {
        let mut l = mps_launch(None);
        l.gpus_emulated = true;
        for wiring in [GpuWiring::NvidiaRuntime { runtime: "nvidia".into() }, GpuWiring::DeviceRequests] {
            let (_, b) = create_body(&l, "h1", &wiring, None);
            let h = b.host_config.clone().expect("host config");
            assert_eq!(h.runtime, None);
            assert_eq!(h.device_requests, None);
            let env = env_of(&b);
            let nvidia: Vec<&String> =
                env.iter().filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=")).collect();
            assert_eq!(nvidia, vec!["NVIDIA_VISIBLE_DEVICES=void"], "an emulated GPU is no GPU");
            // The pipe directory is still mounted: the emulated daemon listens there.
            assert_eq!(h.binds, Some(vec!["/run/mpsfleet/mps/gpu0:/run/mpsfleet/mps/gpu0".to_string()]));
        }
        assert_eq!(
            launch_notes(&l),
            vec![format!("GPU {GPU} is emulated: no GPU runtime or device request was set")]
        );
    }

    #[test]
    fn no_gpu_no_wiring() {
        let l = launch(container(serde_json::json!({})), None, &[GPU]);
        let h = hc(&l);
        assert_eq!(h.runtime, None);
        assert_eq!(h.device_requests, None);
        assert!(launch_notes(&l).is_empty());
    }
}

/// Volumes and Linux options, field by field (`super::options`).
#[cfg(test)]
mod option_tests {
    use super::*;
    use bollard::models::{DeviceMapping, ResourcesUlimits};
    use mpsfleet_types::TaskDefinition;
    use serde_json::{json, Value};
    use std::time::Duration;

    fn launch_of(top: Value, container: Value) -> DockerLaunch {
        let mut c = json!({"name": "app", "image": "busybox", "essential": true});
        if let (Some(o), Value::Object(e)) = (c.as_object_mut(), container) {
            o.extend(e);
        }
        let mut d = json!({"family": "fam", "revision": 3, "containerDefinitions": [c.clone()]});
        if let (Some(o), Value::Object(e)) = (d.as_object_mut(), top) {
            o.extend(e);
        }
        let definition: TaskDefinition = serde_json::from_value(d).expect("definition");
        let task = serde_json::from_value(json!({
            "id": "t-00000000000000aa", "taskDefinition": "fam:3", "pool": "p",
            "lastStatus": "PENDING", "desiredStatus": "RUNNING", "healthStatus": "UNKNOWN",
            "gpuIds": [], "startedBy": "run:x", "createdAtMs": 1,
        }))
        .expect("task");
        DockerLaunch {
            task,
            container: definition.container_definitions[0].clone(),
            definition,
            env: vec![],
            mps_pipe_dir: None,
            gpus_emulated: false,
            stop_timeout: Duration::from_secs(30),
        }
    }

    fn body_of(l: &DockerLaunch) -> ContainerCreateBody {
        create_body(l, "h1", &GpuWiring::DeviceRequests, None).1
    }

    fn hc_of(l: &DockerLaunch) -> HostConfig {
        body_of(l).host_config.expect("host config")
    }

    fn strings(v: &[&str]) -> Option<Vec<String>> {
        Some(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn mount_points_bind_host_paths_task_and_shared_volumes() {
        let l = launch_of(
            json!({"volumes": [
                {"name": "data", "host": {"sourcePath": "/srv/data"}},
                {"name": "scratch", "host": {}},
                {"name": "plain"},
                {"name": "cache", "dockerVolumeConfiguration": {"scope": "shared", "driver": "local"}},
                {"name": "tv", "dockerVolumeConfiguration": {"scope": "task"}},
            ]}),
            json!({"mountPoints": [
                {"sourceVolume": "data", "containerPath": "/data", "readOnly": true},
                {"sourceVolume": "scratch", "containerPath": "/scratch"},
                {"sourceVolume": "plain", "containerPath": "/plain"},
                {"sourceVolume": "cache", "containerPath": "/cache"},
                {"sourceVolume": "tv", "containerPath": "/tv", "readOnly": true},
            ]}),
        );
        let hc = hc_of(&l);
        assert_eq!(
            hc.binds,
            strings(&[
                "/srv/data:/data:ro",
                "mpsfleet-h1-t-00000000000000aa-scratch:/scratch",
                "mpsfleet-h1-t-00000000000000aa-plain:/plain",
                "cache:/cache",
                "mpsfleet-h1-t-00000000000000aa-tv:/tv:ro",
            ])
        );
        // The Docker volumes the runtime makes (task scope) or finds (shared scope).
        let needed = super::super::options::volumes_needed(&l, "h1");
        let names: Vec<String> = needed
            .iter()
            .map(|v| match v {
                super::super::options::VolumeSource::Task { docker_name, labels, .. } => {
                    assert_eq!(labels.get(LABEL_TASK).map(String::as_str), Some("t-00000000000000aa"));
                    format!("task {docker_name}")
                }
                super::super::options::VolumeSource::Shared { docker_name, autoprovision, .. } => {
                    format!("shared {docker_name} {autoprovision}")
                }
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names,
            [
                "task mpsfleet-h1-t-00000000000000aa-scratch",
                "task mpsfleet-h1-t-00000000000000aa-plain",
                "shared cache false",
                "task mpsfleet-h1-t-00000000000000aa-tv"
            ]
        );
    }

    #[test]
    fn mps_pipe_bind_is_kept_next_to_mount_points() {
        let mut l = launch_of(
            json!({"volumes": [{"name": "d", "host": {"sourcePath": "/d"}}]}),
            json!({"mountPoints": [{"sourceVolume": "d", "containerPath": "/d"}],
                   "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}),
        );
        l.mps_pipe_dir = Some("/run/mps".into());
        assert_eq!(hc_of(&l).binds, strings(&["/run/mps:/run/mps", "/d:/d"]));
    }

    #[test]
    fn volumes_from_names_the_other_containers_docker_name() {
        let l = launch_of(
            json!({}),
            json!({"volumesFrom": [{"sourceContainer": "db"}, {"sourceContainer": "x", "readOnly": true}]}),
        );
        assert_eq!(
            hc_of(&l).volumes_from,
            strings(&["mpsfleet-h1-t-00000000000000aa-db", "mpsfleet-h1-t-00000000000000aa-x:ro"])
        );
    }

    #[test]
    fn capabilities_devices_init_shm_tmpfs() {
        let l = launch_of(
            json!({}),
            json!({"linuxParameters": {
                "capabilities": {"add": ["SYS_PTRACE"], "drop": ["NET_RAW", "MKNOD"]},
                "devices": [{"hostPath": "/dev/fuse"}, {"hostPath": "/dev/a", "containerPath": "/dev/b", "permissions": ["read"]}],
                "initProcessEnabled": false,
                "sharedMemorySize": 256,
                "tmpfs": [{"containerPath": "/run", "size": 64, "mountOptions": ["noexec", "mode=1777"]}, {"containerPath": "/t", "size": 1}]
            }}),
        );
        let hc = hc_of(&l);
        assert_eq!(hc.cap_add, strings(&["SYS_PTRACE"]));
        assert_eq!(hc.cap_drop, strings(&["NET_RAW", "MKNOD"]));
        assert_eq!(
            hc.devices,
            Some(vec![
                DeviceMapping {
                    path_on_host: Some("/dev/fuse".into()),
                    path_in_container: Some("/dev/fuse".into()),
                    cgroup_permissions: Some("rwm".into())
                },
                DeviceMapping {
                    path_on_host: Some("/dev/a".into()),
                    path_in_container: Some("/dev/b".into()),
                    cgroup_permissions: Some("r".into())
                },
            ])
        );
        assert_eq!(hc.init, Some(false));
        assert_eq!(hc.shm_size, Some(256 << 20));
        let tmpfs = hc.tmpfs.expect("tmpfs");
        assert_eq!(tmpfs.get("/run").map(String::as_str), Some("noexec,mode=1777,size=64m"));
        assert_eq!(tmpfs.get("/t").map(String::as_str), Some("size=1m"));
        // Without linuxParameters: Docker's init stays, nothing else is set.
        let hc = hc_of(&launch_of(json!({}), json!({})));
        assert_eq!(
            (hc.init, hc.cap_add, hc.devices, hc.shm_size, hc.tmpfs),
            (Some(true), None, None, None, None)
        );
        assert_eq!(
            hc_of(&launch_of(json!({}), json!({"linuxParameters": {"initProcessEnabled": true}}))).init,
            Some(true)
        );
    }

    #[test]
    fn max_swap_and_swappiness_need_memory() {
        let hc = hc_of(&launch_of(
            json!({}),
            json!({"memory": 100, "linuxParameters": {"maxSwap": 50, "swappiness": 10}}),
        ));
        assert_eq!(
            (hc.memory, hc.memory_swap, hc.memory_swappiness),
            (Some(100 << 20), Some(150 << 20), Some(10))
        );
        let hc = hc_of(&launch_of(json!({}), json!({"memory": 100, "linuxParameters": {"maxSwap": 0}})));
        assert_eq!((hc.memory_swap, hc.memory_swappiness), (Some(100 << 20), Some(60)));
        let l = launch_of(json!({}), json!({"linuxParameters": {"maxSwap": 50, "swappiness": 10}}));
        let hc = hc_of(&l);
        assert_eq!((hc.memory_swap, hc.memory_swappiness), (None, None));
        assert!(
            launch_notes(&l).iter().any(|n| n.contains("maxSwap is not applied")),
            "{:?}",
            launch_notes(&l)
        );
        let hc = hc_of(&launch_of(json!({}), json!({"memory": 100, "linuxParameters": {"swappiness": 10}})));
        assert_eq!((hc.memory_swap, hc.memory_swappiness), (None, None));
    }

    #[test]
    fn ulimits_sysctls_privileged_readonly() {
        let l = launch_of(
            json!({}),
            json!({
                "ulimits": [{"name": "nofile", "softLimit": 1024, "hardLimit": 4096}, {"name": "memlock", "softLimit": -1, "hardLimit": -1}],
                "systemControls": [{"namespace": "net.core.somaxconn", "value": "1024"}],
                "privileged": true, "readonlyRootFilesystem": true
            }),
        );
        let hc = hc_of(&l);
        assert_eq!(
            hc.ulimits,
            Some(vec![
                ResourcesUlimits { name: Some("nofile".into()), soft: Some(1024), hard: Some(4096) },
                ResourcesUlimits { name: Some("memlock".into()), soft: Some(-1), hard: Some(-1) },
            ])
        );
        assert_eq!(hc.sysctls, Some(HashMap::from([("net.core.somaxconn".to_string(), "1024".to_string())])));
        assert_eq!((hc.privileged, hc.readonly_rootfs), (Some(true), Some(true)));
        let hc = hc_of(&launch_of(json!({}), json!({})));
        assert_eq!((hc.ulimits, hc.sysctls, hc.privileged, hc.readonly_rootfs), (None, None, None, None));
    }

    #[test]
    fn pid_and_ipc_modes() {
        let modes = |pid: Option<&str>, ipc: Option<&str>| {
            let hc = hc_of(&launch_of(json!({"pidMode": pid, "ipcMode": ipc}), json!({})));
            (hc.pid_mode, hc.ipc_mode)
        };
        let holder = "container:mpsfleet-h1-t-00000000000000aa-.pause".to_string();
        assert_eq!(modes(None, None), (None, None));
        assert_eq!(modes(Some("host"), Some("host")), (Some("host".into()), Some("host".into())));
        assert_eq!(modes(Some("task"), Some("task")), (Some(holder.clone()), Some(holder)));
        assert_eq!(modes(None, Some("none")), (None, Some("none".into())));
    }

    #[test]
    fn dns_extra_hosts_hostname_and_not_in_awsvpc() {
        let c = json!({
            "dnsServers": ["10.0.0.2"], "dnsSearchDomains": ["corp.example"],
            "extraHosts": [{"hostname": "db.local", "ipAddress": "10.1.2.3"}], "hostname": "worker-1"
        });
        let l = launch_of(json!({}), c.clone());
        let b = body_of(&l);
        let hc = b.host_config.clone().expect("host config");
        assert_eq!(hc.dns, strings(&["10.0.0.2"]));
        assert_eq!(hc.dns_search, strings(&["corp.example"]));
        assert_eq!(hc.extra_hosts, strings(&["db.local:10.1.2.3"]));
        assert_eq!(b.hostname.as_deref(), Some("worker-1"));
        assert!(launch_notes(&l).is_empty(), "{:?}", launch_notes(&l));

        let l = launch_of(json!({"networkMode": "awsvpc"}), c);
        let b = body_of(&l);
        let hc = b.host_config.clone().expect("host config");
        assert_eq!((hc.dns, hc.dns_search, hc.extra_hosts, b.hostname), (None, None, None, None));
        assert_eq!(launch_notes(&l).len(), 4, "{:?}", launch_notes(&l));
    }
}
