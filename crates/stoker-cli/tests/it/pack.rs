//! `stoker pack` end to end: real files, real processes, read back by webdataset, py-lmdb and
//! Stoker itself (the conformance suite).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use stoker::{Field, Sample, SourceOptions};

use crate::common::python;

pub(crate) fn stoker(args: &[&str]) -> Output {
    stoker_env(args, None)
}

pub(crate) fn stoker_env(args: &[&str], abort_after: Option<u64>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stoker"));
    c.args(args);
    if let Some(n) = abort_after {
        c.env("STOKER_TEST_PACK_ABORT_AFTER", n.to_string());
    }
    c.output().expect("run stoker")
}

pub(crate) fn ok(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "stoker failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

pub(crate) fn err(out: &Output) -> String {
    assert!(!out.status.success(), "stoker should have failed: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn payload(seed: usize, len: usize) -> Vec<u8> {
    stoker_testkit::fixtures::payload(seed as u64, len)
}

fn sample(key: &str, fields: &[(&str, Vec<u8>)]) -> Sample {
    Sample {
        key: key.into(),
        fields: fields.iter().map(|(n, d)| Field { name: (*n).into(), data: Bytes::from(d.clone()) }).collect(),
    }
}

/// A directory of files, two per sample (`KEY.cls`, `KEY.jpg`) in nested directories, and
/// the samples `--group` should make of them (in sorted path order, `cls` before `jpg`).
pub(crate) fn image_dir(dir: &Path, n: usize) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let key = format!("part{}/img{i:04}", i / 10);
            let jpg = payload(i, 300 + (i * 997) % 5000);
            let cls = (i % 7).to_string().into_bytes();
            std::fs::create_dir_all(dir.join(format!("part{}", i / 10))).unwrap();
            std::fs::write(dir.join(format!("{key}.jpg")), &jpg).unwrap();
            std::fs::write(dir.join(format!("{key}.cls")), &cls).unwrap();
            sample(&key, &[("cls", cls), ("jpg", jpg)])
        })
        .collect()
}

/// Run `integration/py/pack_check.py CMD DIR` and parse the samples it prints.
fn py(cmd: &str, dir: &Path, stdin: Option<String>) -> Vec<Sample> {
    use std::io::Write;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py/pack_check.py");
    let mut child = Command::new(python())
        .arg(&script)
        .arg(cmd)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; run integration/setup.sh", python().display()));
    child.stdin.take().unwrap().write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "pack_check.py {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    samples_of(&out.stdout)
}

