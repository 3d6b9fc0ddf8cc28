//! Packing checked against a direct model of the stream: every document's tokens appear once
//! per epoch, in order, with exact boundaries, and global batches do not depend on the world
//! size.

use std::sync::Arc;

use super::*;
use crate::batch::Batch;
use crate::sampler::Order;
use crate::source::tokens::write_idx;
use crate::tokens::mix::MAX_WEIGHT_CHANGES;
use crate::DynSampleSource;

/// A corpus of documents (document `d` has `lens[d]` tokens `d * 1000 + i`; keep `d` below 65
/// and lengths below 1000 so they fit uint16 and tell their document), as one
/// uint16 `.bin`/`.idx` pair in a temporary directory.
pub(crate) fn corpus(dir: &std::path::Path, lens: &[u64]) {
    corpus_from(dir, lens, 0, 65)
}

/// [`corpus`] with document numbers taken modulo `cap`, every token plus `base`.
fn corpus_from(dir: &std::path::Path, lens: &[u64], base: u64, cap: u64) {
    let mut bin = Vec::new();
    for (d, &n) in lens.iter().enumerate() {
        for i in 0..n {
            bin.extend_from_slice(&(((base + (d as u64 % cap) * 1000 + i) % 65536) as u16).to_le_bytes());
        }
    }
    std::fs::write(dir.join("c.bin"), bin).unwrap();
    std::fs::write(dir.join("c.idx"), write_idx(8, lens, 2)).unwrap();
}

pub(super) async fn open(dir: &std::path::Path) -> Arc<DynSampleSource> {
    crate::source::open(dir.to_str().unwrap(), Default::default()).await.unwrap()
}

fn column<T: Copy>(b: &Batch, name: &str, f: fn(&[u8]) -> T, width: usize) -> Vec<Vec<T>> {
    let c = b.field(name).unwrap();
    (0..c.len()).map(|i| c.get(i).unwrap().chunks_exact(width).map(f).collect()).collect()
}

pub(super) fn ids(b: &Batch) -> Vec<Vec<i64>> {
    column(b, "input_ids", |c| i64::from(i32::from_ne_bytes(c.try_into().unwrap())), 4)
}

async fn run(src: &Arc<DynSampleSource>, cfg: PackConfig, epoch: u64) -> Vec<Batch> {
    let loader = TokenLoader::new(src.clone(), cfg).unwrap();
    loader.epoch(epoch).unwrap().collect().await.unwrap()
}

