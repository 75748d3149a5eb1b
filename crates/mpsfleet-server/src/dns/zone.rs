//! The names discovery publishes, built from what the cluster publishes
//! (`Cluster::discovery`): a pure map from each (lowercased) name to its records.
//!
//! - SRV `_<port>._tcp.<service>.<pool>.mpsfleet.`: one target per replica, `<port>` the port
//!   mapping's name (ECS's `portMappings[].name`) or, unnamed or not a DNS label, its container
//!   port; weight 1 for a replica in traffic, 0 for one leaving it;
//! - A/AAAA `<task-id>.<service>.<pool>.mpsfleet.`: the replica's address (the SRV target);
//! - A/AAAA `<service>.<pool>.mpsfleet.`: every replica's address in traffic.
//!
//! A service or pool whose name is not a DNS label (1 to 63 letters, digits and hyphens), or
//! whose name equals another's but for case, is not published; [`Zone::skipped`] says why.

use mpsfleet_types::discovery::{unpublishable, DiscoveredService, Traffic};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The zone every name is under.
pub const ORIGIN: &str = "mpsfleet.";

/// One record's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    Srv { weight: u16, port: u16, target: String },
    Addr(IpAddr),
}

/// The published names and their records, and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    /// By lowercased fully qualified name.
    records: BTreeMap<String, Vec<Data>>,
    /// Every name that exists, records or not (`pool.mpsfleet.` has none of its own).
    names: BTreeSet<String>,
    /// Services left out, each with why.
    pub skipped: Vec<String>,
    /// The state revision the zone was built from: the SOA's serial.
    pub serial: u32,
}

pub use mpsfleet_types::discovery::is_dns_label as is_label;

impl Zone {
    pub fn build(services: &[DiscoveredService], serial: u32) -> Zone {
        let mut zone = Zone { serial, ..Zone::default() };
        zone.names.insert(ORIGIN.to_string());
        // Names equal but for case are ambiguous: neither is published.
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for s in services {
            *seen.entry(format!("{}.{}", s.service, s.pool).to_ascii_lowercase()).or_default() += 1;
        }
        for s in services {
            let why = if let Some(why) = unpublishable(&s.pool, &s.service) {
                Some(why)
            } else if seen[&format!("{}.{}", s.service, s.pool).to_ascii_lowercase()] > 1 {
                Some(format!(
                    "service {:?} of pool {:?}: another service's name equals it but for case",
                    s.service, s.pool
                ))
            } else {
                None
            };
            if let Some(why) = why {
                zone.skipped.push(why);
                continue;
            }
            zone.add_service(s);
        }
        zone
    }

    fn add_service(&mut self, s: &DiscoveredService) {
        let base = format!("{}.{}.{ORIGIN}", s.service, s.pool).to_ascii_lowercase();
        self.add_name(&base);
        for r in &s.replicas {
            let target = format!("{}.{base}", r.task);
            self.push(&target, Data::Addr(r.address));
            // Each address once, however many of the replicas share its host.
            let addr = Data::Addr(r.address);
            let listed = self.records.get(&base).is_some_and(|v| v.contains(&addr));
            if r.traffic == Traffic::In && !listed {
                self.push(&base, addr);
            }
            let weight = match r.traffic {
                Traffic::In => 1,
                Traffic::Leaving => 0,
            };
            for p in &r.ports {
                let label = match &p.name {
                    Some(n) if n.len() < 63 && is_label(n) => n.to_ascii_lowercase(),
                    _ => p.container_port.to_string(),
                };
                let srv = Data::Srv { weight, port: p.port, target: target.clone() };
                self.push(&format!("_{label}._tcp.{base}"), srv);
            }
        }
    }

    fn push(&mut self, name: &str, data: Data) {
        self.add_name(name);
        self.records.entry(name.to_string()).or_default().push(data);
    }

    /// Adds `name` and every name between it and the origin.
    fn add_name(&mut self, name: &str) {
        let mut n = name;
        while n != ORIGIN && n.len() > ORIGIN.len() {
            self.names.insert(n.to_string());
            n = n.split_once('.').map_or(ORIGIN, |(_, rest)| rest);
        }
    }

