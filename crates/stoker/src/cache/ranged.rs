//! The read path for remote bytes: ranges asked of an object become requests here, merged
//! and split under one [`ranges`] policy, and, for objects of known version, go through the
//! block cache (memory and disk) when one is configured.
//!
//! Ranged reads through the block cache: the asked ranges are cut from whole aligned blocks
//! fetched in runs of adjacent missing ones, cached in memory and on disk. When the reader's
//! plan says a missing block will not be read enough while cached to pay for fetching all of
//! it (a 64 KiB sample of a 1 MiB block in a per-sample shuffle over more data than the
//! cache holds), the range that needs it is fetched as asked instead, around the cache. A
//! range that needs a small part of blocks only on disk is read from their files, the chunks
//! it touches verified, not by reading whole blocks.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use object_store::path::Path as ObjPath;
use tokio::sync::Semaphore;

use super::{BlockCache, Claim, Lease};
use crate::error::{Error, Result};
use crate::fetch::{Expect, Fetcher};
use crate::ranges;

/// One request for a run of adjacent cache blocks, awaited by each block that misses.
type RunFetch = futures::future::Shared<futures::future::BoxFuture<'static, std::result::Result<Bytes, Arc<Error>>>>;

/// Reads ranges of a remote store's objects: through the block cache when there is one,
/// every request through one [`Fetcher`].
pub struct RemoteReader {
    fetcher: Arc<Fetcher>,
    cache: Option<BlockCache>,
    /// Cache blocks that cached reads may hold at once (see `get_blocks`).
    held_blocks: Semaphore,
    held_blocks_max: AtomicUsize,
    /// Bytes of blocks reads may hold at once (`held_blocks_max` of the block size in use).
    held_bytes: u64,
}

impl std::fmt::Debug for RemoteReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteReader").field("fetcher", &self.fetcher).finish_non_exhaustive()
    }
}

impl RemoteReader {
    /// A reader over `fetcher`, with the block cache `cache` asks for; fails only if the disk
    /// cache directory cannot be made.
    pub fn new(fetcher: Arc<Fetcher>, cache: super::CacheConfig) -> Result<Self> {
        let cfg = fetcher.config();
        let cache_cfg = cache;
        let cache = if cache_cfg.enabled() { Some(BlockCache::new(cache_cfg.clone())?) } else { None };
        // Blocks in use by reads come on top of the cache's own bytes (a block being fetched,
        // or evicted while a read still cuts from it): half the memory cache's worth, or what
        // the fetch layer may have in flight (reads through the disk cache alone hold blocks
        // in memory only while in flight), at least 8 and at most one per request in flight,
        // keeps that bounded and still parallel. Less than the fetch layer's bytes would
        // serialise what it runs in parallel: at 64 MiB, a window of 64 MiB shards was read
        // one shard at a time, at half the link's rate.
        let held_bytes = (cache_cfg.memory_bytes / 2).max(cfg.max_bytes_in_flight).max(64 << 20);
        let held_blocks_max = held_blocks(held_bytes, cache_cfg.block, &fetcher);
        Ok(RemoteReader {
            cache,
            held_blocks: Semaphore::new(held_blocks_max),
            held_blocks_max: AtomicUsize::new(held_blocks_max),
            held_bytes,
            fetcher,
        })
    }

    /// Before a run that reads every block of objects totalling `data_bytes`: when they fit
    /// whole in the disk cache, take [`ORDERED_BLOCK`](super::ORDERED_BLOCK)s (see
    /// [`BlockCache::widen_block`]: only if the options left the block to Stoker and nothing
    /// was read yet). Returns whether the block size changed.
    pub fn widen_blocks_for(&self, data_bytes: u64) -> bool {
        let Some(cache) = &self.cache else { return false };
        if cache.disk_limit().is_none_or(|limit| data_bytes > limit) || !cache.widen_block(super::ORDERED_BLOCK) {
            return false;
        }
        // As many bytes held as before, in fewer blocks. No read has run, so every permit is
        // free to take back.
        let now = held_blocks(self.held_bytes, cache.block(), &self.fetcher);
        let before = self.held_blocks_max.swap(now, Relaxed);
        self.held_blocks.forget_permits(before.saturating_sub(now));
        true
    }

