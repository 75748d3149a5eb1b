//! Process test: strings a host registered reach the terminal without control characters,
//! through the real CLI binary, and `-o json` still carries them exactly.

mod common;

use common::*;
use mpsfleet_types::api::RegisterHostResponse;

/// Sets the terminal title and clears the screen, if printed raw.
const HOSTILE: &str = "n1\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m";

fn cli(server: &Server, args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(args)
        .args(["--server", &server.url, "--token", &server.admin_token(), "--ca-file", &server.ca_file()])
        .output()
        .expect("run the mpsfleet CLI");
    assert!(out.status.success(), "mpsfleet {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[track_caller]
fn assert_no_controls(what: &str, stdout: &[u8]) {
    for bad in [0x1b_u8, 0x07] {
        assert!(!stdout.contains(&bad), "{what}: byte {bad:#04x} in {:?}", String::from_utf8_lossy(stdout));
    }
    let text = String::from_utf8_lossy(stdout);
    assert!(!text.contains('\u{9b}'), "{what}: U+009B in {text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostname_with_escape_sequences_is_shown_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    create_pool(&server.admin(), "gpu").await;
    let joiner = server.client(Some(server.join_token()));
    let mut reg = registration("gpu", HOSTILE, "terminal", 1);
    reg.gpus[0].model = "NVIDIA H200\u{1b}[8m".into();
    let RegisterHostResponse { host_id, .. } = joiner.register_host(&reg).await.expect("register host");

    let list = cli(&server, &["host", "list"]).stdout;
    assert_no_controls("host list", &list);
    let text = String::from_utf8(list).unwrap();
    assert!(text.contains(r"n1\x1b]0;pwned\x07\x1b[2J\u{9b}31m"), "{text}");
    assert_eq!(text.lines().count(), 2, "one header and one row: {text}");

    let describe = cli(&server, &["host", "describe", host_id.as_str()]).stdout;
    assert_no_controls("host describe", &describe);
    let text = String::from_utf8(describe).unwrap();
    assert!(text.contains(r"NVIDIA H200\x1b[8m"), "{text}");

    // JSON escapes them and decodes to the hostname as registered.
    let json = cli(&server, &["host", "list", "-o", "json"]).stdout;
    assert_no_controls("host list -o json", &json);
    let hosts: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(hosts[0]["hostname"], HOSTILE, "{hosts}");
}
