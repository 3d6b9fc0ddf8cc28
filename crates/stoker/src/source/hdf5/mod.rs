//! HDF5 files (`.h5`, `.hdf5`), as `h5py` and the HDF5 library write them: the datasets of a
//! file that share a first dimension N give N samples, one field per dataset.
//!
//! Files are read with the pure-Rust `hdf5-reader` over an adapter ([`StoreStorage`]) whose
//! every byte comes through Stoker's [`Store`], so HDF5 shares the fetch layer (local files,
//! remote ranged reads with retries and hedging) and the caches; nothing needs the HDF5 C
//! library. Each file's groups are walked once at open. Chunked datasets are read by chunk
//! (gzip, shuffle, Fletcher-32, szip, n-bit, scale-offset and LZF), a chunk decoded once and
//! kept within the source's decoded budget ([`crate::SourceOptions::decoded_bytes`], split
//! between the files), so a batch of neighbouring rows decodes each chunk once; a compressed
//! chunk's rows, once decoded, are spilled to disk ([`spilled`]), so a shuffled epoch decodes
//! each chunk once.
//!
//! Which datasets are samples: those whose first dimension is the one most datasets share (the
//! larger N on a tie), or exactly those `columns=` names; a scalar or a table of another
//! length (class names, say) is left out. A field is named by the dataset's path below the
//! root, groups joined by `.` (`meta/ids` is `meta.ids`); its bytes follow the convention of
//! the Parquet layout ([`column::Kind`]): one number per row as text, an array per row as
//! `.npy`, strings and variable-length bytes as they are. Every file of a source must hold the
//! same datasets. A file is a shard; keys are `<file without suffix>/<row, 9 digits>`, or the
//! strings of a `__key__` dataset when there is one (bytes that are not UTF-8 as `\xNN` and a
//! backslash as `\\`, as LMDB's keys: [`crate::sample::escape_key`]). Only the file itself
//! is read: a dataset kept in other files (external storage) is refused at open.
//!
//! Damage: a file that is not HDF5, or whose headers lie (sizes past the file, loops, chunks
//! larger than the decode cap), is an error at open naming the file; a chunk that does not
//! decompress is an error naming the file, sample and dataset (skipped and counted under the
//! Loader's skip policy). The reader's own limits bound what a header can make it allocate.

mod column;
mod lzf;
mod raw;
mod spilled;
mod storage;

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use hdf5_reader::{Dataset, Hdf5File, Storage};

use self::column::{Column, Kind};
use self::raw::{direct, refuse_external, refuse_inconsistent, refuse_past_max, Direct};
use self::storage::{bad_file, guarded, options, StoreStorage};
use super::spill::Spill;
use super::{Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::{Field, Sample};
use crate::store::{IoCounters, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// File name endings this layout reads.
pub(crate) const SUFFIXES: [&str; 2] = [".h5", ".hdf5"];

/// The name of the dataset whose strings are the samples' keys.
const KEY_DATASET: &str = "__key__";
/// A file's walk stops at this many groups deep, at this many datasets, and at this many group
/// visits: past them is a hostile or generated file, not a dataset of samples. (Hard links may
/// reach one group by many paths: groups each linking the next four ways make a 19 KB file
/// whose walk, bounded by depth alone, took hours.)
const MAX_DEPTH: usize = 16;
const MAX_DATASETS: usize = 4096;
/// How the walk's errors for a file past its limits (not a damaged one) begin.
const LIMIT: &str = "limit: ";
const MAX_GROUPS: usize = 4096;
/// The most rows a byte of a file may stand for (deflate's best compression ratio).
const MAX_RATIO: u64 = 1032;
/// Most rows one read of a dataset takes: a run of neighbouring rows in a batch is read in one
/// call (each chunk decoded once), in pieces of this many.
const MAX_RUN: u64 = 1024;

/// One file: its datasets in column order, and its row count.
struct File {
    path: String,
    stem: String,
    storage: Arc<StoreStorage>,
    sets: Vec<Dataset>,
    /// Per column, where its rows lie when they are read straight from the file (see
    /// [`Direct`]).
    direct: Vec<Option<Direct>>,
    key: Option<Dataset>,
    rows: usize,
    /// Units of rows spilled whole once decoded, when a dataset is compressed ([`spilled`]).
    units: Option<spilled::Units>,
}

/// HDF5 files, rows in file order.
pub(crate) struct Hdf5Source(Arc<Inner>);

/// What the reads share with their blocking threads.
struct Inner {
    store: Store,
    files: Vec<File>,
    /// First sample of each file, and the total after the last.
    starts: Vec<usize>,
    columns: Vec<Column>,
    display: String,
    /// Where decoded units go (none with `disk_cache=false`).
    spill: Option<Arc<Spill>>,
}

impl fmt::Debug for Hdf5Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hdf5Source").field("source", &self.0.display).field("files", &self.0.files.len()).finish()
    }
}

