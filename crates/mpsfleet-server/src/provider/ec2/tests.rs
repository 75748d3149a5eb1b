use super::api::*;
use super::credentials::*;
use super::xml::*;
use super::*;

fn config(json: serde_json::Value) -> Ec2Config {
    serde_json::from_value(json).unwrap()
}

fn instance_config() -> Ec2Config {
    config(serde_json::json!({"region": "us-east-1", "instanceType": "g5.xlarge", "imageId": "ami-0abc"}))
}

/// A provider that can reach nothing: its endpoint is a closed loopback port and the
/// instance metadata service is off.
fn offline(config: Ec2Config, vars: &[(&str, &str)]) -> Ec2Provider {
    let mut env: Vec<(&str, &str)> = vec![("AWS_EC2_METADATA_DISABLED", "true")];
    env.extend_from_slice(vars);
    Ec2Provider::new(Ec2Config { endpoint_url: Some("http://127.0.0.1:9".into()), ..config }, "train")
        .unwrap()
        .with_env(AwsEnv::fixed(env))
}

#[test]
fn provider_ec2_user_data_keeps_every_value_literal() {
    use std::os::unix::fs::PermissionsExt;
    // The agent command is a script that prints its environment's token and its
    // arguments, each ended by a NUL.
    let dir = tempfile::tempdir().unwrap();
    let show = dir.path().join("show-args");
    std::fs::write(&show, "#!/bin/sh\nprintf '%s\\0' \"$MPSFLEET_JOIN_TOKEN\" \"$@\"\n").unwrap();
    std::fs::set_permissions(&show, std::fs::Permissions::from_mode(0o755)).unwrap();
    let marker = dir.path().join("ran");
    let agent_command = format!("{} agent", show.display());
    let p = offline(
        config(serde_json::json!({"region": "us-east-1", "launchTemplate": {"name": "gpu"},
            "agentCommand": agent_command})),
        &[],
    );
    let hostile = format!("it's $(touch {m}) `touch {m}` \"$HOME\" \\ ;&| '' \n", m = marker.display());
    let req = LaunchRequest {
        name: "gpu-1".into(),
        pool: "train".into(),
        server: "https://cp.example:7070".into(),
        join_token: format!("mpsf_launch_x'{hostile}"),
        agent_args: vec![hostile.clone(), String::new(), "--mps-model".into()],
        incident: "inc-1".into(),
    };
    let script = p.user_data(&req);
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    assert!(
        script.contains(" agent --server 'https://cp.example:7070' --pool 'train' --hostname 'gpu-1' '"),
        "{script}"
    );
    let out = std::process::Command::new("/bin/sh").arg("-c").arg(&script).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let words: Vec<&str> = text.strip_suffix('\0').unwrap().split('\0').collect();
    assert_eq!(
        words,
        [
            req.join_token.as_str(),
            "agent",
            "--server",
            "https://cp.example:7070",
            "--pool",
            "train",
            "--hostname",
            "gpu-1",
            hostile.as_str(),
            "",
            "--mps-model"
        ]
    );
    assert!(!marker.exists(), "a value ran as a command");
    assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    assert_eq!(shell_word("/usr/local/bin/mpsfleet"), "/usr/local/bin/mpsfleet");
    assert_eq!(shell_word("a b"), "'a b'");
    assert_eq!(shell_word(""), "''");
}

