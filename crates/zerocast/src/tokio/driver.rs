//! An engine driven by a tokio task: its epoll descriptor is an
//! [`AsyncFd`], and the task follows the engine's rule — progress until
//! nothing is pending, arm, and wait only if arming succeeded — so no
//! event that came before the wait is lost, and no timer polls. Wake-ups
//! of the engine's tasks from other threads wake the driving task through
//! its waker ([`Progress::wake_with`]), registered before it arms.

use std::future::{poll_fn, Future};
use std::os::fd::{AsRawFd, RawFd};
use std::task::Poll;

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;
use ::tokio::time::{sleep_until, Instant as TokioInstant};
use zerocast_link::engine::Progress;

/// The engine's descriptor, for the reactor.
struct Driven(Progress);

impl AsRawFd for Driven {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd().as_raw_fd()
    }
}

/// Drive one engine until every handle of it and every task on it is gone.
pub(crate) async fn drive(progress: Progress) {
    // The descriptor is the engine's epoll instance, which `Driven` owns
    // (through the engine) for the `AsyncFd`'s whole life and never
    // changes: the I/O-safety condition of tokio's newer, `unsafe`
    // registration, which this crate, free of `unsafe`, does not call.
    #[allow(deprecated)]
    let registered = AsyncFd::with_interest(Driven(progress), Interest::READABLE);
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            // Only a runtime built without I/O gets here; its connections
            // would never move, so say why loudly.
            tracing::error!(error = %e, "zerocast: cannot watch the engine's descriptor; build the runtime with enable_all()");
            return;
        }
    };
    let far = TokioInstant::now() + std::time::Duration::from_secs(86_400 * 365);
    let mut timer = Box::pin(sleep_until(far));
    loop {
        // Progress until arming succeeds. The descriptor is
        // level-triggered inside the engine, so `arm` sees any event the
        // reactor's edge has already been spent on.
        let next = loop {
            // What the reactor saw so far, this progress handles: forget
            // it, so the wait below ends only for what comes after.
            poll_fn(|cx| {
                if let Poll::Ready(Ok(mut guard)) = fd.poll_read_ready_mut(cx) {
                    guard.clear_ready();
                }
                Poll::Ready(())
            })
            .await;
            let p = &mut fd.get_mut().0;
            p.progress();
            if p.is_finished() {
                p.wake_with(None);
                return;
            }
            // Wake-ups of the engine's tasks from here on wake this task,
            // as the runtime wakes tasks, rather than ring the engine's
            // eventfd (which would reach this task through the reactor, on
            // whichever worker polls it): so a sending task's hand-off to
            // its engine runs on its own worker, once it yields.
            let armed = poll_fn(|cx| {
                let p = &mut fd.get_mut().0;
                p.wake_with(Some(cx.waker()));
                Poll::Ready(p.arm())
            })
            .await;
            match armed {
                Ok(next) => break next,
                // Work keeps coming: let the runtime's other tasks run
                // between turns.
                Err(_) => ::tokio::task::yield_now().await,
            }
        };
        let wake_at = next.map_or(far, TokioInstant::from_std);
        if timer.deadline() != wake_at {
            timer.as_mut().reset(wake_at);
        }
        // Wait for the descriptor or the timer. Readiness is cleared before
        // each progress, so an event after it raises a new edge.
        let watched = poll_fn(|cx| {
            if fd.get_ref().0.has_quiet_wakeups() {
                return Poll::Ready(Ok(()));
            }
            match fd.poll_read_ready_mut(cx) {
                Poll::Ready(r) => Poll::Ready(r.map(drop)),
                Poll::Pending => timer.as_mut().poll(cx).map(Ok),
            }
        })
        .await;
        if let Err(e) = watched {
            tracing::error!(error = %e, "zerocast: the engine's descriptor failed in the reactor");
            fd.get_ref().0.wake_with(None);
            return;
        }
    }
}
