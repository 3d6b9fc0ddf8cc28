//! The local backend: a directory read with positioned reads on blocking threads (object_store's
//! `LocalFileSystem` only lists, heads and puts: its reads allocate per call, ours reuse
//! buffers).

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;

use crate::error::{Error, Result};

/// The suffix of a file being written; with the leading dot (see [`temp_name`]) it is never
/// listed as data nor matched by `*.tar`.
pub(crate) const TEMP_SUFFIX: &str = ".partial";

/// The hidden name a file is written under before it is complete.
pub(crate) fn temp_name(name: &str) -> String {
    format!(".{name}{TEMP_SUFFIX}")
}

/// Rename a synced temporary file to its final name and sync the directory entry: readers
/// see the old file or the whole new one, even after a crash.
pub(crate) fn publish(tmp: &Path, to: &Path) -> Result<()> {
    std::fs::rename(tmp, to).map_err(|e| Error::io(to.display(), e))?;
    if let Some(dir) = to.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir.display(), e))?;
    }
    Ok(())
}

pub(super) struct Local {
    fs: LocalFileSystem,
    dir: PathBuf,
}

impl Local {
    pub(super) fn new(dir: &Path) -> Result<Self> {
        let canonical = std::fs::canonicalize(dir).map_err(|e| Error::io(dir.display(), e))?;
        let fs = LocalFileSystem::new_with_prefix(&canonical)
            .map_err(|e| Error::Store { path: dir.display().to_string(), source: e })?;
        Ok(Local { fs, dir: canonical })
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn fs(&self) -> &LocalFileSystem {
        &self.fs
    }

    /// The file behind `path` (relative to the root).
    pub(super) fn file(&self, path: &ObjPath) -> Result<PathBuf> {
        self.fs.path_to_filesystem(path).map_err(|e| Error::Store { path: path.to_string(), source: e })
    }

    /// Names directly in the directory, hidden ones included.
    pub(super) fn entries(&self) -> Result<Vec<String>> {
        let rd = std::fs::read_dir(&self.dir).map_err(|e| Error::io(self.dir.display(), e))?;
        rd.map(|e| Ok(e.map_err(|e| Error::io(self.dir.display(), e))?.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    /// One blocking task opens the file once and reads each range (or the whole file) into
    /// recycled buffers. A range past the end comes back short and the caller's length check
    /// reports it. With `size`, a file of another size is [`Error::Changed`]: it was replaced
    /// since it was looked up, and its bytes at the old offsets are not the samples indexed.
    pub(super) async fn read(
        &self,
        path: ObjPath,
        shown: String,
        ranges: Option<Vec<Range<u64>>>,
        size: Option<u64>,
    ) -> Result<Vec<Bytes>> {
        let full = self.file(&path)?;
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&full).map_err(|e| Error::io(&shown, e))?;
            if let Some(want) = size {
                let now = file.metadata().map_err(|e| Error::io(&shown, e))?.len();
                if now != want {
                    return Err(Error::Changed {
                        object: shown,
                        reason: format!("it is {now} bytes now, {want} when it was first read"),
                    });
                }
            }
            let ranges = match ranges {
                Some(r) => r,
                None => std::iter::once(0..file.metadata().map_err(|e| Error::io(&shown, e))?.len()).collect(),
            };
            ranges
                .into_iter()
                .map(|r| {
                    let want = usize::try_from(r.end.saturating_sub(r.start)).unwrap_or(usize::MAX);
                    let mut buf = crate::buffer::try_take(want).map_err(|e| Error::io(&shown, e))?;
                    let done = read_at_most(&file, &mut buf[..want], r.start).map_err(|e| Error::io(&shown, e))?;
                    Ok(crate::buffer::freeze(buf, done))
                })
                .collect()
        })
        .await
        .map_err(Error::task)?
    }
}

/// Fill `dst` from `at` until the end of the file; returns the bytes read.
pub(super) fn read_at_most(file: &std::fs::File, dst: &mut [u8], at: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
