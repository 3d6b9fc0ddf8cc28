//! The colour operations with AVX2, 8 pixels to a register: the scalar code's `f32`
//! operations in the same order, lane by lane (compares and blends where it branches), so the
//! bytes do not depend on the path (`super::tests` checks them against the scalar code).
//!
//! One pass takes a block through every step in registers: each step ends, as the scalar
//! code's does, in a value truncated to 0..=255 (kept as an `f32` holding that integer), the
//! next step starts from it, and the block is stored once (a pass per operation cost a load, a
//! deinterleave, an interleave and a store each). With that, two blocks at a time and the
//! hue's work cut (see [`hue`]), the jitter's four operations on a 224x224 image take about
//! 175-185 µs instead of 213 (`examples/color_bench.rs`, the 2-core AMD EPYC VM).
//!
//! Per pixel with branches, the hue took about 8 µs per thousand pixels: the largest channel
//! and the hue sector change from pixel to pixel, and a mispredicted branch costs more than
//! computing every arm. The compiler does not vectorise the scalar code by itself (the RGB
//! interleave and the selects defeat it), hence the intrinsics.

use std::arch::x86_64::*;

use super::Step;

/// Bytes of one block: 8 RGB8 pixels.
pub(in crate::decode::image) const BLOCK: usize = 24;

/// Whether this CPU runs [`pass`].
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// `steps` in order on the whole blocks at the start of `img`: the number of bytes done (the
/// rest is the scalar code's) and, with `sum`, the total of the result's floored grayscale.
/// With no steps it only sums.
///
/// # Safety
/// The CPU has AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pass(img: &mut [u8], steps: &[Step], sum: bool) -> (usize, u64) {
    if let ([Step::Values { mul, add }], false) = (steps, sum) {
        // One per-value step alone (brightness, or contrast after its sum): 32 bytes at a
        // time, without taking the pixels apart.
        let done = values(img, *mul, *add);
        return (done, 0);
    }
    let mut total = 0u64;
    // Per-lane sums of at most 255 a block: flushed before an i32 lane could overflow.
    let mut lanes = _mm256_setzero_si256();
    let mut since_flush = 0u32;
    let mut add_sum = |c: [__m256; 3]| {
        lanes = _mm256_add_epi32(lanes, _mm256_cvttps_epi32(floor(gray(c[0], c[1], c[2]))));
        since_flush += 1;
        if since_flush == 1 << 20 {
            total += flush(lanes);
            (lanes, since_flush) = (_mm256_setzero_si256(), 0);
        }
    };
    let mut turns = img.chunks_exact_mut(TURN * BLOCK);
    for turn in &mut turns {
        let mut each = turn.chunks_exact_mut(BLOCK).map(whole_block);
        let x = blocks::<TURN>(std::array::from_fn(|_| each.next().expect("a turn holds TURN blocks")), steps);
        if sum {
            x.into_iter().for_each(&mut add_sum);
        }
    }
    for block in turns.into_remainder().chunks_exact_mut(BLOCK) {
        let [x] = blocks([whole_block(block)], steps);
        if sum {
            add_sum(x);
        }
    }
    (img.len() / BLOCK * BLOCK, total + flush(lanes))
}

/// Blocks taken through a pass side by side: each step is a long chain of dependent
/// operations (the hue's runs through a division and a dozen selects), and the processor
/// overlaps independent chains only as far as its schedulers reach: two at a time ran the hue
/// in 0.8 of the time one did (four gained nothing more that the noise did not hide).
const TURN: usize = 2;

/// A block of a `chunks_exact_mut(BLOCK)`.
pub(super) fn whole_block(b: &mut [u8]) -> &mut [u8; BLOCK] {
    b.try_into().expect("chunks_exact gives whole blocks")
}

/// `steps` on the `N` blocks `px`, stored back unless there are none: their resulting
/// channels.
#[target_feature(enable = "avx2")]
#[inline]
fn blocks<const N: usize>(px: [&mut [u8; BLOCK]; N], steps: &[Step]) -> [[__m256; 3]; N] {
    let mut x: [[__m256; 3]; N] = std::array::from_fn(|i| load(px[i]));
    for &step in steps {
        for v in x.iter_mut() {
            *v = apply(*v, step);
        }
    }
    if !steps.is_empty() {
        for (p, v) in px.into_iter().zip(&x) {
            store(p, v.map(|c| _mm256_cvttps_epi32(c)));
        }
    }
    x
}

/// Every byte `x` of `img` becomes `x * mul + add` clamped to 0..=255 and truncated, 32 bytes
/// at a time: the number of bytes done (the rest is the scalar code's).
#[target_feature(enable = "avx2")]
fn values(img: &mut [u8], mul: f32, add: f32) -> usize {
    let (mul, add) = (_mm256_set1_ps(mul), _mm256_set1_ps(add));
    // packus interleaves the 128-bit halves: 4-byte groups come out as a0 b0 c0 d0 a1 b1 c1 d1.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut chunks = img.chunks_exact_mut(32);
    for chunk in &mut chunks {
        // SAFETY: loads and stores the 32 bytes of the chunk.
        unsafe {
            let x = _mm256_loadu_si256(chunk.as_ptr().cast());
            let quarter = |q: __m128i| {
                let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
                _mm256_cvttps_epi32(to_u8(_mm256_add_ps(_mm256_mul_ps(v, mul), add)))
            };
            let (lo, hi) = (_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
            let [a, b, c, d] = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)].map(quarter);
            let bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
            _mm256_storeu_si256(chunk.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(bytes, order));
        }
    }
    img.len() / 32 * 32
}

