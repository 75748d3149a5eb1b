//! Stored state is a contract: what an older build wrote loads in this one. The fixtures under
//! `tests/fixtures/stored-state/` were written by an older release binary through its CLI
//! (`scripts/make-state-fixture.sh`, which lists what the fleet holds): a SQLite data dir, and
//! the same fleet's etcd keys with the data dir the server kept beside them. A change to how
//! records are encoded, keyed or loaded fails here before it reaches a user's data.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use mpsfleet_core::clock::SystemClock;
use mpsfleet_server::cluster::{Cluster, TaskFilter};
use mpsfleet_store::{EtcdConfig, EtcdStore, Store};
use mpsfleet_types::TaskStatus;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixture(part: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stored-state").join(part)
}

/// A copy of a fixture directory, so that opening it (which may migrate) leaves the fixture as
/// it was written.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Everything the fixture's fleet holds, read back through the cluster.
fn assert_the_fleet(c: &Cluster, data_dir: &Path) {
    let pools = c.read().pools();
    let gpu = pools.iter().find(|p| p.name.as_str() == "gpu").expect("pool gpu");
    assert_eq!(serde_json::to_value(gpu.mode).unwrap(), "managed");

    let hosts = c.read().hosts(Some("gpu"));
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0].gpus.len(), 2, "two emulated H200s");

    let defs = c.read().taskdefs(Some("sleeper"));
    assert_eq!(defs.len(), 1);
    assert_eq!(defs[0].revision, 1);
    assert_eq!(defs[0].container_definitions[0].name, "main");

    let services = c.read().services();
    let web = services.iter().find(|s| s.service.name.as_str() == "web").expect("service web");
    assert_eq!(web.service.desired_count, 2);

    let all = TaskFilter { limit: usize::MAX, ..TaskFilter::default() };
    let tasks = c.tasks(&all);
    let of_web = tasks.iter().filter(|t| t.group.as_ref().is_some_and(|g| g.as_str() == "web")).count();
    let standalone = tasks.iter().filter(|t| t.group.is_none()).count();
    assert_eq!((of_web, standalone), (2, 1), "{tasks:?}");
    assert!(tasks.iter().all(|t| t.desired_status == TaskStatus::Running), "{tasks:?}");

    let tokens = c.read().api_tokens();
    assert!(tokens.iter().any(|t| t.description == "fixture"), "{tokens:?}");
    let join = c.read().join_tokens();
    assert!(join.iter().any(|t| t.description == "fixture"), "{join:?}");
    let secrets = c.secrets().expect("secrets");
    assert_eq!(secrets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["db-password"]);

    // The admin token the older build wrote still opens the API.
    let admin = std::fs::read_to_string(data_dir.join(mpsfleet_server::ADMIN_TOKEN_FILE)).unwrap();
    let who = c.authenticate(admin.trim()).expect("the admin token authenticates");
    assert!(matches!(who, mpsfleet_server::auth::Principal::Admin), "{who:?}");
}

#[test]
fn a_sqlite_data_dir_written_by_an_older_build_loads() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    copy_dir(&fixture("sqlite"), &dir);
    let opened = mpsfleet_server::open(&dir, Arc::new(SystemClock)).expect("the older data dir opens");
    assert!(opened.first_start.is_none(), "an existing cluster, not a new one");
    assert_the_fleet(&opened.cluster, &dir);
    // And again, after this build has opened (and possibly migrated) it.
    drop(opened);
    let again = mpsfleet_server::open(&dir, Arc::new(SystemClock)).expect("it opens again");
    assert_the_fleet(&again.cluster, &dir);
}

#[test]
fn an_etcd_store_written_by_an_older_build_loads() {
    let endpoints = std::env::var("MPSFLEET_TEST_ETCD").unwrap_or_else(|_| {
        panic!("MPSFLEET_TEST_ETCD is not set: bash scripts/etcd-env.sh start; eval \"$(bash scripts/etcd-env.sh env)\"")
    });
    // A prefix of its own: the temp dir's random name.
    let root = tempfile::tempdir().unwrap();
    let unique = root.path().file_name().unwrap().to_string_lossy().into_owned();
    let prefix = format!("/stored-state-{}{unique}", std::process::id());
    let dump: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("etcd/etcd.json")).unwrap()).unwrap();
    let kvs = dump["kvs"].as_array().expect("kvs");
    let mut puts = Vec::new();
    for kv in kvs {
        let key = String::from_utf8(B64.decode(kv["key"].as_str().unwrap()).unwrap()).unwrap();
        let rest =
            key.strip_prefix("/fixture/").unwrap_or_else(|| panic!("{key} outside the fixture's prefix"));
        if rest == "leader" {
            // Written with the older server's lease, long expired.
            continue;
        }
        let value = kv["value"].as_str().unwrap_or("");
        let body = serde_json::json!({"key": B64.encode(format!("{prefix}/{rest}")), "value": value});
        puts.push(("/v3/kv/put", body));
    }
    let written = puts.len();
    gateway_post(&endpoints, &puts);
    assert!(written > 10, "the dump holds the fleet's keys ({written})");

    let dir = root.path().join("data");
    copy_dir(&fixture("etcd/data"), &dir);
    let mut config = EtcdConfig::new(&endpoints);
    config.prefix = prefix.clone();
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::open(&config, mpsfleet_store::etcd::Writers::Anyone).expect("open the etcd store"),
    );
    let opened = mpsfleet_server::open_store(&dir, store, Arc::new(SystemClock), None)
        .expect("the older etcd store loads");
    assert!(opened.first_start.is_none(), "an existing cluster, not a new one");
    assert_the_fleet(&opened.cluster, &dir);
    drop(opened);
    let range_end = {
        let mut end = format!("{prefix}/").into_bytes();
        *end.last_mut().unwrap() += 1;
        end
    };
    let delete = serde_json::json!({
        "key": B64.encode(format!("{prefix}/")),
        "range_end": B64.encode(range_end),
    });
    gateway_post(&endpoints, &[("/v3/kv/deleterange", delete)]);
}

/// JSON requests to the first member's gateway (plain HTTP on 127.0.0.1), one after another;
/// panics unless etcd answers each with 200.
fn gateway_post(endpoints: &str, requests: &[(&str, serde_json::Value)]) {
    let first = endpoints.split(',').next().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        for (path, body) in requests {
            let answer = http.post(format!("{first}{path}")).json(body).send().await.unwrap();
            assert_eq!(answer.status(), 200, "{path}: {}", answer.text().await.unwrap_or_default());
        }
    });
}
