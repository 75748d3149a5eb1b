//! `awsvpc` on Docker Engine, pure parts: the host's network for such tasks, each task's
//! namespace holder ("pause") container and the image it runs, made offline.
//!
//! As ECS's agent does on EC2, each awsvpc task gets one pause container that owns the task's
//! network namespace and its address, here on one user-defined bridge network of the engine
//! ([`NETWORK_NAME`]); every container of the task joins that namespace
//! (`NetworkMode: container:<pause>`), so they share the address and reach each other on
//! localhost, and their ports are reached at the task's address without host ports.
//!
//! The pause image is made by the agent itself, with no registry: a static ELF of a few
//! hundred bytes that waits in `pause(2)` (`ppoll` on aarch64) forever, in a one-file rootfs
//! tar imported as [`pause_image`]. The container stops with SIGKILL (`StopSignal`): as PID 1
//! of its namespace it would ignore SIGTERM.

use super::names::{self, container_name};
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, RestartPolicy, RestartPolicyNameEnum,
};
use mpsfleet_types::{Task, TaskDefinition};
use std::collections::HashMap;

/// The engine's network for awsvpc tasks, shared by every agent of the engine: made by the
/// first awsvpc launch, labelled, never removed (an empty bridge network costs nothing, and
/// removing it would race with another launch).
pub const NETWORK_NAME: &str = "mpsfleet-awsvpc";
/// The label on that network.
pub const NETWORK_LABEL: &str = "io.mpsfleet.network";
pub const NETWORK_LABEL_VALUE: &str = "awsvpc";
/// The pause container's name within its task (its `io.mpsfleet.container` label). A `.` is in
/// no ECS container name, so no container of a definition can take it.
pub const PAUSE_CONTAINER: &str = ".pause";
/// The label marking a task's pause container.
pub const LABEL_ROLE: &str = "io.mpsfleet.role";
pub const ROLE_PAUSE: &str = "pause";
/// The repository of the pause image; its tag is the agent's version.
pub const PAUSE_REPOSITORY: &str = "mpsfleet/pause";
/// Where the pause program lies in its image.
pub const PAUSE_PATH: &str = "/pause";

