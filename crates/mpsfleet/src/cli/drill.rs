//! `mpsfleet drill`: run a drill on a live pool (or plan it), follow it to its verdict, list
//! and describe drills, abort one, and the cluster-wide switch (docs/drills.md).

use super::*;
use mpsfleet_client::DrillAnswer;
use mpsfleet_types::drill::{CreateDrill, Drill, DrillPlan, DrillStatus, DrillVerdict};

#[derive(Subcommand)]
pub enum DrillCommand {
    /// Inject a fault through the agents of chosen hosts, let the pool's owner handle it as a
    /// real failure, and report the measured timeline against the pool's bounds. Waits for
    /// the verdict; exits 1 when the drill breached a bound or was aborted.
    Run {
        /// The pool (MPSFLEET_POOL, or the server's only pool).
        #[arg(long, env = "MPSFLEET_POOL", add = super::complete::pools())]
        pool: Option<String>,
        /// daemon-exit, daemon-hang, agent-stop or gpu-check-fail.
        #[arg(long)]
        fault: String,
        /// How many hosts: a count (2) or a share of the pool (25%). Default 1.
        #[arg(long)]
        hosts: Option<String>,
        /// Name the targets and print the expected timeline; inject nothing.
        #[arg(long)]
        dry_run: bool,
        /// Inject the fault once (measures local repair alone); by default it persists until
        /// the pool's owner has acted or the drill's time runs out.
        #[arg(long)]
        once: bool,
        /// Return once the drill has started instead of waiting for its verdict.
        #[arg(long)]
        no_wait: bool,
    },
    /// Drills, newest first (the latest 100 are kept).
    List,
    /// One drill: targets, each phase measured against its bound, verdict, events.
    Describe {
        /// The drill's id.
        #[arg(add = super::complete::drills())]
        id: String,
    },
    /// Take a running drill's fault back now and restore what it broke.
    Abort {
        /// The drill's id.
        #[arg(add = super::complete::drills())]
        id: String,
    },
    /// Allow drills cluster-wide (`on`), switch them off (`off`: blocks new drills and aborts
    /// running ones), or show the switch (`status`).
    Switch {
        /// on, off or status.
        state: String,
    },
}

const HEADERS: [&str; 7] = ["ID", "POOL", "FAULT", "TARGETS", "STATUS", "VERDICT", "STARTED"];

fn rows(list: &[Drill]) -> Vec<Vec<String>> {
    list.iter()
        .map(|d| {
            let targets: Vec<&str> = d.targets.iter().map(|t| t.hostname.as_str()).collect();
            vec![
                d.id.clone(),
                d.pool.to_string(),
                d.fault.as_str().into(),
                sanitize(&targets.join(",")).into_owned(),
                d.status.as_str().into(),
                d.verdict.as_ref().map_or_else(|| "-".into(), DrillVerdict::words),
                mpsfleet_types::utc(d.started_at_ms),
            ]
        })
        .collect()
}

pub(super) async fn drill(c: &Client, f: Format, cmd: DrillCommand) -> Result<()> {
    match cmd {
        DrillCommand::Run { pool, fault, hosts, dry_run, once, no_wait } => {
            let pool = resolve_pool(c, pool).await?;
            let req = CreateDrill { pool, fault, hosts, dry_run, once };
            match c.run_drill(&req).await? {
                DrillAnswer::Plan(plan) => print_plan(f, &plan),
                DrillAnswer::Started(d) if no_wait => print_drill(f, &d),
                DrillAnswer::Started(d) => {
                    if !f.is_data() {
                        let targets: Vec<&str> = d.targets.iter().map(|t| t.hostname.as_str()).collect();
                        eprintln!(
                            "drill {} started: {} on {}; waiting for its verdict (until {})",
                            d.id,
                            d.fault.as_str(),
                            sanitize(&targets.join(", ")),
                            mpsfleet_types::utc(d.deadline_ms)
                        );
                    }
                    let done = follow(c, &d).await?;
                    print_drill(f, &done)?;
                    match &done.verdict {
                        Some(DrillVerdict::WithinBounds) => Ok(()),
                        Some(v) => anyhow::bail!("drill {} {}", done.id, v.words()),
                        None => anyhow::bail!("drill {} ended without a verdict", done.id),
                    }
                }
            }
        }
        DrillCommand::List => {
            let list = c.list_drills().await?;
            output::print(f, &list, &HEADERS, rows(&list));
            Ok(())
        }
        DrillCommand::Describe { id } => print_drill(f, &c.describe_drill(&id).await?),
        DrillCommand::Abort { id } => print_drill(f, &c.abort_drill(&id).await?),
        DrillCommand::Switch { state } => {
            let s = match state.as_str() {
                "on" => c.set_drill_switch(true).await?,
                "off" => c.set_drill_switch(false).await?,
                "status" => c.drill_switch().await?,
                other => anyhow::bail!("drill switch takes on, off or status, not {other:?}"),
            };
            if f.is_data() {
                output::print(f, &s, &[], vec![]);
            } else {
                let by = match (&s.changed_by, s.changed_at_ms) {
                    (Some(by), Some(at)) => {
                        format!(" (set by {} at {})", sanitize(by), mpsfleet_types::utc(at))
                    }
                    _ => String::new(),
                };
                println!("drills are {}{by}", if s.enabled { "allowed" } else { "switched off" });
            }
            Ok(())
        }
    }
}

