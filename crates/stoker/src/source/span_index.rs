//! Span indexes kept on disk: where each line of a JSONL file, or each record of a TFRecord
//! file, starts and ends, so that a file is walked once, not at every open, and its size
//! costs no memory. A sample's span is found with one 16-byte `pread` of the index (served from
//! the page cache once warm, and shared there by every rank on the node), where a table in
//! memory would hold 16 bytes per sample in every rank's process: 8 GB per rank for a corpus
//! of 500 million documents.
//!
//! The index lies next to a local file (`a.jsonl.stoker-lines`, `a.tfrecord.stoker-records`)
//! unless `write_sidecar=false` or the directory cannot be written, else in the index cache dir
//! under a name hashed from the file's full location (always, for remote files: a dataset's
//! bucket is often read-only, and the index has to be a local file to be read by `pread`). Its
//! header records the version of the file it describes (entity tag or modification time, and
//! size): a changed file is walked again. An index whose entries fail their checksum, do not
//! increase, or point past the data is walked again too, never trusted. Where nothing can be
//! written, the index goes to an unnamed file that lasts as long as the process.

use std::fs::File;
use std::hash::Hasher;
use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::store::{ObjectInfo, Store};
use crate::uri::SourceOptions;

/// What an index holds the spans of: its file's magic and name ending.
#[derive(Debug)]
pub(crate) struct Kind {
    magic: [u8; 8],
    /// The ending of an index file's name.
    pub(crate) suffix: &'static str,
}

/// The lines of a JSONL file (each without its newline).
pub(crate) const JSONL_LINES: Kind = Kind { magic: *b"STKLINE1", suffix: ".stoker-lines" };
/// The records of a TFRecord file (each record's data, without its length and checksums).
pub(crate) const TFRECORD_RECORDS: Kind = Kind { magic: *b"STKRECS1", suffix: ".stoker-records" };
/// Magic, version digest, data length, line count, and a checksum over those three words and
/// the entries ([`seal`]): five words.
const HEADER: u64 = 40;
/// A span's start and end, two little-endian `u64`s.
const ENTRY: u64 = 16;

/// The checksum an index records: over its header's words and the XXH3 of its entries, so a
/// flipped bit in the data length or count is caught as well as one in an entry.
fn seal(version: u64, data_len: u64, count: u64, entries: u64) -> u64 {
    let mut words = [0u8; 32];
    for (i, w) in [version, data_len, count, entries].iter().enumerate() {
        words[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    twox_hash::XxHash3_64::oneshot(&words)
}

/// Whether `path` names an index of either kind (never a dataset's own file).
pub(crate) fn is_index(path: &str) -> bool {
    [&JSONL_LINES, &TFRECORD_RECORDS].iter().any(|k| path.ends_with(k.suffix))
}

/// The digest of a file's version an index is checked against.
pub(crate) fn version(info: &ObjectInfo) -> u64 {
    let key = crate::store::version_key(info.e_tag.as_deref(), info.modified_us, info.size);
    twox_hash::XxHash3_64::oneshot(key.as_bytes())
}

/// Where the index of one file may lie, in the order tried.
pub(crate) struct Places {
    kind: &'static Kind,
    /// Next to the file: a local store, sidecars allowed.
    pub(crate) beside: Option<PathBuf>,
    /// In the index cache dir, named by a hash of the file's full location.
    pub(crate) cached: PathBuf,
}

impl Places {
    /// The places of the `kind` index of `path` in `store`.
    pub(crate) fn of(kind: &'static Kind, store: &Store, path: &str, opts: &SourceOptions) -> Self {
        let suffix = kind.suffix;
        let beside = store
            .local_root()
            .filter(|_| opts.write_sidecar != Some(false))
            .map(|root| root.join(format!("{path}{suffix}")));
        let base = path.rsplit('/').next().unwrap_or(path);
        let hash = twox_hash::XxHash3_64::oneshot(store.describe(path).as_bytes());
        Places { kind, beside, cached: opts.index_cache_dir().join(format!("{hash:016x}-{base}{suffix}")) }
    }

    fn all(&self) -> impl Iterator<Item = &PathBuf> {
        self.beside.iter().chain(std::iter::once(&self.cached))
    }

    /// The first whole index of version `version` found.
    pub(crate) fn find(&self, version: u64) -> Option<SpanIndex> {
        self.all().find_map(|p| SpanIndex::check(File::open(p).ok()?, self.kind, version).ok())
    }
}

/// The start and end of every span of one file, read from its index file.
#[derive(Debug)]
pub(crate) struct SpanIndex {
    kind: &'static Kind,
    file: File,
    count: u64,
    data_len: u64,
}

fn bad(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i * 8..i * 8 + 8]);
    u64::from_le_bytes(w)
}

