//! HDF5 files written by h5py (its default format and `libver="latest"`, every dataset kind the
//! field convention names, chunked with gzip, shuffle and LZF) through the conformance suite
//! locally and over S3; damaged chunks, truncated files and lying headers are clear errors
//! naming the file, in bounded memory.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::s3::{uri, SK};
use common::*;
use futures::StreamExt;
use stoker::conformance::run_all;
use stoker::{ErrorPolicy, Layout, Loader, LoaderConfig, Sample};

fn fixture(kind: &str, dir: &Path) -> Vec<Sample> {
    script_fixture(&writers_python(), "write_hdf5.py", &[kind], dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hdf5_files_of_h5py_pass_conformance_locally_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let (mixed, latest) = (root.path().join("data").join("mixed"), root.path().join("data").join("latest"));
    let want = fixture("mixed", &mixed);
    let src = open(mixed.to_str().unwrap()).await;
    assert_eq!((src.info().known_layout(), src.info().shards), (Some(Layout::Hdf5), 2));
    run_all(src, &want, "mixed", &[]).await;
    let want_latest = fixture("latest", &latest);
    run_all(open(latest.to_str().unwrap()).await, &want_latest, "latest", &[]).await;
    let server = common::s3::serve(root.path()).await;
    run_all(open(&uri(&server.endpoint(), "mixed", "")).await, &want, "s3://data/mixed", &[SK]).await;
    run_all(open(&uri(&server.endpoint(), "latest", "")).await, &want_latest, "s3://data/latest", &[SK]).await;
}

/// Where the chunks of `dataset` lie in `file`: (byte offset, stored size), from h5py.
fn chunks(file: &Path, dataset: &str) -> Vec<(usize, usize)> {
    let out =
        common::writers::run_script(&writers_python(), "write_hdf5.py", &["chunks", file.to_str().unwrap(), dataset]);
    assert!(out.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_chunks_are_named_and_the_skip_policy_counts_their_rows() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("mixed");
    let want = fixture("mixed", &dir);
    let file = dir.join("a-00000.h5");
    let good = std::fs::read(&file).unwrap();
    // Chunk 2 of `emb` (rows 8..12, gzip): a flipped byte fails zlib's checksum or inflate.
    let (at, len) = chunks(&file, "emb")[2];
    let mut bad = good.clone();
    bad[at + len / 2] ^= 0x20;
    std::fs::write(&file, &bad).unwrap();
    let src = open(dir.to_str().unwrap()).await;
    let e = src.get(9).await.unwrap_err();
    let shown = e.to_string();
    assert!(shown.contains("a-00000.h5") && shown.contains("emb") && shown.contains("000000009"), "{shown}");
    assert_eq!(e.kind(), stoker::ErrorKind::Corrupt, "{shown}");
    assert_eq!(src.get(12).await.unwrap(), want[12], "the rows around it read");

    let mut cfg = LoaderConfig::new(8);
    cfg.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let mut got = HashMap::new();
    let mut stream = loader.epoch(0).unwrap();
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        for row in 0..b.len() {
            got.insert(b.key(row).unwrap().to_string(), b.field("emb").unwrap().get(row).unwrap().to_vec());
        }
    }
    assert_eq!(loader.stats().skipped, 4, "the four rows of the damaged chunk");
    assert_eq!(got.len(), want.len() - 4);
    for s in want.iter().filter(|s| got.contains_key(&s.key)) {
        assert_eq!(got[&s.key], &s.field("emb").unwrap()[..], "{}", s.key);
    }

    // An LZF chunk cut short: a clear error, not a panic or a short row.
    let (at, len) = chunks(&file, "pixels")[1];
    let mut bad = good.clone();
    bad[at..at + len].iter_mut().for_each(|b| *b = 0xff);
    std::fs::write(&file, &bad).unwrap();
    let e = open(dir.to_str().unwrap()).await.get(4).await.unwrap_err().to_string();
    assert!(e.contains("a-00000.h5") && e.contains("pixels") && e.contains("LZF"), "{e}");

    // Truncated: an error naming the file, at open or at the first read past the cut.
    for cut in [good.len() / 2, 600, 40] {
        std::fs::write(&file, &good[..cut]).unwrap();
        let e = match stoker::open(dir.to_str().unwrap(), Default::default()).await {
            Err(e) => e,
            Ok(src) => {
                let mut all = Vec::new();
                for i in 0..src.len() {
                    all.push(src.get(i).await);
                }
                all.into_iter().find_map(|r| r.err()).expect("a truncated file reads whole")
            }
        };
        assert!(e.to_string().contains("a-00000.h5"), "cut at {cut}: {e}");
    }
    // A billion rows claimed by a file of a few KB: refused at open, before anything is sized by it.
    let claims = root.path().join("claims");
    fixture("claims", &claims);
    let e = stoker::open(claims.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("d.h5") && e.contains("claim 1000000000 rows"), "{e}");
    // Two datasets that would be one field: refused, unless columns= names one.
    let clash = root.path().join("clash");
    fixture("clash", &clash);
    let e = stoker::open(clash.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("k.h5") && e.contains("`meta.ids` and `meta/ids` are both field `meta.ids`"), "{e}");
    for (name, want) in [("meta/ids", "1"), ("meta.ids", "101")] {
        let src = stoker::open(&format!("{}?columns={name}", clash.display()), Default::default()).await.unwrap();
        assert_eq!(&src.get(1).await.unwrap().fields[0].data[..], want.as_bytes(), "{name}");
    }
    // A row of 512 MB that was never written: refused at open, not made of fill values.
    let fill = root.path().join("fill");
    fixture("fill", &fill);
    let e = stoker::open(fill.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("f.h5") && e.contains("`x` claims 512000000 bytes of rows") && e.contains("columns="), "{e}");
    // Groups reached by more paths than a walk can take: refused at open, not walked for hours.
    let links = root.path().join("links");
    fixture("links", &links);
    let e = stoker::open(links.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("l.h5") && e.contains("more than 4096 groups"), "{e}");
    // Not HDF5 at all.
    std::fs::write(&file, b"just some text, not a hierarchical data format file").unwrap();
    let e = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("a-00000.h5") && e.contains("not a readable HDF5 file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_pick_datasets_and_a_key_dataset_names_the_samples() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("mixed");
    let want = fixture("mixed", &dir);
    let src = stoker::open(&format!("{}?columns=label,meta.ids", dir.display()), Default::default()).await.unwrap();
    let s = src.get(40).await.unwrap();
    let names: Vec<&str> = s.fields.iter().map(|f| &*f.name).collect();
    assert_eq!(names, ["label", "meta.ids"]);
    assert_eq!(s.field("label"), want[40].field("label"));
    // A dataset of another length, named: refused with the reason.
    let e = stoker::open(&format!("{}?columns=label,classes", dir.display()), Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("classes") && e.contains("first dimension"), "{e}");
    let e = stoker::open(&format!("{}?columns=nope", dir.display()), Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("nope") && e.contains("meta/ids"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_files_are_errors_naming_the_file_never_panics() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("latest");
    fixture("latest", &dir);
    let file = dir.join("c.h5");
    let good = std::fs::read(&file).unwrap();
    // A small xorshift: the same mutations every run. Most land in the metadata h5py writes at
    // the front; a few anywhere.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut refused, mut read) = (0, 0);
    for round in 0..150 {
        let mut bad = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = if round % 4 == 0 { next() as usize % bad.len() } else { next() as usize % 4096.min(bad.len()) };
            bad[at] = next() as u8;
        }
        std::fs::write(&file, &bad).unwrap();
        let errors = match stoker::open(dir.to_str().unwrap(), Default::default()).await {
            Err(e) => vec![e],
            Ok(src) => {
                let mut errors = Vec::new();
                for i in (0..src.len()).step_by(7) {
                    if let Err(e) = src.get(i).await {
                        errors.push(e);
                    }
                }
                errors
            }
        };
        if errors.is_empty() {
            read += 1;
        } else {
            refused += 1;
        }
        for e in errors {
            let e = e.to_string();
            assert!(e.contains("c.h5"), "round {round}: {e}");
            assert!(!e.contains("reader failed"), "round {round}: the reader panicked: {e}");
        }
    }
    assert!(refused > 10 && read > 0, "{refused} refused, {read} read");
}

/// A shuffled pass over compressed chunks (50 of them, more than the 1 MiB of decoded chunks
/// kept) decodes each chunk once and spills its rows; the next pass reads nothing from the
/// file. With `disk_cache=false` (no spill) chunks are decoded again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffled_pass_decodes_each_compressed_chunk_once_and_the_next_reads_the_spill() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("gzip");
    let want = fixture("gzip", &dir);
    let size = std::fs::metadata(dir.join("g.h5")).unwrap().len();
    // A fixed shuffle of the 400 rows, read in batches of 16.
    let mut order: Vec<usize> = (0..want.len()).collect();
    let mut rng = stoker_testkit::rng::XorShift64::new(3);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.up_to(i as u64) as usize);
    }
    let pass = |src: std::sync::Arc<stoker::DynSampleSource>| {
        let (order, want) = (order.clone(), want.clone());
        async move {
            let before = src.io_counters().unwrap().bytes;
            for batch in order.chunks(16) {
                let got = src.get_many(batch).await.unwrap();
                for (&i, s) in batch.iter().zip(got) {
                    assert!(s == want[i], "row {i}");
                }
            }
            src.io_counters().unwrap().bytes - before
        }
    };
    let opts = "?decoded_bytes=1048576";
    let spilled = open(&format!("{}{opts}", dir.display())).await;
    let first = pass(spilled.clone()).await;
    // The file once, and its chunk index and `label` rows: a chunk decoded twice is 2% more.
    assert!(first < size + size / 25, "the first pass read {first} bytes of a {size}-byte file: chunks decoded twice");
    assert_eq!(pass(spilled.clone()).await, 0, "the second pass read the file again");
    let unspilled = open(&format!("{}{opts}&disk_cache=false", dir.display())).await;
    let again = pass(unspilled.clone()).await + pass(unspilled).await;
    assert!(again > 4 * size, "without a spill two passes read {again} bytes of a {size}-byte file");

    // The conformance suite over spilled units, locally and over S3.
    run_all(open(dir.to_str().unwrap()).await, &want, "gzip", &[]).await;
    let server = common::s3::serve(root.path()).await;
    // The disk cache on (the helper turns it off otherwise), and with it the spill.
    run_all(open(&uri(&server.endpoint(), "gzip", "&disk_cache=true")).await, &want, "s3://data/gzip", &[SK]).await;

    // A damaged chunk (rows 24..32): its rows fail, named; the rows of the units around it read.
    let file = dir.join("g.h5");
    let (at, len) = chunks(&file, "data")[3];
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at + len / 2] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();
    let src = open(dir.to_str().unwrap()).await;
    let e = src.get_many(&[20, 26, 33]).await.unwrap_err().to_string();
    assert!(e.contains("g.h5") && e.contains("data") && e.contains("000000026"), "{e}");
    assert_eq!(src.get_many(&[20, 33]).await.unwrap(), vec![want[20].clone(), want[33].clone()]);
    assert_eq!(src.get_many(&[23, 32]).await.unwrap(), vec![want[23].clone(), want[32].clone()]);
}

