//! Which part of the source image becomes the output, with torchvision's sampling rules.

use super::super::rng::SampleRng;
use super::super::spec::{Crop, ImageSpec};

/// A window of the source image in pixel coordinates (fractional when a resize and a crop
/// are fused), and whether the output is mirrored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
    /// Mirror the output horizontally.
    pub flip: bool,
}

/// Python's `round` (half to even), which torchvision's sampling goes through.
fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

/// The window `spec` takes from a `width` x `height` image, drawing from `rng` in a fixed
/// order: the crop's numbers (as torchvision draws them), then one number for the flip when
/// `spec.flip > 0`.
pub fn window(spec: &ImageSpec, width: usize, height: usize, rng: &mut SampleRng) -> Window {
    let (w, h) = (width as f64, height as f64);
    let (left, top, cw, ch) = match spec.crop {
        Crop::RandomResized { scale, ratio } => random_resized(w, h, scale, ratio, rng),
        Crop::Center { resize } => center(w, h, spec.size, resize),
        Crop::Squash => (0.0, 0.0, w, h),
    };
    let flip = spec.flip > 0.0 && rng.unit() < f64::from(spec.flip);
    Window { left, top, width: cw, height: ch, flip }
}

/// torchvision `RandomResizedCrop.get_params`: `(left, top, width, height)` in whole pixels.
fn random_resized(w: f64, h: f64, scale: [f32; 2], ratio: [f32; 2], rng: &mut SampleRng) -> (f64, f64, f64, f64) {
    let area = w * h;
    let (r0, r1) = (f64::from(ratio[0]), f64::from(ratio[1]));
    let (log0, log1) = (r0.ln(), r1.ln());
    for _ in 0..10 {
        let target = area * rng.uniform(f64::from(scale[0]), f64::from(scale[1]));
        let aspect = rng.uniform(log0, log1).exp();
        let cw = py_round((target * aspect).sqrt());
        let ch = py_round((target / aspect).sqrt());
        if cw > 0.0 && cw <= w && ch > 0.0 && ch <= h {
            let top = rng.int_inclusive(0, (h - ch) as u64) as f64;
            let left = rng.int_inclusive(0, (w - cw) as u64) as f64;
            return (left, top, cw, ch);
        }
    }
    // Fallback: the whole image, its aspect ratio clamped into `ratio`, centered.
    let in_ratio = w / h;
    let (cw, ch) = if in_ratio < r0.min(r1) {
        (w, py_round(w / r0.min(r1)))
    } else if in_ratio > r0.max(r1) {
        (py_round(h * r0.max(r1)), h)
    } else {
        (w, h)
    };
    (((w - cw) / 2.0).floor(), ((h - ch) / 2.0).floor(), cw, ch)
}

/// torchvision `Resize(resize)` (shorter side; the longer one truncated) then
/// `CenterCrop(size)`, as one window of the source.
fn center(w: f64, h: f64, size: [u32; 2], resize: Option<u32>) -> (f64, f64, f64, f64) {
    let (out_h, out_w) = (f64::from(size[0]), f64::from(size[1]));
    let short_side = resize.map_or_else(|| py_round(out_h.min(out_w) * 256.0 / 224.0), f64::from);
    let (short, long) = (w.min(h), w.max(h));
    let new_long = (short_side * long / short).floor();
    let (rw, rh) = if w <= h { (short_side, new_long) } else { (new_long, short_side) };
    let top = py_round((rh - out_h) / 2.0);
    let left = py_round((rw - out_w) / 2.0);
    let (sx, sy) = (w / rw, h / rh);
    (left * sx, top * sy, out_w * sx, out_h * sy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(crop: Crop, flip: f32) -> ImageSpec {
        ImageSpec { crop, flip, ..ImageSpec::default() }
    }

    #[test]
    fn random_resized_windows_are_inside_and_follow_the_ranges() {
        let s = spec(Crop::random_resized(), 0.5);
        let mut flips = 0;
        let mut areas = Vec::new();
        for i in 0..2000 {
            let mut rng = SampleRng::new(1, 0, i);
            let win = window(&s, 500, 375, &mut rng);
            assert!(win.left >= 0.0 && win.top >= 0.0, "{win:?}");
            assert!(win.left + win.width <= 500.0 && win.top + win.height <= 375.0, "{win:?}");
            assert_eq!((win.left.fract(), win.width.fract()), (0.0, 0.0), "whole pixels, as torchvision");
            areas.push(win.width * win.height / (500.0 * 375.0));
            flips += usize::from(win.flip);
            // A pure function of (seed, epoch, index).
            assert_eq!(window(&s, 500, 375, &mut SampleRng::new(1, 0, i)), win);
        }
        assert!((850..1150).contains(&flips), "{flips} flips of 2000 at p = 0.5");
        let small = areas.iter().filter(|&&a| a < 0.3).count();
        assert!(areas.iter().all(|&a| (0.07..=1.0).contains(&a)), "areas within scale");
        assert!((400..1100).contains(&small), "scale is drawn uniformly: {small} of 2000 below 0.3");
    }

    #[test]
    fn extreme_aspect_falls_back_to_a_clamped_center_crop() {
        // 1000x10: no crop of ratio 3/4..4/3 with area >= 8% fits, so the fallback runs.
        let s = spec(Crop::RandomResized { scale: [0.9, 1.0], ratio: [0.75, 1.3333] }, 0.0);
        let win = window(&s, 1000, 10, &mut SampleRng::new(0, 0, 0));
        assert_eq!((win.width, win.height), (13.0, 10.0));
        assert_eq!((win.left, win.top), (493.0, 0.0));
    }

    #[test]
    fn center_matches_resize_then_center_crop() {
        // 500x375 -> Resize(256) gives 341x256; CenterCrop(224) starts at (58.5 -> 58, 16).
        let s = spec(Crop::Center { resize: None }, 0.0);
        let win = window(&s, 500, 375, &mut SampleRng::new(0, 0, 0));
        let sx = 500.0 / 341.0;
        let sy = 375.0 / 256.0;
        assert!((win.left - 58.0 * sx).abs() < 1e-9 && (win.top - 16.0 * sy).abs() < 1e-9, "{win:?}");
        assert!((win.width - 224.0 * sx).abs() < 1e-9 && (win.height - 224.0 * sy).abs() < 1e-9);
        assert!(!win.flip);
        let sq = window(&spec(Crop::Squash, 1.0), 30, 20, &mut SampleRng::new(0, 0, 0));
        assert_eq!((sq.left, sq.top, sq.width, sq.height, sq.flip), (0.0, 0.0, 30.0, 20.0, true));
    }
}
