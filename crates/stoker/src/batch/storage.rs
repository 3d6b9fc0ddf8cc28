//! Reusable batch storage: where a column's bytes live, the columns, and a batch's shell.

use std::sync::Arc;

use super::ColumnType;
use crate::pinned::HostBuffer;

/// Where a column's bytes live: ordinary memory, or a (page-locked, when CUDA is on) buffer
/// from a [`HostPool`](crate::pinned::HostPool) that can be copied to the GPU without staging.
#[derive(Debug)]
pub(super) enum Storage {
    Heap(Vec<u8>),
    Host(HostBuffer),
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Heap(Vec::new())
    }
}

impl Storage {
    pub(super) fn capacity(&self) -> usize {
        match self {
            Storage::Heap(v) => v.len(),
            Storage::Host(h) => h.capacity(),
        }
    }

    pub(super) fn bytes(&self, len: usize) -> &[u8] {
        match self {
            Storage::Heap(v) => &v[..len],
            Storage::Host(h) => &h[..len],
        }
    }

    pub(super) fn bytes_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        match self {
            Storage::Heap(v) => &mut v[range],
            // Waits for an earlier GPU copy out of this buffer before it is overwritten.
            Storage::Host(h) => &mut h[range],
        }
    }
}

/// One field across a batch.
#[derive(Debug, Default)]
pub(super) struct Column {
    pub(super) name: Option<Arc<str>>,
    /// Values back to back in `buf[..len]`; `buf` only grows, so reuse never reallocates.
    pub(super) buf: Storage,
    pub(super) len: usize,
    /// `offsets[i]..offsets[i + 1]` is sample `i`'s value.
    pub(super) offsets: Vec<u64>,
    /// Samples that lack this field (their value is empty).
    pub(super) missing: usize,
    /// Set for fixed-width (decoded) columns.
    pub(super) ty: Option<Arc<ColumnType>>,
}

impl Column {
    pub(super) fn reset(&mut self, name: Arc<str>) {
        self.name = Some(name);
        self.ty = None;
        self.len = 0;
        self.offsets.clear();
        self.offsets.push(0);
        self.missing = 0;
    }

    /// Close rows up to `rows` (exclusive), marking rows without a value as missing.
    pub(super) fn pad_to(&mut self, rows: usize) {
        while self.offsets.len() < rows + 1 {
            self.offsets.push(self.len as u64);
            self.missing += 1;
        }
    }
}

/// Reusable storage of a batch.
#[derive(Debug, Default)]
pub(super) struct Shell {
    pub(super) indices: Vec<u64>,
    pub(super) keys: String,
    pub(super) key_ends: Vec<usize>,
    pub(super) columns: Vec<Column>,
    pub(super) used: usize,
}
