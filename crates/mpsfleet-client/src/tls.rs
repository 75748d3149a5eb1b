//! Whom a client trusts: its cluster's CA, pinned by hash at first contact.
//!
//! A cluster has one CA; every server's certificate chains to it. A join token carries the
//! CA's hash after its secret (`<secret>.sha256:<hex>`), as kubeadm's discovery token CA cert
//! hash does: a new agent fetches the CA from the server over an unverified connection,
//! accepts it only if its hash is the one in its token, and from then on trusts that CA and
//! nothing else ([`fetch_pinned_ca`]). The hash is SHA-256 over the CA certificate's DER.

use crate::ClientError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// What separates a join token's secret from the CA hash it carries.
pub const PIN_SEPARATOR: &str = ".sha256:";

/// The route that serves the cluster's CA certificate (PEM) to anyone.
pub const CA_PATH: &str = "/v1/cluster/ca";

/// The largest CA document a client reads.
const MAX_CA_BYTES: usize = 64 << 10;

/// Splits `<secret>.sha256:<hex>` into the secret and the hash (`sha256:<hex>`); a token
/// without a hash is all secret.
pub fn split_pin(token: &str) -> (&str, Option<String>) {
    match token.rsplit_once(PIN_SEPARATOR) {
        Some((secret, hex)) if !secret.is_empty() => (secret, Some(format!("sha256:{hex}"))),
        _ => (token, None),
    }
}

/// `secret` with the CA hash `hash` (`sha256:<hex>`) after it.
pub fn pinned(secret: &str, hash: &str) -> String {
    format!("{secret}{PIN_SEPARATOR}{}", hash.strip_prefix("sha256:").unwrap_or(hash))
}

/// The certificates of a PEM document, in order.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in the PEM document".into());
    }
    Ok(certs)
}

/// `sha256:<hex>` of each certificate in `pem`, in order.
pub fn ca_hashes(pem: &[u8]) -> Result<Vec<String>, String> {
    Ok(certificates(pem)?.iter().map(|c| der_hash(c)).collect())
}

/// The PEM block of the certificate in `pem` whose hash is `hash`, if there is one.
pub fn pem_block_with_hash(pem: &[u8], hash: &str) -> Option<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let text = std::str::from_utf8(pem).ok()?;
    let mut rest = text;
    while let Some(end) = rest.find(END) {
        let (block, after) = rest.split_at(end + END.len());
        let block = block.trim_start();
        if ca_hash(block.as_bytes()).is_ok_and(|h| h.eq_ignore_ascii_case(hash)) {
            return Some(format!("{block}\n"));
        }
        rest = after;
    }
    None
}

/// `sha256:<hex>` of the first certificate in `pem`.
pub fn ca_hash(pem: &[u8]) -> Result<String, String> {
    let certs = certificates(pem)?;
    Ok(der_hash(&certs[0]))
}

