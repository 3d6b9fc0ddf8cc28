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

mod convert;
use super::window::Rect;
use super::ImageError;
use convert::convert;

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

    /// Huffman tables kept from earlier images (our zune-jpeg patch) change nothing, also when
    /// every image has tables of its own (optimised coding) and the kept ones are replaced in
    /// turn: 12 such JPEGs decoded twice on one thread's scratch equal each decoded on a fresh one.
    #[test]
    fn kept_huffman_tables_decode_the_same_pixels() {
        let images: Vec<Vec<u8>> = (0..12u16)
            .map(|i| {
                let (w, h) = (40 + 8 * i, 24 + 4 * i);
                let px: Vec<u8> = (0..usize::from(w) * usize::from(h) * 3)
                    .map(|k| ((k * (7 + usize::from(i))) % 253) as u8)
                    .collect();
                let mut out = Vec::new();
                let mut e = jpeg_encoder::Encoder::new(&mut out, 70 + i as u8);
                e.set_optimized_huffman_tables(true);
                e.encode(&px, w, h, jpeg_encoder::ColorType::Rgb).unwrap();
                out
            })
            .collect();
        let mut shared = JpegScratch::default();
        for _ in 0..2 {
            for data in &images {
                let mut d = decoder(data, &mut JpegScratch::default());
                d.decode_headers().unwrap();
                let (w, h) = d.dimensions().unwrap();
                let need = Rect { x0: 0, y0: 0, x1: w, y1: h };
                let fresh = region(data, need, &mut JpegScratch::default());
                assert_eq!(region(data, need, &mut shared), fresh);
            }
        }
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
