//! Readiness of a descriptor the engine does not otherwise drive, for
//! tasks: an engine task watches it only while someone waits, wakes every
//! waiter once it is readable, and stops watching until asked again. The
//! async API's datagram sockets wait this way (on a UDP socket, or on an
//! RDMA UD socket's completion channel).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::{Cx, Engine, Interest, Step, Task, Waker};

/// The waiting side's handle; dropping it ends the engine's task.
#[derive(Debug)]
pub struct FdWatch {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Who waits; the descriptor is watched while this is not empty.
    waiting: Mutex<crate::Wakers>,
    /// The engine task, once it ran.
    task: OnceLock<Waker>,
    dropped: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, crate::Wakers> {
        // Every update is one push or one take: consistent after a panic.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl FdWatch {
    /// Watch `fd` (a descriptor of the caller's own, a duplicate say) on
    /// `engine`.
    pub fn new(engine: &Engine, fd: OwnedFd) -> FdWatch {
        let shared = Arc::new(Shared::default());
        engine.register(Box::new(WatchTask { fd, shared: shared.clone() }));
        FdWatch { shared }
    }

    /// Have `waker` woken once the descriptor is readable. Register first,
    /// then look for what came (a `try_recv`), then wait: anything after
    /// the registration makes the descriptor readable.
    pub fn wake_when_readable(&self, waker: &std::task::Waker) {
        self.shared.lock().add(waker);
        // Before its first run the task reads `waiting` anyway.
        if let Some(task) = self.shared.task.get() {
            task.wake();
        }
    }
}

impl Drop for FdWatch {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::SeqCst);
        if let Some(task) = self.shared.task.get() {
            task.wake();
        }
    }
}

struct WatchTask {
    fd: OwnedFd,
    shared: Arc<Shared>,
}

impl Task for WatchTask {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        self.shared.task.get_or_init(|| cx.waker());
        if self.shared.dropped.load(Ordering::SeqCst) {
            return Step::Done;
        }
        let ready = {
            let mut waiting = self.shared.lock();
            let ready: Vec<_> = if cx.readable() { waiting.take().collect() } else { Vec::new() };
            // Watched while anyone waits; a level-triggered descriptor
            // nobody waits on would make the engine spin.
            cx.set_interest(Interest { read: !waiting.is_empty(), write: false });
            ready
        };
        ready.into_iter().for_each(std::task::Waker::wake);
        Step::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WakeCount;

    fn turn(p: &mut super::super::Progress) {
        while p.arm().is_err() {
            p.progress();
        }
    }

    #[test]
    fn a_waiter_is_woken_once_by_readiness_and_only_while_it_waits() {
        let (engine, mut progress) = Engine::detached("watch-test").expect("engine");
        let (rd, mut wr) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        let watch = FdWatch::new(&engine, OwnedFd::from(rd));
        let (count, waker) = WakeCount::new();
        turn(&mut progress);
        std::io::Write::write_all(&mut wr, b"x").expect("write");
        turn(&mut progress);
        assert_eq!(count.get(), 0, "nobody waits: nobody is woken");
        watch.wake_when_readable(&waker);
        turn(&mut progress);
        assert_eq!(count.get(), 1, "readable while waiting: woken");
        turn(&mut progress);
        assert_eq!(count.get(), 1, "once: the descriptor stays readable, unwatched");
        drop(watch);
        turn(&mut progress);
        drop(engine);
        turn(&mut progress);
        assert!(progress.is_finished(), "the task ends with its handle");
    }
}
