//! The caching ladder: find where a training input pipeline starves its consumer.
//!
//! [`diagnose`] measures, in one run, five steps that each add one real part of the pipeline:
//!
//! 1. **consumer**: the consumer's step on one cached batch, fed again and again: its ceiling;
//! 2. **copy**: plus the host-to-device copy of that batch (the Loader's device path, from
//!    pinned buffers, when a device is configured; otherwise a copy into pooled host buffers
//!    stands in for it, and the report says so);
//! 3. **collate**: plus batch assembly from samples cached in memory, with the per-sample
//!    transform if one is configured (on `transform_threads` threads, as the Loader runs it);
//! 4. **fetch**: plus reading from storage through the source with the fetch layer's cache off
//!    (memory and disk; the operating system's page cache of local files is not bypassed), at
//!    the configured concurrency;
//! 5. **pipeline**: the full pipeline, a [`Loader`] exactly as configured (prefetch, cache).
//!
//! Steps 1–4 run one batch at a time, each batch doing all the work of the steps before it,
//! so each step's throughput drops by what its part costs; that part is also timed on its
//! own. Step 5 overlaps everything as training does.
//!
//! The verdict: when the consumer of the full pipeline waits for data at most 25% of the time,
//! the consumer is the bottleneck (the wait is measured in that run, not against step 1, which
//! a loaded machine can disturb). Otherwise the step whose own part takes the most time per
//! batch is: the step where throughput drops the most, measured in time rather than as a
//! ratio (a ratio would blame a cheap part that follows a nearly free one, e.g. a copy after
//! a no-op consumer), and timed directly so noise in the other parts of a step cannot move
//! the blame. [`Knob`] then names what helps, from the measured numbers (see `verdict.rs`):
//! the transform's threads against the cores; for reads, Little's law on requests in flight
//! (concurrency first, as it costs no memory, then prefetch), then small files (pack), then
//! the store's bandwidth (cache).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::{Batch, BatchPool};
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::loader::{Loader, LoaderConfig, Transform};
use crate::pinned::{GpuCopier, HostPool, PoolConfig};
use crate::sample::Sample;
use crate::source::resolve::Request;
use crate::source::DynSampleSource;
use crate::stats::Histogram;
use crate::uri::SourceOptions;

mod report;
mod verdict;

pub use report::{IoDelta, Knob, Report, Setup, Step, StepResult, Verdict};

/// The consumer's step on one batch (a training step). It runs on a plain thread.
pub type Consumer = Arc<dyn Fn(&Batch) -> Result<()> + Send + Sync>;

/// What to measure, and for how long.
#[derive(Clone)]
pub struct DiagnoseConfig {
    /// The pipeline being diagnosed: batch size, prefetch, order, transform and its threads,
    /// host buffers and device.
    pub loader: LoaderConfig,
    /// The training step; `None` measures the input side alone (a step that takes no time).
    pub consumer: Option<Consumer>,
    /// Samples each step measures, at most.
    pub samples: u64,
    /// Time each step may take, at most (it stops after the batch that passes it).
    pub max_time: Duration,
}

impl DiagnoseConfig {
    /// Diagnose `loader` with `consumer`, 2048 samples or 10 s per step.
    pub fn new(loader: LoaderConfig, consumer: Option<Consumer>) -> Self {
        DiagnoseConfig { loader, consumer, samples: 2048, max_time: Duration::from_secs(10) }
    }
}

impl fmt::Debug for DiagnoseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiagnoseConfig")
            .field("loader", &self.loader)
            .field("consumer", &self.consumer.is_some())
            .field("samples", &self.samples)
            .field("max_time", &self.max_time)
            .finish()
    }
}

