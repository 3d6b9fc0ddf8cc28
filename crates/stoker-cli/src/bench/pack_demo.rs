//! Converting the demo's one-file-per-sample directory into tar shards and an LMDB.
//!
//! This is the only place `bench` writes packed layouts, kept apart so it can be replaced by
//! the library's general converter (`stoker::pack`) without touching the rest of the bench:
//! [`pack`] takes a source directory, a destination and a layout, as that converter does.

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

use stoker::Layout;

/// Write every file of `src` (sorted by name, the order the `objects` layout reads them in)
/// into `dest` as `layout`: tar shards of about `shard_bytes` each (`shard-000000.tar`, ...),
/// with members named as the files (so a file `000123.bin` is sample `000123`, field `bin`,
/// in every layout), or one LMDB environment keyed by the file name without its extension.
/// `progress` is called with the bytes written after each sample.
pub(crate) fn pack(
    src: &Path,
    dest: &Path,
    layout: Layout,
    shard_bytes: u64,
    progress: &dyn Fn(u64),
) -> Result<(), String> {
    let files = sorted_files(src)?;
    std::fs::create_dir_all(dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    match layout {
        Layout::Tar => write_tar(&files, dest, shard_bytes, progress),
        Layout::Lmdb => write_lmdb(&files, dest, progress),
        other => Err(format!("the demo packs into tar or lmdb, not {other}")),
    }
}

fn sorted_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && e.path().is_file() {
            out.push((name, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn read(path: &Path, buf: &mut Vec<u8>) -> Result<(), String> {
    buf.clear();
    File::open(path)
        .and_then(|mut f| f.read_to_end(buf))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(())
}

fn write_tar(files: &[(String, PathBuf)], dest: &Path, shard_bytes: u64, progress: &dyn Fn(u64)) -> Result<(), String> {
    let mut buf = Vec::new();
    let mut shard: Option<(tar::Builder<BufWriter<File>>, PathBuf, u64)> = None;
    let mut next_shard = 0usize;
    let finish = |(b, path, _): (tar::Builder<BufWriter<File>>, PathBuf, u64)| -> Result<(), String> {
        let tmp = path.with_extension("tar.partial");
        b.into_inner()
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    for (name, path) in files {
        read(path, &mut buf)?;
        if shard.as_ref().is_some_and(|(_, _, written)| *written >= shard_bytes) {
            finish(shard.take().expect("checked above"))?;
        }
        if shard.is_none() {
            // Written under a temporary name, so an interrupted run never leaves a short
            // shard that looks complete.
            let path = dest.join(format!("shard-{next_shard:06}.tar"));
            let tmp = path.with_extension("tar.partial");
            let f = File::create(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
            shard = Some((tar::Builder::new(BufWriter::with_capacity(1 << 20, f)), path, 0));
            next_shard += 1;
        }
        let (b, shard_path, written) = shard.as_mut().expect("opened above");
        let mut h = tar::Header::new_gnu();
        h.set_size(buf.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, &buf[..]).map_err(|e| format!("cannot write {}: {e}", shard_path.display()))?;
        *written += buf.len() as u64 + 512;
        progress(buf.len() as u64);
    }
    match shard {
        Some(s) => finish(s),
        None => Ok(()),
    }
}

fn write_lmdb(files: &[(String, PathBuf)], dest: &Path, progress: &dyn Fn(u64)) -> Result<(), String> {
    type B = heed::types::Bytes;
    let err = |e: heed::Error| format!("cannot write the LMDB in {}: {e}", dest.display());
    let mut total = 0u64;
    for (_, path) in files {
        total += std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?.len();
    }
    // Room for the values, their keys and B-tree pages, twice over; the file only grows to
    // what is used.
    let map = ((total + files.len() as u64 * 512) * 2).max(64 << 20);
    let map = usize::try_from(map).map_err(|_| "the demo dataset is too large for this platform's LMDB".to_string())?;
    // SAFETY: the environment is new, in a directory this process just made, and nothing else
    // opens it until it is closed below.
    let env = unsafe { heed::EnvOpenOptions::new().map_size(map).open(dest) }.map_err(err)?;
    let w = env.write_txn().map_err(err)?;
    let db: heed::Database<B, B> = env
        .create_databases_and_commit(w, |wdo, wtxn| {
            wdo.create_database::<B, B>(wtxn, None).map(heed::CommitOrAbort::<_, ()>::Commit)
        })
        .map_err(err)?
        .unwrap_commit();
    let mut w = env.write_txn().map_err(err)?;
    let mut buf = Vec::new();
    for (name, path) in files {
        read(path, &mut buf)?;
        let key = name.split('.').next().unwrap_or(name);
        db.put(&mut w, key.as_bytes(), &buf).map_err(err)?;
        progress(buf.len() as u64);
    }
    w.commit().map_err(err)?;
    env.prepare_for_closing().wait();
    // Readers open with NO_LOCK; a lock file left behind would only confuse a later copy.
    let _ = std::fs::remove_file(dest.join("lock.mdb"));
    Ok(())
}
