//! Datagram endpoints through the facade: `ud://` unicast and `mcast://`
//! groups over UDP on loopback.

use std::time::{Duration, Instant};

fn send(sock: &zerocast::datagram::UdpSocket, to: std::net::SocketAddr, bytes: &[u8]) {
    let mut buf = sock.alloc(bytes.len(), None).expect("alloc");
    buf.copy_from_slice(bytes);
    sock.send_to(buf, &to).map_err(|(_, e)| e).expect("send");
}

#[test]
fn unicast_roundtrip() {
    let a = zerocast::datagram::bind("ud://127.0.0.1:0").expect("bind a");
    let b = zerocast::datagram::bind("ud://127.0.0.1:0").expect("bind b");
    send(&a, b.local_addr(), b"over udp");
    let deadline = Some(Instant::now() + Duration::from_secs(5));
    let (msg, from) = b.recv_from(deadline).expect("recv");
    assert_eq!((&*msg, from), (&b"over udp"[..], a.local_addr()));
}

#[test]
fn multicast_group_members_all_receive() {
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let uri = format!("mcast://239.77.1.{}:{port}?iface=127.0.0.1", std::process::id() % 200 + 1);
    let m1 = zerocast::datagram::bind(&uri).expect("member 1");
    let m2 = zerocast::datagram::bind(&uri).expect("member 2");
    let group: std::net::SocketAddr =
        zerocast::Endpoint::parse(&uri).expect("uri").authority().parse().expect("addr");
    send(&m1, group, b"to the group");
    for m in [&m1, &m2] {
        let (msg, _) = m.recv_from(Some(Instant::now() + Duration::from_secs(5))).expect("member receives");
        assert_eq!(&*msg, b"to the group");
    }
}

#[test]
fn connection_schemes_are_refused() {
    assert!(zerocast::datagram::bind("tcp://127.0.0.1:0").is_err());
    assert!(zerocast::connect("ud://127.0.0.1:9").is_err());
}
