//! What a sampler is asked for: the order, the tail policy, shard layout, partition, and
//! resumable progress.

use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::Arc;

use super::{MixPlan, SamplerError, SamplerResult};

/// [`Order::ShardShuffle`]'s window when none is chosen (Python `shuffle_window`, CLI
/// `--shuffle-window`): 4 shards. Each sample is then shuffled with the samples of 3 other
/// shards (thousands of samples at common shard sizes, more than webdataset's usual
/// 1,000-sample shuffle buffer), while a loader holds at most two windows (8 shards) in
/// memory and reads each window as 4 shards' worth of large parallel requests.
pub const DEFAULT_SHARD_WINDOW: usize = 4;

/// How the samples of an epoch are ordered globally (before the rank split).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Order {
    /// `0, 1, .., n-1` every epoch.
    Sequential,
    /// A fresh full permutation each epoch, keyed by `(seed, epoch)`.
    Shuffle {
        /// Base seed; combine with the epoch for the permutation key.
        seed: u64,
    },
    /// Shard-aware block shuffle for sequential-read storage (tar shards):
    /// permute the shards, walk them in groups of `window` consecutive
    /// permuted shards, and shuffle the samples of each group together. Only
    /// `window` shards need to be open at a time, at the cost of less mixing.
    /// Requires [`SamplerConfig::shards`]. Over a remote store the
    /// [`Loader`](crate::loader::Loader) reads each window's shards ahead with a
    /// few large requests, in this order
    /// ([`Sampler::shard_windows`](super::Sampler::shard_windows)), holding at
    /// most two windows.
    ShardShuffle {
        /// Base seed; combine with the epoch for the permutation keys.
        seed: u64,
        /// Number of shards whose samples are shuffled together (>= 1).
        window: usize,
    },
}

/// How to equalise rank lengths when the sample count is not divisible by the
/// world size. Equal lengths matter: a rank that runs out early would leave
/// the others hanging in a collective at the end of the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tail {
    /// Drop the last `remaining % world_size` positions: every rank gets
    /// `floor(remaining / world_size)` samples and nothing repeats.
    Drop,
    /// Pad by wrapping around to the start of the epoch order: every rank gets
    /// `ceil(remaining / world_size)` samples. The padding (fewer than
    /// `world_size` positions) re-delivers samples from the head of the epoch
    /// order; those are the only repeats. Matches PyTorch's default.
    #[default]
    Wrap,
}

/// Contiguous sample ranges of the shards, in storage order (as in tar
/// shards): shard `i` holds samples `starts[i]..starts[i + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// `num_shards + 1` prefix sums, never empty.
    starts: Vec<u64>,
}

impl ShardLayout {
    /// Builds the layout from per-shard sample counts (empty shards allowed).
    pub fn from_sizes(sizes: &[u64]) -> SamplerResult<Self> {
        let mut starts = vec![0];
        let mut total = 0u64;
        for &size in sizes {
            total = total.checked_add(size).ok_or(SamplerError::Overflow)?;
            starts.push(total);
        }
        Ok(Self { starts })
    }

    /// Number of shards.
    pub fn num_shards(&self) -> u64 {
        self.starts.len() as u64 - 1
    }

    /// Total number of samples over all shards.
    pub fn total(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The sample range of `shard`, or `None` if there is no such shard.
    pub fn range(&self, shard: u64) -> Option<Range<u64>> {
        let i = usize::try_from(shard).ok()?;
        Some(*self.starts.get(i)?..*self.starts.get(i.checked_add(1)?)?)
    }
}

/// Which slice of the job this process is: `rank` of `world_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// This process's rank, below `world_size`.
    pub rank: u64,
    /// Number of ranks sharing the data.
    pub world_size: u64,
    /// Rank within the node, as reported by the launcher (`LOCAL_RANK`).
    pub local_rank: Option<u64>,
    /// Ranks on this node, as reported by the launcher (`LOCAL_WORLD_SIZE`). With
    /// `local_rank`, it tells which ranks share this node's disk cache: the ranks
    /// `rank - local_rank ..` of the node (torchrun numbers a node's ranks contiguously), so
    /// the cache plans for all of their reads, not only this rank's.
    pub local_world_size: Option<u64>,
}

