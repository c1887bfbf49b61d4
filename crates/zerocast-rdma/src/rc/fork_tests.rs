//! `fork` while an RC connection streams (guest only).
//!
//! The process forks children again and again while a connection carries
//! checksummed messages (eager and by rendezvous) from pool memory the
//! device reads and writes. Registered memory must not be shared with a
//! child: if it were, the parent's next write to a page would copy it, and
//! the device would go on using the old page. So each child probes a pool
//! buffer the connection uses and must die of SIGSEGV (the region is not
//! mapped in it: `MADV_DONTFORK`), the region's `VmFlags` in
//! `/proc/self/smaps` must say `dc`, and every message must arrive intact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use zerocast_core::{Connection as _, Endpoint, Listener as _, Transport as _};
use zerocast_mem::PoolConfig;

use super::guest_test_util::{addr, pattern};
use super::{RcConfig, RcTransport};

const WAIT: Duration = Duration::from_secs(20);

/// The `VmFlags` of the mapping of `/proc/self/smaps` that holds `addr`.
fn vm_flags(addr: u64) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let mut inside = false;
    for line in smaps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = range.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_owned();
            }
        }
    }
    panic!("no mapping holds {addr:#x}");
}

/// Fork a child that reads one byte at `addr` and exits 0 if it could;
/// how the child ended.
fn child_probes(addr: u64) -> i32 {
    // SAFETY: the child runs only async-signal-safe code (a volatile load
    // and `_exit`), as a child of a multi-threaded process must.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: in the parent `addr` is a live pool buffer; in the child
        // the load either reads the inherited page or faults, which is
        // what the parent checks.
        let _ = unsafe { (addr as *const u8).read_volatile() };
        // SAFETY: `_exit` ends the child at once, running nothing else.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid out-pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    status
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn fork_during_a_stream_shares_no_registered_page_and_loses_nothing() {
    println!("fork protection: {:?}", crate::device::fork_protection());
    let addr = addr();
    let t = RcTransport::new(RcConfig::default(), PoolConfig::default()).expect("RC transport");
    let listener = t.listen(&Endpoint::parse(&format!("rc://{addr}:0")).expect("endpoint")).expect("listen");
    let at = listener.local_endpoint().clone();
    let t2 = t.clone();
    let client = thread::spawn(move || t2.connect(&at).expect("connect"));
    let server = listener.accept().expect("accept");
    let client = client.join().expect("client");

    // A buffer of the pool the connection uses, for the children to probe.
    let probe = t.pool().alloc(4096, zerocast_mem::Wait::No).expect("pool buffer");
    let probe_addr = probe.addr();
    let flags = vm_flags(probe_addr);
    println!("pool region VmFlags: {flags}");
    assert!(flags.split_whitespace().any(|f| f == "dc"), "the pool region is not MADV_DONTFORK: {flags}");

    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sender = thread::spawn(move || {
        let mut n = 0u32;
        while !stop2.load(Ordering::Relaxed) {
            let len = if n % 4 == 0 { 300 << 10 } else { 512 + (n as usize % 11) * 613 };
            let mut m = client.alloc(len, Some(Instant::now() + WAIT)).expect("alloc");
            m[..4].copy_from_slice(&n.to_le_bytes());
            for (i, b) in m[4..].iter_mut().enumerate() {
                *b = pattern(i, n);
            }
            client.send(m, Some(Instant::now() + WAIT)).map_err(|e| e.to_string()).expect("send");
            n += 1;
        }
        client.close();
        n
    });
    let receiver = thread::spawn(move || {
        let mut n = 0u32;
        while let Ok(m) = server.recv(Some(Instant::now() + WAIT)) {
            let seed = u32::from_le_bytes(m[..4].try_into().expect("4 bytes"));
            assert_eq!(seed, n, "message {n} out of order");
            assert!(m[4..].iter().enumerate().all(|(i, &b)| b == pattern(i, seed)), "message {n} corrupted");
            n += 1;
        }
        n
    });

    const FORKS: usize = 20;
    for k in 0..FORKS {
        let status = child_probes(probe_addr);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
            "fork {k}: the child could read registered memory (status {status:#x})"
        );
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("sender");
    let received = receiver.join().expect("receiver");
    println!("{FORKS} forks; {sent} messages sent, {received} received intact");
    assert!(sent > 0);
    assert_eq!(received, sent, "messages lost across fork");
    drop(probe);
}
