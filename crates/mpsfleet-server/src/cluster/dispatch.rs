//! The work the controllers are asked for, as keys on one [`WorkQueue`]
//! (`mpsfleet_core::controller`; the keys are `work.rs`'s `Work`): a request or an agent's
//! report commits its own change and asks for the key it touched; [`Cluster::run_work`]
//! (called by every health tick, in the server and in the simulator alike) hands each due key
//! to its controller (`controllers/`), one at a time, and a key that fails backs off on its
//! own while the others go on.
//!
//! The controllers and who asks for their keys:
//! - services (`Work::Service`): every change to a replica, and the resync;
//! - placement (`Work::Placement`): capacity freed or opened in a pool;
//! - remediation (`Work::Incident`): an incident opening, an operator's command, a heartbeat
//!   that changed something, a provider call's end (its own writes ask for nothing), and
//!   every `INCIDENT_RESYNC_MS` while unresolved;
//! - capacity (`Work::Capacity`): the pool, its incidents or a provider call changing, a host
//!   joining or leaving, and every `CAPACITY_RESYNC_MS`;
//! - drills (`Work::Drill`): every `DRILL_PASS_MS` until the drill has ended;
//! - retention (`Work::Retention`): every `RETENTION_INTERVAL_MS` once
//!   [`Cluster::start_retention`] asked (the simulator does not, so its reports keep every
//!   record).
//!
//! Keys run on the controllers' own pass, never inside a request: the health tick runs what
//! is due every 250 ms, and an incident asked for by a request or a report wakes the pass at
//! once ([`Cluster::take_wake`]; the server's health loop, the simulator after each call), so
//! recovery does not wait for the next tick. Requests for a queued key
//! merge, so a burst of reports about one service's tasks (a host's tasks starting, a drain)
//! reconciles the service once per pass, not once per report, and capacity freed by many
//! stops places a pool's waiting tasks once. A reconcile that waits for a time (a crash-loop
//! hold-back, a rebalance's settle time) asks for its key again at that time; every
//! [`SERVICE_RESYNC_MS`] the resync asks for every service, and every resync for every pool
//! with waiting tasks: the safety net for a change nothing asked for.
//!
//! A request that creates tasks still places them in its own commit (a pure decision, so
//! `task run` answers at once with what cannot be placed); capacity that frees or opens later
//! (a task stopped, a host onboarded or activated, a daemon answering again, a pool's
//! settings changed) asks for the pool's placement instead of placing inline.

use super::controllers::capacity::{Capacity, Lent as CapacityLent};
use super::controllers::drills::Drills;
use super::controllers::health::HostHealth;
use super::controllers::placement::{Outlook, Placer};
use super::controllers::remediation::ProviderProgress;
use super::controllers::remediation::{Lent, Remediation};
use super::controllers::remediation::{ProviderOutcome, TERMINATE_RETRY};
use super::controllers::retention::Retention;
use super::controllers::services::Services;
use super::read::PoolCounts;
use super::work::Work;
use super::*;
use crate::provider::AttemptRecord;
use mpsfleet_core::controller::{Action, WorkQueue};
use mpsfleet_types::Step;
use mpsfleet_types::{PoolName, ServiceName};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// Launch times kept per pool, and launches followed at once (a bound on memory).
const LAUNCH_TIMES_KEPT: usize = 32;

/// How often every service is reconciled whether or not anything asked for it.
pub const SERVICE_RESYNC_MS: u64 = 60_000;

/// The most passes one [`Cluster::run_work`] makes: a key that a pass asked for (a service an
/// incident touched) runs in the next pass of the same call, not a tick later.
const PASSES: usize = 4;

