//! Samples of shards that must be decoded whole (a Parquet row group whose column is one
//! page, ...), written once to an unnamed file of this process's own, so that a shuffled
//! epoch over more data than the decoded-shard memory holds reads each sample back with
//! one `pread` instead of decoding its whole shard again for every batch that wants a few
//! of its rows.
//!
//! This is what Hugging Face `datasets` does with its Arrow cache, done lazily: a Parquet row
//! group is written once it has been decoded (in the background; the next epoch then decodes
//! nothing), other shards (LitData's) only when evicted from memory before all their rows
//! were read. A source's shards go into one file, each written at its own place (reserved
//! before it is written, so writers never wait on each other), not a file each: a source of
//! thousands of row groups or HDF5 chunks would otherwise hold thousands of descriptors, and
//! the process's other opens (shards, indexes) would fail at its limit. The file has no name
//! (`O_TMPFILE`, or unlinked at once where that is not supported), so the kernel frees it
//! when the process ends, however it ends: nothing is left behind and nothing is reused by
//! another run (whose file could have changed). What they hold is bounded like the disk
//! cache (a tenth of the free space, capped); past that, shards are decoded again. Nor do
//! they ever take the disk's last free space: a shard that would leave less than the floor
//! the disk cache keeps (`cache::room`: 5% of the disk, at most 1 GiB) is not spilled.

use std::collections::HashMap;
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::cache::room::{disk_of, SpaceQuery};
use crate::error::{Error, Result};
use crate::ranges;
use crate::sample::{Field, Sample};

/// A spilled shard's name: (shard, part of it), e.g. (row group, 0) or (chunk, record batch).
pub(crate) type UnitKey = (usize, usize);

/// Spilled shards of one source.
pub(crate) struct Spill {
    dir: PathBuf,
    /// Bytes the file may hold: sized from the disk on the first write (opening a source
    /// that never spills touches no disk).
    budget: std::sync::OnceLock<u64>,
    units: Mutex<HashMap<UnitKey, Arc<Unit>>>,
    /// Shards being written, each with what says when its write ended: a second writer of
    /// one waits for the first instead of writing it again.
    writing: Mutex<HashMap<UnitKey, tokio::sync::watch::Receiver<bool>>>,
    /// A write failed (full or read-only disk): no more writes, said once.
    broken: AtomicBool,
    /// The numbers of the disk the files go to, asked before every write.
    space: SpaceQuery,
    /// The one file every shard is written to, made at the first write.
    file: Mutex<Option<Arc<std::fs::File>>>,
    /// Where the next shard's bytes go in it: every byte reserved so far, written or not (a
    /// write cancelled or failed leaves its place unused, and still counted), so the file never
    /// holds more than the budget.
    end: AtomicU64,
}

/// Whether a shard was left unspilled for want of room above the disk's floor (said once).
static WARNED_ROOM: AtomicBool = AtomicBool::new(false);

/// One spilled shard: the spill's file and, in memory, where each row's fields lie in it.
struct Unit {
    file: Arc<std::fs::File>,
    rows: Vec<Row>,
}

struct Row {
    key: String,
    /// Name, offset in the file, length; a row's fields lie back to back.
    fields: Vec<(Arc<str>, u64, u32)>,
}

impl Row {
    fn span(&self) -> Range<u64> {
        match (self.fields.first(), self.fields.last()) {
            (Some(f), Some(l)) => f.1..l.1 + u64::from(l.2),
            _ => 0..0,
        }
    }
}

impl Spill {
    /// A spill whose files go in `dir` (created when first written), bounded by the disk
    /// cache's default size for that disk.
    pub(crate) fn new(dir: PathBuf) -> Self {
        Spill {
            space: disk_of(dir.clone()),
            dir,
            budget: std::sync::OnceLock::new(),
            units: Mutex::new(HashMap::new()),
            writing: Mutex::new(HashMap::new()),
            broken: AtomicBool::new(false),
            file: Mutex::new(None),
            end: AtomicU64::new(0),
        }
    }

