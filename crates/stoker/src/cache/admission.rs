//! Which reads of a block are worth writing to the disk cache, decided from the plan before
//! the reads happen.
//!
//! Belady's rule with its bypass ([`super::policy`]) drops the block needed furthest ahead
//! and does not store one that would be the first to go, but only once the cache is full:
//! while it fills, every block is written, and later arrivals with sooner uses push many of
//! them out unread. With data four times the cache, a shard-shuffled epoch writes about
//! 2.4 cache-fulls of blocks (the first fill, then each block whose next use beats the
//! worst held one) to serve one cache-full of hits. A block that is evicted before it is
//! read again cost a write (and its checksum, and a deletion) for nothing.
//!
//! The plan says in advance what will be read and when, so the cache's run can be simulated
//! over it: the optimal policy (keep the blocks needed soonest, bypass a block that would be
//! the first to go) over the planned uses, with the cache's capacity in blocks. Each use at
//! which the simulated cache stores the block, and then reads it again before dropping it,
//! is admitted; a use whose block the simulation bypasses, or stores only to drop unread,
//! is not. The real cache then writes only what will be read from it, and holds at most
//! what the simulation held, so it has the room the simulation assumed.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::policy::{Admit, Plan};

/// What a cache of `capacity` bytes may write under `plan` (see the module docs; `file_len`:
/// what a block of so many bytes takes on disk). A block the plan does not know, or read at
/// no planned use, is written as before.
pub(crate) fn admit(plan: Arc<Plan>, capacity: u64, file_len: impl Fn(u64) -> u64) -> Admit {
    let a = Admission::simulate(&plan, capacity, file_len);
    Arc::new(move |key| plan.use_index(key, false).is_none_or(|u| a.admits(u)))
}

/// Planned uses whose block may be written when it is read for them (one bit per use, in
/// the plan's order of uses).
#[derive(Debug)]
pub(crate) struct Admission {
    bits: Vec<u64>,
}

impl Admission {
    /// The uses of `plan` at which a cache holding `capacity` bytes stores a block that is
    /// read again before it would be dropped; `file_len` is what a block of so many bytes
    /// takes on disk.
    pub(crate) fn simulate(plan: &Plan, capacity: u64, file_len: impl Fn(u64) -> u64) -> Admission {
        let n = plan.use_count();
        let mut bits = vec![0u64; n.div_ceil(64)];
        let set = |bits: &mut Vec<u64>, u: usize, on: bool| {
            if on {
                bits[u / 64] |= 1 << (u % 64);
            } else {
                bits[u / 64] &= !(1 << (u % 64));
            }
        };
        // The block each use is of, and every use in time order (by time, then by use number,
        // so a block's uses stay in order).
        let blocks = plan.block_count();
        let mut block_of = vec![0u32; n];
        for b in 0..blocks {
            block_of[plan.uses_of(b)].fill(b as u32);
        }
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by_key(|&u| (plan.use_time(u as usize), u));
        // Per block held: the rank it is held under (its next use), the use it was stored at,
        // whether it was read since, and what it takes on disk.
        const NONE: u64 = u64::MAX;
        let mut held: Vec<Option<(u64, u32, bool, u64)>> = vec![None; blocks];
        let mut by_next: BTreeSet<(u64, u32)> = BTreeSet::new();
        let mut bytes = 0u64;
        for &u in &order {
            let u = u as usize;
            let b = block_of[u] as usize;
            let next = if u + 1 < plan.uses_of(b).end { u64::from(plan.use_time(u + 1)) } else { NONE };
            if let Some((rank, stored, _, len)) = held[b] {
                // Read from the cache: the store paid off; it stays for its next use.
                by_next.remove(&(rank, b as u32));
                held[b] = Some((next, stored, true, len));
                by_next.insert((next, b as u32));
                set(&mut bits, u, true);
                continue;
            }
            let len = file_len(plan.block_len(b));
            if len > capacity {
                continue;
            }
            // Room is made by dropping the blocks needed furthest ahead, unless this block is
            // needed later than they are: then it is the one that would go (bypassed).
            let mut room = true;
            while bytes + len > capacity {
                match by_next.last().copied() {
                    Some((worst, _)) if next >= worst => {
                        room = false;
                        break;
                    }
                    Some((worst, victim)) => {
                        by_next.remove(&(worst, victim));
                        if let Some((_, stored, read, len)) = held[victim as usize].take() {
                            bytes -= len;
                            if !read {
                                // Dropped before it was read again: not worth its write.
                                set(&mut bits, stored as usize, false);
                            }
                        }
                    }
                    None => {
                        room = false;
                        break;
                    }
                }
            }
            if !room {
                continue;
            }
            held[b] = Some((next, u as u32, false, len));
            by_next.insert((next, b as u32));
            bytes += len;
            set(&mut bits, u, true);
        }
        // Blocks still held at the end were stored for a use beyond the plan (later epochs
        // may read them) or read already: their writes stand.
        Admission { bits }
    }

