//! GPU placement: packs tasks onto GPUs by MPS memory, client and compute limits.
//!
//! The scheduler keeps an index of free capacity per pool so that one placement costs a few
//! ordered-set operations, not a scan of the fleet:
//!
//! - `mps`: GPUs in `NVIDIA_MPS` mode that can take another client, ordered by remaining memory;
//!   binpack takes the first that fits (best fit), spread the last (emptiest).
//! - `idle_gpus`: `IDLE` GPUs of MPS-capable hosts, ordered by total memory and then by how many
//!   idle GPUs their host has, so binpack opens the smallest GPU that fits on the busiest host.
//! - `idle_hosts`: schedulable hosts with at least one idle GPU, ordered by that count, for
//!   whole-GPU tasks (all of a task's GPUs come from one host).
//! - `cpu_hosts`: schedulable hosts ordered by how many GPU-less tasks they run.
//!
//! Every key ends with the GPU's or host's index, and indices follow registration order, so the
//! same state always gives the same decision, including after a restart that rebuilds the index.
//! Services pass a group: among the fitting candidates the scheduler prefers the host and then
//! the GPU with the fewest replicas of that group, so one daemon failure cannot take a whole
//! service down.
//!
//! A request may also carry [`Needs`], as ECS places tasks: a task that runs images goes only to
//! hosts whose runtime runs them, and static host ports are a per-host resource, so two tasks
//! needing the same (protocol, port) never share a host. Candidates are filtered by these needs
//! only when a request has some; a request without needs costs what it did before.
//!
//! A request may name its [`Tenant`] (the server's task, its priority): the scheduler then
//! keeps it in its host's tenant list, so that [`Scheduler::preempt`] (`scheduler/preempt.rs`)
//! can choose which lower-priority tasks to stop when nothing fits, without a scan of the
//! server's records.

use mpsfleet_types::{GpuDemand, HostId, PlacementStrategy, Protocol, SharingMode};
use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

/// Index of a pool in the scheduler.
pub type PoolIx = u32;
/// Index of a host, in registration order.
pub type HostIx = u32;
/// Index of a GPU across the fleet.
pub type GpuIx = u32;
/// Index of a spread group (a service).
pub type GroupIx = u32;

const GPU_BITS: u32 = 24;
/// The most GPUs one scheduler indexes (2^24): keys pack the GPU index into 24 bits.
pub const MAX_GPUS: usize = 1 << GPU_BITS;
const MAX_MEMORY_MIB: u64 = (1 << 32) - 1;

/// Placement settings of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolConfig {
    pub strategy: PlacementStrategy,
    /// Bound on the sum of the clients' compute percentages on one GPU.
    pub compute_bound: Option<u32>,
}

/// One GPU of a host being added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSpec {
    pub memory_mib: u64,
    pub max_clients: u32,
}

/// A host being added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    pub id: HostId,
    pub pool: PoolIx,
    pub mps_available: bool,
    /// The host's runtime runs images (a container runtime such as Docker).
    pub runs_images: bool,
    pub gpus: Vec<GpuSpec>,
}

/// What to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub pool: PoolIx,
    pub demand: GpuDemand,
    pub group: Option<GroupIx>,
    /// What the task needs of its host besides GPUs; [`Needs::NONE`] for most tasks.
    pub needs: Needs,
    /// Who the placement is for; None for a placement that is neither counted as anyone's nor
    /// ever preempted (tests, trial placements).
    pub tenant: Option<Tenant>,
}

/// Who holds a placement, as preemption weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    /// The caller's key (the server's task id).
    pub id: u64,
    /// 1 to 100.
    pub priority: u8,
    /// When the task was created: among sets of equal cost, the newest tasks go first.
    pub since_ms: u64,
    /// Not preempted before this time (a preempted service's replacement; 0: no shield).
    pub shield_until_ms: u64,
    /// A preemptor's hold on the room its victims free: counted as used, never a victim.
    pub hold: bool,
}

/// The GPUs of a host a tenant's placement can name: a placement on a GPU past them is not
/// kept as a tenant (the server registers at most 64 per host).
const MAX_TENANT_GPUS: u32 = 64;

/// A tenant as its host keeps it: what it holds, and what the server last said of it.
#[derive(Debug, Clone)]
struct Held {
    tenant: Tenant,
    demand: GpuDemand,
    /// Its GPUs, bit i for the host's i-th (a host has at most 64: `MAX_TENANT_GPUS`).
    gpus: u64,
    ports: HostPorts,
    /// Told to stop: its room is counted as coming free, and it is never chosen again.
    stopping: bool,
    /// Protected from scale-in (and so from preemption) until this time.
    protected_until_ms: u64,
}

/// The most static host ports one task may need ([`HostPorts`] holds them inline).
pub const MAX_HOST_PORTS: usize = 16;

/// More static host ports than [`MAX_HOST_PORTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the task needs {count} static host ports, above the limit of {MAX_HOST_PORTS}")]
pub struct TooManyHostPorts {
    pub count: usize,
}

/// A small sorted set of (protocol, port) pairs, held inline so that [`Request`] stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct HostPorts {
    keys: [u32; MAX_HOST_PORTS],
    len: u8,
}

fn port_key(protocol: Protocol, port: u16) -> u32 {
    let proto: u32 = match protocol {
        Protocol::Tcp => 0,
        Protocol::Udp => 1,
    };
    (proto << 16) | u32::from(port)
}

