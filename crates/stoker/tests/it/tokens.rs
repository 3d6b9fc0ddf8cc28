//! Megatron indexed datasets written by Megatron-LM's own `IndexedDatasetBuilder`: the
//! conformance suite locally and over S3, and packing checked against Megatron's own reader's
//! tokens.

use crate::common;

use std::path::Path;

use common::s3::{uri, SK};
use common::*;
use stoker::conformance::run_all;
use stoker::sampler::{Order, Partition};
use stoker::tokens::{PackConfig, TokenLoader};
use stoker::{Batch, Layout, Sample};

fn fixture(kind: &str, dir: &Path) -> Vec<Sample> {
    script_fixture(&writers_python(), "write_tokens.py", &[kind], dir)
}

/// Token ids of a sample's `tokens` field (uint16 or int32 by `width`).
fn tokens_of(s: &Sample, width: usize) -> Vec<i64> {
    let b = s.field("tokens").unwrap();
    match width {
        2 => b.chunks_exact(2).map(|c| i64::from(u16::from_le_bytes([c[0], c[1]]))).collect(),
        _ => b.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap()))).collect(),
    }
}

fn rows(b: &Batch) -> Vec<Vec<i64>> {
    let c = b.field("input_ids").unwrap();
    (0..c.len())
        .map(|i| c.get(i).unwrap().chunks_exact(8).map(|x| i64::from_ne_bytes(x.try_into().unwrap())).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megatron_datasets_pass_conformance_locally_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let mut all = Vec::new();
    for kind in ["megatron", "megatron-i32"] {
        let dir = root.path().join("data").join(kind);
        let want = fixture(kind, &dir);
        let src = open(dir.to_str().unwrap()).await;
        assert_eq!(src.info().known_layout(), Some(Layout::Tokens), "{kind}");
        run_all(src, &want, kind, &[]).await;
        all.push((kind, want));
    }
    let server = common::s3::serve(root.path()).await;
    for (kind, want) in &all {
        let src = open(&uri(&server.endpoint(), kind, "")).await;
        assert_eq!(src.info().known_layout(), Some(Layout::Tokens), "{kind}");
        run_all(src, want, &format!("s3://data/{kind}"), &[SK]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flat_token_arrays_split_at_their_separator_pass_conformance_locally_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("flat");
    let want = fixture("flat", &dir);
    // Without a separator, a flat file is a clear error saying what to give.
    let e = stoker::open(&format!("{}?layout=tokens", dir.display()), Default::default())
        .await
        .err()
        .map(|e| e.to_string());
    assert!(e.as_deref().is_some_and(|e| e.contains("separator=")), "{e:?}");
    let src = open(&format!("{}?layout=tokens&separator=50256", dir.display())).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Tokens));
    run_all(src, &want, "flat", &[]).await;
    let server = common::s3::serve(root.path()).await;
    let src = open(&uri(&server.endpoint(), "flat", "&layout=tokens&separator=50256")).await;
    run_all(src, &want, "s3://data/flat", &[SK]).await;
}

/// LitData's token chunks (`litdata.optimize` with `TokensLoader`, int32 tensors as LitGPT
/// writes them; the fixture checks its documents against LitData's own reader): each item a
/// document, through the conformance suite locally and over S3, and packed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litdata_token_chunks_are_documents_locally_and_over_s3_and_pack() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("lit");
    let want = fixture("litdata", &dir);
    let src = open(dir.to_str().unwrap()).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Tokens));
    assert!(src.info().shards > 2, "one shard a chunk");
    run_all(src.clone(), &want, "lit", &[]).await;
    let server = common::s3::serve(root.path()).await;
    let remote = open(&uri(&server.endpoint(), "lit", "")).await;
    run_all(remote.clone(), &want, "s3://data/lit", &[SK]).await;
    // Packed without an EOS of Stoker's (LitGPT's documents end with theirs): the rows are
    // the documents joined, over S3 as locally.
    let stream: Vec<i64> = want.iter().flat_map(|d| tokens_of(d, 4)).collect();
    let mut cfg = PackConfig::new(256, 4);
    cfg.ids = stoker::tokens::IdType::Int64;
    for s in [src, remote] {
        let batches = TokenLoader::new(s, cfg.clone()).unwrap().epoch(0).unwrap().collect().await.unwrap();
        let got: Vec<Vec<i64>> = batches.iter().flat_map(rows).collect();
        assert_eq!(got.len(), stream.len() / 256 / 4 * 4);
        for (k, row) in got.iter().enumerate() {
            assert_eq!(row[..], stream[k * 256..(k + 1) * 256], "sequence {k}");
        }
    }
}

