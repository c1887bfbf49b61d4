//! The reader's staging: where bytes from the socket land before they are
//! decoded, and where a small frame's payload is taken from.
//!
//! A connection starts with a 16 KiB area on the heap, and a frame's
//! payload is copied out of it into a pool buffer of its own. Once a read
//! fills that area the peer streams, and staging becomes a pool buffer
//! lent out in parts ([`Chunk`]): each payload whole in it is handed over
//! where it lies, as a part, with no copy and no allocation. When the
//! bytes at the end of the area must move to the front to make room, a
//! chunk with parts still alive (messages the application holds) cannot
//! take them, so they go to another chunk: one whose parts are all gone,
//! or a new one. A connection keeps at most [`CHUNKS`] chunks; with all of
//! them held, or the pool out of buffers, staging falls back to copying
//! through a 64 KiB heap area until a chunk is free again. So a streaming
//! connection pins 64 KiB of pool memory for staging, and at most
//! `CHUNKS` × 64 KiB while the application holds messages from several.

use std::ops::Range;

use zerocast_mem::{Buf, Chunk, Pool, Wait};

/// Staging's size at first.
pub(super) const STAGING: usize = 16 * 1024;
/// Staging's size once a read has filled it: the peer streams, and larger
/// reads pay the system call and the socket's lock once for more frames.
/// A connection that never fills its staging never pays for this.
pub(super) const STAGING_MAX: usize = 64 * 1024;
/// The most chunks one connection's staging keeps: the one it reads into
/// and those whose parts the application still holds.
const CHUNKS: usize = 4;

pub(super) struct Staging {
    /// The copying area: [`STAGING`] bytes at first, [`STAGING_MAX`] once
    /// a read filled it and no chunk could be had. In use while `chunk` is
    /// `None`.
    heap: Vec<u8>,
    /// The lending area, in use when there is one.
    chunk: Option<Chunk>,
    /// Chunks staging moved off while their parts were alive; taken again
    /// once they are free. With `chunk`, at most [`CHUNKS`].
    spares: Vec<Chunk>,
}

impl Staging {
    pub(super) fn new() -> Self {
        Self { heap: vec![0u8; STAGING], chunk: None, spares: Vec::new() }
    }

    /// Bytes in the area in use.
    #[inline]
    pub(super) fn len(&self) -> usize {
        match &self.chunk {
            Some(c) => c.capacity(),
            None => self.heap.len(),
        }
    }

    /// Whether payloads are lent where they lie (else copied).
    #[cfg(test)]
    pub(super) fn lends(&self) -> bool {
        self.chunk.is_some()
    }

    /// The staged bytes of `r`. Every range the reader reads starts at or
    /// past what it took (a chunk shows nothing before its last part).
    #[inline]
    pub(super) fn get(&self, r: Range<usize>) -> &[u8] {
        match &self.chunk {
            Some(c) => c.bytes(r),
            None => &self.heap[r],
        }
    }

    /// The bytes of `r`, for a read to land in.
    #[inline]
    pub(super) fn get_mut(&mut self, r: Range<usize>) -> &mut [u8] {
        match &mut self.chunk {
            Some(c) => c.bytes_mut(r),
            None => &mut self.heap[r],
        }
    }

    /// The payload staged at `r` as a buffer of its own: lent where it
    /// lies, or copied into a pool buffer (`None`: the pool has none now).
    /// Nothing at or before `r.end` is staged again until it moves.
    #[inline]
    pub(super) fn take(&mut self, r: Range<usize>, pool: &Pool) -> Option<Buf> {
        match &mut self.chunk {
            Some(c) => Some(c.lend(r)),
            None => {
                let mut buf = pool.alloc(r.len(), Wait::No).ok()?;
                buf.copy_from_slice(&self.heap[r]);
                Some(buf)
            }
        }
    }

    /// Nothing is staged: whether the next read may land at byte 0 (the
    /// heap area always may, a chunk once its parts are gone).
    #[inline]
    pub(super) fn restart(&mut self) -> bool {
        self.chunk.as_mut().is_none_or(Chunk::reuse)
    }

    /// A read filled the first area, `[start..end]` staged in it: the peer
    /// streams. Lend from a chunk from now on, or copy through a larger
    /// area if the pool has none. Where the staged bytes start now.
    pub(super) fn grow(&mut self, start: usize, end: usize, pool: &Pool) -> usize {
        debug_assert!(self.chunk.is_none() && self.heap.len() < STAGING_MAX);
        match self.free_chunk(pool) {
            Some(mut c) => {
                c.bytes_mut(0..end - start).copy_from_slice(&self.heap[start..end]);
                self.chunk = Some(c);
                0
            }
            None => {
                self.heap.resize(STAGING_MAX, 0);
                start
            }
        }
    }

    /// Move the staged bytes `[start..end]` to the front of an area with
    /// room behind them; they start at 0 then. A chunk none of whose parts
    /// is alive takes them itself; one with parts alive hands them to a
    /// free chunk, or to the heap area when there is none.
    pub(super) fn rebase(&mut self, start: usize, end: usize, pool: &Pool) {
        let staged = end - start;
        match (self.chunk.as_mut().map(Chunk::reuse), &mut self.chunk) {
            (Some(true), Some(c)) => {
                c.bytes_mut(0..end).copy_within(start..end, 0);
                return;
            }
            (None, _) if self.heap.len() < STAGING_MAX => {
                // Not streaming: no chunk yet.
                self.heap.copy_within(start..end, 0);
                return;
            }
            _ => {}
        }
        if let Some(mut next) = self.free_chunk(pool) {
            next.bytes_mut(0..staged).copy_from_slice(self.get(start..end));
            if let Some(held) = self.chunk.replace(next) {
                self.spares.push(held);
            }
            return;
        }
        match self.chunk.take() {
            Some(held) => {
                if self.heap.len() < STAGING_MAX {
                    self.heap.resize(STAGING_MAX, 0);
                }
                self.heap[..staged].copy_from_slice(held.bytes(start..end));
                self.spares.push(held);
            }
            None => self.heap.copy_within(start..end, 0),
        }
    }

    /// No more data comes (the peer said goodbye, or reading is over) and
    /// nothing is staged: the chunks go back to the pool (each once the
    /// parts lent from it are gone), though the connection's handles may
    /// live on, and whatever is still read lands in the heap area.
    pub(super) fn release(&mut self) {
        self.chunk = None;
        self.spares.clear();
    }

    /// A chunk to stage into: a spare whose parts are all gone, or a new
    /// one if staging has fewer than [`CHUNKS`] and the pool has a buffer
    /// now.
    fn free_chunk(&mut self, pool: &Pool) -> Option<Chunk> {
        if let Some(i) = self.spares.iter().position(|c| !c.in_use()) {
            let mut c = self.spares.swap_remove(i);
            let free = c.reuse();
            debug_assert!(free);
            return Some(c);
        }
        if self.spares.len() + usize::from(self.chunk.is_some()) >= CHUNKS {
            return None;
        }
        if self.spares.capacity() == 0 {
            // Once per connection.
            self.spares.reserve_exact(CHUNKS);
        }
        pool.alloc(STAGING_MAX, Wait::No).ok().map(Chunk::new)
    }
}

#[cfg(test)]
#[path = "staging_tests.rs"]
mod tests;