impl fmt::Display for Hdf5Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.display)
    }
}

/// A dataset found by the walk.
struct Found {
    path: String,
    set: Dataset,
}

/// Open the HDF5 files `listing` (in path order).
pub(crate) async fn open(
    store: Store,
    mut listing: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    listing.sort_by(|a, b| a.path.cmp(&b.path));
    if listing.is_empty() {
        return Err(Error::Empty { uri: display, reason: "no .h5 or .hdf5 files found".into() });
    }
    let budget = (opts.decoded_budget() / listing.len()).max(1 << 20);
    let cap = opts.decode_cap();
    let wanted: Option<Vec<String>> = opts.column_list().map(|c| c.iter().map(|s| s.to_string()).collect());
    let mut files = Vec::with_capacity(listing.len());
    let mut columns: Option<Vec<Column>> = None;
    for info in listing {
        let storage =
            Arc::new(StoreStorage { reader: store.range_reader(&store.object(&info))?, failure: Mutex::new(None) });
        let shown = store.describe(&info.path);
        let (s, w, first) = (storage.clone(), wanted.clone(), columns.clone());
        let file = tokio::task::spawn_blocking(move || {
            guarded(&shown, || {
                let dyn_storage: Arc<dyn Storage> = s.clone();
                let h5 = Hdf5File::from_storage_with_options(dyn_storage, options(budget, cap))
                    .map_err(|e| bad_file(&s, &shown, &e))?;
                let mut found = Vec::new();
                let root = h5.root_group().map_err(|e| bad_file(&s, &shown, &e))?;
                walk(&root, "", 0, &mut found, &mut 0).map_err(|e| match &e {
                    // A file past the walk's limits is not damaged: say which limit.
                    hdf5_reader::error::Error::InvalidData(m) if m.starts_with(LIMIT) => Error::NotSupported {
                        what: format!(
                            "{shown}: {}: more than this reader walks; split the file, or write the datasets to \
                             read in fewer groups",
                            &m[LIMIT.len()..]
                        ),
                    },
                    _ => bad_file(&s, &shown, &e),
                })?;
                let key = found.iter().position(|f| f.path == KEY_DATASET).map(|k| found.remove(k).set);
                let cols = match first {
                    Some(cols) => cols,
                    None => plan(&found, w.as_deref(), &shown)?,
                };
                place(&h5, info.path.clone(), s.clone(), found, key, cols, &shown)
            })
        })
        .await
        .map_err(Error::task)??;
        columns.get_or_insert(file.1);
        files.push(file.0);
    }
    let columns = columns.unwrap_or_default();
    let mut starts = vec![0usize];
    for f in &files {
        starts.push(starts.last().copied().unwrap_or(0) + f.rows);
    }
    if starts.last() == Some(&0) {
        return Err(Error::Empty { uri: display, reason: "the HDF5 files hold no rows".into() });
    }
    let spill = opts.spill_dir().map(|d| Arc::new(Spill::new(d)));
    Ok(Arc::new(Hdf5Source(Arc::new(Inner { store, files, starts, columns, display, spill }))))
}

