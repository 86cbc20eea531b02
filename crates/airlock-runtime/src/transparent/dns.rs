//! The sandbox's DNS responder: UDP on the responder address, answering
//! from the carrier's address book only (never a real lookup). Each datagram is answered on
//! its own; one that does not parse as a DNS query is dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;

use super::carry::Carrier;
use super::names::NameError;

/// The answers' TTL: a name's address never changes within the run.
const TTL: u32 = 3600;
/// Largest datagram read (queries are far smaller; EDNS allows 4096).
const MAX_DATAGRAM: usize = 4096;

/// Binds `at` and answers every query until the runtime ends.
pub async fn serve(at: SocketAddr, carrier: Arc<Carrier>) -> std::io::Result<()> {
    let socket = UdpSocket::bind(at).await?;
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                continue;
            };
            let address_of = |name: &str| carrier.address_of(name);
            let Some(out) = buf.get(..n).and_then(|q| answer(q, &address_of)) else {
                continue;
            };
            let _ = socket.send_to(&out, from).await;
        }
    });
    Ok(())
}

/// The answer to the datagram `query` (a name's address from
/// `address_of`), or `None` to drop it.
pub fn answer(
    query: &[u8],
    address_of: &dyn Fn(&str) -> Result<std::net::Ipv4Addr, NameError>,
) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    if q.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut r = Message::response(q.metadata.id, q.metadata.op_code);
    r.metadata.recursion_desired = q.metadata.recursion_desired;
    r.metadata.recursion_available = true;
    let (Some(question), 1, OpCode::Query) =
        (q.queries.first(), q.queries.len(), q.metadata.op_code)
    else {
        r.metadata.response_code = ResponseCode::NotImp;
        return r.to_vec().ok();
    };
    r.add_query(question.clone());
    let name = question.name().to_ascii();
    match address_of(&name) {
        Ok(addr) if question.query_type() == RecordType::A => {
            r.add_answer(Record::from_rdata(
                question.name().clone(),
                TTL,
                RData::A(A(addr)),
            ));
        }
        // The name exists; it has no records of this type (AAAA included).
        Ok(_) => {}
        Err(NameError::NotAHostName) => r.metadata.response_code = ResponseCode::NXDomain,
        Err(NameError::Exhausted) => r.metadata.response_code = ResponseCode::Refused,
    }
    r.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transparent::names::Names;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;
    use std::str::FromStr;

    fn ask(names: &Names, name: &str, t: RecordType) -> Message {
        let mut q = Message::query();
        q.metadata.id = 7;
        q.add_query(Query::query(Name::from_str(name).unwrap(), t));
        let address_of = |n: &str| names.issue(n, 9).map(|(ip, _)| ip);
        Message::from_vec(&answer(&q.to_vec().unwrap(), &address_of).unwrap()).unwrap()
    }

    #[test]
    fn a_is_the_synthetic_address_and_aaaa_is_empty() {
        let names = Names::default();
        let a = ask(&names, "api.example.com.", RecordType::A);
        assert_eq!(a.metadata.id, 7);
        assert_eq!(a.metadata.response_code, ResponseCode::NoError);
        let (issued, _) = names.issue("api.example.com", 9).unwrap();
        assert!(matches!(a.answers[0].data, RData::A(A(ip)) if ip == issued));
        let aaaa = ask(&names, "api.example.com.", RecordType::AAAA);
        assert_eq!(aaaa.metadata.response_code, ResponseCode::NoError);
        assert!(aaaa.answers.is_empty());
        // Asked again: the same address (nothing to rebind).
        let again = ask(&names, "API.example.com.", RecordType::A);
        assert!(matches!(again.answers[0].data, RData::A(A(ip)) if ip == issued));
    }

    #[test]
    fn garbage_is_dropped_and_literals_are_nxdomain() {
        let names = Names::default();
        let address_of = |n: &str| names.issue(n, 9).map(|(ip, _)| ip);
        assert!(answer(b"\x00\x01nonsense", &address_of).is_none());
        let lit = ask(&names, "10.0.0.1.", RecordType::A);
        assert_eq!(lit.metadata.response_code, ResponseCode::NXDomain);
    }
}
