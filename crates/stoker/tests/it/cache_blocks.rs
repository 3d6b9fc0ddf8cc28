//! The block size a Loader's run takes when the options leave it to Stoker: a run that reads
//! every sample of remote data that fits whole in the disk cache takes 8 MiB blocks (each is
//! read whole before the epoch ends anyway, and there are fewer requests and files); a run over
//! more data than the cache holds, one reading a rank's share across nodes, or one whose
//! options choose a block keeps its block. Real Loader, real disk cache, embedded S3 server.

use crate::common;

use std::sync::Arc;

use common::s3::{serve, uri};
use common::*;
use stoker::loader::{Loader, LoaderConfig};
use stoker::sampler::{Order, Partition};
use stoker::DynSampleSource;

/// Two shards of about 10 MiB: more than one 8 MiB block each.
const SHARDS: usize = 2;
const PER: usize = 160;
const PAYLOAD: usize = 64 << 10;

/// One per-sample shuffled epoch (this rank's share under `partition`) through a fresh disk
/// cache opened with `extra` options, every row checked: the requests it made and the
/// largest file it left in the cache (a block and its trailer).
async fn epoch(endpoint: &str, samples: &[stoker::Sample], extra: &str, partition: Partition) -> (u64, u64) {
    let cache = tempfile::tempdir().unwrap();
    let extra = format!("&hedge_ms=0&disk_cache_dir={}{extra}", cache.path().display());
    let src: Arc<DynSampleSource> = open(&uri(endpoint, "tar", &extra)).await;
    let mut cfg = LoaderConfig::new(16);
    cfg.order = Order::Shuffle { seed: 5 };
    cfg.partition = partition;
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let before = src.io_counters().unwrap();
    let seen = checked_epoch(&loader, 0, samples).await;
    assert_eq!(seen, samples.len() / partition.world_size as usize);
    drop(loader);
    let requests = src.io_counters().unwrap().remote_requests - before.remote_requests;
    drop(src); // the cache's writes land
    (requests, largest_file(cache.path()))
}

fn largest_file(dir: &std::path::Path) -> u64 {
    let mut largest = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = e.metadata().unwrap();
        largest = largest.max(if meta.is_dir() { largest_file(&e.path()) } else { meta.len() });
    }
    largest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_data_the_disk_cache_holds_takes_big_blocks_unless_told() {
    let root = tempfile::tempdir().unwrap();
    let (samples, data) = bin_shards(&root.path().join("data/tar"), SHARDS, PER, PAYLOAD);
    let server = serve(root.path()).await;
    let ep = server.endpoint();
    let (one, mib) = (Partition::single(), 1u64 << 20);
    let trailer = 64 << 10; // a block file's checksums, a few KiB

    // Fits: 8 MiB blocks, a request or two per shard (a sample's first miss fetches its block).
    let (requests, largest) = epoch(&ep, &samples, "&disk_cache_bytes=67108864", one).await;
    assert!(requests <= 2 * SHARDS as u64, "{requests} requests for {data} bytes in {SHARDS} shards");
    assert!(largest > mib + trailer && largest <= (8 << 20) + trailer, "largest cache file {largest}");

    // Told 1 MiB: kept, a request per block.
    let told = "&disk_cache_bytes=67108864&cache_block=1048576";
    let (requests, largest) = epoch(&ep, &samples, told, one).await;
    assert!(requests >= data / mib / 2, "{requests} requests for {} blocks", data / mib);
    assert!(largest <= mib + trailer, "largest cache file {largest}");

    // More data than the cache holds: the 1 MiB default.
    let (requests, largest) = epoch(&ep, &samples, "&disk_cache_bytes=8388608", one).await;
    assert!(requests > 2 * SHARDS as u64, "{requests} requests");
    assert!(largest <= mib + trailer, "largest cache file {largest}");

    // A rank of two on different nodes reads half the samples, from every block: 1 MiB.
    let (_, largest) = epoch(&ep, &samples, "&disk_cache_bytes=67108864", Partition::new(0, 2).unwrap()).await;
    assert!(largest <= mib + trailer, "largest cache file {largest}");
    server.shutdown().await;
}

