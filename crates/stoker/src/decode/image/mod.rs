//! Images: sniff the codec, decode to RGB, choose the window (torchvision's rules), resize
//! with antialiasing (PIL's bilinear), flip, convert, write the output slot.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::rng::SampleRng;
use super::spec::{Dtype, ImageLayout, ImageSpec};

mod codec;
mod geometry;

pub use geometry::{window, Window};

/// Why an image could not be decoded. The loader adds the sample key, field and source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// Not a format we decode; names what the first bytes look like.
    #[error("unsupported image format ({0}); JPEG, PNG and WebP are decoded")]
    Unsupported(String),
    /// The data ends before the image does.
    #[error("truncated image: {0}")]
    Truncated(String),
    /// The codec refused the data.
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// Width or height is zero.
    #[error("empty image ({width}x{height})")]
    Empty {
        /// Width in pixels.
        width: u64,
        /// Height in pixels.
        height: u64,
    },
    /// More pixels than `max_pixels` (a decompression bomb, or a spec that needs raising).
    #[error("image of {width}x{height} = {pixels} pixels exceeds max_pixels={max}")]
    TooLarge {
        /// Width in pixels.
        width: u64,
        /// Height in pixels.
        height: u64,
        /// width * height.
        pixels: u64,
        /// The limit in force.
        max: u64,
    },
}

/// Buffers one thread reuses from image to image (they only grow).
#[derive(Default)]
pub struct ImageScratch {
    /// The decoded image, RGB8.
    rgb: Vec<u8>,
    /// Codec output before conversion to RGB (PNG, WebP with alpha).
    raw: Vec<u8>,
    /// The resized window, RGB8, before flip and conversion.
    resized: Vec<u8>,
    resizer: Resizer,
}

impl std::fmt::Debug for ImageScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageScratch").field("rgb", &self.rgb.capacity()).field("raw", &self.raw.capacity()).finish()
    }
}

/// Decode `data` per `spec` into `out` (exactly `spec.out_bytes()` bytes, native-endian
/// elements), drawing the window and flip from `rng`.
pub fn decode_image(
    spec: &ImageSpec,
    data: &[u8],
    rng: &mut SampleRng,
    scratch: &mut ImageScratch,
    out: &mut [u8],
) -> Result<(), ImageError> {
    let (w, h) = codec::decode_rgb(data, spec.max_pixels, &mut scratch.rgb, &mut scratch.raw)?;
    let win = window(spec, w, h, rng);
    let [oh, ow] = spec.size;
    let resized_len = oh as usize * ow as usize * 3;
    scratch.resized.resize(resized_len, 0);
    let src = ImageRef::new(w as u32, h as u32, &scratch.rgb[..w * h * 3], PixelType::U8x3)
        .map_err(|e| ImageError::Corrupt(format!("decoded buffer: {e}")))?;
    let mut dst = Image::from_slice_u8(ow, oh, &mut scratch.resized[..resized_len], PixelType::U8x3)
        .map_err(|e| ImageError::Corrupt(format!("output buffer: {e}")))?;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(win.left, win.top, win.width, win.height);
    scratch
        .resizer
        .resize(&src, &mut dst, &options)
        .map_err(|e| ImageError::Corrupt(format!("resize of a {w}x{h} image to {ow}x{oh}: {e}")))?;
    write_output(spec, &scratch.resized[..resized_len], win.flip, out);
    Ok(())
}

