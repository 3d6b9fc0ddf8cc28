//! The two passes with SSE4.1 and AVX2: the scalar loops' integer sums, vectorised.
//!
//! The weights need 22 bits, so products are 32-bit (`pmulld`), not the 16-bit
//! multiply-adds a resizer with 15-bit weights uses: that is what keeps the bytes Pillow's.
//!
//! Vertical: one output row is a weighted sum of whole source rows, so 8 (or 4) bytes
//! widen to 32-bit lanes and each tap is one multiply and one add per lane.
//! Horizontal: one output pixel sums a few neighbouring RGB pixels; 8 bytes loaded at a
//! tap pair (`r0 g0 b0 r1 g1 b1 r2 g2`) widen to 8 lanes, are multiplied by the pair's
//! spread weights (`k0 k0 k0 k1 k1 k1 0 0`, see `Axis::pairs`), and lanes 0..3 and 3..6
//! are added at the end.

use std::arch::x86_64::*;

use super::{clip8, Axis, HALF, PRECISION_BITS};

/// The three RGB sums, lanes 0..3 of `lo` (which start from `HALF`) plus lanes 3..6 of
/// `lo:hi`, shifted and clamped to bytes, in the low 3 bytes.
#[inline]
#[target_feature(enable = "sse4.1")]
fn rgb_bytes(lo: __m128i, hi: __m128i) -> u32 {
    let s = _mm_add_epi32(lo, _mm_alignr_epi8::<12>(hi, lo));
    let s = _mm_srai_epi32::<{ PRECISION_BITS as i32 }>(s);
    let s = _mm_packs_epi32(s, s);
    _mm_cvtsi128_si32(_mm_packus_epi16(s, s)) as u32
}

/// Output pixel `xx` of a row: 4 bytes at once (the 4th is the next pixel's, rewritten when
/// that is stored), or 3 for the row's last pixel.
#[inline(always)]
fn put(out: &mut [u8], xx: usize, v: u32) {
    match out.get_mut(xx * 3..xx * 3 + 4) {
        Some(o) => o.copy_from_slice(&v.to_le_bytes()),
        None => out[xx * 3..xx * 3 + 3].copy_from_slice(&v.to_le_bytes()[..3]),
    }
}

/// The horizontal pass of one RGB row.
///
/// # Safety
/// The CPU has AVX2; `row.len() >= axis.read_end` and `axis.pairs` is `prepare_pairs`'s
/// for these bounds; `out.len() == 3 * axis.bounds.len()`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn h_row_avx2(row: &[u8], axis: &Axis, out: &mut [u8]) {
    let per = axis.ksize.div_ceil(2);
    for (xx, (&(first, taps), pairs)) in axis.bounds.iter().zip(axis.pairs.chunks_exact(per)).enumerate() {
        // SAFETY: pair j loads 8 bytes at `first * 3 + 6 * j`, which ends at most at
        // `read_end` (prepare_pairs), inside `row`; the weights are read from `pairs`.
        let v = unsafe {
            let p = row.as_ptr().add(first * 3);
            let mut acc = _mm256_setr_epi32(HALF, HALF, HALF, 0, 0, 0, 0, 0);
            for (j, c) in pairs[..taps.div_ceil(2)].iter().enumerate() {
                let px = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(6 * j).cast()));
                let k = _mm256_loadu_si256(c.as_ptr().cast());
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, k));
            }
            rgb_bytes(_mm256_castsi256_si128(acc), _mm256_extracti128_si256::<1>(acc))
        };
        put(out, xx, v);
    }
}

/// Two rows' RGB sums at once: `[a's R G B _ | b's R G B _]` (see `rgb_bytes`).
#[inline]
#[target_feature(enable = "avx2")]
fn rgb_sums2(a: __m256i, b: __m256i) -> __m256i {
    let lo = _mm256_permute2x128_si256::<0x20>(a, b);
    let hi = _mm256_permute2x128_si256::<0x31>(a, b);
    let s = _mm256_add_epi32(lo, _mm256_alignr_epi8::<12>(hi, lo));
    _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(s)
}

