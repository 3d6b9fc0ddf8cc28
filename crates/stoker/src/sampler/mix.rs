//! The plan of a weighted mix of sources: how many samples each source gives an epoch, which
//! of its samples, and where in the epoch each one lands.
//!
//! # Model
//!
//! A mix's index space concatenates its sources: source `s` holds the global indices
//! `offset(s) .. offset(s) + n(s)`. An epoch has `L` positions (its *length*) and source `s`
//! contributes exactly `c(s)` of them, its weight's share of `L` rounded at the cumulative
//! boundaries: `c(s) = F(s + 1) - F(s)` with `F(k) = round(L * (w(0) + .. + w(k-1)) / W)`.
//! So the counts add up to `L` exactly and each is within one of `L * w(s) / W`.
//!
//! Position `p` of epoch `e` maps to a source and a draw in O(log sources), without any
//! per-sample table:
//!
//! 1. `q = π(p)`, where `π` is the keyed Feistel [`Permutation`] of `[0, L)` for
//!    `(seed, e)`: a bijection, so every `q` is hit exactly once.
//! 2. The source is the `s` with `C(s) <= q < C(s + 1)` (`C` the prefix sums of `c`), and
//!    the draw is `k = q - C(s)`. Because `π` is a bijection, source `s` gets exactly the
//!    draws `0 .. c(s)`, each once, at pseudo-random places of the epoch.
//! 3. Draw `k` becomes a sample of source `s`: with [`Order::Shuffle`], `σ(k)` where `σ` is
//!    the source's own permutation keyed by `(seed, e, s)` (distinct draws give distinct
//!    samples while `c(s) <= n(s)`); with replacement, draw `k` is item `k mod n(s)` of pass
//!    `k / n(s)`, each pass a fresh permutation, so every sample appears `floor(c/n)` or
//!    `ceil(c/n)` times. With [`Order::Sequential`] the source is read in storage order from
//!    where the previous epoch stopped (`(e * c(s) + k) mod n(s)`), so successive epochs walk
//!    through a large source instead of rereading its head; the interleave is still `π`
//!    (keyed by seed 0), since a mix in blocks would not be a mix.
//!
//! Everything above the positions (rank split, loader workers, resume, elastic resume) is
//! the ordinary [`Sampler`](super::Sampler) over `L` positions: the mix is only an order.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{derive_key, Order, Permutation, SamplerError, SamplerResult};

/// Key-derivation tags, so the interleave and the per-source draws of one `(seed, epoch)`
/// are independent of each other and of the plain [`Order::Shuffle`] permutation.
const TAG_MIX_INTERLEAVE: u64 = 3;
const TAG_MIX_DRAW: u64 = 4;

/// Weights become integer parts of this total, so every count is exact integer arithmetic
/// (the same on every machine) and shares are resolved to 2^-32.
const WEIGHT_SCALE: f64 = 4_294_967_296.0;

/// How long a mix's epoch is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EpochLength {
    /// Without replacement: the longest epoch in which no source's share exceeds its size
    /// (the source that runs out first sets it). With replacement: every source's size
    /// added up.
    #[default]
    Auto,
    /// Exactly this many samples per epoch.
    Fixed(u64),
}

/// A weighted mix of sources over a concatenated index space: the per-epoch counts and the
/// map from epoch positions to global indices (see the [module docs](crate::sampler)).
#[derive(Clone, PartialEq, Eq)]
pub struct MixPlan {
    /// Samples in each source.
    sizes: Vec<u64>,
    /// Global index of each source's first sample, then the total.
    offsets: Vec<u64>,
    /// Integer weight parts (prefix sums, starting at 0).
    parts: Vec<u64>,
    /// Samples each source gives an epoch, as prefix sums starting at 0: source `s` holds
    /// epoch draws `starts[s] .. starts[s + 1]` of the interleave's range.
    starts: Vec<u64>,
    replacement: bool,
    fingerprint: u64,
}

