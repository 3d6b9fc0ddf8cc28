//! The result: a table for people, JSON lines for machines, from the same figures.

use std::io::Write;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::worker::{LoaderParams, Measured};
use crate::{human_bytes, write_result};

/// The machine the numbers come from.
pub(crate) struct Machine {
    pub cores: usize,
    pub cpu: Option<String>,
    pub memory_bytes: Option<u64>,
    pub kernel: Option<String>,
}

impl Machine {
    pub(crate) fn here() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        });
        let memory_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        });
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string());
        Machine { cores: std::thread::available_parallelism().map_or(1, |n| n.get()), cpu, memory_bytes, kernel }
    }

    fn build() -> &'static str {
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    }

    fn json(&self) -> Value {
        json!({
            "cores": self.cores, "cpu": self.cpu, "memory_bytes": self.memory_bytes,
            "os": std::env::consts::OS, "arch": std::env::consts::ARCH, "kernel": self.kernel,
            "build": Self::build(), "stoker_version": env!("CARGO_PKG_VERSION"),
        })
    }

    fn line(&self) -> String {
        let mut s = format!("{} cores", self.cores);
        if let Some(cpu) = &self.cpu {
            s += &format!(" ({cpu})");
        }
        if let Some(m) = self.memory_bytes {
            s += &format!(", {} RAM", human_bytes(m));
        }
        s += &format!(", {}", std::env::consts::OS);
        if let Some(k) = &self.kernel {
            s += &format!(" {k}");
        }
        s += &format!("; {} build", Self::build());
        if cfg!(debug_assertions) {
            s += " (numbers are not representative: use a release build)";
        }
        s
    }
}

/// The embedded demo's dataset and servers.
pub(crate) struct Demo {
    pub samples: u64,
    pub sample_bytes: u64,
    pub dir: PathBuf,
    pub kept: bool,
    pub reused: bool,
    pub write_s: f64,
    pub upload_s: f64,
    pub servers: String,
    pub latency_ms: Option<u64>,
    /// The link rate the proxy carries every body at (`--link`), in MiB/s.
    pub link_mib_s: Option<u64>,
}

/// Everything about the run that is not a row.
pub(crate) struct Run {
    pub machine: Machine,
    pub params: LoaderParams,
    pub demo: Option<Demo>,
}

/// One backend's figures.
pub(crate) struct Row {
    pub backend: String,
    pub m: Measured,
    /// Requests that went through the latency proxy (demo S3 rows with `--latency`).
    pub proxy_requests: Option<u64>,
}

impl Row {
    fn samples_per_s(&self) -> f64 {
        self.m.samples as f64 / self.m.seconds.max(1e-9)
    }
    fn mib_per_s(&self) -> f64 {
        self.m.bytes as f64 / self.m.seconds.max(1e-9) / (1 << 20) as f64
    }
    /// Samples/s of each epoch (empty where the child timed none, as the raw read).
    fn epoch_samples_per_s(&self) -> Vec<f64> {
        let per_epoch = self.m.samples as f64 / self.m.epoch_seconds.len().max(1) as f64;
        self.m.epoch_seconds.iter().map(|s| per_epoch / s.max(1e-9)).collect()
    }
    fn wait_fraction(&self) -> Option<f64> {
        self.m.consumer_wait_s.map(|w| (w / self.m.seconds.max(1e-9)).min(1.0))
    }
}

fn order(p: &LoaderParams) -> String {
    p.shuffle.describe()
}

fn run_json(run: &Run) -> Value {
    let p = &run.params;
    let demo = run.demo.as_ref().map(|d| {
        json!({
            "samples": d.samples, "sample_bytes": d.sample_bytes, "total_bytes": d.samples * d.sample_bytes,
            "dir": d.dir, "kept": d.kept, "reused": d.reused, "write_s": d.write_s, "upload_s": d.upload_s,
            "servers": d.servers, "latency_ms": d.latency_ms, "link_mib_s": d.link_mib_s,
        })
    });
    json!({
        "type": "run",
        "machine": run.machine.json(),
        "params": {
            "batch": p.batch, "prefetch": p.prefetch, "epochs": p.epochs, "order": order(p),
            "step_ms": p.step.as_secs_f64() * 1e3, "config": p.config, "decode": p.decode,
        },
        "demo": demo,
    })
}

/// The samples/s a row is compared with: the raw read of the local bytes, and for remote
/// rows the bound (the same shards read whole through the store, no cache).
#[derive(Clone, Copy)]
struct Refs<'a> {
    raw: Option<&'a Row>,
    bound: Option<&'a Row>,
}

