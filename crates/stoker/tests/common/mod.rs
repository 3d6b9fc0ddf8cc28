//! Fixture builders shared by the integration tests.
#![allow(dead_code)]

pub mod s3;
pub mod writers;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use stoker::{Field, Sample};

/// Deterministic payload bytes.
pub fn payload(seed: usize, len: usize) -> Vec<u8> {
    stoker_testkit::fixtures::payload(seed as u64, len)
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

/// `shards` tar shards of `per` samples under `dir` (made if missing), each sample one `bin`
/// field of `len` bytes; returns the samples in order and the shards' total bytes.
pub fn bin_shards(dir: &Path, shards: usize, per: usize, len: usize) -> (Vec<Sample>, u64) {
    std::fs::create_dir_all(dir).unwrap();
    let (mut all, mut bytes) = (Vec::new(), 0);
    for s in 0..shards {
        let samples: Vec<_> =
            (0..per).map(|i| sample(&format!("s{s:03}-{i}"), &[("bin", payload(s * per + i, len))])).collect();
        let path = dir.join(format!("shard-{s:03}.tar"));
        write_tar(&path, &samples);
        bytes += std::fs::metadata(&path).unwrap().len();
        all.extend(samples);
    }
    (all, bytes)
}

/// Write samples to an LMDB environment with heed (keys in byte order are the sample order).
pub fn write_lmdb(dir: &Path, samples: &[(Vec<u8>, Vec<u8>)]) {
    let records: Vec<(&[u8], &[u8])> = samples.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    stoker_testkit::lmdb::write_lmdb(dir, &records);
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

/// The Python with the writers of Parquet, MDS and LitData (pyarrow, datasets,
/// mosaicml-streaming, litdata): `$STOKER_WRITERS_PYTHON`, else the project's `.venv-peers`
/// (integration/setup.sh makes it).
pub fn writers_python() -> PathBuf {
    if let Some(p) = std::env::var_os("STOKER_WRITERS_PYTHON") {
        return p.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-peers/bin/python")
}

/// Run `integration/py/make_fixtures.py KIND OUT` and parse the samples it reports.
pub fn python_fixture(kind: &str, out: &Path) -> Vec<Sample> {
    script_fixture(&python(), "make_fixtures.py", &[kind], out)
}

/// Run `PY integration/py/SCRIPT ARGS... OUT` and parse the samples it prints (JSON:
/// `[{"key": ..., "fields": [[name, hex], ...]}, ...]`, in the order a reader returns them).
///
/// The writers are deterministic and slow to start (MosaicML Streaming and LitData import
/// torch: 4-10 s a run), and many tests ask for the same fixture: each (Python, script,
/// arguments) is written once per test process, into a directory of its own, and copied to
/// `out` for every test that asks (tests damage their copies).
pub fn script_fixture(py: &Path, script: &str, args: &[&str], out: &Path) -> Vec<Sample> {
    /// Where a fixture is written (numbered in order of first request), and once written, what
    /// its script printed.
    type Slot = Arc<(PathBuf, Mutex<Option<Vec<Sample>>>)>;
    /// (Python, script, arguments).
    type Key = (PathBuf, String, Vec<String>);
    static WRITTEN: OnceLock<Mutex<HashMap<Key, Slot>>> = OnceLock::new();
    let key = (py.to_path_buf(), script.to_owned(), args.iter().map(|a| a.to_string()).collect());
    let slot = {
        let mut written = WRITTEN.get_or_init(Default::default).lock().unwrap();
        let n = written.len();
        written
            .entry(key)
            .or_insert_with(|| Arc::new((fixture_cache_root().join(n.to_string()), Mutex::new(None))))
            .clone()
    };
    // One writer per fixture; other fixtures are written meanwhile by other threads.
    let (dir, samples) = &*slot;
    let mut samples = samples.lock().unwrap_or_else(|p| p.into_inner());
    let samples = samples.get_or_insert_with(|| run_script_fixture(py, script, args, dir));
    copy_tree(dir, out);
    samples.clone()
}

/// This process's directory of written fixtures, under the target directory (removed with
/// those of earlier processes that have exited, so it does not grow run after run).
fn fixture_cache_root() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let parent = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fixture-cache");
        if let Ok(entries) = std::fs::read_dir(&parent) {
            for e in entries.flatten() {
                let pid = e.file_name().to_string_lossy().into_owned();
                if !Path::new("/proc").join(&pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let root = parent.join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        root
    })
    .clone()
}

/// Copy the file `from` to `to`, or the files under the directory `from` into `to` (created),
/// keeping relative paths.
pub fn copy_tree(from: &Path, to: &Path) {
    if !from.is_dir() {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::copy(from, to).unwrap_or_else(|err| panic!("copy {} to {}: {err}", from.display(), to.display()));
        return;
    }
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst)
                .unwrap_or_else(|err| panic!("copy {} to {}: {err}", src.display(), dst.display()));
        }
    }
}

