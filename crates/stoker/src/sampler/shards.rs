//! [`Order::ShardShuffle`](super::Order::ShardShuffle)'s plan: shards permuted, then walked
//! in windows whose samples are shuffled together.

use std::sync::Arc;

use super::{derive_key, Permutation, ShardLayout};

/// Key-derivation domain tags, so shard-level and group-level permutations of
/// the same (seed, epoch) are independent of each other and of `Shuffle`.
const TAG_SHARDS: u64 = 1;
const TAG_GROUP: u64 = 2;

/// The current shard group of an iterator, so consecutive samples of a group
/// skip the shard-permutation lookups. Its Vec is reused across groups, so
/// it allocates at most a few times per epoch, never per sample.
#[derive(Clone, Debug, Default)]
pub(super) struct GroupCache {
    group: Option<usize>,
    perm: Permutation,
    /// `(first sample, sample count)` of each member shard, in group order.
    members: Vec<(u64, u64)>,
}

#[derive(Clone, Debug)]
pub(super) struct ShardPlan {
    pub(super) layout: Arc<ShardLayout>,
    pub(super) shard_perm: Permutation,
    pub(super) window: u64,
    group_key: u64,
    /// Global position where each group begins, then `n`: one word per
    /// window of shards, the only per-epoch allocation.
    pub(super) group_starts: Vec<u64>,
}

impl ShardPlan {
    pub(super) fn new(layout: Arc<ShardLayout>, seed: u64, epoch: u64, window: u64) -> Self {
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

    pub(super) fn at(&self, p: u64, cache: Option<&mut GroupCache>) -> u64 {
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
