//! The recovery path under a misbehaving provider, in virtual time: the cluster over a
//! `MemoryStore` on a `ManualClock`, driven the way the server's loops drive it.

use super::*;
use crate::provider::ExternalProvider;
use mpsfleet_core::clock::ManualClock;
use std::time::Duration;

pub(super) struct World {
    pub(super) c: Cluster,
    pub(super) clock: Arc<ManualClock>,
    pub(super) join_token: String,
    gpu: u32,
    /// Whether the agents' heartbeats say they accept a drill's faults.
    pub(super) accepts_faults: bool,
}

impl World {
    pub(super) fn new(mode: OwnershipMode) -> World {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut join_token = String::new();
        let mut c = Cluster::load(store, clock.clone(), |t| {
            join_token = t.join_token.clone();
            Ok(())
        })
        .unwrap();
        c.create_pool(CreatePool { name: "p".into(), mode: Some(mode), ..Default::default() }).unwrap();
        if mode == OwnershipMode::Managed {
            c.set_provider(PoolName::new("p").unwrap(), Arc::new(ExternalProvider));
        }
        World { c, clock, join_token, gpu: 0, accepts_faults: false }
    }

    pub(super) fn registration(&mut self, hostname: &str) -> HostRegistration {
        self.gpu += 1;
        HostRegistration {
            pool: PoolName::new("p").unwrap(),
            hostname: hostname.into(),
            gpus: vec![GpuInventory::emulated_h200(
                GpuUuid::new(format!("GPU-{:08x}", self.gpu)).unwrap(),
                0,
            )],
            mps_available: true,
            emulated: true,
            runtime: Default::default(),
            runtime_version: None,
            plugins: Default::default(),
            platform: Default::default(),
        }
    }

    pub(super) fn join(&mut self, hostname: &str, token: &str) -> Result<HostId, Error> {
        let reg = self.registration(hostname);
        let id = self.c.register_host_with_token(reg, token)?.host_id;
        self.heartbeat(&id, HealthStatus::Ok);
        Ok(id)
    }

    pub(super) fn heartbeat(&mut self, host: &HostId, mps: HealthStatus) {
        let check = HostCheck {
            // A failure the agent has just seen: the first failure is placed at the report.
            first_failure_age_ms: (mps == HealthStatus::Impaired).then_some(0),
            ..self.mps_check(host, mps)
        };
        let report = self.report(vec![check]);
        self.c.host_status(host, &report).unwrap();
    }

    /// The `MPS_DAEMON` check of the host's first GPU, in `status`, with no failure or restart.
    pub(super) fn mps_check(&self, host: &HostId, status: HealthStatus) -> HostCheck {
        let gpu = self.c.state.hosts()[self.c.sched.host(host).unwrap() as usize].host().gpus[0].uuid.clone();
        HostCheck {
            name: "MPS_DAEMON".into(),
            gpu_id: Some(gpu),
            status,
            reason: format!("daemon {}", status.as_str()),
            since_ms: 5,
            restarts: 0,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        }
    }

    /// A full heartbeat (onboarded, 1 s interval) carrying `checks`.
    pub(super) fn report(&self, checks: Vec<HostCheck>) -> HostStatusReport {
        HostStatusReport {
            onboarded: true,
            checks,
            checks_rev: None,
            checks_unchanged: false,
            logs_url: None,
            logs_cert_sha256: None,
            trusted_ca_sha256: Vec::new(),
            gpu_use: Vec::new(),
            heartbeat_ms: Some(1_000),
            accepts_faults: self.accepts_faults,
        }
    }

    pub(super) fn advance(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }

    /// Runs the health loop and the heartbeats for `secs` seconds of virtual time, answering
    /// every provider job with `answer`; returns the jobs seen.
    pub(super) fn run(
        &mut self,
        secs: u64,
        heartbeats: &[(HostId, HealthStatus)],
        answer: impl Fn(&ProviderJob) -> ProviderOutcome,
    ) -> Vec<ProviderJob> {
        let mut seen = Vec::new();
        for tick in 0..secs * 4 {
            self.advance(250);
            if tick % 4 == 0 {
                for (h, s) in heartbeats {
                    self.heartbeat(h, *s);
                }
            }
            let mut jobs = self.c.health_tick().unwrap();
            jobs.extend(self.c.take_jobs());
            while let Some(job) = jobs.pop() {
                let outcome = answer(&job);
                seen.push(job.clone());
                jobs.extend(self.c.provider_done(&job, outcome).unwrap());
                jobs.extend(self.c.take_jobs());
            }
        }
        seen
    }

