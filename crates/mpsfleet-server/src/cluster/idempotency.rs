//! Client tokens: `task run`, `service create` and `service update` accept one (`clientToken`,
//! as ECS's RunTask and CreateService do), so that a client that does not know whether its
//! call went through (a timeout, a lost connection, a server that failed over) can send it
//! again and get the first call's answer instead of a second change.
//! The operations are `Cluster`'s, in `mod.rs` (`Cluster::idempotent`), `workloads.rs` and
//! `services.rs`; what they share is here.
//!
//! A token is scoped to its caller (the token id or `admin`) and route. The first call with it
//! stores a record in the same store commit as its change (the audit entry's way, see
//! `ServedCall::riders`): the request's SHA-256 and how to answer it again (the tag its tasks
//! were started with, or the service's name). A retry with the same request gets the answer
//! built from the current state (the tasks as they are now; the service as it is now); the same
//! token with another request is refused (409). A call that fails commits nothing, its token
//! included, so its retry runs afresh.
//!
//! Records are kept for [`CLIENT_TOKEN_TTL_MS`], at most [`MAX_CLIENT_TOKENS`]: the oldest go
//! first, deleted in the commits of new ones (at most [`PRUNE_PER_COMMIT`] each, so that a
//! commit stays small).

use super::*;
use std::collections::VecDeque;

/// Store kind of the client token records, keyed by the SHA-256 of caller, route and token.
pub(super) const CLIENT_TOKEN: &str = "client-token";
/// How long a client token is remembered.
pub const CLIENT_TOKEN_TTL_MS: u64 = 24 * 3600 * 1000;
/// The most client tokens remembered.
pub const MAX_CLIENT_TOKENS: usize = 100_000;
/// The longest client token (ECS allows 64 characters for RunTask).
pub const MAX_CLIENT_TOKEN_LEN: usize = 64;
/// The most old records one commit deletes.
pub(super) const PRUNE_PER_COMMIT: usize = 16;

