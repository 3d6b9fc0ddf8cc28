//! Which part of the source image becomes the output: torchvision's `RandomResizedCrop`,
//! `Resize` + `CenterCrop` and a plain squash, as one source-space window plus a flip.
//!
//! Pure functions of the image size, the spec and the sample's random stream, public so tests
//! (and users checking reproducibility) can compute exactly what a decode will do. The order of
//! draws is part of the determinism contract: window first, then one draw for the flip.

use super::super::rng::SampleRng;
use super::super::spec::{Crop, ImageSpec};

/// A rectangle of the source image in pixel units; fractional for fused resize-then-crop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Left edge (x of the first column's left border).
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width in source pixels.
    pub width: f64,
    /// Height in source pixels.
    pub height: f64,
    /// Integer windows (a crop, then a resize of just the crop, as torchvision does) sample
    /// only pixels inside; fractional ones (a resize of the whole image, then a crop) let the
    /// filter reach outside, as resizing the whole image would.
    pub clamp_to_window: bool,
}

/// What one decode does to one image: the source window and whether to mirror the output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// The source window resized to the output size.
    pub window: Window,
    /// Mirror left-right after the resize.
    pub flip: bool,
}

/// A rectangle of whole source pixels, `[x0, x1) x [y0, y1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    /// First column.
    pub x0: usize,
    /// First row.
    pub y0: usize,
    /// One past the last column.
    pub x1: usize,
    /// One past the last row.
    pub y1: usize,
}

impl Rect {
    /// The whole `width` x `height` image.
    pub fn whole(width: u32, height: u32) -> Rect {
        Rect { x0: 0, y0: 0, x1: width as usize, y1: height as usize }
    }
}

/// The source pixels that resizing `window` of a `width` x `height` image to `size` reads,
/// so a decoder can skip the rest.
pub fn needed(window: &Window, width: u32, height: u32, size: [u32; 2]) -> Rect {
    let (w, h) = (f64::from(width), f64::from(height));
    // The bilinear filter reaches `max(scale, 1)` source pixels either side of an output
    // pixel's centre; unclamped windows read that far past their edges (plus one for rounding).
    let (rx, ry) = if window.clamp_to_window {
        (0.0, 0.0)
    } else {
        let [oh, ow] = size;
        ((window.width / f64::from(ow.max(1))).max(1.0) + 1.0, (window.height / f64::from(oh.max(1))).max(1.0) + 1.0)
    };
    let lo = |v: f64, r: f64, lim: f64| (v - r).floor().clamp(0.0, lim - 1.0) as usize;
    let hi = |v: f64, r: f64, lim: f64| (v + r).ceil().clamp(1.0, lim) as usize;
    let x0 = lo(window.left, rx, w);
    let y0 = lo(window.top, ry, h);
    Rect {
        x0,
        y0,
        x1: hi(window.left + window.width, rx, w).max(x0 + 1),
        y1: hi(window.top + window.height, ry, h).max(y0 + 1),
    }
}

/// Python's `round()` on a float: halves go to the even neighbour (torchvision's arithmetic).
fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

/// The window and flip for an image of `width` x `height` (both >= 1) under `spec`, drawing
/// from `rng` in a fixed order: the window's draws (none for `Center` and `Squash`), then one
/// `rng.unit()` for the flip when `spec.flip > 0`.
pub fn plan(spec: &ImageSpec, width: u32, height: u32, rng: &mut SampleRng) -> Plan {
    let window = match spec.crop {
        Crop::RandomResized { scale, ratio } => random_resized(width, height, scale, ratio, rng),
        Crop::Center { resize } => center(width, height, spec.size, resize),
        Crop::Squash => whole(width, height),
    };
    let flip = spec.flip > 0.0 && rng.unit() < f64::from(spec.flip);
    Plan { window, flip }
}

fn whole(width: u32, height: u32) -> Window {
    Window { left: 0.0, top: 0.0, width: f64::from(width), height: f64::from(height), clamp_to_window: true }
}

