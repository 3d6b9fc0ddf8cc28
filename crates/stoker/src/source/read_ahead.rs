//! Bytes read ahead for samples a reader will need soon ([`SampleSource::read_ahead`]): the
//! guard a caller holds, and the set of held byte spans a ranged source serves reads from.
//!
//! [`SampleSource::read_ahead`]: super::SampleSource::read_ahead

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Bytes a source read ahead for some of its samples. Until this is dropped, reads of those
/// samples are served from memory, without requests.
#[must_use = "the bytes read ahead are released when this is dropped"]
pub struct ReadAhead {
    bytes: u64,
    /// Bytes the samples span, held or not ([`spanning`](Self::spanning)).
    spanned: u64,
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl ReadAhead {
    /// Nothing read ahead (sources that gain nothing from it).
    pub fn none() -> Self {
        ReadAhead { bytes: 0, spanned: 0, release: None }
    }

    /// `bytes` held until this is dropped, when `release` runs.
    pub fn new(bytes: u64, release: impl FnOnce() + Send + Sync + 'static) -> Self {
        ReadAhead { bytes, spanned: 0, release: Some(Box::new(release)) }
    }

    /// The samples span `bytes` in all, of which those not held are read from elsewhere (the
    /// disk cache's files): what a read-ahead of the same samples with nothing cached would
    /// hold, which a caller sizing the next read-ahead by this one goes by.
    pub fn spanning(mut self, bytes: u64) -> Self {
        self.spanned = bytes;
        self
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes the samples span: [`bytes`](Self::bytes), or more when some were left to be read
    /// from elsewhere ([`spanning`](Self::spanning)).
    pub fn spanned(&self) -> u64 {
        self.spanned.max(self.bytes)
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead").field("bytes", &self.bytes).finish()
    }
}

/// Byte spans of a source's objects held in memory, by object number. Several holders may
/// hold overlapping spans (two loaders over one source); each span goes when its holder does.
#[derive(Default)]
pub(crate) struct HeldSpans {
    spans: Mutex<HashMap<usize, Vec<Held>>>,
    next_id: AtomicU64,
}

struct Held {
    id: u64,
    range: Range<u64>,
    bytes: Bytes,
}

impl HeldSpans {
    /// Hold `spans` (object, byte range, its bytes) until the returned guard is dropped; and
    /// the holder's number, for [`let_go`](Self::let_go).
    pub(crate) fn hold(self: &Arc<Self>, spans: Vec<(usize, Range<u64>, Bytes)>) -> (ReadAhead, u64) {
        let id = self.next_id.fetch_add(1, Relaxed);
        let total = spans.iter().map(|(_, _, b)| b.len() as u64).sum();
        let mut objects = Vec::with_capacity(spans.len());
        {
            let mut map = self.spans.lock().unwrap_or_else(|e| e.into_inner());
            for (object, range, bytes) in spans {
                map.entry(object).or_default().push(Held { id, range, bytes });
                objects.push(object);
            }
        }
        // Weak: a guard outliving its source must not keep the source's memory alive.
        let me = Arc::downgrade(self);
        let guard = ReadAhead::new(total, move || {
            let Some(me) = me.upgrade() else { return };
            let mut map = me.spans.lock().unwrap_or_else(|e| e.into_inner());
            for object in objects {
                if let Some(held) = map.get_mut(&object) {
                    held.retain(|h| h.id != id);
                    if held.is_empty() {
                        map.remove(&object);
                    }
                }
            }
        });
        (guard, id)
    }

    /// Let go of the spans of holder `id` that `elsewhere` says are now served from elsewhere
    /// (the disk cache's files); reads of them go there. Returns the bytes let go. The holder's
    /// guard still reports them in [`ReadAhead::bytes`]: a read-ahead paced by it reads no
    /// further ahead for this.
    pub(crate) fn let_go(&self, id: u64, elsewhere: impl Fn(usize, &Range<u64>) -> bool) -> u64 {
        let mut gone = 0;
        let mut map = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        for (&object, held) in map.iter_mut() {
            held.retain(|h| {
                let keep = h.id != id || !elsewhere(object, &h.range);
                gone += if keep { 0 } else { h.bytes.len() as u64 };
                keep
            });
        }
        map.retain(|_, held| !held.is_empty());
        gone
    }

    /// `range` of `object` if one held span covers it (a slice, no copy).
    pub(crate) fn get(&self, object: usize, range: &Range<u64>) -> Option<Bytes> {
        let map = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        let h = map.get(&object)?.iter().find(|h| h.range.start <= range.start && range.end <= h.range.end)?;
        let at = (range.start - h.range.start) as usize;
        Some(h.bytes.slice(at..at + (range.end - range.start) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_serve_until_their_guard_goes() {
        let held = Arc::new(HeldSpans::default());
        let (a, _) = held.hold(vec![(3, 100..110, Bytes::from_static(b"0123456789"))]);
        assert_eq!(a.bytes(), 10);
        assert_eq!(held.get(3, &(102..105)).as_deref(), Some(&b"234"[..]));
        assert_eq!(held.get(3, &(105..111)), None, "not covered whole");
        assert_eq!(held.get(4, &(102..105)), None, "another object");
        let (b, _) = held.hold(vec![(3, 100..110, Bytes::from_static(b"abcdefghij"))]);
        drop(a);
        assert_eq!(held.get(3, &(100..101)).as_deref(), Some(&b"a"[..]), "the other holder's span stays");
        drop(b);
        assert_eq!(held.get(3, &(100..101)), None);
    }

    #[test]
    fn a_holder_lets_go_of_the_spans_served_elsewhere_and_keeps_the_rest() {
        let held = Arc::new(HeldSpans::default());
        let bytes = |b: &'static [u8]| Bytes::from_static(b);
        let (a, id) = held.hold(vec![(1, 0..4, bytes(b"abcd")), (1, 10..14, bytes(b"efgh")), (2, 0..2, bytes(b"ij"))]);
        let (other, _) = held.hold(vec![(1, 0..4, bytes(b"ABCD"))]);
        // Object 1's first span is on disk now: that span of this holder goes, the rest stays.
        assert_eq!(held.let_go(id, |o, r| o == 1 && r.start == 0), 4);
        assert_eq!(held.get(1, &(1..2)).as_deref(), Some(&b"B"[..]), "the other holder's span of it stays");
        assert_eq!(held.get(1, &(11..12)).as_deref(), Some(&b"f"[..]));
        assert_eq!(held.get(2, &(0..2)).as_deref(), Some(&b"ij"[..]));
        assert_eq!(a.bytes(), 10, "the guard still counts what it fetched");
        drop(other);
        assert_eq!(held.get(1, &(0..1)), None, "gone from memory: read from elsewhere");
        assert_eq!(held.let_go(id, |_, _| true), 6);
        assert_eq!(held.get(2, &(0..2)), None);
        drop(a);
    }
}