/// The samples of a window read ahead are slices of the bytes fetched (the parts of a
/// request), one copy of the window in memory: consecutive samples lie one tar member apart in
/// one buffer, not in a fresh allocation each, nor in a buffer the shard's parts were joined
/// into; every sample's bytes are its own, including those across a part's edge. With a disk
/// cache, the window's samples come from memory or, once written, from the cache's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_read_ahead_is_held_once_as_slices_of_what_was_fetched() {
    let root = tempfile::tempdir().unwrap();
    let (samples, _) = bin_shards(&root.path().join("data/tar"), 1, PER, PAYLOAD);
    let server = serve(root.path()).await;
    let ep = server.endpoint();
    let cache = tempfile::tempdir().unwrap();
    // Blocks of 1 MiB: a 10 MiB shard is ten of them, with samples across edges.
    let with_cache =
        format!("&hedge_ms=0&disk_cache_dir={}&disk_cache_bytes=67108864&cache_block=1048576", cache.path().display());
    let src: Arc<DynSampleSource> = open(&uri(&ep, "tar", &with_cache)).await;
    let all: Vec<usize> = (0..PER).collect();
    let held = src.read_ahead(&all).await.unwrap();
    assert!(held.bytes() >= (PER * PAYLOAD) as u64, "{} bytes fetched", held.bytes());
    let requests = src.io_counters().unwrap().remote_requests;
    assert!(src.get_many(&all).await.unwrap() == samples, "every sample is the shard's");
    assert_eq!(src.io_counters().unwrap().remote_requests, requests, "served from the disk cache's files");
    drop(held);
    // Parts of 1 MiB, no cache: the window is held, as slices of the parts.
    {
        let extra = "&hedge_ms=0&part_size=1048576";
        let src: Arc<DynSampleSource> = open(&uri(&ep, "tar", extra)).await;
        let held = src.read_ahead(&all).await.unwrap();
        assert!(held.bytes() >= (PER * PAYLOAD) as u64, "{extra}: {} bytes held", held.bytes());
        let requests = src.io_counters().unwrap().remote_requests;
        let got = src.get_many(&all).await.unwrap();
        assert_eq!(src.io_counters().unwrap().remote_requests, requests, "{extra}: served from the window");
        let payload = |s: &stoker::Sample| s.field("bin").unwrap().clone();
        for (g, want) in got.iter().zip(&samples) {
            assert_eq!(payload(g), payload(want), "{extra}: sample {}", want.key);
        }
        // A tar member: a 512-byte header, then the payload (a multiple of 512).
        let member = 512 + PAYLOAD;
        let adjacent = got
            .windows(2)
            .filter(|w| payload(&w[1]).as_ptr() as usize == payload(&w[0]).as_ptr() as usize + member)
            .count();
        // Most neighbours share a buffer (no copy per sample), but not all: the parts or runs
        // fetched are kept as they came, not joined into one buffer per shard (a copy of all).
        assert!(
            (PER * 3 / 4..PER - 1).contains(&adjacent),
            "{extra}: {adjacent} of {} neighbours share a buffer",
            PER - 1
        );
        drop(held);
    }
    server.shutdown().await;
}

