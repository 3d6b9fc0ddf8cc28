//! Which cached block to drop. A reader that knows what it will read (the Loader knows the
//! rest of this epoch's order and the next epoch's) gives the cache a [`Plan`]: for each
//! block, when it will be read. The cache then drops the block whose next use is furthest
//! away, blocks with no known future use first, and does not store a block that would be the
//! first to go (Belady's rule with its bypass). That is what keeps a repeated scan over data
//! larger than the cache at about cache/data hits where least-recently-used drops every
//! block just before it is needed again. Without a plan the order is least recently used.
//!
//! Time is the reader's: any increasing count (the Loader uses sample positions of its rank's
//! order), with a clock the reader advances as it goes. A use at or after the clock is
//! future; one before it is past.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub use crate::uri::Eviction;

/// Most (block, use) pairs a plan keeps (4 bytes each); later uses are left out, and the
/// blocks they are for count as having no known use.
pub const MAX_PLANNED_USES: usize = 8 << 20;
/// Plans over objects of more blocks than this are not made (each block costs about 24 bytes).
pub const MAX_PLANNED_BLOCKS: u64 = 8 << 20;

/// When each block will be read: for every block of the planned objects that is read at
/// all, its use times in ascending order, and the reader's clock.
pub struct Plan {
    /// Block keys, sorted, and the block number (into `starts`) of each.
    keys: Vec<u128>,
    ids: Vec<u32>,
    /// `times[starts[b]..starts[b + 1]]` are block `b`'s use times.
    starts: Vec<u32>,
    times: Vec<u32>,
    /// One bit per use: set when the use is several reads of the block at its time (a shard
    /// shuffle's window, read by each of its batches; ranks of a node at one pace), so a read
    /// for it does not end it.
    shared: Vec<u64>,
    clock: Arc<AtomicU64>,
    /// The block size, and per object its first block number and size: what a block holds.
    block: u64,
    base: Vec<u64>,
    sizes: Vec<u64>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan").field("blocks", &self.keys.len()).field("uses", &self.times.len()).finish()
    }
}

/// Calls its sink with `(time, object, byte range)` for every read, times non-decreasing.
pub type Uses<'a> = &'a (dyn Fn(&mut dyn FnMut(u64, usize, Range<u64>)) + Sync);

