//! How many requests may be in flight at once: a fixed number (`?max_in_flight=N`), or, by
//! default, a number sized from what the store answers.
//!
//! Little's law ties the three together: requests per second = requests in flight / latency.
//! A store far away (25 ms, 100 ms) needs many requests in flight to deliver a batch's worth of
//! small ranged reads per step, and a fixed limit that suits one store starves the next: 64 in
//! flight at 100 ms is 640 requests/s, whatever the store could give. So the limit grows while
//! requests queue for a slot and latency stays flat (more in flight is then proportionally more
//! throughput), and shrinks in proportion when latency rises above the lowest seen (the store,
//! the link or this machine is saturated: more in flight would only queue). It never exceeds
//! the configured ceiling, nor the number of average-sized requests whose bodies fit in the
//! memory bound, and never falls below [`MIN`].
//!
//! The controller ([`Control`]) is pure arithmetic over completed requests, tested on its
//! own; [`Limit`] applies its decisions to a semaphore: growing adds permits, shrinking
//! forgets permits as requests finish, so nothing in flight is cancelled.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The adaptive limit's floor and, unless the ceiling is lower, its starting point is
/// [`START`].
pub(crate) const MIN: usize = 8;
/// Where the adaptive limit starts: what the fixed default used to be.
pub(crate) const START: usize = 64;
/// A window's median latency this much above the lowest seen means saturation.
const RISE: f64 = 1.5;
/// A window in which at least this share of requests waited for a slot was limited by the
/// limit (more requests were wanted than allowed).
const QUEUED: f64 = 0.25;

/// Decisions over windows of completed requests (see the module docs).
#[derive(Debug)]
pub(crate) struct Control {
    limit: usize,
    ceiling: usize,
    max_bytes: u64,
    /// Lowest window median so far: the store's latency without queueing. Reset to the
    /// median when even the floor's few requests see more (the store's latency changed for
    /// good; it is not saturation when nothing is left to shed).
    base_ns: f64,
    window: Vec<u64>,
    waited: usize,
    bytes: u64,
    /// Mean bytes per request, over all windows so far (0 until one ends).
    mean_bytes: f64,
}

impl Control {
    /// A controller starting at `START` (or `ceiling` if lower), never above `ceiling` nor
    /// above what `max_bytes` holds of average-sized requests.
    pub(crate) fn new(ceiling: usize, max_bytes: u64) -> Self {
        let ceiling = ceiling.max(1);
        Control {
            limit: START.min(ceiling),
            ceiling,
            max_bytes,
            base_ns: 0.0,
            window: Vec::with_capacity(START),
            waited: 0,
            bytes: 0,
            mean_bytes: 0.0,
        }
    }

    /// The current limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// One request finished after `latency_ns` with `bytes`; `waited`: it queued for its
    /// slot. Returns the new limit when a window ends and the limit changes.
    pub(crate) fn done(&mut self, latency_ns: u64, bytes: u64, waited: bool) -> Option<usize> {
        self.window.push(latency_ns);
        self.waited += usize::from(waited);
        self.bytes += bytes;
        // A window long enough to see every slot turn over about once (and at least 16
        // requests, so one slow answer does not decide).
        if self.window.len() < (self.limit / 2).max(16) {
            return None;
        }
        let n = self.window.len();
        self.window.sort_unstable();
        let median = self.window[n / 2] as f64;
        let queued = self.waited as f64 / n as f64;
        let window_mean = self.bytes as f64 / n as f64;
        self.mean_bytes =
            if self.mean_bytes == 0.0 { window_mean } else { 0.75 * self.mean_bytes + 0.25 * window_mean };
        self.window.clear();
        self.waited = 0;
        self.bytes = 0;
        self.base_ns = if self.base_ns == 0.0 { median } else { median.min(self.base_ns) };

        let by_memory = if self.mean_bytes > 0.0 {
            ((self.max_bytes as f64 / self.mean_bytes) as usize).max(MIN)
        } else {
            usize::MAX
        };
        let top = self.ceiling.min(by_memory);
        let floor = MIN.min(top);
        let old = self.limit;
        if median > self.base_ns * RISE && old <= floor {
            self.base_ns = median;
        }
        let next = if median > self.base_ns * RISE {
            // Saturated: shrink in proportion to how much latency rose (at most by half),
            // which Little's law says keeps throughput while the queue drains.
            ((old as f64 * (self.base_ns / median).max(0.5)) as usize).max(floor)
        } else if queued >= QUEUED {
            // Demand above the limit and latency flat: a quarter more in flight.
            old + (old / 4).max(1)
        } else {
            old
        };
        self.limit = next.clamp(floor, top);
        (self.limit != old).then_some(self.limit)
    }

