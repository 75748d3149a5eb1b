//! The task definition's volumes and Linux options: top-level `volumes`, `pidMode`, `ipcMode`,
//! and per container `mountPoints`, `volumesFrom`, `linuxParameters`, `ulimits`,
//! `systemControls`, `privileged`, `readonlyRootFilesystem`, `dnsServers`, `dnsSearchDomains`,
//! `extraHosts` and `hostname`. Every list and string is bounded; every error names the JSON
//! path and the rule.

use super::{as_array, as_bool, as_object, as_str, check_keys, describe, err, int_in, join, quote, require};
use super::{Result, TaskDefErrors};
use mpsfleet_types::{
    ContainerDefinition, Device, DockerVolumeConfiguration, ExtraHost, HostVolume, KernelCapabilities,
    LinuxParameters, MountPoint, SystemControl, Tmpfs, Ulimit, Volume, VolumeFrom,
};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The most `volumes` of a task definition.
pub const MAX_VOLUMES: usize = 64;
/// The most bytes of a volume's `name` (ECS: up to 255 letters, digits, '-' and '_').
pub const MAX_VOLUME_NAME_BYTES: usize = 255;
/// The most bytes of a path (`sourcePath`, `containerPath`, a device's paths): Linux's PATH_MAX.
pub const MAX_PATH_BYTES: usize = 4096;
/// The most bytes of a Docker volume driver's name.
pub const MAX_DRIVER_BYTES: usize = 255;
/// The most `driverOpts` or `labels` of a Docker volume.
pub const MAX_VOLUME_OPTIONS: usize = 64;
/// The most bytes of a `driverOpts` or `labels` key, and of a value.
pub const MAX_OPTION_KEY_BYTES: usize = 255;
pub const MAX_OPTION_VALUE_BYTES: usize = 4096;
/// The most `mountPoints` of one container.
pub const MAX_MOUNT_POINTS: usize = 64;
/// The most `volumesFrom` of one container (there are at most 10 containers).
pub const MAX_VOLUMES_FROM: usize = 10;
/// The most `linuxParameters.devices` of one container.
pub const MAX_DEVICES: usize = 64;
/// The most `linuxParameters.tmpfs` mounts of one container.
pub const MAX_TMPFS: usize = 64;
/// The most `mountOptions` of one tmpfs mount.
pub const MAX_TMPFS_OPTIONS: usize = 32;
/// The most bytes of one tmpfs mount option (`mode=1777`).
pub const MAX_TMPFS_OPTION_BYTES: usize = 64;
/// The most MiB of `sharedMemorySize`, of one tmpfs `size`, and of `maxSwap` (16 TiB).
pub const MAX_LINUX_MIB: u64 = 16_777_216;
/// The most entries of `capabilities.add` or `capabilities.drop`.
pub const MAX_CAPABILITIES: usize = 64;
/// The most `systemControls` of one container.
pub const MAX_SYSTEM_CONTROLS: usize = 64;
/// The most bytes of a `systemControls` namespace, and of its value.
pub const MAX_SYSCTL_NAME_BYTES: usize = 255;
pub const MAX_SYSCTL_VALUE_BYTES: usize = 4096;
/// The most `dnsServers`, and the most `dnsSearchDomains`, of one container.
pub const MAX_DNS_ENTRIES: usize = 16;
/// The most bytes of a DNS search domain or of an `extraHosts` host name (DNS's 253).
pub const MAX_DOMAIN_BYTES: usize = 253;
/// The most `extraHosts` of one container.
pub const MAX_EXTRA_HOSTS: usize = 64;
/// The most bytes of a container's `hostname` (Linux's HOST_NAME_MAX).
pub const MAX_HOSTNAME_BYTES: usize = 64;

const VOLUME_KEYS: &[&str] = &[
    "name",
    "host",
    "dockerVolumeConfiguration",
    "efsVolumeConfiguration",
    "fsxWindowsFileServerVolumeConfiguration",
    "configuredAtLaunch",
];
/// Volume kinds only AWS provides: kept as given, a task needing one is refused at run time.
pub const AWS_ONLY_VOLUME_KINDS: &[&str] =
    &["efsVolumeConfiguration", "fsxWindowsFileServerVolumeConfiguration", "configuredAtLaunch"];
const DOCKER_VOLUME_KEYS: &[&str] = &["scope", "autoprovision", "driver", "driverOpts", "labels"];
const LINUX_KEYS: &[&str] =
    &["capabilities", "devices", "initProcessEnabled", "sharedMemorySize", "tmpfs", "maxSwap", "swappiness"];

/// Linux capabilities by the names ECS accepts (`KernelCapabilities`).
pub const CAPABILITIES: &[&str] = &[
    "ALL",
    "AUDIT_CONTROL",
    "AUDIT_READ",
    "AUDIT_WRITE",
    "BLOCK_SUSPEND",
    "BPF",
    "CHECKPOINT_RESTORE",
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "IPC_LOCK",
    "IPC_OWNER",
    "KILL",
    "LEASE",
    "LINUX_IMMUTABLE",
    "MAC_ADMIN",
    "MAC_OVERRIDE",
    "MKNOD",
    "NET_ADMIN",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_RAW",
    "PERFMON",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_CHROOT",
    "SYS_MODULE",
    "SYS_NICE",
    "SYS_PACCT",
    "SYS_PTRACE",
    "SYS_RAWIO",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "SYSLOG",
    "WAKE_ALARM",
];

/// ECS's tmpfs `mountOptions`; the last six take a value (`mode=1777`).
pub const TMPFS_OPTIONS: &[&str] = &[
    "defaults",
    "ro",
    "rw",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "sync",
    "async",
    "dirsync",
    "remount",
    "mand",
    "nomand",
    "atime",
    "noatime",
    "diratime",
    "nodiratime",
    "bind",
    "rbind",
    "unbindable",
    "runbindable",
    "private",
    "rprivate",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "mode",
    "uid",
    "gid",
    "nr_inodes",
    "nr_blocks",
    "mpol",
];

