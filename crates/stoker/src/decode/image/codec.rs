//! Format sniffing, header reads and full decodes to interleaved 8-bit RGB, matching PIL's
//! `Image.open(...).convert("RGB")` (alpha dropped, palettes expanded, 16-bit to 8-bit).

use std::io::Cursor;

use zune_jpeg::JpegDecoder;

use super::footprint::{self, Header};
use super::jpeg::{self, JpegScratch};
use super::window::Rect;
use super::{grow, ImageError};

/// The codecs we decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JPEG (JFIF/Exif; baseline or progressive).
    Jpeg,
    /// PNG.
    Png,
    /// WebP (lossy, lossless, extended).
    Webp,
}

/// The format `data` is in, or `Unsupported` naming what it looks like.
pub fn sniff(data: &[u8]) -> Result<Format, ImageError> {
    let starts = |m: &[u8]| data.starts_with(m);
    if starts(&[0xFF, 0xD8, 0xFF]) {
        return Ok(Format::Jpeg);
    }
    if starts(b"\x89PNG\r\n\x1a\n") {
        return Ok(Format::Png);
    }
    if starts(b"RIFF") && data.get(8..12) == Some(b"WEBP") {
        return Ok(Format::Webp);
    }
    let what = if data.is_empty() {
        "empty data".to_string()
    } else if starts(b"GIF87a") || starts(b"GIF89a") {
        "GIF".into()
    } else if starts(b"BM") {
        "BMP".into()
    } else if starts(b"II*\0") || starts(b"MM\0*") {
        "TIFF".into()
    } else if data.get(4..8) == Some(b"ftyp") {
        let brand = data.get(8..12).map(String::from_utf8_lossy).unwrap_or_default();
        format!("ISO media (HEIF/AVIF/MP4), brand {brand:?}")
    } else if starts(&[0xFF, 0x0A]) || starts(b"\0\0\0\x0cJXL ") {
        "JPEG XL".into()
    } else if starts(b"\0\0\0\x0cjP  ") || starts(&[0xFF, 0x4F, 0xFF, 0x51]) {
        "JPEG 2000".into()
    } else if starts(b"qoif") {
        "QOI".into()
    } else if starts(b"8BPS") {
        "Photoshop PSD".into()
    } else if starts(&[0, 0, 1, 0]) {
        "ICO".into()
    } else if starts(b"\x93NUMPY") {
        "a .npy array".into()
    } else if starts(&[0xFF, 0xD8]) {
        "a JPEG start marker without a segment after it".into()
    } else {
        let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("unknown, first bytes {}", head.join(" "))
    };
    Err(ImageError::Unsupported(what))
}

/// A header-parsed image, ready to decode. Unboxed, though large: it lives on the stack for
/// one image, and a box would be one more allocation per image.
#[allow(clippy::large_enum_variant)]
pub(super) enum Opened<'a> {
    /// Headers read by zune-jpeg.
    Jpeg(JpegDecoder<super::jpeg::JpegInput<'a>>),
    /// Headers read by png; `gray16_clips` marks 16-bit grayscale, which PIL opens as `I;16`
    /// and converts to RGB by clipping at 255 instead of keeping the high byte.
    Png(png::Reader<Cursor<&'a [u8]>>, bool),
    /// Headers read by image-webp.
    Webp(image_webp::WebPDecoder<Cursor<&'a [u8]>>),
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::Corrupt(format!("{what}: {e}"))
}

/// The JPEG error as ours: running out of data is `Truncated`.
fn jpeg_error(e: zune_jpeg::errors::DecodeErrors) -> ImageError {
    let msg = e.to_string();
    let lower = msg.to_ascii_lowercase();
    if ["premature end", "no more bytes", "eof", "end of buffer", "exhausted"].iter().any(|p| lower.contains(p)) {
        ImageError::Truncated(format!("JPEG: {msg}"))
    } else {
        ImageError::Corrupt(format!("JPEG: {msg}"))
    }
}

fn png_error(e: png::DecodingError) -> ImageError {
    match &e {
        png::DecodingError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            ImageError::Truncated(format!("PNG: {e}"))
        }
        png::DecodingError::LimitsExceeded => ImageError::Corrupt(format!(
            "PNG: its metadata (ICC profile, text) takes more than {} MiB; refused as a decompression bomb",
            PNG_METADATA_BYTES >> 20
        )),
        _ => corrupt("PNG", e),
    }
}

fn webp_error(e: image_webp::DecodingError) -> ImageError {
    match &e {
        image_webp::DecodingError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            ImageError::Truncated(format!("WebP: {e}"))
        }
        _ => corrupt("WebP", e),
    }
}

