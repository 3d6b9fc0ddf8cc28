//! The resampling and the final write: an antialiased bilinear resize of the source window
//! (PIL's `resize(BILINEAR)`, which torchvision uses), then flip, layout and element type.

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use half::f16;

use super::super::spec::{Dtype, ImageLayout, ImageSpec};
use super::window::Window;
use super::ImageError;

/// Resize `window` of the RGB8 image `src` (`sw` x `sh`) to `dst` (`dw` x `dh`, RGB8).
///
/// A window flagged `clamp_to_window` is cut out first, so the filter never reads outside it
/// (torchvision crops, then resizes the crop); otherwise the crop is given to the resizer,
/// whose filter then reaches past the window's edges as a resize of the whole image would.
#[allow(clippy::too_many_arguments)]
pub fn resize(
    resizer: &mut Resizer,
    src: &[u8],
    (sw, sh): (u32, u32),
    window: &Window,
    dst: &mut [u8],
    (dw, dh): (u32, u32),
) -> Result<(), ImageError> {
    let fail = |e: &dyn std::fmt::Display| ImageError::Corrupt(format!("resize: {e}"));
    let src = ImageRef::new(sw, sh, src, PixelType::U8x3).map_err(|e| fail(&e))?;
    let mut dst = Image::from_slice_u8(dw, dh, dst, PixelType::U8x3).map_err(|e| fail(&e))?;
    let alg = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    // Keep the window inside the image whatever rounding did to it.
    let left = window.left.clamp(0.0, f64::from(sw) - 1.0);
    let top = window.top.clamp(0.0, f64::from(sh) - 1.0);
    let width = window.width.min(f64::from(sw) - left).max(f64::MIN_POSITIVE);
    let height = window.height.min(f64::from(sh) - top).max(f64::MIN_POSITIVE);
    if window.clamp_to_window {
        // Whole pixels out, then the fractional rest (if any) inside the cut-out.
        let (l0, t0) = (left.floor(), top.floor());
        let r1 = (left + width).ceil().min(f64::from(sw));
        let b1 = (top + height).ceil().min(f64::from(sh));
        let cut =
            CroppedImage::new(&src, l0 as u32, t0 as u32, (r1 - l0) as u32, (b1 - t0) as u32).map_err(|e| fail(&e))?;
        let opts = alg.crop(left - l0, top - t0, width, height);
        resizer.resize(&cut, &mut dst, &opts).map_err(|e| fail(&e))
    } else {
        let opts = alg.crop(left, top, width, height);
        resizer.resize(&src, &mut dst, &opts).map_err(|e| fail(&e))
    }
}

/// Write the resized RGB8 image `img` (`w` x `h`) into `out` per the spec's layout and dtype,
/// mirrored when `flip`: native-endian elements, floats as `x / 255` then `(x - mean) / std`.
pub fn write(spec: &ImageSpec, img: &[u8], w: usize, h: usize, flip: bool, out: &mut [u8]) -> Result<(), ImageError> {
    let n = w * h * 3;
    if img.len() < n || out.len() != n * spec.dtype.size() {
        return Err(ImageError::Corrupt(format!("output buffer of {} bytes for a {w}x{h} image", out.len())));
    }
    // Source index of output element (y, x, c), whichever order we write in.
    let src_x = |x: usize| if flip { w - 1 - x } else { x };
    match spec.dtype {
        Dtype::U8 => emit(spec.layout, w, h, out, 1, |y, x, c, o| o[0] = img[(y * w + src_x(x)) * 3 + c]),
        Dtype::F32 => {
            let lut = float_lut(spec);
            emit(spec.layout, w, h, out, 4, |y, x, c, o| {
                o.copy_from_slice(&lut[c][usize::from(img[(y * w + src_x(x)) * 3 + c])].to_ne_bytes())
            })
        }
        Dtype::F16 => {
            let lut = float_lut(spec).map(|ch| ch.map(f16::from_f32));
            emit(spec.layout, w, h, out, 2, |y, x, c, o| {
                o.copy_from_slice(&lut[c][usize::from(img[(y * w + src_x(x)) * 3 + c])].to_ne_bytes())
            })
        }
        other => return Err(ImageError::Unsupported(format!("output dtype {other} (uint8, float16, float32 are)"))),
    }
    Ok(())
}

