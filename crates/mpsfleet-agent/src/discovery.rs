//! GPU discovery: NVML when the library loads, declared (emulated) GPUs otherwise.

use mpsfleet_types::{GpuInventory, GpuUuid, DEFAULT_MAX_MPS_CLIENTS};

/// Where the GPUs came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub gpus: Vec<GpuInventory>,
    /// True when the GPUs were declared rather than read from NVML.
    pub emulated: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiscoveryError {
    #[error("--emulate-gpus {value:?}: {message} (expected MODEL:MEMORY_MIB:COUNT, e.g. H200:143771:2)")]
    BadDeclaration { value: String, message: String },
    #[error(
        "no NVIDIA GPU found through NVML ({0}); declare GPUs with --emulate-gpus MODEL:MEMORY_MIB:COUNT \
         to run without one"
    )]
    NoNvml(String),
}

/// Parses `MODEL:MEMORY_MIB:COUNT` into `COUNT` emulated GPUs with stable UUIDs derived from
/// `host_key` (so a restarted agent declares the same GPUs).
pub fn declared(value: &str, host_key: &str) -> Result<Discovered, DiscoveryError> {
    let bad =
        |message: &str| DiscoveryError::BadDeclaration { value: value.to_string(), message: message.into() };
    let parts: Vec<&str> = value.split(':').collect();
    let [model, memory, count] = parts.as_slice() else { return Err(bad("three fields are needed")) };
    if model.is_empty() || !model.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_ ".contains(&b)) {
        return Err(bad("MODEL must be letters, digits, '-', '_' or spaces"));
    }
    let memory: u64 = memory
        .parse()
        .ok()
        .filter(|m| (1..=16_777_216).contains(m))
        .ok_or_else(|| bad("MEMORY_MIB must be an integer from 1 to 16777216"))?;
    let count: u32 = count
        .parse()
        .ok()
        .filter(|c| (1..=64).contains(c))
        .ok_or_else(|| bad("COUNT must be an integer from 1 to 64"))?;
    let gpus = (0..count)
        .map(|index| {
            let uuid =
                GpuUuid::new(format!("GPU-emulated-{host_key}-{index}")).map_err(|e| bad(&e.to_string()))?;
            Ok(GpuInventory {
                uuid,
                index,
                model: format!("{model} (emulated)"),
                memory_mib: memory,
                compute_capability: String::new(),
                max_mps_clients: DEFAULT_MAX_MPS_CLIENTS,
            })
        })
        .collect::<Result<_, DiscoveryError>>()?;
    Ok(Discovered { gpus, emulated: true })
}

/// Reads the GPUs through NVML (the library is loaded at run time, so this binary runs
/// where there is none).
pub fn nvml() -> Result<Discovered, DiscoveryError> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| DiscoveryError::NoNvml(e.to_string()))?;
    let count = nvml.device_count().map_err(|e| DiscoveryError::NoNvml(e.to_string()))?;
    let mut gpus = Vec::new();
    for i in 0..count {
        let d = nvml.device_by_index(i).map_err(|e| DiscoveryError::NoNvml(e.to_string()))?;
        let err = |e: nvml_wrapper::error::NvmlError| DiscoveryError::NoNvml(format!("GPU {i}: {e}"));
        let uuid = d.uuid().map_err(err)?;
        let memory = d.memory_info().map_err(err)?;
        let cc = d.cuda_compute_capability().map_err(err)?;
        gpus.push(GpuInventory {
            uuid: GpuUuid::new(uuid).map_err(|e| DiscoveryError::NoNvml(e.to_string()))?,
            index: d.index().unwrap_or(i),
            model: d.name().unwrap_or_else(|_| "unknown".into()),
            memory_mib: memory.total / (1024 * 1024),
            compute_capability: format!("{}.{}", cc.major, cc.minor),
            // Volta (7.0) and newer take 48 clients per GPU; older ones 16.
            max_mps_clients: if cc.major >= 7 { DEFAULT_MAX_MPS_CLIENTS } else { 16 },
        });
    }
    if gpus.is_empty() {
        return Err(DiscoveryError::NoNvml("NVML reports no devices".into()));
    }
    Ok(Discovered { gpus, emulated: false })
}

/// NVML first; declared GPUs only when NVML has none. With neither, the agent refuses to start.
pub fn discover(declared_gpus: Option<&str>, host_key: &str) -> Result<Discovered, DiscoveryError> {
    match (nvml(), declared_gpus) {
        (Ok(found), _) => Ok(found),
        (Err(_), Some(value)) => declared(value, host_key),
        (Err(e), None) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_gpus_parse_and_are_marked_emulated() {
        let d = declared("H200:143771:2", "abc").unwrap();
        assert!(d.emulated);
        assert_eq!(d.gpus.len(), 2);
        assert_eq!(d.gpus[1].memory_mib, 143_771);
        assert_eq!(d.gpus[1].uuid.as_str(), "GPU-emulated-abc-1");
        assert_eq!(d.gpus[0].model, "H200 (emulated)");
    }

    #[test]
    fn bad_declarations_say_what_is_wrong() {
        for (value, fragment) in [
            ("H200:143771", "three fields"),
            ("H200:0:2", "MEMORY_MIB"),
            ("H200:lots:2", "MEMORY_MIB"),
            ("H200:1000:0", "COUNT"),
            ("H200:1000:65", "COUNT"),
            ("H/200:1000:1", "MODEL"),
        ] {
            let e = declared(value, "h").unwrap_err().to_string();
            assert!(e.contains(fragment), "{value}: {e}");
        }
    }

    #[test]
    fn without_nvml_or_declaration_the_agent_refuses() {
        if nvml().is_ok() {
            println!("skipped: this machine has NVML and GPUs");
            return;
        }
        let e = discover(None, "h").unwrap_err();
        assert!(e.to_string().contains("--emulate-gpus"), "{e}");
        assert!(discover(Some("A100:81920:1"), "h").unwrap().emulated);
    }
}
