//! The server's configuration file (`mpsfleet server --config FILE`): what the server runs on
//! its own host, which the API may choose among but never supply. Today that is the exec
//! capacity providers and the EC2 ones, by name (docs/providers.md):
//!
//! ```json
//! {"providers": {"ec2": {"launch": ["/usr/local/bin/gpu-hosts", "launch"],
//!                        "terminate": ["/usr/local/bin/gpu-hosts", "terminate"],
//!                        "describe": ["/usr/local/bin/gpu-hosts", "describe"],
//!                        "timeoutSeconds": 120, "passEnv": ["AWS_PROFILE"]}},
//!  "ec2Providers": {"gpu": {"region": "us-east-1",
//!                           "launchTemplate": {"name": "gpu-host", "version": "$Latest"}}}}
//! ```

use crate::provider::{Ec2Config, ExecConfig, DEFAULT_TIMEOUT};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The longest a provider command may be given to run.
pub const MAX_TIMEOUT_SECONDS: u64 = 3600;

/// The server's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerConfig {
    /// Exec providers by name.
    pub providers: BTreeMap<String, ExecConfig>,
    /// EC2 providers (`ec2Providers`) by name.
    pub ec2_providers: BTreeMap<String, Ec2Config>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    providers: BTreeMap<String, FileProvider>,
    /// Read as they are (the type refuses unknown fields), then checked with
    /// [`Ec2Config::validate`].
    #[serde(default)]
    ec2_providers: BTreeMap<String, Ec2Config>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileProvider {
    launch: Vec<String>,
    terminate: Vec<String>,
    describe: Vec<String>,
    #[serde(default)]
    timeout_seconds: Option<u64>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    pass_env: Vec<String>,
    #[serde(default)]
    dir: Option<PathBuf>,
}

