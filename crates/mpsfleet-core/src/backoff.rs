//! The one retry backoff: doubles from a first delay up to a ceiling, and starts again from
//! the first delay after a success. The agent's restarts and pulls, the server's work queue
//! ([`crate::controller`]) and its provider retries all wait by it.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max: max.max(first), next: first }
    }

    /// The delay before the next try; each call doubles the one after, up to the ceiling.
    pub fn fail(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    /// The delay the next failure will wait, without counting one.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// The wait after failure `n` (from 1) of a backoff from `first` up to `max`, without
    /// keeping count: `first * 2^(n-1)`, at most `max`.
    pub fn nth(first: Duration, max: Duration, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        first.saturating_mul(factor).min(max.max(first))
    }

    /// A success: the next failure waits the first delay again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_ceiling_and_starts_again_after_a_success() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let waits: Vec<Duration> = (0..5).map(|_| b.fail()).collect();
        assert_eq!(waits, vec![ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.peek(), ms(100));
        assert_eq!(b.fail(), ms(100));
    }

    #[test]
    fn the_nth_wait_is_the_one_a_counting_backoff_gives() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        for n in 1..40 {
            assert_eq!(Backoff::nth(ms(100), ms(500), n), b.fail(), "failure {n}");
        }
        assert_eq!(Backoff::nth(ms(100), ms(500), 0), ms(100));
    }
}
