//! Several ranks on one node sharing one disk cache: the real Loader, four of them (each its
//! own source and block cache, as four processes have), reading the same shard-shuffled epoch
//! at once from tar shards on the embedded S3 server behind a proxy adding latency. In a
//! shard shuffle the ranks take turns within the same window of shards, so they want the
//! same blocks at about the same time: each block must be fetched once for the node, not
//! once per rank.

use crate::common;

use std::sync::Arc;

use common::s3::{serve, uri, with_proxy};
use common::*;
use stoker::loader::{Loader, LoaderConfig};
use stoker::sampler::{Order, Partition};
use stoker::DynSampleSource;
use stoker_testkit::proxy::FaultPatch;

const SHARDS: usize = 16;
const PER: usize = 24;
const PAYLOAD: usize = 12 << 10;
const RANKS: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_ranks_sharing_a_disk_cache_fetch_each_byte_about_once() {
    let root = tempfile::tempdir().unwrap();
    let (all, data) = bin_shards(&root.path().join("data/tar"), SHARDS, PER, PAYLOAD);
    let all = Arc::new(all);
    let server = serve(root.path()).await;
    // Latency keeps the ranks' requests in flight together, as over a real link.
    let proxy = with_proxy(&server, FaultPatch { latency_ms: Some(20), ..Default::default() }).await;
    let cache = tempfile::tempdir().unwrap();
    let extra = format!("&hedge_ms=0&cache_block={}&disk_cache_dir={}", 64 << 10, cache.path().display());
    let u = uri(&proxy.endpoint(), "tar", &extra);
    // All open first, then read together: the ranks of a job start their epochs at a barrier.
    let mut sources = Vec::new();
    for _ in 0..RANKS {
        sources.push(open(&u).await);
    }
    let mut ranks = Vec::new();
    for (r, src) in (0..RANKS).zip(sources) {
        let src: Arc<DynSampleSource> = src;
        let mut cfg = LoaderConfig::new(8);
        cfg.order = Order::ShardShuffle { seed: 5, window: 4 };
        cfg.partition = Partition::new(r, RANKS).unwrap().on_node(r, RANKS).unwrap();
        let loader = Loader::new(src.clone(), cfg).unwrap();
        let all = all.clone();
        let before = src.io_counters().unwrap().remote_bytes;
        ranks.push(tokio::spawn(async move {
            let mut stream = loader.epoch(0).unwrap();
            let mut seen = Vec::new();
            while let Some(b) = stream.next_batch().await {
                let b = b.unwrap();
                let col = b.field("bin").unwrap();
                for (row, &i) in b.indices().iter().enumerate() {
                    assert_eq!(col.get(row).unwrap(), &all[i as usize].fields[0].data[..], "rank {r}, sample {i}");
                    seen.push(i);
                }
            }
            drop(stream);
            let io = src.io_counters().unwrap();
            (seen, io.remote_bytes - before, io.lease_waits)
        }));
    }
    let (mut seen, mut fetched, mut waited) = (Vec::new(), Vec::new(), 0);
    for r in ranks {
        let (s, f, w) = r.await.unwrap();
        seen.extend(s);
        fetched.push(f);
        waited += w;
    }
    proxy.shutdown().await;
    server.shutdown().await;
    seen.sort_unstable();
    assert_eq!(seen, (0..all.len() as u64).collect::<Vec<_>>(), "the ranks together read every sample once");
    let total: u64 = fetched.iter().sum();
    let share = total as f64 / data as f64;
    eprintln!("{RANKS} ranks fetched {fetched:?} bytes: {share:.3} of the data ({data} bytes); {waited} lease waits");
    // Without the leases each rank fetches most blocks itself: 3.5 times the data here.
    assert!(share <= 1.1, "the node fetched {share:.3} of the data ({fetched:?} by rank)");
    assert!(waited > 0, "blocks were read from the cache after another rank's fetch");
}

/// A rank learns of the blocks other ranks stored only now and then (it rescans the
/// directory), so a read often finds "missing" blocks that are on disk by now. Blocks missing
/// together are fetched in one request; one of them stored by another rank must be read from
/// disk and left out of that request, not fetched again along with its neighbours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_another_rank_stored_is_not_fetched_again_with_its_neighbours() {
    const BLOCK: u64 = 4096;
    let root = tempfile::tempdir().unwrap();
    let (all, shard) = bin_shards(&root.path().join("data/tar"), 1, PER, PAYLOAD);
    let server = serve(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let extra = format!("&hedge_ms=0&cache_block={BLOCK}&disk_cache_dir={}", cache.path().display());
    let u = uri(&server.endpoint(), "tar", &extra);
    // Both open before either reads: neither knows of the other's blocks.
    let (a, b) = (open(&u).await, open(&u).await);
    let remote = |s: &Arc<DynSampleSource>| s.io_counters().unwrap().remote_bytes;
    let (a0, b0) = (remote(&a), remote(&b));
    // Rank b reads the samples in the middle of the shard, and its blocks land on disk.
    let middle: Vec<usize> = (PER / 3..2 * PER / 3).collect();
    b.get_many(&middle).await.unwrap();
    b.flush().await;
    let by_b = remote(&b) - b0;
    assert!(by_b >= (middle.len() * PAYLOAD) as u64, "rank b fetched its samples ({by_b} bytes)");
    // Rank a reads the whole shard in one batch: one run of missing blocks, as far as it knows.
    let every: Vec<usize> = (0..PER).collect();
    let got = a.get_many(&every).await.unwrap();
    for (s, want) in got.iter().zip(&all) {
        assert_eq!(s.fields[0].data, want.fields[0].data);
    }
    let by_a = remote(&a) - a0;
    // Each block once for the two: the shard, rounded out to blocks at the two seams.
    assert!(
        by_a + by_b <= shard + 2 * BLOCK,
        "ranks a and b fetched {by_a} + {by_b} bytes of a {shard}-byte shard: a fetched b's blocks again"
    );
    server.shutdown().await;
}
