//! Range merging and splitting, written once: every reader that turns wanted byte ranges
//! into reads (tar batch planning, the local direct path, remote fetches, the block cache's
//! runs of missing blocks) plans them here, under one [`Policy`].
//!
//! The model is object_store's `coalesce_ranges`: sort, merge ranges whose gap is small
//! enough that reading the bytes between them costs less than another request, cap how big
//! a merged read grows, and split big reads into parts that can be fetched in parallel.

use std::ops::Range;

// The defaults behind the `coalesce_gap`, `max_read` and `part_size` options.
// `FetchConfig::default` takes its gap and part size from here; `SourceOptions` (uri.rs)
// still spells the same numbers for the local gap and `max_read` itself.

/// Merged reads never grow past this (unless one wanted range alone is bigger): 4 MiB keeps
/// a batch's reads parallel and bounds what one read holds in memory.
pub const MAX_MERGED: u64 = 4 << 20;
/// Remote reads bigger than this are split into parts of this size fetched in parallel: one
/// HTTP stream is slower than several, and a part is the unit a retry repeats.
pub const PART: u64 = 8 << 20;
/// Local reads merge across gaps up to this: a positioned read costs about as much as
/// copying 16 KiB from the page cache.
pub const LOCAL_GAP: u64 = 16 << 10;
/// Remote reads merge across gaps up to this: a request costs about what 1 MiB of transfer
/// does (first-byte latency times throughput).
pub const REMOTE_GAP: u64 = 1 << 20;

/// How wanted ranges become reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Ranges at most this many bytes apart are read as one (the bytes between are read and
    /// dropped).
    pub gap: u64,
    /// A merged read grows past this many bytes only by ranges that overlap it, never by
    /// bridging a gap or appending an adjacent range (`u64::MAX`: no cap).
    pub max_merged: u64,
}

impl Policy {
    /// Merge across `gap`, reads capped at `max_merged`.
    pub fn new(gap: u64, max_merged: u64) -> Self {
        Policy { gap, max_merged: max_merged.max(1) }
    }

    /// Merge across `gap` with no cap on the merged size (the caller splits big reads).
    pub fn uncapped(gap: u64) -> Self {
        Policy { gap, max_merged: u64::MAX }
    }
}

/// Reads planned for a set of wanted ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// The reads, none empty: sorted and disjoint from [`merge`], as given from
    /// [`each`](Merged::each).
    pub reads: Vec<Range<u64>>,
    /// For each wanted range (in the order given), the read that covers it; `None` for an
    /// empty range, which needs no read.
    pub of: Vec<Option<usize>>,
}

impl Merged {
    /// Where wanted range `i` lies: its read's number and the offset of the range in it.
    pub fn locate(&self, i: usize, wanted: &Range<u64>) -> Option<(usize, usize)> {
        let r = self.of[i]?;
        Some((r, (wanted.start - self.reads[r].start) as usize))
    }

    /// The plan that reads each non-empty range of `ranges` as it is, unmerged (in order,
    /// so possibly unsorted or overlapping: for a reader that merges on its own).
    pub fn each(ranges: &[Range<u64>]) -> Merged {
        let mut reads = Vec::with_capacity(ranges.len());
        let of = ranges
            .iter()
            .map(|r| {
                (r.end > r.start).then(|| {
                    reads.push(r.clone());
                    reads.len() - 1
                })
            })
            .collect();
        Merged { reads, of }
    }

    /// The bytes of each of `wanted` (the ranges this plan was made for, in order) cut out
    /// of `got`, the bytes of each read: slices, no copy (an empty range is empty).
    pub fn cut(&self, wanted: &[Range<u64>], got: &[bytes::Bytes]) -> Vec<bytes::Bytes> {
        wanted
            .iter()
            .enumerate()
            .map(|(i, w)| match self.locate(i, w) {
                Some((k, at)) => got[k].slice(at..at + (w.end - w.start) as usize),
                None => bytes::Bytes::new(),
            })
            .collect()
    }
}

/// Merge `ranges` (in any order, possibly overlapping or repeated) into reads under `policy`.
pub fn merge(ranges: &[Range<u64>], policy: &Policy) -> Merged {
    let mut order: Vec<usize> = (0..ranges.len()).filter(|&i| ranges[i].end > ranges[i].start).collect();
    order.sort_unstable_by_key(|&i| (ranges[i].start, ranges[i].end));
    let mut reads: Vec<Range<u64>> = Vec::new();
    let mut of = vec![None; ranges.len()];
    for i in order {
        let r = &ranges[i];
        if let Some(m) = reads.last_mut() {
            let end = m.end.max(r.end);
            // Overlap must merge (reads stay disjoint); a gap or an adjacent range merges
            // only within the cap.
            let overlaps = r.start < m.end;
            if overlaps || (r.start <= m.end.saturating_add(policy.gap) && end - m.start <= policy.max_merged) {
                m.end = end;
                of[i] = Some(reads.len() - 1);
                continue;
            }
        }
        reads.push(r.clone());
        of[i] = Some(reads.len() - 1);
    }
    Merged { reads, of }
}

/// Split `range` into consecutive parts of at most `part` bytes that tile it exactly (an
/// empty range has no parts).
pub fn split(range: Range<u64>, part: u64) -> impl Iterator<Item = Range<u64>> {
    let part = part.max(1);
    let mut at = range.start;
    std::iter::from_fn(move || {
        (at < range.end).then(|| {
            let end = at.saturating_add(part).min(range.end);
            let p = at..end;
            at = end;
            p
        })
    })
}

