//! Batches: per field one contiguous buffer plus offsets (an Arrow-style binary column), the
//! keys and the sample indices, all in recycled storage.
//!
//! Sources write sample bytes straight into a [`BatchBuilder`] (one copy from storage to the
//! batch), and when a [`Batch`] drops its buffers go back to the [`BatchPool`]: in steady
//! state building a batch allocates nothing.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::decode::Dtype;
use crate::pinned::{DeviceBatch, GpuCopier, HostBuffer, HostPool, PinnedError};
use crate::sample::Sample;

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

/// Where a column's bytes live: ordinary memory, or a (page-locked, when CUDA is on) buffer
/// from a [`HostPool`] that can be copied to the GPU without staging.
#[derive(Debug)]
enum Storage {
    Heap(Vec<u8>),
    Host(HostBuffer),
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Heap(Vec::new())
    }
}

impl Storage {
    fn capacity(&self) -> usize {
        match self {
            Storage::Heap(v) => v.len(),
            Storage::Host(h) => h.capacity(),
        }
    }

    fn bytes(&self, len: usize) -> &[u8] {
        match self {
            Storage::Heap(v) => &v[..len],
            Storage::Host(h) => &h[..len],
        }
    }

    fn bytes_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        match self {
            Storage::Heap(v) => &mut v[range],
            // Waits for an earlier GPU copy out of this buffer before it is overwritten.
            Storage::Host(h) => &mut h[range],
        }
    }
}

/// One field across a batch.
#[derive(Debug, Default)]
struct Column {
    name: Option<Arc<str>>,
    /// Values back to back in `buf[..len]`; `buf` only grows, so reuse never reallocates.
    buf: Storage,
    len: usize,
    /// `offsets[i]..offsets[i + 1]` is sample `i`'s value.
    offsets: Vec<u64>,
    /// Samples that lack this field (their value is empty).
    missing: usize,
    /// Set for fixed-width (decoded) columns.
    ty: Option<Arc<ColumnType>>,
}

impl Column {
    fn reset(&mut self, name: Arc<str>) {
        self.name = Some(name);
        self.ty = None;
        self.len = 0;
        self.offsets.clear();
        self.offsets.push(0);
        self.missing = 0;
    }

    /// Close rows up to `rows` (exclusive), marking rows without a value as missing.
    fn pad_to(&mut self, rows: usize) {
        while self.offsets.len() < rows + 1 {
            self.offsets.push(self.len as u64);
            self.missing += 1;
        }
    }
}

/// Reusable storage of a batch.
#[derive(Debug, Default)]
struct Shell {
    indices: Vec<u64>,
    keys: String,
    key_ends: Vec<usize>,
    columns: Vec<Column>,
    used: usize,
}

/// Recycles batch storage. Cloning shares the pool.
#[derive(Clone, Debug, Default)]
pub struct BatchPool {
    free: Arc<Mutex<Vec<Shell>>>,
    max_kept: usize,
    host: Option<HostPool>,
    spills: Arc<AtomicU64>,
}

impl BatchPool {
    /// A pool that keeps up to `max_kept` idle batches' storage.
    pub fn new(max_kept: usize) -> Self {
        BatchPool { free: Arc::default(), max_kept: max_kept.max(1), host: None, spills: Arc::default() }
    }

    /// Like [`new`](Self::new), with columns written straight into buffers of `host` (pinned
    /// when it was made for a device). A column larger than one buffer, or one for which no
    /// buffer is free, lives in ordinary memory instead ("spills", counted).
    pub fn with_host_pool(max_kept: usize, host: HostPool) -> Self {
        BatchPool { host: Some(host), ..Self::new(max_kept) }
    }

    /// Columns that could not use a host-pool buffer.
    pub fn spills(&self) -> u64 {
        self.spills.load(Relaxed)
    }

    /// The host buffer pool, when batches are assembled into one.
    pub fn host_pool(&self) -> Option<&HostPool> {
        self.host.as_ref()
    }

    /// Idle batch storages held for reuse.
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Start a batch in recycled storage.
    pub fn builder(&self) -> BatchBuilder {
        let mut shell = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default();
        shell.indices.clear();
        shell.keys.clear();
        shell.key_ends.clear();
        shell.used = 0;
        BatchBuilder { shell, pool: Some(self.clone()), open: false }
    }

    /// Assemble already-read samples (drawn from `indices`) into a batch (one copy each).
    pub fn assemble(&self, epoch: u64, number: u64, indices: &[u64], samples: &[Sample]) -> Batch {
        let mut b = self.builder();
        for (s, &i) in samples.iter().zip(indices) {
            b.push_sample(i, s);
        }
        b.finish(epoch, number)
    }

    fn give(&self, shell: Shell) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max_kept {
            free.push(shell);
        }
    }
}

/// A batch being written: sources append samples, field by field, straight into the column
/// buffers. Columns appear in order of first appearance.
///
/// `BatchBuilder::default()` is an unpooled builder that allocates nothing until written.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    shell: Shell,
    pool: Option<BatchPool>,
    open: bool,
}

