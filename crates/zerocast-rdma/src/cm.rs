//! Thin owners of librdmacm objects: the event channel, the CM id, events.
//!
//! The RC connection logic that drives them lives in `rc::cm_path`.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_context, ibv_get_device_name, rdma_ack_cm_event, rdma_cm_event, rdma_cm_event_type, rdma_cm_id,
    rdma_create_event_channel, rdma_create_id, rdma_destroy_event_channel, rdma_destroy_id,
    rdma_event_channel, rdma_event_str, rdma_get_devices, rdma_get_src_port, rdma_migrate_id,
    rdma_port_space,
};

use crate::device::{Context, Device};
use crate::error::{errno_from_rc, DeviceError};

/// `RDMA_OPTION_ID` and `RDMA_OPTION_ID_ACK_TIMEOUT` from `<rdma/rdma_cma.h>`
/// (newer than the headers the bindings were made from).
pub(crate) const RDMA_OPTION_ID: c_int = 0;
pub(crate) const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

/// The contexts librdmacm opened (`rdma_get_devices`), as addresses. The
/// list is never freed: the contexts must stay open as long as any CM id
/// may use them, which is the life of the process.
fn cm_contexts() -> &'static [usize] {
    static LIST: OnceLock<Vec<usize>> = OnceLock::new();
    LIST.get_or_init(|| {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the returned list is kept (never
        // freed), so every context in it stays open.
        let list = unsafe { rdma_get_devices(&mut n) };
        if list.is_null() {
            return Vec::new();
        }
        (0..usize::try_from(n).unwrap_or(0))
            // SAFETY: the list holds `n` valid entries and is never freed.
            .map(|i| unsafe { *list.add(i) } as usize)
            .filter(|&p| p != 0)
            .collect()
    })
}

/// The name of the device of an open context.
///
/// # Safety
/// `ctx` must be an open context.
pub(crate) unsafe fn context_name(ctx: *mut ibv_context) -> String {
    // SAFETY: the caller guarantees `ctx` is open; its `device` is valid.
    let name = unsafe { ibv_get_device_name((*ctx).device) };
    if name.is_null() {
        return "unknown".to_owned();
    }
    // SAFETY: a NUL-terminated name owned by the device.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// Open the device rdma_cm uses, by name or the first with an active port.
///
/// Its context is librdmacm's own, so queue pairs that rdma_cm creates on
/// its CM ids (`cm_id->verbs`) may use protection domains allocated here.
pub fn open_cm_device(name: Option<&str>) -> Result<Device, DeviceError> {
    let list = cm_contexts();
    if list.is_empty() {
        return Err(DeviceError::NoDevice);
    }
    let mut present = Vec::new();
    let mut candidates = Vec::new();
    for &p in list {
        let raw = p as *mut ibv_context;
        // SAFETY: contexts from `rdma_get_devices` stay open (list never freed).
        let n = unsafe { context_name(raw) };
        present.push(n.clone());
        candidates.push((raw, n));
    }
    for (raw, n) in candidates {
        if name.is_some_and(|w| w != n) {
            continue;
        }
        let Some(raw) = NonNull::new(raw) else { continue };
        // SAFETY: librdmacm keeps the context open for the life of the
        // process; `owned == false` so it is never closed here.
        let ctx = unsafe { Context::wrap(raw, n.clone(), false) }?;
        match ctx.first_active_port()? {
            Ok(port) => return Ok(Device::from_parts(ctx, port)),
            Err((port, state)) if name.is_some() => {
                return Err(DeviceError::PortNotActive { device: n, port, state })
            }
            Err(_) => continue,
        }
    }
    match name {
        Some(w) => Err(DeviceError::NotFound { name: w.to_owned(), present }),
        None => Err(DeviceError::NoActivePort { present }),
    }
}

/// An rdma_cm event channel; destroyed on drop, after every id on it.
pub(crate) struct EventChannel {
    raw: NonNull<rdma_event_channel>,
}

// SAFETY: librdmacm calls on a channel are thread-safe; the channel has no
// interior state of ours.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    pub(crate) fn new() -> io::Result<Arc<Self>> {
        // SAFETY: plain constructor.
        let raw = unsafe { rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        let ch = Self { raw };
        // Non-blocking, so `get` can wait with a timeout through poll(2).
        // SAFETY: `raw` is a live channel; its fd is valid.
        let fd = unsafe { (*ch.raw.as_ptr()).fd };
        set_nonblocking(fd)?;
        Ok(Arc::new(ch))
    }

    pub(crate) fn as_ptr(&self) -> *mut rdma_event_channel {
        self.raw.as_ptr()
    }

    fn fd(&self) -> c_int {
        // SAFETY: the channel is live while `self` is.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// The next event, waiting at most `timeout` (`None`: forever).
    /// `Ok(None)` on timeout.
    pub(crate) fn get(&self, timeout: Option<Duration>) -> io::Result<Option<CmEvent>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let mut ev: *mut rdma_cm_event = ptr::null_mut();
            // SAFETY: live channel, valid out-pointer; non-blocking fd.
            let rc = unsafe { rdma_sys::rdma_get_cm_event(self.as_ptr(), &mut ev) };
            if rc == 0 {
                if let Some(raw) = NonNull::new(ev) {
                    return Ok(Some(CmEvent { raw }));
                }
            } else {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::WouldBlock && err.raw_os_error() != Some(libc::EAGAIN) {
                    return Err(err);
                }
            }
            let wait_ms = match deadline {
                None => 100,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    left.as_millis().clamp(1, 100) as c_int
                }
            };
            poll_readable(self.fd(), wait_ms)?;
        }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's descriptor stays open as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel holds an `Arc` of it, so none is left.
        unsafe { rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel").field("fd", &self.fd()).finish()
    }
}

