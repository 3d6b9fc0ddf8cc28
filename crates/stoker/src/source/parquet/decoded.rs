//! Row groups decoded whole: kept as record batches within `decoded_bytes` (least recently
//! used first), decoded ahead on a sequential pass, and spilled to disk once decoded so later
//! epochs decode nothing.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use arrow_array::RecordBatch;

use super::{corrupt, Inner};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::source::spill::Kept;

/// Row groups decoded whole, least recently used first, within `decoded_bytes` of Arrow
/// arrays, and those dropped with rows unread while they are written to the spill.
pub(super) struct Decoded {
    pub(super) kept: Kept<usize, Arc<Whole>>,
    pub(super) spilling: Vec<(usize, Arc<Whole>)>,
}

/// A row group decoded whole, as record batches (of about [`WHOLE_BATCH_BYTES`]).
pub(super) struct Whole {
    pub(super) batches: Vec<RecordBatch>,
    /// First row of each batch.
    pub(super) starts: Vec<usize>,
}

/// Record batches of a group decoded whole are about this large.
pub(super) const WHOLE_BATCH_BYTES: usize = 4 << 20;

impl Whole {
    pub(super) fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }

    pub(super) fn memory_size(&self) -> usize {
        self.batches.iter().map(RecordBatch::get_array_memory_size).sum()
    }

    /// The batch holding row `row`, and its row there.
    pub(super) fn row(&self, row: usize) -> Option<(&RecordBatch, usize)> {
        let k = self.starts.partition_point(|&s| s <= row).checked_sub(1)?;
        let b = self.batches.get(k)?;
        let r = row - self.starts[k];
        (r < b.num_rows()).then_some((b, r))
    }
}

impl Decoded {
    /// Group `g` if kept (marking `rows` read) or being spilled.
    pub(super) fn get(&mut self, g: usize, rows: &[usize]) -> Option<Arc<Whole>> {
        self.kept.get(g, rows).or_else(|| self.spilling.iter().find(|(k, _)| *k == g).map(|(_, b)| b.clone()))
    }

    /// Keep group `g` with `rows` read; returns the groups dropped with rows still unread,
    /// which `spilling` holds until [`Decoded::spilled`] (when `spill` is true; else they
    /// are gone).
    pub(super) fn put(&mut self, g: usize, b: Arc<Whole>, rows: &[usize], spill: bool) -> Vec<usize> {
        let (size, n) = (b.memory_size(), b.num_rows());
        let dropped = self.kept.put(g, b, size, n, rows);
        if !spill {
            return Vec::new();
        }
        let groups = dropped.iter().map(|(k, _)| *k).collect();
        self.spilling.extend(dropped);
        groups
    }

    /// Group `g` is in the spill (or could not go there): drop it from `spilling`.
    pub(super) fn spilled(&mut self, g: usize) -> Option<Arc<Whole>> {
        let i = self.spilling.iter().position(|(k, _)| *k == g)?;
        Some(self.spilling.swap_remove(i).1)
    }
}

impl Inner {
    /// Rows `rows` of group `g`, decoded whole (projected columns) and kept, or from the
    /// kept ones, or from the spill. Once: batches fetched at once that want the same group
    /// wait for one decode.
    pub(super) async fn decoded(&self, g: usize, rows: &[usize]) -> Result<Vec<Sample>> {
        let _one = self.loading[g].lock().await;
        if let Some(b) = self.kept(g, rows) {
            return rows.iter().map(|&row| self.whole_row(g, &b, row)).collect();
        }
        if let Some(got) = self.spilled(g, rows).await {
            return got;
        }
        let batch = self.decode(g).await?;
        let out = rows.iter().map(|&row| self.whole_row(g, &batch, row)).collect::<Result<Vec<_>>>();
        self.keep_on_disk(g, &batch);
        let evicted = self.decoded.lock().unwrap_or_else(|e| e.into_inner()).put(g, batch, rows, self.spill.is_some());
        for e in evicted {
            self.spill_group(e).await;
        }
        out
    }

    /// Start writing group `g`, just decoded, to the spill in the background, so that the
    /// next pass over it (the next epoch, sequential or not) reads it back instead of
    /// decoding it again; the write costs one copy, the decode several and a decompression.
    /// A group read again while being written waits for nothing: it is still kept.
    pub(super) fn keep_on_disk(&self, g: usize, whole: &Arc<Whole>) {
        let Some(spill) = self.spill.clone() else { return };
        let mut writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        writes.retain(|(w, _)| !w.is_finished());
        // Each write holds its group in memory until it is on disk: where the disk is slower
        // than decoding, groups are decoded again later rather than piling up in memory.
        let size = whole.memory_size();
        let pending: usize = writes.iter().map(|(_, n)| n).sum();
        if spill.has((g, 0)) || (!writes.is_empty() && pending + size > self.max_writing) {
            return;
        }
        let Some(all) = self.spill_rows(g, whole) else { return };
        writes.push((tokio::spawn(async move { spill.put((g, 0), all).await }), size));
    }

