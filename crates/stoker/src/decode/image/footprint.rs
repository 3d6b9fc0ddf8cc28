//! What decoding one image holds at its peak, known from its headers before any pixel buffer
//! exists: the number a decode reserves from its decoder's memory budget (`decode::budget`)
//! and the one `max_pixels` is checked against.
//!
//! Upper bounds, not measurements: each term is the largest a buffer can grow to for this
//! image (our scratch buffers exactly; the codecs' own from how they allocate, with slack).
//! `tests/decode_budget.rs` checks them against what decoding really allocates.

use super::ImageError;

/// Slack for a codec's fixed state (Huffman tables, inflate window, headers and the like).
const CODEC_FIXED: u64 = 1 << 20;

/// What an image's headers say about decoding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) width: u32,
    pub(super) height: u32,
    /// The codec's output for the whole image: width × height × channels × bytes a sample
    /// (16-bit samples and alpha included), what `max_pixels` bounds.
    pub(super) decoded: u64,
    /// Our buffer for that output where it is not 8-bit RGB already (PNG; WebP with alpha).
    pub(super) raw: u64,
    /// The codec's own buffers beside it: JPEG planes and coefficients, PNG rows and inflate
    /// state, WebP's planes.
    pub(super) codec: u64,
}

impl Header {
    /// `width × height` as `u64`.
    pub(super) fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }

    /// Refuse an empty image, and one whose codec output is more than `max_pixels` pixels of
    /// 8-bit RGB would take (so 16-bit RGBA counts 8/3 a pixel). Everything is converted to
    /// 8-bit RGB, so no image counts less than its pixels.
    pub(super) fn check(&self, max_pixels: u64) -> Result<(), ImageError> {
        let (width, height) = (u64::from(self.width), u64::from(self.height));
        if width == 0 || height == 0 {
            return Err(ImageError::Empty { width, height });
        }
        let pixels = self.pixels().max(self.decoded.div_ceil(3));
        if pixels > max_pixels {
            return Err(ImageError::TooLarge { width, height, pixels, decoded_bytes: self.decoded, max: max_pixels });
        }
        Ok(())
    }

    /// Bytes decoding this image into an output of `size` (`[height, width]`) holds at most:
    /// the codec's output and its own buffers, the 8-bit RGB image, and the resize's
    /// intermediate image, coefficient tables and output.
    pub(super) fn working(&self, size: [u32; 2]) -> u64 {
        let (w, h) = (u64::from(self.width), u64::from(self.height));
        let (ow, oh) = (u64::from(size[1]), u64::from(size[0]));
        let rgb = self.pixels().saturating_mul(3);
        // The pass between the two: output columns by source rows, or source columns by
        // output rows, whichever order the resize takes.
        let between = (ow.saturating_mul(h)).max(w.saturating_mul(oh)).saturating_mul(3);
        // Per axis: about 2 × input + 3 × output taps, each as an i32, as a pair entry of 32
        // bytes per two taps, plus 16 bytes of bounds per output pixel; and a padded row.
        let tables = 56 * (w + h) + 92 * (ow + oh) + 3 * w + 4096;
        let resized = ow * oh * 3;
        [self.raw, self.codec, rgb, between, tables, resized].iter().fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// A JPEG's codec buffers: its component planes (the row path pulls them whole) and, when the
/// scans are buffered (progressive, or components in separate scans), every coefficient as an
/// `i16`, twice: the decoder keeps the last complete scan's while it decodes the next (its
/// incremental mode, which the row pull turns on). `planes` are `(stride, rows)` per component.
pub(super) fn jpeg_codec(planes: &[(usize, usize)], buffered: bool) -> u64 {
    // Coefficients cover whole MCUs: up to 16 samples more each way than the plane.
    let samples: u64 = planes.iter().map(|&(s, r)| (s as u64 + 16) * (r as u64 + 16)).sum();
    let coefficients = if buffered { 4 * samples } else { 0 };
    samples + coefficients + CODEC_FIXED
}

/// A PNG's codec buffers: a few rows of the raw stream (current, previous, and the inflate
/// look-back), the inflate state, and the metadata it kept (an ICC profile).
pub(super) fn png_codec(line_bytes: u64, metadata: u64) -> u64 {
    line_bytes.saturating_mul(4).saturating_add(metadata).saturating_add(CODEC_FIXED)
}

/// A WebP's codec buffers. Lossy: the Y, U and V planes in whole macroblocks, and with alpha
/// its plane decoded through a lossless RGBA image. Lossless: an RGBA image when the output
/// has no alpha (it decodes into our buffer otherwise). Animated: a canvas and a frame, RGBA.
pub(super) fn webp_codec(width: u32, height: u32, lossy: bool, alpha: bool, animated: bool) -> u64 {
    let (w, h) = (u64::from(width), u64::from(height));
    let px = w * h;
    let planes = if lossy { (w + 16) * (h + 16) * 3 / 2 } else { 0 };
    let rgba = if lossy && alpha {
        px * 6
    } else if !lossy && !alpha {
        px * 4
    } else {
        0
    };
    let frames = if animated { px * 8 } else { 0 };
    planes + rgba + frames + CODEC_FIXED
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(width: u32, height: u32, bytes_per_pixel: u64) -> Header {
        Header { width, height, decoded: u64::from(width) * u64::from(height) * bytes_per_pixel, raw: 0, codec: 0 }
    }

    #[test]
    fn max_pixels_counts_wide_samples_and_alpha_by_bytes() {
        // 8-bit RGB (and narrower, which becomes RGB) counts its pixels.
        header(100, 100, 3).check(10_000).unwrap();
        header(100, 100, 1).check(10_000).unwrap();
        assert!(matches!(header(100, 101, 1).check(10_000), Err(ImageError::TooLarge { pixels: 10_100, .. })));
        // 16-bit RGBA: 8 bytes a pixel, as much as 8/3 RGB pixels.
        match header(100, 100, 8).check(10_000) {
            Err(ImageError::TooLarge {
                width: 100,
                height: 100,
                pixels: 26_667,
                decoded_bytes: 80_000,
                max: 10_000,
            }) => {}
            other => panic!("{other:?}"),
        }
        header(100, 100, 8).check(26_667).unwrap();
        // 8-bit RGBA: 4/3.
        assert!(header(300, 100, 4).check(30_000).is_err());
        header(300, 100, 4).check(40_000).unwrap();
        assert_eq!(header(0, 5, 3).check(10), Err(ImageError::Empty { width: 0, height: 5 }));
        let msg = header(100, 100, 8).check(10_000).unwrap_err().to_string();
        assert!(msg.contains("80000 bytes") && msg.contains("max_pixels=10000") && msg.contains("raise"), "{msg}");
    }

    #[test]
    fn working_memory_covers_every_buffer_and_never_overflows() {
        let h = Header { width: 10_000, height: 10_000, decoded: 800_000_000, raw: 800_000_000, codec: 1 << 20 };
        let w = h.working([224, 224]);
        // The 16-bit RGBA output, the RGB image, the codec, the resize: about 1.1 GB.
        assert!(w > 800_000_000 + 300_000_000 + (1 << 20) && w < 1_120_000_000, "{w}");
        let huge = Header { width: u32::MAX, height: u32::MAX, decoded: u64::MAX, raw: u64::MAX, codec: u64::MAX };
        assert_eq!(huge.working([16384, 16384]), u64::MAX);
    }
}
