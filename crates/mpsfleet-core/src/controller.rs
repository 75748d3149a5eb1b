//! The keyed work queue the server's controllers run on, in kube-runtime's shape.
//!
//! A controller reconciles one key (a service, a pool, an incident) at a time against the
//! state, and says when it wants to run again ([`Action`]); a failed reconcile backs off per
//! key. The queue holds no objects, only keys and times (milliseconds on the caller's clock:
//! the server's wall clock, or the simulator's virtual one), so the same queue drives both.
//!
//! Its properties:
//! - a key is never handed out twice at once: a key taken by [`WorkQueue::take_due`] is running
//!   until [`WorkQueue::finish`], and is not handed out again before that, even if asked for;
//! - requests for a queued key merge: the key runs once, at the earliest time asked for;
//! - a key can be debounced ([`WorkQueue::debounce`]): it runs after a quiet interval with no
//!   further request, but no later than a maximum delay after the first one;
//! - a failed reconcile runs again after a per-key backoff that doubles up to a ceiling and
//!   starts over after a success;
//! - the periodic resync is the caller's: it asks for every key it knows.

use crate::backoff::Backoff;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// What a reconcile wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run again after this many milliseconds (or earlier, if asked for).
    RequeueAfter(u64),
    /// Nothing to do until something asks for the key again (or the resync does).
    AwaitChange,
}

/// The first delay after a failed reconcile; it doubles per failure up to [`ERROR_BACKOFF_MAX_MS`].
pub const ERROR_BACKOFF_FIRST_MS: u64 = 250;
/// The longest a failing key waits between tries.
pub const ERROR_BACKOFF_MAX_MS: u64 = 30_000;

#[derive(Debug, Clone, Copy)]
struct Queued {
    due: u64,
    /// When the debounced requests began (for the maximum delay); `None` when not debounced.
    debounce_since: Option<u64>,
}

/// Keys waiting to be reconciled, keys running, and each failing key's backoff (module docs).
#[derive(Debug)]
pub struct WorkQueue<K: Ord + Clone> {
    queued: BTreeMap<K, Queued>,
    /// The queued keys by due time: the next due is the first.
    by_due: BTreeSet<(u64, K)>,
    running: BTreeSet<K>,
    /// Asked for while running: queued again when it finishes, at this time.
    asked_while_running: BTreeMap<K, u64>,
    failing: BTreeMap<K, Backoff>,
}

