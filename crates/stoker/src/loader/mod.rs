//! The prefetching batcher: sampler order in, batches out, ahead of the consumer.
//!
//! For each epoch a producer task walks this rank's sampler positions batch by batch, keeps
//! up to `prefetch` batches fetching at once (`get_many`, so ranged sources coalesce), runs
//! the optional per-sample transform on a bounded set of blocking threads, assembles each
//! batch into recycled storage and queues it. Batches arrive in sampler order. A byte budget
//! bounds data fetched but not yet delivered.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Semaphore};

use crate::batch::BatchPool;
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::pinned::GpuCopier;
use crate::sampler::{MixPlan, Order, Sampler, SamplerConfig, SamplerError, SamplerState, ShardLayout};
use crate::source::DynSampleSource;
use crate::stats::{Stats, StatsSnapshot};

mod ahead;
mod config;
mod epoch;
mod plan;
mod producer;
mod tasks;

pub(crate) use config::other_mix_sources;
pub use config::{ErrorPolicy, HostBuffers, LoaderConfig, LoaderState, Transform};
pub use epoch::{EpochIter, EpochStream};
use producer::Producer;
pub(crate) use producer::{pool_and_copier, split_even};
pub use tasks::{list_for_tasks, TaskListing};

struct Progress {
    /// The sampler of the run in progress and how many of its positions were delivered.
    run: Option<(Arc<Sampler>, u64)>,
    /// A state to resume from on the next `epoch()` call for its epoch.
    pending: Option<SamplerState>,
}

/// Batches over any [`SampleSource`](crate::SampleSource), prefetched, in order.
pub struct Loader {
    source: Arc<DynSampleSource>,
    cfg: LoaderConfig,
    shards: Option<Arc<ShardLayout>>,
    /// The plan the sampler follows when the source is a mix.
    mix: Option<Arc<MixPlan>>,
    stats: Arc<Stats>,
    pool: BatchPool,
    copier: Option<Arc<GpuCopier>>,
    decoder: Option<Arc<Decoder>>,
    progress: Arc<Mutex<Progress>>,
    runtime: RuntimeHandle,
}

enum RuntimeHandle {
    Borrowed(tokio::runtime::Handle),
    Owned(tokio::runtime::Runtime),
}

impl RuntimeHandle {
    fn handle(&self) -> &tokio::runtime::Handle {
        match self {
            RuntimeHandle::Borrowed(h) => h,
            RuntimeHandle::Owned(r) => r.handle(),
        }
    }
}

