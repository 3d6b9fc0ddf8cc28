//! LitData's Arrow-footer chunks: the IPC footer and the record batches' message headers read
//! once, then only the record batches a read needs (kept within `decoded_bytes`, spilled
//! when dropped with rows unread).

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::{Inner, Table};
use crate::error::Result;
use crate::sample::Sample;

/// Where the record batches of an Arrow-footer chunk lie, from its IPC footer and the
/// batches' message headers (read once; a read then fetches only the batches it needs).
#[derive(Debug)]
pub(super) struct ArrowIndex {
    pub(super) schema: arrow_schema::SchemaRef,
    pub(super) version: arrow_ipc::MetadataVersion,
    /// Dictionary blocks (absolute byte ranges), read with every batch that needs them.
    pub(super) dictionaries: Vec<(arrow_ipc::Block, Range<u64>)>,
    /// Per record batch: its block, its absolute byte range, and its first row.
    pub(super) batches: Vec<(arrow_ipc::Block, Range<u64>, usize)>,
}

impl Inner {
    /// The record batches of the Arrow IPC file at `span` of `shard`: its footer, then each
    /// batch's message header (for its row count), in one merged read.
    pub(super) async fn arrow_index(&self, shard: usize, span: Range<u64>) -> Result<ArrowIndex> {
        let path = &self.shards[shard].path;
        let bad = |why: String| self.corrupt(shard, String::new(), format!("its Arrow footer does not read: {why}"));
        let trailer_at =
            span.end.checked_sub(10).filter(|&t| t >= span.start).ok_or_else(|| bad("too short".into()))?;
        let trailer = self.read_range(path, trailer_at..span.end).await.map_err(|e| self.short(shard, e))?;
        let trailer: [u8; 10] = trailer[..].try_into().map_err(|_| bad("a short trailer".into()))?;
        let footer_len = arrow_ipc::reader::read_footer_length(trailer).map_err(|e| bad(e.to_string()))? as u64;
        let footer_at = trailer_at
            .checked_sub(footer_len)
            .filter(|&f| f >= span.start)
            .ok_or_else(|| bad("its footer length".into()))?;
        let footer_bytes = self.read_range(path, footer_at..trailer_at).await.map_err(|e| self.short(shard, e))?;
        let footer = arrow_ipc::root_as_footer(&footer_bytes).map_err(|e| bad(e.to_string()))?;
        let fb_schema = footer.schema().ok_or_else(|| bad("no schema".into()))?;
        let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| bad(e.to_string()))?);
        let range = |b: &arrow_ipc::Block| -> Result<Range<u64>> {
            let at = u64::try_from(b.offset()).ok().and_then(|o| span.start.checked_add(o));
            let len =
                u64::try_from(b.metaDataLength()).ok().zip(u64::try_from(b.bodyLength()).ok()).map(|(m, l)| m + l);
            match (at, len) {
                (Some(at), Some(len)) if at.checked_add(len).is_some_and(|e| e <= footer_at) => Ok(at..at + len),
                _ => Err(bad("a block lies outside the file".into())),
            }
        };
        let dictionaries =
            footer.dictionaries().iter().flatten().map(|b| Ok((*b, range(b)?))).collect::<Result<Vec<_>>>()?;
        let blocks: Vec<arrow_ipc::Block> = footer.recordBatches().iter().flatten().copied().collect();
        let heads: Vec<Range<u64>> = blocks
            .iter()
            .map(|b| {
                let r = range(b)?;
                Ok(r.start..r.start + u64::try_from(b.metaDataLength()).unwrap_or(0))
            })
            .collect::<Result<_>>()?;
        let got = self.read_ranges(path, &heads).await.map_err(|e| self.short(shard, e))?;
        let mut batches = Vec::with_capacity(blocks.len());
        let mut counts = Vec::with_capacity(blocks.len());
        for ((b, head), meta) in blocks.iter().zip(&heads).zip(&got) {
            if head.is_empty() {
                return Err(bad("an empty batch header".into()));
            }
            // An encapsulated message: continuation marker, length, then the flatbuffer.
            let body =
                if meta.len() >= 8 && meta[..4] == [0xff; 4] { &meta[8..] } else { meta.get(4..).unwrap_or(&[]) };
            let message = arrow_ipc::root_as_message(body).map_err(|e| bad(e.to_string()))?;
            let header = message.header_as_record_batch().ok_or_else(|| bad("a block is not a record batch".into()))?;
            counts.push(header.length());
            batches.push((*b, range(b)?, 0));
        }
        let firsts = batch_starts(&counts, self.shards[shard].samples).map_err(bad)?;
        for (batch, first) in batches.iter_mut().zip(firsts) {
            batch.2 = first;
        }
        Ok(ArrowIndex { schema, version: footer.version(), dictionaries, batches })
    }

    /// Items `items` (sorted, distinct) of an Arrow-footer chunk, as samples: only the record
    /// batches holding them are read (and kept) and decoded.
    pub(super) async fn arrow_samples(&self, shard: usize, index: &ArrowIndex, items: &[usize]) -> Result<Vec<Sample>> {
        let mut out = Vec::with_capacity(items.len());
        let mut i = 0;
        while i < items.len() {
            let k = index.batches.partition_point(|(_, _, first)| *first <= items[i]).saturating_sub(1);
            let first = index.batches[k].2;
            let end = index.batches.get(k + 1).map_or(self.shards[shard].samples, |b| b.2);
            let mut j = i;
            while j < items.len() && items[j] < end {
                j += 1;
            }
            let rows: Vec<usize> = items[i..j].iter().map(|&item| item - first).collect();
            if rows.is_empty() {
                return Err(self.corrupt(
                    shard,
                    String::new(),
                    format!("item {} lies past its batch's rows", items[i]),
                ));
            }
            out.extend(self.arrow_batch_rows(shard, index, k, &rows).await?);
            i = j;
        }
        Ok(out)
    }

    /// Rows `rows` (sorted, distinct) of record batch `k` of an Arrow-footer chunk: from the
    /// kept batch bytes, the spill, or read (and kept) now.
    pub(super) async fn arrow_batch_rows(
        &self,
        shard: usize,
        index: &ArrowIndex,
        k: usize,
        rows: &[usize],
    ) -> Result<Vec<Sample>> {
        let cached = self.kept.lock().unwrap_or_else(|e| e.into_inner()).get((shard, k), rows);
        let bytes = match cached {
            Some(b) => b,
            None => {
                if let Some(got) = self.spilled(shard, k, rows).await {
                    return got;
                }
                let s = &self.shards[shard];
                let range = index.batches[k].1.clone();
                let b = self.read_range(&s.path, range).await.map_err(|e| self.short(shard, e))?;
                // The rows read of it are kept track of, one flag a row, for as many rows as
                // its bytes plausibly hold, whatever its header claims (a batch of nulls claims
                // more in a few bytes; its rows past the flags only go untracked, so it is
                // spilled when dropped, not forgotten).
                let n = (index.batches.get(k + 1).map_or(s.samples, |b| b.2) - index.batches[k].2)
                    .min(plausible_rows(b.len()));
                let dropped =
                    self.kept.lock().unwrap_or_else(|e| e.into_inner()).put((shard, k), b.clone(), b.len(), n, rows);
                for ((d_shard, d_k), d_bytes) in dropped {
                    self.spill_batch(d_shard, d_k, d_bytes).await;
                }
                b
            }
        };
        self.arrow_rows(shard, index, k, bytes, rows).await
    }

    /// Rows `rows` of record batch `k` (its bytes `bytes`) of an Arrow-footer chunk.
    pub(super) async fn arrow_rows(
        &self,
        shard: usize,
        index: &ArrowIndex,
        k: usize,
        bytes: Bytes,
        rows: &[usize],
    ) -> Result<Vec<Sample>> {
        let s = &self.shards[shard];
        let shown = self.store.describe(&s.path);
        let bad = |why: String| self.corrupt(shard, String::new(), format!("its Arrow footer does not read: {why}"));
        let wanted: Option<Vec<&str>> = self.wanted.as_ref().map(|w| w.iter().map(String::as_str).collect());
        let (columns, key_column) = crate::source::parquet::values::plan(&index.schema, wanted.as_deref(), &shown)?;
        let key_name = key_column.map(|k| index.schema.field(k).name().clone());
        let mut decoder = arrow_ipc::reader::FileDecoder::new(index.schema.clone(), index.version);
        for (block, range) in &index.dictionaries {
            let b = self.read_range(&s.path, range.clone()).await.map_err(|e| self.short(shard, e))?;
            check_buffers(block, &b).map_err(bad)?;
            guarded(|| decoder.read_dictionary(block, &arrow_buffer::Buffer::from(b))).map_err(bad)?;
        }
        let (block, _, first) = &index.batches[k];
        check_buffers(block, &bytes).map_err(bad)?;
        let b = guarded(|| decoder.read_record_batch(block, &arrow_buffer::Buffer::from(bytes)))
            .map_err(bad)?
            .ok_or_else(|| bad("an empty record batch".into()))?;
        let mut out = Vec::with_capacity(rows.len());
        for &r in rows {
            let item = first + r;
            if r >= b.num_rows() {
                return Err(bad(format!("item {item} lies past its batch's rows")));
            }
            let key = key_name
                .as_ref()
                .and_then(|n| b.column_by_name(n))
                .and_then(|c| crate::source::parquet::values::key_of(c, r))
                .unwrap_or_else(|| format!("{}/{item:06}", s.stem));
            let mut fields = Vec::with_capacity(columns.len());
            for col in &columns {
                let Some(array) = b.column_by_name(&col.name) else { continue };
                col.push_fields(array, r, &mut fields).map_err(|why| self.corrupt(shard, key.clone(), why))?;
            }
            out.push(Sample { key, fields });
        }
        Ok(out)
    }

    /// Rows `rows` of record batch `k` of `shard` from the spill, when it is there.
    pub(super) async fn spilled(&self, shard: usize, k: usize, rows: &[usize]) -> Option<Result<Vec<Sample>>> {
        self.spill.as_ref()?.get((shard, k), rows).await
    }

    /// Write record batch `k` of `shard` (dropped from memory with rows unread) to the spill
    /// as samples; a batch that does not decode is left to be reported when read.
    pub(super) async fn spill_batch(&self, shard: usize, k: usize, bytes: Bytes) {
        let Some(spill) = &self.spill else { return };
        let Ok(table) = self.table(shard).await else { return };
        let Table::Arrow(index) = &*table else { return };
        let n = index.batches.get(k + 1).map_or(self.shards[shard].samples, |b| b.2) - index.batches[k].2;
        // A batch claiming more rows than its bytes plausibly hold (nulls, or a lie) is not
        // spilled: its rows are read from the store again when asked, and a list of its
        // claimed rows is not made.
        if n > plausible_rows(bytes.len()) {
            return;
        }
        let all: Vec<usize> = (0..n).collect();
        if let Ok(samples) = self.arrow_rows(shard, index, k, bytes, &all).await {
            spill.put((shard, k), samples).await;
        }
    }
}

