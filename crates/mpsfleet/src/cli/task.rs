//! `mpsfleet task …`: running, listing, describing, protecting, stopping tasks and their
//! rows; `task exec` and `task logs` have modules of their own (`exec.rs`, `logs.rs`).

use super::*;

pub(super) fn task_rows(tasks: &[Task]) -> Vec<Vec<String>> {
    let now = now_ms();
    tasks
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.task_definition.to_string(),
                t.last_status.as_str().into(),
                // Leaving traffic before its stop: told to stop, after its delay.
                match t.draining {
                    Some(_) => "STOPPED (draining)".into(),
                    None => t.desired_status.as_str().into(),
                },
                task_health(t),
                opt(&t.host_id),
                crate::describe::gpus(t),
                (t.pending_reason.clone().or_else(|| t.stopped_reason.clone()))
                    .or_else(|| t.draining.as_ref().map(draining_words))
                    .unwrap_or_default(),
                t.priority.to_string(),
                output::age(now, t.created_at_ms),
            ]
        })
        .collect()
}

/// A replica leaving traffic, in words: why, and when its stop follows.
fn draining_words(d: &mpsfleet_types::Draining) -> String {
    let left = d.until_ms.saturating_sub(now_ms());
    format!("{}: leaving traffic, stopped in {}", d.reason, mpsfleet_core::health::fmt_ms(left))
}

/// The wall clock, for AGE columns.
pub(super) fn now_ms() -> u64 {
    mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock)
}

/// A stopped task has no health.
fn task_health(t: &Task) -> String {
    if t.last_status == TaskStatus::Stopped {
        "-".into()
    } else {
        t.health_status.as_str().into()
    }
}

pub(super) const TASK_HEADERS: [&str; 10] =
    ["ID", "TASK DEFINITION", "LAST", "DESIRED", "HEALTH", "HOST", "GPUS", "REASON", "PRIORITY", "AGE"];

/// `task run`'s body: its flags, with `--tag KEY=VALUE`s as tags.
pub(super) fn run_request(
    taskdef: String,
    count: u32,
    pool: String,
    client_token: Option<String>,
    tags: &[String],
    priority: Option<u32>,
) -> RunTask {
    let tags = tags
        .iter()
        .map(|t| {
            let (key, value) = t.split_once('=').unwrap_or((t, ""));
            mpsfleet_types::tags::Tag { key: key.to_string(), value: value.to_string() }
        })
        .collect();
    RunTask { task_definition: taskdef, count, pool, client_token, tags, priority, ..Default::default() }
}

pub(super) async fn task(c: &Client, f: Format, cmd: TaskCommand) -> Result<()> {
    match cmd {
        TaskCommand::Run {
            taskdef,
            count,
            pool,
            client_token,
            tags,
            priority,
            enable_execute_command,
            wait,
        } => {
            let pool = resolve_pool(c, pool).await?;
            let req = RunTask {
                enable_execute_command,
                ..run_request(taskdef, count, pool, client_token, &tags, priority)
            };
            let r = c.run_task(&req).await?;
            match f {
                Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
                    output::print(f, &r, &[], vec![])
                }
                Format::Table | Format::Wide => {
                    print!("{}", output::table(&TASK_HEADERS, &task_rows(&r.tasks)));
                    println!("{} placed, {} waiting for capacity", r.placed, r.pending);
                }
            }
            if wait.wait {
                let ids: Vec<TaskId> = r.tasks.iter().map(|t| t.id).collect();
                crate::wait::tasks_running(c, wait, &ids).await?;
            }
        }
        TaskCommand::List { pool, service, host, status, limit, skip, all, watch } => {
            let live = !all && status.is_none();
            let query = TaskQuery { pool, service, host, status, limit, skip, newest_first: true, live };
            if watch {
                let types = [EventType::TaskEvent, EventType::TaskStopped];
                let fetch = || async { Ok(c.list_tasks(&query).await?) };
                return watch::watch(c, f, &types, &TASK_HEADERS, task_rows, fetch).await;
            }
            let tasks = c.list_tasks(&query).await?;
            if f == Format::Wide {
                let headers = [&TASK_HEADERS[..], &["SERVICE", "CREATED", "STARTED BY"]].concat();
                let rows = task_rows(&tasks)
                    .into_iter()
                    .zip(&tasks)
                    .map(|(mut r, t)| {
                        r.extend([opt(&t.group), output::utc_time(t.created_at_ms), t.started_by.clone()]);
                        r
                    })
                    .collect();
                output::print(f, &tasks, &headers, rows);
            } else {
                output::print(f, &tasks, &TASK_HEADERS, task_rows(&tasks));
            }
        }
        TaskCommand::Describe { id } => {
            let t = c.describe_task(&id).await?;
            if f.is_data() {
                output::print(f, &t, &[], Vec::new());
                return Ok(());
            }
            // The definition gives the GPU and MPS limits; the events may be gone (another
            // server's memory): the view is shown without what cannot be read.
            let def = c.describe_taskdef(&t.task_definition.to_string()).await.ok();
            let events = c.task_events(&id).await.unwrap_or_default();
            // What it uses of its GPU, as its host's agent last reported.
            let gpu_use = match (&t.host_id, t.last_status) {
                (Some(h), s) if s != TaskStatus::Stopped => {
                    c.describe_host(h.as_str()).await.map(|h| h.gpu_use).unwrap_or_default()
                }
                _ => Vec::new(),
            };
            // Whether its host or daemon is impaired, and the incident about it.
            let hosts: Vec<_> = match &t.host_id {
                Some(h) => c.describe_host(h.as_str()).await.into_iter().collect(),
                None => Vec::new(),
            };
            let incidents = c.list_incidents().await.unwrap_or_default();
            let trouble = crate::describe::host_trouble(&t, &hosts, &incidents);
            print!("{}", crate::describe::task(&t, def.as_ref(), &gpu_use, &events, trouble));
        }
        TaskCommand::Logs { id, opts } => logs::task_logs(c, f, &id, &opts).await?,
        TaskCommand::Exec { id, container, interactive, tty, command } => {
            let spec = mpsfleet_types::exec::ExecSpec {
                container,
                command,
                interactive,
                tty,
                cols: None,
                rows: None,
            };
            return Err(exec::run(c, &id, spec).await);
        }
        TaskCommand::Protect { id, minutes, off } => {
            let req = ProtectTask { protection_enabled: !off, expires_in_minutes: (!off).then_some(minutes) };
            let t = c.protect_task(&id, &req).await?;
            output::print(f, &t, &TASK_HEADERS, task_rows(std::slice::from_ref(&t)));
            if !f.is_data() {
                match t.labels.as_ref().and_then(|l| l.protected_until_ms) {
                    Some(ms) => println!("protected until {}", mpsfleet_types::time::utc(ms)),
                    None => println!("not protected"),
                }
            }
        }
        TaskCommand::Stop { id, reason, wait } => {
            let t = c.stop_task(&id, reason).await?;
            output::print(f, &t, &TASK_HEADERS, task_rows(std::slice::from_ref(&t)));
            if wait.wait {
                crate::wait::task_stopped(c, wait, &t.id).await?;
            }
        }
    }
    Ok(())
}
