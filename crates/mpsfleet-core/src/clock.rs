//! The clock seam: all time in mpsfleet is read through [`Clock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place that reads the system clock
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
    }
}

/// The wall clock moved by a fixed skew: a server whose clock is off, for tests that inject
/// clock skew without touching the machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SkewedClock {
    pub skew_ms: i64,
}

impl Clock for SkewedClock {
    fn now_ms(&self) -> u64 {
        SystemClock.now_ms().saturating_add_signed(self.skew_ms)
    }
}

/// How long something took, for measurements only (metrics' latencies): a monotonic reading
/// that no decision depends on, so it stays outside the [`Clock`] seam.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    #[allow(clippy::disallowed_methods)] // a measurement, never a decision
    pub fn start() -> Stopwatch {
        Stopwatch(std::time::Instant::now())
    }

    pub fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }

    /// Whole milliseconds since it started.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Microseconds since the Unix epoch, for the `timeline` log lines only ([`timeline!`]):
/// a measurement of the recovery path that no decision reads.
#[allow(clippy::disallowed_methods)] // a measurement, never a decision
pub fn wall_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Logs one step of the recovery path at target `timeline`, level DEBUG (off at the default
/// levels; `MPSFLEET_LOG=error,timeline=debug` turns it on), with its wall time in `at_us`: the daemon's exit seen,
/// each local restart, the check sent and received, a copy decided, placed, its start
/// received and made, RUNNING reported and received. `bench recovery` reads them back from
/// the server's and agents' logs to break a recovery into its steps. The fields are only
/// evaluated when the target is on.
#[macro_export]
macro_rules! timeline {
    ($step:literal $(, $k:ident = $v:expr)* $(,)?) => {
        tracing::debug!(target: "timeline", $($k = %$v,)* at_us = $crate::clock::wall_us(), $step)
    };
}

/// A clock that moves only when told to; for tests and the simulator.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self(AtomicU64::new(start_ms))
    }
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
