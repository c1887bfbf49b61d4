//! [`Chunk`]: one pool buffer whose bytes are lent out in parts, each a
//! [`Buf`] of its own.
//!
//! A stream's reader reads many frames at once into a buffer; lending each
//! frame's payload where it lies, instead of copying it into a buffer of
//! its own, spares an allocation, a copy and a release per message. The
//! whole buffer goes back to the pool with the last of its parts, or with
//! the chunk, whichever goes last.
//!
//! The count of references lives beside the whole buffer in a heap cell
//! (`Lender`), not in pool memory, which a device may write. The chunk
//! takes a reserve of references when it is made, and each part it lends
//! takes one of them, so lending touches no shared counter; the count is
//! always `1 + reserve + parts alive`, and the chunk's bytes are free again
//! when it is `1 + reserve`.
//!
//! The chunk only ever shows bytes at or past the end of what it lent
//! ([`Chunk::lent`]), so no slice of it aliases a part.

use std::ops::Range;
use std::ptr::NonNull;
use std::slice;
use std::sync::atomic::{fence, AtomicUsize, Ordering};

use crate::Buf;

/// References a chunk takes at once for the parts it will lend.
const RESERVE: usize = 1 << 20;

/// The whole buffer and its count of references: one for the chunk, plus
/// the chunk's reserve, plus one for each part alive.
pub(crate) struct Lender {
    count: AtomicUsize,
    whole: Buf,
}

impl Lender {
    /// The buffer the parts are lent from.
    pub(crate) fn whole(&self) -> &Buf {
        &self.whole
    }

    /// Give back `n` references of `lender`; the last one frees it, and its
    /// buffer goes back to the pool.
    ///
    /// # Safety
    ///
    /// The caller holds `n` references of `lender` and uses neither them
    /// nor `lender` after this call.
    #[inline]
    pub(crate) unsafe fn release(lender: NonNull<Lender>, n: usize) {
        // SAFETY: the caller's references keep `lender` alive until here.
        if unsafe { lender.as_ref() }.count.fetch_sub(n, Ordering::Release) == n {
            // SAFETY: that was the last reference (the caller's promise).
            unsafe { Self::free(lender) };
        }
    }

    /// # Safety
    ///
    /// `lender` came from `Box::into_raw` in [`Chunk::new`] and no
    /// reference of it is left.
    #[cold]
    #[inline(never)]
    unsafe fn free(lender: NonNull<Lender>) {
        // Every part's use of its bytes happens before the buffer goes back.
        fence(Ordering::Acquire);
        // SAFETY: see the function's contract.
        drop(unsafe { Box::from_raw(lender.as_ptr()) });
    }
}

/// A pool buffer that lends its bytes out in parts ([`Chunk::lend`]).
///
/// Bytes before [`lent`](Self::lent) may belong to parts still alive, so
/// the chunk shows only bytes at or past it; [`reuse`](Self::reuse) starts
/// again from byte 0 once every part is gone.
///
/// ```
/// use zerocast_mem::{Chunk, Pool, PoolConfig, Wait};
///
/// let pool = Pool::unregistered(PoolConfig::default().with_max_bytes(16 << 20))?;
/// let mut chunk = Chunk::new(pool.alloc(8192, Wait::No)?);
/// chunk.bytes_mut(0..10).copy_from_slice(b"helloworld");
/// let hello = chunk.lend(0..5);
/// let world = chunk.lend(5..10);
/// assert_eq!((&*hello, &*world), (&b"hello"[..], &b"world"[..]));
/// assert!(!chunk.reuse(), "parts are alive");
/// drop((hello, world));
/// assert!(chunk.reuse());
/// drop(chunk);
/// assert_eq!(pool.stats().buffers_in_use, 0);
/// # Ok::<(), zerocast_mem::PoolError>(())
/// ```
pub struct Chunk {
    lender: NonNull<Lender>,
    base: NonNull<u8>,
    capacity: usize,
    lent: usize,
    /// References held for parts not lent yet.
    reserve: usize,
}

