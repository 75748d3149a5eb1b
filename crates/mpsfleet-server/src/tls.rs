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
//!
//! The operator may give the CA instead (`mpsfleet server --ca-cert --ca-key`, on the
//! cluster's first start), and the CA is rotated in two steps ([`CaSet`]): a next CA is staged
//! (generated, or given) and trusted by every client alongside the current one, which keeps
//! signing; once every agent has reported that it trusts the next one, it is activated: server
//! certificates are issued under it from then on and the old CA is trusted no more.

use crate::auth::{hex, unhex, ServerKey};
use crate::cluster::error::Error;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use mpsfleet_store::{decode, Op, Precondition, Store, StoreError};
use mpsfleet_types::access::{CaInfo, ServerCertificate};
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
/// Store key of the CA staged by a rotation, not yet signing.
const CA_NEXT_KEY: &str = "ca-next";
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
#[derive(Clone, Serialize, Deserialize)]
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
    /// Whether the operator gave it (`--ca-cert`, `cluster ca rotate --ca-cert`).
    #[serde(default)]
    given: bool,
}

/// The cluster's CA, able to sign.
pub struct ClusterCa {
    name: String,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key: KeyPair,
    not_after_ms: u64,
    /// What is stored, to store it again under another key when it is activated.
    record: CaRecord,
}

/// A CA the operator gives: its certificate and its private key (PKCS#8), both PEM.
#[derive(Clone)]
pub struct GivenCa {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for GivenCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GivenCa").finish_non_exhaustive()
    }
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("{what}: {e}"))
}

