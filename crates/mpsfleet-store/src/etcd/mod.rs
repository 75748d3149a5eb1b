//! `EtcdStore`: the `Store` over etcd v3, for several servers sharing one state.
//!
//! The store keeps its own revision counter in etcd (`P/head`, see [`layout`]), so revisions
//! start at 0 and grow by exactly 1 per effective commit, as on every other backend, whatever
//! else moves etcd's own revision (leases, the election key, other prefixes).
//!
//! - **Commit**: the preconditions are checked against the local replica at revision `H`, then
//!   one etcd transaction puts `P/head = H+1` and the batch's log entry, on condition that
//!   `P/head` is still `H` (and, for a leader, that its election key is still the one it
//!   created). Any number of ops commit atomically: a batch over 1 MiB is written as chunks
//!   first and the log entry points at them. If `P/head` moved, the replica catches up and the
//!   commit is planned again. A commit whose answer never came is
//!   [`StoreError::Indeterminate`]; one refused by the fence is [`StoreError::Fenced`].
//! - **Reads** (`get`, `list`, `revision`) are served from the replica in memory. A server that
//!   did not write a change sees it within [`POLL_INTERVAL`]: a background thread follows the
//!   log, which is what keeps a follower warm.
//! - **Materializing**: a background thread copies committed changes into `P/obj/` in
//!   transactions of at most 100 keys, each conditioned on `P/applied`, so the copy never runs
//!   backwards; loading reads `P/obj/` and replays the log after `P/applied`.
//! - **Compaction**: `compact(before)` records `P/compacted`, deletes the log entries below it
//!   that are materialized, and compacts etcd's own key history up to the revision of the
//!   previous call, so a load in progress is never cut short.

mod election;
mod gateway;
mod layout;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread;
use std::time::Duration;

use crate::watch::RevisionWatch;
use crate::{
    check_no_duplicates, check_not_compacted, page_full, Change, Op, Record, Revision, Store, StoreError,
};

pub use election::{Candidate, LeaderInfo, Leadership, MemberStatus};
pub use gateway::EtcdConfig;
pub use layout::MAX_VALUE_BYTES;

use gateway::{txn_body, Compare, Gateway, GatewayError, Kv, TxnAnswer, TxnOp};
use layout::{decode_obj, decode_stored, encode_obj, encode_pointer, Entry, Keys, Stored};

/// How often the replica looks for changes other servers committed.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Log entries read per request.
const LOG_PAGE: i64 = 64;

/// Object keys read per request when loading.
const LOAD_PAGE: i64 = 2_000;

/// Who may commit through an [`EtcdStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writers {
    /// Any holder: commits are serialized by `P/head` alone.
    Anyone,
    /// Only the elected leader: every commit is also conditioned on its election key.
    Leader,
}

/// The store over etcd. Dropping it stops its background threads.
pub struct EtcdStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    gw: Arc<Gateway>,
    keys: Keys,
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    replica: RwLock<Replica>,
    commit_lock: Mutex<()>,
    watch: RevisionWatch,
    writers: Writers,
    /// The election key's create revision while this process leads.
    fence: Mutex<Option<Arc<election::Held>>>,
    /// Tests only ([`EtcdStore::unfence_for_tests`]): commit as if anyone could.
    unfenced: AtomicBool,
    /// Feed entries below this were compacted (as far as this process knows).
    compacted: AtomicU64,
    /// etcd's revision at the previous compaction: history before it is dropped at the next.
    history_mark: AtomicU64,
    /// Woken after every commit: there is something to materialize.
    pending: (Mutex<bool>, Condvar),
    closed: AtomicBool,
}

/// Every live object, at revision `rev`.
#[derive(Default)]
struct Replica {
    rev: Revision,
    objects: BTreeMap<String, BTreeMap<String, (Revision, Vec<u8>)>>,
}

impl Replica {
    fn version(&self, kind: &str, key: &str) -> Option<Revision> {
        self.objects.get(kind).and_then(|m| m.get(key)).map(|(v, _)| *v)
    }

