//! Finding and opening a verbs device; the context and protection domain.

use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use rdma_sys::{
    ___ibv_query_port, ibv_alloc_pd, ibv_close_device, ibv_context, ibv_dealloc_pd, ibv_device,
    ibv_device_attr, ibv_fork_init, ibv_free_device_list, ibv_get_device_list, ibv_get_device_name,
    ibv_is_fork_initialized, ibv_mtu, ibv_open_device, ibv_pd, ibv_port_attr, ibv_port_state,
    ibv_query_device,
};

use crate::error::{errno_from_rc, DeviceError};

/// `IBV_LINK_LAYER_ETHERNET` from `<infiniband/verbs.h>` (RoCE and iWARP ports).
const LINK_LAYER_ETHERNET: u8 = 2;

/// A verbs device opened on one of its active ports.
///
/// This is the entry point: open a device, then allocate a
/// [`ProtectionDomain`] on it and register memory in that domain.
#[derive(Debug, Clone)]
pub struct Device {
    ctx: Arc<Context>,
    port: u8,
}

impl Device {
    /// Open the device called `name`, or, with `None`, the first device that
    /// has an active port.
    ///
    /// The device's first active port is the one used. A named device without
    /// an active port is an error, as is no device at all.
    pub fn open(name: Option<&str>) -> Result<Self, DeviceError> {
        let list = DeviceList::get()?;
        let present: Vec<String> = list.iter().map(|(_, name)| name).collect();
        if present.is_empty() {
            return Err(DeviceError::NoDevice);
        }
        match name {
            Some(wanted) => {
                let Some((raw, name)) = list.iter().find(|(_, n)| n == wanted) else {
                    return Err(DeviceError::NotFound { name: wanted.to_owned(), present });
                };
                // SAFETY: `raw` comes from `list`, which is still alive.
                let ctx = unsafe { Context::open(raw, name) }?;
                match ctx.first_active_port()? {
                    Ok(port) => Ok(Self { ctx, port }),
                    Err((port, state)) => {
                        Err(DeviceError::PortNotActive { device: ctx.name.clone(), port, state })
                    }
                }
            }
            None => {
                for (raw, name) in list.iter() {
                    // SAFETY: `raw` comes from `list`, which is still alive.
                    let ctx = match unsafe { Context::open(raw, name) } {
                        Ok(ctx) => ctx,
                        Err(err) => {
                            tracing::debug!(error = %err, "skipping RDMA device");
                            continue;
                        }
                    };
                    if let Ok(port) = ctx.first_active_port()? {
                        return Ok(Self { ctx, port });
                    }
                }
                Err(DeviceError::NoActivePort { present })
            }
        }
    }

    /// A device on an already wrapped context and its chosen port.
    pub(crate) fn from_parts(ctx: Arc<Context>, port: u8) -> Self {
        Self { ctx, port }
    }

    /// The device's name, such as `"rxe0"`.
    pub fn name(&self) -> &str {
        self.ctx.name()
    }

    /// The port this device was opened on (ports count from 1).
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The open device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The current attributes of this device's port.
    pub fn port_attr(&self) -> Result<PortAttr, DeviceError> {
        self.ctx.query_port(self.port)
    }

    /// Allocate a protection domain on this device.
    pub fn alloc_pd(&self) -> Result<Arc<ProtectionDomain>, DeviceError> {
        ProtectionDomain::new(&self.ctx)
    }
}

/// An open device context (`ibv_context`). Closed when the last `Arc` to it
/// is dropped, which is after every object allocated from it.
pub struct Context {
    raw: NonNull<ibv_context>,
    name: String,
    attr: DeviceAttr,
    /// Whether dropping this closes the device. Contexts borrowed from
    /// librdmacm (`rdma_get_devices`) belong to it and stay open.
    owned: bool,
}

// SAFETY: libibverbs verbs are thread-safe: a context may be used and closed
// from any thread, and `Context` has no interior state of its own.
unsafe impl Send for Context {}
// SAFETY: as above; every method takes `&self` and only calls thread-safe verbs.
unsafe impl Sync for Context {}

