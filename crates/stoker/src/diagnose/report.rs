//! What the ladder reports: each step's measurement, the pipeline's setup, the verdict.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::store::IoCounters;

/// A step of the ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Step {
    /// The consumer alone on one cached batch.
    Consumer,
    /// Plus the host-to-device copy (or its host stand-in).
    Copy,
    /// Plus batch assembly and the transform, from cached samples.
    Collate,
    /// Plus reading from storage, cache off.
    Fetch,
    /// The Loader as configured, everything overlapped.
    Pipeline,
}

impl Step {
    /// The step's name in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Consumer => "consumer",
            Step::Copy => "copy",
            Step::Collate => "collate",
            Step::Fetch => "fetch",
            Step::Pipeline => "pipeline",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a source's store did during one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IoDelta {
    /// Read requests (one per range asked for).
    pub requests: u64,
    /// Payload bytes read.
    pub bytes: u64,
    /// HTTP requests sent (remote stores; retries and hedges included).
    pub remote_requests: u64,
    /// Retried requests.
    pub retries: u64,
    /// Duplicates sent for slow requests.
    pub hedges: u64,
    /// Cache hits (0 when the cache is off).
    pub cache_hits: u64,
    /// Cache misses (0 when the cache is off: nothing was looked up).
    pub cache_misses: u64,
}

impl IoDelta {
    pub(super) fn between(before: Option<IoCounters>, after: Option<IoCounters>) -> Option<Self> {
        let (b, a) = (before?, after?);
        Some(IoDelta {
            requests: a.requests - b.requests,
            bytes: a.bytes - b.bytes,
            remote_requests: a.remote_requests - b.remote_requests,
            retries: a.retries - b.retries,
            hedges: a.hedges - b.hedges,
            cache_hits: a.cache_hits - b.cache_hits,
            cache_misses: a.cache_misses - b.cache_misses,
        })
    }
}

/// One step's measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepResult {
    /// Which step.
    pub step: Step,
    /// What it measured, in words.
    pub what: String,
    /// Samples delivered to the consumer.
    pub samples: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Payload bytes delivered (after the transform).
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Samples per second.
    pub samples_per_s: f64,
    /// MiB of payload per second.
    pub mib_per_s: f64,
    /// Milliseconds per batch.
    pub ms_per_batch: f64,
    /// Milliseconds per batch more than the step before (negative: faster).
    pub added_ms_per_batch: f64,
    /// Milliseconds per batch spent in this step's own part, timed directly: the consumer,
    /// the copy, transform and assembly, the read; for the pipeline, the same as `added`.
    /// Timing the part itself keeps noise in the other parts out of the verdict.
    pub own_ms_per_batch: f64,
    /// Time spent in the transform per batch, in ms (collate and fetch steps with a transform).
    pub transform_ms_per_batch: Option<f64>,
    /// Median time to read one batch from the source, in ms (fetch and pipeline).
    pub fetch_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub fetch_p99_ms: Option<f64>,
    /// Share of the time the consumer waited for data (pipeline).
    pub consumer_wait_fraction: Option<f64>,
    /// Samples per second after the first batch arrived: the rate without the time to fill
    /// the pipeline (pipeline).
    pub steady_samples_per_s: Option<f64>,
    /// What the store did (fetch and pipeline, when the source reads a store).
    pub io: Option<IoDelta>,
}

/// What helps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Knob {
    /// Input is not the bottleneck: the consumer is.
    Consumer,
    /// The copy to the device: pinned buffers with a device, overlapped by prefetch.
    Copy,
    /// A cheaper per-sample transform, or more transform threads.
    Transform,
    /// More batches in flight (`LoaderConfig::prefetch`).
    Prefetch,
    /// More requests in flight per batch (`?concurrency=`).
    Concurrency,
    /// Pack small files into tar shards (`stoker pack`).
    Pack,
    /// A cache big enough for the data (`?cache_bytes=`), or one that costs less.
    CacheSize,
    /// The storage's own bandwidth: nothing in the configuration is short.
    Storage,
}

impl Knob {
    /// The knob's name in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Knob::Consumer => "consumer",
            Knob::Copy => "copy",
            Knob::Transform => "transform",
            Knob::Prefetch => "prefetch",
            Knob::Concurrency => "concurrency",
            Knob::Pack => "pack",
            Knob::CacheSize => "cache_size",
            Knob::Storage => "storage",
        }
    }
}

/// Where the pipeline starves, and what to turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Verdict {
    /// The bottleneck step ([`Step::Consumer`] when the input side keeps up).
    pub step: Step,
    /// What helps.
    pub knob: Knob,
    /// The advice, with the numbers it rests on.
    pub advice: String,
    /// Secondary hints.
    pub also: Vec<String>,
}

