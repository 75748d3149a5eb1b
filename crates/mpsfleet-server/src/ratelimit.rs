//! Per-token request rate limits: one token bucket per caller.
//!
//! An authenticated caller is charged to the bucket of its token, keyed by the token's SHA-256
//! digest (the same digest the server stores, never the token). A request whose token is
//! missing or unknown is charged to the bucket of its peer's IP address instead, so that
//! guessing tokens is throttled: a random token never gets a bucket of its own.
//!
//! A bucket holds up to `burst` requests and refills at `per_second`; a request takes one, and
//! a request that finds none is refused with the whole seconds until one is back.
//!
//! Memory is bounded: at most [`MAX_TOKEN_BUCKETS`] token buckets and [`MAX_PEER_BUCKETS`] peer
//! buckets exist at once (about 150 bytes each, so under 20 MiB in all). A bucket that has
//! refilled to its burst is the same as a new one, so it is dropped at the next sweep (every
//! [`SWEEP_INTERVAL_MS`]); when a map is at its cap and a sweep frees nothing, an arbitrary
//! bucket is dropped for the new one (that caller starts again from a full bucket).
//!
//! The arithmetic is pure: every method that reads time has an `_at` form taking the
//! milliseconds since the limiter was made, which the tests drive.

use crate::auth::Principal;
use crate::cluster::Error;
use crate::error::ApiError;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

/// The most token buckets (callers with a known token) kept at once.
pub const MAX_TOKEN_BUCKETS: usize = 100_000;
/// The most peer-address buckets (callers without a known token) kept at once.
pub const MAX_PEER_BUCKETS: usize = 10_000;
/// How often buckets that have refilled are dropped.
pub const SWEEP_INTERVAL_MS: u64 = 10_000;
/// A map at its cap is swept at most this often; in between, an arbitrary bucket makes room.
const FULL_SWEEP_MIN_MS: u64 = 1_000;

/// One kind of caller's limit: `per_second` requests a second on average, up to `burst` at
/// once. `per_second` 0 means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub per_second: u32,
    pub burst: u32,
}

impl Limit {
    pub const fn new(per_second: u32, burst: u32) -> Limit {
        Limit { per_second, burst }
    }

    pub fn is_unlimited(&self) -> bool {
        self.per_second == 0
    }

    /// The bucket's size: a limited bucket holds at least one request.
    fn capacity(&self) -> f64 {
        f64::from(self.burst.max(1))
    }
}

/// The limits of each kind of caller (see docs/api.md, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    /// The admin token: the CLI, scripts, `bench submit` (10,000-task batches).
    pub admin: Limit,
    /// The join token: a whole fleet registering at once, `bench register`.
    pub join: Limit,
    /// Each host credential (heartbeats, long polls, task reports: a host starting hundreds of
    /// tasks at once reports each), and each one-time token a single machine registers with
    /// (replacement and launch tokens).
    pub host: Limit,
    /// Requests with a missing or unknown token, per peer IP address.
    pub unknown_per_ip: Limit,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            admin: Limit::new(10_000, 20_000),
            join: Limit::new(20_000, 40_000),
            host: Limit::new(100, 2_000),
            unknown_per_ip: Limit::new(10, 500),
        }
    }
}

/// A request refused for its caller's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Whole seconds until the bucket holds a request again; at least 1.
    pub retry_after_s: u64,
    /// The limit that refused it.
    pub limit: Limit,
}

/// One caller's bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    limit: Limit,
    /// Requests it holds now (fractions refill between requests).
    tokens: f64,
    /// When `tokens` was last brought up to date, in ms.
    at_ms: u64,
}

impl Bucket {
    /// A full bucket.
    pub fn new(limit: Limit, now_ms: u64) -> Bucket {
        Bucket { limit, tokens: limit.capacity(), at_ms: now_ms }
    }

