//! The prefetching batcher: sampler order in, batches out, ahead of the consumer.
//!
//! For each epoch a producer task walks this rank's sampler positions batch by batch, keeps
//! up to `prefetch` batches fetching at once (`get_many`, so ranged sources coalesce), runs
//! the optional per-sample transform on a bounded set of blocking threads, assembles each
//! batch into recycled storage and queues it. Batches arrive in sampler order. A byte budget
//! bounds data fetched but not yet delivered.

use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::batch::{Batch, BatchPool};
use crate::decode::{DecodeSpec, Decoder};
use crate::error::{Error, Result};
use crate::pinned::{CopierConfig, GpuCopier, HostPool, PoolConfig};
use crate::sample::Sample;
use crate::sampler::{Order, Partition, Sampler, SamplerConfig, SamplerState, ShardLayout, Tail};
use crate::source::DynSampleSource;
use crate::stats::{add_ns, Stats, StatsSnapshot};

/// A per-sample transform, run on blocking threads.
pub type Transform = Arc<dyn Fn(Sample) -> Result<Sample> + Send + Sync>;

/// What to do when a batch cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorPolicy {
    /// Deliver the error in the batch's place; the consumer decides.
    #[default]
    Raise,
    /// Re-read the batch's samples one by one, deliver those that succeed, count the rest.
    Skip,
}

/// Loader settings.
#[derive(Clone)]
pub struct LoaderConfig {
    /// Samples per batch.
    pub batch_size: usize,
    /// Drop a last, short batch.
    pub drop_last: bool,
    /// Batches fetched ahead of the consumer.
    pub prefetch: usize,
    /// Bytes fetched but not yet delivered, at most (approximately: one batch may overshoot).
    pub max_bytes_in_flight: u64,
    /// Sample order per epoch.
    pub order: Order,
    /// This process's rank and world size (`Partition::from_env()` reads `RANK`/`WORLD_SIZE`).
    pub partition: Partition,
    /// This loader's worker id within the rank, when a rank runs several loaders (e.g.
    /// PyTorch DataLoader workers); they split the rank's samples round-robin.
    pub worker: u64,
    /// Loaders per rank (1 unless split across workers).
    pub num_workers: u64,
    /// How ranks are equalised when samples do not divide evenly.
    pub tail: Tail,
    /// Error handling per batch.
    pub on_error: ErrorPolicy,
    /// Optional per-sample transform.
    pub transform: Option<Transform>,
    /// Threads the transform and the decoding may use at once.
    pub transform_threads: usize,
    /// Fields to decode (images, labels, arrays) into fixed-width columns, on
    /// `transform_threads` threads, after the transform if there is one.
    pub decode: Option<DecodeSpec>,
    /// Seed of the decoding's augmentation (random crops, flips): a sample's draw depends
    /// only on this, the epoch and the sample's index.
    pub augment_seed: u64,
    /// Assemble batches into host-pool buffers (page-locked with a device) and, with a
    /// device, copy each batch to the GPU on a dedicated stream. `None`: ordinary memory.
    pub host_buffers: Option<HostBuffers>,
}

/// Host buffers for batch columns, and the GPU to copy them to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostBuffers {
    /// CUDA device ordinal; `None` keeps plain (pageable) host buffers and no GPU copy.
    pub device: Option<usize>,
    /// Bytes per buffer: the largest column of a batch should fit (larger ones spill).
    pub buffer_bytes: usize,
    /// Buffers in the pool (columns x batches alive at once).
    pub buffers: usize,
    /// Device buffers in the ring the copies land in.
    pub device_ring: usize,
}

impl HostBuffers {
    /// Buffers for a device (or `None` for plain host memory), sized for `batch_bytes`
    /// columns and `fields` fields per sample, with `prefetch` batches ahead.
    pub fn for_batches(device: Option<usize>, batch_bytes: usize, fields: usize, prefetch: usize) -> Self {
        let alive = prefetch + 4;
        HostBuffers {
            device,
            buffer_bytes: batch_bytes,
            buffers: alive * fields.max(1),
            device_ring: alive * fields.max(1),
        }
    }
}

impl std::fmt::Debug for LoaderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoaderConfig")
            .field("batch_size", &self.batch_size)
            .field("drop_last", &self.drop_last)
            .field("prefetch", &self.prefetch)
            .field("max_bytes_in_flight", &self.max_bytes_in_flight)
            .field("order", &self.order)
            .field("partition", &self.partition)
            .field("worker", &(self.worker, self.num_workers))
            .field("tail", &self.tail)
            .field("on_error", &self.on_error)
            .field("transform", &self.transform.is_some())
            .field("transform_threads", &self.transform_threads)
            .field("decode", &self.decode)
            .field("augment_seed", &self.augment_seed)
            .field("host_buffers", &self.host_buffers)
            .finish()
    }
}

