//! The `parquet` layout: a row is a sample, a column a field, a row group a shard.
//!
//! Files are read with the `parquet` crate's async Arrow reader over an adapter
//! ([`StoreFile`]) whose every byte comes through Stoker's [`Store`], so Parquet shares the
//! fetch layer (retries, hedging, the latency-sized in-flight limit) and the caches. Each
//! file's footer and page index are read once at open; a batch then reads, per row group it
//! touches, only the pages holding its rows (a row selection over the offset index) of the
//! projected columns.
//!
//! Values become field bytes by one convention shared with the MDS and LitData readers:
//! binary as stored, strings as UTF-8, integers and booleans as decimal text (`1`/`0`),
//! floats as their shortest round-trip text, lists of numbers as `.npy`, and Hugging Face's
//! image and audio structs (`{bytes, path}`) as the encoded bytes in `<col>` (the path, when
//! set, in `<col>.path`). A null omits the field. The key is a `__key__` string column when
//! there is one, else `<file stem>/<row in file, 6 digits>`.

mod decoded;
mod dict;
mod pages;
mod reader;
mod thrift;
pub(crate) mod values;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use async_trait::async_trait;
use futures::{FutureExt, StreamExt, TryStreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::metadata::PageIndexPolicy;

use self::decoded::Decoded;
use self::reader::{not_parquet, selection, StoreFile};
use self::values::Column;
use super::spill::{Kept, Spill};
use super::{check_index, Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::store::{IoCounters, Object, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// The name of the column whose strings are the samples' keys.
const KEY_COLUMN: &str = "__key__";

/// Open the Parquet files `files` of `store` as one source.
pub(crate) async fn open(
    store: Store,
    mut files: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let concurrency = opts.concurrency();
    let loads = files.into_iter().map(|f| {
        let store = store.clone();
        async move {
            let page_limit = opts.decode_cap() as u64;
            let mut file =
                StoreFile { store: store.clone(), obj: store.object(&f), meta: None, page_limit, watch: None };
            let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
            let meta = ArrowReaderMetadata::load_async(&mut file, options)
                .await
                .map_err(|e| not_parquet(&store, &f.path, e))?;
            Ok::<_, Error>((file.obj, meta))
        }
    });
    let loaded: Vec<(Object, ArrowReaderMetadata)> =
        futures::stream::iter(loads).buffered(concurrency.min(16)).try_collect().await?;
    let Some((first, first_meta)) = loaded.first() else {
        return Err(Error::Empty { uri: display, reason: "no .parquet files found".into() });
    };
    let schema = first_meta.schema().clone();
    let first_shown = store.describe(first.path());
    let (columns, key_column) = values::plan(&schema, opts.column_list().as_deref(), &first_shown)?;
    let mut files = Vec::with_capacity(loaded.len());
    let mut groups = Vec::new();
    let mut starts = vec![0usize];
    for (f, meta) in loaded {
        if meta.schema().fields() != schema.fields() {
            return Err(Error::BadIndex {
                path: store.describe(f.path()),
                reason: format!(
                    "its columns differ from those of {}: one source reads files of one schema; name the files of \
                     each schema as their own source (or mix them with stoker.mix)",
                    first_shown
                ),
            });
        }
        reader::check_footer(meta.metadata(), f.size(), &store.describe(f.path()))?;
        let file = files.len();
        let mut row = 0usize;
        for (g, rg) in meta.metadata().row_groups().iter().enumerate() {
            let rows = usize::try_from(rg.num_rows()).unwrap_or(0);
            if rows == 0 {
                continue;
            }
            let pages = meta.metadata().page_index_for_row_group(g);
            let wanted = |r: &str| columns.iter().any(|k| k.name == r);
            let coarse = rg
                .columns()
                .iter()
                .enumerate()
                .filter(|(_, c)| wanted(root(c)))
                .any(|(i, _)| pages.page_locations(i).is_none_or(|p| p.len() < 8));
            // What the projected columns (and the keys) take decoded, from the footer.
            let bytes = rg
                .columns()
                .iter()
                .filter(|c| wanted(root(c)) || root(c) == KEY_COLUMN)
                .map(|c| u64::try_from(c.uncompressed_size()).unwrap_or(0))
                .sum();
            groups.push(Group { file, group: g, first_row: row, rows, coarse, bytes });
            // A footer's row counts are its own claims: summed checked, not wrapped into a
            // small count that would read as a real one.
            let next = starts.last().copied().unwrap_or(0).checked_add(rows);
            let (Some(r), Some(next)) = (row.checked_add(rows), next) else {
                return Err(Error::BadIndex {
                    path: store.describe(f.path()),
                    reason: "its row groups claim more rows than can be counted: the footer is damaged; write the \
                             file again"
                        .into(),
                });
            };
            row = r;
            starts.push(next);
        }
        let stem = file_stem(f.path());
        let mask = ProjectionMask::roots(
            meta.metadata().file_metadata().schema_descr(),
            columns.iter().map(|c| c.index).chain(key_column),
        );
        files.push(File { path: f.path().to_string(), obj: f, stem, meta, mask });
    }
    if starts.last() == Some(&0) {
        return Err(Error::Empty { uri: display, reason: "the Parquet files hold no rows".into() });
    }
    let projected: u64 = groups.iter().map(|g| g.bytes).sum();
    let budget = opts.decoded_budget();
    let fits = projected <= budget as u64 / 2;
    let loading = groups.iter().map(|_| tokio::sync::Mutex::new(())).collect();
    let queued = groups.iter().map(|_| AtomicBool::new(false)).collect();
    let dictionary_rows = groups.iter().map(|_| AtomicU64::new(0)).collect();
    // Groups decoded ahead of a sequential pass: one per core (a group's column is decoded by
    // one thread), while they and the two being read fit half the decoded budget.
    let largest = groups.iter().map(|g| g.bytes).max().unwrap_or(0).max(1);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let ahead = (budget as u64 / 2 / largest).saturating_sub(2).min(cores) as usize;
    let spill = opts.spill_dir().map(|d| Arc::new(Spill::new(d)));
    Ok(Arc::new(ParquetSource {
        inner: Arc::new(Inner {
            store,
            display,
            files,
            groups,
            starts,
            columns,
            key_column,
            concurrency,
            fits,
            loading,
            queued,
            dictionary_rows,
            ahead,
            last_group: AtomicUsize::new(usize::MAX),
            writes: Mutex::new(Vec::new()),
            max_writing: (budget / 2).max(64 << 20),
            decode_cap: opts.decode_cap(),
            decoded: Mutex::new(Decoded { kept: Kept::new(budget), spilling: Vec::new() }),
            spill,
        }),
    }))
}

/// The top-level column a column chunk belongs to.
fn root(c: &parquet::file::metadata::ColumnChunkMetaData) -> &str {
    c.column_path().parts().first().map_or("", String::as_str)
}

fn file_stem(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".parquet").unwrap_or(name).to_string()
}

/// The Parquet files of one source.
pub(crate) struct ParquetSource {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    display: String,
    files: Vec<File>,
    /// Non-empty row groups over all files, in order: the shards.
    groups: Vec<Group>,
    /// First sample of each group, and the total last.
    starts: Vec<usize>,
    columns: Vec<Column>,
    /// Root column index of `__key__`, when the files have one.
    key_column: Option<usize>,
    concurrency: usize,
    /// Whether every row group, decoded, fits the decoded-group budget.
    fits: bool,
    /// Row groups decoded whole, least recently used first.
    decoded: Mutex<Decoded>,
    /// Per group: held while it is being decoded whole.
    loading: Vec<tokio::sync::Mutex<()>>,
    /// Per group: a decode ahead of the reads is queued or running.
    queued: Vec<AtomicBool>,
    /// Per group, once a read has seen them: at most how many bytes a row decodes to from
    /// dictionaries ([`dict`]), which cuts the reader's batches (0: none seen).
    dictionary_rows: Vec<AtomicU64>,
    /// How many groups past the one being read a sequential pass decodes ahead.
    ahead: usize,
    /// The last group the latest batch read touched (`usize::MAX` before the first).
    last_group: AtomicUsize,
    /// Writes of decoded groups to the spill still running, with the bytes each holds in
    /// memory: `flush` waits for them.
    writes: Mutex<Vec<(tokio::task::JoinHandle<bool>, usize)>>,
    /// Bytes of decoded groups held by writes to the spill at most (half the decoded budget,
    /// at least 64 MiB): see [`Inner::keep_on_disk`].
    max_writing: usize,
    /// Most bytes one page may decompress to, and one decode may produce (`decoded_bytes`,
    /// at least 16 MiB).
    decode_cap: usize,
    /// Groups decoded whole, written out as samples once (in the background) so that any
    /// later read of their rows, after they leave `decoded`, costs one `pread`, not another
    /// decode: the other rows of a shuffled epoch, and every later epoch (`None` with
    /// `disk_cache=false`).
    spill: Option<Arc<Spill>>,
}

struct File {
    path: String,
    /// As the store reads it, pinned to the version it was listed at.
    obj: Object,
    stem: String,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
}

struct Group {
    file: usize,
    /// Row group number in its file.
    group: usize,
    /// Its first row's number in the file.
    first_row: usize,
    rows: usize,
    /// A projected column of it has fewer than 8 pages, or no page index says: reading a
    /// few rows decodes much of the group anyway (pyarrow cuts pages every 1,024 values, so
    /// a column of 64 KiB images is one page per 1,024 rows).
    coarse: bool,
    /// Bytes of its projected columns (and keys) decoded, from the footer.
    bytes: u64,
}

impl Inner {
    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// (group, row in group) of sample `index`.
    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let g = self.starts.partition_point(|&s| s <= index) - 1;
        Ok((g, index - self.starts[g]))
    }

    /// Row `r` of `batch`, which is row `row` of group `g`, as a sample.
    fn sample_of(&self, g: usize, batch: &RecordBatch, r: usize, row: usize) -> Result<Sample> {
        let group = &self.groups[g];
        let file = &self.files[group.file];
        let row_in_file = group.first_row + row;
        let key = match self.key_column.and_then(|_| batch.column_by_name(KEY_COLUMN)) {
            Some(c) => values::key_of(c, r).unwrap_or_else(|| format!("{}/{row_in_file:06}", file.stem)),
            None => format!("{}/{row_in_file:06}", file.stem),
        };
        let mut fields = Vec::with_capacity(self.columns.len());
        for col in &self.columns {
            let Some(array) = batch.column_by_name(&col.name) else { continue };
            col.push_fields(array, r, &mut fields).map_err(|why| Error::CorruptData {
                shard: self.store.describe(&file.path),
                key: key.clone(),
                field: col.name.clone(),
                reason: why,
            })?;
        }
        Ok(Sample { key, fields })
    }

    /// Whether to decode group `g` whole (and keep it) for a read of `rows` of its rows:
    /// when the whole data set fits the decoded-group budget (every group will be wanted
    /// again: a shuffled epoch touches each many times), when its pages are coarse (see
    /// [`Group::coarse`]), or when the read wants an eighth of the group anyway. Otherwise only the pages
    /// holding the rows are read.
    fn whole(&self, g: usize, rows: usize) -> bool {
        let group = &self.groups[g];
        // Without an offset index (pyarrow writes none unless asked) any selection reads
        // every page of the group's column chunks anyway: decode them once.
        self.fits || group.coarse || rows.saturating_mul(8) >= group.rows
    }

    /// The record batches of group `g`: the rows `rows` selects (sorted, distinct), or all
    /// in batches of `batch_rows`, fewer when the group's dictionaries ask for it: a read
    /// that finds them (before it decodes) is built again with batches the budget holds.
    async fn read_batches(&self, g: usize, rows: Option<&[usize]>, batch_rows: usize) -> Result<Vec<RecordBatch>> {
        let wanted = rows.map_or(batch_rows, <[usize]>::len).max(1);
        // Each try sees at least one more dictionary than the one before, or ends.
        loop {
            let known = self.dictionary_rows[g].load(Relaxed);
            let watch = dict::Watch::new(dict::batch_within(wanted, known, self.decode_cap), self.decode_cap);
            match self.read_batches_of(g, rows, watch.clone()).await {
                Err(_) if watch.must_rebatch() && watch.per_row() > known => {
                    self.dictionary_rows[g].fetch_max(watch.per_row(), Relaxed);
                }
                other => return other,
            }
        }
    }

    async fn read_batches_of(
        &self,
        g: usize,
        rows: Option<&[usize]>,
        watch: Arc<dict::Watch>,
    ) -> Result<Vec<RecordBatch>> {
        let group = &self.groups[g];
        let file = &self.files[group.file];
        let batch = watch.batch_rows();
        let reader = StoreFile {
            store: self.store.clone(),
            obj: file.obj.clone(),
            meta: Some(file.meta.metadata().clone()),
            page_limit: self.decode_cap as u64,
            watch: Some(watch),
        };
        let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, file.meta.clone())
            .with_row_groups(vec![group.group])
            .with_projection(file.mask.clone())
            .with_batch_size(batch);
        if let Some(rows) = rows {
            builder = builder.with_row_selection(selection(rows, group.rows));
        }
        let mut stream = builder.build().map_err(|e| not_parquet(&self.store, &file.path, e))?;
        let failed = |e: ParquetError| match e {
            // A read the store failed (remote, or the file changed) is that failure, not damage.
            ParquetError::External(inner) => match inner.downcast::<Error>() {
                Ok(e) => *e,
                Err(other) => corrupt(&self.store.describe(&file.path), group.group, &other.to_string()),
            },
            e => corrupt(&self.store.describe(&file.path), group.group, &e.to_string()),
        };
        // What the batches take decoded is only known as they come (a dictionary of one big
        // value repeated for every row decodes to rows x value): a decode past the budget
        // stops at the batch that crosses it.
        let mut out = Vec::new();
        let mut held = 0usize;
        loop {
            // The parquet crate panics on some damaged pages (a data page encoded against a
            // dictionary its chunk lacks): that is the group's damage, not a crashed read.
            let next = std::panic::AssertUnwindSafe(stream.try_next()).catch_unwind().await.map_err(|p| {
                let why = crate::error::panic_message(p);
                corrupt(&self.store.describe(&file.path), group.group, &format!("the decoder failed on it ({why})"))
            })?;
            let Some(batch) = next.map_err(failed)? else { break };
            held = held.saturating_add(batch.get_array_memory_size());
            if held > self.decode_cap {
                return Err(Error::InvalidOption {
                    message: format!(
                        "{} row group {}: its rows decode to more than the {} bytes decoded_bytes allows; raise \
                         decoded_bytes= to read it",
                        self.store.describe(&file.path),
                        group.group,
                        self.decode_cap
                    ),
                });
            }
            out.push(batch);
        }
        Ok(out)
    }

    /// Rows `rows` (sorted, distinct) of group `g`, as samples in that order: from the group
    /// decoded whole when it is kept, or when `batch` (a batch read, not one `get`) and
    /// [`Inner::whole`] says so; else only the pages holding them.
    async fn read_group(&self, g: usize, rows: &[usize], batch: bool) -> Result<Vec<Sample>> {
        let group = &self.groups[g];
        let file = &self.files[group.file];
        let shown = || self.store.describe(&file.path);
        if let Some(whole) = self.kept(g, rows) {
            return rows.iter().map(|&row| self.whole_row(g, &whole, row)).collect();
        }
        if let Some(got) = self.spilled(g, rows).await {
            return got;
        }
        // A coarse group's selected pages are most of it anyway: decode it once and keep it,
        // also for single reads (`ls`, `inspect` and map-style datasets read row by row).
        if (batch && self.whole(g, rows.len())) || group.coarse {
            return self.decoded(g, rows).await;
        }
        let batches = self.read_batches(g, Some(rows), rows.len()).await?;
        let mut out = Vec::with_capacity(rows.len());
        let mut at = 0usize;
        for batch in &batches {
            for r in 0..batch.num_rows() {
                let Some(&row) = rows.get(at) else { break };
                at += 1;
                out.push(self.sample_of(g, batch, r, row)?);
            }
        }
        if out.len() != rows.len() {
            return Err(corrupt(
                &shown(),
                group.group,
                &format!("{} rows were asked for and {} came back", rows.len(), out.len()),
            ));
        }
        Ok(out)
    }
}

