use super::*;
use axum::extract::{Path as UrlPath, State as Shared};
use axum::routing::post;
use axum::{Json, Router};
use mpsfleet_core::clock::SystemClock;
use std::sync::Mutex;

type Seen = Arc<Mutex<Vec<(String, TaskStateReport)>>>;

/// A server that takes every task report and answers with `task`.
fn fake_server(rt: &tokio::runtime::Runtime, task: Task) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/v1/agent/tasks/{id}/status",
            post(
                |Shared((seen, task)): Shared<(Seen, Task)>,
                 UrlPath(id): UrlPath<String>,
                 Json(r): Json<TaskStateReport>| async move {
                    seen.lock().unwrap().push((id, r));
                    Json(task)
                },
            ),
        )
        .with_state((seen.clone(), task));
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn assignment(id: TaskId) -> Assignments {
    let def: TaskDefinition = serde_json::from_value(serde_json::json!({
        "family": "app", "revision": 1,
        "containerDefinitions": [{"name": "app", "essential": true, "command": ["sleep", "60"]}],
    }))
    .unwrap();
    let mut task = Task::new(id, def.reference(), PoolName::new("gpu").unwrap(), None, "run:test".into(), 0);
    task.host_id = Some(HostId::new("h-1").unwrap());
    Assignments { revision: 1, tasks: vec![task], task_definitions: vec![def], allow_task_users: false }
}

fn panicking_launch(
    _: &Engine,
    _: &Record,
    _: &ContainerDefinition,
    _: Option<(String, Option<Arc<Supervisor>>)>,
    _: &Path,
) -> Result<Handle, (StopCode, String)> {
    panic!("injected launch fault")
}

#[test]
fn a_panicking_launch_worker_stops_the_task_and_reports_why() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let id = TaskId(7);
    let a = assignment(id);
    let (url, seen) = fake_server(&rt, a.tasks[0].clone());
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = channel();
    let mut state = State {
        view: TasksView::default(),
        dir: dir.path().to_path_buf(),
        runtime: Arc::new(Engine::Process(crate::runtime::Runtime::new(vec!["/bin/false".into()]).unwrap())),
        gpus: Gpus::default(),
        client: Client::new(&url, Some("cred".into())).unwrap(),
        handle: rt.handle().clone(),
        clock: Arc::new(SystemClock),
        tx,
        tasks: BTreeMap::new(),
        assignments: None,
        report_after_ms: 0,
        report_backoff: Backoff::new(TICK, REPORT_BACKOFF_MAX),
        launch: panicking_launch,
        users: TaskUsers::default(),
        last_uid: None,
    };
    state.handle_input(Input::Assignments(a));
    assert!(state.tasks[&id].busy, "the launch is on its worker");
    // The failed launch answers, then the stop of what the task has running (nothing).
    while state.tasks[&id].rec.status != TaskStatus::Stopped {
        let input = rx.recv_timeout(Duration::from_secs(10)).expect("the failed worker still answers");
        state.handle_input(input);
    }
    let rec = &state.tasks[&id].rec;
    assert_eq!(rec.status, TaskStatus::Stopped);
    assert_eq!(rec.stop_code, Some(StopCode::TaskFailedToStart));
    let reason = rec.reason.clone().unwrap();
    assert!(reason.contains("the launch worker panicked: injected launch fault"), "{reason}");
    // Written down before it is reported, then reported.
    let on_disk: Record = serde_json::from_slice(&std::fs::read(state.record_path(&id)).unwrap()).unwrap();
    assert_eq!(on_disk.status, TaskStatus::Stopped);
    state.report();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, id.to_string());
    assert_eq!(seen[0].1.last_status, TaskStatus::Stopped);
    assert_eq!(seen[0].1.stop_code, Some(StopCode::TaskFailedToStart));
    assert_eq!(seen[0].1.stopped_reason.as_deref(), Some(reason.as_str()));
    assert!(state.tasks[&id].rec.reported.is_some());
}

fn gpus(n: u32) -> Vec<GpuInventory> {
    (0..n)
        .map(|i| {
            serde_json::from_value(serde_json::json!({
                "uuid": format!("GPU-test-{i}"), "index": i, "model": "H200", "memoryMib": 143_771
            }))
            .unwrap()
        })
        .collect()
}

