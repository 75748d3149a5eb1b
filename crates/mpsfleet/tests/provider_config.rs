//! Provider commands are the server's configuration, not API input, and the join token never
//! reaches them: the real server with a configuration file, an exec provider that boots real
//! agents, and an admin who tries to make the server run a command of theirs.

mod common;

use common::*;
use mpsfleet_types::policy::{ExecCommands, Provider, ProviderKind};
use mpsfleet_types::*;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

/// Ends every process of the launched machines when dropped, the test failing or not.
struct Machines(std::path::PathBuf);

impl Drop for Machines {
    fn drop(&mut self) {
        stop_processes_mentioning(&self.0.display().to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_cannot_supply_provider_commands_and_launched_hosts_never_see_the_join_token() {
    let dir = tempfile::tempdir().unwrap();
    let machines = dir.path().join("machines");
    std::fs::create_dir_all(&machines).unwrap();
    let _machines = Machines(machines.clone());
    let pwned = dir.path().join("pwned");
    let evil = dir.path().join("evil.sh");
    std::fs::write(&evil, format!("#!/bin/sh\ntouch {}\n", pwned.display())).unwrap();
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();

    // The configured provider records what it is given (stdin, argv, environment) and boots
    // an agent with the request's token in its environment, as a cloud's user data would.
    let launch = dir.path().join("launch.sh");
    std::fs::write(
        &launch,
        format!(
            r#"#!/bin/sh
req=$(cat)
name=$(printf '%s' "$req" | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
token=$(printf '%s' "$req" | sed -n 's/.*"joinToken":"\([^"]*\)".*/\1/p')
server=$(printf '%s' "$req" | sed -n 's/.*"server":"\([^"]*\)".*/\1/p')
{{ printf '%s\n' "$req"; echo "argv: $0 $*"; env; }} > {m}/$name.seen
MPSFLEET_JOIN_TOKEN="$token" setsid {exe} agent --server "$server" --pool gpu --hostname "$name" \
  --data-dir {m}/$name --emulate-gpus H200:143771:1 --mps-model --heartbeat-ms 200 \
  >{m}/$name.log 2>&1 </dev/null &
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do [ -s {m}/$name.log ] && break; sleep 0.2; done
echo '{{"providerId": "'$name'", "state": "PENDING"}}'
"#,
            m = machines.display(),
            exe = env!("CARGO_BIN_EXE_mpsfleet"),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&launch, std::fs::Permissions::from_mode(0o755)).unwrap();
    let other = dir.path().join("other.sh");
    std::fs::write(&other, "#!/bin/sh\ncat >/dev/null\necho '{\"state\": \"RUNNING\"}'\n").unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (launch, other) = (launch.display().to_string(), other.display().to_string());
    let config = exec_provider_config(dir.path(), "boot", &launch, &other, &other);

    // A configuration others may write is refused at start, naming the file.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["server", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("refused"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("writable by group or others"), "{stderr}");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();

    let config = config.display().to_string();
    let server = Server::start_with(&dir.path().join("server"), "127.0.0.1:0", &["--config", &config]);
    let admin = server.admin();
    let pool = |provider| CreatePool {
        name: "gpu".into(),
        mode: Some(OwnershipMode::Managed),
        provider: Some(provider),
        ..Default::default()
    };

    // Commands in the request: refused, naming the field, and nothing runs.
    let commands = ExecCommands {
        launch: vec![evil.display().to_string()],
        terminate: vec![evil.display().to_string()],
        describe: vec![evil.display().to_string()],
    };
    let attack = Provider {
        kind: ProviderKind::Exec,
        name: Some("boot".into()),
        exec: Some(commands.clone()),
        desired_hosts: 1,
        host_shape: None,
        launch_timeout_seconds: None,
        managed_scaling: None,
    };
    let e = admin.create_pool(&pool(attack)).await.unwrap_err().to_string();
    assert!(e.contains("provider.exec") && e.contains("server's configuration"), "{e}");
    // A name the configuration does not have: refused, listing the names it has.
    let e = admin.create_pool(&pool(Provider::exec("nope", 1))).await.unwrap_err().to_string();
    assert!(e.contains("provider.name") && e.contains("no exec provider \"nope\": it has boot"), "{e}");

    // The configured provider by name: it launches a host, which joins with a token for it
    // alone.
    admin.create_pool(&pool(Provider::exec("boot", 1))).await.expect("create pool");
    let attack = UpdatePool {
        provider: Some(Provider {
            kind: ProviderKind::Exec,
            name: None,
            exec: Some(commands),
            desired_hosts: 1,
            host_shape: None,
            launch_timeout_seconds: None,
            managed_scaling: None,
        }),
        ..Default::default()
    };
    let e = admin.update_pool("gpu", &attack).await.unwrap_err().to_string();
    assert!(e.contains("provider.exec"), "{e}");
    let host = eventually(Duration::from_secs(60), "the launched host to join", || async {
        admin.list_hosts(None).await.ok()?.into_iter().find(|h| h.hostname == "gpu-0")
    })
    .await;
    assert_eq!(host.pool.as_str(), "gpu");

    let seen = std::fs::read_to_string(machines.join("gpu-0.seen")).unwrap();
    let join_token = server.join_token();
    assert!(!seen.contains(&join_token), "the provider command saw the join token:\n{seen}");
    assert!(seen.contains("\"joinToken\":\"mpsf_launch_"), "{seen}");
    assert!(!seen.contains("--join-token"), "agentArgs carry the token:\n{seen}");
    // The launch token is no join token: it registers nothing else. (Once its host has
    // registered, the capacity reconcile forgets it, and then it is no token at all.)
    let token = seen.split("\"joinToken\":\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let joiner = server.client(Some(token));
    let mut reg = registration("gpu", "intruder", "GPU-intruder", 1);
    let e = joiner.register_host(&reg).await.unwrap_err().to_string();
    assert!(e.contains("registers host gpu-0 into pool gpu") || e.contains("unknown token"), "{e}");
    reg.hostname = "gpu-0".into();
    let e = joiner.register_host(&reg).await.unwrap_err().to_string();
    assert!(e.contains("already used") || e.contains("unknown token"), "{e}");
    let hosts = admin.list_hosts(None).await.unwrap();
    assert_eq!(hosts.iter().filter(|h| h.hostname == "gpu-0").count(), 1, "{hosts:?}");
    assert!(hosts.iter().all(|h| h.hostname != "intruder"), "{hosts:?}");
    assert!(joiner.list_pools().await.is_err(), "a launch token is no admin token");
    assert!(!pwned.exists(), "the server ran a command the API supplied");
}