impl Loader {
    /// A loader over `source`. Uses the current tokio runtime, or starts its own.
    pub fn new(source: Arc<DynSampleSource>, cfg: LoaderConfig) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(Error::invalid_option("batch_size must be at least 1"));
        }
        check_prefetch(cfg.prefetch)?;
        check_threads(cfg.transform_threads)?;
        if source.as_mix().is_some_and(|m| m.weight_by() == crate::source::mix::WeightBy::Tokens) {
            return Err(Error::invalid_option(
                "a mix weighted by tokens is packed into sequences by TokenLoader (stoker.TokenLoader), not batched by \
                 samples",
            ));
        }
        let mix = source.as_mix().map(|m| m.plan().clone());
        let shards = match (&cfg.order, &mix) {
            (Order::ShardShuffle { .. }, Some(_)) => {
                return Err(SamplerError::Mix {
                    reason: "shard_shuffle cannot order a mix (its shards belong to different sources); use \
                             shuffle: each source's draws are shuffled within it"
                        .into(),
                }
                .into())
            }
            (Order::ShardShuffle { .. }, None) if !source.capability().locality => {
                return Err(Error::invalid_option(format!(
                    "the shard shuffle reads shards window by window, but {source} ({} layout) is not made of \
                     shards; shuffle its samples instead (Order::Shuffle; Python shuffle=True; CLI --shuffle samples)",
                    source.info().layout
                )))
            }
            (Order::ShardShuffle { .. }, None) => Some(Arc::new(shard_layout(&*source)?)),
            _ => None,
        };
        if cfg.first_index != 0 && mix.is_some() {
            // A mix's indices name its sources' samples by position: no part of one is numbered.
            return Err(Error::invalid_option(format!(
                "first_index numbers the samples of a part of a source, and {source} is a mix"
            )));
        }
        let decoder = match &cfg.decode {
            Some(spec) => Some(Arc::new(
                Decoder::new(spec, cfg.augment_seed, cfg.transform_threads.max(1))?
                    .with_memory_budget(cfg.decode_memory())?
                    .with_first_index(cfg.first_index),
            )),
            None => None,
        };
        if let Some(d) = &decoder {
            // The largest batch that can occur: a batch size past the data (or the span) is
            // never allocated whole. A mix's epoch may be longer than its sources.
            let span = cfg.span.as_ref().map_or(u64::MAX, |s| s.end.saturating_sub(s.start));
            let data = if mix.is_some() { u64::MAX } else { source.len() as u64 };
            let rows = (cfg.batch_size as u64).min(span).min(data).max(1);
            d.check_batch(rows as usize)?;
        }
        let stats = Arc::new(Stats::default());
        if let Some(m) = &mix {
            stats.track_sources(m.sources());
        }
        let runtime = match tokio::runtime::Handle::try_current() {
            Ok(h) => RuntimeHandle::Borrowed(h),
            Err(_) => RuntimeHandle::Owned(
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("stoker")
                    .build()
                    .map_err(|e| Error::resource("the loader's tokio runtime", e))?,
            ),
        };
        let (pool, copier) = pool_and_copier(&cfg)?;
        Ok(Loader {
            source,
            cfg,
            shards,
            mix,
            stats,
            pool,
            copier,
            decoder,
            progress: Arc::new(Mutex::new(Progress { run: None, pending: None })),
            runtime,
        })
    }

    /// The source being read.
    pub fn source(&self) -> &Arc<DynSampleSource> {
        &self.source
    }

    /// Counters since the loader was made.
    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.stats.snapshot_with_damage(self.source.io_counters(), self.source.damage());
        if let Some(m) = self.source.as_mix() {
            s.sources = m.source_stats(&self.stats.source_deliveries(), self.stats.elapsed_s());
        }
        s
    }

    /// Positions in an epoch before the rank split: the source's length, or a mix's epoch
    /// length.
    fn positions(&self) -> u64 {
        self.mix.as_ref().map_or(self.source.len() as u64, |m| m.len())
    }

    /// Batch columns that could not live in host-pool buffers (too large, or none free).
    pub fn host_spills(&self) -> u64 {
        self.pool.spills()
    }

    /// Counters of the host buffer pool, when batches are assembled into one.
    pub fn host_pool_stats(&self) -> Option<crate::pinned::PoolStats> {
        self.pool.host_pool().map(|h| h.stats())
    }

    /// The live counters (for sharing with a monitor).
    pub fn stats_handle(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    fn sampler_config(&self, epoch: u64) -> SamplerConfig {
        SamplerConfig {
            n: self.positions(),
            order: self.cfg.order.clone(),
            epoch,
            partition: self.cfg.partition,
            tail: self.cfg.tail,
            worker: self.cfg.worker,
            num_workers: self.cfg.num_workers,
            shards: self.shards.clone(),
            mix: self.mix.clone(),
            span: self.cfg.span.clone(),
        }
    }

    /// Batches this rank gets in a fresh `epoch`.
    pub fn batches_per_epoch(&self) -> Result<u64> {
        let s = Sampler::new(self.sampler_config(0))?;
        Ok(batches_for(s.len(), self.cfg.batch_size as u64, self.cfg.drop_last))
    }

    /// The order a fresh `epoch` reads this rank's samples in, as [`epoch`](Self::epoch)
    /// would, for tools that walk the same positions themselves (`stoker diagnose`).
    pub fn sampler(&self, epoch: u64) -> Result<Sampler> {
        Ok(Sampler::new(self.sampler_config(epoch))?)
    }

    /// Where the loader stands: resume with [`load_state`](Self::load_state), also in another
    /// process or at another world size.
    ///
    /// The state after an epoch's last batch is the start of the next epoch: resumed as the
    /// epoch it was taken in, it would give an empty epoch (and a training loop that then
    /// asks for the next epoch would have skipped one).
    pub fn state(&self) -> Option<LoaderState> {
        let p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((sampler, delivered)) = &p.run {
            let bs = self.cfg.batch_size.max(1) as u64;
            let done = delivered.div_ceil(bs) >= batches_for(sampler.len(), bs, self.cfg.drop_last);
            let state = sampler.state_after(*delivered);
            let state = if done { next_epoch(state) } else { state };
            return Some(LoaderState {
                sampler: state,
                batch_size: self.cfg.batch_size,
                source: Some(self.identity()),
                mix_sources: self.mix_names(),
            });
        }
        self.pending_of(&p)
    }

    /// The state loaded and not yet started (`Some(None)` when there is none), read without
    /// waiting: `None` while another thread holds the loader's books. For a forked child
    /// starting its own loader from its parent's, whose lock a parent thread may have held at
    /// the fork: that thread does not exist in the child, and a wait would never end.
    pub fn pending_state_now(&self) -> Option<Option<LoaderState>> {
        crate::fork::lock_if_free(&self.progress).map(|p| self.pending_of(&p))
    }

    fn pending_of(&self, p: &Progress) -> Option<LoaderState> {
        p.pending.clone().map(|sampler| LoaderState {
            sampler,
            batch_size: self.cfg.batch_size,
            source: Some(self.identity()),
            mix_sources: self.mix_names(),
        })
    }

    /// A mix's source names, in order ([`LoaderState::mix_sources`]).
    fn mix_names(&self) -> Option<Vec<String>> {
        self.source.as_mix().map(|m| m.names().map(String::from).collect())
    }

    /// What a state records of the source ([`LoaderState::source`]): the sample count alone
    /// let a state of one dataset resume another of as many samples.
    fn identity(&self) -> String {
        let info = self.source.info();
        format!("{}, {} shards", info.layout, info.shards)
    }

    /// Continue from `state` on the next call to [`epoch`](Self::epoch) for the epoch it
    /// resumes in, which [`resume_epoch`](Self::resume_epoch) gives: a state at its epoch's end
    /// resumes at the next epoch's start.
    pub fn load_state(&self, state: LoaderState) -> Result<()> {
        if state.sampler.n != self.positions() {
            return Err(Error::invalid_option(format!(
                "the saved state is for {} samples but {} has {}{}",
                state.sampler.n,
                self.source,
                self.positions(),
                if self.mix.is_some() { " per epoch" } else { "" }
            )));
        }
        if state.sampler.mix != self.mix.as_ref().map(|m| m.fingerprint()) {
            let (state_is_mix, is_mix) = (state.sampler.mix.is_some(), self.mix.is_some());
            return Err(SamplerError::MixMismatch { state_is_mix, is_mix }.into());
        }
        if let Some(theirs) = &state.source {
            let mine = self.identity();
            if *theirs != mine {
                // What a loader writes here is short; a damaged state's may be megabytes.
                let theirs =
                    if theirs.len() > 200 { format!("{} bytes of description", theirs.len()) } else { theirs.clone() };
                return Err(Error::invalid_option(format!(
                    "the saved state is for a source of {theirs}, this loader reads {} ({mine}): resume with the data \
                     it was saved with",
                    self.source
                )));
            }
        }
        if let (Some(theirs), Some(mine)) = (&state.mix_sources, self.mix_names()) {
            if *theirs != mine {
                return Err(other_mix_sources(theirs, &mine));
            }
        }
        // The resume reads in the state's order: another than this loader's (its shuffle, its
        // seed) would continue another sequence of batches, skipping and repeating samples.
        if state.sampler.order != self.cfg.order {
            return Err(Error::invalid_option(format!(
                "the saved state reads in the order {:?}, this loader in {:?}: resume with the shuffle and seed it \
                 was saved with",
                state.sampler.order, self.cfg.order
            )));
        }
        // Padding (`Tail::Wrap`) takes an epoch's end past `n` by less than the world size.
        if state.sampler.consumed > state.sampler.n.saturating_add(MAX_PADDING) {
            return Err(Error::invalid_option(format!(
                "the saved state has consumed {} of {} samples: it is not a state this loader wrote",
                state.sampler.consumed, state.sampler.n
            )));
        }
        // A state at an epoch's end (from an earlier version, which kept it there) is the next
        // epoch's start, as `state` now gives it. Judged for the rank, not this worker: every
        // worker of a rank must resume in the same epoch (one whose share is done reads none).
        let cfg = SamplerConfig { worker: 0, num_workers: 1, ..self.sampler_config(state.sampler.epoch) };
        let bs = self.cfg.batch_size.max(1) as u64;
        let left = Sampler::resume(cfg, &state.sampler)?.len();
        let sampler = if batches_for(left, bs, self.cfg.drop_last) == 0 && state.sampler.consumed > 0 {
            next_epoch(state.sampler)
        } else {
            state.sampler
        };
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p.run = None;
        p.pending = Some(sampler);
        Ok(())
    }

    /// The epoch a pending resume state is for, if any.
    pub fn resume_epoch(&self) -> Option<u64> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).pending.as_ref().map(|s| s.epoch)
    }

    /// Start `epoch` (resuming mid-way if a loaded state is for this epoch) as an async stream.
    pub fn epoch(&self, epoch: u64) -> Result<EpochStream> {
        let cfg = self.sampler_config(epoch);
        let sampler = {
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            let sampler = match p.pending.take() {
                Some(state) if state.epoch == epoch => Sampler::resume(cfg, &state)?,
                other => {
                    p.pending = other;
                    Sampler::new(cfg)?
                }
            };
            let sampler = Arc::new(sampler);
            p.run = Some((sampler.clone(), 0));
            sampler
        };
        let (tx, rx) = mpsc::channel(1);
        let producer = Producer {
            source: self.source.clone(),
            cfg: self.cfg.clone(),
            stats: self.stats.clone(),
            pool: self.pool.clone(),
            copier: self.copier.clone(),
            decoder: self.decoder.clone(),
            sampler: sampler.clone(),
            budget: Arc::new(Semaphore::new(kib(self.cfg.max_bytes_in_flight).max(1) as usize)),
            transform_slots: Arc::new(Semaphore::new(self.cfg.transform_threads.max(1))),
        };
        // A panic in the producer (a bug) is an error in the batches' place: a channel that
        // just ended would end the epoch early without a word.
        let task = self.runtime.handle().spawn(async move {
            use futures::FutureExt;
            let failed = tx.clone();
            if let Err(p) = std::panic::AssertUnwindSafe(producer.run(tx)).catch_unwind().await {
                let e = Error::internal(format!("the loader's producer: {}", crate::error::panic_message(p)));
                let _ = failed.send(Err(e)).await;
            }
        });
        Ok(EpochStream {
            rx,
            task,
            stats: self.stats.clone(),
            progress: self.progress.clone(),
            sampler,
            epoch,
            batch_size: self.cfg.batch_size as u64,
            waiting_since: None,
        })
    }

    /// Start `epoch` as a blocking iterator (for code outside async, e.g. a training loop).
    pub fn epoch_blocking(&self, epoch: u64) -> Result<EpochIter<'_>> {
        Ok(EpochIter { stream: self.epoch(epoch)?, _loader: self })
    }
}