    /// The request layer.
    pub fn fetcher(&self) -> &Arc<Fetcher> {
        &self.fetcher
    }

    /// The block cache, when one is configured.
    pub fn cache(&self) -> Option<&BlockCache> {
        self.cache.as_ref()
    }

    /// Tell the block cache what a reader will read and when, so the disk cache drops what is
    /// needed furthest ahead (see [`super::policy`]). `objects` are the objects the
    /// reads are of (path, version, size); `uses` calls its sink with `(time, object number,
    /// byte range)` in time order and may be called more than once; `clock` is the reader's
    /// time, advanced as it reads. Returns whether the cache follows the plan (false without a
    /// disk cache, under `cache_eviction=lru`, or for too many blocks to plan).
    pub fn plan_reads(
        &self,
        objects: &[(ObjPath, String, u64)],
        uses: super::policy::Uses<'_>,
        clock: Arc<AtomicU64>,
    ) -> bool {
        let Some(cache) = &self.cache else { return false };
        if cache.disk_limit().is_none() || cache.config().eviction != super::Eviction::Future {
            return false;
        }
        let block = cache.block();
        let keyers: Vec<_> = objects
            .iter()
            .map(|(path, version, _)| move |b: u64| super::block_key(path.as_ref(), version, block, b))
            .collect();
        let planned: Vec<(&(dyn Fn(u64) -> u128 + Sync), u64)> =
            keyers.iter().zip(objects).map(|(k, (_, _, size))| (k as &(dyn Fn(u64) -> u128 + Sync), *size)).collect();
        match super::Plan::build(block, &planned, uses, clock) {
            Some(plan) => cache.set_plan(Some(Arc::new(plan))),
            None => false,
        }
    }

    /// Read `ranges` of `path` (`shown` names it in errors), in the order asked, around the
    /// cache: ranges closer than the coalescing gap are one request, and a request bigger
    /// than a part is split into parts fetched in parallel. With `expect`, only of that
    /// version of the object: a replaced object is an error, not other bytes.
    pub async fn get_ranges(
        &self,
        path: &ObjPath,
        shown: &str,
        ranges: &[Range<u64>],
        expect: Option<&Expect>,
    ) -> Result<Vec<Bytes>> {
        let cfg = self.fetcher.config();
        let merged = ranges::merge(ranges, &ranges::Policy::uncapped(cfg.coalesce_gap));
        let part = cfg.part_size;
        let parts = merged.reads.iter().flat_map(|m| ranges::split(m.clone(), part));
        let fetched: Vec<Bytes> =
            futures::future::try_join_all(parts.map(|p| self.fetcher.fetch_range(path, shown, p, expect))).await?;
        // The parts are not joined: each range is a slice of the part it lies in, and only a
        // range across a part's edge is copied (joining a whole-shard read copied every byte,
        // into fresh memory, to save copying a few samples).
        let mut fetched = fetched.into_iter();
        let parts_of: Vec<Vec<Bytes>> = merged
            .reads
            .iter()
            .map(|m| fetched.by_ref().take(ranges::split(m.clone(), part).count()).collect())
            .collect();
        Ok(ranges
            .iter()
            .enumerate()
            .map(|(i, w)| match merged.locate(i, w) {
                Some((k, at)) => cut_parts(&parts_of[k], part as usize, at..at + (w.end - w.start) as usize),
                None => Bytes::new(),
            })
            .collect())
    }