impl Context {
    /// Open `device` and read its attributes.
    ///
    /// # Safety
    /// `device` must come from a device list that has not been freed yet.
    unsafe fn open(device: *mut ibv_device, name: String) -> Result<Arc<Self>, DeviceError> {
        // SAFETY: the caller guarantees `device` is a live list entry.
        let raw = unsafe { ibv_open_device(device) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(DeviceError::Open { device: name, source: std::io::Error::last_os_error() });
        };
        // SAFETY: `raw` was just opened and is owned by the new `Context`.
        unsafe { Self::wrap(raw, name, true) }
    }

    /// Wrap the open context `raw` and read its attributes. With `owned`,
    /// dropping the result closes the device (also on error).
    ///
    /// # Safety
    /// `raw` must be an open context that stays open as long as the result
    /// lives (for `owned == false`, whoever opened it must keep it open).
    pub(crate) unsafe fn wrap(
        raw: NonNull<ibv_context>,
        name: String,
        owned: bool,
    ) -> Result<Arc<Self>, DeviceError> {
        let mut ctx = Self { raw, name, attr: DeviceAttr::default(), owned };
        let mut attr = MaybeUninit::<ibv_device_attr>::zeroed();
        // SAFETY: `ctx.raw` is an open context and `attr` is a writable
        // `ibv_device_attr` that the call fills in.
        let rc = unsafe { ibv_query_device(ctx.raw.as_ptr(), attr.as_mut_ptr()) };
        if rc != 0 {
            // Dropping `ctx` closes the device again.
            return Err(DeviceError::Query {
                device: ctx.name.clone(),
                what: "attributes".to_owned(),
                source: errno_from_rc(rc),
            });
        }
        // SAFETY: all-zero is a valid `ibv_device_attr` (a plain C struct), and
        // the successful query has filled it in.
        ctx.attr = DeviceAttr::from_raw(unsafe { &attr.assume_init() });
        Ok(Arc::new(ctx))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's limits, as read when it was opened.
    pub fn attr(&self) -> &DeviceAttr {
        &self.attr
    }

    /// The current attributes of `port` (ports count from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, DeviceError> {
        let mut attr = MaybeUninit::<ibv_port_attr>::zeroed();
        // SAFETY: `self.raw` is an open context; `attr` is a writable, zeroed
        // `ibv_port_attr`, the size the inline wrapper passes to the provider.
        let rc = unsafe { ___ibv_query_port(self.raw.as_ptr(), port, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(DeviceError::Query {
                device: self.name.clone(),
                what: format!("port {port}"),
                source: errno_from_rc(rc),
            });
        }
        // SAFETY: zero-initialised plain C struct, filled in by the query.
        Ok(PortAttr::from_raw(port, unsafe { &attr.assume_init() }))
    }

    /// The raw context, for the verbs calls of the other modules.
    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.raw.as_ptr()
    }

    /// The first active port, or the first port and its state when none is active.
    pub(crate) fn first_active_port(&self) -> Result<Result<u8, (u8, PortState)>, DeviceError> {
        let mut first = None;
        for port in 1..=self.attr.phys_port_cnt.max(1) {
            let attr = self.query_port(port)?;
            if attr.state == PortState::Active {
                return Ok(Ok(port));
            }
            first.get_or_insert((port, attr.state));
        }
        Ok(Err(first.unwrap_or((1, PortState::Nop))))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: `self.raw` is open, and every PD (and so every MR) holds an
        // `Arc<Context>`, so nothing allocated from it outlives this call.
        let rc = unsafe { ibv_close_device(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.name, error = %errno_from_rc(rc), "ibv_close_device failed");
        }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A protection domain (`ibv_pd`): the scope in which memory regions and
/// queue pairs may be used together. Freed when the last `Arc` is dropped.
pub struct ProtectionDomain {
    raw: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: a PD is only passed to thread-safe verbs; it has no interior state.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; all methods take `&self`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocate a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>, DeviceError> {
        // Before the first registration, which needs a PD.
        fork_protection();
        // SAFETY: `ctx` is an open context, kept open by the clone stored below.
        let raw = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        match NonNull::new(raw) {
            Some(raw) => Ok(Arc::new(Self { raw, ctx: Arc::clone(ctx) })),
            None => Err(DeviceError::AllocPd {
                device: ctx.name.clone(),
                source: std::io::Error::last_os_error(),
            }),
        }
    }

    /// The context this domain belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw domain, for the verbs calls of the other modules.
    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is a live PD; every MR holds an `Arc` of it, so
        // none is left, and `self.ctx` keeps the device open until after this.
        let rc = unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.name, error = %errno_from_rc(rc), "ibv_dealloc_pd failed");
        }
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain").field("device", &self.ctx.name).finish_non_exhaustive()
    }
}

