//! Deleting pools, deregistering and deleting task definitions, tags, a task run's labels and
//! overrides, StartTask's placement on one host, and the conformance reset.

use super::catalog::Tagged;
use super::recovery_tests::World;
use super::*;
use mpsfleet_types::labels::{ContainerOverride, Tag, TaskOverride};

fn world() -> World {
    let mut w = World::new(OwnershipMode::SelfManaged);
    let td = br#"{"family": "app", "containerDefinitions": [{"name": "main", "image": "x", "command": ["sleep", "1"],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]}"#;
    w.c.register_taskdef(td).unwrap();
    w
}

fn run(pool: &str) -> RunTask {
    RunTask { task_definition: "app".into(), count: 1, pool: pool.into(), ..Default::default() }
}

fn tag(k: &str, v: &str) -> Tag {
    Tag { key: k.into(), value: v.into() }
}

#[test]
fn only_an_empty_pool_is_deleted_and_its_stopped_tasks_go_with_it() {
    let mut w = world();
    w.c.create_pool(CreatePool { name: "q".into(), ..Default::default() }).unwrap();
    let t = w.c.run_tasks(run("q")).unwrap().tasks[0].id.to_string();
    let n = w.c.read().pool_contents("q").unwrap();
    assert_eq!((n.hosts, n.services, n.pending, n.running, n.live_tasks()), (0, 0, 1, 0, 1));
    let e = w.c.delete_pool("q").unwrap_err();
    assert!(matches!(e, Error::Conflict(ref m) if m.contains("not stopped")), "{e}");
    w.c.stop_task(&t, None).unwrap();
    assert_eq!(w.c.read().pool_contents("q").unwrap().live_tasks(), 0, "a stopped task is not in the count");
    w.c.delete_pool("q").unwrap();
    assert!(w.c.read().pool("q").is_err() && w.c.read().task(&t).is_err());
    assert!(matches!(w.c.read().pool_contents("q"), Err(Error::NotFound { kind: "pool", .. })));
    // A pool with a host stays.
    let join = w.join_token.clone();
    w.join("h1", &join).unwrap();
    let e = w.c.delete_pool("p").unwrap_err();
    assert!(matches!(e, Error::Conflict(ref m) if m.contains("host")), "{e}");
}

#[test]
fn a_deleted_pool_stays_discoverable_for_an_hour_until_created_again_across_restarts() {
    let mut w = world();
    let names = |c: &Cluster| c.read().deleted_pools().map(|p| p.name.to_string()).collect::<Vec<_>>();
    for n in ["q", "r"] {
        w.c.create_pool(CreatePool { name: n.into(), ..Default::default() }).unwrap();
        w.c.delete_pool(n).unwrap();
    }
    assert_eq!(names(&w.c), ["q", "r"]);
    w.c.create_pool(CreatePool { name: "q".into(), ..Default::default() }).unwrap();
    assert_eq!(names(&w.c), ["r"], "a pool created again is no longer a deleted one");
    // Kept in the store: a restarted server (or the next leader) knows them.
    let store = w.c.store.clone();
    let again = Cluster::load(store.clone(), w.clock.clone(), |_| Ok(())).unwrap();
    assert_eq!(names(&again), ["r"]);
    w.advance(deleted::KEPT_MS + 1);
    assert!(names(&w.c).is_empty());
    // The retention pass removes the records themselves.
    assert_eq!(store.list(deleted::DELETED).unwrap().len(), 2);
    w.c.run_retention().unwrap();
    assert!(store.list(deleted::DELETED).unwrap().is_empty());
}

