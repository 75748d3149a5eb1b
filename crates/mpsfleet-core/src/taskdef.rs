//! Task definition validation: ECS-shaped JSON in, a checked [`TaskDefinition`] out.
//!
//! The document is walked by hand from a [`serde_json::Value`] so that every error names the
//! JSON path of the field it is about, and so that ECS fields mpsfleet does not use can be
//! accepted and reported back (`ignored_fields`) while misspelt ones are refused.

use mpsfleet_types::{
    check_name, ContainerDefinition, Family, GpuRequirement, HealthCheck, KeyValuePair, NameError,
    NetworkMode, NvidiaMps, PortMapping, Protocol, ResourceRequirement, SharingStrategy, TaskDefinition,
};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};

mod options;
pub use options::AWS_ONLY_VOLUME_KINDS;
mod depends;
mod resources;
use resources::{parse_resources, GpuTally};
mod secrets;

// Size limits. ECS caps a task definition at 64 KiB of JSON and 10 containers and sets no count
// on environment variables or command elements; the limits below admit every definition that
// fits in ECS's 64 KiB, and bound the work one registration can cause (see docs/api.md).

/// The most bytes a task definition document may have: four times ECS's 64 KiB, room for
/// pretty-printed JSON and for the fields a described definition carries.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// ECS's limit on containers per task definition.
pub const MAX_CONTAINERS: usize = 10;
/// The most environment variables one container may set (64 KiB holds fewer than 2,800).
pub const MAX_ENVIRONMENT: usize = 4096;
/// The most elements of one `command`, `entryPoint` or check command array.
pub const MAX_ARGS: usize = 4096;
/// The most environment variables and command elements (checks' included) of all containers
/// of a definition together.
pub const MAX_ENTRIES: usize = 16_384;
/// The most bytes of one environment variable value or one command element.
pub const MAX_STRING_BYTES: usize = 65_536;
/// The most bytes of an environment variable name.
pub const MAX_ENV_NAME_BYTES: usize = 4096;
/// The most bytes of a container's `user`.
pub const MAX_USER_BYTES: usize = 255;
/// The most whole GPUs one task may ask for.
pub const MAX_WHOLE_GPUS: u64 = 64;
/// The most MPS memory (MiB) one container, or all MPS containers of a task together, may ask
/// for: every MPS container of a task shares one GPU.
pub const MAX_MPS_MEMORY_MIB: u64 = 16_777_216;

/// The most bytes of a container's `image` reference, registry, tag and digest included.
pub const MAX_IMAGE_BYTES: usize = 1024;
/// The most bytes of the repository name of an `image` (registry host included, tag and digest
/// not): ECS allows 255 characters there, and Docker refuses longer names.
pub const MAX_IMAGE_NAME_BYTES: usize = 255;
/// The most bytes of an image tag, as Docker allows.
pub const MAX_IMAGE_TAG_BYTES: usize = 128;
/// The most CPU units a container may ask for (ECS's and Docker's CPU shares maximum);
/// 0 is allowed, as in ECS.
pub const MAX_CPU_UNITS: u64 = 262_144;
/// The least `memory` or `memoryReservation` in MiB: Docker needs at least 6 MiB.
pub const MIN_CONTAINER_MEMORY_MIB: u64 = 6;
/// The most `memory` or `memoryReservation` in MiB (16 TiB).
pub const MAX_CONTAINER_MEMORY_MIB: u64 = 16_777_216;
/// The most bytes of a `workingDirectory` (Linux's PATH_MAX).
pub const MAX_WORKING_DIRECTORY_BYTES: usize = 4096;
/// The most `dockerLabels` of one container.
pub const MAX_DOCKER_LABELS: usize = 256;
/// The most bytes of a `dockerLabels` key.
pub const MAX_LABEL_KEY_BYTES: usize = 255;
/// The most bytes of a `dockerLabels` value.
pub const MAX_LABEL_VALUE_BYTES: usize = 4096;
/// `dockerLabels` keys with this prefix are refused: the node sets its own labels there.
pub const RESERVED_LABEL_PREFIX: &str = "io.mpsfleet.";
/// The most `portMappings` of one container.
pub const MAX_PORT_MAPPINGS: usize = 100;
/// The most bytes of a port mapping's `name`.
pub const MAX_PORT_NAME_BYTES: usize = 64;

/// A definition that passed validation, and the ECS fields that were accepted but not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedTaskDefinition {
    /// Revision 0 and `registered_at_ms` 0: the server fills them in at registration.
    pub definition: TaskDefinition,
    /// JSON paths of known ECS fields mpsfleet accepts but does not act on,
    /// e.g. `containerDefinitions[0].logConfiguration`.
    pub ignored_fields: Vec<String>,
}

/// One reason a task definition was refused. `field` is a JSON path (`$` for the whole
/// document).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TaskDefError {
    pub field: String,
    pub message: String,
}

/// The most errors one refusal lists; past it, only their number is kept, so that a definition
/// with thousands of mistakes gets a bounded answer.
pub const MAX_ERRORS: usize = 100;

/// Why a task definition was refused: every error found, in document order, at most
/// [`MAX_ERRORS`] of them with the number of the others. Fields whose own value is refused are
/// left out of the checks that need them (a container with an error is not counted by the
/// task-wide checks, such as `dependsOn`'s graph), so no error follows from another.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskDefErrors {
    errors: Vec<TaskDefError>,
    left_out: usize,
}

impl TaskDefErrors {
    /// The first error, in document order: the one a single-error answer names.
    pub fn first(&self) -> &TaskDefError {
        // Never empty once returned: parse_task_definition returns Err only with an error.
        &self.errors[0]
    }

    /// Every error kept, the first first.
    pub fn errors(&self) -> &[TaskDefError] {
        &self.errors
    }

    /// How many errors were found past the [`MAX_ERRORS`] kept.
    pub fn left_out(&self) -> usize {
        self.left_out
    }

    fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    fn push(&mut self, e: TaskDefError) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(e);
        } else {
            self.left_out = self.left_out.saturating_add(1);
        }
    }

    /// Adds the errors of `other` after these.
    fn absorb(&mut self, other: TaskDefErrors) {
        for e in other.errors {
            self.push(e);
        }
        self.left_out = self.left_out.saturating_add(other.left_out);
    }

    /// The value of `r`, or `None` with its errors added to these: the walk goes on.
    fn take<T>(&mut self, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.absorb(e);
                None
            }
        }
    }

    /// `Ok(value)` when no error was found.
    fn or_ok<T>(self, value: T) -> Result<T> {
        if self.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }
}

impl From<TaskDefError> for TaskDefErrors {
    fn from(e: TaskDefError) -> Self {
        TaskDefErrors { errors: vec![e], left_out: 0 }
    }
}

/// One error per line, `field: message`, and the number left out.
impl std::fmt::Display for TaskDefErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        if self.left_out > 0 {
            let s = if self.left_out == 1 { "" } else { "s" };
            write!(f, "\nand {} more error{s}", self.left_out)?;
        }
        Ok(())
    }
}

impl std::error::Error for TaskDefErrors {}

type Result<T> = std::result::Result<T, TaskDefErrors>;

const TOP_USED: &[&str] = &[
    "family",
    "containerDefinitions",
    "networkMode",
    "volumes",
    "pidMode",
    "ipcMode",
    "cpu",
    "memory",
    "tags",
    // mpsfleet's own describe output holds the kept fields here: they are kept again.
    "keptFields",
];
/// Fields ECS takes that mpsfleet does not act on but keeps, so that a description shows them
/// as they were registered ([`TaskDefinition::kept_fields`]).
pub const TOP_KEPT: &[&str] = &[
    "taskRoleArn",
    "executionRoleArn",
    "requiresCompatibilities",
    "placementConstraints",
    "runtimePlatform",
    "proxyConfiguration",
    "inferenceAccelerators",
    "ephemeralStorage",
    "enableFaultInjection",
];
/// What a description carries that a registration does not act on (ECS's output fields, and
/// mpsfleet's own), so that a described definition registers again.
const TOP_OUTPUT: &[&str] = &[
    "status",
    "revision",
    "taskDefinitionArn",
    "compatibilities",
    "registeredAt",
    "registeredBy",
    // mpsfleet's own describe output, so that a described definition registers again.
    "registeredAtMs",
    "deregisteredAt",
    "deregisteredAtMs",
    "requiresAttributes",
];

const CONTAINER_USED: &[&str] = &[
    "name",
    "image",
    "cpu",
    "memory",
    "memoryReservation",
    "workingDirectory",
    "dockerLabels",
    "portMappings",
    "command",
    "entryPoint",
    "environment",
    "essential",
    "user",
    "stopTimeout",
    "healthCheck",
    "startupCheck",
    "readinessCheck",
    "resourceRequirements",
    "dependsOn",
    "startTimeout",
    "secrets",
    "logConfiguration",
    "repositoryCredentials",
    "mountPoints",
    "volumesFrom",
    "linuxParameters",
    "ulimits",
    "systemControls",
    "privileged",
    "readonlyRootFilesystem",
    "dnsServers",
    "dnsSearchDomains",
    "extraHosts",
    "hostname",
];
const CONTAINER_IGNORED: &[&str] = &[
    "links",
    "disableNetworking",
    "dockerSecurityOptions",
    "interactive",
    "pseudoTerminal",
    "firelensConfiguration",
    "restartPolicy",
    "credentialSpecs",
    "environmentFiles",
    "versionConsistency",
];

const CHECK_KEYS: &[&str] = &["command", "interval", "timeout", "retries", "startPeriod"];
const CHECK_KINDS: &[&str] = &["CMD", "CMD-SHELL", "HTTP-GET", "TCP-CONNECT"];
const NETWORK_MODES: &[&str] = &["bridge", "host", "none", "awsvpc"];
const PORT_USED: &[&str] = &["containerPort", "hostPort", "protocol", "name"];
const PORT_IGNORED: &[&str] = &["appProtocol", "containerPortRange", "hostPortRange"];

