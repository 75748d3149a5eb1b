//! The cluster: the server's in-memory state over the durable store.
//!
//! Every change follows one pattern: compute the new records, commit them to the store as one
//! batch with compare-and-swap on each record's version, and only then apply them in memory,
//! through [`State::apply`] (`state.rs`), the one writer of the records and their indexes.
//! So what the API acknowledges is on disk, and a crash between the two steps loses nothing:
//! at start-up the state is rebuilt from the store, and derived state (GPU usage, pending
//! queues, indexes) is recomputed from the records rather than stored.
//!
//! `Cluster` is the facade the API and the agents call: its operations live in rooms by what
//! they change (`hosts.rs`, `workloads.rs`, `services.rs`, `pools.rs`, `incidents.rs`,
//! `access.rs`), its queries on [`Reader`] beside them, loading and the controllers' pass in
//! `dispatch.rs`, and here what every room stands on: the one way to write
//! (`Cluster::write`, `Cluster::writing`), to read ([`Cluster::read`]) and to ask for a
//! controller's key. No room calls another's methods in a circle (`tests/architecture.rs`).

mod access;
mod agent_reports;
mod audit;
pub mod bounds;
pub mod broken;
mod call;
pub mod capacity_providers;
pub mod catalog;
pub mod console_links;
pub mod deleted;
pub mod drills;
pub mod error;
mod host_room;
mod hosts;
mod idempotency;
mod incident_table;
mod incidents;
mod intervals;
mod kinds;
mod local_fleet;
mod logs;
mod metrics;
mod workloads;
pub use idempotency::{CLIENT_TOKEN_TTL_MS, MAX_CLIENT_TOKENS, MAX_CLIENT_TOKEN_LEN};
pub use logs::AgentEndpoint;
mod operator;
mod place;
mod pools;
mod providers;
mod read;
pub use providers::ProviderContext;
use read::pool_config;
#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod catalog_tests;
pub(crate) mod controllers;
#[cfg(test)]
mod copies_tests;
#[cfg(test)]
mod daemon_tests;
#[cfg(test)]
mod drill_tests;
#[cfg(test)]
mod heartbeat_tests;
#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod recovery_tests;
mod register;
#[cfg(test)]
mod scaling_tests;
mod schema;
pub mod scope;
mod sealed;
mod secrets;
#[cfg(test)]
mod service_tests;
mod services;
mod state;
mod write;
mod write_tasks;
use state::{Change, HostEntry};
mod dispatch;
mod task_policy;
mod tasks;
mod tokens;
mod traffic;
mod work;
use access::{api_token, join_token, load_api_tokens, load_audit, load_join_tokens};
pub use tokens::{AdminDigest, AwsKey, JoinDigests, KeyValidity};

use hosts::*;
use idempotency::{Claim, Replay};
use incidents::*;
use pools::*;
use services::*;
use state::State;
use tokens::{join_token_record, new_join_index};
use work::Work;
use workloads::*;
use write::Writer;

pub use audit::{AuditContext, MAX_AUDIT_ENTRIES, MAX_AUDIT_LIST};

pub use error::Error;
pub use host_room::{GpuRoom, HostRoom};
pub use read::Reader;

/// How a host's agent stands, for the tasks on it ([`Cluster::agent_link`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLink {
    pub connected: bool,
    pub last_heartbeat_ms: Option<u64>,
    pub platform: HostPlatform,
}
pub use controllers::remediation::{
    replacement_name, ProviderJob, ProviderOutcome, RegistrationToken, INCIDENT_RESYNC_MS,
    REPLACEMENT_TOKEN_TTL_MS,
};
pub use controllers::retention::{
    MAX_RESOLVED_INCIDENTS, MAX_STOPPED_TASKS, RESOLVED_INCIDENT_RETENTION_MS, RETENTION_INTERVAL_MS,
    STOPPED_TASK_RETENTION_MS,
};
pub use operator::OperatorOutcome;
pub use register::{HostRequest, RegistrationQueue, ValidTaskDef, Waiting};
pub use schema::SCHEMA_VERSION;
pub use scope::{Kind, Touch};
pub use secrets::{secret_uses, SecretUse, MAX_SECRETS};
pub use write::{FEED_MAX_AGE_MS, FEED_MAX_BYTES, FEED_MAX_REVISIONS};

