//! Dictionary expansion, bounded before the reader decodes.
//!
//! A dictionary-encoded column decodes every row to a copy of its dictionary entry: one entry
//! of 512 KiB referenced by 10,000 rows is a page of a few hundred bytes that decodes to
//! 5 GB (a 462-byte file took 2 GiB and 12 s, then failed on an offset overflow). The
//! page checks ([`super::pages`]) bound what a page decompresses to, not what its values
//! expand to. So as the reader's bytes arrive, before it decodes them, the dictionary page
//! a column chunk begins with is decoded and its longest entry found ([`Watch`]); when a
//! batch of rows, each taking the longest entry of every such column, could pass
//! `decoded_bytes`, the read is built again with batches small enough (and the decode stops
//! at the batch that crosses it, as for any other column). A repeated column (a list) has no
//! rows-to-values bound: it is refused when its values could all take the longest entry and
//! pass the budget. Columns without a dictionary cost nothing: no read of their own.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use parquet::basic::Type as Physical;
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

/// What the dictionaries of one read's column chunks may expand a batch to: filled as the
/// reader's bytes arrive (in [`super::reader::StoreFile`], before the reader decodes them, and
/// without a read of its own), checked against the batch size the read was built with.
#[derive(Debug)]
pub(super) struct Watch {
    batch_rows: u64,
    cap: u64,
    /// Sum over the chunks seen of their longest dictionary entry: what one row may take.
    per_row: AtomicU64,
}

impl Watch {
    pub(super) fn new(batch_rows: usize, cap: usize) -> Arc<Self> {
        Arc::new(Watch { batch_rows: batch_rows as u64, cap: cap as u64, per_row: AtomicU64::new(0) })
    }

    /// Bytes one row may decode to from the dictionaries seen so far.
    pub(super) fn per_row(&self) -> u64 {
        self.per_row.load(Relaxed)
    }

    /// Whether the read must be built again with smaller batches: a batch of rows that each
    /// take their dictionaries' longest entries could pass the budget.
    pub(super) fn must_rebatch(&self) -> bool {
        self.batch_rows > 1 && self.batch_rows.saturating_mul(self.per_row()) > self.cap
    }

    /// The rows of a batch of the read.
    pub(super) fn batch_rows(&self) -> usize {
        usize::try_from(self.batch_rows).unwrap_or(usize::MAX)
    }

    /// Column chunk `col`'s bytes from its start (`start`): when they begin with a dictionary
    /// page, find its longest entry and count it. `Err` with the reason when the dictionary
    /// is damaged, or past the budget whatever the batch (`Over`).
    pub(super) fn see(&self, col: &ColumnChunkMetaData, start: u64, bytes: &Bytes) -> std::result::Result<(), Bad> {
        let longest = match col.column_type() {
            Physical::BYTE_ARRAY => longest_entry(col, start, bytes).map_err(Bad::Damaged)?,
            // A fixed-length entry is as long as the type says, dictionary or not.
            Physical::FIXED_LEN_BYTE_ARRAY => u64::try_from(col.column_descr().type_length()).unwrap_or(0),
            // Numbers: at most 12 bytes a value, no larger than the pages they come from.
            _ => 0,
        };
        if longest > self.cap {
            return Err(Bad::Over(format!("one value decodes to {longest} bytes")));
        }
        let values = u64::try_from(col.num_values()).unwrap_or(0);
        if col.column_descr().max_rep_level() > 0 && longest.saturating_mul(values) > self.cap {
            return Err(Bad::Over(format!(
                "its {values} list values may each decode to its longest dictionary entry ({longest} bytes)"
            )));
        }
        self.per_row.fetch_add(longest, Relaxed);
        Ok(())
    }
}

/// The rows a batch of `wanted` may hold when a row may decode to `per_row` bytes from
/// dictionaries, within `cap` (at least one).
pub(super) fn batch_within(wanted: usize, per_row: u64, cap: usize) -> usize {
    match per_row {
        0 => wanted,
        b => wanted.min(usize::try_from(cap as u64 / b).unwrap_or(usize::MAX)).max(1),
    }
}

/// Why a dictionary was refused.
pub(super) enum Bad {
    Damaged(String),
    Over(String),
}

/// The longest entry of the dictionary page `bytes` begin with (the first bytes of column
/// chunk `col`, at file offset `start`), 0 when the chunk begins with a data page.
fn longest_entry(col: &ColumnChunkMetaData, start: u64, bytes: &Bytes) -> std::result::Result<u64, String> {
    let first = super::pages::first(bytes)?;
    if !first.dictionary {
        return Ok(0);
    }
    let end = (first.header as u64)
        .checked_add(first.compressed)
        .filter(|&e| e <= bytes.len() as u64)
        .ok_or_else(|| format!("its dictionary page of {} bytes runs past the bytes read", first.compressed))?;
    // The page's claimed size was checked by the page walk before this (at most the budget).
    let reader = At { start, bytes: bytes.slice(..end as usize) };
    let rows = usize::try_from(col.num_values()).unwrap_or(0);
    let mut pages = SerializedPageReader::new(Arc::new(reader), col, rows, None)
        .map_err(|e| format!("its dictionary page cannot be read ({e})"))?;
    match pages.get_next_page() {
        Ok(Some(Page::DictionaryPage { buf, num_values, .. })) => longest_plain(&buf, num_values),
        Ok(_) => Ok(0),
        Err(e) => Err(format!("its dictionary page cannot be decoded ({e})")),
    }
}

/// The longest of the `n` values of a PLAIN-encoded byte-array dictionary (each a 4-byte
/// little-endian length, then the bytes).
fn longest_plain(buf: &[u8], n: u32) -> std::result::Result<u64, String> {
    let (mut at, mut longest) = (0usize, 0u64);
    for i in 0..n {
        let len = buf
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| format!("its dictionary ends before entry {i} of {n}"))?;
        at = at
            .checked_add(4 + len)
            .filter(|&e| e <= buf.len())
            .ok_or_else(|| format!("dictionary entry {i} of {len} bytes runs past the page"))?;
        longest = longest.max(len as u64);
    }
    Ok(longest)
}

/// One page of a column chunk, at its offset in the file, as the page reader reads it.
struct At {
    start: u64,
    bytes: Bytes,
}

impl At {
    fn slice(&self, from: u64, len: Option<usize>) -> parquet::errors::Result<Bytes> {
        let past = || parquet::errors::ParquetError::EOF(format!("a read at {from} outside the page read"));
        let off = from.checked_sub(self.start).and_then(|o| usize::try_from(o).ok()).ok_or_else(past)?;
        let end = match len {
            Some(n) => off.checked_add(n).ok_or_else(past)?,
            None => self.bytes.len(),
        };
        if off > end || end > self.bytes.len() {
            return Err(past());
        }
        Ok(self.bytes.slice(off..end))
    }
}

impl Length for At {
    fn len(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

impl ChunkReader for At {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, Some(length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_plain_entry_is_found_and_lies_are_refused() {
        let mut buf = Vec::new();
        for v in [&b"ab"[..], b"", b"hello"] {
            buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
            buf.extend_from_slice(v);
        }
        assert_eq!(longest_plain(&buf, 3), Ok(5));
        assert!(longest_plain(&buf, 4).is_err(), "more entries than the page holds");
        assert!(longest_plain(&buf[..buf.len() - 1], 3).is_err(), "the last entry cut");
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.push(1);
        assert!(longest_plain(&huge, 1).is_err(), "a length past the page");
    }
}
