//! Tar sidecar indexes: built from headers, reused, rebuilt when stale, and placed in a cache
//! directory when they cannot sit next to the shard.

use crate::common;

use common::*;
use stoker::SourceOptions;

const SIDECAR: &str = ".stoker-idx.json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_is_written_reused_and_rebuilt_when_stale() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s.tar");
    let samples = tar_samples(0, 6);
    write_tar(&shard, &samples);
    let uri = shard.to_str().unwrap();
    let src = open(uri).await;
    assert_eq!(src.get(2).await.unwrap().key, samples[2].key);
    let sidecar = dir.path().join(format!("s.tar{SIDECAR}"));
    assert!(sidecar.is_file(), "a sidecar index is written next to the shard");

    // Edit a key inside the sidecar (keeping it consistent): if the next open shows the
    // edit, it used the sidecar instead of re-walking the shard.
    let text = std::fs::read_to_string(&sidecar).unwrap();
    let edited = text.replacen(&samples[2].key, "EDITED", 1);
    assert_ne!(text, edited);
    std::fs::write(&sidecar, edited).unwrap();
    assert_eq!(open(uri).await.get(2).await.unwrap().key, "EDITED", "a fresh sidecar is reused");

    // Rewrite the shard with other content: the sidecar is stale and must be rebuilt.
    let newer = tar_samples(7, 4);
    write_tar(&shard, &newer);
    let src = open(uri).await;
    assert_eq!(src.len(), 4);
    assert_eq!(src.get(2).await.unwrap(), newer[2]);
    assert!(!std::fs::read_to_string(&sidecar).unwrap().contains("EDITED"), "the stale sidecar was replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_sidecar_is_rebuilt_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s.tar");
    let samples = tar_samples(0, 3);
    write_tar(&shard, &samples);
    open(shard.to_str().unwrap()).await;
    let sidecar = dir.path().join(format!("s.tar{SIDECAR}"));
    std::fs::write(&sidecar, b"{not json").unwrap();
    let src = open(shard.to_str().unwrap()).await;
    assert_eq!(src.get(1).await.unwrap(), samples[1]);
    // A well-formed sidecar whose ranges run past the shard is rejected too.
    let text = std::fs::read_to_string(&sidecar).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut bad = v.clone();
    bad["fields"][0][2] = serde_json::json!(1u64 << 40);
    std::fs::write(&sidecar, serde_json::to_vec(&bad).unwrap()).unwrap();
    assert_eq!(open(shard.to_str().unwrap()).await.get(0).await.unwrap(), samples[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwritable_shard_directory_falls_back_to_the_cache_dir() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s.tar");
    let samples = tar_samples(0, 3);
    write_tar(&shard, &samples);
    // Tests run as root, which ignores permission bits; a directory squatting on the sidecar's
    // name makes the write fail for any user.
    std::fs::create_dir(dir.path().join(format!("s.tar{SIDECAR}"))).unwrap();
    let opts = SourceOptions { index_dir: Some(cache.path().to_path_buf()), ..Default::default() };
    let src = stoker::open(shard.to_str().unwrap(), opts.clone()).await.unwrap();
    assert_eq!(src.get(2).await.unwrap(), samples[2]);
    let cached: Vec<_> = std::fs::read_dir(cache.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(cached.len(), 1, "one index in the cache dir: {cached:?}");
    assert!(cached[0].to_string_lossy().ends_with(&format!("s.tar{SIDECAR}")));
    // And it is found there on the next open.
    let path = cache.path().join(&cached[0]);
    let text = std::fs::read_to_string(&path).unwrap().replacen(&samples[2].key, "FROM-CACHE", 1);
    std::fs::write(&path, text).unwrap();
    let again = stoker::open(shard.to_str().unwrap(), opts).await.unwrap();
    assert_eq!(again.get(2).await.unwrap().key, "FROM-CACHE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_sidecar_false_keeps_the_shard_directory_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_tar(&dir.path().join("s.tar"), &tar_samples(0, 2));
    let uri = format!("{}?write_sidecar=false&index_dir={}", dir.path().display(), cache.path().display());
    open(&uri).await;
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "only the shard");
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 1, "the index went to the cache dir");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reads_only_that_samples_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s.tar");
    let samples = tar_samples(0, 20);
    write_tar(&shard, &samples);
    let src = open(shard.to_str().unwrap()).await;
    let before = src.io_counters().unwrap();
    let got = src.get(13).await.unwrap();
    let after = src.io_counters().unwrap();
    assert_eq!(got, samples[13]);
    assert_eq!(after.requests - before.requests, 1, "one ranged read");
    // The fields plus the header in front of each (checked against the index), nothing else.
    let span =
        got.total_bytes() + 2 * 512 + (got.fields[0].data.len().div_ceil(512) * 512 - got.fields[0].data.len()) as u64;
    assert_eq!(after.bytes - before.bytes, span);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_many_coalesces_and_caps_reads() {
    let dir = tempfile::tempdir().unwrap();
    let samples = tar_dir(dir.path(), 2, 30);
    let uri = format!("{}?max_read=40000", dir.path().display());
    let src = open(&uri).await;
    let idx: Vec<usize> = (0..60).collect();
    let before = src.io_counters().unwrap();
    let got = src.get_many(&idx).await.unwrap();
    let reqs = src.io_counters().unwrap().requests - before.requests;
    assert_eq!(got, samples);
    let total: u64 = samples.iter().map(|s| s.total_bytes()).sum();
    assert!(reqs >= total / 40000, "reads are capped at max_read: {reqs} requests for {total} bytes");
    assert!(reqs < 60, "adjacent samples are coalesced: {reqs} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_are_written_used_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let samples = tar_dir(dir.path(), 2, 4);
    let uri = dir.path().to_str().unwrap();
    let report = stoker::index(uri, Default::default()).await.unwrap();
    assert_eq!((report.objects, report.samples, report.layout), (2, 8, stoker::Layout::Tar));
    let manifest = dir.path().join(".stoker-manifest.json");
    assert!(manifest.is_file());
    // Sidecars are not needed once the manifest holds the indexes.
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().ends_with(SIDECAR) {
            std::fs::remove_file(p).unwrap();
        }
    }
    let src = open(uri).await;
    assert_eq!(src.get(5).await.unwrap(), samples[5]);
    assert!(!dir.path().join(format!("shard-0000.tar{SIDECAR}")).exists(), "opened from the manifest, no re-index");
    // A manifest that lies about its shards is an error naming it and the fix.
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["tar"].as_array_mut().unwrap().pop();
    std::fs::write(&manifest, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = stoker::open(uri, Default::default()).await.unwrap_err().to_string();
    assert!(e.contains(".stoker-manifest.json") && e.contains("stoker index"), "{e}");
    assert!(stoker::open(&format!("{uri}?manifest=false"), Default::default()).await.is_ok());
    std::fs::write(&manifest, b"{garbage").unwrap();
    assert!(stoker::open(uri, Default::default()).await.is_err());
    // Re-indexing repairs it.
    stoker::index(uri, Default::default()).await.unwrap();
    assert_eq!(open(uri).await.len(), 8);
}

/// The `resync` fuzz target's invariants over its seeds and a few thousand pseudo-random
/// damages, so they hold in every test run and not only under the fuzzer.
#[test]
fn resync_invariants_hold_over_random_damage() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/resync");
    for e in std::fs::read_dir(&seeds).unwrap() {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        if std::panic::catch_unwind(|| stoker::fuzzing::resync(&data)).is_err() {
            panic!("seed {}", path.display());
        }
    }
    let mut x = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..1000 {
        let n = (next() % 40) as usize;
        let data: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        if std::panic::catch_unwind(|| stoker::fuzzing::resync(&data)).is_err() {
            panic!("input {data:?}");
        }
    }
}

/// A sparse member (GNU tar's `--sparse`, in its pax and its old GNU form) holds the file's
/// map and data runs, not its bytes: refused, naming the member and the fix, not read as
/// other bytes under a placeholder name, nor blamed on a truncated shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_members_are_refused_not_read_as_their_map() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let f = std::fs::File::create(src.join("k1.bin")).unwrap();
    f.set_len(1 << 20).unwrap();
    std::fs::write(src.join("k2.bin"), b"second").unwrap();
    for format in ["pax", "gnu"] {
        let out = dir.path().join(format);
        std::fs::create_dir(&out).unwrap();
        let shard = out.join("s-000000.tar");
        let made = std::process::Command::new("tar")
            .args(["--sparse", &format!("--format={format}"), "-cf"])
            .arg(&shard)
            .arg("-C")
            .arg(&src)
            .args(["k1.bin", "k2.bin"])
            .status()
            .expect("GNU tar");
        assert!(made.success());
        let e = match stoker::open(out.to_str().unwrap(), Default::default()).await {
            Err(e) => e.to_string(),
            Ok(s) => match s.get(0).await {
                Err(e) => e.to_string(),
                Ok(sample) => panic!("{format}: a sparse member read as `{}`", sample.key),
            },
        };
        assert!(e.contains("k1.bin") && e.contains("sparse") && !e.contains("truncated"), "{format}: {e}");
    }
}
