//! Deleted pools and services, kept discoverable for an hour as ECS keeps its INACTIVE
//! clusters and services: `DescribeClusters` and `DescribeServices` answer them as INACTIVE,
//! `ListServiceDeployments` still finds a deleted service's deployments, and tools that wait
//! for a deletion see it happen.
//!
//! Each is a record of its own (store kind [`DELETED`]), written in the very commit that
//! removes the object, so a restart or a failover keeps it. At most [`KEPT_PER_KIND`] of each
//! kind are kept (the oldest are deleted in the commit of a new one), each for [`KEPT_MS`]
//! (the retention pass removes older ones). The name is free again at once: a live pool or
//! service of that name is always the one a name finds.

use mpsfleet_types::{Pool, Service};
use serde::{Deserialize, Serialize};

/// Store kind of deleted pools and services, keyed by [`Deleted::key`].
pub(super) use super::kinds::DELETED;
/// How long a deleted pool or service stays discoverable (ms).
pub const KEPT_MS: u64 = 60 * 60 * 1000;
/// The most deleted objects of one kind kept.
pub const KEPT_PER_KIND: usize = 256;

/// A deleted pool or service as it was when it went, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    pub deleted_at_ms: u64,
    pub object: DeletedObject,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "record", rename_all = "camelCase")]
pub enum DeletedObject {
    Pool(Box<Pool>),
    Service(Box<Service>),
}

impl Deleted {
    pub(super) fn kind(&self) -> &'static str {
        match &self.object {
            DeletedObject::Pool(_) => "pool",
            DeletedObject::Service(_) => "service",
        }
    }

    fn name(&self) -> &str {
        match &self.object {
            DeletedObject::Pool(p) => p.name.as_str(),
            DeletedObject::Service(s) => s.name.as_str(),
        }
    }

    /// Its key: kind, then time, then name, so that one kind's records sort oldest first.
    pub(super) fn key(&self) -> String {
        format!("{}-{:013}-{}", self.kind(), self.deleted_at_ms, self.name())
    }
}

/// What `Writer::keep_deleted`'s ops write: the new record, and the oldest ones they delete.
pub(super) struct Keeping {
    pub(super) record: Deleted,
    pub(super) evicted: Vec<String>,
}
