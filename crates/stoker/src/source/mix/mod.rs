//! A weighted mix of sources: one [`SampleSource`] over several, each with its own URI and
//! options, read through one Loader in proportions fixed by their weights.
//!
//! The mix's index space concatenates its sources (source 0's samples first); what makes it
//! a mix is its [`MixPlan`], which the Loader's sampler follows instead of a plain order:
//! per epoch each source contributes its weight's share of the epoch, its draws spread over
//! the epoch by a keyed permutation (see [`crate::sampler::MixPlan`]). Every sample carries
//! a [`SOURCE_FIELD`] field naming its source, so losses can be split per dataset.
//!
//! # Mix files
//!
//! `stoker::open` (and so every CLI command and `stoker.open` in Python) opens a mix from a
//! file named `*.mix.json` or `*.mix.toml`, from `mix:PATH`, or inline as `mix:{JSON}`:
//!
//! ```toml
//! epoch_length = 100000        # optional; default: set by the source that runs out first
//! replacement = false          # optional; true lets a source repeat within an epoch
//! fill_missing = { cls = "-1" }  # optional; or `true` to fill any missing field with b""
//!
//! [[sources]]
//! name = "web"                 # optional; default: the URI without its query
//! uri = "s3://bucket/train-{000..127}.tar"
//! weight = 0.7
//! options = { endpoint = "http://127.0.0.1:9000", concurrency = 64 }
//!
//! [[sources]]
//! uri = "lmdb"                 # relative paths are relative to the mix file
//! weight = 0.3
//! options = { field = "jpg" }
//! ```
//!
//! Options given to `open` apply to every source; a source's own `options` override them.
//!
//! # Fields
//!
//! A mix keeps one set of fields (its *schema*: the fields of each source's first sample,
//! in order of appearance), so every batch lines up. A source whose first sample lacks a
//! schema field fails the open with an error naming the source and the field, unless
//! `fill_missing` fills it (`true`: empty bytes; a table: the text given per field, others
//! still fail). A sample met later that lacks a field, or holds one outside the schema, is
//! the same error when it is read.

mod schema;
mod spec;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;

use super::{check_index, Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::{Sample, SampleMeta};
use crate::sampler::{EpochLength, MixPlan};
use crate::stats::{Histogram, SourceStats};
use crate::store::IoCounters;
use crate::uri::{Layout, SourceOptions};

use self::spec::default_name;
pub use self::spec::{is_mix_uri, FillMissing, MixEntry, MixSpec, WeightBy};

/// The field every sample of a mix carries: its source's name (UTF-8).
pub const SOURCE_FIELD: &str = "__source__";

/// Open the mix a [`is_mix_uri`] URI names, with `options` under every source's own.
///
/// A boxed future of a named type: opening a mix opens its sources through
/// [`crate::open`], whose future would otherwise contain itself (and its `Send` proof with it).
pub(crate) fn open_uri(uri: &str, options: SourceOptions) -> BoxFuture<'static, Result<Arc<DynSampleSource>>> {
    let uri = uri.to_string();
    Box::pin(async move {
        let spec = MixSpec::from_uri(&uri)?;
        Ok(Arc::new(MixSource::open(spec, options).await?) as Arc<DynSampleSource>)
    })
}

/// Per-source read counters.
#[derive(Default)]
struct ReadCounters {
    reads: AtomicU64,
    samples: AtomicU64,
    bytes: AtomicU64,
    /// How long each read of this source took (its part of a batch).
    wait: Histogram,
}

struct Part {
    name: String,
    label: Bytes,
    weight: f64,
    source: Arc<DynSampleSource>,
    counters: ReadCounters,
}

/// Several sources read as one, in the proportions of a [`MixPlan`] (module docs).
pub struct MixSource {
    parts: Vec<Part>,
    plan: Arc<MixPlan>,
    /// The fields every sample is given, in order (then [`SOURCE_FIELD`]).
    schema: Vec<Arc<str>>,
    /// Per schema field, what fills it when a sample lacks it (`None`: an error).
    fills: Vec<Option<Bytes>>,
    source_field: Arc<str>,
    weight_by: WeightBy,
}

