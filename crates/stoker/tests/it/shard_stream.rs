//! The shard shuffle over S3 (a real s3s-fs server on loopback, behind the fault proxy that
//! logs every request): epochs are exactly-once, deterministic, resumable and partitioned
//! like the other orders, and each window's shards are read ahead in a few large requests,
//! window after window in the sampler's shard order.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::s3::{uri, with_proxy};
use common::*;
use stoker::loader::{EpochStream, Loader, LoaderConfig};
use stoker::sampler::{Order, Partition, Sampler, Tail};
use stoker::{DynSampleSource, Sample};
use stoker_testkit::proxy::{FaultPatch, ProxyHandle};

const SHARDS: usize = 12;
const PER: usize = 20;
const WINDOW: usize = 3;

struct Served {
    root: tempfile::TempDir,
    server: stoker_testkit::ServerHandle,
    proxy: ProxyHandle,
    samples: Vec<Sample>,
}

async fn served(faults: FaultPatch) -> Served {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data/tar");
    std::fs::create_dir_all(&dir).unwrap();
    let samples = tar_dir(&dir, SHARDS, PER);
    let server = common::s3::serve(root.path()).await;
    let proxy = with_proxy(&server, faults).await;
    Served { root, server, proxy, samples }
}

/// The source through the proxy; hedging off, so every request the log shows was needed.
async fn source(s: &Served) -> Arc<DynSampleSource> {
    open(&uri(&s.proxy.endpoint(), "tar", "&hedge_ms=0")).await
}

fn shard_shuffle(batch: usize, seed: u64) -> LoaderConfig {
    let mut cfg = LoaderConfig::new(batch);
    cfg.order = Order::ShardShuffle { seed, window: WINDOW };
    cfg
}

/// The source through the proxy with a fresh disk cache of `block`-byte blocks (the cache's
/// directory goes with the returned guard).
async fn cached_source(s: &Served, block: u64) -> (tempfile::TempDir, Arc<DynSampleSource>) {
    let cache = tempfile::tempdir().unwrap();
    let extra = format!("&hedge_ms=0&cache_block={block}&disk_cache_dir={}", cache.path().display());
    let src = open(&uri(&s.proxy.endpoint(), "tar", &extra)).await;
    (cache, src)
}

/// One epoch's indices, checking every row's key and bytes against the samples written.
async fn epoch(loader: &Loader, e: u64, samples: &[Sample], max_batches: usize) -> Vec<u64> {
    checked(&mut loader.epoch(e).unwrap(), samples, max_batches).await
}

/// The indices of the next `max_batches` batches of `stream` (or all it has left), checking
/// every row's key and bytes against the samples written.
async fn checked(stream: &mut EpochStream, samples: &[Sample], max_batches: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for _ in 0..max_batches {
        let Some(b) = stream.next_batch().await else { break };
        let b = b.unwrap();
        let jpg = b.field("jpg").unwrap();
        for (row, &i) in b.indices().iter().enumerate() {
            let want = &samples[i as usize];
            assert_eq!(b.key(row), Some(want.key.as_str()));
            assert_eq!(jpg.get(row).unwrap(), &want.fields[0].data[..], "sample {i}");
        }
        out.extend_from_slice(b.indices());
    }
    out
}