/// The controllers' queue, when the services' next resync is due, and what the controllers
/// keep between their runs (in memory only; none of it is a record).
#[derive(Default)]
pub(super) struct Controllers {
    pub(super) queue: WorkQueue<Work>,
    next_service_resync_ms: u64,
    /// When the health tick must evaluate each host again (by `HostIx`, apart from the hosts'
    /// records so that the tick reads a few bytes per host): the time its evaluation can
    /// next change without a report (`health::next_change_at_ms`), or 0 when something it
    /// depends on changed (its record, its pool, an incident about it).
    pub(super) health_due_ms: Vec<u64>,
    /// Each pool's storm-breaker counts (`health::PoolCounts`), kept between health ticks and
    /// dropped whenever what they count changes: a host's record or verdict, or an incident.
    pub(super) breaker_counts: BTreeMap<PoolName, PoolCounts>,
    /// When each service's tasks last failed (in memory; for the crash-loop backoff).
    pub(super) service_failures: HashMap<ServiceName, VecDeque<u64>>,
    /// The room preemptors hold until their victims have stopped (`controllers/preemption.rs`).
    pub(super) holds: super::controllers::preemption::Holds,
    /// Provider calls in progress or done, by incident (`Cluster::provider_done`).
    pub(super) provider_progress: HashMap<String, ProviderProgress>,
    /// The host health controller, and the GPUs it closed to MPS tasks.
    pub(super) health: HostHealth,
    /// Provider calls decided inside an API call, for the caller to run.
    pub(super) pending_jobs: Vec<ProviderJob>,
    /// Hosts with a GPU whose MPS daemon's failure is confirmed (`HostEntry::failed_daemons`
    /// not empty): while there is none, no replica is at risk and none is looked up.
    pub(super) failed_daemon_hosts: BTreeSet<super::HostIx>,
    /// Hosts being launched to keep managed pools at their size, by pool.
    pub(super) capacity_launches: HashMap<PoolName, BTreeSet<String>>,
    /// When each launch still to join was asked for, by (pool, host name); and how long the
    /// latest launches of each pool took to join (`scaling.rs`, `launch_times`).
    pub(super) launches_asked: HashMap<(PoolName, String), u64>,
    pub(super) launch_times: HashMap<PoolName, VecDeque<u64>>,
    /// What managed scaling keeps between its runs, by pool (`scaling.rs`).
    pub(super) scaling: HashMap<PoolName, super::controllers::scaling::ScalingMemory>,
    /// An incident was asked for since the last [`Cluster::take_wake`]: the controllers'
    /// pass should run now.
    pub(super) wake: bool,
}

impl Cluster {
    /// Whether an incident, or a key a request changed, was asked for since the last call: the caller runs
    /// [`Cluster::run_work`] soon (the server wakes its health loop).
    /// Provider calls a request or a report decided count too: requests never run them, the
    /// controllers' loop does.
    pub fn take_wake(&mut self) -> bool {
        std::mem::take(&mut self.work.wake) || !self.work.pending_jobs.is_empty()
    }

    /// Starts retention: it runs now, then every `RETENTION_INTERVAL_MS` (the server does this
    /// once it serves; the simulator does not).
    pub fn start_retention(&mut self) {
        self.ask(Work::Retention);
    }

    /// Reconciles every key that is due, each on its own: one that fails is logged and tried
    /// again after its backoff; the others go on. Keys asked for by a pass and due at once run
    /// in the next pass, up to [`PASSES`].
    pub fn run_work(&mut self) {
        for _ in 0..PASSES {
            let now = self.now();
            if self.work.queue.next_due().is_none_or(|due| due > now) {
                // Nothing due: what woke the controllers has run.
                self.work.wake = false;
                break;
            }
            self.run_pass(now);
        }
    }