    /// Refills for the time since the last call (time never runs backwards here).
    fn refill(&mut self, now_ms: u64) {
        let elapsed_ms = now_ms.saturating_sub(self.at_ms);
        let added = elapsed_ms as f64 * f64::from(self.limit.per_second) / 1000.0;
        self.tokens = (self.tokens + added).min(self.limit.capacity());
        self.at_ms = self.at_ms.max(now_ms);
    }

    /// Takes one request, or says how long until one is back.
    pub fn take(&mut self, now_ms: u64) -> Result<(), Refused> {
        if self.limit.is_unlimited() {
            return Ok(());
        }
        self.refill(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        let wait_s = (1.0 - self.tokens) / f64::from(self.limit.per_second);
        Err(Refused { retry_after_s: (wait_s.ceil() as u64).max(1), limit: self.limit })
    }

    /// Whether it has refilled to its burst by `now_ms` (and so is the same as a new one).
    pub fn is_full(&self, now_ms: u64) -> bool {
        let mut b = *self;
        b.refill(now_ms);
        b.tokens >= b.limit.capacity()
    }
}

/// Buckets of one kind of key, at most `cap` of them.
#[derive(Debug)]
struct Buckets<K> {
    map: HashMap<K, Bucket>,
    cap: usize,
    swept_ms: u64,
}

impl<K: std::hash::Hash + Eq + Clone> Buckets<K> {
    fn new(cap: usize) -> Self {
        Buckets { map: HashMap::new(), cap: cap.max(1), swept_ms: 0 }
    }

    fn sweep(&mut self, now_ms: u64) {
        self.map.retain(|_, b| !b.is_full(now_ms));
        self.swept_ms = now_ms;
    }

    fn take(&mut self, key: &K, limit: Limit, now_ms: u64) -> Result<(), Refused> {
        if let Some(b) = self.map.get_mut(key) {
            // A caller's kind does not change, but a new limit applies at once.
            b.limit = limit;
            return b.take(now_ms);
        }
        if self.map.len() >= self.cap {
            if now_ms.saturating_sub(self.swept_ms) >= FULL_SWEEP_MIN_MS {
                self.sweep(now_ms);
            }
            if self.map.len() >= self.cap {
                if let Some(k) = self.map.keys().next().cloned() {
                    self.map.remove(&k);
                }
            }
        }
        let mut b = Bucket::new(limit, now_ms);
        let r = b.take(now_ms);
        self.map.insert(key.clone(), b);
        r
    }
}

/// Whom a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'a> {
    /// A known token, by the hex SHA-256 digest of the token.
    Token(&'a str),
    /// A request with a missing or unknown token, by its peer's address.
    Peer(IpAddr),
}

/// The server's buckets.
#[derive(Debug)]
pub struct RateLimiter {
    epoch: tokio::time::Instant,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    tokens: Buckets<String>,
    peers: Buckets<IpAddr>,
    /// When both maps were last swept.
    swept_ms: u64,
}

impl Default for RateLimiter {
    fn default() -> Self {
        RateLimiter::with_caps(MAX_TOKEN_BUCKETS, MAX_PEER_BUCKETS)
    }
}

impl RateLimiter {
    /// A limiter with other caps than [`MAX_TOKEN_BUCKETS`] and [`MAX_PEER_BUCKETS`].
    pub fn with_caps(tokens: usize, peers: usize) -> RateLimiter {
        RateLimiter {
            epoch: tokio::time::Instant::now(),
            inner: Mutex::new(Inner {
                tokens: Buckets::new(tokens),
                peers: Buckets::new(peers),
                swept_ms: 0,
            }),
        }
    }

    /// Milliseconds since the limiter was made, on the monotonic clock.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Charges one request to `caller` under `limit`.
    pub fn take(&self, caller: Caller<'_>, limit: Limit) -> Result<(), Refused> {
        self.take_at(caller, limit, self.now_ms())
    }

