//! Stored secrets: what the API takes and answers. A secret's value is only ever in
//! [`CreateSecret`] (operator to server) and [`TaskSecrets`] (server to the agent of the host a
//! task is placed on); neither prints it in its `Debug` output.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most characters of a secret's name: ECS's limit on a `valueFrom` ARN.
pub const MAX_SECRET_NAME_CHARS: usize = 2048;
/// The most bytes of a secret's value: Secrets Manager's limit.
pub const MAX_SECRET_VALUE_BYTES: usize = 64 * 1024;

/// Characters a secret's name may have besides ASCII letters and digits: those of Secrets
/// Manager names and SSM parameter names, and the `:` of an ARN.
pub const SECRET_NAME_PUNCTUATION: &str = "/_+=.@:-";

/// Why `name` cannot name a secret, if it cannot: 1 to [`MAX_SECRET_NAME_CHARS`] characters,
/// ASCII letters, digits and [`SECRET_NAME_PUNCTUATION`] (so an ARN such as
/// `arn:aws:secretsmanager:us-east-1:123456789012:secret:db-pass-AbCdEf` or
/// `arn:aws:ssm:us-east-1:123456789012:parameter/app/key` is a name, and so is `db-pass`).
pub fn check_secret_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must be 1 to 2048 characters, got \"\"".into());
    }
    if name.len() > MAX_SECRET_NAME_CHARS {
        return Err(format!("must be at most {MAX_SECRET_NAME_CHARS} characters, got {}", name.len()));
    }
    if let Some(c) =
        name.chars().find(|c| !c.is_ascii_alphanumeric() && !SECRET_NAME_PUNCTUATION.contains(*c))
    {
        return Err(format!(
            "may contain only ASCII letters, digits and {SECRET_NAME_PUNCTUATION} (an ARN or a plain name), \
             got {c:?}"
        ));
    }
    Ok(())
}

/// Why `value` cannot be a secret's value, if it cannot: at most [`MAX_SECRET_VALUE_BYTES`]
/// bytes, no NUL (it becomes an environment variable).
pub fn check_secret_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_SECRET_VALUE_BYTES {
        return Err(format!("must be at most {MAX_SECRET_VALUE_BYTES} bytes, got {} bytes", value.len()));
    }
    if value.contains('\0') {
        return Err("must not contain NUL characters (it becomes an environment variable)".into());
    }
    Ok(())
}

/// `POST /v1/secrets`.
#[derive(Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSecret {
    pub name: String,
    pub value: String,
}

impl std::fmt::Debug for CreateSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateSecret").field("name", &self.name).field("value", &"<redacted>").finish()
    }
}

/// A stored secret as the API lists it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretInfo {
    pub name: String,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Bytes of the value.
    pub size: usize,
}

/// `GET /v1/agent/tasks/{id}/secrets`: the values a task's definition names, by the `valueFrom`
/// (or `credentialsParameter`) that names them.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskSecrets {
    pub values: BTreeMap<String, String>,
}

impl std::fmt::Debug for TaskSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.values.keys()).finish()
    }
}

/// A private registry's credentials (`repositoryCredentials`), as Secrets Manager keeps them:
/// `{"username": …, "password": …}`. Held in memory by the agent for one pull; never
/// serialized (see [`crate::RepositoryCredentials::resolved`]), never in `Debug` output.
#[derive(Clone, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_arns_or_plain_names() {
        for ok in [
            "db-pass",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-pass-AbCdEf",
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:db:password::",
            "arn:aws:ssm:us-east-1:123456789012:parameter/app/key",
            "a_b+c=d.e@f",
        ] {
            assert_eq!(check_secret_name(ok), Ok(()), "{ok}");
        }
        assert!(check_secret_name("").unwrap_err().contains("1 to 2048"));
        assert!(check_secret_name(&"a".repeat(2049)).unwrap_err().contains("at most 2048"));
        assert!(check_secret_name("a b").unwrap_err().contains("' '"));
        assert!(check_secret_value(&"x".repeat(65_537)).unwrap_err().contains("65536"));
        assert!(check_secret_value("a\0b").unwrap_err().contains("NUL"));
    }

    #[test]
    fn debug_never_shows_a_value() {
        let c = CreateSecret { name: "n".into(), value: "hunter2".into() };
        assert!(!format!("{c:?}").contains("hunter2"));
        let t = TaskSecrets { values: [("n".to_string(), "hunter2".to_string())].into() };
        assert!(!format!("{t:?}").contains("hunter2") && format!("{t:?}").contains('n'));
    }
}