impl<'a> Refs<'a> {
    fn of(rows: &'a [Row]) -> Self {
        let row = |layout: &str| rows.iter().find(|r| r.m.layout == layout && r.samples_per_s() > 0.0);
        Refs { raw: row("raw"), bound: row("bound") }
    }

    /// The raw read's samples/s.
    fn raw_sps(self) -> Option<f64> {
        self.raw.map(Row::samples_per_s)
    }

    /// The bound row, for a remote row (one whose source is a URL).
    fn bound_of(self, r: &Row) -> Option<&'a Row> {
        self.bound.filter(|_| r.m.source.contains("://"))
    }

    /// `r`'s share of the bound, for a remote row.
    fn to_bound(self, r: &Row) -> Option<f64> {
        self.bound_of(r).map(|b| r.samples_per_s() / b.samples_per_s())
    }

    /// `r`'s share of the bound epoch by epoch (epoch k against the bound's epoch k), for a
    /// remote row; empty where either side has no epoch times.
    fn to_bound_per_epoch(self, r: &Row) -> Vec<f64> {
        let Some(b) = self.bound_of(r) else { return Vec::new() };
        r.epoch_samples_per_s().iter().zip(b.epoch_samples_per_s()).map(|(s, b)| s / b.max(1e-9)).collect()
    }
}

fn row_json(r: &Row, refs: Refs) -> Value {
    let raw_sps = refs.raw_sps();
    json!({
        "type": "row",
        "backend": r.backend,
        "source": r.m.source,
        "layout": r.m.layout,
        "samples": r.m.samples,
        "bytes": r.m.bytes,
        "seconds": r.m.seconds,
        "open_s": r.m.open_s,
        "samples_per_s": r.samples_per_s(),
        "mib_per_s": r.mib_per_s(),
        "ratio_to_raw": raw_sps.map(|raw| r.samples_per_s() / raw),
        "ratio_to_bound": refs.to_bound(r),
        "epoch_samples_per_s": r.epoch_samples_per_s(),
        "epoch_ratio_to_bound": refs.to_bound_per_epoch(r),
        "fetch_p50_ms": r.m.fetch_p50_ms,
        "fetch_p99_ms": r.m.fetch_p99_ms,
        "consumer_wait_fraction": r.wait_fraction(),
        "peak_rss_mib": r.m.peak_rss_mib,
        "peak_anon_mib": r.m.peak_anon_mib,
        "rss_file_mib": r.m.rss_file_mib,
        "store_requests": r.m.store_requests,
        "retries": r.m.retries,
        "hedges": r.m.hedges,
        "proxy_requests": r.proxy_requests,
    })
}

