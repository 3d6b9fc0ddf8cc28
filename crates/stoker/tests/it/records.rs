//! MDS (MosaicML Streaming) and LitData sources: shards written by `MDSWriter` and
//! `litdata.optimize`, local and over S3.

use crate::common;

use std::path::Path;

use common::s3::{uri, SK};
use common::*;
use stoker::conformance::run_all;
use stoker::{Error, Layout, Sample};

fn fixture(kind: &str, dir: &Path) -> Vec<Sample> {
    script_fixture(&writers_python(), "write_records.py", &[kind], dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mds_and_litdata_written_by_their_writers_read_back_field_by_field_local_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let kinds = [
        ("mds", Layout::Mds),
        ("mds-zstd", Layout::Mds),
        ("mds-gz", Layout::Mds),
        ("litdata", Layout::Litdata),
        ("litdata-zstd", Layout::Litdata),
        ("litdata-rows", Layout::Litdata),
    ];
    let mut all = Vec::new();
    for (kind, layout) in kinds {
        let dir = root.path().join("data").join(kind);
        let want = fixture(kind, &dir);
        let src = open(dir.to_str().unwrap()).await;
        assert_eq!(src.info().known_layout(), Some(layout), "{kind}");
        assert!(src.info().shards >= 3, "{kind}: {} shards", src.info().shards);
        run_all(src, &want, kind, &[]).await;
        all.push((kind, layout, want));
    }
    let server = common::s3::serve(root.path()).await;
    for (kind, layout, want) in &all {
        let src = open(&uri(&server.endpoint(), kind, "")).await;
        assert_eq!(src.info().known_layout(), Some(*layout), "{kind}");
        run_all(src, want, &format!("s3://data/{kind}"), &[SK]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sample_reads_its_bytes_not_the_shard_and_columns_project() {
    let root = tempfile::tempdir().unwrap();
    let want = fixture("mds", root.path());
    let dir = root.path().display().to_string();
    let src = open(&dir).await;
    let before = src.io_counters().unwrap();
    assert_eq!(src.get(5).await.unwrap(), want[5]);
    let after = src.io_counters().unwrap();
    let shard = std::fs::metadata(root.path().join("shard.00000.mds")).unwrap().len();
    let read = after.bytes - before.bytes;
    assert!(read < shard / 2, "one sample read {read} bytes of a {shard}-byte shard");
    // The offset table is read once: the next sample of that shard is one more read.
    assert_eq!(src.get(6).await.unwrap(), want[6]);
    assert_eq!(src.io_counters().unwrap().requests - after.requests, 1);

    let src = open(&format!("{dir}?columns=cls,arr")).await;
    for (i, w) in want.iter().enumerate() {
        let kept: Vec<_> = w.fields.iter().filter(|f| matches!(&*f.name, "cls" | "arr")).cloned().collect();
        let got = src.get(i).await.unwrap();
        assert_eq!((got.key.as_str(), &got.fields), (w.key.as_str(), &kept));
    }
    let e = stoker::open(&format!("{dir}?columns=cls,nope"), Default::default()).await.unwrap_err();
    assert!(
        matches!(e, Error::InvalidOption { .. }) && e.to_string().contains("nope") && e.to_string().contains("jpg"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_indexes_and_shards_are_clear_errors() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("mds");
    let want = fixture("mds", &dir);
    let index = dir.join("index.json");
    let good = std::fs::read_to_string(&index).unwrap();
    let open_err = |p: &Path| {
        let p = p.to_str().unwrap().to_string();
        async move { stoker::open(&p, Default::default()).await.unwrap_err() }
    };

    // Not JSON (it still names the layout, so the resolver reads it as MDS).
    std::fs::write(&index, &good[..good.len() / 2]).unwrap();
    let e = stoker::open(&format!("{}?layout=mds", dir.display()), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::BadIndex { .. }) && e.to_string().contains("index.json"), "{e:?}");
    // A key missing.
    std::fs::write(&index, good.replace("\"column_encodings\"", "\"encodings_renamed\"")).unwrap();
    let e = open_err(&dir).await;
    assert!(matches!(e, Error::BadIndex { .. }) && e.to_string().contains("column_encodings"), "{e}");
    // A pickle column is refused, naming it; leaving it out with columns= reads.
    std::fs::write(&index, good.replace("\"json\"", "\"pkl\"")).unwrap();
    let e = open_err(&dir).await;
    assert!(matches!(e, Error::NotSupported { .. }) && e.to_string().contains("`meta`"), "{e}");
    assert!(e.to_string().contains("columns="), "{e}");
    let src = open(&format!("{}?columns=cls", dir.display())).await;
    assert_eq!(src.get(0).await.unwrap().field("cls"), want[0].field("cls"));
    std::fs::write(&index, &good).unwrap();

    // A shard missing, or cut short.
    let shard = dir.join("shard.00001.mds");
    let bytes = std::fs::read(&shard).unwrap();
    let first_of_1 = {
        let v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v["shards"][0]["samples"].as_u64().unwrap() as usize
    };
    std::fs::remove_file(&shard).unwrap();
    let src = open(dir.to_str().unwrap()).await;
    let e = src.get(first_of_1).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }) && e.to_string().contains("shard.00001.mds"), "{e:?}");
    std::fs::write(&shard, &bytes[..bytes.len() - 300]).unwrap();
    let src = open(dir.to_str().unwrap()).await;
    // Its first sample lies before the cut; its last does not.
    assert_eq!(src.get(first_of_1).await.unwrap(), want[first_of_1]);
    let last_of_1 = first_of_1 + 7;
    let e = src.get(last_of_1).await.unwrap_err();
    assert!(matches!(e, Error::CorruptData { .. }) && e.to_string().contains("shard.00001.mds"), "{e:?}");
    assert!(e.to_string().contains("truncated"), "{e}");
    // The other shards still read.
    assert_eq!(src.get(0).await.unwrap(), want[0]);

    // A compressed shard whose bytes changed fails its recorded hashes.
    let zdir = root.path().join("zstd");
    let zwant = fixture("mds-zstd", &zdir);
    let zshard = zdir.join("shard.00000.mds.zstd");
    let mut z = std::fs::read(&zshard).unwrap();
    let mid = z.len() / 2;
    z[mid] ^= 0x40;
    std::fs::write(&zshard, &z).unwrap();
    let src = open(zdir.to_str().unwrap()).await;
    let e = src.get(0).await.unwrap_err();
    assert!(matches!(e, Error::CorruptData { .. }) && e.to_string().contains("sha1"), "{e}");
    assert!(e.to_string().contains("shard.00000.mds.zstd"), "{e}");
    let last = zwant.len() - 1;
    assert_eq!(src.get(last).await.unwrap(), zwant[last]);

    // LitData: an encrypted or differently laid-out dataset is refused clearly.
    let ldir = root.path().join("lit");
    fixture("litdata", &ldir);
    let lindex = ldir.join("index.json");
    let lgood = std::fs::read_to_string(&lindex).unwrap();
    std::fs::write(&lindex, lgood.replace("\"PyTreeLoader\"", "\"ParquetLoader\"")).unwrap();
    let e = open_err(&ldir).await;
    assert!(matches!(e, Error::NotSupported { .. }) && e.to_string().contains("ParquetLoader"), "{e}");
    // Items of several leaves under TokensLoader's name: not token chunks (those are read as
    // the tokens layout), said at open.
    std::fs::write(&lindex, lgood.replace("\"PyTreeLoader\"", "\"TokensLoader\"")).unwrap();
    let e = open_err(&ldir).await;
    assert!(matches!(e, Error::BadIndex { .. }) && e.to_string().contains("one array an item, not 6 leaves"), "{e}");

    // A framed-zstd chunk (LitData's default for compression="zstd") whose frame table puts a
    // frame at an offset that, plus its length, passes 2^64: an error naming the chunk, not
    // an overflow (a panic in a debug build, a wrapped range in a release one).
    let fdir = root.path().join("lit-zstd");
    let fwant = fixture("litdata-zstd", &fdir);
    let findex: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fdir.join("index.json")).unwrap()).unwrap();
    let first = &findex["chunks"][0];
    let (name, items) = (first["filename"].as_str().unwrap(), first["chunk_size"].as_u64().unwrap() as usize);
    let chunk = fdir.join(name);
    let mut framed = std::fs::read(&chunk).unwrap();
    assert_eq!(&framed[..8], b"LDFZ01\0\0", "litdata.optimize(compression=\"zstd\") writes framed chunks");
    // The first frame's entry: after the 24-byte prefix and the n + 1 item offsets; its
    // offset is the u64 at 8.
    let at = 24 + 4 * (items + 1) + 8;
    framed[at..at + 8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    std::fs::write(&chunk, &framed).unwrap();
    let src = open(fdir.to_str().unwrap()).await;
    let e = src.get(0).await.unwrap_err();
    assert!(matches!(e, Error::CorruptData { .. }) && e.to_string().contains(name), "{e:?}");
    assert!(e.to_string().contains("past 2^64"), "{e}");
    // The other chunks still read.
    assert_eq!(src.get(items).await.unwrap(), fwant[items]);
}

/// The position, in `chunk`, of the first record batch's header of a LitData Arrow-footer
/// chunk, and its buffers as (offset, length).
fn first_batch_buffers(chunk: &[u8]) -> (usize, Vec<(i64, i64)>) {
    let n = chunk.len();
    assert_eq!(&chunk[n - 8..], b"LDARW01\0", "litdata.optimize wrote these rows as an Arrow footer");
    let arrow_len = u32::from_le_bytes(chunk[n - 12..n - 8].try_into().unwrap()) as usize;
    let file = &chunk[n - 12 - arrow_len..n - 12];
    let footer_len = i32::from_le_bytes(file[file.len() - 10..file.len() - 6].try_into().unwrap()) as usize;
    let footer = arrow_ipc::root_as_footer(&file[file.len() - 10 - footer_len..file.len() - 10]).unwrap();
    let block = footer.recordBatches().unwrap().get(0);
    let at = (n - 12 - arrow_len) + block.offset() as usize;
    let meta = &chunk[at + 8..at + block.metaDataLength() as usize];
    let batch = arrow_ipc::root_as_message(meta).unwrap().header_as_record_batch().unwrap();
    (at, batch.buffers().unwrap().iter().map(|b| (b.offset(), b.length())).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrow_batch_naming_bytes_past_its_body_is_an_error_not_a_panic() {
    // Arrow's decoder slices the buffers a batch's header names without a check: a damaged
    // length (2^32 - 1 here, as a fuzzer found) panicked in it.
    let root = tempfile::tempdir().unwrap();
    let want = fixture("litdata-rows", root.path());
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.path().join("index.json")).unwrap()).unwrap();
    let chunks = index["chunks"].as_array().unwrap();
    let (name, items) = (chunks[0]["filename"].as_str().unwrap(), chunks[0]["chunk_size"].as_u64().unwrap() as usize);
    let path = root.path().join(name);
    let mut chunk = std::fs::read(&path).unwrap();
    let (at, buffers) = first_batch_buffers(&chunk);
    // A buffer with bytes whose (offset, length) pair occurs once in the header: its length
    // is made 2^32 - 1.
    let header_len = 4096.min(chunk.len() - at);
    let (hit, _) = buffers
        .iter()
        .filter(|(_, len)| *len > 0)
        .filter_map(|(off, len)| {
            let pat: Vec<u8> = off.to_le_bytes().iter().chain(&len.to_le_bytes()).copied().collect();
            let found: Vec<usize> =
                chunk[at..at + header_len].windows(16).enumerate().filter(|(_, w)| *w == pat).map(|(i, _)| i).collect();
            (found.len() == 1).then(|| (at + found[0], *len))
        })
        .next()
        .expect("a buffer of the first batch found in its header");
    chunk[hit + 8..hit + 16].copy_from_slice(&(u32::MAX as i64).to_le_bytes());
    std::fs::write(&path, &chunk).unwrap();

    let src = open(root.path().to_str().unwrap()).await;
    let e = src.get(0).await.unwrap_err();
    assert!(matches!(e, Error::CorruptData { .. }) && e.to_string().contains(name), "{e:?}");
    assert!(e.to_string().contains("lies outside its batch"), "{e}");
    // The other chunks still read.
    assert_eq!(src.get(items).await.unwrap(), want[items]);
}

/// Index damage that used to read on with other data: an `index.json` that no longer parses
/// (read as one file a sample, shards and all), a column named twice (the second shadowed the
/// first), a shard or chunk claiming no samples (its samples dropped unread), an unknown
/// LitData serializer (its stored bytes delivered as the value). Each is an error at open
/// naming the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_lies_that_would_change_the_data_are_refused_at_open() {
    let root = tempfile::tempdir().unwrap();
    let open_err = |p: &Path| {
        let p = p.to_str().unwrap().to_string();
        async move { stoker::open(&p, Default::default()).await.unwrap_err() }
    };
    for kind in ["mds", "litdata"] {
        let dir = root.path().join(kind);
        fixture(kind, &dir);
        let index = dir.join("index.json");
        let good = std::fs::read_to_string(&index).unwrap();
        let mut lies: Vec<(String, &str)> = vec![
            (good[..good.len() - 1].to_string(), "not JSON"),
            (good.replacen('{', "[", 1), "not JSON"),
            (good.replace("\"shards\"", "\"shardz\"").replace("\"chunks\"", "\"chunkz\""), "neither"),
        ];
        let v: serde_json::Value = serde_json::from_str(&good).unwrap();
        if kind == "mds" {
            let names = &v["shards"][0]["column_names"];
            let (first, second) = (names[0].as_str().unwrap(), names[1].as_str().unwrap());
            let mut dup = v.clone();
            for s in dup["shards"].as_array_mut().unwrap() {
                s["column_names"][1] = first.into();
            }
            lies.push((dup.to_string(), "named twice"));
            assert_ne!(first, second);
            let mut empty = v.clone();
            empty["shards"][0]["samples"] = 0.into();
            lies.push((empty.to_string(), "claims no samples"));
            let mut out = v.clone();
            out["shards"][0]["raw_data"]["basename"] = "../../etc/passwd".into();
            lies.push((out.to_string(), "not a file in the dataset's directory"));
            // A version other than MDS's 2 (a layout this reader does not know), for the
            // index or a shard.
            let mut newer = v.clone();
            newer["version"] = 99.into();
            lies.push((newer.to_string(), "version 99"));
            let mut shard = v.clone();
            shard["shards"][0]["version"] = 3.into();
            lies.push((shard.to_string(), "version 3"));
        } else {
            let mut out = v.clone();
            out["chunks"][1]["filename"] = "/etc/passwd".into();
            lies.push((out.to_string(), "not a file in the dataset's directory"));
            let mut empty = v.clone();
            empty["chunks"][0]["chunk_size"] = 0.into();
            lies.push((empty.to_string(), "claims no samples"));
            let mut unknown = v.clone();
            unknown["config"]["data_format"][2] = "complex256".into();
            lies.push((unknown.to_string(), "complex256"));
            // A spec far larger than its leaves need, or leaves past any sample's, is refused
            // before it is parsed into a tree (a 60 MB one took 860 MB).
            let mut long = v.clone();
            let spec = long["config"]["data_spec"].as_str().unwrap().to_string();
            long["config"]["data_spec"] = format!("{spec}{}", " ".repeat(1 << 20)).into();
            lies.push((long.to_string(), "data_spec is"));
            let mut wide = v.clone();
            wide["config"]["data_format"] = vec!["int"; 70_000].into();
            lies.push((wide.to_string(), "70000 leaves"));
        }
        for (text, why) in lies {
            std::fs::write(&index, &text).unwrap();
            let e = open_err(&dir).await;
            let msg = e.to_string();
            assert!(
                matches!(e, Error::BadIndex { .. }) && msg.contains("index.json") && msg.contains(why),
                "{kind}: {msg}"
            );
        }
        std::fs::write(&index, &good).unwrap();
        let n = open(dir.to_str().unwrap()).await.len();
        assert!(n > 0);
        let raw_shards = serde_json::from_str::<serde_json::Value>(&good).unwrap()["shards"][0]["zip_data"].is_null();
        if kind == "mds" {
            assert!(raw_shards, "the fixture's MDS shards are uncompressed");
            // What MDSWriter writes when the first sample is over the size limit: a shard of
            // no samples holding its count, one offset past the columns' JSON, and that JSON.
            let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
            let config = br#"{"column_names": ["x"]}"#;
            let mut empty = 0u32.to_le_bytes().to_vec();
            empty.extend_from_slice(&(8 + config.len() as u32).to_le_bytes());
            empty.extend_from_slice(config);
            std::fs::write(dir.join("shard.empty.mds"), &empty).unwrap();
            let mut entry = v["shards"][0].clone();
            entry["samples"] = 0.into();
            entry["raw_data"] = serde_json::json!({"basename": "shard.empty.mds", "bytes": empty.len(), "hashes": {}});
            v["shards"].as_array_mut().unwrap().insert(0, entry);
            std::fs::write(&index, v.to_string()).unwrap();
            assert_eq!(open(dir.to_str().unwrap()).await.len(), n, "the writer's empty shard reads as no samples");
            std::fs::write(&index, &good).unwrap();
        }
    }
    // An index.json of something else, beside files that are not shards, is a file like any other.
    let other = root.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("index.json"), "{not json").unwrap();
    std::fs::write(other.join("a.bin"), "a").unwrap();
    assert_eq!(open(other.to_str().unwrap()).await.len(), 2);
}
