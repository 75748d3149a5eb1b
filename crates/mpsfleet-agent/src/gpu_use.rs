//! What each task uses of its shared GPU: GPU memory and SM utilisation, per task.
//!
//! A whole-device exporter sees one MPS server process on a shared GPU, not the tasks behind
//! it. NVML's MPS-aware queries do: the running compute processes with an MPS context on a
//! device (`nvmlDeviceGetMPSComputeRunningProcesses_v3`, each with the memory it holds), the
//! other compute processes (`nvmlDeviceGetComputeRunningProcesses_v3`), and per-process
//! utilisation samples (`nvmlDeviceGetProcessUtilization`). Each process found is matched to
//! the task whose process it is or descends from ([`attribute`]: the task's own pid, a shell's
//! child, a container's processes under its first one).
//!
//! On emulated GPUs a declared source stands in: `<data-dir>/gpu-use.json`, a JSON array of
//! `{"gpu": UUID, "pid": PID, "memoryMiB": N, "smPercent": N}` (a drill or a test writes it);
//! the matching to tasks is the same.

use mpsfleet_types::{GpuUuid, TaskId};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The declared source on emulated GPUs, in the data dir.
pub const DECLARED_FILE: &str = "gpu-use.json";
/// The most read of it.
const DECLARED_MAX: u64 = 1 << 20;
/// How far up a process's parents a task's pid is looked for.
const MAX_DEPTH: usize = 64;

/// One process on one GPU, as the source saw it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessUse {
    pub gpu: GpuUuid,
    pub pid: u32,
    /// None where the driver does not say.
    #[serde(rename = "memoryMiB", default, deserialize_with = "mib_to_bytes")]
    pub memory_bytes: Option<u64>,
    #[serde(default)]
    pub sm_percent: Option<u32>,
}

fn mib_to_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let mib: Option<u64> = Option::deserialize(d)?;
    mib.map(|m| {
        m.checked_mul(1 << 20).ok_or_else(|| serde::de::Error::custom(format!("memoryMiB {m} is too large")))
    })
    .transpose()
}

/// One task's use of one GPU: the sums over its processes there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskUse {
    pub memory_bytes: u64,
    /// The sum of its processes' SM utilisation, in percent of the GPU; None when no sample
    /// of any of them was found.
    pub sm_percent: Option<u32>,
    pub processes: u32,
}

/// Where the processes come from.
pub enum Source {
    /// Opened at the first sample (NVML holds the library and its symbols: boxed).
    Nvml(std::sync::Mutex<Option<Box<nvml_wrapper::Nvml>>>),
    Declared(PathBuf),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Nvml(_) => f.write_str("Source::Nvml"),
            Source::Declared(p) => f.debug_tuple("Source::Declared").field(p).finish(),
        }
    }
}

impl Source {
    /// NVML for real GPUs; the declared file in `data_dir` for emulated ones.
    pub fn new(emulated: bool, data_dir: &std::path::Path) -> Source {
        if emulated {
            Source::Declared(data_dir.to_path_buf())
        } else {
            Source::Nvml(std::sync::Mutex::new(None))
        }
    }

    /// The compute processes on `gpus` now.
    pub fn sample(&self, gpus: &[GpuUuid]) -> Result<Vec<ProcessUse>, String> {
        match self {
            Source::Declared(dir) => {
                let bytes =
                    crate::safe_fs::read_beneath(dir, std::path::Path::new(DECLARED_FILE), DECLARED_MAX)
                        .map_err(|e| format!("{DECLARED_FILE}: {e}"))?;
                let Some(bytes) = bytes else { return Ok(Vec::new()) };
                let all: Vec<ProcessUse> =
                    serde_json::from_slice(&bytes).map_err(|e| format!("{DECLARED_FILE}: {e}"))?;
                Ok(all.into_iter().filter(|p| gpus.contains(&p.gpu)).collect())
            }
            Source::Nvml(nvml) => {
                let mut guard = nvml.lock().unwrap_or_else(|p| p.into_inner());
                if guard.is_none() {
                    *guard = Some(Box::new(nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?));
                }
                let nvml = guard.as_ref().ok_or("NVML: not initialised")?;
                let mut out = Vec::new();
                for gpu in gpus {
                    out.extend(nvml_sample(nvml, gpu)?);
                }
                Ok(out)
            }
        }
    }
}

/// The processes of one GPU: its MPS clients and its other compute processes, with the latest
/// utilisation sample of each.
fn nvml_sample(nvml: &nvml_wrapper::Nvml, gpu: &GpuUuid) -> Result<Vec<ProcessUse>, String> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let device = nvml.device_by_uuid(gpu.as_str()).map_err(|e| format!("NVML: GPU {gpu}: {e}"))?;
    // A driver or GPU without MPS queries answers NotSupported: the plain list still counts.
    let mps = device.mps_running_compute_processes().unwrap_or_default();
    let plain = device.running_compute_processes().map_err(|e| format!("NVML: GPU {gpu}: {e}"))?;
    let mut memory: BTreeMap<u32, Option<u64>> = BTreeMap::new();
    for p in mps.into_iter().chain(plain) {
        let used = match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        };
        let e = memory.entry(p.pid).or_insert(None);
        *e = (*e).max(used);
    }
    // Samples of the last 10 s (NVML keeps a short buffer); the latest per process wins.
    let mut sm: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    if let Ok(samples) = device.process_utilization_stats(None) {
        for s in samples {
            let e = sm.entry(s.pid).or_insert((s.timestamp, s.sm_util));
            if s.timestamp >= e.0 {
                *e = (s.timestamp, s.sm_util);
            }
        }
    }
    Ok(memory
        .into_iter()
        .map(|(pid, memory_bytes)| ProcessUse {
            gpu: gpu.clone(),
            pid,
            memory_bytes,
            sm_percent: sm.get(&pid).map(|s| s.1),
        })
        .collect())
}

