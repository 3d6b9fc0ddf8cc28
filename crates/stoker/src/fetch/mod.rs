//! The one request layer for remote bytes: every request to an object store goes through a
//! [`Fetcher`], under one in-flight limit (`request`), with retries (`retry`) and hedging
//! of stragglers (`hedge`). Which ranges to request (merging, splitting, the block cache)
//! is the read path's business ([`crate::cache::RemoteReader`]); this layer sends what it is
//! given.
//!
//! object_store's own retries are turned off for stores built by Stoker, so every retry
//! happens here, counted, with the same policy on every store. So are its timeouts: a read
//! here is bounded by a stall timeout on every piece of an answer (`body`), a time limit
//! per attempt, and a deadline over all its attempts.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::error::Result;

mod answers;
mod body;
pub(crate) mod client;
mod expect;
mod hedge;
pub(crate) mod limit;
mod list;
mod parts;
mod request;
mod retry;

pub use expect::{is_weak, Expect};

/// When to send a duplicate of a slow request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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
    /// Requests in flight at once, over everything this fetcher reads: the limit when
    /// `adaptive_in_flight` is off, its ceiling when it is on.
    pub max_in_flight: usize,
    /// Size the in-flight limit from observed latency (Little's law, `fetch::limit`): start at 64,
    /// grow while requests queue and latency stays flat, shrink when it rises.
    pub adaptive_in_flight: bool,
    /// The adaptive limit holds at most this many bytes of average-sized requests in flight.
    pub max_bytes_in_flight: u64,
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
    /// An attempt that receives nothing for this long (no answer, or no byte of its body
    /// since the last) is abandoned and retried (`Duration::MAX`: never).
    pub stall: Duration,
    /// A read fails once this long has passed since its first attempt began, whatever
    /// attempts are left: the most one read can cost (listings, which may page through
    /// millions of names, have none; `Duration::MAX`: none at all).
    pub deadline: Duration,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            max_in_flight: 512,
            adaptive_in_flight: true,
            max_bytes_in_flight: 256 << 20,
            coalesce_gap: crate::ranges::REMOTE_GAP,
            part_size: crate::ranges::PART,
            attempts: 6,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            hedge: Hedge::Auto { quantile: 0.95, factor: 2.0, min: Duration::from_millis(20) },
            timeout: Duration::from_secs(60),
            // A healthy store answers within a second or two even under load; a server that
            // stops sending mid-body was found to cost 6 attempts x 60 s before this.
            stall: Duration::from_secs(20),
            deadline: Duration::from_secs(120),
        }
    }
}

impl FetchConfig {
    /// The fetch layer's settings from a source's options.
    pub fn from_options(opts: &crate::uri::SourceOptions) -> Self {
        let d = FetchConfig::default();
        FetchConfig {
            max_in_flight: opts.max_in_flight.unwrap_or(d.max_in_flight).max(1),
            // A number the user chose is kept as it is.
            adaptive_in_flight: opts.max_in_flight.is_none() && d.adaptive_in_flight,
            max_bytes_in_flight: d.max_bytes_in_flight,
            coalesce_gap: opts.coalesce_gap(true),
            part_size: opts.part_size.unwrap_or(d.part_size).max(1),
            attempts: opts.attempts.unwrap_or(d.attempts).max(1),
            backoff: opts.backoff_ms.map_or(d.backoff, Duration::from_millis),
            max_backoff: d.max_backoff,
            hedge: match opts.hedge_ms {
                None => d.hedge,
                Some(0) => Hedge::Off,
                Some(ms) => Hedge::After(Duration::from_millis(ms)),
            },
            timeout: opts.timeout_ms.map_or(d.timeout, Duration::from_millis),
            stall: opts.stall_ms.map_or(d.stall, off_at_zero),
            deadline: opts.deadline_ms.map_or(d.deadline, off_at_zero),
        }
    }
}

/// The most one write of `bytes` may take: the attempt limit `timeout` (`timeout_ms`) plus
/// the bytes at 64 KiB/s (a slow uplink shared by a writer's parts in flight is not cut
/// off), so that a write that gets no answer ends.
pub fn write_limit(timeout: Duration, bytes: u64) -> Duration {
    timeout.saturating_add(Duration::from_secs(bytes >> 16))
}

/// A limit of `ms` milliseconds, where 0 turns it off (a wait past any run's length).
fn off_at_zero(ms: u64) -> Duration {
    if ms == 0 {
        Duration::MAX
    } else {
        Duration::from_millis(ms)
    }
}

