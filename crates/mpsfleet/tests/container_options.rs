//! Process tests of volumes, Linux options and pools' task policies: the real server and a
//! Docker agent on the private engine of `scripts/docker-env.sh` (`eval "$(bash
//! scripts/docker-env.sh env)"` first). Each group of fields is checked twice: in Docker's
//! inspect of the created container, and by what the container itself sees.

mod common;

use common::*;
use mpsfleet_client::{Client, ClientError};
use mpsfleet_types::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

/// A server, one pool with `policy` and one Docker agent in it. Dropping it stops the agent and removes what is left of its
/// containers and task volumes.
struct Fleet {
    agent: Option<Agent>,
    host: HostId,
    docker: DockerEnv,
    admin: Client,
    pool: String,
    _server: Server,
    dir: tempfile::TempDir,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.agent.take();
        self.docker.remove_containers_of_host(self.host.as_str());
        let filter = format!("label=io.mpsfleet.host={}", self.host);
        let out = self.docker.cli(&["volume", "ls", "-q", "--filter", &filter]);
        for v in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()) {
            let _ = self.docker.cli(&["volume", "rm", "-f", v]);
        }
    }
}

impl Fleet {
    /// `retention_s`: how long the agent keeps the containers of stopped tasks.
    async fn start(pool: &str, policy: TaskPolicy, retention_s: u32) -> Fleet {
        let docker = docker_env();
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        admin
            .create_pool(&CreatePool { name: pool.into(), task_policy: Some(policy), ..Default::default() })
            .await
            .expect("create pool");
        let agent = Agent::start_docker(
            &server,
            &dir.path().join("a0"),
            pool,
            &format!("{pool}-h0"),
            &docker,
            &["--container-retention-s", &retention_s.to_string()],
        );
        let pool_name = pool.to_string();
        let a = admin.clone();
        let hosts = eventually(WAIT, &format!("an ACTIVE host in {pool}"), || async {
            a.list_hosts(Some(&pool_name))
                .await
                .ok()
                .filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
        })
        .await;
        Fleet {
            agent: Some(agent),
            host: hosts[0].id.clone(),
            docker,
            admin,
            pool: pool.to_string(),
            _server: server,
            dir,
        }
    }

    fn logs(&self) -> String {
        self.agent.as_ref().map(Agent::log).unwrap_or_default()
    }

    async fn run(&self, def: serde_json::Value) -> Result<Task, ClientError> {
        let family = def["family"].as_str().unwrap().to_string();
        self.admin.register_taskdef(taskdef(def)).await.expect("register");
        let r = self
            .admin
            .run_task(&RunTask {
                task_definition: family,
                count: 1,
                pool: self.pool.clone(),
                client_token: None,
                ..Default::default()
            })
            .await?;
        Ok(r.tasks.into_iter().next().unwrap())
    }

    async fn running(&self, def: serde_json::Value) -> Task {
        let t = self.run(def).await.expect("run");
        self.task_in(&t.id, TaskStatus::Running).await
    }

    async fn task_in(&self, id: &TaskId, status: TaskStatus) -> Task {
        task_reaching(
            &self.admin,
            id,
            status,
            WAIT,
            |t| status != TaskStatus::Running || !t.containers.is_empty(),
            || self.logs(),
        )
        .await
    }

    fn inspect(&self, id: &str, format: &str) -> String {
        self.docker.inspect(id, format).unwrap_or_else(|| panic!("container {id} is not there"))
    }

    /// Waits until the container's output has `needle`; returns it.
    async fn output_with(&self, id: &str, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let out = self.docker.cli(&["logs", id]);
            let text =
                format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            if text.contains(needle) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "container {id} never printed {needle:?}; it printed {text:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn stop(&self, t: &Task) {
        self.admin.stop_task(&t.id.to_string(), None).await.expect("stop");
        self.task_in(&t.id, TaskStatus::Stopped).await;
    }

    fn task_volumes(&self, task: &TaskId) -> Vec<String> {
        let filter = format!("label=io.mpsfleet.task={task}");
        self.docker
            .cli_ok(&["volume", "ls", "-q", "--filter", &filter])
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect()
    }
}

fn container_id(t: &Task, name: &str) -> String {
    t.containers
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.runtime_id.clone())
        .unwrap_or_else(|| panic!("task {} has no container {name}: {t:?}", t.id))
}

