//! One epoch's batches as the consumer takes them: from the producers' channels in turn,
//! each carrying its batches in groups.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;

use super::TokenState;
use crate::batch::Batch;
use crate::error::Result;
use crate::stats::{add_ns, Stats};

/// One epoch's batches for this rank, in order: an async stream or a blocking iterator.
/// Dropping it stops the reading.
pub struct TokenEpoch {
    /// The producers' channels, each carrying its batches in groups: batch `k` of the run
    /// comes from `rx[k % rx.len()]`.
    rx: Vec<mpsc::Receiver<Vec<Result<Batch>>>>,
    /// Batches of each channel's last group not yet taken.
    held: Vec<VecDeque<Result<Batch>>>,
    /// Batches taken so far (whose channel is next).
    turn: usize,
    /// An error was delivered or a channel ended: the epoch gives nothing more.
    done: bool,
    /// The async producer, aborted on drop (blocking producers stop at their next send).
    task: Option<tokio::task::JoinHandle<()>>,
    stats: Arc<Stats>,
    progress: Arc<Mutex<(TokenState, Option<TokenState>)>>,
    epoch: u64,
    left: Arc<AtomicU64>,
}

impl TokenEpoch {
    /// The epoch of batch groups from `rx` (taken in turn), `left` batches long; `task` is
    /// the async producer to abort on drop, if there is one.
    pub(super) fn new(
        rx: Vec<mpsc::Receiver<Vec<Result<Batch>>>>,
        task: Option<tokio::task::JoinHandle<()>>,
        stats: Arc<Stats>,
        progress: Arc<Mutex<(TokenState, Option<TokenState>)>>,
        epoch: u64,
        left: u64,
    ) -> Self {
        TokenEpoch {
            held: rx.iter().map(|_| VecDeque::new()).collect(),
            rx,
            turn: 0,
            done: false,
            task,
            stats,
            progress,
            epoch,
            left: Arc::new(AtomicU64::new(left)),
        }
    }

    /// Batches this run still delivers.
    pub fn remaining(&self) -> u64 {
        self.left.load(Relaxed)
    }

    /// The next batch if its channel's last group holds it (`Ok(None)` once the epoch is
    /// done); `Err(channel)` when that channel must be waited on.
    fn held_next(&mut self) -> Result<Option<Result<Batch>>, usize> {
        if self.done {
            return Ok(None);
        }
        let c = self.turn % self.rx.len();
        self.held[c].pop_front().map(Some).ok_or(c)
    }

    /// Keep a group from channel `c` (none: the channel ended) and take its first batch.
    fn unpack(&mut self, c: usize, group: Option<Vec<Result<Batch>>>) -> Option<Result<Batch>> {
        self.held[c].extend(group?);
        self.held[c].pop_front()
    }

    /// Account for what a channel gave: the next turn, or the end after an error or a
    /// channel's end (the others may still hold batches past the failed one: never delivered
    /// out of order).
    fn took(&mut self, item: &Option<Result<Batch>>) {
        match item {
            Some(i) => {
                self.turn += 1;
                self.done = i.is_err();
                self.delivered(i);
            }
            None => self.done = true,
        }
    }

    fn delivered(&self, item: &Result<Batch>) {
        if let Ok(b) = item {
            self.stats.samples.fetch_add(b.len() as u64, Relaxed);
            self.stats.bytes.fetch_add(b.payload_bytes(), Relaxed);
            self.stats.batches.fetch_add(1, Relaxed);
            self.left.fetch_sub(1, Relaxed);
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            if p.0.epoch == self.epoch {
                p.0.batch = b.number + 1;
            }
        }
    }

    /// The next batch (async).
    pub async fn next_batch(&mut self) -> Option<Result<Batch>> {
        let t = Instant::now();
        let item = match self.held_next() {
            Ok(item) => item,
            Err(c) => {
                let group = self.rx[c].recv().await;
                self.unpack(c, group)
            }
        };
        add_ns(&self.stats.consumer_wait_ns, t.elapsed());
        self.took(&item);
        item
    }

    /// The next batch if it is ready (built and handed over), without waiting: `None` when it
    /// is not yet (then wait with [`next_batch`](Self::next_batch) or
    /// [`next`](Iterator::next)), `Some(None)` at the end. For consumers whose every batch is
    /// a few microseconds of work (small global batches fed to Python), where the wait's own
    /// machinery costs as much as the batch.
    pub fn try_next_batch(&mut self) -> Option<Option<Result<Batch>>> {
        let item = match self.held_next() {
            Ok(item) => item,
            Err(c) => match self.rx[c].try_recv() {
                Ok(group) => self.unpack(c, Some(group)),
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            },
        };
        self.took(&item);
        Some(item)
    }

    /// All the remaining batches (async), for tests and tools.
    pub async fn collect(mut self) -> Result<Vec<Batch>> {
        let mut out = Vec::new();
        while let Some(b) = self.next_batch().await {
            out.push(b?);
        }
        Ok(out)
    }
}

impl Iterator for TokenEpoch {
    type Item = Result<Batch>;

    /// The next batch, waiting for it (from a plain thread, not inside an async task).
    fn next(&mut self) -> Option<Result<Batch>> {
        let t = Instant::now();
        let item = match self.held_next() {
            Ok(item) => item,
            Err(c) => {
                let group = self.rx[c].blocking_recv();
                self.unpack(c, group)
            }
        };
        add_ns(&self.stats.consumer_wait_ns, t.elapsed());
        self.took(&item);
        item
    }
}

impl Drop for TokenEpoch {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}
