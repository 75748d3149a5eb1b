//! Startup, readiness and liveness probes: what they run (exec, HTTP GET, TCP connect), the
//! pure [`ProbeTracker`] that turns results into transitions, and the [`ProbeRunner`] threads
//! that run them on their interval.
//!
//! Semantics, as Kubernetes probes and ECS health checks:
//! - each probe runs every `interval`, and is a failure if it does not answer within `timeout`
//!   (an exec probe that overruns is killed with its process group);
//! - failures during `start_period` (counted from when the probe starts running) do not count,
//!   and the first success ends the start period;
//! - `retries` consecutive counted failures fail the probe; one success makes it pass again;
//! - the startup probe runs first and alone; once it passes it stops, and readiness and liveness
//!   start (their start periods then count from that moment). A startup probe that fails is
//!   final (`StartupFailed`): the caller stops the task;
//! - readiness failing yields `NotReady` (the task keeps running); liveness failing yields
//!   `Unhealthy` (the caller stops the task with `StopCode::Unhealthy`);
//! - a container without a readiness probe is reported `Ready` as soon as its startup probe has
//!   passed (at once when it has none), so the caller only has to watch for `Ready`.
//!
//! All time is read through the [`Clock`].

use super::identity::ExecContext;
use mpsfleet_core::clock::Clock;
use mpsfleet_proc::child::{self, ChildError, Limits, Outcome};
use mpsfleet_types::taskdef::{ContainerDefinition, HealthCheck};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How long an exec probe's output pipes may stay open after its process group is gone.
const EXEC_DRAIN_GRACE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    Startup,
    Readiness,
    Liveness,
}

impl ProbeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Startup => "startup",
            ProbeKind::Readiness => "readiness",
            ProbeKind::Liveness => "liveness",
        }
    }
}

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// `CMD prog args...`, or `CMD-SHELL s` as `/bin/sh -c s`.
    Exec { argv: Vec<String> },
    /// `HTTP-GET http://host[:port][/path]`: 2xx and 3xx pass.
    HttpGet { host: String, port: u16, authority: String, path: String },
    /// `TCP-CONNECT host:port`: a completed connect passes.
    TcpConnect { host: String, port: u16 },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    #[error("{kind} check: {reason}")]
    InvalidCheck { kind: &'static str, reason: String },
    #[error("cannot start the probe thread for container {container}: {reason}")]
    Thread { container: String, reason: String },
}

impl ProbeAction {
    /// Parses a health check's `command` (already validated at registration; checked again).
    pub fn parse(command: &[String]) -> Result<ProbeAction, String> {
        match command {
            [kind, rest @ ..] if kind == "CMD" => match rest {
                [prog, ..] if !prog.is_empty() => Ok(ProbeAction::Exec { argv: rest.to_vec() }),
                _ => Err("CMD needs the program to run after it".into()),
            },
            [kind, rest @ ..] if kind == "CMD-SHELL" => match rest {
                [] => Err("CMD-SHELL needs the shell command after it".into()),
                // ECS joins several strings with spaces.
                _ => Ok(ProbeAction::Exec { argv: vec!["/bin/sh".into(), "-c".into(), rest.join(" ")] }),
            },
            [kind, url] if kind == "HTTP-GET" => parse_url(url),
            [kind, addr] if kind == "TCP-CONNECT" => {
                let (host, port) = split_host_port(addr, None)?;
                Ok(ProbeAction::TcpConnect { host, port })
            }
            [kind, ..] => Err(format!(
                "expected CMD, CMD-SHELL, HTTP-GET <url> or TCP-CONNECT <host:port>, got {kind:?} \
                 with {} argument(s)",
                command.len() - 1
            )),
            [] => Err("the command is empty".into()),
        }
    }
}

fn parse_url(url: &str) -> Result<ProbeAction, String> {
    let rest =
        url.strip_prefix("http://").ok_or_else(|| format!("url must start with http://, got {url:?}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = split_host_port(authority, Some(80))?;
    Ok(ProbeAction::HttpGet { host, port, authority: authority.to_string(), path: path.to_string() })
}

/// `host:port`, `[v6]:port`, or (with a default port) `host` / `[v6]`.
fn split_host_port(s: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("expected host:port, got {s:?}");
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(bad()),
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?,
        None => default_port.ok_or_else(bad)?,
    };
    Ok((host.to_string(), port))
}

/// One probe of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub kind: ProbeKind,
    pub action: ProbeAction,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive counted failures that fail the probe (0 is taken as 1).
    pub retries: u32,
    pub start_period: Duration,
}

