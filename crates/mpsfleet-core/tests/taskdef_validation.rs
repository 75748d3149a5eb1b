//! Task definition validation: every rule refused with its field and message, plus happy paths.
//! Tests live in `mod taskdef` so that `cargo test -p mpsfleet-core taskdef` selects them.

mod taskdef {
    use mpsfleet_core::taskdef::{parse_task_definition, ParsedTaskDefinition, MAX_ERRORS};
    use mpsfleet_types::{GpuDemand, GpuRequirement, HealthCheck, KeyValuePair};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    // ---- helpers ----

    /// Asserts that `json` is refused at `field` with a message containing `message`.
    #[track_caller]
    fn check(json: &str, field: &str, message: &str) {
        match parse_task_definition(json.as_bytes()) {
            Ok(p) => panic!("accepted, expected {field}: {message}\ninput: {json}\nparsed: {p:?}"),
            Err(all) => {
                let e = all.first();
                assert_eq!(e.field, field, "wrong field for {json}\nerror: {all}");
                assert!(
                    e.message.contains(message),
                    "message {:?} lacks {message:?}\ninput: {json}",
                    e.message
                );
                let first_line = all.to_string().lines().next().unwrap_or_default().to_string();
                assert_eq!(first_line, format!("{}: {}", e.field, e.message));
            }
        }
    }

    #[track_caller]
    fn ok(json: &str) -> ParsedTaskDefinition {
        parse_task_definition(json.as_bytes()).unwrap_or_else(|e| panic!("refused: {e}\ninput: {json}"))
    }

    /// A minimal valid container `a` with `patch` merged in; a null in the patch removes the key.
    fn container(patch: Value) -> Value {
        let mut c = json!({"name": "a", "command": ["run"]});
        merge(&mut c, patch);
        c
    }

