//! [`Buf`]: an owned handle to one pool buffer.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::ptr::NonNull;
use std::slice;

use crate::chunk::Lender;
use crate::class::encode;
use crate::error::PoolError;
use crate::pool::PoolInner;
use crate::registrar::Keys;

/// An owned pool buffer: `capacity()` bytes of registered memory, of which the
/// first `len()` are its contents.
///
/// Dropping it puts the buffer back on its class's free list (waking one
/// waiter, if any). It keeps the pool's memory alive, so it may outlive every
/// [`Pool`](crate::Pool) handle; it does so with a reference the pool
/// counts in batches per thread, not with an `Arc` of its own, so taking
/// and dropping buffers touches no counter shared between threads. Its
/// bytes never move while it lives
/// ([`StableDeref`](stable_deref_trait::StableDeref)), so `addr()` may go into
/// a scatter/gather entry.
///
/// Contents are not cleared between uses: a fresh `Buf` holds whatever its
/// previous owner left (zeros the first time).
///
/// A `Buf` may also be a *lent* part of a larger buffer
/// ([`Chunk::lend`](crate::Chunk::lend)): its capacity is then its length
/// when lent, its address need not be aligned, and dropping it gives the
/// part back to the buffer it was lent from, which goes back to the pool
/// with its last part.
pub struct Buf {
    ptr: NonNull<u8>,
    len: usize,
    /// The size class, or [`LENT`] for a lent part.
    class: u32,
    region: u32,
    /// The slot in its region; for a lent part, its capacity.
    slot: u32,
    /// The pool, kept alive by this buffer's reference (see `refs.rs`);
    /// for a lent part, the `chunk::Lender` it was lent from, cast.
    pool: NonNull<PoolInner>,
}

/// The class of a lent part ([`crate::Chunk::lend`]): no class has this
/// index (a pool has fewer than `u32::MAX` classes, validated).
pub(crate) const LENT: u32 = u32::MAX;

// SAFETY: a `Buf` is the only handle to its bytes (its slot was popped off the
// free list and goes back only when the `Buf` drops), like a `Box<[u8]>`; the
// region memory is plain process memory, and `PoolInner` is `Send + Sync`
// (the pool pointer is shared like an `Arc<PoolInner>`: only `&PoolInner`
// is made from it, and its reference is given up once, in `drop`).
unsafe impl Send for Buf {}
// SAFETY: `&Buf` gives out only `&[u8]` and plain values; mutation needs `&mut Buf`.
unsafe impl Sync for Buf {}

impl Buf {
    /// Wrap a slot just taken from class `class` of `pool`, with the
    /// reference of the pool taken for it.
    #[inline(always)]
    pub(crate) fn new(pool: &PoolInner, class: u32, region: u32, slot: u32, len: usize) -> Self {
        let ptr = pool.classes[class as usize].slot_ptr(region, slot);
        Self { ptr, len, class, region, slot, pool: NonNull::from(pool) }
    }

    /// A lent part of `len` bytes at `ptr`, holding one reference of
    /// `lender` (see [`crate::Chunk`]).
    pub(crate) fn lent(ptr: NonNull<u8>, len: u32, lender: NonNull<Lender>) -> Self {
        Self { ptr, len: len as usize, class: LENT, region: 0, slot: len, pool: lender.cast() }
    }

    /// The whole buffer a lent part was lent from; `None` for a pool buffer.
    fn lender(&self) -> Option<&Buf> {
        if self.class != LENT {
            return None;
        }
        // SAFETY: a lent part's `pool` is its lender (`Buf::lent`), which
        // the part's reference keeps alive while the part lives.
        Some(unsafe { self.pool.cast::<Lender>().as_ref() }.whole())
    }

    fn inner(&self) -> &PoolInner {
        debug_assert_ne!(self.class, LENT, "a lent part has no pool of its own");
        // SAFETY: this buffer holds a reference of the pool (taken when it
        // was handed out, given up only in `drop`), so the pool is alive.
        unsafe { self.pool.as_ref() }
    }

    /// Length of the contents.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the contents are empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of the buffer: its class size, at least the size asked for.
    pub fn capacity(&self) -> usize {
        if self.class == LENT {
            return self.slot as usize;
        }
        self.inner().classes[self.class as usize].layout.size
    }

    /// Set the length of the contents, typically after writing through
    /// [`spare_capacity`](Self::spare_capacity) or after a receive.
    ///
    /// # Panics
    ///
    /// If `len > capacity()`: that is a caller bug. Use
    /// [`try_set_len`](Self::try_set_len) where the length comes from outside
    /// (a peer, a completion).
    #[track_caller]
    pub fn set_len(&mut self, len: usize) {
        if let Err(e) = self.try_set_len(len) {
            panic!("Buf::set_len: {e}");
        }
    }

    /// Set the length of the contents, or fail if `len > capacity()`.
    pub fn try_set_len(&mut self, len: usize) -> Result<(), PoolError> {
        let capacity = self.capacity();
        if len > capacity {
            return Err(PoolError::LenOverCapacity { len, capacity });
        }
        self.len = len;
        Ok(())
    }

