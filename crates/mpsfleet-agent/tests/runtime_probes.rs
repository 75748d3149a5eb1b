//! Probe tests against real processes, a tiny HTTP server and real ports.

use mpsfleet_agent::runtime::probes::{
    run_probe, ContainerProbes, ProbeAction, ProbeEvent, ProbeKind, ProbeResult, ProbeRunner, ProbeSpec,
    ProbeTarget, Transition,
};
use mpsfleet_agent::runtime::ExecContext;
use mpsfleet_core::clock::SystemClock;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(60);

fn ctx(env: &[(&str, &str)]) -> ExecContext {
    ExecContext::new(&env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>(), None, None)
        .expect("context")
}

fn shell(script: &str) -> ProbeAction {
    ProbeAction::Exec { argv: vec!["/bin/sh".into(), "-c".into(), script.into()] }
}

fn probe(action: &ProbeAction, timeout: Duration) -> ProbeResult {
    run_probe(action, timeout, &ProbeTarget::Host(ctx(&[])), &SystemClock)
}

fn failure(r: ProbeResult) -> String {
    match r {
        ProbeResult::Failure(why) => why,
        ProbeResult::Success => panic!("expected a failure"),
    }
}

fn is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn runtime_exec_probe_pass_fail_and_env() {
    let t = Duration::from_secs(30);
    assert_eq!(probe(&shell("exit 0"), t), ProbeResult::Success);
    assert!(failure(probe(&shell("exit 2"), t)).contains("exited with status 2"));
    let missing = ProbeAction::Exec { argv: vec!["/no/such/probe".into()] };
    assert_eq!(failure(probe(&missing, t)), "no such file or directory: /no/such/probe");
    // The probe sees the task's environment, not the agent's.
    let check_env = shell("test \"$PROBE_VAR\" = yes && test -z \"$CARGO_MANIFEST_DIR\"");
    assert_eq!(
        run_probe(&check_env, t, &ProbeTarget::Host(ctx(&[("PROBE_VAR", "yes")])), &SystemClock),
        ProbeResult::Success
    );
    assert!(matches!(
        run_probe(&check_env, t, &ProbeTarget::Host(ctx(&[])), &SystemClock),
        ProbeResult::Failure(_)
    ));
}

#[test]
fn runtime_exec_probe_timeout_kills_the_probe_and_its_children() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pid_file = tmp.path().join("pid");
    let script = format!("sleep 1000 & echo $! > {}; wait", pid_file.display());
    let why = failure(probe(&shell(&script), Duration::from_millis(500)));
    assert!(why.contains("timed out after 500ms"), "{why}");
    // The probe may have timed out before it wrote the pid (a very loaded machine).
    if let Ok(pid) = fs::read_to_string(&pid_file) {
        let pid: u32 = pid.trim().parse().expect("pid");
        let mut waited = Duration::ZERO;
        while !is_dead(pid) {
            assert!(waited < PATIENCE, "the probe's child {pid} survived the timeout");
            thread::sleep(Duration::from_millis(20));
            waited += Duration::from_millis(20);
        }
    }
}

/// A tiny HTTP server: `/ok` 200, `/moved` 302, `/fail` 500, `/hang` never answers, anything
/// else garbage. Records the request heads it saw.
fn http_server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let log = log.clone();
            thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                log.lock().expect("lock").push(head);
                let response: &[u8] = match path.as_str() {
                    "/ok" => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                    "/moved" => b"HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 0\r\n\r\n",
                    "/fail" => b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
                    "/hang" => {
                        thread::sleep(Duration::from_secs(5));
                        return;
                    }
                    _ => b"SSH-2.0-not-http\r\n",
                };
                let _ = stream.write_all(response);
            });
        }
    });
    (port, seen)
}

fn http(port: u16, path: &str) -> ProbeAction {
    let cmd = vec!["HTTP-GET".to_string(), format!("http://127.0.0.1:{port}{path}")];
    ProbeAction::parse(&cmd).expect("url")
}

fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
    // dropped here: nothing listens on the port any more
}

#[test]
fn runtime_http_probe() {
    let (port, seen) = http_server();
    let t = Duration::from_secs(30);
    assert_eq!(probe(&http(port, "/ok"), t), ProbeResult::Success);
    assert_eq!(probe(&http(port, "/moved"), t), ProbeResult::Success);
    assert!(failure(probe(&http(port, "/fail"), t)).contains("returned status 500"));
    assert!(failure(probe(&http(port, "/garbage"), t)).contains("not an http status line"));
    let why = failure(probe(&http(port, "/hang"), Duration::from_millis(300)));
    assert!(why.contains("timed out"), "{why}");
    let why = failure(probe(&http(closed_port(), "/ok"), t));
    assert!(why.contains("cannot connect"), "{why}");
    let heads = seen.lock().expect("lock").clone();
    let ok = heads.iter().find(|h| h.starts_with("GET /ok HTTP/1.1\r\n")).expect("the /ok request");
    assert!(ok.contains(&format!("\r\nHost: 127.0.0.1:{port}\r\n")), "{ok}");
}

#[test]
fn runtime_tcp_probe() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let open = ProbeAction::parse(&["TCP-CONNECT".into(), format!("127.0.0.1:{port}")]).expect("addr");
    assert_eq!(probe(&open, Duration::from_secs(30)), ProbeResult::Success);
    drop(listener);
    let closed =
        ProbeAction::parse(&["TCP-CONNECT".into(), format!("127.0.0.1:{}", closed_port())]).expect("addr");
    assert!(failure(probe(&closed, Duration::from_secs(30))).contains("cannot connect"));
}

fn spec(kind: ProbeKind, action: ProbeAction, retries: u32, start_period: Duration) -> ProbeSpec {
    ProbeSpec {
        kind,
        action,
        interval: Duration::from_millis(20),
        timeout: Duration::from_secs(30),
        retries,
        start_period,
    }
}

fn start(probes: ContainerProbes, env: &[(&str, &str)]) -> (ProbeRunner, Receiver<ProbeEvent>) {
    let (tx, rx) = mpsc::channel();
    let runner =
        ProbeRunner::start("app", probes, ProbeTarget::Host(ctx(env)), Arc::new(SystemClock), move |e| {
            let _ = tx.send(e);
        })
        .expect("start");
    (runner, rx)
}

/// Receives events until `want` arrives; returns all transitions seen, in order.
fn until(rx: &Receiver<ProbeEvent>, want: impl Fn(&Transition) -> bool) -> Vec<Transition> {
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(PATIENCE) {
            Ok(e) => {
                assert_eq!(e.container, "app");
                let done = want(&e.transition);
                seen.push(e.transition);
                if done {
                    return seen;
                }
            }
            Err(_) => panic!("no matching event within {PATIENCE:?}; saw {seen:?}"),
        }
    }
}

