//! Batches: per field one contiguous buffer plus offsets (an Arrow-style binary column), the
//! keys and the sample indices, all in recycled storage.
//!
//! Sources write sample bytes straight into a [`BatchBuilder`] (one copy from storage to the
//! batch), and when a [`Batch`] drops its buffers go back to the [`BatchPool`]: in steady
//! state building a batch allocates nothing.

use std::sync::Arc;

use crate::pinned::{DeviceBatch, GpuCopier, HostBuffer, PinnedError};

mod builder;
mod dtype;
mod pool;
mod storage;
#[cfg(test)]
mod tests;

pub use builder::{BatchBuilder, ColumnTooLarge};
pub use dtype::Dtype;
pub use pool::BatchPool;

use storage::{Column, Shell, Storage};

/// What a fixed-width column holds: each sample's value is one `dtype` array of `shape`
/// (native byte order), so the column is one dense `[rows, *shape]` array. Decoded fields
/// have one for the whole run; raw byte fields have none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ColumnType {
    /// Element type.
    pub dtype: Dtype,
    /// Shape of one sample's value.
    pub shape: Vec<usize>,
}

impl ColumnType {
    /// A column type (shared: batches refer to it without copying).
    pub fn new(dtype: Dtype, shape: Vec<usize>) -> Arc<Self> {
        Arc::new(ColumnType { dtype, shape })
    }

    /// Bytes of one sample's value.
    pub fn row_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// A batch of samples in columnar form. Dropping it recycles its storage.
#[derive(Debug)]
pub struct Batch {
    /// The epoch it belongs to.
    pub epoch: u64,
    /// Its position in the epoch run (0 for the first batch the run delivers).
    pub number: u64,
    shell: Option<Shell>,
    pool: BatchPool,
    /// Per column (same order as `fields()`), its copy on the GPU, once made.
    device: Vec<DeviceBatch>,
    /// Staging buffers for columns that were not in host-pool memory; kept until the copy
    /// out of them has completed (they are fenced and return to their pool after that).
    staged: Vec<HostBuffer>,
    /// The process generation it was made in ([`crate::fork`]).
    born: u32,
    /// The column after the one [`field`](Self::field) found last: callers that ask for
    /// every field in order (the Python batch's conversion) find each in O(1), not by a scan
    /// of all columns.
    next_field: std::sync::atomic::AtomicUsize,
}

/// One field across a batch: contiguous values plus offsets.
#[derive(Clone, Copy, Debug)]
pub struct FieldColumn<'a> {
    /// The field name.
    pub name: &'a str,
    /// All values back to back.
    pub data: &'a [u8],
    /// `offsets[i]..offsets[i + 1]` is sample `i`'s value in `data`; `len() + 1` entries.
    pub offsets: &'a [u64],
    /// Samples that lack this field (their value is empty).
    pub missing: usize,
    /// For a fixed-width (decoded) column: dtype and per-sample shape, the same in every
    /// batch of the run. `None` for raw bytes, whose lengths may differ batch to batch.
    pub ty: Option<&'a ColumnType>,
}

impl<'a> FieldColumn<'a> {
    /// Sample `i`'s value.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let (a, b) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.data.get(a as usize..b as usize)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Whether the column has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When every sample has this field with the same length `L`: `(data, L)`, a dense
    /// `[len, L]` row-major array.
    pub fn dense(&self) -> Option<(&'a [u8], usize)> {
        if self.missing > 0 || self.is_empty() {
            return None;
        }
        let width = self.offsets[1] - self.offsets[0];
        let uniform = self.offsets.windows(2).all(|w| w[1] - w[0] == width);
        uniform.then_some((self.data, width as usize))
    }
}

impl Batch {
    fn shell(&self) -> &Shell {
        self.shell.as_ref().expect("a batch holds its storage until dropped")
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.shell().key_ends.len()
    }

    /// Whether the batch is empty (only when every sample of it was skipped).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The source indices of the samples, in batch order.
    pub fn indices(&self) -> &[u64] {
        &self.shell().indices
    }

