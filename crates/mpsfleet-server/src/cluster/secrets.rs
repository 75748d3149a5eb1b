//! Stored secrets: values the containers of a task get as environment variables (ECS
//! `secrets[].valueFrom`), the credentials of a private registry (`repositoryCredentials`) and
//! log driver options (`logConfiguration.secretOptions`).
//! The operations are `Cluster`'s, in `access.rs`; what they share is here.
//!
//! A value is encrypted with ChaCha20-Poly1305 under a key derived from the server's key
//! ([`crate::auth::ServerKey::derive_key`]), with a random nonce per value and the secret's name
//! as associated data (a value cannot be moved to another name). The store, and so `state.db`
//! and its WAL, holds the nonce and the ciphertext only. Values are not kept in memory: each
//! read decrypts the record. The plaintext goes to one place: the agent of the host a task is
//! placed on, for that task's definition's names ([`Cluster::task_secrets`]).

use super::error::Error;
use super::sealed::{open, Sealed};
use mpsfleet_types::secret::SecretInfo;
use mpsfleet_types::TaskDefinition;
use serde::{Deserialize, Serialize};

/// Store kind of secrets, keyed by name.
pub(super) const SECRET: &str = "secret";
/// What the encryption key is derived for.
pub(super) const KEY_PURPOSE: &str = "secrets";
/// The most secrets the server keeps.
pub const MAX_SECRETS: usize = 10_000;

/// A secret as stored: never its value.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SecretRecord {
    pub(super) name: String,
    /// 12 random bytes, hex.
    pub(super) nonce: String,
    /// The value encrypted, with its 16-byte tag, hex.
    pub(super) ciphertext: String,
    pub(super) size: usize,
    pub(super) created_at_ms: u64,
    pub(super) updated_at_ms: u64,
}

impl SecretRecord {
    pub(super) fn info(&self) -> SecretInfo {
        SecretInfo {
            name: self.name.clone(),
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            size: self.size,
        }
    }
}

/// A reference to a stored secret in a task definition, with its JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretUse {
    pub path: String,
    pub name: String,
}

/// Every stored secret `td` names, in document order: its containers' `secrets`, log
/// `secretOptions` and `repositoryCredentials`.
pub fn secret_uses(td: &TaskDefinition) -> Vec<SecretUse> {
    let mut out = Vec::new();
    for (i, c) in td.container_definitions.iter().enumerate() {
        let at = format!("containerDefinitions[{i}]");
        for (j, s) in c.secrets.iter().enumerate() {
            out.push(SecretUse { path: format!("{at}.secrets[{j}].valueFrom"), name: s.value_from.clone() });
        }
        if let Some(l) = &c.log_configuration {
            for (j, s) in l.secret_options.iter().enumerate() {
                out.push(SecretUse {
                    path: format!("{at}.logConfiguration.secretOptions[{j}].valueFrom"),
                    name: s.value_from.clone(),
                });
            }
        }
        if let Some(r) = &c.repository_credentials {
            out.push(SecretUse {
                path: format!("{at}.repositoryCredentials.credentialsParameter"),
                name: r.credentials_parameter.clone(),
            });
        }
    }
    out
}

/// ECS's form for one key of a JSON secret:
/// `arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME:JSON-KEY:VERSION-STAGE:VERSION-ID`.
/// Returns the secret's ARN (its first seven fields), the key, and whether a version was named.
pub(super) fn json_key_form(name: &str) -> Option<(String, &str, bool)> {
    let fields: Vec<&str> = name.split(':').collect();
    if fields.len() <= 7 || fields[2] != "secretsmanager" || fields[5] != "secret" {
        return None;
    }
    let versioned = fields[8..].iter().any(|f| !f.is_empty());
    Some((fields[..7].join(":"), fields[7], versioned))
}

