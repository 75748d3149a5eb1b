//! A container's `secrets`, `logConfiguration` and `repositoryCredentials`: the names of
//! stored secrets it uses, and its log driver. Every list and string is bounded; every error
//! names the JSON path and the rule. Whether the named secrets exist is checked when a task is
//! run, not here: a definition may be registered before its secrets are stored, and a name is
//! any string, as ECS takes it.

use super::{as_array, as_object, as_str, check_keys, each, err, join, quote, require};
use super::{Result, MAX_ENV_NAME_BYTES};
use mpsfleet_types::secret::MAX_SECRET_NAME_CHARS;
use mpsfleet_types::{KeyValuePair, LogConfiguration, RepositoryCredentials, SecretRef};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// The most `secrets` of one container.
pub const MAX_CONTAINER_SECRETS: usize = 256;
/// The most bytes of a log driver's name.
pub const MAX_LOG_DRIVER_BYTES: usize = 255;
/// The most `options` of a log configuration, and the most `secretOptions`.
pub const MAX_LOG_OPTIONS: usize = 64;
/// The most bytes of a log option's key, and of its value.
pub const MAX_LOG_OPTION_KEY_BYTES: usize = 255;
pub const MAX_LOG_OPTION_VALUE_BYTES: usize = 4096;

/// A `valueFrom` (or `credentialsParameter`): any string of 1 to [`MAX_SECRET_NAME_CHARS`]
/// characters. ECS takes any string there at registration and fails the task at launch when it
/// names nothing it can read; so does mpsfleet: the name is looked up, as an opaque key, when a
/// task is run and again when its container starts.
fn check_value_from(v: &str, path: &str) -> Result<()> {
    let chars = v.chars().count();
    if chars == 0 || chars > MAX_SECRET_NAME_CHARS {
        return Err(err(
            path,
            format!(
                "must be 1 to {MAX_SECRET_NAME_CHARS} characters (the name of a stored secret), got {chars}"
            ),
        ));
    }
    Ok(())
}