    /// [`RateLimiter::take`] at `now_ms`.
    pub fn take_at(&self, caller: Caller<'_>, limit: Limit, now_ms: u64) -> Result<(), Refused> {
        if limit.is_unlimited() {
            return Ok(());
        }
        // A poisoned lock only means a panic elsewhere mid-update; the buckets are still sound.
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if now_ms.saturating_sub(inner.swept_ms) >= SWEEP_INTERVAL_MS {
            inner.tokens.sweep(now_ms);
            inner.peers.sweep(now_ms);
            inner.swept_ms = now_ms;
        }
        match caller {
            Caller::Token(digest) => {
                // The digest is looked up without an allocation; only a new bucket copies it.
                if let Some(b) = inner.tokens.map.get_mut(digest) {
                    b.limit = limit;
                    return b.take(now_ms);
                }
                inner.tokens.take(&digest.to_string(), limit, now_ms)
            }
            Caller::Peer(ip) => inner.peers.take(&ip, limit, now_ms),
        }
    }

    /// Token buckets and peer buckets held now.
    pub fn bucket_counts(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (inner.tokens.map.len(), inner.peers.map.len())
    }
}

/// Charges a request to its caller's bucket: a known token's own, or (a missing or unknown
/// token) its peer address's. A lookup that failed otherwise (a poisoned lock) is not charged:
/// the handler answers it.
pub fn charge(
    limits: &RateLimits,
    limiter: &RateLimiter,
    who: &Result<(Principal, String), ApiError>,
    peer: Option<IpAddr>,
) -> Result<(), ApiError> {
    let (caller, limit, name) = match who {
        Ok((p, digest)) => {
            let limit = match p {
                Principal::Admin | Principal::Token { .. } => limits.admin,
                Principal::Joiner => limits.join,
                // Host credentials, and the one-time tokens one machine registers with.
                _ => limits.host,
            };
            (Caller::Token(digest), limit, None)
        }
        Err(ApiError::Domain(Error::Unauthorized(_))) => match peer {
            Some(ip) => (Caller::Peer(ip), limits.unknown_per_ip, Some(ip)),
            None => return Ok(()),
        },
        Err(_) => return Ok(()),
    };
    limiter.take(caller, limit).map_err(|r| ApiError::TooManyRequests {
        who: match (who, name) {
            (Ok((p, _)), _) => p.describe(),
            (_, Some(ip)) => format!("requests without a known token from {ip}"),
            _ => "this caller".into(),
        },
        per_second: r.limit.per_second,
        burst: r.limit.burst,
        retry_after_s: r.retry_after_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    #[test]
    fn a_full_bucket_takes_its_burst_then_refuses_until_it_refills() {
        let limit = Limit::new(2, 5);
        let mut b = Bucket::new(limit, 0);
        for i in 0..5 {
            assert_eq!(b.take(0), Ok(()), "request {i} of the burst");
        }
        // Empty: one request comes back every 500 ms, so the wait rounds up to 1 s.
        assert_eq!(b.take(0), Err(Refused { retry_after_s: 1, limit }));
        assert_eq!(b.take(499), Err(Refused { retry_after_s: 1, limit }));
        assert_eq!(b.take(500), Ok(()));
        assert!(b.take(500).is_err());
        // 1 s refills 2: two pass, the third does not.
        assert_eq!(b.take(1500), Ok(()));
        assert_eq!(b.take(1500), Ok(()));
        assert!(b.take(1500).is_err());
        // Never more than the burst, however long it waits.
        let mut later = 1_000_000;
        for _ in 0..5 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
        later += 2500;
        assert!(b.is_full(later));
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        let limit = Limit::new(1, 1);
        let mut b = Bucket::new(limit, 0);
        assert_eq!(b.take(0), Ok(()));
        assert_eq!(b.take(0).unwrap_err().retry_after_s, 1);
        assert_eq!(b.take(999).unwrap_err().retry_after_s, 1);
        assert_eq!(b.take(1000), Ok(()));
        // A fast one still says 1 s, never 0.
        let mut b = Bucket::new(Limit::new(20_000, 1), 0);
        b.take(0).unwrap();
        assert_eq!(b.take(0).unwrap_err().retry_after_s, 1);
        assert_eq!(b.take(1), Ok(()));
    }

    #[test]
    fn zero_per_second_is_no_limit_and_a_zero_burst_still_holds_one() {
        let limiter = RateLimiter::default();
        for _ in 0..10_000 {
            assert!(limiter.take_at(Caller::Peer(IP), Limit::new(0, 0), 0).is_ok());
        }
        assert_eq!(limiter.bucket_counts(), (0, 0), "no bucket for an unlimited caller");
        let mut b = Bucket::new(Limit::new(1, 0), 0);
        assert_eq!(b.take(0), Ok(()));
        assert!(b.take(0).is_err());
    }

    #[test]
    fn time_running_backwards_refills_nothing() {
        let mut b = Bucket::new(Limit::new(1, 1), 5_000);
        b.take(5_000).unwrap();
        assert!(b.take(1_000).is_err());
        assert!(b.take(5_999).is_err());
        assert_eq!(b.take(6_000), Ok(()));
    }

    #[test]
    fn callers_have_their_own_buckets() {
        let limiter = RateLimiter::default();
        let limit = Limit::new(1, 3);
        for _ in 0..3 {
            limiter.take_at(Caller::Token("aa"), limit, 0).unwrap();
        }
        assert!(limiter.take_at(Caller::Token("aa"), limit, 0).is_err());
        assert!(limiter.take_at(Caller::Token("bb"), limit, 0).is_ok());
        assert!(limiter.take_at(Caller::Peer(IP), limit, 0).is_ok());
        assert_eq!(limiter.bucket_counts(), (2, 1));
    }

    #[test]
    fn refilled_buckets_are_dropped_and_the_maps_never_pass_their_caps() {
        let limiter = RateLimiter::with_caps(100, 50);
        let limit = Limit::new(10, 20);
        // Many distinct callers at once: never more buckets than the caps.
        for i in 0..10_000u32 {
            let digest = format!("{i:064x}");
            limiter.take_at(Caller::Token(&digest), limit, u64::from(i / 100)).unwrap();
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(i));
            limiter.take_at(Caller::Peer(ip), limit, u64::from(i / 100)).unwrap();
            let (tokens, peers) = limiter.bucket_counts();
            assert!(tokens <= 100 && peers <= 50, "{tokens} token and {peers} peer buckets");
        }
        // Each bucket took one request: 100 ms later it is full again and the next sweep drops it.
        let later = 100 + SWEEP_INTERVAL_MS;
        limiter.take_at(Caller::Token("new"), limit, later).unwrap();
        assert_eq!(limiter.bucket_counts(), (1, 0));
    }

    #[test]
    fn a_bucket_still_refilling_survives_the_sweep() {
        let limiter = RateLimiter::with_caps(100, 100);
        let limit = Limit::new(1, 100);
        for _ in 0..50 {
            limiter.take_at(Caller::Token("busy"), limit, 0).unwrap();
        }
        limiter.take_at(Caller::Token("other"), limit, SWEEP_INTERVAL_MS).unwrap();
        assert_eq!(limiter.bucket_counts(), (2, 0), "60 of 100 refilled: kept");
        // Its state carried over: 50 left and 10 refilled.
        for _ in 0..60 {
            limiter.take_at(Caller::Token("busy"), limit, SWEEP_INTERVAL_MS).unwrap();
        }
        assert!(limiter.take_at(Caller::Token("busy"), limit, SWEEP_INTERVAL_MS).is_err());
    }

    #[test]
    fn the_monotonic_clock_drives_take() {
        let limiter = RateLimiter::default();
        let limit = Limit::new(1, 1);
        assert!(limiter.take(Caller::Token("t"), limit).is_ok());
        let refused = limiter.take(Caller::Token("t"), limit).unwrap_err();
        assert_eq!(refused, Refused { retry_after_s: 1, limit });
    }
}
