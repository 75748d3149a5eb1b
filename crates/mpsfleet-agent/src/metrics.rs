//! The agent's Prometheus metrics, `GET /metrics` on its endpoint: this host, like a node
//! exporter (per GPU and per task: the series the server leaves to the agents).
//!
//! Only the server calls it, with the token it issued this host (as for logs); Prometheus
//! reaches it through the server, `GET /v1/hosts/{id}/metrics` with a `viewer` token, which
//! checks the agent's pinned certificate (docs/metrics.md).
//!
//! - per GPU: `mpsfleet_agent_gpu_info`, memory, the MPS daemon's status (one series per
//!   status, 1 for the current one), local restarts, probe latency and outcomes, MPS clients,
//!   the MPS memory its tasks declared (the limits they run under); the GPU check's status;
//! - the container runtime's status (a Docker host);
//! - per task: status, ready, health, the MPS memory limit it declared, and what it uses of
//!   its GPU ([`crate::gpu_use`]): GPU memory and SM utilisation.

use crate::container_health::SharedCheck;
use crate::gpu_health::GpuWatch;
use crate::gpu_use::{self, TaskUse};
use crate::mps::supervisor::Supervisors;
use crate::tasks::{TaskGauge, TasksView};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use mpsfleet_types::{GpuInventory, GpuUuid, HealthStatus, TaskGpuUse, TaskHealth, TaskId};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// What the metrics are read from.
pub struct Sources {
    pub supervisors: Supervisors,
    pub gpu_watch: Arc<GpuWatch>,
    pub runtime: Option<SharedCheck>,
    pub inventory: Vec<GpuInventory>,
    pub tasks: TasksView,
    pub gpu_use: gpu_use::Source,
}

impl Sources {
    /// Each task's use of its GPUs now; the error says why the source did not answer.
    pub fn task_use(&self, tasks: &[TaskGauge]) -> Result<BTreeMap<(TaskId, GpuUuid), TaskUse>, String> {
        let gpus: Vec<GpuUuid> = self.inventory.iter().map(|g| g.uuid.clone()).collect();
        let processes = self.gpu_use.sample(&gpus)?;
        let roots: BTreeMap<u32, TaskId> =
            tasks.iter().flat_map(|t| t.pids.iter().map(|p| (*p, t.id))).collect();
        Ok(gpu_use::attribute(&processes, &roots, gpu_use::proc_parent))
    }
}