/// The horizontal pass of four RGB rows.
///
/// # Safety
/// As [`h_row_avx2`], for each row and its output.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn h_rows4_avx2(rows: [&[u8]; 4], axis: &Axis, outs: [&mut [u8]; 4]) {
    let per = axis.ksize.div_ceil(2);
    let [o0, o1, o2, o3] = outs;
    for (xx, (&(first, taps), pairs)) in axis.bounds.iter().zip(axis.pairs.chunks_exact(per)).enumerate() {
        // SAFETY: as in h_row_avx2, for each of the four rows.
        let v = unsafe {
            let p = rows.map(|r| r.as_ptr().add(first * 3));
            let init = _mm256_setr_epi32(HALF, HALF, HALF, 0, 0, 0, 0, 0);
            let mut acc = [init; 4];
            for (j, c) in pairs[..taps.div_ceil(2)].iter().enumerate() {
                let k = _mm256_loadu_si256(c.as_ptr().cast());
                for (a, p) in acc.iter_mut().zip(p) {
                    let px = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(6 * j).cast()));
                    *a = _mm256_add_epi32(*a, _mm256_mullo_epi32(px, k));
                }
            }
            // Packing works within 128-bit halves: rows 0 and 2 land in the low half,
            // 1 and 3 in the high one.
            let w = _mm256_packs_epi32(rgb_sums2(acc[0], acc[1]), rgb_sums2(acc[2], acc[3]));
            let b = _mm256_packus_epi16(w, w);
            let (lo, hi) = (_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            [
                _mm_cvtsi128_si32(lo) as u32,
                _mm_cvtsi128_si32(hi) as u32,
                _mm_extract_epi32::<1>(lo) as u32,
                _mm_extract_epi32::<1>(hi) as u32,
            ]
        };
        put(o0, xx, v[0]);
        put(o1, xx, v[1]);
        put(o2, xx, v[2]);
        put(o3, xx, v[3]);
    }
}

/// The horizontal pass of one RGB row.
///
/// # Safety
/// As [`h_row_avx2`], with SSE4.1.
#[target_feature(enable = "sse4.1")]
pub(super) unsafe fn h_row_sse41(row: &[u8], axis: &Axis, out: &mut [u8]) {
    let per = axis.ksize.div_ceil(2);
    for (xx, (&(first, taps), pairs)) in axis.bounds.iter().zip(axis.pairs.chunks_exact(per)).enumerate() {
        // SAFETY: as in h_row_avx2: 8 bytes per pair, inside `row`.
        let v = unsafe {
            let p = row.as_ptr().add(first * 3);
            let mut lo = _mm_setr_epi32(HALF, HALF, HALF, 0);
            let mut hi = _mm_setzero_si128();
            for (j, c) in pairs[..taps.div_ceil(2)].iter().enumerate() {
                let px = _mm_loadl_epi64(p.add(6 * j).cast());
                let k_lo = _mm_loadu_si128(c.as_ptr().cast());
                let k_hi = _mm_loadu_si128(c.as_ptr().add(4).cast());
                lo = _mm_add_epi32(lo, _mm_mullo_epi32(_mm_cvtepu8_epi32(px), k_lo));
                hi = _mm_add_epi32(hi, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128::<4>(px)), k_hi));
            }
            rgb_bytes(lo, hi)
        };
        put(out, xx, v);
    }
}