/// Check what [`merge`] and [`split`] promise for `ranges` under `policy` and parts of
/// `part` bytes; panics naming the broken promise. Shared by the property test and the
/// fuzz target.
#[doc(hidden)]
pub fn check(ranges: &[Range<u64>], policy: &Policy, part: u64) {
    let m = merge(ranges, policy);
    assert_eq!(m.of.len(), ranges.len());
    // Splits are checked on reads of a bounded number of parts (a read across a gap of
    // `u64::MAX` could have more parts than memory holds) and on every wanted range.
    let few_parts = |r: &&Range<u64>| (r.end - r.start) / part.max(1) <= 1 << 16;
    for r in m.reads.iter().chain(ranges.iter().filter(|r| r.end > r.start)).filter(few_parts) {
        check_split(r, part);
    }
    for w in m.reads.windows(2) {
        assert!(
            w[0].end < w[1].start || (w[0].end == w[1].start && policy.max_merged < u64::MAX),
            "reads {w:?} not sorted and disjoint"
        );
    }
    for (i, r) in ranges.iter().enumerate() {
        match m.of[i] {
            None => assert!(r.end <= r.start, "non-empty range {r:?} has no read"),
            Some(k) => {
                let read = &m.reads[k];
                assert!(read.start <= r.start && r.end <= read.end, "read {read:?} does not cover {r:?}");
                let covering = m.reads.iter().filter(|x| x.start <= r.start && r.end <= x.end).count();
                assert_eq!(covering, 1, "{r:?} is covered by {covering} reads");
            }
        }
    }
    for (k, read) in m.reads.iter().enumerate() {
        assert!(read.end > read.start, "empty read {read:?}");
        // What the read is made of, in order: it must start and end on wanted bytes and
        // bridge no hole wider than the gap.
        let mut members: Vec<&Range<u64>> =
            (0..ranges.len()).filter(|&i| m.of[i] == Some(k)).map(|i| &ranges[i]).collect();
        members.sort_by_key(|r| (r.start, r.end));
        assert_eq!(members.first().map(|r| r.start), Some(read.start), "read {read:?} starts on no wanted byte");
        let mut covered = members[0].end;
        for r in &members[1..] {
            if r.start >= covered {
                assert!(
                    r.start - covered <= policy.gap,
                    "read {read:?} bridges a gap of {} > {}",
                    r.start - covered,
                    policy.gap
                );
                let grown = r.end - read.start;
                assert!(
                    grown <= policy.max_merged,
                    "read {read:?} grew to {grown} past the cap by a range it does not overlap"
                );
            }
            covered = covered.max(r.end);
        }
        assert_eq!(covered, read.end, "read {read:?} ends on no wanted byte");
    }
}

/// [`split`] tiles `range` (non-empty) with parts of at most `part` bytes.
fn check_split(range: &Range<u64>, part: u64) {
    let parts: Vec<Range<u64>> = split(range.clone(), part).collect();
    assert_eq!(parts.first().map(|p| p.start), Some(range.start));
    assert_eq!(parts.last().map(|p| p.end), Some(range.end));
    for w in parts.windows(2) {
        assert_eq!(w[0].end, w[1].start, "parts {w:?} do not tile {range:?}");
    }
    assert!(parts.iter().all(|p| p.end > p.start && p.end - p.start <= part.max(1)), "a part of {range:?} is too big");
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn each_reads_every_range_as_given_and_cuts_it_back() {
        let ranges = [10..20, 0..0, 15..30, 5..6];
        let m = Merged::each(&ranges);
        assert_eq!(m.reads, vec![10..20, 15..30, 5..6]);
        assert_eq!(m.of, vec![Some(0), None, Some(1), Some(2)]);
        let got: Vec<bytes::Bytes> = m.reads.iter().map(|r| (r.start as u8..r.end as u8).collect()).collect();
        let cut = m.cut(&ranges, &got);
        for (r, c) in ranges.iter().zip(&cut) {
            assert_eq!(c.to_vec(), (r.start as u8..r.end as u8).collect::<Vec<u8>>());
        }
    }

    #[test]
    fn merges_within_gap_and_cap_and_splits() {
        let m = merge(&[0..10, 15..20, 100..130, 12..14, 7..7], &Policy::uncapped(5));
        assert_eq!(m.reads, vec![0..20, 100..130]);
        assert_eq!(m.of, vec![Some(0), Some(0), Some(1), Some(0), None]);
        assert_eq!(split(100..130, 16).collect::<Vec<_>>(), vec![100..116, 116..130]);
        let capped = merge(&[0..10, 10..20, 20..30], &Policy::new(0, 20));
        assert_eq!(capped.reads, vec![0..20, 20..30], "adjacent ranges stop at the cap");
        let overlapping = merge(&[0..15, 10..30], &Policy::new(0, 20));
        assert_eq!(overlapping.reads, vec![0..30], "overlap merges past the cap: reads stay disjoint");
        assert_eq!(split(5..5, 4).count(), 0);
    }

    fn ranges() -> impl Strategy<Value = Vec<Range<u64>>> {
        // Small offsets make merges, overlaps and repeats common; a few huge ones test the
        // arithmetic at the top of the u64 range.
        let small = (0u64..2000, 0u64..300).prop_map(|(s, l)| s..s + l);
        let huge =
            (0u64..1000, 0u64..1000).prop_map(|(s, l)| u64::MAX - 2000 + s..(u64::MAX - 2000 + s).saturating_add(l));
        prop::collection::vec(prop_oneof![8 => small, 1 => huge], 0..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn merge_and_split_keep_their_promises(
            ranges in ranges(),
            gap in prop_oneof![Just(0u64), 0u64..200, Just(u64::MAX)],
            cap in prop_oneof![Just(u64::MAX), 1u64..1000],
            part in 1u64..500,
        ) {
            check(&ranges, &Policy::new(gap, cap), part);
        }
    }
}
