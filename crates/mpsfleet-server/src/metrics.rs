//! The server's Prometheus metrics, `GET /metrics` (a `viewer` token, or any role above it).
//!
//! Two kinds, in one answer (Prometheus text format 0.0.4):
//!
//! - **Live instruments** ([`Live`]), counted where things happen: API requests by route
//!   template and status, with their latency; placements and how long tasks waited for them;
//!   store commit latency; incidents opened, blocked and resolved, with the time to detect,
//!   decide and recover.
//! - **State** ([`State`]), read from the cluster under its lock at each scrape: hosts, GPUs,
//!   MPS memory and clients, tasks, pending tasks by reason code, services, deployments,
//!   incidents, the storm breaker, leadership.
//!
//! **Cardinality budget.** Every label here takes values from a bounded set: pools, a status
//! enum, a route template (never a path: `/v1/tasks/{id}`), an HTTP method and status, a
//! pending code, a service name. No series is per host, per GPU or per task: those belong to
//! the agents' `/metrics` (`mpsfleet-agent`'s `metrics.rs`). So the answer grows with pools and
//! services, not with the fleet: `bench metrics` scrapes it at 20,000 hosts of 8 GPUs
//! (docs/metrics.md, docs/benchmarks.md), and a test holds the series count of a large fleet
//! to that of a small one.

use mpsfleet_types::{PendingCode, SharingMode, TaskStatus};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;