/// Damaged LitData token chunks: an offset table that disagrees with the index or runs past
/// the file, and a float dtype, are errors naming the chunk at open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_litdata_token_chunks_are_named_at_open() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("lit");
    fixture("litdata", &dir);
    let index = std::fs::read_to_string(dir.join("index.json")).unwrap();
    let chunk = dir.join("chunk-0-1.bin");
    let good = std::fs::read(&chunk).unwrap();
    let open_err = || async { stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err().to_string() };
    // One more item than the index says.
    let mut b = good.clone();
    b[0] = b[0].wrapping_add(1);
    std::fs::write(&chunk, &b).unwrap();
    let e = open_err().await;
    assert!(e.contains("chunk-0-1.bin") && e.contains("items where the index says"), "{e}");
    // An offset past the end of the file.
    let mut b = good.clone();
    b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&chunk, &b).unwrap();
    let e = open_err().await;
    assert!(e.contains("chunk-0-1.bin") && e.contains("item 0") && e.contains("past the end of the file"), "{e}");
    // An offset that cuts a token in two.
    let mut b = good.clone();
    let second = u32::from_le_bytes(b[8..12].try_into().unwrap()) + 1;
    b[8..12].copy_from_slice(&second.to_le_bytes());
    std::fs::write(&chunk, &b).unwrap();
    let e = open_err().await;
    assert!(e.contains("item 0") && e.contains("not a whole number of tokens (4-byte tokens)"), "{e}");
    // A table whose last item ends a token early (the item would lose its last token), and a
    // file with bytes after its last item: the table accounts for the whole file.
    let items = u32::from_le_bytes(good[0..4].try_into().unwrap()) as usize;
    let last = 4 + 4 * items;
    let mut b = good.clone();
    let end = u32::from_le_bytes(b[last..last + 4].try_into().unwrap()) - 4;
    b[last..last + 4].copy_from_slice(&end.to_le_bytes());
    std::fs::write(&chunk, &b).unwrap();
    let e = open_err().await;
    assert!(e.contains("chunk-0-1.bin") && e.contains(&format!("ends at byte {end}, not at the file's end")), "{e}");
    let mut b = good.clone();
    b.extend_from_slice(&[0; 100]);
    std::fs::write(&chunk, &b).unwrap();
    let e = open_err().await;
    assert!(e.contains("chunk-0-1.bin") && e.contains("not at the file's end"), "{e}");
    std::fs::write(&chunk, &good).unwrap();
    // Float "tokens" (torch.float32's index).
    let v: serde_json::Value = serde_json::from_str(&index).unwrap();
    let mut f = v.clone();
    f["config"]["data_format"] = serde_json::json!(["no_header_tensor:1"]);
    std::fs::write(dir.join("index.json"), f.to_string()).unwrap();
    let e = open_err().await;
    assert!(e.contains("index.json") && e.contains("not an integer type"), "{e}");
    // No chunks: an empty dataset says so; a chunk named out of the dataset is the index's
    // damage, not a file gone missing.
    let mut f = v.clone();
    f["chunks"] = serde_json::json!([]);
    std::fs::write(dir.join("index.json"), f.to_string()).unwrap();
    let e = open_err().await;
    assert!(e.contains("index.json") && e.contains("no token chunks"), "{e}");
    let mut f = v.clone();
    f["chunks"][0]["filename"] = serde_json::json!("../chunk-0-1.bin");
    std::fs::write(dir.join("index.json"), f.to_string()).unwrap();
    let e = open_err().await;
    assert!(e.contains("index.json") && e.contains("not a file in the dataset's directory"), "{e}");
    // chunk_bytes sizes nothing: older LitData wrote the items' bytes without the offset table
    // there, and a lie (a terabyte) must not size a read. Both open as the files are.
    std::fs::write(dir.join("index.json"), &index).unwrap();
    let docs = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap().len();
    for older in [true, false] {
        let mut f = v.clone();
        for c in f["chunks"].as_array_mut().unwrap() {
            let n = c["chunk_size"].as_u64().unwrap();
            c["chunk_bytes"] =
                serde_json::json!(if older { c["chunk_bytes"].as_u64().unwrap() - (n + 2) * 4 } else { 1u64 << 40 });
        }
        std::fs::write(dir.join("index.json"), f.to_string()).unwrap();
        assert_eq!(stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap().len(), docs);
    }
    // A chunk count the file cannot hold.
    let mut f = v.clone();
    f["chunks"][0]["chunk_size"] = serde_json::json!(4_000_000_000u64);
    std::fs::write(dir.join("index.json"), f.to_string()).unwrap();
    let e = open_err().await;
    assert!(e.contains("chunk-0-0.bin") && e.contains("cannot fit"), "{e}");
}

