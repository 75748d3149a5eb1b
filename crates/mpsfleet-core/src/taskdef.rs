//! Task definition validation: ECS-shaped JSON in, a checked [`TaskDefinition`] out.
//!
//! The document is walked by hand from a [`serde_json::Value`] so that every error names the
//! JSON path of the field it is about, and so that ECS fields mpsfleet does not use can be
//! accepted and reported back (`ignored_fields`) while misspelt ones are refused.

use mpsfleet_types::{
    check_name, ContainerDefinition, Family, GpuRequirement, HealthCheck, KeyValuePair, NameError, NvidiaMps,
    ResourceRequirement, SharingStrategy, TaskDefinition,
};
use serde_json::{Map, Value};
use std::collections::HashMap;

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

/// A definition that passed validation, and the ECS fields that were accepted but not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedTaskDefinition {
    /// Revision 0 and `registered_at_ms` 0: the server fills them in at registration.
    pub definition: TaskDefinition,
    /// JSON paths of known ECS fields mpsfleet accepts but does not act on,
    /// e.g. `containerDefinitions[0].portMappings`.
    pub ignored_fields: Vec<String>,
}

/// Why a task definition was refused. `field` is a JSON path (`$` for the whole document).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TaskDefError {
    pub field: String,
    pub message: String,
}

type Result<T> = std::result::Result<T, TaskDefError>;

const TOP_USED: &[&str] = &["family", "containerDefinitions"];
const TOP_IGNORED: &[&str] = &[
    "taskRoleArn",
    "executionRoleArn",
    "networkMode",
    "requiresCompatibilities",
    "cpu",
    "memory",
    "volumes",
    "placementConstraints",
    "tags",
    "runtimePlatform",
    "ipcMode",
    "pidMode",
    "proxyConfiguration",
    "inferenceAccelerators",
    "ephemeralStorage",
    "enableFaultInjection",
    "status",
    "revision",
    "taskDefinitionArn",
    "compatibilities",
    "registeredAt",
    "registeredBy",
    // mpsfleet's own describe output, so that a described definition registers again.
    "registeredAtMs",
    "deregisteredAt",
    "requiresAttributes",
];

const CONTAINER_USED: &[&str] = &[
    "name",
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
];
const CONTAINER_IGNORED: &[&str] = &[
    "image",
    "cpu",
    "memory",
    "memoryReservation",
    "portMappings",
    "logConfiguration",
    "links",
    "mountPoints",
    "volumesFrom",
    "secrets",
    "dependsOn",
    "startTimeout",
    "hostname",
    "workingDirectory",
    "disableNetworking",
    "privileged",
    "readonlyRootFilesystem",
    "dnsServers",
    "dnsSearchDomains",
    "extraHosts",
    "dockerSecurityOptions",
    "interactive",
    "pseudoTerminal",
    "dockerLabels",
    "ulimits",
    "linuxParameters",
    "systemControls",
    "repositoryCredentials",
    "firelensConfiguration",
    "restartPolicy",
    "credentialSpecs",
    "environmentFiles",
    "versionConsistency",
];

const CHECK_KEYS: &[&str] = &["command", "interval", "timeout", "retries", "startPeriod"];
const CHECK_KINDS: &[&str] = &["CMD", "CMD-SHELL", "HTTP-GET", "TCP-CONNECT"];

