//! The incident records, with the unresolved ones indexed.
//!
//! Every heartbeat asks whether an unresolved incident is about its host or names it as the
//! replacement, and every remediation pass walks the unresolved incidents; resolved records are
//! kept (up to the retention bounds) and outnumber them as a fleet runs. [`IncidentTable`] keeps
//! the unresolved incidents apart from the resolved ones, counts the hosts they engage, and
//! keeps each pool's replacement requests in time order (the rate limit's input, which every
//! planned incident needs), in step with the records: [`IncidentTable::insert`] and
//! [`IncidentTable::remove`] are the only ways in and out.

use super::Versioned;
use mpsfleet_types::{HostId, Incident, IncidentState, PoolName, Step};
use std::borrow::Borrow;
use std::collections::{btree_map, BTreeMap, BTreeSet};
use std::iter::Peekable;

#[derive(Debug, Default)]
pub(super) struct IncidentTable {
    /// The incidents whose state is not RESOLVED, by id.
    open: BTreeMap<String, Versioned<Incident>>,
    /// The RESOLVED ones, by id.
    resolved: BTreeMap<String, Versioned<Incident>>,
    /// For each host, how many unresolved incidents are about it or name it as their
    /// replacement (an incident that does both counts twice).
    engaged: BTreeMap<HostId, u32>,
    /// When each incident, resolved or not, first asked for a replacement: (pool, time, id).
    requested: BTreeSet<(PoolName, u64, String)>,
}

impl IncidentTable {
    pub(super) fn get<Q>(&self, id: &Q) -> Option<&Versioned<Incident>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.open.get(id).or_else(|| self.resolved.get(id))
    }

    /// Every record, in id order.
    pub(super) fn values(&self) -> Values<'_> {
        Values { open: self.open.iter().peekable(), resolved: self.resolved.iter().peekable() }
    }

    /// The unresolved incidents, in id order (the order of [`IncidentTable::values`]).
    pub(super) fn unresolved(&self) -> impl Iterator<Item = &Incident> + '_ {
        self.open.values().map(|v| &v.value)
    }

    /// Whether an unresolved incident is about `host` or names it as its replacement.
    pub(super) fn engages(&self, host: &HostId) -> bool {
        self.engaged.contains_key(host)
    }

    /// When the incidents of `pool`, resolved or not, first asked for a replacement, earliest
    /// first.
    pub(super) fn replacement_requests<'a>(&'a self, pool: &'a PoolName) -> impl Iterator<Item = u64> + 'a {
        let from = (pool.clone(), 0, String::new());
        self.requested.range(from..).take_while(move |(p, _, _)| p == pool).map(|(_, t, _)| *t)
    }

    pub(super) fn insert(&mut self, id: String, v: Versioned<Incident>) -> Option<Versioned<Incident>> {
        let old = self.remove(&id);
        if let Some(t) = v.value.first(Step::ReplacementRequested) {
            self.requested.insert((v.value.pool.clone(), t, v.value.id.clone()));
        }
        if v.value.state == IncidentState::Resolved {
            self.resolved.insert(id, v);
        } else {
            self.engage(&v.value, true);
            self.open.insert(id, v);
        }
        old
    }

    pub(super) fn remove<Q>(&mut self, id: &Q) -> Option<Versioned<Incident>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let old = match self.open.remove(id) {
            Some(old) => {
                self.engage(&old.value, false);
                old
            }
            None => self.resolved.remove(id)?,
        };
        if let Some(t) = old.value.first(Step::ReplacementRequested) {
            self.requested.remove(&(old.value.pool.clone(), t, old.value.id.clone()));
        }
        Some(old)
    }

    /// Counts (`add`) or stops counting the hosts an unresolved incident engages.
    fn engage(&mut self, i: &Incident, add: bool) {
        let replacement = i.replacement.as_ref().and_then(|r| r.host_id.as_ref());
        for host in std::iter::once(&i.host_id).chain(replacement) {
            if add {
                *self.engaged.entry(host.clone()).or_default() += 1;
            } else if let Some(n) = self.engaged.get_mut(host) {
                *n -= 1;
                if *n == 0 {
                    self.engaged.remove(host);
                }
            }
        }
    }
}

/// Every incident record, unresolved and resolved, in id order.
pub(super) struct Values<'a> {
    open: Peekable<btree_map::Iter<'a, String, Versioned<Incident>>>,
    resolved: Peekable<btree_map::Iter<'a, String, Versioned<Incident>>>,
}

impl<'a> Iterator for Values<'a> {
    type Item = &'a Versioned<Incident>;

