//! `SqliteStore`: the durable single-file `Store` (SQLite in WAL mode, `synchronous=FULL`, one transaction per commit).
//!
//! Schema (version 1):
//! - `objects(kind, key, version, value)`, primary key `(kind, key)`, `WITHOUT ROWID`: the live objects.
//! - `changes(revision, seq, kind, key, value NULL)`, primary key `(revision, seq)`: the change feed;
//!   `seq` is the op's position among the batch's effective ops, a NULL value is a delete.
//! - `meta(name, value)`: `schema_version`, `revision` (the current revision) and `compacted_before`
//!   (feed entries below it were dropped).
//!
//! The current revision is read from `meta` inside every write transaction rather than cached, so the
//! file stays consistent even if another process commits to it; only the prompt wake-up of
//! `wait_for_revision` is limited to commits made through this `SqliteStore`.

use std::fmt::Display;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use crate::watch::{poisoned, RevisionWatch};
use crate::{
    check_no_duplicates, check_not_compacted, page_full, Change, Op, Precondition, Record, Revision, Store,
    StoreError,
};

/// The schema this code reads and writes; stored in `meta.schema_version`.
const SCHEMA_VERSION: i64 = 1;

/// The page size of newly created files.
const PAGE_SIZE: i64 = 16 * 1024;

/// The page cache, in KiB (SQLite's default is 2 MiB).
const CACHE_KIB: i64 = 64 * 1024;

/// WAL pages after which a commit checkpoints (SQLite's default is 1000, 16 MiB at our page size).
const AUTOCHECKPOINT_PAGES: i64 = 8192;

/// How long a statement waits for a lock held by another connection before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS objects (
    kind    TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    version INTEGER NOT NULL,
    value   BLOB    NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
    revision INTEGER NOT NULL,
    seq      INTEGER NOT NULL,
    kind     TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    value    BLOB,
    PRIMARY KEY (revision, seq)
);
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 0), ('compacted_before', 0);
";

const SELECT_VERSION: &str = "SELECT version FROM objects WHERE kind = ?1 AND key = ?2";
const SELECT_OBJECT: &str = "SELECT version, value FROM objects WHERE kind = ?1 AND key = ?2";
const SELECT_KIND: &str = "SELECT key, version, value FROM objects WHERE kind = ?1 ORDER BY key";
const UPSERT_OBJECT: &str = "INSERT INTO objects (kind, key, version, value) VALUES (?1, ?2, ?3, ?4)
     ON CONFLICT (kind, key) DO UPDATE SET version = excluded.version, value = excluded.value";
const DELETE_OBJECT: &str = "DELETE FROM objects WHERE kind = ?1 AND key = ?2";
const INSERT_CHANGE: &str =
    "INSERT INTO changes (revision, seq, kind, key, value) VALUES (?1, ?2, ?3, ?4, ?5)";
const SELECT_CHANGES: &str = "SELECT revision, kind, key, value FROM changes
     WHERE revision > ?1 ORDER BY revision, seq";
const SELECT_META: &str = "SELECT value FROM meta WHERE name = ?1";
const UPDATE_META: &str = "UPDATE meta SET value = ?2 WHERE name = ?1";

/// A [`Store`] in one SQLite file. Acknowledged commits survive SIGKILL and power loss.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    watch: RevisionWatch,
    /// The file path (or `:memory:`), for error messages.
    path: String,
}

impl SqliteStore {
    /// Opens or creates the store file at `path`. Its directory must already exist.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let display = path.display().to_string();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(StoreError::Backend {
                op: "open",
                message: format!(
                    "{display}: directory {} does not exist or is not a directory",
                    dir.display()
                ),
            });
        }
        let conn = Connection::open(path).map_err(|e| backend_err("open", &display, e))?;
        SqliteStore::init(conn, display, true)
    }

    /// A non-durable store in a private in-memory SQLite database (same SQL, no file).
    pub fn open_in_memory() -> Result<SqliteStore, StoreError> {
        let display = ":memory:".to_owned();
        let conn = Connection::open_in_memory().map_err(|e| backend_err("open", &display, e))?;
        SqliteStore::init(conn, display, false)
    }

    fn init(mut conn: Connection, path: String, on_disk: bool) -> Result<SqliteStore, StoreError> {
        let err = |e: rusqlite::Error| backend_err("open", &path, e);
        conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
        if on_disk {
            // Only takes effect on a new file (before the first table and WAL mode). Rows are ~0.5 KiB
            // JSON stored twice (object and feed); 16 KiB pages made bulk commits ~1.5x faster than the
            // 4 KiB default in `examples/commit_throughput.rs` while keeping small commits cheap.
            conn.pragma_update(None, "page_size", PAGE_SIZE).map_err(err)?;
            let mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(err)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Backend {
                    op: "open",
                    message: format!("{path}: could not enable WAL journal mode (got {mode})"),
                });
            }
        }
        conn.pragma_update(None, "synchronous", "FULL").map_err(err)?;
        if on_disk {
            // Bulk commits (a 10,000-task `task run` touches thousands of pages) otherwise re-read
            // pages from the OS on every batch and checkpoint after every one. Neither setting
            // changes durability: each commit still syncs the WAL (`synchronous=FULL`).
            conn.pragma_update(None, "cache_size", -CACHE_KIB).map_err(err)?;
            conn.pragma_update(None, "wal_autocheckpoint", AUTOCHECKPOINT_PAGES).map_err(err)?;
        }
        conn.set_prepared_statement_cache_capacity(32);

        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(err)?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
             INSERT OR IGNORE INTO meta (name, value) VALUES ('schema_version', 1);",
        )
        .map_err(err)?;
        let found: i64 = tx.query_row(SELECT_META, ["schema_version"], |r| r.get(0)).map_err(err)?;
        if found != SCHEMA_VERSION {
            return Err(StoreError::Backend {
                op: "open",
                message: format!(
                    "{path}: schema version {found} is not supported (this build reads version {SCHEMA_VERSION})"
                ),
            });
        }
        tx.execute_batch(SCHEMA).map_err(err)?;
        let revision = read_meta(&tx, "revision", "open", &path)?;
        tx.commit().map_err(err)?;

        Ok(SqliteStore { conn: Mutex::new(conn), watch: RevisionWatch::new(revision), path })
    }

    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, Connection>, StoreError> {
        self.conn.lock().map_err(|_| poisoned(op))
    }

    fn err(&self, op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |e| backend_err(op, &self.path, e)
    }
}