    /// A request failed in a way that says the store is overloaded (503 SlowDown, a reset,
    /// a timeout): three quarters of the limit, and a fresh window.
    pub(crate) fn throttled(&mut self) -> Option<usize> {
        let old = self.limit;
        self.limit = (old * 3 / 4).max(MIN.min(self.ceiling));
        self.window.clear();
        self.waited = 0;
        self.bytes = 0;
        (self.limit != old).then_some(self.limit)
    }
}

/// A semaphore whose size follows a [`Control`], or stays fixed.
pub(crate) struct Limit {
    sem: Arc<Semaphore>,
    control: Option<Mutex<Control>>,
    /// Permits to forget as they come back (the limit shrank below what is out).
    debt: AtomicUsize,
    /// The limit now (for the counters).
    current: AtomicUsize,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    waits: AtomicU64,
}

/// One request's slot; returned (or forgotten, to shrink the limit) when dropped.
pub(crate) struct Slot<'a> {
    permit: Option<OwnedSemaphorePermit>,
    limit: &'a Limit,
    /// Whether the request queued for it.
    pub(crate) waited: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.limit.in_flight.fetch_sub(1, Relaxed);
        let Some(permit) = self.permit.take() else { return };
        let owed = self.limit.debt.fetch_update(Relaxed, Relaxed, |d| d.checked_sub(1)).is_ok();
        if owed {
            permit.forget();
        }
    }
}

impl Limit {
    /// At most `n` in flight, always.
    pub(crate) fn fixed(n: usize) -> Self {
        Self::with(n.max(1), None)
    }

    /// Sized by a [`Control`] up to `ceiling` and the memory bound `max_bytes`.
    pub(crate) fn adaptive(ceiling: usize, max_bytes: u64) -> Self {
        let control = Control::new(ceiling.min(crate::uri::MAX_IN_FLIGHT), max_bytes);
        Self::with(control.limit(), Some(Mutex::new(control)))
    }

    fn with(n: usize, control: Option<Mutex<Control>>) -> Self {
        // A FetchConfig built in code is not checked as options are: a semaphore panics past
        // its maximum.
        let n = n.min(crate::uri::MAX_IN_FLIGHT);
        Limit {
            sem: Arc::new(Semaphore::new(n)),
            control,
            debt: AtomicUsize::new(0),
            current: AtomicUsize::new(n),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            waits: AtomicU64::new(0),
        }
    }

