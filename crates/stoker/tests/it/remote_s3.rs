//! The layouts over S3: a real S3 server (s3s-fs, in-process on loopback) and a fault and
//! latency proxy in front of it. Same conformance suite as the local layouts.

use crate::common;

use std::time::{Duration, Instant};

use common::s3::{uri, with_proxy, AK, SK};
use common::*;
use stoker::conformance::run_all;
use stoker::{Error, Layout, Sample, SourceOptions};
use stoker_testkit::proxy::FaultPatch;
use stoker_testkit::s3::{self, S3ServerConfig};

struct Server {
    _root: tempfile::TempDir,
    handle: stoker_testkit::ServerHandle,
    /// Samples written under `data/tar` (3 shards) and `data/objects`.
    tar: Vec<Sample>,
    objects: Vec<Sample>,
}

async fn server() -> Server {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("data");
    std::fs::create_dir_all(bucket.join("tar")).unwrap();
    std::fs::create_dir_all(bucket.join("objects")).unwrap();
    let tar = tar_dir(&bucket.join("tar"), 3, 7);
    let objects = objects_dir(&bucket.join("objects"));
    // The hidden file objects_dir adds would be a sample name on S3 only if listed; it is
    // skipped by the same rule as locally.
    let handle = common::s3::serve(root.path()).await;
    Server { _root: root, handle, tar, objects }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_tar_and_objects_over_s3() {
    let s = server().await;
    let ep = s.handle.endpoint();
    let src = open(&uri(&ep, "tar", "")).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Tar));
    assert_eq!(src.info().shards, 3);
    run_all(src, &s.tar, "s3://data/tar", &[SK]).await;
    let src = open(&uri(&ep, "objects", "")).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Objects));
    run_all(src, &s.objects, "s3://data/objects", &[SK]).await;
    // A brace pattern names shards without listing.
    let src = open(&uri(&ep, "tar/shard-{0001..0002}.tar", "")).await;
    run_all(src, &s.tar[7..], "shard-{0001..0002}.tar", &[SK]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_show_and_bad_ones_fail_clearly() {
    let s = server().await;
    let ep = s.handle.endpoint();
    let src = open(&uri(&ep, "tar", "")).await;
    assert!(!format!("{src} {src:?}").contains(SK));
    let opts = SourceOptions::from_query(&format!("access_key_id={AK}&secret_access_key={SK}")).unwrap();
    assert!(!format!("{opts:?}").contains(SK) && !format!("{opts:?}").contains(AK), "{opts:?}");

    let wrong = format!("s3://data/tar?endpoint={ep}&access_key_id={AK}&secret_access_key=wrong-secret-123");
    let e = stoker::open(&wrong, Default::default()).await.unwrap_err();
    let msg = e.to_string();
    assert!(!msg.contains("wrong-secret-123"), "{msg}");
    assert!(msg.contains("s3://data/tar") && msg.contains("credentials"), "{msg}");
    assert!(!e.is_retryable());

    // No credentials anywhere (the tests never set AWS_* variables).
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        let e = stoker::open(&format!("s3://data/tar?endpoint={ep}"), Default::default()).await.unwrap_err();
        assert!(e.to_string().contains("AWS_ACCESS_KEY_ID") && e.to_string().contains("anonymous"), "{e}");
    }
    let e = stoker::open(&uri(&ep, "nothing-here", ""), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e:?}");
}

