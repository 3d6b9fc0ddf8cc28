//! One budget for the working memory of a decoder's threads.
//!
//! An image is decoded whole (pixels, and the codec's own buffers) before it is cropped and
//! resized, so its working memory follows its header, not its file: a 790 KB PNG of 100
//! megapixels at 16-bit RGBA needs about 1.1 GB. With N decode threads meeting such images at
//! once that is N times as much, so a decode reserves what its header says it needs from one
//! [`DecodeMemory`] shared by the threads, and waits while others hold it.
//!
//! Ordinary images should not pay for that (no lock, no allocation): each thread may keep up
//! to [`keep`](DecodeMemory::keep) bytes of scratch buffers from image to image, and an image
//! that needs no more than that decodes without a reservation. That part is set aside for every
//! thread; reservations share the rest. A thread that decoded a bigger image frees its scratch
//! before its reservation ends. So the threads together hold at most the budget: `threads ×
//! keep` kept plus what the reservations hold.
//!
//! Reservations are granted in the order they were asked for: a big image waits for room
//! while the threads before it finish, and smaller ones arriving later queue behind it
//! rather than starving it. Nothing waits while holding a reservation, so waiting ends.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The most a thread keeps between images, whatever the budget: an ImageNet-sized image needs
/// about 1 MiB, a 12-megapixel photo about 60 MiB.
const KEEP_AT_MOST: u64 = 64 << 20;

/// Working memory shared by the decode threads of one decoder (see the module docs).
#[derive(Debug)]
pub struct DecodeMemory {
    limit: u64,
    keep: u64,
    /// What reservations share: `limit - threads * keep`.
    shared: u64,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    reserved: u64,
    /// Tickets hand out the order of grants.
    next_ticket: u64,
    serving: u64,
    peak: u64,
    waits: u64,
}

/// An image needs more working memory than one decode may ever reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// What the image needs, bytes.
    pub needed: u64,
    /// The most one reservation may hold: the budget less what the threads keep.
    pub available: u64,
    /// The whole budget.
    pub limit: u64,
}

/// Bytes reserved from a [`DecodeMemory`], given back when dropped.
#[derive(Debug)]
#[must_use = "the reservation ends when dropped"]
pub struct Reservation<'a> {
    memory: &'a DecodeMemory,
    bytes: u64,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DecodeMemory {
    /// A budget of `limit` bytes for `threads` decode threads (at least one). Each thread
    /// keeps up to `min(limit / (4 × threads), 64 MiB)` between images; reservations share
    /// the rest, at least three quarters of `limit`.
    pub fn new(limit: u64, threads: usize) -> Self {
        let threads = threads.max(1) as u64;
        let keep = (limit / 4 / threads).min(KEEP_AT_MOST);
        Self::with_keep(limit, threads, keep)
    }

    /// No bound: every reservation is granted at once, and threads keep whatever they grew
    /// to (what [`decode_image`](super::decode_image) on its own does).
    pub const fn unlimited() -> Self {
        DecodeMemory {
            limit: u64::MAX,
            keep: u64::MAX,
            shared: u64::MAX,
            state: Mutex::new(State { reserved: 0, next_ticket: 0, serving: 0, peak: 0, waits: 0 }),
            freed: Condvar::new(),
        }
    }

    fn with_keep(limit: u64, threads: u64, keep: u64) -> Self {
        DecodeMemory {
            limit,
            keep,
            shared: limit - threads * keep,
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        }
    }

    /// The whole budget, bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// What a thread may keep between images, bytes; an image needing no more than this
    /// decodes without a reservation.
    pub fn keep(&self) -> u64 {
        self.keep
    }

    /// The most one reservation may hold, bytes.
    pub fn available(&self) -> u64 {
        self.shared
    }

    /// Bytes reserved now.
    pub fn reserved(&self) -> u64 {
        lock(&self.state).reserved
    }

    /// The most bytes reserved at once so far.
    pub fn peak(&self) -> u64 {
        lock(&self.state).peak
    }

    /// Reservations that had to wait for others to end.
    pub fn waits(&self) -> u64 {
        lock(&self.state).waits
    }

    /// Reserve `bytes`, waiting until the reservations asked for earlier are granted and there
    /// is room. More than [`available`](Self::available) is an error at once: waiting could
    /// not help.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation<'_>, OverBudget> {
        if bytes > self.shared {
            return Err(OverBudget { needed: bytes, available: self.shared, limit: self.limit });
        }
        let mut st = lock(&self.state);
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let mut waited = false;
        while st.serving != ticket || st.reserved + bytes > self.shared {
            waited = true;
            st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.serving += 1;
        st.reserved += bytes;
        st.peak = st.peak.max(st.reserved);
        st.waits += u64::from(waited);
        drop(st);
        // The next ticket may fit beside this one.
        self.freed.notify_all();
        Ok(Reservation { memory: self, bytes })
    }
}