    pub(super) fn run_pass(&mut self, now: u64) {
        for key in self.work.queue.take_due(now) {
            let result = match &key {
                Work::Service(name) => {
                    let mut failures = std::mem::take(&mut self.work.service_failures);
                    let result = Services::reconcile(&mut self.controller_ctx(), name, &mut failures);
                    self.work.service_failures = failures;
                    result
                }
                Work::Placement(pool) => {
                    let outlook = Outlook {
                        launching: self.work.capacity_launches.get(pool).map_or(0, |l| l.len()),
                        local_runs_images: super::providers::local_runs_images(self.providers.ctx.as_ref()),
                    };
                    let mut holds = std::mem::take(&mut self.work.holds);
                    let result = Placer::reconcile(&mut self.controller_ctx(), pool, &outlook, &mut holds);
                    self.work.holds = holds;
                    result
                }
                Work::Incident(_, id) => {
                    // Whether the incident's pool has a provider is asked first: building one
                    // from its configuration is the cluster's.
                    let pool = self.state.incidents().get(id).map(|i| i.value.pool.clone());
                    let has_provider = pool.is_some_and(|p| self.provider_for(&p).is_some());
                    let mut progress = std::mem::take(&mut self.work.provider_progress);
                    let mut asked = std::mem::take(&mut self.work.launches_asked);
                    let mut jobs = std::mem::take(&mut self.work.pending_jobs);
                    let mut lent = Lent {
                        progress: &mut progress,
                        has_provider,
                        launches_asked: &mut asked,
                        jobs: &mut jobs,
                    };
                    let result = Remediation::reconcile(&mut self.controller_ctx(), id, &mut lent);
                    self.work.provider_progress = progress;
                    self.work.launches_asked = asked;
                    self.work.pending_jobs = jobs;
                    result
                }
                Work::Capacity(pool) => self.run_capacity(pool),
                Work::Retention => self.run_retention(),
                Work::Drill(id) => Drills::reconcile(&mut self.controller_ctx(), id),
            };
            if let Err(e) = &result {
                tracing::warn!(work = ?key, error = %e, "reconcile failed; retrying after its backoff");
            }
            let now = self.now();
            self.work.queue.finish(key, &result, now);
        }
    }

    /// Runs the capacity controller (`controllers/capacity.rs`) for `pool`, with what it
    /// borrows from the cluster, then mints a launch token for each host it launches: a
    /// launch token is the cluster's credential, scoped to that one host.
    pub(super) fn run_capacity(&mut self, pool: &PoolName) -> Result<Action, Error> {
        let has_provider = self.provider_for(pool).is_some();
        let w = &mut self.work;
        let (mut launches, mut asked) =
            (std::mem::take(&mut w.capacity_launches), std::mem::take(&mut w.launches_asked));
        let (mut scaling, mut jobs) = (std::mem::take(&mut w.scaling), std::mem::take(&mut w.pending_jobs));
        let mut lent = CapacityLent {
            has_provider,
            launches: &mut launches,
            launches_asked: &mut asked,
            scaling: &mut scaling,
            jobs: &mut jobs,
            to_launch: Vec::new(),
        };
        let result = Capacity::reconcile(&mut self.controller_ctx(), pool, &mut lent);
        let to_launch = std::mem::take(&mut lent.to_launch);
        // A launched host counts as in flight until it registers (`host_joined`).
        self.creds.launch_tokens.retain(|_, (p, name)| launches.get(p).is_some_and(|l| l.contains(name)));
        let w = &mut self.work;
        (w.capacity_launches, w.launches_asked, w.scaling, w.pending_jobs) = (launches, asked, scaling, jobs);
        for name in to_launch {
            let token = self.creds.mint_launch_token(pool, &name);
            let job =
                ProviderJob::Launch { incident: String::new(), pool: pool.clone(), name, token: Some(token) };
            self.work.pending_jobs.push(job);
        }
        result
    }

    /// Runs the retention controller (`controllers/retention.rs`); the incidents it removed
    /// leave the remediation's memory of their provider calls.
    pub(super) fn run_retention(&mut self) -> Result<Action, Error> {
        // Lent out while the context borrows the cluster's fields, and put back whatever
        // the reconcile answers.
        let progress = std::mem::take(&mut self.work.provider_progress);
        let launching = |id: &str| progress.get(id).is_some_and(|p| p.launching);
        let result = Retention::reconcile(&mut self.controller_ctx(), &launching);
        self.work.provider_progress = progress;
        let (action, removed) = result?;
        for id in removed {
            self.work.provider_progress.remove(&id);
        }
        Ok(action)
    }