impl Plan {
    /// The plan of reads over `objects` (each its block-key function and size) in blocks of
    /// `block` bytes: `uses` is called twice (it must yield the same both times). `None` when
    /// the objects have too many blocks to plan (see [`MAX_PLANNED_BLOCKS`]).
    pub fn build(
        block: u64,
        objects: &[(&(dyn Fn(u64) -> u128 + Sync), u64)],
        uses: Uses<'_>,
        clock: Arc<AtomicU64>,
    ) -> Option<Plan> {
        let block = block.max(1);
        let mut base = Vec::with_capacity(objects.len() + 1);
        let mut total = 0u64;
        for (_, size) in objects {
            base.push(total);
            total += size.div_ceil(block);
        }
        if total > MAX_PLANNED_BLOCKS {
            return None;
        }
        let blocks_of = |object: usize, r: &Range<u64>| {
            let first = base.get(object).copied();
            let last_block = objects.get(object).map_or(0, |(_, size)| size.div_ceil(block));
            first
                .filter(|_| r.end > r.start)
                .map(|b0| b0 + r.start / block..b0 + ((r.end - 1) / block + 1).min(last_block))
                .unwrap_or(0..0)
        };
        // Pass 1: uses per block (a block read twice at one time counts once), up to the cap;
        // the cap falls between two times so both passes stop at the same use.
        let mut count = vec![0u32; total as usize];
        let mut last = vec![u32::MAX; total as usize];
        let (mut kept, mut cut) = (0usize, u64::MAX);
        uses(&mut |t, object, r| {
            if t >= cut {
                return;
            }
            let Ok(t32) = u32::try_from(t) else {
                cut = t;
                return;
            };
            let fresh = blocks_of(object, &r).filter(|&b| last[b as usize] != t32).count();
            if kept + fresh > MAX_PLANNED_USES {
                cut = t;
                return;
            }
            for b in blocks_of(object, &r) {
                if last[b as usize] != t32 {
                    last[b as usize] = t32;
                    count[b as usize] += 1;
                    kept += 1;
                }
            }
        });
        if cut != u64::MAX {
            // Uses at the cut time were partly counted: count again without them.
            count.iter_mut().for_each(|c| *c = 0);
            last.iter_mut().for_each(|l| *l = u32::MAX);
            uses(&mut |t, object, r| {
                if t < cut {
                    for b in blocks_of(object, &r) {
                        if last[b as usize] != t as u32 {
                            last[b as usize] = t as u32;
                            count[b as usize] += 1;
                        }
                    }
                }
            });
        }
        let mut starts = Vec::with_capacity(total as usize + 1);
        let mut at = 0u32;
        for c in &count {
            starts.push(at);
            at += c;
        }
        starts.push(at);
        // Pass 2: the times, in place.
        let mut times = vec![0u32; at as usize];
        let mut shared = vec![0u64; (at as usize).div_ceil(64)];
        let mut fill: Vec<u32> = starts[..total as usize].to_vec();
        last.iter_mut().for_each(|l| *l = u32::MAX);
        uses(&mut |t, object, r| {
            if t < cut {
                for b in blocks_of(object, &r) {
                    let b = b as usize;
                    if last[b] != t as u32 && fill[b] < starts[b + 1] {
                        last[b] = t as u32;
                        times[fill[b] as usize] = t as u32;
                        fill[b] += 1;
                    } else if last[b] == t as u32 && fill[b] > starts[b] {
                        let u = fill[b] as usize - 1;
                        shared[u / 64] |= 1 << (u % 64);
                    }
                }
            }
        });
        drop((fill, last));
        let mut keyed: Vec<(u128, u32)> = Vec::new();
        for (o, (key_of, size)) in objects.iter().enumerate() {
            for b in 0..size.div_ceil(block) {
                let id = (base[o] + b) as u32;
                if count[id as usize] > 0 {
                    keyed.push((key_of(b), id));
                }
            }
        }
        keyed.sort_unstable_by_key(|&(k, _)| k);
        let (keys, ids) = keyed.into_iter().unzip();
        let sizes = objects.iter().map(|(_, size)| *size).collect();
        Some(Plan { keys, ids, starts, times, shared, clock, block, base, sizes })
    }

    /// The reader's current time.
    pub fn now(&self) -> u64 {
        self.clock.load(Relaxed)
    }

    /// The first use of block `key` at or after the clock, if the plan knows one; with
    /// `serving`, the one after that (the block is being read for that first use now), unless
    /// that use is several reads (see `use_index`).
    pub fn next_use(&self, key: u128, serving: bool) -> Option<u64> {
        self.use_index(key, serving).map(|u| u64::from(self.times[u]))
    }

    /// How many uses of block `key` fall at or after the clock and before `horizon`; with
    /// `serving`, not counting the first (the one the block is being read for now) unless it
    /// is several reads.
    pub fn uses_before(&self, key: u128, serving: bool, horizon: u64) -> u64 {
        let Ok(i) = self.keys.binary_search(&key) else { return 0 };
        let b = self.ids[i] as usize;
        let (from, to) = (self.current(b, serving), self.starts[b + 1] as usize);
        let before = from + self.times[from.min(to)..to].partition_point(|&t| u64::from(t) < horizon);
        before.saturating_sub(from) as u64
    }

    /// Blocks the plan knows a use of.
    pub fn blocks(&self) -> usize {
        self.keys.len()
    }

    /// The planned use block `key` is read for now (the first at or after the clock; with
    /// `serving`, the one after), as an index into all the plan's uses. A use that is several
    /// reads of the block (a window of a shard shuffle, read by every batch of the window) is
    /// not over when one of them is served: it stays the block's use until the clock passes
    /// it, or the block, ranked by its use after, would be the first evicted under the
    /// batches still reading it.
    pub(crate) fn use_index(&self, key: u128, serving: bool) -> Option<usize> {
        let i = self.keys.binary_search(&key).ok()?;
        let b = self.ids[i] as usize;
        let at = self.current(b, serving);
        (at < self.starts[b + 1] as usize).then_some(at)
    }

    /// Block `b`'s use a read now is for, as [`use_index`](Self::use_index) says, or the end
    /// of its uses.
    fn current(&self, b: usize, serving: bool) -> usize {
        let (from, to) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        let now = self.now();
        let first = from + self.times[from..to].partition_point(|&t| u64::from(t) < now);
        first + usize::from(serving && first < to && !self.is_shared(first))
    }

