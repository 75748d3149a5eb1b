//! Process tests of the container runtime: real shims, real processes, real signals.
//!
//! The shim is this test executable run again with `--exact shim_entry`: the `shim_entry` test
//! below turns into `shim_main` when it finds the marker argument, and does nothing otherwise.

use mpsfleet_agent::runtime::{
    logs, shim_main_from_args, stop_for_exit, AdoptedState, ContainerHandle, ContainerLaunch, ContainerState,
    ExitRecord, LogStream, Runtime, RuntimeError, UserError,
};
use mpsfleet_types::task::StopCode;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

const SHIM_MARKER: &str = "--mpsfleet-test-shim--";
/// Generous bound for anything that should happen "soon" on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_millis(20);

#[test]
fn shim_entry() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(i) = args.iter().position(|a| a == SHIM_MARKER) {
        std::process::exit(shim_main_from_args(args[i + 1..].iter().cloned()));
    }
}

fn runtime() -> Runtime {
    let exe = std::env::current_exe().expect("test executable");
    let prefix = [exe.as_os_str(), "--exact".as_ref(), "shim_entry".as_ref(), "--nocapture".as_ref()]
        .into_iter()
        .chain(["--".as_ref(), SHIM_MARKER.as_ref()])
        .map(OsString::from)
        .collect();
    Runtime::new(prefix).expect("runtime")
}

fn spec(dir: &Path, argv: &[&str], env: &[(&str, &str)]) -> ContainerLaunch {
    ContainerLaunch {
        task_id: "t-1".into(),
        container: "app".into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        user: None,
        task_user: None,
        stop_timeout: Duration::from_secs(30),
        state_dir: dir.to_path_buf(),
    }
}

fn state_dir(tmp: &tempfile::TempDir, name: &str) -> PathBuf {
    tmp.path().join(name)
}

fn wait_exited(rt: &Runtime, h: &ContainerHandle) -> ExitRecord {
    let mut waited = Duration::ZERO;
    loop {
        match rt.status(h) {
            ContainerState::Exited(e) => return e,
            ContainerState::Lost { reason } => panic!("container lost: {reason}"),
            ContainerState::Running { .. } if waited < PATIENCE => {}
            ContainerState::Running { pid } => panic!("pid {pid} still running after {PATIENCE:?}"),
        }
        thread::sleep(STEP);
        waited += STEP;
    }
}

fn wait_for_output(dir: &Path, needle: &str) {
    let mut waited = Duration::ZERO;
    while !fs::read_to_string(dir.join("stdout.log")).unwrap_or_default().contains(needle) {
        assert!(waited < PATIENCE, "{needle:?} never appeared in {}", dir.display());
        thread::sleep(STEP);
        waited += STEP;
    }
}

fn stdout_of(dir: &Path) -> String {
    String::from_utf8(logs(dir, LogStream::Stdout, None).expect("logs")).expect("utf-8")
}

/// Gone, or a zombie nobody has reaped yet (in a container pid 1 may not reap).
fn process_is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

fn wait_dead(pid: u32) {
    let mut waited = Duration::ZERO;
    while !process_is_dead(pid) {
        assert!(waited < PATIENCE, "process {pid} survived");
        thread::sleep(STEP);
        waited += STEP;
    }
}

