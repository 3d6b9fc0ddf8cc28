//! Fixture builders shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use stoker::{Field, Sample};

/// Deterministic payload bytes.
pub fn payload(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| ((seed * 131 + j * 7) % 251) as u8).collect()
}

pub fn sample(key: &str, fields: &[(&str, Vec<u8>)]) -> Sample {
    Sample {
        key: key.to_string(),
        fields: fields.iter().map(|(n, d)| Field { name: (*n).into(), data: Bytes::from(d.clone()) }).collect(),
    }
}

/// A directory tree, one file per sample (plus a hidden file that must be ignored).
pub fn objects_dir(dir: &Path) -> Vec<Sample> {
    let files: Vec<(String, Vec<u8>)> = vec![
        ("a/0001.jpg".into(), payload(1, 300)),
        ("a/0002.JPG".into(), payload(2, 0)),
        ("b/c/x.tar.gz".into(), payload(3, 70_000)),
        ("noext".into(), payload(4, 5)),
        ("z.txt".into(), payload(5, 17)),
    ];
    for (p, d) in &files {
        let full = dir.join(p);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, d).unwrap();
    }
    std::fs::write(dir.join(".DS_Store"), b"junk").unwrap();
    vec![
        sample("a/0001", &[("jpg", files[0].1.clone())]),
        sample("a/0002", &[("jpg", files[1].1.clone())]),
        sample("b/c/x", &[("tar.gz", files[2].1.clone())]),
        sample("noext", &[("data", files[3].1.clone())]),
        sample("z", &[("txt", files[4].1.clone())]),
    ]
}

/// Samples as the tar fixtures hold them: multi-field, nested keys, one very long key.
pub fn tar_samples(shard: usize, count: usize) -> Vec<Sample> {
    (0..count)
        .map(|i| {
            let seed = shard * 1000 + i;
            let key = if i == 1 {
                format!("{}/s{shard}-{i:05}", "long".repeat(40))
            } else {
                format!("dir{}/s{shard}-{i:05}", i % 2)
            };
            sample(&key, &[("jpg", payload(seed, 200 + i * 911)), ("cls", seed.to_string().into_bytes())])
        })
        .collect()
}

/// Write samples as one tar with the `tar` crate (GNU headers, GNU long names).
pub fn write_tar(path: &Path, samples: &[Sample]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for s in samples {
        for f in &s.fields {
            let mut h = tar::Header::new_gnu();
            h.set_size(f.data.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(1_700_000_000);
            b.append_data(&mut h, format!("{}.{}", s.key, f.name), &f.data[..]).unwrap();
        }
    }
    b.into_inner().unwrap();
}

/// `n` shards of `per` samples under `dir`; returns all samples in order.
pub fn tar_dir(dir: &Path, n: usize, per: usize) -> Vec<Sample> {
    let mut all = Vec::new();
    for s in 0..n {
        let samples = tar_samples(s, per);
        write_tar(&dir.join(format!("shard-{s:04}.tar")), &samples);
        all.extend(samples);
    }
    all
}

/// Write samples to an LMDB environment with heed (keys in byte order are the sample order).
pub fn write_lmdb(dir: &Path, samples: &[(Vec<u8>, Vec<u8>)]) {
    use heed::types::Bytes as B;
    std::fs::create_dir_all(dir).unwrap();
    let env = unsafe { heed::EnvOpenOptions::new().map_size(256 << 20).open(dir).unwrap() };
    let w = env.write_txn().unwrap();
    let db: heed::Database<B, B> = env
        .create_databases_and_commit(w, |wdo, wtxn| {
            wdo.create_database::<B, B>(wtxn, None).map(heed::CommitOrAbort::<_, ()>::Commit)
        })
        .unwrap()
        .unwrap_commit();
    let mut w = env.write_txn().unwrap();
    for (k, v) in samples {
        db.put(&mut w, k, v).unwrap();
    }
    w.commit().unwrap();
}

/// The Python the tests use for fixtures written by Python tools: `$STOKER_PYTHON`, else the
/// project's `.venv`, else `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("STOKER_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if venv.exists() {
        return venv;
    }
    "python3".into()
}

/// Run `integration/py/make_fixtures.py KIND OUT` and parse the samples it reports.
pub fn python_fixture(kind: &str, out: &Path) -> Vec<Sample> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/py/make_fixtures.py");
    let py = python();
    let res = Command::new(&py).arg(&script).arg(kind).arg(out).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {}: {e}; run integration/setup.sh (it makes .venv with the Python packages tests need)",
            py.display()
        )
    });
    assert!(
        res.status.success(),
        "{} {kind} failed: {}\nrun integration/setup.sh to install the Python packages the tests need",
        py.display(),
        String::from_utf8_lossy(&res.stderr)
    );
    let v: Vec<serde_json::Value> = serde_json::from_slice(&res.stdout).unwrap();
    v.iter()
        .map(|s| Sample {
            key: s["key"].as_str().unwrap().to_string(),
            fields: s["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| Field { name: f[0].as_str().unwrap().into(), data: Bytes::from(hex(f[1].as_str().unwrap())) })
                .collect(),
        })
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

pub async fn open(uri: &str) -> std::sync::Arc<stoker::DynSampleSource> {
    stoker::open(uri, Default::default()).await.unwrap_or_else(|e| panic!("open {uri}: {e}"))
}
