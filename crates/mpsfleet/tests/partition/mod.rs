//! A TCP relay that a test can cut: a network partition between two processes on 127.0.0.1.
//!
//! While the relay is whole, bytes pass both ways. Cut, nothing passes: it stops reading, so
//! what either side sends waits in the sockets' buffers, and a connection made meanwhile is
//! held without being passed on, as packets across a partition go unanswered. Healed, the
//! waiting bytes and connections go through, late, as TCP's retransmissions deliver them after
//! a partition; whoever gave up meanwhile (a timeout) has closed its end, and that close passes
//! too.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Relay {
    pub port: u16,
    cut: Arc<AtomicBool>,
    accept: tokio::task::JoinHandle<()>,
}

/// How often a stalled direction looks whether the relay was healed.
const STALL_POLL: Duration = Duration::from_millis(20);

impl Relay {
    /// Relays 127.0.0.1:`port` (a free one) to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a relay");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let c = cut.clone();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let cut = c.clone();
                tokio::spawn(async move {
                    healed(&cut).await;
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let (mut ir, mut iw) = inbound.into_split();
                    let (mut or, mut ow) = outbound.into_split();
                    let up = pump(&mut ir, &mut ow, &cut);
                    let down = pump(&mut or, &mut iw, &cut);
                    tokio::join!(up, down);
                });
            }
        });
        Relay { port, cut, accept }
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn healed(cut: &AtomicBool) {
    while cut.load(Ordering::SeqCst) {
        tokio::time::sleep(STALL_POLL).await;
    }
}

/// Copies `from` to `to`, stalling (reading nothing, writing nothing) while the relay is cut.
async fn pump<R, W>(from: &mut R, to: &mut W, cut: &AtomicBool)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 16 << 10];
    loop {
        healed(cut).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        healed(cut).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    healed(cut).await;
    let _ = to.shutdown().await;
}