/// Wait until `fd` is readable or `ms` milliseconds passed.
pub(crate) fn poll_readable(fd: c_int, ms: c_int) -> io::Result<bool> {
    poll_in(&mut [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }], ms)
}

/// Wait until one of `fds` has an event or `ms` milliseconds passed
/// (negative: no limit); whether any has. A signal ends the wait early, as
/// a timeout. Which ones are in their `revents`.
pub(crate) fn poll_in(fds: &mut [libc::pollfd], ms: c_int) -> io::Result<bool> {
    // SAFETY: `fds.len()` valid pollfds in a live slice.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(err);
    }
    Ok(rc > 0)
}

pub(crate) fn set_nonblocking(fd: c_int) -> io::Result<()> {
    // SAFETY: fcntl on a valid fd with plain integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An event taken from a channel; acknowledged on drop.
pub(crate) struct CmEvent {
    raw: NonNull<rdma_cm_event>,
}

impl CmEvent {
    pub(crate) fn kind(&self) -> rdma_cm_event_type::Type {
        // SAFETY: the event is live until acked on drop.
        unsafe { self.raw.as_ref() }.event
    }

    pub(crate) fn status(&self) -> c_int {
        // SAFETY: as above.
        unsafe { self.raw.as_ref() }.status
    }

    /// The id the event is about (for a connect request: the new id).
    pub(crate) fn id(&self) -> *mut rdma_cm_id {
        // SAFETY: as above.
        unsafe { self.raw.as_ref() }.id
    }

    /// A copy of the connection private data (empty if none).
    pub(crate) fn private_data(&self) -> Vec<u8> {
        // SAFETY: as above; for connection events `param.conn` is the member in use.
        let conn = unsafe { &self.raw.as_ref().param.conn };
        if conn.private_data.is_null() || conn.private_data_len == 0 {
            return Vec::new();
        }
        // SAFETY: librdmacm gives `private_data_len` readable bytes, valid until ack.
        unsafe { std::slice::from_raw_parts(conn.private_data.cast::<u8>(), conn.private_data_len.into()) }
            .to_vec()
    }

    pub(crate) fn name(&self) -> String {
        event_name(self.kind())
    }

    /// The RDMA READ depths of a connect request, from the listener's side:
    /// `(responder resources, initiator depth)` as the listener should
    /// answer them at most. rdma_cm swaps the request's two fields on the
    /// way (the kernel's CM formats the event so), so the first is the
    /// READs the requester issues at once (its initiator depth) and the
    /// second those it serves at once (its responder resources).
    pub(crate) fn read_depths(&self) -> (u8, u8) {
        // SAFETY: the event is live; for connection events `param.conn`
        // is the member in use, plain data copied out here.
        let conn = unsafe { &self.raw.as_ref().param.conn };
        (conn.responder_resources, conn.initiator_depth)
    }

    /// The datagram parameters of an ESTABLISHED (UD) or MULTICAST_JOIN
    /// event: the peer's address handle attributes, QPN and Q_Key.
    pub(crate) fn ud_param(&self) -> UdParam {
        // SAFETY: the event is live; for UD and multicast events `param.ud`
        // is the member in use, plain data copied out here.
        let ud = unsafe { &self.raw.as_ref().param.ud };
        UdParam { ah_attr: ud.ah_attr, qpn: ud.qp_num, qkey: ud.qkey }
    }
}

/// Where datagrams for a peer or group go, as rdma_cm resolved it.
#[derive(Clone, Copy)]
pub(crate) struct UdParam {
    pub(crate) ah_attr: rdma_sys::ibv_ah_attr,
    pub(crate) qpn: u32,
    pub(crate) qkey: u32,
}

impl fmt::Debug for UdParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdParam")
            .field("qpn", &self.qpn)
            .field("qkey", &format_args!("{:#x}", self.qkey))
            .finish()
    }
}

