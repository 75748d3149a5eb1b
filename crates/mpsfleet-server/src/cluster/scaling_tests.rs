//! Managed scaling against the real cluster in virtual time: launched machines join with
//! their launch tokens, a burst of waiting MPS tasks grows the pool in one step to what it
//! needs, and once the work is gone and the quiet time has passed the pool shrinks to its
//! minimum, removing only hosts without work.

use super::recovery_tests::World;
use super::service_tests::report;
use super::*;
use mpsfleet_core::scaling::{pack, Shape};
use mpsfleet_types::policy::{HostShape, Provider};
use mpsfleet_types::scaling::ManagedScaling;

const GPU_MIB: u64 = 143_771;

/// A managed pool of one host scaling between 1 and 10 hosts of one H200.
fn scaling_pool() -> (World, Vec<HostId>) {
    let mut w = World::new(OwnershipMode::Managed);
    let provider = Provider {
        host_shape: Some(HostShape {
            gpus: 1,
            gpu_memory_mib: GPU_MIB,
            max_mps_clients: 48,
            cpu: None,
            memory_mib: None,
        }),
        managed_scaling: Some(ManagedScaling {
            min_hosts: 1,
            max_hosts: 10,
            scale_in_after_seconds: 60,
            ..Default::default()
        }),
        ..Provider::local(1)
    };
    w.c.update_pool("p", UpdatePool { provider: Some(provider), ..Default::default() }).unwrap();
    let mut hosts = Vec::new();
    boot(&mut w, &mut hosts, 2);
    assert_eq!(hosts.len(), 1, "the pool starts at its minimum");
    for td in [("m40", 40_000), ("m70", 70_000)] {
        let body = format!(
            r#"{{"family": "{}", "containerDefinitions": [{{"name": "c", "command": ["sleep", "3600"],
                "resourceRequirements": [{{"type": "GPU", "sharingStrategy": {{"nvidiaMps": {{"memory": {}}}}}}}]}}]}}"#,
            td.0, td.1
        );
        w.c.register_taskdef(body.as_bytes()).unwrap();
    }
    (w, hosts)
}

/// Runs `secs` seconds with heartbeats; every launch the provider is asked for boots and
/// joins with its token (added to `hosts`). Returns the jobs seen.
fn boot(w: &mut World, hosts: &mut Vec<HostId>, secs: u64) -> Vec<ProviderJob> {
    let mut seen = Vec::new();
    for _ in 0..secs {
        let beats: Vec<(HostId, HealthStatus)> = hosts
            .iter()
            .filter(|h| w.c.read().host(h.as_str()).is_ok_and(|v| v.status != HostStatus::Deregistered))
            .map(|h| (h.clone(), HealthStatus::Ok))
            .collect();
        let jobs = w.run(1, &beats, |_| ProviderOutcome::Done);
        for j in &jobs {
            if let ProviderJob::Launch { name, token: Some(t), .. } = j {
                hosts.push(w.join(name, &t.0).unwrap());
            }
        }
        seen.extend(jobs);
    }
    seen
}

fn run(w: &mut World, family: &str, count: u32) -> Vec<Task> {
    let req = RunTask { task_definition: family.into(), count, pool: "p".into(), ..Default::default() };
    w.c.run_tasks(req).unwrap().tasks
}

fn scaled(w: &World, reason: &str) -> usize {
    w.c.read().pool("p").unwrap().events.iter().filter(|e| e.reason == reason).count()
}

