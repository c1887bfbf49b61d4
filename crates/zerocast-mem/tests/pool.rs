//! The pool through its public API: registrars that fail or record, and
//! threads contending at a tiny cap.

use std::error::Error as _;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use zerocast_mem::{Keys, Pool, PoolConfig, PoolError, RegisterError, Registrar, Registration, Wait};

/// Fails the `fail_on`-th registration (1-based) with `errno`; all others succeed.
struct FailingRegistrar {
    calls: AtomicUsize,
    fail_on: usize,
    errno: i32,
}

impl Registrar for FailingRegistrar {
    unsafe fn register(&self, _addr: NonNull<u8>, len: usize) -> Result<Registration, RegisterError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_on {
            return Err(RegisterError::from_os("fake", len, io::Error::from_raw_os_error(self.errno)));
        }
        Ok(Registration::unregistered())
    }

    fn name(&self) -> &str {
        "fake"
    }
}

fn small(classes: &[usize], regions: usize) -> PoolConfig {
    PoolConfig::default()
        .with_classes(classes)
        .with_region_size(4096)
        .with_max_bytes(regions * 4096)
        .with_prefault(false)
}

#[test]
fn registration_failure_propagates_and_pool_stays_usable() {
    let reg = Arc::new(FailingRegistrar { calls: AtomicUsize::new(0), fail_on: 2, errno: libc::ENOMEM });
    let pool = Pool::new(small(&[1024], 4), reg.clone()).unwrap();
    assert_eq!(pool.registrar_name(), "fake");

    let mut held: Vec<_> = (0..4).map(|_| pool.alloc(1000, Wait::No).unwrap()).collect();
    let err = pool.alloc(1000, Wait::No).unwrap_err();
    assert!(matches!(err, PoolError::Register(RegisterError::MemLock { .. })), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("ulimit -l"), "message without the fix: {msg}");
    assert!(err.source().is_some(), "the errno should stay reachable as the source");

    // Nothing half-made: one region, and its reservation was given back.
    let s = pool.stats();
    assert_eq!((s.regions, s.bytes, s.buffers_total, s.buffers_in_use), (1, 4096, 4, 4));

    // Still usable: a released buffer comes back, and growth works again.
    held.pop();
    held.push(pool.alloc(1, Wait::No).unwrap());
    for _ in 0..12 {
        held.push(pool.alloc(1000, Wait::No).unwrap());
    }
    // The full cap (4 regions) was reachable, so no bytes leaked.
    assert_eq!(pool.stats().regions, 4);
    assert!(matches!(pool.alloc(1, Wait::No), Err(PoolError::Exhausted { .. })));
    assert_eq!(reg.calls.load(Ordering::SeqCst), 5);
    drop(held);
    let s = pool.stats();
    assert_eq!((s.buffers_in_use, s.buffers_free), (0, 16));
}

#[test]
fn failing_registrar_every_time_leaves_nothing_behind() {
    let reg = Arc::new(FailingRegistrar { calls: AtomicUsize::new(0), fail_on: 1, errno: libc::EINVAL });
    let pool = Pool::new(small(&[1024], 1), reg).unwrap();
    let err = pool.alloc(1, Wait::No).unwrap_err();
    assert!(matches!(err, PoolError::Register(RegisterError::Device { .. })), "{err:?}");
    assert!(err.to_string().contains("fake"), "{err}");
    assert_eq!(pool.stats(), Default::default());
    // The 1-region cap is still free: the next attempt registers fine.
    pool.reserve(1, 4).unwrap();
    assert_eq!(pool.stats().regions, 1);
}

/// Panics on its first registration, succeeds afterwards.
struct PanicOnceRegistrar(AtomicUsize);

impl Registrar for PanicOnceRegistrar {
    unsafe fn register(&self, _addr: NonNull<u8>, _len: usize) -> Result<Registration, RegisterError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("registrar bug");
        }
        Ok(Registration::unregistered())
    }

    fn name(&self) -> &str {
        "panics-once"
    }
}

#[test]
fn a_panicking_registrar_does_not_leak_the_cap() {
    let pool = Pool::new(small(&[1024], 1), Arc::new(PanicOnceRegistrar(AtomicUsize::new(0)))).unwrap();
    let p = pool.clone();
    let caught = std::panic::catch_unwind(move || p.alloc(1, Wait::No).map(drop));
    assert!(caught.is_err());
    // The one-region cap is still available.
    let b = pool.alloc(1, Wait::No).unwrap();
    assert_eq!(pool.stats().regions, 1);
    drop(b);
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Register { keys: Keys, addr: usize, len: usize },
    Deregister { lkey: u32, still_mapped: bool },
    RegistrarDropped,
}

#[derive(Default)]
struct Log(Mutex<Vec<Event>>);

impl Log {
    fn push(&self, e: Event) {
        self.0.lock().unwrap().push(e);
    }

    fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events().iter().filter(|e| f(e)).count()
    }
}

/// Hands out `lkey = n`, `rkey = 1000 + n` for the n-th region (1-based) and
/// records every register and deregister.
struct RecordingRegistrar {
    log: Arc<Log>,
    next: AtomicU32,
}

impl Drop for RecordingRegistrar {
    fn drop(&mut self) {
        self.log.push(Event::RegistrarDropped);
    }
}