/// One output row of the vertical pass: `out[i] = clip8(HALF + sum_t data[base + t * stride
/// + i] * k[t])`.
///
/// # Safety
/// The CPU has AVX2; for every tap `t`, `data[base + t * stride..][..out.len()]` exists.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn v_row_avx2(data: &[u8], base: usize, stride: usize, k: &[i32], out: &mut [u8]) {
    let n = out.len();
    let mut i = 0;
    // SAFETY (both loops): every load reads bytes `i..i + 32` (or `i..i + 8`) of a tap's row
    // with `i + 32 <= n` (or `i + 8 <= n`), inside `data` by the contract; every store writes
    // the same range of `out`.
    unsafe {
        let src = data.as_ptr().add(base);
        let dst = out.as_mut_ptr();
        let half = _mm256_set1_epi32(HALF);
        while i + 32 <= n {
            let (mut a0, mut a1, mut a2, mut a3) = (half, half, half, half);
            for (t, &kv) in k.iter().enumerate() {
                let kk = _mm256_set1_epi32(kv);
                let p = src.add(t * stride + i);
                let widen = |o: usize| _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(o).cast()));
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(widen(0), kk));
                a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(widen(8), kk));
                a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(widen(16), kk));
                a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(widen(24), kk));
            }
            let shift = |a| _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(a);
            // Packing works within 128-bit halves: the 4-byte groups come out as
            // a0lo a1lo a2lo a3lo | a0hi a1hi a2hi a3hi, and the permute restores the order.
            let w01 = _mm256_packs_epi32(shift(a0), shift(a1));
            let w23 = _mm256_packs_epi32(shift(a2), shift(a3));
            let b = _mm256_packus_epi16(w01, w23);
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(dst.add(i).cast(), b);
            i += 32;
        }
        while i + 8 <= n {
            let mut a = half;
            for (t, &kv) in k.iter().enumerate() {
                let px = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(t * stride + i).cast()));
                a = _mm256_add_epi32(a, _mm256_mullo_epi32(px, _mm256_set1_epi32(kv)));
            }
            let a = _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(a);
            let w = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
            _mm_storel_epi64(dst.add(i).cast(), _mm_packus_epi16(w, w));
            i += 8;
        }
    }
    v_tail(data, base, stride, k, &mut out[i..], i);
}

/// One output row of the vertical pass.
///
/// # Safety
/// As [`v_row_avx2`], with SSE4.1.
#[target_feature(enable = "sse4.1")]
pub(super) unsafe fn v_row_sse41(data: &[u8], base: usize, stride: usize, k: &[i32], out: &mut [u8]) {
    let n = out.len();
    let mut i = 0;
    // SAFETY: every load reads bytes `i..i + 16` of a tap's row with `i + 16 <= n`, inside
    // `data` by the contract; every store writes the same range of `out`.
    unsafe {
        let src = data.as_ptr().add(base);
        let dst = out.as_mut_ptr();
        let half = _mm_set1_epi32(HALF);
        while i + 16 <= n {
            let (mut a0, mut a1, mut a2, mut a3) = (half, half, half, half);
            for (t, &kv) in k.iter().enumerate() {
                let kk = _mm_set1_epi32(kv);
                let x = _mm_loadu_si128(src.add(t * stride + i).cast());
                a0 = _mm_add_epi32(a0, _mm_mullo_epi32(_mm_cvtepu8_epi32(x), kk));
                a1 = _mm_add_epi32(a1, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128::<4>(x)), kk));
                a2 = _mm_add_epi32(a2, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128::<8>(x)), kk));
                a3 = _mm_add_epi32(a3, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128::<12>(x)), kk));
            }
            let shift = |a| _mm_srai_epi32::<{ PRECISION_BITS as i32 }>(a);
            let w01 = _mm_packs_epi32(shift(a0), shift(a1));
            let w23 = _mm_packs_epi32(shift(a2), shift(a3));
            _mm_storeu_si128(dst.add(i).cast(), _mm_packus_epi16(w01, w23));
            i += 16;
        }
    }
    v_tail(data, base, stride, k, &mut out[i..], i);
}

/// The last bytes of a vertical row, fewer than one vector, in plain Rust.
fn v_tail(data: &[u8], base: usize, stride: usize, k: &[i32], out: &mut [u8], from: usize) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut ss = HALF;
        for (t, &kv) in k.iter().enumerate() {
            ss = ss.wrapping_add(i32::from(data[base + t * stride + from + i]).wrapping_mul(kv));
        }
        *o = clip8(ss);
    }
}