/// The answer's content type.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    route: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DrillLabels {
    pool: String,
    /// `within-bounds`, `breached` or `aborted`.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PreemptionLabels {
    pool: String,
    /// The stopped task's priority band (`low`, `normal`, `high`).
    band: &'static str,
    /// The band of the task it made room for.
    for_band: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreachLabels {
    pool: String,
    phase: &'static str,
    /// The cause's name, or `unexplained`.
    cause: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn api_buckets() -> Histogram {
    // 0.5 ms to 33 s.
    Histogram::new(exponential_buckets(0.0005, 4.0, 9))
}

fn wait_buckets() -> Histogram {
    // 1 ms to about 17 min.
    Histogram::new(exponential_buckets(0.001, 4.0, 11))
}

fn commit_buckets() -> Histogram {
    // 0.1 ms to 1.6 s.
    Histogram::new(exponential_buckets(0.0001, 4.0, 8))
}

fn incident_buckets() -> Histogram {
    Histogram::new([1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0])
}

/// The counters and histograms, shared by the API layer and the cluster.
pub struct Live {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Histograms<RouteLabels>,
    placements: Family<PoolLabels, Counter>,
    placement_wait: Histograms<PoolLabels>,
    commit_seconds: Histogram,
    commit_failures: Counter,
    opened: Family<PoolLabels, Counter>,
    blocked: Family<PoolLabels, Counter>,
    resolved: Family<PoolLabels, Counter>,
    detect: Histograms<PoolLabels>,
    decide: Histograms<PoolLabels>,
    recover: Histograms<PoolLabels>,
    breaches: Family<BreachLabels, Counter>,
    drill_incidents: Family<PoolLabels, Counter>,
    drills: Family<DrillLabels, Counter>,
    preemptions: Family<PreemptionLabels, Counter>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Default for Live {
    fn default() -> Live {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let request_seconds = Histograms::<RouteLabels>::new_with_constructor(api_buckets);
        let placements = Family::<PoolLabels, Counter>::default();
        let placement_wait = Histograms::<PoolLabels>::new_with_constructor(wait_buckets);
        let commit_seconds = commit_buckets();
        let commit_failures = Counter::default();
        let opened = Family::<PoolLabels, Counter>::default();
        let blocked = Family::<PoolLabels, Counter>::default();
        let resolved = Family::<PoolLabels, Counter>::default();
        let detect = Histograms::<PoolLabels>::new_with_constructor(incident_buckets);
        let decide = Histograms::<PoolLabels>::new_with_constructor(incident_buckets);
        let recover = Histograms::<PoolLabels>::new_with_constructor(incident_buckets);
        let breaches = Family::<BreachLabels, Counter>::default();
        let drill_incidents = Family::<PoolLabels, Counter>::default();
        let drills = Family::<DrillLabels, Counter>::default();
        let preemptions = Family::<PreemptionLabels, Counter>::default();
        // Counters are registered without `_total`: the encoder adds it.
        registry.register(
            "mpsfleet_api_requests",
            "API requests answered, by route template and status",
            requests.clone(),
        );
        registry.register(
            "mpsfleet_api_request_duration_seconds",
            "Time to answer an API request, by route template",
            request_seconds.clone(),
        );
        registry.register("mpsfleet_placements", "Tasks placed on a host", placements.clone());
        registry.register(
            "mpsfleet_placement_wait_seconds",
            "Time from a task's creation to its placement",
            placement_wait.clone(),
        );
        registry.register(
            "mpsfleet_store_commit_duration_seconds",
            "Time to commit one batch to the store",
            commit_seconds.clone(),
        );
        registry.register(
            "mpsfleet_store_commit_failures",
            "Store commits that failed",
            commit_failures.clone(),
        );
        registry.register("mpsfleet_incidents_opened", "Incidents opened", opened.clone());
        registry.register("mpsfleet_incidents_blocked", "Times an incident became BLOCKED", blocked.clone());
        registry.register("mpsfleet_incidents_resolved", "Incidents resolved", resolved.clone());
        registry.register(
            "mpsfleet_incident_detect_seconds",
            "First failure evidence to the incident's DETECTED",
            detect.clone(),
        );
        registry.register("mpsfleet_incident_decide_seconds", "DETECTED to DECIDED", decide.clone());
        registry.register(
            "mpsfleet_incident_recover_seconds",
            "DETECTED to the tasks running again (or RESOLVED when none moved)",
            recover.clone(),
        );
        registry.register(
            "mpsfleet_recovery_bound_breaches",
            "Phases of incidents that ran past their recovery bound, by phase and cause",
            breaches.clone(),
        );
        registry.register("mpsfleet_drill_incidents", "Incidents a drill caused", drill_incidents.clone());
        registry.register("mpsfleet_drills", "Drills ended, by result", drills.clone());
        registry.register(
            "mpsfleet_preemptions",
            "Tasks stopped to make room for higher-priority ones, by the stopped task's priority band and the band it made room for",
            preemptions.clone(),
        );
        Live {
            registry,
            requests,
            request_seconds,
            placements,
            placement_wait,
            commit_seconds,
            commit_failures,
            opened,
            blocked,
            resolved,
            detect,
            decide,
            recover,
            breaches,
            drill_incidents,
            drills,
            preemptions,
        }
    }
}

/// A method as a label: the API's own, else `OTHER` (a client picks the method).
fn method_label(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::HEAD => "HEAD",
        _ => "OTHER",
    }
}

fn pool(p: &mpsfleet_types::PoolName) -> PoolLabels {
    PoolLabels { pool: p.to_string() }
}

impl Live {
    /// One answered request: `method` its label (`GET`, …, `OTHER`), `route` the matched
    /// route's template. Plain values: the HTTP layer's types stay in the HTTP layer.
    pub fn request(&self, method: &'static str, route: &str, code: u16, seconds: f64) {
        self.requests.get_or_create(&RequestLabels { method, route: route.to_string(), code }).inc();
        self.request_seconds
            .get_or_create(&RouteLabels { method, route: route.to_string() })
            .observe(seconds);
    }

    /// A task placed, `waited_ms` after it was created.
    pub fn placed(&self, p: &mpsfleet_types::PoolName, waited_ms: u64) {
        let l = pool(p);
        self.placements.get_or_create(&l).inc();
        self.placement_wait.get_or_create(&l).observe(waited_ms as f64 / 1000.0);
    }

    pub fn committed(&self, seconds: f64, ok: bool) {
        self.commit_seconds.observe(seconds);
        if !ok {
            self.commit_failures.inc();
        }
    }

    /// A drill ended with `verdict`.
    pub fn drill_ended(
        &self,
        p: &mpsfleet_types::PoolName,
        verdict: Option<&mpsfleet_types::drill::DrillVerdict>,
    ) {
        use mpsfleet_types::drill::DrillVerdict;
        let result = match verdict {
            Some(DrillVerdict::WithinBounds) => "within-bounds",
            Some(DrillVerdict::Breached { .. }) => "breached",
            Some(DrillVerdict::Aborted { .. }) | None => "aborted",
        };
        self.drills.get_or_create(&DrillLabels { pool: p.to_string(), result }).inc();
    }

    /// A task of priority `victim` stopped to make room for one of priority `preemptor`.
    pub fn preempted(&self, p: &mpsfleet_types::PoolName, victim: u8, preemptor: u8) {
        use mpsfleet_types::priority::priority_band;
        let labels = PreemptionLabels {
            pool: p.to_string(),
            band: priority_band(victim),
            for_band: priority_band(preemptor),
        };
        self.preemptions.get_or_create(&labels).inc();
    }

    /// An incident written: `old` is what was stored before (None for a new one). Counts what
    /// the write changed, and each duration once, when it first becomes known.
    pub fn incident(&self, old: Option<&mpsfleet_types::Incident>, new: &mpsfleet_types::Incident) {
        use mpsfleet_types::IncidentState;
        let l = pool(&new.pool);
        let was = old.map(|o| (&o.state, o.durations()));
        let now = new.durations();
        let seconds = |ms: u64| ms as f64 / 1000.0;
        if old.is_none() {
            self.opened.get_or_create(&l).inc();
            if new.drill.is_some() {
                self.drill_incidents.get_or_create(&l).inc();
            }
        }
        let blocked = |s: &IncidentState| matches!(s, IncidentState::Blocked { .. });
        if blocked(&new.state) && !was.is_some_and(|(s, _)| blocked(s)) {
            self.blocked.get_or_create(&l).inc();
        }
        if new.state == IncidentState::Resolved && !was.is_some_and(|(s, _)| *s == IncidentState::Resolved) {
            self.resolved.get_or_create(&l).inc();
        }
        let before = was.map(|(_, d)| d).unwrap_or_default();
        let newly = |b: Option<u64>, n: Option<u64>| n.filter(|_| b.is_none());
        if let Some(ms) = newly(before.detect_ms, now.detect_ms) {
            self.detect.get_or_create(&l).observe(seconds(ms));
        }
        if let Some(ms) = newly(before.decide_ms, now.decide_ms) {
            self.decide.get_or_create(&l).observe(seconds(ms));
        }
        if let Some(ms) = newly(before.recover_ms, now.recover_ms) {
            self.recover.get_or_create(&l).observe(seconds(ms));
        }
        for b in new.breaches.iter().skip(old.map_or(0, |o| o.breaches.len())) {
            let cause = b.cause.map_or("unexplained", |c| c.as_str());
            let labels = BreachLabels { pool: new.pool.to_string(), phase: b.phase.as_str(), cause };
            self.breaches.get_or_create(&labels).inc();
        }
    }
}

/// The cluster's state as the metrics count it: aggregates by pool (see the module's budget).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct State {
    pub pools: BTreeMap<String, PoolState>,
    /// Whether this server is the one that runs the cluster (always, without etcd).
    pub leader: bool,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct PoolState {
    /// By lifecycle status and health.
    pub hosts: BTreeMap<(&'static str, &'static str), i64>,
    /// By sharing mode.
    pub gpus: BTreeMap<&'static str, i64>,
    pub gpu_memory_bytes: i64,
    /// MPS memory the placed tasks declared, on GPUs that take MPS tasks.
    pub mps_memory_reserved_bytes: i64,
    /// MPS memory left on GPUs that take MPS tasks.
    pub mps_memory_free_bytes: i64,
    pub mps_clients: i64,
    /// By last status.
    pub tasks: BTreeMap<&'static str, i64>,
    /// Waiting tasks by reason; a task not tried yet counts under None.
    pub pending: BTreeMap<Option<PendingCode>, i64>,
    pub services: BTreeMap<String, ServiceState>,
    pub deployments: BTreeMap<&'static str, i64>,
    pub incidents: BTreeMap<&'static str, i64>,
    pub storm_breaker_tripped: bool,
    /// With managed scaling: the provider's desired hosts and the last reservation computed
    /// (hosts needed as a percentage of hosts in the pool).
    pub scaling: Option<(i64, i64)>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct ServiceState {
    pub desired: i64,
    pub running: i64,
    pub healthy: i64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolStatus {
    pool: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    pool: String,
    status: &'static str,
    health: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    pool: String,
    sharing_mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PendingLabels {
    pool: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    pool: String,
    service: String,
}

const TASK_STATUSES: [TaskStatus; 8] = [
    TaskStatus::Provisioning,
    TaskStatus::Pending,
    TaskStatus::Activating,
    TaskStatus::Running,
    TaskStatus::Deactivating,
    TaskStatus::Stopping,
    TaskStatus::Deprovisioning,
    TaskStatus::Stopped,
];

const INCIDENT_STATES: [&str; 3] = ["OPEN", "REMEDIATING", "BLOCKED"];
const ROLLOUT_STATES: [&str; 3] = ["IN_PROGRESS", "COMPLETED", "FAILED"];

/// The whole answer: the state, then the live instruments.
pub fn render(state: &State, live: &Live) -> String {
    let mut r = Registry::default();
    let gauge = |r: &mut Registry, name: &str, help: &str, v: i64| {
        let g = Gauge::<i64>::default();
        g.set(v);
        r.register(name, help, g);
    };
    gauge(&mut r, "mpsfleet_leader", "1 when this server runs the cluster, else 0", i64::from(state.leader));
    let hosts = Family::<HostLabels, Gauge>::default();
    let gpus = Family::<GpuLabels, Gauge>::default();
    let gpu_memory = Family::<PoolLabels, Gauge>::default();
    let reserved = Family::<PoolLabels, Gauge>::default();
    let free = Family::<PoolLabels, Gauge>::default();
    let clients = Family::<PoolLabels, Gauge>::default();
    let tasks = Family::<PoolStatus, Gauge>::default();
    let pending = Family::<PendingLabels, Gauge>::default();
    let desired = Family::<ServiceLabels, Gauge>::default();
    let running = Family::<ServiceLabels, Gauge>::default();
    let healthy = Family::<ServiceLabels, Gauge>::default();
    let deployments = Family::<PoolStatus, Gauge>::default();
    let incidents = Family::<PoolStatus, Gauge>::default();
    let storm = Family::<PoolLabels, Gauge>::default();
    let scaling_desired = Family::<PoolLabels, Gauge>::default();
    let reservation = Family::<PoolLabels, Gauge>::default();
    for (name, p) in &state.pools {
        let l = PoolLabels { pool: name.clone() };
        let at = |status: &'static str| PoolStatus { pool: name.clone(), status };
        for ((status, health), n) in &p.hosts {
            let l = HostLabels { pool: name.clone(), status, health };
            hosts.get_or_create(&l).set(*n);
        }
        for mode in [SharingMode::Idle, SharingMode::NvidiaMps, SharingMode::Dedicated] {
            let l = GpuLabels { pool: name.clone(), sharing_mode: mode.as_str() };
            gpus.get_or_create(&l).set(p.gpus.get(mode.as_str()).copied().unwrap_or(0));
        }
        gpu_memory.get_or_create(&l).set(p.gpu_memory_bytes);
        reserved.get_or_create(&l).set(p.mps_memory_reserved_bytes);
        free.get_or_create(&l).set(p.mps_memory_free_bytes);
        clients.get_or_create(&l).set(p.mps_clients);
        for s in TASK_STATUSES {
            tasks.get_or_create(&at(s.as_str())).set(p.tasks.get(s.as_str()).copied().unwrap_or(0));
        }
        let codes = PendingCode::ALL.iter().map(|c| (Some(*c), c.as_str())).chain([(None, "NOT_TRIED")]);
        for (code, reason) in codes {
            let l = PendingLabels { pool: name.clone(), reason };
            pending.get_or_create(&l).set(p.pending.get(&code).copied().unwrap_or(0));
        }
        for (service, s) in &p.services {
            let l = ServiceLabels { pool: name.clone(), service: service.clone() };
            desired.get_or_create(&l).set(s.desired);
            running.get_or_create(&l).set(s.running);
            healthy.get_or_create(&l).set(s.healthy);
        }
        for s in ROLLOUT_STATES {
            deployments.get_or_create(&at(s)).set(p.deployments.get(s).copied().unwrap_or(0));
        }
        for s in INCIDENT_STATES {
            incidents.get_or_create(&at(s)).set(p.incidents.get(s).copied().unwrap_or(0));
        }
        storm.get_or_create(&l).set(i64::from(p.storm_breaker_tripped));
        if let Some((d, r)) = p.scaling {
            scaling_desired.get_or_create(&l).set(d);
            reservation.get_or_create(&l).set(r);
        }
    }
    r.register("mpsfleet_hosts", "Hosts, by lifecycle status and health", hosts);
    r.register("mpsfleet_gpus", "GPUs of the pool's hosts, by sharing mode", gpus);
    r.register("mpsfleet_gpu_memory_bytes", "GPU memory of the pool's hosts", gpu_memory);
    r.register(
        "mpsfleet_mps_memory_reserved_bytes",
        "MPS memory the placed tasks declared, on GPUs that take MPS tasks",
        reserved,
    );
    r.register("mpsfleet_mps_memory_free_bytes", "MPS memory left on GPUs that take MPS tasks", free);
    r.register("mpsfleet_mps_clients", "MPS clients placed (tasks on MPS GPUs)", clients);
    r.register("mpsfleet_tasks", "Tasks kept, by last status", tasks);
    r.register("mpsfleet_tasks_pending", "Tasks waiting for placement, by reason code", pending);
    r.register(
        "mpsfleet_scaling_desired_hosts",
        "Hosts managed scaling keeps in the pool (its provider's desiredHosts)",
        scaling_desired,
    );
    r.register(
        "mpsfleet_scaling_reservation_percent",
        "Managed scaling's last reservation: hosts needed (with work, or for waiting tasks) per 100 hosts in the pool",
        reservation,
    );
    r.register("mpsfleet_service_desired_tasks", "A service's desired count", desired);
    r.register("mpsfleet_service_running_tasks", "A service's tasks that are RUNNING", running);
    r.register(
        "mpsfleet_service_healthy_tasks",
        "A service's tasks that are RUNNING, ready and healthy",
        healthy,
    );
    r.register(
        "mpsfleet_deployments",
        "Service deployments in force (PRIMARY and ACTIVE ones), by rollout state",
        deployments,
    );
    r.register("mpsfleet_incidents", "Unresolved incidents, by state", incidents);
    r.register(
        "mpsfleet_storm_breaker_tripped",
        "1 while more hosts of the pool are unhealthy than the storm breaker lets remediation work on",
        storm,
    );
    let mut out = String::with_capacity(16 << 10);
    // Writing to a String does not fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &r);
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &live.registry);
    out
}

/// The request-counting middleware, on every route (`route_layer`, so the route's template is
/// known and an unknown path adds no series).
pub async fn observe(
    axum::extract::State(live): axum::extract::State<std::sync::Arc<Live>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let watch = mpsfleet_core::clock::Stopwatch::start();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let resp = next.run(req).await;
    live.request(method_label(&method), &route, resp.status().as_u16(), watch.seconds());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_end_in_total_and_the_state_is_by_pool() {
        let live = Live::default();
        live.request(method_label(&axum::http::Method::GET), "/v1/tasks/{id}", 200, 0.002);
        live.placed(&mpsfleet_types::PoolName::new("gpu").unwrap(), 1500);
        let mut state = State { leader: true, ..State::default() };
        let p = state.pools.entry("gpu".into()).or_default();
        p.mps_memory_reserved_bytes = 4 << 30;
        p.pending.insert(Some(PendingCode::InsufficientGpuMemory), 3);
        let text = render(&state, &live);
        for line in [
            "mpsfleet_leader 1",
            "mpsfleet_mps_memory_reserved_bytes{pool=\"gpu\"} 4294967296",
            "mpsfleet_tasks_pending{pool=\"gpu\",reason=\"INSUFFICIENT_GPU_MEMORY\"} 3",
            "mpsfleet_tasks_pending{pool=\"gpu\",reason=\"NOT_TRIED\"} 0",
            "mpsfleet_api_requests_total{method=\"GET\",route=\"/v1/tasks/{id}\",code=\"200\"} 1",
            "mpsfleet_placements_total{pool=\"gpu\"} 1",
            "mpsfleet_placement_wait_seconds_count{pool=\"gpu\"} 1",
            "# TYPE mpsfleet_api_request_duration_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
    }
}