/// `rgb` (`size` HWC, u8) into `out` per the spec's flip, layout and element type.
fn write_output(spec: &ImageSpec, rgb: &[u8], flip: bool, out: &mut [u8]) {
    let (h, w) = (spec.size[0] as usize, spec.size[1] as usize);
    if spec.dtype == Dtype::U8 && spec.layout == ImageLayout::Hwc && !flip {
        out.copy_from_slice(rgb);
        return;
    }
    // Per channel, x -> x * scale + offset: /255, then (- mean) / std.
    let (mut scale, mut offset) = ([1.0f32 / 255.0; 3], [0.0f32; 3]);
    if let Some(n) = &spec.normalize {
        for c in 0..3 {
            scale[c] /= n.std[c];
            offset[c] = -n.mean[c] / n.std[c];
        }
    }
    let size = spec.dtype.size();
    for y in 0..h {
        for x in 0..w {
            let sx = if flip { w - 1 - x } else { x };
            for c in 0..3 {
                let v = rgb[(y * w + sx) * 3 + c];
                let at = match spec.layout {
                    ImageLayout::Hwc => (y * w + x) * 3 + c,
                    ImageLayout::Chw => c * h * w + y * w + x,
                } * size;
                let slot = &mut out[at..at + size];
                match spec.dtype {
                    Dtype::F32 => slot.copy_from_slice(&(f32::from(v) * scale[c] + offset[c]).to_ne_bytes()),
                    Dtype::F16 => {
                        slot.copy_from_slice(&half::f16::from_f32(f32::from(v) * scale[c] + offset[c]).to_ne_bytes())
                    }
                    // Validated: images are uint8, float16 or float32.
                    _ => slot[0] = v,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::spec::{Crop, Normalize};

    fn png_bytes(w: u32, h: u32, px: &[u8], color: png::ColorType, depth: png::BitDepth) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        enc.write_header().unwrap().write_image_data(px).unwrap();
        out
    }

    fn gradient(w: u32, h: u32) -> Vec<u8> {
        (0..w * h).flat_map(|p| [(p % w * 255 / w) as u8, (p / w * 255 / h) as u8, 77]).collect()
    }

    fn run(spec: &ImageSpec, data: &[u8]) -> Result<Vec<u8>, ImageError> {
        let mut out = vec![0u8; spec.out_bytes()];
        decode_image(spec, data, &mut SampleRng::new(0, 0, 0), &mut ImageScratch::default(), &mut out)?;
        Ok(out)
    }

    #[test]
    fn png_round_trips_exactly_at_its_own_size() {
        let px = gradient(16, 9);
        let data = png_bytes(16, 9, &px, png::ColorType::Rgb, png::BitDepth::Eight);
        let spec = ImageSpec { size: [9, 16], crop: Crop::Squash, ..ImageSpec::default() };
        assert_eq!(run(&spec, &data).unwrap(), px);
        // Gray and gray+alpha replicate the gray; 16-bit keeps the high byte.
        let gray = png_bytes(2, 1, &[10, 200], png::ColorType::Grayscale, png::BitDepth::Eight);
        let s = ImageSpec { size: [1, 2], crop: Crop::Squash, ..ImageSpec::default() };
        assert_eq!(run(&s, &gray).unwrap(), [10, 10, 10, 200, 200, 200]);
        let deep = png_bytes(1, 1, &[0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc], png::ColorType::Rgb, png::BitDepth::Sixteen);
        let s = ImageSpec { size: [1, 1], crop: Crop::Squash, ..ImageSpec::default() };
        assert_eq!(run(&s, &deep).unwrap(), [0x12, 0x56, 0x9a]);
    }

    #[test]
    fn flip_layout_and_float_outputs_agree_with_the_u8_image() {
        let data = png_bytes(40, 30, &gradient(40, 30), png::ColorType::Rgb, png::BitDepth::Eight);
        let base = ImageSpec { size: [8, 10], crop: Crop::Center { resize: None }, ..ImageSpec::default() };
        let u8s = run(&base, &data).unwrap();
        let flipped = run(&ImageSpec { flip: 1.0, ..base.clone() }, &data).unwrap();
        for y in 0..8 {
            for x in 0..10 {
                assert_eq!(flipped[(y * 10 + x) * 3..][..3], u8s[(y * 10 + 9 - x) * 3..][..3]);
            }
        }
        let chw = run(&ImageSpec { layout: ImageLayout::Chw, ..base.clone() }, &data).unwrap();
        for c in 0..3 {
            for p in 0..80 {
                assert_eq!(chw[c * 80 + p], u8s[p * 3 + c]);
            }
        }
        let n = Normalize { mean: [0.5, 0.4, 0.3], std: [0.2, 0.25, 0.5] };
        let f = run(&ImageSpec { dtype: Dtype::F32, normalize: Some(n), ..base.clone() }, &data).unwrap();
        for (i, chunk) in f.chunks_exact(4).enumerate() {
            let v = f32::from_ne_bytes(chunk.try_into().unwrap());
            let c = i % 3;
            let want = (f32::from(u8s[i]) / 255.0 - n.mean[c]) / n.std[c];
            assert!((v - want).abs() < 1e-5, "{v} vs {want}");
        }
        let h = run(&ImageSpec { dtype: Dtype::F16, ..base }, &data).unwrap();
        for (i, chunk) in h.chunks_exact(2).enumerate() {
            let v = half::f16::from_ne_bytes(chunk.try_into().unwrap()).to_f32();
            assert!((v - f32::from(u8s[i]) / 255.0).abs() < 2e-3);
        }
    }

    #[test]
    fn bad_data_is_an_error_never_pixels() {
        let data = png_bytes(40, 30, &gradient(40, 30), png::ColorType::Rgb, png::BitDepth::Eight);
        let spec = ImageSpec { size: [8, 8], ..ImageSpec::default() };
        for cut in [8, 20, 33, data.len() / 2, data.len() - 13] {
            assert!(run(&spec, &data[..cut]).is_err(), "PNG cut at {cut} of {} decoded", data.len());
        }
        let tiny = ImageSpec { max_pixels: 100, ..spec.clone() };
        assert!(matches!(run(&tiny, &data), Err(ImageError::TooLarge { pixels: 1200, max: 100, .. })));
        assert!(matches!(run(&spec, b"GIF89a...."), Err(ImageError::Unsupported(_))));
    }
}