/// An MDS `ndarray` column of ids (MDSWriter, zstd shards): copied once into the tokens
/// cache, then packed like any token corpus; over S3 the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mds_ndarray_token_columns_are_copied_once_and_packed() {
    use stoker::tokens::tokenized;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("mds");
    let docs = fixture("mds", &dir);
    let stream: Vec<i64> = docs.iter().flat_map(|d| tokens_of(d, 2)).collect();
    let cache = root.path().join("cache");
    let mut cfg = PackConfig::new(128, 4);
    cfg.ids = stoker::tokens::IdType::Int64;
    let server = common::s3::serve(root.path()).await;
    let mut runs = Vec::new();
    for src in [open(dir.to_str().unwrap()).await, open(&uri(&server.endpoint(), "mds", "")).await] {
        assert!(src.as_tokens().is_none(), "an MDS source is samples, not documents of tokens");
        // Two fields: which one holds the ids must be said.
        let e = tokenized(src.clone(), None, None, &cache, false).await.unwrap_err().to_string();
        assert!(e.contains("field="), "{e}");
        let toks = tokenized(src, None, Some("tokens".into()), &cache, false).await.unwrap();
        assert_eq!(toks.len(), docs.len());
        let batches = TokenLoader::new(toks, cfg.clone()).unwrap().epoch(0).unwrap().collect().await.unwrap();
        runs.push(batches.iter().flat_map(rows).collect::<Vec<_>>());
    }
    assert_eq!(runs[0], runs[1], "the same rows over S3");
    assert_eq!(runs[0].len(), stream.len() / 128 / 4 * 4);
    for (k, row) in runs[0].iter().enumerate() {
        assert_eq!(row[..], stream[k * 128..(k + 1) * 128], "sequence {k}");
    }
    // A column that is not ids (text) is refused, naming what packing reads.
    let src = open(dir.to_str().unwrap()).await;
    let e = tokenized(src, None, Some("source".into()), &cache, false).await.unwrap_err().to_string();
    assert!(e.contains("holds no token documents") && e.contains("tokenizer"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_sequences_are_megatrons_documents_joined_and_the_same_over_s3_at_any_world_size() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("megatron");
    let docs = fixture("megatron", &dir);
    let eos = 50256i64;
    let cfg = |rank: u64, world: u64| {
        let mut c = PackConfig::new(128, 6);
        c.labels = true;
        c.eos = Some(eos);
        c.ids = stoker::tokens::IdType::Int64;
        c.partition = Partition::new(rank, world).unwrap();
        c
    };
    // Sequential order: the stream is Megatron's documents in order, each with its EOS.
    let stream: Vec<i64> = docs.iter().flat_map(|d| tokens_of(d, 2).into_iter().chain([eos])).collect();
    let local = open(dir.to_str().unwrap()).await;
    let batches = TokenLoader::new(local.clone(), cfg(0, 1)).unwrap().epoch(0).unwrap().collect().await.unwrap();
    let got: Vec<Vec<i64>> = batches.iter().flat_map(rows).collect();
    let sequences = (stream.len() - 129) / 128 + 1;
    assert_eq!(got.len(), sequences / 6 * 6);
    for (s, row) in got.iter().enumerate() {
        assert_eq!(row[..], stream[s * 128..s * 128 + 129], "sequence {s}");
    }
    // Shuffled, over S3, at world size 3: rank r's rows are rows r*2..r*2+2 of the local
    // single-rank run's global batches.
    let server = common::s3::serve(root.path()).await;
    let remote = open(&uri(&server.endpoint(), "megatron", "")).await;
    let shuffled = |rank, world| {
        let mut c = cfg(rank, world);
        c.order = Order::Shuffle { seed: 11 };
        c
    };
    let one: Vec<Vec<Vec<i64>>> = TokenLoader::new(local, shuffled(0, 1))
        .unwrap()
        .epoch(2)
        .unwrap()
        .collect()
        .await
        .unwrap()
        .iter()
        .map(rows)
        .collect();
    for r in 0..3u64 {
        let loader = TokenLoader::new(remote.clone(), shuffled(r, 3)).unwrap();
        let mine: Vec<Vec<Vec<i64>>> = loader.epoch(2).unwrap().collect().await.unwrap().iter().map(rows).collect();
        assert_eq!(mine.len(), one.len());
        for (k, b) in mine.iter().enumerate() {
            assert_eq!(b[..], one[k][r as usize * 2..r as usize * 2 + 2], "rank {r} global batch {k}");
        }
    }
}

/// A Megatron dataset of int32 tokens, one of them -7: packing it is an error naming the
/// file, at int32 and int64 ids, from the local map (written straight into the batch) and
/// over S3 (read into a buffer). A negative id went into `input_ids` as it was, to fail the
/// embedding lookup on the GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_token_id_is_an_error_naming_its_file() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("negative");
    std::fs::create_dir_all(&dir).unwrap();
    let (docs, len) = (3usize, 50usize);
    let mut tokens: Vec<i32> = (0..(docs * len) as i32).collect();
    tokens[len + 10] = -7;
    std::fs::write(dir.join("x.bin"), tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let mut idx = b"MMIDIDX\0\0".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(4); // int32
    idx.extend((docs as u64).to_le_bytes());
    idx.extend((docs as u64 + 1).to_le_bytes());
    for _ in 0..docs {
        idx.extend((len as i32).to_le_bytes());
    }
    for d in 0..docs {
        idx.extend(((d * len * 4) as i64).to_le_bytes());
    }
    for d in 0..=docs {
        idx.extend((d as i64).to_le_bytes());
    }
    std::fs::write(dir.join("x.idx"), idx).unwrap();
    let server = common::s3::serve(root.path()).await;
    for uri in [dir.to_str().unwrap().to_string(), uri(&server.endpoint(), "negative", "")] {
        let src = open(&uri).await;
        for ids in [stoker::tokens::IdType::Int32, stoker::tokens::IdType::Int64] {
            let mut c = PackConfig::new(32, 2);
            c.ids = ids;
            let e = TokenLoader::new(src.clone(), c).unwrap().epoch(0).unwrap().collect().await.unwrap_err();
            assert_eq!(e.kind(), stoker::ErrorKind::Corrupt, "{uri} {ids:?}: {e}");
            let text = e.to_string();
            assert!(text.contains("x.bin") && text.contains("token id -7 is negative"), "{uri} {ids:?}: {text}");
        }
    }
    server.shutdown().await;
}

/// A Megatron pair of `docs` int32 documents of `len` tokens each, in `dir`.
fn megatron_pair(dir: &Path, docs: usize, len: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let tokens: Vec<u8> = (0..(docs * len) as i32).flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(dir.join("x.bin"), tokens).unwrap();
    let mut idx = b"MMIDIDX\0\0".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(4); // int32
    idx.extend((docs as u64).to_le_bytes());
    idx.extend((docs as u64 + 1).to_le_bytes());
    idx.extend((0..docs).flat_map(|_| (len as i32).to_le_bytes()));
    idx.extend((0..docs).flat_map(|d| ((d * len * 4) as i64).to_le_bytes()));
    idx.extend((0..=docs).flat_map(|d| (d as i64).to_le_bytes()));
    std::fs::write(dir.join("x.idx"), idx).unwrap();
}

/// A corpus of no documents, or of documents with no tokens, or of fewer tokens than one
/// global batch, is an error naming it (a training loop over it would end at once, without a
/// word); with `pad_tail` the tokens there are come, padded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_corpus_or_one_short_of_a_batch_is_said_not_an_empty_epoch() {
    let root = tempfile::tempdir().unwrap();
    let none = root.path().join("none");
    megatron_pair(&none, 0, 0);
    let e = TokenLoader::new(open(none.to_str().unwrap()).await, PackConfig::new(8, 2)).err().unwrap();
    assert_eq!(e.kind(), stoker::ErrorKind::Empty, "{e}");
    assert!(e.to_string().contains("none") && e.to_string().contains("no token documents"), "{e}");

    for (name, docs, len) in [("blank", 1000, 0), ("short", 3, 5)] {
        let dir = root.path().join(name);
        megatron_pair(&dir, docs, len);
        let src = open(dir.to_str().unwrap()).await;
        // 3 x 5 tokens: not one batch of 2 rows of 9 (8 and a shifted label).
        let mut c = PackConfig::new(8, 2);
        (c.labels, c.ids) = (true, stoker::tokens::IdType::Int64);
        let e = TokenLoader::new(src.clone(), c.clone()).unwrap().epoch(0).err().unwrap();
        assert_eq!(e.kind(), stoker::ErrorKind::Empty, "{name}: {e}");
        let text = e.to_string();
        assert!(text.contains(name) && text.contains(&format!("{} tokens", docs * len)), "{name}: {text}");
        c.pad_tail = true;
        let padded = TokenLoader::new(src, c).unwrap().epoch(0);
        match docs * len {
            0 => assert_eq!(padded.err().unwrap().kind(), stoker::ErrorKind::Empty, "{name}"),
            _ => {
                let got = padded.unwrap().collect().await.unwrap();
                assert_eq!(got.len(), 1, "{name}: one padded batch");
                assert_eq!(rows(&got[0])[0], (0..9).collect::<Vec<i64>>(), "{name}: the corpus's first row");
            }
        }
    }
}