fn key_port(key: u32) -> (Protocol, u16) {
    let protocol = if key >> 16 == 0 { Protocol::Tcp } else { Protocol::Udp };
    (protocol, key as u16)
}

impl HostPorts {
    /// No ports.
    pub const EMPTY: HostPorts = HostPorts { keys: [0; MAX_HOST_PORTS], len: 0 };

    /// The set of the given ports (duplicates count once).
    pub fn new(ports: &[(Protocol, u16)]) -> Result<HostPorts, TooManyHostPorts> {
        let mut keys: Vec<u32> = ports.iter().map(|&(p, n)| port_key(p, n)).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() > MAX_HOST_PORTS {
            return Err(TooManyHostPorts { count: keys.len() });
        }
        let mut set = HostPorts::EMPTY;
        set.keys[..keys.len()].copy_from_slice(&keys);
        set.len = keys.len() as u8;
        Ok(set)
    }

    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ports in (protocol, port) order.
    pub fn iter(&self) -> impl Iterator<Item = (Protocol, u16)> + '_ {
        self.keys().iter().map(|&k| key_port(k))
    }

    fn keys(&self) -> &[u32] {
        &self.keys[..self.len()]
    }
}

impl fmt::Debug for HostPorts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|(p, n)| format!("{}/{n}", p.as_str()))).finish()
    }
}

/// What a task needs of its host besides GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs {
    /// The task runs images: only a host whose runtime runs images can take it.
    pub images: bool,
    /// Static host ports the task holds on its host while it runs.
    pub ports: HostPorts,
    /// The task asked for more static host ports than [`MAX_HOST_PORTS`] (how many); it waits
    /// with [`Unplaced::TooManyHostPorts`] and holds nothing.
    pub too_many_ports: Option<u32>,
}

impl Needs {
    /// Needs nothing: placed by GPU demand alone.
    pub const NONE: Needs = Needs { images: false, ports: HostPorts::EMPTY, too_many_ports: None };

    /// The needs of a task that runs images (or not) and holds these static host ports; more
    /// than [`MAX_HOST_PORTS`] make a task that waits with a reason instead of an error.
    pub fn new(images: bool, ports: &[(Protocol, u16)]) -> Needs {
        match HostPorts::new(ports) {
            Ok(ports) => Needs { images, ports, too_many_ports: None },
            Err(e) => Needs {
                images,
                ports: HostPorts::EMPTY,
                too_many_ports: Some(u32::try_from(e.count).unwrap_or(u32::MAX)),
            },
        }
    }

    /// Whether the task needs nothing beyond GPUs (the fast path).
    pub fn is_none(&self) -> bool {
        !self.images && self.ports.is_empty() && self.too_many_ports.is_none()
    }
}

/// Where a task was placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub host: HostIx,
    /// Fleet-wide GPU indices; empty for a task without GPUs.
    pub gpus: Vec<GpuIx>,
}

/// Why a task could not be placed now. It waits and is retried when capacity appears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplaced {
    NoSchedulableHost {
        pool: String,
    },
    NoMpsHost {
        pool: String,
    },
    InsufficientGpuMemory {
        pool: String,
        memory_mib: u64,
        clients: u32,
        largest_free_mib: u64,
    },
    NotEnoughIdleGpus {
        pool: String,
        count: u32,
        most_idle_on_one_host: u32,
    },
    /// Nothing else fits, and some GPUs of the pool take no MPS task until their daemon is
    /// seen answering again ([`Scheduler::set_mps_open`]).
    MpsDaemonsNotAnswering {
        pool: String,
        memory_mib: u64,
        closed_gpus: u32,
    },
    /// Capacity exists but the client or compute limits leave no GPU for this task.
    GpuLimits {
        pool: String,
        memory_mib: u64,
        clients: u32,
        compute_percent: u32,
    },
    /// The task runs images and no schedulable host of the pool runs them.
    NoContainerHost {
        pool: String,
    },
    /// Hosts that run images exist, but only hosts that do not have room for the task.
    NoFittingContainerHost {
        pool: String,
    },
    /// Every host that otherwise fits holds one of these static host ports already.
    HostPortsInUse {
        pool: String,
        ports: Vec<(Protocol, u16)>,
    },
    /// The task needs more static host ports than one task may hold.
    TooManyHostPorts {
        count: u32,
    },
}

impl Unplaced {
    /// The reason as a stable code.
    pub fn code(&self) -> mpsfleet_types::PendingCode {
        use mpsfleet_types::PendingCode as C;
        match self {
            Unplaced::NoSchedulableHost { .. } => C::NoSchedulableHost,
            Unplaced::NoMpsHost { .. } => C::NoMpsHost,
            Unplaced::InsufficientGpuMemory { .. } => C::InsufficientGpuMemory,
            Unplaced::NotEnoughIdleGpus { .. } => C::NotEnoughIdleGpus,
            Unplaced::MpsDaemonsNotAnswering { .. } => C::MpsDaemonsNotAnswering,
            Unplaced::GpuLimits { .. } => C::GpuLimits,
            Unplaced::NoContainerHost { .. } => C::NoContainerHost,
            Unplaced::NoFittingContainerHost { .. } => C::NoFittingContainerHost,
            Unplaced::HostPortsInUse { .. } => C::HostPortsInUse,
            Unplaced::TooManyHostPorts { .. } => C::TooManyHostPorts,
        }
    }
}

