//! The colour pass with AVX-512, 16 pixels to a register: the AVX2 code's steps (written once
//! for both, `lanes.rs`) on twice the lanes, with mask registers for its compares and blends,
//! so the bytes are the same on every path (`super::tests` checks each path this CPU runs
//! against the scalar code). Loads and stores are the AVX2 code's, two 8-pixel blocks each.
//!
//! The hue is a long chain of dependent operations that the processor overlaps only as far as
//! its schedulers reach; with twice the pixels in each operation, the same chains cover twice
//! the image. On the 2-core AMD EPYC VM (Zen 4, which runs 512-bit operations in two halves)
//! the whole jitter took about 150 µs a 224x224 image against the AVX2 code's 170, and the hue
//! alone 92 against 108 (`examples/color_bench.rs`); on an Intel Xeon host (a cloud GPU
//! machine's) 229-265 µs against 349-510.

use std::arch::x86_64::*;

use super::x86::{flush, load, store, whole_block, BLOCK};
use super::Step;

/// Bytes of one wide block: 16 RGB8 pixels.
const WIDE: usize = 2 * BLOCK;

/// Wide blocks taken through a pass side by side (as the AVX2 code's `TURN`): one at a time
/// was slower than the AVX2 code's two, two were faster, four no faster than two.
const TURN: usize = 2;

/// Whether this CPU runs [`pass`].
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("avx512f")
}

/// As `x86::pass`: `steps` in order on the whole blocks at the start of `img`, the bytes done
/// and, with `sum`, the total of the result's floored grayscale.
///
/// # Safety
/// The CPU has AVX2 and AVX-512F ([`available`]).
#[target_feature(enable = "avx2,avx512f")]
pub(super) unsafe fn pass(img: &mut [u8], steps: &[Step], sum: bool) -> (usize, u64) {
    if let ([Step::Values { .. }], false) = (steps, sum) {
        // A per-value step alone: the AVX2 code's byte-wise loop is as fast.
        // SAFETY: the CPU has AVX2.
        return unsafe { super::x86::pass(img, steps, sum) };
    }
    let mut total = 0u64;
    // Per-lane sums of at most 255 a wide block: flushed before an i32 lane could overflow.
    let mut lanes = _mm512_setzero_si512();
    let mut since_flush = 0u32;
    let mut add_sum = |x: &[__m512; 3]| {
        lanes = _mm512_add_epi32(lanes, _mm512_cvttps_epi32(floor(gray(x[0], x[1], x[2]))));
        since_flush += 1;
        if since_flush == 1 << 20 {
            total += flush_wide(lanes);
            (lanes, since_flush) = (_mm512_setzero_si512(), 0);
        }
    };
    let mut chunks = img.chunks_exact_mut(TURN * WIDE);
    for chunk in &mut chunks {
        let mut q = chunk.chunks_exact_mut(BLOCK).map(whole_block);
        let px: [&mut [u8; BLOCK]; 2 * TURN] = std::array::from_fn(|_| q.next().expect("a turn's blocks"));
        let l: [[__m256; 3]; 2 * TURN] = std::array::from_fn(|i| load(px[i]));
        let mut x: [[__m512; 3]; TURN] =
            std::array::from_fn(|w| std::array::from_fn(|c| join(l[2 * w][c], l[2 * w + 1][c])));
        for &step in steps {
            for v in x.iter_mut() {
                *v = apply(*v, step);
            }
        }
        if !steps.is_empty() {
            for (w, v) in x.iter().enumerate() {
                let ints = v.map(|c| _mm512_cvttps_epi32(c));
                store(px[2 * w], ints.map(|c| _mm512_castsi512_si256(c)));
                store(px[2 * w + 1], ints.map(|c| _mm512_extracti64x4_epi64::<1>(c)));
            }
        }
        if sum {
            x.iter().for_each(&mut add_sum);
        }
    }
    let done = img.len() / (TURN * WIDE) * (TURN * WIDE);
    // The last 8-pixel block, if any, by the AVX2 code.
    // SAFETY: the CPU has AVX2.
    let (rest, rest_sum) = unsafe { super::x86::pass(&mut img[done..], steps, sum) };
    (done + rest, total + flush_wide(lanes) + rest_sum)
}

/// Two 8-lane halves as one 16-lane register, `lo` in lanes 0..8.
#[target_feature(enable = "avx2,avx512f")]
fn join(lo: __m256, hi: __m256) -> __m512 {
    let wide = _mm512_castps256_ps512(lo);
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(wide), _mm256_castps_pd(hi)))
}

/// The total of the 16 lanes' sums.
#[target_feature(enable = "avx2,avx512f")]
fn flush_wide(lanes: __m512i) -> u64 {
    flush(_mm512_castsi512_si256(lanes)) + flush(_mm512_extracti64x4_epi64::<1>(lanes))
}

/// Rounded down (the values here are 0..=255).
#[target_feature(enable = "avx2,avx512f")]
fn floor(x: __m512) -> __m512 {
    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x)
}

/// Rounded toward zero.
#[target_feature(enable = "avx2,avx512f")]
fn trunc(x: __m512) -> __m512 {
    _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x)
}

/// `if mask { a } else { b }`, lane by lane.
#[target_feature(enable = "avx2,avx512f")]
fn select(mask: __mmask16, a: __m512, b: __m512) -> __m512 {
    _mm512_mask_blend_ps(mask, b, a)
}

/// The register the steps work on: 16 `f32` lanes.
type V = __m512;
/// A compare's result: one bit a lane.
type M = __mmask16;

lane_steps!("avx2,avx512f");

#[target_feature(enable = "avx2,avx512f")]
fn splat(x: f32) -> V {
    _mm512_set1_ps(x)
}

#[target_feature(enable = "avx2,avx512f")]
fn add(a: V, b: V) -> V {
    _mm512_add_ps(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn sub(a: V, b: V) -> V {
    _mm512_sub_ps(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn mul(a: V, b: V) -> V {
    _mm512_mul_ps(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn div(a: V, b: V) -> V {
    _mm512_div_ps(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn max(a: V, b: V) -> V {
    _mm512_max_ps(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn min(a: V, b: V) -> V {
    _mm512_min_ps(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn eq(a: V, b: V) -> M {
    _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn lt(a: V, b: V) -> M {
    _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn ge(a: V, b: V) -> M {
    _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b)
}

#[target_feature(enable = "avx2,avx512f")]
fn abs(x: V) -> V {
    _mm512_abs_ps(x)
}

/// Whether each lane's integer value (0..6 here) is even.
#[target_feature(enable = "avx2,avx512f")]
fn even(x: V) -> M {
    let odd = _mm512_and_si512(_mm512_cvttps_epi32(x), _mm512_set1_epi32(1));
    _mm512_cmpeq_epi32_mask(odd, _mm512_setzero_si512())
}