    /// The periodic pass: asks for every service once its resync is due and for placement in
    /// every pool with waiting tasks, and reconciles what is due. Each service and pool on its
    /// own: one that fails is logged with its key and retried after its backoff; the others
    /// go on.
    pub fn resync(&mut self) -> Result<(), Error> {
        let now = self.now();
        if now >= self.work.next_service_resync_ms {
            self.work.next_service_resync_ms = now + SERVICE_RESYNC_MS;
            let names: Vec<ServiceName> = self.state.services().keys().cloned().collect();
            for n in names {
                self.work.queue.enqueue_at(Work::Service(n), now);
            }
        }
        self.writer().ask_placement_everywhere();
        // The safety net of the incidents' and capacity's own requeues.
        self.writer().ask_incidents();
        self.ask_capacity_everywhere();
        self.run_work();
        Ok(())
    }
}

impl Cluster {
    /// A provider call finished; the incident moves on at the next remediation.
    pub fn provider_done(
        &mut self,
        job: &ProviderJob,
        outcome: ProviderOutcome,
    ) -> Result<Vec<ProviderJob>, Error> {
        let result = match outcome {
            ProviderOutcome::Done => Ok(()),
            ProviderOutcome::Failed(reason) => Err(reason),
        };
        let pool = match job {
            ProviderJob::Launch { pool, .. } | ProviderJob::Terminate { pool, .. } => pool,
        };
        self.ask_capacity(pool);
        match job {
            // A launch to keep the pool at its size (no incident).
            ProviderJob::Launch { incident, pool, name, .. } if incident.is_empty() => {
                // A launched host stays in flight until it registers; a failed one is retried.
                if let Err(reason) = result {
                    if let Some(l) = self.work.capacity_launches.get_mut(pool) {
                        l.remove(name);
                    }
                    self.creds.launch_tokens.retain(|_, (p, n)| !(p == pool && n == name));
                    tracing::error!(pool = %pool, host = %name, %reason, "could not launch a host");
                }
            }
            ProviderJob::Launch { incident, pool, name, .. } => {
                let p = self.work.provider_progress.entry(incident.clone()).or_default();
                p.launching = false;
                let launched = result.is_ok();
                p.launch = Some(result);
                // The incident ended while the launch was in flight: the replacement was
                // cancelled (its token revoked), so the machine the provider made goes again.
                let cancelled = self
                    .state
                    .incidents()
                    .get(incident)
                    .and_then(|i| i.value.replacement.as_ref())
                    .is_some_and(|b| b.revoked && b.host_id.is_none());
                if launched && cancelled {
                    self.work.pending_jobs.push(ProviderJob::Terminate {
                        incident: incident.clone(),
                        pool: pool.clone(),
                        name: name.clone(),
                    });
                }
            }
            // A host scaled in (no incident): it is deregistered already.
            ProviderJob::Terminate { incident, pool, name } if incident.is_empty() => {
                if let Err(reason) = result {
                    let msg =
                        format!("could not terminate scaled-in host {name}: {reason}; terminate it by hand");
                    tracing::error!(pool = %pool, host = %name, %reason, "could not terminate a scaled-in host");
                    self.writing(|w| w.pool_event(pool, "ScaleInTerminateFailed", msg))?;
                }
            }
            ProviderJob::Terminate { incident, name, .. } => {
                let cancelled_replacement = self
                    .state
                    .incidents()
                    .get(incident)
                    .and_then(|i| i.value.replacement.as_ref())
                    .is_some_and(|b| &b.name == name && b.revoked);
                if cancelled_replacement {
                    match &result {
                        Ok(()) => tracing::info!(%incident, host = %name, "cancelled replacement terminated"),
                        Err(reason) => {
                            tracing::error!(%incident, host = %name, %reason, "could not terminate a cancelled replacement; terminate it by hand")
                        }
                    }
                    self.writer().ask_incidents();
                    return Ok(Vec::new());
                }
                let now = self.now();
                let p = self.work.provider_progress.entry(incident.clone()).or_default();
                p.terminating = false;
                p.terminate = Some(result.clone());
                if let Err(reason) = &result {
                    p.terminate_failures += 1;
                    let backoff = TERMINATE_RETRY.backoff_after(p.terminate_failures).as_millis() as u64;
                    p.terminate_retry_at_ms = now + backoff;
                    let detail = format!(
                        "terminate {name} failed: {reason}; asked again in {}",
                        mpsfleet_core::health::fmt_ms(backoff)
                    );
                    if let Some(mut i) =
                        self.state.incidents().get(incident.as_str()).map(|v| v.value.clone())
                    {
                        i.push(now, Step::ProviderRetry, detail, None);
                        self.writing(|w| w.write_incident(i))?;
                    }
                } else {
                    p.terminate_failures = 0;
                }
                if result.is_ok() {
                    if let Some(host) = self.state.incidents().get(incident).map(|i| i.value.host_id.clone())
                    {
                        // Only the machine the job named: a termination of another (a cancelled
                        // replacement) never deregisters the incident's host.
                        let named = self
                            .sched
                            .host(&host)
                            .filter(|&ix| &self.state.hosts()[ix as usize].host().hostname == name);
                        if let Some(ix) = named {
                            self.writing(|w| w.deregister(ix, "the provider terminated the host"))?;
                        }
                    }
                }
            }
        }
        self.writer().ask_incidents();
        Ok(Vec::new())
    }

