//! `rc+oob://`: connecting through a TCP side channel.
//!
//! Each side creates its CQ and QP, moves the QP to INIT and posts its
//! receives, then both write one [`OobInfo`] (hello, QP number, PSN, the
//! RDMA READs it serves at once, LID, GID, and a placeholder region) and
//! read the peer's. Each drives its QP to RTR (towards the peer's
//! QPN/PSN/GID) and RTS, issuing no more READs at once than the peer
//! serves, and the two exchange a ready byte, so neither sends before the
//! other can receive.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdma_sys::{ibv_access_flags, ibv_gid, ibv_qp_attr, ibv_qp_attr_mask as m, ibv_qp_state};
use zerocast_core::handshake::HELLO_LEN;
use zerocast_core::{ConnError, ConnectError, Endpoint, Hello, LinkConfig};
use zerocast_link::engine::{Cx, Interest, Step, Task};

use super::engine::{Io, Receives, Sizes};
use super::{no_room, resolve, transport_err, RcConnection, RcError, RcTransport};
use crate::verbs::QueuePair;

/// How long, after our close, the peer has to close its side channel.
const CLOSE_PATIENCE: Duration = Duration::from_secs(10);

const MAGIC: &[u8; 4] = b"ZCOB";
/// A listener's answer instead of its [`OobInfo`] when its shared receive
/// queue has no share left.
const REFUSED: &[u8; 4] = b"ZCRF";
pub(super) const INFO_LEN: usize = H + 4 + 4 + 2 + 16 + 4 + 8;
/// Where the hello ends and the queue pair's address begins.
const H: usize = 4 + HELLO_LEN;

/// What each side tells the other over the side channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OobInfo {
    pub(super) hello: Hello,
    pub(super) qpn: u32,
    /// 24 bits on the wire, in the low bytes of a word whose top byte is
    /// `reads`.
    pub(super) psn: u32,
    /// RDMA READs this side serves at once (its responder resources), at
    /// least 1: a record that says 0 (one from a side that predates the
    /// field) means 1.
    pub(super) reads: u8,
    pub(super) lid: u16,
    pub(super) gid: [u8; 16],
    /// Exposed region (none yet: zero).
    pub(super) rkey: u32,
    pub(super) addr: u64,
}

impl OobInfo {
    pub(super) fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4..H].copy_from_slice(&self.hello.encode());
        b[H..H + 4].copy_from_slice(&self.qpn.to_le_bytes());
        b[H + 4..H + 8]
            .copy_from_slice(&(self.psn & 0x00ff_ffff | u32::from(self.reads) << 24).to_le_bytes());
        b[H + 8..H + 10].copy_from_slice(&self.lid.to_le_bytes());
        b[H + 10..H + 26].copy_from_slice(&self.gid);
        b[H + 26..H + 30].copy_from_slice(&self.rkey.to_le_bytes());
        b[H + 30..H + 38].copy_from_slice(&self.addr.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; INFO_LEN]) -> Result<Self, ConnError> {
        if &b[..4] != MAGIC {
            return Err(ConnError::Handshake(zerocast_core::HandshakeError::NotHello));
        }
        let hello = Hello::decode(&b[4..H])?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[H + 10..H + 26]);
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[H + 30..H + 38]);
        Ok(Self {
            hello,
            qpn: u32_at(H),
            psn: u32_at(H + 4) & 0x00ff_ffff,
            reads: b[H + 7].max(1),
            lid: u16::from_le_bytes([b[H + 8], b[H + 9]]),
            gid,
            rkey: u32_at(H + 26),
            addr: u64::from_le_bytes(addr),
        })
    }
}

