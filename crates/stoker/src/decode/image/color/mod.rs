//! Colour augmentation on the resized RGB8 image, with torchvision's semantics (its
//! `transforms.v2` tensor kernels on `uint8` images, step by step, in `f32` as torch computes):
//!
//! - `ColorJitter(brightness, contrast, saturation, hue)`: factors drawn uniformly from
//!   `[max(0, 1 - b), 1 + b]` (and `[-h, h]` for hue), applied in a random order of the four, a
//!   zero argument leaving its operation out, as `ColorJitter.get_params` does;
//!   - brightness: `x * f`, clamped to 0..=255 and truncated to `uint8`;
//!   - contrast: blended with the mean of the image's grayscale (`0.2989 R + 0.587 G + 0.114 B`,
//!     floored) with weight `f`: `f * x + (1 - f) * mean`, clamped and truncated;
//!   - saturation: blended with each pixel's floored grayscale the same way;
//!   - hue: to `[0, 1]` floats (`x * (1/255)`), to HSV, `h = (h + f) mod 1`, back to RGB, and
//!     to `uint8` as `trunc(x * 255.999)`;
//! - `RandomGrayscale(p)`: with probability `p`, every channel becomes the pixel's grayscale
//!   (`0.2989 R + 0.587 G + 0.114 B`, truncated).
//!
//! The draws come after the crop's and the flip's from the same per-sample stream, so a spec
//! without colour operations gives the same crops as before, and the result depends only on
//! `(seed, epoch, index)`.

#[cfg(target_arch = "x86_64")]
mod x86;

use super::super::rng::SampleRng;
use super::super::spec::ColorJitter;

/// One colour operation with its factor (torchvision's `adjust_*` argument).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ColorOp {
    /// `adjust_brightness(img, f)`.
    Brightness(f32),
    /// `adjust_contrast(img, f)`.
    Contrast(f32),
    /// `adjust_saturation(img, f)`.
    Saturation(f32),
    /// `adjust_hue(img, f)`, `f` in `[-0.5, 0.5]` of a turn.
    Hue(f32),
    /// `rgb_to_grayscale(img, num_output_channels=3)`.
    Grayscale,
}

use ColorOp as Op;

/// The operations one sample gets, in order, drawn from its stream: the jitter's four in a
/// random order (those with a non-zero amount), then grayscale with probability `gray`.
pub(crate) fn draw(jitter: Option<&ColorJitter>, gray: f32, rng: &mut SampleRng) -> Vec<Op> {
    let mut ops = Vec::new();
    if let Some(j) = jitter {
        // A random permutation of the four (Fisher-Yates), then each factor, as get_params
        // draws the order first and the factors after.
        let mut order = [0usize, 1, 2, 3];
        for i in (1..4).rev() {
            order.swap(i, rng.int_inclusive(0, i as u64) as usize);
        }
        let factor =
            |rng: &mut SampleRng, a: f32| rng.uniform(f64::from((1.0 - a).max(0.0)), f64::from(1.0 + a)) as f32;
        let b = (j.brightness > 0.0).then(|| factor(rng, j.brightness));
        let c = (j.contrast > 0.0).then(|| factor(rng, j.contrast));
        let s = (j.saturation > 0.0).then(|| factor(rng, j.saturation));
        let h = (j.hue > 0.0).then(|| rng.uniform(-f64::from(j.hue), f64::from(j.hue)) as f32);
        for k in order {
            let op = match k {
                0 => b.map(Op::Brightness),
                1 => c.map(Op::Contrast),
                2 => s.map(Op::Saturation),
                _ => h.map(Op::Hue),
            };
            ops.extend(op);
        }
    }
    if gray > 0.0 && rng.unit() < f64::from(gray) {
        ops.push(Op::Grayscale);
    }
    ops
}

/// Apply `ops` in order to the RGB8 pixels `img` (interleaved, any size), as the decode
/// threads do after the resize.
pub fn apply(img: &mut [u8], ops: &[ColorOp]) {
    apply_with(img, ops, Path::detect());
}

/// Which code does the leading part of each operation (as the resampler's `Kernel`): the
/// AVX2 blocks where the CPU has them, the scalar code the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// The scalar code does everything.
    Scalar,
    /// Made only by [`Path::detect`] on a CPU with AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Path {
    /// The fastest path this CPU runs.
    fn detect() -> Path {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            return Path::Avx2;
        }
        Path::Scalar
    }

    /// Whole 8-pixel blocks of a per-pixel operation: the bytes done and, for contrast (which
    /// it only reads), the sum of their floored grayscale.
    fn blocks(self, img: &mut [u8], op: ColorOp) -> (usize, u64) {
        match self {
            Path::Scalar => (0, 0),
            // SAFETY: `Avx2` is made only where the CPU has AVX2 (`detect`).
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { x86::blocks(img, op) },
        }
    }

    /// `x * mul + add` on each leading byte, clamped and truncated (brightness, contrast's
    /// blend): the bytes done.
    fn values(self, img: &mut [u8], mul: f32, add: f32) -> usize {
        match self {
            Path::Scalar => 0,
            // SAFETY: as in `blocks`.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { x86::values(img, mul, add) },
        }
    }
}