    fn merge(target: &mut Value, patch: Value) {
        if let (Some(t), Value::Object(p)) = (target.as_object_mut(), patch) {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    t.insert(k, v);
                }
            }
        }
    }

    /// A task of the given containers.
    fn task(containers: Vec<Value>) -> String {
        json!({"family": "f", "containerDefinitions": containers}).to_string()
    }

    /// A task of one container `a` patched with `patch`.
    fn one(patch: Value) -> String {
        task(vec![container(patch)])
    }

    /// A task with top-level `patch` merged in.
    fn top(patch: Value) -> String {
        let mut t = json!({"family": "f", "containerDefinitions": [container(json!({}))]});
        merge(&mut t, patch);
        t.to_string()
    }

    fn gpu(entry: Value) -> String {
        one(json!({"resourceRequirements": [entry]}))
    }

    fn mps(memory: Value) -> Value {
        json!({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": memory}}})
    }

    fn mps_pct(memory: u64, percent: u64) -> Value {
        let nvidia_mps = json!({"memory": memory, "maxComputePercent": percent});
        json!({"type": "GPU", "sharingStrategy": {"nvidiaMps": nvidia_mps}})
    }

    const C0: &str = "containerDefinitions[0]";

    // ---- document and family ----

    #[test]
    fn invalid_json_names_the_document_with_line_and_column() {
        check("{\"family\": ", "$", "line 1 column");
        check("", "$", "invalid json");
        check("{\"family\": \"f\",\n}", "$", "line 2 column");
    }

    #[test]
    fn top_level_must_be_an_object() {
        check("[]", "$", "must be a json object, got an empty array");
        check("\"f\"", "$", "must be a json object, got \"f\"");
        check("null", "$", "got null");
    }

    #[test]
    fn family_is_required_and_checked() {
        check(&top(json!({"family": null})), "family", "is required");
        check(&top(json!({"family": 5})), "family", "must be a string, got 5");
        check(&top(json!({"family": ""})), "family", "must not be empty");
        check(&top(json!({"family": "a b"})), "family", "letters, digits, '-' and '_', got \"a b\"");
        check(
            &top(json!({"family": "x".repeat(256)})),
            "family",
            "at most 255 characters, got 256 characters",
        );
        assert_eq!(ok(&top(json!({"family": "x".repeat(255)}))).definition.family.as_str().len(), 255);
    }

    #[test]
    fn container_definitions_required_non_empty_at_most_ten_objects() {
        let cd = "containerDefinitions";
        check(&top(json!({cd: null})), cd, "is required");
        check(&top(json!({cd: {}})), cd, "must be an array, got an object");
        check(&top(json!({cd: []})), cd, "at least one container, got an empty array");
        let eleven: Vec<Value> = (0..11).map(|i| container(json!({"name": format!("c{i}")}))).collect();
        check(&task(eleven), cd, "at most 10 containers, got 11");
        let ten: Vec<Value> = (0..10).map(|i| container(json!({"name": format!("c{i}")}))).collect();
        assert_eq!(ok(&task(ten)).definition.container_definitions.len(), 10);
        check(
            &task(vec![container(json!({})), json!("b")]),
            "containerDefinitions[1]",
            "must be an object, got \"b\"",
        );
    }

    // ---- every error at once ----

    /// The fields and messages of every error of `json`, which must be refused.
    #[track_caller]
    fn all_errors(json: &str) -> Vec<(String, String)> {
        match parse_task_definition(json.as_bytes()) {
            Ok(p) => panic!("accepted: {p:?}\ninput: {json}"),
            Err(all) => all.errors().iter().map(|e| (e.field.clone(), e.message.clone())).collect(),
        }
    }

    #[test]
    fn several_mistakes_are_reported_in_one_answer() {
        let mps_path = "containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps";
        let doc = json!({
            "family": "f",
            "networkMode": "hots",
            "containerDefinitions": [
                container(json!({
                    "cpu": -1,
                    "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps":
                        {"computePercentage": 50, "memoryMiB": 20480}}}]
                })),
                container(json!({"name": "b", "environment": [{"name": "X"}]})),
            ]
        })
        .to_string();
        let errors = all_errors(&doc);
        let fields: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "networkMode".to_string(),
                format!("{C0}.cpu"),
                format!("{mps_path}.computePercentage"),
                format!("{mps_path}.memoryMiB"),
                format!("{mps_path}.memory"),
                "containerDefinitions[1].environment[0].value".to_string(),
            ],
            "{errors:#?}"
        );
        assert!(errors[2].1.starts_with("unknown field"), "{errors:#?}");
        assert_eq!(errors[4].1, "is required");
        // One line each, the first as a single error would have it.
        let text = parse_task_definition(doc.as_bytes()).unwrap_err().to_string();
        assert_eq!(text.lines().count(), 6, "{text}");
        assert!(text.starts_with("networkMode: must be one of bridge, host, none, awsvpc"), "{text}");
        assert!(text.contains(&format!("\n{mps_path}.memoryMiB: unknown field")), "{text}");
    }

    /// A list of objects reports each bad entry, and a repeat names the entry it repeats.
    #[test]
    fn every_bad_entry_of_a_list_of_objects_is_reported() {
        let doc = json!({
            "family": "f",
            "containerDefinitions": [container(json!({
                "ulimits": [
                    {"name": "nofile", "softLimit": 1, "hardLimit": 2},
                    {"name": "nofile", "softLimit": 1, "hardLimit": 2},
                    {"name": "stack", "softLimit": 5, "hardLimit": 2},
                ],
                "extraHosts": [{"hostname": "a", "ipAddress": "no"}, {"hostname": "b", "ipAddress": "10.0.0.1"}, {"hostname": "c"}],
            }))]
        })
        .to_string();
        let errors = all_errors(&doc);
        let fields: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                format!("{C0}.ulimits[1].name"),
                format!("{C0}.ulimits[2].softLimit"),
                format!("{C0}.extraHosts[0].ipAddress"),
                format!("{C0}.extraHosts[2].ipAddress"),
            ],
            "{errors:#?}"
        );
        assert_eq!(errors[0].1, format!("duplicate ulimit \"nofile\", already set by {C0}.ulimits[0]"));
    }

    #[test]
    fn an_unknown_field_lists_the_valid_names_at_its_path() {
        let mps_path = "containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps";
        let doc =
            gpu(json!({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024, "memoryMiB": 1}}}));
        assert_eq!(
            all_errors(&doc),
            [(
                format!("{mps_path}.memoryMiB"),
                "unknown field; valid names here: maxComputePercent, memory".into()
            )]
        );
        let (field, message) = all_errors(&gpu(json!({"type": "GPU", "count": 1, "value": "1"}))).remove(0);
        assert_eq!(field, "containerDefinitions[0].resourceRequirements[0].count");
        assert!(message.ends_with("valid names here: sharingStrategy, type, value"), "{message}");
        // The names ECS has that mpsfleet accepts without using them are valid names too.
        let (field, message) = all_errors(&top(json!({"famly": "f"}))).remove(0);
        assert_eq!(field, "famly");
        assert!(
            message.contains("containerDefinitions, cpu,") && message.contains("taskRoleArn"),
            "{message}"
        );
        let (_, message) = all_errors(&one(json!({"comand": ["x"]}))).remove(0);
        assert!(message.contains("command, cpu, credentialSpecs,"), "{message}");
    }

    #[test]
    fn every_bad_entry_of_a_list_is_reported() {
        let doc = json!({
            "family": "f",
            "volumes": [{"name": "a b"}, {"name": "ok"}, {"name": "ok"}],
            "containerDefinitions": [container(json!({
                "environment": [{"name": "A"}, {"name": "B", "value": "1"}, {"name": "", "value": "x"},
                                {"name": "B", "value": "2"}],
                "portMappings": [{"containerPort": 0}, {"containerPort": 80}, {"containerPort": 80}],
                "secrets": [{"name": "S"}, {"name": "T", "valueFrom": ""}],
                "mountPoints": [{"sourceVolume": "ok"}, {"sourceVolume": "ok", "containerPath": "x"}]
            }))]
        })
        .to_string();
        let fields: Vec<String> = all_errors(&doc).into_iter().map(|(f, _)| f).collect();
        let want = [
            "volumes[0].name",
            "volumes[2].name",
            "containerDefinitions[0].portMappings[0].containerPort",
            "containerDefinitions[0].portMappings[2].containerPort",
            "containerDefinitions[0].environment[0].value",
            "containerDefinitions[0].environment[2].name",
            "containerDefinitions[0].environment[3].name",
            "containerDefinitions[0].secrets[0].valueFrom",
            "containerDefinitions[0].secrets[1].valueFrom",
            "containerDefinitions[0].mountPoints[0].containerPath",
            "containerDefinitions[0].mountPoints[1].containerPath",
        ];
        assert_eq!(fields, want);
    }

    #[test]
    fn a_refused_container_causes_no_errors_in_the_others() {
        // `b` depends on `a`, which is refused: only a's own error is reported, not an unknown
        // dependency, nor "no essential container" for the one left.
        let doc = task(vec![
            container(json!({"essential": "yes"})),
            container(json!({"name": "b", "essential": false,
                "dependsOn": [{"containerName": "a", "condition": "START"}]})),
        ]);
        assert_eq!(
            all_errors(&doc),
            [(format!("{C0}.essential"), "must be true or false, got \"yes\"".to_string())]
        );
        // A command refused does not make the image required.
        let errors = all_errors(&one(json!({"command": "run"})));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, format!("{C0}.command"));
    }

    #[test]
    fn the_list_of_errors_is_bounded() {
        let mut doc = json!({"family": "f", "containerDefinitions": [container(json!({}))]});
        for i in 0..(MAX_ERRORS + 150) {
            doc[format!("unknown{i:04}")] = json!(1);
        }
        let all = parse_task_definition(doc.to_string().as_bytes()).unwrap_err();
        assert_eq!(all.errors().len(), MAX_ERRORS);
        assert_eq!(all.left_out(), 150);
        assert_eq!(all.first().field, "unknown0000");
        let text = all.to_string();
        assert_eq!(text.lines().count(), MAX_ERRORS + 1);
        assert!(text.ends_with("\nand 150 more errors"), "{}", &text[text.len() - 80..]);
    }

    // ---- valueFrom: any string, as ECS takes it ----

    #[test]
    fn value_from_is_any_string_as_ecs_takes_it() {
        // ECS's own agent tests register definitions with a placeholder there.
        let placeholder = "$$$SECRET_VALUE_FROM$$$";
        let p = ok(&one(json!({
            "secrets": [{"name": "S", "valueFrom": placeholder}, {"name": "T", "valueFrom": "has space / ü"}],
            "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": "g"},
                "secretOptions": [{"name": "awslogs-credentials", "valueFrom": placeholder}]},
            "repositoryCredentials": {"credentialsParameter": placeholder}
        })));
        let c = &p.definition.container_definitions[0];
        assert_eq!(c.secrets[0].value_from, placeholder);
        assert_eq!(c.secrets[1].value_from, "has space / ü");
        assert_eq!(c.log_configuration.as_ref().unwrap().secret_options[0].value_from, placeholder);
        assert_eq!(c.repository_credentials.as_ref().unwrap().credentials_parameter, placeholder);
        // The described definition registers again unchanged.
        let again = ok(&serde_json::to_string(&p.definition).unwrap());
        assert_eq!(again.definition, p.definition);
        // 1 to 2048 characters (not bytes).
        ok(&one(json!({"secrets": [{"name": "S", "valueFrom": "é".repeat(2048)}]})));
        let path = format!("{C0}.secrets[0].valueFrom");
        check(&one(json!({"secrets": [{"name": "S", "valueFrom": "é".repeat(2049)}]})), &path, "got 2049");
        check(
            &one(json!({"secrets": [{"name": "S", "valueFrom": ""}]})),
            &path,
            "must be 1 to 2048 characters",
        );
    }

    // ---- unknown and ignored fields ----

    #[test]
    fn unknown_fields_are_refused_everywhere() {
        check(&top(json!({"famly": "f"})), "famly", "unknown field");
        check(&one(json!({"comand": ["x"]})), "containerDefinitions[0].comand", "unknown field");
        check(
            &one(json!({"environment": [{"name": "A", "value": "1", "val": "2"}]})),
            "containerDefinitions[0].environment[0].val",
            "unknown field",
        );
        check(
            &one(json!({"healthCheck": {"command": ["CMD", "true"], "intervall": 10}})),
            "containerDefinitions[0].healthCheck.intervall",
            "unknown field",
        );
        check(
            &gpu(json!({"type": "GPU", "value": "1", "count": 1})),
            "containerDefinitions[0].resourceRequirements[0].count",
            "unknown field",
        );
        check(
            &gpu(json!({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1}, "mig": {}}})),
            "containerDefinitions[0].resourceRequirements[0].sharingStrategy.mig",
            "unknown field",
        );
        check(
            &gpu(json!({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memoryMiB": 1}}})),
            "containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.memoryMiB",
            "unknown field",
        );
    }

    #[test]
    fn known_ecs_fields_are_listed_as_ignored() {
        let p = ok(&json!({
            "family": "f",
            "taskRoleArn": "arn:aws:iam::1:role/r",
            "tags": [],
            "containerDefinitions": [
                container(json!({"image": "x", "workingDirectory": "/w", "interactive": false})),
                container(json!({"name": "b", "links": ["a"]}))
            ]
        })
        .to_string());
        let mut got = p.ignored_fields.clone();
        got.sort();
        assert_eq!(
            got,
            ["containerDefinitions[0].interactive", "containerDefinitions[1].links", "taskRoleArn",]
        );
        // Tags are the definition's own; a bad one is refused naming it.
        assert!(p.definition.tags.is_empty());
        let bad = json!({"family": "f", "tags": [{"key": "aws:x", "value": "1"}], "containerDefinitions": [container(json!({"image": "x"}))]});
        let e = parse_task_definition(bad.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.first().field, "tags[0].key", "{e}");
    }

    // ---- container fields ----

    #[test]
    fn container_name_required_valid_and_unique() {
        check(&one(json!({"name": null})), "containerDefinitions[0].name", "is required");
        check(&one(json!({"name": 1})), "containerDefinitions[0].name", "must be a string, got 1");
        check(&one(json!({"name": ""})), "containerDefinitions[0].name", "must not be empty");
        check(&one(json!({"name": "a/b"})), "containerDefinitions[0].name", "only letters, digits");
        check(
            &one(json!({"name": "n".repeat(300)})),
            "containerDefinitions[0].name",
            "at most 255 characters, got 300 characters",
        );
        check(
            &task(vec![container(json!({})), container(json!({"name": "b"})), container(json!({}))]),
            "containerDefinitions[2].name",
            "duplicate container name \"a\", already used by containerDefinitions[0]",
        );
    }

    #[test]
    fn command_or_entry_point_is_required() {
        let f = "containerDefinitions[0].command";
        let image = "containerDefinitions[0].image";
        check(&one(json!({"command": null})), image, "is required when neither command nor entryPoint");
        check(&one(json!({"command": [], "entryPoint": []})), image, "is required when neither");
        check(&one(json!({"command": "run"})), f, "must be an array, got \"run\"");
        check(
            &one(json!({"command": ["run", 5]})),
            "containerDefinitions[0].command[1]",
            "must be a string, got 5",
        );
        check(
            &one(json!({"entryPoint": [null]})),
            "containerDefinitions[0].entryPoint[0]",
            "must be a string, got null",
        );
        let p = ok(&one(json!({"command": null, "entryPoint": ["python", "-m", "serve"]})));
        let c = &p.definition.container_definitions[0];
        assert_eq!(c.entry_point, ["python", "-m", "serve"]);
        assert!(c.command.is_empty());
    }

    #[test]
    fn environment_is_name_value_pairs_without_duplicates() {
        let env = |e: Value| one(json!({"environment": e}));
        let f = "containerDefinitions[0].environment";
        check(&env(json!({"A": "1"})), f, "must be an array, got an object");
        check(&env(json!(["A=1"])), &format!("{f}[0]"), "must be an object, got \"A=1\"");
        check(&env(json!([{"value": "1"}])), &format!("{f}[0].name"), "is required");
        check(&env(json!([{"name": "A"}])), &format!("{f}[0].value"), "is required");
        check(&env(json!([{"name": "", "value": "1"}])), &format!("{f}[0].name"), "must not be empty");
        check(&env(json!([{"name": "A", "value": 1}])), &format!("{f}[0].value"), "must be a string, got 1");
        check(&env(json!([{"name": "A=B", "value": "1"}])), &format!("{f}[0].name"), "must not contain '='");
        check(
            &env(json!([
                {"name": "A", "value": "1"},
                {"name": "B", "value": "2"},
                {"name": "A", "value": "3"}
            ])),
            &format!("{f}[2].name"),
            "duplicate environment variable \"A\", already set by containerDefinitions[0].environment[0]",
        );
        let p = ok(&env(json!([{"name": "A", "value": ""}, {"name": "B", "value": "x=y"}])));
        assert_eq!(
            p.definition.container_definitions[0].environment,
            [
                KeyValuePair { name: "A".into(), value: "".into() },
                KeyValuePair { name: "B".into(), value: "x=y".into() }
            ]
        );
    }

    #[test]
    fn essential_is_bool_defaults_true_and_one_is_needed() {
        check(
            &one(json!({"essential": "yes"})),
            "containerDefinitions[0].essential",
            "must be true or false, got \"yes\"",
        );
        check(
            &task(vec![
                container(json!({"essential": false})),
                container(json!({"name": "b", "essential": false})),
            ]),
            "containerDefinitions",
            "at least one container must be essential",
        );
        let p = ok(&task(vec![container(json!({})), container(json!({"name": "b", "essential": false}))]));
        let cs = &p.definition.container_definitions;
        assert!(cs[0].essential);
        assert!(!cs[1].essential);
    }

    #[test]
    fn user_is_a_non_empty_string() {
        check(&one(json!({"user": 1000})), "containerDefinitions[0].user", "must be a string, got 1000");
        check(&one(json!({"user": ""})), "containerDefinitions[0].user", "must not be empty");
        let p = ok(&one(json!({"user": "1000:1000"})));
        assert_eq!(p.definition.container_definitions[0].user.as_deref(), Some("1000:1000"));
    }

    #[test]
    fn stop_timeout_is_an_integer_from_2_to_120() {
        let f = "containerDefinitions[0].stopTimeout";
        check(&one(json!({"stopTimeout": 1})), f, "must be an integer from 2 to 120 seconds, got 1");
        check(&one(json!({"stopTimeout": 121})), f, "from 2 to 120 seconds, got 121");
        check(&one(json!({"stopTimeout": 2.5})), f, "got 2.5");
        check(&one(json!({"stopTimeout": "30"})), f, "got \"30\"");
        check(&one(json!({"stopTimeout": -5})), f, "got -5");
        for t in [2, 120] {
            assert_eq!(
                ok(&one(json!({"stopTimeout": t}))).definition.container_definitions[0].stop_timeout,
                Some(t)
            );
        }
    }

    // ---- health, startup and readiness checks ----

    const CHECKS: [&str; 3] = ["healthCheck", "startupCheck", "readinessCheck"];

    #[test]
    fn checks_must_be_objects_with_a_command() {
        for key in CHECKS {
            let f = format!("{C0}.{key}");
            let with = |hc: Value| one(json!({key: hc}));
            check(&with(json!(["CMD", "true"])), &f, "must be an object, got an array");
            check(&with(json!({"interval": 10})), &format!("{f}.command"), "is required");
            check(&with(json!({"command": "CMD true"})), &format!("{f}.command"), "must be an array");
            check(&with(json!({"command": []})), &format!("{f}.command"), "must not be empty");
            check(
                &with(json!({"command": ["CMD", 1]})),
                &format!("{f}.command[1]"),
                "must be a string, got 1",
            );
        }
    }

    #[test]
    fn check_command_kinds_and_their_arguments() {
        for key in CHECKS {
            let f = format!("{C0}.{key}.command");
            let cmd = |c: Value| one(json!({key: {"command": c}}));
            check(
                &cmd(json!(["RUN", "x"])),
                &format!("{f}[0]"),
                "must be one of CMD, CMD-SHELL, HTTP-GET, TCP-CONNECT, got \"RUN\"",
            );
            check(&cmd(json!(["cmd", "x"])), &format!("{f}[0]"), "got \"cmd\"");
            check(&cmd(json!(["CMD"])), &f, "CMD needs the program");
            check(&cmd(json!(["CMD", ""])), &format!("{f}[1]"), "must not be empty");
            check(
                &cmd(json!(["CMD-SHELL"])),
                &f,
                "exactly one shell command string after it, got 0 elements",
            );
            check(&cmd(json!(["CMD-SHELL", "curl", "-f"])), &f, "got 2 elements");
            check(&cmd(json!(["CMD-SHELL", ""])), &format!("{f}[1]"), "must not be empty");
            check(&cmd(json!(["HTTP-GET"])), &f, "exactly one url after it, got 0 elements");
            check(&cmd(json!(["HTTP-GET", "http://a/", "x"])), &f, "got 2 elements");
            check(
                &cmd(json!(["HTTP-GET", "https://a/"])),
                &format!("{f}[1]"),
                "starting with http://, got \"https://a/\"",
            );
            check(&cmd(json!(["HTTP-GET", "http://"])), &format!("{f}[1]"), "starting with http://");
            check(&cmd(json!(["TCP-CONNECT"])), &f, "exactly one host:port after it, got 0 elements");
            for bad in [
                "localhost",
                "localhost:0",
                "localhost:65536",
                ":80",
                "h:x",
                "h:",
                "h:+80",
                "h:99999999999999999999",
            ] {
                check(
                    &cmd(json!(["TCP-CONNECT", bad])),
                    &format!("{f}[1]"),
                    "host:port with a port from 1 to 65535",
                );
            }
            for good in [
                json!(["CMD", "true"]),
                json!(["CMD", "/bin/check", "--fast"]),
                json!(["CMD-SHELL", "curl -f http://localhost/ || exit 1"]),
                json!(["HTTP-GET", "http://127.0.0.1:8080/healthz"]),
                json!(["TCP-CONNECT", "127.0.0.1:1"]),
                json!(["TCP-CONNECT", "[::1]:65535"]),
            ] {
                ok(&cmd(good));
            }
        }
    }

    #[test]
    fn check_times_are_integers_in_range() {
        let cases: [(&str, Value, &str); 14] = [
            ("interval", json!(4), "must be an integer from 5 to 300 seconds, got 4"),
            ("interval", json!(301), "from 5 to 300 seconds, got 301"),
            ("interval", json!(30.5), "got 30.5"),
            ("interval", json!("30"), "got \"30\""),
            ("timeout", json!(1), "must be an integer from 2 to 60 seconds, got 1"),
            ("timeout", json!(61), "got 61"),
            ("timeout", json!(null), "got null"),
            ("retries", json!(0), "must be an integer from 1 to 10, got 0"),
            ("retries", json!(11), "got 11"),
            ("retries", json!(true), "got true"),
            ("startPeriod", json!(-1), "must be an integer from 0 to 300 seconds, got -1"),
            ("startPeriod", json!(301), "got 301"),
            ("startPeriod", json!(1e2), "got 100.0"),
            ("startPeriod", json!([]), "got an empty array"),
        ];
        for key in CHECKS {
            for (field, value, message) in &cases {
                check(
                    &one(json!({key: {"command": ["CMD", "true"], *field: value}})),
                    &format!("{C0}.{key}.{field}"),
                    message,
                );
            }
        }
    }

    #[test]
    fn check_defaults_are_ecs_defaults() {
        let p = ok(&one(json!({
            "healthCheck": {"command": ["CMD-SHELL", "exit 0"]},
            "startupCheck": {
                "command": ["HTTP-GET", "http://localhost:8000/"], "startPeriod": 300, "interval": 5
            },
            "readinessCheck": {
                "command": ["TCP-CONNECT", "localhost:8000"],
                "timeout": 60, "retries": 10, "interval": 300, "startPeriod": 0
            }
        })));
        let c = &p.definition.container_definitions[0];
        let hc = |command: &[&str], interval, timeout, retries, start_period| HealthCheck {
            command: command.iter().map(|s| s.to_string()).collect(),
            interval,
            timeout,
            retries,
            start_period,
        };
        assert_eq!(c.health_check, Some(hc(&["CMD-SHELL", "exit 0"], 30, 5, 3, 0)));
        assert_eq!(c.startup_check, Some(hc(&["HTTP-GET", "http://localhost:8000/"], 5, 5, 3, 300)));
        assert_eq!(c.readiness_check, Some(hc(&["TCP-CONNECT", "localhost:8000"], 300, 60, 10, 0)));
        let none = ok(&one(json!({})));
        assert_eq!(none.definition.container_definitions[0].health_check, None);
    }

    // ---- resource requirements ----

    #[test]
    fn resource_requirements_are_typed_objects() {
        let f = "containerDefinitions[0].resourceRequirements";
        check(&one(json!({"resourceRequirements": {"type": "GPU"}})), f, "must be an array, got an object");
        check(&gpu(json!("GPU")), &format!("{f}[0]"), "must be an object, got \"GPU\"");
        check(&gpu(json!({"value": "1"})), &format!("{f}[0].type"), "is required");
        check(&gpu(json!({"type": 1, "value": "1"})), &format!("{f}[0].type"), "must be a string, got 1");
        check(
            &gpu(json!({"type": "gpu", "value": "1"})),
            &format!("{f}[0].type"),
            "must be GPU or InferenceAccelerator, got \"gpu\"",
        );
    }

    #[test]
    fn other_resource_types_are_ignored() {
        let p = ok(&one(json!({"resourceRequirements": [
            {"type": "InferenceAccelerator", "value": "device_1"},
            {"type": "GPU", "value": "1"}
        ]})));
        assert_eq!(p.ignored_fields, ["containerDefinitions[0].resourceRequirements[0]"]);
        let c = &p.definition.container_definitions[0];
        assert_eq!(c.resource_requirements.len(), 1);
        assert_eq!(c.gpu(), Some(&GpuRequirement::Whole { value: "1".into() }));
    }

    #[test]
    fn gpu_needs_exactly_one_of_value_and_sharing_strategy() {
        let f = "containerDefinitions[0].resourceRequirements[0]";
        check(
            &gpu(json!({"type": "GPU", "value": "1", "sharingStrategy": {"nvidiaMps": {"memory": 1}}})),
            f,
            "value and sharingStrategy cannot be used together",
        );
        check(&gpu(json!({"type": "GPU"})), f, "needs value");
    }

    #[test]
    fn gpu_value_is_a_count_from_1_to_64() {
        let f = "containerDefinitions[0].resourceRequirements[0].value";
        let cases: [(Value, &str); 10] = [
            (json!("0"), "must be a whole number of GPUs from 1 to 64, got \"0\""),
            (json!(0), "got 0"),
            (json!(-1), "got -1"),
            (json!("-1"), "got \"-1\""),
            (json!("1.5"), "got \"1.5\""),
            (json!(1.5), "got 1.5"),
            (json!(65), "from 1 to 64, got 65"),
            (json!("65"), "got \"65\""),
            (json!("two"), "got \"two\""),
            (json!("99999999999999999999999"), "got \"99999999999999999999999\""),
        ];
        for (value, message) in cases {
            check(&gpu(json!({"type": "GPU", "value": value})), f, message);
        }
        check(&gpu(json!({"type": "GPU", "value": ""})), f, "got \"\"");
        check(&gpu(json!({"type": "GPU", "value": null})), f, "got null");
    }

    #[test]
    fn whole_gpu_value_as_string_or_number_is_normalized() {
        for (value, count) in
            [(json!("2"), 2), (json!(2), 2), (json!("02"), 2), (json!(64), 64), (json!("1"), 1)]
        {
            let p = ok(&gpu(json!({"type": "GPU", "value": value})));
            let c = &p.definition.container_definitions[0];
            assert_eq!(c.gpu(), Some(&GpuRequirement::Whole { value: count.to_string() }));
            assert_eq!(p.definition.gpu_demand(), GpuDemand::Whole { count });
        }
        let p = ok(&task(vec![
            container(json!({"resourceRequirements": [{"type": "GPU", "value": "2"}]})),
            container(json!({"name": "b", "resourceRequirements": [{"type": "GPU", "value": 3}]})),
            container(json!({"name": "c"})),
        ]));
        assert_eq!(p.definition.gpu_demand(), GpuDemand::Whole { count: 5 });
    }

    #[test]
    fn sharing_strategy_is_nvidia_mps_with_memory_and_compute_limits() {
        let f = "containerDefinitions[0].resourceRequirements[0].sharingStrategy";
        let s = |ss: Value| gpu(json!({"type": "GPU", "sharingStrategy": ss}));
        check(&s(json!("mps")), f, "must be an object, got \"mps\"");
        check(&s(json!({})), &format!("{f}.nvidiaMps"), "is required");
        check(&s(json!({"nvidiaMps": 1024})), &format!("{f}.nvidiaMps"), "must be an object, got 1024");
        check(&s(json!({"nvidiaMps": {}})), &format!("{f}.nvidiaMps.memory"), "is required");
        let m = format!("{f}.nvidiaMps.memory");
        check(&gpu(mps(json!(0))), &m, "must be an integer from 1 to 16777216 (MiB), got 0");
        check(&gpu(mps(json!(16_777_217))), &m, "got 16777217");
        check(&gpu(mps(json!("1024"))), &m, "got \"1024\"");
        check(&gpu(mps(json!(1024.5))), &m, "got 1024.5");
        let p = format!("{f}.nvidiaMps.maxComputePercent");
        for (pct, got) in [
            (json!(0), "got 0"),
            (json!(101), "got 101"),
            (json!(150), "must be an integer from 1 to 100, got 150"),
            (json!(50.5), "got 50.5"),
        ] {
            check(&s(json!({"nvidiaMps": {"memory": 1024, "maxComputePercent": pct}})), &p, got);
        }
        ok(&gpu(mps(json!(16_777_216))));
    }

    #[test]
    fn one_gpu_entry_per_container() {
        check(
            &one(json!({"resourceRequirements": [{"type": "GPU", "value": "1"}, mps(json!(1))]})),
            "containerDefinitions[0].resourceRequirements[1]",
            "only one GPU entry, already given at containerDefinitions[0].resourceRequirements[0]",
        );
    }

    // ---- across containers ----

    #[test]
    fn gpu_containers_of_a_task_use_one_form() {
        check(
            &task(vec![
                container(json!({"name": "cpu"})),
                container(json!({"name": "w", "resourceRequirements": [{"type": "GPU", "value": "1"}]})),
                container(json!({"name": "m", "resourceRequirements": [
                    {"type": "InferenceAccelerator", "value": "x"},
                    mps(json!(1024))
                ]})),
            ]),
            "containerDefinitions[2].resourceRequirements[1]",
            "uses MPS (sharingStrategy) but container \"w\" uses whole GPUs (value)",
        );
        check(
            &task(vec![
                container(json!({"name": "m", "resourceRequirements": [mps(json!(1024))]})),
                container(json!({"name": "w", "resourceRequirements": [{"type": "GPU", "value": 1}]})),
            ]),
            "containerDefinitions[1].resourceRequirements[0]",
            "uses whole GPUs (value) but container \"m\" uses MPS (sharingStrategy)",
        );
    }

    #[test]
    fn mps_memory_of_a_task_adds_up_within_one_gpu() {
        check(
            &task(vec![
                container(json!({"resourceRequirements": [mps(json!(16_000_000))]})),
                container(json!({"name": "b", "resourceRequirements": [mps(json!(777_216))]})),
                container(json!({"name": "c", "resourceRequirements": [mps(json!(1))]})),
            ]),
            "containerDefinitions[2].resourceRequirements[0].sharingStrategy.nvidiaMps.memory",
            "ask for 16777217 MiB in all, more than the limit of 16777216 MiB",
        );
    }

    #[test]
    fn whole_gpu_total_of_a_task_is_at_most_64() {
        check(
            &task(vec![
                container(json!({"resourceRequirements": [{"type": "GPU", "value": "60"}]})),
                container(json!({"name": "b", "resourceRequirements": [{"type": "GPU", "value": 5}]})),
            ]),
            "containerDefinitions[1].resourceRequirements[0].value",
            "ask for 65 whole GPUs in all, more than the limit of 64",
        );
    }

    // ---- size limits ----

    fn env(n: usize) -> Value {
        Value::Array((0..n).map(|i| json!({"name": format!("V{i}"), "value": "x"})).collect())
    }

    fn args(n: usize) -> Value {
        Value::Array((0..n).map(|i| Value::String(format!("a{i}"))).collect())
    }

    #[test]
    fn document_is_at_most_256_kib() {
        use mpsfleet_core::taskdef::MAX_DOCUMENT_BYTES;
        // Padding inside an environment value, so that the document is valid but for its size.
        let sized = |len: usize| {
            let base = one(json!({"environment": [{"name": "PAD", "value": ""}]}));
            let pad = len - base.len();
            one(json!({"environment": [{"name": "PAD", "value": "x".repeat(pad)}]}))
        };
        assert_eq!(sized(MAX_DOCUMENT_BYTES).len(), MAX_DOCUMENT_BYTES);
        // At the limit the value is over its own limit; split it into values that are not.
        let chunks = |len: usize| {
            let base = one(json!({"environment": env(8)}));
            let per = (len - base.len()) / 8;
            let extra = (len - base.len()) % 8;
            let e: Vec<Value> = (0..8)
                .map(|i| json!({"name": format!("V{i}"), "value": format!("x{}", "y".repeat(per + usize::from(i == 0) * extra))}))
                .collect();
            one(json!({"environment": e}))
        };
        let at = chunks(MAX_DOCUMENT_BYTES);
        assert_eq!(at.len(), MAX_DOCUMENT_BYTES);
        ok(&at);
        let over = chunks(MAX_DOCUMENT_BYTES + 1);
        assert_eq!(over.len(), MAX_DOCUMENT_BYTES + 1);
        check(&over, "$", "must be at most 262144 bytes of JSON (ECS allows 65536), got 262145 bytes");
        // Refused by size before it is parsed: not even valid JSON is needed.
        check(&"[".repeat(MAX_DOCUMENT_BYTES + 1), "$", "at most 262144 bytes");
        check(&sized(MAX_DOCUMENT_BYTES + 1), "$", "at most 262144 bytes");
    }

    #[test]
    fn environment_has_at_most_4096_variables() {
        assert_eq!(
            ok(&one(json!({"environment": env(4096)}))).definition.container_definitions[0].environment.len(),
            4096
        );
        check(
            &one(json!({"environment": env(4097)})),
            "containerDefinitions[0].environment",
            "must have at most 4096 environment variables, got 4097",
        );
    }

    #[test]
    fn command_arrays_have_at_most_4096_elements() {
        ok(&one(json!({"command": args(4096)})));
        check(
            &one(json!({"command": args(4097)})),
            "containerDefinitions[0].command",
            "must have at most 4096 elements, got 4097",
        );
        check(
            &one(json!({"entryPoint": args(4097)})),
            "containerDefinitions[0].entryPoint",
            "must have at most 4096 elements, got 4097",
        );
        let mut probe = vec![Value::String("CMD".into())];
        probe.extend(args(4096).as_array().unwrap().iter().cloned());
        check(
            &one(json!({"healthCheck": {"command": probe}})),
            "containerDefinitions[0].healthCheck.command",
            "must have at most 4096 elements, got 4097",
        );
    }

    #[test]
    fn entries_of_all_containers_are_at_most_16384() {
        // Four containers of 4096 command elements each is the limit; one more is over. (Short
        // command elements are the only entries that many fit in the document limit.)
        let c = |i: usize| json!({"name": format!("c{i}"), "command": args(4096)});
        ok(&task((0..4).map(c).collect()));
        let mut over: Vec<Value> = (0..4).map(c).collect();
        over.push(json!({"name": "c4", "command": ["run"]}));
        check(
            &task(over),
            "containerDefinitions[4].command",
            "brings the definition to 16385 environment variables and command elements in all, more than the limit of 16384",
        );
    }

    #[test]
    fn strings_have_length_limits() {
        let big = "x".repeat(65_537);
        ok(&one(json!({"environment": [{"name": "A", "value": "x".repeat(65_536)}]})));
        check(
            &one(json!({"environment": [{"name": "A", "value": big}]})),
            "containerDefinitions[0].environment[0].value",
            "must be at most 65536 bytes, got 65537 bytes",
        );
        check(
            &one(json!({"command": ["run", big]})),
            "containerDefinitions[0].command[1]",
            "must be at most 65536 bytes, got 65537 bytes",
        );
        ok(&one(json!({"environment": [{"name": "N".repeat(4096), "value": ""}]})));
        check(
            &one(json!({"environment": [{"name": "N".repeat(4097), "value": ""}]})),
            "containerDefinitions[0].environment[0].name",
            "must be at most 4096 bytes, got 4097 bytes",
        );
        ok(&one(json!({"user": "u".repeat(255)})));
        check(
            &one(json!({"user": "u".repeat(256)})),
            "containerDefinitions[0].user",
            "must be at most 255 bytes, got 256 bytes",
        );
        check(
            &top(json!({"family": "f".repeat(256)})),
            "family",
            "at most 255 characters, got 256 characters",
        );
    }

    #[test]
    fn duplicate_environment_variable_at_the_end_of_the_largest_environment() {
        let mut e = env(4096);
        e.as_array_mut().unwrap()[4095] = json!({"name": "V0", "value": "again"});
        check(
            &one(json!({"environment": e})),
            "containerDefinitions[0].environment[4095].name",
            "duplicate environment variable \"V0\", already set by containerDefinitions[0].environment[0]",
        );
    }

    // ---- happy paths ----

    #[test]
    fn realistic_ecs_task_definition_registers() {
        let doc = r#"{
          "family": "llm-serve",
          "taskRoleArn": "arn:aws:iam::123456789012:role/serve",
          "executionRoleArn": "arn:aws:iam::123456789012:role/ecsTaskExecutionRole",
          "networkMode": "awsvpc",
          "requiresCompatibilities": ["EC2"],
          "cpu": "4096",
          "memory": "16384",
          "containerDefinitions": [
            {
              "name": "server",
              "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/serve:1.2",
              "cpu": 2048,
              "memory": 8192,
              "essential": true,
              "entryPoint": ["python", "-m"],
              "command": ["vllm.entrypoints.openai.api_server", "--port", "8000"],
              "environment": [{"name": "HF_HOME", "value": "/models"}],
              "portMappings": [{"containerPort": 8000, "hostPort": 8000, "protocol": "tcp"}],
              "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": "/ecs/serve"}},
              "healthCheck": {
                "command": ["CMD-SHELL", "curl -f http://localhost:8000/health || exit 1"],
                "interval": 15, "retries": 5, "startPeriod": 120
              },
              "stopTimeout": 60,
              "resourceRequirements": [{"type": "GPU", "value": "1"}]
            },
            {
              "name": "sidecar",
              "image": "busybox",
              "essential": false,
              "command": ["sh", "-c", "sleep infinity"],
              "memoryReservation": 128
            }
          ]
        }"#;
        let p = ok(doc);
        let d = &p.definition;
        assert_eq!(d.family.as_str(), "llm-serve");
        assert_eq!((d.revision, d.registered_at_ms), (0, 0));
        let names: Vec<&str> = d.container_definitions.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["server", "sidecar"]);
        let server = &d.container_definitions[0];
        assert_eq!(server.stop_timeout, Some(60));
        assert_eq!(
            server.health_check.as_ref().map(|h| (h.interval, h.timeout, h.retries, h.start_period)),
            Some((15, 5, 5, 120))
        );
        assert_eq!(d.gpu_demand(), GpuDemand::Whole { count: 1 });
        let mut ignored = p.ignored_fields.clone();
        ignored.sort();
        assert_eq!(ignored, ["executionRoleArn", "requiresCompatibilities", "taskRoleArn"]);
        // Honoured now: the task's size and the log driver.
        assert_eq!((d.cpu.as_deref(), d.memory.as_deref()), (Some("4096"), Some("16384")));
        assert_eq!(server.log_configuration.as_ref().map(|l| l.log_driver.as_str()), Some("awslogs"));
    }

    #[test]
    fn mps_task_memory_and_compute_add_up() {
        let p = ok(&task(vec![
            container(json!({"name": "encoder", "resourceRequirements": [
                mps_pct(8192, 30)
            ]})),
            container(json!({"name": "decoder", "resourceRequirements": [mps(json!(4096))]})),
            container(json!({"name": "cpu-only"})),
        ]));
        assert_eq!(
            p.definition.gpu_demand(),
            GpuDemand::Mps { memory_mib: 12288, clients: 2, compute_percent: 130 }
        );
        let p = ok(&task(vec![
            container(json!({"resourceRequirements": [mps_pct(100, 25)]})),
            container(json!({"name": "b", "resourceRequirements": [mps_pct(200, 50)]})),
        ]));
        assert_eq!(
            p.definition.gpu_demand(),
            GpuDemand::Mps { memory_mib: 300, clients: 2, compute_percent: 75 }
        );
        assert_eq!(ok(&one(json!({}))).definition.gpu_demand(), GpuDemand::None);
    }

    #[test]
    fn described_definition_registers_again_unchanged() {
        let p = ok(&task(vec![
            container(json!({
                "environment": [{"name": "A", "value": "1"}],
                "user": "nobody",
                "stopTimeout": 10,
                "readinessCheck": {"command": ["HTTP-GET", "http://localhost/"]},
                "resourceRequirements": [mps_pct(512, 40)]
            })),
            container(json!({"name": "b", "essential": false, "resourceRequirements": [mps(json!(256))]})),
        ]));
        let mut described = p.definition.clone();
        described.revision = 7;
        described.registered_at_ms = 1_700_000_000_000;
        let text = serde_json::to_string(&described).unwrap_or_default();
        let again = ok(&text);
        assert_eq!(again.definition, p.definition);
        assert_eq!(again.ignored_fields, ["registeredAtMs", "revision"]);
    }

    // ---- never panics ----

    fn arb_json() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            prop::sample::select(vec![
                "family",
                "containerDefinitions",
                "name",
                "command",
                "entryPoint",
                "environment",
                "essential",
                "user",
                "stopTimeout",
                "healthCheck",
                "startupCheck",
                "readinessCheck",
                "resourceRequirements",
                "type",
                "value",
                "sharingStrategy",
                "nvidiaMps",
                "memory",
                "maxComputePercent",
                "interval",
                "timeout",
                "retries",
                "startPeriod",
                "image",
            ])
            .prop_map(str::to_string),
            "[a-zA-Z]{0,6}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            prop::sample::select(vec![
                "GPU",
                "CMD",
                "CMD-SHELL",
                "HTTP-GET",
                "TCP-CONNECT",
                "http://x",
                "h:80",
                "1",
                "64",
                "0",
                "",
                "é",
                "a=b",
            ])
            .prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 8, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A valid document that touches every rule's field, to mutate.
    fn rich_doc() -> Value {
        json!({
            "family": "f",
            "networkMode": "host",
            "containerDefinitions": [
                {
                    "name": "a",
                    "image": "x",
                    "command": ["run"],
                    "entryPoint": ["sh", "-c"],
                    "environment": [{"name": "A", "value": "1"}],
                    "essential": true,
                    "user": "u",
                    "stopTimeout": 30,
                    "healthCheck": {
                        "command": ["CMD", "true"],
                        "interval": 30, "timeout": 5, "retries": 3, "startPeriod": 0
                    },
                    "startupCheck": {"command": ["HTTP-GET", "http://localhost/"]},
                    "readinessCheck": {"command": ["TCP-CONNECT", "localhost:80"]},
                    "resourceRequirements": [mps_pct(1024, 50)]
                },
                {"name": "b", "command": ["x"], "resourceRequirements": [mps(json!(2048))]}
            ]
        })
    }

    fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    pointers(child, format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    pointers(child, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
        out.push(at);
    }

    /// Replaces (or, where `remove`, deletes) the node at a chosen pointer of the rich doc.
    fn mutate(mutations: &[(prop::sample::Index, Value, bool)]) -> Value {
        let mut doc = rich_doc();
        for (index, replacement, remove) in mutations {
            let mut ptrs = Vec::new();
            pointers(&doc, String::new(), &mut ptrs);
            let at = index.get(&ptrs).clone();
            if *remove && !at.is_empty() {
                if let Some((parent, key)) = at.rsplit_once('/') {
                    match doc.pointer_mut(parent) {
                        Some(Value::Object(m)) => {
                            m.remove(key);
                        }
                        Some(Value::Array(a)) => {
                            if let Ok(i) = key.parse::<usize>() {
                                if i < a.len() {
                                    a.remove(i);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            } else if let Some(slot) = doc.pointer_mut(&at) {
                *slot = replacement.clone();
            }
        }
        doc
    }

    fn assert_well_formed(bytes: &[u8]) {
        match parse_task_definition(bytes) {
            Ok(p) => {
                assert_eq!(p.definition.revision, 0);
                assert!(!p.definition.container_definitions.is_empty());
                // Whatever was accepted registers again to the same definition.
                let text = serde_json::to_vec(&p.definition).unwrap_or_default();
                let again = parse_task_definition(&text).map(|a| a.definition);
                assert_eq!(again.as_ref(), Ok(&p.definition));
            }
            Err(all) => {
                assert!(!all.errors().is_empty() && all.errors().len() <= MAX_ERRORS, "{all}");
                for e in all.errors() {
                    assert!(!e.field.is_empty() && !e.message.is_empty(), "{all}");
                    assert!(!e.message.ends_with('.'), "trailing period: {e}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn taskdef_never_panics_on_arbitrary_json(v in arb_json()) {
            assert_well_formed(v.to_string().as_bytes());
        }

        #[test]
        fn taskdef_never_panics_on_mutated_valid_docs(
            mutations in prop::collection::vec(
                (any::<prop::sample::Index>(), arb_json(), any::<bool>()),
                1..4,
            )
        ) {
            assert_well_formed(mutate(&mutations).to_string().as_bytes());
        }

        #[test]
        fn taskdef_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            assert_well_formed(&bytes);
        }
    }

    #[test]
    fn rich_doc_is_valid() {
        let p = ok(&rich_doc().to_string());
        assert_eq!(
            p.definition.gpu_demand(),
            GpuDemand::Mps { memory_mib: 3072, clients: 2, compute_percent: 150 }
        );
    }
}
