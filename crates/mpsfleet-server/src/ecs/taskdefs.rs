//! Task definitions: registered from ECS's own request (the shape `task-definition register`
//! takes), described with ECS's fields, listed by family and status, deregistered (kept and
//! marked `INACTIVE`: nothing new starts from them).

use super::page::{page, page_in};
use super::shapes;
use super::*;
use crate::cluster::ValidTaskDef;
use serde::Deserialize;
use serde_json::json;

/// ECS's own checks of a definition, made before mpsfleet's, in ECS's words: every container
/// has a name and an image; without task memory, every container of an EC2 definition has
/// `memory` or `memoryReservation`; a Fargate one has no `pidMode: host`. (The REST API also
/// takes processes without images.)
fn ecs_checks(body: &Value) -> Result<(), EcsError> {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    let containers = body.get("containerDefinitions").and_then(Value::as_array).cloned().unwrap_or_default();
    for c in &containers {
        if !text(c, "name") {
            return Err(EcsError::client("Container.name should not be null or empty."));
        }
        if !text(c, "image") {
            return Err(EcsError::client("Container.image should not be null or empty."));
        }
    }
    let compat: Vec<&str> = body
        .get("requiresCompatibilities")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let fargate = compat.contains(&"FARGATE");
    if fargate && body.get("pidMode").and_then(Value::as_str) == Some("host") {
        return Err(EcsError::client(
            "Tasks using the Fargate launch type do not support pidMode 'host'. The supported value for pidMode is 'task'.",
        ));
    }
    let task_memory = body.get("memory").is_some_and(|m| !m.is_null());
    if !fargate && !task_memory {
        let has = |c: &Value, k: &str| c.get(k).is_some_and(|v| !v.is_null());
        if let Some(c) = containers.iter().find(|c| !has(c, "memory") && !has(c, "memoryReservation")) {
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            return Err(EcsError::client(format!(
                "Invalid setting for container '{name}'. At least one of 'memory' or 'memoryReservation' must be specified."
            )));
        }
    }
    Ok(())
}