#[test]
fn runtime_launch_passes_argv_and_only_the_given_env() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();

    let dir = state_dir(&tmp, "env");
    let given = [("FOO", "bar baz"), ("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps-0")];
    let h = rt.launch(&spec(&dir, &["env"], &given)).expect("launch env");
    assert_eq!(wait_exited(&rt, &h).code, Some(0));
    let out = stdout_of(&dir);
    let vars: Vec<(&str, &str)> = out.lines().filter_map(|l| l.split_once('=')).collect();
    for (k, v) in given {
        assert!(vars.contains(&(k, v)), "{k}={v} missing from {out}");
    }
    for (k, _) in &vars {
        assert!(
            given.iter().any(|(g, _)| g == k) || ["PATH", "HOME", "LANG"].contains(k),
            "unexpected variable {k} leaked into the task: {out}"
        );
    }
    assert!(vars.iter().any(|(k, _)| *k == "PATH"), "PATH is a documented basic: {out}");

    let dir = state_dir(&tmp, "argv");
    let script = "printf '<%s>\\n' \"$@\"; echo oops >&2";
    let h = rt
        .launch(&spec(&dir, &["/bin/sh", "-c", script, "sh", "one", "two words", ""], &[]))
        .expect("launch");
    assert_eq!(wait_exited(&rt, &h).code, Some(0));
    assert_eq!(stdout_of(&dir), "<one>\n<two words>\n<>\n");
    assert_eq!(logs(&dir, LogStream::Stderr, None).expect("stderr"), b"oops\n");
    assert_eq!(logs(&dir, LogStream::Stdout, Some(6)).expect("tail"), b"s>\n<>\n");
    assert_eq!(logs(&dir, LogStream::Stdout, Some(10_000)).expect("tail").len(), 21);
    assert_eq!(
        fs::read_to_string(dir.join("pid")).expect("pid file").trim(),
        h.pid().expect("pid").to_string()
    );
    assert!(logs(&tmp.path().join("nothing"), LogStream::Stdout, None).expect("no log yet").is_empty());
}

#[test]
fn runtime_exit_codes_are_recorded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();
    let dir = state_dir(&tmp, "exit3");
    let h = rt.launch(&spec(&dir, &["/bin/sh", "-c", "exit 3"], &[])).expect("launch");
    let exit = wait_exited(&rt, &h);
    assert_eq!((exit.code, exit.signal, exit.error.as_deref()), (Some(3), None, None));
    assert!(exit.finished_at_ms > 0);
    assert_eq!(
        stop_for_exit("app", &exit),
        (StopCode::EssentialContainerExited, "essential container app exited: exit status 3".to_string())
    );
    // Stopping an exited container just says how it ended.
    let outcome = rt.stop(&h, Duration::from_secs(1)).expect("stop");
    assert_eq!(outcome.state, ContainerState::Exited(exit));
    assert!(!outcome.killed);
    // The state directory belongs to that run.
    match rt.launch(&spec(&dir, &["true"], &[])) {
        Err(RuntimeError::StateDirInUse { .. }) => {}
        other => panic!("expected StateDirInUse, got {other:?}"),
    }
}

#[test]
fn runtime_unexecutable_command_fails_to_start() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();
    let dir = state_dir(&tmp, "nosuch");
    let h = rt.launch(&spec(&dir, &["/no/such/prog", "x"], &[])).expect("launch still succeeds");
    assert_eq!(h.pid(), None);
    let exit = wait_exited(&rt, &h);
    assert_eq!(exit.error.as_deref(), Some("no such file or directory: /no/such/prog"));
    assert_eq!(
        stop_for_exit("app", &exit),
        (
            StopCode::TaskFailedToStart,
            "container app failed to start: no such file or directory: /no/such/prog".into()
        )
    );
    match rt.launch(&spec(&state_dir(&tmp, "empty"), &[], &[])) {
        Err(RuntimeError::EmptyCommand { task_id, container }) => {
            assert_eq!((&*task_id, &*container), ("t-1", "app"))
        }
        other => panic!("expected EmptyCommand, got {other:?}"),
    }
}

#[test]
fn runtime_broken_shim_is_reported() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = Runtime::new(vec!["/bin/sh".into(), "-c".into(), "echo shim is broken >&2; exit 1".into()])
        .expect("runtime");
    match rt.launch(&spec(&state_dir(&tmp, "broken"), &["true"], &[])) {
        Err(RuntimeError::ShimDied { log, .. }) => assert!(log.contains("shim is broken"), "log: {log}"),
        other => panic!("expected ShimDied, got {other:?}"),
    }
    assert!(matches!(Runtime::new(vec![]), Err(RuntimeError::NoShim)));
}

