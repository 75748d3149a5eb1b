//! TLS: the cluster's CA, each server's certificate, and the rustls configuration that serves
//! it (docs/security.md, "TLS").
//!
//! A cluster has one CA. The first start of the cluster's first server creates it and keeps it
//! in the store, where every server of the cluster reads it: its certificate in the clear, its
//! private key encrypted with ChaCha20-Poly1305 under a key derived from the server key (as
//! stored secrets are). Each server issues itself a certificate under that CA when it starts,
//! for the names it is reached by, and keeps it in memory only; it renews it before it expires
//! and on `POST /v1/cluster/certificate/rotate`. A client that trusts the CA trusts every server
//! of the cluster, after a rotation or a failover too.
//!
//! The CA's hash (SHA-256 of its certificate's DER) goes in every join token the server hands
//! out ([`mpsfleet_client::tls`]), so a new agent knows which CA to trust before it sends
//! anything.

use crate::auth::{hex, unhex, ServerKey};
use crate::error::ApiError;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use mpsfleet_store::{decode, Op, Precondition, Store, StoreError};
use mpsfleet_types::access::ServerCertificate;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Store kind and key of the cluster CA.
const TLS: &str = "tls";
const CA_KEY: &str = "ca";
/// What the CA key's encryption key is derived for, and its associated data.
const KEY_PURPOSE: &str = "cluster-ca";

/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a server certificate is valid.
pub const CERT_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// A server certificate with less than this left is renewed.
pub const CERT_RENEW_BEFORE: Duration = Duration::from_secs(10 * 24 * 3600);
/// Certificates are valid from a little before they are made, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(3600);

/// The CA as stored: its key only encrypted.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaRecord {
    /// The CA's common name (its issuer name in every certificate it signs).
    name: String,
    cert_pem: String,
    /// 12 random bytes, hex.
    nonce: String,
    /// The PKCS#8 DER key encrypted, with its tag, hex.
    sealed_key: String,
    created_at_ms: u64,
}

/// The cluster's CA, able to sign.
pub struct ClusterCa {
    name: String,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key: KeyPair,
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("{what}: {e}"))
}

