//! Memory registration: [`MemoryRegion`] and the pool's [`VerbsRegistrar`].

use std::fmt;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr};
use zerocast_mem::{Keys, RegisterError, Registrar, Registration};

use crate::device::ProtectionDomain;
use crate::error::errno_from_rc;

/// What a registration lets the local device and remote peers do with the
/// memory it covers.
///
/// zerocast's own regions are [`Access::Local`]: no peer can reach them,
/// whatever key it guesses or replays. Remote access is granted per
/// message or per [`OneSided::expose`](crate::OneSided::expose), on a
/// registration of exactly the exposed bytes, and revoked by dropping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// The local device may read the memory (sends) and write it
    /// (receives, and the target of this side's RDMA READs). No remote
    /// access.
    Local,
    /// A peer holding the region's rkey may RDMA READ it. Nothing may
    /// write it through this registration.
    RemoteRead,
    /// Local write, and a peer holding the rkey may RDMA READ and WRITE it.
    RemoteReadWrite,
}

impl Access {
    fn flags(self) -> ibv_access_flags {
        use ibv_access_flags as f;
        match self {
            Access::Local => f::IBV_ACCESS_LOCAL_WRITE,
            Access::RemoteRead => f::IBV_ACCESS_REMOTE_READ,
            Access::RemoteReadWrite => {
                f::IBV_ACCESS_LOCAL_WRITE | f::IBV_ACCESS_REMOTE_READ | f::IBV_ACCESS_REMOTE_WRITE
            }
        }
    }
}

/// A registered memory region (`ibv_mr`). Deregistered on drop, before its
/// protection domain can be freed.
///
/// The region does not own the memory it covers: whoever registered it keeps
/// that memory alive and in place until the region is dropped.
pub struct MemoryRegion {
    raw: NonNull<ibv_mr>,
    pd: Arc<ProtectionDomain>,
    len: usize,
}

// SAFETY: an MR is an immutable handle once registered; deregistering it is a
// thread-safe verb, so it may be moved to and dropped on any thread.
unsafe impl Send for MemoryRegion {}
// SAFETY: `&self` methods only read the keys, which never change.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Register `len` bytes at `addr` in `pd`, with `access`.
    ///
    /// Fails with [`RegisterError::MemLock`] when the locked-memory limit is
    /// too small (`ulimit -l`), [`RegisterError::Device`] otherwise.
    ///
    /// # Safety
    /// `addr..addr + len` must be memory of this process that stays allocated,
    /// and is not unmapped or moved, until the returned region is dropped: the
    /// device, and through it remote peers as `access` allows, may read and
    /// write it all that time, with no borrow the compiler sees. The caller
    /// must not hold references to the memory that assume no other writer
    /// while the device may write it.
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        addr: NonNull<u8>,
        len: usize,
        access: Access,
    ) -> Result<Self, RegisterError> {
        // The flags are small bit values (0x1 | 0x2 | 0x4): the cast is lossless.
        let access = access.flags().0 as c_int;
        let device = pd.context().name();
        // SAFETY: `pd` is a live PD (held by the returned region); the caller
        // guarantees the memory range stays valid while the region lives.
        let raw = unsafe { ibv_reg_mr(pd.as_ptr(), addr.as_ptr().cast(), len, access) };
        match NonNull::new(raw) {
            Some(raw) => Ok(Self { raw, pd: Arc::clone(pd), len }),
            None => Err(RegisterError::from_os(device, len, std::io::Error::last_os_error())),
        }
    }

    /// The region's local and remote keys.
    pub fn keys(&self) -> Keys {
        // SAFETY: `self.raw` points to the live `ibv_mr` filled in by
        // `ibv_reg_mr`; its keys are plain fields that never change.
        let mr = unsafe { self.raw.as_ref() };
        Keys { lkey: mr.lkey, rkey: mr.rkey }
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is a live MR, deregistered exactly once, while
        // `self.pd` still keeps its PD and context alive.
        let rc = unsafe { ibv_dereg_mr(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                device = %self.pd.context().name(),
                error = %errno_from_rc(rc),
                "ibv_dereg_mr failed"
            );
        }
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("device", &self.pd.context().name())
            .field("len", &self.len)
            .field("keys", &self.keys())
            .finish()
    }
}

/// Registers a zerocast pool's regions with a verbs device.
///
/// Each registration keeps its [`MemoryRegion`], which keeps the protection
/// domain, so the pool can outlive the registrar itself.
///
/// Regions are registered [`Access::Local`] unless built
/// [`VerbsRegistrar::with_access`]: then every peer that learns a region's
/// rkey may read (and write) every buffer of that region, for as long as
/// the pool lives. Only a pool whose peers are all trusted should ask for it.
#[derive(Debug, Clone)]
pub struct VerbsRegistrar {
    pd: Arc<ProtectionDomain>,
    access: Access,
}

impl VerbsRegistrar {
    /// A registrar that registers into `pd`, for the local device only.
    pub fn new(pd: Arc<ProtectionDomain>) -> Self {
        Self::with_access(pd, Access::Local)
    }

    /// A registrar that registers into `pd` with `access` (see the type's
    /// documentation before granting remote access to a whole pool).
    pub fn with_access(pd: Arc<ProtectionDomain>, access: Access) -> Self {
        Self { pd, access }
    }

    /// The protection domain regions are registered in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Registrar for VerbsRegistrar {
    unsafe fn register(&self, addr: NonNull<u8>, len: usize) -> Result<Registration, RegisterError> {
        // SAFETY: the `Registrar::register` contract, which our caller
        // upholds, is `MemoryRegion::register`'s: the memory stays allocated
        // and in place until the returned `Registration` (which owns the MR)
        // has been dropped.
        let mr = unsafe { MemoryRegion::register(&self.pd, addr, len, self.access) }?;
        tracing::debug!(device = %self.name(), len, keys = ?mr.keys(), "registered region");
        Ok(Registration::new(mr.keys(), mr))
    }

    fn name(&self) -> &str {
        self.pd.context().name()
    }

    fn pins_memory(&self) -> bool {
        true
    }
}
