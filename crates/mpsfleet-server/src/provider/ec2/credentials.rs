//! Where the provider's AWS credentials come from: the environment, the shared credentials
//! and config files, then the instance's role through IMDSv2.

use super::*;

/// Where the provider reads `AWS_*` variables and `HOME`: the server's environment, read at
/// each call, or a fixed set (tests, and callers that want to name exactly what is used).
#[derive(Clone, Default)]
pub struct AwsEnv {
    fixed: Option<BTreeMap<String, String>>,
}

impl AwsEnv {
    /// The process's environment, read at each call.
    pub fn process() -> Self {
        AwsEnv { fixed: None }
    }

    /// Exactly these variables, whatever the process's environment holds.
    pub fn fixed<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        AwsEnv { fixed: Some(vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect()) }
    }

    /// A variable's value; unset and empty are the same.
    pub(super) fn var(&self, name: &str) -> Option<String> {
        match &self.fixed {
            None => std::env::var(name).ok(),
            Some(vars) => vars.get(name).cloned(),
        }
        .filter(|v| !v.is_empty())
    }
}

impl fmt::Debug for AwsEnv {
    /// Names only: values may be secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.fixed {
            None => f.write_str("AwsEnv(process)"),
            Some(vars) => f.debug_tuple("AwsEnv").field(&vars.keys().collect::<Vec<_>>()).finish(),
        }
    }
}

/// A set of AWS credentials. Debug shows the key id only.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Credentials {
    pub(super) access_key_id: String,
    pub(super) secret_access_key: String,
    pub(super) session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

/// Instance-role credentials and when to fetch them again.
pub(super) struct CachedRole {
    pub(super) endpoint: String,
    pub(super) credentials: Credentials,
    pub(super) refresh_at_ms: u64,
}

