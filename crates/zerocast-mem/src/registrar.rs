//! The registration hook: how a backend makes a pool region usable by its device.

use std::any::Any;
use std::fmt;
use std::io;
use std::ptr::NonNull;

/// Keys a device uses to address a registered region.
///
/// `lkey` goes into local scatter/gather entries; `rkey` is what a peer needs
/// for one-sided access. A no-op registrar reports zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Keys {
    /// Local key (verbs `ibv_mr::lkey`).
    pub lkey: u32,
    /// Remote key (verbs `ibv_mr::rkey`).
    pub rkey: u32,
}

/// A live registration of one region. Dropping it deregisters the region.
///
/// The pool keeps the `Registration` inside the region and drops it before
/// the region's memory is freed, so a device never sees freed memory.
pub struct Registration {
    keys: Keys,
    // Held only for its `Drop` (for RDMA: the `ibv_mr` wrapper calling `ibv_dereg_mr`).
    _guard: Option<Box<dyn Any + Send + Sync>>,
}

impl Registration {
    /// A registration whose `guard` undoes it when dropped.
    pub fn new(keys: Keys, guard: impl Any + Send + Sync) -> Self {
        Self { keys, _guard: Some(Box::new(guard)) }
    }

    /// A registration that needs no undoing (plain host memory, TCP, in-process).
    pub fn unregistered() -> Self {
        Self { keys: Keys::default(), _guard: None }
    }

    /// The region's keys.
    pub fn keys(&self) -> Keys {
        self.keys
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").field("keys", &self.keys).finish_non_exhaustive()
    }
}

/// Registers pool regions with a device. Called once per region, when the
/// region is created; the returned [`Registration`] is dropped when the
/// region is released.
///
/// # Safety of implementing
/// Implementing the trait is safe; calling [`Registrar::register`] is not,
/// because a registration lets a device (and, through it, remote peers if
/// the implementation grants them access) read and write the memory with
/// no borrow the compiler can see.
pub trait Registrar: Send + Sync + 'static {
    /// Register `len` bytes at `addr` for the device.
    ///
    /// # Safety
    /// `addr..addr + len` must be memory of this process, allocated,
    /// mapped and not moved from the call until the returned
    /// [`Registration`] has been dropped. While it lives the device may
    /// write the memory at any time: the caller must not hand out
    /// references to it that assume no other writer, except as the
    /// transport's ownership rules allow (a buffer posted to the device is
    /// owned by the in-flight table until its completion is polled). A
    /// stack array or a `Vec` that may be dropped or reallocated before
    /// the registration is dropped breaks this contract.
    unsafe fn register(&self, addr: NonNull<u8>, len: usize) -> Result<Registration, RegisterError>;

    /// A short name for logs and errors, such as `"noop"` or `"rxe0"`.
    fn name(&self) -> &str;

    /// Whether a registration pins the memory for a device's DMA. The pool
    /// then keeps its regions out of forked children (`MADV_DONTFORK`): a
    /// child never shares, and so never copies on write, a page the device
    /// may be writing, and a fork does not copy the pinned pool.
    fn pins_memory(&self) -> bool {
        false
    }
}

/// The registrar for transports that need no registration (TCP, UDP, in-process).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopRegistrar;

impl Registrar for NoopRegistrar {
    unsafe fn register(&self, _addr: NonNull<u8>, _len: usize) -> Result<Registration, RegisterError> {
        Ok(Registration::unregistered())
    }

    fn name(&self) -> &str {
        "noop"
    }
}

/// Why a region could not be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The locked-memory limit is too small for the region.
    #[error(
        "memlock limit {} too small to register {requested} bytes; raise `ulimit -l` \
         (or LimitMEMLOCK= for a systemd service), or shrink the pool",
        fmt_limit(*.limit)
    )]
    MemLock {
        /// `RLIMIT_MEMLOCK` soft limit in bytes, `None` when unlimited or unknown.
        limit: Option<u64>,
        /// Bytes the registration asked for.
        requested: usize,
        /// The device's error.
        #[source]
        source: io::Error,
    },
    /// The device refused the registration for another reason.
    #[error("registering {requested} bytes with {device} failed")]
    Device {
        /// Device name.
        device: String,
        /// Bytes the registration asked for.
        requested: usize,
        /// The device's error (errno).
        #[source]
        source: io::Error,
    },
}

fn fmt_limit(limit: Option<u64>) -> String {
    match limit {
        Some(l) if l >= 1 << 20 => format!("{} MiB", l >> 20),
        Some(l) if l >= 1 << 10 => format!("{} KiB", l >> 10),
        Some(l) => format!("{l} bytes"),
        None => "unlimited".to_owned(),
    }
}

/// The current `RLIMIT_MEMLOCK` soft limit, `None` when unlimited.
pub fn memlock_limit() -> Option<u64> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is a valid, writable `rlimit`; getrlimit only writes to it.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    if rc != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(rl.rlim_cur)
    }
}

impl RegisterError {
    /// Build the right error for a failed registration: `ENOMEM`/`EPERM`/`EAGAIN`
    /// become [`RegisterError::MemLock`], with the current limit.
    pub fn from_os(device: &str, requested: usize, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN) => {
                RegisterError::MemLock { limit: memlock_limit(), requested, source }
            }
            _ => RegisterError::Device { device: device.to_owned(), requested, source },
        }
    }
}
