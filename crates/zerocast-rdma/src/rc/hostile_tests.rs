//! A hostile RC peer played with raw verbs (guest only).
//!
//! The peer completes the `rc+oob://` side-channel handshake with a QP of
//! its own, announces receive buffers of 4 KiB so that every larger
//! message reaches it by rendezvous, and then uses every rkey it is ever
//! given the way an attacker would: it READs past the message and before
//! it, WRITEs into it, READs it again after its finish, replays old rkeys
//! on new connections, and tries the key of the victim's pool region
//! itself. Each attempt must fail with a remote access error at the
//! attacker (and fail only the attacker's connection), while the victim
//! streams checksummed messages, by rendezvous among them, to an honest
//! peer from the same pool, which must receive every one intact.

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode,
};
use zerocast_core::{Connection as _, Endpoint, FrameKind, Header, Hello, Listener as _, Transport as _};
use zerocast_mem::{Buf, PoolConfig, Wait};

use super::guest_test_util::{addr, pattern};
use super::oob::{local_port, random_psn, to_init, to_rtr_rts, OobInfo, INFO_LEN};
use super::rendezvous::{Descriptor, DESC_LEN};
use super::{RcConfig, RcConnection, RcTransport, Resources};
use crate::verbs::{CompletionQueue, QpCaps, QueuePair};

/// The message the victim sends each attacker: well over its 4 KiB receives.
const MSG: usize = 256 << 10;
/// The attacker's receive buffers, as its hello announces them.
const RECV: usize = 4096;
/// Receives the attacker posts (its window plus the rendezvous finishes).
const POSTED: usize = 16;
const WAIT: Duration = Duration::from_secs(20);

fn transport() -> RcTransport {
    RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("RC transport")
}

/// What the attacker reads of a work completion.
struct Completion {
    wr_id: u64,
    status: u32,
    opcode: u32,
}

/// The attacker's end of one connection: a raw QP on its own transport
/// (its own protection domain and pool).
struct Attacker {
    // Field order is drop order: the QP goes before the buffers it used.
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    recvs: Vec<Buf>,
    scratch: Buf,
    _side_channel: TcpStream,
}

