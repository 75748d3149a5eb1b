//! DAEMON services against the real cluster, in virtual time, with simulated agents: one task
//! per ACTIVE host, following hosts as they join and drain, replaced in place by a
//! deployment; never two live tasks of the service on one host.

use super::recovery_tests::World;
use super::service_tests::{agents, world};
use super::*;
use mpsfleet_types::incident::OperatorAction;
use mpsfleet_types::service::{DeploymentConfiguration, RolloutState, SchedulingStrategy};

/// Creates the DAEMON service; the controllers' pass that the request wakes follows.
fn daemon(w: &mut World) -> Result<ServiceView, Error> {
    let view = w.c.create_service(CreateService {
        name: "agent".into(),
        pool: "p".into(),
        task_definition: "app:1".into(),
        scheduling_strategy: Some(SchedulingStrategy::Daemon),
        ..Default::default()
    });
    w.c.run_work();
    view
}

/// The service's live tasks by host: (host, task definition revision) pairs.
fn live_by_host(c: &Cluster) -> BTreeMap<HostId, Vec<u32>> {
    let name = ServiceName::new("agent").unwrap();
    let mut out: BTreeMap<HostId, Vec<u32>> = BTreeMap::new();
    for id in c.state.tasks().of_service(&name) {
        let t = &c.state.tasks().get(id).unwrap().task;
        if t.desired_status != TaskStatus::Stopped {
            out.entry(t.host_id.clone().expect("a daemon task is placed on its host"))
                .or_default()
                .push(t.task_definition.revision);
        }
    }
    out
}

fn one_per_host(c: &Cluster) {
    let by_host = live_by_host(c);
    assert!(by_host.values().all(|v| v.len() == 1), "two live tasks on a host: {by_host:?}");
}

#[test]
fn a_daemon_runs_one_task_per_active_host_and_follows_the_hosts() {
    let (mut w, mut hosts) = world(3);
    hosts.sort();
    let v = daemon(&mut w).unwrap();
    assert_eq!(v.service.desired_count, 3);
    agents(&mut w, |_| false, &mut |c| one_per_host(c));
    let by_host = live_by_host(&w.c);
    assert_eq!(by_host.keys().cloned().collect::<Vec<_>>(), hosts);
    let v = w.c.read().service("agent").unwrap();
    assert_eq!((v.service.desired_count, v.running_count, v.healthy_count), (3, 3, 3));
    assert_eq!(v.service.deployments[0].rollout_state, RolloutState::Completed);

    // A host joins: it gets a task; nothing else moves.
    let join = w.join_token.clone();
    let fourth = w.join("h3", &join).unwrap();
    w.c.run_work();
    agents(&mut w, |_| false, &mut |c| one_per_host(c));
    assert_eq!(live_by_host(&w.c).len(), 4);
    assert!(live_by_host(&w.c).contains_key(&fourth));
    assert_eq!(w.c.read().service("agent").unwrap().service.desired_count, 4);

    // A host drains: its task stops and starts nowhere else.
    w.c.operator_action(hosts[0].as_str(), OperatorAction::Drain, "test").unwrap();
    w.c.run_work();
    agents(&mut w, |_| false, &mut |c| one_per_host(c));
    let by_host = live_by_host(&w.c);
    assert!(!by_host.contains_key(&hosts[0]), "{by_host:?}");
    assert_eq!(by_host.len(), 3);
    let v = w.c.read().service("agent").unwrap();
    assert_eq!((v.service.desired_count, v.running_count), (3, 3));
}

#[test]
fn a_daemon_deployment_replaces_each_hosts_task_in_place() {
    let (mut w, _) = world(4);
    daemon(&mut w).unwrap();
    agents(&mut w, |_| false, &mut |c| one_per_host(c));
    let req = UpdateService { task_definition: Some("app:2".into()), ..Default::default() };
    w.c.update_service("agent", req).unwrap();
    w.c.run_work();
    agents(&mut w, |_| false, &mut |c| one_per_host(c));
    let by_host = live_by_host(&w.c);
    assert_eq!(by_host.len(), 4);
    assert!(by_host.values().all(|v| v == &[2]), "{by_host:?}");
    let v = w.c.read().service("agent").unwrap();
    assert_eq!(v.service.deployments[0].rollout_state, RolloutState::Completed);
    assert!(v.service.events.iter().any(|e| e.reason == "TasksReplaced"), "{:#?}", v.service.events);
}

#[test]
fn a_daemon_refuses_a_count_and_a_surge() {
    let (mut w, _) = world(1);
    let mut req = CreateService {
        name: "agent".into(),
        pool: "p".into(),
        task_definition: "app:1".into(),
        scheduling_strategy: Some(SchedulingStrategy::Daemon),
        desired_count: 2,
        ..Default::default()
    };
    let e = w.c.create_service(req.clone()).unwrap_err().to_string();
    w.c.run_work();
    assert!(e.contains("desiredCount") && e.contains("ACTIVE host"), "{e}");
    req.desired_count = 0;
    req.deployment_configuration = Some(DeploymentConfiguration::default());
    let e = w.c.create_service(req.clone()).unwrap_err().to_string();
    w.c.run_work();
    assert!(e.contains("maximumPercent") && e.contains("100"), "{e}");
    daemon(&mut w).unwrap();
    let e = w.c.update_service("agent", UpdateService { desired_count: Some(3), ..Default::default() });
    w.c.run_work();
    assert!(e.unwrap_err().to_string().contains("desiredCount"));
    // Deleted: every task stops and the record goes.
    agents(&mut w, |_| false, &mut |_| {});
    w.c.delete_service("agent").unwrap();
    w.c.run_work();
    agents(&mut w, |_| false, &mut |_| {});
    w.c.run_work();
    assert!(w.c.read().service("agent").is_err());
}
