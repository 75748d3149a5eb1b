//! The faults `bench soak` injects: their kinds, what each strikes (`Scope`, `Target`) and
//! which recovery bound each is judged by. The probe injects them (`soak_probe`); the judge
//! reads them back (`soak_judge`), each against the [`Bound`] its kind is held to.

use mpsfleet_types::{FailureKind, HostId};

/// The bounds a fault's recovery is held to, from its kind's stated totals, each plus how
/// long the fault was held: every service back at its replicas within the total for the
/// resumption its target ran (`fenced` where a fenced service had a task there), and every
/// incident closed within the kind's longest total, the fenced one (an incident in a pool with
/// a provider closes only once its old host is terminated, the step the fenced total waits for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub judged_as: FailureKind,
    pub fenced: bool,
    pub resume_ms: u64,
    pub close_ms: u64,
    pub held_ms: u64,
}

impl Bound {
    pub fn resumed(&self) -> u64 {
        self.resume_ms + self.held_ms
    }

    pub fn closed(&self) -> u64 {
        self.close_ms + self.held_ms
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    AgentKill,
    AgentStop,
    DaemonKill,
    DaemonHang,
    ServerKill,
    DockerRestart,
    DiskFull,
}

/// What a fault hits: one host, or every host at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Host,
    Fleet,
}

impl FaultKind {
    pub const ALL: [FaultKind; 7] = [
        FaultKind::AgentKill,
        FaultKind::AgentStop,
        FaultKind::DaemonKill,
        FaultKind::DaemonHang,
        FaultKind::ServerKill,
        FaultKind::DockerRestart,
        FaultKind::DiskFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::AgentKill => "agent-kill",
            FaultKind::AgentStop => "agent-stop",
            FaultKind::DaemonKill => "daemon-kill",
            FaultKind::DaemonHang => "daemon-hang",
            FaultKind::ServerKill => "server-kill",
            FaultKind::DockerRestart => "docker-restart",
            FaultKind::DiskFull => "disk-full",
        }
    }

    /// The failure whose stated bounds its recovery is judged by (docs/benchmarks.md "Soak"):
    /// - an agent killed or stopped: `agent-lost`, what the server sees;
    /// - a daemon killed: `daemon-exit`; a daemon stopped: `daemon-hang`;
    /// - the server killed and restarted: `agent-lost`, counted from its return: to the server
    ///   every host has been silent, and it gives each its heartbeat grace again;
    /// - the Docker Engine restarted: `daemon-hang`, as the server judges an incident of the
    ///   engine's `CONTAINER_RUNTIME` check (any check but `AGENT`, `GPU` and an exited daemon);
    /// - the hosts' disk full: `daemon-hang`, the widest of the host's own checks a full disk
    ///   can fail (a daemon, an agent or the engine that cannot write).
    pub fn judged_as(self) -> FailureKind {
        match self {
            FaultKind::AgentKill | FaultKind::AgentStop | FaultKind::ServerKill => FailureKind::AgentLost,
            FaultKind::DaemonKill => FailureKind::DaemonExit,
            FaultKind::DaemonHang | FaultKind::DockerRestart | FaultKind::DiskFull => FailureKind::DaemonHang,
        }
    }

    pub fn scope(self) -> Scope {
        match self {
            FaultKind::ServerKill | FaultKind::DockerRestart | FaultKind::DiskFull => Scope::Fleet,
            _ => Scope::Host,
        }
    }
}

/// What an injected fault hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Host {
        id: HostId,
        gpu: Option<u32>,
    },
    /// Every host (the server, the one Docker Engine, the hosts' one disk).
    Fleet,
    /// Nothing was found to inject into, and why: the fault did not happen.
    Missed(String),
}

/// One fault: what was done, to what, and how the fleet came back.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    pub target: Target,
    pub at_ms: u64,
    /// How long a SIGSTOP, a full disk, the server's or the engine's absence lasted.
    pub held_ms: Option<u64>,
    /// From the fault to every service back at its replicas on live hosts (the start of the
    /// last stretch of them all there before the fleet settled).
    pub resumed_ms: Option<u64>,
    /// From the fault to the fleet settled: every service back, and no incident open.
    pub settled_ms: Option<u64>,
    /// The stated bound it is judged by; None where the pool states none.
    pub bound: Option<Bound>,
}

impl Fault {
    pub fn new(kind: FaultKind, target: Target, at_ms: u64) -> Fault {
        Fault { kind, target, at_ms, held_ms: None, resumed_ms: None, settled_ms: None, bound: None }
    }

    /// Whether it found something to inject into.
    pub fn happened(&self) -> bool {
        !matches!(self.target, Target::Missed(_))
    }

    /// Whether it hit `host`.
    pub fn covers(&self, host: &HostId) -> bool {
        match &self.target {
            Target::Host { id, .. } => id == host,
            Target::Fleet => true,
            Target::Missed(_) => false,
        }
    }

    pub fn describe(&self) -> String {
        let target = match &self.target {
            Target::Host { id, gpu: Some(g) } => format!(" on host {id} GPU {g}"),
            Target::Host { id, gpu: None } => format!(" on host {id}"),
            Target::Fleet if self.kind == FaultKind::DiskFull => " on the hosts' disk".to_owned(),
            Target::Fleet => String::new(),
            Target::Missed(why) => format!(": no target ({why})"),
        };
        let held = self.held_ms.map_or(String::new(), |ms| format!(" for {ms} ms"));
        format!("{}{target}{held}", self.kind.name())
    }
}