/// Parses and validates an ECS-shaped task definition.
///
/// The work is linear in the size of the document, which is at most [`MAX_DOCUMENT_BYTES`].
pub fn parse_task_definition(json: &[u8]) -> std::result::Result<ParsedTaskDefinition, TaskDefErrors> {
    if json.len() > MAX_DOCUMENT_BYTES {
        return Err(err(
            "$",
            format!(
                "must be at most {MAX_DOCUMENT_BYTES} bytes of JSON (ECS allows 65536), got {} bytes",
                json.len()
            ),
        ));
    }
    let doc: Value = serde_json::from_slice(json).map_err(|e| err("$", format!("invalid json: {e}")))?;
    let top =
        doc.as_object().ok_or_else(|| err("$", format!("must be a json object, got {}", describe(&doc))))?;
    // Every field is checked whatever the others hold; the errors are kept in document order.
    let mut errors = TaskDefErrors::default();
    let mut ignored = Vec::new();
    // Reported as not acted on: the kept fields, and what a description carries.
    let top_ignored: Vec<&str> = TOP_KEPT.iter().chain(TOP_OUTPUT).copied().collect();
    errors.take(check_keys(top, "", TOP_USED, &top_ignored, &mut ignored));

    let family = errors.take(require(top, "", "family").and_then(|v| {
        let s = as_str(v, "family")?;
        Family::new(s).map_err(|e| name_error("family", s, &e))
    }));

    // A networkMode refused is taken as unset, so that port mappings are still checked.
    let network_mode = match top.get("networkMode") {
        Some(v) => errors.take(parse_network_mode(v, "networkMode")),
        None => None,
    };
    let task_cpu = errors.take(task_size_field(top, "cpu", crate::task_size::task_cpu_units)).flatten();
    let task_memory =
        errors.take(task_size_field(top, "memory", crate::task_size::task_memory_mib)).flatten();

    let volumes = match top.get("volumes") {
        Some(v) => errors.take(options::parse_volumes(v, "volumes", &mut ignored)),
        None => Some(Vec::new()),
    };
    let pid_mode = match top.get("pidMode") {
        Some(v) => errors.take(options::parse_pid_mode(v, "pidMode")),
        None => None,
    };
    let ipc_mode = match top.get("ipcMode") {
        Some(v) => errors.take(options::parse_ipc_mode(v, "ipcMode")),
        None => None,
    };

    let tags = match top.get("tags") {
        Some(v) => errors.take(parse_tags(v)),
        None => Some(Vec::new()),
    };
    // Kept fields given at the top, as ECS takes them, or as mpsfleet describes them.
    let described = top.get("keptFields").and_then(Value::as_object);
    let kept_fields: BTreeMap<String, Value> = TOP_KEPT
        .iter()
        .filter_map(|k| Some((k.to_string(), top.get(*k).or_else(|| described?.get(*k))?.clone())))
        .collect();

    let list_path = "containerDefinitions";
    let list = errors.take(require(top, "", list_path).and_then(|v| {
        let list = as_array(v, list_path)?;
        if list.is_empty() {
            return Err(err(list_path, "must have at least one container, got an empty array"));
        }
        if list.len() > MAX_CONTAINERS {
            return Err(err(
                list_path,
                format!("must have at most {MAX_CONTAINERS} containers, got {}", list.len()),
            ));
        }
        Ok(list)
    }));
    let list = list.map_or(&[][..], Vec::as_slice);

    let mut containers: Vec<ContainerDefinition> = Vec::with_capacity(list.len());
    let mut names: HashMap<String, usize> = HashMap::with_capacity(list.len());
    let mut gpu = GpuTally::default();
    let mut entries = Entries(0);
    let mut host_ports = HostPorts::default();
    let mut all_containers = true;
    for (i, value) in list.iter().enumerate() {
        let path = format!("{list_path}[{i}]");
        let mut walk = Walk { ignored: &mut ignored, entries: &mut entries, host_ports: &mut host_ports };
        let Some((container, gpu_index)) =
            errors.take(parse_container(value, &path, network_mode, &mut walk))
        else {
            all_containers = false;
            continue;
        };
        if let Some(first) = names.get(&container.name) {
            errors.push(TaskDefError {
                field: format!("{path}.name"),
                message: format!(
                    "duplicate container name {}, already used by {list_path}[{first}]",
                    quote(&container.name)
                ),
            });
            all_containers = false;
            continue;
        }
        names.insert(container.name.clone(), i);
        if let Some(j) = gpu_index {
            errors.take(gpu.add(&container, &format!("{path}.resourceRequirements[{j}]")));
        }
        containers.push(container);
    }
    // The checks across containers need all of them: with one refused, they could only report
    // what follows from its refusal (a dependency on it, say).
    if all_containers && !containers.is_empty() {
        if !containers.iter().any(|c| c.essential) {
            errors.absorb(err(list_path, "at least one container must be essential, got none"));
        }
        if let Some(volumes) = &volumes {
            errors.take(options::check_references(&containers, volumes, list_path));
        }
        errors.take(depends::check_graph(&containers, list_path));
        errors.take(check_task_size(&containers, task_cpu.as_ref(), task_memory.as_ref()));
    }

    let (Some(family), Some(volumes)) = (family, volumes) else {
        return Err(errors);
    };
    errors.or_ok(ParsedTaskDefinition {
        definition: TaskDefinition {
            family,
            revision: 0,
            container_definitions: containers,
            network_mode,
            cpu: task_cpu.map(|(text, _)| text),
            memory: task_memory.map(|(text, _)| text),
            volumes,
            pid_mode,
            ipc_mode,
            registered_at_ms: 0,
            deregistered_at_ms: None,
            tags: tags.unwrap_or_default(),
            kept_fields,
        },
        ignored_fields: ignored,
    })
}

/// A definition's `tags`: ECS's `[{"key": ..., "value": ...}]`, checked as ECS checks them.
fn parse_tags(v: &Value) -> Result<Vec<mpsfleet_types::labels::Tag>> {
    let tags: Vec<mpsfleet_types::labels::Tag> = serde_json::from_value(v.clone())
        .map_err(|e| err("tags", format!("must be a list of {{\"key\": ..., \"value\": ...}}: {e}")))?;
    mpsfleet_types::labels::check_tags("tags", &tags).map_err(|(field, message)| err(&field, message))?;
    Ok(tags)
}

/// Environment variables and command elements counted so far, against [`MAX_ENTRIES`].
struct Entries(usize);

impl Entries {
    /// Counts the `n` entries of the array at `path`.
    fn add(&mut self, n: usize, path: &str) -> Result<()> {
        self.0 = self.0.saturating_add(n);
        if self.0 > MAX_ENTRIES {
            return Err(err(
                path,
                format!(
                    "brings the definition to {} environment variables and command elements in all, \
                     more than the limit of {MAX_ENTRIES}",
                    self.0
                ),
            ));
        }
        Ok(())
    }
}

/// What the walk over the containers carries from one container to the next.
struct Walk<'a> {
    ignored: &'a mut Vec<String>,
    entries: &'a mut Entries,
    host_ports: &'a mut HostPorts,
}

/// The static host ports taken so far in the task, with the JSON path that took each.
#[derive(Default)]
struct HostPorts(HashMap<(Protocol, u16), String>);

/// A task-level `cpu` or `memory` (a string as ECS takes it, or a plain number): the text as
/// given and its value (CPU units, MiB).
fn task_size_field<T>(
    top: &serde_json::Map<String, Value>,
    key: &str,
    parse: fn(&str) -> std::result::Result<T, String>,
) -> Result<Option<(String, T)>> {
    let text = match top.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => return Err(err(key, format!("must be a string, got {}", describe(other)))),
    };
    let value = parse(&text).map_err(|m| err(key, m))?;
    Ok(Some((text, value)))
}