use crate::auth::{self, Principal};
use crate::provider::{CapacityProvider, ExecConfig, ExecProvider, LaunchRequest, LocalProvider};
use mpsfleet_core::clock::Clock;
use mpsfleet_core::lifecycle::host as host_lifecycle;
use mpsfleet_core::lifecycle::task as task_lifecycle;
use mpsfleet_core::scheduler::{GpuSpec, HostIx, HostSpec, Placement, Scheduler};
use mpsfleet_store::{decode, Op, Precondition, Revision, Store};
use mpsfleet_types::api::{Assignments, HostStatusAnswer, HostStatusReport};
use mpsfleet_types::labels::TaskLabels;
use mpsfleet_types::policy::ProviderKind;
use mpsfleet_types::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kinds::{AUTH, HOST, POOL, SERVICE, TASK, TASKDEF};
use write_tasks::{Batch, NewTasks};

/// The most tasks one `task run` may start.
pub const MAX_RUN_COUNT: u32 = 10_000;
pub use controllers::services::{SERVICE_RESTART_BURST, SERVICE_RESTART_WINDOW_MS};

/// The most replicas a service may ask for.
pub const MAX_DESIRED_COUNT: u32 = 10_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct AuthRecord {
    sha256: String,
}

/// A record and the store version it was read or written at.
#[derive(Debug, Clone)]
struct Versioned<T> {
    value: T,
    version: Revision,
}

#[derive(Debug)]
struct TaskEntry {
    task: Task,
    version: Revision,
    /// Creation order, for FIFO pending queues and stable listings.
    seq: u64,
    /// Where the scheduler accounted it, while it holds capacity.
    placement: Option<Placement>,
    /// What happened to it (placed, started, probe failed, ...), compact (the words come from
    /// the record when shown): kept in memory only, so a restarted server or a new leader
    /// knows a task's events from then on.
    events: History<mpsfleet_core::changes::TaskChange>,
}

/// Stops `t` without its agent (its host is gone, or was stopped with it): a forced stop applies
/// in every state.
fn force_stop(t: &mut Task) {
    if let Err(e) = task_lifecycle::apply(t, task_lifecycle::Event::ForcedStop) {
        tracing::error!(task.id = %t.id, "a forced stop was refused: {e}");
    }
}

/// A task run's labels (ECS's `overrides`, `startedBy`, `group`, `tags`), checked against ECS's
/// limits and the run's definition; None when it gave none.
fn run_labels(req: &RunTask, td: &TaskDefinition) -> Result<Option<Box<TaskLabels>>, Error> {
    use mpsfleet_types::labels::{check_tags, MAX_GROUP, MAX_STARTED_BY};
    let invalid = |(f, m): (String, String)| Error::invalid(f, m);
    let text = |field: &str, v: &Option<String>, max: usize| match v {
        Some(s) if s.is_empty() || s.chars().count() > max || s.chars().any(char::is_control) => {
            Err(Error::invalid(field, format!("must be 1 to {max} printable characters")))
        }
        _ => Ok(()),
    };
    text("startedBy", &req.started_by, MAX_STARTED_BY)?;
    text("group", &req.group, MAX_GROUP)?;
    check_tags("tags", &req.tags).map_err(invalid)?;
    if let Some(o) = &req.overrides {
        o.check(td).map_err(invalid)?;
    }
    let labels = TaskLabels {
        overrides: req.overrides.clone().filter(|o| !o.container_overrides.is_empty()),
        started_by: req.started_by.clone(),
        group: req.group.clone(),
        tags: req.tags.clone(),
        protected_until_ms: None,
    };
    Ok((!labels.is_empty()).then(|| Box::new(labels)))
}

/// What the API returned for one run request.
#[derive(Debug)]
pub struct RunOutcome {
    pub tasks: Vec<Task>,
    pub placed: u32,
    pub pending: u32,
}

