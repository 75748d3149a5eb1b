//! Task-level `cpu` and `memory`: read as ECS reads them at registration, kept as given, and
//! the containers' own sizes must fit within them.

mod taskdef {
    use mpsfleet_core::taskdef::parse_task_definition;
    use serde_json::{json, Value};

    fn def(cpu: Option<Value>, memory: Option<Value>, containers: Value) -> Vec<u8> {
        let mut d = json!({"family": "f", "containerDefinitions": containers});
        if let Some(c) = cpu {
            d["cpu"] = c;
        }
        if let Some(m) = memory {
            d["memory"] = m;
        }
        serde_json::to_vec(&d).expect("json")
    }

    fn one() -> Value {
        json!([{"name": "a", "image": "busybox"}])
    }

    #[track_caller]
    fn refused(json: &[u8], field: &str, words: &[&str]) {
        let all = parse_task_definition(json).expect_err("accepted");
        let e = all.first();
        assert_eq!(e.field, field, "{e}");
        for w in words {
            assert!(e.message.contains(w), "{e} lacks {w:?}");
        }
    }

    #[test]
    fn ecs_forms_register_and_are_kept_as_given() {
        for (cpu, memory) in
            [("1024", "2048"), ("1 vcpu", "2 GB"), ("0.25 vCPU", "2GB"), ("2 VCPU", "0.5 gb")]
        {
            let p = parse_task_definition(&def(Some(json!(cpu)), Some(json!(memory)), one()))
                .unwrap_or_else(|e| panic!("{cpu}/{memory}: {e}"));
            assert_eq!(p.definition.cpu.as_deref(), Some(cpu));
            assert_eq!(p.definition.memory.as_deref(), Some(memory));
            assert!(!p.ignored_fields.iter().any(|f| f == "cpu" || f == "memory"), "{:?}", p.ignored_fields);
        }
        // A plain number is taken too, and kept as its digits.
        let p = parse_task_definition(&def(Some(json!(512)), Some(json!(1024)), one())).expect("numbers");
        assert_eq!(
            (p.definition.cpu.as_deref(), p.definition.memory.as_deref()),
            (Some("512"), Some("1024"))
        );
        // Absent: nothing.
        let p = parse_task_definition(&def(None, None, one())).expect("none");
        assert_eq!((p.definition.cpu, p.definition.memory), (None, None));
    }

    #[test]
    fn bad_strings_name_the_field_and_the_forms() {
        refused(
            &def(Some(json!("1 core")), None, one()),
            "cpu",
            &["CPU units (\"1024\") or vCPUs", "\"1 core\""],
        );
        refused(&def(Some(json!("64")), None, one()), "cpu", &["from 128 to 196608 CPU units", "\"64\""]);
        refused(&def(Some(json!("200 vcpu")), None, one()), "cpu", &["204800 units"]);
        refused(&def(Some(json!(true)), None, one()), "cpu", &["must be a string"]);
        refused(&def(None, Some(json!("2 GiB")), one()), "memory", &["MiB (\"2048\") or GB", "\"2 GiB\""]);
        refused(&def(None, Some(json!("4")), one()), "memory", &["from 6 to 16777216 MiB"]);
        refused(&def(None, Some(json!(["2 GB"])), one()), "memory", &["must be a string"]);
        let long = "9".repeat(10_000);
        refused(&def(Some(json!(long)), None, one()), "cpu", &["(10000 bytes)"]);
    }

    #[test]
    fn containers_must_fit_within_the_task() {
        let two = |a: Value, b: Value| {
            let mut x = json!({"name": "a", "image": "busybox"});
            let mut y = json!({"name": "b", "image": "busybox", "essential": false});
            x.as_object_mut().expect("obj").extend(a.as_object().expect("obj").clone());
            y.as_object_mut().expect("obj").extend(b.as_object().expect("obj").clone());
            json!([x, y])
        };
        // CPU units add up.
        let fits = def(Some(json!("1 vcpu")), None, two(json!({"cpu": 512}), json!({"cpu": 512})));
        assert!(parse_task_definition(&fits).is_ok());
        let over = def(Some(json!("1 vcpu")), None, two(json!({"cpu": 512}), json!({"cpu": 513})));
        refused(&over, "cpu", &["add up to 1025 CPU units", "\"1 vcpu\" (1024 units)"]);
        // One container's hard limit.
        let big = def(None, Some(json!("1 GB")), two(json!({"memory": 2048}), json!({})));
        refused(&big, "containerDefinitions[0].memory", &["2048 MiB", "\"1 GB\" (1024 MiB)"]);
        // What they reserve, in all.
        let fits = def(
            None,
            Some(json!("1 GB")),
            two(json!({"memory": 1024, "memoryReservation": 512}), json!({"memoryReservation": 512})),
        );
        assert!(parse_task_definition(&fits).is_ok());
        let over =
            def(None, Some(json!("1024")), two(json!({"memory": 600}), json!({"memoryReservation": 600})));
        refused(&over, "memory", &["reserve 1200 MiB", "(1024 MiB)"]);
    }
}
