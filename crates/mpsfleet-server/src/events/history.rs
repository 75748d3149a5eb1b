//! The recent past of the cluster's events, bounded by count and age, so that a reader who
//! was not listening can still ask what happened (`GET /v1/events?since_ms=…`,
//! `mpsfleet events --since 10m`).
//!
//! Each event gets an id when it is recorded: the [`Cursor`] `TERM-N`, where TERM is the
//! leadership it was recorded under (its fence, which only grows from one leader to the next;
//! 0 for a lone server) and N counts within it. In a cluster of several servers each follower
//! copies the leader's history as it grows (`mpsfleet server`'s follower, through
//! `GET /v1/events/replica`), and keeps it when elected: the new leader's history goes on
//! from what its predecessor had recorded, and its own events sort after it.

use super::Kept;
use mpsfleet_types::event::{Event, EventType};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// The most events the history keeps; the oldest go first.
pub const HISTORY_EVENTS: usize = 10_000;

/// How long an event stays in the history.
pub const HISTORY_AGE: Duration = Duration::from_secs(3600);

/// Where an event stands in the history: later events have greater cursors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Cursor {
    pub term: u64,
    pub n: u64,
}

impl Cursor {
    /// `TERM-N`, as an event's `id` shows it.
    pub fn parse(s: &str) -> Option<Cursor> {
        let (term, n) = s.split_once('-')?;
        Some(Cursor { term: term.parse().ok()?, n: n.parse().ok()? })
    }

    pub fn of(ev: &Event) -> Option<Cursor> {
        ev.id.as_deref().and_then(Cursor::parse)
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.term, self.n)
    }
}

/// Which events of the history a reader wants.
#[derive(Debug, Clone, Copy, Default)]
pub struct From {
    /// Only events after this one.
    pub after: Option<Cursor>,
    /// Only events at or after this time (ms since the Unix epoch).
    pub since_ms: Option<u64>,
}

/// The history: events in cursor order, the oldest first, at most `limit` of them.
pub struct History {
    inner: Mutex<Inner>,
    /// The most events kept; 0: none (the history is off: `mpsfleet server --events-history 0`).
    limit: usize,
}

impl Default for History {
    fn default() -> Self {
        History::with_limit(HISTORY_EVENTS)
    }
}

#[derive(Default)]
struct Inner {
    events: VecDeque<(Cursor, Kept)>,
    last: Cursor,
}

impl History {
    /// A history of at most `limit` events; 0 keeps none.
    pub fn with_limit(limit: usize) -> Self {
        History { inner: Mutex::default(), limit }
    }

    /// Whether any event is kept (the limit is not 0).
    pub fn keeps(&self) -> bool {
        self.limit > 0
    }

    /// Records `ev` under `term` and hands its id and it to `then` while the history is still
    /// locked (so that live readers see events in the order of their ids). The id is written
    /// into the copies that leave the history, not into the kept event (one string less per
    /// event on the submit path); a compact entry is put in words only when it is read.
    pub fn record(&self, term: u64, ev: Kept, then: impl FnOnce(Cursor, &Kept)) {
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // A new leadership's events sort after everything before it; a term that is not
        // greater than the last (a lone server's 0) goes on counting in the last one.
        let cursor = if term > h.last.term {
            Cursor { term, n: 1 }
        } else {
            Cursor { term: h.last.term, n: h.last.n + 1 }
        };
        then(cursor, &ev);
        h.last = cursor;
        if self.keeps() {
            h.push(cursor, ev, self.limit);
        }
    }

    /// Keeps an event copied from the leader's history, when it is newer than what this one
    /// has; returns whether it was kept.
    pub fn copy(&self, ev: Event) -> bool {
        let Some(cursor) = Cursor::of(&ev) else { return false };
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if cursor <= h.last {
            return false;
        }
        h.last = cursor;
        if self.keeps() {
            h.push(cursor, Kept::Built(Box::new(ev)), self.limit);
        }
        true
    }