/// The whole control-plane state. Callers serialise access (one writer at a time).
pub struct Cluster {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// When this process loaded the state. Heartbeats live in memory only, so a host's
    /// heartbeat grace runs from here (or its registration, if later): a restarted server
    /// waits for the agents instead of declaring every host silent since it registered.
    loaded_at_ms: u64,
    /// The records and their indexes, written only by `State::apply` (`state.rs`).
    state: state::State,
    sched: Scheduler,
    /// The controllers: their work queue and what they keep between runs (`work.rs`).
    work: dispatch::Controllers,
    /// The metrics' counters and histograms (`crate::metrics`), shared with the API layer.
    live: Arc<crate::metrics::Live>,
    /// The credentials that are not records: the server key, launch tokens (`tokens.rs`).
    creds: tokens::Credentials,
    /// The API call being served: what it adds to its first commit (`call.rs`).
    call: call::ServedCall,
    /// The pools' capacity providers (`providers.rs`).
    providers: providers::Providers,
    /// Task ids count up from a random base chosen at load (`next_task_id`).
    ids: write::TaskIds,
    /// When each retained revision of the change feed was written, and its size (compaction).
    feed: write::FeedLedger,
    /// Console sign-in links not yet used, by their code's digest (memory only).
    console_links: HashMap<String, console_links::PendingLink>,
    /// Where committed changes are announced (`GET /v1/events`, the webhook).
    events: crate::events::Events,
    /// The last output snapshot of each task, in memory (see `logs.rs`).
    output: logs::LogSnapshots,
    /// A deliberate bug a test turned on (`broken.rs`); off everywhere else.
    broken: broken::Switch,
}

/// Tokens created at first start, to be shown once.
pub struct FirstStart {
    pub admin_token: String,
    pub join_token: String,
}

impl Cluster {
    // ---- auth ---------------------------------------------------------------------------

    pub fn authenticate(&self, token: &str) -> Result<Principal, Error> {
        self.authenticate_digest(&auth::digest(token))
    }

    /// [`Cluster::authenticate`] for a token whose digest the caller computed (outside the lock).
    pub fn authenticate_digest(&self, d: &str) -> Result<Principal, Error> {
        if self.state.admin().is(d) {
            Ok(Principal::Admin)
        } else if join_token(&self.state, d)? {
            Ok(Principal::Joiner)
        } else if let Some(&h) = self.state.host_credentials().get(d) {
            Ok(Principal::Host(self.state.hosts()[h as usize].host().id.clone()))
        } else if let Some(incident) = replacement_incident(&self.read(), d)? {
            Ok(Principal::Replacement(incident))
        } else if let Some(p) = api_token(&self.read(), d)? {
            Ok(p)
        } else if let Some(p) = self.creds.conformance_principal(d) {
            Ok(p)
        } else if let Some((pool, name)) = self.creds.launch_tokens.get(d) {
            Ok(Principal::Launch { pool: pool.clone(), name: name.clone() })
        } else {
            Err(Error::Unauthorized("unknown token"))
        }
    }

    // ---- the one way to write ---------------------------------------------------------

    /// Commits `ops` and applies `changes` at its revision (`Writer::write`): the one way a
    /// request writes, with the call's riders on its commit.
    fn write(&mut self, ops: &[Op], changes: impl IntoIterator<Item = Change>) -> Result<Revision, Error> {
        self.writing(|w| w.write(ops, changes))
    }

    /// Runs `f` with the one way to write records (`write.rs`), the call being served riding
    /// on its first commit: its audit entry and the client token it claimed (`call.rs`).
    fn writing<R>(&mut self, f: impl FnOnce(&mut write::Writer<'_>) -> Result<R, Error>) -> Result<R, Error> {
        let mut call = std::mem::take(&mut self.call);
        let result = call.riders(&self.read()).and_then(|(riders, audit)| {
            let had = !riders.is_empty();
            let mut w = self.writer();
            w.riders = riders;
            let result = f(&mut w);
            if had && w.riders.is_empty() {
                call.riders_written(&mut w, audit);
            }
            result
        });
        self.call = call;
        result
    }

    /// The one way to write records (`write.rs`), with no riders: a controller's.
    fn writer(&mut self) -> write::Writer<'_> {
        write::Writer {
            store: self.store.as_ref(),
            state: &mut self.state,
            feed: &mut self.feed,
            live: &self.live,
            events: &self.events,
            sched: &mut self.sched,
            queue: &mut self.work.queue,
            wake: &mut self.work.wake,
            health_due_ms: &mut self.work.health_due_ms,
            breaker_counts: &mut self.work.breaker_counts,
            failed_daemon_hosts: &self.work.failed_daemon_hosts,
            ids: &mut self.ids,
            loaded_at_ms: self.loaded_at_ms,
            local_runs_images: providers::local_runs_images(self.providers.ctx.as_ref()),
            riders: Vec::new(),
            now_ms: self.clock.now_ms(),
        }
    }

