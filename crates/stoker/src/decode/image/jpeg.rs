//! YCbCr JPEGs, decoded only as far down as the window needs, then upsampled and converted
//! to RGB exactly as libjpeg-turbo does (what PIL links), for just the window's pixels.
//!
//! zune-jpeg's raw iMCU-row pull (0.5.16) hands over component planes after the IDCT; we stop
//! pulling after the last row the window needs (entropy decoding cannot skip the rows above,
//! but the IDCT, upsampling and colour conversion can: our patch of zune-jpeg transforms only
//! the blocks under the window) and do libjpeg's "fancy" (triangle) chroma
//! upsampling and its fixed-point YCbCr->RGB ourselves. zune-jpeg's own upsampler differs from
//! libjpeg's by up to 6 levels on 4:2:0 photos; with this one only IDCT rounding remains.
//!
//! Throughput against the alternatives is in the parent module's docs.

use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::{DecoderBuffers, JpegDecoder, RawImcuRowStatus};

use super::grow;
use super::window::Rect;
use super::ImageError;

/// Planes and row buffers the row path reuses, and the storage zune-jpeg's decoders pass
/// from one image to the next.
#[derive(Default)]
pub(super) struct JpegScratch {
    /// What the last decoder left (our patch of zune-jpeg, vendor/zune-jpeg/PATCHED.md):
    /// component rows, coefficients, scan state. Without it each image costs ~28 allocations
    /// inside the decoder, ~170 for a progressive one read by rows.
    decoder: DecoderBuffers,
    planes: [Vec<u8>; 3],
    cb_row: Vec<u8>,
    cr_row: Vec<u8>,
    /// 16 bits hold every sum (at most 4 x 255 before the horizontal taps, 4 x 1020 + 8
    /// after): twice the lanes of `i32`, and the upsampling ran in 0.6 of the time.
    sums: [Vec<u16>; 2],
    wide: Vec<u8>,
}

impl JpegScratch {
    /// Bytes the buffers hold, the decoder's own included.
    pub(super) fn held_bytes(&self) -> u64 {
        let bytes = self.decoder.capacity_bytes()
            + self.planes.iter().map(Vec::capacity).sum::<usize>()
            + self.cb_row.capacity()
            + self.cr_row.capacity()
            + self.sums.iter().map(|s| s.capacity() * 2).sum::<usize>()
            + self.wide.capacity();
        bytes as u64
    }
}

/// How many components the first scan of a JPEG codes (its first SOS header), walking the
/// marker segments before it; `None` if there is no well-formed one. Fewer than the frame's
/// components means the scans are buffered whole before any row comes out.
pub(super) fn first_scan_components(data: &[u8]) -> Option<usize> {
    let mut i = 2; // after SOI
    loop {
        if *data.get(i)? != 0xFF {
            return None;
        }
        // Fill bytes may precede a marker.
        while *data.get(i + 1)? == 0xFF {
            i += 1;
        }
        match *data.get(i + 1)? {
            0xDA => return data.get(i + 4).map(|&n| usize::from(n)),
            0x01 | 0xD0..=0xD8 => i += 2,
            _ => i += 2 + usize::from(u16::from_be_bytes([*data.get(i + 2)?, *data.get(i + 3)?])),
        }
    }
}

/// The JPEG decoder's input: a byte slice read as zune-core's `ZCursor` reads one (a position
/// that may pass the end, reads there give nothing), with a `read` the compiler can see
/// through. zune-jpeg refills its bit buffer through `Read::read` 4 bytes at a time, and
/// `ZCursor`'s read copies a length known only at run time: a `memcpy` call per refill, 2% of
/// a cropped decode. Here a whole read is a copy of the caller's length, a constant there.
#[derive(Clone, Copy)]
pub(super) struct JpegInput<'a> {
    data: &'a [u8],
    pos: usize,
}

