//! Traffic as a load balancer reading the server's discovery routes it. A service replica
//! stops serving at the fault that strikes it (its MPS daemon crashed or hung, its MPS server
//! faulted, its GPU fell off the bus, its host is gone); it goes on taking requests until the
//! server takes it out of rotation (`Reader::takes_traffic`: out at a failure's first signal,
//! or once stopped). That time, from the fault, is what a load balancer reading DNS sends a
//! replica that cannot answer: the report's `out of rotation`, with the requests it fails at
//! [`REQUESTS_PER_SECOND`] per service, spread over its replicas, without retries.
//!
//! Only faults that stop a replica from serving count, and only the replicas they stop: a
//! crashed daemon or faulted MPS server its MPS clients, a GPU off the bus every task on it,
//! a vanished host every task on it. A partition cuts the agent from the server, not the
//! replica from its clients; a hung control daemon leaves running clients running.

use super::Sim;
use mpsfleet_types::{ServiceName, TaskId};

/// The request rate the report prices a replica's time out of service at, per service.
pub const REQUESTS_PER_SECOND: u64 = 100;

/// A replica a fault struck while it took traffic.
#[derive(Debug, Clone)]
pub(super) struct Struck {
    task: TaskId,
    /// Its service's replicas then (its share of the service's requests).
    replicas: u32,
    at_ms: u64,
}

/// The replicas struck and not yet out of rotation.
#[derive(Debug, Default)]
pub(super) struct Rotation {
    struck: Vec<Struck>,
}

impl Sim {
    /// Notes the service replicas a fault stops from serving on host `h` (on GPU `gpu` only,
    /// where the fault is a GPU's; its MPS clients only when `mps_only`) that the server has
    /// in rotation now.
    pub(super) fn strike(&mut self, h: usize, gpu: Option<usize>, mps_only: bool) {
        let Some(c) = self.cluster.as_ref() else { return };
        let r = c.read();
        let local: Vec<(TaskId, ServiceName)> = (self.world[h].tasks().iter())
            .filter(|(_, l)| gpu.is_none_or(|g| l.gpus.contains(&g)) && (l.demand.mps || !mps_only))
            .filter_map(|(t, l)| Some((*t, l.service.clone()?)))
            .collect();
        for (task, service) in local {
            let Ok(t) = r.task(&task.to_string()) else { continue };
            if !r.takes_traffic(&t) {
                continue;
            }
            let replicas = self.svcs.get(&service).map_or(1, |w| w.desired.max(1));
            self.rotation.struck.push(Struck { task, replicas, at_ms: self.now });
        }
    }

    /// Takes note of the struck replicas the server has taken out of rotation since.
    pub(super) fn follow_rotation(&mut self) {
        if self.rotation.struck.is_empty() {
            return;
        }
        let Some(c) = self.cluster.as_ref() else { return };
        let r = c.read();
        let now = self.now;
        let stats = &mut self.stats;
        self.rotation.struck.retain(|s| {
            let in_rotation = r.task(&s.task.to_string()).is_ok_and(|t| r.takes_traffic(&t));
            if !in_rotation {
                stats.out_of_rotation(now - s.at_ms, s.replicas, false);
            }
            in_rotation
        });
    }

    /// At the end: replicas still in rotation count until now, as such.
    pub(super) fn finish_rotation(&mut self) {
        for s in std::mem::take(&mut self.rotation.struck) {
            self.stats.out_of_rotation(self.now - s.at_ms, s.replicas, true);
        }
    }
}