/// The stream the packer must cut: documents in `order`, each with its EOS.
fn stream(lens: &[u64], order: &[u64], eos: i64) -> Vec<(i64, u64)> {
    let mut out = Vec::new();
    for &d in order {
        out.extend((0..lens[d as usize]).map(|i| (((d * 1000 + i) % 65536) as i64, d)));
        out.push((eos, d));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concat_packing_cuts_the_stream_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5u64, 0, 17, 3, 40, 1, 9];
    corpus(dir.path(), &lens);
    let src = open(dir.path()).await;
    let mut cfg = PackConfig::new(8, 2);
    cfg.eos = Some(9999);
    cfg.labels = true;
    cfg.mask_boundaries = true;
    let batches = run(&src, cfg, 0).await;
    let want = stream(&lens, &(0..lens.len() as u64).collect::<Vec<_>>(), 9999);
    // 82 stream tokens; windows of 9 every 8: 10 sequences, 5 global batches of 2.
    assert_eq!(want.len(), 82);
    assert_eq!(batches.len(), 5);
    let rows: Vec<Vec<i64>> = batches.iter().flat_map(ids).collect();
    for (s, row) in rows.iter().enumerate() {
        let expect: Vec<i64> = want[s * 8..s * 8 + 9].iter().map(|t| t.0).collect();
        assert_eq!(row, &expect, "sequence {s}");
    }
    // Positions restart where a document starts; cu_seqlens mark the same places.
    let b = &batches[0];
    let pos = column(b, "position_ids", |c| i32::from_ne_bytes(c.try_into().unwrap()), 4);
    let mask = column(b, "loss_mask", |c| c[0], 1);
    // Row 0: doc 0 (5 tokens + EOS), doc 1 (EOS only), doc 2 starts.
    assert_eq!(pos[0], vec![0, 1, 2, 3, 4, 5, 0, 0, 1]);
    assert_eq!(mask[0], vec![1, 1, 1, 1, 1, 1, 0, 0, 1]);
    let cu = column(b, "cu_seqlens", |c| i32::from_ne_bytes(c.try_into().unwrap()), 4);
    assert_eq!(cu[0], vec![0, 6, 7]);
    // Row 1 continues doc 2 (a new segment at the row's start), offset by one row of 9; the
    // last row ends with the batch's length.
    assert_eq!(cu[1], vec![9, 18]);
    assert_eq!(pos[1], (0..9).collect::<Vec<i32>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_batches_do_not_depend_on_the_world_size_and_resume_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..65).map(|d| (d * 37 % 61) + 1).collect();
    corpus(dir.path(), &lens);
    let src = open(dir.path()).await;
    let base = |world: u64, rank: u64| {
        let mut c = PackConfig::new(8, 12);
        c.order = Order::Shuffle { seed: 7 };
        c.eos = Some(0);
        c.partition = crate::sampler::Partition::new(rank, world).unwrap();
        c
    };
    let one: Vec<Vec<Vec<i64>>> = run(&src, base(1, 0), 3).await.iter().map(ids).collect();
    assert!(one.len() > 10);
    for world in [2u64, 3, 4] {
        let per_rank: Vec<Vec<Vec<Vec<i64>>>> = {
            let mut v = Vec::new();
            for r in 0..world {
                v.push(run(&src, base(world, r), 3).await.iter().map(ids).collect());
            }
            v
        };
        for (k, global) in one.iter().enumerate() {
            let joined: Vec<Vec<i64>> = per_rank.iter().flat_map(|r| r[k].clone()).collect();
            assert_eq!(&joined, global, "world {world}, global batch {k}");
        }
    }
    // Stop after 4 global batches at world 2, go on at world 3: the same global batches.
    let first = TokenLoader::new(src.clone(), base(2, 1)).unwrap();
    let mut e = first.epoch(3).unwrap();
    for _ in 0..4 {
        e.next_batch().await.unwrap().unwrap();
    }
    let state = first.state();
    assert_eq!((state.epoch, state.batch), (3, 4));
    drop(e);
    for r in 0..3 {
        let l = TokenLoader::new(src.clone(), base(3, r)).unwrap();
        l.load_state(state.clone()).unwrap();
        let rest: Vec<Vec<Vec<i64>>> = l.epoch(3).unwrap().collect().await.unwrap().iter().map(ids).collect();
        assert_eq!(rest.len(), one.len() - 4);
        for (k, rows) in rest.iter().enumerate() {
            assert_eq!(rows[..], one[4 + k][r as usize * 4..(r as usize + 1) * 4], "rank {r} batch {}", 4 + k);
        }
    }
    // A state for other data or other global batches is refused.
    let other = TokenLoader::new(src.clone(), PackConfig::new(32, 12)).unwrap();
    assert!(other.load_state(state.clone()).unwrap_err().to_string().contains("seq_len"));
    // So is one for another stream of the same documents: another order or seed, BOS/EOS,
    // packing or labels would resume at batch 4 of other batches, skipping and repeating.
    type Change = fn(&mut PackConfig);
    let changes: [(&str, Change); 5] = [
        ("seed 8", |c| c.order = Order::Shuffle { seed: 8 }),
        ("in order", |c| c.order = Order::Sequential),
        ("no EOS", |c| c.eos = None),
        ("a document a row", |c| c.packing = Packing::PerDocument),
        ("labels", |c| c.labels = true),
    ];
    for (said, change) in changes {
        let mut c = base(3, 0);
        change(&mut c);
        let e = TokenLoader::new(src.clone(), c).unwrap().load_state(state.clone()).unwrap_err().to_string();
        assert!(e.contains("seed 7") && e.contains(said), "{said}: {e}");
    }
    // And one for other documents, as many of them: a corpus tokenized again.
    let again = tempfile::tempdir().unwrap();
    corpus(again.path(), &lens.iter().map(|l| l + 1).collect::<Vec<_>>());
    let e = TokenLoader::new(open(again.path()).await, base(3, 0)).unwrap().load_state(state.clone());
    assert!(e.unwrap_err().to_string().contains("tokens in all"));
    // A state past its epoch's end is no run's: refused (not taken as the end, which would
    // skip the rest of the epoch), and the loader keeps the state it had.
    let fresh = TokenLoader::new(src.clone(), base(3, 0)).unwrap();
    let epoch = state.epoch;
    let end = fresh.batches(epoch).unwrap();
    for batch in [end + 1, 1 << 20, u64::MAX] {
        let e = fresh.load_state(TokenState { batch, ..state.clone() }).unwrap_err().to_string();
        assert!(e.contains(&format!("global batch {batch} of epoch {epoch}, which has {end}")), "{e}");
        assert_eq!((fresh.state().epoch, fresh.state().batch), (0, 0));
    }
    fresh.load_state(TokenState { batch: end, ..state.clone() }).unwrap();
    assert_eq!((fresh.state().epoch, fresh.state().batch), (epoch + 1, 0), "the end is the next epoch's start");
    // A state of an earlier version (neither recorded) is taken as it is.
    let earlier = TokenState { stream: None, tokens: None, ..state };
    let resumed = TokenLoader::new(src.clone(), base(3, 0)).unwrap();
    resumed.load_state(earlier).unwrap();
    assert_eq!(resumed.state().stream, Some(TokenStream::of(&base(3, 0))), "its next states carry the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_token_once_per_epoch_in_document_order() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..65).map(|d| (d * 53 % 97) + 1).collect();
    corpus(dir.path(), &lens);
    let src = open(dir.path()).await;
    let mut cfg = PackConfig::new(32, 4);
    cfg.order = Order::Shuffle { seed: 1 };
    cfg.pad_tail = true;
    cfg.pad_id = -1;
    cfg.bos = Some(65535);
    let batches = run(&src, cfg, 1).await;
    let mut seen: Vec<Vec<i64>> = vec![Vec::new(); lens.len()];
    for b in &batches {
        let pos = column(b, "position_ids", |c| i32::from_ne_bytes(c.try_into().unwrap()), 4);
        for (row, p) in ids(b).iter().zip(pos) {
            for (&t, _) in row.iter().zip(p) {
                if t >= 0 && t != 65535 {
                    seen[(t / 1000) as usize].push(t % 1000);
                }
            }
        }
    }
    for (d, got) in seen.iter().enumerate() {
        assert_eq!(got, &(0..lens[d] as i64).collect::<Vec<_>>(), "document {d}");
    }
    let bos = batches.iter().flat_map(ids).flatten().filter(|&t| t == 65535).count();
    assert_eq!(bos, lens.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_document_per_sequence_truncates_and_pads() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), &[3, 10]);
    let src = open(dir.path()).await;
    let mut cfg = PackConfig::new(6, 2);
    cfg.packing = Packing::PerDocument;
    cfg.eos = Some(7);
    cfg.pad_id = -1;
    let b = &run(&src, cfg, 0).await[0];
    assert_eq!(ids(b), vec![vec![0, 1, 2, 7, -1, -1], vec![1000, 1001, 1002, 1003, 1004, 7]]);
    let mask = column(b, "loss_mask", |c| c[0], 1);
    assert_eq!(mask[0], vec![1, 1, 1, 1, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configurations_and_sources_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), &[3, 10]);
    let src = open(dir.path()).await;
    let mut c = PackConfig::new(8, 3);
    c.partition = crate::sampler::Partition::new(0, 2).unwrap();
    let e = TokenLoader::new(src.clone(), c).err().unwrap().to_string();
    assert!(e.contains("multiple of the world size 2"), "{e}");
    let mut c = PackConfig::new(8, 2);
    c.prefetch = usize::MAX;
    let e = TokenLoader::new(src.clone(), c).err().unwrap().to_string();
    assert!(e.contains("prefetch"), "{e}");
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("a.txt"), "x").unwrap();
    let e = TokenLoader::new(open(files.path()).await, PackConfig::new(8, 1)).err().unwrap().to_string();
    assert!(e.contains("holds no token documents"), "{e}");
    // A .bin shorter than its .idx claims.
    let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("c.bin")).unwrap();
    f.set_len(20).unwrap();
    let e = crate::source::open(dir.path().to_str().unwrap(), Default::default()).await.err().unwrap().to_string();
    assert!(e.contains("c.idx") && e.contains("past the end of the .bin"), "{e}");
    // A part whose .idx is missing beside indexed ones (a partial copy): refused, naming the
    // index, not left out with its documents. A Megatron .npy index cache there is left out.
    let two = tempfile::tempdir().unwrap();
    corpus(two.path(), &[3, 4, 5]);
    std::fs::write(two.path().join("c_doc_idx.npy"), b"not tokens").unwrap();
    assert_eq!(open(two.path()).await.len(), 3, "the .npy beside the data is not a token file");
    std::fs::write(two.path().join("d.bin"), [1u8, 0, 2, 0]).unwrap();
    let e = crate::source::open(two.path().to_str().unwrap(), Default::default()).await.err().unwrap();
    assert!(matches!(e, Error::BadIndex { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("d.bin") && e.contains("d.idx is missing") && e.contains("separator="), "{e}");
    // A flat file split at nearly every token (a uint32 file read as uint16 with separator=0:
    // here all zeros) is refused, naming the likely cause, not indexed at 8 bytes a document.
    let flat = tempfile::tempdir().unwrap();
    std::fs::write(flat.path().join("t.bin"), vec![0u8; 1 << 20]).unwrap();
    let uri = format!("{}?layout=tokens&separator=0", flat.path().display());
    let e = crate::source::open(&uri, Default::default()).await.err().unwrap().to_string();
    assert!(e.contains("t.bin") && e.contains("token_dtype") && e.contains("likely wrong"), "{e}");
    // Short documents in a small file are fine.
    std::fs::write(flat.path().join("t.bin"), [5u8, 0, 0, 0, 7, 0, 0, 0]).unwrap();
    assert_eq!(crate::source::open(&uri, Default::default()).await.unwrap().len(), 2);
}

/// Local documents are built by several producer threads, each claiming groups of batches: a
/// batch that fails (here a token that does not fit the int32 ids asked for) ends the epoch after
/// every earlier batch, in order, and nothing is delivered after the error. A `.bin` rewritten
/// at another size under a running loader fails at once: its bytes are not the indexed ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_batch_ends_the_epoch_in_order_and_a_rewritten_bin_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lens = vec![50u64; 200];
    // int64 tokens `d * 1000 + i`, but document 100's are 2^40.
    let token = |d: u64, i: u64| if d == 100 { 1i64 << 40 } else { (d * 1000 + i) as i64 };
    let bin: Vec<u8> = (0..200u64).flat_map(|d| (0..50).flat_map(move |i| token(d, i).to_le_bytes())).collect();
    std::fs::write(dir.path().join("c.bin"), &bin).unwrap();
    std::fs::write(dir.path().join("c.idx"), write_idx(5, &lens, 8)).unwrap();
    let src = open(dir.path()).await;
    let mut cfg = PackConfig::new(16, 2);
    cfg.prefetch = 4;
    let loader = TokenLoader::new(src, cfg).unwrap();
    let mut epoch = loader.epoch(0).unwrap();
    let mut good = Vec::new();
    let failure = loop {
        match epoch.next_batch().await {
            Some(Ok(b)) => good.push(b),
            Some(Err(e)) => break e.to_string(),
            None => panic!("the epoch ended without the error"),
        }
    };
    // Batch k holds tokens [32k, 32k + 32): document 100 starts at token 5,000, in batch 156.
    assert_eq!(good.len(), 156, "{failure}");
    for (k, b) in good.iter().enumerate() {
        assert_eq!(b.number, k as u64);
        let want: Vec<Vec<i64>> = (0..2u64)
            .map(|r| (0..16u64).map(|j| 32 * k as u64 + 16 * r + j).map(|p| token(p / 50, p % 50)).collect())
            .collect();
        assert_eq!(ids(b), want, "batch {k}");
    }
    assert!(failure.contains(&(1i64 << 40).to_string()) && failure.contains("int64"), "{failure}");
    assert!(epoch.next_batch().await.is_none(), "a batch after the error");
    assert_eq!(loader.state().batch, 156);
    // Another corpus renamed into its place (never a file cut under a reader: local token
    // files are mapped): no batch of it is read as this one's.
    drop(epoch);
    std::fs::write(dir.path().join("c.bin.new"), vec![7u8; 90_000]).unwrap();
    std::fs::rename(dir.path().join("c.bin.new"), dir.path().join("c.bin")).unwrap();
    let e = loader.epoch(0).unwrap().collect().await.err().unwrap().to_string();
    assert!(e.contains("c.bin") && e.contains("90000 bytes now, 80000"), "{e}");
}