    /// Whether use `u` is several reads of its block at its time.
    fn is_shared(&self, u: usize) -> bool {
        self.shared.get(u / 64).is_some_and(|w| w >> (u % 64) & 1 == 1)
    }

    /// All planned uses, over every block.
    pub(crate) fn use_count(&self) -> usize {
        self.times.len()
    }

    /// Blocks numbered by the plan (some with no use).
    pub(crate) fn block_count(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// The bytes block `b` (by the plan's numbering) holds: a whole block, or the end of its
    /// object.
    pub(crate) fn block_len(&self, b: usize) -> u64 {
        let o = self.base.partition_point(|&first| first <= b as u64).saturating_sub(1);
        let (first, size) = (self.base.get(o).copied().unwrap_or(0), self.sizes.get(o).copied().unwrap_or(0));
        size.saturating_sub((b as u64 - first) * self.block).min(self.block)
    }

    /// The time of use `u`.
    pub(crate) fn use_time(&self, u: usize) -> u32 {
        self.times[u]
    }

    /// Block `b`'s uses (by the plan's numbering), as indices into all the plan's uses, in
    /// time order.
    pub(crate) fn uses_of(&self, b: usize) -> std::ops::Range<usize> {
        self.starts[b] as usize..self.starts[b + 1] as usize
    }

    /// Move the reader's clock (tests stand in for a reader).
    #[cfg(test)]
    pub(crate) fn set_now(&self, t: u64) {
        self.clock.store(t, Relaxed);
    }
}

/// Ranks at or above this are "no known future use": least recently used first among them.
const UNKNOWN: u64 = 1 << 63;

/// The cached entries in the order they go: [`Ranks::victim`] is the entry whose next use is
/// furthest away under the plan (those without one first, least recently used among them),
/// or the least recently used without a plan.
#[derive(Default)]
pub(crate) struct Ranks {
    /// Per key: its rank, length and the tick it was last used at.
    entries: HashMap<u128, Entry>,
    /// `(rank, key)`, highest rank last: the next victim.
    order: BTreeSet<(u64, u128)>,
    bytes: u64,
    tick: u64,
    plan: Option<Arc<Plan>>,
    /// Whether a block read now may be written (the plan's admission, see
    /// [`super::admission`]); all may without one.
    admission: Option<Admit>,
}

/// Whether a block, read now, may be written to the cache.
pub(crate) type Admit = Arc<dyn Fn(u128) -> bool + Send + Sync>;

#[derive(Clone, Copy)]
struct Entry {
    rank: u64,
    len: u64,
    last: u64,
}

impl Ranks {
    /// Bytes of the entries held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
    pub(crate) fn contains(&self, key: u128) -> bool {
        self.entries.contains_key(&key)
    }
    /// The keys of entries last used at or before tick `t`.
    pub(crate) fn keys_used_by(&self, t: u64) -> impl Iterator<Item = u128> + '_ {
        self.entries.iter().filter(move |(_, e)| e.last <= t).map(|(&k, _)| k)
    }
    /// The tick of the latest use.
    pub(crate) fn tick(&self) -> u64 {
        self.tick
    }

    /// The rank of `key` last used at tick `last`; `serving` when it is being read (or
    /// written) now for its next planned use, so the use that counts is the one after.
    fn rank(&self, key: u128, last: u64, serving: bool) -> u64 {
        let lru = UNKNOWN + (UNKNOWN - 1 - last.min(UNKNOWN - 1));
        match &self.plan {
            Some(p) => p.next_use(key, serving).map_or(lru, |t| t.min(UNKNOWN - 1)),
            None => lru,
        }
    }

    /// Follow a new plan (or none: least recently used), writing blocks only at the uses
    /// `admission` allows (all without one).
    pub(crate) fn set_plan(&mut self, plan: Option<Arc<Plan>>, admission: Option<Admit>) {
        self.plan = plan;
        self.admission = admission;
        let keys: Vec<(u128, u64)> = self.entries.iter().map(|(&k, e)| (k, e.last)).collect();
        self.order.clear();
        for (k, last) in keys {
            let rank = self.rank(k, last, false);
            self.entries.get_mut(&k).expect("listed").rank = rank;
            self.order.insert((rank, k));
        }
    }

