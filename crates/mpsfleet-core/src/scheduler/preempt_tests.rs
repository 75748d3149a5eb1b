//! Tests of preemption's choice: the rules one at a time, then properties over random fleets.

use super::*;
use mpsfleet_types::Protocol;
use proptest::prelude::*;

const GPU: u64 = 80_000;

fn pool_of(hosts: &[u32]) -> (Scheduler, PoolIx) {
    let mut s = Scheduler::new();
    let pool = s.upsert_pool("p", PoolConfig::default());
    for (i, &gpus) in hosts.iter().enumerate() {
        let h = s
            .add_host(HostSpec {
                id: HostId::new(format!("h{i}")).unwrap(),
                pool,
                mps_available: true,
                runs_images: false,
                gpus: (0..gpus).map(|_| GpuSpec { memory_mib: GPU, max_clients: 48 }).collect(),
            })
            .unwrap();
        s.set_schedulable(h, true);
    }
    (s, pool)
}

fn who(id: u64, priority: u8, since_ms: u64) -> Option<Tenant> {
    Some(Tenant { id, priority, since_ms, shield_until_ms: 0, hold: false })
}

fn mps(pool: PoolIx, memory_mib: u64, tenant: Option<Tenant>) -> Request {
    Request {
        pool,
        demand: GpuDemand::Mps { memory_mib, clients: 1, compute_percent: 100 },
        group: None,
        needs: Needs::NONE,
        tenant,
    }
}

/// Places `r` on `host` and returns the placement.
fn put(s: &mut Scheduler, r: &Request, host: HostIx) -> Placement {
    s.place_on(r, host).expect("room for the setup")
}

#[test]
fn a_full_gpu_gives_up_its_newest_lowest_priority_task_and_no_more() {
    let (mut s, p) = pool_of(&[1]);
    put(&mut s, &mps(p, 30_000, who(1, 10, 100)), 0);
    put(&mut s, &mps(p, 30_000, who(2, 10, 200)), 0);
    put(&mut s, &mps(p, 20_000, who(3, 90, 50)), 0);
    let r = mps(p, 20_000, who(9, 90, 300));
    assert!(s.place(&r).is_err(), "the pool is full");
    let got = s.preempt(&r, 1_000).expect("a victim exists");
    assert_eq!(got.victims, vec![2], "one task frees enough: the newer of the two at priority 10");
    assert_eq!(got.placement, Placement { host: 0, gpus: vec![0] });
    assert_eq!(got.cost.top_priority, 10);
    // 50,000 MiB needs both priority-10 tasks, never the priority-90 one.
    let big = mps(p, 50_000, who(9, 90, 300));
    assert_eq!(s.preempt(&big, 1_000).unwrap().victims, vec![2, 1]);
    let too_big = mps(p, 70_000, who(9, 90, 300));
    assert_eq!(s.preempt(&too_big, 1_000), None, "only priority-10 tasks may go, and they free 60,000");
}

#[test]
fn only_tasks_at_least_ten_below_unprotected_and_unshielded_are_victims() {
    let (mut s, p) = pool_of(&[1]);
    put(&mut s, &mps(p, GPU, who(1, 41, 100)), 0);
    assert_eq!(s.preempt(&mps(p, 1_000, who(9, 50, 0)), 0), None, "41 is 9 below 50");
    assert_eq!(s.preempt(&mps(p, 1_000, who(9, 51, 0)), 0).unwrap().victims, vec![1]);
    assert_eq!(s.preempt(&mps(p, 1_000, None), 0), None, "a request without a tenant never preempts");
    // Scale-in protection holds until it ends.
    assert!(s.set_tenant(0, 1, false, 5_000, 41));
    assert_eq!(s.preempt(&mps(p, 1_000, who(9, 90, 0)), 4_999), None);
    assert!(s.preempt(&mps(p, 1_000, who(9, 90, 0)), 5_000).is_some());
    // A shield (a preempted service's replacement) the same.
    let (mut s, p) = pool_of(&[1]);
    let shielded = Tenant { id: 1, priority: 10, since_ms: 0, shield_until_ms: 60_000, hold: false };
    put(&mut s, &mps(p, GPU, Some(shielded)), 0);
    assert_eq!(s.preempt(&mps(p, 1_000, who(9, 90, 0)), 59_999), None);
    assert!(s.preempt(&mps(p, 1_000, who(9, 90, 0)), 60_000).is_some());
}