/// A loader made outside any runtime owns one, and a runtime waits for its blocking work when
/// dropped: dropping the loader while one of its epochs is still held (its producers waiting
/// for room to claim more) must still return at once, and the epoch end when dropped.
#[test]
fn a_loader_dropped_before_its_epoch_does_not_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), &[50u64; 200]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let src = rt.block_on(open(dir.path()));
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let loader = TokenLoader::new(src, PackConfig::new(16, 2)).unwrap();
        let mut epoch = loader.epoch(0).unwrap();
        let first = epoch.next().unwrap().unwrap();
        drop(loader);
        drop(epoch);
        done.send(first.number).unwrap();
    });
    let first = finished.recv_timeout(std::time::Duration::from_secs(60)).expect("dropping the loader hung");
    assert_eq!(first, 0);
}

/// Two corpora told apart by their tokens (A below 40000, B from 40000), mixed 70/30 by
/// tokens although B has more documents.
async fn two_corpora() -> (tempfile::TempDir, TokenMix) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    corpus_from(&a, &(0..400).map(|d| (d * 37 % 61) + 5).collect::<Vec<u64>>(), 0, 40);
    corpus_from(&b, &(0..1500).map(|d| (d * 17 % 23) + 1).collect::<Vec<u64>>(), 40000, 25);
    let part = |name: &str, p: &std::path::Path, weight| {
        let name = name.to_string();
        let p = p.to_path_buf();
        async move { MixPart { name, docs: Arc::new(SourceDocs::new(open(&p).await).unwrap()), weight } }
    };
    let mix = TokenMix::new(vec![part("a", &a, 0.7).await, part("b", &b, 0.3).await]).unwrap();
    (dir, mix)
}