/// [`apply`] with the leading part of each operation done by `path`; the scalar code does the
/// rest, the same operations in the same order.
fn apply_with(img: &mut [u8], ops: &[ColorOp], path: Path) {
    let pixels = img.len() / 3 * 3;
    for &op in ops {
        let (done, sum) = path.blocks(&mut img[..pixels], op);
        let rest = &mut img[done..pixels];
        match op {
            Op::Brightness(f) => values(img, f, 0.0, path),
            Op::Contrast(f) => {
                // torch sums the floored grayscale in f32 (pairwise); an integer sum keeps the
                // mean exact, in any order.
                let sum = sum + rest.chunks_exact(3).map(|p| u64::from(floor_gray(p) as u32)).sum::<u64>();
                let mean = (sum as f64 / (pixels / 3).max(1) as f64) as f32;
                values(img, f, mean * (1.0 - f), path);
            }
            Op::Saturation(f) => {
                for p in rest.chunks_exact_mut(3) {
                    let g = floor_gray(p);
                    p.iter_mut().for_each(|x| *x = blend(*x, g, f));
                }
            }
            Op::Hue(f) => rest.chunks_exact_mut(3).for_each(|p| hue(p, f)),
            Op::Grayscale => {
                for p in rest.chunks_exact_mut(3) {
                    let g = to_u8(gray_f32(p));
                    p.fill(g);
                }
            }
        }
    }
}

/// Every byte `x` becomes `x * mul + add`, clamped and truncated: brightness (`add` zero,
/// where `x * f + 0` is `x * f`) and contrast's blend with the mean (torchvision's `f * x +
/// (1 - f) * mean`). The vector code takes the leading bytes, a 256-entry table the rest.
fn values(img: &mut [u8], mul: f32, add: f32, path: Path) {
    let done = path.values(img, mul, add);
    lookup(&mut img[done..], |x| to_u8(x * mul + add));
}

/// Replace every byte `x` of `img` by `f(x as f32)`, computed once per value.
fn lookup(img: &mut [u8], f: impl Fn(f32) -> u8) {
    let table: [u8; 256] = std::array::from_fn(|x| f(x as f32));
    img.iter_mut().for_each(|x| *x = table[usize::from(*x)]);
}

/// torchvision's grayscale, in its order of f32 operations.
fn gray_f32(p: &[u8]) -> f32 {
    f32::from(p[0]) * 0.2989 + f32::from(p[1]) * 0.587 + f32::from(p[2]) * 0.114
}

/// The grayscale floored, as torchvision floors it for uint8 images. It lies in 0..=255, where
/// truncation is the floor: a cast, not a call to `floorf` (no SSE4.1 rounding instruction in
/// the baseline x86-64 target, and this runs for every pixel).
fn floor_gray(p: &[u8]) -> f32 {
    gray_f32(p) as u32 as f32
}

/// `f * x + (1 - f) * other`, clamped and truncated (torchvision's `_blend` on uint8).
fn blend(x: u8, other: f32, f: f32) -> u8 {
    to_u8(f32::from(x) * f + other * (1.0 - f))
}

/// Clamped to 0..=255 and truncated, as torch's `.clamp_(0, 255).to(torch.uint8)` (`max`/`min`
/// rather than `clamp`, whose NaN rule costs branches; the values here are never NaN).
#[allow(clippy::manual_clamp)] // clamp's NaN rule is what this avoids
fn to_u8(v: f32) -> u8 {
    v.max(0.0).min(255.0) as u8
}

