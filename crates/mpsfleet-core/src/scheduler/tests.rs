//! Tests of the placement engine: table-driven cases, then properties over random fleets.

use super::*;
use proptest::prelude::*;

const H200: u64 = 143_771;

fn mps(memory_mib: u64, compute: Option<u32>) -> GpuDemand {
    GpuDemand::Mps { memory_mib, clients: 1, compute_percent: compute.unwrap_or(100) }
}

fn fleet(strategy: PlacementStrategy, hosts: &[&[u64]]) -> (Scheduler, PoolIx) {
    let mut s = Scheduler::new();
    let pool = s.upsert_pool("p", PoolConfig { strategy, compute_bound: None });
    for (i, gpus) in hosts.iter().enumerate() {
        let h = s
            .add_host(HostSpec {
                id: HostId::new(format!("h{i}")).unwrap(),
                pool,
                mps_available: true,
                runs_images: false,
                gpus: gpus.iter().map(|&m| GpuSpec { memory_mib: m, max_clients: 48 }).collect(),
            })
            .unwrap();
        s.set_schedulable(h, true);
    }
    (s, pool)
}

fn req(pool: PoolIx, demand: GpuDemand) -> Request {
    Request { pool, demand, group: None, needs: Needs::NONE, tenant: None }
}

#[test]
fn binpack_fills_the_fullest_gpu_that_fits() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200, H200]]);
    let a = s.place(&req(p, mps(100_000, None))).unwrap();
    let b = s.place(&req(p, mps(40_000, None))).unwrap();
    assert_eq!(a.gpus, b.gpus, "the second task should join the shared GPU that still fits");
    let c = s.place(&req(p, mps(10_000, None))).unwrap();
    assert_ne!(c.gpus, a.gpus, "3,771 MiB left on the first GPU cannot take 10,000");
    assert_eq!(s.gpu(a.gpus[0]).remaining_mib(), H200 - 140_000);
}

/// A GPU whose daemon was seen not answering takes no new MPS task, shared or idle, until it
/// is opened again; whole-GPU placement still sees it, and releases there keep it closed.
#[test]
fn a_gpu_closed_to_mps_is_skipped_until_opened() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200, H200]]);
    let a = s.place(&req(p, mps(1_000, None))).unwrap();
    s.set_mps_open(a.gpus[0], false);
    let b = s.place(&req(p, mps(1_000, None))).unwrap();
    assert_ne!(b.gpus, a.gpus, "placed on a closed GPU");
    s.set_mps_open(b.gpus[0], false);
    let err = s.place(&req(p, mps(1_000, None))).unwrap_err();
    assert_eq!(err, Unplaced::MpsDaemonsNotAnswering { pool: "p".into(), memory_mib: 1_000, closed_gpus: 2 });
    assert!(err.to_string().contains("2 GPU(s) wait for their MPS daemon"), "{err}");
    s.release(&req(p, mps(1_000, None)), &a);
    assert!(s.place(&req(p, mps(1_000, None))).is_err(), "a release does not reopen a GPU");
    assert!(s.place(&req(p, GpuDemand::Whole { count: 1 })).is_ok(), "whole-GPU tasks need no daemon");
    s.set_mps_open(b.gpus[0], true);
    assert_eq!(s.place(&req(p, mps(1_000, None))).unwrap().gpus, b.gpus);
}

#[test]
fn binpack_prefers_the_smallest_idle_gpu_that_fits() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200], &[24_576]]);
    let a = s.place(&req(p, mps(8_000, None))).unwrap();
    assert_eq!(a.host, 1, "the 24 GiB GPU is the best fit");
    let b = s.place(&req(p, mps(30_000, None))).unwrap();
    assert_eq!(b.host, 0);
}