/// The most batches read ahead, and the most transform or decode threads, a loader takes:
/// far past any use (memory is bounded by the byte budget well before), and below the sizes
/// where a channel or a thread pool cannot be made (an abort, not an error).
pub(crate) const MAX_PREFETCH: usize = 1 << 16;
/// See [`MAX_PREFETCH`].
pub(crate) const MAX_THREADS: usize = 1024;

/// `prefetch` within [`MAX_PREFETCH`], or an error saying so.
pub(crate) fn check_prefetch(prefetch: usize) -> Result<()> {
    if prefetch > MAX_PREFETCH {
        return Err(Error::invalid_option(format!(
            "prefetch {prefetch} is more than {MAX_PREFETCH} batches ahead: the byte budget bounds what is read \
             ahead, a few batches are enough"
        )));
    }
    Ok(())
}

/// `threads` within [`MAX_THREADS`], or an error saying so.
fn check_threads(threads: usize) -> Result<()> {
    if threads > MAX_THREADS {
        return Err(Error::invalid_option(format!(
            "{threads} transform or decode threads are more than {MAX_THREADS}: give about one a core"
        )));
    }
    Ok(())
}

/// How far past the data's end a saved state may have consumed: the padding of the last
/// global batch under `Tail::Wrap` is less than the world size, and no job has a million ranks.
const MAX_PADDING: u64 = 1 << 20;

