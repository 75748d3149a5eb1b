//! Services: keep N tasks of a task definition running, and roll them over to a new one
//! through deployments, as ECS does.
//!
//! A service record holds its deployments, newest (PRIMARY) first. `reconcile_service_once` takes
//! where every replica stands, asks the pure planner (`mpsfleet_core::deployment::plan`) what
//! the deployment's bounds allow now, stops and starts that, and then settles the
//! deployments: the PRIMARY one completes once all its desired tasks are healthy and no older
//! task is left; an older one turns INACTIVE when its last task has stopped. It runs on every
//! change to a replica (placed, running, ready, healthy, stopped) and at every resync. A task
//! of the PRIMARY deployment that fails counts toward its circuit breaker
//! (`note_service_failure`), which fails the deployment and, when asked, rolls back to the
//! last one that completed.

use super::deleted::DeletedObject;
use super::work::Work;
use super::*;
use mpsfleet_core::controller::Action;
use mpsfleet_core::deployment::{self, Bounds, Replica, ReplicaState, StopWhy};
use mpsfleet_core::lifecycle::service as service_lifecycle;
use mpsfleet_types::event::{EventType, Subject};
use mpsfleet_types::labels::check_tags;
use mpsfleet_types::policy::ResumptionBoundary;
use mpsfleet_types::service::{
    CircuitBreaker, Deployment, DeploymentConfiguration, DeploymentStatus, DeploymentView, ObjectEvent,
    RolloutState, SchedulingStrategy, DEFAULT_DEREGISTRATION_DELAY_S, DEPLOYMENTS_KEPT,
    MAX_DEREGISTRATION_DELAY_S,
};

impl Cluster {
    pub fn create_service(&mut self, req: CreateService) -> Result<ServiceView, Error> {
        let name = ServiceName::new(req.name).map_err(|e| Error::invalid("name", e.to_string()))?;
        check_tags("tags", &req.tags).map_err(|(f, m)| Error::invalid(f, m))?;
        if self.state.services().contains_key(&name) {
            return Err(Error::AlreadyExists { kind: "service", id: name.to_string() });
        }
        let strategy = req.scheduling_strategy.unwrap_or_default();
        let config = match strategy {
            SchedulingStrategy::Replica => {
                check_desired(req.desired_count)?;
                req.deployment_configuration.unwrap_or_default()
            }
            SchedulingStrategy::Daemon => {
                check_daemon_count(req.desired_count)?;
                req.deployment_configuration.unwrap_or_else(DeploymentConfiguration::daemon)
            }
        };
        check_deployment_configuration(&config)?;
        check_daemon_configuration(strategy, &config)?;
        let pool = self.pool_name("pool", &req.pool)?;
        let td = self.taskdef_to_run("taskDefinition", &req.task_definition)?;
        self.check_task_secrets(td)?;
        self.check_task_policy(&pool, td)?;
        let td = td.reference();
        let now = self.now();
        let desired_count = match strategy {
            SchedulingStrategy::Replica => req.desired_count,
            SchedulingStrategy::Daemon => self.reader().active_hosts_of(&pool),
        };
        let mut svc = Service {
            name: name.clone(),
            pool,
            task_definition: td,
            desired_count,
            scheduling_strategy: strategy,
            resumption: req.resumption.unwrap_or_default(),
            status: ServiceStatus::Active,
            created_at_ms: now,
            updated_at_ms: now,
            deployment_configuration: config,
            deregistration_delay_seconds: check_deregistration_delay(req.deregistration_delay_seconds)?,
            deployments: Vec::new(),
            next_deployment: 1,
            events: Default::default(),
            moving: Vec::new(),
            tags: req.tags,
            kept_fields: req.kept_fields,
        };
        if !svc.kept_fields.is_empty() {
            let fields: Vec<&str> = svc.kept_fields.keys().map(String::as_str).collect();
            let msg = format!(
                "kept as given, not acted on: {} (mpsfleet wires no load balancer, service registry or role, \
                 places by the pool's strategy and runs every task on the pool's hosts)",
                fields.join(", ")
            );
            svc.events.push(now, ObjectEvent::new("FieldsKept", msg));
        }
        if let Some(why) = self.not_in_discovery(&svc) {
            svc.events.push(now, ObjectEvent::new("NotInDiscovery", format!("not published in DNS: {why}")));
        }
        start_deployment(&mut svc, now, "service created".into());
        // A REPLICA service's first tasks are placed in its own commit, so the answer shows
        // them as RunTask's does; everything after is the service controller's.
        let mut batch = Batch::default();
        let first = match strategy {
            SchedulingStrategy::Replica => {
                self.writer().create_tasks(&tasks_of(&svc), svc.desired_count, &mut batch)
            }
            SchedulingStrategy::Daemon => Ok(()),
        };
        let started: Vec<Task> = batch.created.iter().map(|(t, _, _)| t.clone()).collect();
        push_started(&mut svc, &started, String::new(), now);
        let committed = first
            .and_then(|()| Ok(Op::put_json(SERVICE, name.as_str(), &svc, Precondition::Absent)?))
            .and_then(|op| self.commit(&[&[op][..], &batch.ops].concat()));
        let rev = match committed {
            Ok(rev) => rev,
            Err(e) => {
                self.writer().rollback(&batch);
                return Err(e);
            }
        };
        self.publish_service_events(0, &svc);
        self.apply(rev, Change::Service(svc));
        for (task, placement, _) in batch.created {
            self.writer().insert_task(task, rev, placement, true);
        }
        self.ask_now(Work::Service(name.clone()));
        self.service(name.as_str())
    }