    /// Like [`Spill::new`], bounded by `budget` bytes.
    #[cfg(test)]
    fn with_budget(dir: PathBuf, budget: u64) -> Self {
        let s = Spill::new(dir);
        let _ = s.budget.set(budget);
        s
    }

    /// Like [`Spill::with_budget`], on a disk whose numbers `space` gives.
    #[cfg(test)]
    fn on_disk(dir: PathBuf, budget: u64, space: SpaceQuery) -> Self {
        Spill { space, ..Spill::with_budget(dir, budget) }
    }

    fn budget(&self) -> u64 {
        *self.budget.get_or_init(|| {
            let _ = std::fs::create_dir_all(&self.dir);
            crate::cache::default_limit(&self.dir, 0)
        })
    }

    /// Bytes reserved in the file so far.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.end.load(Relaxed)
    }

    /// Whether a shard may still be written: no write has failed and the budget is not spent.
    /// A reader that would do extra work only to spill (decode a whole HDF5 chunk for one
    /// row) asks first.
    pub(crate) fn accepting(&self) -> bool {
        !self.broken.load(Relaxed) && self.end.load(Relaxed) < self.budget()
    }

    /// A place of `bytes` in the file within the budget, or `None`.
    fn reserve(&self, bytes: u64) -> Option<u64> {
        let budget = self.budget();
        self.end.fetch_update(Relaxed, Relaxed, |end| end.checked_add(bytes).filter(|&e| e <= budget)).ok()
    }

    /// Whether shard `unit` is spilled.
    pub(crate) fn has(&self, unit: UnitKey) -> bool {
        self.units.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&unit)
    }

    /// Write `samples`, the rows of shard `unit` in row order, unless it is spilled already.
    /// Returns whether this call spilled it: not when it was spilled before, nor when the
    /// budget is spent or the disk refuses (then said once), which costs only a later decode.
    /// While another call writes the same shard, this one waits for that write to end.
    pub(crate) async fn put(self: &Arc<Self>, unit: UnitKey, samples: Vec<Sample>) -> bool {
        let bytes: u64 = samples.iter().flat_map(|s| s.fields.iter()).map(|f| f.data.len() as u64).sum();
        if self.broken.load(Relaxed) || self.has(unit) {
            return false;
        }
        let (ended, _) = tokio::sync::watch::channel(false);
        let other = {
            let mut writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            match writing.get(&unit) {
                Some(rx) => Some(rx.clone()),
                None => {
                    writing.insert(unit, ended.subscribe());
                    None
                }
            }
        };
        if let Some(mut other) = other {
            // Ended or dropped (a write cancelled with its task), either way it is over.
            let _ = other.wait_for(|&done| done).await;
            return false;
        }
        // Listed as spilled (or given up) before this says the write is over, however it ends.
        let _writing = Writing { spill: self, unit, ended };
        if self.has(unit) {
            return false; // another write ended between the first look and the listing
        }
        // Whatever the budget, the disk keeps its floor: others may have filled it since.
        if (self.space)().is_some_and(|s| s.shortfall(bytes) > 0) {
            crate::cache::warn_once(&WARNED_ROOM, || {
                format!(
                    "the disk holding {} is nearly full (spilled shards leave 5% of it free, at most 1 GiB): shards \
                     that do not fit are decoded again when read again. Free space there, or point STOKER_CACHE_DIR \
                     elsewhere",
                    self.dir.display()
                )
            });
            return false;
        }
        let Some(base) = self.reserve(bytes) else { return false };
        let me = self.clone();
        let written = tokio::task::spawn_blocking(move || me.write(samples, base, bytes)).await;
        match written {
            Ok(Ok(u)) => {
                self.units.lock().unwrap_or_else(|e| e.into_inner()).insert(unit, Arc::new(u));
                true
            }
            Ok(Err(e)) => {
                if !self.broken.swap(true, Relaxed) {
                    eprintln!(
                        "stoker: warning: cannot write decoded shards to {} ({e}); shards will be decoded again when \
                         read again. Free space there, point STOKER_CACHE_DIR elsewhere, or set disk_cache=false to \
                         silence this",
                        self.dir.display()
                    );
                }
                false
            }
            Err(_) => false,
        }
    }

    /// The spill's file, made at the first call.
    fn file(&self) -> io::Result<Arc<std::fs::File>> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = &*file {
            return Ok(f.clone());
        }
        std::fs::create_dir_all(&self.dir)?;
        let f = Arc::new(unnamed_file(&self.dir)?);
        *file = Some(f.clone());
        Ok(f)
    }

    /// Write `samples` at `base`, the place of the file reserved for their `bytes`.
    fn write(&self, samples: Vec<Sample>, base: u64, bytes: u64) -> io::Result<Unit> {
        let file = self.file()?;
        // Buffered a MiB at a time: a row group of many small rows is a few writes, not one a field.
        let mut out = io::BufWriter::with_capacity(1 << 20, At(&file, base));
        let mut at = base;
        let mut rows = Vec::with_capacity(samples.len());
        for s in samples {
            let mut fields = Vec::with_capacity(s.fields.len());
            for f in s.fields {
                out.write_all(&f.data)?;
                let len = u32::try_from(f.data.len()).map_err(|_| io::Error::other("a field of 4 GiB or more"))?;
                fields.push((f.name, at, len));
                at += u64::from(len);
            }
            rows.push(Row { key: s.key, fields });
        }
        out.flush()?;
        drop(out);
        debug_assert_eq!(at, base + bytes, "the fields are the bytes reserved");
        Ok(Unit { file, rows })
    }

    /// Rows `rows` of shard `unit` (any order, repeats allowed) as samples in that order,
    /// or `None` when the shard is not spilled. Rows are read with merged `pread`s.
    pub(crate) async fn get(&self, unit: UnitKey, rows: &[usize]) -> Option<Result<Vec<Sample>>> {
        let u = self.units.lock().unwrap_or_else(|e| e.into_inner()).get(&unit).cloned()?;
        let rows = rows.to_vec();
        let dir = self.dir.clone();
        let read = tokio::task::spawn_blocking(move || read_rows(&u, &rows, &dir)).await;
        Some(read.map_err(Error::task).and_then(|r| r))
    }
}