/// Read every sample of `src` through `get_many` batches and compare.
async fn full_pass(src: &stoker::DynSampleSource, expected: &[Sample]) {
    let idx: Vec<usize> = (0..src.len()).collect();
    for chunk in idx.chunks(5) {
        let got = src.get_many(chunk).await.unwrap_or_else(|e| panic!("batch {chunk:?}: {e}"));
        for (g, &i) in got.iter().zip(chunk) {
            assert_eq!(g, &expected[i], "sample {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_retried_and_nothing_is_lost() {
    let s = server().await;
    let p = with_proxy(
        &s.handle,
        FaultPatch {
            slowdown: Some(0.05),
            reset: Some(0.02),
            truncate: Some(0.02),
            seed: Some(7),
            ..Default::default()
        },
    )
    .await;
    // Short backoff keeps the test quick; the policy is the same.
    let src = open(&uri(&p.endpoint(), "tar", "&backoff_ms=5&attempts=10&hedge_ms=0")).await;
    for _ in 0..4 {
        full_pass(&*src, &s.tar).await;
    }
    let objects = open(&uri(&p.endpoint(), "objects", "&backoff_ms=5&attempts=10&hedge_ms=0")).await;
    for _ in 0..4 {
        full_pass(&*objects, &s.objects).await;
    }
    let faults = p.control.stats();
    assert!(faults.slowdowns + faults.resets + faults.truncations > 0, "faults were injected: {faults:?}");
    let retries = src.io_counters().unwrap().retries + objects.io_counters().unwrap().retries;
    assert!(retries > 0, "retries counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_storm_fails_within_the_retry_budget_naming_the_object() {
    let s = server().await;
    let p = with_proxy(&s.handle, FaultPatch::default()).await;
    let src = open(&uri(&p.endpoint(), "tar", "&backoff_ms=10&attempts=4&hedge_ms=0")).await;
    p.control.apply(&FaultPatch { slowdown: Some(1.0), ..Default::default() }).unwrap();
    let t = Instant::now();
    let e = src.get(3).await.unwrap_err();
    let elapsed = t.elapsed();
    let msg = e.to_string();
    assert!(msg.contains("shard-0000.tar") && msg.contains("4 attempt"), "{msg}");
    assert!(msg.contains("503") || msg.contains("SlowDown"), "{msg}");
    assert!(e.is_retryable(), "a storm is transient: a later retry may succeed: {e:?}");
    // 4 attempts with 10, 20, 40 ms of (jittered) backoff: well under a second.
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert!(!msg.contains(SK));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stragglers_are_hedged() {
    let s = server().await;
    let p = with_proxy(&s.handle, FaultPatch::default()).await;
    let src = open(&uri(&p.endpoint(), "tar", "&hedge_ms=40")).await;
    p.control
        .apply(&FaultPatch { spike_prob: Some(0.3), spike_ms: Some(400), seed: Some(3), ..Default::default() })
        .unwrap();
    let t = Instant::now();
    for i in 0..src.len() {
        assert_eq!(src.get(i).await.unwrap(), s.tar[i]);
    }
    let c = src.io_counters().unwrap();
    assert!(c.hedges > 0 && c.hedge_wins > 0, "{c:?}");
    // Without hedging ~30% of 21 requests would wait 400 ms (~2.5 s).
    assert!(t.elapsed() < Duration::from_millis(2500), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cache_serves_repeat_epochs_without_requests() {
    let s = server().await;
    let ep = s.handle.endpoint();
    let src = open(&uri(&ep, "tar", "&cache_bytes=67108864&cache_block=65536")).await;
    full_pass(&*src, &s.tar).await;
    let first = src.io_counters().unwrap();
    full_pass(&*src, &s.tar).await;
    let second = src.io_counters().unwrap();
    assert!(first.cache_misses > 0);
    assert_eq!(second.cache_misses, first.cache_misses, "the second epoch is all hits: {second:?}");
    assert!(second.cache_hits > first.cache_hits);
    // Concurrent readers of one block make one request (single flight).
    let cold = open(&uri(&ep, "tar", "&cache_bytes=67108864&cache_block=1048576")).await;
    let before = cold.io_counters().unwrap();
    let gets: Vec<_> = (0..7).map(|i| cold.get(i)).collect();
    for (i, g) in futures::future::join_all(gets).await.into_iter().enumerate() {
        assert_eq!(g.unwrap(), s.tar[i]);
    }
    let after = cold.io_counters().unwrap();
    // A get that reaches the cache after the first one's block has landed is a hit, not a
    // miss (on a loaded machine the local server can answer before the last get is polled):
    // every get is one or the other, and there is one request whatever the timing.
    let (misses, hits) = (after.cache_misses - before.cache_misses, after.cache_hits - before.cache_hits);
    assert_eq!(misses + hits, 7, "{after:?}");
    assert!(misses >= 1, "{after:?}");
    assert_eq!(after.remote_requests - before.remote_requests, 1, "seven gets of one block, one request: {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_batch_through_small_cache_blocks_costs_no_more_requests_than_without_a_cache() {
    let s = server().await;
    let ep = s.handle.endpoint();
    let n = s.tar.len().min(64);
    let idx: Vec<usize> = (0..n).collect();
    let plain = open(&uri(&ep, "tar", "")).await;
    let opened = plain.io_counters().unwrap().remote_requests;
    assert_eq!(plain.get_many(&idx).await.unwrap(), s.tar[..n]);
    let uncached = plain.io_counters().unwrap().remote_requests - opened;
    // 4 KiB blocks: the batch spans many blocks, fetched as adjacent runs, not one by one.
    let cached = open(&uri(&ep, "tar", "&cache_bytes=67108864&cache_block=4096")).await;
    let before = cached.io_counters().unwrap();
    assert_eq!(cached.get_many(&idx).await.unwrap(), s.tar[..n]);
    let after = cached.io_counters().unwrap();
    let misses = after.cache_misses - before.cache_misses;
    let requests = after.remote_requests - before.remote_requests;
    assert!(misses > 4 * uncached.max(1), "the batch should span many blocks: {after:?}");
    assert!(requests <= uncached.max(1), "{requests} requests with the cache, {uncached} without: {after:?}");
    // And the blocks are cached: the same batch again makes no request.
    assert_eq!(cached.get_many(&idx).await.unwrap(), s.tar[..n]);
    assert_eq!(cached.io_counters().unwrap().remote_requests, after.remote_requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tar_by_brace_pattern_and_objects_by_list_file() {
    // The same S3 server without credentials answers plain HTTP GET/HEAD with ranges: a
    // real HTTP server for object_store's HTTP store.
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("web");
    std::fs::create_dir_all(bucket.join("tar")).unwrap();
    std::fs::create_dir_all(bucket.join("objects")).unwrap();
    let tar = tar_dir(&bucket.join("tar"), 3, 6);
    let objects = objects_dir(&bucket.join("objects"));
    let names = ["a/0001.jpg", "a/0002.JPG", "b/c/x.tar.gz", "noext", "z.txt"];
    std::fs::write(bucket.join("objects/files.txt"), names.join("\n")).unwrap();
    let h = s3::serve(S3ServerConfig::new(root.path())).await.unwrap();
    let ep = h.endpoint();

    let src = open(&format!("{ep}/web/tar/shard-{{0000..0002}}.tar")).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Tar));
    run_all(src, &tar, "shard-{0000..0002}.tar", &[]).await;
    let src = open(&format!("{ep}/web/objects?list=files.txt")).await;
    run_all(src, &objects, "/web/objects", &[]).await;

    let e = stoker::open(&format!("{ep}/web/tar"), Default::default()).await.unwrap_err();
    assert!(e.to_string().contains("brace pattern") && e.to_string().contains("list="), "{e}");
    let e = stoker::open(&format!("{ep}/web/tar/shard-{{0000..0003}}.tar"), Default::default()).await.unwrap_err();
    assert!(e.to_string().contains("shard-0003.tar"), "a missing shard is named: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_makes_reopening_one_request() {
    let s = server().await;
    let ep = s.handle.endpoint();
    for (path, expected) in [("tar", &s.tar), ("objects", &s.objects)] {
        let report = stoker::index(&uri(&ep, path, ""), Default::default()).await.unwrap();
        assert_eq!(report.samples, expected.len());
        assert!(report.manifest.ends_with(".stoker-manifest.json"), "{report:?}");
        let src = open(&uri(&ep, path, "")).await;
        assert_eq!(src.io_counters().unwrap().remote_requests, 1, "{path}: one GET of the manifest, no listing");
        run_all(src, expected, "s3://data", &[SK]).await;
        // Ignoring the manifest lists again, and reads each shard's sidecar.
        let listed = open(&uri(&ep, path, "&manifest=false")).await;
        if path == "tar" {
            assert_eq!(listed.io_counters().unwrap().remote_requests, 1 + 3, "a listing and three sidecars");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_reads_are_split_into_parallel_parts() {
    let s = server().await;
    let ep = s.handle.endpoint();
    // Every tar sample (200..8400 bytes of jpg) spans several 1 KiB parts.
    let src = open(&uri(&ep, "tar", "&part_size=1024&manifest=false")).await;
    let before = src.io_counters().unwrap().remote_requests;
    let got = src.get(6).await.unwrap();
    assert_eq!(got, s.tar[6]);
    let parts = src.io_counters().unwrap().remote_requests - before;
    let span = got.total_bytes() + 512;
    assert!(parts >= span / 1024, "{parts} requests for a {span}-byte span in 1 KiB parts");
}

/// Requests in flight grow past the old fixed 64 when requests queue and the store's latency
/// stays flat (Little's law: at 200 ms, 64 in flight caps a source at 320 requests/s), and a
/// number the user fixes is never exceeded. A 503 storm shrinks the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_follow_latency_unless_fixed() {
    use futures::StreamExt;
    let s = server().await;
    // 200 ms: a loaded machine's scheduling delays (tens of ms) stay well under the rise that
    // reads as saturation; at 50 ms they did not, and the limit stayed at 64 under load.
    let p = with_proxy(&s.handle, FaultPatch { latency_ms: Some(200), ..Default::default() }).await;
    let want = s.objects.clone();
    // `gets` gets of objects (one request each; no cache), 450 at once: far more than 64 wanted.
    let run = |extra: &'static str, gets: usize| {
        let (endpoint, want) = (p.endpoint(), want.clone());
        async move {
            let src = open(&uri(&endpoint, "objects", extra)).await;
            let gets = (0..gets).map(|k| {
                let (src, i) = (src.clone(), k % want.len());
                async move { (i, src.get(i).await) }
            });
            let got: Vec<_> = futures::stream::iter(gets).buffer_unordered(450).collect().await;
            for (i, g) in got {
                assert_eq!(g.unwrap(), want[i]);
            }
            src.io_counters().unwrap()
        }
    };
    let auto = run("&disk_cache=false", 900).await;
    // It grew; where it ends depends on how loaded this machine is (a latency that rises
    // with the load shrinks it again), so only the growth is asserted.
    assert!(auto.peak_in_flight > 64 && auto.in_flight_waits > 0, "{auto:?}");
    // 300 are plenty to fill 16 slots (900 took 11 s of 200 ms round trips here).
    let fixed = run("&disk_cache=false&max_in_flight=16", 300).await;
    assert_eq!((fixed.peak_in_flight, fixed.in_flight_limit), (16, 16), "{fixed:?}");

    // Throttling: every answer a 503 for a while; the limit falls, and nothing is lost.
    let src = open(&uri(&p.endpoint(), "objects", "&disk_cache=false&backoff_ms=1")).await;
    let gets = (0..300).map(|k| {
        let (src, i) = (src.clone(), k % want.len());
        async move { (i, src.get(i).await) }
    });
    p.control.apply(&FaultPatch { slowdown: Some(0.5), seed: Some(5), ..Default::default() }).unwrap();
    let got: Vec<_> = futures::stream::iter(gets).buffer_unordered(300).collect().await;
    let c = src.io_counters().unwrap();
    assert!(c.retries > 0 && c.in_flight_limit < 64, "{c:?}");
    for (i, g) in got {
        // With half the answers 503 and six tries, a request can still fail for good;
        // what arrives is right.
        if let Ok(got) = g {
            assert_eq!(got, want[i]);
        }
    }
}