/// The containers' own `cpu` and `memory` fit within the task's, as ECS checks at
/// registration: their CPU units add up to at most the task's, and each container's
/// `memory`, and the sum of what they reserve (`memoryReservation`, else `memory`), are at
/// most the task's.
fn check_task_size(
    containers: &[ContainerDefinition],
    cpu: Option<&(String, u32)>,
    memory: Option<&(String, u64)>,
) -> Result<()> {
    if let Some((text, units)) = cpu {
        let sum: u64 = containers.iter().map(|c| u64::from(c.cpu.unwrap_or(0))).sum();
        if sum > u64::from(*units) {
            return Err(err(
                "cpu",
                format!(
                    "the containers' cpu add up to {sum} CPU units, more than the task's cpu {} ({units} units)",
                    quote(text)
                ),
            ));
        }
    }
    if let Some((text, mib)) = memory {
        for (i, c) in containers.iter().enumerate() {
            if let Some(m) = c.memory.filter(|m| m > mib) {
                return Err(err(
                    format!("containerDefinitions[{i}].memory"),
                    format!("{m} MiB is more than the task's memory {} ({mib} MiB)", quote(text)),
                ));
            }
        }
        let reserved: u64 = containers.iter().map(|c| c.memory_reservation.or(c.memory).unwrap_or(0)).sum();
        if reserved > *mib {
            return Err(err(
                "memory",
                format!(
                    "the containers reserve {reserved} MiB in all (memoryReservation, else memory), more \
                     than the task's memory {} ({mib} MiB)",
                    quote(text)
                ),
            ));
        }
    }
    Ok(())
}

fn parse_network_mode(value: &Value, path: &str) -> Result<NetworkMode> {
    let mode = match value.as_str() {
        Some("bridge") => Some(NetworkMode::Bridge),
        Some("host") => Some(NetworkMode::Host),
        Some("none") => Some(NetworkMode::None),
        Some("awsvpc") => Some(NetworkMode::Awsvpc),
        _ => None,
    };
    mode.ok_or_else(|| {
        err(path, format!("must be one of {}, got {}", NETWORK_MODES.join(", "), describe(value)))
    })
}

/// One container: every field is checked, and all their errors are returned together.
fn parse_container(
    value: &Value,
    path: &str,
    network_mode: Option<NetworkMode>,
    walk: &mut Walk<'_>,
) -> Result<(ContainerDefinition, Option<usize>)> {
    let ignored = &mut *walk.ignored;
    let entries = &mut *walk.entries;
    let obj = as_object(value, path)?;
    let mut errors = TaskDefErrors::default();
    errors.take(check_keys(obj, path, CONTAINER_USED, CONTAINER_IGNORED, ignored));

    let name_path = join(path, "name");
    let name = errors.take(require(obj, path, "name").and_then(|v| {
        let name = as_str(v, &name_path)?;
        check_name("container name", name).map_err(|e| name_error(&name_path, name, &e))?;
        Ok(name)
    }));

    let command = errors.take(optional_string_array(obj, path, "command", entries));
    let entry_point = errors.take(optional_string_array(obj, path, "entryPoint", entries));
    let image = match obj.get("image") {
        Some(v) => {
            let image_path = join(path, "image");
            errors.take(as_str(v, &image_path).and_then(|image| {
                check_image(image, &image_path)?;
                Ok(Some(image.to_string()))
            }))
        }
        // Required only without a command: one refused is not known to be empty.
        None => match (&command, &entry_point) {
            (Some(c), Some(e)) if c.is_empty() && e.is_empty() => {
                errors.absorb(err(
                    join(path, "image"),
                    "is required when neither command nor entryPoint is given \
                     (as a non-empty array), got none of the three",
                ));
                None
            }
            _ => Some(None),
        },
    };

    let cpu = match obj.get("cpu") {
        Some(v) => errors
            .take(int_in(v, &join(path, "cpu"), 0, MAX_CPU_UNITS, " CPU units"))
            .map(|n| Some(to_u32(n))),
        None => Some(None),
    };
    let memory_mib = |key: &str| -> Result<Option<u64>> {
        match obj.get(key) {
            Some(v) => int_in(
                v,
                &join(path, key),
                MIN_CONTAINER_MEMORY_MIB,
                MAX_CONTAINER_MEMORY_MIB,
                " MiB (Docker needs at least 6 MiB)",
            )
            .map(Some),
            None => Ok(None),
        }
    };
    let memory = errors.take(memory_mib("memory"));
    let memory_reservation = errors.take(memory_mib("memoryReservation"));
    if let (Some(Some(hard)), Some(Some(soft))) = (memory, memory_reservation) {
        if soft >= hard {
            errors.absorb(err(
                join(path, "memoryReservation"),
                format!(
                    "must be less than memory ({hard} MiB), as ECS requires, \
                     got memoryReservation {soft} MiB"
                ),
            ));
        }
    }

    let working_directory = match obj.get("workingDirectory") {
        Some(v) => {
            let wd_path = join(path, "workingDirectory");
            errors.take(as_str(v, &wd_path).and_then(|wd| {
                check_working_directory(wd, &wd_path)?;
                Ok(Some(wd.to_string()))
            }))
        }
        None => Some(None),
    };

    let docker_labels = match obj.get("dockerLabels") {
        Some(v) => errors.take(parse_labels(v, &join(path, "dockerLabels"))),
        None => Some(BTreeMap::new()),
    };

    let port_mappings = match obj.get("portMappings") {
        Some(v) => errors.take(parse_port_mappings(
            v,
            &join(path, "portMappings"),
            network_mode,
            ignored,
            walk.host_ports,
        )),
        None => Some(Vec::new()),
    };

    let environment = match obj.get("environment") {
        Some(v) => errors.take(parse_environment(v, &join(path, "environment"), entries)),
        None => Some(Vec::new()),
    };
    let secrets = match obj.get("secrets") {
        Some(v) => errors.take(secrets::parse_secrets(
            v,
            &join(path, "secrets"),
            environment.as_deref().unwrap_or_default(),
        )),
        None => Some(Vec::new()),
    };
    let log_configuration = match obj.get("logConfiguration") {
        Some(v) => {
            errors.take(secrets::parse_log_configuration(v, &join(path, "logConfiguration"))).map(Some)
        }
        None => Some(None),
    };
    let repository_credentials = match obj.get("repositoryCredentials") {
        Some(v) => errors
            .take(secrets::parse_repository_credentials(v, &join(path, "repositoryCredentials")))
            .map(Some),
        None => Some(None),
    };

    let essential = match obj.get("essential") {
        Some(v) => errors.take(as_bool(v, &join(path, "essential"))),
        None => Some(true),
    };

    let user = match obj.get("user") {
        Some(v) => errors.take(parse_user(v, &join(path, "user"))).map(Some),
        None => Some(None),
    };

    let stop_timeout = match obj.get("stopTimeout") {
        Some(v) => {
            errors.take(int_in(v, &join(path, "stopTimeout"), 2, 120, " seconds")).map(|n| Some(to_u32(n)))
        }
        None => Some(None),
    };

    let health_check = errors.take(optional_check(obj, path, "healthCheck", entries));
    let startup_check = errors.take(optional_check(obj, path, "startupCheck", entries));
    let readiness_check = errors.take(optional_check(obj, path, "readinessCheck", entries));

    let resources = match obj.get("resourceRequirements") {
        Some(v) => errors.take(parse_resources(v, &join(path, "resourceRequirements"), ignored)),
        None => Some((Vec::new(), None)),
    };

    let depends = errors.take(depends::parse(obj, path));

    let opts = options::parse_container_options(obj, path, &mut errors);

    // Every field parsed exactly when no error was found.
    let (
        Some(name),
        Some(command),
        Some(entry_point),
        Some(image),
        Some(cpu),
        Some(memory),
        Some(memory_reservation),
        Some(working_directory),
        Some(docker_labels),
        Some(port_mappings),
        Some(environment),
        Some(secrets),
        Some(log_configuration),
        Some(repository_credentials),
        Some(essential),
        Some(user),
        Some(stop_timeout),
        Some(health_check),
        Some(startup_check),
        Some(readiness_check),
        Some((resource_requirements, gpu_index)),
        Some((depends_on, start_timeout)),
    ) = (
        name,
        command,
        entry_point,
        image,
        cpu,
        memory,
        memory_reservation,
        working_directory,
        docker_labels,
        port_mappings,
        environment,
        secrets,
        log_configuration,
        repository_credentials,
        essential,
        user,
        stop_timeout,
        health_check,
        startup_check,
        readiness_check,
        resources,
        depends,
    )
    else {
        return Err(errors);
    };
    let container = ContainerDefinition {
        name: name.to_string(),
        image,
        cpu,
        memory,
        memory_reservation,
        working_directory,
        docker_labels,
        port_mappings,
        entry_point,
        command,
        environment,
        essential,
        user,
        stop_timeout,
        health_check,
        startup_check,
        readiness_check,
        resource_requirements,
        secrets,
        log_configuration,
        repository_credentials,
        depends_on,
        start_timeout,
        mount_points: opts.mount_points,
        volumes_from: opts.volumes_from,
        linux_parameters: opts.linux_parameters,
        ulimits: opts.ulimits,
        system_controls: opts.system_controls,
        privileged: opts.privileged,
        readonly_root_filesystem: opts.readonly_root_filesystem,
        dns_servers: opts.dns_servers,
        dns_search_domains: opts.dns_search_domains,
        extra_hosts: opts.extra_hosts,
        hostname: opts.hostname,
    };
    errors.or_ok((container, gpu_index))
}

