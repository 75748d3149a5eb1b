//! The drill controller (`Work::Drill`): passes over a drill every `DRILL_PASS_MS` while it
//! runs or restores. An incident opening on a target is marked as the drill's; a stop
//! condition aborts it; the owner's handling (or its deadline) ends the run, the fault is taken
//! back and each target's local repair re-armed (`RESTORING`); once the targets are back (or
//! gone, replaced) it is `ENDED` with its verdict. Starting a drill, the switch and the
//! faults a heartbeat carries are requests' (`cluster/drills.rs`). The lifecycle is
//! `mpsfleet_core::lifecycle::drill`, the one place a drill's status changes.

use super::Ctx;
use crate::cluster::error::Error;
use crate::cluster::kinds::DRILL;
use crate::cluster::state::{Change, State};
use crate::cluster::write::Writer;
use mpsfleet_core::controller::Action;
use mpsfleet_core::lifecycle::drill::{self as drill_lifecycle, Event as DrillEvent};
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::drill::*;
use mpsfleet_types::{HealthStatus, HostId, HostStatus, Incident, IncidentState, ObjectEvent};
use std::collections::BTreeSet;

/// How often a drill is looked at while it runs or restores.
pub const DRILL_PASS_MS: u64 = 250;
/// A self-managed pool's drill takes the fault back this long after the notification.
pub const SELF_MANAGED_HOLD_MS: u64 = 2_000;
/// Tasks of the pool waiting for placement longer than this abort a running drill.
pub const PENDING_ABORT_MS: u64 = 120_000;
/// How long a drill waits for its targets to be back after taking the fault back.
pub const RESTORE_TIMEOUT_MS: u64 = 60_000;

/// The drill controller. It keeps nothing between its passes: a drill's progress is its
/// record.
pub(in crate::cluster) struct Drills;

/// The cluster-wide switch as stored, on when never set.
pub(in crate::cluster) fn switch(state: &State) -> DrillSwitch {
    state.drill_switch().map(|s| s.value.clone()).unwrap_or(DrillSwitch {
        enabled: true,
        changed_by: None,
        changed_at_ms: None,
    })
}

impl Drills {
    /// The drill controller's reconcile of one drill.
    pub(in crate::cluster) fn reconcile(ctx: &mut Ctx<'_>, id: &str) -> Result<Action, Error> {
        let w = &mut ctx.w;
        let Some(d) = w.state.drills().get(id).map(|d| d.value.clone()) else {
            return Ok(Action::AwaitChange);
        };
        match d.status {
            DrillStatus::Running => drive_running(w, d)?,
            DrillStatus::Restoring => drive_restoring(w, d)?,
            DrillStatus::Ended => return Ok(Action::AwaitChange),
        }
        Ok(match w.state.drills().get(id).map(|d| d.value.status) {
            Some(DrillStatus::Ended) | None => Action::AwaitChange,
            _ => Action::RequeueAfter(DRILL_PASS_MS),
        })
    }
}

fn drive_running(w: &mut Writer<'_>, mut d: Drill) -> Result<(), Error> {
    let now = w.now_ms;
    let before = d.clone();
    // The incidents on the targets since the drill started: the drill's.
    let targets: BTreeSet<&HostId> = d.targets.iter().map(|t| &t.host_id).collect();
    let mut mine: Vec<&Incident> = w
        .state
        .incidents()
        .values()
        .map(|v| &v.value)
        .filter(|i| {
            i.drill.as_deref() == Some(d.id.as_str())
                || (targets.contains(&i.host_id) && i.opened_at_ms >= d.started_at_ms)
        })
        .collect();
    mine.sort_by_key(|i| i.opened_at_ms);
    for i in &mine {
        if !d.incidents.contains(&i.id) {
            d.incidents.push(i.id.clone());
            d.events.push(
                now,
                ObjectEvent::new("IncidentOpened", format!("incident {} opened on host {}", i.id, i.host_id)),
            );
        }
    }
    if let Some(first) = mine.first() {
        d.phases = first.judgement();
        if d.notified_at_ms.is_none() {
            d.notified_at_ms = Some(first.opened_at_ms);
        }
    }
    let all_resolved = !mine.is_empty() && mine.iter().all(|i| i.state == IncidentState::Resolved);
    let every_target = d.targets.iter().all(|t| mine.iter().any(|i| i.host_id == t.host_id));
    let event = if let Some(why) = stop_condition(w, &d, &targets) {
        Some(DrillEvent::Abort(why))
    } else if d.owner == "operator"
        && every_target
        && d.notified_at_ms.is_some_and(|n| now >= n + SELF_MANAGED_HOLD_MS)
    {
        // Detected and notified: the rest is the operator's, which a drill never does.
        Some(DrillEvent::Handled)
    } else if d.owner != "operator" && every_target && all_resolved {
        Some(DrillEvent::Handled)
    } else if d.once
        && mine.is_empty()
        && now >= d.started_at_ms + d.bounds.detect_ms + SELF_MANAGED_HOLD_MS
        && targets_healthy(w, &d)
    {
        d.events.push(
            now,
            ObjectEvent::new(
                "RepairedLocally",
                "no incident opened: the agent's local repair handled the fault",
            ),
        );
        Some(DrillEvent::Handled)
    } else if now >= d.deadline_ms {
        Some(DrillEvent::Deadline)
    } else {
        None
    };
    match event {
        Some(e) => end_run(w, d, e),
        None if d != before => write_drill(w, d),
        None => Ok(()),
    }
}