/// A PENDING record of task `id` on `gpu` with one process container: an MPS one when `mps`,
/// naming `user` when given.
fn record(id: u64, gpu: Option<&str>, mps: bool, user: Option<&str>) -> Record {
    let mut c = serde_json::json!({"name": "app", "essential": true, "command": ["sleep", "60"]});
    if mps {
        c["resourceRequirements"] =
            serde_json::json!([{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]);
    }
    if let Some(u) = user {
        c["user"] = u.into();
    }
    let def: TaskDefinition = serde_json::from_value(serde_json::json!({
        "family": "app", "revision": 1, "containerDefinitions": [c],
    }))
    .unwrap();
    let mut task =
        Task::new(TaskId(id), def.reference(), PoolName::new("gpu").unwrap(), None, "run:test".into(), 0);
    task.gpu_ids = gpu.map(|g| vec![GpuUuid::new(g).unwrap()]).unwrap_or_default();
    Record::new(task, def)
}

/// Picks for `rec` as [`State::choose_user`] does, then records the pick in `tasks` (as a
/// running task) when it is a task uid.
fn pick_and_hold(
    users: &TaskUsers,
    tasks: &mut BTreeMap<TaskId, Local>,
    last: &mut Option<u32>,
    mut rec: Record,
    host: &HostUids,
) -> Result<Pick, String> {
    let engine = Engine::Process(crate::runtime::Runtime::new(vec!["/bin/false".into()]).unwrap());
    let pick = pick_user(users, &engine, tasks, *last, &rec, true, host)?;
    let (uid, shared) = match pick {
        Pick::NoTaskUid => return Ok(pick),
        Pick::Own(uid) => {
            *last = Some(uid);
            (uid, false)
        }
        Pick::SharedMps(uid) => (uid, true),
    };
    rec.task_user = Some(TaskUser { uid, home: format!("/run/x/home/{}", rec.task.id).into() });
    rec.shared_uid = shared;
    rec.status = TaskStatus::Running;
    tasks.insert(rec.task.id, new_local(rec));
    Ok(pick)
}

#[test]
fn the_last_uids_of_the_range_are_kept_one_per_mps_daemon() {
    let range = UidRange { first: 100, last: 109 };
    let home = Some(PathBuf::from("/run/x/home"));
    let per_gpu = TaskUsers::new(range, home.clone(), &gpus(3), false).unwrap();
    let uids: Vec<(String, u32, String)> =
        per_gpu.mps.iter().map(|(g, m)| (g.to_string(), m.uid, m.daemon.clone())).collect();
    assert_eq!(
        uids,
        [
            ("GPU-test-0".to_string(), 109, "0".to_string()),
            ("GPU-test-1".to_string(), 108, "1".to_string()),
            ("GPU-test-2".to_string(), 107, "2".to_string())
        ]
    );
    assert_eq!(per_gpu.own_uids(), Some(UidRange { first: 100, last: 106 }));
    let per_host = TaskUsers::new(range, home.clone(), &gpus(3), true).unwrap();
    assert!(per_host.mps.values().all(|m| m.uid == 109 && m.daemon == "all"), "{:?}", per_host.mps);
    assert_eq!(per_host.own_uids(), Some(UidRange { first: 100, last: 108 }));
    let no_gpu = TaskUsers::new(range, home.clone(), &[], false).unwrap();
    assert_eq!((no_gpu.mps.len(), no_gpu.own_uids()), (0, Some(range)));
    // One uid per daemon and one more, or the agent does not start (whether root or not).
    let small = UidRange { first: 100, last: 102 };
    let err = TaskUsers::new(small, home.clone(), &gpus(3), false).unwrap_err();
    assert!(
        err.starts_with("--task-uid-range 100-102 holds 3 uids: the last 3 are kept for MPS tasks"),
        "{err}"
    );
    assert!(TaskUsers::new(small, None, &gpus(3), false).is_err());
    assert!(TaskUsers::new(small, home, &gpus(3), true).is_ok());
    let not_root = TaskUsers::new(range, None, &gpus(3), false).unwrap();
    assert!(not_root.range.is_none() && not_root.mps.is_empty());
}

#[test]
fn mps_tasks_of_one_gpu_share_its_uid_and_no_other_task_gets_it() {
    let users =
        TaskUsers::new(UidRange { first: 100, last: 103 }, Some("/run/x/home".into()), &gpus(2), false)
            .unwrap();
    // Every uid runs processes (the MPS tasks' among them): the shared uid is still handed out.
    let busy = HostUids { in_passwd: &|_| false, processes: &|| (0..1000).collect() };
    let free = HostUids { in_passwd: &|_| false, processes: &BTreeSet::new };
    let (mut tasks, mut last) = (BTreeMap::new(), None);
    let mut pick = |rec: Record, host: &HostUids| pick_and_hold(&users, &mut tasks, &mut last, rec, host);
    assert_eq!(pick(record(1, Some("GPU-test-0"), true, None), &busy), Ok(Pick::SharedMps(103)));
    assert_eq!(pick(record(2, Some("GPU-test-0"), true, None), &busy), Ok(Pick::SharedMps(103)));
    assert_eq!(pick(record(3, Some("GPU-test-1"), true, None), &busy), Ok(Pick::SharedMps(102)));
    // Non-MPS tasks (a GPU-less one, one whose process names its user) get uids of their own,
    // never the kept ones, even with the kept ones free of processes.
    assert_eq!(pick(record(4, None, false, None), &free), Ok(Pick::Own(100)));
    assert_eq!(pick(record(5, Some("GPU-test-1"), false, None), &free), Ok(Pick::Own(101)));
    let err = pick(record(6, None, false, None), &free).unwrap_err();
    assert_eq!(
        err,
        "no free uid in --task-uid-range 100-103 (2 tasks hold one; the others are in the password \
         database or run processes; the last 2 are kept for MPS tasks)"
    );
    // A definition's user keeps it; an MPS task on a GPU without a daemon here gets a uid of
    // its own (it then does not start), never none.
    assert_eq!(pick(record(7, Some("GPU-test-0"), true, Some("0")), &free), Ok(Pick::NoTaskUid));
    assert!(pick(record(8, Some("GPU-unknown"), true, None), &free).unwrap_err().starts_with("no free uid"));
    assert_eq!(tasks.values().filter(|l| l.rec.shared_uid).count(), 3);

    // A kept uid in the password database, or still held by a task as its own (adopted after
    // the range changed), is refused for MPS tasks, naming it.
    let passwd = HostUids { in_passwd: &|u| u == 102, processes: &BTreeSet::new };
    let err =
        pick_and_hold(&users, &mut tasks, &mut last, record(9, Some("GPU-test-1"), true, None), &passwd)
            .unwrap_err();
    assert!(
        err.starts_with("uid 102, kept in --task-uid-range 100-103 for the MPS tasks of GPU GPU-test-1, is in the password database"),
        "{err}"
    );
    let mut adopted = record(10, None, false, None);
    adopted.status = TaskStatus::Running;
    adopted.task_user = Some(TaskUser { uid: 103, home: "/run/x/home/10".into() });
    let mut tasks = BTreeMap::from([(adopted.task.id, new_local(adopted))]);
    let err = pick_and_hold(&users, &mut tasks, &mut last, record(11, Some("GPU-test-0"), true, None), &free)
        .unwrap_err();
    assert!(err.contains("is still held by task"), "{err}");
    // ... and once that task has stopped, the MPS task gets it.
    tasks.values_mut().for_each(|l| l.rec.status = TaskStatus::Stopped);
    assert_eq!(
        pick_and_hold(&users, &mut tasks, &mut last, record(12, Some("GPU-test-0"), true, None), &free),
        Ok(Pick::SharedMps(103))
    );
}

#[test]
fn the_record_says_whether_its_uid_is_shared() {
    let dir = tempfile::tempdir().unwrap();
    let mut rec = record(1, Some("GPU-test-0"), true, None);
    rec.status = TaskStatus::Stopped;
    rec.task_user = Some(TaskUser { uid: 103, home: dir.path().join("gone") });
    rec.shared_uid = true;
    let bytes = serde_json::to_vec(&rec).unwrap();
    let back: Record = serde_json::from_slice(&bytes).unwrap();
    assert!(back.shared_uid, "kept in the record");
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["sharedUid"], true);
    let mut own = record(2, None, false, None);
    own.task_user = Some(TaskUser { uid: 100, home: dir.path().join("x") });
    let v = serde_json::to_value(&own).unwrap();
    assert!(v.get("sharedUid").is_none(), "{v}");
}

