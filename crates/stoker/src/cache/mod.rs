//! Caches for remote bytes: a bytes-bounded in-memory LRU of fixed-size blocks with
//! single-flight misses, backed by a disk cache directory that several processes on a node
//! may share (DataLoader workers, ranks) and the next run reuses (on by default for
//! remote sources, crash-safe, never failing a read when the directory is unusable).
//!
//! Disk entries are written to a temporary file and renamed into place, so a reader sees a
//! whole block or none, and carry digests of their bytes checked before any byte is served
//! (`seal`): a damaged entry is dropped, counted and fetched again. The disk cache
//! drops what the reader's [`Plan`] says is needed furthest ahead (the Loader gives one for
//! each epoch), least recently used without one ([`policy`]); one process at a time trims
//! the directory to its byte limit (an advisory lock), and never leaves its disk with less
//! free space than a floor, whatever the limit (`room`). Batches whose blocks are all on disk
//! are read straight from the block files into the batch ([`CachedObject`]), like a local
//! shard.

mod admission;
#[cfg(test)]
mod behind;
mod counters;
mod disk;
#[cfg(test)]
mod disk_room;
mod files;
pub use self::files::block_key;
pub(crate) use self::files::WRITE_PIECE;
mod lease;
pub mod policy;
mod ranged;
mod read;
pub(crate) mod room;
mod seal;

pub use counters::{CacheCounters, CacheSnapshot};
pub(crate) use disk::warn_once;
pub use policy::{Eviction, Plan};
pub use ranged::RemoteReader;
pub use read::{is_gone, CachedObject, Gone};
pub(crate) use room::default_limit;
pub use seal::UNVERIFIED_ENV;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};

use self::disk::DiskCache;
pub(crate) use self::lease::{Claim, Lease};
use crate::error::{Error, Result};

/// The block size unless the options say (`cache_block`): 1 MiB.
pub const DEFAULT_BLOCK: u64 = 1 << 20;
/// The block size for a Loader reading shards front to back (storage order, shard shuffle)
/// unless the options say ([`SourceOptions::for_order`](crate::SourceOptions::for_order)):
/// 8 MiB, one fetch part. Measured on a cold and a warm epoch of 64 MiB tar shards over S3:
/// the warm epoch 1.4-1.7x the 1 MiB blocks' rate, the cold one a little faster.
pub const ORDERED_BLOCK: u64 = 8 << 20;

/// Cache settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheConfig {
    /// Memory cache size in bytes (0: no memory cache).
    pub memory_bytes: u64,
    /// Block size: objects are cached in aligned blocks of this many bytes.
    pub block: u64,
    /// Disk cache directory (None: no disk cache).
    pub disk_dir: Option<PathBuf>,
    /// Disk cache size limit in bytes (None: 10% of the space its disk has for it, counting
    /// what it holds already, between 256 MiB and 50 GiB).
    pub disk_bytes: Option<u64>,
    /// How the disk cache picks what to drop.
    pub eviction: Eviction,
    /// What a read does when the disk cache's writes fall behind.
    pub behind: crate::uri::Behind,
    /// Whether `block` may grow to [`ORDERED_BLOCK`] before the first read, when a Loader's
    /// run will read all of the data and it fits whole in the disk cache (see
    /// [`BlockCache::widen_block`]); set when the options do not choose a block.
    pub widen: bool,
}

impl CacheConfig {
    /// The caches a source's options ask for (memory off, the disk cache on, by default).
    pub fn from_options(opts: &crate::uri::SourceOptions) -> Self {
        CacheConfig {
            memory_bytes: opts.cache_bytes.unwrap_or(0),
            block: opts.cache_block.unwrap_or(DEFAULT_BLOCK).max(4096),
            disk_dir: opts.disk_cache_dir(),
            disk_bytes: opts.disk_cache_bytes,
            eviction: opts.cache_eviction.unwrap_or_default(),
            behind: opts.disk_cache_behind.unwrap_or_default(),
            widen: opts.cache_block.is_none(),
        }
    }

    /// Whether any cache is on.
    pub fn enabled(&self) -> bool {
        self.memory_bytes > 0 || self.disk_dir.is_some()
    }
}

