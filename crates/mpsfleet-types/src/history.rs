//! A bounded, coalescing history: the one type for everything that records what happened to an
//! object over time (incident timelines today; object events and the audit log follow it).
//!
//! Two rules keep it small however long the object lives:
//!
//! - **Coalescing.** An event equal to the newest entry (nothing new to say) does not add an
//!   entry: the newest entry's `count` goes up and its `lastAtMs` moves. A step that repeats a
//!   thousand times is one line, "x1000, first at .., last at ..".
//! - **A bound.** At most `E::HEAD` of the oldest entries and `E::TAIL` of the newest are kept;
//!   entries pushed out between them are dropped and counted in `elided` (events, repeats
//!   included), so a reader sees how it started, how it is going, and how much was left out.
//!
//! The JSON form is `{"entries": [...], "elided": N}` (`elided` only when non-zero). A plain
//! array of entries, the form before this type existed, is read too.

use serde::{Deserialize, Deserializer, Serialize};
use std::ops::Deref;

/// What a history holds, and how much of it.
pub trait HistoryEvent: Clone + PartialEq {
    /// Oldest entries kept.
    const HEAD: usize = 16;
    /// Newest entries kept.
    const TAIL: usize = 48;
}

/// One entry: an event, when it first happened, and how often it repeated since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Entry<E> {
    /// When the event first happened (milliseconds since the Unix epoch, server clock).
    pub at_ms: u64,
    #[serde(flatten)]
    pub event: E,
    /// How many times it happened in a row; 1 unless it repeated.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u64,
    /// When it last happened, once it repeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_at_ms: Option<u64>,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

impl<E> Deref for Entry<E> {
    type Target = E;
    fn deref(&self) -> &E {
        &self.event
    }
}

impl<E> Entry<E> {
    pub fn new(at_ms: u64, event: E) -> Self {
        Entry { at_ms, event, count: 1, last_at_ms: None }
    }

    /// When the event last happened (the first time if it never repeated).
    pub fn latest_ms(&self) -> u64 {
        self.last_at_ms.unwrap_or(self.at_ms)
    }
}

/// See the module documentation.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct History<E> {
    entries: Vec<Entry<E>>,
    /// Events dropped from between the head and the tail (repeats included).
    #[serde(skip_serializing_if = "is_zero")]
    elided: u64,
    /// Entries ever added (not counting repeats folded into one): lets a reader that saw the
    /// history at `pushed() == n` find what is new since.
    #[serde(skip)]
    pushed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Equal when the entries and the elided count are; `pushed` counts from the load, so a
/// history read back from its JSON equals the one written.
impl<E: PartialEq> PartialEq for History<E> {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries && self.elided == other.elided
    }
}

impl<E: Eq> Eq for History<E> {}

impl<E> Default for History<E> {
    fn default() -> Self {
        History { entries: Vec::new(), elided: 0, pushed: 0 }
    }
}

impl<E> History<E> {
    /// No entry, none left out.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.elided == 0
    }
}

impl<E> Deref for History<E> {
    type Target = [Entry<E>];
    fn deref(&self) -> &[Entry<E>] {
        &self.entries
    }
}

impl<E> IntoIterator for History<E> {
    type Item = Entry<E>;
    type IntoIter = std::vec::IntoIter<Entry<E>>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, E> IntoIterator for &'a History<E> {
    type Item = &'a Entry<E>;
    type IntoIter = std::slice::Iter<'a, Entry<E>>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

/// What [`History::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// A new entry.
    Added,
    /// The newest entry repeated: its count went up.
    Coalesced,
}

impl<E: HistoryEvent> History<E> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `event` at `at_ms`: coalesced into the newest entry when equal to it, else a new
    /// entry, dropping the oldest entry after the head when the bound is reached.
    pub fn push(&mut self, at_ms: u64, event: E) -> Pushed {
        if let Some(last) = self.entries.last_mut() {
            if last.event == event {
                last.count = last.count.saturating_add(1);
                last.last_at_ms = Some(at_ms.max(last.latest_ms()));
                return Pushed::Coalesced;
            }
        }
        self.entries.push(Entry::new(at_ms, event));
        self.pushed += 1;
        self.enforce_bound();
        Pushed::Added
    }

    fn enforce_bound(&mut self) {
        let cap = E::HEAD + E::TAIL;
        if self.entries.len() > cap {
            let excess = self.entries.len() - cap;
            let dropped: u64 = self.entries.drain(E::HEAD..E::HEAD + excess).map(|e| e.count).sum();
            self.elided = self.elided.saturating_add(dropped);
        }
    }

    /// Events dropped from between the head and the tail.
    pub fn elided(&self) -> u64 {
        self.elided
    }

    /// Entries ever added to this value (repeats folded into an entry do not count). Not stored:
    /// it counts from the load.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// The entries added since the history had `pushed() == before`, oldest first (at most those
    /// still kept).
    pub fn since(&self, before: u64) -> &[Entry<E>] {
        let new = self.pushed.saturating_sub(before) as usize;
        &self.entries[self.entries.len().saturating_sub(new)..]
    }

    /// The same history with each event turned into another by `f` (times, counts and what
    /// was left out unchanged): a compact record shown in words, for example.
    pub fn map<G>(&self, f: impl Fn(&E) -> G) -> History<G> {
        let entries = self
            .entries
            .iter()
            .map(|e| Entry { at_ms: e.at_ms, event: f(&e.event), count: e.count, last_at_ms: e.last_at_ms })
            .collect();
        History { entries, elided: self.elided, pushed: self.pushed }
    }

    /// Puts `event` first, at `at_ms`: for an event a record implies but that was not kept as
    /// an entry (it only ever comes first). Not bounded: for showing, not for keeping.
    pub fn with_first(mut self, at_ms: u64, event: E) -> Self {
        self.entries.insert(0, Entry::new(at_ms, event));
        self
    }

    /// Every event ever recorded, repeats and elided ones included.
    pub fn total(&self) -> u64 {
        self.entries.iter().map(|e| e.count).sum::<u64>() + self.elided
    }

    fn from_parts(entries: Vec<Entry<E>>, elided: u64) -> Self {
        let mut h: History<E> = History { entries: Vec::with_capacity(entries.len()), elided, pushed: 0 };
        for e in entries {
            // Coalesce and bound what was stored, in case it was written by an older version.
            match h.entries.last_mut() {
                Some(last) if last.event == e.event => {
                    last.count = last.count.saturating_add(e.count);
                    last.last_at_ms = Some(e.latest_ms().max(last.latest_ms()));
                }
                _ => h.entries.push(e),
            }
            h.enforce_bound();
        }
        h
    }
}

