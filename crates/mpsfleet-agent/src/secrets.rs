//! A task's secrets, fetched from the server with the host's credential right before its
//! containers start (`GET /v1/agent/tasks/{id}/secrets`), and put where the launch reads them:
//! each `secrets[]` entry becomes an environment variable of its container, each log
//! `secretOptions[]` entry a log driver option, and `repositoryCredentials` the credentials
//! of that container's pull.
//!
//! The values live in the launch worker's copy of the definition only: the task's record (the
//! one written to disk and reported) never has them, and nothing here logs them.

use mpsfleet_client::{Client, ClientError};
use mpsfleet_types::secret::RegistryAuth;
use mpsfleet_types::{ContainerDefinition, KeyValuePair, StopCode, TaskId};
use std::time::Duration;

/// How long one fetch may take, and how many times a fetch the server did not answer is tried.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const FETCH_ATTEMPTS: u32 = 3;
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Whether the container names any stored secret.
pub fn needs_secrets(c: &ContainerDefinition) -> bool {
    !c.secrets.is_empty()
        || c.repository_credentials.is_some()
        || c.log_configuration.as_ref().is_some_and(|l| !l.secret_options.is_empty())
}

/// Fetches task `id`'s secrets and puts those of container `c` (the launch's copy) into it. A
/// container that names none is left as it is, without a call. Err is the task's stop code and
/// reason, as ECS gives them: `TaskFailedToStart` and `ResourceInitializationError: …`, naming
/// the field and the secret (a name is any string: it is quoted, never part of a path or url).
pub fn fetch_into(
    handle: &tokio::runtime::Handle,
    client: &Client,
    id: &TaskId,
    c: &mut ContainerDefinition,
) -> Result<(), (StopCode, String)> {
    if !needs_secrets(c) {
        return Ok(());
    }
    // ECS's stop code and reason for a secret it cannot read at launch.
    let failed = |why: String| {
        (
            StopCode::TaskFailedToStart,
            format!("ResourceInitializationError: unable to pull secrets or registry auth: {why}"),
        )
    };
    let mut attempt = 0;
    let secrets = loop {
        attempt += 1;
        let result =
            handle.block_on(async { tokio::time::timeout(FETCH_TIMEOUT, client.task_secrets(id)).await });
        match result {
            Ok(Ok(s)) => break s,
            // The server will not hand them out (a secret deleted since the task was run, the
            // task moved): no retry changes that.
            Ok(Err(ClientError::Api { status, body })) if status < 500 => {
                return Err(failed(format!("{} ({})", body.message, body.code)))
            }
            Ok(Err(e)) if attempt >= FETCH_ATTEMPTS => return Err(failed(e.to_string())),
            Err(_) if attempt >= FETCH_ATTEMPTS => {
                return Err(failed(format!("the server did not answer within {FETCH_TIMEOUT:?}")))
            }
            _ => std::thread::sleep(RETRY_DELAY),
        }
    };
    let value = |name: &str| {
        secrets
            .values
            .get(name)
            .cloned()
            .ok_or_else(|| failed(format!("the server sent no value for {name:?}")))
    };
    for s in &c.secrets {
        let v = value(&s.value_from)?;
        c.environment.retain(|e| e.name != s.name);
        c.environment.push(KeyValuePair { name: s.name.clone(), value: v });
    }
    if let Some(l) = &mut c.log_configuration {
        for s in std::mem::take(&mut l.secret_options) {
            let v = value(&s.value_from)?;
            l.options.insert(s.name, v);
        }
    }
    if let Some(r) = &mut c.repository_credentials {
        let text = value(&r.credentials_parameter)?;
        let auth: RegistryAuth = serde_json::from_str(&text).map_err(|_| {
            failed(format!(
                "container {}: the secret {:?} (repositoryCredentials.credentialsParameter) must be \
                 {{\"username\": \"…\", \"password\": \"…\"}}",
                c.name, r.credentials_parameter
            ))
        })?;
        r.resolved = Some(auth);
    }
    Ok(())
}