/// Run the ladder on the source `uri` names (`options` under the URI's query, as
/// [`open`](crate::open) takes them) with the pipeline and consumer of `cfg`.
///
/// The source is opened twice: once with the fetch layer's cache off (the fetch step, and the
/// samples the earlier steps cache), once as configured (the pipeline step) when a cache is
/// configured. Source errors name what failed as everywhere else; an error of the consumer or
/// the transform (a `Callback`, `InvalidOption` or `Internal` error) is prefixed with the step it failed in.
/// The options take the cache block size the loader's order is best served by, unless they
/// choose one ([`SourceOptions::for_order`]), as the Loader it models would be opened with.
pub async fn diagnose(uri: &str, options: SourceOptions, cfg: DiagnoseConfig) -> Result<Report> {
    let options = options.for_order(&cfg.loader.order);
    diagnose_boxed(uri, options, cfg).await
}

/// [`diagnose`], compiled here (see the note at the crate's `pub use`s).
fn diagnose_boxed(
    uri: &str,
    options: SourceOptions,
    cfg: DiagnoseConfig,
) -> futures::future::BoxFuture<'_, Result<Report>> {
    use futures::FutureExt;
    diagnose_here(uri, options, cfg).boxed()
}

async fn diagnose_here(uri: &str, options: SourceOptions, cfg: DiagnoseConfig) -> Result<Report> {
    if cfg.loader.batch_size == 0 {
        return Err(Error::invalid_option("batch_size must be at least 1"));
    }
    if cfg.samples == 0 {
        return Err(Error::invalid_option("diagnose needs at least 1 sample per step"));
    }
    // Read once, then opened under options of our own: the cache is forced off over the
    // URI's query for the uncached source.
    let request = Request::new(uri, options)?;
    let configured = request.options.clone();
    let mut cache_off = configured.clone();
    cache_off.cache_bytes = Some(0);
    cache_off.disk_cache = Some(false);

    let uncached = request.clone().with_options(cache_off).open().await?;
    if uncached.is_empty() {
        return Err(Error::Empty { uri: uncached.to_string(), reason: "diagnose needs at least one sample".into() });
    }
    // Only remote stores cache (the disk cache is on for them unless turned off).
    let cache = !uncached.capability().local
        && (configured.cache_bytes.unwrap_or(0) > 0 || configured.disk_cache_dir().is_some());
    let full = if cache { request.open().await? } else { uncached.clone() };
    let cached = preload(&uncached, cfg.loader.batch_size, cfg.max_time).await?;
    let mean = cached.iter().map(Sample::total_bytes).sum::<u64>() / cached.len().max(1) as u64;
    let device = cfg.loader.host_buffers.and_then(|h| h.device);
    let setup = Setup {
        source: uncached.to_string(),
        layout: uncached.info().layout.into_owned(),
        remote: !uncached.capability().local,
        len: uncached.len() as u64,
        batch_size: cfg.loader.batch_size,
        prefetch: cfg.loader.prefetch.max(1),
        concurrency: configured.concurrency(),
        max_in_flight: crate::fetch::FetchConfig::from_options(&configured).max_in_flight,
        transform: cfg.loader.transform.is_some() || cfg.loader.decode.is_some(),
        decode: cfg.loader.decode.is_some(),
        transform_threads: cfg.loader.transform_threads.max(1),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cache,
        device,
        copy: match device {
            Some(d) => format!("host-to-device copy to cuda:{d} from pinned buffers (the Loader's device path)"),
            None => "no device configured: a copy into pooled host buffers stands in for the host-to-device copy"
                .to_string(),
        },
        mean_sample_bytes: mean,
    };
    let decoder = match &cfg.loader.decode {
        Some(spec) => Some(Decoder::new(spec, cfg.loader.augment_seed, cfg.loader.transform_threads.max(1))?),
        None => None,
    };
    let ladder = Ladder { cfg, uncached, full, cached, decoder, handle: tokio::runtime::Handle::current() };
    let steps = tokio::task::spawn_blocking(move || ladder.run()).await.map_err(Error::task)??;
    let verdict = verdict::judge(&setup, &steps);
    Ok(Report { setup, steps, verdict })
}

