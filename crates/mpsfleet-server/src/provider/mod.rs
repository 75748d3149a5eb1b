//! Capacity providers: what launches, terminates and describes the hosts that run
//! `mpsfleet agent`, and the retry policy that provider calls are wrapped in. `local` runs
//! agents as child processes of this machine (`mpsfleet up`, tests); `exec` runs
//! operator-supplied commands that speak a JSON contract on stdin and stdout, so any cloud CLI
//! or script can be plugged in; `aws-ec2` launches EC2 instances through EC2's API
//! (docs/providers.md).
//!
//! Provider calls block (they wait for processes); async callers run them on
//! `tokio::task::spawn_blocking`. A terminate that returns `TERMINATED` means nothing of the
//! host runs any more: the server moves `fenced` tasks only then.

pub mod ec2;
mod exec;
mod local;

pub use ec2::{Ec2Config, Ec2ConfigError, Ec2Provider};
pub use exec::{ExecConfig, ExecConfigError, ExecProvider, CONTRACT_VERSION, DEFAULT_TIMEOUT};
pub use local::LocalProvider;

use serde::Serialize;
use std::fmt;
use std::process::ExitStatus;
use std::time::Duration;

/// The three provider operations, as named in `MPSFLEET_PROVIDER_OP` and in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderOp {
    Launch,
    Terminate,
    Describe,
}

impl ProviderOp {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderOp::Launch => "launch",
            ProviderOp::Terminate => "terminate",
            ProviderOp::Describe => "describe",
        }
    }
}

impl fmt::Display for ProviderOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a new host needs to run `mpsfleet agent` and join.
///
/// Empty `pool`, `server` and `join_token` mean "not given here": the local provider then
/// passes no such flag (its own `agent_args` may carry them); the exec provider refuses them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct LaunchRequest {
    /// The host's name in mpsfleet; also the idempotency key of the launch.
    pub name: String,
    pub pool: String,
    /// The control plane's URL as the new host reaches it.
    pub server: String,
    /// The one-time token the new host registers with: its launch token (`mpsf_launch_…`,
    /// for that name in that pool) or its incident's replacement token (`mpsf_repl_…`); the
    /// server's join token never goes to a provider. Secret: never logged, never in argv.
    pub join_token: String,
    /// Extra arguments for `mpsfleet agent`, after the ones derived from the fields above.
    pub agent_args: Vec<String>,
    /// The incident this launch replaces a host for; empty when none (a launch that keeps the
    /// pool at its size). The `aws-ec2` provider tags the instance with it.
    pub incident: String,
}

impl LaunchRequest {
    /// A request carrying only a name (the local provider with its own agent arguments).
    pub fn named(name: impl Into<String>) -> Self {
        LaunchRequest { name: name.into(), ..LaunchRequest::default() }
    }

    /// The complete argument list after `mpsfleet agent`: `--server`, `--join-token`,
    /// `--pool` and `--hostname` for the non-empty fields, then `agent_args`.
    pub fn agent_argv(&self) -> Vec<String> {
        let mut argv = self.join_flags(true);
        argv.extend(self.agent_args.iter().cloned());
        argv
    }

    /// [`LaunchRequest::agent_argv`] without `--join-token`: the agent then reads its token
    /// from `MPSFLEET_JOIN_TOKEN` or `--join-token-file`, out of sight of `ps`.
    pub fn agent_argv_without_token(&self) -> Vec<String> {
        let mut argv = self.join_flags(false);
        argv.extend(self.agent_args.iter().cloned());
        argv
    }

    /// `--server`, `--join-token` (when `with_token`), `--pool` and `--hostname` for the
    /// non-empty fields. A token left out goes in `MPSFLEET_JOIN_TOKEN` instead, out of sight of
    /// `ps`.
    pub(crate) fn join_flags(&self, with_token: bool) -> Vec<String> {
        let mut argv = Vec::new();
        let token = if with_token { self.join_token.as_str() } else { "" };
        for (flag, value) in [
            ("--server", self.server.as_str()),
            ("--join-token", token),
            ("--pool", self.pool.as_str()),
            ("--hostname", self.name.as_str()),
        ] {
            if !value.is_empty() {
                argv.extend([flag.to_string(), value.to_string()]);
            }
        }
        argv
    }
}