    /// A provider call failed and will be tried again after `failed.backoff_ms`: noted on the
    /// incident's timeline (and so announced as an event) before the wait, so a slow or failing
    /// provider shows while it happens. Calls that keep the pool at its size have no incident;
    /// they are only logged.
    pub fn provider_attempt_failed(
        &mut self,
        job: &ProviderJob,
        failed: &AttemptRecord,
    ) -> Result<(), Error> {
        let (op, incident, name) = match job {
            ProviderJob::Launch { incident, name, .. } => ("launch", incident, name),
            ProviderJob::Terminate { incident, name, .. } => ("terminate", incident, name),
        };
        let retry_in = failed.backoff_ms.map_or_else(
            || "no further attempt".to_string(),
            |ms| format!("next attempt in {}", mpsfleet_core::health::fmt_ms(ms)),
        );
        let detail = format!("{op} {name}: attempt {} failed: {}; {retry_in}", failed.attempt, failed.error);
        tracing::warn!(%incident, "{detail}");
        let Some(mut i) = self.state.incidents().get(incident.as_str()).map(|v| v.value.clone()) else {
            return Ok(());
        };
        i.push(self.now(), Step::ProviderRetry, detail, None);
        self.writing(|w| w.write_incident(i))
    }

    /// Evaluates every host that is due (heartbeat grace runs out without any report) and
    /// drives every incident; returns the provider calls to make.
    pub fn health_tick(&mut self) -> Result<Vec<ProviderJob>, Error> {
        self.run_work();
        let mut health = std::mem::take(&mut self.work.health);
        health.tick(&mut self.controller_ctx());
        self.work.health = health;
        // What this tick asked for (an incident just opened, a pool whose GPUs opened again)
        // runs now, not a tick later.
        self.run_work();
        Ok(self.take_jobs())
    }
}

impl Cluster {
    /// Drops change-feed entries older than the last `keep` revisions (objects stay).
    pub fn compact_feed(&mut self, keep: u64) -> Result<(), Error> {
        Ok(self.store.compact(self.state.revision().saturating_sub(keep))?)
    }

    /// Provider calls decided during the last API calls, for the caller to run.
    pub fn take_jobs(&mut self) -> Vec<ProviderJob> {
        std::mem::take(&mut self.work.pending_jobs)
    }
}

impl Controllers {
    /// A host registered: its launch is no longer in flight, and if it was asked for, how
    /// long it took is kept (the latest [`LAUNCH_TIMES_KEPT`] per pool).
    pub(super) fn host_joined(&mut self, pool: &PoolName, name: &str, now: u64) {
        if let Some(l) = self.capacity_launches.get_mut(pool) {
            l.remove(name);
        }
        let Some(asked) = self.launches_asked.remove(&(pool.clone(), name.to_string())) else { return };
        let took = now.saturating_sub(asked);
        let times = self.launch_times.entry(pool.clone()).or_default();
        if times.len() == LAUNCH_TIMES_KEPT {
            times.pop_front();
        }
        times.push_back(took);
    }

