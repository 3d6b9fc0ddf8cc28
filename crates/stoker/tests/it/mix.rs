//! A mix of real local sources (tar shards, a directory of files, an LMDB) through the
//! Loader: exact per-source counts, each sample's bytes from the source its `__source__`
//! names, field schemas (fill or a named error), resume, decode specs and per-source stats.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use common::*;
use stoker::loader::{Loader, LoaderConfig};
use stoker::sampler::{Order, Partition, Tail};
use stoker::source::mix::SOURCE_FIELD;
use stoker::{DynSampleSource, Error, Sample, SourceOptions};

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    /// Per source name, its samples in source order.
    samples: BTreeMap<&'static str, Vec<Sample>>,
}

/// `shards/` (3 tar shards of 20, fields jpg + cls), `files/` (30 `.jpg` files) and `lmdb/`
/// (40 records), each sample's jpg distinct.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::create_dir_all(root.join("shards")).unwrap();
    let tar = tar_dir(&root.join("shards"), 3, 20);
    std::fs::create_dir_all(root.join("files")).unwrap();
    let mut files = Vec::new();
    for i in 0..30 {
        let data = payload(10_000 + i, 50 + i);
        std::fs::write(root.join(format!("files/{i:05}.jpg")), &data).unwrap();
        files.push(sample(&format!("{i:05}"), &[("jpg", data)]));
    }
    let records: Vec<(Vec<u8>, Vec<u8>)> =
        (0..40).map(|i| (format!("{i:05}").into_bytes(), payload(20_000 + i, 30 + i))).collect();
    write_lmdb(&root.join("lmdb"), &records);
    let lmdb = records.iter().map(|(k, v)| sample(std::str::from_utf8(k).unwrap(), &[("jpg", v.clone())])).collect();
    let samples = BTreeMap::from([("tar", tar), ("files", files), ("lmdb", lmdb)]);
    Fixture { _dir: dir, root, samples }
}

const MIX_TOML: &str = r#"
fill_missing = { cls = "-1" }

[[sources]]
name = "tar"
uri = "shards"
weight = 0.5

[[sources]]
name = "files"
uri = "files"
weight = 0.3

[[sources]]
name = "lmdb"
uri = "lmdb"
weight = 0.2
options = { field = "jpg" }
"#;

