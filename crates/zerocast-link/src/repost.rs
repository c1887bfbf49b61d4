//! Reposting a released receive buffer on the releasing thread.
//!
//! A reposting backend (RDMA) gets every released receive buffer back to
//! post it again before its credit returns. By default the buffer travels
//! to the backend's engine task through [`crate::Reposts`] (which wakes
//! it): one hand-off per message. A backend whose receive queue any thread
//! may post to installs a [`Repost`] hook with [`Driver::install_reposter`]
//! instead, and the thread that drops the [`crate::RecvBuf`] posts it
//! itself; the credit then goes out with that thread's next frame. What the
//! hook cannot do without waiting (a fresh buffer for one of another size,
//! say) it hands on to the engine task.

use zerocast_core::ConnError;
use zerocast_mem::Buf;

use crate::Driver;

/// What a [`Repost`] hook did with a released buffer.
#[derive(Debug)]
pub enum Reposted {
    /// Posted again: the link returns its credit.
    Posted,
    /// The connection is shutting down: no receive is posted any more, and
    /// the buffer went back to the pool.
    Closing,
    /// Not on this thread: the backend's engine task takes it.
    Later(Buf),
    /// Posting failed, and the backend has stopped its device side: the
    /// connection fails with this error.
    Failed(ConnError),
}

/// A backend's repost path, driven by the threads that release buffers.
pub trait Repost: Send + Sync {
    /// Post `buf` as a receive again, on the calling thread, without
    /// waiting.
    fn repost(&self, buf: Buf) -> Reposted;
}

impl Driver {
    /// Let threads that release received buffers repost them through
    /// `hook` (see the module docs). A second call is ignored.
    pub fn install_reposter(&self, hook: Box<dyn Repost>) {
        let _ = self.shared.reposter.0.set(hook);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use zerocast_core::{ConnError, Endpoint, FrameKind, Header, LinkConfig};
    use zerocast_mem::{Buf, Pool, PoolConfig, Wait};

    use super::{Repost, Reposted};
    use crate::{hello_for, Driver, Link, LinkSetup, Reposts};

    /// A test double for a backend's repost path: records what it was given
    /// and answers with the next scripted outcome.
    struct Scripted {
        answer: fn(Buf) -> Reposted,
        seen: Arc<Mutex<Vec<usize>>>,
    }

    impl Repost for Scripted {
        fn repost(&self, buf: Buf) -> Reposted {
            self.seen.lock().unwrap().push(buf.len());
            (self.answer)(buf)
        }
    }

    fn open(answer: fn(Buf) -> Reposted) -> (Link, Driver, Reposts, Arc<Mutex<Vec<usize>>>) {
        let config = LinkConfig::default().with_recv_window(8);
        let pool = Pool::unregistered(PoolConfig::default()).unwrap();
        let setup = LinkSetup {
            config,
            peer_hello: hello_for(&config, 4096),
            pool,
            peer: Endpoint::parse("rc://127.0.0.1:1").unwrap(),
            repost: true,
            credit_unit: 0,
        };
        let (link, driver, reposts) = crate::new(setup).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        driver.install_reposter(Box::new(Scripted { answer, seen: seen.clone() }));
        (link, driver, reposts.unwrap(), seen)
    }

    /// The peer's data frame number `seq`, of `len` bytes, arrives.
    fn arrive(link: &Link, driver: &Driver, seq: u32, len: usize) {
        let mut buf = link.pool().alloc(len, Wait::No).unwrap();
        buf.try_set_len(len).unwrap();
        driver.on_frame(Header::new(FrameKind::Data, 0, seq, len as u64), Some(buf)).unwrap();
    }

    #[test]
    fn a_released_buffer_is_reposted_by_the_releasing_thread_then_its_credit_returns() {
        let (link, driver, reposts, seen) = open(|_| Reposted::Posted);
        arrive(&link, &driver, 0, 100);
        let msg = link.recv(None).unwrap();
        assert_eq!(link.stats().held, 1);
        drop(msg);
        assert_eq!(*seen.lock().unwrap(), vec![100]);
        assert_eq!(link.stats().held, 0, "the credit returned once the hook posted the buffer");
        assert!(reposts.try_recv().is_err(), "nothing went to the engine task");
    }

    #[test]
    fn what_the_hook_defers_goes_to_the_engine_task_with_its_credit_still_held() {
        let (link, driver, reposts, seen) = open(Reposted::Later);
        arrive(&link, &driver, 0, 7);
        drop(link.recv(None).unwrap());
        assert_eq!(seen.lock().unwrap().len(), 1);
        let buf = reposts.try_recv().unwrap().expect("the buffer itself");
        assert_eq!(buf.len(), 7);
        assert_eq!(link.stats().held, 1, "the engine task returns the credit");
        driver.on_reposted();
        assert_eq!(link.stats().held, 0);
    }

    #[test]
    fn closing_returns_no_credit_and_a_failed_post_fails_the_link() {
        let (link, driver, _reposts, _) = open(|_| Reposted::Closing);
        arrive(&link, &driver, 0, 1);
        drop(link.recv(None).unwrap());
        assert_eq!(link.stats().held, 1);
        assert!(link.error().is_none());

        let (link, driver, _reposts, _) = open(|_| Reposted::Failed(ConnError::Unsupported("test post")));
        arrive(&link, &driver, 0, 1);
        drop(link.recv(None).unwrap());
        assert!(matches!(link.error(), Some(ConnError::Unsupported("test post"))), "{:?}", link.error());
    }
}
