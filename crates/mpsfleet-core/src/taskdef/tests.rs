use super::*;
use serde_json::json;

/// Asserts that `json` is refused at `field` with a message containing every one of `words`.
#[track_caller]
fn check(json: &str, field: &str, words: &[&str]) {
    match parse_task_definition(json.as_bytes()) {
        Ok(p) => panic!("accepted, expected {field}: {words:?}\ninput: {json}\nparsed: {p:?}"),
        Err(all) => {
            let e = all.first();
            assert_eq!(e.field, field, "wrong field for {json}\nerror: {all}");
            for w in words {
                assert!(e.message.contains(w), "message {:?} lacks {w:?}\ninput: {json}", e.message);
            }
        }
    }
}

#[track_caller]
fn ok(json: &str) -> ParsedTaskDefinition {
    parse_task_definition(json.as_bytes()).unwrap_or_else(|e| panic!("refused: {e}\ninput: {json}"))
}

/// A container `a` running `run`, with `patch` merged in; a null in the patch removes the key.
fn container(patch: Value) -> Value {
    let mut c = json!({"name": "a", "command": ["run"]});
    if let (Some(t), Value::Object(p)) = (c.as_object_mut(), patch) {
        for (k, v) in p {
            if v.is_null() {
                t.remove(&k);
            } else {
                t.insert(k, v);
            }
        }
    }
    c
}

fn task_in(mode: Option<&str>, containers: Vec<Value>) -> String {
    let mut t = json!({"family": "f", "containerDefinitions": containers});
    if let (Some(m), Some(o)) = (mode, t.as_object_mut()) {
        o.insert("networkMode".to_string(), json!(m));
    }
    t.to_string()
}

fn one(patch: Value) -> String {
    task_in(None, vec![container(patch)])
}

fn ports_in(mode: Option<&str>, ports: Value) -> String {
    task_in(mode, vec![container(json!({"portMappings": ports}))])
}

fn c0(key: &str) -> String {
    format!("containerDefinitions[0].{key}")
}

// ---- image ----

#[test]
fn image_is_required_only_without_command_and_entry_point() {
    let words = &["is required when neither command nor entryPoint is given"];
    check(&one(json!({"command": null})), &c0("image"), words);
    check(&one(json!({"command": [], "entryPoint": []})), &c0("image"), words);
    let p = ok(&one(json!({"command": null, "image": "nginx:1.25"})));
    let c = &p.definition.container_definitions[0];
    assert_eq!(c.image.as_deref(), Some("nginx:1.25"));
    assert!(c.command.is_empty() && c.entry_point.is_empty());
    assert!(p.definition.needs_container_runtime());
    assert!(p.ignored_fields.is_empty(), "{:?}", p.ignored_fields);
    // With a command the image is optional, and kept when given.
    assert_eq!(ok(&one(json!({}))).definition.container_definitions[0].image, None);
    let p = ok(&one(json!({"entryPoint": ["sh"], "command": null, "image": "busybox"})));
    assert_eq!(p.definition.container_definitions[0].image.as_deref(), Some("busybox"));
    assert!(!p.definition.needs_container_runtime());
}

#[test]
fn plausible_docker_references_are_accepted() {
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    for image in [
        "busybox".to_string(),
        "library/busybox:1.36".to_string(),
        "public.ecr.aws/docker/library/httpd:2.4".to_string(),
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/serve:v1.2_rc-3".to_string(),
        "127.0.0.1:5000/busybox:latest".to_string(),
        "localhost/app".to_string(),
        "localhost:5000/a__b/c-d--e.f_g".to_string(),
        "Registry.Example.COM/x".to_string(),
        format!("vllm/vllm-openai@{digest}"),
        format!("ghcr.io/o/r:_t@{digest}"),
        format!("{}:{}", "a".repeat(MAX_IMAGE_NAME_BYTES), "t".repeat(MAX_IMAGE_TAG_BYTES)),
    ] {
        let p = ok(&one(json!({"image": image})));
        assert_eq!(p.definition.container_definitions[0].image.as_deref(), Some(image.as_str()));
    }
}