fn time_at(ms: u64) -> Result<time::OffsetDateTime, ApiError> {
    let secs = i64::try_from(ms / 1000).map_err(|e| tls_error("the clock", e))?;
    time::OffsetDateTime::from_unix_timestamp(secs).map_err(|e| tls_error("the clock", e))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ClusterCa {
    /// The CA in `store`, or a new one committed there if there is none. When two servers make
    /// one at once, the one committed first is the cluster's and the other is read back.
    pub fn load_or_create(store: &dyn Store, key: &ServerKey, now_ms: u64) -> Result<ClusterCa, ApiError> {
        if let Some(rec) = store.get(TLS, CA_KEY)? {
            return Self::open(decode(&rec)?, key);
        }
        let (ca, rec) = Self::generate(key, now_ms)?;
        match store.commit(&[Op::put_json(TLS, CA_KEY, &rec, Precondition::Absent)?]) {
            Ok(_) => Ok(ca),
            Err(StoreError::Conflict { .. }) => match store.get(TLS, CA_KEY)? {
                Some(rec) => Self::open(decode(&rec)?, key),
                None => Err(ApiError::StoreUnavailable("the cluster CA vanished while being created".into())),
            },
            Err(e) => Err(e.into()),
        }
    }

    fn cipher(key: &ServerKey) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(Key::from_slice(&key.derive_key(KEY_PURPOSE)))
    }

    fn params(name: &str) -> CertificateParams {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn.push(DnType::OrganizationName, "mpsfleet");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
    }

    fn generate(key: &ServerKey, now_ms: u64) -> Result<(ClusterCa, CaRecord), ApiError> {
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).map_err(|e| tls_error("no randomness", e))?;
        let name = format!("mpsfleet cluster CA {}", hex(&id));
        let mut params = Self::params(&name);
        params.not_before = time_at(now_ms.saturating_sub(ms(BACKDATE)))?;
        params.not_after = time_at(now_ms.saturating_add(ms(CA_VALIDITY)))?;
        let signing = KeyPair::generate().map_err(|e| tls_error("cannot make the CA key", e))?;
        let cert =
            params.self_signed(&signing).map_err(|e| tls_error("cannot make the CA certificate", e))?;
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|e| tls_error("no randomness", e))?;
        let sealed = Self::cipher(key)
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload { msg: &signing.serialize_der(), aad: KEY_PURPOSE.as_bytes() },
            )
            .map_err(|_| ApiError::Internal("cannot encrypt the CA key".into()))?;
        let rec = CaRecord {
            name: name.clone(),
            cert_pem: cert.pem(),
            nonce: hex(&nonce),
            sealed_key: hex(&sealed),
            created_at_ms: now_ms,
        };
        let ca = ClusterCa { name, cert_pem: cert.pem(), cert_der: cert.der().clone(), key: signing };
        Ok((ca, rec))
    }

    fn open(rec: CaRecord, key: &ServerKey) -> Result<ClusterCa, ApiError> {
        let corrupt = |why: &str| ApiError::StoreCorrupt(format!("the cluster CA: {why}"));
        let nonce = unhex(&rec.nonce).filter(|n| n.len() == 12).ok_or_else(|| corrupt("bad nonce"))?;
        let sealed = unhex(&rec.sealed_key).ok_or_else(|| corrupt("bad key"))?;
        let der = Self::cipher(key)
            .decrypt(Nonce::from_slice(&nonce), Payload { msg: &sealed, aad: KEY_PURPOSE.as_bytes() })
            .map_err(|_| {
                corrupt(
                    "its key cannot be decrypted: this server's key (server.key) is not the one the CA \
                     was made under; give every server of a cluster the same server.key",
                )
            })?;
        let signing = KeyPair::try_from(der).map_err(|e| corrupt(&format!("its key: {e}")))?;
        let certs = mpsfleet_client::tls::certificates(rec.cert_pem.as_bytes()).map_err(|e| corrupt(&e))?;
        Ok(ClusterCa { name: rec.name, cert_pem: rec.cert_pem, cert_der: certs[0].clone(), key: signing })
    }

    /// The CA certificate, PEM: what clients trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// `sha256:<hex>` of the CA certificate: what join tokens carry.
    pub fn hash(&self) -> String {
        mpsfleet_client::tls::der_hash(&self.cert_der)
    }

    /// A certificate for a server reached by `names` (DNS names or IP addresses), valid for
    /// [`CERT_VALIDITY`] from `now_ms`, with a fresh key.
    pub fn issue_server(&self, names: &[String], now_ms: u64) -> Result<Issued, ApiError> {
        let mut params = CertificateParams::new(names.to_vec())
            .map_err(|e| ApiError::InvalidParameter { field: "--tls-san".into(), message: e.to_string() })?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, names.first().map(String::as_str).unwrap_or("mpsfleet server"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let not_after_ms = now_ms.saturating_add(ms(CERT_VALIDITY));
        params.not_before = time_at(now_ms.saturating_sub(ms(BACKDATE)))?;
        params.not_after = time_at(not_after_ms)?;
        let mut serial = [0u8; 16];
        getrandom::fill(&mut serial).map_err(|e| tls_error("no randomness", e))?;
        serial[0] &= 0x7f;
        params.serial_number = Some(serial.to_vec().into());
        let key = KeyPair::generate().map_err(|e| tls_error("cannot make a server key", e))?;
        let issuer = Issuer::new(Self::params(&self.name), &self.key);
        let cert =
            params.signed_by(&key, &issuer).map_err(|e| tls_error("cannot sign the certificate", e))?;
        Ok(Issued {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
            info: ServerCertificate {
                sha256: mpsfleet_client::tls::der_hash(cert.der()),
                names: names.to_vec(),
                not_before_ms: now_ms.saturating_sub(ms(BACKDATE)),
                not_after_ms,
                ca_hash: self.hash(),
            },
        })
    }
}