#[test]
fn provider_ec2_reads_a_describe_instances_answer() {
    let answer = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
<requestId>8f7724cf-496f-496e-8fe3-example</requestId>
<reservationSet>
    <item>
        <reservationId>r-1234567890abcdef0</reservationId>
        <instancesSet>
            <item>
                <instanceId>i-1234567890abcdef0</instanceId>
                <instanceState><code>16</code><name>running</name></instanceState>
                <blockDeviceMapping><item><deviceName>/dev/xvda</deviceName></item></blockDeviceMapping>
                <tagSet>
                    <item><key>mpsfleet:pool</key><value>train</value></item>
                    <item><key>mpsfleet:host</key><value>gpu-1</value></item>
                    <item><key>Owner</key><value>R&amp;D &lt;ml&gt; &#233;&#x2713;</value></item>
                    <item><key>mpsfleet:incident</key><value/></item>
                </tagSet>
                <stateReason><code/><message/></stateReason>
                <!-- a comment --><description><![CDATA[<raw> & text]]></description>
            </item>
            <item>
                <instanceId>i-0fedcba</instanceId>
                <instanceState><code>48</code><name>terminated</name></instanceState>
                <reason>User initiated (2026-01-01 00:00:00 GMT)</reason>
                <stateReason><code>Client.UserInitiatedShutdown</code><message>Client.UserInitiatedShutdown: User initiated shutdown</message></stateReason>
            </item>
        </instancesSet>
    </item>
</reservationSet>
<nextToken/>
</DescribeInstancesResponse>"#;
    let root = parse_xml(answer).unwrap();
    assert_eq!(root.name, "DescribeInstancesResponse");
    let found = parse_instances(&root);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].id, "i-1234567890abcdef0");
    assert_eq!(found[0].state, "running");
    assert_eq!(found[0].tags["mpsfleet:host"], "gpu-1");
    assert_eq!(found[0].tags["Owner"], "R&D <ml> é✓");
    assert_eq!(found[0].tags["mpsfleet:incident"], "");
    assert_eq!(found[0].host_state(), ProviderHostState::Running);
    assert_eq!(root.find("description").unwrap().text(), "<raw> & text");
    assert_eq!(
        found[1].host_state(),
        ProviderHostState::Terminated {
            detail:
                "EC2 instance i-0fedcba is terminated: Client.UserInitiatedShutdown: User initiated shutdown"
                    .into()
        }
    );
    for (state, want) in [
        ("pending", ProviderHostState::Pending),
        ("shutting-down", ProviderHostState::Terminating),
        ("stopping", ProviderHostState::Terminating),
    ] {
        let i = Ec2Instance { state: state.into(), ..found[0].clone() };
        assert_eq!(i.host_state(), want);
    }
    let stopped = Ec2Instance { state: "stopped".into(), ..found[0].clone() };
    assert!(matches!(stopped.host_state(), ProviderHostState::Terminated { .. }));
    assert!(root.text_at(&["nextToken"]).unwrap().is_empty());
    assert!(parse_error(&root).is_none());

    // RunInstances and TerminateInstances answer a bare instancesSet.
    let run = parse_xml(
        "<RunInstancesResponse><instancesSet><item><instanceId>i-1</instanceId>\
         <instanceState><name>pending</name></instanceState></item></instancesSet></RunInstancesResponse>",
    )
    .unwrap();
    assert_eq!(parse_instances(&run)[0].host_state(), ProviderHostState::Pending);
    let term = parse_xml(
        "<TerminateInstancesResponse><instancesSet><item><instanceId>i-1</instanceId>\
         <currentState><code>32</code><name>shutting-down</name></currentState>\
         <previousState><code>16</code><name>running</name></previousState></item></instancesSet>\
         </TerminateInstancesResponse>",
    )
    .unwrap();
    assert_eq!(parse_instances(&term)[0].state, "shutting-down");
}