impl BatchBuilder {
    /// Rows added so far.
    pub fn rows(&self) -> usize {
        self.shell.key_ends.len()
    }

    /// Start the next sample: its source index and key.
    pub fn begin(&mut self, index: u64, key: &str) {
        self.close_row();
        self.shell.indices.push(index);
        self.shell.keys.push_str(key);
        self.shell.key_ends.push(self.shell.keys.len());
        self.open = true;
    }

    /// Like [`begin`](Self::begin) with a byte key (LMDB), decoded lossily.
    pub fn begin_bytes(&mut self, index: u64, key: &[u8]) {
        match std::str::from_utf8(key) {
            Ok(k) => self.begin(index, k),
            Err(_) => self.begin(index, &String::from_utf8_lossy(key)),
        }
    }

    /// Space for the current sample's field `name`, `len` bytes, to be filled by the caller.
    /// Its contents are stale until written.
    pub fn field(&mut self, name: &Arc<str>, len: usize) -> &mut [u8] {
        let row = self.rows() - 1;
        let s = &mut self.shell;
        // Sources hand out shared name pointers, so a pointer match usually settles it.
        let same = |c: &Column| c.name.as_ref().is_some_and(|n| Arc::ptr_eq(n, name) || **n == **name);
        let c = match s.columns[..s.used].iter().position(same) {
            Some(c) => c,
            None => {
                if s.used == s.columns.len() {
                    s.columns.push(Column::default());
                }
                s.columns[s.used].reset(name.clone());
                s.used += 1;
                s.used - 1
            }
        };
        let col = &mut s.columns[c];
        col.pad_to(row);
        let start = col.len;
        let end = start + len;
        if col.buf.capacity() < end {
            self.grow(c, end);
        }
        let col = &mut self.shell.columns[c];
        col.len = end;
        col.offsets.push(end as u64);
        col.buf.bytes_mut(start..end)
    }

    /// A fixed-width column `name` of type `ty` over every row added so far, to be filled by
    /// the caller: row `i` is `[i * ty.row_bytes(), (i + 1) * ty.row_bytes())`. Call after the
    /// last [`begin`](Self::begin); its contents are stale until written.
    pub fn fixed(&mut self, name: &Arc<str>, ty: &Arc<ColumnType>) -> &mut [u8] {
        self.close_row();
        let rows = self.rows();
        let width = ty.row_bytes();
        let s = &mut self.shell;
        let c = match s.columns[..s.used].iter().position(|c| c.name.as_deref() == Some(&**name)) {
            Some(c) => c,
            None => {
                if s.used == s.columns.len() {
                    s.columns.push(Column::default());
                }
                s.used += 1;
                s.used - 1
            }
        };
        s.columns[c].reset(name.clone());
        let end = rows * width;
        if s.columns[c].buf.capacity() < end {
            self.grow(c, end);
        }
        let col = &mut self.shell.columns[c];
        col.ty = Some(ty.clone());
        col.len = end;
        col.offsets.extend((1..=rows).map(|i| (i * width) as u64));
        col.buf.bytes_mut(0..end)
    }

    /// Make column `c` hold at least `end` bytes, keeping what it has.
    fn grow(&mut self, c: usize, end: usize) {
        let host = self.pool.as_ref().and_then(|p| p.host.as_ref().map(|h| (h, &p.spills)));
        let col = &mut self.shell.columns[c];
        if let (Storage::Heap(v), Some((host, spills))) = (&col.buf, host) {
            if v.is_empty() {
                // A fresh column slot: try a host buffer first.
                match host.try_acquire() {
                    Some(h) if h.capacity() >= end => {
                        col.buf = Storage::Host(h);
                        return;
                    }
                    _ => {
                        spills.fetch_add(1, Relaxed);
                    }
                }
            }
        }
        if let Storage::Host(h) = &col.buf {
            if let Some((_, spills)) = host {
                spills.fetch_add(1, Relaxed);
            }
            let mut v = vec![0u8; end.max(h.capacity() * 2)];
            v[..col.len].copy_from_slice(&h[..col.len]);
            col.buf = Storage::Heap(v);
            return;
        }
        if let Storage::Heap(v) = &mut col.buf {
            // Grows to the largest column seen (doubling), then is reused as is.
            v.resize(end.max(v.len() * 2), 0);
        }
    }

    /// Begin `sample` and copy in its fields except those `skip` names (decoded ones, which
    /// get fixed-width columns afterwards).
    pub fn push_raw(&mut self, index: u64, sample: &Sample, skip: impl Fn(&str) -> bool) {
        self.begin(index, &sample.key);
        for f in sample.fields.iter().filter(|f| !skip(&f.name)) {
            self.field(&f.name, f.data.len()).copy_from_slice(&f.data);
        }
    }