#[test]
fn a_burst_grows_the_pool_in_one_step_and_the_quiet_pool_shrinks_without_touching_work() {
    let (mut w, mut hosts) = scaling_pool();
    let mut tasks = run(&mut w, "m40", 12);
    tasks.extend(run(&mut w, "m70", 6));
    let waiting: Vec<GpuDemand> = tasks
        .iter()
        .filter(|t| t.host_id.is_none())
        .map(|t| w.c.read().taskdef("taskDefinition", &t.task_definition.to_string()).unwrap().gpu_demand())
        .collect();
    let shape = Shape {
        gpus: 1,
        gpu_memory_mib: GPU_MIB,
        max_clients: 48,
        compute_bound: None,
        cpu: None,
        memory_mib: None,
    };
    let needed = pack(&shape, &waiting).hosts;
    assert!(needed >= 2, "{} waiting need {needed} more hosts", waiting.len());

    let jobs = boot(&mut w, &mut hosts, 15);
    let launches = jobs.iter().filter(|j| matches!(j, ProviderJob::Launch { .. })).count();
    assert_eq!(launches as u32, needed, "one step sized to the burst");
    assert_eq!(scaled(&w, "ScaledOut"), 1, "{:#?}", w.c.read().pool("p").unwrap().events);
    let all = w.c.tasks(&TaskFilter { limit: usize::MAX, ..Default::default() });
    assert!(all.iter().all(|t| t.host_id.is_some()), "every task placed");
    let (_, why) = w.c.last_scaling_decision(&PoolName::new("p").unwrap()).unwrap();
    assert!(why.contains("reservation"), "{why}");
    let launches = w.c.explain_pool("p").unwrap().measured_launches.unwrap();
    assert!(launches.contains(&format!("the latest {} launch(es)", needed + 1)), "{launches}");
    assert!(launches.contains("launchTimeoutSeconds 60"), "{launches}");

    // Everything but one task stops; the quiet time passes: back down, never the busy host.
    let keep = all[0].clone();
    for t in &all[1..] {
        w.c.stop_task(&t.id.to_string(), None).unwrap();
        w.c.report_task(t.host_id.as_ref().unwrap(), &t.id.to_string(), report(TaskStatus::Stopped)).unwrap();
    }
    let jobs = boot(&mut w, &mut hosts, 50);
    assert!(!jobs.iter().any(|j| matches!(j, ProviderJob::Terminate { .. })), "not before the quiet time");
    let jobs = boot(&mut w, &mut hosts, 30);
    let terminated: Vec<&String> = jobs
        .iter()
        .filter_map(|j| match j {
            ProviderJob::Terminate { incident, name, .. } if incident.is_empty() => Some(name),
            _ => None,
        })
        .collect();
    assert_eq!(terminated.len() as u32, needed, "{terminated:?}");
    let live: Vec<HostView> =
        w.c.read().hosts(None).into_iter().filter(|h| h.status != HostStatus::Deregistered).collect();
    assert_eq!(live.len(), 1, "back to one host");
    assert_eq!(Some(&live[0].id), keep.host_id.as_ref(), "the host with work stays");
    assert!(scaled(&w, "ScaledIn") >= 1);
    assert_eq!(w.c.read().pool("p").unwrap().provider.unwrap().desired_hosts, 1);
}

#[test]
fn a_task_no_host_shape_holds_is_refused_and_scales_nothing() {
    let (mut w, mut hosts) = scaling_pool();
    let body = br#"{"family": "huge", "containerDefinitions": [{"name": "c", "command": ["sleep", "1"],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 200000}}}]}]}"#;
    w.c.register_taskdef(body).unwrap();
    let req = RunTask { task_definition: "huge".into(), count: 1, pool: "p".into(), ..Default::default() };
    let e = w.c.run_tasks(req).unwrap_err().to_string();
    assert!(e.contains("can never be placed"), "{e}");
    let jobs = boot(&mut w, &mut hosts, 15);
    assert!(!jobs.iter().any(|j| matches!(j, ProviderJob::Launch { .. })), "{jobs:?}");
}

