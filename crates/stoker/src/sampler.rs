//! The sampler decides which sample indices each rank (and each loader worker
//! within a rank) reads, in which order, for every epoch, and how to resume in
//! the middle of an epoch, including at a different world size.
//!
//! # Model
//!
//! For an epoch, the *global order* is `g(0), g(1), .., g(n-1)`, a bijection
//! over `[0, n)` chosen by [`Order`]. A run covers the global positions
//! `[start, end)`: `start` is the number of positions already delivered (0 for a
//! fresh epoch, [`SamplerState::consumed`] on resume) and `end` is chosen by
//! [`Tail`] so that the `world_size` ranks all get the same number of samples.
//! Rank `r` takes the positions `start + r + world_size * j`; position `p >= n`
//! (only with [`Tail::Wrap`]) delivers `g(p % n)`. Loader workers of a rank
//! split the rank's sequence the same way: worker `w` of `k` takes rank
//! indices `w, w + k, w + 2k, ..`.
//!
//! Nothing here allocates per sample: a permutation is a handful of round keys,
//! and [`Order::ShardShuffle`] keeps one `u64` per shard window per epoch.
//!
//! A weighted mix of sources ([`MixPlan`], in [`SamplerConfig::mix`]) is one more order
//! over positions: `n` is then the mix's epoch length and each position maps to a draw of
//! one source. Partitioning, workers and (elastic) resume are the same code as for one source.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::iter::FusedIterator;
use std::ops::Range;
use std::sync::Arc;

mod mix;
pub use mix::{EpochLength, MixPlan};

/// Result alias for sampler operations.
pub type SamplerResult<T> = Result<T, SamplerError>;

/// Why a sampler could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SamplerError {
    /// `world_size` is 0, or `rank` is not below it.
    InvalidRank {
        /// The requested rank.
        rank: u64,
        /// The requested world size.
        world_size: u64,
    },
    /// The loader-worker count is 0, or the worker id is not below it.
    InvalidWorker {
        /// The requested worker id.
        worker: u64,
        /// The requested worker count.
        num_workers: u64,
    },
    /// [`Order::ShardShuffle`] had `window == 0`.
    ZeroWindow,
    /// [`Order::ShardShuffle`] needs a [`ShardLayout`] covering exactly `n`
    /// samples; `shard_total` is `None` when no layout was given.
    InvalidShardLayout {
        /// The configured sample count.
        n: u64,
        /// The number of samples the layout covers, if there is one.
        shard_total: Option<u64>,
    },
    /// A [`SamplerState`] saved for another dataset size was restored.
    StateMismatch {
        /// The sample count recorded in the state.
        state_n: u64,
        /// The sample count of the configuration restoring it.
        n: u64,
    },
    /// A launcher environment variable is unparsable or inconsistent.
    Env {
        /// The variable at fault.
        var: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// Sample positions (total shard size, or `n` plus padding) exceed `u64`.
    Overflow,
    /// A mix's weights, sizes or epoch length cannot make a plan, or an order cannot apply to it.
    Mix {
        /// What is wrong and what to do.
        reason: String,
    },
    /// A [`SamplerState`] saved for another mix (or for no mix) was restored.
    MixMismatch {
        /// Whether the state was saved from a mix.
        state_is_mix: bool,
        /// Whether the configuration restoring it is a mix.
        is_mix: bool,
    },
}

