//! The `aws-ec2` capacity provider: hosts are EC2 instances, launched, described and
//! terminated through EC2's Query API (form-encoded `POST`, XML answers, API version
//! 2016-11-15), signed with SigV4 by [`mpsfleet_core::sigv4`]. Instances are found by their
//! tags (`mpsfleet:pool`, `mpsfleet:host`), so the provider keeps no state of its own and a
//! restarted server finds its hosts again. The new instance's user data is a shell script that
//! runs `mpsfleet agent` with the launch's one-time token (docs/providers.md).
//!
//! Calls block: each runs its request on the current Tokio runtime
//! ([`tokio::runtime::Handle::block_on`], so call from a blocking thread such as
//! `spawn_blocking`'s) or, where there is none, on a current-thread runtime of its own. Every
//! request has a timeout.

mod api;
mod config;
mod credentials;
#[cfg(test)]
mod tests;
mod xml;

use super::{CapacityProvider, LaunchRequest, LaunchedHost, ProviderError, ProviderHostState, ProviderOp};
use api::{Endpoint, Query};
pub use config::{Ec2Config, Ec2ConfigError, LaunchTemplate};
pub use credentials::AwsEnv;
use credentials::CachedRole;
use mpsfleet_core::clock::{Clock, SystemClock};
use mpsfleet_core::sigv4;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
pub use xml::{parse_error, parse_instances, parse_xml, Ec2Instance, XmlElement};

/// The EC2 API version every call names.
pub const API_VERSION: &str = "2016-11-15";
/// How long one EC2 request may take, connection and answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The instance metadata service answers at once or not at all (not on EC2).
const IMDS_TIMEOUT: Duration = Duration::from_secs(2);
const IMDS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const IMDS_DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
/// Instance-role credentials are fetched again this long before they expire.
const IMDS_REFRESH_BEFORE_MS: u64 = 5 * 60_000;
/// The agent command when the configuration names none.
pub const DEFAULT_AGENT_COMMAND: &str = "mpsfleet agent";
/// Extra instance tags a configuration may give (EC2 allows 50 per resource; mpsfleet sets 3).
pub const MAX_EXTRA_TAGS: usize = 40;
/// EC2's limit on user data, before base64.
const MAX_USER_DATA: usize = 16 * 1024;
/// The largest answer read.
const MAX_ANSWER_BYTES: usize = 32 << 20;
/// DescribeInstances pages followed at most.
const MAX_PAGES: usize = 100;
/// How many times a launch asks again when EC2 answers a client token with an instance that is
/// already gone (the token of an earlier launch of the same request, which EC2 remembers).
const MAX_TOKEN_GENERATIONS: usize = 5;

/// The tag naming the instance's pool.
pub const TAG_POOL: &str = "mpsfleet:pool";
/// The tag naming the instance's host (its name in mpsfleet).
pub const TAG_HOST: &str = "mpsfleet:host";
/// The tag naming the incident the instance replaces a host for (empty when none).
pub const TAG_INCIDENT: &str = "mpsfleet:incident";

/// Instance states of a machine that is booting or up.
const LIVE_STATES: [&str; 2] = ["pending", "running"];
/// Every state but `terminated`.
const NOT_TERMINATED: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// What failed inside the provider, before it is tied to an operation and a host.
#[derive(Debug)]
enum Failure {
    Cloud { call: String, code: String, message: String, transient: bool },
    Credentials { tried: String, transient: bool },
    Refused(String),
}

impl Failure {
    fn cloud(call: &str, code: &str, message: impl Into<String>, transient: bool) -> Failure {
        Failure::Cloud { call: call.to_string(), code: code.to_string(), message: message.into(), transient }
    }

    fn into_error(self, op: ProviderOp, name: &str) -> ProviderError {
        let name = name.to_string();
        match self {
            Failure::Cloud { call, code, message, transient } => {
                ProviderError::Cloud { op, name, call, code, message, transient }
            }
            Failure::Credentials { tried, transient } => {
                ProviderError::Credentials { op, name, tried, transient }
            }
            Failure::Refused(message) => ProviderError::Launch { name, message },
        }
    }

    /// What failed, without an operation or a host.
    fn summary(&self) -> String {
        match self {
            Failure::Cloud { call, code, message, .. } => format!("{call} failed: {code}: {message}"),
            Failure::Credentials { tried, .. } => format!("no usable AWS credentials: {tried}"),
            Failure::Refused(message) => message.clone(),
        }
    }

