//! One epoch's batches as the consumer sees them: an async stream or a blocking iterator,
//! recording consumer wait (the starvation figure) and progress for resume.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::Stream;
use tokio::sync::mpsc;

use super::{batches_for, Loader, Progress};
use crate::batch::Batch;
use crate::error::Result;
use crate::sampler::{MixPlan, Sampler};
use crate::source::mix::SOURCE_FIELD;
use crate::stats::{add_ns, Stats};

/// One epoch's batches as an async stream. Dropping it stops the producer.
pub struct EpochStream {
    pub(super) rx: mpsc::Receiver<Result<Batch>>,
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) stats: Arc<Stats>,
    pub(super) progress: Arc<Mutex<Progress>>,
    pub(super) sampler: Arc<Sampler>,
    pub(super) epoch: u64,
    pub(super) batch_size: u64,
    /// When the consumer first found the queue empty, for the async wait figure.
    pub(super) waiting_since: Option<Instant>,
}

impl EpochStream {
    /// The epoch being read.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches this run delivers in total (from the resume point, if resumed).
    pub fn len_batches(&self, batch_size: usize, drop_last: bool) -> u64 {
        batches_for(self.sampler.len(), batch_size as u64, drop_last)
    }

    fn delivered(&self, item: &Result<Batch>) {
        if let Ok(b) = item {
            self.stats.samples.fetch_add(b.len() as u64, Relaxed);
            self.stats.bytes.fetch_add(b.payload_bytes(), Relaxed);
            self.stats.batches.fetch_add(1, Relaxed);
            if let Some(plan) = &self.sampler.config().mix {
                count_sources(&self.stats, plan, b);
            }
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((s, delivered)) = &mut p.run {
                if Arc::ptr_eq(s, &self.sampler) {
                    // Sampler positions through this batch, not samples: skipped samples, and
                    // an earlier batch that raised, count as consumed.
                    *delivered = ((b.number + 1) * self.batch_size).min(self.sampler.len());
                }
            }
        }
    }

    /// The next batch, waiting for it if needed (the wait is the starvation figure).
    pub async fn next_batch(&mut self) -> Option<Result<Batch>> {
        let t = Instant::now();
        let item = self.rx.recv().await;
        add_ns(&self.stats.consumer_wait_ns, t.elapsed());
        if let Some(i) = &item {
            self.delivered(i);
        }
        item
    }
}

impl Stream for EpochStream {
    type Item = Result<Batch>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let poll = self.rx.poll_recv(cx);
        match &poll {
            std::task::Poll::Pending => {
                self.waiting_since.get_or_insert_with(Instant::now);
            }
            std::task::Poll::Ready(item) => {
                if let Some(t) = self.waiting_since.take() {
                    add_ns(&self.stats.consumer_wait_ns, t.elapsed());
                }
                if let Some(item) = item {
                    self.delivered(item);
                }
            }
        }
        poll
    }
}

impl Drop for EpochStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Count a batch's samples and payload bytes per source of a mix (the `__source__` names
/// are not payload). A few operations per sample and field, no allocation.
fn count_sources(stats: &Stats, plan: &MixPlan, b: &Batch) {
    let source = |i: u64| plan.locate(i).map(|(s, _)| s);
    for &i in b.indices() {
        if let Some(s) = source(i) {
            stats.add_source_delivery(s, 1, 0);
        }
    }
    for col in b.fields().filter(|c| c.name != SOURCE_FIELD) {
        for (row, &i) in b.indices().iter().enumerate() {
            if let (Some(s), Some(v)) = (source(i), col.get(row)) {
                stats.add_source_delivery(s, 0, v.len() as u64);
            }
        }
    }
}

/// One epoch's batches as a blocking iterator. Call `next` from a plain thread, not from
/// inside an async task (use [`EpochStream`] there).
pub struct EpochIter<'a> {
    pub(super) stream: EpochStream,
    pub(super) _loader: &'a Loader,
}

impl Iterator for EpochIter<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let t = Instant::now();
        let item = self.stream.rx.blocking_recv();
        add_ns(&self.stream.stats.consumer_wait_ns, t.elapsed());
        if let Some(i) = &item {
            self.stream.delivered(i);
        }
        item
    }
}