impl<K: Ord + Clone> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            queued: BTreeMap::new(),
            by_due: BTreeSet::new(),
            running: BTreeSet::new(),
            asked_while_running: BTreeMap::new(),
            failing: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> WorkQueue<K> {
    /// Asks for `key` to run at `at` (or earlier, if it already is asked for earlier).
    pub fn enqueue_at(&mut self, key: K, at: u64) {
        if self.running.contains(&key) {
            let t = self.asked_while_running.entry(key).or_insert(at);
            *t = (*t).min(at);
            return;
        }
        match self.queued.get(&key).copied() {
            Some(q) if q.due <= at => {}
            Some(q) => self.set(key, Queued { due: at, debounce_since: q.debounce_since }),
            None => self.set(key, Queued { due: at, debounce_since: None }),
        }
    }

    /// Asks for `key` to run after `quiet` ms with no further request, but no later than `max`
    /// ms after the first request since it last ran. A plain request for an earlier time wins.
    pub fn debounce(&mut self, key: K, now: u64, quiet: u64, max: u64) {
        if self.running.contains(&key) {
            self.enqueue_at(key, now + quiet);
            return;
        }
        let q = match self.queued.get(&key).copied() {
            // Queued for a time before this quiet interval would end: a plain request, kept.
            Some(q) if q.debounce_since.is_none() && q.due <= now + quiet => return,
            Some(q) => {
                let since = q.debounce_since.unwrap_or(now);
                Queued { due: (now + quiet).min(since + max), debounce_since: Some(since) }
            }
            None => Queued { due: now + quiet.min(max), debounce_since: Some(now) },
        };
        self.set(key, q);
    }

    fn set(&mut self, key: K, q: Queued) {
        if let Some(old) = self.queued.insert(key.clone(), q) {
            self.by_due.remove(&(old.due, key.clone()));
        }
        self.by_due.insert((q.due, key));
    }

    /// The keys due at `now`, earliest first, each marked running until [`Self::finish`].
    /// Keys asked for while these run are not among them: they wait for the next call.
    pub fn take_due(&mut self, now: u64) -> Vec<K> {
        let mut out = Vec::new();
        while let Some((due, _)) = self.by_due.first() {
            if *due > now {
                break;
            }
            let (_, key) = self.by_due.pop_first().expect("looked at above");
            self.queued.remove(&key);
            self.running.insert(key.clone());
            out.push(key);
        }
        out
    }

    /// `key` finished at `now`: a failure runs it again after its backoff; a success resets
    /// the backoff and follows the action. A request that came while it ran is kept.
    pub fn finish<E>(&mut self, key: K, result: &Result<Action, E>, now: u64) {
        self.running.remove(&key);
        let next = match result {
            Ok(action) => {
                self.failing.remove(&key);
                match action {
                    Action::RequeueAfter(ms) => Some(now + ms),
                    Action::AwaitChange => None,
                }
            }
            Err(_) => {
                let b = self.failing.entry(key.clone()).or_insert_with(|| {
                    Backoff::new(
                        Duration::from_millis(ERROR_BACKOFF_FIRST_MS),
                        Duration::from_millis(ERROR_BACKOFF_MAX_MS),
                    )
                });
                Some(now + b.fail().as_millis() as u64)
            }
        };
        if let Some(at) = self.asked_while_running.remove(&key) {
            self.enqueue_at(key.clone(), at);
        }
        if let Some(at) = next {
            self.enqueue_at(key, at);
        }
    }

    /// When the next queued key is due, if any is queued.
    pub fn next_due(&self) -> Option<u64> {
        self.by_due.first().map(|(t, _)| *t)
    }

    /// Whether `key` is waiting to run.
    pub fn is_queued(&self, key: &K) -> bool {
        self.queued.contains_key(key)
    }

    /// The keys waiting to run, in key order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.queued.keys()
    }

    /// Keys waiting to run.
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Forgets a key that no longer exists (its queue entry and backoff).
    pub fn forget(&mut self, key: &K) {
        if let Some(q) = self.queued.remove(key) {
            self.by_due.remove(&(q.due, key.clone()));
        }
        self.failing.remove(key);
        self.asked_while_running.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Q = WorkQueue<&'static str>;

    fn ok(q: &mut Q, key: &'static str, now: u64) {
        q.finish::<()>(key, &Ok(Action::AwaitChange), now);
    }

    #[test]
    fn requests_for_a_queued_key_merge_at_the_earliest_time() {
        let mut q = Q::default();
        q.enqueue_at("a", 500);
        q.enqueue_at("a", 100);
        q.enqueue_at("a", 900);
        q.enqueue_at("b", 200);
        assert_eq!(q.len(), 2);
        assert_eq!(q.next_due(), Some(100));
        assert!(q.take_due(99).is_empty());
        assert_eq!(q.take_due(100), vec!["a"]);
        assert_eq!(q.take_due(1_000), vec!["b"], "a ran once for its three requests");
    }

    #[test]
    fn a_running_key_is_not_handed_out_again_until_it_finishes() {
        let mut q = Q::default();
        q.enqueue_at("a", 0);
        assert_eq!(q.take_due(0), vec!["a"]);
        q.enqueue_at("a", 0);
        q.enqueue_at("a", 10);
        assert!(q.take_due(50).is_empty(), "asked for while running: not handed out twice");
        assert!(!q.is_queued(&"a"));
        ok(&mut q, "a", 50);
        assert!(q.is_queued(&"a"), "the request that came while it ran is kept");
        assert_eq!(q.take_due(50), vec!["a"]);
    }

    #[test]
    fn keys_come_out_in_due_order() {
        let mut q = Q::default();
        for (k, t) in [("c", 30), ("a", 10), ("b", 20)] {
            q.enqueue_at(k, t);
        }
        assert_eq!(q.take_due(25), vec!["a", "b"]);
        assert_eq!(q.take_due(30), vec!["c"]);
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn errors_back_off_per_key_and_a_success_resets() {
        let mut q = Q::default();
        let mut now = 0;
        let mut waits = Vec::new();
        q.enqueue_at("a", 0);
        for _ in 0..9 {
            let due = q.next_due().unwrap();
            waits.push(due - now);
            now = due;
            assert_eq!(q.take_due(now), vec!["a"]);
            q.finish("a", &Err::<Action, _>("boom"), now);
        }
        assert_eq!(waits, vec![0, 250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000]);
        // Another key is not held back by a's failures.
        q.enqueue_at("b", now);
        assert_eq!(q.take_due(now), vec!["b"]);
        ok(&mut q, "b", now);
        // a succeeds: its next failure waits the first delay again.
        now = q.next_due().unwrap();
        assert_eq!(q.take_due(now), vec!["a"]);
        ok(&mut q, "a", now);
        assert!(q.is_empty());
        q.enqueue_at("a", now);
        q.take_due(now);
        q.finish("a", &Err::<Action, _>("again"), now);
        assert_eq!(q.next_due(), Some(now + 250));
    }

    #[test]
    fn a_reconcile_says_when_to_run_again() {
        let mut q = Q::default();
        q.enqueue_at("a", 0);
        q.take_due(0);
        q.finish::<()>("a", &Ok(Action::RequeueAfter(5_000)), 0);
        assert_eq!(q.next_due(), Some(5_000));
        q.enqueue_at("a", 1_000);
        assert_eq!(q.next_due(), Some(1_000), "an earlier request wins over the requeue");
        q.take_due(1_000);
        ok(&mut q, "a", 1_000);
        assert!(q.is_empty(), "AwaitChange: nothing until asked");
    }

    #[test]
    fn a_debounced_key_waits_for_quiet_but_no_longer_than_the_maximum() {
        let mut q = Q::default();
        // Requests every 400 ms with a 500 ms quiet interval: held to the 2 s maximum.
        for t in (0..2_000).step_by(400) {
            q.debounce("a", t, 500, 2_000);
            assert!(q.take_due(t).is_empty());
        }
        assert_eq!(q.next_due(), Some(2_000));
        assert_eq!(q.take_due(2_000), vec!["a"]);
        ok(&mut q, "a", 2_000);
        // Quiet after one request: it runs the quiet interval after it.
        q.debounce("a", 3_000, 500, 2_000);
        q.debounce("a", 3_100, 500, 2_000);
        assert_eq!(q.next_due(), Some(3_600));
        // A plain request for now wins over the debounce.
        q.enqueue_at("a", 3_200);
        assert_eq!(q.take_due(3_200), vec!["a"]);
    }

    #[test]
    fn a_forgotten_key_is_gone_with_its_backoff() {
        let mut q = Q::default();
        q.enqueue_at("a", 0);
        q.take_due(0);
        q.finish("a", &Err::<Action, _>("x"), 0);
        q.forget(&"a");
        assert!(q.is_empty());
        q.enqueue_at("a", 10);
        q.take_due(10);
        q.finish("a", &Err::<Action, _>("x"), 10);
        assert_eq!(q.next_due(), Some(260), "the backoff started over");
    }
}
