//! The `aws-ec2` capacity provider against moto's EC2 (`moto_server` 5.2.5 from
//! `scripts/ecs-env.sh`, on a free loopback port): launches with their user data and tags,
//! idempotent relaunches, describe and terminate, launch templates, and credentials from the
//! environment, a shared credentials file and the instance metadata service. One test runs moto
//! with IAM authentication on, so that moto checks every request's SigV4 signature with
//! botocore's signer. Nothing here reaches beyond 127.0.0.1.

mod common;

use common::*;
use mpsfleet_server::provider::ec2::{parse_instances, AwsEnv, Ec2Instance, Ec2Provider, XmlElement};
use mpsfleet_server::provider::{
    CapacityProvider, Ec2Config, LaunchRequest, ProviderError, ProviderHostState,
};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const AMI: &str = "ami-12c6146b";

/// A `moto_server` process; killed when dropped.
struct Moto {
    child: Child,
    url: String,
    env: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Moto {
    /// Starts moto on a free loopback port with `vars` (and nothing of this process's
    /// environment but PATH) and waits until it accepts connections. None when the
    /// environment is missing outside CI.
    fn start(vars: &[(&str, &str)]) -> Option<Moto> {
        let env = ecs_env()?;
        let server = env.join("sdk/bin/moto_server");
        let has_flask = Command::new(env.join("sdk/bin/python"))
            .args(["-c", "import flask, flask_cors"])
            .status()
            .is_ok_and(|s| s.success());
        if !server.is_file() || !has_flask {
            assert!(
                !on_ci(),
                "{} has no moto_server with flask and CI is set: run scripts/ecs-env.sh",
                env.display()
            );
            println!("skipped: no moto_server with flask in {}; run scripts/ecs-env.sh", env.display());
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("moto.log");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cmd = Command::new(&server);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("moto.err")).unwrap());
        let child = cmd.spawn().expect("start moto_server");
        let mut moto = Moto { child, url: format!("http://127.0.0.1:{port}"), env, log, _dir: dir };
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for _ in 0..600 {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Some(moto);
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("moto_server exited ({status}): {}", moto.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("moto_server did not listen on {port} within 60 s: {}", moto.logs());
    }

    fn logs(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}{}", read(&self.log), read(&self.log.with_file_name("moto.err")))
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A configuration pointed at moto, from JSON merged over the region and endpoint.
fn config(moto: &Moto, extra: serde_json::Value) -> Ec2Config {
    let mut v = serde_json::json!({"region": "us-east-1", "endpointUrl": moto.url});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    serde_json::from_value(v).unwrap()
}

fn instance_config(moto: &Moto) -> Ec2Config {
    config(moto, serde_json::json!({"instanceType": "t3.micro", "imageId": AMI, "tags": {"Team": "ml"}}))
}

/// Keys in the environment, nothing else: no shared files, no metadata service.
fn env_keys() -> AwsEnv {
    AwsEnv::fixed([
        ("AWS_ACCESS_KEY_ID", "AKIDMPSFLEETTEST"),
        ("AWS_SECRET_ACCESS_KEY", "not-a-real-secret"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"),
        ("AWS_CONFIG_FILE", "/nonexistent/config"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ])
}

fn provider(config: Ec2Config, pool: &str, env: AwsEnv) -> Ec2Provider {
    Ec2Provider::new(config, pool).unwrap().with_env(env)
}

fn request(name: &str, token: &str, incident: &str) -> LaunchRequest {
    LaunchRequest {
        name: name.into(),
        pool: String::new(),
        server: "https://cp.example:7443".into(),
        join_token: token.into(),
        agent_args: vec!["--mps-probe-timeout-ms".into(), "2000".into()],
        incident: incident.into(),
    }
}

/// Every instance (any pool, any state) matching `filters` (`tag:KEY`, value), read with a
/// plain DescribeInstances.
fn instances(p: &Ec2Provider, filters: &[(&str, &str)]) -> Vec<Ec2Instance> {
    let mut params = Vec::new();
    for (i, (name, value)) in filters.iter().enumerate() {
        params.push((format!("Filter.{}.Name", i + 1), name.to_string()));
        params.push((format!("Filter.{}.Value.1", i + 1), value.to_string()));
    }
    let refs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    parse_instances(&p.query("DescribeInstances", &refs).unwrap())
}

/// The instance's element in a DescribeInstances answer.
fn instance_xml(p: &Ec2Provider, id: &str) -> XmlElement {
    let answer = p.query("DescribeInstances", &[("InstanceId.1", id)]).unwrap();
    let instance = answer.items("reservationSet").find_map(|r| r.items("instancesSet").next().cloned());
    instance.expect("an instance")
}

/// The instance's user data, decoded.
fn user_data(p: &Ec2Provider, id: &str) -> String {
    let answer =
        p.query("DescribeInstanceAttribute", &[("InstanceId", id), ("Attribute", "userData")]).unwrap();
    let encoded = answer.text_at(&["userData", "value"]).expect("userData in the answer");
    String::from_utf8(base64_decode(encoded)).unwrap()
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {text:?}"),
    };
    let digits: Vec<u8> =
        text.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).map(value).collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &d)| n | u32::from(d) << (18 - 6 * i));
        out.extend(n.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}

/// Describes `name` until `want` matches (moto moves a new instance from pending to running
/// when it is described), at most 20 times.
fn wait_for(p: &Ec2Provider, name: &str, want: impl Fn(&ProviderHostState) -> bool) -> ProviderHostState {
    let mut last = None;
    for _ in 0..20 {
        let state = p.describe(name).unwrap();
        if want(&state) {
            return state;
        }
        last = Some(state);
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{name} never reached the state wanted; last {last:?}");
}

#[test]
fn ec2_provider_launches_describes_and_terminates_instances_on_moto() {
    let Some(moto) = Moto::start(&[]) else { return };
    let p = provider(instance_config(&moto), "train", env_keys());

    // A launch: one instance, its user data runs the agent with the token, its tags name
    // the pool, the host and (empty) the incident.
    let first = p.launch(&request("gpu-1", "mpsf_launch_one", "")).unwrap();
    assert!(first.provider_id.starts_with("i-"), "{first:?}");
    assert!(matches!(first.state, ProviderHostState::Pending | ProviderHostState::Running), "{first:?}");
    let script = user_data(&p, &first.provider_id);
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    for part in [
        "MPSFLEET_JOIN_TOKEN='mpsf_launch_one' exec mpsfleet agent",
        "--server 'https://cp.example:7443'",
        "--pool 'train'",
        "--hostname 'gpu-1'",
        "'--mps-probe-timeout-ms' '2000'",
    ] {
        assert!(script.contains(part), "{part} not in {script}");
    }
    let tagged = instances(&p, &[("tag:mpsfleet:host", "gpu-1")]);
    assert_eq!(tagged.len(), 1, "{tagged:?}");
    let tags = &tagged[0].tags;
    assert_eq!(tags.get("mpsfleet:pool").map(String::as_str), Some("train"), "{tags:?}");
    assert_eq!(tags.get("mpsfleet:host").map(String::as_str), Some("gpu-1"), "{tags:?}");
    assert_eq!(tags.get("mpsfleet:incident").map(String::as_str), Some(""), "{tags:?}");
    assert_eq!(tags.get("Team").map(String::as_str), Some("ml"), "{tags:?}");
    let xml = instance_xml(&p, &first.provider_id);
    assert_eq!(xml.text_at(&["instanceType"]), Some("t3.micro"));
    assert_eq!(xml.text_at(&["imageId"]), Some(AMI));

    // A retried launch of the same name finds the first instance, whatever its token.
    let again = p.launch(&request("gpu-1", "mpsf_launch_one", "")).unwrap();
    assert_eq!(again.provider_id, first.provider_id);
    let other_token = p.launch(&request("gpu-1", "mpsf_repl_other", "")).unwrap();
    assert_eq!(other_token.provider_id, first.provider_id);
    assert_eq!(instances(&p, &[("tag:mpsfleet:host", "gpu-1")]).len(), 1);

    // A second name is a second instance.
    let second = p.launch(&request("gpu-2", "mpsf_launch_two", "")).unwrap();
    assert_ne!(second.provider_id, first.provider_id);
    assert_eq!(instances(&p, &[("tag:mpsfleet:pool", "train")]).len(), 2);
    assert!(user_data(&p, &second.provider_id).contains("--hostname 'gpu-2'"));

    // Describe: running once booted; a name without an instance is unknown.
    wait_for(&p, "gpu-1", |s| *s == ProviderHostState::Running);
    match p.describe("gpu-9").unwrap() {
        ProviderHostState::Unknown { detail } => {
            assert_eq!(detail, "no EC2 instance tagged mpsfleet:pool=train, mpsfleet:host=gpu-9")
        }
        other => panic!("gpu-9: {other:?}"),
    }
    assert_eq!(p.hosts(), ["gpu-1", "gpu-2"]);

    // Terminate: the instance reaches terminated, and terminating again says so.
    let asked = p.terminate("gpu-2").unwrap();
    println!("terminate gpu-2: {asked}");
    assert!(
        matches!(asked, ProviderHostState::Terminated { .. } | ProviderHostState::Terminating),
        "{asked:?}"
    );
    let gone = wait_for(&p, "gpu-2", |s| matches!(s, ProviderHostState::Terminated { .. }));
    let ProviderHostState::Terminated { detail } = gone else { unreachable!() };
    assert!(detail.contains(&second.provider_id) && detail.contains("terminated"), "{detail}");
    assert!(matches!(p.terminate("gpu-2").unwrap(), ProviderHostState::Terminated { .. }));
    assert_eq!(
        instances(&p, &[("tag:mpsfleet:host", "gpu-2")])[0].state,
        "terminated",
        "the instance itself is terminated"
    );
    assert_eq!(p.hosts(), ["gpu-1"]);

    // An incident's replacement, launched twice as remediation retries (each time with a
    // new replacement token): one instance, tagged with the incident.
    let repl = p.launch(&request("inc-7-r", "mpsf_repl_a", "inc-7")).unwrap();
    let repl_again = p.launch(&request("inc-7-r", "mpsf_repl_b", "inc-7")).unwrap();
    assert_eq!(repl.provider_id, repl_again.provider_id);
    let for_incident = instances(&p, &[("tag:mpsfleet:incident", "inc-7")]);
    assert_eq!(for_incident.len(), 1, "{for_incident:?}");
    assert_eq!(for_incident[0].id, repl.provider_id);
    assert!(user_data(&p, &repl.provider_id).contains("MPSFLEET_JOIN_TOKEN='mpsf_repl_a'"));

    // Another pool's provider sees none of these.
    let infer = provider(instance_config(&moto), "infer", env_keys());
    assert!(infer.hosts().is_empty());
    assert!(matches!(infer.describe("gpu-1").unwrap(), ProviderHostState::Unknown { .. }));

    // A launch request for another pool is refused before any call.
    let wrong_pool = LaunchRequest { pool: "infer".into(), ..request("gpu-3", "t", "") };
    let e = p.launch(&wrong_pool).unwrap_err();
    assert!(matches!(e, ProviderError::Launch { .. }), "{e}");

    // Credentials from the instance metadata service (IMDSv2, which moto also serves) when
    // neither the environment nor the shared files have any.
    let imds = provider(
        instance_config(&moto),
        "train",
        AwsEnv::fixed([
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", moto.url.as_str()),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"),
            ("AWS_CONFIG_FILE", "/nonexistent/config"),
        ]),
    );
    assert_eq!(imds.try_hosts().unwrap(), ["gpu-1", "inc-7-r"]);
}

#[test]
fn ec2_provider_launches_from_a_launch_template_on_moto() {
    let Some(moto) = Moto::start(&[]) else { return };
    let setup = provider(instance_config(&moto), "setup", env_keys());
    let created = setup
        .query(
            "CreateLaunchTemplate",
            &[
                ("LaunchTemplateName", "gpu-host"),
                ("LaunchTemplateData.ImageId", AMI),
                ("LaunchTemplateData.InstanceType", "g5.xlarge"),
            ],
        )
        .unwrap();
    let template_id = created.text_at(&["launchTemplate", "launchTemplateId"]).expect("the template's id");
    assert!(template_id.starts_with("lt-"), "{created:?}");

    for (pool, template) in [
        ("by-name", serde_json::json!({"name": "gpu-host", "version": "$Latest"})),
        ("by-id", serde_json::json!({"id": template_id, "version": "1"})),
    ] {
        let p = provider(
            config(
                &moto,
                serde_json::json!({"launchTemplate": template, "agentCommand": "/opt/mpsfleet/bin/mpsfleet agent"}),
            ),
            pool,
            env_keys(),
        );
        let launched = p.launch(&request("gpu-1", "mpsf_launch_t", "")).unwrap();
        let xml = instance_xml(&p, &launched.provider_id);
        assert_eq!(xml.text_at(&["instanceType"]), Some("g5.xlarge"), "{pool}");
        assert_eq!(xml.text_at(&["imageId"]), Some(AMI), "{pool}");
        let script = user_data(&p, &launched.provider_id);
        assert!(script.contains("exec /opt/mpsfleet/bin/mpsfleet agent --server"), "{script}");
        assert_eq!(
            p.launch(&request("gpu-1", "mpsf_launch_t", "")).unwrap().provider_id,
            launched.provider_id
        );
        assert_eq!(p.hosts(), ["gpu-1"], "{pool}");
    }
}

/// An IAM user with EC2 rights and its access key, made with boto3 while moto still takes
/// unauthenticated calls (the first three).
fn iam_user(moto: &Moto) -> (String, String) {
    let script = r#"
import boto3, json, sys
iam = boto3.client("iam", endpoint_url=sys.argv[1], region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="fleet")
iam.put_user_policy(UserName="fleet", PolicyName="ec2", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="fleet")["AccessKey"]
print(key["AccessKeyId"], key["SecretAccessKey"])
"#;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(moto.env.join("sdk/bin/python"))
        .args(["-c", script, &moto.url])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(child.wait().unwrap().success(), "{err}\n{}", moto.logs());
    let (key, secret) = out.trim().split_once(' ').expect("a key and its secret");
    (key.to_string(), secret.to_string())
}

#[test]
fn ec2_provider_signs_with_each_credential_source_on_moto_checking_signatures() {
    let Some(moto) = Moto::start(&[("INITIAL_NO_AUTH_ACTION_COUNT", "3")]) else { return };
    let (key, secret) = iam_user(&moto);
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[default]\naws_access_key_id = {key}\naws_secret_access_key = wrong-secret\n\n\
             [fleet]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
        ),
    )
    .unwrap();
    let files = |extra: &[(&str, &str)]| {
        let mut vars = vec![
            ("AWS_SHARED_CREDENTIALS_FILE".to_string(), credentials.display().to_string()),
            ("AWS_CONFIG_FILE".to_string(), dir.path().join("config").display().to_string()),
            ("AWS_EC2_METADATA_DISABLED".to_string(), "true".to_string()),
        ];
        vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        AwsEnv::fixed(vars)
    };

