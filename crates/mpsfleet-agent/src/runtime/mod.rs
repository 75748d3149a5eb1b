//! Task processes and their probes: containers run as plain processes under a shim that
//! outlives the agent, are stopped SIGTERM-then-SIGKILL, are found again after an agent restart,
//! and are probed for startup, readiness and liveness.
//!
//! Layout: [`shim`] is the per-container supervisor process and its on-disk records,
//! [`container`] the agent side ([`Runtime`]), [`identity`] users and environment, [`task`] the
//! task-level verdict from container states, [`probes`] the checks.

pub mod container;
pub mod engine;
pub mod identity;
pub mod probes;
mod procfs;
pub mod shim;
pub mod task;

pub use container::{
    logs, logs_beneath, AdoptedState, ContainerHandle, ContainerLaunch, ContainerState, LogStream, Runtime,
    RuntimeError, Settled, StopOutcome, DEFAULT_STOP_TIMEOUT,
};
pub use identity::{
    resolve_user, ExecContext, ResolvedUser, TaskUser, UidRange, UserError, DEFAULT_TASK_UIDS,
};
pub use shim::{shim_main, shim_main_from_args, ExitRecord, ShimArgs};
pub use task::{stop_for_exit, task_state, ContainerView, TaskPhase};
