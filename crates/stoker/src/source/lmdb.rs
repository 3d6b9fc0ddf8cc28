//! The `lmdb` layout: a read-only LMDB environment (heed), sample `i` = the `i`-th key in
//! byte order, one field (`data` unless configured).
//!
//! Keys are bytes; a sample's key is their lossless text ([`escape_key`]), so keys that are
//! not UTF-8 stay distinct and `pack` writes the same bytes back.
//!
//! Opened read-only with `NO_LOCK`, so no `lock.mdb` is ever written and read-only
//! directories work. Reads run on blocking threads and copy values into `Bytes` before their
//! transaction ends.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Bound, Range};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use heed::types::{Bytes as RawBytes, DecodeIgnore};
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions, WithoutTls};

use super::{check_index, fill_blocking, Capability, SampleSource, SourceInfo};
use crate::batch::BatchBuilder;
use crate::error::{Error, Result};
use crate::sample::{display_key, escape_key, Field, Sample, SampleMeta};
use crate::uri::{Layout, SourceOptions};

mod tree;

/// The file that makes a directory an LMDB environment.
pub(crate) const DATA_FILE: &str = "data.mdb";

/// An LMDB environment as a sample source.
pub struct LmdbSource {
    inner: Arc<Inner>,
}

struct Inner {
    env: &'static OpenEnv,
    display: String,
    field: Arc<str>,
    /// All keys, concatenated, in byte order; key `i` is `keys[ends[i-1]..ends[i]]`.
    keys: Vec<u8>,
    ends: Vec<usize>,
}

struct OpenEnv {
    env: Env<WithoutTls>,
    db: Database<'static, RawBytes, RawBytes>,
    /// Where the map starts, its length, and how many of its bytes the file backed when it
    /// was opened (see [`OpenEnv::holds`]).
    map: (usize, usize, usize),
    /// The file, to ask its size again before calling a value damaged.
    data: PathBuf,
}

impl OpenEnv {
    /// Whether `b`, a key or value LMDB handed out, lies in the part of the map the file
    /// backs. LMDB takes a node's sizes as written: a damaged node can claim a value of up to
    /// 4 GiB (or a key of 64 KiB) and gets a slice that long from where it points, past the
    /// end of the file (touching it ends the process with SIGBUS) or of the map. A slice past
    /// the size the file had at open is checked again against its size now (an environment
    /// that grew since, then opened again in this process, is not damaged).
    fn holds(&self, b: &[u8]) -> bool {
        let (base, mapped, backed) = self.map;
        let within = |len: usize| {
            let at = b.as_ptr() as usize;
            b.is_empty() || (at >= base && at.checked_add(b.len()).is_some_and(|end| end <= base.saturating_add(len)))
        };
        within(backed)
            || std::fs::metadata(&self.data)
                .is_ok_and(|m| within(usize::try_from(m.len()).unwrap_or(usize::MAX).min(mapped)))
    }
}

/// heed refuses to open one environment twice in a process (its registry survives fork, so
/// a forked DataLoader worker cannot reopen either), and a database handle borrows its
/// environment; so each environment is opened once and kept for the process's life. A forked
/// child reuses the inherited handle: with READ_ONLY | NO_LOCK there is no lock file and no
/// reader table, only the inherited read-only mapping, which is safe to read after fork.
fn registry() -> &'static Mutex<HashMap<PathBuf, &'static OpenEnv>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, &'static OpenEnv>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn lmdb_err(path: &Path, reason: impl fmt::Display) -> Error {
    Error::Lmdb { path: path.display().to_string(), reason: reason.to_string() }
}

/// The mapping of this process holding `at` (a byte LMDB handed out from its map), if it maps
/// file `inode` from its start: where it starts and its length, from `/proc/self/maps` (LMDB
/// does not say: its `mdb_env_info` gives a map's address only when it is fixed). Found by
/// address and inode, not path: a `data.mdb` that is a symlink (a hub or DVC cache) is listed
/// under its target, and another mapping of the same file elsewhere is not this one.
fn mapping_of(at: usize, inode: u64) -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        // `start-end perms offset dev inode path`.
        let mut fields = line.split_ascii_whitespace();
        let (range, offset, ino) = (fields.next()?, fields.nth(1)?, fields.nth(1)?);
        let (a, z) = range.split_once('-')?;
        let (a, z) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(z, 16).ok()?);
        let whole_file = offset.trim_start_matches('0').is_empty() && ino.parse::<u64>().ok() == Some(inode);
        ((a..z).contains(&at) && whole_file).then_some((a, z - a))
    })
}

/// A node of `data.mdb` whose sizes point past the file.
fn damaged(path: &Path, what: &str) -> Error {
    lmdb_err(path, format!("{what}, past the end of data.mdb: the file is damaged; copy it again"))
}

