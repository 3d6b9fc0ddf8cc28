//! Remote fetch benchmark: 64 KiB samples on a real S3 server (s3s-fs on loopback) behind the
//! fault and latency proxy, read through Stoker's fetch layer.
//!
//! ```text
//! cargo run --release -p stoker-examples --example remote_bench [-- --samples 2000 --latency-ms 25 --inflight 32]
//! ```
//!
//! Reports, in one run: per-sample random reads (one request each) with `inflight` requests
//! in flight against the concurrency bound `inflight / latency`, the same one request at a
//! time (the baseline), the 0 ms figures, coalesced batch reads of tar shards, then a full
//! pass over 5,000 samples with 5% 503 SlowDown and 1% connection resets injected, and the
//! error a 100% 503 storm gives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use stoker::DynSampleSource;
use stoker_testkit::proxy::{self, FaultPatch, ProxyConfig};
use stoker_testkit::s3::{self, S3ServerConfig};

const AK: &str = "bench";
const SK: &str = "bench-secret";

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn payload(i: usize, n: usize) -> Vec<u8> {
    stoker_testkit::fixtures::payload(i as u64, n)
}

/// Upload `n` samples of `size` bytes as objects and as tar shards of 250 samples, through
/// the S3 API (s3s-fs records each object's ETag on upload; for files put in its directory
/// by hand it would hash the whole file on every GET, which is no real server's cost).
async fn upload(endpoint: &str, n: usize, size: usize) {
    use object_store::ObjectStoreExt;
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name("data")
        .with_access_key_id(AK)
        .with_secret_access_key(SK)
        .with_region("us-east-1")
        .build()
        .expect("client");
    let s3 = &s3;
    futures::stream::iter((0..n).map(|i| async move {
        let path = object_store::path::Path::from(format!("objects/{i:07}.bin"));
        s3.put(&path, payload(i, size).into()).await.expect("upload object");
    }))
    .buffer_unordered(32)
    .count()
    .await;
    for (s, chunk) in (0..n).collect::<Vec<_>>().chunks(250).enumerate() {
        let mut b = tar::Builder::new(Vec::new());
        for &i in chunk {
            let mut h = tar::Header::new_gnu();
            h.set_size(size as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, format!("{i:07}.bin"), &payload(i, size)[..]).unwrap();
        }
        let bytes = b.into_inner().unwrap();
        let path = object_store::path::Path::from(format!("tar/shard-{s:04}.tar"));
        s3.put(&path, bytes.into()).await.expect("upload shard");
    }
}

/// The disk cache is off: this measures requests, and a cache would answer the repeats.
async fn open(endpoint: &str, path: &str, extra: &str) -> Arc<DynSampleSource> {
    let uri = format!(
        "s3://data/{path}?endpoint={endpoint}&access_key_id={AK}&secret_access_key={SK}&hedge_ms=0&disk_cache=false{extra}"
    );
    stoker::open(&uri, Default::default()).await.unwrap_or_else(|e| panic!("open {path}: {e}"))
}

/// Random single-sample gets, `concurrency` at a time; samples/s (= requests/s here).
async fn random_gets(src: &Arc<DynSampleSource>, count: usize, concurrency: usize) -> f64 {
    let n = src.len();
    let t = Instant::now();
    let done = futures::stream::iter((0..count).map(|k| {
        let src = src.clone();
        // A fixed scatter: every sample its own request, no locality.
        async move { src.get((k * 7919 + 13) % n).await.map(|s| s.total_bytes()) }
    }))
    .buffer_unordered(concurrency)
    .fold(0u64, |acc, r| async move { acc + r.expect("get") })
    .await;
    assert!(done > 0);
    count as f64 / t.elapsed().as_secs_f64()
}