/// ECS's `ulimits` names.
pub const ULIMIT_NAMES: &[&str] = &[
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

const DEVICE_PERMISSIONS: &[&str] = &["read", "write", "mknod"];

/// `volumes`: each with a unique name and at most one kind.
pub(super) fn parse_volumes(value: &Value, path: &str, ignored: &mut Vec<String>) -> Result<Vec<Volume>> {
    let list = bounded_array(value, path, MAX_VOLUMES, "volumes")?;
    let mut names = FirstUse::new(path, "volume name", "used");
    super::each(list, path, |i, entry, vpath| {
        let obj = as_object(entry, &vpath)?;
        check_keys(obj, &vpath, VOLUME_KEYS, &[], ignored)?;
        let name_path = join(&vpath, "name");
        let name = as_str(require(obj, &vpath, "name")?, &name_path)?;
        check_volume_name(name, &name_path)?;
        names.claim(name, i, &name_path)?;
        let kinds: Vec<&str> = ["host", "dockerVolumeConfiguration"]
            .into_iter()
            .chain(AWS_ONLY_VOLUME_KINDS.iter().copied())
            .filter(|k| match obj.get(*k) {
                Some(Value::Bool(b)) => *b,
                Some(Value::Null) | None => false,
                Some(_) => true,
            })
            .collect();
        if kinds.len() > 1 {
            return Err(err(
                vpath,
                format!("must have at most one of host, dockerVolumeConfiguration, efsVolumeConfiguration, fsxWindowsFileServerVolumeConfiguration, configuredAtLaunch, got {}", kinds.join(", ")),
            ));
        }
        let mut volume = Volume { name: name.to_string(), ..Volume::default() };
        if let Some(v) = obj.get("host") {
            volume.host = Some(parse_host_volume(v, &join(&vpath, "host"))?);
        }
        if let Some(v) = obj.get("dockerVolumeConfiguration") {
            volume.docker_volume_configuration =
                Some(parse_docker_volume(v, &join(&vpath, "dockerVolumeConfiguration"))?);
        }
        for kind in AWS_ONLY_VOLUME_KINDS {
            let Some(v) = obj.get(*kind) else { continue };
            let kpath = join(&vpath, kind);
            if *kind == "configuredAtLaunch" {
                if !as_bool(v, &kpath)? {
                    continue;
                }
            } else {
                as_object(v, &kpath)?;
            }
            volume.aws_only.insert(kind.to_string(), v.clone());
            ignored.push(kpath);
        }
        Ok(volume)
    })
}

fn check_volume_name(name: &str, path: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_VOLUME_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
    if !ok {
        return Err(err(
            path,
            format!(
                "must be 1 to {MAX_VOLUME_NAME_BYTES} letters, digits, '-' or '_' (as ECS requires), got {}",
                describe(&Value::String(name.to_string()))
            ),
        ));
    }
    Ok(())
}

fn parse_host_volume(value: &Value, path: &str) -> Result<HostVolume> {
    let obj = as_object(value, path)?;
    check_keys(obj, path, &["sourcePath"], &[], &mut Vec::new())?;
    let source_path = match obj.get("sourcePath") {
        Some(v) => {
            let p = join(path, "sourcePath");
            let s = as_str(v, &p)?;
            check_path(s, &p)?;
            Some(s.to_string())
        }
        None => None,
    };
    Ok(HostVolume { source_path })
}

fn parse_docker_volume(value: &Value, path: &str) -> Result<DockerVolumeConfiguration> {
    let obj = as_object(value, path)?;
    check_keys(obj, path, DOCKER_VOLUME_KEYS, &[], &mut Vec::new())?;
    let scope = match obj.get("scope") {
        Some(v) => {
            let p = join(path, "scope");
            match as_str(v, &p)? {
                s @ ("task" | "shared") => Some(s.to_string()),
                _ => return Err(err(p, format!("must be task or shared, got {}", describe(v)))),
            }
        }
        None => None,
    };
    let autoprovision = match obj.get("autoprovision") {
        Some(v) => Some(as_bool(v, &join(path, "autoprovision"))?),
        None => None,
    };
    if autoprovision == Some(true) && scope.as_deref() != Some("shared") {
        return Err(err(
            join(path, "autoprovision"),
            "may be true only with scope shared (a task-scoped volume is always created), as ECS requires",
        ));
    }
    let driver = match obj.get("driver") {
        Some(v) => {
            let p = join(path, "driver");
            let d = as_str(v, &p)?;
            let ok = !d.is_empty()
                && d.len() <= MAX_DRIVER_BYTES
                && d.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':'));
            if !ok {
                return Err(err(
                    p,
                    format!(
                        "must be 1 to {MAX_DRIVER_BYTES} letters, digits, '-', '_', '.', '/' or ':', got {}",
                        describe(v)
                    ),
                ));
            }
            Some(d.to_string())
        }
        None => None,
    };
    let driver_opts = match obj.get("driverOpts") {
        Some(v) => parse_string_map(v, &join(path, "driverOpts"))?,
        None => BTreeMap::new(),
    };
    let labels = match obj.get("labels") {
        Some(v) => parse_string_map(v, &join(path, "labels"))?,
        None => BTreeMap::new(),
    };
    Ok(DockerVolumeConfiguration { scope, autoprovision, driver, driver_opts, labels })
}

