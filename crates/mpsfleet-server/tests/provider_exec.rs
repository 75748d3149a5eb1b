//! The exec capacity provider against real processes: small shell scripts in a temp dir that
//! implement (or break) the contract in docs/providers.md.

use common::provider;
use mpsfleet_server::provider::{
    CapacityProvider, LaunchRequest, ProviderError, ProviderHostState, ProviderOp, Retryable,
};
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

fn request(name: &str) -> LaunchRequest {
    LaunchRequest {
        name: name.into(),
        pool: "train".into(),
        server: "http://10.0.0.5:7070".into(),
        join_token: "join-s3cret".into(),
        agent_args: vec!["--mps-probe-timeout-ms".into(), "2000".into()],
        incident: String::new(),
    }
}

fn read_json(path: PathBuf) -> serde_json::Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Whether `pid` is gone (or a zombie waiting for a reaper that is not us) within 2 s: a
/// killed grandchild finishes exiting asynchronously, after its pipes are already closed.
fn dead(pid: &str) -> bool {
    let gone = || match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    };
    for _ in 0..100 {
        if gone() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A fake cloud: records every request in `$FAKE_CLOUD/<op>-<name>.json` and its environment
/// in `$FAKE_CLOUD/<op>.env`, starts nothing, and answers per the contract.
const FAKE_CLOUD: &str = r#"
op="$1"
[ "$op" = "$MPSFLEET_PROVIDER_OP" ] || { echo "argv says $op, env says $MPSFLEET_PROVIDER_OP" >&2; exit 9; }
cat > "$FAKE_CLOUD/$op-$MPSFLEET_HOST_NAME.json"
env > "$FAKE_CLOUD/$op.env"
echo "fake cloud: $op $MPSFLEET_HOST_NAME" >&2
case "$op" in
  launch) echo '{"providerId": "i-0abc", "state": "PENDING", "zone": "ignored-extra-field"}' ;;
  describe) printf '{"state": "RUNNING", "detail": "up 3s"}\n\n' ;;
  terminate) echo '{"state": "TERMINATED", "detail": "gone"}' ;;
esac
"#;

#[test]
fn exec_provider_launch_describe_terminate_follow_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path(), &script(dir.path(), "cloud", FAKE_CLOUD), Duration::from_secs(10));

    let launched = p.launch(&request("gpu-1")).unwrap();
    assert_eq!(launched.provider_id, "i-0abc");
    assert_eq!(launched.state, ProviderHostState::Pending);
    assert_eq!(
        read_json(dir.path().join("launch-gpu-1.json")),
        serde_json::json!({
            "version": 1,
            "name": "gpu-1",
            "pool": "train",
            "server": "http://10.0.0.5:7070",
            "joinToken": "join-s3cret",
            // The token goes in the agent's environment or a file, never its argv.
            "agentArgs": [
                "--server", "http://10.0.0.5:7070",
                "--pool", "train",
                "--hostname", "gpu-1",
                "--mps-probe-timeout-ms", "2000"
            ]
        })
    );
    assert_eq!(p.hosts(), ["gpu-1"]);
    assert_eq!(p.provider_id("gpu-1").as_deref(), Some("i-0abc"));

    // The environment is minimal: PATH, the documented variables, the configured ones.
    let env = std::fs::read_to_string(dir.path().join("launch.env")).unwrap();
    for line in ["MPSFLEET_PROVIDER_OP=launch", "MPSFLEET_HOST_NAME=gpu-1", "FAKE_CLOUD="] {
        assert!(env.lines().any(|l| l.starts_with(line)), "{line} missing in:\n{env}");
    }
    assert!(env.lines().any(|l| l.starts_with("PATH=")));
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some(), "cargo sets it for tests");
    assert!(!env.contains("CARGO_"), "the server's environment leaked:\n{env}");
    assert!(!env.contains("join-s3cret"), "the join token belongs on stdin only");

    assert_eq!(p.describe("gpu-1").unwrap(), ProviderHostState::Running);
    let expected = serde_json::json!({"version": 1, "name": "gpu-1", "providerId": "i-0abc"});
    assert_eq!(read_json(dir.path().join("describe-gpu-1.json")), expected);
    assert!(std::fs::read_to_string(dir.path().join("describe.env"))
        .unwrap()
        .contains("MPSFLEET_PROVIDER_OP=describe"));

    assert_eq!(p.terminate("gpu-1").unwrap(), ProviderHostState::Terminated { detail: "gone".into() });
    assert_eq!(read_json(dir.path().join("terminate-gpu-1.json")), expected);
    assert!(p.hosts().is_empty());
    // The name may be launched again once the old host was terminated.
    p.launch(&request("gpu-1")).unwrap();
}