fn corrupt(shown: &str, group: usize, why: &str) -> Error {
    Error::CorruptData {
        shard: shown.to_string(),
        key: format!("row group {group}"),
        field: String::new(),
        reason: format!("{why}: the file is damaged; download or write it again"),
    }
}

impl fmt::Debug for ParquetSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParquetSource")
            .field("uri", &self.inner.display)
            .field("files", &self.inner.files.len())
            .field("row_groups", &self.inner.groups.len())
            .field("samples", &self.inner.len())
            .finish()
    }
}

impl fmt::Display for ParquetSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parquet:{}", self.inner.display)
    }
}

#[async_trait]
impl SampleSource for ParquetSource {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: false,
            local: self.inner.store.local_root().is_some(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Parquet, self.inner.groups.len())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        let (g, row) = self.inner.locate(index)?;
        let mut got = self.inner.read_group(g, &[row], false).await?;
        got.pop().ok_or_else(|| Error::internal("parquet: a row read came back empty"))
    }

    /// Per row group the batch touches, one read of just its rows' pages; groups at once.
    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut by_group: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for (pos, &i) in indices.iter().enumerate() {
            let (g, row) = self.inner.locate(i)?;
            by_group.entry(g).or_default().push((row, pos));
        }
        let groups: Vec<usize> = by_group.keys().copied().collect();
        let reads = by_group.into_iter().map(|(g, mut wanted)| async move {
            wanted.sort_unstable();
            let mut rows: Vec<usize> = wanted.iter().map(|&(r, _)| r).collect();
            rows.dedup();
            let got = self.inner.read_group(g, &rows, true).await?;
            Ok::<_, Error>((rows, got, wanted))
        });
        if let (Some(first), Some(last)) = (groups.first(), groups.last()) {
            self.inner.decode_ahead(*first, *last);
        }
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut done = futures::stream::iter(reads).buffer_unordered(self.inner.concurrency.min(16));
        while let Some((rows, got, wanted)) = done.try_next().await? {
            for (row, pos) in wanted {
                let at = rows.binary_search(&row).map_err(|_| Error::internal("parquet: a planned row is missing"))?;
                out[pos] = Some(got[at].clone());
            }
        }
        out.into_iter().map(|s| s.ok_or_else(|| Error::internal("parquet: a planned row was not read"))).collect()
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.inner.locate(index).ok().map(|(g, _)| g)
    }

    fn location(&self, index: usize) -> Option<String> {
        let (g, _) = self.inner.locate(index).ok()?;
        let group = &self.inner.groups[g];
        Some(format!("{} row group {}", self.inner.files[group.file].path, group.group))
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.inner.store.counters())
    }

    fn fingerprint(&self) -> Option<u64> {
        Some(self.inner.store.fingerprint(self.inner.files.iter().map(|f| (f.obj.path(), Some(f.obj.pinned())))))
    }

    /// Also waits for decoded groups being written to the spill.
    async fn flush(&self) {
        let writes = std::mem::take(&mut *self.inner.writes.lock().unwrap_or_else(|e| e.into_inner()));
        for (w, _) in writes {
            let _ = w.await;
        }
        self.inner.store.flush().await
    }
}