fn run_script_fixture(py: &Path, script: &str, args: &[&str], out: &Path) -> Vec<Sample> {
    let kind = args.join(" ");
    let out = out.display().to_string();
    let res = writers::run_script(py, script, &[args, &[out.as_str()]].concat());
    assert!(
        res.success(),
        "{} {script} {kind} failed: {}\nrun integration/setup.sh to install the Python packages the tests need",
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

/// A server or tool the tests need: `$env_var` if set, else `fallback` (relative to the
/// workspace root, where integration/setup.sh installs it). Missing is a failure that says
/// how to install it, never a skip.
pub fn installed_tool(env_var: &str, fallback: &str, what: &str) -> PathBuf {
    let path = std::env::var_os(env_var)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(fallback));
    assert!(
        path.is_file(),
        "{what} not found at {}: run integration/setup.sh (it installs it), or set {env_var}",
        path.display()
    );
    std::fs::canonicalize(&path).unwrap()
}

/// A child process, killed on drop.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The status of `GET path` on a loopback port, or None while nothing answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut head = [0u8; 12]; // "HTTP/1.1 200"
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..]).ok()?.parse().ok()
}

/// Start a server process on a free loopback port (`command(port)` builds it; its output goes
/// to `log_dir/server.log`) and wait, at most 20 s, until `ready(port)`. A port found free can
/// be taken before the server binds it, so a server that exits at start is tried 3 times.
pub fn start_server(
    name: &str,
    log_dir: &Path,
    command: impl Fn(u16) -> Command,
    ready: impl Fn(u16) -> bool,
) -> (Killed, u16) {
    use std::time::{Duration, Instant};
    const READY_WITHIN: Duration = Duration::from_secs(20);
    let log_path = log_dir.join("server.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    for _ in 0..3 {
        let port = free_port();
        let out = std::fs::File::create(&log_path).unwrap();
        let child = command(port)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}; run integration/setup.sh"));
        let mut server = Killed(child);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = server.0.try_wait().unwrap() {
                eprintln!("{name} on port {port} exited ({status}):\n{}", log());
                break;
            }
            if ready(port) {
                return (server, port);
            }
            assert!(Instant::now() < deadline, "{name} not ready on port {port} within {READY_WITHIN:?}:\n{}", log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("{name} exited at start three times: see its log above");
}

/// Drain `epoch` of `loader`, checking every row of field `bin` against `samples` (by sample
/// index); returns the rows delivered.
pub async fn checked_epoch(loader: &stoker::loader::Loader, epoch: u64, samples: &[Sample]) -> usize {
    let mut stream = loader.epoch(epoch).unwrap();
    let mut seen = 0;
    while let Some(b) = stream.next_batch().await {
        let b = b.unwrap();
        let col = b.field("bin").unwrap();
        for (row, &i) in b.indices().iter().enumerate() {
            assert_eq!(col.get(row).unwrap(), &samples[i as usize].fields[0].data[..], "sample {i}");
        }
        seen += b.len();
    }
    seen
}

/// Every file under `dir`, in no order.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(files_under(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}
