//! The resampling and the final write: an antialiased bilinear resize of the source window
//! (PIL's `resize(BILINEAR)`, which torchvision uses, reproduced exactly by resample.rs), then
//! flip, layout and element type.

use half::f16;

use super::super::spec::{Dtype, ImageLayout, ImageSpec};
use super::resample::{Resampler, View};
use super::window::Window;
use super::ImageError;

/// Resize `window` of the RGB8 image `src` (`sw` x `sh`) to `dst` (`dw` x `dh`, RGB8).
///
/// A window flagged `clamp_to_window` is cut out first, so the filter never reads outside it
/// (torchvision crops, then resizes the crop: for its whole-pixel windows these are PIL's
/// bytes exactly); otherwise the window is PIL's `box` on the whole image, whose filter then
/// reaches past the window's edges as a resize of the whole image would.
#[allow(clippy::too_many_arguments)]
pub(super) fn resize(
    resampler: &mut Resampler,
    src: &[u8],
    (sw, sh): (u32, u32),
    window: &Window,
    dst: &mut [u8],
    (dw, dh): (u32, u32),
) -> Result<(), ImageError> {
    let (swf, shf) = (f64::from(sw), f64::from(sh));
    let view = View::new(src, sw as usize, sh as usize)?;
    if [window.left, window.top, window.width, window.height].iter().any(|v| !v.is_finite()) {
        return Err(ImageError::Corrupt(format!("resize: window {window:?}")));
    }
    // Keep the window inside the image whatever rounding did to it.
    let left = window.left.clamp(0.0, swf - 1.0);
    let top = window.top.clamp(0.0, shf - 1.0);
    let width = window.width.min(swf - left).max(f64::MIN_POSITIVE);
    let height = window.height.min(shf - top).max(f64::MIN_POSITIVE);
    let (view, left, top) = if window.clamp_to_window {
        // Whole pixels out, then the fractional rest (if any) as the box inside the cut-out.
        let (l0, t0) = (left.floor(), top.floor());
        let r1 = (left + width).ceil().min(swf);
        let b1 = (top + height).ceil().min(shf);
        let cut = view.crop(l0 as usize, t0 as usize, (r1 - l0) as usize, (b1 - t0) as usize)?;
        (cut, left - l0, top - t0)
    } else {
        (view, left, top)
    };
    // PIL takes the box as C floats; f32 rounding can only land on the image's edge, not past it.
    let (vw, vh) = (view.width() as f32, view.height() as f32);
    let bx = [left as f32, top as f32, ((left + width) as f32).min(vw), ((top + height) as f32).min(vh)];
    resampler.resize(view, bx, dst, (dw as usize, dh as usize))
}

/// Write the resized RGB8 image `img` (`w` x `h`) into `out` per the spec's layout and dtype,
/// mirrored when `flip`: native-endian elements, floats as `x / 255` then `(x - mean) / std`.
///
/// Row by row with the element type fixed per call: a per-element closure choosing layout,
/// flip and type cost as much as a tenth of a whole 224x224 decode.
pub(super) fn write(
    spec: &ImageSpec,
    img: &[u8],
    w: usize,
    h: usize,
    flip: bool,
    out: &mut [u8],
) -> Result<(), ImageError> {
    let n = w * h * 3;
    if w == 0 || img.len() < n || out.len() != n * spec.dtype.size() {
        return Err(ImageError::Corrupt(format!("output buffer of {} bytes for a {w}x{h} image", out.len())));
    }
    let img = &img[..n];
    match spec.dtype {
        Dtype::U8 => emit(spec.layout, w, img, out, flip, |v, _| [v]),
        Dtype::F32 => {
            let lut = float_lut(spec);
            #[cfg(target_arch = "x86_64")]
            if spec.layout == ImageLayout::Chw && x86::chw_f32(spec, &lut, img, w, out, flip) {
                return Ok(());
            }
            emit(spec.layout, w, img, out, flip, |v, c| lut[c][usize::from(v)].to_ne_bytes())
        }
        Dtype::F16 => {
            let lut = float_lut(spec).map(|ch| ch.map(f16::from_f32));
            emit(spec.layout, w, img, out, flip, |v, c| lut[c][usize::from(v)].to_ne_bytes())
        }
        other => return Err(ImageError::Unsupported(format!("output dtype {other} (uint8, float16, float32 are)"))),
    }
    Ok(())
}

