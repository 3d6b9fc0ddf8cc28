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

/// A copy of the `indexed` fixture's files in `to`, with `a-00000.tfindex`'s lines edited and
/// the checksum of record 3's length damaged in `a-00000.tfrecord`: a walk of the file stops
/// there (an error at open), where an index that is used places every record and leaves the
/// damage unread (record 3's data and its own checksum are whole).
fn with_tfindex(from: &Path, to: &Path, edit: impl Fn(&mut Vec<String>)) {
    std::fs::create_dir_all(to).unwrap();
    for name in ["a-00001.tfrecord", "a-00001.index"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
    let mut file = std::fs::read(from.join("a-00000.tfrecord")).unwrap();
    let mut at = 0usize;
    for _ in 0..3 {
        at += 16 + u64::from_le_bytes(file[at..at + 8].try_into().unwrap()) as usize;
    }
    file[at + 9] ^= 0x20;
    std::fs::write(to.join("a-00000.tfrecord"), file).unwrap();
    let text = std::fs::read_to_string(from.join("a-00000.tfindex")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    edit(&mut lines);
    std::fs::write(to.join("a-00000.tfindex"), lines.join("\n") + "\n").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tfindex_files_replace_the_walk_and_ones_that_do_not_fit_are_set_aside() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("idx");
    let want = fixture("indexed", &dir);
    // The package's indexes (`.tfindex`, `.index`) read locally and over S3.
    run_all(open(dir.to_str().unwrap()).await, &want, "idx", &[]).await;
    let server = common::s3::serve(root.path()).await;
    run_all(open(&uri(&server.endpoint(), "idx", "")).await, &want, "s3://data/idx", &[SK]).await;

    // They stand for the walk: with the walk's only clue to where record 4 starts damaged,
    // the index still places every record, and every record reads whole.
    let used = root.path().join("used");
    with_tfindex(&dir, &used, |_| {});
    run_all(open(used.to_str().unwrap()).await, &want, "used", &[]).await;
    std::fs::remove_file(used.join("a-00000.tfindex")).unwrap();
    std::fs::remove_file(used.join("a-00000.tfrecord.stoker-records")).unwrap();
    let e = stoker::open(used.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("a-00000.tfrecord") && e.contains("record 3") && e.contains("checksum"), "walked: {e}");

    // Indexes that do not fit the file are set aside and the file walked (which meets the
    // damage): a record left out (a gap), a record past the end, two records as one (caught
    // by checking record 0's framing), and not an index at all.
    let number = |l: &str, k: usize| l.split(' ').nth(k).unwrap().parse::<u64>().unwrap();
    type Edit = fn(&mut Vec<String>);
    let edits: [(&str, Edit); 4] = [
        ("gap", |l| drop(l.remove(3))),
        ("past", |l| {
            let end: u64 = l.last().unwrap().split(' ').map(|n| n.parse::<u64>().unwrap()).sum();
            l.push(format!("{end} 16"));
        }),
        ("merged", |l| {
            let len: u64 = [&l[0], &l[1]].iter().map(|x| x.split(' ').nth(1).unwrap().parse::<u64>().unwrap()).sum();
            l[0] = format!("0 {len}");
            l.remove(1);
        }),
        ("garbage", |l| l[5] = "five hundred".into()),
    ];
    for (name, edit) in edits {
        let d = root.path().join(name);
        with_tfindex(&dir, &d, edit);
        let e = stoker::open(d.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
        assert!(e.contains("record 3") && e.contains("checksum"), "{name}: set aside and walked: {e}");
    }

    // Two records as one where no checked record is (records 0, 5, 10, ... of 39 are): that
    // one record is a checksum error naming it and the index, never wrong data, and the
    // others read.
    let d = root.path().join("unchecked");
    with_tfindex(&dir, &d, |l| {
        let len = number(&l[1], 1) + number(&l[2], 1);
        l[1] = format!("{} {len}", number(&l[1], 0));
        l.remove(2);
    });
    let src = open(d.to_str().unwrap()).await;
    assert_eq!(src.len(), want.len() - 1);
    let e = src.get(1).await.unwrap_err().to_string();
    assert!(e.contains("a-00000.tfrecord") && e.contains("record 1") && e.contains(".tfindex"), "{e}");
    for i in (0..src.len()).filter(|&i| i != 1) {
        let w = &want[if i < 1 { i } else { i + 1 }];
        assert_eq!(src.get(i).await.unwrap().fields, w.fields, "record {i}");
    }
}