/// Writes to a file from an offset on (`pwrite`), so writers of different places of one file
/// never share a file position.
struct At<'a>(&'a std::fs::File, u64);

impl io::Write for At<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // A piece at a time: a field larger than the BufWriter's buffer comes here whole.
        let n = self.0.write_at(&buf[..buf.len().min(crate::cache::WRITE_PIECE)], self.1)?;
        self.1 += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A write of one shard in progress: when it ends, however it ends (a cancelled task too),
/// the shard is no longer being written and those waiting for it are told.
struct Writing<'a> {
    spill: &'a Spill,
    unit: UnitKey,
    ended: tokio::sync::watch::Sender<bool>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.spill.writing.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.unit);
        let _ = self.ended.send(true);
    }
}

fn read_rows(u: &Unit, rows: &[usize], dir: &Path) -> Result<Vec<Sample>> {
    let shown = || format!("a decoded-shard file in {}", dir.display());
    let spans: Vec<Range<u64>> = rows
        .iter()
        .map(|&r| u.rows.get(r).map(Row::span).ok_or_else(|| Error::internal(format!("spill: no row {r}"))))
        .collect::<Result<_>>()?;
    // A row of empty fields has an empty span and needs no read (the merge drops it).
    let mut sorted: Vec<Range<u64>> = spans.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    sorted.dedup();
    let merged = ranges::merge(&sorted, &ranges::Policy::new(ranges::LOCAL_GAP, ranges::MAX_MERGED));
    let mut got = Vec::with_capacity(merged.reads.len());
    for r in &merged.reads {
        let want = (r.end - r.start) as usize;
        let mut buf = crate::buffer::take(want);
        u.file.read_exact_at(&mut buf[..want], r.start).map_err(|e| Error::io(shown(), e))?;
        got.push(crate::buffer::freeze(buf, want));
    }
    rows.iter()
        .zip(&spans)
        .map(|(&r, span)| {
            let row = &u.rows[r];
            if span.start == span.end {
                let fields = row.fields.iter().map(|(name, _, _)| Field { name: name.clone(), data: Bytes::new() });
                return Ok(Sample { key: row.key.clone(), fields: fields.collect() });
            }
            // The merged read that holds this row: the one starting at or before it.
            let k = merged.reads.partition_point(|m| m.start <= span.start).checked_sub(1);
            let (read, bytes) = match k {
                Some(k) if merged.reads[k].end >= span.end => (&merged.reads[k], &got[k]),
                _ => return Err(Error::internal(format!("spill: row {r} is in no read"))),
            };
            let fields = row
                .fields
                .iter()
                .map(|(name, at, len)| {
                    let from = (at - read.start) as usize;
                    Field { name: name.clone(), data: bytes.slice(from..from + *len as usize) }
                })
                .collect();
            Ok(Sample { key: row.key.clone(), fields })
        })
        .collect()
}

