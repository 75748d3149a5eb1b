//! One DNS query answered from a [`Zone`], on the wire format of hickory-proto: authoritative,
//! TTL 0 (an answer is true now, not later), names compared without case.
//!
//! - a name under `mpsfleet.` that exists: its records of the asked type (SRV, A, AAAA, or
//!   all for ANY), with an SRV's targets' addresses in the additional section; none of that
//!   type: NOERROR with the zone's SOA in the authority section (a negative answer);
//! - a name under `mpsfleet.` that does not exist: NXDOMAIN with the SOA;
//! - a name elsewhere: REFUSED (this server answers for its zone only);
//! - not a standard query: NOTIMP; unreadable, or not one question: FORMERR.
//!
//! Over UDP an answer longer than the client accepts (512 bytes, or its EDNS payload size) is
//! sent truncated (TC), and the client asks again over TCP.

use super::zone::{Data, Zone, ORIGIN};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::net::IpAddr;

/// The most an answer over UDP is, whatever the client says it accepts.
const UDP_MAX: usize = 4096;
/// The EDNS payload size this server says it accepts.
const EDNS_PAYLOAD: u16 = 1232;

/// The answer to `request` (its bytes), or None when it is not even a DNS header. `udp`: the
/// answer must fit the client's UDP payload size, or be truncated.
pub fn answer(zone: &Zone, request: &[u8], udp: bool) -> Option<Vec<u8>> {
    let msg = match Message::from_vec(request) {
        Ok(m) => m,
        Err(_) => {
            let id = u16::from_be_bytes([*request.first()?, *request.get(1)?]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr).to_vec().ok();
        }
    };
    let mut out = respond(zone, &msg);
    let limit = match (&msg.edns, udp) {
        (_, false) => usize::from(u16::MAX),
        (Some(e), true) => usize::from(e.max_payload()).clamp(512, UDP_MAX),
        (None, true) => 512,
    };
    let bytes = out.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    out = out.truncate();
    out.to_vec().ok()
}

/// SERVFAIL to `request`: this server cannot answer now (a follower whose copy of the leader's
/// zone is out of date); the client asks another nameserver. None when it is not a header.
pub fn unavailable(request: &[u8]) -> Option<Vec<u8>> {
    let id = u16::from_be_bytes([*request.first()?, *request.get(1)?]);
    let mut out = Message::error_msg(id, OpCode::Query, ResponseCode::ServFail);
    if let Ok(msg) = Message::from_vec(request) {
        out.queries = msg.queries;
    }
    out.to_vec().ok()
}

fn respond(zone: &Zone, msg: &Message) -> Message {
    let id = msg.metadata.id;
    if msg.metadata.message_type != MessageType::Query || msg.metadata.op_code != OpCode::Query {
        return Message::error_msg(id, msg.metadata.op_code, ResponseCode::NotImp);
    }
    let [query] = msg.queries.as_slice() else {
        return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr);
    };
    let mut out = Message::response(id, OpCode::Query);
    out.metadata.recursion_desired = msg.metadata.recursion_desired;
    out.add_query(query.clone());
    if msg.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        out.set_edns(edns);
    }
    let name = query.name().to_lowercase().to_ascii();
    let name = if name.ends_with('.') { name } else { format!("{name}.") };
    if name != ORIGIN && !name.ends_with(&format!(".{ORIGIN}")) {
        out.metadata.response_code = ResponseCode::Refused;
        return out;
    }
    out.metadata.authoritative = true;
    let Some(records) = zone.lookup(&name) else {
        out.metadata.response_code = ResponseCode::NXDomain;
        out.add_authority(soa(zone));
        return out;
    };
    let wanted = |d: &Data| match (d, query.query_type()) {
        (_, RecordType::ANY) => true,
        (Data::Srv { .. }, t) => t == RecordType::SRV,
        (Data::Addr(IpAddr::V4(_)), t) => t == RecordType::A,
        (Data::Addr(IpAddr::V6(_)), t) => t == RecordType::AAAA,
    };
    for d in records.iter().filter(|d| wanted(d)) {
        if let Some(r) = record(query, d) {
            out.add_answer(r);
        }
        // The target's address, so that a load balancer needs no second query.
        if let Data::Srv { target, .. } = d {
            let addrs = zone.lookup(target).unwrap_or_default();
            for a in addrs {
                if let (Ok(n), Some(rdata)) = (Name::from_ascii(target), rdata(a)) {
                    out.add_additional(Record::from_rdata(n, 0, rdata));
                }
            }
        }
    }
    if out.answers.is_empty() {
        out.add_authority(soa(zone));
    }
    out
}

/// A record of `data` owned by the name as asked (its case kept).
fn record(query: &Query, data: &Data) -> Option<Record> {
    Some(Record::from_rdata(query.name().clone(), 0, rdata(data)?))
}