fn parse_string_map(value: &Value, path: &str) -> Result<BTreeMap<String, String>> {
    let obj = as_object(value, path)?;
    if obj.len() > MAX_VOLUME_OPTIONS {
        return Err(err(path, format!("must have at most {MAX_VOLUME_OPTIONS} entries, got {}", obj.len())));
    }
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        let kpath = format!("{path}[{}]", quote(k));
        if k.is_empty() || k.len() > MAX_OPTION_KEY_BYTES || k.contains('\0') {
            return Err(err(kpath, format!("the key must be 1 to {MAX_OPTION_KEY_BYTES} bytes without NUL")));
        }
        let s = as_str(v, &kpath)?;
        if s.len() > MAX_OPTION_VALUE_BYTES || s.contains('\0') {
            return Err(err(
                kpath,
                format!(
                    "the value must be at most {MAX_OPTION_VALUE_BYTES} bytes without NUL, got {} bytes",
                    s.len()
                ),
            ));
        }
        out.insert(k.clone(), s.to_string());
    }
    Ok(out)
}

/// An absolute path of at most [`MAX_PATH_BYTES`], without NUL or ':' (Docker's bind syntax
/// separates with ':').
fn check_path(s: &str, path: &str) -> Result<()> {
    if s.len() > MAX_PATH_BYTES {
        return Err(err(path, format!("must be at most {MAX_PATH_BYTES} bytes, got {} bytes", s.len())));
    }
    if !s.starts_with('/') {
        return Err(err(path, format!("must be an absolute path, got {}", quote(s))));
    }
    if s.contains(['\0', ':', ',']) {
        return Err(err(
            path,
            format!("must not contain NUL, ':' or ',' (Docker's mount syntax), got {}", quote(s)),
        ));
    }
    Ok(())
}

/// `pidMode`: `host` or `task`.
pub(super) fn parse_pid_mode(value: &Value, path: &str) -> Result<String> {
    match value.as_str() {
        Some(s @ ("host" | "task")) => Ok(s.to_string()),
        _ => Err(err(path, format!("must be host or task, got {}", describe(value)))),
    }
}

/// `ipcMode`: `host`, `task` or `none`.
pub(super) fn parse_ipc_mode(value: &Value, path: &str) -> Result<String> {
    match value.as_str() {
        Some(s @ ("host" | "task" | "none")) => Ok(s.to_string()),
        _ => Err(err(path, format!("must be host, task or none, got {}", describe(value)))),
    }
}

/// The container fields of this module, parsed.
#[derive(Default)]
pub(super) struct ContainerOptions {
    pub mount_points: Vec<MountPoint>,
    pub volumes_from: Vec<VolumeFrom>,
    pub linux_parameters: Option<LinuxParameters>,
    pub ulimits: Vec<Ulimit>,
    pub system_controls: Vec<SystemControl>,
    pub privileged: Option<bool>,
    pub readonly_root_filesystem: Option<bool>,
    pub dns_servers: Vec<String>,
    pub dns_search_domains: Vec<String>,
    pub extra_hosts: Vec<ExtraHost>,
    pub hostname: Option<String>,
}

/// Parses the container's volume and Linux option fields (references to volumes and other
/// containers are checked by [`check_references`] once all are known). The errors of every
/// field are added to `errors`; a field refused is left at its default.
pub(super) fn parse_container_options(
    obj: &Map<String, Value>,
    path: &str,
    errors: &mut TaskDefErrors,
) -> ContainerOptions {
    let mut o = ContainerOptions::default();
    if let Some(v) = obj.get("mountPoints") {
        o.mount_points = errors.take(parse_mount_points(v, &join(path, "mountPoints"))).unwrap_or_default();
    }
    if let Some(v) = obj.get("volumesFrom") {
        o.volumes_from = errors.take(parse_volumes_from(v, &join(path, "volumesFrom"))).unwrap_or_default();
    }
    if let Some(v) = obj.get("linuxParameters") {
        o.linux_parameters = errors.take(parse_linux(v, &join(path, "linuxParameters")));
    }
    if let Some(v) = obj.get("ulimits") {
        o.ulimits = errors.take(parse_ulimits(v, &join(path, "ulimits"))).unwrap_or_default();
    }
    if let Some(v) = obj.get("systemControls") {
        o.system_controls =
            errors.take(parse_system_controls(v, &join(path, "systemControls"))).unwrap_or_default();
    }
    if let Some(v) = obj.get("privileged") {
        o.privileged = errors.take(as_bool(v, &join(path, "privileged")));
    }
    if let Some(v) = obj.get("readonlyRootFilesystem") {
        o.readonly_root_filesystem = errors.take(as_bool(v, &join(path, "readonlyRootFilesystem")));
    }
    if let Some(v) = obj.get("dnsServers") {
        let p = join(path, "dnsServers");
        o.dns_servers =
            errors.take(bounded_list(v, &p, MAX_DNS_ENTRIES, "DNS servers", check_ip)).unwrap_or_default();
    }
    if let Some(v) = obj.get("dnsSearchDomains") {
        let p = join(path, "dnsSearchDomains");
        o.dns_search_domains = errors
            .take(bounded_list(v, &p, MAX_DNS_ENTRIES, "search domains", check_domain))
            .unwrap_or_default();
    }
    if let Some(v) = obj.get("extraHosts") {
        o.extra_hosts = errors.take(parse_extra_hosts(v, &join(path, "extraHosts"))).unwrap_or_default();
    }
    if let Some(v) = obj.get("hostname") {
        o.hostname = errors.take(parse_hostname(v, &join(path, "hostname")));
    }
    o
}

/// A container's `hostname`.
fn parse_hostname(v: &Value, p: &str) -> Result<String> {
    let h = as_str(v, p)?;
    let ok = !h.is_empty()
        && h.len() <= MAX_HOSTNAME_BYTES
        && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'))
        && !h.starts_with(['-', '.']);
    if !ok {
        return Err(err(
            p,
            format!(
                "must be 1 to {MAX_HOSTNAME_BYTES} letters, digits, '-' or '.', not starting with '-' or '.', got {}",
                describe(v)
            ),
        ));
    }
    Ok(h.to_string())
}