    pub fn update_service(&mut self, name: &str, req: UpdateService) -> Result<ServiceView, Error> {
        let current = self.service_record(name)?;
        if current.value.status == ServiceStatus::Draining {
            return Err(Error::Conflict(format!("service {name} is being deleted")));
        }
        let mut svc = current.value.clone();
        let now = self.now();
        if let Some(c) = req.deployment_configuration {
            check_deployment_configuration(&c)?;
            check_daemon_configuration(svc.scheduling_strategy, &c)?;
            svc.deployment_configuration = c;
        }
        if req.deregistration_delay_seconds.is_some() {
            svc.deregistration_delay_seconds = check_deregistration_delay(req.deregistration_delay_seconds)?;
        }
        if let Some(d) = req.desired_count.filter(|_| svc.scheduling_strategy == SchedulingStrategy::Daemon) {
            check_daemon_count(d)?;
        } else if let Some(d) = req.desired_count {
            check_desired(d)?;
            svc.desired_count = d;
            if let Some(p) = svc.deployments.first_mut() {
                p.desired_count = d;
            }
        }
        if let Some(td) = &req.task_definition {
            let def = self.taskdef_to_run("taskDefinition", td)?;
            self.check_task_secrets(def)?;
            self.check_task_policy(&svc.pool, def)?;
            let r = def.reference();
            if r != svc.task_definition {
                let why = format!("{} replaces {}", r, svc.task_definition);
                svc.task_definition = r;
                start_deployment(&mut svc, now, why);
            }
        }
        svc.kept_fields.extend(req.kept_fields);
        if req.force_new_deployment {
            if svc.task_definition == current.value.task_definition {
                start_deployment(&mut svc, now, "a new deployment was forced: every task is replaced".into());
            }
            if let Some(d) = svc.deployments.first_mut() {
                d.forced_at_ms = Some(now);
            }
        }
        if svc != current.value {
            svc.updated_at_ms = now;
            self.write_service(svc)?;
        }
        let name = current.value.name;
        self.ask_now(Work::Service(name.clone()));
        self.service(name.as_str())
    }

    /// Marks the service DRAINING; its tasks are stopped and the record goes with the last one.
    pub fn delete_service(&mut self, name: &str) -> Result<ServiceView, Error> {
        let current = self.service_record(name)?;
        let mut svc = current.value.clone();
        if svc.status != ServiceStatus::Draining {
            service_lifecycle::apply_service(&mut svc, service_lifecycle::ServiceEvent::Delete)
                .map_err(Error::Conflict)?;
            svc.desired_count = 0;
            svc.updated_at_ms = self.now();
            svc.events.push(svc.updated_at_ms, ObjectEvent::new("ServiceDeleted", "stopping every task"));
            self.write_service(svc.clone())?;
        }
        let view = self.view_of(&svc);
        self.ask_now(Work::Service(svc.name.clone()));
        Ok(view)
    }

    /// Why service discovery will not publish `svc` (docs/traffic.md), if it will not: a name
    /// that is not a DNS label, or one another service of its pool has but for case.
    fn not_in_discovery(&self, svc: &Service) -> Option<String> {
        if let Some(why) = mpsfleet_types::discovery::unpublishable(svc.pool.as_str(), svc.name.as_str()) {
            return Some(why);
        }
        let twin = self.state.services().values().map(|v| &v.value).find(|o| {
            o.pool == svc.pool
                && o.name != svc.name
                && o.name.as_str().eq_ignore_ascii_case(svc.name.as_str())
        })?;
        Some(format!(
            "service {} of pool {} has the same name but for case: neither is published",
            twin.name, svc.pool
        ))
    }