/// Shards decoded whole and kept in memory, least recently used first, within a budget of
/// bytes, each with which of its rows were read since it was kept: what is dropped with rows
/// unread is handed back to be spilled (a shuffled pass will want those rows again; a shard
/// read to its last row, as a sequential pass does, is not wanted again soon).
pub(crate) struct Kept<K: std::hash::Hash + Eq, V> {
    budget: usize,
    /// In use order: a map, not a list, so that finding and dropping an entry costs the same
    /// with 50,000 kept (a Parquet file of one-row groups) as with 5.
    entries: lru::LruCache<K, KeptEntry<V>>,
    bytes: usize,
}

struct KeptEntry<V> {
    value: V,
    size: usize,
    read: Vec<bool>,
    unread: usize,
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> Kept<K, V> {
    /// Nothing kept yet; at most `budget` bytes (and always the last entry put).
    pub(crate) fn new(budget: usize) -> Self {
        Kept { budget, entries: lru::LruCache::unbounded(), bytes: 0 }
    }

    /// Entry `key`, marking `rows` (of its rows) read.
    pub(crate) fn get(&mut self, key: K, rows: &[usize]) -> Option<V> {
        let e = self.entries.get_mut(&key)?;
        for &r in rows {
            if let Some(seen) = e.read.get_mut(r).filter(|seen| !**seen) {
                *seen = true;
                e.unread -= 1;
            }
        }
        Some(e.value.clone())
    }

    /// Keep `value` as `key`: `size` bytes, `n` rows (0 for what has no rows) of which `rows`
    /// are read. Returns the entries dropped with rows unread.
    pub(crate) fn put(&mut self, key: K, value: V, size: usize, n: usize, rows: &[usize]) -> Vec<(K, V)> {
        if self.entries.contains(&key) {
            return Vec::new();
        }
        self.bytes += size;
        self.entries.put(key, KeptEntry { value, size, read: vec![false; n], unread: n });
        self.get(key, rows);
        let mut dropped = Vec::new();
        while self.bytes > self.budget && self.entries.len() > 1 {
            let Some((old_key, old)) = self.entries.pop_lru() else { break };
            self.bytes -= old.size;
            if old.unread > 0 {
                dropped.push((old_key, old.value));
            }
        }
        dropped
    }
}

/// A file in `dir` with no name: `O_TMPFILE` where the file system has it, else a named
/// file removed at once.
pub(crate) fn unnamed_file(dir: &Path) -> io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    match rustix::fs::open(dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, Mode::RUSR | Mode::WUSR) {
        Ok(fd) => Ok(std::fs::File::from(fd)),
        Err(_) => {
            static N: AtomicU64 = AtomicU64::new(0);
            let path = dir.join(format!(".spill-{}-{}", std::process::id(), N.fetch_add(1, Relaxed)));
            let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn sample(i: usize) -> Sample {
        Sample {
            key: format!("k{i}"),
            fields: vec![
                Field { name: "a".into(), data: Bytes::from(vec![i as u8; i * 7 + 1]) },
                Field { name: "b".into(), data: Bytes::from(format!("{i}")) },
            ],
        }
    }

    /// Two writers of one shard at once: one writes, the other waits for it and finds it
    /// spilled; a write cancelled before it ended (its task dropped) blocks no later writer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_write_per_shard_and_a_cancelled_write_blocks_nothing() {
        use futures::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let spill = Arc::new(Spill::with_budget(dir.path().join("s"), 1 << 20));
        let (a, b) = (spill.clone(), spill.clone());
        let (x, y) = tokio::join!(
            tokio::spawn(async move { a.put((1, 0), (0..50).map(sample).collect()).await }),
            tokio::spawn(async move { b.put((1, 0), (0..50).map(sample).collect()).await })
        );
        assert_eq!(u8::from(x.unwrap()) + u8::from(y.unwrap()), 1, "exactly one of them wrote");
        assert!(spill.has((1, 0)));
        let one: u64 = (0..50).map(|i| (i * 7 + 1 + format!("{i}").len()) as u64).sum();
        assert_eq!(spill.used(), one, "written once");
        // Polled once (listed as being written, its write started) and dropped. Its blocking
        // write may, on a busy machine, have ended before that one poll: then it is simply
        // written (what matters is that either way nothing is left half-counted).
        match spill.put((2, 0), (0..5).map(sample).collect()).now_or_never() {
            None => {
                // Its place stays reserved (its blocking write may still be under way): the
                // file never holds more than the budget, whatever was cancelled.
                let five: u64 = (0..5).map(|i| (i * 7 + 1 + format!("{i}").len()) as u64).sum();
                assert_eq!(spill.used(), one + five, "the cancelled write's place is counted");
                assert!(spill.put((2, 0), (0..5).map(sample).collect()).await, "the next writer writes");
            }
            Some(wrote) => assert!(wrote && spill.has((2, 0)), "a write that ended in its first poll is listed"),
        }
        assert_eq!(spill.get((2, 0), &[4]).await.unwrap().unwrap(), vec![sample(4)]);
    }

    #[tokio::test]
    async fn spilled_rows_read_back_in_any_order_and_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Arc::new(Spill::with_budget(dir.path().join("s"), 1 << 20));
        assert!(spill.get((3, 0), &[0]).await.is_none());
        assert!(spill.put((3, 0), (0..50).map(sample).collect()).await);
        assert!(!spill.put((3, 0), (0..50).map(sample).collect()).await, "a shard is spilled once");
        let rows = [49, 0, 7, 7, 20];
        let got = spill.get((3, 0), &rows).await.unwrap().unwrap();
        for (&r, s) in rows.iter().zip(&got) {
            let want = sample(r);
            assert_eq!(s.key, want.key);
            assert_eq!(s.fields, want.fields);
        }
        assert_eq!(std::fs::read_dir(dir.path().join("s")).unwrap().count(), 0, "the files have no name");
    }

