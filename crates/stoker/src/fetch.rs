//! The one fetch layer for remote bytes: range planning (coalesce nearby ranges, split large
//! ones into parts fetched in parallel), one in-flight limit, retries with exponential
//! backoff and jitter, and hedging of stragglers.
//!
//! object_store's own retries are turned off for stores built by Stoker, so every retry
//! happens here, counted, with the same policy on every store.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};

mod cached;

/// When to send a duplicate of a slow request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hedge {
    /// Never.
    Off,
    /// After a fixed delay.
    After(Duration),
    /// After `factor` times the `quantile` latency of recent requests (at least `min`), once
    /// enough requests have been seen to know it.
    Auto {
        /// Which latency quantile of recent requests (e.g. 0.95).
        quantile: f64,
        /// Multiple of that latency to wait before hedging.
        factor: f64,
        /// Never hedge sooner than this.
        min: Duration,
    },
}

/// Settings of the fetch layer.
#[derive(Clone, Debug, PartialEq)]
pub struct FetchConfig {
    /// Requests in flight at once, over everything this fetcher reads.
    pub max_in_flight: usize,
    /// Ranges closer than this are merged into one request.
    pub coalesce_gap: u64,
    /// Larger reads are split into parts of this size, fetched in parallel.
    pub part_size: u64,
    /// Tries per request, the first one included.
    pub attempts: u32,
    /// First backoff; doubles per retry, with full jitter.
    pub backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
    /// Hedging policy.
    pub hedge: Hedge,
    /// One attempt's time limit.
    pub timeout: Duration,
    /// Memory and disk caches for ranged reads of versioned objects (off by default).
    pub cache: crate::cache::CacheConfig,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            max_in_flight: 64,
            coalesce_gap: 1 << 20,
            part_size: 8 << 20,
            attempts: 6,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            hedge: Hedge::Auto { quantile: 0.95, factor: 2.0, min: Duration::from_millis(20) },
            timeout: Duration::from_secs(60),
            cache: crate::cache::CacheConfig { block: 1 << 20, ..Default::default() },
        }
    }
}

/// What the fetch layer has done.
#[derive(Debug, Default)]
pub struct FetchCounters {
    /// Requests sent (hedges and retries included).
    pub requests: AtomicU64,
    /// Retries after a transient failure.
    pub retries: AtomicU64,
    /// Duplicates sent for slow requests.
    pub hedges: AtomicU64,
    /// Hedges that answered first.
    pub hedge_wins: AtomicU64,
    /// Requests that failed for good.
    pub failures: AtomicU64,
    /// Bytes received.
    pub bytes: AtomicU64,
}

/// Latency window for the hedging threshold.
const RECENT: usize = 256;
const MIN_SEEN: usize = 20;

/// Reads byte ranges of objects in one store through the policies above.
pub struct Fetcher {
    store: Arc<dyn ObjectStore>,
    cfg: FetchConfig,
    limit: Arc<Semaphore>,
    recent: Mutex<VecDeque<u64>>,
    /// Current hedging threshold in ns (0: not hedging yet).
    threshold_ns: AtomicU64,
    counters: FetchCounters,
    cache: Option<crate::cache::BlockCache>,
    /// Cache blocks that cached reads may hold at once (see `get_ranges_cached`).
    held_blocks: Arc<Semaphore>,
    held_blocks_max: usize,
}

/// One attempt's failure, classified.
struct Failure {
    transient: bool,
    /// The object is not there (404): reported as `Error::NotFound`, so callers that treat a
    /// missing object as "none" (manifests, pack plans) match a variant, not a message.
    missing: bool,
    message: String,
    hint: Option<String>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher over `store`; fails only if the disk cache directory cannot be made.
    pub fn new(store: Arc<dyn ObjectStore>, cfg: FetchConfig) -> Result<Self> {
        let cache = if cfg.cache.enabled() { Some(crate::cache::BlockCache::new(cfg.cache.clone())?) } else { None };
        // Blocks in use by reads come on top of the cache's own bytes (a block being fetched,
        // or evicted while a read still cuts from it): half the memory cache's worth, or 64 MiB
        // (reads through the disk cache alone hold blocks in memory only while in flight), at
        // least 8 and at most one per request in flight, keeps that bounded and still parallel.
        let block = cfg.cache.block.max(1);
        let held_bytes = (cfg.cache.memory_bytes / 2).max(64 << 20);
        let held_blocks_max = ((held_bytes / block) as usize).clamp(8, cfg.max_in_flight.max(8));
        Ok(Fetcher {
            cache,
            held_blocks: Arc::new(Semaphore::new(held_blocks_max)),
            held_blocks_max,
            limit: Arc::new(Semaphore::new(cfg.max_in_flight.max(1))),
            store,
            cfg,
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            threshold_ns: AtomicU64::new(0),
            counters: FetchCounters::default(),
        })
    }