/// The GID index to use on `port` of `dev`: `explicit`, else a RoCE v2
/// GID holding an IPv4-mapped address, else the first RoCE v2, else 0.
pub(crate) fn choose_gid_index(dev: &str, port: u8, explicit: Option<u8>) -> u8 {
    if let Some(i) = explicit {
        return i;
    }
    let base = format!("/sys/class/infiniband/{dev}/ports/{port}");
    let mut first_v2 = None;
    for i in 0..=255u8 {
        let Ok(ty) = std::fs::read_to_string(format!("{base}/gid_attrs/types/{i}")) else {
            if i > 16 {
                break;
            }
            continue;
        };
        if !ty.trim().eq_ignore_ascii_case("RoCE v2") {
            continue;
        }
        let gid = std::fs::read_to_string(format!("{base}/gids/{i}")).unwrap_or_default();
        if gid.trim().starts_with("0000:0000:0000:0000:0000:ffff:") {
            return i;
        }
        first_v2.get_or_insert(i);
    }
    first_v2.unwrap_or(0)
}

fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: all-zero is a valid `ibv_qp_attr`.
    unsafe { std::mem::zeroed() }
}

pub(super) struct Local {
    pub(super) qp_port: u8,
    gid_index: u8,
    pub(super) gid: [u8; 16],
    pub(super) lid: u16,
    mtu: u32,
    ethernet: bool,
}

pub(super) fn local_port(t: &RcTransport, ep: &Endpoint) -> Result<Local, RcError> {
    let dev = &t.inner.device;
    let port = dev.port();
    let attr = dev.port_attr().map_err(|e| RcError::Config(e.to_string()))?;
    let explicit = ep.param_as::<u8>("gid_index").ok().flatten().or(t.inner.cfg.gid_index);
    let gid_index = choose_gid_index(dev.name(), port, explicit);
    let mut gid = std::mem::MaybeUninit::<ibv_gid>::zeroed();
    // SAFETY: open context, valid out-pointer.
    let rc =
        unsafe { rdma_sys::ibv_query_gid(dev.context().as_ptr(), port, gid_index.into(), gid.as_mut_ptr()) };
    if rc != 0 {
        return Err(RcError::verbs("ibv_query_gid", crate::error::errno_from_rc(rc)));
    }
    // SAFETY: filled in by the query; `raw` is always a valid view.
    let gid = unsafe { gid.assume_init().raw };
    Ok(Local {
        qp_port: port,
        gid_index,
        gid,
        lid: attr.lid,
        mtu: mtu_enum(attr.active_mtu),
        ethernet: attr.ethernet,
    })
}

pub(super) fn to_init(qp: &QueuePair, port: u8) -> Result<(), RcError> {
    let mut a = zeroed_attr();
    a.qp_state = ibv_qp_state::IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = port;
    a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
        .0;
    qp.modify(&mut a, m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS)
        .map_err(|e| RcError::verbs("ibv_modify_qp(INIT)", e))
}

pub(super) fn to_rtr_rts(
    t: &RcTransport,
    qp: &QueuePair,
    local: &Local,
    my_psn: u32,
    peer: &OobInfo,
) -> Result<(), RcError> {
    let cfg = &t.inner.cfg;
    let mut a = zeroed_attr();
    a.qp_state = ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = local.mtu;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer.psn;
    let (responder, initiator) = t.read_depths();
    a.max_dest_rd_atomic = responder;
    a.min_rnr_timer = cfg.min_rnr_timer;
    a.ah_attr.port_num = local.qp_port;
    a.ah_attr.dlid = peer.lid;
    if local.ethernet || peer.gid != [0; 16] {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: peer.gid };
        a.ah_attr.grh.sgid_index = local.gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    let mask = m::IBV_QP_STATE
        | m::IBV_QP_AV
        | m::IBV_QP_PATH_MTU
        | m::IBV_QP_DEST_QPN
        | m::IBV_QP_RQ_PSN
        | m::IBV_QP_MAX_DEST_RD_ATOMIC
        | m::IBV_QP_MIN_RNR_TIMER;
    qp.modify(&mut a, mask).map_err(|e| RcError::verbs("ibv_modify_qp(RTR)", e))?;
    let mut a = zeroed_attr();
    a.qp_state = ibv_qp_state::IBV_QPS_RTS;
    a.timeout = cfg.timeout;
    a.retry_cnt = cfg.retry_cnt;
    a.rnr_retry = cfg.rnr_retry;
    a.sq_psn = my_psn;
    // No more READs at once than the peer serves.
    a.max_rd_atomic = initiator.min(peer.reads);
    let mask = m::IBV_QP_STATE
        | m::IBV_QP_TIMEOUT
        | m::IBV_QP_RETRY_CNT
        | m::IBV_QP_RNR_RETRY
        | m::IBV_QP_SQ_PSN
        | m::IBV_QP_MAX_QP_RD_ATOMIC;
    qp.modify(&mut a, mask).map_err(|e| RcError::verbs("ibv_modify_qp(RTS)", e))
}