impl fmt::Display for SamplerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidRank { world_size: 0, .. } => write!(f, "world_size must be at least 1"),
            Self::InvalidRank { rank, world_size } => {
                write!(f, "rank {rank} is not below world_size {world_size}")
            }
            Self::InvalidWorker { num_workers: 0, .. } => {
                write!(f, "num_workers must be at least 1")
            }
            Self::InvalidWorker { worker, num_workers } => {
                write!(f, "worker {worker} is not below num_workers {num_workers}")
            }
            Self::ZeroWindow => write!(f, "shard_shuffle window must be at least 1 shard"),
            Self::InvalidShardLayout { shard_total: None, .. } => {
                write!(f, "order shard_shuffle needs a shard layout, but none was given")
            }
            Self::InvalidShardLayout { n, shard_total: Some(t) } => {
                write!(f, "the shard layout covers {t} samples but n is {n}")
            }
            Self::StateMismatch { state_n, n } => {
                write!(f, "sampler state is for {state_n} samples but n is {n}")
            }
            Self::Env { var, message } => write!(f, "environment variable {var}: {message}"),
            Self::Overflow => write!(f, "sample positions overflow u64 (n is too large)"),
            Self::Mix { reason } => write!(f, "mix: {reason}"),
            Self::MixMismatch { state_is_mix: true, is_mix: true } => write!(
                f,
                "the saved state is for another mix (its sources' sizes, weights, epoch length or replacement \
                 differ); restore it with the mix it was saved from, or start the epoch afresh"
            ),
            Self::MixMismatch { state_is_mix, .. } => write!(
                f,
                "the saved state is {} a mix but this source is {}",
                if *state_is_mix { "for" } else { "not for" },
                if *state_is_mix { "not" } else { "one" }
            ),
        }
    }
}

impl std::error::Error for SamplerError {}

/// Feistel rounds. Four suffice in theory (Luby-Rackoff) for balanced halves;
/// two more cover the one-bit imbalance and the cheap round function.
const ROUNDS: usize = 6;
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Key-derivation domain tags, so shard-level and group-level permutations of
/// the same (seed, epoch) are independent of each other and of `Shuffle`.
const TAG_SHARDS: u64 = 1;
const TAG_GROUP: u64 = 2;

/// splitmix64's finaliser: a cheap bijective mixer with full avalanche.
fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(GOLDEN);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Folds several words into one key; position-dependent, so `(a, b)` and
/// `(b, a)` give different keys.
fn derive_key(parts: &[u64]) -> u64 {
    parts.iter().fold(0x5354_4F4B_4552_5F31, |h, &p| mix(h.rotate_left(23) ^ mix(p)))
}

fn low_mask(bits: u32) -> u64 {
    u64::MAX.checked_shr(64 - bits).unwrap_or(0)
}