impl LmdbSource {
    /// Open the environment in directory `dir` (the one holding `data.mdb`).
    pub fn open(dir: &Path, opts: &SourceOptions, display: String) -> Result<Self> {
        let data = dir.join(DATA_FILE);
        if !data.is_file() {
            return Err(if dir.exists() {
                lmdb_err(dir, "no data.mdb here, so this is not an LMDB environment; pass the directory that holds data.mdb, or drop ?layout=lmdb")
            } else {
                Error::NotFound { what: dir.display().to_string(), hint: Some("no such directory".into()) }
            });
        }
        let (file, meta) = read_meta(&data)?;
        tree::check(&data, &file, &meta)?;
        drop(file);
        let canonical = std::fs::canonicalize(dir).map_err(|e| Error::io(dir.display(), e))?;
        let env = open_env(&canonical)?;
        let txn = env.env.read_txn().map_err(|e| lmdb_err(dir, e))?;
        let mut keys = Vec::new();
        let mut ends = Vec::new();
        let iter = env.db.remap_data_type::<DecodeIgnore>().iter(&txn).map_err(|e| lmdb_err(dir, e))?;
        for item in iter {
            let (k, ()) = item.map_err(|e| lmdb_err(dir, e))?;
            if !env.holds(k) {
                return Err(damaged(dir, &format!("key {} claims {} bytes", ends.len(), k.len())));
            }
            keys.extend_from_slice(k);
            ends.push(keys.len());
        }
        drop(txn);
        if ends.is_empty() {
            return Err(Error::Empty { uri: display, reason: "the LMDB database has no records".into() });
        }
        Ok(LmdbSource { inner: Arc::new(Inner { env, display, field: Arc::from(opts.field_name()), keys, ends }) })
    }
}

fn open_env(canonical: &Path) -> Result<&'static OpenEnv> {
    let key = canonical.to_path_buf();
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(env) = reg.get(&key) {
        return Ok(env);
    }
    let mut options = EnvOpenOptions::new().read_txn_without_tls();
    // SAFETY: READ_ONLY | NO_LOCK is sound as long as nobody writes the environment while we
    // read it; Stoker reads finished datasets, which is the documented contract.
    let env = unsafe {
        options.flags(EnvFlags::READ_ONLY | EnvFlags::NO_LOCK);
        options.open(canonical)
    }
    .map_err(|e| lmdb_err(canonical, format!("cannot open: {e}")))?;
    let env: &'static Env<WithoutTls> = Box::leak(Box::new(env));
    let txn = env.read_txn().map_err(|e| lmdb_err(canonical, e))?;
    let db = env
        .open_databases_and_commit(txn, |dbo, rtxn| {
            dbo.open_database::<RawBytes, RawBytes>(rtxn, None).map(CommitOrAbort::<_, ()>::Commit)
        })
        .map_err(|e| lmdb_err(canonical, e))?
        .unwrap_commit()
        .ok_or_else(|| lmdb_err(canonical, "the environment has no unnamed database"))?;
    let data = canonical.join(DATA_FILE);
    let meta = std::fs::metadata(&data).map_err(|e| Error::io(data.display(), e))?;
    // The first key lies in the map (LMDB checks a page's number against the file's last).
    let txn = env.read_txn().map_err(|e| lmdb_err(canonical, e))?;
    let first = db.first(&txn).map_err(|e| lmdb_err(canonical, e))?.map(|(k, _)| k.as_ptr() as usize);
    drop(txn);
    let map = match first.and_then(|at| mapping_of(at, std::os::unix::fs::MetadataExt::ino(&meta))) {
        Some((base, len)) => (base, len, len.min(usize::try_from(meta.len()).unwrap_or(usize::MAX))),
        // Where the process's maps cannot be read (or the database is empty), nothing is
        // refused on this ground.
        None => (0, usize::MAX, usize::MAX),
    };
    let open: &'static OpenEnv = Box::leak(Box::new(OpenEnv { env: env.clone(), db, map, data }));
    reg.insert(key, open);
    Ok(open)
}

/// What the live meta page of a `data.mdb` says.
struct Meta {
    psize: u64,
    last_page: u64,
    /// The unnamed database's root page and record count.
    root: u64,
    records: u64,
    /// The unnamed database's flags (MDB_DUPSORT and the like).
    db_flags: u16,
}

/// Check `data.mdb`'s meta pages before mapping it: LMDB maps the size the meta page claims,
/// and touching a page past the end of a truncated file kills the process with SIGBUS.
/// Returns the records its unnamed database holds, as the live meta page says.
pub(crate) fn check_data_file(data: &Path) -> Result<u64> {
    Ok(read_meta(data)?.1.records)
}