impl<'de, E: HistoryEvent + Deserialize<'de>> Deserialize<'de> for History<E> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize, utoipa::ToSchema)]
        #[serde(untagged)]
        enum Form<E> {
            Bounded {
                entries: Vec<Entry<E>>,
                #[serde(default)]
                elided: u64,
            },
            /// The form before histories were bounded: a plain array.
            Plain(Vec<Entry<E>>),
        }
        Ok(match Form::<E>::deserialize(d)? {
            Form::Bounded { entries, elided } => History::from_parts(entries, elided),
            Form::Plain(entries) => History::from_parts(entries, 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
    struct Ev {
        what: String,
    }

    impl HistoryEvent for Ev {
        const HEAD: usize = 2;
        const TAIL: usize = 3;
    }

    fn ev(s: &str) -> Ev {
        Ev { what: s.into() }
    }

    fn whats(h: &History<Ev>) -> Vec<(String, u64)> {
        h.iter().map(|e| (e.what.clone(), e.count)).collect()
    }

    #[test]
    fn repeats_coalesce_into_a_count_with_first_and_last_time() {
        let mut h = History::new();
        assert_eq!(h.push(10, ev("a")), Pushed::Added);
        assert_eq!(h.push(11, ev("b")), Pushed::Added);
        for t in 12..1_011 {
            assert_eq!(h.push(t, ev("b")), Pushed::Coalesced);
        }
        assert_eq!(whats(&h), vec![("a".into(), 1), ("b".into(), 1_000)]);
        assert_eq!(h[1].at_ms, 11);
        assert_eq!(h[1].last_at_ms, Some(1_010));
        assert_eq!(h.total(), 1_001);
        assert_eq!(h.pushed(), 2);
    }

    #[test]
    fn the_bound_keeps_head_and_tail_and_counts_what_it_dropped() {
        let mut h = History::new();
        for i in 0..10u64 {
            h.push(i, ev(&format!("e{i}")));
            assert!(h.len() <= 5, "{} entries", h.len());
        }
        let names: Vec<String> = h.iter().map(|e| e.what.clone()).collect();
        assert_eq!(names, ["e0", "e1", "e7", "e8", "e9"]);
        assert_eq!(h.elided(), 5);
        assert_eq!(h.total(), 10);
        // Alternating events never coalesce, and still stay within the bound.
        for i in 0..10_000u64 {
            h.push(100 + i, ev(if i % 2 == 0 { "x" } else { "y" }));
        }
        assert_eq!(h.len(), 5);
        assert_eq!(h.total(), 10_010);
    }

    #[test]
    fn since_returns_what_was_added_after_a_reader_looked() {
        let mut h = History::new();
        h.push(1, ev("a"));
        let seen = h.pushed();
        h.push(2, ev("a")); // a repeat: nothing new
        assert!(h.since(seen).is_empty());
        h.push(3, ev("b"));
        h.push(4, ev("c"));
        let new: Vec<&str> = h.since(seen).iter().map(|e| e.what.as_str()).collect();
        assert_eq!(new, ["b", "c"]);
        // More new entries than the history keeps: what is kept.
        let seen = h.pushed();
        for i in 0..20 {
            h.push(10 + i, ev(&format!("n{i}")));
        }
        assert_eq!(h.since(seen).len(), h.len());
    }

    #[test]
    fn json_round_trips_and_reads_the_old_plain_array() {
        let mut h = History::new();
        h.push(1, ev("a"));
        h.push(2, ev("a"));
        let v = serde_json::to_value(&h).unwrap();
        assert_eq!(v, json!({"entries": [{"atMs": 1, "what": "a", "count": 2, "lastAtMs": 2}]}));
        let back: History<Ev> = serde_json::from_value(v).unwrap();
        assert_eq!(whats(&back), whats(&h));
        // The old form: a plain array, possibly longer than the bound and with repeats.
        let old = json!([
            {"atMs": 1, "what": "a"}, {"atMs": 2, "what": "b"}, {"atMs": 3, "what": "b"},
            {"atMs": 4, "what": "c"}, {"atMs": 5, "what": "d"}, {"atMs": 6, "what": "e"},
            {"atMs": 7, "what": "f"}
        ]);
        let h: History<Ev> = serde_json::from_value(old).unwrap();
        assert_eq!(
            whats(&h),
            vec![("a".into(), 1), ("b".into(), 2), ("d".into(), 1), ("e".into(), 1), ("f".into(), 1)]
        );
        assert_eq!(h.elided(), 1);
        assert_eq!(h[1].last_at_ms, Some(3));
    }
}