/// How a call with a client token is answered again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub(super) enum Replay {
    /// The tasks started with this `startedBy` tag.
    Tasks { started_by: String },
    /// The service of this name, in this pool (one of the name made since in another pool is
    /// not the one the token's call was about).
    Service { name: String, pool: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ClientTokenRecord {
    pub(super) request_sha256: String,
    pub(super) replay: Replay,
    pub(super) created_at_ms: u64,
}

/// The records, oldest first (the one the call being served will commit is the call's,
/// `call.rs`).
#[derive(Debug, Default)]
pub(super) struct ClientTokens {
    pub(super) by_key: HashMap<String, ClientTokenRecord>,
    pub(super) order: VecDeque<(u64, String)>,
}

impl ClientTokens {
    /// A record committed, with the oldest ones its commit deleted (`pruned`, the queue's
    /// first ones). Called by `State::apply` only.
    pub(super) fn put(&mut self, key: String, rec: ClientTokenRecord, pruned: Vec<String>) {
        for k in pruned {
            self.order.pop_front();
            if k != key {
                self.by_key.remove(&k);
            }
        }
        // A key past its time claimed again, beyond this commit's pruning: its old place goes
        // (rare, so the scan is fine).
        if self.by_key.contains_key(&key) && self.order.iter().any(|(_, k)| *k == key) {
            self.order.retain(|(_, k)| *k != key);
        }
        self.order.push_back((rec.created_at_ms, key.clone()));
        self.by_key.insert(key, rec);
    }

    /// The records, oldest first.
    pub(super) fn order(&self) -> &VecDeque<(u64, String)> {
        &self.order
    }
}

/// What to do with a call that carries a client token.
pub(super) enum Claim {
    /// A first call: go on; its first commit stores the token.
    First,
    /// A retry of an earlier call: answer it as this says.
    Retry(Replay),
}

/// A replay of another kind than its route's: the route is part of the token's key, so this
/// would be a corrupt record.
pub(super) fn mismatched() -> Error {
    Error::StoreCorrupt("a client token's record answers for another kind of call".into())
}

pub(super) fn check_token(token: &str) -> Result<(), Error> {
    if token.is_empty() || token.len() > MAX_CLIENT_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(Error::invalid(
            "clientToken",
            format!("must be 1 to {MAX_CLIENT_TOKEN_LEN} printable ASCII characters, without spaces"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_core::clock::ManualClock;
    use std::time::Duration;

    fn cluster() -> (Cluster, Arc<dyn mpsfleet_store::Store>, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
        c.create_pool(CreatePool { name: "gpu".into(), ..Default::default() }).unwrap();
        let td = br#"{"family": "t", "containerDefinitions": [{"name": "c", "image": "x", "command": ["sleep", "1"]}]}"#;
        c.register_taskdef(td).unwrap();
        (c, store, clock)
    }

    fn run(count: u32, token: &str) -> RunTask {
        RunTask {
            task_definition: "t".into(),
            count,
            pool: "gpu".into(),
            client_token: Some(token.into()),
            ..Default::default()
        }
    }

    fn ids(out: &RunOutcome) -> Vec<String> {
        out.tasks.iter().map(|t| t.id.to_string()).collect()
    }

    #[test]
    fn a_retry_gets_the_first_answer_and_another_request_with_the_token_is_refused() {
        let (mut c, store, clock) = cluster();
        let first = c.run_tasks_as(run(2, "abc"), "admin").unwrap();
        let again = c.run_tasks_as(run(2, "abc"), "admin").unwrap();
        assert_eq!(ids(&first), ids(&again));
        assert_eq!(c.tasks(&TaskFilter { limit: 100, ..Default::default() }).len(), 2);
        let e = c.run_tasks_as(run(3, "abc"), "admin").unwrap_err();
        assert!(matches!(e, Error::Conflict(_)), "{e}");
        // Another caller's token of the same name is its own.
        let theirs = c.run_tasks_as(run(2, "abc"), "token:tok-1").unwrap();
        assert_ne!(ids(&theirs), ids(&first));
        // A call that fails commits nothing, its token included.
        let bad = RunTask { task_definition: "nope".into(), ..run(1, "later") };
        assert!(c.run_tasks_as(bad, "admin").is_err());
        assert_eq!(c.run_tasks_as(run(1, "later"), "admin").unwrap().tasks.len(), 1);
        // Kept across a restart, and forgotten after its time, in the commit of a new one.
        let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
        assert_eq!(ids(&c.run_tasks_as(run(2, "abc"), "admin").unwrap()), ids(&first));
        assert_eq!(c.read().client_token_count(), 3);
        clock.advance(Duration::from_millis(CLIENT_TOKEN_TTL_MS));
        let fresh = c.run_tasks_as(run(2, "abc"), "admin").unwrap();
        assert_ne!(ids(&fresh), ids(&first), "past its time, the token is new again");
        assert_eq!(c.read().client_token_count(), 1, "the expired ones went with the new one's commit");
        assert_eq!(store.list(CLIENT_TOKEN).unwrap().len(), 1);
        // What a token may be.
        for bad in ["", "has space", &"x".repeat(MAX_CLIENT_TOKEN_LEN + 1)] {
            let e = c.run_tasks_as(run(1, bad), "admin").unwrap_err();
            assert!(matches!(&e, Error::InvalidParameter { field, .. } if field == "clientToken"), "{e}");
        }
    }

    #[test]
    fn a_service_created_twice_with_one_token_is_created_once() {
        let (mut c, _store, _clock) = cluster();
        let req = |desired| CreateService {
            name: "web".into(),
            pool: "gpu".into(),
            task_definition: "t".into(),
            desired_count: desired,
            resumption: None,
            deployment_configuration: None,
            client_token: Some("svc-1".into()),
            ..Default::default()
        };
        let first = c.create_service_as(req(0), "admin").unwrap();
        assert_eq!(c.create_service_as(req(0), "admin").unwrap(), first);
        assert!(matches!(c.create_service_as(req(1), "admin").unwrap_err(), Error::Conflict(_)));
        let without = CreateService { client_token: None, ..req(0) };
        assert!(matches!(c.create_service_as(without, "admin").unwrap_err(), Error::AlreadyExists { .. }));
        let update = |d| UpdateService {
            desired_count: Some(d),
            client_token: Some("u-1".into()),
            ..Default::default()
        };
        assert_eq!(c.update_service_as("web", update(2), "admin").unwrap().service.desired_count, 2);
        c.update_service("web", UpdateService { desired_count: Some(5), ..Default::default() }).unwrap();
        // The retry answers the service as it is now, and changes nothing.
        assert_eq!(c.update_service_as("web", update(2), "admin").unwrap().service.desired_count, 5);
    }
}