/// Collect the datasets below `group` (at path `prefix`), depth first, names sorted; `visits`
/// counts the groups visited.
fn walk(
    group: &hdf5_reader::group::Group,
    prefix: &str,
    depth: usize,
    out: &mut Vec<Found>,
    visits: &mut usize,
) -> hdf5_reader::error::Result<()> {
    let (mut groups, mut sets) = group.members()?;
    sets.sort_by(|a, b| a.name().cmp(b.name()));
    groups.sort_by(|a, b| a.name().cmp(b.name()));
    for set in sets {
        if out.len() >= MAX_DATASETS {
            return Err(hdf5_reader::error::Error::InvalidData(format!("{LIMIT}more than {MAX_DATASETS} datasets")));
        }
        out.push(Found { path: format!("{prefix}{}", leaf(set.name())), set });
    }
    for g in groups {
        if depth + 1 >= MAX_DEPTH {
            return Err(hdf5_reader::error::Error::InvalidData(format!(
                "{LIMIT}groups nested more than {MAX_DEPTH} deep"
            )));
        }
        *visits += 1;
        if *visits > MAX_GROUPS {
            return Err(hdf5_reader::error::Error::InvalidData(format!(
                "{LIMIT}more than {MAX_GROUPS} groups (counting each path to a group linked from several places)"
            )));
        }
        walk(&g, &format!("{prefix}{}/", leaf(g.name())), depth + 1, out, visits)?;
    }
    Ok(())
}

/// The last part of an object's name.
fn leaf(name: &str) -> &str {
    name.rsplit('/').find(|p| !p.is_empty()).unwrap_or(name)
}

/// The columns of the first file: the datasets named by `wanted`, or those sharing the most
/// common first dimension.
fn plan(found: &[Found], wanted: Option<&[String]>, shown: &str) -> Result<Vec<Column>> {
    let bad = |reason: String| Error::BadIndex { path: shown.to_string(), reason };
    let rows_of = |f: &Found| f.set.shape().first().copied();
    let chosen: Vec<&Found> = match wanted {
        Some(names) => {
            let mut out = Vec::new();
            for n in names {
                // A dataset's own path first: `a.b` names a dataset so named before `a/b`.
                let exact = found.iter().find(|f| f.path == *n);
                let f = exact.or_else(|| found.iter().find(|f| f.path.replace('/', ".") == *n)).ok_or_else(|| {
                    bad(format!(
                        "columns= names `{n}`, which is not a dataset here (a link to another file is not \
                         followed: only the file itself is read); its datasets are {}",
                        found.iter().map(|f| f.path.as_str()).collect::<Vec<_>>().join(", ")
                    ))
                })?;
                out.push(f);
            }
            out
        }
        None => {
            // A damaged dimension would move its dataset out of the chosen ones without a
            // word: every candidate is checked.
            found.iter().try_for_each(|f| refuse_past_max(&f.set, &f.path, shown))?;
            let mut counts: Vec<(u64, usize)> = Vec::new();
            for n in found.iter().filter_map(rows_of) {
                match counts.iter_mut().find(|(m, _)| *m == n) {
                    Some(c) => c.1 += 1,
                    None => counts.push((n, 1)),
                }
            }
            let Some(&(n, _)) = counts.iter().max_by_key(|&&(n, c)| (c, n)) else {
                return Err(bad("it holds no dataset with a first dimension (no per-sample arrays)".into()));
            };
            found.iter().filter(|f| rows_of(f) == Some(n)).collect()
        }
    };
    chosen.iter().try_for_each(|f| refuse_past_max(&f.set, &f.path, shown))?;
    let n = chosen.first().and_then(|f| rows_of(f));
    let mut columns = Vec::with_capacity(chosen.len());
    for f in chosen {
        if rows_of(f).is_none() || rows_of(f) != n {
            return Err(bad(format!(
                "dataset `{}` has shape {:?}, where the others have {} rows: the datasets of a sample share their first \
                 dimension",
                f.path,
                f.set.shape(),
                n.unwrap_or(0)
            )));
        }
        let item: Vec<usize> = f.set.shape()[1..].iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
        let kind = Kind::of(f.set.dtype(), &item).map_err(|why| {
            bad(format!(
                "dataset `{}` holds {why}, which Stoker does not hand over as fields; leave it out by naming the others \
                 with columns=",
                f.path
            ))
        })?;
        let name: Arc<str> = f.path.replace('/', ".").into();
        // `meta/ids` and a dataset named `meta.ids` are one field name: a reader would see
        // either value.
        if let Some(other) = columns.iter().find(|c: &&Column| c.name == name) {
            return Err(bad(format!(
                "datasets `{}` and `{}` are both field `{name}` (groups are joined by `.`); name one with columns=",
                other.path, f.path
            )));
        }
        columns.push(Column { name, path: f.path.clone(), kind, item });
    }
    Ok(columns)
}