#[test]
fn runtime_stop_sends_sigterm_to_the_whole_group() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();
    let dir = state_dir(&tmp, "term");
    let script = "sleep 1000 & echo child=$!; wait";
    let h = rt.launch(&spec(&dir, &["/bin/sh", "-c", script], &[])).expect("launch");
    wait_for_output(&dir, "child=");
    let child: u32 = stdout_of(&dir).trim().trim_start_matches("child=").parse().expect("child pid");
    assert!(rt.status(&h).is_running());
    let outcome = rt.stop(&h, Duration::from_secs(30)).expect("stop");
    match &outcome.state {
        ContainerState::Exited(e) => assert_eq!((e.code, e.signal), (None, Some(15)), "{e:?}"),
        other => panic!("expected exited, got {other:?}"),
    }
    assert!(!outcome.killed);
    wait_dead(child);
}

#[test]
fn runtime_stop_lets_a_trap_handler_exit_cleanly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();
    let dir = state_dir(&tmp, "trap");
    let script = "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done";
    let h = rt.launch(&spec(&dir, &["/bin/sh", "-c", script], &[])).expect("launch");
    wait_for_output(&dir, "ready");
    let outcome = rt.stop(&h, Duration::from_secs(30)).expect("stop");
    assert_eq!(outcome.state, ContainerState::Exited(wait_exited(&rt, &h)));
    match outcome.state {
        ContainerState::Exited(e) => assert_eq!((e.code, e.signal), (Some(0), None)),
        other => panic!("expected exited, got {other:?}"),
    }
    assert!(stdout_of(&dir).contains("bye"));
}

#[test]
fn runtime_stop_escalates_to_sigkill_after_the_timeout() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();
    let dir = state_dir(&tmp, "stubborn");
    let script = "trap '' TERM; echo ready; while :; do sleep 0.05; done";
    let h = rt.launch(&spec(&dir, &["/bin/sh", "-c", script], &[])).expect("launch");
    wait_for_output(&dir, "ready");
    let outcome = rt.stop(&h, Duration::from_millis(300)).expect("stop");
    assert!(outcome.killed);
    match outcome.state {
        ContainerState::Exited(e) => {
            assert_eq!((e.code, e.signal), (None, Some(9)));
            assert_eq!(e.reason(), "killed by signal 9 (SIGKILL)");
        }
        other => panic!("expected exited, got {other:?}"),
    }
}

#[test]
fn runtime_adopt_after_agent_death_finds_the_running_task() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = state_dir(&tmp, "adopt-running");
    let pid = {
        let rt = runtime();
        let h = rt.launch(&spec(&dir, &["sleep", "1000"], &[])).expect("launch");
        h.pid().expect("pid")
        // The agent "dies": runtime and handle are dropped, nobody waits for the task.
    };
    let rt = runtime();
    let handle = match rt.adopt(&dir).expect("adopt") {
        AdoptedState::Running { pid: found, handle } => {
            assert_eq!(found, pid);
            handle
        }
        other => panic!("expected running, got {other:?}"),
    };
    assert_eq!(rt.status(&handle), ContainerState::Running { pid });
    let outcome = rt.stop(&handle, Duration::from_secs(30)).expect("stop adopted");
    match outcome.state {
        ContainerState::Exited(e) => assert_eq!(e.signal, Some(15)),
        other => panic!("expected exited, got {other:?}"),
    }
    match rt.adopt(&dir).expect("adopt again") {
        AdoptedState::Exited(e) => assert_eq!(e.signal, Some(15)),
        other => panic!("expected exited, got {other:?}"),
    }
}

