//! The embedded default: a demo dataset in every layout, and an S3 server on loopback
//! holding its objects and shards.
//!
//! ```text
//! DIR/stoker-bench.json   what is here and whether it is complete (reuse with --dir)
//! DIR/files/              one file per sample: 000000000.bin, ...
//! DIR/tar/                WebDataset shards of the same files (`stoker::pack`)
//! DIR/lmdb/               an LMDB of the same files (`stoker::pack`)
//! DIR/s3/bench/           the S3 server's root: objects/ and tar/, uploaded through its API
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use stoker::pack::{PackOptions, PackProgress};
use stoker::{Layout, SourceOptions};
use stoker_testkit::fixtures::payload_into as payload;
use stoker_testkit::proxy::{self, ProxyConfig, ProxyHandle};
use stoker_testkit::s3::{self, S3ServerConfig};
use stoker_testkit::ServerHandle;
use tokio::task::JoinSet;

use super::ui::{Ui, Unit};
use crate::error::{CliError, Context, Result};

/// The demo server's bucket and keys (loopback only, never real credentials).
const BUCKET: &str = "bench";
const ACCESS_KEY: &str = "stoker-bench";
const SECRET_KEY: &str = "stoker-bench-loopback-only";
const MARKER: &str = "stoker-bench.json";
/// Subdirectories this module owns under the dataset directory (and may delete to rebuild).
const PARTS: [&str; 4] = ["files", "tar", "lmdb", "s3"];
/// Tar shard size: several shards even for a small demo, so reads spread over objects.
const SHARD_BYTES: u64 = 64 << 20;

/// The demo dataset's shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    pub samples: u64,
    pub size: u64,
}

