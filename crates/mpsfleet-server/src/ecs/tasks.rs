//! Tasks: `RunTask` (the scheduler places them, or they wait PENDING for room, as ECS's
//! capacity providers do; a task no host of the cluster could ever hold is a failure with its
//! reason), `StartTask` on named container instances, `StopTask`, `DescribeTasks`, `ListTasks`.

use super::page::page;
use super::shapes;
use super::*;
use crate::cluster::TaskFilter;
use mpsfleet_types::labels::{Tag, TaskOverride};
use mpsfleet_types::{PendingCode, RunTask, Task, TaskStatus};
use serde::Deserialize;
use serde_json::json;

/// The most tasks one `RunTask` starts, and the most instances one `StartTask` names (ECS's).
const MAX_COUNT: u32 = 10;
/// The most tasks one `DescribeTasks` names.
const MAX_DESCRIBE: usize = 100;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Run {
    cluster: Option<String>,
    task_definition: String,
    count: Option<u32>,
    client_token: Option<String>,
    overrides: Option<TaskOverride>,
    started_by: Option<String>,
    group: Option<String>,
    #[serde(default)]
    tags: Vec<Tag>,
    launch_type: Option<String>,
    #[serde(default)]
    capacity_provider_strategy: Vec<Value>,
    /// ECS's default: off (`task exec` refused).
    #[serde(default)]
    enable_execute_command: bool,
}

/// ECS's failure reason for a task that does not fit: what it lacks.
fn lacking(code: PendingCode) -> &'static str {
    match code {
        PendingCode::NoMpsHost
        | PendingCode::InsufficientGpuMemory
        | PendingCode::NotEnoughIdleGpus
        | PendingCode::MpsDaemonsNotAnswering
        | PendingCode::GpuLimits
        | PendingCode::ScalingOut
        | PendingCode::Preempting => "RESOURCE:GPU",
        PendingCode::HostPortsInUse | PendingCode::TooManyHostPorts => "RESOURCE:PORTS",
        PendingCode::NoContainerHost | PendingCode::NoFittingContainerHost => "ATTRIBUTE",
        PendingCode::NoSchedulableHost => "AGENT",
    }
}

/// The launch types ECS takes. Every task runs on the cluster's own hosts whichever is named.
pub(super) const LAUNCH_TYPES: &[&str] = &["EC2", "FARGATE", "EXTERNAL"];

/// The task definition a RunTask or StartTask names, and checks the launch type asked for.
fn run_request(call: &Call, r: &Run, count: u32, pool: String) -> Result<RunTask, EcsError> {
    if r.launch_type.as_deref().is_some_and(|lt| !LAUNCH_TYPES.contains(&lt)) {
        return Err(EcsError::invalid("launch type should be one of [EC2,FARGATE,EXTERNAL]"));
    }
    if r.launch_type.is_some() && !r.capacity_provider_strategy.is_empty() {
        return Err(EcsError::invalid(
            "Specify either Launch Type or Capacity Provider Strategy, but not both.",
        ));
    }
    let td = call
        .arns
        .short("task-definition", &r.task_definition)
        .ok_or_else(|| EcsError::invalid(format!("{} is not a task definition", r.task_definition)))?;
    Ok(RunTask {
        task_definition: td.to_string(),
        count,
        pool,
        client_token: r.client_token.clone(),
        overrides: r.overrides.clone(),
        started_by: r.started_by.clone(),
        group: r.group.clone(),
        tags: r.tags.clone(),
        // From the `mpsfleet:priority` tag of the run or its task definition.
        priority: None,
        enable_execute_command: Some(r.enable_execute_command),
    })
}

/// A task as ECS's `Task` will show it, taken under the cluster lock and encoded after it (as
/// the REST API encodes its answers): what it runs, its definition with its run's overrides
/// applied, and how its host's agent stands.
pub(super) struct Shown {
    task: Task,
    run: Option<Arc<TaskDefinition>>,
    host: Option<crate::cluster::AgentLink>,
}

/// `tasks` as [`Shown`]: the tasks of one run share their definition (looked up once).
fn shown(c: &Cluster, tasks: Vec<Task>) -> Vec<Shown> {
    let mut out: Vec<Shown> = Vec::with_capacity(tasks.len());
    for task in tasks {
        let run = match out.last() {
            Some(p)
                if p.task.task_definition == task.task_definition
                    && p.task.overrides() == task.overrides() =>
            {
                p.run.clone()
            }
            _ => run_definition_shared(c, &task),
        };
        let host = task.host_id.as_ref().and_then(|h| c.read().agent_link(h));
        out.push(Shown { task, run, host });
    }
    out
}