/// A batch that finds some of its blocks on disk and some not (a per-sample shuffle's first
/// epoch) reads the samples of the blocks on disk from their files, each its own chunks, not
/// whole blocks (an 8 MiB block read and verified to serve one 64 KiB sample), and fetches
/// the rest; every sample is the shard's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_of_blocks_on_disk_are_read_alone_beside_ones_fetched() {
    let root = tempfile::tempdir().unwrap();
    let (samples, _) = bin_shards(&root.path().join("data/tar"), SHARDS, PER, PAYLOAD);
    let server = serve(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let extra =
        format!("&hedge_ms=0&disk_cache_dir={}&disk_cache_bytes=67108864&cache_block=8388608", cache.path().display());
    let src: Arc<DynSampleSource> = open(&uri(&server.endpoint(), "tar", &extra)).await;
    // Shard 0 into the disk cache.
    let shard0: Vec<usize> = (0..PER).collect();
    assert_eq!(src.get_many(&shard0).await.unwrap(), samples[..PER]);
    src.flush().await;
    let before = src.io_counters().unwrap();
    // Samples far apart (not merged into one read) from both shards: a few per block.
    let batch: Vec<usize> = (0..SHARDS * PER).step_by(37).collect();
    let got = src.get_many(&batch).await.unwrap();
    for (g, &i) in got.iter().zip(&batch) {
        assert!(*g == samples[i], "sample {i} ({}) is not the shard's", samples[i].key);
    }
    let after = src.io_counters().unwrap();
    let from_shard0 = batch.iter().filter(|&&i| i < PER).count() as u64;
    assert!(from_shard0 >= 3, "the batch has {from_shard0} samples of the cached shard");
    assert_eq!(after.cache_corrupt, 0);
    // Every block of shard 0 the batch touches was opened for its samples' chunks (two
    // blocks of a 10 MiB shard), none read whole; shard 1 was fetched.
    assert_eq!(after.disk_direct - before.disk_direct, 2, "{after:?}");
    assert_eq!(after.disk_hits - before.disk_hits, 2, "{after:?}");
    assert!(after.remote_requests > before.remote_requests, "shard 1 was fetched");
    server.shutdown().await;
}

/// One shard of members of 512 + 100,352 bytes (sample 83 runs across the first 8 MiB
/// block's end) on the embedded S3 server, read through a fresh disk cache of 8 MiB blocks
/// that holds block 0 alone (a sample of it fetched it whole): the data's directory, the
/// server, the cache's directory, the source and the samples.
async fn block_0_cached(
) -> (tempfile::TempDir, stoker_testkit::ServerHandle, tempfile::TempDir, Arc<DynSampleSource>, Vec<stoker::Sample>) {
    let root = tempfile::tempdir().unwrap();
    let (samples, _) = bin_shards(&root.path().join("data/tar"), 1, PER, 100_000);
    let server = serve(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let extra =
        format!("&hedge_ms=0&disk_cache_dir={}&disk_cache_bytes=67108864&cache_block=8388608", cache.path().display());
    let src: Arc<DynSampleSource> = open(&uri(&server.endpoint(), "tar", &extra)).await;
    assert_eq!(src.get_many(&[0]).await.unwrap(), samples[..1]);
    src.flush().await;
    (root, server, cache, src, samples)
}

/// A block on disk that one range of a read needs a small piece of, and another range takes
/// whole (it crosses into a missing block), is read once, whole, not once each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_block_that_a_read_takes_whole_is_not_also_read_in_pieces() {
    let (_root, server, _cache, src, samples) = block_0_cached().await;
    let before = src.io_counters().unwrap();
    let got = src.get_many(&[10, 83]).await.unwrap();
    assert!(got[0] == samples[10] && got[1] == samples[83], "the samples are the shard's");
    let after = src.io_counters().unwrap();
    assert_eq!(after.disk_hits - before.disk_hits, 1, "block 0 read once: {after:?}");
    assert_eq!(after.disk_direct - before.disk_direct, 0, "and whole, for sample 83: {after:?}");
    assert_eq!(after.remote_requests - before.remote_requests, 1, "block 1 fetched: {after:?}");
    server.shutdown().await;
}