    /// What requests read beyond single records (`read.rs`).
    pub fn read(&self) -> Reader<'_> {
        read::Reader {
            state: &self.state,
            sched: &self.sched,
            failed_daemon_hosts: &self.work.failed_daemon_hosts,
            loaded_at_ms: self.loaded_at_ms,
            now_ms: self.clock.now_ms(),
        }
    }

    /// A controller's context (`controllers/`): the writer and the time, borrowed from the
    /// cluster's fields.
    fn controller_ctx(&mut self) -> controllers::Ctx<'_> {
        let w = self.writer();
        let now_ms = w.now_ms;
        controllers::Ctx { w, now_ms }
    }

    /// Where committed changes are announced from now on.
    pub fn set_events(&mut self, events: crate::events::Events) {
        self.events = events;
    }

    pub fn events(&self) -> &crate::events::Events {
        &self.events
    }

    /// The server's key, from which agent and launch tokens are derived (`server.key`).
    pub fn set_server_key(&mut self, key: auth::ServerKey) {
        self.creds.key = key;
    }

    pub(crate) fn server_key(&self) -> &auth::ServerKey {
        &self.creds.key
    }

    /// Loads the hashes of the cluster's CAs (`tls::CaSet::hashes`, read from their records
    /// with the server key) when the server serves HTTPS, the active one first: the tokens
    /// launched hosts join with carry the first, so their agents trust this cluster's servers
    /// and no other; heartbeat answers carry all, so agents follow a CA rotation.
    pub fn set_cluster_cas(&mut self, hashes: Vec<String>) {
        let rev = self.state.revision();
        self.state.apply(rev, Change::Cas(hashes));
    }

    /// Commits a CA rotation's step (`ops`, the TLS CA records) with the audit entry of the
    /// API call being served, and applies the CAs it leaves (`cas`, their hashes).
    pub(crate) fn write_cas(&mut self, ops: &[Op], cas: Vec<String>) -> Result<(), Error> {
        self.write(ops, [Change::Cas(cas)]).map(|_| ())
    }

    /// The one-time token a host launched to keep `pool` at its size joins with: derived
    /// from the pool and the host's name, so that a restarted server that launches the same
    /// name again (providers launch by name idempotently) hands out the same token.
    /// `secret` as a host joins with it: with the cluster CA's hash after it when the server
    /// serves HTTPS ([`mpsfleet_client::tls::pinned`]).
    pub fn join_string(&self, secret: &str) -> String {
        match self.state.cas().first() {
            Some(hash) => mpsfleet_client::tls::pinned(secret, hash),
            None => secret.to_string(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }
}

/// A host's assignments with the definitions shared, as [`Cluster::shared_assignments`] gives
/// them.
pub struct HostAssignments {
    /// The host's change epoch.
    pub epoch: u64,
    pub tasks: Vec<Task>,
    pub definitions: Vec<Arc<TaskDefinition>>,
    /// The host's pool lets process tasks run as the `user` their definition names.
    pub allow_task_users: bool,
}

/// Filters of `GET /v1/tasks`.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub pool: Option<String>,
    pub service: Option<String>,
    pub host: Option<String>,
    pub status: Option<TaskStatus>,
    pub limit: usize,
    /// Leave out this many first (paging).
    pub skip: usize,
    pub newest_first: bool,
    /// Leave out STOPPED tasks.
    pub live: bool,
}