/// What PNG metadata (ICC profile, text chunks) may take, besides the image: PIL's
/// `MAX_TEXT_MEMORY` is 64 MB; an ICC profile is rarely more than a few hundred KB. It bounds
/// the decompression of compressed metadata, which happens before the image's budget is known.
const PNG_METADATA_BYTES: u64 = 16 << 20;

/// Parse headers only, refuse empty images and those over `max_pixels` (counted by the bytes
/// of the codec's output, see [`Header::check`]), and return the decoder with what the headers
/// say. No pixel-sized buffer exists before the check passes. A JPEG decoder draws on `js`'s
/// recycled buffers, and gives them back there when it fails here.
pub(super) fn open<'a>(
    format: Format,
    data: &'a [u8],
    max_pixels: u64,
    js: &mut JpegScratch,
) -> Result<(Opened<'a>, Header), ImageError> {
    match format {
        Format::Jpeg => {
            let mut d = jpeg::decoder(data, js);
            let header = d
                .decode_headers()
                .map_err(jpeg_error)
                .and_then(|()| jpeg_header(&mut d, data))
                .and_then(|h| h.check(max_pixels).map(|()| h));
            match header {
                Ok(h) => Ok((Opened::Jpeg(d), h)),
                Err(e) => {
                    jpeg::recycle(d, js);
                    Err(e)
                }
            }
        }
        Format::Png => {
            // IHDR is the first chunk (signature, length, "IHDR", width, height, bit depth,
            // colour type): read it ourselves so 0x0 is `Empty` and a bomb is `TooLarge` before
            // png sets anything up. A palette's transparency (tRNS) can add alpha; that is
            // known after png has read the chunks before the image, and checked again then.
            let be = |r: std::ops::Range<usize>| data.get(r).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes);
            let ihdr = match (data.get(12..16), be(16..20), be(20..24)) {
                (Some(b"IHDR"), Some(w), Some(h)) => {
                    let channels: u64 = match data.get(25) {
                        Some(2 | 3) => 3,
                        Some(4) => 2,
                        Some(6) => 4,
                        _ => 1,
                    };
                    let sample = if data.get(24) == Some(&16) { 2 } else { 1 };
                    let decoded = (u64::from(w) * u64::from(h)).saturating_mul(channels * sample);
                    Header { width: w, height: h, decoded, raw: decoded, codec: 0 }
                }
                (Some(_), Some(_), Some(_)) => return Err(corrupt("PNG", "the first chunk is not IHDR")),
                _ => return Err(ImageError::Truncated("PNG: ends inside the header".into())),
            };
            ihdr.check(max_pixels)?;
            let mut d = png::Decoder::new(Cursor::new(data));
            // png's limit bounds what it keeps besides the image (metadata, and an output line
            // it reserves for itself); the image is bounded by the checks here.
            let line = u64::from(ihdr.width) * 8;
            d.set_limits(png::Limits { bytes: (PNG_METADATA_BYTES + 2 * line) as usize });
            let gray16 = {
                let info = d.read_header_info().map_err(png_error)?;
                info.color_type == png::ColorType::Grayscale && info.bit_depth == png::BitDepth::Sixteen
            };
            // EXPAND: palettes to RGB(A), 1/2/4-bit gray to 8-bit scaled as PIL does, tRNS to
            // an alpha channel we then drop. 16-bit stays 16-bit: we pick the byte PIL picks.
            d.set_transformations(png::Transformations::EXPAND);
            let r = d.read_info().map_err(png_error)?;
            let too_large = || ImageError::TooLarge {
                width: ihdr.width.into(),
                height: ihdr.height.into(),
                pixels: ihdr.pixels(),
                decoded_bytes: u64::MAX,
                max: max_pixels,
            };
            let decoded = r.output_buffer_size().ok_or_else(too_large)? as u64;
            let line = r.output_line_size(ihdr.width).ok_or_else(too_large)? as u64;
            let metadata = r.info().icc_profile.as_ref().map_or(0, |p| p.len() as u64);
            let header = Header { decoded, raw: decoded, codec: footprint::png_codec(line, metadata), ..ihdr };
            header.check(max_pixels)?;
            Ok((Opened::Png(r, gray16), header))
        }
        Format::Webp => {
            let mut d = image_webp::WebPDecoder::new(Cursor::new(data)).map_err(webp_error)?;
            let (width, height) = d.dimensions();
            let alpha = d.has_alpha();
            let decoded = (u64::from(width) * u64::from(height)).saturating_mul(if alpha { 4 } else { 3 });
            let codec = footprint::webp_codec(width, height, d.is_lossy(), alpha, d.is_animated());
            let header = Header { width, height, decoded, raw: if alpha { decoded } else { 0 }, codec };
            header.check(max_pixels)?;
            Ok((Opened::Webp(d), header))
        }
    }
}