    /// Like [`get_ranges`](Self::get_ranges) for an object of a known version (`expect`,
    /// keyed in the cache as `version`), through the block cache when there is one: whole
    /// aligned blocks are fetched, cached, and the asked ranges cut from them, unless the
    /// reader's plan says a block is not worth fetching whole (then the ranges needing it are
    /// fetched as asked). Small pieces of blocks only on disk are read from their files
    /// (`pieces_on_disk`). A replaced object fails with a clear error instead of yielding its
    /// new bytes at the old offsets.
    pub async fn get_ranges_cached(
        &self,
        path: &ObjPath,
        shown: &str,
        ranges: &[Range<u64>],
        version: &str,
        expect: &Expect,
    ) -> Result<Vec<Bytes>> {
        let Some(cache) = &self.cache else { return self.get_ranges(path, shown, ranges, Some(expect)).await };
        let (mut out, rest) = Self::pieces_on_disk(cache, path, ranges, version, expect.size).await;
        // The rest are fetched, or cut from whole cached blocks.
        let ranges: &[Range<u64>] = &rest.iter().map(|&i| ranges[i].clone()).collect::<Vec<_>>();
        let bs = cache.block_for_read();
        let key = |b: u64| crate::cache::block_key(path.as_ref(), version, bs, b);
        // Bytes of each block the ranges need, for the missing blocks' worth.
        let need = bytes_per_block(ranges, bs);
        let block_len = |b: u64| bs.min(expect.size.saturating_sub(b * bs));
        let pieces: std::collections::HashSet<u64> = need
            .iter()
            .filter(|&(&b, &piece)| {
                let len = block_len(b);
                // A block a read needs most of is fetched whole anyway.
                2 * piece < len && !cache.contains(key(b)) && !cache.worth_fetching_whole(key(b), len, piece)
            })
            .map(|(&b, _)| b)
            .collect();
        if pieces.is_empty() {
            let got = self.get_blocks(cache, path, shown, ranges, version, expect).await?;
            return Ok(fill(&mut out, rest, got));
        }
        // A range goes around the cache when it needs a block not worth fetching whole and
        // its blocks would cost more than twice the range (a small piece of big blocks); a
        // range mostly made of whole blocks is read through them (a sample's edge blocks).
        let as_asked = |r: &Range<u64>| {
            if r.end <= r.start {
                return false;
            }
            let blocks = r.start / bs..=(r.end - 1) / bs;
            let missing: u64 = blocks.clone().filter(|&b| !cache.contains(key(b))).map(block_len).sum();
            blocks.clone().any(|b| pieces.contains(&b)) && missing > 2 * (r.end - r.start)
        };
        let (direct, blocked): (Vec<usize>, Vec<usize>) = (0..ranges.len()).partition(|&i| as_asked(&ranges[i]));
        let direct_ranges: Vec<Range<u64>> = direct.iter().map(|&i| ranges[i].clone()).collect();
        let blocked_ranges: Vec<Range<u64>> = blocked.iter().map(|&i| ranges[i].clone()).collect();
        let (got_direct, got_blocked) = futures::future::try_join(
            self.get_ranges(path, shown, &direct_ranges, Some(expect)),
            self.get_blocks(cache, path, shown, &blocked_ranges, version, expect),
        )
        .await?;
        let mut got = vec![Bytes::new(); ranges.len()];
        for (i, b) in direct.into_iter().zip(got_direct).chain(blocked.into_iter().zip(got_blocked)) {
            got[i] = b;
        }
        Ok(fill(&mut out, rest, got))
    }