impl fmt::Display for Unplaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unplaced::NoSchedulableHost { pool } => {
                write!(f, "no ACTIVE, uncordoned, healthy host in pool {pool}")
            }
            Unplaced::NoMpsHost { pool } => {
                write!(f, "no schedulable host in pool {pool} has MPS available")
            }
            Unplaced::InsufficientGpuMemory { pool, memory_mib, clients, largest_free_mib } => write!(
                f,
                "no GPU in pool {pool} has {memory_mib} MiB free for {clients} MPS client(s); \
                 the largest free is {largest_free_mib} MiB"
            ),
            Unplaced::NotEnoughIdleGpus { pool, count, most_idle_on_one_host } => write!(
                f,
                "no host in pool {pool} has {count} idle GPU(s); the most idle on one host is \
                 {most_idle_on_one_host}"
            ),
            Unplaced::MpsDaemonsNotAnswering { pool, memory_mib, closed_gpus } => write!(
                f,
                "no GPU in pool {pool} can take an MPS task of {memory_mib} MiB now: {closed_gpus} GPU(s) \
                 wait for their MPS daemon to answer again"
            ),
            Unplaced::GpuLimits { pool, memory_mib, clients, compute_percent } => write!(
                f,
                "no GPU in pool {pool} with {memory_mib} MiB free can take {clients} more MPS \
                 client(s) using {compute_percent}% compute within its client and compute limits"
            ),
            Unplaced::NoContainerHost { pool } => write!(
                f,
                "no schedulable host in pool {pool} runs containers (the task runs images); \
                 start an agent with --runtime docker"
            ),
            Unplaced::NoFittingContainerHost { pool } => write!(
                f,
                "no host in pool {pool} that runs containers has room for the task (the task runs \
                 images); free capacity there or start an agent with --runtime docker"
            ),
            Unplaced::HostPortsInUse { pool, ports } => {
                let plural = if ports.len() == 1 { "" } else { "s" };
                write!(f, "no host in pool {pool} that fits has host port{plural} ")?;
                for (i, (p, n)) in ports.iter().enumerate() {
                    write!(f, "{}{}/{n}", if i == 0 { "" } else { ", " }, p.as_str())?;
                }
                write!(
                    f,
                    " free; stop the task holding it, add a host, or map the container port to a \
                     dynamic host port (hostPort 0)"
                )
            }
            Unplaced::TooManyHostPorts { count } => write!(
                f,
                "the task needs {count} static host ports, above the limit of {MAX_HOST_PORTS} per \
                 task; map the rest to dynamic host ports (hostPort 0)"
            ),
        }
    }
}

/// The scheduler's error for bad calls (not for tasks that wait).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulerError {
    UnknownPool(PoolIx),
    DuplicateHost(HostId),
    TooManyGpus { limit: usize },
    GpuMemoryTooLarge { host: HostId, memory_mib: u64 },
}

impl fmt::Display for SchedulerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedulerError::UnknownPool(p) => write!(f, "unknown pool index {p}"),
            SchedulerError::DuplicateHost(h) => write!(f, "host {h} is already indexed"),
            SchedulerError::TooManyGpus { limit } => {
                write!(f, "the fleet would exceed {limit} GPUs, the most one scheduler indexes")
            }
            SchedulerError::GpuMemoryTooLarge { host, memory_mib } => {
                write!(f, "host {host} reports a GPU of {memory_mib} MiB, above {MAX_MEMORY_MIB}")
            }
        }
    }
}

impl std::error::Error for SchedulerError {}

/// What is placed on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuState {
    pub host: HostIx,
    pub total_mib: u64,
    pub used_mib: u64,
    pub clients: u32,
    pub max_clients: u32,
    pub compute_percent: u32,
    /// Whole-GPU tasks holding this GPU (0 or 1 unless state was loaded over limits).
    pub dedicated: u32,
    /// No new MPS task is placed here: its daemon was seen not answering and has not been
    /// seen answering since (see [`Scheduler::set_mps_open`]).
    pub mps_closed: bool,
}

impl GpuState {
    pub fn mode(&self) -> SharingMode {
        if self.dedicated > 0 {
            SharingMode::Dedicated
        } else if self.clients > 0 {
            SharingMode::NvidiaMps
        } else {
            SharingMode::Idle
        }
    }
    pub fn remaining_mib(&self) -> u64 {
        self.total_mib.saturating_sub(self.used_mib)
    }
}

#[derive(Debug)]
struct HostSlot {
    id: HostId,
    pool: PoolIx,
    first_gpu: GpuIx,
    gpu_count: u32,
    mps_available: bool,
    runs_images: bool,
    schedulable: bool,
    idle: u32,
    cpu_tasks: u32,
    /// Static host ports held by the tasks placed here, sorted; a port appears once per task
    /// holding it (more than once only if stored state was loaded over the limit).
    ports: Vec<u32>,
    /// The placements here that named their tenant.
    tenants: Vec<Held>,
}

#[derive(Debug)]
struct PoolSlot {
    name: String,
    config: PoolConfig,
    mps: BTreeSet<u64>,
    /// Shared GPUs with memory left but no client or compute room, keyed like `mps`; kept only
    /// to tell a waiting task which limit holds it back.
    limited: BTreeSet<u64>,
    idle_gpus: BTreeSet<u64>,
    idle_hosts: BTreeSet<u64>,
    cpu_hosts: BTreeSet<u64>,
    schedulable_hosts: u32,
    mps_hosts: u32,
    /// Schedulable hosts whose runtime runs images.
    image_hosts: u32,
    /// GPUs closed to MPS tasks (their daemon did not answer).
    mps_closed_gpus: u32,
}