/// A chunk larger than `decoded_bytes` allows is not damage: the error is the option's,
/// naming it, and the file reads once it is raised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_over_decoded_bytes_names_the_option_not_damage() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("bigchunk");
    fixture("bigchunk", &dir);
    // Chunks of 20 MB against the smallest cap, 16 MiB.
    let src = open(&format!("{}?decoded_bytes=1", dir.display())).await;
    let e = src.get(0).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, stoker::Error::InvalidOption { .. }) && msg.contains("decoded_bytes="), "{e:?}");
    assert!(msg.contains("z.h5") && msg.contains("`data`") && !msg.contains("damaged"), "{msg}");
    let src = open(&format!("{}?decoded_bytes=67108864", dir.display())).await;
    assert_eq!(src.get(1).await.unwrap().fields[0].data.len(), 20_000_000 + 128);
}

/// Keys of bytes that are not UTF-8 stay distinct (a lossy conversion made `k\xff` and `k\xfe`
/// one key), written as LMDB's are: `\xNN`, and a backslash doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_are_not_utf8_stay_distinct() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("badkeys");
    let want = fixture("badkeys", &dir);
    let src = open(dir.to_str().unwrap()).await;
    let keys: Vec<String> = src.get_many(&[0, 1, 2, 3]).await.unwrap().into_iter().map(|s| s.key).collect();
    assert_eq!(keys, ["k\\xff", "k\\xfe", "a\\\\b", "plain"]);
    assert_eq!(stoker::sample::unescape_key(&keys[0]).as_ref(), b"k\xff");
    run_all(src, &want, "badkeys", &[]).await;
}

