//! Device tests against a real verbs device.
//!
//! They are ignored on a plain `cargo test`; `scripts/test` runs them with
//! `--ignored` inside the Soft-RoCE guest (`scripts/softroce-run`), where
//! `ZEROCAST_RDMA_DEV` names the device (`rxe0`).

use std::process::Command;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use zerocast_mem::{Pool, PoolConfig, RegisterError, Registrar, Wait};
use zerocast_rdma::{Access, Device, PortState, RcConfig, RcTransport, VerbsRegistrar};

/// Set in the child process of [`memlock_limit_is_reported`].
const MEMLOCK_CHILD_ENV: &str = "ZEROCAST_RDMA_MEMLOCK_CHILD";

/// The device under test: `ZEROCAST_RDMA_DEV`, or the first active one.
fn open_device() -> Device {
    let name = std::env::var("ZEROCAST_RDMA_DEV").ok();
    match Device::open(name.as_deref()) {
        Ok(dev) => dev,
        Err(err) => panic!("{}", error_chain(&err)),
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        msg.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    msg
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn opens_device_with_active_port() {
    let dev = open_device();
    let port = dev.port_attr().expect("query port");
    println!(
        "{} port {}: {}, active_mtu {} (max {}), ethernet {}, max_mr_size {}, max_qp {}",
        dev.name(),
        port.port,
        port.state,
        port.active_mtu,
        port.max_mtu,
        port.ethernet,
        dev.context().attr().max_mr_size,
        dev.context().attr().max_qp,
    );
    assert_eq!(port.state, PortState::Active);
    assert!((256..=4096).contains(&port.active_mtu), "active_mtu {}", port.active_mtu);
    if let Ok(want) = std::env::var("ZEROCAST_RDMA_DEV") {
        assert_eq!(dev.name(), want);
    }

    // Without a name, the first device with an active port is chosen.
    let any = Device::open(None).expect("open the first active device");
    assert_eq!(any.port_attr().expect("query port").state, PortState::Active);
}

/// Captured log output.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The value of `key=` in a `tracing` fmt line.
fn field(line: &str, key: &str) -> u64 {
    let at = line.find(&format!(" {key}=")).unwrap_or_else(|| panic!("no `{key}` in: {line}"));
    let rest = &line[at + key.len() + 2..];
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..end].parse().unwrap_or_else(|e| panic!("`{key}` in {line}: {e}"))
}

/// Opening the RC transport logs the device's limits at debug level:
/// active MTU, max inline (measured with probe QPs, since
/// `ibv_query_device` has no such field), max SRQ and max MR.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn transport_logs_device_limits() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let cfg = RcConfig::default();
    let want_inline = cfg.max_inline;
    let transport = tracing::subscriber::with_default(subscriber, || {
        RcTransport::new(cfg, PoolConfig::default()).expect("RC transport")
    });
    let log = String::from_utf8(out.0.lock().expect("log buffer").clone()).expect("utf-8 log");
    let line = log.lines().find(|l| l.contains("RC transport on device")).expect("the device line");
    println!("{line}");
    let attr = transport.device().context().attr().clone();
    let port = transport.device().port_attr().expect("port");
    assert_eq!(field(line, "active_mtu"), u64::from(port.active_mtu));
    assert_eq!(field(line, "max_srq"), u64::from(attr.max_srq));
    assert_eq!(field(line, "max_srq_wr"), u64::from(attr.max_srq_wr));
    assert_eq!(field(line, "max_mr"), u64::from(attr.max_mr));
    assert_eq!(field(line, "max_mr_size"), attr.max_mr_size);
    assert!(attr.max_srq > 0 && attr.max_srq_wr > 0, "{attr:?}");
    let (max_inline, granted) = (field(line, "max_inline"), field(line, "max_inline_granted"));
    assert!(max_inline > 0, "the device takes no inline data: {line}");
    // The provider grants at least what was asked, up to its limit.
    assert!(granted >= u64::from(want_inline).min(max_inline), "{line}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn unknown_device_is_reported_with_the_present_ones() {
    let err = Device::open(Some("no-such-device0")).expect_err("must not open");
    let msg = err.to_string();
    assert!(msg.contains("no-such-device0") && msg.contains("ibv_devices"), "{msg}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn registers_memory_through_the_registrar() {
    let dev = open_device();
    let registrar = VerbsRegistrar::new(dev.alloc_pd().expect("alloc pd"));
    assert_eq!(registrar.name(), dev.name());

    let mut buf = vec![0u8; 1 << 20];
    let addr = NonNull::new(buf.as_mut_ptr()).expect("non-null");
    // SAFETY: `buf` stays allocated and unmoved until after `reg` is dropped below.
    let reg = unsafe { registrar.register(addr, buf.len()) }.expect("register 1 MiB");
    let keys = reg.keys();
    println!("registered {} bytes for local access: {keys:?}", buf.len());
    assert_ne!(keys.lkey, 0);

    // A second region gets keys of its own.
    let mut other = vec![0u8; 4096];
    let addr = NonNull::new(other.as_mut_ptr()).expect("non-null");
    // SAFETY: `other` stays allocated and unmoved until after `reg2` is dropped below.
    let reg2 = unsafe { registrar.register(addr, other.len()) }.expect("register 4 KiB");
    assert_ne!(reg2.keys().lkey, keys.lkey);

    // Remote access is granted only when asked for, and then has a key.
    let remote = VerbsRegistrar::with_access(dev.alloc_pd().expect("alloc pd"), Access::RemoteRead);
    let mut shared = vec![0u8; 4096];
    let addr = NonNull::new(shared.as_mut_ptr()).expect("non-null");
    // SAFETY: `shared` stays allocated and unmoved until after `reg3` is dropped below.
    let reg3 = unsafe { remote.register(addr, shared.len()) }.expect("register for remote read");
    println!("registered {} bytes for remote read: {:?}", shared.len(), reg3.keys());
    assert_ne!(reg3.keys().rkey, 0);
    drop(reg3);
    drop(shared);

    // Deregister before the memory goes away.
    drop(reg2);
    drop(reg);
    drop(other);
    drop(buf);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn pool_buffers_carry_device_keys() {
    let dev = open_device();
    let registrar = Arc::new(VerbsRegistrar::new(dev.alloc_pd().expect("alloc pd")));
    let cfg = PoolConfig::default().with_classes([4096]).with_region_size(1 << 20).with_max_bytes(4 << 20);
    let pool = Pool::new(cfg, registrar).expect("pool");
    assert_eq!(pool.registrar_name(), dev.name());

    let mut bufs = Vec::new();
    for _ in 0..4 {
        let mut buf = pool.alloc(4096, Wait::No).expect("alloc a registered buffer");
        buf.copy_from_slice(&[0xa5; 4096]);
        assert_ne!(buf.keys().lkey, 0);
        assert_ne!(buf.addr(), 0);
        bufs.push(buf);
    }
    // Buffers of one region share its registration.
    assert!(bufs.iter().all(|b| b.keys() == bufs[0].keys()));
    println!("pool buffers registered on {}: {:?}", dev.name(), bufs[0].keys());
    drop(bufs);
    // The pool (and with it the MR, PD and context) goes last.
    drop(pool);
}

/// Registering 64 MiB under a 64 KiB memlock limit must fail as
/// [`RegisterError::MemLock`], with a message pointing at `ulimit -l`.
///
/// The limit is lowered in a child process (this same test, re-run with
/// [`MEMLOCK_CHILD_ENV`] set), so no other test sees it.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it inside the Soft-RoCE guest"]
fn memlock_limit_is_reported() {
    if std::env::var_os(MEMLOCK_CHILD_ENV).is_some() {
        memlock_child();
        return;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .args(["memlock_limit_is_reported", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads=1"])
        .env(MEMLOCK_CHILD_ENV, "1")
        .output()
        .expect("spawn child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("child stdout:\n{stdout}\nchild stderr:\n{stderr}");
    assert!(out.status.success(), "child failed: {}", out.status);
    assert!(stdout.contains("1 passed"), "child ran no test");
    assert!(stdout.contains("memlock error:"), "child did not reach the check");
}

fn memlock_child() {
    const LIMIT: u64 = 64 << 10;
    const LEN: usize = 64 << 20;

    // Open the device first: only the registration should hit the limit.
    let dev = open_device();
    let registrar = VerbsRegistrar::new(dev.alloc_pd().expect("alloc pd"));

    set_memlock_limit(LIMIT);
    // Root bypasses the limit through CAP_IPC_LOCK; drop it from this thread,
    // which is the one that registers.
    drop_ipc_lock_capability();

    let mut buf = vec![0u8; LEN];
    let addr = NonNull::new(buf.as_mut_ptr()).expect("non-null");
    // SAFETY: `buf` outlives the match, which drops any registration it gets.
    match unsafe { registrar.register(addr, LEN) } {
        Ok(reg) => panic!("registering {LEN} bytes under a {LIMIT}-byte limit succeeded: {reg:?}"),
        Err(err @ RegisterError::MemLock { .. }) => {
            let msg = err.to_string();
            println!("memlock error: {}", error_chain(&err));
            assert!(msg.contains("ulimit -l"), "{msg}");
            assert!(msg.contains("64 KiB"), "{msg}");
        }
        Err(err) => panic!("expected RegisterError::MemLock, got: {}", error_chain(&err)),
    }
}

fn set_memlock_limit(bytes: u64) {
    let rl = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
    // SAFETY: `rl` is a valid rlimit; setrlimit only reads it.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rl) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

/// Clear `CAP_IPC_LOCK` from the calling thread's effective capabilities.
fn drop_ipc_lock_capability() {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;

    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    let mut header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capget with a version-3 header writes two `Data` entries, which
    // `data` provides; pid 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: as above; capset only reads the header and the two entries.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}
