//! Eviction that knows the future, end to end: the real Loader over tar shards on the embedded
//! S3 server, through the real disk cache holding half of the data. LRU drops each block just
//! before the next epoch needs it again; the Loader's plan (this epoch's order and the next's)
//! keeps what the next epoch reads first and does not store what it would drop first, so the
//! second epoch fetches little more than what did not fit.

use crate::common;

use std::sync::Arc;

use common::s3::{serve, uri};
use common::*;
use stoker::loader::{Loader, LoaderConfig};
use stoker::sampler::Order;
use stoker::DynSampleSource;

const SHARDS: usize = 48;
const PER: usize = 8;
const PAYLOAD: usize = 12 << 10;

/// `SHARDS` shards of `PER` samples of `PAYLOAD` bytes; returns the samples and the bytes of
/// all shards.
fn shards(dir: &std::path::Path) -> (Vec<stoker::Sample>, u64) {
    bin_shards(dir, SHARDS, PER, PAYLOAD)
}

/// Bytes fetched from the server in each of two epochs through a fresh disk cache of `limit`
/// bytes, every row checked, and the blocks written to the disk cache in each.
async fn two_epochs(
    endpoint: &str,
    samples: &[stoker::Sample],
    order: Order,
    block: u64,
    limit: u64,
    eviction: &str,
) -> ([u64; 2], [u64; 2]) {
    let cache = tempfile::tempdir().unwrap();
    let extra = format!(
        "&hedge_ms=0&cache_block={block}&disk_cache_dir={}&disk_cache_bytes={limit}&cache_eviction={eviction}",
        cache.path().display()
    );
    let src: Arc<DynSampleSource> = open(&uri(endpoint, "tar", &extra)).await;
    let mut cfg = LoaderConfig::new(8);
    cfg.order = order;
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let (mut fetched, mut writes) = ([0; 2], [0; 2]);
    for e in 0..2 {
        let before = src.io_counters().unwrap();
        assert_eq!(checked_epoch(&loader, e as u64, samples).await, samples.len());
        let after = src.io_counters().unwrap();
        fetched[e] = after.remote_bytes - before.remote_bytes;
        writes[e] = after.disk_writes - before.disk_writes;
    }
    (fetched, writes)
}

/// Bytes fetched in each of two epochs, as shares of the data, with the plan and with LRU.
async fn compare(order: Order, block: u64) -> ([f64; 2], [f64; 2]) {
    let root = tempfile::tempdir().unwrap();
    let (samples, data) = shards(&root.path().join("data/tar"));
    let server = serve(root.path()).await;
    let ep = server.endpoint();
    let half = data / 2;
    let (planned, _) = two_epochs(&ep, &samples, order.clone(), block, half, "future").await;
    let (lru, _) = two_epochs(&ep, &samples, order.clone(), block, half, "lru").await;
    server.shutdown().await;
    for f in [planned, lru] {
        // All of it, but for the padding of the shards' last blocks that no sample needs.
        assert!(f[0] as f64 >= 0.95 * data as f64, "the first epoch fetches everything: {f:?} of {data}");
    }
    let share = |f: [u64; 2]| f.map(|x| x as f64 / data as f64);
    let (planned, lru) = (share(planned), share(lru));
    eprintln!("{order:?}, {block} B blocks: fetched {planned:.3?} of the data with the plan, {lru:.3?} with LRU");
    (planned, lru)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_half_the_data_cached_the_shard_shuffle_refetches_about_half_and_lru_most() {
    let (planned, lru) = compare(Order::ShardShuffle { seed: 3, window: 4 }, 16 << 10).await;
    assert!(planned[1] <= 0.55, "with the plan the second epoch fetched {:.3} of the data", planned[1]);
    assert!(lru[1] >= 0.8, "LRU is the control: {:.3} (plan: {:.3})", lru[1], planned[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_half_the_data_cached_the_sample_shuffle_refetches_about_half_and_lru_most() {
    // Blocks smaller than a sample, so a block is read once an epoch, as a whole shard is in
    // the shard shuffle.
    let (planned, lru) = compare(Order::Shuffle { seed: 3 }, 4 << 10).await;
    assert!(planned[1] <= 0.55, "with the plan the second epoch fetched {:.3} of the data", planned[1]);
    assert!(lru[1] >= 0.8, "LRU is the control: {:.3} (plan: {:.3})", lru[1], planned[1]);
}

/// Blocks of several samples in a per-sample shuffle over more data than the cache holds: LRU
/// fetches a whole block for each sample it misses (several times the data each epoch); the
/// plan fetches whole only the blocks it will keep long enough to read again, and just the
/// sample otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_several_samples_a_block_the_plan_fetches_whole_only_what_it_keeps() {
    let (planned, lru) = compare(Order::Shuffle { seed: 3 }, 64 << 10).await;
    assert!(planned[0] <= 1.5 && planned[1] <= 1.0, "with the plan: {planned:.3?} of the data");
    assert!(lru[0] >= 2.0 && lru[1] >= 2.0, "LRU is the control: {lru:.3?}");
}

/// Data four times the cache, shard-shuffled: every epoch reads from the store. The plan's
/// admission writes only blocks it will read again before they would go (about a
/// cache-full), where Belady's bypass alone writes blocks that later arrivals push out unread
/// and LRU writes every block; the second epoch still reads about a quarter from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_quarter_of_the_data_cached_only_blocks_read_again_are_written() {
    let root = tempfile::tempdir().unwrap();
    let (samples, data) = shards(&root.path().join("data/tar"));
    let server = serve(root.path()).await;
    let (ep, block) = (server.endpoint(), 16u64 << 10);
    let order = Order::ShardShuffle { seed: 3, window: 4 };
    let quarter = data / 4;
    let (planned, planned_writes) = two_epochs(&ep, &samples, order.clone(), block, quarter, "future").await;
    let (lru, lru_writes) = two_epochs(&ep, &samples, order, block, quarter, "lru").await;
    server.shutdown().await;
    let blocks = data.div_ceil(block);
    let held = quarter / block;
    eprintln!(
        "a quarter cached: {blocks} blocks, {held} fit; writes per epoch with the plan {planned_writes:?}, with LRU \
         {lru_writes:?}; fetched {planned:?} and {lru:?} of {data}"
    );
    assert!(lru_writes[0] as f64 >= 0.9 * blocks as f64, "LRU writes every block it fetches: {lru_writes:?}");
    // About a cache-full (shards' short last blocks let a few more fit than whole blocks
    // would): each written block is read in the next epoch. A read is matched to its planned
    // use by the reader's clock, so timing moves a few reads to another use: 82-83 writes of
    // 75 blocks run alone, 97 once in the whole suite on 2 busy cores (LRU: 336).
    assert!(planned_writes[0] <= held + held / 2, "with the plan: {planned_writes:?} writes, {held} blocks fit");
    assert!(planned_writes[0] >= held / 2, "the plan still fills the cache: {planned_writes:?}");
    // The second epoch reads what was kept from the disk: fetched less than LRU's.
    assert!(planned[1] as f64 <= 0.85 * data as f64, "epoch 2 fetched {} of {data}", planned[1]);
    assert!(planned[1] < lru[1], "the plan {planned:?}, LRU {lru:?}");
}