/// What the fetch layer has done.
#[derive(Debug, Default)]
pub struct FetchCounters {
    /// Requests sent (hedges and retries included).
    pub(crate) requests: AtomicU64,
    /// Retries after a transient failure.
    pub(crate) retries: AtomicU64,
    /// Duplicates sent for slow requests.
    pub(crate) hedges: AtomicU64,
    /// Hedges that answered first.
    pub(crate) hedge_wins: AtomicU64,
    /// Requests that failed for good.
    pub(crate) failures: AtomicU64,
    /// Bytes received.
    pub(crate) bytes: AtomicU64,
}

/// Reads byte ranges of objects in one store through the policies above.
pub struct Fetcher {
    store: Arc<dyn ObjectStore>,
    cfg: FetchConfig,
    limit: limit::Limit,
    recent: Mutex<VecDeque<u64>>,
    /// Current hedging threshold in ns (0: not hedging yet).
    threshold_ns: AtomicU64,
    counters: FetchCounters,
    /// The store as one whose uploads are numbered by part (see `parts`), if it has them.
    multipart: Option<Arc<dyn object_store::multipart::MultipartStore>>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher over `store` with the settings `cfg`.
    pub fn new(store: Arc<dyn ObjectStore>, cfg: FetchConfig) -> Self {
        Fetcher {
            limit: if cfg.adaptive_in_flight {
                limit::Limit::adaptive(cfg.max_in_flight, cfg.max_bytes_in_flight)
            } else {
                limit::Limit::fixed(cfg.max_in_flight)
            },
            store,
            cfg,
            recent: hedge::window(),
            threshold_ns: AtomicU64::new(0),
            counters: FetchCounters::default(),
            multipart: None,
        }
    }

