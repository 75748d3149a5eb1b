//! Where a service's replicas take traffic: `service endpoints` (every binding of every
//! RUNNING replica) and what service discovery publishes ([`Cluster::discovery`]: the
//! replicas that take traffic, and those leaving it).
//!
//! Which replica is in traffic, and why, is `traffic.rs`.

use super::*;
use mpsfleet_types::discovery::DiscoveredService;
use mpsfleet_types::service::ServiceEndpoint;

impl Cluster {
    /// Every binding of every RUNNING replica of a service, in task order: where its traffic
    /// can go. The host's address is the one its agent is reached at (its logs endpoint), or
    /// its hostname until the agent has said. An awsvpc task's ports are at its own address:
    /// each container port of its definition, at the address its containers report.
    pub fn service_endpoints(&self, name: &str) -> Result<Vec<ServiceEndpoint>, Error> {
        let svc = self.service_record(name)?.value.name.clone();
        let mut out = Vec::new();
        for id in self.state.tasks().of_service(&svc) {
            let Some(e) = self.state.tasks().get(id) else { continue };
            let t = &e.task;
            if t.last_status != TaskStatus::Running || t.desired_status == TaskStatus::Stopped {
                continue;
            }
            out.extend(self.reader().bindings_of(t));
        }
        Ok(out)
    }

    /// What service discovery publishes of every service (of `pools` only, when given), in
    /// name order: module docs.
    pub fn discovery(&self, pools: Option<&BTreeSet<String>>) -> Vec<DiscoveredService> {
        let r = self.reader();
        let mut out = Vec::new();
        for v in self.state.services().values() {
            let svc = &v.value;
            if pools.is_some_and(|p| !p.contains(svc.pool.as_str())) {
                continue;
            }
            let mut replicas = Vec::new();
            for id in self.state.tasks().of_service(&svc.name) {
                let Some(e) = self.state.tasks().get(id) else { continue };
                if let Some(d) = r.discovered(&e.task) {
                    replicas.push(d);
                }
            }
            out.push(DiscoveredService {
                pool: svc.pool.to_string(),
                service: svc.name.to_string(),
                replicas,
            });
        }
        out
    }
}