/// The shard each logged ranged GET read, in arrival order.
fn shard_reads(p: &ProxyHandle) -> Vec<(usize, String)> {
    p.control
        .recent_requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.range.is_some())
        .filter_map(|r| {
            let name = r.path.rsplit('/').next()?.strip_prefix("shard-")?.strip_suffix(".tar")?.to_string();
            Some((name.parse().ok()?, r.range?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_shuffle_reads_each_window_ahead_in_few_large_requests_in_sampler_order() {
    let s = served(FaultPatch::default()).await;
    let src = source(&s).await;
    let loader = Loader::new(src.clone(), shard_shuffle(16, 7)).unwrap();
    s.proxy.control.reset_stats();
    let got = epoch(&loader, 2, &s.samples, usize::MAX).await;

    let (reads, requests) = (shard_reads(&s.proxy), s.proxy.control.stats().requests as usize);

    // Exactly once, in the sampler's order, which is deterministic per (seed, epoch).
    let sampler = loader.sampler(2).unwrap();
    assert_eq!(got, sampler.iter().collect::<Vec<_>>());
    assert_eq!(got.iter().copied().collect::<BTreeSet<_>>().len(), SHARDS * PER);
    let again = Loader::new(src.clone(), shard_shuffle(5, 7)).unwrap();
    assert_eq!(epoch(&again, 2, &s.samples, usize::MAX).await, got, "same seed and epoch, same order");
    assert_ne!(epoch(&again, 3, &s.samples, usize::MAX).await, got, "another epoch, another order");

    // One ranged GET per shard (each shard is small: one part), no other request.
    assert_eq!(requests, SHARDS, "{reads:?}");
    assert_eq!(reads.iter().map(|r| r.0).collect::<BTreeSet<_>>().len(), SHARDS, "{reads:?}");
    // Window after window in the epoch's shard order (a window's shards are requested
    // together, so they may arrive in any order among themselves).
    let order: Vec<usize> = sampler.shard_order().unwrap().map(|x| x as usize).collect();
    for (w, (want, arrived)) in order.chunks(WINDOW).zip(reads.chunks(WINDOW)).enumerate() {
        let want: BTreeSet<usize> = want.iter().copied().collect();
        let arrived: BTreeSet<usize> = arrived.iter().map(|r| r.0).collect();
        assert_eq!(arrived, want, "window {w}: {reads:?}");
    }

    // The per-sample shuffle of the same source asks for far more.
    let mut cfg = LoaderConfig::new(16);
    cfg.order = Order::Shuffle { seed: 7 };
    let shuffled = Loader::new(src.clone(), cfg).unwrap();
    s.proxy.control.reset_stats();
    epoch(&shuffled, 2, &s.samples, usize::MAX).await;
    let per_sample = s.proxy.control.stats().requests as usize;
    assert!(per_sample > 2 * SHARDS, "{per_sample} requests with the per-sample shuffle");
    s.proxy.shutdown().await;
    s.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_shuffle_over_s3_resumes_mid_epoch_and_partitions_ranks() {
    let s = served(FaultPatch::default()).await;
    let src = source(&s).await;
    let cfg = |rank, world, budget| {
        let mut c = shard_shuffle(6, 3);
        c.partition = Partition::new(rank, world).unwrap();
        c.tail = Tail::Drop;
        c.max_bytes_in_flight = budget;
        c
    };
    // Two ranks: disjoint, together every sample once (240 divides evenly).
    let mut per_rank = Vec::new();
    for r in 0..2 {
        per_rank.push(epoch(&Loader::new(src.clone(), cfg(r, 2, 1 << 30)).unwrap(), 0, &s.samples, usize::MAX).await);
    }
    let all: BTreeSet<u64> = per_rank.iter().flatten().copied().collect();
    assert_eq!(all.len(), SHARDS * PER);
    assert_eq!(per_rank[0].len() + per_rank[1].len(), SHARDS * PER);

    // Each rank takes 5 batches, saves, and a new loader per rank (a 1-byte budget: one batch
    // and one window at a time) finishes the epoch with exactly the rest.
    let mut states = Vec::new();
    let mut heads = Vec::new();
    for r in 0..2 {
        let l = Loader::new(src.clone(), cfg(r, 2, 1 << 30)).unwrap();
        heads.push(epoch(&l, 0, &s.samples, 5).await);
        states.push(l.state().unwrap());
    }
    assert_eq!(states[0], states[1], "rank-synchronous: every rank saves the same state");
    let json = serde_json::to_string(&states[0]).unwrap();
    for r in 0..2 {
        let l = Loader::new(src.clone(), cfg(r as u64, 2, 1)).unwrap();
        l.load_state(serde_json::from_str(&json).unwrap()).unwrap();
        let tail = epoch(&l, 0, &s.samples, usize::MAX).await;
        assert_eq!([heads[r].clone(), tail].concat(), per_rank[r], "rank {r}");
    }
    s.proxy.shutdown().await;
    s.server.shutdown().await;
}

/// A batch that straddles two windows needs both read ahead, and holds the first until it is
/// fetched: with a budget too small for two windows (here 1 byte: one batch and one window at
/// a time), the next window is read anyway rather than wait for a release that never comes.
/// Windows of 60 samples: batches of 7 straddle every window end, batches of 61 and 130 span
/// two windows or three. An epoch that hung would fail at the timeout, not stall the suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_across_two_windows_is_served_however_small_the_budget() {
    let s = served(FaultPatch::default()).await;
    let src = source(&s).await;
    // A budget of one and a half windows of shards: one window fits, two do not.
    let shard = std::fs::metadata(s.root.path().join("data/tar/shard-0000.tar")).unwrap().len();
    for (batch, budget) in [(7, 1), (7, shard * WINDOW as u64 * 3 / 2), (61, 1), (130, 1)] {
        let mut cfg = shard_shuffle(batch, 4);
        cfg.max_bytes_in_flight = budget;
        let loader = Loader::new(src.clone(), cfg).unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(60), epoch(&loader, 1, &s.samples, usize::MAX))
            .await
            .unwrap_or_else(|_| panic!("batches of {batch} with a budget of {budget} B: the epoch hung"));
        assert_eq!(got, loader.sampler(1).unwrap().iter().collect::<Vec<_>>(), "batches of {batch}");
    }
    s.proxy.shutdown().await;
    s.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_shuffle_epochs_survive_503s_and_resets_with_the_right_bytes() {
    let faults = FaultPatch { slowdown: Some(0.2), reset: Some(0.05), seed: Some(11), ..Default::default() };
    let s = served(FaultPatch::default()).await;
    let src = source(&s).await;
    s.proxy.control.apply(&faults).unwrap();
    let loader = Loader::new(src, shard_shuffle(10, 1)).unwrap();
    let got = epoch(&loader, 0, &s.samples, usize::MAX).await;
    assert_eq!(got, loader.sampler(0).unwrap().iter().collect::<Vec<_>>());
    assert!(s.proxy.control.stats().slowdowns > 0);
    s.proxy.shutdown().await;
    s.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_shuffle_on_a_source_without_shards_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    objects_dir(dir.path());
    let src = open(dir.path().to_str().unwrap()).await;
    let err = Loader::new(src, shard_shuffle(4, 0)).err().expect("objects have no shards").to_string();
    assert!(err.contains("not made of shards") && err.contains("shuffle=True"), "{err}");
}

/// Window boundaries never split a shard's samples from their window, with any batch size.
#[test]
fn windows_of_a_sampler_hold_their_shards_samples() {
    let sizes: Vec<u64> = vec![PER as u64; SHARDS];
    let layout = Arc::new(stoker::sampler::ShardLayout::from_sizes(&sizes).unwrap());
    let mut cfg =
        stoker::sampler::SamplerConfig::new((SHARDS * PER) as u64, Order::ShardShuffle { seed: 1, window: 5 });
    cfg.shards = Some(layout.clone());
    let s = Sampler::new(cfg).unwrap();
    let windows = s.shard_windows().unwrap();
    assert_eq!(windows.len(), SHARDS.div_ceil(5));
    let mut by_window: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
    for (w, win) in windows.iter().enumerate() {
        for k in win.items.clone() {
            let i = s.get(k).unwrap();
            by_window.entry(w).or_default().insert(i / PER as u64);
        }
        assert_eq!(by_window[&w], win.shards.iter().copied().collect::<BTreeSet<_>>());
    }
}

/// With a disk cache the read-ahead goes through it: the next epoch makes no request at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_shuffle_read_ahead_fills_the_disk_cache() {
    let s = served(FaultPatch::default()).await;
    let (_cache, src) = cached_source(&s, 65536).await;
    let loader = Loader::new(src, shard_shuffle(8, 5)).unwrap();
    s.proxy.control.reset_stats();
    let first = epoch(&loader, 0, &s.samples, usize::MAX).await;
    assert!(s.proxy.control.stats().requests as usize <= 4 * SHARDS, "{:?}", shard_reads(&s.proxy));
    s.proxy.control.reset_stats();
    let second = epoch(&loader, 1, &s.samples, usize::MAX).await;
    assert_eq!(s.proxy.control.stats().requests, 0, "{:?}", shard_reads(&s.proxy));
    assert_eq!(first.iter().copied().collect::<BTreeSet<_>>(), second.iter().copied().collect::<BTreeSet<_>>());
    assert_ne!(first, second);
    s.proxy.shutdown().await;
    s.server.shutdown().await;
}

/// The hit path: with every block on disk, a warm epoch (per-sample shuffle and shard shuffle)
/// reads the block files straight into the batches, with no request; blocks that vanish
/// behind the cache's back (another process evicting them) are fetched again, never served
/// wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_epochs_read_the_block_files_and_survive_blocks_gone_missing() {
    let s = served(FaultPatch::default()).await;
    let (cache, src) = cached_source(&s, 4096).await;
    for order in [Order::Shuffle { seed: 2 }, Order::ShardShuffle { seed: 2, window: WINDOW }] {
        let mut cfg = LoaderConfig::new(8);
        cfg.order = order.clone();
        let loader = Loader::new(src.clone(), cfg).unwrap();
        epoch(&loader, 0, &s.samples, usize::MAX).await;
        // The blocks epoch 0 wrote behind its reads must be on disk for the hit path to see them.
        src.flush().await;
        s.proxy.control.reset_stats();
        let before = src.io_counters().unwrap();
        epoch(&loader, 1, &s.samples, usize::MAX).await;
        assert_eq!(s.proxy.control.stats().requests, 0, "{order:?}: a warm epoch makes no request");
        let after = src.io_counters().unwrap();
        let (hits, direct) = (after.disk_hits - before.disk_hits, after.disk_direct - before.disk_direct);
        // A block the cache lost track of for a moment (its rescan of the directory raced a
        // write behind a read, on a loaded machine) is read from its file the usual way: no
        // request either, only not straight into the batch.
        assert!(
            direct > 0 && direct * 10 >= hits * 9,
            "{order:?}: blocks straight from their files: {direct} of {hits}"
        );
    }
    // Callers that want samples (a decoding loader, a mix) take the same hit path.
    s.proxy.control.reset_stats();
    let before = src.io_counters().unwrap();
    let all: Vec<usize> = (0..src.len()).rev().collect();
    for chunk in all.chunks(8) {
        let got = src.get_many(chunk).await.unwrap();
        for (&i, g) in chunk.iter().zip(&got) {
            assert_eq!(g, &s.samples[i]);
        }
    }
    assert_eq!(s.proxy.control.stats().requests, 0, "warm get_many makes no request");
    let after = src.io_counters().unwrap();
    let (hits, direct) = (after.disk_hits - before.disk_hits, after.disk_direct - before.disk_direct);
    assert!(direct > 0 && direct == hits, "get_many: every block straight from its file: {direct} of {hits}");
    // Every third block file goes; the cache still believes it holds them.
    let mut removed = 0;
    for sub in std::fs::read_dir(cache.path()).unwrap().flatten().filter(|e| e.path().is_dir()) {
        for (i, f) in std::fs::read_dir(sub.path()).unwrap().flatten().enumerate() {
            if i % 3 == 0 {
                std::fs::remove_file(f.path()).unwrap();
                removed += 1;
            }
        }
    }
    assert!(removed > 0);
    let mut cfg = LoaderConfig::new(8);
    cfg.order = Order::Shuffle { seed: 5 };
    let loader = Loader::new(src.clone(), cfg).unwrap();
    s.proxy.control.reset_stats();
    let got = epoch(&loader, 3, &s.samples, usize::MAX).await;
    assert_eq!(got.iter().copied().collect::<BTreeSet<_>>().len(), SHARDS * PER);
    assert!(s.proxy.control.stats().requests > 0, "the missing blocks were fetched again");
    for i in (0..src.len()).step_by(3) {
        let chunk = [i, (i + 7) % src.len()];
        let got = src.get_many(&chunk).await.unwrap();
        assert_eq!((&got[0], &got[1]), (&s.samples[chunk[0]], &s.samples[chunk[1]]));
    }
    s.proxy.shutdown().await;
    s.server.shutdown().await;
}

/// Windows the disk cache holds whole hold nothing in memory, so they do not keep the
/// read-ahead from the next window that needs fetching: with every shard cached but the last
/// window's, that window is requested while the first window's batches are still being read
/// (the consumer has taken one batch, the loader prefetches four of fifteen), not once the
/// epoch reaches it. Every row is still the shard's, and only the last window is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_ahead_runs_past_windows_the_disk_cache_holds_to_the_one_it_must_fetch() {
    let s = served(FaultPatch::default()).await;
    let (_cache, src) = cached_source(&s, 65536).await;
    let loader = Loader::new(src.clone(), shard_shuffle(4, 11)).unwrap();
    let order: Vec<usize> = loader.sampler(0).unwrap().shard_order().unwrap().map(|x| x as usize).collect();
    let last: BTreeSet<usize> = order[SHARDS - WINDOW..].iter().copied().collect();
    // Every other shard into the disk cache.
    let cached: Vec<usize> = (0..SHARDS * PER).filter(|i| !last.contains(&(i / PER))).collect();
    for chunk in cached.chunks(PER) {
        src.get_many(chunk).await.unwrap();
    }
    src.flush().await;
    s.proxy.control.reset_stats();

    let mut stream = loader.epoch(0).unwrap();
    let mut seen = checked(&mut stream, &s.samples, 1).await;
    assert!(seen.iter().all(|&i| order[..WINDOW].contains(&(i as usize / PER))), "window 0 first");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !shard_reads(&s.proxy).iter().any(|r| last.contains(&r.0)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the last window was not read ahead: {:?}",
            shard_reads(&s.proxy)
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    seen.extend(checked(&mut stream, &s.samples, usize::MAX).await);
    assert_eq!(seen.iter().copied().collect::<BTreeSet<_>>().len(), SHARDS * PER, "each sample once");
    let fetched: BTreeSet<usize> = shard_reads(&s.proxy).iter().map(|r| r.0).collect();
    assert_eq!(fetched, last, "only the last window's shards were fetched");
    s.proxy.shutdown().await;
    s.server.shutdown().await;
}
