//! Where each replica stands in its service's traffic (`Reader::discovered`,
//! `Reader::traffic_of`), read alike by service discovery, `service describe`, the services
//! controller (a planned stop drains a replica in traffic first: `Reader::planned_stop`) and
//! an incident (`Reader::left_traffic`).
//!
//! A replica is in traffic while it is RUNNING, ready and healthy (where its definition has a
//! health check), its GPU's MPS daemon shows no failed signal (`daemon_failing_since`: at the
//! first one, before the failure is confirmed) and its host has not missed
//! [`MISSED_HEARTBEATS`] heartbeats in a row; it is leaving (weight 0) while a planned stop
//! drains it, and gone once it is told to stop. Anything else is not published.

use super::read::Reader;
use super::state::HostEntry;
use mpsfleet_core::deployment::ReplicaState;
use mpsfleet_core::scheduler::HostIx;
use mpsfleet_types::discovery::{DiscoveredPort, DiscoveredReplica, Traffic, TrafficState};
use mpsfleet_types::service::ServiceEndpoint;
use mpsfleet_types::{Draining, HealthStatus, StopCode, Task, TaskStatus};
use std::net::IpAddr;

/// Heartbeats a host may miss in a row before its replicas leave traffic.
pub const MISSED_HEARTBEATS: u64 = 3;

