//! Process tests of a task definition's secrets on the process runtime, with the real server
//! and agent binaries: a `valueFrom` registers whatever string it is, as on ECS, and a secret
//! that cannot be read when its container starts stops the task with ECS's
//! `ResourceInitializationError`.

mod common;

use common::*;
use mpsfleet_client::Client;
use mpsfleet_types::*;
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);

async fn run(admin: &Client, family: &str) -> Result<Task, mpsfleet_client::ClientError> {
    let req = RunTask {
        task_definition: family.into(),
        count: 1,
        pool: "gpu".into(),
        client_token: None,
        ..Default::default()
    };
    admin.run_task(&req).await.map(|mut r| r.tasks.remove(0))
}

#[tokio::test(flavor = "multi_thread")]
async fn any_value_from_registers_and_an_unreadable_secret_stops_the_task_at_launch() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        let agent = Agent::start_with_model(&server, &dir.path().join("agent"), 1);
        eventually(WAIT, "an ACTIVE host", || async {
            admin
                .list_hosts(Some("gpu"))
                .await
                .ok()
                .filter(|h| h.len() == 1 && h[0].status == HostStatus::Active)
        })
        .await;

        // ECS's own agent tests register this placeholder; so does mpsfleet.
        let placeholder = "$$$SECRET_VALUE_FROM$$$";
        let registered = admin
            .register_taskdef(taskdef(json!({
                "family": "sec-any",
                "containerDefinitions": [{
                    "name": "app", "command": ["sleep", "300"],
                    "secrets": [{"name": "S", "valueFrom": placeholder}],
                    "logConfiguration": {"logDriver": "json-file",
                        "secretOptions": [{"name": "x", "valueFrom": placeholder}]}
                }]
            })))
            .await
            .expect("a valueFrom of any string registers");
        assert_eq!(registered.task_definition.to_string(), "sec-any:1");
        // Nothing of that name is stored: the run is refused, naming the field and the name.
        let e = run(&admin, "sec-any").await.unwrap_err();
        assert_eq!(e.code(), Some("InvalidParameter"), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("containerDefinitions[0].secrets[0].valueFrom") && msg.contains(placeholder),
            "{msg}"
        );

        // A secret deleted after the run, before the container that names it starts (it waits
        // for the first to succeed), stops the task as ECS does.
        admin.create_secret("late-secret", "v".into()).await.unwrap();
        admin
            .register_taskdef(taskdef(json!({
                "family": "sec-late",
                "containerDefinitions": [
                    {"name": "first", "essential": false, "command": ["sh", "-c", "sleep 3"]},
                    {"name": "app", "command": ["sleep", "300"],
                     "dependsOn": [{"containerName": "first", "condition": "SUCCESS"}],
                     "secrets": [{"name": "S", "valueFrom": "late-secret"}]}
                ]
            })))
            .await
            .unwrap();
        let task = run(&admin, "sec-late").await.unwrap();
        admin.delete_secret("late-secret").await.unwrap();
        let stopped =
            task_reaching(&admin, &task.id, TaskStatus::Stopped, WAIT, |_| true, || agent.log()).await;
        assert_eq!(stopped.stop_code, Some(StopCode::TaskFailedToStart), "{stopped:?}");
        let reason = stopped.stopped_reason.clone().unwrap_or_default();
        assert!(reason.starts_with("ResourceInitializationError: "), "{reason}");
        assert!(
            reason.contains("containerDefinitions[1].secrets[0].valueFrom")
                && reason.contains("\"late-secret\""),
            "{reason}"
        );
        let app = stopped.containers.iter().find(|c| c.name == "app").expect("app's report");
        assert!(
            app.reason.as_deref().unwrap_or_default().starts_with("ResourceInitializationError"),
            "{app:?}"
        );
    })
    .await;
}
