//! Per-sample randomness that depends on nothing but `(seed, epoch, sample index)`.
//!
//! Thread timing, worker count, world size and resume points change which thread decodes a
//! sample and when, never the numbers it draws: a rerun, a resumed run and an elastic run
//! produce byte-identical tensors for the same sample.

/// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small, fast stream of random numbers for one sample (SplitMix64).
#[derive(Clone, Debug)]
pub struct SampleRng {
    state: u64,
}

impl SampleRng {
    /// The stream of sample `index` in `epoch` of a run seeded with `seed`.
    pub fn new(seed: u64, epoch: u64, index: u64) -> Self {
        // Each input goes through the mixer before the next is folded in, so nearby triples
        // (index i and i + 1, epoch e and e + 1) start far apart.
        let s = mix(mix(mix(seed ^ 0x5354_4f4b_4552_0001) ^ epoch) ^ index);
        SampleRng { state: s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform in `[0, 1)` with 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)` (`lo` when the range is empty).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in `lo..=hi` (`lo` when `hi < lo`), without modulo bias.
    pub fn int_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo + 1; // hi - lo < u64::MAX here unless lo == 0 and hi == MAX
        if span == 0 {
            return self.next_u64();
        }
        // Lemire's multiply-shift with rejection.
        let zone = span.wrapping_neg() % span;
        loop {
            let m = (self.next_u64() as u128) * (span as u128);
            if (m as u64) >= zone {
                return lo + (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_inputs_same_stream_other_inputs_other_streams() {
        let draw = |s, e, i| {
            let mut r = SampleRng::new(s, e, i);
            [r.next_u64(), r.next_u64()]
        };
        assert_eq!(draw(1, 2, 3), draw(1, 2, 3));
        assert_ne!(draw(1, 2, 3), draw(1, 2, 4));
        assert_ne!(draw(1, 2, 3), draw(1, 3, 3));
        assert_ne!(draw(1, 2, 3), draw(2, 2, 3));
        // Swapping epoch and index must not collide (the inputs are mixed in order).
        assert_ne!(draw(0, 5, 9), draw(0, 9, 5));
    }

    #[test]
    fn ranges_are_respected_and_roughly_uniform() {
        let mut r = SampleRng::new(7, 0, 0);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            let v = r.int_inclusive(3, 8);
            assert!((3..=8).contains(&v));
            counts[(v - 3) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)), "{counts:?}");
        for _ in 0..10_000 {
            let u = r.uniform(0.08, 1.0);
            assert!((0.08..1.0).contains(&u));
        }
        assert_eq!(r.int_inclusive(5, 5), 5);
        assert_eq!(r.int_inclusive(5, 2), 5);
    }
}
