//! Bearer tokens: the admin token, the agent join token and per-host credentials, and the
//! tokens the server derives from its key (agent tokens, launch tokens).
//!
//! Only SHA-256 digests are stored. The admin and join tokens are created at first start,
//! written 0600 into the data directory and printed once. Tokens the server must present or
//! hand out again (the token it calls an agent with, the token a host it launched joins with)
//! are not stored at all: they are HMAC-SHA256 of what they are for under the server's key
//! ([`ServerKey`], `<data dir>/server.key`, 0600).

use crate::cluster::error::Error;
use mpsfleet_types::HostId;
use sha2::{Digest, Sha256};
use std::path::Path;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    /// Holder of the join token: may register hosts, nothing else.
    Joiner,
    /// An agent, for its own host only.
    Host(HostId),
    /// Holder of an incident's one-time replacement token: may register one host, which
    /// becomes that incident's replacement.
    Replacement(String),
    /// An API token an admin made (`token create`), with its role, and the one pool it acts
    /// in when it is scoped to one (`token create --pool`).
    Token {
        id: String,
        role: mpsfleet_types::access::Role,
        pool: Option<String>,
    },
    /// Holder of the launch token of a host the server asked a capacity provider for: may
    /// register that one host, by that name, into that pool.
    Launch {
        pool: mpsfleet_types::PoolName,
        name: String,
    },
}

impl Principal {
    /// The caller as errors and logs name it ("token t-1 (operator of pool gpu)").
    pub(crate) fn describe(&self) -> String {
        match self {
            Principal::Admin => "the admin token".into(),
            Principal::Token { id, role, pool: None } => format!("token {id} ({})", role.as_str()),
            Principal::Token { id, role, pool: Some(pool) } => {
                format!("token {id} ({} of pool {pool})", role.as_str())
            }
            Principal::Joiner => "the join token".into(),
            Principal::Host(h) => format!("the credential of host {h}"),
            Principal::Replacement(i) => format!("the replacement token of incident {i}"),
            Principal::Launch { pool, name } => format!("the launch token of host {name} in pool {pool}"),
        }
    }

    /// The one pool this caller acts in, when its token is scoped to one.
    pub fn scope(&self) -> Option<&str> {
        match self {
            Principal::Token { pool, .. } => pool.as_deref(),
            _ => None,
        }
    }

    /// Whether this caller may register a host (the join token, an admin, an incident's
    /// replacement token, a provider's launch token).
    pub fn may_join(&self) -> bool {
        matches!(
            self,
            Principal::Joiner | Principal::Admin | Principal::Replacement(_) | Principal::Launch { .. }
        )
    }

    /// The role this caller acts with: an admin's, or an API token's; none for the join,
    /// replacement, launch and host credentials.
    pub fn role(&self) -> Option<mpsfleet_types::access::Role> {
        match self {
            Principal::Admin => Some(mpsfleet_types::access::Role::Admin),
            Principal::Token { role, .. } => Some(*role),
            _ => None,
        }
    }

    /// Whether this caller is an agent, for its own host.
    pub fn is_host(&self) -> bool {
        matches!(self, Principal::Host(_))
    }

    /// Whether this caller may see and act on what belongs to `pool`.
    pub fn sees_pool(&self, pool: &str) -> bool {
        self.scope().is_none_or(|p| p == pool)
    }
}

/// A new random token with a recognisable prefix, such as `mpsf_adm_…`.
pub fn new_token(prefix: &str) -> Result<String, Error> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::StoreUnavailable(format!("no randomness for a token: {e}")))?;
    Ok(format!("{prefix}{}", hex(&bytes)))
}

pub fn digest(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// `bytes` in lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// The server's secret for the tokens it derives rather than stores. Without the key file
/// (in-memory tests) a random key lives as long as the process.
#[derive(Clone)]
pub struct ServerKey([u8; 32]);

impl std::fmt::Debug for ServerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerKey(<redacted>)")
    }
}

impl ServerKey {
    pub fn random() -> Result<Self, Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| Error::StoreUnavailable(format!("no randomness for the server key: {e}")))?;
        Ok(ServerKey(bytes))
    }

    /// Reads the key at `path` (64 hex digits), creating it 0600 when there is none.
    pub fn load_or_create(path: &Path) -> Result<Self, Error> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            Error::StoreUnavailable(format!("cannot {what} the server key {}: {e}", path.display()))
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let text = text.trim();
                let bytes = unhex(text).filter(|b| b.len() == 32).ok_or_else(|| {
                    unavailable("read", &"it is not 64 hex digits (restore it, or remove it to make a new one: agents then re-register)")
                })?;
                let mut key = [0u8; 32];
                key.copy_from_slice(&bytes);
                Ok(ServerKey(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = ServerKey::random()?;
                crate::files::write_secret(path, &hex(&key.0)).map_err(|e| unavailable("write", &e))?;
                Ok(key)
            }
            Err(e) => Err(unavailable("read", &e)),
        }
    }

    /// The key's bytes (a webhook secret is one such key).
    pub fn bytes(&self) -> [u8; 32] {
        self.0
    }

    /// The token `prefix` + HMAC-SHA256(key, purpose, parts…) in hex; the parts are separated
    /// by NUL, which no name contains.
    pub fn derive(&self, prefix: &str, purpose: &str, parts: &[&str]) -> String {
        let mut msg = purpose.as_bytes().to_vec();
        for p in parts {
            msg.push(0);
            msg.extend_from_slice(p.as_bytes());
        }
        format!("{prefix}{}", hex(&hmac_sha256(&self.0, &msg)))
    }

    /// A 32-byte key for `purpose` (such as encrypting stored secrets): HMAC-SHA256(key,
    /// "key" NUL purpose), so that no derived token equals a derived key.
    pub fn derive_key(&self, purpose: &str) -> [u8; 32] {
        let mut msg = b"key\0".to_vec();
        msg.extend_from_slice(purpose.as_bytes());
        hmac_sha256(&self.0, &msg)
    }
}

