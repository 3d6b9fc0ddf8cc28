//! Counters that stay on: throughput, the consumer's wait (GPU starvation), producer stalls,
//! fetch latency percentiles, bytes in flight.
//!
//! Everything is a relaxed atomic; a latency record is two atomic adds. A [`StatsSnapshot`]
//! turns them into rates and percentiles.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Requests and bytes a store has served, for benchmarks and for checking that ranged
/// layouts really coalesce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IoCounters {
    /// Read requests issued (each range of a multi-range read counts once).
    pub requests: u64,
    /// Payload bytes returned.
    pub bytes: u64,
    /// HTTP requests the fetch layer sent (remote stores; retries and hedges included).
    pub remote_requests: u64,
    /// Bytes the fetch layer received (remote stores; retries and hedges included): what
    /// caches save shows here, where `bytes` counts what readers asked for.
    pub remote_bytes: u64,
    /// Remote requests retried after a transient failure.
    pub retries: u64,
    /// Remote requests hedged (a duplicate sent because the first was slow).
    pub hedges: u64,
    /// Hedges that answered first.
    pub hedge_wins: u64,
    /// Block cache hits (memory).
    pub cache_hits: u64,
    /// Block cache misses (memory).
    pub cache_misses: u64,
    /// Misses served by the disk cache.
    pub disk_hits: u64,
    /// Of those, blocks read straight from their files: into batches (the hit path), or for
    /// the small pieces of them a read needs.
    pub disk_direct: u64,
    /// Disk cache blocks that failed verification: dropped and fetched again, never served.
    pub cache_corrupt: u64,
    /// Blocks written to the disk cache (the plan admits only those it will read again).
    pub disk_writes: u64,
    /// Misses read from the disk cache after waiting for another process on the node to
    /// fetch the block (its lease), instead of fetched again.
    pub lease_waits: u64,
    /// Blocks left out of the disk cache because its writes were behind the reads
    /// (`disk_cache_behind=skip`).
    pub disk_behind: u64,
    /// Remote requests allowed in flight now (sized from latency unless fixed).
    pub in_flight_limit: u64,
    /// Most remote requests in flight at once so far.
    pub peak_in_flight: u64,
    /// Remote requests that queued for a slot under the in-flight limit.
    pub in_flight_waits: u64,
}

/// Sub-buckets per power of two: 16 keeps a bucket within about 6% of its values, so p50
/// and p99 of a narrow distribution stay apart instead of sharing one coarse bucket.
const SUB: usize = 16;
const SUB_BITS: usize = SUB.trailing_zeros() as usize;
const BUCKETS: usize = 64 * SUB;

/// A lock-free log-scale histogram of durations (nanoseconds).
pub struct Histogram {
    counts: Box<[AtomicU64]>,
    total: AtomicU64,
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            total: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros() as usize;
    // The SUB_BITS bits after the leading one pick the sub-bucket.
    let sub = ((ns >> (log - SUB_BITS)) & (SUB as u64 - 1)) as usize;
    (log * SUB + sub).min(BUCKETS - 1)
}

fn bucket_floor(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let (log, sub) = (b / SUB, (b % SUB) as u64);
    // Rows below SUB_BITS are never used: values under SUB land in the exact buckets above.
    if log < SUB_BITS {
        return SUB as u64;
    }
    (1u64 << log) + (sub << (log - SUB_BITS))
}

impl Histogram {
    /// Record one duration.
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.counts[bucket_of(ns)].fetch_add(1, Relaxed);
        self.total.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Number of records.
    pub fn count(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// The duration below which fraction `q` (0..=1) of records fall (bucket resolution).
    pub fn quantile(&self, q: f64) -> Duration {
        let total = self.count();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c.load(Relaxed);
            if seen >= rank {
                // Report the bucket's midpoint: unbiased within the bucket's width.
                let lo = bucket_floor(b);
                let hi = if b + 1 < BUCKETS { bucket_floor(b + 1) } else { lo };
                return Duration::from_nanos(lo + (hi - lo) / 2);
            }
        }
        Duration::ZERO
    }