    pub(super) fn service_record(&self, name: &str) -> Result<Versioned<Service>, Error> {
        self.state
            .services()
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| Error::not_found("service", name))
    }

    pub(super) fn write_service(&mut self, svc: Service) -> Result<(), Error> {
        let version = self.state.services().get(&svc.name).map_or(0, |v| v.version);
        let rev =
            self.commit(&[Op::put_json(SERVICE, svc.name.as_str(), &svc, Precondition::Version(version))?])?;
        let seen = self.state.services().get(&svc.name).map_or(0, |v| v.value.events.pushed());
        self.publish_service_events(seen, &svc);
        self.apply(rev, Change::Service(svc));
        Ok(())
    }

    /// Publishes the entries of a committed service's events after the first `seen`.
    fn publish_service_events(&self, seen: u64, svc: &Service) {
        let news: Vec<ObjectEvent> = svc.events.since(seen).iter().map(|e| e.event.clone()).collect();
        if !news.is_empty() {
            let subject = Subject { id: svc.name.to_string(), pool: svc.pool.clone() };
            self.events.recorded(EventType::ServiceEvent, &subject, &news, self.now());
        }
    }

    fn view_of(&self, svc: &Service) -> ServiceView {
        let live = Some(self.state.tasks().of_service(&svc.name));
        let count = |f: &dyn Fn(&Task) -> bool| {
            live.map_or(0, |ids| {
                ids.iter().filter_map(|id| self.state.tasks().get(id)).filter(|e| f(&e.task)).count()
            }) as u32
        };
        ServiceView {
            service: svc.clone(),
            running_count: count(&|t| t.last_status == TaskStatus::Running),
            pending_count: count(&|t| t.last_status < TaskStatus::Running),
            healthy_count: count(&|t| self.reader().replica_state(t) == ReplicaState::Healthy),
            health_checked: self.reader().health_checked(&svc.task_definition),
        }
    }

    pub fn service(&self, name: &str) -> Result<ServiceView, Error> {
        Ok(self.view_of(&self.service_record(name)?.value))
    }

    /// The service's deployments, newest first, with the counts of their tasks (a task
    /// counts toward the newest live deployment of its definition).
    pub fn service_deployments(&self, name: &str) -> Result<Vec<DeploymentView>, Error> {
        let svc = self.service_record(name)?.value;
        let mut views: Vec<DeploymentView> = svc
            .deployments
            .iter()
            .map(|d| DeploymentView {
                deployment: d.clone(),
                running_count: 0,
                pending_count: 0,
                healthy_count: 0,
                health_checked: self.reader().health_checked(&d.task_definition),
            })
            .collect();
        for id in self.state.tasks().of_service(&svc.name) {
            let Some(e) = self.state.tasks().get(id) else { continue };
            let t = &e.task;
            let Some(v) = views.iter_mut().find(|v| {
                v.deployment.task_definition == t.task_definition
                    && v.deployment.status != DeploymentStatus::Inactive
            }) else {
                continue;
            };
            match self.reader().replica_state(t) {
                ReplicaState::Stopping => {}
                ReplicaState::Healthy => {
                    v.healthy_count += 1;
                    v.running_count += 1;
                }
                _ if t.last_status == TaskStatus::Running => v.running_count += 1,
                _ => v.pending_count += 1,
            }
        }
        Ok(views)
    }

    pub fn services(&self) -> Vec<ServiceView> {
        self.state.services().values().map(|v| self.view_of(&v.value)).collect()
    }

    /// Takes the step of the service's rollout that its bounds allow now (module docs), then
    /// settles its deployments. A deleted service goes once its last task has stopped. Says
    /// when to run again: when a hold-back or a settle time it waits for ends, or not until
    /// something changes.
    pub(super) fn reconcile_service_once(&mut self, name: &ServiceName) -> Result<Action, Error> {
        let Some(mut svc) = self.state.services().get(name).map(|v| v.value.clone()) else {
            return Ok(Action::AwaitChange);
        };
        let before = svc.clone();
        let now = self.now();
        if svc.deployments.is_empty() {
            // A record from before deployments: its current definition is one in progress.
            start_deployment(&mut svc, now, "deployments began".into());
        }
        let failed = svc.deployments[0].rollout_state == RolloutState::Failed;
        let held = !failed && self.failing_too_fast(name);
        // When to run again by itself: once the oldest failure leaves the hold-back's window.
        let mut wake = if held {
            self.work
                .service_failures
                .get(name)
                .and_then(|f| f.front())
                .map(|t| t + SERVICE_RESTART_WINDOW_MS + 1)
        } else {
            None
        };
        if held && svc.events.last().is_none_or(|e| e.reason != "ReplacementsHeldBack") {
            let latest = svc.deployments[0].failures.last().map(|g| g.reason.clone());
            let msg = format!(
                "replacements held back: {SERVICE_RESTART_BURST} task(s) failed within {} s{}; the next start waits until that slows",
                SERVICE_RESTART_WINDOW_MS / 1000,
                latest.map(|r| format!(" (latest: {r})")).unwrap_or_default()
            );
            svc.events.push(now, ObjectEvent::new("ReplacementsHeldBack", msg));
        }
        let may_start = !failed && !held;
        if svc.scheduling_strategy == SchedulingStrategy::Daemon {
            let bounds = self.daemon_step(&mut svc, may_start, now)?;
            let replicas = self.reader().replicas(&svc);
            return self.settle_and_write(svc, before, &replicas, &bounds, wake, now);
        }
        let fenced = svc.resumption == ResumptionBoundary::Fenced;
        let bounds = Bounds::new(svc.desired_count, &svc.deployment_configuration, fenced);
        let live = self.state.tasks().of_service(name);
        svc.moving.retain(|id| live.contains(id));
        let mut replicas = self.reader().replicas(&svc);
        // A replica marked as moving is no longer current.
        if may_start && svc.moving.is_empty() && self.rebalance(&mut svc, &replicas, now) {
            replicas = self.reader().replicas(&svc);
        }
        let mut plan = deployment::plan(bounds, &replicas, may_start);
        // A protected task stays until its protection ends; the service looks again then.
        plan.stop.retain(|(id, _)| {
            match self.state.tasks().get(id).and_then(|e| e.task.protected_until(now)) {
                Some(until) => {
                    wake = Some(wake.map_or(until, |w| w.min(until)));
                    false
                }
                None => true,
            }
        });
        let unchanged = plan.stop.is_empty() && plan.start == 0;

        let mut to_stop = Vec::with_capacity(plan.stop.len());
        let (mut replaced, mut moved, mut scaled_in) = (0, 0, 0);
        for (id, why) in &plan.stop {
            let Some(e) = self.state.tasks().get(id) else { continue };
            let reason = match why {
                StopWhy::Replaced => {
                    if svc.moving.contains(id) {
                        moved += 1;
                        "moved to spread the service's replicas over daemons".to_string()
                    } else {
                        replaced += 1;
                        format!(
                            "replaced by a task of {} (deployment {})",
                            svc.task_definition, svc.deployments[0].id
                        )
                    }
                }
                StopWhy::ScaledIn => {
                    scaled_in += 1;
                    "service scaled in".to_string()
                }
            };
            let delay = svc.deregistration_delay_seconds;
            let record =
                self.reader().planned_stop(&e.task, delay, StopCode::ServiceSchedulerInitiated, &reason, now);
            if let Some(d) = &record.draining {
                wake = Some(wake.map_or(d.until_ms, |w| w.min(d.until_ms)));
            }
            to_stop.push(record);
        }
        // Replicas whose time out of traffic is over get their stop now.
        for id in self.state.tasks().of_service(name) {
            let Some(e) = self.state.tasks().get(id) else { continue };
            match &e.task.draining {
                Some(d) if e.task.desired_status != TaskStatus::Stopped && d.until_ms <= now => {
                    to_stop.push(self.reader().stopped_record(&e.task, d.stop_code, &d.reason));
                }
                Some(d) if e.task.desired_status != TaskStatus::Stopped => {
                    wake = Some(wake.map_or(d.until_ms, |w| w.min(d.until_ms)));
                }
                _ => {}
            }
        }
        let unchanged = unchanged && to_stop.is_empty();
        self.writing(|w| w.write_tasks(to_stop))?;
        if replaced > 0 {
            let msg = format!("stopped {replaced} task(s) of older definitions ({})", bounds_words(&bounds));
            svc.events.push(now, ObjectEvent::new("TasksReplaced", msg));
        }
        if moved > 0 {
            let msg = format!(
                "stopped {moved} task(s) to move them to a daemon of their own ({})",
                bounds_words(&bounds)
            );
            svc.events.push(now, ObjectEvent::new("TasksMoved", msg));
        }
        if scaled_in > 0 {
            let msg = format!("stopped {scaled_in} task(s) beyond the desired count");
            svc.events.push(now, ObjectEvent::new("ScaledIn", msg));
        }
        if plan.start > 0 {
            let started = self.writing(|w| w.start_tasks(tasks_of(&svc), plan.start))?;
            // Replicas on a daemon whose failure is confirmed are not counted: their copies
            // start now, and the service runs more than its count until they stop or their
            // daemon answers again (at least once, never fewer).
            let at_risk = (self.state.tasks().of_service(name).iter())
                .filter_map(|id| self.state.tasks().get(id))
                .filter(|e| e.task.desired_status != TaskStatus::Stopped && self.reader().at_risk(&e.task))
                .count();
            let why = if at_risk > 0 {
                format!(
                    " for {at_risk} replica(s) on an MPS daemon whose failure is confirmed (the service runs above \
                     its count until they stop or their daemon answers again)"
                )
            } else {
                String::new()
            };
            push_started(&mut svc, &started, why, now);
        }
        // Tasks stopped or started: their replicas are looked at again.
        let replicas = if unchanged { replicas } else { self.reader().replicas(&svc) };
        self.settle_and_write(svc, before, &replicas, &bounds, wake, now)
    }

    /// The end of every reconcile: settles the deployments, removes a deleted service whose
    /// last task has stopped, writes what changed, and says when to run again (`wake`).
    fn settle_and_write(
        &mut self,
        mut svc: Service,
        before: Service,
        replicas: &[Replica<TaskId>],
        bounds: &Bounds,
        wake: Option<u64>,
        now: u64,
    ) -> Result<Action, Error> {
        let name = svc.name.clone();
        self.settle_deployments(&mut svc, replicas, bounds, now);
        if svc.status == ServiceStatus::Draining && self.state.tasks().of_service(&name).is_empty() {
            // Kept as ECS's INACTIVE service for a while, in the commit that removes it.
            let version = self.state.services().get(&name).map_or(0, |v| v.version);
            svc.updated_at_ms = now;
            let (mut ops, kept) = self.keep_deleted(DeletedObject::Service(Box::new(svc)))?;
            ops.push(Op::delete(SERVICE, name.as_str(), Precondition::Version(version)));
            let rev = self.commit(&ops)?;
            self.apply(rev, Change::ServiceRemoved(name.clone()));
            self.kept_deleted(rev, kept);
            return Ok(Action::AwaitChange);
        }
        if svc != before {
            svc.updated_at_ms = now;
            self.write_service(svc)?;
        }
        Ok(match wake {
            Some(t) => Action::RequeueAfter(t.saturating_sub(now).max(1)),
            None => Action::AwaitChange,
        })
    }

    /// Spreads replicas again once nothing else moves (the PRIMARY deployment completed, every
    /// replica current and healthy: no recovery of the service under way; a `fenced` service
    /// only when its configuration opts in). Replicas are marked as moving, and the rollout
    /// replaces them within the deployment bounds:
    /// - over hosts first: while the scheduler would place a new replica on a host holding at
    ///   least two fewer of the service's replicas than the most crowded one, the newest
    ///   replica there moves; as many at once as the deployment's surge (`maximumPercent`
    ///   above the desired count) can start, each placed in turn, so a large imbalance is
    ///   spread in one step rather than one replica per rollout;
    /// - else one replica that shares its daemon (a GPU, or a host for a task without GPUs)
    ///   while the scheduler would place it on a daemon with none.
    fn rebalance(&mut self, svc: &mut Service, replicas: &[Replica<TaskId>], now: u64) -> bool {
        let fenced = svc.resumption == ResumptionBoundary::Fenced;
        if svc.status != ServiceStatus::Active
            || svc.deployments.first().is_none_or(|d| d.rollout_state != RolloutState::Completed)
            || (fenced && !svc.deployment_configuration.rebalance_fenced)
        {
            return false;
        }
        if replicas.len() != svc.desired_count as usize
            || replicas.iter().any(|r| !r.current || r.state != ReplicaState::Healthy)
        {
            return false;
        }
        let bounds = Bounds::new(svc.desired_count, &svc.deployment_configuration, fenced);
        let at_once = bounds.max_total.saturating_sub(bounds.desired).max(1) as usize;
        let mut per_host: BTreeMap<HostIx, Vec<(u64, TaskId)>> = BTreeMap::new();
        for r in replicas {
            if let Some(p) = self.state.tasks().get(&r.id).and_then(|e| e.placement.as_ref()) {
                per_host.entry(p.host).or_default().push((r.seq, r.id));
            }
        }
        let moves = self.host_moves(per_host, at_once);
        let msg = match moves.as_slice() {
            [] => match self.daemon_move(replicas) {
                Some((id, msg)) => {
                    svc.moving.push(id);
                    msg
                }
                None => return false,
            },
            [m] => format!(
                "moving task {} off host {}, which holds {} of the service's replicas, to host {}, which holds {}",
                m.task, m.from, m.from_held, m.to, m.to_held
            ),
            many => {
                let listed: Vec<String> = many
                    .iter()
                    .take(5)
                    .map(|m| format!("{} off host {} ({}) to host {} ({})", m.task, m.from, m.from_held, m.to, m.to_held))
                    .collect();
                let more = many.len().saturating_sub(listed.len());
                let more = if more > 0 { format!(", and {more} more") } else { String::new() };
                format!(
                    "moving {} tasks to spread the service's replicas over hosts (replicas each host held): {}{more}",
                    many.len(),
                    listed.join(", ")
                )
            }
        };
        svc.moving.extend(moves.iter().map(|m| m.task));
        svc.events.push(now, ObjectEvent::new("ReplicaMoved", msg));
        true
    }

    /// Up to `at_once` moves that spread the replicas (`per_host`: each host's replicas of the
    /// service, with their sequence numbers) over hosts: the newest replica of the most
    /// crowded host, to where the scheduler would place it, while that host holds at least two
    /// fewer. Each move's placement is held while the next is chosen, then all are given back:
    /// the rollout places the replacements.
    fn host_moves(
        &mut self,
        mut per_host: BTreeMap<HostIx, Vec<(u64, TaskId)>>,
        at_once: usize,
    ) -> Vec<HostMove> {
        let mut held = Vec::new();
        let mut moves = Vec::new();
        let mut arriving: BTreeMap<HostIx, usize> = BTreeMap::new();
        let count =
            |per_host: &BTreeMap<HostIx, Vec<(u64, TaskId)>>, arriving: &BTreeMap<HostIx, usize>, h| {
                per_host.get(&h).map_or(0, Vec::len) + arriving.get(&h).copied().unwrap_or(0)
            };
        while moves.len() < at_once {
            // The most crowded host (the first among equals) and its newest replica.
            let Some(from) = per_host
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(h, _)| *h)
                .max_by_key(|h| (count(&per_host, &arriving, *h), std::cmp::Reverse(*h)))
            else {
                break;
            };
            let Some(&(_, id)) = per_host[&from].iter().max() else { break };
            let Some(task) = self.state.tasks().get(&id).map(|e| e.task.clone()) else { break };
            let Ok(req) = placement::request_for(&self.state, &mut self.sched, &task) else { break };
            let Ok(p) = self.sched.place(&req) else { break };
            let (from_held, to_held) =
                (count(&per_host, &arriving, from), count(&per_host, &arriving, p.host));
            let to = p.host;
            held.push((req, p));
            if to_held + 2 > from_held {
                break;
            }
            *arriving.entry(to).or_default() += 1;
            if let Some(v) = per_host.get_mut(&from) {
                v.retain(|(_, t)| *t != id);
            }
            let (from, to) = (self.sched.host_id(from).clone(), self.sched.host_id(to).clone());
            moves.push(HostMove { task: id, from, from_held, to, to_held });
        }
        for (req, p) in held.iter().rev() {
            self.sched.release(req, p);
        }
        moves
    }

    /// One replica that shares its daemon with another, when the scheduler would place it on
    /// a daemon with none of the service's replicas; with the event's message.
    fn daemon_move(&mut self, replicas: &[Replica<TaskId>]) -> Option<(TaskId, String)> {
        let daemon = |id: &TaskId| {
            self.state
                .tasks()
                .get(id)
                .and_then(|e| e.placement.as_ref())
                .map(|p| (p.host, p.gpus.first().copied()))
        };
        let mut on: BTreeMap<Daemon, Vec<(u64, TaskId)>> = BTreeMap::new();
        for r in replicas {
            if let Some(d) = daemon(&r.id) {
                on.entry(d).or_default().push((r.seq, r.id));
            }
        }
        let &(_, id) = on.values().filter(|v| v.len() > 1).find_map(|v| v.iter().max())?;
        let task = self.state.tasks().get(&id).map(|e| e.task.clone())?;
        let req = placement::request_for(&self.state, &mut self.sched, &task).ok()?;
        // Where a new replica would go; given back at once.
        let p = self.sched.place(&req).ok()?;
        self.sched.release(&req, &p);
        if on.contains_key(&(p.host, p.gpus.first().copied())) {
            return None;
        }
        let from = match (&task.host_id, task.gpu_ids.first()) {
            (Some(h), Some(g)) => format!("GPU {g} of host {h}"),
            (Some(h), None) => format!("host {h}"),
            _ => return None,
        };
        let to = self.sched.host_id(p.host).clone();
        Some((id, format!("moving task {id} off {from}, which it shares with another replica, to a daemon with none (on host {to})")))
    }

    /// Completes the PRIMARY deployment once its desired tasks are all healthy and no older
    /// task is left; retires an older deployment whose last task has stopped.
    fn settle_deployments(&self, svc: &mut Service, replicas: &[Replica<TaskId>], bounds: &Bounds, now: u64) {
        let healthy_current =
            replicas.iter().filter(|r| r.current && r.state == ReplicaState::Healthy).count() as u32;
        let older_left = replicas.iter().any(|r| !r.current);
        let live_defs: BTreeSet<&TaskDefRef> = self
            .state
            .tasks()
            .of_service(&svc.name)
            .iter()
            .filter_map(|id| self.state.tasks().get(id))
            .map(|e| &e.task.task_definition)
            .collect();
        let primary_def = svc.task_definition.clone();
        let moving = !svc.moving.is_empty();
        let mut events = Vec::new();
        for (i, d) in svc.deployments.iter_mut().enumerate() {
            if i == 0 {
                let done = healthy_current >= bounds.desired && !older_left && !moving;
                if d.rollout_state == RolloutState::InProgress && done {
                    let reason =
                        format!("all {} task(s) of {} are healthy", bounds.desired, d.task_definition);
                    let completed = service_lifecycle::DeploymentEvent::Completed { reason };
                    if let Err(e) = service_lifecycle::apply_deployment(d, completed, now) {
                        tracing::warn!(deployment = %d.id, "{e}");
                        continue;
                    }
                    let msg = format!("deployment {} completed: the service reached a steady state", d.id);
                    events.push(ObjectEvent::new("DeploymentCompleted", msg));
                }
                continue;
            }
            if d.status == DeploymentStatus::Active
                && (d.task_definition == primary_def || !live_defs.contains(&&d.task_definition))
            {
                if let Err(e) =
                    service_lifecycle::apply_deployment(d, service_lifecycle::DeploymentEvent::Drained, now)
                {
                    tracing::warn!(deployment = %d.id, "{e}");
                }
            }
        }
        for e in events {
            svc.events.push(now, e);
        }
        trim_deployments(svc);
    }

    /// A task of the service stopped failing (`reason` is its stop reason). The service's
    /// events say so, grouped by reason with the deployment of the task's definition ("3
    /// task(s) of web:2 stopped: CannotPullContainerError: …"); it counts toward the PRIMARY
    /// deployment's circuit breaker if it ran that deployment's definition, and a tripped
    /// breaker names the reasons.
    pub(super) fn note_service_failure(&mut self, task: &Task, reason: &str) -> Result<(), Error> {
        let Some(name) = &task.group else { return Ok(()) };
        let Some(mut svc) = self.state.services().get(name).map(|v| v.value.clone()) else { return Ok(()) };
        let now = self.now();
        let id = task.id.to_string();
        let grouped = svc
            .deployments
            .iter_mut()
            .find(|d| d.status != DeploymentStatus::Inactive && d.task_definition == task.task_definition)
            .map(|d| {
                d.updated_at_ms = now;
                d.note_failure(&id, reason, now)
            });
        let shown: String = reason.chars().take(Deployment::FAILURE_REASON_CHARS).collect();
        let msg = match grouped {
            Some(n) => format!("{n} task(s) of {} stopped: {shown}", task.task_definition),
            None => format!("task {id} of {} stopped: {shown}", task.task_definition),
        };
        svc.events.push(now, ObjectEvent::new("TasksFailed", msg));
        let Some(d) = svc.deployments.first_mut() else { return self.write_service(svc) };
        if d.rollout_state != RolloutState::InProgress
            || d.task_definition != task.task_definition
            || task.created_at_ms < d.created_at_ms
        {
            svc.updated_at_ms = now;
            return self.write_service(svc);
        }
        d.failed_tasks += 1;
        d.updated_at_ms = now;
        let breaker = svc.deployment_configuration.deployment_circuit_breaker;
        let threshold = CircuitBreaker::threshold(d.desired_count);
        if breaker.enable && d.failed_tasks >= threshold {
            let reason = format!(
                "circuit breaker tripped: {} task(s) failed (threshold {threshold}): {}",
                d.failed_tasks,
                d.failures_words().join("; ")
            );
            service_lifecycle::apply_deployment(
                d,
                service_lifecycle::DeploymentEvent::Failed { reason },
                now,
            )
            .map_err(Error::Conflict)?;
            let failed_id = d.id.clone();
            let msg = format!("deployment {failed_id} failed: {}", d.rollout_state_reason);
            svc.events.push(now, ObjectEvent::new("DeploymentFailed", msg));
            if breaker.rollback {
                let last_good = svc
                    .deployments
                    .iter()
                    .skip(1)
                    .find(|d| d.rollout_state == RolloutState::Completed)
                    .map(|d| d.task_definition.clone());
                match last_good {
                    Some(def) => {
                        svc.task_definition = def.clone();
                        let why = format!("rollback of {failed_id}: circuit breaker tripped");
                        start_deployment(&mut svc, now, why);
                        let msg = format!("rolling back from {failed_id} to {def}");
                        svc.events.push(now, ObjectEvent::new("DeploymentRolledBack", msg));
                    }
                    None => {
                        let msg =
                            format!("deployment {failed_id} has no completed deployment to roll back to");
                        svc.events.push(now, ObjectEvent::new("RollbackImpossible", msg));
                    }
                }
            }
        }
        svc.updated_at_ms = now;
        self.write_service(svc)
    }

    /// Whether a service's tasks have failed so often lately that replacing them again now
    /// would only feed a crash loop: at most `SERVICE_RESTART_BURST` failures per
    /// `SERVICE_RESTART_WINDOW_MS`; the periodic resync replaces them once the window allows.
    fn failing_too_fast(&mut self, name: &ServiceName) -> bool {
        let now = self.now();
        let Some(failures) = self.work.service_failures.get_mut(name) else { return false };
        while failures.front().is_some_and(|&t| now.saturating_sub(t) > SERVICE_RESTART_WINDOW_MS) {
            failures.pop_front();
        }
        let too_fast = failures.len() >= SERVICE_RESTART_BURST;
        if too_fast {
            tracing::warn!(service = %name, failures = failures.len(), "tasks failing fast; replacement held back");
        }
        too_fast
    }
}