/// A keyed pseudo-random bijection over `[0, n)` in O(1) memory.
///
/// It runs an (unbalanced when the bit count is odd) Feistel network over the
/// smallest power-of-two domain `>= n` and cycle-walks back into `[0, n)`.
/// Because the domain is below `2n`, a lookup costs fewer than two network
/// evaluations on average. Works for every `n` from 0 to `u64::MAX`. The
/// default value is the empty permutation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    left_bits: u32,
    right_bits: u32,
    round_keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `[0, n)` for `(seed, epoch)`; a new epoch gives an
    /// unrelated order.
    pub fn new(n: u64, seed: u64, epoch: u64) -> Self {
        Self::with_key(n, derive_key(&[seed, epoch]))
    }

    /// The permutation of `[0, n)` for an already-derived 64-bit key.
    pub fn with_key(n: u64, key: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let round_keys = std::array::from_fn(|i| mix(key ^ mix(i as u64 + 1)));
        Self { n, left_bits: bits / 2, right_bits: bits - bits / 2, round_keys }
    }

    /// The size of the permuted range.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the permuted range is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The image of `i`. Inputs `i >= n` are returned unchanged rather than
    /// panicking, which keeps this a bijection on all of `u64`.
    pub fn apply(&self, i: u64) -> u64 {
        if i >= self.n {
            return i;
        }
        // Cycle-walking terminates: `i`'s cycle in the power-of-two domain
        // returns to `i`, which is in range, so some element on it is.
        let mut x = i;
        loop {
            x = self.encrypt(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn encrypt(&self, x: u64) -> u64 {
        let (mut wl, mut wr) = (self.left_bits, self.right_bits);
        let (mut l, mut r) = (x >> wr, x & low_mask(wr));
        for &k in &self.round_keys {
            // The halves swap roles (and widths) every round; an even number
            // of rounds restores the original layout for packing.
            let f = mix(r ^ k) & low_mask(wl);
            (l, r) = (r, l ^ f);
            (wl, wr) = (wr, wl);
        }
        (l << wr) | r
    }
}

/// [`Order::ShardShuffle`]'s window when none is chosen (Python `shuffle_window`, CLI
/// `--shuffle-window`): 4 shards. Each sample is then shuffled with the samples of 3 other
/// shards (thousands of samples at common shard sizes, more than webdataset's usual
/// 1,000-sample shuffle buffer), while a loader holds at most two windows (8 shards) in
/// memory and reads each window as 4 shards' worth of large parallel requests.
pub const DEFAULT_SHARD_WINDOW: usize = 4;

/// How the samples of an epoch are ordered globally (before the rank split).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
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
    /// few large requests, in this order ([`Sampler::shard_windows`]), holding
    /// at most two windows.
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
    /// Rank within the node, as reported by the launcher; informational only.
    pub local_rank: Option<u64>,
}

impl Partition {
    /// An explicit partition, validated.
    pub fn new(rank: u64, world_size: u64) -> SamplerResult<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(SamplerError::InvalidRank { rank, world_size });
        }
        let local_rank = None;
        Ok(Self { rank, world_size, local_rank })
    }

    /// Rank 0 of 1: a non-distributed run.
    pub fn single() -> Self {
        let (rank, world_size, local_rank) = (0, 1, None);
        Self { rank, world_size, local_rank }
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
        match p.local_rank {
            Some(l) if l >= world_size => Err(err("LOCAL_RANK", format!("{l} is not below WORLD_SIZE {world_size}"))),
            _ => Ok(p),
        }
    }
}

/// Everything a [`Sampler`] needs except resume progress.
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
        }
    }
}

/// Resumable progress through an epoch, independent of the world size.
///
/// `consumed` counts samples delivered globally, summed over ranks: global
/// positions `[0, consumed)` of the epoch are done. A rank-synchronous
/// training loop takes the same number of samples on every rank, so after
/// each rank took `s` samples of a run that started at `c`, `consumed` is
/// `c + s * world_size` (see [`Sampler::state_after`]).
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

/// The current shard group of an iterator, so consecutive samples of a group
/// skip the shard-permutation lookups. Its Vec is reused across groups, so
/// it allocates at most a few times per epoch, never per sample.
#[derive(Clone, Debug, Default)]
struct GroupCache {
    group: Option<usize>,
    perm: Permutation,
    /// `(first sample, sample count)` of each member shard, in group order.
    members: Vec<(u64, u64)>,
}

#[derive(Clone, Debug)]
struct ShardPlan {
    layout: Arc<ShardLayout>,
    shard_perm: Permutation,
    window: u64,
    group_key: u64,
    /// Global position where each group begins, then `n`: one word per
    /// window of shards, the only per-epoch allocation.
    group_starts: Vec<u64>,
}

impl ShardPlan {
    fn new(layout: Arc<ShardLayout>, seed: u64, epoch: u64, window: u64) -> Self {
        let shards = layout.num_shards();
        let mut plan = Self {
            shard_perm: Permutation::with_key(shards, derive_key(&[seed, epoch, TAG_SHARDS])),
            group_key: derive_key(&[seed, epoch, TAG_GROUP]),
            group_starts: vec![0],
            layout,
            window,
        };
        let mut pos = 0;
        for g in 0..shards.div_ceil(window) {
            pos += plan.members(g).map(|(_, len)| len).sum::<u64>();
            plan.group_starts.push(pos);
        }
        plan
    }