#[test]
fn a_pool_with_scaling_needs_a_host_shape() {
    let mut w = World::new(OwnershipMode::Managed);
    let provider = Provider { managed_scaling: Some(ManagedScaling::default()), ..Provider::local(1) };
    let e = w.c.update_pool("p", UpdatePool { provider: Some(provider), ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("provider.hostShape"), "{e}");
}

#[test]
fn a_capacity_provider_put_on_a_pool_sets_its_scaling_and_follows_updates() {
    use super::capacity_providers::CapacityProvider;
    let (mut w, _) = scaling_pool();
    let cp = CapacityProvider {
        name: "gpu".into(),
        auto_scaling_group_arn: "arn:aws:autoscaling:asg".into(),
        managed_scaling: ManagedScaling {
            target_capacity: 80,
            maximum_scaling_step_size: 3,
            ..Default::default()
        },
        managed_termination_protection: "DISABLED".into(),
        tags: Vec::new(),
        created_at_ms: 0,
    };
    w.c.create_capacity_provider(cp).unwrap();
    let e = w.c.put_pool_capacity_providers("p", &["nope".into()]).unwrap_err().to_string();
    assert!(e.contains("capacityProviders") && e.contains("nope"), "{e}");
    w.c.put_pool_capacity_providers("p", &["gpu".into()]).unwrap();
    let s = w.c.read().pool("p").unwrap().provider.unwrap().managed_scaling.unwrap();
    // ECS's fields from the capacity provider, the host bounds kept from the pool.
    assert_eq!((s.target_capacity, s.maximum_scaling_step_size, s.min_hosts, s.max_hosts), (80, 3, 1, 10));
    let updated = ManagedScaling { target_capacity: 60, ..s };
    w.c.update_capacity_provider("gpu", updated).unwrap();
    assert_eq!(w.c.read().pool("p").unwrap().provider.unwrap().managed_scaling.unwrap().target_capacity, 60);
    let e = w.c.delete_capacity_provider("gpu").unwrap_err().to_string();
    assert!(e.contains("used by pool p"), "{e}");
    w.c.put_pool_capacity_providers("p", &[]).unwrap();
    w.c.delete_capacity_provider("gpu").unwrap();
    // A pool without a provider cannot take one.
    w.c.create_pool(CreatePool {
        name: "bare".into(),
        mode: Some(OwnershipMode::SelfManaged),
        ..Default::default()
    })
    .unwrap();
    w.c.create_capacity_provider(CapacityProvider {
        name: "gpu2".into(),
        auto_scaling_group_arn: "a".into(),
        managed_scaling: ManagedScaling::default(),
        managed_termination_protection: "DISABLED".into(),
        tags: Vec::new(),
        created_at_ms: 0,
    })
    .unwrap();
    let e = w.c.put_pool_capacity_providers("bare", &["gpu2".into()]).unwrap_err().to_string();
    assert!(e.contains("no provider"), "{e}");
}

#[test]
fn a_pool_at_its_most_hosts_says_so_in_the_waiting_tasks_reason() {
    let (mut w, mut hosts) = scaling_pool();
    let mut p = w.c.read().pool("p").unwrap().provider.unwrap();
    p.managed_scaling.as_mut().unwrap().max_hosts = 2;
    w.c.update_pool("p", UpdatePool { provider: Some(p), ..Default::default() }).unwrap();
    run(&mut w, "m70", 8);
    boot(&mut w, &mut hosts, 15);
    assert_eq!(hosts.len(), 2, "grown to maxHosts only");
    let waiting: Vec<String> =
        w.c.tasks(&TaskFilter { limit: usize::MAX, ..Default::default() })
            .into_iter()
            .filter(|t| t.host_id.is_none())
            .filter_map(|t| t.pending_reason)
            .collect();
    assert!(!waiting.is_empty() && waiting.iter().all(|r| r.contains("at its maxHosts (2)")), "{waiting:?}");
}

#[test]
fn a_task_waiting_for_hosts_being_launched_says_so_in_its_code() {
    let (mut w, hosts) = scaling_pool();
    run(&mut w, "m70", 6);
    // The launches are asked for and not answered: the machines are still booting.
    let beats: Vec<(HostId, HealthStatus)> = hosts.iter().map(|h| (h.clone(), HealthStatus::Ok)).collect();
    let jobs = w.run(12, &beats, |_| ProviderOutcome::Done);
    assert!(jobs.iter().any(|j| matches!(j, ProviderJob::Launch { .. })));
    let waiting: Vec<Task> =
        w.c.tasks(&TaskFilter { limit: usize::MAX, ..Default::default() })
            .into_iter()
            .filter(|t| t.host_id.is_none())
            .collect();
    assert!(!waiting.is_empty());
    for t in &waiting {
        assert_eq!(t.pending_code, Some(PendingCode::ScalingOut), "{:?}", t.pending_reason);
        assert!(
            t.pending_reason.as_deref().unwrap().contains("managed scaling is launching"),
            "{:?}",
            t.pending_reason
        );
    }
}