#[test]
fn spread_uses_the_emptiest_gpu() {
    let (mut s, p) = fleet(PlacementStrategy::Spread, &[&[H200, H200]]);
    let a = s.place(&req(p, mps(1_000, None))).unwrap();
    let b = s.place(&req(p, mps(1_000, None))).unwrap();
    assert_ne!(a.gpus, b.gpus);
    let c = s.place(&req(p, mps(1_000, None))).unwrap();
    assert_eq!(s.gpu(c.gpus[0]).clients, 2);
}

#[test]
fn mps_and_whole_gpu_tasks_never_share() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200, H200]]);
    let shared = s.place(&req(p, mps(1_000, None))).unwrap();
    let whole = s.place(&req(p, GpuDemand::Whole { count: 1 })).unwrap();
    assert_ne!(shared.gpus, whole.gpus);
    assert_eq!(s.gpu(whole.gpus[0]).mode(), SharingMode::Dedicated);
    let err = s.place(&req(p, GpuDemand::Whole { count: 1 })).unwrap_err();
    assert_eq!(err, Unplaced::NotEnoughIdleGpus { pool: "p".into(), count: 1, most_idle_on_one_host: 0 });
    // The dedicated GPU is not offered to MPS tasks either: this one fits only the shared GPU.
    let next = s.place(&req(p, mps(1_000, None))).unwrap();
    assert_eq!(next.gpus, shared.gpus);
}

#[test]
fn whole_gpu_tasks_take_gpus_from_one_host() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200; 2], &[H200; 4]]);
    let a = s.place(&req(p, GpuDemand::Whole { count: 3 })).unwrap();
    assert_eq!(a.host, 1);
    assert_eq!(a.gpus, vec![2, 3, 4]);
    let b = s.place(&req(p, GpuDemand::Whole { count: 2 })).unwrap();
    assert_eq!(b.host, 0, "binpack takes the host with the fewest idle GPUs that suffice");
    s.release(&req(p, GpuDemand::Whole { count: 3 }), &a);
    assert!(s.host_gpus(1).all(|g| s.gpu(g).mode() == SharingMode::Idle));
}

#[test]
fn client_limit_is_the_hosts() {
    let mut s = Scheduler::new();
    let p = s.upsert_pool("p", PoolConfig::default());
    let h = s
        .add_host(HostSpec {
            id: HostId::new("h").unwrap(),
            pool: p,
            mps_available: true,
            runs_images: false,
            gpus: vec![GpuSpec { memory_mib: H200, max_clients: 2 }],
        })
        .unwrap();
    s.set_schedulable(h, true);
    s.place(&req(p, mps(1, None))).unwrap();
    s.place(&req(p, mps(1, None))).unwrap();
    let err = s.place(&req(p, mps(1, None))).unwrap_err();
    assert!(matches!(err, Unplaced::InsufficientGpuMemory { .. } | Unplaced::GpuLimits { .. }), "{err:?}");
    assert_eq!(s.gpu(0).clients, 2);
}

#[test]
fn a_two_client_task_does_not_overflow_the_last_slot() {
    let mut s = Scheduler::new();
    let p = s.upsert_pool("p", PoolConfig::default());
    let h = s
        .add_host(HostSpec {
            id: HostId::new("h").unwrap(),
            pool: p,
            mps_available: true,
            runs_images: false,
            gpus: vec![GpuSpec { memory_mib: H200, max_clients: 3 }],
        })
        .unwrap();
    s.set_schedulable(h, true);
    s.place(&req(p, GpuDemand::Mps { memory_mib: 1, clients: 2, compute_percent: 200 })).unwrap();
    let err =
        s.place(&req(p, GpuDemand::Mps { memory_mib: 1, clients: 2, compute_percent: 200 })).unwrap_err();
    assert!(matches!(err, Unplaced::GpuLimits { clients: 2, .. }), "{err:?}");
}

