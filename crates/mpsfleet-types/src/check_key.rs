//! The one encoding of a host's checks (`HostCheck`), shared by the agent and the server: a
//! flat run of bytes in which every field is written with its length, so two lists of checks
//! have the same key exactly when they are equal (no hash, no collisions). A field added to
//! `HostCheck` is added here, once: [`write`] destructures it, so one left out does not
//! compile.
//!
//! - The server keeps each host's key and compares a heartbeat's checks with it as they would
//!   be written ([`matches`]): the stored side is one contiguous read and nothing is
//!   allocated, which at a thousand hosts reporting every second costs less than comparing
//!   the checks' strings, each in its own allocation.
//! - The agent asks whether its checks are the ones it last sent, but for the ages of a
//!   failure going on, which grow with the time that passed ([`same_but_aged`]).

use crate::{HealthStatus, HostCheck};

/// The key of `checks`.
pub fn of(checks: &[HostCheck]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * checks.len() + 8);
    write(checks, &mut out);
    out
}

/// Whether `key` is the key of `checks`: compared as it would be written, without writing it.
pub fn matches(checks: &[HostCheck], key: &[u8]) -> bool {
    let mut rest = Compare { rest: key, same: true };
    write(checks, &mut rest);
    rest.same && rest.rest.is_empty()
}

/// Writes the key of `checks` into `out` (cleared first).
pub fn encode(checks: &[HostCheck], out: &mut Vec<u8>) {
    out.clear();
    write(checks, out);
}

/// Whether `now` are the checks `then`, read `passed` ms earlier: equal field by field, but for
/// the ages (of the failure going on and of each local repair), each of which must have grown
/// by `passed`, within `slack`.
pub fn same_but_aged(then: &[HostCheck], now: &[HostCheck], passed: u64, slack: u64) -> bool {
    let mut parts = Parts(Vec::new());
    write(then, &mut parts);
    let mut walk = AgedCompare { parts: parts.0.iter(), passed, slack, same: true };
    write(now, &mut walk);
    walk.same && walk.parts.next().is_none()
}

/// Where a key goes: a buffer, or a comparison with a key written before.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    /// An age, which grows with time: written as its bytes.
    fn age(&mut self, ms: u64) {
        self.put(&ms.to_le_bytes());
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The part of a key not compared yet, and whether what was compared is equal.
struct Compare<'a> {
    rest: &'a [u8],
    same: bool,
}

impl Sink for Compare<'_> {
    fn put(&mut self, bytes: &[u8]) {
        match self.rest.split_at_checked(bytes.len()) {
            Some((head, tail)) if self.same && head == bytes => self.rest = tail,
            _ => self.same = false,
        }
    }
}

/// A key as the parts it was written in, ages apart.
enum Part {
    Bytes(Vec<u8>),
    Age(u64),
}

struct Parts(Vec<Part>);

impl Sink for Parts {
    fn put(&mut self, bytes: &[u8]) {
        self.0.push(Part::Bytes(bytes.to_vec()));
    }
    fn age(&mut self, ms: u64) {
        self.0.push(Part::Age(ms));
    }
}

/// Walks the parts of an earlier key: bytes must be equal, ages grown by `passed` within
/// `slack`.
struct AgedCompare<'a> {
    parts: std::slice::Iter<'a, Part>,
    passed: u64,
    slack: u64,
    same: bool,
}

impl Sink for AgedCompare<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.same &= matches!(self.parts.next(), Some(Part::Bytes(b)) if b == bytes);
    }
    fn age(&mut self, ms: u64) {
        let grown = |old: u64| (old + self.passed).abs_diff(ms) <= self.slack;
        self.same &= matches!(self.parts.next(), Some(Part::Age(old)) if grown(*old));
    }
}

fn write(checks: &[HostCheck], out: &mut impl Sink) {
    put_len(out, checks.len());
    for c in checks {
        // Destructured, so that a field added to `HostCheck` cannot be left out silently.
        let HostCheck {
            name,
            gpu_id,
            status,
            reason,
            since_ms,
            restarts,
            first_failure_age_ms,
            repair_ages_ms,
        } = c;
        put_str(out, name);
        match gpu_id {
            Some(g) => {
                out.put(&[1]);
                put_str(out, g.as_str());
            }
            None => out.put(&[0]),
        }
        out.put(&[match status {
            HealthStatus::Ok => 0,
            HealthStatus::Initializing => 1,
            HealthStatus::InsufficientData => 2,
            HealthStatus::Impaired => 3,
        }]);
        put_str(out, reason);
        out.put(&since_ms.to_le_bytes());
        out.put(&restarts.to_le_bytes());
        match first_failure_age_ms {
            Some(a) => {
                out.put(&[1]);
                out.age(*a);
            }
            None => out.put(&[0]),
        }
        put_len(out, repair_ages_ms.len());
        for a in repair_ages_ms {
            out.age(*a);
        }
    }
}

