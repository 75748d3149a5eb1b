//! A container's `resourceRequirements`: whole GPUs, or a share of one through
//! `sharingStrategy.nvidiaMps` (memory in MiB, `maxComputePercent`), and the rules across the
//! containers of one task (one form per task, totals that fit).

use super::*;

pub(super) fn parse_resources(
    value: &Value,
    path: &str,
    ignored: &mut Vec<String>,
) -> Result<(Vec<ResourceRequirement>, Option<usize>)> {
    // Returns the GPU entry (if any) and its index in the input array.
    let list = as_array(value, path)?;
    let mut errors = TaskDefErrors::default();
    // The first GPU entry, parsed when it could be.
    let mut gpu: Option<(usize, Option<GpuRequirement>)> = None;
    for (j, entry) in list.iter().enumerate() {
        let entry_path = format!("{path}[{j}]");
        let Some(obj) = errors.take(as_object(entry, &entry_path)) else { continue };
        let type_path = join(&entry_path, "type");
        let Some(kind) = errors.take(require(obj, &entry_path, "type").and_then(|v| as_str(v, &type_path)))
        else {
            continue;
        };
        match kind {
            "GPU" => {
                if let Some((first, _)) = gpu {
                    errors.absorb(err(
                        entry_path,
                        format!(
                            "a container may have only one GPU entry, \
                             already given at {path}[{first}]"
                        ),
                    ));
                    continue;
                }
                gpu = Some((j, errors.take(parse_gpu(obj, &entry_path))));
            }
            "InferenceAccelerator" => ignored.push(entry_path),
            other => errors
                .absorb(err(type_path, format!("must be GPU or InferenceAccelerator, got {}", quote(other)))),
        }
    }
    errors.or_ok(match gpu {
        Some((j, Some(g))) => (vec![ResourceRequirement::Gpu(g)], Some(j)),
        _ => (Vec::new(), None),
    })
}

/// A GPU entry: `value` (whole GPUs) or `sharingStrategy.nvidiaMps` (a share of one GPU), as
/// ECS's API writes them; every error of the entry is reported.
fn parse_gpu(obj: &Map<String, Value>, path: &str) -> Result<GpuRequirement> {
    let mut errors = TaskDefErrors::default();
    errors.take(check_keys(obj, path, &["type", "value", "sharingStrategy"], &[], &mut Vec::new()));
    let parsed = match (obj.get("value"), obj.get("sharingStrategy")) {
        (Some(_), Some(_)) => Err(err(path, "value and sharingStrategy cannot be used together")),
        (None, None) => Err(err(
            path,
            "needs value (a count of whole GPUs) or sharingStrategy \
             (a share of one GPU through MPS), got neither",
        )),
        (Some(v), None) => {
            gpu_count(v, &join(path, "value")).map(|count| GpuRequirement::Whole { value: count.to_string() })
        }
        (None, Some(s)) => parse_mps(s, &join(path, "sharingStrategy")),
    };
    let parsed = errors.take(parsed);
    match parsed {
        Some(g) => errors.or_ok(g),
        None => Err(errors),
    }
}

/// `sharingStrategy`: `{"nvidiaMps": {"memory": MiB, "maxComputePercent": 1..=100}}`.
fn parse_mps(s: &Value, s_path: &str) -> Result<GpuRequirement> {
    let s_obj = as_object(s, s_path)?;
    let mut errors = TaskDefErrors::default();
    errors.take(check_keys(s_obj, s_path, &["nvidiaMps"], &[], &mut Vec::new()));
    let mps_path = join(s_path, "nvidiaMps");
    let Some(mps) = errors.take(require(s_obj, s_path, "nvidiaMps").and_then(|v| as_object(v, &mps_path)))
    else {
        return Err(errors);
    };
    errors.take(check_keys(mps, &mps_path, &["memory", "maxComputePercent"], &[], &mut Vec::new()));
    let memory = errors.take(
        require(mps, &mps_path, "memory")
            .and_then(|v| int_in(v, &join(&mps_path, "memory"), 1, MAX_MPS_MEMORY_MIB, " (MiB)")),
    );
    let max_compute_percent = match mps.get("maxComputePercent") {
        Some(v) => errors
            .take(int_in(v, &join(&mps_path, "maxComputePercent"), 1, 100, ""))
            .map(|p| Some(u8::try_from(p).unwrap_or(100))),
        None => Some(None),
    };
    let (Some(memory), Some(max_compute_percent)) = (memory, max_compute_percent) else {
        return Err(errors);
    };
    errors.or_ok(GpuRequirement::Mps {
        sharing_strategy: SharingStrategy { nvidia_mps: NvidiaMps { memory, max_compute_percent } },
    })
}

/// A whole-GPU count, given as ECS writes it (`"1"`) or as a JSON number.
fn gpu_count(value: &Value, path: &str) -> Result<u64> {
    let bad = || {
        err(
            path,
            format!("must be a whole number of GPUs from 1 to {MAX_WHOLE_GPUS}, got {}", describe(value)),
        )
    };
    let n = match value {
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse::<u64>().map_err(|_| bad())?
        }
        Value::Number(n) => n.as_u64().ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    if (1..=MAX_WHOLE_GPUS).contains(&n) {
        Ok(n)
    } else {
        Err(bad())
    }
}

/// Cross-container GPU rules: one form per task, and totals that fit.
#[derive(Default)]
pub(super) struct GpuTally {
    /// The first GPU container seen: its name and whether it uses MPS.
    first: Option<(String, bool)>,
    whole: u64,
    mps_memory: u64,
}

impl GpuTally {
    /// `req_path` is the path of the container's GPU entry in the input.
    pub(super) fn add(&mut self, container: &ContainerDefinition, req_path: &str) -> Result<()> {
        let Some(req) = container.gpu() else {
            return Ok(());
        };
        let is_mps = matches!(req, GpuRequirement::Mps { .. });
        match &self.first {
            Some((first, first_mps)) if *first_mps != is_mps => {
                let form = |mps: bool| {
                    if mps {
                        "MPS (sharingStrategy)"
                    } else {
                        "whole GPUs (value)"
                    }
                };
                return Err(err(
                    req_path,
                    format!(
                        "uses {} but container {} uses {}; \
                         all GPU containers of a task must use the same form",
                        form(is_mps),
                        quote(first),
                        form(*first_mps)
                    ),
                ));
            }
            Some(_) => {}
            None => self.first = Some((container.name.clone(), is_mps)),
        }
        match req {
            GpuRequirement::Whole { value } => {
                self.whole = self.whole.saturating_add(value.parse::<u64>().unwrap_or(0));
                if self.whole > MAX_WHOLE_GPUS {
                    return Err(err(
                        format!("{req_path}.value"),
                        format!(
                            "the task's containers ask for {} whole GPUs in all, \
                             more than the limit of {MAX_WHOLE_GPUS}",
                            self.whole
                        ),
                    ));
                }
            }
            GpuRequirement::Mps { sharing_strategy } => {
                self.mps_memory = self.mps_memory.saturating_add(sharing_strategy.nvidia_mps.memory);
                if self.mps_memory > MAX_MPS_MEMORY_MIB {
                    return Err(err(
                        format!("{req_path}.sharingStrategy.nvidiaMps.memory"),
                        format!(
                            "the task's MPS containers share one GPU and ask for {} MiB \
                             in all, more than the limit of {MAX_MPS_MEMORY_MIB} MiB",
                            self.mps_memory
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
