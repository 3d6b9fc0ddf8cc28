//! Image decoding against PIL on real photos (scikit-image's sample data), and bad input.
//!
//! `decode_images.py` (beside this file) writes JPEG/PNG/WebP variants with PIL and PIL's
//! reference pixels; it needs Pillow, scikit-image and numpy (integration/setup.sh installs
//! them). The Python is `$STOKER_PYTHON`; without it these tests say so and skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use stoker::decode::image::resample::{Kernel, Resampler, View};
use stoker::decode::image::window::center;
use stoker::decode::image::{plan, ImageError, ImageScratch};
use stoker::decode::{
    decode_image, decode_image_within, Crop, DecodeMemory, Dtype, ImageLayout, ImageSpec, Normalize, SampleRng,
};

/// Counts this thread's allocations, so a test can see what one warm decode allocates
/// (tests run on parallel threads; a per-thread count keeps them apart).
struct Counting;

thread_local! {
    static ALLOCS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| {
            let (n, b) = c.get();
            c.set((n + 1, b + layout.size() as u64));
        });
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| {
            let (n, b) = c.get();
            c.set((n + 1, b + new_size as u64));
        });
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocs() -> (u64, u64) {
    ALLOCS.with(|c| c.get())
}

struct Variant {
    name: String,
    path: PathBuf,
    width: u32,
    height: u32,
    /// PIL's `convert("RGB")` pixels.
    full: Vec<u8>,
    /// PIL's Resize(256) + CenterCrop(224).
    center: Vec<u8>,
}

struct Fixtures {
    _dir: tempfile::TempDir,
    variants: Vec<Variant>,
    others: Vec<(String, PathBuf)>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/decode_images.py")
}