#[test]
fn a_hold_is_never_a_victim_and_a_stopping_task_is_room_coming_free() {
    let (mut s, p) = pool_of(&[1]);
    let victim = mps(p, GPU, who(1, 10, 0));
    let at = put(&mut s, &victim, 0);
    let first = s.preempt(&mps(p, GPU, who(9, 90, 0)), 0).unwrap();
    assert_eq!(first.victims, vec![1]);
    // The server stops the victim and holds the room for the preemptor.
    assert!(s.set_tenant(0, 1, true, 0, 10));
    let hold = Request { tenant: Some(Tenant { hold: true, ..who(9, 90, 0).unwrap() }), ..mps(p, GPU, None) };
    s.reserve(&hold, &first.placement);
    assert_eq!(s.preempt(&mps(p, GPU, who(10, 100, 0)), 0), None, "the hold is not a victim");
    s.release(&hold, &first.placement);
    // Asked again (a server restarted): nothing new stops, the stopping task is waited for.
    let again = s.preempt(&mps(p, GPU, who(9, 90, 0)), 0).unwrap();
    assert!(again.victims.is_empty(), "{again:?}");
    assert_eq!(again.awaits, vec![1]);
    assert_eq!(again.cost.victims, 0);
    s.release(&victim, &at);
    assert_eq!(s.tenant_count(0), 0);
}

#[test]
fn lower_priorities_go_first_then_fewer_tasks() {
    // GPU 0: one task at 30; GPU 1: two at 10. Two at 10 cost less than one at 30.
    let (mut s, p) = pool_of(&[2]);
    let g0 = mps(p, GPU, who(1, 30, 0));
    s.reserve(&g0, &Placement { host: 0, gpus: vec![0] });
    for id in [2, 3] {
        s.reserve(&mps(p, GPU / 2, who(id, 10, 0)), &Placement { host: 0, gpus: vec![1] });
    }
    let got = s.preempt(&mps(p, GPU, who(9, 90, 0)), 0).unwrap();
    assert_eq!(got.placement.gpus, vec![1]);
    assert_eq!(got.victims.len(), 2);
    // At one priority, one large task beats two small ones.
    let (mut s, p) = pool_of(&[2]);
    s.reserve(&mps(p, GPU, who(1, 10, 0)), &Placement { host: 0, gpus: vec![0] });
    for id in [2, 3] {
        s.reserve(&mps(p, GPU / 2, who(id, 10, 5)), &Placement { host: 0, gpus: vec![1] });
    }
    let got = s.preempt(&mps(p, GPU, who(9, 90, 0)), 0).unwrap();
    assert_eq!((got.placement.gpus.clone(), got.victims.clone()), (vec![0], vec![1]));
}

#[test]
fn whole_gpus_and_static_ports_are_made_on_one_host() {
    let (mut s, p) = pool_of(&[2, 2]);
    for (id, host, gpu) in [(1, 0, 0), (2, 0, 1), (3, 1, 2)] {
        s.reserve(&mps(p, 1_000, who(id, 10, 0)), &Placement { host, gpus: vec![gpu] });
    }
    s.reserve(&mps(p, 1_000, who(4, 95, 0)), &Placement { host: 1, gpus: vec![3] });
    let whole = Request { demand: GpuDemand::Whole { count: 2 }, ..mps(p, 0, who(9, 90, 0)) };
    let got = s.preempt(&whole, 0).unwrap();
    assert_eq!(got.placement, Placement { host: 0, gpus: vec![0, 1] }, "host 1 holds a task at 95");
    assert_eq!(got.victims.len(), 2);
    // A task holding a static port the preemptor needs goes with it, wherever the GPU room is.
    let (mut s, p) = pool_of(&[1]);
    let port = Needs::new(false, &[(Protocol::Tcp, 8080)]);
    s.reserve(
        &Request { needs: port, ..mps(p, 1_000, who(1, 10, 0)) },
        &Placement { host: 0, gpus: vec![0] },
    );
    let wants = Request { needs: port, ..mps(p, 1_000, who(9, 90, 0)) };
    assert!(s.place(&Request { tenant: None, ..wants }).is_err(), "the port is taken");
    assert_eq!(s.preempt(&wants, 0).unwrap().victims, vec![1]);
    // Held by a task that may not go: no set.
    let (mut s, p) = pool_of(&[1]);
    s.reserve(
        &Request { needs: port, ..mps(p, 1_000, who(1, 85, 0)) },
        &Placement { host: 0, gpus: vec![0] },
    );
    assert_eq!(s.preempt(&wants, 0), None);
}