#[test]
fn implausible_docker_references_are_refused_naming_what_is_wrong() {
    let f = c0("image");
    let digest = "0123456789abcdef".repeat(4);
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (json!(""), vec!["must not be empty"]),
        (json!(5), vec!["must be a string, got 5"]),
        (json!("a".repeat(MAX_IMAGE_BYTES + 1)), vec!["at most 1024 bytes, got 1025 bytes"]),
        (json!("a".repeat(MAX_IMAGE_NAME_BYTES + 1)), vec!["repository name", "at most 255", "got 256"]),
        (json!("nginx latest"), vec!["whitespace or control characters"]),
        (json!("nginx\t"), vec!["whitespace"]),
        (json!("ngi\u{7}nx"), vec!["control characters"]),
        (json!("Nginx"), vec!["path component \"Nginx\"", "lowercase"]),
        (json!("library/Nginx"), vec!["\"Nginx\"", "lowercase"]),
        (json!("a//b"), vec!["path component \"\""]),
        (json!("a/"), vec!["path component \"\""]),
        (json!("-a"), vec!["\"-a\""]),
        (json!("a..b"), vec!["\"a..b\""]),
        (json!("a___b"), vec!["\"a___b\""]),
        (json!("a.-b"), vec!["\"a.-b\""]),
        (json!("nginx:"), vec!["the tag after ':'"]),
        (json!("nginx:-x"), vec!["the tag", "not starting with"]),
        (json!("nginx:a+b"), vec!["the tag"]),
        (json!(format!("nginx:{}", "t".repeat(129))), vec!["the tag", "1 to 128"]),
        (json!(":latest"), vec!["must start with a repository name"]),
        (json!("nginx@sha256:abc"), vec!["sha256: followed by 64 lowercase hex"]),
        (json!(format!("nginx@md5:{digest}")), vec!["digest"]),
        (json!(format!("nginx@sha256:{}", digest.to_uppercase())), vec!["lowercase hex"]),
        (json!(format!("nginx@sha256:{digest}@sha256:{digest}")), vec!["digest"]),
        (json!("bad_host.com:50x0/a"), vec!["the registry \"bad_host.com:50x0\""]),
        (json!("-x.com/a"), vec!["the registry"]),
        (json!("x.com:/a"), vec!["the registry"]),
    ];
    for (image, words) in cases {
        check(&one(json!({"image": image})), &f, &words);
    }
    // A null is a type error, not a missing image (the patch helper would drop it).
    let doc =
        json!({"family": "f", "containerDefinitions": [{"name": "a", "command": ["x"], "image": null}]});
    check(&doc.to_string(), &f, &["must be a string, got null"]);
}

// ---- cpu and memory ----

#[test]
fn cpu_units_from_0_to_262144() {
    for cpu in [0u32, 1, 1024, 262_144] {
        assert_eq!(ok(&one(json!({"cpu": cpu}))).definition.container_definitions[0].cpu, Some(cpu));
    }
    let f = c0("cpu");
    check(&one(json!({"cpu": 262_145})), &f, &["from 0 to 262144 CPU units", "got 262145"]);
    check(&one(json!({"cpu": -1})), &f, &["from 0 to 262144", "got -1"]);
    check(&one(json!({"cpu": 1.5})), &f, &["must be an integer", "got 1.5"]);
    check(&one(json!({"cpu": "1024"})), &f, &["must be an integer", "got \"1024\""]);
}

