//! What a pool lets its tasks use beyond a container's own isolation (its [`TaskPolicy`]), and
//! the volumes its hosts can never give, and GPU demands larger than any host it has or its
//! provider launches: checked at `task run`, `service create` and when a service takes a new
//! definition, so that such a task is refused with the reason instead of waiting for a host
//! that will never run it.

use super::Error;
use mpsfleet_core::fit::{never_fits, Shape};
use mpsfleet_types::{Host, HostStatus, NetworkMode, Pool, PoolName, RuntimeKind, TaskDefinition};
use std::collections::BTreeSet;

impl super::read::Reader<'_> {
    /// [`check`] against the pool's policy and its hosts.
    /// And the task's GPU demand against the largest host the pool has or its provider
    /// launches (`mpsfleet_core::fit`).
    pub(super) fn check_task_policy(&self, pool: &PoolName, td: &TaskDefinition) -> Result<(), Error> {
        let Some(p) = self.state.pools().get(pool) else { return Ok(()) };
        let hosts = self.state.hosts().iter().map(|e| e.host()).filter(|h| &h.pool == pool);
        check(&p.value, td, hosts)?;
        match self.never_fits(pool, td) {
            None => Ok(()),
            Some(why) => Err(Error::NeverFits { field: "taskDefinition".into(), message: why }),
        }
    }

    /// Why `td` can never be placed in `pool`: its GPU demand against the largest host the
    /// pool has or its provider launches (`mpsfleet_core::fit`); None when some host could
    /// hold it, or there is nothing to judge by.
    pub fn never_fits(&self, pool: &PoolName, td: &TaskDefinition) -> Option<String> {
        let p = self.state.pools().get(pool)?;
        let mut shapes: Vec<Shape> = self
            .state
            .hosts()
            .iter()
            .map(|e| e.host())
            .filter(|h| &h.pool == pool && h.status != HostStatus::Deregistered)
            .map(|h| Shape { gpus: h.gpus.iter().map(|g| (g.memory_mib, g.max_mps_clients)).collect() })
            .collect();
        let shape = p.value.provider.as_ref().and_then(|pr| pr.host_shape);
        if let Some(s) = shape {
            shapes.push(Shape { gpus: vec![(s.gpu_memory_mib, s.max_mps_clients); s.gpus as usize] });
        }
        let why = never_fits(&td.gpu_demand(), &shapes)?;
        let of = if shape.is_some() { "its hosts and the hosts its provider launches" } else { "its hosts" };
        Some(format!("{} can never be placed in pool {pool}: {why} (judged by {of})", td.reference()))
    }
}

/// The volume driver every Docker engine has.
pub const LOCAL_DRIVER: &str = "local";

/// Refuses `td` in `pool` when it uses an option the pool's task policy does not allow, a
/// volume kind only AWS provides, or a Docker volume driver no Docker host of the pool has.
/// `hosts` are the pool's hosts (any state; deregistered ones are skipped).
pub fn check<'a>(
    pool: &Pool,
    td: &TaskDefinition,
    hosts: impl Iterator<Item = &'a Host>,
) -> Result<(), Error> {
    let p = &pool.task_policy;
    let name = pool.name.as_str();
    let refuse = |field: String, policy_field: &str, what: &str| {
        Error::invalid(
            field,
            format!(
                "{what} is not allowed: pool {name}'s taskPolicy.{policy_field} is false \
                 (pool update {name} --file with {{\"taskPolicy\": {{\"{policy_field}\": true}}}})"
            ),
        )
    };
    if td.network_mode == Some(NetworkMode::Host) && !p.allow_host_network {
        return Err(refuse("networkMode".into(), "allowHostNetwork", "networkMode host"));
    }
    if td.pid_mode.as_deref() == Some("host") && !p.allow_host_namespaces {
        return Err(refuse("pidMode".into(), "allowHostNamespaces", "pidMode host"));
    }
    if td.ipc_mode.as_deref() == Some("host") && !p.allow_host_namespaces {
        return Err(refuse("ipcMode".into(), "allowHostNamespaces", "ipcMode host"));
    }
    for (i, v) in td.volumes.iter().enumerate() {
        if v.host.as_ref().is_some_and(|h| h.source_path.is_some()) && !p.allow_host_paths {
            return Err(refuse(
                format!("volumes[{i}].host.sourcePath"),
                "allowHostPaths",
                "a host path volume",
            ));
        }
    }
    for (i, c) in td.container_definitions.iter().enumerate() {
        let at = |f: &str| format!("containerDefinitions[{i}].{f}");
        if c.privileged == Some(true) && !p.allow_privileged {
            return Err(refuse(at("privileged"), "allowPrivileged", "a privileged container"));
        }
        let lp = c.linux_parameters.as_ref();
        if lp.and_then(|l| l.capabilities.as_ref()).is_some_and(|caps| !caps.add.is_empty())
            && !p.allow_capabilities
        {
            return Err(refuse(
                at("linuxParameters.capabilities.add"),
                "allowCapabilities",
                "adding capabilities",
            ));
        }
        if !c.system_controls.is_empty() && !p.allow_capabilities {
            return Err(refuse(at("systemControls"), "allowCapabilities", "setting kernel parameters"));
        }
        if lp.is_some_and(|l| !l.devices.is_empty()) && !p.allow_devices {
            return Err(refuse(at("linuxParameters.devices"), "allowDevices", "host devices"));
        }
    }
    check_volumes(name, td, hosts)
}