impl Store for SqliteStore {
    fn get(&self, kind: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let conn = self.lock("get")?;
        let err = self.err("get");
        let mut stmt = conn.prepare_cached(SELECT_OBJECT).map_err(&err)?;
        let mut rows = stmt.query(params![kind, key]).map_err(&err)?;
        let Some(row) = rows.next().map_err(&err)? else {
            return Ok(None);
        };
        Ok(Some(Record {
            kind: kind.to_owned(),
            key: key.to_owned(),
            version: column_revision(row, 0, kind, key)?,
            value: column(row, 1, kind, key)?,
        }))
    }

    fn list(&self, kind: &str) -> Result<Vec<Record>, StoreError> {
        let conn = self.lock("list")?;
        let err = self.err("list");
        let mut stmt = conn.prepare_cached(SELECT_KIND).map_err(&err)?;
        let mut rows = stmt.query([kind]).map_err(&err)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(&err)? {
            let key: String = column(row, 0, kind, "<unreadable key>")?;
            let version = column_revision(row, 1, kind, &key)?;
            let value = column(row, 2, kind, &key)?;
            out.push(Record { kind: kind.to_owned(), key, value, version });
        }
        Ok(out)
    }

    fn commit(&self, ops: &[Op]) -> Result<Revision, StoreError> {
        check_no_duplicates(ops)?;
        if ops.is_empty() {
            return self.revision();
        }
        let mut conn = self.lock("commit")?;
        let err = self.err("commit");
        // IMMEDIATE takes the write lock up front, so the checks below see the state the writes apply to.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&err)?;
        let current = read_meta(&tx, "revision", "commit", &self.path)?;
        let revision = current.checked_add(1).ok_or_else(|| StoreError::Backend {
            op: "commit",
            message: format!("{}: revision counter overflowed", self.path),
        })?;
        let rev_sql = to_sql(revision, "commit")?;
        let mut seq: i64 = 0;
        {
            let mut select = tx.prepare_cached(SELECT_VERSION).map_err(&err)?;
            let mut upsert = tx.prepare_cached(UPSERT_OBJECT).map_err(&err)?;
            let mut delete = tx.prepare_cached(DELETE_OBJECT).map_err(&err)?;
            let mut record = tx.prepare_cached(INSERT_CHANGE).map_err(&err)?;
            for op in ops {
                let (kind, key, expect) = (op.kind(), op.key(), op.expect());
                // Ops never share a key, so checking each just before applying it is equivalent to
                // checking all first; any failure drops `tx`, which rolls everything back.
                if expect != Precondition::Any {
                    let actual = select
                        .query_row(params![kind, key], |r| r.get::<_, i64>(0))
                        .optional()
                        .map_err(&err)?
                        .map(|v| from_sql(v, kind, key))
                        .transpose()?;
                    if !expect.holds(actual) {
                        return Err(StoreError::Conflict {
                            kind: kind.to_owned(),
                            key: key.to_owned(),
                            expected: expect,
                            actual,
                        });
                    }
                }
                match op {
                    Op::Put { value, .. } => {
                        upsert.execute(params![kind, key, rev_sql, value]).map_err(&err)?;
                        record.execute(params![rev_sql, seq, kind, key, value]).map_err(&err)?;
                        seq += 1;
                    }
                    Op::Delete { .. } => {
                        if delete.execute(params![kind, key]).map_err(&err)? > 0 {
                            record.execute(params![rev_sql, seq, kind, key, None::<&[u8]>]).map_err(&err)?;
                            seq += 1;
                        }
                    }
                }
            }
            if seq > 0 {
                let mut update = tx.prepare_cached(UPDATE_META).map_err(&err)?;
                update.execute(params!["revision", rev_sql]).map_err(&err)?;
            }
        }
        if seq == 0 {
            // Only deletes of missing objects: nothing was written, no revision is spent.
            return Ok(current);
        }
        tx.commit().map_err(&err)?;
        self.watch.publish(revision);
        Ok(revision)
    }