fn write_mix(root: &Path, name: &str, text: &str) -> String {
    let path = root.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

async fn open_mix(root: &Path, text: &str) -> stoker::Result<Arc<DynSampleSource>> {
    stoker::open(&write_mix(root, "train.mix.toml", text), SourceOptions::default()).await
}

fn shuffled(batch: usize, seed: u64) -> LoaderConfig {
    let mut cfg = LoaderConfig::new(batch);
    cfg.order = Order::Shuffle { seed };
    cfg
}

/// Every delivered row: (global index, source name, key, jpg, cls).
type Row = (u64, String, String, Vec<u8>, Vec<u8>);

fn rows(loader: &Loader, epoch: u64, max_batches: usize) -> Vec<Row> {
    let mut out = Vec::new();
    for b in loader.epoch_blocking(epoch).unwrap().take(max_batches) {
        let b = b.unwrap();
        let (src, jpg, cls) = (b.field(SOURCE_FIELD).unwrap(), b.field("jpg").unwrap(), b.field("cls").unwrap());
        for (r, &i) in b.indices().iter().enumerate() {
            let name = String::from_utf8(src.get(r).unwrap().to_vec()).unwrap();
            out.push((
                i,
                name,
                b.key(r).unwrap().to_string(),
                jpg.get(r).unwrap().to_vec(),
                cls.get(r).unwrap().to_vec(),
            ));
        }
    }
    out
}

#[test]
fn mixed_sources_deliver_exact_shares_with_their_own_bytes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = fixture();
    let src = rt.block_on(open_mix(&f.root, MIX_TOML)).unwrap();
    let mix = src.as_mix().expect("a mix file opens a mix");
    assert_eq!(mix.names().collect::<Vec<_>>(), ["tar", "files", "lmdb"]);
    assert_eq!(mix.schema().collect::<Vec<_>>(), ["jpg", "cls", SOURCE_FIELD]);
    let plan = mix.plan().clone();
    // files (30 at 0.3) runs out first: 101 samples an epoch (tar's 50.5 rounds up).
    assert_eq!((plan.len(), plan.counts().collect::<Vec<_>>()), (101, vec![51, 30, 20]));
    assert_eq!(src.info().known_layout(), Some(stoker::Layout::Mix));

    let loader = Loader::new(src.clone(), shuffled(16, 5)).unwrap();
    assert_eq!(loader.batches_per_epoch().unwrap(), 7);
    let got = rows(&loader, 0, usize::MAX);
    assert_eq!(got.len(), 101);
    let mut per: BTreeMap<String, u64> = BTreeMap::new();
    let mut indices = HashSet::new();
    for (i, name, key, jpg, cls) in &got {
        assert!(indices.insert(*i), "index {i} delivered twice");
        let (s, local) = plan.locate(*i).unwrap();
        assert_eq!(name, ["tar", "files", "lmdb"][s], "index {i}");
        let want = &f.samples[name.as_str()][local as usize];
        assert_eq!((key, &jpg[..]), (&want.key, &want.fields[0].data[..]), "{name} sample {local}");
        let want_cls = want.field("cls").map_or(b"-1".to_vec(), |c| c.to_vec());
        assert_eq!(cls, &want_cls);
        *per.entry(name.clone()).or_default() += 1;
    }
    assert_eq!(per, BTreeMap::from([("files".into(), 30), ("lmdb".into(), 20), ("tar".into(), 51)]));

    // Stats per source: what was delivered, and each source's reads.
    let stats = loader.stats();
    let by_name: BTreeMap<&str, &stoker::stats::SourceStats> = stats.sources.iter().map(|s| (&*s.name, s)).collect();
    for (name, want) in [("tar", 51u64), ("files", 30), ("lmdb", 20)] {
        let s = by_name[name];
        assert_eq!((s.samples, s.per_epoch), (want, want), "{name}");
        let bytes: u64 = got
            .iter()
            .filter(|r| r.1 == name)
            .map(|r| r.3.len() as u64 + if name == "tar" { r.4.len() as u64 } else { 0 })
            .sum::<u64>()
            + if name == "tar" { 0 } else { 2 * want }; // the "-1" fills are delivered bytes too
        assert_eq!(s.bytes, bytes, "{name}");
        assert!(s.reads > 0 && s.read_samples == want, "{name}: {s:?}");
    }
    assert_eq!(stats.samples, 101);

    // Another epoch: other draws and order, the same exact shares.
    let again = rows(&loader, 1, usize::MAX);
    assert_ne!(again.iter().map(|r| r.0).collect::<Vec<_>>(), got.iter().map(|r| r.0).collect::<Vec<_>>());
    assert_eq!(again.iter().filter(|r| r.1 == "files").count(), 30);
}

