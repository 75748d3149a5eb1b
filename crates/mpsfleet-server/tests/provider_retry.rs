//! Retries with backoff around real provider commands: transient failures that pass, ones that
//! do not, hung commands and slow boots, with a recording sleeper instead of real waits.

use common::provider;
use mpsfleet_server::provider::{
    launch_with_retries, terminate_with_retries, wait_until_running, AttemptRecord, CapacityProvider,
    LaunchRequest, ProviderError, ProviderHostState, Retry,
};
mod common;

use std::path::Path;
use std::time::Duration;

fn request(name: &str) -> LaunchRequest {
    LaunchRequest {
        name: name.into(),
        pool: "train".into(),
        server: "http://10.0.0.5:7070".into(),
        join_token: "t".into(),
        agent_args: vec![],
        incident: String::new(),
    }
}

fn policy(initial_ms: u64, max_ms: u64, max_attempts: u32) -> Retry {
    Retry {
        initial_backoff: Duration::from_millis(initial_ms),
        max_backoff: Duration::from_millis(max_ms),
        max_attempts,
    }
}

/// Counts calls per operation in `$FAKE_CLOUD/<op>.count`; `$n` is this call's number.
const COUNTER: &str = r#"cat > /dev/null
f="$FAKE_CLOUD/$MPSFLEET_PROVIDER_OP.count"
n=$(( $(cat "$f" 2>/dev/null || echo 0) + 1 ))
echo $n > "$f"
"#;

fn count(dir: &Path, op: &str) -> u32 {
    std::fs::read_to_string(dir.join(format!("{op}.count"))).map_or(0, |s| s.trim().parse().unwrap())
}

#[test]
fn provider_launch_retries_with_backoff_until_transient_failures_pass() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        "{COUNTER}if [ $n -le 2 ]; then echo \"api unavailable (call $n)\" >&2; exit 1; fi\n\
         echo '{{\"providerId\": \"i-7\", \"state\": \"PENDING\"}}'"
    );
    let p = provider(dir.path(), &script(dir.path(), "flaky", &body), Duration::from_secs(10));
    let mut slept = Vec::new();
    let r = launch_with_retries(&p, &request("gpu-1"), &policy(100, 1000, 5), |_, d| slept.push(d));

    assert_eq!(r.result.unwrap().provider_id, "i-7");
    assert_eq!(count(dir.path(), "launch"), 3);
    assert_eq!(slept, [Duration::from_millis(100), Duration::from_millis(200)]);
    assert_eq!(r.attempts.len(), 2);
    for (i, a) in r.attempts.iter().enumerate() {
        assert_eq!(a.attempt, i as u32 + 1);
        assert_eq!(a.backoff_ms, Some(100 << i));
        assert!(a.error.contains("exit status: 1"), "{}", a.error);
        assert!(a.error.ends_with(&format!("api unavailable (call {})", i + 1)), "{}", a.error);
    }
    assert_eq!(p.hosts(), ["gpu-1"]);
}

#[test]
fn provider_launch_gives_up_after_max_attempts_with_every_attempt_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!("{COUNTER}echo \"quota exceeded (call $n)\" >&2; exit 3");
    let p = provider(dir.path(), &script(dir.path(), "broken", &body), Duration::from_secs(10));
    let mut slept = Vec::new();
    let r =
        launch_with_retries(&p, &request("gpu-2"), &policy(250, 400, 4), |_, d| slept.push(d.as_millis()));

    let err = r.result.unwrap_err();
    assert!(matches!(&err, ProviderError::Failed { status, .. } if status.code() == Some(3)), "{err:?}");
    assert!(err.to_string().ends_with("quota exceeded (call 4)"), "{err}");
    assert_eq!(count(dir.path(), "launch"), 4);
    assert_eq!(slept, [250, 400, 400]);
    let backoffs: Vec<_> = r.attempts.iter().map(|a| (a.attempt, a.backoff_ms)).collect();
    assert_eq!(backoffs, [(1, Some(250)), (2, Some(400)), (3, Some(400)), (4, None)]);
    assert!(r.attempts[3].error.contains("exit status: 3"));
    // What an incident shows.
    let json = serde_json::to_value(&r.attempts).unwrap();
    assert_eq!(json[3]["backoffMs"], serde_json::Value::Null);
    assert!(json[0]["error"].as_str().unwrap().contains("gpu-2"));
    assert!(p.hosts().is_empty());
}