    /// The ranges that need a small part (less than half) of blocks only on disk, read from
    /// their files, the chunks they touch verified (the hit path's read): a whole block read
    /// to cut one sample out of it cost 128 times the sample's bytes in copies and checks (a
    /// 64 KiB sample of an 8 MiB block, in the batches of a per-sample shuffle's first epoch
    /// that find some of their blocks on disk and some not). Returns what was read, by
    /// range, and the ranges left to read the usual way: the others, and any whose block
    /// went (another process evicted it) or was refused as damaged. Without a memory cache
    /// only: with one, the whole block is what it keeps.
    async fn pieces_on_disk(
        cache: &BlockCache,
        path: &ObjPath,
        ranges: &[Range<u64>],
        version: &str,
        size: u64,
    ) -> (Vec<Option<Bytes>>, Vec<usize>) {
        let mut out: Vec<Option<Bytes>> = vec![None; ranges.len()];
        let on_disk: Vec<usize> = if cache.config().memory_bytes == 0 && cache.disk_limit().is_some() {
            let bs = cache.block_for_read();
            let key = |b: u64| crate::cache::block_key(path.as_ref(), version, bs, b);
            let need = bytes_per_block(ranges, bs);
            let block_len = |b: u64| bs.min(size.saturating_sub(b * bs));
            let small_on_disk = |r: &Range<u64>| {
                r.end > r.start
                    && (r.start / bs..=(r.end - 1) / bs)
                        .all(|b| 2 * need.get(&b).copied().unwrap_or(0) < block_len(b) && cache.on_disk_written(key(b)))
            };
            let mut pieces: Vec<usize> = (0..ranges.len()).filter(|&i| small_on_disk(&ranges[i])).collect();
            // Decided per block: a block that another range of this read takes whole (it
            // crosses into a block missing or needed mostly) is left to that read, not read
            // twice. Leaving a range out may so leave out others: until none changes.
            loop {
                let kept: std::collections::HashSet<usize> = pieces.iter().copied().collect();
                let whole: std::collections::HashSet<u64> = (0..ranges.len())
                    .filter(|i| !kept.contains(i) && ranges[*i].end > ranges[*i].start)
                    .flat_map(|i| ranges[i].start / bs..=(ranges[i].end - 1) / bs)
                    .collect();
                let before = pieces.len();
                pieces.retain(|&i| (ranges[i].start / bs..=(ranges[i].end - 1) / bs).all(|b| !whole.contains(&b)));
                if pieces.len() == before {
                    break pieces;
                }
            }
        } else {
            Vec::new()
        };
        if !on_disk.is_empty() {
            let spans: Vec<Range<u64>> = on_disk.iter().map(|&i| ranges[i].clone()).collect();
            let read = match cache.cached_object(path.as_ref(), version, size) {
                Some(mut object) => tokio::task::spawn_blocking(move || object.read_spans(&spans))
                    .await
                    .unwrap_or_else(|_| vec![None; on_disk.len()]),
                None => vec![None; on_disk.len()],
            };
            for (&i, got) in on_disk.iter().zip(read) {
                out[i] = got;
            }
        }
        let rest = (0..ranges.len()).filter(|&i| out[i].is_none()).collect();
        (out, rest)
    }