#[test]
fn deleted_services_are_kept_in_the_store_their_name_free_at_once_and_bounded() {
    let mut w = world();
    let svc = |name: &str| CreateService {
        name: name.into(),
        pool: "p".into(),
        task_definition: "app".into(),
        desired_count: 0,
        ..Default::default()
    };
    w.c.create_service(svc("web")).unwrap();
    w.c.run_work();
    w.c.delete_service("web").unwrap();
    w.c.run_work();
    assert!(w.c.read().service("web").is_err(), "no task left: the record goes at once");
    let kept: Vec<String> = w.c.read().deleted_services("p").map(|(s, _)| s.name.to_string()).collect();
    assert_eq!(kept, ["web"]);
    // The name is free again at once, and the deleted one is still kept beside the new one.
    w.c.create_service(svc("web")).unwrap();
    w.c.run_work();
    assert_eq!(w.c.read().deleted_services("p").count(), 1);
    let again = Cluster::load(w.c.store.clone(), w.clock.clone(), |_| Ok(())).unwrap();
    assert_eq!(again.read().deleted_services("p").count(), 1, "a restart keeps it");
    assert!(again.read().service("web").is_ok());
    // At most KEPT_PER_KIND of a kind: the oldest go in the commit of a new one.
    for i in 0..deleted::KEPT_PER_KIND {
        let name = format!("s{i}");
        w.advance(1);
        w.c.create_service(svc(&name)).unwrap();
        w.c.run_work();
        w.c.delete_service(&name).unwrap();
        w.c.run_work();
    }
    let kept: Vec<String> = w.c.read().deleted_services("p").map(|(s, _)| s.name.to_string()).collect();
    assert_eq!(kept.len(), deleted::KEPT_PER_KIND);
    assert_eq!(kept[0], "s0", "the first deleted, web, went: {kept:?}");
    assert_eq!(w.c.store.list(deleted::DELETED).unwrap().len(), deleted::KEPT_PER_KIND);
}

#[test]
fn a_deregistered_revision_starts_nothing_and_only_it_can_be_deleted() {
    let mut w = world();
    w.c.register_taskdef(br#"{"family": "app", "containerDefinitions": [{"name": "main", "image": "y"}]}"#)
        .unwrap();
    w.c.deregister_taskdef("app:2").unwrap();
    // The family alone names the newest revision still registered.
    assert_eq!(w.c.read().taskdef("t", "app").unwrap().revision, 1);
    let e = w.c.run_tasks(RunTask { task_definition: "app:2".into(), ..run("p") }).unwrap_err();
    assert!(e.to_string().contains("deregistered"), "{e}");
    let out = w.c.delete_taskdefs(&["app:1".into(), "app:2".into(), "nope:1".into()]).unwrap();
    assert!(out[0].as_ref().unwrap_err().contains("ACTIVE"));
    assert_eq!(out[1].as_ref().unwrap().revision, 2);
    assert!(out[2].as_ref().unwrap_err().contains("does not exist"));
    assert!(w.c.read().taskdef("t", "app:2").is_err());
    // The next revision still follows the newest ever made.
    let again =
        w.c.register_taskdef(br#"{"family": "app", "containerDefinitions": [{"name": "m", "image": "z"}]}"#);
    assert_eq!(again.unwrap().task_definition.revision, 2, "a deleted revision's number is free again");
}

#[test]
fn tags_merge_new_first_are_removed_by_key_and_are_checked() {
    let mut w = world();
    let pool = Tagged::Pool("p".into());
    assert_eq!(w.c.retag(&pool, &[tag("a", "1"), tag("b", "2")], &[]).unwrap().len(), 2);
    let tags = w.c.retag(&pool, &[tag("b", "3")], &["a".into()]).unwrap();
    assert_eq!(tags, vec![tag("b", "3")]);
    assert_eq!(w.c.read().pool("p").unwrap().tags, tags, "committed");
    let many: Vec<Tag> = (0..51).map(|i| tag(&format!("k{i}"), "")).collect();
    assert!(w.c.retag(&pool, &many, &[]).is_err());
    let td = Tagged::TaskDef("app:1".into());
    w.c.retag(&td, &[tag("team", "ml")], &[]).unwrap();
    assert_eq!(w.c.tags_of(&td).unwrap(), vec![tag("team", "ml")]);
    assert!(w.c.tags_of(&Tagged::Task("t-0000000000000009".into())).is_err());
}

#[test]
fn a_run_keeps_its_labels_and_overrides_and_refuses_bad_ones() {
    let mut w = world();
    let overrides = TaskOverride {
        container_overrides: vec![ContainerOverride {
            name: "main".into(),
            command: Some(vec!["echo".into(), "hi".into()]),
            ..Default::default()
        }],
    };
    let req = RunTask {
        overrides: Some(overrides.clone()),
        started_by: Some("nightly".into()),
        group: Some("batch".into()),
        tags: vec![tag("k", "v")],
        ..run("p")
    };
    let t = w.c.run_tasks(req).unwrap().tasks.remove(0);
    let t = w.c.read().task(&t.id.to_string()).unwrap();
    let labels = t.labels.as_deref().expect("the run's labels");
    assert_eq!(labels.overrides, Some(overrides));
    assert_eq!((labels.started_by.as_deref(), labels.group.as_deref()), (Some("nightly"), Some("batch")));
    assert_eq!(t.tags(), [tag("k", "v")]);
    // A run without any keeps none: a task record holds one pointer for them.
    assert!(w.c.run_tasks(run("p")).unwrap().tasks[0].labels.is_none());
    let bad = TaskOverride {
        container_overrides: vec![ContainerOverride { name: "sidecar".into(), ..Default::default() }],
    };
    let e = w.c.run_tasks(RunTask { overrides: Some(bad), ..run("p") }).unwrap_err();
    assert!(
        matches!(e, Error::InvalidParameter { ref field, .. } if field.contains("containerOverrides")),
        "{e}"
    );
    let e = w.c.run_tasks(RunTask { started_by: Some("x".repeat(129)), ..run("p") }).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { ref field, .. } if field == "startedBy"), "{e}");
}

