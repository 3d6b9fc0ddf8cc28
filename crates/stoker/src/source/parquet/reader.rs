//! A Parquet file as the Arrow reader sees it: every byte through Stoker's store (its read
//! plan, caches, fetch layer and version rule), the metadata read once.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use parquet::arrow::arrow_reader::{ArrowReaderOptions, RowSelection, RowSelector};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::page_index::offset_index::PageLocation;

use crate::error::Error;
use crate::store::{Object, Store};

/// Why a file could not be opened as Parquet, naming it and what to do.
pub(super) fn not_parquet(store: &Store, path: &str, e: ParquetError) -> Error {
    match e {
        ParquetError::External(inner) => match inner.downcast::<Error>() {
            Ok(e) => *e,
            Err(other) => bad_file(store, path, &other.to_string()),
        },
        other => bad_file(store, path, &other.to_string()),
    }
}

pub(super) fn bad_file(store: &Store, path: &str, why: &str) -> Error {
    Error::BadIndex {
        path: store.describe(path),
        reason: format!(
            "not a complete Parquet file ({why}): it is truncated or not Parquet; download or write it again, or \
             leave it out of the source"
        ),
    }
}

/// One Parquet file read through a [`Store`] (remote files through the block cache, keyed
/// by their version); its metadata, once known, is handed out without another read.
pub(super) struct StoreFile {
    pub(super) store: Store,
    pub(super) obj: Object,
    pub(super) meta: Option<Arc<ParquetMetaData>>,
    /// Most bytes one page may decompress to (`decoded_bytes`), checked before the reader
    /// allocates for it ([`super::pages`]).
    pub(super) page_limit: u64,
    /// For a read of rows (not of the metadata): the dictionaries its chunks begin with,
    /// checked against its batch size ([`super::dict`]).
    pub(super) watch: Option<Arc<super::dict::Watch>>,
}

impl StoreFile {
    /// Check the page headers of ranges that are whole pages of a column chunk (the chunk
    /// whole, or pages the offset index names), once the metadata says where chunks lie.
    fn check_pages(&self, ranges: &[Range<u64>], got: &[Bytes]) -> Result<(), Error> {
        let Some(meta) = &self.meta else { return Ok(()) };
        let shown = || self.store.describe(self.obj.path());
        for (r, b) in ranges.iter().zip(got) {
            let Some(run) = whole_pages(meta, r) else { continue };
            let col = run.col;
            let index = meta.page_index_for_row_group(run.group);
            let located = index.page_locations(run.column);
            // The rows the offset index gives the page at byte `at` of this range.
            let rows_at = |at: usize| {
                let pages = located?;
                let offset = i64::try_from(r.start.checked_add(at as u64)?).ok()?;
                page_rows(pages, pages.binary_search_by_key(&offset, |l| l.offset).ok()?, run.rows)
            };
            let told = super::pages::Located { rows_at: &rows_at, flat: run.flat };
            if let Err(bad) = super::pages::check(b, run.total, self.page_limit, located.map(|_| &told)) {
                let shown = shown();
                return Err(match bad {
                    super::pages::BadPage::Lie(why) => Error::CorruptData {
                        shard: shown,
                        key: format!("bytes {}..{}", r.start, r.end),
                        field: String::new(),
                        reason: format!("{why}: the file is damaged or lies; download or write it again"),
                    },
                    super::pages::BadPage::OverBudget { claimed, limit } => Error::InvalidOption {
                        message: format!(
                            "{shown}: a page of bytes {}..{} decompresses to {claimed} bytes, more than the {limit} \
                             decoded_bytes allows; raise decoded_bytes= to read it",
                            r.start, r.end
                        ),
                    },
                });
            }
            let (Some(watch), true) = (&self.watch, r.start == col.byte_range().0) else { continue };
            if let Err(bad) = watch.see(col, r.start, b) {
                return Err(match bad {
                    super::dict::Bad::Damaged(why) => Error::CorruptData {
                        shard: shown(),
                        key: format!("bytes {}..{}", r.start, r.end),
                        field: col.column_path().to_string(),
                        reason: format!("{why}: the file is damaged or lies; download or write it again"),
                    },
                    super::dict::Bad::Over(what) => Error::InvalidOption {
                        message: format!(
                            "{} column `{}`: {what}, more than the {} bytes decoded_bytes allows; raise \
                             decoded_bytes= to read it",
                            shown(),
                            col.column_path(),
                            self.page_limit
                        ),
                    },
                });
            }
        }
        match &self.watch {
            // Stopped before the reader decodes: the read is built again with smaller batches.
            Some(w) if w.must_rebatch() => Err(Error::InvalidOption { message: REBATCH.into() }),
            _ => Ok(()),
        }
    }
}