    /// Replaces each of `secrets` in the failure's text with `<redacted>`.
    fn redact(self, secrets: &[&str]) -> Failure {
        let clean = |mut s: String| {
            for secret in secrets.iter().filter(|s| !s.is_empty()) {
                s = s.replace(secret, "<redacted>");
            }
            s
        };
        match self {
            Failure::Cloud { call, code, message, transient } => {
                Failure::Cloud { call, code: clean(code), message: clean(message), transient }
            }
            Failure::Credentials { tried, transient } => {
                Failure::Credentials { tried: clean(tried), transient }
            }
            Failure::Refused(m) => Failure::Refused(clean(m)),
        }
    }
}

/// Hosts as EC2 instances of one pool, found by their tags.
pub struct Ec2Provider {
    config: Ec2Config,
    pool: String,
    endpoint: Endpoint,
    env: AwsEnv,
    clock: Arc<dyn Clock>,
    client: OnceLock<Result<reqwest::Client, String>>,
    imds_client: OnceLock<Result<reqwest::Client, String>>,
    runtime: OnceLock<Result<tokio::runtime::Runtime, String>>,
    role: Mutex<Option<CachedRole>>,
    /// The instances this provider launched, by host name: terminate ends them even while
    /// DescribeInstances does not show them yet (its answers lag behind RunInstances).
    launched: Mutex<BTreeMap<String, Vec<String>>>,
}

impl fmt::Debug for Ec2Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ec2Provider")
            .field("pool", &self.pool)
            .field("endpoint", &self.endpoint.url)
            .field("region", &self.config.region)
            .finish_non_exhaustive()
    }
}

impl Ec2Provider {
    /// The provider of `pool`'s hosts. Checks the configuration; connects to nothing (the first
    /// call does). Credentials come from the server's environment ([`AwsEnv::process`]).
    pub fn new(config: Ec2Config, pool: impl Into<String>) -> Result<Self, Ec2ConfigError> {
        config.validate()?;
        let endpoint = Endpoint::parse(&config.endpoint_url())
            .map_err(|message| Ec2ConfigError { field: "endpointUrl".into(), message })?;
        Ok(Ec2Provider {
            config,
            pool: pool.into(),
            endpoint,
            env: AwsEnv::process(),
            clock: Arc::new(SystemClock),
            client: OnceLock::new(),
            imds_client: OnceLock::new(),
            runtime: OnceLock::new(),
            role: Mutex::new(None),
            launched: Mutex::new(BTreeMap::new()),
        })
    }

    /// Remembers that host `name` is instance `id`.
    fn remember(&self, name: &str, id: &str) {
        if let Ok(mut l) = self.launched.lock() {
            let ids = l.entry(name.to_string()).or_default();
            if !ids.iter().any(|i| i == id) {
                ids.push(id.to_string());
            }
        }
    }

    /// Reads `AWS_*` variables and `HOME` from `env` instead of the process's environment.
    pub fn with_env(mut self, env: AwsEnv) -> Self {
        self.env = env;
        self
    }