    /// `(first sample, sample count)` of each shard of `group`, in order.
    fn members(&self, group: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let lo = group.saturating_mul(self.window);
        let hi = lo.saturating_add(self.window).min(self.layout.num_shards());
        (lo..hi).map(|t| {
            let r = self.layout.range(self.shard_perm.apply(t)).unwrap_or(0..0);
            (r.start, r.end - r.start)
        })
    }

    fn at(&self, p: u64, cache: Option<&mut GroupCache>) -> u64 {
        // The last group starting at or before `p` (skips empty groups).
        let g = self.group_starts.partition_point(|&s| s <= p).saturating_sub(1);
        let begin = self.group_starts[g];
        let size = self.group_starts.get(g + 1).map_or(0, |&end| end - begin);
        let perm = || Permutation::with_key(size, derive_key(&[self.group_key, g as u64]));
        let pick = |mut q: u64, members: &mut dyn Iterator<Item = (u64, u64)>| {
            for (start, len) in members {
                if q < len {
                    return start + q;
                }
                q -= len;
            }
            p // unreachable: the group's members hold exactly `size` samples
        };
        match cache {
            Some(c) => {
                if c.group != Some(g) {
                    c.members.clear();
                    c.members.extend(self.members(g as u64));
                    c.perm = perm();
                    c.group = Some(g);
                }
                pick(c.perm.apply(p - begin), &mut c.members.iter().copied())
            }
            None => pick(perm().apply(p - begin), &mut self.members(g as u64)),
        }
    }
}

#[derive(Clone, Debug)]
enum Plan {
    Sequential,
    Shuffle(Permutation),
    Shards(ShardPlan),
    Mix(Arc<MixPlan>, mix::MixEpoch),
}

/// The indices one rank (or one loader worker of a rank) reads in one run
/// over an epoch. Cloning copies [`Order::ShardShuffle`]'s small group table.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    start: u64,
    rank_len: u64,
    plan: Plan,
}

impl Sampler {
    /// A sampler for a fresh pass over `cfg.epoch`.
    pub fn new(cfg: SamplerConfig) -> SamplerResult<Self> {
        Self::build(cfg, 0)
    }

    /// Continues from `state` with `cfg`'s partition, workers and tail policy;
    /// the order and epoch come from the state.
    ///
    /// The world size may differ from the one that saved the state: the
    /// positions `[consumed, n)` are repartitioned over the new ranks with
    /// equal lengths, `cfg.tail` applied to that remaining count. So with
    /// [`Tail::Drop`] no sample is delivered twice in an epoch across any
    /// number of restarts, and only the final run's tail (fewer than its
    /// `world_size` samples) is skipped.
    /// With [`Tail::Wrap`] every sample is delivered, and the only repeats are
    /// padding positions `>= n`, which re-deliver the head of the epoch order.
    pub fn resume(cfg: SamplerConfig, state: &SamplerState) -> SamplerResult<Self> {
        if state.n != cfg.n {
            let (state_n, n) = (state.n, cfg.n);
            return Err(SamplerError::StateMismatch { state_n, n });
        }
        if state.mix != cfg.mix.as_ref().map(|m| m.fingerprint()) {
            let (state_is_mix, is_mix) = (state.mix.is_some(), cfg.mix.is_some());
            return Err(SamplerError::MixMismatch { state_is_mix, is_mix });
        }
        let (order, epoch) = (state.order.clone(), state.epoch);
        Self::build(SamplerConfig { order, epoch, ..cfg }, state.consumed)
    }

    /// A fresh pass over another epoch with the same configuration.
    pub fn with_epoch(&self, epoch: u64) -> SamplerResult<Self> {
        Self::build(SamplerConfig { epoch, ..self.cfg.clone() }, 0)
    }

