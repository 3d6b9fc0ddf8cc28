//! What the Loader tells the disk cache about the future ([`crate::cache::policy`]): when an
//! epoch run starts, the rest of this epoch's order and the whole next epoch's, so the cache
//! drops the blocks needed furthest ahead and keeps, at the end of an epoch, those the next
//! one starts with. LRU would drop every block just before the next epoch reads it again.
//!
//! The plan is the node's, not this worker's: the DataLoader workers of a rank, and the ranks
//! of a node when the launcher says which they are ([`Partition::node_ranks`]), share one disk
//! cache and each has its own Loader, so they must agree on what is needed when, and the
//! cache's room is for all of their reads. Time is a rank's item number in the run (the rest
//! of this epoch, then the next epoch after it; the ranks go at one pace); with
//! [`Order::ShardShuffle`](crate::sampler::Order) a window's samples all count at the
//! window's last item: a window read ahead is read before the clock reaches it, and one whose
//! blocks are all on disk is read from them by every batch of the window, so its blocks are
//! needed until the window's end (counted at its first item, they looked used once the
//! consumer passed the window's first batch, and the next window's writes evicted them under
//! the batches still reading them). The clock is the first item of the batch the consumer
//! gets next: the batches being fetched and the windows read ahead are all at or before
//! their times.
//!
//! The plan is built on a blocking thread while the first batches are read (an epoch of a
//! million samples takes about a second).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::sampler::{Partition, Sampler, SamplerConfig};
use crate::source::DynSampleSource;

/// Before a run's first read: when this node's ranks read every sample (one node, or one
/// rank), let the source's cache take bigger blocks if the data fits it whole (see
/// [`SampleSource::fit_cache_blocks`](crate::SampleSource::fit_cache_blocks)). A node that
/// reads a share of a per-sample shuffle keeps small blocks: a bigger block would fetch more
/// samples that other nodes read.
pub(super) fn fit_cache_blocks(source: &Arc<DynSampleSource>, sampler: &Sampler) -> bool {
    let p = sampler.config().partition;
    let ranks = p.node_ranks();
    ranks.end - ranks.start >= p.world_size && source.fit_cache_blocks()
}

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
        // The whole runs of the node's ranks: the same start, every worker's items.
        let state = sampler.state_after(0);
        let mut now = Vec::new();
        for rank in cfg.partition.node_ranks() {
            let partition = Partition { rank, ..cfg.partition };
            let rank_cfg = SamplerConfig { worker: 0, num_workers: 1, partition, ..cfg.clone() };
            now.push(Sampler::resume(rank_cfg, &state).ok()?);
        }
        let next: Vec<Sampler> =
            now.iter().filter_map(|s| cfg.epoch.checked_add(1).and_then(|e| s.with_epoch(e).ok())).collect();
        let len = now.iter().map(Sampler::len).max().unwrap_or(0);
        let clock = Arc::new(AtomicU64::new(0));
        let gone = Arc::new(AtomicBool::new(false));
        let (src, c, g) = (source.clone(), clock.clone(), gone.clone());
        tokio::task::spawn_blocking(move || {
            let uses = |sink: &mut dyn FnMut(u64, usize)| {
                merged(&now, 0, sink);
                merged(&next, len, sink);
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

/// `sink(offset + time, index)` for every item of the samplers (the ranks of a node), in time
/// order: merged, as each sampler's items come in time order.
fn merged(samplers: &[Sampler], offset: u64, sink: &mut dyn FnMut(u64, usize)) {
    let mut each: Vec<_> = samplers.iter().map(|s| timed(s).peekable()).collect();
    loop {
        let next = each.iter_mut().enumerate().filter_map(|(i, it)| Some((it.peek()?.0, i))).min();
        let Some((_, i)) = next else { return };
        if let Some((t, index)) = each[i].next() {
            sink(offset + t, index);
        }
    }
}

/// `(time, index)` for every item of `s`: its item number, or for the shard shuffle the last
/// item of its window (Tail::Wrap padding, outside every window, is left out: it repeats the
/// epoch's head).
fn timed(s: &Sampler) -> Box<dyn Iterator<Item = (u64, usize)> + '_> {
    match s.shard_windows() {
        Some(windows) => {
            let mut w = 0;
            Box::new(s.iter().enumerate().filter_map(move |(k, index)| {
                let k = k as u64;
                while w < windows.len() && windows[w].items.end <= k {
                    w += 1;
                }
                windows.get(w).filter(|win| win.items.contains(&k)).map(|win| (win.items.end - 1, index as usize))
            }))
        }
        None => Box::new(s.iter().enumerate().map(|(k, index)| (k as u64, index as usize))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{Order, ShardLayout};

    /// A shard-shuffled window's blocks are needed until its last batch (a window read from
    /// disk is read by every one of its batches): every item counts at the window's last item,
    /// so the clock (the next batch's first item) never passes a window still being read.
    #[test]
    fn a_windows_items_count_at_its_last_item() {
        let mut cfg = SamplerConfig::new(40, Order::ShardShuffle { seed: 3, window: 2 });
        cfg.shards = Some(Arc::new(ShardLayout::from_sizes(&[10, 10, 10, 10]).unwrap()));
        let s = Sampler::new(cfg).unwrap();
        let windows = s.shard_windows().unwrap();
        assert_eq!(windows.len(), 2);
        let times: Vec<(u64, usize)> = timed(&s).collect();
        assert_eq!(times.len(), 40);
        for (k, &(t, index)) in times.iter().enumerate() {
            let w = windows.iter().find(|w| w.items.contains(&(k as u64))).unwrap();
            assert_eq!(t, w.items.end - 1, "item {k}");
            assert_eq!(Some(index as u64), s.get(k as u64));
        }
    }
}