    /// Copy a whole sample in.
    pub fn push_sample(&mut self, index: u64, sample: &Sample) {
        self.begin(index, &sample.key);
        for f in &sample.fields {
            self.field(&f.name, f.data.len()).copy_from_slice(&f.data);
        }
    }

    fn close_row(&mut self) {
        if self.open {
            let rows = self.rows();
            let s = &mut self.shell;
            for col in &mut s.columns[..s.used] {
                col.pad_to(rows);
            }
            self.open = false;
        }
    }

    /// Drop the sample begun last (a source that failed half-way through it).
    pub fn abandon_row(&mut self) {
        if !self.open {
            return;
        }
        let rows = self.rows();
        let s = &mut self.shell;
        for col in &mut s.columns[..s.used] {
            if col.offsets.len() == rows + 1 {
                col.offsets.pop();
                col.len = *col.offsets.last().unwrap_or(&0) as usize;
            }
        }
        s.indices.pop();
        s.key_ends.pop();
        s.keys.truncate(s.key_ends.last().copied().unwrap_or(0));
        self.open = false;
    }

    /// Seal the batch.
    pub fn finish(mut self, epoch: u64, number: u64) -> Batch {
        self.close_row();
        let shell = std::mem::take(&mut self.shell);
        Batch {
            epoch,
            number,
            shell: Some(shell),
            pool: self.pool.take().unwrap_or_default(),
            device: Vec::new(),
            staged: Vec::new(),
        }
    }
}

impl Drop for BatchBuilder {
    fn drop(&mut self) {
        // An unfinished builder (an error mid-batch) still returns its storage.
        if let Some(pool) = &self.pool {
            pool.give(std::mem::take(&mut self.shell));
        }
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
        let s = self.shell();
        s.columns[..s.used].iter().find(|c| c.name.as_deref() == Some(name)).map(|c| self.view(c))
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
        if let Some(shell) = self.shell.take() {
            self.pool.give(shell);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(key: &str, fields: &[(&str, &[u8])]) -> Sample {
        Sample {
            key: key.into(),
            fields: fields
                .iter()
                .map(|(n, d)| crate::sample::Field { name: (*n).into(), data: bytes::Bytes::copy_from_slice(d) })
                .collect(),
        }
    }

    #[test]
    fn columns_offsets_dense_and_missing() {
        let pool = BatchPool::new(4);
        // `png` first appears in the second sample and is missing from the first and third.
        let samples = [
            s("a", &[("jpg", b"12345"), ("cls", b"1")]),
            s("b", &[("jpg", b"xy"), ("png", b"P"), ("cls", b"2")]),
            s("c", &[("cls", b"3")]),
        ];
        let b = pool.assemble(0, 0, &[7, 8, 9], &samples);
        assert_eq!(b.len(), 3);
        assert_eq!(b.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(b.indices(), [7, 8, 9]);
        assert_eq!(b.field_names().collect::<Vec<_>>(), ["jpg", "cls", "png"]);
        let jpg = b.field("jpg").unwrap();
        assert_eq!(
            (jpg.get(0).unwrap(), jpg.get(1).unwrap(), jpg.get(2).unwrap()),
            (&b"12345"[..], &b"xy"[..], &b""[..])
        );
        assert_eq!((jpg.missing, jpg.len()), (1, 3));
        assert!(jpg.dense().is_none());
        let png = b.field("png").unwrap();
        assert_eq!((png.get(0).unwrap(), png.get(1).unwrap(), png.get(2).unwrap()), (&b""[..], &b"P"[..], &b""[..]));
        assert_eq!((png.missing, png.len()), (2, 3));
        assert_eq!(b.field("cls").unwrap().dense(), Some((&b"123"[..], 1)));
        assert_eq!(b.payload_bytes(), 11);
        assert!(b.field("gif").is_none());
    }

    #[test]
    fn storage_is_recycled_and_abandoned_rows_vanish() {
        let pool = BatchPool::new(2);
        let samples = [s("a", &[("x", &[1u8; 1000])])];
        let first = pool.assemble(0, 0, &[0], &samples);
        let ptr = first.field("x").unwrap().data.as_ptr();
        drop(first);
        assert_eq!(pool.idle(), 1);
        let again = pool.assemble(0, 1, &[0], &samples);
        assert_eq!(again.field("x").unwrap().data.as_ptr(), ptr, "the same buffer is reused");
        drop(again);
        let mut b = pool.builder();
        b.push_sample(0, &samples[0]);
        b.begin(1, "half");
        b.field(&"x".into(), 3).copy_from_slice(b"bad");
        b.abandon_row();
        let partial = b.finish(0, 1);
        assert_eq!((partial.len(), partial.payload_bytes(), partial.keys().collect::<Vec<_>>()), (1, 1000, vec!["a"]));
        drop(partial);
        let other = pool.assemble(0, 2, &[1], &[s("b", &[("y", b"z")])]);
        assert_eq!(other.field_names().collect::<Vec<_>>(), ["y"]);
    }
}
