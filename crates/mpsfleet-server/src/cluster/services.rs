//! Services as requests and reports change them: create, update and delete (each commits and
//! asks for the service's key; a REPLICA service's first tasks are placed in its create's own
//! commit), the views, and a failed task's count toward its deployment's circuit breaker
//! (`note_service_failure`), which fails the deployment and, when asked, rolls back to the
//! last one that completed. The rollout itself is the services controller's
//! (`controllers/services.rs`).

use super::controllers::services::{self, push_started, start_deployment, tasks_of};
use super::idempotency::*;
use super::work::Work;
use super::*;
use mpsfleet_core::deployment::ReplicaState;
use mpsfleet_core::lifecycle::service as service_lifecycle;
use mpsfleet_types::discovery::DiscoveredService;
use mpsfleet_types::discovery::ReplicaTraffic;
use mpsfleet_types::labels::check_tags;
use mpsfleet_types::service::ServiceEndpoint;
use mpsfleet_types::service::{
    CircuitBreaker, Deployment, DeploymentConfiguration, DeploymentStatus, DeploymentView, ObjectEvent,
    RolloutState, SchedulingStrategy, DEFAULT_DEREGISTRATION_DELAY_S, MAX_DEREGISTRATION_DELAY_S,
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
        let pool = pool_name(&self.state, "pool", &req.pool)?;
        let td = self.read().taskdef_to_run("taskDefinition", &req.task_definition)?;
        self.check_task_secrets(td)?;
        self.read().check_task_policy(&pool, td)?;
        let priority = place::priority_for(req.priority, &req.tags, td)?;
        let td = td.reference();
        let now = self.now();
        let desired_count = match strategy {
            SchedulingStrategy::Replica => req.desired_count,
            SchedulingStrategy::Daemon => self.read().active_hosts_of(&pool),
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
            priority,
            preempted_at_ms: None,
            enable_execute_command: req.enable_execute_command.unwrap_or(true),
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
        if let Some(why) = not_in_discovery(&self.state, &svc) {
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
            .and_then(|op| self.write(&[&[op][..], &batch.ops].concat(), [Change::Service(svc.clone())]));
        let rev = match committed {
            Ok(rev) => rev,
            Err(e) => {
                self.writer().rollback(&batch);
                return Err(e);
            }
        };
        services::publish_service_events(&self.writer(), 0, &svc);
        for (task, placement, _) in batch.created {
            self.writer().insert_task(task, rev, placement, true);
        }
        self.ask_now(Work::Service(name.clone()));
        self.read().service(name.as_str())
    }

    pub fn update_service(&mut self, name: &str, req: UpdateService) -> Result<ServiceView, Error> {
        let current = service_record(&self.state, name)?;
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
            let def = self.read().taskdef_to_run("taskDefinition", td)?;
            self.check_task_secrets(def)?;
            self.read().check_task_policy(&svc.pool, def)?;
            let r = def.reference();
            if r != svc.task_definition {
                let why = format!("{} replaces {}", r, svc.task_definition);
                svc.task_definition = r;
                start_deployment(&mut svc, now, why);
            }
        }
        svc.kept_fields.extend(req.kept_fields);
        if let Some(on) = req.enable_execute_command {
            svc.enable_execute_command = on;
        }
        if let Some(p) = req.priority {
            svc.priority = mpsfleet_types::priority::check_priority("priority", p)
                .map_err(|m| Error::invalid("priority", m))?;
        }
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
            // A new priority is its running tasks' at once: what preemption weighs now.
            let retagged: Vec<Task> = (self.state.tasks().of_service(&svc.name).iter())
                .filter_map(|id| self.state.tasks().get(id))
                .filter(|e| e.task.priority != svc.priority && e.task.last_status != TaskStatus::Stopped)
                .map(|e| Task { priority: svc.priority, ..e.task.clone() })
                .collect();
            self.writing(|w| {
                services::write_service(w, svc)?;
                w.write_tasks(retagged)
            })?;
        }
        let name = current.value.name;
        self.ask_now(Work::Service(name.clone()));
        self.read().service(name.as_str())
    }

    /// Marks the service DRAINING; its tasks are stopped and the record goes with the last one.
    pub fn delete_service(&mut self, name: &str) -> Result<ServiceView, Error> {
        let current = service_record(&self.state, name)?;
        let mut svc = current.value.clone();
        if svc.status != ServiceStatus::Draining {
            service_lifecycle::apply_service(&mut svc, service_lifecycle::ServiceEvent::Delete)
                .map_err(Error::Conflict)?;
            svc.desired_count = 0;
            svc.updated_at_ms = self.now();
            svc.events.push(svc.updated_at_ms, ObjectEvent::new("ServiceDeleted", "stopping every task"));
            self.writing(|w| services::write_service(w, svc.clone()))?;
        }
        let view = view_of(&self.read(), &svc);
        self.ask_now(Work::Service(svc.name.clone()));
        Ok(view)
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
        let Some(d) = svc.deployments.first_mut() else {
            return self.writing(|w| services::write_service(w, svc));
        };
        if d.rollout_state != RolloutState::InProgress
            || d.task_definition != task.task_definition
            || task.created_at_ms < d.created_at_ms
        {
            svc.updated_at_ms = now;
            return self.writing(|w| services::write_service(w, svc));
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
        self.writing(|w| services::write_service(w, svc))
    }
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

impl Cluster {
    /// `service update` with its client token, if any, for `actor`.
    pub fn update_service_as(
        &mut self,
        name: &str,
        mut req: UpdateService,
        actor: &str,
    ) -> Result<ServiceView, Error> {
        let token = req.client_token.take();
        let pool = service_record(&self.state, name)?.value.pool.to_string();
        let replay = Replay::Service { name: name.to_string(), pool };
        let route = format!("PATCH /v1/services/{name}");
        let update = |c: &mut Self, req| c.update_service(name, req);
        self.idempotent((actor, &route, token), req, replay, update, |c: &Cluster, replay| {
            c.read().replayed_service(replay)
        })
    }

    /// `service create` with its client token, if any, for `actor`.
    pub fn create_service_as(&mut self, mut req: CreateService, actor: &str) -> Result<ServiceView, Error> {
        let token = req.client_token.take();
        let replay = Replay::Service { name: req.name.clone(), pool: req.pool.clone() };
        let route = "POST /v1/services";
        self.idempotent((actor, route, token), req, replay, Cluster::create_service, |c: &Cluster, replay| {
            c.read().replayed_service(replay)
        })
    }
}

pub(super) fn view_of(r: &Reader<'_>, svc: &Service) -> ServiceView {
    let tasks: Vec<&Task> = (r.state.tasks().of_service(&svc.name).iter())
        .filter_map(|id| r.state.tasks().get(id))
        .map(|e| &e.task)
        .collect();
    let count = |f: &dyn Fn(&Task) -> bool| tasks.iter().filter(|t| f(t)).count() as u32;
    let traffic = (tasks.iter())
        .filter(|t| t.last_status != TaskStatus::Stopped && t.desired_status != TaskStatus::Stopped)
        .map(|t| {
            let (state, why) = r.traffic_of(t);
            ReplicaTraffic { task_id: t.id, state, why }
        })
        .collect();
    ServiceView {
        service: svc.clone(),
        running_count: count(&|t| t.last_status == TaskStatus::Running),
        pending_count: count(&|t| t.last_status < TaskStatus::Running),
        healthy_count: count(&|t| r.replica_state(t) == ReplicaState::Healthy),
        health_checked: r.health_checked(&svc.task_definition),
        traffic,
    }
}

pub(super) fn service_record(state: &State, name: &str) -> Result<Versioned<Service>, Error> {
    state
        .services()
        .iter()
        .find(|(k, _)| k.as_str() == name)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| Error::not_found("service", name))
}