/// A list of at most `max` strings, each checked by `check`.
/// `value` as an array of at most `max` entries; the error names `path` and the bound.
fn bounded_array<'a>(value: &'a Value, path: &str, max: usize, what: &str) -> Result<&'a Vec<Value>> {
    let list = as_array(value, path)?;
    if list.len() > max {
        return Err(err(path, format!("must have at most {max} {what}, got {}", list.len())));
    }
    Ok(list)
}

/// The objects of a list of at most `max` `what`, each with its index and path and its keys
/// checked against `keys`, parsed by `one`: the loop every list of objects in a container's
/// options shares. Every entry's errors are reported, not only the first.
fn each_object<'a, T>(
    value: &'a Value,
    path: &str,
    (max, what): (usize, &str),
    keys: &[&str],
    mut one: impl FnMut(usize, &'a Map<String, Value>, &str) -> Result<T>,
) -> Result<Vec<T>> {
    let list = bounded_array(value, path, max, what)?;
    super::each(list, path, |k, entry, p| {
        let obj = as_object(entry, &p)?;
        check_keys(obj, &p, keys, &[], &mut Vec::new())?;
        one(k, obj, &p)
    })
}

/// Which entry of the list at `list` first used each value of a field, so that a repeat is
/// refused naming both: "duplicate `noun` X, already `verb` by LIST[i]".
struct FirstUse<'a> {
    list: &'a str,
    noun: &'static str,
    verb: &'static str,
    first: HashMap<String, usize>,
}

impl<'a> FirstUse<'a> {
    fn new(list: &'a str, noun: &'static str, verb: &'static str) -> Self {
        FirstUse { list, noun, verb, first: HashMap::new() }
    }

    /// `value` of entry `k`, at `field_path`.
    fn claim(&mut self, value: &str, k: usize, field_path: &str) -> Result<()> {
        if let Some(first) = self.first.get(value) {
            let (noun, verb, list) = (self.noun, self.verb, self.list);
            return Err(err(
                field_path,
                format!("duplicate {noun} {}, already {verb} by {list}[{first}]", quote(value)),
            ));
        }
        self.first.insert(value.to_string(), k);
        Ok(())
    }
}

fn bounded_list(
    value: &Value,
    path: &str,
    max: usize,
    what: &str,
    check: impl Fn(&str, &str) -> Result<()>,
) -> Result<Vec<String>> {
    let list = bounded_array(value, path, max, what)?;
    list.iter()
        .enumerate()
        .map(|(k, v)| {
            let p = format!("{path}[{k}]");
            let s = as_str(v, &p)?;
            check(s, &p)?;
            Ok(s.to_string())
        })
        .collect()
}

fn check_ip(s: &str, path: &str) -> Result<()> {
    if s.len() > 64 || s.parse::<std::net::IpAddr>().is_err() {
        return Err(err(path, format!("must be an IPv4 or IPv6 address, got {}", quote(s))));
    }
    Ok(())
}

fn check_domain(s: &str, path: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= MAX_DOMAIN_BYTES
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !ok {
        return Err(err(
            path,
            format!("must be 1 to {MAX_DOMAIN_BYTES} letters, digits, '-', '_' or '.', got {}", quote(s)),
        ));
    }
    Ok(())
}

fn parse_mount_points(value: &Value, path: &str) -> Result<Vec<MountPoint>> {
    let mut at = FirstUse::new(path, "mount point", "used");
    let keys = ["sourceVolume", "containerPath", "readOnly"];
    each_object(value, path, (MAX_MOUNT_POINTS, "mount points"), &keys, |k, obj, p| {
        let sv_path = join(p, "sourceVolume");
        let source_volume = as_str(require(obj, p, "sourceVolume")?, &sv_path)?;
        check_volume_name(source_volume, &sv_path)?;
        let cp_path = join(p, "containerPath");
        let container_path = as_str(require(obj, p, "containerPath")?, &cp_path)?;
        check_path(container_path, &cp_path)?;
        at.claim(container_path, k, &cp_path)?;
        let read_only = match obj.get("readOnly") {
            Some(v) => as_bool(v, &join(p, "readOnly"))?,
            None => false,
        };
        Ok(MountPoint {
            source_volume: source_volume.to_string(),
            container_path: container_path.to_string(),
            read_only,
        })
    })
}

fn parse_volumes_from(value: &Value, path: &str) -> Result<Vec<VolumeFrom>> {
    each_object(value, path, (MAX_VOLUMES_FROM, "entries"), &["sourceContainer", "readOnly"], |_, obj, p| {
        let sc_path = join(p, "sourceContainer");
        let source_container = as_str(require(obj, p, "sourceContainer")?, &sc_path)?;
        if source_container.is_empty() || source_container.len() > 255 {
            return Err(err(
                sc_path,
                format!("must name a container of the task, got {}", quote(source_container)),
            ));
        }
        let read_only = match obj.get("readOnly") {
            Some(v) => as_bool(v, &join(p, "readOnly"))?,
            None => false,
        };
        Ok(VolumeFrom { source_container: source_container.to_string(), read_only })
    })
}

