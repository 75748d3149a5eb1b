//! Services, as ECS's: `CreateService` (REPLICA or DAEMON), `UpdateService` (desired count,
//! task definition, deployment configuration, `forceNewDeployment`), `DeleteService`,
//! `DescribeServices` with their deployments and events (a service deleted within the hour
//! answers INACTIVE, kept by `cluster/deleted.rs`; a live one of the name comes first), `ListServices` (by launch type and
//! scheduling strategy). A service's name is unique across the
//! cluster's pools (ECS's is unique per cluster).

use super::page::page;
use super::shapes;
use super::*;
use mpsfleet_types::labels::Tag;
use mpsfleet_types::service::{
    CircuitBreaker, CreateService, DeploymentConfiguration, SchedulingStrategy, ServiceView, UpdateService,
};
use mpsfleet_types::ServiceStatus;
use serde::Deserialize;
use serde_json::json;

/// The most services one `DescribeServices` names (ECS's).
const MAX_DESCRIBE: usize = 10;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct DeploymentConfig {
    minimum_healthy_percent: Option<u32>,
    maximum_percent: Option<u32>,
    deployment_circuit_breaker: Option<Breaker>,
}

#[derive(Deserialize)]
pub(super) struct Breaker {
    enable: bool,
    rollback: bool,
}