/// Why a configuration file was refused; the message names the file and the field.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ServerConfig {
    /// Reads and checks `path`. The file names commands the server runs as its own user, so
    /// it must be a regular file that only its owner can write, owned by that user or root.
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        use std::os::unix::fs::MetadataExt;
        let refuse = |message: String| ConfigError { path: path.display().to_string(), message };
        let meta = std::fs::metadata(path).map_err(|e| refuse(format!("cannot read: {e}")))?;
        if !meta.is_file() {
            return Err(refuse("is not a regular file".into()));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(refuse(format!(
                "is writable by group or others (mode {:o}): it names commands this server runs; chmod go-w it",
                meta.mode() & 0o777
            )));
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me && meta.uid() != 0 {
            return Err(refuse(format!(
                "is owned by uid {}: it must belong to this server's user ({me}) or root",
                meta.uid()
            )));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(refuse(format!("is {} bytes, more than {MAX_CONFIG_BYTES}", meta.len())));
        }
        let text = std::fs::read(path).map_err(|e| refuse(format!("cannot read: {e}")))?;
        Self::parse(&text).map_err(|(field, message)| {
            refuse(if field.is_empty() { message } else { format!("{field}: {message}") })
        })
    }

    /// Parses and checks a configuration; the error is `(field, message)`.
    pub fn parse(text: &[u8]) -> Result<ServerConfig, (String, String)> {
        let file: FileConfig = serde_json::from_slice(text)
            .map_err(|e| (String::new(), format!("not a valid configuration: {e}")))?;
        let mut providers = BTreeMap::new();
        for (name, p) in file.providers {
            let field = format!("providers.{name}");
            if let Some(problem) = mpsfleet_types::policy::provider_name_problem(&name) {
                return Err((field, format!("the name {problem}")));
            }
            let timeout = match p.timeout_seconds {
                None => DEFAULT_TIMEOUT,
                Some(s) if (1..=MAX_TIMEOUT_SECONDS).contains(&s) => Duration::from_secs(s),
                Some(s) => {
                    return Err((
                        format!("{field}.timeoutSeconds"),
                        format!("must be from 1 to {MAX_TIMEOUT_SECONDS}, got {s}"),
                    ))
                }
            };
            let mut config = ExecConfig::new(p.launch, p.terminate, p.describe);
            config.timeout = timeout;
            config.env = p.env;
            config.pass_env = p.pass_env;
            config.dir = p.dir;
            config.validate().map_err(|e| (format!("{field}.{}", e.field), e.message))?;
            providers.insert(name, config);
        }
        let mut ec2_providers = BTreeMap::new();
        for (name, config) in file.ec2_providers {
            let field = format!("ec2Providers.{name}");
            if let Some(problem) = mpsfleet_types::policy::provider_name_problem(&name) {
                return Err((field, format!("the name {problem}")));
            }
            config.validate().map_err(|e| (format!("{field}.{}", e.field), e.message))?;
            ec2_providers.insert(name, config);
        }
        Ok(ServerConfig { providers, ec2_providers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn refused(text: &str, field: &str, message: &str) {
        let (f, m) = ServerConfig::parse(text.as_bytes()).unwrap_err();
        assert_eq!((f.as_str(), m.as_str()), (field, message), "{text}");
    }

    #[test]
    fn config_providers_are_read_with_their_settings() {
        let c = ServerConfig::parse(
            br#"{"providers": {"ec2": {"launch": ["/bin/l", "a"], "terminate": ["/bin/t"],
                "describe": ["/bin/d"], "timeoutSeconds": 5, "env": {"REGION": "x"}, "passEnv": ["AWS_PROFILE"]}}}"#,
        )
        .unwrap();
        let p = &c.providers["ec2"];
        assert_eq!(p.launch, ["/bin/l", "a"]);
        assert_eq!(p.timeout, Duration::from_secs(5));
        assert_eq!(p.env["REGION"], "x");
        assert_eq!(p.pass_env, ["AWS_PROFILE"]);
        assert_eq!(ServerConfig::parse(b"{}").unwrap(), ServerConfig::default());
    }

    #[test]
    fn config_errors_name_the_field() {
        refused(
            r#"{"providers": {"Bad": {"launch": ["l"], "terminate": ["t"], "describe": ["d"]}}}"#,
            "providers.Bad",
            "the name must be 1 to 64 characters of a-z, 0-9, '-', '_' and '.', got \"Bad\"",
        );
        refused(
            r#"{"providers": {"a": {"launch": [], "terminate": ["t"], "describe": ["d"]}}}"#,
            "providers.a.launch",
            "the command is empty",
        );
        refused(
            r#"{"providers": {"a": {"launch": ["l"], "terminate": ["t"], "describe": ["d"], "timeoutSeconds": 0}}}"#,
            "providers.a.timeoutSeconds",
            "must be from 1 to 3600, got 0",
        );
        let (field, message) = ServerConfig::parse(br#"{"provider": {}}"#).unwrap_err();
        assert_eq!(field, "");
        assert!(message.contains("unknown field `provider`"), "{message}");
    }

    #[test]
    fn config_ec2_providers_are_read_and_checked() {
        let c = ServerConfig::parse(
            br#"{"ec2Providers": {"gpu": {"region": "us-east-1", "instanceType": "g5.xlarge",
                "imageId": "ami-0abc", "subnetId": "subnet-1", "securityGroupIds": ["sg-1"],
                "keyName": "ops", "iamInstanceProfile": "mpsfleet-host", "profile": "fleet",
                "agentCommand": "/usr/local/bin/mpsfleet agent --data-dir /var/lib/mpsfleet",
                "tags": {"Team": "ml"}},
              "tmpl": {"region": "eu-west-1", "endpointUrl": "http://127.0.0.1:5000",
                "launchTemplate": {"name": "gpu-host", "version": "$Latest"}}}}"#,
        )
        .unwrap();
        assert!(c.providers.is_empty());
        let gpu = &c.ec2_providers["gpu"];
        assert_eq!(gpu.instance_type.as_deref(), Some("g5.xlarge"));
        assert_eq!(gpu.tags["Team"], "ml");
        assert_eq!(gpu.agent_command()[0], "/usr/local/bin/mpsfleet");
        let tmpl = &c.ec2_providers["tmpl"];
        assert_eq!(tmpl.launch_template.as_ref().and_then(|t| t.name.as_deref()), Some("gpu-host"));
        assert_eq!(tmpl.endpoint_url(), "http://127.0.0.1:5000");

        refused(
            r#"{"ec2Providers": {"gpu": {"region": "us-east-1", "imageId": "ami-1"}}}"#,
            "ec2Providers.gpu.instanceType",
            "required without launchTemplate",
        );
        refused(
            r#"{"ec2Providers": {"gpu": {"instanceType": "g5.xlarge", "imageId": "ami-1"}}}"#,
            "ec2Providers.gpu.region",
            "required (for example us-east-1)",
        );
        refused(
            r#"{"ec2Providers": {"GPU": {"region": "us-east-1", "launchTemplate": {"id": "lt-1"}}}}"#,
            "ec2Providers.GPU",
            "the name must be 1 to 64 characters of a-z, 0-9, '-', '_' and '.', got \"GPU\"",
        );
        refused(
            r#"{"ec2Providers": {"gpu": {"region": "us-east-1", "launchTemplate": {"id": "lt-1"},
                "endpointUrl": "http://10.0.0.1:5000"}}}"#,
            "ec2Providers.gpu.endpointUrl",
            "must be https://…, or http:// to 127.0.0.1 or localhost (for tests), got \"http://10.0.0.1:5000\"",
        );
        refused(
            r#"{"ec2Providers": {"gpu": {"region": "us-east-1", "launchTemplate": {"id": "lt-1"},
                "tags": {"aws:x": "y"}}}}"#,
            "ec2Providers.gpu.tags.aws:x",
            "keys starting with aws: or mpsfleet: are reserved",
        );
        let (field, message) = ServerConfig::parse(
            br#"{"ec2Providers": {"gpu": {"region": "us-east-1", "instancetype": "g5.xlarge"}}}"#,
        )
        .unwrap_err();
        assert_eq!(field, "");
        assert!(message.contains("unknown field `instancetype`"), "{message}");
    }

    #[test]
    fn config_file_writable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.json");
        std::fs::write(&path, "{}").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = ServerConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("writable by group or others (mode 666)"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(ServerConfig::load(&path).unwrap(), ServerConfig::default());
    }
}