#[test]
fn start_task_places_on_the_named_host_or_says_why_not() {
    let mut w = world();
    let join = w.join_token.clone();
    let a = w.join("a", &join).unwrap();
    let b = w.join("b", &join).unwrap();
    for host in [&b, &b, &a] {
        let t = w.c.start_task_on(&run("p"), host.as_str()).unwrap().unwrap();
        assert_eq!(t.host_id.as_ref(), Some(host), "placed on the host named, not by the strategy");
    }
    let big =
        br#"{"family": "big", "containerDefinitions": [{"name": "m", "image": "x", "command": ["sleep", "1"],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 143000}}}]}]}"#;
    w.c.register_taskdef(big).unwrap();
    let req = RunTask { task_definition: "big".into(), ..run("p") };
    let before = w.c.tasks(&TaskFilter { limit: usize::MAX, ..Default::default() }).len();
    let why = w.c.start_task_on(&req, b.as_str()).unwrap().unwrap_err();
    assert_eq!(why.code(), PendingCode::InsufficientGpuMemory, "{why}");
    assert_eq!(
        w.c.tasks(&TaskFilter { limit: usize::MAX, ..Default::default() }).len(),
        before,
        "nothing made"
    );
    // Host a still has room: the other host's placement was not disturbed by the refusal.
    assert!(w.c.start_task_on(&req, a.as_str()).unwrap().is_err(), "a holds one task already");
    assert!(matches!(w.c.start_task_on(&run("p"), "h-nope"), Err(Error::NotFound { .. })));
}

#[test]
fn the_conformance_reset_empties_what_the_ecs_api_shows() {
    let mut w = world();
    w.c.run_tasks(run("p")).unwrap();
    w.c.create_pool(CreatePool { name: "q".into(), ..Default::default() }).unwrap();
    w.c.delete_pool("q").unwrap();
    w.c.empty_for_conformance().unwrap();
    assert!(w.c.read().pools().is_empty() && w.c.read().taskdefs(None).is_empty());
    assert_eq!(w.c.read().deleted_pools().count(), 0, "nor the pools deleted before");
    assert!(w.c.tasks(&TaskFilter { limit: usize::MAX, ..Default::default() }).is_empty());
    w.c.create_pool(CreatePool { name: "p".into(), ..Default::default() }).unwrap();
}