impl fmt::Debug for LaunchRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchRequest")
            .field("name", &self.name)
            .field("pool", &self.pool)
            .field("server", &self.server)
            .field("join_token", &if self.join_token.is_empty() { "" } else { "<redacted>" })
            .field("agent_args", &self.agent_args)
            .field("incident", &self.incident)
            .finish()
    }
}

/// What a provider answered to a launch it accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchedHost {
    /// The provider's own id for the machine (instance id, pid…); kept by the caller so that a
    /// restarted server can [`ExecProvider::adopt`] the host again.
    pub provider_id: String,
    /// `Pending` or `Running`.
    pub state: ProviderHostState,
}

/// What a provider knows about one of its hosts. `Running` means the machine is up, not that
/// its agent has joined: the server sees the join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderHostState {
    /// Accepted, still booting.
    Pending,
    Running,
    /// Termination accepted, not yet confirmed.
    Terminating,
    /// Gone; `detail` says how (exit status, provider's reason).
    Terminated {
        detail: String,
    },
    /// The provider cannot tell (for example it no longer knows the id).
    Unknown {
        detail: String,
    },
}

impl ProviderHostState {
    /// The contract's spelling: `PENDING`, `RUNNING`, `TERMINATING`, `TERMINATED`, `UNKNOWN`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ProviderHostState::Pending => "PENDING",
            ProviderHostState::Running => "RUNNING",
            ProviderHostState::Terminating => "TERMINATING",
            ProviderHostState::Terminated { .. } => "TERMINATED",
            ProviderHostState::Unknown { .. } => "UNKNOWN",
        }
    }
}

impl fmt::Display for ProviderHostState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProviderHostState::Terminated { detail } | ProviderHostState::Unknown { detail }
                if !detail.is_empty() =>
            {
                write!(f, "{} ({detail})", self.as_str())
            }
            _ => f.write_str(self.as_str()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("cannot launch host {name}: {message}")]
    Launch { name: String, message: String },
    #[error("unknown host {0}")]
    Unknown(String),
    #[error("host {0} is already launched")]
    AlreadyLaunched(String),
    #[error("cannot run the {op} command `{command}` for host {name}: {source}")]
    Spawn {
        op: ProviderOp,
        name: String,
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the {op} command `{command}` for host {name} failed ({status}): {stderr}")]
    Failed { op: ProviderOp, name: String, command: String, status: ExitStatus, stderr: String },
    #[error(
        "the {op} command `{command}` for host {name} timed out after {}s and was killed: {stderr}",
        timeout.as_secs_f64()
    )]
    TimedOut { op: ProviderOp, name: String, command: String, timeout: Duration, stderr: String },
    #[error(
        "the {op} command `{command}` for host {name} exited 0 but printed invalid output: \
         {reason}; stdout: {stdout}; stderr: {stderr}"
    )]
    BadOutput {
        op: ProviderOp,
        name: String,
        command: String,
        reason: String,
        stdout: String,
        stderr: String,
    },
    #[error("host {name} is not running: {state}")]
    NotRunning { name: String, state: ProviderHostState },
    /// Processes of a terminated host that SIGKILL did not end (for example in an
    /// uninterruptible wait); the host does not count as terminated while they live.
    #[error("host {name} is not terminated: its process(es) {pids:?} still run after SIGKILL")]
    Lingering { name: String, pids: Vec<u32> },
    /// A termination the provider accepted is not confirmed yet.
    #[error("host {name} is not terminated yet: {state}")]
    NotTerminated { name: String, state: ProviderHostState },
    /// A cloud API call failed (the `aws-ec2` provider): `call` names it (`EC2 RunInstances`),
    /// `code` is the service's error code (`RequestLimitExceeded`, `HTTP 503`) or what failed
    /// on the way (`connection`, `timeout`, `bad answer`), `message` the rest. `transient`:
    /// throttling, the service's own failures and failed connections, which may pass.
    #[error("cannot {op} host {name}: {call} failed: {code}: {message}")]
    Cloud { op: ProviderOp, name: String, call: String, code: String, message: String, transient: bool },
    /// No source of cloud credentials gave any; `tried` says what each source answered (never
    /// a secret). `transient` when a source failed in a way that may pass (the instance
    /// metadata service throttled or failed).
    #[error("cannot {op} host {name}: no usable AWS credentials: {tried}")]
    Credentials { op: ProviderOp, name: String, tried: String, transient: bool },
}

