//! The API call being served, as the cluster sees it: its audit entry and the client token it
//! claimed. Both ride on the call's first commit (`Cluster::writing` asks
//! [`ServedCall::riders`], the one place that adds them), so that a change is never without
//! its audit entry nor a client token without the change it names. `AppState::call` opens the
//! call (`Cluster::begin_audit`) and closes it (`Cluster::end_audit`); a client token is
//! claimed by the operation that takes one (`Cluster::idempotent`). Agents' and the
//! controllers' calls carry neither.

use super::access::audit_ops;
use super::audit::AuditCall;
use super::error::Error;
use super::idempotency::*;
use super::read::Reader;
use super::state::Change;
use super::write::Writer;
use mpsfleet_store::{Op, Precondition};
use serde::Serialize;

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

impl ServedCall {
    /// The ops the call being served adds to a commit: its audit entry (the first commit
    /// only) and its client token; and how many of them are the audit log's.
    pub(super) fn riders(&mut self, r: &Reader<'_>) -> Result<(Vec<Op>, usize), Error> {
        let mut ops = self.audit_ops(r)?;
        let audit = ops.len();
        ops.extend(self.client_token_ops(r)?);
        Ok((ops, audit))
    }

    /// The riders of [`ServedCall::riders`] are committed (`audit`: how many of them were the
    /// audit log's).
    pub(super) fn riders_written(&mut self, w: &mut Writer<'_>, audit: usize) {
        if audit > 0 {
            self.audit_written(w, audit - 1);
        }
        self.client_token_written(w);
    }

    /// The ops a commit adds for the call being served, the first time: its entry, and the
    /// removal of the oldest when the log is full. [`ServedCall::audit_written`] once committed.
    pub(super) fn audit_ops(&mut self, r: &Reader<'_>) -> Result<Vec<Op>, Error> {
        let Some(call) = self.audit.as_ref().filter(|c| !c.written) else { return Ok(Vec::new()) };
        let ctx = call.ctx.clone();
        // The revision this commit gets: the cluster is the store's one writer, and a commit
        // that writes counts the store's revision one up.
        let revision = r.state.revision() + 1;
        audit_ops(r, &ctx, "ok".into(), Some(revision))
    }

    /// The entry of [`ServedCall::audit_ops`] is in the store, `dropped` old ones gone.
    pub(super) fn audit_written(&mut self, w: &mut Writer<'_>, dropped: usize) {
        if let Some(call) = self.audit.as_mut() {
            call.written = true;
        }
        let rev = w.state.revision();
        w.apply(rev, Change::AuditWritten { dropped });
    }

    /// The ops that store the pending token, and delete the oldest records when they are past
    /// their time or too many.
    pub(super) fn client_token_ops(&mut self, r: &Reader<'_>) -> Result<Vec<Op>, Error> {
        let Some((key, rec)) = &self.token else { return Ok(Vec::new()) };
        let mut ops = vec![Op::put_json(CLIENT_TOKEN, key, rec, Precondition::Any)?];
        let now = r.now_ms;
        let tokens = r.state.client_tokens();
        let over = (tokens.by_key.len() + 1).saturating_sub(MAX_CLIENT_TOKENS);
        let pruning: Vec<String> = tokens
            .order()
            .iter()
            .enumerate()
            .take_while(|(i, (at, _))| *i < over || now.saturating_sub(*at) >= CLIENT_TOKEN_TTL_MS)
            .take(PRUNE_PER_COMMIT.max(over))
            .map(|(_, (_, k))| k.clone())
            .collect();
        // The pending key itself may be among them (claimed again past its time): it is
        // written, not deleted.
        ops.extend(
            pruning.iter().filter(|k| *k != key).map(|k| Op::delete(CLIENT_TOKEN, k, Precondition::Any)),
        );
        self.pruning = pruning;
        Ok(ops)
    }

    /// [`ServedCall::client_token_ops`] are committed.
    pub(super) fn client_token_written(&mut self, w: &mut Writer<'_>) {
        let Some((key, rec)) = self.token.take() else { return };
        let pruned = std::mem::take(&mut self.pruning);
        let rev = w.state.revision();
        w.apply(rev, Change::ClientToken { key, rec, pruned });
    }

    /// The call is over: a token it did not commit is forgotten.
    pub(super) fn release_client_token(&mut self) {
        self.token = None;
        self.pruning.clear();
    }

    /// Claims `token` for a call by `actor` on `route` with `request`, which is answered again
    /// as `replay` says if it is retried. A retry with another request is refused.
    pub(super) fn claim_client_token(
        &mut self,
        r: &Reader<'_>,
        actor: &str,
        route: &str,
        token: &str,
        request: &impl Serialize,
        replay: Replay,
    ) -> Result<Claim, Error> {
        check_token(token)?;
        let key = crate::auth::digest(&format!("{actor}\n{route}\n{token}"));
        let body =
            serde_json::to_vec(request).map_err(|e| Error::Internal(format!("encode a request: {e}")))?;
        let request_sha256 = crate::auth::digest(&format!("{route}\n{}", String::from_utf8_lossy(&body)));
        let now = r.now_ms;
        if let Some(rec) = r.state.client_tokens().by_key.get(&key) {
            if now.saturating_sub(rec.created_at_ms) < CLIENT_TOKEN_TTL_MS {
                if rec.request_sha256 != request_sha256 {
                    return Err(Error::Conflict(format!(
                        "client token {token:?} was used with another request (within the last {} h): a \
                         client token names one request; use a new one for a new request",
                        CLIENT_TOKEN_TTL_MS / 3_600_000
                    )));
                }
                return Ok(Claim::Retry(rec.replay.clone()));
            }
        }
        self.token = Some((key, ClientTokenRecord { request_sha256, replay, created_at_ms: now }));
        Ok(Claim::First)
    }
}
