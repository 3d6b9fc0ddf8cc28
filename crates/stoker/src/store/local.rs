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
const TEMP_SUFFIX: &str = ".partial";

/// The hidden name a file is written under before it is complete.
pub(crate) fn temp_name(name: &str) -> String {
    format!(".{name}{TEMP_SUFFIX}")
}

/// Whether `name` is one [`temp_name`] gives: a file not yet complete.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(TEMP_SUFFIX)
}

/// The name a temporary file is written for, if `name` is one ([`temp_name`]).
pub(crate) fn temp_target(name: &str) -> Option<&str> {
    name.strip_prefix('.')?.strip_suffix(TEMP_SUFFIX)
}

/// A new file at `path`, whatever was there: an earlier run's temporary file is removed first,
/// and so is a link planted in its place. Opening it instead (`File::create`) would follow
/// such a link and truncate its target, anywhere the user may write, and the rename that
/// publishes the file would then publish the link. `O_EXCL` makes the open fail rather than
/// follow one planted between the removal and the open.
pub(crate) fn create_fresh(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::File::options().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Write `bytes` to `to` whole: under its hidden temporary name ([`temp_name`]), made fresh
/// ([`create_fresh`]), then renamed over it; its directory made if missing. Not synced.
pub(super) fn put_aside(to: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let name = to.file_name().ok_or_else(|| io::Error::other("no file name"))?.to_string_lossy().into_owned();
    let tmp = to.with_file_name(temp_name(&name));
    create_fresh(&tmp)?.write_all(bytes)?;
    std::fs::rename(&tmp, to)
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
            .map_err(|e| Error::Store { path: dir.display().to_string(), source: e.into() })?;
        Ok(Local { fs, dir: canonical })
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn fs(&self) -> &LocalFileSystem {
        &self.fs
    }

    /// Every file under the root, in no order, as object_store's listing gives them (see
    /// [`super::walk`]), looked up or by name only (`F`): the root read first, then its
    /// directories walked `walks` at once (each a depth-first walk on a blocking thread),
    /// spreading the per-file lookups over the cores.
    pub(super) async fn list_all<F: super::walk::Found>(&self, walks: usize) -> Result<Vec<F>> {
        use futures::{StreamExt, TryStreamExt};
        let dir = self.dir.clone();
        let (mut out, dirs) = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let dirs = super::walk::read_dir(&super::walk::Dir::root(&dir)?, &mut out)?;
            Ok::<_, Error>((out, dirs))
        })
        .await
        .map_err(Error::task)??;
        let walked = dirs.into_iter().map(|dir| async move {
            tokio::task::spawn_blocking(move || {
                let mut found = Vec::new();
                super::walk::tree(dir, &mut found).map(|()| found)
            })
            .await
            .map_err(Error::task)?
        });
        let parts: Vec<Vec<F>> = futures::stream::iter(walked).buffer_unordered(walks.max(1)).try_collect().await?;
        out.extend(parts.into_iter().flatten());
        Ok(out)
    }

    /// Look up `names` (paths under the root, as a names-only listing gave them), in order,
    /// `walks` runs of them at once on blocking threads (see [`super::walk::stat_names`]):
    /// None for a file gone since it was listed.
    pub(super) async fn stat_names(
        &self,
        names: std::sync::Arc<Vec<String>>,
        walks: usize,
    ) -> Result<Vec<Option<super::ObjectInfo>>> {
        use futures::{StreamExt, TryStreamExt};
        let run = names.len().div_ceil(walks.max(1)).max(1);
        let runs = (0..names.len()).step_by(run).map(|start| {
            let (names, root) = (names.clone(), self.dir.clone());
            async move {
                tokio::task::spawn_blocking(move || {
                    super::walk::stat_names(&root, &names[start..(start + run).min(names.len())])
                })
                .await
                .map_err(Error::task)?
            }
        });
        let parts: Vec<Vec<_>> = futures::stream::iter(runs).buffered(walks.max(1)).try_collect().await?;
        Ok(parts.into_iter().flatten().collect())
    }

    /// The file behind `path` (relative to the root).
    pub(super) fn file(&self, path: &ObjPath) -> Result<PathBuf> {
        self.fs.path_to_filesystem(path).map_err(|e| Error::Store { path: path.to_string(), source: e.into() })
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
            let file = open_sized(&full, || shown.clone(), size)?;
            // A whole read of a file held to its size reads that size (open_sized has checked it).
            let ranges = match (ranges, size) {
                (Some(r), _) => r,
                (None, Some(len)) => std::iter::once(0..len).collect(),
                (None, None) => std::iter::once(0..file.metadata().map_err(|e| Error::io(&shown, e))?.len()).collect(),
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

    /// A FIFO or a device at `path` (`shown` in errors) is refused before anything opens it:
    /// object_store's `head` opens the file, and opening a FIFO waits for a writer without
    /// end. Only a `stat`; a missing file and a directory are left to `head` (not found).
    pub(super) fn not_special(&self, path: &ObjPath, shown: impl Fn() -> String) -> Result<()> {
        match std::fs::metadata(self.file(path)?) {
            Ok(m) if !m.is_file() && !m.is_dir() => Err(not_regular(&shown())),
            _ => Ok(()),
        }
    }

    /// The whole file at `path` if it is at most `most` bytes long (see
    /// [`Store::get_at_most`](super::Store::get_at_most)): its size is checked before it is
    /// read, and the read stops at the size found (a file growing meanwhile gives its start).
    /// Only a regular file is read: a FIFO or a device in a dataset's place would block the
    /// open, or never end.
    pub(super) async fn read_whole_at_most(&self, path: ObjPath, shown: String, most: u64) -> Result<Bytes> {
        use std::os::unix::fs::OpenOptionsExt;
        let full = self.file(&path)?;
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::options()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&full)
                .map_err(|e| Error::io(&shown, e))?;
            let meta = file.metadata().map_err(|e| Error::io(&shown, e))?;
            if !meta.file_type().is_file() {
                return Err(not_regular(&shown));
            }
            let len = meta.len();
            if len > most {
                return Err(Error::too_large(&shown, len, most));
            }
            let want = usize::try_from(len).unwrap_or(usize::MAX);
            let mut buf = crate::buffer::try_take(want).map_err(|e| Error::io(&shown, e))?;
            let done = read_at_most(&file, &mut buf[..want], 0).map_err(|e| Error::io(&shown, e))?;
            Ok(crate::buffer::freeze(buf, done))
        })
        .await
        .map_err(Error::task)?
    }
}