/// The fixtures, or `None` (with a note) when `STOKER_PYTHON` is not set.
fn fixtures() -> Option<Fixtures> {
    if std::env::var_os("STOKER_PYTHON").is_none() {
        eprintln!(
            "skipped: STOKER_PYTHON is not set (point it at a Python with Pillow and scikit-image, \
             e.g. .venv/bin/python after integration/setup.sh)"
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let res = Command::new(common::python()).arg(script()).arg("make").arg(dir.path()).output().unwrap();
    assert!(res.status.success(), "decode_images.py make: {}", String::from_utf8_lossy(&res.stderr));
    let manifest: Vec<serde_json::Value> = serde_json::from_slice(&res.stdout).unwrap();
    let (mut variants, mut others) = (Vec::new(), Vec::new());
    for e in manifest {
        let name = e["name"].as_str().unwrap().to_string();
        let path = PathBuf::from(e["path"].as_str().unwrap());
        if e.get("width").is_none() {
            others.push((name, path));
            continue;
        }
        let read = |suffix: &str| std::fs::read(format!("{}{suffix}", path.display())).unwrap();
        variants.push(Variant {
            width: e["width"].as_u64().unwrap() as u32,
            height: e["height"].as_u64().unwrap() as u32,
            full: read(".full.rgb"),
            center: read(".center.rgb"),
            name,
            path,
        });
    }
    Some(Fixtures { _dir: dir, variants, others })
}

fn decode(spec: &ImageSpec, data: &[u8], (seed, epoch, index): (u64, u64, u64)) -> Result<Vec<u8>, ImageError> {
    let mut out = vec![0u8; spec.out_bytes()];
    let mut scratch = ImageScratch::default();
    decode_image(spec, data, &mut SampleRng::new(seed, epoch, index), &mut scratch, &mut out)?;
    Ok(out)
}

/// (max abs difference, mean abs difference, fraction of elements off by more than 1).
fn diff(a: &[u8], b: &[u8]) -> (u8, f64, f64) {
    assert_eq!(a.len(), b.len());
    let d: Vec<u8> = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).collect();
    let max = d.iter().copied().max().unwrap_or(0);
    let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64;
    let over1 = d.iter().filter(|&&v| v > 1).count() as f64 / d.len() as f64;
    (max, mean, over1)
}

fn is_jpeg(name: &str) -> bool {
    name.ends_with(".jpg")
}

#[test]
fn plain_decode_matches_pil_convert_rgb() {
    let Some(fx) = fixtures() else { return };
    let mut bad = Vec::new();
    for v in &fx.variants {
        let data = std::fs::read(&v.path).unwrap();
        let spec = ImageSpec { size: [v.height, v.width], crop: Crop::Squash, ..Default::default() };
        let got = decode(&spec, &data, (0, 0, 0)).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let (max, mean, over1) = diff(&got, &v.full);
        eprintln!("{}: {}x{} max {max} mean {mean:.4} >1: {:.5}%", v.name, v.width, v.height, over1 * 100.0);
        if is_jpeg(&v.name) {
            // Upsampling and colour conversion are libjpeg-turbo's, but zune-jpeg's integer IDCT
            // rounds differently from libjpeg's ISLOW one: measured on these photos, ~0.1% of
            // elements differ by 2 or 3 (never more), the rest by at most 1 (mean ~0.01).
            if !(max <= 3 && over1 < 0.003 && mean < 0.02) {
                bad.push(format!("{}: max {max}, {over1} over 1", v.name));
            }
        } else if v.name == "lossy.webp" || v.name == "alpha_lossy.webp" {
            // Lossy WebP: libwebp's and image-webp's YUV->RGB upsampling round differently.
            if !(mean < 1.0 && max <= 8) {
                bad.push(format!("{}: max {max} mean {mean}", v.name));
            }
        } else if got != v.full {
            bad.push(format!("{}: PNG and lossless WebP must be exact (max {max})", v.name));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn center_crop_matches_torchvision_resize_and_center_crop() {
    let Some(fx) = fixtures() else { return };
    let spec = ImageSpec::default(); // Center { resize: None } -> Resize(256) + CenterCrop(224)
    for v in &fx.variants {
        let data = std::fs::read(&v.path).unwrap();
        let got = decode(&spec, &data, (0, 0, 0)).unwrap();
        let (max, mean, _) = diff(&got, &v.center);
        eprintln!("{} center: max {max} mean {mean:.3}", v.name);
        assert!(mean <= 2.0, "{}: center crop mean abs diff {mean} (max {max})", v.name);
        if !is_jpeg(&v.name) && !v.name.contains("lossy") {
            // Same source pixels and PIL's resampler: what differs is one resize of a
            // fractional box against a resize of the whole image then a crop, whose weights
            // round apart now and then (measured: max 1, mean below 0.001).
            assert!(max <= 1 && mean <= 0.01, "{}: max {max} mean {mean}", v.name);
        }
    }
}

#[test]
fn random_resized_crop_matches_pil_crop_resize_flip() {
    let Some(fx) = fixtures() else { return };
    let spec = ImageSpec { crop: Crop::random_resized(), flip: 0.5, ..Default::default() };
    let dir = tempfile::tempdir().unwrap();
    let mut jobs = Vec::new();
    let mut ours = Vec::new();
    for v in fx
        .variants
        .iter()
        .filter(|v| ["c420.jpg", "prog.jpg", "rgb8.png", "lossless.webp", "rocket.jpg"].contains(&v.name.as_str()))
    {
        let data = std::fs::read(&v.path).unwrap();
        for index in 0..6u64 {
            let key = (42, 3, index);
            let p = plan(&spec, v.width, v.height, &mut SampleRng::new(key.0, key.1, key.2));
            let w = p.window;
            assert!(w.clamp_to_window);
            let out = dir.path().join(format!("{}-{index}.rgb", v.name));
            let box_ = [w.left, w.top, w.left + w.width, w.top + w.height].map(|x| x as u64);
            jobs.push(serde_json::json!({"file": v.path, "box": box_, "flip": p.flip, "out": out}));
            ours.push((v.name.clone(), p, out, decode(&spec, &data, key).unwrap()));
        }
    }
    assert!(ours.iter().any(|o| o.1.flip) && ours.iter().any(|o| !o.1.flip));
    let jobs_path = dir.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    let res = Command::new(common::python()).arg(script()).arg("crops").arg(&jobs_path).output().unwrap();
    assert!(res.status.success(), "decode_images.py crops: {}", String::from_utf8_lossy(&res.stderr));
    for (name, p, out, got) in ours {
        let want = std::fs::read(out).unwrap();
        let (max, mean, _) = diff(&got, &want);
        eprintln!("{name} {p:?}: max {max} mean {mean:.3}");
        assert!(mean <= 2.0, "{name} {p:?}: mean abs diff {mean} (max {max})");
        if !is_jpeg(&name) {
            // Same source pixels, and the resampler is PIL's: the same bytes.
            assert!(got == want, "{name} {p:?}: not PIL's bytes (max diff {max})");
        }
    }
}

/// The resampler against PIL's own `resize(size, BILINEAR, box)` on random images, boxes and
/// sizes, as torchvision uses it (crop, then resize) and with fractional boxes: byte for byte,
/// with every kernel this CPU runs.
#[test]
fn resampler_is_pils_resize_exactly() {
    if std::env::var_os("STOKER_PYTHON").is_none() {
        eprintln!("skipped: STOKER_PYTHON is not set");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernels: Vec<Kernel> =
        [Kernel::Scalar, Kernel::Sse41, Kernel::Avx2].into_iter().filter(|k| k.available()).collect();
    let mut resamplers: Vec<Resampler> = kernels.iter().map(|&k| Resampler::with_kernel(k).unwrap()).collect();
    let mut rng = SampleRng::new(21, 0, 0);
    let rrc = ImageSpec { crop: Crop::random_resized(), ..Default::default() };
    let (mut jobs, mut ours) = (Vec::new(), Vec::new());
    for i in 0..240u64 {
        let (w, h) = match i % 8 {
            0 => (500, 375),
            1 => (375, 500),
            2 => (1 + rng.int_inclusive(0, 3) as usize, 1 + rng.int_inclusive(0, 300) as usize),
            _ => (1 + rng.int_inclusive(0, 150) as usize, 1 + rng.int_inclusive(0, 150) as usize),
        };
        // Noise, or smooth ramps with a little noise (long runs of near-ties in the sums).
        let smooth = i % 3 == 0;
        let img: Vec<u8> = (0..w * h * 3)
            .map(|j| {
                let n = rng.next_u64() as u8;
                if smooth {
                    ((j / 3 % w + j / 3 / w + j % 3 * 40) as u8).wrapping_add(n % 3)
                } else {
                    n
                }
            })
            .collect();
        let src = dir.path().join(format!("{i}.rgb"));
        std::fs::write(&src, &img).unwrap();
        let full = View::new(&img, w, h).unwrap();
        let (wf, hf) = (w as f32, h as f32);
        let size = match rng.int_inclusive(0, 3) {
            0 => (224, 224),
            1 => (1 + rng.int_inclusive(0, 8) as usize, 1 + rng.int_inclusive(0, 8) as usize),
            _ => (1 + rng.int_inclusive(0, 299) as usize, 1 + rng.int_inclusive(0, 299) as usize),
        };
        // (whole-pixel crop first, box in what remains)
        let (crop, bx): (Option<[usize; 4]>, [f32; 4]) = match i % 4 {
            // torchvision's RandomResizedCrop: crop, then resize the crop.
            0 => {
                let win = plan(&rrc, w as u32, h as u32, &mut SampleRng::new(5, 0, i)).window;
                let c = [win.left, win.top, win.left + win.width, win.top + win.height].map(|v| v as usize);
                (Some(c), [0.0, 0.0, (c[2] - c[0]) as f32, (c[3] - c[1]) as f32])
            }
            // The fused Resize + CenterCrop window as a box on the whole image.
            1 => {
                let win = center(w as u32, h as u32, [size.1 as u32, size.0 as u32], None);
                let r = ((win.left + win.width) as f32).min(wf);
                let b = ((win.top + win.height) as f32).min(hf);
                (None, [win.left as f32, win.top as f32, r, b])
            }
            2 => (None, [0.0, 0.0, wf, hf]),
            _ => {
                let (l, t) = (rng.uniform(0.0, f64::from(wf)), rng.uniform(0.0, f64::from(hf)));
                let (r, b) = (rng.uniform(l, f64::from(wf)), rng.uniform(t, f64::from(hf)));
                (None, [l as f32, t as f32, r as f32, b as f32])
            }
        };
        let view = match crop {
            Some([l, t, r, b]) => full.crop(l, t, r - l, b - t).unwrap(),
            None => full,
        };
        let outs: Vec<Vec<u8>> = resamplers
            .iter_mut()
            .map(|r| {
                let mut out = vec![0; size.0 * size.1 * 3];
                r.resize(view, bx, &mut out, size).unwrap();
                out
            })
            .collect();
        let out = dir.path().join(format!("{i}.out"));
        // f64 of the f32: Python's float is then exactly the f32 Pillow parses it back into.
        let box64 = bx.map(f64::from);
        jobs.push(serde_json::json!({"src": src, "width": w, "height": h, "crop": crop, "box": box64,
                                     "size": [size.0, size.1], "out": out}));
        ours.push((format!("#{i} {w}x{h} crop {crop:?} box {bx:?} -> {size:?}"), out, outs));
    }
    let jobs_path = dir.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    let res = Command::new(common::python()).arg(script()).arg("resize").arg(&jobs_path).output().unwrap();
    assert!(res.status.success(), "decode_images.py resize: {}", String::from_utf8_lossy(&res.stderr));
    let mut bad = Vec::new();
    for (what, out, outs) in &ours {
        let want = std::fs::read(out).unwrap();
        for (k, got) in kernels.iter().zip(outs) {
            if *got != want {
                let (max, _, _) = diff(got, &want);
                bad.push(format!("{what} {k:?}: differs (max {max})"));
            }
        }
    }
    eprintln!("{} resizes x {} kernels compared with PIL: {} differ", ours.len(), kernels.len(), bad.len());
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn layouts_and_float_outputs_agree_with_the_u8_output() {
    let Some(fx) = fixtures() else { return };
    let v = fx.variants.iter().find(|v| v.name == "c420.jpg").unwrap();
    let data = std::fs::read(&v.path).unwrap();
    let base = ImageSpec { crop: Crop::random_resized(), flip: 0.5, size: [96, 128], ..Default::default() };
    let norm = Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] };
    for index in 0..4 {
        let key = (7, 0, index);
        let hwc = decode(&base, &data, key).unwrap();
        let chw = decode(&ImageSpec { layout: ImageLayout::Chw, ..base.clone() }, &data, key).unwrap();
        let f32s = decode(
            &ImageSpec { layout: ImageLayout::Chw, dtype: Dtype::F32, normalize: Some(norm), ..base.clone() },
            &data,
            key,
        )
        .unwrap();
        let f16s = decode(&ImageSpec { dtype: Dtype::F16, ..base.clone() }, &data, key).unwrap();
        let (h, w) = (96, 128);
        for y in 0..h {
            for x in 0..w {
                for c in 0..3 {
                    let u = hwc[(y * w + x) * 3 + c];
                    let planar = c * h * w + y * w + x;
                    assert_eq!(chw[planar], u);
                    let f = f32::from_ne_bytes(f32s[planar * 4..][..4].try_into().unwrap());
                    assert_eq!(f, (f32::from(u) / 255.0 - norm.mean[c]) / norm.std[c]);
                    let i = (y * w + x) * 3 + c;
                    let g = half::f16::from_ne_bytes(f16s[i * 2..][..2].try_into().unwrap());
                    assert_eq!(g, half::f16::from_f32(f32::from(u) / 255.0));
                }
            }
        }
    }
}

/// Every cut of a valid file must fail; a file missing only its last bytes (JPEG's EOI
/// marker, say) may decode, but then to exactly the full image.
#[test]
fn truncated_files_are_errors_never_garbage() {
    let Some(fx) = fixtures() else { return };
    let spec = ImageSpec { crop: Crop::Squash, size: [64, 64], ..Default::default() };
    for v in &fx.variants {
        let data = std::fs::read(&v.path).unwrap();
        let whole = decode(&spec, &data, (0, 0, 0)).unwrap();
        // Squash reads every row; small random windows near the top let the JPEG row path stop
        // early, before the cut: still an error.
        let top_crop = ImageSpec { crop: Crop::random_resized(), size: [16, 16], ..Default::default() };
        for frac in [0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98] {
            let cut = (data.len() as f64 * frac) as usize;
            for (s, index) in [(&spec, 0), (&top_crop, 0), (&top_crop, 1), (&top_crop, 2), (&top_crop, 3)] {
                match decode(s, &data[..cut], (0, 0, index)) {
                    Err(e) => assert!(
                        matches!(e, ImageError::Truncated(_) | ImageError::Corrupt(_)),
                        "{} cut at {cut}: {e:?}",
                        v.name
                    ),
                    Ok(_) => panic!("{} cut at {cut} of {} decoded ({:?})", v.name, data.len(), s.crop),
                }
            }
        }
        for short in [1, 2] {
            if let Ok(out) = decode(&spec, &data[..data.len() - short], (0, 0, 0)) {
                assert!(out == whole, "{} missing its last {short} bytes decoded to other pixels", v.name);
            }
        }
    }
}

#[test]
fn other_formats_are_unsupported_and_named() {
    let Some(fx) = fixtures() else { return };
    let spec = ImageSpec::default();
    for (name, path) in &fx.others {
        let data = std::fs::read(path).unwrap();
        let want = if name.ends_with(".gif") { "GIF" } else { "BMP" };
        match decode(&spec, &data, (0, 0, 0)) {
            Err(ImageError::Unsupported(what)) => assert_eq!(what, want),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn max_pixels_is_honoured_on_real_images() {
    let Some(fx) = fixtures() else { return };
    for v in fx.variants.iter().filter(|v| ["c444.jpg", "rgb8.png", "lossy.webp"].contains(&v.name.as_str())) {
        let data = std::fs::read(&v.path).unwrap();
        let pixels = u64::from(v.width) * u64::from(v.height);
        let spec = ImageSpec { max_pixels: pixels, ..Default::default() };
        decode(&spec, &data, (0, 0, 0)).unwrap();
        let spec = ImageSpec { max_pixels: pixels - 1, ..Default::default() };
        match decode(&spec, &data, (0, 0, 0)) {
            Err(ImageError::TooLarge { pixels: p, max, .. }) => assert_eq!((p, max), (pixels, pixels - 1)),
            other => panic!("{}: {other:?}", v.name),
        }
    }
}

/// A PNG signature and IHDR chunk claiming `w` x `h` 8-bit RGB (a valid CRC), no data.
fn png_header(w: u32, h: u32) -> Vec<u8> {
    let mut body = b"IHDR".to_vec();
    body.extend_from_slice(&w.to_be_bytes());
    body.extend_from_slice(&h.to_be_bytes());
    body.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    v.extend_from_slice(&13u32.to_be_bytes());
    v.extend_from_slice(&body);
    v.extend_from_slice(&crc32(&body).to_be_bytes());
    v
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn headers_are_checked_before_pixels_exist() {
    let spec = ImageSpec::default();
    let t = std::time::Instant::now();
    match decode(&spec, &png_header(60000, 60000), (0, 0, 0)) {
        Err(ImageError::TooLarge {
            width: 60000,
            height: 60000,
            pixels: 3_600_000_000,
            decoded_bytes: 10_800_000_000,
            max: 100_000_000,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed().as_secs() < 2, "the refusal must not touch gigabytes");
    assert_eq!(decode(&spec, &png_header(0, 0), (0, 0, 0)), Err(ImageError::Empty { width: 0, height: 0 }));
    assert_eq!(decode(&spec, &png_header(5, 0), (0, 0, 0)), Err(ImageError::Empty { width: 5, height: 0 }));
    // Within the limit but no image data: an error, not pixels.
    assert!(matches!(
        decode(&spec, &png_header(64, 64), (0, 0, 0)),
        Err(ImageError::Truncated(_) | ImageError::Corrupt(_))
    ));
}

#[test]
fn random_bytes_are_errors() {
    let spec = ImageSpec::default();
    let mut rng = SampleRng::new(9, 9, 9);
    for len in [0usize, 1, 3, 16, 1000, 100_000] {
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let r = decode(&spec, &data, (0, 0, 0));
        assert!(r.is_err(), "{len} random bytes decoded");
        // Behind a real magic number, random bytes are still refused.
        for magic in [&b"\xff\xd8\xff"[..], b"\x89PNG\r\n\x1a\n", b"RIFF\x10\0\0\0WEBPVP8 "] {
            let mut d = magic.to_vec();
            d.extend_from_slice(&data);
            assert!(decode(&spec, &d, (0, 0, 0)).is_err(), "{len} random bytes after {magic:?}");
        }
    }
    match decode(&spec, b"\x01\x02\x03\x04\x05\x06\x07\x08\x09", (0, 0, 0)) {
        Err(ImageError::Unsupported(what)) => assert_eq!(what, "unknown, first bytes 01 02 03 04 05 06 07 08"),
        other => panic!("{other:?}"),
    }
}

/// With a warm scratch, no pixel-sized buffer is allocated per image and the resize allocates
/// nothing; what the codecs allocate internally (their decoder state) is reported and bounded
/// well below one decoded image.
#[test]
fn warm_decodes_allocate_no_pixel_buffers() {
    let Some(fx) = fixtures() else { return };
    let spec = ImageSpec { crop: Crop::random_resized(), flip: 0.5, ..Default::default() };
    // The resize allocates nothing once its scratch has grown.
    {
        let src = vec![7u8; 300 * 300 * 3];
        let mut dst = vec![0u8; 224 * 224 * 3];
        let mut r = Resampler::new();
        let view = View::new(&src, 300, 300).unwrap();
        for (i, bx) in
            [[0.0, 0.0, 300.0, 300.0], [10.5, 3.0, 290.0, 260.25], [0.0, 0.0, 300.0, 300.0]].iter().enumerate()
        {
            let before = allocs();
            r.resize(view, *bx, &mut dst, (224, 224)).unwrap();
            let (n, b) = (allocs().0 - before.0, allocs().1 - before.1);
            eprintln!("resample 300x300 -> 224x224, call {i}: {n} allocations, {b} bytes");
            if i == 2 {
                assert_eq!((n, b), (0, 0), "a warm resize allocated");
            }
        }
    }
    let mut scratch = ImageScratch::default();
    let mut out = vec![0u8; spec.out_bytes()];
    for v in &fx.variants {
        let data = std::fs::read(&v.path).unwrap();
        // Warm up on the whole image (Squash) so every buffer has its largest size.
        let whole = ImageSpec { crop: Crop::Squash, ..spec.clone() };
        decode_image(&whole, &data, &mut SampleRng::new(0, 0, 0), &mut scratch, &mut out).unwrap();
        let before = allocs();
        let n = 8;
        for i in 0..n {
            decode_image(&spec, &data, &mut SampleRng::new(0, 0, i), &mut scratch, &mut out).unwrap();
        }
        let (count, bytes) = (allocs().0 - before.0, allocs().1 - before.1);
        let decoded = u64::from(v.width) * u64::from(v.height) * 3;
        eprintln!(
            "{}: {} allocations, {} bytes per warm decode (decoded image: {decoded} bytes)",
            v.name,
            count / n,
            bytes / n
        );
        // JPEG decoders (every kind) reuse the scratch's planes and the decoder buffers the
        // previous decoder left, so only the resizer allocates; PNG and WebP decoders keep
        // whole-image state of their own, which they allocate each time.
        if v.name.ends_with(".jpg") {
            assert!(bytes / n < decoded / 2, "{}: {} bytes per decode", v.name, bytes / n);
        }
    }
}

/// What a decode reserves from a memory budget (from the image's header) covers every byte
/// the decode allocates, for every codec and kind PIL writes (lossy WebP among them).
#[test]
fn the_reservation_covers_every_allocation_on_real_images() {
    let Some(fx) = fixtures() else { return };
    let spec = ImageSpec { crop: Crop::Squash, ..Default::default() };
    let mut out = vec![0u8; spec.out_bytes()];
    for v in &fx.variants {
        let data = std::fs::read(&v.path).unwrap();
        let needed = match decode_image_within(
            &DecodeMemory::new(1, 1),
            &spec,
            &data,
            &mut SampleRng::new(0, 0, 0),
            &mut ImageScratch::default(),
            &mut out,
        ) {
            Err(ImageError::OverBudget { needed, .. }) => needed,
            other => panic!("{}: {other:?}", v.name),
        };
        let before = allocs().1;
        decode_image(&spec, &data, &mut SampleRng::new(0, 0, 0), &mut ImageScratch::default(), &mut out).unwrap();
        let allocated = allocs().1 - before;
        eprintln!("{}: reserves {needed}, allocates {allocated} bytes", v.name);
        assert!(allocated <= needed, "{}: allocated {allocated} bytes, reserved {needed}", v.name);
    }
}

/// Single-thread throughput on the JPEGs in `$STOKER_BENCH_IMAGES` with RandomResizedCrop(224)
/// and flip, against a plain full decode plus crop-resize (run in release with `--ignored`).
#[test]
#[ignore = "a measurement: cargo test --release --test decode_images bench -- --ignored --nocapture"]
fn bench_random_resized_crop() {
    use zune_jpeg::zune_core::{bytestream::ZCursor, colorspace::ColorSpace, options::DecoderOptions};
    let Some(dir) = std::env::var_os("STOKER_BENCH_IMAGES") else {
        eprintln!("skipped: set STOKER_BENCH_IMAGES to a directory of JPEGs");
        return;
    };
    let files: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let spec = ImageSpec { crop: Crop::random_resized(), flip: 0.5, ..Default::default() };
    let rounds = 3;
    let n = 600;
    for round in 0..rounds {
        // Full decode with zune-jpeg's own upsampler, then the same window resized.
        let (mut buf, mut out, mut resampler) = (Vec::new(), vec![0u8; 224 * 224 * 3], Resampler::new());
        let t = std::time::Instant::now();
        for i in 0..n {
            let data = &files[i % files.len()];
            let opts = DecoderOptions::default().set_strict_mode(true).jpeg_set_out_colorspace(ColorSpace::RGB);
            let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(&data[..]), opts);
            d.decode_headers().unwrap();
            let (w, h) = d.dimensions().unwrap();
            buf.resize(w * h * 3, 0);
            d.decode_into(&mut buf).unwrap();
            let p = plan(&spec, w as u32, h as u32, &mut SampleRng::new(0, 0, i as u64));
            let win = p.window;
            let [l, t, cw, ch] = [win.left, win.top, win.width, win.height].map(|v| v as usize);
            let cut = View::new(&buf, w, h).unwrap().crop(l, t, cw, ch).unwrap();
            resampler.resize(cut, [0.0, 0.0, cw as f32, ch as f32], &mut out, (224, 224)).unwrap();
        }
        let full = n as f64 / t.elapsed().as_secs_f64();
        // zune-jpeg's raw row pull alone, every row, no upsampling or conversion.
        let mut planes = [Vec::new(), Vec::new(), Vec::new()];
        let t = std::time::Instant::now();
        for i in 0..n {
            let data = &files[i % files.len()];
            let mut d = zune_jpeg::JpegDecoder::new_with_options(
                ZCursor::new(&data[..]),
                DecoderOptions::default().set_strict_mode(true),
            );
            d.decode_headers().unwrap();
            let mut raw = d.raw_output();
            let layout = raw.layout().unwrap();
            let strides: Vec<usize> = layout[..3].iter().map(|p| p.width).collect();
            for (p, l) in planes.iter_mut().zip(&layout) {
                p.resize(l.width * l.height, 0);
            }
            let mut done = [0usize; 3];
            loop {
                let [a, b, c] = &mut planes;
                let mut ps: [&mut [u8]; 3] =
                    [&mut a[done[0] * strides[0]..], &mut b[done[1] * strides[1]..], &mut c[done[2] * strides[2]..]];
                match raw.decode_next_imcu_row(&mut ps, &strides).unwrap() {
                    zune_jpeg::RawImcuRowStatus::RowReady { rows_written } => {
                        for k in 0..3 {
                            done[k] += rows_written[k];
                        }
                    }
                    _ => break,
                }
            }
        }
        let pull = n as f64 / t.elapsed().as_secs_f64();
        eprintln!("round {round}: raw row pull of every row alone {pull:.0} images/s");
        let mut scratch = ImageScratch::default();
        let mut out = vec![0u8; spec.out_bytes()];
        let t = std::time::Instant::now();
        for i in 0..n {
            let data = &files[i % files.len()];
            decode_image(&spec, data, &mut SampleRng::new(0, 0, i as u64), &mut scratch, &mut out).unwrap();
        }
        let ours = n as f64 / t.elapsed().as_secs_f64();
        eprintln!("round {round}: full decode + crop-resize {full:.0} images/s; decode_image {ours:.0} images/s");
    }
}