/// The rows a record batch of `bytes` bytes is taken to hold at most when sizing what is
/// kept per row: eight a byte (a row takes a bit of some buffer, but for null columns).
fn plausible_rows(bytes: usize) -> usize {
    bytes.saturating_mul(8).saturating_add(64)
}

/// The first row of each record batch, from each batch's claimed row count, checked against
/// the `samples` the index gives the chunk before anything is sized by them: the running sum
/// must stay within `samples` (a sum that wrapped could otherwise match it and size a batch's
/// bookkeeping by the wrapped starts).
fn batch_starts(counts: &[i64], samples: usize) -> std::result::Result<Vec<usize>, String> {
    let mut firsts = Vec::with_capacity(counts.len());
    let mut first = 0usize;
    for &rows in counts {
        let rows = usize::try_from(rows).map_err(|_| "a negative row count".to_string())?;
        firsts.push(first);
        first = first
            .checked_add(rows)
            .filter(|&f| f <= samples)
            .ok_or_else(|| format!("its batches hold more rows than the {samples} its index says"))?;
    }
    if first != samples {
        return Err(format!("its batches hold {first} rows, its index says {samples}"));
    }
    Ok(firsts)
}

/// Every buffer a record batch or dictionary message names lies within its block's body.
/// Arrow's decoder slices them without a check (a length of 2^32 - 1 in a damaged chunk
/// panicked in it), so the claims are checked here first.
fn check_buffers(block: &arrow_ipc::Block, bytes: &[u8]) -> std::result::Result<(), String> {
    let meta_len = usize::try_from(block.metaDataLength()).map_err(|_| "a negative header length".to_string())?;
    let (meta, body) =
        bytes.split_at_checked(meta_len).ok_or_else(|| "a batch header longer than its block".to_string())?;
    // An encapsulated message: continuation marker and length, then the flatbuffer.
    let flat = if meta.len() >= 8 && meta[..4] == [0xff; 4] { &meta[8..] } else { meta.get(4..).unwrap_or(&[]) };
    let message = arrow_ipc::root_as_message(flat).map_err(|e| e.to_string())?;
    let batch = match message.header_type() {
        arrow_ipc::MessageHeader::RecordBatch => message.header_as_record_batch(),
        arrow_ipc::MessageHeader::DictionaryBatch => message.header_as_dictionary_batch().and_then(|d| d.data()),
        _ => None,
    };
    let Some(buffers) = batch.and_then(|b| b.buffers()) else { return Ok(()) };
    for b in buffers {
        let end =
            u64::try_from(b.offset()).ok().zip(u64::try_from(b.length()).ok()).and_then(|(o, l)| o.checked_add(l));
        if end.is_none_or(|e| e > body.len() as u64) {
            return Err(format!(
                "a buffer at {} of {} bytes lies outside its batch's {} bytes",
                b.offset(),
                b.length(),
                body.len()
            ));
        }
    }
    Ok(())
}

/// `f`, an Arrow decode, with a panic of the decoder (a damaged batch it was not ready for)
/// turned into an error instead of failing the read's task.
fn guarded<T>(f: impl FnOnce() -> std::result::Result<T, arrow_schema::ArrowError>) -> std::result::Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("the Arrow decoder failed on it (damaged)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::batch_starts;

    #[test]
    fn batch_starts_refuse_counts_that_lie_or_wrap() {
        assert_eq!(batch_starts(&[3, 2], 5).unwrap(), [0, 3]);
        assert!(batch_starts(&[3, 2], 6).unwrap_err().contains("hold 5 rows"));
        assert!(batch_starts(&[-1], 5).unwrap_err().contains("negative"));
        // Three batches whose counts sum to 2 modulo 2^64 (the same message three times).
        let third = ((u128::from(u64::MAX) + 3) / 3) as i64;
        let e = batch_starts(&[third; 3], 2).unwrap_err();
        assert!(e.contains("more rows than the 2"), "{e}");
        // A sum past the index's count before the last batch, without wrapping.
        let e = batch_starts(&[3, 3, 0], 5).unwrap_err();
        assert!(e.contains("more rows than the 5"), "{e}");
    }
}