impl fmt::Debug for MixPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MixPlan")
            .field("sizes", &self.sizes)
            .field("counts", &self.counts().collect::<Vec<_>>())
            .field("len", &self.len())
            .field("replacement", &self.replacement)
            .finish()
    }
}

fn mix_error(reason: impl Into<String>) -> SamplerError {
    SamplerError::Mix { reason: reason.into() }
}

impl MixPlan {
    /// The plan for sources of `sizes` samples with `weights` (positive, finite; only their
    /// ratios matter). Without `replacement` no source may be asked for more samples than it
    /// has: an explicit `length` that would is an error naming the source.
    pub fn new(sizes: &[u64], weights: &[f64], length: EpochLength, replacement: bool) -> SamplerResult<Self> {
        if sizes.is_empty() {
            return Err(mix_error("a mix needs at least one source"));
        }
        if sizes.len() != weights.len() {
            return Err(mix_error(format!("{} sources but {} weights", sizes.len(), weights.len())));
        }
        if let Some(s) = weights.iter().position(|w| !(w.is_finite() && *w > 0.0)) {
            return Err(mix_error(format!(
                "source {s} has weight {}; weights must be positive finite numbers (only their ratios matter)",
                weights[s]
            )));
        }
        if let Some(s) = sizes.iter().position(|&n| n == 0) {
            return Err(mix_error(format!("source {s} has no samples")));
        }
        // Only ratios matter (see `scaled_weights`): weights near f64::MAX summed to infinity,
        // every share 0, then 1 part each: equal shares.
        let weights = scaled_weights(weights);
        let total_w: f64 = weights.iter().sum();
        let mut parts = vec![0u64];
        for w in &weights {
            // At least one part each: a tiny weight still gets its (tiny) share, never none.
            let p = ((w / total_w) * WEIGHT_SCALE).round().max(1.0) as u64;
            parts.push(parts.last().copied().unwrap_or(0) + p);
        }
        let mut offsets = vec![0u64];
        for &n in sizes {
            let next = offsets.last().copied().unwrap_or(0).checked_add(n).ok_or(SamplerError::Overflow)?;
            offsets.push(next);
        }
        let total_n = *offsets.last().unwrap_or(&0);
        let mut plan = Self { sizes: sizes.to_vec(), offsets, parts, starts: Vec::new(), replacement, fingerprint: 0 };
        let len = match length {
            EpochLength::Fixed(0) => return Err(mix_error("epoch_length must be at least 1")),
            EpochLength::Fixed(l) => {
                if !replacement {
                    if let Some((s, c)) = plan.overdrawn(l) {
                        return Err(mix_error(format!(
                            "source {s} has {} samples but its share of epoch_length {l} is {c}; \
                             lower epoch_length (at most {} fits), or sample with replacement",
                            sizes[s],
                            plan.longest_fitting()
                        )));
                    }
                }
                l
            }
            EpochLength::Auto if replacement => total_n,
            EpochLength::Auto => plan.longest_fitting(),
        };
        if len == 0 {
            return Err(mix_error(
                "no epoch fits: a source is too small for its weight to give it even one sample; \
                 give epoch_length and sample with replacement",
            ));
        }
        plan.starts = plan.cumulative(len);
        let mut words: Vec<u64> = vec![len, u64::from(replacement)];
        words.extend(&plan.sizes);
        words.extend(&plan.parts);
        plan.fingerprint = derive_key(&words);
        Ok(plan)
    }

    /// `F(0), .., F(S)` for an epoch of `len`: `F(k) = round(len * parts[k] / total)`.
    fn cumulative(&self, len: u64) -> Vec<u64> {
        let total = u128::from(*self.parts.last().unwrap_or(&1)).max(1);
        self.parts.iter().map(|&p| ((u128::from(len) * u128::from(p) + total / 2) / total) as u64).collect()
    }