/// Parses and validates an ECS-shaped task definition.
///
/// The work is linear in the size of the document, which is at most [`MAX_DOCUMENT_BYTES`].
pub fn parse_task_definition(json: &[u8]) -> std::result::Result<ParsedTaskDefinition, TaskDefError> {
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
    let mut ignored = Vec::new();
    check_keys(top, "", TOP_USED, TOP_IGNORED, &mut ignored)?;

    let family_value = require(top, "", "family")?;
    let family_str = as_str(family_value, "family")?;
    let family = Family::new(family_str).map_err(|e| name_error("family", family_str, &e))?;

    let list_path = "containerDefinitions";
    let list = as_array(require(top, "", list_path)?, list_path)?;
    if list.is_empty() {
        return Err(err(list_path, "must have at least one container, got an empty array"));
    }
    if list.len() > MAX_CONTAINERS {
        return Err(err(
            list_path,
            format!("must have at most {MAX_CONTAINERS} containers, got {}", list.len()),
        ));
    }

    let mut containers: Vec<ContainerDefinition> = Vec::with_capacity(list.len());
    let mut names: HashMap<String, usize> = HashMap::with_capacity(list.len());
    let mut gpu = GpuTally::default();
    let mut entries = Entries(0);
    for (i, value) in list.iter().enumerate() {
        let path = format!("{list_path}[{i}]");
        let (container, gpu_index) = parse_container(value, &path, &mut ignored, &mut entries)?;
        if let Some(first) = names.get(&container.name) {
            return Err(err(
                format!("{path}.name"),
                format!(
                    "duplicate container name {}, already used by {list_path}[{first}]",
                    quote(&container.name)
                ),
            ));
        }
        names.insert(container.name.clone(), i);
        if let Some(j) = gpu_index {
            gpu.add(&container, &format!("{path}.resourceRequirements[{j}]"))?;
        }
        containers.push(container);
    }
    if !containers.iter().any(|c| c.essential) {
        return Err(err(list_path, "at least one container must be essential, got none"));
    }

    Ok(ParsedTaskDefinition {
        definition: TaskDefinition {
            family,
            revision: 0,
            container_definitions: containers,
            network_mode: None,
            registered_at_ms: 0,
        },
        ignored_fields: ignored,
    })
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

fn parse_container(
    value: &Value,
    path: &str,
    ignored: &mut Vec<String>,
    entries: &mut Entries,
) -> Result<(ContainerDefinition, Option<usize>)> {
    let obj = as_object(value, path)?;
    check_keys(obj, path, CONTAINER_USED, CONTAINER_IGNORED, ignored)?;

    let name_path = join(path, "name");
    let name = as_str(require(obj, path, "name")?, &name_path)?;
    check_name("container name", name).map_err(|e| name_error(&name_path, name, &e))?;

    let command = optional_string_array(obj, path, "command", entries)?;
    let entry_point = optional_string_array(obj, path, "entryPoint", entries)?;
    if command.is_empty() && entry_point.is_empty() {
        return Err(err(
            join(path, "command"),
            "is required: mpsfleet runs processes, not images, so command or entryPoint \
             must be a non-empty array, got neither",
        ));
    }

    let environment = match obj.get("environment") {
        Some(v) => parse_environment(v, &join(path, "environment"), entries)?,
        None => Vec::new(),
    };

    let essential = match obj.get("essential") {
        Some(v) => as_bool(v, &join(path, "essential"))?,
        None => true,
    };

    let user = match obj.get("user") {
        Some(v) => {
            let user_path = join(path, "user");
            let user = as_str(v, &user_path)?;
            if user.is_empty() {
                return Err(err(user_path, "must not be empty, got \"\""));
            }
            if user.len() > MAX_USER_BYTES {
                return Err(err(
                    user_path,
                    format!("must be at most {MAX_USER_BYTES} bytes, got {} bytes", user.len()),
                ));
            }
            if user.contains('\0') {
                return Err(err(user_path, "must not contain NUL characters"));
            }
            Some(user.to_string())
        }
        None => None,
    };

    let stop_timeout = match obj.get("stopTimeout") {
        Some(v) => Some(to_u32(int_in(v, &join(path, "stopTimeout"), 2, 120, " seconds")?)),
        None => None,
    };

    let health_check = optional_check(obj, path, "healthCheck", entries)?;
    let startup_check = optional_check(obj, path, "startupCheck", entries)?;
    let readiness_check = optional_check(obj, path, "readinessCheck", entries)?;

    let (resource_requirements, gpu_index) = match obj.get("resourceRequirements") {
        Some(v) => parse_resources(v, &join(path, "resourceRequirements"), ignored)?,
        None => (Vec::new(), None),
    };

    let container = ContainerDefinition {
        name: name.to_string(),
        image: None,
        cpu: None,
        memory: None,
        memory_reservation: None,
        working_directory: None,
        docker_labels: Default::default(),
        port_mappings: Vec::new(),
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
    };
    Ok((container, gpu_index))
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
    let mut out: Vec<KeyValuePair> = Vec::with_capacity(list.len());
    // Name -> index of the entry that set it.
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(list.len());
    for (k, entry) in list.iter().enumerate() {
        let entry_path = format!("{path}[{k}]");
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
        out.push(KeyValuePair { name: name.to_string(), value: val.to_string() });
    }
    Ok(out)
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

fn parse_resources(
    value: &Value,
    path: &str,
    ignored: &mut Vec<String>,
) -> Result<(Vec<ResourceRequirement>, Option<usize>)> {
    // Returns the GPU entry (if any) and its index in the input array.
    let list = as_array(value, path)?;
    let mut gpu: Option<(usize, GpuRequirement)> = None;
    for (j, entry) in list.iter().enumerate() {
        let entry_path = format!("{path}[{j}]");
        let obj = as_object(entry, &entry_path)?;
        let type_path = join(&entry_path, "type");
        let kind = as_str(require(obj, &entry_path, "type")?, &type_path)?;
        match kind {
            "GPU" => {
                if let Some((first, _)) = gpu {
                    return Err(err(
                        entry_path,
                        format!(
                            "a container may have only one GPU entry, \
                             already given at {path}[{first}]"
                        ),
                    ));
                }
                gpu = Some((j, parse_gpu(obj, &entry_path)?));
            }
            "InferenceAccelerator" => ignored.push(entry_path),
            other => {
                return Err(err(
                    type_path,
                    format!("must be GPU or InferenceAccelerator, got {}", quote(other)),
                ))
            }
        }
    }
    Ok(match gpu {
        Some((j, g)) => (vec![ResourceRequirement::Gpu(g)], Some(j)),
        None => (Vec::new(), None),
    })
}

fn parse_gpu(obj: &Map<String, Value>, path: &str) -> Result<GpuRequirement> {
    check_keys(obj, path, &["type", "value", "sharingStrategy"], &[], &mut Vec::new())?;
    match (obj.get("value"), obj.get("sharingStrategy")) {
        (Some(_), Some(_)) => Err(err(path, "value and sharingStrategy cannot be used together")),
        (None, None) => Err(err(
            path,
            "needs value (a count of whole GPUs) or sharingStrategy \
             (a share of one GPU through MPS), got neither",
        )),
        (Some(v), None) => {
            let count = gpu_count(v, &join(path, "value"))?;
            Ok(GpuRequirement::Whole { value: count.to_string() })
        }
        (None, Some(s)) => {
            let s_path = join(path, "sharingStrategy");
            let s_obj = as_object(s, &s_path)?;
            check_keys(s_obj, &s_path, &["nvidiaMps"], &[], &mut Vec::new())?;
            let mps_path = join(&s_path, "nvidiaMps");
            let mps = as_object(require(s_obj, &s_path, "nvidiaMps")?, &mps_path)?;
            check_keys(mps, &mps_path, &["memory", "maxComputePercent"], &[], &mut Vec::new())?;
            let memory = int_in(
                require(mps, &mps_path, "memory")?,
                &join(&mps_path, "memory"),
                1,
                MAX_MPS_MEMORY_MIB,
                " (MiB)",
            )?;
            let max_compute_percent = match mps.get("maxComputePercent") {
                Some(v) => {
                    let p = int_in(v, &join(&mps_path, "maxComputePercent"), 1, 100, "")?;
                    Some(u8::try_from(p).unwrap_or(100))
                }
                None => None,
            };
            Ok(GpuRequirement::Mps {
                sharing_strategy: SharingStrategy { nvidia_mps: NvidiaMps { memory, max_compute_percent } },
            })
        }
    }
}

/// A whole-GPU count, given as ECS writes it (`"1"`) or as a JSON number.
fn gpu_count(value: &Value, path: &str) -> Result<u64> {
    let bad = || {
        err(
            path,
            format!("must be a whole number of GPUs from 1 to {MAX_WHOLE_GPUS}, got {}", describe(value)),
        )
    };
    let n = match value {
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse::<u64>().map_err(|_| bad())?
        }
        Value::Number(n) => n.as_u64().ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    if (1..=MAX_WHOLE_GPUS).contains(&n) {
        Ok(n)
    } else {
        Err(bad())
    }
}

/// Cross-container GPU rules: one form per task, and totals that fit.
#[derive(Default)]
struct GpuTally {
    /// The first GPU container seen: its name and whether it uses MPS.
    first: Option<(String, bool)>,
    whole: u64,
    mps_memory: u64,
}

impl GpuTally {
    /// `req_path` is the path of the container's GPU entry in the input.
    fn add(&mut self, container: &ContainerDefinition, req_path: &str) -> Result<()> {
        let Some(req) = container.gpu() else {
            return Ok(());
        };
        let is_mps = matches!(req, GpuRequirement::Mps { .. });
        match &self.first {
            Some((first, first_mps)) if *first_mps != is_mps => {
                let form = |mps: bool| {
                    if mps {
                        "MPS (sharingStrategy)"
                    } else {
                        "whole GPUs (value)"
                    }
                };
                return Err(err(
                    req_path,
                    format!(
                        "uses {} but container {} uses {}; \
                         all GPU containers of a task must use the same form",
                        form(is_mps),
                        quote(first),
                        form(*first_mps)
                    ),
                ));
            }
            Some(_) => {}
            None => self.first = Some((container.name.clone(), is_mps)),
        }
        match req {
            GpuRequirement::Whole { value } => {
                self.whole = self.whole.saturating_add(value.parse::<u64>().unwrap_or(0));
                if self.whole > MAX_WHOLE_GPUS {
                    return Err(err(
                        format!("{req_path}.value"),
                        format!(
                            "the task's containers ask for {} whole GPUs in all, \
                             more than the limit of {MAX_WHOLE_GPUS}",
                            self.whole
                        ),
                    ));
                }
            }
            GpuRequirement::Mps { sharing_strategy } => {
                self.mps_memory = self.mps_memory.saturating_add(sharing_strategy.nvidia_mps.memory);
                if self.mps_memory > MAX_MPS_MEMORY_MIB {
                    return Err(err(
                        format!("{req_path}.sharingStrategy.nvidiaMps.memory"),
                        format!(
                            "the task's MPS containers share one GPU and ask for {} MiB \
                             in all, more than the limit of {MAX_MPS_MEMORY_MIB} MiB",
                            self.mps_memory
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

// ---- walking helpers ----

fn err(field: impl Into<String>, message: impl Into<String>) -> TaskDefError {
    TaskDefError { field: field.into(), message: message.into() }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Refuses keys that are neither used nor known-ignored; records the known-ignored ones.
/// Keys are visited sorted so the result does not depend on the map's ordering.
fn check_keys(
    obj: &Map<String, Value>,
    prefix: &str,
    used: &[&str],
    known_ignored: &[&str],
    ignored: &mut Vec<String>,
) -> Result<()> {
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    for key in keys {
        if used.contains(&key.as_str()) {
            continue;
        }
        if known_ignored.contains(&key.as_str()) {
            ignored.push(join(prefix, key));
            continue;
        }
        return Err(err(join(prefix, key), "unknown field"));
    }
    Ok(())
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

fn name_error(path: &str, value: &str, e: &NameError) -> TaskDefError {
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
