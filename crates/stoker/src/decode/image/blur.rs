//! torchvision's `GaussianBlur(kernel_size, sigma)` on the resized RGB8 image: its kernel
//! (`softmax(-(x / sigma)^2)` over `kernel_size` points evenly spaced on
//! `[-lim, lim]`, `lim = (kernel_size - 1) / (2 sqrt 2)`), reflect padding, and the result
//! rounded to `uint8`. torchvision convolves with the 2-D outer product; this runs it as two
//! 1-D passes in `f32`, which rounds differently by a level on few pixels (measured in
//! tests/it/color.rs). `sigma` is drawn per sample from `[lo, hi]` as torchvision's
//! `GaussianBlur.get_params` does; `p` applies it to that share of samples (what
//! `RandomApply([GaussianBlur(...)], p)` and Albumentations' `p` do).

/// torchvision's `gaussian_blur(img, [size, size], [sigma, sigma])` on the RGB8 image `img`
/// (`w` x `h`), in place, as the decode threads run it after the colour operations.
pub fn gaussian_blur(img: &mut [u8], w: usize, h: usize, size: usize, sigma: f32) {
    blur(img, w, h, size, sigma, &mut Vec::new());
}

/// The 1-D kernel torchvision uses.
fn kernel(size: usize, sigma: f32) -> Vec<f32> {
    let lim = (size as f32 - 1.0) / (2.0 * std::f32::consts::SQRT_2);
    let step = if size > 1 { 2.0 * lim / (size as f32 - 1.0) } else { 0.0 };
    let s = sigma;
    let logits: Vec<f32> = (0..size).map(|i| -((-lim + step * i as f32) / s).powi(2)).collect();
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits.iter().map(|l| (l - top).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

/// `i` reflected into `0..n` (torch's "reflect": the edge is not repeated).
fn reflect(i: isize, n: usize) -> usize {
    let n = n as isize;
    if n == 1 {
        return 0;
    }
    let period = 2 * (n - 1);
    let m = i.rem_euclid(period);
    (if m < n { m } else { period - m }) as usize
}

/// Blur the RGB8 image `img` (`w` x `h`) in place with a `size`-tap kernel of `sigma`, using
/// `tmp` (grown as needed, kept by the caller) for the horizontal pass.
pub(crate) fn blur(img: &mut [u8], w: usize, h: usize, size: usize, sigma: f32, tmp: &mut Vec<f32>) {
    if w == 0 || h == 0 || size < 2 || img.len() < w * h * 3 {
        return;
    }
    let k = kernel(size, sigma);
    let r = (size / 2) as isize;
    tmp.clear();
    tmp.resize(w * h * 3, 0.0);
    for y in 0..h {
        let row = &img[y * w * 3..(y + 1) * w * 3];
        for x in 0..w {
            let mut acc = [0f32; 3];
            for (t, &kv) in k.iter().enumerate() {
                let sx = reflect(x as isize + t as isize - r, w);
                for c in 0..3 {
                    acc[c] += kv * f32::from(row[sx * 3 + c]);
                }
            }
            tmp[(y * w + x) * 3..(y * w + x) * 3 + 3].copy_from_slice(&acc);
        }
    }
    for y in 0..h {
        for x in 0..w {
            let mut acc = [0f32; 3];
            for (t, &kv) in k.iter().enumerate() {
                let sy = reflect(y as isize + t as isize - r, h);
                for c in 0..3 {
                    acc[c] += kv * tmp[(sy * w + x) * 3 + c];
                }
            }
            for c in 0..3 {
                img[(y * w + x) * 3 + c] = acc[c].round().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_is_torchvisions_and_a_flat_image_stays_flat() {
        let k = kernel(3, 1.0);
        // torchvision: _get_gaussian_kernel1d(3, 1.0) = [0.2741, 0.4519, 0.2741]
        assert!((k[0] - 0.274_068_6).abs() < 1e-5 && (k[1] - 0.451_862_8).abs() < 1e-5, "{k:?}");
        let k = kernel(3, 0.5);
        // [0.1065, 0.7870, 0.1065]: a pixel away weighs exp(-1 / (2 sigma^2)) of the centre.
        assert!((k[0] / k[1] - (-2.0f32).exp()).abs() < 1e-5, "{k:?}");
        assert!((k.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!([reflect(-1, 5), reflect(-2, 5), reflect(5, 5), reflect(6, 5), reflect(2, 5)], [1, 2, 3, 2, 2]);
        let mut flat = vec![77u8; 6 * 4 * 3];
        blur(&mut flat, 6, 4, 5, 2.0, &mut Vec::new());
        assert!(flat.iter().all(|&v| v == 77));
    }
}
