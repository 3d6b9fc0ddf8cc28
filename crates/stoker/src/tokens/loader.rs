//! The token loader: this rank's rows of every global batch, read ahead, in order, with a
//! resume state that does not depend on the world size.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::build::{fill, Columns};
use super::plan::{EpochPlan, Piece};
use super::PackConfig;
use crate::batch::{Batch, BatchPool};
use crate::error::{Error, Result};
use crate::source::DynSampleSource;
use crate::stats::{add_ns, Stats, StatsSnapshot};

/// Where a token run stands: the next global batch of an epoch. The same at every rank and
/// world size, so a job restarted on another number of ranks resumes from it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenState {
    /// The epoch in progress.
    pub epoch: u64,
    /// Global batches of it already delivered.
    pub batch: u64,
    /// Documents in the source, to catch a changed dataset on restore.
    pub documents: u64,
    /// Tokens per sequence and sequences per global batch, which define the global batches.
    pub seq_len: usize,
    /// Sequences per global batch.
    pub global_batch: usize,
}

/// Packs a token source's documents into training batches (see [`crate::tokens`]).
pub struct TokenLoader {
    source: Arc<DynSampleSource>,
    cfg: PackConfig,
    cols: Arc<Columns>,
    pool: BatchPool,
    stats: Arc<Stats>,
    plan: Mutex<Option<(u64, Arc<EpochPlan>)>>,
    progress: Arc<Mutex<(TokenState, Option<TokenState>)>>,
    runtime: tokio::runtime::Handle,
    _owned: Option<tokio::runtime::Runtime>,
}

