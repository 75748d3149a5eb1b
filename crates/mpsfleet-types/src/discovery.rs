//! What service discovery publishes: each service's replicas that take traffic or are leaving
//! it, with their addresses and ports. The server computes it from its state
//! (`Cluster::discovery`); the DNS server (`mpsfleet-server`'s `dns/`) publishes it.

use crate::ids::TaskId;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// One service as discovery publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredService {
    pub pool: String,
    pub service: String,
    /// In task order.
    pub replicas: Vec<DiscoveredReplica>,
}

/// A replica's traffic state as discovery publishes it: [`Traffic::In`] takes requests;
/// [`Traffic::Leaving`] is still listed, with weight 0, so that load balancers stop sending
/// it new requests while those in flight finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Traffic {
    In,
    Leaving,
}

/// One replica: where it is reached and on which ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredReplica {
    pub task: TaskId,
    pub address: IpAddr,
    pub traffic: Traffic,
    pub ports: Vec<DiscoveredPort>,
}

/// One port of a replica: its mapping's name (ECS's `portMappings[].name`), if it has one,
/// the container port, and the port it is reached at (the host port; in awsvpc mode the
/// container port at the task's own address).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredPort {
    pub name: Option<String>,
    pub container_port: u16,
    pub port: u16,
}

/// Whether `s` is a DNS label as hosts are named: 1 to 63 letters, digits and hyphens.
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Why service `service` of pool `pool` cannot be published in DNS, if it cannot: a name
/// that is not a DNS label.
pub fn unpublishable(pool: &str, service: &str) -> Option<String> {
    if !is_dns_label(pool) {
        Some(format!("pool {pool:?}: its name is not a DNS label (1 to 63 letters, digits and hyphens)"))
    } else if !is_dns_label(service) {
        Some(format!(
            "service {service:?} of pool {pool:?}: its name is not a DNS label (1 to 63 letters, digits and hyphens)"
        ))
    } else {
        None
    }
}

/// Where a live replica stands in its service's traffic, as `service describe` and the
/// console show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TrafficState {
    /// Not taking requests yet: not running, not ready, or its health check not passing yet.
    Joining,
    /// Published in service discovery: takes requests.
    In,
    /// Published with weight 0 before its planned stop: finishes what it has, takes nothing new.
    Leaving,
    /// Running but not published: its MPS daemon failed, or its host stopped answering.
    Out,
}

/// One live replica's traffic state, and why when it takes none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaTraffic {
    pub task_id: TaskId,
    pub state: TrafficState,
    /// Empty while it takes requests.
    #[serde(default)]
    pub why: String,
}
