//! Where the store's state lives in etcd, and how a commit's changes are encoded.
//!
//! Under the prefix `P` (default `/mpsfleet`):
//!
//! | key | value |
//! |---|---|
//! | `P/head` | the store's revision, decimal; the commit transaction compares and bumps it |
//! | `P/log/<rev>` | the commit of revision `rev` (20 digits): every change it made, encoded below |
//! | `P/chunk/<rev>/<nonce>/<i>` | pieces of a commit too large for one etcd request |
//! | `P/obj/<kind>/<key>` | a live object: its version (8 bytes, big endian), then its value |
//! | `P/applied` | the last revision whose changes are all copied into `P/obj/` |
//! | `P/compacted` | feed entries below this revision are dropped (`Store::compact`) |
//! | `P/leader` | the elected server, written with its lease |
//!
//! A commit is one etcd transaction whatever its size: it writes `P/head` and one `P/log/<rev>`
//! key (a batch over [`CHUNK_BYTES`] is first written as chunks that only that log entry names,
//! so a failed commit leaves unreferenced chunks, never a partial batch). Copying the changes into
//! `P/obj/` happens afterwards in transactions of at most [`OBJ_OPS_PER_TXN`] keys; it is only an
//! index for loading, and a reader replays every log entry after `P/applied` on top of it.

use crate::{Revision, StoreError};

/// A log entry larger than this is split into chunks (etcd refuses requests over 1.5 MiB).
pub(crate) const CHUNK_BYTES: usize = 1024 * 1024;

/// Object keys copied per transaction: etcd allows 128 operations, and the copy adds two.
pub(crate) const OBJ_OPS_PER_TXN: usize = 100;

/// The largest value one object may hold: it must fit one etcd request with its key.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Result<Keys, String> {
        let p = prefix.trim_end_matches('/');
        if p.is_empty() || !p.starts_with('/') || p.contains('\0') {
            return Err(format!(
                "etcd prefix {prefix:?} must start with / and name something, e.g. /mpsfleet"
            ));
        }
        Ok(Keys { prefix: p.to_owned() })
    }

    pub(crate) fn head(&self) -> String {
        format!("{}/head", self.prefix)
    }
    pub(crate) fn applied(&self) -> String {
        format!("{}/applied", self.prefix)
    }
    pub(crate) fn compacted(&self) -> String {
        format!("{}/compacted", self.prefix)
    }
    pub(crate) fn leader(&self) -> String {
        format!("{}/leader", self.prefix)
    }
    pub(crate) fn log(&self, rev: Revision) -> String {
        format!("{}/log/{rev:020}", self.prefix)
    }
    /// The end of the log keys (exclusive).
    pub(crate) fn log_end(&self) -> String {
        format!("{}/log0", self.prefix)
    }
    /// The revision a log key names.
    pub(crate) fn log_revision(&self, key: &str) -> Option<Revision> {
        key.strip_prefix(&self.prefix)?.strip_prefix("/log/")?.parse().ok()
    }
    pub(crate) fn chunk_dir(&self, rev: Revision, nonce: &str) -> String {
        format!("{}/chunk/{rev:020}/{nonce}/", self.prefix)
    }
    pub(crate) fn chunk(&self, rev: Revision, nonce: &str, i: u32) -> String {
        format!("{}{i:06}", self.chunk_dir(rev, nonce))
    }
    /// The chunk keys of every revision below `rev`: `[start, end)`.
    pub(crate) fn chunks_below(&self, rev: Revision) -> (String, String) {
        (format!("{}/chunk/", self.prefix), format!("{}/chunk/{rev:020}", self.prefix))
    }
    pub(crate) fn obj(&self, kind: &str, key: &str) -> String {
        format!("{}/obj/{kind}/{key}", self.prefix)
    }
    /// All object keys: `[start, end)`.
    pub(crate) fn objects(&self) -> (String, String) {
        (format!("{}/obj/", self.prefix), format!("{}/obj0", self.prefix))
    }
    /// The kind and key an object key names.
    pub(crate) fn obj_name<'a>(&self, k: &'a str) -> Option<(&'a str, &'a str)> {
        k.strip_prefix(&self.prefix)?.strip_prefix("/obj/")?.split_once('/')
    }
}

