//! The audit log: every change a person or tool makes through the API (who: token and role;
//! what: method and route; when; from where; the result), written in the same store commit as
//! the change itself, so that a change is never without its entry nor an entry without its
//! change. A call that changed nothing, or was refused by the cluster, gets an entry of its
//! own. Agents' calls are not audited. The log keeps the newest [`MAX_AUDIT_ENTRIES`].
//! The operations are `Cluster`'s, in `access.rs`; what they share is here.

use mpsfleet_types::access::Role;

/// Store kind of audit entries, keyed by a zero-padded sequence number.
pub(super) const AUDIT: &str = "audit";
/// Entries kept; each new one past this removes the oldest, in the same commit.
pub const MAX_AUDIT_ENTRIES: usize = 50_000;
/// The most entries one `audit list` returns.
pub const MAX_AUDIT_LIST: usize = 10_000;

/// Who is making the API call being served, and what it is, for its entry.
#[derive(Debug, Clone)]
pub struct AuditContext {
    pub actor: String,
    pub role: Role,
    pub action: String,
    pub target: String,
    pub from: String,
}

/// The call being served: its context, and whether its entry is written yet.
#[derive(Debug)]
pub(super) struct AuditCall {
    pub(super) ctx: AuditContext,
    pub(super) written: bool,
}

/// The audit log's bookkeeping: the next sequence number and the keys kept, oldest first.
#[derive(Debug, Default)]
pub(super) struct AuditLog {
    pub(super) next_seq: u64,
    pub(super) keys: std::collections::VecDeque<String>,
}

impl AuditLog {
    /// The entries in the store at load, by key.
    pub(super) fn loaded(&mut self, mut keys: Vec<String>) {
        keys.sort();
        self.next_seq = keys.last().and_then(|k| k.parse::<u64>().ok()).map_or(0, |s| s + 1);
        self.keys = keys.into();
    }

    /// The next entry is committed, and the `dropped` oldest ones deleted. Called by
    /// `State::apply` only.
    pub(super) fn written(&mut self, dropped: usize) {
        let k = key(self.next_seq);
        self.next_seq += 1;
        self.keys.push_back(k);
        for _ in 0..dropped {
            self.keys.pop_front();
        }
    }
}

pub(super) fn key(seq: u64) -> String {
    format!("{seq:020}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::*;
    use mpsfleet_core::clock::ManualClock;

    fn ctx(action: &str) -> AuditContext {
        AuditContext {
            actor: "token:tok-1".into(),
            role: Role::Operator,
            action: action.into(),
            target: "/v1/pools".into(),
            from: "127.0.0.1".into(),
        }
    }

    #[test]
    fn a_change_and_its_entry_share_one_commit_and_refusals_get_their_own() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
        let before = c.read().revision();
        c.begin_audit(Some(ctx("POST /v1/pools")));
        let out = c.create_pool(CreatePool { name: "gpu".into(), ..Default::default() });
        c.end_audit(out.as_ref().err().map(|e| format!("{}: {e}", e.code())));
        assert_eq!(c.read().revision(), before + 1, "the pool and its entry are one commit");
        c.begin_audit(Some(ctx("POST /v1/pools")));
        let out = c.create_pool(CreatePool { name: "gpu".into(), ..Default::default() });
        c.end_audit(out.as_ref().err().map(|e| format!("{}: {e}", e.code())));
        let entries = c.audit_entries(10).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].result, "ok");
        assert_eq!(entries[0].revision, Some(before + 1));
        assert!(entries[1].result.starts_with("AlreadyExists: pool gpu already exists"), "{:?}", entries[1]);
        assert_eq!(entries[1].revision, None);
        // Calls made without a context (agents, controllers) write none.
        c.begin_audit(None);
        let out = c.update_pool("gpu", UpdatePool::default());
        c.end_audit(out.as_ref().err().map(|e| format!("{}: {e}", e.code())));
        assert_eq!(c.audit_entries(10).unwrap().len(), 2);
        // A restarted server continues the sequence.
        let c = Cluster::load(store, clock, |_| Ok(())).unwrap();
        assert_eq!(c.audit_entries(10).unwrap().len(), 2);
        assert_eq!(c.state.audit_log().next_seq, 2);
    }
}