/// A fetch in flight: the block, and whether it came from the disk cache.
type Flight = Shared<BoxFuture<'static, std::result::Result<(Bytes, bool), Arc<Error>>>>;

/// Most bytes of blocks written behind the reads that fetched them at once (see
/// [`BlockCache::get_or_fetch`]), in KiB.
const WRITE_BEHIND_KIB: u32 = 64 << 10;

/// Set in [`BlockCache`]'s block size once a read has used it: from then on it cannot change.
const FROZEN: u64 = 1 << 63;

/// Blocks fetched and not yet on disk: written behind the reads that fetched them, and served
/// from here meanwhile.
#[derive(Default)]
struct Pending {
    blocks: Mutex<HashMap<u128, Bytes>>,
    /// Signalled when a block is on disk (or given up on).
    landed: std::sync::Condvar,
}

/// A block cache keyed by 128-bit hashes of (object, version, block).
pub struct BlockCache {
    cfg: CacheConfig,
    /// The block size in use (`cfg.block` unless widened), with [`FROZEN`] set once a read
    /// has used it.
    block: AtomicU64,
    mem: Mutex<(lru::LruCache<u128, Bytes>, u64)>,
    flights: Mutex<HashMap<u128, Flight>>,
    disk: Option<Arc<DiskCache>>,
    pending: Arc<Pending>,
    /// KiB of blocks that may wait to be written (beyond it, reads wait for the disk).
    write_budget: Arc<tokio::sync::Semaphore>,
    counters: Arc<CacheCounters>,
}

