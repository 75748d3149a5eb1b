//! Whether a task could ever be placed: its GPU demand against the largest host its pool has
//! or its provider launches. A task that fits nowhere would wait forever; `task run` and
//! `service create` refuse it with the reason instead. One that fits somewhere, though not
//! now, waits as before.

use mpsfleet_types::GpuDemand;

/// The GPUs of one host, present or to come: each GPU's memory (MiB) and MPS clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub gpus: Vec<(u64, u32)>,
}

/// Why no shape could ever hold `demand`, or None when one could, or when there is nothing
/// to judge by (no host and no provider shape: the task waits).
pub fn never_fits(demand: &GpuDemand, shapes: &[Shape]) -> Option<String> {
    if shapes.is_empty() {
        return None;
    }
    match *demand {
        GpuDemand::None => None,
        GpuDemand::Whole { count } => {
            let most = shapes.iter().map(|s| s.gpus.len()).max().unwrap_or(0);
            (most < count as usize)
                .then(|| format!("it needs {count} whole GPUs on one host, and the largest host has {most}"))
        }
        GpuDemand::Mps { memory_mib, clients, .. } => {
            let gpus = || shapes.iter().flat_map(|s| s.gpus.iter().copied());
            if gpus().any(|(m, c)| m >= memory_mib && c >= clients) {
                return None;
            }
            let memory = gpus().map(|(m, _)| m).max().unwrap_or(0);
            let most_clients = gpus().map(|(_, c)| c).max().unwrap_or(0);
            Some(format!(
                "it needs {memory_mib} MiB of MPS memory and {clients} MPS client(s) on one GPU, and \
                 the largest GPU has {memory} MiB and accepts {most_clients} client(s)"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200(gpus: usize) -> Shape {
        Shape { gpus: vec![(143_771, 48); gpus] }
    }

    #[test]
    fn a_task_larger_than_every_gpu_never_fits_and_says_why() {
        let demand = GpuDemand::Mps { memory_mib: 200_000, clients: 1, compute_percent: 50 };
        let why = never_fits(&demand, &[h200(2), h200(8)]).unwrap();
        assert!(why.contains("200000 MiB") && why.contains("143771 MiB"), "{why}");
        let small = GpuDemand::Mps { memory_mib: 1000, clients: 1, compute_percent: 50 };
        assert_eq!(never_fits(&small, &[h200(1)]), None);
        // Too many clients for any GPU.
        let many = GpuDemand::Mps { memory_mib: 10, clients: 49, compute_percent: 100 };
        assert!(never_fits(&many, &[h200(1)]).unwrap().contains("49 MPS client"));
    }

    #[test]
    fn whole_gpus_are_judged_by_the_largest_host() {
        let demand = GpuDemand::Whole { count: 4 };
        assert!(never_fits(&demand, &[h200(2), h200(3)]).unwrap().contains("largest host has 3"));
        assert_eq!(never_fits(&demand, &[h200(2), h200(4)]), None);
    }

    #[test]
    fn nothing_to_judge_by_waits() {
        let demand = GpuDemand::Mps { memory_mib: 10_000_000, clients: 1, compute_percent: 1 };
        assert_eq!(never_fits(&demand, &[]), None);
        assert_eq!(never_fits(&GpuDemand::None, &[h200(1)]), None);
    }
}
