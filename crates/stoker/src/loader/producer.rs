//! The producer task of one epoch: walks the sampler batch by batch, keeps `prefetch` batch
//! fetches in flight under the byte budget, transforms and decodes, assembles, queues in order.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::{batches_for, kib, AbortOnDrop, ErrorPolicy, LoaderConfig};
use crate::batch::{Batch, BatchPool};
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::pinned::{CopierConfig, GpuCopier, HostPool, PoolConfig};
use crate::sample::Sample;
use crate::sampler::Sampler;
use crate::source::DynSampleSource;
use crate::stats::{add_ns, Stats};

pub(super) struct Producer {
    pub(super) source: Arc<DynSampleSource>,
    pub(super) cfg: LoaderConfig,
    pub(super) stats: Arc<Stats>,
    pub(super) pool: BatchPool,
    pub(super) copier: Option<Arc<GpuCopier>>,
    pub(super) decoder: Option<Arc<Decoder>>,
    pub(super) sampler: Arc<Sampler>,
    pub(super) budget: Arc<Semaphore>,
    pub(super) transform_slots: Arc<Semaphore>,
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

/// Batches fetched at once: `prefetch`, deeper for a mix with a remote source, so that source
/// keeps as many of its samples in flight as it would alone (Little's law: a source with a
/// quarter of each batch needs four times the batches in flight to keep its requests going at
/// the same rate). The byte budget still bounds what all of them hold.
fn fetch_depth(source: &Arc<DynSampleSource>, prefetch: usize) -> usize {
    let p = prefetch.max(1);
    match source.as_mix().and_then(|m| m.min_remote_share()) {
        Some(share) if share > 0.0 => ((p as f64 / share).ceil() as usize).clamp(p, 8 * p),
        _ => p,
    }
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

impl Producer {
    pub(super) async fn run(self, tx: mpsc::Sender<Result<Batch>>) {
        let batch = self.cfg.batch_size as u64;
        let total = batches_for(self.sampler.len(), batch, self.cfg.drop_last);
        super::plan::fit_cache_blocks(&self.source, &self.sampler);
        let ahead =
            super::ahead::WindowAhead::start(&self.source, &self.sampler, batch, total, self.cfg.max_bytes_in_flight)
                .map(Arc::new);
        let plan = super::plan::CachePlan::start(&self.source, &self.sampler, batch);
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
                let (me, estimate, ahead) = (me.clone(), estimate.clone(), ahead.clone());
                // Each fetch is its own task: `buffered` only polls its futures while this loop
                // polls the stream, so fetches in flight would otherwise stall whenever the
                // producer waits for the consumer to take a batch (a full prefetch queue).
                AbortOnDrop(tokio::spawn(async move {
                    let start = b * batch;
                    let end = (start + batch).min(me.sampler.len());
                    let positions: Vec<u64> = (start..end).filter_map(|k| me.sampler.get(k)).collect();
                    if let Some(a) = &ahead {
                        a.before(b).await;
                    }
                    let result = me.fetch(b, &positions).await;
                    if let Some(a) = &ahead {
                        a.after(b);
                    }
                    let bytes = result.as_ref().map_or(0, |x| x.payload_bytes());
                    // The largest batch so far is what the next reservations assume.
                    estimate.fetch_max(kib(bytes).max(1), Relaxed);
                    me.stats.add_in_flight(bytes);
                    (result, permit, bytes) as Fetched
                }))
            })
            .buffered(fetch_depth(&me.source, me.cfg.prefetch));
        futures::pin_mut!(stream);
        let mut next = 0;
        while let Some(fetched) = stream.next().await {
            next += 1;
            if let Some(p) = &plan {
                p.at_batch(next);
            }
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

    /// Batch `number` of samples `indices`, numbered as the whole source's
    /// ([`LoaderConfig::first_index`](super::LoaderConfig::first_index)).
    async fn build(&self, number: u64, indices: &[u64]) -> Result<Batch> {
        let mut batch = self.build_here(number, indices).await?;
        if self.cfg.first_index != 0 {
            batch.shift_indices(self.cfg.first_index);
        }
        Ok(batch)
    }

    /// Batch `number` of this source's samples `indices`.
    async fn build_here(&self, number: u64, indices: &[u64]) -> Result<Batch> {
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
                let _slot =
                    slots.acquire_owned().await.map_err(|e| Error::internal(format!("transform slots: {e}")))?;
                tokio::task::spawn_blocking(move || part.into_iter().map(|s| f(s)).collect::<Result<Vec<_>>>())
                    .await
                    .map_err(|e| Error::callback_task("the transform", e))?
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