impl MixSource {
    /// Open every source of `spec` (concurrently), with `options` under each one's own, and
    /// check that their fields agree (or are filled).
    pub async fn open(spec: MixSpec, options: SourceOptions) -> Result<Self> {
        if spec.sources.is_empty() {
            return Err(Error::invalid_option("a mix needs at least one source"));
        }
        let mut names: Vec<String> = Vec::new();
        for e in &spec.sources {
            if is_mix_uri(&e.uri) {
                return Err(Error::invalid_option(format!(
                    "mix source `{}` is itself a mix; list its sources in one mix instead",
                    e.name.clone().unwrap_or_else(|| default_name(&e.uri))
                )));
            }
            let name = e.name.clone().unwrap_or_else(|| default_name(&e.uri));
            if name.is_empty() || names.contains(&name) {
                return Err(Error::invalid_option(format!(
                    "two mix sources are both named `{name}`; give each a distinct `name`"
                )));
            }
            names.push(name);
        }
        let opens: Vec<BoxFuture<'static, Result<Arc<DynSampleSource>>>> = spec
            .sources
            .iter()
            .map(|e| {
                let (uri, opts) = (e.uri.clone(), options.clone().merged(e.options.clone()));
                // Boxed: opening a source may open a mix, so the future's type would contain itself.
                Box::pin(async move { super::open(&uri, opts).await }) as BoxFuture<'static, _>
            })
            .collect();
        let sources = futures::future::try_join_all(opens).await?;
        let sizes: Vec<u64> = sources.iter().map(|s| s.len() as u64).collect();
        let weights: Vec<f64> = spec.sources.iter().map(|e| e.weight).collect();
        let length = spec.epoch_length.map_or(EpochLength::Auto, EpochLength::Fixed);
        let plan = MixPlan::new(&sizes, &weights, length, spec.replacement).map_err(|e| {
            // The plan speaks of source numbers; users know them by name.
            let mut msg = e.to_string();
            for (s, name) in names.iter().enumerate().rev() {
                msg = msg.replace(&format!("source {s} "), &format!("source `{name}` "));
            }
            Error::invalid_option(msg)
        })?;
        let parts: Vec<Part> = names
            .into_iter()
            .zip(sources)
            .zip(&spec.sources)
            .map(|((name, source), e)| Part {
                label: Bytes::from(name.clone().into_bytes()),
                name,
                weight: e.weight,
                source,
                counters: ReadCounters::default(),
            })
            .collect();
        let mut mix = MixSource {
            parts,
            plan: Arc::new(plan),
            schema: Vec::new(),
            fills: Vec::new(),
            source_field: SOURCE_FIELD.into(),
            weight_by: spec.weight_by,
        };
        mix.settle_schema(spec.fill_missing.as_ref()).await?;
        Ok(mix)
    }
    /// The plan the Loader's sampler follows.
    pub fn plan(&self) -> &Arc<MixPlan> {
        &self.plan
    }

