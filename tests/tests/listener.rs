//! Listener semantics through the facade, over `tcp://` and `mem://`: the
//! accept loop of the README ends only when the listener does, a closed
//! listener refuses peers, and `mem://:0` picks a fresh name.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use zerocast::{AcceptError, ConnectError, Error, Zerocast};

/// The README's server loop: `accept()?` in a loop, one thread per
/// connection; `close` from elsewhere ends it with `Closed`.
fn accept_loop_until_closed(uri: &str) {
    let zc = Zerocast::new();
    let listener = Arc::new(zc.listen(uri).expect("listen"));
    let server = {
        let listener = listener.clone();
        thread::spawn(move || -> Result<(), Error> {
            loop {
                let conn = listener.accept()?;
                thread::spawn(move || {
                    let (tx, rx) = conn.split::<String, String>();
                    for msg in rx.iter() {
                        let _ = tx.send(msg.to_uppercase());
                    }
                });
            }
        })
    };
    let at = listener.local_endpoint().to_string();
    for i in 0..3 {
        let (tx, rx) = zc.connect(&at).expect("connect").split::<String, String>();
        tx.send(format!("hello {i}")).expect("send");
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).expect("echo"), format!("HELLO {i}"));
    }
    listener.close();
    match server.join().expect("server thread") {
        Err(Error::Accept(AcceptError::Closed)) => {}
        other => panic!("the loop ends with Closed, got {other:?}"),
    }
    assert_eq!(listener.stats().accepted, 3);
    // A peer arriving now is refused.
    match zc.connect(&at) {
        Err(ConnectError::Refused(_) | ConnectError::Io { .. }) => {}
        other => panic!("a closed listener refuses, got {other:?}"),
    }
}

#[test]
fn tcp_accept_loop_ends_on_close() {
    accept_loop_until_closed("tcp://127.0.0.1:0");
}

#[test]
fn mem_accept_loop_ends_on_close() {
    accept_loop_until_closed("mem://:0");
}

#[test]
fn mem_colon_zero_listeners_report_distinct_names() {
    let a = zerocast::listen("mem://:0").expect("listen");
    let b = zerocast::listen("mem://:0").expect("listen");
    assert_ne!(a.local_endpoint(), b.local_endpoint());
    assert!(a.local_endpoint().host().starts_with("anon-"), "{}", a.local_endpoint());
    let client = zerocast::connect(&b.local_endpoint().to_string()).expect("connect to the reported name");
    let server = b.accept_timeout(Duration::from_secs(5)).expect("accept");
    assert_eq!(server.peer().scheme(), client.peer().scheme());
    assert!(a.try_accept().expect("fine").is_none());
}
