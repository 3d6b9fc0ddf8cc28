//! The colour operations alone, one thread, on 224x224 photo-like RGB8 images: microseconds
//! per image for each of torchvision's operations as the decode threads apply them.
//!
//! ```sh
//! cargo run --release -p stoker-examples --example color_bench [-- ROUNDS]
//! ```

use std::time::Instant;

use stoker::decode::{apply_color, ColorOp, SampleRng};

const SIDE: usize = 224;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(3), |a| a.parse())?;
    // Smooth gradients plus noise: every hue sector and branch of the HSV code occurs.
    let mut rng = SampleRng::new(1, 2, 3);
    let photo: Vec<u8> = (0..SIDE * SIDE * 3)
        .map(|i| {
            let (p, c) = (i / 3, i % 3);
            let (x, y) = (p % SIDE, p / SIDE);
            ((x * (c + 1) / 3 + y * (3 - c) / 2 + (rng.next_u64() % 24) as usize) % 256) as u8
        })
        .collect();
    let ops = [
        ("brightness", ColorOp::Brightness(1.13)),
        ("contrast", ColorOp::Contrast(0.87)),
        ("saturation", ColorOp::Saturation(1.17)),
        ("hue", ColorOp::Hue(0.07)),
        ("grayscale", ColorOp::Grayscale),
    ];
    let n = 400;
    let mut img = photo.clone();
    for round in 0..rounds {
        let mut line = format!("round {round}: us per {SIDE}x{SIDE} image:");
        for (name, op) in &ops {
            let t = Instant::now();
            for _ in 0..n {
                img.copy_from_slice(&photo);
                apply_color(&mut img, std::slice::from_ref(op));
            }
            line += &format!(" {name} {:.1}", t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        // The whole jitter as the decode threads run it, in two of its orders: contrast last
        // (one pass for the other three, then contrast's) and contrast first.
        for (name, chain) in [("jitter(b,s,h,c)", [0, 2, 3, 1]), ("jitter(c,b,s,h)", [1, 0, 2, 3])] {
            let chain: Vec<ColorOp> = chain.iter().map(|&k| ops[k].1).collect();
            let t = Instant::now();
            for _ in 0..n {
                img.copy_from_slice(&photo);
                apply_color(&mut img, &chain);
            }
            line += &format!(" {name} {:.1}", t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        let t = Instant::now();
        for _ in 0..n {
            img.copy_from_slice(&photo);
        }
        line += &format!(" (the copy each includes: {:.1})", t.elapsed().as_secs_f64() * 1e6 / n as f64);
        println!("{line}");
    }
    Ok(())
}