    /// The sources' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().map(|p| p.name.as_str())
    }

    /// What the weights share out.
    pub fn weight_by(&self) -> WeightBy {
        self.weight_by
    }

    /// The sources' weights, in order.
    pub fn weights(&self) -> Vec<f64> {
        self.parts.iter().map(|p| p.weight).collect()
    }

    /// The sources, in order.
    pub fn sources(&self) -> impl Iterator<Item = &Arc<DynSampleSource>> {
        self.parts.iter().map(|p| &p.source)
    }

    /// The smallest share of the samples a remote source has (its weight over all), or
    /// `None` when every source is local: how much deeper a loader must prefetch for that
    /// source to keep as many requests in flight as it would alone.
    pub fn min_remote_share(&self) -> Option<f64> {
        let total: f64 = self.parts.iter().map(|p| p.weight).sum();
        self.parts
            .iter()
            .filter(|p| !p.source.capability().local && total > 0.0)
            .map(|p| p.weight / total)
            .min_by(f64::total_cmp)
    }

    /// The fields every sample has, in order, [`SOURCE_FIELD`] last.
    pub fn schema(&self) -> impl Iterator<Item = &str> {
        self.schema.iter().map(|f| &**f).chain(std::iter::once(SOURCE_FIELD))
    }

    /// Per source: read counters, store counters, and what a loader delivered of it
    /// (`delivered[s] = (samples, bytes)`) over `elapsed_s` seconds.
    pub fn source_stats(&self, delivered: &[(u64, u64)], elapsed_s: f64) -> Vec<SourceStats> {
        let total_w: f64 = self.parts.iter().map(|p| p.weight).sum();
        let counts: Vec<u64> = self.plan.counts().collect();
        self.parts
            .iter()
            .enumerate()
            .map(|(s, p)| {
                let (samples, bytes) = delivered.get(s).copied().unwrap_or((0, 0));
                let io = p.source.io_counters().unwrap_or_default();
                let c = &p.counters;
                SourceStats {
                    name: p.name.clone(),
                    weight: p.weight / total_w,
                    per_epoch: counts[s],
                    samples,
                    bytes,
                    samples_per_s: samples as f64 / elapsed_s.max(1e-9),
                    bytes_per_s: bytes as f64 / elapsed_s.max(1e-9),
                    reads: c.reads.load(Relaxed),
                    read_samples: c.samples.load(Relaxed),
                    read_bytes: c.bytes.load(Relaxed),
                    read_wait_s: c.wait.mean().as_secs_f64() * c.wait.count() as f64,
                    read_p50_ms: c.wait.quantile(0.5).as_secs_f64() * 1e3,
                    read_p95_ms: c.wait.quantile(0.95).as_secs_f64() * 1e3,
                    store_requests: io.requests,
                    store_bytes: io.bytes,
                    retries: io.retries,
                }
            })
            .collect()
    }

    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let (s, local) = self.plan.locate(index as u64).ok_or(Error::IndexOutOfRange { index, len: self.len() })?;
        Ok((s, local as usize))
    }
    /// Read `locals` of source `s`, conformed, counting the read.
    async fn read_part(&self, s: usize, locals: &[usize]) -> Result<Vec<Sample>> {
        let p = &self.parts[s];
        let t = Instant::now();
        let got = p.source.get_many(locals).await;
        p.counters.wait.record(t.elapsed());
        p.counters.reads.fetch_add(1, Relaxed);
        let got = got?;
        p.counters.samples.fetch_add(got.len() as u64, Relaxed);
        p.counters.bytes.fetch_add(got.iter().map(Sample::total_bytes).sum(), Relaxed);
        got.into_iter().map(|x| self.conform_sample(s, x)).collect()
    }
}

impl fmt::Debug for MixSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MixSource")
            .field("sources", &self.parts.iter().map(|p| (&p.name, p.weight, &p.source)).collect::<Vec<_>>())
            .field("plan", &self.plan)
            .field("schema", &self.schema)
            .finish()
    }
}

impl fmt::Display for MixSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: f64 = self.parts.iter().map(|p| p.weight).sum();
        write!(f, "mix(")?;
        for (i, p) in self.parts.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{} {:.3}: {}", p.name, p.weight / total, p.source)?;
        }
        write!(f, ")")
    }
}

#[async_trait]
impl SampleSource for MixSource {
    fn len(&self) -> usize {
        self.plan.total() as usize
    }

    fn capability(&self) -> Capability {
        let caps: Vec<Capability> = self.parts.iter().map(|p| p.source.capability()).collect();
        Capability {
            random_access: caps.iter().all(|c| c.random_access),
            coalesced_reads: caps.iter().any(|c| c.coalesced_reads),
            // Shard ids are per source; the mix orders by its plan, not by shards.
            locality: false,
            cheap_meta: caps.iter().all(|c| c.cheap_meta),
            local: caps.iter().all(|c| c.local),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Mix, self.parts.iter().map(|p| p.source.info().shards).sum())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        let (s, local) = self.locate(index)?;
        Ok(self.read_part(s, &[local]).await?.remove(0))
    }

