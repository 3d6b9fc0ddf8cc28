//! Epoch throughput of the Loader over S3 by order: the per-sample shuffle against the shard
//! shuffle (windows read ahead with large requests), on the embedded S3 server (s3s-fs,
//! bodies in 1 MiB reads) behind the fault proxy adding latency to every request; then the
//! hit path: the same Loader over the same shards from a warm disk cache against reading them
//! from a local directory.
//!
//! ```text
//! cargo run --release -p stoker-examples --example shard_stream_bench \
//!     [-- --samples 20000 --size 65536 --per-shard 250 --latency-ms 25 --batch 64 --epochs 2 --rounds 3 \
//!         --hit-only 0 --disk-cache 1]
//! ```
//!
//! The shards are uploaded through the S3 API (so the server records ETags instead of hashing
//! a shard on every GET) and written to a local directory too. Each order gets a freshly
//! opened source with an empty disk cache of its own (the disk cache is on by default: epochs
//! after the first read what fits from it; `--disk-cache 0` turns it off for these rows) and
//! the Loader at its defaults apart from the order; every row prints samples/s per epoch, requests, MiB fetched and the share of time
//! the consumer waited. The hit-path rows read each order from the local directory (page
//! cache warm) and from S3 through a disk cache big enough for the data, warmed by a first
//! epoch, alternating local and warm epochs for `--rounds` rounds, and print the best rates,
//! their ratio and the median of the rounds' ratios (`--hit-only 1` runs only those).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use stoker::loader::{Loader, LoaderConfig};
use stoker::sampler::Order;
use stoker_testkit::proxy::{self, FaultPatch, ProxyConfig};
use stoker_testkit::s3::{self, S3ServerConfig};

const AK: &str = "bench";
const SK: &str = "bench-secret";

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `n` samples of `size` bytes as tar shards of `per` samples under `data/tar/`, and the same
/// shards in the local directory `local`.
async fn upload(endpoint: &str, n: usize, size: usize, per: usize, local: &std::path::Path) {
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
    let shards: Vec<Vec<usize>> = (0..n).collect::<Vec<_>>().chunks(per).map(<[usize]>::to_vec).collect();
    futures::stream::iter(shards.into_iter().enumerate().map(|(s, members)| async move {
        let mut b = tar::Builder::new(Vec::new());
        for i in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(size as u64);
            h.set_mode(0o644);
            let data = stoker_testkit::fixtures::payload(i as u64, size);
            b.append_data(&mut h, format!("{i:07}.bin"), &data[..]).expect("tar member");
        }
        let bytes = b.into_inner().expect("tar");
        std::fs::write(local.join(format!("shard-{s:05}.tar")), &bytes).expect("local shard");
        let path = object_store::path::Path::from(format!("tar/shard-{s:05}.tar"));
        s3.put(&path, bytes.into()).await.expect("upload shard");
    }))
    .buffer_unordered(4)
    .count()
    .await;
}

/// What one epoch did.
struct Epoch {
    samples_per_s: f64,
    requests: u64,
    mib_read: f64,
    wait: f64,
}

