//! The per-GPU `GPU` check: the GPU itself is at fault when NVML reports a host-fatal Xid, a
//! rise in its volatile uncorrected ECC count, pages pending retirement, or the GPU lost.
//!
//! The rules and the per-GPU state machine ([`GpuHealth::step`]) are pure. [`GpuWatch`] is the
//! shell: with NVML, one thread per GPU waits for critical Xid events and reads the ECC
//! counters; with emulated GPUs, one thread follows `<data-dir>/gpu-events`, where a drill or
//! a test appends lines `INDEX XID` (e.g. `0 79`). A GPU that turned IMPAIRED stays IMPAIRED:
//! it needs a reset, and the server decides what to do about it.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mpsfleet_core::clock::Clock;
use mpsfleet_types::{GpuUuid, HealthStatus, HostCheck};

use crate::discovery::Discovered;

/// The check's name in status reports.
pub const CHECK: &str = mpsfleet_core::health::GPU;
/// The emulated GPUs' event file, in the agent's data dir.
pub const EVENTS_FILE: &str = "gpu-events";

/// Xids that mean the GPU (or its memory, link or firmware) is at fault: the GPU needs a reset.
/// From NVIDIA's Xid catalogue.
const HOST_FATAL_XIDS: &[(u64, &str)] = &[
    (48, "double-bit ECC error"),
    (63, "ECC page retirement or row remapping event"),
    (64, "ECC page retirement or row remapping failure"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (140, "unrecovered ECC error"),
];

/// Xids a CUDA program causes (it faulted; the GPU is fine). Listed to say so: every Xid not
/// in [`HOST_FATAL_XIDS`] leaves the check as it is.
const APPLICATION_XIDS: &[(u64, &str)] = &[
    (13, "graphics engine exception"),
    (31, "GPU memory page fault"),
    (43, "GPU stopped processing"),
    (45, "preemptive cleanup, due to previous errors"),
];

/// What a host-fatal Xid means; `None` for every other Xid.
pub fn host_fatal(xid: u64) -> Option<&'static str> {
    HOST_FATAL_XIDS.iter().find(|(x, _)| *x == xid).map(|(_, what)| *what)
}

/// What an Xid means, when the catalogue above knows it.
pub fn describe_xid(xid: u64) -> Option<&'static str> {
    host_fatal(xid).or_else(|| APPLICATION_XIDS.iter().find(|(x, _)| *x == xid).map(|(_, what)| *what))
}

/// The ECC rule: any rise of the volatile uncorrected ECC count over `baseline` (the count
/// when the agent started watching) impairs the GPU.
pub fn ecc_fault(baseline: u64, count: u64) -> Option<String> {
    (count > baseline).then(|| {
        format!("volatile uncorrected ECC errors rose from {baseline} to {count} since the agent started")
    })
}

/// The GPU check as the agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub status: HealthStatus,
    pub reason: String,
    /// When `status` last changed.
    pub since_ms: u64,
}

/// What a source observed about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The source is watching; the text says what (an OK check's reason).
    Watching(String),
    /// The source cannot watch now (the NVML error).
    Unavailable(String),
    /// A critical Xid.
    Xid(u64),
    /// The volatile uncorrected ECC count now.
    UncorrectedEcc(u64),
    /// NVML reports pages pending retirement.
    PendingRetirement,
    /// NVML reports the GPU lost (fallen off the bus or otherwise inaccessible).
    Lost(String),
}

/// One GPU's check and what the ECC rule remembers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHealth {
    pub check: Check,
    /// The first volatile uncorrected ECC count seen (lowered when the driver resets it).
    ecc_baseline: Option<u64>,
}

impl GpuHealth {
    /// INITIALIZING until the source says it watches.
    pub fn new(now_ms: u64) -> Self {
        let check = Check {
            status: HealthStatus::Initializing,
            reason: "starting the GPU watch".into(),
            since_ms: now_ms,
        };
        Self { check, ecc_baseline: None }
    }