/// Why a running drill must stop now, if it must.
fn stop_condition(w: &Writer<'_>, d: &Drill, targets: &BTreeSet<&HostId>) -> Option<String> {
    if !switch(w.state).enabled {
        return Some("drills were switched off cluster-wide".into());
    }
    if let Some(i) =
        w.state.incidents().unresolved().find(|i| i.pool == d.pool && !targets.contains(&i.host_id))
    {
        return Some(format!(
            "incident {} opened on host {}, which the drill did not strike",
            i.id, i.host_id
        ));
    }
    let healthy_other = w
        .state
        .hosts()
        .iter()
        .filter(|e| e.host().pool == d.pool && !targets.contains(&e.host().id))
        .filter(|e| e.host().status == HostStatus::Active && e.host().health_status == HealthStatus::Ok)
        .count();
    if healthy_other == 0 {
        return Some("no healthy host is left in the pool besides the drill's targets".into());
    }
    let now = w.now_ms;
    let waiting = w
        .state
        .tasks()
        .pending_in(&d.pool)
        .iter()
        .filter_map(|id| w.state.tasks().get(id))
        .filter(|t| now.saturating_sub(t.task.created_at_ms.max(d.started_at_ms)) > PENDING_ABORT_MS)
        .count();
    if waiting > 0 {
        return Some(format!(
            "{waiting} task(s) of the pool have waited for placement for more than {}",
            mpsfleet_core::health::fmt_ms(PENDING_ABORT_MS)
        ));
    }
    None
}

/// Every target still in the fleet is healthy again (or gone: replaced and terminated).
fn targets_healthy(w: &Writer<'_>, d: &Drill) -> bool {
    d.targets.iter().all(|t| {
        w.sched.host(&t.host_id).map(|ix| &w.state.hosts()[ix as usize]).is_none_or(|e| {
            e.host().status == HostStatus::Deregistered || e.host().health_status == HealthStatus::Ok
        })
    })
}

fn drive_restoring(w: &mut Writer<'_>, mut d: Drill) -> Result<(), Error> {
    let now = w.now_ms;
    let left =
        d.ended_at_ms.is_none() && (targets_healthy(w, &d) || now >= restore_from(&d) + RESTORE_TIMEOUT_MS);
    if !left {
        return Ok(());
    }
    let back = targets_healthy(w, &d);
    drill_lifecycle::apply(&mut d, &DrillEvent::Restored, now).map_err(Error::Conflict)?;
    let what = if back {
        "the targets are back (healthy, or replaced)".to_string()
    } else {
        format!(
            "not every target was healthy again within {}: see `mpsfleet host describe`",
            mpsfleet_core::health::fmt_ms(RESTORE_TIMEOUT_MS)
        )
    };
    d.events.push(now, ObjectEvent::new("DrillEnded", what.clone()));
    let verdict = d.verdict.as_ref().map(DrillVerdict::words).unwrap_or_default();
    write_drill(w, d.clone())?;
    w.live.drill_ended(&d.pool, d.verdict.as_ref());
    tracing::warn!(drill.id = %d.id, pool = %d.pool, verdict, "drill ended");
    w.pool_event(&d.pool, "DrillEnded", format!("drill {}: {verdict}; {what}", d.id))
}

/// After the fault is taken back: each target's local repair re-armed (`host recheck`),
/// so that a daemon given up on starts again.
fn rearm_targets(w: &mut Writer<'_>, d: &Drill) -> Result<(), Error> {
    for t in &d.targets {
        let Some(ix) = w.sched.host(&t.host_id) else { continue };
        let mut h = w.state.hosts()[ix as usize].host().clone();
        if h.status == HostStatus::Deregistered {
            continue;
        }
        h.rechecks += 1;
        let what = format!("drill {} took its fault back: the agent re-arms its local repair", d.id);
        h.events.push(w.now_ms, ObjectEvent::new("RecheckRequested", what));
        w.write_host(ix, h)?;
    }
    Ok(())
}

/// Ends a drill's run for `e`: its verdict, the fault withdrawn (it leaves the heartbeat
/// answers), each target's local repair re-armed.
pub(in crate::cluster) fn end_run(w: &mut Writer<'_>, mut d: Drill, e: DrillEvent) -> Result<(), Error> {
    let now = w.now_ms;
    drill_lifecycle::apply(&mut d, &e, now).map_err(Error::Conflict)?;
    let verdict = d.verdict.as_ref().map(DrillVerdict::words).unwrap_or_default();
    d.events
        .push(now, ObjectEvent::new("FaultWithdrawn", format!("{verdict}; restoring what the fault broke")));
    write_drill(w, d.clone())?;
    rearm_targets(w, &d)
}

fn write_drill(w: &mut Writer<'_>, d: Drill) -> Result<(), Error> {
    let expect = match w.state.drills().get(&d.id) {
        Some(v) if v.value == d => return Ok(()),
        Some(v) => Precondition::Version(v.version),
        None => Precondition::Absent,
    };
    w.write(&[Op::put_json(DRILL, d.id.clone(), &d, expect)?], [Change::Drill(Box::new(d))])?;
    Ok(())
}

/// When the drill left RUNNING: its last event's time (the withdrawal).
fn restore_from(d: &Drill) -> u64 {
    d.events.iter().last().map_or(d.started_at_ms, |e| e.at_ms)
}
