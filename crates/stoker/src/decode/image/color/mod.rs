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
#[macro_use]
mod lanes;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86; // `load` also serves the float output (output.rs)
#[cfg(target_arch = "x86_64")]
mod x86_512;

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

/// Which code does the whole 8-pixel blocks of the image (as the resampler's `Kernel`): the
/// widest vector code the CPU has, else the scalar code does everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// The scalar code does everything, one operation after the other over the image: the
    /// reference the vector code is tested against.
    Scalar,
    /// Made only by [`Path::detect`] (and the tests' `Path::available`) on a CPU with AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Made only by [`Path::detect`] (and the tests' `Path::available`) on a CPU with AVX2
    /// and AVX-512F.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Path {
    /// The fastest path this CPU runs.
    fn detect() -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            if x86_512::available() {
                return Path::Avx512;
            }
            if x86::available() {
                return Path::Avx2;
            }
        }
        Path::Scalar
    }

    /// Every path this CPU runs, slowest first (the tests run each).
    #[cfg(test)]
    fn available() -> Vec<Path> {
        #[allow(unused_mut)] // only x86-64 adds to it
        let mut paths = vec![Path::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::available() {
                paths.push(Path::Avx2);
            }
            if x86_512::available() {
                paths.push(Path::Avx512);
            }
        }
        paths
    }
}

/// One step of a fused pass: an operation whose result depends only on the pixel itself.
/// Contrast becomes a [`Step::Values`] once the mean it blends with is known.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    /// Every value `x` becomes `x * mul + add`, clamped and truncated (brightness with `add`
    /// zero, contrast's blend with its mean).
    Values { mul: f32, add: f32 },
    /// `adjust_saturation(img, f)`.
    Saturation(f32),
    /// `adjust_hue(img, f)`.
    Hue(f32),
    /// `rgb_to_grayscale`.
    Grayscale,
}

/// The most steps one pass takes; a longer run of operations without a contrast (only
/// through the public [`apply`] with a long list) takes more passes.
const MAX_STEPS: usize = 8;

/// [`apply`] on `path`. The scalar path applies each operation to the whole image in turn.
/// The vector path fuses the operations between two contrasts into one pass over the image
/// (each 8-pixel block loaded once, every operation applied in registers with the same
/// per-operation truncation to `uint8`, stored once): contrast needs the mean of the image as
/// the operations before it left it, so a pass ends there, summing the grayscale as it
/// stores. The few pixels after the last whole block get the same steps from the scalar code.
fn apply_with(img: &mut [u8], ops: &[ColorOp], path: Path) {
    let pixels = img.len() / 3 * 3;
    let img = &mut img[..pixels];
    if path == Path::Scalar {
        ops.iter().for_each(|&op| scalar_op(img, op));
        return;
    }
    let mut steps = [Step::Grayscale; MAX_STEPS];
    let mut pending = 0;
    for &op in ops {
        let step = match op {
            Op::Brightness(f) => Step::Values { mul: f, add: 0.0 },
            Op::Contrast(f) => {
                let sum = pass(img, &steps[..pending], true, path);
                pending = 0;
                let mean = (sum as f64 / (pixels / 3).max(1) as f64) as f32;
                Step::Values { mul: f, add: mean * (1.0 - f) }
            }
            Op::Saturation(f) => Step::Saturation(f),
            Op::Hue(f) => Step::Hue(f),
            Op::Grayscale => Step::Grayscale,
        };
        if pending == MAX_STEPS {
            pass(img, &steps, false, path);
            pending = 0;
        }
        steps[pending] = step;
        pending += 1;
    }
    if pending > 0 {
        pass(img, &steps[..pending], false, path);
    }
}

/// One pass of `steps` over `img` (whole pixels): the vector code takes the whole blocks, the
/// scalar code the rest. With `sum`, the total of the result's floored grayscale (what
/// contrast's mean needs), else 0.
fn pass(img: &mut [u8], steps: &[Step], sum: bool, path: Path) -> u64 {
    let (done, mut total) = match path {
        Path::Scalar => (0, 0),
        // SAFETY: `Avx2` is made only where the CPU has AVX2 (`Path::detect`, `Path::available`).
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { x86::pass(img, steps, sum) },
        // SAFETY: `Avx512` is made only where the CPU has AVX2 and AVX-512F (as `Avx2`).
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { x86_512::pass(img, steps, sum) },
    };
    let rest = &mut img[done..];
    for &step in steps {
        scalar_step(rest, step);
    }
    if sum {
        total += rest.chunks_exact(3).map(|p| u64::from(floor_gray(p) as u32)).sum::<u64>();
    }
    total
}