/// Samples kept in memory for the collate step: eight batches, at most 256 MiB, read within
/// one step's time limit (but at least one batch).
async fn preload(src: &Arc<DynSampleSource>, batch: usize, max_time: Duration) -> Result<Vec<Sample>> {
    const MAX_BYTES: u64 = 256 << 20;
    let started = Instant::now();
    let want = src.len().min(batch.saturating_mul(8).max(1));
    let mut out = Vec::with_capacity(want);
    let mut bytes = 0;
    while out.len() < want && ((bytes < MAX_BYTES && started.elapsed() < max_time) || out.len() < batch) {
        let idx: Vec<usize> = (out.len()..(out.len() + batch).min(want)).collect();
        let got = src.get_many(&idx).await?;
        bytes += got.iter().map(Sample::total_bytes).sum::<u64>();
        out.extend(got);
    }
    Ok(out)
}

/// Counts one step's batches against its budget.
struct Meter {
    step: Step,
    started: Instant,
    deadline: Instant,
    budget: u64,
    samples: u64,
    batches: u64,
    bytes: u64,
    /// Time in the step's own part.
    own: Duration,
    /// When the first batch was delivered, and its samples.
    first: Option<(Instant, u64)>,
}

impl Meter {
    fn new(step: Step, cfg: &DiagnoseConfig) -> Self {
        let started = Instant::now();
        Meter {
            step,
            started,
            // A time too far to add is none: the sample budget ends the step.
            deadline: started.checked_add(cfg.max_time).unwrap_or_else(|| started + Duration::from_secs(1 << 40)),
            budget: cfg.samples,
            samples: 0,
            batches: 0,
            bytes: 0,
            own: Duration::ZERO,
            first: None,
        }
    }

    fn add(&mut self, batch: &Batch) {
        self.first.get_or_insert((Instant::now(), batch.len() as u64));
        self.samples += batch.len() as u64;
        self.bytes += batch.payload_bytes();
        self.batches += 1;
    }

    /// Run `f`, counting its time as the step's own part.
    fn own<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.own += t.elapsed();
        out
    }

    /// Never before one batch: a rate over none would be 0 samples/s, and the verdict built
    /// on it nonsense.
    fn done(&self) -> bool {
        self.batches > 0 && (self.samples >= self.budget || Instant::now() >= self.deadline)
    }

    fn finish(self, what: impl Into<String>) -> StepResult {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        StepResult {
            step: self.step,
            what: what.into(),
            samples: self.samples,
            batches: self.batches,
            bytes: self.bytes,
            seconds,
            samples_per_s: self.samples as f64 / seconds,
            mib_per_s: self.bytes as f64 / seconds / (1 << 20) as f64,
            ms_per_batch: seconds * 1e3 / self.batches.max(1) as f64,
            added_ms_per_batch: 0.0,
            own_ms_per_batch: self.own.as_secs_f64() * 1e3 / self.batches.max(1) as f64,
            transform_ms_per_batch: None,
            fetch_p50_ms: None,
            fetch_p99_ms: None,
            consumer_wait_fraction: None,
            steady_samples_per_s: None,
            io: None,
        }
    }
}

/// How the copy step copies a batch.
enum Copier {
    /// A memcpy of every column into a pooled host buffer (no device).
    Host(HostPool),
    /// The real copy, on the copier's stream, waited for.
    Device(Arc<GpuCopier>),
}

impl Copier {
    fn copy(&self, batch: &mut Batch) -> Result<()> {
        match self {
            Copier::Host(pool) => {
                for col in batch.fields() {
                    let mut buf = pool.acquire()?;
                    let cap = buf.capacity();
                    // Larger columns go through in pieces: the same bytes are copied.
                    for piece in col.data.chunks(cap) {
                        buf[..piece.len()].copy_from_slice(piece);
                    }
                    std::hint::black_box(&buf[..]);
                }
                Ok(())
            }
            Copier::Device(copier) => {
                batch.copy_to_device(copier)?;
                wait_device(batch)
            }
        }
    }
}

