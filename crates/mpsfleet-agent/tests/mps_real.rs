//! Process tests against the real `nvidia-cuda-mps-control` (no GPU needed: the control daemon
//! runs and answers without one). The binary comes from `MPSFLEET_MPS_CONTROL`, PATH, or
//! `<repo>/target/mps` as `scripts/install-mps.sh` unpacks it; without one the tests say so and
//! skip, except on CI (`CI` set), where they fail. Every wait is bounded; no assertion is about
//! speed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mpsfleet_agent::mps::real::run_control;
use mpsfleet_agent::mps::{
    Check, DaemonConfig, DaemonRecord, ExitInfo, LogEvent, MpsControl, MpsError, MpsPolicy, RealMps,
    Supervisor,
};
use mpsfleet_core::clock::SystemClock;
use mpsfleet_types::HealthStatus;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const BIN: &str = "nvidia-cuda-mps-control";

fn find_control_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MPSFLEET_MPS_CONTROL") {
        return Some(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(p) = std::env::split_paths(&path).map(|d| d.join(BIN)).find(|p| p.is_file()) {
            return Some(p);
        }
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unpacked = repo.join("target/mps/usr/bin").join(BIN);
    unpacked.is_file().then_some(unpacked)
}

/// Whether the `CI` variable asks for every test to run: set, and neither empty, `0` nor
/// `false` (what CI services set is `true` or `1`).
fn on_ci(var: Option<&std::ffi::OsStr>) -> bool {
    var.is_some_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// The control binary, or, outside CI, a printed skip reason and an early return. On CI a
/// missing binary fails the test: these tests exist to run against the real daemon.
macro_rules! require_bin {
    () => {
        match find_control_bin() {
            Some(bin) => bin,
            None if on_ci(std::env::var_os("CI").as_deref()) => {
                panic!("{BIN} not found and CI is set, so this test must not skip: run scripts/install-mps.sh or set MPSFLEET_MPS_CONTROL")
            }
            None => {
                eprintln!("skipped: {BIN} not found; run scripts/install-mps.sh");
                return;
            }
        }
    };
}

#[test]
fn ci_is_read_as_ci_services_set_it() {
    for (value, want) in [(None, false), (Some(""), false), (Some("0"), false), (Some("FALSE"), false)] {
        assert_eq!(on_ci(value.map(std::ffi::OsStr::new)), want, "{value:?}");
    }
    for value in ["true", "1", "yes"] {
        assert!(on_ci(Some(std::ffi::OsStr::new(value))), "{value}");
    }
}

/// Short directories under /tmp (the socket path must stay under 108 bytes).
struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Self {
        Self { root: tempfile::Builder::new().prefix("mf").tempdir_in("/tmp").expect("temp dir") }
    }
    fn cfg(&self, bin: &Path, name: &str) -> DaemonConfig {
        let mut cfg =
            DaemonConfig::new(bin, self.root.path().join(name), self.root.path().join(format!("{name}.log")));
        // Generous for a loaded 2-core machine; the daemon answers in milliseconds.
        cfg.probe_timeout = Duration::from_secs(2);
        cfg.quit_timeout = Duration::from_secs(2);
        cfg.start_timeout = Duration::from_secs(20);
        cfg
    }
}

fn policy() -> MpsPolicy {
    MpsPolicy {
        probe_interval: Duration::from_millis(200),
        probe_timeout: Duration::from_secs(2),
        failure_threshold: 3,
        max_local_restarts: 3,
        restart_window: Duration::from_secs(600),
        restart_backoff: Duration::from_millis(100),
    }
}

fn wait_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let step = Duration::from_millis(20);
    for _ in 0..(limit.as_millis() / step.as_millis()).max(1) {
        if let Some(v) = f() {
            return v;
        }
        std::thread::sleep(step);
    }
    panic!("gave up after {limit:?} waiting for {what}");
}

fn wait_check(sup: &Supervisor, what: &str, f: impl Fn(&Check) -> bool) -> Check {
    let mut last = None;
    for _ in 0..1500 {
        let c = sup.check();
        if f(&c) {
            return c;
        }
        last = Some(c);
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("gave up waiting for {what}; last check {last:?}; history {:#?}", sup.history());
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// PIDs of live processes whose process group is `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // state ppid pgrp
        if fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string() {
            members.push(pid);
        }
    }
    members
}

fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).expect("signal the daemon");
}

fn assert_gone(pid: u32) {
    wait_until(&format!("process {pid} and its group to be gone"), Duration::from_secs(10), || {
        (!alive(pid) && group_members(pid).is_empty()).then_some(())
    });
}

/// Live (not zombie) `nvidia-cuda-mps-control -f` processes serving `pipe_dir`.
fn daemons_on(pipe_dir: &Path) -> Vec<u32> {
    let want = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe_dir.display());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if !(args.first().is_some_and(|a| a.ends_with(BIN.as_bytes())) && args.get(1) == Some(&&b"-f"[..])) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if environ.split(|&b| b == 0).any(|v| v == want.as_bytes()) && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

fn recorded_pid(cfg: &DaemonConfig) -> Option<u32> {
    DaemonRecord::read(&cfg.log_dir).expect("read the daemon record").map(|r| r.pid)
}

/// Environment of the helper agent that `adopts_the_daemon_of_an_agent_killed_with_sigkill`
/// runs as a child process and kills.
const HELPER_ENV: &str = "MPSFLEET_TEST_DOOMED_AGENT";

fn helper_cfg(bin: &Path, pipe_dir: &Path, log_dir: &Path) -> DaemonConfig {
    let mut cfg = DaemonConfig::new(bin, pipe_dir, log_dir);
    cfg.quit_timeout = Duration::from_secs(2);
    cfg.start_timeout = Duration::from_secs(20);
    cfg
}

/// Named so that `cargo test -p mpsfleet-agent mps` selects these tests.
mod mps {
    use super::*;