    /// Thousands of shards (HDF5 chunks, row groups) share one file: one descriptor, not one
    /// each, and every shard's rows read back as written, big fields and small.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shards_share_one_file_and_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        // Descriptors open on files under this test's directory (the spill's file has no name
        // but keeps its directory in /proc's link): the process's other tests open and close
        // files of their own meanwhile, so a count of all descriptors would race with them.
        let fds = {
            let root = dir.path().to_path_buf();
            move || {
                std::fs::read_dir("/proc/self/fd")
                    .unwrap()
                    .flatten()
                    .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(&root)))
                    .count()
            }
        };
        let spill = Arc::new(Spill::with_budget(dir.path().join("s"), 1 << 30));
        let before = fds();
        let shard = |u: usize| -> Vec<Sample> {
            let mut rows: Vec<Sample> = (0..3).map(|i| sample(u * 3 + i)).collect();
            if u.is_multiple_of(500) {
                // A field larger than the staging buffer, between small ones.
                let big = Bytes::from((0..(1usize << 20) + 17).map(|i| (i * 31 + u) as u8).collect::<Vec<u8>>());
                rows[1].fields.push(Field { name: "big".into(), data: big });
            }
            rows
        };
        let puts = (0..2000).map(|u| {
            let spill = spill.clone();
            tokio::spawn(async move { spill.put((u, 0), shard(u)).await })
        });
        for wrote in futures::future::join_all(puts).await {
            assert!(wrote.unwrap());
        }
        assert_eq!(fds() - before, 1, "descriptors on the spill's directory for 2000 shards");
        for u in (0..2000).step_by(97).chain([0, 500, 1999]) {
            let got = spill.get((u, 0), &[2, 0, 1]).await.unwrap().unwrap();
            let want = shard(u);
            assert_eq!(got, vec![want[2].clone(), want[0].clone(), want[1].clone()], "shard {u}");
        }
    }

    /// A row whose fields are all empty (an empty string, a row of no bytes) reads back alone
    /// and among others: it has no span to read.
    #[tokio::test]
    async fn rows_of_empty_fields_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Arc::new(Spill::with_budget(dir.path().join("s"), 1 << 20));
        let empty = |i: usize| Sample {
            key: format!("e{i}"),
            fields: vec![
                Field { name: "a".into(), data: Bytes::new() },
                Field { name: "b".into(), data: Bytes::new() },
            ],
        };
        let rows = vec![empty(0), sample(1), empty(2), sample(3), empty(4)];
        assert!(spill.put((5, 0), rows.clone()).await);
        for ask in [vec![0], vec![2], vec![4], vec![1, 2, 3], vec![4, 3, 2, 1, 0], vec![2, 2]] {
            let got = spill.get((5, 0), &ask).await.unwrap().unwrap();
            let want: Vec<Sample> = ask.iter().map(|&r| rows[r].clone()).collect();
            assert_eq!(got, want, "rows {ask:?}");
        }
    }

    #[test]
    fn kept_drops_least_recent_and_hands_back_what_has_rows_unread() {
        let mut k: Kept<u32, &str> = Kept::new(10);
        assert!(k.put(1, "a", 4, 3, &[0, 1, 2]).is_empty());
        assert!(k.put(2, "b", 4, 3, &[0]).is_empty());
        assert_eq!(k.get(1, &[]), Some("a"), "1 becomes the most recent");
        // Over budget: 2 goes first (least recent) and has rows unread; 1 was read whole.
        assert_eq!(k.put(3, "c", 4, 0, &[]), vec![(2, "b")]);
        assert_eq!(k.put(4, "d", 4, 2, &[]), Vec::<(u32, &str)>::new(), "1 was read to its last row");
        assert_eq!(k.get(1, &[]), None);
        assert_eq!(k.get(4, &[0]), Some("d"));
    }

    /// A budget larger than the room on the disk: what would go below the floor is not
    /// written, what fits above it is.
    #[tokio::test]
    async fn the_disk_keeps_its_floor_whatever_the_budget() {
        use crate::cache::room::Space;
        let dir = tempfile::tempdir().unwrap();
        const MIB: u64 = 1 << 20;
        // 100 MiB with 6 free: the floor is 5, one MiB may be written.
        let space: SpaceQuery = Arc::new(|| Some(Space { free: 6 * MIB, total: 100 * MIB }));
        let spill = Arc::new(Spill::on_disk(dir.path().join("s"), 1 << 40, space));
        let big = |i: usize, len: u64| Sample {
            key: format!("k{i}"),
            fields: vec![Field { name: "a".into(), data: Bytes::from(vec![1u8; len as usize]) }],
        };
        assert!(!spill.put((0, 0), vec![big(0, 2 * MIB)]).await, "2 MiB would leave 4 of a 5 MiB floor");
        assert_eq!(spill.used(), 0);
        assert!(spill.get((0, 0), &[0]).await.is_none());
        assert!(spill.put((1, 0), vec![big(1, MIB / 2)]).await, "half a MiB fits above the floor");
        assert_eq!(spill.used(), MIB / 2);
    }

    #[tokio::test]
    async fn past_the_budget_nothing_is_spilled() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Arc::new(Spill::with_budget(dir.path().to_path_buf(), 1000));
        assert!(spill.put((0, 0), (0..5).map(sample).collect()).await);
        let used = spill.used();
        assert!(!spill.put((1, 0), (0..50).map(sample).collect()).await);
        assert_eq!(spill.used(), used);
        assert!(spill.get((1, 0), &[0]).await.is_none());
    }
}
