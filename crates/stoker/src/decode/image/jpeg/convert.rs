//! Chroma upsampling and YCbCr->RGB for the window's rows, as libjpeg-turbo computes them
//! (what PIL links): its "fancy" (triangle) upsampling and its fixed-point conversion.

use super::super::grow;
use super::{JpegScratch, Rect};

/// libjpeg's YCbCr->RGB fixed-point constants (jdcolor.c, `FIX(x)` at 16 bits). Its tables
/// hold `(FIX(1.402) * (cr - 128) + ONE_HALF) >> 16` and the like; computing the same
/// expressions inline gives the same values and lets the loop vectorise.
const CR_R: i32 = 91881; // FIX(1.40200)
const CB_B: i32 = 116130; // FIX(1.77200)
const CR_G: i32 = 46802; // FIX(0.71414)
const CB_G: i32 = 22554; // FIX(0.34414)
const ONE_HALF: i32 = 1 << 15;

/// One chroma row of the window at full resolution, upsampled as libjpeg-turbo's
/// `h2v1`/`h1v2`/`h2v2_fancy_upsample` do (edges replicate the nearest sample). `sums` and
/// `wide` are scratch; one loop per sampling case, without branches per pixel, so it vectorises.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chroma_row(
    plane: &[u8],
    (cw, ch): (usize, usize),
    (hf, vf): (usize, usize),
    row: usize,
    (x0, x1): (usize, usize),
    sums: &mut Vec<u16>,
    wide: &mut Vec<u8>,
    out: &mut [u8],
) {
    let at = |r: usize| &plane[r * cw..r * cw + cw];
    let cy = (row / vf).min(ch - 1);
    // The chroma columns the window covers, [i0, i1); `sums` holds them with one replicated
    // or real neighbour each side (index k is column i0 - 1 + k).
    let (i0, i1) = (x0 / hf, ((x1 - 1) / hf + 1).min(cw));
    let n = i1 - i0 + 2;
    if sums.len() < n {
        sums.resize(n, 0);
    }
    let sums = &mut sums[..n];
    let near = at(cy);
    let lo = i0.saturating_sub(1);
    let hi = (i1 + 1).min(cw);
    if vf == 2 {
        let far = at(if row.is_multiple_of(2) { cy.saturating_sub(1) } else { (cy + 1).min(ch - 1) });
        let k0 = 1 + lo - i0; // 0, or 1 when the window starts at column 0
        for (s, (a, b)) in sums[k0..].iter_mut().zip(near[lo..hi].iter().zip(&far[lo..hi])) {
            *s = 3 * u16::from(*a) + u16::from(*b);
        }
    } else {
        let k0 = 1 + lo - i0;
        for (s, a) in sums[k0..].iter_mut().zip(&near[lo..hi]) {
            *s = u16::from(*a);
        }
    }
    // Replicate the plane's edge samples into the neighbours that do not exist.
    if i0 == 0 {
        sums[0] = sums[1];
    }
    if i1 == cw {
        sums[n - 1] = sums[n - 2];
    }
    match (hf, vf) {
        (1, 1) => {
            for (o, s) in out.iter_mut().zip(&sums[1..n - 1]) {
                *o = *s as u8;
            }
        }
        (1, _) => {
            let bias = if row.is_multiple_of(2) { 1 } else { 2 };
            for (o, s) in out.iter_mut().zip(&sums[1..n - 1]) {
                *o = ((s + bias) >> 2) as u8;
            }
        }
        _ => {
            // Two outputs per chroma column, from column i0 * 2; the window may start on the
            // odd one.
            let (shift, b0, b1) = if vf == 2 { (4, 8, 7) } else { (2, 1, 2) };
            let len = 2 * (i1 - i0);
            if wide.len() < len {
                wide.resize(len, 0);
            }
            for (o, w) in wide[..len].chunks_exact_mut(2).zip(sums.windows(3)) {
                let c = 3 * w[1];
                o[0] = ((c + w[0] + b0) >> shift) as u8;
                o[1] = ((c + w[2] + b1) >> shift) as u8;
            }
            let start = x0 - 2 * i0;
            out.copy_from_slice(&wide[start..start + out.len()]);
        }
    }
}

/// Upsample and convert the rows and columns of `need` into `pixels`.
///
/// The loops are written to vectorise; the build targets baseline x86-64 (SSE2, without a
/// 32-bit multiply), so on a CPU with AVX2 they run compiled for it: a fifth of the time.
pub(super) fn convert(
    need: Rect,
    factors: (usize, usize),
    dims: (usize, usize, usize),
    js: &mut JpegScratch,
    pixels: &mut Vec<u8>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { convert_avx2(need, factors, dims, js, pixels) };
    }
    convert_rows::<false>(need, factors, dims, js, pixels);
}

