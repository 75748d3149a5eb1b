//! The operator's commands on hosts and incidents: `host drain`, `host replace`,
//! `host activate`, `incident acknowledge` and `incident resolve`. Each is recorded on the
//! incident's timeline with who ran it (the identity of the token used) and when, and then the
//! same planner as automatic remediation runs (`remediation::plan`), so an operator's command
//! and mpsfleet's own steps read as one record.
//! The operations are `Cluster`'s, in `hosts.rs` and `incidents.rs`; what they share is here.
//!
//! A command that ends an incident while its replacement host is in flight cancels the
//! replacement: its one-time registration token is revoked (a host that registers with it is
//! refused), and a launch the provider already made is terminated.

use super::*;

/// What an operator command did, for the CLI to print.
#[derive(Debug, Clone)]
pub struct OperatorOutcome {
    pub incident: Incident,
    /// What happened to the replacement host, when the command affected one.
    pub replacement: Option<String>,
}