/// A file's datasets in the order of `columns`, checked against them.
fn place(
    h5: &Hdf5File,
    path: String,
    storage: Arc<StoreStorage>,
    mut found: Vec<Found>,
    key: Option<Dataset>,
    columns: Vec<Column>,
    shown: &str,
) -> Result<(File, Vec<Column>)> {
    let bad = |reason: String| Error::BadIndex { path: shown.to_string(), reason };
    let mut sets = Vec::with_capacity(columns.len());
    let mut rows = None;
    for c in &columns {
        let k = found.iter().position(|f| f.path == c.path).ok_or_else(|| {
            bad(format!(
                "it has no dataset `{}`, which the first file has: one source reads files of the same datasets",
                c.path
            ))
        })?;
        let f = found.swap_remove(k);
        let shape = f.set.shape();
        let item: Vec<usize> = shape.get(1..).unwrap_or(&[]).iter().map(|&d| d as usize).collect();
        if shape.is_empty() || item != c.item || Kind::of(f.set.dtype(), &item).as_ref() != Ok(&c.kind) {
            return Err(bad(format!("dataset `{}` differs in shape or type from the first file's", c.path)));
        }
        if rows.is_some_and(|r| r != shape[0]) {
            return Err(bad(format!(
                "dataset `{}` has {} rows where the others have {}",
                c.path,
                shape[0],
                rows.unwrap_or(0)
            )));
        }
        rows = Some(shape[0]);
        refuse_external(h5, &f.set, &c.path, shown)?;
        refuse_inconsistent(h5, &f.set, &c.path, shown)?;
        sets.push(f.set);
    }
    let rows = usize::try_from(rows.unwrap_or(0)).map_err(|_| bad("more rows than this machine can count".into()))?;
    // Every row holds at least a byte of some dataset, stored at worst at deflate's best ratio
    // (1032:1): a header claiming more rows than that is lying, and the samples' order alone
    // (eight bytes a row) would take more memory than the file could justify.
    let size = storage.reader.object().size();
    if rows as u64 > size.saturating_mul(MAX_RATIO) {
        return Err(bad(format!("its datasets claim {rows} rows, more than its {size} bytes can hold")));
    }
    // So must each dataset's bytes: one never written (its chunks unallocated, every value the
    // fill value) is a few bytes of header however large its shape, and reading it would make
    // gigabytes of fill values from a file of kilobytes.
    for c in &columns {
        let bytes = c.stored_row_bytes().saturating_mul(rows as u64);
        if bytes > size.saturating_mul(MAX_RATIO) {
            return Err(bad(format!(
                "dataset `{}` claims {bytes} bytes of rows, more than the file's {size} bytes can hold at deflate's \
                 best ratio (a dataset never written, all fill values?); leave it out by naming the others with \
                 columns=",
                c.path
            )));
        }
    }
    if let Some(k) = &key {
        refuse_external(h5, k, KEY_DATASET, shown)?;
        refuse_inconsistent(h5, k, KEY_DATASET, shown)?;
        if k.shape().first().map(|&n| n as usize) != Some(rows) {
            return Err(bad(format!("its {KEY_DATASET} dataset does not have one key per row ({rows} rows)")));
        }
    }
    let direct = columns.iter().zip(&sets).map(|(c, set)| direct(h5, set, c, rows as u64)).collect();
    let units = spilled::units(h5, &sets, &columns);
    let stem = path.rsplit('/').next().unwrap_or(&path);
    let stem = SUFFIXES.iter().find_map(|s| stem.strip_suffix(s)).unwrap_or(stem).to_string();
    Ok((File { path, stem, storage, sets, direct, key, rows, units }, columns))
}