/// [`convert`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn convert_avx2(
    need: Rect,
    factors: (usize, usize),
    dims: (usize, usize, usize),
    js: &mut JpegScratch,
    pixels: &mut Vec<u8>,
) {
    convert_rows::<true>(need, factors, dims, js, pixels);
}

#[inline(always)]
fn convert_rows<const AVX2: bool>(
    need: Rect,
    factors: (usize, usize),
    (yw, cw, ch): (usize, usize, usize),
    js: &mut JpegScratch,
    pixels: &mut Vec<u8>,
) {
    let width = need.x1 - need.x0;
    let out = grow(pixels, width * (need.y1 - need.y0) * 3);
    let cb_row = grow(&mut js.cb_row, width);
    let cr_row = grow(&mut js.cr_row, width);
    let [yp, cbp, crp] = &js.planes;
    let [s0, s1] = &mut js.sums;
    let wide = &mut js.wide;
    for (row, out_row) in (need.y0..need.y1).zip(out.chunks_exact_mut(width * 3)) {
        chroma_row(cbp, (cw, ch), factors, row, (need.x0, need.x1), s0, wide, cb_row);
        chroma_row(crp, (cw, ch), factors, row, (need.x0, need.x1), s1, wide, cr_row);
        let luma = &yp[row * yw + need.x0..row * yw + need.x1];
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if AVX2 {
            for (((o, l), cb), cr) in out_row
                .chunks_exact_mut(48)
                .zip(luma.chunks_exact(16))
                .zip(cb_row.chunks_exact(16))
                .zip(cr_row.chunks_exact(16))
            {
                // SAFETY: `AVX2` is set only by `convert_avx2`, which runs where the CPU has it.
                unsafe { x86::ycc16(l, cb, cr, o) };
                done += 16;
            }
        }
        let (luma, cb_row, cr_row) = (&luma[done..], &cb_row[done..], &cr_row[done..]);
        for (((px, &l), &cb), &cr) in
            out_row[done * 3..].chunks_exact_mut(3).zip(luma).zip(cb_row.iter()).zip(cr_row.iter())
        {
            px.copy_from_slice(&ycc_to_rgb(l, cb, cr));
        }
    }
}

/// libjpeg-turbo's fixed-point YCbCr->RGB of one pixel.
#[inline(always)]
fn ycc_to_rgb(l: u8, cb: u8, cr: u8) -> [u8; 3] {
    let (l, cb, cr) = (i32::from(l), i32::from(cb) - 128, i32::from(cr) - 128);
    [
        (l + ((CR_R * cr + ONE_HALF) >> 16)).clamp(0, 255) as u8,
        (l + ((-CB_G * cb + ONE_HALF - CR_G * cr) >> 16)).clamp(0, 255) as u8,
        (l + ((CB_B * cb + ONE_HALF) >> 16)).clamp(0, 255) as u8,
    ]
}

