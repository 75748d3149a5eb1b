//! What the domain answers when it refuses or fails an operation: one enum, in the words of
//! the domain (a field and why, an object's kind and id, a conflict, who may not), with no
//! HTTP in it. Each API surface maps it once (the REST API in its `error.rs`), so the same
//! refusal reads the same wherever it is asked.

use mpsfleet_store::StoreError;
use mpsfleet_types::api::FieldError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A task definition refused: the first error's field and message, and every error found
    /// (the first included, at most `MAX_ERRORS`), one per line in the message.
    #[error("{field}: {message}{}", further_lines(errors, *left_out))]
    InvalidTaskDefinition { field: String, message: String, errors: Vec<FieldError>, left_out: usize },
    /// A value the operation cannot take: which field, and why.
    #[error("{field}: {message}")]
    InvalidParameter { field: String, message: String },
    /// A task no host of its pool, present or to come, could ever hold (`mpsfleet_core::fit`):
    /// refused as an invalid `field` (the REST API's 400), a failure in ECS's RunTask.
    #[error("{field}: {message}")]
    NeverFits { field: String, message: String },
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("{kind} {id} already exists")]
    AlreadyExists { kind: &'static str, id: String },
    /// A registration names a GPU another host holds.
    #[error(
        "GPU {uuid} is already registered to host {host} ({hostname}); if that host does not exist, \
         `mpsfleet host forget {host}` frees its GPUs"
    )]
    GpuTaken { uuid: String, host: String, hostname: String },
    /// A credential the cluster does not take (unknown, expired, used, revoked).
    #[error("{0}")]
    Unauthorized(&'static str),
    /// A caller that may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The objects are not in a state that allows it (or changed under the operation).
    #[error("{0}")]
    Conflict(String),
    #[error("state store unavailable: {0}")]
    StoreUnavailable(String),
    #[error("state store data is damaged: {0}")]
    StoreCorrupt(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// Something the operation needs (an agent, say) cannot be reached now.
    #[error("{0}")]
    Unavailable(String),
}

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidParameter { field: field.into(), message: message.into() }
    }

    pub fn not_found(kind: &'static str, id: impl ToString) -> Self {
        Error::NotFound { kind, id: id.to_string() }
    }

    /// The kind of error, as a stable name: what the audit log records and the REST API
    /// answers as its code.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidTaskDefinition { .. } => "InvalidTaskDefinition",
            Error::InvalidParameter { .. } | Error::NeverFits { .. } => "InvalidParameter",
            Error::NotFound { .. } => "NotFound",
            Error::AlreadyExists { .. } | Error::GpuTaken { .. } => "AlreadyExists",
            Error::Unauthorized(_) => "Unauthorized",
            Error::Forbidden(_) => "Forbidden",
            Error::Conflict(_) => "Conflict",
            Error::StoreUnavailable(_) => "StoreUnavailable",
            Error::StoreCorrupt(_) => "StoreCorrupt",
            Error::Internal(_) => "Internal",
            Error::Unavailable(_) => "Unavailable",
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { .. } => Error::Conflict(format!("{e}; retry the request")),
            StoreError::Corrupt { .. } => Error::StoreCorrupt(e.to_string()),
            _ => Error::StoreUnavailable(e.to_string()),
        }
    }
}

/// The errors after the first, one per line, and how many were left out.
pub(crate) fn further_lines(errors: &[FieldError], left_out: usize) -> String {
    let mut out = String::new();
    for e in errors.iter().skip(1) {
        out.push('\n');
        out.push_str(&e.field);
        out.push_str(": ");
        out.push_str(&e.message);
    }
    if left_out > 0 {
        let s = if left_out == 1 { "" } else { "s" };
        out.push_str(&format!("\nand {left_out} more error{s}"));
    }
    out
}
