//! mpsfleet's pure core: task definition validation, GPU placement, host health evaluation,
//! remediation planning, the responsibility record, the lifecycles of tasks, hosts and MPS
//! daemons, and the clock seam.
//! Nothing here does I/O or reads the time by itself.

pub mod backoff;
pub mod bounds;
pub mod changes;
pub mod clock;
pub mod controller;
pub mod deployment;
pub mod explain;
pub mod fit;
pub mod health;
pub mod lifecycle;
pub mod mps_model;
pub mod remediation;
pub mod scaling;
pub mod scheduler;
pub mod sigv4;
pub mod task_size;
pub mod taskdef;