    /// Add `by` to every index: a batch of a part of a source, numbered as the whole
    /// ([`LoaderConfig::first_index`](crate::loader::LoaderConfig::first_index)).
    pub(crate) fn shift_indices(&mut self, by: u64) {
        if let Some(s) = self.shell.as_mut() {
            s.indices.iter_mut().for_each(|i| *i = i.saturating_add(by));
        }
    }

    /// Sample `i`'s key.
    pub fn key(&self, i: usize) -> Option<&str> {
        let s = self.shell();
        let end = *s.key_ends.get(i)?;
        let start = if i == 0 { 0 } else { s.key_ends[i - 1] };
        s.keys.get(start..end)
    }

    /// All keys in batch order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.key(i))
    }

    /// Field names in column order.
    pub fn field_names(&self) -> impl Iterator<Item = &str> {
        let s = self.shell();
        s.columns[..s.used].iter().map(|c| c.name.as_deref().unwrap_or_default())
    }

    fn view<'a>(&'a self, col: &'a Column) -> FieldColumn<'a> {
        FieldColumn {
            name: col.name.as_deref().unwrap_or_default(),
            data: col.buf.bytes(col.len),
            offsets: &col.offsets,
            missing: col.missing,
            ty: col.ty.as_deref(),
        }
    }

    /// The column of field `name`.
    pub fn field(&self, name: &str) -> Option<FieldColumn<'_>> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = self.shell();
        let columns = &s.columns[..s.used];
        let hint = self.next_field.load(Relaxed);
        let at = match columns.get(hint) {
            Some(c) if c.name.as_deref() == Some(name) => Some(hint),
            _ => columns.iter().position(|c| c.name.as_deref() == Some(name)),
        }?;
        self.next_field.store(at + 1, Relaxed);
        Some(self.view(&columns[at]))
    }

    /// The columns in order.
    pub fn fields(&self) -> impl Iterator<Item = FieldColumn<'_>> {
        let s = self.shell();
        s.columns[..s.used].iter().map(|c| self.view(c))
    }

    /// Payload bytes (sum of all values).
    pub fn payload_bytes(&self) -> u64 {
        let s = self.shell();
        s.columns[..s.used].iter().map(|c| c.len as u64).sum()
    }
}

impl Batch {
    /// Queue every column's copy to the GPU on the copier's stream. Columns already in
    /// host-pool buffers are copied from there; others are staged through a buffer of the
    /// pool first. Returns when the copies are queued, not done: see [`device`](Self::device).
    pub fn copy_to_device(&mut self, copier: &GpuCopier) -> Result<(), PinnedError> {
        let host = self.pool.host.clone();
        let shell = self.shell.as_mut().expect("a batch holds its storage until dropped");
        self.device.clear();
        for col in &mut shell.columns[..shell.used] {
            let len = col.len;
            let batch = match &mut col.buf {
                Storage::Host(h) => {
                    h.set_len(len)?;
                    copier.copy(h)?
                }
                Storage::Heap(v) => {
                    let host = host.as_ref().ok_or_else(|| PinnedError::Config {
                        message: "copying to the GPU needs a host buffer pool".into(),
                    })?;
                    let mut stage = host.acquire()?;
                    stage.set_len(len)?;
                    stage[..len].copy_from_slice(&v[..len]);
                    let d = copier.copy(&mut stage)?;
                    self.staged.push(stage);
                    d
                }
            };
            self.device.push(batch);
        }
        Ok(())
    }

    /// The GPU copy of field `name`, after [`copy_to_device`](Self::copy_to_device): wait on
    /// its event (or make the compute stream wait on it) before reading it.
    pub fn device(&self, name: &str) -> Option<&DeviceBatch> {
        let s = self.shell();
        let at = s.columns[..s.used].iter().position(|c| c.name.as_deref() == Some(name))?;
        self.device.get(at)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if self.born != crate::fork::generation() {
            // Made in the parent of this forked process: its pool's lock may have been held by
            // a parent thread at the fork, and its device memory is not this process's. Left
            // as it is (the pool kept alive too, so nothing of it is dropped here).
            std::mem::forget((self.shell.take(), self.pool.clone()));
            std::mem::forget(std::mem::take(&mut self.device));
            std::mem::forget(std::mem::take(&mut self.staged));
            return;
        }
        if let Some(shell) = self.shell.take() {
            self.pool.give(shell);
        }
    }
}
