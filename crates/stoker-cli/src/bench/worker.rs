//! One measurement per process: the parent runs each backend (and the raw read) in a child
//! process of this same binary (`stoker bench --worker ...`, hidden), so the child's peak
//! RSS is that backend's alone, and no backend inherits another's caches, connections or heap.
//!
//! The child speaks a line protocol on stdout: `progress N` (samples read so far) while it
//! works, then one `result {json}`. Errors go to stderr and a non-zero exit, as for any command.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::error::{CliError, Context, Result};

/// What a child measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Measured {
    /// The source as opened (credentials redacted), or the directory read raw.
    pub source: String,
    /// Its layout (`raw` for the raw read).
    pub layout: String,
    /// Samples delivered over all epochs.
    pub samples: u64,
    /// Payload bytes delivered (raw: file bytes read).
    pub bytes: u64,
    /// Seconds from the first epoch's start to the last batch (opening excluded).
    pub seconds: f64,
    /// Seconds to open the source (listing, indexes).
    pub open_s: f64,
    /// Per-batch fetch latency quantiles (none for the raw read).
    pub fetch_p50_ms: Option<f64>,
    pub fetch_p99_ms: Option<f64>,
    /// Seconds the consuming loop waited for a batch.
    pub consumer_wait_s: Option<f64>,
    /// Requests the store served, retried and hedged (remote stores).
    pub store_requests: u64,
    pub retries: u64,
    pub hedges: u64,
    /// Peak resident set of the child (VmHWM), MiB; includes mapped file pages.
    pub peak_rss_mib: Option<f64>,
    /// Peak of anonymous memory (heap, buffers), sampled after every batch, MiB.
    pub peak_anon_mib: Option<f64>,
    /// Resident file-backed pages at the end (LMDB's memory map), MiB.
    pub rss_file_mib: Option<f64>,
    /// Seconds each epoch took, in order (they add up to `seconds`): a cold first epoch and
    /// warm later ones differ by up to 10x, and the total alone hides which is which.
    #[serde(default)]
    pub epoch_seconds: Vec<f64>,
}

/// How the consuming loop reads in a loader child.
#[derive(Clone, Debug)]
pub(crate) struct LoaderParams {
    pub batch: usize,
    pub prefetch: usize,
    pub epochs: u64,
    pub shuffle: crate::shuffle::ShuffleArgs,
    /// Simulated work per batch (a training step), during which the loader reads ahead.
    pub step: Duration,
    pub config: Option<PathBuf>,
    /// `--decode` items, `FIELD=KIND[:OPTION...]`.
    pub decode: Vec<String>,
    /// `--decode-memory`, bytes.
    pub decode_memory: Option<u64>,
}

impl LoaderParams {
    fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--batch".to_string(),
            self.batch.to_string(),
            "--prefetch".into(),
            self.prefetch.to_string(),
            "--epochs".into(),
            self.epochs.to_string(),
            "--step".into(),
            format!("{}us", self.step.as_micros()),
        ];
        a.extend(self.shuffle.to_args());
        if let Some(c) = &self.config {
            a.push("--config".into());
            a.push(c.display().to_string());
        }
        for d in &self.decode {
            a.push("--decode".into());
            a.push(d.clone());
        }
        if let Some(m) = self.decode_memory {
            a.push("--decode-memory".into());
            a.push(m.to_string());
        }
        a
    }
}

/// What a child process measures.
pub(crate) enum Job {
    /// Read `uri` through the Loader.
    Loader(String),
    /// Read every file under the directory sequentially, `samples` samples' worth.
    Raw { dir: PathBuf, samples: u64 },
    /// Read every `.tar` object under the remote `uri` whole, `samples` samples' worth: the
    /// bound a remote row is held to.
    Bound { uri: String, samples: u64 },
}

