//! A keyed pseudo-random bijection over `[0, n)` and the key derivation behind every order.

/// Feistel rounds. Four suffice in theory (Luby-Rackoff) for balanced halves;
/// two more cover the one-bit imbalance and the cheap round function.
const ROUNDS: usize = 6;
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Elements [`Permutation::apply_all`] runs side by side.
pub(crate) const LANES: usize = 8;

/// splitmix64's finaliser: a cheap bijective mixer with full avalanche.
fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(GOLDEN);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Folds several words into one key; position-dependent, so `(a, b)` and
/// `(b, a)` give different keys.
pub(super) fn derive_key(parts: &[u64]) -> u64 {
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

    /// [`apply`](Self::apply) of every element of `xs`, in place: the same values, computed
    /// eight at a time. One element's rounds are a chain of multiplications, each waiting
    /// on the last; those of independent elements overlap, and the cycle-walking branch (taken
    /// for up to half of them, at random) is left to the elements that need it.
    pub fn apply_all(&self, xs: &mut [u64]) {
        for chunk in xs.chunks_mut(LANES) {
            let mut lanes = [0u64; LANES];
            lanes[..chunk.len()].copy_from_slice(chunk);
            self.encrypt_lanes(&mut lanes);
            for (x, mut y) in chunk.iter_mut().zip(lanes) {
                if *x >= self.n {
                    continue; // out of range: unchanged, as `apply` leaves it
                }
                while y >= self.n {
                    y = self.encrypt(y);
                }
                *x = y;
            }
        }
    }

    /// [`encrypt`](Self::encrypt) of each lane, the lanes' rounds side by side.
    fn encrypt_lanes(&self, xs: &mut [u64; LANES]) {
        let (mut wl, mut wr) = (self.left_bits, self.right_bits);
        let mut l = xs.map(|x| x >> wr);
        let mut r = xs.map(|x| x & low_mask(wr));
        for &k in &self.round_keys {
            let m = low_mask(wl);
            for (l, r) in l.iter_mut().zip(r.iter_mut()) {
                let f = mix(*r ^ k) & m;
                (*l, *r) = (*r, *l ^ f);
            }
            (wl, wr) = (wr, wl);
        }
        for ((x, l), r) in xs.iter_mut().zip(l).zip(r) {
            *x = (l << wr) | r;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_all_gives_apply_of_each_element() {
        let sizes = [0u64, 1, 2, 3, 7, 8, 9, 1000, 1 << 20, (1 << 20) + 1, 675_188, u64::MAX / 3, u64::MAX];
        for (i, &n) in sizes.iter().enumerate() {
            let p = Permutation::new(n, 7, i as u64);
            // In range and out of it, runs of every length around the lane count.
            let mut xs: Vec<u64> =
                (0..37u64).map(|j| if j % 5 == 4 { n.saturating_add(j) } else { mix(j ^ n) % n.max(1) }).collect();
            for len in [0, 1, LANES - 1, LANES, LANES + 1, xs.len()] {
                let want: Vec<u64> = xs[..len].iter().map(|&x| p.apply(x)).collect();
                let mut got = xs[..len].to_vec();
                p.apply_all(&mut got);
                assert_eq!(got, want, "n = {n}, {len} elements");
            }
            xs.truncate(0);
        }
        // A whole small range stays a bijection.
        let p = Permutation::new(1000, 3, 4);
        let mut all: Vec<u64> = (0..1000).collect();
        p.apply_all(&mut all);
        assert_eq!(all, (0..1000).map(|i| p.apply(i)).collect::<Vec<_>>());
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
    }
}