    // The profile of the shared credentials file, named in the configuration: moto checks
    // each request's signature against the user's secret.
    let fleet =
        config(&moto, serde_json::json!({"instanceType": "t3.micro", "imageId": AMI, "profile": "fleet"}));
    let p = provider(fleet.clone(), "train", files(&[]));
    let launched = p.launch(&request("gpu-1", "mpsf_launch_signed", "")).unwrap();
    assert_eq!(
        p.launch(&request("gpu-1", "mpsf_launch_signed", "")).unwrap().provider_id,
        launched.provider_id
    );
    assert!(matches!(p.describe("gpu-1").unwrap(), ProviderHostState::Pending | ProviderHostState::Running));
    // AWS_PROFILE names it too; the environment's keys come first when no profile is
    // configured.
    let plain = config(&moto, serde_json::json!({"instanceType": "t3.micro", "imageId": AMI}));
    assert_eq!(provider(plain.clone(), "train", files(&[("AWS_PROFILE", "fleet")])).hosts(), ["gpu-1"]);
    let env = files(&[("AWS_ACCESS_KEY_ID", key.as_str()), ("AWS_SECRET_ACCESS_KEY", secret.as_str())]);
    assert_eq!(provider(plain.clone(), "train", env).try_hosts().unwrap(), ["gpu-1"]);