    fn next(&mut self) -> Option<Self::Item> {
        let from_open = match (self.open.peek(), self.resolved.peek()) {
            (Some((a, _)), Some((b, _))) => a < b,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let next = if from_open { self.open.next() } else { self.resolved.next() };
        next.map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{GpuUuid, IncidentOwner, ReplacementBinding, Trigger};

    fn host(n: &str) -> HostId {
        HostId::new(n).unwrap()
    }

    fn incident(id: &str, on: &str) -> Incident {
        let trigger = Trigger {
            check: "MPS_DAEMON".into(),
            gpu_id: Some(GpuUuid::new("GPU-0").unwrap()),
            reason: "probe timed out after 3s".into(),
            evidence: "agent reported IMPAIRED".into(),
            first_failure_at_ms: None,
            local_repairs_at_ms: Vec::new(),
            earlier_repairs_at_ms: Vec::new(),
        };
        let pool = PoolName::new("p").unwrap();
        Incident::open(id.into(), host(on), pool, IncidentOwner::Mpsfleet, trigger, 1_000, 5_000)
    }

    fn with_replacement(mut i: Incident, joined: &str) -> Incident {
        i.replacement = Some(ReplacementBinding {
            name: "p-r".into(),
            token_sha256: "00".into(),
            earlier_token_sha256: Vec::new(),
            expires_at_ms: 0,
            host_id: Some(host(joined)),
            revoked: false,
        });
        i.push(2_000, Step::ReplacementRequested, "asked the provider", None);
        i
    }

    fn put(t: &mut IncidentTable, i: Incident) {
        let id = i.id.clone();
        t.insert(id, Versioned { value: i, version: 1 });
    }

    /// The indexes against a scan of the records: what a heartbeat and remediation would
    /// have found by walking every incident.
    fn assert_in_step(t: &IncidentTable, hosts: &[&str]) {
        let scanned: Vec<&str> = t
            .values()
            .filter(|v| v.value.state != IncidentState::Resolved)
            .map(|v| v.value.id.as_str())
            .collect();
        let indexed: Vec<&str> = t.unresolved().map(|i| i.id.as_str()).collect();
        assert_eq!(indexed, scanned);
        let ids: Vec<&str> = t.values().map(|v| v.value.id.as_str()).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(ids, sorted, "every record once, in id order");
        for id in &ids {
            assert_eq!(t.get(*id).map(|v| v.value.id.as_str()), Some(*id));
        }
        for h in hosts {
            let h = host(h);
            let scanned = t.values().any(|v| {
                v.value.state != IncidentState::Resolved
                    && (v.value.host_id == h || v.value.is_replacement(&h))
            });
            assert_eq!(t.engages(&h), scanned, "host {h}");
        }
        let pool = PoolName::new("p").unwrap();
        let mut scanned: Vec<u64> = t
            .values()
            .filter(|v| v.value.pool == pool)
            .filter_map(|v| v.value.first(Step::ReplacementRequested))
            .collect();
        scanned.sort_unstable();
        assert_eq!(t.replacement_requests(&pool).collect::<Vec<_>>(), scanned, "replacement requests");
        assert_eq!(t.replacement_requests(&PoolName::new("q").unwrap()).count(), 0);
    }

    /// Opening, binding a replacement, resolving, rewriting and removing keep the unresolved
    /// ids and the engaged hosts equal to a scan of the records.
    #[test]
    fn the_indexes_follow_every_write() {
        let hosts = ["h-a", "h-b", "h-c", "h-r"];
        let mut t = IncidentTable::default();
        assert_in_step(&t, &hosts);
        put(&mut t, incident("inc-2", "h-a"));
        put(&mut t, incident("inc-1", "h-b"));
        assert_in_step(&t, &hosts);
        assert!(t.engages(&host("h-a")) && t.engages(&host("h-b")) && !t.engages(&host("h-r")));

        // The replacement joins: the incident engages it too, until it is resolved.
        put(&mut t, with_replacement(incident("inc-2", "h-a"), "h-r"));
        assert_in_step(&t, &hosts);
        assert!(t.engages(&host("h-r")));
        // Written again unchanged: still counted once.
        put(&mut t, with_replacement(incident("inc-2", "h-a"), "h-r"));
        let mut resolved = with_replacement(incident("inc-2", "h-a"), "h-r");
        resolved.state = IncidentState::Resolved;
        put(&mut t, resolved);
        assert_in_step(&t, &hosts);
        assert!(!t.engages(&host("h-a")) && !t.engages(&host("h-r")));

        // Two unresolved incidents about one host (a second episode): engaged until both end.
        put(&mut t, incident("inc-3", "h-b"));
        assert!(t.remove("inc-1").is_some());
        assert_in_step(&t, &hosts);
        assert!(t.engages(&host("h-b")));
        assert!(t.remove("inc-3").is_some());
        assert!(t.remove("inc-3").is_none());
        assert_in_step(&t, &hosts);
        assert!(!t.engages(&host("h-b")));
        assert_eq!(t.unresolved().count(), 0);
        assert_eq!(t.values().count(), 1);
        assert_eq!(t.replacement_requests(&PoolName::new("p").unwrap()).collect::<Vec<_>>(), vec![2_000]);
        assert!(t.remove("inc-2").is_some());
        assert_in_step(&t, &hosts);
        assert_eq!(
            t.replacement_requests(&PoolName::new("p").unwrap()).count(),
            0,
            "removed with its record"
        );
    }
}