    /// Signs with this clock's time (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &Ec2Config {
        &self.config
    }

    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// One signed EC2 call with `params` after `Action` and `Version`: its answer, or the
    /// error as text. For tools and tests (creating a launch template, reading an attribute).
    pub fn query(&self, action: &str, params: &[(&str, &str)]) -> Result<XmlElement, String> {
        let mut q = Query::new(action);
        for (k, v) in params {
            q.add(*k, *v);
        }
        self.call(&q).map_err(|f| f.summary())
    }

    /// The instances tagged with the pool (and `name`, when given) in one of `states` (any
    /// state when empty).
    pub fn instances(&self, name: Option<&str>, states: &[&str]) -> Result<Vec<Ec2Instance>, ProviderError> {
        self.find(name, states).map_err(|f| f.into_error(ProviderOp::Describe, name.unwrap_or("")))
    }

    /// [`CapacityProvider::hosts`] with its error.
    pub fn try_hosts(&self) -> Result<Vec<String>, ProviderError> {
        let found = self
            .find(None, &["pending", "running", "stopping", "stopped"])
            .map_err(|f| f.into_error(ProviderOp::Describe, &format!("(pool {})", self.pool)))?;
        let mut names: Vec<String> =
            found.into_iter().filter_map(|i| i.tags.get(TAG_HOST).cloned()).collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// The user data script of a launch: `MPSFLEET_JOIN_TOKEN='…' exec <agentCommand> --server
    /// '…' --pool '…' --hostname '…' '<agent arg>'…`, every value single-quoted.
    pub fn user_data(&self, req: &LaunchRequest) -> String {
        let mut line = format!("MPSFLEET_JOIN_TOKEN={} exec", shell_quote(&req.join_token));
        for word in self.config.agent_command() {
            line.push(' ');
            line.push_str(&shell_word(&word));
        }
        for (flag, value) in [("--server", &req.server), ("--pool", &self.pool), ("--hostname", &req.name)] {
            line.push_str(&format!(" {flag} {}", shell_quote(value)));
        }
        for arg in &req.agent_args {
            line.push(' ');
            line.push_str(&shell_quote(arg));
        }
        format!("#!/bin/sh\n# Written by mpsfleet's aws-ec2 provider: runs the host's agent.\n{line}\n")
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Instances tagged with the pool (and `name`), in `states` (any when empty), every page.
    fn find(&self, name: Option<&str>, states: &[&str]) -> Result<Vec<Ec2Instance>, Failure> {
        let pool_filter = format!("tag:{TAG_POOL}");
        let host_filter = format!("tag:{TAG_HOST}");
        let pool = [self.pool.as_str()];
        let mut filters: Vec<(&str, &[&str])> = vec![(pool_filter.as_str(), &pool[..])];
        let host = name.map(|n| [n]);
        if let Some(host) = &host {
            filters.push((host_filter.as_str(), &host[..]));
        }
        if !states.is_empty() {
            filters.push(("instance-state-name", states));
        }
        let mut found = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut q = Query::new("DescribeInstances");
            q.filters(&filters);
            if let Some(token) = &next {
                q.add("NextToken", token.clone());
            }
            let answer = self.call(&q)?;
            found.extend(parse_instances(&answer));
            next = answer.text_at(&["nextToken"]).filter(|t| !t.is_empty()).map(str::to_string);
            if next.is_none() {
                break;
            }
        }
        if next.is_some() {
            let message = format!("more than {MAX_PAGES} pages of instances: the answer is not whole");
            return Err(Failure::cloud("EC2 DescribeInstances", "TooManyPages", message, true));
        }
        // Only instances that carry the tags (a filter an endpoint ignored does not widen this).
        found.retain(|i| {
            i.tags.get(TAG_POOL).is_some_and(|p| *p == self.pool)
                && name.is_none_or(|n| i.tags.get(TAG_HOST).is_some_and(|h| h == n))
                && (states.is_empty() || states.contains(&i.state.as_str()))
        });
        // One instance seen twice (on two pages, in two states) counts once: its most alive.
        found.sort_by(|a, b| (&a.id, a.rank()).cmp(&(&b.id, b.rank())));
        found.dedup_by(|a, b| a.id == b.id);
        found.sort_by(|a, b| (a.rank(), &a.id).cmp(&(b.rank(), &b.id)));
        Ok(found)
    }

    /// RunInstances for one instance of `req`, with `user_data` (base64) and `client_token`.
    fn run_instance(
        &self,
        req: &LaunchRequest,
        user_data: &str,
        client_token: &str,
    ) -> Result<Ec2Instance, Failure> {
        let mut q = self.run_query(req, user_data);
        q.add("ClientToken", client_token);
        let answer = self.call(&q)?;
        parse_instances(&answer).into_iter().next().ok_or_else(|| {
            Failure::cloud("EC2 RunInstances", "bad answer", "the answer names no instance", true)
        })
    }

    /// RunInstances' parameters but the client token.
    fn run_query(&self, req: &LaunchRequest, user_data: &str) -> Query {
        let c = &self.config;
        let mut q = Query::new("RunInstances");
        q.add("MinCount", "1");
        q.add("MaxCount", "1");
        if let Some(t) = &c.launch_template {
            if let Some(id) = &t.id {
                q.add("LaunchTemplate.LaunchTemplateId", id.clone());
            }
            if let Some(name) = &t.name {
                q.add("LaunchTemplate.LaunchTemplateName", name.clone());
            }
            if let Some(v) = &t.version {
                q.add("LaunchTemplate.Version", v.clone());
            }
        }
        for (key, value) in
            [("InstanceType", &c.instance_type), ("ImageId", &c.image_id), ("SubnetId", &c.subnet_id)]
        {
            if let Some(v) = value {
                q.add(key, v.clone());
            }
        }
        for (i, sg) in c.security_group_ids.iter().enumerate() {
            q.add(format!("SecurityGroupId.{}", i + 1), sg.clone());
        }
        if let Some(k) = &c.key_name {
            q.add("KeyName", k.clone());
        }
        if let Some(profile) = &c.iam_instance_profile {
            let key = if profile.starts_with("arn:") {
                "IamInstanceProfile.Arn"
            } else {
                "IamInstanceProfile.Name"
            };
            q.add(key, profile.clone());
        }
        q.add("UserData", user_data);
        q.add("TagSpecification.1.ResourceType", "instance");
        let ours = [
            (TAG_POOL, self.pool.as_str()),
            (TAG_HOST, req.name.as_str()),
            (TAG_INCIDENT, req.incident.as_str()),
        ];
        let extra = c.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        for (i, (key, value)) in ours.into_iter().chain(extra).enumerate() {
            q.add(format!("TagSpecification.1.Tag.{}.Key", i + 1), key);
            q.add(format!("TagSpecification.1.Tag.{}.Value", i + 1), value);
        }
        q
    }

    fn launch_inner(&self, req: &LaunchRequest) -> Result<LaunchedHost, Failure> {
        let refuse = |message: String| Err(Failure::Refused(message));
        if req.name.is_empty() {
            return refuse("the launch request has no host name".into());
        }
        if req.server.is_empty() {
            return refuse("the launch request has no server URL".into());
        }
        if req.join_token.is_empty() {
            return refuse("the launch request has no join token".into());
        }
        if !req.pool.is_empty() && req.pool != self.pool {
            return refuse(format!(
                "the request is for pool {}, and this provider launches the hosts of pool {}",
                req.pool, self.pool
            ));
        }
        let script = self.user_data(req);
        if script.len() > MAX_USER_DATA {
            return refuse(format!(
                "the user data would be {} bytes, more than EC2's {MAX_USER_DATA}: shorten the agent arguments",
                script.len()
            ));
        }
        // Idempotent by name: a machine that is booting or up is the answer.
        if let Some(live) = self.find(Some(&req.name), &LIVE_STATES)?.into_iter().next() {
            self.remember(&req.name, &live.id);
            return Ok(LaunchedHost { provider_id: live.id.clone(), state: live.host_state() });
        }
        let user_data = base64_encode(script.as_bytes());
        // The token EC2 deduplicates by: derived from the pool, the name and the rest of the
        // request but its user data (which holds the launch's one-time token, new when a
        // restarted server launches the name again), so that a retry of the same launch finds
        // its first instance. The same token with other user data is EC2's
        // IdempotentParameterMismatch: an instance of this name was launched already, which
        // DescribeInstances may not show yet. EC2 remembers a token after its instance is
        // gone: answered with a gone instance, ask again with a token derived from that one.
        let base = self.run_query(req, "").body();
        let mut previous = String::new();
        for _ in 0..MAX_TOKEN_GENERATIONS {
            let token = client_token(&self.pool, &req.name, &base, &previous);
            let inst = match self.run_instance(req, &user_data, &token) {
                Ok(inst) => inst,
                Err(Failure::Cloud { code, .. }) if code == "IdempotentParameterMismatch" => {
                    match self.find(Some(&req.name), &[])?.into_iter().next() {
                        Some(i) if LIVE_STATES.contains(&i.state.as_str()) => {
                            self.remember(&req.name, &i.id);
                            return Ok(LaunchedHost { provider_id: i.id.clone(), state: i.host_state() });
                        }
                        Some(gone) if gone.id != previous => {
                            previous = gone.id;
                            continue;
                        }
                        _ => {
                            return Err(Failure::cloud(
                                "EC2 RunInstances",
                                "IdempotentParameterMismatch",
                                format!(
                                    "an earlier launch of host {} is not visible yet; asking again",
                                    req.name
                                ),
                                true,
                            ))
                        }
                    }
                }
                Err(f) => return Err(f.redact(&[&req.join_token, &user_data])),
            };
            if LIVE_STATES.contains(&inst.state.as_str()) {
                self.remember(&req.name, &inst.id);
                return Ok(LaunchedHost { provider_id: inst.id.clone(), state: inst.host_state() });
            }
            tracing::info!(
                host.name = %req.name, instance = %inst.id, state = %inst.state,
                "EC2 answered the launch with an earlier instance that is gone; asking again"
            );
            previous = inst.id;
        }
        refuse(format!(
            "EC2 answered {MAX_TOKEN_GENERATIONS} launches with instances that are already gone (the last {previous})"
        ))
    }

    fn describe_inner(&self, name: &str) -> Result<ProviderHostState, Failure> {
        match self.find(Some(name), &[])?.into_iter().next() {
            Some(inst) => Ok(inst.host_state()),
            None => Ok(ProviderHostState::Unknown {
                detail: format!("no EC2 instance tagged {TAG_POOL}={}, {TAG_HOST}={name}", self.pool),
            }),
        }
    }

    fn terminate_inner(&self, name: &str) -> Result<ProviderHostState, Failure> {
        let found = self.find(Some(name), &NOT_TERMINATED)?;
        // Launched here and not described yet (a lagging answer): ended by id all the same.
        let remembered: Vec<String> = (self.launched.lock().ok())
            .and_then(|l| l.get(name).cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|id| !found.iter().any(|i| &i.id == id))
            .collect();
        let unseen = |id: &String| {
            // One the whole answer names as terminated is gone; any other may still run.
            !self
                .find(Some(name), &[])
                .is_ok_and(|all| all.iter().any(|i| &i.id == id && i.state == "terminated"))
        };
        let remembered: Vec<String> = remembered.into_iter().filter(unseen).collect();
        if found.is_empty() && remembered.is_empty() {
            if let Ok(mut l) = self.launched.lock() {
                l.remove(name);
            }
            return Ok(ProviderHostState::Terminated {
                detail: "no EC2 instance of the host is left".into(),
            });
        }
        let ids: Vec<&str> = (found.iter())
            .filter(|i| i.state != "shutting-down")
            .map(|i| i.id.as_str())
            .chain(remembered.iter().map(String::as_str))
            .collect();
        if ids.is_empty() {
            return Ok(ProviderHostState::Terminating);
        }
        let mut q = Query::new("TerminateInstances");
        for (i, id) in ids.iter().enumerate() {
            q.add(format!("InstanceId.{}", i + 1), *id);
        }
        let answered = parse_instances(&self.call(&q)?);
        let shutting_down = found.iter().any(|i| i.state == "shutting-down");
        let all_gone = !shutting_down
            && ids.iter().all(|id| answered.iter().any(|i| i.id == *id && i.state == "terminated"));
        if all_gone {
            Ok(ProviderHostState::Terminated {
                detail: format!("EC2 instance(s) {} terminated", ids.join(", ")),
            })
        } else {
            Ok(ProviderHostState::Terminating)
        }
    }
}