#[test]
fn memory_and_reservation_from_6_mib_reservation_below_memory() {
    let p = ok(&one(json!({"memory": 512, "memoryReservation": 256})));
    let c = &p.definition.container_definitions[0];
    assert_eq!((c.memory, c.memory_reservation), (Some(512), Some(256)));
    assert_eq!(ok(&one(json!({"memory": 6}))).definition.container_definitions[0].memory, Some(6));
    let top = MAX_CONTAINER_MEMORY_MIB;
    let p = ok(&one(json!({"memoryReservation": top})));
    assert_eq!(p.definition.container_definitions[0].memory_reservation, Some(top));
    for key in ["memory", "memoryReservation"] {
        let f = c0(key);
        check(&one(json!({key: 5})), &f, &["from 6 to 16777216 MiB", "Docker needs at least 6 MiB", "got 5"]);
        check(&one(json!({key: 0})), &f, &["got 0"]);
        check(&one(json!({key: top + 1})), &f, &["got 16777217"]);
        check(&one(json!({key: "512"})), &f, &["must be an integer", "got \"512\""]);
        check(&one(json!({key: 512.0})), &f, &["must be an integer"]);
    }
    let f = c0("memoryReservation");
    check(
        &one(json!({"memory": 512, "memoryReservation": 512})),
        &f,
        &["less than memory (512 MiB)", "memoryReservation 512 MiB"],
    );
    check(&one(json!({"memory": 256, "memoryReservation": 1024})), &f, &["(256 MiB)", "1024 MiB"]);
}

// ---- workingDirectory ----

#[test]
fn working_directory_absolute_bounded_no_nul() {
    let p = ok(&one(json!({"workingDirectory": "/srv/app"})));
    assert_eq!(p.definition.container_definitions[0].working_directory.as_deref(), Some("/srv/app"));
    let long = format!("/{}", "d".repeat(MAX_WORKING_DIRECTORY_BYTES - 1));
    assert!(ok(&one(json!({"workingDirectory": long}))).definition.container_definitions[0]
        .working_directory
        .is_some());
    let f = c0("workingDirectory");
    check(
        &one(json!({"workingDirectory": "srv"})),
        &f,
        &["absolute path", "Docker refuses relative", "\"srv\""],
    );
    check(&one(json!({"workingDirectory": "./x"})), &f, &["absolute path"]);
    check(&one(json!({"workingDirectory": ""})), &f, &["must not be empty"]);
    check(&one(json!({"workingDirectory": "/a\u{0}b"})), &f, &["NUL"]);
    check(&one(json!({"workingDirectory": 1})), &f, &["must be a string"]);
    let too_long = format!("/{}", "d".repeat(MAX_WORKING_DIRECTORY_BYTES));
    check(&one(json!({"workingDirectory": too_long})), &f, &["at most 4096 bytes, got 4097 bytes"]);
}

// ---- dockerLabels ----

