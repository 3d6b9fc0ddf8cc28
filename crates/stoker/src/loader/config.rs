//! What a Loader is asked to do: batch size, order, partition, prefetch, budget, error
//! policy, transform and decoding, host buffers; and where it stands (resume state).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::decode::DecodeSpec;
use crate::error::Result;
use crate::sample::Sample;
use crate::sampler::{Order, Partition, SamplerState, Tail};

/// A per-sample transform, run on blocking threads.
pub type Transform = Arc<dyn Fn(Sample) -> Result<Sample> + Send + Sync>;

/// What to do when a batch cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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
    /// With [`Order::ShardShuffle`] over a remote store, the shards of the window being read
    /// are held besides, and the next window's are read early only while both fit in this.
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
    /// Only these positions of each epoch (see [`SamplerConfig::span`](crate::sampler::SamplerConfig::span)):
    /// a part of an epoch, read on its own. `None`: all of it.
    pub span: Option<std::ops::Range<u64>>,
    /// The index in a larger whole of this source's sample 0, when the source is a part of
    /// one (a Ray read task's part of a listing, [`snapshot_spans`](crate::source::snapshot_spans)):
    /// added to the indices batches report and to the index each sample's augmentation draws
    /// from, so the part's batches are the whole's. 0 (a source read as itself); not for a mix.
    pub first_index: u64,
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
    /// Bytes the decode threads' images may hold at once, all together: decoded pixels, codec
    /// buffers and resize scratch, known from each image's header before its pixels exist. A
    /// huge image waits for room rather than every thread holding one, and an image that alone
    /// needs more than a decode may take (at least three quarters of this) is a decode error.
    /// `None`: as much as `max_bytes_in_flight`.
    pub decode_memory_bytes: Option<u64>,
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
            .field("span", &self.span)
            .field("first_index", &self.first_index)
            .field("tail", &self.tail)
            .field("on_error", &self.on_error)
            .field("transform", &self.transform.is_some())
            .field("transform_threads", &self.transform_threads)
            .field("decode", &self.decode)
            .field("decode_memory_bytes", &self.decode_memory_bytes)
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
            span: None,
            first_index: 0,
            tail: Tail::default(),
            on_error: ErrorPolicy::Raise,
            transform: None,
            transform_threads: std::thread::available_parallelism().map_or(2, |n| n.get()).min(super::MAX_THREADS),
            decode: None,
            decode_memory_bytes: None,
            augment_seed: 0,
            host_buffers: None,
        }
    }

    /// The decode memory budget in force: `decode_memory_bytes`, else `max_bytes_in_flight`
    /// (the decode threads may hold as much as the reads in flight do).
    pub fn decode_memory(&self) -> u64 {
        self.decode_memory_bytes.unwrap_or(self.max_bytes_in_flight)
    }
}

/// Resume point of a loader: the sampler state of the epoch in progress (serde).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// Sampler progress; `consumed` counts samples delivered over all ranks.
    pub sampler: SamplerState,
    /// Batch size in use when saved (informational; a different one is allowed).
    pub batch_size: usize,
    /// What the source was: its layout and shard count (`tar, 4 shards`). A state for another
    /// is refused; one without (an earlier version's) is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// For a mix: its sources' names, in order. Sizes and weights alone do not tell two
    /// sources of one size apart: a state for another order of them is refused. Absent in an
    /// earlier version's states, which are taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_sources: Option<Vec<String>>,
}

/// The error for a saved state of a mix whose sources are named otherwise, or in another
/// order, than this loader's (`theirs` against `mine`).
pub(crate) fn other_mix_sources(theirs: &[String], mine: &[String]) -> crate::Error {
    crate::Error::invalid_option(format!(
        "the saved state mixes the sources {} in that order, this loader mixes {}: resume with the same sources in \
         the same order (a source that moved keeps its place when given the name it had)",
        shown_names(theirs),
        shown_names(mine)
    ))
}

/// A saved list of a mix's source names as an error may show it: a damaged state's list (of
/// any length) is not quoted whole.
fn shown_names(names: &[String]) -> String {
    let mut out = String::new();
    for (i, n) in names.iter().enumerate() {
        if out.len() + n.len() > 400 {
            out.push_str(&format!("... ({} more)", names.len() - i));
            break;
        }
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(n);
    }
    format!("[{out}]")
}

impl crate::uri::SourceOptions {
    /// These options with the cache block size a Loader reading in `order` is best served
    /// by, unless they choose one (`cache_block`): [`ORDERED_BLOCK`](crate::cache::ORDERED_BLOCK)
    /// for storage order and the shard shuffle, which read shards front to back (a block
    /// holds more samples read together, and the disk cache writes and opens eight times
    /// fewer files), the 1 MiB default for a shuffle of all samples (each read takes one
    /// sample from a block; a bigger block costs a cache smaller than the data more bytes per
    /// sample kept; over data the disk cache holds whole, the Loader widens it before its
    /// first read, see [`BlockCache::widen_block`](crate::cache::BlockCache::widen_block)).
    pub fn for_order(mut self, order: &Order) -> Self {
        if self.cache_block.is_none() && matches!(order, Order::Sequential | Order::ShardShuffle { .. }) {
            self.cache_block = Some(crate::cache::ORDERED_BLOCK);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uri::SourceOptions;

    #[test]
    fn an_order_that_walks_shards_takes_bigger_blocks_unless_told() {
        use crate::cache::ORDERED_BLOCK;
        let block = |o: SourceOptions, order: Order| o.for_order(&order).cache_block;
        assert_eq!(block(SourceOptions::default(), Order::Sequential), Some(ORDERED_BLOCK));
        assert_eq!(block(SourceOptions::default(), Order::ShardShuffle { seed: 1, window: 4 }), Some(ORDERED_BLOCK));
        assert_eq!(block(SourceOptions::default(), Order::Shuffle { seed: 1 }), None, "the 1 MiB default");
        let told = SourceOptions { cache_block: Some(4096), ..Default::default() };
        assert_eq!(block(told.clone(), Order::Sequential), Some(4096));
        assert_eq!(block(told, Order::Shuffle { seed: 1 }), Some(4096));
    }
}