#[test]
fn a_panicking_stop_worker_still_answers_with_lost_containers() {
    let (tx, rx) = channel();
    let id = TaskId(9);
    let failed = move |why: String| Input::Stopped {
        id,
        states: BTreeMap::from([("app".to_string(), ContainerState::Lost { reason: why })]),
    };
    spawn_worker(tx, "stop", || panic!("injected stop fault"), failed).unwrap_or_else(|_| panic!("spawned"));
    match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
        Input::Stopped { id: got, states } => {
            assert_eq!(got, id);
            assert_eq!(
                states["app"],
                ContainerState::Lost { reason: "the stop worker panicked: injected stop fault".into() }
            );
        }
        _ => panic!("expected a Stopped input"),
    }
}

#[test]
fn a_dead_task_loop_says_why() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (tx, rx) = channel();
    let mut dead = TaskLoop::spawn(tx, rx, |_| panic!("injected loop fault")).unwrap();
    let why =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), dead.died()).await }).unwrap();
    assert_eq!(why, "the task loop panicked: injected loop fault");
    let (tx, rx) = channel();
    let mut failed = TaskLoop::spawn(tx, rx, |_| Err("its input channel closed".into())).unwrap();
    let why =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), failed.died()).await }).unwrap();
    assert_eq!(why, "the task loop stopped: its input channel closed");
    // A loop that is shut down never reports a death.
    let (tx, rx) = channel();
    let mut fine = TaskLoop::spawn(tx, rx, |rx| {
        let _ = rx.recv();
        Ok(())
    })
    .unwrap();
    let died = fine.died();
    fine.shutdown(false);
    assert!(rt.block_on(async { tokio::time::timeout(Duration::from_millis(300), died).await }).is_err());
}