    /// `ranges` through the block cache: whole aligned blocks fetched, cached, and the
    /// ranges cut from them.
    async fn get_blocks(
        &self,
        cache: &BlockCache,
        path: &ObjPath,
        shown: &str,
        ranges: &[Range<u64>],
        version: &str,
        expect: &Expect,
    ) -> Result<Vec<Bytes>> {
        let size = expect.size;
        let bs = cache.block_for_read();
        let blocks = blocks_of(ranges, bs);
        // Reads wait their turn rather than hold more blocks than the bound at once; a read
        // needing more than the bound takes all of it and goes alone.
        let want = blocks.len().clamp(1, self.held_blocks_max.load(Relaxed)) as u32;
        let (_held, waited) = match self.held_blocks.try_acquire_many(want) {
            Ok(held) => (Some(held), false),
            // Never closed.
            Err(_) => (self.held_blocks.acquire_many(want).await.ok(), true),
        };
        // Blocks being fetched or written when the read was planned may have landed on disk
        // while it waited: their small pieces are read from the files, not whole. (A read that
        // did not wait was just looked at by its caller.)
        let (mut out, rest) = if waited {
            Self::pieces_on_disk(cache, path, ranges, version, size).await
        } else {
            (vec![None; ranges.len()], (0..ranges.len()).collect())
        };
        let ranges: &[Range<u64>] = &rest.iter().map(|&i| ranges[i].clone()).collect::<Vec<_>>();
        let blocks = blocks_of(ranges, bs);
        let key = |b: u64| crate::cache::block_key(path.as_ref(), version, bs, b);
        // Adjacent blocks missing together are one request (cut into blocks for the cache),
        // not one request each: a cold batch costs as many requests as without a cache. Blocks
        // cached (as far as this process knows) are left out of those runs, so a partly cached
        // range fetches only what is missing; one that turns out gone is fetched alone. A run
        // is fetched only if one of its blocks is a miss, and at most once.
        //
        // Across processes: a missing block another process on the node is fetching (it holds
        // the block's lease) is left out of the runs too, and waited for alone; this read
        // holds the leases of the blocks its runs fetch until they are stored.
        let (cached, leases): (Vec<bool>, Vec<Option<Lease>>) = blocks
            .iter()
            .map(|&b| {
                if cache.contains(key(b)) {
                    return (true, None);
                }
                match cache.claim(key(b)) {
                    Claim::Mine(l) => (false, Some(l)),
                    Claim::Theirs | Claim::Stored => (true, None),
                    Claim::Unleased => (false, None),
                }
            })
            .unzip();
        let max_run = (self.fetcher.config().part_size / bs).max(1);
        // Planned in block numbers: missing blocks merge with adjacent missing ones (gap 0)
        // up to a part's worth; a cached block is a run of its own.
        let unit = |(&b, _): (&u64, &bool)| b..b + 1;
        let missing: Vec<Range<u64>> = blocks.iter().zip(&cached).filter(|(_, &c)| !c).map(unit).collect();
        let mut block_runs = ranges::merge(&missing, &ranges::Policy::new(0, max_run)).reads;
        block_runs.extend(blocks.iter().zip(&cached).filter(|(_, &c)| c).map(unit));
        block_runs.sort_unstable_by_key(|r| r.start);
        // blocks[i] is in runs[run_of[i]]
        let run_of: Vec<usize> = blocks.iter().map(|&b| block_runs.partition_point(|r| r.end <= b)).collect();
        let shown: Arc<str> = shown.into();
        let runs: Vec<(u64, RunFetch)> = block_runs
            .iter()
            .map(|run| {
                let range = run.start * bs..(run.end * bs).min(size);
                let (me, path, shown) = (self.fetcher.clone(), path.clone(), shown.clone());
                let expect = expect.clone();
                let fetch: RunFetch =
                    async move { me.fetch_range(&path, &shown, range, Some(&expect)).await.map_err(Arc::new) }
                        .boxed()
                        .shared();
                (run.start, fetch)
            })
            .collect();
        // In memory, each cached block is its own allocation (a copy), so the cache's byte
        // count is what it holds; on disk only, a block is a slice of its run until written.
        let own = cache.config().memory_bytes > 0;
        let fetched = futures::future::try_join_all(blocks.iter().zip(&run_of).zip(leases).map(|((&b, &r), lease)| {
            let range = b * bs..((b + 1) * bs).min(size);
            let key = key(b);
            let len = (range.end - range.start) as usize;
            let (first, run) = runs[r].clone();
            let at = ((b - first) * bs) as usize;
            let shown = shown.clone();
            cache.get_or_fetch_claimed(key, len, lease, move || async move {
                let data = run.await.map_err(Error::Shared)?;
                let block = if own {
                    data.get(at..at + len).map(Bytes::copy_from_slice)
                } else {
                    (at + len <= data.len()).then(|| data.slice(at..at + len))
                };
                block.ok_or_else(|| Error::Fetch {
                    object: shown.to_string(),
                    what: format!("block {b}"),
                    attempts: 1,
                    message: format!("the read returned {} bytes where the block needs {}", data.len(), at + len),
                    hint: None,
                    transient: true,
                })
            })
        }))
        .await?;
        let taken = bytes_per_block(ranges, bs);
        let used = |b: u64| taken.get(&b).copied().unwrap_or(0) as usize;
        let index = |b: u64| blocks.binary_search(&b).expect("block planned");
        let run_start = |b: u64| runs[run_of[index(b)]].0 * bs;
        // The bytes of the request blocks first..=last all came from, if they did.
        let same_run = |first: u64, last: u64| -> Option<Bytes> {
            let r = run_of[index(first)];
            let data = match runs[r].1.peek() {
                Some(Ok(data)) => data.clone(),
                _ => return None,
            };
            let base = runs[r].0 * bs;
            (first..=last)
                .all(|b| {
                    let i = index(b);
                    run_of[i] == r && fetched[i].as_ptr() == data[((b * bs - base) as usize).min(data.len())..].as_ptr()
                })
                .then_some(data)
        };
        let got = ranges
            .iter()
            .map(|r| {
                if r.end <= r.start {
                    return Bytes::new();
                }
                let (first, last) = (r.start / bs, (r.end - 1) / bs);
                let at = |b: u64| blocks.binary_search(&b).map(|i| &fetched[i]).expect("block planned");
                if first == last {
                    let blk = at(first);
                    let cut = (r.start - first * bs) as usize..(r.end - first * bs) as usize;
                    // A small piece is copied out, so it does not keep its whole block alive
                    // after the cache evicts it (a 4 KiB sample pinning 1 MiB), unless this
                    // read takes much of the block anyway (a window read ahead: its samples
                    // are held and released together, and copying them would double them).
                    if cut.len() < blk.len() / 4 && used(first) < blk.len() / 4 {
                        Bytes::copy_from_slice(&blk[cut])
                    } else {
                        blk.slice(cut)
                    }
                } else if let Some(whole) = same_run(first, last) {
                    // Every block came from one request: the range is a slice of it, no copy.
                    whole.slice((r.start - run_start(first)) as usize..(r.end - run_start(first)) as usize)
                } else {
                    // A range's blocks are neighbours in `blocks` (every one was planned).
                    let cut = (r.start - first * bs) as usize..(r.end - first * bs) as usize;
                    cut_parts(&fetched[index(first)..=index(last)], bs as usize, cut)
                }
            })
            .collect();
        Ok(fill(&mut out, rest, got))
    }
}

