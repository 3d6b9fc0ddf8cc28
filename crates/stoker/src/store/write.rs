//! Streaming writes of whole objects, published atomically: a local file is written under a
//! hidden temporary name, synced and renamed into place (a name in final form is always a
//! whole file, even after a crash); a remote object is sent in parts of a multipart upload as
//! it grows, or in one PUT when it is smaller than a part, and appears whole or not at all. A
//! writer dropped before [`ObjectWriter::finish`] leaves nothing: its temporary file is
//! removed, its upload aborted.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use bytes::Bytes;

use super::local::{publish, temp_name};
use super::upload::Parts;
use super::{Backend, Store};
use crate::error::{Error, Result};

/// A whole object being written; see the module docs. Nothing is visible under its name
/// until [`finish`](Self::finish).
pub struct ObjectWriter {
    store: Store,
    path: String,
    /// `None` once finished or discarded.
    sink: Option<Sink>,
    written: u64,
    /// Bytes of a local file whose write to the disk has been started (see [`WRITE_BEHIND`]).
    behind: u64,
    /// A local file's syncs started as it grows (see [`SYNC_BEHIND`]).
    syncs: BackgroundSyncs,
}

/// A local object's bytes are sent to the disk as they are written, this much at a time, not
/// all at the `fsync` that publishes it: the disk then works while the writer makes the rest.
const WRITE_BEHIND: u64 = 8 << 20;

/// And a sync of what has been written is started in the background each time this much more
/// has been handed to the kernel, so the sync that publishes the file waits for the last
/// stretch only. Sending the bytes is not enough where the disk has a cache of its own (a
/// VM's virtual disk in the host's page cache, a drive's write cache): the `fsync` then
/// waits for that cache's flush, which takes as long as the bytes written since the last one
/// take to reach the medium. On the project's VM a 256 MiB shard waited 0.19-0.28 s in its
/// final sync with every byte already sent, 0.01-0.06 s with a sync every 16-64 MiB; a Ray
/// write task, which publishes its shard before its core takes the next task, sat idle that
/// long each time.
const SYNC_BEHIND: u64 = 32 << 20;

enum Sink {
    /// The temporary file and the final one.
    File(BufWriter<std::fs::File>, PathBuf, PathBuf),
    /// A remote object, sent as it grows (or gathered for one PUT: see [`Parts`]).
    Parts(Parts),
}

impl std::fmt::Debug for ObjectWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWriter").field("path", &self.store.describe(&self.path)).finish_non_exhaustive()
    }
}

impl Store {
    /// Start writing `path` (about `size_hint` bytes; 0 if unknown). Writes block (a local
    /// file, or a remote part being sent): make them from a thread that may block, not an
    /// async task. A remote object is sent in parts on the runtime this is called on, which
    /// must run until [`ObjectWriter::finish`] (a writer made before a `fork` does not work in
    /// the child); called outside a runtime, it is gathered in memory (about `size_hint`
    /// reserved) for one PUT.
    pub fn writer(&self, path: &str, size_hint: u64) -> Result<ObjectWriter> {
        let sink = match &self.0.backend {
            Backend::Local(l) => {
                let to = l.file(&self.obj_path(path))?;
                let name = to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let tmp = to.with_file_name(temp_name(&name));
                let file = super::create_fresh(&tmp).map_err(|e| Error::io(tmp.display(), e))?;
                Sink::File(BufWriter::with_capacity(1 << 20, file), tmp, to)
            }
            Backend::Remote { reader, .. } => {
                let handle = tokio::runtime::Handle::try_current().ok();
                Sink::Parts(Parts::new(
                    handle,
                    reader.fetcher().clone(),
                    self.obj_path(path),
                    self.describe(path),
                    size_hint,
                ))
            }
        };
        Ok(ObjectWriter {
            store: self.clone(),
            path: path.to_string(),
            sink: Some(sink),
            written: 0,
            behind: 0,
            syncs: BackgroundSyncs::default(),
        })
    }

