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
