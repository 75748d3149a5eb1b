use super::*;

#[test]
fn pull_behavior_names() {
    for b in [PullBehavior::Default, PullBehavior::Always, PullBehavior::Once, PullBehavior::PreferCached] {
        assert_eq!(b.as_str().parse::<PullBehavior>(), Ok(b));
    }
    assert_eq!("sometimes".parse::<PullBehavior>(), Err(UnknownPullBehavior("sometimes".into())));
}

#[test]
fn socket_from_docker_host() {
    assert_eq!(socket_from(None), PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(socket_from(Some("unix:///tmp/d.sock")), PathBuf::from("/tmp/d.sock"));
    assert_eq!(socket_from(Some("tcp://1.2.3.4:2375")), PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(socket_from(Some("unix://")), PathBuf::from(DEFAULT_SOCKET));
}

#[test]
fn references() {
    let check = |i: &str, want: &str| assert_eq!(normalize_reference(i), want);
    check("busybox", "busybox:latest");
    check("busybox:1.36", "busybox:1.36");
    check("127.0.0.1:5000/x/busybox", "127.0.0.1:5000/x/busybox:latest");
    check("127.0.0.1:5000/x/busybox:t", "127.0.0.1:5000/x/busybox:t");
    check("busybox@sha256:abc", "busybox@sha256:abc");
}

#[test]
fn docker_times() {
    assert_eq!(parse_docker_time("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_docker_time("0001-01-01T00:00:00Z"), None);
    assert_eq!(parse_docker_time("2026-12-01T08:50:12.123456789Z"), Some(1_796_115_012_123));
    assert_eq!(parse_docker_time("2026-12-01T09:50:12.5+01:00"), Some(1_796_115_012_500));
    assert_eq!(parse_docker_time("garbage"), None);
    assert_eq!(split_timestamp(b"1970-01-01T00:00:01.5Z hello"), (Some(1500), &b"hello"[..]));
    assert_eq!(split_timestamp(b"no stamp"), (None, &b"no stamp"[..]));
}

#[test]
fn stopped_states() {
    let info = |json: serde_json::Value| -> ContainerInspectResponse {
        serde_json::from_value(json).expect("inspect json")
    };
    let s = state_of(
        "c",
        &info(serde_json::json!({"State": {"Status": "exited", "Running": false, "ExitCode": 137,
            "OOMKilled": true, "Error": "", "FinishedAt": "1970-01-01T00:00:02Z", "Pid": 0}})),
    );
    assert_eq!(
        s,
        ContainerState::Exited(ExitRecord {
            code: Some(137),
            signal: None,
            finished_at_ms: 2000,
            error: None,
            oom_killed: true
        })
    );
    let s =
        state_of("c", &info(serde_json::json!({"State": {"Status": "running", "Running": true, "Pid": 42}})));
    assert_eq!(s, ContainerState::Running { pid: 42 });
    let s = state_of(
        "c",
        &info(serde_json::json!({"State": {"Status": "exited", "ExitCode": 127,
            "Error": "exec: \"nope\": executable file not found", "FinishedAt": "1970-01-01T00:00:01Z"}})),
    );
    assert!(
        matches!(s, ContainerState::Exited(ExitRecord { error: Some(ref e), code: Some(127), .. }) if e.contains("nope"))
    );
}

#[test]
fn bindings_from_inspect() {
    let info: ContainerInspectResponse = serde_json::from_value(serde_json::json!({
        "Id": "abc", "Image": "sha256:1",
        "State": {"Status": "running", "Running": true, "Pid": 7},
        "NetworkSettings": {
            "Ports": {
                "8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "49153"}, {"HostIp": "::", "HostPort": "49153"}],
                "53/udp": [{"HostIp": "", "HostPort": "5353"}],
                "7070/tcp": [{"HostIp": "127.0.0.1", "HostPort": "40001"}],
                "9090/tcp": [{"HostIp": "::1", "HostPort": "40002"}],
                "9/tcp": null
            },
            "Networks": {"bridge": {"IPAddress": "10.0.0.2"}}
        }
    }))
    .expect("inspect json");
    let h = handle_of(&info, "n", vec![]);
    assert_eq!(h.id, "abc");
    assert_eq!(h.pid, Some(7));
    assert_eq!(h.ip.as_deref(), Some("10.0.0.2"));
    assert_eq!(
        h.network_bindings,
        vec![
            NetworkBinding {
                bind_ip: "0.0.0.0".into(),
                container_port: 53,
                host_port: 5353,
                protocol: Protocol::Udp
            },
            NetworkBinding {
                bind_ip: "0.0.0.0".into(),
                container_port: 8080,
                host_port: 49153,
                protocol: Protocol::Tcp
            },
            NetworkBinding {
                bind_ip: "127.0.0.1".into(),
                container_port: 7070,
                host_port: 40001,
                protocol: Protocol::Tcp
            },
            NetworkBinding {
                bind_ip: "::1".into(),
                container_port: 9090,
                host_port: 40002,
                protocol: Protocol::Tcp
            },
        ]
    );
}

/// A SIGKILL exit of a memory-limited container, just now and without `OOMKilled`, is
/// inspected again (Docker may record the OOM kill after the exit); nothing else is.
#[test]
fn a_fresh_sigkill_exit_under_a_memory_limit_is_looked_at_again() {
    let info = |memory: i64, code: i64, oom: bool| -> ContainerInspectResponse {
        serde_json::from_value(serde_json::json!({
            "HostConfig": {"Memory": memory},
            "State": {"Status": "exited", "Running": false, "ExitCode": code, "OOMKilled": oom,
                "FinishedAt": "1970-01-01T00:00:02Z"}
        }))
        .expect("inspect json")
    };
    assert!(oom_may_be_unrecorded(&info(8 << 20, 137, false), 2_100));
    assert!(!oom_may_be_unrecorded(&info(8 << 20, 137, true), 2_100), "recorded already");
    assert!(!oom_may_be_unrecorded(&info(0, 137, false), 2_100), "no memory limit");
    assert!(!oom_may_be_unrecorded(&info(8 << 20, 1, false), 2_100), "not SIGKILL");
    assert!(!oom_may_be_unrecorded(&info(8 << 20, 137, false), 60_000), "an exit long ago");
    // Engine's zero time (not written yet) reads as an exit just now: it is looked at again.
    let unwritten: ContainerInspectResponse = serde_json::from_value(serde_json::json!({
        "HostConfig": {"Memory": 8 << 20},
        "State": {"Status": "exited", "Running": false, "ExitCode": 137, "OOMKilled": false,
            "FinishedAt": "0001-01-01T00:00:00Z"}
    }))
    .expect("inspect json");
    assert!(oom_may_be_unrecorded(&unwritten, 60_000));
}
