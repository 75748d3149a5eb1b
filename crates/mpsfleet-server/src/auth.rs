//! Bearer tokens: the admin token, the agent join token and per-host credentials.
//!
//! Only SHA-256 digests are stored. The admin and join tokens are created at first start,
//! written 0600 into the data directory and printed once.

use crate::error::ApiError;
use mpsfleet_types::HostId;
use sha2::{Digest, Sha256};
use std::io::Write as _;
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
}

/// A new random token with a recognisable prefix, such as `mpsf_adm_…`.
pub fn new_token(prefix: &str) -> Result<String, ApiError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::StoreUnavailable(format!("no randomness for a token: {e}")))?;
    Ok(format!("{prefix}{}", hex(&bytes)))
}

pub fn digest(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// A random 64-bit number, for task ids.
pub fn random_u64() -> Result<u64, ApiError> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::StoreUnavailable(format!("no randomness: {e}")))?;
    Ok(u64::from_le_bytes(bytes))
}

/// Writes a secret file readable by its owner only.
pub fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(secret.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

/// The bearer token of an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Result<&str, ApiError> {
    let value = header.ok_or(ApiError::Unauthorized(
        "missing Authorization header: send 'Authorization: Bearer <token>' (see MPSFLEET_TOKEN)",
    ))?;
    value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::Unauthorized("Authorization header must be 'Bearer <token>'"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn digest_is_lowercase_hex_sha256() {
        assert_eq!(super::digest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
