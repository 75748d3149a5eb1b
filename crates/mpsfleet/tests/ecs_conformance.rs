//! moto's ECS tests (moto 5.2.5's `tests/test_ecs`, from its source distribution on PyPI), run
//! in server mode against a real server started with `--ecs-conformance`: boto3 signs every
//! call, the suite resets the server before each test. Each test's outcome is held to
//! `tests/ecs/expected-failures.txt` (tests/ecs/conformance.py): a listed test must fail with
//! its pinned message, a listed skip be moto's own, every other test pass, every entry match a
//! test, and the number of tests be the pinned one. The judge itself is checked first, on
//! made-up outcomes that break each pin. The summary is printed, and written to
//! `target/ecs-conformance.txt`, which `scripts/test.sh` prints after the tests.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

#[test]
fn moto_ecs_suite_comes_to_exactly_what_the_file_pins() {
    let Some(env) = ecs_env() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("tests/ecs/conformance.py");
    // The judge first: each pin broken on purpose is caught.
    let judged = Command::new(env.join("sdk/bin/python")).arg(&script).arg("--self-test").output().unwrap();
    assert!(judged.status.success(), "{}", String::from_utf8_lossy(&judged.stderr));
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), "127.0.0.1:0", &["--insecure-http", "--ecs-conformance"]);
    let out = Command::new(env.join("sdk/bin/python"))
        .arg(&script)
        .arg(&server.url)
        .arg(env.join("moto-tests"))
        .arg(root.join("tests/ecs/expected-failures.txt"))
        .output()
        .expect("run the conformance suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    const SAID: &[&str] = &[
        "moto ",
        "expected failure",
        "skipped by moto",
        "UNEXPECTED",
        "FAILED DIFFERENTLY",
        "NOT SKIPPED",
        "LISTED",
        "TESTS RUN",
    ];
    let summary: Vec<&str> = stdout.lines().filter(|l| SAID.iter().any(|s| l.starts_with(s))).collect();
    println!("{}", summary.join("\n"));
    // scripts/test.sh prints it after the tests (a passing test's output is not shown).
    let _ = std::fs::write(root.join("target/ecs-conformance.txt"), summary.join("\n") + "\n");
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last = summary.iter().find(|l| l.starts_with("moto ")).expect("the suite's counts");
    assert!(last.ends_with(" 0 unexpected"), "{last}");
}