fn share_a(batches: &[Batch]) -> f64 {
    let all: Vec<i64> = batches.iter().flat_map(ids).flatten().collect();
    all.iter().filter(|&&t| t < 40000).count() as f64 / all.len() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_weighted_mix_keeps_its_shares_in_every_window_and_takes_new_weights_at_a_resume() {
    let (_dir, mix) = two_corpora().await;
    let mut cfg = PackConfig::new(16, 8);
    cfg.order = Order::Shuffle { seed: 3 };
    let loader = TokenLoader::from_mix(mix, cfg.clone()).unwrap();
    let all = loader.epoch(0).unwrap().collect().await.unwrap();
    assert!(all.len() >= 20, "{} batches", all.len());
    assert!((share_a(&all) - 0.7).abs() < 0.01, "epoch share {}", share_a(&all));
    for w in all.chunks(20).filter(|w| w.len() == 20) {
        assert!((share_a(w) - 0.7).abs() < 0.05, "window share {}", share_a(w));
    }
    let per = loader.source_tokens();
    assert_eq!(per.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert!((per[0].1 as f64 / (per[0].1 + per[1].1) as f64 - 0.7).abs() < 0.01);

    // Stop after 6 batches, change to 30/70 at the resume.
    let (_dir2, mix2) = two_corpora().await;
    let first = TokenLoader::from_mix(mix2, cfg.clone()).unwrap();
    let mut e = first.epoch(0).unwrap();
    for _ in 0..60 {
        e.next_batch().await.unwrap().unwrap();
    }
    drop(e);
    let state = first.state();
    let (_dir3, mix3) = two_corpora().await;
    let resumed = TokenLoader::from_mix(mix3, cfg.clone()).unwrap();
    resumed.load_state(state).unwrap();
    resumed.set_weights(&[0.3, 0.7]).unwrap();
    let mut e = resumed.epoch(0).unwrap();
    let mut rest = vec![e.next_batch().await.unwrap().unwrap()];
    // The change is in the state: resuming from it again gives the same batches.
    let mut s = resumed.state();
    assert_eq!((s.epoch, s.batch), (0, 61));
    assert_eq!(s.weights, vec![(0, vec![0.7, 0.3]), (60, vec![0.3, 0.7])]);
    while let Some(b) = e.next_batch().await {
        rest.push(b.unwrap());
    }
    assert!((share_a(&rest) - 0.3).abs() < 0.03, "share after the change {}", share_a(&rest));
    assert_eq!(rest[0].number, 60);
    // After the epoch's last batch, the state is the next epoch's start, in the new weights.
    let end = resumed.state();
    assert_eq!((end.epoch, end.batch, end.weights), (1, 0, vec![(0, vec![0.3, 0.7])]));
    let (_dir4, mix4) = two_corpora().await;
    let again = TokenLoader::from_mix(mix4, cfg).unwrap();
    s.batch = 60;
    again.load_state(s).unwrap();
    let rest2 = again.epoch(0).unwrap().collect().await.unwrap();
    assert_eq!(rest.iter().map(ids).collect::<Vec<_>>(), rest2.iter().map(ids).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_weights_between_epochs_are_the_ones_used_and_bad_saved_weights_are_refused() {
    let (_dir, mix) = two_corpora().await;
    let mut cfg = PackConfig::new(16, 8);
    cfg.order = Order::Shuffle { seed: 3 };
    let loader = TokenLoader::from_mix(mix, cfg).unwrap();
    loader.epoch(0).unwrap().collect().await.unwrap();
    loader.set_weights(&[0.3, 0.7]).unwrap();
    let second = loader.epoch(1).unwrap().collect().await.unwrap();
    assert!((share_a(&second) - 0.3).abs() < 0.01, "share {}", share_a(&second));
    // Epoch 1 read whole: the state is epoch 2's start, in the weights last in force.
    let state = loader.state();
    assert_eq!((state.epoch, state.batch, state.weights.clone()), (2, 0, vec![(0, vec![0.3, 0.7])]));
    let wrong = |weights: Vec<(u64, Vec<f64>)>| TokenState { weights, ..state.clone() };
    // The weights are per source by place: a state for the sources in another order is
    // refused; one of an earlier version, which names none, is taken.
    assert_eq!(state.sources, Some(vec!["a".to_string(), "b".to_string()]));
    let swapped = TokenState { sources: Some(vec!["b".into(), "a".into()]), ..state.clone() };
    let e = loader.load_state(swapped).unwrap_err().to_string();
    assert!(e.contains("[b, a] in that order") && e.contains("mixes [a, b]"), "{e}");
    loader.load_state(TokenState { sources: None, ..state.clone() }).unwrap();
    assert_eq!(loader.state().sources, state.sources, "its next states name the sources");
    for bad in [vec![], vec![(0, vec![1.0])], vec![(3, vec![0.5, 0.5])], vec![(0, vec![f64::NAN, 1.0])]] {
        assert!(loader.load_state(wrong(bad.clone())).is_err(), "{bad:?}");
    }
    loader.load_state(wrong(vec![(0, vec![0.5, 0.5]), (4, vec![0.2, 0.8])])).unwrap();
    // More changes than any schedule makes (each a pass over the documents when planned):
    // refused, not hours of planning.
    let many: Vec<(u64, Vec<f64>)> = (0..=MAX_WEIGHT_CHANGES as u64).map(|b| (b, vec![0.5, 0.5])).collect();
    let e = loader.load_state(wrong(many)).unwrap_err().to_string();
    assert!(e.contains("more than 1000"), "{e}");
    // Changes at one batch: the last is the one in force, as if it were the only one.
    let epoch = |weights: Vec<(u64, Vec<f64>)>| {
        let state = TokenState { epoch: 1, batch: 0, weights, ..state.clone() };
        async {
            loader.load_state(state).unwrap();
            loader.epoch(1).unwrap().collect().await.unwrap().iter().map(ids).collect::<Vec<_>>()
        }
    };
    let once = epoch(vec![(0, vec![0.5, 0.5]), (4, vec![0.2, 0.8])]).await;
    let twice = epoch(vec![(0, vec![0.5, 0.5]), (4, vec![0.9, 0.1]), (4, vec![0.2, 0.8])]).await;
    assert_eq!(once, twice);
}

/// Only the ratios of weights matter, however small or large they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_and_huge_weights_mix_as_their_ratios() {
    let mut cfg = PackConfig::new(16, 8);
    cfg.order = Order::Shuffle { seed: 3 };
    let share = |weights: [f64; 2]| {
        let cfg = cfg.clone();
        async move {
            let (_dir, mix) = two_corpora().await;
            let loader = TokenLoader::from_mix(mix, cfg).unwrap();
            loader.set_weights(&weights).unwrap();
            share_a(&loader.epoch(0).unwrap().collect().await.unwrap())
        }
    };
    let even = share([1.0, 1.0]).await;
    for w in [[1e-320, 1e-320], [1e300, 1e300], [f64::MAX, f64::MAX]] {
        let got = share(w).await;
        assert!((got - even).abs() < 0.02, "{w:?}: share {got}, {even} with [1, 1]");
    }
}

/// Columns left out are not in the batch, and `input_ids` is the same as with every column;
/// what cannot be asked is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_left_out_are_absent_and_the_ids_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5u64, 0, 17, 3, 40, 1, 9, 33, 2];
    corpus(dir.path(), &lens);
    let src = open(dir.path()).await;
    let mut cfg = PackConfig::new(8, 2);
    cfg.eos = Some(9999);
    cfg.labels = true;
    cfg.order = Order::Shuffle { seed: 4 };
    let full = run(&src, cfg.clone(), 1).await;
    for names in [vec!["input_ids"], vec!["input_ids", "cu_seqlens"], vec!["loss_mask", "input_ids"]] {
        let mut lean = cfg.clone();
        lean.columns = TokenColumns::from_names(&names).unwrap();
        assert_eq!(lean.columns.names().len(), names.len());
        let got = run(&src, lean, 1).await;
        assert_eq!(got.len(), full.len());
        for (g, f) in got.iter().zip(&full) {
            assert_eq!(ids(g), ids(f), "{names:?}");
            for col in TokenColumns::NAMES {
                assert_eq!(g.field(col).is_some(), names.contains(&col), "{col} with {names:?}");
                if let (Some(a), Some(b)) = (g.field(col), f.field(col)) {
                    assert_eq!(a.data, b.data, "{col} with {names:?}");
                }
            }
        }
    }
    let no_ids = TokenColumns::from_names(&["position_ids"]).unwrap_err().to_string();
    assert!(no_ids.contains("input_ids"), "{no_ids}");
    let unknown = TokenColumns::from_names(&["input_ids", "labels"]).unwrap_err().to_string();
    assert!(unknown.contains("\"labels\"") && unknown.contains("position_ids"), "{unknown}");
    let mut masked = cfg.clone();
    masked.mask_boundaries = true;
    masked.columns = TokenColumns::from_names(&["input_ids"]).unwrap();
    let refused = TokenLoader::new(src.clone(), masked).err().expect("mask_boundaries needs loss_mask").to_string();
    assert!(refused.contains("loss_mask"), "{refused}");
}

/// Taking ready batches without waiting, and waiting for the others, delivers the epoch a
/// plain iteration does: every batch once, in order, then the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_batches_taken_without_waiting_are_the_epoch_in_order() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path(), &[37u64; 150]);
    let src = open(dir.path()).await;
    let cfg = || {
        let mut c = PackConfig::new(16, 2);
        c.order = Order::Shuffle { seed: 4 };
        c
    };
    let want = run(&src, cfg(), 1).await;
    let loader = TokenLoader::new(src.clone(), cfg()).unwrap();
    let mut epoch = loader.epoch(1).unwrap();
    let (mut got, mut ready) = (Vec::new(), 0);
    loop {
        let item = match epoch.try_next_batch() {
            Some(item) => {
                // Batches come in groups: all but a group's first are ready when asked for.
                ready += usize::from(item.is_some());
                item
            }
            None => epoch.next_batch().await,
        };
        match item {
            Some(b) => got.push(b.unwrap()),
            None => break,
        }
    }
    assert_eq!(epoch.try_next_batch().map(|i| i.is_none()), Some(true), "the end stays the end");
    assert!(ready >= want.len() / 2, "{ready} of {} batches were ready", want.len());
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((g.number, ids(g)), (w.number, ids(w)));
    }
}

