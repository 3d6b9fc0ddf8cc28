//! Damage costs only the damaged samples (issue 16): shards written by `webdataset` and
//! Python's `tarfile` with headers overwritten, cut short, zeroed, or not tars at all open
//! under `on_damage=skip` with every other sample byte-identical and the loss reported;
//! without it they fail naming shard and offset. Payload bit flips in packed (checksummed)
//! datasets, local and over S3, are never delivered.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;
use futures::StreamExt;
use stoker::loader::{ErrorPolicy, Loader, LoaderConfig};
use stoker::{DamageCause, DamagePolicy, DynSampleSource, Error, SourceOptions};

/// Writes `n` samples of two fields (`jpg` of 700 + 113·i bytes, `cls`) with `webdataset` or
/// `tarfile`, then reports every member's header and payload offsets as Python reads them.
const WRITE: &str = r#"
import io, json, sys, tarfile
kind, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def payload(i, n): return bytes((i * 31 + j * 7) % 256 for j in range(n))
samples = [(f"s{i:04d}", {"jpg": payload(i, 700 + i * 113), "cls": str(i).encode()}) for i in range(n)]
if kind == "webdataset":
    import webdataset as wds
    with wds.TarWriter(out) as w:
        for k, f in samples:
            w.write({"__key__": k, **f})
else:
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for k, f in samples:
            for ext, data in f.items():
                info = tarfile.TarInfo(f"{k}.{ext}")
                info.size, info.mtime = len(data), 1_700_000_000
                tf.addfile(info, io.BytesIO(data))
with tarfile.open(out) as tf:
    members = [[m.name, m.offset, m.offset_data, m.size] for m in tf.getmembers()]
print(json.dumps({"samples": [[k, {e: d.hex() for e, d in f.items()}] for k, f in samples], "members": members}))
"#;

/// What a Python-written shard holds: samples by key (field -> bytes) and member offsets by
/// name (header offset, payload offset).
struct Shard {
    samples: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    members: BTreeMap<String, (u64, u64)>,
}

fn write_with_python(kind: &str, out: &Path, n: usize) -> Shard {
    let res = Command::new(python()).arg("-c").arg(WRITE).arg(kind).arg(out).arg(n.to_string()).output().unwrap();
    assert!(res.status.success(), "{kind}: {}", String::from_utf8_lossy(&res.stderr));
    let v: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    let hex = |s: &str| (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect();
    let samples = v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let fields = s[1].as_object().unwrap().iter().map(|(e, d)| (e.clone(), hex(d.as_str().unwrap()))).collect();
            (s[0].as_str().unwrap().to_string(), fields)
        })
        .collect();
    let members = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m[0].as_str().unwrap().to_string(), (m[1].as_u64().unwrap(), m[2].as_u64().unwrap())))
        .collect();
    Shard { samples, members }
}

fn skip() -> SourceOptions {
    SourceOptions { on_damage: Some(DamagePolicy::Skip), ..Default::default() }
}

fn overwrite(path: &Path, at: u64, bytes: &[u8]) {
    let mut data = std::fs::read(path).unwrap();
    data[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, data).unwrap();
}

fn garbage(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(37).wrapping_add(11)).collect()
}

/// Every sample of `src`, by key, each field's bytes.
async fn read_all(src: &Arc<DynSampleSource>) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for i in 0..src.len() {
        let s = src.get(i).await.unwrap();
        out.insert(s.key.clone(), s.fields.iter().map(|f| (f.name.to_string(), f.data.to_vec())).collect());
    }
    out
}

/// `all` without `lost`.
fn except(
    all: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    lost: &[&str],
) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    all.iter().filter(|(k, _)| !lost.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect()
}