impl Inner {
    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The file holding sample `i`, and its row there.
    fn locate(&self, i: usize) -> Option<(usize, u64)> {
        if i >= self.len() {
            return None;
        }
        let f = self.starts.partition_point(|&s| s <= i).checked_sub(1)?;
        Some((f, (i - self.starts[f]) as u64))
    }

    /// Rows `rows` (ascending, distinct) of file `f`, read from a blocking thread.
    fn read_rows(&self, f: usize, rows: &[u64]) -> Result<Vec<Sample>> {
        let file = &self.files[f];
        let shown = self.store.describe(&file.path);
        // Columns read straight from the file: every row at once, one store read (merged
        // where rows are near), so a shuffled batch costs what the same bytes in a tar would.
        let mut direct: Vec<Option<std::vec::IntoIter<Bytes>>> = Vec::with_capacity(self.columns.len());
        for (c, d) in self.columns.iter().zip(&file.direct) {
            direct.push(match d {
                Some(d) => {
                    let spans: Vec<_> = rows.iter().map(|&r| d.at + r * d.row..d.at + (r + 1) * d.row).collect();
                    let got = file.storage.reader.read_many(&spans)?;
                    Some(got.iter().map(|v| c.number(v)).collect::<Vec<_>>().into_iter())
                }
                None => None,
            });
        }
        let mut out: Vec<Sample> = Vec::with_capacity(rows.len());
        let mut at = 0;
        while at < rows.len() {
            let first = rows[at];
            let mut end = at + 1;
            while end < rows.len() && rows[end] == rows[end - 1] + 1 && rows[end] - first < MAX_RUN {
                end += 1;
            }
            let count = rows[end - 1] - first + 1;
            let keys = self.keys(file, first, count).map_err(|e| self.damaged(file, &shown, first, KEY_DATASET, &e))?;
            let mut samples: Vec<Sample> = keys.into_iter().map(|key| Sample { key, fields: Vec::new() }).collect();
            for ((c, set), direct) in self.columns.iter().zip(&file.sets).zip(&mut direct) {
                let values = match direct {
                    Some(d) => d.by_ref().take(count as usize).collect(),
                    None => c.read(set, first, count).map_err(|e| self.damaged(file, &shown, first, &c.name, &e))?,
                };
                for (s, data) in samples.iter_mut().zip(values) {
                    s.fields.push(Field { name: c.name.clone(), data });
                }
            }
            for s in &mut samples {
                s.fields.sort_by(|a, b| a.name.cmp(&b.name));
            }
            out.extend(samples);
            at = end;
        }
        Ok(out)
    }

    /// The keys of rows `first..first + count` of `file`.
    fn keys(&self, file: &File, first: u64, count: u64) -> hdf5_reader::error::Result<Vec<String>> {
        let Some(k) = &file.key else {
            return Ok((first..first + count).map(|r| format!("{}/{r:09}", file.stem)).collect());
        };
        let c = Column { name: KEY_DATASET.into(), path: KEY_DATASET.into(), kind: key_kind(k)?, item: Vec::new() };
        // Losslessly: keys of bytes that are not UTF-8 (`S` strings) stay distinct, as LMDB's do.
        Ok(c.read(k, first, count)?.iter().map(|b| crate::sample::escape_key(b).into_owned()).collect())
    }

