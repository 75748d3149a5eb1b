//! Network partitions between processes on 127.0.0.1, as the kernel makes them: packets
//! dropped, not refused.
//!
//! Each path the test may cut (a server to an etcd member, clients to a server) goes through a
//! [`Relay`] of its own, a plain TCP forwarder on a port of its own. Cutting the relay adds
//! that port to a set of an nftables table this test process creates (`inet
//! mpsfleet_partition_<pid>_<n>`), whose input-hook rules DROP every TCP segment to or from a port
//! in the set: a connection attempt gets no SYN-ACK, an open connection's segments vanish and
//! are retransmitted, as across a real partition. Healed, the port leaves the set and the
//! retransmissions get through; whoever gave up meanwhile (a timeout) has reset or closed its
//! end. The table holds only this process's relay ports and is deleted when the process's
//! [`Firewall`] is dropped; a table left by a test process that died is deleted by the next.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};

const TABLE_PREFIX: &str = "mpsfleet_partition_";

/// This test process's nftables table: the ports cut now.
pub struct Firewall {
    table: String,
}

fn nft(args: &[&str]) -> Result<String, String> {
    let out = Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run nft ({e}): install nftables (scripts/test.sh does)"))?;
    if !out.status.success() {
        return Err(format!("nft {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Firewall {
    /// Creates this process's table (and deletes those of test processes that are gone).
    pub fn new() -> Arc<Firewall> {
        let tables = nft(&["list", "tables", "inet"]).unwrap_or_else(|e| panic!("{e}"));
        for line in tables.lines() {
            let Some(name) = line.trim().strip_prefix("table inet ") else { continue };
            let Some(pid) = name.strip_prefix(TABLE_PREFIX).and_then(|r| r.split('_').next()) else {
                continue;
            };
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = nft(&["delete", "table", "inet", name]);
            }
        }
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let table = format!("{TABLE_PREFIX}{}_{n}", std::process::id());
        let rules = format!(
            "table inet {table} {{
                set cut {{ type inet_service; }}
                chain input {{
                    type filter hook input priority -10; policy accept;
                    tcp dport @cut drop
                    tcp sport @cut drop
                }}
            }}"
        );
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("run nft: install nftables (scripts/test.sh does)");
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(rules.as_bytes()).expect("write the rules");
        assert!(child.wait().is_ok_and(|s| s.success()), "nft could not create table {table}");
        Arc::new(Firewall { table })
    }

    fn set(&self, verb: &str, port: u16) {
        let element = format!("{{ {port} }}");
        nft(&[verb, "element", "inet", &self.table, "cut", &element]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Whether the kernel now drops the port's segments (what the table says).
    pub fn is_cut(&self, port: u16) -> bool {
        let set = nft(&["list", "set", "inet", &self.table, "cut"]).unwrap_or_else(|e| panic!("{e}"));
        set.split(|c: char| !c.is_ascii_digit()).any(|w| w == port.to_string())
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", "inet", &self.table]);
    }
}

/// A forwarder from a port of its own to `target`, which the firewall can cut.
pub struct Relay {
    pub port: u16,
    firewall: Arc<Firewall>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays 127.0.0.1:`port` (a free one) to `target`.
    pub async fn start(firewall: &Arc<Firewall>, target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a relay");
        let port = listener.local_addr().expect("addr").port();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Relay { port, firewall: firewall.clone(), accept }
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.firewall.set("add", self.port);
    }

    pub fn heal(&self) {
        self.firewall.set("delete", self.port);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Cut, a relay's port answers nothing: no handshake completes and bytes on an open
    /// connection are not delivered; healed, the open connection's bytes arrive late.
    #[tokio::test]
    async fn a_cut_relay_drops_packets_and_a_healed_one_delivers_them() {
        let fw = Firewall::new();
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let relay = Relay::start(&fw, target).await;
        let addr: SocketAddr = ([127, 0, 0, 1], relay.port).into();
        let mut open = TcpStream::connect(addr).await.expect("connect while whole");
        relay.cut();
        assert!(fw.is_cut(relay.port));
        let handshake = tokio::time::timeout(Duration::from_millis(1_500), TcpStream::connect(addr)).await;
        assert!(handshake.is_err(), "a handshake completed across the partition: {handshake:?}");
        open.write_all(b"ping").await.expect("write (buffered)");
        let mut buf = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_millis(1_500), open.read_exact(&mut buf)).await;
        assert!(read.is_err(), "bytes crossed the partition");
        relay.heal();
        assert!(!fw.is_cut(relay.port));
        // TCP's retransmission (its first timeout is about 1 s, doubling) delivers them.
        tokio::time::timeout(Duration::from_secs(15), open.read_exact(&mut buf))
            .await
            .expect("delivered after the heal")
            .expect("read");
        assert_eq!(&buf, b"ping");
    }
}
