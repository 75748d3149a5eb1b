//! A service's deployment history, as ECS's service deployments: `ListServiceDeployments`
//! (newest first, filtered by status and creation time) and `DescribeServiceDeployments`
//! (by ARN, at most 20), from the deployments each service keeps (its newest
//! `DEPLOYMENTS_KEPT`), a deleted service's too while it is kept as INACTIVE.
//!
//! Every mpsfleet deployment is also ECS's service revision: its target is the deployment's
//! own definition and desired count. A deployment's ARN is
//! `arn:aws:ecs:REGION:ACCOUNT:service-deployment/CLUSTER/SERVICE/ID`, its revision's
//! `…:service-revision/CLUSTER/SERVICE/ID`, where ID is the service's creation time in ms and
//! the deployment's id (`1733450000123-d-3`): unique across a name used again.
//!
//! Status, from the rollout: completed is SUCCESSFUL; in progress is IN_PROGRESS while it is
//! the newest, STOPPED once a newer one took over; failed (the circuit breaker tripped) is
//! ROLLBACK_SUCCESSFUL when a rollback to an earlier definition completed after it,
//! ROLLBACK_IN_PROGRESS while that rollback runs, and STOPPED without one.

use super::page::page_in;
use super::shapes::secs;
use super::*;
use mpsfleet_types::service::{CircuitBreaker, Deployment, DeploymentStatus, RolloutState, Service};
use serde::Deserialize;
use serde_json::json;

/// The most ARNs one `DescribeServiceDeployments` names (ECS's).
const MAX_DESCRIBE: usize = 20;
/// The page size when the caller names none (ECS's).
const DEFAULT_PAGE: i64 = 20;

/// One deployment of a service, with the live counts of its tasks (none for a deleted
/// service).
struct Entry<'a> {
    svc: &'a Service,
    /// Its position in the service's list (0: the newest).
    at: usize,
    running: u32,
    pending: u32,
}

impl Entry<'_> {
    fn deployment(&self) -> &Deployment {
        &self.svc.deployments[self.at]
    }

    fn id(&self) -> String {
        deployment_key(self.svc, self.deployment())
    }

    /// ECS's `ServiceDeploymentStatus`.
    fn status(&self) -> &'static str {
        let d = self.deployment();
        let newer = &self.svc.deployments[..self.at];
        match d.rollout_state {
            RolloutState::Completed => "SUCCESSFUL",
            RolloutState::InProgress if self.at == 0 => "IN_PROGRESS",
            RolloutState::InProgress => "STOPPED",
            RolloutState::Failed => {
                // The deployment made right after a failed one is its rollback, if it went
                // back to another definition for that reason.
                let rollback = newer.last().filter(|n| n.rollout_state_reason.starts_with("rollback of"));
                match rollback.map(|n| n.rollout_state) {
                    Some(RolloutState::Completed) => "ROLLBACK_SUCCESSFUL",
                    Some(RolloutState::InProgress) => "ROLLBACK_IN_PROGRESS",
                    Some(RolloutState::Failed) => "ROLLBACK_FAILED",
                    None => "STOPPED",
                }
            }
        }
    }

    /// When it ended: completed, failed, or replaced by a newer one.
    fn finished_at_ms(&self) -> Option<u64> {
        let d = self.deployment();
        match (d.rollout_state, self.at) {
            (RolloutState::InProgress, 0) => None,
            (RolloutState::InProgress, n) => Some(self.svc.deployments[n - 1].created_at_ms),
            _ => Some(d.updated_at_ms),
        }
    }
}

/// The id of deployment `d` of `svc` in its ARNs.
fn deployment_key(svc: &Service, d: &Deployment) -> String {
    format!("{}-{}", svc.created_at_ms, d.id)
}

fn deployment_arn(arns: &arn::Arns, e: &Entry<'_>) -> String {
    let (pool, name) = (e.svc.pool.as_str(), e.svc.name.as_str());
    arns.resource_arn(&format!("service-deployment/{pool}/{name}/{}", e.id()))
}

fn revision_arn(arns: &arn::Arns, svc: &Service, d: &Deployment) -> String {
    let (pool, name) = (svc.pool.as_str(), svc.name.as_str());
    arns.resource_arn(&format!("service-revision/{pool}/{name}/{}", deployment_key(svc, d)))
}

