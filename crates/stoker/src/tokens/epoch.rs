//! One epoch's batches as the consumer takes them: groups of consecutive batches from the
//! producers, put back in order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;

use super::produce::{Claims, Group, Producers};
use super::TokenState;
use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::stats::{add_ns, Stats};

/// One epoch's batches for this rank, in order: an async stream or a blocking iterator.
/// Dropping it stops the reading.
pub struct TokenEpoch {
    /// The producers' groups, in the order they were built.
    rx: mpsc::Receiver<Group>,
    /// Groups that came before the one due, by their distance past it.
    early: VecDeque<Option<Vec<Result<Batch>>>>,
    /// Batches of the group being delivered not yet taken.
    held: VecDeque<Result<Batch>>,
    /// The next group to deliver, and how many there are.
    due: u64,
    groups: u64,
    /// The producer threads' claims, told of every group taken and of the end.
    claims: Option<Arc<Claims>>,
    /// An error was delivered or the batches ended: the epoch gives nothing more.
    done: bool,
    /// The async producer, aborted on drop.
    task: Option<tokio::task::JoinHandle<()>>,
    stats: Arc<Stats>,
    progress: Arc<Mutex<(TokenState, Option<TokenState>)>>,
    epoch: u64,
    left: Arc<AtomicU64>,
}

impl TokenEpoch {
    /// The epoch of the batches `from` produces, `left` of them.
    pub(super) fn new(
        from: Producers,
        stats: Arc<Stats>,
        progress: Arc<Mutex<(TokenState, Option<TokenState>)>>,
        epoch: u64,
        left: u64,
    ) -> Self {
        TokenEpoch {
            rx: from.rx,
            early: VecDeque::new(),
            held: VecDeque::new(),
            due: 0,
            groups: from.groups,
            claims: from.claims,
            done: false,
            task: from.task,
            stats,
            progress,
            epoch,
            left: Arc::new(AtomicU64::new(left)),
        }
    }

    /// Producer threads waiting for room to claim another group.
    #[cfg(test)]
    pub(super) fn producers_waiting(&self) -> usize {
        self.claims.as_ref().map_or(0, |c| c.waiting())
    }

    /// Batches this run still delivers.
    pub fn remaining(&self) -> u64 {
        self.left.load(Relaxed)
    }

    /// The next batch if it has come (`Ok(None)` once the epoch is done); `Err(())` when
    /// the group due must be waited for.
    fn held_next(&mut self) -> Result<Option<Result<Batch>>, ()> {
        loop {
            if self.done {
                return Ok(None);
            }
            if let Some(b) = self.held.pop_front() {
                return Ok(Some(b));
            }
            if self.due >= self.groups {
                return Ok(None);
            }
            match self.early.front_mut().and_then(Option::take) {
                Some(group) => {
                    self.early.pop_front();
                    self.due += 1;
                    if let Some(c) = &self.claims {
                        c.took_one();
                    }
                    self.held.extend(group);
                }
                None => return Err(()),
            }
        }
    }

    /// Keep a group that came (`None`: the producers all ended). `Some` is what the epoch
    /// then ends with: an error when the producers ended before the group due.
    fn arrived(&mut self, group: Option<Group>) -> Option<Option<Result<Batch>>> {
        let Some((g, batches)) = group else {
            return Some((self.due < self.groups && !self.done).then(|| {
                Err(Error::internal(format!("the token producers ended before group {} of {}", self.due, self.groups)))
            }));
        };
        let Some(at) = g.checked_sub(self.due).and_then(|d| usize::try_from(d).ok()) else {
            return Some(Some(Err(Error::internal(format!("token batch group {g} came twice")))));
        };
        if self.early.len() <= at {
            self.early.resize_with(at + 1, || None);
        }
        self.early[at] = Some(batches);
        None
    }

    /// Account for what was taken: the end after an error or the last batch.
    fn took(&mut self, item: &Option<Result<Batch>>) {
        match item {
            Some(i) => {
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
        let item = loop {
            match self.held_next() {
                Ok(item) => break item,
                Err(()) => {
                    let group = self.rx.recv().await;
                    if let Some(end) = self.arrived(group) {
                        break end;
                    }
                }
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
        let item = self.take_with(|rx| match rx.try_recv() {
            Ok(group) => Some(Some(group)),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(None),
        })?;
        self.took(&item);
        Some(item)
    }

    /// The next batch, the groups due received by `recv` (`None`: none has come, and the
    /// batch is not ready; `Some(None)`: the producers all ended). Not yet accounted for.
    fn take_with(
        &mut self,
        mut recv: impl FnMut(&mut mpsc::Receiver<Group>) -> Option<Option<Group>>,
    ) -> Option<Option<Result<Batch>>> {
        loop {
            match self.held_next() {
                Ok(item) => return Some(item),
                Err(()) => {
                    let group = recv(&mut self.rx)?;
                    if let Some(end) = self.arrived(group) {
                        return Some(end);
                    }
                }
            }
        }
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
        let item = self.take_with(|rx| Some(rx.blocking_recv())).flatten();
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
        if let Some(c) = &self.claims {
            c.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchPool;

    fn epoch_of(rx: mpsc::Receiver<Group>, groups: u64, left: u64) -> TokenEpoch {
        let state = TokenState {
            epoch: 0,
            batch: 0,
            documents: 1,
            seq_len: 1,
            global_batch: 1,
            weights: Vec::new(),
            stream: None,
            tokens: None,
            sources: None,
        };
        let from = Producers { rx, groups, claims: None, task: None };
        TokenEpoch::new(from, Arc::default(), Arc::new(Mutex::new((state, None))), 0, left)
    }

    /// Groups handed over out of order (a producer with a core to itself runs ahead) are
    /// delivered in order, whether waited for or taken when ready; producers that end short of
    /// the groups due are an error, never an epoch that ends early without a word.
    #[tokio::test]
    async fn groups_that_come_out_of_order_are_delivered_in_order() {
        let pool = BatchPool::new(8);
        let group = |g: u64| (g, (2 * g..2 * g + 2).map(|n| Ok(pool.builder().finish(0, n))).collect::<Vec<_>>());
        let (tx, rx) = mpsc::channel(8);
        let mut e = epoch_of(rx, 3, 6);
        for g in [2, 0] {
            tx.send(group(g)).await.unwrap();
        }
        let mut got = Vec::new();
        while let Some(Some(b)) = e.try_next_batch() {
            got.push(b.unwrap().number);
        }
        assert_eq!(got, [0, 1], "group 0 only: group 1 has not come");
        tx.send(group(1)).await.unwrap();
        drop(tx);
        while let Some(b) = e.next_batch().await {
            got.push(b.unwrap().number);
        }
        assert_eq!(got, [0, 1, 2, 3, 4, 5]);
        assert_eq!(e.remaining(), 0);

        let (tx, rx) = mpsc::channel(8);
        let mut e = epoch_of(rx, 3, 6);
        tx.send(group(1)).await.unwrap();
        drop(tx);
        let end = e.next_batch().await.unwrap().unwrap_err().to_string();
        assert!(end.contains("before group 0 of 3"), "{end}");
        assert!(e.next_batch().await.is_none(), "nothing after the error");
    }
}