/// A webhook delivery's signature: `v1=` and HMAC-SHA256 of `<timestamp>.<body>` under the
/// webhook's secret, in hex (docs/api.md, "Events and webhook").
pub fn webhook_signature(secret: &[u8; 32], timestamp: u64, body: &[u8]) -> String {
    let mut msg = format!("{timestamp}.").into_bytes();
    msg.extend_from_slice(body);
    format!("v1={}", hex(&hmac_sha256(secret, &msg)))
}

/// Reads the webhook secret at `path` (64 hex digits), creating it 0600 when there is none.
pub fn webhook_secret(path: &Path) -> Result<[u8; 32], Error> {
    Ok(ServerKey::load_or_create(path)?.0)
}

/// HMAC-SHA256 (RFC 2104) with a key of at most one block.
pub(crate) fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(msg).finalize();
    Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().into()
}

/// The bytes of lowercase or uppercase hex `text`; `None` when it is not hex.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// A random 64-bit number, for task ids.
pub fn random_u64() -> Result<u64, Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| Error::StoreUnavailable(format!("no randomness: {e}")))?;
    Ok(u64::from_le_bytes(bytes))
}

/// The bearer token of an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Result<&str, Error> {
    let value = header.ok_or(Error::Unauthorized(
        "missing Authorization header: send 'Authorization: Bearer <token>' (see MPSFLEET_TOKEN)",
    ))?;
    value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        // A join token may carry the cluster CA's hash after its secret; the secret is the token.
        .map(|t| mpsfleet_client::tls::split_pin(t).0)
        .ok_or(Error::Unauthorized("Authorization header must be 'Bearer <token>'"))
}

#[cfg(test)]
mod tests {
    /// RFC 4231 case 1's message under a 32-byte key, as
    /// `openssl dgst -sha256 -mac HMAC -macopt hexkey:0b…0b` computes it.
    #[test]
    fn hmac_matches_openssl() {
        let key = [0x0b; 32];
        let mac = super::hmac_sha256(&key, b"Hi There");
        assert_eq!(super::hex(&mac), "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7");
    }

    #[test]
    fn webhook_signatures_cover_the_timestamp_and_the_body() {
        let s = [3u8; 32];
        let sig = super::webhook_signature(&s, 1_700_000_000, b"{\"type\":\"x\"}");
        assert!(sig.starts_with("v1=") && sig.len() == 3 + 64, "{sig}");
        assert_eq!(sig, super::webhook_signature(&s, 1_700_000_000, b"{\"type\":\"x\"}"));
        assert_ne!(sig, super::webhook_signature(&s, 1_700_000_001, b"{\"type\":\"x\"}"));
        assert_ne!(sig, super::webhook_signature(&s, 1_700_000_000, b"{\"type\":\"y\"}"));
        assert_ne!(sig, super::webhook_signature(&[4u8; 32], 1_700_000_000, b"{\"type\":\"x\"}"));
    }

    #[test]
    fn derived_tokens_differ_by_purpose_and_part_and_key() {
        let k = super::ServerKey([7; 32]);
        let a = k.derive("mpsf_agent_", "agent", &["h1"]);
        assert!(a.starts_with("mpsf_agent_") && a.len() == "mpsf_agent_".len() + 64, "{a}");
        assert_eq!(a, k.derive("mpsf_agent_", "agent", &["h1"]));
        assert_ne!(a, k.derive("mpsf_agent_", "agent", &["h2"]));
        assert_ne!(a, k.derive("mpsf_agent_", "launch", &["h1"]));
        assert_ne!(k.derive("x", "launch", &["a", "bc"]), k.derive("x", "launch", &["ab", "c"]));
        assert_ne!(a, super::ServerKey([8; 32]).derive("mpsf_agent_", "agent", &["h1"]));
    }

    #[test]
    fn derived_keys_differ_by_purpose_and_key() {
        let k = super::ServerKey([7; 32]);
        assert_eq!(k.derive_key("secrets"), k.derive_key("secrets"));
        assert_ne!(k.derive_key("secrets"), k.derive_key("other"));
        assert_ne!(k.derive_key("secrets"), super::ServerKey([8; 32]).derive_key("secrets"));
        assert_ne!(super::hex(&k.derive_key("secrets")), k.derive("", "secrets", &[]));
    }

    #[test]
    fn the_key_file_is_made_once_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.key");
        let k1 = super::ServerKey::load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let k2 = super::ServerKey::load_or_create(&path).unwrap();
        assert_eq!(k1.0, k2.0);
        std::fs::write(&path, "not hex\n").unwrap();
        let e = super::ServerKey::load_or_create(&path).unwrap_err().to_string();
        assert!(e.contains("64 hex digits"), "{e}");
    }

    #[test]
    fn digest_is_lowercase_hex_sha256() {
        assert_eq!(super::digest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
