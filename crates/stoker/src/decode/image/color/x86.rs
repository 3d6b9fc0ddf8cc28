//! The per-pixel colour operations with AVX2, 8 pixels to a register: the scalar code's `f32`
//! operations in the same order, lane by lane (compares and blends where it branches), so the
//! bytes do not depend on the path (`super::tests` checks them against the scalar code).
//!
//! Per pixel with branches, the hue took about 8 µs per thousand pixels: the largest channel
//! and the hue sector change from pixel to pixel, and a mispredicted branch costs more than
//! computing every arm. The compiler does not vectorise the scalar code by itself (the RGB
//! interleave and the selects defeat it), hence the intrinsics.

use std::arch::x86_64::*;

use super::ColorOp as Op;

/// Bytes of one block: 8 RGB8 pixels.
const BLOCK: usize = 24;

/// Whether this CPU runs [`blocks`].
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// `op` on the whole blocks at the start of `img`: the number of bytes done (the rest is the
/// scalar code's) and, for contrast (which writes nothing here), the sum of the pixels'
/// floored grayscale.
///
/// # Safety
/// The CPU has AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn blocks(img: &mut [u8], op: Op) -> (usize, u64) {
    let mut blocks = img.chunks_exact_mut(BLOCK);
    let mut sum = 0u64;
    // Per-lane sums of at most 255 a block: flushed before an i32 lane could overflow.
    let mut lanes = _mm256_setzero_si256();
    let mut since_flush = 0u32;
    for px in &mut blocks {
        let px: &mut [u8; BLOCK] = px.try_into().expect("chunks_exact gives whole blocks");
        let [r, g, b] = load(px);
        match op {
            Op::Hue(f) => store(px, hue(r, g, b, f)),
            Op::Saturation(f) => {
                let gray = floor(gray(r, g, b));
                let (f, keep) = (_mm256_set1_ps(f), _mm256_set1_ps(1.0 - f));
                let blend = |c| to_u8(_mm256_add_ps(_mm256_mul_ps(c, f), _mm256_mul_ps(gray, keep)));
                store(px, [blend(r), blend(g), blend(b)]);
            }
            Op::Grayscale => {
                let gray = to_u8(gray(r, g, b));
                store(px, [gray; 3]);
            }
            Op::Contrast(_) => {
                lanes = _mm256_add_epi32(lanes, _mm256_cvttps_epi32(floor(gray(r, g, b))));
                since_flush += 1;
                if since_flush == 1 << 20 {
                    sum += flush(lanes);
                    (lanes, since_flush) = (_mm256_setzero_si256(), 0);
                }
            }
            // Per value, not per pixel: see `values`.
            Op::Brightness(_) => return (0, 0),
        }
    }
    (img.len() / BLOCK * BLOCK, sum + flush(lanes))
}

/// Every byte `x` of `img` becomes `x * mul + add` clamped to 0..=255 and truncated, 32 bytes
/// at a time: the number of bytes done (the rest is the scalar code's). With `add` zero it is
/// brightness (`x * f + 0` is `x * f`, both non-negative), else contrast's blend.
///
/// # Safety
/// The CPU has AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn values(img: &mut [u8], mul: f32, add: f32) -> usize {
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
                to_u8(_mm256_add_ps(_mm256_mul_ps(v, mul), add))
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
fn flush(lanes: __m256i) -> u64 {
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
fn load(px: &[u8; BLOCK]) -> [__m256; 3] {
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
fn store(px: &mut [u8; BLOCK], [r, g, b]: [__m256i; 3]) {
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

/// torchvision's grayscale, `0.2989 R + 0.587 G + 0.114 B` in that order.
#[target_feature(enable = "avx2")]
fn gray(r: __m256, g: __m256, b: __m256) -> __m256 {
    let rg = _mm256_add_ps(_mm256_mul_ps(r, _mm256_set1_ps(0.2989)), _mm256_mul_ps(g, _mm256_set1_ps(0.587)));
    _mm256_add_ps(rg, _mm256_mul_ps(b, _mm256_set1_ps(0.114)))
}

/// Rounded down (the values here are 0..=255).
#[target_feature(enable = "avx2")]
fn floor(x: __m256) -> __m256 {
    _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x)
}

/// Clamped to 0..=255 and truncated, one value in each `i32` lane.
#[target_feature(enable = "avx2")]
fn to_u8(v: __m256) -> __m256i {
    _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0)))
}