impl JpegInput<'_> {
    #[inline(always)]
    fn rest(&self) -> &[u8] {
        self.data.get(self.pos..).unwrap_or(&[])
    }
}

impl std::io::Read for JpegInput<'_> {
    #[inline(always)]
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let rest = self.rest();
        let n = match rest.get(..buf.len()) {
            Some(whole) => {
                buf.copy_from_slice(whole);
                buf.len()
            }
            None => {
                buf[..rest.len()].copy_from_slice(rest);
                rest.len()
            }
        };
        self.pos += n;
        Ok(n)
    }
}

impl std::io::BufRead for JpegInput<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        Ok(self.rest())
    }

    fn consume(&mut self, amount: usize) {
        self.pos += amount;
    }
}

impl std::io::Seek for JpegInput<'_> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let (base, offset) = match to {
            std::io::SeekFrom::Start(n) => (0, i64::try_from(n).unwrap_or(i64::MAX)),
            std::io::SeekFrom::End(n) => (self.data.len(), n),
            std::io::SeekFrom::Current(n) => (self.pos, n),
        };
        let offset = isize::try_from(offset).map_err(|_| std::io::Error::other("seek out of range"))?;
        self.pos = base.checked_add_signed(offset).ok_or_else(|| std::io::Error::other("negative seek"))?;
        Ok(self.pos as u64)
    }
}

/// A decoder for `data` on the buffers the thread's last JPEG decoder left; hand them back
/// with [`recycle`] when done, failed or not.
pub(super) fn decoder<'a>(data: &'a [u8], js: &mut JpegScratch) -> JpegDecoder<JpegInput<'a>> {
    let buffers = std::mem::take(&mut js.decoder);
    let mut d = JpegDecoder::new_with_buffers(JpegInput { data, pos: 0 }, jpeg_options(), buffers);
    // EXIF, ICC and XMP are never read (PIL's convert("RGB") ignores them too): skipping
    // them spares a copy of each, up to 64 KiB a segment.
    d.set_skip_metadata(true);
    d
}

/// Keep `d`'s buffers for the thread's next JPEG.
pub(super) fn recycle(d: JpegDecoder<JpegInput<'_>>, js: &mut JpegScratch) {
    js.decoder = d.into_buffers();
}

