//! Window read-ahead for [`Order::ShardShuffle`](crate::sampler::Order): the epoch's shard
//! order is known when it starts, so the shards each window needs are read with a few large
//! requests, one window ahead of the batches, in exactly the order the sampler visits them.
//!
//! A driver task walks this sampler's windows in order. For each it asks the source to read
//! ahead the samples this sampler takes from it ([`SampleSource::read_ahead`]: whole shards,
//! or the coalesced spans of this rank's samples, split into parallel parts by the fetch
//! layer) and marks the window ready. A batch waits until the windows it draws from are
//! ready, then reads as usual (served from the held bytes); once every batch of a window has
//! been fetched, the window's bytes are released. The driver holds at most [`HELD`] windows
//! and reads the next one early only while both fit in the loader's `max_bytes_in_flight`,
//! so memory stays near two windows of shards however long the epoch. One exception: a batch
//! that straddles windows holds the earlier ones until it is fetched, so when every window
//! held is held by a batch waiting for the next one, that window is read whatever is held
//! (waiting for a release would wait for ever: a budget under two windows hung the epoch at
//! its first straddling batch).
//!
//! A failed read-ahead is not an error: the batches of that window read their samples
//! directly, through the loader's error policy, as without read-ahead.
//!
//! [`SampleSource::read_ahead`]: crate::source::SampleSource::read_ahead

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};

use super::AbortOnDrop;
use crate::sampler::Sampler;
use crate::source::{DynSampleSource, ReadAhead};

/// Windows whose bytes are held at once: the one being read by batches and the next.
pub(super) const HELD: usize = 2;

/// The read-ahead of one epoch run: which batches draw from which windows, and the driver.
pub(super) struct WindowAhead {
    /// Each window's range of sampler items.
    windows: Vec<Range<u64>>,
    batch: u64,
    /// Windows read ahead so far (ready for their batches), from the driver.
    ready: watch::Receiver<usize>,
    state: Arc<Held>,
    _driver: AbortOnDrop<()>,
}

/// What the driver and the batches share.
struct Held {
    /// Per window: its bytes while held.
    windows: Mutex<Vec<Option<ReadAhead>>>,
    /// Per window: batches drawing from it not yet fetched.
    remaining: Vec<AtomicU64>,
    /// Signalled when a window is released, or a batch across windows starts waiting.
    released: Notify,
    /// Per window: the first window of the batches across windows that wait for it
    /// (`usize::MAX` while none does). Those batches keep every window from there on held
    /// until they are fetched; when that covers all the driver holds, it reads this window
    /// whatever it holds.
    wanted_from: Vec<AtomicUsize>,
}

impl WindowAhead {
    /// The read-ahead for `sampler`'s run, batches of `batch` items of which `batches` are
    /// read; `None` unless the order is shard-shuffled and the source is remote.
    pub(super) fn start(
        source: &Arc<DynSampleSource>,
        sampler: &Arc<Sampler>,
        batch: u64,
        batches: u64,
        max_bytes: u64,
    ) -> Option<Self> {
        if source.capability().local || batch == 0 {
            return None;
        }
        let last_item = (batches * batch).min(sampler.len());
        let windows: Vec<Range<u64>> = sampler
            .shard_windows()?
            .into_iter()
            .map(|w| w.items.start..w.items.end.min(last_item))
            .filter(|r| !r.is_empty())
            .collect();
        let remaining = windows.iter().map(|w| AtomicU64::new((w.end - 1) / batch - w.start / batch + 1)).collect();
        let state = Arc::new(Held {
            windows: Mutex::new(windows.iter().map(|_| None).collect()),
            remaining,
            released: Notify::new(),
            wanted_from: windows.iter().map(|_| AtomicUsize::new(usize::MAX)).collect(),
        });
        let (tx, ready) = watch::channel(0);
        let driver = drive(source.clone(), sampler.clone(), windows.clone(), state.clone(), tx, max_bytes);
        Some(WindowAhead { windows, batch, ready, state, _driver: AbortOnDrop(tokio::spawn(driver)) })
    }

    /// The windows batch `b` draws from.
    fn windows_of(&self, b: u64) -> Range<usize> {
        let items = b * self.batch..(b + 1) * self.batch;
        let lo = self.windows.partition_point(|w| w.end <= items.start);
        let hi = self.windows.partition_point(|w| w.start < items.end);
        lo..hi.max(lo)
    }

    /// Wait until the windows batch `b` draws from are read ahead (or the driver gave up).
    pub(super) async fn before(&self, b: u64) {
        let windows = self.windows_of(b);
        if windows.is_empty() {
            return; // padding only
        }
        let need = windows.end;
        if windows.len() > 1 {
            // Stored before the wake-up, which the driver's next look at `wanted_from` follows.
            for later in &self.state.wanted_from[windows.start + 1..windows.end] {
                later.fetch_min(windows.start, Relaxed);
            }
            self.state.released.notify_one();
        }
        let mut ready = self.ready.clone();
        // An error means the driver is gone: the batch reads directly.
        let _ = ready.wait_for(|&r| r >= need).await;
    }

    /// Batch `b` is fetched: release the windows it was the last batch of.
    pub(super) fn after(&self, b: u64) {
        for w in self.windows_of(b) {
            if self.state.remaining[w].fetch_sub(1, Relaxed) == 1 {
                let held = self.state.windows.lock().unwrap_or_else(|e| e.into_inner())[w].take();
                drop(held);
                self.state.released.notify_one();
            }
        }
    }
}

/// Read the windows ahead one after the other, each once at most [`HELD`] - 1 others are
/// held and, if one is, the bytes of both are expected to fit in `max_bytes`; or at once when
/// every window held is held by a batch across windows that waits for it. A window that holds
/// no bytes is not held, so the driver runs past windows the disk cache serves whole to the
/// next one it must fetch.
async fn drive(
    source: Arc<DynSampleSource>,
    sampler: Arc<Sampler>,
    windows: Vec<Range<u64>>,
    state: Arc<Held>,
    ready: watch::Sender<usize>,
    max_bytes: u64,
) {
    // The next window's size is not known before it is read: the largest so far stands in,
    // counted whole where the disk cache served part of it (the next may have to be fetched).
    let mut largest = 0u64;
    for (w, items) in windows.iter().enumerate() {
        loop {
            let released = state.released.notified();
            let (held, bytes, oldest) = {
                let all = state.windows.lock().unwrap_or_else(|e| e.into_inner());
                let held = all.iter().flatten();
                (held.clone().count(), held.map(ReadAhead::bytes).sum::<u64>(), all.iter().position(Option::is_some))
            };
            // No release can come: every window held waits on a batch that waits on this one.
            let needed = oldest.is_some_and(|o| state.wanted_from[w].load(Relaxed) <= o);
            if held == 0 || needed || (held < HELD && bytes + largest <= max_bytes) {
                break;
            }
            released.await;
        }
        let indices: Vec<usize> = items.clone().filter_map(|k| sampler.get(k)).map(|i| i as usize).collect();
        if let Ok(held) = source.read_ahead(&indices).await {
            largest = largest.max(held.spanned());
            // A window whose batches all finished meanwhile (they read directly) is not kept,
            // nor one that holds nothing (the disk cache's files serve it whole): counted
            // among the held, such windows kept the driver from reading ahead the next window
            // that needs a fetch, and its batches waited for it.
            if held.bytes() > 0 && state.remaining[w].load(Relaxed) > 0 {
                state.windows.lock().unwrap_or_else(|e| e.into_inner())[w] = Some(held);
            }
        }
        if ready.send(w + 1).is_err() {
            return; // the epoch is gone
        }
    }
}
