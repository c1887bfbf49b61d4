//! For unit tests: an engine task shaped like a backend's writer, on an
//! engine driven by hand (`Engine::detached`).

use std::sync::{Arc, Mutex};

use crate::engine::{Cx, Pending, Progress, Step, Task};
use crate::{Driver, Wire, Writing};

/// Attaches its wire at its first run, then runs the writer at each, and
/// keeps what each step said.
pub(crate) struct WriterTask {
    pub(crate) driver: Driver,
    pub(crate) wire: Option<Box<dyn Wire>>,
    pub(crate) said: Arc<Mutex<Vec<Writing>>>,
}

impl Task for WriterTask {
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    fn run(&mut self, cx: &mut Cx<'_>) -> Step {
        if let Some(wire) = self.wire.take() {
            self.driver.attach(wire, cx.waker());
        }
        let said = self.driver.drive_writer(false);
        self.said.lock().unwrap().push(said);
        Step::Continue
    }
}

/// Run the engine until nothing is pending.
pub(crate) fn settle(progress: &mut Progress) {
    for _ in 0..100 {
        progress.progress();
        if progress.arm() != Err(Pending) {
            return;
        }
    }
    panic!("the engine never settled");
}