    /// The records of `name` (lowercase, fully qualified), if it exists (empty when it exists
    /// without records of its own); None when it does not exist.
    pub fn lookup(&self, name: &str) -> Option<&[Data]> {
        match self.records.get(name) {
            Some(r) => Some(r),
            None => self.names.contains(name).then_some(&[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::discovery::{DiscoveredPort, DiscoveredReplica};
    use mpsfleet_types::TaskId;

    fn replica(
        task: u64,
        ip: &str,
        traffic: Traffic,
        ports: &[(Option<&str>, u16, u16)],
    ) -> DiscoveredReplica {
        DiscoveredReplica {
            task: TaskId(task),
            address: ip.parse().unwrap(),
            traffic,
            ports: ports
                .iter()
                .map(|(n, c, p)| DiscoveredPort { name: n.map(str::to_string), container_port: *c, port: *p })
                .collect(),
        }
    }

    fn service(pool: &str, name: &str, replicas: Vec<DiscoveredReplica>) -> DiscoveredService {
        DiscoveredService { pool: pool.into(), service: name.into(), replicas }
    }

    #[test]
    fn srv_names_targets_and_addresses() {
        let web = service(
            "default",
            "Web",
            vec![
                replica(1, "10.0.0.1", Traffic::In, &[(Some("http"), 8080, 32768), (None, 9090, 32769)]),
                replica(2, "10.0.0.2", Traffic::Leaving, &[(Some("http"), 8080, 32770), (None, 9090, 32771)]),
            ],
        );
        let z = Zone::build(&[web], 7);
        let t1 = format!("{}.web.default.mpsfleet.", TaskId(1));
        let t2 = format!("{}.web.default.mpsfleet.", TaskId(2));
        assert_eq!(
            z.lookup("_http._tcp.web.default.mpsfleet.").unwrap(),
            [
                Data::Srv { weight: 1, port: 32768, target: t1.clone() },
                Data::Srv { weight: 0, port: 32770, target: t2.clone() }
            ]
        );
        assert_eq!(z.lookup("_9090._tcp.web.default.mpsfleet.").unwrap().len(), 2);
        assert_eq!(z.lookup(&t2).unwrap(), [Data::Addr("10.0.0.2".parse().unwrap())]);
        // The service's own name lists only the replicas in traffic.
        assert_eq!(z.lookup("web.default.mpsfleet.").unwrap(), [Data::Addr("10.0.0.1".parse().unwrap())]);
        // Names between exist without records; others do not exist.
        assert_eq!(z.lookup("default.mpsfleet.").unwrap(), []);
        assert_eq!(z.lookup("_tcp.web.default.mpsfleet.").unwrap(), []);
        assert!(z.lookup("api.default.mpsfleet.").is_none());
        assert!(z.lookup("_8080._tcp.web.default.mpsfleet.").is_none(), "a named port is published by name");
        assert_eq!(z.serial, 7);
    }

    /// Replicas sharing a host share one address under the service's name.
    #[test]
    fn an_address_is_listed_once() {
        let ports = &[(None, 80, 80)];
        let replicas = vec![
            replica(1, "10.0.0.1", Traffic::In, ports),
            replica(2, "10.0.0.1", Traffic::In, ports),
            replica(3, "10.0.0.2", Traffic::In, ports),
        ];
        let z = Zone::build(&[service("default", "web", replicas)], 1);
        let addrs = z.lookup("web.default.mpsfleet.").unwrap();
        assert_eq!(addrs, [Data::Addr("10.0.0.1".parse().unwrap()), Data::Addr("10.0.0.2".parse().unwrap())]);
        assert_eq!(z.lookup("_80._tcp.web.default.mpsfleet.").unwrap().len(), 3, "one target per replica");
    }

    #[test]
    fn names_that_are_not_labels_or_collide_are_skipped_with_why() {
        let r = || vec![replica(1, "10.0.0.1", Traffic::In, &[(Some("a_b"), 80, 80)])];
        let long = "x".repeat(64);
        let services = [
            service("default", "api_v2", r()),
            service("default", &long, r()),
            service("my_pool", "web", r()),
            service("default", "Web", r()),
            service("default", "web", r()),
            service("default", "ok", r()),
        ];
        let z = Zone::build(&services, 1);
        assert_eq!(z.skipped.len(), 5, "{:#?}", z.skipped);
        assert!(z.skipped[0].contains("\"api_v2\"") && z.skipped[0].contains("not a DNS label"));
        assert!(z.skipped[2].contains("pool \"my_pool\""));
        assert!(z.skipped[3].contains("equals it but for case"));
        // A port name that is not a label falls back to its number.
        assert_eq!(z.lookup("_80._tcp.ok.default.mpsfleet.").unwrap().len(), 1);
        assert!(z.lookup("web.default.mpsfleet.").is_none());
        assert!(is_label(&"a".repeat(63)) && !is_label(&long) && !is_label("") && !is_label("a.b"));
    }
}