/// Wait until every column's device copy has landed (what a consumer does before using it).
fn wait_device(batch: &Batch) -> Result<()> {
    let names: Vec<String> = batch.field_names().map(str::to_string).collect();
    for name in names {
        if let Some(d) = batch.device(&name) {
            d.wait()?;
        }
    }
    Ok(())
}

/// Run `f` over `samples` on up to `threads` threads, keeping order (the Loader's split).
fn transform_all(samples: Vec<Sample>, f: &Transform, threads: usize) -> Result<Vec<Sample>> {
    let threads = threads.max(1).min(samples.len().max(1));
    if threads == 1 {
        return samples.into_iter().map(|s| f(s)).collect();
    }
    let parts = crate::loader::split_even(samples, threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|p| scope.spawn(move || p.into_iter().map(|s| f(s)).collect::<Result<Vec<_>>>()))
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.extend(h.join().map_err(|p| Error::callback("the transform", crate::error::panic_message(p)))??);
        }
        Ok(out)
    })
}

/// Everything the steps need, moved onto a blocking thread (the consumer blocks).
struct Ladder {
    cfg: DiagnoseConfig,
    uncached: Arc<DynSampleSource>,
    full: Arc<DynSampleSource>,
    cached: Vec<Sample>,
    /// The decoding the Loader would run, when configured (the collate and fetch steps run it).
    decoder: Option<Decoder>,
    handle: tokio::runtime::Handle,
}

impl Ladder {
    fn consume(&self, batch: &Batch) -> Result<()> {
        match &self.cfg.consumer {
            Some(c) => c(batch),
            None => Ok(()),
        }
    }

    fn transform(&self, samples: Vec<Sample>, spent: &mut Duration) -> Result<Vec<Sample>> {
        let Some(f) = &self.cfg.loader.transform else { return Ok(samples) };
        let t = Instant::now();
        let out = transform_all(samples, f, self.cfg.loader.transform_threads);
        *spent += t.elapsed();
        out
    }

    /// Assemble transformed samples into a batch as the Loader does: decoded when configured
    /// (that time counts as the transform's).
    fn assemble(
        &self,
        pool: &BatchPool,
        epoch: u64,
        number: u64,
        idx: &[u64],
        samples: &[Sample],
        spent: &mut Duration,
    ) -> Result<Batch> {
        let Some(d) = &self.decoder else { return Ok(pool.assemble(epoch, number, idx, samples)) };
        let t = Instant::now();
        let skip = self.cfg.loader.on_error == crate::loader::ErrorPolicy::Skip;
        let out = d.assemble(pool, &*self.full, epoch, number, idx, samples, skip).map(|(b, _)| b);
        *spent += t.elapsed();
        out
    }

    /// Batch storage and the copier, as the Loader would set them up.
    fn pool_and_copier(&self, batch_bytes: usize) -> Result<(BatchPool, Copier)> {
        let (pool, device) = crate::loader::pool_and_copier(&self.cfg.loader)?;
        let copier = match device {
            Some(d) => Copier::Device(d),
            None => Copier::Host(HostPool::new(PoolConfig {
                buffer_bytes: batch_bytes.max(64 << 10),
                buffers: 2,
                device: None,
            })?),
        };
        Ok((pool, copier))
    }