    /// The block cache, when one is configured.
    pub fn cache(&self) -> Option<&crate::cache::BlockCache> {
        self.cache.as_ref()
    }

    /// Tell the block cache what a reader will read and when, so the disk cache drops what is
    /// needed furthest ahead (see [`crate::cache::policy`]). `objects` are the objects the
    /// reads are of (path, version, size); `uses` calls its sink with `(time, object number,
    /// byte range)` in time order and may be called more than once; `clock` is the reader's
    /// time, advanced as it reads. Returns whether the cache follows the plan (false without a
    /// disk cache, under `cache_eviction=lru`, or for too many blocks to plan).
    pub fn plan_reads(
        &self,
        objects: &[(ObjPath, String, u64)],
        uses: crate::cache::policy::Uses<'_>,
        clock: Arc<AtomicU64>,
    ) -> bool {
        let Some(cache) = &self.cache else { return false };
        if cache.disk_limit().is_none() || cache.config().eviction != crate::cache::Eviction::Future {
            return false;
        }
        let keyers: Vec<_> = objects
            .iter()
            .map(|(path, version, _)| move |b: u64| crate::cache::block_key(path.as_ref(), version, b))
            .collect();
        let planned: Vec<(&(dyn Fn(u64) -> u128 + Sync), u64)> =
            keyers.iter().zip(objects).map(|(k, (_, _, size))| (k as &(dyn Fn(u64) -> u128 + Sync), *size)).collect();
        match crate::cache::Plan::build(cache.config().block.max(1), &planned, uses, clock) {
            Some(plan) => cache.set_plan(Some(Arc::new(plan))),
            None => false,
        }
    }

    /// The counters.
    pub fn counters(&self) -> &FetchCounters {
        &self.counters
    }

    /// The settings.
    pub fn config(&self) -> &FetchConfig {
        &self.cfg
    }

    /// Read `ranges` of `path` (`shown` names it in errors), in the order asked.
    pub async fn get_ranges(&self, path: &ObjPath, shown: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.get_ranges_if(path, shown, ranges, None).await
    }

    /// [`get_ranges`](Self::get_ranges), only while the object's entity tag is `if_match`
    /// (when given): a replaced object is an error, not other bytes.
    pub async fn get_ranges_if(
        &self,
        path: &ObjPath,
        shown: &str,
        ranges: &[Range<u64>],
        if_match: Option<&str>,
    ) -> Result<Vec<Bytes>> {
        let plan = plan(ranges, self.cfg.coalesce_gap, self.cfg.part_size);
        let parts = plan.iter().flat_map(|m| m.parts.iter().cloned());
        let fetched: Vec<Bytes> =
            futures::future::try_join_all(parts.map(|p| self.fetch_range(path, shown, p, if_match))).await?;
        let mut fetched = fetched.into_iter();
        let mut merged: Vec<(Range<u64>, Bytes)> = Vec::with_capacity(plan.len());
        for m in &plan {
            let bufs: Vec<Bytes> = fetched.by_ref().take(m.parts.len()).collect();
            let whole = if bufs.len() == 1 {
                bufs.into_iter().next().unwrap_or_default()
            } else {
                let mut b = BytesMut::with_capacity((m.range.end - m.range.start) as usize);
                bufs.iter().for_each(|x| b.extend_from_slice(x));
                b.freeze()
            };
            merged.push((m.range.clone(), whole));
        }
        Ok(ranges
            .iter()
            .map(|r| {
                let (mr, buf) = merged
                    .iter()
                    .find(|(mr, _)| mr.start <= r.start && r.end <= mr.end)
                    .expect("every asked range lies in a planned one");
                buf.slice((r.start - mr.start) as usize..(r.end - mr.start) as usize)
            })
            .collect())
    }

    /// A whole object (one request, retried).
    pub async fn get(&self, path: &ObjPath, shown: &str) -> Result<Bytes> {
        self.retrying(
            shown,
            || "whole object".to_string(),
            || async {
                self.counters.requests.fetch_add(1, Relaxed);
                let r = self.store.get(path).await;
                match r {
                    Ok(g) => g.bytes().await.map_err(classify),
                    Err(e) => Err(classify(e)),
                }
            },
        )
        .await
    }

    /// Size and version of an object (retried).
    pub async fn head(&self, path: &ObjPath, shown: &str) -> Result<object_store::ObjectMeta> {
        self.retrying(
            shown,
            || "metadata".to_string(),
            || async {
                self.counters.requests.fetch_add(1, Relaxed);
                self.store.head(path).await.map_err(classify)
            },
        )
        .await
    }