    /// A read of rows from `first` of `column` failed.
    fn damaged(&self, file: &File, shown: &str, first: u64, column: &str, e: &hdf5_reader::error::Error) -> Error {
        if let Some(failed) = file.storage.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return failed;
        }
        if let hdf5_reader::error::Error::ResourceLimit(what) = e {
            // The reader's caps are `decoded_bytes`: a chunk or read larger than it allows is
            // not damage.
            return Error::InvalidOption {
                message: format!(
                    "{shown}: dataset `{column}` from row {first}: {what} (decoded_bytes); raise decoded_bytes= to \
                     read it"
                ),
            };
        }
        Error::CorruptData {
            shard: shown.to_string(),
            key: format!("{}/{first:09}", file.stem),
            field: column.to_string(),
            reason: format!("dataset `{column}` from row {first} does not read ({e}): the file is damaged there"),
        }
    }
}

/// How a `__key__` dataset's values read: any strings or numbers.
fn key_kind(k: &Dataset) -> hdf5_reader::error::Result<Kind> {
    Kind::of(k.dtype(), &[]).map_err(|why| hdf5_reader::error::Error::InvalidData(format!("keys of {why}")))
}

/// The fuzz target's body (see [`crate::fuzzing::hdf5`]): any bytes open, walk, plan and read
/// (the first and last rows of every dataset) or are refused, without a panic, within the
/// limits every file opens with.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(data: &[u8]) {
    let Ok(h5) = Hdf5File::from_bytes_with_options(data, options(4 << 20, 16 << 20)) else { return };
    let mut found = Vec::new();
    let Ok(root) = h5.root_group() else { return };
    if walk(&root, "", 0, &mut found, &mut 0).is_err() {
        return;
    }
    let Ok(columns) = plan(&found, None, "fuzz") else { return };
    for c in &columns {
        let Some(f) = found.iter().find(|f| f.path == c.path) else { continue };
        let n = f.set.shape().first().copied().unwrap_or(0).min(64);
        if let Ok(rows) = c.read(&f.set, 0, n) {
            assert_eq!(rows.len() as u64, n, "one value per row");
        }
    }
}

#[async_trait]
impl SampleSource for Hdf5Source {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: false,
            local: !self.0.store.is_remote(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Hdf5, self.0.files.len())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        self.get_many(&[index]).await?.pop().ok_or_else(|| Error::internal("no sample for a checked index"))
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut by_file: Vec<(usize, Vec<u64>)> = Vec::new();
        for &i in indices {
            let (f, r) = self.0.locate(i).ok_or(Error::IndexOutOfRange { index: i, len: self.len() })?;
            match by_file.iter_mut().find(|(g, _)| *g == f) {
                Some((_, rows)) => rows.push(r),
                None => by_file.push((f, vec![r])),
            }
        }
        for (_, rows) in &mut by_file {
            rows.sort_unstable();
            rows.dedup();
        }
        let reads = by_file.into_iter().map(|(f, rows)| async move {
            let samples = self.0.read_file(f, rows.clone()).await?;
            Ok::<_, Error>((f, rows, samples))
        });
        let got = futures::future::try_join_all(reads).await?;
        indices
            .iter()
            .map(|&i| {
                let (f, r) = self.0.locate(i).ok_or_else(|| Error::internal("a located index lost"))?;
                let (_, rows, samples) =
                    got.iter().find(|(g, _, _)| *g == f).ok_or_else(|| Error::internal("a file's rows not read"))?;
                let k = rows.binary_search(&r).map_err(|_| Error::internal("a row not read"))?;
                Ok(samples[k].clone())
            })
            .collect()
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.0.locate(index).map(|(f, _)| f)
    }

    fn location(&self, index: usize) -> Option<String> {
        self.0.locate(index).map(|(f, _)| format!("file {}", self.0.store.describe(&self.0.files[f].path)))
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.0.store.counters())
    }
}