/// The blocks of `block` bytes that `ranges` touch, sorted, each once.
fn blocks_of(ranges: &[Range<u64>], block: u64) -> Vec<u64> {
    let mut blocks: Vec<u64> =
        ranges.iter().filter(|r| r.end > r.start).flat_map(|r| r.start / block..=(r.end - 1) / block).collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// `out` (by range, `None` where not read yet) with `got`, the reads of ranges `rest`, put in
/// their places.
fn fill(out: &mut [Option<Bytes>], rest: Vec<usize>, got: Vec<Bytes>) -> Vec<Bytes> {
    debug_assert_eq!(rest.len(), got.len(), "a read answers every range it is asked");
    for (i, b) in rest.into_iter().zip(got) {
        out[i] = Some(b);
    }
    out.iter_mut().map(|b| b.take().unwrap_or_default()).collect()
}

/// Bytes of each block of `block` bytes that `ranges` take (overlaps counted twice: an
/// estimate of a block's worth to them).
fn bytes_per_block(ranges: &[Range<u64>], block: u64) -> std::collections::BTreeMap<u64, u64> {
    let mut per: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for r in ranges.iter().filter(|r| r.end > r.start) {
        for b in r.start / block..=(r.end - 1) / block {
            *per.entry(b).or_default() += r.end.min((b + 1) * block) - r.start.max(b * block);
        }
    }
    per
}

/// Bytes `range` of a read fetched as `parts` (consecutive, each `part` bytes but the last):
/// a slice of one part when it lies in one, else the pieces copied together.
fn cut_parts(parts: &[Bytes], part: usize, range: Range<usize>) -> Bytes {
    let (first, last) = (range.start / part, (range.end - 1) / part);
    if first == last {
        return parts[first].slice(range.start - first * part..range.end - first * part);
    }
    let mut out = BytesMut::with_capacity(range.len());
    for (k, p) in parts.iter().enumerate().take(last + 1).skip(first) {
        let lo = range.start.max(k * part) - k * part;
        let hi = range.end.min((k + 1) * part) - k * part;
        out.extend_from_slice(&p[lo..hi]);
    }
    out.freeze()
}

/// Blocks of `block` bytes reads may hold at once for `held_bytes`: at least 8, at most one
/// per request the fetch layer runs at once.
fn held_blocks(held_bytes: u64, block: u64, fetcher: &Fetcher) -> usize {
    ((held_bytes / block.max(1)) as usize).clamp(8, fetcher.config().max_in_flight.max(8))
}