impl ProbeSpec {
    pub fn from_health_check(kind: ProbeKind, check: &HealthCheck) -> Result<ProbeSpec, ProbeError> {
        let action = ProbeAction::parse(&check.command)
            .map_err(|reason| ProbeError::InvalidCheck { kind: kind.as_str(), reason })?;
        Ok(ProbeSpec {
            kind,
            action,
            interval: Duration::from_secs(u64::from(check.interval.max(1))),
            timeout: Duration::from_secs(u64::from(check.timeout.max(1))),
            retries: check.retries,
            start_period: Duration::from_secs(u64::from(check.start_period)),
        })
    }
}

/// The probes of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerProbes {
    pub startup: Option<ProbeSpec>,
    pub readiness: Option<ProbeSpec>,
    pub liveness: Option<ProbeSpec>,
}

impl ContainerProbes {
    /// `startupCheck`, `readinessCheck` and `healthCheck` (liveness) of a container definition.
    pub fn from_definition(def: &ContainerDefinition) -> Result<ContainerProbes, ProbeError> {
        let spec = |kind, check: &Option<HealthCheck>| {
            check.as_ref().map(|c| ProbeSpec::from_health_check(kind, c)).transpose()
        };
        Ok(ContainerProbes {
            startup: spec(ProbeKind::Startup, &def.startup_check)?,
            readiness: spec(ProbeKind::Readiness, &def.readiness_check)?,
            liveness: spec(ProbeKind::Liveness, &def.health_check)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.startup.is_none() && self.readiness.is_none() && self.liveness.is_none()
    }
}

/// The outcome of running a probe once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure(String),
}

/// A change a probe reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    StartupPassed,
    /// Final: the caller stops the task.
    StartupFailed {
        reason: String,
    },
    Ready,
    NotReady {
        reason: String,
    },
    Healthy,
    /// The caller stops the task with `StopCode::Unhealthy`.
    Unhealthy {
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Unknown,
    Passing,
    Failing,
}

/// The pure state machine of one probe: results in, transitions out.
#[derive(Debug, Clone)]
pub struct ProbeTracker {
    kind: ProbeKind,
    retries: u32,
    start_period_ends_ms: u64,
    in_start_period: bool,
    failures: u32,
    verdict: Verdict,
    done: bool,
}

impl ProbeTracker {
    /// A tracker for a probe that starts running at `started_at_ms`.
    pub fn new(kind: ProbeKind, retries: u32, start_period: Duration, started_at_ms: u64) -> ProbeTracker {
        ProbeTracker {
            kind,
            retries: retries.max(1),
            start_period_ends_ms: started_at_ms.saturating_add(start_period.as_millis() as u64),
            in_start_period: !start_period.is_zero(),
            failures: 0,
            verdict: Verdict::Unknown,
            done: false,
        }
    }

    pub fn for_spec(spec: &ProbeSpec, started_at_ms: u64) -> ProbeTracker {
        ProbeTracker::new(spec.kind, spec.retries, spec.start_period, started_at_ms)
    }

    /// Whether the probe has nothing more to say (a startup probe that passed or failed).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Consecutive failures counted so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    pub fn observe(&mut self, result: &ProbeResult, now_ms: u64) -> Option<Transition> {
        if self.done {
            return None;
        }
        match result {
            ProbeResult::Success => {
                self.in_start_period = false;
                self.failures = 0;
                if self.verdict == Verdict::Passing {
                    return None;
                }
                self.verdict = Verdict::Passing;
                Some(match self.kind {
                    ProbeKind::Startup => {
                        self.done = true;
                        Transition::StartupPassed
                    }
                    ProbeKind::Readiness => Transition::Ready,
                    ProbeKind::Liveness => Transition::Healthy,
                })
            }
            ProbeResult::Failure(why) => {
                if self.in_start_period && now_ms < self.start_period_ends_ms {
                    return None;
                }
                self.in_start_period = false;
                self.failures = self.failures.saturating_add(1);
                if self.failures < self.retries || self.verdict == Verdict::Failing {
                    return None;
                }
                self.verdict = Verdict::Failing;
                let reason = format!(
                    "{} check failed {} time{} in a row: {why}",
                    self.kind.as_str(),
                    self.failures,
                    if self.failures == 1 { "" } else { "s" }
                );
                Some(match self.kind {
                    ProbeKind::Startup => {
                        self.done = true;
                        Transition::StartupFailed { reason }
                    }
                    ProbeKind::Readiness => Transition::NotReady { reason },
                    ProbeKind::Liveness => Transition::Unhealthy { reason },
                })
            }
        }
    }
}