impl StoreFile {
    /// The footer (Thrift `FileMetaData`) of this file of `size` bytes, its schema's depth
    /// checked ([`super::thrift::MAX_NESTING`]); `None` where the file does not end in
    /// a plain footer (too short, encrypted, not Parquet), left to the parquet crate to name.
    async fn footer(&self, size: u64) -> parquet::errors::Result<Option<Bytes>> {
        let Some(tail_at) = size.checked_sub(8) else { return Ok(None) };
        let tail = self.store.read_span(&self.obj, tail_at..size).await.map_err(external)?;
        let Some((len, b"PAR1")) = tail.split_first_chunk::<4>() else { return Ok(None) };
        let Some(start) = tail_at.checked_sub(u64::from(u32::from_le_bytes(*len))) else { return Ok(None) };
        let footer = self.store.read_span(&self.obj, start..tail_at).await.map_err(external)?;
        match super::thrift::schema_depth(&footer) {
            Err(why) => Err(external(bad_file(&self.store, self.obj.path(), &why))),
            Ok(deep) if deep > super::thrift::MAX_NESTING => Err(external(Error::BadIndex {
                path: self.store.describe(self.obj.path()),
                reason: format!(
                    "its schema nests more than {} levels deep, deeper than Stoker reads (a schema is built by \
                     recursion, and one deep enough overflows the stack): write it with fewer levels of nesting",
                    super::thrift::MAX_NESTING
                ),
            })),
            Ok(_) => Ok(Some(footer)),
        }
    }
}

/// The message of the error that stops a read whose watch asks for smaller batches; never
/// shown ([`super::Inner::read_batches`] reads the watch and reads again).
const REBATCH: &str = "stoker: internal: a dictionary asks for smaller batches";

/// The footer's claims the readers would otherwise follow blindly, checked at open (`shown`
/// names the file of `size` bytes): row counts are not negative (a negative one was read as
/// an empty group, its rows dropped) nor more than a column's values; each column chunk's
/// offsets and sizes are not negative (the parquet crate asserts on one: a panic, not an
/// error) and lie inside the file; and an offset index, which a batch's row selection
/// follows, starts at row 0 with its pages' rows and offsets rising inside their chunk (a
/// shifted or reordered index gave other rows than those asked for). An index whose rows
/// rise but miscount a page is seen when its pages are read ([`StoreFile::check_pages`]).
pub(super) fn check_footer(meta: &ParquetMetaData, size: u64, shown: &str) -> Result<(), Error> {
    let bad = |reason: String| Error::BadIndex {
        path: shown.to_owned(),
        reason: format!("{reason}: the footer is damaged; write the file again"),
    };
    for (g, group) in meta.row_groups().iter().enumerate() {
        let Ok(rows) = u64::try_from(group.num_rows()) else {
            return Err(bad(format!("row group {g} claims {} rows", group.num_rows())));
        };
        // Every row has a value (or a null's level) in each column: a group claiming more rows
        // than any of its columns has values lies (a count of 2^63 rows was opened).
        let most = group.columns().iter().map(|c| c.num_values()).max().unwrap_or(0);
        if !group.columns().is_empty() && most < group.num_rows() {
            return Err(bad(format!("row group {g} claims {rows} rows, but its columns hold at most {most} values")));
        }
        let index = meta.page_index_for_row_group(g);
        for (c, col) in group.columns().iter().enumerate() {
            let name = col.column_path().string();
            let start = u64::try_from(col.dictionary_page_offset().unwrap_or(col.data_page_offset())).ok();
            let len = u64::try_from(col.compressed_size()).ok();
            let inside = start
                .zip(len)
                .and_then(|(s, l)| Some((s, s.checked_add(l)?)))
                .filter(|&(_, e)| e <= size && col.data_page_offset() >= 0 && col.uncompressed_size() >= 0);
            let Some((start, end)) = inside else {
                return Err(bad(format!(
                    "column `{name}` of row group {g} claims bytes outside the file's {size} (a negative or \
                     too large offset or size)"
                )));
            };
            let Some(pages) = index.page_locations(c) else { continue };
            let mut next_row = 0i64;
            let mut next_byte = start;
            for (k, page) in pages.iter().enumerate() {
                let at = u64::try_from(page.offset).ok();
                let page_end =
                    at.zip(u64::try_from(page.compressed_page_size).ok()).and_then(|(a, l)| a.checked_add(l));
                let rows_ok = if k == 0 { page.first_row_index == 0 } else { page.first_row_index > next_row };
                let bytes_ok = at.is_some_and(|a| a >= next_byte) && page_end.is_some_and(|e| e <= end);
                if !rows_ok || !bytes_ok || u64::try_from(page.first_row_index).is_ok_and(|r| rows > 0 && r >= rows) {
                    return Err(bad(format!(
                        "the offset index of column `{name}` in row group {g} places page {k} at byte {} and row {}, \
                         out of order or outside the chunk's bytes {start}..{end} and rows 0..{rows}",
                        page.offset, page.first_row_index
                    )));
                }
                next_row = page.first_row_index;
                next_byte = page_end.unwrap_or(end);
            }
        }
    }
    Ok(())
}

