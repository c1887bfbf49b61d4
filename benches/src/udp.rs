//! zerocast datagrams (`ud://`, over UDP) on loopback.
//!
//! UDP has no flow control, so a sender on loopback outruns its receiver
//! and the kernel drops datagrams. To time delivery rather than loss, the
//! sender keeps at most [`UDP_WINDOW`] datagrams ahead of what the receiver
//! has counted (shared through an atomic: an in-process stand-in for
//! acknowledgements). A datagram still lost after that is counted and
//! given up on after [`GIVE_UP`] without progress, so a batch never hangs.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use zerocast::datagram::DatagramSocket;
use zerocast::{Config, RecvError, Zerocast};

use crate::{stamp, BoxError, Pipe};

/// Datagrams the sender may be ahead of the receiver.
pub const UDP_WINDOW: u64 = 64;

/// How long the sender waits for the receiver's progress before counting
/// the missing datagrams as lost.
const GIVE_UP: Duration = Duration::from_millis(50);

/// One sender (the calling thread) and one receiving thread on two
/// loopback `ud://` sockets.
#[derive(Debug)]
pub struct UdpPipe {
    tx: DatagramSocket,
    to: SocketAddr,
    size: usize,
    n: u64,
    sent: u64,
    /// Datagrams received (by the receiver), plus those given up on (by the sender).
    seen: Arc<AtomicU64>,
    lost: u64,
    stop: Arc<AtomicBool>,
    receiver: Option<JoinHandle<()>>,
}

impl UdpPipe {
    /// A pipe sending `n` datagrams of `size` bytes per batch.
    pub fn new(size: usize, n: u64) -> Result<Self, BoxError> {
        let zc = Zerocast::with_config(Config::default());
        let rx = zc.bind_datagram("ud://127.0.0.1:0")?;
        let tx = zc.bind_datagram("ud://127.0.0.1:0")?;
        if size > tx.max_datagram() {
            return Err(format!("{size} B is above the largest datagram, {} B", tx.max_datagram()).into());
        }
        let to = rx.local_addr();
        let seen = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let receiver = thread::Builder::new().name("udp-rx".into()).spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match rx.recv_from(Some(Instant::now() + Duration::from_millis(20))) {
                    Ok((d, _)) => {
                        assert_eq!(d.len(), size, "udp receiver: wrong size");
                        s.fetch_add(1, Ordering::Release);
                    }
                    Err(RecvError::Timeout | RecvError::Empty) => {}
                    Err(e) => panic!("udp receiver: {e}"),
                }
            }
        })?;
        Ok(Self { tx, to, size, n, sent: 0, seen, lost: 0, stop, receiver: Some(receiver) })
    }

    /// Datagrams lost so far (given up on).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Wait until the receiver is at most `ahead` datagrams behind.
    fn wait_for(&mut self, ahead: u64) {
        let mut last = (self.seen.load(Ordering::Acquire), Instant::now());
        loop {
            let seen = self.seen.load(Ordering::Acquire);
            if self.sent - seen.min(self.sent) <= ahead {
                return;
            }
            if seen != last.0 {
                last = (seen, Instant::now());
            } else if last.1.elapsed() > GIVE_UP {
                let missing = self.sent - seen - ahead;
                self.lost += missing;
                self.seen.fetch_add(missing, Ordering::Release);
                return;
            }
            std::hint::spin_loop();
        }
    }
}

impl Pipe for UdpPipe {
    fn batch(&mut self) -> Duration {
        let start = Instant::now();
        for _ in 0..self.n {
            self.wait_for(UDP_WINDOW - 1);
            let mut buf = self.tx.alloc(self.size, None).expect("udp alloc");
            stamp(&mut buf, self.sent);
            self.tx.send_to(buf, &self.to).map_err(|(_, e)| e).expect("udp send");
            self.sent += 1;
        }
        self.wait_for(0);
        start.elapsed()
    }

    fn msgs(&self) -> u64 {
        self.n
    }

    fn bytes(&self) -> u64 {
        self.n * self.size as u64
    }
}

impl Drop for UdpPipe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
    }
}