    /// The object store requests go to.
    pub fn objects(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The counters.
    pub(crate) fn limit(&self) -> &limit::Limit {
        &self.limit
    }

    pub(crate) fn counters(&self) -> &FetchCounters {
        &self.counters
    }

    /// The settings.
    pub fn config(&self) -> &FetchConfig {
        &self.cfg
    }

    /// A whole object (one request, retried, within the read's deadline); with `expect`, only
    /// that version of it (see [`Expect`]): another is an [`Error::Changed`](crate::Error::Changed).
    /// An object said to be larger than `most` bytes is an
    /// [`Error::BadIndex`](crate::Error::BadIndex), its body not read: a file read whole only
    /// to describe data has a size it cannot outgrow (`u64::MAX` for none).
    pub async fn get(&self, path: &ObjPath, shown: &str, expect: Option<&Expect>, most: u64) -> Result<Bytes> {
        name_fits(path)?;
        self.retrying(
            shown,
            || "whole object".to_string(),
            Some(self.cfg.deadline),
            || async {
                // Under the same in-flight limit as ranged reads: a layout of one object per
                // sample makes as many requests as a shuffled tar source.
                let slot = self
                    .limit
                    .acquire()
                    .await
                    .ok_or_else(|| retry::Failure::fatal("the fetcher's in-flight limit was closed"))?;
                self.counters.requests.fetch_add(1, Relaxed);
                let started = std::time::Instant::now();
                let opts = object_store::GetOptions {
                    if_match: expect.and_then(Expect::if_match).map(str::to_string),
                    ..Default::default()
                };
                let read = async {
                    let g = self.answer(self.store.get_opts(path, opts)).await?;
                    if let Some(why) = expect.and_then(|x| x.differs(&g.meta)) {
                        return Err(retry::Failure::changed(why));
                    }
                    // No range was asked for: the answer's own size bounds the body, and
                    // memory follows the bytes that arrive, not the size claimed.
                    let size = g.meta.size;
                    if size > most {
                        return Err(retry::Failure::too_large(size, most));
                    }
                    let reserve = usize::try_from(size).unwrap_or(usize::MAX).min(body::RESERVE_UNASKED);
                    let b = body::read(g.into_stream(), body::Bound { most: size, reserve }, self.cfg.stall).await?;
                    if (b.len() as u64) < size {
                        return Err(retry::Failure::transient(format!(
                            "the body had {} bytes, {size} were promised",
                            b.len()
                        )));
                    }
                    Ok(b)
                };
                // No time limit per attempt, unlike a range's: a whole object may be large. The
                // stall timeout and the read's deadline bound it.
                let r = read.await;
                match &r {
                    Ok(b) => {
                        self.counters.bytes.fetch_add(b.len() as u64, Relaxed);
                        self.limit.done(&slot, started.elapsed().as_nanos() as u64, b.len() as u64);
                    }
                    Err(f) if f.transient => self.limit.throttled(),
                    Err(_) => {}
                }
                r
            },
        )
        .await
    }

    /// Write a whole object (one PUT), retried as reads are (a PUT of the same bytes is
    /// idempotent), each attempt within [`write_limit`]: a write whose answer never comes is
    /// an error, not a wait without end (object_store's own timeouts are off here).
    pub async fn put(&self, path: &ObjPath, shown: &str, bytes: Bytes) -> Result<()> {
        name_fits(path)?;
        let payload = object_store::PutPayload::from(bytes);
        let limit = write_limit(self.cfg.timeout, payload.content_length() as u64);
        self.retrying(
            shown,
            || "write".to_string(),
            None,
            || async {
                self.counters.requests.fetch_add(1, Relaxed);
                parts::answer(limit, "the write", self.store.put(path, payload.clone())).await.map(drop)
            },
        )
        .await
    }

    /// Size and version of an object (retried).
    pub async fn head(&self, path: &ObjPath, shown: &str) -> Result<object_store::ObjectMeta> {
        name_fits(path)?;
        self.retrying(
            shown,
            || "metadata".to_string(),
            Some(self.cfg.deadline),
            || async {
                self.counters.requests.fetch_add(1, Relaxed);
                match self.answer(self.store.head(path)).await {
                    // A server that refuses HEAD (405, which object_store reports as "not
                    // found") but serves GET: the answer for the first byte carries the same
                    // size and version. Its body is not read.
                    Err(f) if f.missing && retry::http_status(&f.message) == Some(405) => {
                        self.counters.requests.fetch_add(1, Relaxed);
                        let opts = object_store::GetOptions { range: Some((0..1).into()), ..Default::default() };
                        self.answer(self.store.get_opts(path, opts)).await.map(|g| g.meta)
                    }
                    r => r,
                }
            },
        )
        .await
    }

    /// One range of `path` (`shown` names it in errors), retried and hedged; with `expect`,
    /// only of that version of the object (see [`Expect`]): another is an
    /// [`Error::Changed`](crate::Error::Changed), never its bytes.
    pub async fn fetch_range(
        &self,
        path: &ObjPath,
        shown: &str,
        range: Range<u64>,
        expect: Option<&Expect>,
    ) -> Result<Bytes> {
        name_fits(path)?;
        let what = || format!("bytes {}..{}", range.start, range.end);
        self.retrying(shown, what, Some(self.cfg.deadline), || {
            self.hedged(|| self.attempt(path, range.clone(), expect))
        })
        .await
    }
}

/// The longest object name Stoker requests, in bytes. S3, GCS and Azure allow 1,024; HTTP
/// servers commonly refuse URLs past 8 KiB; object_store's HTTP client cannot make a request
/// whose URI passes 64 KiB (it panicked, on names a list file or an index supplied).
pub(crate) const MAX_NAME: usize = 16 << 10;

/// `path`, if its name is short enough to request (see [`MAX_NAME`]).
pub(crate) fn name_fits(path: &ObjPath) -> Result<()> {
    let name = path.as_ref();
    if name.len() <= MAX_NAME {
        return Ok(());
    }
    let mut cut = 120;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    Err(crate::Error::NotSupported {
        what: format!(
            "an object name of {} bytes (`{}...`): names over {MAX_NAME} bytes are not requested (S3, GCS and Azure \
             allow 1,024); a list file or index that names it is damaged",
            name.len(),
            crate::sample::escape_controls(&name[..cut])
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_too_long_to_request_is_refused_before_the_request() {
        assert!(name_fits(&ObjPath::from("a/b.tar")).is_ok());
        assert!(name_fits(&ObjPath::from("n".repeat(MAX_NAME))).is_ok());
        let e = name_fits(&ObjPath::from("n".repeat(MAX_NAME + 1))).unwrap_err().to_string();
        assert!(e.contains(&format!("{} bytes", MAX_NAME + 1)) && e.len() < 600, "{e}");
        // Counted as requested: a character outside ASCII is escaped to 6 bytes (`%C3%A9`).
        let e = name_fits(&ObjPath::from("é".repeat(MAX_NAME / 4))).unwrap_err().to_string();
        assert!(e.contains(&format!("{} bytes", 6 * (MAX_NAME / 4))) && e.len() < 600, "{e}");
    }

    #[test]
    fn zero_turns_the_stall_timeout_and_the_deadline_off() {
        let d = FetchConfig::from_options(&crate::uri::SourceOptions::default());
        assert_eq!((d.stall, d.deadline), (Duration::from_secs(20), Duration::from_secs(120)));
        let o = crate::uri::SourceOptions::from_query("stall_ms=0&deadline_ms=0").unwrap();
        let off = FetchConfig::from_options(&o);
        assert_eq!((off.stall, off.deadline), (Duration::MAX, Duration::MAX));
        let o = crate::uri::SourceOptions::from_query("stall_ms=300&deadline_ms=1500").unwrap();
        let set = FetchConfig::from_options(&o);
        assert_eq!((set.stall, set.deadline), (Duration::from_millis(300), Duration::from_millis(1500)));
    }
}