fn put_len(out: &mut impl Sink, n: usize) {
    out.put(&(n as u64).to_le_bytes());
}

fn put_str(out: &mut impl Sink, s: &str) {
    put_len(out, s.len());
    out.put(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuUuid;

    fn key(checks: &[HostCheck]) -> Vec<u8> {
        let mut out = vec![9, 9, 9];
        encode(checks, &mut out);
        out
    }

    fn check() -> HostCheck {
        HostCheck {
            name: "MPS_DAEMON".into(),
            gpu_id: Some(GpuUuid::new("GPU-0").unwrap()),
            status: HealthStatus::Ok,
            reason: "answers".into(),
            since_ms: 5,
            restarts: 0,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        }
    }

    #[test]
    fn equal_checks_have_equal_keys_and_any_change_changes_the_key() {
        let base = vec![check(), HostCheck { name: "GPU".into(), ..check() }];
        assert_eq!(key(&base), key(&base.clone()));
        assert!(matches(&base, &key(&base)), "a key matches the checks it was written from");
        assert!(!matches(&base[..1], &key(&base)), "a prefix of the checks is not them");
        assert!(!matches(&base, &key(&base[..1])), "nor are more checks");
        assert_ne!(key(&base), key(&base[..1]));
        assert_ne!(key(&[]), key(&base[..1]));
        let changes: Vec<fn(&mut HostCheck)> = vec![
            |c| c.name = "GPU".into(),
            |c| c.gpu_id = None,
            |c| c.gpu_id = Some(GpuUuid::new("GPU-1").unwrap()),
            |c| c.status = HealthStatus::Impaired,
            |c| c.status = HealthStatus::Initializing,
            |c| c.status = HealthStatus::InsufficientData,
            |c| c.reason = "answers ".into(),
            |c| c.since_ms = 6,
            |c| c.restarts = 1,
            |c| c.first_failure_age_ms = Some(0),
            |c| c.repair_ages_ms = vec![0],
        ];
        for (k, change) in changes.iter().enumerate() {
            let mut other = base.clone();
            change(&mut other[0]);
            assert_ne!(other, base);
            assert_ne!(key(&other), key(&base), "change {k} left the key as it was");
            assert!(!matches(&other, &key(&base)), "change {k} matched the old key");
        }
    }

    /// Lengths are written, so moving bytes from one string to the next is a change.
    #[test]
    fn field_boundaries_are_part_of_the_key() {
        let a = HostCheck { name: "AB".into(), reason: "C".into(), ..check() };
        let b = HostCheck { name: "A".into(), reason: "BC".into(), ..check() };
        assert_ne!(key(std::slice::from_ref(&a)), key(std::slice::from_ref(&b)));
        assert!(!matches(&[b], &key(&[a])));
    }

    /// Ages compare as grown by the time that passed, within the slack; every other field,
    /// and the number of ages, exactly.
    #[test]
    fn ages_compare_as_grown_and_nothing_else_does() {
        let failing = |age, repairs: &[u64]| HostCheck {
            status: HealthStatus::Impaired,
            first_failure_age_ms: Some(age),
            repair_ages_ms: repairs.to_vec(),
            ..check()
        };
        let then = [failing(500, &[400])];
        assert!(same_but_aged(&then, &then, 0, 0));
        assert!(same_but_aged(&then, &[failing(3_500, &[3_400])], 3_000, 0));
        assert!(same_but_aged(&then, &[failing(3_600, &[3_300])], 3_000, 100));
        assert!(!same_but_aged(&then, &[failing(3_601, &[3_400])], 3_000, 100));
        assert!(!same_but_aged(&then, &[failing(3_500, &[3_400, 0])], 3_000, 0), "a new repair");
        assert!(!same_but_aged(&then, &[failing(3_500, &[])], 3_000, 0), "a repair fewer");
        assert!(!same_but_aged(&then, &[check()], 3_000, 0), "the failure is over");
        let renamed = HostCheck { reason: "another".into(), ..failing(3_500, &[3_400]) };
        assert!(!same_but_aged(&then, &[renamed], 3_000, 0));
        assert!(!same_but_aged(&then, &[failing(3_500, &[3_400]), check()], 3_000, 0), "a check more");
        assert!(!same_but_aged(&[], &then, 0, 0));
    }
}