impl Spec {
    pub(crate) fn total_bytes(&self) -> u64 {
        self.samples * self.size
    }
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Marker {
    format: String,
    version: u32,
    samples: u64,
    sample_bytes: u64,
    complete: bool,
}

impl Marker {
    fn new(spec: &Spec, complete: bool) -> Self {
        Marker {
            format: "stoker-bench-demo".into(),
            version: 1,
            samples: spec.samples,
            sample_bytes: spec.size,
            complete,
        }
    }
}

/// A demo dataset on disk (removed on drop unless it lives in a directory the user gave).
pub(crate) struct Dataset {
    pub spec: Spec,
    pub root: PathBuf,
    /// The user gave `--dir`: the dataset stays.
    pub kept: bool,
    /// An earlier run's complete dataset was found and used as is.
    pub reused: bool,
    /// Seconds spent writing the layouts and uploading (0 when reused).
    pub write_s: f64,
    pub upload_s: f64,
    _temp: Option<tempfile::TempDir>,
}

impl Dataset {
    pub(crate) fn files(&self) -> PathBuf {
        self.root.join("files")
    }
    pub(crate) fn tar(&self) -> PathBuf {
        self.root.join("tar")
    }
    pub(crate) fn lmdb(&self) -> PathBuf {
        self.root.join("lmdb")
    }
    fn s3_root(&self) -> PathBuf {
        self.root.join("s3")
    }
    fn write_marker(&self, complete: bool) -> Result<()> {
        let path = self.root.join(MARKER);
        let json =
            serde_json::to_vec_pretty(&Marker::new(&self.spec, complete)).context("writing the dataset marker")?;
        std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Make the dataset (or find a complete one in `dir`) in the local layouts.
pub(crate) async fn prepare(spec: Spec, dir: Option<&Path>, ui: &Ui) -> Result<Dataset> {
    let (root, temp) = match dir {
        Some(d) => (d.to_path_buf(), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("stoker-bench-")
                .tempdir()
                .context("cannot make a temporary directory (set TMPDIR, or give --dir)")?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let mut data = Dataset { spec, root, kept: dir.is_some(), reused: false, write_s: 0.0, upload_s: 0.0, _temp: temp };
    if data.kept {
        std::fs::create_dir_all(&data.root).with_context(|| format!("cannot create {}", data.root.display()))?;
        // A marker is a line of JSON; anything larger is not one (and is not read whole).
        let marker = stoker::store::read_capped(&data.root.join(MARKER), 64 << 10)
            .ok()
            .and_then(|b| serde_json::from_slice::<Marker>(&b).ok());
        match marker {
            Some(m) if m == Marker::new(&spec, true) => {
                data.reused = true;
                return Ok(data);
            }
            // Ours (the marker says so), but incomplete or of another shape: rebuild our parts.
            Some(_) => {
                for part in PARTS {
                    let p = data.root.join(part);
                    if p.exists() {
                        std::fs::remove_dir_all(&p).with_context(|| format!("cannot remove {}", p.display()))?;
                    }
                }
            }
            None => {
                let mut entries =
                    std::fs::read_dir(&data.root).with_context(|| format!("cannot list {}", data.root.display()))?;
                if entries.next().is_some() {
                    return Err(CliError::Message(format!(
                        "{} is not empty and holds no stoker bench dataset ({MARKER}); give a new or empty directory \
                         to --dir, so nothing of yours is overwritten",
                        data.root.display()
                    )));
                }
            }
        }
    }
    data.write_marker(false)?;
    let started = Instant::now();
    let total = spec.total_bytes();
    let bars = [
        ui.bar("write files", total, Unit::Bytes),
        ui.bar("pack tar", total, Unit::Bytes),
        ui.bar("pack lmdb", total, Unit::Bytes),
    ];
    let [files_bar, tar_bar, lmdb_bar] = bars;
    let files = data.files();
    let written = files.clone();
    tokio::task::spawn_blocking(move || write_files(&written, spec, &|n| files_bar.inc(n)))
        .await
        .context("writing the demo dataset stopped")??;
    // The other layouts are made the way users make theirs: `stoker pack` from the files.
    let src = stoker::open(&files.display().to_string(), SourceOptions::default()).await?;
    for (dest, layout, bar) in [(data.tar(), Layout::Tar, tar_bar), (data.lmdb(), Layout::Lmdb, lmdb_bar)] {
        let mut opts = PackOptions::new(layout);
        opts.shard_size = SHARD_BYTES;
        stoker::pack::pack(src.clone(), &dest.display().to_string(), &opts, &BarProgress(bar.clone()))
            .await
            .with_context(|| format!("packing the demo dataset into {}", dest.display()))?;
        bar.finish();
    }
    data.write_s = started.elapsed().as_secs_f64();
    Ok(data)
}

/// Pack progress on a byte bar.
struct BarProgress(indicatif::ProgressBar);

impl PackProgress for BarProgress {
    fn advance(&self, _samples: u64, bytes: u64) {
        self.0.inc(bytes);
    }
}

fn write_files(dir: &Path, spec: Spec, progress: &dyn Fn(u64)) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let len =
        usize::try_from(spec.size).map_err(|_| CliError::Message(format!("--size {} is too large", spec.size)))?;
    let mut buf = Vec::with_capacity(len);
    for i in 0..spec.samples {
        payload(i, len, &mut buf);
        let path = dir.join(format!("{i:09}.bin"));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&buf))
            .with_context(|| format!("cannot write {}", path.display()))?;
        progress(spec.size);
    }
    Ok(())
}

/// `value` percent-encoded for a URI query (a directory may hold spaces, `&` or `#`).
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The running demo servers: S3 on loopback, and the proxy in front when asked.
pub(crate) struct Servers {
    s3: ServerHandle,
    proxy: Option<ProxyHandle>,
    /// The disk cache of the S3 rows: their own and empty at the start, as on a machine that
    /// never read the data (the user's cache would hold an earlier run's blocks of the same
    /// objects), and removed at the end.
    cache: tempfile::TempDir,
}

impl Servers {
    /// A source URI for `prefix` in the demo bucket, through the proxy when there is one.
    pub(crate) fn uri(&self, prefix: &str) -> String {
        let endpoint = self.proxy.as_ref().map_or_else(|| self.s3.endpoint(), |p| p.endpoint());
        format!(
            "s3://{BUCKET}/{prefix}?endpoint={endpoint}&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}\
             &disk_cache_dir={}",
            query_value(&self.cache.path().to_string_lossy())
        )
    }

    /// Where the S3 server listens, and what the proxy adds, for the report.
    pub(crate) fn describe(&self) -> String {
        let server = match &self.proxy {
            None => format!("embedded S3 server (s3s-fs) on {}", self.s3.addr()),
            Some(p) => {
                let c = p.control.config();
                let link = match c.link_mib_s {
                    0 => String::new(),
                    n => format!(", every body over one link of {n} MiB/s"),
                };
                format!(
                    "embedded S3 server (s3s-fs) on {}, through a proxy on {} adding {} ms per request{link}",
                    self.s3.addr(),
                    p.addr(),
                    c.latency_ms
                )
            }
        };
        format!("{server}; the disk cache starts empty")
    }

    /// Zero the proxy's request counter (before a backend runs).
    pub(crate) fn reset_proxy_count(&self) {
        if let Some(p) = &self.proxy {
            p.control.reset_stats();
        }
    }

