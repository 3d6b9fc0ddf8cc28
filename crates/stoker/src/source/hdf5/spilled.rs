//! Compressed chunks decoded once a run: the rows of a chunked, filtered (gzip, LZF, ...)
//! dataset are decoded a chunk at a time, and in a shuffled order a chunk of 16 rows is wanted
//! by 16 batches far apart, long after the decoded-chunk memory has dropped it. So the first
//! read of a chunk's rows decodes all of them (every column) and writes them to the source's
//! spill ([`crate::source::spill`]); every later read of those rows is one `pread` of the
//! spill. An epoch decodes each chunk once, whatever the order (h5py decodes a chunk for every
//! row its 1 MiB chunk cache misses). Without a spill (`disk_cache=false`), when the spill is
//! full or failed, or when the compressed datasets are not most of a row (a gzip'd label
//! beside large raw images would read a unit of images to return one), rows are read through
//! the reader and its chunk cache as before.

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
/// The most bytes (of fixed-size fields) one unit holds: fewer rows than the chunk when rows
/// are large.
const MAX_UNIT_BYTES: u64 = 16 << 20;
/// The most bytes of units one blocking call decodes: a batch spread over many chunks holds
/// no more than this at once (and always one unit).
const MAX_CALL_BYTES: u64 = 64 << 20;

/// A file's units: rows each, and the bytes of a row's fixed-size fields.
#[derive(Clone, Copy, Debug)]
pub(super) struct Units {
    pub(super) rows: u64,
    row_bytes: u64,
}

/// The units of a file: the first-dimension chunk size of its chunked and filtered dataset
/// with the most bytes per row (the one whose decoding costs most), held to
/// [`MAX_UNIT_BYTES`]. `None` when no dataset is chunked and filtered (rows read straight, or
/// cheaply, from the file), or when the others would cost more to read whole than those save:
/// a variable-length dataset not compressed (its size unknown), or fixed-size ones with more
/// bytes a row than the compressed ones.
pub(super) fn units(h5: &Hdf5File, sets: &[Dataset], columns: &[Column]) -> Option<Units> {
    use hdf5_reader::messages::layout::DataLayout;
    use hdf5_reader::messages::HdfMessage;
    let mut best: Option<(usize, u64)> = None; // (bytes a row, rows a chunk)
    let (mut compressed, mut other, mut compressed_varying) = (0usize, 0usize, false);
    for (set, c) in sets.iter().zip(columns) {
        let Ok(header) = h5.get_or_parse_header(set.address()) else { return None };
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
        match (chunk, filtered, c.row_bytes()) {
            (Some(rows), true, size) => {
                compressed += size.unwrap_or(0);
                compressed_varying |= size.is_none();
                // Variable-length rows have no fixed size: the least weight.
                let weight = size.unwrap_or(1);
                if best.is_none_or(|(w, _)| weight > w) {
                    best = Some((weight, u64::from(rows)));
                }
            }
            (_, _, Some(size)) => other += size,
            (_, _, None) => return None,
        }
    }
    let (_, chunk) = best?;
    if !compressed_varying && compressed < other {
        return None;
    }
    let row_bytes = (compressed + other) as u64;
    let rows = chunk.clamp(1, MAX_UNIT_ROWS).min((MAX_UNIT_BYTES / row_bytes.max(1)).max(1));
    Some(Units { rows, row_bytes })
}

impl Inner {
    /// Rows `rows` (ascending, distinct) of file `f`, in that order: from the spill where their
    /// unit is there, else their units decoded whole and spilled.
    pub(super) async fn read_file(self: &Arc<Self>, f: usize, rows: Vec<u64>) -> Result<Vec<Sample>> {
        let (Some(spill), Some(units)) = (self.spill.clone(), self.files[f].units) else {
            return self.read_blocking(f, rows).await;
        };
        let unit = units.rows;
        let total = self.files[f].rows as u64;
        let span = |k: u64| k * unit..((k + 1) * unit).min(total);
        let mut out: Vec<Option<Sample>> = vec![None; rows.len()];
        // Each unit asked for: (unit, the positions in `rows` of its rows, its rows in it).
        let mut asked: Vec<(u64, std::ops::Range<usize>, Vec<usize>)> = Vec::new();
        let mut at = 0;
        while at < rows.len() {
            let k = rows[at] / unit;
            let end = at + rows[at..].partition_point(|&r| r / unit == k);
            asked.push((k, at..end, rows[at..end].iter().map(|&r| (r - k * unit) as usize).collect()));
            at = end;
        }
        // The spilled ones read side by side (each a blocking read of its own).
        let reads = asked.iter().map(|(k, _, local)| spill.get((f, *k as usize), local));
        let read = futures::future::join_all(reads).await;
        // Units not spilled, or whose spill read failed: decoded (a decode costs time, a failed
        // read would cost the rows).
        let mut missing: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
        for ((k, pos, _), got) in asked.into_iter().zip(read) {
            match got {
                Some(Ok(got)) => {
                    for (slot, s) in out[pos].iter_mut().zip(got) {
                        *slot = Some(s);
                    }
                }
                _ => missing.push((k, pos)),
            }
        }
        if !missing.is_empty() && !spill.accepting() {
            // Nothing more will be spilled: decode only the rows asked for.
            self.read_asked(f, &rows, &missing, &mut out).await?;
            missing.clear();
        }
        let per_call = (MAX_CALL_BYTES / (unit * units.row_bytes).max(1)).max(1) as usize;
        for group in missing.chunks(per_call) {
            let all: Vec<u64> = group.iter().flat_map(|(k, _)| span(*k)).collect();
            let decoded = match self.read_blocking(f, all).await {
                Ok(d) => d,
                // A damaged chunk among the unit's rows: read only the rows asked for, so the
                // error (or the rows) are theirs, as without a spill.
                Err(_) => {
                    self.read_asked(f, &rows, group, &mut out).await?;
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

    /// The rows of `rows` at the positions `groups` name, read alone in one call (no unit
    /// decoded whole), into their slots of `out`.
    async fn read_asked(
        self: &Arc<Self>,
        f: usize,
        rows: &[u64],
        groups: &[(u64, std::ops::Range<usize>)],
        out: &mut [Option<Sample>],
    ) -> Result<()> {
        let asked: Vec<u64> = groups.iter().flat_map(|(_, pos)| rows[pos.clone()].iter().copied()).collect();
        let mut got = self.read_blocking(f, asked).await?.into_iter();
        for (_, pos) in groups {
            for slot in &mut out[pos.clone()] {
                *slot = got.next();
            }
        }
        Ok(())
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