/// A container's `user`: 1 to [`MAX_USER_BYTES`] bytes without NUL.
fn parse_user(value: &Value, path: &str) -> Result<String> {
    let user = as_str(value, path)?;
    if user.is_empty() {
        return Err(err(path, "must not be empty, got \"\""));
    }
    if user.len() > MAX_USER_BYTES {
        return Err(err(path, format!("must be at most {MAX_USER_BYTES} bytes, got {} bytes", user.len())));
    }
    if user.contains('\0') {
        return Err(err(path, "must not contain NUL characters"));
    }
    Ok(user.to_string())
}

/// A Docker image reference: `[host[:port]/]path[:tag][@sha256:<64 hex>]`, the path made of
/// lowercase components.
fn check_image(image: &str, path: &str) -> Result<()> {
    let bad = |why: String| err(path, format!("{why}, got {}", quote(image)));
    if image.is_empty() {
        return Err(err(path, "must not be empty, got \"\""));
    }
    if image.len() > MAX_IMAGE_BYTES {
        return Err(err(path, format!("must be at most {MAX_IMAGE_BYTES} bytes, got {} bytes", image.len())));
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("must not contain whitespace or control characters".to_string()));
    }
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let ok = d.strip_prefix("sha256:").is_some_and(|hex| {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
        if !ok {
            return Err(bad(
                "the digest after '@' must be sha256: followed by 64 lowercase hex digits".to_string()
            ));
        }
    }
    // A ':' after the last '/' starts the tag; one before it belongs to the registry's port.
    let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_tag[last_slash..].find(':') {
        Some(i) => (&name_tag[..last_slash + i], Some(&name_tag[last_slash + i + 1..])),
        None => (name_tag, None),
    };
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= MAX_IMAGE_TAG_BYTES
            && !tag.starts_with(['.', '-'])
            && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return Err(bad(format!(
                "the tag after ':' must be 1 to {MAX_IMAGE_TAG_BYTES} letters, digits, '_', '.' or '-', \
                 not starting with '.' or '-'"
            )));
        }
    }
    if name.is_empty() {
        return Err(bad("must start with a repository name".to_string()));
    }
    if name.len() > MAX_IMAGE_NAME_BYTES {
        return Err(err(
            path,
            format!(
                "the repository name must be at most {MAX_IMAGE_NAME_BYTES} bytes (as ECS and Docker \
                 allow), got {} bytes",
                name.len()
            ),
        ));
    }
    let mut components = name.split('/');
    let first = components.next().unwrap_or_default();
    // Docker's rule: the first of several components is a registry when it has a '.' or a ':',
    // is `localhost`, or has uppercase letters.
    let is_registry = name.contains('/')
        && (first.contains(['.', ':'])
            || first == "localhost"
            || first.bytes().any(|b| b.is_ascii_uppercase()));
    if is_registry {
        if !is_registry_host(first) {
            return Err(bad(format!(
                "the registry {} must be a host name (letters, digits, '-' and '.') with an optional :port",
                quote(first)
            )));
        }
    } else if !is_path_component(first) {
        return Err(bad(path_component_rule(first)));
    }
    for component in components {
        if !is_path_component(component) {
            return Err(bad(path_component_rule(component)));
        }
    }
    Ok(())
}