impl super::tokens::Credentials {
    pub(in crate::cluster) fn decrypt(&self, rec: &SecretRecord) -> Result<String, Error> {
        let corrupt = |why: &str| Error::StoreCorrupt(format!("secret {:?}: {why}", rec.name));
        let sealed = Sealed { nonce: rec.nonce.clone(), ciphertext: rec.ciphertext.clone() };
        let plain = open(&self.key, KEY_PURPOSE, &rec.name, &sealed).map_err(corrupt)?;
        String::from_utf8(plain).map_err(|_| corrupt("not UTF-8 after decryption"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::*;
    use mpsfleet_core::clock::ManualClock;
    use mpsfleet_store::{MemoryStore, Store};
    use mpsfleet_types::secret::CreateSecret;
    use std::sync::Arc;

    fn cluster() -> (Cluster, Arc<MemoryStore>) {
        let store = Arc::new(MemoryStore::new());
        let c = Cluster::load(store.clone(), Arc::new(ManualClock::new(1_000)), |_| Ok(())).unwrap();
        (c, store)
    }

    fn create(c: &mut Cluster, name: &str, value: &str) -> Result<SecretInfo, Error> {
        c.create_secret(CreateSecret { name: name.into(), value: value.into() })
    }

    #[test]
    fn values_are_stored_encrypted_and_bound_to_their_name() {
        let (mut c, store) = cluster();
        let info = create(&mut c, "db-pass", "hunter2-very-secret").unwrap();
        assert_eq!((info.name.as_str(), info.size), ("db-pass", 19));
        let raw = store.get(SECRET, "db-pass").unwrap().unwrap();
        assert!(!String::from_utf8_lossy(&raw.value).contains("hunter2"));
        assert_eq!(c.resolve_secret("db-pass").unwrap(), Ok("hunter2-very-secret".into()));
        // The same ciphertext under another name does not decrypt.
        let mut moved: SecretRecord = decode(&raw).unwrap();
        moved.name = "other".into();
        assert!(c.creds.decrypt(&moved).unwrap_err().to_string().contains("server key"));
        // Two values never share a nonce.
        create(&mut c, "db-pass-2", "hunter2-very-secret").unwrap();
        let a: SecretRecord = decode(&raw).unwrap();
        let b: SecretRecord = decode(&store.get(SECRET, "db-pass-2").unwrap().unwrap()).unwrap();
        assert_ne!((a.nonce, a.ciphertext), (b.nonce, b.ciphertext));
    }

    #[test]
    fn create_list_delete() {
        let (mut c, _) = cluster();
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-pass-AbCdEf";
        create(&mut c, arn, "v").unwrap();
        assert!(matches!(create(&mut c, arn, "w"), Err(Error::AlreadyExists { .. })));
        let e = create(&mut c, "a b", "v").unwrap_err().to_string();
        assert!(e.contains("name") && e.contains("' '"), "{e}");
        let e = create(&mut c, "big", &"x".repeat(65_537)).unwrap_err().to_string();
        assert!(e.contains("value") && e.contains("65536"), "{e}");
        assert_eq!(c.secrets().unwrap().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), [arn]);
        c.delete_secret(arn).unwrap();
        assert!(c.secrets().unwrap().is_empty());
        assert!(matches!(c.delete_secret(arn), Err(Error::NotFound { .. })));
    }

    /// A `valueFrom` is any string (ECS's own agent tests register `$$$SECRET_VALUE_FROM$$$`):
    /// it is looked up as an opaque key, and one that names nothing says so, quoted.
    #[test]
    fn any_name_is_looked_up_as_an_opaque_key() {
        let (mut c, _) = cluster();
        create(&mut c, "db", "v").unwrap();
        let names = [
            "$$$SECRET_VALUE_FROM$$$",
            "../../db",
            "db\n\u{1b}[2J",
            "x\0y",
            "arn:aws:secretsmanager:::secret:db:k::",
            "arn:aws:secretsmanager:r:a:secret:$$$:k:",
            ":::::::::::",
            "ü/é?#%2F",
        ];
        for name in names {
            let why = c.resolve_secret(name).unwrap().unwrap_err();
            assert!(why.contains(&format!("{name:?}")) || why.contains("\"db\""), "{name:?}: {why}");
            assert!(!why.contains('\n') && !why.contains('\u{1b}'), "{name:?}: {why}");
        }
        // A definition naming it registers, and is refused at run with the field's path.
        let doc = serde_json::json!({
            "family": "f",
            "containerDefinitions": [{"name": "a", "command": ["x"],
                "secrets": [{"name": "S", "valueFrom": "$$$SECRET_VALUE_FROM$$$"}]}]
        });
        let td =
            mpsfleet_core::taskdef::parse_task_definition(doc.to_string().as_bytes()).unwrap().definition;
        let e = c.check_task_secrets(&td).unwrap_err().to_string();
        assert!(e.starts_with("containerDefinitions[0].secrets[0].valueFrom: no secret named"), "{e}");
    }

    #[test]
    fn a_json_key_of_a_secret_is_taken_as_ecs_takes_it() {
        let (mut c, _) = cluster();
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:db";
        create(&mut c, arn, r#"{"username": "app", "port": 5432}"#).unwrap();
        assert_eq!(c.resolve_secret(&format!("{arn}:username::")).unwrap(), Ok("app".into()));
        assert_eq!(c.resolve_secret(&format!("{arn}:port::")).unwrap(), Ok("5432".into()));
        assert!(c.resolve_secret(&format!("{arn}:nope::")).unwrap().unwrap_err().contains("no such key"));
        assert!(c
            .resolve_secret(&format!("{arn}:username:AWSPREVIOUS:"))
            .unwrap()
            .unwrap_err()
            .contains("version"));
        assert!(c.resolve_secret("missing").unwrap().unwrap_err().contains("secret create"));
    }
}