impl ProviderError {
    /// The host the error is about.
    pub fn host(&self) -> &str {
        match self {
            ProviderError::Unknown(name) | ProviderError::AlreadyLaunched(name) => name,
            ProviderError::Launch { name, .. }
            | ProviderError::Spawn { name, .. }
            | ProviderError::Failed { name, .. }
            | ProviderError::TimedOut { name, .. }
            | ProviderError::BadOutput { name, .. }
            | ProviderError::NotRunning { name, .. }
            | ProviderError::Lingering { name, .. }
            | ProviderError::NotTerminated { name, .. }
            | ProviderError::Cloud { name, .. }
            | ProviderError::Credentials { name, .. } => name,
        }
    }
}

impl Retryable for ProviderError {
    /// Failures of the provider command itself (non-zero exit, timeout, bad output) may pass;
    /// a missing or non-executable command, an unknown or duplicate host, or a host that
    /// stopped while booting will not. A cloud API's errors say themselves.
    fn is_transient(&self) -> bool {
        match self {
            ProviderError::Cloud { transient, .. } | ProviderError::Credentials { transient, .. } => {
                *transient
            }
            ProviderError::Failed { .. }
            | ProviderError::TimedOut { .. }
            | ProviderError::BadOutput { .. }
            | ProviderError::Lingering { .. }
            | ProviderError::NotTerminated { .. } => true,
            ProviderError::Spawn { source, .. } => {
                !matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied)
            }
            ProviderError::NotRunning { state, .. } => {
                matches!(state, ProviderHostState::Pending | ProviderHostState::Unknown { .. })
            }
            ProviderError::Launch { .. } | ProviderError::Unknown(_) | ProviderError::AlreadyLaunched(_) => {
                false
            }
        }
    }
}

/// Launches, terminates and describes hosts that run `mpsfleet agent`. Calls block.
pub trait CapacityProvider: Send + Sync {
    /// Starts a new host; returns once the provider accepted it (`Pending`) or it is up
    /// (`Running`), not when its agent has joined (the server sees it join).
    fn launch(&self, req: &LaunchRequest) -> Result<LaunchedHost, ProviderError>;
    /// Asks for the host to stop; returns `Terminated` once it is gone, or `Terminating` when
    /// the provider only accepted the request ([`CapacityProvider::describe`] confirms later).
    fn terminate(&self, name: &str) -> Result<ProviderHostState, ProviderError>;
    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError>;
    /// Names of the hosts this provider launched and was not asked to terminate.
    fn hosts(&self) -> Vec<String>;
}

/// A pool's provider that is present but whose calls are made by the caller from the
/// [`ProviderJob`](crate::cluster::ProviderJob)s (the simulator, in-process tests): calling it
/// directly is an error.
pub struct ExternalProvider;

impl CapacityProvider for ExternalProvider {
    fn launch(&self, req: &LaunchRequest) -> Result<LaunchedHost, ProviderError> {
        Err(ProviderError::Launch { name: req.name.clone(), message: "calls are made by the caller".into() })
    }
    fn terminate(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        Err(ProviderError::Unknown(name.to_string()))
    }
    fn describe(&self, name: &str) -> Result<ProviderHostState, ProviderError> {
        Err(ProviderError::Unknown(name.to_string()))
    }
    fn hosts(&self) -> Vec<String> {
        Vec::new()
    }
}

/// How often and how patiently to retry: attempt `n` (from 1) that fails transiently is
/// followed by a wait of `initial_backoff * 2^(n-1)`, capped at `max_backoff`, until
/// `max_attempts` attempts in all. No jitter, so that schedules are reproducible; the server
/// rate-limits replacements anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Attempts in all, the first included; 0 counts as 1.
    pub max_attempts: u32,
}