    // A wrong secret (the default profile's): EC2's AuthFailure, named, not retried, and
    // neither the secret nor the launch token in the message.
    let wrong = provider(plain, "train", files(&[]));
    let e = wrong.launch(&request("gpu-2", "mpsf_launch_secret", "")).unwrap_err();
    match &e {
        ProviderError::Cloud { call, code, transient, .. } => {
            assert_eq!(
                (call.as_str(), code.as_str(), *transient),
                ("EC2 DescribeInstances", "AuthFailure", false),
                "{e}"
            );
        }
        other => panic!("{other}"),
    }
    let text = e.to_string();
    println!("a wrong secret: {text}");
    assert!(
        text.starts_with("cannot launch host gpu-2: EC2 DescribeInstances failed: AuthFailure: "),
        "{text}"
    );
    assert!(!text.contains("wrong-secret") && !text.contains("mpsf_launch_secret"), "{text}");
    assert!(!mpsfleet_server::provider::Retryable::is_transient(&e));

    // A profile that is in neither file: refused, naming the sources.
    let missing = provider(Ec2Config { profile: Some("nope".into()), ..fleet }, "train", files(&[]));
    let e = missing.describe("gpu-1").unwrap_err().to_string();
    println!("a missing profile: {e}");
    assert!(e.contains("no usable AWS credentials") && e.contains("no keys for profile \"nope\""), "{e}");
    assert!(!e.contains(&secret), "{e}");
}

