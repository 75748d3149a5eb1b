//! The cluster: the server's in-memory state over the durable store.
//!
//! Every change follows one pattern: compute the new records, commit them to the store as one
//! batch with compare-and-swap on each record's version, and only then apply them in memory,
//! through [`State::apply`] (`state.rs`), the one writer of the records and their indexes.
//! So what the API acknowledges is on disk, and a crash between the two steps loses nothing:
//! at start-up the state is rebuilt from the store, and derived state (GPU usage, pending
//! queues, indexes) is recomputed from the records rather than stored.

mod agent_reports;
mod audit;
pub mod bounds;
pub mod broken;
mod call;
pub mod capacity_providers;
pub mod catalog;
pub mod console_links;
pub mod deleted;
mod discovery;
pub mod drills;
pub mod error;
mod health;
mod idempotency;
mod incident_table;
mod intervals;
mod introspect;
mod kinds;
mod local_fleet;
mod logs;
mod metrics;
pub use idempotency::{CLIENT_TOKEN_TTL_MS, MAX_CLIENT_TOKENS, MAX_CLIENT_TOKEN_LEN};
pub use logs::AgentEndpoint;
mod operator;
mod place;
mod pools;
mod protection;
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
mod daemon_tests;
#[cfg(test)]
mod drill_tests;
#[cfg(test)]
mod heartbeat_tests;
#[cfg(test)]
mod recovery_tests;
mod register;
mod scaling;
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
pub use tokens::{AdminDigest, AwsKey, JoinDigests};
use work::Work;

pub use audit::{AuditContext, MAX_AUDIT_ENTRIES, MAX_AUDIT_LIST};