/// A certificate the CA issued, with its key.
pub struct Issued {
    /// The certificate, then the CA's.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivatePkcs8KeyDer<'static>,
    pub info: ServerCertificate,
}

/// What a server serves: its current certificate, which [`ServerTls::rotate`] replaces for
/// every connection after it (connections already open keep theirs).
pub struct ServerTls {
    ca: ClusterCa,
    names: Vec<String>,
    current: RwLock<(Arc<CertifiedKey>, ServerCertificate)>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("names", &self.names).finish_non_exhaustive()
    }
}

fn certified(issued: Issued) -> Result<(Arc<CertifiedKey>, ServerCertificate), ApiError> {
    let key = rustls::crypto::ring::sign::any_supported_type(&PrivateKeyDer::Pkcs8(issued.key))
        .map_err(|e| tls_error("the server key", e))?;
    Ok((Arc::new(CertifiedKey::new(issued.chain, key)), issued.info))
}

impl ServerTls {
    /// Serves a certificate for `names` under `ca`, issued now.
    pub fn new(ca: ClusterCa, names: Vec<String>, now_ms: u64) -> Result<Arc<ServerTls>, ApiError> {
        let current = certified(ca.issue_server(&names, now_ms)?)?;
        Ok(Arc::new(ServerTls { ca, names, current: RwLock::new(current) }))
    }

    pub fn ca(&self) -> &ClusterCa {
        &self.ca
    }

    /// The certificate served now.
    pub fn certificate(&self) -> ServerCertificate {
        self.current.read().map(|c| c.1.clone()).unwrap_or_else(|p| p.into_inner().1.clone())
    }

    /// Issues a new certificate (a new key too) and serves it from the next connection on.
    pub fn rotate(&self, now_ms: u64) -> Result<ServerCertificate, ApiError> {
        let next = certified(self.ca.issue_server(&self.names, now_ms)?)?;
        let info = next.1.clone();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next;
        tracing::info!(sha256 = %info.sha256, not_after_ms = info.not_after_ms, "server certificate rotated");
        Ok(info)
    }

    /// Rotates the certificate if less than [`CERT_RENEW_BEFORE`] of it is left.
    pub fn renew_if_due(&self, now_ms: u64) -> Result<Option<ServerCertificate>, ApiError> {
        if self.certificate().not_after_ms.saturating_sub(now_ms) > ms(CERT_RENEW_BEFORE) {
            return Ok(None);
        }
        self.rotate(now_ms).map(Some)
    }

    /// The rustls acceptor of connections: TLS 1.2 and 1.3, HTTP/1.1.
    pub fn acceptor(self: &Arc<Self>) -> Result<tokio_rustls::TlsAcceptor, ApiError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("TLS configuration", e))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

#[derive(Debug)]
struct Resolver(Arc<ServerTls>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.0.current.read().unwrap_or_else(|p| p.into_inner());
        Some(current.0.clone())
    }
}