impl Default for Retry {
    /// For provider commands: 1 s, 2 s, 4 s, 8 s between five attempts.
    fn default() -> Self {
        Retry {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_attempts: 5,
        }
    }
}

impl Retry {
    /// For waiting on a booting machine: every 5 s at first, then every 30 s, for about 15
    /// minutes.
    pub fn boot() -> Self {
        Retry {
            initial_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(30),
            max_attempts: 32,
        }
    }

    /// The wait after failed attempt `attempt` (from 1).
    pub fn backoff_after(&self, attempt: u32) -> Duration {
        mpsfleet_core::backoff::Backoff::nth(self.initial_backoff, self.max_backoff, attempt)
    }
}

/// Whether an error may pass if the operation is tried again.
pub trait Retryable {
    fn is_transient(&self) -> bool;
}

/// One failed attempt, as shown on an incident.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// From 1.
    pub attempt: u32,
    pub error: String,
    /// The wait before the next attempt; `None` when none followed (last attempt, or an error
    /// that retrying cannot fix).
    pub backoff_ms: Option<u64>,
}

/// The outcome of [`with_retries`]: the final result and every failed attempt before it (the
/// final failure included).
#[derive(Debug)]
pub struct Retried<T, E> {
    pub result: Result<T, E>,
    pub attempts: Vec<AttemptRecord>,
}

impl<T, E> Retried<T, E> {
    pub fn into_result(self) -> Result<T, E> {
        self.result
    }
}

/// Runs `op(attempt)` (attempt from 1) until it succeeds, fails with an error that is not
/// transient, or `policy.max_attempts` attempts were made; between attempts calls
/// `sleep(failed_attempt, backoff)`, which may also record the failure (the server notes it on
/// the incident before it waits). Pure apart from `op` and `sleep`: tests pass a recording sleeper, the
/// server `std::thread::sleep` inside `spawn_blocking`.
pub fn with_retries<T, E, F, S>(mut op: F, policy: &Retry, mut sleep: S) -> Retried<T, E>
where
    F: FnMut(u32) -> Result<T, E>,
    E: Retryable + fmt::Display,
    S: FnMut(&AttemptRecord, Duration),
{
    let max_attempts = policy.max_attempts.max(1);
    let mut attempts = Vec::new();
    let mut attempt = 1;
    loop {
        match op(attempt) {
            Ok(value) => return Retried { result: Ok(value), attempts },
            Err(e) => {
                let backoff =
                    (attempt < max_attempts && e.is_transient()).then(|| policy.backoff_after(attempt));
                let record = AttemptRecord {
                    attempt,
                    error: e.to_string(),
                    backoff_ms: backoff.map(|b| u64::try_from(b.as_millis()).unwrap_or(u64::MAX)),
                };
                if let Some(b) = backoff {
                    sleep(&record, b);
                }
                attempts.push(record);
                if backoff.is_none() {
                    return Retried { result: Err(e), attempts };
                }
            }
        }
        attempt += 1;
    }
}

/// `provider.launch(req)` with retries. Safe to retry because the name is the launch's
/// idempotency key (docs/providers.md).
pub fn launch_with_retries(
    provider: &dyn CapacityProvider,
    req: &LaunchRequest,
    policy: &Retry,
    sleep: impl FnMut(&AttemptRecord, Duration),
) -> Retried<LaunchedHost, ProviderError> {
    with_retries(|_| provider.launch(req), policy, sleep)
}

/// `provider.terminate(name)` with retries.
pub fn terminate_with_retries(
    provider: &dyn CapacityProvider,
    name: &str,
    policy: &Retry,
    sleep: impl FnMut(&AttemptRecord, Duration),
) -> Retried<ProviderHostState, ProviderError> {
    with_retries(|_| provider.terminate(name), policy, sleep)
}