#[derive(Debug, Clone)]
struct Case {
    gpus_per_host: Vec<u32>,
    tasks: Vec<(u64, u8, u64)>,
    need: u64,
    priority: u8,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(1u32..4, 1..5),
        prop::collection::vec((1u64..40_000, 1u8..=100, 0u64..1_000), 0..40),
        1u64..GPU,
        1u8..=100,
    )
        .prop_map(|(gpus_per_host, tasks, need, priority)| Case { gpus_per_host, tasks, need, priority })
}

proptest! {
    /// Whatever the fleet: a chosen set makes room where it says, every member may go, none
    /// is spare; no set is returned only when stopping every eligible task of a GPU would not
    /// make room on it.
    #[test]
    fn a_chosen_set_makes_room_and_holds_nothing_spare(c in case()) {
        let (mut s, p) = pool_of(&c.gpus_per_host);
        let mut placed: Vec<(Request, Placement)> = Vec::new();
        for (i, &(mem, prio, since)) in c.tasks.iter().enumerate() {
            let r = mps(p, mem, who(i as u64 + 1, prio, since));
            if let Ok(at) = s.place(&r) {
                placed.push((r, at));
            }
        }
        let me = mps(p, c.need, who(0, c.priority, 0));
        let fits_after = |gone: &[u64]| {
            let mut t = pool_of(&c.gpus_per_host).0;
            for (r, at) in &placed {
                if !gone.contains(&r.tenant.unwrap().id) {
                    t.reserve(r, at);
                }
            }
            t
        };
        match s.preempt(&me, 0) {
            Some(got) => {
                prop_assert!(got.awaits.is_empty());
                for v in &got.victims {
                    let (r, _) = placed.iter().find(|(r, _)| r.tenant.unwrap().id == *v).unwrap();
                    prop_assert!(r.tenant.unwrap().priority + 10 <= c.priority);
                }
                let mut after = fits_after(&got.victims);
                let gpu = got.placement.gpus[0];
                prop_assert!(after.gpu(gpu).remaining_mib() >= c.need);
                prop_assert_eq!(after.place_on(&me, got.placement.host).map(|_| ()), Ok(()));
                for skip in 0..got.victims.len() {
                    let fewer: Vec<u64> = got.victims.iter().enumerate().filter(|(j, _)| *j != skip).map(|(_, v)| *v).collect();
                    let t = fits_after(&fewer);
                    let g = t.gpu(gpu);
                    prop_assert!(
                        g.remaining_mib() < c.need || g.clients + 1 > g.max_clients,
                        "victim {} was spare", got.victims[skip]
                    );
                }
            }
            None => {
                for gpu in 0..s.gpu_count() as GpuIx {
                    let eligible: Vec<u64> = placed.iter()
                        .filter(|(r, at)| at.gpus == [gpu] && r.tenant.unwrap().priority + 10 <= c.priority)
                        .map(|(r, _)| r.tenant.unwrap().id).collect();
                    let t = fits_after(&eligible);
                    prop_assert!(t.gpu(gpu).remaining_mib() < c.need, "GPU {} had a set", gpu);
                }
            }
        }
    }
}