    /// Applies `event` at `now_ms`; returns whether the status changed. IMPAIRED is final.
    pub fn step(&mut self, event: &Event, now_ms: u64) -> bool {
        if self.check.status == HealthStatus::Impaired {
            return false;
        }
        let (status, reason) = match event {
            Event::Watching(what) => (HealthStatus::Ok, what.clone()),
            Event::Unavailable(error) => (HealthStatus::InsufficientData, error.clone()),
            Event::Xid(xid) => match host_fatal(*xid) {
                Some(what) => (HealthStatus::Impaired, format!("Xid {xid}: {what}")),
                None => return false,
            },
            Event::UncorrectedEcc(count) => {
                let baseline = match self.ecc_baseline {
                    Some(b) if b <= *count => b,
                    // First reading, or the driver reset the volatile counters.
                    _ => {
                        self.ecc_baseline = Some(*count);
                        return false;
                    }
                };
                match ecc_fault(baseline, *count) {
                    Some(reason) => (HealthStatus::Impaired, reason),
                    None => return false,
                }
            }
            Event::PendingRetirement => {
                (HealthStatus::Impaired, "pages pending retirement (ECC); the GPU needs a reset".into())
            }
            Event::Lost(error) => (HealthStatus::Impaired, format!("GPU lost: {error}")),
        };
        let changed = status != self.check.status;
        if changed {
            self.check.since_ms = now_ms;
        }
        self.check.status = status;
        self.check.reason = reason;
        changed
    }
}

/// Parses one line of the emulated event file: `INDEX XID`. Blank lines and `#` comments are
/// `None`.
pub fn parse_event_line(line: &str) -> Result<Option<(u32, u64)>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let mut words = line.split_whitespace();
    let (Some(index), Some(xid), None) = (words.next(), words.next(), words.next()) else {
        return Err(format!("{line:?}: expected INDEX XID, e.g. 0 79"));
    };
    let index = index.parse().map_err(|_| format!("{line:?}: INDEX must be a GPU index"))?;
    let xid = xid.parse().map_err(|_| format!("{line:?}: XID must be a number"))?;
    Ok(Some((index, xid)))
}

/// How long one wait for an Xid event lasts (and so how soon a stop is noticed).
const WAIT: Duration = Duration::from_secs(1);
/// How often the ECC counters are read.
const ECC_EVERY: Duration = Duration::from_secs(5);
/// The pause before watching again after an NVML error.
const RETRY: Duration = Duration::from_secs(5);
/// How often the emulated event file is read.
const POLL: Duration = Duration::from_millis(200);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Shared {
    /// The GPUs watched, with their index.
    gpus: Vec<(GpuUuid, u32)>,
    /// One state per entry of `gpus`.
    health: Mutex<Vec<GpuHealth>>,
    clock: Arc<dyn Clock>,
    stopping: AtomicBool,
    /// A drill's failed checks, by GPU, read instead of the watch's own while they last.
    injected: Mutex<std::collections::BTreeMap<GpuUuid, Check>>,
}

impl Shared {
    fn apply(&self, gpu: usize, event: Event) {
        let (uuid, index) = &self.gpus[gpu];
        if let Event::Xid(xid) = event {
            if host_fatal(xid).is_none() {
                let what = describe_xid(xid).unwrap_or("not a host-fatal Xid");
                tracing::info!(gpu.uuid = %uuid, gpu.index = index, xid, what, "Xid not counted against the GPU");
            }
        }
        let mut health = lock(&self.health);
        if health[gpu].step(&event, self.clock.now_ms()) {
            let c = &health[gpu].check;
            if c.status == HealthStatus::Ok {
                tracing::info!(gpu.uuid = %uuid, gpu.index = index, reason = %c.reason, "GPU check OK");
            } else {
                tracing::warn!(gpu.uuid = %uuid, gpu.index = index, status = ?c.status, reason = %c.reason, "GPU check changed");
            }
        }
    }

    fn apply_all(&self, event: &Event) {
        for gpu in 0..self.gpus.len() {
            self.apply(gpu, event.clone());
        }
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Sleeps for `d`, or less when stopping.
    fn pause(&self, d: Duration) {
        let step = Duration::from_millis(100);
        let mut left = d;
        while !left.is_zero() && !self.stopping() {
            std::thread::sleep(left.min(step));
            left = left.saturating_sub(step);
        }
    }
}

/// Watches every GPU of the host and keeps its `GPU` check; the threads stop when this is
/// dropped.
pub struct GpuWatch {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for GpuWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuWatch").field("checks", &self.checks()).finish()
    }
}

