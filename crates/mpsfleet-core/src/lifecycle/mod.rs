//! Lifecycles as enums with pure transitions: [`task`] (ECS's task statuses), [`host`]
//! (`REGISTERING -> ONBOARDING -> ACTIVE -> DRAINING -> DEREGISTERED`), [`mps`] (one GPU's
//! MPS daemon health), [`drill`] (`RUNNING -> RESTORING -> ENDED`), [`service`] (a service's
//! status and its deployments') and [`dependencies`] (the containers of one task, started in `dependsOn`
//! order and stopped in reverse). Each `step` takes a state and a named event and returns the
//! next state (or why the event does not apply); a shell (the server, the agent, the simulator)
//! executes what follows. No I/O, no clock reads.

pub mod dependencies;
pub mod drill;
pub mod host;
pub mod mps;
pub mod service;
pub mod task;
