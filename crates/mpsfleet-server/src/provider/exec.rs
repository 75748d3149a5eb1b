//! The exec capacity provider: operator-supplied launch, terminate and describe commands that
//! read one JSON object on stdin and print one on stdout (the contract is in
//! docs/providers.md), each run with a minimal environment, in its own process group, under a
//! timeout after which the whole group is killed.

use super::{CapacityProvider, LaunchRequest, LaunchedHost, ProviderError, ProviderHostState, ProviderOp};
use mpsfleet_proc::child::{self, ChildError, Limits};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// How long a provider command may run when the configuration does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The `version` field written to every command's stdin.
pub const CONTRACT_VERSION: u32 = 1;

/// Variables passed through from the server's environment when set (PATH has a default).
const INHERITED_ENV: [&str; 3] = ["PATH", "HOME", "TMPDIR"];
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Variables mpsfleet sets itself; the configuration may not override them.
const RESERVED_ENV: [&str; 2] = ["MPSFLEET_PROVIDER_OP", "MPSFLEET_HOST_NAME"];

/// At most this much of each of stdout and stderr is kept; the rest is read and dropped.
const CAPTURE_LIMIT: usize = 64 * 1024;
/// How much of stderr (its end) and stdout (its start) an error message shows.
const STDERR_SHOWN: usize = 1000;
const STDOUT_SHOWN: usize = 200;
/// After the command's process group is gone, how long to wait for its output pipes to close
/// (something that left the group may still hold them).
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The exec provider's configuration: one argv per operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    pub launch: Vec<String>,
    pub terminate: Vec<String>,
    pub describe: Vec<String>,
    /// Per command; when it passes, the command's process group is killed.
    pub timeout: Duration,
    /// Set in every command's environment (for example a cloud profile or region).
    pub env: BTreeMap<String, String>,
    /// Names passed through from the server's environment when set (for example
    /// `AWS_ACCESS_KEY_ID`), besides PATH, HOME and TMPDIR.
    pub pass_env: Vec<String>,
    /// Working directory of the commands; the server's when `None`.
    pub dir: Option<PathBuf>,
}

impl ExecConfig {
    pub fn new(launch: Vec<String>, terminate: Vec<String>, describe: Vec<String>) -> Self {
        ExecConfig {
            launch,
            terminate,
            describe,
            timeout: DEFAULT_TIMEOUT,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            dir: None,
        }
    }

    /// Checks the configuration once, at start-up; the error names the field.
    pub fn validate(&self) -> Result<(), ExecConfigError> {
        let err = |field: String, message: &str| Err(ExecConfigError { field, message: message.to_string() });
        for op in [ProviderOp::Launch, ProviderOp::Terminate, ProviderOp::Describe] {
            match self.argv(op).first() {
                None => return err(op.to_string(), "the command is empty"),
                Some(program) if program.is_empty() => {
                    return err(op.to_string(), "the program name is empty")
                }
                Some(_) => {}
            }
        }
        if self.timeout.is_zero() {
            return err("timeout".into(), "must be more than zero");
        }
        for name in self.env.keys() {
            if let Some(problem) = env_name_problem(name) {
                return err(format!("env.{name}"), problem);
            }
        }
        for name in &self.pass_env {
            if let Some(problem) = env_name_problem(name) {
                return err(format!("passEnv.{name}"), problem);
            }
        }
        if let Some(dir) = &self.dir {
            if !dir.is_dir() {
                return err("dir".into(), "is not a directory");
            }
        }
        Ok(())
    }

    fn argv(&self, op: ProviderOp) -> &[String] {
        match op {
            ProviderOp::Launch => &self.launch,
            ProviderOp::Terminate => &self.terminate,
            ProviderOp::Describe => &self.describe,
        }
    }
}

fn env_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.contains(['=', '\0']) {
        Some("is not a valid variable name")
    } else if RESERVED_ENV.contains(&name) {
        Some("is set by mpsfleet")
    } else {
        None
    }
}

#[derive(Debug, thiserror::Error)]
#[error("exec provider: {field}: {message}")]
pub struct ExecConfigError {
    pub field: String,
    pub message: String,
}

/// Hosts through operator-supplied commands. Knows the provider id of every host it launched
/// or was told about with [`ExecProvider::adopt`]; dropping it terminates nothing.
pub struct ExecProvider {
    config: ExecConfig,
    hosts: Mutex<BTreeMap<String, Entry>>,
}

struct Entry {
    provider_id: String,
    /// Asked to terminate, or described as terminated: no longer in `hosts()`.
    retired: bool,
}

// What goes to the commands' stdin.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LaunchInput<'a> {
    version: u32,
    name: &'a str,
    pool: &'a str,
    server: &'a str,
    join_token: &'a str,
    agent_args: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HostInput<'a> {
    version: u32,
    name: &'a str,
    provider_id: &'a str,
}

// What is read from their stdout; unknown fields are ignored.

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LaunchOutput {
    provider_id: String,
    state: WireState,
}