/// `provider.terminate(name)` with retries per `policy`; when the provider only accepted the
/// request (`TERMINATING`), then describes the host per `confirm` (see [`Retry::boot`]) until it
/// says `TERMINATED`. Succeeds only with `TERMINATED`: what the server takes as the old host's
/// termination being confirmed, after which `fenced` tasks may run elsewhere.
pub fn terminate_confirmed(
    provider: &dyn CapacityProvider,
    name: &str,
    policy: &Retry,
    confirm: &Retry,
    mut sleep: impl FnMut(&AttemptRecord, Duration),
) -> Retried<ProviderHostState, ProviderError> {
    let asked = with_retries(|_| provider.terminate(name), policy, &mut sleep);
    if !matches!(asked.result, Ok(ProviderHostState::Terminating)) {
        return asked;
    }
    let confirmed = with_retries(
        |_| match provider.describe(name)? {
            state @ ProviderHostState::Terminated { .. } => Ok(state),
            state => Err(ProviderError::NotTerminated { name: name.to_string(), state }),
        },
        confirm,
        &mut sleep,
    );
    let mut attempts = asked.attempts;
    attempts.extend(confirmed.attempts);
    Retried { result: confirmed.result, attempts }
}

/// Describes `name` until the provider says `RUNNING`, for slow boots: `PENDING` and
/// `UNKNOWN` answers and failed describe commands are retried per `policy` (see
/// [`Retry::boot`]); `TERMINATING` or `TERMINATED` ends the wait at once with
/// [`ProviderError::NotRunning`].
pub fn wait_until_running(
    provider: &dyn CapacityProvider,
    name: &str,
    policy: &Retry,
    sleep: impl FnMut(&AttemptRecord, Duration),
) -> Retried<(), ProviderError> {
    with_retries(
        |_| match provider.describe(name)? {
            ProviderHostState::Running => Ok(()),
            state => Err(ProviderError::NotRunning { name: name.to_string(), state }),
        },
        policy,
        sleep,
    )
}

