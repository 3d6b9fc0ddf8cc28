//! TFRecord files written by the `tfrecord` package (plain and gzip, `tf.train.Example` and raw
//! payloads) through the conformance suite locally and over S3; a flipped data byte is a
//! checksum error naming the file and record (skipped and counted by the Loader's skip
//! policy), a damaged length or a truncated file an error at open naming file and record.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::s3::{uri, SK};
use common::*;
use futures::StreamExt;
use stoker::conformance::run_all;
use stoker::{ErrorPolicy, Layout, Loader, LoaderConfig, Sample};

fn fixture(kind: &str, dir: &Path) -> Vec<Sample> {
    script_fixture(&writers_python(), "write_tfrecord.py", &[kind], dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tfrecord_examples_and_raw_records_pass_conformance_locally_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let (ex, raw) = (root.path().join("data").join("ex"), root.path().join("data").join("raw"));
    let want = fixture("example", &ex);
    let src = open(ex.to_str().unwrap()).await;
    assert_eq!((src.info().known_layout(), src.info().shards), (Some(Layout::Tfrecord), 3));
    run_all(src, &want, "ex", &[]).await;
    let want_raw = fixture("raw", &raw);
    run_all(open(raw.to_str().unwrap()).await, &want_raw, "raw", &[]).await;
    let server = common::s3::serve(root.path()).await;
    run_all(open(&uri(&server.endpoint(), "ex", "")).await, &want, "s3://data/ex", &[SK]).await;
    run_all(open(&uri(&server.endpoint(), "raw", "")).await, &want_raw, "s3://data/raw", &[SK]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_records_are_named_and_the_skip_policy_counts_them() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ex");
    let want = fixture("example", &dir);
    let file = dir.join("a-00000.tfrecord");
    let good = std::fs::read(&file).unwrap();
    // Record 3's data: past three records and its own 12-byte header.
    let mut at = 0usize;
    for _ in 0..3 {
        at += 16 + u64::from_le_bytes(good[at..at + 8].try_into().unwrap()) as usize;
    }
    let mut bad = good.clone();
    bad[at + 12 + 40] ^= 0x10;
    std::fs::write(&file, &bad).unwrap();
    let src = open(dir.to_str().unwrap()).await;
    let e = src.get(3).await.unwrap_err().to_string();
    assert!(e.contains("a-00000.tfrecord") && e.contains("record 3") && e.contains("CRC32C"), "{e}");
    assert_eq!(src.get(4).await.unwrap(), want[4], "the records around it read");

    let mut cfg = LoaderConfig::new(8);
    cfg.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let mut got = HashMap::new();
    let mut stream = loader.epoch(0).unwrap();
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        for row in 0..b.len() {
            got.insert(b.key(row).unwrap().to_string(), b.field("image").unwrap().get(row).unwrap().to_vec());
        }
    }
    assert_eq!(loader.stats().skipped, 1);
    assert_eq!(got.len(), want.len() - 1);
    for s in want.iter().filter(|s| s.key != "a-00000/000000003") {
        assert_eq!(got[&s.key], &s.field("image").unwrap()[..], "{}", s.key);
    }

    // The very first record damaged: the dataset still opens as Examples, that record fails.
    let mut first = good.clone();
    first[12 + 30] ^= 0x04;
    std::fs::write(&file, &first).unwrap();
    let src = open(dir.to_str().unwrap()).await;
    assert!(src.get(0).await.unwrap_err().to_string().contains("record 0"));
    assert_eq!(src.get(1).await.unwrap(), want[1], "read as an Example, decided by record 1");

    // A length that fails its checksum: nothing says where the next record starts.
    let mut bad = good.clone();
    bad[at + 2] ^= 1;
    std::fs::write(&file, &bad).unwrap();
    let e = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("a-00000.tfrecord") && e.contains("record 3") && e.contains("checksum"), "{e}");
    // A file cut inside a record.
    std::fs::write(&file, &good[..good.len() - 10]).unwrap();
    let e = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("a-00000.tfrecord") && e.contains("ends inside the record"), "{e}");
    // Restored: the index written for the damaged file is stale (its size differs) and walked again.
    std::fs::write(&file, &good).unwrap();
    run_all(open(dir.to_str().unwrap()).await, &want, "ex", &[]).await;
}
