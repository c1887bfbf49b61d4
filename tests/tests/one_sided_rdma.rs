//! One-sided RDMA on RC connections, over `rc://` and `rc+oob://`: a
//! buffer exposed as a `RemoteRegion` travels in a typed message, the peer
//! RDMA-READs or RDMA-WRITEs it; a forged rkey, an access outside the
//! exposed bytes, a WRITE to a read-only exposure and any access after the
//! exposure is revoked are typed remote-access errors; a local buffer
//! longer than the region is refused before posting.
//!
//! Every test needs a verbs device: they are ignored on a plain `cargo
//! test`; `scripts/test` runs them inside the Soft-RoCE guest, serially.

#![cfg(feature = "rdma")]

use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocast::rdma::{OneSided, RcConfig, RcConnection, RcError, RemoteRegion};
use zerocast::{Config, Connection, LinkConfig, Receiver, SendError, Sender, Zerocast};
use zerocast_tests::Transport;

/// The address rxe0 is bound to in the guest.
fn addr() -> String {
    std::env::var("ZEROCAST_RDMA_ADDR").unwrap_or_else(|_| "10.0.2.15".to_owned())
}

fn transport(scheme: &str) -> Transport {
    let uri = Box::leak(format!("{scheme}://{}:0", addr()).into_boxed_str());
    // rnr_retry = 0: a WRITE with immediate consumes a receive at the peer,
    // and credits must make sure one is there.
    let cfg = Config::default()
        .with_link(LinkConfig::default().with_recv_window(16))
        .with_rc(RcConfig::default().with_rnr_retry(0));
    Transport { zc: Zerocast::with_config(cfg), listen_uri: uri }
}

/// Every registered RC buffer is back in its pool.
fn assert_rc_pool_drained(t: &Transport) {
    zerocast_tests::assert_pool_drained(t.zc.rc().expect("rc transport").pool(), Duration::from_secs(10));
}

/// What the two sides tell each other.
#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Region(RemoteRegion),
    Done,
}

const TIMEOUT: Duration = Duration::from_secs(10);
const LEN: usize = 64 * 1024;

fn pattern(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8
}

fn rc(c: &Connection) -> &RcConnection {
    c.as_rc().expect("an RC connection")
}

/// One side of a pair: the connection and its typed halves (dropping a
/// typed half closes that direction, so they live as long as the side).
struct Side {
    conn: Connection,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
}

impl Side {
    fn new(conn: Connection) -> Self {
        let (tx, rx) = conn.clone().split::<Msg, Msg>();
        Self { conn, tx, rx }
    }
}

/// A connected pair: (client, server).
fn sides(t: &Transport) -> (Side, Side) {
    let (client, server) = t.pair();
    (Side::new(client), Side::new(server))
}

/// Send a typed message from `s`.
fn tell(s: &Side, m: Msg) {
    s.tx.send(m).expect("typed send");
}

/// Receive a typed message on `s`.
fn hear(s: &Side) -> Msg {
    s.rx.recv_timeout(TIMEOUT).expect("typed receive")
}

/// The server exposes a patterned buffer; the client reads it.
fn read_exposed(t: &Transport) {
    let (client, server) = sides(t);
    let mut exposed = server.conn.alloc(LEN).expect("alloc");
    for (i, b) in exposed.iter_mut().enumerate() {
        *b = pattern(i, 7);
    }
    let exposure = rc(&server.conn).expose(&exposed).expect("expose");
    assert!(!exposure.is_writable());
    tell(&server, Msg::Region(exposure.region()));
    let Msg::Region(region) = hear(&client) else { panic!("expected a region") };
    assert_eq!(region.len, LEN as u64);
    let local = client.conn.alloc(LEN).expect("alloc");
    let start = Instant::now();
    let local = rc(&client.conn).read(local, region).map_err(|e| e.into_parts().1).expect("RDMA READ");
    println!("READ of {LEN} bytes took {:?}", start.elapsed());
    assert!(local.iter().enumerate().all(|(i, &b)| b == pattern(i, 7)), "READ bytes differ");
    tell(&client, Msg::Done);
    assert!(matches!(hear(&server), Msg::Done));
    drop(exposure);
    drop((local, exposed, client, server));
}

