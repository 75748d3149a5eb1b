//! The AWS CLI and boto3, from PyPI, against `mpsfleet up` (tasks as containers on the test
//! Docker Engine, emulated GPUs, the real MPS daemon): an MPS task definition registered, run, waited for, described
//! with its GPU sharing, a service created, rolled to a new revision and waited stable, the
//! container instances' GPUs with the MPS memory their tasks hold, an instance drained, a task
//! stopped. What the ECS answers say is checked against the REST API's view of the same
//! objects. Then boto3's refusals: a wrong secret, an unknown key, a skewed clock, a viewer's
//! RunTask, a key scoped to another pool. Every ECS change is in the audit log.

mod common;

use common::up::Up;
use common::*;
use mpsfleet_client::TaskQuery;
use mpsfleet_types::access::{CreateToken, Role};
use mpsfleet_types::{HostStatus, TaskStatus};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The MPS memory (MiB) each task of the definition declares.
const MPS_MIB: u64 = 4096;

struct Aws {
    env: PathBuf,
    home: PathBuf,
    endpoint: String,
    ca: String,
    key: (String, String),
}

impl Aws {
    /// `aws ecs ARGS --output json`: its JSON answer (Null for the waiters, which print nothing).
    fn ecs(&self, args: &[&str]) -> Value {
        let out = Command::new(self.env.join("cli/bin/aws"))
            .arg("ecs")
            .args(args)
            .args(["--endpoint-url", &self.endpoint, "--ca-bundle", &self.ca, "--region", "us-east-1"])
            .args(["--output", "json", "--cli-read-timeout", "30"])
            .env("HOME", &self.home)
            .env("AWS_ACCESS_KEY_ID", &self.key.0)
            .env("AWS_SECRET_ACCESS_KEY", &self.key.1)
            .env_remove("AWS_PROFILE")
            .output()
            .expect("run the AWS CLI");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "aws ecs {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("aws ecs {args:?} printed {stdout}: {e}"))
        }
    }
}

/// The keys of the objects under `field` in the outputs of the AWS CLI's own shipped examples
/// of `aws ecs OPERATION` (its `awscli/examples/ecs/OPERATION.rst`): what real ECS answered.
fn example_keys(env: &Path, operation: &str, field: &str) -> BTreeSet<String> {
    let found = Command::new("find")
        .arg(env.join("cli/lib"))
        .args(["-path", &format!("*awscli/examples/ecs/{operation}.rst")])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&found.stdout).lines().next().map(str::to_string);
    let text = std::fs::read_to_string(path.expect("the AWS CLI's example")).unwrap();
    let mut keys = BTreeSet::new();
    // Each output is a JSON block indented under "Output::".
    for block in text.split("Output::").skip(1) {
        let body: String = block
            .lines()
            .skip_while(|l| l.trim().is_empty())
            .take_while(|l| l.trim().is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
            .collect();
        let Ok(v) = serde_json::from_str::<Value>(&body) else { continue };
        for o in v[field].as_array().into_iter().flatten() {
            keys.extend(o.as_object().unwrap().keys().cloned());
        }
    }
    assert!(!keys.is_empty(), "no {field} in the examples of {operation}");
    keys
}

/// The keys of `v` that `example` has and `v` lacks.
fn missing(example: &BTreeSet<String>, v: &Value) -> Vec<String> {
    example.iter().filter(|k| v.get(k.as_str()).is_none()).cloned().collect()
}