/// `ServiceDeploymentBrief`.
fn brief(arns: &arn::Arns, e: &Entry<'_>) -> Value {
    let d = e.deployment();
    let mut v = json!({
        "serviceDeploymentArn": deployment_arn(arns, e),
        "serviceArn": arns.service(e.svc.pool.as_str(), e.svc.name.as_str()),
        "clusterArn": arns.cluster(e.svc.pool.as_str()),
        "createdAt": secs(d.created_at_ms),
        "startedAt": secs(d.created_at_ms),
        "targetServiceRevisionArn": revision_arn(arns, e.svc, d),
        "status": e.status(),
    });
    if let Some(at) = e.finished_at_ms() {
        v["finishedAt"] = json!(secs(at));
    }
    if !d.rollout_state_reason.is_empty() {
        v["statusReason"] = json!(d.rollout_state_reason);
    }
    v
}

/// `ServiceDeployment`: the brief, with the revisions it moves from and to, the service's
/// deployment configuration and the circuit breaker's count.
fn full(arns: &arn::Arns, e: &Entry<'_>) -> Value {
    let d = e.deployment();
    let svc = e.svc;
    let mut v = brief(arns, e);
    let target = v.as_object_mut().and_then(|m| m.remove("targetServiceRevisionArn"));
    v["updatedAt"] = json!(secs(d.updated_at_ms));
    v["targetServiceRevision"] = json!({
        "arn": target,
        "requestedTaskCount": d.desired_count,
        "runningTaskCount": e.running,
        "pendingTaskCount": e.pending,
    });
    // What it replaced: the deployment before it.
    v["sourceServiceRevisions"] = json!(svc
        .deployments
        .get(e.at + 1)
        .map(|prev| {
            vec![json!({
                "arn": revision_arn(arns, svc, prev),
                "requestedTaskCount": prev.desired_count,
                "runningTaskCount": 0,
                "pendingTaskCount": 0,
            })]
        })
        .unwrap_or_default());
    let c = &svc.deployment_configuration;
    let breaker = c.deployment_circuit_breaker;
    v["deploymentConfiguration"] = json!({
        "deploymentCircuitBreaker": {"enable": breaker.enable, "rollback": breaker.rollback},
        "maximumPercent": c.maximum_percent,
        "minimumHealthyPercent": c.minimum_healthy_percent,
        "alarms": {"alarmNames": [], "rollback": false, "enable": false},
    });
    let monitoring = match (breaker.enable, d.rollout_state) {
        (false, _) => "DISABLED",
        (true, RolloutState::InProgress) if e.at == 0 => "MONITORING",
        (true, RolloutState::Failed) => "TRIGGERED",
        (true, _) => "MONITORING_COMPLETE",
    };
    v["deploymentCircuitBreaker"] = json!({
        "status": monitoring,
        "failureCount": d.failed_tasks,
        "threshold": CircuitBreaker::threshold(d.desired_count),
    });
    v["alarms"] = json!({"status": "DISABLED"});
    if e.status().starts_with("ROLLBACK") {
        let rollback = &svc.deployments[e.at - 1];
        v["rollback"] = json!({
            "reason": rollback.rollout_state_reason,
            "startedAt": secs(rollback.created_at_ms),
            "serviceRevisionArn": revision_arn(arns, svc, rollback),
        });
    }
    v
}

/// The services `given` names in `pool`, the one a name finds first: the live one, then the
/// deleted ones still kept, newest first (each with whether it is live).
fn find_services(c: &Cluster, arns: &arn::Arns, pool: &str, given: &str) -> Vec<(Service, bool)> {
    let Some(name) = arns.short("service", given) else { return Vec::new() };
    let live =
        c.read().service(name).ok().filter(|v| v.service.pool.as_str() == pool).map(|v| (v.service, true));
    let mut deleted: Vec<(Service, bool)> = c
        .read()
        .deleted_services(pool)
        .filter(|(s, _)| s.name.as_str() == name)
        .map(|(s, _)| (s.clone(), false))
        .collect();
    deleted.reverse();
    live.into_iter().chain(deleted).collect()
}

