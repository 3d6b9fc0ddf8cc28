//! Ranged reads through the block cache: the asked ranges are cut from whole aligned blocks
//! fetched in runs of adjacent missing ones, cached in memory and on disk. When the reader's
//! plan says a missing block will not be read enough while cached to pay for fetching all of
//! it (a 64 KiB sample of a 1 MiB block in a per-sample shuffle over more data than the
//! cache holds), the range that needs it is fetched as asked instead, around the cache.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use object_store::path::Path as ObjPath;

use super::Fetcher;
use crate::error::{Error, Result};

/// One request for a run of adjacent cache blocks, awaited by each block that misses.
type RunFetch = futures::future::Shared<futures::future::BoxFuture<'static, std::result::Result<Bytes, Arc<Error>>>>;

impl Fetcher {
    /// Like [`get_ranges`](Self::get_ranges) for an object of known `size` and `version`,
    /// through the block cache when there is one: whole aligned blocks are fetched, cached,
    /// and the asked ranges cut from them, unless the reader's plan says a block is not worth
    /// fetching whole (then the ranges needing it are fetched as asked). With `if_match` (the
    /// entity tag the object had when it was indexed), a replaced object fails with a clear
    /// error instead of yielding its new bytes at the old offsets.
    pub async fn get_ranges_cached(
        self: &Arc<Self>,
        path: &ObjPath,
        shown: &str,
        ranges: &[Range<u64>],
        size: u64,
        version: &str,
        if_match: Option<&str>,
    ) -> Result<Vec<Bytes>> {
        let Some(cache) = &self.cache else { return self.get_ranges_if(path, shown, ranges, if_match).await };
        let bs = cache.config().block.max(1);
        let key = |b: u64| crate::cache::block_key(path.as_ref(), version, b);
        // Bytes of each block the ranges need, for the missing blocks' worth.
        let mut need: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
        for r in ranges.iter().filter(|r| r.end > r.start) {
            for b in r.start / bs..=(r.end - 1) / bs {
                *need.entry(b).or_default() += r.end.min((b + 1) * bs) - r.start.max(b * bs);
            }
        }
        let pieces: std::collections::HashSet<u64> = need
            .iter()
            .filter(|&(&b, &piece)| {
                let len = bs.min(size.saturating_sub(b * bs));
                // A block a read needs most of is fetched whole anyway.
                2 * piece < len && !cache.contains(key(b)) && !cache.worth_fetching_whole(key(b), len, piece)
            })
            .map(|(&b, _)| b)
            .collect();
        if pieces.is_empty() {
            return self.get_blocks(path, shown, ranges, size, version, if_match).await;
        }
        // A range goes around the cache when it needs a block not worth fetching whole and
        // its blocks would cost more than twice the range (a small piece of big blocks); a
        // range mostly made of whole blocks is read through them (a sample's edge blocks).
        let block_len = |b: u64| bs.min(size.saturating_sub(b * bs));
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
            self.get_ranges_if(path, shown, &direct_ranges, if_match),
            self.get_blocks(path, shown, &blocked_ranges, size, version, if_match),
        )
        .await?;
        let mut out = vec![Bytes::new(); ranges.len()];
        for (i, b) in direct.into_iter().zip(got_direct).chain(blocked.into_iter().zip(got_blocked)) {
            out[i] = b;
        }
        Ok(out)
    }

    /// `ranges` through the block cache: whole aligned blocks fetched, cached, and the
    /// ranges cut from them.
    async fn get_blocks(
        self: &Arc<Self>,
        path: &ObjPath,
        shown: &str,
        ranges: &[Range<u64>],
        size: u64,
        version: &str,
        if_match: Option<&str>,
    ) -> Result<Vec<Bytes>> {
        let Some(cache) = &self.cache else { return self.get_ranges_if(path, shown, ranges, if_match).await };
        let bs = cache.config().block.max(1);
        let mut blocks: Vec<u64> =
            ranges.iter().filter(|r| r.end > r.start).flat_map(|r| r.start / bs..=(r.end - 1) / bs).collect();
        blocks.sort_unstable();
        blocks.dedup();
        // Reads wait their turn rather than hold more blocks than the bound at once; a read
        // needing more than the bound takes all of it and goes alone.
        let want = blocks.len().clamp(1, self.held_blocks_max) as u32;
        let _held = self.held_blocks.acquire_many(want).await.ok(); // never closed
        let key = |b: u64| crate::cache::block_key(path.as_ref(), version, b);
        // Adjacent blocks missing together are one request (cut into blocks for the cache),
        // not one request each: a cold batch costs as many requests as without a cache. Blocks
        // cached (as far as this process knows) are left out of those runs, so a partly cached
        // range fetches only what is missing; one that turns out gone is fetched alone. A run
        // is fetched only if one of its blocks is a miss, and at most once.
        let cached: Vec<bool> = blocks.iter().map(|&b| cache.contains(key(b))).collect();
        let max_run = (self.cfg.part_size / bs).max(1);
        let shown: Arc<str> = shown.into();
        let mut runs: Vec<(u64, RunFetch)> = Vec::new();
        let mut run_of = Vec::with_capacity(blocks.len()); // blocks[i] is in runs[run_of[i]]
        let mut i = 0;
        while i < blocks.len() {
            let first = blocks[i];
            let mut end = first + 1;
            run_of.push(runs.len());
            i += 1;
            while i < blocks.len() && blocks[i] == end && end - first < max_run && !cached[i] && !cached[i - 1] {
                end += 1;
                run_of.push(runs.len());
                i += 1;
            }
            let range = first * bs..(end * bs).min(size);
            let (me, path, shown) = (self.clone(), path.clone(), shown.clone());
            let if_match = if_match.map(str::to_string);
            let fetch: RunFetch =
                async move { me.fetch_range(&path, &shown, range, if_match.as_deref()).await.map_err(Arc::new) }
                    .boxed()
                    .shared();
            runs.push((first, fetch));
        }
        // In memory, each cached block is its own allocation (a copy), so the cache's byte
        // count is what it holds; on disk only, a block is a slice of its run until written.
        let own = cache.config().memory_bytes > 0;
        let fetched = futures::future::try_join_all(blocks.iter().zip(&run_of).map(|(&b, &r)| {
            let range = b * bs..((b + 1) * bs).min(size);
            let key = key(b);
            let len = (range.end - range.start) as usize;
            let (first, run) = runs[r].clone();
            let at = ((b - first) * bs) as usize;
            let shown = shown.clone();
            cache.get_or_fetch(key, len, move || async move {
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
        Ok(ranges
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
                    // after the cache evicts it (a 4 KiB sample pinning 1 MiB).
                    if cut.len() < blk.len() / 4 {
                        Bytes::copy_from_slice(&blk[cut])
                    } else {
                        blk.slice(cut)
                    }
                } else if let Some(whole) = same_run(first, last) {
                    // Every block came from one request: the range is a slice of it, no copy.
                    whole.slice((r.start - run_start(first)) as usize..(r.end - run_start(first)) as usize)
                } else {
                    let mut out = BytesMut::with_capacity((r.end - r.start) as usize);
                    for b in first..=last {
                        let blk = at(b);
                        let lo = r.start.max(b * bs) - b * bs;
                        let hi = r.end.min((b + 1) * bs) - b * bs;
                        out.extend_from_slice(&blk[lo as usize..hi as usize]);
                    }
                    out.freeze()
                }
            })
            .collect())
    }
}
