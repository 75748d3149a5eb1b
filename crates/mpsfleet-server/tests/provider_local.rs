//! The local capacity provider with a stand-in for the `mpsfleet` executable: a script that
//! records its arguments and sleeps, or ignores SIGTERM, or exits at once.

use mpsfleet_server::provider::{
    CapacityProvider, LaunchRequest, LocalProvider, ProviderError, ProviderHostState,
};
mod common;

use common::script;
use std::time::Duration;

/// Polls `cond` every 20 ms for up to 10 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
}

#[test]
fn local_provider_launches_describes_and_terminates_an_agent() {
    let dir = tempfile::tempdir().unwrap();
    // $3 is the data dir: `agent --data-dir DIR ...`.
    let exe = script(
        dir.path(),
        "fake-mpsfleet",
        "printf '%s\\n' \"$@\" > \"$3/args\"; printf '%s' \"$MPSFLEET_JOIN_TOKEN\" > \"$3/token\"; exec sleep 300",
    );
    let p = LocalProvider::new(
        exe,
        dir.path().join("hosts"),
        vec!["--emulate-gpus".into(), "H100:81559:2".into()],
        Duration::from_secs(5),
    );
    let req = LaunchRequest {
        name: "local-0".into(),
        pool: "gpu".into(),
        server: "http://127.0.0.1:7070".into(),
        join_token: "tok".into(),
        agent_args: vec!["--mps-model".into()],
        incident: String::new(),
    };
    let launched = p.launch(&req).unwrap();
    assert_eq!(launched.state, ProviderHostState::Running);
    let host_dir = dir.path().join("hosts/local-0");
    let args_file = host_dir.join("args");
    wait_for("the agent's arguments", || {
        std::fs::read_to_string(&args_file).is_ok_and(|s| s.ends_with('\n'))
    });
    let args = std::fs::read_to_string(&args_file).unwrap();
    let expected = [
        "agent",
        "--data-dir",
        host_dir.to_str().unwrap(),
        "--server",
        "http://127.0.0.1:7070",
        "--pool",
        "gpu",
        "--hostname",
        "local-0",
        "--emulate-gpus",
        "H100:81559:2",
        "--mps-model",
    ];
    assert_eq!(args.lines().collect::<Vec<_>>(), expected);
    // The token is in the agent's environment, never in its argv (which `ps` shows everyone).
    assert_eq!(std::fs::read_to_string(host_dir.join("token")).unwrap(), "tok");
    assert!(host_dir.join("agent.log").exists());

    assert_eq!(p.hosts(), ["local-0"]);
    assert_eq!(p.describe("local-0").unwrap(), ProviderHostState::Running);
    assert!(alive(&launched.provider_id));
    assert!(matches!(p.launch(&req), Err(ProviderError::AlreadyLaunched(n)) if n == "local-0"));

    let stopped = p.terminate("local-0").unwrap();
    let ProviderHostState::Terminated { detail } = &stopped else { panic!("{stopped:?}") };
    assert_eq!(detail, "stopped with SIGTERM: signal 15 (SIGTERM)");
    assert!(!alive(&launched.provider_id));
    assert_eq!(p.describe("local-0").unwrap(), stopped);
    assert_eq!(p.terminate("local-0").unwrap(), stopped, "terminate is idempotent");
    assert!(p.hosts().is_empty());
}

#[test]
fn local_provider_kills_an_agent_that_ignores_sigterm_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let exe =
        script(dir.path(), "stubborn", "trap '' TERM; echo $$ > \"$3/pid\"; while :; do sleep 0.05; done");
    let p = LocalProvider::new(exe, dir.path().join("hosts"), vec![], Duration::from_millis(300));
    p.launch(&LaunchRequest::named("local-1")).unwrap();
    let pid_file = dir.path().join("hosts/local-1/pid");
    // The trap is set once the pid is written.
    wait_for("the trap", || std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n')));
    assert_eq!(p.describe("local-1").unwrap(), ProviderHostState::Running);
    let stopped = p.terminate("local-1").unwrap();
    assert_eq!(
        stopped,
        ProviderHostState::Terminated {
            detail: "killed with SIGKILL after a 0.3s grace period: signal 9 (SIGKILL)".into()
        }
    );
    assert!(!alive(std::fs::read_to_string(&pid_file).unwrap().trim()));
    assert_eq!(p.describe("local-1").unwrap(), stopped);
}

#[test]
fn local_provider_describes_an_agent_that_exited_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let exe = script(dir.path(), "crashy", "echo 'agent: cannot reach the server' >&2; exit 3");
    let p = LocalProvider::new(exe, dir.path().join("hosts"), vec![], Duration::from_secs(5));
    p.launch(&LaunchRequest::named("local-2")).unwrap();
    wait_for("the exit", || p.describe("local-2").unwrap() != ProviderHostState::Running);
    assert_eq!(
        p.describe("local-2").unwrap(),
        ProviderHostState::Terminated { detail: "exited: exit status: 3".into() }
    );
    assert_eq!(p.hosts(), ["local-2"], "listed until terminated");
    let log = std::fs::read_to_string(dir.path().join("hosts/local-2/agent.log")).unwrap();
    assert_eq!(log, "agent: cannot reach the server\n");
    assert_eq!(
        p.terminate("local-2").unwrap(),
        ProviderHostState::Terminated { detail: "exited before it was stopped: exit status: 3".into() }
    );
    // Launched again after it was terminated.
    p.launch(&LaunchRequest::named("local-2")).unwrap();
}