#[test]
fn docker_labels_string_to_string_bounded() {
    let p = ok(&one(json!({"dockerLabels": {"com.example.team": "ml", "empty": ""}})));
    let labels = &p.definition.container_definitions[0].docker_labels;
    assert_eq!(labels.get("com.example.team").map(String::as_str), Some("ml"));
    assert_eq!(labels.get("empty").map(String::as_str), Some(""));
    assert!(p.definition.needs_container_runtime());
    let f = c0("dockerLabels");
    check(&one(json!({"dockerLabels": []})), &f, &["must be an object, got an empty array"]);
    check(&one(json!({"dockerLabels": {"a": 1}})), &format!("{f}[\"a\"]"), &["must be a string, got 1"]);
    check(&one(json!({"dockerLabels": {"": "v"}})), &format!("{f}[\"\"]"), &["key must not be empty"]);
    let key = "k".repeat(MAX_LABEL_KEY_BYTES + 1);
    let mut labels = Map::new();
    labels.insert(key.clone(), json!("v"));
    check(
        &one(json!({"dockerLabels": labels})),
        &format!("{f}[{}]", quote(&key)),
        &["at most 255 bytes, got 256"],
    );
    check(
        &one(json!({"dockerLabels": {"a": "v".repeat(MAX_LABEL_VALUE_BYTES + 1)}})),
        &format!("{f}[\"a\"]"),
        &["value must be at most 4096 bytes, got 4097"],
    );
    assert!(ok(&one(json!({"dockerLabels": {"a": "v".repeat(MAX_LABEL_VALUE_BYTES)}})))
        .ignored_fields
        .is_empty());
    check(&one(json!({"dockerLabels": {"a\u{0}": "v"}})), &format!("{f}[\"a\\u0000\"]"), &["key", "NUL"]);
    check(&one(json!({"dockerLabels": {"a": "v\u{0}"}})), &format!("{f}[\"a\"]"), &["value", "NUL"]);
    check(
        &one(json!({"dockerLabels": {"ok": "1", "io.mpsfleet.task": "x"}})),
        &format!("{f}[\"io.mpsfleet.task\"]"),
        &["reserved", "io.mpsfleet."],
    );
    // Only the prefix is reserved.
    assert!(ok(&one(json!({"dockerLabels": {"io.mpsfleetx": "1", "io.other": "2"}})))
        .ignored_fields
        .is_empty());
    let many: Map<String, Value> = (0..=MAX_DOCKER_LABELS).map(|i| (format!("k{i}"), json!("v"))).collect();
    check(&one(json!({"dockerLabels": many})), &f, &["at most 256 labels, got 257"]);
    let most: Map<String, Value> = (0..MAX_DOCKER_LABELS).map(|i| (format!("k{i}"), json!("v"))).collect();
    let p = ok(&one(json!({"dockerLabels": most})));
    assert_eq!(p.definition.container_definitions[0].docker_labels.len(), MAX_DOCKER_LABELS);
}

// ---- portMappings ----

#[test]
fn port_mappings_parse_with_defaults() {
    let p = ok(&ports_in(
        None,
        json!([
            {"containerPort": 80},
            {"containerPort": 443, "hostPort": 8443, "protocol": "tcp", "name": "https_Main-1"},
            {"containerPort": 53, "hostPort": 0, "protocol": "udp"},
            {"containerPort": 53, "protocol": "tcp"}
        ]),
    ));
    let m = &p.definition.container_definitions[0].port_mappings;
    assert_eq!(
        m,
        &[
            PortMapping { container_port: 80, host_port: None, protocol: Protocol::Tcp, name: None },
            PortMapping {
                container_port: 443,
                host_port: Some(8443),
                protocol: Protocol::Tcp,
                name: Some("https_Main-1".to_string()),
            },
            PortMapping { container_port: 53, host_port: None, protocol: Protocol::Udp, name: None },
            PortMapping { container_port: 53, host_port: None, protocol: Protocol::Tcp, name: None },
        ]
    );
    assert_eq!(p.definition.static_host_ports(), [(Protocol::Tcp, 8443)]);
    assert_eq!(p.definition.network_mode, None);
    assert!(p.ignored_fields.is_empty(), "{:?}", p.ignored_fields);
}