/// Sequential batches of 64 through `get_many` (coalesced ranged reads), 4 batches in flight.
async fn batched(src: &Arc<DynSampleSource>) -> f64 {
    let n = src.len();
    let t = Instant::now();
    let chunks: Vec<Vec<usize>> = (0..n).collect::<Vec<_>>().chunks(64).map(|c| c.to_vec()).collect();
    futures::stream::iter(chunks.into_iter().map(|c| {
        let src = src.clone();
        async move { src.get_many(&c).await.expect("batch").len() }
    }))
    .buffer_unordered(4)
    .count()
    .await;
    n as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let n = arg("--samples", 2000) as usize;
    let latency = arg("--latency-ms", 25);
    let inflight = arg("--inflight", 32) as usize;
    let size = 64 << 10;
    let root = tempfile::tempdir().unwrap();
    // The servers get their own runtime so their work is not queued behind the client's
    // tasks (they would be separate machines in real life).
    let servers = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cfg = S3ServerConfig::new(root.path()).with_credentials(AK, SK).with_bucket("data");
    let server = servers.spawn(s3::serve(cfg)).await.unwrap().unwrap();
    let t = Instant::now();
    upload(&server.endpoint(), n.max(5000), size).await;
    println!("uploaded the dataset in {:.1} s", t.elapsed().as_secs_f64());
    let px = servers.spawn(proxy::serve(ProxyConfig::new(server.addr()))).await.unwrap().unwrap();
    let ep = px.endpoint();
    println!(
        "remote_bench: {} cores, {} x 64 KiB samples on s3s-fs behind the proxy, {inflight} requests in flight",
        std::thread::available_parallelism().map_or(1, |c| c.get()),
        n.max(5000)
    );
    println!(
        "{:<8} {:>8} {:>14} {:>14} {:>10} {:>14}",
        "layout", "latency", "samples/s", "bound", "x bound", "1-at-a-time/s"
    );
    for ms in [latency, 0] {
        px.control.apply(&FaultPatch { latency_ms: Some(ms), ..Default::default() }).unwrap();
        for layout in ["objects", "tar"] {
            let src = open(&ep, layout, &format!("&max_in_flight={inflight}&manifest=false")).await;
            random_gets(&src, 200, inflight).await; // warm connections
            let rate = random_gets(&src, n, inflight).await;
            let single = random_gets(&src, if ms > 0 { 40 } else { 400 }, 1).await;
            let bound = if ms > 0 { inflight as f64 / (ms as f64 / 1e3) } else { f64::NAN };
            let ratio = if ms > 0 { format!("{:.2}x", rate / bound) } else { "-".into() };
            let bound = if ms > 0 { format!("{bound:.0}") } else { "-".into() };
            println!("{layout:<8} {ms:>6}ms {rate:>14.0} {bound:>14} {ratio:>10} {single:>14.0}");
        }
        let tar = open(&ep, "tar", &format!("&max_in_flight={inflight}")).await;
        let rate = batched(&tar).await;
        println!(
            "tar, batches of 64 via get_many (coalesced), {ms} ms: {rate:.0} samples/s ({:.0} MiB/s)",
            rate * 64.0 / 1024.0
        );
    }

    // Faults: every sample of a 5,000-sample pass must arrive with the right bytes.
    px.control
        .apply(&FaultPatch {
            latency_ms: Some(0),
            slowdown: Some(0.05),
            reset: Some(0.01),
            seed: Some(11),
            ..Default::default()
        })
        .unwrap();
    px.control.reset_stats();
    for layout in ["objects", "tar"] {
        let src = open(&ep, layout, &format!("&max_in_flight={inflight}&backoff_ms=20&attempts=8")).await;
        let t = Instant::now();
        let idx: Vec<usize> = (0..5000).collect();
        let mut ok = 0;
        for chunk in idx.chunks(100) {
            let got = src.get_many(chunk).await.expect("a pass with faults must succeed");
            for (s, &i) in got.iter().zip(chunk) {
                assert_eq!(&s.fields[0].data[..], &payload(i, size)[..], "sample {i}");
                ok += 1;
            }
        }
        let c = src.io_counters().unwrap();
        println!(
            "faults ({layout}): {ok}/5000 samples correct in {:.1} s; {} retries, {} requests",
            t.elapsed().as_secs_f64(),
            c.retries,
            c.remote_requests
        );
    }
    println!("proxy injected: {:?}", px.control.stats());

    // A storm: the error arrives within the retry budget and names the object.
    let src = open(&ep, "tar", "&backoff_ms=50&attempts=5&manifest=false").await;
    px.control.apply(&FaultPatch { slowdown: Some(1.0), reset: Some(0.0), ..Default::default() }).unwrap();
    let t = Instant::now();
    let e = src.get(0).await.expect_err("a 100% 503 storm must fail");
    println!("100% 503: failed after {:.2} s: {e}", t.elapsed().as_secs_f64());
    assert!(t.elapsed() < Duration::from_secs(10));
    servers.spawn(async move {
        px.shutdown().await;
        server.shutdown().await;
    });
    servers.shutdown_background();
}