/// The start of the epoch after the one `s` is in.
fn next_epoch(s: SamplerState) -> SamplerState {
    SamplerState { epoch: s.epoch.saturating_add(1), consumed: 0, ..s }
}

fn batches_for(positions: u64, batch: u64, drop_last: bool) -> u64 {
    if drop_last {
        positions / batch
    } else {
        positions.div_ceil(batch)
    }
}

fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
}

/// Shard sizes from the source's locality hints (tar shards are contiguous runs): what the
/// shard shuffle permutes, and where a reader that splits an epoch into parts keeps shards
/// whole. A source without locality is one shard.
///
/// Each shard's end is found by galloping then bisecting (the shard never decreases with
/// the index, see [`crate::source::SampleSource::locality`]): O(log) lookups a shard, where asking every
/// sample took minutes for 10^10 samples, and forever for an index claiming 2^40 in one
/// shard before the shard's first read could refute it.
pub fn shard_layout(src: &DynSampleSource) -> Result<ShardLayout> {
    let n = src.len();
    let shard = |i: usize| src.locality(i).unwrap_or(0);
    let mut sizes: Vec<u64> = Vec::new();
    let mut start = 0;
    while start < n {
        let s = shard(start);
        // `inside` is known to be in the shard, `past` the first index known not to be.
        let (mut inside, mut past, mut step) = (start, n, 1usize);
        while let Some(j) = start.checked_add(step).filter(|&j| j < n) {
            if shard(j) != s {
                past = j;
                break;
            }
            inside = j;
            step = step.saturating_mul(2);
        }
        while past - inside > 1 {
            let mid = inside + (past - inside) / 2;
            if shard(mid) == s {
                inside = mid;
            } else {
                past = mid;
            }
        }
        sizes.push((past - start) as u64);
        start = past;
    }
    Ok(ShardLayout::from_sizes(&sizes)?)
}

