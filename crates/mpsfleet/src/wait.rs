//! `--wait`: a command that changes something waits until the change has taken effect,
//! printing progress on stderr, as `kubectl rollout status` and `docker service create` do.
//!
//! Exit codes (docs/cli.md): 0 when it took effect; 1 when it failed (a task stopped
//! instead of running, a deployment failed) or the server refused; 124 when `--timeout`
//! passed first (as `timeout(1)` exits).

use anyhow::Result;
use clap::Args;
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::{DeploymentStatus, RolloutState, TaskId, TaskStatus};
use std::time::Duration;

/// The exit code of a wait that timed out.
pub const TIMED_OUT: u8 = 124;

/// A wait that ran past its timeout; main turns it into exit code 124.
#[derive(Debug)]
pub struct TimedOut(pub String);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "timed out: {}", self.0)
    }
}

impl std::error::Error for TimedOut {}

#[derive(Args, Clone, Copy)]
pub struct WaitFlags {
    /// Wait until the change has taken effect, with progress on stderr (exit 0; 1 if it failed,
    /// 124 if --timeout passed first).
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub timeout: u64,
}

/// What one look at the server says.
enum Progress {
    /// It took effect: the final line says what was reached.
    Done(String),
    Waiting(String),
    Failed(String),
}

/// Looks every half second until `look` says done or failed, or the timeout passes; prints
/// each new progress line on stderr, and the final line once it is done.
async fn poll<F, Fut>(flags: WaitFlags, what: &str, mut look: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Progress>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(flags.timeout);
    let mut last = String::new();
    loop {
        match look().await? {
            Progress::Done(line) => {
                eprintln!("{line}");
                return Ok(());
            }
            Progress::Failed(why) => anyhow::bail!("{what} failed: {why}"),
            Progress::Waiting(line) => {
                if line != last {
                    eprintln!("waiting for {what}: {line}");
                    last = line;
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut(format!("{what} after {} s: {last}", flags.timeout)).into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Until every task is RUNNING; failed when one stops first.
pub async fn tasks_running(c: &Client, flags: WaitFlags, ids: &[TaskId]) -> Result<()> {
    poll(flags, "the tasks to run", || async {
        let mut running = 0;
        let mut pending = Vec::new();
        for id in ids {
            let t = c.describe_task(&id.to_string()).await?;
            match t.last_status {
                TaskStatus::Running => running += 1,
                TaskStatus::Stopped => {
                    let why = t.stopped_reason.unwrap_or_else(|| "no reason given".into());
                    return Ok(Progress::Failed(format!("task {id} stopped: {why}")));
                }
                _ if t.unplaceable => return Ok(Progress::Failed(never_placed(&t))),
                s => pending.push(format!(
                    "{id} {}{}",
                    s.as_str(),
                    t.pending_reason.map(|r| format!(" ({r})")).unwrap_or_default()
                )),
            }
        }
        if pending.is_empty() {
            return Ok(Progress::Done(format!("{running} of {} task(s) RUNNING", ids.len())));
        }
        Ok(Progress::Waiting(format!("{running} of {} RUNNING; {}", ids.len(), pending.join("; "))))
    })
    .await
}

/// Until the task is STOPPED.
pub async fn task_stopped(c: &Client, flags: WaitFlags, id: &TaskId) -> Result<()> {
    poll(flags, "the task to stop", || async {
        let t = c.describe_task(&id.to_string()).await?;
        Ok(match t.last_status {
            TaskStatus::Stopped => Progress::Done(format!(
                "task {id} STOPPED: {}",
                t.stopped_reason.as_deref().unwrap_or("no reason given")
            )),
            s => Progress::Waiting(format!("{id} is {}", s.as_str())),
        })
    })
    .await
}

/// Until the service's PRIMARY deployment (as it is now) completes with as many healthy tasks
/// as it wants (a scale-up of a completed deployment is waited for too) and no task beyond
/// the desired count is left (a scale-down); failed when the deployment fails. Progress and
/// the failure name the stop reasons of the deployment's failed tasks, grouped.
pub async fn deployment_done(c: &Client, flags: WaitFlags, service: &str) -> Result<()> {
    let first = c.service_deployments(service).await?;
    let Some(id) = first
        .iter()
        .find(|d| d.deployment.status == DeploymentStatus::Primary)
        .map(|d| d.deployment.id.clone())
    else {
        return Ok(());
    };
    poll(flags, &format!("deployment {id} of {service}"), || async {
        let list = c.service_deployments(service).await?;
        let Some(d) = list.iter().find(|d| d.deployment.id == id) else {
            return Ok(Progress::Failed(format!("deployment {id} is gone")));
        };
        let dep = &d.deployment;
        let query = TaskQuery { service: Some(service.to_string()), live: true, ..Default::default() };
        let tasks = c.list_tasks(&query).await?;
        let live = tasks.len() as u32;
        if let Some(t) = tasks.iter().find(|t| t.unplaceable && t.desired_status != TaskStatus::Stopped) {
            return Ok(Progress::Failed(never_placed(t)));
        }
        let waiting = placement_reasons(&tasks);
        let failures = dep.failures_words();
        Ok(match dep.rollout_state {
            RolloutState::Completed if d.healthy_count >= dep.desired_count && live <= dep.desired_count => {
                Progress::Done(format!(
                    "deployment {id} of {service} completed: {} of {} {}",
                    d.healthy_count,
                    dep.desired_count,
                    if d.health_checked { "healthy" } else { "running (no health check)" }
                ))
            }
            RolloutState::Failed => Progress::Failed(dep.rollout_state_reason.clone()),
            RolloutState::Completed if d.healthy_count >= dep.desired_count => Progress::Waiting(format!(
                "{live} task(s) not yet STOPPED for {} desired: {} stopping",
                dep.desired_count,
                live - dep.desired_count
            )),
            RolloutState::InProgress | RolloutState::Completed if !d.health_checked => {
                Progress::Waiting(format!(
                    "{} of {} running (no health check), {} pending, {} failed{}{}",
                    d.running_count,
                    dep.desired_count,
                    d.pending_count,
                    dep.failed_tasks,
                    if failures.is_empty() { String::new() } else { format!(" ({})", failures.join("; ")) },
                    waiting
                ))
            }
            RolloutState::InProgress | RolloutState::Completed => Progress::Waiting(format!(
                "{} of {} healthy, {} running, {} pending, {} failed{}{}",
                d.healthy_count,
                dep.desired_count,
                d.running_count,
                d.pending_count,
                dep.failed_tasks,
                if failures.is_empty() { String::new() } else { format!(" ({})", failures.join("; ")) },
                waiting
            )),
        })
    })
    .await
}

/// The failure of a wait for a task nothing will ever place by itself.
fn never_placed(t: &mpsfleet_types::Task) -> String {
    format!(
        "task {} can never be placed as the pool is: {}",
        t.id,
        t.pending_reason.as_deref().unwrap_or("no host of its pool has what it needs")
    )
}

/// Why the tasks that wait for a host wait: each distinct reason with how many, or nothing.
fn placement_reasons(tasks: &[mpsfleet_types::Task]) -> String {
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    for t in tasks.iter().filter(|t| t.host_id.is_none()) {
        if let Some(r) = &t.pending_reason {
            *by.entry(r.as_str()).or_default() += 1;
        }
    }
    let each: Vec<String> = by.into_iter().map(|(r, n)| format!("{n} waiting: {r}")).collect();
    if each.is_empty() {
        String::new()
    } else {
        format!("; {}", each.join("; "))
    }
}

/// Until no task is left on the host.
pub async fn host_drained(c: &Client, flags: WaitFlags, host: &str) -> Result<()> {
    poll(flags, &format!("host {host} to drain"), || async {
        let query = TaskQuery { host: Some(host.to_string()), live: true, ..Default::default() };
        let left = c.list_tasks(&query).await?;
        Ok(if left.is_empty() {
            Progress::Done(format!("host {host} drained: no task left on it"))
        } else {
            Progress::Waiting(format!("{} task(s) left", left.len()))
        })
    })
    .await
}