/// uint16 ids are the int32 ids at half the width (document tokens, EOS and padding); a
/// token, BOS, EOS or pad id that uint16 cannot hold is an error that names it and asks for
/// int32 ids, not a wrapped id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uint16_ids_are_the_int32_ids_at_half_the_width_and_refuse_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5u64, 0, 17, 3, 40, 1, 9, 33, 2];
    corpus(dir.path(), &lens);
    let src = open(dir.path()).await;
    let mut cfg = PackConfig::new(8, 2);
    (cfg.eos, cfg.labels, cfg.pad_tail, cfg.pad_id) = (Some(65_535), true, true, 7);
    cfg.order = Order::Shuffle { seed: 4 };
    let wide = run(&src, cfg.clone(), 1).await;
    let narrow = run(&src, PackConfig { ids: IdType::Uint16, ..cfg.clone() }, 1).await;
    assert_eq!(narrow.len(), wide.len());
    for (n, w) in narrow.iter().zip(&wide) {
        let got = column(n, "input_ids", |c| i64::from(u16::from_ne_bytes(c.try_into().unwrap())), 2);
        assert_eq!(got, ids(w));
        assert_eq!(n.field("input_ids").unwrap().data.len() * 2, w.field("input_ids").unwrap().data.len());
        assert_eq!(n.field("position_ids").unwrap().data, w.field("position_ids").unwrap().data);
    }
    // Ids uint16 cannot hold, given as options.
    for (bos, eos, pad) in [(Some(70_000), None, 0), (None, Some(65_536), 0), (None, None, -100)] {
        let bad = PackConfig { ids: IdType::Uint16, bos, eos, pad_id: pad, ..cfg.clone() };
        let e = TokenLoader::new(src.clone(), bad).err().expect("an id past uint16").to_string();
        assert!(e.contains("uint16") && e.contains("int32"), "{e}");
    }
    // A token of the file past uint16: an int32 file whose document 3 holds 70,000.
    let big = tempfile::tempdir().unwrap();
    let token = |d: u64, i: u64| if d == 3 && i == 2 { 70_000 } else { (d * 10 + i) as i32 };
    let bin: Vec<u8> = (0..4u64).flat_map(|d| (0..6).flat_map(move |i| token(d, i).to_le_bytes())).collect();
    std::fs::write(big.path().join("c.bin"), bin).unwrap();
    std::fs::write(big.path().join("c.idx"), write_idx(4, &[6; 4], 4)).unwrap();
    let src = open(big.path()).await;
    let cfg = PackConfig { ids: IdType::Uint16, ..PackConfig::new(4, 1) };
    let e = TokenLoader::new(src, cfg).unwrap().epoch(0).unwrap().collect().await.err().unwrap().to_string();
    assert!(e.contains("70000") && e.contains("c.bin") && e.contains("uint16") && e.contains("int32 ids"), "{e}");
    let e = IdType::from_name("float16").unwrap_err().to_string();
    assert!(e.contains("float16") && e.contains("uint16"), "{e}");
}
