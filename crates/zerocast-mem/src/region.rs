//! One region: an anonymous `mmap`, registered once, deregistered before it is unmapped.

use std::fmt;
use std::io;
use std::ptr::NonNull;

use crate::config::PAGE;
use crate::error::PoolError;
use crate::registrar::{Keys, Registrar, Registration};

/// Page-aligned, zero-filled anonymous memory, unmapped on drop.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `Mapping` is a plain owner of process memory, like `Box<[u8]>`; it
// gives out only the raw base pointer, and whoever dereferences it takes on the
// aliasing rules. Nothing in it is tied to the creating thread.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` only exposes `base` and `len` by value.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(len: usize) -> Result<Self, PoolError> {
        debug_assert!(len > 0 && len % PAGE == 0);
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing touches no existing memory; every argument is valid.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            tracing::warn!(bytes = len, error = %err, "mmap of a pool region failed");
            return Err(PoolError::Alloc { bytes: len });
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or(PoolError::Alloc { bytes: len })?;
        Ok(Self { base, len })
    }

    /// Keep the mapping out of children this process forks
    /// (`MADV_DONTFORK`): in a child the range is simply not mapped.
    fn dont_fork(&self) -> Result<(), PoolError> {
        // SAFETY: `base`/`len` are exactly our live mapping (page-aligned,
        // as mmap returned it); the advice changes only what a future
        // fork copies, not this process's view of the memory.
        let rc = unsafe { libc::madvise(self.base.as_ptr().cast(), self.len, libc::MADV_DONTFORK) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            tracing::warn!(bytes = self.len, error = %err, "madvise(MADV_DONTFORK) of a pool region failed");
            return Err(PoolError::Alloc { bytes: self.len });
        }
        Ok(())
    }

    /// Write one byte per page so every page is backed now, not at first use.
    fn prefault(&self) {
        for off in (0..self.len).step_by(PAGE) {
            // SAFETY: `off < len`, so the pointer lies inside our live, writable
            // mapping; nothing else references the memory yet (the region has
            // not been handed to anyone). Writing the zero that is already
            // there keeps the contents unchanged; the volatile write keeps the
            // compiler from dropping it.
            unsafe { self.base.as_ptr().add(off).write_volatile(0) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned and asked for, the
        // mapping is still live (unmapped only here), and no reference into it
        // outlives the owning region (buffers keep the pool, hence the region, alive).
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        if rc != 0 {
            tracing::error!(bytes = self.len, error = %io::Error::last_os_error(), "munmap of a pool region failed");
        }
    }
}

/// A registered region. Its memory is valid, and does not move, until the
/// region is dropped; the registration is dropped (deregistered) first.
pub(crate) struct Region {
    /// `Some` until `drop`, which takes it out to deregister before unmapping.
    registration: Option<Registration>,
    mem: Mapping,
}

impl Region {
    /// Map `len` bytes (a multiple of [`PAGE`]), optionally prefault them, and
    /// register them. A registrar that pins memory gets a mapping that forked
    /// children do not inherit. On failure nothing is left behind: the mapping is
    /// unmapped before the error is returned.
    pub(crate) fn new(len: usize, prefault: bool, registrar: &dyn Registrar) -> Result<Self, PoolError> {
        let mem = Mapping::new(len)?;
        if prefault {
            mem.prefault();
        }
        if registrar.pins_memory() {
            mem.dont_fork()?;
        }
        // SAFETY: `mem` is a live anonymous mapping of `len` bytes that this
        // region owns; `Drop for Region` drops the registration before the
        // mapping is unmapped, and a mapping never moves. Nothing refers to
        // the memory yet; buffers carved from it follow the pool's
        // ownership rules.
        let registration = unsafe { registrar.register(mem.base, len) }.inspect_err(|e| {
            tracing::warn!(bytes = len, registrar = registrar.name(), error = %e, "registering a pool region failed");
        })?;
        Ok(Self { registration: Some(registration), mem })
    }

    /// First byte of the region; page-aligned.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.mem.base
    }

    /// The keys the registrar handed out for this region.
    pub(crate) fn keys(&self) -> Keys {
        self.registration.as_ref().map(Registration::keys).unwrap_or_default()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Deregister while the memory is still mapped; `mem` is unmapped when
        // the fields drop, after this.
        drop(self.registration.take());
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("base", &self.mem.base)
            .field("len", &self.mem.len)
            .field("keys", &self.keys())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registrar::NoopRegistrar;

    #[test]
    fn mapped_zeroed_and_page_aligned() {
        for prefault in [false, true] {
            let r = Region::new(3 * PAGE, prefault, &NoopRegistrar).unwrap();
            assert_eq!(r.base().as_ptr() as usize % PAGE, 0);
            // SAFETY: the region is live and 3 pages long; nothing else refers to it.
            let bytes = unsafe { std::slice::from_raw_parts(r.base().as_ptr(), 3 * PAGE) };
            assert!(bytes.iter().all(|&b| b == 0));
            assert_eq!(r.keys(), Keys::default());
        }
    }

    #[test]
    fn impossible_mapping_is_an_alloc_error() {
        let len = (isize::MAX as usize) / PAGE * PAGE;
        match Region::new(len, false, &NoopRegistrar) {
            Err(PoolError::Alloc { bytes }) => assert_eq!(bytes, len),
            other => panic!("expected Alloc, got {other:?}"),
        }
    }
}