async fn open_err(uri: &str) -> Error {
    stoker::open(uri, Default::default()).await.expect_err("damage without the skip policy fails the open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_overwritten_mid_shard_costs_only_its_sample() {
    for kind in ["webdataset", "tarfile"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let shard = write_with_python(kind, &path, 12);
        let (header, _) = shard.members["s0005.jpg"];
        overwrite(&path, header, &garbage(512));
        let uri = path.to_str().unwrap();

        let e = open_err(uri).await;
        assert!(matches!(e, Error::CorruptTar { offset, .. } if offset == header), "{kind}: {e:?}");
        assert!(e.to_string().contains("s.tar") && e.to_string().contains("on_damage=skip"), "{kind}: {e}");

        let src = stoker::open(uri, skip()).await.unwrap();
        assert_eq!(read_all(&src).await, except(&shard.samples, &["s0005"]), "{kind}");
        let damage = src.damage();
        assert_eq!(damage.len(), 1, "{kind}: {damage:?}");
        let d = &damage[0];
        assert_eq!((d.cause, d.start), (DamageCause::DamagedHeader, header), "{kind}");
        assert!(d.end > header && d.end <= shard.members["s0006.jpg"].0.max(shard.members["s0006.cls"].0));
        assert_eq!((d.key_before.as_deref(), d.key_after.as_deref()), (Some("s0004"), Some("s0006")), "{kind}");
        assert_eq!(d.dropped, ["s0005"], "{kind}: the surviving member of s0005 is not delivered alone");
        assert!(d.shard.ends_with("s.tar"), "{}", d.shard);

        // Through the Loader: the damage shows in stats(), nothing read fails.
        let stats = epoch(src, ErrorPolicy::Skip).await;
        assert_eq!((stats.0, stats.1.skipped), (11, 0), "{kind}");
        assert_eq!((stats.1.damage.len(), stats.1.samples_lost_at_open), (1, 1), "{kind}");
        // The damaged shard's index is not saved: a passing read failure must not become
        // permanent, and the next open without skip fails again.
        assert!(!dir.path().join("s.tar.stoker-idx.json").exists());
        assert!(matches!(open_err(uri).await, Error::CorruptTar { .. }));
    }
}

/// Delivered sample count and the stats after one epoch with `policy`.
async fn epoch(src: Arc<DynSampleSource>, policy: ErrorPolicy) -> (u64, stoker::stats::StatsSnapshot) {
    let mut cfg = LoaderConfig::new(3);
    cfg.on_error = policy;
    let loader = Loader::new(src, cfg).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let mut n = 0;
    while let Some(b) = stream.next().await {
        n += b.unwrap().len() as u64;
    }
    (n, loader.stats())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_damaged_headers_and_a_zeroed_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.tar");
    let shard = write_with_python("tarfile", &path, 14);
    overwrite(&path, shard.members["s0003.cls"].0, &garbage(512));
    overwrite(&path, shard.members["s0009.jpg"].0, &garbage(512));
    // A zeroed header reads as the end of the archive to every tar reader: before this,
    // everything after it vanished without a word.
    overwrite(&path, shard.members["s0012.jpg"].0, &[0u8; 512]);
    let uri = path.to_str().unwrap();
    assert!(matches!(open_err(uri).await, Error::CorruptTar { .. }));

    let src = stoker::open(uri, skip()).await.unwrap();
    assert_eq!(read_all(&src).await, except(&shard.samples, &["s0003", "s0009", "s0012"]));
    let damage = src.damage();
    let found: Vec<_> = damage.iter().map(|d| (d.dropped.clone(), d.key_before.clone(), d.key_after.clone())).collect();
    let s = |k: &str| Some(k.to_string());
    assert_eq!(
        found,
        [
            (vec!["s0003".to_string()], s("s0002"), s("s0004")),
            (vec!["s0009".to_string()], s("s0008"), s("s0010")),
            (vec!["s0012".to_string()], s("s0011"), s("s0013")),
        ]
    );
    // Whole samples could hide in the damaged bytes, where nothing names them.
    assert!(damage.iter().all(|d| d.samples_lost.is_none()), "{damage:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_cut_mid_member_keeps_what_precedes_the_cut() {
    for kind in ["webdataset", "tarfile"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let shard = write_with_python(kind, &path, 10);
        let (_, data) = shard.members["s0007.jpg"];
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..data as usize + 100]).unwrap();
        let uri = path.to_str().unwrap();
        let e = open_err(uri).await;
        assert!(e.to_string().contains("truncated"), "{kind}: {e}");

        let src = stoker::open(uri, skip()).await.unwrap();
        let lost: Vec<String> = (7..10).map(|i| format!("s{i:04}")).collect();
        let lost: Vec<&str> = lost.iter().map(String::as_str).collect();
        assert_eq!(read_all(&src).await, except(&shard.samples, &lost), "{kind}");
        let d = &src.damage()[0];
        assert_eq!((d.cause, d.end, d.dropped.clone()), (DamageCause::Truncated, data + 100, vec!["s0007".into()]));
        assert_eq!(d.samples_lost, Some(1), "{kind}: nothing can follow the cut");
    }
}

