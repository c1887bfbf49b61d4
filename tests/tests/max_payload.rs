//! `?max_payload=` in the URI raises the message limit on both ends, with
//! nothing else configured: a 100 MiB typed message travels end to end
//! over `tcp://` and `mem://` (and `rc://` in the Soft-RoCE guest), decoded
//! within the typed channel's limit, which follows `max_payload`. Without
//! the parameter the same message is refused at the sender, its error
//! naming the limit.

use std::thread;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zerocast::{ErrorKind, SendError, Zerocast};

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Big {
    id: u64,
    body: String,
}

const LEN: usize = 100 << 20;

fn big() -> Big {
    // Not all one byte: a shifted or truncated copy would differ.
    let body: String = (0..LEN).map(|i| char::from(b'a' + (i % 23) as u8)).collect();
    Big { id: 7, body }
}

/// Listen at `listen` with `query`, connect with the same query, send one
/// 100 MiB typed message and check it arrives whole.
fn carries_100_mib(zc: &Zerocast, listen: &str, query: &str) {
    let listener = zc.listen(&format!("{listen}?{query}")).expect("listen");
    // The listener's endpoint carries its query: the client asks for the
    // same limit.
    let at = listener.local_endpoint().to_string();
    assert!(at.contains(query), "{at}");
    let zc2 = zc.clone();
    let client = thread::spawn(move || zc2.connect(&at));
    let server = listener.accept_timeout(Duration::from_secs(20));
    let client = client.join().expect("connect thread").expect("connect");
    let server = server.expect("accept");
    assert!(client.max_message() >= LEN && server.max_message() >= LEN, "{}", client.max_message());
    let (tx, _r) = client.split::<Big, ()>();
    let (_s, rx) = server.split::<(), Big>();
    let msg = big();
    let sender = thread::spawn(move || tx.send(big()).map_err(|e| e.to_string()));
    let got = rx.recv_timeout(Duration::from_secs(120)).expect("the 100 MiB message");
    sender.join().expect("sender").expect("send");
    assert_eq!(got.id, msg.id);
    assert_eq!(got.body.len(), LEN);
    assert!(got == msg, "the message arrived changed");
}

#[test]
fn a_100_mib_typed_message_over_tcp() {
    carries_100_mib(&Zerocast::new(), "tcp://127.0.0.1:0", "max_payload=128M");
}

#[test]
fn a_100_mib_typed_message_over_mem() {
    carries_100_mib(&Zerocast::new(), "mem://max-payload-test", "max_payload=128M");
}

#[test]
fn without_the_parameter_the_sender_refuses_it_naming_the_limit() {
    let zc = Zerocast::new();
    let listener = zc.listen("tcp://127.0.0.1:0").expect("listen");
    let at = listener.local_endpoint().to_string();
    let zc2 = zc.clone();
    let client = thread::spawn(move || zc2.connect(&at).expect("connect"));
    let _server = listener.accept().expect("accept");
    let client = client.join().expect("connect thread");
    let (tx, _r) = client.split::<Big, ()>();
    match tx.send(big()) {
        Err(e @ SendError::Rejected(..)) => {
            assert_eq!(e.kind(), Some(ErrorKind::InvalidInput));
            let msg = format!("{e}");
            assert!(msg.contains("max_payload"), "the error should name the knob: {msg}");
        }
        other => panic!("expected Rejected, got {:?}", other.map_err(|e| e.to_string())),
    }
}

#[cfg(feature = "rdma")]
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn a_100_mib_typed_message_over_rc() {
    let addr = std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned());
    carries_100_mib(&Zerocast::new(), &format!("rc://{addr}:0"), "max_payload=128M");
}
