//! A task definition's task-level `cpu` and `memory` strings, read as ECS reads them at
//! registration: CPU units (`"1024"`) or vCPUs (`"1 vcpu"`, `"0.25 vCPU"`), memory in MiB
//! (`"2048"`) or GB (`"2 GB"`, `"2GB"`), case-insensitive, and converted to whole CPU units and
//! MiB. The definition keeps the strings as given; the runtime applies the numbers.

/// ECS's bounds on task CPU off Fargate: 128 units (0.125 vCPU) to 196608 units (192 vCPUs).
pub const TASK_CPU_MIN: u32 = 128;
pub const TASK_CPU_MAX: u32 = 196_608;
/// Task memory, MiB: at least what one container can be given (Docker's 6 MiB), at most
/// 16 TiB (past any host ECS runs tasks on).
pub const TASK_MEMORY_MIN_MIB: u64 = 6;
pub const TASK_MEMORY_MAX_MIB: u64 = 16 << 20;
/// The longest string taken for either field.
pub const MAX_SIZE_TEXT: usize = 32;

const CPU_FORMS: &str = "CPU units (\"1024\") or vCPUs (\"1 vcpu\", \"0.25 vCPU\")";
const MEMORY_FORMS: &str = "MiB (\"2048\") or GB (\"2 GB\", \"2GB\")";

/// `"512"`, `"0.5 vcpu"`, ... in CPU units. The error names the accepted forms and the bounds
/// (the caller adds the field's path).
pub fn task_cpu_units(text: &str) -> Result<u32, String> {
    let units = parse_scaled(text, &["vcpu"], 1024)
        .ok_or_else(|| format!("must be {CPU_FORMS}, got {}", shown(text)))?;
    if !(u64::from(TASK_CPU_MIN)..=u64::from(TASK_CPU_MAX)).contains(&units) {
        return Err(format!(
            "must be from {TASK_CPU_MIN} to {TASK_CPU_MAX} CPU units (0.125 to 192 vCPUs), got {} ({units} units)",
            shown(text)
        ));
    }
    Ok(units as u32)
}

/// `"2048"`, `"2 GB"`, `"0.5GB"`, ... in MiB (1 GB = 1024 MiB, as ECS converts).
pub fn task_memory_mib(text: &str) -> Result<u64, String> {
    let mib = parse_scaled(text, &["gb"], 1024)
        .ok_or_else(|| format!("must be {MEMORY_FORMS}, got {}", shown(text)))?;
    if !(TASK_MEMORY_MIN_MIB..=TASK_MEMORY_MAX_MIB).contains(&mib) {
        return Err(format!(
            "must be from {TASK_MEMORY_MIN_MIB} to {TASK_MEMORY_MAX_MIB} MiB, got {} ({mib} MiB)",
            shown(text)
        ));
    }
    Ok(mib)
}

fn shown(text: &str) -> String {
    if text.len() > MAX_SIZE_TEXT {
        let cut: String = text.chars().take(MAX_SIZE_TEXT).collect();
        format!("{cut:?}... ({} bytes)", text.len())
    } else {
        format!("{text:?}")
    }
}

/// A plain whole number, or a number (whole or with up to 3 decimals) followed by one of
/// `suffixes` (any case, spaces allowed before it), times `scale`; None when it is neither or
/// does not come to a whole number.
fn parse_scaled(text: &str, suffixes: &[&str], scale: u64) -> Option<u64> {
    if text.len() > MAX_SIZE_TEXT {
        return None;
    }
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().ok();
    }
    let lower = t.to_ascii_lowercase();
    let number = suffixes.iter().find_map(|s| lower.strip_suffix(s))?.trim_end();
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 3
        || whole.len() > 9
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let frac_thousandths: u64 = if frac.is_empty() { 0 } else { format!("{frac:0<3}").parse().ok()? };
    let thousandths = whole.checked_mul(1000)?.checked_add(frac_thousandths)?;
    let scaled = thousandths.checked_mul(scale)?;
    (scaled % 1000 == 0).then_some(scaled / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_forms() {
        for (text, units) in [
            ("1024", 1024),
            ("128", 128),
            ("196608", 196_608),
            ("1 vcpu", 1024),
            ("1 vCPU", 1024),
            ("1vcpu", 1024),
            ("0.25 vCPU", 256),
            (".5 vcpu", 512),
            ("0.125 VCPU", 128),
            ("2 vcpu", 2048),
            ("16 vCPU", 16_384),
            (" 256 ", 256),
        ] {
            assert_eq!(task_cpu_units(text), Ok(units), "{text}");
        }
    }

    #[test]
    fn cpu_refusals_name_the_forms_and_bounds() {
        for text in ["", "abc", "1 core", "1.5", "-1", "1e3", "vcpu", "0.1 vcpu", "1.0001 vcpu", "1 vcpus"] {
            let e = task_cpu_units(text).expect_err(text);
            assert!(e.contains("CPU units (\"1024\") or vCPUs"), "{text}: {e}");
            assert!(e.contains(&format!("{text:?}")), "{text}: {e}");
        }
        let e = task_cpu_units("64").expect_err("64");
        assert!(e.contains("from 128 to 196608 CPU units") && e.contains("\"64\""), "{e}");
        let e = task_cpu_units("193 vcpu").expect_err("193 vcpu");
        assert!(e.contains("197632 units"), "{e}");
        let long = "1".repeat(40);
        let e = task_cpu_units(&long).expect_err("long");
        assert!(e.contains("(40 bytes)"), "{e}");
        assert!(task_cpu_units("99999999999999999999").is_err());
    }

    #[test]
    fn memory_forms() {
        for (text, mib) in [
            ("512", 512),
            ("2048", 2048),
            ("2 GB", 2048),
            ("2GB", 2048),
            ("2 gb", 2048),
            ("0.5 GB", 512),
            ("0.5GB", 512),
            ("120 GB", 122_880),
            ("6", 6),
        ] {
            assert_eq!(task_memory_mib(text), Ok(mib), "{text}");
        }
    }

    #[test]
    fn memory_refusals_name_the_forms_and_bounds() {
        for text in ["", "2 GiB", "2 MB", "2G", "1.5", "GB", "x GB", "0.0001 GB"] {
            let e = task_memory_mib(text).expect_err(text);
            assert!(e.contains("MiB (\"2048\") or GB"), "{text}: {e}");
        }
        let e = task_memory_mib("4").expect_err("4");
        assert!(e.contains("from 6 to 16777216 MiB") && e.contains("\"4\""), "{e}");
        let e = task_memory_mib("20000 GB").expect_err("20000 GB");
        assert!(e.contains("20480000 MiB"), "{e}");
    }
}