/// A sample's piece of a cached block that fails verification is fetched again and counted
/// as what it was: damage, not a disk hit as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_piece_of_a_cached_block_is_fetched_again_and_not_counted_a_hit() {
    let (_root, server, cache, src, samples) = block_0_cached().await;
    // Sample 10's payload starts at 10 x 100,864 + 512 bytes: flip a byte inside it.
    let files: Vec<_> = walk(cache.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "blk")).collect();
    assert_eq!(files.len(), 1, "block 0 alone is cached: {files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[1_050_000] ^= 0x10;
    std::fs::write(&files[0], bytes).unwrap();
    let before = src.io_counters().unwrap();
    // With a sample of the uncached block 1, the batch takes the store's path.
    let got = src.get_many(&[10, PER - 1]).await.unwrap();
    assert!(got[0] == samples[10] && got[1] == samples[PER - 1], "the samples are the shard's");
    let after = src.io_counters().unwrap();
    assert_eq!(after.cache_corrupt - before.cache_corrupt, 1, "{after:?}");
    assert_eq!(after.disk_hits - before.disk_hits, 0, "the damaged block served nothing: {after:?}");
    server.shutdown().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// A window whose shard is partly in the disk cache is read ahead only where it is not: one
/// request, the held bytes the missing block's samples, not the shard's; a shard-shuffled
/// epoch takes each sample from where it is (block files, piece by piece, or memory), every
/// row the shard's, with one request (the missing block).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_partly_on_disk_reads_ahead_only_what_is_missing() {
    let root = tempfile::tempdir().unwrap();
    let (samples, data) = bin_shards(&root.path().join("data/tar"), 1, PER, PAYLOAD);
    let server = serve(root.path()).await;
    // A fresh disk cache holding block 0 (the first 8 MiB of the 10 MiB shard).
    let block_0_cached = || async {
        let cache = tempfile::tempdir().unwrap();
        let extra = format!(
            "&hedge_ms=0&disk_cache_dir={}&disk_cache_bytes=67108864&cache_block=8388608",
            cache.path().display()
        );
        let src: Arc<DynSampleSource> = open(&uri(&server.endpoint(), "tar", &extra)).await;
        assert_eq!(src.get_many(&[0]).await.unwrap(), samples[..1]);
        src.flush().await;
        (cache, src)
    };

    let (_cache, src) = block_0_cached().await;
    let all: Vec<usize> = (0..PER).collect();
    let requests = src.io_counters().unwrap().remote_requests;
    let held = src.read_ahead(&all).await.unwrap();
    assert_eq!(src.io_counters().unwrap().remote_requests - requests, 1, "the missing block, once");
    let missing = data - (8 << 20);
    assert!(
        held.bytes() > missing / 2 && held.bytes() < missing + (PAYLOAD as u64) * 2,
        "{} bytes held for {missing} bytes past the cached block",
        held.bytes()
    );
    // The window's size, for sizing the next read-ahead, is all its samples span.
    assert!(held.spanned() >= (PER * PAYLOAD) as u64 && held.spanned() <= data, "spans {}", held.spanned());
    // Samples (a decoding loader's read) come from both places, with no request.
    let requests = src.io_counters().unwrap().remote_requests;
    let got = src.get_many(&all).await.unwrap();
    assert!(got == samples, "every sample is the shard's");
    assert_eq!(src.io_counters().unwrap().remote_requests, requests, "nothing fetched again");
    drop(held);

    let (_cache, src) = block_0_cached().await;
    let mut cfg = LoaderConfig::new(16);
    cfg.order = Order::ShardShuffle { seed: 3, window: 1 };
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let before = src.io_counters().unwrap();
    assert_eq!(checked_epoch(&loader, 0, &samples).await, PER);
    let after = src.io_counters().unwrap();
    assert_eq!(after.remote_requests - before.remote_requests, 1, "the missing block, once: {after:?}");
    // Each batch's reader opens each block file it reads from once: the cached block's, and
    // the one the read-ahead wrote once its memory copy went.
    let batches = (PER / 16) as u64;
    let direct = after.disk_direct - before.disk_direct;
    assert!((1..=2 * batches).contains(&direct), "the blocks read from their files: {after:?}");
    assert_eq!(after.cache_corrupt, 0);
    server.shutdown().await;
}