/// Deregisters on drop, checking the memory is still mapped at that moment.
struct Guard {
    log: Arc<Log>,
    lkey: u32,
    addr: usize,
    len: usize,
}

fn is_mapped(addr: usize, len: usize) -> bool {
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `vec` has one byte per 4 KiB page of the range, as `mincore`
    // needs for a page-aligned range; `mincore` only reads the page tables and
    // fails with ENOMEM if any page of the range is unmapped.
    unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr().cast()) == 0 }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let still_mapped = is_mapped(self.addr, self.len);
        self.log.push(Event::Deregister { lkey: self.lkey, still_mapped });
    }
}

impl Registrar for RecordingRegistrar {
    unsafe fn register(&self, addr: NonNull<u8>, len: usize) -> Result<Registration, RegisterError> {
        let n = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let keys = Keys { lkey: n, rkey: 1000 + n };
        let addr = addr.as_ptr() as usize;
        self.log.push(Event::Register { keys, addr, len });
        Ok(Registration::new(keys, Guard { log: self.log.clone(), lkey: n, addr, len }))
    }

    fn name(&self) -> &str {
        "recording"
    }
}

#[test]
fn one_registration_per_region_and_deregistration_after_the_last_buf() {
    let log = Arc::new(Log::default());
    let reg = RecordingRegistrar { log: log.clone(), next: AtomicU32::new(0) };
    // 256-byte class: 16 per region; 2048-byte class: 2 per region.
    let pool = Pool::new(small(&[256, 2048], 8), Arc::new(reg)).unwrap();
    assert_eq!(pool.registrar_name(), "recording");

    let mut bufs: Vec<_> = (0..20).map(|i| pool.alloc(1 + i * 10, Wait::No).unwrap()).collect();
    bufs.extend((0..3).map(|_| pool.alloc(2000, Wait::No).unwrap()));
    let s = pool.stats();
    assert_eq!(s.regions, 4);
    let registered: Vec<(Keys, usize, usize)> = log
        .events()
        .into_iter()
        .map(|e| match e {
            Event::Register { keys, addr, len } => (keys, addr, len),
            other => panic!("only registrations so far, got {other:?}"),
        })
        .collect();
    assert_eq!(registered.len(), s.regions, "one registration per region");
    assert!(registered.iter().all(|&(_, addr, len)| addr % 4096 == 0 && len == 4096));

    // Each Buf reports the keys of the region it lies in; ids follow creation order.
    for b in &bufs {
        let (start, end) = (b.addr() as usize, b.addr() as usize + b.capacity());
        let &(keys, _, _) = registered
            .iter()
            .find(|&&(_, addr, len)| addr <= start && end <= addr + len)
            .unwrap_or_else(|| panic!("{b:?} lies in no registered region"));
        assert_eq!(b.keys(), keys);
        assert_eq!(b.region_id(), keys.lkey - 1);
    }

    // Growing more creates more registrations, one each.
    pool.reserve(1, 40).unwrap();
    assert_eq!(log.count(|e| matches!(e, Event::Register { .. })), pool.stats().regions);

    // Dropping the pool handle deregisters nothing while Bufs live.
    drop(pool);
    let last = bufs.pop().unwrap();
    for b in &mut bufs {
        b.fill(0xAB);
    }
    drop(bufs);
    assert_eq!(log.count(|e| !matches!(e, Event::Register { .. })), 0, "{:?}", log.events());

    // The last Buf takes everything down: every region deregistered exactly
    // once, each while its memory was still mapped, then the registrar.
    drop(last);
    let events = log.events();
    let n = events.iter().filter(|e| matches!(e, Event::Register { .. })).count();
    let mut dereg: Vec<u32> = events
        .iter()
        .filter_map(|e| match *e {
            Event::Deregister { lkey, still_mapped } => {
                assert!(still_mapped, "region {lkey} was unmapped before deregistration");
                Some(lkey)
            }
            _ => None,
        })
        .collect();
    dereg.sort_unstable();
    assert_eq!(dereg, (1..=n as u32).collect::<Vec<_>>());
    assert_eq!(events.last(), Some(&Event::RegistrarDropped));
}

#[test]
fn four_threads_contend_at_a_tiny_cap() {
    // 256-byte class: one region of 16; 2048-byte class: one region of 2.
    let pool = Pool::unregistered(small(&[256, 2048], 2)).unwrap();
    const ROUNDS: usize = 100_000;
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let pool = pool.clone();
            thread::spawn(move || {
                for i in 0..ROUNDS {
                    // At most 4 small buffers are ever held, so the small class
                    // never runs dry; only the big one (2 buffers) makes threads wait.
                    let mut small = pool.alloc(1 + i % 256, Wait::Forever).unwrap();
                    let mut big = pool.alloc(257 + i % 1791, Wait::Forever).unwrap();
                    small.fill(t);
                    big.fill(!t);
                    thread::yield_now();
                    assert!(small.iter().all(|&b| b == t), "small buffer shared between threads");
                    assert!(big.iter().all(|&b| b == !t), "big buffer shared between threads");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = pool.stats();
    assert_eq!(s.regions, 2);
    assert!(s.bytes <= 2 * 4096);
    assert_eq!((s.buffers_total, s.buffers_free, s.buffers_in_use), (18, 18, 0));
}