fn parse_linux(value: &Value, path: &str) -> Result<LinuxParameters> {
    let obj = as_object(value, path)?;
    check_keys(obj, path, LINUX_KEYS, &[], &mut Vec::new())?;
    let mut lp = LinuxParameters::default();
    if let Some(v) = obj.get("capabilities") {
        let p = join(path, "capabilities");
        let caps = as_object(v, &p)?;
        check_keys(caps, &p, &["add", "drop"], &[], &mut Vec::new())?;
        let list = |key: &str| -> Result<Vec<String>> {
            match caps.get(key) {
                Some(v) => {
                    bounded_list(v, &join(&p, key), MAX_CAPABILITIES, "capabilities", check_capability)
                }
                None => Ok(Vec::new()),
            }
        };
        lp.capabilities = Some(KernelCapabilities { add: list("add")?, drop: list("drop")? });
    }
    if let Some(v) = obj.get("devices") {
        lp.devices = parse_devices(v, &join(path, "devices"))?;
    }
    if let Some(v) = obj.get("initProcessEnabled") {
        lp.init_process_enabled = Some(as_bool(v, &join(path, "initProcessEnabled"))?);
    }
    if let Some(v) = obj.get("sharedMemorySize") {
        lp.shared_memory_size = Some(int_in(v, &join(path, "sharedMemorySize"), 1, MAX_LINUX_MIB, " MiB")?);
    }
    if let Some(v) = obj.get("tmpfs") {
        lp.tmpfs = parse_tmpfs(v, &join(path, "tmpfs"))?;
    }
    if let Some(v) = obj.get("maxSwap") {
        lp.max_swap = Some(int_in(v, &join(path, "maxSwap"), 0, MAX_LINUX_MIB, " MiB")?);
    }
    if let Some(v) = obj.get("swappiness") {
        lp.swappiness = Some(super::to_u32(int_in(v, &join(path, "swappiness"), 0, 100, "")?));
    }
    Ok(lp)
}

/// A capability as ECS names it (`SYS_PTRACE`); Docker's `CAP_` prefix and lowercase are
/// accepted too, as Docker accepts them.
fn check_capability(s: &str, path: &str) -> Result<()> {
    let upper = s.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    if s.len() > 64 || !CAPABILITIES.contains(&bare) {
        return Err(err(
            path,
            format!(
                "must be a Linux capability as ECS names them ({}), got {}",
                CAPABILITIES.join(", "),
                quote(s)
            ),
        ));
    }
    Ok(())
}

fn parse_devices(value: &Value, path: &str) -> Result<Vec<Device>> {
    each_object(
        value,
        path,
        (MAX_DEVICES, "devices"),
        &["hostPath", "containerPath", "permissions"],
        |_, obj, p| {
            let hp_path = join(p, "hostPath");
            let host_path = as_str(require(obj, p, "hostPath")?, &hp_path)?;
            check_path(host_path, &hp_path)?;
            let container_path = match obj.get("containerPath") {
                Some(v) => {
                    let cp = join(p, "containerPath");
                    let s = as_str(v, &cp)?;
                    check_path(s, &cp)?;
                    Some(s.to_string())
                }
                None => None,
            };
            let permissions = match obj.get("permissions") {
                Some(v) => {
                    let pp = join(p, "permissions");
                    let perms = bounded_list(v, &pp, 3, "permissions", |s, ip| {
                        if DEVICE_PERMISSIONS.contains(&s) {
                            Ok(())
                        } else {
                            Err(err(ip, format!("must be read, write or mknod, got {}", quote(s))))
                        }
                    })?;
                    let unique: HashSet<&String> = perms.iter().collect();
                    if unique.len() != perms.len() {
                        return Err(err(pp, "must not name a permission twice"));
                    }
                    perms
                }
                None => Vec::new(),
            };
            Ok(Device { host_path: host_path.to_string(), container_path, permissions })
        },
    )
}

fn parse_tmpfs(value: &Value, path: &str) -> Result<Vec<Tmpfs>> {
    let mut at = FirstUse::new(path, "tmpfs mount", "used");
    each_object(
        value,
        path,
        (MAX_TMPFS, "tmpfs mounts"),
        &["containerPath", "size", "mountOptions"],
        |k, obj, p| {
            let cp_path = join(p, "containerPath");
            let container_path = as_str(require(obj, p, "containerPath")?, &cp_path)?;
            check_path(container_path, &cp_path)?;
            at.claim(container_path, k, &cp_path)?;
            let size = int_in(require(obj, p, "size")?, &join(p, "size"), 1, MAX_LINUX_MIB, " MiB")?;
            let mount_options = match obj.get("mountOptions") {
                Some(v) => bounded_list(
                    v,
                    &join(p, "mountOptions"),
                    MAX_TMPFS_OPTIONS,
                    "mount options",
                    check_tmpfs_option,
                )?,
                None => Vec::new(),
            };
            Ok(Tmpfs { container_path: container_path.to_string(), size, mount_options })
        },
    )
}

/// One of ECS's tmpfs mount options, `name` or, for those that take one, `name=value`.
fn check_tmpfs_option(s: &str, path: &str) -> Result<()> {
    let (name, value) = match s.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (s, None),
    };
    let valued = matches!(name, "mode" | "uid" | "gid" | "nr_inodes" | "nr_blocks" | "mpol");
    let value_ok = match value {
        Some(v) => {
            valued
                && !v.is_empty()
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'/' | b'.' | b'-' | b'_'))
        }
        None => true,
    };
    if s.len() > MAX_TMPFS_OPTION_BYTES || !TMPFS_OPTIONS.contains(&name) || !value_ok || s.contains(',') {
        return Err(err(
            path,
            format!(
                "must be one of ECS's tmpfs mount options ({}; mode, uid, gid, nr_inodes, nr_blocks and mpol as name=value), \
                 at most {MAX_TMPFS_OPTION_BYTES} bytes, got {}",
                TMPFS_OPTIONS.join(", "),
                quote(s)
            ),
        ));
    }
    Ok(())
}