#[test]
fn local_provider_unknown_host_and_missing_executable() {
    let dir = tempfile::tempdir().unwrap();
    let p = LocalProvider::new(
        dir.path().join("missing"),
        dir.path().join("hosts"),
        vec![],
        Duration::from_secs(1),
    );
    assert!(matches!(p.describe("nobody"), Err(ProviderError::Unknown(n)) if n == "nobody"));
    assert!(matches!(p.terminate("nobody"), Err(ProviderError::Unknown(_))));
    let err = p.launch(&LaunchRequest::named("local-3")).unwrap_err();
    assert!(err.to_string().starts_with("cannot launch host local-3: cannot start"), "{err}");
    assert!(p.hosts().is_empty());
}

/// The pids a stand-in agent wrote to `<host dir>/<file>`, one per line.
fn pids(host_dir: &std::path::Path, file: &str) -> Vec<String> {
    std::fs::read_to_string(host_dir.join(file)).unwrap_or_default().lines().map(String::from).collect()
}

/// A stand-in agent that leaves behind what a real one does: a child (like an MPS daemon,
/// which does not name the host's dir but is the agent's child), and an orphan that names the
/// host's dir in its environment and ignores SIGTERM (like a shim whose agent died).
const LEAVES_PROCESSES: &str = "sleep 301 & echo $! > \"$3/child\"
( MARK=\"$3/tasks/1\" sh -c 'trap \"\" TERM; echo $$ > \"$0\"; while :; do sleep 0.05; done' \"$3/orphan\" & )
exec sleep 300";

#[test]
fn local_provider_terminate_ends_every_process_of_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let exe = script(dir.path(), "leaves-processes", LEAVES_PROCESSES);
    let p = LocalProvider::new(exe, dir.path().join("hosts"), vec![], Duration::from_secs(5));
    let launched = p.launch(&LaunchRequest::named("local-4")).unwrap();
    let host_dir = dir.path().join("hosts/local-4");
    wait_for("the child and the orphan", || {
        pids(&host_dir, "child").len() == 1 && pids(&host_dir, "orphan").len() == 1
    });
    let (child, orphan) = (pids(&host_dir, "child").remove(0), pids(&host_dir, "orphan").remove(0));
    assert!(alive(&child) && alive(&orphan));

    let stopped = p.terminate("local-4").unwrap();
    let ProviderHostState::Terminated { detail } = &stopped else { panic!("{stopped:?}") };
    assert!(detail.starts_with("agent stopped with SIGTERM: signal 15 (SIGTERM); "), "{detail}");
    assert!(detail.contains("with SIGKILL"), "the orphan ignores SIGTERM: {detail}");
    for pid in [&launched.provider_id, &child, &orphan] {
        assert!(!alive(pid), "process {pid} of the host still runs after terminate answered {detail}");
    }
    assert_eq!(p.terminate("local-4").unwrap(), stopped, "terminate is idempotent");
    assert_eq!(p.describe("local-4").unwrap(), stopped);
}

#[test]
fn local_provider_finds_and_ends_the_hosts_of_an_earlier_provider() {
    let dir = tempfile::tempdir().unwrap();
    let exe = script(dir.path(), "leaves-processes", LEAVES_PROCESSES);
    let host_dir = dir.path().join("hosts/local-5");
    let first = LocalProvider::new(exe.clone(), dir.path().join("hosts"), vec![], Duration::from_secs(5));
    let launched = first.launch(&LaunchRequest::named("local-5")).unwrap();
    wait_for("the orphan", || pids(&host_dir, "orphan").len() == 1);
    drop(first);
    assert!(alive(&launched.provider_id), "a host outlives its provider, as a machine does");

    // A restarted server's provider over the same directory.
    let second = LocalProvider::new(exe, dir.path().join("hosts"), vec![], Duration::from_secs(5));
    assert_eq!(second.hosts(), ["local-5"]);
    assert_eq!(second.describe("local-5").unwrap(), ProviderHostState::Running);
    let again = second.launch(&LaunchRequest::named("local-5")).unwrap();
    assert_eq!(again.provider_id, launched.provider_id, "launch adopts the running host");
    let stopped = second.terminate("local-5").unwrap();
    assert!(matches!(&stopped, ProviderHostState::Terminated { .. }), "{stopped:?}");
    for pid in [launched.provider_id, pids(&host_dir, "child").remove(0), pids(&host_dir, "orphan").remove(0)]
    {
        assert!(!alive(&pid), "process {pid} of the earlier provider's host still runs");
    }
    assert!(second.hosts().is_empty());
    assert!(matches!(second.describe("local-5").unwrap(), ProviderHostState::Terminated { .. }));
}