    fn apply(&mut self, rev: Revision, entry: Entry) {
        for (kind, key, value) in entry {
            match value {
                Some(v) => {
                    self.objects.entry(kind).or_default().insert(key, (rev, v));
                }
                None => {
                    if let Some(m) = self.objects.get_mut(&kind) {
                        m.remove(&key);
                    }
                }
            }
        }
        self.rev = rev;
    }
}

fn backend(op: &'static str) -> impl Fn(GatewayError) -> StoreError {
    move |e| StoreError::Backend { op, message: format!("etcd: {e}") }
}

fn parse_rev(kvs: &[Kv], what: &str) -> Result<Revision, StoreError> {
    match kvs.first() {
        None => Ok(0),
        Some(kv) => std::str::from_utf8(&kv.value).ok().and_then(|s| s.parse().ok()).ok_or_else(|| {
            StoreError::Corrupt {
                kind: "etcd".to_owned(),
                key: what.to_owned(),
                message: "not a revision".to_owned(),
            }
        }),
    }
}

impl EtcdStore {
    /// Connects to etcd, loads the replica and starts following the log.
    pub fn open(config: &EtcdConfig, writers: Writers) -> Result<EtcdStore, StoreError> {
        let bad = |message: String| StoreError::Backend { op: "open", message };
        let keys = Keys::new(&config.prefix).map_err(bad)?;
        let gw = Gateway::new(config).map_err(bad)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("etcd-store")
            .enable_all()
            .build()
            .map_err(|e| bad(format!("cannot start the etcd client's runtime: {e}")))?;
        let inner = Arc::new(Inner {
            gw: Arc::new(gw),
            keys,
            handle: rt.handle().clone(),
            rt: Mutex::new(Some(rt)),
            replica: RwLock::new(Replica::default()),
            commit_lock: Mutex::new(()),
            watch: RevisionWatch::new(0),
            writers,
            fence: Mutex::new(None),
            unfenced: AtomicBool::new(false),
            compacted: AtomicU64::new(0),
            history_mark: AtomicU64::new(0),
            pending: (Mutex::new(true), Condvar::new()),
            closed: AtomicBool::new(false),
        });
        inner.reload()?;
        for (name, job) in
            [("etcd-follow", Inner::follow as fn(&Inner)), ("etcd-materialize", Inner::materialize_loop)]
        {
            let me = inner.clone();
            thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || job(&me))
                .map_err(|e| bad(format!("cannot start the {name} thread: {e}")))?;
        }
        Ok(EtcdStore { inner })
    }

    /// The etcd endpoints this store talks to.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner.gw.endpoints().to_vec()
    }

    /// **Breaks the store's safety, for tests that must see it broken**: from now on commits
    /// carry no fence (neither the leader-key condition nor the check that this process still
    /// leads), so a deposed leader commits. Only the nemesis test's check that its checker can
    /// fail uses it, through a server flag refused outside debug builds and without
    /// `MPSFLEET_ALLOW_UNFENCED=1`.
    pub fn unfence_for_tests(&self) {
        tracing::error!(
            "this store commits without its fence: a deposed leader's writes are kept (a test switch)"
        );
        self.inner.unfenced.store(true, Ordering::Relaxed);
    }

    /// Whether [`EtcdStore::unfence_for_tests`] was called.
    pub fn is_unfenced(&self) -> bool {
        self.inner.unfenced.load(Ordering::Relaxed)
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        self.inner.pending.1.notify_all();
        if let Some(held) = self.inner.fence.lock().unwrap_or_else(|p| p.into_inner()).take() {
            held.lose("the store was closed");
        }
        if let Some(rt) = self.inner.rt.lock().unwrap_or_else(|p| p.into_inner()).take() {
            rt.shutdown_background();
        }
    }
}

