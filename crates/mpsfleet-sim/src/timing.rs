//! The simulated fleet's constants: its GPUs, its pools, and how long each part of it takes
//! (the server's loops as the server runs them; a task's start and stop, a daemon's restart
//! and a long-poll answer as the simulator assumes them).

/// An H100's memory and the MPS client limit on Volta and newer.
pub const GPU_MEMORY_MIB: u64 = 81_559;
pub const MAX_MPS_CLIENTS: u32 = 48;
/// The server's loops (crates/mpsfleet-server/src/lib.rs).
pub const HEALTH_TICK_MS: u64 = mpsfleet_server::HEALTH_INTERVAL.as_millis() as u64;
pub const RESYNC_MS: u64 = mpsfleet_server::RESYNC_INTERVAL.as_millis() as u64;
/// A long-poll answer reaching its agent.
pub const FETCH_LATENCY_MS: u64 = 20;
/// Stopping a daemon and starting it again.
pub const DAEMON_RESTART_MS: u64 = 300;
/// From "start" to RUNNING, and from "stop" to STOPPED.
pub const TASK_START_MS: (u64, u64) = (2_000, 10_000);
pub const TASK_STOP_MS: (u64, u64) = (500, 3_000);
/// MPS clients exit this long after their server reported a fatal fault.
pub const CLIENT_EXIT_MS: u64 = 1_000;

pub const MANAGED_POOL: &str = "gpu";
pub const SELF_POOL: &str = "gpu-self";
