//! The resize alone: Stoker's Pillow-exact resampler (each kernel this CPU runs) against
//! fast_image_resize's bilinear convolution, on the windows a RandomResizedCrop(224) draws
//! from 500x375 and 375x500 photos, one thread, warm scratch.
//!
//! ```sh
//! cargo run --release -p stoker-examples --example resize_bench [-- ROUNDS]
//! ```
//! Prints how far fast_image_resize's bytes are from ours (which are Pillow's) and what each
//! allocates per call, then one line per round: microseconds per 224x224 resize.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use stoker::decode::image::resample::{Kernel, Resampler, View};
use stoker::decode::image::{plan, Window};
use stoker::decode::{Crop, ImageSpec, SampleRng};

const OUT: usize = 224;

/// Counts allocations (one relaxed add each), to show what a warm resize allocates.
struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(5), |a| a.parse())?;
    // A photo-like image: smooth gradients plus noise (the speed does not depend on content).
    let photo = |w: usize, h: usize| -> Vec<u8> {
        let mut rng = SampleRng::new(1, 2, 3);
        (0..w * h * 3)
            .map(|i| {
                let (p, c) = (i / 3, i % 3);
                let (x, y) = (p % w, p / w);
                ((x * (c + 1) / 3 + y / 2 + (rng.next_u64() % 24) as usize) % 256) as u8
            })
            .collect()
    };
    let spec = ImageSpec { crop: Crop::random_resized(), size: [OUT as u32; 2], ..Default::default() };
    let images = [(500usize, 375usize, photo(500, 375)), (375, 500, photo(375, 500))];
    // 400 windows per image, as the decode draws them.
    let jobs: Vec<(usize, Window)> = (0..800u64)
        .map(|i| {
            let which = (i % 2) as usize;
            let (w, h, _) = &images[which];
            (which, plan(&spec, *w as u32, *h as u32, &mut SampleRng::new(0, 0, i)).window)
        })
        .collect();
    let cut = |win: &Window| (win.left as usize, win.top as usize, win.width as usize, win.height as usize);

    let kernels: Vec<Kernel> =
        [Kernel::Scalar, Kernel::Sse41, Kernel::Avx2].into_iter().filter(|k| k.available()).collect();
    let mut ours = vec![0u8; OUT * OUT * 3];
    let mut theirs = vec![0u8; OUT * OUT * 3];
    // How far fast_image_resize is from Pillow's bytes on these windows.
    let (mut max_diff, mut off) = (0u8, 0usize);
    let mut resampler = Resampler::new();
    let mut resizer = Resizer::new();
    let opts = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    let (mut ours_allocs, mut theirs_allocs) = (0, 0);
    for pass in 0..2 {
        for (which, win) in &jobs {
            let (w, h, img) = &images[*which];
            let (x, y, cw, ch) = cut(win);
            let view = View::new(img, *w, *h)?.crop(x, y, cw, ch)?;
            let before = ALLOCS.load(Relaxed);
            resampler.resize(view, [0.0, 0.0, cw as f32, ch as f32], &mut ours, (OUT, OUT))?;
            let mid = ALLOCS.load(Relaxed);
            let src = ImageRef::new(*w as u32, *h as u32, img, PixelType::U8x3)?;
            let crop = CroppedImage::new(&src, x as u32, y as u32, cw as u32, ch as u32)?;
            let mut dst = Image::from_slice_u8(OUT as u32, OUT as u32, &mut theirs, PixelType::U8x3)?;
            resizer.resize(&crop, &mut dst, &opts)?;
            if pass == 1 {
                // The second pass, with both resizers' scratch warm.
                ours_allocs += mid - before;
                theirs_allocs += ALLOCS.load(Relaxed) - mid;
                for (a, b) in ours.iter().zip(&theirs) {
                    max_diff = max_diff.max(a.abs_diff(*b));
                    off += usize::from(a != b);
                }
            }
        }
    }
    let n = jobs.len() as u64;
    println!(
        "fast_image_resize vs Pillow's bytes on {n} windows: max diff {max_diff}, {:.2}% of values differ; \
         allocations per warm resize: stoker {}, fast_image_resize {}",
        off as f64 * 100.0 / (jobs.len() * OUT * OUT * 3) as f64,
        ours_allocs / n,
        theirs_allocs / n,
    );

    for round in 0..rounds {
        let mut line = format!("round {round}: us per {OUT}x{OUT} resize:");
        for &kernel in &kernels {
            let mut r = Resampler::with_kernel(kernel).ok_or("kernel not available")?;
            let t = Instant::now();
            for (which, win) in &jobs {
                let (w, h, img) = &images[*which];
                let (x, y, cw, ch) = cut(win);
                let view = View::new(img, *w, *h)?.crop(x, y, cw, ch)?;
                r.resize(view, [0.0, 0.0, cw as f32, ch as f32], &mut ours, (OUT, OUT))?;
            }
            line += &format!(" stoker-{kernel:?} {:.1}", t.elapsed().as_secs_f64() * 1e6 / jobs.len() as f64);
        }
        let t = Instant::now();
        for (which, win) in &jobs {
            let (w, h, img) = &images[*which];
            let (x, y, cw, ch) = cut(win);
            let src = ImageRef::new(*w as u32, *h as u32, img, PixelType::U8x3)?;
            let crop = CroppedImage::new(&src, x as u32, y as u32, cw as u32, ch as u32)?;
            let mut dst = Image::from_slice_u8(OUT as u32, OUT as u32, &mut theirs, PixelType::U8x3)?;
            resizer.resize(&crop, &mut dst, &opts)?;
        }
        line += &format!(" fast_image_resize {:.1}", t.elapsed().as_secs_f64() * 1e6 / jobs.len() as f64);
        println!("{line}");
    }
    Ok(())
}