/// One operation over the whole image, by the scalar code.
fn scalar_op(img: &mut [u8], op: ColorOp) {
    match op {
        Op::Brightness(f) => scalar_step(img, Step::Values { mul: f, add: 0.0 }),
        Op::Contrast(f) => {
            // torch sums the floored grayscale in f32 (pairwise); an integer sum keeps the
            // mean exact, in any order.
            let sum = img.chunks_exact(3).map(|p| u64::from(floor_gray(p) as u32)).sum::<u64>();
            let mean = (sum as f64 / (img.len() / 3).max(1) as f64) as f32;
            scalar_step(img, Step::Values { mul: f, add: mean * (1.0 - f) });
        }
        Op::Saturation(f) => scalar_step(img, Step::Saturation(f)),
        Op::Hue(f) => scalar_step(img, Step::Hue(f)),
        Op::Grayscale => scalar_step(img, Step::Grayscale),
    }
}

/// One step over `img` (whole pixels), by the scalar code.
fn scalar_step(img: &mut [u8], step: Step) {
    match step {
        Step::Values { mul, add } => values(img, mul, add),
        Step::Saturation(f) => {
            for p in img.chunks_exact_mut(3) {
                let g = floor_gray(p);
                p.iter_mut().for_each(|x| *x = blend(*x, g, f));
            }
        }
        Step::Hue(f) => img.chunks_exact_mut(3).for_each(|p| hue(p, f)),
        Step::Grayscale => {
            for p in img.chunks_exact_mut(3) {
                let g = to_u8(gray_f32(p));
                p.fill(g);
            }
        }
    }
}

/// Every byte `x` becomes `x * mul + add`, clamped and truncated: brightness (`add` zero,
/// where `x * f + 0` is `x * f`) and contrast's blend with the mean (torchvision's `f * x +
/// (1 - f) * mean`), by a 256-entry table of the results (a handful of bytes, the tail of a
/// vector pass, computed directly).
fn values(img: &mut [u8], mul: f32, add: f32) {
    let value = |x: u8| to_u8(f32::from(x) * mul + add);
    if img.len() < 256 {
        img.iter_mut().for_each(|x| *x = value(*x));
    } else {
        let table: [u8; 256] = std::array::from_fn(|x| value(x as u8));
        img.iter_mut().for_each(|x| *x = table[usize::from(*x)]);
    }
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
            for path in Path::available() {
                let mut got = img.clone();
                apply_with(&mut got, &[op], path);
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                let at = first.map(|i| &img[i / 3 * 3..i / 3 * 3 + 3]);
                assert_eq!(at, None, "{op:?} on {path:?}: the first pixel that differs");
            }
        }
    }

    #[test]
    fn fused_passes_give_the_scalar_code_bytes() {
        // Whole sequences (one pass per run between contrasts on the vector path) against the
        // scalar code applying one operation after the other: contrast first, last, twice,
        // after grayscale; more steps than one pass takes; nothing.
        let img: Vec<u8> = (0..(1u32 << 24)).step_by(389).flat_map(|c| c.to_le_bytes()[..3].to_vec()).collect();
        assert_ne!(img.len() / 3 % 8, 0);
        let (b, c, s, h) = (Op::Brightness(1.13), Op::Contrast(0.81), Op::Saturation(1.27), Op::Hue(-0.09));
        let mut sequences: Vec<Vec<ColorOp>> = vec![
            vec![],
            vec![c],
            vec![b, c, s, h],
            vec![c, h, s, b, Op::Grayscale],
            vec![h, s, b, c],
            vec![s, c, Op::Contrast(1.4), h],
            vec![Op::Grayscale, c],
            vec![b, s, h, b, s, h, Op::Hue(0.21), Op::Saturation(0.6), Op::Brightness(0.7), h, c, h],
        ];
        let jitter = ColorJitter { brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1 };
        sequences.extend((0..24).map(|i| draw(Some(&jitter), 0.3, &mut SampleRng::new(5, 1, i))));
        for ops in &sequences {
            let mut want = img.clone();
            apply_with(&mut want, ops, Path::Scalar);
            for path in Path::available() {
                let mut got = img.clone();
                apply_with(&mut got, ops, path);
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                let at = first.map(|i| &img[i / 3 * 3..i / 3 * 3 + 3]);
                assert_eq!(at, None, "{ops:?} on {path:?}: the first pixel that differs");
            }
            let mut got = img.clone();
            apply(&mut got, ops);
            assert!(got == want, "{ops:?}: apply takes one of the paths");
        }
    }

    #[test]
    fn a_hue_turn_keeps_the_largest_and_smallest_channel() {
        // What the vector hue relies on: the scalar code's f32 `v` and `p` give back exactly
        // the largest and smallest input byte, for every pair and any turn.
        for max in 0..=255u8 {
            for min in 0..=max {
                let mid = min + (max - min) / 3;
                for f in [-0.5, -0.31, -0.07, 0.0, 0.013, 0.19, 0.5] {
                    for p in [[max, mid, min], [mid, min, max], [min, max, mid], [max, min, mid]] {
                        let mut out = p;
                        hue(&mut out, f);
                        let (hi, lo) = (*out.iter().max().unwrap(), *out.iter().min().unwrap());
                        assert_eq!((hi, lo), (max, min), "{p:?} turned by {f}: {out:?}");
                    }
                }
            }
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