    fn build(cfg: SamplerConfig, start: u64) -> SamplerResult<Self> {
        let Partition { rank, world_size, .. } = cfg.partition;
        Partition::new(rank, world_size)?;
        let (worker, num_workers) = (cfg.worker, cfg.num_workers);
        if num_workers == 0 || worker >= num_workers {
            return Err(SamplerError::InvalidWorker { worker, num_workers });
        }
        let plan = match (&cfg.mix, &cfg.order) {
            (Some(m), order) => {
                if m.len() != cfg.n {
                    return Err(SamplerError::Mix {
                        reason: format!("n is {} but the mix's epoch length is {}", cfg.n, m.len()),
                    });
                }
                Plan::Mix(m.clone(), m.epoch(order, cfg.epoch)?)
            }
            (None, order) => Self::single_plan(&cfg, order)?,
        };
        let remaining = cfg.n.saturating_sub(start);
        let rank_len = match cfg.tail {
            Tail::Drop => remaining / world_size,
            Tail::Wrap => remaining.div_ceil(world_size),
        };
        // Reject runs whose padded end does not fit in a u64 here, so that no
        // position arithmetic later can overflow.
        let end = u128::from(start) + u128::from(rank_len) * u128::from(world_size);
        if end > u128::from(u64::MAX) {
            return Err(SamplerError::Overflow);
        }
        Ok(Self { cfg, start, rank_len, plan })
    }

    /// The plan of a single source's order.
    fn single_plan(cfg: &SamplerConfig, order: &Order) -> SamplerResult<Plan> {
        Ok(match *order {
            Order::Sequential => Plan::Sequential,
            Order::Shuffle { seed } => Plan::Shuffle(Permutation::new(cfg.n, seed, cfg.epoch)),
            Order::ShardShuffle { seed, window } => {
                if window == 0 {
                    return Err(SamplerError::ZeroWindow);
                }
                let shard_total = cfg.shards.as_ref().map(|s| s.total());
                match &cfg.shards {
                    Some(layout) if shard_total == Some(cfg.n) => {
                        Plan::Shards(ShardPlan::new(layout.clone(), seed, cfg.epoch, window as u64))
                    }
                    _ => return Err(SamplerError::InvalidShardLayout { n: cfg.n, shard_total }),
                }
            }
        })
    }

    /// Number of indices this sampler yields (this worker's share).
    pub fn len(&self) -> u64 {
        match self.rank_len.checked_sub(self.cfg.worker) {
            Some(left) if left > 0 => (left - 1) / self.cfg.num_workers + 1,
            _ => 0,
        }
    }

    /// Whether [`Sampler::len`] is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of indices the whole rank yields this run: the same on every
    /// rank. Worker shares of it differ by at most one.
    pub fn rank_len(&self) -> u64 {
        self.rank_len
    }

    /// The configuration in use (order and epoch included).
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// The global position of this sampler's `k`-th index (`>= n` inside
    /// [`Tail::Wrap`] padding), or `None` if `k >= len()`.
    pub fn position(&self, k: u64) -> Option<u64> {
        if k >= self.len() {
            return None;
        }
        let j = self.cfg.worker + self.cfg.num_workers * k;
        Some(self.start + self.cfg.partition.rank + self.cfg.partition.world_size * j)
    }

    /// This sampler's `k`-th sample index, or `None` if `k >= len()`.
    pub fn get(&self, k: u64) -> Option<u64> {
        self.at(k, None)
    }

    fn at(&self, k: u64, cache: Option<&mut GroupCache>) -> Option<u64> {
        // `len() > 0` implies `n > 0`, so the modulo cannot divide by zero.
        let p = self.position(k)? % self.cfg.n;
        Some(match &self.plan {
            Plan::Sequential => p,
            Plan::Shuffle(perm) => perm.apply(p),
            Plan::Shards(plan) => plan.at(p, cache),
            Plan::Mix(plan, epoch) => plan.at(epoch, p),
        })
    }

