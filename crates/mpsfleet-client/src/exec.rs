//! `task exec` over HTTP/1.1 upgrades: opening a session ([`Client::exec`], [`open_upgrade`])
//! and reading and writing its frames ([`read_frame`], [`write_frame`]); the frames themselves
//! are [`mpsfleet_types::exec`]'s.

use super::{api_error, chain, error_body, retry_after, seg, Client, ClientError, Result};
use mpsfleet_types::exec::{header, ExecSpec, Frame, UPGRADE};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// An open session's connection.
pub type ExecStream = reqwest::Upgraded;

/// How long a session may last at most, whatever the clients' own request timeouts: the
/// server closes it when idle or when its task stops long before.
const SESSION_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long the server has to open a session (it gives the agent 10 s of it).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

impl Client {
    /// Opens a `task exec` session on task `id` (`POST /v1/tasks/{id}/exec`, upgraded): the
    /// connection then carries frames both ways until the server sends `Exit` or `Ended`.
    pub async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<ExecStream> {
        let http = self.http.read().unwrap_or_else(|p| p.into_inner()).clone();
        let path = format!("/v1/tasks/{}/exec", seg(id));
        let start = self.current.load(std::sync::atomic::Ordering::Relaxed);
        let mut attempt = 0;
        loop {
            let at = (start + attempt) % self.bases.len();
            let url = format!("{}{}", self.bases[at], path);
            let req = http.post(&url).bearer_auth(self.token.as_deref().unwrap_or_default());
            let opened = match tokio::time::timeout(OPEN_TIMEOUT, open_upgrade(req, spec)).await {
                Ok(opened) => opened,
                Err(_) => {
                    let message = format!("no answer within {} s", OPEN_TIMEOUT.as_secs());
                    return Err(ClientError::Transport { url, message });
                }
            };
            match opened {
                Ok(s) => {
                    self.current.store(at, std::sync::atomic::Ordering::Relaxed);
                    return Ok(s);
                }
                Err(UpgradeError::Send(e)) if e.is_connect() && attempt + 1 < self.bases.len() => {
                    attempt += 1
                }
                Err(e) => return Err(e.into_client_error(&url)),
            }
        }
    }
}

/// Why an upgrade did not happen.
#[derive(Debug)]
pub enum UpgradeError {
    /// The request could not be sent.
    Send(reqwest::Error),
    /// The peer answered without switching protocols: its status and body.
    Refused { status: u16, retry_after: Duration, body: Vec<u8> },
    /// It switched protocols, but the connection could not be taken over.
    Upgrade(reqwest::Error),
    /// The spec could not be encoded.
    Encode(String),
}

impl UpgradeError {
    pub fn into_client_error(self, url: &str) -> ClientError {
        match self {
            UpgradeError::Send(e) | UpgradeError::Upgrade(e) => {
                ClientError::Transport { url: url.to_string(), message: chain(&e) }
            }
            UpgradeError::Refused { status: 429, retry_after, body } => {
                ClientError::RateLimited { body: error_body(&body), retry_after }
            }
            UpgradeError::Refused { status, body, .. } => api_error(status, &body),
            UpgradeError::Encode(message) => ClientError::Decode { url: url.to_string(), message },
        }
    }
}

impl std::fmt::Display for UpgradeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpgradeError::Send(e) | UpgradeError::Upgrade(e) => write!(f, "{}", chain(e)),
            UpgradeError::Refused { status, body, .. } => {
                write!(f, "HTTP {status}: {}", String::from_utf8_lossy(body).trim())
            }
            UpgradeError::Encode(e) => write!(f, "{e}"),
        }
    }
}

/// Sends `req` with `spec` as an upgrade to the exec protocol and returns the connection once
/// the peer has switched: what the CLI does to the server, and the server to an agent.
pub async fn open_upgrade(
    req: reqwest::RequestBuilder,
    spec: &ExecSpec,
) -> std::result::Result<ExecStream, UpgradeError> {
    let json = serde_json::to_string(spec).map_err(|e| UpgradeError::Encode(e.to_string()))?;
    let resp = req
        .query(&[("spec", json)])
        .header("connection", "upgrade")
        .header("upgrade", UPGRADE)
        .timeout(SESSION_TIMEOUT)
        .send()
        .await
        .map_err(UpgradeError::Send)?;
    if resp.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status().as_u16();
        let retry_after = retry_after(resp.headers());
        // An error answer is small; more than this is not read.
        let mut body = Vec::new();
        let mut resp = resp;
        while let Ok(Some(chunk)) = resp.chunk().await {
            body.extend_from_slice(&chunk);
            if body.len() > 64 << 10 {
                break;
            }
        }
        return Err(UpgradeError::Refused { status, retry_after, body });
    }
    resp.upgrade().await.map_err(UpgradeError::Upgrade)
}

/// The next frame from `r`; Ok(None) at a clean end of the stream (between frames).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Frame>> {
    let mut h = [0u8; 5];
    match r.read_exact(&mut h[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut h[1..]).await?;
    let (kind, len) = header(h).map_err(std::io::Error::other)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Frame::decode(kind, payload).map(Some).map_err(std::io::Error::other)
}

/// Writes `frame` to `w` and flushes it.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> std::io::Result<()> {
    w.write_all(&frame.encode()).await?;
    w.flush().await
}
