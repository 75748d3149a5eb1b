//! moto's ECS tests (moto 5.2.5's `tests/test_ecs`, from its source distribution on PyPI), run
//! in server mode against a real server started with `--ecs-conformance`: boto3 signs every
//! call, the suite resets the server before each test. Each test's outcome is checked against
//! `tests/ecs/expected-failures.txt` (tests/ecs/conformance.py): an unlisted test that fails,
//! or a listed one that passes, fails this test. The counts are printed, and written to
//! `target/ecs-conformance.txt`, which `scripts/test.sh` prints after the tests.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

#[test]
fn moto_ecs_suite_passes_but_the_listed_failures() {
    let Some(env) = ecs_env() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), "127.0.0.1:0", &["--insecure-http", "--ecs-conformance"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env.join("sdk/bin/python"))
        .arg(root.join("tests/ecs/conformance.py"))
        .arg(&server.url)
        .arg(env.join("moto-tests"))
        .arg(root.join("tests/ecs/expected-failures.txt"))
        .output()
        .expect("run the conformance suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            l.starts_with("moto ") || l.starts_with("UNEXPECTED") || l.starts_with("expected failure")
        })
        .collect();
    println!("{}", summary.join("\n"));
    // scripts/test.sh prints it after the tests (a passing test's output is not shown).
    let _ = std::fs::write(root.join("target/ecs-conformance.txt"), summary.join("\n") + "\n");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last = summary.iter().find(|l| l.starts_with("moto ")).expect("the suite's counts");
    assert!(last.ends_with(" 0 unexpected"), "{last}");
    // The suite ran: most of its ECS-only tests pass.
    let passed: usize = last.split(": ").nth(1).and_then(|r| r.split(' ').next()?.parse().ok()).unwrap_or(0);
    assert!(passed >= 45, "{last}");
}