#[test]
fn compute_overcommit_bound_holds() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200]]);
    s.upsert_pool("p", PoolConfig { strategy: PlacementStrategy::Binpack, compute_bound: Some(150) });
    s.place(&req(p, mps(1_000, Some(100)))).unwrap();
    s.place(&req(p, mps(1_000, Some(50)))).unwrap();
    let err = s.place(&req(p, mps(1_000, Some(1)))).unwrap_err();
    assert!(matches!(err, Unplaced::GpuLimits { compute_percent: 1, .. }), "{err:?}");
    assert_eq!(s.gpu(0).compute_percent, 150);
}

#[test]
fn unschedulable_hosts_take_nothing_and_waiting_reasons_say_why() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200]]);
    s.set_schedulable(0, false);
    let err = s.place(&req(p, mps(1, None))).unwrap_err();
    assert_eq!(err.to_string(), "no ACTIVE, uncordoned, healthy host in pool p");
    s.set_schedulable(0, true);
    let err = s.place(&req(p, mps(200_000, None))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no GPU in pool p has 200000 MiB free for 1 MPS client(s); the largest free is 143771 MiB"
    );
}

#[test]
fn hosts_without_mps_take_only_whole_gpu_tasks() {
    let mut s = Scheduler::new();
    let p = s.upsert_pool("p", PoolConfig::default());
    let h = s
        .add_host(HostSpec {
            id: HostId::new("h").unwrap(),
            pool: p,
            mps_available: false,
            runs_images: false,
            gpus: vec![GpuSpec { memory_mib: H200, max_clients: 48 }],
        })
        .unwrap();
    s.set_schedulable(h, true);
    assert_eq!(s.place(&req(p, mps(1, None))).unwrap_err(), Unplaced::NoMpsHost { pool: "p".into() });
    assert!(s.place(&req(p, GpuDemand::Whole { count: 1 })).is_ok());
}

#[test]
fn service_replicas_spread_over_hosts_then_gpus() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200, H200], &[H200, H200]]);
    let g = s.group("svc");
    let mut hosts = Vec::new();
    let mut gpus = Vec::new();
    for _ in 0..4 {
        let pl = s
            .place(&Request {
                pool: p,
                demand: mps(1_000, None),
                group: Some(g),
                needs: Needs::NONE,
                tenant: None,
            })
            .unwrap();
        hosts.push(pl.host);
        gpus.push(pl.gpus[0]);
    }
    hosts.sort();
    gpus.sort();
    assert_eq!(hosts, vec![0, 0, 1, 1], "two replicas on each host");
    assert_eq!(gpus, vec![0, 1, 2, 3], "one replica per GPU");
}

#[test]
fn release_restores_the_index() {
    let (mut s, p) = fleet(PlacementStrategy::Binpack, &[&[H200]]);
    let r = req(p, mps(H200, None));
    let a = s.place(&r).unwrap();
    assert!(s.place(&r).is_err());
    s.release(&r, &a);
    assert_eq!(s.gpu(0).mode(), SharingMode::Idle);
    assert_eq!(s.place(&r).unwrap(), a);
}

// ---- host needs: images and static host ports ------------------------------------------

const TCP_8080: (Protocol, u16) = (Protocol::Tcp, 8080);
const UDP_8080: (Protocol, u16) = (Protocol::Udp, 8080);

/// A pool of hosts, each with whether its runtime runs images and its GPUs' memory.
fn mixed(hosts: &[(bool, &[u64])]) -> (Scheduler, PoolIx) {
    let mut s = Scheduler::new();
    let pool = s.upsert_pool("gpu", PoolConfig::default());
    for (i, (runs_images, gpus)) in hosts.iter().enumerate() {
        let h = s
            .add_host(HostSpec {
                id: HostId::new(format!("h{i}")).unwrap(),
                pool,
                mps_available: true,
                runs_images: *runs_images,
                gpus: gpus.iter().map(|&m| GpuSpec { memory_mib: m, max_clients: 48 }).collect(),
            })
            .unwrap();
        s.set_schedulable(h, true);
    }
    (s, pool)
}

