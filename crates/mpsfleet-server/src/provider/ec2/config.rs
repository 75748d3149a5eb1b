//! An `aws-ec2` provider's configuration (`ec2Providers.<name>`) and its checks.

use super::*;

/// An `aws-ec2` provider's configuration: `ec2Providers.<name>` in the server's configuration
/// file. Either `launchTemplate`, or `instanceType` and `imageId`; the other instance
/// settings are optional (with a launch template they override the template's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ec2Config {
    /// E.g. `us-east-1`; required.
    #[serde(default)]
    pub region: String,
    /// The EC2 endpoint; `https://ec2.<region>.amazonaws.com` when absent. `http://` only to
    /// 127.0.0.1, `[::1]` or localhost (tests against moto).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    #[serde(default)]
    pub launch_template: Option<LaunchTemplate>,
    #[serde(default)]
    pub instance_type: Option<String>,
    #[serde(default)]
    pub image_id: Option<String>,
    #[serde(default)]
    pub subnet_id: Option<String>,
    #[serde(default)]
    pub security_group_ids: Vec<String>,
    #[serde(default)]
    pub key_name: Option<String>,
    /// The instance profile's name (or its ARN, `arn:…`).
    #[serde(default)]
    pub iam_instance_profile: Option<String>,
    /// The agent's command on the image, words separated by spaces (each word is quoted in the
    /// user data; no shell syntax); `mpsfleet agent` when absent.
    #[serde(default)]
    pub agent_command: Option<String>,
    /// The profile of the shared credentials and config files to take credentials from.
    #[serde(default)]
    pub profile: Option<String>,
    /// Extra instance tags, at most [`MAX_EXTRA_TAGS`].
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// A launch template, by id or by name, and its version (`$Latest`, `$Default` or a number;
/// EC2's default version when absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchTemplate {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

/// Why an `aws-ec2` configuration was refused; `field` is relative to the provider's entry
/// (`instanceType`, `tags.Owner`).
#[derive(Debug, thiserror::Error)]
#[error("aws-ec2 provider: {field}: {message}")]
pub struct Ec2ConfigError {
    pub field: String,
    pub message: String,
}

impl Ec2Config {
    /// Checks the configuration once, at start-up; the error names the field.
    pub fn validate(&self) -> Result<(), Ec2ConfigError> {
        let err = |field: &str, message: String| Err(Ec2ConfigError { field: field.to_string(), message });
        if self.region.is_empty() {
            return err("region", "required (for example us-east-1)".into());
        }
        let region_ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        if self.region.len() > 32 || !self.region.chars().all(region_ok) {
            return err("region", format!("must be a region name such as us-east-1, got {:?}", self.region));
        }
        if let Some(url) = &self.endpoint_url {
            if let Err(message) = Endpoint::parse(url) {
                return err("endpointUrl", message);
            }
        }
        match &self.launch_template {
            Some(t) => {
                match (&t.id, &t.name) {
                    (Some(_), Some(_)) => return err("launchTemplate", "give id or name, not both".into()),
                    (None, None) => return err("launchTemplate", "needs id or name".into()),
                    (Some(id), None) => {
                        if !aws_id_ok(id, "lt-") {
                            return err(
                                "launchTemplate.id",
                                format!("must be an id such as lt-0abc…, got {id:?}"),
                            );
                        }
                    }
                    (None, Some(name)) => {
                        if let Some(problem) = word_problem(name, 128) {
                            return err("launchTemplate.name", problem);
                        }
                    }
                }
                if let Some(v) = &t.version {
                    let number = !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit());
                    if !(number || v == "$Latest" || v == "$Default") {
                        return err(
                            "launchTemplate.version",
                            format!("must be $Latest, $Default or a version number, got {v:?}"),
                        );
                    }
                }
            }
            None => {
                for (field, value) in [("instanceType", &self.instance_type), ("imageId", &self.image_id)] {
                    if value.is_none() {
                        return err(field, "required without launchTemplate".into());
                    }
                }
            }
        }
        if let Some(t) = &self.instance_type {
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-');
            if t.is_empty() || t.len() > 64 || !t.chars().all(ok) {
                return err("instanceType", format!("must be an instance type such as g5.xlarge, got {t:?}"));
            }
        }
        for (field, value, prefix) in
            [("imageId", &self.image_id, "ami-"), ("subnetId", &self.subnet_id, "subnet-")]
        {
            if let Some(v) = value.as_ref().filter(|v| !aws_id_ok(v, prefix)) {
                return err(field, format!("must be an id such as {prefix}0abc…, got {v:?}"));
            }
        }
        for (i, sg) in self.security_group_ids.iter().enumerate() {
            if !aws_id_ok(sg, "sg-") {
                return err(
                    &format!("securityGroupIds.{i}"),
                    format!("must be an id such as sg-0abc…, got {sg:?}"),
                );
            }
        }
        for (field, value) in [
            ("keyName", &self.key_name),
            ("iamInstanceProfile", &self.iam_instance_profile),
            ("profile", &self.profile),
        ] {
            if let Some(problem) = value.as_ref().and_then(|v| word_problem(v, 2048)) {
                return err(field, problem);
            }
        }
        if let Some(cmd) = &self.agent_command {
            if cmd.split_ascii_whitespace().next().is_none() {
                return err("agentCommand", "must not be empty".into());
            }
            if cmd.chars().any(|c| c.is_control() && !c.is_ascii_whitespace()) || cmd.contains(['\n', '\r']) {
                return err("agentCommand", "must be one line without control characters".into());
            }
        }
        if self.tags.len() > MAX_EXTRA_TAGS {
            return err("tags", format!("at most {MAX_EXTRA_TAGS}, got {}", self.tags.len()));
        }
        for (key, value) in &self.tags {
            let field = format!("tags.{key}");
            if key.is_empty() || key.chars().count() > 128 {
                return err(&field, "the key must be 1 to 128 characters".into());
            }
            if key.starts_with("aws:") || key.starts_with("mpsfleet:") {
                return err(&field, "keys starting with aws: or mpsfleet: are reserved".into());
            }
            if value.chars().count() > 256 {
                return err(&field, "the value must be at most 256 characters".into());
            }
            if key.chars().chain(value.chars()).any(char::is_control) {
                return err(&field, "must not contain control characters".into());
            }
        }
        Ok(())
    }

    /// The endpoint's URL: `endpointUrl`, or EC2's for the region.
    pub fn endpoint_url(&self) -> String {
        match &self.endpoint_url {
            Some(url) => url.clone(),
            None if self.region.starts_with("cn-") => format!("https://ec2.{}.amazonaws.com.cn", self.region),
            None => format!("https://ec2.{}.amazonaws.com", self.region),
        }
    }

    /// The words of the agent's command.
    pub fn agent_command(&self) -> Vec<String> {
        self.agent_command
            .as_deref()
            .unwrap_or(DEFAULT_AGENT_COMMAND)
            .split_ascii_whitespace()
            .map(str::to_string)
            .collect()
    }
}

/// `prefix` then 1 to 64 of `a-z`, `0-9`, `A-Z`.
fn aws_id_ok(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|rest| {
        !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

fn word_problem(value: &str, max: usize) -> Option<String> {
    if value.trim().is_empty() {
        Some("must not be empty".into())
    } else if value.len() > max {
        Some(format!("must be at most {max} bytes"))
    } else if value.chars().any(char::is_control) {
        Some("must not contain control characters".into())
    } else {
        None
    }
}