fn parse_ulimits(value: &Value, path: &str) -> Result<Vec<Ulimit>> {
    let mut seen = FirstUse::new(path, "ulimit", "set");
    each_object(
        value,
        path,
        (ULIMIT_NAMES.len(), "ulimits (one per name)"),
        &["name", "softLimit", "hardLimit"],
        |k, obj, p| {
            let name_path = join(p, "name");
            let name = as_str(require(obj, p, "name")?, &name_path)?;
            if !ULIMIT_NAMES.contains(&name) {
                return Err(err(
                    name_path,
                    format!("must be one of {}, got {}", ULIMIT_NAMES.join(", "), quote(name)),
                ));
            }
            seen.claim(name, k, &name_path)?;
            let limit = |key: &str| -> Result<i64> {
                let lp = join(p, key);
                let v = require(obj, p, key)?;
                match v.as_i64() {
                    Some(n) if n >= -1 => Ok(n),
                    _ => Err(err(
                        lp,
                        format!(
                            "must be an integer from -1 (unlimited) to {}, got {}",
                            i64::MAX,
                            describe(v)
                        ),
                    )),
                }
            };
            let soft_limit = limit("softLimit")?;
            let hard_limit = limit("hardLimit")?;
            let unlimited = |n: i64| n == -1;
            if !unlimited(hard_limit) && (unlimited(soft_limit) || soft_limit > hard_limit) {
                return Err(err(
                    join(p, "softLimit"),
                    format!("must be at most hardLimit ({hard_limit}), got {soft_limit}"),
                ));
            }
            Ok(Ulimit { name: name.to_string(), soft_limit, hard_limit })
        },
    )
}

fn parse_system_controls(value: &Value, path: &str) -> Result<Vec<SystemControl>> {
    let mut seen = FirstUse::new(path, "namespace", "set");
    each_object(
        value,
        path,
        (MAX_SYSTEM_CONTROLS, "system controls"),
        &["namespace", "value"],
        |k, obj, p| {
            let ns_path = join(p, "namespace");
            let namespace = as_str(require(obj, p, "namespace")?, &ns_path)?;
            let ok = !namespace.is_empty()
                && namespace.len() <= MAX_SYSCTL_NAME_BYTES
                && namespace
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
            if !ok {
                return Err(err(
                ns_path,
                format!(
                    "must be a kernel parameter name of 1 to {MAX_SYSCTL_NAME_BYTES} letters, digits, '.', '_', '-' or '/', got {}",
                    quote(namespace)
                ),
            ));
            }
            seen.claim(namespace, k, &ns_path)?;
            let value_path = join(p, "value");
            let val = as_str(require(obj, p, "value")?, &value_path)?;
            if val.len() > MAX_SYSCTL_VALUE_BYTES || val.contains('\0') {
                return Err(err(
                    value_path,
                    format!(
                        "must be at most {MAX_SYSCTL_VALUE_BYTES} bytes without NUL, got {} bytes",
                        val.len()
                    ),
                ));
            }
            Ok(SystemControl { namespace: namespace.to_string(), value: val.to_string() })
        },
    )
}

fn parse_extra_hosts(value: &Value, path: &str) -> Result<Vec<ExtraHost>> {
    each_object(value, path, (MAX_EXTRA_HOSTS, "extra hosts"), &["hostname", "ipAddress"], |_, obj, p| {
        let hp = join(p, "hostname");
        let hostname = as_str(require(obj, p, "hostname")?, &hp)?;
        check_domain(hostname, &hp)?;
        let ip_path = join(p, "ipAddress");
        let ip = as_str(require(obj, p, "ipAddress")?, &ip_path)?;
        check_ip(ip, &ip_path)?;
        Ok(ExtraHost { hostname: hostname.to_string(), ip_address: ip.to_string() })
    })
}

/// Every `mountPoints[].sourceVolume` names a volume of the task, every
/// `volumesFrom[].sourceContainer` another container of it.
pub(super) fn check_references(
    containers: &[ContainerDefinition],
    volumes: &[Volume],
    list_path: &str,
) -> Result<()> {
    let names: HashSet<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    for (i, c) in containers.iter().enumerate() {
        for (k, m) in c.mount_points.iter().enumerate() {
            if !names.contains(m.source_volume.as_str()) {
                return Err(err(
                    format!("{list_path}[{i}].mountPoints[{k}].sourceVolume"),
                    format!(
                        "must name one of the task's volumes ({}), got {}",
                        if names.is_empty() { "it has none".to_string() } else { sorted(&names) },
                        quote(&m.source_volume)
                    ),
                ));
            }
        }
        for (k, f) in c.volumes_from.iter().enumerate() {
            let p = format!("{list_path}[{i}].volumesFrom[{k}].sourceContainer");
            if f.source_container == c.name {
                return Err(err(
                    p,
                    format!("must name another container, got its own name {}", quote(&c.name)),
                ));
            }
            if !containers.iter().any(|o| o.name == f.source_container) {
                return Err(err(
                    p,
                    format!("must name a container of the task, got {}", quote(&f.source_container)),
                ));
            }
        }
    }
    Ok(())
}

