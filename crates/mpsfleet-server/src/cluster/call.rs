//! The API call being served, as the cluster sees it: its audit entry and the client token it
//! claimed. Both ride on the call's first commit ([`Cluster::commit`] asks
//! [`Cluster::riders`], the one place that adds them), so that a change is never without its
//! audit entry nor a client token without the change it names. `AppState::call` opens the
//! call ([`Cluster::begin_audit`]) and closes it ([`Cluster::end_audit`]); a client token is
//! claimed by the operation that takes one (`idempotency.rs`). Agents' and the controllers'
//! calls carry neither.

use super::audit::AuditCall;
use super::idempotency::ClientTokenRecord;

/// What the call being served adds to its first commit.
#[derive(Debug, Default)]
pub(super) struct ServedCall {
    /// Who makes the call and what it is, and whether its entry is written yet.
    pub(super) audit: Option<AuditCall>,
    /// The client token the call claimed, by key, to be stored with its first commit.
    pub(super) token: Option<(String, ClientTokenRecord)>,
    /// The oldest client token records that commit deletes.
    pub(super) pruning: Vec<String>,
}