#[derive(Debug, Default)]
struct GroupCounts {
    by_host: HashMap<HostIx, u32>,
    by_gpu: HashMap<GpuIx, u32>,
}

/// A host, and for GPU tasks the GPU, that could take a task.
type Candidate = (HostIx, Option<GpuIx>);

/// Why fitting candidates were turned down for a request's needs.
#[derive(Debug, Clone, Copy, Default)]
struct Turned {
    /// Some host did not run images.
    runtime: bool,
    /// Bit i: the request's i-th port was in use on some host that runs what the task needs.
    ports: u16,
}

/// The placement engine. Pure: no I/O, no clock.
#[derive(Debug, Default)]
pub struct Scheduler {
    pools: Vec<PoolSlot>,
    pool_ix: HashMap<String, PoolIx>,
    hosts: Vec<HostSlot>,
    host_ix: HashMap<HostId, HostIx>,
    gpus: Vec<GpuState>,
    groups: Vec<GroupCounts>,
    group_ix: HashMap<String, GroupIx>,
    /// Slots of groups forgotten ([`Scheduler::forget_groups`]), for the next new group.
    free_groups: Vec<GroupIx>,
}

fn mps_key(remaining: u64, gpu: GpuIx) -> u64 {
    (remaining.min(MAX_MEMORY_MIB) << GPU_BITS) | u64::from(gpu)
}

fn idle_gpu_key(total: u64, host_idle: u32, gpu: GpuIx) -> u64 {
    (total.min(MAX_MEMORY_MIB) << 32) | (u64::from(host_idle.min(255)) << GPU_BITS) | u64::from(gpu)
}

fn host_key(count: u32, host: HostIx) -> u64 {
    (u64::from(count) << 32) | u64::from(host)
}

fn key_gpu(key: u64) -> GpuIx {
    (key & ((1 << GPU_BITS) - 1)) as GpuIx
}

