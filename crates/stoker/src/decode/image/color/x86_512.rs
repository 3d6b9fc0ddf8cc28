//! The colour pass with AVX-512, 16 pixels to a register: the AVX2 code's operations (see
//! `x86`) one for one on twice the lanes, with mask registers for its compares and blends,
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

use super::x86::{flush, load, store, BLOCK};
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
        let mut q = chunk.chunks_exact_mut(BLOCK).map(|b| -> &mut [u8; BLOCK] { b.try_into().expect("a whole block") });
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

/// One step on a wide block's three channels (integers 0..=255 held as `f32`).
#[target_feature(enable = "avx2,avx512f")]
#[inline]
fn apply([r, g, b]: [__m512; 3], step: Step) -> [__m512; 3] {
    match step {
        Step::Values { mul, add } => {
            let (mul, add) = (_mm512_set1_ps(mul), _mm512_set1_ps(add));
            [r, g, b].map(|c| to_u8(_mm512_add_ps(_mm512_mul_ps(c, mul), add)))
        }
        Step::Saturation(f) => {
            let gray = floor(gray(r, g, b));
            let (f, keep) = (_mm512_set1_ps(f), _mm512_set1_ps(1.0 - f));
            [r, g, b].map(|c| to_u8(_mm512_add_ps(_mm512_mul_ps(c, f), _mm512_mul_ps(gray, keep))))
        }
        Step::Hue(f) => hue(r, g, b, f),
        Step::Grayscale => [to_u8(gray(r, g, b)); 3],
    }
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

/// torchvision's grayscale, `0.2989 R + 0.587 G + 0.114 B` in that order.
#[target_feature(enable = "avx2,avx512f")]
fn gray(r: __m512, g: __m512, b: __m512) -> __m512 {
    let rg = _mm512_add_ps(_mm512_mul_ps(r, _mm512_set1_ps(0.2989)), _mm512_mul_ps(g, _mm512_set1_ps(0.587)));
    _mm512_add_ps(rg, _mm512_mul_ps(b, _mm512_set1_ps(0.114)))
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

/// Clamped to 0..=255 and truncated, the integer kept as an `f32`.
#[target_feature(enable = "avx2,avx512f")]
fn to_u8(v: __m512) -> __m512 {
    trunc(_mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(255.0)))
}

/// `if mask { a } else { b }`, lane by lane.
#[target_feature(enable = "avx2,avx512f")]
fn select(mask: __mmask16, a: __m512, b: __m512) -> __m512 {
    _mm512_mask_blend_ps(mask, b, a)
}

/// The AVX2 `hue`, lane by lane: the same operations in the same order.
#[target_feature(enable = "avx2,avx512f")]
fn hue(r: __m512, g: __m512, b: __m512, f: f32) -> [__m512; 3] {
    let splat = _mm512_set1_ps;
    let (zero, one) = (_mm512_setzero_ps(), splat(1.0));
    let (max8, min8) = (_mm512_max_ps(_mm512_max_ps(r, g), b), _mm512_min_ps(_mm512_min_ps(r, g), b));
    let scale = splat(1.0 / 255.0);
    let (r, g, b) = (_mm512_mul_ps(r, scale), _mm512_mul_ps(g, scale), _mm512_mul_ps(b, scale));
    let maxc = _mm512_max_ps(_mm512_max_ps(r, g), b);
    let minc = _mm512_min_ps(_mm512_min_ps(r, g), b);
    let eqc = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(maxc, minc);
    let range = _mm512_sub_ps(maxc, minc);
    let s = _mm512_div_ps(range, select(eqc, one, maxc));
    let div = select(eqc, one, range);
    let (dr, dg, db) = (_mm512_sub_ps(maxc, r), _mm512_sub_ps(maxc, g), _mm512_sub_ps(maxc, b));
    let (is_r, is_g) = (_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(maxc, r), _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(maxc, g));
    let a = select(is_r, db, select(is_g, dr, dg));
    let bb = select(is_r, dg, select(is_g, db, dr));
    let k = select(is_r, zero, select(is_g, splat(2.0), splat(4.0)));
    let h = _mm512_sub_ps(_mm512_add_ps(k, _mm512_div_ps(a, div)), _mm512_div_ps(bb, div));
    let h = _mm512_add_ps(_mm512_mul_ps(h, splat(1.0 / 6.0)), one);
    let h = select(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(h, one), _mm512_sub_ps(h, one), h);
    let h = _mm512_add_ps(h, splat(f));
    let h = select(
        _mm512_cmp_ps_mask::<_CMP_LT_OQ>(h, zero),
        _mm512_add_ps(h, one),
        select(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(h, one), _mm512_sub_ps(h, one), h),
    );
    let h6 = _mm512_mul_ps(h, splat(6.0));
    let i = trunc(h6);
    let fr = _mm512_sub_ps(h6, i);
    let sector = select(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(i, splat(6.0)), zero, i);
    let sxf = _mm512_mul_ps(s, fr);
    let even = _mm512_cmpeq_epi32_mask(
        _mm512_and_si512(_mm512_cvttps_epi32(sector), _mm512_set1_epi32(1)),
        _mm512_setzero_si512(),
    );
    let factor = select(even, _mm512_add_ps(sxf, _mm512_sub_ps(one, s)), _mm512_sub_ps(one, sxf));
    let mid = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(factor, maxc), zero), one);
    let mid = trunc(_mm512_mul_ps(mid, splat(255.999)));
    let distance = |centre: f32| _mm512_abs_ps(_mm512_sub_ps(sector, splat(centre)));
    let below = |d: __m512, n: f32| _mm512_cmp_ps_mask::<_CMP_LT_OQ>(d, splat(n));
    let dr = distance(2.5);
    let r = select(below(dr, 1.0), min8, select(below(dr, 2.0), mid, max8));
    let (dg, db) = (distance(1.5), distance(3.5));
    let g = select(below(dg, 1.0), max8, select(below(dg, 2.0), mid, min8));
    let b = select(below(db, 1.0), max8, select(below(db, 2.0), mid, min8));
    [r, g, b]
}
