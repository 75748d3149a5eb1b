//! Container instances are hosts: listed and described with their resources, their GPUs as
//! ECS's `gpuDevices` (sharing mode, memory total and remaining, containers) and whether their
//! agent is connected; `UpdateContainerInstancesState` drains (DRAINING) or activates (ACTIVE)
//! them, as `host drain` and `host activate` do.

use super::page::page;
use super::shapes;
use super::*;
use mpsfleet_types::OperatorAction;
use mpsfleet_types::{HostStatus, TaskStatus};
use serde::Deserialize;
use serde_json::json;

/// The most instances one Describe or UpdateContainerInstancesState names (ECS's).
const MAX_BATCH: usize = 100;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct List {
    cluster: Option<String>,
    status: Option<String>,
    filter: Option<String>,
    next_token: Option<String>,
    max_results: Option<i64>,
}

pub(super) async fn list(call: &Call, l: List) -> Result<Value, EcsError> {
    if l.filter.is_some() {
        return Err(EcsError::unsupported_field("filter"));
    }
    let arns = call.arns.clone();
    let (pool, hosts): (String, Vec<(String, &'static str)>) = call
        .read(move |c, who| {
            let pool = pool_in(c, &who, &arns, l.cluster.as_deref())?;
            let hosts = c
                .read()
                .hosts(Some(&pool))
                .iter()
                .map(|h| (h.id.to_string(), shapes::instance_status(h.status)))
                .collect();
            Ok((pool, hosts))
        })
        .await?;
    let hosts: Vec<String> = hosts
        .into_iter()
        .filter(|(_, s)| match l.status.as_deref() {
            Some(want) => *s == want,
            None => *s != "INACTIVE",
        })
        .map(|(h, _)| h)
        .collect();
    let (hosts, next) = page(hosts, Clone::clone, l.next_token.as_deref(), l.max_results)?;
    let arns: Vec<String> = hosts.iter().map(|h| call.arns.container_instance(&pool, h)).collect();
    Ok(json!({ "containerInstanceArns": arns, "nextToken": next }))
}

/// A host's ECS shape, with its task counts, what its live tasks reserve, and whether its
/// agent answers.
fn shape(c: &Cluster, arns: &arn::Arns, id: &str) -> Result<Value, Error> {
    let h = c.read().host(id)?;
    let filter = crate::cluster::TaskFilter { host: Some(id.to_string()), live: true, ..Default::default() };
    let (mut running, mut pending) = (0, 0);
    let mut used = shapes::Reserved::default();
    c.read().visit_tasks(&filter, |t| {
        match t.last_status {
            TaskStatus::Running => running += 1,
            _ => pending += 1,
        }
        let run = run_definition(c, t);
        used.add(t, run.as_deref());
    });
    // Connected: its agent's heartbeats come within the pool's heartbeat grace.
    let connected = c.read().agent_link(&h.id).is_some_and(|l| l.connected);
    Ok(shapes::container_instance(arns, &h, running, pending, &used, connected))
}

/// The host a caller's id or ARN names, in `pool`.
fn host_in(c: &Cluster, arns: &arn::Arns, pool: &str, given: &str) -> Option<String> {
    let id = arns.short("container-instance", given)?;
    c.read().host(id).ok().filter(|h| h.pool.as_str() == pool).map(|h| h.id.to_string())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Describe {
    cluster: Option<String>,
    container_instances: Vec<String>,
}

/// ECS's refusal of an empty list of instances.
fn none_named() -> EcsError {
    EcsError::client("Container Instances cannot be empty.")
}

pub(super) async fn describe(call: &Call, d: Describe) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let out = call
        .read(move |c, who| {
            let pool = pool_in(c, &who, &arns, d.cluster.as_deref())?;
            if let Err(e) = check_batch("containerInstances", &d.container_instances, MAX_BATCH, none_named())
            {
                return Ok(Err(e));
            }
            let (mut found, mut failures) = (Vec::new(), Vec::new());
            for given in &d.container_instances {
                match host_in(c, &arns, &pool, given) {
                    Some(id) => found.push(shape(c, &arns, &id)?),
                    None => {
                        let arn = if given.starts_with("arn:") {
                            given.clone()
                        } else {
                            arns.container_instance(&pool, given)
                        };
                        failures.push(failure(&arn, "MISSING", None));
                    }
                }
            }
            Ok(Ok(json!({ "containerInstances": found, "failures": failures })))
        })
        .await?;
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct UpdateState {
    cluster: Option<String>,
    container_instances: Vec<String>,
    status: String,
}

pub(super) async fn update_state(call: &Call, u: UpdateState) -> Result<Value, EcsError> {
    let drain = match u.status.as_str() {
        "DRAINING" => true,
        "ACTIVE" => false,
        other => {
            return Err(EcsError::invalid(format!(
                "status must be ACTIVE or DRAINING, got {other:?} (deregister a host with `mpsfleet host forget`)"
            )))
        }
    };
    let arns = call.arns.clone();
    let actor = api::actor(&call.who);
    let (done, failures) = call
        .run(api::operator, Touch::List, move |c, who| {
            let pool = pool_in(c, &who, &arns, u.cluster.as_deref())?;
            if let Err(e) = check_batch("containerInstances", &u.container_instances, MAX_BATCH, none_named())
            {
                return Ok(Err(e));
            }
            let (mut done, mut failures) = (Vec::new(), Vec::new());
            for given in &u.container_instances {
                let arn = if given.starts_with("arn:") {
                    given.clone()
                } else {
                    arns.container_instance(&pool, given)
                };
                let Some(id) = host_in(c, &arns, &pool, given) else {
                    failures.push(failure(&arn, "MISSING", None));
                    continue;
                };
                let status = c.read().host(&id)?.status;
                let changed = match (drain, status) {
                    (true, HostStatus::Draining) | (false, HostStatus::Active) => Ok(()),
                    (true, _) => c.operator_action(&id, OperatorAction::Drain, &actor).map(|_| ()),
                    (false, _) => c.activate_host(&id, &actor).map(|_| ()),
                };
                match changed {
                    Ok(()) => done.push(id),
                    Err(e @ (Error::Conflict(_) | Error::InvalidParameter { .. })) => {
                        failures.push(failure(&arn, "INVALID_STATE", Some(e.to_string())))
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(Ok((done, failures)))
        })
        .await??;
    // A drain is carried out by the host's incident, which the controllers' pass runs at once:
    // the answer shows the instances after it.
    call.st.settled().await;
    let arns = call.arns.clone();
    call.read(move |c, _| {
        let shown = done.iter().map(|id| shape(c, &arns, id)).collect::<Result<Vec<_>, _>>()?;
        Ok(json!({ "containerInstances": shown, "failures": failures }))
    })
    .await
}

/// `DiscoverPollEndpoint`: where an ECS agent would poll. mpsfleet's agents reach the server
/// itself, so both endpoints are this server as the caller reached it.
pub(super) async fn poll_endpoint(call: &Call) -> Result<Value, EcsError> {
    call.read(|_, _| Ok(())).await?;
    Ok(json!({ "endpoint": call.endpoint, "telemetryEndpoint": call.endpoint }))
}