#[test]
fn port_mapping_fields_are_checked() {
    let pm = |m: Value| ports_in(None, json!([m]));
    let at = |key: &str| c0(&format!("portMappings[0].{key}"));
    check(&ports_in(None, json!({})), &c0("portMappings"), &["must be an array, got an object"]);
    check(&ports_in(None, json!([80])), &c0("portMappings[0]"), &["must be an object, got 80"]);
    check(&pm(json!({})), &at("containerPort"), &["is required"]);
    check(&pm(json!({"hostPort": 80})), &at("containerPort"), &["is required"]);
    for bad in [json!(0), json!(65536), json!(-1), json!("80"), json!(80.5)] {
        check(&pm(json!({"containerPort": bad})), &at("containerPort"), &["from 1 to 65535"]);
    }
    for bad in [json!(65536), json!(-1), json!("80")] {
        check(&pm(json!({"containerPort": 80, "hostPort": bad})), &at("hostPort"), &["from 0 to 65535"]);
    }
    let p = ok(&pm(json!({"containerPort": 65535, "hostPort": 65535})));
    assert_eq!(p.definition.container_definitions[0].port_mappings[0].host_port, Some(65535));
    for bad in [json!("TCP"), json!("sctp"), json!(6)] {
        check(&pm(json!({"containerPort": 80, "protocol": bad})), &at("protocol"), &["must be tcp or udp"]);
    }
    for bad in ["", "a.b", "a b", &"n".repeat(MAX_PORT_NAME_BYTES + 1)] {
        check(&pm(json!({"containerPort": 80, "name": bad})), &at("name"), &["1 to 64 letters, digits"]);
    }
    check(&pm(json!({"containerPort": 80, "name": 1})), &at("name"), &["must be a string"]);
    let name = "n".repeat(MAX_PORT_NAME_BYTES);
    let p = ok(&pm(json!({"containerPort": 80, "name": name})));
    assert_eq!(p.definition.container_definitions[0].port_mappings[0].name.as_deref(), Some(name.as_str()));
    check(&pm(json!({"containerPort": 80, "hostIp": "0.0.0.0"})), &at("hostIp"), &["unknown field"]);
    let many: Vec<Value> = (1..=MAX_PORT_MAPPINGS + 1).map(|p| json!({"containerPort": p})).collect();
    check(&ports_in(None, json!(many)), &c0("portMappings"), &["at most 100 port mappings, got 101"]);
    let most: Vec<Value> = (1..=MAX_PORT_MAPPINGS).map(|p| json!({"containerPort": p})).collect();
    assert_eq!(ok(&ports_in(None, json!(most))).definition.container_definitions[0].port_mappings.len(), 100);
}

#[test]
fn port_range_and_app_protocol_are_reported_ignored() {
    let p = ok(&ports_in(
        None,
        json!([
            {"containerPort": 80},
            {"containerPort": 8080, "appProtocol": "http", "name": "web"},
            {"containerPort": 9000, "containerPortRange": "9000-9010", "hostPortRange": "9000-9010"}
        ]),
    ));
    assert_eq!(
        p.ignored_fields,
        [
            "containerDefinitions[0].portMappings[1].appProtocol",
            "containerDefinitions[0].portMappings[2].containerPortRange",
            "containerDefinitions[0].portMappings[2].hostPortRange",
        ]
    );
}

#[test]
fn duplicate_container_ports_in_one_container_are_refused() {
    check(
        &ports_in(
            None,
            json!([{"containerPort": 80}, {"containerPort": 81}, {"containerPort": 80, "protocol": "tcp"}]),
        ),
        &c0("portMappings[2].containerPort"),
        &["duplicate containerPort 80/tcp", "containerDefinitions[0].portMappings[0]"],
    );
    // Another protocol, or another container, may reuse the port.
    ok(&ports_in(None, json!([{"containerPort": 53}, {"containerPort": 53, "protocol": "udp"}])));
    ok(&task_in(
        None,
        vec![
            container(json!({"portMappings": [{"containerPort": 80}]})),
            container(json!({"name": "b", "portMappings": [{"containerPort": 80}]})),
        ],
    ));
}

#[test]
fn duplicate_static_host_ports_in_the_task_are_refused() {
    check(
        &task_in(
            None,
            vec![
                container(json!({"portMappings": [{"containerPort": 80, "hostPort": 8080}]})),
                container(json!({"name": "b", "portMappings": [
                    {"containerPort": 81, "hostPort": 0},
                    {"containerPort": 90, "hostPort": 8080}
                ]})),
            ],
        ),
        "containerDefinitions[1].portMappings[1].hostPort",
        &["host port 8080/tcp", "already taken by containerDefinitions[0].portMappings[0].hostPort"],
    );
    check(
        &ports_in(None, json!([{"containerPort": 80, "hostPort": 9}, {"containerPort": 81, "hostPort": 9}])),
        &c0("portMappings[1].hostPort"),
        &["already taken by containerDefinitions[0].portMappings[0].hostPort"],
    );
    // Dynamic host ports never clash; udp and tcp are separate.
    let p = ok(&ports_in(
        None,
        json!([
            {"containerPort": 80, "hostPort": 0},
            {"containerPort": 81, "hostPort": 0},
            {"containerPort": 82, "hostPort": 9, "protocol": "udp"},
            {"containerPort": 83, "hostPort": 9}
        ]),
    ));
    assert_eq!(p.definition.static_host_ports(), [(Protocol::Tcp, 9), (Protocol::Udp, 9)]);
}