impl Inner {
    /// Runs one etcd request on the store's runtime and waits for it on this thread.
    fn io<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T, GatewayError>> + Send + 'static,
    ) -> Result<T, GatewayError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().unwrap_or_else(|_| Err(GatewayError::NotSent("the etcd store is closed".to_owned())))
    }

    fn txn(&self, body: serde_json::Value) -> Result<TxnAnswer, GatewayError> {
        let gw = self.gw.clone();
        self.io(async move { gw.txn(body).await })
    }

    fn range(
        &self,
        key: String,
        end: Option<String>,
        limit: i64,
        at: i64,
    ) -> Result<gateway::RangeAnswer, GatewayError> {
        let gw = self.gw.clone();
        self.io(async move { gw.range(key, end, limit, at).await })
    }

    /// The changes of log entry `rev` whose log key holds `value`, reading its chunks (as of
    /// etcd revision `at`, 0: the latest) if it has any.
    fn resolve(&self, rev: Revision, value: &[u8], at: i64) -> Result<Entry, StoreError> {
        match decode_stored(rev, value)? {
            Stored::Inline(entry) => Ok(entry),
            Stored::Chunked { nonce, chunks } => {
                let mut bytes = Vec::new();
                for i in 0..chunks {
                    let a = self
                        .range(self.keys.chunk(rev, &nonce, i), None, 1, at)
                        .map_err(backend("read a chunk"))?;
                    let kv = a.kvs.into_iter().next().ok_or_else(|| StoreError::Corrupt {
                        kind: "log".to_owned(),
                        key: rev.to_string(),
                        message: format!("chunk {i} of {chunks} is missing"),
                    })?;
                    bytes.extend_from_slice(&kv.value);
                }
                match decode_stored(rev, &bytes)? {
                    Stored::Inline(entry) => Ok(entry),
                    Stored::Chunked { .. } => Err(StoreError::Corrupt {
                        kind: "log".to_owned(),
                        key: rev.to_string(),
                        message: "chunks point at more chunks".to_owned(),
                    }),
                }
            }
        }
    }

    /// Loads the whole replica afresh, as of one etcd revision.
    fn reload(&self) -> Result<(), StoreError> {
        let k = &self.keys;
        let a = self
            .txn(txn_body(
                &[],
                &[
                    TxnOp::Get { key: &k.head() },
                    TxnOp::Get { key: &k.applied() },
                    TxnOp::Get { key: &k.compacted() },
                ],
                &[],
            ))
            .map_err(backend("load"))?;
        let at = a.revision;
        let head = parse_rev(&a.ranges[0], "head")?;
        let applied = parse_rev(&a.ranges[1], "applied")?;
        let compacted = parse_rev(&a.ranges[2], "compacted")?;
        let mut replica = Replica::default();
        let (mut from, end) = k.objects();
        loop {
            let page = self
                .range(from.clone(), Some(end.clone()), LOAD_PAGE, at)
                .map_err(backend("load objects"))?;
            for kv in &page.kvs {
                let (kind, key) = k.obj_name(&kv.key).ok_or_else(|| corrupt_key(&kv.key))?;
                let (version, value) = decode_obj(&kv.value).ok_or_else(|| corrupt_key(&kv.key))?;
                replica.objects.entry(kind.to_owned()).or_default().insert(key.to_owned(), (version, value));
            }
            match (page.more, page.kvs.last()) {
                (true, Some(last)) => from = format!("{}\0", last.key),
                _ => break,
            }
        }
        replica.rev = applied;
        let mut next = applied + 1;
        while next <= head {
            let page =
                self.range(k.log(next), Some(k.log_end()), LOG_PAGE, at).map_err(backend("load the log"))?;
            for kv in &page.kvs {
                let r = k.log_revision(&kv.key).ok_or_else(|| corrupt_key(&kv.key))?;
                if r != next {
                    return Err(StoreError::Corrupt {
                        kind: "log".to_owned(),
                        key: next.to_string(),
                        message: format!("missing, the next entry is {r}"),
                    });
                }
                let entry = self.resolve(r, &kv.value, at)?;
                replica.apply(r, entry);
                next += 1;
            }
            if page.kvs.is_empty() {
                return Err(StoreError::Corrupt {
                    kind: "log".to_owned(),
                    key: next.to_string(),
                    message: format!("missing; the head is at {head}"),
                });
            }
        }
        replica.rev = head;
        self.compacted.fetch_max(compacted, Ordering::Relaxed);
        let mut current = self.replica.write().map_err(|_| crate::watch::poisoned("load"))?;
        if replica.rev >= current.rev {
            *current = replica;
        }
        let rev = current.rev;
        drop(current);
        self.watch.publish(rev);
        Ok(())
    }

    /// Applies the log entries other writers committed since the replica's revision.
    fn catch_up(&self) -> Result<(), StoreError> {
        let k = &self.keys;
        loop {
            let from = self.replica.read().map_err(|_| crate::watch::poisoned("catch up"))?.rev + 1;
            let log = k.log(from);
            let end = k.log_end();
            let a = self
                .txn(txn_body(
                    &[],
                    &[
                        TxnOp::Get { key: &k.head() },
                        TxnOp::Range { key: &log, range_end: &end, limit: LOG_PAGE },
                    ],
                    &[],
                ))
                .map_err(backend("follow the log"))?;
            let head = parse_rev(&a.ranges[0], "head")?;
            let entries = &a.ranges[1];
            if entries.is_empty() {
                // The head moved but its entries are gone: compacted while this replica was away.
                return if head >= from { self.reload() } else { Ok(()) };
            }
            for kv in entries {
                let r = k.log_revision(&kv.key).ok_or_else(|| corrupt_key(&kv.key))?;
                let entry = self.resolve(r, &kv.value, 0)?;
                let mut rep = self.replica.write().map_err(|_| crate::watch::poisoned("catch up"))?;
                if r <= rep.rev {
                    continue;
                }
                if r != rep.rev + 1 {
                    drop(rep);
                    return self.reload();
                }
                rep.apply(r, entry);
                drop(rep);
                self.watch.publish(r);
            }
            if (entries.len() as i64) < LOG_PAGE {
                return Ok(());
            }
        }
    }

    /// The follower loop: catch up every [`POLL_INTERVAL`] until closed.
    fn follow(&self) {
        while !self.closed.load(Ordering::Relaxed) {
            thread::sleep(POLL_INTERVAL);
            if let Err(e) = self.catch_up() {
                tracing::warn!(error = %e, "could not follow the etcd log; retrying");
                thread::sleep(Duration::from_secs(1));
            }
        }
    }

    fn materialize_loop(&self) {
        while !self.closed.load(Ordering::Relaxed) {
            {
                let (flag, cv) = &self.pending;
                let mut p = flag.lock().unwrap_or_else(|e| e.into_inner());
                if !*p {
                    p = cv.wait_timeout(p, Duration::from_secs(1)).unwrap_or_else(|e| e.into_inner()).0;
                }
                *p = false;
            }
            if self.writers == Writers::Leader && self.current_fence().is_none() {
                continue;
            }
            if let Err(e) = self.materialize() {
                tracing::warn!(error = %e, "could not copy committed changes into etcd's object keys; retrying");
                thread::sleep(Duration::from_secs(1));
            }
        }
    }

    /// Copies every log entry after `P/applied` into the object keys, and deletes the log
    /// entries that are both materialized and compacted.
    fn materialize(&self) -> Result<(), StoreError> {
        let k = &self.keys;
        loop {
            let a = self
                .txn(txn_body(
                    &[],
                    &[TxnOp::Get { key: &k.applied() }, TxnOp::Get { key: &k.compacted() }],
                    &[],
                ))
                .map_err(backend("materialize"))?;
            let mut applied = parse_rev(&a.ranges[0], "applied")?;
            let compacted = parse_rev(&a.ranges[1], "compacted")?.max(self.compacted.load(Ordering::Relaxed));
            let page = self
                .range(k.log(applied + 1), Some(k.log_end()), LOG_PAGE, 0)
                .map_err(backend("materialize"))?;
            if page.kvs.is_empty() {
                return Ok(());
            }
            for kv in &page.kvs {
                let r = k.log_revision(&kv.key).ok_or_else(|| corrupt_key(&kv.key))?;
                if r != applied + 1 {
                    return Err(StoreError::Corrupt {
                        kind: "log".to_owned(),
                        key: (applied + 1).to_string(),
                        message: "missing".to_owned(),
                    });
                }
                let entry = self.resolve(r, &kv.value, 0)?;
                if !self.copy_entry(applied, r, &entry, compacted)? {
                    break; // another writer moved `P/applied`: start again from where it is
                }
                applied = r;
            }
        }
    }

    /// Writes entry `r`'s changes to the object keys, the last group with `P/applied = r`. All
    /// groups are conditioned on `P/applied` still being `applied`. False when it was not.
    fn copy_entry(
        &self,
        applied: Revision,
        r: Revision,
        entry: &Entry,
        compacted: Revision,
    ) -> Result<bool, StoreError> {
        let k = &self.keys;
        let applied_key = k.applied();
        let applied_text = applied.to_string();
        let cmp = if applied == 0 {
            Compare::CreateRevision(&applied_key, 0)
        } else {
            Compare::Value(&applied_key, applied_text.as_bytes())
        };
        let mut groups: Vec<&[layout::Change]> = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, (_, _, v)) in entry.iter().enumerate() {
            let size = v.as_ref().map_or(0, Vec::len) + 64;
            if i > start && (i - start >= layout::OBJ_OPS_PER_TXN || bytes + size > layout::CHUNK_BYTES) {
                groups.push(&entry[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += size;
        }
        groups.push(&entry[start..]);
        let prune_below = compacted.min(r + 1);
        let log_start = k.log(0);
        let log_below = k.log(prune_below);
        let (chunk_start, chunk_below) = k.chunks_below(prune_below);
        let r_text = r.to_string();
        for (g, group) in groups.iter().enumerate() {
            let names: Vec<String> = group.iter().map(|(kind, key, _)| k.obj(kind, key)).collect();
            let values: Vec<Option<Vec<u8>>> =
                group.iter().map(|(_, _, v)| v.as_ref().map(|v| encode_obj(r, v))).collect();
            let mut ops: Vec<TxnOp> = names
                .iter()
                .zip(&values)
                .map(|(name, v)| match v {
                    Some(v) => TxnOp::Put { key: name, value: v, lease: 0 },
                    None => TxnOp::Delete { key: name, range_end: None },
                })
                .collect();
            if g + 1 == groups.len() {
                ops.push(TxnOp::Put { key: &applied_key, value: r_text.as_bytes(), lease: 0 });
                if prune_below > 1 {
                    ops.push(TxnOp::Delete { key: &log_start, range_end: Some(&log_below) });
                    ops.push(TxnOp::Delete { key: &chunk_start, range_end: Some(&chunk_below) });
                }
            }
            let a = self.txn(txn_body(&[cmp], &ops, &[])).map_err(backend("materialize"))?;
            if !a.succeeded {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn current_fence(&self) -> Option<Arc<election::Held>> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Gives up leadership (if held): commits are refused from now on.
    fn lose(&self, reason: &str) {
        if let Some(held) = self.fence.lock().unwrap_or_else(|p| p.into_inner()).take() {
            held.lose(reason);
        }
    }

    /// Checks `ops` against the replica: its revision and the changes they make.
    fn plan(&self, ops: &[Op]) -> Result<(Revision, Entry), StoreError> {
        let rep = self.replica.read().map_err(|_| crate::watch::poisoned("commit"))?;
        let mut entry = Vec::with_capacity(ops.len());
        for op in ops {
            let actual = rep.version(op.kind(), op.key());
            if !op.expect().holds(actual) {
                return Err(StoreError::Conflict {
                    kind: op.kind().to_owned(),
                    key: op.key().to_owned(),
                    expected: op.expect(),
                    actual,
                });
            }
            match op {
                Op::Put { kind, key, value, .. } => {
                    entry.push((kind.clone(), key.clone(), Some(value.clone())))
                }
                Op::Delete { kind, key, .. } if actual.is_some() => {
                    entry.push((kind.clone(), key.clone(), None))
                }
                Op::Delete { .. } => {}
            }
        }
        Ok((rep.rev, entry))
    }

    /// Writes an encoded entry too large for one request as chunks; the pointer to log instead.
    fn write_chunks(
        &self,
        rev: Revision,
        encoded: &[u8],
        fence: Option<&election::Held>,
    ) -> Result<Vec<u8>, StoreError> {
        let nonce = nonce();
        let leader = self.keys.leader();
        let pieces: Vec<&[u8]> = encoded.chunks(layout::CHUNK_BYTES).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let key = self.keys.chunk(rev, &nonce, i as u32);
            let cmp: Vec<Compare> =
                fence.map(|f| Compare::CreateRevision(&leader, f.create_revision)).into_iter().collect();
            let a = self
                .txn(txn_body(&cmp, &[TxnOp::Put { key: &key, value: piece, lease: 0 }], &[]))
                .map_err(backend("commit"))?;
            if !a.succeeded {
                self.lose("another server was elected leader");
                return Err(StoreError::Fenced { message: "another server was elected leader".to_owned() });
            }
        }
        Ok(encode_pointer(&nonce, pieces.len() as u32))
    }

    fn commit(&self, ops: &[Op]) -> Result<Revision, StoreError> {
        check_no_duplicates(ops)?;
        for op in ops {
            check_name(op)?;
        }
        let _one_at_a_time = self.commit_lock.lock().map_err(|_| crate::watch::poisoned("commit"))?;
        let k = &self.keys;
        let (head, leader) = (k.head(), k.leader());
        let mut caught_up = false;
        for _ in 0..32 {
            let fence = match (self.writers, self.current_fence()) {
                _ if self.unfenced.load(Ordering::Relaxed) => None,
                (Writers::Leader, None) => {
                    return Err(StoreError::Fenced { message: "this server is not the leader".to_owned() })
                }
                (_, f) => f,
            };
            let (base, entry) = match self.plan(ops) {
                Ok(p) => p,
                Err(StoreError::Conflict { .. }) if !caught_up => {
                    // The replica may be behind another writer's commit: judge on fresh state.
                    self.catch_up()?;
                    caught_up = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if entry.is_empty() {
                return Ok(base);
            }
            let new = base + 1;
            let encoded = layout::encode_entry_compressed(&entry);
            let stored = if encoded.len() > layout::CHUNK_BYTES {
                self.write_chunks(new, &encoded, fence.as_deref())?
            } else {
                encoded
            };
            let (base_text, new_text, log) = (base.to_string(), new.to_string(), k.log(new));
            let mut cmp = vec![if base == 0 {
                Compare::CreateRevision(&head, 0)
            } else {
                Compare::Value(&head, base_text.as_bytes())
            }];
            if let Some(f) = &fence {
                cmp.push(Compare::CreateRevision(&leader, f.create_revision));
            }
            let success = [
                TxnOp::Put { key: &head, value: new_text.as_bytes(), lease: 0 },
                TxnOp::Put { key: &log, value: &stored, lease: 0 },
            ];
            let failure = [TxnOp::Get { key: &leader }];
            match self.txn(txn_body(&cmp, &success, &failure)) {
                Ok(a) if a.succeeded => {
                    let mut rep = self.replica.write().map_err(|_| crate::watch::poisoned("commit"))?;
                    if rep.rev < new {
                        rep.apply(new, entry);
                    }
                    drop(rep);
                    self.watch.publish(new);
                    *self.pending.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    self.pending.1.notify_all();
                    return Ok(new);
                }
                Ok(a) => {
                    if let Some(f) = &fence {
                        let now =
                            a.ranges.first().and_then(|kvs| kvs.first()).map_or(0, |kv| kv.create_revision);
                        if now != f.create_revision {
                            self.lose("another server was elected leader");
                            return Err(StoreError::Fenced {
                                message: "another server was elected leader".to_owned(),
                            });
                        }
                    }
                    self.catch_up()?;
                    caught_up = true;
                }
                Err(GatewayError::Unknown(why)) => {
                    self.lose("a commit's outcome is unknown");
                    return Err(StoreError::Indeterminate { op: "commit", message: format!("etcd: {why}") });
                }
                Err(e) => return Err(backend("commit")(e)),
            }
        }
        Err(StoreError::Backend {
            op: "commit",
            message: "other writers kept committing first; retry".to_owned(),
        })
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Vec<Change>, StoreError> {
        let k = &self.keys;
        let mut out: Vec<Change> = Vec::new();
        let mut next = after + 1;
        loop {
            let (log, end, compacted) = (k.log(next), k.log_end(), k.compacted());
            let a = self
                .txn(txn_body(
                    &[],
                    &[
                        TxnOp::Get { key: &compacted },
                        TxnOp::Range { key: &log, range_end: &end, limit: LOG_PAGE },
                    ],
                    &[],
                ))
                .map_err(backend("read the change feed"))?;
            let stored = parse_rev(&a.ranges[0], "compacted")?;
            let compacted = self.compacted.fetch_max(stored, Ordering::Relaxed).max(stored);
            check_not_compacted(after, compacted)?;
            if limit == 0 {
                return Ok(out);
            }
            let entries = &a.ranges[1];
            for kv in entries {
                let r = k.log_revision(&kv.key).ok_or_else(|| corrupt_key(&kv.key))?;
                if r != next {
                    return Err(StoreError::Compacted { requested: after, oldest: r });
                }
                if page_full(out.len(), limit, out.last().map(|c| c.revision), r) {
                    return Ok(out);
                }
                out.extend(layout::changes_of(r, self.resolve(r, &kv.value, 0)?));
                next = r + 1;
            }
            if (entries.len() as i64) < LOG_PAGE {
                return Ok(out);
            }
        }
    }

    fn compact(&self, before: Revision) -> Result<(), StoreError> {
        let rev = self.replica.read().map_err(|_| crate::watch::poisoned("compact"))?.rev;
        let before = before.min(rev + 1);
        if before <= self.compacted.load(Ordering::Relaxed) {
            return Ok(());
        }
        let k = &self.keys;
        let (key, leader, text) = (k.compacted(), k.leader(), before.to_string());
        let fence = self.current_fence();
        if self.writers == Writers::Leader && fence.is_none() {
            return Err(StoreError::Fenced { message: "this server is not the leader".to_owned() });
        }
        let cmp: Vec<Compare> =
            fence.iter().map(|f| Compare::CreateRevision(&leader, f.create_revision)).collect();
        let a = self
            .txn(txn_body(&cmp, &[TxnOp::Put { key: &key, value: text.as_bytes(), lease: 0 }], &[]))
            .map_err(backend("compact"))?;
        if !a.succeeded {
            self.lose("another server was elected leader");
            return Err(StoreError::Fenced { message: "another server was elected leader".to_owned() });
        }
        self.compacted.fetch_max(before, Ordering::Relaxed);
        // Delete what is both compacted and materialized; the materializer does the rest.
        let applied =
            parse_rev(&self.range(k.applied(), None, 1, 0).map_err(backend("compact"))?.kvs, "applied")?;
        let below = before.min(applied + 1);
        if below > 1 {
            let (log_start, log_below) = (k.log(0), k.log(below));
            let (chunk_start, chunk_below) = k.chunks_below(below);
            self.txn(txn_body(
                &cmp,
                &[
                    TxnOp::Delete { key: &log_start, range_end: Some(&log_below) },
                    TxnOp::Delete { key: &chunk_start, range_end: Some(&chunk_below) },
                ],
                &[],
            ))
            .map_err(backend("compact"))?;
        }
        // etcd keeps every version of every key until its own history is compacted. Compact it up
        // to where it was at the previous call, so a load reading at a recent revision finishes.
        let previous = self.history_mark.swap(a.revision as u64, Ordering::Relaxed);
        if previous > 0 {
            let gw = self.gw.clone();
            self.io(async move { gw.compact_history(previous as i64).await })
                .map_err(backend("compact etcd's history"))?;
        }
        Ok(())
    }
}

fn corrupt_key(key: &str) -> StoreError {
    StoreError::Corrupt {
        kind: "etcd".to_owned(),
        key: key.to_owned(),
        message: "unexpected key or value layout".to_owned(),
    }
}

/// Kinds name a key segment: they may not be empty or hold `/`. Values must fit one request.
fn check_name(op: &Op) -> Result<(), StoreError> {
    if op.kind().is_empty() || op.kind().contains('/') {
        return Err(StoreError::Encode {
            kind: op.kind().to_owned(),
            key: op.key().to_owned(),
            message: "an object kind may not be empty or contain '/' on etcd".to_owned(),
        });
    }
    if let Op::Put { value, .. } = op {
        if value.len() > MAX_VALUE_BYTES {
            return Err(StoreError::Encode {
                kind: op.kind().to_owned(),
                key: op.key().to_owned(),
                message: format!(
                    "the value is {} bytes; etcd objects hold at most {MAX_VALUE_BYTES}",
                    value.len()
                ),
            });
        }
    }
    Ok(())
}

/// A random name for one attempt's chunks.
fn nonce() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Store for EtcdStore {
    fn get(&self, kind: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let rep = self.inner.replica.read().map_err(|_| crate::watch::poisoned("get"))?;
        Ok(rep.objects.get(kind).and_then(|m| m.get(key)).map(|(version, value)| Record {
            kind: kind.to_owned(),
            key: key.to_owned(),
            value: value.clone(),
            version: *version,
        }))
    }

    fn list(&self, kind: &str) -> Result<Vec<Record>, StoreError> {
        let rep = self.inner.replica.read().map_err(|_| crate::watch::poisoned("list"))?;
        Ok(rep
            .objects
            .get(kind)
            .into_iter()
            .flatten()
            .map(|(key, (version, value))| Record {
                kind: kind.to_owned(),
                key: key.clone(),
                value: value.clone(),
                version: *version,
            })
            .collect())
    }

    fn commit(&self, ops: &[Op]) -> Result<Revision, StoreError> {
        self.inner.commit(ops)
    }

    fn revision(&self) -> Result<Revision, StoreError> {
        Ok(self.inner.replica.read().map_err(|_| crate::watch::poisoned("revision"))?.rev)
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Vec<Change>, StoreError> {
        self.inner.changes_since(after, limit)
    }

    fn wait_for_revision(&self, after: Revision, timeout: Duration) -> Result<Revision, StoreError> {
        Ok(self.inner.watch.wait(after, timeout))
    }

    fn compact(&self, before: Revision) -> Result<(), StoreError> {
        self.inner.compact(before)
    }
}

/// What [`probe_write_rate`] measured: etcd's own write rate through this store's client, with
/// none of the store's work around it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WriteRate {
    pub clients: usize,
    pub puts_per_txn: usize,
    pub value_bytes: usize,
    pub txns_per_sec: f64,
    pub keys_per_sec: f64,
    pub mb_per_sec: f64,
}

/// Measures etcd's raw write rate: `clients` concurrent writers each sending transactions of
/// `puts_per_txn` puts of `value_bytes` under `<prefix>/probe/` for `duration`, which are
/// deleted afterwards. For benchmarks, to put the store's figures next to etcd's.
#[allow(clippy::disallowed_methods)] // a benchmark measures wall time
pub fn probe_write_rate(
    config: &EtcdConfig,
    clients: usize,
    puts_per_txn: usize,
    value_bytes: usize,
    duration: Duration,
) -> Result<WriteRate, StoreError> {
    let bad = |message: String| StoreError::Backend { op: "probe", message };
    let keys = Keys::new(&config.prefix).map_err(bad)?;
    let gw = Arc::new(Gateway::new(config).map_err(bad)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| bad(e.to_string()))?;
    let base = format!("{}/probe/", keys.head().trim_end_matches("head"));
    let value = vec![b'v'; value_bytes];
    let started = std::time::Instant::now();
    let txns = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (gw, base, value) = (gw.clone(), base.clone(), value.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                let names: Vec<String> = (0..puts_per_txn).map(|i| format!("{base}{c:03}/{i:05}")).collect();
                while started.elapsed() < duration {
                    let ops: Vec<TxnOp> =
                        names.iter().map(|k| TxnOp::Put { key: k, value: &value, lease: 0 }).collect();
                    gw.txn(txn_body(&[], &ops, &[])).await?;
                    n += 1;
                }
                Ok::<u64, GatewayError>(n)
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.map_err(|e| GatewayError::NotSent(e.to_string()))??;
        }
        let end = format!("{}0", base.trim_end_matches('/'));
        gw.txn(txn_body(&[], &[TxnOp::Delete { key: &base, range_end: Some(&end) }], &[])).await?;
        Ok::<u64, GatewayError>(total)
    });
    let secs = started.elapsed().as_secs_f64();
    rt.shutdown_background();
    let txns = txns.map_err(backend("probe"))? as f64;
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Ok(WriteRate {
        clients,
        puts_per_txn,
        value_bytes,
        txns_per_sec: round(txns / secs),
        keys_per_sec: round(txns * puts_per_txn as f64 / secs),
        mb_per_sec: round(txns * (puts_per_txn * value_bytes) as f64 / secs / 1e6),
    })
}