pub(super) fn random_psn() -> u32 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(1);
    (nanos ^ std::process::id().rotate_left(8)) & 0x00ff_ffff
}

/// Our end of a side-channel handshake: a QP in INIT, its receives
/// posted, and the record that tells the peer of it.
pub(super) struct Ours {
    pub(super) io: Arc<Io>,
    pub(super) local: Local,
    pub(super) psn: u32,
    pub(super) info: OobInfo,
}

impl Ours {
    /// Create the QP with the receives `shaped` chose (on the listener's
    /// shared receive queue when they come from it) and bring it to INIT.
    pub(super) fn open(
        t: &RcTransport,
        ep: &Endpoint,
        link: &LinkConfig,
        (sizes, receives): (Sizes, Receives),
    ) -> Result<Self, ConnectError> {
        let local = local_port(t, ep).map_err(transport_err)?;
        let shared = receives.srq();
        let (cq, notify) = t.cq(&sizes).map_err(transport_err)?;
        let qp = QueuePair::create(&t.inner.pd, &cq, t.caps(&sizes, shared.as_ref()))
            .map_err(|e| transport_err(RcError::verbs("ibv_create_qp", e)))?;
        to_init(&qp, local.qp_port).map_err(transport_err)?;
        let qpn = qp.qp_num();
        let io = t.new_io(qp, (cq, notify), sizes, receives).map_err(transport_err)?;
        let psn = random_psn();
        let hello = t.hello(link, &io);
        let reads = t.read_depths().0;
        let info = OobInfo { hello, qpn, psn, reads, lid: local.lid, gid: local.gid, rkey: 0, addr: 0 };
        Ok(Self { io, local, psn, info })
    }

    /// The peer's record came: our QP goes to RTR and RTS.
    pub(super) fn connect_to(&self, t: &RcTransport, theirs: &OobInfo) -> Result<(), ConnectError> {
        to_rtr_rts(t, self.io.qp(), &self.local, self.psn, theirs).map_err(transport_err)
    }
}

/// Whether a record is the listener's refusal (its shared receive queue
/// is full, or its receive memory all reserved).
pub(super) fn is_refusal(record: &[u8; INFO_LEN]) -> bool {
    &record[..4] == REFUSED
}

/// The listener's refusal, in place of its record.
pub(super) fn refusal() -> [u8; INFO_LEN] {
    let mut no = [0u8; INFO_LEN];
    no[..4].copy_from_slice(REFUSED);
    no
}