/// A device's limits (a subset of `ibv_device_attr`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most outstanding work requests per queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries per work request.
    pub max_sge: u32,
    /// Most completion queues.
    pub max_cq: u32,
    /// Most entries per completion queue.
    pub max_cqe: u32,
    /// Most shared receive queues.
    pub max_srq: u32,
    /// Most outstanding receives per shared receive queue.
    pub max_srq_wr: u32,
    /// Most multicast groups.
    pub max_mcast_grp: u32,
    /// Most queue pairs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Most RDMA READs (and atomics) a queue pair may have outstanding as
    /// their target (its responder resources).
    pub max_qp_rd_atom: u32,
    /// Most RDMA READs (and atomics) a queue pair may have outstanding as
    /// their initiator (its initiator depth).
    pub max_qp_init_rd_atom: u32,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
}

impl DeviceAttr {
    fn from_raw(raw: &ibv_device_attr) -> Self {
        let count = |v: c_int| u32::try_from(v).unwrap_or(0);
        // `fw_ver` is a fixed-size C string: read it up to the first NUL.
        let fw: Vec<u8> = raw.fw_ver.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        Self {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            max_mr_size: raw.max_mr_size,
            max_mr: count(raw.max_mr),
            max_pd: count(raw.max_pd),
            max_qp: count(raw.max_qp),
            max_qp_wr: count(raw.max_qp_wr),
            max_sge: count(raw.max_sge),
            max_cq: count(raw.max_cq),
            max_cqe: count(raw.max_cqe),
            max_srq: count(raw.max_srq),
            max_srq_wr: count(raw.max_srq_wr),
            max_mcast_grp: count(raw.max_mcast_grp),
            max_mcast_qp_attach: count(raw.max_mcast_qp_attach),
            max_qp_rd_atom: count(raw.max_qp_rd_atom),
            max_qp_init_rd_atom: count(raw.max_qp_init_rd_atom),
            phys_port_cnt: raw.phys_port_cnt,
        }
    }
}

/// The state of a port (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortState {
    /// No state change (`IBV_PORT_NOP`).
    Nop,
    /// Link down.
    Down,
    /// Link up, not yet configured.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Usable: the only state in which traffic flows.
    Active,
    /// Active, waiting for the link to be confirmed.
    ActiveDefer,
    /// A value this crate does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(state: ibv_port_state::Type) -> Self {
        match state {
            ibv_port_state::IBV_PORT_NOP => Self::Nop,
            ibv_port_state::IBV_PORT_DOWN => Self::Down,
            ibv_port_state::IBV_PORT_INIT => Self::Init,
            ibv_port_state::IBV_PORT_ARMED => Self::Armed,
            ibv_port_state::IBV_PORT_ACTIVE => Self::Active,
            ibv_port_state::IBV_PORT_ACTIVE_DEFER => Self::ActiveDefer,
            other => Self::Other(other),
        }
    }
}

impl fmt::Display for PortState {
    /// The names `ibv_devinfo` prints, such as `PORT_ACTIVE`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nop => f.write_str("PORT_NOP"),
            Self::Down => f.write_str("PORT_DOWN"),
            Self::Init => f.write_str("PORT_INIT"),
            Self::Armed => f.write_str("PORT_ARMED"),
            Self::Active => f.write_str("PORT_ACTIVE"),
            Self::ActiveDefer => f.write_str("PORT_ACTIVE_DEFER"),
            Self::Other(v) => write!(f, "unknown state {v}"),
        }
    }
}

/// A port's current attributes (a subset of `ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Port number (from 1).
    pub port: u8,
    /// Port state.
    pub state: PortState,
    /// Active path MTU in bytes (256 to 4096).
    pub active_mtu: u32,
    /// Largest path MTU the port supports, in bytes.
    pub max_mtu: u32,
    /// Largest message size, in bytes.
    pub max_msg_sz: u32,
    /// Number of entries in the port's GID table.
    pub gid_tbl_len: u32,
    /// Whether the link layer is Ethernet (RoCE) rather than InfiniBand.
    pub ethernet: bool,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
}