/// Whether a host may receive new placements: ACTIVE, not cordoned, and healthy (an impaired
/// host, or one whose agent has gone quiet, gets nothing new).
pub fn can_place(h: &Host) -> bool {
    mpsfleet_core::lifecycle::host::can_place(h)
}

fn taskdef_key(family: &Family, revision: u32) -> String {
    format!("{family}:{revision:010}")
}

impl Cluster {
    /// Turns a deliberate bug on (tests only; see the module's documentation).
    pub fn break_for_tests(&mut self, broken: broken::Broken) {
        tracing::warn!(?broken, "this server breaks a promise on purpose (a test switch)");
        self.broken = match broken {
            broken::Broken::StaleReads => {
                let mut all: Vec<&TaskEntry> = self.state.tasks().values().collect();
                all.sort_by_key(|e| e.seq);
                broken::Switch::StaleReads(all.into_iter().map(|e| e.task.clone()).collect())
            }
            broken::Broken::LostStops => broken::Switch::LostStops,
        };
    }
}

impl Cluster {
    /// Makes new task ids a pure function of `base` and the order in which tasks are created,
    /// instead of a random base chosen at load. Ids already taken are skipped as usual.
    pub fn reseed_task_ids(&mut self, base: u64) {
        self.ids = write::TaskIds { base, counter: 0 };
    }
}

impl Cluster {
    /// The state's figures now, by pool (`metrics.rs`).
    pub fn metrics_state(&self) -> crate::metrics::State {
        metrics::figures(&self.read(), &self.work.scaling)
    }

    /// The counters and histograms this cluster feeds; the API layer shares them.
    pub fn live_metrics(&self) -> Arc<crate::metrics::Live> {
        self.live.clone()
    }
}

impl<'a> Reader<'a> {
    /// The cluster clock's time, in ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The hosts that may still call the server (not deregistered, credential not revoked)
    /// whose agents have not reported that they trust the CA `hash`.
    pub fn hosts_not_trusting(&self, hash: &str) -> Vec<String> {
        self.state
            .hosts()
            .iter()
            .filter(|e| {
                e.host().status != HostStatus::Deregistered && e.host().credential_revoked_at_ms.is_none()
            })
            .filter(|e| !e.trusted_cas.iter().any(|h| h.eq_ignore_ascii_case(hash)))
            .map(|e| e.host().id.to_string())
            .collect()
    }

    pub fn revision(&self) -> Revision {
        self.state.revision()
    }
}

impl Cluster {
    /// Closes host `ix`'s GPUs whose daemon does not answer to new MPS tasks, and those in
    /// `refused` (`HostHealth::close_mps_gpus`).
    fn close_mps_gpus(&mut self, ix: HostIx, refused: &[mpsfleet_core::scheduler::GpuIx]) {
        let mut health = std::mem::take(&mut self.work.health);
        health.close_mps_gpus(&mut self.writer(), ix, refused);
        self.work.health = health;
    }

    /// Asks for `work` on behalf of a request that changed it: the controllers' pass runs at
    /// once, outside the request ([`Cluster::take_wake`]), so the request's answer never waits
    /// for a reconcile and the change does not wait for the next tick.
    fn ask_now(&mut self, work: Work) {
        self.work.wake = true;
        self.ask(work);
    }

    /// Asks for `work` to run at the next pass.
    fn ask(&mut self, work: Work) {
        self.writer().ask(work);
    }

    /// Asks for the capacity of every pool with a provider (the resync's safety net).
    fn ask_capacity_everywhere(&mut self) {
        let pools: Vec<PoolName> = self.state.pools().keys().cloned().collect();
        for p in pools {
            self.ask_capacity(&p);
        }
    }

    /// Asks for the pool's capacity when it has a provider.
    fn ask_capacity(&mut self, pool: &PoolName) {
        if self.has_provider(pool) {
            self.ask(Work::Capacity(pool.clone()));
        }
    }
}

impl Cluster {
    fn has_provider(&self, pool: &PoolName) -> bool {
        self.providers.built.contains_key(pool)
            || self.state.pools().get(pool).is_some_and(|p| p.value.provider.is_some())
    }
}