#[test]
fn network_mode_is_one_of_four() {
    for (mode, want) in [
        ("bridge", NetworkMode::Bridge),
        ("host", NetworkMode::Host),
        ("none", NetworkMode::None),
        ("awsvpc", NetworkMode::Awsvpc),
    ] {
        let p = ok(&task_in(Some(mode), vec![container(json!({}))]));
        assert_eq!(p.definition.network_mode, Some(want));
        assert!(p.ignored_fields.is_empty(), "{:?}", p.ignored_fields);
    }
    let words = &["must be one of bridge, host, none, awsvpc"];
    for bad in [json!("nat"), json!("Host"), json!(""), json!(null), json!(1)] {
        let doc = json!({"family": "f", "networkMode": bad, "containerDefinitions": [container(json!({}))]});
        check(&doc.to_string(), "networkMode", words);
    }
    check(&task_in(Some("nat"), vec![container(json!({}))]), "networkMode", &["got \"nat\""]);
}

#[test]
fn host_mode_host_port_equals_container_port() {
    check(
        &ports_in(Some("host"), json!([{"containerPort": 80, "hostPort": 8080}])),
        &c0("portMappings[0].hostPort"),
        &["must equal containerPort (80)", "networkMode host", "hostPort 8080"],
    );
    let p = ok(&ports_in(
        Some("host"),
        json!([{"containerPort": 80, "hostPort": 80}, {"containerPort": 81}, {"containerPort": 82, "hostPort": 0}]),
    ));
    assert_eq!(
        p.definition.static_host_ports(),
        [(Protocol::Tcp, 80), (Protocol::Tcp, 81), (Protocol::Tcp, 82)]
    );
    assert!(p.definition.needs_container_runtime());
    // In host mode every port is the host's: two containers cannot both take 80.
    check(
        &task_in(
            Some("host"),
            vec![
                container(json!({"portMappings": [{"containerPort": 80}]})),
                container(json!({"name": "b", "portMappings": [{"containerPort": 80, "hostPort": 80}]})),
            ],
        ),
        "containerDefinitions[1].portMappings[0].hostPort",
        &["host port 80/tcp", "already taken by containerDefinitions[0].portMappings[0].containerPort"],
    );
    check(
        &task_in(
            Some("host"),
            vec![
                container(json!({"portMappings": [{"containerPort": 80, "hostPort": 80}]})),
                container(json!({"name": "b", "portMappings": [{"containerPort": 80}]})),
            ],
        ),
        "containerDefinitions[1].portMappings[0].containerPort",
        &["already taken by containerDefinitions[0].portMappings[0].hostPort"],
    );
    // In bridge mode the same two containers are fine: their host ports are Docker's choice.
    ok(&task_in(
        Some("bridge"),
        vec![
            container(json!({"portMappings": [{"containerPort": 80}]})),
            container(json!({"name": "b", "portMappings": [{"containerPort": 80}]})),
        ],
    ));
    ok(&ports_in(Some("bridge"), json!([{"containerPort": 80, "hostPort": 8080}])));
}

#[test]
fn none_mode_has_no_port_mappings() {
    check(
        &ports_in(Some("none"), json!([{"containerPort": 80}])),
        &c0("portMappings"),
        &["must be empty in networkMode none", "1 port mapping"],
    );
    check(
        &task_in(
            Some("none"),
            vec![
                container(json!({})),
                container(json!({"name": "b", "portMappings": [{"containerPort": 1}]})),
            ],
        ),
        "containerDefinitions[1].portMappings",
        &["networkMode none"],
    );
    let p = ok(&ports_in(Some("none"), json!([])));
    assert!(p.definition.container_definitions[0].port_mappings.is_empty());
    assert_eq!(p.definition.network_mode, Some(NetworkMode::None));
}