/// What a read of something other than a regular file at `shown` is.
fn not_regular(shown: &str) -> Error {
    let why = "not a regular file (a FIFO, a device or a directory): name the dataset's own file";
    Error::io(shown, io::Error::new(io::ErrorKind::InvalidData, why))
}

/// Open the file at `full` (named by `shown()` in errors, which is called only on failure, so
/// a batch's opens allocate nothing). With `size`, a file of another size is
/// [`Error::Changed`]: it was replaced since it was looked up, and its bytes at the old
/// offsets are not the samples indexed.
pub(super) fn open_sized(
    full: &std::path::Path,
    shown: impl Fn() -> String,
    size: Option<u64>,
) -> Result<std::fs::File> {
    let file = std::fs::File::open(full).map_err(|e| Error::io(shown(), e))?;
    if let Some(want) = size {
        held_to(&file, &shown, want)?;
    }
    Ok(file)
}

/// [`Error::Changed`] unless open `file` is still `want` bytes long (see [`open_sized`]).
pub(super) fn held_to(file: &std::fs::File, shown: impl Fn() -> String, want: u64) -> Result<()> {
    sized(file.metadata().map_err(|e| Error::io(shown(), e))?.len(), shown, want)
}

/// [`held_to`] for a file held open only to be checked (a memory map's): its size by a seek to
/// its end (0.15 µs on the project's VM, against 0.47 for an `fstat`), the descriptor's offset
/// being of use to nothing else.
pub(super) fn end_held_to(file: &std::fs::File, shown: impl Fn() -> String, want: u64) -> Result<()> {
    use std::io::Seek;
    let mut held = file;
    sized(held.seek(io::SeekFrom::End(0)).map_err(|e| Error::io(shown(), e))?, shown, want)
}