/// Read epoch `e` of `loader` whole, spot-checking one row per batch.
async fn epoch(loader: &Loader, src: &Arc<stoker::DynSampleSource>, e: u64, n: usize, size: usize) -> Epoch {
    let before = src.io_counters().unwrap_or_default();
    let wait_before = loader.stats().consumer_wait_s;
    let t = Instant::now();
    let mut stream = loader.epoch(e).expect("epoch");
    let mut samples = 0;
    while let Some(b) = stream.next_batch().await {
        let b = b.expect("batch");
        // Spot-check one row per batch: the bytes are the sample's.
        let i = b.indices()[0];
        let want = stoker_testkit::fixtures::payload(i, size);
        assert_eq!(b.field("bin").and_then(|c| c.get(0)), Some(&want[..]), "sample {i}");
        samples += b.len();
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(samples, n, "every sample once");
    let after = src.io_counters().unwrap_or_default();
    Epoch {
        samples_per_s: samples as f64 / secs,
        requests: after.remote_requests - before.remote_requests,
        mib_read: (after.remote_bytes - before.remote_bytes) as f64 / (1 << 20) as f64,
        wait: (loader.stats().consumer_wait_s - wait_before) / secs,
    }
}

fn loader(src: &Arc<stoker::DynSampleSource>, batch: usize, order: &Order) -> Loader {
    let mut cfg = LoaderConfig::new(batch);
    cfg.order = order.clone();
    Loader::new(src.clone(), cfg).expect("loader")
}

#[tokio::main]
async fn main() {
    let n = arg("--samples", 20_000) as usize;
    let size = arg("--size", 64 << 10) as usize;
    let per = arg("--per-shard", 250).max(1) as usize;
    let latency = arg("--latency-ms", 25);
    let batch = arg("--batch", 64) as usize;
    let epochs = arg("--epochs", 2).max(1);
    let hit_only = arg("--hit-only", 0) != 0;
    let disk_cache = arg("--disk-cache", 1) != 0;
    let root = tempfile::tempdir().expect("temp dir");
    let local = root.path().join("local");
    std::fs::create_dir_all(&local).expect("local dir");
    // The servers run on their own runtime, so their work is not queued behind the loader's
    // tasks (they would be other machines in real life).
    let servers = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cfg = S3ServerConfig::new(root.path()).with_credentials(AK, SK).with_bucket("data");
    let server = servers.spawn(s3::serve(cfg)).await.unwrap().expect("s3 server");
    let t = Instant::now();
    upload(&server.endpoint(), n, size, per, &local).await;
    let shards = n.div_ceil(per);
    println!(
        "{n} samples x {size} B in {shards} shards of {per}, uploaded in {:.1} s; {} cores; {latency} ms added to \
         every request; batch {batch}, Loader defaults otherwise; load average {}",
        t.elapsed().as_secs_f64(),
        std::thread::available_parallelism().map_or(1, |c| c.get()),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split(' ').take(3).collect::<Vec<_>>().join(" "),
    );
    let px = servers.spawn(proxy::serve(ProxyConfig::new(server.addr()))).await.unwrap().expect("proxy");
    px.control.apply(&FaultPatch { latency_ms: Some(latency), ..Default::default() }).unwrap();
    let uri = format!("s3://data/tar?endpoint={}&access_key_id={AK}&secret_access_key={SK}", px.endpoint());
    let orders = [
        ("sequential", Order::Sequential),
        ("shuffle=True (samples)", Order::Shuffle { seed: 1 }),
        ("shuffle=\"shards\", window 4", Order::ShardShuffle { seed: 1, window: 4 }),
        ("shuffle=\"shards\", window 8", Order::ShardShuffle { seed: 1, window: 8 }),
    ];
    if !hit_only {
        println!(
            "{:<26} {:>6} {:>11} {:>9} {:>9} {:>7}",
            "order", "epoch", "samples/s", "requests", "MiB read", "wait"
        );
        for (name, order) in &orders {
            let cache = tempfile::tempdir().expect("cache dir");
            let opts = stoker::SourceOptions {
                disk_cache: Some(disk_cache),
                disk_cache_dir: Some(cache.path().into()),
                ..Default::default()
            };
            let src: Arc<stoker::DynSampleSource> = stoker::open(&uri, opts).await.expect("open");
            let loader = loader(&src, batch, order);
            for e in 0..epochs {
                let r = epoch(&loader, &src, e, n, size).await;
                println!(
                    "{name:<26} {e:>6} {:>11.0} {:>9} {:>9.0} {:>6.0}%",
                    r.samples_per_s,
                    r.requests,
                    r.mib_read,
                    r.wait * 100.0
                );
            }
        }
    }

    // The hit path: warm epochs from the disk cache against the same shards read locally,
    // alternated so that the machine's load (often other jobs) weighs on both alike.
    let rounds = arg("--rounds", 3).max(1);
    println!(
        "\n{:<26} {:>15} {:>15} {:>11} {:>11} {:>9}",
        "hit path (best of rounds)", "local samples/s", "warm samples/s", "best ratio", "median", "requests"
    );
    let local_uri = local.display().to_string();
    let data_bytes: u64 =
        std::fs::read_dir(&local).expect("local dir").flatten().map(|f| f.metadata().map_or(0, |m| m.len())).sum();
    for (name, order) in orders.iter().filter(|(_, o)| !matches!(o, Order::Sequential)).take(2) {
        let src = stoker::open(&local_uri, Default::default()).await.expect("open local");
        let local_loader = loader(&src, batch, order);
        let cache = tempfile::tempdir().expect("cache dir");
        let opts = stoker::SourceOptions {
            disk_cache_dir: Some(cache.path().into()),
            disk_cache_bytes: Some(2 * data_bytes),
            ..Default::default()
        };
        let remote: Arc<stoker::DynSampleSource> = stoker::open(&uri, opts).await.expect("open");
        let remote_loader = loader(&remote, batch, order);
        epoch(&remote_loader, &remote, 0, n, size).await; // fills the cache
        epoch(&local_loader, &src, 0, n, size).await; // the page cache holds the shards
        let (mut locals, mut warms, mut requests) = (Vec::new(), Vec::new(), 0);
        for r in 1..=rounds {
            locals.push(epoch(&local_loader, &src, r, n, size).await.samples_per_s);
            let w = epoch(&remote_loader, &remote, r, n, size).await;
            warms.push(w.samples_per_s);
            requests += w.requests;
        }
        let best = |v: &[f64]| v.iter().copied().fold(0f64, f64::max);
        let mut ratios: Vec<f64> = warms.iter().zip(&locals).map(|(w, l)| w / l).collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "{name:<26} {:>15.0} {:>15.0} {:>10.2}x {:>10.2}x {:>9}",
            best(&locals),
            best(&warms),
            best(&warms) / best(&locals),
            ratios[ratios.len() / 2],
            requests
        );
    }
    servers.spawn(async move {
        px.shutdown().await;
        server.shutdown().await;
    });
    servers.shutdown_background();
}