fn needing(pool: PoolIx, demand: GpuDemand, images: bool, ports: &[(Protocol, u16)]) -> Request {
    Request { pool, demand, group: None, needs: Needs::new(images, ports), tenant: None }
}

/// One demand of each chooser: GPU-less, whole GPU, MPS.
fn every_demand() -> [GpuDemand; 3] {
    [GpuDemand::None, GpuDemand::Whole { count: 1 }, mps(1_000, None)]
}

#[test]
fn image_tasks_go_only_to_hosts_that_run_images() {
    for demand in every_demand() {
        let (mut s, p) = mixed(&[(false, &[H200, H200]), (true, &[H200, H200]), (false, &[H200, H200])]);
        for _ in 0..2 {
            let pl = s.place(&needing(p, demand, true, &[])).unwrap();
            assert_eq!(pl.host, 1, "{demand:?} placed on a host that runs no images");
        }
    }
}

#[test]
fn a_process_task_still_goes_to_any_host() {
    let (mut s, p) = mixed(&[(false, &[]), (true, &[])]);
    let hosts: BTreeSet<HostIx> = (0..4).map(|_| s.place(&req(p, GpuDemand::None)).unwrap().host).collect();
    assert_eq!(hosts, BTreeSet::from([0, 1]), "GPU-less process tasks spread over both runtimes");
}

#[test]
fn an_image_task_waits_while_no_host_runs_images() {
    let (mut s, p) = mixed(&[(false, &[H200]), (true, &[H200])]);
    s.set_schedulable(1, false);
    for demand in every_demand() {
        let err = s.place(&needing(p, demand, true, &[])).unwrap_err();
        assert_eq!(err, Unplaced::NoContainerHost { pool: "gpu".into() });
        assert_eq!(
            err.to_string(),
            "no schedulable host in pool gpu runs containers (the task runs images); start an agent \
             with --runtime docker"
        );
    }
    s.set_schedulable(1, true);
    assert_eq!(s.place(&needing(p, GpuDemand::None, true, &[])).unwrap().host, 1);
}

#[test]
fn an_image_task_waits_when_only_process_hosts_have_room() {
    let (mut s, p) = mixed(&[(false, &[H200]), (true, &[H200])]);
    s.place(&needing(p, GpuDemand::Whole { count: 1 }, true, &[])).unwrap();
    let err = s.place(&needing(p, GpuDemand::Whole { count: 1 }, true, &[])).unwrap_err();
    assert_eq!(err, Unplaced::NoFittingContainerHost { pool: "gpu".into() });
    assert!(err.to_string().contains("--runtime docker"), "{err}");
    // The process host's GPU is still free for a task that needs no images.
    assert_eq!(s.place(&req(p, GpuDemand::Whole { count: 1 })).unwrap().host, 0);
}

#[test]
fn two_tasks_with_one_static_port_never_share_a_host() {
    for demand in every_demand() {
        let (mut s, p) = mixed(&[(true, &[H200, H200]), (true, &[H200, H200])]);
        let r = needing(p, demand, true, &[TCP_8080]);
        let a = s.place(&r).unwrap();
        let b = s.place(&r).unwrap();
        assert_ne!(a.host, b.host, "{demand:?}: two tasks hold tcp/8080 on one host");
        let err = s.place(&r).unwrap_err();
        assert_eq!(err, Unplaced::HostPortsInUse { pool: "gpu".into(), ports: vec![TCP_8080] });
        assert!(
            err.to_string().starts_with("no host in pool gpu that fits has host port tcp/8080 free"),
            "{err}"
        );
        // The hosts still have GPUs for tasks that need no ports.
        assert!(s.place(&req(p, demand)).is_ok());
        s.release(&r, &a);
        assert_eq!(s.place(&r).unwrap().host, a.host, "{demand:?}: the released port is free again");
    }
}

