//! What the Loader tells the disk cache about the future ([`crate::cache::policy`]): when an
//! epoch run starts, the rest of this epoch's order and the whole next epoch's, so the cache
//! drops the blocks needed furthest ahead and keeps, at the end of an epoch, those the next
//! one starts with. LRU would drop every block just before the next epoch reads it again.
//!
//! The plan is the rank's, not this worker's: the DataLoader workers of a rank share one disk
//! cache and each has its own Loader, so they must agree on what is needed when. Time is the
//! rank's item number in the run (the rest of this epoch, then the next epoch after it); with
//! [`Order::ShardShuffle`](crate::sampler::Order) a window's samples are all read when the
//! window is read ahead, so they all count at the window's first item. The clock is the first
//! item of the batch the consumer gets next: the batches being fetched and the windows read
//! ahead are all at or after it.
//!
//! The plan is built on a blocking thread while the first batches are read (an epoch of a
//! million samples takes about a second).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::sampler::{Sampler, SamplerConfig};
use crate::source::DynSampleSource;

/// The cache plan of one epoch run: the clock the producer advances.
pub(super) struct CachePlan {
    clock: Arc<AtomicU64>,
    worker: u64,
    workers: u64,
    batch: u64,
    /// Set when the run is dropped: a plan still being built is not installed.
    gone: Arc<AtomicBool>,
}

impl CachePlan {
    /// Start telling `source`'s cache about `sampler`'s run (a worker's share of a rank's),
    /// in batches of `batch` items; `None` for sources without a remote store behind them.
    pub(super) fn start(source: &Arc<DynSampleSource>, sampler: &Sampler, batch: u64) -> Option<Self> {
        if source.capability().local || source.as_mix().is_some() {
            return None;
        }
        let cfg = sampler.config();
        // The whole rank's run: the same start, every worker's items.
        let rank_cfg = SamplerConfig { worker: 0, num_workers: 1, ..cfg.clone() };
        let now = Sampler::resume(rank_cfg, &sampler.state_after(0)).ok()?;
        let next = now.with_epoch(cfg.epoch + 1).ok();
        let clock = Arc::new(AtomicU64::new(0));
        let gone = Arc::new(AtomicBool::new(false));
        let (src, c, g) = (source.clone(), clock.clone(), gone.clone());
        tokio::task::spawn_blocking(move || {
            let uses = |sink: &mut dyn FnMut(u64, usize)| {
                emit(&now, 0, sink);
                if let Some(n) = &next {
                    emit(n, now.len(), sink);
                }
            };
            if !g.load(Relaxed) {
                src.plan_reads(&uses, c);
            }
        });
        Some(CachePlan { clock, worker: cfg.worker, workers: cfg.num_workers.max(1), batch, gone })
    }

    /// The consumer gets this worker's batch `b` next.
    pub(super) fn at_batch(&self, b: u64) {
        let item = self.worker + self.workers * b * self.batch;
        self.clock.fetch_max(item, Relaxed);
    }
}

impl Drop for CachePlan {
    fn drop(&mut self) {
        self.gone.store(true, Relaxed);
    }
}

/// `sink(offset + time, index)` for every item of `s`: its item number, or for the shard
/// shuffle the first item of its window (Tail::Wrap padding, outside every window, is left
/// out: it repeats the epoch's head).
fn emit(s: &Sampler, offset: u64, sink: &mut dyn FnMut(u64, usize)) {
    match s.shard_windows() {
        Some(windows) => {
            let mut w = 0;
            for (k, index) in s.iter().enumerate() {
                let k = k as u64;
                while w < windows.len() && windows[w].items.end <= k {
                    w += 1;
                }
                match windows.get(w) {
                    Some(win) if win.items.contains(&k) => sink(offset + win.items.start, index as usize),
                    _ => {}
                }
            }
        }
        None => {
            for (k, index) in s.iter().enumerate() {
                sink(offset + k as u64, index as usize);
            }
        }
    }
}
