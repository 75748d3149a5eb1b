//! `mpsfleet up` as a new user runs it, for the tests that drive a whole local fleet.

use mpsfleet_client::Client;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// A running `up`, interrupted (then killed) when dropped.
pub struct Up {
    pub child: Child,
    pub admin: Client,
    pub lines: Receiver<String>,
    /// The server's URL and the CLI's configuration home.
    pub url: String,
    pub home: std::path::PathBuf,
    /// What `up` printed up to and including its `try:` line.
    pub banner: Vec<String>,
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
            for _ in 0..600 {
                if self.child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Up {
    /// `up --hosts HOSTS --gpus-per-host 2` on `data` (tasks as processes), once it printed
    /// its summary.
    pub fn start(home: &Path, data: &Path, hosts: u32) -> Up {
        Up::start_with(home, data, hosts, &[])
    }

    /// [`Up::start`] with more arguments for `up` (`--mode self-managed`).
    pub fn start_with(home: &Path, data: &Path, hosts: u32, extra: &[&str]) -> Up {
        Up::start_on_engine(home, data, hosts, extra, &format!("unix://{}/no-docker.sock", home.display()))
    }

    /// [`Up::start_with`] on the Docker Engine at `docker_host`: tasks with images run as
    /// containers.
    pub fn start_on_engine(home: &Path, data: &Path, hosts: u32, extra: &[&str], docker_host: &str) -> Up {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(["up", "--hosts", &hosts.to_string(), "--gpus-per-host", "2", "--listen", "127.0.0.1:0"])
            .args(extra)
            // Tests run side by side: none takes the machine's default DNS port unless it asks.
            .args(if extra.contains(&"--dns-listen") { &[][..] } else { &["--dns-listen", "off"][..] })
            .arg("--data-dir")
            .arg(data)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .env("HOME", home)
            .env_remove("XDG_CONFIG_HOME")
            .env("DOCKER_HOST", docker_host)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("up: {line}");
                let _ = tx.send(line);
            }
        });
        let mut url = None;
        let mut banner = Vec::new();
        loop {
            let line = lines.recv_timeout(Duration::from_secs(60)).expect("up printed its summary");
            banner.push(line.clone());
            if let Some(u) = line.strip_prefix("mpsfleet up: server ").and_then(|r| r.split(',').next()) {
                url = Some(u.to_string());
            }
            if let Some(cmd) = line.strip_prefix("try: ").and_then(|r| r.split_whitespace().next()) {
                // The command `up` suggests runs from where `up` ran: here, the built binary.
                let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
                assert!(
                    cmd == "mpsfleet" || root.join(cmd).is_file(),
                    "up suggests {cmd:?}, which does not run from its directory: {line}"
                );
                break;
            }
        }
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(home.join(".config/mpsfleet/config.json")).unwrap())
                .unwrap();
        let trust =
            mpsfleet_client::tls::Trust::Ca(std::fs::read(config["caFile"].as_str().unwrap()).unwrap());
        let token = config["token"].as_str().map(String::from);
        let admin = Client::with_trust(url.as_deref().unwrap(), token, &trust).unwrap();
        Up { child, admin, lines, url: url.unwrap(), home: home.to_path_buf(), banner }
    }

    /// Ctrl-C; returns what `up` printed while it stopped.
    pub fn interrupt(self) -> Vec<String> {
        self.stop_with("-INT")
    }

    /// Sends `signal` (`-INT`, `-TERM`); returns what `up` printed while it stopped.
    pub fn stop_with(mut self, signal: &str) -> Vec<String> {
        assert!(Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "up exited with {status}");
        self.lines.try_iter().collect()
    }
}

impl Up {
    /// Runs the CLI against this `up`, as its user would (the configuration `up` wrote).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
            .args(args)
            .env("HOME", &self.home)
            .env_remove("XDG_CONFIG_HOME")
            .output()
            .expect("run the CLI")
    }
}