/// One change of a log entry: kind, key, and the new value (`None`: deleted).
pub(crate) type Change = (String, String, Option<Vec<u8>>);

/// The changes of one revision, as stored in its log entry.
pub(crate) type Entry = Vec<Change>;

/// What a log key holds: the changes themselves, or where their chunks are.
pub(crate) enum Stored {
    Inline(Entry),
    Chunked { nonce: String, chunks: u32 },
}

const INLINE: u8 = b'E';
const CHUNKED: u8 = b'C';
/// An inline entry compressed with LZ4 (the uncompressed size first).
const COMPRESSED: u8 = b'Z';

/// Entries at least this large are compressed: task records are repetitive JSON, and etcd's
/// throughput here is bound by bytes (docs/benchmarks.md).
const COMPRESS_FROM: usize = 4 * 1024;

/// The largest entry a decoder will inflate, whatever a stored size prefix claims.
const MAX_ENTRY_BYTES: usize = 1 << 29;

/// [`encode_entry`], compressed when that pays.
pub(crate) fn encode_entry_compressed(entry: &Entry) -> Vec<u8> {
    let plain = encode_entry(entry);
    if plain.len() < COMPRESS_FROM {
        return plain;
    }
    let mut out = vec![COMPRESSED];
    out.extend_from_slice(&lz4_flex::compress_prepend_size(&plain[1..]));
    out
}

pub(crate) fn encode_entry(entry: &Entry) -> Vec<u8> {
    let size: usize =
        entry.iter().map(|(k, y, v)| 13 + k.len() + y.len() + v.as_ref().map_or(0, Vec::len)).sum();
    let mut out = Vec::with_capacity(1 + size);
    out.push(INLINE);
    out.extend_from_slice(&(entry.len() as u32).to_be_bytes());
    for (kind, key, value) in entry {
        put_bytes(&mut out, kind.as_bytes());
        put_bytes(&mut out, key.as_bytes());
        match value {
            Some(v) => {
                out.push(1);
                put_bytes(&mut out, v);
            }
            None => out.push(0),
        }
    }
    out
}

pub(crate) fn encode_pointer(nonce: &str, chunks: u32) -> Vec<u8> {
    let mut out = vec![CHUNKED];
    out.extend_from_slice(&chunks.to_be_bytes());
    out.extend_from_slice(nonce.as_bytes());
    out
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

pub(crate) fn decode_stored(rev: Revision, bytes: &[u8]) -> Result<Stored, StoreError> {
    let corrupt = |message: &str| StoreError::Corrupt {
        kind: "log".to_owned(),
        key: rev.to_string(),
        message: message.to_owned(),
    };
    match bytes.first() {
        Some(&COMPRESSED) => {
            let claimed =
                bytes.get(1..5).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
            if claimed > MAX_ENTRY_BYTES {
                return Err(corrupt("compressed entry claims an impossible size"));
            }
            let plain =
                lz4_flex::decompress_size_prepended(&bytes[1..]).map_err(|e| corrupt(&e.to_string()))?;
            let mut framed = Vec::with_capacity(plain.len() + 1);
            framed.push(INLINE);
            framed.extend_from_slice(&plain);
            decode_stored(rev, &framed)
        }
        Some(&INLINE) => {
            let mut r = Reader { b: &bytes[1..] };
            let count = r.count().ok_or_else(|| corrupt("truncated change count"))?;
            let mut entry = Vec::with_capacity(count.min(1 << 16));
            for _ in 0..count {
                let kind = r.string().ok_or_else(|| corrupt("truncated kind"))?;
                let key = r.string().ok_or_else(|| corrupt("truncated key"))?;
                let value = match r.byte() {
                    Some(1) => Some(r.bytes().ok_or_else(|| corrupt("truncated value"))?.to_vec()),
                    Some(0) => None,
                    _ => return Err(corrupt("bad value tag")),
                };
                entry.push((kind, key, value));
            }
            if !r.b.is_empty() {
                return Err(corrupt("bytes after the last change"));
            }
            Ok(Stored::Inline(entry))
        }
        Some(&CHUNKED) if bytes.len() > 5 => {
            let chunks = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
            let nonce = std::str::from_utf8(&bytes[5..]).map_err(|_| corrupt("bad chunk nonce"))?;
            Ok(Stored::Chunked { nonce: nonce.to_owned(), chunks })
        }
        _ => Err(corrupt("unknown log entry format")),
    }
}

/// The changes of an entry, as the feed reports them.
pub(crate) fn changes_of(rev: Revision, entry: Entry) -> impl Iterator<Item = crate::Change> {
    entry.into_iter().map(move |(kind, key, value)| crate::Change { revision: rev, kind, key, value })
}

/// An object key's value: the version, then the object's bytes.
pub(crate) fn encode_obj(version: Revision, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + value.len());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(value);
    out
}