fn path_component_rule(component: &str) -> String {
    format!(
        "repository path component {} must be lowercase letters and digits, \
         separated by '.', '_', '__' or dashes",
        quote(component)
    )
}

/// `[a-z0-9]+` runs joined by `.`, `_`, `__` or one or more `-`.
fn is_path_component(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|c| c == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `host[:port]`: dot-separated labels of letters, digits and inner '-', and a port of digits.
fn is_registry_host(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn check_working_directory(wd: &str, path: &str) -> Result<()> {
    if wd.is_empty() {
        return Err(err(path, "must not be empty, got \"\""));
    }
    if wd.len() > MAX_WORKING_DIRECTORY_BYTES {
        return Err(err(
            path,
            format!("must be at most {MAX_WORKING_DIRECTORY_BYTES} bytes, got {} bytes", wd.len()),
        ));
    }
    if wd.contains('\0') {
        return Err(err(path, "must not contain NUL characters"));
    }
    if !wd.starts_with('/') {
        return Err(err(
            path,
            format!("must be an absolute path (Docker refuses relative ones), got {}", quote(wd)),
        ));
    }
    Ok(())
}

fn parse_labels(value: &Value, path: &str) -> Result<BTreeMap<String, String>> {
    let obj = as_object(value, path)?;
    if obj.len() > MAX_DOCKER_LABELS {
        return Err(err(path, format!("must have at most {MAX_DOCKER_LABELS} labels, got {}", obj.len())));
    }
    let mut out = BTreeMap::new();
    for (key, v) in obj {
        let key_path = format!("{path}[{}]", quote(key));
        if key.is_empty() {
            return Err(err(key_path, "the label key must not be empty"));
        }
        if key.len() > MAX_LABEL_KEY_BYTES {
            return Err(err(
                key_path,
                format!("the label key must be at most {MAX_LABEL_KEY_BYTES} bytes, got {} bytes", key.len()),
            ));
        }
        if key.contains('\0') {
            return Err(err(key_path, "the label key must not contain NUL characters"));
        }
        if key.starts_with(RESERVED_LABEL_PREFIX) {
            return Err(err(
                key_path,
                format!(
                    "label key {} is reserved: keys starting with {RESERVED_LABEL_PREFIX} are set by mpsfleet",
                    quote(key)
                ),
            ));
        }
        let val = as_str(v, &key_path)?;
        if val.len() > MAX_LABEL_VALUE_BYTES {
            return Err(err(
                key_path,
                format!(
                    "the label value must be at most {MAX_LABEL_VALUE_BYTES} bytes, got {} bytes",
                    val.len()
                ),
            ));
        }
        if val.contains('\0') {
            return Err(err(key_path, "the label value must not contain NUL characters"));
        }
        out.insert(key.clone(), val.to_string());
    }
    Ok(out)
}

fn parse_port_mappings(
    value: &Value,
    path: &str,
    network_mode: Option<NetworkMode>,
    ignored: &mut Vec<String>,
    host_ports: &mut HostPorts,
) -> Result<Vec<PortMapping>> {
    let list = as_array(value, path)?;
    if network_mode == Some(NetworkMode::None) && !list.is_empty() {
        return Err(err(
            path,
            format!("must be empty in networkMode none, got {}", count(list.len(), "port mapping")),
        ));
    }
    if list.len() > MAX_PORT_MAPPINGS {
        return Err(err(
            path,
            format!("must have at most {MAX_PORT_MAPPINGS} port mappings, got {}", list.len()),
        ));
    }
    // (protocol, containerPort) -> index of the mapping that declared it.
    let mut container_ports: HashMap<(Protocol, u16), usize> = HashMap::with_capacity(list.len());
    each(list, path, |k, entry, entry_path| {
        let obj = as_object(entry, &entry_path)?;
        check_keys(obj, &entry_path, PORT_USED, PORT_IGNORED, ignored)?;
        let cp_path = join(&entry_path, "containerPort");
        let container_port =
            to_u16(int_in(require(obj, &entry_path, "containerPort")?, &cp_path, 1, 65535, "")?);
        let hp_path = join(&entry_path, "hostPort");
        let host_port = match obj.get("hostPort") {
            Some(v) => {
                Some(to_u16(int_in(v, &hp_path, 0, 65535, " (0 lets Docker choose)")?)).filter(|&p| p != 0)
            }
            None => None,
        };
        let protocol = match obj.get("protocol") {
            Some(v) => match v.as_str() {
                Some("tcp") => Protocol::Tcp,
                Some("udp") => Protocol::Udp,
                _ => {
                    return Err(err(
                        join(&entry_path, "protocol"),
                        format!("must be tcp or udp, got {}", describe(v)),
                    ))
                }
            },
            None => Protocol::Tcp,
        };
        let name = match obj.get("name") {
            Some(v) => {
                let name_path = join(&entry_path, "name");
                let name = as_str(v, &name_path)?;
                let ok = !name.is_empty()
                    && name.len() <= MAX_PORT_NAME_BYTES
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
                if !ok {
                    return Err(err(
                        name_path,
                        format!(
                            "must be 1 to {MAX_PORT_NAME_BYTES} letters, digits, '_' and '-', got {}",
                            quote(name)
                        ),
                    ));
                }
                Some(name.to_string())
            }
            None => None,
        };
        match (network_mode, host_port) {
            (Some(mode @ (NetworkMode::Host | NetworkMode::Awsvpc)), Some(hp)) if hp != container_port => {
                return Err(err(
                    hp_path,
                    format!(
                        "must equal containerPort ({container_port}) or be left out in networkMode {}, \
                         as ECS requires, got hostPort {hp}",
                        mode.as_str()
                    ),
                ));
            }
            _ => {}
        }
        if let Some(first) = container_ports.insert((protocol, container_port), k) {
            return Err(err(
                cp_path,
                format!(
                    "duplicate containerPort {container_port}/{}, already mapped by {path}[{first}]",
                    protocol.as_str()
                ),
            ));
        }
        // The host port the task holds for itself: in host mode every port, elsewhere a static one.
        let static_port = match network_mode {
            Some(NetworkMode::Host) => {
                Some((host_port.unwrap_or(container_port), host_port.map_or(&cp_path, |_| &hp_path)))
            }
            _ => host_port.map(|p| (p, &hp_path)),
        };
        if let Some((port, port_path)) = static_port {
            if let Some(first) = host_ports.0.get(&(protocol, port)) {
                return Err(err(
                    port_path.as_str(),
                    format!("host port {port}/{} is already taken by {first}", protocol.as_str()),
                ));
            }
            host_ports.0.insert((protocol, port), port_path.clone());
        }
        Ok(PortMapping { container_port, host_port, protocol, name })
    })
}

fn parse_environment(value: &Value, path: &str, entries: &mut Entries) -> Result<Vec<KeyValuePair>> {
    let list = as_array(value, path)?;
    if list.len() > MAX_ENVIRONMENT {
        return Err(err(
            path,
            format!("must have at most {MAX_ENVIRONMENT} environment variables, got {}", list.len()),
        ));
    }
    entries.add(list.len(), path)?;
    // Name -> index of the entry that set it.
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(list.len());
    each(list, path, |k, entry, entry_path| {
        let obj = as_object(entry, &entry_path)?;
        check_keys(obj, &entry_path, &["name", "value"], &[], &mut Vec::new())?;
        let name_path = join(&entry_path, "name");
        let name = as_str(require(obj, &entry_path, "name")?, &name_path)?;
        if name.is_empty() {
            return Err(err(name_path, "must not be empty, got \"\""));
        }
        if name.len() > MAX_ENV_NAME_BYTES {
            return Err(err(
                name_path,
                format!("must be at most {MAX_ENV_NAME_BYTES} bytes, got {} bytes", name.len()),
            ));
        }
        if name.contains('=') || name.contains('\0') {
            return Err(err(name_path, format!("must not contain '=' or NUL, got {}", quote(name))));
        }
        let value_path = join(&entry_path, "value");
        let val = as_str(require(obj, &entry_path, "value")?, &value_path)?;
        check_string_len(val, &value_path)?;
        if val.contains('\0') {
            return Err(err(value_path, "must not contain NUL characters"));
        }
        if let Some(first) = seen.insert(name, k) {
            return Err(err(
                name_path,
                format!("duplicate environment variable {}, already set by {path}[{first}]", quote(name)),
            ));
        }
        Ok(KeyValuePair { name: name.to_string(), value: val.to_string() })
    })
}

fn optional_check(
    obj: &Map<String, Value>,
    path: &str,
    key: &str,
    entries: &mut Entries,
) -> Result<Option<HealthCheck>> {
    match obj.get(key) {
        Some(v) => parse_check(v, &join(path, key), entries).map(Some),
        None => Ok(None),
    }
}

fn parse_check(value: &Value, path: &str, entries: &mut Entries) -> Result<HealthCheck> {
    let obj = as_object(value, path)?;
    check_keys(obj, path, CHECK_KEYS, &[], &mut Vec::new())?;
    let command_path = join(path, "command");
    let command = string_array(require(obj, path, "command")?, &command_path, entries)?;
    check_probe_command(&command, &command_path)?;
    let int_or = |key: &str, lo: u64, hi: u64, default: u32| -> Result<u32> {
        match obj.get(key) {
            Some(v) => int_in(v, &join(path, key), lo, hi, " seconds").map(to_u32),
            None => Ok(default),
        }
    };
    Ok(HealthCheck {
        command,
        interval: int_or("interval", 5, 300, 30)?,
        timeout: int_or("timeout", 2, 60, 5)?,
        retries: match obj.get("retries") {
            Some(v) => int_in(v, &join(path, "retries"), 1, 10, "").map(to_u32)?,
            None => 3,
        },
        start_period: int_or("startPeriod", 0, 300, 0)?,
    })
}

fn check_probe_command(command: &[String], path: &str) -> Result<()> {
    let Some((kind, args)) = command.split_first() else {
        return Err(err(
            path,
            "must not be empty: expected one of CMD, CMD-SHELL, HTTP-GET, TCP-CONNECT \
             followed by its arguments, got []",
        ));
    };
    let arg_path = format!("{path}[1]");
    match kind.as_str() {
        "CMD" => match args.first() {
            None => Err(err(path, "CMD needs the program (and its arguments) after it, got nothing")),
            Some(program) if program.is_empty() => {
                Err(err(arg_path, "the program to run must not be empty, got \"\""))
            }
            Some(_) => Ok(()),
        },
        "CMD-SHELL" => match args {
            [shell] if shell.is_empty() => {
                Err(err(arg_path, "the shell command must not be empty, got \"\""))
            }
            [_] => Ok(()),
            _ => Err(err(
                path,
                format!(
                    "CMD-SHELL takes exactly one shell command string after it, got {}",
                    count(args.len(), "element")
                ),
            )),
        },
        "HTTP-GET" => match args {
            [url] => match url.strip_prefix("http://") {
                Some(rest) if !rest.is_empty() => Ok(()),
                _ => Err(err(arg_path, format!("must be a url starting with http://, got {}", quote(url)))),
            },
            _ => Err(err(
                path,
                format!("HTTP-GET takes exactly one url after it, got {}", count(args.len(), "element")),
            )),
        },
        "TCP-CONNECT" => match args {
            [addr] => check_host_port(addr, &arg_path),
            _ => Err(err(
                path,
                format!(
                    "TCP-CONNECT takes exactly one host:port after it, got {}",
                    count(args.len(), "element")
                ),
            )),
        },
        other => Err(err(
            format!("{path}[0]"),
            format!("must be one of {}, got {}", CHECK_KINDS.join(", "), quote(other)),
        )),
    }
}

fn check_host_port(addr: &str, path: &str) -> Result<()> {
    let bad = || err(path, format!("must be host:port with a port from 1 to 65535, got {}", quote(addr)));
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.chars().any(char::is_whitespace) {
        return Err(bad());
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match port.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(()),
        _ => Err(bad()),
    }
}

// ---- walking helpers ----

fn err(field: impl Into<String>, message: impl Into<String>) -> TaskDefErrors {
    TaskDefError { field: field.into(), message: message.into() }.into()
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Refuses keys that are neither used nor known-ignored, every one of them, each error listing
/// the valid names at that path; records the known-ignored ones. Keys are visited sorted so the
/// result does not depend on the map's ordering.
fn check_keys(
    obj: &Map<String, Value>,
    prefix: &str,
    used: &[&str],
    known_ignored: &[&str],
    ignored: &mut Vec<String>,
) -> Result<()> {
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    let mut errors = TaskDefErrors::default();
    let mut valid: Option<String> = None;
    for key in keys {
        if used.contains(&key.as_str()) {
            continue;
        }
        if known_ignored.contains(&key.as_str()) {
            ignored.push(join(prefix, key));
            continue;
        }
        let valid = valid.get_or_insert_with(|| {
            let mut names: Vec<&str> = used.iter().chain(known_ignored).copied().collect();
            names.sort_unstable();
            names.join(", ")
        });
        errors.push(TaskDefError {
            field: join(prefix, &cut(key)),
            message: format!("unknown field; valid names here: {valid}"),
        });
    }
    errors.or_ok(())
}

/// A key for a path in a message: cut short if long, as [`quote`] does, and quoted as JSON
/// writes it if empty or holding control characters (so that no terminal acts on them).
fn cut(key: &str) -> String {
    const MAX_CHARS: usize = 64;
    if key.is_empty() || key.chars().any(char::is_control) {
        quote(key)
    } else if key.chars().count() > MAX_CHARS {
        format!("{}...", key.chars().take(MAX_CHARS).collect::<String>())
    } else {
        key.to_string()
    }
}

/// Each entry of `list` (the array at `path`) parsed by `one`, given its index and path; the
/// errors of every entry are kept, and the entries are in order when none has one.
fn each<'a, T>(
    list: &'a [Value],
    path: &str,
    mut one: impl FnMut(usize, &'a Value, String) -> Result<T>,
) -> Result<Vec<T>> {
    let mut errors = TaskDefErrors::default();
    let mut out = Vec::with_capacity(list.len());
    for (k, entry) in list.iter().enumerate() {
        if let Some(v) = errors.take(one(k, entry, format!("{path}[{k}]"))) {
            out.push(v);
        }
    }
    errors.or_ok(out)
}

fn require<'a>(obj: &'a Map<String, Value>, prefix: &str, key: &str) -> Result<&'a Value> {
    obj.get(key).ok_or_else(|| err(join(prefix, key), "is required"))
}

fn as_object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>> {
    value.as_object().ok_or_else(|| err(path, format!("must be an object, got {}", describe(value))))
}

fn as_array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>> {
    value.as_array().ok_or_else(|| err(path, format!("must be an array, got {}", describe(value))))
}

fn as_str<'a>(value: &'a Value, path: &str) -> Result<&'a str> {
    value.as_str().ok_or_else(|| err(path, format!("must be a string, got {}", describe(value))))
}

