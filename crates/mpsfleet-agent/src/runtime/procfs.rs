//! Reading `/proc/PID/stat`: is a pid still the process we started, and is it a zombie. The
//! reader is shared with the server (`mpsfleet-proc`); this names the parts the runtime uses.

pub(crate) use mpsfleet_proc::{liveness, stat, Liveness};