    /// The first source whose count at `len` exceeds its size, with that count.
    fn overdrawn(&self, len: u64) -> Option<(usize, u64)> {
        let f = self.cumulative(len);
        (0..self.sizes.len()).map(|s| (s, f[s + 1] - f[s])).find(|&(s, c)| c > self.sizes[s])
    }

    /// The longest epoch without replacement. Counts are not monotone in the length (the
    /// rounding can move a sample between neighbours), so this bisects between a length
    /// that provably fits and one that provably does not, keeping the one that fits: the
    /// result fits and one more does not.
    fn longest_fitting(&self) -> u64 {
        let total = *self.parts.last().unwrap_or(&1) as u128;
        let total_n = *self.offsets.last().unwrap_or(&0);
        if self.overdrawn(total_n).is_none() {
            return total_n;
        }
        // Each count is strictly within one of `len * part / total`, so every source fits at
        // `len <= n * total / part` and source `s` surely does not at `(n + 1) * total / part`.
        let bound = |extra: u128, round_up: bool| {
            (0..self.sizes.len())
                .map(|s| {
                    let part = u128::from(self.parts[s + 1] - self.parts[s]);
                    let x = (u128::from(self.sizes[s]) + extra) * total;
                    if round_up {
                        x.div_ceil(part)
                    } else {
                        x / part
                    }
                })
                .min()
                .unwrap_or(0)
                .min(u128::from(total_n)) as u64
        };
        let mut lo = bound(0, false);
        let mut hi = bound(1, true).max(lo + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.overdrawn(mid).is_none() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Positions in an epoch (`L`).
    pub fn len(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// Whether the epoch is empty (never, for a plan that was built).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of sources.
    pub fn sources(&self) -> usize {
        self.sizes.len()
    }

    /// Samples each source has.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// Samples each source contributes to every epoch (they add up to [`len`](Self::len)).
    pub fn counts(&self) -> impl Iterator<Item = u64> + '_ {
        self.starts.windows(2).map(|w| w[1] - w[0])
    }

    /// Whether a source may give an epoch more samples than it has (repeating them).
    pub fn replacement(&self) -> bool {
        self.replacement
    }

    /// Total samples of all sources: the size of the concatenated index space.
    pub fn total(&self) -> u64 {
        *self.offsets.last().unwrap_or(&0)
    }

    /// The global index of source `s`'s sample `local`.
    pub fn global(&self, s: usize, local: u64) -> Option<u64> {
        (local < *self.sizes.get(s)?).then(|| self.offsets[s] + local)
    }

    /// `(source, index within it)` of a global index, or `None` past the end.
    pub fn locate(&self, global: u64) -> Option<(usize, u64)> {
        if global >= self.total() {
            return None;
        }
        let s = self.offsets.partition_point(|&o| o <= global) - 1;
        Some((s, global - self.offsets[s]))
    }

    /// A digest of everything the positions depend on (sizes, weights, length, replacement),
    /// recorded in resume states so that a changed mix is caught instead of resumed wrongly.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The order of `epoch` under `order` (which must not be a shard shuffle).
    pub(super) fn epoch(&self, order: &Order, epoch: u64) -> SamplerResult<MixEpoch> {
        let (seed, shuffle) = match order {
            Order::Sequential => (0, false),
            Order::Shuffle { seed } => (*seed, true),
            Order::ShardShuffle { .. } => {
                return Err(mix_error(
                    "shard_shuffle cannot order a mix (its shards belong to different sources); \
                     use shuffle: each source's draws are shuffled within it",
                ))
            }
        };
        let draws = if shuffle {
            let key = |s: usize| derive_key(&[seed, epoch, TAG_MIX_DRAW, s as u64]);
            Draws::Shuffled {
                first_pass: (0..self.sizes.len()).map(|s| Permutation::with_key(self.sizes[s], key(s))).collect(),
            }
        } else {
            Draws::Rotating
        };
        let interleave = Permutation::with_key(self.len(), derive_key(&[seed, epoch, TAG_MIX_INTERLEAVE]));
        Ok(MixEpoch { interleave, draws, seed, epoch })
    }

    /// Global index of epoch position `p < len()` (see the [module docs](self)).
    pub(super) fn at(&self, e: &MixEpoch, p: u64) -> u64 {
        let q = e.interleave.apply(p);
        let s = self.starts.partition_point(|&c| c <= q).saturating_sub(1).min(self.sizes.len() - 1);
        let k = q - self.starts[s];
        let n = self.sizes[s];
        let local = match &e.draws {
            Draws::Rotating => {
                let count = u128::from(self.starts[s + 1] - self.starts[s]);
                ((u128::from(e.epoch) * count + u128::from(k)) % u128::from(n)) as u64
            }
            Draws::Shuffled { first_pass } if k < n => first_pass[s].apply(k),
            Draws::Shuffled { .. } => {
                let key = derive_key(&[e.seed, e.epoch, TAG_MIX_DRAW, s as u64, k / n]);
                Permutation::with_key(n, key).apply(k % n)
            }
        };
        self.offsets[s] + local
    }
}

/// How draws become samples in one epoch.
#[derive(Clone, Debug)]
enum Draws {
    /// Storage order, continuing where the previous epoch stopped.
    Rotating,
    /// Each source's first-pass permutation (the only one without replacement).
    Shuffled { first_pass: Vec<Permutation> },
}

/// One epoch's interleave and draw permutations: a few words per source.
#[derive(Clone, Debug)]
pub(super) struct MixEpoch {
    interleave: Permutation,
    draws: Draws,
    seed: u64,
    epoch: u64,
}
/// `weights` times one power of two that brings the largest near 1. Only ratios matter, and
/// a power of two scales every weight, and every sum and quotient of them, exactly: ordinary
/// weights give the same shares and orders, bit for bit, as unscaled ones, while tiny weights
/// (1e-320) no longer divide counts to infinity and huge ones no longer sum past f64::MAX.
pub(crate) fn scaled_weights(weights: &[f64]) -> Vec<f64> {
    let top = weights.iter().fold(0.0f64, |a, &w| a.max(w));
    if !(top.is_finite() && top > 0.0) {
        return weights.to_vec();
    }
    let shift = -(top.log2().floor() as i32);
    weights.iter().map(|&w| times_pow2(w, shift)).collect()
}

/// `x * 2^k`, in steps that stay in range (exact while the result is normal).
fn times_pow2(mut x: f64, mut k: i32) -> f64 {
    while k > 1000 {
        x *= 2f64.powi(1000);
        k -= 1000;
    }
    while k < -1000 {
        x *= 2f64.powi(-1000);
        k += 1000;
    }
    x * 2f64.powi(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scaling by a power of two changes no comparison of counts over weights: a mix's order
    /// under ordinary weights is the one it had unscaled, bit for bit.
    #[test]
    fn scaled_weights_keep_every_comparison_and_tame_the_extremes() {
        for w in [[0.7, 0.3], [0.6, 0.4], [3.0, 1e-3], [123.456, 7.0]] {
            let s = scaled_weights(&w);
            for t in (0u64..200_000).step_by(997) {
                for u in (0u64..200_000).step_by(1009) {
                    let before = (t as f64 / w[0]).total_cmp(&(u as f64 / w[1]));
                    assert_eq!((t as f64 / s[0]).total_cmp(&(u as f64 / s[1])), before, "{w:?} {t} {u}");
                }
            }
            let (a, b) = (w[0] / (w[0] + w[1]), s[0] / (s[0] + s[1]));
            assert_eq!(a.to_bits(), b.to_bits(), "{w:?}: shares");
        }
        let tiny = scaled_weights(&[1e-320, 1e-320]);
        assert!(tiny[0] == tiny[1] && tiny[0].is_normal(), "{tiny:?}");
        let huge = scaled_weights(&[f64::MAX, f64::MAX]);
        assert!((huge[0] + huge[1]).is_finite(), "{huge:?}");
    }
}