/// The samples a fixture script prints: `[{"key": ..., "fields": [[name, hex], ...]}, ...]`.
fn samples_of(json: &[u8]) -> Vec<Sample> {
    let v: Vec<serde_json::Value> = serde_json::from_slice(json).unwrap();
    v.iter()
        .map(|x| Sample {
            key: x["key"].as_str().unwrap().into(),
            fields: x["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| Field {
                    name: f[0].as_str().unwrap().into(),
                    data: Bytes::from(unhex(f[1].as_str().unwrap())),
                })
                .collect(),
        })
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Write an LMDB with py-lmdb (keys Stoker's own tools could never produce from files).
fn make_lmdb(dir: &Path, records: &[(&str, Vec<u8>)]) {
    let json =
        serde_json::to_string(&records.iter().map(|(k, v)| (k.to_string(), hex(v))).collect::<Vec<_>>()).unwrap();
    py("make-lmdb", dir, Some(json));
}

pub(crate) fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

pub(crate) fn names_of(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn assert_same(got: &[Sample], want: &[Sample], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: number of samples");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g, w, "{what}: sample {}", w.key);
    }
}

async fn conformance(uri: &str, want: &[Sample]) {
    let src = stoker::open(uri, SourceOptions::default()).await.unwrap();
    stoker::conformance::run_all(src, want, "", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_files_become_tar_shards_that_webdataset_and_stoker_read() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("images"), dir.path().join("shards"));
    let want = image_dir(&src, 57);
    let r = ok(&stoker(&[
        "pack",
        s(&src),
        s(&dest),
        "--group",
        "--prefix",
        "train",
        "--shard-size",
        "40KiB",
        "--json",
        "--quiet",
    ]));
    assert_eq!(r["samples"], 57);
    assert_eq!(r["layout"], "tar");
    let shards = r["shards"].as_u64().unwrap() as usize;
    assert!(shards > 3, "40 KiB shards of ~150 KiB: {r}");
    assert_eq!(r["payload_bytes"], want.iter().map(Sample::total_bytes).sum::<u64>());
    let names = names_of(&dest);
    for i in 0..shards {
        let shard = format!("train-{i:06}.tar");
        assert!(names.contains(&shard) && names.contains(&format!("{shard}.stoker-idx.json")), "{names:?}");
        let len = std::fs::metadata(dest.join(&shard)).unwrap().len();
        assert!(len <= 40 << 10 && len % 512 == 0, "{shard} is {len} bytes");
    }
    assert!(names.contains(&".stoker-manifest.json".to_string()));
    assert!(!names.iter().any(|n| n.ends_with(".partial")), "no temporary file is left: {names:?}");

    assert_same(&py("read-tar", &dest, None), &want, "webdataset");
    conformance(s(&dest), &want).await;
    // `tar` itself lists the members as KEY.FIELD, nothing else.
    let listed = Command::new("tar").arg("-tf").arg(dest.join("train-000000.tar")).output().unwrap();
    let first: Vec<String> = String::from_utf8_lossy(&listed.stdout).lines().map(str::to_string).collect();
    assert_eq!(&first[..2], ["part0/img0000.cls", "part0/img0000.jpg"]);

    // Without --group the two files of a key are two samples in a row: refused, not merged.
    let e = err(&stoker(&["pack", s(&src), s(&dir.path().join("flat"))]));
    assert!(e.contains("--group") && e.contains("part0/img0000"), "{e}");
    assert!(!dir.path().join("flat").exists(), "a refused pack leaves nothing behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lmdb_output_reads_in_py_lmdb_and_stoker_and_multi_field_samples_need_a_field() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("images"), dir.path().join("lmdb"));
    let grouped = image_dir(&src, 23);
    let e = err(&stoker(&["pack", s(&src), s(&dest), "--layout", "lmdb", "--group"]));
    assert!(e.contains("--field NAME") && e.contains("cls, jpg"), "{e}");
    let r = ok(&stoker(&["pack", s(&src), s(&dest), "--layout", "lmdb", "--group", "--field", "jpg", "--json"]));
    assert_eq!((r["samples"].as_u64(), r["shards"].as_u64()), (Some(23), Some(1)));
    let mut want: Vec<Sample> =
        grouped.iter().map(|s| sample(&s.key, &[("data", s.field("jpg").unwrap().to_vec())])).collect();
    want.sort_by(|a, b| a.key.cmp(&b.key));
    let kept = [".data.mdb.landed.json", ".stoker-pack.json", "data.mdb"];
    assert_eq!(names_of(&dest), kept, "only the data, its landing record and the plan remain");
    assert_same(&py("read-lmdb", &dest, None), &want, "py-lmdb");
    conformance(s(&dest), &want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_layout_packs_into_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..40).map(|i| (format!("rec/{i:03}"), payload(i, 100 + i * 37))).collect();
    let lmdb = dir.path().join("lmdb");
    make_lmdb(&lmdb, &records.iter().map(|(k, v)| (k.as_str(), v.clone())).collect::<Vec<_>>());
    let want: Vec<Sample> = records.iter().map(|(k, v)| sample(k, &[("data", v.clone())])).collect();

    // LMDB -> tar, 7 samples a shard.
    let tar = dir.path().join("tar");
    let r = ok(&stoker(&["pack", s(&lmdb), s(&tar), "--samples-per-shard", "7", "--json"]));
    assert_eq!(r["shards"], 6);
    assert_same(&py("read-tar", &tar, None), &want, "webdataset from LMDB");
    // tar -> tar with other boundaries, -> LMDB again: the same samples all the way.
    let tar2 = dir.path().join("tar2");
    ok(&stoker(&["pack", s(&tar), s(&tar2), "--shard-size", "1MiB", "--prefix", "one", "--json"]));
    assert_eq!(names_of(&tar2).iter().filter(|n| n.ends_with(".tar")).count(), 1);
    conformance(s(&tar2), &want).await;
    let back = dir.path().join("lmdb2");
    ok(&stoker(&["pack", s(&tar2), s(&back), "--layout", "lmdb", "--json"]));
    assert_same(&py("read-lmdb", &back, None), &want, "py-lmdb after two conversions");
}

/// TFRecord's masked CRC32C (Castagnoli, bit by bit: the tests carry no CRC crate).
fn masked_crc(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    (!crc).rotate_right(15).wrapping_add(0xa282_ead8)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tfrecord_files_pack_into_tar_shards_and_lmdb() {
    let dir = tempfile::tempdir().unwrap();
    let tfr = dir.path().join("tfr");
    std::fs::create_dir(&tfr).unwrap();
    let mut want = Vec::new();
    for f in 0..2 {
        let mut file = Vec::new();
        for r in 0..15 {
            let data = payload(f * 100 + r, 50 + r * 31);
            let len = (data.len() as u64).to_le_bytes();
            for part in [&len[..], &masked_crc(&len).to_le_bytes(), &data, &masked_crc(&data).to_le_bytes()] {
                file.extend_from_slice(part);
            }
            want.push(sample(&format!("part-{f}/{r:09}"), &[("data", data)]));
        }
        std::fs::write(tfr.join(format!("part-{f}.tfrecord")), file).unwrap();
    }
    let info = ok(&stoker(&["inspect", s(&tfr), "--json"]));
    assert_eq!((info["layout"].as_str(), info["samples"].as_u64()), (Some("tfrecord"), Some(30)), "{info}");
    let tar = dir.path().join("tar");
    let r = ok(&stoker(&["pack", s(&tfr), s(&tar), "--samples-per-shard", "8", "--json"]));
    assert_eq!((r["samples"].as_u64(), r["shards"].as_u64()), (Some(30), Some(4)));
    assert_same(&py("read-tar", &tar, None), &want, "webdataset from TFRecord");
    let lmdb = dir.path().join("lmdb");
    ok(&stoker(&["pack", s(&tfr), s(&lmdb), "--layout", "lmdb", "--json"]));
    let mut by_key = want.clone();
    by_key.sort_by(|a, b| a.key.cmp(&b.key));
    conformance(s(&lmdb), &by_key).await;
}

/// The HDF5 files `integration/py/write_hdf5.py KIND` writes with h5py into `dir`, and the
/// samples it says Stoker reads from them.
fn hdf5_fixture(kind: &str, dir: &Path) -> Vec<Sample> {
    let python = std::env::var_os("STOKER_WRITERS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-peers/bin/python"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py/write_hdf5.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(kind)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; run integration/setup.sh", python.display()));
    assert!(out.status.success(), "write_hdf5.py {kind}: {}", String::from_utf8_lossy(&out.stderr));
    samples_of(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hdf5_files_pack_into_tar_shards_and_lmdb() {
    let dir = tempfile::tempdir().unwrap();
    let h5 = dir.path().join("h5");
    let want = hdf5_fixture("mixed", &h5);
    let info = ok(&stoker(&["inspect", s(&h5), "--json"]));
    assert_eq!((info["layout"].as_str(), info["samples"].as_u64()), (Some("hdf5"), Some(60)), "{info}");
    let tar = dir.path().join("tar");
    let r = ok(&stoker(&["pack", s(&h5), s(&tar), "--samples-per-shard", "16", "--json"]));
    assert_eq!((r["samples"].as_u64(), r["shards"].as_u64()), (Some(60), Some(4)));
    assert_same(&py("read-tar", &tar, None), &want, "webdataset from HDF5");
    let lmdb = dir.path().join("lmdb");
    ok(&stoker(&["pack", s(&h5), s(&lmdb), "--layout", "lmdb", "--field", "image", "--json"]));
    let mut by_key: Vec<Sample> =
        want.iter().map(|w| sample(&w.key, &[("data", w.field("image").unwrap().to_vec())])).collect();
    by_key.sort_by(|a, b| a.key.cmp(&b.key));
    conformance(s(&lmdb), &by_key).await;
}

#[test]
fn keys_that_could_escape_or_split_differently_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("images");
    image_dir(&src, 2);
    for prefix in ["../up", "a/b", ".hidden", ""] {
        let e = err(&stoker(&["pack", s(&src), s(&dir.path().join("out")), "--group", "--prefix", prefix]));
        assert!(e.contains("shard prefix"), "{prefix:?}: {e}");
    }
    assert!(!dir.path().join("out").exists() && !dir.path().join("up").exists());

    for (key, why) in [
        ("../evil", "`..`"),
        ("ok/../../evil", "`..`"),
        ("/etc/passwd", "absolute"),
        ("a//b", "empty path component"),
        ("bell\u{7}", "U+0007"),
        ("img.001", "hold no dot"),
        ("__meta__/x", "metadata"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let lmdb = dir.path().join("lmdb");
        make_lmdb(&lmdb, &[("fine", b"1".to_vec()), (key, b"2".to_vec())]);
        let dest = dir.path().join("out");
        let e = err(&stoker(&["pack", s(&lmdb), s(&dest)]));
        assert!(e.contains(why), "key {key:?}: {e}");
        assert!(!dest.exists(), "key {key:?}: nothing may be written");
    }
}

/// Kill `stoker pack` part-way (abort: no unwinding, like `kill -9`), rerun it, and compare
/// with an uninterrupted run byte for byte.
#[test]
fn an_interrupted_pack_resumes_and_matches_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("images");
    image_dir(&src, 60);
    let (clean, resumed) = (dir.path().join("clean"), dir.path().join("resumed"));
    let run = |d: &Path, abort: Option<u64>| {
        stoker_env(&["pack", s(&src), s(d), "--group", "--samples-per-shard", "10", "--jobs", "1", "--json"], abort)
    };
    ok(&run(&clean, None));

    // Dies after the third shard's samples are written but before it is renamed.
    let killed = run(&resumed, Some(25));
    assert!(!killed.status.success(), "the injected abort kills the process");
    let left = names_of(&resumed);
    assert!(left.contains(&"shard-000001.tar".to_string()), "{left:?}");
    assert!(!left.contains(&"shard-000002.tar".to_string()), "a half-written shard has no final name: {left:?}");
    assert!(left.contains(&".shard-000002.tar.partial".to_string()), "{left:?}");
    assert!(!left.contains(&".stoker-manifest.json".to_string()), "{left:?}");
    assert!(
        std::fs::read(resumed.join("shard-000000.tar")).unwrap()
            == std::fs::read(clean.join("shard-000000.tar")).unwrap()
    );

    let r = ok(&run(&resumed, None));
    assert_eq!(r["resumed_shards"], 2, "{r}");
    assert_eq!(r["written_samples"], 40, "{r}");
    let tars = |d: &Path| files(d).into_iter().filter(|(n, _)| n.ends_with(".tar")).collect::<BTreeMap<_, _>>();
    let (a, b) = (tars(&resumed), tars(&clean));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    assert!(a == b, "same shards, same bytes");
    assert_eq!(names_of(&resumed), names_of(&clean), "same files, no temporary ones");
    // A third run has nothing left to do.
    let again = ok(&run(&resumed, None));
    assert_eq!((again["resumed_shards"].as_u64(), again["written_samples"].as_u64()), (Some(6), Some(0)));
}

#[test]
fn an_interrupted_lmdb_pack_resumes_from_its_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..700).map(|i| (format!("k{i:05}"), payload(i, 50 + i % 300))).collect();
    let src = dir.path().join("src");
    make_lmdb(&src, &records.iter().map(|(k, v)| (k.as_str(), v.clone())).collect::<Vec<_>>());
    let (clean, resumed) = (dir.path().join("clean"), dir.path().join("resumed"));
    let run = |d: &Path, abort: Option<u64>| stoker_env(&["pack", s(&src), s(d), "--layout", "lmdb", "--json"], abort);
    ok(&run(&clean, None));
    // Records go in chunks of 256: abort once the second chunk is handed to the writer.
    let killed = run(&resumed, Some(300));
    assert!(!killed.status.success());
    assert!(!resumed.join("data.mdb").exists(), "no data.mdb until every record is in");
    let r = ok(&run(&resumed, None));
    let written = r["written_samples"].as_u64().unwrap();
    assert!(written < 700, "the rerun kept the committed records and wrote {written}");
    assert_eq!(names_of(&resumed), names_of(&clean));
    let want: Vec<Sample> = records.iter().map(|(k, v)| sample(k, &[("data", v.clone())])).collect();
    assert_same(&py("read-lmdb", &resumed, None), &want, "resumed LMDB");
    // LMDB leaves stale bytes in the slack of its pages, so two runs agree record for record,
    // not byte for byte.
    assert_same(&py("read-lmdb", &clean, None), &want, "uninterrupted LMDB");
}

#[test]
fn a_destination_holding_something_else_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, dest) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("dest"));
    image_dir(&a, 30);
    let want_b = image_dir(&b, 4);
    ok(&stoker(&["pack", s(&a), s(&dest), "--group", "--samples-per-shard", "10", "--json"]));
    assert_eq!(names_of(&dest).iter().filter(|n| n.ends_with(".tar")).count(), 3);
    let e = err(&stoker(&["pack", s(&b), s(&dest), "--group", "--json"]));
    assert!(e.contains("--force") && e.contains("30 samples"), "{e}");
    let r = ok(&stoker(&["pack", s(&b), s(&dest), "--group", "--json", "--force"]));
    assert_eq!(r["samples"], 4);
    assert_eq!(
        names_of(&dest).iter().filter(|n| n.ends_with(".tar")).collect::<Vec<_>>(),
        ["shard-000000.tar"],
        "the old pack's other shards are gone"
    );
    assert_same(&py("read-tar", &dest, None), &want_b, "replaced pack");

    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), b"mine").unwrap();
    let e = err(&stoker(&["pack", s(&b), s(&foreign), "--group"]));
    assert!(e.contains("notes.txt") && e.contains("--force"), "{e}");
    assert_eq!(names_of(&foreign), ["notes.txt"]);
}

