//! Local batches built on plain threads that claim groups of consecutive batches in turn.
//!
//! Each producer takes the next group not yet claimed, so a producer that has a core to
//! itself builds more groups than one sharing its core with the consumer. The first design
//! gave producer `w` every `n`th batch: on a 2-core VM the scheduler kept the Python consumer
//! on one producer's core, that producer and the consumer took turns there, and the other
//! producer, its channel full, waited for the consumer to reach its turn: one core idle
//! 60% of the time, the three threads in lock-step at about 120 µs a round (`perf sched
//! timehist`). The consumer puts the groups back in order; at most `window` groups are
//! claimed and not yet taken by it, which bounds the memory: with the larger groups, small
//! batches are read a few million tokens ahead (the per-producer channels held up to 2^21).

use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::mpsc;

use super::job::Job;
use super::PackConfig;
use crate::batch::Batch;
use crate::error::{panic_message, Error, Result};

/// At most this many threads build one loader's batches of local documents.
const MAX_PRODUCERS: usize = 4;

/// Tokens a producer builds before handing them over together: one handoff wakes the consumer
/// (and, when the consumer is behind, a producer) once for the group, not once a batch. At 8
/// rows of 2,049 tokens a batch takes about 6 µs to build and a handoff tens of microseconds
/// of wake-ups on a 2-core VM; five alternating rounds there (uint16 ids, 8 rows) gave a
/// median of 2.36 G tokens/s with groups of 2^18 tokens (8 batches), 2.61 with 2^19 and 2.68
/// with 2^20. A group of several batches holds at most 9 MiB at int32 ids with positions
/// and mask bytes (13 MiB at int64); a batch larger than 2^20 tokens is a group of its own.
const GROUP_TOKENS: u64 = 1 << 20;
/// At most this many batches to a group.
const MAX_GROUP: u64 = 64;

/// How a loader's local batches are built: by how many threads, in groups of how many
/// batches, at most how many groups ahead of the consumer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    producers: usize,
    group: u64,
    window: u64,
}

