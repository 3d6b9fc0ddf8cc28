//! A blocking, block-buffered `Read + Seek` view of an object, for walks over tar headers
//! (indexing) that seek past payloads.
//!
//! A walk parses what it reads and would take any read failure for damage, so the reader
//! keeps the store's own error ([`BlockReader::failure`]): the walk's caller reports that
//! (a remote failure after its retries, with its whole cause), never "not a tar file". And a
//! walk whose caller gave up ([`Cancel`]) stops at its next read instead of going on with
//! retries and their sleeps on a runtime that may be shutting down.

use std::io::{self, Read, Seek, SeekFrom};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::{Backend, Object, Store};
use crate::error::{Error, Result};

/// Tells blocking work that whoever waits for it is gone: set when the [`CancelOnDrop`]
/// guard of the waiting future drops.
#[derive(Clone, Default)]
pub(crate) struct Cancel(Arc<CancelInner>);

#[derive(Default)]
struct CancelInner {
    set: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Cancel {
    /// A guard that cancels when dropped: keep it in the future that awaits the work.
    pub(crate) fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }

    /// Tell the work to stop at its next read.
    pub(crate) fn cancel(&self) {
        self.0.set.store(true, Ordering::Release);
        self.0.notify.notify_waiters();
    }

    /// Whether the work was told to stop.
    pub(crate) fn is_set(&self) -> bool {
        self.0.set.load(Ordering::Acquire)
    }

    async fn cancelled(&self) {
        loop {
            // Registered before the check, so a cancel between the two still wakes it.
            let woken = self.0.notify.notified();
            if self.is_set() {
                return;
            }
            woken.await;
        }
    }
}

/// See [`Cancel::on_drop`].
pub(crate) struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Local header walks read this much at a time: one page, so payloads between headers are
/// skipped.
const LOCAL_BLOCK: usize = 4096;
/// Remote walks read bigger blocks: a request costs a round trip, bytes are cheap. So do
/// walks that read every byte (payload digests).
const BIG_BLOCK: usize = 1 << 20;

impl Store {
    /// A blocking `Read + Seek` view of `obj` for header walks (tar indexing), stopping at
    /// its next read once `cancel` is set; `whole` when the walk reads every byte.
    ///
    /// Reads go a block at a time and a seek within the current block is free, so walking
    /// headers does not read the payloads between them. Call it from a blocking thread,
    /// never from an async task.
    pub(crate) fn blocking_reader(&self, obj: &Object, whole: bool, cancel: Cancel) -> Result<BlockReader> {
        let block = if self.is_remote() || whole { BIG_BLOCK } else { LOCAL_BLOCK };
        let fetch = match &self.0.backend {
            Backend::Local(l) => {
                let full = l.file(&self.obj_path(obj.path()))?;
                Fetch::Local(std::fs::File::open(&full).map_err(|e| Error::io(full.display(), e))?)
            }
            Backend::Remote { .. } => Fetch::Remote(self.clone(), obj.clone(), tokio::runtime::Handle::current()),
        };
        Ok(BlockReader {
            fetch,
            size: obj.size(),
            pos: 0,
            buf: Bytes::new(),
            buf_start: 0,
            block,
            cancel,
            failure: None,
        })
    }
}

enum Fetch {
    Local(std::fs::File),
    Remote(Store, Object, tokio::runtime::Handle),
}

/// Blocking, block-buffered `Read + Seek` over one object. See `Store::blocking_reader`.
pub struct BlockReader {
    fetch: Fetch,
    size: u64,
    pos: u64,
    buf: Bytes,
    buf_start: u64,
    block: usize,
    cancel: Cancel,
    /// The store's error behind the first read that failed.
    failure: Option<Error>,
}