#[test]
fn tcp_and_udp_of_one_port_do_not_conflict() {
    let (mut s, p) = mixed(&[(true, &[])]);
    s.place(&needing(p, GpuDemand::None, true, &[TCP_8080])).unwrap();
    s.place(&needing(p, GpuDemand::None, true, &[UDP_8080])).unwrap();
    let err = s.place(&needing(p, GpuDemand::None, true, &[(Protocol::Tcp, 9000), UDP_8080])).unwrap_err();
    assert_eq!(err, Unplaced::HostPortsInUse { pool: "gpu".into(), ports: vec![UDP_8080] });
}

#[test]
fn the_reason_names_every_port_taken_on_the_fitting_hosts() {
    let (mut s, p) = mixed(&[(true, &[]), (true, &[])]);
    let a = s.place(&needing(p, GpuDemand::None, true, &[TCP_8080])).unwrap();
    let b = s.place(&needing(p, GpuDemand::None, true, &[(Protocol::Udp, 53)])).unwrap();
    assert_ne!(a.host, b.host);
    let err = s
        .place(&needing(p, GpuDemand::None, true, &[(Protocol::Udp, 53), TCP_8080, (Protocol::Tcp, 9)]))
        .unwrap_err();
    assert!(
        err.to_string().starts_with("no host in pool gpu that fits has host ports tcp/8080, udp/53 free"),
        "{err}"
    );
}

#[test]
fn ports_of_stored_placements_are_accounted_on_reserve() {
    let (mut s, p) = mixed(&[(true, &[H200]), (true, &[H200])]);
    let r = needing(p, mps(1_000, None), true, &[TCP_8080]);
    let stored = Placement { host: 0, gpus: vec![0] };
    s.reserve(&r, &stored);
    assert_eq!(s.place(&r).unwrap().host, 1, "host 0 holds tcp/8080 for the stored task");
    assert!(matches!(s.place(&r), Err(Unplaced::HostPortsInUse { .. })));
    s.release(&r, &stored);
    assert_eq!(s.place(&r).unwrap(), stored);
}

#[test]
fn a_port_loaded_twice_on_one_host_is_free_only_after_both_release() {
    let (mut s, p) = mixed(&[(true, &[])]);
    let r = needing(p, GpuDemand::None, true, &[TCP_8080]);
    let on0 = Placement { host: 0, gpus: Vec::new() };
    s.reserve(&r, &on0);
    s.reserve(&r, &on0);
    s.release(&r, &on0);
    assert!(s.place(&r).is_err(), "one holder of tcp/8080 remains");
    s.release(&r, &on0);
    assert_eq!(s.place(&r).unwrap(), on0);
}

#[test]
fn a_group_spreads_among_hosts_that_meet_the_needs() {
    let (mut s, p) = mixed(&[(false, &[]), (true, &[]), (true, &[])]);
    let g = s.group("svc");
    let r = Request {
        pool: p,
        demand: GpuDemand::None,
        group: Some(g),
        needs: Needs::new(true, &[]),
        tenant: None,
    };
    let hosts: Vec<HostIx> = (0..4).map(|_| s.place(&r).unwrap().host).collect();
    assert_eq!(hosts, vec![1, 2, 1, 2]);
}