impl CapacityProvider for Ec2Provider {
    fn launch(&self, req: &LaunchRequest) -> Result<LaunchedHost, ProviderError> {
        let launched = self
            .launch_inner(req)
            .map_err(|f| f.redact(&[&req.join_token]).into_error(ProviderOp::Launch, &req.name))?;
        tracing::info!(
            host.name = %req.name, pool = %self.pool, instance = %launched.provider_id, state = %launched.state,
            "EC2 instance launched"
        );
        Ok(launched)
    }

    fn terminate(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        self.terminate_inner(name).map_err(|f| f.into_error(ProviderOp::Terminate, name))
    }

    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        self.describe_inner(name).map_err(|f| f.into_error(ProviderOp::Describe, name))
    }

    fn hosts(&self) -> Vec<String> {
        self.try_hosts().unwrap_or_else(|e| {
            tracing::warn!(pool = %self.pool, error = %e, "cannot list the pool's EC2 instances");
            Vec::new()
        })
    }
}

/// The ClientToken of a launch: `mpsfleet-` and 40 hex digits of a hash of the pool, the name,
/// the request's other parameters and `previous` (the gone instance a same-token launch was
/// answered with; empty at first). 49 characters; EC2 allows 64.
pub fn client_token(pool: &str, name: &str, request: &str, previous: &str) -> String {
    let mut h = Sha256::new();
    for part in ["mpsfleet-ec2-launch", pool, name, request, previous] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let hex: String = h.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("mpsfleet-{hex}")
}

/// `value` in single quotes for `sh`: every character literal, `'` written as `'\''`.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// `value` as it is when every character is plain, else [`shell_quote`]d.
fn shell_word(value: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !value.is_empty() && value.chars().all(plain) {
        value.to_string()
    } else {
        shell_quote(value)
    }
}

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An error and its sources, joined with ": ".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The start of `text`, trimmed to `limit` bytes on a character boundary.
fn head(text: &str, limit: usize) -> String {
    super::head_text(text, limit)
}
