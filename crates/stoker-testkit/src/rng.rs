//! A tiny deterministic RNG for fault decisions.
//!
//! Hand-rolled (xorshift64* seeded through splitmix64) rather than `rand`
//! so the sequence for a given seed can never change under a dependency
//! upgrade: a fault pattern that broke a test must replay identically.

/// xorshift64* generator. Not cryptographic; only for test fault injection.
#[derive(Debug, Clone)]
pub struct XorShift64 {
    state: u64,
}

impl XorShift64 {
    /// Creates a generator from any seed, including 0.
    ///
    /// The seed goes through one splitmix64 step because xorshift has a fixed
    /// point at 0 and nearby seeds would otherwise start out correlated.
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Self { state: if z == 0 { 0x2545_F491_4F6C_DD1D } else { z } }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // The top 53 bits fill an f64 mantissa exactly.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p` (values outside `[0, 1]` are clamped).
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// Uniform integer in `[0, max]` (inclusive).
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        // Modulo bias is at most max/2^64: irrelevant for millisecond jitter.
        self.next_u64() % (max + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_different_seed_differs() {
        let a: Vec<u64> = (0..32).scan(XorShift64::new(7), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..32).scan(XorShift64::new(7), |r, _| Some(r.next_u64())).collect();
        let c: Vec<u64> = (0..32).scan(XorShift64::new(8), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn chance_matches_probability_roughly() {
        let mut r = XorShift64::new(0);
        let hits = (0..100_000).filter(|_| r.chance(0.25)).count();
        // 5 sigma is about 685 for n=100k, p=0.25.
        assert!((24_000..26_000).contains(&hits), "hits={hits}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
    }

    #[test]
    fn up_to_is_inclusive_and_bounded() {
        let mut r = XorShift64::new(3);
        let vals: Vec<u64> = (0..1000).map(|_| r.up_to(3)).collect();
        assert!(vals.iter().all(|v| *v <= 3));
        for want in 0..=3 {
            assert!(vals.contains(&want), "never drew {want}");
        }
        assert_eq!(r.up_to(0), 0);
    }
}