    /// Requests the proxy forwarded since the last reset; `None` without a proxy.
    pub(crate) fn proxy_requests(&self) -> Option<u64> {
        self.proxy.as_ref().map(|p| p.control.stats().requests)
    }

    pub(crate) async fn shutdown(self) {
        if let Some(p) = self.proxy {
            p.shutdown().await;
        }
        self.s3.shutdown().await;
    }
}

/// Start the S3 server over the dataset's `s3/` directory, upload the objects and shards
/// through its API unless an earlier run did, and put the proxy in front if asked for latency
/// or a link rate.
pub(crate) async fn serve(
    data: &mut Dataset,
    latency_ms: Option<u64>,
    link_mib_s: Option<u64>,
    ui: &Ui,
) -> Result<Servers> {
    let root = data.s3_root();
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let cfg = S3ServerConfig::new(&root).with_credentials(ACCESS_KEY, SECRET_KEY).with_bucket(BUCKET);
    let s3 = s3::serve(cfg).await.context("cannot start the embedded S3 server")?;
    let cache = tempfile::Builder::new()
        .prefix(".disk-cache-")
        .tempdir_in(&data.root)
        .with_context(|| format!("cannot make a disk cache directory in {}", data.root.display()))?;
    let mut servers = Servers { s3, proxy: None, cache };
    if !data.reused {
        let started = Instant::now();
        upload(data, &servers, ui).await?;
        data.upload_s = started.elapsed().as_secs_f64();
        data.write_marker(true)?;
    }
    if latency_ms.is_some() || link_mib_s.is_some() {
        let mut cfg = ProxyConfig::new(servers.s3.addr());
        cfg.faults.latency_ms = latency_ms.unwrap_or(0);
        cfg.faults.link_mib_s = link_mib_s.unwrap_or(0);
        let p = proxy::serve(cfg).await.context("cannot start the proxy")?;
        servers.proxy = Some(p);
    }
    Ok(servers)
}

/// Upload `files/` as `objects/` and `tar/` as `tar/` (shards only: indexes are the
/// benchmark's to build), through the S3 API: the server records each object's ETag then,
/// where files put in its directory by hand would be hashed whole on every GET.
async fn upload(data: &Dataset, servers: &Servers, ui: &Ui) -> Result<()> {
    let parsed = stoker::uri::parse(&format!(
        "s3://{BUCKET}?endpoint={}&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}",
        servers.s3.endpoint()
    ))?;
    let stoker::uri::Location::Remote(loc) = &parsed.location else {
        return Err("the demo S3 URI did not parse as remote".into());
    };
    let store = stoker::store::Store::remote(loc, &parsed.options, &parsed.display)?;
    let total = data.spec.total_bytes();
    let objects = ui.bar("upload objects", total, Unit::Bytes);
    put_all(&store, &data.files(), "objects", 16, &objects).await?;
    objects.finish();
    let shards = ui.bar("upload tar", total, Unit::Bytes);
    // Shards are read whole into memory to upload: few at once.
    put_all(&store, &data.tar(), "tar", 2, &shards).await?;
    shards.finish();
    Ok(())
}

async fn put_all(
    store: &stoker::store::Store,
    dir: &Path,
    prefix: &str,
    concurrency: usize,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    let mut names = Vec::new();
    let mut total = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let e = e.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !name.ends_with(".stoker-idx.json") && !name.ends_with(".partial") {
            total += e.metadata().with_context(|| format!("cannot stat {}", e.path().display()))?.len();
            names.push(name);
        }
    }
    names.sort();
    bar.set_length(total);
    let dir = Arc::new(dir.to_path_buf());
    let mut tasks = JoinSet::new();
    let mut names = names.into_iter();
    loop {
        while tasks.len() < concurrency {
            let Some(name) = names.next() else { break };
            let (store, dir, bar, prefix) = (store.clone(), dir.clone(), bar.clone(), prefix.to_string());
            tasks.spawn(async move {
                let path = dir.join(&name);
                let bytes = tokio::fs::read(&path).await.with_context(|| format!("cannot read {}", path.display()))?;
                let n = bytes.len() as u64;
                store
                    .put(&format!("{prefix}/{name}"), Bytes::from(bytes))
                    .await
                    .context("uploading to the embedded S3 server")?;
                bar.inc(n);
                Ok::<(), CliError>(())
            });
        }
        match tasks.join_next().await {
            None => return Ok(()),
            Some(r) => r.context("an upload task stopped")??,
        }
    }
}