impl Drop for BlockCache {
    fn drop(&mut self) {
        // A process about to exit would lose the blocks still being written.
        self.wait_for_writes(std::time::Duration::from_secs(30));
    }
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl BlockCache {
    /// A cache with these settings; the disk directory is created if needed. A directory
    /// that cannot be created or written is warned about once and does without (never an
    /// error: the cache only saves requests).
    pub fn new(cfg: CacheConfig) -> Result<Self> {
        let disk = cfg.disk_dir.as_deref().and_then(|dir| DiskCache::open(dir, cfg.disk_bytes)).map(Arc::new);
        let counters = Arc::new(CacheCounters::default());
        if let Some(d) = &disk {
            counters.disk_stale_removed.store(d.stale_removed, Relaxed);
        }
        Ok(BlockCache {
            mem: Mutex::new((lru::LruCache::unbounded(), 0)),
            flights: Mutex::new(HashMap::new()),
            disk,
            pending: Arc::default(),
            write_budget: Arc::new(tokio::sync::Semaphore::new(WRITE_BEHIND_KIB as usize)),
            counters,
            block: AtomicU64::new(cfg.block.max(1)),
            cfg,
        })
    }

    /// Wait until the blocks written behind reads are on disk (another process, or a test,
    /// may look for them there).
    pub async fn flush(&self) {
        let _ = self.write_budget.acquire_many(WRITE_BEHIND_KIB).await;
    }

    /// The block size in use: the configured one, or [`ORDERED_BLOCK`] once widened.
    pub fn block(&self) -> u64 {
        self.block.load(Relaxed) & !FROZEN
    }

    /// The block size, for a read about to use it: from now on it does not change (blocks
    /// of one size are keyed, cut and counted alike by every read of this cache).
    pub(crate) fn block_for_read(&self) -> u64 {
        // Every read comes here: a plain load once frozen, so reads on many threads do not
        // all write this one word.
        let now = self.block.load(Relaxed);
        if now & FROZEN != 0 {
            return now & !FROZEN;
        }
        self.block.fetch_or(FROZEN, Relaxed) & !FROZEN
    }

    /// Take blocks of `to` bytes instead of the configured size, if the options left the
    /// block to Stoker ([`CacheConfig::widen`]), no read has used the cache yet, and `to` is
    /// bigger. For a run that reads every block of data the disk cache holds whole, a
    /// bigger block costs nothing (each is read whole before the epoch ends) and makes
    /// fewer requests and fewer files: a per-sample shuffle's cold epoch over 64 MiB shards
    /// read 1.7x the samples per second with 8 MiB blocks, its warm epoch 1.6x. Returns
    /// whether it changed.
    pub fn widen_block(&self, to: u64) -> bool {
        let now = self.block.load(Relaxed);
        self.cfg.widen
            && now & FROZEN == 0
            && to > now
            && self.block.compare_exchange(now, to, Relaxed, Relaxed).is_ok()
    }

    /// The disk cache's size limit in bytes, when there is a usable disk cache.
    pub fn disk_limit(&self) -> Option<u64> {
        self.disk.as_ref().map(|d| d.limit())
    }

    /// Evict from the disk by `plan` (what the reader will read, and when) from now on;
    /// `None` goes back to least recently used. Ignored under [`Eviction::Lru`]. Returns
    /// whether the plan is followed.
    pub fn set_plan(&self, plan: Option<Arc<Plan>>) -> bool {
        match &self.disk {
            Some(d) if self.cfg.eviction == Eviction::Future => {
                let on = plan.is_some();
                d.set_plan(plan);
                on
            }
            _ => false,
        }
    }

    /// Whether missing block `key` (`len` bytes, of which a read needs `piece` now) is worth
    /// fetching whole for the cache, or only the piece should be fetched: by the plan, a
    /// block is fetched whole when it will be read often enough while cached to pay for the
    /// rest of it (a 64 KiB sample of a 1 MiB block read once before it would be dropped is
    /// not). Always true without a disk cache or a plan.
    pub fn worth_fetching_whole(&self, key: u128, len: u64, piece: u64) -> bool {
        match &self.disk {
            Some(d) if self.cfg.memory_bytes == 0 => {
                let whole = d.worth_fetching_whole(key, len, piece);
                self.counters.disk_bypassed.store(d.bypassed.load(Relaxed), Relaxed);
                whole
            }
            _ => true,
        }
    }

    /// Whether block `key` is cached, as far as this process knows without a file system
    /// call (another process may have added or removed it since).
    pub fn contains(&self, key: u128) -> bool {
        self.mem.lock().unwrap_or_else(|e| e.into_inner()).0.contains(&key)
            || self.pending.blocks.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&key)
            || self.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    /// What the cache has done so far.
    pub fn snapshot(&self) -> CacheSnapshot {
        self.counters().snapshot()
    }

    /// The counters.
    pub(crate) fn counters(&self) -> &CacheCounters {
        if let Some(d) = &self.disk {
            self.counters.disk_writes.store(d.writes.load(Relaxed), Relaxed);
            self.counters.disk_evictions.store(d.evictions.load(Relaxed), Relaxed);
            self.counters.disk_bypassed.store(d.bypassed.load(Relaxed), Relaxed);
            self.counters.disk_corrupt.store(d.corrupt.load(Relaxed), Relaxed);
        }
        &self.counters
    }

    /// The settings.
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Bytes held in memory.
    pub fn memory_used(&self) -> u64 {
        self.mem.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Block `key` of `len` bytes: from memory, else from disk, else from `fetch`. Concurrent
    /// misses of one key make one fetch. A fetched block is written to disk behind the read
    /// (which so waits for the network only), and served from memory until it is there; when
    /// 64 MiB of blocks wait to be written, reads wait for the disk.
    pub async fn get_or_fetch<Fut>(&self, key: u128, len: usize, fetch: impl FnOnce() -> Fut) -> Result<Bytes>
    where
        Fut: Future<Output = Result<Bytes>> + Send + 'static,
    {
        self.get_or_fetch_claimed(key, len, None, fetch).await
    }

    /// [`get_or_fetch`](Self::get_or_fetch) by a fetch that may hold the block's lease already
    /// ([`claim`](Self::claim)); without it, a miss takes the lease (waiting for another
    /// process's fetch of the block, and reading what it stored) before fetching.
    pub(crate) async fn get_or_fetch_claimed<Fut>(
        &self,
        key: u128,
        len: usize,
        held: Option<Lease>,
        fetch: impl FnOnce() -> Fut,
    ) -> Result<Bytes>
    where
        Fut: Future<Output = Result<Bytes>> + Send + 'static,
    {
        if let Some(b) = self.mem.lock().unwrap_or_else(|e| e.into_inner()).0.get(&key) {
            self.counters.hits.fetch_add(1, Relaxed);
            return Ok(b.clone());
        }
        self.counters.misses.fetch_add(1, Relaxed);
        if let Some(b) = self.pending.blocks.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            self.counters.disk_hits.fetch_add(1, Relaxed);
            return Ok(b.clone());
        }
        let (flight, leader) = {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            match flights.get(&key) {
                Some(f) => {
                    // The flight may be waiting for this very lease: let it go.
                    drop(held);
                    self.counters.joined.fetch_add(1, Relaxed);
                    (f.clone(), false)
                }
                None => {
                    let disk = self.disk.clone();
                    let (pending, budget) = (self.pending.clone(), self.write_budget.clone());
                    let counters = self.counters.clone();
                    let skip_when_behind = self.cfg.behind == crate::uri::Behind::Skip;
                    let fut = fetch();
                    let f = async move {
                        let mut lease = held;
                        if let Some(d) = &disk {
                            match lease::stored_or_lease(d, key, len, lease, &counters).await {
                                Ok(b) => return Ok((b, true)),
                                Err(l) => lease = l,
                            }
                        }
                        let b = fut.await.map_err(Arc::new)?;
                        // Whether to keep it is decided now, by the plan as it stands; the
                        // write goes behind the read, and the lease is held until it lands.
                        if let Some(d) = disk.filter(|d| d.admit(key, b.len() as u64)) {
                            let want = (b.len().div_ceil(1024) as u32).clamp(1, WRITE_BEHIND_KIB);
                            let permit = if skip_when_behind {
                                budget.try_acquire_many_owned(want).ok()
                            } else {
                                budget.acquire_many_owned(want).await.ok()
                            };
                            match permit {
                                Some(permit) => {
                                    pending.blocks.lock().unwrap_or_else(|e| e.into_inner()).insert(key, b.clone());
                                    let b2 = b.clone();
                                    // Best effort: a full disk must not fail the read.
                                    drop(tokio::task::spawn_blocking(move || {
                                        d.store(key, &b2);
                                        drop(lease);
                                        pending.blocks.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                                        pending.landed.notify_all();
                                        drop(permit);
                                    }));
                                }
                                None => {
                                    // Not stored after all: the disk's books must not count it.
                                    d.ranks().remove(key);
                                    counters.disk_behind.fetch_add(1, Relaxed);
                                }
                            }
                        }
                        Ok((b, false))
                    }
                    .boxed()
                    .shared();
                    flights.insert(key, f.clone());
                    (f, true)
                }
            }
        };
        let result = flight.await;
        if leader {
            self.flights.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        }
        let (bytes, from_disk) = result.map_err(|e| Arc::try_unwrap(e).unwrap_or_else(Error::Shared))?;
        if leader && from_disk {
            self.counters.disk_hits.fetch_add(1, Relaxed);
        }
        self.insert(key, bytes.clone());
        Ok(bytes)
    }

    /// Wait (at most `limit`) for the blocks being written behind reads to land.
    fn wait_for_writes(&self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        let mut blocks = self.pending.blocks.lock().unwrap_or_else(|e| e.into_inner());
        while !blocks.is_empty() {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else { return };
            blocks = match self.pending.landed.wait_timeout(blocks, left) {
                Ok((b, _)) => b,
                Err(e) => e.into_inner().0,
            };
        }
    }

    fn insert(&self, key: u128, bytes: Bytes) {
        if self.cfg.memory_bytes == 0 || bytes.len() as u64 > self.cfg.memory_bytes {
            return;
        }
        let mut mem = self.mem.lock().unwrap_or_else(|e| e.into_inner());
        let (lru, used) = &mut *mem;
        if let Some(old) = lru.put(key, bytes.clone()) {
            *used -= old.len() as u64;
        }
        *used += bytes.len() as u64;
        while *used > self.cfg.memory_bytes {
            match lru.pop_lru() {
                Some((_, b)) => {
                    *used -= b.len() as u64;
                    self.counters.evictions.fetch_add(1, Relaxed);
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uri::SourceOptions;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn the_options_say_which_caches() {
        for off in ["disk_cache=false", "disk_cache=false&disk_cache_dir=/tmp/x"] {
            let o = SourceOptions::from_query(off).unwrap();
            assert_eq!(CacheConfig::from_options(&o).disk_dir, None, "{off}");
        }
        let sized = CacheConfig::from_options(&SourceOptions::from_query("disk_cache_bytes=1000").unwrap());
        assert_eq!(sized.disk_bytes, Some(1000));
        let default = CacheConfig::from_options(&SourceOptions::default());
        assert_eq!(default.disk_bytes, None, "sized from the free space");
        assert_eq!((default.memory_bytes, default.block), (0, DEFAULT_BLOCK));
    }

    fn block(n: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; n])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_make_one_fetch() {
        let cache = Arc::new(
            BlockCache::new(CacheConfig { memory_bytes: 1 << 20, block: 1024, ..Default::default() }).unwrap(),
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (cache, calls) = (cache.clone(), calls.clone());
                tokio::spawn(async move {
                    cache
                        .get_or_fetch(7, 1024, || async move {
                            calls.fetch_add(1, Relaxed);
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            Ok(block(1024, 9))
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), block(1024, 9));
        }
        assert_eq!(calls.load(Relaxed), 1, "one request for 16 concurrent misses");
        let c = cache.counters();
        assert_eq!(c.misses.load(Relaxed), 16);
        assert_eq!(c.joined.load(Relaxed), 15);
        cache.get_or_fetch(7, 1024, || async { unreachable!("cached") }).await.unwrap();
        assert_eq!(c.hits.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn memory_is_bounded_and_evicts_least_recent() {
        let cache = BlockCache::new(CacheConfig { memory_bytes: 3000, block: 1000, ..Default::default() }).unwrap();
        for k in 0..5u128 {
            cache.get_or_fetch(k, 1000, move || async move { Ok(block(1000, k as u8)) }).await.unwrap();
            assert!(cache.memory_used() <= 3000);
        }
        assert_eq!(cache.counters().evictions.load(Relaxed), 2);
        // 0 and 1 were evicted; 4 is still there.
        let refetched = Arc::new(AtomicUsize::new(0));
        let r = refetched.clone();
        cache
            .get_or_fetch(0, 1000, move || async move {
                r.fetch_add(1, Relaxed);
                Ok(block(1000, 0))
            })
            .await
            .unwrap();
        cache.get_or_fetch(4, 1000, || async { unreachable!("4 is cached") }).await.unwrap();
        assert_eq!(refetched.load(Relaxed), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn disk_cache_is_shared_whole_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = CacheConfig {
            memory_bytes: 0,
            block: 4096,
            disk_dir: Some(dir.path().into()),
            disk_bytes: Some(40_000),
            ..Default::default()
        };
        // Two caches on one directory stand for two processes.
        let a = BlockCache::new(cfg.clone()).unwrap();
        let b = BlockCache::new(cfg).unwrap();
        a.get_or_fetch(1, 4096, || async { Ok(block(4096, 1)) }).await.unwrap();
        a.flush().await;
        let got = b.get_or_fetch(1, 4096, || async { unreachable!("on disk") }).await.unwrap();
        assert_eq!(got, block(4096, 1));
        assert_eq!(b.counters().disk_hits.load(Relaxed), 1);
        // A torn or foreign file of the wrong length is a miss, never returned.
        let path = a.disk.as_ref().unwrap().path(2);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"short").unwrap();
        let got = b.get_or_fetch(2, 4096, || async { Ok(block(4096, 2)) }).await.unwrap();
        assert_eq!(got, block(4096, 2));
        // Writing far past the limit keeps the directory near it.
        for k in 10..60u128 {
            let c = if k % 2 == 0 { &a } else { &b };
            c.get_or_fetch(k, 4096, move || async move { Ok(block(4096, k as u8)) }).await.unwrap();
            c.flush().await;
        }
        let total: u64 = files::scan(dir.path()).iter().map(|e| e.len).sum();
        assert!(total <= 40_000 + 2 * 4096, "disk cache holds {total} bytes");
        assert!(a.counters().disk_evictions.load(Relaxed) + b.counters().disk_evictions.load(Relaxed) > 0);
    }
}