/// Makes a new PRIMARY deployment of the service's current definition; the previous PRIMARY
/// becomes ACTIVE (its tasks are replaced by the new one's).
fn start_deployment(svc: &mut Service, now: u64, reason: String) {
    for d in &mut svc.deployments {
        if d.status == DeploymentStatus::Primary {
            // PRIMARY takes Superseded in every rollout state: this cannot fail.
            let _ =
                service_lifecycle::apply_deployment(d, service_lifecycle::DeploymentEvent::Superseded, now);
        }
    }
    let n = svc.next_deployment.max(1);
    svc.next_deployment = n + 1;
    let id = format!("d-{n}");
    let mut why = reason;
    if svc.resumption == ResumptionBoundary::Fenced {
        why.push_str("; fenced: each old task stops before its replacement starts (at most one copy)");
    }
    let msg = format!("deployment {id} of {}: {why}", svc.task_definition);
    svc.events.push(now, ObjectEvent::new("DeploymentStarted", msg));
    svc.deployments.insert(
        0,
        Deployment {
            id,
            status: DeploymentStatus::Primary,
            task_definition: svc.task_definition.clone(),
            desired_count: svc.desired_count,
            rollout_state: RolloutState::InProgress,
            rollout_state_reason: why,
            failed_tasks: 0,
            created_at_ms: now,
            updated_at_ms: now,
            failures: Vec::new(),
            forced_at_ms: None,
        },
    );
    trim_deployments(svc);
}