/// torchvision `RandomResizedCrop.get_params` with the PIL backend: integer `(top, left, h, w)`.
pub fn random_resized(width: u32, height: u32, scale: [f32; 2], ratio: [f32; 2], rng: &mut SampleRng) -> Window {
    let (w_img, h_img) = (f64::from(width), f64::from(height));
    let area = w_img * h_img;
    let (r0, r1) = (f64::from(ratio[0]), f64::from(ratio[1]));
    let log_ratio = (r0.ln(), r1.ln());
    let int_window = |top: u64, left: u64, h: f64, w: f64| Window {
        left: left as f64,
        top: top as f64,
        width: w,
        height: h,
        clamp_to_window: true,
    };
    for _ in 0..10 {
        let target_area = area * rng.uniform(f64::from(scale[0]), f64::from(scale[1]));
        let aspect = rng.uniform(log_ratio.0, log_ratio.1).exp();
        let w = py_round((target_area * aspect).sqrt());
        let h = py_round((target_area / aspect).sqrt());
        if 0.0 < w && w <= w_img && 0.0 < h && h <= h_img {
            // Both fit, so the spans are exact small integers.
            let top = rng.int_inclusive(0, (h_img - h) as u64);
            let left = rng.int_inclusive(0, (w_img - w) as u64);
            return int_window(top, left, h, w);
        }
    }
    // Fallback: the whole image with its aspect ratio clamped into `ratio`, centered.
    let in_ratio = w_img / h_img;
    let (w, h) = if in_ratio < r0 {
        (w_img, py_round(w_img / r0))
    } else if in_ratio > r1 {
        (py_round(h_img * r1), h_img)
    } else {
        (w_img, h_img)
    };
    // torchvision would crop to nothing for extreme ratios on a 1-pixel side; keep a pixel.
    let (w, h) = (w.clamp(1.0, w_img), h.clamp(1.0, h_img));
    int_window(((h_img - h) as u64) / 2, ((w_img - w) as u64) / 2, h, w)
}

/// The size torchvision's `Resize(resize)` (an int: the shorter side) gives an image.
pub fn resized_size(width: u32, height: u32, resize: u32) -> (u32, u32) {
    let (short, long) = if width <= height { (width, height) } else { (height, width) };
    // int(resize * long / short): float division then truncation, as Python does.
    let new_long = (f64::from(resize) * f64::from(long) / f64::from(short)) as u32;
    if width <= height {
        (resize, new_long)
    } else {
        (new_long, resize)
    }
}

