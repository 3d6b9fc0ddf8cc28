//! Mix benchmark: a 50/50 mix of a local tar source and a remote one (tar shards on a real
//! S3 server, s3s-fs on loopback, behind the latency proxy) through the Loader, against each
//! source alone, measured in the same run.
//!
//! ```text
//! cargo run --release -p stoker-examples --example mix_bench [-- --samples 4000 --size-kib 32 --latency-ms 25 --rounds 2]
//! ```
//!
//! A mix reads each batch's part of every source at once, so it should run as fast as its
//! slowest source's share allows: with weights 1/2 and 1/2, `min(local / 0.5, remote / 0.5)`
//! samples/s, where `local` and `remote` are the rates of each source read alone. The run
//! prints the rates, that bound, the mix's ratio to it (the target is at least 0.8) and the
//! mix's per-source stats (delivered samples, time waiting for each source's reads).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use stoker::loader::{Loader, LoaderConfig};
use stoker::sampler::Order;
use stoker::source::mix::{MixEntry, MixSource, MixSpec};
use stoker::{DynSampleSource, SourceOptions};
use stoker_testkit::proxy::{self, FaultPatch, ProxyConfig};
use stoker_testkit::s3::{self, S3ServerConfig};

const AK: &str = "bench";
const SK: &str = "bench-secret";
const PER_SHARD: usize = 250;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Tar shards of `n` samples of `size` bytes, `PER_SHARD` a shard, as (name, bytes).
fn shards(n: usize, size: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .collect::<Vec<_>>()
        .chunks(PER_SHARD)
        .enumerate()
        .map(|(s, chunk)| {
            let mut b = tar::Builder::new(Vec::new());
            for &i in chunk {
                let mut h = tar::Header::new_gnu();
                h.set_size(size as u64);
                h.set_mode(0o644);
                let data = stoker_testkit::fixtures::payload(seed + i as u64, size);
                b.append_data(&mut h, format!("{i:07}.bin"), &data[..]).unwrap();
            }
            (format!("shard-{s:04}.tar"), b.into_inner().unwrap())
        })
        .collect()
}

/// Upload through the S3 API (s3s-fs records each object's ETag on upload).
async fn upload(endpoint: &str, files: Vec<(String, Vec<u8>)>) {
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
    futures::stream::iter(files.into_iter().map(|(name, bytes)| async move {
        let path = object_store::path::Path::from(format!("remote/{name}"));
        s3.put(&path, bytes.into()).await.expect("upload shard");
    }))
    .buffer_unordered(8)
    .count()
    .await;
}

/// Samples/s of one shuffled epoch through the Loader, after a few warm-up batches of
/// another epoch (connections, page cache).
async fn rate(src: Arc<DynSampleSource>, batch: usize) -> (f64, Loader) {
    let mut cfg = LoaderConfig::new(batch);
    cfg.order = Order::Shuffle { seed: 1 };
    cfg.prefetch = 8;
    let loader = Loader::new(src, cfg).expect("loader");
    {
        let mut warm = loader.epoch(0).expect("epoch");
        for _ in 0..4 {
            if warm.next_batch().await.is_none() {
                break;
            }
        }
    }
    let t = Instant::now();
    let mut n = 0u64;
    let mut stream = loader.epoch(1).expect("epoch");
    while let Some(b) = stream.next_batch().await {
        n += b.expect("batch").len() as u64;
    }
    (n as f64 / t.elapsed().as_secs_f64(), loader)
}