/// Polls the drill until it has ended, printing each new event on standard error.
async fn follow(c: &Client, d: &Drill) -> Result<Drill> {
    let limit = d.deadline_ms + 5 * 60_000;
    let mut seen = 0;
    loop {
        let now = c.describe_drill(&d.id).await?;
        for e in now.events.iter().skip(seen) {
            eprintln!(
                "  {}  {}: {}",
                mpsfleet_types::utc(e.at_ms),
                e.event.reason,
                sanitize(&e.event.message)
            );
        }
        seen = now.events.iter().count();
        if now.status == DrillStatus::Ended {
            return Ok(now);
        }
        use mpsfleet_core::clock::Clock;
        if mpsfleet_core::clock::SystemClock.now_ms() > limit {
            anyhow::bail!(
                "drill {} has not ended 5 minutes past its deadline; see `mpsfleet drill describe {}`",
                d.id,
                d.id
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

fn print_plan(f: Format, p: &DrillPlan) -> Result<()> {
    if f.is_data() {
        output::print(f, p, &[], vec![]);
        return Ok(());
    }
    println!("dry run: nothing injected");
    println!("pool {} ({}), fault {}", p.pool, p.owner, p.fault.as_str());
    for t in &p.targets {
        let gpu = t.gpu_id.as_ref().map(|g| format!(" GPU {g}")).unwrap_or_default();
        println!("  target {} ({}){gpu}", sanitize(&t.hostname), t.host_id);
    }
    println!("expected, from the pool's bounds for {}:", p.bounds.kind);
    for line in &p.expected {
        println!("  {line}");
    }
    Ok(())
}

fn print_drill(f: Format, d: &Drill) -> Result<()> {
    if f.is_data() {
        output::print(f, d, &[], vec![]);
        return Ok(());
    }
    let targets: Vec<String> = d
        .targets
        .iter()
        .map(|t| {
            let gpu = t.gpu_id.as_ref().map(|g| format!(" GPU {g}")).unwrap_or_default();
            format!("{} ({}){gpu}", sanitize(&t.hostname), t.host_id)
        })
        .collect();
    let pairs = [
        ("ID", d.id.clone()),
        ("Pool", format!("{} (recovery owned by {})", d.pool, d.owner)),
        ("Fault", format!("{}{}", d.fault.as_str(), if d.once { ", injected once" } else { ", persistent" })),
        ("Targets", targets.join(", ")),
        ("Status", d.status.as_str().into()),
        ("Verdict", d.verdict.as_ref().map_or_else(|| "-".into(), DrillVerdict::words)),
        ("Incidents", if d.incidents.is_empty() { "none".into() } else { d.incidents.join(", ") }),
        ("Notified", d.notified_at_ms.map_or_else(|| "-".into(), mpsfleet_types::utc)),
        ("Started", format!("{} by {}", mpsfleet_types::utc(d.started_at_ms), sanitize(&d.by))),
        ("Ended", d.ended_at_ms.map_or_else(|| "-".into(), mpsfleet_types::utc)),
    ];
    print!("{}", output::fields(&pairs.iter().map(|(k, v)| (*k, v.clone())).collect::<Vec<_>>()));
    let secs = |ms: Option<u64>| ms.map_or_else(|| "-".into(), mpsfleet_types::time::secs);
    if !d.phases.is_empty() {
        let rows: Vec<Vec<String>> = d
            .phases
            .iter()
            .map(|j| {
                let cause = j.cause.map(|c| format!(" ({})", c.as_str())).unwrap_or_default();
                vec![
                    j.phase.as_str().into(),
                    secs(j.measured_ms),
                    secs(j.bound_ms),
                    format!("{:?}{cause}", j.verdict).to_lowercase(),
                ]
            })
            .collect();
        println!();
        print!("{}", output::table(&["PHASE", "MEASURED", "BOUND", "VERDICT"], &rows));
    }
    print!("{}", crate::output::events_section(&d.events));
    Ok(())
}