/// `secrets[]`: `{name, valueFrom}`, names unique and not set by `environment` too.
pub(super) fn parse_secrets(
    value: &Value,
    path: &str,
    environment: &[KeyValuePair],
) -> Result<Vec<SecretRef>> {
    let list = as_array(value, path)?;
    if list.len() > MAX_CONTAINER_SECRETS {
        return Err(err(
            path,
            format!("must have at most {MAX_CONTAINER_SECRETS} secrets, got {}", list.len()),
        ));
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    each(list, path, |j, entry, at| {
        let obj = as_object(entry, &at)?;
        check_keys(obj, &at, &["name", "valueFrom"], &[], &mut Vec::new())?;
        let name_path = join(&at, "name");
        let name = as_str(require(obj, &at, "name")?, &name_path)?;
        if name.is_empty() || name.len() > MAX_ENV_NAME_BYTES {
            return Err(err(
                name_path,
                format!(
                    "must be 1 to {MAX_ENV_NAME_BYTES} bytes (an environment variable), got {} bytes",
                    name.len()
                ),
            ));
        }
        if name.contains('=') || name.contains('\0') {
            return Err(err(name_path, format!("must not contain '=' or NUL, got {}", quote(name))));
        }
        if let Some(first) = seen.insert(name, j) {
            return Err(err(
                name_path,
                format!("duplicate secret {}, already set by {path}[{first}]", quote(name)),
            ));
        }
        if let Some(k) = environment.iter().position(|e| e.name == name) {
            return Err(err(
                name_path,
                format!(
                    "{} is also set by environment[{k}]: a variable comes from one of the two",
                    quote(name)
                ),
            ));
        }
        let from_path = join(&at, "valueFrom");
        let from = as_str(require(obj, &at, "valueFrom")?, &from_path)?;
        check_value_from(from, &from_path)?;
        Ok(SecretRef { name: name.to_string(), value_from: from.to_string() })
    })
}

/// `logConfiguration`: `logDriver`, `options` and `secretOptions`.
pub(super) fn parse_log_configuration(value: &Value, path: &str) -> Result<LogConfiguration> {
    let obj = as_object(value, path)?;
    check_keys(obj, path, &["logDriver", "options", "secretOptions"], &[], &mut Vec::new())?;
    let driver_path = join(path, "logDriver");
    let driver = as_str(require(obj, path, "logDriver")?, &driver_path)?;
    let driver_ok = |c: char| c.is_ascii_alphanumeric() || "_.:/-".contains(c);
    if driver.is_empty() || driver.len() > MAX_LOG_DRIVER_BYTES || !driver.chars().all(driver_ok) {
        return Err(err(
            driver_path,
            format!(
                "must be 1 to {MAX_LOG_DRIVER_BYTES} ASCII letters, digits and _.:/- (a Docker log driver), got {}",
                quote(driver)
            ),
        ));
    }
    let mut options = BTreeMap::new();
    if let Some(v) = obj.get("options") {
        let opts_path = join(path, "options");
        let map = as_object(v, &opts_path)?;
        if map.len() > MAX_LOG_OPTIONS {
            return Err(err(
                opts_path,
                format!("must have at most {MAX_LOG_OPTIONS} options, got {}", map.len()),
            ));
        }
        for (k, v) in map {
            let at = join(&opts_path, k);
            check_option_key(k, &at)?;
            let v = as_str(v, &at)?;
            if v.len() > MAX_LOG_OPTION_VALUE_BYTES || v.contains('\0') {
                return Err(err(
                    at,
                    format!(
                        "must be at most {MAX_LOG_OPTION_VALUE_BYTES} bytes without NUL, got {} bytes",
                        v.len()
                    ),
                ));
            }
            options.insert(k.clone(), v.to_string());
        }
    }
    let mut secret_options = Vec::new();
    if let Some(v) = obj.get("secretOptions") {
        let so_path = join(path, "secretOptions");
        let list = as_array(v, &so_path)?;
        if list.len() > MAX_LOG_OPTIONS {
            return Err(err(
                so_path,
                format!("must have at most {MAX_LOG_OPTIONS} secret options, got {}", list.len()),
            ));
        }
        for (j, entry) in list.iter().enumerate() {
            let at = format!("{so_path}[{j}]");
            let o = as_object(entry, &at)?;
            check_keys(o, &at, &["name", "valueFrom"], &[], &mut Vec::new())?;
            let name_path = join(&at, "name");
            let name = as_str(require(o, &at, "name")?, &name_path)?;
            check_option_key(name, &name_path)?;
            if options.contains_key(name) || secret_options.iter().any(|s: &SecretRef| s.name == name) {
                return Err(err(name_path, format!("the option {} is set twice", quote(name))));
            }
            let from_path = join(&at, "valueFrom");
            let from = as_str(require(o, &at, "valueFrom")?, &from_path)?;
            check_value_from(from, &from_path)?;
            secret_options.push(SecretRef { name: name.to_string(), value_from: from.to_string() });
        }
    }
    Ok(LogConfiguration { log_driver: driver.to_string(), options, secret_options })
}

fn check_option_key(k: &str, path: &str) -> Result<()> {
    if k.is_empty() || k.len() > MAX_LOG_OPTION_KEY_BYTES || k.contains('\0') || k.contains('=') {
        return Err(err(
            path,
            format!(
                "a log option's name must be 1 to {MAX_LOG_OPTION_KEY_BYTES} bytes without '=' or NUL, got {}",
                quote(k)
            ),
        ));
    }
    Ok(())
}

/// `repositoryCredentials`: `credentialsParameter`, the stored secret holding
/// `{"username": …, "password": …}`.
pub(super) fn parse_repository_credentials(value: &Value, path: &str) -> Result<RepositoryCredentials> {
    let obj = as_object(value, path)?;
    check_keys(obj, path, &["credentialsParameter"], &[], &mut Vec::new())?;
    let p = join(path, "credentialsParameter");
    let name = as_str(require(obj, path, "credentialsParameter")?, &p)?;
    check_value_from(name, &p)?;
    Ok(RepositoryCredentials { credentials_parameter: name.to_string(), resolved: None })
}

#[cfg(test)]
mod tests {
    use crate::taskdef::parse_task_definition;
    use serde_json::json;

    fn parse(container: serde_json::Value) -> Result<mpsfleet_types::ContainerDefinition, String> {
        let mut c = json!({"name": "app", "image": "busybox"});
        c.as_object_mut().unwrap().extend(container.as_object().unwrap().clone());
        let doc = json!({"family": "f", "containerDefinitions": [c]});
        parse_task_definition(doc.to_string().as_bytes())
            .map(|p| {
                assert!(
                    !p.ignored_fields.iter().any(|f| f.contains("secrets")
                        || f.contains("logConfiguration")
                        || f.contains("repositoryCredentials")),
                    "{:?}",
                    p.ignored_fields
                );
                p.definition.container_definitions[0].clone()
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn secrets_log_configuration_and_credentials_are_read() {
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-pass-AbCdEf";
        let c = parse(json!({
            "secrets": [{"name": "DB_PASS", "valueFrom": arn},
                        {"name": "KEY", "valueFrom": "arn:aws:ssm:us-east-1:123456789012:parameter/app/key"}],
            "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": "/ecs/app"},
                                 "secretOptions": [{"name": "token", "valueFrom": "log-token"}]},
            "repositoryCredentials": {"credentialsParameter": "registry-creds"}
        }))
        .unwrap();
        assert_eq!(c.secrets.len(), 2);
        assert_eq!((c.secrets[0].name.as_str(), c.secrets[0].value_from.as_str()), ("DB_PASS", arn));
        let l = c.log_configuration.unwrap();
        assert_eq!(l.log_driver, "awslogs");
        assert_eq!(l.options["awslogs-group"], "/ecs/app");
        assert_eq!(l.secret_options[0].value_from, "log-token");
        assert_eq!(c.repository_credentials.unwrap().credentials_parameter, "registry-creds");
    }

    #[test]
    fn bad_values_name_their_path_and_rule() {
        let cases = [
            (
                json!({"secrets": [{"name": "A", "valueFrom": ""}]}),
                "containerDefinitions[0].secrets[0].valueFrom: must be 1 to 2048 characters",
            ),
            (json!({"secrets": [{"name": "A", "valueFrom": "x".repeat(2049)}]}), "got 2049"),
            (json!({"secrets": [{"name": "A", "valueFrom": 5}]}), "must be a string"),
            (
                json!({"logConfiguration": {"logDriver": "x", "secretOptions": [{"name": "k", "valueFrom": ""}]}}),
                "secretOptions[0].valueFrom: must be 1 to 2048",
            ),
            (
                json!({"repositoryCredentials": {"credentialsParameter": ""}}),
                "credentialsParameter: must be 1",
            ),
            (
                json!({"secrets": [{"name": "A", "valueFrom": "a"}, {"name": "A", "valueFrom": "b"}]}),
                "secrets[1].name",
            ),
            (
                json!({"secrets": [{"name": "A", "valueFrom": "a"}], "environment": [{"name": "A", "value": "x"}]}),
                "environment[0]",
            ),
            (json!({"secrets": [{"name": "A", "value": "a"}]}), "secrets[0].value: unknown field"),
            (json!({"secrets": vec![json!({"name": "A", "valueFrom": "a"}); 257]}), "at most 256"),
            (json!({"logConfiguration": {"options": {}}}), "logConfiguration.logDriver"),
            (json!({"logConfiguration": {"logDriver": "a b"}}), "Docker log driver"),
            (
                json!({"logConfiguration": {"logDriver": "json-file", "options": {"max-size": 5}}}),
                "options.max-size",
            ),
            (
                json!({"logConfiguration": {"logDriver": "x", "options": {"k": "v"}, "secretOptions": [{"name": "k", "valueFrom": "s"}]}}),
                "set twice",
            ),
            (json!({"repositoryCredentials": {}}), "repositoryCredentials.credentialsParameter"),
        ];
        for (container, want) in cases {
            let e = parse(container.clone()).unwrap_err();
            assert!(e.contains(want), "{container}: {e}");
        }
    }
}
