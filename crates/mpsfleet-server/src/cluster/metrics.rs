//! What `GET /metrics` reads from the cluster (aggregates by pool; `crate::metrics` renders
//! them and holds the live counters that the cluster feeds from here).

use super::controllers::scaling::ScalingMemory;
use super::read::Reader;
use super::*;
use crate::metrics::{PoolState, ServiceState, State};
use mpsfleet_core::deployment::ReplicaState;

pub(super) const MIB: i64 = 1 << 20;

/// The state's figures now, by pool: one pass over hosts, GPUs, tasks, services and
/// incidents.
pub(super) fn figures(r: &Reader<'_>, scaling: &HashMap<PoolName, ScalingMemory>) -> State {
    let mut state = State { leader: true, ..State::default() };
    let pools = &mut state.pools;
    fn at<'a>(pools: &'a mut BTreeMap<String, PoolState>, p: &PoolName) -> &'a mut PoolState {
        pools.entry(p.to_string()).or_default()
    }
    for name in r.state.pools().keys() {
        at(pools, name);
    }
    for (ix, e) in r.state.hosts().iter().enumerate() {
        let p = at(pools, &e.host().pool);
        *p.hosts.entry((e.host().status.as_str(), e.host().health_status.as_str())).or_default() += 1;
        if e.host().status == HostStatus::Deregistered {
            continue;
        }
        for g in r.sched.host_gpus(ix as HostIx) {
            let s = r.sched.gpu(g);
            let mode = s.mode();
            *p.gpus.entry(mode.as_str()).or_default() += 1;
            p.gpu_memory_bytes += s.total_mib as i64 * MIB;
            if e.host().mps_available && mode != SharingMode::Dedicated {
                p.mps_memory_reserved_bytes += s.used_mib as i64 * MIB;
                p.mps_memory_free_bytes += s.remaining_mib() as i64 * MIB;
                p.mps_clients += i64::from(s.clients);
            }
        }
    }
    for e in r.state.tasks().values() {
        let t = &e.task;
        let p = at(pools, &t.pool);
        *p.tasks.entry(t.last_status.as_str()).or_default() += 1;
        if t.host_id.is_none() && t.last_status != TaskStatus::Stopped {
            *p.pending.entry(t.pending_code).or_default() += 1;
        }
    }
    for v in r.state.services().values() {
        let svc = &v.value;
        let mut s = ServiceState { desired: i64::from(svc.desired_count), ..ServiceState::default() };
        for e in r.state.tasks().of_service(&svc.name).iter().filter_map(|id| r.state.tasks().get(id)) {
            s.running += i64::from(e.task.last_status == TaskStatus::Running);
            s.healthy += i64::from(r.replica_state(&e.task) == ReplicaState::Healthy);
        }
        let p = at(pools, &svc.pool);
        for d in svc.deployments.iter().filter(|d| d.status != DeploymentStatus::Inactive) {
            *p.deployments.entry(d.rollout_state.as_str()).or_default() += 1;
        }
        p.services.insert(svc.name.to_string(), s);
    }
    for v in r.state.incidents().values().filter(|v| v.value.state != IncidentState::Resolved) {
        *at(pools, &v.value.pool).incidents.entry(v.value.state.as_str()).or_default() += 1;
    }
    for (name, pool) in r.state.pools() {
        let counts = r.pool_counts(name);
        let allowed =
            mpsfleet_core::remediation::storm_breaker_allowed(counts.total, &pool.value.remediation_policy);
        at(pools, name).storm_breaker_tripped = u64::from(counts.unhealthy) > allowed;
        if let Some(prov) = pool.value.provider.as_ref().filter(|p| p.scaling().is_some()) {
            let reservation = scaling.get(name).map_or(0, |m| m.reservation_percent);
            at(pools, name).scaling = Some((i64::from(prov.desired_hosts), reservation as i64));
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_core::clock::ManualClock;

    /// A cluster of `hosts` hosts of 8 GPUs in pool `p`, each onboarded, with a task per host.
    fn fleet(hosts: u32) -> Cluster {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let mut c = Cluster::load(Arc::new(mpsfleet_store::MemoryStore::new()), clock, |_| Ok(())).unwrap();
        c.create_pool(CreatePool { name: "p".into(), ..Default::default() }).unwrap();
        for h in 0..hosts {
            let reg = HostRegistration {
                pool: PoolName::new("p").unwrap(),
                hostname: format!("h{h}"),
                gpus: (0..8)
                    .map(|g| GpuInventory::emulated_h200(GpuUuid::new(format!("GPU-{h}-{g}")).unwrap(), g))
                    .collect(),
                mps_available: true,
                emulated: true,
                runtime: Default::default(),
                runtime_version: None,
                plugins: Default::default(),
                platform: Default::default(),
            };
            let id = c.register_host(reg).unwrap().host_id;
            c.host_status(&id, &HostStatusReport { onboarded: true, ..Default::default() }).unwrap();
        }
        let td = br#"{"family": "t", "containerDefinitions": [{"name": "m", "command": ["sleep", "1"],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}]}"#;
        c.register_taskdef(td).unwrap();
        let run = RunTask {
            task_definition: "t".into(),
            count: hosts,
            pool: "p".into(),
            client_token: None,
            ..Default::default()
        };
        c.run_tasks(run).unwrap();
        c
    }

    fn series(c: &Cluster) -> Vec<String> {
        let text = crate::metrics::render(&c.metrics_state(), &c.live_metrics());
        let mut names: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_series_do_not_grow_with_the_fleet() {
        let (small, large) = (fleet(1), fleet(300));
        assert_eq!(series(&small), series(&large), "the same series, whatever the fleet's size");
        let state = large.metrics_state();
        let p = &state.pools["p"];
        assert_eq!(p.gpus.values().sum::<i64>(), 2400);
        assert_eq!(p.mps_memory_reserved_bytes, 300 * 1024 * MIB);
        assert_eq!(p.mps_clients, 300);
        assert_eq!(
            p.tasks.get("PENDING").copied().unwrap_or(0) + p.tasks.get("PROVISIONING").copied().unwrap_or(0),
            300
        );
    }
}