/// The answer of a run or a describe: the tasks (ECS's `Task`, with their tags when `tags`)
/// and the failures, encoded into one buffer.
fn answer(arns: &arn::Arns, tasks: &[Shown], failures: &[Value], tags: bool) -> Result<String, EcsError> {
    let encoding = |e: serde_json::Error| EcsError::from(Error::Internal(format!("encoding a task: {e}")));
    let mut out = Vec::with_capacity(1024 * tasks.len() + 64);
    out.extend_from_slice(br#"{"tasks":["#);
    for (i, s) in tasks.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let task = shapes::task(arns, &s.task, s.run.as_deref(), s.host.as_ref(), tags);
        serde_json::to_writer(&mut out, &task).map_err(encoding)?;
    }
    out.extend_from_slice(br#"],"failures":"#);
    serde_json::to_writer(&mut out, failures).map_err(encoding)?;
    out.push(b'}');
    String::from_utf8(out).map_err(|e| EcsError::from(Error::Internal(format!("encoding a task: {e}"))))
}

pub(super) async fn run(call: &Call, r: Run) -> Result<String, EcsError> {
    let count = r.count.unwrap_or(1);
    if count == 0 || count > MAX_COUNT {
        return Err(EcsError::invalid(format!("count must be from 1 to {MAX_COUNT}, got {count}")));
    }
    let arns = call.arns.clone();
    let actor = api::actor(&call.who);
    let given = r.cluster.clone();
    let partial = run_request(call, &r, count, String::new())?;
    call.run(api::operator, Touch::List, move |c, who| {
        let pool = pool_in(c, &who, &arns, given.as_deref())?;
        c.read().admit(&who, &Touch::NewIn(pool.clone()))?;
        let req = RunTask { pool: pool.clone(), ..partial };
        // A shape no host of the cluster could ever hold is a failure, as in ECS; one that only
        // lacks room now waits PENDING.
        match c.run_tasks_as(req, &actor) {
            Ok(out) => Ok((shown(c, out.tasks), Vec::new())),
            Err(Error::NeverFits { message, .. }) => {
                Ok((Vec::new(), vec![failure(&arns.cluster(&pool), "RESOURCE:GPU", Some(message))]))
            }
            Err(e) => Err(e),
        }
    })
    .await
    .and_then(|(tasks, failures)| answer(&call.arns, &tasks, &failures, false))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Start {
    #[serde(flatten)]
    run: Run,
    container_instances: Vec<String>,
}

pub(super) async fn start(call: &Call, s: Start) -> Result<String, EcsError> {
    let arns = call.arns.clone();
    let given = s.run.cluster.clone();
    let partial = run_request(call, &s.run, 1, String::new())?;
    let hosts = s.container_instances;
    call.run(api::operator, Touch::List, move |c, who| {
        let pool = pool_in(c, &who, &arns, given.as_deref())?;
        c.read().admit(&who, &Touch::NewIn(pool.clone()))?;
        if hosts.is_empty() || hosts.len() > MAX_COUNT as usize {
            return Err(Error::invalid(
                "containerInstances",
                format!("Container Instances cannot be empty, nor more than {MAX_COUNT}."),
            ));
        }
        let req = RunTask { pool: pool.clone(), ..partial };
        let (mut tasks, mut failures) = (Vec::new(), Vec::new());
        for given in &hosts {
            let arn =
                if given.starts_with("arn:") { given.clone() } else { arns.container_instance(&pool, given) };
            let Some(host) = arns.short("container-instance", given) else {
                failures.push(failure(&arn, "MISSING", None));
                continue;
            };
            match c.start_task_on(&req, host) {
                Ok(Ok(t)) => tasks.push(t),
                Ok(Err(why)) => failures.push(failure(&arn, lacking(why.code()), Some(why.to_string()))),
                Err(Error::NotFound { .. }) => failures.push(failure(&arn, "MISSING", None)),
                Err(e) => return Err(e),
            }
        }
        Ok((shown(c, tasks), failures))
    })
    .await
    .and_then(|(tasks, failures)| answer(&call.arns, &tasks, &failures, false))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Stop {
    cluster: Option<String>,
    task: String,
    reason: Option<String>,
}

/// The id a task's name or ARN gives, checked to be in `pool`.
pub(super) fn task_in(c: &Cluster, arns: &arn::Arns, pool: &str, given: &str) -> Option<Task> {
    let id = arns.short("task", given)?;
    c.read().task(id).ok().filter(|t| t.pool.as_str() == pool)
}

pub(super) async fn stop(call: &Call, s: Stop) -> Result<String, EcsError> {
    let arns = call.arns.clone();
    call.run(api::operator, Touch::List, move |c, who| {
        let pool = pool_in(c, &who, &arns, s.cluster.as_deref())?;
        let Some(t) = task_in(c, &arns, &pool, &s.task) else {
            return Err(Error::invalid("task", "The referenced task was not found."));
        };
        let t = c.stop_task(&t.id.to_string(), s.reason)?;
        Ok(shown(c, vec![t]))
    })
    .await
    .and_then(|t| {
        let t = &t[0];
        let task = shapes::task(&call.arns, &t.task, t.run.as_deref(), t.host.as_ref(), false);
        let json = serde_json::to_string(&task)
            .map_err(|e| EcsError::from(Error::Internal(format!("encoding a task: {e}"))))?;
        Ok(format!(r#"{{"task":{json}}}"#))
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Describe {
    cluster: Option<String>,
    tasks: Vec<String>,
    #[serde(default)]
    include: Vec<String>,
}

pub(super) async fn describe(call: &Call, d: Describe) -> Result<String, EcsError> {
    let arns = call.arns.clone();
    let tags = with_tags(&d.include);
    call.read(move |c, who| {
        let pool = pool_in(c, &who, &arns, d.cluster.as_deref())?;
        if d.tasks.is_empty() || d.tasks.len() > MAX_DESCRIBE {
            return Err(Error::invalid(
                "tasks",
                format!("Tasks cannot be empty, nor more than {MAX_DESCRIBE}."),
            ));
        }
        let (mut found, mut failures) = (Vec::new(), Vec::new());
        for given in &d.tasks {
            match task_in(c, &arns, &pool, given) {
                Some(t) => found.push(t),
                None => {
                    let arn = if given.starts_with("arn:") { given.clone() } else { arns.task(&pool, given) };
                    failures.push(failure(&arn, "MISSING", None));
                }
            }
        }
        Ok((shown(c, found), failures))
    })
    .await
    .and_then(|(tasks, failures)| answer(&call.arns, &tasks, &failures, tags))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct List {
    cluster: Option<String>,
    container_instance: Option<String>,
    family: Option<String>,
    started_by: Option<String>,
    service_name: Option<String>,
    desired_status: Option<String>,
    next_token: Option<String>,
    max_results: Option<i64>,
}

pub(super) async fn list(call: &Call, l: List) -> Result<Value, EcsError> {
    let desired = match l.desired_status.as_deref().unwrap_or("RUNNING") {
        "RUNNING" => TaskStatus::Running,
        "PENDING" => TaskStatus::Pending,
        "STOPPED" => TaskStatus::Stopped,
        other => {
            return Err(EcsError::invalid(format!(
                "desiredStatus must be RUNNING, PENDING or STOPPED, got {other:?}"
            )))
        }
    };
    let arns = call.arns.clone();
    let ids: Vec<(u64, String, String)> = call
        .read(move |c, who| {
            let pool = pool_in(c, &who, &arns, l.cluster.as_deref())?;
            let host = l.container_instance.as_deref().and_then(|h| arns.short("container-instance", h));
            let service = l.service_name.as_deref().and_then(|s| arns.short("service", s));
            let filter = TaskFilter {
                pool: Some(pool.clone()),
                host: host.map(str::to_string),
                service: service.map(str::to_string),
                ..Default::default()
            };
            // Read in place: a pool's tasks are not copied to list their ids.
            let mut ids = Vec::new();
            c.read().visit_tasks(&filter, |t| {
                let wanted = match desired {
                    // ECS's PENDING: wanted running, not running yet.
                    TaskStatus::Pending => {
                        shapes::ecs_desired(t) == TaskStatus::Running && t.last_status < TaskStatus::Running
                    }
                    d => shapes::ecs_desired(t) == d,
                };
                let started_by =
                    t.labels.as_ref().and_then(|l| l.started_by.as_deref()).unwrap_or(&t.started_by);
                if wanted
                    && l.family.as_deref().is_none_or(|f| t.task_definition.family.as_str() == f)
                    && l.started_by.as_deref().is_none_or(|s| started_by == s)
                {
                    ids.push((t.created_at_ms, t.id.to_string(), t.pool.to_string()));
                }
            });
            Ok(ids)
        })
        .await?;
    let (ids, next) =
        page(ids, |(at, id, _)| format!("{at:020}/{id}"), l.next_token.as_deref(), l.max_results)?;
    let arns: Vec<String> = ids.iter().map(|(_, id, pool)| call.arns.task(pool, id)).collect();
    Ok(json!({ "taskArns": arns, "nextToken": next }))
}