/// Each task's use of each GPU: a process counts for the task whose pid (`roots`) it is or
/// descends from, following `parent`; a process of no task is left out (another host
/// process, or the MPS server itself).
pub fn attribute(
    processes: &[ProcessUse],
    roots: &BTreeMap<u32, TaskId>,
    parent: impl Fn(u32) -> Option<u32>,
) -> BTreeMap<(TaskId, GpuUuid), TaskUse> {
    let mut out: BTreeMap<(TaskId, GpuUuid), TaskUse> = BTreeMap::new();
    for p in processes {
        let mut pid = p.pid;
        let mut owner = None;
        for _ in 0..MAX_DEPTH {
            if let Some(t) = roots.get(&pid) {
                owner = Some(*t);
                break;
            }
            match parent(pid) {
                Some(pp) if pp > 1 && pp != pid => pid = pp,
                _ => break,
            }
        }
        let Some(task) = owner else { continue };
        let u = out.entry((task, p.gpu.clone())).or_default();
        u.memory_bytes += p.memory_bytes.unwrap_or(0);
        u.processes += 1;
        if let Some(sm) = p.sm_percent {
            u.sm_percent = Some(u.sm_percent.unwrap_or(0) + sm);
        }
    }
    out
}

/// A process's parent, from `/proc`.
pub fn proc_parent(pid: u32) -> Option<u32> {
    mpsfleet_proc::stat(pid).map(|s| s.ppid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(n: u32) -> GpuUuid {
        GpuUuid::new(format!("GPU-{n}")).unwrap()
    }

    #[test]
    fn processes_count_for_the_task_they_descend_from() {
        let (a, b) = (TaskId(1), TaskId(2));
        // Task a is pid 100 (its CUDA program is 102, a child of its shell 101); task b is 200.
        let roots = BTreeMap::from([(100, a), (200, b)]);
        let parents = BTreeMap::from([(101, 100), (102, 101), (300, 1), (200, 1)]);
        let use_of = |pid, g, mib: u64, sm| ProcessUse {
            gpu: gpu(g),
            pid,
            memory_bytes: Some(mib << 20),
            sm_percent: sm,
        };
        let procs = [
            use_of(102, 0, 512, Some(30)),
            use_of(101, 0, 256, None),
            use_of(200, 0, 1024, Some(50)),
            use_of(200, 1, 64, None),
            use_of(300, 0, 4096, Some(5)), // the MPS server, or another host process
        ];
        let got = attribute(&procs, &roots, |p| parents.get(&p).copied());
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            got[&(a, gpu(0))],
            TaskUse { memory_bytes: 768 << 20, sm_percent: Some(30), processes: 2 }
        );
        assert_eq!(
            got[&(b, gpu(0))],
            TaskUse { memory_bytes: 1024 << 20, sm_percent: Some(50), processes: 1 }
        );
        assert_eq!(got[&(b, gpu(1))].sm_percent, None);
    }

    #[test]
    fn a_parent_loop_ends() {
        let t = TaskId(1);
        let roots = BTreeMap::from([(100, t)]);
        let p = ProcessUse { gpu: gpu(0), pid: 5, memory_bytes: None, sm_percent: None };
        assert!(attribute(&[p], &roots, |pid| Some(if pid == 5 { 6 } else { 5 })).is_empty());
    }

    #[test]
    fn the_declared_source_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let src = Source::new(true, dir.path());
        assert_eq!(src.sample(&[gpu(0)]).unwrap(), vec![], "no file: nothing on the GPUs");
        let path = dir.path().join(DECLARED_FILE);
        std::fs::write(
            &path,
            r#"[{"gpu":"GPU-0","pid":7,"memoryMiB":512,"smPercent":40},{"gpu":"GPU-9","pid":8}]"#,
        )
        .unwrap();
        let got = src.sample(&[gpu(0)]).unwrap();
        assert_eq!(
            got,
            vec![ProcessUse { gpu: gpu(0), pid: 7, memory_bytes: Some(512 << 20), sm_percent: Some(40) }]
        );
        std::fs::write(&path, r#"[{"gpu":"GPU-0","pid":7,"memoryMiB":18446744073709551615}]"#).unwrap();
        let e = src.sample(&[gpu(0)]).unwrap_err();
        assert!(e.contains("memoryMiB") && e.contains("too large"), "{e}");
        std::fs::write(&path, r#"[{"gpu":"GPU-0","pid":7,"memory":5}]"#).unwrap();
        assert!(src.sample(&[gpu(0)]).unwrap_err().contains("unknown field"));
    }
}
