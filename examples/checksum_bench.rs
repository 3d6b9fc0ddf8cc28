//! What end-to-end checksums cost: Loader throughput over the same packed 64 KiB samples with
//! their XXH3-64 digests recorded (what `stoker pack` writes) and without (the same shards indexed
//! from their headers only), in one run, interleaved so both see the same machine load.
//!
//! ```text
//! cargo run --release -p stoker-examples --example checksum_bench                 # 4096 x 64 KiB
//! cargo run --release -p stoker-examples --example checksum_bench -- 8192 65536 31 # count size pairs
//! ```
//!
//! Reports the median samples/s of each, and the median with quartiles of the ratio (with /
//! without) taken pair by pair: each pair runs back to back, so a burst of load elsewhere on
//! the machine moves both of its epochs and cancels out of its ratio. The issue's bar is a cost
//! of at most 5%.

#[path = "common/measure.rs"]
mod measure;

use std::path::Path;
use std::time::Instant;

use measure::{cpu_seconds, loader_epoch, median, write_tar};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.replace('_', "").parse().ok()).collect();
    let (count, size, reps) =
        (*args.first().unwrap_or(&4096), *args.get(1).unwrap_or(&65536), *args.get(2).unwrap_or(&15));
    let tmp = tempfile::tempdir()?;
    let (raw, with, without) = (tmp.path().join("raw"), tmp.path().join("with"), tmp.path().join("without"));
    write_source(&raw, count, size)?;
    let src = stoker::open(raw.join("in.tar").to_str().ok_or("path")?, Default::default()).await?;
    let opts = stoker::pack::PackOptions { shard_size: 64 << 20, ..Default::default() };
    stoker::pack::pack(src, with.to_str().ok_or("path")?, &opts, &()).await?;
    // The same shard bytes without any index: opening builds one from headers, no checksums.
    std::fs::create_dir_all(&without)?;
    for e in std::fs::read_dir(&with)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "tar") {
            std::fs::copy(&p, without.join(p.file_name().ok_or("name")?))?;
        }
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let (cpu0, wall0) = (cpu_seconds(), Instant::now());
    for rep in 0..=reps {
        let a = epoch(&with).await?;
        let b = epoch(&without).await?;
        // The first pass warms the page cache and the buffer pools.
        if rep > 0 {
            on.push(a);
            off.push(b);
        }
    }
    // How many of the cores the epochs kept busy: a digest costs throughput only where the
    // threads that fill batches are the bottleneck.
    let cores = (cpu_seconds() - cpu0) / wall0.elapsed().as_secs_f64();
    let mut ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    let quartile = |q: usize| ratios[(ratios.len() - 1) * q / 4];
    let (on, off) = (median(&mut on), median(&mut off));
    // The digests alone over one sample-sized buffer, for scale: XXH3-64 (recorded now) and
    // CRC32C (what older indexes hold).
    let buf = vec![7u8; size];
    let rate = |f: &dyn Fn(&[u8]) -> u64| {
        let t = Instant::now();
        let mut x = 0u64;
        for _ in 0..20_000 {
            x ^= f(std::hint::black_box(&buf));
        }
        (20_000.0 * size as f64 / t.elapsed().as_secs_f64() / 1e9, x)
    };
    let (xxh3, a) = rate(&|b| twox_hash::XxHash3_64::oneshot(b));
    let (crc, b) = rate(&|b| crc32c::crc32c(b) as u64);
    println!("alone on one core: XXH3-64 {xxh3:.1} GB/s, CRC32C {crc:.1} GB/s ({:x})", a ^ b);
    println!(
        "{count} samples x {size} B, median of {reps}: checksums on {on:.0} samples/s ({:.0} MiB/s), off {off:.0} \
         samples/s ({:.0} MiB/s), {cores:.2} cores busy",
        on * size as f64 / (1 << 20) as f64,
        off * size as f64 / (1 << 20) as f64,
    );
    println!(
        "on/off pair by pair: median {:.3} (cost {:.1}%), quartiles {:.3}..{:.3}",
        quartile(2),
        (1.0 - quartile(2)) * 100.0,
        quartile(1),
        quartile(3)
    );
    Ok(())
}

fn write_source(dir: &Path, count: usize, size: usize) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write_tar(&dir.join("in.tar"), 0..count, size)
}

/// Samples per second of one Loader epoch over `dir`, every byte checked as delivered.
async fn epoch(dir: &Path) -> Result<f64, Box<dyn std::error::Error>> {
    loader_epoch(stoker::open(dir.to_str().ok_or("path")?, Default::default()).await?).await
}