/// A range of whole pages of one column chunk: the chunk's total uncompressed size, the
/// chunk, and where it lies (row group, column).
struct Run<'m> {
    total: u64,
    col: &'m ColumnChunkMetaData,
    group: usize,
    column: usize,
    /// The group's rows.
    rows: u64,
    /// Whether the column is flat (its pages' rows can be checked: `pages::Header::rows_of`).
    flat: bool,
}

/// The rows the offset index `pages` (of a group of `rows` rows) gives its page `k`: to the
/// next page's first row, or to the group's end (its pages rise: [`check_footer`]).
fn page_rows(pages: &[PageLocation], k: usize, rows: u64) -> Option<u64> {
    let next = pages.get(k + 1).map_or(Some(rows), |n| u64::try_from(n.first_row_index).ok())?;
    next.checked_sub(u64::try_from(pages.get(k)?.first_row_index).ok()?)
}

/// The column chunk `r` is whole pages of: the chunk's whole range, or a run of pages the
/// offset index locates (the dictionary page the chunk begins with is one: it ends where the
/// first located page starts); `None` for any other range (the footer, the page index),
/// which is not walked.
fn whole_pages<'m>(meta: &'m ParquetMetaData, r: &Range<u64>) -> Option<Run<'m>> {
    let groups = meta.row_groups();
    // Writers lay row groups out in order: the group starting last at or before the range is
    // tried first, so a file of 50,000 one-row groups is not scanned whole for every read
    // (its reads took time quadratic in its groups). Any other layout is scanned.
    let first_start = |g: usize| groups[g].columns().first().map_or(0, |c| c.byte_range().0);
    let (mut lo, mut hi) = (0, groups.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if first_start(mid) <= r.start {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let tried = lo.checked_sub(1).and_then(|g| in_group(meta, g, r));
    if let Some(found) = tried {
        return found;
    }
    (0..groups.len()).find_map(|g| in_group(meta, g, r)).flatten()
}

/// Whether a column chunk of row group `g` holds range `r`: `None` if none does, else the
/// run `r` is whole pages of, if it is ([`whole_pages`]).
fn in_group<'m>(meta: &'m ParquetMetaData, g: usize, r: &Range<u64>) -> Option<Option<Run<'m>>> {
    let group = &meta.row_groups()[g];
    let (c, col) = group.columns().iter().enumerate().find(|(_, col)| {
        let (start, len) = col.byte_range();
        r.start >= start && r.end <= start.saturating_add(len)
    })?;
    let (start, len) = col.byte_range();
    let run = Run {
        total: u64::try_from(col.uncompressed_size()).unwrap_or(0),
        col,
        group: g,
        column: c,
        rows: u64::try_from(group.num_rows()).unwrap_or(0),
        flat: col.column_descr().max_rep_level() == 0,
    };
    if r.start == start && r.end == start.saturating_add(len) {
        return Some(Some(run));
    }
    let index = meta.page_index_for_row_group(g);
    let (starts, ends) = index.page_locations(c).map_or((false, false), |p| {
        let at = |x: i64| u64::try_from(x).ok();
        (
            r.start == start || p.iter().any(|l| at(l.offset) == Some(r.start)),
            p.iter().any(|l| {
                l.offset.checked_add(i64::from(l.compressed_page_size)).and_then(at) == Some(r.end)
                    || at(l.offset) == Some(r.end)
            }),
        )
    });
    Some((starts && ends).then_some(run))
}

/// The head of a column chunk's first or last page, read beside a run of its pages that
/// leaves that page out, and the rows the offset index gives that page.
struct End {
    range: Range<u64>,
    rows: u64,
    flat: bool,
    column: String,
}