impl Attacker {
    fn connect(t: &RcTransport, victim: &Endpoint) -> Self {
        let port = victim.port().expect("the victim listens on a port");
        let mut sock = TcpStream::connect((addr().as_str(), port)).expect("side channel");
        let ep = Endpoint::parse(&format!("rc+oob://{}:0", addr())).expect("endpoint");
        let local = local_port(t, &ep).expect("local port");
        let cq = CompletionQueue::new::<()>(t.inner.pd.context(), 64, None, None).expect("CQ");
        let caps = QpCaps { send_wr: 16, recv_wr: POSTED as u32, max_inline: 0, srq: None };
        let qp = QueuePair::create(&t.inner.pd, &cq, caps).expect("QP");
        to_init(&qp, local.qp_port).expect("INIT");
        let pool = t.pool();
        let mut recvs = Vec::new();
        for i in 0..POSTED {
            let buf = pool.alloc(RECV, Wait::No).expect("receive buffer");
            let mut sge = ibv_sge { addr: buf.addr(), length: RECV as u32, lkey: buf.keys().lkey };
            let mut wr =
                ibv_recv_wr { wr_id: i as u64, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
            // SAFETY: the SGE is a buffer of this QP's PD, kept in `recvs`,
            // which drops after the QP.
            unsafe { qp.post_recv(&mut wr) }.expect("post receive");
            recvs.push(buf);
        }
        let psn = random_psn();
        let hello = Hello {
            window: 8,
            credit_unit: 0,
            max_payload: 1 << 20,
            recv_buf_size: RECV as u32,
            heartbeat_ms: 0,
        };
        // `reads: 0`: a record without the READ depth, as from a side that
        // predates it (the victim then issues one READ at a time to us).
        let (lid, gid) = (local.lid, local.gid);
        let ours = OobInfo { hello, qpn: qp.qp_num(), psn, reads: 0, lid, gid, rkey: 0, addr: 0 };
        sock.write_all(&ours.encode()).expect("send our info");
        let mut theirs = [0u8; INFO_LEN];
        sock.read_exact(&mut theirs).expect("read the victim's info");
        let theirs = OobInfo::decode(&theirs).expect("the victim's info");
        to_rtr_rts(t, &qp, &local, psn, &theirs).expect("RTR/RTS");
        sock.write_all(b"R").expect("ready");
        let mut r = [0u8; 1];
        sock.read_exact(&mut r).expect("victim ready");
        let scratch = pool.alloc(MSG, Wait::No).expect("scratch buffer");
        Self { qp, cq, recvs, scratch, _side_channel: sock }
    }

    /// The next completion, within [`WAIT`]: its `wr_id`, status and opcode.
    fn completion(&self) -> Completion {
        let deadline = Instant::now() + WAIT;
        let mut wc = [MaybeUninit::<ibv_wc>::uninit()];
        loop {
            if self.cq.poll(&mut wc).expect("poll") == 1 {
                // SAFETY: `ibv_poll_cq` filled the entry.
                let wc = unsafe { wc[0].assume_init_ref() };
                return Completion { wr_id: wc.wr_id, status: wc.status, opcode: wc.opcode };
            }
            assert!(Instant::now() < deadline, "no completion within {WAIT:?}");
            thread::sleep(Duration::from_micros(200));
        }
    }

    /// Wait for the victim's rendezvous request and return its descriptor.
    fn descriptor(&self) -> Descriptor {
        loop {
            let wc = self.completion();
            assert_eq!(wc.status, ibv_wc_status::IBV_WC_SUCCESS, "receive failed");
            assert_eq!(wc.opcode, ibv_wc_opcode::IBV_WC_RECV);
            let buf = &self.recvs[wc.wr_id as usize];
            let header = Header::decode(&buf[..zerocast_core::HEADER_LEN], u64::MAX).expect("a header");
            if header.kind == FrameKind::Rendezvous && header.len == DESC_LEN as u64 {
                let at = zerocast_core::HEADER_LEN;
                return Descriptor::decode(&buf[at..at + DESC_LEN], u64::MAX).expect("a descriptor");
            }
        }
    }

    /// RDMA READ (or WRITE) `len` bytes at `remote` with `rkey`; the
    /// completion's status.
    fn one_sided(&self, write: bool, remote: u64, rkey: u32, len: usize) -> u32 {
        let mut sge =
            ibv_sge { addr: self.scratch.addr(), length: len as u32, lkey: self.scratch.keys().lkey };
        // SAFETY: all-zero is a valid `ibv_send_wr`.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 1 << 40;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = if write { ibv_wr_opcode::IBV_WR_RDMA_WRITE } else { ibv_wr_opcode::IBV_WR_RDMA_READ };
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = rkey;
        // SAFETY: the SGE is within `scratch`, of this QP's PD, which
        // outlives the completion polled below.
        unsafe { self.qp.post_send(std::slice::from_mut(&mut wr)) }.expect("post one-sided");
        self.completion().status
    }

    /// Send the rendezvous finish, as an honest peer does after its READ.
    fn finish(&mut self) {
        let h = Header::new(FrameKind::Rendezvous, 0, 0, 0).encode();
        self.scratch[..h.len()].copy_from_slice(&h);
        let mut sge =
            ibv_sge { addr: self.scratch.addr(), length: h.len() as u32, lkey: self.scratch.keys().lkey };
        // SAFETY: all-zero is a valid `ibv_send_wr`.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 2 << 40;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        // SAFETY: as in `one_sided`.
        unsafe { self.qp.post_send(std::slice::from_mut(&mut wr)) }.expect("post finish");
        assert_eq!(self.completion().status, ibv_wc_status::IBV_WC_SUCCESS, "finish send");
    }
}

/// The victim's side of one attacker: accept, send the patterned message.
fn victim_sends(listener: &super::RcListener, seed: u32) -> RcConnection {
    let conn = listener.accept().expect("victim accept");
    let mut msg = conn.alloc(MSG, Some(Instant::now() + WAIT)).expect("victim alloc");
    for (i, b) in msg.iter_mut().enumerate() {
        *b = pattern(i, seed);
    }
    conn.send(msg, Some(Instant::now() + WAIT)).map_err(|e| e.to_string()).expect("victim send");
    conn
}

/// Wait until the victim has revoked every grant of `conn` (the finish
/// was processed).
fn grants_revoked(conn: &RcConnection) {
    let io = &conn.resources::<Resources>().expect("RC resources").0;
    let deadline = Instant::now() + WAIT;
    while io.rendezvous().has_outbound() {
        assert!(Instant::now() < deadline, "the victim did not process the finish");
        thread::sleep(Duration::from_millis(1));
    }
}

#[derive(Debug, Clone, Copy)]
enum Attempt {
    ReadPastTheEnd,
    ReadBeforeTheStart,
    WriteIntoTheMessage,
    ReadAfterTheFinish,
    ReplayEveryOldKey,
    UseThePoolRegionsKey,
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn hostile_peer_reaches_only_the_message_it_was_sent_and_only_until_its_finish() {
    let victim = transport();
    let listener = victim
        .listen(&Endpoint::parse(&format!("rc+oob://{}:0", addr())).expect("endpoint"))
        .expect("victim listens");
    let at = listener.local_endpoint().clone();

    // The bystander: an honest peer the victim streams checksummed messages
    // to from the same pool, eager and by rendezvous, during every attack.
    let honest = transport();
    let stop = Arc::new(AtomicBool::new(false));
    let honest_at = at.clone();
    let reader = thread::spawn(move || {
        let conn = honest.connect(&honest_at).expect("honest connect");
        let mut n = 0u32;
        loop {
            match conn.recv(Some(Instant::now() + WAIT)) {
                Ok(m) => {
                    let seed = u32::from_le_bytes(m[..4].try_into().expect("4 bytes"));
                    assert_eq!(seed, n, "message {n} out of order");
                    assert!(
                        m[4..].iter().enumerate().all(|(i, &b)| b == pattern(i, seed)),
                        "message {n} corrupted"
                    );
                    n += 1;
                }
                Err(e) => {
                    println!("honest peer: {n} messages, then {e}");
                    return n;
                }
            }
        }
    });
    let bystander = listener.accept().expect("accept the honest peer");
    let streamer_stop = stop.clone();
    let streamer = thread::spawn(move || {
        let mut n = 0u32;
        while !streamer_stop.load(Ordering::Relaxed) {
            let len = if n % 3 == 0 { 200 << 10 } else { 1000 + (n as usize % 7) * 977 };
            let mut m = bystander.alloc(len, Some(Instant::now() + WAIT)).expect("bystander alloc");
            m[..4].copy_from_slice(&n.to_le_bytes());
            for (i, b) in m[4..].iter_mut().enumerate() {
                *b = pattern(i, n);
            }
            bystander
                .send(m, Some(Instant::now() + WAIT))
                .map_err(|e| e.to_string())
                .expect("bystander send");
            n += 1;
        }
        bystander.close();
        n
    });

    let attacker_t = transport();
    let mut old_keys: Vec<Descriptor> = Vec::new();
    // The victim's ends of the attackers' connections (each failed by its
    // attacker's violation, or finished), kept to check their grants.
    let mut old_conns: Vec<RcConnection> = Vec::new();
    let attempts = [
        Attempt::ReadPastTheEnd,
        Attempt::ReadBeforeTheStart,
        Attempt::WriteIntoTheMessage,
        Attempt::ReadAfterTheFinish,
        Attempt::ReplayEveryOldKey,
        Attempt::UseThePoolRegionsKey,
    ];
    for (k, attempt) in attempts.into_iter().enumerate() {
        let replays = if matches!(attempt, Attempt::ReplayEveryOldKey) { old_keys.clone() } else { vec![] };
        for replay in std::iter::once(None).chain(replays.into_iter().map(Some)) {
            let seed = 1000 + k as u32;
            let t = attacker_t.clone();
            let victim_at = at.clone();
            let attacker = thread::spawn(move || Attacker::connect(&t, &victim_at));
            let victim_conn = victim_sends(&listener, seed);
            // The attacker's record does not say how many READs it serves
            // (as from a side that predates the field): one at a time.
            let victim_io = &victim_conn.resources::<Resources>().expect("RC resources").0;
            assert_eq!(victim_io.qp().read_depth(), 1, "READ depth towards a peer that serves one");
            let mut a = attacker.join().expect("attacker connects");
            let d = a.descriptor();
            old_keys.push(d);
            let len = d.len as usize;
            assert_eq!(len, MSG);
            // The grant is good for exactly the message: read it whole.
            let status = a.one_sided(false, d.addr, d.rkey, len);
            assert_eq!(status, ibv_wc_status::IBV_WC_SUCCESS, "{attempt:?}: the READ of the message itself");
            assert!(
                a.scratch[..len].iter().enumerate().all(|(i, &b)| b == pattern(i, seed)),
                "message bytes"
            );
            let status = match (attempt, replay) {
                (Attempt::ReplayEveryOldKey, None) => {
                    // Behave: finish, so the victim revokes this grant too.
                    a.finish();
                    grants_revoked(&victim_conn);
                    old_conns.push(victim_conn);
                    continue;
                }
                (_, Some(old)) => {
                    // Every earlier connection has failed or finished: its
                    // grants are revoked (waited for, not assumed).
                    old_conns.iter().for_each(grants_revoked);
                    let s = a.one_sided(false, old.addr, old.rkey, old.len as usize);
                    old_conns.push(victim_conn);
                    s
                }
                (Attempt::ReadPastTheEnd, _) => {
                    let s = a.one_sided(false, d.addr + d.len as u64, d.rkey, RECV);
                    old_conns.push(victim_conn);
                    s
                }
                (Attempt::ReadBeforeTheStart, _) => {
                    let s = a.one_sided(false, d.addr - RECV as u64, d.rkey, RECV);
                    old_conns.push(victim_conn);
                    s
                }
                (Attempt::WriteIntoTheMessage, _) => {
                    let s = a.one_sided(true, d.addr, d.rkey, RECV);
                    old_conns.push(victim_conn);
                    s
                }
                (Attempt::ReadAfterTheFinish, _) => {
                    a.finish();
                    grants_revoked(&victim_conn);
                    let s = a.one_sided(false, d.addr, d.rkey, len);
                    old_conns.push(victim_conn);
                    s
                }
                (Attempt::UseThePoolRegionsKey, _) => {
                    // The victim's own key for the region holding the message
                    // (as if it leaked): the region grants no remote access.
                    let probe = victim.pool().alloc(MSG, Wait::No).expect("victim pool buffer");
                    let keys = probe.keys();
                    let (lkey, rkey) = (keys.lkey, keys.rkey);
                    drop(probe);
                    let s = a.one_sided(false, d.addr, lkey, len);
                    assert_eq!(s, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, "the region's lkey as an rkey");
                    // The QP is in error now; one more connection for the rkey.
                    drop(a);
                    drop(victim_conn);
                    let t = attacker_t.clone();
                    let victim_at = at.clone();
                    let attacker = thread::spawn(move || Attacker::connect(&t, &victim_at));
                    let victim_conn = victim_sends(&listener, seed);
                    let a2 = attacker.join().expect("attacker connects");
                    let d2 = a2.descriptor();
                    let s = a2.one_sided(false, d2.addr, rkey, len);
                    drop(victim_conn);
                    s
                }
            };
            println!("{attempt:?} (replay {replay:?}): status {status}");
            assert_eq!(
                status,
                ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
                "{attempt:?}: must be a remote access error"
            );
        }
    }

    stop.store(true, Ordering::Relaxed);
    let sent = streamer.join().expect("streamer");
    let received = reader.join().expect("honest reader");
    println!("bystander: {sent} messages sent, {received} received intact");
    assert!(sent > 0);
    assert_eq!(received, sent, "the honest peer lost messages");
}