pub(crate) fn event_name(kind: rdma_cm_event_type::Type) -> String {
    // SAFETY: returns a static string for any value.
    let s = unsafe { rdma_event_str(kind) };
    if s.is_null() {
        return format!("event {kind}");
    }
    // SAFETY: static NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: acked exactly once.
        unsafe { rdma_ack_cm_event(self.raw.as_ptr()) };
    }
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent").field("event", &self.name()).field("status", &self.status()).finish()
    }
}

/// An rdma_cm id; destroyed on drop (after its QP, which holds an `Arc` of it).
pub(crate) struct CmId {
    raw: NonNull<rdma_cm_id>,
    channel: Arc<EventChannel>,
}

// SAFETY: librdmacm calls on an id are thread-safe.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    /// A new id for a reliable connection on `channel`.
    pub(crate) fn new(channel: &Arc<EventChannel>) -> io::Result<Self> {
        Self::with_port_space(channel, rdma_port_space::RDMA_PS_TCP)
    }

    /// A new id in the UDP port space (unreliable datagrams and multicast)
    /// on `channel`.
    pub(crate) fn new_udp(channel: &Arc<EventChannel>) -> io::Result<Self> {
        Self::with_port_space(channel, rdma_port_space::RDMA_PS_UDP)
    }

    fn with_port_space(channel: &Arc<EventChannel>, ps: rdma_port_space::Type) -> io::Result<Self> {
        let mut id: *mut rdma_cm_id = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let rc = unsafe { rdma_create_id(channel.as_ptr(), &mut id, ptr::null_mut(), ps) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        let raw = NonNull::new(id).ok_or_else(|| io::Error::other("rdma_create_id gave no id"))?;
        Ok(Self { raw, channel: channel.clone() })
    }

    /// Take ownership of an id from a connect request.
    ///
    /// # Safety
    /// `raw` must be a live id that nobody else destroys, on `channel`.
    pub(crate) unsafe fn from_raw(raw: NonNull<rdma_cm_id>, channel: &Arc<EventChannel>) -> Self {
        Self { raw, channel: channel.clone() }
    }

    pub(crate) fn as_ptr(&self) -> *mut rdma_cm_id {
        self.raw.as_ptr()
    }

    pub(crate) fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    /// Move the id's events to `channel`. Every event of the id must be acked.
    pub(crate) fn migrate(&mut self, channel: &Arc<EventChannel>) -> io::Result<()> {
        // SAFETY: live id and channel.
        let rc = unsafe { rdma_migrate_id(self.as_ptr(), channel.as_ptr()) };
        if rc != 0 {
            return Err(errno_from_rc(rc));
        }
        self.channel = channel.clone();
        Ok(())
    }

    /// The device context rdma_cm bound the id to (null before binding).
    pub(crate) fn verbs(&self) -> *mut ibv_context {
        // SAFETY: live id.
        unsafe { (*self.as_ptr()).verbs }
    }

    /// The local port (host order).
    pub(crate) fn src_port(&self) -> u16 {
        // SAFETY: live id.
        u16::from_be(unsafe { rdma_get_src_port(self.as_ptr()) })
    }

    /// Set a socket address argument for librdmacm.
    pub(crate) fn sockaddr(addr: SocketAddr) -> socket2::SockAddr {
        socket2::SockAddr::from(addr)
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: every event of the id was acked (events ack on drop and
        // never outlive the thread handling them); its QP was destroyed
        // first (the QP holds an `Arc` of this id).
        let rc = unsafe { rdma_destroy_id(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::debug!(error = %errno_from_rc(rc), "rdma_destroy_id failed");
        }
    }
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId").field("channel", &self.channel).finish_non_exhaustive()
    }
}

/// Drive `fut` (a UD resolve or join, an RC connect) on the calling
/// thread until it is done or `deadline` passes (`None`); whoever completes
/// it (an event thread, an engine) wakes the thread.
pub(crate) fn wait_until<T>(
    fut: impl std::future::Future<Output = T>,
    deadline: std::time::Instant,
) -> Option<T> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut std::task::Context::from_waker(&waker)) {
            return Some(v);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}
