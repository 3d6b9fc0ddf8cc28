//! How fast the embedded S3 server streams one large GET body, with `s3s-fs`'s own GetObject
//! (4 KiB file reads) and with the test kit's large reads, same run, same object.
//!
//! ```text
//! cargo run --release -p stoker-testkit --example s3_get_speed [-- --mib 64 --rounds 5 --streams 1]
//! ```
//!
//! Prints MiB/s of whole-object GETs (`--streams` at once, each reading the whole object)
//! for each read size: the best and the median of `--rounds` rounds.

use std::time::Instant;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use stoker_testkit::s3::{self, S3ServerConfig};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn client(endpoint: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name("data")
        .with_region("us-east-1")
        .with_skip_signature(true)
        .build()
        .expect("client")
}

/// One round: `streams` whole-object GETs at once; MiB/s over all of them.
async fn round(store: &object_store::aws::AmazonS3, path: &Path, streams: usize) -> f64 {
    let t = Instant::now();
    let bytes: usize = futures::future::join_all((0..streams).map(|_| async {
        let mut body = store.get(path).await.expect("get").into_stream();
        let mut n = 0;
        while let Some(chunk) = body.next().await {
            n += chunk.expect("body").len();
        }
        n
    }))
    .await
    .into_iter()
    .sum();
    bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let (mib, rounds, streams) = (arg("--mib", 64), arg("--rounds", 5).max(1), arg("--streams", 1).max(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let data: Vec<u8> = (0..mib << 20).map(|i| (i * 31 % 251) as u8).collect();
    println!("{mib} MiB object, {streams} stream(s) at once, {rounds} rounds; MiB/s (best / median)");
    let mut uploaded = false;
    for (label, read) in [
        ("s3s-fs GetObject (4 KiB reads)", None),
        ("large reads, 256 KiB", Some(256 << 10)),
        ("large reads, 1 MiB (default)", Some(1 << 20)),
    ] {
        let mut cfg = S3ServerConfig::new(dir.path()).with_bucket("data");
        cfg.get_read_bytes = read;
        let server = s3::serve(cfg).await.expect("serve");
        let store = client(&server.endpoint());
        let path = Path::from("big.bin");
        if !uploaded {
            // Through the API, so s3s-fs records the ETag (by hand, every GET would hash the file).
            store.put(&path, PutPayload::from(data.clone())).await.expect("upload");
            uploaded = true;
        }
        round(&store, &path, 1).await; // connection and page cache warm
        let mut speeds = Vec::new();
        for _ in 0..rounds {
            speeds.push(round(&store, &path, streams).await);
        }
        speeds.sort_by(f64::total_cmp);
        println!("  {label:<32} {:>7.0} / {:>7.0}", speeds[rounds - 1], speeds[rounds / 2]);
        server.shutdown().await;
    }
}