/// Decode `need` of a 3-component YCbCr JPEG with chroma at 1x1 and luma at 1 or 2 on each
/// axis into `pixels` (RGB8, `need.width() x need.height()`). `Ok(false)`: not such a JPEG
/// (gray, CMYK, RGB, odd sampling), decode it whole instead.
pub(super) fn decode_region(
    d: &mut JpegDecoder<JpegInput<'_>>,
    data: &[u8],
    need: Rect,
    js: &mut JpegScratch,
    pixels: &mut Vec<u8>,
    err: fn(zune_jpeg::errors::DecodeErrors) -> ImageError,
) -> Result<bool, ImageError> {
    if d.input_colorspace() != Some(ColorSpace::YCbCr) {
        return Ok(false);
    }
    let raw = d.raw_output();
    let (Some(3), Some(layout)) = (raw.num_components(), raw.layout()) else { return Ok(false) };
    let (y, cb, cr) = (layout[0], layout[1], layout[2]);
    let (hf, vf) = (y.horizontal_sampling_factor, y.vertical_sampling_factor);
    let chroma_1x1 = [cb, cr].iter().all(|p| p.horizontal_sampling_factor == 1 && p.vertical_sampling_factor == 1);
    if !chroma_1x1 || !(1..=2).contains(&hf) || !(1..=2).contains(&vf) || y.width < need.x1 || y.height < need.y1 {
        return Ok(false);
    }
    let (cw, ch) = (cb.width, cb.height);
    if cw == 0 || ch == 0 || cr.width != cw || cr.height != ch {
        return Ok(false);
    }
    // Rows to pull: luma to the window's bottom; chroma one row further (the triangle filter's
    // row below), clamped to the plane.
    let luma_rows = need.y1;
    let chroma_rows = ((need.y1 - 1) / vf + 2).min(ch);
    // Of the rows pulled, only the blocks the conversion reads are dequantized and
    // transformed (our patch of zune-jpeg; the rest are entropy-decoded only, which cannot be
    // skipped): luma under the window, chroma under the columns and rows `chroma_row` reads,
    // one neighbour beyond the window's on each side.
    let (y_width, y_height) = (y.width, y.height);
    drop(raw);
    let blocks = |lo: usize, hi: usize| lo / 8..hi.div_ceil(8);
    d.set_block_window(0, blocks(need.x0, need.x1), blocks(need.y0, need.y1));
    let (c0, c1) = ((need.x0 / hf).saturating_sub(1), ((need.x1 - 1) / hf + 2).min(cw));
    let r0 = (need.y0 / vf).saturating_sub(1);
    for c in [1, 2] {
        d.set_block_window(c, blocks(c0, c1), blocks(r0, chroma_rows));
    }
    let mut raw = d.raw_output();
    let strides = [y_width, cw, cw];
    let sizes = [y_width * y_height, cw * ch, cw * ch];
    let mut done = [0usize; 3];
    {
        let [p0, p1, p2] = &mut js.planes;
        let (p0, p1, p2) = (grow(p0, sizes[0]), grow(p1, sizes[1]), grow(p2, sizes[2]));
        while done[0] < luma_rows || done[1] < chroma_rows {
            let mut planes: [&mut [u8]; 3] = [
                p0.get_mut(done[0] * strides[0]..).unwrap_or_default(),
                p1.get_mut(done[1] * strides[1]..).unwrap_or_default(),
                p2.get_mut(done[2] * strides[2]..).unwrap_or_default(),
            ];
            match raw.decode_next_imcu_row(&mut planes, &strides).map_err(err)? {
                RawImcuRowStatus::RowReady { rows_written } => {
                    for (d, r) in done.iter_mut().zip(rows_written) {
                        *d += r;
                    }
                }
                RawImcuRowStatus::NeedMoreInput => {
                    return Err(ImageError::Truncated("JPEG: data ends mid-scan".into()))
                }
                _ => break,
            }
        }
    }
    if done[0] < luma_rows || done[1] < chroma_rows || done[2] < chroma_rows {
        return Err(ImageError::Truncated("JPEG: fewer rows than the frame header says".into()));
    }
    drop(raw);
    if need.y1 < y_height && !ends_complete(data) {
        // We stopped before the end, so the decoder never saw it: a file cut below the
        // window would otherwise decode in one epoch and fail in another.
        return Err(ImageError::Truncated("JPEG: no end-of-image marker after the last scan".into()));
    }
    convert(need, (hf, vf), (y_width, cw, ch), js, pixels);
    Ok(true)
}

