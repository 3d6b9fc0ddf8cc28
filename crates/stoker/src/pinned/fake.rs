//! A [`CopyEvent`] completed (or failed) by hand: the pool's reuse rules tested without a GPU.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use super::{lock, CopyEvent, PinnedError};

#[derive(Debug)]
enum FakeState {
    Pending,
    Complete,
    Failed(String),
}

/// A [`CopyEvent`] that completes when told to; for tests of the reuse rules.
#[derive(Debug)]
pub struct FakeEvent {
    state: Mutex<FakeState>,
    changed: Condvar,
    wait_calls: AtomicUsize,
}

impl Default for FakeEvent {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeEvent {
    /// A not-yet-complete event.
    pub fn new() -> Self {
        FakeEvent { state: Mutex::new(FakeState::Pending), changed: Condvar::new(), wait_calls: AtomicUsize::new(0) }
    }

    /// Marks the work done and wakes waiters.
    pub fn complete(&self) {
        self.settle(FakeState::Complete);
    }

    /// Makes waits fail, as a broken CUDA context would; `is_complete` stays false.
    pub fn fail(&self, message: impl Into<String>) {
        self.settle(FakeState::Failed(message.into()));
    }

    /// How many times [`CopyEvent::wait`] was entered.
    pub fn wait_calls(&self) -> usize {
        self.wait_calls.load(Ordering::SeqCst)
    }

    fn settle(&self, to: FakeState) {
        let mut st = lock(&self.state);
        if matches!(*st, FakeState::Pending) {
            *st = to;
        }
        self.changed.notify_all();
    }
}

impl CopyEvent for FakeEvent {
    fn is_complete(&self) -> bool {
        matches!(*lock(&self.state), FakeState::Complete)
    }

    fn wait(&self) -> Result<(), PinnedError> {
        self.wait_calls.fetch_add(1, Ordering::SeqCst);
        let mut st = lock(&self.state);
        while matches!(*st, FakeState::Pending) {
            st = self.changed.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        match &*st {
            FakeState::Failed(message) => Err(PinnedError::Cuda { op: "FakeEvent::wait", message: message.clone() }),
            _ => Ok(()),
        }
    }
}
