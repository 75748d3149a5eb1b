use super::*;

/// A 2-GPU H200 host, compute unbounded.
fn h200() -> Shape {
    Shape {
        gpus: 2,
        gpu_memory_mib: 143_771,
        max_clients: 48,
        compute_bound: None,
        cpu: None,
        memory_mib: None,
    }
}

fn mps(memory_mib: u64) -> GpuDemand {
    GpuDemand::Mps { memory_mib, clients: 1, compute_percent: 100 }
}

fn burst() -> Vec<GpuDemand> {
    let mut w: Vec<GpuDemand> = (0..12).map(|_| mps(40_000)).collect();
    w.extend((0..6).map(|_| mps(70_000)));
    w
}

#[test]
fn a_mixed_burst_packs_as_tightly_as_the_scheduler_would() {
    // 12 × 40,000 and 6 × 70,000 MiB on 143,771 MiB GPUs: each GPU takes 70,000 + 40,000 (6
    // GPUs) and the other 6 × 40,000 go 3 per GPU (2 GPUs): 8 GPUs, 4 hosts.
    let p = pack(&h200(), &burst());
    assert_eq!((p.hosts, p.packed, p.never_fit), (4, 18, 0), "{p:?}");
    assert_eq!(p.mps_memory_mib, 12 * 40_000 + 6 * 70_000);
    // A lower bound that no packing can beat: total memory over one host's.
    let lower = p.mps_memory_mib.div_ceil(2 * 143_771);
    assert!(u64::from(p.hosts) <= lower + 1, "{} hosts, lower bound {lower}", p.hosts);
}

#[test]
fn clients_compute_and_whole_gpus_count_and_a_shape_no_host_holds_is_left_out() {
    let bounded = Shape { compute_bound: Some(100), ..h200() };
    let small = GpuDemand::Mps { memory_mib: 1_000, clients: 1, compute_percent: 50 };
    // Memory allows 143 per GPU; compute 2 per GPU: 8 tasks need 4 GPUs, 2 hosts.
    assert_eq!(pack(&bounded, &[small; 8]).hosts, 2);
    let clients = Shape { max_clients: 2, ..h200() };
    let tiny = GpuDemand::Mps { memory_mib: 10, clients: 1, compute_percent: 1 };
    assert_eq!(pack(&clients, &[tiny; 9]).hosts, 3, "2 clients per GPU: 9 tasks need 5 GPUs");
    // Whole GPUs: 2 + 1 + 1 on 2-GPU hosts is 2 hosts; an MPS task fills no dedicated GPU but
    // takes an idle one.
    let w = |count| GpuDemand::Whole { count };
    assert_eq!(pack(&h200(), &[w(1), w(2), w(1)]).hosts, 2);
    assert_eq!(pack(&h200(), &[w(1), mps(1_000)]).hosts, 1);
    let never = pack(&h200(), &[mps(200_000), w(3), mps(1_000)]);
    assert_eq!((never.hosts, never.packed, never.never_fit), (1, 1, 2));
    assert_eq!(pack(&h200(), &[GpuDemand::None]).hosts, 1);
    assert_eq!(pack(&h200(), &[]).hosts, 0);
}

fn policy() -> ManagedScaling {
    ManagedScaling { min_hosts: 1, max_hosts: 8, scale_in_after_seconds: 60, ..Default::default() }
}

