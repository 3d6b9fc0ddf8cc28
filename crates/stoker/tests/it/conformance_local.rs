//! The conformance suite on every local layout and every way of naming one.

use crate::common;

use std::process::Command;

use common::*;
use stoker::conformance::run_all;
use stoker::Layout;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_directory() {
    let dir = tempfile::tempdir().unwrap();
    let expected = objects_dir(dir.path());
    let uri = dir.path().to_str().unwrap();
    let src = open(uri).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Objects));
    run_all(src, &expected, uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_via_file_uri_and_forced_layout() {
    let dir = tempfile::tempdir().unwrap();
    let expected = objects_dir(dir.path());
    let uri = format!("file://{}?layout=objects", dir.path().display());
    run_all(open(&uri).await, &expected, "file://", &[]).await;
}

/// Opened from a listing of names only (what a Ray read task opens from): the whole, and
/// its part of the samples, each looking its files up where it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_from_a_listing_of_names_and_from_a_part_of_it() {
    use stoker::source::{open_with_listing, snapshot_spans};
    let dir = tempfile::tempdir().unwrap();
    let expected = objects_dir(dir.path());
    let uri = dir.path().to_str().unwrap();
    let snap = stoker::loader::list_for_tasks(uri, Default::default()).await.unwrap().snapshot.unwrap();
    assert!(String::from_utf8_lossy(&snap).contains("\"names\""), "listed by name");
    run_all(open_with_listing(uri, Default::default(), &snap).await.unwrap(), &expected, uri, &[]).await;
    let half = expected.len() / 2;
    let parts = snapshot_spans(&snap, &[0..half, half..expected.len()]).unwrap().unwrap();
    let part = open_with_listing(uri, Default::default(), &parts[1]).await.unwrap();
    run_all(part, &expected[half..], uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_directory_of_shards() {
    let dir = tempfile::tempdir().unwrap();
    let expected = tar_dir(dir.path(), 3, 9);
    let uri = dir.path().to_str().unwrap();
    let src = open(uri).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Tar));
    assert_eq!(src.info().shards, 3);
    assert_eq!(src.locality(9), Some(1));
    run_all(src, &expected, uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_brace_pattern_and_single_shard() {
    let dir = tempfile::tempdir().unwrap();
    let expected = tar_dir(dir.path(), 4, 5);
    // Brace pattern naming shards 1..2 only.
    let uri = format!("{}/shard-{{0001..0002}}.tar", dir.path().display());
    run_all(open(&uri).await, &expected[5..15], "shard-{0001..0002}.tar", &[]).await;
    let one = format!("file://{}/shard-0003.tar", dir.path().display());
    run_all(open(&one).await, &expected[15..], "shard-0003.tar", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_written_by_gnu_tar_with_long_names() {
    let dir = tempfile::tempdir().unwrap();
    let src_dir = dir.path().join("src");
    let long = "x".repeat(120);
    let names = [format!("{long}/0001.txt"), format!("{long}/0001.json"), "short/0002.txt".to_string()];
    for (i, n) in names.iter().enumerate() {
        let p = src_dir.join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, payload(i, 1000 + i)).unwrap();
    }
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let status = Command::new("tar")
        .args(["--format=gnu", "-cf"])
        .arg(shards.join("gnu.tar"))
        .arg("-C")
        .arg(&src_dir)
        .args(&names)
        .status()
        .expect("GNU tar must be installed (Debian package `tar`)");
    assert!(status.success());
    let expected = vec![
        sample(&format!("{long}/0001"), &[("txt", payload(0, 1000)), ("json", payload(1, 1001))]),
        sample("short/0002", &[("txt", payload(2, 1002))]),
    ];
    let uri = shards.to_str().unwrap();
    run_all(open(uri).await, &expected, uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_written_by_python_tarfile_pax() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("py.tar");
    let expected = python_fixture("tarfile", &shard);
    assert!(expected.iter().any(|s| s.key.len() > 100), "the fixture must need PAX long names");
    assert!(expected.iter().any(|s| !s.key.is_ascii()), "the fixture must need PAX for non-ASCII names");
    let uri = shard.to_str().unwrap();
    run_all(open(uri).await, &expected, uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmdb_written_by_heed() {
    let dir = tempfile::tempdir().unwrap();
    let mut records: Vec<(Vec<u8>, Vec<u8>)> =
        (0..300).map(|i| (format!("k{:04}", (i * 7) % 300).into_bytes(), payload(i, (i * 97) % 9000))).collect();
    write_lmdb(dir.path(), &records);
    records.sort();
    let expected: Vec<_> =
        records.iter().map(|(k, v)| sample(std::str::from_utf8(k).unwrap(), &[("data", v.clone())])).collect();
    let uri = dir.path().to_str().unwrap();
    let src = open(uri).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Lmdb));
    run_all(src, &expected, uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmdb_written_by_py_lmdb_never_gets_a_lock_file_from_us() {
    let dir = tempfile::tempdir().unwrap();
    let env = dir.path().join("env");
    let expected = python_fixture("lmdb", &env);
    // py-lmdb leaves its lock.mdb; remove it to prove Stoker never writes one.
    let _ = std::fs::remove_file(env.join("lock.mdb"));
    let uri = format!("{}?field=bin", env.display());
    let renamed: Vec<_> = expected.iter().map(|s| sample(&s.key, &[("bin", s.fields[0].data.to_vec())])).collect();
    run_all(open(&uri).await, &renamed, env.to_str().unwrap(), &[]).await;
    assert!(!env.join("lock.mdb").exists(), "opening must not create lock.mdb");
    // data.mdb itself is also accepted as the URI.
    let src = open(env.join("data.mdb").to_str().unwrap()).await;
    assert_eq!(src.len(), expected.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_mixing_small_and_large_samples() {
    // Samples above and below the direct-read threshold, interleaved, multi-field.
    let dir = tempfile::tempdir().unwrap();
    let sizes = [100usize, 40_000, 70_000, 10, 33_000, 1, 300_000, 2_000];
    let samples: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| sample(&format!("k{i:03}"), &[("bin", payload(i, n)), ("txt", payload(i + 50, n / 3))]))
        .collect();
    write_tar(&dir.path().join("a.tar"), &samples[..5]);
    write_tar(&dir.path().join("b.tar"), &samples[5..]);
    let uri = dir.path().to_str().unwrap();
    run_all(open(uri).await, &samples, uri, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmdb_with_large_values() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<(Vec<u8>, Vec<u8>)> = [0usize, 1, 5000, 70_000, 300_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| (vec![b'a' + i as u8], payload(i, n)))
        .collect();
    write_lmdb(dir.path(), &records);
    let expected: Vec<_> =
        records.iter().map(|(k, v)| sample(std::str::from_utf8(k).unwrap(), &[("data", v.clone())])).collect();
    let uri = dir.path().to_str().unwrap();
    run_all(open(uri).await, &expected, uri, &[]).await;
}