/// What a JPEG's headers say: its size, its output (a byte per component and pixel) and its
/// codec buffers (planes, and coefficients when the scans are buffered).
fn jpeg_header(d: &mut JpegDecoder<super::jpeg::JpegInput<'_>>, data: &[u8]) -> Result<Header, ImageError> {
    let (w, h) = d.dimensions().ok_or_else(|| ImageError::Corrupt("JPEG: no frame header".into()))?;
    let (width, height) = (w as u32, h as u32); // at most 65535 each (JPEG stores u16)
    let progressive = d.info().is_some_and(|i| i.sof.is_progressive());
    let raw = d.raw_output();
    let components = raw.num_components().unwrap_or(0);
    // An array, not a Vec: a warm JPEG decode allocates nothing.
    let mut planes = [(0, 0); 4];
    if let Some(layout) = raw.layout() {
        for (p, l) in planes.iter_mut().zip(layout.iter().take(components)) {
            *p = (l.stride, l.allocated_height);
        }
    }
    drop(raw);
    // Components coded in separate scans are buffered whole, as progressive ones are.
    let buffered = progressive || jpeg::first_scan_components(data) != Some(components);
    let decoded = u64::from(width) * u64::from(height) * components.max(1) as u64;
    Ok(Header { width, height, decoded, raw: 0, codec: footprint::jpeg_codec(&planes[..components.min(4)], buffered) })
}

/// Give back what an opened image holds: a JPEG decoder's buffers serve the thread's next JPEG.
pub(super) fn close(opened: Opened<'_>, js: &mut JpegScratch) {
    if let Opened::Jpeg(d) = opened {
        jpeg::recycle(d, js);
    }
}

/// Decode at least `need` of the image into `pixels` (RGB8, grown as needed), using `raw` for
/// codecs whose native output is not RGB8; returns the rectangle `pixels` holds (`need` where
/// the codec can stop early, else the whole image).
pub(super) fn decode_rgb(
    opened: Opened<'_>,
    data: &[u8],
    header: &Header,
    need: Rect,
    pixels: &mut Vec<u8>,
    raw: &mut Vec<u8>,
    js: &mut JpegScratch,
) -> Result<Rect, ImageError> {
    let (w, h) = (header.width, header.height);
    let n = rgb_len(w, h)?;
    let whole = Rect::whole(w, h);
    match opened {
        Opened::Jpeg(mut d) => {
            let got = match jpeg::decode_region(&mut d, data, need, js, pixels, jpeg_error) {
                Ok(true) => Ok(need),
                Ok(false) => d.decode_into(grow(pixels, n)).map(|()| whole).map_err(jpeg_error),
                Err(e) => Err(e),
            };
            // Success or not, the decoder's buffers serve the thread's next JPEG.
            jpeg::recycle(d, js);
            got
        }
        Opened::Png(mut r, gray16_clips) => {
            // What `open` found png's output to be, and checked.
            let buf = grow(raw, header.raw as usize);
            let info = r.next_frame(buf).map_err(png_error)?;
            let (ct, depth) = (info.color_type, info.bit_depth);
            let channels = match ct {
                png::ColorType::Grayscale => 1,
                png::ColorType::GrayscaleAlpha => 2,
                png::ColorType::Rgb => 3,
                png::ColorType::Rgba => 4,
                png::ColorType::Indexed => return Err(ImageError::Corrupt("PNG: palette was not expanded".into())),
            };
            let bytes = if depth == png::BitDepth::Sixteen { 2 } else { 1 };
            let (line, width) = (info.line_size, w as usize);
            let dst = grow(pixels, n);
            for (src_row, dst_row) in buf.chunks(line.max(1)).zip(dst.chunks_exact_mut(width * 3)) {
                let src_row = src_row.get(..width * channels * bytes).ok_or_else(|| corrupt("PNG", "short row"))?;
                to_rgb_row(src_row, dst_row, channels, bytes, gray16_clips);
            }
            Ok(whole)
        }
        Opened::Webp(mut d) => {
            if d.has_alpha() {
                let size = rgb_len(w, h)?
                    .checked_div(3)
                    .and_then(|p| p.checked_mul(4))
                    .ok_or_else(|| corrupt("WebP", "size"))?;
                let buf = grow(raw, size);
                d.read_image(buf).map_err(webp_error)?;
                for (s, o) in buf.chunks_exact(4).zip(grow(pixels, n).chunks_exact_mut(3)) {
                    o.copy_from_slice(&s[..3]);
                }
            } else {
                d.read_image(grow(pixels, n)).map_err(webp_error)?;
            }
            Ok(whole)
        }
    }
}