impl LoaderConfig {
    /// Sequential order, rank 0 of 1, prefetch 4, 1 GiB budget.
    pub fn new(batch_size: usize) -> Self {
        LoaderConfig {
            batch_size,
            drop_last: false,
            prefetch: 4,
            max_bytes_in_flight: 1 << 30,
            order: Order::Sequential,
            partition: Partition::single(),
            worker: 0,
            num_workers: 1,
            tail: Tail::default(),
            on_error: ErrorPolicy::Raise,
            transform: None,
            transform_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            decode: None,
            augment_seed: 0,
            host_buffers: None,
        }
    }
}

/// Resume point of a loader: the sampler state of the epoch in progress (serde).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Sampler progress; `consumed` counts samples delivered over all ranks.
    pub sampler: SamplerState,
    /// Batch size in use when saved (informational; a different one is allowed).
    pub batch_size: usize,
}

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
        let shards = match cfg.order {
            Order::ShardShuffle { .. } => Some(Arc::new(shard_layout(&*source)?)),
            _ => None,
        };
        let runtime = match tokio::runtime::Handle::try_current() {
            Ok(h) => RuntimeHandle::Borrowed(h),
            Err(_) => RuntimeHandle::Owned(
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("stoker")
                    .build()
                    .map_err(|e| Error::Task(format!("cannot start a tokio runtime: {e}")))?,
            ),
        };
        let (pool, copier) = pool_and_copier(&cfg)?;
        let decoder = match &cfg.decode {
            Some(spec) => Some(Arc::new(Decoder::new(spec, cfg.augment_seed, cfg.transform_threads.max(1))?)),
            None => None,
        };
        Ok(Loader {
            source,
            cfg,
            shards,
            stats: Arc::new(Stats::default()),
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
        self.stats.snapshot_with_damage(self.source.io_counters(), self.source.damage())
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
            n: self.source.len() as u64,
            order: self.cfg.order.clone(),
            epoch,
            partition: self.cfg.partition,
            tail: self.cfg.tail,
            worker: self.cfg.worker,
            num_workers: self.cfg.num_workers,
            shards: self.shards.clone(),
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
    pub fn state(&self) -> Option<LoaderState> {
        let p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((sampler, delivered)) = &p.run {
            return Some(LoaderState { sampler: sampler.state_after(*delivered), batch_size: self.cfg.batch_size });
        }
        p.pending.clone().map(|sampler| LoaderState { sampler, batch_size: self.cfg.batch_size })
    }

    /// Continue from `state` on the next call to [`epoch`](Self::epoch) for its epoch.
    pub fn load_state(&self, state: LoaderState) -> Result<()> {
        if state.sampler.n != self.source.len() as u64 {
            return Err(Error::invalid_option(format!(
                "the saved state is for {} samples but {} has {}",
                state.sampler.n,
                self.source,
                self.source.len()
            )));
        }
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p.run = None;
        p.pending = Some(state.sampler);
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
        let task = self.runtime.handle().spawn(producer.run(tx));
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

/// Shard sizes from the source's locality hints (tar shards are contiguous runs).
fn shard_layout(src: &DynSampleSource) -> Result<ShardLayout> {
    let mut sizes: Vec<u64> = Vec::new();
    let mut last = None;
    for i in 0..src.len() {
        let shard = src.locality(i).unwrap_or(0);
        if Some(shard) != last {
            sizes.push(0);
            last = Some(shard);
        }
        *sizes.last_mut().expect("pushed above") += 1;
    }
    Ok(ShardLayout::from_sizes(&sizes)?)
}

struct Producer {
    source: Arc<DynSampleSource>,
    cfg: LoaderConfig,
    stats: Arc<Stats>,
    pool: BatchPool,
    copier: Option<Arc<GpuCopier>>,
    decoder: Option<Arc<Decoder>>,
    sampler: Arc<Sampler>,
    budget: Arc<Semaphore>,
    transform_slots: Arc<Semaphore>,
}

/// A fetched batch with the budget it holds until delivery.
type Fetched = (Result<Batch>, Option<OwnedSemaphorePermit>, u64);

/// The batch pool (host-pool buffers when configured) and the GPU copier (with a device) a
/// loader with `cfg` uses; `stoker::diagnose` measures the same ones.
pub(crate) fn pool_and_copier(cfg: &LoaderConfig) -> Result<(BatchPool, Option<Arc<GpuCopier>>)> {
    let kept = cfg.prefetch.max(1) * 2 + 2;
    // Both fail with CudaUnavailable (never a panic) when no driver or no `cuda` feature.
    Ok(match cfg.host_buffers {
        None => (BatchPool::new(kept), None),
        Some(h) => {
            let host =
                HostPool::new(PoolConfig { buffer_bytes: h.buffer_bytes, buffers: h.buffers, device: h.device })?;
            let copier = match h.device {
                Some(device) => Some(Arc::new(GpuCopier::new(CopierConfig {
                    device,
                    buffer_bytes: h.buffer_bytes,
                    ring: h.device_ring,
                })?)),
                None => None,
            };
            (BatchPool::with_host_pool(kept, host), copier)
        }
    })
}

/// `samples` in at most `parts` runs of near-equal length, in order (none when empty): how a
/// batch is shared among transform threads.
pub(crate) fn split_even(mut samples: Vec<Sample>, parts: usize) -> Vec<Vec<Sample>> {
    let chunk = samples.len().div_ceil(parts.max(1)).max(1);
    let mut out = Vec::with_capacity(parts.max(1));
    while !samples.is_empty() {
        let rest = samples.split_off(chunk.min(samples.len()));
        out.push(std::mem::replace(&mut samples, rest));
    }
    out
}

/// A spawned fetch that is cancelled when the epoch is dropped (the consumer went away), so
/// abandoned prefetches neither keep running nor hold budget.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

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

impl Producer {
    async fn run(self, tx: mpsc::Sender<Result<Batch>>) {
        let batch = self.cfg.batch_size as u64;
        let total = batches_for(self.sampler.len(), batch, self.cfg.drop_last);
        let me = Arc::new(self);
        let estimate = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let budget_kib = kib(me.cfg.max_bytes_in_flight).max(1);
        // Budget is taken in sampler order before a fetch starts, so a batch that holds budget
        // is always ahead of one waiting for it: no deadlock however small the budget.
        let stream = futures::stream::iter(0..total)
            .then(|b| {
                let (me, estimate) = (me.clone(), estimate.clone());
                async move {
                    // Until a batch has been measured, reserve the whole budget: one batch
                    // at a time. After that, reserve the largest batch seen so far.
                    let known = estimate.load(Relaxed);
                    let want = if known == 0 { budget_kib } else { known.min(budget_kib) } as u32;
                    let t = Instant::now();
                    let permit = me.budget.clone().acquire_many_owned(want).await.ok();
                    add_ns(&me.stats.producer_stall_ns, t.elapsed());
                    (b, permit)
                }
            })
            .map(|(b, permit)| {
                let (me, estimate) = (me.clone(), estimate.clone());
                // Each fetch is its own task: `buffered` only polls its futures while this loop
                // polls the stream, so fetches in flight would otherwise stall whenever the
                // producer waits for the consumer to take a batch (a full prefetch queue).
                AbortOnDrop(tokio::spawn(async move {
                    let start = b * batch;
                    let end = (start + batch).min(me.sampler.len());
                    let positions: Vec<u64> = (start..end).filter_map(|k| me.sampler.get(k)).collect();
                    let result = me.fetch(b, &positions).await;
                    let bytes = result.as_ref().map_or(0, |x| x.payload_bytes());
                    // The largest batch so far is what the next reservations assume.
                    estimate.fetch_max(kib(bytes).max(1), Relaxed);
                    me.stats.add_in_flight(bytes);
                    (result, permit, bytes) as Fetched
                }))
            })
            .buffered(me.cfg.prefetch.max(1));
        futures::pin_mut!(stream);
        while let Some(fetched) = stream.next().await {
            let (result, permit, bytes) = match fetched {
                Ok(f) => f,
                Err(e) => (Err(Error::task(e)), None, 0),
            };
            let t = Instant::now();
            let sent = tx.send(result).await;
            add_ns(&me.stats.producer_stall_ns, t.elapsed());
            me.stats.sub_in_flight(bytes);
            drop(permit);
            if sent.is_err() {
                return; // the consumer went away
            }
        }
    }

    async fn fetch(&self, number: u64, indices: &[u64]) -> Result<Batch> {
        let mut batch = self.build(number, indices).await?;
        if let Some(copier) = self.copier.clone() {
            // Queues the host-to-device copies on the copy stream; may wait for a free device
            // buffer, so it runs on a blocking thread.
            batch = tokio::task::spawn_blocking(move || batch.copy_to_device(&copier).map(|()| batch))
                .await
                .map_err(Error::task)??;
        }
        Ok(batch)
    }

    async fn build(&self, number: u64, indices: &[u64]) -> Result<Batch> {
        let idx: Vec<usize> = indices.iter().map(|&i| i as usize).collect();
        let epoch = self.sampler.config().epoch;
        if self.cfg.transform.is_none() && self.decoder.is_none() {
            // Straight from storage into the batch's buffers.
            let mut b = self.pool.builder();
            let t = Instant::now();
            let read = self.source.get_many_into(&idx, &mut b).await;
            self.stats.fetch_latency.record(t.elapsed());
            return match (read, self.cfg.on_error) {
                (Ok(()), _) => Ok(b.finish(epoch, number)),
                (Err(e), ErrorPolicy::Raise) => {
                    self.stats.errors.fetch_add(1, Relaxed);
                    Err(e)
                }
                (Err(_), ErrorPolicy::Skip) => {
                    self.stats.errors.fetch_add(1, Relaxed);
                    let mut b = self.pool.builder();
                    for &i in &idx {
                        // A failed read leaves no partial row behind (get_many_into's contract).
                        if let Err(e) = self.source.get_many_into(&[i], &mut b).await {
                            self.stats.record_skip(&e);
                        }
                    }
                    Ok(b.finish(epoch, number))
                }
            };
        }
        let t = Instant::now();
        let fetched = self.source.get_many(&idx).await;
        self.stats.fetch_latency.record(t.elapsed());
        let (samples, kept) = match (fetched, self.cfg.on_error) {
            (Ok(s), _) => (s, indices.to_vec()),
            (Err(e), ErrorPolicy::Raise) => {
                self.stats.errors.fetch_add(1, Relaxed);
                return Err(e);
            }
            (Err(_), ErrorPolicy::Skip) => self.salvage(indices).await,
        };
        let samples = self.transform(samples).await?;
        let pool = self.pool.clone();
        let Some(decoder) = self.decoder.clone() else {
            return tokio::task::spawn_blocking(move || pool.assemble(epoch, number, &kept, &samples))
                .await
                .map_err(Error::task);
        };
        let (source, skip) = (self.source.clone(), self.cfg.on_error == ErrorPolicy::Skip);
        let t = Instant::now();
        // The decoder spreads the batch over its own threads; this blocking thread waits.
        let (batch, skipped) = tokio::task::spawn_blocking(move || {
            decoder.assemble(&pool, &*source, epoch, number, &kept, &samples, skip)
        })
        .await
        .map_err(Error::task)?
        .inspect_err(|_| {
            self.stats.errors.fetch_add(1, Relaxed);
        })?;
        self.stats.skipped.fetch_add(skipped, Relaxed);
        self.stats.transform_time.record(t.elapsed());
        Ok(batch)
    }

    /// Read samples one by one after a failed batch; keep those that succeed.
    async fn salvage(&self, indices: &[u64]) -> (Vec<Sample>, Vec<u64>) {
        self.stats.errors.fetch_add(1, Relaxed);
        let mut samples = Vec::with_capacity(indices.len());
        let mut kept = Vec::with_capacity(indices.len());
        for &i in indices {
            match self.source.get(i as usize).await {
                Ok(s) => {
                    samples.push(s);
                    kept.push(i);
                }
                Err(e) => self.stats.record_skip(&e),
            }
        }
        (samples, kept)
    }

    async fn transform(&self, samples: Vec<Sample>) -> Result<Vec<Sample>> {
        let Some(f) = self.cfg.transform.clone() else { return Ok(samples) };
        let t = Instant::now();
        let parts = split_even(samples, self.cfg.transform_threads);
        let mut handles = Vec::with_capacity(parts.len());
        for part in parts {
            let (f, slots) = (f.clone(), self.transform_slots.clone());
            handles.push(tokio::spawn(async move {
                let _slot = slots.acquire_owned().await.map_err(|e| Error::Task(e.to_string()))?;
                tokio::task::spawn_blocking(move || part.into_iter().map(|s| f(s)).collect::<Result<Vec<_>>>())
                    .await
                    .map_err(Error::task)?
            }));
        }
        let mut out = Vec::new();
        for h in handles {
            out.extend(h.await.map_err(Error::task)??);
        }
        self.stats.transform_time.record(t.elapsed());
        Ok(out)
    }
}

/// One epoch's batches as an async stream. Dropping it stops the producer.
pub struct EpochStream {
    rx: mpsc::Receiver<Result<Batch>>,
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
    progress: Arc<Mutex<Progress>>,
    sampler: Arc<Sampler>,
    epoch: u64,
    batch_size: u64,
    /// When the consumer first found the queue empty, for the async wait figure.
    waiting_since: Option<Instant>,
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

/// One epoch's batches as a blocking iterator. Call `next` from a plain thread, not from
/// inside an async task (use [`EpochStream`] there).
pub struct EpochIter<'a> {
    stream: EpochStream,
    _loader: &'a Loader,
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