    /// Each source's samples of the batch are read with its own `get_many` (so ranged
    /// sources coalesce), all sources at once.
    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut groups: Vec<(Vec<usize>, Vec<usize>)> = vec![(Vec::new(), Vec::new()); self.parts.len()];
        for (pos, &i) in indices.iter().enumerate() {
            let (s, local) = self.locate(i)?;
            groups[s].0.push(pos);
            groups[s].1.push(local);
        }
        let reads = groups.iter().enumerate().filter(|(_, g)| !g.1.is_empty()).map(|(s, g)| async move {
            let got = self.read_part(s, &g.1).await?;
            Ok::<_, Error>((s, got))
        });
        let done = futures::future::try_join_all(reads).await?;
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        for (s, samples) in done {
            for (&pos, sample) in groups[s].0.iter().zip(samples) {
                out[pos] = Some(sample);
            }
        }
        out.into_iter()
            .zip(indices)
            .map(|(s, &index)| {
                s.ok_or_else(|| Error::internal(format!("mix: source read returned too few samples for index {index}")))
            })
            .collect()
    }

    fn location(&self, index: usize) -> Option<String> {
        let (s, local) = self.locate(index).ok()?;
        let p = &self.parts[s];
        Some(match p.source.location(local) {
            Some(l) => format!("mix source `{}`: {l}", p.name),
            None => format!("mix source `{}` ({}) sample {local}", p.name, p.source),
        })
    }

    async fn meta(&self, index: usize) -> Result<SampleMeta> {
        let (s, local) = self.locate(index)?;
        let meta = self.parts[s].source.meta(local).await?;
        let label = self.parts[s].label.len() as u64;
        let fields = self.conform(s, &meta.key, &meta.fields, |b| b.len() as u64, label)?;
        Ok(SampleMeta { key: meta.key, fields })
    }

    async fn flush(&self) {
        for p in &self.parts {
            p.source.flush().await;
        }
    }

    fn io_counters(&self) -> Option<IoCounters> {
        let all: Vec<IoCounters> = self.parts.iter().filter_map(|p| p.source.io_counters()).collect();
        (!all.is_empty()).then(|| {
            all.iter().fold(IoCounters::default(), |a, c| IoCounters {
                requests: a.requests + c.requests,
                bytes: a.bytes + c.bytes,
                remote_requests: a.remote_requests + c.remote_requests,
                remote_bytes: a.remote_bytes + c.remote_bytes,
                retries: a.retries + c.retries,
                hedges: a.hedges + c.hedges,
                hedge_wins: a.hedge_wins + c.hedge_wins,
                cache_hits: a.cache_hits + c.cache_hits,
                cache_misses: a.cache_misses + c.cache_misses,
                disk_hits: a.disk_hits + c.disk_hits,
                disk_direct: a.disk_direct + c.disk_direct,
                cache_corrupt: a.cache_corrupt + c.cache_corrupt,
                disk_writes: a.disk_writes + c.disk_writes,
                lease_waits: a.lease_waits + c.lease_waits,
                disk_behind: a.disk_behind + c.disk_behind,
                // Each remote part has its own fetcher and limit.
                in_flight_limit: a.in_flight_limit + c.in_flight_limit,
                peak_in_flight: a.peak_in_flight + c.peak_in_flight,
                in_flight_waits: a.in_flight_waits + c.in_flight_waits,
            })
        })
    }

    fn damage(&self) -> Vec<crate::stats::Damage> {
        self.parts.iter().flat_map(|p| p.source.damage()).collect()
    }

    fn as_mix(&self) -> Option<&MixSource> {
        Some(self)
    }
}