#[test]
fn host_ports_hold_at_most_the_limit() {
    let many: Vec<(Protocol, u16)> = (0..=MAX_HOST_PORTS as u16).map(|n| (Protocol::Tcp, 1000 + n)).collect();
    assert_eq!(HostPorts::new(&many), Err(TooManyHostPorts { count: MAX_HOST_PORTS + 1 }));
    assert_eq!(HostPorts::new(&many[..MAX_HOST_PORTS]).unwrap().len(), MAX_HOST_PORTS);
    let set = HostPorts::new(&[UDP_8080, TCP_8080, (Protocol::Tcp, 80), TCP_8080]).unwrap();
    let ports: Vec<_> = set.iter().collect();
    assert_eq!(ports, vec![(Protocol::Tcp, 80), TCP_8080, UDP_8080], "sorted, duplicates once");
    assert!(Needs::new(false, &[]).is_none());
    assert!(!Needs::new(false, &[TCP_8080]).is_none());

    let (mut s, p) = mixed(&[(true, &[])]);
    let err = s.place(&needing(p, GpuDemand::None, true, &many)).unwrap_err();
    assert_eq!(err, Unplaced::TooManyHostPorts { count: MAX_HOST_PORTS as u32 + 1 });
    assert!(err.to_string().contains("above the limit of 16"), "{err}");
}

// ---- properties -------------------------------------------------------------------------

/// A host of a case: its GPUs (memory, client limit), MPS available, runs images.
type HostCase = (Vec<(u64, u32)>, bool, bool);

#[derive(Debug, Clone)]
struct FleetCase {
    hosts: Vec<HostCase>,
    strategy: PlacementStrategy,
    compute_bound: Option<u32>,
    ops: Vec<Op>,
}

#[derive(Debug, Clone)]
enum Op {
    Place(GpuDemand, Option<u8>, Needs),
    /// Release the n-th live placement (modulo their count).
    Release(usize),
    Toggle(usize),
}

fn demand() -> impl Strategy<Value = GpuDemand> {
    prop_oneof![
        Just(GpuDemand::None),
        (1u32..4).prop_map(|count| GpuDemand::Whole { count }),
        (1u64..60_000, 1u32..3, 1u32..=100).prop_map(|(memory_mib, clients, c)| GpuDemand::Mps {
            memory_mib,
            clients,
            compute_percent: c * clients
        }),
    ]
}

/// Mostly no needs (the common case); otherwise images and a few of four ports that clash.
fn needs() -> impl Strategy<Value = Needs> {
    const PORTS: [(Protocol, u16); 4] =
        [(Protocol::Tcp, 80), (Protocol::Tcp, 8080), (Protocol::Udp, 8080), (Protocol::Udp, 53)];
    prop_oneof![
        2 => Just(Needs::NONE),
        1 => (any::<bool>(), prop::collection::vec(0usize..4, 0..3)).prop_map(|(images, ix)| {
            let ports: Vec<_> = ix.iter().map(|&i| PORTS[i]).collect();
            Needs::new(images, &ports)
        }),
    ]
}

fn case() -> impl Strategy<Value = FleetCase> {
    let host = (
        prop::collection::vec((prop_oneof![Just(24_576u64), Just(81_559), Just(H200)], 1u32..6), 1..5),
        any::<bool>(),
        any::<bool>(),
    );
    let op = prop_oneof![
        6 => (demand(), prop::option::of(0u8..3), needs()).prop_map(|(d, g, n)| Op::Place(d, g, n)),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Toggle),
    ];
    (
        prop::collection::vec(host, 1..6),
        prop_oneof![Just(PlacementStrategy::Binpack), Just(PlacementStrategy::Spread)],
        prop::option::of(50u32..400),
        prop::collection::vec(op, 1..150),
    )
        .prop_map(|(hosts, strategy, compute_bound, ops)| FleetCase {
            hosts,
            strategy,
            compute_bound,
            ops,
        })
}