/// Write every element of the RGB8 image `img` (`w` pixels a row) into `out` in `layout`'s
/// memory order, mirrored when `flip`, as `elem(value, channel)` (`N` bytes each).
#[inline(always)]
fn emit<const N: usize>(
    layout: ImageLayout,
    w: usize,
    img: &[u8],
    out: &mut [u8],
    flip: bool,
    elem: impl Fn(u8, usize) -> [u8; N],
) {
    let rows = img.chunks_exact(w * 3);
    match layout {
        ImageLayout::Hwc => {
            for (src, dst) in rows.zip(out.chunks_exact_mut(w * 3 * N)) {
                if N == 1 && !flip {
                    // uint8 HWC unflipped is the resized image itself.
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = elem(s, 0)[0];
                    }
                    continue;
                }
                let mut put = |(d, s): (&mut [u8], &[u8])| {
                    for c in 0..3 {
                        d[c * N..(c + 1) * N].copy_from_slice(&elem(s[c], c));
                    }
                };
                let dst = dst.chunks_exact_mut(3 * N);
                if flip {
                    dst.zip(src.chunks_exact(3).rev()).for_each(&mut put);
                } else {
                    dst.zip(src.chunks_exact(3)).for_each(&mut put);
                }
            }
        }
        ImageLayout::Chw => {
            // One read of each pixel, its three channels written to the three planes (a pass
            // per plane read the image three times, with the channel a run-time index).
            let plane = img.len() / 3 * N;
            let (p0, rest) = out.split_at_mut(plane);
            let (p1, p2) = rest.split_at_mut(plane);
            let planes = p0.chunks_exact_mut(w * N).zip(p1.chunks_exact_mut(w * N)).zip(p2.chunks_exact_mut(w * N));
            for (src, ((d0, d1), d2)) in rows.zip(planes) {
                let dst = d0.chunks_exact_mut(N).zip(d1.chunks_exact_mut(N)).zip(d2.chunks_exact_mut(N));
                let put = |a: &mut [u8], b: &mut [u8], c: &mut [u8], s: &[u8]| {
                    a.copy_from_slice(&elem(s[0], 0));
                    b.copy_from_slice(&elem(s[1], 1));
                    c.copy_from_slice(&elem(s[2], 2));
                };
                if flip {
                    for (((a, b), c), s) in dst.zip(src.chunks_exact(3).rev()) {
                        put(a, b, c, s);
                    }
                } else {
                    for (((a, b), c), s) in dst.zip(src.chunks_exact(3)) {
                        put(a, b, c, s);
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

/// Float CHW output computed in registers, 8 pixels at a time, where the CPU has AVX2 and
/// FMA: a table lookup per element cannot be vectorised, and the scalar lookups were a twentieth
/// of a whole augmentation chain's time.
///
/// Exactness is not assumed: `x / 255` and `(x - mean) / std` are each computed as a product
/// with the divisor's reciprocal plus one fused correction step (which gives the correctly
/// rounded quotient for nearly every input), and the result is used only if it equals the
/// table's division, bit for bit, for all 256 values of every channel. Otherwise the caller's
/// table path runs.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::super::spec::ImageSpec;
    use super::super::color::x86::{load, BLOCK};

    /// The constants of the vector formula for one spec.
    #[derive(Clone, Copy, PartialEq)]
    struct Consts {
        /// `(mean, std, 1 / std)` per channel; `None` without normalisation.
        norm: Option<[[f32; 3]; 3]>,
    }

    const R255: f32 = 1.0 / 255.0;

    impl Consts {
        fn of(spec: &ImageSpec) -> Self {
            Consts { norm: spec.normalize.as_ref().map(|n| [n.mean, n.std, n.std.map(|s| 1.0 / s)]) }
        }
    }

    /// A quotient as `q = a * r`, then `q + (a - q * d) * r`, fused.
    #[inline(always)]
    unsafe fn quotient(a: __m256, d: __m256, r: __m256) -> __m256 {
        let q = _mm256_mul_ps(a, r);
        _mm256_fmadd_ps(_mm256_fnmadd_ps(q, d, a), r, q)
    }

    /// The elements of 8 values of channel `c`.
    #[inline(always)]
    unsafe fn element(v: __m256, c: usize, k: &Consts) -> __m256 {
        let x = quotient(v, _mm256_set1_ps(255.0), _mm256_set1_ps(R255));
        match k.norm {
            Some([mean, std, rstd]) => {
                quotient(_mm256_sub_ps(x, _mm256_set1_ps(mean[c])), _mm256_set1_ps(std[c]), _mm256_set1_ps(rstd[c]))
            }
            None => x,
        }
    }

    /// Whether the vector formula gives `lut`, bit for bit, for every value of every channel.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exact(k: &Consts, lut: &[[f32; 256]; 3]) -> bool {
        let mut got = [0f32; 8];
        (0..3).all(|c| {
            (0..256).step_by(8).all(|v0| {
                let v = _mm256_cvtepi32_ps(_mm256_add_epi32(
                    _mm256_set1_epi32(v0 as i32),
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                ));
                // SAFETY: `got` holds 8 floats.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), element(v, c, k)) };
                got.iter().zip(&lut[c][v0..v0 + 8]).all(|(a, b)| a.to_bits() == b.to_bits())
            })
        })
    }

    thread_local! {
        /// The last spec's constants and whether they were exact: checking costs about as
        /// much as writing a tenth of an image, and a loader's specs rarely change.
        static CHECKED: std::cell::Cell<Option<(Consts, bool)>> = const { std::cell::Cell::new(None) };
    }

    /// Write `img` (RGB8, `w` pixels a row) as float32 CHW into `out` (native-endian), mirrored
    /// when `flip`, if this CPU has AVX2 and FMA and the vector formula is exact for `spec`
    /// (`lut` is the table it must equal). False: nothing was written.
    pub(super) fn chw_f32(
        spec: &ImageSpec,
        lut: &[[f32; 256]; 3],
        img: &[u8],
        w: usize,
        out: &mut [u8],
        flip: bool,
    ) -> bool {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return false;
        }
        let k = Consts::of(spec);
        let ok = CHECKED.with(|cell| match cell.get() {
            Some((last, ok)) if last == k => ok,
            _ => {
                // SAFETY: the CPU has AVX2 and FMA, checked above.
                let ok = unsafe { exact(&k, lut) };
                cell.set(Some((k, ok)));
                ok
            }
        });
        if ok {
            // SAFETY: as above.
            unsafe { write(&k, lut, img, w, out, flip) };
        }
        ok
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn write(k: &Consts, lut: &[[f32; 256]; 3], img: &[u8], w: usize, out: &mut [u8], flip: bool) {
        let pixels = img.len() / 3;
        let h = pixels / w;
        // The caller checked: `out` holds 3 planes of `pixels` floats, `img` whole rows.
        let out = &mut out[..pixels * 3 * 4];
        let reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
        for y in 0..h {
            let src = &img[y * w * 3..(y + 1) * w * 3];
            // The float index in `out` of channel `c`'s element for column `pos` of this row.
            let at = |c: usize, pos: usize| (c * pixels + y * w + pos) * 4;
            let blocks = src.chunks_exact(BLOCK);
            let done = blocks.len() * 8;
            for (i, block) in blocks.enumerate() {
                // The colour code's deinterleave: the block's R, G and B as floats.
                let channels = load(block.try_into().expect("chunks_exact gives whole blocks"));
                let pos = if flip { w - i * 8 - 8 } else { i * 8 };
                for (ch, v) in channels.into_iter().enumerate() {
                    let e = element(v, ch, k);
                    let e = if flip { _mm256_permutevar8x32_ps(e, reverse) } else { e };
                    // SAFETY: 8 floats at columns [pos, pos + 8) of the row, inside `out`.
                    unsafe { _mm256_storeu_ps(out[at(ch, pos)..at(ch, pos + 8)].as_mut_ptr().cast(), e) };
                }
            }
            for (px, rgb) in src.chunks_exact(3).enumerate().skip(done) {
                let pos = if flip { w - 1 - px } else { px };
                for (ch, &v) in rgb.iter().enumerate() {
                    out[at(ch, pos)..at(ch, pos) + 4].copy_from_slice(&lut[ch][usize::from(v)].to_ne_bytes());
                }
            }
        }
    }
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
        let chw_plain = run(&spec(ImageLayout::Chw, Dtype::U8, None), false);
        for y in 0..2 {
            for x in 0..3 {
                for c in 0..3 {
                    assert_eq!(hwc_flip[(y * 3 + x) * 3 + c], at(y, 2 - x, c), "flipped y{y} x{x} c{c}");
                    assert_eq!(chw_plain[c * 6 + y * 3 + x], at(y, x, c), "chw y{y} x{x} c{c}");
                }
            }
        }
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
        let flipped = f32s(&run(&spec(ImageLayout::Hwc, Dtype::F32, None), true));
        for (i, &v) in flipped.iter().enumerate() {
            let (y, x, c) = (i / 9, i / 3 % 3, i % 3);
            assert_eq!(v, f32::from(src[(y * 3 + 2 - x) * 3 + c]) / 255.0);
        }
        let halves = run(&spec(ImageLayout::Hwc, Dtype::F16, Some(norm)), false);
        for (i, h) in halves.chunks_exact(2).enumerate() {
            let want = (f32::from(src[i]) / 255.0 - norm.mean[i % 3]) / norm.std[i % 3];
            assert_eq!(f16::from_ne_bytes(h.try_into().unwrap()), f16::from_f32(want));
        }
    }

    /// The vector CHW float writer gives the table's bytes: rows of two 16-pixel blocks and a
    /// tail, both flips, with and without normalisation (ImageNet's and one that is no
    /// multiple of anything).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_float_chw_gives_the_table_bytes() {
        let (w, h) = (37usize, 5usize);
        let img: Vec<u8> = (0..w * h * 3).map(|i| (i * 73 % 256) as u8).collect();
        let norms = [
            None,
            Some(Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }),
            Some(Normalize { mean: [0.5, 0.1234567, 0.9], std: [0.3333333, 1.7, 0.0625] }),
        ];
        let simd = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        for normalize in norms {
            let s = ImageSpec {
                size: [h as u32, w as u32],
                layout: ImageLayout::Chw,
                dtype: Dtype::F32,
                normalize,
                ..Default::default()
            };
            let lut = float_lut(&s);
            for flip in [false, true] {
                let mut want = vec![0; s.out_bytes()];
                emit(s.layout, w, &img, &mut want, flip, |v, c| lut[c][usize::from(v)].to_ne_bytes());
                let mut got = vec![0xAA; s.out_bytes()];
                let ran = x86::chw_f32(&s, &lut, &img, w, &mut got, flip);
                if simd && normalize.is_none() || normalize.is_some_and(|n| n.std[0] == 0.229) {
                    // The formula is exact for these (if it ever is not, the speed-up is gone).
                    assert_eq!(ran, simd, "{normalize:?}");
                }
                if ran {
                    assert!(got == want, "{normalize:?} flip {flip}");
                }
                // Through `write` as the decoder calls it, whichever path it takes.
                let mut through = vec![0; s.out_bytes()];
                write(&s, &img, w, h, flip, &mut through).unwrap();
                assert!(through == want, "{normalize:?} flip {flip}");
            }
        }
    }

    #[test]
    fn resize_at_scale_one_is_the_identity_and_crops_exactly() {
        let mut r = Resampler::new();
        let (w, h) = (7u32, 5u32);
        let src: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0; 3 * 2 * 3];
        for clamp_to_window in [true, false] {
            let win = Window { left: 2.0, top: 1.0, width: 3.0, height: 2.0, clamp_to_window };
            resize(&mut r, &src, (w, h), &win, &mut dst, (3, 2)).unwrap();
            for y in 0..2 {
                for x in 0..3 {
                    let s = ((y + 1) * w as usize + x + 2) * 3;
                    assert_eq!(&dst[(y * 3 + x) * 3..][..3], &src[s..s + 3]);
                }
            }
        }
    }

    #[test]
    fn clamped_windows_read_only_inside_unclamped_ones_reach_out() {
        let mut r = Resampler::new();
        // Bright outside a dark 4x4 middle: a clamped window sees only the middle.
        let (w, h) = (8u32, 8u32);
        let src: Vec<u8> = (0..w * h)
            .flat_map(|p| if (2..6).contains(&(p % w)) && (2..6).contains(&(p / w)) { [0; 3] } else { [255; 3] })
            .collect();
        let mut dst = vec![0; 2 * 2 * 3];
        let win = Window { left: 2.0, top: 2.0, width: 4.0, height: 4.0, clamp_to_window: true };
        resize(&mut r, &src, (w, h), &win, &mut dst, (2, 2)).unwrap();
        assert!(dst.iter().all(|&v| v == 0), "{dst:?}");
        resize(&mut r, &src, (w, h), &Window { clamp_to_window: false, ..win }, &mut dst, (2, 2)).unwrap();
        assert!(dst.iter().all(|&v| v > 0), "{dst:?}");
    }

    #[test]
    fn bad_sizes_and_windows_are_errors() {
        let mut r = Resampler::new();
        let src = vec![0u8; 4 * 4 * 3];
        let mut dst = vec![0; 2 * 2 * 3];
        let win = Window { left: 0.0, top: 0.0, width: 4.0, height: 4.0, clamp_to_window: true };
        assert!(resize(&mut r, &src, (0, 4), &win, &mut dst, (2, 2)).is_err());
        assert!(resize(&mut r, &src, (4, 5), &win, &mut dst, (2, 2)).is_err());
        assert!(resize(&mut r, &src, (4, 4), &win, &mut dst, (2, 3)).is_err());
        let nan = Window { left: f64::NAN, ..win };
        assert!(resize(&mut r, &src, (4, 4), &nan, &mut dst, (2, 2)).is_err());
        // Out-of-image windows are pulled inside, as before.
        let far = Window { left: 10.0, top: -3.0, width: 40.0, height: 2.0, clamp_to_window: false };
        resize(&mut r, &src, (4, 4), &far, &mut dst, (2, 2)).unwrap();
    }
}