#[test]
fn provider_ec2_reads_an_error_answer() {
    let answer = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>req-1</RequestID></Response>"#;
    let root = parse_xml(answer).unwrap();
    assert_eq!(
        parse_error(&root),
        Some(("RequestLimitExceeded".into(), "Request limit exceeded.".into(), "req-1".into()))
    );
    assert!(transient_error(503, "RequestLimitExceeded"));
    assert!(transient_error(400, "RequestLimitExceeded"));
    assert!(transient_error(500, "InternalError"));
    assert!(!transient_error(401, "AuthFailure"));
    assert!(!transient_error(400, "InvalidParameterValue"));
    assert!(!transient_error(403, "UnauthorizedOperation"));

    // The error as the provider reports it: which call, the code, the message.
    let e = Failure::cloud(
        "EC2 RunInstances",
        "AuthFailure",
        "AWS was not able to validate the provided access credentials (HTTP 401)",
        false,
    )
    .into_error(ProviderOp::Launch, "gpu-1");
    assert_eq!(
        e.to_string(),
        "cannot launch host gpu-1: EC2 RunInstances failed: AuthFailure: AWS was not able to validate the \
         provided access credentials (HTTP 401)"
    );
    assert!(!crate::provider::Retryable::is_transient(&e));

    for bad in [
        "",
        "<a>",
        "<a></b>",
        "<a/><b/>",
        "text",
        "<a>&bogus;</a>",
        "<a>&#xD800;</a>",
        "<!DOCTYPE a [<!ENTITY x 'y'>]><a>&x;</a>",
        "<a attr=\"x>",
    ] {
        assert!(parse_xml(bad).is_err(), "{bad:?} parsed");
    }
    let deep = "<a>".repeat(MAX_XML_DEPTH + 1) + &"</a>".repeat(MAX_XML_DEPTH + 1);
    assert!(parse_xml(&deep).unwrap_err().contains("nested"));
    let attrs = parse_xml(r#"<a x="1>2" y='q"'><b/>t</a>"#).unwrap();
    assert_eq!((attrs.children.len(), attrs.text()), (1, "t"));
}

#[test]
fn provider_ec2_config_errors_name_the_field() {
    assert!(instance_config().validate().is_ok());
    assert!(config(
        serde_json::json!({"region": "eu-west-1", "launchTemplate": {"id": "lt-0abc", "version": "$Latest"}})
    )
    .validate()
    .is_ok());
    let check = |json: serde_json::Value, field: &str, message: &str| {
        let e = config(json.clone()).validate().unwrap_err();
        assert_eq!((e.field.as_str(), e.message.as_str()), (field, message), "{json}");
    };
    check(
        serde_json::json!({"instanceType": "g5.xlarge", "imageId": "ami-1"}),
        "region",
        "required (for example us-east-1)",
    );
    check(
        serde_json::json!({"region": "us-east-1", "imageId": "ami-1"}),
        "instanceType",
        "required without launchTemplate",
    );
    check(
        serde_json::json!({"region": "us-east-1", "instanceType": "g5.xlarge"}),
        "imageId",
        "required without launchTemplate",
    );
    check(
        serde_json::json!({"region": "us-east-1", "instanceType": "g5 xlarge", "imageId": "ami-1"}),
        "instanceType",
        "must be an instance type such as g5.xlarge, got \"g5 xlarge\"",
    );
    check(
        serde_json::json!({"region": "us-east-1", "instanceType": "g5.xlarge", "imageId": "img-1"}),
        "imageId",
        "must be an id such as ami-0abc…, got \"img-1\"",
    );
    check(
        serde_json::json!({"region": "us-east-1", "launchTemplate": {"id": "lt-1", "name": "x"}}),
        "launchTemplate",
        "give id or name, not both",
    );
    check(
        serde_json::json!({"region": "us-east-1", "launchTemplate": {"name": "x", "version": "latest"}}),
        "launchTemplate.version",
        "must be $Latest, $Default or a version number, got \"latest\"",
    );
    let base = serde_json::json!({"region": "us-east-1", "launchTemplate": {"name": "x"}});
    let with = |key: &str, value: serde_json::Value| {
        let mut v = base.clone();
        v[key] = value;
        v
    };
    check(
        with("endpointUrl", "http://ec2.example.com".into()),
        "endpointUrl",
        "must be https://…, or http:// to 127.0.0.1 or localhost (for tests), got \"http://ec2.example.com\"",
    );
    check(
        with("endpointUrl", "https://ec2.example.com/x?y".into()),
        "endpointUrl",
        "must have no path, query or fragment, got \"https://ec2.example.com/x?y\"",
    );
    check(
        with("securityGroupIds", serde_json::json!(["sg-1", "x"])),
        "securityGroupIds.1",
        "must be an id such as sg-0abc…, got \"x\"",
    );
    check(with("agentCommand", " ".into()), "agentCommand", "must not be empty");
    check(
        with("tags", serde_json::json!({"mpsfleet:pool": "x"})),
        "tags.mpsfleet:pool",
        "keys starting with aws: or mpsfleet: are reserved",
    );
    let many: serde_json::Map<String, serde_json::Value> =
        (0..41).map(|i| (format!("k{i}"), "v".into())).collect();
    check(with("tags", many.into()), "tags", "at most 40, got 41");
    assert!(
        serde_json::from_value::<Ec2Config>(serde_json::json!({"region": "x", "instancetype": "y"})).is_err()
    );
    assert!(Ec2Provider::new(config(with("endpointUrl", "http://127.0.0.1:5000".into())), "p").is_ok());
    assert_eq!(instance_config().endpoint_url(), "https://ec2.us-east-1.amazonaws.com");
    assert_eq!(instance_config().agent_command(), ["mpsfleet", "agent"]);
}

#[test]
fn provider_ec2_client_token_is_stable_and_short() {
    let a = client_token("train", "gpu-1", "Action=RunInstances", "");
    assert_eq!(a, client_token("train", "gpu-1", "Action=RunInstances", ""));
    assert_eq!(a.len(), 49);
    assert!(a.starts_with("mpsfleet-") && a[9..].bytes().all(|b| b.is_ascii_hexdigit()));
    for other in [
        client_token("train", "gpu-2", "Action=RunInstances", ""),
        client_token("trai", "ngpu-1", "Action=RunInstances", ""),
        client_token("train", "gpu-1", "Action=RunInstances&x", ""),
        client_token("train", "gpu-1", "Action=RunInstances", "i-1"),
    ] {
        assert_ne!(a, other);
    }
}

#[test]
fn provider_ec2_base64_and_dates() {
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64_encode(plain.as_bytes()), encoded);
    }
    assert_eq!(base64_encode(&[0xfb, 0xff]), "+/8=");
    assert_eq!(parse_utc_ms("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_utc_ms("2026-12-06T04:37:34Z"), Some(1_796_531_854_000));
    assert_eq!(parse_utc_ms("2000-02-29T12:00:00.000Z"), Some(951_825_600_000));
    assert_eq!(parse_utc_ms("tomorrow"), None);
}

#[test]
fn provider_ec2_credentials_come_in_order_and_name_their_sources() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    let conf = dir.path().join("config");
    std::fs::write(
        &creds,
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s3cret-default\n\
         # a comment\n[gpu]\naws_access_key_id=AKIDGPU\naws_secret_access_key=s3cret-gpu\naws_session_token = tok\n\
         [assumed]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n",
    )
    .unwrap();
    std::fs::write(
        &conf,
        "[default]\nregion = us-east-1\n[profile cfg]\naws_access_key_id = AKIDCFG\n\
         aws_secret_access_key = s3cret-cfg\ns3 =\n  aws_access_key_id = nested\n",
    )
    .unwrap();
    let files = [
        ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
        ("AWS_CONFIG_FILE", conf.to_str().unwrap()),
    ];
    let with = |vars: &[(&str, &str)], profile: Option<&str>| {
        let mut all = files.to_vec();
        all.extend_from_slice(vars);
        offline(Ec2Config { profile: profile.map(str::to_string), ..instance_config() }, &all).credentials()
    };
    let key = |r: Result<Credentials, Failure>| r.unwrap().access_key_id;
    // The environment first, the default profile next.
    assert_eq!(
        key(with(&[("AWS_ACCESS_KEY_ID", "AKIDENV"), ("AWS_SECRET_ACCESS_KEY", "x")], None)),
        "AKIDENV"
    );
    assert_eq!(key(with(&[], None)), "AKIDDEFAULT");
    // AWS_PROFILE, the configuration's profile (over the environment), the config file.
    assert_eq!(key(with(&[("AWS_PROFILE", "gpu")], None)), "AKIDGPU");
    let gpu = with(&[("AWS_ACCESS_KEY_ID", "AKIDENV"), ("AWS_SECRET_ACCESS_KEY", "x")], Some("gpu")).unwrap();
    assert_eq!((gpu.access_key_id.as_str(), gpu.session_token.as_deref()), ("AKIDGPU", Some("tok")));
    assert_eq!(key(with(&[], Some("cfg"))), "AKIDCFG");
    assert!(!format!("{gpu:?}").contains("s3cret"));

    let failed = |r: Result<Credentials, Failure>| {
        let e = r.unwrap_err().into_error(ProviderOp::Launch, "gpu-1");
        let text = e.to_string();
        assert!(!text.contains("s3cret"), "{text}");
        text
    };
    let e = failed(with(&[], Some("nope")));
    assert!(
        e.starts_with("cannot launch host gpu-1: no usable AWS credentials: environment: skipped"),
        "{e}"
    );
    assert!(e.contains("shared files: no keys for profile \"nope\""), "{e}");
    let e = failed(with(&[], Some("assumed")));
    assert!(e.contains("uses role_arn, which this provider does not support"), "{e}");
    let e = failed(with(&[("AWS_ACCESS_KEY_ID", "AKIDENV")], None));
    assert!(e.contains("only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set"), "{e}");
    // Nothing anywhere: every source is named, the metadata service was not asked.
    let empty = dir.path().join("empty");
    let nothing = offline(
        instance_config(),
        &[
            ("AWS_SHARED_CREDENTIALS_FILE", empty.to_str().unwrap()),
            ("AWS_CONFIG_FILE", empty.to_str().unwrap()),
        ],
    );
    let e = failed(nothing.credentials());
    assert!(e.contains("environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set; shared files: no keys for profile \"default\""), "{e}");
    assert!(e.ends_with("instance role: not asked, AWS_EC2_METADATA_DISABLED is true"), "{e}");
}