/// Whether `data` has an end-of-image marker after its last start-of-scan. Entropy-coded
/// data stuffs every 0xFF byte, so `FF D9` after the last `FF DA` is the real end: a file cut
/// anywhere in its scans fails this (trailers after the end, as some cameras write, pass).
fn ends_complete(data: &[u8]) -> bool {
    // Backwards over the 0xFF bytes only (memrchr is vectorised): an end-of-image marker must
    // turn up before the last start-of-scan does.
    let mut eoi = false;
    for i in memchr::memrchr_iter(0xFF, data) {
        match data.get(i + 1) {
            Some(0xD9) => eoi = true,
            Some(0xDA) => return eoi,
            _ => {}
        }
    }
    false
}

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
fn convert(
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

/// The decoder options: strict, so a truncated or corrupt stream is an error rather than an
/// image padded with gray (zune-jpeg's lenient default, meant for browsers).
pub(super) fn jpeg_options() -> DecoderOptions {
    DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .jpeg_set_out_colorspace(ColorSpace::RGB)
}

#[cfg(test)]
mod tests {
    use super::{decode_region, decoder, ends_complete, first_scan_components, recycle, JpegInput, JpegScratch, Rect};
    use crate::decode::image::ImageError;
    use std::io::{BufRead, Read, Seek, SeekFrom};

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

    /// The input reads as zune-core's `ZCursor` does: whole reads, a short one at the end,
    /// nothing past it, seeks from each base (past the end allowed, before the start not).
    #[test]
    fn the_input_reads_and_seeks_as_a_cursor() {
        let data: Vec<u8> = (0..10).collect();
        let mut r = JpegInput { data: &data, pos: 0 };
        let mut four = [0u8; 4];
        assert_eq!(r.read(&mut four).unwrap(), 4);
        assert_eq!(four, [0, 1, 2, 3]);
        assert_eq!(r.seek(SeekFrom::Current(4)).unwrap(), 8);
        four = [9; 4];
        assert_eq!(r.read(&mut four).unwrap(), 2);
        assert_eq!(four, [8, 9, 9, 9]);
        assert_eq!(r.read(&mut four).unwrap(), 0);
        assert!(r.fill_buf().unwrap().is_empty());
        assert_eq!(r.seek(SeekFrom::Start(20)).unwrap(), 20);
        assert_eq!(r.read(&mut four).unwrap(), 0);
        assert_eq!(r.seek(SeekFrom::End(-3)).unwrap(), 7);
        assert_eq!(r.fill_buf().unwrap(), &[7, 8, 9]);
        r.consume(1);
        let mut one = [0u8];
        assert_eq!((r.read(&mut one).unwrap(), one[0]), (1, 8));
        assert!(r.seek(SeekFrom::Current(-20)).is_err());
        assert_eq!(r.stream_position().unwrap(), 9);
    }

    /// A photo-like JPEG of `w` x `h`: gradients with texture, so every block has AC terms.
    fn jpeg(w: u16, h: u16, sampling: jpeg_encoder::SamplingFactor, restart: u16) -> Vec<u8> {
        let (wu, hu) = (usize::from(w), usize::from(h));
        let px: Vec<u8> = (0..wu * hu)
            .flat_map(|p| {
                let (x, y) = (p % wu, p / wu);
                [(x * 255 / wu) as u8 ^ (y % 7) as u8, (y * 255 / hu) as u8, ((x * y + x) % 251) as u8]
            })
            .collect();
        let mut out = Vec::new();
        let mut e = jpeg_encoder::Encoder::new(&mut out, 88);
        e.set_sampling_factor(sampling);
        if restart > 0 {
            e.set_restart_interval(restart);
        }
        e.encode(&px, w, h, jpeg_encoder::ColorType::Rgb).unwrap();
        out
    }

    fn region(data: &[u8], need: Rect, js: &mut JpegScratch) -> Vec<u8> {
        let mut d = decoder(data, js);
        d.decode_headers().unwrap();
        let mut pixels = Vec::new();
        let ok = decode_region(&mut d, data, need, js, &mut pixels, |e| ImageError::Corrupt(e.to_string()));
        recycle(d, js);
        assert!(ok.unwrap(), "a YCbCr JPEG with these samplings takes the row path");
        pixels.truncate((need.x1 - need.x0) * (need.y1 - need.y0) * 3);
        pixels
    }

    #[test]
    fn windows_decode_the_same_pixels_as_the_whole_image() {
        // The row path transforms only the blocks under the window (and the chroma around
        // it): every window, at the image's edges or inside, in every chroma sampling the path
        // takes and with restart intervals, must give the whole image's pixels there.
        use jpeg_encoder::SamplingFactor as S;
        let mut js = JpegScratch::default();
        let mut rng = crate::decode::SampleRng::new(3, 1, 4);
        for (sampling, restart) in [(S::F_2_2, 0), (S::F_2_1, 0), (S::F_1_2, 0), (S::F_1_1, 0), (S::F_2_2, 3)] {
            for (w, h) in [(203u16, 157u16), (64, 48), (17, 9)] {
                let data = jpeg(w, h, sampling, restart);
                let (wu, hu) = (usize::from(w), usize::from(h));
                let whole = region(&data, Rect { x0: 0, y0: 0, x1: wu, y1: hu }, &mut js);
                let mut rects = vec![
                    Rect { x0: 0, y0: 0, x1: 1, y1: 1 },
                    Rect { x0: wu - 1, y0: hu - 1, x1: wu, y1: hu },
                    Rect { x0: wu / 3, y0: hu / 2, x1: wu, y1: hu },
                    Rect { x0: 0, y0: hu / 3, x1: wu / 2 + 1, y1: hu / 2 + 1 },
                ];
                for _ in 0..40 {
                    let (x0, y0) =
                        (rng.int_inclusive(0, wu as u64 - 1) as usize, rng.int_inclusive(0, hu as u64 - 1) as usize);
                    let x1 = rng.int_inclusive(x0 as u64 + 1, wu as u64) as usize;
                    let y1 = rng.int_inclusive(y0 as u64 + 1, hu as u64) as usize;
                    rects.push(Rect { x0, y0, x1, y1 });
                }
                for need in rects {
                    let got = region(&data, need, &mut js);
                    let want: Vec<u8> = (need.y0..need.y1)
                        .flat_map(|y| whole[(y * wu + need.x0) * 3..(y * wu + need.x1) * 3].to_vec())
                        .collect();
                    assert!(got == want, "{sampling:?} restart {restart}, {w}x{h}, window {need:?}");
                }
            }
        }
    }

    #[test]
    fn the_first_scan_is_found_past_every_segment() {
        let sos = |n: u8| vec![0xFF, 0xDA, 0, 6 + 2 * n, n];
        let app = [0xFF, 0xE1, 0, 4, 0xAA, 0xBB];
        let sof = [0xFF, 0xC0, 0, 3, 8];
        let join = |parts: &[&[u8]]| parts.concat();
        assert_eq!(first_scan_components(&join(&[&[0xFF, 0xD8], &app, &sof, &sos(3)])), Some(3));
        assert_eq!(first_scan_components(&join(&[&[0xFF, 0xD8], &sof, &[0xFF, 0xFF], &sos(1)])), Some(1));
        assert_eq!(first_scan_components(&join(&[&[0xFF, 0xD8], &app])), None);
        assert_eq!(first_scan_components(&join(&[&[0xFF, 0xD8], &[0x12, 0x34]])), None);
        assert_eq!(first_scan_components(&[0xFF, 0xD8, 0xFF, 0xC0, 0xFF]), None);
    }

    #[test]
    fn complete_means_an_end_marker_after_the_last_scan() {
        let soi = [0xFF, 0xD8];
        let sos = [0xFF, 0xDA, 0, 2];
        let eoi = [0xFF, 0xD9];
        let join = |parts: &[&[u8]]| parts.concat();
        // Entropy data with stuffed bytes (FF 00) and a restart marker (FF D0).
        let scan: &[u8] = &[1, 0xFF, 0x00, 2, 0xFF, 0xD0, 3];
        assert!(ends_complete(&join(&[&soi, &sos, scan, &eoi])));
        assert!(ends_complete(&join(&[&soi, &sos, scan, &eoi, b"camera trailer"])));
        // Progressive: two scans, the file cut inside the second.
        assert!(!ends_complete(&join(&[&soi, &sos, scan, &sos, scan])));
        assert!(ends_complete(&join(&[&soi, &sos, scan, &sos, scan, &eoi])));
        // An end marker only before the last scan (a cut file whose first scan ended).
        assert!(!ends_complete(&join(&[&soi, &sos, &eoi, &sos, scan])));
        assert!(!ends_complete(&join(&[&soi, &eoi])));
        assert!(!ends_complete(&[0xFF]));
        assert!(!ends_complete(&[]));
    }
}