    /// Whether a block read for planned use `u` may be written.
    pub(crate) fn admits(&self, u: usize) -> bool {
        self.bits.get(u / 64).is_some_and(|w| w & (1 << (u % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Range;
    use std::sync::atomic::AtomicU64;

    /// A plan over `blocks` one-block objects (block `b` has key `b`), read in `order`
    /// (time = position).
    fn plan(blocks: usize, order: &[usize]) -> Plan {
        let keyers: Vec<Box<dyn Fn(u64) -> u128 + Sync>> =
            (0..blocks).map(|o| Box::new(move |_: u64| o as u128) as _).collect();
        let objects: Vec<(&(dyn Fn(u64) -> u128 + Sync), u64)> = keyers.iter().map(|k| (&**k, 10)).collect();
        let uses = |sink: &mut dyn FnMut(u64, usize, Range<u64>)| {
            for (t, &o) in order.iter().enumerate() {
                sink(t as u64, o, 0..10);
            }
        };
        Plan::build(10, &objects, &uses, Arc::new(AtomicU64::new(0))).unwrap()
    }

    /// The writes the admission allows over `order`, and the hits a cache of `capacity`
    /// blocks following it (and Belady's eviction) gets.
    fn run(blocks: usize, order: &[usize], capacity: usize) -> (usize, usize, usize) {
        run_with(blocks, order, capacity, true)
    }

    /// [`run`], or with every use admitted (`admission` false: Belady's bypass alone, the
    /// cache before admission).
    fn run_with(blocks: usize, order: &[usize], capacity: usize, admission: bool) -> (usize, usize, usize) {
        let p = plan(blocks, order);
        let a = if admission {
            Admission::simulate(&p, capacity as u64 * 10, |l| l)
        } else {
            Admission { bits: vec![u64::MAX; p.use_count().div_ceil(64)] }
        };
        let (mut writes, mut hits, mut wasted) = (0, 0, 0);
        let mut held: Vec<usize> = Vec::new();
        let mut read_since: Vec<bool> = vec![false; blocks];
        for (t, &b) in order.iter().enumerate() {
            p.set_now(t as u64);
            if held.contains(&b) {
                hits += 1;
                read_since[b] = true;
                continue;
            }
            let u = p.use_index(b as u128, false).unwrap();
            if !a.admits(u) || capacity == 0 {
                continue;
            }
            if held.len() >= capacity {
                // Belady's bypass: a block that would be the first to go is not stored.
                let next = |x: usize| p.next_use(x as u128, false).unwrap_or(u64::MAX);
                let mine = p.next_use(b as u128, true).unwrap_or(u64::MAX);
                if held.iter().all(|&x| next(x) <= mine) {
                    continue;
                }
                // Belady: drop the held block needed furthest ahead.
                let next = |x: usize| p.next_use(x as u128, false).unwrap_or(u64::MAX);
                let (i, _) = held.iter().enumerate().max_by_key(|(_, &x)| next(x)).unwrap();
                let gone = held.remove(i);
                wasted += usize::from(!read_since[gone]);
            }
            held.push(b);
            read_since[b] = false;
            writes += 1;
        }
        assert!(held.len() <= capacity);
        (writes, hits, wasted)
    }

    /// Two epochs over `blocks` blocks, each a different permutation (a stride walk).
    fn two_epochs(blocks: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..blocks).map(|i| (i * 7) % blocks).collect();
        order.extend((0..blocks).map(|i| (i * 13 + 5) % blocks));
        order
    }

    #[test]
    fn data_four_times_the_cache_writes_only_blocks_read_again() {
        let blocks = 400;
        let order = two_epochs(blocks);
        let (writes, hits, wasted) = run(blocks, &order, 100);
        assert_eq!(wasted, 0, "every block written is read again before it goes");
        // Without admission: as many hits at best, and writes of blocks dropped unread.
        let (all_writes, all_hits, all_wasted) = run_with(blocks, &order, 100, false);
        assert!(hits >= all_hits, "admission loses no hit: {hits} against {all_hits}");
        assert!(all_wasted > 0 && writes < all_writes, "{writes} writes against {all_writes} ({all_wasted} wasted)");
        assert!(hits >= 90, "the cache still serves about a cache-full: {hits}");
        eprintln!("admission: {writes} writes, {hits} hits; without: {all_writes} writes ({all_wasted} dropped unread), {all_hits} hits");
    }

    #[test]
    fn a_cache_that_holds_everything_admits_every_first_read() {
        let blocks = 50;
        let order = two_epochs(blocks);
        let (writes, hits, wasted) = run(blocks, &order, 64);
        assert_eq!((writes, hits, wasted), (50, 50, 0));
    }

    #[test]
    fn blocks_never_read_again_are_written_only_while_there_is_room() {
        // One epoch, nothing read twice: with room, the writes stand (later epochs beyond
        // the plan may read them); past the room, nothing is written.
        let order: Vec<usize> = (0..30).collect();
        let (writes, hits, wasted) = run(30, &order, 10);
        assert_eq!((writes, hits, wasted), (10, 0, 0));
    }

    #[test]
    fn zero_capacity_admits_nothing() {
        let order = two_epochs(20);
        assert_eq!(run(20, &order, 0), (0, 0, 0));
    }
}
