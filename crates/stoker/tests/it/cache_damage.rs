//! A damaged disk cache costs requests, never wrong bytes: block files flipped, cut short,
//! deleted, swapped with each other, replaced by a FIFO or a directory, or left half-written
//! by a killed writer between two runs over the embedded S3 server are refused, counted
//! (`cache_corrupt`), fetched again from the store and replaced; what the source delivers is
//! exactly what the shards hold, through the batch hit path (`get_many`, straight from block
//! files) and the block path (`get`: a sample's chunks read from its block file, or the
//! whole block read and verified).

use crate::common;

use common::*;
use stoker::DynSampleSource;

/// Every block file in the cache directory, sorted.
fn block_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten().map(|f| f.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect();
    out.sort();
    out
}

async fn read_all(src: &std::sync::Arc<DynSampleSource>, batched: bool) -> Vec<stoker::Sample> {
    let all: Vec<usize> = (0..src.len()).collect();
    let mut out = Vec::new();
    if batched {
        // Batches of 10: a batch whose blocks are all on disk (as far as the process knows)
        // takes the hit path, the others the block path.
        for batch in all.chunks(10) {
            out.extend(src.get_many(batch).await.unwrap());
        }
        return out;
    }
    for i in all {
        out.push(src.get(i).await.unwrap());
    }
    out
}

/// Damage the cache in every way at once, then check what the next run delivers and counts.
async fn damage_is_refused_and_refetched(batched: bool) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/tar")).unwrap();
    // 3 shards of 40 samples of a few KiB: with 16 KiB blocks, dozens of blocks.
    let samples = tar_dir(&root.path().join("data/tar"), 3, 40);
    let server = common::s3::serve(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let uri = common::s3::uri(
        &server.endpoint(),
        "tar",
        &format!("&disk_cache_dir={}&cache_block=16384&cache_eviction=lru", cache.path().display()),
    );
    let first = open(&uri).await;
    assert_eq!(read_all(&first, true).await, samples);
    first.flush().await;
    drop(first);

    let files = block_files(cache.path());
    assert!(files.len() >= 14, "only {} blocks cached", files.len());
    // Flip a byte in the middle of one, cut one short, delete one, swap two (each is now a
    // whole, well-formed block of another key), and leave one half-written as a writer
    // killed between write and rename would if it had written in place.
    let flip = &files[0];
    let mut b = std::fs::read(flip).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x20;
    std::fs::write(flip, b).unwrap();
    let cut = &files[2];
    let b = std::fs::read(cut).unwrap();
    std::fs::write(cut, &b[..b.len() - 100]).unwrap();
    std::fs::remove_file(&files[4]).unwrap();
    let (x, y) = (std::fs::read(&files[6]).unwrap(), std::fs::read(&files[8]).unwrap());
    std::fs::write(&files[6], &y).unwrap();
    std::fs::write(&files[8], &x).unwrap();
    let half = &files[10];
    let b = std::fs::read(half).unwrap();
    std::fs::write(half, &b[..b.len() / 2]).unwrap();
    // The trailer of another: its bytes intact, the tail that names it zeroed.
    let tail = &files[11];
    let mut b = std::fs::read(tail).unwrap();
    let n = b.len();
    b[n - 20..n - 10].fill(0);
    std::fs::write(tail, b).unwrap();
    // A FIFO in a block's place (an open for reading would wait for a writer forever), and
    // an empty directory in another's (every write of that block would fail on it).
    std::fs::remove_file(&files[12]).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&files[12]).status().unwrap();
    assert!(made.success());
    std::fs::remove_file(&files[13]).unwrap();
    std::fs::create_dir(&files[13]).unwrap();
    // flip, cut, two swapped, half, tail, the FIFO, the directory (the deleted one is a
    // plain miss)
    let damaged = 8;

    let second = open(&uri).await;
    let before = second.io_counters().unwrap();
    let got = tokio::time::timeout(std::time::Duration::from_secs(120), read_all(&second, batched))
        .await
        .expect("the run over the damaged cache finished");
    for (i, (g, want)) in got.iter().zip(&samples).enumerate() {
        assert!(g == want, "sample {i} ({}) is not the shard's: a damaged block was served", want.key);
    }
    assert_eq!(got.len(), samples.len());
    second.flush().await;
    let io = second.io_counters().unwrap();
    assert_eq!(io.cache_corrupt, damaged, "every damaged block counted once, the deleted one not at all");
    assert!(io.remote_requests - before.remote_requests >= 1, "the refused blocks were fetched again from the store");
    drop(second);

    // The refetched blocks replaced the damaged ones: a third run is all disk hits.
    let third = open(&uri).await;
    let opened = third.io_counters().unwrap();
    assert_eq!(read_all(&third, batched).await, samples);
    let io = third.io_counters().unwrap();
    assert_eq!(io.cache_corrupt, 0, "the damaged blocks were replaced by good ones");
    assert_eq!(io.remote_requests, opened.remote_requests, "every sample from the disk cache");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_blocks_are_never_served_by_the_hit_path() {
    damage_is_refused_and_refetched(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_blocks_are_never_served_by_the_block_path() {
    damage_is_refused_and_refetched(false).await;
}

/// With per-member digests (a shard packed by `stoker pack`, or indexed with checksums), a
/// damaged cache block used to fail every later run and blame the healthy remote shard;
/// now it is refetched and the read succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_is_not_blamed_on_a_shard_with_digests() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/tar")).unwrap();
    let samples = tar_dir(&root.path().join("data/tar"), 2, 30);
    let server = common::s3::serve(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let uri = common::s3::uri(
        &server.endpoint(),
        "tar",
        &format!("&disk_cache_dir={}&cache_block=16384&checksums=true", cache.path().display()),
    );
    let first = open(&uri).await;
    assert_eq!(read_all(&first, true).await, samples);
    first.flush().await;
    drop(first);
    for f in block_files(cache.path()) {
        let mut b = std::fs::read(&f).unwrap();
        b[100] ^= 1;
        std::fs::write(&f, b).unwrap();
    }
    for run in 0..2 {
        let src = open(&uri).await;
        assert_eq!(read_all(&src, true).await, samples, "run {run}");
        src.flush().await;
    }
    server.shutdown().await;
}
