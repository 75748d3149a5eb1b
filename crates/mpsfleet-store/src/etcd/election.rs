//! Leader election on the store's etcd, with the fence every leader's commit carries.
//!
//! One key, `P/leader`, written with a lease by the candidate that finds it absent (a
//! transaction: create revision 0, then put). Its holder keeps the lease alive every third of the
//! TTL; when it dies or is cut off the lease expires, etcd deletes the key, and the next
//! candidate to try creates it. A leader's commits compare the key's create revision with the
//! one it created, so once the key has expired, been deleted, or been created again by another
//! server, they fail however long the old leader was paused. A leader also stops believing it
//! leads, on its own clock, when it could not renew the lease for two thirds of the TTL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::gateway::{num, txn_body, Compare, GatewayError, TxnOp};
use super::{backend, EtcdStore, Inner};
use crate::StoreError;

/// Who a server is, as the leader key shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// A name unique among the servers (default: the host name and port).
    pub id: String,
    /// Where clients reach it, e.g. `https://10.0.0.5:7070`.
    pub url: String,
}

/// The current leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    pub candidate: Candidate,
    /// The lease that keeps the leader key.
    pub lease: i64,
    /// The leader key's create revision (etcd's), which fences its commits.
    pub create_revision: i64,
}

/// One etcd member, as `cluster status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    pub endpoint: String,
    /// The member's name, when it answered.
    pub name: Option<String>,
    pub healthy: bool,
    pub is_raft_leader: bool,
    pub version: Option<String>,
    pub db_size_bytes: Option<i64>,
    /// Why the member did not answer.
    pub error: Option<String>,
}

/// The leadership this process holds, shared by its handle and the store's fence.
pub(crate) struct Held {
    pub(crate) create_revision: i64,
    lease: i64,
    lost: tokio::sync::watch::Sender<Option<String>>,
    /// When the last renewal that etcd granted was sent (the lease runs from then at the latest).
    renewed: std::sync::Mutex<std::time::Instant>,
}

impl Held {
    /// Whether the last granted renewal was sent within two thirds of `ttl`: the deadline, on
    /// this machine's clock, past which this process no longer believes it leads.
    fn renewed_within(&self, ttl: Duration) -> bool {
        self.renewed.lock().unwrap_or_else(|p| p.into_inner()).elapsed() < ttl * 2 / 3
    }

    pub(crate) fn lose(&self, reason: &str) {
        self.lost.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason.to_owned());
                true
            } else {
                false
            }
        });
    }
}

/// Leadership won by [`EtcdStore::campaign`]. Lost when the lease could not be renewed, a
/// fenced commit failed, a commit's outcome was unknown, or [`Leadership::resign`] was called.
pub struct Leadership {
    held: Arc<Held>,
    inner: Arc<Inner>,
    ttl: Duration,
}

impl Leadership {
    /// Why leadership was lost, once it was.
    pub fn lost_reason(&self) -> Option<String> {
        self.held.lost.borrow().clone()
    }

    /// Resolves when leadership is lost, with the reason.
    pub fn lost(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut rx = self.held.lost.subscribe();
        async move {
            loop {
                if let Some(r) = rx.borrow_and_update().clone() {
                    return r;
                }
                if rx.changed().await.is_err() {
                    return "the store was closed".to_owned();
                }
            }
        }
    }

    /// The lease that keeps the leader key.
    pub fn lease(&self) -> i64 {
        self.held.lease
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The fence: the leader key's create revision, which every commit of this leadership
    /// carries.
    pub fn fence(&self) -> i64 {
        self.held.create_revision
    }

    /// Whether this server may still answer as the leader on its own clock: not lost, and a
    /// renewal sent within two thirds of the TTL. No other server can have been elected since
    /// (the lease outlives that by a third of the TTL), so an answer given now is not stale.
    pub fn is_current(&self) -> bool {
        self.held.lost.borrow().is_none() && self.held.renewed_within(self.ttl)
    }

    /// Steps down: commits are refused from now on, and the leader key is deleted with its
    /// lease so that another server takes over at once rather than after the TTL.
    pub fn resign(&self) {
        self.inner.lose("resigned");
        let gw = self.inner.gw.clone();
        let lease = self.held.lease;
        let _ = self.inner.io(async move { gw.lease_revoke(lease).await });
    }
}

impl EtcdStore {
    /// Blocks until this process is elected leader (or `stop` is set: `None`). The store's
    /// commits carry the fence from then on. `ttl` is at least 2 s (etcd's minimum).
    pub fn campaign(
        &self,
        me: &Candidate,
        ttl: Duration,
        stop: &AtomicBool,
    ) -> Result<Option<Leadership>, StoreError> {
        let inner = &self.inner;
        let ttl = ttl.max(Duration::from_secs(2));
        let value = serde_json::to_vec(me).map_err(|e| StoreError::Encode {
            kind: "etcd".to_owned(),
            key: "leader".to_owned(),
            message: e.to_string(),
        })?;
        let key = inner.keys.leader();
        while !stop.load(Ordering::Relaxed) && !inner.closed.load(Ordering::Relaxed) {
            if self.leader()?.is_some() {
                thread::sleep(Duration::from_millis(100));
                continue;
            }
            let gw = inner.gw.clone();
            let secs = ttl.as_secs_f64().ceil() as i64;
            let granted = monotonic_now();
            let (lease, _) =
                inner.io(async move { gw.lease_grant(secs).await }).map_err(backend("campaign"))?;
            let body = txn_body(
                &[Compare::CreateRevision(&key, 0)],
                &[TxnOp::Put { key: &key, value: &value, lease }],
                &[],
            );
            let a = inner.txn(body).map_err(backend("campaign"))?;
            if !a.succeeded {
                let gw = inner.gw.clone();
                let _ = inner.io(async move { gw.lease_revoke(lease).await });
                continue;
            }
            // The put is the transaction's only write: the key's create revision is the
            // transaction's revision.
            let (tx, _) = tokio::sync::watch::channel(None);
            let held = Arc::new(Held {
                create_revision: a.revision,
                lease,
                lost: tx,
                renewed: std::sync::Mutex::new(granted),
            });
            *inner.fence.lock().unwrap_or_else(|p| p.into_inner()) = Some(held.clone());
            if let Err(e) = inner.catch_up() {
                // Leading from a replica that may be behind is not leading: give it back.
                inner.lose("could not read the latest state after the election");
                let gw = inner.gw.clone();
                let _ = inner.io(async move { gw.lease_revoke(lease).await });
                return Err(e);
            }
            let me = inner.clone();
            let h = held.clone();
            thread::Builder::new()
                .name("etcd-lease".to_owned())
                .spawn(move || keep_alive(&me, &h, ttl))
                .map_err(|e| StoreError::Backend {
                    op: "campaign",
                    message: format!("cannot start the lease thread: {e}"),
                })?;
            return Ok(Some(Leadership { held, inner: inner.clone(), ttl }));
        }
        Ok(None)
    }