/// Each deployment of `svc` with its tasks counted (a deleted service has none).
fn entries<'a>(c: &Cluster, svc: &'a Service, live: bool) -> Vec<Entry<'a>> {
    let views =
        if live { c.read().service_deployments(svc.name.as_str()).unwrap_or_default() } else { Vec::new() };
    (0..svc.deployments.len())
        .map(|at| {
            let d = &svc.deployments[at];
            let view =
                views.iter().find(|v| v.deployment.id == d.id && d.status != DeploymentStatus::Inactive);
            Entry {
                svc,
                at,
                running: view.map_or(0, |v| v.running_count),
                pending: view.map_or(0, |v| v.pending_count),
            }
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Created {
    before: Option<f64>,
    after: Option<f64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct List {
    service: String,
    cluster: Option<String>,
    #[serde(default)]
    status: Vec<String>,
    created_at: Option<Created>,
    next_token: Option<String>,
    max_results: Option<i64>,
}

/// ECS's statuses, for checking a filter.
const STATUSES: &[&str] = &[
    "PENDING",
    "SUCCESSFUL",
    "STOPPED",
    "STOP_REQUESTED",
    "IN_PROGRESS",
    "ROLLBACK_REQUESTED",
    "ROLLBACK_IN_PROGRESS",
    "ROLLBACK_SUCCESSFUL",
    "ROLLBACK_FAILED",
];

pub(super) async fn list(call: &Call, l: List) -> Result<Value, EcsError> {
    if let Some(bad) = l.status.iter().find(|s| !STATUSES.contains(&s.as_str())) {
        return Err(EcsError::invalid(format!("status must be one of {}, got {bad}", STATUSES.join(", "))));
    }
    let arns = call.arns.clone();
    let (before, after) = match &l.created_at {
        Some(c) => (c.before, c.after),
        None => (None, None),
    };
    let found = call
        .read(move |c, who| {
            let pool = pool_in(c, &who, &arns, l.cluster.as_deref())?;
            let Some((svc, live)) = find_services(c, &arns, &pool, &l.service).into_iter().next() else {
                return Ok(Err(EcsError::service_not_found(&l.service)));
            };
            let all: Vec<(u64, Value)> = entries(c, &svc, live)
                .iter()
                .filter(|e| l.status.is_empty() || l.status.iter().any(|s| s == e.status()))
                .filter(|e| {
                    let at = secs(e.deployment().created_at_ms);
                    before.is_none_or(|b| at < b) && after.is_none_or(|a| at > a)
                })
                .map(|e| (e.deployment().created_at_ms, brief(&arns, e)))
                .collect();
            Ok(Ok(all))
        })
        .await??;
    // Newest first; the key orders by creation time, then by ARN.
    let key =
        |(at, v): &(u64, Value)| format!("{at:020}{}", v["serviceDeploymentArn"].as_str().unwrap_or(""));
    let max = Some(l.max_results.unwrap_or(DEFAULT_PAGE));
    let (items, next) = page_in(true, found, key, l.next_token.as_deref(), max)?;
    let items: Vec<Value> = items.into_iter().map(|(_, v)| v).collect();
    Ok(json!({ "serviceDeployments": items, "nextToken": next }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Describe {
    service_deployment_arns: Vec<String>,
}

pub(super) async fn describe(call: &Call, d: Describe) -> Result<Value, EcsError> {
    check_batch(
        "serviceDeploymentArns",
        &d.service_deployment_arns,
        MAX_DESCRIBE,
        EcsError::invalid("serviceDeploymentArns cannot be empty"),
    )?;
    let arns = call.arns.clone();
    call.read(move |c, who| {
        let (mut found, mut failures) = (Vec::new(), Vec::new());
        for given in &d.service_deployment_arns {
            // service-deployment/CLUSTER/SERVICE/ID
            let parts: Option<(&str, &str, &str)> = arns.resource(given).and_then(|r| {
                let mut p = r.strip_prefix("service-deployment/")?.splitn(3, '/');
                Some((p.next()?, p.next()?, p.next()?))
            });
            let hit = parts.filter(|(pool, _, _)| who.sees_pool(pool)).and_then(|(pool, name, id)| {
                find_services(c, &arns, pool, name).iter().find_map(|(svc, live)| {
                    entries(c, svc, *live).iter().find(|e| e.id() == id).map(|e| full(&arns, e))
                })
            });
            match hit {
                Some(v) => found.push(v),
                None => failures.push(failure(given, "MISSING", None)),
            }
        }
        Ok(json!({ "serviceDeployments": found, "failures": failures }))
    })
    .await
}