    /// The whole buffer, `[0..capacity()]`, to write into before
    /// [`set_len`](Self::set_len). The memory is always initialized (zeroed
    /// when its region was mapped), so this is a plain slice.
    pub fn spare_capacity(&mut self) -> &mut [u8] {
        let cap = self.capacity();
        // SAFETY: `ptr` points at `capacity()` bytes inside a live region
        // (the buffer's reference of the pool keeps it mapped), initialized
        // since mapping, owned by this `Buf` alone; `&mut self` makes the
        // borrow exclusive.
        unsafe { slice::from_raw_parts_mut(self.ptr.as_ptr(), cap) }
    }

    /// Address of byte 0, for scatter/gather entries and remote access.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// The keys of the region this buffer lives in.
    pub fn keys(&self) -> Keys {
        if let Some(whole) = self.lender() {
            return whole.keys();
        }
        self.inner().classes[self.class as usize].keys(self.region)
    }

    /// Id of the region this buffer lives in, unique within its pool
    /// (regions are numbered 0, 1, 2, … in creation order across all classes).
    pub fn region_id(&self) -> u32 {
        if let Some(whole) = self.lender() {
            return whole.region_id();
        }
        self.inner().classes[self.class as usize].region_id(self.region)
    }
}

impl Drop for Buf {
    #[inline]
    fn drop(&mut self) {
        if self.class == LENT {
            // SAFETY: a lent part holds one reference of its lender
            // (`Buf::lent`), given back here, once.
            unsafe { Lender::release(self.pool.cast(), 1) };
            return;
        }
        // SAFETY: this buffer's reference of the pool is given up here, once.
        unsafe { crate::cache::put(self.pool, self.class as usize, encode(self.region, self.slot)) };
    }
}

// Like `Box<[u8]>`: a panic cannot leave a `Buf` half-updated, and the pool
// behind it is unwind-safe (see `Pool`).
impl UnwindSafe for Buf {}
impl RefUnwindSafe for Buf {}

impl Deref for Buf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `len <= capacity()` (checked by `try_set_len`, and by
        // `Pool::alloc` choosing a big enough class); the bytes are live,
        // initialized and owned by this `Buf`, and `&self` allows no writer.
        unsafe { slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow exclusive.
        unsafe { slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: `deref` returns a slice into region memory at `ptr`, which is fixed
// for the `Buf`'s life: moving the `Buf` moves only the handle, and the region
// is neither moved nor unmapped while the `Buf` (holding a reference of the
// pool) lives. Hence the address is stable across moves of the `Buf`.
unsafe impl stable_deref_trait::StableDeref for Buf {}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("region_id", &self.region_id())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Pool, PoolConfig, PoolError, Wait};

    fn pool() -> Pool {
        Pool::unregistered(
            PoolConfig::default().with_classes([100, 4096]).with_region_size(8192).with_max_bytes(64 << 10),
        )
        .unwrap()
    }

    #[test]
    fn len_and_capacity() {
        let p = pool();
        let mut b = p.alloc(10, Wait::No).unwrap();
        assert_eq!((b.len(), b.capacity(), b.is_empty()), (10, 100, false));
        b.set_len(0);
        assert!(b.is_empty() && b.as_ref().is_empty());
        b.spare_capacity()[..5].copy_from_slice(b"hello");
        b.set_len(5);
        assert_eq!(&*b, b"hello");
        b.as_mut()[0] = b'j';
        assert_eq!(b.as_ref(), b"jello");
        b.set_len(100);
        assert_eq!(b.len(), 100);
        match b.try_set_len(101) {
            Err(PoolError::LenOverCapacity { len: 101, capacity: 100 }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(b.len(), 100);
        assert_eq!(b.addr() % 64, 0, "buffers are 64-byte aligned");
        let dbg = format!("{b:?}");
        assert!(dbg.contains("capacity: 100"), "{dbg}");
    }

    #[test]
    #[should_panic(expected = "exceeds the buffer's capacity")]
    fn set_len_over_capacity_panics() {
        let p = pool();
        let mut b = p.alloc(0, Wait::No).unwrap();
        b.set_len(101);
    }

    #[test]
    fn address_is_stable_across_moves() {
        let p = pool();
        let b = p.alloc(4000, Wait::No).unwrap();
        let (addr, data) = (b.addr(), b.as_ptr() as u64);
        let moved = Box::new(b);
        assert_eq!((moved.addr(), moved.as_ptr() as u64), (addr, data));
    }

    #[test]
    fn is_send_sync_and_outlives_pool() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::Buf>();
        let p = pool();
        let mut b = p.alloc(3, Wait::No).unwrap();
        drop(p);
        b.copy_from_slice(b"abc");
        let b = std::thread::spawn(move || b).join().unwrap();
        assert_eq!(&*b, b"abc");
    }
}