#[test]
fn runtime_exit_while_the_agent_is_down_is_not_lost() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = state_dir(&tmp, "adopt-exited");
    let go = tmp.path().join("go");
    let go_str = go.to_str().expect("utf-8 path");
    {
        let rt = runtime();
        let script = "while [ ! -e \"$GO\" ]; do sleep 0.05; done; exit 7";
        rt.launch(&spec(&dir, &["/bin/sh", "-c", script], &[("GO", go_str)])).expect("launch");
    }
    // While no agent runs, the task ends.
    fs::write(&go, b"").expect("go");
    let rt = runtime();
    let mut waited = Duration::ZERO;
    loop {
        match rt.adopt(&dir).expect("adopt") {
            AdoptedState::Exited(e) => {
                assert_eq!((e.code, e.signal), (Some(7), None));
                break;
            }
            AdoptedState::Running { .. } if waited < PATIENCE => {}
            other => panic!("expected the recorded exit, got {other:?}"),
        }
        thread::sleep(STEP);
        waited += STEP;
    }
}

fn write_proc_record(dir: &Path, pid: u32, start_time: u64) {
    fs::create_dir_all(dir).expect("dir");
    let record = serde_json::json!({
        "pid": pid, "startTime": start_time, "shimPid": pid, "shimStartTime": start_time,
    });
    fs::write(dir.join("proc.json"), record.to_string()).expect("write");
}

fn start_time_of(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(')').expect("stat format");
    rest.split_whitespace().nth(19).expect("field 22").parse().expect("number")
}

#[test]
fn runtime_adopt_reports_lost_for_a_reused_or_vanished_pid() {
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();

    // The pid is alive but is another process now (different start time).
    let me = std::process::id();
    let dir = state_dir(&tmp, "reused");
    write_proc_record(&dir, me, start_time_of(me) + 12345);
    match rt.adopt(&dir).expect("adopt") {
        AdoptedState::Lost { reason } => assert!(reason.contains("another process"), "{reason}"),
        other => panic!("expected lost, got {other:?}"),
    }

    // The process and its shim are gone and nobody wrote the exit down.
    let mut gone = std::process::Command::new("true").spawn().expect("spawn");
    let gone_pid = gone.id();
    gone.wait().expect("wait");
    let dir = state_dir(&tmp, "vanished");
    write_proc_record(&dir, gone_pid, 1);
    match rt.adopt(&dir).expect("adopt") {
        AdoptedState::Lost { reason } => {
            assert!(reason.contains("gone") || reason.contains("another process"), "{reason}")
        }
        other => panic!("expected lost, got {other:?}"),
    }

    // Nothing recorded at all.
    let dir = state_dir(&tmp, "blank");
    fs::create_dir_all(&dir).expect("dir");
    assert!(matches!(rt.adopt(&dir).expect("adopt"), AdoptedState::Lost { .. }));
    assert!(matches!(rt.adopt(&tmp.path().join("missing")), Err(RuntimeError::NoStateDir { .. })));

    // A corrupt record is an error that names the file, not a panic.
    let dir = state_dir(&tmp, "corrupt");
    fs::create_dir_all(&dir).expect("dir");
    fs::write(dir.join("exit.json"), b"{not json").expect("write");
    match rt.adopt(&dir) {
        Err(e @ RuntimeError::BadRecord { .. }) => assert!(e.to_string().contains("exit.json"), "{e}"),
        other => panic!("expected BadRecord, got {other:?}"),
    }
}