/// What each task uses of its GPUs, for the heartbeat (at most
/// [`mpsfleet_types::MAX_GPU_USE_REPORTS`] entries; none when the source does not answer).
pub fn reported_use(s: &Sources) -> Vec<TaskGpuUse> {
    let tasks: Vec<TaskGauge> = s.tasks.lock().map(|t| t.clone()).unwrap_or_default();
    if tasks.iter().all(|t| t.gpus.is_empty()) {
        return Vec::new();
    }
    let by_task = match s.task_use(&tasks) {
        Ok(u) => u,
        Err(why) => {
            tracing::debug!(error = %why, "GPU use: the source did not answer");
            return Vec::new();
        }
    };
    tasks
        .iter()
        .flat_map(|t| t.gpus.iter().map(move |g| (t, g)))
        .map(|(t, gpu)| {
            let u = by_task.get(&(t.id, gpu.clone())).copied().unwrap_or_default();
            TaskGpuUse {
                task_id: t.id,
                gpu_id: gpu.clone(),
                memory_used_mib: u.memory_bytes >> 20,
                memory_limit_mib: t.mps.map(|(mib, _)| mib),
                sm_percent: u.sm_percent,
            }
        })
        .take(mpsfleet_types::MAX_GPU_USE_REPORTS)
        .collect()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuInfo {
    gpu: String,
    index: u32,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuStatus {
    gpu: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuResult {
    gpu: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskStatusLabels {
    task: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskGpu {
    task: String,
    gpu: String,
}

const STATUSES: [HealthStatus; 4] =
    [HealthStatus::Ok, HealthStatus::Initializing, HealthStatus::InsufficientData, HealthStatus::Impaired];

const MIB: i64 = 1 << 20;

fn task_health(h: TaskHealth) -> &'static str {
    match h {
        TaskHealth::Healthy => "HEALTHY",
        TaskHealth::Unhealthy => "UNHEALTHY",
        TaskHealth::Unknown => "UNKNOWN",
    }
}

/// The whole answer, Prometheus text format 0.0.4.
pub fn render(s: &Sources) -> String {
    let mut r = Registry::default();
    let info = Family::<GpuInfo, Gauge>::default();
    let memory = Family::<GpuLabels, Gauge>::default();
    let daemon = Family::<GpuStatus, Gauge>::default();
    let restarts = Family::<GpuLabels, Counter>::default();
    let probe_seconds = Family::<GpuLabels, Gauge<f64, AtomicU64>>::default();
    let probes = Family::<GpuResult, Counter>::default();
    let clients = Family::<GpuLabels, Gauge>::default();
    let reserved = Family::<GpuLabels, Gauge>::default();
    let gpu_check = Family::<GpuStatus, Gauge>::default();
    let tasks: Vec<TaskGauge> = s.tasks.lock().map(|t| t.clone()).unwrap_or_default();

    for g in &s.inventory {
        let gpu = g.uuid.to_string();
        let l = GpuLabels { gpu: gpu.clone() };
        info.get_or_create(&GpuInfo { gpu: gpu.clone(), index: g.index, model: g.model.clone() }).set(1);
        memory.get_or_create(&l).set(g.memory_mib as i64 * MIB);
        let on_gpu = tasks.iter().filter(|t| t.gpus.contains(&g.uuid));
        let (mut n, mut mib) = (0i64, 0i64);
        for (m, c) in on_gpu.filter_map(|t| t.mps) {
            n += i64::from(c);
            mib += m as i64;
        }
        if let Some(sup) = s.supervisors.get(&g.uuid) {
            let check = sup.check();
            for st in STATUSES {
                let v = i64::from(check.status == st);
                daemon.get_or_create(&GpuStatus { gpu: gpu.clone(), status: st.as_str() }).set(v);
            }
            restarts.get_or_create(&l).inc_by(u64::from(check.restarts));
            let p = sup.probes();
            if let Some(secs) = p.last_seconds {
                probe_seconds.get_or_create(&l).set(secs);
            }
            probes.get_or_create(&GpuResult { gpu: gpu.clone(), result: "ok" }).inc_by(p.ok);
            probes.get_or_create(&GpuResult { gpu: gpu.clone(), result: "failed" }).inc_by(p.failed);
            clients.get_or_create(&l).set(n);
            reserved.get_or_create(&l).set(mib * MIB);
        }
    }
    for c in s.gpu_watch.checks() {
        let Some(gpu) = c.gpu_id else { continue };
        for st in STATUSES {
            let l = GpuStatus { gpu: gpu.to_string(), status: st.as_str() };
            gpu_check.get_or_create(&l).set(i64::from(c.status == st));
        }
    }
    r.register("mpsfleet_agent_gpu_info", "A GPU of this host (always 1)", info);
    r.register("mpsfleet_agent_gpu_memory_bytes", "A GPU's memory", memory);
    r.register(
        "mpsfleet_agent_gpu_check_status",
        "The GPU check (NVML health): 1 for its current status",
        gpu_check,
    );
    r.register(
        "mpsfleet_agent_mps_daemon_status",
        "A GPU's MPS daemon check: 1 for its current status",
        daemon,
    );
    r.register(
        "mpsfleet_agent_mps_daemon_restarts",
        "Times this agent restarted a GPU's MPS daemon (since the agent started)",
        restarts,
    );
    r.register(
        "mpsfleet_agent_mps_probe_duration_seconds",
        "How long the last probe of a GPU's MPS daemon took",
        probe_seconds,
    );
    r.register("mpsfleet_agent_mps_probes", "Probes of a GPU's MPS daemon, by result", probes);
    r.register("mpsfleet_agent_mps_clients", "MPS clients of the tasks on a GPU", clients);
    r.register(
        "mpsfleet_agent_mps_memory_reserved_bytes",
        "The MPS memory the tasks on a GPU declared (the limits they run under)",
        reserved,
    );

    if let Some(check) = &s.runtime {
        let status = check.lock().map(|c| c.check().status).unwrap_or(HealthStatus::Impaired);
        let runtime = Family::<StatusLabel, Gauge>::default();
        for st in STATUSES {
            runtime.get_or_create(&StatusLabel { status: st.as_str() }).set(i64::from(status == st));
        }
        r.register(
            "mpsfleet_agent_container_runtime_status",
            "The container runtime check (Docker Engine answers): 1 for its current status",
            runtime,
        );
    }

    let status = Family::<TaskStatusLabels, Gauge>::default();
    let ready = Family::<TaskLabels, Gauge>::default();
    let health = Family::<TaskStatusLabels, Gauge>::default();
    let limit = Family::<TaskGpu, Gauge>::default();
    let used = Family::<TaskGpu, Gauge>::default();
    let sm = Family::<TaskGpu, Gauge<f64, AtomicU64>>::default();
    let source_up = Gauge::<i64>::default();
    for t in &tasks {
        let task = t.id.to_string();
        status.get_or_create(&TaskStatusLabels { task: task.clone(), status: t.status.as_str() }).set(1);
        ready.get_or_create(&TaskLabels { task: task.clone() }).set(i64::from(t.ready));
        health.get_or_create(&TaskStatusLabels { task: task.clone(), status: task_health(t.health) }).set(1);
        if let (Some((mib, _)), Some(gpu)) = (t.mps, t.gpus.first()) {
            limit.get_or_create(&TaskGpu { task: task.clone(), gpu: gpu.to_string() }).set(mib as i64 * MIB);
        }
    }
    match s.task_use(&tasks) {
        Ok(by_task) => {
            source_up.set(1);
            for t in &tasks {
                for gpu in &t.gpus {
                    let u = by_task.get(&(t.id, gpu.clone())).copied().unwrap_or_default();
                    let l = TaskGpu { task: t.id.to_string(), gpu: gpu.to_string() };
                    used.get_or_create(&l).set(u.memory_bytes as i64);
                    if let Some(p) = u.sm_percent {
                        sm.get_or_create(&l).set(f64::from(p) / 100.0);
                    }
                }
            }
        }
        Err(why) => tracing::debug!(error = %why, "GPU use: the source did not answer"),
    }
    r.register("mpsfleet_agent_task_status", "A task of this host: 1 for its status", status);
    r.register("mpsfleet_agent_task_ready", "1 when the task's readiness check passes", ready);
    r.register(
        "mpsfleet_agent_task_health",
        "A task's health (its containers' health checks): 1 for its status",
        health,
    );
    r.register(
        "mpsfleet_agent_task_mps_memory_limit_bytes",
        "The MPS memory a task declared on its GPU",
        limit,
    );
    r.register(
        "mpsfleet_agent_task_gpu_memory_used_bytes",
        "GPU memory a task's processes hold on a GPU (NVML, MPS clients included)",
        used,
    );
    r.register(
        "mpsfleet_agent_task_sm_utilization_ratio",
        "SM utilisation of a task's processes on a GPU, 0 to 1 (NVML's latest sample)",
        sm,
    );
    r.register(
        "mpsfleet_agent_gpu_use_source_up",
        "1 when the per-task GPU use source (NVML, or the declared file) answered",
        source_up,
    );
    let mut out = String::with_capacity(8 << 10);
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &r);
    out
}

struct MetricsState {
    sources: Arc<Sources>,
    token_sha256: String,
}

/// `GET /metrics`, for the server (the token it issued this host).
pub fn router(sources: Arc<Sources>, token_sha256: String) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .with_state(Arc::new(MetricsState { sources, token_sha256 }))
}

async fn metrics(State(st): State<Arc<MetricsState>>, headers: HeaderMap) -> Response {
    if !crate::logs::from_server(&st.token_sha256, &headers) {
        return (StatusCode::UNAUTHORIZED, "only the server may read metrics here").into_response();
    }
    // NVML and /proc are blocking calls.
    let sources = st.sources.clone();
    match tokio::task::spawn_blocking(move || render(&sources)).await {
        Ok(text) => {
            let ct = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
            ([(axum::http::header::CONTENT_TYPE, ct)], text).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("metrics: {e}")).into_response(),
    }
}