impl PortAttr {
    fn from_raw(port: u8, raw: &ibv_port_attr) -> Self {
        Self {
            port,
            state: PortState::from_raw(raw.state),
            active_mtu: mtu_bytes(raw.active_mtu),
            max_mtu: mtu_bytes(raw.max_mtu),
            max_msg_sz: raw.max_msg_sz,
            gid_tbl_len: u32::try_from(raw.gid_tbl_len).unwrap_or(0),
            ethernet: raw.link_layer == LINK_LAYER_ETHERNET,
            lid: raw.lid,
        }
    }
}

/// Bytes of an `ibv_mtu` value (0 for an unknown one).
fn mtu_bytes(mtu: ibv_mtu::Type) -> u32 {
    match mtu {
        ibv_mtu::IBV_MTU_256..=ibv_mtu::IBV_MTU_4096 => 128 << mtu,
        _ => 0,
    }
}

/// The process's device list; freed on drop. Opened contexts outlive it.
struct DeviceList {
    raw: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self, DeviceError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer for the device count.
        let raw = unsafe { ibv_get_device_list(&mut n) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(DeviceError::List { source: std::io::Error::last_os_error() });
        };
        Ok(Self { raw, len: usize::try_from(n).unwrap_or(0) })
    }

    /// Each device with its name.
    fn iter(&self) -> impl Iterator<Item = (*mut ibv_device, String)> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: the list holds `len` valid entries while `self` lives.
            let dev = unsafe { *self.raw.as_ptr().add(i) };
            // SAFETY: `dev` is a live list entry; the name is a NUL-terminated
            // string owned by it (or NULL, handled below).
            let name = unsafe { ibv_get_device_name(dev) };
            let name = if name.is_null() {
                format!("device{i}")
            } else {
                // SAFETY: non-NULL, NUL-terminated, valid while the list lives.
                unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
            };
            (dev, name)
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from `ibv_get_device_list` and is freed once;
        // contexts opened from its entries stay valid after this.
        unsafe { ibv_free_device_list(self.raw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_values_are_bytes() {
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_256), 256);
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_1024), 1024);
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_4096), 4096);
        assert_eq!(mtu_bytes(0), 0);
    }

    #[test]
    fn port_state_prints_like_ibv_devinfo() {
        assert_eq!(PortState::from_raw(ibv_port_state::IBV_PORT_ACTIVE).to_string(), "PORT_ACTIVE");
        assert_eq!(PortState::from_raw(42), PortState::Other(42));
    }
}

/// How registered memory is protected across `fork` in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForkProtection {
    /// The kernel keeps pinned pages correct across `fork` by itself
    /// (Linux 5.13 and later with rdma-core 35 and later): nothing to do.
    Kernel,
    /// libibverbs marks every registered range `MADV_DONTFORK`
    /// (`ibv_fork_init` succeeded).
    Libibverbs,
    /// Neither: memory was registered in this process (by other code)
    /// before zerocast could ask. zerocast's own pool regions are still
    /// `MADV_DONTFORK`.
    PoolOnly,
}

/// Ask libibverbs, once per process and before zerocast registers any
/// memory, to protect registered memory across `fork` (`ibv_fork_init`),
/// and report which protection is in effect. zerocast's pool regions and
/// header slabs are `MADV_DONTFORK` in any case, so a child process never
/// shares a page a device may be writing.
pub fn fork_protection() -> ForkProtection {
    static STATE: OnceLock<ForkProtection> = OnceLock::new();
    *STATE.get_or_init(|| {
        // SAFETY: `ibv_fork_init` takes no arguments and only sets up
        // libibverbs' own bookkeeping; it fails harmlessly (EINVAL) when
        // memory was registered before it.
        let rc = unsafe { ibv_fork_init() };
        // SAFETY: a plain query of libibverbs' state.
        let status = unsafe { ibv_is_fork_initialized() };
        let p = match status {
            rdma_sys::IBV_FORK_UNNEEDED => ForkProtection::Kernel,
            rdma_sys::IBV_FORK_ENABLED => ForkProtection::Libibverbs,
            _ => ForkProtection::PoolOnly,
        };
        tracing::debug!(rc, protection = ?p, "fork protection of registered memory");
        p
    })
}