    /// Wait for a slot. `None` only if the semaphore was closed, which this type never does.
    pub(crate) async fn acquire(&self) -> Option<Slot<'_>> {
        let (permit, waited) = match self.sem.clone().try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => {
                self.waits.fetch_add(1, Relaxed);
                (self.sem.clone().acquire_owned().await.ok()?, true)
            }
        };
        let now = self.in_flight.fetch_add(1, Relaxed) + 1;
        self.peak.fetch_max(now, Relaxed);
        Some(Slot { permit: Some(permit), limit: self, waited })
    }

    /// A request in `slot` finished after `latency_ns` with `bytes`: let the controller see it.
    pub(crate) fn done(&self, slot: &Slot<'_>, latency_ns: u64, bytes: u64) {
        let Some(control) = &self.control else { return };
        let changed = control.lock().unwrap_or_else(|e| e.into_inner()).done(latency_ns, bytes, slot.waited);
        self.resize(changed);
    }

    /// A request failed transiently (see [`Control::throttled`]).
    pub(crate) fn throttled(&self) {
        let Some(control) = &self.control else { return };
        let changed = control.lock().unwrap_or_else(|e| e.into_inner()).throttled();
        self.resize(changed);
    }

    fn resize(&self, changed: Option<usize>) {
        if let Some(new) = changed {
            let old = self.current.swap(new, Relaxed);
            if new > old {
                // Cancel owed forgets first, then hand out the rest.
                let mut grow = new - old;
                while grow > 0 {
                    match self.debt.fetch_update(Relaxed, Relaxed, |d| d.checked_sub(1)) {
                        Ok(_) => grow -= 1,
                        Err(_) => break,
                    }
                }
                self.sem.add_permits(grow);
            } else {
                // Take idle permits now; the rest are forgotten as requests finish.
                let mut shrink = old - new;
                while shrink > 0 {
                    match self.sem.try_acquire() {
                        Ok(p) => {
                            p.forget();
                            shrink -= 1;
                        }
                        Err(_) => break,
                    }
                }
                self.debt.fetch_add(shrink, Relaxed);
            }
        }
    }

    /// Whether a request would get a slot now without waiting.
    pub(crate) fn has_room(&self) -> bool {
        self.sem.available_permits() > 0
    }

    /// The limit now.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Relaxed)
    }

    /// Most requests in flight at once so far.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }

    /// Requests that queued for a slot so far.
    pub(crate) fn waits(&self) -> u64 {
        self.waits.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Feed `n` completions of `latency` each, every one having queued or not.
    fn feed(c: &mut Control, n: usize, latency: u64, bytes: u64, waited: bool) {
        for _ in 0..n {
            c.done(latency, bytes, waited);
        }
    }

    #[test]
    fn flat_latency_with_queued_demand_grows_to_the_ceiling() {
        let mut c = Control::new(512, 1 << 40);
        assert_eq!(c.limit(), START);
        feed(&mut c, 5000, 25 * MS, 65536, true);
        assert_eq!(c.limit(), 512);
    }

    #[test]
    fn without_queued_demand_the_limit_stays() {
        let mut c = Control::new(512, 1 << 40);
        feed(&mut c, 5000, 25 * MS, 65536, false);
        assert_eq!(c.limit(), START);
    }

    #[test]
    fn the_memory_bound_caps_the_limit() {
        // 8 MiB bodies, 256 MiB allowed: at most 32 in flight.
        let mut c = Control::new(512, 256 << 20);
        feed(&mut c, 2000, 25 * MS, 8 << 20, true);
        assert_eq!(c.limit(), 32);
    }

    #[test]
    fn a_saturated_store_settles_near_its_knee() {
        // A store that serves 4,000 requests/s at 25 ms: past 100 in flight, requests queue
        // there and latency grows with them (Little's law: latency = in flight / 4,000/s).
        let latency = |in_flight: usize| (25 * MS).max(in_flight as u64 * MS / 4);
        let mut c = Control::new(1024, 1 << 40);
        let mut limits = Vec::new();
        for _ in 0..400 {
            let l = c.limit();
            feed(&mut c, (l / 2).max(16), latency(l), 65536, true);
            limits.push(c.limit());
        }
        let tail = &limits[300..];
        let (lo, hi) = (*tail.iter().min().unwrap(), *tail.iter().max().unwrap());
        // It goes past the knee only by a step, and comes back: never far under it (which
        // would lose throughput) nor far above (which would only queue).
        assert!(lo >= 60 && hi <= 200, "settled between {lo} and {hi}: {:?}", &limits[..40]);
    }

    #[test]
    fn latency_rising_for_good_is_not_saturation_for_ever() {
        let mut c = Control::new(512, 1 << 40);
        feed(&mut c, 2000, 10 * MS, 65536, true);
        let grown = c.limit();
        // The store moved: every request now takes 40 ms whatever is in flight. The limit
        // shrinks to the floor, where the base is reset, then demand grows it again.
        feed(&mut c, 600, 40 * MS, 65536, true);
        assert!(c.limit() < grown);
        feed(&mut c, 20_000, 40 * MS, 65536, true);
        assert_eq!(c.limit(), 512);
    }

    #[tokio::test]
    async fn shrinking_forgets_permits_as_requests_finish() {
        let limit = Limit::adaptive(64, 1 << 40);
        let mut slots = Vec::new();
        for _ in 0..START {
            slots.push(limit.acquire().await.unwrap());
        }
        assert!(limit.sem.try_acquire().is_err());
        // A first window sets the base (no request queued: no growth), then saturation is
        // seen: the limit halves while all 64 are out.
        {
            let mut c = limit.control.as_ref().unwrap().lock().unwrap();
            feed(&mut c, 31, 10 * MS, 1, false);
        }
        limit.done(&slots[0], 10 * MS, 1); // the window's 32nd: base 10 ms
        {
            let mut c = limit.control.as_ref().unwrap().lock().unwrap();
            feed(&mut c, 31, 100 * MS, 1, true);
        }
        limit.done(&slots[0], 100 * MS, 1);
        assert_eq!(limit.current(), 32);
        slots.truncate(0);
        // 32 permits were forgotten as the slots came back: exactly 32 are free.
        let mut again = Vec::new();
        while let Ok(p) = limit.sem.try_acquire() {
            again.push(p);
        }
        assert_eq!(again.len(), 32);
        assert_eq!(limit.peak(), START);
    }

    #[tokio::test]
    async fn fixed_limits_never_move() {
        let limit = Limit::fixed(3);
        let a = limit.acquire().await.unwrap();
        for _ in 0..1000 {
            limit.done(&a, 1, 1);
        }
        assert_eq!(limit.current(), 3);
        let (_b, _c) = (limit.acquire().await.unwrap(), limit.acquire().await.unwrap());
        assert!(limit.sem.try_acquire().is_err());
    }
}
