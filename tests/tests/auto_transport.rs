//! `auto://` endpoints follow `ZEROCAST_TRANSPORTS`. One test per binary
//! run, since it sets a process-wide environment variable.

use zerocast::{ConnectError, Scheme, Zerocast};

#[test]
fn transport_list_picks_the_first_usable_transport() {
    let zc = Zerocast::new();
    let ep = zerocast::Endpoint::parse("127.0.0.1:0").expect("parse");

    std::env::set_var("ZEROCAST_TRANSPORTS", "rc,tcp");
    let chosen = zc.resolve(&ep).expect("tcp is usable");
    assert_eq!(
        chosen.scheme(),
        Scheme::Tcp,
        "rc is not usable on the host (not built in, or no device), so tcp is next"
    );

    // The same application code, listening and connecting by a bare address.
    let listener = zc.listen("127.0.0.1:0").expect("listen");
    let at = listener.local_endpoint().clone();
    assert_eq!(at.scheme(), Scheme::Tcp);
    let client = std::thread::spawn(move || Zerocast::new().connect(&at.authority()).expect("connect"));
    let server = listener.accept().expect("accept");
    let client = client.join().expect("join");
    assert_eq!(client.scheme(), Scheme::Tcp);
    drop(server);

    std::env::set_var("ZEROCAST_TRANSPORTS", "rc");
    assert!(matches!(zc.resolve(&ep), Err(ConnectError::Unavailable { scheme: Scheme::Auto, .. })));

    std::env::set_var("ZEROCAST_TRANSPORTS", "rc,carrier-pigeon");
    assert!(matches!(zc.resolve(&ep), Err(ConnectError::Uri(_))));

    // An explicit scheme ignores the list.
    assert_eq!(zc.resolve(&ep.with_scheme(Scheme::Mem)).expect("explicit").scheme(), Scheme::Mem);
    std::env::remove_var("ZEROCAST_TRANSPORTS");
}