impl DeploymentConfig {
    /// ECS's deployment configuration over `base`: what is given replaces it.
    fn over(self, base: DeploymentConfiguration) -> DeploymentConfiguration {
        DeploymentConfiguration {
            minimum_healthy_percent: self.minimum_healthy_percent.unwrap_or(base.minimum_healthy_percent),
            maximum_percent: self.maximum_percent.unwrap_or(base.maximum_percent),
            deployment_circuit_breaker: self.deployment_circuit_breaker.map_or(
                base.deployment_circuit_breaker,
                |b| CircuitBreaker { enable: b.enable, rollback: b.rollback },
            ),
            ..base
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Create {
    cluster: Option<String>,
    service_name: String,
    task_definition: Option<String>,
    desired_count: Option<u32>,
    deployment_configuration: Option<DeploymentConfig>,
    client_token: Option<String>,
    #[serde(default)]
    tags: Vec<Tag>,
    launch_type: Option<String>,
    scheduling_strategy: Option<String>,
    /// ECS's default: off (`task exec` refused in its tasks).
    #[serde(default)]
    enable_execute_command: bool,
    /// ECS's fields kept as given, not acted on ([`KEPT`]).
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

/// The service fields ECS takes that mpsfleet keeps as given and shows back without acting on
/// them: it wires no load balancer, service registry or IAM role; its scheduler places by the
/// pool's strategy. A service given them says so in its events.
const KEPT: &[(&str, &str)] = &[
    ("loadBalancers", "loadBalancers"),
    ("serviceRegistries", "serviceRegistries"),
    ("placementStrategy", "placementStrategy"),
    ("placementConstraints", "placementConstraints"),
    ("role", "roleArn"),
];

/// The kept fields of a request: by their answer's names.
fn kept(rest: &serde_json::Map<String, Value>) -> std::collections::BTreeMap<String, Value> {
    KEPT.iter()
        .filter_map(|(given, shown)| {
            let v = rest.get(*given)?;
            (!v.is_null()).then(|| (shown.to_string(), v.clone()))
        })
        .collect()
}

/// The service's answer: its view with deployments.
fn shape(c: &Cluster, arns: &arn::Arns, v: &ServiceView, tags: bool) -> Result<Value, Error> {
    let deployments = c.read().service_deployments(v.service.name.as_str())?;
    Ok(shapes::service(arns, v, &deployments, tags))
}

/// ECS's `schedulingStrategy` by its name.
fn strategy(given: Option<&str>) -> Result<SchedulingStrategy, EcsError> {
    match given {
        None | Some("REPLICA") => Ok(SchedulingStrategy::Replica),
        Some("DAEMON") => Ok(SchedulingStrategy::Daemon),
        Some(other) => {
            Err(EcsError::invalid(format!("schedulingStrategy must be REPLICA or DAEMON, got {other}")))
        }
    }
}

/// The launch type a service shows: the one it was created with (kept as given: every task
/// runs on the cluster's container instances), else EC2.
fn launch_type(s: &ServiceView) -> &str {
    s.service.kept_fields.get("launchType").and_then(Value::as_str).unwrap_or("EC2")
}

pub(super) async fn create(call: &Call, r: Create) -> Result<Value, EcsError> {
    let strategy = strategy(r.scheduling_strategy.as_deref())?;
    if r.launch_type.as_deref().is_some_and(|lt| !super::tasks::LAUNCH_TYPES.contains(&lt)) {
        return Err(EcsError::client("launch type should be one of [EC2,FARGATE]"));
    }
    let task_definition = r
        .task_definition
        .as_deref()
        .ok_or_else(|| EcsError::invalid("taskDefinition is required: a service runs a task definition"))?;
    let td = call
        .arns
        .short("task-definition", task_definition)
        .ok_or_else(|| EcsError::invalid(format!("{task_definition} is not a task definition")))?
        .to_string();
    let arns = call.arns.clone();
    let actor = api::actor(&call.who);
    call.run(api::operator, Touch::List, move |c, who| {
        let pool = pool_in(c, &who, &arns, r.cluster.as_deref())?;
        c.read().admit(&who, &Touch::NewIn(pool.clone()))?;
        if c.read().service(&r.service_name).is_ok() {
            return Err(Error::invalid("serviceName", "Creation of service was not idempotent."));
        }
        let daemon = strategy == SchedulingStrategy::Daemon;
        let base = if daemon { DeploymentConfiguration::daemon() } else { Default::default() };
        let mut kept_fields = kept(&r.rest);
        if let Some(lt) = r.launch_type.filter(|lt| lt != "EC2") {
            kept_fields.insert("launchType".into(), json!(lt));
        }
        let req = CreateService {
            name: r.service_name,
            pool,
            task_definition: td,
            // A DAEMON service's count is the cluster's ACTIVE container instances.
            desired_count: if daemon { 0 } else { r.desired_count.unwrap_or(0) },
            scheduling_strategy: Some(strategy),
            deployment_configuration: r.deployment_configuration.map(|d| d.over(base)),
            client_token: r.client_token,
            tags: r.tags,
            kept_fields,
            enable_execute_command: Some(r.enable_execute_command),
            ..Default::default()
        };
        let v = c.create_service_as(req, &actor)?;
        Ok(json!({ "service": shape(c, &arns, &v, true)? }))
    })
    .await
}

/// The service a caller's name or ARN names, in `pool`.
fn service_in(c: &Cluster, arns: &arn::Arns, pool: &str, given: &str) -> Option<ServiceView> {
    let name = arns.short("service", given)?;
    c.read().service(name).ok().filter(|s| s.service.pool.as_str() == pool)
}

/// The newest service `given` names in `pool` that was deleted within the hour, as ECS's
/// INACTIVE service (no tasks are left of it).
fn inactive(c: &Cluster, arns: &arn::Arns, pool: &str, given: &str, tags: bool) -> Option<Value> {
    let name = arns.short("service", given)?;
    let (svc, _) = c.read().deleted_services(pool).filter(|(s, _)| s.name.as_str() == name).last()?;
    let view = ServiceView {
        service: svc.clone(),
        running_count: 0,
        pending_count: 0,
        healthy_count: 0,
        health_checked: false,
        traffic: Vec::new(),
    };
    let mut v = shapes::service(arns, &view, &[], tags);
    v["status"] = json!("INACTIVE");
    Some(v)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Update {
    cluster: Option<String>,
    service: String,
    desired_count: Option<u32>,
    task_definition: Option<String>,
    deployment_configuration: Option<DeploymentConfig>,
    #[serde(default)]
    force_new_deployment: bool,
    enable_execute_command: Option<bool>,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

pub(super) async fn update(call: &Call, u: Update) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let actor = api::actor(&call.who);
    let td = match &u.task_definition {
        Some(t) => Some(
            arns.short("task-definition", t)
                .ok_or_else(|| EcsError::invalid(format!("{t} is not a task definition")))?
                .to_string(),
        ),
        None => None,
    };
    let out = call
        .run(api::operator, Touch::List, move |c, who| {
            let pool = pool_in(c, &who, &arns, u.cluster.as_deref())?;
            let Some(current) = service_in(c, &arns, &pool, &u.service) else {
                return Ok(Err(EcsError::service_not_found(&u.service)));
            };
            if current.service.status != ServiceStatus::Active {
                return Ok(Err(EcsError {
                    code: "ServiceNotActiveException",
                    ..EcsError::client("Service was not ACTIVE.")
                }));
            }
            let name = current.service.name.to_string();
            let daemon = current.service.scheduling_strategy == SchedulingStrategy::Daemon;
            let req = UpdateService {
                task_definition: td,
                desired_count: u.desired_count.filter(|_| !daemon),
                deployment_configuration: u
                    .deployment_configuration
                    .map(|d| d.over(current.service.deployment_configuration)),
                force_new_deployment: u.force_new_deployment,
                kept_fields: kept(&u.rest),
                enable_execute_command: u.enable_execute_command,
                ..Default::default()
            };
            let v = c.update_service_as(&name, req, &actor)?;
            Ok(Ok(json!({ "service": shape(c, &arns, &v, false)? })))
        })
        .await?;
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Delete {
    cluster: Option<String>,
    service: String,
    #[serde(default)]
    force: bool,
}

pub(super) async fn delete(call: &Call, d: Delete) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let out = call
        .run(api::operator, Touch::List, move |c, who| {
            let pool = pool_in(c, &who, &arns, d.cluster.as_deref())?;
            let Some(current) = service_in(c, &arns, &pool, &d.service) else {
                return Ok(Err(EcsError::service_not_found(&d.service)));
            };
            if current.service.desired_count > 0 && !d.force {
                return Ok(Err(EcsError::invalid(
                    "The service cannot be stopped while it is scaled above 0.",
                )));
            }
            let name = current.service.name.to_string();
            let v = c.delete_service(&name)?;
            let deployments = c.read().service_deployments(&name).unwrap_or_default();
            let mut answer = shapes::service(&arns, &v, &deployments, false);
            // Its record goes once its last task has stopped: then it is ECS's INACTIVE.
            if c.read().service(&name).is_err() {
                answer["status"] = json!("INACTIVE");
            }
            Ok(Ok(json!({ "service": answer })))
        })
        .await?;
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Describe {
    cluster: Option<String>,
    services: Vec<String>,
    #[serde(default)]
    include: Vec<String>,
}

pub(super) async fn describe(call: &Call, d: Describe) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    call.read(move |c, who| {
        let pool = pool_in(c, &who, &arns, d.cluster.as_deref())?;
        if d.services.is_empty() || d.services.len() > MAX_DESCRIBE {
            return Err(Error::invalid(
                "services",
                format!("Services cannot be empty, nor more than {MAX_DESCRIBE}."),
            ));
        }
        let tags = with_tags(&d.include);
        let (mut found, mut failures) = (Vec::new(), Vec::new());
        for given in &d.services {
            let live = service_in(c, &arns, &pool, given).map(|v| shape(c, &arns, &v, tags)).transpose()?;
            match live.or_else(|| inactive(c, &arns, &pool, given, tags)) {
                Some(v) => found.push(v),
                None => {
                    // ECS names a missing service by the ARN given, else without its cluster.
                    let arn =
                        if given.starts_with("arn:") { given.clone() } else { arns.service_short(given) };
                    failures.push(failure(&arn, "MISSING", None));
                }
            }
        }
        Ok(json!({ "services": found, "failures": failures }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct List {
    cluster: Option<String>,
    next_token: Option<String>,
    max_results: Option<i64>,
    launch_type: Option<String>,
    scheduling_strategy: Option<String>,
}

pub(super) async fn list(call: &Call, l: List) -> Result<Value, EcsError> {
    let strategy = l.scheduling_strategy.as_deref().map(|s| strategy(Some(s))).transpose()?;
    let arns = call.arns.clone();
    let (pool, names): (String, Vec<String>) = call
        .read(move |c, who| {
            let pool = pool_in(c, &who, &arns, l.cluster.as_deref())?;
            let names = c
                .read()
                .services()
                .iter()
                .filter(|s| s.service.pool.as_str() == pool)
                .filter(|s| strategy.is_none_or(|st| s.service.scheduling_strategy == st))
                .filter(|s| l.launch_type.as_deref().is_none_or(|lt| launch_type(s) == lt))
                .map(|s| s.service.name.to_string())
                .collect();
            Ok((pool, names))
        })
        .await?;
    let (names, next) = page(names, Clone::clone, l.next_token.as_deref(), l.max_results)?;
    let arns: Vec<String> = names.iter().map(|n| call.arns.service(&pool, n)).collect();
    Ok(json!({ "serviceArns": arns, "nextToken": next }))
}