fn time_at(ms: u64) -> Result<time::OffsetDateTime, Error> {
    let secs = i64::try_from(ms / 1000).map_err(|e| tls_error("the clock", e))?;
    time::OffsetDateTime::from_unix_timestamp(secs).map_err(|e| tls_error("the clock", e))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ClusterCa {
    /// The CA in `store`, or a new one (`given`, else generated) committed there if there is
    /// none. When two servers make one at once, the one committed first is the cluster's and
    /// the other is read back. A `given` CA other than the one stored is refused: replacing
    /// the CA is a rotation.
    pub fn load_or_create(
        store: &dyn Store,
        key: &ServerKey,
        given: Option<&GivenCa>,
        now_ms: u64,
    ) -> Result<ClusterCa, Error> {
        let check = |ca: ClusterCa| -> Result<ClusterCa, Error> {
            let Some(given) = given else { return Ok(ca) };
            let hash = mpsfleet_client::tls::ca_hash(given.cert_pem.as_bytes())
                .map_err(|e| Error::invalid("--ca-cert", e))?;
            if hash != ca.hash() {
                return Err(Error::Conflict(format!(
                    "the cluster already has its CA ({}), not the one --ca-cert gives ({hash}): to \
                     replace it, rotate to the new one (`mpsfleet cluster ca rotate --ca-cert F \
                     --ca-key K`, then `mpsfleet cluster ca activate`)",
                    ca.hash()
                )));
            }
            Ok(ca)
        };
        if let Some(rec) = store.get(TLS, CA_KEY)? {
            return check(Self::open(decode(&rec)?, key)?);
        }
        let ca = match given {
            Some(g) => Self::import(g, key, now_ms)?,
            None => Self::generate(key, now_ms)?,
        };
        match store.commit(&[Op::put_json(TLS, CA_KEY, &ca.record, Precondition::Absent)?]) {
            Ok(_) => Ok(ca),
            Err(StoreError::Conflict { .. }) => match store.get(TLS, CA_KEY)? {
                Some(rec) => check(Self::open(decode(&rec)?, key)?),
                None => Err(Error::StoreUnavailable("the cluster CA vanished while being created".into())),
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

    fn generate(key: &ServerKey, now_ms: u64) -> Result<ClusterCa, Error> {
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).map_err(|e| tls_error("no randomness", e))?;
        let name = format!("mpsfleet cluster CA {}", hex(&id));
        let mut params = Self::params(&name);
        params.not_before = time_at(now_ms.saturating_sub(ms(BACKDATE)))?;
        let not_after_ms = now_ms.saturating_add(ms(CA_VALIDITY));
        params.not_after = time_at(not_after_ms)?;
        let signing = KeyPair::generate().map_err(|e| tls_error("cannot make the CA key", e))?;
        let cert =
            params.self_signed(&signing).map_err(|e| tls_error("cannot make the CA certificate", e))?;
        let record = Self::seal(key, &name, cert.pem(), &signing, false, now_ms)?;
        Ok(ClusterCa {
            name,
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key: signing,
            not_after_ms,
            record,
        })
    }

    /// The operator's CA, checked: one CA certificate, valid now and for at least
    /// [`CERT_VALIDITY`] more, allowed to sign certificates, and the private key of its public
    /// key. Each refusal names the field (`caCertPem`, `caKeyPem`) and why.
    pub fn import(given: &GivenCa, key: &ServerKey, now_ms: u64) -> Result<ClusterCa, Error> {
        let bad_cert = |why: String| Error::invalid("caCertPem", why);
        let certs = mpsfleet_client::tls::certificates(given.cert_pem.as_bytes()).map_err(bad_cert)?;
        if certs.len() != 1 {
            return Err(bad_cert(format!("must hold one certificate, the CA's, not {}", certs.len())));
        }
        let der = certs[0].clone();
        let (_, x509) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| bad_cert(format!("not an X.509 certificate: {e}")))?;
        let is_ca = x509.basic_constraints().ok().flatten().is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(bad_cert("is not a CA certificate (no basicConstraints CA:TRUE)".into()));
        }
        if let Ok(Some(ku)) = x509.key_usage() {
            if !ku.value.key_cert_sign() {
                return Err(bad_cert("may not sign certificates (its keyUsage lacks keyCertSign)".into()));
            }
        }
        let validity = x509.validity();
        let from_ms = u64::try_from(validity.not_before.timestamp()).unwrap_or(0).saturating_mul(1000);
        let not_after_ms = u64::try_from(validity.not_after.timestamp()).unwrap_or(0).saturating_mul(1000);
        if from_ms > now_ms || not_after_ms < now_ms.saturating_add(ms(CERT_VALIDITY)) {
            return Err(bad_cert(format!(
                "must be valid now and for at least {} more days (valid from {from_ms} to {not_after_ms} ms \
                 since the epoch)",
                CERT_VALIDITY.as_secs() / 86_400
            )));
        }
        let signing = KeyPair::from_pem(&given.key_pem)
            .map_err(|e| Error::invalid("caKeyPem", format!("not a PKCS#8 private key in PEM: {e}")))?;
        if signing.public_key_raw() != x509.tbs_certificate.subject_pki.subject_public_key.data.as_ref() {
            return Err(Error::invalid(
                "caKeyPem",
                "is not the private key of the CA certificate's public key",
            ));
        }
        Issuer::from_ca_cert_der(&der, &signing)
            .map_err(|e| bad_cert(format!("cannot sign under it: {e}")))?;
        let name = x509
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or("operator's CA")
            .to_string();
        let pem = pem::encode_config(
            &pem::Pem::new("CERTIFICATE", der.to_vec()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        );
        let record = Self::seal(key, &name, pem.clone(), &signing, true, now_ms)?;
        Ok(ClusterCa { name, cert_pem: pem, cert_der: der, key: signing, not_after_ms, record })
    }

    /// The record to store: the certificate, and the key encrypted under the server key.
    fn seal(
        key: &ServerKey,
        name: &str,
        cert_pem: String,
        signing: &KeyPair,
        given: bool,
        now_ms: u64,
    ) -> Result<CaRecord, Error> {
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|e| tls_error("no randomness", e))?;
        let sealed = Self::cipher(key)
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload { msg: &signing.serialize_der(), aad: KEY_PURPOSE.as_bytes() },
            )
            .map_err(|_| Error::Internal("cannot encrypt the CA key".into()))?;
        Ok(CaRecord {
            name: name.to_string(),
            cert_pem,
            nonce: hex(&nonce),
            sealed_key: hex(&sealed),
            created_at_ms: now_ms,
            given,
        })
    }

    fn open(rec: CaRecord, key: &ServerKey) -> Result<ClusterCa, Error> {
        let corrupt = |why: &str| Error::StoreCorrupt(format!("the cluster CA: {why}"));
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
        let not_after_ms = x509_parser::parse_x509_certificate(&certs[0])
            .map(|(_, c)| u64::try_from(c.validity().not_after.timestamp()).unwrap_or(0).saturating_mul(1000))
            .map_err(|e| corrupt(&e.to_string()))?;
        Ok(ClusterCa {
            name: rec.name.clone(),
            cert_pem: rec.cert_pem.clone(),
            cert_der: certs[0].clone(),
            key: signing,
            not_after_ms,
            record: rec,
        })
    }

    /// What the API shows of it.
    pub fn info(&self) -> CaInfo {
        CaInfo {
            sha256: self.hash(),
            subject: self.name.clone(),
            not_after_ms: self.not_after_ms,
            given: self.record.given,
        }
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
    pub fn issue_server(&self, names: &[String], now_ms: u64) -> Result<Issued, Error> {
        let mut params = CertificateParams::new(names.to_vec())
            .map_err(|e| Error::InvalidParameter { field: "--tls-san".into(), message: e.to_string() })?;
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
        let issuer = Issuer::from_ca_cert_der(&self.cert_der, &self.key)
            .map_err(|e| tls_error("the CA certificate", e))?;
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

/// The cluster's CAs: the one server certificates are issued under, and the next one while
/// a rotation is under way, which clients trust too (docs/security.md, "Rotating the CA").
#[derive(Clone)]
pub struct CaSet {
    pub active: Arc<ClusterCa>,
    pub next: Option<Arc<ClusterCa>>,
}

impl CaSet {
    /// The CAs in `store`; the active one is made (or `given`) when there is none
    /// ([`ClusterCa::load_or_create`]).
    pub fn load_or_create(
        store: &dyn Store,
        key: &ServerKey,
        given: Option<&GivenCa>,
        now_ms: u64,
    ) -> Result<CaSet, Error> {
        let active = Arc::new(ClusterCa::load_or_create(store, key, given, now_ms)?);
        let next = match store.get(TLS, CA_NEXT_KEY)? {
            Some(rec) => Some(Arc::new(ClusterCa::open(decode(&rec)?, key)?)),
            None => None,
        };
        Ok(CaSet { active, next })
    }

    /// The hashes of the CAs clients should trust: the active one first.
    pub fn hashes(&self) -> Vec<String> {
        std::iter::once(&self.active).chain(&self.next).map(|c| c.hash()).collect()
    }

    /// The certificates of the CAs clients should trust, PEM, the active one first: what
    /// `GET /v1/cluster/ca` serves and `ca.pem` holds.
    pub fn bundle_pem(&self) -> String {
        let mut pem = self.active.cert_pem().to_string();
        if let Some(next) = &self.next {
            if !pem.ends_with('\n') {
                pem.push('\n');
            }
            pem.push_str(next.cert_pem());
        }
        pem
    }
}

/// What a server serves: its current certificate, which [`ServerTls::rotate`] replaces for
/// every connection after it (connections already open keep theirs), under the cluster's CAs,
/// which a CA rotation changes.
pub struct ServerTls {
    cas: RwLock<CaSet>,
    names: Vec<String>,
    current: RwLock<(Arc<CertifiedKey>, ServerCertificate)>,
    /// Where the CA bundle is written for local clients (`<data dir>/ca.pem`), if anywhere.
    ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("names", &self.names).finish_non_exhaustive()
    }
}

fn certified(issued: Issued) -> Result<(Arc<CertifiedKey>, ServerCertificate), Error> {
    let key = rustls::crypto::ring::sign::any_supported_type(&PrivateKeyDer::Pkcs8(issued.key))
        .map_err(|e| tls_error("the server key", e))?;
    Ok((Arc::new(CertifiedKey::new(issued.chain, key)), issued.info))
}

/// A store commit of the CA records and the hashes of the CAs they leave trusted, with the
/// audit entry of the API call that makes it (`Cluster::write_cas`).
pub type Commit<'a> = &'a mut dyn FnMut(&[Op], Vec<String>) -> Result<(), Error>;

impl ServerTls {
    /// Serves a certificate for `names` under the active CA of `cas`, issued now; writes the
    /// CA bundle to `ca_file` whenever it changes.
    pub fn new(
        cas: CaSet,
        names: Vec<String>,
        now_ms: u64,
        ca_file: Option<std::path::PathBuf>,
    ) -> Result<Arc<ServerTls>, Error> {
        let current = certified(cas.active.issue_server(&names, now_ms)?)?;
        let tls = ServerTls { cas: RwLock::new(cas), names, current: RwLock::new(current), ca_file };
        tls.write_ca_file();
        Ok(Arc::new(tls))
    }

    /// The CA certificates are issued under now.
    pub fn ca(&self) -> Arc<ClusterCa> {
        self.cas().active
    }

    pub fn cas(&self) -> CaSet {
        self.cas.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_cas(&self, cas: CaSet) {
        *self.cas.write().unwrap_or_else(|p| p.into_inner()) = cas;
        self.write_ca_file();
    }

    fn write_ca_file(&self) {
        if let Some(path) = &self.ca_file {
            if let Err(e) = crate::files::write_public(path, &self.cas().bundle_pem()) {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the CA bundle for clients");
            }
        }
    }

    /// The certificate served now.
    pub fn certificate(&self) -> ServerCertificate {
        self.current.read().map(|c| c.1.clone()).unwrap_or_else(|p| p.into_inner().1.clone())
    }

    /// Issues a new certificate (a new key too) under the active CA and serves it from the
    /// next connection on.
    pub fn rotate(&self, now_ms: u64) -> Result<ServerCertificate, Error> {
        let next = certified(self.ca().issue_server(&self.names, now_ms)?)?;
        let info = next.1.clone();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next;
        tracing::info!(sha256 = %info.sha256, not_after_ms = info.not_after_ms, "server certificate rotated");
        Ok(info)
    }

    /// Rotates the certificate if less than [`CERT_RENEW_BEFORE`] of it is left, or if it
    /// was issued under a CA that is no longer the active one (an activation whose reissue
    /// failed).
    pub fn renew_if_due(&self, now_ms: u64) -> Result<Option<ServerCertificate>, Error> {
        let current = self.certificate();
        if current.not_after_ms.saturating_sub(now_ms) > ms(CERT_RENEW_BEFORE)
            && current.ca_hash == self.ca().hash()
        {
            return Ok(None);
        }
        self.rotate(now_ms).map(Some)
    }

    /// Stages the next CA (`given`, else a new one) for a rotation: clients trust it from now
    /// on, alongside the active one, which keeps signing. Refused while one is staged.
    pub fn begin_ca_rotation(
        &self,
        given: Option<&GivenCa>,
        key: &ServerKey,
        now_ms: u64,
        commit: Commit<'_>,
    ) -> Result<CaSet, Error> {
        let cas = self.cas();
        if let Some(next) = &cas.next {
            return Err(Error::Conflict(format!(
                "a CA rotation is under way (next CA {}): activate it (`mpsfleet cluster ca activate`) \
                 or cancel it (`mpsfleet cluster ca cancel`) first",
                next.hash()
            )));
        }
        let next = match given {
            Some(g) => ClusterCa::import(g, key, now_ms)?,
            None => ClusterCa::generate(key, now_ms)?,
        };
        if next.hash() == cas.active.hash() {
            return Err(Error::invalid("caCertPem", "is the cluster's CA already"));
        }
        let op = Op::put_json(TLS, CA_NEXT_KEY, &next.record, Precondition::Absent)?;
        let cas = CaSet { active: cas.active, next: Some(Arc::new(next)) };
        commit(&[op], cas.hashes())?;
        self.set_cas(cas.clone());
        tracing::info!(next = %cas.hashes()[1], "CA rotation begun: clients trust the next CA too");
        Ok(cas)
    }

    /// Makes the staged CA the active one: this server's certificate is issued under it at
    /// once, and the old CA is trusted no more.
    pub fn activate_ca(&self, now_ms: u64, commit: Commit<'_>) -> Result<CaSet, Error> {
        let cas = self.cas();
        let next = cas.next.clone().ok_or_else(no_rotation)?;
        let ops = [
            Op::put_json(TLS, CA_KEY, &next.record, Precondition::Any)?,
            Op::delete(TLS, CA_NEXT_KEY, Precondition::Any),
        ];
        let cas = CaSet { active: next, next: None };
        commit(&ops, cas.hashes())?;
        self.set_cas(cas.clone());
        // Committed: a certificate that cannot be issued now is issued by the next renewal
        // check, which sees it is under the old CA.
        if let Err(e) = self.rotate(now_ms) {
            tracing::error!(error = %e, "cannot issue a certificate under the new CA yet; retrying with the next renewal check");
        }
        tracing::info!(active = %cas.active.hash(), "CA rotation done: certificates are issued under the new CA");
        Ok(cas)
    }

    /// Drops the staged CA: clients trust the active one alone again.
    pub fn cancel_ca_rotation(&self, commit: Commit<'_>) -> Result<CaSet, Error> {
        let cas = self.cas();
        if cas.next.is_none() {
            return Err(no_rotation());
        }
        let cas = CaSet { active: cas.active, next: None };
        commit(&[Op::delete(TLS, CA_NEXT_KEY, Precondition::Any)], cas.hashes())?;
        self.set_cas(cas.clone());
        Ok(cas)
    }

    /// The rustls acceptor of connections: TLS 1.2 and 1.3, HTTP/1.1.
    pub fn acceptor(self: &Arc<Self>) -> Result<tokio_rustls::TlsAcceptor, Error> {
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

fn no_rotation() -> Error {
    Error::Conflict("no CA rotation is under way: begin one with `mpsfleet cluster ca rotate`".into())
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
    if let Some(host) = mpsfleet_proc::hostname() {
        if valid_dns_name(&host) && host != "localhost" {
            names.push(host);
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
        let first = ClusterCa::load_or_create(&store, &key, None, 1_700_000_000_000).unwrap();
        let again = ClusterCa::load_or_create(&store, &key, None, 1_700_000_100_000).unwrap();
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
        let err = ClusterCa::load_or_create(&store, &other, None, 1_700_000_200_000).err().expect("refused");
        assert!(err.to_string().contains("server.key"), "{err}");
    }

    #[test]
    fn server_certificates_chain_to_the_ca_and_rotation_changes_them() {
        let store = mpsfleet_store::MemoryStore::new();
        let key = ServerKey::random().unwrap();
        let cas = CaSet::load_or_create(&store, &key, None, 1_700_000_000_000).unwrap();
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let tls = ServerTls::new(cas, names.clone(), 1_700_000_000_000, None).unwrap();
        let first = tls.certificate();
        assert_eq!(first.names, names);
        assert_eq!(first.ca_hash, tls.ca().hash());
        assert_eq!(first.not_after_ms, 1_700_000_000_000 + ms(CERT_VALIDITY));
        // Verified by webpki against the CA alone, for the names it was made for.
        let ca_pem = tls.ca().cert_pem().to_string();
        let verify = |at_ms: u64| verifies_against(&tls, &ca_pem, at_ms);
        assert!(verify(1_700_000_000_000), "chains to the CA");
        assert!(!verify(1_700_000_000_000 + ms(CERT_VALIDITY) + 1000), "expired");
        assert_eq!(tls.renew_if_due(1_700_000_000_000).unwrap(), None, "fresh: not renewed");
        let due = 1_700_000_000_000 + ms(CERT_VALIDITY - CERT_RENEW_BEFORE) + 1;
        let renewed = tls.renew_if_due(due).unwrap().expect("renewed");
        assert_ne!(renewed.sha256, first.sha256);
        assert_eq!(tls.certificate(), renewed);
        assert!(verify(due), "the renewed one chains to the CA too");
    }

    /// Whether the certificate `tls` serves verifies for `localhost` against `roots` alone.
    fn verifies_against(tls: &ServerTls, roots_pem: &str, at_ms: u64) -> bool {
        use rustls::client::danger::ServerCertVerifier as _;
        let current = tls.current.read().unwrap().0.clone();
        let mut roots = rustls::RootCertStore::empty();
        for der in mpsfleet_client::tls::certificates(roots_pem.as_bytes()).unwrap() {
            roots.add(der).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let now = rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_millis(at_ms));
        verifier.verify_server_cert(&current.cert[0], &current.cert[1..], &name, &[], now).is_ok()
    }

    /// An operator's CA as another tool makes one: a country, an organization, a P-384 key.
    fn operator_ca(now_ms: u64, days: u64, is_ca: bool) -> GivenCa {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CountryName, rcgen::DnValue::PrintableString("DE".try_into().unwrap()));
        dn.push(DnType::OrganizationName, "Example GPU Ops");
        dn.push(DnType::CommonName, "Example Fleet Root");
        params.distinguished_name = dn;
        params.is_ca = if is_ca { IsCa::Ca(BasicConstraints::Unconstrained) } else { IsCa::NoCa };
        params.not_before = time_at(now_ms - 1000).unwrap();
        params.not_after = time_at(now_ms + days * 86_400_000).unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let cert = params.self_signed(&key).unwrap();
        GivenCa { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    #[test]
    fn an_operators_ca_is_checked_and_signs_certificates_that_chain_to_it() {
        let now = 1_700_000_000_000;
        let store = mpsfleet_store::MemoryStore::new();
        let key = ServerKey::random().unwrap();
        let given = operator_ca(now, 365, true);
        let cas = CaSet::load_or_create(&store, &key, Some(&given), now).unwrap();
        assert!(cas.active.info().given);
        assert_eq!(cas.active.info().subject, "Example Fleet Root");
        assert_eq!(cas.active.hash(), mpsfleet_client::tls::ca_hash(given.cert_pem.as_bytes()).unwrap());
        let tls = ServerTls::new(cas, vec!["localhost".into()], now, None).unwrap();
        assert!(verifies_against(&tls, &given.cert_pem, now), "the issuer name must match the CA's subject");
        // Read back from the store by a later start, with or without --ca-cert; another one is
        // refused (replacing the CA is a rotation).
        assert_eq!(CaSet::load_or_create(&store, &key, None, now).unwrap().active.hash(), tls.ca().hash());
        assert!(CaSet::load_or_create(&store, &key, Some(&given), now).is_ok());
        let other = operator_ca(now, 365, true);
        let e = CaSet::load_or_create(&store, &key, Some(&other), now).err().expect("refused");
        assert!(e.to_string().contains("rotate"), "{e}");

        // What is refused, and the field named.
        let field = |e: Error| match e {
            Error::InvalidParameter { field, message } => format!("{field}: {message}"),
            other => panic!("{other}"),
        };
        let not_ca = operator_ca(now, 365, false);
        assert!(
            field(ClusterCa::import(&not_ca, &key, now).err().unwrap()).starts_with("caCertPem: is not a CA")
        );
        let short = operator_ca(now, 10, true);
        assert!(field(ClusterCa::import(&short, &key, now).err().unwrap())
            .starts_with("caCertPem: must be valid"));
        let mismatched = GivenCa { cert_pem: given.cert_pem.clone(), key_pem: other.key_pem.clone() };
        assert!(
            field(ClusterCa::import(&mismatched, &key, now).err().unwrap()).starts_with("caKeyPem: is not")
        );
        let garbage = GivenCa { cert_pem: given.cert_pem.clone(), key_pem: "nope".into() };
        assert!(field(ClusterCa::import(&garbage, &key, now).err().unwrap()).starts_with("caKeyPem"));
        let two = GivenCa {
            cert_pem: format!("{}{}", given.cert_pem, other.cert_pem),
            key_pem: given.key_pem.clone(),
        };
        assert!(field(ClusterCa::import(&two, &key, now).err().unwrap()).contains("one certificate"));
    }

    #[test]
    fn a_ca_rotation_is_trusted_first_and_signs_once_activated() {
        let now = 1_700_000_000_000;
        let store = mpsfleet_store::MemoryStore::new();
        let key = ServerKey::random().unwrap();
        let tls = ServerTls::new(
            CaSet::load_or_create(&store, &key, None, now).unwrap(),
            vec!["localhost".into()],
            now,
            None,
        )
        .unwrap();
        let old_pem = tls.ca().cert_pem().to_string();
        let mut commit = |ops: &[Op], _cas: Vec<String>| store.commit(ops).map(|_| ()).map_err(Error::from);
        assert!(tls.activate_ca(now, &mut commit).is_err(), "nothing staged");
        let staged = tls.begin_ca_rotation(None, &key, now, &mut commit).unwrap();
        let next_hash = staged.next.as_ref().unwrap().hash();
        assert_eq!(staged.hashes(), vec![tls.ca().hash(), next_hash.clone()]);
        assert!(tls.begin_ca_rotation(None, &key, now, &mut commit).is_err(), "one rotation at a time");
        // Staged: both are trusted, the old one still signs, a restart reads both back.
        assert_eq!(mpsfleet_client::tls::ca_hashes(staged.bundle_pem().as_bytes()).unwrap(), staged.hashes());
        assert!(verifies_against(&tls, &old_pem, now));
        assert_eq!(CaSet::load_or_create(&store, &key, None, now).unwrap().hashes(), staged.hashes());
        let done = tls.activate_ca(now, &mut commit).unwrap();
        assert_eq!(done.hashes(), vec![next_hash.clone()]);
        assert_eq!(tls.certificate().ca_hash, next_hash);
        assert!(!verifies_against(&tls, &old_pem, now), "issued under the new CA");
        assert!(verifies_against(&tls, &done.bundle_pem(), now));
        assert_eq!(CaSet::load_or_create(&store, &key, None, now).unwrap().hashes(), vec![next_hash]);
        // Cancelled: the staged one is dropped.
        tls.begin_ca_rotation(None, &key, now, &mut commit).unwrap();
        assert_eq!(tls.cancel_ca_rotation(&mut commit).unwrap().hashes(), done.hashes());
        assert_eq!(CaSet::load_or_create(&store, &key, None, now).unwrap().hashes(), done.hashes());
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