#[test]
fn exec_provider_failure_names_command_exit_status_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let program = script(
        dir.path(),
        "quota",
        "cat > /dev/null; echo 'calling the cloud...' >&2; \
         echo 'error: quota exceeded for g5.xlarge' >&2; exit 3",
    );
    let p = provider(dir.path(), &program, Duration::from_secs(10));
    let err = p.launch(&request("gpu-2")).unwrap_err();
    match &err {
        ProviderError::Failed { op, name, command, status, stderr } => {
            assert_eq!(*op, ProviderOp::Launch);
            assert_eq!(name, "gpu-2");
            assert_eq!(command, &format!("{program} launch"));
            assert_eq!(status.code(), Some(3));
            assert!(stderr.ends_with("error: quota exceeded for g5.xlarge"), "{stderr}");
        }
        other => panic!("expected a command failure, got {other:?}"),
    }
    let message = err.to_string();
    for part in ["launch", "gpu-2", program.as_str(), "exit status: 3", "quota exceeded for g5.xlarge"] {
        assert!(message.contains(part), "{part:?} missing in {message:?}");
    }
    assert!(err.is_transient());
    assert_eq!(err.host(), "gpu-2");
    assert!(p.hosts().is_empty(), "a failed launch records no host");
}

#[test]
fn exec_provider_long_stderr_is_truncated_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let program = script(
        dir.path(),
        "noisy",
        "cat > /dev/null; i=0; while [ $i -lt 2000 ]; do echo \"noise line $i\" >&2; i=$((i+1)); done; \
         echo 'the real reason' >&2; exit 1",
    );
    let err = provider(dir.path(), &program, Duration::from_secs(10)).launch(&request("gpu-3")).unwrap_err();
    let ProviderError::Failed { stderr, .. } = &err else { panic!("{err:?}") };
    assert!(stderr.starts_with('…') && stderr.ends_with("the real reason"), "{stderr}");
    assert!(stderr.len() < 1100, "{} bytes", stderr.len());
}

#[test]
fn exec_provider_garbage_output_is_an_error_with_what_was_printed() {
    let dir = tempfile::tempdir().unwrap();
    let check = |body: &str, expected_reason: &str| {
        let program = script(dir.path(), "garbage", body);
        let err =
            provider(dir.path(), &program, Duration::from_secs(10)).launch(&request("gpu-4")).unwrap_err();
        match &err {
            ProviderError::BadOutput { op, name, reason, .. } => {
                assert_eq!((*op, name.as_str()), (ProviderOp::Launch, "gpu-4"));
                assert!(reason.contains(expected_reason), "{reason:?} lacks {expected_reason:?}");
            }
            other => panic!("expected bad output for {body:?}, got {other:?}"),
        }
        err.to_string()
    };
    let message = check(
        "cat > /dev/null; echo 'Launching instance...'; echo '{\"providerId\": \"i-1\"}'; echo oops >&2",
        "not the expected JSON",
    );
    assert!(
        message.contains("stdout: Launching instance...") && message.contains("stderr: oops"),
        "{message}"
    );
    check("cat > /dev/null", "no output");
    check("cat > /dev/null; echo '{\"providerId\": \"i-1\"}'", "missing field `state`");
    check(
        "cat > /dev/null; echo '{\"providerId\": \"i-1\", \"state\": \"BOOTING\"}'",
        "unknown variant `BOOTING`",
    );
    check("cat > /dev/null; echo '{\"providerId\": \"\", \"state\": \"RUNNING\"}'", "providerId is empty");
    check(
        "cat > /dev/null; echo '{\"providerId\": \"i-1\", \"state\": \"TERMINATED\"}'",
        "state TERMINATED is not an answer to launch",
    );
}

