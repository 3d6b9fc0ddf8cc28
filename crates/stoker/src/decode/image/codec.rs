//! Sniff an encoded image and decode it to interleaved RGB8 in a reused buffer.
//!
//! Dimensions are read from the headers first, so an empty image or one over the pixel limit
//! is refused before any pixel buffer is sized for it. Every codec runs in its strict mode:
//! data that ends early is an error, never an image with a gray bottom.

use std::io::Cursor;

use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use super::ImageError;

/// The formats decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Jpeg,
    Png,
    WebP,
}

/// Name the format from the first bytes, or say what they look like.
pub(crate) fn sniff(data: &[u8]) -> Result<Format, ImageError> {
    let starts = |m: &[u8]| data.starts_with(m);
    if starts(&[0xFF, 0xD8, 0xFF]) {
        return Ok(Format::Jpeg);
    }
    if starts(b"\x89PNG\r\n\x1a\n") {
        return Ok(Format::Png);
    }
    if data.len() >= 12 && starts(b"RIFF") && &data[8..12] == b"WEBP" {
        return Ok(Format::WebP);
    }
    let what = if data.is_empty() {
        "empty data".to_string()
    } else if starts(b"GIF87a") || starts(b"GIF89a") {
        "GIF".into()
    } else if starts(b"BM") {
        "BMP".into()
    } else if starts(b"II*\0") || starts(b"MM\0*") {
        "TIFF".into()
    } else if data.len() >= 12 && &data[4..8] == b"ftyp" {
        "an ISO media file (HEIF/AVIF/MP4)".into()
    } else if starts(&[0xFF, 0x0A]) || starts(b"\0\0\0\x0cJXL ") {
        "JPEG XL".into()
    } else {
        let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("unknown, first bytes {}", head.join(" "))
    };
    Err(ImageError::Unsupported(what))
}

/// Refuse empty images and images over the limit, from header dimensions.
pub(crate) fn check_size(width: u64, height: u64, max: u64) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::Empty { width, height });
    }
    let pixels = width.saturating_mul(height);
    if pixels > max {
        return Err(ImageError::TooLarge { width, height, pixels, max });
    }
    Ok(())
}

/// Decode `data` as RGB8 into `rgb` (resized, grow-only), using `raw` for formats that need
/// a conversion pass. Returns `(width, height)`.
pub(crate) fn decode_rgb(
    data: &[u8],
    max_pixels: u64,
    rgb: &mut Vec<u8>,
    raw: &mut Vec<u8>,
) -> Result<(usize, usize), ImageError> {
    match sniff(data)? {
        Format::Jpeg => jpeg(data, max_pixels, rgb),
        Format::Png => png(data, max_pixels, rgb, raw),
        Format::WebP => webp(data, max_pixels, rgb, raw),
    }
}

/// Size `buf` to `len` bytes without shrinking its allocation.
fn sized(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    buf.resize(len, 0);
    &mut buf[..len]
}

fn jpeg(data: &[u8], max_pixels: u64, rgb: &mut Vec<u8>) -> Result<(usize, usize), ImageError> {
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_strict_mode(true)
        .set_max_width(1 << 16)
        .set_max_height(1 << 16);
    let mut d = JpegDecoder::new_with_options(ZCursor::new(data), options);
    d.decode_headers().map_err(jpeg_error)?;
    let info = d.info().ok_or_else(|| ImageError::Corrupt("JPEG headers without image information".into()))?;
    let (w, h) = (usize::from(info.width), usize::from(info.height));
    check_size(w as u64, h as u64, max_pixels)?;
    let len = d.output_buffer_size().ok_or_else(|| ImageError::Corrupt("JPEG output size unknown".into()))?;
    if len != w * h * 3 {
        return Err(ImageError::Corrupt(format!("JPEG decodes to {len} bytes, not {w}x{h} RGB")));
    }
    d.decode_into(sized(rgb, len)).map_err(jpeg_error)?;
    Ok((w, h))
}

fn jpeg_error(e: zune_jpeg::errors::DecodeErrors) -> ImageError {
    let msg = e.to_string();
    let lower = msg.to_ascii_lowercase();
    if lower.contains("eof")
        || lower.contains("end of")
        || lower.contains("no more bytes")
        || lower.contains("exhausted")
    {
        ImageError::Truncated(format!("JPEG: {msg}"))
    } else {
        ImageError::Corrupt(format!("JPEG: {msg}"))
    }
}

