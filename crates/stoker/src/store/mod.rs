//! Where bytes live: one thin wrapper over `object_store`, the only place layouts read from.
//!
//! Layout code (objects, tar) asks a [`Store`] for listings, whole objects and byte ranges by
//! path relative to the store root. Today the store is a local directory through
//! `object_store`'s `LocalFileSystem`; remote stores plug in here without layout changes.

use std::fmt;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::{Error, Result};
use crate::fetch::Fetcher;

mod remote;

/// An object in a store: its path relative to the store root and what identifies its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the store root, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, microseconds since the Unix epoch.
    pub modified_us: i64,
    /// The store's version tag, if it has one (local: inode, mtime and size).
    pub e_tag: Option<String>,
}

/// Requests and bytes a store has served, for benchmarks and for checking that ranged
/// layouts really coalesce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Read requests issued (each range of a multi-range read counts once).
    pub requests: u64,
    /// Payload bytes returned.
    pub bytes: u64,
    /// HTTP requests the fetch layer sent (remote stores; retries and hedges included).
    pub remote_requests: u64,
    /// Bytes the fetch layer received (remote stores; retries and hedges included): what
    /// caches save shows here, where `bytes` counts what readers asked for.
    pub remote_bytes: u64,
    /// Remote requests retried after a transient failure.
    pub retries: u64,
    /// Remote requests hedged (a duplicate sent because the first was slow).
    pub hedges: u64,
    /// Hedges that answered first.
    pub hedge_wins: u64,
    /// Block cache hits (memory).
    pub cache_hits: u64,
    /// Block cache misses (memory).
    pub cache_misses: u64,
    /// Misses served by the disk cache.
    pub disk_hits: u64,
    /// Of those, blocks read straight from their files into batches (the hit path).
    pub disk_direct: u64,
}

/// A cheaply cloneable handle on a store rooted at a directory or prefix.
#[derive(Clone)]
pub struct Store(Arc<Inner>);

struct Inner {
    objects: Arc<dyn ObjectStore>,
    /// The same store when it is local: reads bypass object_store to use recycled buffers.
    local: Option<Arc<LocalFileSystem>>,
    /// Display form of the root (a path or a redacted URI).
    root: String,
    /// Set for local stores: lets blocking readers use positioned reads on one open file.
    local_root: Option<PathBuf>,
    /// Path inside the object store that every relative path is under ("" for local).
    prefix: String,
    /// Remote stores read through the fetch layer.
    fetcher: Option<Arc<Fetcher>>,
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("root", &self.0.root).finish_non_exhaustive()
    }
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.root)
    }
}

impl Store {
    /// A store over a local directory, which must exist.
    pub fn local(dir: &Path) -> Result<Self> {
        let canonical = std::fs::canonicalize(dir).map_err(|e| Error::io(dir.display(), e))?;
        let local = Arc::new(
            LocalFileSystem::new_with_prefix(&canonical)
                .map_err(|e| Error::Store { path: dir.display().to_string(), source: e })?,
        );
        Ok(Store(Arc::new(Inner {
            objects: local.clone(),
            local: Some(local),
            root: canonical.display().to_string(),
            local_root: Some(canonical),
            prefix: String::new(),
            fetcher: None,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })))
    }

    /// The local directory behind this store, if it is local.
    pub fn local_root(&self) -> Option<&Path> {
        self.0.local_root.as_deref()
    }

    /// A human-readable location of `path` for messages (`/data/shards/a.tar`).
    pub fn describe(&self, path: &str) -> String {
        if path.is_empty() {
            self.0.root.clone()
        } else {
            format!("{}/{}", self.0.root.trim_end_matches('/'), path)
        }
    }

    /// The file behind `path` when the store is local.
    pub fn local_path(&self, path: &str) -> Option<PathBuf> {
        self.0.local.as_ref()?.path_to_filesystem(&self.obj_path(path)).ok()
    }

    /// Requests and bytes served so far.
    pub fn counters(&self) -> IoCounters {
        let mut c = IoCounters {
            requests: self.0.requests.load(Ordering::Relaxed),
            bytes: self.0.bytes.load(Ordering::Relaxed),
            ..Default::default()
        };
        if let Some(f) = self.fetch_counters() {
            c.remote_requests = f.requests.load(Ordering::Relaxed);
            c.remote_bytes = f.bytes.load(Ordering::Relaxed);
            c.retries = f.retries.load(Ordering::Relaxed);
            c.hedges = f.hedges.load(Ordering::Relaxed);
            c.hedge_wins = f.hedge_wins.load(Ordering::Relaxed);
        }
        if let Some(k) = self.cache_counters() {
            c.cache_hits = k.hits.load(Ordering::Relaxed);
            c.cache_misses = k.misses.load(Ordering::Relaxed);
            c.disk_hits = k.disk_hits.load(Ordering::Relaxed);
            c.disk_direct = k.disk_direct.load(Ordering::Relaxed);
        }
        c
    }