/// One pixel's hue turned by `f` (torchvision's `_rgb_to_hsv`, shift, `_hsv_to_rgb`).
fn hue(p: &mut [u8], f: f32) {
    let [r, g, b] = [p[0], p[1], p[2]].map(|x| f32::from(x) * (1.0 / 255.0));
    let (maxc, minc) = (r.max(g).max(b), r.min(g).min(b));
    let eqc = maxc == minc;
    let range = maxc - minc;
    let s = range / if eqc { 1.0 } else { maxc };
    let div = if eqc { 1.0 } else { range };
    let (rc, gc, bc) = ((maxc - r) / div, (maxc - g) / div, (maxc - b) / div);
    let h = if maxc == r {
        bc - gc
    } else if maxc == g {
        2.0 + rc - bc
    } else {
        4.0 + gc - rc
    };
    // torch's `fmod(h / 6 + 1, 1)`, then `remainder(h + f, 1)`, by branches: `h / 6 + 1` lies in
    // [5/6, 11/6) and `h + f` in [-0.5, 1.5), where these are the same exact operations
    // (`fmodf` and `floorf` are library calls here, and this runs for every pixel).
    let h = h * (1.0 / 6.0) + 1.0;
    let h = if h >= 1.0 { h - 1.0 } else { h } + f;
    let h = if h < 0.0 {
        h + 1.0
    } else if h >= 1.0 {
        h - 1.0
    } else {
        h
    };
    let v = maxc;
    let h6 = h * 6.0;
    // h6 lies in [0, 6]: truncation is the floor.
    let i = h6 as i32 as f32;
    let fr = h6 - i;
    let sxf = s * fr;
    #[allow(clippy::manual_clamp)] // as in `to_u8`
    let unit = |x: f32| x.max(0.0).min(1.0);
    let q = unit((1.0 - sxf) * v);
    let t = unit((sxf + (1.0 - s)) * v);
    let pp = unit((1.0 - s) * v);
    let (r, g, b) = match (i as i32) % 6 {
        0 => (v, t, pp),
        1 => (q, v, pp),
        2 => (pp, v, t),
        3 => (pp, q, v),
        4 => (t, pp, v),
        _ => (v, pp, q),
    };
    for (d, x) in p.iter_mut().zip([r, g, b]) {
        *d = (x * 255.999) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Vec<u8> {
        (0..64 * 3).map(|i| ((i * 37 + i / 3 * 11) % 256) as u8).collect()
    }

    #[test]
    fn vector_code_gives_the_scalar_code_bytes() {
        // A spread of the 2^24 colours (a stride prime to 256 visits every value of each
        // channel), in an image whose length is not a whole number of 8-pixel blocks.
        let img: Vec<u8> = (0..(1u32 << 24)).step_by(97).flat_map(|c| c.to_le_bytes()[..3].to_vec()).collect();
        assert_ne!(img.len() / 3 % 8, 0);
        for op in [
            Op::Hue(0.07),
            Op::Hue(-0.5),
            Op::Hue(0.5),
            Op::Hue(-0.013),
            Op::Hue(0.0),
            Op::Saturation(0.0),
            Op::Saturation(0.8),
            Op::Saturation(1.93),
            Op::Contrast(0.7),
            Op::Contrast(1.6),
            Op::Brightness(0.83),
            Op::Brightness(1.4),
            Op::Grayscale,
        ] {
            let mut want = img.clone();
            apply_with(&mut want, &[op], Path::Scalar);
            let mut got = img.clone();
            apply(&mut got, &[op]);
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(first.map(|i| &img[i / 3 * 3..i / 3 * 3 + 3]), None, "{op:?}: the first pixel that differs");
        }
    }

    #[test]
    fn neutral_factors_leave_the_image_and_grayscale_is_gray() {
        let img = image();
        for op in [Op::Brightness(1.0), Op::Saturation(1.0), Op::Contrast(1.0)] {
            let mut out = img.clone();
            apply(&mut out, &[op]);
            assert_eq!(out, img, "{op:?}");
        }
        let mut out = img.clone();
        apply(&mut out, &[Op::Hue(0.0)]);
        let worst = out.iter().zip(&img).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        assert!(worst <= 1, "a zero hue turn is at most a rounding off: {worst}");
        let mut out = img.clone();
        apply(&mut out, &[Op::Saturation(0.0)]);
        assert!(out.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]), "no saturation is gray");
        let mut out = img.clone();
        apply(&mut out, &[Op::Brightness(0.0)]);
        assert!(out.iter().all(|&x| x == 0));
        let mut out = img.clone();
        apply(&mut out, &[Op::Grayscale]);
        assert!(out.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
        // A turn by a third moves pure red to pure green.
        let mut red = vec![255u8, 0, 0];
        apply(&mut red, &[Op::Hue(1.0 / 3.0)]);
        assert_eq!(red, [0, 255, 0]);
    }

    #[test]
    fn draws_follow_the_amounts_and_the_stream() {
        let j = ColorJitter { brightness: 0.2, contrast: 0.0, saturation: 0.3, hue: 0.1 };
        let mut seen_orders = std::collections::HashSet::new();
        for i in 0..200 {
            let ops = draw(Some(&j), 0.0, &mut SampleRng::new(1, 0, i));
            assert_eq!(ops, draw(Some(&j), 0.0, &mut SampleRng::new(1, 0, i)), "the same sample draws the same");
            assert_eq!(ops.len(), 3, "contrast 0 is left out");
            for op in &ops {
                match *op {
                    Op::Brightness(f) => assert!((0.8..1.2).contains(&f)),
                    Op::Saturation(f) => assert!((0.7..1.3).contains(&f)),
                    Op::Hue(f) => assert!((-0.1..0.1).contains(&f)),
                    other => panic!("{other:?}"),
                }
            }
            seen_orders.insert(ops.iter().map(std::mem::discriminant).collect::<Vec<_>>());
        }
        assert_eq!(seen_orders.len(), 6, "every order of three operations occurs");
        let grays = (0..1000).filter(|&i| draw(None, 0.25, &mut SampleRng::new(2, 0, i)) == [Op::Grayscale]).count();
        assert!((180..320).contains(&grays), "{grays} of 1000 at p = 0.25");
        assert!(
            ColorJitter { hue: 0.6, ..j }.check().is_err() && ColorJitter { brightness: -1.0, ..j }.check().is_err()
        );
    }
}