#[test]
fn awsvpc_host_port_equals_container_port_or_is_absent() {
    check(
        &ports_in(Some("awsvpc"), json!([{"containerPort": 80, "hostPort": 8080}])),
        &c0("portMappings[0].hostPort"),
        &["must equal containerPort (80)", "networkMode awsvpc", "hostPort 8080"],
    );
    let p =
        ok(&ports_in(Some("awsvpc"), json!([{"containerPort": 80, "hostPort": 80}, {"containerPort": 443}])));
    assert_eq!(p.definition.network_mode, Some(NetworkMode::Awsvpc));
    assert_eq!(p.definition.container_definitions[0].port_mappings[0].host_port, Some(80));
    // awsvpc: the ports are on the task's own address, no host port is held.
    assert!(p.definition.static_host_ports().is_empty());
}

#[test]
fn used_fields_are_no_longer_reported_ignored() {
    let p = ok(&task_in(
        Some("bridge"),
        vec![container(json!({
            "image": "x",
            "cpu": 256,
            "memory": 512,
            "memoryReservation": 128,
            "workingDirectory": "/w",
            "dockerLabels": {"a": "b"},
            "portMappings": [{"containerPort": 80}],
            "links": ["b"]
        }))],
    ));
    assert_eq!(p.ignored_fields, ["containerDefinitions[0].links"]);
}

fn arb_field() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (0u64..70_000).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec!["tcp", "udp", "/w", "w", "a:b", "a@sha256:0", "io.mpsfleet.x", "", "é"])
            .prop_map(Value::from),
        "[a-zA-Z0-9./:@_-]{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        let key = prop::sample::select(vec![
            "containerPort",
            "hostPort",
            "protocol",
            "name",
            "appProtocol",
            "k",
            "io.mpsfleet.k",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key.prop_map(str::to_string), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// Whatever the new fields hold, the validator answers without panicking, its errors
    /// name a field, and what it accepts registers again to the same definition.
    #[test]
    fn new_fields_never_panic_and_round_trip(
        mode in proptest::sample::select(vec![None, Some("bridge"), Some("host"), Some("none"), Some("awsvpc")]),
        fields in proptest::collection::btree_map(
            proptest::sample::select(vec![
                "image", "cpu", "memory", "memoryReservation", "workingDirectory",
                "dockerLabels", "portMappings", "command",
            ]),
            arb_field(),
            0..5,
        ),
    ) {
        let patch: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let doc = task_in(mode, vec![container(Value::Object(patch))]);
        match parse_task_definition(doc.as_bytes()) {
            Ok(p) => {
                let text = serde_json::to_vec(&p.definition).unwrap_or_default();
                let again = parse_task_definition(&text).map(|a| a.definition);
                proptest::prop_assert_eq!(again, Ok(p.definition));
            }
            Err(e) => proptest::prop_assert!(!e.first().field.is_empty() && !e.first().message.is_empty()),
        }
    }
}

#[test]
fn described_definition_with_the_new_fields_registers_again() {
    let p = ok(&task_in(
        Some("host"),
        vec![container(json!({
            "image": "127.0.0.1:5000/busybox:latest",
            "command": null,
            "cpu": 0,
            "memory": 64,
            "memoryReservation": 32,
            "workingDirectory": "/tmp",
            "dockerLabels": {"k": "v"},
            "portMappings": [{"containerPort": 80, "hostPort": 0, "protocol": "udp", "name": "p"}]
        }))],
    ));
    let text = serde_json::to_string(&p.definition).unwrap_or_default();
    let again = ok(&text);
    assert_eq!(again.definition, p.definition);
    assert_eq!(again.ignored_fields, ["registeredAtMs", "revision"]);
}