/// YCbCr->RGB of 16 pixels at a time with AVX2, giving the scalar loop's bytes in 16-bit
/// lanes: Cr's red and Cb's blue terms as rounding multiplies (`_mm256_mulhrs_epi16` of twice
/// the sample) by constants that give libjpeg-turbo's fixed-point products for every one of
/// the 256 inputs (checked exhaustively by the tests), green's two products summed exactly in
/// 32 bits (`pmaddwd`), the clamp as the saturation of the pack to bytes; then the planes
/// interleaved into RGB triples by byte shuffles. The compiler's vectorisation of the scalar
/// loop ran in 32-bit lanes, half as many.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CB_G, CR_G, ONE_HALF};

    /// `_mm256_mulhrs_epi16(2 x cr, CR_R16)` is `(CR_R x cr + ONE_HALF) >> 16` for every Cr.
    pub(super) const CR_R16: i16 = 22971;
    /// `_mm256_mulhrs_epi16(2 x cb, CB_B16)` is `(CB_B x cb + ONE_HALF) >> 16` for every Cb.
    pub(super) const CB_B16: i16 = 29033;

    /// For each 16-byte third of 16 interleaved RGB pixels, and each channel: which of the
    /// channel's 16 bytes lands on each of the third's bytes (-1: none, `pshufb` gives zero).
    const SPREAD: [[[i8; 16]; 3]; 3] = {
        let mut m = [[[-1i8; 16]; 3]; 3];
        let mut k = 0;
        while k < 48 {
            m[k / 16][k % 3][k % 16] = (k / 3) as i8;
            k += 1;
        }
        m
    };

    /// Convert 16 pixels (`l`, `cb`, `cr`: 16 samples each) into `out` (48 bytes).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn ycc16(l: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
        let (l, cb, cr, out) = (&l[..16], &cb[..16], &cr[..16], &mut out[..48]);
        // SAFETY: 16-byte loads of 16-byte slices, 16-byte stores into 48 bytes.
        unsafe {
            let load = |s: &[u8]| _mm256_cvtepu8_epi16(_mm_loadu_si128(s.as_ptr().cast()));
            let c128 = _mm256_set1_epi16(128);
            let y = load(l);
            let b = _mm256_sub_epi16(load(cb), c128);
            let r = _mm256_sub_epi16(load(cr), c128);
            let r2 = _mm256_add_epi16(r, r);
            let red = _mm256_add_epi16(y, _mm256_mulhrs_epi16(r2, _mm256_set1_epi16(CR_R16)));
            let blue = _mm256_add_epi16(y, _mm256_mulhrs_epi16(_mm256_add_epi16(b, b), _mm256_set1_epi16(CB_B16)));
            // -CB_G x cb - CR_G x cr as (cb, 2 x cr) . (-CB_G, -CR_G / 2): both weights fit 16 bits.
            let weights = _mm256_set1_epi32((-CB_G & 0xFFFF) | ((-CR_G / 2) << 16));
            let half = _mm256_set1_epi32(ONE_HALF);
            let green_terms =
                |pairs: __m256i| _mm256_srai_epi32(_mm256_add_epi32(_mm256_madd_epi16(pairs, weights), half), 16);
            // unpacklo/hi take lanes' halves; packs puts them back in order within each lane.
            let green = _mm256_add_epi16(
                y,
                _mm256_packs_epi32(
                    green_terms(_mm256_unpacklo_epi16(b, r2)),
                    green_terms(_mm256_unpackhi_epi16(b, r2)),
                ),
            );
            // To bytes with saturation (the clamp to 0..=255): [R0-7 B0-7 | R8-15 B8-15], then
            // reordered to [R0-15 | B0-15]; green likewise.
            let rb = _mm256_permute4x64_epi64(_mm256_packus_epi16(red, blue), 0b11_01_10_00);
            let gg = _mm256_permute4x64_epi64(_mm256_packus_epi16(green, green), 0b11_01_10_00);
            let planes = [_mm256_castsi256_si128(rb), _mm256_castsi256_si128(gg), _mm256_extracti128_si256(rb, 1)];
            let mask = |m: &[i8; 16]| _mm_loadu_si128(m.as_ptr().cast());
            for (third, masks) in SPREAD.iter().enumerate() {
                let v = _mm_or_si128(
                    _mm_or_si128(
                        _mm_shuffle_epi8(planes[0], mask(&masks[0])),
                        _mm_shuffle_epi8(planes[1], mask(&masks[1])),
                    ),
                    _mm_shuffle_epi8(planes[2], mask(&masks[2])),
                );
                _mm_storeu_si128(out[third * 16..].as_mut_ptr().cast(), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The 16-bit constants equal libjpeg-turbo's products for every input, and the AVX2
    /// conversion gives the scalar bytes for every (Cb, Cr) pair, at luma values that reach
    /// both clamps.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_conversion_gives_the_scalar_bytes() {
        use super::{x86, ycc_to_rgb, CB_B, CR_R, ONE_HALF};
        for c in -128i32..128 {
            let mulhrs = |a: i32, k: i16| (a * i32::from(k) + (1 << 14)) >> 15;
            assert_eq!(mulhrs(2 * c, x86::CR_R16), (CR_R * c + ONE_HALF) >> 16, "Cr {c}");
            assert_eq!(mulhrs(2 * c, x86::CB_B16), (CB_B * c + ONE_HALF) >> 16, "Cb {c}");
        }
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        let mut out = [0u8; 48];
        for cb in 0..=255u8 {
            for cr0 in (0..256).step_by(16) {
                let cbs = [cb; 16];
                let crs: [u8; 16] = std::array::from_fn(|k| (cr0 + k) as u8);
                for l0 in [0u8, 1, 77, 128, 200, 254, 255] {
                    let ls: [u8; 16] = std::array::from_fn(|k| l0.wrapping_add((k * 37) as u8));
                    // SAFETY: the CPU has AVX2, checked above.
                    unsafe { x86::ycc16(&ls, &cbs, &crs, &mut out) };
                    for k in 0..16 {
                        assert_eq!(
                            out[3 * k..3 * k + 3],
                            ycc_to_rgb(ls[k], cbs[k], crs[k]),
                            "{:?}",
                            (ls[k], cb, crs[k])
                        );
                    }
                }
            }
        }
    }
}