    /// After a batch read groups `first..=last`: when reads go through the groups in order
    /// (this batch starts where the last one ended, or at the start), decode the next
    /// [`Inner::ahead`] groups in the background, one per core, so that a sequential pass
    /// keeps every core decoding instead of waiting for one group at a time.
    pub(super) fn decode_ahead(self: &Arc<Self>, first: usize, last: usize) {
        let before = self.last_group.swap(last, Relaxed);
        let in_order = if before == usize::MAX { first == 0 } else { first == before || first == before + 1 };
        if !in_order || self.ahead == 0 {
            return;
        }
        for g in last + 1..(last + 1 + self.ahead).min(self.groups.len()) {
            // A whole group is always decoded whole (`Inner::whole`): no check for that here.
            if self.queued[g].swap(true, Relaxed) {
                continue;
            }
            let me = self.clone();
            tokio::spawn(async move {
                let done = me.kept(g, &[]).is_some() || me.spill.as_ref().is_some_and(|s| s.has((g, 0)));
                if !done {
                    // An error is the batches' to report, when they read this group.
                    let _ = me.decoded(g, &[]).await;
                }
                me.queued[g].store(false, Relaxed);
            });
        }
    }

    /// Group `g` kept decoded, marking `rows` read.
    pub(super) fn kept(&self, g: usize, rows: &[usize]) -> Option<Arc<Whole>> {
        self.decoded.lock().unwrap_or_else(|e| e.into_inner()).get(g, rows)
    }

    /// Rows `rows` of group `g` from the spill, when it is there.
    pub(super) async fn spilled(&self, g: usize, rows: &[usize]) -> Option<Result<Vec<Sample>>> {
        self.spill.as_ref()?.get((g, 0), rows).await
    }

    /// Write evicted group `g` to the spill as samples (all of them, or none: a value that
    /// does not convert is reported when its row is read, from a decode again).
    pub(super) async fn spill_group(&self, g: usize) {
        let batch = self.decoded.lock().unwrap_or_else(|e| e.into_inner()).get(g, &[]);
        if let (Some(spill), Some(batch)) = (&self.spill, batch) {
            let all = self.spill_rows(g, &batch);
            drop(batch);
            if let Some(all) = all {
                spill.put((g, 0), all).await;
            }
        }
        self.decoded.lock().unwrap_or_else(|e| e.into_inner()).spilled(g);
    }

    /// Group `g`'s rows as samples to write to the spill, or `None` where they are not worth
    /// it: where a value does not convert (reported when its row is read, from a decode
    /// again), or where the samples are over 64 MiB and 16 times the group's Arrow arrays
    /// (numbers as text, booleans as bytes, grow a few times). A column kept as a dictionary
    /// gives every row its entry (shared, not copied, in memory), so a few KB of file could
    /// write gigabytes to the disk; such a group decodes again quickly, to a few arrays.
    fn spill_rows(&self, g: usize, whole: &Whole) -> Option<Vec<Sample>> {
        let most = (whole.memory_size() as u64).saturating_mul(16).max(64 << 20);
        let mut total = 0u64;
        let mut all = Vec::with_capacity(whole.num_rows());
        for r in 0..whole.num_rows() {
            let s = self.whole_row(g, whole, r).ok()?;
            total = total.saturating_add(s.total_bytes());
            if total > most {
                return None;
            }
            all.push(s);
        }
        Some(all)
    }

    /// Row `row` of group `g` decoded whole, as a sample.
    pub(super) fn whole_row(&self, g: usize, whole: &Whole, row: usize) -> Result<Sample> {
        let (batch, r) = whole.row(row).ok_or_else(|| Error::internal(format!("parquet: no row {row}")))?;
        self.sample_of(g, batch, r, row)
    }

    /// Group `g` decoded whole (projected columns), in record batches of about
    /// [`WHOLE_BATCH_BYTES`], kept as they come (no copy into one batch the size of the group).
    pub(super) async fn decode(&self, g: usize) -> Result<Arc<Whole>> {
        let group = &self.groups[g];
        let file = &self.files[group.file];
        let per_row = usize::try_from(group.bytes).unwrap_or(0) / group.rows.max(1);
        let batch_rows = (WHOLE_BATCH_BYTES / per_row.max(1)).clamp(1, group.rows.max(1));
        let batches = self.read_batches(g, None, batch_rows).await?;
        let mut starts = Vec::with_capacity(batches.len());
        let mut at = 0usize;
        for b in &batches {
            starts.push(at);
            at += b.num_rows();
        }
        if at != group.rows {
            let why = format!("{} rows decoded where the footer says {}", at, group.rows);
            return Err(corrupt(&self.store.describe(&file.path), group.group, &why));
        }
        Ok(Arc::new(Whole { batches, starts }))
    }
}