impl TokenLoader {
    /// A loader over `source`, which must hold token documents
    /// ([`crate::SampleSource::as_tokens`]). Uses the current tokio runtime, or starts its own.
    pub fn new(source: Arc<DynSampleSource>, cfg: PackConfig) -> Result<Self> {
        cfg.check()?;
        let Some(docs) = source.as_tokens() else {
            return Err(Error::invalid_option(format!(
                "{source} ({} layout) holds no token documents: packing reads tokenized corpora (layout=tokens: \
                 Megatron .bin/.idx)",
                source.info().layout
            )));
        };
        let documents = docs.documents();
        let (runtime, owned) = match tokio::runtime::Handle::try_current() {
            Ok(h) => (h, None),
            Err(_) => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("stoker-tokens")
                    .build()
                    .map_err(|e| Error::resource("the token loader's tokio runtime", e))?;
                (rt.handle().clone(), Some(rt))
            }
        };
        let state = TokenState { epoch: 0, batch: 0, documents, seq_len: cfg.seq_len, global_batch: cfg.global_batch };
        Ok(TokenLoader {
            cols: Arc::new(Columns::new(&cfg)),
            pool: BatchPool::new(cfg.prefetch + 2),
            stats: Arc::new(Stats::default()),
            plan: Mutex::new(None),
            progress: Arc::new(Mutex::new((state, None))),
            source,
            cfg,
            runtime,
            _owned: owned,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &PackConfig {
        &self.cfg
    }

    /// The plan of `epoch`, made once (a pass over the document lengths).
    fn plan(&self, epoch: u64) -> Result<Arc<EpochPlan>> {
        let mut p = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((e, plan)) = &*p {
            if *e == epoch {
                return Ok(plan.clone());
            }
        }
        let docs = self.source.as_tokens().ok_or_else(|| Error::internal("a token source stopped being one"))?;
        let plan = Arc::new(EpochPlan::new(docs, &self.cfg, epoch)?);
        *p = Some((epoch, plan.clone()));
        Ok(plan)
    }

    /// Global batches in `epoch` (each rank gets its rows of every one).
    pub fn batches(&self, epoch: u64) -> Result<u64> {
        let plan = self.plan(epoch)?;
        let g = self.cfg.global_batch as u64;
        Ok(if self.cfg.pad_tail { plan.sequences.div_ceil(g) } else { plan.sequences / g })
    }

    /// Tokens in `epoch`'s stream (documents with their BOS and EOS).
    pub fn tokens(&self, epoch: u64) -> Result<u64> {
        Ok(self.plan(epoch)?.total_tokens())
    }

    /// Where the run stands (the next global batch to deliver).
    pub fn state(&self) -> TokenState {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Continue from `state`: the next [`epoch`](Self::epoch) call for its epoch starts at its
    /// batch. The world size may differ from the one that saved it.
    pub fn load_state(&self, state: TokenState) -> Result<()> {
        let documents = self.source.as_tokens().map_or(0, |d| d.documents());
        if state.documents != documents
            || state.seq_len != self.cfg.seq_len
            || state.global_batch != self.cfg.global_batch
        {
            return Err(Error::invalid_option(format!(
                "the saved state is for {} documents in global batches of {} x {} tokens; this loader has {documents} \
                 documents and {} x {}: resume with the same data, seq_len and global_batch",
                state.documents, state.global_batch, state.seq_len, self.cfg.global_batch, self.cfg.seq_len
            )));
        }
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        *p = (state.clone(), Some(state));
        Ok(())
    }

    /// Counters since the loader was made.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot_with_damage(self.source.io_counters(), self.source.damage())
    }

    /// This rank's batches of `epoch`, from a loaded state's batch when it is for this epoch.
    pub fn epoch(&self, epoch: u64) -> Result<TokenEpoch> {
        let plan = self.plan(epoch)?;
        let end = self.batches(epoch)?;
        let start = {
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            let start = match p.1.take() {
                Some(s) if s.epoch == epoch => s.batch.min(end),
                _ => 0,
            };
            p.0.epoch = epoch;
            p.0.batch = start;
            start
        };
        let (tx, rx) = mpsc::channel(self.cfg.prefetch.max(1));
        let job = Job {
            source: self.source.clone(),
            cfg: self.cfg.clone(),
            cols: self.cols.clone(),
            pool: self.pool.clone(),
            plan,
            epoch,
        };
        let prefetch = self.cfg.prefetch.max(1);
        let task = self.runtime.spawn(async move {
            let job = Arc::new(job);
            let mut batches = futures::stream::iter(start..end)
                .map(|b| {
                    let job = job.clone();
                    async move { job.batch(b).await }
                })
                .buffered(prefetch);
            while let Some(item) = batches.next().await {
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(TokenEpoch {
            rx,
            task,
            stats: self.stats.clone(),
            progress: self.progress.clone(),
            epoch,
            left: Arc::new(AtomicU64::new(end - start)),
        })
    }
}

/// What a producer needs to build batches.
struct Job {
    source: Arc<DynSampleSource>,
    cfg: PackConfig,
    cols: Arc<Columns>,
    pool: BatchPool,
    plan: Arc<EpochPlan>,
    epoch: u64,
}

impl Job {
    /// This rank's rows of global batch `b`.
    async fn batch(&self, b: u64) -> Result<Batch> {
        let docs = self.source.as_tokens().ok_or_else(|| Error::internal("a token source stopped being one"))?;
        let rows = self.cfg.rows() as u64;
        let first = b * self.cfg.global_batch as u64 + self.cfg.partition.rank * rows;
        let window = self.cfg.window() as u64;
        let planned: Vec<(u64, Vec<_>)> = (first..first + rows)
            .map(|s| {
                let pieces = if s < self.plan.sequences {
                    self.plan.pieces(docs, s)
                } else {
                    vec![(None, Piece::Pad(window))] // past the epoch's last sequence: the padded tail
                };
                (s, pieces)
            })
            .collect();
        let wanted: Vec<(u64, std::ops::Range<u64>)> = planned
            .iter()
            .flat_map(|(_, p)| p.iter())
            .filter_map(|(_, p)| match p {
                Piece::Tokens { doc, span } => Some((*doc, span.clone())),
                _ => None,
            })
            .collect();
        let mut tokens = Vec::with_capacity(rows as usize * window as usize);
        docs.read_into(&wanted, &mut tokens).await?;
        let mut out = self.pool.builder();
        fill(&mut out, &self.cols, &self.cfg, &planned, &tokens)?;
        Ok(out.finish(self.epoch, b))
    }
}

/// One epoch's batches for this rank, in order: an async stream or a blocking iterator.
/// Dropping it stops the reading.
pub struct TokenEpoch {
    rx: mpsc::Receiver<Result<Batch>>,
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
    progress: Arc<Mutex<(TokenState, Option<TokenState>)>>,
    epoch: u64,
    left: Arc<AtomicU64>,
}

impl TokenEpoch {
    /// Batches this run still delivers.
    pub fn remaining(&self) -> u64 {
        self.left.load(Relaxed)
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
        let item = self.rx.recv().await;
        add_ns(&self.stats.consumer_wait_ns, t.elapsed());
        if let Some(i) = &item {
            self.delivered(i);
        }
        item
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
        let item = self.rx.blocking_recv();
        add_ns(&self.stats.consumer_wait_ns, t.elapsed());
        if let Some(i) = &item {
            self.delivered(i);
        }
        item
    }
}

impl Drop for TokenEpoch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