    /// The last event's cursor (the zero cursor when there is none yet).
    pub fn last(&self) -> Cursor {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).last
    }

    /// The events `from` asks for (of the types `keep` wants), oldest first, and the cursor
    /// the history stood at: a live reader that subscribed before this call skips what is at
    /// or before it.
    pub fn read(&self, from: From, mut keep: impl FnMut(EventType) -> bool) -> (Vec<Event>, Cursor) {
        let h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let start = match from.after {
            Some(after) => h.events.partition_point(|(c, _)| *c <= after),
            None => 0,
        };
        let out = h
            .events
            .range(start..)
            .filter(|(_, e)| from.since_ms.is_none_or(|s| e.at_ms() >= s) && keep(e.kind()))
            .map(|(c, e)| e.event(*c))
            .collect();
        (out, h.last)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).events.len()
    }
}

impl Inner {
    fn push(&mut self, cursor: Cursor, ev: Kept, limit: usize) {
        let oldest = ev.at_ms().saturating_sub(HISTORY_AGE.as_millis() as u64);
        self.events.push_back((cursor, ev));
        while self.events.len() > limit || self.events.front().is_some_and(|(_, e)| e.at_ms() < oldest) {
            self.events.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::event::EventType;

    fn ev(at_ms: u64) -> Kept {
        Kept::Built(Box::new(Event::new(EventType::TaskEvent, at_ms)))
    }

    fn ids(v: &[Event]) -> Vec<&str> {
        v.iter().filter_map(|e| e.id.as_deref()).collect()
    }

    #[test]
    fn events_get_growing_ids_and_are_read_from_a_point() {
        let h = History::default();
        for t in 1..=3 {
            h.record(0, ev(t * 1000), |_, _| {});
        }
        let (all, last) = h.read(From::default(), |_| true);
        assert_eq!(ids(&all), ["0-1", "0-2", "0-3"]);
        assert_eq!(last, Cursor { term: 0, n: 3 });
        let (after, _) = h.read(From { after: Cursor::parse("0-1"), since_ms: None }, |_| true);
        assert_eq!(ids(&after), ["0-2", "0-3"]);
        let (since, _) = h.read(From { after: None, since_ms: Some(2500) }, |_| true);
        assert_eq!(ids(&since), ["0-3"]);
        assert_eq!(Cursor::parse("x-1"), None);
        assert_eq!(Cursor::parse("7"), None);
    }

    #[test]
    fn the_history_is_bounded_by_count_and_by_age() {
        let h = History::default();
        for t in 0..HISTORY_EVENTS as u64 + 5 {
            h.record(0, ev(1_000_000 + t), |_, _| {});
        }
        assert_eq!(h.len(), HISTORY_EVENTS);
        let (all, _) = h.read(From::default(), |_| true);
        assert_eq!(all[0].id.as_deref(), Some("0-6"), "the oldest went first");
        // An hour after the 10,000th: only the last 5 and the new one are an hour recent.
        h.record(0, ev(1_010_000 + HISTORY_AGE.as_millis() as u64), |_, _| {});
        assert_eq!(h.len(), 6, "events older than an hour went");
    }

    #[test]
    fn a_follower_copies_the_leaders_events_and_goes_on_after_them_when_elected() {
        let leader = History::default();
        let follower = History::default();
        for t in 1..=3 {
            leader.record(5, ev(t), |c, e| assert!(follower.copy(e.event(c))));
        }
        assert!(!follower.copy(leader.read(From::default(), |_| true).0[0].clone()), "a copy is kept once");
        // Elected under a greater fence: its own events sort after the copied ones.
        follower.record(9, ev(4), |_, _| {});
        let (all, _) = follower.read(From::default(), |_| true);
        assert_eq!(ids(&all), ["5-1", "5-2", "5-3", "9-1"]);
        // A lone server's history (term 0) after copies never goes back.
        follower.record(0, ev(5), |_, _| {});
        assert_eq!(follower.last(), Cursor { term: 9, n: 2 });
    }

    #[test]
    fn a_limit_of_zero_keeps_nothing_but_ids_go_on_growing() {
        let h = History::with_limit(0);
        let mut seen = Vec::new();
        for t in 1..=3 {
            h.record(0, ev(t), |c, _| seen.push(c));
        }
        assert_eq!((h.len(), h.last()), (0, Cursor { term: 0, n: 3 }));
        assert_eq!(seen.last(), Some(&Cursor { term: 0, n: 3 }), "live readers still get ids");
        assert!(h.read(From::default(), |_| true).0.is_empty());
        assert!(h.copy(Event { id: Some("4-1".into()), ..Event::new(EventType::TaskEvent, 4) }));
        assert_eq!((h.len(), h.last()), (0, Cursor { term: 4, n: 1 }));
    }
}