    fn run(self) -> Result<Vec<StepResult>> {
        let b = self.cfg.loader.batch_size;
        let first: Vec<Sample> = self.cached.iter().take(b).cloned().collect();
        let mut spent = Duration::ZERO;
        let first = self.transform(first, &mut spent).map_err(|e| in_step(Step::Consumer, e))?;
        let widest = first.iter().map(Sample::total_bytes).max().unwrap_or(0) as usize;
        let (pool, copier) = self.pool_and_copier(widest.saturating_mul(b))?;
        let indices: Vec<u64> = (0..first.len() as u64).collect();
        let mut batch =
            self.assemble(&pool, 0, 0, &indices, &first, &mut spent).map_err(|e| in_step(Step::Consumer, e))?;

        let mut m = Meter::new(Step::Consumer, &self.cfg);
        while !m.done() {
            m.own(|| self.consume(&batch)).map_err(|e| in_step(Step::Consumer, e))?;
            m.add(&batch);
        }
        let mut steps = vec![m.finish("consumer on one cached batch")];

        let mut m = Meter::new(Step::Copy, &self.cfg);
        while !m.done() {
            m.own(|| copier.copy(&mut batch)).map_err(|e| in_step(Step::Copy, e))?;
            self.consume(&batch).map_err(|e| in_step(Step::Copy, e))?;
            m.add(&batch);
        }
        drop(batch);
        let what = match copier {
            Copier::Device(_) => "+ host-to-device copy",
            Copier::Host(_) => "+ host copy (no GPU)",
        };
        steps.push(m.finish(what));

        steps.push(self.collate(&pool, &copier).map_err(|e| in_step(Step::Collate, e))?);
        steps.push(self.fetch(&pool, &copier).map_err(|e| in_step(Step::Fetch, e))?);
        steps.push(self.pipeline().map_err(|e| in_step(Step::Pipeline, e))?);
        for i in 1..steps.len() {
            steps[i].added_ms_per_batch = steps[i].ms_per_batch - steps[i - 1].ms_per_batch;
        }
        let last = steps.len() - 1;
        steps[last].own_ms_per_batch = steps[last].added_ms_per_batch;
        Ok(steps)
    }

    fn collate(&self, pool: &BatchPool, copier: &Copier) -> Result<StepResult> {
        let b = self.cfg.loader.batch_size;
        let n = self.cached.len();
        let mut spent = Duration::ZERO;
        let mut m = Meter::new(Step::Collate, &self.cfg);
        let mut next = 0usize;
        while !m.done() {
            let idx: Vec<u64> = (0..b.min(n)).map(|i| ((next + i) % n) as u64).collect();
            next += b;
            let samples: Vec<Sample> = idx.iter().map(|&i| self.cached[i as usize].clone()).collect();
            let number = m.batches;
            let mut batch = m.own(|| -> Result<Batch> {
                let samples = self.transform(samples, &mut spent)?;
                self.assemble(pool, 0, number, &idx, &samples, &mut spent)
            })?;
            copier.copy(&mut batch)?;
            self.consume(&batch)?;
            m.add(&batch);
        }
        let batches = m.batches.max(1);
        let mut r = m.finish("+ collation from cached samples");
        if self.cfg.loader.transform.is_some() || self.decoder.is_some() {
            r.what = "+ transform and collation from cached samples".into();
            r.transform_ms_per_batch = Some(spent.as_secs_f64() * 1e3 / batches as f64);
        }
        Ok(r)
    }

