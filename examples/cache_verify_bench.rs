//! What verifying disk cache blocks costs a warm epoch: Loader throughput over the same tar
//! shards on the embedded S3 server, every block in the disk cache, read through a cache that
//! checks every chunk a read touches against the block's digests (always, in use) and through
//! one that does not (only possible under `STOKER_UNVERIFIED_CACHE_FOR_BENCHMARKS=1`, which
//! this bench sets for its second source alone), in one run, interleaved so both see the same
//! machine load.
//!
//! ```text
//! cargo run --release -p stoker-examples --example cache_verify_bench                 # 4096 x 64 KiB, 15 pairs
//! cargo run --release -p stoker-examples --example cache_verify_bench -- 8192 65536 31 # count size pairs
//! ```
//!
//! A process hashes each chunk of a block file the first time it reads it and serves it as
//! verified afterwards (until the file changes), so the first warm epoch is reported apart:
//! it pays the check. Then the median samples/s of each, and the median with quartiles of the
//! ratio (verified / unverified) taken pair by pair: each pair runs back to back, so a burst of load
//! elsewhere on the machine moves both of its epochs and cancels out of its ratio. The
//! issue's bar is a cost of at most 3%.

#[path = "common/measure.rs"]
mod measure;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use measure::{cpu_seconds, loader_epoch, median, write_tar};
use stoker::DynSampleSource;
use stoker_testkit::s3::{self, S3ServerConfig};

const AK: &str = "bench";
const SK: &str = "bench-secret";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.replace('_', "").parse().ok()).collect();
    let (count, size, reps) =
        (*args.first().unwrap_or(&4096), *args.get(1).unwrap_or(&65536), *args.get(2).unwrap_or(&15));
    let root = tempfile::tempdir()?;
    let shards = root.path().join("data/shards");
    write_shards(&shards, count, size, 32 << 20)?;
    // The server on a runtime of its own, as a separate machine would be.
    let servers = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let server = servers.spawn(s3::serve(S3ServerConfig::new(root.path()).with_credentials(AK, SK))).await??;
    let caches = tempfile::tempdir()?;
    let open = |dir: &str| {
        let uri = format!(
            "s3://data/shards?endpoint={}&access_key_id={AK}&secret_access_key={SK}&disk_cache_dir={}",
            server.endpoint(),
            caches.path().join(dir).display()
        );
        async move { stoker::open(&uri, Default::default()).await }
    };
    let verified = open("verified").await?;
    // The variable is read when a cache opens: set for this one source only.
    std::env::set_var(stoker::cache::UNVERIFIED_ENV, "1");
    let unverified = open("unverified").await;
    std::env::remove_var(stoker::cache::UNVERIFIED_ENV);
    let unverified = unverified?;
    // Cold epochs fill both disk caches; every later epoch reads the block files (the hit path).
    for src in [&verified, &unverified] {
        epoch(src).await?;
        src.flush().await;
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let (cpu0, wall0) = (cpu_seconds(), Instant::now());
    let mut first_warm = (0.0, 0.0);
    for rep in 0..=reps {
        let a = epoch(&verified).await?;
        let b = epoch(&unverified).await?;
        // The first warm pass verifies every chunk once (later ones serve what this process
        // verified); it also warms the page cache and the buffer pools: reported apart.
        if rep == 0 {
            first_warm = (a, b);
        } else {
            on.push(a);
            off.push(b);
        }
    }
    let cores = (cpu_seconds() - cpu0) / wall0.elapsed().as_secs_f64();
    let io = verified.io_counters().unwrap_or_default();
    let mut ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    let quartile = |q: usize| ratios[(ratios.len() - 1) * q / 4];
    let (on, off) = (median(&mut on), median(&mut off));
    println!(
        "{count} samples x {size} B from the disk cache, median of {reps}: verified {on:.0} samples/s ({:.0} MiB/s), \
         unverified {off:.0} samples/s ({:.0} MiB/s), {cores:.2} cores busy; {} blocks read straight into batches, \
         {} corrupt",
        on * size as f64 / (1 << 20) as f64,
        off * size as f64 / (1 << 20) as f64,
        io.disk_direct,
        io.cache_corrupt
    );
    println!(
        "first warm epoch (every chunk hashed once): verified {:.0}, unverified {:.0} samples/s: {:.3}",
        first_warm.0,
        first_warm.1,
        first_warm.0 / first_warm.1
    );
    println!(
        "later warm epochs, verified/unverified pair by pair: median {:.3} (cost {:.1}%), quartiles {:.3}..{:.3}",
        quartile(2),
        (1.0 - quartile(2)) * 100.0,
        quartile(1),
        quartile(3)
    );
    // The server's runtime cannot be dropped inside this one's context.
    servers.shutdown_background();
    Ok(())
}

/// Tar shards of about `shard_bytes` each holding `count` samples of `size` bytes.
fn write_shards(dir: &Path, count: usize, size: usize, shard_bytes: usize) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let per = (shard_bytes / size).max(1);
    for (s, first) in (0..count).step_by(per).enumerate() {
        write_tar(&dir.join(format!("shard-{s:05}.tar")), first..(first + per).min(count), size)?;
    }
    Ok(())
}

/// Samples per second of one Loader epoch of `src`.
async fn epoch(src: &Arc<DynSampleSource>) -> Result<f64, Box<dyn std::error::Error>> {
    loader_epoch(src.clone()).await
}