    fn revision(&self) -> Result<Revision, StoreError> {
        let conn = self.lock("revision")?;
        read_meta(&conn, "revision", "revision", &self.path)
    }

    fn changes_since(&self, after: Revision, limit: usize) -> Result<Vec<Change>, StoreError> {
        let mut conn = self.lock("changes_since")?;
        let err = self.err("changes_since");
        // One read transaction, so the compaction bound and the rows come from the same snapshot.
        let tx = conn.transaction().map_err(&err)?;
        let compacted_before = read_meta(&tx, "compacted_before", "changes_since", &self.path)?;
        check_not_compacted(after, compacted_before)?;
        let mut page: Vec<Change> = Vec::new();
        if limit == 0 {
            return Ok(page);
        }
        {
            let mut stmt = tx.prepare_cached(SELECT_CHANGES).map_err(&err)?;
            let mut rows = stmt.query([to_sql(after, "changes_since")?]).map_err(&err)?;
            while let Some(row) = rows.next().map_err(&err)? {
                let revision = column_revision(row, 0, "changes", "<unreadable revision>")?;
                if page_full(page.len(), limit, page.last().map(|c| c.revision), revision) {
                    break;
                }
                let at = format!("revision {revision}");
                page.push(Change {
                    revision,
                    kind: column(row, 1, "changes", &at)?,
                    key: column(row, 2, "changes", &at)?,
                    value: column(row, 3, "changes", &at)?,
                });
            }
        }
        tx.finish().map_err(&err)?;
        Ok(page)
    }

    fn wait_for_revision(&self, after: Revision, timeout: Duration) -> Result<Revision, StoreError> {
        let current = self.revision()?;
        if current > after {
            return Ok(current);
        }
        self.watch.wait(after, timeout);
        self.revision()
    }

    fn compact(&self, before: Revision) -> Result<(), StoreError> {
        let mut conn = self.lock("compact")?;
        let err = self.err("compact");
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&err)?;
        let revision = read_meta(&tx, "revision", "compact", &self.path)?;
        let compacted_before = read_meta(&tx, "compacted_before", "compact", &self.path)?;
        let before = before.min(revision.saturating_add(1));
        if before <= compacted_before {
            return Ok(());
        }
        let before_sql = to_sql(before, "compact")?;
        tx.execute("DELETE FROM changes WHERE revision < ?1", [before_sql]).map_err(&err)?;
        tx.execute(UPDATE_META, params!["compacted_before", before_sql]).map_err(&err)?;
        tx.commit().map_err(&err)?;
        Ok(())
    }
}

fn backend_err(op: &'static str, path: &str, e: rusqlite::Error) -> StoreError {
    StoreError::Backend { op, message: format!("{path}: {e}") }
}

fn corrupt(kind: &str, key: &str, message: impl Display) -> StoreError {
    StoreError::Corrupt { kind: kind.to_owned(), key: key.to_owned(), message: message.to_string() }
}

/// Reads column `idx`, reporting a type mismatch as corruption of `kind/key`.
fn column<T: rusqlite::types::FromSql>(
    row: &Row<'_>,
    idx: usize,
    kind: &str,
    key: &str,
) -> Result<T, StoreError> {
    row.get(idx).map_err(|e| corrupt(kind, key, e))
}

fn column_revision(row: &Row<'_>, idx: usize, kind: &str, key: &str) -> Result<Revision, StoreError> {
    from_sql(column::<i64>(row, idx, kind, key)?, kind, key)
}

fn from_sql(v: i64, kind: &str, key: &str) -> Result<Revision, StoreError> {
    Revision::try_from(v).map_err(|_| corrupt(kind, key, format_args!("negative revision {v}")))
}

fn to_sql(r: Revision, op: &'static str) -> Result<i64, StoreError> {
    i64::try_from(r).map_err(|_| StoreError::Backend {
        op,
        message: format!("revision {r} does not fit in sqlite's 64-bit signed integer"),
    })
}

fn read_meta(
    conn: &Connection,
    name: &'static str,
    op: &'static str,
    path: &str,
) -> Result<Revision, StoreError> {
    let value: Option<i64> = conn
        .prepare_cached(SELECT_META)
        .and_then(|mut stmt| stmt.query_row([name], |r| r.get(0)).optional())
        .map_err(|e| backend_err(op, path, e))?;
    match value {
        Some(v) => from_sql(v, "meta", name),
        None => Err(corrupt("meta", name, format_args!("{path}: missing from the meta table"))),
    }
}
