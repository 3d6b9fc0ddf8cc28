//! Epoch throughput of the Loader over S3 by order: the per-sample shuffle against the shard
//! shuffle (windows read ahead with large requests), on the embedded S3 server (s3s-fs,
//! bodies in 1 MiB reads) behind the fault proxy adding latency to every request.
//!
//! ```text
//! cargo run --release -p stoker-examples --example shard_stream_bench \
//!     [-- --samples 20000 --size 65536 --per-shard 250 --latency-ms 25 --batch 64 --epochs 2]
//! ```
//!
//! The shards are uploaded through the S3 API (so the server records ETags instead of hashing
//! a shard on every GET). Each order gets a freshly opened source with an empty disk cache of
//! its own (the disk cache is on by default: epochs after the first read what fits from it)
//! and the Loader at its defaults apart from the order; every row prints samples/s per epoch,
//! requests, MiB fetched and the share of time the consumer waited.

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

/// `n` samples of `size` bytes as tar shards of `per` samples under `data/tar/`.
async fn upload(endpoint: &str, n: usize, size: usize, per: usize) {
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
        let path = object_store::path::Path::from(format!("tar/shard-{s:05}.tar"));
        s3.put(&path, bytes.into()).await.expect("upload shard");
    }))
    .buffer_unordered(4)
    .count()
    .await;
}

#[tokio::main]
async fn main() {
    let n = arg("--samples", 20_000) as usize;
    let size = arg("--size", 64 << 10) as usize;
    let per = arg("--per-shard", 250).max(1) as usize;
    let latency = arg("--latency-ms", 25);
    let batch = arg("--batch", 64) as usize;
    let epochs = arg("--epochs", 2).max(1);
    let root = tempfile::tempdir().expect("temp dir");
    // The servers run on their own runtime, so their work is not queued behind the loader's
    // tasks (they would be other machines in real life).
    let servers = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cfg = S3ServerConfig::new(root.path()).with_credentials(AK, SK).with_bucket("data");
    let server = servers.spawn(s3::serve(cfg)).await.unwrap().expect("s3 server");
    let t = Instant::now();
    upload(&server.endpoint(), n, size, per).await;
    let shards = n.div_ceil(per);
    println!(
        "{n} samples x {size} B in {shards} shards of {per}, uploaded in {:.1} s; {} cores; {latency} ms added to \
         every request; batch {batch}, Loader defaults otherwise",
        t.elapsed().as_secs_f64(),
        std::thread::available_parallelism().map_or(1, |c| c.get()),
    );
    let px = servers.spawn(proxy::serve(ProxyConfig::new(server.addr()))).await.unwrap().expect("proxy");
    px.control.apply(&FaultPatch { latency_ms: Some(latency), ..Default::default() }).unwrap();
    let uri = format!("s3://data/tar?endpoint={}&access_key_id={AK}&secret_access_key={SK}", px.endpoint());
    println!("{:<26} {:>6} {:>11} {:>9} {:>9} {:>7}", "order", "epoch", "samples/s", "requests", "MiB read", "wait");
    let orders = [
        ("sequential", Order::Sequential),
        ("shuffle=True (samples)", Order::Shuffle { seed: 1 }),
        ("shuffle=\"shards\", window 4", Order::ShardShuffle { seed: 1, window: 4 }),
        ("shuffle=\"shards\", window 8", Order::ShardShuffle { seed: 1, window: 8 }),
    ];
    for (name, order) in orders {
        let cache = tempfile::tempdir().expect("cache dir");
        let opts = stoker::SourceOptions { disk_cache_dir: Some(cache.path().into()), ..Default::default() };
        let src: Arc<stoker::DynSampleSource> = stoker::open(&uri, opts).await.expect("open");
        let mut cfg = LoaderConfig::new(batch);
        cfg.order = order;
        let loader = Loader::new(src.clone(), cfg).expect("loader");
        for e in 0..epochs {
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
            let wait = (loader.stats().consumer_wait_s - wait_before) / secs;
            println!(
                "{name:<26} {e:>6} {:>11.0} {:>9} {:>9.0} {:>6.0}%",
                samples as f64 / secs,
                after.remote_requests - before.remote_requests,
                (after.bytes - before.bytes) as f64 / (1 << 20) as f64,
                wait * 100.0
            );
        }
    }
    servers.spawn(async move {
        px.shutdown().await;
        server.shutdown().await;
    });
    servers.shutdown_background();
}