fn key_host(key: u64) -> HostIx {
    key as u32
}

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a pool or changes its settings; returns its index.
    pub fn upsert_pool(&mut self, name: &str, config: PoolConfig) -> PoolIx {
        if let Some(&ix) = self.pool_ix.get(name) {
            if self.pools[ix as usize].config != config {
                // Membership of the MPS index depends on the compute bound: rebuild it.
                let members: Vec<GpuIx> = self.pool_gpus(ix).collect();
                members.iter().for_each(|&g| self.detach_gpu(g));
                self.pools[ix as usize].config = config;
                members.iter().for_each(|&g| self.attach_gpu(g));
            }
            return ix;
        }
        let ix = self.pools.len() as PoolIx;
        self.pools.push(PoolSlot {
            name: name.to_string(),
            config,
            mps: BTreeSet::new(),
            limited: BTreeSet::new(),
            idle_gpus: BTreeSet::new(),
            idle_hosts: BTreeSet::new(),
            cpu_hosts: BTreeSet::new(),
            schedulable_hosts: 0,
            mps_hosts: 0,
            image_hosts: 0,
            mps_closed_gpus: 0,
        });
        self.pool_ix.insert(name.to_string(), ix);
        ix
    }

    pub fn pool(&self, name: &str) -> Option<PoolIx> {
        self.pool_ix.get(name).copied()
    }

    /// Interns a spread group (a service name).
    pub fn group(&mut self, name: &str) -> GroupIx {
        if let Some(&g) = self.group_ix.get(name) {
            return g;
        }
        let g = match self.free_groups.pop() {
            Some(g) => g,
            None => {
                self.groups.push(GroupCounts::default());
                (self.groups.len() - 1) as GroupIx
            }
        };
        self.group_ix.insert(name.to_string(), g);
        g
    }

    /// Forgets the groups that hold no task and that `keep` does not name (the deployments
    /// that are gone): a long-lived server interns one group per deployment, and this keeps
    /// their number that of the deployments it still has.
    pub fn forget_groups(&mut self, keep: impl Fn(&str) -> bool) {
        let groups = &self.groups;
        let gone: Vec<(String, GroupIx)> = self
            .group_ix
            .iter()
            .filter(|(name, &g)| {
                let c = &groups[g as usize];
                c.by_host.is_empty() && c.by_gpu.is_empty() && !keep(name)
            })
            .map(|(n, &g)| (n.clone(), g))
            .collect();
        for (name, g) in gone {
            self.group_ix.remove(&name);
            self.free_groups.push(g);
        }
    }

    /// How many groups are interned (for tests of [`Scheduler::forget_groups`]).
    pub fn group_count(&self) -> usize {
        self.group_ix.len()
    }

    /// Adds a host, not yet schedulable. Hosts must be added in registration order.
    pub fn add_host(&mut self, spec: HostSpec) -> Result<HostIx, SchedulerError> {
        if spec.pool as usize >= self.pools.len() {
            return Err(SchedulerError::UnknownPool(spec.pool));
        }
        if self.host_ix.contains_key(&spec.id) {
            return Err(SchedulerError::DuplicateHost(spec.id));
        }
        if self.gpus.len() + spec.gpus.len() > MAX_GPUS {
            return Err(SchedulerError::TooManyGpus { limit: MAX_GPUS });
        }
        if let Some(g) = spec.gpus.iter().find(|g| g.memory_mib > MAX_MEMORY_MIB) {
            return Err(SchedulerError::GpuMemoryTooLarge { host: spec.id, memory_mib: g.memory_mib });
        }
        let ix = self.hosts.len() as HostIx;
        let first_gpu = self.gpus.len() as GpuIx;
        for g in &spec.gpus {
            self.gpus.push(GpuState {
                host: ix,
                total_mib: g.memory_mib,
                used_mib: 0,
                clients: 0,
                max_clients: g.max_clients,
                compute_percent: 0,
                dedicated: 0,
                mps_closed: false,
            });
        }
        self.host_ix.insert(spec.id.clone(), ix);
        self.hosts.push(HostSlot {
            id: spec.id,
            pool: spec.pool,
            first_gpu,
            gpu_count: spec.gpus.len() as u32,
            mps_available: spec.mps_available,
            runs_images: spec.runs_images,
            schedulable: false,
            idle: spec.gpus.len() as u32,
            cpu_tasks: 0,
            ports: Vec::new(),
            tenants: Vec::new(),
        });
        Ok(ix)
    }

    pub fn host(&self, id: &HostId) -> Option<HostIx> {
        self.host_ix.get(id).copied()
    }

    pub fn host_id(&self, host: HostIx) -> &HostId {
        &self.hosts[host as usize].id
    }

    /// The host's GPUs in inventory order, as fleet-wide indices.
    pub fn host_gpus(&self, host: HostIx) -> std::ops::Range<GpuIx> {
        let h = &self.hosts[host as usize];
        h.first_gpu..h.first_gpu + h.gpu_count
    }

    pub fn gpu(&self, gpu: GpuIx) -> &GpuState {
        &self.gpus[gpu as usize]
    }

    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    pub fn is_schedulable(&self, host: HostIx) -> bool {
        self.hosts[host as usize].schedulable
    }

    /// Opens or closes a host to new placements (ACTIVE, uncordoned and not impaired).
    /// What already runs there stays accounted.
    pub fn set_schedulable(&mut self, host: HostIx, schedulable: bool) {
        if self.hosts[host as usize].schedulable == schedulable {
            return;
        }
        self.detach_host(host);
        self.hosts[host as usize].schedulable = schedulable;
        self.attach_host(host);
    }

    /// Whether the host runs images: its runtime changed (`mpsfleet up` on a machine whose
    /// Docker Engine started or went since the host registered).
    pub fn set_runs_images(&mut self, host: HostIx, runs_images: bool) {
        if self.hosts[host as usize].runs_images == runs_images {
            return;
        }
        self.detach_host(host);
        self.hosts[host as usize].runs_images = runs_images;
        self.attach_host(host);
    }

    /// Opens or closes one GPU to new MPS tasks (its daemon answers, or was seen not to);
    /// whole-GPU placement and what already runs there are unaffected.
    pub fn set_mps_open(&mut self, gpu: GpuIx, open: bool) {
        if self.gpus[gpu as usize].mps_closed != open {
            return;
        }
        self.detach_gpu(gpu);
        self.gpus[gpu as usize].mps_closed = !open;
        self.attach_gpu(gpu);
        let pool = self.hosts[self.gpus[gpu as usize].host as usize].pool;
        let closed = &mut self.pools[pool as usize].mps_closed_gpus;
        *closed = if open { closed.saturating_sub(1) } else { *closed + 1 };
    }

    /// Places one task on `host` only (ECS's StartTask), or says why it does not fit there:
    /// the pool's other hosts are closed to placement for this one decision.
    pub fn place_on(&mut self, req: &Request, host: HostIx) -> Result<Placement, Unplaced> {
        let pool = self.hosts[host as usize].pool;
        if pool != req.pool || !self.hosts[host as usize].schedulable {
            return Err(Unplaced::NoSchedulableHost { pool: self.pools[req.pool as usize].name.clone() });
        }
        let others: Vec<HostIx> = (0..self.hosts.len() as HostIx)
            .filter(|&h| {
                h != host && self.hosts[h as usize].pool == pool && self.hosts[h as usize].schedulable
            })
            .collect();
        for &h in &others {
            self.set_schedulable(h, false);
        }
        let out = self.place(req);
        for &h in &others {
            self.set_schedulable(h, true);
        }
        out
    }

    /// Places one task, updating the index, or says why it must wait.
    pub fn place(&mut self, req: &Request) -> Result<Placement, Unplaced> {
        let pool = &self.pools[req.pool as usize];
        if pool.schedulable_hosts == 0 {
            return Err(Unplaced::NoSchedulableHost { pool: pool.name.clone() });
        }
        if !req.needs.is_none() {
            if let Some(count) = req.needs.too_many_ports {
                return Err(Unplaced::TooManyHostPorts { count });
            }
            if req.needs.images && pool.image_hosts == 0 {
                return Err(Unplaced::NoContainerHost { pool: pool.name.clone() });
            }
        }
        let placement = match req.demand {
            GpuDemand::None => self.choose_cpu_host(req),
            GpuDemand::Whole { count } => self.choose_whole(req, count),
            GpuDemand::Mps { memory_mib, clients, compute_percent } => {
                self.choose_mps(req, memory_mib, clients, compute_percent)
            }
        }?;
        self.reserve(req, &placement);
        Ok(placement)
    }

    /// Accounts a placement without checking limits: used when loading stored tasks and by
    /// `place` itself.
    pub fn reserve(&mut self, req: &Request, placement: &Placement) {
        self.account(req, placement, true);
    }

    /// Gives back what a placement held (the task stopped or its batch was not committed).
    pub fn release(&mut self, req: &Request, placement: &Placement) {
        self.account(req, placement, false);
    }

    /// Says what the server knows of a placed tenant now: told to stop, protected until, its
    /// priority (a service's priority changed). False when the host holds no such tenant.
    pub fn set_tenant(
        &mut self,
        host: HostIx,
        id: u64,
        stopping: bool,
        protected_until_ms: u64,
        priority: u8,
    ) -> bool {
        let Some(h) = self.hosts.get_mut(host as usize) else { return false };
        // From the newest: a record applied right after its placement is the last one kept.
        match h.tenants.iter_mut().rev().find(|t| t.tenant.id == id && !t.tenant.hold) {
            Some(t) => {
                t.stopping = stopping;
                t.protected_until_ms = protected_until_ms;
                t.tenant.priority = priority;
                true
            }
            None => false,
        }
    }

    /// How many tenants a host holds (holds included).
    pub fn tenant_count(&self, host: HostIx) -> usize {
        self.hosts[host as usize].tenants.len()
    }

    fn account(&mut self, req: &Request, placement: &Placement, add: bool) {
        let host = placement.host;
        // A task with neither GPUs nor static ports holds nothing preemption could free: it is
        // not kept, so a host's list stays as short as its GPUs' clients (a few hundred at most).
        let holds_room = !matches!(req.demand, GpuDemand::None) || !req.needs.ports.is_empty();
        if let Some(t) = req.tenant.filter(|_| holds_room) {
            let h = &mut self.hosts[host as usize];
            let offsets = placement.gpus.iter().map(|&g| g.wrapping_sub(h.first_gpu));
            let gpus = offsets.clone().fold(0u64, |m, i| if i < MAX_TENANT_GPUS { m | (1 << i) } else { m });
            let kept = offsets.clone().all(|i| i < MAX_TENANT_GPUS);
            if add && kept {
                h.tenants.push(Held {
                    tenant: t,
                    demand: req.demand,
                    gpus,
                    ports: req.needs.ports,
                    stopping: false,
                    protected_until_ms: 0,
                });
            } else if !add {
                // From the newest: a batch not committed gives back what it just took.
                if let Some(at) =
                    h.tenants.iter().rposition(|x| x.tenant.id == t.id && x.tenant.hold == t.hold)
                {
                    h.tenants.swap_remove(at);
                }
            }
        }
        if !req.needs.ports.is_empty() {
            let held = &mut self.hosts[host as usize].ports;
            for &k in req.needs.ports.keys() {
                let at = held.partition_point(|&h| h < k);
                if add {
                    held.insert(at, k);
                } else if held.get(at) == Some(&k) {
                    held.remove(at);
                }
            }
        }
        if let Some(g) = req.group {
            let counts = &mut self.groups[g as usize];
            bump(&mut counts.by_host, host, add);
            for &gpu in &placement.gpus {
                bump(&mut counts.by_gpu, gpu, add);
            }
        }
        if let GpuDemand::None = req.demand {
            self.detach_host(host);
            let h = &mut self.hosts[host as usize];
            h.cpu_tasks = if add { h.cpu_tasks + 1 } else { h.cpu_tasks.saturating_sub(1) };
            self.attach_host(host);
            return;
        }
        for &gpu in &placement.gpus {
            let was_idle = self.gpus[gpu as usize].mode() == SharingMode::Idle;
            self.detach_gpu(gpu);
            let s = &mut self.gpus[gpu as usize];
            match req.demand {
                GpuDemand::Mps { memory_mib, clients, compute_percent } if add => {
                    s.used_mib += memory_mib;
                    s.clients += clients;
                    s.compute_percent += compute_percent;
                }
                GpuDemand::Mps { memory_mib, clients, compute_percent } => {
                    s.used_mib = s.used_mib.saturating_sub(memory_mib);
                    s.clients = s.clients.saturating_sub(clients);
                    s.compute_percent = s.compute_percent.saturating_sub(compute_percent);
                }
                GpuDemand::Whole { .. } if add => s.dedicated += 1,
                GpuDemand::Whole { .. } => s.dedicated = s.dedicated.saturating_sub(1),
                GpuDemand::None => {}
            }
            let is_idle = s.mode() == SharingMode::Idle;
            if was_idle != is_idle {
                // The host's idle count is part of its GPUs' and its own keys.
                self.detach_host(host);
                let h = &mut self.hosts[host as usize];
                h.idle = if is_idle { h.idle + 1 } else { h.idle - 1 };
                self.attach_host(host);
            } else {
                self.attach_gpu(gpu);
            }
        }
    }

    fn pool_gpus(&self, pool: PoolIx) -> impl Iterator<Item = GpuIx> + '_ {
        self.hosts.iter().filter(move |h| h.pool == pool).flat_map(|h| h.first_gpu..h.first_gpu + h.gpu_count)
    }

    /// Removes a GPU's keys from its pool's indexes (as computed from its current state).
    fn detach_gpu(&mut self, gpu: GpuIx) {
        let s = self.gpus[gpu as usize];
        let h = &self.hosts[s.host as usize];
        if !h.schedulable {
            return;
        }
        let pool = &mut self.pools[h.pool as usize];
        match s.mode() {
            SharingMode::NvidiaMps => {
                let key = mps_key(s.remaining_mib(), gpu);
                if !pool.mps.remove(&key) {
                    pool.limited.remove(&key);
                }
            }
            SharingMode::Idle => {
                pool.idle_gpus.remove(&idle_gpu_key(s.total_mib, h.idle, gpu));
            }
            SharingMode::Dedicated => {}
        }
    }

    /// Inserts a GPU's keys for its current state, if it can take more work.
    fn attach_gpu(&mut self, gpu: GpuIx) {
        let s = self.gpus[gpu as usize];
        let h = &self.hosts[s.host as usize];
        if !h.schedulable || !h.mps_available {
            return;
        }
        if s.mps_closed {
            // In neither MPS index: `detach_gpu` finds nothing to remove, which is harmless.
            return;
        }
        let pool = &mut self.pools[h.pool as usize];
        match s.mode() {
            SharingMode::NvidiaMps => {
                let compute_full = pool.config.compute_bound.is_some_and(|b| s.compute_percent >= b);
                let key = mps_key(s.remaining_mib(), gpu);
                if s.remaining_mib() > 0 && s.clients < s.max_clients && !compute_full {
                    pool.mps.insert(key);
                } else if s.remaining_mib() > 0 {
                    pool.limited.insert(key);
                }
            }
            SharingMode::Idle => {
                if s.max_clients > 0 {
                    pool.idle_gpus.insert(idle_gpu_key(s.total_mib, h.idle, gpu));
                }
            }
            SharingMode::Dedicated => {}
        }
    }

    fn detach_host(&mut self, host: HostIx) {
        let h = &self.hosts[host as usize];
        if !h.schedulable {
            return;
        }
        let (pool_ix, idle, cpu, mps, images) = (h.pool, h.idle, h.cpu_tasks, h.mps_available, h.runs_images);
        for gpu in self.host_gpus(host) {
            self.detach_gpu(gpu);
        }
        let pool = &mut self.pools[pool_ix as usize];
        pool.idle_hosts.remove(&host_key(idle, host));
        pool.cpu_hosts.remove(&host_key(cpu, host));
        pool.schedulable_hosts -= 1;
        pool.mps_hosts -= u32::from(mps);
        pool.image_hosts -= u32::from(images);
    }

    fn attach_host(&mut self, host: HostIx) {
        let h = &self.hosts[host as usize];
        if !h.schedulable {
            return;
        }
        let (pool_ix, idle, cpu, mps, images) = (h.pool, h.idle, h.cpu_tasks, h.mps_available, h.runs_images);
        let pool = &mut self.pools[pool_ix as usize];
        if idle > 0 {
            pool.idle_hosts.insert(host_key(idle, host));
        }
        pool.cpu_hosts.insert(host_key(cpu, host));
        pool.schedulable_hosts += 1;
        pool.mps_hosts += u32::from(mps);
        pool.image_hosts += u32::from(images);
        for gpu in self.host_gpus(host) {
            self.attach_gpu(gpu);
        }
    }

    /// The replicas of a group on a candidate's host and GPU; lower is better.
    fn spread_score(&self, group: Option<GroupIx>, host: HostIx, gpu: Option<GpuIx>) -> (u32, u32) {
        let Some(g) = group else { return (0, 0) };
        let counts = &self.groups[g as usize];
        let on_host = counts.by_host.get(&host).copied().unwrap_or(0);
        let on_gpu = gpu.and_then(|gpu| counts.by_gpu.get(&gpu).copied()).unwrap_or(0);
        (on_host, on_gpu)
    }

    /// Picks the first candidate in strategy order, or for a group the one with the fewest
    /// replicas of that group (first in strategy order among equals).
    fn pick<I: Iterator<Item = Candidate>>(
        &self,
        group: Option<GroupIx>,
        candidates: I,
    ) -> Option<Candidate> {
        let mut best: Option<((u32, u32), Candidate)> = None;
        for c in candidates {
            let score = self.spread_score(group, c.0, c.1);
            if score == (0, 0) {
                return Some(c);
            }
            if best.as_ref().is_none_or(|(b, _)| score < *b) {
                best = Some((score, c));
            }
        }
        best.map(|(_, c)| c)
    }

    /// [`Scheduler::pick`] among the candidates whose host meets the request's needs; the
    /// filter exists only for a request with needs. `turned` collects why hosts were refused.
    fn pick_for<I: Iterator<Item = Candidate>>(
        &self,
        req: &Request,
        turned: &Cell<Turned>,
        candidates: I,
    ) -> Option<Candidate> {
        if req.needs.is_none() {
            return self.pick(req.group, candidates);
        }
        let meets = |&(host, _): &Candidate| {
            let h = &self.hosts[host as usize];
            let mut t = turned.get();
            if req.needs.images && !h.runs_images {
                t.runtime = true;
                turned.set(t);
                return false;
            }
            let mut clash = 0u16;
            if !h.ports.is_empty() {
                for (i, k) in req.needs.ports.keys().iter().enumerate() {
                    if h.ports.binary_search(k).is_ok() {
                        clash |= 1 << i;
                    }
                }
            }
            t.ports |= clash;
            turned.set(t);
            clash == 0
        };
        self.pick(req.group, candidates.filter(meets))
    }

    /// Why a request with needs waits when fitting candidates existed but its needs turned
    /// them all down; None when no candidate fitted at all (capacity is the reason).
    fn turned_reason(&self, req: &Request, turned: Turned) -> Option<Unplaced> {
        let pool = &self.pools[req.pool as usize].name;
        if turned.ports != 0 {
            let ports = req
                .needs
                .ports
                .iter()
                .enumerate()
                .filter(|(i, _)| turned.ports & (1 << i) != 0)
                .map(|(_, p)| p)
                .collect();
            return Some(Unplaced::HostPortsInUse { pool: pool.clone(), ports });
        }
        turned.runtime.then(|| Unplaced::NoFittingContainerHost { pool: pool.clone() })
    }

    fn choose_cpu_host(&self, req: &Request) -> Result<Placement, Unplaced> {
        let pool = &self.pools[req.pool as usize];
        let candidates = pool.cpu_hosts.iter().map(|&k| (key_host(k), None));
        let turned = Cell::new(Turned::default());
        let Some((host, _)) = self.pick_for(req, &turned, candidates) else {
            return Err(self
                .turned_reason(req, turned.get())
                .unwrap_or_else(|| Unplaced::NoSchedulableHost { pool: pool.name.clone() }));
        };
        Ok(Placement { host, gpus: Vec::new() })
    }

    fn choose_whole(&self, req: &Request, count: u32) -> Result<Placement, Unplaced> {
        let pool = &self.pools[req.pool as usize];
        let fitting = pool.idle_hosts.range(host_key(count, 0)..).map(|&k| (key_host(k), None));
        let turned = Cell::new(Turned::default());
        let chosen = match pool.config.strategy {
            PlacementStrategy::Binpack => self.pick_for(req, &turned, fitting),
            PlacementStrategy::Spread => self.pick_for(req, &turned, fitting.rev()),
        };
        let Some((host, _)) = chosen else {
            if let Some(why) = self.turned_reason(req, turned.get()) {
                return Err(why);
            }
            let most = pool.idle_hosts.last().map_or(0, |&k| (k >> 32) as u32);
            return Err(Unplaced::NotEnoughIdleGpus {
                pool: pool.name.clone(),
                count,
                most_idle_on_one_host: most,
            });
        };
        let gpus: Vec<GpuIx> = self
            .host_gpus(host)
            .filter(|&g| self.gpus[g as usize].mode() == SharingMode::Idle)
            .take(count as usize)
            .collect();
        Ok(Placement { host, gpus })
    }

    fn choose_mps(
        &self,
        req: &Request,
        memory: u64,
        clients: u32,
        compute: u32,
    ) -> Result<Placement, Unplaced> {
        let pool = &self.pools[req.pool as usize];
        if pool.mps_hosts == 0 {
            return Err(Unplaced::NoMpsHost { pool: pool.name.clone() });
        }
        let bound = pool.config.compute_bound;
        let fits = |gpu: GpuIx| {
            let s = &self.gpus[gpu as usize];
            s.remaining_mib() >= memory
                && s.clients + clients <= s.max_clients
                && bound.is_none_or(|b| s.compute_percent + compute <= b)
        };
        let shared = pool.mps.range(mps_key(memory, 0)..).map(|&k| key_gpu(k));
        let idle = pool.idle_gpus.range(idle_gpu_key(memory, 0, 0)..).map(|&k| key_gpu(k));
        let candidate = |g: GpuIx| fits(g).then(|| (self.gpus[g as usize].host, Some(g)));
        let turned = Cell::new(Turned::default());
        let chosen = match pool.config.strategy {
            // Best fit among shared GPUs, then open the smallest idle GPU that fits.
            PlacementStrategy::Binpack => {
                self.pick_for(req, &turned, shared.chain(idle).filter_map(candidate))
            }
            // The emptiest GPU: idle ones first, then the shared GPU with the most room.
            PlacementStrategy::Spread => {
                self.pick_for(req, &turned, idle.rev().chain(shared.rev()).filter_map(candidate))
            }
        };
        if let Some((host, Some(gpu))) = chosen {
            return Ok(Placement { host, gpus: vec![gpu] });
        }
        if let Some(why) = self.turned_reason(req, turned.get()) {
            return Err(why);
        }
        let largest_shared = pool.mps.last().max(pool.limited.last()).map_or(0, |&k| k >> GPU_BITS);
        let largest_idle = pool.idle_gpus.last().map_or(0, |&k| k >> 32);
        let largest_free_mib = largest_shared.max(largest_idle);
        if pool.mps_closed_gpus > 0 {
            return Err(Unplaced::MpsDaemonsNotAnswering {
                pool: pool.name.clone(),
                memory_mib: memory,
                closed_gpus: pool.mps_closed_gpus,
            });
        }
        if largest_free_mib >= memory {
            return Err(Unplaced::GpuLimits {
                pool: pool.name.clone(),
                memory_mib: memory,
                clients,
                compute_percent: compute,
            });
        }
        Err(Unplaced::InsufficientGpuMemory {
            pool: pool.name.clone(),
            memory_mib: memory,
            clients,
            largest_free_mib,
        })
    }
}

fn bump<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: K, add: bool) {
    if add {
        *map.entry(key).or_insert(0) += 1;
    } else if let Some(v) = map.get_mut(&key) {
        *v -= 1;
        if *v == 0 {
            map.remove(&key);
        }
    }
}

mod preempt;
pub use preempt::{Preemption, PreemptionCost};

#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod tests;
