//! Blocking reads straight into the caller's buffers (a batch's columns), with no request and
//! no copy but into the batch: a local store's files, or a remote store's disk cache block
//! files (the hit path: a warm epoch reads like a local one). Each object is opened once per
//! reader; every read is counted as the store's.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::{Backend, Object, Store};
use crate::cache::CachedObject;
use crate::error::{Error, Result};
use crate::ranges;

/// See the module docs. Made by [`Store::direct_reader`]; objects are numbered by the caller.
pub(crate) struct DirectReader {
    store: Store,
    open: HashMap<usize, Opened>,
}

enum Opened {
    File(std::fs::File),
    Cached(CachedObject),
}

/// Spans read whole by [`DirectReader::gather`], and where each wanted one lies in them.
pub(crate) struct Gathered {
    bufs: Vec<bytes::Bytes>,
    /// For each wanted span: (buffer, offset in it); `None` for an empty span.
    at: Vec<Option<(usize, usize)>>,
}

impl Gathered {
    /// The bytes of wanted span `i` (empty for an empty span).
    pub(crate) fn get(&self, i: usize, len: usize) -> &[u8] {
        match self.at[i] {
            Some((b, at)) => &self.bufs[b][at..at + len],
            None => &[],
        }
    }

    /// [`get`](Self::get) as a slice of the read's buffer, no copy.
    pub(crate) fn bytes(&self, i: usize, len: usize) -> bytes::Bytes {
        match self.at[i] {
            Some((b, at)) => self.bufs[b].slice(at..at + len),
            None => bytes::Bytes::new(),
        }
    }
}

impl Store {
    /// A reader straight into caller buffers, for a blocking thread. Remote stores read only
    /// from the disk cache, so they have one only with a disk cache, and the caller checks
    /// that the spans it needs are there ([`Store::servable_directly`]) before using it.
    pub(crate) fn direct_reader(&self) -> Option<DirectReader> {
        match &self.0.backend {
            Backend::Local(_) => {}
            Backend::Remote { reader, .. } => {
                reader.cache()?.disk_limit()?;
            }
        }
        Some(DirectReader { store: self.clone(), open: HashMap::new() })
    }

    /// Whether [`DirectReader::read_whole`] serves this store's objects: a local store's
    /// files only (a remote object is read whole around the caches, so its blocks on disk,
    /// cached by some other reader, do not make it servable).
    pub(crate) fn reads_whole_directly(&self) -> bool {
        matches!(self.0.backend, Backend::Local(_))
    }
}

impl DirectReader {
    /// Open object `id`, `obj`, unless it is open: a local file, or its pinned version's
    /// blocks in a remote store's disk cache. Without them there, the error is an I/O error
    /// for which [`is_gone`] holds.
    pub(crate) fn open(&mut self, id: usize, obj: &Object) -> Result<()> {
        if self.open.contains_key(&id) {
            return Ok(());
        }
        let store = &self.store;
        let path = obj.path();
        let opened = match &store.0.backend {
            Backend::Local(l) => {
                // Held to the size it was listed at, as every local read is: a shard replaced
                // or cut since holds other bytes at the indexed offsets.
                let full = l.file(&store.obj_path(path))?;
                Opened::File(super::local::open_sized(&full, || store.describe(path), Some(obj.size()))?)
            }
            Backend::Remote { reader, .. } => {
                let cache = reader.cache().ok_or_else(|| gone(store, path))?;
                Opened::Cached(
                    cache
                        .cached_object(store.obj_path(path).as_ref(), &obj.version_key(), obj.size())
                        .ok_or_else(|| gone(store, path))?,
                )
            }
        };
        self.open.insert(id, opened);
        Ok(())
    }

    /// Fill `dst` with bytes of open object `id` from offset `at`. From the disk cache, a
    /// block gone meanwhile fails with [`crate::cache::Gone`] inside; a short object fails
    /// with `UnexpectedEof`. `dst` is then partly written.
    pub(crate) fn read_exact_at(&mut self, id: usize, dst: &mut [u8], at: u64) -> io::Result<()> {
        match self.open.get_mut(&id).expect("objects are opened before they are read") {
            Opened::File(f) => f.read_exact_at(dst, at)?,
            Opened::Cached(c) => c.read_exact_at(dst, at)?,
        }
        self.store.count(1, dst.len() as u64);
        Ok(())
    }

    /// Read `spans` (open object, byte range) merged into reads of at most `cap` bytes (and
    /// the source's `max_read`), one read per merged span: for many small pieces, fewer
    /// reads and one copy each out of a buffer that stays in the CPU cache. They merge across
    /// the source's gap on a local store, and across a local disk's gap on the disk cache
    /// (where a gap costs bytes read, not a round trip). A failed read names its object and
    /// offset.
    pub(crate) fn gather(
        &mut self,
        spans: &[(usize, Range<u64>)],
        cap: u64,
    ) -> std::result::Result<Gathered, (usize, u64, io::Error)> {
        let p = &self.store.0.policy;
        let gap = match &self.store.0.backend {
            Backend::Local(_) => p.gap,
            Backend::Remote { .. } => p.gap.min(ranges::LOCAL_GAP),
        };
        let policy = ranges::Policy::new(gap, cap.min(p.max_merged));
        let mut by_object: std::collections::BTreeMap<usize, Vec<usize>> = std::collections::BTreeMap::new();
        for (i, (id, _)) in spans.iter().enumerate() {
            by_object.entry(*id).or_default().push(i);
        }
        let mut g = Gathered { bufs: Vec::new(), at: vec![None; spans.len()] };
        for (id, members) in by_object {
            let wanted: Vec<Range<u64>> = members.iter().map(|&i| spans[i].1.clone()).collect();
            let merged = ranges::merge(&wanted, &policy);
            let first = g.bufs.len();
            for r in &merged.reads {
                let want = (r.end - r.start) as usize;
                let mut buf = crate::buffer::take(want);
                self.read_exact_at(id, &mut buf[..want], r.start).map_err(|e| (id, r.start, e))?;
                g.bufs.push(crate::buffer::freeze(buf, want));
            }
            for (j, &i) in members.iter().enumerate() {
                g.at[i] = merged.locate(j, &wanted[j]).map(|(k, at)| (first + k, at));
            }
        }
        Ok(g)
    }

    /// Read the whole of local object `obj` into `dst`; one whose size changed since it was
    /// listed is an error (its bytes would not be the sample that was listed).
    pub(crate) fn read_whole(&mut self, obj: &Object, dst: &mut [u8]) -> Result<()> {
        let (path, size) = (obj.path(), obj.size());
        let store = &self.store;
        let Backend::Local(l) = &store.0.backend else {
            return Err(Error::NotSupported {
                what: format!("{}: whole reads straight into a batch", store.describe(path)),
            });
        };
        // Named only on failure: the success path allocates nothing.
        let shown = || store.describe(path);
        let file = super::local::open_sized(&l.file(&store.obj_path(path))?, shown, Some(size))?;
        file.read_exact_at(dst, 0).map_err(|e| Error::io(shown(), e))?;
        store.count(1, size);
        Ok(())
    }
}

/// The error of a read from the disk cache whose block went missing.
pub(crate) fn gone(store: &Store, path: &str) -> Error {
    Error::Io { path: store.describe(path), source: io::Error::new(io::ErrorKind::NotFound, crate::cache::Gone) }
}

/// Whether `e` is a direct read finding a block gone from the disk cache.
pub(crate) fn is_gone(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if crate::cache::is_gone(source))
}
