//! Tags of clusters, task definitions, services, tasks and capacity providers, named by their ARNs
//! (`TagResource`, `UntagResource`, `ListTagsForResource`).

use super::*;
use crate::cluster::catalog::Tagged;
use mpsfleet_types::labels::Tag;
use serde::Deserialize;
use serde_json::json;

/// What a resource ARN names, and the pool it names it in (for a service or task, whose ARN
/// carries its cluster). An ECS ARN of another account names nothing here: `Err` is then the
/// not-found answer of its kind.
fn target(arns: &arn::Arns, given: &str) -> Result<(Tagged, Option<String>), EcsError> {
    let unknown = || {
        EcsError::invalid(format!(
            "resourceArn {given:?} is not the ARN of a cluster, task definition, service, task or capacity provider"
        ))
    };
    let mut parts = given.splitn(6, ':');
    let (arn, _partition, service, _region, account, resource) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next(), parts.next());
    let (Some("arn"), Some("ecs"), Some(account), Some(resource)) = (arn, service, account, resource) else {
        return Err(unknown());
    };
    let (kind, rest) = resource.split_once('/').ok_or_else(unknown)?;
    let last = rest.rsplit('/').next().unwrap_or(rest).to_string();
    let cluster = rest.contains('/').then(|| rest.split('/').next().unwrap_or_default().to_string());
    let target = match kind {
        "cluster" => Tagged::Pool(last),
        "task-definition" => Tagged::TaskDef(last),
        "service" => Tagged::Service(last),
        "task" => Tagged::Task(last),
        "capacity-provider" => Tagged::CapacityProvider(last),
        _ => return Err(unknown()),
    };
    if account != arns.account {
        return Err(EcsError::from(missing(&target)));
    }
    Ok((target, cluster))
}

/// The domain's not-found of what `t` names.
fn missing(t: &Tagged) -> Error {
    match t {
        Tagged::Pool(p) => Error::not_found("pool", p),
        Tagged::TaskDef(r) => Error::not_found("task definition", r),
        Tagged::Service(s) => Error::not_found("service", s),
        Tagged::Task(id) => Error::not_found("task", id),
        Tagged::CapacityProvider(n) => Error::not_found("capacity provider", n),
    }
}

/// The object exists in the pool its ARN names, or it is not found.
fn check_cluster(c: &Cluster, t: &Tagged, cluster: Option<&str>) -> Result<(), Error> {
    let pool = match t {
        Tagged::Service(s) => c.read().service(s)?.service.pool.to_string(),
        Tagged::Task(id) => c.read().task(id)?.pool.to_string(),
        Tagged::Pool(_) | Tagged::TaskDef(_) | Tagged::CapacityProvider(_) => return Ok(()),
    };
    match cluster {
        Some(cl) if cl != pool => Err(missing(t)),
        _ => Ok(()),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TagResource {
    resource_arn: String,
    tags: Vec<Tag>,
}

pub(super) async fn tag(call: &Call, r: TagResource) -> Result<Value, EcsError> {
    retag(call, &r.resource_arn, r.tags, Vec::new()).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct UntagResource {
    resource_arn: String,
    tag_keys: Vec<String>,
}

pub(super) async fn untag(call: &Call, r: UntagResource) -> Result<Value, EcsError> {
    retag(call, &r.resource_arn, Vec::new(), r.tag_keys).await
}

/// Adds `add` to, and removes the keys `remove` from, the tags of what `arn` names.
async fn retag(call: &Call, arn: &str, add: Vec<Tag>, remove: Vec<String>) -> Result<Value, EcsError> {
    let (t, cluster) = target(&call.arns, arn)?;
    call.run(api::operator, t.touch(true), move |c, _| {
        check_cluster(c, &t, cluster.as_deref())?;
        c.retag(&t, &add, &remove)?;
        Ok(json!({}))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListTags {
    resource_arn: String,
}

pub(super) async fn list(call: &Call, r: ListTags) -> Result<Value, EcsError> {
    let (t, cluster) = target(&call.arns, &r.resource_arn)?;
    call.run(api::viewer, t.touch(false), move |c, _| {
        check_cluster(c, &t, cluster.as_deref())?;
        Ok(json!({ "tags": super::shapes::tags(&c.tags_of(&t)?) }))
    })
    .await
}