#[test]
fn runtime_runs_as_the_requested_user_when_root() {
    if !nix::unistd::Uid::current().is_root() {
        eprintln!("skipped: switching users needs root, and this test does not run as root");
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").expect("lookup").expect("a nobody user");
    let tmp = tempfile::tempdir().expect("tmp");
    let rt = runtime();
    let dir = state_dir(&tmp, "nobody");
    let mut launch = spec(&dir, &["/bin/sh", "-c", "id -u; id -g; id -G; echo \"$HOME\""], &[]);
    launch.user = Some("nobody".into());
    let h = rt.launch(&launch).expect("launch");
    assert_eq!(wait_exited(&rt, &h).code, Some(0));
    let out = stdout_of(&dir);
    let lines: Vec<&str> = out.lines().collect();
    let (uid, gid) = (nobody.uid.to_string(), nobody.gid.to_string());
    let home = nobody.dir.to_string_lossy().into_owned();
    assert_eq!(lines, [uid.as_str(), gid.as_str(), gid.as_str(), home.as_str()], "output: {out}");

    launch.state_dir = state_dir(&tmp, "ghost");
    launch.user = Some("no-such-user-xyz".into());
    match rt.launch(&launch) {
        Err(RuntimeError::User { source: UserError::UnknownUser { user }, .. }) => {
            assert_eq!(user, "no-such-user-xyz")
        }
        other => panic!("expected UnknownUser, got {other:?}"),
    }
}

#[test]
fn runtime_runs_a_task_uid_in_its_own_home_and_keeps_its_logs_from_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !nix::unistd::Uid::current().is_root() {
        eprintln!("skipped: switching users needs root, and this test does not run as root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o711)).unwrap();
    let home = tmp.path().join("home");
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(200_321), Some(200_321)).unwrap();
    fs::set_permissions(&home, fs::Permissions::from_mode(0o700)).unwrap();
    let rt = runtime();
    let dir = state_dir(&tmp, "task-uid");
    let script = "id -u; id -g; id -G; echo \"$HOME\"; pwd; echo hi > mine && echo wrote; \
                  ls \"$0\" >/dev/null 2>&1 && echo reached-state || echo no-state";
    let mut launch = spec(&dir, &["/bin/sh", "-c", script, dir.to_str().unwrap()], &[]);
    launch.task_user = Some(mpsfleet_agent::runtime::TaskUser { uid: 200_321, home: home.clone() });
    let h = rt.launch(&launch).expect("launch");
    assert_eq!(wait_exited(&rt, &h).code, Some(0), "{}", stdout_of(&dir));
    let out = stdout_of(&dir);
    let lines: Vec<&str> = out.lines().collect();
    let home_s = home.to_string_lossy().into_owned();
    assert_eq!(lines[..5], ["200321", "200321", "200321", home_s.as_str(), home_s.as_str()], "output: {out}");
    assert_eq!(lines[5], "wrote", "the task writes in its home: {out}");
    assert_eq!(fs::metadata(home.join("mine")).unwrap().uid(), 200_321);
    assert_eq!(lines.last(), Some(&"no-state"), "the task reached its state dir: {out}");
    // The state dir and the logs are the agent's alone.
    let meta = fs::metadata(&dir).unwrap();
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o7777), (0, 0o700));
    for name in ["stdout.log", "stderr.log", "output.log", "shim.log", "exit.json", "proc.json"] {
        let meta = fs::metadata(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (0, 0o600), "{name}");
    }
    // A named user wins over the task's uid.
    launch.state_dir = state_dir(&tmp, "named");
    launch.argv = vec!["/bin/sh".into(), "-c".into(), "id -u; pwd".into()];
    launch.user = Some("root".into());
    let h = rt.launch(&launch).expect("launch");
    assert_eq!(wait_exited(&rt, &h).code, Some(0));
    assert_eq!(stdout_of(&launch.state_dir), "0\n/\n");
}

const AGENT_MARKER: &str = "--mpsfleet-test-agent--";

/// The "agent" of the launch-window test: this executable run again with `--exact agent_entry`
/// launches `sleep SECONDS` in DIR through a shim that takes a second to start, then waits to
/// be killed.
#[test]
fn agent_entry() {
    let args: Vec<OsString> = std::env::args_os().collect();
    let Some(i) = args.iter().position(|a| a == AGENT_MARKER) else { return };
    let (dir, seconds) = (PathBuf::from(&args[i + 1]), args[i + 2].to_string_lossy().into_owned());
    let exe = std::env::current_exe().expect("test executable");
    let slow_shim: Vec<OsString> = ["sh", "-c", "sleep 1; exec \"$@\"", "sh"]
        .into_iter()
        .map(OsString::from)
        .chain([exe.into_os_string()])
        .chain(["--exact", "shim_entry", "--nocapture", "--", SHIM_MARKER].map(OsString::from))
        .collect();
    let rt = Runtime::new(slow_shim).expect("runtime");
    let _ = rt.launch(&spec(&dir, &["sleep", &seconds], &[]));
    thread::sleep(PATIENCE);
}