    /// Add `key` (or refresh it), used now: read or written for its next planned use. Entries
    /// `seen` on disk but not used take that as their age instead (older than everything
    /// used since) and rank by their next use.
    pub(crate) fn insert(&mut self, key: u128, len: u64, seen: Option<u64>) {
        let last = seen.unwrap_or_else(|| {
            self.tick += 1;
            self.tick
        });
        self.tick = self.tick.max(last);
        if let Some(old) = self.entries.remove(&key) {
            self.order.remove(&(old.rank, key));
            self.bytes -= old.len;
        }
        let rank = self.rank(key, last, seen.is_none());
        self.entries.insert(key, Entry { rank, len, last });
        self.order.insert((rank, key));
        self.bytes += len;
    }

    /// `key` was read: it is now the most recently used, and its next use moved on.
    pub(crate) fn touch(&mut self, key: u128) {
        if let Some(e) = self.entries.get(&key).copied() {
            self.insert(key, e.len, None);
        }
    }

    pub(crate) fn remove(&mut self, key: u128) -> Option<u64> {
        let e = self.entries.remove(&key)?;
        self.order.remove(&(e.rank, key));
        self.bytes -= e.len;
        Some(e.len)
    }

    /// Re-rank entries whose planned use the clock has passed (their next use is later).
    fn refresh(&mut self) {
        let Some(now) = self.plan.as_ref().map(|p| p.now()) else { return };
        while let Some(&(rank, key)) = self.order.first() {
            if rank >= now.min(UNKNOWN) {
                break;
            }
            self.order.remove(&(rank, key));
            let e = self.entries.get_mut(&key).expect("ordered entries are held");
            let last = e.last;
            let new = self
                .plan
                .as_ref()
                .and_then(|p| p.next_use(key, false))
                .map_or(UNKNOWN + (UNKNOWN - 1 - last.min(UNKNOWN - 1)), |t| t.min(UNKNOWN - 1));
            // A rank below the clock again cannot happen (next_use is at or after it), so
            // this loop ends.
            e.rank = new.max(now);
            self.order.insert((e.rank, key));
        }
    }

    /// The entry to drop next, if any.
    pub(crate) fn victim(&mut self) -> Option<(u128, u64)> {
        self.refresh();
        let &(_, key) = self.order.last()?;
        Some((key, self.entries[&key].len))
    }

    /// Whether a missing block `key` of `len` bytes, of which a read needs `piece` bytes now,
    /// is worth fetching whole and storing rather than fetching just the piece: when the
    /// cache is full, the plan must see it read often enough before it would be dropped
    /// (before the next victim's next use) to pay for the rest of the block. Always true
    /// without a plan (least recently used caches whole blocks).
    pub(crate) fn worth_fetching_whole(&mut self, key: u128, len: u64, piece: u64, limit: u64) -> bool {
        let Some(plan) = self.plan.clone() else { return true };
        if !self.admitted(key) {
            // It will not be written: fetch what the read needs.
            return piece >= len;
        }
        // While there is room, or the next victim is an entry nobody will read, keeping the
        // block costs nothing (and later epochs, beyond the plan, read it again).
        if piece >= len || self.bytes + len <= limit {
            return true;
        }
        self.refresh();
        let horizon = match self.order.last() {
            Some(&(worst, _)) if worst < UNKNOWN => worst,
            _ => return true,
        };
        let reads = plan.uses_before(key, true, horizon) + 1;
        reads.saturating_mul(piece) >= len
    }

    /// Whether the plan's admission lets block `key`, read now, be written: false when the
    /// cache's run over the plan drops it unread or bypasses it; true without an admission.
    pub(crate) fn admitted(&self, key: u128) -> bool {
        self.admission.as_ref().is_none_or(|admit| admit(key))
    }