/// A flat file of int64 zeros split at 0: a document a token, whose index (8 bytes a
/// document) is no larger than the file, is refused naming the likely cause, not indexed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flat_file_of_one_token_documents_is_refused_at_any_width() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.bin"), vec![0u8; 1 << 20]).unwrap();
    for dtype in ["uint16", "int64"] {
        let uri = format!("{}?layout=tokens&separator=0&token_dtype={dtype}", dir.path().display());
        let e = stoker::open(&uri, Default::default()).await.err().unwrap().to_string();
        assert!(e.contains("t.bin") && e.contains("likely wrong") && e.contains(dtype), "{dtype}: {e}");
    }
}

/// Megatron keeps index caches as `.npy` beside its pairs (`*_doc_idx.npy`): they are not
/// token files, with `separator=` given or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megatrons_npy_caches_beside_its_pairs_are_not_read_as_tokens() {
    let dir = tempfile::tempdir().unwrap();
    megatron_pair(dir.path(), 3, 5);
    std::fs::write(dir.path().join("x_doc_idx.npy"), b"not tokens").unwrap();
    for q in ["", "?separator=0"] {
        let src = stoker::open(&format!("{}{q}", dir.path().display()), Default::default()).await.unwrap();
        assert_eq!(src.len(), 3, "{q}");
    }
}

