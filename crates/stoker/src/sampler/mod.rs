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

use std::iter::FusedIterator;
use std::ops::Range;
use std::sync::Arc;

mod config;

pub(crate) mod mix;
mod permutation;
mod shards;

pub use crate::error::{SamplerError, SamplerResult};
pub use config::{Order, Partition, SamplerConfig, SamplerState, ShardLayout, Tail, DEFAULT_SHARD_WINDOW};
pub use mix::{EpochLength, MixPlan};
pub use permutation::Permutation;

use permutation::derive_key;
use shards::{GroupCache, ShardPlan};

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
        // A span runs its positions only: from its start (or a resumed position inside it) to
        // its end, never padded past it.
        let (start, stop, tail) = match &cfg.span {
            None => (start, cfg.n, cfg.tail),
            Some(s) if s.start <= s.end && s.end <= cfg.n => (start.max(s.start), s.end, Tail::Drop),
            Some(s) => return Err(SamplerError::InvalidSpan { start: s.start, end: s.end, n: cfg.n }),
        };
        let remaining = stop.saturating_sub(start);
        let rank_len = match tail {
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
        SamplerIter { sampler: self, next, len, cache, ahead: [0; permutation::LANES * 2], ahead_at: 0, ahead_len: 0 }
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
    /// A shuffle's next indices, computed a run at a time ([`Permutation::apply_all`]):
    /// `ahead[ahead_at..ahead_len]` are those of `next..`.
    ahead: [u64; permutation::LANES * 2],
    ahead_at: usize,
    ahead_len: usize,
}

impl Iterator for SamplerIter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let k = self.next;
        if let Plan::Shuffle(perm) = &self.sampler.plan {
            if k >= self.len {
                return None;
            }
            if self.ahead_at == self.ahead_len {
                let run = (self.len - k).min(self.ahead.len() as u64) as usize;
                for (j, slot) in self.ahead[..run].iter_mut().enumerate() {
                    // `k + j < len`: a position exists, and `n > 0`.
                    *slot = self.sampler.position(k + j as u64).map_or(0, |p| p % self.sampler.cfg.n);
                }
                perm.apply_all(&mut self.ahead[..run]);
                (self.ahead_at, self.ahead_len) = (0, run);
            }
            self.ahead_at += 1;
            self.next = k + 1;
            return Some(self.ahead[self.ahead_at - 1]);
        }
        self.next = k.saturating_add(1).min(self.len);
        self.sampler.at(k, Some(&mut self.cache))
    }

    fn nth(&mut self, n: usize) -> Option<u64> {
        let left = (self.ahead_len - self.ahead_at) as u64;
        let skip = (n as u64).min(self.len - self.next);
        if skip < left {
            self.ahead_at += skip as usize; // still within the run computed ahead
        } else {
            (self.ahead_at, self.ahead_len) = (0, 0);
        }
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