#[test]
fn resume_mid_epoch_delivers_the_rest_once_also_at_another_world_size() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = fixture();
    let src = rt.block_on(open_mix(&f.root, MIX_TOML)).unwrap();
    let full: Vec<u64> =
        rows(&Loader::new(src.clone(), shuffled(8, 11)).unwrap(), 2, usize::MAX).iter().map(|r| r.0).collect();

    // Two ranks take 3 batches each, then save.
    let mut delivered = Vec::new();
    let mut state = None;
    for rank in 0..2 {
        let mut cfg = shuffled(8, 11);
        cfg.partition = Partition::new(rank, 2).unwrap();
        cfg.tail = Tail::Drop;
        let loader = Loader::new(src.clone(), cfg).unwrap();
        let mut it = loader.epoch_blocking(2).unwrap();
        for _ in 0..3 {
            delivered.extend_from_slice(it.next().unwrap().unwrap().indices());
        }
        drop(it);
        state = loader.state();
    }
    let state = state.unwrap();
    assert_eq!(state.sampler.consumed, 48);
    assert!(state.sampler.mix.is_some());
    // Three ranks carry on, through JSON as a checkpoint would.
    let json = serde_json::to_string(&state).unwrap();
    for rank in 0..3 {
        let mut cfg = shuffled(8, 11);
        cfg.partition = Partition::new(rank, 3).unwrap();
        cfg.tail = Tail::Drop;
        let loader = Loader::new(src.clone(), cfg).unwrap();
        loader.load_state(serde_json::from_str(&json).unwrap()).unwrap();
        delivered.extend(rows(&loader, 2, usize::MAX).iter().map(|r| r.0));
    }
    // 53 left over 3 ranks with Drop: 17 each, the last two planned positions dropped.
    assert_eq!(delivered.len(), 48 + 51);
    let once: HashSet<u64> = delivered.iter().copied().collect();
    assert_eq!(once.len(), delivered.len(), "a sample was delivered twice");
    assert!(once.is_subset(&full.iter().copied().collect()));

    // Nor onto the same sources in another order (sizes and weights alone may not tell them
    // apart); a state that names none (an earlier version's) is taken.
    let loader = Loader::new(src.clone(), shuffled(8, 11)).unwrap();
    let mut swapped: stoker::LoaderState = serde_json::from_str(&json).unwrap();
    let names = swapped.mix_sources.clone().expect("a mix's state names its sources");
    assert!(names.len() > 1, "{names:?}");
    swapped.mix_sources.as_mut().unwrap().reverse();
    let e = loader.load_state(swapped.clone()).unwrap_err().to_string();
    assert!(e.contains("in that order") && e.contains(&names[0]), "{e}");
    loader.load_state(stoker::LoaderState { mix_sources: None, ..swapped }).unwrap();

    // A state of this mix does not restore onto a mix with other weights.
    let other = rt.block_on(open_mix(&f.root, &MIX_TOML.replace("weight = 0.2", "weight = 0.25"))).unwrap();
    let loader = Loader::new(other, shuffled(8, 11)).unwrap();
    let e = loader.load_state(serde_json::from_str(&json).unwrap()).unwrap_err().to_string();
    assert!(e.contains("another mix") || e.contains("samples but"), "{e}");
}

#[test]
fn a_mix_is_not_numbered_as_the_part_of_a_larger_source() {
    // first_index numbers a part of one source by the whole's indices; a mix's indices name
    // its sources' samples by position, so a Loader refuses one rather than mislabel them.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = fixture();
    let src = rt.block_on(open_mix(&f.root, MIX_TOML)).unwrap();
    let mut cfg = shuffled(16, 5);
    cfg.first_index = 10;
    let e = Loader::new(src.clone(), cfg).err().expect("refused");
    assert_eq!(e.kind(), stoker::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("first_index") && e.to_string().contains("is a mix"), "{e}");
    assert!(Loader::new(src, shuffled(16, 5)).is_ok(), "numbered from 0, the mix reads");
}

#[test]
fn missing_fields_fail_naming_source_and_field_unless_filled() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = fixture();
    let unfilled = MIX_TOML.replace("fill_missing = { cls = \"-1\" }", "");
    let e = rt.block_on(open_mix(&f.root, &unfilled)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::MixSchema { ref field, .. } if field == "cls"), "{msg}");
    assert!(
        msg.contains("`files`") && msg.contains("`cls`") && msg.contains("`tar` has") && msg.contains("fill_missing"),
        "{msg}"
    );

    // fill_missing = true: empty bytes.
    let filled = MIX_TOML.replace("fill_missing = { cls = \"-1\" }", "fill_missing = true");
    let src = rt.block_on(open_mix(&f.root, &filled)).unwrap();
    let got = rows(&Loader::new(src, shuffled(32, 1)).unwrap(), 0, usize::MAX);
    assert!(got.iter().filter(|r| r.1 != "tar").all(|r| r.4.is_empty()));
    assert!(got.iter().filter(|r| r.1 == "tar").all(|r| !r.4.is_empty()));

    // A sample met later with a field outside the schema: a read error naming all of it.
    std::fs::write(f.root.join("files/00031.png"), b"odd").unwrap();
    let src = rt.block_on(open_mix(&f.root, MIX_TOML)).unwrap();
    let files_31 = src.as_mix().unwrap().plan().global(1, 30).unwrap();
    let e = rt.block_on(src.get(files_31 as usize)).unwrap_err().to_string();
    assert!(e.contains("`files`") && e.contains("00031") && e.contains("`png`"), "{e}");
}