/// The fuzz target `parquet_pages`: `data` is a claimed chunk total (u32), a budget (u32),
/// then page bytes.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_pages(data: &[u8]) {
    let Some((head, pages)) = data.split_at_checked(8) else { return };
    let total = u64::from(u32::from_le_bytes([head[0], head[1], head[2], head[3]]));
    let limit = u64::from(u32::from_le_bytes([head[4], head[5], head[6], head[7]]));
    let _ = pages::check(pages, total, limit, None);
}

/// The fuzz target `parquet_footer`: `data` as a whole Parquet file's metadata, then its
/// schema through the column planner.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(data: &[u8]) {
    use parquet::file::metadata::ParquetMetaDataReader;
    let true = thrift::not_too_deep(data) else { return };
    let bytes = bytes::Bytes::copy_from_slice(data);
    let Ok(meta) =
        ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Optional).parse_and_finish(&bytes)
    else {
        return;
    };
    let Ok(arrow) = ArrowReaderMetadata::try_new(Arc::new(meta), ArrowReaderOptions::new()) else { return };
    let _ = values::plan(arrow.schema(), None, "fuzz.parquet");
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::RowSelector;

    #[test]
    fn selections_skip_between_runs() {
        let s = selection(&[1, 2, 3, 7, 9], 12);
        let v: Vec<RowSelector> = s.into();
        assert_eq!(
            v,
            vec![
                RowSelector::skip(1),
                RowSelector::select(3),
                RowSelector::skip(3),
                RowSelector::select(1),
                RowSelector::skip(1),
                RowSelector::select(1),
                RowSelector::skip(2)
            ]
        );
        let v: Vec<RowSelector> = selection(&[0], 1).into();
        assert_eq!(v, vec![RowSelector::select(1)]);
    }
}