#[test]
fn provider_ec2_unreachable_endpoint_is_transient_and_named() {
    let p = offline(instance_config(), &[("AWS_ACCESS_KEY_ID", "AKID"), ("AWS_SECRET_ACCESS_KEY", "s3cret")]);
    let e = p.describe("gpu-1").unwrap_err();
    assert!(crate::provider::Retryable::is_transient(&e), "{e}");
    let text = e.to_string();
    println!("{text}");
    assert!(
        text.starts_with("cannot describe host gpu-1: EC2 DescribeInstances failed: connection: "),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
    let req = LaunchRequest {
        name: "gpu-1".into(),
        server: "http://cp".into(),
        join_token: "tok".into(),
        pool: "other".into(),
        ..Default::default()
    };
    let e = p.launch(&req).unwrap_err().to_string();
    assert_eq!(e, "cannot launch host gpu-1: the request is for pool other, and this provider launches the hosts of pool train");
    assert!(p.hosts().is_empty());
    // User data over EC2's 16 KiB is refused before any call (this endpoint answers none).
    let long = LaunchRequest { pool: String::new(), agent_args: vec!["x".repeat(MAX_USER_DATA)], ..req };
    let e = p.launch(&long).unwrap_err();
    assert!(matches!(e, ProviderError::Launch { .. }), "{e}");
    assert!(e.to_string().contains("more than EC2's 16384"), "{e}");
    assert!(!e.to_string().contains("tok"), "{e}");
}

#[test]
fn provider_ec2_ini_sections() {
    let text = "[default]\na = 1\n[ profile   x ]\nA = 2\n  b = nested\n; c = 3\n[default]\nd=4\n";
    let d = ini_section(text, "default").unwrap();
    assert_eq!((d.get("a").map(String::as_str), d.get("d").map(String::as_str)), (Some("1"), Some("4")));
    let x = ini_section(text, "profile x").unwrap();
    assert_eq!(x.len(), 1);
    assert_eq!(x["a"], "2");
    assert!(ini_section(text, "profile y").is_none());
}