/// Runs a case, checking the invariants after every step; returns the decision log.
fn run(case: &FleetCase) -> Vec<Result<Placement, Unplaced>> {
    let mut s = Scheduler::new();
    let p = s.upsert_pool("p", PoolConfig { strategy: case.strategy, compute_bound: case.compute_bound });
    for (i, (gpus, mps_available, runs_images)) in case.hosts.iter().enumerate() {
        let h = s
            .add_host(HostSpec {
                id: HostId::new(format!("h{i}")).unwrap(),
                pool: p,
                mps_available: *mps_available,
                runs_images: *runs_images,
                gpus: gpus
                    .iter()
                    .map(|&(memory_mib, max_clients)| GpuSpec { memory_mib, max_clients })
                    .collect(),
            })
            .unwrap();
        s.set_schedulable(h, true);
    }
    let groups: Vec<GroupIx> = (0..3).map(|g| s.group(&format!("g{g}"))).collect();
    let mut live: Vec<(Request, Placement)> = Vec::new();
    let mut log = Vec::new();
    for op in &case.ops {
        match op {
            Op::Place(demand, group, needs) => {
                let r = Request {
                    pool: p,
                    demand: *demand,
                    group: group.map(|g| groups[g as usize]),
                    needs: *needs,
                    tenant: None,
                };
                let before: Vec<GpuState> = (0..s.gpu_count() as GpuIx).map(|g| *s.gpu(g)).collect();
                let out = s.place(&r);
                match &out {
                    Ok(pl) => {
                        assert!(s.is_schedulable(pl.host), "placed on an unschedulable host");
                        check_fits(&before, &r, pl, case.compute_bound);
                        check_needs_met(&s, &live, &r, pl);
                        live.push((r, pl.clone()));
                    }
                    Err(why) => {
                        assert!(!why.to_string().is_empty());
                        check_really_unplaceable(&s, &before, &r, case.compute_bound);
                    }
                }
                log.push(out);
            }
            Op::Release(n) if !live.is_empty() => {
                let (r, pl) = live.swap_remove(n % live.len());
                s.release(&r, &pl);
            }
            Op::Release(_) => {}
            Op::Toggle(n) => {
                let h = (n % case.hosts.len()) as HostIx;
                let now = s.is_schedulable(h);
                s.set_schedulable(h, !now);
            }
        }
        check_accounting(&s, &live);
    }
    log
}

/// A fresh placement respected every limit of the GPUs it chose.
fn check_fits(before: &[GpuState], r: &Request, pl: &Placement, bound: Option<u32>) {
    match r.demand {
        GpuDemand::None => assert!(pl.gpus.is_empty()),
        GpuDemand::Whole { count } => {
            assert_eq!(pl.gpus.len(), count as usize);
            for &g in &pl.gpus {
                assert_eq!(before[g as usize].mode(), SharingMode::Idle, "whole-GPU task on a used GPU");
                assert_eq!(before[g as usize].host, pl.host, "whole-GPU task spans hosts");
            }
        }
        GpuDemand::Mps { memory_mib, clients, compute_percent } => {
            assert_eq!(pl.gpus.len(), 1);
            let g = before[pl.gpus[0] as usize];
            assert_ne!(g.mode(), SharingMode::Dedicated, "MPS task on a dedicated GPU");
            assert!(g.remaining_mib() >= memory_mib, "GPU over its memory");
            assert!(g.clients + clients <= g.max_clients, "GPU over its client limit");
            if let Some(b) = bound {
                assert!(g.compute_percent + compute_percent <= b, "GPU over the compute bound");
            }
        }
    }
}

/// A fresh placement's host runs images if the task does, and holds none of its ports for a
/// live task (`live` is the state before this placement).
fn check_needs_met(s: &Scheduler, live: &[(Request, Placement)], r: &Request, pl: &Placement) {
    assert!(!r.needs.images || s.hosts[pl.host as usize].runs_images, "image task on a process host");
    for (other, _) in live.iter().filter(|(_, opl)| opl.host == pl.host) {
        for port in r.needs.ports.iter() {
            assert!(
                !other.needs.ports.iter().any(|q| q == port),
                "two tasks hold {port:?} on host {}",
                pl.host
            );
        }
    }
}

/// Whether a host's runtime and free ports meet a request's needs (brute force).
fn meets(s: &Scheduler, h: HostIx, r: &Request) -> bool {
    let host = &s.hosts[h as usize];
    (!r.needs.images || host.runs_images) && r.needs.ports.keys().iter().all(|k| !host.ports.contains(k))
}