/// The client writes a pattern into the server's exposed buffer, then says
/// so in a typed message.
fn write_exposed(t: &Transport) {
    let (client, server) = sides(t);
    let mut exposed = server.conn.alloc(LEN).expect("alloc");
    exposed.fill(0);
    let exposure = rc(&server.conn).expose_writable(&mut exposed).expect("expose");
    assert!(exposure.is_writable());
    tell(&server, Msg::Region(exposure.region()));
    let Msg::Region(region) = hear(&client) else { panic!("expected a region") };
    let mut local = client.conn.alloc(LEN).expect("alloc");
    for (i, b) in local.iter_mut().enumerate() {
        *b = pattern(i, 42);
    }
    let local = rc(&client.conn).write(local, region).map_err(|e| e.into_parts().1).expect("RDMA WRITE");
    tell(&client, Msg::Done);
    assert!(matches!(hear(&server), Msg::Done));
    let mut seen = vec![0u8; LEN];
    exposure.read_into(0, &mut seen).expect("inside the exposure");
    assert!(matches!(exposure.read_into(1, &mut seen), Err(RcError::OutOfRange { .. })));
    assert!(seen.iter().enumerate().all(|(i, &b)| b == pattern(i, 42)), "WRITE bytes differ");
    // Half the region, at an offset: the region arithmetic is the caller's.
    let half = RemoteRegion { addr: region.addr + 1000, len: region.len - 1000, rkey: region.rkey };
    let mut small = client.conn.alloc(1000).expect("alloc");
    small.fill(0xee);
    let small =
        rc(&client.conn).write(small, half).map_err(|e| e.into_parts().1).expect("RDMA WRITE at an offset");
    tell(&client, Msg::Done);
    assert!(matches!(hear(&server), Msg::Done));
    exposure.revoke();
    assert!(exposed[1000..2000].iter().all(|&b| b == 0xee));
    assert_eq!(exposed[999], pattern(999, 42));
    assert_eq!(exposed[2000], pattern(2000, 42));
    drop((local, small, exposed, client, server));
}