impl Shape {
    pub(super) fn of(cfg: &PackConfig) -> Shape {
        let prefetch = cfg.prefetch.max(1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let producers = prefetch.min(cores).clamp(1, MAX_PRODUCERS);
        let group = (GROUP_TOKENS / (cfg.rows() as u64 * cfg.window() as u64).max(1)).clamp(1, MAX_GROUP);
        // One group being built by each producer and one built ahead, or `prefetch` batches
        // when that is more.
        let window = (producers as u64 + 1).max((prefetch as u64).div_ceil(group));
        Shape { producers, group, window }
    }

    /// Batches a pool keeps for these producers and a consumer holding `prefetch` of them.
    pub(super) fn batches_kept(&self, prefetch: usize) -> usize {
        usize::try_from((self.window + 1) * self.group).unwrap_or(usize::MAX).saturating_add(prefetch + 2)
    }
}

/// A group of consecutive batches and its number in the run (0 for the run's first batch).
pub(super) type Group = (u64, Vec<Result<Batch>>);

/// Where a [`TokenEpoch`](super::TokenEpoch)'s batches come from.
pub(super) struct Producers {
    pub(super) rx: mpsc::Receiver<Group>,
    /// Groups in the run.
    pub(super) groups: u64,
    pub(super) claims: Option<Arc<Claims>>,
    pub(super) task: Option<tokio::task::JoinHandle<()>>,
}

/// Which groups of a run the producers have claimed, and how many the consumer has taken.
pub(super) struct Claims {
    state: Mutex<ClaimState>,
    /// Signalled when a producer waiting for room may claim again.
    room: Condvar,
    window: u64,
}

struct ClaimState {
    /// The next group to claim.
    next: u64,
    /// Groups to build: the run's, or fewer after a group that failed.
    end: u64,
    /// Groups the consumer has taken, in order.
    taken: u64,
    /// The consumer is gone.
    closed: bool,
    /// Producers waiting for room (a notification costs a system call; none is made for none).
    waiting: usize,
}

impl Claims {
    fn new(groups: u64, window: u64) -> Self {
        let state = ClaimState { next: 0, end: groups, taken: 0, closed: false, waiting: 0 };
        Claims { state: Mutex::new(state), room: Condvar::new(), window: window.max(1) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClaimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next group to build, waiting while `window` groups are claimed and not taken;
    /// `None` when every group is claimed or the consumer is gone.
    fn claim(&self) -> Option<u64> {
        let mut s = self.lock();
        loop {
            if s.closed || s.next >= s.end {
                return None;
            }
            if s.next < s.taken.saturating_add(self.window) {
                s.next += 1;
                return Some(s.next - 1);
            }
            s.waiting += 1;
            s = self.room.wait(s).unwrap_or_else(|e| e.into_inner());
            s.waiting -= 1;
        }
    }

    /// Group `g` ended in an error: the consumer stops there, so no later group is built.
    fn failed_at(&self, g: u64) {
        let mut s = self.lock();
        s.end = s.end.min(g + 1);
        self.room.notify_all();
    }

    /// The consumer took the next group in order: room for one more.
    pub(super) fn took_one(&self) {
        let mut s = self.lock();
        s.taken += 1;
        if s.waiting > 0 {
            self.room.notify_one();
        }
    }

    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// The consumer is gone: producers waiting for room end.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }
}

/// Start the threads building batches `start..end` of `job` as `shape` says.
pub(super) fn spawn(job: &Arc<Job>, (start, end): (u64, u64), shape: Shape) -> Result<Producers> {
    let group = shape.group.max(1);
    let groups = end.saturating_sub(start).div_ceil(group);
    let claims = Arc::new(Claims::new(groups, shape.window));
    // Never full: a group is in it only between its claim and its taking.
    let (tx, rx) = mpsc::channel(claims.window as usize);
    for _ in 0..shape.producers.max(1) {
        let (job, claims_here, tx) = (job.clone(), claims.clone(), tx.clone());
        let spawned = std::thread::Builder::new().name("stoker-tokens".into()).spawn(move || {
            while let Some(g) = claims_here.claim() {
                let first = start + g * group;
                let mut built = Vec::with_capacity(group as usize);
                for b in first..(first + group).min(end) {
                    // A panic (a bug) is an error in its place, not a group never sent: the
                    // consumer would end the epoch short of it.
                    let item = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.batch_now(b)))
                        .unwrap_or_else(|p| Err(Error::internal(format!("building batch {b}: {}", panic_message(p)))));
                    let failed = item.is_err();
                    built.push(item);
                    if failed {
                        claims_here.failed_at(g);
                        break;
                    }
                }
                // The consumer gone (the epoch dropped) ends the loop.
                if tx.blocking_send((g, built)).is_err() {
                    break;
                }
            }
        });
        if let Err(e) = spawned {
            // Those started would wait for room that never comes.
            claims.close();
            return Err(Error::resource("a token producer thread", e));
        }
    }
    Ok(Producers { rx, groups, claims: Some(claims), task: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A producer waits for room past the window, claims again once the consumer takes a
    /// group, and ends when the consumer is gone; a failed group stops the claims after it.
    #[test]
    fn claims_keep_the_window_and_stop_where_told() {
        let c = Arc::new(Claims::new(10, 2));
        assert_eq!((c.claim(), c.claim()), (Some(0), Some(1)));
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || (c.claim(), c.claim()))
        };
        // The waiter's first claim needs room: given once, it gets group 2, then waits again
        // until the close ends it.
        while c.lock().waiting == 0 {
            std::thread::yield_now();
        }
        c.took_one();
        while c.lock().next < 3 || c.lock().waiting == 0 {
            std::thread::yield_now();
        }
        c.close();
        assert_eq!(waiter.join().unwrap(), (Some(2), None));

        let c = Claims::new(10, 8);
        assert_eq!(c.claim(), Some(0));
        c.failed_at(0);
        assert_eq!(c.claim(), None, "nothing past a failed group");
        let c = Claims::new(1, 8);
        assert_eq!((c.claim(), c.claim()), (Some(0), None));
    }

    /// Over an epoch of many groups built by two producers: a resume in the middle of a group
    /// goes on with the uninterrupted epoch's batches, and an epoch dropped while its producers
    /// wait for room ends their threads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resume_mid_group_goes_on_in_order_and_a_dropped_epoch_ends_its_threads() {
        use crate::tokens::tests::{corpus, ids, open};
        use crate::tokens::{PackConfig, TokenLoader};
        let dir = tempfile::tempdir().unwrap();
        corpus(dir.path(), &[50u64; 200]);
        // Rows of 4 tokens: 2,500 batches in groups of 64.
        let mut cfg = PackConfig::new(4, 1);
        cfg.prefetch = 2;
        let loader = TokenLoader::new(open(dir.path()).await, cfg).unwrap();
        let all = loader.epoch(0).unwrap().collect().await.unwrap();
        assert_eq!(all.len(), 2_500);
        let mut state = loader.state();
        (state.epoch, state.batch) = (0, 100);
        loader.load_state(state).unwrap();
        let rest = loader.epoch(0).unwrap().collect().await.unwrap();
        assert_eq!(rest.len(), 2_400);
        for (got, want) in rest.iter().zip(&all[100..]) {
            assert_eq!((got.number, ids(got)), (want.number, ids(want)));
        }

        let mut epoch = loader.epoch(1).unwrap();
        assert_eq!(epoch.next_batch().await.unwrap().unwrap().number, 0);
        assert_eq!(loader.epochs_alive(), 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while epoch.producers_waiting() == 0 {
            assert!(std::time::Instant::now() < deadline, "no producer came to wait for room");
            std::thread::yield_now();
        }
        drop(epoch);
        while loader.epochs_alive() > 0 {
            assert!(std::time::Instant::now() < deadline, "the dropped epoch's producers still wait for room");
            std::thread::yield_now();
        }
    }
}