/// Whether `hash` is `sha256:` and 64 hex digits, as [`der_hash`] writes them.
pub fn is_sha256(hash: &str) -> bool {
    let hex = hash.strip_prefix("sha256:").unwrap_or_default();
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `sha256:<hex>` of a DER certificate.
pub fn der_hash(der: &[u8]) -> String {
    let digest = Sha256::digest(der);
    format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Whom a client trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// `https://` servers whose certificate chains to one of these CAs (PEM), and nothing else:
    /// no system roots.
    Ca(Vec<u8>),
    /// Only `http://` (a server started with `--insecure-http` on loopback): an `https://`
    /// address is refused, since nothing would verify it.
    PlainHttp,
}

impl Trust {
    /// A reqwest client builder that trusts what `self` names.
    pub(crate) fn builder(&self, base: &str) -> Result<reqwest::ClientBuilder, ClientError> {
        let bad = |message: String| ClientError::Transport { url: base.to_string(), message };
        let builder = reqwest::Client::builder().use_rustls_tls().tls_built_in_root_certs(false);
        match self {
            Trust::Ca(pem) => {
                let mut builder = builder.https_only(true);
                for der in certificates(pem).map_err(|e| bad(format!("the CA: {e}")))? {
                    let cert =
                        reqwest::Certificate::from_der(&der).map_err(|e| bad(format!("the CA: {e}")))?;
                    builder = builder.add_root_certificate(cert);
                }
                if !base.starts_with("https://") {
                    return Err(bad(
                        "the server address must be https:// (plain http:// only with a server started \
                         with --insecure-http)"
                            .into(),
                    ));
                }
                Ok(builder)
            }
            Trust::PlainHttp if base.starts_with("https://") => Err(bad(
                "an https:// server needs its cluster's CA: give --ca-file (the server writes ca.pem in \
                 its data dir) or a join token that carries the CA hash"
                    .into(),
            )),
            Trust::PlainHttp => Ok(builder),
        }
    }
}

/// Fetches the cluster CAs from the server at `base` and returns the one whose hash is
/// `expected` (`sha256:<hex>`), PEM, and no other. The connection is not verified (there is
/// nothing yet to verify it with); the hash is what makes the answer trustworthy, which is
/// why any other certificate in the answer is dropped. Every later call verifies the server's
/// certificate against this CA.
///
/// With several addresses (comma-separated, as [`crate::Client`] takes them) each is asked in
/// turn until one answers: only the leader of several servers does.
pub async fn fetch_pinned_ca(bases: &str, expected: &str) -> Result<Vec<u8>, ClientError> {
    let mut last = None;
    for base in bases.split(',').map(str::trim).filter(|b| !b.is_empty()) {
        match fetch_pinned_ca_from(base, expected).await {
            Err(e @ ClientError::Transport { .. }) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| ClientError::Transport {
        url: bases.to_owned(),
        message: "no server address".into(),
    }))
}

async fn fetch_pinned_ca_from(base: &str, expected: &str) -> Result<Vec<u8>, ClientError> {
    let base = base.trim_end_matches('/');
    let url = format!("{base}{CA_PATH}");
    let transport = |message: String| ClientError::Transport { url: url.clone(), message };
    if !base.starts_with("https://") {
        return Err(transport("a join token with a CA hash needs an https:// server address".into()));
    }
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .danger_accept_invalid_certs(true)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15))
        .build()
        .map_err(|e| transport(e.to_string()))?;
    let mut resp = http.get(&url).send().await.map_err(|e| transport(crate::chain(&e)))?;
    if !resp.status().is_success() {
        return Err(transport(format!("the server answered HTTP {} for its CA", resp.status().as_u16())));
    }
    let mut pem = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(crate::chain(&e)))? {
        pem.extend_from_slice(&chunk);
        if pem.len() > MAX_CA_BYTES {
            return Err(transport(format!("the CA document is over {MAX_CA_BYTES} bytes")));
        }
    }
    let got = ca_hashes(&pem).map_err(|e| transport(format!("the server's CA: {e}")))?;
    match pem_block_with_hash(&pem, expected) {
        Some(block) => Ok(block.into_bytes()),
        None => Err(ClientError::UntrustedServer {
            url,
            message: format!(
                "its CA has hash {}, not the {expected} the join token names: this is not the \
                 cluster the token was made for (or someone is in between); nothing was sent",
                got.join(", ")
            ),
        }),
    }
}

/// A verifier that accepts one certificate only, the one whose SHA-256 (`sha256:<hex>`) it
/// was given, whatever name it is for; the handshake's signatures are still checked against
/// that certificate's key. An agent's logs endpoint serves a certificate it made itself and
/// reports its hash in its status reports, which reach the server over the verified,
/// authenticated connection: so the server knows whom it talks to without any name in it.
#[derive(Debug)]
struct PinnedCert {
    sha256: String,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if der_hash(end_entity).eq_ignore_ascii_case(&self.sha256) {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A reqwest client builder for `https://` servers that trusts exactly the certificate whose
/// hash is `sha256` (`sha256:<hex>`), and refuses plain `http://`.
pub fn pinned_cert_builder(sha256: &str) -> Result<reqwest::ClientBuilder, String> {
    if !is_sha256(sha256) {
        return Err(format!("a certificate hash is sha256: and 64 hex digits, got {sha256:?}"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        PinnedCert { sha256: sha256.to_string(), algorithms: provider.signature_verification_algorithms };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(reqwest::Client::builder().use_preconfigured_tls(config).https_only(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_token_splits_into_its_secret_and_hash() {
        let hash = format!("sha256:{}", "ab".repeat(32));
        let token = pinned("mpsf_join_s3cret", &hash);
        assert_eq!(token, format!("mpsf_join_s3cret.sha256:{}", "ab".repeat(32)));
        assert_eq!(split_pin(&token), ("mpsf_join_s3cret", Some(hash)));
        assert_eq!(split_pin("mpsf_join_s3cret"), ("mpsf_join_s3cret", None));
        assert_eq!(split_pin(".sha256:ab"), (".sha256:ab", None), "no secret, no pin");
    }

    #[test]
    fn garbage_is_no_certificate() {
        assert!(ca_hash(b"hello").is_err());
        assert!(ca_hash(b"").is_err());
    }

    #[test]
    fn https_needs_a_ca_and_a_ca_needs_https() {
        let plain = Trust::PlainHttp.builder("https://127.0.0.1:7070").expect_err("refused");
        assert!(plain.to_string().contains("--ca-file"), "{plain}");
        assert!(Trust::PlainHttp.builder("http://127.0.0.1:7070").is_ok());
        let bad_ca = Trust::Ca(b"nope".to_vec()).builder("https://127.0.0.1:7070").expect_err("refused");
        assert!(bad_ca.to_string().contains("the CA"), "{bad_ca}");
    }
}