#[derive(Deserialize)]
struct StateOutput {
    state: WireState,
    #[serde(default)]
    detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum WireState {
    Pending,
    Running,
    Terminating,
    Terminated,
    Unknown,
}

impl WireState {
    fn as_str(self) -> &'static str {
        self.into_state(String::new()).as_str()
    }

    fn into_state(self, detail: String) -> ProviderHostState {
        match self {
            WireState::Pending => ProviderHostState::Pending,
            WireState::Running => ProviderHostState::Running,
            WireState::Terminating => ProviderHostState::Terminating,
            WireState::Terminated => ProviderHostState::Terminated { detail },
            WireState::Unknown => ProviderHostState::Unknown { detail },
        }
    }
}

/// One command run that exited 0.
struct Captured {
    command: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl ExecProvider {
    pub fn new(config: ExecConfig) -> Result<Self, ExecConfigError> {
        config.validate()?;
        Ok(ExecProvider { config, hosts: Mutex::new(BTreeMap::new()) })
    }

    pub fn config(&self) -> &ExecConfig {
        &self.config
    }

    /// Records a host launched earlier (by a previous run of the server) so that it can be
    /// described and terminated.
    pub fn adopt(&self, name: &str, provider_id: &str) {
        self.lock().insert(name.to_string(), Entry { provider_id: provider_id.to_string(), retired: false });
    }

    /// The provider's id for `name`, if this provider knows the host.
    pub fn provider_id(&self, name: &str) -> Option<String> {
        self.lock().get(name).map(|e| e.provider_id.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.hosts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn known_id(&self, name: &str) -> Result<String, ProviderError> {
        self.provider_id(name).ok_or_else(|| ProviderError::Unknown(name.to_string()))
    }

    /// Runs the command for `op` with `input` on stdin; `Ok` only when it exited 0 in time.
    fn run(&self, op: ProviderOp, name: &str, input: &impl Serialize) -> Result<Captured, ProviderError> {
        let argv = self.config.argv(op);
        let command = argv.join(" ");
        let mut input = serde_json::to_vec(input).expect("provider input serializes");
        input.push(b'\n');

        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).env_clear();
        for var in INHERITED_ENV.iter().copied().chain(self.config.pass_env.iter().map(String::as_str)) {
            if let Some(value) = std::env::var_os(var) {
                cmd.env(var, value);
            }
        }
        if std::env::var_os("PATH").is_none() {
            cmd.env("PATH", DEFAULT_PATH);
        }
        cmd.envs(&self.config.env).env("MPSFLEET_PROVIDER_OP", op.as_str()).env("MPSFLEET_HOST_NAME", name);
        if let Some(dir) = &self.config.dir {
            cmd.current_dir(dir);
        }
        tracing::debug!(host.name = name, op = op.as_str(), command, "running provider command");
        // In its own process group, so that a timeout kills everything the command started;
        // every pipe is served while it runs, so that a command that neither reads its input
        // nor stops writing cannot block the timeout.
        let limits =
            Limits { timeout: self.config.timeout, max_output: CAPTURE_LIMIT, drain_grace: DRAIN_GRACE };
        let name = name.to_string();
        let outcome = match child::run(cmd, Some(input), limits) {
            Ok(outcome) => outcome,
            Err(
                ChildError::Spawn { source }
                | ChildError::Thread { source }
                | ChildError::Wait { source, .. },
            ) => return Err(ProviderError::Spawn { op, name, command, source }),
        };
        let (stdout, stderr) = (outcome.stdout.bytes, outcome.stderr.bytes);
        match outcome.status {
            None => Err(ProviderError::TimedOut {
                op,
                name,
                command,
                timeout: self.config.timeout,
                stderr: show_stderr(&stderr),
            }),
            Some(status) if !status.success() => {
                Err(ProviderError::Failed { op, name, command, status, stderr: show_stderr(&stderr) })
            }
            Some(_) => Ok(Captured { command, stdout, stderr }),
        }
    }

    fn parse<T: DeserializeOwned>(
        &self,
        op: ProviderOp,
        name: &str,
        out: &Captured,
    ) -> Result<T, ProviderError> {
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Err(bad_output(op, name, out, "no output (expected one JSON object)".into()));
        }
        serde_json::from_slice(&out.stdout)
            .map_err(|e| bad_output(op, name, out, format!("not the expected JSON: {e}")))
    }
}

impl CapacityProvider for ExecProvider {
    fn launch(&self, req: &LaunchRequest) -> Result<LaunchedHost, ProviderError> {
        let name = req.name.as_str();
        let refuse = |message: &str| {
            Err(ProviderError::Launch { name: name.to_string(), message: message.to_string() })
        };
        if name.is_empty() {
            return refuse("the launch request has no host name");
        }
        if req.server.is_empty() {
            return refuse("the launch request has no server URL");
        }
        if req.join_token.is_empty() {
            return refuse("the launch request has no join token");
        }
        if self.lock().get(name).is_some_and(|e| !e.retired) {
            return Err(ProviderError::AlreadyLaunched(name.to_string()));
        }
        let input = LaunchInput {
            version: CONTRACT_VERSION,
            name,
            pool: &req.pool,
            server: &req.server,
            join_token: &req.join_token,
            // The token goes to the agent in its environment or a file, not its argv.
            agent_args: req.agent_argv_without_token(),
        };
        let out = self.run(ProviderOp::Launch, name, &input)?;
        let parsed: LaunchOutput = self.parse(ProviderOp::Launch, name, &out)?;
        if parsed.provider_id.trim().is_empty() {
            return Err(bad_output(ProviderOp::Launch, name, &out, "providerId is empty".into()));
        }
        let state = match parsed.state {
            WireState::Pending | WireState::Running => parsed.state.into_state(String::new()),
            other => {
                return Err(bad_output(
                    ProviderOp::Launch,
                    name,
                    &out,
                    format!("state {} is not an answer to launch (PENDING or RUNNING)", other.as_str()),
                ))
            }
        };
        self.adopt(name, &parsed.provider_id);
        Ok(LaunchedHost { provider_id: parsed.provider_id, state })
    }

