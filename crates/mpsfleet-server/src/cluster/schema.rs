//! The records' schema version, and the migration that brings an older data directory up to
//! date before anything is loaded.

use super::kinds::INCIDENT;
use super::*;

/// The schema of the records this build writes. 1: before histories were bounded (incident
/// timelines as plain arrays); 2: bounded timelines with `reached`.
pub const SCHEMA_VERSION: u64 = 2;
pub(super) const META: &str = "meta";
/// The most records one migration commit writes.
pub(super) const BATCH: usize = 500;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SchemaRecord {
    pub(super) version: u64,
}

/// Brings the store's records to [`SCHEMA_VERSION`]; refuses a store written by a newer
/// build. Runs before anything is loaded.
pub(super) fn migrate(store: &dyn Store) -> Result<(), Error> {
    let version = match store.get(META, "schema")? {
        Some(r) => decode::<SchemaRecord>(&r)?.version,
        // No schema record: a new store, or one written before records had a schema.
        None if store.revision()? == 0 => 0,
        None => 1,
    };
    if version > SCHEMA_VERSION {
        return Err(Error::StoreCorrupt(format!(
            "the state was written by a newer mpsfleet (schema {version}); this build reads schema \
             {SCHEMA_VERSION} or older: run the newer build"
        )));
    }
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    if version == 1 {
        // Incident timelines become bounded histories with the steps reached.
        let records = store.list(INCIDENT)?;
        for chunk in records.chunks(BATCH) {
            let mut ops = Vec::with_capacity(chunk.len());
            for r in chunk {
                let mut i: Incident = decode(r)?;
                i.normalize();
                ops.push(Op::put_json(INCIDENT, r.key.clone(), &i, Precondition::Version(r.version))?);
            }
            store.commit(&ops)?;
        }
        tracing::info!(incidents = records.len(), "state migrated from schema 1 to {SCHEMA_VERSION}");
    }
    store.commit(&[Op::put_json(
        META,
        "schema",
        &SchemaRecord { version: SCHEMA_VERSION },
        Precondition::Any,
    )?])?;
    Ok(())
}