/// Run `job` in a child process, showing its progress on `bar`.
pub(crate) async fn run_child(
    job: &Job,
    params: &LoaderParams,
    bar: &ProgressBar,
    extra_env_remove: &[&str],
) -> Result<Measured> {
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("bench");
    match job {
        Job::Loader(uri) => cmd.args(["--worker", "loader", uri]),
        Job::Raw { dir, samples } => {
            cmd.args(["--worker", "raw", &dir.display().to_string(), "--samples", &samples.to_string()])
        }
        Job::Bound { uri, samples } => cmd.args(["--worker", "bound", uri, "--samples", &samples.to_string()]),
    };
    cmd.args(params.to_args());
    for k in extra_env_remove {
        cmd.env_remove(k);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn().context("cannot start a measuring process")?;
    let stdout = child.stdout.take().expect("stdout was piped above");
    let mut stderr = child.stderr.take().expect("stderr was piped above");
    // Drained concurrently: a child blocked on a full stderr pipe would never finish.
    let errors = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let mut lines = BufReader::new(stdout).lines();
    let mut result = None;
    let mut reading_since = None;
    while let Some(line) = lines.next_line().await.context("reading a measuring process")? {
        if let Some(n) = line.strip_prefix("total ") {
            if let Ok(n) = n.trim().parse::<u64>() {
                bar.set_length(n);
                bar.set_message("");
                reading_since = Some(Instant::now());
            }
        } else if let Some(n) = line.strip_prefix("progress ") {
            if let Ok(n) = n.trim().parse::<u64>() {
                bar.set_position(n);
                if let Some(t) = reading_since {
                    bar.set_message(format!("{:.0} samples/s", n as f64 / t.elapsed().as_secs_f64().max(1e-3)));
                }
            }
        } else if let Some(json) = line.strip_prefix("result ") {
            result = Some(serde_json::from_str::<Measured>(json).with_context(|| format!("bad result line {json}"))?);
        }
    }
    let status = child.wait().await.context("waiting for a measuring process")?;
    let stderr = errors.await.unwrap_or_default();
    match result {
        Some(r) if status.success() => Ok(r),
        _ => {
            let msg = stderr.trim().trim_start_matches("error: ").trim();
            Err(CliError::Message(if msg.is_empty() {
                format!("the measuring process failed ({status})")
            } else {
                msg.to_string()
            }))
        }
    }
}

fn emit(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|_| out.flush()).context("writing to the parent")
}

/// How often a child reports progress (and the loader child samples its memory).
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// Child side of [`Job::Loader`].
pub(crate) async fn loader_child(uri: &str, p: &LoaderParams) -> Result<()> {
    use stoker::loader::{Loader, LoaderConfig};
    let mut cfg = LoaderConfig::new(p.batch);
    cfg.prefetch = p.prefetch;
    cfg.order = p.shuffle.order(0)?;
    let options = crate::options(p.config.as_deref())?.for_order(&cfg.order);
    let opened = Instant::now();
    let src = stoker::open(uri, options).await?;
    let open_s = opened.elapsed().as_secs_f64();
    if !p.decode.is_empty() {
        cfg.decode = Some(stoker::decode::DecodeSpec::from_args(&p.decode)?);
    }
    cfg.decode_memory_bytes = p.decode_memory;
    let loader = Loader::new(src.clone(), cfg)?;
    // Per epoch the loader delivers its sampler's positions (a mix's epoch length, not the
    // size of its sources added up).
    let per_epoch = loader.sampler(0)?.rank_len();
    emit(&format!("total {}", per_epoch * p.epochs.max(1)))?;
    let mut samples = 0u64;
    let mut peak_anon = status_mib("RssAnon:");
    // Progress and the anonymous-memory peak are sampled, not taken per batch: reading
    // /proc inside the timed loop would cost the loader what the raw reference does not pay.
    let mut polled = Instant::now();
    let started = Instant::now();
    let mut epoch_seconds = Vec::new();
    for epoch in 0..p.epochs.max(1) {
        let epoch_started = Instant::now();
        let mut stream = loader.epoch(epoch)?;
        while let Some(b) = stream.next_batch().await {
            let b = b?;
            samples += b.len() as u64;
            drop(b);
            if polled.elapsed() >= PROGRESS_EVERY {
                polled = Instant::now();
                peak_anon = max_opt(peak_anon, status_mib("RssAnon:"));
                emit(&format!("progress {samples}"))?;
            }
            if !p.step.is_zero() {
                tokio::time::sleep(p.step).await;
            }
        }
        epoch_seconds.push(epoch_started.elapsed().as_secs_f64());
    }
    let seconds = started.elapsed().as_secs_f64();
    peak_anon = max_opt(peak_anon, status_mib("RssAnon:"));
    emit(&format!("progress {samples}"))?;
    // The loader counts delivered bytes and the consumer's wait in next_batch itself.
    let st = loader.stats();
    let m = Measured {
        source: src.to_string(),
        layout: src.info().layout.into_owned(),
        samples,
        bytes: st.bytes,
        seconds,
        open_s,
        fetch_p50_ms: Some(st.fetch_p50_ms),
        fetch_p99_ms: Some(st.fetch_p99_ms),
        consumer_wait_s: Some(st.consumer_wait_s),
        store_requests: st.store_requests,
        retries: st.retries,
        hedges: st.hedges,
        peak_rss_mib: status_mib("VmHWM:"),
        peak_anon_mib: peak_anon,
        rss_file_mib: status_mib("RssFile:"),
        epoch_seconds,
    };
    emit(&format!("result {}", serde_json::to_string(&m).context("writing the result")?))
}

