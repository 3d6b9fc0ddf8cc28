//! Corrupt and changed data: a clear error, or under the Loader's Skip policy a counted skip,
//! and never another sample's bytes delivered. Damage found when opening (truncated tars, bad
//! checksums, garbage, truncated LMDB at open) is in bad_input.rs; stale sidecars rebuilt on
//! a size or mtime change are in tar_index.rs. Here: damage after indexing, the same-size
//! rewrite, manifests that lie, LMDB cut at many points, and the S3 variants.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use futures::StreamExt;
use stoker::loader::{ErrorPolicy, Loader, LoaderConfig};
use stoker::{DynSampleSource, Error, Sample};

const SIDECAR: &str = ".stoker-idx.json";

/// The bytes of sample `key`, derivable from the key alone; equal lengths for all keys of
/// one `len`, so a rewrite can move samples without changing the shard's size.
fn content(key: &str, len: usize) -> Vec<u8> {
    let h = key.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    (0..len).map(|i| (h >> (i % 8 * 8)) as u8 ^ (i / 8) as u8).collect()
}

fn samples(keys: impl IntoIterator<Item = usize>, len: usize) -> Vec<Sample> {
    keys.into_iter()
        .map(|i| {
            let k = format!("k{i:04}");
            let data = content(&k, len);
            sample(&k, &[("bin", data)])
        })
        .collect()
}

/// Rewrite `path` in place (same inode) with `new` samples, then put its modification time
/// back: size, mtime and the local entity tag (inode, mtime, size) all stay the same.
fn rewrite_keeping_metadata(path: &Path, new: &[Sample]) {
    let before = std::fs::metadata(path).unwrap();
    let staged = path.with_extension("staged");
    write_tar(&staged, new);
    let bytes = std::fs::read(&staged).unwrap();
    std::fs::remove_file(&staged).unwrap();
    assert_eq!(bytes.len() as u64, before.len(), "the rewrite keeps the size");
    std::fs::write(path, bytes).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(before.modified().unwrap()).unwrap();
    drop(f);
    let after = std::fs::metadata(path).unwrap();
    assert_eq!((after.len(), after.modified().unwrap()), (before.len(), before.modified().unwrap()));
}

/// Run one epoch with the Skip policy: the delivered samples (each checked against the bytes
/// its key must hold) and the skip count.
async fn skip_epoch(src: Arc<DynSampleSource>, len: usize) -> (Vec<String>, u64) {
    let (keys, stats) = skip_epoch_stats(src, len).await;
    (keys, stats.skipped)
}