    /// Write `bytes` as `path`, whole or not at all, as an [`ObjectWriter`] does: a local file
    /// under a temporary name, synced and renamed; a remote object in one PUT of these bytes
    /// (not a second copy in memory).
    pub async fn put_whole(&self, path: &str, bytes: Bytes) -> Result<()> {
        if let Backend::Remote { .. } = &self.0.backend {
            return self.put(path, bytes).await;
        }
        let mut w = self.writer(path, bytes.len() as u64)?;
        let shown = self.describe(path);
        // A shard is hundreds of MiB: written off the runtime's threads.
        let w = tokio::task::spawn_blocking(move || w.write_all(&bytes).map(|()| w))
            .await
            .map_err(Error::task)?
            .map_err(|e| Error::io(shown, e))?;
        w.finish().await
    }

    /// What a failed write of `path` is: the store's own error when a remote request failed
    /// (its kind, retryable or not, and its text redacted, as for every store error), else the
    /// I/O error.
    pub(crate) fn write_error(&self, path: &str, e: io::Error) -> Error {
        // A part's request failed in the fetch layer, which named the object already.
        if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            match e.into_inner().map(|inner| inner.downcast::<Error>()) {
                Some(Ok(err)) => return *err,
                _ => return Error::internal(format!("{}: a write failed", self.describe(path))),
            }
        }
        if !e.get_ref().is_some_and(|inner| inner.is::<object_store::Error>()) {
            return Error::io(self.describe(path), e);
        }
        match e.into_inner().map(|inner| inner.downcast::<object_store::Error>()) {
            Some(Ok(store)) => self.err(path, *store),
            _ => Error::internal(format!("{}: a write failed", self.describe(path))),
        }
    }
}

impl ObjectWriter {
    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Make the object visible under its name, whole (local: synced and renamed, the
    /// directory synced; remote: the upload completed, or one PUT).
    pub async fn finish(mut self) -> Result<()> {
        let shown = self.store.describe(&self.path);
        let syncs = std::mem::take(&mut self.syncs);
        match self.sink.take() {
            Some(Sink::File(f, tmp, to)) => tokio::task::spawn_blocking(move || {
                let done = f
                    .into_inner()
                    .map_err(|e| Error::io(&shown, e.into_error()))
                    .and_then(|f| syncs.wait().and_then(|()| f.sync_all()).map_err(|e| Error::io(&shown, e)))
                    .and_then(|()| publish(&tmp, &to));
                if done.is_err() {
                    // Nothing is left behind, as when the writer is dropped.
                    let _ = std::fs::remove_file(&tmp);
                }
                done
            })
            .await
            .map_err(Error::task)?,
            Some(Sink::Parts(p)) => p.finish().await,
            None => Err(Error::internal(format!("{shown}: finished twice"))),
        }
    }

    /// Give the object up: nothing appears under its name, a local temporary file is removed
    /// and a remote upload aborted (dropping the writer does the same, the abort then running
    /// on after the drop).
    pub async fn discard(mut self) {
        // A local file is left to `drop`, which removes it.
        if let Some(Sink::Parts(p)) = self.sink.take_if(|s| matches!(s, Sink::Parts(_))) {
            p.abort().await;
        }
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if let Some(Sink::File(f, tmp, _)) = self.sink.take() {
            // Closed before removal; a failure leaves a hidden `.partial` file, which no
            // listing takes for data and the next write of the name replaces. A background
            // sync still running ends on its own (its descriptor holds the removed file).
            drop(f.into_parts());
            let _ = std::fs::remove_file(tmp);
        }
    }
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = match &mut self.sink {
            None => return Err(io::Error::other("the object was already finished")),
            // At most a piece a call: a write larger than BufWriter's buffer goes straight
            // to the file, and one large write costs this much more on some VMs (see
            // `WRITE_PIECE`).
            Some(Sink::File(f, ..)) => {
                let n = f.write(&buf[..buf.len().min(crate::cache::WRITE_PIECE)])?;
                // What the kernel holds: all written but what the buffer still has.
                let handed = self.written + n as u64 - f.buffer().len() as u64;
                if handed >= self.behind + WRITE_BEHIND {
                    start_writeback(f.get_ref(), self.behind, handed - self.behind);
                    self.behind = handed;
                    self.syncs.start_if_due(f.get_ref(), handed);
                }
                n
            }
            Some(Sink::Parts(p)) => p.write(buf)?,
        };
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Some(Sink::File(f, ..)) => f.flush(),
            Some(Sink::Parts(_)) | None => Ok(()),
        }
    }
}

