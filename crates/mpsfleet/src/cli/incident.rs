//! The CLI's incident commands (list, describe, acknowledge, resolve), and how an incident and
//! an operator command's outcome are printed (host commands print them too).

use super::*;

#[derive(Subcommand)]
pub enum IncidentCommand {
    /// Incidents, newest first.
    List,
    /// One incident: its trigger, its timeline and what is left to do.
    Describe {
        /// The incident's id.
        #[arg(add = super::complete::incidents())]
        id: String,
    },
    /// Take the incident: recorded on its timeline with who and when; nothing else changes.
    Acknowledge {
        /// The incident's id.
        #[arg(add = super::complete::incidents())]
        id: String,
    },
    /// Close the incident; a replacement host still in flight is cancelled.
    Resolve {
        /// The incident's id.
        #[arg(add = super::complete::incidents())]
        id: String,
        /// Why the incident is resolved (kept on its timeline).
        #[arg(long)]
        reason: String,
    },
}

fn incident_rows(list: &[IncidentView]) -> Vec<Vec<String>> {
    let secs = |ms: Option<u64>| ms.map_or_else(|| "-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
    let now = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
    list.iter()
        .map(|v| {
            let i = &v.incident;
            vec![
                i.id.clone(),
                i.host_id.to_string(),
                i.pool.to_string(),
                i.owner.as_str().into(),
                i.state.as_str().into(),
                format!("{}: {}", i.trigger.check, i.trigger.reason),
                secs(v.timing.detect_ms),
                secs(v.timing.total_ms),
                output::age(now, i.opened_at_ms),
            ]
        })
        .collect()
}

/// DETECT: first failure to detected; DOWN: first failure to resumed (docs/pools.md); AGE:
/// since it opened.
const INCIDENT_HEADERS: [&str; 9] =
    ["ID", "HOST", "POOL", "OWNER", "STATE", "TRIGGER", "DETECT", "DOWN", "AGE"];

pub(super) fn print_incident(f: Format, v: IncidentView) -> Result<()> {
    match f {
        Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
            output::print(f, &v, &[], vec![])
        }
        Format::Table | Format::Wide => {
            print!("{}", output::table(&INCIDENT_HEADERS, &incident_rows(std::slice::from_ref(&v))));
            let i = &v.incident;
            if let IncidentState::Blocked { reason } = &i.state {
                println!("\nblocked: {}", sanitize(reason));
            }
            if !i.trigger.evidence.is_empty() {
                println!("\nevidence: {}", sanitize_text(&i.trigger.evidence));
            }
            let start = i.timeline.first().map_or(0, |t| t.at_ms);
            let rows: Vec<Vec<String>> = i
                .timeline
                .iter()
                .map(|t| {
                    let mut detail = t.detail.clone();
                    if t.count > 1 {
                        let last = t.latest_ms().saturating_sub(start) as f64 / 1000.0;
                        detail = format!("{detail} (x{}, last at +{last:.3}s)", t.count);
                    }
                    if let Some(by) = &t.by {
                        detail = format!("{detail} [by {by}]");
                    }
                    vec![
                        output::utc_time(t.at_ms),
                        format!("+{:.3}s", t.at_ms.saturating_sub(start) as f64 / 1000.0),
                        t.step.as_str().into(),
                        detail,
                    ]
                })
                .collect();
            println!();
            print!("{}", output::table(&["TIME", "AFTER", "STEP", "DETAIL"], &rows));
            if i.timeline.elided() > 0 {
                println!("({} older entries not kept between the first and the latest)", i.timeline.elided());
            }
            if !i.affected_tasks.is_empty() {
                let rows: Vec<Vec<String>> = i
                    .affected_tasks
                    .iter()
                    .map(|a| {
                        vec![
                            a.task_id.to_string(),
                            opt(&a.service),
                            match (a.waiting, &i.state) {
                                (true, IncidentState::Resolved) => "not moved".into(),
                                (true, _) => "waiting".into(),
                                (false, _) => opt(&a.replacement),
                            },
                            opt(&a.replacement_host),
                        ]
                    })
                    .collect();
                println!();
                print!("{}", output::table(&["TASK", "SERVICE", "REPLACEMENT", "ON HOST"], &rows));
            }
            let t = &v.timing;
            let secs =
                |ms: Option<u64>| ms.map_or_else(|| "-".into(), |ms| format!("{:.3}s", ms as f64 / 1000.0));
            let at = |ms: Option<u64>| ms.map_or_else(|| "-".into(), mpsfleet_types::utc);
            println!(
                "\nfirst failure {}, detected {}, decided {}, replacement ready {}, resumed {}",
                at(t.first_failure_at_ms),
                at(t.detected_at_ms),
                at(t.decided_at_ms),
                at(t.replacement_ready_at_ms),
                at(t.resumed_at_ms)
            );
            println!(
                "time to detect {}, to decide {}, to replace {}; down for {} (first failure to resumed)",
                secs(t.detect_ms),
                secs(t.decide_ms),
                secs(t.replace_ms),
                secs(t.total_ms)
            );
            if let Some(b) = &v.incident.bounds {
                let resumption = if b.fenced { "fenced" } else { "restart" };
                println!("\nheld to the pool's bounds for {} (services: {resumption}):", b.kind);
                let rows: Vec<Vec<String>> = v
                    .judgement
                    .iter()
                    .map(|j| {
                        let verdict = match (j.verdict, j.cause) {
                            (PhaseVerdict::Breached, Some(c)) => format!("breached ({})", c.as_str()),
                            (PhaseVerdict::Breached, None) => "breached (cause unknown)".into(),
                            (PhaseVerdict::Within, _) => "within".into(),
                            (PhaseVerdict::Running, _) => "running".into(),
                            (PhaseVerdict::NotApplicable, _) => "-".into(),
                        };
                        vec![j.phase.as_str().into(), secs(j.measured_ms), secs(j.bound_ms), verdict]
                    })
                    .collect();
                print!("{}", output::table(&["PHASE", "MEASURED", "BOUND", "VERDICT"], &rows));
            }
            if let Some(d) = &v.incident.drill {
                println!("caused by drill {}", sanitize(d));
            }
        }
    }
    Ok(())
}