#[test]
fn decode_specs_apply_to_filled_fields() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = fixture();
    let src = rt.block_on(open_mix(&f.root, MIX_TOML)).unwrap();
    let mut cfg = shuffled(25, 3);
    cfg.decode = Some(stoker::decode::DecodeSpec::from_json(r#"{"cls": {"kind": "int"}}"#).unwrap());
    let loader = Loader::new(src.clone(), cfg).unwrap();
    let plan = src.as_mix().unwrap().plan().clone();
    let mut n = 0;
    for b in loader.epoch_blocking(0).unwrap() {
        let b = b.unwrap();
        let cls = b.field("cls").unwrap();
        assert!(cls.ty.is_some(), "cls decodes to a fixed-width column");
        for (r, &i) in b.indices().iter().enumerate() {
            let v = i64::from_ne_bytes(cls.get(r).unwrap().try_into().unwrap());
            let (s, local) = plan.locate(i).unwrap();
            let want = if s == 0 {
                f.samples["tar"][local as usize]
                    .field("cls")
                    .map(|c| std::str::from_utf8(c).unwrap().parse().unwrap())
                    .unwrap()
            } else {
                -1
            };
            assert_eq!(v, want);
            n += 1;
        }
    }
    assert_eq!(n, 101);
}

#[test]
fn mix_file_forms_and_refusals() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = fixture();
    let abs = |p: &str| f.root.join(p).to_string_lossy().into_owned();
    let spec = serde_json::json!({
        "sources": [
            {"uri": abs("shards"), "weight": 2.0},
            {"uri": abs("lmdb"), "weight": 1.0, "options": {"field": "jpg"}},
        ],
        "epoch_length": 90,
        "replacement": true,
        "fill_missing": {"cls": ""},
    });
    // Inline JSON; default names are the URIs.
    let src = rt.block_on(stoker::open(&format!("mix:{spec}"), SourceOptions::default())).unwrap();
    let mix = src.as_mix().unwrap();
    assert_eq!(mix.names().collect::<Vec<_>>(), [abs("shards"), abs("lmdb")]);
    assert_eq!(mix.plan().counts().collect::<Vec<_>>(), [60, 30]);
    // The same as a .mix.json file, relative paths resolved from the file's directory.
    let rel = spec.to_string().replace(&format!("{}/", f.root.to_string_lossy()), "");
    let path = write_mix(&f.root, "x.mix.json", &rel);
    let src = rt.block_on(stoker::open(&path, SourceOptions::default())).unwrap();
    assert_eq!(src.as_mix().unwrap().names().collect::<Vec<_>>(), ["shards", "lmdb"]);
    assert_eq!(src.len(), 100);

    let err = |text: &str| rt.block_on(open_mix(&f.root, text)).unwrap_err().to_string();
    let e = err(&MIX_TOML.replace("name = \"files\"", "name = \"tar\""));
    assert!(e.contains("both named `tar`"), "{e}");
    let e = err(&format!("epoch_length = 200\n{MIX_TOML}"));
    assert!(e.contains("source `tar` has 60 samples but its share of epoch_length 200 is 100"), "{e}");
    let e = err(&MIX_TOML.replace("weight = 0.3", "weight = -1"));
    assert!(e.contains("source `files` has weight -1"), "{e}");
    let e = err("[[sources]]\nuri = \"shards\"\nweight = 1\nsecret_access_key = \"hunter2\"\n");
    assert!(e.contains("unknown field") && !e.contains("hunter2"), "{e}");
    let e = err(&MIX_TOML.replace("uri = \"lmdb\"", "uri = \"inner.mix.json\""));
    assert!(e.contains("itself a mix"), "{e}");
    // A corpus named where the mix file goes is refused unread (a sparse 1 GiB file).
    let big = f.root.join("big.mix.toml");
    std::fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
    let e = rt.block_on(stoker::open(&format!("mix:{}", big.display()), SourceOptions::default()));
    let e = e.unwrap_err().to_string();
    assert!(e.contains("big.mix.toml") && e.contains("larger than"), "{e}");

    // Shard shuffle cannot order a mix.
    let src = rt.block_on(open_mix(&f.root, MIX_TOML)).unwrap();
    let mut cfg = LoaderConfig::new(4);
    cfg.order = Order::ShardShuffle { seed: 1, window: 2 };
    let e = Loader::new(src, cfg).err().unwrap().to_string();
    assert!(e.contains("use shuffle"), "{e}");
}