pub use error::Error;

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
use mpsfleet_types::api::{
    Assignments, HostStatusAnswer, HostStatusReport, RegisterHostResponse, RegisterTaskDefResponse,
};
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
    /// The hashes of the cluster CAs clients should trust, the active one first (empty for a
    /// plain-HTTP server): join strings carry the first, heartbeat answers all of them.
    cluster_cas: Vec<String>,
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
    /// Loads the state from the store, creating the admin and join tokens on first start.
    /// On first start, `keep_tokens` is called with the new tokens before their digests are
    /// committed, so that a crash in between cannot leave a token nobody knows.
    pub fn load(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        keep_tokens: impl FnOnce(&FirstStart) -> Result<(), Error>,
    ) -> Result<Cluster, Error> {
        Self::migrate(store.as_ref())?;
        let admin_sha256 = match store.get(AUTH, "admin")? {
            Some(a) => decode::<AuthRecord>(&a)?.sha256,
            None => {
                let admin_token = auth::new_token("mpsf_adm_")?;
                let join_token = auth::new_token("mpsf_join_")?;
                let a = auth::digest(&admin_token);
                let join = Self::join_token_record(
                    clock.now_ms(),
                    auth::digest(&join_token),
                    &Default::default(),
                    "first start",
                )?;
                keep_tokens(&FirstStart { admin_token, join_token })?;
                store.commit(&[
                    Op::put_json(AUTH, "admin", &AuthRecord { sha256: a.clone() }, Precondition::Any)?,
                    Op::put_json(tokens::JOIN_TOKEN, &join.view.id, &join, Precondition::Absent)?,
                ])?;
                a
            }
        };
        // The one join token of a data dir made before join tokens expired: it becomes a join
        // token that expires a day from now (run `mpsfleet join-token create` for another).
        if let Some(j) = store.get(AUTH, "join")? {
            let sha256 = decode::<AuthRecord>(&j)?.sha256;
            let join = Self::join_token_record(clock.now_ms(), sha256, &Default::default(), "first start")?;
            store.commit(&[
                Op::put_json(tokens::JOIN_TOKEN, &join.view.id, &join, Precondition::Absent)?,
                Op::delete(AUTH, "join", Precondition::Version(j.version)),
            ])?;
            tracing::warn!(token.id = %join.view.id, "the data dir's join token now expires in a day");
        }
        let join_clock = clock.clone();
        let mut c = Cluster {
            state: state::State::new(
                tokens::AdminDigest::new(admin_sha256),
                Self::new_join_index(join_clock),
            ),
            feed: write::FeedLedger::default(),
            store,
            loaded_at_ms: clock.now_ms(),
            clock,
            sched: Scheduler::new(),
            work: Default::default(),
            live: Arc::default(),
            providers: Default::default(),
            creds: tokens::Credentials {
                key: auth::ServerKey::random()?,
                launch_tokens: HashMap::new(),
                conformance: None,
            },
            cluster_cas: Vec::new(),
            call: Default::default(),
            ids: write::TaskIds { base: auth::random_u64()?, counter: 0 },
            events: crate::events::Events::default(),
            console_links: HashMap::new(),
            output: logs::LogSnapshots::default(),
            broken: broken::Switch::Off,
        };
        let rev = c.store.revision()?;
        c.state.committed(rev);
        c.rebuild()?;
        // The feed's revisions from before this load count as written now (their sizes are
        // unknown): they age out of the feed like new ones.
        let (rev, now) = (c.state.revision(), c.now());
        c.feed.record(rev, now, 0);
        // Capacity may have changed since the tasks waited (or a crash came between a stop and
        // the retry): place what fits and refresh the reasons of the rest.
        c.resync()?;
        Ok(c)
    }

    fn rebuild(&mut self) -> Result<(), Error> {
        for r in self.store.list(POOL)? {
            let pool: Pool = decode(&r)?;
            self.sched.upsert_pool(pool.name.as_str(), pool_config(&pool));
            self.state.apply(r.version, Change::Pool(pool));
        }
        let mut hosts: Vec<Versioned<Host>> = Vec::new();
        for r in self.store.list(HOST)? {
            hosts.push(Versioned { value: decode(&r)?, version: r.version });
        }
        // Registration order keeps placement decisions the same after a restart.
        hosts.sort_by_key(|h| h.value.seq);
        for h in hosts {
            self.index_host(h.value, h.version)?;
        }
        for r in self.store.list(TASKDEF)? {
            let td: TaskDefinition = decode(&r)?;
            self.state.apply(r.version, Change::TaskDef(Arc::new(td)));
        }
        self.load_incidents()?;
        self.load_drills()?;
        self.load_api_tokens()?;
        self.load_join_tokens()?;
        self.load_audit()?;
        self.load_client_tokens()?;
        self.load_deleted()?;
        for r in self.store.list(SERVICE)? {
            let svc: Service = decode(&r)?;
            self.sched.group(svc.name.as_str());
            self.state.apply(r.version, Change::Service(svc));
        }
        let mut tasks: Vec<(Task, Revision)> = Vec::new();
        for r in self.store.list(TASK)? {
            tasks.push((decode(&r)?, r.version));
        }
        tasks.sort_by_key(|(t, _)| (t.created_at_ms, t.id));
        for (task, version) in tasks {
            let placement = if task.holds_capacity() {
                place::placement_of(&self.state, &self.sched, &task)
            } else {
                None
            };
            if let Some(p) = &placement {
                let req = place::request_for(&self.state, &mut self.sched, &task)?;
                self.sched.reserve(&req, p);
            }
            self.writer().insert_task(task, version, placement, false);
        }
        Ok(())
    }

    // ---- auth ---------------------------------------------------------------------------

    pub fn authenticate(&self, token: &str) -> Result<Principal, Error> {
        self.authenticate_digest(&auth::digest(token))
    }

    /// [`Cluster::authenticate`] for a token whose digest the caller computed (outside the lock).
    pub fn authenticate_digest(&self, d: &str) -> Result<Principal, Error> {
        if self.state.admin().is(d) {
            Ok(Principal::Admin)
        } else if self.join_token(d)? {
            Ok(Principal::Joiner)
        } else if let Some(&h) = self.state.host_credentials().get(d) {
            Ok(Principal::Host(self.state.hosts()[h as usize].host().id.clone()))
        } else if let Some(incident) = self.replacement_incident(d)? {
            Ok(Principal::Replacement(incident))
        } else if let Some(p) = self.api_token(d)? {
            Ok(p)
        } else if let Some(p) = self.conformance_principal(d) {
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
        let (riders, audit) = self.riders()?;
        let had = !riders.is_empty();
        let mut w = self.writer();
        w.riders = riders;
        let result = f(&mut w);
        let rode = had && w.riders.is_empty();
        drop(w);
        if rode {
            self.riders_written(audit);
        }
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
    fn reader(&self) -> read::Reader<'_> {
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

    pub fn revision(&self) -> Revision {
        self.state.revision()
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

    /// The hashes of the cluster's CAs (`tls::CaSet::hashes`), the active one first: the
    /// tokens launched hosts join with carry the first, so their agents trust this cluster's
    /// servers and no other; heartbeat answers carry all, so agents follow a CA rotation.
    pub fn set_cluster_cas(&mut self, hashes: Vec<String>) {
        self.cluster_cas = hashes;
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

    /// Commits `ops`, which change state kept outside the cluster's own objects (the TLS CA
    /// records), with the audit entry of the API call being served.
    pub(crate) fn commit_ops(&mut self, ops: &[Op]) -> Result<(), Error> {
        self.write(ops, []).map(|_| ())
    }

    /// The bearer the server presents to a host's agent: derived from the host id under the
    /// server's key, so that it is stored nowhere on the server. A host registered by an older
    /// server keeps the token that server stored (`legacy`).
    fn agent_token(&self, host: &HostId, legacy: &str) -> String {
        if legacy.is_empty() {
            self.creds.key.derive("mpsf_agent_", "agent", &[host.as_str()])
        } else {
            legacy.to_string()
        }
    }

    /// The one-time token a host launched to keep `pool` at its size joins with: derived
    /// from the pool and the host's name, so that a restarted server that launches the same
    /// name again (providers launch by name idempotently) hands out the same token.
    /// `secret` as a host joins with it: with the cluster CA's hash after it when the server
    /// serves HTTPS ([`mpsfleet_client::tls::pinned`]).
    pub fn join_string(&self, secret: &str) -> String {
        match self.cluster_cas.first() {
            Some(hash) => mpsfleet_client::tls::pinned(secret, hash),
            None => secret.to_string(),
        }
    }

    pub(super) fn mint_launch_token(&mut self, pool: &PoolName, name: &str) -> RegistrationToken {
        let token = self.creds.key.derive("mpsf_launch_", "launch", &[pool.as_str(), name]);
        self.creds.launch_tokens.insert(auth::digest(&token), (pool.clone(), name.to_string()));
        RegistrationToken(token)
    }

    /// Provider calls decided during the last API calls, for the caller to run.
    pub fn take_jobs(&mut self) -> Vec<ProviderJob> {
        std::mem::take(&mut self.work.pending_jobs)
    }

    /// The cluster clock's time, in ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.now()
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    // ---- pools --------------------------------------------------------------------------

    // ---- task definitions ---------------------------------------------------------------

    /// Parses and registers a definition. The API parses before it takes the cluster lock and
    /// calls [`Cluster::register_valid_taskdef`].
    pub fn register_taskdef(&mut self, body: &[u8]) -> Result<RegisterTaskDefResponse, Error> {
        self.register_valid_taskdef(ValidTaskDef::parse(body)?)
    }

    /// The newest revision of `family`, deregistered or not: the next one registered follows it.
    fn latest_revision(&self, family: &Family) -> Option<u32> {
        self.state
            .taskdefs()
            .range((family.clone(), 0)..=(family.clone(), u32::MAX))
            .next_back()
            .map(|((_, r), _)| *r)
    }

    /// The newest revision of `family` still registered.
    fn latest_active_revision(&self, family: &Family) -> Option<u32> {
        self.state
            .taskdefs()
            .range((family.clone(), 0)..=(family.clone(), u32::MAX))
            .rev()
            .find(|(_, v)| v.value.deregistered_at_ms.is_none())
            .map(|((_, r), _)| *r)
    }

    /// [`Cluster::taskdef`] for a new task or deployment: a deregistered revision starts
    /// nothing new.
    pub(super) fn taskdef_to_run(&self, field: &str, reference: &str) -> Result<&TaskDefinition, Error> {
        let td = self.taskdef(field, reference)?;
        if td.deregistered_at_ms.is_some() {
            return Err(Error::invalid(
                field,
                format!("{} is deregistered (INACTIVE): register a new revision", td.reference()),
            ));
        }
        Ok(td)
    }

    /// Resolves `family` (latest revision) or `family:revision`.
    pub fn taskdef(&self, field: &str, reference: &str) -> Result<&TaskDefinition, Error> {
        let (family, revision) = match reference.rsplit_once(':') {
            Some(_) => {
                let r = TaskDefRef::parse(reference).map_err(|e| Error::invalid(field, e.to_string()))?;
                (r.family, Some(r.revision))
            }
            None => (Family::new(reference).map_err(|e| Error::invalid(field, e.to_string()))?, None),
        };
        let revision = revision.or_else(|| self.latest_active_revision(&family));
        revision
            .and_then(|r| self.state.taskdefs().get(&(family.clone(), r)))
            .map(|v| v.value.as_ref())
            .ok_or_else(|| Error::not_found("task definition", reference))
    }

    /// The definitions (of `family`), shared: the caller encodes them after the lock.
    pub fn taskdefs(&self, family: Option<&str>) -> Vec<Arc<TaskDefinition>> {
        self.state
            .taskdefs()
            .values()
            .filter(|v| family.is_none_or(|f| v.value.family.as_str() == f))
            .map(|v| v.value.clone())
            .collect()
    }

    // ---- hosts --------------------------------------------------------------------------

    /// Registers one host for the join token. The API checks and mints before it takes the
    /// cluster lock ([`HostRequest::new`]) and registers concurrent hosts with one commit
    /// ([`Cluster::register_hosts`]).
    pub fn register_host(&mut self, reg: HostRegistration) -> Result<RegisterHostResponse, Error> {
        let req = HostRequest::new(reg)?;
        self.register_hosts(vec![(Principal::Joiner, req)])
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a registration went unanswered".into())))
    }

    /// Registers one host with `token` as its bearer (the join token, or an incident's
    /// one-time replacement token), as `POST /v1/agent/register` does.
    pub fn register_host_with_token(
        &mut self,
        reg: HostRegistration,
        token: &str,
    ) -> Result<RegisterHostResponse, Error> {
        let who = self.authenticate(token)?;
        if !who.may_join() {
            return Err(Error::Forbidden("this token cannot register hosts".into()));
        }
        let req = HostRequest::new(reg)?;
        self.register_hosts(vec![(who, req)])
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a registration went unanswered".into())))
    }

    /// One registration by `who`: its checks against the state and against the earlier
    /// registrations of its group commit (`batch`), and the host record it makes. The checks
    /// that need no state are in [`HostRequest::new`], done before the lock.
    fn admit_host(
        &self,
        who: &Principal,
        req: HostRequest,
        batch: &register::HostBatch,
    ) -> Result<(Host, RegisterHostResponse), Error> {
        let pool = self.pool_name("pool", req.reg.pool.as_str())?;
        if let Principal::Launch { pool: launched_into, name } = who {
            if launched_into != &pool || name != &req.reg.hostname {
                return Err(Error::Forbidden(format!(
                    "this launch token registers host {name} into pool {launched_into}, not host {} into pool {pool}",
                    req.reg.hostname
                )));
            }
            if self.state.hosts().iter().any(|h| &h.host().hostname == name) || batch.claims_hostname(name) {
                return Err(Error::Unauthorized("this launch token was already used"));
            }
        }
        for g in &req.reg.gpus {
            if let Some(&holder) = self.state.gpu_hosts().get(&g.uuid) {
                let h = self.state.hosts()[holder as usize].host();
                return Err(Error::GpuTaken {
                    uuid: g.uuid.to_string(),
                    host: h.id.to_string(),
                    hostname: h.hostname.clone(),
                });
            }
            if batch.claims_gpu(&g.uuid) {
                return Err(Error::AlreadyExists { kind: "GPU", id: g.uuid.to_string() });
            }
        }
        if !self.room_for_gpus(batch, req.reg.gpus.len()) {
            return Err(Error::invalid(
                "gpus",
                format!("the cluster holds at most {} GPUs", mpsfleet_core::scheduler::MAX_GPUS),
            ));
        }
        if self.sched.host(&req.id).is_some() || batch.claims_id(&req.id) {
            return Err(Error::Conflict(format!("host id {} is taken; retry the request", req.id)));
        }
        let HostRequest { reg, id, credential, credential_sha256 } = req;
        let agent_token = self.agent_token(&id, "");
        let mut host = Host {
            id: id.clone(),
            pool,
            hostname: reg.hostname,
            status: HostStatus::Onboarding,
            health_status: HealthStatus::Initializing,
            cordoned: false,
            emulated: reg.emulated,
            mps_available: reg.mps_available,
            gpus: reg.gpus,
            runtime: reg.runtime,
            runtime_version: reg.runtime_version,
            plugins: reg.plugins,
            platform: reg.platform,
            seq: (self.state.hosts().len() + batch.len()) as u64,
            registered_at_ms: self.now(),
            credential_sha256,
            credential_revoked_at_ms: None,
            legacy_agent_token: String::new(),
            events: History::new(),
            rechecks: 0,
        };
        let registered = format!(
            "registered by its agent: {} GPU(s){}, {} runtime",
            host.gpus.len(),
            if host.emulated { " (emulated)" } else { "" },
            host.runtime.as_str()
        );
        host.events.push(host.registered_at_ms, ObjectEvent::new("Registered", registered));
        Ok((host, RegisterHostResponse { host_id: id, credential, agent_token }))
    }

    fn index_host(&mut self, host: Host, version: Revision) -> Result<HostIx, Error> {
        self.host_joined(&host.pool, &host.hostname);
        let pool = self.sched.pool(host.pool.as_str()).ok_or_else(|| {
            Error::StoreCorrupt(format!("host {} names unknown pool {}", host.id, host.pool))
        })?;
        let ix = self
            .sched
            .add_host(HostSpec {
                id: host.id.clone(),
                pool,
                mps_available: host.mps_available,
                runs_images: host.runtime.runs_images(),
                gpus: host
                    .gpus
                    .iter()
                    .map(|g| GpuSpec { memory_mib: g.memory_mib, max_clients: g.max_mps_clients })
                    .collect(),
            })
            .map_err(|e| Error::invalid("gpus", e.to_string()))?;
        self.sched.set_schedulable(ix, can_place(&host));
        let pool = host.pool.clone();
        self.writer().apply(version, Change::NewHost(ix, host));
        self.ask_capacity(&pool);
        self.work.health_due_ms.push(0);
        Ok(ix)
    }

    fn host_ix(&self, id: &str) -> Result<HostIx, Error> {
        HostId::new(id).ok().and_then(|h| self.sched.host(&h)).ok_or_else(|| Error::not_found("host", id))
    }

    pub fn set_cordoned(&mut self, id: &str, cordoned: bool) -> Result<HostView, Error> {
        let ix = self.host_ix(id)?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if !cordoned && h.status == HostStatus::Draining {
            return Err(Error::Conflict(format!(
                "host {} is DRAINING: uncordon does not return it to service; once it is repaired (every \
                 check OK), run `mpsfleet host activate {}`",
                h.id, h.id
            )));
        }
        if h.cordoned != cordoned {
            h.cordoned = cordoned;
            self.write_host(ix, h)?;
        }
        Ok(self.host_view(ix))
    }

    /// Commits a host record, then applies it (`Writer::write_host`).
    fn write_host(&mut self, ix: HostIx, host: Host) -> Result<(), Error> {
        self.writing(|w| w.write_host(ix, host))
    }

    pub fn host_view(&self, ix: HostIx) -> HostView {
        let e = &self.state.hosts()[ix as usize];
        let gpus = self
            .sched
            .host_gpus(ix)
            .zip(&e.host().gpus)
            .map(|(g, inv)| {
                let s = self.sched.gpu(g);
                GpuView {
                    gpu_id: inv.uuid.clone(),
                    index: inv.index,
                    model: inv.model.clone(),
                    sharing_mode: s.mode(),
                    total_memory_mib: s.total_mib,
                    remaining_memory_mib: s.remaining_mib(),
                    client_count: s.clients,
                    max_clients: s.max_clients,
                    compute_percent_sum: s.compute_percent,
                }
            })
            .collect();
        HostView {
            id: e.host().id.clone(),
            pool: e.host().pool.clone(),
            hostname: e.host().hostname.clone(),
            status: e.host().status,
            health_status: e.host().health_status,
            cordoned: e.host().cordoned,
            emulated: e.host().emulated,
            mps_available: e.host().mps_available,
            runtime: e.host().runtime,
            runtime_version: e.host().runtime_version.clone(),
            plugins: e.host().plugins.clone(),
            platform: e.host().platform.clone(),
            gpus,
            gpu_use: if e.host().status == HostStatus::Deregistered { Vec::new() } else { e.gpu_use.clone() },
            task_count: self.state.tasks().on_host(ix).len() as u32,
            registered_at_ms: e.host().registered_at_ms,
            last_heartbeat_ms: e.last_heartbeat_ms,
            checks: if e.health.checks.is_empty() { e.checks.clone() } else { self.evaluated_checks(ix) },
            logs_url: e.logs_url.clone(),
            logs_cert_sha256: e.logs_cert.clone(),
            credential_revoked_at_ms: e.host().credential_revoked_at_ms,
            events: Default::default(),
        }
    }

    /// The server's evaluation of a host's checks, with the restart counts the agent reported.
    fn evaluated_checks(&self, ix: HostIx) -> Vec<HostCheck> {
        let e = &self.state.hosts()[ix as usize];
        let mut out = e.health.host_checks();
        for c in &mut out {
            if let Some(r) = e.checks.iter().find(|r| r.name == c.name && r.gpu_id == c.gpu_id) {
                c.restarts = r.restarts;
            }
        }
        out
    }

    pub fn hosts(&self, pool: Option<&str>) -> Vec<HostView> {
        self.hosts_page(pool, false, 0, usize::MAX).0
    }

    /// Hosts `skip..skip + limit` in registration order (of `pool`; without the DEREGISTERED
    /// ones when `live`), and how many there are in all: only the page's views are built.
    pub fn hosts_page(
        &self,
        pool: Option<&str>,
        live: bool,
        skip: usize,
        limit: usize,
    ) -> (Vec<HostView>, usize) {
        let shown = |ix: &HostIx| {
            let h = self.state.hosts()[*ix as usize].host();
            pool.is_none_or(|p| h.pool.as_str() == p) && !(live && h.status == HostStatus::Deregistered)
        };
        let all = (0..self.state.hosts().len() as HostIx).filter(shown);
        let total = all.clone().count();
        (all.skip(skip).take(limit).map(|ix| self.host_view(ix)).collect(), total)
    }

    /// One host, with its events (lists leave them out).
    /// How host `id` stands for the tasks on it (ECS's task `connectivity`): whether its
    /// agent's heartbeats come within its pool's heartbeat grace, its last heartbeat, and its
    /// platform. None for an unknown host.
    pub fn agent_link(&self, id: &HostId) -> Option<AgentLink> {
        let ix = self.host_ix(id.as_str()).ok()?;
        let e = &self.state.hosts()[ix as usize];
        let grace = self
            .state
            .pools()
            .get(&e.host().pool)
            .map_or(0, |p| p.value.health_policy.agent_heartbeat_grace_ms);
        let connected = e.host().status != HostStatus::Deregistered
            && e.last_heartbeat_ms.is_some_and(|at| self.now().saturating_sub(at) <= grace);
        Some(AgentLink {
            connected,
            last_heartbeat_ms: e.last_heartbeat_ms,
            platform: e.host().platform.clone(),
        })
    }

    pub fn host(&self, id: &str) -> Result<HostView, Error> {
        let ix = self.host_ix(id)?;
        Ok(HostView { events: self.state.hosts()[ix as usize].host().events.clone(), ..self.host_view(ix) })
    }

    /// A task's events in words, oldest first.
    pub fn task_events(&self, id: &str) -> Result<History<ObjectEvent>, Error> {
        let id = TaskId::parse(id).map_err(|_| Error::not_found("task", id))?;
        let e = self.state.tasks().get(&id).ok_or_else(|| Error::not_found("task", id.to_string()))?;
        Ok(mpsfleet_core::changes::task_events(&e.task, &e.events))
    }

    /// ECS's StartTask: one task of `req` on host `host`, placed now, or why it does not fit
    /// there (nothing is made then). The host must be in `req.pool`.
    pub fn start_task_on(
        &mut self,
        req: &RunTask,
        host: &str,
    ) -> Result<Result<Task, mpsfleet_core::scheduler::Unplaced>, Error> {
        let pool = self.pool_name("cluster", &req.pool)?;
        let ix = self.host_ix(host)?;
        if self.state.hosts()[ix as usize].host().pool != pool {
            return Err(Error::not_found("host", host));
        }
        let td = self.taskdef_to_run("taskDefinition", &req.task_definition)?;
        self.check_task_secrets(td)?;
        self.check_task_policy(&pool, td)?;
        let labels = run_labels(req, td)?;
        let reference = td.reference();
        let started_by = format!("run:{:016x}", auth::random_u64()?);
        let mut task = Task::new(self.writer().next_task_id(), reference, pool, None, started_by, self.now());
        task.labels = labels;
        self.writing(|w| w.start_one_on(task, ix))
    }

    pub fn run_tasks(&mut self, req: RunTask) -> Result<RunOutcome, Error> {
        let started_by = format!("run:{:016x}", auth::random_u64()?);
        self.run_tasks_started_by(req, started_by)
    }

    /// A task run whose tasks carry `started_by`.
    fn run_tasks_started_by(&mut self, req: RunTask, started_by: String) -> Result<RunOutcome, Error> {
        if req.count == 0 || req.count > MAX_RUN_COUNT {
            return Err(Error::invalid(
                "count",
                format!("must be an integer from 1 to {MAX_RUN_COUNT}, got {}", req.count),
            ));
        }
        let pool = self.pool_name("pool", &req.pool)?;
        let td = self.taskdef_to_run("taskDefinition", &req.task_definition)?;
        self.check_task_secrets(td)?;
        self.check_task_policy(&pool, td)?;
        let labels = run_labels(&req, td)?;
        let td = td.reference();
        let spec = NewTasks { task_definition: td, pool, group: None, started_by, labels, deployment: None };
        let tasks = self.writing(|w| w.start_tasks(spec, req.count))?;
        let placed = tasks.iter().filter(|t| t.host_id.is_some()).count() as u32;
        Ok(RunOutcome { pending: tasks.len() as u32 - placed, placed, tasks })
    }

    pub fn task(&self, id: &str) -> Result<Task, Error> {
        TaskId::parse(id)
            .ok()
            .and_then(|id| self.state.tasks().get(&id))
            .map(|e| e.task.clone())
            .ok_or_else(|| Error::not_found("task", id))
    }

    pub fn tasks(&self, filter: &TaskFilter) -> Vec<Task> {
        if let Some(stale) = self.broken.stale_tasks(filter) {
            return stale;
        }
        let mut out: Vec<&TaskEntry> = self.matching_tasks(filter).collect();
        if filter.newest_first {
            out.sort_by_key(|e| std::cmp::Reverse(e.seq));
        } else {
            out.sort_by_key(|e| e.seq);
        }
        out.into_iter().skip(filter.skip).take(filter.limit).map(|e| e.task.clone()).collect()
    }

    /// Every task `filter` matches, unordered, read in place (nothing is copied): for counts
    /// and for lists that keep a few fields of each. `skip`, `limit` and the order are the
    /// caller's.
    pub fn visit_tasks(&self, filter: &TaskFilter, mut f: impl FnMut(&Task)) {
        self.matching_tasks(filter).for_each(|e| f(&e.task));
    }

    fn matching_tasks<'a>(&'a self, filter: &'a TaskFilter) -> impl Iterator<Item = &'a TaskEntry> + 'a {
        self.state
            .tasks()
            .values()
            .filter(|e| filter.pool.as_deref().is_none_or(|p| e.task.pool.as_str() == p))
            .filter(|e| {
                filter
                    .service
                    .as_deref()
                    .is_none_or(|s| e.task.group.as_ref().is_some_and(|g| g.as_str() == s))
            })
            .filter(|e| {
                filter
                    .host
                    .as_deref()
                    .is_none_or(|h| e.task.host_id.as_ref().is_some_and(|x| x.as_str() == h))
            })
            .filter(|e| filter.status.is_none_or(|s| e.task.last_status == s))
            .filter(|e| !filter.live || e.task.last_status != TaskStatus::Stopped)
    }

    pub fn stop_task(&mut self, id: &str, reason: Option<String>) -> Result<Task, Error> {
        let task = self.task(id)?;
        if task.desired_status == TaskStatus::Stopped {
            return Ok(task);
        }
        if task.draining.is_some() {
            // Already leaving traffic: its service stops it when its delay is over.
            return Ok(task);
        }
        let reason = reason.unwrap_or_else(|| "stopped by the user".to_string());
        // A service's replica in traffic leaves it first, as a planned stop does.
        let delay = task.group.as_ref().and_then(|g| self.state.services().get(g));
        let delay = delay.map_or(0, |s| s.value.deregistration_delay_seconds);
        let t = self.reader().planned_stop(&task, delay, StopCode::UserInitiated, &reason, self.now());
        if matches!(self.broken, broken::Switch::LostStops) {
            return Ok(t);
        }
        self.writing(|w| w.write_tasks(vec![t]))?;
        // Its service (if any) starts a replacement on the next pass of the work queue; the
        // stop, committed, is not answered with an error of that reconcile.
        self.ask_for_group(task.group.as_ref());
        self.task(id)
    }

    /// Drops change-feed entries older than the last `keep` revisions (objects stay).
    pub fn compact_feed(&mut self, keep: u64) -> Result<(), Error> {
        Ok(self.store.compact(self.state.revision().saturating_sub(keep))?)
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
            let rev = c.revision();
            c.host_status(&host, &r).unwrap();
            assert_eq!(c.state.hosts()[0].health, expected, "step {i}");
            assert_eq!(c.state.hosts()[0].host().health_status, expected.status, "step {i}");
            assert_eq!(c.revision() != rev, commits, "step {i}");
            // The health tick finds nothing to change either.
            c.health_tick().unwrap();
            assert_eq!(c.state.hosts()[0].health, expected, "step {i}, after the tick");
        }
    }
}