impl BlockReader {
    /// The store's error behind the first read that failed, if one did: what a walk that
    /// stopped early should report instead of what it made of the failed read.
    pub(crate) fn failure(&mut self) -> Option<Error> {
        self.failure.take()
    }

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
                let mut v = vec![0u8; (end - self.pos) as usize];
                let done = super::local::read_at_most(file, &mut v, self.pos)?;
                v.truncate(done);
                Bytes::from(v)
            }
            Fetch::Remote(store, obj, handle) => {
                if self.cancel.is_set() {
                    return Err(io::Error::other("the walk was given up"));
                }
                let cancel = self.cancel.clone();
                let read = handle.block_on(async {
                    tokio::select! {
                        biased;
                        () = cancel.cancelled() => None,
                        r = store.read_once(obj, range) => Some(r),
                    }
                });
                match read {
                    None => return Err(io::Error::other("the walk was given up")),
                    Some(Ok(b)) => b,
                    Some(Err(e)) => {
                        let shown = io::Error::other(e.to_string());
                        self.failure.get_or_insert(e);
                        return Err(shown);
                    }
                }
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

/// Byte ranges of one object for a blocking thread whose parser asks for many small pieces at
/// places it learns as it goes (HDF5's index nodes, heaps and chunks): a local file is read in
/// place by the calling thread, with no hop to the runtime for each piece; a remote object
/// through the store's own path (read plan, caches, version rule) on the runtime the reader
/// was made on. Made by [`Store::range_reader`].
#[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
pub(crate) struct RangeReader {
    store: Store,
    obj: Object,
    rt: tokio::runtime::Handle,
    local: Option<std::fs::File>,
}

impl Store {
    /// A [`RangeReader`] of `obj`; call it from async code (it keeps that runtime), read from
    /// a blocking thread.
    pub(crate) fn range_reader(&self, obj: &Object) -> Result<RangeReader> {
        let local = match &self.0.backend {
            Backend::Local(l) => {
                let full = l.file(&self.obj_path(obj.path()))?;
                Some(super::local::open_sized(&full, || self.describe(obj.path()), Some(obj.size()))?)
            }
            Backend::Remote { .. } => None,
        };
        Ok(RangeReader { store: self.clone(), obj: obj.clone(), rt: tokio::runtime::Handle::current(), local })
    }

    /// Give `each` every byte of the object `info` names, in order, a MiB at a time (to hash
    /// a file gigabytes long in bounded memory); false if it could not all be read, or changed
    /// meanwhile. Blocking: call it from a blocking thread.
    pub(crate) fn read_pieces(&self, info: &super::ObjectInfo, mut each: impl FnMut(&[u8])) -> bool {
        let Ok(mut reader) = self.blocking_reader(&self.object(info), true, Cancel::default()) else { return false };
        let mut buf = vec![0u8; BIG_BLOCK];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => each(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        reader.failure().is_none()
    }
}

#[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
impl RangeReader {
    /// The object read.
    pub(crate) fn object(&self) -> &Object {
        &self.obj
    }

    /// The bytes of `span`, all of them: a span past the object's end, or a short read, is
    /// an error naming the object.
    pub(crate) fn read(&self, span: std::ops::Range<u64>) -> Result<Bytes> {
        let len = usize::try_from(span.end.saturating_sub(span.start)).unwrap_or(usize::MAX);
        if span.end > self.obj.size() || span.start > span.end {
            let shown = self.store.describe(self.obj.path());
            let why = format!("bytes {}..{} asked of {} bytes", span.start, span.end, self.obj.size());
            return Err(Error::io(shown, io::Error::new(io::ErrorKind::UnexpectedEof, why)));
        }
        match &self.local {
            Some(file) => {
                use std::os::unix::fs::FileExt;
                // Held open for the object's life (an HDF5 file's): one rewritten in place
                // since at another size is refused at its next read, not read at old offsets.
                super::local::held_to(file, || self.store.describe(self.obj.path()), self.obj.size())?;
                let mut v = vec![0u8; len];
                file.read_exact_at(&mut v, span.start)
                    .map_err(|e| Error::io(self.store.describe(self.obj.path()), e))?;
                self.store.count(1, len as u64);
                Ok(Bytes::from(v))
            }
            None => self.rt.block_on(self.store.read_span(&self.obj, span)),
        }
    }

    /// The bytes of each of `spans`, through [`Store::read`] (merged by the read plan).
    pub(crate) fn read_many(&self, spans: &[std::ops::Range<u64>]) -> Result<Vec<Bytes>> {
        self.rt.block_on(self.store.read(&self.obj, spans))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn block_reader_seeks_within_and_past_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let s = Store::local(dir.path()).unwrap();
        let f = s.open_object("f").await.unwrap();
        let mut r = s.blocking_reader(&f, false, Cancel::default()).unwrap();
        let mut b = [0u8; 10];
        r.seek(SeekFrom::Start(1020)).unwrap();
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b[..], &data[1020..1030]);
        r.seek(SeekFrom::Current(3000)).unwrap();
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b[..], &data[4030..4040]);
        r.seek(SeekFrom::Start(4090)).unwrap();
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b[..], &data[4090..4100], "across a block boundary");
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, &data[4100..]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_range_reader_refuses_a_file_rewritten_at_another_size_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.h5");
        std::fs::write(&path, b"0123456789").unwrap();
        let s = Store::local(dir.path()).unwrap();
        let r = s.range_reader(&s.open_object("f.h5").await.unwrap()).unwrap();
        // A local file is read by the calling thread (no runtime hop), so here directly.
        assert_eq!(&r.read(2..5).unwrap()[..], b"234");
        // Rewritten in place (same inode, the handle the reader holds): other bytes at the
        // old offsets, which must not be served as the file's.
        std::fs::write(&path, b"ab0123456789").unwrap();
        let e = r.read(2..5).unwrap_err();
        assert!(matches!(e, Error::Changed { .. }) && e.to_string().contains("f.h5"), "{e}");
    }
}