/// Call `put(y, x, c, element)` for every element of `out` in memory order of `layout`.
#[inline(always)]
fn emit(
    layout: ImageLayout,
    w: usize,
    h: usize,
    out: &mut [u8],
    size: usize,
    mut put: impl FnMut(usize, usize, usize, &mut [u8]),
) {
    let mut elems = out.chunks_exact_mut(size);
    match layout {
        ImageLayout::Hwc => {
            for y in 0..h {
                for x in 0..w {
                    for c in 0..3 {
                        if let Some(o) = elems.next() {
                            put(y, x, c, o);
                        }
                    }
                }
            }
        }
        ImageLayout::Chw => {
            for c in 0..3 {
                for y in 0..h {
                    for x in 0..w {
                        if let Some(o) = elems.next() {
                            put(y, x, c, o);
                        }
                    }
                }
            }
        }
    }
}

/// Every 8-bit value's float per channel, computed as torchvision does in float32:
/// `ToTensor` (`x / 255`), then `Normalize` (`(x - mean) / std`).
fn float_lut(spec: &ImageSpec) -> [[f32; 256]; 3] {
    let mut lut = [[0f32; 256]; 3];
    for (c, ch) in lut.iter_mut().enumerate() {
        for (v, e) in ch.iter_mut().enumerate() {
            let x = v as f32 / 255.0;
            *e = match &spec.normalize {
                Some(n) => (x - n.mean[c]) / n.std[c],
                None => x,
            };
        }
    }
    lut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::spec::Normalize;

    /// A 3x2 image whose every element is distinct: value = 10 * (y * 3 + x) + c.
    fn img() -> Vec<u8> {
        (0..2).flat_map(|y| (0..3).flat_map(move |x| (0..3).map(move |c| (10 * (y * 3 + x) + c) as u8))).collect()
    }

    fn spec(layout: ImageLayout, dtype: Dtype, normalize: Option<Normalize>) -> ImageSpec {
        ImageSpec { size: [2, 3], layout, dtype, normalize, ..Default::default() }
    }

    fn run(s: &ImageSpec, flip: bool) -> Vec<u8> {
        let mut out = vec![0; s.out_bytes()];
        write(s, &img(), 3, 2, flip, &mut out).unwrap();
        out
    }

    #[test]
    fn layouts_and_flip_place_every_element() {
        let src = img();
        let at = |y: usize, x: usize, c: usize| src[(y * 3 + x) * 3 + c];
        let hwc = run(&spec(ImageLayout::Hwc, Dtype::U8, None), false);
        assert_eq!(hwc, src);
        let chw = run(&spec(ImageLayout::Chw, Dtype::U8, None), true);
        for c in 0..3 {
            for y in 0..2 {
                for x in 0..3 {
                    assert_eq!(chw[c * 6 + y * 3 + x], at(y, 2 - x, c), "c{c} y{y} x{x}");
                }
            }
        }
        let hwc_flip = run(&spec(ImageLayout::Hwc, Dtype::U8, None), true);
        assert_eq!(&hwc_flip[..3], &[20, 21, 22]);
        assert_eq!(&hwc_flip[6..9], &[0, 1, 2]);
    }

    #[test]
    fn floats_scale_and_normalize_like_torchvision() {
        let norm = Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] };
        let f32s = |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        let plain = f32s(&run(&spec(ImageLayout::Hwc, Dtype::F32, None), false));
        let normed = f32s(&run(&spec(ImageLayout::Chw, Dtype::F32, Some(norm)), false));
        let src = img();
        for (i, &v) in src.iter().enumerate() {
            assert_eq!(plain[i], f32::from(v) / 255.0);
            let (pix, c) = (i / 3, i % 3);
            assert_eq!(normed[c * 6 + pix], (f32::from(v) / 255.0 - norm.mean[c]) / norm.std[c]);
        }
        let halves = run(&spec(ImageLayout::Hwc, Dtype::F16, Some(norm)), false);
        for (i, h) in halves.chunks_exact(2).enumerate() {
            let want = (f32::from(src[i]) / 255.0 - norm.mean[i % 3]) / norm.std[i % 3];
            assert_eq!(f16::from_ne_bytes(h.try_into().unwrap()), f16::from_f32(want));
        }
    }

    #[test]
    fn resize_at_scale_one_is_the_identity_and_crops_exactly() {
        let mut r = Resizer::new();
        let (w, h) = (7u32, 5u32);
        let src: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0; 3 * 2 * 3];
        let win = Window { left: 2.0, top: 1.0, width: 3.0, height: 2.0, clamp_to_window: true };
        resize(&mut r, &src, (w, h), &win, &mut dst, (3, 2)).unwrap();
        for y in 0..2 {
            for x in 0..3 {
                let s = ((y + 1) * w as usize + x + 2) * 3;
                assert_eq!(&dst[(y * 3 + x) * 3..][..3], &src[s..s + 3]);
            }
        }
    }
}
