//! What a pool's hosts could take now ([`Reader::host_rooms`]): each host's placement state
//! and GPUs as `host_view` shows them, and whether each GPU's MPS daemon is OK as its
//! `checks` show it, without building the views (no check, string or event is copied). A
//! caller that asks this of a whole pool often (the simulator's spread check, at every resync)
//! reads each host's numbers and nothing else.

use super::read::Reader;
use mpsfleet_core::health::MPS_DAEMON;
use mpsfleet_types::{HealthStatus, HostId, HostStatus, SharingMode};

/// One host of [`Reader::host_rooms`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoom {
    pub id: HostId,
    pub status: HostStatus,
    pub health_status: HealthStatus,
    pub cordoned: bool,
    pub mps_available: bool,
    pub gpus: Vec<GpuRoom>,
}

/// One GPU of a [`HostRoom`]: `GpuView`'s figures, and whether every `MPS_DAEMON` check of it
/// among the host view's `checks` is OK (true when there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRoom {
    pub sharing_mode: SharingMode,
    pub remaining_memory_mib: u64,
    pub client_count: u32,
    pub max_clients: u32,
    pub compute_percent_sum: u32,
    pub daemon_ok: bool,
}

impl Reader<'_> {
    /// The hosts of `pool`, in registration order, as [`HostRoom`]s.
    pub fn host_rooms(&self, pool: &str) -> Vec<HostRoom> {
        (0..self.state.hosts().len())
            .filter(|&ix| self.state.hosts()[ix].host().pool.as_str() == pool)
            .map(|ix| self.host_room(ix as super::HostIx))
            .collect()
    }

    fn host_room(&self, ix: super::HostIx) -> HostRoom {
        let e = &self.state.hosts()[ix as usize];
        let h = e.host();
        // The checks `host_view` shows: the evaluation's when there is one, else the reported.
        let daemon_ok = |gpu: &mpsfleet_types::GpuUuid| match e.health.checks.is_empty() {
            true => (e.checks.iter())
                .filter(|c| c.name == MPS_DAEMON && c.gpu_id.as_ref() == Some(gpu))
                .all(|c| c.status == HealthStatus::Ok),
            false => (e.health.checks.iter())
                .filter(|c| c.name == MPS_DAEMON && c.gpu_id.as_ref() == Some(gpu))
                .all(|c| c.status == HealthStatus::Ok),
        };
        let gpus = (self.sched.host_gpus(ix).zip(&h.gpus))
            .map(|(g, inv)| {
                let s = self.sched.gpu(g);
                GpuRoom {
                    sharing_mode: s.mode(),
                    remaining_memory_mib: s.remaining_mib(),
                    client_count: s.clients,
                    max_clients: s.max_clients,
                    compute_percent_sum: s.compute_percent,
                    daemon_ok: daemon_ok(&inv.uuid),
                }
            })
            .collect();
        HostRoom {
            id: h.id.clone(),
            status: h.status,
            health_status: h.health_status,
            cordoned: h.cordoned,
            mps_available: h.mps_available,
            gpus,
        }
    }
}