/// torchvision `Resize(resize)` then `CenterCrop(size)`, fused: the crop's footprint in
/// source coordinates, so one antialiased resize of that window gives the same pixels.
pub fn center(width: u32, height: u32, size: [u32; 2], resize: Option<u32>) -> Window {
    let [out_h, out_w] = size;
    let resize = resize.unwrap_or_else(|| py_round(f64::from(out_h.min(out_w)) * 256.0 / 224.0) as u32).max(1);
    let (rw, rh) = resized_size(width, height, resize);
    let (rw, rh) = (rw.max(1), rh.max(1));
    // CenterCrop: int(round((rh - out_h) / 2.0)). torchvision pads a crop larger than the
    // image; we take the whole side instead (the validated specs never need it for squares).
    let offset = |r: u32, o: u32| if o >= r { 0.0 } else { py_round(f64::from(r - o) / 2.0) };
    let (top, left) = (offset(rh, out_h), offset(rw, out_w));
    let (sx, sy) = (f64::from(width) / f64::from(rw), f64::from(height) / f64::from(rh));
    Window {
        left: left * sx,
        top: top * sy,
        width: f64::from(out_w.min(rw)) * sx,
        height: f64::from(out_h.min(rh)) * sy,
        clamp_to_window: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::spec::Crop;

    const SCALE: [f32; 2] = [0.08, 1.0];
    const RATIO: [f32; 2] = [3.0 / 4.0, 4.0 / 3.0];

    #[test]
    fn random_resized_stays_in_bounds_and_within_scale_and_ratio() {
        for (w, h) in [(500u32, 375u32), (375, 500), (224, 224), (1, 1), (3, 1000), (1000, 3), (4000, 3000)] {
            for i in 0..2000 {
                let mut rng = SampleRng::new(1, 0, i);
                let win = random_resized(w, h, SCALE, RATIO, &mut rng);
                assert!(win.width >= 1.0 && win.height >= 1.0, "{win:?}");
                assert_eq!(win.left.fract() + win.top.fract() + win.width.fract() + win.height.fract(), 0.0);
                assert!(
                    win.left + win.width <= f64::from(w) && win.top + win.height <= f64::from(h),
                    "{w}x{h} {win:?}"
                );
                if (w, h) == (500, 375) {
                    let (a, r) = (win.width * win.height / f64::from(w * h), win.width / win.height);
                    // Rounding to whole pixels moves area and ratio a little past the ranges.
                    assert!((0.075..=1.0).contains(&a), "{win:?}");
                    assert!((0.74..=1.35).contains(&r), "{win:?}");
                }
            }
        }
        // With ratio 1 on a square every try fits, so the area fraction is uniform in `scale`.
        let areas: Vec<f64> = (0..4000)
            .map(|i| {
                let win = random_resized(1000, 1000, SCALE, [1.0, 1.0], &mut SampleRng::new(2, 0, i));
                win.width * win.height / 1e6
            })
            .collect();
        let below_mid = areas.iter().filter(|&&a| a < 0.54).count() as f64 / areas.len() as f64;
        assert!((0.46..0.54).contains(&below_mid), "{below_mid}");
        assert!(areas.iter().any(|&a| a < 0.09) && areas.iter().any(|&a| a > 0.99));
    }

    #[test]
    fn random_resized_is_deterministic_and_seed_dependent() {
        let draw = |s, e, i| random_resized(640, 480, SCALE, RATIO, &mut SampleRng::new(s, e, i));
        assert_eq!(draw(3, 1, 9), draw(3, 1, 9));
        let distinct = (0..50).map(|i| format!("{:?}", draw(3, 1, i))).collect::<std::collections::HashSet<_>>();
        assert!(distinct.len() > 45);
    }

    #[test]
    fn random_resized_falls_back_to_a_centered_clamped_ratio() {
        // A scale above what fits makes every try fail (area > image), forcing the fallback.
        let mut rng = SampleRng::new(0, 0, 0);
        // Very wide: in_ratio 10 > 4/3, so h = H and w = round(H * 4/3).
        let win = random_resized(1000, 100, [1.0, 1.0], [0.5, 0.5], &mut rng);
        assert_eq!((win.width, win.height), (50.0, 100.0));
        assert_eq!((win.left, win.top), (475.0, 0.0));
        // Very tall: in_ratio 0.1 < r0 = 2, so w = W and h = round(W / 2).
        let win = random_resized(100, 1000, [1.0, 1.0], [2.0, 2.0], &mut rng);
        assert_eq!((win.width, win.height, win.left, win.top), (100.0, 50.0, 0.0, 475.0));
        // Tall but wider than the top ratio 0.09: h = H, w = round(1000 * 0.09) = 90.
        let win = random_resized(100, 1000, [1.0, 1.0], [0.05, 0.09], &mut rng);
        assert_eq!((win.width, win.height, win.left, win.top), (90.0, 1000.0, 5.0, 0.0));
    }

    #[test]
    fn center_matches_resize_then_center_crop() {
        // 500x375 -> Resize(256): short side 375 -> 256, long = int(256 * 500 / 375) = 341.
        assert_eq!(resized_size(500, 375, 256), (341, 256));
        assert_eq!(resized_size(375, 500, 256), (256, 341));
        let win = center(500, 375, [224, 224], None);
        // Crop offsets: left = round((341 - 224) / 2) = round(58.5) = 58 (ties to even),
        // top = round(16) = 16; scale back by 500/341 and 375/256.
        let (sx, sy) = (500.0 / 341.0, 375.0 / 256.0);
        assert!((win.left - 58.0 * sx).abs() < 1e-9 && (win.top - 16.0 * sy).abs() < 1e-9);
        assert!((win.width - 224.0 * sx).abs() < 1e-9 && (win.height - 224.0 * sy).abs() < 1e-9);
        assert!(!win.clamp_to_window);
        // An explicit resize equal to the image's short side keeps the scale at 1.
        let win = center(300, 224, [224, 224], Some(224));
        assert_eq!((win.left, win.top, win.width, win.height), (38.0, 0.0, 224.0, 224.0));
    }

    #[test]
    fn flip_is_one_draw_after_the_window() {
        let mut spec = ImageSpec { crop: Crop::random_resized(), flip: 0.5, ..Default::default() };
        let mut flips = 0;
        for i in 0..1000 {
            let mut a = SampleRng::new(5, 0, i);
            let p = plan(&spec, 500, 375, &mut a);
            let mut b = SampleRng::new(5, 0, i);
            let win = random_resized(500, 375, SCALE, RATIO, &mut b);
            assert_eq!(p.window, win);
            assert_eq!(p.flip, b.unit() < 0.5);
            // Nothing else is drawn.
            assert_eq!(a.next_u64(), b.next_u64());
            flips += usize::from(p.flip);
        }
        assert!((400..600).contains(&flips), "{flips}");
        spec.flip = 0.0;
        let mut a = SampleRng::new(5, 0, 0);
        let mut b = a.clone();
        assert!(!plan(&spec, 500, 375, &mut a).flip);
        random_resized(500, 375, SCALE, RATIO, &mut b);
        assert_eq!(a.next_u64(), b.next_u64(), "flip 0 draws nothing");
        spec.flip = 1.0;
        assert!((0..100).all(|i| plan(&spec, 50, 50, &mut SampleRng::new(0, 0, i)).flip));
    }
}