/// Points the size field of the member header at `header` past the end of the shard (8 GiB)
/// and makes its checksum valid again: a header that verifies, and lies.
fn lie_about_size(path: &Path, header: u64) {
    let mut data = std::fs::read(path).unwrap();
    let h = &mut data[header as usize..header as usize + 512];
    assert_eq!(&h[257..262], b"ustar", "a member header at {header}");
    h[124..136].copy_from_slice(format!("{:011o}\0", 0o77_777_777_777u64).as_bytes());
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    std::fs::write(path, data).unwrap();
}

/// The 3rd member's size field points past the end of an otherwise whole shard: the walk
/// does not trust it, resumes at the very next header, and counts exactly what was lost.
/// Before, everything after the member was lost and one sample counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_field_past_the_end_costs_only_its_member() {
    for kind in ["webdataset", "tarfile"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let shard = write_with_python(kind, &path, 10);
        let mut members: Vec<(&String, &(u64, u64))> = shard.members.iter().collect();
        members.sort_by_key(|(_, (at, _))| *at);
        let (third, (_, data)) = members[2];
        // The member's own header is the block before its payload (after any pax header).
        let header = data - 512;
        lie_about_size(&path, header);
        let key = third.split('.').next().unwrap().to_string();
        let uri = path.to_str().unwrap();

        let e = open_err(uri).await;
        assert!(matches!(e, Error::CorruptTar { offset, .. } if offset == header), "{kind}: {e:?}");
        assert!(e.to_string().contains("past the end"), "{kind}: {e}");

        let src = stoker::open(uri, skip()).await.unwrap();
        assert_eq!(read_all(&src).await, except(&shard.samples, &[&key]), "{kind}: every other sample, whole");
        let damage = src.damage();
        assert_eq!(damage.len(), 1, "{kind}: {damage:?}");
        let d = &damage[0];
        assert_eq!((d.cause, d.start, d.end), (DamageCause::DamagedHeader, header, members[3].1 .0), "{kind}: {d:?}");
        assert_eq!((d.dropped.clone(), d.samples_lost), (vec![key.clone()], Some(1)), "{kind}: counted exactly");
        assert!(d.reason.contains("size field is wrong"), "{kind}: {}", d.reason);
        let stats = epoch(src, ErrorPolicy::Raise).await;
        assert_eq!((stats.0, stats.1.samples_lost_at_open), (9, 1), "{kind}");
    }
}