    /// Mean of all records.
    pub fn mean(&self) -> Duration {
        Duration::from_nanos(self.sum_ns.load(Relaxed).checked_div(self.count()).unwrap_or(0))
    }
}

/// Live counters of one loader.
pub struct Stats {
    started: Instant,
    /// Samples delivered to the consumer.
    pub(crate) samples: AtomicU64,
    /// Payload bytes delivered.
    pub(crate) bytes: AtomicU64,
    /// Batches delivered.
    pub(crate) batches: AtomicU64,
    /// Time the consumer spent blocked waiting for the next batch, in ns.
    pub(crate) consumer_wait_ns: AtomicU64,
    /// Time producers spent blocked on a full queue or the byte budget, in ns.
    pub(crate) producer_stall_ns: AtomicU64,
    /// Samples skipped under the skip error policy.
    pub(crate) skipped: AtomicU64,
    /// Batches that failed (raise policy) or had samples skipped.
    pub(crate) errors: AtomicU64,
    /// Bytes fetched and not yet released by the consumer.
    pub(crate) bytes_in_flight: AtomicU64,
    /// The most bytes ever in flight.
    pub(crate) peak_bytes_in_flight: AtomicU64,
    /// Latency of each fetch (`get_many` of one batch).
    pub(crate) fetch_latency: Histogram,
    /// Time spent in the per-sample transform, per batch.
    pub(crate) transform_time: Histogram,
    /// Skips by cause, in [`DamageCause`] order up to `Other` (which is the remainder).
    skipped_by: [AtomicU64; 4],
    /// For a mix: samples and payload bytes delivered from each source.
    sources: std::sync::OnceLock<Box<[(AtomicU64, AtomicU64)]>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            started: Instant::now(),
            samples: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            consumer_wait_ns: AtomicU64::new(0),
            producer_stall_ns: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bytes_in_flight: AtomicU64::new(0),
            peak_bytes_in_flight: AtomicU64::new(0),
            fetch_latency: Histogram::default(),
            transform_time: Histogram::default(),
            skipped_by: Default::default(),
            sources: std::sync::OnceLock::new(),
        }
    }
}

pub(crate) fn add_ns(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
}

impl Stats {
    /// Count deliveries per source of a mix of `n` sources (from then on).
    pub(crate) fn track_sources(&self, n: usize) {
        let _ = self.sources.set((0..n).map(|_| Default::default()).collect());
    }

    /// One sample of `bytes` payload delivered from source `s` of a mix.
    pub(crate) fn add_source_delivery(&self, s: usize, samples: u64, bytes: u64) {
        if let Some((n, b)) = self.sources.get().and_then(|v| v.get(s)) {
            n.fetch_add(samples, Relaxed);
            b.fetch_add(bytes, Relaxed);
        }
    }

    /// `(samples, bytes)` delivered per source of a mix (empty for one source).
    pub fn source_deliveries(&self) -> Vec<(u64, u64)> {
        self.sources.get().map_or(Vec::new(), |v| v.iter().map(|(n, b)| (n.load(Relaxed), b.load(Relaxed))).collect())
    }

    /// Seconds since these counters started.
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    pub(crate) fn add_in_flight(&self, n: u64) {
        let now = self.bytes_in_flight.fetch_add(n, Relaxed) + n;
        self.peak_bytes_in_flight.fetch_max(now, Relaxed);
    }

    pub(crate) fn sub_in_flight(&self, n: u64) {
        self.bytes_in_flight.fetch_sub(n, Relaxed);
    }

    /// Count one sample skipped because reading it failed with `e`.
    pub fn record_skip(&self, e: &Error) {
        self.skipped.fetch_add(1, Relaxed);
        if let Some(slot) = self.skipped_by.get(e.skip_cause() as usize) {
            slot.fetch_add(1, Relaxed);
        }
    }

    /// Skips so far by cause: whatever was counted without a cause (decode failures) is `other`.
    pub fn skipped_by_cause(&self) -> SkippedByCause {
        let [damaged_header, checksum_mismatch, unreadable_shard, remote_error] =
            [0, 1, 2, 3].map(|i| self.skipped_by[i].load(Relaxed));
        let known = damaged_header + checksum_mismatch + unreadable_shard + remote_error;
        SkippedByCause {
            damaged_header,
            checksum_mismatch,
            unreadable_shard,
            remote_error,
            other: self.skipped.load(Relaxed).saturating_sub(known),
        }
    }

