//! Asking a server's DNS (`--dns-listen`) as a load balancer would, over UDP or TCP.

use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Asks the DNS server at `addr` for `name`'s records of type `t`, over UDP or TCP.
pub async fn ask(addr: &str, name: &str, t: RecordType, tcp: bool) -> Message {
    let mut q = Message::query();
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    let bytes = q.to_vec().unwrap();
    let answer = if tcp {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        conn.write_all(&(bytes.len() as u16).to_be_bytes()).await.unwrap();
        conn.write_all(&bytes).await.unwrap();
        let mut len = [0u8; 2];
        conn.read_exact(&mut len).await.unwrap();
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        conn.read_exact(&mut buf).await.unwrap();
        buf
    } else {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.send_to(&bytes, addr).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        buf.truncate(n);
        buf
    };
    let m = Message::from_vec(&answer).expect("a DNS message");
    assert_eq!(m.metadata.id, q.metadata.id);
    m
}

/// The SRV answer's (target, port) pairs.
pub fn srv(m: &Message) -> Vec<(String, u16)> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some((s.target.to_ascii(), s.port)),
            _ => None,
        })
        .collect()
}

/// The serial of the SOA a negative answer carries (the state revision the zone was built at).
pub fn soa_serial(m: &Message) -> Option<u32> {
    m.authorities.iter().chain(&m.answers).find_map(|r| match &r.data {
        RData::SOA(s) => Some(s.serial),
        _ => None,
    })
}

/// Asks `name`'s records of type `t` over UDP, waiting a second at most: None when nothing
/// answers (no listener there for now).
pub async fn try_ask(addr: &str, name: &str, t: RecordType) -> Option<Message> {
    let mut q = Message::query();
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.ok()?;
    sock.send_to(&q.to_vec().ok()?, addr).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(1), sock.recv(&mut buf)).await.ok()?.ok()?;
    Message::from_vec(&buf[..n]).ok().filter(|m| m.metadata.id == q.metadata.id)
}