/// `if mask { a } else { b }`, lane by lane.
#[target_feature(enable = "avx2")]
fn select(mask: __m256, a: __m256, b: __m256) -> __m256 {
    _mm256_blendv_ps(b, a, mask)
}

/// The scalar `super::hue`, lane by lane.
#[target_feature(enable = "avx2")]
fn hue(r: __m256, g: __m256, b: __m256, f: f32) -> [__m256i; 3] {
    let splat = _mm256_set1_ps;
    let one = splat(1.0);
    let scale = splat(1.0 / 255.0);
    let (r, g, b) = (_mm256_mul_ps(r, scale), _mm256_mul_ps(g, scale), _mm256_mul_ps(b, scale));
    let maxc = _mm256_max_ps(_mm256_max_ps(r, g), b);
    let minc = _mm256_min_ps(_mm256_min_ps(r, g), b);
    let eqc = _mm256_cmp_ps::<_CMP_EQ_OQ>(maxc, minc);
    let range = _mm256_sub_ps(maxc, minc);
    let s = _mm256_div_ps(range, select(eqc, one, maxc));
    let div = select(eqc, one, range);
    let rc = _mm256_div_ps(_mm256_sub_ps(maxc, r), div);
    let gc = _mm256_div_ps(_mm256_sub_ps(maxc, g), div);
    let bc = _mm256_div_ps(_mm256_sub_ps(maxc, b), div);
    let hr = _mm256_sub_ps(bc, gc);
    let hg = _mm256_sub_ps(_mm256_add_ps(splat(2.0), rc), bc);
    let hb = _mm256_sub_ps(_mm256_add_ps(splat(4.0), gc), rc);
    let h = select(_mm256_cmp_ps::<_CMP_EQ_OQ>(maxc, r), hr, select(_mm256_cmp_ps::<_CMP_EQ_OQ>(maxc, g), hg, hb));
    let h = _mm256_add_ps(_mm256_mul_ps(h, splat(1.0 / 6.0)), one);
    let h = select(_mm256_cmp_ps::<_CMP_GE_OQ>(h, one), _mm256_sub_ps(h, one), h);
    let h = _mm256_add_ps(h, splat(f));
    let h = select(
        _mm256_cmp_ps::<_CMP_LT_OQ>(h, _mm256_setzero_ps()),
        _mm256_add_ps(h, one),
        select(_mm256_cmp_ps::<_CMP_GE_OQ>(h, one), _mm256_sub_ps(h, one), h),
    );
    let v = maxc;
    let h6 = _mm256_mul_ps(h, splat(6.0));
    let i = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(h6);
    let fr = _mm256_sub_ps(h6, i);
    let sector = select(_mm256_cmp_ps::<_CMP_GE_OQ>(i, splat(6.0)), _mm256_setzero_ps(), i);
    let sxf = _mm256_mul_ps(s, fr);
    let unit = |x| _mm256_min_ps(_mm256_max_ps(x, _mm256_setzero_ps()), one);
    let one_s = _mm256_sub_ps(one, s);
    let q = unit(_mm256_mul_ps(_mm256_sub_ps(one, sxf), v));
    let t = unit(_mm256_mul_ps(_mm256_add_ps(sxf, one_s), v));
    let p = unit(_mm256_mul_ps(one_s, v));
    // Sectors 0..6 give (v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q).
    let below = |n: f32| _mm256_cmp_ps::<_CMP_LT_OQ>(sector, splat(n));
    let (lt1, lt2, lt3, lt4, lt5) = (below(1.0), below(2.0), below(3.0), below(4.0), below(5.0));
    let pick = |x: [__m256; 6]| {
        let lo = select(lt1, x[0], select(lt2, x[1], x[2]));
        let hi = select(lt4, x[3], select(lt5, x[4], x[5]));
        _mm256_cvttps_epi32(_mm256_mul_ps(select(lt3, lo, hi), splat(255.999)))
    };
    [pick([v, q, p, p, t, v]), pick([t, v, v, q, p, p]), pick([p, p, t, v, v, q])]
}
