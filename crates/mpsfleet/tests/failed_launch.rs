//! A managed pool whose exec provider reports every launch as failed while the machine boots
//! anyway, and cannot terminate anything: the real server and agents, for most of a minute.

mod common;

use common::*;
use mpsfleet_types::policy::{HealthPolicy, Provider};
use mpsfleet_types::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Ends every process of the launched machines when dropped, the test failing or not.
struct Machines(std::path::PathBuf);

impl Drop for Machines {
    fn drop(&mut self) {
        stop_processes_mentioning(&self.0.display().to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_reported_failed_that_boots_anyway_stays_small_and_binds_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("machines");
    std::fs::create_dir_all(&hosts).unwrap();
    let _machines = Machines(hosts.clone());
    // launch: start an agent with the request's token, as a cloud would boot the machine, then
    // report failure anyway. A relaunch of a machine that is up starts nothing new.
    let launch = script(
        dir.path(),
        "launch.sh",
        &format!(
            r#"req=$(cat)
field() {{ printf '%s' "$req" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }}
name=$(field name); token=$(field joinToken); server=$(field server)
pidfile={hosts}/$name.pid
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then echo 'quota exceeded' >&2; exit 1; fi
MPSFLEET_LOG=info MPSFLEET_JOIN_TOKEN="$token" setsid {exe} agent --server "$server" --pool gpu --hostname "$name" \
  --data-dir {hosts}/$name --emulate-gpus H200:143771:1 --mps-model --heartbeat-ms 200 \
  >{hosts}/$name.log 2>&1 </dev/null &
echo $! > "$pidfile"
# The provider ends the command's process group when it exits: leave once the agent has left
# it (it logs after setsid).
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do [ -s {hosts}/$name.log ] && break; sleep 0.2; done
echo 'quota exceeded' >&2
exit 1
"#,
            hosts = hosts.display(),
            exe = env!("CARGO_BIN_EXE_mpsfleet"),
        ),
    );
    let fail = script(dir.path(), "fail.sh", "cat >/dev/null; echo 'cloud API unreachable' >&2; exit 1\n");
    let config = exec_provider_config(dir.path(), "flaky", &launch, &fail, &fail);
    let config = config.display().to_string();
    let server = Server::start_with(&dir.path().join("server"), "127.0.0.1:0", &["--config", &config]);
    let admin = server.admin();
    admin
        .create_pool(&CreatePool {
            name: "gpu".into(),
            mode: Some(OwnershipMode::Managed),
            health_policy: Some(HealthPolicy {
                agent_heartbeat_grace_ms: 1000,
                toleration_ms: 0,
                ..Default::default()
            }),
            provider: Some(Provider::exec("flaky", 1)),
            ..Default::default()
        })
        .await
        .expect("create pool");
    // The host goes silent after onboarding: it is declared bad and a replacement is launched.
    let (bad, _agent) = add_host(&server, "gpu", "n1", 1).await;
    let incident = eventually(Duration::from_secs(30), "an incident", || async {
        admin.list_incidents().await.ok()?.into_iter().find(|i| i.incident.host_id == bad)
    })
    .await;
    let id = incident.incident.id.clone();
    // Someone with the join token registers under the replacement's name.
    let (impostor, _impostor_agent) = add_host(&server, "gpu", &format!("{id}-r"), 1).await;

    let started = tokio::time::Instant::now();
    let bound = loop {
        let i = admin.describe_incident(&id).await.unwrap().incident;
        if let Some(h) = i.replacement.as_ref().and_then(|r| r.host_id.clone()) {
            break h;
        }
        if started.elapsed() > Duration::from_secs(40) {
            let logs: Vec<String> = std::fs::read_dir(&hosts)
                .unwrap()
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                .collect();
            panic!("no replacement bound: {:#?}\nmachine logs: {logs:#?}", i.timeline);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_ne!(bound, impostor, "a host with the join token became the replacement");

    // The terminations keep failing; let it run.
    tokio::time::sleep(Duration::from_secs(40).saturating_sub(started.elapsed())).await;
    let i = admin.describe_incident(&id).await.unwrap().incident;
    assert!(i.has(Step::ReplacementReady), "{:#?}", i.timeline);
    assert!(i.timeline.len() <= 64, "{} timeline entries", i.timeline.len());
    let retries: Vec<&TimelineEntry> = i.timeline.iter().filter(|e| e.step == Step::ProviderRetry).collect();
    // Each failed termination is asked again after a longer wait, not in a loop.
    let asks: Vec<&&TimelineEntry> = retries.iter().filter(|e| e.detail.starts_with("terminate ")).collect();
    assert!((2..=6).contains(&asks.len()), "{:#?}", i.timeline);
    assert!(
        asks[0].detail.contains("asked again in 5s") && asks[1].detail.contains("asked again in 10s"),
        "{asks:#?}"
    );
    assert_ne!(i.state, IncidentState::Resolved);
    let bytes = dir_bytes(&server.data_dir);
    assert!(bytes < 8 * 1024 * 1024, "the data dir grew to {bytes} bytes");

    // The operator can end it, and says why.
    let done = admin.resolve_incident(&id, "old machine removed by hand").await.unwrap();
    assert_eq!(done.incident.unwrap().incident.state, IncidentState::Resolved);
}