/// `mpsfleet/pause:<agent version>`.
pub fn pause_image() -> String {
    format!("{PAUSE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
}

/// The name of the task's pause container.
pub fn pause_name(host_id: &str, task_id: &str) -> String {
    container_name(host_id, task_id, PAUSE_CONTAINER)
}

/// Docker's create body for the network ([`NETWORK_NAME`], bridge driver, labelled).
pub fn network_request() -> bollard::models::NetworkCreateRequest {
    bollard::models::NetworkCreateRequest {
        name: NETWORK_NAME.to_string(),
        driver: Some("bridge".into()),
        labels: Some(HashMap::from([(NETWORK_LABEL.to_string(), NETWORK_LABEL_VALUE.to_string())])),
        ..Default::default()
    }
}

/// The pause container of `task`, on the network `network` (its id or name): labelled as the
/// task's containers are, plus [`LABEL_ROLE`]; every port of the task's containers exposed (for
/// `docker ps`; nothing is published); no log; stopped by SIGKILL at once.
pub fn pause_body(
    task: &Task,
    definition: &TaskDefinition,
    host_id: &str,
    network: &str,
) -> (String, ContainerCreateBody) {
    let task_id = task.id.to_string();
    let name = pause_name(host_id, &task_id);
    let family = definition.family.as_str().to_string();
    let revision = definition.revision.to_string();
    let labels: HashMap<String, String> = [
        (names::LABEL_HOST, host_id.to_string()),
        (names::LABEL_TASK, task_id),
        (names::LABEL_CONTAINER, PAUSE_CONTAINER.to_string()),
        (names::LABEL_FAMILY, family.clone()),
        (names::LABEL_REVISION, revision.clone()),
        (names::ECS_LABEL_FAMILY, family),
        (names::ECS_LABEL_REVISION, revision),
        (LABEL_ROLE, ROLE_PAUSE.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut exposed: Vec<String> = definition
        .container_definitions
        .iter()
        .flat_map(|c| &c.port_mappings)
        .map(|p| format!("{}/{}", p.container_port, p.protocol.as_str()))
        .collect();
    exposed.sort();
    exposed.dedup();
    let body = ContainerCreateBody {
        image: Some(pause_image()),
        cmd: Some(vec![PAUSE_PATH.to_string()]),
        labels: Some(labels),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        stop_signal: Some("SIGKILL".into()),
        stop_timeout: Some(1),
        host_config: Some(HostConfig {
            network_mode: Some(network.to_string()),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    (name, body)
}

/// The pause program for an engine of this architecture (`docker info`'s `Architecture`), as a
/// static ELF executable; None for an architecture it is not made for.
pub fn pause_elf(architecture: &str) -> Option<Vec<u8>> {
    match architecture {
        // loop: mov eax, 34 (pause); syscall; jmp loop
        "x86_64" | "amd64" => Some(elf64(0x3e, &[0xb8, 0x22, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7])),
        // loop: mov x8, #73 (ppoll); mov x0..x3, #0; svc #0; b loop
        "aarch64" | "arm64" => {
            let words: [u32; 7] =
                [0xd280_0928, 0xd280_0000, 0xd280_0001, 0xd280_0002, 0xd280_0003, 0xd400_0001, 0x17ff_fffa];
            Some(elf64(0xb7, &words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>()))
        }
        _ => None,
    }
}

/// A little-endian ELF64 executable of one loadable segment (the whole file, read and
/// execute, at 0x400000) whose code follows the headers.
fn elf64(machine: u16, code: &[u8]) -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const HEADERS: u64 = 64 + 56;
    let size = HEADERS + code.len() as u64;
    let mut b = Vec::with_capacity(size as usize);
    b.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b.extend_from_slice(&machine.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    b.extend_from_slice(&(BASE + HEADERS).to_le_bytes()); // entry
    b.extend_from_slice(&64u64.to_le_bytes()); // program headers
    b.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    b.extend_from_slice(&0u32.to_le_bytes()); // flags
    b.extend_from_slice(&64u16.to_le_bytes()); // header size
    b.extend_from_slice(&56u16.to_le_bytes()); // program header size
    b.extend_from_slice(&1u16.to_le_bytes()); // one program header
    b.extend_from_slice(&64u16.to_le_bytes()); // section header size
    b.extend_from_slice(&0u16.to_le_bytes()); // no sections
    b.extend_from_slice(&0u16.to_le_bytes()); // no section names
    b.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    b.extend_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    b.extend_from_slice(&0u64.to_le_bytes()); // from the file's start
    b.extend_from_slice(&BASE.to_le_bytes()); // virtual address
    b.extend_from_slice(&BASE.to_le_bytes()); // physical address
    b.extend_from_slice(&size.to_le_bytes()); // in the file
    b.extend_from_slice(&size.to_le_bytes()); // in memory
    b.extend_from_slice(&0x1000u64.to_le_bytes()); // alignment
    b.extend_from_slice(code);
    b
}

/// A tar archive (ustar) of one regular file at `path` (relative, no leading `/`), mode 0755,
/// owned by root.
pub fn one_file_tar(path: &str, content: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    let name = path.as_bytes();
    header[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    let octal = |field: &mut [u8], value: u64| {
        let text = format!("{value:0width$o}\0", width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    };
    octal(&mut header[100..108], 0o755);
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], content.len() as u64);
    octal(&mut header[136..148], 0);
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    // The checksum is taken with its own field as spaces.
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(text.as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.resize(out.len() + 1024, 0); // two zero blocks end the archive
    out
}

/// The task's own limits from its task-level `cpu` and `memory` (None where it gives none):
/// CPU as Docker's `NanoCpus` (1024 units = one CPU), memory in bytes.
pub fn task_limits(definition: &TaskDefinition) -> (Option<i64>, Option<i64>) {
    let cpu = definition
        .cpu
        .as_deref()
        .and_then(|c| mpsfleet_core::task_size::task_cpu_units(c).ok())
        .map(|units| i64::from(units) * 1_000_000_000 / 1024);
    let memory = definition
        .memory
        .as_deref()
        .and_then(|m| mpsfleet_core::task_size::task_memory_mib(m).ok())
        .map(|mib| i64::try_from(mib).unwrap_or(i64::MAX).saturating_mul(1 << 20));
    (cpu, memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_elf_is_a_static_executable_of_the_engines_architecture() {
        let elf = pause_elf("x86_64").expect("x86_64");
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(elf.len(), 120 + 9);
        assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 0x3e);
        let entry = u64::from_le_bytes(elf[24..32].try_into().expect("8 bytes"));
        assert_eq!(entry, 0x40_0078);
        // The segment covers the whole file.
        let filesz = u64::from_le_bytes(elf[96..104].try_into().expect("8 bytes"));
        assert_eq!(filesz, elf.len() as u64);
        let arm = pause_elf("aarch64").expect("aarch64");
        assert_eq!(u16::from_le_bytes([arm[18], arm[19]]), 0xb7);
        assert_eq!(arm.len(), 120 + 28);
        assert_eq!(pause_elf("riscv64"), None);
    }

    #[test]
    fn the_tar_holds_one_executable_file() {
        let tar = one_file_tar("pause", b"abc");
        assert_eq!(tar.len(), 512 + 512 + 1024);
        assert_eq!(&tar[..5], b"pause");
        assert_eq!(&tar[100..107], b"0000755");
        assert_eq!(&tar[124..135], b"00000000003");
        assert_eq!(&tar[257..262], b"ustar");
        assert_eq!(&tar[512..515], b"abc");
        // The checksum: the header's bytes with the checksum field as spaces.
        let mut h = tar[..512].to_vec();
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        let field = std::str::from_utf8(&tar[148..154]).expect("octal");
        assert_eq!(u32::from_str_radix(field, 8).expect("octal"), sum);
    }

    fn definition(json: serde_json::Value) -> TaskDefinition {
        let mut base = serde_json::json!({"family": "fam", "revision": 2, "containerDefinitions": [
            {"name": "web", "image": "busybox", "essential": true,
             "portMappings": [{"containerPort": 8080}, {"containerPort": 53, "protocol": "udp"}]},
            {"name": "side", "image": "busybox", "essential": false,
             "portMappings": [{"containerPort": 8080}]},
        ], "networkMode": "awsvpc"});
        if let (Some(b), Some(extra)) = (base.as_object_mut(), json.as_object()) {
            b.extend(extra.clone());
        }
        serde_json::from_value(base).expect("definition json")
    }

    fn task() -> Task {
        serde_json::from_value(serde_json::json!({
            "id": "t-00000000000000aa", "taskDefinition": "fam:2", "pool": "p",
            "lastStatus": "PENDING", "desiredStatus": "RUNNING", "healthStatus": "UNKNOWN",
            "startedBy": "run:x", "createdAtMs": 1,
        }))
        .expect("task json")
    }

    #[test]
    fn the_pause_container_owns_the_tasks_address_on_the_network() {
        let (name, b) = pause_body(&task(), &definition(serde_json::json!({})), "h1", "net-id");
        assert_eq!(name, "mpsfleet-h1-t-00000000000000aa-.pause");
        assert_eq!(b.image, Some(pause_image()));
        assert_eq!(b.cmd, Some(vec!["/pause".to_string()]));
        assert_eq!(b.stop_signal.as_deref(), Some("SIGKILL"));
        assert_eq!(b.exposed_ports, Some(vec!["53/udp".to_string(), "8080/tcp".to_string()]));
        let labels = b.labels.expect("labels");
        assert_eq!(labels.get(names::LABEL_HOST).map(String::as_str), Some("h1"));
        assert_eq!(labels.get(names::LABEL_TASK).map(String::as_str), Some("t-00000000000000aa"));
        assert_eq!(labels.get(names::LABEL_CONTAINER).map(String::as_str), Some(PAUSE_CONTAINER));
        assert_eq!(labels.get(LABEL_ROLE).map(String::as_str), Some("pause"));
        let h = b.host_config.expect("host config");
        assert_eq!(h.network_mode.as_deref(), Some("net-id"));
        assert_eq!(h.port_bindings, None);
        assert_eq!(h.restart_policy.and_then(|r| r.name), Some(RestartPolicyNameEnum::NO));
        let net = network_request();
        assert_eq!(net.name, NETWORK_NAME);
        assert_eq!(net.driver.as_deref(), Some("bridge"));
        assert_eq!(net.labels.and_then(|l| l.get(NETWORK_LABEL).cloned()).as_deref(), Some("awsvpc"));
    }

    #[test]
    fn task_limits_from_ecs_strings() {
        let d = definition(serde_json::json!({"cpu": "0.5 vcpu", "memory": "1 GB"}));
        assert_eq!(task_limits(&d), (Some(500_000_000), Some(1 << 30)));
        let d = definition(serde_json::json!({"cpu": "2048"}));
        assert_eq!(task_limits(&d), (Some(2_000_000_000), None));
        assert_eq!(task_limits(&definition(serde_json::json!({}))), (None, None));
    }
}
