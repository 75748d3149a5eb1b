//! The fault a user meets when an MPS daemon cannot stay up: killed, and killed again each
//! time the agent's local repair restarts it. `bench recovery` injects it, and so does
//! `tests/recovery.rs` (which includes this file).

/// Kills the daemon recorded at `record` whenever a live one is there (the agent's local
/// restarts bring it back), until `stop`; returns how many it killed. Only a process that is
/// the MPS control daemon is signalled, never a pid reused since.
pub fn keep_killing(
    record: std::path::PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut kills = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let pid = std::fs::read(&record)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["pid"].as_u64());
            let live = pid.and_then(|p| u32::try_from(p).ok()).filter(|&p| {
                mpsfleet_proc::cmdline(p)
                    .is_some_and(|c| String::from_utf8_lossy(&c).contains("nvidia-cuda-mps-control"))
                    && mpsfleet_proc::stat(p).is_some_and(|s| !s.is_dead())
            });
            if let Some(p) = live {
                let killed = std::process::Command::new("kill").args(["-9", &p.to_string()]).status();
                if killed.is_ok_and(|s| s.success()) {
                    kills += 1;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        kills
    })
}