/// The syncs of a local file started in the background while it is written ([`SYNC_BEHIND`]):
/// one at a time, each on a thread of its own holding a duplicate of the file's descriptor.
#[derive(Default)]
struct BackgroundSyncs {
    /// Bytes handed to the kernel when the last one started.
    started_at: u64,
    running: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// The first error one of them met. A duplicate descriptor shares the file's open file
    /// description, and Linux reports a writeback error once per description: an error seen
    /// here is not seen again by the sync that publishes the file, so it is kept for it.
    failed: Option<io::Error>,
}

impl BackgroundSyncs {
    /// Start a sync if `handed` bytes are [`SYNC_BEHIND`] past the last one's start and none
    /// is running. A hint, as [`start_writeback`]: where no thread or descriptor can be had,
    /// the publishing sync does it all.
    fn start_if_due(&mut self, file: &std::fs::File, handed: u64) {
        if handed < self.started_at + SYNC_BEHIND || self.running.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        self.collect();
        let Ok(file) = file.try_clone() else { return };
        if let Ok(h) = std::thread::Builder::new().name("stoker-sync".into()).spawn(move || file.sync_data()) {
            self.running = Some(h);
            self.started_at = handed;
        }
    }

    /// Join the running sync, keeping its error.
    fn collect(&mut self) {
        let Some(h) = self.running.take() else { return };
        let result = h.join().unwrap_or_else(|_| Err(io::Error::other("a background sync panicked")));
        if let (Err(e), None) = (result, &self.failed) {
            self.failed = Some(e);
        }
    }

    /// Wait for the running sync; the first error any of them met.
    fn wait(mut self) -> io::Result<()> {
        self.collect();
        self.failed.map_or(Ok(()), Err)
    }
}

/// Start writing bytes `offset..offset + len` of `file` to its disk, without waiting for them.
/// Only a hint: a failure here (a file system without it) is left to the `fsync` that
/// publishes the file, which writes and checks every byte anyway.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
        // SAFETY: a plain system call on a descriptor `file` holds open; no memory is passed.
        unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_write_hands_the_file_a_piece_at_a_time_and_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(dir.path()).unwrap();
        let piece = crate::cache::WRITE_PIECE;
        let data: Vec<u8> = (0..3 * piece + 17).map(|i| (i % 251) as u8).collect();
        let mut w = store.writer("a.bin", data.len() as u64).unwrap();
        // One call takes at most a piece of a larger buffer; `write_all` loops over the rest.
        assert_eq!(w.write(&data).unwrap(), piece);
        w.write_all(&data[piece..]).unwrap();
        assert_eq!(w.written(), data.len() as u64);
        assert!(!dir.path().join("a.bin").exists(), "nothing under the name before finish");
        w.finish().await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("a.bin")).unwrap(), data);

        store.put_whole("b.bin", Bytes::from(data.clone())).await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("b.bin")).unwrap(), data);
    }

    #[tokio::test]
    async fn a_local_file_is_synced_as_it_grows_and_a_dropped_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(dir.path()).unwrap();
        let data: Vec<u8> = (0..3 * SYNC_BEHIND + 4321).map(|i| (i % 253) as u8).collect();
        let mut w = store.writer("big.bin", data.len() as u64).unwrap();
        w.write_all(&data).unwrap();
        // A sync started once the first SYNC_BEHIND bytes were handed to the kernel, and
        // later ones as those before them ended.
        assert!(w.syncs.started_at >= SYNC_BEHIND, "started at {}", w.syncs.started_at);
        w.finish().await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("big.bin")).unwrap(), data);

        // Dropped with a sync perhaps still running: no file under either name.
        let mut w = store.writer("gone.bin", data.len() as u64).unwrap();
        w.write_all(&data).unwrap();
        drop(w);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("big.bin")]);
    }

    #[test]
    fn a_background_syncs_error_is_kept_for_the_publishing_sync() {
        // The first error is kept, past syncs that succeed after it; `wait` reports it.
        let mut syncs = BackgroundSyncs {
            running: Some(std::thread::spawn(|| Err(io::Error::other("EIO in writeback")))),
            ..Default::default()
        };
        syncs.collect();
        syncs.running = Some(std::thread::spawn(|| Ok(())));
        let err = syncs.wait().unwrap_err();
        assert_eq!(err.to_string(), "EIO in writeback");
        assert!(BackgroundSyncs::default().wait().is_ok());
    }
}