    /// The elected leader, if any.
    pub fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        let a = self.inner.range(self.inner.keys.leader(), None, 1, 0).map_err(backend("read the leader"))?;
        let Some(kv) = a.kvs.into_iter().next() else { return Ok(None) };
        let candidate: Candidate = serde_json::from_slice(&kv.value).map_err(|e| StoreError::Corrupt {
            kind: "etcd".to_owned(),
            key: "leader".to_owned(),
            message: e.to_string(),
        })?;
        Ok(Some(LeaderInfo { candidate, lease: kv.lease, create_revision: kv.create_revision }))
    }

    /// Every configured endpoint's member status, and whether each answered.
    pub fn members(&self) -> Vec<MemberStatus> {
        let inner = &self.inner;
        let names: Vec<(Vec<String>, String)> = {
            let gw = inner.gw.clone();
            match inner.io(async move { gw.member_list().await }) {
                Ok(v) => v
                    .get("members")
                    .and_then(|m| m.as_array())
                    .into_iter()
                    .flatten()
                    .map(|m| {
                        let urls = m.get("clientURLs").and_then(|u| u.as_array()).into_iter().flatten();
                        let urls = urls
                            .filter_map(|u| u.as_str().map(|s| s.trim_end_matches('/').to_owned()))
                            .collect();
                        (urls, m.get("name").and_then(|n| n.as_str()).unwrap_or_default().to_owned())
                    })
                    .collect(),
                Err(_) => Vec::new(),
            }
        };
        let endpoints = inner.gw.endpoints().to_vec();
        let mut out = Vec::new();
        for (at, endpoint) in endpoints.iter().enumerate() {
            let name = names.iter().find(|(urls, _)| urls.contains(endpoint)).map(|(_, n)| n.clone());
            let gw = inner.gw.clone();
            match inner.io(async move { gw.status_at(at).await }) {
                Ok(v) => {
                    let id = v
                        .get("header")
                        .and_then(|h| h.get("member_id"))
                        .and_then(|x| x.as_str())
                        .unwrap_or_default()
                        .to_owned();
                    let leader = v.get("leader").and_then(|x| x.as_str()).unwrap_or_default();
                    out.push(MemberStatus {
                        endpoint: endpoint.clone(),
                        name,
                        healthy: true,
                        is_raft_leader: !id.is_empty() && id == leader,
                        version: v.get("version").and_then(|x| x.as_str()).map(str::to_owned),
                        db_size_bytes: Some(num(v.get("dbSize"))),
                        error: None,
                    })
                }
                Err(e) => out.push(MemberStatus {
                    endpoint: endpoint.clone(),
                    name,
                    healthy: false,
                    is_raft_leader: false,
                    version: None,
                    db_size_bytes: None,
                    error: Some(e.to_string()),
                }),
            }
        }
        out
    }
}

/// Renews the lease every third of the TTL while leadership is held; gives it up when the
/// lease is gone, the key is no longer this process's, or two thirds of the TTL passed
/// without a renewal.
fn keep_alive(inner: &Inner, held: &Held, ttl: Duration) {
    let key = inner.keys.leader();
    loop {
        thread::sleep(ttl / 3);
        if held.lost.borrow().is_some() || inner.closed.load(Ordering::Relaxed) {
            return;
        }
        let gw = inner.gw.clone();
        let lease = held.lease;
        let sent = monotonic_now();
        let renewed = inner.io(async move { gw.lease_keepalive(lease).await });
        let ours =
            inner.range(key.clone(), None, 1, 0).map(|a| a.kvs.first().map_or(0, |kv| kv.create_revision));
        match (renewed, ours) {
            (Ok(left), Ok(cr)) if left > 0 && cr == held.create_revision => {
                *held.renewed.lock().unwrap_or_else(|p| p.into_inner()) = sent
            }
            (Ok(0), _) => return inner.lose("the leader's lease expired"),
            (_, Ok(cr)) if cr != held.create_revision => {
                return inner.lose("the leader key is no longer this server's")
            }
            (r, o) => {
                let why = r.err().or(o.err()).map_or_else(String::new, |e: GatewayError| e.to_string());
                tracing::warn!(error = %why, "could not renew the leader's lease");
            }
        }
        if !held.renewed_within(ttl) {
            return inner.lose("the leader's lease could not be renewed in time");
        }
    }
}

/// The lease deadline is measured on the machine's monotonic clock, as etcd's own is.
#[allow(clippy::disallowed_methods)]
fn monotonic_now() -> std::time::Instant {
    std::time::Instant::now()
}