    /// Whether `key`, if stored now, would rank before the next victim (Belady's bypass: a
    /// block that would be the first to go is not stored). Always true without a plan: a
    /// new block is the most recently used.
    pub(crate) fn worth_storing(&mut self, key: u128) -> bool {
        if self.plan.is_none() {
            return true;
        }
        self.refresh();
        let rank = self.rank(key, self.tick + 1, true);
        self.order.last().is_none_or(|&(worst, _)| rank < worst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan over objects of `sizes` bytes in blocks of 10, block key = object * 1000 + block.
    fn plan(sizes: &[u64], reads: &[(u64, usize, Range<u64>)], clock: &Arc<AtomicU64>) -> Plan {
        let keyers: Vec<Box<dyn Fn(u64) -> u128 + Sync>> =
            (0..sizes.len()).map(|o| Box::new(move |b: u64| (o * 1000) as u128 + b as u128) as _).collect();
        let objects: Vec<(&(dyn Fn(u64) -> u128 + Sync), u64)> =
            keyers.iter().zip(sizes).map(|(k, &s)| (&**k, s)).collect();
        let uses = |sink: &mut dyn FnMut(u64, usize, Range<u64>)| {
            for (t, o, r) in reads {
                sink(*t, *o, r.clone());
            }
        };
        Plan::build(10, &objects, &uses, clock.clone()).unwrap()
    }

    #[test]
    fn a_use_of_several_reads_is_not_over_when_one_is_served() {
        let clock = Arc::new(AtomicU64::new(0));
        // Block 0 is read three times at time 10 (a window's batches), then at 30; block 1
        // once at 10 and at 30.
        let reads = [(10, 0, 0..1), (10, 0, 2..3), (10, 0, 10..11), (10, 0, 4..5), (30, 0, 0..1), (30, 0, 10..11)];
        let p = plan(&[20], &reads, &clock);
        assert_eq!(p.next_use(0, true), Some(10), "more reads of the use at 10 are to come");
        assert_eq!(p.next_use(1, true), Some(30), "one read at 10: served, the next use is at 30");
        assert_eq!(p.uses_before(0, true, 100), 2);
        assert_eq!(p.uses_before(1, true, 100), 1);
        clock.store(11, Relaxed);
        assert_eq!(p.next_use(0, false), Some(30), "the clock passed the window");
        assert_eq!(p.next_use(0, true), None, "read at 30 once: nothing after");
    }

    #[test]
    fn a_plan_knows_each_blocks_next_use_after_the_clock() {
        let clock = Arc::new(AtomicU64::new(0));
        // Object 0: 35 bytes (blocks 0..4); object 1: 10 bytes.
        let p = plan(&[35, 10], &[(0, 0, 5..25), (3, 1, 0..10), (3, 1, 2..3), (7, 0, 30..35), (9, 0, 12..13)], &clock);
        assert_eq!(p.next_use(0, false), Some(0));
        assert_eq!(p.next_use(1, false), Some(0));
        assert_eq!(p.next_use(2, false), Some(0));
        assert_eq!(p.next_use(3, false), Some(7));
        assert_eq!(p.next_use(1000, false), Some(3));
        assert_eq!(p.next_use(5, false), None, "no such block");
        assert_eq!(p.next_use(1, true), Some(9), "read now for its use at 0, block 1 is next read at 9");
        assert_eq!(p.next_use(0, true), None);
        clock.store(1, Relaxed);
        assert_eq!(p.next_use(1, false), Some(9));
        assert_eq!(p.next_use(0, false), None, "block 0 is never read again");
        clock.store(4, Relaxed);
        assert_eq!(p.next_use(1000, false), None, "one use at time 3, counted once");
        assert_eq!(p.blocks(), 5);
    }

    #[test]
    fn eviction_follows_the_plan_and_lru_without_one() {
        let clock = Arc::new(AtomicU64::new(0));
        let mut r = Ranks::default();
        for k in [1u128, 2, 3] {
            r.insert(k, 10, None);
        }
        assert_eq!(r.victim(), Some((1, 10)), "least recently used");
        r.touch(1);
        assert_eq!(r.victim(), Some((2, 10)));
        assert!(r.worth_storing(9), "without a plan every new block is stored");

        // Blocks 0..3 of object 0, found on disk: used at 5, 1, never, 9 (and block 1 at 6).
        let p = plan(&[40], &[(1, 0, 10..11), (5, 0, 0..1), (6, 0, 10..11), (9, 0, 30..31)], &clock);
        let mut r = Ranks::default();
        r.set_plan(Some(Arc::new(p)), None);
        for k in [0u128, 1, 2, 3] {
            r.insert(k, 10, Some(0));
        }
        assert_eq!(r.bytes(), 40);
        assert_eq!(r.victim(), Some((2, 10)), "no known use goes first");
        r.remove(2);
        assert_eq!(r.victim(), Some((3, 10)), "then the furthest use");
        // Block 1 is read now for its use at 1; its next use is 6, after block 0's at 5.
        r.touch(1);
        r.remove(3);
        assert_eq!(r.victim(), Some((1, 10)));
        // Past time 6, block 1 has no use left; block 0 (used at 5) neither: least recent first.
        clock.store(7, Relaxed);
        assert_eq!(r.victim(), Some((0, 10)));
    }

    #[test]
    fn a_block_that_would_go_first_is_not_stored() {
        let clock = Arc::new(AtomicU64::new(0));
        // Block 2 is read at 8 and again at 20; the others at 1 and 2, and again at 10 and 11.
        let reads = [(1, 0, 0..1), (2, 0, 10..11), (8, 0, 20..21), (10, 0, 0..1), (11, 0, 10..11), (20, 0, 20..21)];
        let p = plan(&[30], &reads, &clock);
        let mut r = Ranks::default();
        r.set_plan(Some(Arc::new(p)), None);
        r.insert(0, 10, Some(0));
        r.insert(1, 10, Some(0));
        clock.store(8, Relaxed);
        assert!(!r.worth_storing(2), "read now, next at 20, after everything held (10, 11)");
        assert!(!r.worth_storing(77), "never read");
        clock.store(12, Relaxed);
        assert!(r.worth_storing(2), "blocks 0 and 1 are past their last use now");
    }

    #[test]
    fn a_block_is_fetched_whole_when_read_enough_before_it_would_go() {
        let clock = Arc::new(AtomicU64::new(0));
        // Block 0 (10 bytes) read at 0, 1, 2 and 3; block 1 at 0 and 50; block 2 held, next read at 5.
        let reads =
            [(0, 0, 0..1), (0, 0, 10..11), (1, 0, 1..2), (2, 0, 2..3), (3, 0, 3..4), (5, 0, 20..21), (50, 0, 11..12)];
        let p = plan(&[30], &reads, &clock);
        let mut r = Ranks::default();
        assert!(r.worth_fetching_whole(0, 10, 1, 10), "no plan: whole blocks");
        r.set_plan(Some(Arc::new(p)), None);
        assert!(r.worth_fetching_whole(0, 10, 1, 100), "room to spare: whole");
        r.insert(2, 10, Some(0));
        // Full: block 0 is read 4 times before block 2's next read (5): 4 pieces of 3 pay for it.
        assert!(r.worth_fetching_whole(0, 10, 3, 10));
        assert!(!r.worth_fetching_whole(0, 10, 2, 10), "4 pieces of 2 do not");
        assert!(!r.worth_fetching_whole(1, 10, 5, 10), "block 1 is read again only after the horizon");
        assert!(r.worth_fetching_whole(1, 10, 10, 10), "a read of the whole block");
    }

    /// A cyclic scan over twice the cache: least recently used refetches everything, the plan
    /// about half (what the cache holds).
    #[test]
    fn a_repeated_scan_keeps_what_fits_under_the_plan() {
        let blocks = 40u64;
        let held = 20u64;
        let run = |planned: bool| {
            let clock = Arc::new(AtomicU64::new(0));
            // Two epochs of the same order: block b at time b, then blocks + b.
            let reads: Vec<(u64, usize, Range<u64>)> =
                (0..2 * blocks).map(|t| (t, 0, (t % blocks) * 10..(t % blocks) * 10 + 1)).collect();
            let mut r = Ranks::default();
            if planned {
                r.set_plan(Some(Arc::new(plan(&[blocks * 10], &reads, &clock))), None);
            }
            let mut fetched_second = 0;
            for (t, _, range) in &reads {
                clock.store(*t, Relaxed);
                let key = u128::from(range.start / 10);
                if r.contains(key) {
                    r.touch(key);
                    continue;
                }
                if *t >= blocks {
                    fetched_second += 1;
                }
                if r.bytes() + 10 > held * 10 {
                    if !r.worth_storing(key) {
                        continue;
                    }
                    let (v, _) = r.victim().unwrap();
                    r.remove(v);
                }
                r.insert(key, 10, None);
            }
            fetched_second
        };
        assert_eq!(run(false), blocks, "least recently used refetches every block");
        assert_eq!(run(true), blocks - held, "the plan refetches what did not fit");
    }
}