/// Why service discovery will not publish `svc` (docs/traffic.md), if it will not: a name
/// that is not a DNS label, or one another service of its pool has but for case.
pub(super) fn not_in_discovery(state: &State, svc: &Service) -> Option<String> {
    if let Some(why) = mpsfleet_types::discovery::unpublishable(svc.pool.as_str(), svc.name.as_str()) {
        return Some(why);
    }
    let twin = state.services().values().map(|v| &v.value).find(|o| {
        o.pool == svc.pool && o.name != svc.name && o.name.as_str().eq_ignore_ascii_case(svc.name.as_str())
    })?;
    Some(format!(
        "service {} of pool {} has the same name but for case: neither is published",
        twin.name, svc.pool
    ))
}

impl<'a> Reader<'a> {
    pub fn services(&self) -> Vec<ServiceView> {
        self.state.services().values().map(|v| view_of(self, &v.value)).collect()
    }

    /// The service's deployments, newest first, with the counts of their tasks (a task
    /// counts toward the newest live deployment of its definition).
    pub fn service_deployments(&self, name: &str) -> Result<Vec<DeploymentView>, Error> {
        let svc = service_record(self.state, name)?.value;
        let mut views: Vec<DeploymentView> = svc
            .deployments
            .iter()
            .map(|d| DeploymentView {
                deployment: d.clone(),
                running_count: 0,
                pending_count: 0,
                healthy_count: 0,
                health_checked: self.health_checked(&d.task_definition),
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
            match self.replica_state(t) {
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

    pub fn service(&self, name: &str) -> Result<ServiceView, Error> {
        Ok(view_of(self, &service_record(self.state, name)?.value))
    }

    /// Every binding of every RUNNING replica of a service, in task order: where its traffic
    /// can go. The host's address is the one its agent is reached at (its logs endpoint), or
    /// its hostname until the agent has said. An awsvpc task's ports are at its own address:
    /// each container port of its definition, at the address its containers report.
    pub fn service_endpoints(&self, name: &str) -> Result<Vec<ServiceEndpoint>, Error> {
        let svc = service_record(self.state, name)?.value.name.clone();
        let mut out = Vec::new();
        for id in self.state.tasks().of_service(&svc) {
            let Some(e) = self.state.tasks().get(id) else { continue };
            let t = &e.task;
            if t.last_status != TaskStatus::Running || t.desired_status == TaskStatus::Stopped {
                continue;
            }
            out.extend(self.bindings_of(t));
        }
        Ok(out)
    }

    /// What service discovery publishes of every service (of `pools` only, when given), in
    /// name order: module docs.
    pub fn discovery(&self, pools: Option<&BTreeSet<String>>) -> Vec<DiscoveredService> {
        let r = *self;
        let mut out = Vec::new();
        for v in self.state.services().values() {
            let svc = &v.value;
            if pools.is_some_and(|p| !p.contains(svc.pool.as_str())) {
                continue;
            }
            let mut replicas = Vec::new();
            for id in self.state.tasks().of_service(&svc.name) {
                let Some(e) = self.state.tasks().get(id) else { continue };
                if let Some(d) = r.discovered(&e.task) {
                    replicas.push(d);
                }
            }
            out.push(DiscoveredService {
                pool: svc.pool.to_string(),
                service: svc.name.to_string(),
                replicas,
            });
        }
        out
    }

    /// The service a client token's call was about, as it is now: refused when the name is
    /// another pool's service now (the one the call made is gone).
    pub(super) fn replayed_service(&self, replay: Replay) -> Result<ServiceView, Error> {
        let Replay::Service { name, pool } = replay else { return Err(mismatched()) };
        let view = self.service(&name)?;
        if view.service.pool.as_str() != pool {
            return Err(Error::Conflict(format!(
                "the client token answered for service {name} of pool {pool}, which is gone"
            )));
        }
        Ok(view)
    }
}