    /// Ends the incident's replacement before it is used: revokes its token (in the record the
    /// caller commits) and, when the provider launched it, gives the termination to ask for once
    /// that commit is done (one still launching is terminated when it reports back). Says what
    /// it did.
    pub(in crate::cluster) fn cancel_replacement(
        &mut self,
        i: &mut mpsfleet_types::Incident,
        now: u64,
    ) -> (Option<String>, Option<ProviderJob>) {
        let Some(b) = i.replacement.as_ref() else { return (None, None) };
        if let Some(host) = b.host_id.clone() {
            return (Some(format!("replacement host {host} stays in the pool as an ordinary host")), None);
        }
        if b.revoked {
            return (None, None);
        }
        let name = b.name.clone();
        if let Some(b) = i.replacement.as_mut() {
            b.revoked = true;
        }
        let progress = self.provider_progress.get(&i.id);
        let launching = progress.is_some_and(|p| p.launching);
        let launched = progress.is_some_and(|p| matches!(p.launch, Some(Ok(()))));
        let job = (launched && !launching).then(|| ProviderJob::Terminate {
            incident: i.id.clone(),
            pool: i.pool.clone(),
            name: name.clone(),
        });
        let detail = if launched || launching {
            format!(
                "replacement {name} cancelled: its registration token is revoked and the provider is asked \
                 to terminate it"
            )
        } else {
            format!("replacement {name} cancelled: its registration token is revoked")
        };
        i.push(now, Step::ReplacementCancelled, detail.clone(), None);
        (Some(detail), job)
    }
}

impl Controllers {
    /// The keys waiting, in words (for tests).
    #[cfg(test)]
    pub(in crate::cluster) fn work_keys(&self) -> Vec<String> {
        self.queue.keys().map(|k| format!("{k:?}")).collect()
    }
}

impl Cluster {
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
        load_incidents(self.store.as_ref(), &mut self.state)?;
        for id in load_drills(self.store.as_ref(), &mut self.state)? {
            self.ask(Work::Drill(id));
        }
        load_api_tokens(self.store.as_ref(), &mut self.state)?;
        load_join_tokens(self.store.as_ref(), &mut self.state)?;
        load_audit(self.store.as_ref(), &mut self.state)?;
        load_client_tokens(self.store.as_ref(), &mut self.state)?;
        load_deleted(self.store.as_ref(), &mut self.state)?;
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
                let req = place::request_for(&self.state, &mut self.sched, &task, self.clock.now_ms())?;
                self.sched.reserve(&req, p);
            }
            self.writer().insert_task(task, version, placement, false);
        }
        Ok(())
    }

    /// Loads the state from the store, creating the admin and join tokens on first start.
    /// On first start, `keep_tokens` is called with the new tokens before their digests are
    /// committed, so that a crash in between cannot leave a token nobody knows.
    pub fn load(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        keep_tokens: impl FnOnce(&FirstStart) -> Result<(), Error>,
    ) -> Result<Cluster, Error> {
        schema::migrate(store.as_ref())?;
        let admin_sha256 = match store.get(AUTH, "admin")? {
            Some(a) => decode::<AuthRecord>(&a)?.sha256,
            None => {
                let admin_token = auth::new_token("mpsf_adm_")?;
                let join_token = auth::new_token("mpsf_join_")?;
                let a = auth::digest(&admin_token);
                let join = join_token_record(
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
            let join = join_token_record(clock.now_ms(), sha256, &Default::default(), "first start")?;
            store.commit(&[
                Op::put_json(tokens::JOIN_TOKEN, &join.view.id, &join, Precondition::Absent)?,
                Op::delete(AUTH, "join", Precondition::Version(j.version)),
            ])?;
            tracing::warn!(token.id = %join.view.id, "the data dir's join token now expires in a day");
        }
        let join_clock = clock.clone();
        let mut c = Cluster {
            state: state::State::new(tokens::AdminDigest::new(admin_sha256), new_join_index(join_clock)),
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
}
