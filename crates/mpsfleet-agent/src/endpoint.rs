//! How the agent's endpoint (task logs, [`crate::logs`]) is served: over HTTPS, with a
//! certificate the agent makes itself each time it starts, whose hash it reports to the server
//! in every status report. The server pins that hash when it calls the endpoint
//! ([`mpsfleet_client::tls::pinned_cert_builder`]), so it talks to this agent and no other
//! whatever address the agent is reached at, and the token it presents reaches nobody else.
//! The report travels over the server's verified connection with the host's credential, which
//! is what makes the hash trustworthy; no CA signs the agent's certificate.
//!
//! Plain HTTP only when the agent's server is plain `http://` itself (a server started with
//! `--insecure-http`, on loopback).

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// The longest a TLS handshake may take; a client that does not finish it is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most handshakes under way at once; a connection past it is closed at once.
const MAX_HANDSHAKES: usize = 64;
/// The most handshakes under way from one address: one client that opens connections and
/// never finishes them cannot take every slot (the server's own calls come from elsewhere).
const MAX_HANDSHAKES_PER_PEER: usize = 4;

/// The certificate and key the endpoint serves.
pub struct EndpointCert {
    /// `sha256:<hex>` of the certificate's DER: what the agent reports and the server pins.
    pub sha256: String,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl EndpointCert {
    /// A fresh key and a self-signed certificate for it (the names in it are not what the
    /// server checks: it checks the hash).
    pub fn generate() -> Result<EndpointCert, String> {
        let key = KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
        let mut params = CertificateParams::new(vec!["mpsfleet-agent".to_string()])
            .map_err(|e| format!("certificate parameters: {e}"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "mpsfleet agent");
        params.distinguished_name = dn;
        let cert = params.self_signed(&key).map_err(|e| format!("cannot make a certificate: {e}"))?;
        let der: CertificateDer<'static> = cert.der().clone();
        let sha256 = mpsfleet_client::tls::der_hash(&der);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_no_client_auth()
            .with_single_cert(vec![der], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
            .map_err(|e| format!("TLS configuration: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(EndpointCert { sha256, acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)) })
    }
}

/// Connections of `listener` once their TLS handshake is done, for `axum::serve`. Handshakes
/// run side by side (a slow one holds up no other), each within [`HANDSHAKE_TIMEOUT`]; a
/// connection is closed at once when [`MAX_HANDSHAKES`] are under way, or
/// [`MAX_HANDSHAKES_PER_PEER`] from its address.
pub struct TlsListener {
    ready: mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

/// Handshakes under way, by peer address.
#[derive(Default)]
struct InFlight(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

impl InFlight {
    /// Counts one more from `ip`, unless that is past a limit.
    fn enter(&self, ip: std::net::IpAddr) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = m.values().sum();
        let mine = m.entry(ip).or_default();
        if total >= MAX_HANDSHAKES || *mine >= MAX_HANDSHAKES_PER_PEER {
            if *mine == 0 {
                m.remove(&ip);
            }
            return false;
        }
        *mine += 1;
        true
    }

    fn leave(&self, ip: std::net::IpAddr) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&ip);
            }
        }
    }
}

impl TlsListener {
    pub fn new(listener: TcpListener, cert: &EndpointCert) -> std::io::Result<TlsListener> {
        let addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(MAX_HANDSHAKES);
        let acceptor = cert.acceptor.clone();
        let in_flight = Arc::new(InFlight::default());
        let accepting = tokio::spawn(async move {
            loop {
                let (io, peer) = match listener.accept().await {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "logs endpoint: cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if !in_flight.enter(peer.ip()) {
                    tracing::debug!(%peer, "logs endpoint: too many handshakes under way; closed");
                    continue;
                }
                let (acceptor, tx, in_flight) = (acceptor.clone(), tx.clone(), in_flight.clone());
                tokio::spawn(async move {
                    let done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await;
                    in_flight.leave(peer.ip());
                    match done {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "logs endpoint: TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "logs endpoint: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, addr, accepting })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accepting task is gone (it only ends when dropped): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_cannot_take_every_handshake_slot() {
        let f = InFlight::default();
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..MAX_HANDSHAKES_PER_PEER {
            assert!(f.enter(a));
        }
        assert!(!f.enter(a), "past its own limit");
        assert!(f.enter(b), "another address still gets in");
        f.leave(a);
        assert!(f.enter(a));
        for i in 0..MAX_HANDSHAKES as u32 {
            f.enter(std::net::IpAddr::from(i.to_be_bytes()));
        }
        assert!(!f.enter("10.0.0.3".parse().unwrap()), "past the total");
        assert!(f.0.lock().unwrap().values().sum::<usize>() <= MAX_HANDSHAKES);
    }
}