/// A Megatron pair is named as Megatron-LM names it, by its data prefix (`/data/x` for
/// `x.bin` and `x.idx`), or by its `.bin` (over S3 with `layout=tokens`): the pair is read,
/// not the `.bin` as one file of bytes. A `.bin` without an `.idx` stays a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megatron_pair_is_opened_by_its_data_prefix_or_its_bin() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("m");
    megatron_pair(&dir, 3, 5);
    let d = dir.display();
    for uri in [format!("{d}/x"), format!("{d}/x.bin"), format!("{d}/x.bin?layout=tokens")] {
        let src = open(&uri).await;
        assert_eq!((src.info().known_layout(), src.len()), (Some(Layout::Tokens), 3), "{uri}");
        let mut c = PackConfig::new(5, 3);
        c.ids = stoker::tokens::IdType::Int64;
        let got = TokenLoader::new(src, c).unwrap().epoch(0).unwrap().collect().await.unwrap();
        assert_eq!(rows(&got[0]), (0..15).collect::<Vec<i64>>().chunks(5).map(<[i64]>::to_vec).collect::<Vec<_>>());
    }
    // `separator=` makes the .bin a flat token file, its .idx unread.
    let flat = open(&format!("{d}/x.bin?layout=tokens&separator=0&token_dtype=int32")).await;
    assert_eq!(flat.len(), 2, "ids 0..15 ended at each 0: [0] and 1..15");
    std::fs::write(dir.join("lone.bin"), b"bytes").unwrap();
    let lone = open(&format!("{d}/lone.bin")).await;
    assert_eq!((lone.info().known_layout(), lone.len()), (Some(Layout::Objects), 1));
    let e = stoker::open(&format!("{d}/y"), Default::default()).await.err().unwrap();
    assert_eq!(e.kind(), stoker::ErrorKind::NotFound, "{e}");

    let server = common::s3::serve(root.path()).await;
    // Remotely the pair is asked for (a request to the server) only under layout=tokens.
    let src = open(&uri(&server.endpoint(), "m/x.bin", "&layout=tokens")).await;
    assert_eq!((src.info().known_layout(), src.len()), (Some(Layout::Tokens), 3));
    let one = open(&uri(&server.endpoint(), "m/x.bin", "")).await;
    assert_eq!((one.info().known_layout(), one.len()), (Some(Layout::Objects), 1));
    // A bucket's data prefix is a prefix to list (no object looked up beside it): empty.
    let e = stoker::open(&uri(&server.endpoint(), "m/x", ""), Default::default()).await.err().unwrap();
    assert_eq!(e.kind(), stoker::ErrorKind::Empty, "{e}");
    server.shutdown().await;
}