    /// [`snapshot`](Self::snapshot) with what the source lost when it was opened.
    pub fn snapshot_with_damage(&self, io: Option<IoCounters>, damage: Vec<Damage>) -> StatsSnapshot {
        let mut s = self.snapshot(io);
        s.samples_lost_at_open = damage.iter().map(|d| d.dropped.len() as u64).sum();
        s.damage = damage;
        s
    }

    /// A consistent-enough copy with rates and percentiles; `io` adds store counters.
    pub fn snapshot(&self, io: Option<IoCounters>) -> StatsSnapshot {
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let samples = self.samples.load(Relaxed);
        let bytes = self.bytes.load(Relaxed);
        let wait = self.consumer_wait_ns.load(Relaxed) as f64 / 1e9;
        let io = io.unwrap_or_default();
        StatsSnapshot {
            elapsed_s: elapsed,
            samples,
            bytes,
            batches: self.batches.load(Relaxed),
            samples_per_s: samples as f64 / elapsed,
            bytes_per_s: bytes as f64 / elapsed,
            consumer_wait_s: wait,
            consumer_wait_fraction: (wait / elapsed).min(1.0),
            producer_stall_s: self.producer_stall_ns.load(Relaxed) as f64 / 1e9,
            fetch_p50_ms: self.fetch_latency.quantile(0.50).as_secs_f64() * 1e3,
            fetch_p95_ms: self.fetch_latency.quantile(0.95).as_secs_f64() * 1e3,
            fetch_p99_ms: self.fetch_latency.quantile(0.99).as_secs_f64() * 1e3,
            transform_mean_ms: self.transform_time.mean().as_secs_f64() * 1e3,
            skipped: self.skipped.load(Relaxed),
            skipped_by_cause: self.skipped_by_cause(),
            samples_lost_at_open: 0,
            damage: Vec::new(),
            errors: self.errors.load(Relaxed),
            bytes_in_flight: self.bytes_in_flight.load(Relaxed),
            peak_bytes_in_flight: self.peak_bytes_in_flight.load(Relaxed),
            store_requests: io.requests,
            store_bytes: io.bytes,
            remote_requests: io.remote_requests,
            remote_bytes: io.remote_bytes,
            cache_hit_rate: (io.cache_hits + io.cache_misses > 0).then(|| {
                (io.cache_hits + io.disk_hits.min(io.cache_misses)) as f64 / (io.cache_hits + io.cache_misses) as f64
            }),
            retries: io.retries,
            hedges: io.hedges,
            cache_corrupt: io.cache_corrupt,
            disk_writes: io.disk_writes,
            lease_waits: io.lease_waits,
            disk_behind: io.disk_behind,
            in_flight_limit: io.in_flight_limit,
            peak_in_flight: io.peak_in_flight,
            sources: Vec::new(),
        }
    }
}