fn as_bool(value: &Value, path: &str) -> Result<bool> {
    value.as_bool().ok_or_else(|| err(path, format!("must be true or false, got {}", describe(value))))
}

fn string_array(value: &Value, path: &str, entries: &mut Entries) -> Result<Vec<String>> {
    let list = as_array(value, path)?;
    if list.len() > MAX_ARGS {
        return Err(err(path, format!("must have at most {MAX_ARGS} elements, got {}", list.len())));
    }
    entries.add(list.len(), path)?;
    list.iter()
        .enumerate()
        .map(|(k, v)| {
            let item_path = format!("{path}[{k}]");
            let s = as_str(v, &item_path)?;
            check_string_len(s, &item_path)?;
            if s.contains('\0') {
                return Err(err(item_path, "must not contain NUL characters"));
            }
            Ok(s.to_string())
        })
        .collect()
}

fn optional_string_array(
    obj: &Map<String, Value>,
    prefix: &str,
    key: &str,
    entries: &mut Entries,
) -> Result<Vec<String>> {
    match obj.get(key) {
        Some(v) => string_array(v, &join(prefix, key), entries),
        None => Ok(Vec::new()),
    }
}

fn check_string_len(s: &str, path: &str) -> Result<()> {
    if s.len() > MAX_STRING_BYTES {
        return Err(err(path, format!("must be at most {MAX_STRING_BYTES} bytes, got {} bytes", s.len())));
    }
    Ok(())
}