impl SpanIndex {
    /// Check `file` whole: its header, its size, the checksum over its entries, and that the
    /// entries increase and lie inside the data. One sequential read of 16 bytes a line.
    fn check(file: File, kind: &'static Kind, version: u64) -> io::Result<Self> {
        let mut head = [0u8; HEADER as usize];
        file.read_exact_at(&mut head, 0)?;
        if head[..8] != kind.magic || word(&head, 1) != version {
            return Err(bad("another format or another version of the file"));
        }
        let (data_len, count, sum) = (word(&head, 2), word(&head, 3), word(&head, 4));
        let size = file.metadata()?.len();
        if count.checked_mul(ENTRY).and_then(|n| n.checked_add(HEADER)) != Some(size) {
            return Err(bad("its size disagrees with its line count"));
        }
        let mut hasher = twox_hash::XxHash3_64::default();
        let mut buf = vec![0u8; (1 << 20) as usize];
        let (mut at, mut next) = (HEADER, 0u64);
        while at < size {
            let n = (size - at).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], at)?;
            hasher.write(&buf[..n]);
            for e in buf[..n].chunks_exact(ENTRY as usize) {
                let (start, end) = (word(e, 0), word(e, 1));
                if start < next || end < start || end > data_len {
                    return Err(bad("its entries do not increase inside the data"));
                }
                next = end.saturating_add(1);
            }
            at += n as u64;
        }
        if seal(version, data_len, count, hasher.finish()) != sum {
            return Err(bad("its checksum does not match"));
        }
        Ok(SpanIndex { kind, file, count, data_len })
    }

    /// The ending of this kind of index file's name.
    pub(crate) fn suffix(&self) -> &'static str {
        self.kind.suffix
    }

    /// How many spans the file has.
    pub(crate) fn len(&self) -> u64 {
        self.count
    }

    /// The length of the (decompressed) data the spans lie in.
    pub(crate) fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Where spans `which` (each below [`SpanIndex::len`]) lie in the data.
    pub(crate) fn spans(&self, which: &[usize]) -> io::Result<Vec<Range<u64>>> {
        which
            .iter()
            .map(|&l| {
                let mut e = [0u8; ENTRY as usize];
                self.file.read_exact_at(&mut e, HEADER + l as u64 * ENTRY)?;
                let (start, end) = (word(&e, 0), word(&e, 1));
                // Checked whole at open; a file changed in place since then is not believed.
                if end < start || end > self.data_len {
                    return Err(bad("the index changed on disk while in use"));
                }
                Ok(start..end)
            })
            .collect()
    }
}

/// Writes an index as the walk finds spans, so that building one holds no table in memory.
pub(crate) struct Writer {
    kind: &'static Kind,
    out: BufWriter<File>,
    hasher: twox_hash::XxHash3_64,
    count: u64,
    /// Where it is written, and where it goes once whole (none for an unnamed file).
    paths: Option<(Temporary, PathBuf)>,
}

impl Writer {
    /// A writer to the first of `places` whose directory takes a new file, else to an
    /// unnamed file in `fallback` (which only this process reads).
    pub(crate) fn create(places: &Places, fallback: &Path) -> io::Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let mut found = None;
        for place in places.all() {
            let Some(dir) = place.parent() else { continue };
            // The cache dir is made on demand; a data directory is never created.
            if place == &places.cached && std::fs::create_dir_all(dir).is_err() {
                continue;
            }
            let name = place.file_name().and_then(|n| n.to_str()).unwrap_or("index");
            let tmp = dir.join(format!(".{name}.{}-{}.tmp", std::process::id(), N.fetch_add(1, Relaxed)));
            if let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&tmp) {
                found = Some((f, Some((Temporary(Some(tmp)), place.clone()))));
                break;
            }
        }
        let (file, paths) = match found {
            Some(f) => f,
            None => {
                std::fs::create_dir_all(fallback)?;
                (crate::source::spill::unnamed_file(fallback)?, None)
            }
        };
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&[0u8; HEADER as usize])?;
        Ok(Writer { kind: places.kind, out, hasher: twox_hash::XxHash3_64::default(), count: 0, paths })
    }

    /// The next span, `start..end`.
    pub(crate) fn push(&mut self, start: u64, end: u64) -> io::Result<()> {
        let mut e = [0u8; ENTRY as usize];
        e[..8].copy_from_slice(&start.to_le_bytes());
        e[8..].copy_from_slice(&end.to_le_bytes());
        self.hasher.write(&e);
        self.count += 1;
        self.out.write_all(&e)
    }

    /// Write the header and put the index in its place; what it read back is what it serves.
    pub(crate) fn finish(self, version: u64, data_len: u64) -> io::Result<SpanIndex> {
        let Writer { kind, out, hasher, count, paths } = self;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        let mut head = Vec::with_capacity(HEADER as usize);
        head.extend_from_slice(&kind.magic);
        for w in [version, data_len, count, seal(version, data_len, count, hasher.finish())] {
            head.extend_from_slice(&w.to_le_bytes());
        }
        file.write_all_at(&head, 0)?;
        if let Some((mut tmp, place)) = paths {
            // Renamed whole into place, so a reader never sees half an index; the file open
            // here stays valid whatever happens to the name.
            if tmp.0.as_ref().is_some_and(|t| std::fs::rename(t, &place).is_ok()) {
                tmp.0 = None;
            }
        }
        SpanIndex::check(file, kind, version)
    }
}