/// [`skip_epoch`] with the loader's stats.
async fn skip_epoch_stats(src: Arc<DynSampleSource>, len: usize) -> (Vec<String>, stoker::StatsSnapshot) {
    let mut cfg = LoaderConfig::new(4);
    cfg.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(src, cfg).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let mut keys = Vec::new();
    while let Some(b) = stream.next().await {
        let b = b.expect("the skip policy delivers what it can read");
        let Some(col) = b.field("bin") else {
            assert!(b.is_empty());
            continue;
        };
        for row in 0..b.len() {
            let k = b.key(row).unwrap();
            assert_eq!(col.get(row).unwrap(), &content(k, len)[..], "sample {k} delivered with wrong bytes");
            keys.push(k.to_string());
        }
    }
    (keys, loader.stats())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_rewritten_at_the_same_size_and_mtime_is_detected_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s.tar");
    let old = samples(0..12, 700);
    write_tar(&shard, &old);
    let uri = shard.to_str().unwrap();
    assert_eq!(open(uri).await.get(3).await.unwrap(), old[3]);
    assert!(dir.path().join(format!("s.tar{SIDECAR}")).is_file());

    // Same keys, same sizes, another order: every member moves, nothing in the metadata does.
    let new = samples((0..12).rev(), 700);
    rewrite_keeping_metadata(&shard, &new);
    let src = open(uri).await;
    assert_eq!(src.len(), 12, "the sidecar looked fresh and was used");
    for i in [0, 3, 11] {
        let e = src.get(i).await.unwrap_err();
        assert!(matches!(e, Error::CorruptTar { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("s.tar") && msg.contains("rewritten") && msg.contains(SIDECAR), "{msg}");
    }
    let e = src.get_many(&[0, 1, 2]).await.unwrap_err();
    assert!(e.to_string().contains("rewritten"), "{e}");
    // The Loader (local reads straight into batches) under Skip: counted, never misread.
    let (delivered, skipped) = skip_epoch(src, 700).await;
    assert_eq!((delivered.len(), skipped), (0, 12), "{delivered:?}");

    // Following the error's advice rebuilds the index and reads the new order.
    std::fs::remove_file(dir.path().join(format!("s.tar{SIDECAR}"))).unwrap();
    let src = open(uri).await;
    for (i, want) in new.iter().enumerate() {
        assert_eq!(&src.get(i).await.unwrap(), want);
    }
    // The same size with a new modification time (an ordinary rewrite) needs no advice: the
    // sidecar no longer matches and is rebuilt at open.
    rewrite_keeping_metadata(&shard, &old);
    let f = std::fs::File::options().write(true).open(&shard).unwrap();
    f.set_modified(f.metadata().unwrap().modified().unwrap() + std::time::Duration::from_secs(1)).unwrap();
    drop(f);
    let src = open(uri).await;
    for (i, want) in old.iter().enumerate() {
        assert_eq!(&src.get(i).await.unwrap(), want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_after_indexing_is_an_error_or_a_counted_skip() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("s.tar");
    let all = samples(0..20, 3000);
    write_tar(&shard, &all);
    let src = open(shard.to_str().unwrap()).await;
    let pristine = std::fs::read(&shard).unwrap();
    let member = 512 + 3000usize.div_ceil(512) * 512;

    // Garbage over the 6th member's header; the 3rd one's payload untouched.
    let mut bytes = pristine.clone();
    bytes[5 * member..5 * member + 300].copy_from_slice(&payload(1, 300));
    std::fs::write(&shard, &bytes).unwrap();
    let e = src.get(5).await.unwrap_err();
    assert!(matches!(e, Error::CorruptTar { offset, .. } if offset == 5 * member as u64), "{e:?}");
    assert_eq!(src.get(2).await.unwrap(), all[2], "other samples stay readable");
    let (keys, skipped) = skip_epoch(src.clone(), 3000).await;
    assert_eq!((keys.len(), skipped), (19, 1));
    assert!(!keys.contains(&"k0005".to_string()));

    // Cut short after it was opened: the file is not the one indexed, so no read of it is
    // served, before the cut or past it (as for a remote object whose version changed); each
    // fails naming the shard and both sizes.
    std::fs::write(&shard, &pristine[..8 * member + 100]).unwrap();
    for i in [15, 1] {
        let e = src.get(i).await.unwrap_err();
        assert!(matches!(e, Error::Changed { .. }), "{e:?}");
        assert!(e.to_string().contains("s.tar") && e.to_string().contains("28772 bytes now"), "{e}");
    }
    let (keys, stats) = skip_epoch_stats(src, 3000).await;
    assert_eq!((keys.len(), stats.skipped, stats.skipped_by_cause.unreadable_shard), (0, 20, 20), "{keys:?}");
    // Opened again, the shard as it is now is indexed, and its cut is the error.
    let e = stoker::open(shard.to_str().unwrap(), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::CorruptTar { .. }), "{e:?}");
    assert!(e.to_string().contains("s.tar") && e.to_string().contains("truncated"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_that_lie_are_errors_or_corrected() {
    let dir = tempfile::tempdir().unwrap();
    let all = tar_dir(dir.path(), 2, 5);
    let uri = dir.path().to_str().unwrap();
    stoker::index(uri, Default::default()).await.unwrap();
    let manifest = dir.path().join(".stoker-manifest.json");
    let original: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let write = |v: &serde_json::Value| std::fs::write(&manifest, serde_json::to_vec(v).unwrap()).unwrap();
    let open_err = |uri: String| async move { stoker::open(&uri, Default::default()).await.unwrap_err().to_string() };

    // Counts: more keys than samples in the field table.
    let mut v = original.clone();
    v["tar"][0]["keys"].as_array_mut().unwrap().push("ghost".into());
    write(&v);
    let e = open_err(uri.into()).await;
    assert!(e.contains(".stoker-manifest.json") && e.contains("stoker index"), "{e}");
    // Offsets shifted by one member: consistent, inside the shard, and wrong.
    let mut v = original.clone();
    for f in v["tar"][1]["fields"].as_array_mut().unwrap() {
        let off = f[1].as_u64().unwrap();
        f[1] = (off + 1024).into();
    }
    let last_end =
        v["tar"][1]["fields"].as_array().unwrap().iter().map(|f| f[1].as_u64().unwrap() + f[2].as_u64().unwrap()).max();
    assert!(last_end.unwrap() <= v["tar"][1]["size"].as_u64().unwrap(), "the lie stays inside the shard");
    write(&v);
    let src = open(uri).await;
    let e = src.get(6).await.unwrap_err();
    assert!(matches!(e, Error::CorruptTar { .. }), "{e:?}");
    assert_eq!(src.get(1).await.unwrap(), all[1], "the honest shard still reads");
    // Sizes: a shard recorded at another size is re-checked (a stat) and re-indexed.
    let mut v = original.clone();
    v["tar"][0]["size"] = (v["tar"][0]["size"].as_u64().unwrap() + 4096).into();
    v["objects"][0]["size"] = v["tar"][0]["size"].clone();
    write(&v);
    let src = open(uri).await;
    for (i, want) in all.iter().enumerate() {
        assert_eq!(&src.get(i).await.unwrap(), want);
    }
    // A shard replaced since `stoker index` (new content, new size): re-indexed too.
    let newer = tar_samples(7, 3);
    write_tar(&dir.path().join("shard-0000.tar"), &newer);
    write(&original);
    let src = open(uri).await;
    assert_eq!(src.len(), 3 + 5);
    assert_eq!(src.get(2).await.unwrap(), newer[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_objects_manifest_that_lies_about_sizes_fails_the_read() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..4 {
        std::fs::write(dir.path().join(format!("{i}.bin")), payload(i, 100 + i)).unwrap();
    }
    let uri = dir.path().to_str().unwrap();
    stoker::index(uri, Default::default()).await.unwrap();
    let manifest = dir.path().join(".stoker-manifest.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    v["objects"][2]["size"] = 5000.into();
    std::fs::write(&manifest, serde_json::to_vec(&v).unwrap()).unwrap();
    let src = open(uri).await;
    let mut cfg = LoaderConfig::new(2);
    cfg.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let mut got = HashMap::new();
    let mut stream = loader.epoch(0).unwrap();
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        for row in 0..b.len() {
            got.insert(b.key(row).unwrap().to_string(), b.field("bin").unwrap().get(row).unwrap().to_vec());
        }
    }
    assert_eq!(loader.stats().skipped, 1);
    assert!(!got.contains_key("2"));
    for (k, data) in got {
        let i: usize = k.parse().unwrap();
        assert_eq!(data, payload(i, 100 + i), "sample {k}");
    }
    let e = src.get_many(&[2]).await;
    if let Err(e) = e {
        assert!(e.to_string().contains("2.bin"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmdb_cut_anywhere_fails_at_open_or_reads_right() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<_> = (0..40).map(|i| (format!("{i:03}").into_bytes(), payload(i, 3000 + i * 10))).collect();
    write_lmdb(dir.path(), &records);
    let data = std::fs::read(dir.path().join("data.mdb")).unwrap();
    let len = data.len();
    let mut cuts = vec![0, 1, 100, 4095, 4096, 4097, 8191, 8192, 8193, len / 2, len - 4097, len - 4096, len - 1];
    cuts.extend((1..len / 4096).map(|p| p * 4096 - 1));
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("data.mdb"), &data[..cut]).unwrap();
        match stoker::open(d.path().to_str().unwrap(), Default::default()).await {
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("data.mdb") && (msg.contains("truncated") || msg.contains("LMDB")),
                    "cut {cut}: {msg}"
                );
            }
            Ok(src) => {
                // Only a cut in the unused tail may open; then every record must read right.
                for (i, (_, v)) in records.iter().enumerate() {
                    assert_eq!(&src.get(i).await.unwrap().fields[0].data[..], &v[..], "cut {cut}, record {i}");
                }
            }
        }
    }
}

/// A node of `data.mdb` whose value size is damaged (claiming 16 MiB or 4 GiB in a file of a
/// few pages): LMDB hands out a slice that long from the node; touching it past the file's
/// end would kill the process with SIGBUS. The read is an error naming the key and the file,
/// and every other record still reads right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lmdb_value_claiming_bytes_past_the_file_is_an_error_not_a_crash() {
    let records: Vec<_> = (0..10)
        .map(|i| (if i == 4 { b"MARKERKEY".to_vec() } else { format!("k{i:03}").into_bytes() }, payload(i, 100)))
        .collect();
    // The second time through a symlink, as hub and DVC caches keep files.
    for (hi, linked) in [(0x00ffu16, false), (0xffff, true)] {
        let dir = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        write_lmdb(if linked { target.path() } else { dir.path() }, &records);
        if linked {
            std::os::unix::fs::symlink(target.path().join("data.mdb"), dir.path().join("data.mdb")).unwrap();
        }
        let path = dir.path().join("data.mdb");
        let mut data = std::fs::read(&path).unwrap();
        let at = data.windows(9).position(|w| w == b"MARKERKEY").unwrap();
        // The node's header: size low and high halves, flags, key size (9).
        assert_eq!(u16::from_le_bytes([data[at - 2], data[at - 1]]), 9);
        data[at - 8..at - 6].copy_from_slice(&0xffffu16.to_le_bytes());
        data[at - 6..at - 4].copy_from_slice(&hi.to_le_bytes());
        std::fs::write(&path, &data).unwrap();
        let src = stoker::open(dir.path().to_str().unwrap(), Default::default()).await.unwrap();
        let order: Vec<usize> = (0..src.len()).collect();
        // LMDB orders keys bytewise.
        let mut keys: Vec<&[u8]> = records.iter().map(|(k, _)| &k[..]).collect();
        keys.sort_unstable();
        let marker = keys.iter().position(|k| k == b"MARKERKEY").unwrap();
        for i in order {
            match src.get(i).await {
                Ok(s) => {
                    assert_ne!(i, marker, "the damaged value was read");
                    let want = &records.iter().find(|(k, _)| k == s.key.as_bytes()).unwrap().1;
                    assert_eq!(&s.fields[0].data[..], &want[..], "record {i}");
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert_eq!(i, marker, "{msg}");
                    assert!(msg.contains("data.mdb") && msg.contains("MARKERKEY") && msg.contains("damaged"), "{msg}");
                }
            }
        }
        // A batch holding it fails the same way, without touching the bytes.
        let e = src.get_many(&(0..src.len()).collect::<Vec<_>>()).await.unwrap_err().to_string();
        assert!(e.contains("MARKERKEY") && e.contains("damaged"), "{e}");
    }
}

/// A damaged page header or node table in `data.mdb`'s B-tree: LMDB follows the numbers it
/// finds there without a check, reading outside its map (SIGSEGV) or past the file (SIGBUS),
/// which ended the process at open in 11 of 72 damaged copies a hunt made. Every page of a
/// tree with branch, leaf and overflow pages is damaged in turn: the open fails naming the
/// file, or every record reads right (a damaged overflow header leaves the value intact).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmdb_damaged_page_headers_fail_at_open_not_the_process() {
    let records: Vec<_> =
        (0..300).map(|i| (format!("k{i:04}").into_bytes(), payload(i, if i % 7 == 0 { 5000 } else { 60 }))).collect();
    let dir = tempfile::tempdir().unwrap();
    write_lmdb(dir.path(), &records);
    let data = std::fs::read(dir.path().join("data.mdb")).unwrap();
    let pages = data.len() / 4096;
    let kind = |p: usize| u16::from_le_bytes([data[p * 4096 + 10], data[p * 4096 + 11]]);
    // Pages with a header (the others continue an overflow run: value bytes, which LMDB
    // does not check and Stoker cannot).
    let headed = |p: usize| u64::from_le_bytes(data[p * 4096..p * 4096 + 8].try_into().unwrap()) == p as u64;
    let tree: Vec<usize> = (2..pages).filter(|&p| headed(p) && matches!(kind(p), 1 | 2)).collect();
    let runs: Vec<usize> = (2..pages).filter(|&p| headed(p) && kind(p) == 4).collect();
    assert!(tree.iter().any(|&p| kind(p) == 1) && tree.len() > 3 && !runs.is_empty(), "{tree:?} {runs:?}");
    let (mut refused, mut read) = (0, 0);
    for p in tree.iter().chain(&runs).copied() {
        let mut damages: Vec<(usize, Vec<u8>)> = vec![(0, vec![0; 16]), (12, vec![0xff; 4])];
        if tree.contains(&p) {
            damages.push((16, vec![0xff; 8]));
            damages.push((0, ((p as u64) + 1).to_le_bytes().to_vec()));
        }
        for (at, bytes) in damages {
            let mut copy = data.clone();
            copy[p * 4096 + at..p * 4096 + at + bytes.len()].copy_from_slice(&bytes);
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join("data.mdb"), &copy).unwrap();
            let case = format!("page {p} (flags {:#x}), bytes {at}..{}", kind(p), at + bytes.len());
            match stoker::open(d.path().to_str().unwrap(), Default::default()).await {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains("data.mdb") && msg.contains("damaged"), "{case}: {msg}");
                    refused += 1;
                }
                Ok(src) => {
                    assert!(!tree.contains(&p), "{case}: a tree page damaged, opened");
                    for (i, (k, v)) in records.iter().enumerate() {
                        let s = src.get(i).await.unwrap_or_else(|e| panic!("{case}, record {i}: {e}"));
                        assert_eq!((s.key.as_bytes(), &s.fields[0].data[..]), (&k[..], &v[..]), "{case}, record {i}");
                    }
                    read += 1;
                }
            }
        }
    }
    assert_eq!((refused, read), (4 * tree.len(), 2 * runs.len()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_shard_replaced_after_indexing_is_an_etag_mismatch_not_other_bytes() {
    use common::s3::{uri, SK};
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("data/ds");
    std::fs::create_dir_all(&bucket).unwrap();
    let old = samples(0..10, 900);
    write_tar(&bucket.join("a.tar"), &old);
    let server = common::s3::serve(root.path()).await;
    let ep = server.endpoint();
    stoker::index(&uri(&ep, "ds", ""), Default::default()).await.unwrap();
    for extra in ["", "&cache_bytes=8388608&cache_block=4096"] {
        let src = open(&uri(&ep, "ds", extra)).await;
        assert_eq!(src.get(4).await.unwrap(), old[4], "{extra}");
    }

    // Replaced on the server with the same size: the manifest (one GET, no listing) still
    // describes the old object. Reads carry its entity tag (If-Match), which real S3 checks;
    // s3s-fs 0.14 ignores If-Match on GET, and then the member header check catches it.
    write_tar(&bucket.join("a.tar"), &samples((0..10).rev(), 900));
    for extra in ["", "&cache_bytes=8388608&cache_block=4096"] {
        let src = open(&uri(&ep, "ds", extra)).await;
        let e = src.get(4).await.unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("a.tar")
                && (msg.contains("replaced") || msg.contains("rewritten"))
                && msg.contains("stoker index"),
            "{extra}: {msg}"
        );
        assert!(!e.is_retryable(), "retrying cannot bring the old object back: {e:?}");
        assert!(!msg.contains(SK));
        let (delivered, skipped) = skip_epoch(src, 900).await;
        assert_eq!((delivered.len(), skipped), (0, 10), "{extra}");
    }
    // Without the manifest the listing shows the new tag: the stale sidecar is rebuilt.
    let src = open(&uri(&ep, "ds", "&manifest=false")).await;
    assert_eq!(src.get(0).await.unwrap().key, "k0009");
    let (delivered, skipped) = skip_epoch(src, 900).await;
    assert_eq!((delivered.len(), skipped), (10, 0));
}
