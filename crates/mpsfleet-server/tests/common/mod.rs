//! Helpers shared by the provider tests: scripts that play a cloud, and exec providers running
//! them.

#![allow(dead_code)]

use mpsfleet_server::provider::{ExecConfig, ExecProvider};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Writes an executable script through a child `sh`, so that this (multi-threaded) test
/// process never holds a writable descriptor of a file it is about to exec (ETXTBSY).
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let mut child = Command::new("/bin/sh")
        .args(["-c", "cat > \"$0\" && chmod 755 \"$0\""])
        .arg(&path)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(format!("#!/bin/sh\n{body}\n").as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    path
}

/// A provider whose three operations all run `program`, with FAKE_CLOUD set to `dir`.
pub fn provider(dir: &Path, program: &str, timeout: Duration) -> ExecProvider {
    let argv = |op: &str| vec![program.to_string(), op.to_string()];
    let mut config = ExecConfig::new(argv("launch"), argv("terminate"), argv("describe"));
    config.timeout = timeout;
    config.env.insert("FAKE_CLOUD".into(), dir.display().to_string());
    ExecProvider::new(config).unwrap()
}