/// Runs `argv` inside a container within a timeout (the container runtime's exec).
pub type ContainerExec = Arc<dyn Fn(&[String], Duration) -> ProbeResult + Send + Sync>;

/// Where a container's probes run.
#[derive(Clone)]
pub enum ProbeTarget {
    /// A process on this host: exec probes run here with the container's environment and
    /// user; HTTP and TCP probes connect to the host they name.
    Host(ExecContext),
    /// A container: exec probes run inside it (`CMD`/`CMD-SHELL` as ECS runs them); HTTP and
    /// TCP probes of `localhost` or `127.0.0.1` go to `address`, the container's own address
    /// (its network namespace is not the host's), when it has one.
    Container { exec: ContainerExec, address: Option<String> },
}

impl ProbeTarget {
    /// The host an HTTP or TCP probe of `host` connects to.
    fn connect_host<'a>(&'a self, host: &'a str) -> &'a str {
        match self {
            ProbeTarget::Container { address: Some(a), .. }
                if matches!(host, "localhost" | "127.0.0.1" | "::1") =>
            {
                a
            }
            _ => host,
        }
    }
}

/// Runs a probe once, within `timeout`. Exec probes on the host run with the context's
/// environment and user, in a process group of their own that is killed if they overrun.
pub fn run_probe(
    action: &ProbeAction,
    timeout: Duration,
    target: &ProbeTarget,
    clock: &dyn Clock,
) -> ProbeResult {
    match action {
        ProbeAction::Exec { argv } => match target {
            ProbeTarget::Host(ctx) => run_exec(argv, timeout, ctx),
            ProbeTarget::Container { exec, .. } => exec(argv, timeout),
        },
        ProbeAction::HttpGet { host, port, authority, path } => {
            run_http(target.connect_host(host), *port, authority, path, timeout, clock)
        }
        ProbeAction::TcpConnect { host, port } => match connect(target.connect_host(host), *port, timeout) {
            Ok(_) => ProbeResult::Success,
            Err(why) => ProbeResult::Failure(why),
        },
    }
}

fn describe(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The timeout of an exec probe is a hard one on a real process, so it follows the real
/// monotonic clock (inside [`mpsfleet_proc::child::run`]), not the probes' clock.
fn run_exec(argv: &[String], timeout: Duration, ctx: &ExecContext) -> ProbeResult {
    let Some((prog, args)) = argv.split_first() else {
        return ProbeResult::Failure("the probe command is empty".into());
    };
    let mut cmd = Command::new(prog);
    cmd.args(args).env_clear().envs(ctx.env.iter().map(|(k, v)| (k, v))).current_dir("/");
    if let Some(user) = &ctx.user {
        cmd.uid(user.uid).gid(user.gid);
    }
    // What the probe prints is read and dropped.
    let limits = Limits { timeout, max_output: 0, drain_grace: EXEC_DRAIN_GRACE };
    match child::run(cmd, None, limits) {
        Ok(Outcome { status: None, .. }) => {
            ProbeResult::Failure(format!("{prog} timed out after {}", describe(timeout)))
        }
        Ok(Outcome { status: Some(status), .. }) => match (status.code(), status.signal()) {
            (Some(0), _) => ProbeResult::Success,
            (Some(code), _) => ProbeResult::Failure(format!("{prog} exited with status {code}")),
            (None, Some(sig)) => ProbeResult::Failure(format!("{prog} was killed by signal {sig}")),
            (None, None) => ProbeResult::Failure(format!("{prog} ended with an unknown status")),
        },
        Err(ChildError::Spawn { source }) if source.kind() == io::ErrorKind::NotFound => {
            ProbeResult::Failure(format!("no such file or directory: {prog}"))
        }
        Err(ChildError::Spawn { source }) => ProbeResult::Failure(format!("cannot run {prog}: {source}")),
        Err(ChildError::Thread { source } | ChildError::Wait { source, .. }) => {
            ProbeResult::Failure(format!("cannot wait for {prog}: {source}"))
        }
    }
}

fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| format!("cannot resolve {host}: {e}"))?.collect();
    let mut last = format!("{host} resolves to no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock => {
                last = format!("connect to {addr} timed out after {}", describe(timeout))
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(last)
}