impl Reader<'_> {
    /// A replica as discovery publishes it, or None when it takes no traffic and is not
    /// leaving it (or has no address a record can carry).
    pub(in crate::cluster) fn discovered(&self, t: &Task) -> Option<DiscoveredReplica> {
        if t.last_status != TaskStatus::Running || t.desired_status == TaskStatus::Stopped {
            return None;
        }
        let traffic = if t.draining.is_some() {
            Traffic::Leaving
        } else if self.takes_traffic(t) {
            Traffic::In
        } else {
            return None;
        };
        let bindings = self.bindings_of(t);
        let address: IpAddr = bindings.iter().find_map(|b| ip_of(&b.address))?;
        let definition =
            self.state.taskdefs().get(&(t.task_definition.family.clone(), t.task_definition.revision));
        let name_of = |container: &str, port: u16| {
            let defs = definition.map(|d| d.value.container_definitions.as_slice()).unwrap_or_default();
            let mappings = defs.iter().filter(|d| d.name == container).flat_map(|d| &d.port_mappings);
            mappings.filter(|m| m.container_port == port).find_map(|m| m.name.clone())
        };
        let ports = bindings
            .iter()
            .filter(|b| ip_of(&b.address) == Some(address))
            .map(|b| DiscoveredPort {
                name: name_of(&b.container, b.container_port),
                container_port: b.container_port,
                port: b.host_port,
            })
            .collect();
        Some(DiscoveredReplica { task: t.id, address, traffic, ports })
    }

    /// Where a live replica stands in its service's traffic, and why when it takes none
    /// (`service describe`, the console). Leaving and in are what discovery publishes.
    pub(in crate::cluster) fn traffic_of(&self, t: &Task) -> (TrafficState, String) {
        if let Some(d) = t.draining.as_ref().filter(|_| t.desired_status != TaskStatus::Stopped) {
            let left = d.until_ms.saturating_sub(self.now_ms);
            let why = format!("{}; stopped in {}", d.reason, mpsfleet_core::health::fmt_ms(left));
            return (TrafficState::Leaving, why);
        }
        if t.last_status != TaskStatus::Running {
            return (TrafficState::Joining, format!("{}, not running yet", t.last_status.as_str()));
        }
        if self.discovered(t).is_some() {
            return (TrafficState::In, String::new());
        }
        if self.replica_state(t) != ReplicaState::Healthy {
            let why = if !t.ready {
                "not ready (its readiness check)"
            } else {
                "its health check is not passing yet"
            };
            return (TrafficState::Joining, why.to_string());
        }
        let why = if self.daemon_failing_since(t).is_some() {
            "its GPU's MPS daemon is failing (at its first signal, before local repair)".to_string()
        } else if self.heartbeats_missed(t) {
            format!("its host missed {MISSED_HEARTBEATS} heartbeats in a row")
        } else {
            "no address a DNS record can carry (a hostname, not an IP address)".to_string()
        };
        (TrafficState::Out, why)
    }

    /// The record of a planned stop (its service's deployment, scale-in or move, an operator's
    /// `task stop`, a host's drain): a replica in traffic with ports first leaves discovery for
    /// `delay_s` (`Task::draining`), and its service stops it once that is over with `code`;
    /// any other stops at once.
    pub(in crate::cluster) fn planned_stop(
        &self,
        t: &Task,
        delay_s: u32,
        code: StopCode,
        reason: &str,
        now: u64,
    ) -> Task {
        let in_traffic = self.discovered(t).is_some_and(|r| r.traffic == Traffic::In && !r.ports.is_empty());
        if delay_s == 0 || t.draining.is_some() || !in_traffic {
            return self.stopped_record(t, code, reason);
        }
        let mut out = t.clone();
        let until_ms = now + u64::from(delay_s) * 1000;
        out.draining =
            Some(Draining { since_ms: now, until_ms, stop_code: code, reason: reason.to_string() });
        out
    }

    /// Whether the task's host has missed [`MISSED_HEARTBEATS`] heartbeats in a row (of the
    /// interval its agent reports, at least a second's worth): the first sign that the host
    /// or its agent is gone, long before its grace declares it. A server that has heard
    /// nothing since it started does not judge.
    pub(in crate::cluster) fn heartbeats_missed(&self, t: &Task) -> bool {
        let Some(ix) = t.host_id.as_ref().and_then(|h| self.sched.host(h)) else { return false };
        self.silent_since(ix).is_some_and(|at| self.now_ms > at)
    }

    /// Whether a replica takes new requests: RUNNING, started (ready, healthy where it has a
    /// check), not leaving, and showing no failure's first signal. What discovery publishes
    /// as in traffic, whatever its address (the simulator's traffic model reads it too).
    pub fn takes_traffic(&self, t: &Task) -> bool {
        t.last_status == TaskStatus::Running
            && t.desired_status != TaskStatus::Stopped
            && t.draining.is_none()
            && self.replica_state(t) == ReplicaState::Healthy
            && !self.left_traffic_at_a_signal(t)
    }

    /// Whether a healthy replica is out of traffic for a failure's first signal: its GPU's
    /// MPS daemon failing, or its host silent (what `discovered` leaves it out for).
    pub(in crate::cluster) fn left_traffic_at_a_signal(&self, t: &Task) -> bool {
        self.daemon_failing_since(t).is_some() || self.heartbeats_missed(t)
    }

    /// Since when the MPS daemon (or GPU) under the task has been failing, at its first
    /// signal: a check of its GPU that is not OK, or that counts a failure not over yet
    /// (`firstFailureAgeMs`: a probe failed, the daemon exited and local repair is at work),
    /// before the failure is confirmed and whatever local repair does. The age is placed on
    /// the server's clock at the report's arrival. None while every check of its GPUs is clean.
    pub(in crate::cluster) fn daemon_failing_since(&self, t: &Task) -> Option<u64> {
        if t.gpu_ids.is_empty() {
            return None;
        }
        let ix = t.host_id.as_ref().and_then(|h| self.sched.host(h))?;
        let e = &self.state.hosts()[ix as usize];
        if e.checks_clean {
            return None;
        }
        let reported = e.checks_at_ms.unwrap_or(self.now_ms);
        (e.checks.iter())
            .filter(|c| c.gpu_id.as_ref().is_some_and(|g| t.gpu_ids.contains(g)))
            .filter_map(|c| match (c.status, c.first_failure_age_ms) {
                (_, Some(age)) => Some(reported.saturating_sub(age)),
                (HealthStatus::Ok, None) => None,
                // Not OK with no failure's age (a GPU check): since the report said so.
                (_, None) => Some(reported),
            })
            .min()
    }

    /// When host `ix`'s replicas leave traffic if no heartbeat comes: its last heartbeat and
    /// [`MISSED_HEARTBEATS`] of its interval (as the agent reports it, bounded as the recovery
    /// bounds bound it; at least a second's worth). None before its first heartbeat.
    fn silent_since(&self, ix: HostIx) -> Option<u64> {
        let e = &self.state.hosts()[ix as usize];
        let interval = e.heartbeat_ms.unwrap_or(1_000).min(super::intervals::MAX_HEARTBEAT_MS);
        let limit = (interval * MISSED_HEARTBEATS).max(1_000);
        e.last_heartbeat_ms.map(|at| at + limit)
    }

    /// When host `ix`'s service replicas that are out of traffic now left it, and what the
    /// incident's timeline says of them (`Step::LeftTraffic`); None when none is out.
    pub(in crate::cluster) fn left_traffic(&self, ix: HostIx) -> Option<(u64, String)> {
        let e = &self.state.hosts()[ix as usize];
        let out: Vec<&Task> = (self.state.tasks().on_host(ix).iter())
            .filter_map(|id| self.state.tasks().get(id))
            .map(|e| &e.task)
            .filter(|t| t.group.is_some() && t.last_status == TaskStatus::Running)
            .filter(|t| t.desired_status != TaskStatus::Stopped && t.draining.is_none())
            .filter(|t| self.traffic_of(t).0 == TrafficState::Out)
            .collect();
        if out.is_empty() {
            return None;
        }
        let (at, why) = if out.iter().any(|t| self.heartbeats_missed(t)) {
            let why = format!("the host missed {MISSED_HEARTBEATS} heartbeats in a row");
            (self.silent_since(ix).unwrap_or(self.now_ms), why)
        } else {
            let first = out.iter().filter_map(|t| self.daemon_failing_since(t)).min();
            let at = first.or(e.failed_daemons_since_ms).unwrap_or(self.now_ms);
            (at, "their GPU's MPS daemon failed (its first signal)".to_string())
        };
        // Each service once, by name (a host's tasks interleave their services).
        let services: std::collections::BTreeSet<&str> =
            out.iter().filter_map(|t| t.group.as_ref()).map(|g| g.as_str()).collect();
        let services: Vec<&str> = services.into_iter().collect();
        let detail =
            format!("{} replica(s) of {} left service discovery: {why}", out.len(), services.join(", "));
        Some((at.min(self.now_ms), detail))
    }

    /// Where a running task's ports are reached: its containers' bindings at the host's
    /// address, or at the task's own for awsvpc (`service_endpoints`). A process task maps no
    /// ports (placement keeps a definition with port mappings off process hosts).
    pub(in crate::cluster) fn bindings_of(&self, t: &Task) -> Vec<ServiceEndpoint> {
        let mut out = Vec::new();
        let Some(host) = t.host_id.as_ref().and_then(|h| self.sched.host(h)) else { return out };
        let entry = &self.state.hosts()[host as usize];
        let address = host_address(entry);
        let definition =
            self.state.taskdefs().get(&(t.task_definition.family.clone(), t.task_definition.revision));
        let endpoint =
            |container: &str, ip: &str, host_port: u16, container_port: u16, protocol| ServiceEndpoint {
                task_id: t.id,
                host_id: entry.host().id.clone(),
                container: container.to_string(),
                address: if ip.contains(':') {
                    format!("[{ip}]:{host_port}")
                } else {
                    format!("{ip}:{host_port}")
                },
                host_port,
                container_port,
                protocol,
                ready: t.ready,
                health_status: t.health_status,
            };
        let defs = definition.map(|d| d.value.container_definitions.as_slice()).unwrap_or_default();
        for c in &t.containers {
            if let Some(ip) = c.network_interfaces.first().map(|n| n.private_ipv4_address.clone()) {
                for m in defs.iter().filter(|d| d.name == c.name).flat_map(|d| &d.port_mappings) {
                    out.push(endpoint(&c.name, &ip, m.container_port, m.container_port, m.protocol));
                }
                continue;
            }
            for b in &c.network_bindings {
                let ip = if b.bind_ip.is_empty() || b.bind_ip == "0.0.0.0" || b.bind_ip == "::" {
                    address.as_str()
                } else {
                    b.bind_ip.as_str()
                };
                out.push(endpoint(&c.name, ip, b.host_port, b.container_port, b.protocol));
            }
        }
        out
    }
}

/// The IP address of an `ADDRESS:PORT` endpoint, if it is one (not a hostname).
fn ip_of(address: &str) -> Option<IpAddr> {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// The address a host is reached at: the host part of its agent's logs endpoint (the address
/// its heartbeats come from, see `HostEntry::logs_url`), unless that is unspecified (0.0.0.0),
/// else its hostname.
pub(super) fn host_address(entry: &HostEntry) -> String {
    let from_url = entry.logs_url.as_deref().and_then(|u| {
        let rest = u.split_once("://").map_or(u, |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        let host = match authority.rsplit_once(':') {
            Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
            _ => authority,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (!host.is_empty() && host != "0.0.0.0" && host != "::").then(|| host.to_string())
    });
    from_url.unwrap_or_else(|| entry.host().hostname.clone())
}
