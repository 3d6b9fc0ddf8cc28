//! What a block cache has done: counters bumped as it works, and their snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Cache counters.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Blocks served from memory.
    pub(crate) hits: AtomicU64,
    /// Blocks not in memory.
    pub(crate) misses: AtomicU64,
    /// Blocks dropped from memory to stay within the limit.
    pub(crate) evictions: AtomicU64,
    /// Misses served from the disk cache.
    pub(crate) disk_hits: AtomicU64,
    /// Of those, blocks read straight from their files: by the hit path into batches, or for
    /// the small pieces of them a read needs.
    pub(crate) disk_direct: AtomicU64,
    /// Blocks written to the disk cache.
    pub(crate) disk_writes: AtomicU64,
    /// Files removed from the disk cache to stay within its limit.
    pub(crate) disk_evictions: AtomicU64,
    /// Temporary files of writers that died mid-write, removed when the cache was opened.
    pub(crate) disk_stale_removed: AtomicU64,
    /// Blocks not written to the disk cache because the plan would have dropped them first,
    /// or not fetched whole because they would not be read enough while cached.
    pub(crate) disk_bypassed: AtomicU64,
    /// Misses that joined a fetch already in flight for the same block.
    pub(crate) joined: AtomicU64,
    /// Disk cache entries that failed verification, dropped and fetched again.
    pub(crate) disk_corrupt: AtomicU64,
    /// Blocks left out of the disk cache because its writes were behind
    /// (`disk_cache_behind=skip`).
    pub(crate) disk_behind: AtomicU64,
    /// Misses read from the disk cache after waiting for another process's fetch of the
    /// block (its lease, [`lease`]) instead of fetched again.
    pub(crate) lease_waits: AtomicU64,
}

/// A snapshot of a [`BlockCache`](super::BlockCache)'s counters ([`BlockCache::snapshot`](super::BlockCache::snapshot)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheSnapshot {
    /// Blocks served from memory.
    pub hits: u64,
    /// Blocks not in memory.
    pub misses: u64,
    /// Blocks dropped from memory to stay within the limit.
    pub evictions: u64,
    /// Misses served from the disk cache.
    pub disk_hits: u64,
    /// Of those, blocks read straight from their files: by the hit path into batches, or for
    /// the small pieces of them a read needs.
    pub disk_direct: u64,
    /// Blocks written to the disk cache.
    pub disk_writes: u64,
    /// Files removed from the disk cache to stay within its limit.
    pub disk_evictions: u64,
    /// Temporary files of writers that died mid-write, removed when the cache was opened.
    pub disk_stale_removed: u64,
    /// Blocks not written to the disk cache because the plan would have dropped them first,
    /// or not fetched whole because they would not be read enough while cached.
    pub disk_bypassed: u64,
    /// Misses that joined a fetch already in flight for the same block.
    pub joined: u64,
    /// Disk cache entries that failed verification (damaged, cut short, another block's
    /// file): dropped, fetched again, never served.
    pub disk_corrupt: u64,
    /// Blocks left out of the disk cache because its writes were behind
    /// (`disk_cache_behind=skip`).
    pub disk_behind: u64,
    /// Misses read from the disk cache after waiting for another process on the node to
    /// fetch the block, instead of fetched again.
    pub lease_waits: u64,
}

impl CacheCounters {
    pub(super) fn snapshot(&self) -> CacheSnapshot {
        CacheSnapshot {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            disk_hits: self.disk_hits.load(Relaxed),
            disk_direct: self.disk_direct.load(Relaxed),
            disk_writes: self.disk_writes.load(Relaxed),
            disk_evictions: self.disk_evictions.load(Relaxed),
            disk_stale_removed: self.disk_stale_removed.load(Relaxed),
            disk_bypassed: self.disk_bypassed.load(Relaxed),
            joined: self.joined.load(Relaxed),
            disk_corrupt: self.disk_corrupt.load(Relaxed),
            disk_behind: self.disk_behind.load(Relaxed),
            lease_waits: self.lease_waits.load(Relaxed),
        }
    }
}