/// Loader statistics at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Seconds since the loader started.
    pub elapsed_s: f64,
    /// Samples delivered.
    pub samples: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Delivered samples per second since start.
    pub samples_per_s: f64,
    /// Delivered bytes per second since start.
    pub bytes_per_s: f64,
    /// Seconds the consumer was blocked waiting for data: the GPU-starvation figure.
    pub consumer_wait_s: f64,
    /// `consumer_wait_s / elapsed_s`: near 0 means the input side keeps up.
    pub consumer_wait_fraction: f64,
    /// Seconds producers were blocked (queue full or byte budget): near `elapsed_s` means
    /// the consumer is the bottleneck.
    pub producer_stall_s: f64,
    /// Fetch latency per batch, median, in ms.
    pub fetch_p50_ms: f64,
    /// 95th percentile fetch latency in ms.
    pub fetch_p95_ms: f64,
    /// 99th percentile fetch latency in ms.
    pub fetch_p99_ms: f64,
    /// Mean per-batch transform time in ms.
    pub transform_mean_ms: f64,
    /// Samples skipped under the skip policy: with `samples`, the epoch's plan so far.
    pub skipped: u64,
    /// `skipped`, by cause.
    #[serde(default)]
    pub skipped_by_cause: SkippedByCause,
    /// Samples known lost to damage found when the source was opened (not in any plan):
    /// the sum of every `damage` entry's `dropped` keys. Damage can hide further samples
    /// whose count is unknown; see each entry's `samples_lost`.
    #[serde(default)]
    pub samples_lost_at_open: u64,
    /// Damage found when the source was opened under `on_damage=skip`.
    #[serde(default)]
    pub damage: Vec<Damage>,
    /// Batches that failed or lost samples.
    pub errors: u64,
    /// Bytes fetched and not yet released.
    pub bytes_in_flight: u64,
    /// Peak of `bytes_in_flight`.
    pub peak_bytes_in_flight: u64,
    /// Requests the store served.
    pub store_requests: u64,
    /// Bytes the store served.
    pub store_bytes: u64,
    /// HTTP requests sent to a remote store (retries and hedges included); 0 for local ones.
    #[serde(default)]
    pub remote_requests: u64,
    /// Bytes received from a remote store (retries and hedges included): what the caches and
    /// the ranks sharing them save shows here, where `store_bytes` counts what was read.
    #[serde(default)]
    pub remote_bytes: u64,
    /// Share of cache lookups served from memory or from the disk cache, when a cache is in
    /// the path.
    pub cache_hit_rate: Option<f64>,
    /// Retried requests.
    pub retries: u64,
    /// Hedged requests.
    pub hedges: u64,
    /// Disk cache blocks that failed verification: dropped and fetched again from the store,
    /// never delivered.
    #[serde(default)]
    pub cache_corrupt: u64,
    /// Blocks written to the disk cache: with a plan, only those it reads again before they
    /// would be dropped.
    #[serde(default)]
    pub disk_writes: u64,
    /// Blocks read from the disk cache after waiting for another process on the node (a rank
    /// sharing the cache) to fetch them, instead of fetched again.
    #[serde(default)]
    pub lease_waits: u64,
    /// Blocks left out of the disk cache because its writes were behind the reads
    /// (`disk_cache_behind=skip`): a later epoch fetches and stores them.
    #[serde(default)]
    pub disk_behind: u64,
    /// Remote requests allowed in flight now: sized from observed latency (Little's law)
    /// unless `max_in_flight` fixes it; 0 for local sources.
    #[serde(default)]
    pub in_flight_limit: u64,
    /// Most remote requests in flight at once so far.
    #[serde(default)]
    pub peak_in_flight: u64,
    /// For a mix, each source's share of the above: a slow source shows in its `read_wait_s`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceStats>,
}

/// One source of a mix, as a loader has read and delivered it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SourceStats {
    /// The source's name (its `__source__` value).
    pub name: String,
    /// Its weight as a share of all weights.
    pub weight: f64,
    /// Samples it contributes to every epoch.
    pub per_epoch: u64,
    /// Samples of it delivered to the consumer.
    pub samples: u64,
    /// Payload bytes of it delivered (its fields, not the `__source__` names).
    pub bytes: u64,
    /// Delivered samples per second since the loader started.
    pub samples_per_s: f64,
    /// Delivered bytes per second since the loader started.
    pub bytes_per_s: f64,
    /// Reads of this source (one per batch that holds some of it).
    pub reads: u64,
    /// Samples read (ahead of delivery by what is prefetched).
    pub read_samples: u64,
    /// Payload bytes read.
    pub read_bytes: u64,
    /// Seconds spent waiting for this source's reads, summed over reads: against the other
    /// sources', the one a batch waits for.
    pub read_wait_s: f64,
    /// Median time of one read of this source, in ms.
    pub read_p50_ms: f64,
    /// 95th percentile time of one read of this source, in ms.
    pub read_p95_ms: f64,
    /// Requests its store served.
    pub store_requests: u64,
    /// Bytes its store served.
    pub store_bytes: u64,
    /// Its retried remote requests.
    pub retries: u64,
}