impl GpuWatch {
    /// Starts watching `found`'s GPUs: through NVML, or for emulated GPUs through
    /// `<data_dir>/gpu-events` (only lines appended from now on count, as NVML delivers only
    /// new events).
    pub fn start(found: &Discovered, data_dir: &Path, clock: Arc<dyn Clock>) -> std::io::Result<GpuWatch> {
        let now = clock.now_ms();
        let shared = Arc::new(Shared {
            gpus: found.gpus.iter().map(|g| (g.uuid.clone(), g.index)).collect(),
            health: Mutex::new(found.gpus.iter().map(|_| GpuHealth::new(now)).collect()),
            clock,
            stopping: AtomicBool::new(false),
            injected: Mutex::new(std::collections::BTreeMap::new()),
        });
        let builder = std::thread::Builder::new().name("gpu-watch".into());
        if found.emulated {
            let path = data_dir.join(EVENTS_FILE);
            shared.apply_all(&Event::Watching(format!("emulated GPU: events from {}", path.display())));
            let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
            let s = shared.clone();
            builder.spawn(move || follow_events_file(&s, &path, offset))?;
        } else {
            let s = shared.clone();
            builder.spawn(move || nvml::watch(&s))?;
        }
        Ok(GpuWatch { shared })
    }

    /// A drill's failed GPU check on `gpu`, as a host-fatal Xid would report it, or none: the
    /// check reads IMPAIRED from now until the drill takes it back, when it reads what the
    /// watch itself sees again. Injecting it again keeps its first time.
    pub fn inject(&self, gpu: &GpuUuid, fault: Option<&str>) {
        let mut injected = lock(&self.shared.injected);
        match fault {
            Some(why) => {
                let since_ms = self.shared.clock.now_ms();
                injected.entry(gpu.clone()).or_insert_with(|| {
                    tracing::warn!(gpu = %gpu, "drill: the GPU check reports a failure");
                    Check { status: HealthStatus::Impaired, reason: why.to_string(), since_ms }
                });
            }
            None => {
                if injected.remove(gpu).is_some() {
                    tracing::info!(gpu = %gpu, "drill: the GPU check's failure taken back");
                }
            }
        }
    }

    /// One `GPU` check per GPU; an IMPAIRED one says how long ago it turned so: a host-fatal
    /// Xid is its first failed signal.
    pub fn checks(&self) -> Vec<HostCheck> {
        let now_ms = self.shared.clock.now_ms();
        let health = lock(&self.shared.health);
        let injected = lock(&self.shared.injected);
        self.shared
            .gpus
            .iter()
            .zip(health.iter())
            .map(|((uuid, _), h)| (uuid, injected.get(uuid).unwrap_or(&h.check)))
            .map(|(uuid, c)| HostCheck {
                name: CHECK.into(),
                gpu_id: Some(uuid.clone()),
                status: c.status,
                reason: c.reason.clone(),
                since_ms: c.since_ms,
                restarts: 0,
                first_failure_age_ms: (c.status == HealthStatus::Impaired)
                    .then(|| now_ms.saturating_sub(c.since_ms)),
                repair_ages_ms: Vec::new(),
            })
            .collect()
    }
}

impl Drop for GpuWatch {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }
}