/// Keeps the newest [`DEPLOYMENTS_KEPT`] deployments, dropping the oldest INACTIVE ones.
fn trim_deployments(svc: &mut Service) {
    while svc.deployments.len() > DEPLOYMENTS_KEPT {
        match svc.deployments.iter().rposition(|d| d.status == DeploymentStatus::Inactive) {
            Some(i) => {
                svc.deployments.remove(i);
            }
            None => break,
        }
    }
}

/// The bounds in words, for the service's events.
fn bounds_words(b: &Bounds) -> String {
    let mut s = format!("at least {} healthy, at most {} in all", b.min_healthy, b.max_total);
    if b.one_at_a_time {
        s.push_str("; one at a time, since the configured bounds left no room");
    }
    s
}

/// `deregistrationDelaySeconds`, checked: 0 to [`MAX_DEREGISTRATION_DELAY_S`]; the default
/// when not given.
fn check_deregistration_delay(s: Option<u32>) -> Result<u32, Error> {
    match s {
        None => Ok(DEFAULT_DEREGISTRATION_DELAY_S),
        Some(s) if s <= MAX_DEREGISTRATION_DELAY_S => Ok(s),
        Some(s) => Err(Error::invalid(
            "deregistrationDelaySeconds",
            format!("must be an integer from 0 to {MAX_DEREGISTRATION_DELAY_S}, got {s}"),
        )),
    }
}

