//! The hit path: reading an object's bytes straight from the disk cache's block files into
//! the caller's buffer (a batch's column), as a local shard is read: each block file opened
//! once per reader, one positioned read per piece of a block wanted, no request, no
//! intermediate buffer, no task per block. The layouts use it when every block a batch needs
//! is in the cache ([`BlockCache::on_disk`]); a block that went missing meanwhile (another
//! process evicted it) makes the read fail as [`Gone`], and the caller reads the rest the
//! usual way. So does a block that fails verification (every chunk a read touches is checked
//! against the block's trailer, [`super::seal`]): it is dropped from the cache, counted, and
//! the usual way fetches it again. The ranged reader uses it too, for pieces of a block only
//! on disk that a read needs a small part of ([`CachedObject::read_spans`]).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::disk::DiskCache;
use super::seal::BlockFile;
use super::{block_key, BlockCache, CacheCounters};

/// The error of a read whose block is not (or no longer) in the cache.
#[derive(Debug)]
pub struct Gone;

impl std::fmt::Display for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a block is no longer in the disk cache")
    }
}

impl std::error::Error for Gone {}

/// Blocking reads of one version of one object from the disk cache (see the module docs).
#[non_exhaustive]
pub struct CachedObject {
    disk: Arc<DiskCache>,
    counters: Arc<CacheCounters>,
    object: String,
    version: String,
    size: u64,
    block: u64,
    /// Block files opened so far (their trailers verified), and whether each was counted as
    /// a disk hit (at its first read that verified).
    open: HashMap<u64, (Arc<BlockFile>, bool)>,
}

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedObject").field("object", &self.object).field("blocks_open", &self.open.len()).finish()
    }
}

impl BlockCache {
    /// Whether block `key` is in the disk cache as far as this process knows (no file system
    /// call; another process may have evicted it since).
    pub fn on_disk(&self, key: u128) -> bool {
        self.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    /// Whether block `key` is on disk and not waiting to be written (as far as this process
    /// knows): without a memory cache, a read of a small part of it is then best served by
    /// [`CachedObject::read_spans`], not by reading the whole block.
    pub(crate) fn on_disk_written(&self, key: u128) -> bool {
        self.on_disk(key) && !self.pending.blocks.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&key)
    }

    /// A reader of `object` (at `version`, `size` bytes) from the disk cache's block files;
    /// `None` without a disk cache.
    pub fn cached_object(&self, object: &str, version: &str, size: u64) -> Option<CachedObject> {
        Some(CachedObject {
            disk: self.disk.clone()?,
            counters: self.counters.clone(),
            object: object.to_string(),
            version: version.to_string(),
            size,
            block: self.block_for_read(),
            open: HashMap::new(),
        })
    }
}

impl CachedObject {
    /// Fill `dst` with the object's bytes from offset `at`. A block that is not in the cache
    /// (or not whole) fails with [`Gone`] inside an `io::Error` of kind `NotFound`; `dst` is
    /// then partly written.
    pub fn read_exact_at(&mut self, dst: &mut [u8], at: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < dst.len() {
            let pos = at + done as u64;
            let b = pos / self.block;
            let within = pos - b * self.block;
            let n = (dst.len() - done).min((self.block - within) as usize);
            let verified = self.file(b)?.read_verified(&mut dst[done..done + n], within).map_err(|_| gone())?;
            if !verified {
                let key = block_key(&self.object, &self.version, self.block, b);
                self.disk.refuse(key, super::seal::Refused::Damaged);
                self.open.remove(&b);
                return Err(gone());
            }
            done += n;
        }
        // Counted once served: a read that fails here is read again the usual way, which
        // counts it there.
        if !dst.is_empty() {
            for b in at / self.block..=(at + dst.len() as u64 - 1) / self.block {
                let counted = self.open.get_mut(&b).map(|(_, c)| std::mem::replace(c, true));
                if counted == Some(false) {
                    // A disk hit like any other: counted, and it serves its planned use.
                    let want = self.block.min(self.size.saturating_sub(b * self.block));
                    self.disk.used(block_key(&self.object, &self.version, self.block, b), want);
                    self.counters.misses.fetch_add(1, Relaxed);
                    self.counters.disk_hits.fetch_add(1, Relaxed);
                    self.counters.disk_direct.fetch_add(1, Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Each of `spans` (byte ranges of the object) read into a buffer of its own, verified
    /// chunk by chunk; `None` for a span with a block gone from the cache or refused as
    /// damaged (the caller fetches it the usual way). A read of a 64 KiB sample costs its
    /// chunks, not the 8 MiB block it lies in.
    pub(crate) fn read_spans(&mut self, spans: &[std::ops::Range<u64>]) -> Vec<Option<bytes::Bytes>> {
        spans
            .iter()
            .map(|r| {
                let want = r.end.saturating_sub(r.start) as usize;
                let mut buf = crate::buffer::take(want);
                match self.read_exact_at(&mut buf[..want], r.start) {
                    Ok(()) => Some(crate::buffer::freeze(buf, want)),
                    Err(_) => None,
                }
            })
            .collect()
    }

    /// Block `b`'s file, opened once, its trailer verified.
    fn file(&mut self, b: u64) -> io::Result<&BlockFile> {
        if !self.open.contains_key(&b) {
            let want = self.block.min(self.size.saturating_sub(b * self.block));
            let key = block_key(&self.object, &self.version, self.block, b);
            let file = self.disk.open_block(key, want).ok_or_else(gone)?;
            self.open.insert(b, (file, false));
        }
        Ok(&self.open[&b].0)
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, Gone)
}

/// Whether `e` is a read that found its block gone from the cache.
pub fn is_gone(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Gone>())
}