fn header(run: &Run) -> Vec<String> {
    let p = &run.params;
    let mut lines = Vec::new();
    if let Some(d) = &run.demo {
        let place = match (d.kept, d.reused) {
            (false, _) => "a temporary directory, removed at the end",
            (true, true) => "kept; reused from an earlier run",
            (true, false) => "kept for later runs",
        };
        lines.push(format!(
            "stoker bench: {} samples x {} = {} in every layout, in {} ({place})",
            d.samples,
            human_bytes(d.sample_bytes),
            human_bytes(d.samples * d.sample_bytes),
            d.dir.display()
        ));
        if !d.reused {
            lines.push(format!("  written in {:.1} s, uploaded in {:.1} s", d.write_s, d.upload_s));
        }
        lines.push(format!("  S3: {}", d.servers));
    } else {
        lines.push("stoker bench".to_string());
    }
    lines.push(format!("  machine: {}", run.machine.line()));
    let step = if p.step.is_zero() {
        "a consumer that does no work".to_string()
    } else {
        format!("a {} ms step per batch", p.step.as_secs_f64() * 1e3)
    };
    lines.push(format!(
        "  loader: batch {}, prefetch {}, {} epoch{}, {} order, {step}; each backend in its own process",
        p.batch,
        p.prefetch,
        p.epochs,
        if p.epochs == 1 { "" } else { "s" },
        order(p)
    ));
    lines
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn table(run: &Run, rows: &[Row], refs: Refs) -> Vec<String> {
    let raw_sps = refs.raw_sps();
    let mut out = header(run);
    out.push(String::new());
    let width = rows.iter().map(|r| r.backend.chars().count()).max().unwrap_or(7).clamp(7, 60);
    out.push(format!(
        "{:<width$} {:>11} {:>9} {:>7} {:>7} {:>10} {:>10} {:>7} {:>10}",
        "backend", "samples/s", "MiB/s", "x raw", "x bound", "fetch p50", "fetch p99", "wait %", "peak RSS"
    ));
    for r in rows {
        out.push(format!(
            "{:<width$} {:>11.0} {:>9.1} {:>7} {:>7} {:>10} {:>10} {:>7} {:>10}",
            r.backend,
            r.samples_per_s(),
            r.mib_per_s(),
            opt(raw_sps, |raw| format!("{:.2}", r.samples_per_s() / raw)),
            opt(refs.to_bound(r), |b| format!("{b:.2}")),
            opt(r.m.fetch_p50_ms, |v| format!("{v:.1} ms")),
            opt(r.m.fetch_p99_ms, |v| format!("{v:.1} ms")),
            opt(r.wait_fraction(), |v| format!("{:.1}", v * 100.0)),
            opt(r.m.peak_rss_mib, |v| format!("{v:.0} MiB")),
        ));
    }
    if run.params.epochs > 1 {
        out.push(String::new());
        out.push("per epoch, samples/s (x bound):".into());
        for r in rows.iter().filter(|r| !r.m.epoch_seconds.is_empty()) {
            let ratios = refs.to_bound_per_epoch(r);
            let epochs: Vec<String> = r
                .epoch_samples_per_s()
                .iter()
                .enumerate()
                .map(|(i, v)| match ratios.get(i) {
                    Some(x) if r.m.layout != "bound" => format!("{v:.0} ({x:.2})"),
                    _ => format!("{v:.0}"),
                })
                .collect();
            out.push(format!("  {:<width$} {}", r.backend, epochs.join(" / ")));
        }
    }
    out.push(String::new());
    if raw_sps.is_some() {
        out.push(
            "x raw: samples/s over the raw row's: a plain read of the tar files' bytes in the same run (one thread \
             per core, whole files, 4 MiB at a time)."
                .into(),
        );
    } else if run.demo.is_some() {
        out.push("x raw: no raw row in this run (add raw to --backends).".into());
    } else {
        out.push("x raw: no raw reference for given sources (the embedded default, without sources, has one).".into());
    }
    if refs.bound.is_some() {
        out.push(
            "x bound: a remote row's samples/s over the s3-bound row's: the same tar shards read whole through the \
             store's fetch layer (parallel ranged reads, no cache, no index, no batches), through the same proxy."
                .into(),
        );
    } else if run.demo.is_some() {
        out.push("x bound: no s3-bound row in this run (add s3-bound to --backends).".into());
    }
    out.push("fetch p50/p99: time to read one batch from the source.".into());
    out.push(if run.params.step.is_zero() {
        "wait %: share of the time the reading loop waited for a batch; it does no work, so high means \
         input-bound (try --step 20ms to model a training step)."
            .into()
    } else {
        "wait %: share of the time the consumer (one --step per batch) waited for a batch: its starvation.".into()
    });
    let mapped: Vec<String> = rows
        .iter()
        .filter(|r| r.m.rss_file_mib.is_some_and(|f| f >= 64.0))
        .map(|r| format!("{} {:.0} MiB", r.backend, r.m.rss_file_mib.unwrap_or(0.0)))
        .collect();
    let mut rss = "peak RSS: VmHWM of the process that read the backend".to_string();
    if !mapped.is_empty() {
        rss += &format!(
            "; it includes memory-mapped file pages (page cache, not held by the loader): {}",
            mapped.join(", ")
        );
    }
    out.push(rss + ".");
    if let Some(d) = &run.demo {
        if d.latency_ms.is_some() || d.link_mib_s.is_some() {
            let through: Vec<String> =
                rows.iter().filter_map(|r| r.proxy_requests.map(|n| format!("{} {n}", r.backend))).collect();
            let mut adds = Vec::new();
            if let Some(ms) = d.latency_ms {
                adds.push(format!("{ms} ms added to every S3 request"));
            }
            if let Some(n) = d.link_mib_s {
                adds.push(format!("every S3 body over one {n} MiB/s link"));
            }
            out.push(format!("proxy: {}; requests through it: {}.", adds.join(", "), through.join(", ")));
        }
    }
    out
}

/// Print the result on stdout.
pub(crate) fn print(run: &Run, rows: &[Row], as_json: bool) -> crate::error::Result<()> {
    let refs = Refs::of(rows);
    let lines: Vec<String> = if as_json {
        std::iter::once(run_json(run).to_string()).chain(rows.iter().map(|r| row_json(r, refs).to_string())).collect()
    } else {
        table(run, rows, refs)
    };
    let mut out = std::io::stdout().lock();
    for l in lines {
        if let Err(e) = writeln!(out, "{l}") {
            return write_result(Err(e));
        }
    }
    write_result(out.flush())
}