fn check_volumes<'a>(
    pool: &str,
    td: &TaskDefinition,
    hosts: impl Iterator<Item = &'a Host>,
) -> Result<(), Error> {
    // Only volumes a container mounts matter: an unused one is never made.
    let used: BTreeSet<&str> = td
        .container_definitions
        .iter()
        .flat_map(|c| &c.mount_points)
        .map(|m| m.source_volume.as_str())
        .collect();
    let mut drivers: Option<BTreeSet<String>> = None;
    let mut hosts = Some(hosts);
    for (i, v) in td.volumes.iter().enumerate() {
        if !used.contains(v.name.as_str()) {
            continue;
        }
        if let Some(kind) = v.aws_only.keys().next() {
            return Err(Error::invalid(
                format!("volumes[{i}].{kind}"),
                format!(
                    "volume {} needs {kind}, which only AWS provides: a task mounting it could never \
                     start with its data (use a host path or a Docker volume instead)",
                    v.name
                ),
            ));
        }
        let Some(driver) = v.docker_volume_configuration.as_ref().and_then(|d| d.driver.as_deref()) else {
            continue;
        };
        if driver == LOCAL_DRIVER {
            continue;
        }
        let have = drivers.get_or_insert_with(|| {
            hosts
                .take()
                .into_iter()
                .flatten()
                .filter(|h| h.runtime == RuntimeKind::Docker && h.status != HostStatus::Deregistered)
                .flat_map(|h| h.plugins.volume.iter().cloned())
                .collect()
        });
        if !have.contains(driver) {
            let known = if have.is_empty() {
                LOCAL_DRIVER.to_string()
            } else {
                let mut all: BTreeSet<&str> = have.iter().map(String::as_str).collect();
                all.insert(LOCAL_DRIVER);
                all.into_iter().collect::<Vec<_>>().join(", ")
            };
            return Err(Error::invalid(
                format!("volumes[{i}].dockerVolumeConfiguration.driver"),
                format!(
                    "volume {} needs Docker volume driver {driver}, which no Docker host of pool {pool} \
                     has (they have {known}): a task mounting it could never start",
                    v.name
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::TaskPolicy;
    use serde_json::json;

    fn pool(policy: TaskPolicy) -> Pool {
        let mut p: Pool = serde_json::from_value(json!({
            "name": "gpu", "mode": "managed", "strategy": "binpack", "createdAtMs": 1
        }))
        .unwrap();
        p.task_policy = policy;
        p
    }

    fn td(v: serde_json::Value) -> TaskDefinition {
        let mut base = json!({"family": "f", "revision": 1, "containerDefinitions": [
            {"name": "a", "image": "busybox", "essential": true}
        ]});
        if let (Some(o), serde_json::Value::Object(e)) = (base.as_object_mut(), v) {
            o.extend(e);
        }
        serde_json::from_value(base).unwrap()
    }

    fn container(extra: serde_json::Value) -> serde_json::Value {
        let mut c = json!({"name": "a", "image": "busybox", "essential": true});
        if let (Some(o), serde_json::Value::Object(e)) = (c.as_object_mut(), extra) {
            o.extend(e);
        }
        json!({"containerDefinitions": [c]})
    }

    fn field_of(e: Error) -> (String, String) {
        match e {
            Error::InvalidParameter { field, message } => (field, message),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn each_option_is_refused_by_its_policy_field_and_allowed_by_it() {
        type Case = (serde_json::Value, &'static str, &'static str, fn(&mut TaskPolicy));
        let cases: Vec<Case> = vec![
            (
                container(json!({"privileged": true})),
                "containerDefinitions[0].privileged",
                "allowPrivileged",
                |p| p.allow_privileged = true,
            ),
            (json!({"networkMode": "host"}), "networkMode", "allowHostNetwork", |p| {
                p.allow_host_network = true
            }),
            (json!({"pidMode": "host"}), "pidMode", "allowHostNamespaces", |p| {
                p.allow_host_namespaces = true
            }),
            (json!({"ipcMode": "host"}), "ipcMode", "allowHostNamespaces", |p| {
                p.allow_host_namespaces = true
            }),
            (
                json!({"volumes": [{"name": "v", "host": {"sourcePath": "/srv"}}]}),
                "volumes[0].host.sourcePath",
                "allowHostPaths",
                |p| p.allow_host_paths = true,
            ),
            (
                container(json!({"linuxParameters": {"capabilities": {"add": ["SYS_ADMIN"]}}})),
                "containerDefinitions[0].linuxParameters.capabilities.add",
                "allowCapabilities",
                |p| p.allow_capabilities = true,
            ),
            (
                container(json!({"systemControls": [{"namespace": "net.core.somaxconn", "value": "1"}]})),
                "containerDefinitions[0].systemControls",
                "allowCapabilities",
                |p| p.allow_capabilities = true,
            ),
            (
                container(json!({"linuxParameters": {"devices": [{"hostPath": "/dev/fuse"}]}})),
                "containerDefinitions[0].linuxParameters.devices",
                "allowDevices",
                |p| p.allow_devices = true,
            ),
        ];
        for (doc, field, policy_field, allow) in cases {
            let d = td(doc);
            let (f, m) = field_of(check(&pool(TaskPolicy::default()), &d, std::iter::empty()).unwrap_err());
            assert_eq!(f, field);
            assert!(m.contains(&format!("pool gpu's taskPolicy.{policy_field} is false")), "{m}");
            assert!(
                m.contains(&format!(
                    "pool update gpu --file with {{\"taskPolicy\": {{\"{policy_field}\": true}}}}"
                )),
                "{m}"
            );
            let mut p = TaskPolicy::default();
            allow(&mut p);
            check(&pool(p), &d, std::iter::empty()).unwrap();
            check(&pool(TaskPolicy::permissive()), &d, std::iter::empty()).unwrap();
        }
        // Dropping capabilities, a task volume, privileged false: nothing to allow.
        let d =
            td(json!({"volumes": [{"name": "v", "host": {}}], "pidMode": "task", "containerDefinitions": [
                {"name": "a", "image": "busybox", "essential": true, "privileged": false,
                 "linuxParameters": {"capabilities": {"drop": ["ALL"]}},
                 "mountPoints": [{"sourceVolume": "v", "containerPath": "/v"}]}
            ]}));
        check(&pool(TaskPolicy::default()), &d, std::iter::empty()).unwrap();
    }

    fn host(runtime: &str, volume: &[&str], status: &str) -> Host {
        serde_json::from_value(json!({
            "id": "h-1", "pool": "gpu", "hostname": "x", "status": status, "healthStatus": "OK",
            "cordoned": false, "gpus": [], "mpsAvailable": false, "emulated": true, "runtime": runtime,
            "plugins": {"volume": volume}, "seq": 0, "registeredAtMs": 1, "credentialSha256": ""
        }))
        .unwrap()
    }

    #[test]
    fn aws_only_volumes_and_missing_drivers_are_refused_when_mounted() {
        let mounted = |vol: serde_json::Value| {
            td(json!({"volumes": [vol], "containerDefinitions": [
                {"name": "a", "image": "busybox", "essential": true,
                 "mountPoints": [{"sourceVolume": "v", "containerPath": "/v"}]}
            ]}))
        };
        let p = pool(TaskPolicy::permissive());
        let efs = mounted(json!({"name": "v", "efsVolumeConfiguration": {"fileSystemId": "fs-1"}}));
        let (f, m) = field_of(check(&p, &efs, std::iter::empty()).unwrap_err());
        assert_eq!(f, "volumes[0].efsVolumeConfiguration");
        assert!(m.contains("only AWS provides") && m.contains("could never"), "{m}");
        // Not mounted: never made, not refused.
        let mut unmounted = efs.clone();
        unmounted.container_definitions[0].mount_points.clear();
        check(&p, &unmounted, std::iter::empty()).unwrap();

        let rexray = mounted(json!({"name": "v", "dockerVolumeConfiguration": {"driver": "rexray/ebs"}}));
        let hosts = [host("docker", &["local"], "ACTIVE"), host("process", &["rexray/ebs"], "ACTIVE")];
        let (f, m) = field_of(check(&p, &rexray, hosts.iter()).unwrap_err());
        assert_eq!(f, "volumes[0].dockerVolumeConfiguration.driver");
        assert!(m.contains("no Docker host of pool gpu has (they have local)"), "{m}");
        let gone = [host("docker", &["rexray/ebs"], "DEREGISTERED")];
        assert!(check(&p, &rexray, gone.iter()).is_err());
        let hosts = [host("docker", &["local", "rexray/ebs"], "ACTIVE")];
        check(&p, &rexray, hosts.iter()).unwrap();
        let local = mounted(json!({"name": "v", "dockerVolumeConfiguration": {"driver": "local"}}));
        check(&p, &local, std::iter::empty()).unwrap();
    }
}
