//! Newtype ids with validating constructors.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    pub what: &'static str,
    pub value: String,
    pub reason: &'static str,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} is invalid: {}", self.what, self.value, self.reason)
    }
}

impl std::error::Error for NameError {}

/// Checks a user-chosen name (pool, service, task family): 1-255 of `[A-Za-z0-9_-]`,
/// the same alphabet ECS allows for a task definition family.
pub fn check_name(what: &'static str, value: &str) -> Result<(), NameError> {
    let err = |reason| NameError { what, value: value.to_string(), reason };
    if value.is_empty() {
        return Err(err("must not be empty"));
    }
    if value.len() > 255 {
        return Err(err("must be at most 255 characters"));
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(err("may contain only letters, digits, '-' and '_'"));
    }
    Ok(())
}

/// The OpenAPI schema of a type that is a string on the wire: `pattern`, at most `max` bytes.
macro_rules! string_schema {
    ($name:ident, $pattern:expr, $max:expr, $doc:expr) => {
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some($pattern))
                    .max_length(Some($max))
                    .description(Some($doc))
                    .into()
            }
        }
        impl utoipa::ToSchema for $name {}
    };
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        ///
        /// Backed by a shared `Arc<str>`: records that name the same host, pool or family share
        /// one allocation, and cloning costs a reference count.
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
                let value = value.into();
                check_name($what, &value)?;
                Ok(Self(value.into()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(value: String) -> Result<Self, NameError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        string_schema!($name, "^[A-Za-z0-9_-]{1,255}$", 255, concat!("A ", $what, " name."));
    };
}

string_id!(
    /// A host id, issued by the server at registration (`h-` and 12 hex digits).
    HostId,
    "host id"
);
string_id!(
    /// A pool name chosen by the operator.
    PoolName,
    "pool name"
);
string_id!(
    /// A service name chosen by the operator.
    ServiceName,
    "service name"
);
string_id!(
    /// A task definition family.
    Family,
    "family"
);

/// A GPU's UUID as NVML reports it (`GPU-…`). Free-form but non-empty and printable.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GpuUuid(Arc<str>);

impl GpuUuid {
    pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
        let value = value.into();
        let err = |reason| NameError { what: "gpu uuid", value: value.clone(), reason };
        if value.is_empty() {
            return Err(err("must not be empty"));
        }
        if value.len() > 128 || !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(err("must be at most 128 printable ASCII characters"));
        }
        Ok(Self(value.into()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for GpuUuid {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, NameError> {
        Self::new(value)
    }
}

impl From<GpuUuid> for String {
    fn from(id: GpuUuid) -> String {
        id.0.to_string()
    }
}

string_schema!(GpuUuid, "^[!-~]{1,128}$", 128, "A GPU's UUID as NVML reports it.");

/// A task id: a 64-bit number the server issues, written `t-` and 16 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskId(pub u64);

impl TaskId {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        s.strip_prefix("t-")
            .filter(|hex| hex.len() == 16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .map(TaskId)
            .ok_or(NameError {
                what: "task id",
                value: s.to_string(),
                reason: "expected t- and 16 hex digits",
            })
    }
}

impl TryFrom<String> for TaskId {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, NameError> {
        Self::parse(&value)
    }
}

impl From<TaskId> for String {
    fn from(id: TaskId) -> String {
        id.to_string()
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t-{:016x}", self.0)
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

string_schema!(TaskId, "^t-[0-9a-f]{16}$", 18, "A task id: t- and 16 hex digits.");

/// `family:revision`, the way ECS names one registered task definition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskDefRef {
    pub family: Family,
    pub revision: u32,
}

impl TaskDefRef {
    /// Parses `family:revision`; the revision must be a positive integer.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let (family, rev) = s.rsplit_once(':').ok_or(NameError {
            what: "task definition",
            value: s.to_string(),
            reason: "expected family:revision",
        })?;
        let revision = rev.parse::<u32>().ok().filter(|r| *r >= 1).ok_or(NameError {
            what: "task definition revision",
            value: rev.to_string(),
            reason: "must be a positive integer",
        })?;
        Ok(Self { family: Family::new(family)?, revision })
    }
}

impl TryFrom<String> for TaskDefRef {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, NameError> {
        Self::parse(&value)
    }
}

impl From<TaskDefRef> for String {
    fn from(r: TaskDefRef) -> String {
        r.to_string()
    }
}

impl fmt::Display for TaskDefRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.family, self.revision)
    }
}

string_schema!(
    TaskDefRef,
    "^[A-Za-z0-9_-]{1,255}:[1-9][0-9]{0,9}$",
    266,
    "A task definition: family:revision."
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(PoolName::new("gpu-pool_1").is_ok());
        for bad in ["", "a b", "x/y", "é"] {
            assert!(PoolName::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(PoolName::new("a".repeat(256)).is_err());
    }

    #[test]
    fn task_ids_round_trip() {
        let id = TaskId(0xdead_beef);
        assert_eq!(id.to_string(), "t-00000000deadbeef");
        assert_eq!(TaskId::parse(&id.to_string()), Ok(id));
        assert!(TaskId::parse("t-xyz").is_err());
        assert!(TaskId::parse("00000000deadbeef").is_err());
    }

    #[test]
    fn taskdef_ref_round_trips() {
        let r = TaskDefRef::parse("infer:12").unwrap();
        assert_eq!(r.family.as_str(), "infer");
        assert_eq!(r.revision, 12);
        assert_eq!(r.to_string(), "infer:12");
        assert!(TaskDefRef::parse("infer").is_err());
        assert!(TaskDefRef::parse("infer:0").is_err());
        assert!(TaskDefRef::parse("infer:x").is_err());
    }
}