/// The real server with an `ec2Providers` entry pointed at moto, its credentials in its own
/// environment (nothing of this machine's `AWS_*` variables).
fn ec2_server(moto: &Moto, dir: &Path) -> Server {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let config = dir.join("server-config.json");
    let ec2 = serde_json::json!({"region": "us-east-1", "endpointUrl": moto.url, "instanceType": "t3.micro",
        "imageId": AMI, "tags": {"Team": "ml"}});
    std::fs::write(&config, serde_json::json!({"ec2Providers": {"gpu": ec2}}).to_string()).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let data_dir = dir.join("server");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mpsfleet"));
    cmd.args(["server", "--listen", "127.0.0.1:0", "--insecure-http", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(&data_dir);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("AWS_") {
            cmd.env_remove(name);
        }
    }
    let mut child = cmd
        .envs([
            ("AWS_ACCESS_KEY_ID", "AKIDMPSFLEETSERVER"),
            ("AWS_SECRET_ACCESS_KEY", "not-a-real-secret"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"),
            ("AWS_CONFIG_FILE", "/nonexistent/config"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("MPSFLEET_LOG", "warn"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mpsfleet server");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("the server's address").unwrap();
        if let Some(url) = line.strip_prefix("mpsfleet server listening on ") {
            break url.to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Server { child, url, data_dir }
}

#[test]
fn ec2_providers_are_server_configuration_and_launch_a_pools_hosts_on_moto() {
    use mpsfleet_types::policy::{Provider, ProviderKind};
    use mpsfleet_types::{CreatePool, OwnershipMode};
    let Some(moto) = Moto::start(&[]) else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = ec2_server(&moto, dir.path());
    let admin = server.admin();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let pool = |name: Option<&str>| CreatePool {
        name: "gpu".into(),
        mode: Some(OwnershipMode::Managed),
        provider: Some(Provider {
            kind: ProviderKind::AwsEc2,
            name: name.map(str::to_string),
            ..Provider::local(1)
        }),
        ..Default::default()
    };

    // A name the configuration does not have, or none: refused, naming the field.
    let e = rt.block_on(admin.create_pool(&pool(Some("nope")))).unwrap_err().to_string();
    assert!(e.contains("provider.name") && e.contains("no aws-ec2 provider \"nope\": it has gpu"), "{e}");
    let e = rt.block_on(admin.create_pool(&pool(None))).unwrap_err().to_string();
    assert!(e.contains("provider.name") && e.contains("required when provider.kind is \"aws-ec2\""), "{e}");

    // The configured provider: the server launches the pool's host as an instance, with a
    // launch token for it alone in its user data.
    let created = rt.block_on(admin.create_pool(&pool(Some("gpu")))).expect("create the pool");
    assert_eq!(created.provider.as_ref().map(|p| p.kind), Some(ProviderKind::AwsEc2));
    let watcher = provider(instance_config(&moto), "gpu", env_keys());
    let mut launched = Vec::new();
    for _ in 0..300 {
        launched = instances(&watcher, &[("tag:mpsfleet:pool", "gpu")]);
        if !launched.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(launched.len(), 1, "{launched:?}");
    let host = launched[0].tags.get("mpsfleet:host").cloned().expect("the host's tag");
    assert_eq!(launched[0].tags.get("Team").map(String::as_str), Some("ml"));
    let script = user_data(&watcher, &launched[0].id);
    for part in [
        "MPSFLEET_JOIN_TOKEN='mpsf_launch_".to_string(),
        format!("--server '{}'", server.url),
        "--pool 'gpu'".to_string(),
        format!("--hostname '{host}'"),
    ] {
        assert!(script.contains(&part), "{part} not in {script}");
    }
    assert!(!script.contains(&server.join_token()), "the user data carries the join token:\n{script}");
    // The server describes it while it waits for the join; it launches no second machine.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(instances(&watcher, &[("tag:mpsfleet:pool", "gpu")]).len(), 1);
    assert_eq!(watcher.hosts(), [host]);
}