pub use crate::error::DamageCause;

/// Skipped samples by cause; the fields add up to [`StatsSnapshot::skipped`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SkippedByCause {
    /// A damaged or changed tar header, or a shard shorter than its index (found at read).
    pub damaged_header: u64,
    /// A payload that failed its checksum.
    pub checksum_mismatch: u64,
    /// A shard or object that could not be read (missing, permissions, bad index, or changed
    /// since the source was opened).
    pub unreadable_shard: u64,
    /// A remote read that failed past its retries.
    pub remote_error: u64,
    /// Everything else (decoding, transforms).
    pub other: u64,
}

/// One damaged stretch of a shard (or a whole unreadable shard) found while opening it under
/// `on_damage=skip`: what lies in it is not part of the source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Damage {
    /// The shard: relative to the dataset root in an index, its full name when reported.
    pub shard: String,
    /// What was wrong.
    pub cause: DamageCause,
    /// First damaged byte.
    pub start: u64,
    /// Where reading resumed (the next valid header), or the shard's size.
    pub end: u64,
    /// The last sample kept before the damage, if any.
    pub key_before: Option<String>,
    /// The first sample kept after it, if any.
    pub key_after: Option<String>,
    /// Samples dropped because the damage took some of their members (their other members
    /// were intact but the sample is incomplete).
    pub dropped: Vec<String>,
    /// Samples lost in all, when that is known; `None` when whole samples may lie inside the
    /// damaged bytes, where nothing names them.
    pub samples_lost: Option<u64>,
    /// What the walk found, and what to do.
    pub reason: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys and shard names come from the data: shown escaped, never raw control characters.
        use crate::escape::{display_key, escape_controls};
        let key = |k: &Option<String>| k.as_deref().map_or("-".to_string(), |k| format!("`{}`", display_key(k)));
        write!(
            f,
            "{}: bytes {}..{} ({:?}) between {} and {}: ",
            escape_controls(&self.shard),
            self.start,
            self.end,
            self.cause,
            key(&self.key_before),
            key(&self.key_after)
        )?;
        match self.samples_lost {
            Some(n) => write!(f, "{n} sample(s) lost")?,
            None => write!(f, "an unknown number of samples lost")?,
        }
        if !self.dropped.is_empty() {
            let dropped: Vec<_> = self.dropped.iter().map(|k| display_key(k)).collect();
            write!(f, " (incomplete, dropped: {})", dropped.join(", "))?;
        }
        write!(f, "; {}", escape_controls(&self.reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for ns in [0u64, 1, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 100, 1000, 12345, 1 << 40, u64::MAX] {
            let b = bucket_of(ns);
            assert!(b >= last, "{ns}");
            last = b;
            assert!(bucket_floor(b) <= ns, "{ns} below its bucket floor {}", bucket_floor(b));
            if b + 1 < BUCKETS {
                let next = bucket_floor(b + 1);
                assert!(ns < next, "{ns} past its bucket");
                // Within 1/SUB of the value: what keeps p50 and p99 of a narrow spread apart.
                assert!((next - bucket_floor(b)) as f64 <= (ns.max(SUB as u64) as f64) / SUB as f64 + 1.0, "{ns}");
            }
        }
    }

    #[test]
    fn quantiles_within_bucket_error() {
        let h = Histogram::default();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile(0.5).as_secs_f64() * 1e3;
        let p99 = h.quantile(0.99).as_secs_f64() * 1e3;
        assert!((47.0..=54.0).contains(&p50), "p50 {p50}");
        assert!((93.0..=106.0).contains(&p99), "p99 {p99}");
        // Two close latencies land in different buckets.
        let (a, b) = (Histogram::default(), Histogram::default());
        a.record(Duration::from_micros(37_700));
        b.record(Duration::from_micros(41_500));
        assert_ne!(a.quantile(0.5), b.quantile(0.5));
        assert_eq!(Histogram::default().quantile(0.5), Duration::ZERO);
        assert!((h.mean().as_secs_f64() * 1e3 - 50.5).abs() < 0.01);
    }
}
