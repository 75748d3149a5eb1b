//! Task definitions in the shape AWS documents and publishes, each registered as written.
//! Tests live in `mod taskdef` so that `cargo test -p mpsfleet-core taskdef` selects them.

mod taskdef {
    use mpsfleet_core::taskdef::{parse_task_definition, ParsedTaskDefinition};
    use mpsfleet_types::{GpuDemand, NetworkMode, Protocol};
    use std::path::PathBuf;

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("taskdefs")
    }

    #[track_caller]
    fn parse(file: &str) -> ParsedTaskDefinition {
        let path = dir().join(file);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let parsed = parse_task_definition(&bytes).unwrap_or_else(|e| panic!("{file} refused: {e}"));
        // What was accepted registers again, from its described form, to the same definition.
        let text = serde_json::to_vec(&parsed.definition).unwrap_or_default();
        let again = parse_task_definition(&text).unwrap_or_else(|e| panic!("{file} described refused: {e}"));
        assert_eq!(again.definition, parsed.definition, "{file} changed on a second registration");
        parsed
    }

    fn images(p: &ParsedTaskDefinition) -> Vec<&str> {
        p.definition.container_definitions.iter().map(|c| c.image.as_deref().unwrap_or("")).collect()
    }

    fn has_ignored(p: &ParsedTaskDefinition, field: &str) -> bool {
        p.ignored_fields.iter().any(|f| f == field)
    }

    #[test]
    fn every_fixture_registers() {
        let mut files: Vec<String> = std::fs::read_dir(dir())
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        files.sort();
        assert!(files.len() >= 9, "expected the fixtures, found {files:?}");
        for f in &files {
            assert!(f.ends_with(".json"), "{f}");
            let p = parse(f);
            assert!(!p.definition.container_definitions.is_empty(), "{f}");
            assert!(p.definition.container_definitions.iter().all(|c| c.image.is_some()), "{f}");
        }
    }

    #[test]
    fn sample_app_httpd_in_awsvpc() {
        let p = parse("sample-app-awsvpc.json");
        let d = &p.definition;
        assert_eq!(d.family.as_str(), "sample-fargate-app");
        assert_eq!(images(&p), ["public.ecr.aws/docker/library/httpd:latest"]);
        assert_eq!(d.network_mode, Some(NetworkMode::Awsvpc));
        let c = &d.container_definitions[0];
        assert_eq!(c.entry_point, ["sh", "-c"]);
        assert_eq!(c.command.len(), 1);
        assert!(c.command[0].contains("httpd-foreground"));
        assert_eq!(c.port_mappings.len(), 1);
        assert_eq!((c.port_mappings[0].container_port, c.port_mappings[0].host_port), (80, Some(80)));
        // awsvpc: the port is on the task's own address, so the task holds no host port.
        assert_eq!(d.effective_network_mode(), NetworkMode::Awsvpc);
        assert!(d.static_host_ports().is_empty());
        assert!(d.needs_container_runtime());
        assert_eq!((d.cpu.as_deref(), d.memory.as_deref()), (Some("256"), Some("512")));
        assert!(has_ignored(&p, "requiresCompatibilities"), "{:?}", p.ignored_fields);
        for f in ["cpu", "memory"] {
            assert!(!has_ignored(&p, f), "{f} in {:?}", p.ignored_fields);
        }
    }

    #[test]
    fn nginx_bridge_with_dynamic_host_port() {
        let p = parse("nginx-bridge.json");
        let d = &p.definition;
        assert_eq!(images(&p), ["nginx:1.25-alpine"]);
        assert_eq!(d.network_mode, Some(NetworkMode::Bridge));
        let c = &d.container_definitions[0];
        assert!(c.command.is_empty() && c.entry_point.is_empty());
        assert!(d.needs_container_runtime());
        assert_eq!((c.cpu, c.memory, c.memory_reservation), (Some(256), None, Some(128)));
        let m = &c.port_mappings[0];
        assert_eq!((m.container_port, m.host_port, m.protocol), (80, None, Protocol::Tcp));
        assert_eq!(m.name.as_deref(), Some("nginx-80-tcp"));
        assert!(d.static_host_ports().is_empty());
        assert_eq!(c.docker_labels.get("com.example.service").map(String::as_str), Some("web"));
        assert!(
            has_ignored(&p, "containerDefinitions[0].portMappings[0].appProtocol"),
            "{:?}",
            p.ignored_fields
        );
    }

    #[test]
    fn wordpress_and_mysql_linked() {
        let p = parse("wordpress-mysql.json");
        let d = &p.definition;
        assert_eq!(d.container_definitions.len(), 2);
        assert_eq!(images(&p), ["wordpress:6.4-apache", "mysql:8.0"]);
        assert_eq!(d.network_mode, None);
        assert!(d.container_definitions.iter().all(|c| c.memory == Some(500) && c.cpu == Some(10)));
        assert!(d.container_definitions.iter().all(|c| c.command.is_empty()));
        assert!(d.needs_container_runtime());
        assert_eq!(d.static_host_ports(), [(Protocol::Tcp, 80)]);
        assert!(has_ignored(&p, "containerDefinitions[0].links"), "{:?}", p.ignored_fields);
        assert_eq!(d.container_definitions[1].environment.len(), 4);
    }

    #[test]
    fn fargate_task_level_cpu_and_memory_are_kept() {
        let p = parse("fargate-task-level.json");
        let d = &p.definition;
        assert_eq!(images(&p), ["111122223333.dkr.ecr.eu-west-1.amazonaws.com/api:2024.06.1"]);
        let c = &d.container_definitions[0];
        assert_eq!(c.working_directory.as_deref(), Some("/app"));
        assert_eq!(c.port_mappings[0].host_port, None);
        assert!(d.static_host_ports().is_empty());
        assert_eq!((d.cpu.as_deref(), d.memory.as_deref()), (Some("1024"), Some("2048")));
        let mut want = [
            "ephemeralStorage",
            "executionRoleArn",
            "requiresCompatibilities",
            "runtimePlatform",
            "taskRoleArn",
        ];
        // Tags are the definition's own now; the fields mpsfleet does not act on are kept as
        // given besides being reported.
        assert!(!d.tags.is_empty(), "{:?}", d.tags);
        assert!(d.kept_fields.contains_key("taskRoleArn"));
        want.sort_unstable();
        let mut got = p.ignored_fields.clone();
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn whole_gpu_nvidia_smi() {
        let p = parse("gpu-whole.json");
        let d = &p.definition;
        assert_eq!(images(&p), ["nvidia/cuda:12.4.1-base-ubuntu22.04"]);
        assert_eq!(d.gpu_demand(), GpuDemand::Whole { count: 1 });
        assert_eq!(d.container_definitions[0].memory, Some(2048));
        assert!(d.static_host_ports().is_empty());
    }

    #[test]
    fn vllm_gpu_service_with_health_check() {
        let p = parse("vllm-gpu-service.json");
        let d = &p.definition;
        assert_eq!(images(&p), ["vllm/vllm-openai:v0.5.4"]);
        assert_eq!(d.gpu_demand(), GpuDemand::Whole { count: 1 });
        let c = &d.container_definitions[0];
        // Arguments to the image's own entrypoint.
        assert!(c.entry_point.is_empty());
        assert_eq!(c.command[..2], ["--model", "Qwen/Qwen2-1.5B-Instruct"]);
        assert_eq!((c.memory, c.memory_reservation), (Some(30720), Some(16384)));
        assert_eq!(d.static_host_ports(), [(Protocol::Tcp, 8000)]);
        let h = c.health_check.as_ref().map(|h| (h.command.clone(), h.start_period));
        assert_eq!(
            h,
            Some((
                vec!["CMD-SHELL".to_string(), "curl -fsS http://localhost:8000/health || exit 1".to_string()],
                300
            ))
        );
        assert_eq!(c.stop_timeout, Some(120));
        // /dev/shm and memlock are honoured.
        let shm = c.linux_parameters.as_ref().and_then(|l| l.shared_memory_size);
        assert_eq!(shm, Some(8192));
        assert_eq!((c.ulimits[0].name.as_str(), c.ulimits[0].soft_limit), ("memlock", -1));
        for f in ["containerDefinitions[0].linuxParameters", "containerDefinitions[0].ulimits"] {
            assert!(!has_ignored(&p, f), "{f} in {:?}", p.ignored_fields);
        }
        assert!(has_ignored(&p, "requiresCompatibilities"), "{:?}", p.ignored_fields);
    }

    #[test]
    fn logs_secrets_and_mounts_in_host_mode() {
        let p = parse("logs-secrets-mounts.json");
        let d = &p.definition;
        assert_eq!(d.container_definitions.len(), 2);
        assert_eq!(
            images(&p),
            [
                "ghcr.io/example-org/queue-worker:3.2.0",
                "public.ecr.aws/aws-observability/aws-for-fluent-bit:stable"
            ]
        );
        assert_eq!(d.network_mode, Some(NetworkMode::Host));
        assert_eq!(d.static_host_ports(), [(Protocol::Tcp, 9102)]);
        assert_eq!(d.container_definitions[0].user.as_deref(), Some("1000:1000"));
        assert!(!d.container_definitions[1].essential);
        // dependsOn is honoured: the worker starts once the log router has started.
        assert!(!has_ignored(&p, "containerDefinitions[0].dependsOn"), "{:?}", p.ignored_fields);
        assert_eq!(d.container_definitions[0].depends_on[0].container_name, "log-router");
        assert!(has_ignored(&p, "executionRoleArn"), "{:?}", p.ignored_fields);
        // Secrets and the log driver are honoured: the secrets by their ARN names.
        for f in ["containerDefinitions[0].logConfiguration", "containerDefinitions[0].secrets"] {
            assert!(!has_ignored(&p, f), "{f} in {:?}", p.ignored_fields);
        }
        let worker = &d.container_definitions[0];
        assert_eq!(worker.secrets[0].name, "DATABASE_URL");
        assert_eq!(
            worker.secrets[0].value_from,
            "arn:aws:secretsmanager:us-east-1:111122223333:secret:db-url-AbCdEf"
        );
        assert_eq!(worker.log_configuration.as_ref().map(|l| l.log_driver.as_str()), Some("awslogs"));
        // Volumes and mount points are honoured: a host path and a volume of the task.
        for f in ["containerDefinitions[0].mountPoints", "volumes"] {
            assert!(!has_ignored(&p, f), "{f} in {:?}", p.ignored_fields);
        }
        assert_eq!(d.volumes[0].host.as_ref().and_then(|h| h.source_path.as_deref()), Some("/mnt/scratch"));
        assert_eq!(d.volumes[1].host, None);
        assert_eq!(d.container_definitions[0].mount_points[1].container_path, "/cache");
    }

    #[test]
    fn image_only_by_digest_without_a_command() {
        let p = parse("image-only.json");
        let d = &p.definition;
        assert_eq!(d.container_definitions.len(), 1);
        let c = &d.container_definitions[0];
        assert!(c.image.as_deref().is_some_and(|i| i.starts_with("redis@sha256:")));
        assert!(c.command.is_empty() && c.entry_point.is_empty());
        assert!(c.needs_container_runtime());
        assert!(d.needs_container_runtime());
        assert_eq!(c.port_mappings[0].container_port, 6379);
        assert!(d.static_host_ports().is_empty());
        assert!(p.ignored_fields.is_empty(), "{:?}", p.ignored_fields);
    }

    #[test]
    fn described_ecs_revision_registers() {
        let p = parse("described-revision.json");
        let d = &p.definition;
        assert_eq!(d.family.as_str(), "hello-world");
        assert_eq!(d.revision, 0, "the server assigns the revision");
        let c = &d.container_definitions[0];
        assert_eq!(c.cpu, Some(0));
        assert!(c.port_mappings.is_empty() && c.environment.is_empty());
        assert_eq!(images(&p), ["busybox:1.36"]);
        for f in ["taskDefinitionArn", "revision", "status", "compatibilities"] {
            assert!(has_ignored(&p, f), "{f} not in {:?}", p.ignored_fields);
        }
    }
}
