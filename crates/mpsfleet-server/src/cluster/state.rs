//! The cluster's records and the indexes derived from them, apart from what acts on them.
//!
//! [`State`] holds every committed record the server keeps in memory (pools, hosts, task
//! definitions, tasks, services, incidents, API and join tokens, the bootstrap admin token's
//! digest, the audit log's and the client tokens' records) with the indexes kept in step with
//! them (each GPU's host, each host credential's host, each replacement token's incident, the
//! task and incident tables' own indexes) and the store revision the server last committed. Everything in `cluster/` reads it through
//! `&State`; it changes only through [`State::apply`], which takes one committed record
//! change at the version the store wrote it (kube's reflector: one writer, many readers).
//! The fields are private to this file, and a host's record and version to [`HostEntry`]'s
//! getters, so the compiler keeps that true.
//!
//! What is not a record lives beside the records and is written by its own named methods:
//! what a host's agent last reported (checks, addresses, GPU use) and the server's evaluation
//! of it, a task's in-memory events and pending reason. The controllers' own bookkeeping
//! (health due times, breaker counts, provider progress: `dispatch::Controllers`) and the
//! scheduler's capacity index are `Cluster`'s.

use super::audit::AuditLog;
use super::idempotency::{ClientTokenRecord, ClientTokens};
use super::incident_table::IncidentTable;
use super::tasks::TaskTable;
use super::tokens::{AdminDigest, JoinDigests, JoinTokenRecord, TokenRecord};
use super::Versioned;
use mpsfleet_core::changes::TaskChange;
use mpsfleet_core::scheduler::{HostIx, Placement};
use mpsfleet_store::Revision;
use mpsfleet_types::api::HostStatusReport;
use mpsfleet_types::check_key as checks_key;
use mpsfleet_types::drill::{Drill, DrillSwitch};
use mpsfleet_types::{
    Family, GpuUuid, Host, HostCheck, HostId, HostStatus, Incident, PendingCode, Pool, PoolName, Service,
    ServiceName, Task, TaskDefinition, TaskGpuUse, TaskId,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One committed record change, as [`State::apply`] takes it.
pub(super) enum Change {
    Pool(Pool),
    PoolRemoved(PoolName),
    /// A host the scheduler indexed at this `HostIx` (the next one: hosts are never removed).
    NewHost(HostIx, Host),
    Host(HostIx, Host),
    TaskDef(Arc<TaskDefinition>),
    TaskDefRemoved(Family, u32),
    /// A task, held by the scheduler at the placement (None: waiting, or stopped).
    Task(Task, Option<Placement>),
    TaskRemoved(TaskId),
    Service(Service),
    ServiceRemoved(ServiceName),
    Incident(Box<Incident>),
    IncidentRemoved(String),
    ApiToken(TokenRecord),
    /// An API token revoked, by its digest.
    ApiTokenRevoked(String),
    JoinToken(JoinTokenRecord),
    /// A join token revoked, by its digest.
    JoinTokenRevoked(String),
    /// The bootstrap admin token's new digest.
    AdminToken(String),
    /// The audit log's entries in the store, by key (at load).
    AuditLoaded(Vec<String>),
    /// The audit log's next entry, and the `dropped` oldest ones deleted in its commit.
    AuditWritten {
        dropped: usize,
    },
    /// A client token's record, and the oldest ones deleted in its commit.
    ClientToken {
        key: String,
        rec: ClientTokenRecord,
        pruned: Vec<String>,
    },
    Drill(Box<Drill>),
    DrillRemoved(String),
    DrillSwitch(DrillSwitch),
    /// A pool or service kept as deleted (`deleted.rs`), and one forgotten, by key.
    Deleted(Box<super::deleted::Deleted>),
    DeletedRemoved(String),
    /// The hashes of the cluster CAs clients trust, the active one first (the CA records of a
    /// server that serves HTTPS; none for plain HTTP).
    Cas(Vec<String>),
}

pub(super) struct State {
    /// The store revision of the server's last commit.
    revision: Revision,
    pools: BTreeMap<PoolName, Versioned<Pool>>,
    /// By [`HostIx`], the scheduler's index of the host.
    hosts: Vec<HostEntry>,
    /// Shared, so that listing definitions copies pointers under the lock, not documents.
    taskdefs: BTreeMap<(Family, u32), Versioned<Arc<TaskDefinition>>>,
    /// Task records with their pending queues and per-host and per-service sets.
    tasks: TaskTable,
    services: BTreeMap<ServiceName, Versioned<Service>>,
    incidents: IncidentTable,
    /// The host of every GPU of a host that is not deregistered.
    gpu_hosts: HashMap<GpuUuid, HostIx>,
    /// The host of every credential that works: not revoked, host not deregistered.
    host_credentials: HashMap<String, HostIx>,
    /// API tokens by digest.
    api_tokens: HashMap<String, TokenRecord>,
    /// AWS access key id to its API token's digest.
    access_keys: HashMap<String, String>,
    /// Counts the changes of API tokens (and so of AWS access keys): a copy of a key taken
    /// earlier still holds while it has not moved (`ecs`'s keys).
    pub(super) credentials: Arc<std::sync::atomic::AtomicU64>,
    /// Join tokens by digest, shared with the HTTP layer (read without the cluster lock).
    join_tokens: JoinDigests,
    /// The bootstrap admin token's digest, shared with the HTTP layer.
    admin: AdminDigest,
    /// The incident of every replacement token's digest (spent and earlier ones too, while the
    /// incident is kept, so that a reuse is refused as such).
    replacement_tokens: HashMap<String, String>,
    /// The audit log's entries, by key, oldest first (the entries themselves are read from
    /// the store).
    audit_log: AuditLog,
    /// The client tokens' records (`idempotency.rs`).
    client_tokens: ClientTokens,
    /// Drills, by id (the latest [`super::drills::MAX_DRILLS`] are kept).
    drills: BTreeMap<String, Versioned<Drill>>,
    /// The cluster-wide drill switch; None: never set (drills allowed).
    drill_switch: Option<Versioned<DrillSwitch>>,
    /// Pools and services deleted lately, by key (`deleted.rs`): one kind's oldest first.
    deleted: BTreeMap<String, super::deleted::Deleted>,
    /// Replicas of each service lost to their host's or MPS daemon's failure and not yet
    /// replaced, by the host they ran on (memory only): the service's next starts replace them
    /// as recovery (`Task::recovery_from`).
    lost_replicas: HashMap<ServiceName, Vec<(HostId, u64)>>,
    /// The hashes of the cluster CAs clients should trust, the active one first: join strings
    /// carry the first, heartbeat answers all of them.
    cas: Vec<String>,
}

impl State {
    /// No records yet but the admin token's digest and the (shared) join tokens' index.
    pub(super) fn new(admin: AdminDigest, join_tokens: JoinDigests) -> State {
        State {
            revision: 0,
            pools: BTreeMap::new(),
            hosts: Vec::new(),
            taskdefs: BTreeMap::new(),
            tasks: TaskTable::default(),
            services: BTreeMap::new(),
            incidents: IncidentTable::default(),
            gpu_hosts: HashMap::new(),
            host_credentials: HashMap::new(),
            api_tokens: HashMap::new(),
            access_keys: HashMap::new(),
            credentials: Arc::default(),
            join_tokens,
            admin,
            replacement_tokens: HashMap::new(),
            audit_log: AuditLog::default(),
            client_tokens: ClientTokens::default(),
            drills: BTreeMap::new(),
            drill_switch: None,
            deleted: BTreeMap::new(),
            lost_replicas: HashMap::new(),
            cas: Vec::new(),
        }
    }

    /// A replica of `svc` on `host` was lost at `at_ms` to the host's or its MPS daemon's
    /// failure (at most [`MAX_LOST_REPLICAS`] are kept per service; more are replaced as
    /// ordinary starts).
    pub(super) fn note_lost_replica(&mut self, svc: &ServiceName, host: HostId, at_ms: u64) {
        let lost = self.lost_replicas.entry(svc.clone()).or_default();
        if lost.len() < MAX_LOST_REPLICAS {
            lost.push((host, at_ms));
        }
    }

    /// A replica of `svc` exited on `gpu` of host `ix` at `at_ms`, its daemon not (yet) known
    /// to be failing: if the daemon's failure is confirmed soon after, the exit was its doing
    /// (`Cluster::daemons_changed`). The newest [`RECENT_EXITS`] per host are kept.
    pub(super) fn note_exit(&mut self, ix: HostIx, gpu: GpuUuid, svc: ServiceName, at_ms: u64) {
        let exits = &mut self.host_mut(ix).recent_exits;
        if exits.len() >= RECENT_EXITS {
            exits.remove(0);
        }
        exits.push((gpu, svc, at_ms));
    }

    /// Up to `n` of `svc`'s lost replicas' hosts, taken: the starts that replace them. A note
    /// older than [`LOST_REPLICA_TTL_MS`] is dropped instead: its replica was replaced another
    /// way (a copy started while its daemon failed), and an unrelated start must not take it.
    pub(super) fn take_lost_replicas(&mut self, svc: &ServiceName, n: usize, now_ms: u64) -> Vec<HostId> {
        let Some(lost) = self.lost_replicas.get_mut(svc) else { return Vec::new() };
        lost.retain(|(_, at)| at + LOST_REPLICA_TTL_MS >= now_ms);
        let taken: Vec<HostId> = lost.drain(..n.min(lost.len())).map(|(h, _)| h).collect();
        if lost.is_empty() {
            self.lost_replicas.remove(svc);
        }
        taken
    }

    /// Applies one committed change at `version`, the store revision that wrote it.
    pub(super) fn apply(&mut self, version: Revision, change: Change) {
        match change {
            Change::Pool(pool) => {
                self.pools.insert(pool.name.clone(), Versioned { value: pool, version });
            }
            Change::PoolRemoved(name) => {
                self.pools.remove(&name);
            }
            Change::TaskDefRemoved(family, revision) => {
                self.taskdefs.remove(&(family, revision));
            }
            Change::NewHost(ix, host) => {
                debug_assert_eq!(ix as usize, self.hosts.len(), "hosts are indexed in the scheduler's order");
                // A deregistered host holds its GPUs no more: the machine may join again as
                // a new host.
                if host.status != HostStatus::Deregistered {
                    self.gpu_hosts.extend(host.gpus.iter().map(|g| (g.uuid.clone(), ix)));
                }
                self.index_credential(ix, &host);
                let registered_at_ms = host.registered_at_ms;
                self.hosts.push(HostEntry {
                    host,
                    version,
                    last_heartbeat_ms: None,
                    checks: Vec::new(),
                    checks_key: checks_key::of(&[]),
                    checks_clean: true,
                    checks_rev: None,
                    checks_at_ms: None,
                    logs_url: None,
                    logs_cert: None,
                    trusted_cas: Vec::new(),
                    gpu_use: Vec::new(),
                    heartbeat_ms: None,
                    failed_daemons: Default::default(),
                    failed_daemons_since_ms: None,
                    preemptions: Vec::new(),
                    recent_exits: Vec::new(),
                    accepts_faults: false,
                    recent_repairs: Vec::new(),
                    health: mpsfleet_core::health::HostHealth::new(registered_at_ms),
                    evaluated: false,
                    epoch: self.revision,
                });
            }
            Change::Host(ix, host) => {
                if host.status == HostStatus::Deregistered {
                    self.gpu_hosts.retain(|_, holder| *holder != ix);
                }
                self.index_credential(ix, &host);
                let entry = &mut self.hosts[ix as usize];
                entry.host = host;
                entry.version = version;
            }
            Change::TaskDef(td) => {
                self.taskdefs.insert((td.family.clone(), td.revision), Versioned { value: td, version });
            }
            Change::Task(task, placement) => {
                self.tasks.put(task, version, placement);
            }
            Change::TaskRemoved(id) => {
                self.tasks.remove(&id);
            }
            Change::Service(svc) => {
                self.services.insert(svc.name.clone(), Versioned { value: svc, version });
            }
            Change::ServiceRemoved(name) => {
                self.services.remove(&name);
            }
            Change::Incident(i) => {
                for d in replacement_digests(&i) {
                    self.replacement_tokens.insert(d.clone(), i.id.clone());
                }
                self.incidents.insert(i.id.clone(), Versioned { value: *i, version });
            }
            Change::IncidentRemoved(id) => {
                if let Some(old) = self.incidents.remove(&id) {
                    for d in replacement_digests(&old.value) {
                        self.replacement_tokens.remove(d);
                    }
                }
            }
            Change::ApiToken(rec) => {
                self.credentials.fetch_add(1, std::sync::atomic::Ordering::Release);
                if let Some(key) = &rec.view.access_key_id {
                    self.access_keys.insert(key.clone(), rec.sha256.clone());
                }
                self.api_tokens.insert(rec.sha256.clone(), rec);
            }
            Change::ApiTokenRevoked(digest) => {
                self.credentials.fetch_add(1, std::sync::atomic::Ordering::Release);
                if let Some(key) = self.api_tokens.remove(&digest).and_then(|r| r.view.access_key_id) {
                    self.access_keys.remove(&key);
                }
            }
            Change::JoinToken(rec) => self.join_tokens.insert(rec),
            Change::JoinTokenRevoked(digest) => {
                self.join_tokens.remove(&digest);
            }
            Change::AdminToken(digest) => self.admin.set(digest),
            Change::AuditLoaded(keys) => self.audit_log.loaded(keys),
            Change::AuditWritten { dropped } => self.audit_log.written(dropped),
            Change::ClientToken { key, rec, pruned } => self.client_tokens.put(key, rec, pruned),
            Change::Drill(d) => {
                self.drills.insert(d.id.clone(), Versioned { value: *d, version });
            }
            Change::DrillRemoved(id) => {
                self.drills.remove(&id);
            }
            Change::DrillSwitch(s) => self.drill_switch = Some(Versioned { value: s, version }),
            Change::Deleted(d) => {
                self.deleted.insert(d.key(), *d);
            }
            Change::DeletedRemoved(key) => {
                self.deleted.remove(&key);
            }
            Change::Cas(hashes) => self.cas = hashes,
        }
    }

    /// The credential of host `ix` works while it is not revoked and the host not deregistered.
    fn index_credential(&mut self, ix: HostIx, host: &Host) {
        let works = host.status != HostStatus::Deregistered && host.credential_revoked_at_ms.is_none();
        if works {
            self.host_credentials.insert(host.credential_sha256.clone(), ix);
        } else if self.host_credentials.get(&host.credential_sha256) == Some(&ix) {
            self.host_credentials.remove(&host.credential_sha256);
        }
    }

    /// Notes the revision of a commit (one that changed records or not).
    pub(super) fn committed(&mut self, rev: Revision) {
        self.revision = self.revision.max(rev);
    }

    pub(super) fn revision(&self) -> Revision {
        self.revision
    }

    pub(super) fn pools(&self) -> &BTreeMap<PoolName, Versioned<Pool>> {
        &self.pools
    }

    pub(super) fn deleted(&self) -> &BTreeMap<String, super::deleted::Deleted> {
        &self.deleted
    }

    /// The hashes of the cluster CAs clients should trust, the active one first.
    pub(super) fn cas(&self) -> &[String] {
        &self.cas
    }

    pub(super) fn drills(&self) -> &BTreeMap<String, Versioned<Drill>> {
        &self.drills
    }

    pub(super) fn drill_switch(&self) -> Option<&Versioned<DrillSwitch>> {
        self.drill_switch.as_ref()
    }

    pub(super) fn hosts(&self) -> &[HostEntry] {
        &self.hosts
    }

    /// What the host's agent reported, to be written by the heartbeat path (its record and
    /// version stay read-only: they change through [`State::apply`]).
    pub(super) fn host_mut(&mut self, ix: HostIx) -> &mut HostEntry {
        &mut self.hosts[ix as usize]
    }

    pub(super) fn taskdefs(&self) -> &BTreeMap<(Family, u32), Versioned<Arc<TaskDefinition>>> {
        &self.taskdefs
    }

    pub(super) fn tasks(&self) -> &TaskTable {
        &self.tasks
    }

    pub(super) fn services(&self) -> &BTreeMap<ServiceName, Versioned<Service>> {
        &self.services
    }

    pub(super) fn incidents(&self) -> &IncidentTable {
        &self.incidents
    }

    pub(super) fn gpu_hosts(&self) -> &HashMap<GpuUuid, HostIx> {
        &self.gpu_hosts
    }

    pub(super) fn host_credentials(&self) -> &HashMap<String, HostIx> {
        &self.host_credentials
    }

    pub(super) fn api_tokens(&self) -> &HashMap<String, TokenRecord> {
        &self.api_tokens
    }

    /// The API token of an AWS access key id (`token create --aws`).
    pub(super) fn access_key(&self, id: &str) -> Option<&TokenRecord> {
        self.access_keys.get(id).and_then(|d| self.api_tokens.get(d))
    }

    pub(super) fn join_tokens(&self) -> &JoinDigests {
        &self.join_tokens
    }

    pub(super) fn admin(&self) -> &AdminDigest {
        &self.admin
    }

    pub(super) fn replacement_tokens(&self) -> &HashMap<String, String> {
        &self.replacement_tokens
    }

    pub(super) fn audit_log(&self) -> &AuditLog {
        &self.audit_log
    }

    pub(super) fn client_tokens(&self) -> &ClientTokens {
        &self.client_tokens
    }

    /// Records changes in a task's events (kept in memory only, not a record).
    pub(super) fn record_task(&mut self, id: &TaskId, now: u64, entries: Vec<TaskChange>) {
        self.tasks.record(id, now, entries);
    }

    /// Why a waiting task waits: derived, refreshed in memory on every placement retry, never
    /// committed. True when the reason changed.
    pub(super) fn set_pending_reason(
        &mut self,
        id: &TaskId,
        reason: &str,
        code: PendingCode,
        unplaceable: bool,
    ) -> bool {
        self.tasks.set_pending_reason(id, reason, code, unplaceable)
    }
}

/// The digests of an incident's replacement tokens, the one it holds and the earlier ones.
fn replacement_digests(i: &Incident) -> impl Iterator<Item = &String> {
    i.replacement.iter().flat_map(|b| std::iter::once(&b.token_sha256).chain(&b.earlier_token_sha256))
}

/// The window of the agent's local restart budget (its `restart_window`, 10 minutes): the
/// restarts within it count against the same `localDaemonRestarts`.
pub(super) const RESTART_WINDOW_MS: u64 = 600_000;
/// The most restarts a host entry remembers (a budget is a few per GPU).
const MAX_RECENT_REPAIRS: usize = 256;

/// The most replica exits a host remembers (`State::note_exit`).
pub(super) const RECENT_EXITS: usize = 64;
/// The most lost replicas remembered per service (`State::note_lost_replica`).
const MAX_LOST_REPLICAS: usize = 1024;
/// How long a lost replica waits for the start that replaces it (a service's reconcile follows
/// the stop within milliseconds; its crash-loop hold-back, 30 s, is the longest wait).
const LOST_REPLICA_TTL_MS: u64 = 60_000;

/// The most preemption notes a host keeps for the incident that may open about it.
pub(super) const PREEMPTION_NOTES: usize = 32;

/// A host's record and version, with what its agent last reported and the server's
/// evaluation of it (in memory only).
#[derive(Debug)]
pub(super) struct HostEntry {
    host: Host,
    version: Revision,
    pub(super) last_heartbeat_ms: Option<u64>,
    /// The agent's latest checks and logs address: reported on every heartbeat, kept in memory.
    /// The API builds the address (`https://PEER:PORT`) from the heartbeat's peer address and
    /// the port the agent reports: it is never a host the agent names.
    pub(super) checks: Vec<HostCheck>,
    /// `checks` as one run of bytes (`mpsfleet_types::check_key`): how a heartbeat that repeats them is
    /// told apart, cheaply and exactly. Set only with `checks`, by [`HostEntry::take_checks`].
    checks_key: Vec<u8>,
    /// The agent's number for `checks` (`checksRev`), when it gave one: a heartbeat that
    /// repeats this number with `checksUnchanged` means these checks.
    pub(super) checks_rev: Option<u64>,
    /// Whether every one of `checks` is OK and counts no failure (`firstFailureAgeMs`): then
    /// no task here shows a failure's first signal (`Reader::daemon_failing_since`), which a
    /// service's reconcile asks of each healthy replica. Set only with `checks`.
    pub(super) checks_clean: bool,
    /// When the heartbeat that carried `checks` arrived: the ages they carry count back from it.
    pub(super) checks_at_ms: Option<u64>,
    pub(super) logs_url: Option<String>,
    /// The hash of the certificate its `https://` logs endpoint serves, which is pinned.
    pub(super) logs_cert: Option<String>,
    /// The hashes of the CAs the agent reported trusting.
    pub(super) trusted_cas: Vec<String>,
    /// What each task uses of its GPU, as last reported.
    pub(super) gpu_use: Vec<TaskGpuUse>,
    /// The agent's heartbeat interval, as last reported.
    pub(super) heartbeat_ms: Option<u64>,
    /// The GPUs whose MPS daemon's failure is confirmed: reported IMPAIRED, and not yet
    /// answering again for good (its check still counts the failure, `firstFailureAgeMs`).
    pub(super) failed_daemons: std::collections::BTreeSet<GpuUuid>,
    /// Since when `failed_daemons` has not been empty (server clock): when the host's replicas
    /// on them left service discovery. Memory only.
    pub(super) failed_daemons_since_ms: Option<u64>,
    /// Preemptions made for replicas that replace ones lost on this host, not yet in an
    /// incident about it (time, words): the incident that opens records them at their time.
    /// Memory only; the newest [`PREEMPTION_NOTES`] are kept.
    pub(super) preemptions: Vec<(u64, String)>,
    /// Service replicas that exited here lately (GPU, service, time; `State::note_exit`).
    /// Memory only.
    pub(super) recent_exits: Vec<(GpuUuid, ServiceName, u64)>,
    /// Whether the agent accepts a drill's injected faults (`--allow-fault-injection`), as
    /// its last full heartbeat said.
    pub(super) accepts_faults: bool,
    /// The local restarts of each GPU's MPS daemon seen in the last [`RESTART_WINDOW_MS`]
    /// (server clock), those of failures already over included: an incident names the ones
    /// an earlier failure used of the agent's restart budget. Memory only.
    pub(super) recent_repairs: Vec<(GpuUuid, u64)>,
    /// The server's evaluation of those checks and of the heartbeats (derived, not stored).
    pub(super) health: mpsfleet_core::health::HostHealth,
    /// Whether `health` was evaluated from the current `checks` and `last_heartbeat_ms`.
    pub(super) evaluated: bool,
    /// The store revision of the last change to the tasks the agent should run; agents
    /// long-poll on it. Revisions only grow, so epochs stay monotonic across restarts.
    pub(super) epoch: u64,
}

impl HostEntry {
    /// The committed record.
    pub(super) fn host(&self) -> &Host {
        &self.host
    }

    /// The store version of the record.
    pub(super) fn version(&self) -> Revision {
        self.version
    }

    /// Takes a heartbeat's checks, copying them only when they changed; a heartbeat that
    /// repeats them by number (`checksUnchanged`) leaves them as they are.
    pub(super) fn take_checks(&mut self, report: &HostStatusReport, now: u64) {
        if report.checks_unchanged {
            return;
        }
        if !checks_key::matches(&report.checks, &self.checks_key) {
            checks_key::encode(&report.checks, &mut self.checks_key);
            self.checks = report.checks.clone();
            self.checks_clean = (self.checks.iter())
                .all(|c| c.status == mpsfleet_types::HealthStatus::Ok && c.first_failure_age_ms.is_none());
            self.note_repairs(now);
        }
        self.checks_rev = report.checks_rev;
        self.checks_at_ms = Some(now);
    }

    /// Keeps the local restarts the checks report (placed on the server's clock, each once)
    /// for [`RESTART_WINDOW_MS`].
    fn note_repairs(&mut self, now: u64) {
        self.recent_repairs.retain(|(_, at)| at + RESTART_WINDOW_MS > now);
        for c in self.checks.iter().filter(|c| c.name == mpsfleet_core::health::MPS_DAEMON) {
            let Some(gpu) = &c.gpu_id else { continue };
            for at in c.repair_ages_ms.iter().map(|age| now.saturating_sub(*age)) {
                // The same restart, reported again with an age that grew: within a heartbeat.
                let seen = self.recent_repairs.iter().any(|(g, t)| g == gpu && t.abs_diff(at) <= 2_000);
                if !seen && self.recent_repairs.len() < MAX_RECENT_REPAIRS {
                    self.recent_repairs.push((gpu.clone(), at));
                }
            }
        }
    }

    /// The local restarts of `gpu`'s daemon before `before_ms` within the restart window.
    pub(super) fn repairs_before(&self, gpu: &GpuUuid, before_ms: u64) -> Vec<u64> {
        let mut at: Vec<u64> = (self.recent_repairs.iter())
            .filter(|(g, t)| g == gpu && *t + 2_000 < before_ms && t + RESTART_WINDOW_MS > before_ms)
            .map(|(_, t)| *t)
            .collect();
        at.sort_unstable();
        at
    }

    /// Whether `checks` are the ones this entry holds.
    pub(super) fn checks_match(&self, checks: &[HostCheck]) -> bool {
        checks_key::matches(checks, &self.checks_key)
    }

    /// Whether a heartbeat that leaves its checks out means checks this entry holds.
    pub(super) fn holds_checks_of(&self, report: &HostStatusReport) -> bool {
        !report.checks_unchanged || (report.checks_rev.is_some() && report.checks_rev == self.checks_rev)
    }

    /// The checks a heartbeat reports: its own, or the ones it repeats by number.
    pub(super) fn reported_checks<'a>(&'a self, report: &'a HostStatusReport) -> &'a [HostCheck] {
        if report.checks_unchanged {
            &self.checks
        } else {
            &report.checks
        }
    }

    /// Keeps what a heartbeat reports besides its checks: where the agent serves logs (and
    /// with which certificate), whom it trusts, and what its tasks use of their GPUs.
    pub(super) fn keep_reported(&mut self, report: &HostStatusReport) {
        self.logs_url.clone_from(&report.logs_url);
        self.logs_cert.clone_from(&report.logs_cert_sha256);
        self.trusted_cas.clone_from(&report.trusted_ca_sha256);
        self.gpu_use.clone_from(&report.gpu_use);
        if report.heartbeat_ms.is_some() {
            self.heartbeat_ms = report.heartbeat_ms;
            self.accepts_faults = report.accepts_faults;
        }
    }
}
