//! Dictionary expansion, bounded before the reader decodes.
//!
//! A dictionary-encoded column decodes every row to a copy of its dictionary entry: one entry
//! of 512 KiB referenced by 10,000 rows is a page of a few hundred bytes that decodes to
//! 5 GB (a 462-byte file took 2 GiB and 12 s, then failed on an offset overflow). The
//! page checks ([`super::pages`]) bound what a page decompresses to, not what its values
//! expand to. So before a row group is decoded, the dictionary page of each projected byte
//! column is read and its longest entry found; the reader's batches are then cut small
//! enough that a batch of rows, each taking the longest entry of every such column, stays
//! within `decoded_bytes` (and the decode stops at the batch that crosses it, as for any
//! other column). A repeated column (a list) has no rows-to-values bound: it is refused when
//! its values could all take the longest entry and pass the budget.

use std::sync::Arc;

use bytes::{Buf, Bytes};
use parquet::basic::Type as Physical;
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;

use crate::error::{Error, Result};

/// The first bytes of a column chunk read to find its first page header: enough for any
/// header a writer makes (statistics included), and a read the store serves in one piece.
const HEADER_READ: u64 = 16 << 10;

impl super::Inner {
    /// At most how many bytes one row of group `g` decodes to from the dictionaries of its
    /// projected byte columns (0 when they have none); read once per group and process.
    pub(super) async fn dictionary_row_bytes(&self, g: usize) -> Result<u64> {
        self.dictionary_rows[g].get_or_try_init(|| self.measure_dictionaries(g)).await.copied()
    }

    async fn measure_dictionaries(&self, g: usize) -> Result<u64> {
        let group = &self.groups[g];
        let file = &self.files[group.file];
        let meta = file.meta.metadata().row_group(group.group);
        let shown = || self.store.describe(&file.path);
        let mut per_row = 0u64;
        for col in meta.columns() {
            let root = super::root(col);
            if !(self.columns.iter().any(|c| c.name == root) || root == super::KEY_COLUMN) {
                continue;
            }
            // A column the file's Arrow schema keeps as a dictionary decodes to one: its rows
            // share their entries and expand to nothing.
            if let Ok(f) = file.meta.schema().field_with_name(root) {
                if matches!(f.data_type(), arrow_schema::DataType::Dictionary(..)) {
                    continue;
                }
            }
            let longest = match col.column_type() {
                Physical::BYTE_ARRAY => self.longest_entry(file, col).await?,
                // A fixed-length entry is as long as the type says, dictionary or not.
                Physical::FIXED_LEN_BYTE_ARRAY => u64::try_from(col.column_descr().type_length()).unwrap_or(0),
                // Numbers: at most 12 bytes a value, no larger than the pages they come from.
                _ => 0,
            };
            if longest == 0 {
                continue;
            }
            let cap = self.decode_cap as u64;
            let values = u64::try_from(col.num_values()).unwrap_or(0);
            let over = |what: String| Error::InvalidOption {
                message: format!(
                    "{} row group {} column `{}`: {what}, more than the {cap} bytes decoded_bytes allows; raise \
                     decoded_bytes= to read it",
                    shown(),
                    group.group,
                    col.column_path()
                ),
            };
            if longest > cap {
                return Err(over(format!("one value decodes to {longest} bytes")));
            }
            if col.column_descr().max_rep_level() > 0 && longest.saturating_mul(values) > cap {
                return Err(over(format!(
                    "its {values} list values may each decode to its longest dictionary entry ({longest} bytes)"
                )));
            }
            per_row = per_row.saturating_add(longest);
        }
        Ok(per_row)
    }

    /// The longest entry of column chunk `col`'s dictionary page (0 when it has none).
    async fn longest_entry(&self, file: &super::File, col: &ColumnChunkMetaData) -> Result<u64> {
        let (start, len) = col.byte_range();
        let shown = || self.store.describe(&file.path);
        let bad = |why: String| Error::CorruptData {
            shard: shown(),
            key: format!("bytes {start}..{}", start.saturating_add(len)),
            field: col.column_path().to_string(),
            reason: format!("{why}: the file is damaged or lies; download or write it again"),
        };
        let end = start
            .checked_add(len)
            .filter(|&e| e <= file.obj.size())
            .ok_or_else(|| bad(format!("its column chunk of {len} bytes at {start} lies past the end of the file")))?;
        if len == 0 {
            return Ok(0);
        }
        let head = self.store.read_span(&file.obj, start..end.min(start + HEADER_READ)).await?;
        let first = super::pages::first(&head).map_err(bad)?;
        if !first.dictionary {
            return Ok(0);
        }
        let total = u64::try_from(col.uncompressed_size()).unwrap_or(0);
        if first.uncompressed > total {
            return Err(bad(format!(
                "its dictionary page claims {} bytes uncompressed, more than its whole column chunk's {total}",
                first.uncompressed
            )));
        }
        if first.uncompressed > self.decode_cap as u64 {
            return Err(Error::InvalidOption {
                message: format!(
                    "{}: the dictionary page at byte {start} decompresses to {} bytes, more than the {} \
                     decoded_bytes allows; raise decoded_bytes= to read it",
                    shown(),
                    first.uncompressed,
                    self.decode_cap
                ),
            });
        }
        let page_end = (first.header as u64)
            .checked_add(first.compressed)
            .and_then(|n| start.checked_add(n))
            .filter(|&e| e <= end)
            .ok_or_else(|| bad(format!("its dictionary page of {} bytes runs past the chunk", first.compressed)))?;
        let page = if page_end - start <= head.len() as u64 {
            head.slice(..(page_end - start) as usize)
        } else {
            self.store.read_span(&file.obj, start..page_end).await?
        };
        let reader = At { start, bytes: page };
        let rows = usize::try_from(col.num_values()).unwrap_or(0);
        let mut pages = SerializedPageReader::new(Arc::new(reader), col, rows, None)
            .map_err(|e| bad(format!("its dictionary page cannot be read ({e})")))?;
        match pages.get_next_page() {
            Ok(Some(Page::DictionaryPage { buf, num_values, .. })) => longest_plain(&buf, num_values).map_err(bad),
            Ok(_) => Ok(0),
            Err(e) => Err(bad(format!("its dictionary page cannot be decoded ({e})"))),
        }
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