impl Cluster {
    /// Runs `first` on `req` unless `token` (taken from it) names an earlier call by `actor`
    /// on `route` (the first argument) with the same request: then answers that call again with `again`. The
    /// token goes in the first commit `first` makes (see the module's doc).
    fn idempotent<R: Serialize, T>(
        &mut self,
        (actor, route, token): (&str, &str, Option<String>),
        req: R,
        replay: Replay,
        first: impl FnOnce(&mut Self, R) -> Result<T, Error>,
        again: impl FnOnce(&Self, Replay) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let Some(token) = token else { return first(self, req) };
        let mut call = std::mem::take(&mut self.call);
        let claim = call.claim_client_token(&self.read(), actor, route, &token, &req, replay);
        self.call = call;
        let out = match claim {
            Ok(Claim::First) => first(self, req),
            Ok(Claim::Retry(replay)) => again(self, replay),
            Err(e) => Err(e),
        };
        self.call.release_client_token();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_core::clock::ManualClock;
    use mpsfleet_core::health::{evaluate, HealthInput};
    use std::time::Duration;

    fn report(status: HealthStatus, since_ms: u64) -> HostStatusReport {
        HostStatusReport {
            onboarded: true,
            checks: vec![HostCheck {
                name: "MPS_DAEMON".into(),
                gpu_id: Some(GpuUuid::new("GPU-00000000-0000").unwrap()),
                status,
                reason: format!("daemon {}", status.as_str()),
                since_ms,
                restarts: 0,
                first_failure_age_ms: None,
                repair_ages_ms: Vec::new(),
            }],
            checks_rev: None,
            checks_unchanged: false,
            logs_url: None,
            logs_cert_sha256: None,
            trusted_ca_sha256: Vec::new(),
            gpu_use: Vec::new(),
            heartbeat_ms: None,
            accepts_faults: false,
        }
    }

    /// Heartbeats applied without a commit (the same checks again, or new ones that keep the
    /// host OK) leave the health a full evaluation gives, and those that change it commit.
    #[test]
    fn every_heartbeat_leaves_the_health_a_full_evaluation_gives() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store, clock.clone(), |_| Ok(())).unwrap();
        c.create_pool(CreatePool { name: "p".into(), ..Default::default() }).unwrap();
        let reg = HostRegistration {
            pool: PoolName::new("p").unwrap(),
            hostname: "h".into(),
            gpus: vec![GpuInventory::emulated_h200(GpuUuid::new("GPU-00000000-0000").unwrap(), 0)],
            mps_available: true,
            emulated: true,
            runtime: Default::default(),
            runtime_version: None,
            plugins: Default::default(),
            platform: Default::default(),
        };
        let host = c.register_host(reg).unwrap().host_id;
        c.host_status(&host, &report(HealthStatus::Ok, 5)).unwrap();
        let policy = HealthPolicy::default();
        let steps = [
            (HealthStatus::Ok, 5, false),
            (HealthStatus::Ok, 5, false),
            (HealthStatus::Ok, 7, false),
            (HealthStatus::Impaired, 9, true),
            (HealthStatus::Impaired, 9, false),
            (HealthStatus::Ok, 11, true),
            (HealthStatus::Ok, 11, false),
        ];
        for (i, (status, since, commits)) in steps.into_iter().enumerate() {
            clock.advance(Duration::from_secs(1));
            let now = clock.now_ms();
            let r = report(status, since);
            let before = c.state.hosts()[0].health.clone();
            let input = HealthInput {
                checks: &r.checks,
                last_heartbeat_ms: Some(now),
                registered_at_ms: c.state.hosts()[0].host().registered_at_ms,
                reported_at_ms: Some(now),
            };
            let expected = evaluate(&before, &input, &policy, now);
            let rev = c.read().revision();
            c.host_status(&host, &r).unwrap();
            assert_eq!(c.state.hosts()[0].health, expected, "step {i}");
            assert_eq!(c.state.hosts()[0].host().health_status, expected.status, "step {i}");
            assert_eq!(c.read().revision() != rev, commits, "step {i}");
            // The health tick finds nothing to change either.
            c.health_tick().unwrap();
            assert_eq!(c.state.hosts()[0].health, expected, "step {i}, after the tick");
        }
    }
}
