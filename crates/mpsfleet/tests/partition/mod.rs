//! A TCP relay that a test can cut: a network partition between two processes on 127.0.0.1.
//!
//! While the relay is whole, bytes pass both ways. Cut, it drops what it reads on every
//! connection it carried (each stays open and silent, as a connection across a partition
//! does, until its owner gives up on it) and holds new connections open without connecting
//! them. Healed, new connections pass again; a connection that lived through the cut never
//! carries a byte again (bytes were lost in it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Relay {
    pub port: u16,
    cut: Arc<AtomicBool>,
    /// Set at each cut; every connection open then sees it and goes silent for good.
    epoch: Arc<std::sync::atomic::AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays 127.0.0.1:`port` (a free one) to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a relay");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let epoch = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (c, e) = (cut.clone(), epoch.clone());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (cut, epoch) = (c.clone(), e.clone());
                tokio::spawn(async move {
                    if cut.load(Ordering::SeqCst) {
                        return silent(inbound).await;
                    }
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let born = epoch.load(Ordering::SeqCst);
                    let alive = move || !cut.load(Ordering::SeqCst) && epoch.load(Ordering::SeqCst) == born;
                    let (mut ir, mut iw) = inbound.into_split();
                    let (mut or, mut ow) = outbound.into_split();
                    let a = alive.clone();
                    let up = async move { pump(&mut ir, &mut ow, &a).await };
                    let down = async move { pump(&mut or, &mut iw, &alive).await };
                    tokio::join!(up, down);
                });
            }
        });
        Relay { port, cut, epoch, accept }
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
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

/// Copies `from` to `to` while `alive()`; after that, reads and drops until `from` closes.
async fn pump<R, W>(from: &mut R, to: &mut W, alive: &(impl Fn() -> bool + Sync))
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if alive() && to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if alive() {
        let _ = to.shutdown().await;
    }
}

/// A connection across the partition: read and dropped, never answered.
async fn silent(mut s: TcpStream) {
    let mut buf = vec![0u8; 16 << 10];
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}
