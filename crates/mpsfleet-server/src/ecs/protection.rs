//! Task scale-in protection, as ECS's `UpdateTaskProtection` and `GetTaskProtection`
//! (`cluster/protection.rs`): a protected task is neither scaled in nor replaced by its
//! service until the protection expires. Each task answers for itself: a missing one is a
//! `MISSING` failure, a stopped one `TASK_NOT_VALID`.

use super::tasks::task_in;
use super::*;
use mpsfleet_types::{Task, TaskStatus};
use serde::Deserialize;
use serde_json::json;

/// The most tasks one call names (ECS's).
const MAX_TASKS: usize = 10;

fn protected(arns: &arn::Arns, t: &Task, now_ms: u64) -> Value {
    let until = t.protected_until(now_ms);
    let mut v = json!({
        "taskArn": arns.task(t.pool.as_str(), &t.id.to_string()),
        "protectionEnabled": until.is_some(),
    });
    if let Some(ms) = until {
        v["expirationDate"] = json!(ms as f64 / 1000.0);
    }
    v
}

/// The tasks named, in `pool`, and the failures of those that cannot be.
fn named(c: &Cluster, arns: &arn::Arns, pool: &str, given: &[String]) -> (Vec<Task>, Vec<Value>) {
    let (mut found, mut failures) = (Vec::new(), Vec::new());
    for g in given {
        let arn = if g.starts_with("arn:") { g.clone() } else { arns.task(pool, g) };
        match task_in(c, arns, pool, g) {
            Some(t) if t.desired_status == TaskStatus::Stopped => failures.push(failure(
                &arn,
                "TASK_NOT_VALID",
                Some("The task is stopped or stopping.".into()),
            )),
            Some(t) => found.push(t),
            None => failures.push(failure(&arn, "MISSING", None)),
        }
    }
    (found, failures)
}

fn check_count(tasks: &[String]) -> Result<(), Error> {
    if tasks.is_empty() || tasks.len() > MAX_TASKS {
        return Err(Error::invalid(
            "tasks",
            format!("must name 1 to {MAX_TASKS} tasks, got {}", tasks.len()),
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Update {
    cluster: Option<String>,
    tasks: Vec<String>,
    protection_enabled: bool,
    expires_in_minutes: Option<u32>,
}

pub(super) async fn update(call: &Call, u: Update) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    call.run(api::operator, Touch::List, move |c, who| {
        check_count(&u.tasks)?;
        let pool = pool_in(c, &who, &arns, u.cluster.as_deref())?;
        c.read().admit(&who, &Touch::Object(crate::cluster::Kind::Pool, pool.clone()))?;
        let (found, failures) = named(c, &arns, &pool, &u.tasks);
        let ids: Vec<String> = found.iter().map(|t| t.id.to_string()).collect();
        let changed = c.protect_tasks(&ids, u.protection_enabled, u.expires_in_minutes)?;
        let now = c.read().now_ms();
        let answered: Vec<Value> = changed.iter().map(|t| protected(&arns, t, now)).collect();
        Ok(json!({ "protectedTasks": answered, "failures": failures }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Get {
    cluster: Option<String>,
    #[serde(default)]
    tasks: Vec<String>,
}

pub(super) async fn get(call: &Call, g: Get) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    call.read(move |c, who| {
        check_count(&g.tasks)?;
        let pool = pool_in(c, &who, &arns, g.cluster.as_deref())?;
        let (found, failures) = named(c, &arns, &pool, &g.tasks);
        let now = c.read().now_ms();
        let answered: Vec<Value> = found.iter().map(|t| protected(&arns, t, now)).collect();
        Ok(json!({ "protectedTasks": answered, "failures": failures }))
    })
    .await
}