/// After a drain: the tasks it moved that no host of the pool can take now, with the reason,
/// on standard error (nothing when every one was placed).
pub(super) async fn warn_unplaced_moves(c: &Client, incident: &str) {
    let Ok(v) = c.describe_incident(incident).await else { return };
    let mut waiting: Vec<(String, String)> = Vec::new();
    for r in v.incident.affected_tasks.iter().filter_map(|a| a.replacement) {
        let Ok(t) = c.describe_task(&r.to_string()).await else { continue };
        if t.host_id.is_none() && t.last_status != TaskStatus::Stopped {
            waiting
                .push((t.id.to_string(), t.pending_reason.unwrap_or_else(|| "waiting for capacity".into())));
        }
    }
    if let Some((_, why)) = waiting.first() {
        let ids: Vec<&str> = waiting.iter().map(|(id, _)| id.as_str()).collect();
        eprintln!(
            "warning: the pool has no capacity now for {} task(s) moved off the host ({}): {}",
            waiting.len(),
            sanitize(&ids.join(", ")),
            sanitize(why)
        );
    }
}

pub(super) async fn incident(c: &Client, f: Format, cmd: IncidentCommand) -> Result<()> {
    match cmd {
        IncidentCommand::List => {
            let mut list = c.list_incidents().await?;
            // Newest first, as every list.
            list.sort_by_key(|v| std::cmp::Reverse(v.incident.opened_at_ms));
            output::print(f, &list, &INCIDENT_HEADERS, incident_rows(&list));
            Ok(())
        }
        IncidentCommand::Describe { id } => print_incident(f, c.describe_incident(&id).await?),
        IncidentCommand::Acknowledge { id } => print_incident(f, c.acknowledge_incident(&id).await?),
        IncidentCommand::Resolve { id, reason } => {
            print_operator_command(f, c.resolve_incident(&id, &reason).await?)
        }
    }
}

/// The answer of `host activate` and `incident resolve`: what changed, in words.
pub(super) fn print_operator_command(f: Format, r: OperatorCommandResponse) -> Result<()> {
    if f.is_data() {
        output::print(f, &r, &[], vec![]);
        return Ok(());
    }
    if let Some(h) = &r.host {
        println!(
            "host {} is {} ({})",
            sanitize(h.id.as_str()),
            sanitize(h.status.as_str()),
            sanitize(h.health_status.as_str())
        );
    }
    if let Some(v) = &r.incident {
        println!("incident {} is {}", sanitize(&v.incident.id), sanitize(v.incident.state.as_str()));
    }
    if let Some(what) = &r.replacement {
        println!("{}", sanitize(what));
    }
    Ok(())
}