/// The file, opened, and its live meta page, checked against the file's size.
fn read_meta(data: &Path) -> Result<(std::fs::File, Meta)> {
    use std::io::Read;
    const MAGIC: u32 = 0xBEEF_C0DE;
    let bad = |reason: String| lmdb_err(data, reason);
    let mut f = std::fs::File::open(data).map_err(|e| Error::io(data.display(), e))?;
    let len = f.metadata().map_err(|e| Error::io(data.display(), e))?.len();
    let mut page0 = [0u8; 152];
    f.read_exact(&mut page0)
        .map_err(|_| bad(format!("data.mdb is only {len} bytes, too short for an LMDB file: truncated or not LMDB")))?;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
    if u32_at(&page0, 16) != MAGIC {
        return Err(bad(
            "data.mdb does not start with an LMDB meta page (bad magic): not an LMDB file, or corrupt".into()
        ));
    }
    let psize = u32_at(&page0, 40) as u64;
    if !(512..=65536).contains(&psize) || !psize.is_power_of_two() {
        return Err(bad(format!("meta page names an impossible page size {psize}: corrupt")));
    }
    let mut page1 = [0u8; 152];
    let meta1 =
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut page1, psize).ok().filter(|_| u32_at(&page1, 16) == MAGIC);
    // The newer of the two meta pages is the live one.
    let live = match meta1 {
        Some(()) if u64_at(&page1, 144) > u64_at(&page0, 144) => &page1,
        _ => &page0,
    };
    // LMDB maps and walks pages at the live meta page's size: one that disagrees with the
    // first (both are written with the one size the environment has) made it touch memory
    // past the file's end (a SIGBUS).
    if meta1.is_some() && u32_at(&page1, 40) as u64 != psize {
        return Err(bad(format!(
            "its two meta pages disagree on the page size ({psize} and {}): corrupt; copy it again",
            u32_at(&page1, 40)
        )));
    }
    let last_page = u64_at(live, 136);
    let need = last_page.saturating_add(1).saturating_mul(psize);
    if len < need {
        return Err(bad(format!(
            "data.mdb is {len} bytes but its meta page says the data runs to {need} bytes: the file is truncated; copy it again"
        )));
    }
    // The meta page's second database record (the unnamed one, at 88) counts its entries
    // (at 32 in the record) and names its root (at 40).
    let db_flags = u16::from_le_bytes([live[88 + 4], live[88 + 5]]);
    let meta = Meta { psize, last_page, root: u64_at(live, 88 + 40), records: u64_at(live, 88 + 32), db_flags };
    Ok((f, meta))
}

impl Inner {
    fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.keys[start..self.ends[i]]
    }

    fn key_string(&self, i: usize) -> String {
        escape_key(self.key(i)).into_owned()
    }

    fn value_len(&self, i: usize) -> Result<u64> {
        let path = Path::new(&self.display);
        let txn = self.env.env.read_txn().map_err(|e| lmdb_err(path, e))?;
        let v = self.env.db.get(&txn, self.key(i)).map_err(|e| lmdb_err(path, e))?;
        Ok(self.held(i, v.ok_or_else(|| self.missing(i))?)?.len() as u64)
    }

    /// Value `v` of sample `i` if the file holds it (see [`OpenEnv::holds`]), before a byte
    /// of it is touched or its length trusted for an allocation.
    fn held<'t>(&self, i: usize, v: &'t [u8]) -> Result<&'t [u8]> {
        if self.env.holds(v) {
            return Ok(v);
        }
        let what =
            format!("the value of key `{}` (sample {i}) claims {} bytes", display_key(&self.key_string(i)), v.len());
        Err(damaged(Path::new(&self.display), &what))
    }

    fn missing(&self, i: usize) -> Error {
        lmdb_err(
            Path::new(&self.display),
            format!(
                "key `{}` (sample {i}) vanished: the environment was modified after opening; reopen it",
                display_key(&self.key_string(i))
            ),
        )
    }

    /// Read `indices` (all in range) in one transaction; consecutive runs walk a cursor.
    /// Values are copied into one buffer for the whole call and handed out as slices of it:
    /// one allocation (usually recycled) instead of one per sample.
    fn read(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let path = Path::new(&self.display);
        let txn = self.env.env.read_txn().map_err(|e| lmdb_err(path, e))?;
        let mut values: Vec<&[u8]> = Vec::with_capacity(indices.len());
        self.for_each_value(&txn, indices, |_, v| {
            values.push(v);
            Ok(())
        })?;
        let total: usize = values.iter().map(|v| v.len()).sum();
        let mut buf = crate::buffer::take(total);
        let mut ends = Vec::with_capacity(values.len());
        let mut end = 0;
        for v in &values {
            buf[end..end + v.len()].copy_from_slice(v);
            end += v.len();
            ends.push(end);
        }
        drop(values);
        drop(txn);
        let all = crate::buffer::freeze(buf, total);
        let mut start = 0;
        Ok(indices
            .iter()
            .zip(ends)
            .map(|(&i, end)| {
                let data = all.slice(start..end);
                start = end;
                Sample { key: self.key_string(i), fields: vec![Field { name: self.field.clone(), data }] }
            })
            .collect())
    }
}