/// Reads the lines appended to `path` after `offset`, every [`POLL`], and applies their Xids.
/// A line counts once it ends with a newline; a file that shrank is read again from its start.
fn follow_events_file(shared: &Shared, path: &Path, mut offset: u64) {
    let mut last_error: Option<String> = None;
    while !shared.stopping() {
        match read_complete_lines(path, &mut offset) {
            Ok(text) => {
                last_error = None;
                for line in text.lines() {
                    match parse_event_line(line) {
                        Ok(Some((index, xid))) => match shared.gpus.iter().position(|(_, i)| *i == index) {
                            Some(gpu) => shared.apply(gpu, Event::Xid(xid)),
                            None => {
                                tracing::warn!(path = %path.display(), index, "gpu-events: no GPU with this index")
                            }
                        },
                        Ok(None) => {}
                        Err(e) => tracing::warn!(path = %path.display(), "gpu-events: {e}"),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => offset = 0,
            Err(e) => {
                let e = e.to_string();
                if last_error.as_ref() != Some(&e) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read gpu-events");
                    last_error = Some(e);
                }
            }
        }
        shared.pause(POLL);
    }
}

/// The complete lines after `offset`, which moves past them.
fn read_complete_lines(path: &Path, offset: &mut u64) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    if f.metadata()?.len() < *offset {
        *offset = 0;
    }
    f.seek(SeekFrom::Start(*offset))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    bytes.truncate(complete);
    *offset += complete as u64;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The NVML source. It can only run where there is a GPU; every NVML error makes the check
/// INSUFFICIENT_DATA with the error text (IMPAIRED when NVML says the GPU is lost), and the
/// watch starts again after [`RETRY`].
mod nvml {
    use super::{Event, Shared, ECC_EVERY, RETRY, WAIT};
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::{NvmlError, NvmlErrorWithSource};
    use nvml_wrapper::Nvml;

    pub(super) fn watch(shared: &Shared) {
        let nvml = loop {
            match Nvml::init() {
                Ok(nvml) => break nvml,
                Err(e) => shared.apply_all(&Event::Unavailable(format!("NVML: {e}"))),
            }
            shared.pause(RETRY);
            if shared.stopping() {
                return;
            }
        };
        std::thread::scope(|scope| {
            for gpu in 0..shared.gpus.len() {
                let nvml = &nvml;
                let spawned = std::thread::Builder::new()
                    .name(format!("gpu-watch-{}", shared.gpus[gpu].1))
                    .spawn_scoped(scope, move || watch_gpu(nvml, shared, gpu));
                if let Err(e) = spawned {
                    shared.apply(gpu, Event::Unavailable(format!("cannot start the GPU watch: {e}")));
                }
            }
        });
    }

    fn watch_gpu(nvml: &Nvml, shared: &Shared, gpu: usize) {
        while !shared.stopping() {
            if let Err(problem) = watch_once(nvml, shared, gpu) {
                shared.apply(gpu, problem);
                shared.pause(RETRY);
            }
        }
    }

    /// The event for an NVML error while doing `what`.
    fn problem(what: &str, e: &NvmlError) -> Event {
        match e {
            NvmlError::GpuLost => Event::Lost(format!("NVML: {what}: {e}")),
            _ => Event::Unavailable(format!("NVML: {what}: {e}")),
        }
    }

    /// Watches until stopping (`Ok`) or until an NVML error (the event to apply).
    fn watch_once(nvml: &Nvml, shared: &Shared, gpu: usize) -> Result<(), Event> {
        let uuid = shared.gpus[gpu].0.as_str();
        let device = nvml.device_by_uuid(uuid).map_err(|e| problem("cannot open the GPU", &e))?;
        let registered = nvml
            .create_event_set()
            .map_err(NvmlErrorWithSource::from)
            .and_then(|set| device.register_events(EventTypes::CRITICAL_XID_ERROR, set));
        let events = match registered {
            Ok(set) => Some(set),
            Err(e) if matches!(e.error, NvmlError::NotSupported) => None,
            Err(e) => return Err(problem("cannot register for Xid events", &e.error)),
        };
        let mut ecc_supported = true;
        let mut next_ecc_ms = 0;
        while !shared.stopping() {
            let now = shared.clock.now_ms();
            if now >= next_ecc_ms {
                next_ecc_ms = now + ECC_EVERY.as_millis() as u64;
                match device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                    Ok(count) => shared.apply(gpu, Event::UncorrectedEcc(count)),
                    Err(NvmlError::NotSupported) => ecc_supported = false,
                    Err(e) => return Err(problem("cannot read the ECC counters", &e)),
                }
                match device.are_pages_pending_retired() {
                    Ok(true) => shared.apply(gpu, Event::PendingRetirement),
                    Ok(false) | Err(NvmlError::NotSupported) => {}
                    Err(e) => return Err(problem("cannot read the page retirement status", &e)),
                }
            }
            let xid = if events.is_some() { "no host-fatal Xid" } else { "Xid events not supported" };
            let ecc = if ecc_supported {
                "volatile uncorrected ECC count unchanged"
            } else {
                "ECC counters not supported"
            };
            shared.apply(gpu, Event::Watching(format!("{xid}; {ecc}")));
            match &events {
                Some(set) => match set.wait(WAIT.as_millis() as u32) {
                    Ok(data) => match data.event_data {
                        Some(XidError::Value(xid)) => shared.apply(gpu, Event::Xid(xid)),
                        other => {
                            tracing::info!(gpu.uuid = %uuid, event = ?other, "NVML event without an Xid value")
                        }
                    },
                    Err(NvmlError::Timeout) => {}
                    Err(e) => return Err(problem("waiting for Xid events", &e)),
                },
                None => shared.pause(WAIT),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthStatus::{Impaired, Initializing, InsufficientData};
    const OK: HealthStatus = HealthStatus::Ok;

    #[test]
    fn host_fatal_xids_impair_and_application_xids_do_not() {
        for xid in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140] {
            assert!(host_fatal(xid).is_some(), "Xid {xid} is host-fatal");
        }
        for xid in [13, 31, 43, 45, 0, 1, 999] {
            assert_eq!(host_fatal(xid), None, "Xid {xid} is not host-fatal");
        }
        assert_eq!(describe_xid(13), Some("graphics engine exception"));
        assert_eq!(describe_xid(79), Some("GPU has fallen off the bus"));
        assert_eq!(describe_xid(12345), None);
    }

    #[test]
    fn the_ecc_rule_is_any_rise_since_the_start() {
        assert_eq!(ecc_fault(0, 0), None);
        assert_eq!(ecc_fault(3, 3), None);
        assert_eq!(ecc_fault(5, 2), None);
        let reason = ecc_fault(3, 4).unwrap();
        assert!(reason.contains("from 3 to 4"), "{reason}");
    }

    /// Runs `events` (at their times) from a fresh state and compares the check.
    fn check(events: &[(u64, Event)], want: (HealthStatus, &str, u64)) {
        let mut h = GpuHealth::new(0);
        for (at, e) in events {
            h.step(e, *at);
        }
        let (status, fragment, since) = want;
        assert_eq!(h.check.status, status, "{events:?} -> {:?}", h.check);
        assert!(h.check.reason.contains(fragment), "{events:?}: {:?} lacks {fragment:?}", h.check.reason);
        assert_eq!(h.check.since_ms, since, "{events:?} -> {:?}", h.check);
    }

    #[test]
    fn the_state_machine() {
        use Event::*;
        let watching = || Watching("no host-fatal Xid; ECC counters not supported".into());
        check(&[], (Initializing, "starting", 0));
        check(&[(10, watching())], (OK, "ECC counters not supported", 10));
        // The same status again keeps its since.
        check(&[(10, watching()), (20, watching())], (OK, "no host-fatal Xid", 10));
        // Application Xids change nothing.
        check(&[(10, watching()), (20, Xid(13)), (30, Xid(31)), (40, Xid(43)), (50, Xid(45))], (OK, "", 10));
        check(&[(10, watching()), (20, Xid(79))], (Impaired, "Xid 79: GPU has fallen off the bus", 20));
        check(&[(10, watching()), (20, Xid(48))], (Impaired, "Xid 48", 20));
        // IMPAIRED stays, whatever comes next: the first reason is kept.
        check(
            &[
                (10, watching()),
                (20, Xid(95)),
                (30, Xid(79)),
                (40, watching()),
                (50, Unavailable("NVML: x".into())),
                (60, UncorrectedEcc(0)),
            ],
            (Impaired, "Xid 95", 20),
        );
        // NVML errors: INSUFFICIENT_DATA with the error, OK again when watching again.
        check(
            &[(10, watching()), (20, Unavailable("NVML: Unknown Error".into()))],
            (InsufficientData, "Unknown Error", 20),
        );
        check(
            &[(10, watching()), (20, Unavailable("NVML: e".into())), (30, watching())],
            (OK, "no host-fatal Xid", 30),
        );
        // A fatal event while data is missing still impairs.
        check(&[(20, Unavailable("NVML: e".into())), (30, Xid(74))], (Impaired, "NVLink", 30));
        check(&[(20, Lost("NVML: waiting for Xid events: GPU lost".into()))], (Impaired, "GPU lost", 20));
        check(&[(10, watching()), (20, PendingRetirement)], (Impaired, "pending retirement", 20));
    }

    #[test]
    fn ecc_counts_are_compared_with_the_first_reading() {
        use Event::*;
        let watching = || Watching("no host-fatal Xid; volatile uncorrected ECC count unchanged".into());
        // A count already there at the start is the baseline, not a fault.
        check(&[(10, UncorrectedEcc(7)), (10, watching()), (20, UncorrectedEcc(7))], (OK, "unchanged", 10));
        check(
            &[(10, UncorrectedEcc(7)), (10, watching()), (20, UncorrectedEcc(7)), (30, UncorrectedEcc(9))],
            (Impaired, "rose from 7 to 9", 30),
        );
        // A driver reload resets the volatile counts: the lower count is the new baseline.
        check(
            &[(10, UncorrectedEcc(7)), (10, watching()), (20, UncorrectedEcc(0)), (30, UncorrectedEcc(1))],
            (Impaired, "rose from 0 to 1", 30),
        );
    }

    #[test]
    fn event_lines_parse() {
        assert_eq!(parse_event_line("0 79"), Ok(Some((0, 79))));
        assert_eq!(parse_event_line("  3\t13  "), Ok(Some((3, 13))));
        assert_eq!(parse_event_line(""), Ok(None));
        assert_eq!(parse_event_line("# a drill"), Ok(None));
        for bad in ["79", "0 79 1", "a 79", "0 x", "-1 79"] {
            assert!(parse_event_line(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_complete_lines_are_read_and_a_truncated_file_is_read_again() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EVENTS_FILE);
        let mut offset = 0;
        assert!(read_complete_lines(&path, &mut offset).is_err());
        let mut f = std::fs::File::create(&path).unwrap();
        write!(f, "0 79\n1 1").unwrap();
        assert_eq!(read_complete_lines(&path, &mut offset).unwrap(), "0 79\n");
        writeln!(f, "3").unwrap();
        assert_eq!(read_complete_lines(&path, &mut offset).unwrap(), "1 13\n");
        assert_eq!(read_complete_lines(&path, &mut offset).unwrap(), "");
        std::fs::write(&path, "2 48\n").unwrap();
        assert_eq!(read_complete_lines(&path, &mut offset).unwrap(), "2 48\n");
    }

    #[test]
    fn emulated_gpus_follow_the_events_file() {
        let dir = tempfile::tempdir().unwrap();
        let found = crate::discovery::declared("H200:1000:2", "t").unwrap();
        let clock = Arc::new(mpsfleet_core::clock::ManualClock::new(1_000));
        let watch = GpuWatch::start(&found, dir.path(), clock.clone()).unwrap();
        let checks = watch.checks();
        assert_eq!(checks.len(), 2);
        for c in &checks {
            assert_eq!((c.name.as_str(), c.status, c.since_ms), (CHECK, OK, 1_000));
            assert!(
                c.reason.starts_with("emulated GPU: events from ") && c.reason.ends_with(EVENTS_FILE),
                "{c:?}"
            );
        }
        clock.advance(Duration::from_secs(1));
        std::fs::write(dir.path().join(EVENTS_FILE), "1 13\n1 79\n").unwrap();
        let deadline = std::time::Duration::from_secs(10);
        let mut waited = Duration::ZERO;
        while watch.checks()[1].status != Impaired {
            assert!(waited < deadline, "{:?}", watch.checks());
            std::thread::sleep(Duration::from_millis(50));
            waited += Duration::from_millis(50);
        }
        let checks = watch.checks();
        assert_eq!(checks[0].status, OK);
        assert_eq!(checks[1].gpu_id.as_ref(), Some(&found.gpus[1].uuid));
        assert_eq!(
            (checks[1].reason.as_str(), checks[1].since_ms),
            ("Xid 79: GPU has fallen off the bus", 2_000)
        );
    }
}
