//! Faults, nothing lost: a whole epoch through the Loader from S3 behind the fault proxy
//! (503 SlowDown, connection resets, truncated bodies, latency spikes) delivers every sample
//! exactly once with its own bytes; past the retry budget a read fails clearly, in bounded
//! time, through the Loader too.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::s3::{uri, with_proxy, SK};
use common::*;
use futures::StreamExt;
use stoker::loader::{ErrorPolicy, Loader, LoaderConfig};
use stoker::sampler::Order;
use stoker::DynSampleSource;
use stoker_testkit::proxy::FaultPatch;

const SHARDS: usize = 20;
const PER_SHARD: usize = 1000;

/// The bytes sample `key` must hold: derivable from the key alone, of a length that varies
/// with it, so a sample delivered with another's bytes (or cut short) cannot pass.
fn content(key: &str) -> Vec<u8> {
    let h = key.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    let mut out = format!("{key}:{h:016x}:").into_bytes();
    out.extend((0..(h % 97) as usize).map(|i| (h >> (i % 8 * 8)) as u8 ^ i as u8));
    out
}

fn key(shard: usize, i: usize) -> String {
    format!("s{shard:02}/{i:05}")
}

/// `SHARDS` tar shards of `PER_SHARD` one-field samples under `dir`.
fn write_shards(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    for s in 0..SHARDS {
        let samples: Vec<_> = (0..PER_SHARD).map(|i| sample(&key(s, i), &[("bin", content(&key(s, i)))])).collect();
        write_tar(&dir.join(format!("shard-{s:02}.tar")), &samples);
    }
}

/// Every key of the epoch, each checked against its bytes; panics on a duplicate.
async fn run_epoch(loader: &Loader) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut stream = loader.epoch(0).unwrap();
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap_or_else(|e| panic!("a batch failed despite retries: {e}"));
        let bin = batch.field("bin").unwrap();
        for row in 0..batch.len() {
            let k = batch.key(row).unwrap();
            assert_eq!(bin.get(row).unwrap(), &content(k)[..], "sample {k} has someone else's bytes");
            assert!(seen.insert(k.to_string()), "sample {k} delivered twice");
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_under_faults_delivers_every_sample_once_with_its_bytes() {
    let root = tempfile::tempdir().unwrap();
    write_shards(&root.path().join("data/faulty"));
    let server = common::s3::serve(root.path()).await;
    let index_dir = tempfile::tempdir().unwrap();
    let proxy = with_proxy(
        &server,
        FaultPatch {
            slowdown: Some(0.05),
            reset: Some(0.01),
            truncate: Some(0.01),
            spike_prob: Some(0.02),
            spike_ms: Some(1000),
            seed: Some(20),
            ..Default::default()
        },
    )
    .await;
    // Small reads make thousands of requests, so every kind of fault happens many times;
    // short backoff keeps the test quick (the policy is the same). Opening walks the shard
    // headers through the proxy too.
    let opts = format!(
        "&backoff_ms=5&attempts=12&hedge_ms=250&max_read=16384&index_dir={}&write_sidecar=false",
        index_dir.path().display()
    );
    let src: Arc<DynSampleSource> = open(&uri(&proxy.endpoint(), "faulty", &opts)).await;
    assert_eq!(src.len(), SHARDS * PER_SHARD);
    let mut cfg = LoaderConfig::new(50);
    cfg.order = Order::Sequential;
    cfg.prefetch = 8;
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let seen = run_epoch(&loader).await;

    let all: HashSet<String> = (0..SHARDS).flat_map(|s| (0..PER_SHARD).map(move |i| key(s, i))).collect();
    assert_eq!(seen.len(), all.len(), "every sample delivered");
    assert_eq!(seen, all);
    let stats = loader.stats();
    assert_eq!((stats.samples, stats.errors, stats.skipped), (all.len() as u64, 0, 0), "{stats:?}");
    let io = src.io_counters().unwrap();
    let faults = proxy.control.stats();
    eprintln!("proxy: {faults:?}\nio: {io:?}");
    assert!(faults.slowdowns > 0 && faults.resets > 0 && faults.truncations > 0 && faults.spikes > 0, "{faults:?}");
    assert!(io.retries > 0, "retries counted: {io:?}");
    assert!(io.hedges > 0, "latency spikes were hedged: {io:?}");
}

/// A small dataset, and a source over it through a proxy that is then made to fail every
/// request in `faults`' way.
async fn failing_source(
    faults: FaultPatch,
    extra: &str,
) -> (tempfile::TempDir, stoker_testkit::ServerHandle, stoker_testkit::proxy::ProxyHandle, Arc<DynSampleSource>) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data/small");
    std::fs::create_dir_all(&dir).unwrap();
    let samples: Vec<_> = (0..12).map(|i| sample(&key(0, i), &[("bin", content(&key(0, i)))])).collect();
    write_tar(&dir.join("shard-00.tar"), &samples);
    let server = common::s3::serve(root.path()).await;
    let proxy = with_proxy(&server, FaultPatch::default()).await;
    let src = open(&uri(&proxy.endpoint(), "small", &format!("&backoff_ms=5&hedge_ms=0{extra}"))).await;
    proxy.control.apply(&faults).unwrap();
    (root, server, proxy, src)
}

/// Generous: a hang guard, not a speed assertion.
const HANG_GUARD: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_retry_budget_the_loader_reports_the_object_and_attempts() {
    for (what, faults, extra) in [
        ("503", FaultPatch { slowdown: Some(1.0), ..Default::default() }, ""),
        ("reset", FaultPatch { reset: Some(1.0), ..Default::default() }, ""),
        ("truncated", FaultPatch { truncate: Some(1.0), ..Default::default() }, ""),
        // A server that accepts and never answers: each attempt ends at its time limit.
        ("silent", FaultPatch { latency_ms: Some(600_000), ..Default::default() }, "&timeout_ms=300"),
    ] {
        let (_root, _server, proxy, src) = failing_source(faults, &format!("&attempts=3{extra}")).await;
        let loader = Loader::new(src, LoaderConfig::new(4)).unwrap();
        let first = tokio::time::timeout(HANG_GUARD, async {
            let mut stream = loader.epoch(0).unwrap();
            stream.next().await
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: the loader hung"))
        .expect("a failed batch is delivered as an error, not an empty epoch");
        let e = first.expect_err("every request fails");
        let msg = e.to_string();
        assert!(msg.contains("shard-00.tar") && msg.contains("3 attempt"), "{what}: {msg}");
        assert!(e.is_retryable(), "{what}: transient faults stay retryable for the caller: {e:?}");
        assert!(!msg.contains(SK), "{what}: {msg}");
        let tried = proxy.control.stats().requests;
        assert!(tried >= 3, "{what}: three attempts reached the proxy, saw {tried}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_retry_budget_the_skip_policy_counts_every_sample_and_ends() {
    let (_root, _server, _proxy, src) =
        failing_source(FaultPatch { slowdown: Some(1.0), ..Default::default() }, "&attempts=2").await;
    let mut cfg = LoaderConfig::new(5);
    cfg.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(src, cfg).unwrap();
    let delivered = tokio::time::timeout(HANG_GUARD, async {
        let mut stream = loader.epoch(0).unwrap();
        let mut n = 0;
        while let Some(b) = stream.next().await {
            n += b.map(|b| b.len()).unwrap_or(0);
        }
        n
    })
    .await
    .expect("the epoch ends");
    assert_eq!(delivered, 0);
    let stats = loader.stats();
    assert_eq!(stats.skipped, 12, "every unreadable sample is counted: {stats:?}");
}