impl Inner {
    /// Copy values straight from the memory map into the batch: the only copy they get.
    fn read_into(&self, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        let path = Path::new(&self.display);
        let txn = self.env.env.read_txn().map_err(|e| lmdb_err(path, e))?;
        self.for_each_value(&txn, indices, |i, v| {
            out.begin_bytes(i as u64, self.key(i));
            out.field(&self.field, v.len()).copy_from_slice(v);
            Ok(())
        })
    }

    /// Visit the values of `indices` (all in range) in order. Runs of consecutive indices
    /// walk a cursor instead of searching the tree for each key.
    fn for_each_value<'t>(
        &self,
        txn: &'t heed::RoTxn<'t, WithoutTls>,
        indices: &[usize],
        mut f: impl FnMut(usize, &'t [u8]) -> Result<()>,
    ) -> Result<()> {
        let path = Path::new(&self.display);
        let mut at = 0;
        while at < indices.len() {
            let run = consecutive_run(&indices[at..]);
            let first = indices[at];
            if run.len() == 1 {
                let v = self.env.db.get(txn, self.key(first)).map_err(|e| lmdb_err(path, e))?;
                f(first, self.held(first, v.ok_or_else(|| self.missing(first))?)?)?;
            } else {
                let last = first + run.len() - 1;
                let bounds = (Bound::Included(self.key(first)), Bound::Included(self.key(last)));
                let mut iter = self.env.db.range(txn, &bounds).map_err(|e| lmdb_err(path, e))?;
                for i in first..=last {
                    let (k, v) = iter.next().ok_or_else(|| self.missing(i))?.map_err(|e| lmdb_err(path, e))?;
                    if k != self.key(i) {
                        return Err(self.missing(i));
                    }
                    f(i, self.held(i, v)?)?;
                }
            }
            at += run.len();
        }
        Ok(())
    }
}

/// The longest prefix of `idx` that counts up by one.
fn consecutive_run(idx: &[usize]) -> Range<usize> {
    let n = idx.windows(2).take_while(|w| w[0].checked_add(1) == Some(w[1])).count() + 1;
    0..n.min(idx.len())
}

impl fmt::Debug for LmdbSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LmdbSource").field("uri", &self.inner.display).field("samples", &self.inner.ends.len()).finish()
    }
}

impl fmt::Display for LmdbSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lmdb:{}", self.inner.display)
    }
}

/// Samples per blocking task in `get_many`: big enough to amortise the hand-off, small enough
/// that a batch spreads over the cores.
const CHUNK: usize = 128;

#[async_trait]
impl SampleSource for LmdbSource {
    fn len(&self) -> usize {
        self.inner.ends.len()
    }

    fn capability(&self) -> Capability {
        // Sizes come from the B-tree node without touching the value pages.
        Capability { random_access: true, coalesced_reads: false, locality: false, cheap_meta: true, local: true }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Lmdb, 1)
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        Ok(self.get_many(&[index]).await?.remove(0))
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        for &i in indices {
            check_index(i, self.len())?;
        }
        let tasks: Vec<_> = indices
            .chunks(CHUNK)
            .map(|chunk| {
                let (inner, chunk) = (self.inner.clone(), chunk.to_vec());
                tokio::task::spawn_blocking(move || inner.read(&chunk))
            })
            .collect();
        let mut out = Vec::with_capacity(indices.len());
        for t in tasks {
            out.extend(t.await.map_err(Error::task)??);
        }
        Ok(out)
    }

    async fn get_many_into(&self, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        for &i in indices {
            check_index(i, self.len())?;
        }
        // One blocking task per CHUNK samples would need several builders; a batch is one
        // task, and the loader keeps several batches in flight to use the cores.
        let (inner, idx) = (self.inner.clone(), indices.to_vec());
        fill_blocking(out, move |b| inner.read_into(&idx, b)).await
    }

    async fn meta(&self, index: usize) -> Result<SampleMeta> {
        check_index(index, self.len())?;
        let inner = self.inner.clone();
        let len = tokio::task::spawn_blocking(move || inner.value_len(index)).await.map_err(Error::task)??;
        Ok(SampleMeta { key: self.inner.key_string(index), fields: vec![(self.inner.field.clone(), len)] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_consecutive_indices() {
        assert_eq!(consecutive_run(&[3, 4, 5, 9]), 0..3);
        assert_eq!(consecutive_run(&[3, 3]), 0..1);
        assert_eq!(consecutive_run(&[7]), 0..1);
        assert_eq!(consecutive_run(&[usize::MAX, 0]), 0..1);
    }
}