fn sorted(names: &HashSet<&str>) -> String {
    let mut v: Vec<&str> = names.iter().copied().collect();
    v.sort_unstable();
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::{parse_task_definition, ParsedTaskDefinition, TaskDefError};
    use serde_json::{json, Value};

    fn doc(top: Value, containers: Vec<Value>) -> Vec<u8> {
        let mut t = json!({"family": "f", "containerDefinitions": containers});
        if let (Some(o), Value::Object(extra)) = (t.as_object_mut(), top) {
            o.extend(extra);
        }
        t.to_string().into_bytes()
    }

    fn c(extra: Value) -> Value {
        let mut base = json!({"name": "a", "image": "busybox"});
        if let (Some(o), Value::Object(e)) = (base.as_object_mut(), extra) {
            o.extend(e);
        }
        base
    }

    fn ok(top: Value, containers: Vec<Value>) -> ParsedTaskDefinition {
        parse_task_definition(&doc(top, containers)).unwrap_or_else(|e| panic!("refused: {e}"))
    }

    fn refused(top: Value, containers: Vec<Value>) -> TaskDefError {
        match parse_task_definition(&doc(top, containers)) {
            Ok(p) => panic!("accepted: {:?}", p.definition),
            Err(e) => e.first().clone(),
        }
    }

    #[test]
    fn volumes_of_every_kind_parse_and_round_trip() {
        let p = ok(
            json!({"volumes": [
                {"name": "data", "host": {"sourcePath": "/srv/data"}},
                {"name": "scratch", "host": {}},
                {"name": "cache", "dockerVolumeConfiguration": {"scope": "shared", "autoprovision": true,
                    "driver": "local", "driverOpts": {"type": "tmpfs", "device": "tmpfs"}, "labels": {"k": "v"}}},
                {"name": "efs", "efsVolumeConfiguration": {"fileSystemId": "fs-1"}},
                {"name": "empty"}
            ], "pidMode": "task", "ipcMode": "none"}),
            vec![c(json!({"mountPoints": [
                {"sourceVolume": "data", "containerPath": "/data", "readOnly": true},
                {"sourceVolume": "scratch", "containerPath": "/scratch"}
            ]}))],
        );
        let d = &p.definition;
        assert_eq!(d.volumes.len(), 5);
        assert_eq!(d.volumes[0].host.as_ref().unwrap().source_path.as_deref(), Some("/srv/data"));
        assert_eq!(d.volumes[1].host.as_ref().unwrap().source_path, None);
        let dv = d.volumes[2].docker_volume_configuration.as_ref().unwrap();
        assert_eq!(
            (dv.scope.as_deref(), dv.autoprovision, dv.driver.as_deref()),
            (Some("shared"), Some(true), Some("local"))
        );
        assert!(d.volumes[3].aws_only.contains_key("efsVolumeConfiguration"));
        assert!(
            p.ignored_fields.contains(&"volumes[3].efsVolumeConfiguration".to_string()),
            "{:?}",
            p.ignored_fields
        );
        assert_eq!((d.pid_mode.as_deref(), d.ipc_mode.as_deref()), (Some("task"), Some("none")));
        assert!(d.container_definitions[0].mount_points[0].read_only);
        assert!(!d.container_definitions[0].mount_points[1].read_only);
        assert!(d.needs_container_runtime());
        // What describe shows registers again, unchanged.
        let again = parse_task_definition(&serde_json::to_vec(d).unwrap()).unwrap();
        assert_eq!(&again.definition, d);
    }

    #[test]
    fn volume_errors_name_the_path_and_the_rule() {
        let cases: Vec<(Value, Vec<Value>, &str, &str)> = vec![
            (json!({"volumes": [{"name": "a b"}]}), vec![c(json!({}))], "volumes[0].name", "letters, digits"),
            (
                json!({"volumes": [{"name": "v"}, {"name": "v"}]}),
                vec![c(json!({}))],
                "volumes[1].name",
                "duplicate",
            ),
            (
                json!({"volumes": [{"name": "v", "host": {"sourcePath": "rel"}}]}),
                vec![c(json!({}))],
                "volumes[0].host.sourcePath",
                "absolute",
            ),
            (
                json!({"volumes": [{"name": "v", "host": {}, "dockerVolumeConfiguration": {}}]}),
                vec![c(json!({}))],
                "volumes[0]",
                "at most one",
            ),
            (
                json!({"volumes": [{"name": "v", "dockerVolumeConfiguration": {"scope": "global"}}]}),
                vec![c(json!({}))],
                "volumes[0].dockerVolumeConfiguration.scope",
                "task or shared",
            ),
            (
                json!({"volumes": [{"name": "v", "dockerVolumeConfiguration": {"autoprovision": true}}]}),
                vec![c(json!({}))],
                "volumes[0].dockerVolumeConfiguration.autoprovision",
                "shared",
            ),
            (
                json!({"volumes": (0..65).map(|i| json!({"name": format!("v{i}")})).collect::<Vec<_>>()}),
                vec![c(json!({}))],
                "volumes",
                "at most 64",
            ),
            (json!({"pidMode": "container"}), vec![c(json!({}))], "pidMode", "host or task"),
            (json!({"ipcMode": "shareable"}), vec![c(json!({}))], "ipcMode", "host, task or none"),
            (
                json!({}),
                vec![c(json!({"mountPoints": [{"sourceVolume": "nope", "containerPath": "/x"}]}))],
                "containerDefinitions[0].mountPoints[0].sourceVolume",
                "it has none",
            ),
            (
                json!({"volumes": [{"name": "v"}]}),
                vec![c(json!({"mountPoints": [{"sourceVolume": "v", "containerPath": "x"}]}))],
                "containerDefinitions[0].mountPoints[0].containerPath",
                "absolute",
            ),
            (
                json!({"volumes": [{"name": "v"}]}),
                vec![c(
                    json!({"mountPoints": [{"sourceVolume": "v", "containerPath": "/x"}, {"sourceVolume": "v", "containerPath": "/x"}]}),
                )],
                "containerDefinitions[0].mountPoints[1].containerPath",
                "duplicate",
            ),
            (
                json!({}),
                vec![c(json!({"volumesFrom": [{"sourceContainer": "a"}]}))],
                "containerDefinitions[0].volumesFrom[0].sourceContainer",
                "another container",
            ),
            (
                json!({}),
                vec![c(json!({"volumesFrom": [{"sourceContainer": "zz"}]}))],
                "containerDefinitions[0].volumesFrom[0].sourceContainer",
                "a container of the task",
            ),
        ];
        for (top, cs, field, words) in cases {
            let e = refused(top, cs);
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(words), "{e}");
        }
    }

    #[test]
    fn linux_options_parse_and_round_trip() {
        let p = ok(
            json!({}),
            vec![c(json!({
                "linuxParameters": {
                    "capabilities": {"add": ["SYS_PTRACE", "cap_net_admin"], "drop": ["ALL"]},
                    "devices": [{"hostPath": "/dev/fuse", "containerPath": "/dev/fuse", "permissions": ["read", "write"]}],
                    "initProcessEnabled": true, "sharedMemorySize": 256,
                    "tmpfs": [{"containerPath": "/run", "size": 64, "mountOptions": ["noexec", "mode=1777"]}],
                    "maxSwap": 0, "swappiness": 10
                },
                "ulimits": [{"name": "nofile", "softLimit": 1024, "hardLimit": 4096}, {"name": "core", "softLimit": -1, "hardLimit": -1}],
                "systemControls": [{"namespace": "net.core.somaxconn", "value": "1024"}],
                "privileged": false, "readonlyRootFilesystem": true,
                "dnsServers": ["10.0.0.2", "::1"], "dnsSearchDomains": ["example.com"],
                "extraHosts": [{"hostname": "db.local", "ipAddress": "10.1.2.3"}],
                "hostname": "worker-1"
            }))],
        );
        let d = &p.definition;
        let x = &d.container_definitions[0];
        let lp = x.linux_parameters.as_ref().unwrap();
        assert_eq!(lp.capabilities.as_ref().unwrap().add, vec!["SYS_PTRACE", "cap_net_admin"]);
        assert_eq!((lp.shared_memory_size, lp.max_swap, lp.swappiness), (Some(256), Some(0), Some(10)));
        assert_eq!(lp.tmpfs[0].size, 64);
        assert_eq!(x.ulimits[1].soft_limit, -1);
        assert_eq!(x.hostname.as_deref(), Some("worker-1"));
        assert!(p.ignored_fields.is_empty(), "{:?}", p.ignored_fields);
        let again = parse_task_definition(&serde_json::to_vec(d).unwrap()).unwrap();
        assert_eq!(&again.definition, d);
    }

    #[test]
    fn linux_option_errors_name_the_path_and_the_rule() {
        let at = "containerDefinitions[0]";
        let cases: Vec<(Value, String, &str)> = vec![
            (
                json!({"linuxParameters": {"capabilities": {"add": ["FLY"]}}}),
                format!("{at}.linuxParameters.capabilities.add[0]"),
                "Linux capability",
            ),
            (
                json!({"linuxParameters": {"swappiness": 101}}),
                format!("{at}.linuxParameters.swappiness"),
                "0 to 100",
            ),
            (
                json!({"linuxParameters": {"sharedMemorySize": 0}}),
                format!("{at}.linuxParameters.sharedMemorySize"),
                "MiB",
            ),
            (
                json!({"linuxParameters": {"tmpfs": [{"containerPath": "/t", "size": 1, "mountOptions": ["exec,dev"]}]}}),
                format!("{at}.linuxParameters.tmpfs[0].mountOptions[0]"),
                "tmpfs mount options",
            ),
            (
                json!({"linuxParameters": {"tmpfs": [{"containerPath": "/t"}]}}),
                format!("{at}.linuxParameters.tmpfs[0].size"),
                "required",
            ),
            (
                json!({"linuxParameters": {"devices": [{"hostPath": "/dev/x", "permissions": ["read", "read"]}]}}),
                format!("{at}.linuxParameters.devices[0].permissions"),
                "twice",
            ),
            (
                json!({"linuxParameters": {"devices": [{"hostPath": "/dev/x", "permissions": ["all"]}]}}),
                format!("{at}.linuxParameters.devices[0].permissions[0]"),
                "read, write or mknod",
            ),
            (json!({"linuxParameters": {"bogus": 1}}), format!("{at}.linuxParameters.bogus"), "unknown"),
            (
                json!({"ulimits": [{"name": "files", "softLimit": 1, "hardLimit": 1}]}),
                format!("{at}.ulimits[0].name"),
                "nofile",
            ),
            (
                json!({"ulimits": [{"name": "nofile", "softLimit": 9, "hardLimit": 1}]}),
                format!("{at}.ulimits[0].softLimit"),
                "at most hardLimit",
            ),
            (
                json!({"ulimits": [{"name": "nofile", "softLimit": 1, "hardLimit": 1}, {"name": "nofile", "softLimit": 1, "hardLimit": 1}]}),
                format!("{at}.ulimits[1].name"),
                "duplicate",
            ),
            (
                json!({"systemControls": [{"namespace": "net core", "value": "1"}]}),
                format!("{at}.systemControls[0].namespace"),
                "kernel parameter",
            ),
            (json!({"dnsServers": ["dns.example"]}), format!("{at}.dnsServers[0]"), "IPv4 or IPv6"),
            (
                json!({"dnsServers": (0..17).map(|i| format!("10.0.0.{i}")).collect::<Vec<_>>()}),
                format!("{at}.dnsServers"),
                "at most 16",
            ),
            (
                json!({"extraHosts": [{"hostname": "h", "ipAddress": "x"}]}),
                format!("{at}.extraHosts[0].ipAddress"),
                "IPv4 or IPv6",
            ),
            (json!({"hostname": "a".repeat(65)}), format!("{at}.hostname"), "1 to 64"),
            (json!({"privileged": "yes"}), format!("{at}.privileged"), "true or false"),
        ];
        for (extra, field, words) in cases {
            let e = refused(json!({}), vec![c(extra)]);
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(words), "{e}");
        }
    }
}