/// WRITEs with immediate, each followed by a plain message, many more than
/// the credit window: the server sees, in order, each write's notification
/// (its bytes already in place) and then the message. A write longer than
/// the region is refused with the buffer handed back.
fn write_with_immediate(t: &Transport) {
    const CHUNK: usize = 256;
    const N: usize = LEN / CHUNK;
    let (client, server) = sides(t);
    let mut exposed = server.conn.alloc(LEN).expect("alloc");
    exposed.fill(0);
    let exposure = rc(&server.conn).expose_writable(&mut exposed).expect("expose");
    tell(&server, Msg::Region(exposure.region()));
    let Msg::Region(region) = hear(&client) else { panic!("expected a region") };
    let conn = client.conn.clone();
    let writer = thread::spawn(move || {
        for k in 0..N {
            let mut local = conn.alloc(CHUNK).expect("alloc");
            for (i, b) in local.iter_mut().enumerate() {
                *b = pattern(i, k as u8);
            }
            let at = RemoteRegion { addr: region.addr + (k * CHUNK) as u64, len: CHUNK as u64, ..region };
            rc(&conn).write_with_imm(local, at, 0xA000_0000 | k as u32, None).expect("write with immediate");
            let mut msg = conn.alloc(8).expect("alloc");
            msg.copy_from_slice(&(k as u64).to_le_bytes());
            conn.send(msg).expect("send");
        }
    });
    for k in 0..N {
        let note = server.conn.recv_timeout(TIMEOUT).expect("write notification");
        assert_eq!((note.immediate(), note.len()), (Some(0xA000_0000 | k as u32), 0), "notification {k}");
        let mut chunk = [0u8; CHUNK];
        exposure.read_into(k * CHUNK, &mut chunk).expect("inside the exposure");
        assert!(chunk.iter().enumerate().all(|(i, &b)| b == pattern(i, k as u8)), "chunk {k} not in place");
        drop(note);
        let msg = server.conn.recv_timeout(TIMEOUT).expect("message");
        assert_eq!((msg.immediate(), &msg[..]), (None, &(k as u64).to_le_bytes()[..]), "message {k}");
        if k % 32 == 0 {
            // A slow reader: the writer runs out of credit and waits.
            thread::sleep(Duration::from_millis(20));
        }
    }
    writer.join().expect("writer");
    let mut long = client.conn.alloc(CHUNK + 1).expect("alloc");
    long.fill(1);
    let at = RemoteRegion { len: CHUNK as u64, ..region };
    match rc(&client.conn).write_with_imm(long, at, 1, None) {
        Err(SendError::Rejected(back, e)) => {
            assert_eq!(back.len(), CHUNK + 1);
            assert!(format!("{e:?}").contains("RemoteTooShort"), "{e:?}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    tell(&client, Msg::Done);
    assert!(matches!(hear(&server), Msg::Done));
    drop(exposure);
    drop((exposed, client, server));
}

/// More one-sided requests at once than the connection has slots: they
/// wait for a slot, none is lost.
fn many_concurrent_reads(t: &Transport) {
    let (client, server) = sides(t);
    let mut exposed = server.conn.alloc(4096).expect("alloc");
    for (i, b) in exposed.iter_mut().enumerate() {
        *b = pattern(i, 3);
    }
    let exposure = rc(&server.conn).expose(&exposed).expect("expose");
    let region = exposure.region();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let c = client.conn.clone();
            thread::spawn(move || {
                for _ in 0..25 {
                    let local = c.alloc(4096).expect("alloc");
                    let local = rc(&c).read(local, region).map_err(|e| e.into_parts().1).expect("RDMA READ");
                    assert!(local.iter().enumerate().all(|(i, &b)| b == pattern(i, 3)));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("reader thread");
    }
    drop(exposure);
    drop((exposed, client, server));
}

/// A forged rkey: the READ fails with a typed remote-access error, fast,
/// and the failed connection gives every buffer back.
fn forged_rkey(t: &Transport) {
    let (client, server) = sides(t);
    let exposed = server.conn.alloc(4096).expect("alloc");
    let exposure = rc(&server.conn).expose(&exposed).expect("expose");
    let mut region = exposure.region();
    region.rkey ^= 0x5a5a;
    let local = client.conn.alloc(4096).expect("alloc");
    let start = Instant::now();
    let (local, err) = read_fails(&client, local, region);
    let took = start.elapsed();
    println!("forged rkey: {err} after {took:?}");
    assert!(matches!(err, RcError::RemoteAccess), "not a remote access error: {err:?}");
    assert!(took < Duration::from_secs(5), "remote access error took {took:?}");
    // The QP is in the error state: later requests fail too, typed.
    let (local, err) = read_fails(&client, local, region);
    assert!(matches!(err, RcError::Closed | RcError::Flushed), "{err:?}");
    drop(exposure);
    drop((local, exposed, client, server));
    assert_rc_pool_drained(t);
}

/// A one-sided READ that must fail: the buffer back and the reason.
fn read_fails(s: &Side, local: zerocast::Buf, region: RemoteRegion) -> (zerocast::Buf, RcError) {
    let e = rc(&s.conn).read(local, region).expect_err("the READ must fail");
    let (buf, err) = e.into_parts();
    (buf.expect("a failed READ hands the buffer back"), err)
}

/// What an exposure does not allow fails with a remote access error, and
/// fails the connection that tried: a READ just past the exposed bytes (in
/// the same pool region), a WRITE to a read-only exposure, and a READ with
/// the rkey of an exposure already revoked. Each attempt uses a fresh
/// connection; the exposing side's bystander connection keeps working.
fn scoped_exposure(t: &Transport) {
    #[derive(Clone, Copy, Debug)]
    enum Attempt {
        PastTheEnd,
        BeforeTheStart,
        WriteReadOnly,
        AfterRevoke,
    }
    for attempt in
        [Attempt::PastTheEnd, Attempt::BeforeTheStart, Attempt::WriteReadOnly, Attempt::AfterRevoke]
    {
        let (client, server) = sides(t);
        // Two buffers of one pool region: the exposed one, and a neighbour.
        let mut neighbour = server.conn.alloc(4096).expect("alloc");
        neighbour.fill(0x11);
        let exposed = server.conn.alloc(4096).expect("alloc");
        let exposure = rc(&server.conn).expose(&exposed).expect("expose");
        let region = exposure.region();
        let local = client.conn.alloc(4096).expect("alloc");
        // The exposure itself works.
        let local = rc(&client.conn).read(local, region).map_err(|e| e.into_parts().1).expect("READ inside");
        let err = match attempt {
            Attempt::PastTheEnd => {
                let past = RemoteRegion { addr: region.addr + region.len, ..region };
                read_fails(&client, local, past).1
            }
            Attempt::BeforeTheStart => {
                let before = RemoteRegion { addr: region.addr - 4096, ..region };
                read_fails(&client, local, before).1
            }
            Attempt::WriteReadOnly => {
                let e = rc(&client.conn).write(local, region).expect_err("WRITE to a read-only exposure");
                e.into_parts().1
            }
            Attempt::AfterRevoke => {
                exposure.revoke();
                tell(&server, Msg::Done);
                assert!(matches!(hear(&client), Msg::Done));
                let (_, err) = read_fails(&client, local, region);
                err
            }
        };
        println!("{attempt:?}: {err}");
        assert!(matches!(err, RcError::RemoteAccess), "{attempt:?}: not a remote access error: {err:?}");
        assert!(neighbour.iter().all(|&b| b == 0x11), "{attempt:?}: the neighbour buffer changed");
        drop((neighbour, exposed, client, server));
    }
}

/// A local buffer longer than the remote region is refused before posting,
/// and the connection still works.
fn local_longer_than_remote(t: &Transport) {
    let (client, server) = sides(t);
    let exposed = server.conn.alloc(64).expect("alloc");
    let exposure = rc(&server.conn).expose(&exposed).expect("expose");
    let region = exposure.region();
    let local = client.conn.alloc(128).expect("alloc");
    let (local, err) = read_fails(&client, local, region);
    assert!(matches!(err, RcError::RemoteTooShort { local: 128, remote: 64 }), "{err:?}");
    let (local, err) =
        rc(&client.conn).write(local, region).expect_err("too long for the region").into_parts();
    let local = local.expect("the buffer comes back");
    assert!(matches!(err, RcError::RemoteTooShort { .. }), "{err:?}");
    assert_eq!(local.len(), 128, "the buffer comes back as it was");
    tell(&client, Msg::Done);
    assert!(matches!(hear(&server), Msg::Done), "the connection still works");
    drop(exposure);
    drop((local, exposed, client, server));
}

macro_rules! one_sided {
    ($name:ident, $scheme:expr) => {
        mod $name {
            use super::*;

            fn run(f: impl FnOnce(&Transport)) {
                let t = transport($scheme);
                f(&t);
                assert_rc_pool_drained(&t);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn read_exposed_region() {
                run(read_exposed);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn write_exposed_region() {
                run(write_exposed);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn write_with_immediate_in_order_under_credits() {
                run(write_with_immediate);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn more_reads_than_slots() {
                run(many_concurrent_reads);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn forged_rkey_is_remote_access_error() {
                run(forged_rkey);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn exposure_is_scoped_and_revocable() {
                run(scoped_exposure);
            }

            #[test]
            #[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
            fn local_longer_than_remote_is_refused() {
                run(local_longer_than_remote);
            }
        }
    };
}

one_sided!(rc, "rc");
one_sided!(rc_oob, "rc+oob");