fn taskdef_file(dir: &Path, name: &str, image: &str, command: &str) -> String {
    let td = json!({
        "family": "mps-infer",
        "containerDefinitions": [{
            "name": "infer",
            "image": image,
            "command": ["sh", "-c", command],
            "memory": 64,
            "essential": true,
            "resourceRequirements": [{
                "type": "GPU",
                "sharingStrategy": {"nvidiaMps": {"memory": MPS_MIB, "maxComputePercent": 25}}
            }]
        }]
    });
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(&td).unwrap()).unwrap();
    format!("file://{}", path.display())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_aws_cli_and_boto3_run_mps_work_against_up() {
    let Some(env) = ecs_env() else { return };
    if mps_control().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let docker = docker_env();
    let engine = format!("unix://{}", docker.socket.display());
    let up = Up::start_on_engine(home.path(), &data.path().join("fleet"), 2, &[], &engine);
    let admin = up.admin.clone();
    let config: Value =
        serde_json::from_slice(&std::fs::read(home.path().join(".config/mpsfleet/config.json")).unwrap())
            .unwrap();
    let ca = config["caFile"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(90), "two ACTIVE hosts", || async {
        let hosts = admin.list_hosts(None).await.ok()?;
        (hosts.len() == 2 && hosts.iter().all(|h| h.status == HostStatus::Active)).then_some(())
    })
    .await;
    create_pool(&admin, "other").await;
    let key = |role, pool: Option<&str>| {
        let admin = admin.clone();
        let req = CreateToken {
            role,
            expires_in_s: None,
            description: "ecs test".into(),
            pool: pool.map(String::from),
            aws: true,
        };
        async move {
            let t = admin.create_token(&req).await.unwrap();
            (t.view.access_key_id.clone().expect("an access key id"), t.token)
        }
    };
    let operator = key(Role::Operator, None).await;
    let operator_token = admin
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.access_key_id.as_ref() == Some(&operator.0))
        .unwrap()
        .id;

    // The AWS CLI 1.46 carries a botocore without MPS's sharingStrategy: it is given botocore
    // 1.44.8's ECS model, as docs/ecs-api.md says.
    let aws_home = home.path().join("aws");
    std::fs::create_dir_all(&aws_home).unwrap();
    let added = Command::new(env.join("cli/bin/aws"))
        .args(["configure", "add-model", "--service-name", "ecs", "--service-model"])
        .arg(format!("file://{}", env.join("ecs-model/service-2.json").display()))
        .env("HOME", &aws_home)
        .status()
        .unwrap();
    assert!(added.success());
    let aws = Aws {
        env: env.clone(),
        home: aws_home,
        endpoint: up.url.clone(),
        ca: ca.clone(),
        key: operator.clone(),
    };

    // Register, run, wait. The first task's image is in the registry and not yet on the
    // engine, so that its host pulls it (`up` uses what the engine has).
    let pulled = format!("{}/mpsfleet/pulled:ecs-api-{}", docker.registry, std::process::id());
    docker.cli_ok(&["tag", &docker.image, &pulled]);
    docker.cli_ok(&["push", &pulled]);
    docker.cli_ok(&["rmi", &pulled]);
    let td = aws.ecs(&[
        "register-task-definition",
        "--cli-input-json",
        &taskdef_file(home.path(), "td1.json", &pulled, "sleep 600"),
    ]);
    assert_eq!(td["taskDefinition"]["revision"], 1);
    assert_eq!(
        td["taskDefinition"]["containerDefinitions"][0]["resourceRequirements"][0]["sharingStrategy"]
            ["nvidiaMps"]["memory"],
        MPS_MIB
    );
    let run =
        aws.ecs(&["run-task", "--task-definition", "mps-infer", "--count", "1", "--started-by", "nightly"]);
    assert_eq!(run["failures"], json!([]));
    let task_arn = run["tasks"][0]["taskArn"].as_str().unwrap().to_string();
    assert!(task_arn.starts_with("arn:aws:ecs:us-east-1:000000000000:task/default/"), "{task_arn}");
    aws.ecs(&["wait", "tasks-running", "--tasks", &task_arn]);
    let sharing = aws.ecs(&[
        "describe-tasks",
        "--tasks",
        &task_arn,
        "--query",
        "tasks[0].containers[0].gpuSharingStrategy",
    ]);
    assert_eq!(sharing, json!({"nvidiaMps": {"memory": MPS_MIB, "maxComputePercent": 25}}));
    let described = aws.ecs(&["describe-tasks", "--tasks", &task_arn, "--include", "TAGS"]);
    let t = &described["tasks"][0];
    assert_eq!((t["lastStatus"].as_str(), t["startedBy"].as_str()), (Some("RUNNING"), Some("nightly")));
    // Every key real ECS answers for an EC2 task (the AWS CLI's shipped examples), but the
    // Fargate-only ones; with ECS's meaning.
    let mut expected = example_keys(&env, "describe-tasks", "tasks");
    for fargate_only in ["ephemeralStorage", "platformFamily", "platformVersion"] {
        expected.remove(fargate_only);
    }
    assert_eq!(missing(&expected, t), Vec::<String>::new(), "{t}");
    assert_eq!(
        (t["connectivity"].as_str(), t["availabilityZone"].as_str()),
        (Some("CONNECTED"), Some("local"))
    );
    assert_eq!(t["attributes"][0]["name"], "ecs.cpu-architecture", "{t}");
    // No task-level size: its containers' sums, as ECS answers for an EC2 task.
    assert_eq!((t["cpu"].as_str(), t["memory"].as_str()), (Some("0"), Some("64")), "{t}");
    assert_eq!(t["enableExecuteCommand"], false);
    assert_eq!(t["overrides"]["inferenceAcceleratorOverrides"], json!([]));
    // The image came from the test registry: the pull is placed between creation and start.
    let at = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k} in {t}"));
    assert!(at("createdAt") <= at("pullStartedAt"), "{t}");
    assert!(at("pullStartedAt") <= at("pullStoppedAt") && at("pullStoppedAt") <= at("startedAt"), "{t}");
    assert!(at("createdAt") <= at("connectivityAt") && at("connectivityAt") <= at("startedAt"), "{t}");
    let id = task_arn.rsplit('/').next().unwrap();
    let rest = admin.describe_task(id).await.unwrap();
    assert_eq!(rest.last_status, TaskStatus::Running);
    let gpu_ids: Vec<&str> = rest.gpu_ids.iter().map(|g| g.as_str()).collect();
    assert_eq!(t["containers"][0]["gpuIds"], json!(gpu_ids), "the GPUs the scheduler gave it");
    assert!(t["containerInstanceArn"].as_str().unwrap().ends_with(rest.host_id.as_ref().unwrap().as_str()));

    // A service, stable; then rolled to a new revision, stable again.
    let svc = aws.ecs(&[
        "create-service",
        "--service-name",
        "web",
        "--task-definition",
        "mps-infer",
        "--desired-count",
        "2",
    ]);
    assert_eq!(svc["service"]["desiredCount"], 2);
    aws.ecs(&["wait", "services-stable", "--services", "web"]);
    aws.ecs(&[
        "register-task-definition",
        "--cli-input-json",
        &taskdef_file(home.path(), "td2.json", &docker.image, "sleep 700"),
    ]);
    let updated = aws.ecs(&["update-service", "--service", "web", "--task-definition", "mps-infer:2"]);
    assert!(updated["service"]["taskDefinition"].as_str().unwrap().ends_with("task-definition/mps-infer:2"));
    aws.ecs(&["wait", "services-stable", "--services", "web"]);
    let stable = aws.ecs(&["describe-services", "--services", "web"]);
    let s = &stable["services"][0];
    assert_eq!(
        (s["runningCount"].as_u64(), s["deployments"].as_array().map(Vec::len)),
        (Some(2), Some(1)),
        "{s}"
    );
    assert_eq!(s["deployments"][0]["rolloutState"], "COMPLETED", "{s}");
    let web = admin
        .list_tasks(&TaskQuery { service: Some("web".into()), live: true, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(web.len(), 2);
    assert!(web
        .iter()
        .all(|t| t.task_definition.to_string() == "mps-infer:2" && t.last_status == TaskStatus::Running));

    // The container instances' GPUs hold the MPS memory of the three running tasks, as the
    // scheduler accounts it.
    let arns = aws.ecs(&["list-container-instances"]);
    let arns: Vec<String> = arns["containerInstanceArns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(arns.len(), 2);
    let mut args = vec!["describe-container-instances", "--container-instances"];
    args.extend(arns.iter().map(String::as_str));
    let instances = aws.ecs(&args);
    let mut held = 0;
    let expected = example_keys(&env, "describe-container-instances", "containerInstances");
    for ci in instances["containerInstances"].as_array().unwrap() {
        assert_eq!(ci["agentConnected"], true, "{ci}");
        assert_eq!(missing(&expected, ci), Vec::<String>::new(), "{ci}");
        let resource = |list: &str, name: &str| {
            ci[list].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()["integerValue"]
                .as_u64()
                .unwrap()
        };
        let cores = std::thread::available_parallelism().unwrap().get() as u64;
        assert_eq!(resource("registeredResources", "CPU"), cores * 1024, "{ci}");
        assert!(resource("registeredResources", "MEMORY") > 0, "{ci}");
        assert!(
            resource("remainingResources", "MEMORY") <= resource("registeredResources", "MEMORY"),
            "{ci}"
        );
        let attrs = ci["attributes"].as_array().unwrap();
        assert!(attrs.iter().any(|a| a["name"] == "ecs.availability-zone" && a["value"] == "local"), "{ci}");
        let host = admin
            .list_hosts(None)
            .await
            .unwrap()
            .into_iter()
            .find(|h| ci["containerInstanceArn"].as_str().unwrap().ends_with(h.id.as_str()))
            .unwrap();
        for (d, g) in ci["gpuDevices"].as_array().unwrap().iter().zip(&host.gpus) {
            assert_eq!(d["gpuId"], g.gpu_id.as_str());
            assert_eq!(d["remainingMemoryInMiB"], g.remaining_memory_mib, "{d}");
            held += d["totalMemoryInMiB"].as_u64().unwrap() - d["remainingMemoryInMiB"].as_u64().unwrap();
            if d["containerCount"].as_u64() > Some(0) {
                assert_eq!(d["sharingMode"], "NVIDIA_MPS", "{d}");
            }
        }
    }
    assert_eq!(held, 3 * MPS_MIB, "{instances}");

    // A shape no GPU of the cluster could ever hold is a failure with its reason, as in ECS; one
    // that only lacks room now is accepted and waits PENDING.
    let huge = json!({"family": "huge", "containerDefinitions": [{"name": "m", "image": docker.image, "memory": 64,
        "command": ["sleep", "600"], "resourceRequirements": [{"type": "GPU",
        "sharingStrategy": {"nvidiaMps": {"memory": 200_000}}}]}]});
    let big = json!({"family": "big", "containerDefinitions": [{"name": "m", "image": docker.image, "memory": 64,
        "command": ["sleep", "600"], "resourceRequirements": [{"type": "GPU",
        "sharingStrategy": {"nvidiaMps": {"memory": 140_000}}}]}]});
    for td in [&huge, &big] {
        let path = home.path().join("td.json");
        std::fs::write(&path, td.to_string()).unwrap();
        aws.ecs(&["register-task-definition", "--cli-input-json", &format!("file://{}", path.display())]);
    }
    let never = aws.ecs(&["run-task", "--task-definition", "huge"]);
    assert_eq!(never["tasks"], json!([]), "{never}");
    assert_eq!(never["failures"][0]["reason"], "RESOURCE:GPU", "{never}");
    assert!(never["failures"][0]["detail"].as_str().unwrap().contains("can never be placed"), "{never}");
    let later = aws.ecs(&["run-task", "--task-definition", "big", "--count", "5"]);
    assert_eq!(later["failures"], json!([]), "{later}");
    let waiting: Vec<&str> = later["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["lastStatus"] == "PENDING" && t.get("containerInstanceArn").is_none())
        .map(|t| t["taskArn"].as_str().unwrap())
        .collect();
    assert!(!waiting.is_empty(), "five 140,000 MiB tasks on four GPUs that hold three small ones: {later}");
    for t in later["tasks"].as_array().unwrap() {
        aws.ecs(&["stop-task", "--task", t["taskArn"].as_str().unwrap()]);
    }

    // A DAEMON service: one task on each container instance, whatever count is given.
    let node_agent = json!({"family": "node-agent", "containerDefinitions": [{"name": "a", "image": docker.image,
        "memory": 32, "command": ["sleep", "600"]}]});
    let path = home.path().join("node-agent.json");
    std::fs::write(&path, node_agent.to_string()).unwrap();
    aws.ecs(&["register-task-definition", "--cli-input-json", &format!("file://{}", path.display())]);
    let created = aws.ecs(&[
        "create-service",
        "--service-name",
        "node-agent",
        "--task-definition",
        "node-agent",
        "--scheduling-strategy",
        "DAEMON",
    ]);
    assert_eq!(
        (&created["service"]["schedulingStrategy"], &created["service"]["desiredCount"]),
        (&json!("DAEMON"), &json!(2)),
        "{created}"
    );
    aws.ecs(&["wait", "services-stable", "--services", "node-agent"]);
    let daemon_tasks = || async {
        let q = TaskQuery { service: Some("node-agent".into()), live: true, ..Default::default() };
        admin.list_tasks(&q).await.unwrap()
    };
    let on: BTreeSet<String> =
        daemon_tasks().await.iter().filter_map(|t| t.host_id.as_ref().map(|h| h.to_string())).collect();
    assert_eq!(on.len(), 2, "one task on each of the two hosts: {on:?}");
    let listed = aws.ecs(&["list-services", "--scheduling-strategy", "DAEMON"]);
    assert_eq!(listed["serviceArns"].as_array().map(Vec::len), Some(1), "{listed}");
    assert!(listed["serviceArns"][0].as_str().unwrap().ends_with("/node-agent"), "{listed}");

    // Drain one instance: mpsfleet drains the host.
    let drained = aws.ecs(&[
        "update-container-instances-state",
        "--container-instances",
        &arns[0],
        "--status",
        "DRAINING",
    ]);
    assert_eq!(drained["containerInstances"][0]["status"], "DRAINING", "{drained}");
    let host_id = arns[0].rsplit('/').next().unwrap();
    let h = admin.list_hosts(None).await.unwrap().into_iter().find(|h| h.id.as_str() == host_id).unwrap();
    assert_eq!(h.status, HostStatus::Draining);
    // The drained instance's DAEMON task stops, and starts nowhere else.
    eventually(Duration::from_secs(60), "the drained host's DAEMON task stopped", || async {
        let live = daemon_tasks().await;
        (live.len() == 1 && live[0].host_id.as_ref().is_some_and(|h| h.as_str() != host_id)).then_some(())
    })
    .await;
    let daemon = aws.ecs(&["describe-services", "--services", "node-agent"]);
    assert_eq!(daemon["services"][0]["desiredCount"], 1, "{daemon}");

    // Stop the task run first.
    let stopped = aws.ecs(&["stop-task", "--task", &task_arn, "--reason", "done"]);
    assert_eq!(stopped["task"]["desiredStatus"], "STOPPED");
    aws.ecs(&["wait", "tasks-stopped", "--tasks", &task_arn]);
    let after = aws.ecs(&["describe-tasks", "--tasks", &task_arn]);
    assert_eq!(after["tasks"][0]["lastStatus"], "STOPPED");
    assert_eq!(admin.describe_task(id).await.unwrap().last_status, TaskStatus::Stopped);

    // boto3's refusals.
    let viewer = key(Role::Viewer, None).await;
    let other = key(Role::Operator, Some("other")).await;
    let web_tasks = aws.ecs(&["list-tasks", "--service-name", "web"]);
    let live = web_tasks["taskArns"][0].as_str().unwrap().to_string();
    let keys = json!({
        "operator": [operator.0, operator.1], "viewer": [viewer.0, viewer.1], "other": [other.0, other.1],
        "task": task_arn, "family": "mps-infer", "live": live,
    });
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env.join("sdk/bin/python"))
        .arg(root.join("tests/ecs/boto3_checks.py"))
        .args([&up.url, &ca, &keys.to_string()])
        .output()
        .unwrap();
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Every ECS change is in the audit log, by the key's token.
    let audit = admin.audit(200).await.unwrap();
    for action in [
        "ECS RegisterTaskDefinition",
        "ECS RunTask",
        "ECS CreateService",
        "ECS UpdateService",
        "ECS StopTask",
    ] {
        assert!(
            audit
                .iter()
                .any(|e| e.event.action == action && e.event.actor == format!("token:{operator_token}")),
            "{action} is not in the audit log"
        );
    }

    // A deleted service answers INACTIVE (the AWS CLI's waiter looks for that), its
    // deployments are still listed, and its name is free again at once.
    aws.ecs(&["delete-service", "--service", "web", "--force"]);
    aws.ecs(&["wait", "services-inactive", "--services", "web"]);
    let gone = aws.ecs(&["describe-services", "--services", "web"]);
    assert_eq!(
        (&gone["services"][0]["status"], &gone["failures"]),
        (&json!("INACTIVE"), &json!([])),
        "{gone}"
    );
    let listed = aws.ecs(&["list-service-deployments", "--service", "web"]);
    let deployments = listed["serviceDeployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 2, "the first definition's and the second's: {listed}");
    let newest = deployments[0]["serviceDeploymentArn"].as_str().unwrap();
    assert!(newest.contains(":service-deployment/default/web/"), "{listed}");
    assert!(
        deployments[0]["createdAt"].as_f64() >= deployments[1]["createdAt"].as_f64(),
        "newest first: {listed}"
    );
    let described = aws.ecs(&["describe-service-deployments", "--service-deployment-arns", newest]);
    let d = &described["serviceDeployments"][0];
    assert_eq!(d["targetServiceRevision"]["requestedTaskCount"], 2, "{d}");
    assert_eq!(d["status"], "SUCCESSFUL", "{d}");
    let expected = example_keys(&env, "describe-service-deployments", "serviceDeployments");
    assert_eq!(missing(&expected, d), Vec::<String>::new(), "{d}");
    aws.ecs(&[
        "create-service",
        "--service-name",
        "web",
        "--task-definition",
        "mps-infer",
        "--desired-count",
        "0",
    ]);
    let again = aws.ecs(&["describe-services", "--services", "web"]);
    assert_eq!(again["services"][0]["status"], "ACTIVE", "the live one is the one a name finds: {again}");
}