/// An integer in `lo..=hi`; floats, strings and anything else are refused with the range.
fn int_in(value: &Value, path: &str, lo: u64, hi: u64, unit: &str) -> Result<u64> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        _ => None,
    };
    match n {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(err(path, format!("must be an integer from {lo} to {hi}{unit}, got {}", describe(value)))),
    }
}

/// Values checked by `int_in` have small bounds; saturate rather than panic regardless.
fn to_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Ports checked by `int_in` are at most 65535; saturate rather than panic regardless.
fn to_u16(n: u64) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

fn name_error(path: &str, value: &str, e: &NameError) -> TaskDefErrors {
    let got = if value.len() > 255 { format!("{} characters", value.len()) } else { quote(value) };
    err(path, format!("{}, got {got}", e.reason))
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// A string as JSON would write it, cut short if long.
fn quote(s: &str) -> String {
    const MAX_CHARS: usize = 64;
    if s.chars().count() > MAX_CHARS {
        let head: String = s.chars().take(MAX_CHARS).collect();
        let q = Value::String(head).to_string();
        format!("{}...\"", q.strip_suffix('"').unwrap_or(&q))
    } else {
        Value::String(s.to_string()).to_string()
    }
}

/// What the user gave, for "got ..." in messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quote(s),
        Value::Array(a) if a.is_empty() => "an empty array".to_string(),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

#[cfg(test)]
mod tests;