fn run_http(
    host: &str,
    port: u16,
    authority: &str,
    path: &str,
    timeout: Duration,
    clock: &dyn Clock,
) -> ProbeResult {
    match http_status(host, port, authority, path, timeout, clock) {
        Ok(code) if (200..400).contains(&code) => ProbeResult::Success,
        Ok(code) => ProbeResult::Failure(format!("GET http://{authority}{path} returned status {code}")),
        Err(why) => ProbeResult::Failure(format!("GET http://{authority}{path}: {why}")),
    }
}

fn http_status(
    host: &str,
    port: u16,
    authority: &str,
    path: &str,
    timeout: Duration,
    clock: &dyn Clock,
) -> Result<u16, String> {
    let deadline = clock.now_ms().saturating_add(timeout.as_millis() as u64);
    let remaining = || -> Result<Duration, String> {
        match deadline.checked_sub(clock.now_ms()) {
            Some(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(format!("timed out after {}", describe(timeout))),
        }
    };
    let timed = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("timed out after {}", describe(timeout))
        }
        _ => e.to_string(),
    };
    let mut stream = connect(host, port, remaining()?)?;
    stream.set_write_timeout(Some(remaining()?)).map_err(timed)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: mpsfleet-probe\r\nAccept: */*\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(timed)?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    let line_end = loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            break i;
        }
        if buf.len() > 8192 {
            return Err("no status line in the first 8 KiB of the response".into());
        }
        stream.set_read_timeout(Some(remaining()?)).map_err(timed)?;
        match stream.read(&mut chunk) {
            Ok(0) => return Err("connection closed before a status line".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(timed(e)),
        }
    };
    parse_status_line(&String::from_utf8_lossy(&buf[..line_end]))
}

fn parse_status_line(line: &str) -> Result<u16, String> {
    let mut parts = line.split(' ');
    match (parts.next(), parts.next().and_then(|c| c.parse::<u16>().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") && (100..1000).contains(&code) => Ok(code),
        _ => Err(format!("not an http status line: {line:?}")),
    }
}

/// A transition of one container's probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeEvent {
    pub container: String,
    pub transition: Transition,
    pub at_ms: u64,
}

#[derive(Debug, Default)]
struct Cancel {
    cancelled: Mutex<bool>,
    wake: Condvar,
}

impl Cancel {
    fn cancel(&self) {
        if let Ok(mut c) = self.cancelled.lock() {
            *c = true;
        }
        self.wake.notify_all();
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.lock().map(|c| *c).unwrap_or(true)
    }

    /// Sleeps up to `d`; true when cancelled.
    fn sleep(&self, d: Duration) -> bool {
        let Ok(guard) = self.cancelled.lock() else { return true };
        match self.wake.wait_timeout_while(guard, d, |c| !*c) {
            Ok((c, _)) => *c,
            Err(_) => true,
        }
    }
}

/// The probe threads of one container. Dropping it stops the probes (without waiting);
/// [`ProbeRunner::stop`] also waits for a probe in flight (at most its timeout).
pub struct ProbeRunner {
    cancel: Arc<Cancel>,
    thread: Option<JoinHandle<()>>,
}

type Sink = Arc<dyn Fn(ProbeEvent) + Send + Sync>;

impl ProbeRunner {
    /// Starts running `probes` for `container`; each transition is passed to `on_event` (e.g.
    /// `move |e| { let _ = tx.send(e); }` for a std or tokio channel).
    pub fn start<F>(
        container: impl Into<String>,
        probes: ContainerProbes,
        target: ProbeTarget,
        clock: Arc<dyn Clock>,
        on_event: F,
    ) -> Result<ProbeRunner, ProbeError>
    where
        F: Fn(ProbeEvent) + Send + Sync + 'static,
    {
        let container = container.into();
        let cancel = Arc::new(Cancel::default());
        let sink: Sink = Arc::new(on_event);
        let shared = Shared { container: container.clone(), target, clock, sink, cancel: cancel.clone() };
        let thread = thread::Builder::new()
            .name(format!("probes-{container}"))
            .spawn(move || shared.run(probes))
            .map_err(|e| ProbeError::Thread { container, reason: e.to_string() })?;
        Ok(ProbeRunner { cancel, thread: Some(thread) })
    }

    /// Stops the probes and waits for their threads.
    pub fn stop(mut self) {
        self.cancel.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ProbeRunner {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

struct Shared {
    container: String,
    target: ProbeTarget,
    clock: Arc<dyn Clock>,
    sink: Sink,
    cancel: Arc<Cancel>,
}

impl Shared {
    fn emit(&self, transition: Transition) {
        (self.sink)(ProbeEvent { container: self.container.clone(), transition, at_ms: self.clock.now_ms() });
    }

    fn run(&self, probes: ContainerProbes) {
        if let Some(startup) = &probes.startup {
            if self.probe_loop(startup) != Some(Transition::StartupPassed) {
                return;
            }
        }
        if probes.readiness.is_none() && !self.cancel.is_cancelled() {
            self.emit(Transition::Ready);
        }
        thread::scope(|s| {
            if let Some(readiness) = &probes.readiness {
                let spawned = thread::Builder::new()
                    .name(format!("readiness-{}", self.container))
                    .spawn_scoped(s, || self.probe_loop(readiness));
                if let Err(e) = spawned {
                    tracing::error!(container = %self.container, error = %e, "cannot start the readiness probe thread");
                }
            }
            if let Some(liveness) = &probes.liveness {
                self.probe_loop(liveness);
            }
        });
    }

    /// Runs one probe until cancelled or, for a startup probe, until it is decided. Returns the
    /// final transition of a decided probe.
    fn probe_loop(&self, spec: &ProbeSpec) -> Option<Transition> {
        let mut tracker = ProbeTracker::for_spec(spec, self.clock.now_ms());
        loop {
            if self.cancel.is_cancelled() {
                return None;
            }
            let result = run_probe(&spec.action, spec.timeout, &self.target, self.clock.as_ref());
            if self.cancel.is_cancelled() {
                return None;
            }
            if let Some(t) = tracker.observe(&result, self.clock.now_ms()) {
                self.emit(t.clone());
                if tracker.is_done() {
                    return Some(t);
                }
            }
            if self.cancel.sleep(spec.interval) {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_probe_commands() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let check = |cmd: &[&str], want: Result<ProbeAction, ()>| {
            assert_eq!(ProbeAction::parse(&s(cmd)).map_err(|_| ()), want, "command {cmd:?}")
        };
        check(&["CMD", "true", "x"], Ok(ProbeAction::Exec { argv: s(&["true", "x"]) }));
        check(&["CMD-SHELL", "exit 1"], Ok(ProbeAction::Exec { argv: s(&["/bin/sh", "-c", "exit 1"]) }));
        check(
            &["HTTP-GET", "http://127.0.0.1:8080/healthz?x=1"],
            Ok(ProbeAction::HttpGet {
                host: "127.0.0.1".into(),
                port: 8080,
                authority: "127.0.0.1:8080".into(),
                path: "/healthz?x=1".into(),
            }),
        );
        check(
            &["HTTP-GET", "http://localhost"],
            Ok(ProbeAction::HttpGet {
                host: "localhost".into(),
                port: 80,
                authority: "localhost".into(),
                path: "/".into(),
            }),
        );
        check(
            &["HTTP-GET", "http://[::1]:81/x"],
            Ok(ProbeAction::HttpGet {
                host: "::1".into(),
                port: 81,
                authority: "[::1]:81".into(),
                path: "/x".into(),
            }),
        );
        check(&["TCP-CONNECT", "db:5432"], Ok(ProbeAction::TcpConnect { host: "db".into(), port: 5432 }));
        check(&["TCP-CONNECT", "db"], Err(()));
        check(&["TCP-CONNECT", "db:0"], Err(()));
        check(&["HTTP-GET", "https://x"], Err(()));
        check(&["CMD"], Err(()));
        check(&["CMD-SHELL"], Err(()));
        check(&["NOPE", "x"], Err(()));
        check(&[], Err(()));
    }

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status_line("HTTP/1.1 204 No Content"), Ok(204));
        assert_eq!(parse_status_line("HTTP/1.0 302"), Ok(302));
        assert!(parse_status_line("SSH-2.0-OpenSSH").is_err());
        assert!(parse_status_line("HTTP/1.1 abc").is_err());
    }

    const OK: Option<&str> = None;

    /// Feeds (time, result) pairs into a tracker; `None` is a success, `Some(why)` a failure.
    /// Checks the transitions produced at each step.
    fn check(
        kind: ProbeKind,
        retries: u32,
        start_period_ms: u64,
        steps: &[(u64, Option<&str>, Option<Transition>)],
    ) {
        let mut t = ProbeTracker::new(kind, retries, Duration::from_millis(start_period_ms), 1_000);
        for (i, (at, result, want)) in steps.iter().enumerate() {
            let result = match result {
                None => ProbeResult::Success,
                Some(why) => ProbeResult::Failure(why.to_string()),
            };
            assert_eq!(&t.observe(&result, 1_000 + at), want, "step {i} at +{at}ms ({result:?})");
        }
    }

    fn unhealthy(n: u32, why: &str) -> Option<Transition> {
        let s = if n == 1 { "" } else { "s" };
        Some(Transition::Unhealthy { reason: format!("liveness check failed {n} time{s} in a row: {why}") })
    }

    #[test]
    fn liveness_needs_retries_consecutive_failures() {
        use ProbeKind::Liveness;
        check(
            Liveness,
            3,
            0,
            &[
                (0, Some("x"), None),
                (10, Some("x"), None),
                (20, OK, Some(Transition::Healthy)),
                (30, Some("x"), None),
                (40, Some("x"), None),
                (50, Some("boom"), unhealthy(3, "boom")),
                (60, Some("x"), None), // already unhealthy: reported once
                (70, OK, Some(Transition::Healthy)),
                (80, OK, None),
            ],
        );
        // retries 0 is taken as 1
        check(Liveness, 0, 0, &[(0, Some("x"), unhealthy(1, "x"))]);
    }

    #[test]
    fn start_period_failures_do_not_count_until_it_ends_or_a_success() {
        use ProbeKind::Liveness;
        // Failures inside the 100 ms start period are ignored; after it, they count.
        check(
            Liveness,
            2,
            100,
            &[
                (0, Some("x"), None),
                (50, Some("x"), None),
                (99, Some("x"), None),
                (100, Some("x"), None),
                (110, Some("x"), unhealthy(2, "x")),
            ],
        );
        // A success ends the start period early: later failures count at once.
        check(
            Liveness,
            2,
            10_000,
            &[
                (0, Some("x"), None),
                (10, OK, Some(Transition::Healthy)),
                (20, Some("x"), None),
                (30, Some("y"), unhealthy(2, "y")),
            ],
        );
    }

    #[test]
    fn readiness_and_startup_transitions() {
        check(
            ProbeKind::Readiness,
            2,
            0,
            &[
                (0, OK, Some(Transition::Ready)),
                (10, Some("x"), None),
                (
                    20,
                    Some("x"),
                    Some(Transition::NotReady {
                        reason: "readiness check failed 2 times in a row: x".into(),
                    }),
                ),
                (30, OK, Some(Transition::Ready)),
            ],
        );
        check(
            ProbeKind::Startup,
            2,
            0,
            &[(0, Some("x"), None), (10, OK, Some(Transition::StartupPassed)), (20, Some("x"), None)],
        );
        check(
            ProbeKind::Startup,
            2,
            0,
            &[
                (0, Some("x"), None),
                (
                    10,
                    Some("x"),
                    Some(Transition::StartupFailed {
                        reason: "startup check failed 2 times in a row: x".into(),
                    }),
                ),
                (20, OK, None), // decided: nothing more
            ],
        );
    }

    #[test]
    fn spec_from_health_check_uses_seconds() {
        let hc = HealthCheck {
            command: vec!["CMD-SHELL".into(), "true".into()],
            interval: 30,
            timeout: 5,
            retries: 3,
            start_period: 10,
        };
        let spec = ProbeSpec::from_health_check(ProbeKind::Liveness, &hc).expect("valid");
        assert_eq!(spec.interval, Duration::from_secs(30));
        assert_eq!(spec.timeout, Duration::from_secs(5));
        assert_eq!(spec.start_period, Duration::from_secs(10));
        let bad = HealthCheck { command: vec!["WAT".into()], ..hc };
        assert!(matches!(
            ProbeSpec::from_health_check(ProbeKind::Startup, &bad),
            Err(ProbeError::InvalidCheck { kind: "startup", .. })
        ));
    }
}