/// A dataset whose values HDF5 keeps in another file is refused at open, naming the dataset and
/// the file (Stoker reads only the file it is given); the others still read without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_stored_in_another_file_is_not_read_from_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("external");
    fixture("external", &dir);
    // Only the HDF5 file is a shard: raw.bin is not .h5.
    let e = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, stoker::Error::NotSupported { .. }), "{e:?}");
    assert!(msg.contains("e.h5") && msg.contains("`data`") && msg.contains("columns="), "{msg}");
    let src = open(&format!("{}?columns=label", dir.display())).await;
    assert_eq!(src.len(), 12);
    // Nor is a link to another file followed: named, it is not a dataset here, and why.
    let e = stoker::open(&format!("{}?columns=label,linked", dir.display()), Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`linked`") && e.contains("not followed"), "{e}");
    assert_eq!(src.get(7).await.unwrap().field("label").map(|b| &b[..]), Some(&b"7"[..]));
}

/// A header that contradicts itself is refused at open, not read as rows the file does not
/// hold (libhdf5 refuses both): a dimension past its own maximum (8 rows made 64, the rest
/// fill values; or every row reshaped), and a chunk index naming a chunk off the chunk grid
/// (that chunk's rows read as zeros). Without `columns=`, the damaged dataset is not left out
/// quietly either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_that_contradicts_itself_is_refused_not_read_as_fill_values() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("selfcheck");
    fixture("selfcheck", &dir);
    let file = dir.join("s.h5");
    let good = std::fs::read(&file).unwrap();
    assert_eq!(open(dir.to_str().unwrap()).await.len(), 8);
    let find = |hay: &[u8], pat: &[u8]| hay.windows(pat.len()).position(|w| w == pat).unwrap();
    // The dataspace: dims (8, 16, 16), then their maxima.
    let dims: Vec<u8> = [8u64, 16, 16, 8, 16, 16].iter().flat_map(|d| d.to_le_bytes()).collect();
    let at = find(&good, &dims);
    for (dim, value) in [(0usize, 64u64), (2, 239)] {
        let mut bad = good.clone();
        bad[at + 8 * dim..at + 8 * dim + 8].copy_from_slice(&value.to_le_bytes());
        std::fs::write(&file, &bad).unwrap();
        for uri in [dir.display().to_string(), format!("{}?columns=image,label", dir.display())] {
            let e = stoker::open(&uri, Default::default()).await.unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.kind(), stoker::ErrorKind::Corrupt, "{msg}");
            assert!(msg.contains("s.h5") && msg.contains("`image`") && msg.contains("maximum"), "{msg}");
        }
    }
    // The chunk index (a v1 B-tree node of type 1): key 0 is the chunk at (0, 0, 0); its
    // second coordinate made 255 puts it off the grid.
    let tree = find(&good, b"TREE\x01");
    let mut bad = good.clone();
    let coord = tree + 24 + 8 + 8;
    bad[coord..coord + 8].copy_from_slice(&255u64.to_le_bytes());
    std::fs::write(&file, &bad).unwrap();
    let e = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.kind(), stoker::ErrorKind::Corrupt, "{msg}");
    assert!(msg.contains("s.h5") && msg.contains("`image`") && msg.contains("chunk grid"), "{msg}");
    // The label alone does not need the damaged dataset.
    assert_eq!(open(&format!("{}?columns=label", dir.display())).await.len(), 8);
}
