//! Stored state is a contract: what an older build wrote loads in this one. The fixtures under
//! `tests/fixtures/stored-state/` were written by an older release binary through its CLI
//! (`scripts/make-state-fixture.sh`, which lists what the fleet holds): a SQLite data dir, and
//! the same fleet's etcd keys with the data dir the server kept beside them. A change to how
//! records are encoded, keyed or loaded fails here before it reaches a user's data.

use mpsfleet_core::clock::SystemClock;
use mpsfleet_server::cluster::{Cluster, TaskFilter};
use mpsfleet_store::{EtcdConfig, EtcdStore, Store};
use mpsfleet_types::TaskStatus;
use std::io::{Read, Write};
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
    let pools = c.pools();
    let gpu = pools.iter().find(|p| p.name.as_str() == "gpu").expect("pool gpu");
    assert_eq!(serde_json::to_value(gpu.mode).unwrap(), "managed");

    let hosts = c.hosts(Some("gpu"));
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0].gpus.len(), 2, "two emulated H200s");

    let defs = c.taskdefs(Some("sleeper"));
    assert_eq!(defs.len(), 1);
    assert_eq!(defs[0].revision, 1);
    assert_eq!(defs[0].container_definitions[0].name, "main");

    let services = c.services();
    let web = services.iter().find(|s| s.service.name.as_str() == "web").expect("service web");
    assert_eq!(web.service.desired_count, 2);

    let all = TaskFilter { limit: usize::MAX, ..TaskFilter::default() };
    let tasks = c.tasks(&all);
    let of_web = tasks.iter().filter(|t| t.group.as_ref().is_some_and(|g| g.as_str() == "web")).count();
    let standalone = tasks.iter().filter(|t| t.group.is_none()).count();
    assert_eq!((of_web, standalone), (2, 1), "{tasks:?}");
    assert!(tasks.iter().all(|t| t.desired_status == TaskStatus::Running), "{tasks:?}");

    let tokens = c.api_tokens();
    assert!(tokens.iter().any(|t| t.description == "fixture"), "{tokens:?}");
    let join = c.join_tokens();
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
    let mut written = 0;
    for kv in kvs {
        let key = String::from_utf8(b64_decode(kv["key"].as_str().unwrap())).unwrap();
        let rest =
            key.strip_prefix("/fixture/").unwrap_or_else(|| panic!("{key} outside the fixture's prefix"));
        if rest == "leader" {
            // Written with the older server's lease, long expired.
            continue;
        }
        let value = kv["value"].as_str().unwrap_or("");
        let body =
            serde_json::json!({"key": b64_encode(format!("{prefix}/{rest}").as_bytes()), "value": value});
        gateway_post(&endpoints, "/v3/kv/put", &body);
        written += 1;
    }
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
    gateway_post(
        &endpoints,
        "/v3/kv/deleterange",
        &serde_json::json!({"key": b64_encode(format!("{prefix}/").as_bytes()), "range_end": b64_encode(&range_end)}),
    );
}

/// One JSON request to the first member's gateway (plain HTTP on 127.0.0.1); panics unless
/// etcd answers 200.
fn gateway_post(endpoints: &str, path: &str, body: &serde_json::Value) {
    let first = endpoints.split(',').next().unwrap();
    let addr = first.strip_prefix("http://").expect("a plain-HTTP test etcd");
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut n, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = B64.iter().position(|b| *b == c).expect("base64") as u32;
        n = (n << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits) as u8);
        }
    }
    out
}

#[test]
fn base64_round_trips() {
    for s in ["", "a", "ab", "abc", "abcd", "/fixture/obj/tasks/t-1"] {
        assert_eq!(b64_decode(&b64_encode(s.as_bytes())), s.as_bytes());
    }
    assert_eq!(b64_encode(b"/fixture/"), "L2ZpeHR1cmUv");
}