    pub(super) fn only_incident(&self) -> Incident {
        let all = self.c.read().incidents();
        assert_eq!(all.len(), 1, "{all:#?}");
        all.into_iter().next().unwrap()
    }
}

pub(super) fn launch_token(jobs: &[ProviderJob]) -> Option<String> {
    jobs.iter().find_map(|j| match j {
        ProviderJob::Launch { token: Some(t), .. } => Some(t.0.clone()),
        _ => None,
    })
}

/// The provider reports the launch as failed while the machine boots anyway, and then fails
/// every termination: the state stays small, repeats are counted, and only the host that
/// registered with the incident's token is the replacement. An impostor under the
/// replacement's name with the join token is an ordinary host, and the token works once.
#[test]
fn a_failed_launch_that_boots_anyway_stays_bounded_and_binds_by_token() {
    let mut w = World::new(OwnershipMode::Managed);
    let join = w.join_token.clone();
    let bad = w.join("bad", &join).unwrap();
    w.run(2, &[(bad.clone(), HealthStatus::Ok)], |_| ProviderOutcome::Done);
    // The daemon fails for good: the incident opens and a replacement is requested.
    let jobs = w.run(5, &[(bad.clone(), HealthStatus::Impaired)], |_| {
        ProviderOutcome::Failed("launch command exited with status 1".into())
    });
    let token = launch_token(&jobs).expect("a launch with a registration token");
    let incident = w.only_incident();
    assert!(incident.has(Step::ReplacementRequested), "{incident:#?}");
    assert!(matches!(incident.state, IncidentState::Blocked { .. }), "{:?}", incident.state);

    // Someone with the join token registers under the replacement's name: an ordinary host.
    let impostor = w.join(&replacement_name(&incident), &join).unwrap();
    // The machine the provider said had failed boots and joins with its token.
    let real = w.join("booted-anyway", &token).unwrap();
    let reused = w.registration("again");
    let err = w.c.register_host_with_token(reused, &token).unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");
    let i = w.only_incident();
    assert!(i.is_replacement(&real) && !i.is_replacement(&impostor), "{:?}", i.replacement);

    // Minutes of heartbeats with every termination failing.
    let rev = w.c.read().revision();
    let hb = [
        (bad.clone(), HealthStatus::Impaired),
        (real.clone(), HealthStatus::Ok),
        (impostor, HealthStatus::Ok),
    ];
    let jobs = w.run(600, &hb, |j| match j {
        ProviderJob::Terminate { .. } => {
            ProviderOutcome::Failed("terminate command exited with status 2".into())
        }
        ProviderJob::Launch { .. } => ProviderOutcome::Done,
    });
    let terminations = jobs.iter().filter(|j| matches!(j, ProviderJob::Terminate { .. })).count();
    let commits = w.c.read().revision() - rev;
    // 5 s doubling to 5 min: about 8 asks in 10 minutes, each a few commits.
    assert!((3..=12).contains(&terminations), "{terminations} terminations asked for in 10 minutes");
    assert!(commits < 100, "{commits} commits in 10 minutes of a stuck incident");
    let i = w.only_incident();
    assert!(i.timeline.len() <= TimelineEvent::HEAD + TimelineEvent::TAIL, "{} entries", i.timeline.len());
    let retries = i.timeline.iter().filter(|e| e.step == Step::ProviderRetry).count();
    assert!(retries >= 3, "{:#?}", i.timeline);
    assert!(i.has(Step::ReplacementReady), "{:#?}", i.timeline);
    // Still open, and saying what it waits for: the operator can resolve it or retry.
    assert_eq!(i.state, IncidentState::Remediating);
    // Another hour changes little: the asks are 5 minutes apart now.
    let rev = w.c.read().revision();
    w.run(3_600, &hb, |_| ProviderOutcome::Failed("still failing".into()));
    assert!(w.c.read().revision() - rev < 100, "{} commits in an hour", w.c.read().revision() - rev);
}

