//! A container's `logConfiguration` on Docker: the driver passes through with its options when
//! the host's engine has it (`docker info`: `Plugins.Log`); otherwise the container gets the
//! default, the size-capped json-file log, and its report says so, so that the task still
//! runs and `task logs` still works.
//!
//! `awslogs` and `awsfirelens` always fall back: `awsfirelens` is ECS's own (a Fluent Bit
//! sidecar the ECS agent wires), not a Docker driver, and Docker's `awslogs` needs AWS
//! credentials that an mpsfleet host does not hold. A driver that fails when the container is
//! created or started (a `splunk` or `syslog` endpoint that cannot be reached) falls back too,
//! see [`super::DockerRuntime::launch`].
//!
//! `task logs` reads Docker's log API. For the drivers Docker reads back (`json-file`, `local`,
//! `journald`) that is the driver's own store; for the others (`syslog`, `fluentd`, `gelf`,
//! `splunk`…) Docker 20.10 and later keep a local copy ("dual logging", on unless the engine
//! sets `cache-disabled`), so `task logs` works for them too.

use super::spec::{LOG_MAX_FILE, LOG_MAX_SIZE};
use super::DockerLaunch;
use bollard::models::HostConfigLogConfig;
use std::collections::HashMap;

/// Drivers that never pass through, and why.
pub const NEVER_PASSED: &[(&str, &str)] = &[
    ("awsfirelens", "it is ECS's own (a FireLens sidecar), not a Docker log driver"),
    ("awslogs", "Docker's awslogs driver needs AWS credentials, which this host does not hold"),
];

/// The default log: json-file, at most `max-file` files of `max-size`.
pub fn default_log() -> HostConfigLogConfig {
    HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_string(), LOG_MAX_SIZE.to_string()),
            ("max-file".to_string(), LOG_MAX_FILE.to_string()),
        ])),
    }
}

/// The note on a container whose driver fell back to the default.
pub fn fallback_note(driver: &str, why: &str) -> String {
    format!("log driver {driver} is not available on this host ({why}): json-file used; task logs work")
}

/// The container's log configuration given the engine's log drivers, and the note when the
/// definition's driver was not used. `json-file` and `local` without a size option keep the
/// default caps, so that one container cannot fill the disk.
pub fn log_config(l: &DockerLaunch, engine_drivers: &[String]) -> (HostConfigLogConfig, Option<String>) {
    let Some(lc) = &l.container.log_configuration else {
        return (default_log(), None);
    };
    let driver = lc.log_driver.as_str();
    if let Some((_, why)) = NEVER_PASSED.iter().find(|(d, _)| *d == driver) {
        return (default_log(), Some(fallback_note(driver, why)));
    }
    if !engine_drivers.iter().any(|d| d == driver) {
        let why = format!("the engine's log drivers are {}", engine_drivers.join(", "));
        return (default_log(), Some(fallback_note(driver, &why)));
    }
    let mut options: HashMap<String, String> = lc.options.clone().into_iter().collect();
    if matches!(driver, "json-file" | "local") && !options.contains_key("max-size") {
        options.insert("max-size".into(), LOG_MAX_SIZE.into());
        options.entry("max-file".into()).or_insert_with(|| LOG_MAX_FILE.into());
    }
    (HostConfigLogConfig { typ: Some(driver.to_string()), config: Some(options) }, None)
}

/// Whether Docker's error is about the log driver (it failed to set the driver up).
pub fn is_log_driver_error(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("logging driver") || m.contains("log driver") || m.contains("log-opt") || m.contains("log opt")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::LogConfiguration;

    fn launch(driver: Option<&str>, options: &[(&str, &str)]) -> DockerLaunch {
        let json =
            serde_json::json!({"family": "f", "containerDefinitions": [{"name": "app", "image": "busybox"}]});
        let definition =
            mpsfleet_core::taskdef::parse_task_definition(json.to_string().as_bytes()).unwrap().definition;
        let mut l = DockerLaunch {
            task: mpsfleet_types::Task::new(
                mpsfleet_types::TaskId(1),
                definition.reference(),
                mpsfleet_types::PoolName::new("p").unwrap(),
                None,
                "t".into(),
                0,
            ),
            container: definition.container_definitions[0].clone(),
            definition,
            env: Vec::new(),
            mps_pipe_dir: None,
            gpus_emulated: false,
            stop_timeout: std::time::Duration::from_secs(30),
        };
        l.container.log_configuration = driver.map(|d| LogConfiguration {
            log_driver: d.into(),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            secret_options: Vec::new(),
        });
        l
    }

    fn drivers() -> Vec<String> {
        ["json-file", "local", "syslog", "awslogs"].map(String::from).to_vec()
    }

    #[test]
    fn drivers_the_engine_has_pass_through_and_others_fall_back() {
        let (c, note) = log_config(&launch(None, &[]), &drivers());
        assert_eq!((c, note), (default_log(), None));
        let (c, note) = log_config(&launch(Some("syslog"), &[("tag", "app")]), &drivers());
        assert_eq!(c.typ.as_deref(), Some("syslog"));
        assert_eq!(c.config.unwrap()["tag"], "app");
        assert_eq!(note, None);
        let (c, _) = log_config(&launch(Some("local"), &[]), &drivers());
        assert_eq!(c.config.unwrap()["max-size"], LOG_MAX_SIZE);
        let (c, _) = log_config(&launch(Some("json-file"), &[("max-size", "1m")]), &drivers());
        assert_eq!(c.config.unwrap()["max-size"], "1m");
        for d in ["awslogs", "awsfirelens", "splunk"] {
            let (c, note) = log_config(&launch(Some(d), &[]), &drivers());
            assert_eq!(c, default_log(), "{d}");
            let note = note.unwrap();
            assert!(note.starts_with(&format!("log driver {d} is not available")), "{note}");
            assert!(note.ends_with("json-file used; task logs work"), "{note}");
        }
    }
}