/// Processes whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// Processes whose command line mentions `dir` (shims, and the shell that starts one late).
fn processes_naming(dir: &Path) -> Vec<u32> {
    let needle = dir.as_os_str().as_encoded_bytes().to_vec();
    fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// An agent killed after it spawned a container's shim but before the shim recorded the pid:
/// the next agent withdraws the launch and starts the container again in the same directory,
/// and the first shim, starting late, runs nothing. One copy of the task runs, and it is owned.
#[test]
fn runtime_an_agent_killed_inside_the_launch_window_leaves_one_copy() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = state_dir(&tmp, "launch-window");
    let seconds = format!("{}.25", 4000 + std::process::id() % 1000);
    let exe = std::env::current_exe().expect("test executable");
    let mut agent = std::process::Command::new(exe)
        .args(["--exact", "agent_entry", "--nocapture", "--", AGENT_MARKER])
        .arg(&dir)
        .arg(&seconds)
        .spawn()
        .expect("agent");
    let mut waited = Duration::ZERO;
    while !dir.join("launch").exists() {
        assert!(waited < PATIENCE, "the agent never began the launch");
        thread::sleep(STEP);
        waited += STEP;
    }
    thread::sleep(Duration::from_millis(100)); // the shim is spawned, and sleeping
    agent.kill().expect("kill the agent inside the window");
    agent.wait().expect("reap the agent");
    assert!(!dir.join("proc.json").exists(), "the window closed before the agent was killed");

    // The next agent: the launch is withdrawn, and the container started again where it was.
    let rt = runtime();
    assert_eq!(rt.settle_launch(&dir).expect("settle"), mpsfleet_agent::runtime::Settled::Withdrawn);
    fs::remove_dir_all(&dir).expect("clear the directory");
    let h = rt.launch(&spec(&dir, &["sleep", &seconds], &[])).expect("launch again");
    let pid = h.pid().expect("pid");
    // Wait until the first shim has woken and gone (then only the new shim names the
    // directory), or has started a second copy.
    let mut waited = Duration::ZERO;
    let copies = loop {
        let copies = processes_running(&["sleep", &seconds]);
        if copies.len() > 1 || processes_naming(&dir).len() <= 1 {
            break copies;
        }
        assert!(waited < PATIENCE, "the first shim neither went nor started anything");
        thread::sleep(STEP);
        waited += STEP;
    };
    for p in copies.iter().filter(|p| **p != pid) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p as i32), nix::sys::signal::Signal::SIGKILL);
    }
    assert_eq!(copies, vec![pid], "exactly the owned copy runs");
    rt.stop(&h, Duration::from_secs(5)).expect("stop");
}

/// A shim that has taken the launch is waited for: the next agent adopts the task it starts.
#[test]
fn runtime_a_launch_held_by_its_shim_is_adopted_not_withdrawn() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = state_dir(&tmp, "launch-held");
    let rt = runtime();
    let h = rt.launch(&spec(&dir, &["sleep", "1000"], &[])).expect("launch");
    // As if the agent had died before reading the records: hide them while the shim holds on.
    let proc = fs::read(dir.join("proc.json")).expect("proc.json");
    fs::remove_file(dir.join("proc.json")).expect("hide proc.json");
    let writer = {
        let dir = dir.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(500));
            fs::write(dir.join("proc.json"), proc).expect("restore proc.json");
        })
    };
    assert_eq!(rt.settle_launch(&dir).expect("settle"), mpsfleet_agent::runtime::Settled::Claimed);
    writer.join().expect("writer");
    assert!(dir.join("launch").exists(), "a held launch is not withdrawn");
    let never = state_dir(&tmp, "never-launched");
    assert_eq!(rt.settle_launch(&never).expect("settle"), mpsfleet_agent::runtime::Settled::Withdrawn);
    assert!(matches!(rt.adopt(&dir).expect("adopt"), AdoptedState::Running { .. }));
    rt.stop(&h, Duration::from_secs(5)).expect("stop");
}