/// A temporary file's name, removed unless it was moved into place: a walk that failed
/// leaves no half-written file behind.
struct Temporary(Option<PathBuf>);

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &Path, version: u64) -> Option<SpanIndex> {
        SpanIndex::check(File::open(path).ok()?, &JSONL_LINES, version).ok()
    }

    fn build(dir: &Path, lines: &[(u64, u64)], data_len: u64) -> PathBuf {
        let place = dir.join("a.jsonl.stoker-lines");
        let places = Places { kind: &JSONL_LINES, beside: Some(place.clone()), cached: dir.join("unused").join("x") };
        let mut w = Writer::create(&places, dir).unwrap();
        for &(s, e) in lines {
            w.push(s, e).unwrap();
        }
        let idx = w.finish(7, data_len).unwrap();
        assert_eq!((idx.len(), idx.data_len()), (lines.len() as u64, data_len));
        place
    }

    #[test]
    fn an_index_reads_back_and_a_stale_or_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let place = build(dir.path(), &[(0, 2), (7, 14), (15, 17)], 17);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.jsonl.stoker-lines")], "no temporary left");
        let idx = open(&place, 7).unwrap();
        assert_eq!(idx.spans(&[2, 0]).unwrap(), vec![15..17, 0..2]);
        assert!(open(&place, 8).is_none(), "another version of the file");
        let tfrecord = SpanIndex::check(File::open(&place).unwrap(), &TFRECORD_RECORDS, 7);
        assert!(tfrecord.is_err(), "another kind of index");
        let good = std::fs::read(&place).unwrap();
        for at in [3, 20, 41, 60] {
            let mut b = good.clone();
            b[at] ^= 1;
            std::fs::write(&place, &b).unwrap();
            assert!(open(&place, 7).is_none(), "a flipped bit at {at} is caught");
        }
        std::fs::write(&place, &good[..good.len() - 16]).unwrap();
        assert!(open(&place, 7).is_none(), "a truncated index");
    }

    /// An index file as a writer with no checks would leave it, checksum right.
    fn raw(path: &Path, lines: &[(u64, u64)], data_len: u64) {
        let entries: Vec<u8> = lines.iter().flat_map(|&(s, e)| [s.to_le_bytes(), e.to_le_bytes()]).flatten().collect();
        let count = lines.len() as u64;
        let mut b = JSONL_LINES.magic.to_vec();
        let sum = seal(7, data_len, count, twox_hash::XxHash3_64::oneshot(&entries));
        for w in [7, data_len, count, sum] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&entries);
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn entries_that_go_back_or_past_the_data_are_refused_even_with_a_right_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        raw(&path, &[(0, 4), (5, 9)], 20);
        assert!(open(&path, 7).is_some(), "the raw writer writes what a walk writes");
        for bad in [&[(5, 9), (3, 4)][..], &[(0, 30)], &[(6, 5)], &[(0, 4), (4, 6)]] {
            raw(&path, bad, 20);
            assert!(open(&path, 7).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn with_no_writable_place_the_index_goes_to_an_unnamed_file() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the cache dir would be made, and a data directory that does not exist.
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let cached = dir.path().join("file").join("index").join("a.stoker-lines");
        let beside = dir.path().join("missing-data-dir").join("a.stoker-lines");
        let places = Places { kind: &JSONL_LINES, beside: Some(beside.clone()), cached: cached.clone() };
        let mut w = Writer::create(&places, dir.path()).unwrap();
        w.push(0, 3).unwrap();
        let idx = w.finish(1, 3).unwrap();
        assert_eq!(idx.spans(&[0]).unwrap(), vec![0..3]);
        assert!(!beside.exists() && !cached.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "only the file made above");
    }
}