/// The start of `text`, trimmed, cut to `limit` bytes on a character boundary (with `…` when
/// cut): what a provider's error shows of a command's output or a cloud's answer.
pub(crate) fn head_text(text: &str, limit: usize) -> String {
    let text = text.trim();
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fail(bool);
    impl fmt::Display for Fail {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(if self.0 { "transient" } else { "permanent" })
        }
    }
    impl Retryable for Fail {
        fn is_transient(&self) -> bool {
            self.0
        }
    }

    fn policy(initial_ms: u64, max_ms: u64, attempts: u32) -> Retry {
        Retry {
            initial_backoff: Duration::from_millis(initial_ms),
            max_backoff: Duration::from_millis(max_ms),
            max_attempts: attempts,
        }
    }

    /// Runs `with_retries` over scripted outcomes (`Ok` or `Err(transient?)`); returns the
    /// attempts made, the sleeps in ms, the backoffs recorded and whether it succeeded.
    fn check(p: Retry, outcomes: &[Result<(), bool>], expected_sleeps_ms: &[u64], expect_ok: bool) {
        let mut calls = 0;
        let mut slept = Vec::new();
        let r = with_retries(
            |attempt| {
                calls += 1;
                assert_eq!(attempt, calls);
                outcomes[attempt as usize - 1].map_err(Fail)
            },
            &p,
            |failed, d| {
                // The sleeper sees the failed attempt it follows, with the same backoff.
                assert_eq!(failed.backoff_ms, Some(d.as_millis() as u64));
                assert_eq!(failed.attempt as usize, slept.len() + 1);
                slept.push(d.as_millis() as u64)
            },
        );
        assert_eq!(slept, expected_sleeps_ms, "sleeps for {outcomes:?}");
        assert_eq!(r.result.is_ok(), expect_ok);
        let failed = calls as usize - usize::from(expect_ok);
        assert_eq!(r.attempts.len(), failed);
        for (i, a) in r.attempts.iter().enumerate() {
            assert_eq!(a.attempt as usize, i + 1);
            assert_eq!(a.backoff_ms, expected_sleeps_ms.get(i).copied());
        }
    }

    #[test]
    fn provider_retry_schedules() {
        // First try succeeds: no sleeps, no records.
        check(policy(100, 1000, 3), &[Ok(())], &[], true);
        // Two transient failures, then success: doubling backoff.
        check(policy(100, 1000, 5), &[Err(true), Err(true), Ok(())], &[100, 200], true);
        // Backoff capped at max.
        check(policy(300, 1000, 6), &[Err(true); 6], &[300, 600, 1000, 1000, 1000], false);
        // A permanent error stops at once.
        check(policy(100, 1000, 5), &[Err(true), Err(false)], &[100], false);
        // max_attempts 0 means one attempt.
        check(policy(100, 1000, 0), &[Err(true)], &[], false);
    }

    #[test]
    fn provider_retry_backoff_saturates() {
        let p = policy(1000, 60_000, 100);
        assert_eq!(p.backoff_after(1), Duration::from_secs(1));
        assert_eq!(p.backoff_after(7), Duration::from_secs(60));
        assert_eq!(p.backoff_after(40), Duration::from_secs(60));
        assert_eq!(p.backoff_after(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn provider_attempt_record_json() {
        let a = AttemptRecord { attempt: 2, error: "boom".into(), backoff_ms: Some(200) };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            serde_json::json!({"attempt": 2, "error": "boom", "backoffMs": 200})
        );
    }

    /// Answers terminate with `TERMINATING`, then describes the host as still terminating
    /// `pending` times before `TERMINATED`.
    struct SlowTermination {
        pending: std::sync::Mutex<u32>,
    }

    impl CapacityProvider for SlowTermination {
        fn launch(&self, req: &LaunchRequest) -> Result<LaunchedHost, ProviderError> {
            Err(ProviderError::Unknown(req.name.clone()))
        }
        fn terminate(&self, _: &str) -> Result<ProviderHostState, ProviderError> {
            Ok(ProviderHostState::Terminating)
        }
        fn describe(&self, _: &str) -> Result<ProviderHostState, ProviderError> {
            let mut left = self.pending.lock().unwrap();
            if *left == 0 {
                return Ok(ProviderHostState::Terminated { detail: "gone".into() });
            }
            *left -= 1;
            Ok(ProviderHostState::Terminating)
        }
        fn hosts(&self) -> Vec<String> {
            Vec::new()
        }
    }

    #[test]
    fn provider_termination_counts_only_once_confirmed() {
        let confirm = policy(10, 10, 4);
        let p = SlowTermination { pending: std::sync::Mutex::new(2) };
        let r = terminate_confirmed(&p, "gpu-1", &policy(10, 10, 3), &confirm, |_, _| {});
        assert_eq!(r.result.unwrap(), ProviderHostState::Terminated { detail: "gone".into() });
        assert_eq!(r.attempts.len(), 2, "two describes answered TERMINATING: {:?}", r.attempts);
        assert!(r.attempts[0].error.contains("not terminated yet: TERMINATING"), "{:?}", r.attempts);

        // Never confirmed: the termination fails, so fenced tasks keep waiting.
        let p = SlowTermination { pending: std::sync::Mutex::new(10) };
        let r = terminate_confirmed(&p, "gpu-1", &policy(10, 10, 3), &confirm, |_, _| {});
        assert!(matches!(r.result, Err(ProviderError::NotTerminated { .. })), "{:?}", r.result);
        assert_eq!(r.attempts.len(), 4);
    }

    #[test]
    fn provider_launch_request_argv_and_debug() {
        let req = LaunchRequest {
            name: "gpu-1".into(),
            pool: "train".into(),
            server: "http://cp:7070".into(),
            join_token: "s3cret".into(),
            agent_args: vec!["--mps-model".into()],
            incident: "inc-1".into(),
        };
        assert_eq!(
            req.agent_argv(),
            [
                "--server",
                "http://cp:7070",
                "--join-token",
                "s3cret",
                "--pool",
                "train",
                "--hostname",
                "gpu-1",
                "--mps-model"
            ]
        );
        assert!(!format!("{req:?}").contains("s3cret"));
        assert_eq!(LaunchRequest::named("x").agent_argv(), ["--hostname", "x"]);
    }
}