/// The same with one member per sample (written by the tar crate): every member but the
/// lying one is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_samples_lose_only_the_member_whose_size_lies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.tar");
    let samples: Vec<_> = (0..8).map(|i| sample(&format!("k{i}"), &[("bin", payload(i, 600 + i * 300))])).collect();
    write_tar(&path, &samples);
    // Each member is a header and its payload padded to 512-byte blocks.
    let at = |i: usize| -> u64 { (0..i).map(|j| 512 + (600 + j as u64 * 300).div_ceil(512) * 512).sum() };
    lie_about_size(&path, at(2));
    let src = stoker::open(path.to_str().unwrap(), skip()).await.unwrap();
    let mut got = Vec::new();
    for i in 0..src.len() {
        got.push(src.get(i).await.unwrap());
    }
    let want: Vec<_> = samples.iter().enumerate().filter(|(i, _)| *i != 2).map(|(_, s)| s.clone()).collect();
    let keys = |v: &[stoker::Sample]| v.iter().map(|s| s.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&got), keys(&want));
    assert!(got == want, "every other member's bytes");
    let d = &src.damage()[0];
    assert_eq!((d.start, d.end, d.samples_lost), (at(2), at(3), Some(1)), "{d:?}");
    assert_eq!(
        (d.key_before.as_deref(), d.key_after.as_deref(), d.dropped.clone()),
        (Some("k1"), Some("k3"), vec!["k2".to_string()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_file_among_good_shards_is_skipped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_with_python("webdataset", &dir.path().join("a.tar"), 4);
    std::fs::write(dir.path().join("b.tar"), garbage(20_000)).unwrap();
    let c = write_with_python("tarfile", &dir.path().join("c.tar"), 3);
    let uri = dir.path().to_str().unwrap();
    let e = open_err(uri).await;
    assert!(e.to_string().contains("b.tar"), "{e}");

    let src = stoker::open(uri, skip()).await.unwrap();
    let mut want = a.samples.clone();
    // Both writers use the same keys; samples are told apart by shard position here.
    assert_eq!(src.len(), 4 + 3);
    for (i, (k, fields)) in a.samples.iter().enumerate() {
        let s = src.get(i).await.unwrap();
        assert_eq!((&s.key, s.fields.len()), (k, fields.len()));
    }
    want.clear();
    for (i, k) in c.samples.keys().enumerate() {
        assert_eq!(&src.get(4 + i).await.unwrap().key, k);
    }
    let damage = src.damage();
    assert_eq!(damage.len(), 1);
    assert_eq!((damage[0].cause, damage[0].samples_lost, damage[0].end), (DamageCause::UnreadableShard, None, 20_000));
    assert!(damage[0].shard.ends_with("b.tar"));
    // Every shard unreadable: nothing to read is still an error, saying why.
    let only = dir.path().join("b.tar");
    let e = stoker::open(only.to_str().unwrap(), skip()).await.unwrap_err();
    assert!(e.to_string().contains("damaged or unreadable"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_missing_from_a_brace_pattern_is_skipped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_with_python("webdataset", &dir.path().join("s-0.tar"), 4);
    let c = write_with_python("tarfile", &dir.path().join("s-2.tar"), 3);
    let uri = format!("{}/s-{{0..2}}.tar", dir.path().display());
    // Without the policy a missing shard fails the open, naming it.
    let e = open_err(&uri).await;
    assert!(matches!(e, Error::NotFound { .. }) && e.to_string().contains("s-1.tar"), "{e}");

    let src = stoker::open(&uri, skip()).await.unwrap();
    assert_eq!(src.len(), 4 + 3);
    for (i, (k, fields)) in a.samples.iter().chain(&c.samples).enumerate() {
        let s = src.get(i).await.unwrap();
        assert_eq!(&s.key, k);
        for f in &s.fields {
            assert_eq!(&f.data[..], &fields[&*f.name][..], "{k}.{}", f.name);
        }
    }
    let damage = src.damage();
    assert_eq!(damage.len(), 1, "{damage:?}");
    assert_eq!((damage[0].cause, damage[0].samples_lost), (DamageCause::UnreadableShard, None));
    assert!(damage[0].shard.ends_with("s-1.tar"), "{}", damage[0].shard);
    // Every shard missing: still an error, never an empty dataset.
    let none = format!("{}/t-{{0..1}}.tar", dir.path().display());
    let e = stoker::open(&none, skip()).await.unwrap_err();
    assert!(e.to_string().contains("damaged or unreadable") && e.to_string().contains("t-0.tar"), "{e}");
}

/// Pack `n` samples of 3000 bytes with `stoker pack` (which records checksums) into `dest`.
async fn packed(dest: &str, n: usize) -> BTreeMap<String, Vec<u8>> {
    let src_dir = tempfile::tempdir().unwrap();
    let samples: Vec<_> = (0..n).map(|i| sample(&format!("k{i:03}"), &[("bin", payload(i, 3000))])).collect();
    write_tar(&src_dir.path().join("in.tar"), &samples);
    let src = open(src_dir.path().join("in.tar").to_str().unwrap()).await;
    let opts = stoker::pack::PackOptions { samples_per_shard: Some(10), ..Default::default() };
    stoker::pack::pack(src, dest, &opts, &()).await.unwrap();
    samples.into_iter().map(|s| (s.key, s.fields[0].data.to_vec())).collect()
}

/// Flip one bit in the payload of the `nth` member of `shard`.
fn flip(shard: &Path, nth: usize) -> u64 {
    let at = (nth as u64) * (512 + 3072) + 512 + 100;
    let mut data = std::fs::read(shard).unwrap();
    data[at as usize] ^= 0x10;
    std::fs::write(shard, data).unwrap();
    at
}

/// One epoch under Skip: delivered keys with bytes checked, and the stats.
async fn skip_epoch(
    src: Arc<DynSampleSource>,
    want: &BTreeMap<String, Vec<u8>>,
) -> (Vec<String>, stoker::stats::StatsSnapshot) {
    let mut cfg = LoaderConfig::new(4);
    cfg.on_error = ErrorPolicy::Skip;
    let loader = Loader::new(src, cfg).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let mut keys = Vec::new();
    while let Some(b) = stream.next().await {
        let b = b.unwrap();
        for row in 0..b.len() {
            let k = b.key(row).unwrap().to_string();
            assert_eq!(b.field("bin").unwrap().get(row).unwrap(), &want[&k][..], "{k} delivered with wrong bytes");
            keys.push(k);
        }
    }
    (keys, loader.stats())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_payload_bit_in_a_packed_dataset_is_never_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let want = packed(dir.path().to_str().unwrap(), 20).await;
    let shard = dir.path().join("shard-000001.tar");
    flip(&shard, 3);
    // A manifest open (no stat) and a listing open both see the checksums.
    for extra in ["", "?manifest=false"] {
        let src = open(&format!("{}{extra}", dir.path().display())).await;
        let e = src.get(13).await.map(|s| s.key).unwrap_err();
        assert!(matches!(e, Error::CorruptData { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("shard-000001.tar") && msg.contains("k013") && msg.contains("`bin`"), "{msg}");
        assert_eq!(src.get(12).await.unwrap().fields[0].data.to_vec(), want["k012"]);
        let (keys, stats) = skip_epoch(src, &want).await;
        assert!(!keys.contains(&"k013".to_string()));
        assert_eq!((keys.len(), stats.skipped, stats.skipped_by_cause.checksum_mismatch), (19, 1, 1));
        assert_eq!(stats.samples + stats.skipped, 20, "delivered and skipped add up to the plan");
        // The Raise policy stops at it with the same error.
        let mut cfg = LoaderConfig::new(4);
        cfg.on_error = ErrorPolicy::Raise;
        let loader = Loader::new(open(&format!("{}{extra}", dir.path().display())).await, cfg).unwrap();
        let mut stream = loader.epoch(0).unwrap();
        let mut failed = None;
        while let Some(b) = stream.next().await {
            if let Err(e) = b {
                failed = Some(e);
                break;
            }
        }
        assert!(matches!(failed, Some(Error::CorruptData { .. })), "{failed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_checksums_a_flip_is_undetectable_until_index_records_them() {
    let dir = tempfile::tempdir().unwrap();
    let samples: Vec<_> = (0..8).map(|i| sample(&format!("k{i:03}"), &[("bin", payload(i, 3000))])).collect();
    let shard = dir.path().join("s.tar");
    write_tar(&shard, &samples);
    let uri = dir.path().to_str().unwrap();
    // Plain tar has no payload checksum: the flipped byte reaches the reader (documented).
    flip(&shard, 2);
    let got = open(uri).await.get(2).await.unwrap();
    assert_ne!(got.fields[0].data.to_vec(), samples[2].fields[0].data.to_vec());
    // `stoker index --checksums` over known-good bytes records them; later damage is caught.
    flip(&shard, 2);
    let opts = SourceOptions { checksums: Some(true), ..Default::default() };
    let report = stoker::index(uri, opts).await.unwrap();
    assert!(report.checksums);
    flip(&shard, 5);
    let src = open(uri).await;
    assert!(matches!(src.get(5).await.map(|s| s.key).unwrap_err(), Error::CorruptData { .. }));
    assert!(src.get(2).await.unwrap() == samples[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_payload_bit_over_s3_is_never_delivered() {
    use common::s3::uri;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data")).unwrap();
    let server = common::s3::serve(root.path()).await;
    let ep = server.endpoint();
    let want = packed(&uri(&ep, "ds", ""), 20).await;
    flip(&root.path().join("data/ds/shard-000000.tar"), 7);
    for extra in ["", "&cache_bytes=8388608&cache_block=4096"] {
        let src = open(&uri(&ep, "ds", extra)).await;
        let e = src.get(7).await.map(|s| s.key).unwrap_err();
        assert!(matches!(e, Error::CorruptData { .. }) && e.to_string().contains("k007"), "{extra}: {e:?}");
        assert!(!e.to_string().contains(common::s3::SK));
        let (keys, stats) = skip_epoch(src, &want).await;
        assert_eq!((keys.len(), stats.skipped_by_cause.checksum_mismatch), (19, 1), "{extra}");
    }
}