/// An expired replacement token is refused, naming why.
#[test]
fn an_expired_replacement_token_is_refused() {
    let mut w = World::new(OwnershipMode::Managed);
    let join = w.join_token.clone();
    let bad = w.join("bad", &join).unwrap();
    let jobs = w.run(5, &[(bad.clone(), HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    let token = launch_token(&jobs).expect("a launch with a registration token");
    w.advance(REPLACEMENT_TOKEN_TTL_MS + 1);
    let reg = w.registration("late");
    let err = w.c.register_host_with_token(reg, &token).unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");
    assert!(w.only_incident().replacement.as_ref().is_some_and(|b| b.host_id.is_none()));
}

/// A self-managed pool's one host, impaired until it was declared bad: the world, the host
/// and its incident.
fn impaired_self_managed_host() -> (World, HostId, String) {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let join = w.join_token.clone();
    let host = w.join("h", &join).unwrap();
    w.run(5, &[(host.clone(), HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    let id = w.only_incident().id;
    (w, host, id)
}

/// The operator's path in a self-managed pool: the impaired host is drained, then refused
/// activation while its check is not OK, then activated once repaired; the incident resolves
/// and the timeline names who did each step.
#[test]
fn self_managed_drain_repair_activate() {
    let (mut w, host, id) = impaired_self_managed_host();
    let err = w.c.operator_action(host.as_str(), OperatorAction::Replace, "admin").unwrap_err();
    assert!(
        err.to_string().contains("no capacity provider") && err.to_string().contains("host activate"),
        "{err}"
    );
    w.c.acknowledge_incident(&id, "admin").unwrap();
    w.c.operator_action(host.as_str(), OperatorAction::Drain, "admin").unwrap();
    let err = w.c.activate_host(host.as_str(), "admin").unwrap_err();
    assert!(err.to_string().contains("MPS_DAEMON"), "{err}");
    w.run(3, &[(host.clone(), HealthStatus::Ok)], |_| ProviderOutcome::Done);
    let (view, outcome) = w.c.activate_host(host.as_str(), "admin").unwrap();
    assert_eq!(view.status, HostStatus::Active);
    assert!(!view.cordoned);
    let i = outcome.expect("the incident").incident;
    assert_eq!(i.state, IncidentState::Resolved);
    let steps: Vec<(Step, Option<&str>)> = i.timeline.iter().map(|e| (e.step, e.by.as_deref())).collect();
    for want in [
        (Step::Acknowledged, Some("admin")),
        (Step::OperatorCommand, Some("admin")),
        (Step::DrainStarted, None),
        (Step::HostActivated, Some("admin")),
        (Step::Resolved, Some("admin")),
    ] {
        assert!(steps.contains(&want), "{want:?} missing from {steps:?}");
    }
    assert!(can_place(w.c.state.hosts()[w.c.sched.host(&host).unwrap() as usize].host()));
}

/// An operator's command is recorded by the request and carried out by the remediation
/// controller on its own pass, which the request wakes: the request never runs the plan.
#[test]
fn an_operators_command_is_recorded_by_the_request_and_carried_out_by_the_controller() {
    let (mut w, host, id) = impaired_self_managed_host();
    w.c.take_wake();
    let steps = |w: &World| -> Vec<Step> {
        w.c.read().incident(&id).unwrap().timeline.iter().map(|e| e.step).collect()
    };
    w.c.operator_action(host.as_str(), OperatorAction::Drain, "admin").unwrap();
    assert!(w.c.take_wake(), "the command wakes the controllers");
    assert!(steps(&w).contains(&Step::OperatorCommand), "{:?}", steps(&w));
    assert!(!steps(&w).contains(&Step::DrainStarted), "the request only records it: {:?}", steps(&w));
    w.c.run_work();
    assert!(steps(&w).contains(&Step::DrainStarted), "{:?}", steps(&w));
}

/// A data directory written before timelines were bounded opens: its incidents are rewritten
/// bounded, with the steps they reached, and the schema version is recorded. A store written
/// by a newer schema is refused.
#[test]
fn an_old_state_is_migrated_and_a_newer_one_refused() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let join = w.join_token.clone();
    let host = w.join("h", &join).unwrap();
    w.run(5, &[(host.clone(), HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    let i = w.only_incident();
    // The record as schema 1 wrote it: a plain, unbounded timeline and no `reached`.
    let mut v = serde_json::to_value(&i).unwrap();
    let old: Vec<serde_json::Value> = (0..300)
        .map(|k| serde_json::json!({"atMs": 1_000 + k, "step": if k == 0 { "DETECTED" } else { "BLOCKED" }, "detail": format!("entry {k}")}))
        .collect();
    v["timeline"] = serde_json::Value::Array(old);
    v.as_object_mut().unwrap().remove("reached");
    let store = w.c.store.clone();
    let version = store.get(super::kinds::INCIDENT, &i.id).unwrap().unwrap().version;
    store
        .commit(&[
            Op::put(
                super::kinds::INCIDENT,
                i.id.clone(),
                serde_json::to_vec(&v).unwrap(),
                Precondition::Version(version),
            ),
            Op::delete("meta", "schema", Precondition::Any),
        ])
        .unwrap();
    let c = Cluster::load(store.clone(), w.clock.clone(), |_| Ok(())).unwrap();
    let back = c.read().incident(&i.id).unwrap();
    assert!(back.timeline.len() <= TimelineEvent::HEAD + TimelineEvent::TAIL);
    assert_eq!(back.timeline.total(), 300);
    assert_eq!(back.first(Step::Detected), Some(1_000));
    let stored: serde_json::Value =
        serde_json::from_slice(&store.get(super::kinds::INCIDENT, &i.id).unwrap().unwrap().value).unwrap();
    assert_eq!(stored["reached"]["DETECTED"], serde_json::json!(1_000));
    assert!(stored["timeline"]["entries"].as_array().unwrap().len() <= 64);
    let schema: serde_json::Value =
        serde_json::from_slice(&store.get("meta", "schema").unwrap().unwrap().value).unwrap();
    assert_eq!(schema["version"], serde_json::json!(SCHEMA_VERSION));

    store.commit(&[Op::put("meta", "schema", br#"{"version": 99}"#.to_vec(), Precondition::Any)]).unwrap();
    let err = Cluster::load(store, w.clock.clone(), |_| Ok(())).err().expect("a newer schema is refused");
    assert!(err.to_string().contains("newer mpsfleet (schema 99)"), "{err}");
}

/// Stopped tasks and resolved incidents leave after their retention, and the change feed
/// after its age.
#[test]
fn stopped_tasks_resolved_incidents_and_old_feed_entries_leave() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let join = w.join_token.clone();
    let host = w.join("h", &join).unwrap();
    w.run(5, &[(host.clone(), HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    w.run(5, &[(host.clone(), HealthStatus::Ok)], |_| ProviderOutcome::Done);
    let i = w.only_incident();
    assert_eq!(i.state, IncidentState::Resolved, "{:#?}", i.timeline);
    let td = br#"{"family": "t", "containerDefinitions": [{"name": "c", "image": "x", "command": ["sleep", "1"]}]}"#;
    w.c.register_taskdef(td).unwrap();
    let run =
        w.c.run_tasks(RunTask {
            task_definition: "t".into(),
            count: 1,
            pool: "p".into(),
            client_token: None,
            ..Default::default()
        })
        .unwrap();
    let task = run.tasks[0].id;
    w.c.stop_task(&task.to_string(), None).unwrap();
    // The agent reports the stop.
    let report: TaskStateReport =
        serde_json::from_value(serde_json::json!({"lastStatus": "STOPPED"})).unwrap();
    w.c.report_task(&host, &task.to_string(), report).unwrap();
    assert_eq!(w.c.read().task(&task.to_string()).unwrap().last_status, TaskStatus::Stopped);

    w.c.run_retention().unwrap();
    assert!(w.c.read().task(&task.to_string()).is_ok(), "kept within its retention");
    assert!(w.c.read().incident(&i.id).is_ok(), "kept within its retention");

    w.advance(STOPPED_TASK_RETENTION_MS + 1);
    w.c.run_retention().unwrap();
    assert!(w.c.read().task(&task.to_string()).is_err());
    assert!(w.c.store.get(TASK, &task.to_string()).unwrap().is_none());
    assert!(w.c.read().incident(&i.id).is_ok());
    w.advance(RESOLVED_INCIDENT_RETENTION_MS);
    w.c.run_retention().unwrap();
    assert!(w.c.read().incident(&i.id).is_err());
    assert!(w.c.store.get(super::kinds::INCIDENT, &i.id).unwrap().is_none());

    // Everything in the feed is older than its age limit now.
    let rev = w.c.read().revision();
    w.c.run_retention().unwrap();
    let err = w.c.store.changes_since(0, 10).unwrap_err();
    assert!(matches!(err, mpsfleet_store::StoreError::Compacted { .. }), "{err}");
    assert!(w.c.store.changes_since(rev, 10).is_ok());
}

/// Retention is a key of the work queue: nothing is removed before the server starts it (the
/// simulator never does); once started it runs at once, and again every
/// `RETENTION_INTERVAL_MS`.
#[test]
fn retention_runs_on_the_work_queue_once_started() {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let join = w.join_token.clone();
    let host = w.join("h", &join).unwrap();
    let td = br#"{"family": "t", "containerDefinitions": [{"name": "c", "image": "x", "command": ["sleep", "1"]}]}"#;
    w.c.register_taskdef(td).unwrap();
    let stop = |w: &mut World| {
        let run =
            w.c.run_tasks(RunTask {
                task_definition: "t".into(),
                count: 1,
                pool: "p".into(),
                client_token: None,
                ..Default::default()
            })
            .unwrap();
        let task = run.tasks[0].id.to_string();
        w.c.stop_task(&task, None).unwrap();
        let report: TaskStateReport =
            serde_json::from_value(serde_json::json!({"lastStatus": "STOPPED"})).unwrap();
        w.c.report_task(&host, &task, report).unwrap();
        task
    };
    let first = stop(&mut w);
    w.advance(STOPPED_TASK_RETENTION_MS + 1);
    w.c.run_work();
    assert!(w.c.read().task(&first).is_ok(), "removed before retention was started");

    w.c.start_retention();
    w.c.run_work();
    assert!(w.c.read().task(&first).is_err(), "kept past its retention once retention started");
    assert!(w.c.work.queue.is_queued(&Work::Retention), "retention asks for its next run");

    let second = stop(&mut w);
    w.advance(STOPPED_TASK_RETENTION_MS + 1);
    w.c.run_work();
    assert!(w.c.read().task(&second).is_err(), "the next run removes the next stopped task");
}

/// A replacement token joins its incident's pool only; the refusal spends nothing.
#[test]
fn a_replacement_token_joins_its_incidents_pool_only() {
    let mut w = World::new(OwnershipMode::Managed);
    w.c.create_pool(CreatePool { name: "q".into(), ..Default::default() }).unwrap();
    let join = w.join_token.clone();
    let bad = w.join("bad", &join).unwrap();
    let jobs = w.run(5, &[(bad.clone(), HealthStatus::Impaired)], |_| ProviderOutcome::Done);
    let token = launch_token(&jobs).expect("a launch with a registration token");
    let mut reg = w.registration("elsewhere");
    reg.pool = PoolName::new("q").unwrap();
    let err = w.c.register_host_with_token(reg, &token).unwrap_err();
    assert!(err.to_string().contains("joins pool p"), "{err}");
    assert!(w.c.read().hosts(Some("q")).is_empty());
    let real = w.join("right-pool", &token).unwrap();
    assert!(w.only_incident().is_replacement(&real));
}

/// A host launched to keep a pool at its size joins with a token for that name in that pool
/// alone, never the join token: the token registers that host once, and nothing else; a
/// restarted server (same key) hands out the same token for the same launch.
#[test]
fn capacity_launches_carry_a_launch_token_scoped_to_one_host() {
    let mut w = World::new(OwnershipMode::Managed);
    let key = auth::ServerKey::random().unwrap();
    w.c.set_server_key(key.clone());
    w.c.create_pool(CreatePool {
        name: "q".into(),
        mode: Some(OwnershipMode::Managed),
        ..Default::default()
    })
    .unwrap();
    let mut pool = w.c.read().pool("p").unwrap();
    pool.provider = Some(Provider::local(1));
    w.c.update_pool("p", UpdatePool { provider: pool.provider.clone(), ..Default::default() }).unwrap();
    let jobs = w.run(1, &[], |_| ProviderOutcome::Done);
    let (name, token) = jobs
        .iter()
        .find_map(|j| match j {
            ProviderJob::Launch { incident, name, token: Some(t), .. } if incident.is_empty() => {
                Some((name.clone(), t.0.clone()))
            }
            _ => None,
        })
        .expect("a capacity launch with a token");
    assert!(token.starts_with("mpsf_launch_"), "{token}");
    assert_ne!(token, w.join_token);
    assert_eq!(w.c.launch_request(&PoolName::new("p").unwrap(), &name).join_token, "");

    // Another name, or another pool, is refused with what the token is for.
    let e = w.join("someone-else", &token).unwrap_err().to_string();
    assert!(e.contains(&format!("registers host {name} into pool p")), "{e}");
    let mut other_pool = w.registration(&name);
    other_pool.pool = PoolName::new("q").unwrap();
    let e = w.c.register_host_with_token(other_pool, &token).unwrap_err().to_string();
    assert!(e.contains("not host"), "{e}");
    // The launch token registers its host, once.
    w.join(&name, &token).expect("the launched host joins with its token");
    let e = w.join(&name, &token).unwrap_err().to_string();
    assert!(e.contains("already used") || e.contains("unknown token"), "{e}");
    // The token is no key to anything else.
    assert!(w.c.authenticate(&token).map_or(true, |p| p.role().is_none() && !p.is_host()));

    // Same key, same pool and name: the same token (a relaunch after a restart finds it).
    let again = key.derive("mpsf_launch_", "launch", &["p", &name]);
    assert_eq!(again, token);
}