/// The pipeline's shape, as the diagnosis saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Setup {
    /// The source, credentials redacted.
    pub source: String,
    /// Its layout's name ([`crate::source::SourceInfo::layout`]).
    pub layout: String,
    /// Whether bytes come over the network.
    pub remote: bool,
    /// Samples in the source.
    pub len: u64,
    /// Samples per batch.
    pub batch_size: usize,
    /// Batches the Loader fetches ahead.
    pub prefetch: usize,
    /// Requests one batch's read keeps in flight (`?concurrency=`).
    pub concurrency: usize,
    /// Remote requests in flight at once over everything (`?max_in_flight=`).
    pub max_in_flight: usize,
    /// Whether per-sample work is configured: a transform, decoding, or both.
    pub transform: bool,
    /// Whether fields are decoded in Rust (a `DecodeSpec`).
    pub decode: bool,
    /// Threads the transform may use.
    pub transform_threads: usize,
    /// CPU cores available.
    pub cores: usize,
    /// Whether a cache is configured (memory or disk); the fetch step turns it off.
    pub cache: bool,
    /// The CUDA device the copy step copies to; `None`: a host copy stands in for it.
    pub device: Option<usize>,
    /// How the copy step copies, in words.
    pub copy: String,
    /// Mean sample size in bytes (of the cached samples, before the transform).
    pub mean_sample_bytes: u64,
}

/// The ladder's measurements and the verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// The pipeline measured.
    pub setup: Setup,
    /// The five steps, in order.
    pub steps: Vec<StepResult>,
    /// Where it starves and what helps.
    pub verdict: Verdict,
}

impl Report {
    /// The measurement of `step`.
    pub fn step(&self, step: Step) -> Option<&StepResult> {
        self.steps.iter().find(|s| s.step == step)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.setup;
        writeln!(
            f,
            "source    {} ({} layout, {} samples{})",
            s.source,
            s.layout,
            s.len,
            if s.remote { ", remote" } else { "" }
        )?;
        writeln!(
            f,
            "pipeline  batch {}, prefetch {}, concurrency {}, transform {}, cache {}",
            s.batch_size,
            s.prefetch,
            s.concurrency,
            if s.transform {
                format!("on ({} threads of {} cores)", s.transform_threads, s.cores)
            } else {
                "none".into()
            },
            if s.cache { "configured (off in the fetch step)" } else { "off" },
        )?;
        writeln!(f, "copy      {}", s.copy)?;
        writeln!(f)?;
        writeln!(
            f,
            "  step                                          samples/s      MiB/s   ms/batch    added   own part"
        )?;
        for (i, r) in self.steps.iter().enumerate() {
            let mark = if r.step == self.verdict.step { "  <-" } else { "" };
            writeln!(
                f,
                "{}. {:<45} {:>10.1} {:>10.2} {:>10.2} {:>+8.2} {:>10.2}{mark}",
                i + 1,
                r.what,
                r.samples_per_s,
                r.mib_per_s,
                r.ms_per_batch,
                r.added_ms_per_batch,
                r.own_ms_per_batch
            )?;
        }
        let mut notes = Vec::new();
        for r in &self.steps {
            if let (Some(p50), Some(p99)) = (r.fetch_p50_ms, r.fetch_p99_ms) {
                notes.push(format!("{}: batch read p50 {p50:.1} ms, p99 {p99:.1} ms", r.step));
            }
            if let Some(t) = r.transform_ms_per_batch {
                notes.push(format!("{}: transform {t:.2} ms per batch", r.step));
            }
            if let Some(v) = r.steady_samples_per_s {
                notes.push(format!("{}: {v:.1} samples/s once the first batch arrived", r.step));
            }
            if let Some(w) = r.consumer_wait_fraction {
                notes.push(format!("{}: the consumer waited {:.0}% of the time", r.step, w * 100.0));
            }
            if let Some(io) = r.io {
                notes.push(format!(
                    "{}: {} read requests, cache {} hits / {} misses",
                    r.step, io.requests, io.cache_hits, io.cache_misses
                ));
            }
        }
        if !notes.is_empty() {
            writeln!(f)?;
            for n in notes {
                writeln!(f, "  {n}")?;
            }
        }
        writeln!(f)?;
        writeln!(f, "bottleneck: {} (knob: {})", self.verdict.step, self.verdict.knob.as_str())?;
        writeln!(f, "{}", self.verdict.advice)?;
        for a in &self.verdict.also {
            writeln!(f, "also: {a}")?;
        }
        Ok(())
    }
}