fn rdata(data: &Data) -> Option<RData> {
    Some(match data {
        Data::Srv { weight, port, target } => {
            RData::SRV(SRV::new(0, *weight, *port, Name::from_ascii(target).ok()?))
        }
        Data::Addr(IpAddr::V4(ip)) => RData::A(A(*ip)),
        Data::Addr(IpAddr::V6(ip)) => RData::AAAA(AAAA(*ip)),
    })
}

/// The zone's SOA, for negative answers: its minimum (how long a negative answer may be
/// kept) is 0, as every TTL here.
fn soa(zone: &Zone) -> Record {
    let origin = Name::from_ascii(ORIGIN).unwrap_or_else(|_| Name::root());
    let mname = Name::from_ascii(format!("ns.{ORIGIN}")).unwrap_or_else(|_| origin.clone());
    let rname = Name::from_ascii(format!("hostmaster.{ORIGIN}")).unwrap_or_else(|_| origin.clone());
    Record::from_rdata(origin, 0, RData::SOA(SOA::new(mname, rname, zone.serial, 1, 1, 1, 0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::DNSClass;
    use mpsfleet_types::discovery::{DiscoveredPort, DiscoveredReplica, DiscoveredService, Traffic};
    use mpsfleet_types::TaskId;

    fn zone(replicas: usize) -> Zone {
        let replicas = (0..replicas)
            .map(|k| DiscoveredReplica {
                task: TaskId(k as u64),
                address: format!("10.0.{}.{}", k / 250, k % 250 + 1).parse().unwrap(),
                traffic: Traffic::In,
                ports: vec![DiscoveredPort {
                    name: Some("http".into()),
                    container_port: 80,
                    port: 30_000 + k as u16,
                }],
            })
            .collect();
        Zone::build(&[DiscoveredService { pool: "default".into(), service: "web".into(), replicas }], 3)
    }

    fn ask(zone: &Zone, name: &str, t: RecordType, edns: bool, udp: bool) -> Message {
        let mut q = Message::query();
        let mut query = Query::query(Name::from_ascii(name).unwrap(), t);
        query.set_query_class(DNSClass::IN);
        q.add_query(query);
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(4096);
            q.set_edns(e);
        }
        Message::from_vec(&answer(zone, &q.to_vec().unwrap(), udp).unwrap()).unwrap()
    }

    #[test]
    fn srv_answers_with_its_targets_addresses_and_ttl_0() {
        let z = zone(3);
        let m = ask(&z, "_HTTP._tcp.Web.default.mpsfleet.", RecordType::SRV, false, true);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers.len(), 3);
        assert_eq!(m.additionals.len(), 3);
        assert!(m.answers.iter().chain(&m.additionals).all(|r| r.ttl == 0));
        assert_eq!(m.answers[0].name.to_ascii(), "_HTTP._tcp.Web.default.mpsfleet.", "the name as asked");
        let RData::SRV(srv) = &m.answers[0].data else { panic!("{m:?}") };
        assert_eq!((srv.port, srv.weight), (30_000, 1));
        let a = ask(&z, &srv.target.to_ascii(), RecordType::A, false, true);
        assert_eq!(a.answers.len(), 1);
    }

    #[test]
    fn negative_answers_carry_the_soa_and_other_zones_are_refused() {
        let z = zone(1);
        let m = ask(&z, "nothere.default.mpsfleet.", RecordType::A, false, true);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert!(matches!(m.authorities[0].data, RData::SOA(_)), "{m:?}");
        let m = ask(&z, "default.mpsfleet.", RecordType::A, false, true);
        assert_eq!((m.metadata.response_code, m.answers.len()), (ResponseCode::NoError, 0));
        assert_eq!(m.authorities.len(), 1);
        let m = ask(&z, "web.default.mpsfleet.", RecordType::AAAA, false, true);
        assert_eq!(
            (m.metadata.response_code, m.answers.len(), m.authorities.len()),
            (ResponseCode::NoError, 0, 1)
        );
        let m = ask(&z, "example.com.", RecordType::A, false, true);
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert_eq!(answer(&z, &[0x12], true), None);
        let m = Message::from_vec(&answer(&z, &[0x12, 0x34, 0xff], true).unwrap()).unwrap();
        assert_eq!((m.metadata.id, m.metadata.response_code), (0x1234, ResponseCode::FormErr));
    }

    #[test]
    fn a_long_answer_is_truncated_over_udp_and_whole_over_tcp() {
        let z = zone(20);
        let m = ask(&z, "_http._tcp.web.default.mpsfleet.", RecordType::SRV, false, true);
        assert!(m.metadata.truncation && m.answers.is_empty(), "{}", m.answers.len());
        let m = ask(&z, "_http._tcp.web.default.mpsfleet.", RecordType::SRV, true, true);
        assert!(!m.metadata.truncation, "fits the EDNS payload");
        assert_eq!(m.answers.len(), 20);
        let m = ask(&z, "_http._tcp.web.default.mpsfleet.", RecordType::SRV, false, false);
        assert_eq!((m.metadata.truncation, m.answers.len()), (false, 20));
    }
}