/// The first and last pages of each chunk `ranges` read some pages of but not those, to hold
/// to the rows the offset index gives them. A read of some pages trusts the index for where
/// their rows start; an index whose rows are all moved by the same amount gives every page
/// in between its true count, and only the first and the last page show the lie (a page
/// index wrong in one entry shows it at the pages on either side, checked when read). Each
/// is read once into the cache: the next read of that chunk finds it there.
fn chunk_ends(meta: &ParquetMetaData, ranges: &[Range<u64>]) -> Vec<End> {
    // A page header with its statistics fits in this; one that does not is not checked.
    const HEAD: u64 = 4096;
    let mut ends: Vec<End> = Vec::new();
    for r in ranges {
        let Some(run) = whole_pages(meta, r) else { continue };
        let (start, len) = run.col.byte_range();
        if r.start == start && r.end == start.saturating_add(len) {
            continue;
        }
        let index = meta.page_index_for_row_group(run.group);
        let Some(pages) = index.page_locations(run.column) else { continue };
        for k in [0, pages.len().saturating_sub(1)] {
            let Some(page) = pages.get(k) else { continue };
            let (Ok(at), Ok(size)) = (u64::try_from(page.offset), u64::try_from(page.compressed_page_size)) else {
                continue;
            };
            let range = at..at.saturating_add(size.min(HEAD));
            let inside = ranges.iter().any(|x| x.start <= at && at < x.end);
            if inside || ends.iter().any(|e| e.range == range) {
                continue;
            }
            let Some(rows) = page_rows(pages, k, run.rows) else { continue };
            ends.push(End { range, rows, flat: run.flat, column: run.col.column_path().string() });
        }
    }
    ends
}

pub(super) fn external(e: Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for StoreFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let got = self.store.read_span(&self.obj, range.clone()).await.map_err(external)?;
            self.check_pages(std::slice::from_ref(&range), std::slice::from_ref(&got)).map_err(external)?;
            Ok(got)
        }
        .boxed()
    }

    /// The pages a read needs, in one read of the store (which merges them across small
    /// gaps: a row group's column chunks and pages lie side by side, and one request for them
    /// costs less than one per page).
    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let ends = self.meta.as_ref().map(|m| chunk_ends(m, &ranges)).unwrap_or_default();
            let all: Vec<Range<u64>> = ranges.iter().cloned().chain(ends.iter().map(|e| e.range.clone())).collect();
            let mut got = self.store.read(&self.obj, &all).await.map_err(external)?;
            let end_bytes = got.split_off(ranges.len().min(got.len()));
            self.check_pages(&ranges, &got).map_err(external)?;
            for (end, b) in ends.iter().zip(&end_bytes) {
                let Some(holds) = super::pages::rows_claimed(b, end.flat) else { continue };
                if u64::try_from(holds) != Ok(end.rows) {
                    return Err(external(Error::CorruptData {
                        shard: self.store.describe(self.obj.path()),
                        key: format!("bytes {}..{}", end.range.start, end.range.end),
                        field: end.column.clone(),
                        reason: format!(
                            "the page there holds {holds} rows, but the offset index gives it {}: the index is \
                             damaged; download or write the file again",
                            end.rows
                        ),
                    }));
                }
            }
            Ok(got)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            if let Some(m) = &self.meta {
                return Ok(m.clone());
            }
            let size = self.obj.size();
            let policy = options.map_or(PageIndexPolicy::Optional, |_| PageIndexPolicy::Optional);
            let meta = match self.footer(size).await? {
                // Decoded from the bytes checked, then its page index loaded (not read again).
                Some(footer) => {
                    let meta = ParquetMetaDataReader::decode_metadata(&footer)?;
                    let mut reader = ParquetMetaDataReader::new_with_metadata(meta).with_page_index_policy(policy);
                    reader.load_page_index(&mut *self).await?;
                    reader.finish()?
                }
                // Not a plain Parquet footer: the parquet crate says what it is not.
                None => {
                    ParquetMetaDataReader::new()
                        .with_page_index_policy(policy)
                        .load_and_finish(&mut *self, size)
                        .await?
                }
            };
            let meta = Arc::new(meta);
            self.meta = Some(meta.clone());
            Ok(meta)
        }
        .boxed()
    }
}

/// A selection of `rows` (sorted, distinct) out of `total`.
pub(super) fn selection(rows: &[usize], total: usize) -> RowSelection {
    let mut selectors = Vec::new();
    let mut next = 0usize;
    let mut i = 0usize;
    while i < rows.len() {
        let start = rows[i];
        let mut end = start + 1;
        while i + 1 < rows.len() && rows[i + 1] == end {
            end += 1;
            i += 1;
        }
        if start > next {
            selectors.push(RowSelector::skip(start - next));
        }
        selectors.push(RowSelector::select(end - start));
        next = end;
        i += 1;
    }
    if next < total {
        selectors.push(RowSelector::skip(total - next));
    }
    selectors.into()
}