fn check_desired(d: u32) -> Result<(), Error> {
    if d > MAX_DESIRED_COUNT {
        return Err(Error::invalid(
            "desiredCount",
            format!("must be an integer from 0 to {MAX_DESIRED_COUNT}, got {d}"),
        ));
    }
    Ok(())
}

/// ECS's ranges: the minimum from 0 to 100 percent; the maximum from 100 (no surge) to 400.
/// A DAEMON service's count is its pool's ACTIVE hosts: a request names none.
fn check_daemon_count(d: u32) -> Result<(), Error> {
    if d != 0 {
        return Err(Error::invalid(
            "desiredCount",
            format!(
                "a DAEMON service runs one task on each ACTIVE host of its pool: leave it unset (got {d})"
            ),
        ));
    }
    Ok(())
}

/// A DAEMON service replaces each host's task in place: never two on one host.
fn check_daemon_configuration(s: SchedulingStrategy, c: &DeploymentConfiguration) -> Result<(), Error> {
    if s == SchedulingStrategy::Daemon && c.maximum_percent != 100 {
        return Err(Error::invalid(
            "deploymentConfiguration.maximumPercent",
            format!("must be 100 for a DAEMON service (each host's task stops before its replacement starts), got {}", c.maximum_percent),
        ));
    }
    Ok(())
}

