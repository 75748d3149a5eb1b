//! The audit log: every change a person or tool makes through the API (who: token and role;
//! what: method and route; when; from where; the result), written in the same store commit as
//! the change itself, so that a change is never without its entry nor an entry without its
//! change. A call that changed nothing, or was refused by the cluster, gets an entry of its
//! own. Agents' calls are not audited. The log keeps the newest [`MAX_AUDIT_ENTRIES`].

use super::*;
use mpsfleet_types::access::{AuditEntry, AuditEvent, Role};

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

fn key(seq: u64) -> String {
    format!("{seq:020}")
}

impl Cluster {
    pub(super) fn load_audit(&mut self) -> Result<(), Error> {
        let keys: Vec<String> = self.store.list(AUDIT)?.into_iter().map(|r| r.key).collect();
        self.state.apply(0, Change::AuditLoaded(keys));
        Ok(())
    }

    /// From now until [`Cluster::end_audit`], the first commit carries an entry for `ctx`.
    pub fn begin_audit(&mut self, ctx: Option<AuditContext>) {
        self.call.audit = ctx.map(|ctx| AuditCall { ctx, written: false });
    }

    /// Ends the call: one that committed nothing gets an entry of its own, with its result
    /// (`failure`: the error, as the caller was answered; `None`: it succeeded).
    pub fn end_audit(&mut self, failure: Option<String>) {
        let Some(call) = self.call.audit.take() else { return };
        if call.written {
            return;
        }
        let result = failure.unwrap_or_else(|| "ok (no change)".to_string());
        let ops = match self.audit_ops(&call.ctx, result, None) {
            Ok(ops) => ops,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode an audit entry");
                return;
            }
        };
        match self.writer().commit(&ops) {
            Ok(_) => self.audit_written(ops.len() - 1),
            Err(e) => tracing::error!(error = %e, action = %call.ctx.action, "cannot write an audit entry"),
        }
    }

    /// The ops a commit adds for the call being served, the first time: its entry, and the
    /// removal of the oldest when the log is full. [`Cluster::audit_written`] once committed.
    pub(super) fn audit_ops_for_commit(&mut self) -> Result<Vec<Op>, Error> {
        let Some(call) = self.call.audit.as_ref().filter(|c| !c.written) else { return Ok(Vec::new()) };
        let ctx = call.ctx.clone();
        // The revision this commit gets: the cluster is the store's one writer, and a commit
        // that writes counts the store's revision one up.
        let revision = self.state.revision() + 1;
        self.audit_ops(&ctx, "ok".into(), Some(revision))
    }

    /// The entry of [`Cluster::audit_ops_for_commit`] is in the store, `dropped` old ones gone.
    pub(super) fn audit_written(&mut self, dropped: usize) {
        if let Some(call) = self.call.audit.as_mut() {
            call.written = true;
        }
        let rev = self.state.revision();
        self.writer().apply(rev, Change::AuditWritten { dropped });
    }

    /// An entry for `ctx` under the next key, and deletes of the oldest entries past the bound.
    fn audit_ops(&self, ctx: &AuditContext, result: String, revision: Option<u64>) -> Result<Vec<Op>, Error> {
        let event = AuditEvent {
            actor: ctx.actor.clone(),
            role: ctx.role,
            action: ctx.action.clone(),
            target: ctx.target.clone(),
            from: ctx.from.clone(),
            result,
            revision,
        };
        let entry = AuditEntry::new(self.now(), event);
        let mut ops =
            vec![Op::put_json(AUDIT, key(self.state.audit_log().next_seq), &entry, Precondition::Absent)?];
        let over = (self.state.audit_log().keys.len() + 1).saturating_sub(MAX_AUDIT_ENTRIES);
        ops.extend(
            self.state
                .audit_log()
                .keys
                .iter()
                .take(over)
                .map(|k| Op::delete(AUDIT, k.clone(), Precondition::Any)),
        );
        Ok(ops)
    }

    /// `audit list`: the newest `limit` entries, oldest first.
    pub fn audit_entries(&self, limit: usize) -> Result<Vec<AuditEntry>, Error> {
        let limit = limit.min(MAX_AUDIT_LIST);
        let start = self.state.audit_log().keys.len().saturating_sub(limit);
        let mut out = Vec::with_capacity(limit);
        for k in self.state.audit_log().keys.iter().skip(start) {
            if let Some(r) = self.store.get(AUDIT, k)? {
                out.push(decode(&r)?);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let before = c.revision();
        c.begin_audit(Some(ctx("POST /v1/pools")));
        let out = c.create_pool(CreatePool { name: "gpu".into(), ..Default::default() });
        c.end_audit(out.as_ref().err().map(|e| format!("{}: {e}", e.code())));
        assert_eq!(c.revision(), before + 1, "the pool and its entry are one commit");
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