/// [`Error::Changed`] unless the file at `path` is still `want` bytes long: the check of
/// [`held_to`] for a reader that holds no descriptor (a memory map).
pub(super) fn path_held_to(path: &std::path::Path, shown: impl Fn() -> String, want: u64) -> Result<()> {
    sized(std::fs::metadata(path).map_err(|e| Error::io(shown(), e))?.len(), shown, want)
}

fn sized(now: u64, shown: impl Fn() -> String, want: u64) -> Result<()> {
    if now != want {
        return Err(Error::Changed {
            object: shown(),
            reason: format!("it is {now} bytes now, {want} when it was first read"),
        });
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::ObjectStore;

    /// A put lands whole under its name, its directory made: written aside under a hidden
    /// temporary name (a link planted there replaced, not followed), never object_store's
    /// `NAME#N`, which a killed writer left in plain sight.
    #[tokio::test]
    async fn a_put_is_written_aside_and_renamed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let s = crate::store::Store::local(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("sub").join(temp_name("x.json"))).unwrap();
        s.put("sub/x.json", bytes::Bytes::from_static(b"{}")).await.unwrap();
        s.put("new/dir/y.json", bytes::Bytes::from_static(b"[]")).await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("sub/x.json")).unwrap(), b"{}");
        assert_eq!(std::fs::read(dir.path().join("new/dir/y.json")).unwrap(), b"[]");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep", "the link's target was written");
        let names: Vec<_> =
            std::fs::read_dir(dir.path().join("sub")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["x.json"], "nothing left beside it");
    }

    /// A tree with what object_store's own listing has rules for: nested and hidden
    /// directories, odd names, symlinks to a directory and to a file, a broken symlink, a name
    /// object_store reserves (`#` and digits), an empty directory.
    fn tree(root: &Path) {
        for (path, bytes) in [
            ("top.bin", &b"1"[..]),
            ("a/one.jpg", b"22"),
            ("a/deep/two.jpg", b"333"),
            ("b/three.cls", b"4444"),
            (".hidden/four.bin", b"5"),
            ("name with space/%25 odd.bin", b"66"),
            ("c/upload#123", b"7"),
            ("c/tag#v2", b"88"),
            ("c/\u{e9}t\u{e9}.txt", b"999"),
        ] {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), bytes).unwrap();
        }
        std::fs::create_dir_all(root.join("empty")).unwrap();
        // Times before 1970 and between microseconds have their own rules in the tags.
        let file = |p: &str| std::fs::File::options().write(true).open(root.join(p)).unwrap();
        let epoch = std::time::UNIX_EPOCH;
        file("b/three.cls").set_modified(epoch - std::time::Duration::from_nanos(1_500_000_500)).unwrap();
        file("a/one.jpg").set_modified(epoch + std::time::Duration::from_nanos(1_700_000_000_123_456_789)).unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("linked")).unwrap();
        std::os::unix::fs::symlink(root.join("b/three.cls"), root.join("c/file-link.cls")).unwrap();
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("c/broken")).unwrap();
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("top-broken")).unwrap();
        // A directory whose name is not UTF-8 fails a listing only when it holds a file.
        use std::os::unix::ffi::OsStrExt;
        std::fs::create_dir_all(root.join("c").join(std::ffi::OsStr::from_bytes(b"caf\xe9"))).unwrap();
    }

    #[tokio::test]
    async fn the_walk_lists_object_stores_own_entries() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root);
        let local = Local::new(root).unwrap();
        let key = |m: &super::super::ObjectInfo| (m.path.clone(), m.size, m.e_tag.clone(), m.modified_us);
        let mut want: Vec<_> = local
            .fs
            .list(None)
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .into_iter()
            .map(|m| key(&super::super::info(m, 0)))
            .collect();
        want.sort();
        for walks in [1, 2, 8] {
            let mut got: Vec<_> =
                local.list_all::<super::super::ObjectInfo>(walks).await.unwrap().iter().map(key).collect();
            got.sort();
            assert_eq!(got, want, "{walks} walks");
        }
        let names: Vec<&str> = want.iter().map(|k| k.0.as_str()).collect();
        assert!(names.contains(&"linked/deep/two.jpg") && names.contains(&"c/file-link.cls"), "{names:?}");
        assert!(names.contains(&"c/tag#v2") && !names.contains(&"c/upload#123"), "{names:?}");
        assert_eq!(want.len(), 11, "{names:?}");
    }

    /// A directory that may be read but not searched: the names walk lists what the full walk
    /// and object_store list (its files skipped, as their lookups fail; as root, which may
    /// search any directory, all three list them).
    #[tokio::test]
    async fn a_directory_that_cannot_be_searched_is_listed_alike_by_names() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("open.jpg"), b"o").unwrap();
        std::fs::create_dir(root.join("locked")).unwrap();
        std::fs::write(root.join("locked/in.jpg"), b"i").unwrap();
        std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o444)).unwrap();
        let local = Local::new(root).unwrap();
        let listed = local.fs.list(None).try_collect::<Vec<_>>().await;
        let full = local.list_all::<super::super::ObjectInfo>(2).await;
        let names = local.list_all::<String>(2).await;
        std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut want: Vec<String> = listed.unwrap().into_iter().map(|m| m.location.to_string()).collect();
        want.sort();
        let mut full: Vec<String> = full.unwrap().into_iter().map(|m| m.path).collect();
        full.sort();
        let mut names = names.unwrap();
        names.sort();
        assert!(want.contains(&"open.jpg".to_string()), "{want:?}");
        assert_eq!(full, want);
        assert_eq!(names, want);
    }

    /// A walk of names only finds the same paths, and looking them up afterwards gives the
    /// entries a full walk gives (symlinked files and directories followed), in the order
    /// asked; a name gone since is None, one that is now a directory an error naming it.
    #[tokio::test]
    async fn names_looked_up_later_give_the_walks_own_entries() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        tree(root);
        let local = Local::new(root).unwrap();
        let key = |m: &super::super::ObjectInfo| (m.path.clone(), m.size, m.e_tag.clone(), m.modified_us);
        let mut want: Vec<_> = local.list_all::<super::super::ObjectInfo>(2).await.unwrap().iter().map(key).collect();
        want.sort();
        for walks in [1, 2, 8] {
            let mut names: Vec<String> = local.list_all(walks).await.unwrap();
            names.sort();
            assert_eq!(names, want.iter().map(|k| k.0.clone()).collect::<Vec<_>>(), "{walks} walks");
            // Any order, any number of runs: each answer is its own name's.
            names.reverse();
            let got = local.stat_names(std::sync::Arc::new(names.clone()), walks).await.unwrap();
            let mut got: Vec<_> = got.iter().map(|m| key(m.as_ref().unwrap())).collect();
            assert_eq!(got.iter().map(|k| k.0.clone()).collect::<Vec<_>>(), names);
            got.sort();
            assert_eq!(got, want, "{walks} walks");
        }
        let asked = |names: &[&str]| std::sync::Arc::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>());
        let got = local.stat_names(asked(&["a/one.jpg", "a/gone.jpg", "nowhere/x.jpg", "b/three.cls"]), 2).await;
        let got: Vec<bool> = got.unwrap().iter().map(Option::is_some).collect();
        assert_eq!(got, [true, false, false, true]);
        let err = local.stat_names(asked(&["a/one.jpg", "a"]), 1).await.unwrap_err().to_string();
        assert!(err.contains("no longer a regular file"), "{err}");
    }

    #[tokio::test]
    async fn a_file_whose_path_is_not_utf8_fails_the_walk_as_object_stores() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let odd = root.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("x.bin"), b"1").unwrap();
        let local = Local::new(root).unwrap();
        assert!(local.fs.list(None).try_collect::<Vec<_>>().await.is_err(), "object_store refuses it too");
        let err = local.list_all::<super::super::ObjectInfo>(2).await.unwrap_err().to_string();
        assert!(err.contains("x.bin") && err.contains("not UTF-8"), "{err}");
    }

    #[tokio::test]
    async fn a_symlink_loop_fails_the_walk_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/x.bin"), b"1").unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("a/b/up")).unwrap();
        let local = Local::new(root).unwrap();
        assert!(local.fs.list(None).try_collect::<Vec<_>>().await.is_err(), "object_store refuses it too");
        let err = local.list_all::<super::super::ObjectInfo>(2).await.unwrap_err().to_string();
        assert!(err.contains("a/b/up") && err.contains("loop"), "{err}");
    }
}
