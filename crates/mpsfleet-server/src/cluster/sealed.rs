//! Values the server must read back but never store in plain text (stored secrets, the secret
//! access keys of AWS keys): ChaCha20-Poly1305 under a key derived from the server's key for one
//! purpose ([`crate::auth::ServerKey::derive_key`]), a random nonce per value, and the name the
//! value belongs to as associated data (a sealed value cannot be moved to another name). Every
//! server of a cluster holds the same server key; the store alone opens nothing.

use super::Error;
use crate::auth::{hex, unhex, ServerKey};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use serde::{Deserialize, Serialize};

/// A sealed value as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sealed {
    /// 12 random bytes, hex.
    pub nonce: String,
    /// The value encrypted, with its 16-byte tag, hex.
    pub ciphertext: String,
}

fn cipher(key: &ServerKey, purpose: &str) -> ChaCha20Poly1305 {
    ChaCha20Poly1305::new(Key::from_slice(&key.derive_key(purpose)))
}

/// Seals `value` for `purpose`, bound to `name`.
pub fn seal(key: &ServerKey, purpose: &str, name: &str, value: &[u8]) -> Result<Sealed, Error> {
    let mut nonce = [0u8; 12];
    getrandom::fill(&mut nonce)
        .map_err(|e| Error::StoreUnavailable(format!("no randomness to seal with: {e}")))?;
    let ct = cipher(key, purpose)
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: value, aad: name.as_bytes() })
        .map_err(|_| Error::Internal("sealing a value failed".into()))?;
    Ok(Sealed { nonce: hex(&nonce), ciphertext: hex(&ct) })
}

/// Opens what [`seal`] sealed for `purpose` and `name`; `Err(why)` when the record is damaged
/// or was sealed under another server key or name.
pub fn open(key: &ServerKey, purpose: &str, name: &str, sealed: &Sealed) -> Result<Vec<u8>, &'static str> {
    let nonce = unhex(&sealed.nonce).filter(|n| n.len() == 12).ok_or("bad nonce")?;
    let ct = unhex(&sealed.ciphertext).ok_or("bad ciphertext")?;
    cipher(key, purpose)
        .decrypt(Nonce::from_slice(&nonce), Payload { msg: &ct, aad: name.as_bytes() })
        .map_err(|_| {
            "cannot be opened: the server key (server.key) is not the one it was sealed under; restore that \
             key, or make the value again"
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_for_its_purpose_name_and_key_only() {
        let key = ServerKey::random().unwrap();
        let s = seal(&key, "p", "n", b"value").unwrap();
        assert!(!s.ciphertext.contains(&hex(b"value")));
        assert_eq!(open(&key, "p", "n", &s).unwrap(), b"value");
        assert!(open(&key, "q", "n", &s).is_err());
        assert!(open(&key, "p", "m", &s).is_err());
        assert!(open(&ServerKey::random().unwrap(), "p", "n", &s).is_err());
        assert_ne!(seal(&key, "p", "n", b"value").unwrap(), s, "a nonce is never reused");
    }
}
