//! A policy field out of range, and the checks that say so: shared by the pool's policies
//! (`policy.rs`) and its managed scaling (`scaling.rs`).

use std::fmt;

/// A policy field out of range; `field` is its JSON path, e.g. `healthPolicy.mpsProbeTimeoutMs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for PolicyError {}

pub(crate) fn err(field: &str, message: String) -> PolicyError {
    PolicyError { field: field.to_string(), message }
}

/// Checks `lo <= value <= hi`; `unit` is appended to the bounds in the message ("ms" or "").
pub(crate) fn in_range(field: &str, value: u64, lo: u64, hi: u64, unit: &str) -> Result<(), PolicyError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(err(field, format!("must be between {lo}{unit} and {hi}{unit}, got {value}{unit}")))
    }
}