/// A spawned fetch that is cancelled when the epoch is dropped (the consumer went away), so
/// abandoned prefetches neither keep running nor hold budget.
pub(super) struct AbortOnDrop<T>(pub(super) tokio::task::JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::Sample;
    use crate::source::{Capability, SampleSource, SourceInfo};
    use crate::uri::Layout;

    /// Shards of the given sizes; only the locality hints are asked of it.
    #[derive(Debug)]
    struct Shards(Vec<u64>);

    impl std::fmt::Display for Shards {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{} shards", self.0.len())
        }
    }

    #[async_trait::async_trait]
    impl SampleSource for Shards {
        fn len(&self) -> usize {
            self.0.iter().sum::<u64>() as usize
        }
        fn capability(&self) -> Capability {
            Capability::default()
        }
        fn info(&self) -> SourceInfo {
            SourceInfo::of(Layout::Tar, self.len())
        }
        async fn get(&self, _index: usize) -> Result<Sample> {
            unreachable!("only the layout is asked for")
        }
        fn locality(&self, index: usize) -> Option<usize> {
            let mut end = 0;
            self.0.iter().position(|&n| {
                end += n;
                index < end as usize
            })
        }
    }

    #[test]
    fn shard_layout_finds_every_run_by_bisection_of_any_size() {
        let mut x = 7u64;
        let mut next = move |m: u64| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        for case in 0..200 {
            // Empty shards (no index of theirs exists), shards of one, and huge ones.
            let sizes: Vec<u64> = (0..next(12))
                .map(|_| match next(5) {
                    0 => 0,
                    1 => 1,
                    2 => 1 << (20 + next(20)),
                    _ => 1 + next(300),
                })
                .collect();
            let got = shard_layout(&Shards(sizes.clone())).unwrap();
            let runs: Vec<u64> = sizes.iter().copied().filter(|&n| n > 0).collect();
            assert_eq!(got, ShardLayout::from_sizes(&runs).unwrap(), "case {case}: {sizes:?}");
        }
    }
}