pub(crate) fn decode_obj(bytes: &[u8]) -> Option<(Revision, Vec<u8>)> {
    let (v, value) = bytes.split_at_checked(8)?;
    Some((u64::from_be_bytes(v.try_into().ok()?), value.to_vec()))
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.b.split_first()?;
        self.b = rest;
        Some(first)
    }
    fn count(&mut self) -> Option<usize> {
        let (n, rest) = self.b.split_at_checked(4)?;
        self.b = rest;
        Some(u32::from_be_bytes(n.try_into().ok()?) as usize)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let (len, rest) = self.b.split_at_checked(4)?;
        let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
        let (out, rest) = rest.split_at_checked(len)?;
        self.b = rest;
        Some(out)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_truncation_is_corrupt() {
        let entry: Entry = vec![
            ("task".into(), "t/1".into(), Some(b"{\"a\":1}".to_vec())),
            ("host".into(), "h".into(), None),
            ("task".into(), "empty".into(), Some(Vec::new())),
        ];
        let bytes = encode_entry(&entry);
        match decode_stored(7, &bytes).expect("decode") {
            Stored::Inline(back) => assert_eq!(back, entry),
            Stored::Chunked { .. } => panic!("expected inline"),
        }
        for cut in 1..bytes.len() {
            assert!(decode_stored(7, &bytes[..cut]).is_err(), "a cut at {cut} must be corrupt");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_stored(7, &longer).is_err());
        match decode_stored(9, &encode_pointer("abc", 3)).expect("pointer") {
            Stored::Chunked { nonce, chunks } => assert_eq!((nonce.as_str(), chunks), ("abc", 3)),
            Stored::Inline(_) => panic!("expected chunked"),
        }
        assert!(decode_stored(9, b"Zzz").is_err());

        // Large entries are compressed and read back the same; a damaged one is corrupt.
        let big: Entry = (0..200)
            .map(|i| ("task".into(), format!("t{i}"), Some(br#"{"status":"RUNNING"}"#.repeat(5))))
            .collect();
        let packed = encode_entry_compressed(&big);
        assert_eq!(packed[0], COMPRESSED);
        assert!(packed.len() * 4 < encode_entry(&big).len(), "repetitive records compress");
        match decode_stored(3, &packed).expect("decode") {
            Stored::Inline(back) => assert_eq!(back, big),
            Stored::Chunked { .. } => panic!("expected inline"),
        }
        let mut damaged = packed.clone();
        damaged.truncate(packed.len() / 2);
        assert!(decode_stored(3, &damaged).is_err());
        assert_eq!(encode_entry_compressed(&entry), bytes, "small entries stay plain");
    }

    #[test]
    fn keys_sort_by_revision_and_name_objects() {
        let k = Keys::new("/m/").expect("prefix");
        assert!(k.log(9) < k.log(10) && k.log(10) < k.log_end());
        assert_eq!(k.log_revision(&k.log(42)), Some(42));
        assert_eq!(k.obj_name(&k.obj("task", "a/b")), Some(("task", "a/b")));
        let (start, end) = k.objects();
        assert!(start < k.obj("zz", "z") && k.obj("zz", "z") < end);
        assert!(Keys::new("m").is_err() && Keys::new("/").is_err());
        assert_eq!(decode_obj(&encode_obj(5, b"x")), Some((5, b"x".to_vec())));
    }
}