/// `w * h * 3`, checked.
pub(super) fn rgb_len(w: u32, h: u32) -> Result<usize, ImageError> {
    (w as usize).checked_mul(h as usize).and_then(|p| p.checked_mul(3)).ok_or(ImageError::TooLarge {
        width: w.into(),
        height: h.into(),
        pixels: u64::from(w) * u64::from(h),
        decoded_bytes: u64::MAX,
        max: usize::MAX as u64 / 3,
    })
}

/// One row of gray/gray+alpha/RGB/RGBA samples (8- or 16-bit big-endian) to RGB8.
fn to_rgb_row(src: &[u8], dst: &mut [u8], channels: usize, bytes: usize, gray16_clips: bool) {
    let px = channels * bytes;
    // PIL keeps the high byte of 16-bit samples (rawmodes `RGB;16B`, `LA;16B`...), except
    // for 16-bit grayscale, opened as `I;16`, whose conversion to RGB clips at 255.
    let sample = |s: &[u8], c: usize| -> u8 {
        if bytes == 1 {
            s[c]
        } else if gray16_clips {
            if s[2 * c] != 0 {
                255
            } else {
                s[2 * c + 1]
            }
        } else {
            s[2 * c]
        }
    };
    for (s, d) in src.chunks_exact(px).zip(dst.chunks_exact_mut(3)) {
        if channels >= 3 {
            d[0] = sample(s, 0);
            d[1] = sample(s, 1);
            d[2] = sample(s, 2);
        } else {
            d.fill(sample(s, 0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniff_names_what_it_refuses() {
        let name = |d: &[u8]| match sniff(d) {
            Err(ImageError::Unsupported(s)) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Ok(Format::Jpeg));
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n...."), Ok(Format::Png));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Ok(Format::Webp));
        assert_eq!(name(b"GIF89a.."), "GIF");
        assert_eq!(name(b"BM......"), "BMP");
        assert_eq!(name(b"II*\0...."), "TIFF");
        assert_eq!(name(b""), "empty data");
        assert_eq!(name(b"RIFF\0\0\0\0WAVEfmt "), "unknown, first bytes 52 49 46 46 00 00 00 00");
    }

    #[test]
    fn sixteen_bit_rows_follow_pil() {
        let mut d = [0u8; 6];
        // RGB16: high bytes.
        to_rgb_row(&[1, 2, 3, 4, 5, 6], &mut d[..3], 3, 2, false);
        assert_eq!(&d[..3], &[1, 3, 5]);
        // Gray16 (I;16): clipped, so 0x00ff -> 255, 0x0107 -> 255, 0x0042 -> 0x42.
        to_rgb_row(&[0, 0x42, 1, 7], &mut d, 1, 2, true);
        assert_eq!(d, [0x42, 0x42, 0x42, 255, 255, 255]);
        // Gray+alpha 8-bit: alpha dropped.
        to_rgb_row(&[9, 0, 7, 255], &mut d, 2, 1, false);
        assert_eq!(d, [9, 9, 9, 7, 7, 7]);
    }
}
