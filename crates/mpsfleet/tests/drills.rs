//! Drills on a live local fleet, as a user runs them: `mpsfleet up --hosts 3` (the real MPS
//! daemon, tasks as processes), a 3-replica MPS service, and `mpsfleet drill run` through the
//! CLI. A dry run changes nothing; the refusing cases say why; a daemon-exit drill is handled
//! by the pool's owner as a real failure and ends within the stated bounds, its incident
//! marked as the drill's and the replicas running again. The times the drill reports are
//! checked against the incident the server recorded and against the bounds `pool explain`
//! states.

mod common;

use common::up::Up;
use common::*;
use mpsfleet_client::TaskQuery;
use mpsfleet_types::drill::{Drill, DrillStatus, DrillVerdict};
use mpsfleet_types::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_drill_on_a_live_pool_is_handled_as_a_real_failure_within_its_bounds() {
    if mps_control().is_none() {
        eprintln!("skipped: the real nvidia-cuda-mps-control is not installed (bash scripts/install-mps.sh)");
        assert!(!on_ci(), "CI installs the MPS daemon");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &dir.path().join("data"), 3);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let admin = &up.admin;
        eventually(WAIT, "three ACTIVE, healthy hosts", || async {
            let hs = admin.list_hosts(None).await.ok()?;
            (hs.len() == 3
                && hs.iter().all(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok))
            .then_some(())
        })
        .await;
        admin.register_taskdef(mps_taskdef("web", 8192)).await.unwrap();
        let create = CreateService {
            name: "web".into(),
            pool: "default".into(),
            task_definition: "web".into(),
            desired_count: 3,
            ..Default::default()
        };
        admin.create_service(&create).await.unwrap();
        let q = TaskQuery { service: Some("web".into()), live: true, ..Default::default() };
        let running = || async {
            eventually(WAIT, "3 RUNNING replicas", || async {
                let ts = admin.list_tasks(&q).await.ok()?;
                (ts.len() == 3 && ts.iter().all(|t| t.last_status == TaskStatus::Running)).then_some(ts)
            })
            .await
        };
        let before = running().await;
        // Heartbeats carry the agents' consent to injected faults.
        tokio::time::sleep(Duration::from_secs(2)).await;

        // A dry run names a target and the expected timeline; nothing is injected or stored.
        let out = up.cli(&["drill", "run", "--fault", "daemon-exit", "--dry-run", "-o", "json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(plan["targets"].as_array().unwrap().len(), 1, "{plan}");
        assert!(plan["expected"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("detected")));
        assert!(admin.list_drills().await.unwrap().is_empty());
        assert!(admin.list_incidents().await.unwrap().is_empty());

        // Refusals, each with its reason.
        let out = up.cli(&["drill", "run", "--fault", "daemon-exit", "--hosts", "3"]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains("never strikes a pool's last healthy host"), "{}", stderr(&out));
        assert!(up.cli(&["drill", "switch", "off"]).status.success());
        let out = up.cli(&["drill", "run", "--fault", "daemon-exit"]);
        assert!(stderr(&out).contains("switched off cluster-wide"), "{}", stderr(&out));
        assert!(up.cli(&["drill", "switch", "on"]).status.success());

        // The drill itself. While its incident is open, another drill is refused, saying why.
        let out = up.cli(&["drill", "run", "--fault", "daemon-exit", "--no-wait", "-o", "json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let started: Drill = serde_json::from_slice(&out.stdout).unwrap();
        eventually(WAIT, "the drill's incident", || async {
            let list = admin.list_incidents().await.ok()?;
            list.iter().any(|i| i.incident.drill.as_deref() == Some(started.id.as_str())).then_some(())
        })
        .await;
        let out = up.cli(&["drill", "run", "--fault", "daemon-hang"]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains("is open in pool default"), "{}", stderr(&out));
        let d = eventually(WAIT, "the drill's verdict", || async {
            let d = admin.describe_drill(&started.id).await.ok()?;
            (d.status == DrillStatus::Ended).then_some(d)
        })
        .await;
        let out = up.cli(&["drill", "describe", &d.id, "-o", "json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let described: Drill = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(described, d);
        assert_eq!(d.status, DrillStatus::Ended);
        assert_eq!(d.verdict, Some(DrillVerdict::WithinBounds), "{d:#?}");
        assert_eq!(d.incidents.len(), 1, "{d:#?}");
        // The incident is the drill's, and its record agrees with what the drill reports.
        let i = admin.describe_incident(&d.incidents[0]).await.unwrap();
        assert_eq!(i.incident.drill.as_deref(), Some(d.id.as_str()));
        assert_eq!(i.incident.host_id, d.targets[0].host_id);
        assert_eq!(i.judgement, d.phases, "the drill reports the incident's own judgement");
        let stated = admin.explain_pool("default").await.unwrap().bounds;
        let row = stated.of(FailureKind::DaemonExit).unwrap();
        assert_eq!(d.bounds.detect_ms, row.detect_ms);
        for j in &d.phases {
            if let (Some(m), Some(b)) = (j.measured_ms, j.bound_ms) {
                assert!(m <= b, "{j:?}");
            }
        }
        let t = i.timing;
        assert!(t.total_ms.is_some(), "the replicas ran again: {t:?}");
        // The replicas run again, none on the daemon that was struck.
        let after = running().await;
        let struck = d.targets[0].gpu_id.clone().unwrap();
        assert!(after.iter().all(|t| !t.gpu_ids.contains(&struck) || !before.iter().any(|b| b.id == t.id)));
        // A second drill while the first's incident is open would be refused; it is resolved
        // now, and the pool's events tell the story.
        let pool = admin.describe_pool("default").await.unwrap();
        let reasons: Vec<&str> = pool.events.iter().map(|e| e.event.reason.as_str()).collect();
        assert!(reasons.contains(&"DrillStarted") && reasons.contains(&"DrillEnded"), "{reasons:?}");
        let listed = up.cli(&["drill", "list"]);
        assert!(String::from_utf8_lossy(&listed.stdout).contains(&d.id));
    });
    drop(up);
}

/// In a self-managed pool a drill measures detection and notification, never does the
/// operator's part, and takes its fault back itself: the host ends as it was (ACTIVE, healthy,
/// not cordoned) and the incident, marked as the drill's, resolves by itself.
#[test]
fn a_self_managed_drill_leaves_the_host_as_it_was() {
    if mps_control().is_none() {
        eprintln!("skipped: the real nvidia-cuda-mps-control is not installed (bash scripts/install-mps.sh)");
        assert!(!on_ci(), "CI installs the MPS daemon");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start_with(dir.path(), &dir.path().join("data"), 2, &["--mode", "self-managed"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let admin = &up.admin;
        let hosts = eventually(WAIT, "two ACTIVE, healthy hosts", || async {
            let hs = admin.list_hosts(None).await.ok()?;
            (hs.len() == 2
                && hs.iter().all(|h| h.status == HostStatus::Active && h.health_status == HealthStatus::Ok))
            .then_some(hs)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let out = up.cli(&["drill", "run", "--fault", "gpu-check-fail", "-o", "json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let d: Drill = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(d.owner, "operator");
        assert_eq!(d.verdict, Some(DrillVerdict::WithinBounds), "{d:#?}");
        let notified = d.notified_at_ms.expect("the notification is recorded");
        let i = admin.describe_incident(&d.incidents[0]).await.unwrap();
        assert_eq!(i.incident.drill.as_deref(), Some(d.id.as_str()));
        assert_eq!(notified, i.incident.opened_at_ms, "notified when the incident opened");
        assert!(i.incident.trigger.reason.contains("injected by drill"), "{:?}", i.incident.trigger);
        // Detection measured, the operator's phases not bounded.
        let detect = d.phases.iter().find(|j| j.phase == RecoveryPhase::Detect).unwrap();
        assert!(detect.measured_ms.unwrap() <= detect.bound_ms.unwrap(), "{detect:?}");
        assert!(d.phases.iter().filter(|j| j.phase != RecoveryPhase::Detect).all(|j| j.bound_ms.is_none()));
        // As it was: the same hosts, ACTIVE, healthy, not cordoned; the incident resolved.
        let target = d.targets[0].host_id.clone();
        eventually(WAIT, "the incident resolved by itself", || async {
            let i = admin.describe_incident(&d.incidents[0]).await.ok()?;
            (i.incident.state == IncidentState::Resolved).then_some(())
        })
        .await;
        let h = admin.describe_host(target.as_str()).await.unwrap();
        assert_eq!((h.status, h.health_status, h.cordoned), (HostStatus::Active, HealthStatus::Ok, false));
        assert_eq!(admin.list_hosts(None).await.unwrap().len(), hosts.len(), "nothing replaced");
        assert!(!i.incident.has(Step::Decided), "the drill never does the operator's part");
    });
    drop(up);
}