#[test]
fn pack_and_index_from_and_to_s3() {
    use stoker_testkit::s3::{serve, S3ServerConfig};
    let root = tempfile::tempdir().unwrap();
    let want = image_dir(&root.path().join("raw"), 25);
    std::fs::create_dir_all(root.path().join("out")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(serve(S3ServerConfig::new(root.path()).with_credentials("ak", "sk"))).unwrap();
    let q = format!("endpoint={}&access_key_id=ak&secret_access_key=sk", server.endpoint());
    let r = ok(&stoker(&[
        "pack",
        &format!("s3://raw?{q}"),
        &format!("s3://out/shards?{q}"),
        "--group",
        "--samples-per-shard",
        "10",
        "--json",
    ]));
    assert_eq!((r["samples"].as_u64(), r["shards"].as_u64()), (Some(25), Some(3)));
    let shards = root.path().join("out/shards");
    assert_same(&py("read-tar", &shards, None), &want, "webdataset on the uploaded shards");
    assert!(
        shards.join(".stoker-manifest.json").is_file() && shards.join("shard-000002.tar.stoker-idx.json").is_file()
    );
    rt.block_on(conformance(&format!("s3://out/shards?{q}"), &want));
    let idx = ok(&stoker(&["index", &format!("s3://out/shards?{q}"), "--json", "--quiet"]));
    assert_eq!((idx["objects"].as_u64(), idx["samples"].as_u64()), (Some(3), Some(25)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_reports_progress_shard_by_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dest) = (dir.path().join("images"), dir.path().join("shards"));
    image_dir(&src, 30);
    ok(&stoker(&["pack", s(&src), s(&dest), "--group", "--samples-per-shard", "4", "--json"]));
    let seen = std::sync::Mutex::new(Vec::new());
    let r = stoker::index_with_progress(s(&dest), SourceOptions::default(), &|done, total| {
        seen.lock().unwrap().push((done, total))
    })
    .await
    .unwrap();
    assert_eq!((r.objects, r.samples), (8, 30));
    assert_eq!(seen.into_inner().unwrap(), (1..=8).map(|d| (d, 8)).collect::<Vec<_>>());
}

/// The Python with the writers of Parquet, MDS and LitData (integration/setup.sh makes it).
fn writers_python() -> PathBuf {
    std::env::var_os("STOKER_WRITERS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-peers/bin/python"))
}

/// Formats read as they are convert to tar shards: a Hugging Face Parquet export and MDS
/// shards, packed, read back sample for sample; `inspect` and `ls` name the layouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_mds_and_litdata_work_with_every_command_and_pack_to_tar_shards() {
    let dir = tempfile::tempdir().unwrap();
    let script = |name: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py").join(name);
    for (name, kind) in [("write_parquet.py", "hf"), ("write_records.py", "mds"), ("write_records.py", "litdata-rows")]
    {
        let src = dir.path().join(kind);
        let run = Command::new(writers_python()).arg(script(name)).arg(kind).arg(&src).output().expect("run writer");
        assert!(
            run.status.success(),
            "{name} {kind}: {} (run integration/setup.sh)",
            String::from_utf8_lossy(&run.stderr)
        );
        let inspect = ok(&stoker(&["inspect", s(&src), "--json"]));
        let layout = match kind {
            "hf" => "parquet",
            "mds" => "mds",
            _ => "litdata",
        };
        assert_eq!(inspect["layout"], layout, "{inspect}");
        let ls = stoker(&["ls", s(&src), "--limit", "3"]);
        assert!(ls.status.success() && String::from_utf8_lossy(&ls.stdout).lines().count() == 3);
        // Every command works on the format: index writes a manifest the next open uses,
        // bench reads every sample, diagnose names a bottleneck.
        ok(&stoker(&["index", s(&src), "--json"]));
        assert!(src.join(".stoker-manifest.json").is_file(), "{kind}: no manifest");
        let again = ok(&stoker(&["inspect", s(&src), "--json"]));
        assert_eq!((&again["layout"], &again["samples"]), (&inspect["layout"], &inspect["samples"]), "{kind}");
        let bench = stoker(&["bench", s(&src), "--batch", "8"]);
        let text = String::from_utf8_lossy(&bench.stdout);
        assert!(bench.status.success() && text.contains(s(&src)), "{kind}: {text}");
        let diagnose = stoker(&["diagnose", s(&src), "--batch", "8", "--samples", "64"]);
        let text = String::from_utf8_lossy(&diagnose.stdout);
        assert!(diagnose.status.success() && text.contains("bottleneck"), "{kind}: {text}");

        let dest = dir.path().join(format!("{kind}-tar"));
        ok(&stoker(&["pack", s(&src), s(&dest), "--json"]));
        let (a, b) = (
            stoker::open(s(&src), SourceOptions::default()).await.unwrap(),
            stoker::open(s(&dest), SourceOptions::default()).await.unwrap(),
        );
        assert_eq!(b.info().layout, "tar");
        assert_eq!(a.len(), b.len());
        let mut by_key: BTreeMap<String, Sample> = BTreeMap::new();
        for i in 0..b.len() {
            let got = b.get(i).await.unwrap();
            by_key.insert(got.key.clone(), got);
        }
        for i in 0..a.len() {
            let want = a.get(i).await.unwrap();
            let got = by_key.get(&want.key).unwrap_or_else(|| panic!("{kind}: {} was not packed", want.key));
            let mut fields: Vec<&Field> = want.fields.iter().collect();
            fields.sort_by(|x, y| x.name.cmp(&y.name));
            let mut packed: Vec<&Field> = got.fields.iter().collect();
            packed.sort_by(|x, y| x.name.cmp(&y.name));
            // Tar member names lower-case the extension; these field names are lower case already.
            assert_eq!(fields, packed, "{kind}: {}", want.key);
        }
    }
}