    /// Iterates over this sampler's indices in order.
    pub fn iter(&self) -> SamplerIter<'_> {
        let (next, len, cache) = (0, self.len(), GroupCache::default());
        SamplerIter { sampler: self, next, len, cache }
    }

    /// The state after every rank has taken `rank_steps` samples this run
    /// (clamped to [`Sampler::rank_len`]); `state_after(0)` restarts this run.
    ///
    /// `rank_steps` counts samples the rank delivered in rank order, summed
    /// over its workers; a loader must therefore hand worker output to
    /// training round-robin (as PyTorch's DataLoader does) for this to be
    /// exact. At the end of an epoch, start the next with
    /// [`Sampler::with_epoch`] instead.
    pub fn state_after(&self, rank_steps: u64) -> SamplerState {
        let steps = rank_steps.min(self.rank_len);
        SamplerState {
            n: self.cfg.n,
            order: self.cfg.order.clone(),
            epoch: self.cfg.epoch,
            consumed: self.start + steps * self.cfg.partition.world_size,
            mix: self.cfg.mix.as_ref().map(|m| m.fingerprint()),
        }
    }

    /// For [`Order::ShardShuffle`], the epoch's shard visiting order, e.g. to
    /// prefetch shards; each run of `window` entries is shuffled together.
    pub fn shard_order(&self) -> Option<impl Iterator<Item = u64> + '_> {
        match &self.plan {
            Plan::Shards(plan) => Some((0..plan.layout.num_shards()).map(|t| plan.shard_perm.apply(t))),
            _ => None,
        }
    }

    /// For [`Order::ShardShuffle`], this sampler's indices cut at window boundaries, in order:
    /// what a reader needs to fetch each window's shards ahead (see [`ShardWindow`]). Windows
    /// this sampler takes nothing from are left out, and so are [`Tail::Wrap`] padding
    /// positions (at most one per sampler, re-delivering the head of the epoch).
    pub fn shard_windows(&self) -> Option<Vec<ShardWindow>> {
        let Plan::Shards(plan) = &self.plan else { return None };
        let Some(first) = self.position(0) else { return Some(Vec::new()) };
        // Position of item k: first + step * k (see `position`).
        let step = self.cfg.partition.world_size * self.cfg.num_workers;
        let first_at_or_after = |pos: u64| pos.saturating_sub(first).div_ceil(step).min(self.len());
        let mut out = Vec::new();
        for (g, bounds) in plan.group_starts.windows(2).enumerate() {
            let items = first_at_or_after(bounds[0])..first_at_or_after(bounds[1]);
            if items.is_empty() {
                continue;
            }
            let lo = g as u64 * plan.window;
            let hi = lo.saturating_add(plan.window).min(plan.layout.num_shards());
            out.push(ShardWindow { items, shards: (lo..hi).map(|t| plan.shard_perm.apply(t)).collect() });
        }
        Some(out)
    }
}

/// One window of [`Order::ShardShuffle`] as one sampler sees it ([`Sampler::shard_windows`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardWindow {
    /// The sampler's items in this window: `k` such that [`Sampler::get`]`(k)` lies in it.
    pub items: Range<u64>,
    /// The window's shards in visiting order (its samples are shuffled together).
    pub shards: Vec<u64>,
}

/// Iterator over a [`Sampler`]'s indices; `nth` skips in O(1).
#[derive(Clone, Debug)]
pub struct SamplerIter<'a> {
    sampler: &'a Sampler,
    next: u64,
    len: u64,
    cache: GroupCache,
}

impl Iterator for SamplerIter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let k = self.next;
        self.next = k.saturating_add(1).min(self.len);
        self.sampler.at(k, Some(&mut self.cache))
    }

    fn nth(&mut self, n: usize) -> Option<u64> {
        self.next = self.next.saturating_add(n as u64).min(self.len);
        self.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.len - self.next).ok();
        (left.unwrap_or(usize::MAX), left)
    }
}

impl ExactSizeIterator for SamplerIter<'_> {}
impl FusedIterator for SamplerIter<'_> {}