// SAFETY: the chunk owns its references of the lender, whose count is
// atomic and whose buffer is `Send + Sync`; the bytes it shows never alias
// a part (see the module docs), wherever the parts are.
unsafe impl Send for Chunk {}
// SAFETY: `&Chunk` only reads bytes past `lent`, which no part holds.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Lend the bytes of `whole`, all of its capacity (at most 4 GiB of
    /// it). Its contents so far stay as they are.
    pub fn new(mut whole: Buf) -> Self {
        let capacity = whole.capacity().min(u32::MAX as usize);
        whole.set_len(capacity);
        let base = NonNull::from(whole.spare_capacity()).cast::<u8>();
        let lender = Box::new(Lender { count: AtomicUsize::new(1 + RESERVE), whole });
        // SAFETY: `Box::into_raw` is never null.
        let lender = unsafe { NonNull::new_unchecked(Box::into_raw(lender)) };
        Self { lender, base, capacity, lent: 0, reserve: RESERVE }
    }

    /// Bytes in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Where the bytes not lent since the last [`reuse`](Self::reuse) start.
    pub fn lent(&self) -> usize {
        self.lent
    }

    #[track_caller]
    fn check(&self, range: &Range<usize>) {
        assert!(
            self.lent <= range.start && range.start <= range.end && range.end <= self.capacity,
            "Chunk: bytes {range:?} of {}, lent up to {}",
            self.capacity,
            self.lent
        );
    }

    /// The bytes of `range`.
    ///
    /// # Panics
    ///
    /// If `range` starts before [`lent`](Self::lent) or ends past the
    /// capacity.
    #[track_caller]
    pub fn bytes(&self, range: Range<usize>) -> &[u8] {
        self.check(&range);
        // SAFETY: in bounds (checked), past every part, and no `&mut` of
        // the chunk is alive while `&self` is.
        unsafe { slice::from_raw_parts(self.base.as_ptr().add(range.start), range.len()) }
    }

    /// The bytes of `range`, to write. Panics as [`bytes`](Self::bytes).
    #[track_caller]
    pub fn bytes_mut(&mut self, range: Range<usize>) -> &mut [u8] {
        self.check(&range);
        // SAFETY: in bounds (checked), past every part, and `&mut self`
        // is the only way to the chunk's bytes.
        unsafe { slice::from_raw_parts_mut(self.base.as_ptr().add(range.start), range.len()) }
    }

    /// Lend the bytes of `range` as a buffer of its own (its length and
    /// capacity `range.len()`), and move [`lent`](Self::lent) to its end.
    /// Dropping the part gives its bytes back. Panics as
    /// [`bytes`](Self::bytes).
    #[track_caller]
    #[inline]
    pub fn lend(&mut self, range: Range<usize>) -> Buf {
        self.check(&range);
        if self.reserve == 0 {
            self.top_up();
        }
        self.reserve -= 1;
        self.lent = range.end;
        // SAFETY: in bounds (checked), so not null.
        let ptr = unsafe { NonNull::new_unchecked(self.base.as_ptr().add(range.start)) };
        // `capacity <= u32::MAX` (`new`).
        Buf::lent(ptr, range.len() as u32, self.lender)
    }

    #[cold]
    fn top_up(&mut self) {
        // SAFETY: the chunk's own reference keeps the lender alive.
        unsafe { self.lender.as_ref() }.count.fetch_add(RESERVE, Ordering::Relaxed);
        self.reserve = RESERVE;
    }

    /// Whether a part lent since the last reuse is alive.
    pub fn in_use(&self) -> bool {
        // SAFETY: the chunk's own reference keeps the lender alive.
        let count = unsafe { self.lender.as_ref() }.count.load(Ordering::Acquire);
        count != 1 + self.reserve
    }

    /// Start lending again from byte 0, if no part is alive: `false` (and
    /// nothing changes) if one is. Every part's use of its bytes happens
    /// before the chunk's next writes.
    pub fn reuse(&mut self) -> bool {
        if self.in_use() {
            return false;
        }
        self.lent = 0;
        true
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: the chunk's own reference and its reserve are given back
        // here, once.
        unsafe { Lender::release(self.lender, 1 + self.reserve) };
    }
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunk").field("capacity", &self.capacity).field("lent", &self.lent).finish()
    }
}

#[cfg(test)]
#[path = "chunk_tests.rs"]
mod tests;