/// Registering, deregistering and deleting change what every pool runs from: closed to a
/// pool-scoped key, as the REST API's registration is to a pool-scoped token.
pub(super) async fn register(call: &Call, mut body: Value) -> Result<Value, EcsError> {
    ecs_checks(&body)?;
    // A definition for Fargate runs in its own network namespace there (awsvpc, the one mode
    // Fargate has): unless it names another, it does here too.
    let fargate = body
        .get("requiresCompatibilities")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|c| c == "FARGATE"));
    if fargate && body.get("networkMode").is_none_or(Value::is_null) {
        body["networkMode"] = json!("awsvpc");
    }
    let bytes = serde_json::to_vec(&body).map_err(|e| EcsError::serialization(e.to_string()))?;
    // Parsed before the cluster lock is taken, as the REST API's registration is.
    let valid = ValidTaskDef::parse(&bytes).map_err(|e| EcsError::client(e.to_string()))?;
    let arns = call.arns.clone();
    call.run(api::operator, Touch::Cluster, move |c, _| {
        let done = c.register_valid_taskdef(valid)?;
        let td = c.read().taskdef("taskDefinition", &done.task_definition.to_string())?;
        Ok(json!({ "taskDefinition": shapes::task_definition(&arns, td, false), "tags": shapes::tags(&td.tags) }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Describe {
    task_definition: String,
    #[serde(default)]
    include: Vec<String>,
}

/// The `family` or `family:revision` a caller's name or ARN of a task definition names.
fn reference<'a>(arns: &arn::Arns, given: &'a str) -> Result<&'a str, EcsError> {
    arns.short("task-definition", given).filter(|r| !r.is_empty()).ok_or_else(|| {
        EcsError::client(format!("{given} is not a task definition's family, family:revision or ARN"))
    })
}

pub(super) async fn describe(call: &Call, req: Describe) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let r = reference(&arns, &req.task_definition)?.to_string();
    let out = call
        .read(move |c, _| {
            let Ok(td) = c.read().taskdef("taskDefinition", &r) else {
                return Ok(Err(EcsError::client("Unable to describe task definition.")));
            };
            let mut v = json!({ "taskDefinition": shapes::task_definition(&arns, td, false) });
            if with_tags(&req.include) {
                v["tags"] = shapes::tags(&td.tags);
            }
            Ok(Ok(v))
        })
        .await?;
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct List {
    family_prefix: Option<String>,
    status: Option<String>,
    sort: Option<String>,
    next_token: Option<String>,
    max_results: Option<i64>,
}

/// Whether a Describe/List `status` filter keeps a definition that is (or not) deregistered.
fn status_filter(status: Option<&str>, all_allowed: bool) -> Result<Option<bool>, EcsError> {
    match status.unwrap_or("ACTIVE") {
        "ACTIVE" => Ok(Some(false)),
        "INACTIVE" => Ok(Some(true)),
        "ALL" if all_allowed => Ok(None),
        other => Err(EcsError::invalid(format!(
            "status must be ACTIVE or INACTIVE{}, got {other:?}",
            if all_allowed { " or ALL" } else { "" }
        ))),
    }
}

pub(super) async fn list(call: &Call, req: List) -> Result<Value, EcsError> {
    let inactive = status_filter(req.status.as_deref(), false)?;
    let desc = match req.sort.as_deref() {
        None | Some("ASC") => false,
        Some("DESC") => true,
        Some(other) => return Err(EcsError::invalid(format!("sort must be ASC or DESC, got {other:?}"))),
    };
    let prefix = req.family_prefix.clone().unwrap_or_default();
    let defs: Vec<(String, u32)> = call
        .read(move |c, _| {
            // ECS's familyPrefix of this call is the whole family name.
            Ok(c.read()
                .taskdefs(None)
                .iter()
                .filter(|d| prefix.is_empty() || d.family.as_str() == prefix)
                .filter(|d| inactive.is_none_or(|i| d.deregistered_at_ms.is_some() == i))
                .map(|d| (d.family.to_string(), d.revision))
                .collect())
        })
        .await?;
    // ECS lists by family, then revision; DESC turns both around.
    let key = |(f, r): &(String, u32)| format!("{f}\u{0}{r:010}");
    let (defs, next) = page_in(desc, defs, key, req.next_token.as_deref(), req.max_results)?;
    let arns: Vec<String> = defs.iter().map(|(f, r)| call.arns.task_definition(f, *r)).collect();
    Ok(json!({ "taskDefinitionArns": arns, "nextToken": next }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Families {
    family_prefix: Option<String>,
    status: Option<String>,
    next_token: Option<String>,
    max_results: Option<i64>,
}

pub(super) async fn families(call: &Call, req: Families) -> Result<Value, EcsError> {
    let inactive = status_filter(req.status.as_deref(), true)?;
    let prefix = req.family_prefix.clone().unwrap_or_default();
    let families: Vec<String> = call
        .read(move |c, _| {
            let mut active: std::collections::BTreeMap<String, bool> = Default::default();
            for d in c.read().taskdefs(None).iter().filter(|d| d.family.as_str().starts_with(&prefix)) {
                *active.entry(d.family.to_string()).or_default() |= d.deregistered_at_ms.is_none();
            }
            // A family is ACTIVE while a revision of it is; INACTIVE once none is.
            Ok(active.into_iter().filter(|(_, a)| inactive.is_none_or(|i| *a != i)).map(|(f, _)| f).collect())
        })
        .await?;
    let (families, next) = page(families, Clone::clone, req.next_token.as_deref(), req.max_results)?;
    Ok(json!({ "families": families, "nextToken": next }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Deregister {
    task_definition: String,
}

pub(super) async fn deregister(call: &Call, req: Deregister) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let r = reference(&arns, &req.task_definition)?.to_string();
    match r.rsplit_once(':') {
        None => return Err(EcsError::client("Revision is missing.")),
        Some((_, n)) if n.parse::<u32>().map_or(true, |n| n == 0) => {
            return Err(EcsError::client(format!("Invalid revision number. Number: {n}")))
        }
        Some(_) => {}
    }
    call.run(api::operator, Touch::Cluster, move |c, _| {
        let td = c.deregister_taskdef(&r)?;
        Ok(json!({ "taskDefinition": shapes::task_definition(&arns, &td, false) }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Delete {
    task_definitions: Vec<String>,
}

/// The most revisions one `DeleteTaskDefinitions` names (ECS's).
const MAX_DELETE: usize = 10;

/// `DeleteTaskDefinitions`: deregistered revisions no task or service uses any more are
/// deleted at once (ECS's `DELETE_IN_PROGRESS`, then gone); the others are failures.
pub(super) async fn delete(call: &Call, d: Delete) -> Result<Value, EcsError> {
    if d.task_definitions.is_empty() || d.task_definitions.len() > MAX_DELETE {
        return Err(EcsError::invalid(format!("taskDefinitions must name 1 to {MAX_DELETE} revisions")));
    }
    let arns = call.arns.clone();
    let refs: Vec<String> = d
        .task_definitions
        .iter()
        .map(|t| arns.short("task-definition", t).unwrap_or_default().to_string())
        .collect();
    call.run(api::operator, Touch::Cluster, move |c, _| {
        let (mut deleted, mut failures) = (Vec::new(), Vec::new());
        for (given, outcome) in d.task_definitions.iter().zip(c.delete_taskdefs(&refs)?) {
            match outcome {
                Ok(td) => {
                    let mut v = shapes::task_definition(&arns, &td, false);
                    v["status"] = json!("DELETE_IN_PROGRESS");
                    deleted.push(v);
                }
                Err(reason) => failures.push(json!({"arn": given, "reason": reason})),
            }
        }
        Ok(json!({ "taskDefinitions": deleted, "failures": failures }))
    })
    .await
}