/// The names a server is reached by when none are given: `localhost`, the loopback addresses,
/// this machine's host name, and the address it listens on when that is a specific one; then
/// `extra` (`--tls-san`).
pub fn default_names(listen: std::net::SocketAddr, extra: &[String]) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if valid_dns_name(host) && host != "localhost" {
            names.push(host.to_string());
        }
    }
    let listen = (!listen.ip().is_unspecified()).then(|| listen.ip().to_string());
    for name in listen.iter().chain(extra) {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

fn valid_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Checks a `--tls-san` value: a DNS name or an IP address.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.parse::<std::net::IpAddr>().is_ok() || valid_dns_name(name) {
        Ok(())
    } else {
        Err(format!("{name:?} is neither a DNS name nor an IP address"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_and_read_back_by_every_server_with_the_key() {
        let store = mpsfleet_store::MemoryStore::new();
        let key = ServerKey::random().unwrap();
        let first = ClusterCa::load_or_create(&store, &key, 1_700_000_000_000).unwrap();
        let again = ClusterCa::load_or_create(&store, &key, 1_700_000_100_000).unwrap();
        assert_eq!(first.hash(), again.hash());
        assert_eq!(first.cert_pem(), again.cert_pem());
        // The stored record holds no key in the clear.
        let rec = store.get(TLS, CA_KEY).unwrap().unwrap();
        let text = String::from_utf8_lossy(&rec.value).to_string();
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        let plain_key = hex(&first.key.serialize_der());
        assert!(!text.contains(&plain_key));
        // Another server key cannot open it, and says why.
        let other = ServerKey::random().unwrap();
        let err = ClusterCa::load_or_create(&store, &other, 1_700_000_200_000).err().expect("refused");
        assert!(err.to_string().contains("server.key"), "{err}");
    }

    #[test]
    fn server_certificates_chain_to_the_ca_and_rotation_changes_them() {
        let store = mpsfleet_store::MemoryStore::new();
        let key = ServerKey::random().unwrap();
        let ca = ClusterCa::load_or_create(&store, &key, 1_700_000_000_000).unwrap();
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let tls = ServerTls::new(ca, names.clone(), 1_700_000_000_000).unwrap();
        let first = tls.certificate();
        assert_eq!(first.names, names);
        assert_eq!(first.ca_hash, tls.ca().hash());
        assert_eq!(first.not_after_ms, 1_700_000_000_000 + ms(CERT_VALIDITY));
        // Verified by webpki against the CA alone, for the names it was made for.
        let verify = |at_ms: u64| {
            let current = tls.current.read().unwrap().0.clone();
            let mut roots = rustls::RootCertStore::empty();
            roots.add(tls.ca().cert_der.clone()).unwrap();
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                Arc::new(rustls::crypto::ring::default_provider()),
            )
            .build()
            .unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let now = rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_millis(at_ms));
            verifier.verify_server_cert(&current.cert[0], &current.cert[1..], &name, &[], now).map(|_| ())
        };
        use rustls::client::danger::ServerCertVerifier as _;
        verify(1_700_000_000_000).expect("chains to the CA");
        assert!(verify(1_700_000_000_000 + ms(CERT_VALIDITY) + 1000).is_err(), "expired");
        assert_eq!(tls.renew_if_due(1_700_000_000_000).unwrap(), None, "fresh: not renewed");
        let due = 1_700_000_000_000 + ms(CERT_VALIDITY - CERT_RENEW_BEFORE) + 1;
        let renewed = tls.renew_if_due(due).unwrap().expect("renewed");
        assert_ne!(renewed.sha256, first.sha256);
        assert_eq!(tls.certificate(), renewed);
        verify(due).expect("the renewed one chains to the CA too");
    }

    #[test]
    fn names_are_dns_names_or_addresses() {
        assert!(check_name("fleet.example.com").is_ok());
        assert!(check_name("10.0.0.5").is_ok());
        assert!(check_name("::1").is_ok());
        assert!(check_name("bad name").is_err());
        assert!(check_name("-x.example").is_err());
        let names = default_names("10.1.2.3:7070".parse().unwrap(), &["fleet.example".into()]);
        assert!(names.contains(&"10.1.2.3".to_string()) && names.contains(&"fleet.example".to_string()));
        assert!(!default_names("0.0.0.0:7070".parse().unwrap(), &[]).contains(&"0.0.0.0".to_string()));
        let loopback = default_names("127.0.0.1:7070".parse().unwrap(), &["127.0.0.1".into()]);
        assert_eq!(loopback.iter().filter(|n| *n == "127.0.0.1").count(), 1, "{loopback:?}");
    }
}