#[test]
fn exec_provider_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    // Ignores its input, starts a grandchild, and never answers.
    let program = script(
        dir.path(),
        "hang",
        "echo $$ > \"$FAKE_CLOUD/hang.pid\"; sleep 300 & echo $! > \"$FAKE_CLOUD/sleep.pid\"; \
         echo 'waiting for the cloud' >&2; wait",
    );
    let p = provider(dir.path(), &program, Duration::from_millis(500));
    let err = p.launch(&request("gpu-5")).unwrap_err();
    match &err {
        ProviderError::TimedOut { op, name, timeout, stderr, .. } => {
            assert_eq!((*op, name.as_str()), (ProviderOp::Launch, "gpu-5"));
            assert_eq!(*timeout, Duration::from_millis(500));
            assert_eq!(stderr, "waiting for the cloud");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(err.to_string().contains("timed out after 0.5s and was killed"), "{err}");
    assert!(err.is_transient());
    for file in ["hang.pid", "sleep.pid"] {
        let pid = std::fs::read_to_string(dir.path().join(file)).unwrap();
        assert!(dead(&pid), "{file}: process {} is still running", pid.trim());
    }
}

#[test]
fn exec_provider_leaves_nothing_running_after_a_successful_command() {
    let dir = tempfile::tempdir().unwrap();
    // Answers at once but leaves a background process holding its stdout.
    let program = script(
        dir.path(),
        "leaky",
        "cat > /dev/null; sleep 300 & echo $! > \"$FAKE_CLOUD/leak.pid\"; \
         echo '{\"providerId\": \"i-9\", \"state\": \"RUNNING\"}'",
    );
    let launched = provider(dir.path(), &program, Duration::from_secs(10)).launch(&request("gpu-6")).unwrap();
    assert_eq!(launched.state, ProviderHostState::Running);
    let pid = std::fs::read_to_string(dir.path().join("leak.pid")).unwrap();
    assert!(dead(&pid), "the leftover process {} is still running", pid.trim());
}

#[test]
fn exec_provider_missing_program_is_a_spawn_error_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-cli").display().to_string();
    let err = provider(dir.path(), &missing, Duration::from_secs(10)).launch(&request("gpu-7")).unwrap_err();
    assert!(matches!(&err, ProviderError::Spawn { op: ProviderOp::Launch, .. }), "{err:?}");
    assert!(err.to_string().contains(&missing) && err.to_string().contains("gpu-7"), "{err}");
    assert!(!err.is_transient());
}

#[test]
fn exec_provider_bookkeeping_unknown_adopted_and_duplicate_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path(), &script(dir.path(), "cloud", FAKE_CLOUD), Duration::from_secs(10));

    assert!(matches!(p.describe("nobody"), Err(ProviderError::Unknown(n)) if n == "nobody"));
    assert!(matches!(p.terminate("nobody"), Err(ProviderError::Unknown(_))));

    // A host launched by an earlier server run.
    p.adopt("old-1", "i-old");
    assert_eq!(p.hosts(), ["old-1"]);
    assert_eq!(p.describe("old-1").unwrap(), ProviderHostState::Running);
    assert_eq!(read_json(dir.path().join("describe-old-1.json"))["providerId"], "i-old");

    p.launch(&request("gpu-8")).unwrap();
    let err = p.launch(&request("gpu-8")).unwrap_err();
    assert!(matches!(&err, ProviderError::AlreadyLaunched(n) if n == "gpu-8"), "{err:?}");
    assert!(!err.is_transient());

    // An incomplete request runs nothing.
    let mut req = request("gpu-9");
    req.join_token.clear();
    let err = p.launch(&req).unwrap_err();
    assert_eq!(err.to_string(), "cannot launch host gpu-9: the launch request has no join token");
    assert!(!dir.path().join("launch-gpu-9.json").exists());
}

#[test]
fn exec_provider_describe_maps_every_state() {
    let dir = tempfile::tempdir().unwrap();
    let program = script(
        dir.path(),
        "states",
        r#"cat > /dev/null
case "$MPSFLEET_PROVIDER_OP" in
  launch) echo '{"providerId": "i-1", "state": "RUNNING"}' ;;
  describe) cat "$FAKE_CLOUD/answer" ;;
  terminate) echo '{"state": "TERMINATING"}' ;;
esac"#,
    );
    let p = provider(dir.path(), &program, Duration::from_secs(10));
    p.launch(&request("gpu-10")).unwrap();
    let check = |answer: &str, expected: ProviderHostState| {
        std::fs::write(dir.path().join("answer"), answer).unwrap();
        assert_eq!(p.describe("gpu-10").unwrap(), expected, "for {answer}");
    };
    check(r#"{"state": "PENDING", "detail": "booting"}"#, ProviderHostState::Pending);
    check(r#"{"state": "RUNNING"}"#, ProviderHostState::Running);
    check(
        r#"{"state": "UNKNOWN", "detail": "api throttled"}"#,
        ProviderHostState::Unknown { detail: "api throttled".into() },
    );
    check(r#"{"state": "TERMINATING"}"#, ProviderHostState::Terminating);
    assert_eq!(p.hosts(), ["gpu-10"]);
    check(
        r#"{"state": "TERMINATED", "detail": "spot capacity reclaimed"}"#,
        ProviderHostState::Terminated { detail: "spot capacity reclaimed".into() },
    );
    assert!(p.hosts().is_empty(), "a host described as terminated is no longer listed");
    assert_eq!(p.terminate("gpu-10").unwrap(), ProviderHostState::Terminating);
}

/// The script's path as a string, for an argv.
fn script(dir: &Path, name: &str, body: &str) -> String {
    common::script(dir, name, body).display().to_string()
}