    /// Count reads made outside the store's own methods (direct reads into batches).
    pub(crate) fn count(&self, requests: u64, bytes: u64) {
        self.0.requests.fetch_add(requests, Ordering::Relaxed);
        self.0.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn obj_path(&self, path: &str) -> ObjPath {
        let full = if self.0.prefix.is_empty() { path.to_string() } else { format!("{}/{path}", self.0.prefix) };
        ObjPath::parse(&full).unwrap_or_else(|_| ObjPath::from(full.as_str()))
    }

    /// Whether bytes come over the network (through the fetch layer).
    pub fn is_remote(&self) -> bool {
        self.0.fetcher.is_some()
    }

    /// The fetch layer's counters, for remote stores.
    pub fn fetch_counters(&self) -> Option<&crate::fetch::FetchCounters> {
        self.0.fetcher.as_ref().map(|f| f.counters())
    }

    fn err(&self, path: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                what: self.describe(path),
                hint: Some("the object disappeared or was renamed since the source was opened".into()),
            },
            source => Error::Store { path: self.describe(path), source },
        }
    }

    /// Every object under the root (recursively), sorted by path.
    pub async fn list(&self) -> Result<Vec<ObjectInfo>> {
        let prefix = (!self.0.prefix.is_empty()).then(|| self.obj_path(""));
        let strip = if self.0.prefix.is_empty() { 0 } else { self.0.prefix.len() + 1 };
        let info = |m: object_store::ObjectMeta| ObjectInfo {
            path: m.location.as_ref().get(strip..).unwrap_or_default().to_string(),
            size: m.size,
            modified_us: m.last_modified.timestamp_micros(),
            e_tag: m.e_tag,
        };
        let mut out: Vec<ObjectInfo> = match &self.0.fetcher {
            Some(f) => f.list(prefix.as_ref(), &self.describe("")).await?.into_iter().map(info).collect(),
            None => {
                self.0.objects.list(prefix.as_ref()).map_ok(info).try_collect().await.map_err(|e| self.err("", e))?
            }
        };
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Size and version of one object.
    pub async fn head(&self, path: &str) -> Result<ObjectInfo> {
        let m = match &self.0.fetcher {
            Some(f) => f.head(&self.obj_path(path), &self.describe(path)).await?,
            None => self.0.objects.head(&self.obj_path(path)).await.map_err(|e| self.err(path, e))?,
        };
        Ok(ObjectInfo {
            path: path.to_string(),
            size: m.size,
            modified_us: m.last_modified.timestamp_micros(),
            e_tag: m.e_tag,
        })
    }

    /// A whole object.
    pub async fn get(&self, path: &str) -> Result<Bytes> {
        if let Some(f) = &self.0.fetcher {
            let bytes = f.get(&self.obj_path(path), &self.describe(path)).await?;
            self.count(1, bytes.len() as u64);
            return Ok(bytes);
        }
        if self.0.local.is_some() {
            let bytes = self.local_read(path, None).await?.pop().unwrap_or_default();
            self.count(1, bytes.len() as u64);
            return Ok(bytes);
        }
        let fetch = async { self.0.objects.get(&self.obj_path(path)).await?.bytes().await };
        let bytes = fetch.await.map_err(|e| self.err(path, e))?;
        self.count(1, bytes.len() as u64);
        Ok(bytes)
    }

    /// One byte range of an object. A short read (the object shrank) is an error.
    pub async fn get_range(&self, path: &str, range: Range<u64>) -> Result<Bytes> {
        let want = range.end - range.start;
        let bytes = if let Some(f) = &self.0.fetcher {
            f.get_ranges(&self.obj_path(path), &self.describe(path), std::slice::from_ref(&range))
                .await?
                .pop()
                .unwrap_or_default()
        } else if self.0.local.is_some() {
            self.local_read(path, Some(vec![range.clone()])).await?.pop().unwrap_or_default()
        } else {
            self.0.objects.get_range(&self.obj_path(path), range.clone()).await.map_err(|e| self.err(path, e))?
        };
        self.count(1, bytes.len() as u64);
        check_len(self, path, &range, &bytes, want)?;
        Ok(bytes)
    }

    /// Byte ranges of an object whose `size` and `version` are known (from an index): remote
    /// stores serve them through the block cache when one is configured, and only while the
    /// object still has entity tag `e_tag` (when known), so a replaced object is an error.
    pub async fn get_ranges_versioned(
        &self,
        path: &str,
        ranges: &[Range<u64>],
        size: u64,
        version: &str,
        e_tag: Option<&str>,
    ) -> Result<Vec<Bytes>> {
        match &self.0.fetcher {
            Some(f) => {
                let (obj, shown) = (self.obj_path(path), self.describe(path));
                let out = f.get_ranges_cached(&obj, &shown, ranges, size, version, e_tag).await?;
                self.count(ranges.len() as u64, out.iter().map(|b| b.len() as u64).sum());
                for (r, b) in ranges.iter().zip(&out) {
                    check_len(self, path, r, b, r.end - r.start)?;
                }
                Ok(out)
            }
            None => self.get_ranges(path, ranges).await,
        }
    }

    /// Tell the cache what a reader will read and when (see [`Fetcher::plan_reads`]), for
    /// `objects` given as (path relative to the root, version, size). Local stores have no
    /// cache: false.
    pub fn plan_reads(
        &self,
        objects: &[(&str, &str, u64)],
        uses: crate::cache::policy::Uses<'_>,
        clock: Arc<AtomicU64>,
    ) -> bool {
        let Some(f) = &self.0.fetcher else { return false };
        let objects: Vec<(ObjPath, String, u64)> =
            objects.iter().map(|&(p, v, size)| (self.obj_path(p), v.to_string(), size)).collect();
        f.plan_reads(&objects, uses, clock)
    }

    /// Whether every block of `ranges` of `path` (at `version`) is in the disk cache, as far
    /// as this process knows (no file system call): what the hit path needs.
    pub(crate) fn on_disk<'a>(
        &self,
        path: &str,
        version: &str,
        ranges: impl IntoIterator<Item = &'a Range<u64>>,
    ) -> bool {
        let Some(cache) = self.0.fetcher.as_ref().and_then(|f| f.cache()) else { return false };
        let bs = cache.config().block.max(1);
        let obj = self.obj_path(path);
        ranges.into_iter().filter(|r| r.end > r.start).all(|r| {
            (r.start / bs..=(r.end - 1) / bs).all(|b| cache.on_disk(crate::cache::block_key(obj.as_ref(), version, b)))
        })
    }

    /// A blocking reader of `path` (at `version`, `size` bytes) from the disk cache's block
    /// files; `None` without a disk cache. Reads through it count as store reads.
    pub(crate) fn cached_object(&self, path: &str, version: &str, size: u64) -> Option<crate::cache::CachedObject> {
        let cache = self.0.fetcher.as_ref()?.cache()?;
        cache.cached_object(self.obj_path(path).as_ref(), version, size)
    }

    /// Cache counters, when this store has a block cache.
    pub fn cache_counters(&self) -> Option<&crate::cache::CacheCounters> {
        self.0.fetcher.as_ref()?.cache().map(|c| c.counters())
    }

    /// Several byte ranges of one object, in the order asked.
    pub async fn get_ranges(&self, path: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let out = if let Some(f) = &self.0.fetcher {
            f.get_ranges(&self.obj_path(path), &self.describe(path), ranges).await?
        } else if self.0.local.is_some() {
            self.local_read(path, Some(ranges.to_vec())).await?
        } else {
            self.0.objects.get_ranges(&self.obj_path(path), ranges).await.map_err(|e| self.err(path, e))?
        };
        self.count(ranges.len() as u64, out.iter().map(|b| b.len() as u64).sum());
        for (r, b) in ranges.iter().zip(&out) {
            check_len(self, path, r, b, r.end - r.start)?;
        }
        Ok(out)
    }

    /// Local reads: one blocking task opens the file once and reads each range (or the whole
    /// file) into recycled buffers. A range past the end comes back short and the caller's
    /// length check reports it.
    async fn local_read(&self, path: &str, ranges: Option<Vec<Range<u64>>>) -> Result<Vec<Bytes>> {
        let fs = self.0.local.as_ref().expect("local_read is only called on local stores");
        let full = fs.path_to_filesystem(&self.obj_path(path)).map_err(|e| self.err(path, e))?;
        let shown = self.describe(path);
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            let file = std::fs::File::open(&full).map_err(|e| Error::io(&shown, e))?;
            let ranges = match ranges {
                Some(r) => r,
                None => std::iter::once(0..file.metadata().map_err(|e| Error::io(&shown, e))?.len()).collect(),
            };
            ranges
                .into_iter()
                .map(|r| {
                    let want = (r.end.saturating_sub(r.start)) as usize;
                    let mut buf = crate::buffer::take(want);
                    let mut done = 0;
                    while done < want {
                        match file.read_at(&mut buf[done..want], r.start + done as u64) {
                            Ok(0) => break,
                            Ok(n) => done += n,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(Error::io(&shown, e)),
                        }
                    }
                    Ok(crate::buffer::freeze(buf, done))
                })
                .collect()
        })
        .await
        .map_err(Error::task)?
    }

    /// Write a whole object atomically (local: a staged file renamed into place).
    pub async fn put(&self, path: &str, bytes: Bytes) -> Result<()> {
        self.0.objects.put(&self.obj_path(path), PutPayload::from(bytes)).await.map_err(|e| self.err(path, e))?;
        Ok(())
    }

    /// A blocking `Read + Seek` view of an object for header walks (tar indexing).
    ///
    /// Reads go `block` bytes at a time and a seek within the current block is free, so
    /// walking headers does not read the payloads between them. Call it from a blocking
    /// thread, never from an async task.
    pub fn blocking_reader(&self, path: &str, size: u64, block: usize) -> Result<BlockReader> {
        let fetch = match self.local_root() {
            Some(root) => {
                let full = root.join(path);
                let file = std::fs::File::open(&full).map_err(|e| Error::io(full.display(), e))?;
                Fetch::Local(file)
            }
            None => Fetch::Remote(self.clone(), path.to_string(), tokio::runtime::Handle::current()),
        };
        Ok(BlockReader { fetch, size, pos: 0, buf: Bytes::new(), buf_start: 0, block: block.max(512) })
    }
}

