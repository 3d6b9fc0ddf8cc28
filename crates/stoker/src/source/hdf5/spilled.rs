//! Compressed chunks decoded once a run: the rows of a chunked, filtered (gzip, LZF, ...)
//! dataset are decoded a chunk at a time, and in a shuffled order a chunk of 16 rows is wanted
//! by 16 batches far apart, long after the decoded-chunk memory has dropped it. So the first
//! read of a chunk's rows decodes all of them (every column) and writes them to the source's
//! spill ([`crate::source::spill`]); every later read of those rows is one `pread` of the
//! spill. An epoch decodes each chunk once, whatever the order (h5py decodes a chunk for every
//! row its 1 MiB chunk cache misses). Without a spill (`disk_cache=false`), or when the spill
//! is full, rows are read through the reader and its chunk cache as before.

use std::sync::Arc;

use hdf5_reader::{Dataset, Hdf5File};

use super::column::Column;
use super::storage::guarded;
use super::Inner;
use crate::error::{Error, Result};
use crate::sample::Sample;

/// The most rows one unit holds, whatever a chunk's first dimension says: a unit is decoded
/// whole for one row, and held whole while it is written.
const MAX_UNIT_ROWS: u64 = 1024;
/// Units decoded in one blocking call: a batch of rows spread over many chunks holds no more
/// than this many units' rows in memory at once.
const UNITS_AT_ONCE: usize = 8;

/// The rows of a spilled unit of a file: the first-dimension chunk size of its chunked and
/// filtered dataset with the most bytes per row (the one whose decoding costs most). `None`
/// when no dataset is chunked and filtered: its rows read straight, or cheaply, from the file.
pub(super) fn unit_rows(h5: &Hdf5File, sets: &[Dataset], columns: &[Column]) -> Option<u64> {
    use hdf5_reader::messages::layout::DataLayout;
    use hdf5_reader::messages::HdfMessage;
    let mut best: Option<(usize, u64)> = None; // (bytes a row, rows a chunk)
    for (set, c) in sets.iter().zip(columns) {
        let Ok(header) = h5.get_or_parse_header(set.address()) else { continue };
        let (mut chunk, mut filtered) = (None, false);
        for m in &header.messages {
            match m {
                HdfMessage::DataLayout(l) => {
                    if let DataLayout::Chunked { dims, .. } = &l.layout {
                        chunk = dims.first().copied();
                    }
                }
                HdfMessage::FilterPipeline(p) => filtered = !p.filters.is_empty(),
                _ => {}
            }
        }
        if let (Some(rows), true) = (chunk, filtered) {
            // Variable-length rows have no fixed size: the least weight.
            let weight = c.row_bytes().unwrap_or(1);
            if best.is_none_or(|(w, _)| weight > w) {
                best = Some((weight, u64::from(rows)));
            }
        }
    }
    best.map(|(_, rows)| rows.clamp(1, MAX_UNIT_ROWS))
}

impl Inner {
    /// Rows `rows` (ascending, distinct) of file `f`, in that order: from the spill where their
    /// unit is there, else their units decoded whole and spilled.
    pub(super) async fn read_file(self: &Arc<Self>, f: usize, rows: Vec<u64>) -> Result<Vec<Sample>> {
        let (Some(spill), Some(unit)) = (self.spill.clone(), self.files[f].unit) else {
            return self.read_blocking(f, rows).await;
        };
        let total = self.files[f].rows as u64;
        let span = |k: u64| k * unit..((k + 1) * unit).min(total);
        let mut out: Vec<Option<Sample>> = vec![None; rows.len()];
        // (unit, the positions in `rows` of its rows), units not spilled.
        let mut missing: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
        let mut at = 0;
        while at < rows.len() {
            let k = rows[at] / unit;
            let end = at + rows[at..].partition_point(|&r| r / unit == k);
            let local: Vec<usize> = rows[at..end].iter().map(|&r| (r - k * unit) as usize).collect();
            match spill.get((f, k as usize), &local).await {
                Some(got) => {
                    for (slot, s) in out[at..end].iter_mut().zip(got?) {
                        *slot = Some(s);
                    }
                }
                None => missing.push((k, at..end)),
            }
            at = end;
        }
        for group in missing.chunks(UNITS_AT_ONCE) {
            let all: Vec<u64> = group.iter().flat_map(|(k, _)| span(*k)).collect();
            let decoded = match self.read_blocking(f, all).await {
                Ok(d) => d,
                // A damaged chunk among the unit's rows: read only the rows asked for, so the
                // error (or the rows) are theirs, as without a spill.
                Err(_) => {
                    for (_, pos) in group {
                        let got = self.read_blocking(f, rows[pos.clone()].to_vec()).await?;
                        for (slot, s) in out[pos.clone()].iter_mut().zip(got) {
                            *slot = Some(s);
                        }
                    }
                    continue;
                }
            };
            let mut decoded = decoded.into_iter();
            for (k, pos) in group {
                let samples: Vec<Sample> = decoded.by_ref().take(span(*k).count()).collect();
                for (slot, &r) in out[pos.clone()].iter_mut().zip(&rows[pos.clone()]) {
                    *slot = samples.get((r - k * unit) as usize).cloned();
                }
                spill.put((f, *k as usize), samples).await;
            }
        }
        out.into_iter().map(|s| s.ok_or_else(|| Error::internal("an HDF5 row not read"))).collect()
    }

    /// Rows `rows` (ascending, distinct) of file `f`, read through the reader on a blocking thread.
    pub(super) async fn read_blocking(self: &Arc<Self>, f: usize, rows: Vec<u64>) -> Result<Vec<Sample>> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let shown = me.store.describe(&me.files[f].path);
            guarded(&shown, || me.read_rows(f, &rows))
        })
        .await
        .map_err(Error::task)?
    }
}