#[test]
fn provider_hung_commands_time_out_on_each_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!("{COUNTER}sleep 300");
    let p = provider(dir.path(), &script(dir.path(), "hang", &body), Duration::from_millis(300));
    p.adopt("gpu-3", "i-3");
    let r = terminate_with_retries(&p, "gpu-3", &policy(10, 10, 2), |_, _| {});
    assert!(matches!(r.result, Err(ProviderError::TimedOut { .. })));
    assert_eq!(count(dir.path(), "terminate"), 2);
    let errors: Vec<&AttemptRecord> = r.attempts.iter().collect();
    assert_eq!(errors.len(), 2);
    assert!(errors.iter().all(|a| a.error.contains("timed out after 0.3s")), "{errors:?}");
}

#[test]
fn provider_missing_program_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path(), "/nonexistent/gpu-hosts", Duration::from_secs(10));
    let mut slept = 0;
    let r = launch_with_retries(&p, &request("gpu-4"), &policy(10, 10, 5), |_, _| slept += 1);
    assert!(matches!(r.result, Err(ProviderError::Spawn { .. })));
    assert_eq!((r.attempts.len(), slept), (1, 0));
    assert_eq!(r.attempts[0].backoff_ms, None);
}

#[test]
fn provider_wait_until_running_rides_out_a_slow_boot() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        r#"{COUNTER}case "$MPSFLEET_PROVIDER_OP" in
  launch) echo '{{"providerId": "i-5", "state": "PENDING"}}' ;;
  describe) if [ $n -le 2 ]; then echo '{{"state": "PENDING", "detail": "booting"}}';
            elif [ $n -eq 3 ]; then echo 'describe-instances: throttled' >&2; exit 1;
            else echo '{{"state": "RUNNING"}}'; fi ;;
esac"#
    );
    let p = provider(dir.path(), &script(dir.path(), "slow", &body), Duration::from_secs(10));
    assert_eq!(p.launch(&request("gpu-5")).unwrap().state, ProviderHostState::Pending);
    let mut slept = Vec::new();
    let r = wait_until_running(&p, "gpu-5", &policy(1000, 3000, 10), |_, d| slept.push(d.as_secs()));
    r.result.unwrap();
    assert_eq!(count(dir.path(), "describe"), 4);
    assert_eq!(slept, [1, 2, 3]);
    let errors: Vec<&str> = r.attempts.iter().map(|a| a.error.as_str()).collect();
    assert_eq!(errors[..2], ["host gpu-5 is not running: PENDING", "host gpu-5 is not running: PENDING"]);
    assert!(errors[2].contains("throttled"), "{}", errors[2]);
}

#[test]
fn provider_wait_until_running_stops_when_the_host_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let body =
        format!(r#"{COUNTER}echo '{{"state": "TERMINATED", "detail": "InsufficientInstanceCapacity"}}'"#);
    let p = provider(dir.path(), &script(dir.path(), "gone", &body), Duration::from_secs(10));
    p.adopt("gpu-6", "i-6");
    let r = wait_until_running(&p, "gpu-6", &policy(1000, 3000, 10), |_, _| panic!("no wait expected"));
    let err = r.result.unwrap_err();
    assert_eq!(err.to_string(), "host gpu-6 is not running: TERMINATED (InsufficientInstanceCapacity)");
    assert_eq!(r.attempts.len(), 1);
    assert_eq!(count(dir.path(), "describe"), 1);
}

/// The script's path as a string, for an argv.
fn script(dir: &Path, name: &str, body: &str) -> String {
    common::script(dir, name, body).display().to_string()
}