fn count_lines(path: &Path) -> usize {
    fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

fn wait_lines(path: &Path, n: usize) {
    let mut waited = Duration::ZERO;
    while count_lines(path) < n {
        assert!(waited < PATIENCE, "fewer than {n} probe runs recorded in {}", path.display());
        thread::sleep(Duration::from_millis(20));
        waited += Duration::from_millis(20);
    }
}

#[test]
fn runtime_startup_probe_gates_liveness_and_readiness() {
    let tmp = tempfile::tempdir().expect("tmp");
    let started = tmp.path().join("started");
    let runs = tmp.path().join("runs");
    let probes = ContainerProbes {
        startup: Some(spec(
            ProbeKind::Startup,
            shell("echo x >> \"$RUNS\"; test -e \"$STARTED\""),
            1_000_000,
            Duration::ZERO,
        )),
        readiness: Some(spec(ProbeKind::Readiness, shell("true"), 1, Duration::ZERO)),
        liveness: Some(spec(ProbeKind::Liveness, shell("true"), 1, Duration::ZERO)),
    };
    let (runner, rx) = start(
        probes,
        &[("STARTED", started.to_str().expect("utf-8")), ("RUNS", runs.to_str().expect("utf-8"))],
    );
    // The startup probe has run and failed a few times: nothing else may have been reported.
    wait_lines(&runs, 3);
    assert!(rx.try_recv().is_err(), "no transition before the startup probe passes");
    fs::write(&started, b"").expect("start");
    let mut seen = until(&rx, |t| *t == Transition::StartupPassed);
    assert_eq!(seen, [Transition::StartupPassed]);
    seen.extend(until(&rx, |t| *t == Transition::Ready || *t == Transition::Healthy));
    seen.extend(until(&rx, |t| *t == Transition::Ready || *t == Transition::Healthy));
    assert!(seen.contains(&Transition::Ready) && seen.contains(&Transition::Healthy), "{seen:?}");
    runner.stop();
}

#[test]
fn runtime_liveness_failing_retries_times_is_unhealthy() {
    let probes = ContainerProbes {
        liveness: Some(spec(ProbeKind::Liveness, shell("exit 1"), 3, Duration::ZERO)),
        ..ContainerProbes::default()
    };
    let (runner, rx) = start(probes, &[]);
    // No readiness probe: ready as soon as there is no startup probe to wait for.
    let seen = until(&rx, |t| matches!(t, Transition::Unhealthy { .. }));
    assert_eq!(seen[0], Transition::Ready);
    match seen.last() {
        Some(Transition::Unhealthy { reason }) => {
            assert!(reason.starts_with("liveness check failed 3 times in a row: "), "{reason}")
        }
        other => panic!("expected unhealthy, got {other:?}"),
    }
    runner.stop();
}

#[test]
fn runtime_readiness_failing_is_not_ready_but_not_unhealthy() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ready = tmp.path().join("ready");
    fs::write(&ready, b"").expect("ready");
    let probes = ContainerProbes {
        readiness: Some(spec(ProbeKind::Readiness, shell("test -e \"$READY\""), 2, Duration::ZERO)),
        liveness: Some(spec(ProbeKind::Liveness, shell("true"), 1, Duration::ZERO)),
        ..ContainerProbes::default()
    };
    let (runner, rx) = start(probes, &[("READY", ready.to_str().expect("utf-8"))]);
    let mut seen = until(&rx, |t| *t == Transition::Ready);
    fs::remove_file(&ready).expect("unready");
    seen.extend(until(&rx, |t| matches!(t, Transition::NotReady { .. })));
    fs::write(&ready, b"").expect("ready again");
    seen.extend(until(&rx, |t| *t == Transition::Ready));
    assert!(!seen.iter().any(|t| matches!(t, Transition::Unhealthy { .. })), "{seen:?}");
    runner.stop();
    let rest: Vec<_> = rx.try_iter().map(|e| e.transition).collect();
    assert!(!rest.iter().any(|t| matches!(t, Transition::Unhealthy { .. })), "{rest:?}");
}

#[test]
fn runtime_start_period_hides_early_failures() {
    let tmp = tempfile::tempdir().expect("tmp");
    let runs = tmp.path().join("runs");
    let probes = ContainerProbes {
        readiness: Some(spec(ProbeKind::Readiness, shell("true"), 1, Duration::ZERO)),
        liveness: Some(spec(
            ProbeKind::Liveness,
            shell("echo x >> \"$RUNS\"; exit 1"),
            1,
            Duration::from_secs(3600),
        )),
        ..ContainerProbes::default()
    };
    let (runner, rx) = start(probes, &[("RUNS", runs.to_str().expect("utf-8"))]);
    wait_lines(&runs, 4);
    runner.stop();
    let seen: Vec<_> = rx.try_iter().map(|e| e.transition).collect();
    assert_eq!(seen, [Transition::Ready], "failures inside the start period must not count");
}
