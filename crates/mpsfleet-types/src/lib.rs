//! The vocabulary of mpsfleet: ids, task definitions, tasks, hosts, pools, services and the
//! JSON shapes the API speaks. Plain data with serde; no I/O, no clock, no async.

pub mod access;
pub mod api;
pub mod bounds;
pub mod check_key;
pub mod discovery;
pub mod drill;
pub mod event;
pub mod exec;
pub mod history;
pub mod host;
pub mod ids;
pub mod incident;
pub mod labels;
pub mod logs;
pub mod policy;
pub mod policy_error;
pub mod pool;
pub mod priority;
pub mod scaling;
pub mod secret;
pub mod service;
pub mod tags;
pub mod task;
pub mod taskdef;
pub mod time;

pub use bounds::*;
pub use history::{Entry, History, HistoryEvent};
pub use host::*;
pub use ids::*;
pub use incident::*;
pub use policy::*;
pub use pool::*;
pub use priority::Preemption;
pub use service::*;
pub use task::*;
pub use taskdef::*;
pub use time::utc;