impl Reservation<'_> {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        lock(&self.memory.state).reserved -= self.bytes;
        self.memory.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Wait until `n` reservations have been asked for. A reservation takes its ticket and
    /// checks for room under the lock, and gives the lock up only by waiting or once granted,
    /// so a ticket seen out belongs to a reservation that is waiting or done.
    fn asked(m: &DecodeMemory, n: u64) {
        while lock(&m.state).next_ticket < n {
            std::thread::yield_now();
        }
    }

    #[test]
    fn keep_and_shared_parts_add_up_to_the_limit() {
        let m = DecodeMemory::new(1 << 30, 2);
        assert_eq!((m.keep(), m.available()), (64 << 20, (1 << 30) - (128 << 20)));
        let m = DecodeMemory::new(1 << 30, 32);
        assert_eq!((m.keep(), m.available()), (8 << 20, 3 << 28));
        let m = DecodeMemory::new(100, 0);
        assert_eq!((m.keep(), m.available()), (25, 75));
        assert_eq!(DecodeMemory::unlimited().reserve(u64::MAX - 1).unwrap().bytes(), u64::MAX - 1);
    }

    #[test]
    fn more_than_one_reservation_may_hold_is_an_error_without_waiting() {
        let m = DecodeMemory::with_keep(1000, 2, 100);
        let held = m.reserve(800).unwrap();
        assert_eq!(m.reserve(801).unwrap_err(), OverBudget { needed: 801, available: 800, limit: 1000 });
        // Not queued: a later reservation that fits is not stuck behind it.
        drop(held);
        let r = m.reserve(800).unwrap();
        assert_eq!((m.reserved(), m.waits()), (800, 0));
        drop(r);
        assert_eq!(m.reserved(), 0);
    }

    #[test]
    fn a_reservation_waits_for_room_and_gets_it_when_one_ends() {
        let m = DecodeMemory::with_keep(1000, 2, 100);
        let first = m.reserve(500).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let r = m.reserve(300).unwrap(); // fits beside the first: 800 of 800
                tx.send(("beside", m.reserved())).unwrap();
                let second = m.reserve(500).unwrap(); // no room: waits
                tx.send(("after", m.reserved())).unwrap();
                drop((r, second));
            });
            assert_eq!(rx.recv().unwrap(), ("beside", 800));
            asked(&m, 3);
            // Its ticket is out and 500 more would pass the 800 reservations share: waiting.
            assert!(rx.try_recv().is_err(), "granted past the budget");
            assert_eq!(m.reserved(), 800);
            drop(first);
            assert_eq!(rx.recv().unwrap(), ("after", 800));
        });
        assert_eq!((m.reserved(), m.peak(), m.waits()), (0, 800, 1));
    }

    #[test]
    fn reservations_are_granted_in_the_order_asked() {
        let m = DecodeMemory::with_keep(1000, 2, 100);
        let held = m.reserve(700).unwrap();
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let big = s.spawn(|| {
                let r = m.reserve(800).unwrap();
                order.lock().unwrap().push("big");
                drop(r);
            });
            asked(&m, 2);
            // 100 would fit now beside the 700, but the big one asked first.
            let small = s.spawn(|| {
                let r = m.reserve(100).unwrap();
                order.lock().unwrap().push("small");
                drop(r);
            });
            asked(&m, 3);
            assert!(order.lock().unwrap().is_empty(), "a later reservation overtook the queue");
            assert_eq!(m.reserved(), 700);
            drop(held);
            big.join().unwrap();
            small.join().unwrap();
        });
        assert_eq!(*order.lock().unwrap(), ["big", "small"]);
        assert_eq!(m.reserved(), 0);
    }

    #[test]
    fn many_threads_never_hold_more_than_the_budget() {
        let m = DecodeMemory::with_keep(1000, 4, 50);
        let over = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (m, over) = (&m, &over);
                s.spawn(move || {
                    for i in 0..300u64 {
                        let r = m.reserve(100 + (t * 97 + i * 31) % 700).unwrap();
                        if m.reserved() > m.available() {
                            over.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        drop(r);
                    }
                });
            }
        });
        assert!(!over.into_inner());
        assert!(m.peak() <= 800 && m.peak() >= 100, "peak {}", m.peak());
        assert_eq!(m.reserved(), 0);
    }
}