fn png(data: &[u8], max_pixels: u64, rgb: &mut Vec<u8>, raw: &mut Vec<u8>) -> Result<(usize, usize), ImageError> {
    let png_err = |e: png::DecodingError| match e {
        png::DecodingError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            ImageError::Truncated(format!("PNG: {io}"))
        }
        other => ImageError::Corrupt(format!("PNG: {other}")),
    };
    let mut d = png::Decoder::new(Cursor::new(data));
    // 8-bit output for every input: palettes and low bit depths expanded, 16-bit cut to its
    // high byte (as PIL's RGB conversion does).
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let info = d.read_header_info().map_err(png_err)?;
    let (w, h) = (info.width as usize, info.height as usize);
    check_size(w as u64, h as u64, max_pixels)?;
    let mut reader = d.read_info().map_err(png_err)?;
    let size = reader.output_buffer_size().ok_or_else(|| ImageError::Corrupt("PNG output size overflows".into()))?;
    let out = reader.next_frame(sized(raw, size)).map_err(png_err)?;
    let channels = match out.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err(ImageError::Corrupt("PNG palette was not expanded".into())),
    };
    let line = out.line_size;
    if line < w * channels || raw.len() < line * h {
        return Err(ImageError::Corrupt(format!("PNG rows of {line} bytes for {w} pixels of {channels} channels")));
    }
    let dst = sized(rgb, w * h * 3);
    for y in 0..h {
        to_rgb(&raw[y * line..y * line + w * channels], channels, &mut dst[y * w * 3..(y + 1) * w * 3]);
    }
    Ok((w, h))
}

fn webp(data: &[u8], max_pixels: u64, rgb: &mut Vec<u8>, raw: &mut Vec<u8>) -> Result<(usize, usize), ImageError> {
    let webp_err = |e: image_webp::DecodingError| match e {
        image_webp::DecodingError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            ImageError::Truncated(format!("WebP: {io}"))
        }
        other => ImageError::Corrupt(format!("WebP: {other}")),
    };
    let mut d = image_webp::WebPDecoder::new(Cursor::new(data)).map_err(webp_err)?;
    let (w, h) = d.dimensions();
    let (w, h) = (w as usize, h as usize);
    check_size(w as u64, h as u64, max_pixels)?;
    let channels = if d.has_alpha() { 4 } else { 3 };
    let size = d.output_buffer_size().ok_or_else(|| ImageError::Corrupt("WebP output size overflows".into()))?;
    if size != w * h * channels {
        return Err(ImageError::Corrupt(format!("WebP decodes to {size} bytes, not {w}x{h}x{channels}")));
    }
    if channels == 3 {
        d.read_image(sized(rgb, size)).map_err(webp_err)?;
        return Ok((w, h));
    }
    d.read_image(sized(raw, size)).map_err(webp_err)?;
    to_rgb(&raw[..size], 4, sized(rgb, w * h * 3));
    Ok((w, h))
}

/// Gray, gray+alpha or RGBA pixels to RGB: gray is replicated, alpha dropped (PIL's
/// `convert("RGB")` does not composite either).
fn to_rgb(src: &[u8], channels: usize, dst: &mut [u8]) {
    match channels {
        3 => dst.copy_from_slice(src),
        1 => dst.chunks_exact_mut(3).zip(src).for_each(|(d, &g)| d.fill(g)),
        2 => dst.chunks_exact_mut(3).zip(src.chunks_exact(2)).for_each(|(d, s)| d.fill(s[0])),
        _ => dst.chunks_exact_mut(3).zip(src.chunks_exact(4)).for_each(|(d, s)| d.copy_from_slice(&s[..3])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_sniffed_and_others_named() {
        assert_eq!(sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Ok(Format::Jpeg));
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\nxxxx"), Ok(Format::Png));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Ok(Format::WebP));
        for (data, name) in [(&b"GIF89a..."[..], "GIF"), (b"BM......", "BMP"), (b"II*\0....", "TIFF"), (b"", "empty")] {
            let e = sniff(data).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
        assert!(sniff(b"\x01\x02garbage").unwrap_err().to_string().contains("01 02"));
    }

    #[test]
    fn sizes_are_checked_before_decoding() {
        assert!(matches!(check_size(0, 5, 100), Err(ImageError::Empty { .. })));
        assert!(matches!(
            check_size(60_000, 60_000, 100_000_000),
            Err(ImageError::TooLarge { pixels: 3_600_000_000, .. })
        ));
        assert!(check_size(10, 10, 100).is_ok());
        assert!(check_size(u64::MAX, u64::MAX, u64::MAX - 1).is_err());
    }

    #[test]
    fn gray_and_alpha_become_rgb() {
        let mut out = [0u8; 6];
        to_rgb(&[7, 9], 1, &mut out);
        assert_eq!(out, [7, 7, 7, 9, 9, 9]);
        to_rgb(&[1, 200, 2, 100], 2, &mut out);
        assert_eq!(out, [1, 1, 1, 2, 2, 2]);
        to_rgb(&[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut out);
        assert_eq!(out, [1, 2, 3, 5, 6, 7]);
    }
}
