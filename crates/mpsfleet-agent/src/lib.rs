//! The mpsfleet node agent: discovers GPUs, supervises one MPS control daemon per GPU, runs
//! tasks as processes with the MPS environment wired in, probes them, and reports.
//!
//! [`agent::run`] is the entry point; [`tasks`] is the task loop; [`mps`] drives and supervises
//! the daemons; [`runtime`] runs containers under a shim and probes them; [`docker`] runs them
//! in Docker Engine; [`env`] builds a task's environment; [`discovery`] finds the GPUs;
//! [`faults`] injects a drill's faults where the agent allows it.

pub mod agent;
pub mod container_health;
pub mod discovery;
pub mod docker;
pub mod endpoint;
pub mod env;
pub mod exec;
pub mod faults;
pub mod gpu_health;
pub mod gpu_use;
pub mod logs;
pub mod metrics;
pub mod mps;
pub mod output;
pub mod reported_checks;
pub mod runtime;
pub mod safe_fs;
pub mod secrets;
pub mod tasks;

pub use agent::{run, AgentConfig, AgentError, DockerSettings, MpsMode, RuntimeChoice};