fn check_len(store: &Store, path: &str, range: &Range<u64>, got: &Bytes, want: u64) -> Result<()> {
    if got.len() as u64 != want {
        return Err(Error::Io {
            path: store.describe(path),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("asked for bytes {}..{} ({want} bytes) but got {}", range.start, range.end, got.len()),
            ),
        });
    }
    Ok(())
}

enum Fetch {
    Local(std::fs::File),
    Remote(Store, String, tokio::runtime::Handle),
}

/// Blocking, block-buffered `Read + Seek` over one object. See [`Store::blocking_reader`].
pub struct BlockReader {
    fetch: Fetch,
    size: u64,
    pos: u64,
    buf: Bytes,
    buf_start: u64,
    block: usize,
}

impl BlockReader {
    /// The current position.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The object size given when the reader was made.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn fill(&mut self) -> io::Result<()> {
        let end = (self.pos + self.block as u64).min(self.size);
        let range = self.pos..end;
        self.buf = match &self.fetch {
            Fetch::Local(file) => {
                use std::os::unix::fs::FileExt;
                let mut v = vec![0u8; (end - self.pos) as usize];
                let mut done = 0;
                while done < v.len() {
                    match file.read_at(&mut v[done..], self.pos + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                v.truncate(done);
                Bytes::from(v)
            }
            Fetch::Remote(store, path, handle) => {
                handle.block_on(store.get_range(path, range)).map_err(|e| io::Error::other(e.to_string()))?
            }
        };
        self.buf_start = self.pos;
        Ok(())
    }
}

impl Read for BlockReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size || out.is_empty() {
            return Ok(0);
        }
        let in_buf = self.pos >= self.buf_start && self.pos < self.buf_start + self.buf.len() as u64;
        if !in_buf {
            self.fill()?;
            if self.buf.is_empty() {
                return Ok(0);
            }
        }
        let off = (self.pos - self.buf_start) as usize;
        let n = out.len().min(self.buf.len() - off);
        out[..n].copy_from_slice(&self.buf[off..off + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for BlockReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before start"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_store_lists_reads_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b.bin"), b"0123456789").unwrap();
        std::fs::write(dir.path().join("a.bin"), b"xy").unwrap();
        let s = Store::local(dir.path()).unwrap();
        let l = s.list().await.unwrap();
        assert_eq!(l.iter().map(|o| o.path.as_str()).collect::<Vec<_>>(), ["a.bin", "sub/b.bin"]);
        assert_eq!(&s.get_range("sub/b.bin", 2..5).await.unwrap()[..], b"234");
        let r = s.get_ranges("sub/b.bin", &[0..1, 8..10]).await.unwrap();
        assert_eq!((&r[0][..], &r[1][..]), (&b"0"[..], &b"89"[..]));
        assert_eq!(s.counters(), IoCounters { requests: 3, bytes: 6, ..Default::default() });
        assert!(s.get_range("sub/b.bin", 5..20).await.is_err(), "a short read must be an error");
        assert!(matches!(s.get("nope").await, Err(Error::NotFound { .. })));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn block_reader_seeks_within_and_past_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let s = Store::local(dir.path()).unwrap();
        let mut r = s.blocking_reader("f", data.len() as u64, 1024).unwrap();
        let mut b = [0u8; 10];
        r.seek(SeekFrom::Start(1020)).unwrap();
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b[..], &data[1020..1030]);
        r.seek(SeekFrom::Current(3000)).unwrap();
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b[..], &data[4030..4040]);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, &data[4040..]);
    }
}