/// Brute force: when the index says no, no schedulable GPU or host could take the task.
fn check_really_unplaceable(s: &Scheduler, before: &[GpuState], r: &Request, bound: Option<u32>) {
    let hosts = (0..s.hosts.len() as HostIx).filter(|&h| s.is_schedulable(h) && meets(s, h, r));
    for h in hosts {
        let idle = s.host_gpus(h).filter(|&g| before[g as usize].mode() == SharingMode::Idle).count() as u32;
        match r.demand {
            GpuDemand::None => panic!("a schedulable host exists but a GPU-less task waits"),
            GpuDemand::Whole { count } => assert!(idle < count, "host {h} has {idle} idle GPUs"),
            GpuDemand::Mps { memory_mib, clients, compute_percent } => {
                if !s.hosts[h as usize].mps_available {
                    continue;
                }
                for g in s.host_gpus(h) {
                    let st = before[g as usize];
                    let fits = st.mode() != SharingMode::Dedicated
                        && st.remaining_mib() >= memory_mib
                        && st.clients + clients <= st.max_clients
                        && bound.is_none_or(|b| st.compute_percent + compute_percent <= b);
                    assert!(!fits, "GPU {g} could take the task but it waits: {st:?}");
                }
            }
        }
    }
}

/// GPU and port accounting equal the sum of the live placements.
fn check_accounting(s: &Scheduler, live: &[(Request, Placement)]) {
    let mut ports: Vec<Vec<u32>> = vec![Vec::new(); s.hosts.len()];
    for (r, pl) in live {
        ports[pl.host as usize].extend_from_slice(r.needs.ports.keys());
    }
    for (h, mut want) in ports.into_iter().enumerate() {
        want.sort_unstable();
        assert_eq!(s.hosts[h].ports, want, "ports held on host {h}");
        let mut distinct = want.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), want.len(), "host {h} has a port held twice");
    }
    let mut used = vec![(0u64, 0u32, 0u32, 0u32); s.gpu_count()];
    for (r, pl) in live {
        for &g in &pl.gpus {
            let u = &mut used[g as usize];
            match r.demand {
                GpuDemand::Mps { memory_mib, clients, compute_percent } => {
                    u.0 += memory_mib;
                    u.1 += clients;
                    u.2 += compute_percent;
                }
                GpuDemand::Whole { .. } => u.3 += 1,
                GpuDemand::None => {}
            }
        }
    }
    for (g, u) in used.iter().enumerate() {
        let st = s.gpu(g as GpuIx);
        assert_eq!((st.used_mib, st.clients, st.compute_percent, st.dedicated), *u, "GPU {g}");
        assert!(st.used_mib <= st.total_mib, "GPU {g} over its memory");
        assert!(st.clients <= st.max_clients, "GPU {g} over its client limit");
        assert!(
            st.dedicated <= 1 && !(st.dedicated == 1 && st.clients > 0),
            "GPU {g} shared by MPS and whole-GPU tasks"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn invariants_hold_over_random_fleets(c in case()) {
        run(&c);
    }

    #[test]
    fn same_input_gives_same_placements(c in case()) {
        prop_assert_eq!(run(&c), run(&c));
    }
}

/// Groups that hold no task and are not kept are forgotten, and their slots reused.
#[test]
fn forgotten_groups_free_their_slots() {
    let mut s = Scheduler::default();
    let a = s.group("web/d-1");
    let b = s.group("web/d-2");
    assert_ne!(a, b);
    s.forget_groups(|name| name == "web/d-2");
    assert_eq!(s.group_count(), 1);
    assert_eq!(s.group("web/d-2"), b, "kept");
    assert_eq!(s.group("web/d-3"), a, "the freed slot is reused");
    assert_eq!(s.group_count(), 2);
}