/// The total of the 8 lanes' sums.
#[target_feature(enable = "avx2")]
pub(super) fn flush(lanes: __m256i) -> u64 {
    let mut out = [0u32; 8];
    // SAFETY: stores 32 bytes into the 32-byte array.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), lanes) };
    out.iter().map(|&x| u64::from(x)).sum()
}

/// The shuffles that gather channel `c` of a block's 8 pixels into bytes 0..8, from its first
/// 16 bytes (`PICK[c][0]`) and from its last 8 (`PICK[c][1]`): channel c of pixel k is byte
/// `3k + c`, and -1 gives a zero.
const PICK: [[[i8; 16]; 2]; 3] = {
    let mut pick = [[[-1i8; 16]; 2]; 3];
    let mut c = 0;
    while c < 3 {
        let mut k = 0;
        while k < 8 {
            let at = 3 * k + c;
            if at < 16 {
                pick[c][0][k] = at as i8;
            } else {
                pick[c][1][k] = (at - 16) as i8;
            }
            k += 1;
        }
        c += 1;
    }
    pick
};

/// The R, G and B values of a block's 8 pixels, as `f32` in 0..=255.
#[target_feature(enable = "avx2")]
pub(in crate::decode::image) fn load(px: &[u8; BLOCK]) -> [__m256; 3] {
    // SAFETY: 16 bytes at 0 and 8 at 16: inside the 24-byte block.
    let (lo, hi) = unsafe { (_mm_loadu_si128(px.as_ptr().cast()), _mm_loadl_epi64(px.as_ptr().add(16).cast())) };
    let channel = |c: usize| {
        // SAFETY: loads 16 bytes from each 16-byte array.
        let (from_lo, from_hi) =
            unsafe { (_mm_loadu_si128(PICK[c][0].as_ptr().cast()), _mm_loadu_si128(PICK[c][1].as_ptr().cast())) };
        let bytes = _mm_or_si128(_mm_shuffle_epi8(lo, from_lo), _mm_shuffle_epi8(hi, from_hi));
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))
    };
    [channel(0), channel(1), channel(2)]
}

/// Store the three channels' bytes (in the low byte of each `i32` lane) interleaved.
#[target_feature(enable = "avx2")]
pub(super) fn store(px: &mut [u8; BLOCK], [r, g, b]: [__m256i; 3]) {
    // Per 128-bit half (pixels 0..4, then 4..8): r0-3 g0-3 b0-3 b0-3 as bytes.
    let bytes = _mm256_packus_epi16(_mm256_packus_epi32(r, g), _mm256_packus_epi32(b, b));
    let interleave = _mm256_setr_epi8(
        0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, -1, -1, -1, -1, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, -1, -1, -1, -1,
    );
    let mut out = [0u8; 32];
    // SAFETY: stores 32 bytes into the 32-byte array.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_shuffle_epi8(bytes, interleave)) };
    px[..12].copy_from_slice(&out[..12]);
    px[12..].copy_from_slice(&out[16..28]);
}

/// Rounded down (the values here are 0..=255).
#[target_feature(enable = "avx2")]
fn floor(x: __m256) -> __m256 {
    _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x)
}

/// Rounded toward zero.
#[target_feature(enable = "avx2")]
fn trunc(x: __m256) -> __m256 {
    _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x)
}

/// `if mask { a } else { b }`, lane by lane.
#[target_feature(enable = "avx2")]
fn select(mask: __m256, a: __m256, b: __m256) -> __m256 {
    _mm256_blendv_ps(b, a, mask)
}

/// The register the steps work on: 8 `f32` lanes.
type V = __m256;
/// A compare's result: all ones or all zeros in each lane.
type M = __m256;

lane_steps!("avx2");

#[target_feature(enable = "avx2")]
fn splat(x: f32) -> V {
    _mm256_set1_ps(x)
}

#[target_feature(enable = "avx2")]
fn add(a: V, b: V) -> V {
    _mm256_add_ps(a, b)
}

#[target_feature(enable = "avx2")]
fn sub(a: V, b: V) -> V {
    _mm256_sub_ps(a, b)
}

#[target_feature(enable = "avx2")]
fn mul(a: V, b: V) -> V {
    _mm256_mul_ps(a, b)
}

#[target_feature(enable = "avx2")]
fn div(a: V, b: V) -> V {
    _mm256_div_ps(a, b)
}

#[target_feature(enable = "avx2")]
fn max(a: V, b: V) -> V {
    _mm256_max_ps(a, b)
}

#[target_feature(enable = "avx2")]
fn min(a: V, b: V) -> V {
    _mm256_min_ps(a, b)
}

#[target_feature(enable = "avx2")]
fn eq(a: V, b: V) -> M {
    _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b)
}

#[target_feature(enable = "avx2")]
fn lt(a: V, b: V) -> M {
    _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)
}

#[target_feature(enable = "avx2")]
fn ge(a: V, b: V) -> M {
    _mm256_cmp_ps::<_CMP_GE_OQ>(a, b)
}

/// `|x|`: the sign bit cleared.
#[target_feature(enable = "avx2")]
fn abs(x: V) -> V {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), x)
}

/// Whether each lane's integer value (0..6 here) is even.
#[target_feature(enable = "avx2")]
fn even(x: V) -> M {
    let odd = _mm256_and_si256(_mm256_cvttps_epi32(x), _mm256_set1_epi32(1));
    _mm256_castsi256_ps(_mm256_cmpeq_epi32(odd, _mm256_setzero_si256()))
}
