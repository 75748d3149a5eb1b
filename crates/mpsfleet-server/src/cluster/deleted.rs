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

use super::error::Error;
use super::state::Change;
use super::write::Writer;
use mpsfleet_store::{Op, Precondition, Revision};
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
    fn kind(&self) -> &'static str {
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
    record: Deleted,
    evicted: Vec<String>,
}

impl Writer<'_> {
    /// The ops that keep `object` as deleted now, to commit with its removal, and what they
    /// keep; the oldest of its kind beyond [`KEPT_PER_KIND`] go in the same ops. Apply with
    /// `Writer::kept_deleted` once committed.
    pub(in crate::cluster) fn keep_deleted(
        &self,
        object: DeletedObject,
    ) -> Result<(Vec<Op>, Keeping), Error> {
        let record = Deleted { deleted_at_ms: self.now_ms, object };
        let kind = format!("{}-", record.kind());
        let same: Vec<&String> = self.state.deleted().keys().filter(|k| k.starts_with(&kind)).collect();
        let over = (same.len() + 1).saturating_sub(KEPT_PER_KIND);
        let evicted: Vec<String> = same.into_iter().take(over).cloned().collect();
        let mut ops: Vec<Op> =
            evicted.iter().map(|k| Op::delete(DELETED, k.as_str(), Precondition::Any)).collect();
        ops.push(Op::put_json(DELETED, record.key(), &record, Precondition::Any)?);
        Ok((ops, Keeping { record, evicted }))
    }

    /// Applies what `Writer::keep_deleted`'s ops committed at `rev`.
    pub(in crate::cluster) fn kept_deleted(&mut self, rev: Revision, kept: Keeping) {
        for k in kept.evicted {
            self.apply(rev, Change::DeletedRemoved(k));
        }
        self.apply(rev, Change::Deleted(Box::new(kept.record)));
    }
}