impl Ec2Provider {
    /// Credentials from, in order: the environment (unless the configuration names a
    /// `profile`), the shared credentials and config files, the instance's role.
    pub(super) fn credentials(&self) -> Result<Credentials, Failure> {
        let mut tried = Vec::new();
        let refuse =
            |tried: Vec<String>, transient| Err(Failure::Credentials { tried: tried.join("; "), transient });
        // 1. The environment; skipped when the configuration names a profile, which is then
        // what the operator chose (as the AWS SDKs do with an explicit profile).
        if self.config.profile.is_some() {
            tried.push("environment: skipped, the provider's configuration names a profile".into());
        } else {
            match (self.env.var("AWS_ACCESS_KEY_ID"), self.env.var("AWS_SECRET_ACCESS_KEY")) {
                (Some(access_key_id), Some(secret_access_key)) => {
                    let session_token = self.env.var("AWS_SESSION_TOKEN");
                    return Ok(Credentials { access_key_id, secret_access_key, session_token });
                }
                (Some(_), None) | (None, Some(_)) => {
                    tried.push(
                        "environment: only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set".into(),
                    );
                    return refuse(tried, false);
                }
                (None, None) => {
                    tried.push("environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set".into())
                }
            }
        }
        // 2. The shared files.
        match self.profile_credentials() {
            Ok(Some(c)) => return Ok(c),
            Ok(None) if self.config.profile.is_some() || self.env.var("AWS_PROFILE").is_some() => {
                // A profile that was asked for by name and is not there is an error, not a
                // reason to use another identity.
                tried.push(self.missing_profile());
                return refuse(tried, false);
            }
            Ok(None) => tried.push(self.missing_profile()),
            Err(problem) => {
                tried.push(problem);
                return refuse(tried, false);
            }
        }
        // 3. The instance's role.
        if self.env.var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            tried.push("instance role: not asked, AWS_EC2_METADATA_DISABLED is true".into());
            return refuse(tried, false);
        }
        let endpoint = self
            .env
            .var("AWS_EC2_METADATA_SERVICE_ENDPOINT")
            .unwrap_or_else(|| IMDS_DEFAULT_ENDPOINT.to_string())
            .trim_end_matches('/')
            .to_string();
        let now = self.now_ms();
        if let Some(cached) =
            self.role_cache().as_ref().filter(|c| c.endpoint == endpoint && now < c.refresh_at_ms)
        {
            return Ok(cached.credentials.clone());
        }
        match self.instance_role(&endpoint) {
            Ok((credentials, expires_ms)) => {
                if let Some(expires) = expires_ms {
                    *self.role_cache() = Some(CachedRole {
                        endpoint,
                        credentials: credentials.clone(),
                        refresh_at_ms: expires.saturating_sub(IMDS_REFRESH_BEFORE_MS),
                    });
                }
                Ok(credentials)
            }
            Err((problem, transient)) => {
                tried.push(format!("instance role ({endpoint}): {problem}"));
                refuse(tried, transient)
            }
        }
    }

    pub(super) fn role_cache(&self) -> std::sync::MutexGuard<'_, Option<CachedRole>> {
        self.role.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The profile asked for: the configuration's, `AWS_PROFILE`, or `default`.
    pub(super) fn profile_name(&self) -> String {
        self.config
            .profile
            .clone()
            .or_else(|| self.env.var("AWS_PROFILE"))
            .unwrap_or_else(|| "default".into())
    }

    /// The shared credentials and config files, when a path is known for them.
    pub(super) fn shared_files(&self) -> (Option<PathBuf>, Option<PathBuf>) {
        let home = self.env.var("HOME").map(PathBuf::from);
        let file = |var: &str, name: &str| {
            self.env.var(var).map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
        };
        (file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), file("AWS_CONFIG_FILE", "config"))
    }

    pub(super) fn missing_profile(&self) -> String {
        let (creds, config) = self.shared_files();
        let shown = |p: Option<PathBuf>| p.map_or("(no HOME)".to_string(), |p| p.display().to_string());
        format!(
            "shared files: no keys for profile {:?} in {} or {}",
            self.profile_name(),
            shown(creds),
            shown(config)
        )
    }

    /// The profile's keys from the credentials file, else from the config file; `Ok(None)`
    /// when neither has the profile.
    pub(super) fn profile_credentials(&self) -> Result<Option<Credentials>, String> {
        let profile = self.profile_name();
        let (creds_file, config_file) = self.shared_files();
        let read = |path: &Option<PathBuf>| -> Result<Option<String>, String> {
            let Some(path) = path else { return Ok(None) };
            match std::fs::read_to_string(path) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("shared files: cannot read {}: {e}", path.display())),
            }
        };
        let config_section = if profile == "default" {
            vec!["default".to_string(), "profile default".into()]
        } else {
            vec![format!("profile {profile}")]
        };
        let sources = [
            (read(&creds_file)?, creds_file, vec![profile.clone()]),
            (read(&config_file)?, config_file, config_section),
        ];
        for (text, path, sections) in sources {
            let Some(text) = text else { continue };
            let Some(keys) = sections.iter().find_map(|s| ini_section(&text, s)) else { continue };
            let path = path.map(|p| p.display().to_string()).unwrap_or_default();
            let get = |k: &str| keys.get(k).filter(|v| !v.is_empty()).cloned();
            match (get("aws_access_key_id"), get("aws_secret_access_key")) {
                (Some(access_key_id), Some(secret_access_key)) => {
                    let session_token = get("aws_session_token");
                    return Ok(Some(Credentials { access_key_id, secret_access_key, session_token }));
                }
                (Some(_), None) | (None, Some(_)) => {
                    return Err(format!(
                        "shared files: profile {profile:?} in {path} has only one of aws_access_key_id and \
                         aws_secret_access_key"
                    ));
                }
                (None, None) => {
                    let other: Vec<&str> = [
                        "role_arn",
                        "credential_process",
                        "sso_session",
                        "sso_start_url",
                        "web_identity_token_file",
                    ]
                    .into_iter()
                    .filter(|k| keys.contains_key(*k))
                    .collect();
                    if !other.is_empty() {
                        return Err(format!(
                            "shared files: profile {profile:?} in {path} uses {}, which this provider does not \
                             support: give it keys, or use the environment or an instance role",
                            other.join(", ")
                        ));
                    }
                }
            }
        }
        Ok(None)
    }

    /// IMDSv2: a session token, the role's name, the role's credentials and when they expire.
    /// The error says whether it may pass (the service answered 5xx or 429).
    pub(super) fn instance_role(&self, endpoint: &str) -> Result<(Credentials, Option<u64>), (String, bool)> {
        let client = self.imds_client().map_err(|e| (e, false))?;
        let endpoint = endpoint.to_string();
        let fetched = self.block_on(async move {
            let text = |resp: reqwest::Response, what: &'static str| async move {
                let status = resp.status();
                if !status.is_success() {
                    let transient = status.is_server_error() || status.as_u16() == 429;
                    let hint = if status.as_u16() == 404 && what == "the role's name" {
                        " (no instance role is attached)"
                    } else {
                        ""
                    };
                    return Err((format!("{what}: HTTP {}{hint}", status.as_u16()), transient));
                }
                resp.text().await.map_err(|e| (format!("{what}: {}", error_chain(&e)), false))
            };
            let sent = |e: reqwest::Error, what: &str| (format!("{what}: {}", error_chain(&e)), false);
            let token = client
                .put(format!("{endpoint}/latest/api/token"))
                .header("X-aws-ec2-metadata-token-ttl-seconds", "21600")
                .send()
                .await
                .map_err(|e| sent(e, "the session token"))?;
            let token = text(token, "the session token").await?;
            let base = format!("{endpoint}/latest/meta-data/iam/security-credentials/");
            let roles = client
                .get(&base)
                .header("X-aws-ec2-metadata-token", token.trim())
                .send()
                .await
                .map_err(|e| sent(e, "the role's name"))?;
            let roles = text(roles, "the role's name").await?;
            let role = roles.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string();
            if role.is_empty() || role.contains(['/', '?', '#']) {
                return Err(("no instance role is attached".to_string(), false));
            }
            let creds = client
                .get(format!("{base}{role}"))
                .header("X-aws-ec2-metadata-token", token.trim())
                .send()
                .await
                .map_err(|e| sent(e, "the role's credentials"))?;
            text(creds, "the role's credentials").await
        });
        let body = fetched.map_err(|f| (f.summary(), false))??;
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct RoleCredentials {
            #[serde(default)]
            code: Option<String>,
            access_key_id: String,
            secret_access_key: String,
            #[serde(default)]
            token: Option<String>,
            #[serde(default)]
            expiration: Option<String>,
        }
        let parsed: RoleCredentials = serde_json::from_str(&body)
            .map_err(|e| (format!("the role's credentials are not the expected JSON: {e}"), false))?;
        if let Some(code) = parsed.code.filter(|c| c != "Success") {
            return Err((format!("the role's credentials were not given: {code}"), true));
        }
        let expires = parsed.expiration.as_deref().and_then(parse_utc_ms);
        let credentials = Credentials {
            access_key_id: parsed.access_key_id,
            secret_access_key: parsed.secret_access_key,
            session_token: parsed.token.filter(|t| !t.is_empty()),
        };
        Ok((credentials, expires))
    }
}

/// The keys of section `[name]` of an INI file (lowercase keys, trimmed values); None when the
/// file has no such section. Indented lines (nested settings) and comments are skipped.
pub(super) fn ini_section(text: &str, name: &str) -> Option<BTreeMap<String, String>> {
    let mut found: Option<BTreeMap<String, String>> = None;
    let mut current = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with(['#', ';']) {
            continue;
        }
        if let Some(header) = trimmed.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            current = header.split_whitespace().collect::<Vec<_>>().join(" ") == name;
            if current {
                found.get_or_insert_with(BTreeMap::new);
            }
            continue;
        }
        if !current || line.starts_with([' ', '\t']) {
            continue;
        }
        if let (Some(keys), Some((k, v))) = (found.as_mut(), trimmed.split_once('=')) {
            keys.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    found
}

/// Unix milliseconds of `YYYY-MM-DDTHH:MM:SS` (UTC; a fraction and `Z` may follow).
pub(super) fn parse_utc_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<u64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
        || hh > 23
        || mm > 59
        || ss > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), years from March.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let (era, yoe) = (y / 400, y % 400);
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000)
}
