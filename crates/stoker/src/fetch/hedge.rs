//! Hedging: a request still unanswered past a threshold is sent again and the first answer
//! wins, which cuts the tail latency object stores show on a few percent of requests. The
//! threshold is fixed or follows a quantile of recent latencies ([`Hedge`]).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;

use super::retry::Failure;
use super::{Fetcher, Hedge};

/// Latency window for the hedging threshold.
const RECENT: usize = 256;
const MIN_SEEN: usize = 20;

impl Fetcher {
    /// Run `f`; if it is still going past the hedging threshold, run it again and take
    /// whichever answers first (the other is dropped, which cancels its request).
    pub(super) async fn hedged<F, Fut>(&self, f: F) -> std::result::Result<Bytes, Failure>
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
        loop {
            tokio::select! {
                r = &mut first => return r,
                _ = tokio::time::sleep(threshold) => {}
            }
            // A hedge is a spare request. With every in-flight slot taken it would only queue
            // behind the others, and the wait that triggered it was the queue's, not the
            // store's (a per-sample shuffle at the limit hedged 3 requests in 4 of them).
            if self.limit.has_room() {
                break;
            }
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

    pub(super) fn record(&self, latency: Duration) {
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

/// An empty latency window, sized for [`RECENT`] entries.
pub(super) fn window() -> std::sync::Mutex<std::collections::VecDeque<u64>> {
    std::sync::Mutex::new(std::collections::VecDeque::with_capacity(RECENT))
}
