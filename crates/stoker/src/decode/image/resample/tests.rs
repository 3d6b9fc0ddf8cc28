use super::*;
use crate::decode::SampleRng;

const ONE: i32 = 1 << PRECISION_BITS;

fn kernels() -> Vec<Kernel> {
    [Kernel::Scalar, Kernel::Sse41, Kernel::Avx2].into_iter().filter(|k| k.available()).collect()
}

/// value = (x * 37 + y * 91 + c * 53 + x * y * 7) % 256, as in the Python that made `golden`.
fn pattern(w: usize, h: usize) -> Vec<u8> {
    (0..h)
        .flat_map(|y| {
            (0..w).flat_map(move |x| (0..3).map(move |c| ((x * 37 + y * 91 + c * 53 + x * y * 7) % 256) as u8))
        })
        .collect()
}

fn noise(rng: &mut SampleRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

fn run(r: &mut Resampler, src: View<'_>, bx: [f32; 4], (dw, dh): (usize, usize)) -> Vec<u8> {
    let mut out = vec![0; dw * dh * 3];
    r.resize(src, bx, &mut out, (dw, dh)).unwrap_or_else(|e| panic!("{src:?} {bx:?} -> {dw}x{dh}: {e}"));
    out
}

#[test]
fn weights_sum_to_one_and_stay_inside_the_axis() {
    let mut a = Axis::default();
    let cases = [
        (500, 0.0, 500.0, 224),
        (375, 12.0, 311.0, 224),
        (100, 0.0, 100.0, 224),
        (7, 0.5, 6.75, 3),
        (1, 0.0, 1.0, 5),
        (4000, 0.0, 4000.0, 3),
        (9, 9.0, 9.0, 2),
        (10, 0.0, 0.001, 4),
    ];
    for (size, in0, in1, out) in cases {
        a.precompute(size, in0, in1, out).unwrap();
        assert_eq!(a.bounds.len(), out);
        let mut prev = (0, 0);
        for i in 0..out {
            let (first, k) = a.taps(i);
            assert!(!k.is_empty() && k.len() <= a.ksize, "{size} {in0} {in1} {out} #{i}: {} taps", k.len());
            assert!(first + k.len() <= size, "#{i} reads past the axis");
            // Monotonic, so the span is the first and last outputs' taps.
            assert!(first >= prev.0 && first + k.len() >= prev.1);
            prev = (first, first + k.len());
            assert!(k.iter().all(|&v| (0..=ONE).contains(&v)));
            let sum: i32 = k.iter().sum();
            // Each weight rounds by at most half a unit.
            let slack = k.len() as i32;
            assert!((sum - ONE).abs() <= slack, "#{i}: weights sum to {sum}");
        }
    }
}

#[test]
fn scale_one_is_the_identity_and_whole_pixel_offsets_shift() {
    let mut a = Axis::default();
    for (in0, out, size) in [(0.0f32, 10, 10), (3.0, 10, 20), (7.0, 1, 8)] {
        a.precompute(size, in0, in0 + out as f32, out).unwrap();
        for i in 0..out {
            let (first, k) = a.taps(i);
            let hit: Vec<(usize, i32)> =
                k.iter().enumerate().filter(|(_, &v)| v != 0).map(|(j, &v)| (first + j, v)).collect();
            assert_eq!(hit, [(i + in0 as usize, ONE)], "in0 {in0}, output {i}");
        }
    }
}

#[test]
fn whole_pixel_boxes_of_the_output_size_are_exact_copies() {
    let (w, h) = (9, 7);
    let img = pattern(w, h);
    for kernel in kernels() {
        let mut r = Resampler::with_kernel(kernel).unwrap();
        let src = View::new(&img, w, h).unwrap();
        // The crop shortcut, and the same through both passes (a fractional top edge makes
        // Pillow resample; whole-pixel x then gives exact columns).
        let out = run(&mut r, src, [2.0, 1.0, 6.0, 4.0], (4, 3));
        for y in 0..3 {
            assert_eq!(out[y * 12..][..12], img[((y + 1) * w + 2) * 3..][..12]);
        }
        assert_eq!(run(&mut r, src, [0.0, 0.0, w as f32, h as f32], (w, h)), img);
        let cut = src.crop(1, 2, 5, 4).unwrap();
        assert_eq!(run(&mut r, cut, [0.0, 0.0, 5.0, 4.0], (5, 4)), run(&mut r, src, [1.0, 2.0, 6.0, 6.0], (5, 4)));
        // Horizontal only at scale 1 with a whole-pixel box: the identity.
        let same = run(&mut r, src.rows(0, 1), [0.0, 0.0, w as f32, 1.0], (w, 1));
        assert_eq!(same, img[..w * 3]);
    }
}

#[test]
fn matches_pillow_on_hand_checked_cases() {
    // Pillow 13: Image.fromarray(pattern(w, h)).resize(size, Image.BILINEAR, box=bx).
    type Case = ((usize, usize), (usize, usize), [f32; 4], &'static [u8]);
    let golden: [Case; 4] = [
        (
            (7, 5),
            (4, 3),
            [0.5, 0.25, 6.75, 4.5],
            &[
                76, 129, 166, 136, 142, 131, 111, 133, 162, 140, 131, 118, 156, 124, 119, 110, 123, 129, 123, 139, 155,
                154, 133, 109, 108, 139, 136, 148, 151, 138, 161, 131, 127, 136, 133, 132,
            ],
        ),
        // Height shrinks by more than twice the width: Pillow filters vertically first.
        (
            (6, 9),
            (5, 2),
            [0.0, 0.0, 6.0, 9.0],
            &[
                101, 141, 125, 125, 127, 139, 128, 137, 129, 135, 126, 156, 124, 163, 108, 120, 129, 136, 120, 124,
                135, 125, 142, 132, 141, 104, 134, 123, 150, 96,
            ],
        ),
        (
            (3, 4),
            (8, 7),
            [0.3, 1.1, 2.9, 3.6],
            &[
                71, 124, 177, 83, 136, 189, 97, 150, 203, 111, 164, 217, 125, 178, 178, 138, 191, 127, 152, 205, 77,
                156, 209, 62, 103, 156, 175, 117, 160, 188, 131, 163, 202, 145, 166, 217, 151, 179, 173, 154, 193, 116,
                157, 208, 59, 159, 212, 43, 136, 189, 116, 150, 166, 130, 165, 140, 145, 180, 115, 160, 163, 123, 141,
                137, 138, 115, 111, 154, 88, 105, 158, 81, 168, 221, 57, 183, 173, 71, 199, 118, 87, 215, 64, 104, 174,
                67, 109, 120, 83, 113, 65, 100, 118, 51, 104, 118, 148, 201, 51, 163, 158, 66, 180, 108, 83, 197, 60,
                100, 161, 64, 117, 112, 81, 134, 63, 99, 152, 50, 103, 156, 89, 142, 83, 105, 126, 99, 123, 107, 117,
                140, 89, 135, 129, 99, 152, 111, 118, 171, 92, 136, 189, 87, 140, 193, 30, 83, 116, 47, 94, 133, 66,
                106, 151, 83, 118, 169, 97, 135, 188, 109, 154, 207, 122, 173, 226, 125, 178, 231,
            ],
        ),
        // Width only: the vertical pass is skipped.
        (
            (5, 5),
            (2, 5),
            [0.0, 0.0, 5.0, 5.0],
            &[
                37, 90, 143, 111, 164, 217, 135, 176, 171, 142, 90, 85, 163, 111, 83, 91, 132, 185, 75, 128, 169, 191,
                163, 111, 161, 156, 104, 117, 112, 153,
            ],
        ),
    ];
    for kernel in kernels() {
        let mut r = Resampler::with_kernel(kernel).unwrap();
        for ((w, h), size, bx, want) in golden {
            let img = pattern(w, h);
            assert_eq!(run(&mut r, View::new(&img, w, h).unwrap(), bx, size), want, "{kernel:?} {w}x{h} {bx:?}");
        }
    }
}

/// A random resize: a buffer, a crop of it (so rows have a stride and the last row ends the
/// buffer or not), a box in the crop, and an output size, up or down, thin or not.
struct Case {
    data: Vec<u8>,
    /// Buffer width, then the crop's x, y, width, height.
    crop: (usize, usize, usize, usize, usize),
    bx: [f32; 4],
    out: (usize, usize),
}

fn random_case(rng: &mut SampleRng) -> Case {
    let dim = |rng: &mut SampleRng| match rng.int_inclusive(0, 5) {
        0 => 1,
        1 => rng.int_inclusive(2, 4) as usize,
        2 => rng.int_inclusive(200, 700) as usize,
        _ => rng.int_inclusive(5, 120) as usize,
    };
    let (w, h) = (dim(rng), dim(rng));
    let (pad_x, pad_y) = (rng.int_inclusive(0, 3) as usize, rng.int_inclusive(0, 2) as usize);
    let bw = w + pad_x;
    let data = noise(rng, bw * (h + pad_y) * 3);
    let (x, y) = (rng.int_inclusive(0, pad_x as u64) as usize, rng.int_inclusive(0, pad_y as u64) as usize);
    let bx = match rng.int_inclusive(0, 3) {
        0 => [0.0, 0.0, w as f32, h as f32],
        1 => {
            let (l, t) = (rng.int_inclusive(0, w as u64 - 1), rng.int_inclusive(0, h as u64 - 1));
            let r = rng.int_inclusive(l + 1, w as u64);
            let b = rng.int_inclusive(t + 1, h as u64);
            [l as f32, t as f32, r as f32, b as f32]
        }
        _ => {
            let l = rng.uniform(0.0, w as f64);
            let t = rng.uniform(0.0, h as f64);
            [l as f32, t as f32, rng.uniform(l, w as f64) as f32, rng.uniform(t, h as f64) as f32]
        }
    };
    let out = (dim(rng).min(300), dim(rng).min(300));
    Case { data, crop: (bw, x, y, w, h), bx, out }
}

#[test]
fn every_kernel_gives_the_scalar_bytes() {
    let kernels = kernels();
    let mut rs: Vec<Resampler> = kernels.iter().map(|&k| Resampler::with_kernel(k).unwrap()).collect();
    let mut rng = SampleRng::new(11, 0, 0);
    for case in 0..400 {
        let Case { data, crop: (bw, x, y, w, h), bx, out } = random_case(&mut rng);
        let full = View::new(&data, bw, data.len() / 3 / bw).unwrap();
        let src = full.crop(x, y, w, h).unwrap();
        let want = run(&mut rs[0], src, bx, out);
        for (r, k) in rs.iter_mut().zip(&kernels).skip(1) {
            assert!(run(r, src, bx, out) == want, "case {case}: {k:?} differs: {src:?} {bx:?} -> {out:?}");
        }
    }
}

#[test]
fn extreme_aspects_and_one_pixel_edges_agree_across_kernels() {
    let kernels = kernels();
    let mut rng = SampleRng::new(12, 0, 0);
    let shapes =
        [((1, 1), (224, 224)), ((1000, 1), (3, 1)), ((1, 900), (1, 7)), ((640, 2), (224, 224)), ((3, 3), (1, 1))];
    for ((w, h), out) in shapes {
        let img = noise(&mut rng, w * h * 3);
        let src = View::new(&img, w, h).unwrap();
        for bx in [[0.0, 0.0, w as f32, h as f32], [0.25, 0.0, w as f32 - 0.1, h as f32 * 0.5]] {
            let outs: Vec<Vec<u8>> =
                kernels.iter().map(|&k| run(&mut Resampler::with_kernel(k).unwrap(), src, bx, out)).collect();
            assert!(outs.windows(2).all(|p| p[0] == p[1]), "{w}x{h} {bx:?} -> {out:?}");
        }
    }
}

#[test]
fn bad_arguments_are_errors() {
    let img = pattern(4, 3);
    let src = View::new(&img, 4, 3).unwrap();
    let mut r = Resampler::new();
    let mut out = vec![0; 2 * 2 * 3];
    for bx in [
        [-0.5, 0.0, 4.0, 3.0],
        [0.0, 0.0, 4.5, 3.0],
        [0.0, 0.0, 4.0, 3.01],
        [2.0, 0.0, 1.0, 3.0],
        [f32::NAN, 0.0, 4.0, 3.0],
        [0.0, 0.0, f32::INFINITY, 3.0],
    ] {
        assert!(r.resize(src, bx, &mut out, (2, 2)).is_err(), "{bx:?}");
    }
    let whole = [0.0, 0.0, 4.0, 3.0];
    assert!(r.resize(src, whole, &mut out, (0, 2)).is_err());
    assert!(r.resize(src, whole, &mut out, (2, 3)).is_err(), "output buffer of the wrong size");
    assert!(r.resize(src, whole, &mut [], (usize::MAX, 2)).is_err());
    assert!(View::new(&img, 4, 4).is_err() && View::new(&img, 0, 3).is_err() && View::new(&img, 4, 0).is_err());
    assert!(src.crop(1, 0, 4, 1).is_err() && src.crop(0, 2, 1, 2).is_err() && src.crop(usize::MAX, 0, 2, 1).is_err());
    // An empty box is allowed: on the right edge at x = 4 it reads column 3; at y = 1, the
    // rows either side of the line, half and half.
    r.resize(src, [4.0, 1.0, 4.0, 1.0], &mut out, (2, 2)).unwrap();
    let px = |x: usize, y: usize, c: usize| u16::from(img[(y * 4 + x) * 3 + c]);
    for (c, &v) in out[..3].iter().enumerate() {
        assert_eq!(u16::from(v), (px(3, 0, c) + px(3, 1, c)).div_ceil(2));
    }
}

#[test]
fn scratch_is_reused_across_sizes() {
    let mut r = Resampler::new();
    let img = pattern(300, 200);
    let src = View::new(&img, 300, 200).unwrap();
    let cases = [
        ([0.0, 0.0, 300.0, 200.0], (224, 224)),
        ([10.0, 5.0, 200.0, 190.0], (174, 160)),
        ([0.0, 0.0, 150.0, 100.0], (124, 220)),
        ([50.5, 20.25, 290.0, 180.0], (74, 28)),
    ];
    let capacities = |r: &Resampler| {
        (r.tmp.capacity(), r.horiz.k.capacity(), r.vert.k.capacity(), r.horiz.pairs.capacity(), r.pad.capacity())
    };
    for (bx, size) in cases {
        run(&mut r, src, bx, size);
    }
    let warm = capacities(&r);
    for (bx, size) in cases.into_iter().rev() {
        run(&mut r, src, bx, size);
    }
    assert_eq!(warm, capacities(&r));
}
