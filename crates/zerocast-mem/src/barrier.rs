//! Asymmetric memory barriers: a nearly free one for a hot path that runs
//! on its own thread all the time, and a heavy one for the rare thread that
//! must meet it.
//!
//! A thread cache's owner enters its cache for every buffer it takes or
//! gives back; another thread enters it only to empty it (a thread about to
//! wait at the pool's cap, or an orphaned pool). Both sides follow Dekker's
//! pattern: each raises its own flag, puts a full barrier between that
//! store and its load of the other's flag, and backs off if it sees the
//! other's. With [`light`] and [`heavy`] the owner's barrier costs nothing
//! at run time (it only stops the compiler from moving accesses across it),
//! and the visitor's is Linux's `membarrier(2)` with
//! `MEMBARRIER_CMD_PRIVATE_EXPEDITED`: before it returns, every other
//! running thread of the process has executed a full barrier, and a thread
//! that was not running passed one when it was switched out. So either the
//! owner's flag is visible to the visitor, or the visitor's flag is visible
//! to the owner. Locked read-modify-writes, which cost 8-20 ns each on some
//! hosts, then stay out of the owner's path.
//!
//! Where `membarrier` is not there (another OS, an old kernel, a seccomp
//! filter that refuses it), both sides use a sequentially consistent fence,
//! which is Dekker's pattern as written.
//!
//! What this does not do: order anything by itself. It is the barrier half
//! of a flag protocol; the flags are the caller's.

use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};

/// Not asked yet.
const UNKNOWN: u8 = 0;
/// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` is registered and works.
const EXPEDITED: u8 = 1;
/// Fences on both sides.
const FENCES: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Decide the mode, once per process, before either side runs: a protocol
/// must not start with one kind of barrier on one side and another on the
/// other. Idempotent and thread-safe; every caller sees the same answer.
pub(crate) fn init() {
    if MODE.load(Ordering::Acquire) != UNKNOWN {
        return;
    }
    let mode = if register() { EXPEDITED } else { FENCES };
    // The first decision stands (a racing thread decided the same way, or
    // one of them failed where the other did not: keep the first).
    let _ = MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire);
}

/// The hot side's barrier, between its flag's store and its load of the
/// other's. [`init`] must have run (it has, before any cache exists).
#[inline(always)]
pub(crate) fn light() {
    if MODE.load(Ordering::Relaxed) == EXPEDITED {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The cold side's barrier: a full barrier on every thread of the process
/// (or a fence, in the fallback mode).
pub(crate) fn heavy() {
    if MODE.load(Ordering::Acquire) == EXPEDITED {
        // Registered, so it does not fail by the kernel's contract. If it
        // did, the owner's barrier is a compiler fence only, and a fence
        // here would not make up for it: a global barrier would (every
        // thread passes a full barrier when it is switched out).
        if !expedited() {
            global();
        }
    } else {
        fence(Ordering::SeqCst);
    }
}

#[cfg(target_os = "linux")]
mod sys {
    /// `MEMBARRIER_CMD_GLOBAL` (linux/membarrier.h).
    pub(super) const CMD_GLOBAL: libc::c_long = 1 << 0;
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`.
    pub(super) const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    pub(super) const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// `membarrier(cmd, 0, 0)`: whether it returned 0.
    pub(super) fn membarrier(cmd: libc::c_long) -> bool {
        // SAFETY: membarrier takes two integer arguments and touches no
        // memory of the caller's; an unknown command is an error return.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long, 0 as libc::c_long) == 0 }
    }
}

#[cfg(target_os = "linux")]
fn register() -> bool {
    sys::membarrier(sys::CMD_REGISTER_PRIVATE_EXPEDITED) && sys::membarrier(sys::CMD_PRIVATE_EXPEDITED)
}

#[cfg(target_os = "linux")]
fn expedited() -> bool {
    sys::membarrier(sys::CMD_PRIVATE_EXPEDITED)
}

#[cfg(target_os = "linux")]
fn global() {
    if !sys::membarrier(sys::CMD_GLOBAL) {
        // No barrier on the other threads at all: there is no safe way on.
        std::process::abort();
    }
}

#[cfg(not(target_os = "linux"))]
fn register() -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
fn expedited() -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
fn global() {}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::thread;

    use super::*;

    #[test]
    fn the_mode_is_decided_once() {
        init();
        let first = MODE.load(Ordering::Acquire);
        assert_ne!(first, UNKNOWN);
        init();
        assert_eq!(MODE.load(Ordering::Acquire), first);
        #[cfg(target_os = "linux")]
        assert_eq!(first, EXPEDITED, "membarrier(2) is in every kernel since 4.14");
    }

    /// Dekker's pattern with the two barriers: in every round, at most one
    /// of two threads enters (each stores its flag, then loads the other's,
    /// and enters if it was down).
    #[test]
    fn never_both_inside() {
        init();
        const ROUNDS: usize = 20_000;
        let flags = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let inside = Arc::new(AtomicUsize::new(0));
        let both = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(2));
        let side = |me: usize| {
            let (flags, inside, both, start) = (flags.clone(), inside.clone(), both.clone(), start.clone());
            thread::spawn(move || {
                for _ in 0..ROUNDS {
                    start.wait();
                    flags[me].store(true, Ordering::Relaxed);
                    if me == 0 {
                        light();
                    } else {
                        heavy();
                    }
                    if !flags[1 - me].load(Ordering::Relaxed) && inside.fetch_add(1, Ordering::Relaxed) == 1 {
                        both.fetch_add(1, Ordering::Relaxed);
                    }
                    start.wait();
                    flags[me].store(false, Ordering::Relaxed);
                    inside.store(0, Ordering::Relaxed);
                    start.wait();
                }
            })
        };
        let (a, b) = (side(0), side(1));
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(both.load(Ordering::Relaxed), 0, "both threads entered in some rounds");
    }
}