/// Child side of [`Job::Raw`]: the fastest plain read of the bytes, the reference every
/// backend is compared with. One thread per core, each reading whole files in turn with one
/// reused 4 MiB buffer, so the reference uses the same cores a loader may.
pub(crate) fn raw_child(dir: &Path, samples: u64, epochs: u64) -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let files = data_files(dir)?;
    let total: u64 = files.iter().map(|(_, len)| len).sum::<u64>() * epochs.max(1);
    emit(&format!("total {}", samples * epochs.max(1)))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(files.len());
    let read = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (files, read) = (&files, &read);
                scope.spawn(move || -> Result<()> {
                    let mut buf = vec![0u8; 4 << 20];
                    for _ in 0..epochs.max(1) {
                        for (path, _) in files.iter().skip(t).step_by(threads) {
                            let mut f =
                                std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
                            loop {
                                let n = f.read(&mut buf).with_context(|| format!("cannot read {}", path.display()))?;
                                if n == 0 {
                                    break;
                                }
                                read.fetch_add(n as u64, Relaxed);
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        // Progress in samples: the share of bytes read, since samples are not visible here.
        let mut last = 0;
        while !workers.iter().all(|w| w.is_finished()) {
            let done = samples_read(read.load(Relaxed), total, samples * epochs.max(1));
            if done > last {
                emit(&format!("progress {done}"))?;
                last = done;
            }
            std::thread::sleep(PROGRESS_EVERY); // a progress period, not synchronisation
        }
        workers.into_iter().try_for_each(|w| w.join().map_err(|_| CliError::from("a raw read thread panicked"))?)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let m = Measured {
        source: dir.display().to_string(),
        layout: "raw".into(),
        samples: samples * epochs.max(1),
        bytes: read.load(Relaxed),
        seconds,
        open_s: 0.0,
        fetch_p50_ms: None,
        fetch_p99_ms: None,
        consumer_wait_s: None,
        store_requests: 0,
        retries: 0,
        hedges: 0,
        peak_rss_mib: status_mib("VmHWM:"),
        peak_anon_mib: status_mib("RssAnon:"),
        rss_file_mib: status_mib("RssFile:"),
        // The threads read the epochs each at their own pace: no common epoch boundary.
        epoch_seconds: Vec::new(),
    };
    emit(&format!("result {}", serde_json::to_string(&m).context("writing the result")?))
}

/// Child side of [`Job::Bound`]: what the link and the store layer allow, the reference a
/// remote row is compared with. The same shards a tar row reads, each read whole through the
/// store (its fetch layer: ranged parts in parallel, the concurrency limit, retries) with no
/// cache, no sampler, no index and no batches, several shards at once, into memory and
/// dropped.
pub(crate) async fn bound_child(uri: &str, samples: u64, epochs: u64) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let parsed = stoker::uri::parse(uri)?;
    let stoker::uri::Location::Remote(loc) = &parsed.location else {
        return Err("the bound row reads a remote source".into());
    };
    let mut opts = parsed.options.clone();
    opts.cache_bytes = Some(0);
    opts.disk_cache = Some(false);
    let opened = Instant::now();
    let store = stoker::store::Store::remote(loc, &opts, &parsed.display)?;
    let shards: Vec<_> = store.list().await?.into_iter().filter(|o| o.path.ends_with(".tar")).collect();
    if shards.is_empty() {
        return Err(CliError::Message(format!("no .tar objects under {}", parsed.display)));
    }
    let open_s = opened.elapsed().as_secs_f64();
    let total: u64 = shards.iter().map(|o| o.size).sum::<u64>() * epochs.max(1);
    emit(&format!("total {}", samples * epochs.max(1)))?;
    // Shards at once: enough that the fetch layer's limit on requests in flight, not this
    // loop, decides how much is asked of the server.
    let at_once = (2 * std::thread::available_parallelism().map_or(2, |n| n.get())).max(4);
    let read = AtomicU64::new(0);
    let started = Instant::now();
    let mut last = 0;
    let mut epoch_seconds = Vec::new();
    for _ in 0..epochs.max(1) {
        let epoch_started = Instant::now();
        let reads = futures::stream::iter(&shards).map(|o| {
            let (store, read) = (&store, &read);
            async move {
                let got = store.read_span(&store.object(o), 0..o.size).await?;
                read.fetch_add(got.len() as u64, Relaxed);
                Ok::<_, stoker::Error>(())
            }
        });
        let mut reads = reads.buffer_unordered(at_once);
        while reads.try_next().await?.is_some() {
            let done = samples_read(read.load(Relaxed), total, samples * epochs.max(1));
            if done > last {
                emit(&format!("progress {done}"))?;
                last = done;
            }
        }
        epoch_seconds.push(epoch_started.elapsed().as_secs_f64());
    }
    let io = store.counters();
    let m = Measured {
        source: parsed.display.clone(),
        layout: "bound".into(),
        samples: samples * epochs.max(1),
        bytes: read.load(Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        open_s,
        fetch_p50_ms: None,
        fetch_p99_ms: None,
        consumer_wait_s: None,
        store_requests: io.remote_requests,
        retries: io.retries,
        hedges: io.hedges,
        peak_rss_mib: status_mib("VmHWM:"),
        peak_anon_mib: status_mib("RssAnon:"),
        rss_file_mib: status_mib("RssFile:"),
        epoch_seconds,
    };
    emit(&format!("result {}", serde_json::to_string(&m).context("writing the result")?))
}

/// Progress in samples of a read that sees only bytes: the share `read` of `total` bytes,
/// of `samples`.
fn samples_read(read: u64, total: u64, samples: u64) -> u64 {
    (u128::from(read) * u128::from(samples) / u128::from(total.max(1))) as u64
}

/// The files holding a dataset's bytes, sorted, without Stoker's indexes and hidden files.
fn data_files(dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))?;
        for e in entries {
            let e = e.with_context(|| format!("cannot list {}", d.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata().with_context(|| format!("cannot stat {}", e.path().display()))?;
            if name.starts_with('.') || name.ends_with(".stoker-idx.json") || name == "lock.mdb" {
                continue;
            }
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), meta.len()));
            }
        }
    }
    if out.is_empty() {
        return Err(CliError::Message(format!("no data files under {}", dir.display())));
    }
    out.sort();
    Ok(out)
}

/// A memory figure of this process from /proc/self/status, in MiB (Linux only).
fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