    fn terminate(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        let provider_id = self.known_id(name)?;
        let input = HostInput { version: CONTRACT_VERSION, name, provider_id: &provider_id };
        let out = self.run(ProviderOp::Terminate, name, &input)?;
        let parsed: StateOutput = self.parse(ProviderOp::Terminate, name, &out)?;
        if !matches!(parsed.state, WireState::Terminating | WireState::Terminated) {
            return Err(bad_output(
                ProviderOp::Terminate,
                name,
                &out,
                format!(
                    "state {} is not an answer to terminate (TERMINATING or TERMINATED)",
                    parsed.state.as_str()
                ),
            ));
        }
        if let Some(e) = self.lock().get_mut(name) {
            e.retired = true;
        }
        Ok(parsed.state.into_state(parsed.detail))
    }

    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        let provider_id = self.known_id(name)?;
        let input = HostInput { version: CONTRACT_VERSION, name, provider_id: &provider_id };
        let out = self.run(ProviderOp::Describe, name, &input)?;
        let parsed: StateOutput = self.parse(ProviderOp::Describe, name, &out)?;
        if parsed.state == WireState::Terminated {
            if let Some(e) = self.lock().get_mut(name) {
                e.retired = true;
            }
        }
        Ok(parsed.state.into_state(parsed.detail))
    }

    fn hosts(&self) -> Vec<String> {
        self.lock().iter().filter(|(_, e)| !e.retired).map(|(name, _)| name.clone()).collect()
    }
}

fn bad_output(op: ProviderOp, name: &str, out: &Captured, reason: String) -> ProviderError {
    ProviderError::BadOutput {
        op,
        name: name.to_string(),
        command: out.command.clone(),
        reason,
        stdout: head(&out.stdout, STDOUT_SHOWN),
        stderr: show_stderr(&out.stderr),
    }
}

/// The end of stderr, where the reason usually is, trimmed to [`STDERR_SHOWN`] bytes.
fn show_stderr(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    if text.is_empty() {
        return "no stderr".to_string();
    }
    if text.len() <= STDERR_SHOWN {
        return text.to_string();
    }
    let mut start = text.len() - STDERR_SHOWN;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// The start of `bytes`, trimmed to `limit` bytes.
fn head(bytes: &[u8], limit: usize) -> String {
    super::head_text(&String::from_utf8_lossy(bytes), limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_exec_shown_output_is_truncated_on_char_boundaries() {
        let long = "é".repeat(STDERR_SHOWN);
        let shown = show_stderr(long.as_bytes());
        assert!(shown.starts_with('…') && shown.len() <= STDERR_SHOWN + '…'.len_utf8());
        assert_eq!(show_stderr(b"  \n"), "no stderr");
        assert_eq!(show_stderr(b"quota exceeded\n"), "quota exceeded");
        let shown = head(long.as_bytes(), 7);
        assert_eq!(shown, "ééé…");
    }

    #[test]
    fn provider_exec_config_errors_name_the_field() {
        let sh = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];
        let ok = ExecConfig::new(sh("true"), sh("true"), sh("true"));
        assert!(ok.validate().is_ok());
        let check =
            |c: ExecConfig, expected: &str| assert_eq!(c.validate().unwrap_err().to_string(), expected);
        check(ExecConfig { describe: vec![], ..ok.clone() }, "exec provider: describe: the command is empty");
        check(
            ExecConfig { timeout: Duration::ZERO, ..ok.clone() },
            "exec provider: timeout: must be more than zero",
        );
        let mut env = BTreeMap::new();
        env.insert("MPSFLEET_PROVIDER_OP".to_string(), "x".to_string());
        check(
            ExecConfig { env, ..ok.clone() },
            "exec provider: env.MPSFLEET_PROVIDER_OP: is set by mpsfleet",
        );
        check(
            ExecConfig { pass_env: vec!["A=B".into()], ..ok.clone() },
            "exec provider: passEnv.A=B: is not a valid variable name",
        );
    }
}