fn check_deployment_configuration(c: &DeploymentConfiguration) -> Result<(), Error> {
    if c.minimum_healthy_percent > 100 {
        return Err(Error::invalid(
            "deploymentConfiguration.minimumHealthyPercent",
            format!("must be an integer from 0 to 100, got {}", c.minimum_healthy_percent),
        ));
    }
    if !(100..=400).contains(&c.maximum_percent) {
        return Err(Error::invalid(
            "deploymentConfiguration.maximumPercent",
            format!("must be an integer from 100 to 400, got {}", c.maximum_percent),
        ));
    }
    if c.deployment_circuit_breaker.rollback && !c.deployment_circuit_breaker.enable {
        return Err(Error::invalid(
            "deploymentConfiguration.deploymentCircuitBreaker.rollback",
            "needs enable: true",
        ));
    }
    Ok(())
}

/// A daemon a replica runs under: its host and first GPU, or its host alone without GPUs.
type Daemon = (HostIx, Option<u32>);

/// One replica the rebalancer moves to spread a service over hosts, with the replicas of the
/// service each host held when it was chosen.
struct HostMove {
    task: TaskId,
    from: HostId,
    from_held: usize,
    to: HostId,
    to_held: usize,
}

/// What a service's new tasks are: its definition, in its pool, of its PRIMARY deployment.
pub(super) fn tasks_of(svc: &Service) -> NewTasks {
    NewTasks {
        task_definition: svc.task_definition.clone(),
        pool: svc.pool.clone(),
        group: Some(svc.name.clone()),
        started_by: format!("service:{}", svc.name),
        labels: Default::default(),
        deployment: svc.deployments.first().map(|d| d.id.clone()),
    }
}

/// The service's events for tasks it started (`why`: what the count is for, or empty), and
/// why those it could not place wait.
fn push_started(svc: &mut Service, started: &[Task], why: String, now: u64) {
    if started.is_empty() {
        return;
    }
    let msg = format!("started {} task(s) of {}{why}", started.len(), svc.task_definition);
    svc.events.push(now, ObjectEvent::new("TasksStarted", msg));
    if let Some(reason) = started.iter().find_map(|t| t.pending_reason.clone()) {
        let waiting = started.iter().filter(|t| t.host_id.is_none()).count();
        let msg = format!("unable to place {waiting} task(s): {reason}");
        svc.events.push(now, ObjectEvent::new("Unplaceable", msg));
    }
}