impl Partition {
    /// An explicit partition, validated.
    pub fn new(rank: u64, world_size: u64) -> SamplerResult<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(SamplerError::InvalidRank { rank, world_size });
        }
        let (local_rank, local_world_size) = (None, None);
        Ok(Self { rank, world_size, local_rank, local_world_size })
    }

    /// This partition, as rank `local_rank` of the `local_world_size` ranks on its node
    /// (numbered contiguously: ranks `rank - local_rank ..` share the node).
    pub fn on_node(self, local_rank: u64, local_world_size: u64) -> SamplerResult<Self> {
        let fits = local_rank < local_world_size && local_rank <= self.rank && local_world_size <= self.world_size;
        if !fits {
            return Err(SamplerError::Env {
                var: "LOCAL_RANK",
                message: format!(
                    "local rank {local_rank} of {local_world_size} on the node does not fit rank {} of {}",
                    self.rank, self.world_size
                ),
            });
        }
        Ok(Self { local_rank: Some(local_rank), local_world_size: Some(local_world_size), ..self })
    }

    /// The ranks sharing this node (and its disk cache): only this one unless the launcher
    /// said ([`on_node`](Self::on_node), `LOCAL_RANK` with `LOCAL_WORLD_SIZE`).
    pub fn node_ranks(&self) -> std::ops::Range<u64> {
        match (self.local_rank, self.local_world_size) {
            (Some(l), Some(n)) if l < n && l <= self.rank => {
                let first = self.rank - l;
                first..(first + n).min(self.world_size)
            }
            _ => self.rank..self.rank + 1,
        }
    }

    /// Rank 0 of 1: a non-distributed run.
    pub fn single() -> Self {
        let (rank, world_size, local_rank, local_world_size) = (0, 1, None, None);
        Self { rank, world_size, local_rank, local_world_size }
    }

    /// Reads `RANK`, `WORLD_SIZE` and `LOCAL_RANK` as set by torchrun-style
    /// launchers. Both of the first two absent means rank 0 of 1; one without
    /// the other, unparsable values or out-of-range ranks are errors, because
    /// silently training on the wrong slice is worse than failing at start-up.
    pub fn from_env() -> SamplerResult<Self> {
        Self::from_lookup(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`Partition::from_env`] with a custom variable lookup, so tests need
    /// not mutate the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> SamplerResult<Self> {
        let err = |var, message| SamplerError::Env { var, message };
        let parse = |var: &'static str| match lookup(var) {
            None => Ok(None),
            Some(raw) => raw
                .trim()
                .parse()
                .map(Some)
                .map_err(|e| err(var, format!("cannot parse {raw:?} as a non-negative integer ({e})"))),
        };
        let missing = |var, other| err(var, format!("is not set but {other} is; set both or neither"));
        let (rank, world_size) = match (parse("RANK")?, parse("WORLD_SIZE")?) {
            (None, None) => (0, 1),
            (Some(r), Some(w)) => (r, w),
            (Some(_), None) => return Err(missing("WORLD_SIZE", "RANK")),
            (None, Some(_)) => return Err(missing("RANK", "WORLD_SIZE")),
        };
        let mut p = Self::new(rank, world_size)?;
        p.local_rank = parse("LOCAL_RANK")?;
        if let Some(l) = p.local_rank.filter(|&l| l >= world_size) {
            return Err(err("LOCAL_RANK", format!("{l} is not below WORLD_SIZE {world_size}")));
        }
        match (p.local_rank, parse("LOCAL_WORLD_SIZE")?) {
            // A launcher's node numbers that do not fit the ranks are ignored, not fatal: they
            // only say which ranks share a cache.
            (Some(l), Some(n)) => Ok(p.on_node(l, n).unwrap_or(p)),
            _ => Ok(p),
        }
    }
}

/// Everything a [`Sampler`](super::Sampler) needs except resume progress.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// Number of samples in the dataset.
    pub n: u64,
    /// Global order of each epoch.
    pub order: Order,
    /// Epoch to sample; shuffled orders change with it.
    pub epoch: u64,
    /// This process's rank and the world size.
    pub partition: Partition,
    /// How to equalise rank lengths.
    pub tail: Tail,
    /// This loader worker's id within the rank, below `num_workers`.
    pub worker: u64,
    /// Loader workers per rank; they split the rank's sequence round-robin.
    pub num_workers: u64,
    /// Shard structure; required by [`Order::ShardShuffle`], ignored otherwise.
    /// Shared so that per-worker samplers do not copy the table.
    pub shards: Option<Arc<ShardLayout>>,
    /// For a mix of sources, its plan; `n` must then be the plan's epoch length and indices
    /// are global indices of the mix (see [`MixPlan`]).
    pub mix: Option<Arc<MixPlan>>,
    /// Only the epoch's global positions in this range (in the storage order, the samples
    /// with these indices): a part of an epoch read on its own, as one read task of a
    /// distributed reader (Ray Data) reads its shards, with each sample's index (and so its
    /// augmentation) what it is in the whole. Ranks and workers split the span as they split
    /// an epoch, never padded past its end (as [`Tail::Drop`]). `None`: the whole epoch.
    pub span: Option<std::ops::Range<u64>>,
}

impl SamplerConfig {
    /// Epoch 0, rank 0 of 1, one worker, [`Tail::Wrap`], no shard layout.
    pub fn new(n: u64, order: Order) -> Self {
        Self {
            n,
            order,
            epoch: 0,
            partition: Partition::single(),
            tail: Tail::default(),
            worker: 0,
            num_workers: 1,
            shards: None,
            mix: None,
            span: None,
        }
    }
}

/// Resumable progress through an epoch, independent of the world size.
///
/// `consumed` counts samples delivered globally, summed over ranks: global
/// positions `[0, consumed)` of the epoch are done. A rank-synchronous
/// training loop takes the same number of samples on every rank, so after
/// each rank took `s` samples of a run that started at `c`, `consumed` is
/// `c + s * world_size` (see [`Sampler::state_after`](super::Sampler::state_after)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Dataset size, recorded so that a changed dataset is caught on restore.
    pub n: u64,
    /// Order in use when the state was taken.
    pub order: Order,
    /// Epoch in progress.
    pub epoch: u64,
    /// Global positions of the epoch already delivered.
    pub consumed: u64,
    /// The mix's [`MixPlan::fingerprint`] when the order is over a mix, so a state is only
    /// restored onto the same mix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<u64>,
}