#[tokio::main]
async fn main() {
    let n = arg("--samples", 4000) as usize;
    let size = arg("--size-kib", 32) as usize * 1024;
    let latency = arg("--latency-ms", 25);
    let rounds = arg("--rounds", 2);
    let batch = arg("--batch", 256) as usize;
    let dir = tempfile::tempdir().unwrap();

    // Local: the same kind of shards on local disk.
    std::fs::create_dir_all(dir.path().join("local")).unwrap();
    for (name, bytes) in shards(n, size, 0) {
        std::fs::write(dir.path().join("local").join(name), bytes).unwrap();
    }
    // Remote: the servers get their own runtime so their work is not queued behind the
    // client's tasks (they would be other machines in real life).
    let servers = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    std::fs::create_dir_all(dir.path().join("s3")).unwrap();
    let cfg = S3ServerConfig::new(dir.path().join("s3")).with_credentials(AK, SK).with_bucket("data");
    let server = servers.spawn(s3::serve(cfg)).await.unwrap().unwrap();
    upload(&server.endpoint(), shards(n, size, 1 << 32)).await;
    let px = servers.spawn(proxy::serve(ProxyConfig::new(server.addr()))).await.unwrap().unwrap();
    px.control.apply(&FaultPatch { latency_ms: Some(latency), ..Default::default() }).unwrap();

    let local_uri = dir.path().join("local").to_string_lossy().into_owned();
    // The disk cache is off: every round reads the remote source over the network, as the
    // bound assumes (a cache would serve the rounds after the first from the local disk).
    let remote_uri = format!(
        "s3://data/remote?endpoint={}&access_key_id={AK}&secret_access_key={SK}&disk_cache=false",
        px.endpoint()
    );
    let open = |uri: String| async move { stoker::open(&uri, SourceOptions::default()).await.expect("open") };
    // Index the shards once (sidecars), so no measurement pays for it.
    open(local_uri.clone()).await;
    open(remote_uri.clone()).await;
    let spec = MixSpec {
        sources: vec![
            MixEntry { uri: local_uri.clone(), weight: 0.5, name: Some("local".into()), options: Default::default() },
            MixEntry { uri: remote_uri.clone(), weight: 0.5, name: Some("remote".into()), options: Default::default() },
        ],
        ..Default::default()
    };

    println!(
        "mix_bench: {} cores, {n} x {} KiB samples per source in tar shards of {PER_SHARD}; remote on s3s-fs behind \
         a {latency} ms proxy; batch {batch}, prefetch 8, shuffled",
        std::thread::available_parallelism().map_or(1, |c| c.get()),
        size / 1024
    );
    println!("{:<6} {:>12} {:>12} {:>12} {:>12} {:>8}", "round", "local/s", "remote/s", "mix/s", "bound/s", "x bound");
    let mut best = 0.0f64;
    let mut last_mix = None;
    for round in 0..rounds {
        let (local, _) = rate(open(local_uri.clone()).await, batch).await;
        let (remote, _) = rate(open(remote_uri.clone()).await, batch).await;
        let mix: Arc<DynSampleSource> = Arc::new(MixSource::open(spec.clone(), Default::default()).await.expect("mix"));
        let (mixed, loader) = rate(mix, batch).await;
        let bound = (local / 0.5).min(remote / 0.5);
        let ratio = mixed / bound;
        best = best.max(ratio);
        println!("{round:<6} {local:>12.0} {remote:>12.0} {mixed:>12.0} {bound:>12.0} {ratio:>7.2}x");
        last_mix = Some(loader);
    }
    println!("best ratio {best:.2}x of min(local / 0.5, remote / 0.5) (target >= 0.8x)");
    if let Some(loader) = last_mix {
        for s in loader.stats().sources {
            println!(
                "  {:<7} delivered {:>7} samples ({:.0}/s), {} reads, read wait {:.2} s (p50 {:.1} ms, p95 {:.1} ms), \
                 {} store requests",
                s.name,
                s.samples,
                s.samples_per_s,
                s.reads,
                s.read_wait_s,
                s.read_p50_ms,
                s.read_p95_ms,
                s.store_requests
            );
        }
    }
    servers.spawn(async move {
        px.shutdown().await;
        server.shutdown().await;
    });
    servers.shutdown_background();
}