    #[test]
    fn starts_configures_and_probes() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = DaemonConfig {
            default_active_thread_percentage: Some(25),
            default_pinned_mem_limit_mib: Some(900),
            ..dirs.cfg(&bin, "a")
        };
        let d = RealMps.start(&cfg).expect("start");
        assert!(alive(d.pid()));
        assert_eq!(d.pipe_dir(), cfg.pipe_dir);
        // The defaults went through the real daemon and come back.
        assert_eq!(d.control("get_default_active_thread_percentage").unwrap(), "25.0");
        assert_eq!(d.control("get_default_device_pinned_mem_limit 0").unwrap(), "900M");
        assert_eq!(d.control("set_default_active_thread_percentage 40").unwrap(), "40.0");
        assert_eq!(d.control("get_default_active_thread_percentage").unwrap(), "40.0");
        let probe = d.probe().expect("probe");
        assert!(probe.healthy() && probe.servers.is_empty(), "{probe:?}");
        // Output is parsed, not only the status: an unknown command exits 0.
        assert!(matches!(d.control("no_such_command"), Err(MpsError::UnknownCommand { .. })));
        assert!(matches!(d.terminate_client(1, 2), Err(MpsError::ServerNotFound { pid: 1 })));
        assert_eq!(d.try_exit(), None);
        // The daemon's output lands in control.log.
        let log = std::fs::read_to_string(cfg.log_dir.join("control.log")).unwrap();
        assert!(log.contains("Starting control daemon"), "{log}");
        let mode_of =
            |p: &Path| std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions());
        assert_eq!(mode_of(&cfg.pipe_dir) & 0o7777, 0o711, "pipe dir: every uid passes, none lists");
        assert_eq!(mode_of(&cfg.log_dir) & 0o7777, 0o700, "log dir: the agent's alone");
        assert_eq!(mode_of(&cfg.log_dir.join("control.log")) & 0o777, 0o600);
        // A client of another uid reaches the daemon through the pipe directory.
        if nix::unistd::Uid::current().is_root() {
            use std::io::Write;
            use std::os::unix::process::CommandExt;
            std::fs::set_permissions(dirs.root.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711))
                .unwrap();
            let mut client = Command::new(&bin)
                .env("CUDA_MPS_PIPE_DIRECTORY", &cfg.pipe_dir)
                .uid(230_999)
                .gid(230_999)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("client");
            client.stdin.take().unwrap().write_all(b"get_default_active_thread_percentage\n").unwrap();
            let out = client.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "40.0");
        }

        let pid = d.pid();
        d.stop().expect("stop");
        assert_gone(pid);
        assert!(d.try_exit().is_some());
        d.stop().expect("stop twice");
        assert!(matches!(run_control(&cfg, "get_server_list"), Err(MpsError::NotRunning { .. })));
    }

    #[test]
    fn server_exit_reaches_the_log_watcher() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let d = RealMps.start(&dirs.cfg(&bin, "b")).expect("start");
        assert!(d.poll_log().is_empty(), "start-up lines are not events");
        // Without a GPU the server cannot come up: observed "Server N exited with status 1".
        d.control("start_server -uid 0").expect("start_server");
        let events = wait_until("a server exit in control.log", Duration::from_secs(20), || {
            let events = d.poll_log();
            (!events.is_empty()).then_some(events)
        });
        assert!(
            events.iter().any(|e| matches!(e, LogEvent::ServerExited { status, .. } if *status != 0)),
            "{events:?}"
        );
        let pid = d.pid();
        d.stop().expect("stop");
        assert_gone(pid);
    }

    #[test]
    fn kill_9_is_seen_and_a_local_restart_brings_it_back() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let sup = Supervisor::spawn(
            "gpu-k",
            Arc::new(RealMps),
            dirs.cfg(&bin, "k"),
            policy(),
            Arc::new(SystemClock),
        )
        .expect("supervisor");
        wait_check(&sup, "first ok", |c| c.status == HealthStatus::Ok);
        sup.ensure_answering(0, Duration::ZERO).expect("answering");
        let first = sup.daemon_pid().expect("a daemon");

        signal(first, Signal::SIGKILL);
        let c = wait_check(&sup, "a restart and ok", |c| {
            c.restarts == 1 && c.status == HealthStatus::Ok && c.consecutive_failures == 0
        });
        assert_eq!(c.reason, "daemon answering");
        assert!(
            sup.history()
                .iter()
                .any(|c| c.reason == "daemon exited (signal 9)" && c.consecutive_failures == 1),
            "the failure was reported: {:#?}",
            sup.history()
        );
        let second = sup.daemon_pid().expect("a new daemon");
        assert_ne!(first, second);
        assert_gone(first);
        sup.ensure_answering(0, Duration::ZERO).expect("answering again");

        sup.shutdown().expect("shutdown");
        assert_gone(second);
    }

    #[test]
    fn sigstop_times_out_and_sigcont_recovers() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        // A high threshold: this test is about the timeout path, not the restart.
        let policy = MpsPolicy { failure_threshold: 50, probe_timeout: Duration::from_secs(1), ..policy() };
        let sup =
            Supervisor::spawn("gpu-s", Arc::new(RealMps), dirs.cfg(&bin, "s"), policy, Arc::new(SystemClock))
                .expect("supervisor");
        wait_check(&sup, "first ok", |c| c.status == HealthStatus::Ok);
        let pid = sup.daemon_pid().unwrap();

        signal(pid, Signal::SIGSTOP);
        let c = wait_check(&sup, "a timed-out probe", |c| c.consecutive_failures >= 1);
        assert_eq!(c.reason, "probe timed out after 1s");
        let err = sup.ensure_answering(1, Duration::from_millis(10)).unwrap_err().to_string();
        assert!(err.contains("not answering after 2 attempts: probe timed out after 1s"), "{err}");

        signal(pid, Signal::SIGCONT);
        let c = wait_check(&sup, "ok again", |c| c.status == HealthStatus::Ok && c.consecutive_failures == 0);
        assert_eq!(c.restarts, 0, "recovered without a restart");
        assert_eq!(sup.daemon_pid(), Some(pid));
        sup.shutdown().expect("shutdown");
        assert_gone(pid);
    }

    #[test]
    fn a_daemon_that_stays_hung_is_impaired_then_restarted() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let policy = MpsPolicy { probe_timeout: Duration::from_secs(1), ..policy() };
        let sup =
            Supervisor::spawn("gpu-h", Arc::new(RealMps), dirs.cfg(&bin, "h"), policy, Arc::new(SystemClock))
                .expect("supervisor");
        wait_check(&sup, "first ok", |c| c.status == HealthStatus::Ok);
        let pid = sup.daemon_pid().unwrap();

        signal(pid, Signal::SIGSTOP);
        let c = wait_check(&sup, "ok after a restart", |c| c.restarts == 1 && c.status == HealthStatus::Ok);
        assert_eq!(c.consecutive_failures, 0);
        assert!(
            sup.history()
                .iter()
                .any(|c| c.status == HealthStatus::Impaired && c.reason == "probe timed out after 1s"),
            "{:#?}",
            sup.history()
        );
        // The stopped daemon was killed (quit cannot reach it), not left behind.
        assert_gone(pid);
        sup.shutdown().expect("shutdown");
    }

    #[test]
    fn a_permanently_failing_daemon_ends_impaired() {
        // Needs no real binary, but runs with the others.
        let _bin = require_bin!();
        let dirs = Dirs::new();
        // Behaves like the real binary whose daemon dies at once: as a client it finds no daemon.
        let script = dirs.root.path().join("fail.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\nif [ \"$1\" = -f ]; then echo 'simulated daemon failure'; exit 1; fi\n\
             echo 'Cannot find MPS control daemon process' >&2; exit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let cfg = dirs.cfg(&script, "f");

        let err = RealMps.start(&cfg).err().expect("start fails").to_string();
        assert!(
            err.contains("daemon exited (status 1)") && err.contains("simulated daemon failure"),
            "{err}"
        );

        let policy = MpsPolicy { restart_backoff: Duration::from_millis(20), ..policy() };
        let sup = Supervisor::spawn("gpu-f", Arc::new(RealMps), cfg, policy, Arc::new(SystemClock))
            .expect("supervisor");
        let c = wait_check(&sup, "restarts exhausted", |c| c.reason.contains("exhausted"));
        assert_eq!(c.status, HealthStatus::Impaired);
        assert_eq!(c.restarts, 3);
        assert!(c.reason.contains("daemon exited (status 1)"), "{c:?}");
        assert!(sup
            .history()
            .iter()
            .any(|c| c.status == HealthStatus::Initializing && c.consecutive_failures > 0));
        assert!(sup.ensure_answering(0, Duration::ZERO).is_err());
        sup.shutdown().expect("shutdown");
    }

    #[test]
    fn stop_and_drop_leave_no_process_behind() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let d = RealMps.start(&dirs.cfg(&bin, "p")).expect("start");
        let pid = d.pid();
        assert_eq!(group_members(pid), vec![pid], "the daemon leads its own process group");
        d.stop().expect("stop");
        assert_gone(pid);

        // A handle dropped without stop kills its daemon too.
        let d = RealMps.start(&dirs.cfg(&bin, "p")).expect("start again on the same pipe dir");
        let pid = d.pid();
        drop(d);
        assert_gone(pid);

        // And so does a supervisor dropped without shutdown.
        let sup = Supervisor::spawn(
            "gpu-p",
            Arc::new(RealMps),
            dirs.cfg(&bin, "p"),
            policy(),
            Arc::new(SystemClock),
        )
        .expect("supervisor");
        wait_check(&sup, "ok", |c| c.status == HealthStatus::Ok);
        let pid = sup.daemon_pid().unwrap();
        drop(sup);
        assert_gone(pid);
    }

    #[test]
    fn restart_after_kill_cleans_stale_files() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = dirs.cfg(&bin, "r");
        let d = RealMps.start(&cfg).expect("start");
        let pid = d.pid();
        signal(pid, Signal::SIGKILL);
        let exit = wait_until("the exit", Duration::from_secs(10), || d.try_exit());
        assert_eq!(exit.to_string(), "daemon exited (signal 9)");
        // Observed: the sockets stay behind.
        assert!(cfg.pipe_dir.join("control").exists());
        assert!(matches!(run_control(&cfg, "get_server_list"), Err(MpsError::NotRunning { .. })));
        d.stop().expect("reap");
        assert_gone(pid);
        let d2 = RealMps.start(&cfg).expect("start over stale files");
        assert!(d2.probe().expect("probe").healthy());
        d2.stop().unwrap();
    }

    #[test]
    fn a_second_daemon_on_the_same_pipe_dir_refuses() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = DaemonConfig { default_active_thread_percentage: Some(30), ..dirs.cfg(&bin, "d") };
        let first = RealMps.start(&cfg).expect("start");

        // Through our start: refused before anything in the pipe dir is touched.
        let err = RealMps.start(&cfg).err().expect("second start refused");
        assert!(matches!(err, MpsError::AlreadyRunning { .. }), "{err}");

        // The raw binary: observed "An instance of this daemon is already running", status 1.
        let mut raw = Command::new(&bin)
            .arg("-f")
            .env("CUDA_MPS_PIPE_DIRECTORY", &cfg.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &cfg.log_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status =
            wait_until("the second daemon to give up", Duration::from_secs(20), || raw.try_wait().unwrap());
        let output = raw.wait_with_output().unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(status.code(), Some(1), "{text}");
        assert!(text.contains("already running"), "{text}");

        // The first still answers with its own settings; a daemon on another pipe dir runs beside it.
        assert_eq!(first.control("get_default_active_thread_percentage").unwrap(), "30.0");
        let other = RealMps.start(&dirs.cfg(&bin, "e")).expect("a second pipe dir");
        assert_eq!(other.control("get_default_active_thread_percentage").unwrap(), "100.0");
        other.stop().unwrap();
        first.stop().unwrap();
    }

    #[test]
    fn quit_existing_takes_over_a_daemon_left_behind() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = dirs.cfg(&bin, "o");
        // A daemon the agent does not own, as one left by an earlier agent (-d: it detaches).
        let status = Command::new(&bin)
            .arg("-d")
            .env("CUDA_MPS_PIPE_DIRECTORY", &cfg.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &cfg.log_dir)
            .status()
            .unwrap();
        assert!(status.success());
        wait_until("the detached daemon", Duration::from_secs(20), || {
            run_control(&cfg, "get_server_list").is_ok().then_some(())
        });
        assert!(matches!(RealMps.start(&cfg), Err(MpsError::AlreadyRunning { .. })));
        let quit = RealMps.quit_existing(&cfg);
        if !matches!(quit, Ok(true)) {
            let _ = run_control(&cfg, "quit");
            panic!("quit_existing: {quit:?}");
        }
        assert!(!RealMps.quit_existing(&cfg).unwrap(), "nothing left to quit");
        let d = RealMps.start(&cfg).expect("start after take-over");
        d.stop().unwrap();
    }

    #[test]
    fn a_pipe_dir_too_long_for_a_socket_is_refused_clearly() {
        let bin = require_bin!();
        let cfg = DaemonConfig::new(&bin, format!("/tmp/{}", "x".repeat(90)), "/tmp/mf-unused-log");
        let err = RealMps.start(&cfg).err().expect("refused").to_string();
        assert!(err.contains("pipe_dir") && err.contains("too long"), "{err}");
        assert!(!Path::new(&cfg.pipe_dir).exists(), "nothing created");
    }

    /// Not a test on its own: the agent that `adopts_the_daemon_of_an_agent_killed_with_sigkill`
    /// starts as a child process (this test binary, only this test) and kills with SIGKILL.
    #[test]
    fn helper_doomed_agent() {
        let Some(spec) = std::env::var_os(HELPER_ENV) else { return };
        let spec = spec.into_string().expect("utf-8");
        let parts: Vec<&str> = spec.split('\n').collect();
        let cfg = helper_cfg(Path::new(parts[0]), Path::new(parts[1]), Path::new(parts[2]));
        let sup = Supervisor::spawn("gpu-doomed", Arc::new(RealMps), cfg, policy(), Arc::new(SystemClock))
            .expect("supervisor");
        wait_check(&sup, "first ok", |c| c.status == HealthStatus::Ok);
        // State that a restart would lose: set at run time, not in the configuration.
        assert_eq!(sup.control("set_default_active_thread_percentage 40").unwrap(), "40.0");
        println!("READY {}", sup.daemon_pid().unwrap());
        // Waits to be killed; gives up (stopping its daemon) if nobody does.
        std::thread::sleep(Duration::from_secs(120));
    }

    #[test]
    fn adopts_the_daemon_of_an_agent_killed_with_sigkill() {
        use std::io::BufRead;
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = dirs.cfg(&bin, "j");
        let spec = format!("{}\n{}\n{}", bin.display(), cfg.pipe_dir.display(), cfg.log_dir.display());
        let mut agent = Command::new(std::env::current_exe().unwrap())
            .args(["mps::helper_doomed_agent", "--exact", "--nocapture", "--test-threads=1"])
            .env(HELPER_ENV, spec)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the first agent");
        let mut lines = std::io::BufReader::new(agent.stdout.take().unwrap()).lines();
        // libtest prints the test's name on the same line, before the test's own output.
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.split_once("READY ").map(|(_, pid)| pid.trim().parse::<u32>().expect("a pid")));
        let Some(pid) = ready else {
            let _ = agent.kill();
            panic!("the first agent did not get its daemon running: {:?}", agent.wait());
        };
        assert_eq!(recorded_pid(&cfg), Some(pid), "the daemon's identity is recorded");

        // The agent dies without a chance to clean up; its daemon lives on.
        signal(agent.id(), Signal::SIGKILL);
        agent.wait().unwrap();
        assert!(alive(pid), "the daemon outlives its agent");
        assert_eq!(run_control(&cfg, "get_default_active_thread_percentage").unwrap(), "40.0");

        // The next agent adopts it: same process, its state kept, no second daemon.
        let sup = Supervisor::spawn("gpu-j", Arc::new(RealMps), cfg.clone(), policy(), Arc::new(SystemClock))
            .expect("supervisor");
        let c = wait_check(&sup, "ok", |c| c.status == HealthStatus::Ok);
        assert_eq!((c.restarts, c.consecutive_failures), (0, 0), "{c:?}");
        assert_eq!(sup.daemon_pid(), Some(pid));
        let adopted = format!("adopted running daemon {pid}; waiting for the first probe");
        assert!(sup.history().iter().any(|c| c.reason == adopted), "{:#?}", sup.history());
        assert_eq!(daemons_on(&cfg.pipe_dir), vec![pid], "exactly one daemon");
        assert_eq!(sup.control("get_default_active_thread_percentage").unwrap(), "40.0");
        sup.ensure_answering(0, Duration::ZERO).expect("answering");

        // Not our child, yet its death is seen and repaired like any other.
        signal(pid, Signal::SIGKILL);
        let c = wait_check(&sup, "a restart and ok", |c| {
            c.restarts == 1 && c.status == HealthStatus::Ok && c.consecutive_failures == 0
        });
        assert_eq!(c.reason, "daemon answering");
        let vanished = ExitInfo::Vanished.to_string();
        assert!(
            sup.history().iter().any(|c| c.reason == vanished && c.consecutive_failures == 1),
            "{:#?}",
            sup.history()
        );
        let second = sup.daemon_pid().expect("a new daemon");
        assert_ne!(second, pid);
        assert_gone(pid);
        assert_eq!(daemons_on(&cfg.pipe_dir), vec![second]);
        assert_eq!(recorded_pid(&cfg), Some(second), "the new daemon is recorded");

        sup.shutdown().expect("shutdown");
        assert_gone(second);
        assert_eq!(recorded_pid(&cfg), None, "a clean stop removes the record");
    }

    #[test]
    fn a_stale_record_means_a_fresh_start() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = dirs.cfg(&bin, "t");
        std::fs::create_dir_all(&cfg.log_dir).unwrap();
        // A process that is gone, and a PID since reused by another process (this one).
        let mut gone = Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let me = DaemonRecord::of_process(std::process::id(), &cfg).unwrap();
        for stale in [
            DaemonRecord { pid: gone.id(), ..me.clone() },
            DaemonRecord { start_time: me.start_time + 1, ..me.clone() },
        ] {
            stale.write(&cfg.log_dir).unwrap();
            assert!(RealMps.adopt(&cfg).unwrap().is_none(), "{stale:?}");
            assert_eq!(recorded_pid(&cfg), None, "the stale record is removed");
            stale.write(&cfg.log_dir).unwrap();
            let sup =
                Supervisor::spawn("gpu-t", Arc::new(RealMps), cfg.clone(), policy(), Arc::new(SystemClock))
                    .expect("supervisor");
            let c = wait_check(&sup, "ok", |c| c.status == HealthStatus::Ok);
            assert_eq!(c.restarts, 0);
            assert!(!sup.history().iter().any(|c| c.reason.contains("adopted")), "{:#?}", sup.history());
            let pid = sup.daemon_pid().unwrap();
            assert_eq!(recorded_pid(&cfg), Some(pid));
            sup.shutdown().expect("shutdown");
            assert_gone(pid);
        }
    }

    #[test]
    fn a_detached_daemon_is_adopted_and_stopped_cleanly() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = DaemonConfig { default_active_thread_percentage: Some(30), ..dirs.cfg(&bin, "x") };
        let sup = Supervisor::spawn("gpu-x", Arc::new(RealMps), cfg.clone(), policy(), Arc::new(SystemClock))
            .expect("supervisor");
        wait_check(&sup, "ok", |c| c.status == HealthStatus::Ok);
        let pid = sup.detach().expect("a daemon");
        assert!(alive(pid), "detach leaves the daemon running");
        assert_eq!(recorded_pid(&cfg), Some(pid));

        let d = RealMps.adopt(&cfg).expect("adopt").expect("a daemon to adopt");
        assert_eq!(d.pid(), pid);
        assert_eq!(d.control("set_default_active_thread_percentage 45").unwrap(), "45.0");
        assert!(d.probe().unwrap().healthy());
        assert_eq!(d.try_exit(), None);
        // Adopting again (as a second agent would) does not disturb it.
        let again = RealMps.adopt(&cfg).unwrap().expect("still adoptable");
        again.detach();
        drop(again);
        assert!(alive(pid));
        assert_eq!(d.control("get_default_active_thread_percentage").unwrap(), "45.0");

        d.stop().expect("stop");
        assert_gone(pid);
        assert_eq!(d.try_exit(), Some(ExitInfo::Vanished));
        d.stop().expect("stop twice");
        assert_eq!(recorded_pid(&cfg), None, "stop removes the record");
        assert!(matches!(run_control(&cfg, "get_server_list"), Err(MpsError::NotRunning { .. })));
        assert!(RealMps.adopt(&cfg).unwrap().is_none(), "nothing left to adopt");
    }

    #[test]
    fn a_hung_daemon_is_adopted_then_restarted() {
        let bin = require_bin!();
        let dirs = Dirs::new();
        let cfg = dirs.cfg(&bin, "w");
        let first = RealMps.start(&cfg).expect("start");
        let pid = first.pid();
        first.detach();
        drop(first);
        signal(pid, Signal::SIGSTOP);

        let policy = MpsPolicy { probe_timeout: Duration::from_secs(1), ..policy() };
        let sup = Supervisor::spawn("gpu-w", Arc::new(RealMps), cfg.clone(), policy, Arc::new(SystemClock))
            .expect("supervisor");
        let c = wait_check(&sup, "ok after a restart", |c| c.restarts == 1 && c.status == HealthStatus::Ok);
        assert_eq!(c.consecutive_failures, 0);
        let history = sup.history();
        assert!(
            history.iter().any(|c| c.reason.starts_with(&format!("adopted running daemon {pid}"))),
            "{history:#?}"
        );
        assert!(
            history
                .iter()
                .any(|c| c.status == HealthStatus::Impaired && c.reason == "probe timed out after 1s"),
            "{history:#?}"
        );
        // The stopped daemon was killed through its process group, not left behind.
        assert_gone(pid);
        let second = sup.daemon_pid().unwrap();
        assert_eq!(daemons_on(&cfg.pipe_dir), vec![second]);
        sup.shutdown().expect("shutdown");
        assert_gone(second);
    }
}