    /// Every object under `prefix` (the whole listing is retried on a transient failure).
    pub async fn list(&self, prefix: Option<&ObjPath>, shown: &str) -> Result<Vec<object_store::ObjectMeta>> {
        use futures::TryStreamExt;
        self.retrying(
            shown,
            || "listing".to_string(),
            || async {
                self.counters.requests.fetch_add(1, Relaxed);
                self.store.list(prefix).try_collect::<Vec<_>>().await.map_err(classify)
            },
        )
        .await
    }

    async fn fetch_range(
        &self,
        path: &ObjPath,
        shown: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes> {
        let what = || format!("bytes {}..{}", range.start, range.end);
        self.retrying(shown, what, || self.hedged(|| self.attempt(path, range.clone(), if_match))).await
    }

    /// Retry transient failures with exponential backoff and full jitter.
    /// `what` names the bytes in the final error; it is only formatted if there is one.
    async fn retrying<T, F, Fut>(&self, shown: &str, what: impl Fn() -> String, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        let attempts = self.cfg.attempts.max(1);
        let mut backoff = self.cfg.backoff;
        for attempt in 1..=attempts {
            match f().await {
                Ok(b) => return Ok(b),
                Err(fail) if fail.transient && attempt < attempts => {
                    self.counters.retries.fetch_add(1, Relaxed);
                    let jittered = backoff.mul_f64(jitter());
                    tokio::time::sleep(jittered).await;
                    backoff = (backoff * 2).min(self.cfg.max_backoff);
                }
                Err(fail) if fail.missing => {
                    self.counters.failures.fetch_add(1, Relaxed);
                    return Err(Error::NotFound { what: format!("{shown} ({})", what()), hint: fail.hint });
                }
                Err(fail) => {
                    self.counters.failures.fetch_add(1, Relaxed);
                    return Err(Error::Fetch {
                        object: shown.to_string(),
                        what: what(),
                        attempts: attempt,
                        message: fail.message,
                        hint: fail.hint,
                        transient: fail.transient,
                    });
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Run `f`; if it is still going past the hedging threshold, run it again and take
    /// whichever answers first (the other is dropped, which cancels its request).
    async fn hedged<F, Fut>(&self, f: F) -> std::result::Result<Bytes, Failure>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Bytes, Failure>>,
    {
        let threshold = match self.cfg.hedge {
            Hedge::Off => return f().await,
            Hedge::After(d) => d,
            Hedge::Auto { .. } => match self.threshold_ns.load(Relaxed) {
                0 => return f().await,
                ns => Duration::from_nanos(ns),
            },
        };
        let first = f();
        tokio::pin!(first);
        tokio::select! {
            r = &mut first => return r,
            _ = tokio::time::sleep(threshold) => {}
        }
        self.counters.hedges.fetch_add(1, Relaxed);
        let second = f();
        tokio::pin!(second);
        tokio::select! {
            r = &mut first => r,
            r = &mut second => {
                if r.is_ok() {
                    self.counters.hedge_wins.fetch_add(1, Relaxed);
                }
                r
            }
        }
    }

    async fn attempt(
        &self,
        path: &ObjPath,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> std::result::Result<Bytes, Failure> {
        let _slot = self.limit.acquire().await.map_err(|e| Failure {
            transient: false,
            missing: false,
            message: e.to_string(),
            hint: None,
        })?;
        self.counters.requests.fetch_add(1, Relaxed);
        let started = Instant::now();
        let want = range.end - range.start;
        let request = async {
            match if_match {
                None => self.store.get_range(path, range.clone()).await,
                Some(tag) => {
                    let opts = object_store::GetOptions {
                        if_match: Some(tag.to_string()),
                        range: Some(range.clone().into()),
                        ..Default::default()
                    };
                    self.store.get_opts(path, opts).await?.bytes().await
                }
            }
        };
        let result = tokio::time::timeout(self.cfg.timeout, request).await;
        let bytes = match result {
            Err(_) => {
                return Err(Failure {
                    transient: true,
                    missing: false,
                    message: format!("timed out after {:?}", self.cfg.timeout),
                    hint: None,
                })
            }
            Ok(Err(e)) => return Err(classify(e)),
            Ok(Ok(b)) => b,
        };
        self.record(started.elapsed());
        self.counters.bytes.fetch_add(bytes.len() as u64, Relaxed);
        if bytes.len() as u64 != want {
            return Err(Failure {
                transient: true,
                missing: false,
                message: format!("the body had {} bytes, {want} were promised", bytes.len()),
                hint: None,
            });
        }
        Ok(bytes)
    }

    fn record(&self, latency: Duration) {
        let Hedge::Auto { quantile, factor, min } = self.cfg.hedge else { return };
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(latency.as_nanos() as u64);
        // Recomputing over the window every 16 requests keeps this off the hot path.
        if (recent.len() >= MIN_SEEN && recent.len().is_multiple_of(16)) || recent.len() == MIN_SEEN {
            let mut v: Vec<u64> = recent.iter().copied().collect();
            v.sort_unstable();
            let q = v[((v.len() - 1) as f64 * quantile.clamp(0.0, 1.0)) as usize];
            let t = ((q as f64 * factor) as u64).max(min.as_nanos() as u64);
            self.threshold_ns.store(t, Relaxed);
        }
    }
}

/// A uniform factor in [0.5, 1.0): "equal jitter", so backoff never collapses to zero.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    0.5 + (h.finish() % 1_000_000) as f64 / 2_000_000.0
}

/// Sort an object_store error into transient (retry) or not, with a hint for the latter.
fn classify(e: object_store::Error) -> Failure {
    use object_store::Error as E;
    let message = e.to_string();
    let (transient, hint) = match &e {
        E::NotFound { .. } => (false, Some("the object does not exist: check the bucket, prefix and name".to_string())),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => (
            false,
            Some(
                "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, service account, account key)"
                    .into(),
            ),
        ),
        E::Precondition { .. } | E::NotModified { .. } => (
            false,
            Some(
                "the object was replaced after the source was opened or indexed (its entity tag changed); reopen \
                 the source, and run `stoker index` again if the dataset has a manifest"
                    .to_string(),
            ),
        ),
        E::Generic { .. } | E::JoinError { .. } => {
            let status = http_status(&message);
            match status {
                Some(s) if (500..600).contains(&s) || s == 408 || s == 429 => (true, None),
                Some(401) | Some(403) => (false, Some("check the credentials and the bucket's permissions".into())),
                Some(404) => (false, Some("the object does not exist".into())),
                Some(_) => (false, None),
                // No status: a transport failure (connect, reset, timeout, short body).
                None => (true, None),
            }
        }
        _ => (false, None),
    };
    let missing = matches!(e, E::NotFound { .. }) || http_status(&message) == Some(404);
    Failure { transient, missing, message, hint }
}

/// The HTTP status in an object_store error message, if it names one.
fn http_status(msg: &str) -> Option<u16> {
    for marker in ["status code: ", "Status: ", "status: "] {
        if let Some(at) = msg.find(marker) {
            let digits: String = msg[at + marker.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(s) = digits.parse() {
                return Some(s);
            }
        }
    }
    None
}

/// A merged range and the parts it is fetched in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// The merged range.
    pub range: Range<u64>,
    /// Its parts, in order, each at most the part size.
    pub parts: Vec<Range<u64>>,
}

/// Merge ranges closer than `gap` and split the merged ones into parts of at most `part`.
pub fn plan(ranges: &[Range<u64>], gap: u64, part: u64) -> Vec<Planned> {
    let mut sorted: Vec<Range<u64>> = ranges.iter().filter(|r| r.end > r.start).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for r in sorted {
        match merged.last_mut() {
            Some(m) if r.start <= m.end.saturating_add(gap) => m.end = m.end.max(r.end),
            _ => merged.push(r),
        }
    }
    // An empty range still needs a (zero-length) home so slicing finds it.
    if ranges.iter().any(|r| r.end <= r.start) {
        for r in ranges.iter().filter(|r| r.end <= r.start) {
            if !merged.iter().any(|m| m.start <= r.start && r.start <= m.end) {
                merged.push(r.start..r.start);
            }
        }
    }
    let part = part.max(1);
    merged
        .into_iter()
        .map(|m| {
            let mut parts = Vec::new();
            let mut at = m.start;
            while at < m.end {
                let end = (at + part).min(m.end);
                parts.push(at..end);
                at = end;
            }
            if parts.is_empty() {
                parts.push(m.clone());
            }
            Planned { range: m, parts }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_coalesces_splits_and_covers() {
        let p = plan(&[0..10, 15..20, 100..130, 12..14], 5, 16);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].range, 0..20);
        assert_eq!(p[0].parts, vec![0..16, 16..20]);
        assert_eq!(p[1].range, 100..130);
        assert_eq!(p[1].parts, vec![100..116, 116..130]);
        let p = plan(&[5..5, 0..3], 0, 8);
        assert!(p.iter().any(|m| m.range.start <= 5 && 5 <= m.range.end));
    }

    #[test]
    fn statuses_are_found_in_messages() {
        assert_eq!(http_status("Server returned non-2xx status code: 503 Service Unavailable: <Error>"), Some(503));
        assert_eq!(http_status("connection reset"), None);
    }
}