    fn fetch(&self, pool: &BatchPool, copier: &Copier) -> Result<StepResult> {
        // Positions in the order the Loader would read them.
        let order = LoaderConfig { host_buffers: None, ..self.cfg.loader.clone() };
        let walker = Loader::new(self.uncached.clone(), order)?;
        let b = self.cfg.loader.batch_size as u64;
        let latency = Histogram::default();
        let before = self.uncached.io_counters();
        let mut spent = Duration::ZERO;
        let mut m = Meter::new(Step::Fetch, &self.cfg);
        let mut epoch = 0;
        'epochs: loop {
            let sampler = walker.sampler(epoch)?;
            if sampler.is_empty() {
                return Err(Error::invalid_option(format!("{} gives this rank no samples", self.uncached)));
            }
            let mut start = 0;
            while start < sampler.len() {
                let end = (start + b).min(sampler.len());
                let idx: Vec<usize> = (start..end).filter_map(|k| sampler.get(k)).map(|i| i as usize).collect();
                start = end;
                let t = Instant::now();
                let mut batch = if self.cfg.loader.transform.is_none() && self.decoder.is_none() {
                    // The Loader's path without a transform: straight into the batch buffers.
                    let mut builder = pool.builder();
                    m.own(|| self.handle.block_on(self.uncached.get_many_into(&idx, &mut builder)))?;
                    latency.record(t.elapsed());
                    builder.finish(epoch, m.batches)
                } else {
                    let samples = m.own(|| self.handle.block_on(self.uncached.get_many(&idx)))?;
                    latency.record(t.elapsed());
                    let samples = self.transform(samples, &mut spent)?;
                    let kept: Vec<u64> = idx.iter().map(|&i| i as u64).collect();
                    self.assemble(pool, epoch, m.batches, &kept, &samples, &mut spent)?
                };
                copier.copy(&mut batch)?;
                self.consume(&batch)?;
                m.add(&batch);
                if m.done() {
                    break 'epochs;
                }
            }
            epoch += 1;
        }
        let batches = m.batches.max(1);
        let mut r = m.finish("+ fetch from storage (cache off)");
        r.fetch_p50_ms = Some(latency.quantile(0.5).as_secs_f64() * 1e3);
        r.fetch_p99_ms = Some(latency.quantile(0.99).as_secs_f64() * 1e3);
        r.io = IoDelta::between(before, self.uncached.io_counters());
        if self.cfg.loader.transform.is_some() || self.decoder.is_some() {
            r.transform_ms_per_batch = Some(spent.as_secs_f64() * 1e3 / batches as f64);
        }
        Ok(r)
    }

    fn pipeline(&self) -> Result<StepResult> {
        let loader = Loader::new(self.full.clone(), self.cfg.loader.clone())?;
        let device = self.cfg.loader.host_buffers.and_then(|h| h.device).is_some();
        let before = self.full.io_counters();
        let mut m = Meter::new(Step::Pipeline, &self.cfg);
        let mut epoch = 0;
        'epochs: loop {
            let mut delivered = false;
            for batch in loader.epoch_blocking(epoch)? {
                let batch = batch?;
                if device {
                    wait_device(&batch)?;
                }
                self.consume(&batch)?;
                m.add(&batch);
                delivered = true;
                if m.done() {
                    break 'epochs;
                }
            }
            if !delivered {
                break;
            }
            epoch += 1;
        }
        let stats = loader.stats();
        let steady = m
            .first
            .filter(|_| m.batches > 1)
            .map(|(at, first)| (m.samples - first) as f64 / at.elapsed().as_secs_f64().max(1e-9));
        let mut r = m.finish("full pipeline (Loader as configured)");
        r.steady_samples_per_s = steady;
        r.fetch_p50_ms = Some(stats.fetch_p50_ms);
        r.fetch_p99_ms = Some(stats.fetch_p99_ms);
        r.consumer_wait_fraction = Some(stats.consumer_wait_fraction);
        r.io = IoDelta::between(before, self.full.io_counters());
        if self.cfg.loader.transform.is_some() || self.decoder.is_some() {
            r.transform_ms_per_batch = Some(stats.transform_mean_ms);
        }
        Ok(r)
    }
}

/// Say which step failed, keeping the error's own words (and its retryability).
fn in_step(step: Step, e: Error) -> Error {
    match e {
        Error::InvalidOption { message } => {
            Error::InvalidOption { message: format!("diagnose, {step} step: {message}") }
        }
        Error::Callback { what, source } => Error::Callback { what: format!("diagnose, {step} step: {what}"), source },
        Error::Internal(message) => Error::Internal(format!("diagnose, {step} step: {message}")),
        other => other,
    }
}