/// A container `main` of the test image running `script` in sh, then sleeping.
fn one(family: &str, image: &str, script: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut c = serde_json::json!({
        "name": "main", "image": image, "stopTimeout": 2,
        "command": ["/bin/sh", "-c", format!("{script}; echo DONE; exec sleep 300")],
    });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    serde_json::json!({"family": family, "containerDefinitions": [c]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_points_host_paths_read_only_and_task_volumes_removed_with_the_task() {
    within(async {
        let f = Fleet::start("volmount", TaskPolicy::permissive(), 1).await;
        let host_dir = f.dir.path().join("data");
        let ro_dir = f.dir.path().join("ro");
        std::fs::create_dir_all(&host_dir).unwrap();
        std::fs::create_dir_all(&ro_dir).unwrap();
        std::fs::write(ro_dir.join("seen"), "from the host\n").unwrap();
        let mut d = one(
            "volmount",
            &f.docker.image,
            "echo written-inside > /data/out.txt; cat /ro/seen; \
             if touch /ro/x 2>/dev/null; then echo RO-WRITABLE; else echo RO-REFUSED; fi; \
             echo kept > /scratch/f && cat /scratch/f && echo SCRATCH-OK; echo t > /tv/f && echo TV-OK",
            serde_json::json!({"mountPoints": [
                {"sourceVolume": "data", "containerPath": "/data"},
                {"sourceVolume": "ro", "containerPath": "/ro", "readOnly": true},
                {"sourceVolume": "scratch", "containerPath": "/scratch"},
                {"sourceVolume": "tv", "containerPath": "/tv"}
            ]}),
        );
        d["volumes"] = serde_json::json!([
            {"name": "data", "host": {"sourcePath": host_dir.to_str().unwrap()}},
            {"name": "ro", "host": {"sourcePath": ro_dir.to_str().unwrap()}},
            {"name": "scratch", "host": {}},
            {"name": "tv", "dockerVolumeConfiguration": {"scope": "task", "driver": "local", "labels": {"team": "ml"}}}
        ]);
        let t = f.running(d).await;
        let id = container_id(&t, "main");
        let out = f.output_with(&id, "DONE").await;
        assert!(out.contains("from the host"), "{out}");
        assert!(out.contains("RO-REFUSED") && !out.contains("RO-WRITABLE"), "{out}");
        assert!(out.contains("SCRATCH-OK") && out.contains("TV-OK"), "{out}");
        assert_eq!(std::fs::read_to_string(host_dir.join("out.txt")).unwrap(), "written-inside\n");
        assert!(!ro_dir.join("x").exists());

        let binds = f.inspect(&id, "{{json .HostConfig.Binds}}");
        let scratch = format!("mpsfleet-{}-{}-scratch", f.host, t.id);
        let tv = format!("mpsfleet-{}-{}-tv", f.host, t.id);
        for want in [
            format!("{}:/data", host_dir.display()),
            format!("{}:/ro:ro", ro_dir.display()),
            format!("{scratch}:/scratch"),
            format!("{tv}:/tv"),
        ] {
            assert!(binds.contains(&want), "{want} not in {binds}");
        }
        let mut volumes = f.task_volumes(&t.id);
        volumes.sort();
        assert_eq!(volumes, [scratch.clone(), tv.clone()]);
        assert_eq!(
            f.docker.cli_ok(&["volume", "inspect", "--format", "{{index .Labels \"team\"}} {{.Driver}}", &tv]),
            "ml local"
        );

        // With the task: its containers go after the retention (1 s), its volumes with them.
        f.stop(&t).await;
        eventually(WAIT, "the task's volumes to be removed", || async {
            f.task_volumes(&t.id).is_empty().then_some(())
        })
        .await;
        assert!(f.docker.inspect(&id, "{{.Id}}").is_none(), "the container is still there");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_from_and_a_shared_volume() {
    within(async {
        let f = Fleet::start("volfrom", TaskPolicy::default(), 1).await;
        let shared = format!("mpsfleet-test-shared-{}", std::process::id());
        let _ = f.docker.cli(&["volume", "rm", "-f", &shared]);
        let image = f.docker.image.clone();
        let d = serde_json::json!({
            "family": "volfrom",
            "volumes": [
                {"name": "work", "host": {}},
                {"name": shared, "dockerVolumeConfiguration": {"scope": "shared", "autoprovision": true}}
            ],
            "containerDefinitions": [
                {"name": "src", "image": image, "stopTimeout": 2,
                 "mountPoints": [{"sourceVolume": "work", "containerPath": "/work"},
                                 {"sourceVolume": shared, "containerPath": "/shared"}],
                 "command": ["/bin/sh", "-c", "echo from-src > /work/f; echo keep > /shared/k; exec sleep 300"]},
                {"name": "reader", "image": image, "stopTimeout": 2,
                 "volumesFrom": [{"sourceContainer": "src", "readOnly": true}],
                 "command": ["/bin/sh", "-c", "while [ ! -f /work/f ]; do sleep 0.2; done; cat /work/f; \
                     if touch /work/g 2>/dev/null; then echo FROM-WRITABLE; else echo FROM-REFUSED; fi; \
                     echo DONE; exec sleep 300"]}
            ]
        });
        let t = f.running(d).await;
        let reader = container_id(&t, "reader");
        let out = f.output_with(&reader, "DONE").await;
        assert!(out.contains("from-src") && out.contains("FROM-REFUSED"), "{out}");
        assert_eq!(
            f.inspect(&reader, "{{json .HostConfig.VolumesFrom}}"),
            format!("[\"mpsfleet-{}-{}-src:ro\"]", f.host, t.id)
        );
        // The shared volume was made (autoprovision) under its own name and outlives the task.
        f.stop(&t).await;
        eventually(WAIT, "the task's own volume to be removed", || async {
            f.task_volumes(&t.id).is_empty().then_some(())
        })
        .await;
        let labels = f.docker.cli_ok(&["volume", "inspect", "--format", "{{json .Labels}}", &shared]);
        assert!(!labels.contains("io.mpsfleet.task"), "{labels}");
        eventually(WAIT, "the shared volume to be free (its task's containers removed)", || async {
            f.docker.cli(&["volume", "rm", &shared]).status.success().then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linux_parameters_shm_tmpfs_init_capabilities_swap() {
    within(async {
        let f = Fleet::start("linux", TaskPolicy::permissive(), 3600).await;
        let t = f
            .running(one(
                "linux",
                &f.docker.image,
                "grep ' /dev/shm ' /proc/mounts; grep ' /fast ' /proc/mounts; \
                 touch /tmp/c; if chown 1 /tmp/c 2>/dev/null; then echo CHOWN-ALLOWED; else echo CHOWN-REFUSED; fi",
                serde_json::json!({
                    "memory": 64,
                    "linuxParameters": {
                        "sharedMemorySize": 128,
                        "tmpfs": [{"containerPath": "/fast", "size": 8, "mountOptions": ["noexec", "nosuid"]}],
                        "initProcessEnabled": false,
                        "capabilities": {"add": ["SYS_PTRACE"], "drop": ["CHOWN"]},
                        "maxSwap": 32, "swappiness": 10
                    }
                }),
            ))
            .await;
        let id = container_id(&t, "main");
        let out = f.output_with(&id, "DONE").await;
        // /dev/shm of 128 MiB, the tmpfs of 8 MiB with its options, CHOWN dropped.
        assert!(out.contains("size=131072k"), "{out}");
        let fast = out.lines().find(|l| l.contains(" /fast ")).unwrap_or_else(|| panic!("{out}"));
        assert!(fast.contains("size=8192k") && fast.contains("noexec") && fast.contains("nosuid"), "{fast}");
        assert!(out.contains("CHOWN-REFUSED"), "{out}");
        assert_eq!(f.inspect(&id, "{{.HostConfig.ShmSize}}"), (128u64 << 20).to_string());
        assert!(f.inspect(&id, "{{json .HostConfig.Tmpfs}}").contains("noexec,nosuid,size=8m"));
        assert_eq!(f.inspect(&id, "{{.HostConfig.Init}}"), "false");
        assert_eq!(f.inspect(&id, "{{json .HostConfig.CapAdd}}"), "[\"SYS_PTRACE\"]");
        assert_eq!(f.inspect(&id, "{{json .HostConfig.CapDrop}}"), "[\"CHOWN\"]");
        // Swap: memory + maxSwap, unless the engine says its kernel cannot limit swap.
        let swap = f.inspect(&id, "{{.HostConfig.MemorySwap}}");
        let notes = t.containers[0].notes.join("; ");
        assert!(swap == (96u64 << 20).to_string() || notes.contains("swap"), "MemorySwap {swap}, notes {notes}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ulimits_sysctls_readonly_root_and_privileged() {
    within(async {
        let f = Fleet::start("limits", TaskPolicy::permissive(), 3600).await;
        let t = f
            .running(one(
                "limits",
                &f.docker.image,
                "echo nofile=$(ulimit -n); cat /proc/sys/net/core/somaxconn; \
                 if touch /rootfile 2>/dev/null; then echo ROOT-WRITABLE; else echo ROOT-REFUSED; fi",
                serde_json::json!({
                    "ulimits": [{"name": "nofile", "softLimit": 1234, "hardLimit": 2345}],
                    "systemControls": [{"namespace": "net.core.somaxconn", "value": "777"}],
                    "readonlyRootFilesystem": true
                }),
            ))
            .await;
        let id = container_id(&t, "main");
        let out = f.output_with(&id, "DONE").await;
        assert!(out.contains("nofile=1234"), "{out}");
        assert!(out.lines().any(|l| l.trim() == "777"), "{out}");
        assert!(out.contains("ROOT-REFUSED"), "{out}");
        assert_eq!(
            f.inspect(&id, "{{json .HostConfig.Ulimits}}"),
            r#"[{"Name":"nofile","Hard":2345,"Soft":1234}]"#
        );
        assert_eq!(f.inspect(&id, "{{json .HostConfig.Sysctls}}"), r#"{"net.core.somaxconn":"777"}"#);
        assert_eq!(f.inspect(&id, "{{.HostConfig.ReadonlyRootfs}}"), "true");
        assert_eq!(f.inspect(&id, "{{.HostConfig.Privileged}}"), "false");

        // Privileged: Docker gets Privileged; inside, every capability (an engine that may not
        // grant them, as in an unprivileged sandbox, refuses to start it and says so).
        let p = f
            .run(one(
                "priv",
                &f.docker.image,
                "grep CapEff /proc/self/status",
                serde_json::json!({"privileged": true}),
            ))
            .await
            .expect("run");
        // An engine that refuses it removes the container at once: read it while it is there,
        // or else the refusal must name the capabilities.
        let (pid, privileged) = eventually(WAIT, "the privileged container to be created", || async {
            let id = f.docker.containers_labelled("io.mpsfleet.task", &p.id.to_string()).into_iter().next();
            let privileged = id.as_deref().and_then(|id| f.docker.inspect(id, "{{.HostConfig.Privileged}}"));
            let stopped =
                f.admin.describe_task(&p.id.to_string()).await.ok()?.last_status == TaskStatus::Stopped;
            (privileged.is_some() || stopped).then_some((id, privileged))
        })
        .await;
        assert!(privileged.as_deref().is_none_or(|v| v == "true"), "{privileged:?}");
        let ended = eventually(WAIT, "the privileged task to run or stop", || async {
            let t = f.admin.describe_task(&p.id.to_string()).await.ok()?;
            matches!(t.last_status, TaskStatus::Running | TaskStatus::Stopped).then_some(t)
        })
        .await;
        if ended.last_status == TaskStatus::Running {
            assert_eq!(privileged.as_deref(), Some("true"));
            let out = f.output_with(&pid.expect("its container"), "DONE").await;
            // Docker's default set is 00000000a80425fb; a privileged container has them all.
            let eff = out.lines().find(|l| l.starts_with("CapEff")).unwrap_or_else(|| panic!("{out}"));
            assert!(!eff.contains("00000000a80425fb") && eff.contains("ffffffff"), "{eff}");
        } else {
            let reason = ended.stopped_reason.clone().unwrap_or_default();
            assert!(reason.contains("caps"), "{ended:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_dns_and_extra_hosts() {
    within(async {
        let f = Fleet::start("names", TaskPolicy::default(), 3600).await;
        let t = f
            .running(one(
                "names",
                &f.docker.image,
                "echo host=$(hostname); cat /etc/hosts; cat /etc/resolv.conf",
                serde_json::json!({
                    "hostname": "worker-7",
                    "extraHosts": [{"hostname": "db.local", "ipAddress": "10.9.8.7"}],
                    "dnsServers": ["10.9.8.53"],
                    "dnsSearchDomains": ["corp.example"]
                }),
            ))
            .await;
        let id = container_id(&t, "main");
        let out = f.output_with(&id, "DONE").await;
        assert!(out.contains("host=worker-7"), "{out}");
        assert!(out.lines().any(|l| l.starts_with("10.9.8.7") && l.contains("db.local")), "{out}");
        assert!(out.contains("nameserver 10.9.8.53") && out.contains("search corp.example"), "{out}");
        assert_eq!(f.inspect(&id, "{{.Config.Hostname}}"), "worker-7");
        assert_eq!(f.inspect(&id, "{{json .HostConfig.ExtraHosts}}"), r#"["db.local:10.9.8.7"]"#);
        assert_eq!(f.inspect(&id, "{{json .HostConfig.Dns}}"), r#"["10.9.8.53"]"#);
        assert_eq!(f.inspect(&id, "{{json .HostConfig.DnsSearch}}"), r#"["corp.example"]"#);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_host_and_ipc_none() {
    within(async {
        let f = Fleet::start("ns", TaskPolicy::permissive(), 3600).await;
        let me = std::process::id();
        let mut d = one(
            "ns",
            &f.docker.image,
            &format!("if [ -d /proc/{me} ]; then echo SEES-HOST-PIDS; else echo OWN-PIDS; fi"),
            serde_json::json!({}),
        );
        d["pidMode"] = "host".into();
        d["ipcMode"] = "none".into();
        let t = f.running(d).await;
        let id = container_id(&t, "main");
        let out = f.output_with(&id, "DONE").await;
        assert!(out.contains("SEES-HOST-PIDS"), "{out}");
        assert_eq!(f.inspect(&id, "{{.HostConfig.PidMode}}"), "host");
        assert_eq!(f.inspect(&id, "{{.HostConfig.IpcMode}}"), "none");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_and_ipc_task_share_one_namespace_among_the_tasks_containers() {
    within(async {
        let f = Fleet::start("nstask", TaskPolicy::default(), 3600).await;
        let image = f.docker.image.clone();
        let d = serde_json::json!({
            "family": "nstask", "pidMode": "task", "ipcMode": "task",
            "containerDefinitions": [
                {"name": "a", "image": image, "stopTimeout": 2,
                 "command": ["/bin/sh", "-c", "echo from-a > /dev/shm/seen; exec sleep 301"]},
                {"name": "b", "image": image, "stopTimeout": 2,
                 "command": ["/bin/sh", "-c", "while [ ! -f /dev/shm/seen ]; do sleep 0.2; done; cat /dev/shm/seen; \
                     if cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\000' ' ' | grep -q 'sleep 301'; then echo SEES-A; else echo NO-A; fi; \
                     echo DONE; exec sleep 300"]}
            ]
        });
        let t = f.running(d).await;
        let b = container_id(&t, "b");
        let out = f.output_with(&b, "DONE").await;
        assert!(out.contains("from-a") && out.contains("SEES-A"), "{out}");
        // Both join the task's pause container (Docker shows it by id).
        let pause = format!("mpsfleet-{}-{}-.pause", f.host, t.id);
        let holder = format!("container:{}", f.inspect(&pause, "{{.Id}}"));
        for c in ["a", "b"] {
            let id = container_id(&t, c);
            assert_eq!(f.inspect(&id, "{{.HostConfig.PidMode}}"), holder);
            assert_eq!(f.inspect(&id, "{{.HostConfig.IpcMode}}"), holder);
        }
        assert_eq!(f.inspect(&pause, "{{.HostConfig.IpcMode}}"), "shareable");
    })
    .await;
}

fn refusal(e: ClientError) -> (String, String) {
    match e {
        ClientError::Api { body, .. } => {
            assert_eq!(body.code, "InvalidParameter", "{}", body.message);
            (body.field.unwrap_or_default(), body.message)
        }
        other => panic!("not an API refusal: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_policy_and_volumes_no_host_can_give_are_refused_at_run_and_service_create() {
    within(async {
        let f = Fleet::start("gpu", TaskPolicy::default(), 3600).await;
        // The host registered its engine's drivers.
        let host = f.admin.describe_host(f.host.as_str()).await.unwrap();
        assert!(host.plugins.volume.iter().any(|v| v == "local"), "{:?}", host.plugins);
        assert!(host.plugins.log.iter().any(|v| v == "json-file"), "{:?}", host.plugins);

        let image = f.docker.image.clone();
        let c = |extra: serde_json::Value| {
            let mut c = serde_json::json!({"name": "main", "image": image, "command": ["sleep", "1"]});
            if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            c
        };
        let mounted = serde_json::json!({"mountPoints": [{"sourceVolume": "v", "containerPath": "/v"}]});
        let cases: Vec<(serde_json::Value, &str, &str)> = vec![
            (serde_json::json!({"containerDefinitions": [c(serde_json::json!({"privileged": true}))]}),
             "containerDefinitions[0].privileged", "pool gpu's taskPolicy.allowPrivileged is false"),
            (serde_json::json!({"networkMode": "host", "containerDefinitions": [c(serde_json::json!({}))]}),
             "networkMode", "taskPolicy.allowHostNetwork is false"),
            (serde_json::json!({"pidMode": "host", "containerDefinitions": [c(serde_json::json!({}))]}),
             "pidMode", "taskPolicy.allowHostNamespaces is false"),
            (serde_json::json!({"volumes": [{"name": "v", "host": {"sourcePath": "/srv"}}], "containerDefinitions": [c(mounted.clone())]}),
             "volumes[0].host.sourcePath", "taskPolicy.allowHostPaths is false"),
            (serde_json::json!({"containerDefinitions": [c(serde_json::json!({"linuxParameters": {"capabilities": {"add": ["NET_ADMIN"]}}}))]}),
             "containerDefinitions[0].linuxParameters.capabilities.add", "taskPolicy.allowCapabilities is false"),
            (serde_json::json!({"containerDefinitions": [c(serde_json::json!({"systemControls": [{"namespace": "net.core.somaxconn", "value": "1"}]}))]}),
             "containerDefinitions[0].systemControls", "taskPolicy.allowCapabilities is false"),
            (serde_json::json!({"containerDefinitions": [c(serde_json::json!({"linuxParameters": {"devices": [{"hostPath": "/dev/null"}]}}))]}),
             "containerDefinitions[0].linuxParameters.devices", "taskPolicy.allowDevices is false"),
            (serde_json::json!({"volumes": [{"name": "v", "efsVolumeConfiguration": {"fileSystemId": "fs-1"}}], "containerDefinitions": [c(mounted.clone())]}),
             "volumes[0].efsVolumeConfiguration", "only AWS provides"),
            (serde_json::json!({"volumes": [{"name": "v", "dockerVolumeConfiguration": {"driver": "rexray/ebs"}}], "containerDefinitions": [c(mounted.clone())]}),
             "volumes[0].dockerVolumeConfiguration.driver", "no Docker host of pool gpu has"),
        ];
        for (i, (mut doc, field, words)) in cases.into_iter().enumerate() {
            let family = format!("refused{i}");
            doc["family"] = family.clone().into();
            f.admin.register_taskdef(taskdef(doc)).await.expect("register");
            let run = RunTask { task_definition: family.clone(), count: 1, pool: "gpu".into(), client_token: None, ..Default::default()  };
            let (got, message) = refusal(f.admin.run_task(&run).await.unwrap_err());
            assert_eq!(got, field, "{message}");
            assert!(message.contains(words), "{message}");
            let svc = CreateService {
                name: family.clone(),
                pool: "gpu".into(),
                task_definition: family.clone(),
                desired_count: 1,
                resumption: None, deployment_configuration: None, client_token: None, tags: Vec::new(), kept_fields: Default::default(), scheduling_strategy: None, ..Default::default()
            };
            let (got, _) = refusal(f.admin.create_service(&svc).await.unwrap_err());
            assert_eq!(got, field);
        }
        // Nothing was created by the refusals.
        assert!(f.admin.list_tasks(&Default::default()).await.unwrap().is_empty());
        assert!(f.admin.list_services().await.unwrap().is_empty());

        // A service moving to a definition the policy refuses keeps its definition.
        f.admin.register_taskdef(taskdef(serde_json::json!({"family": "ok", "containerDefinitions": [c(serde_json::json!({}))]}))).await.unwrap();
        let svc = CreateService { name: "svc".into(), pool: "gpu".into(), task_definition: "ok".into(), desired_count: 0, resumption: None, deployment_configuration: None, client_token: None, tags: Vec::new(), kept_fields: Default::default(), scheduling_strategy: None, ..Default::default() };
        f.admin.create_service(&svc).await.expect("an allowed definition");
        let update = UpdateService { task_definition: Some("refused0".into()), ..Default::default() };
        let (got, message) = refusal(f.admin.update_service("svc", &update).await.unwrap_err());
        assert_eq!(got, "containerDefinitions[0].privileged", "{message}");
        assert!(message.contains("pool update gpu --file"), "{message}");

        // Allowed once the pool's policy says so.
        let update = UpdatePool {
            task_policy: Some(TaskPolicy { allow_privileged: true, ..Default::default() }),
            ..Default::default()
        };
        let p = f.admin.update_pool("gpu", &update).await.unwrap();
        assert!(p.task_policy.allow_privileged);
        let t = f.admin.run_task(&RunTask { task_definition: "refused0".into(), count: 1, pool: "gpu".into(), client_token: None, ..Default::default()  }).await;
        assert!(t.is_ok(), "{t:?}");
    })
    .await;
}