/// The result of one read or write of a non-blocking side channel (either
/// side's handshake task): how many bytes, or `None` when the socket would
/// block.
pub(super) fn nonblocking(mut op: impl FnMut() -> std::io::Result<usize>) -> std::io::Result<Option<usize>> {
    loop {
        match op() {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The side channel plays rdma_cm's DISCONNECTED once the connection is
/// up: each side shuts it down when its QP is closed, and the peer closes
/// its own on seeing that (see [`Watch`]).
pub(super) fn watch(sock: Arc<TcpStream>, io: Arc<Io>) -> Watch {
    Watch { sock, io, registered: false, shut_at: None }
}

/// The connecting side's handshake on a connected socket: our record, the
/// listener's, RTR and RTS, then "R" each way.
fn establish(
    t: &RcTransport,
    mut sock: TcpStream,
    ep: &Endpoint,
    link: LinkConfig,
) -> Result<RcConnection, ConnectError> {
    let peer = ep.clone();
    let io_err = |e| ConnectError::Io { endpoint: peer.to_string(), source: e };
    let handshake = |source: ConnError| ConnectError::Handshake { endpoint: peer.to_string(), source };
    sock.set_nodelay(true).map_err(io_err)?;
    sock.set_read_timeout(Some(t.inner.cfg.connect_timeout)).map_err(io_err)?;
    let ours = Ours::open(t, ep, &link, t.shaped(&link, None).map_err(transport_err)?)?;
    sock.write_all(&ours.info.encode()).map_err(io_err)?;
    let mut buf = [0u8; INFO_LEN];
    sock.read_exact(&mut buf).map_err(io_err)?;
    if is_refusal(&buf) {
        return Err(no_room(&peer));
    }
    let theirs = OobInfo::decode(&buf).map_err(handshake)?;
    ours.connect_to(t, &theirs)?;
    // Ready: neither side sends before the other's QP can receive.
    sock.write_all(b"R").map_err(io_err)?;
    let mut r = [0u8; 1];
    sock.read_exact(&mut r).map_err(io_err)?;
    if r != *b"R" {
        return Err(handshake(ConnError::Handshake(zerocast_core::HandshakeError::NotHello)));
    }
    tracing::debug!(%peer, qpn = ours.info.qpn, peer_qpn = theirs.qpn, gid_index = ours.local.gid_index, "rc+oob QP in RTS");
    let (conn, _) = t.finish(Arc::clone(&ours.io), link, theirs.hello, peer.clone())?;
    sock.set_nonblocking(true).map_err(io_err)?;
    t.engine_of(&ours.io).register(Box::new(watch(Arc::new(sock), ours.io)));
    Ok(conn)
}

/// Watches the side channel, as an engine task: end-of-file from the peer
/// closes the QP (the peer said goodbye and closed, or died); our own
/// close shuts it down, and the peer then has ten seconds to close its
/// own.
pub(super) struct Watch {
    sock: Arc<TcpStream>,
    io: Arc<Io>,
    registered: bool,
    shut_at: Option<Instant>,
}

impl Watch {
    fn peer_gone(&self) -> Step {
        self.io.mark_peer_disconnected();
        if !self.io.is_closing() {
            self.io.close();
        }
        let _ = self.sock.shutdown(Shutdown::Both);
        Step::Done
    }
}

impl Task for Watch {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        if !self.registered {
            self.io.wake_on_close(cx.waker());
            self.registered = true;
        }
        let mut b = [0u8; 16];
        loop {
            match (&*self.sock).read(&mut b) {
                Ok(0) => return self.peer_gone(),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return self.peer_gone(),
            }
        }
        if self.io.is_closing() {
            let at = *self.shut_at.get_or_insert_with(|| {
                let _ = self.sock.shutdown(Shutdown::Write);
                cx.now()
            });
            if cx.now().duration_since(at) > CLOSE_PATIENCE {
                return Step::Done;
            }
            cx.set_timer(Some(at + CLOSE_PATIENCE));
        }
        cx.set_interest(Interest { read: true, write: false });
        Step::Continue
    }
}

pub(super) fn connect(
    t: &RcTransport,
    ep: &Endpoint,
    link: LinkConfig,
) -> Result<RcConnection, ConnectError> {
    let addr = resolve(ep)?;
    let sock = TcpStream::connect_timeout(&addr, t.inner.cfg.connect_timeout)
        .map_err(|e| ConnectError::Io { endpoint: ep.to_string(), source: e })?;
    establish(t, sock, ep, link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_roundtrip_and_garbage() {
        let info = OobInfo {
            hello: Hello {
                window: 16,
                credit_unit: 0,
                max_payload: 1 << 20,
                recv_buf_size: 1 << 20,
                heartbeat_ms: 0,
            },
            qpn: 17,
            psn: 0x12_3456,
            reads: 4,
            lid: 0,
            gid: [7; 16],
            rkey: 0,
            addr: 0,
        };
        assert_eq!(OobInfo::decode(&info.encode()).expect("decode"), info);
        assert!(OobInfo::decode(&[0u8; INFO_LEN]).is_err());
        // A record without the READ depth (a zero top byte) serves one.
        let mut old = info.encode();
        old[H + 7] = 0;
        assert_eq!(OobInfo::decode(&old).expect("decode").reads, 1);
        assert_eq!(mtu_enum(1024), 3);
        assert_eq!(mtu_enum(4096), 5);
    }
}