#[test]
fn scale_out_takes_one_sized_step_within_its_limits() {
    let input = Input { hosts: 1, busy: 0, packing: pack(&h200(), &burst()), ..Default::default() };
    match decide(&policy(), &input) {
        Step::Out { target, add, why } => {
            assert_eq!((target, add), (4, 3), "{why}");
            assert!(why.contains("4 host(s) for 18 waiting task(s)"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // 90% target keeps a spare host; the step is clamped by maxHosts and the step sizes.
    let spare = ManagedScaling { target_capacity: 90, ..policy() };
    assert!(matches!(decide(&spare, &input), Step::Out { target: 5, add: 4, .. }));
    let capped = ManagedScaling { max_hosts: 3, ..policy() };
    assert!(matches!(decide(&capped, &input), Step::Out { target: 3, add: 2, .. }));
    let small_steps = ManagedScaling { maximum_scaling_step_size: 2, ..policy() };
    assert!(matches!(decide(&small_steps, &input), Step::Out { add: 2, .. }));
    // A step in flight within its warm-up: wait.
    let warming = Input { launching: 1, since_last_step_ms: Some(10_000), ..input.clone() };
    assert!(matches!(decide(&policy(), &warming), Step::Hold { .. }));
    // Nothing waiting, nothing busy: down to minHosts only through scale-in.
    let idle = Input { hosts: 1, ..Default::default() };
    assert!(matches!(decide(&policy(), &idle), Step::Hold { target: 1, .. }));
}

#[test]
fn scale_in_removes_only_quiet_empty_hosts_within_its_budget() {
    let empty = |ids: &[u64], ms: u64| ids.iter().map(|&i| (i, ms)).collect::<Vec<_>>();
    let input = Input { hosts: 4, busy: 1, empty_for_ms: empty(&[7, 8, 9], 61_000), ..Default::default() };
    // Target 1 busy host; budget 50% of 4 = 2 per step.
    match decide(&policy(), &input) {
        Step::In { target, remove, .. } => assert_eq!((target, remove.len()), (1, 2)),
        other => panic!("{other:?}"),
    }
    let young = Input { empty_for_ms: empty(&[7, 8, 9], 30_000), ..input.clone() };
    assert!(matches!(decide(&policy(), &young), Step::Hold { .. }), "not quiet long enough");
    let paused = Input { paused: true, ..input.clone() };
    assert!(matches!(decide(&policy(), &paused), Step::Hold { .. }));
    // Never below minHosts.
    let floor = ManagedScaling { min_hosts: 3, ..policy() };
    assert!(matches!(decide(&floor, &input), Step::In { target: 3, ref remove, .. } if remove.len() == 1));
}

#[test]
fn tasks_binding_one_host_port_never_share_a_host() {
    let port = |p: u32| vec![p];
    let web = |p: u32| Waiting { demand: mps(1_000), ports: port(p), cpu: 0, memory_mib: 0 };
    // Three small tasks on port 8080 need three hosts; a fourth on 9090 shares one.
    let tasks = vec![web(8080), web(8080), web(8080), web(9090)];
    assert_eq!(pack_tasks(&h200(), &tasks).hosts, 3);
    let cpu = |p: u32| Waiting { demand: GpuDemand::None, ports: port(p), cpu: 0, memory_mib: 0 };
    assert_eq!(pack_tasks(&h200(), &[cpu(80), cpu(80), cpu(81)]).hosts, 2);
    let whole = Waiting { demand: GpuDemand::Whole { count: 1 }, ports: port(8080), cpu: 0, memory_mib: 0 };
    assert_eq!(pack_tasks(&h200(), &[whole.clone(), whole]).hosts, 2);
}

#[test]
fn a_shape_with_cpu_and_memory_holds_only_what_they_allow() {
    let small = Shape { cpu: Some(4_096), memory_mib: Some(32_768), ..h200() };
    let task = |cpu: u32, memory_mib: u64| Waiting { demand: mps(1_000), ports: Vec::new(), cpu, memory_mib };
    // 4 vCPUs: four 1-vCPU tasks per host; 32 GiB: two of 16 GiB.
    assert_eq!(pack_tasks(&small, &vec![task(1_024, 0); 8]).hosts, 2);
    assert_eq!(pack_tasks(&small, &vec![task(0, 16_384); 5]).hosts, 3);
    // More than a host has: never fits, launches nothing.
    let p = pack_tasks(&small, &[task(8_192, 0)]);
    assert_eq!((p.hosts, p.never_fit), (0, 1));
    // Unset, a host holds any.
    assert_eq!(pack_tasks(&h200(), &vec![task(8_192, 100_000); 4]).hosts, 1);
}
