//! Writing a batch: samples appended field by field straight into the column buffers.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::storage::{Column, Shell, Storage};
use super::{Batch, BatchPool, ColumnType};
use crate::sample::Sample;

/// A batch being written: sources append samples, field by field, straight into the column
/// buffers. Columns appear in order of first appearance.
///
/// `BatchBuilder::default()` is an unpooled builder that allocates nothing until written.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    pub(super) shell: Shell,
    pub(super) pool: Option<BatchPool>,
    pub(super) open: bool,
    /// The column the current row's next field most likely goes to: samples of one source
    /// give their fields in one order, so a row's fields are matched in O(1) each, not by a
    /// scan of every column (a sample of 128k fields took half a minute).
    pub(super) next: usize,
    /// Column by name, once a batch has many: a field the hint misses (a row's first, new
    /// fields) is found without a scan of every column. Valid while it holds every column.
    pub(super) by_name: std::collections::HashMap<Arc<str>, usize>,
}

impl BatchBuilder {
    /// Rows added so far.
    pub fn rows(&self) -> usize {
        self.shell.key_ends.len()
    }

    /// Start the next sample: its source index and key.
    pub fn begin(&mut self, index: u64, key: &str) {
        self.begin_with(index, |keys| keys.push_str(key));
    }

    /// Like [`begin`](Self::begin), the key appended to the batch's keys by `key` (a key
    /// made per row, such as a token sequence's number, needs no string of its own).
    pub fn begin_with(&mut self, index: u64, key: impl FnOnce(&mut String)) {
        self.close_row();
        self.shell.indices.push(index);
        key(&mut self.shell.keys);
        self.shell.key_ends.push(self.shell.keys.len());
        self.open = true;
        self.next = 0;
    }

    /// Like [`begin`](Self::begin) with a byte key (LMDB), as the lossless text
    /// [`escape_key`](crate::sample::escape_key) gives: the same key [`Sample::key`] holds.
    pub fn begin_bytes(&mut self, index: u64, key: &[u8]) {
        self.begin(index, &crate::sample::escape_key(key));
    }

    /// Space for the current sample's field `name`, `len` bytes, to be filled by the caller.
    /// Its contents are stale until written.
    pub fn field(&mut self, name: &Arc<str>, len: usize) -> &mut [u8] {
        let row = self.rows() - 1;
        let s = &mut self.shell;
        // Sources hand out shared name pointers, so a pointer match usually settles it.
        let same = |c: &Column| c.name.as_ref().is_some_and(|n| Arc::ptr_eq(n, name) || **n == **name);
        let found = if s.columns[..s.used].get(self.next).is_some_and(same) {
            Some(self.next)
        } else if s.used <= 32 {
            s.columns[..s.used].iter().position(same)
        } else {
            if self.by_name.len() != s.used {
                self.by_name.clear();
                self.by_name
                    .extend(s.columns[..s.used].iter().enumerate().filter_map(|(i, c)| Some((c.name.clone()?, i))));
            }
            self.by_name.get(name).copied()
        };
        let c = match found {
            Some(c) => c,
            None => {
                if s.used == s.columns.len() {
                    s.columns.push(Column::default());
                }
                s.columns[s.used].reset(name.clone());
                if self.by_name.len() == s.used && s.used > 32 {
                    self.by_name.insert(name.clone(), s.used);
                }
                s.used += 1;
                s.used - 1
            }
        };
        self.next = c + 1;
        let col = &mut s.columns[c];
        col.pad_to(row);
        let start = col.len;
        let end = start + len;
        if col.buf.capacity() < end {
            // A value's bytes are already in memory, and a column at most doubles to hold them.
            if let Err(want) = self.grow(c, end) {
                match std::alloc::Layout::array::<u8>(want) {
                    Ok(layout) => std::alloc::handle_alloc_error(layout),
                    Err(_) => panic!("capacity overflow: a batch column of {want} bytes"),
                }
            }
        }
        let col = &mut self.shell.columns[c];
        col.len = end;
        col.offsets.push(end as u64);
        col.buf.bytes_mut(start..end)
    }

    /// A fixed-width column `name` of type `ty` over every row added so far, to be filled by
    /// the caller: row `i` is `[i * ty.row_bytes(), (i + 1) * ty.row_bytes())`. Call after the
    /// last [`begin`](Self::begin); its contents are stale until written. Fails, instead of
    /// aborting the process, when the column's bytes (rows times the row's, both chosen by the
    /// user: a batch of 8 images of 16384² pixels is 6.4 GB) cannot be allocated.
    pub fn fixed(&mut self, name: &Arc<str>, ty: &Arc<ColumnType>) -> Result<&mut [u8], ColumnTooLarge> {
        self.close_row();
        let rows = self.rows();
        let width = ty.row_bytes();
        let too_large = || ColumnTooLarge { name: name.clone(), rows, row_bytes: width };
        let end = rows.checked_mul(width).ok_or_else(too_large)?;
        let s = &mut self.shell;
        let (c, fresh) = match s.columns[..s.used].iter().position(|c| c.name.as_deref() == Some(&**name)) {
            Some(c) => (c, false),
            None => {
                if s.used == s.columns.len() {
                    s.columns.push(Column::default());
                }
                s.used += 1;
                (s.used - 1, true)
            }
        };
        s.columns[c].reset(name.clone());
        if s.columns[c].buf.capacity() < end && self.grow(c, end).is_err() {
            // The batch is left without the column (or with every row of it missing), not
            // with one of the wrong length.
            if fresh {
                self.shell.used -= 1;
            } else {
                self.shell.columns[c].pad_to(rows);
            }
            return Err(too_large());
        }
        let col = &mut self.shell.columns[c];
        col.ty = Some(ty.clone());
        col.len = end;
        col.offsets.extend((1..=rows).map(|i| (i * width) as u64));
        Ok(col.buf.bytes_mut(0..end))
    }

    /// Make column `c` hold at least `end` bytes, keeping what it has; `Err(bytes)` when the
    /// bytes wanted cannot be allocated.
    fn grow(&mut self, c: usize, end: usize) -> Result<(), usize> {
        let host = self.pool.as_ref().and_then(|p| p.host.as_ref().map(|h| (h, &p.spills)));
        let col = &mut self.shell.columns[c];
        if let (Storage::Heap(v), Some((host, spills))) = (&col.buf, host) {
            if v.is_empty() {
                // A fresh column slot: try a host buffer first.
                match host.try_acquire() {
                    Some(h) if h.capacity() >= end => {
                        col.buf = Storage::Host(h);
                        return Ok(());
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
            // Doubling first; exactly what is asked when that is more than there is.
            let mut v = zeroed(end.max(h.capacity() * 2)).or_else(|_| zeroed(end))?;
            v[..col.len].copy_from_slice(&h[..col.len]);
            col.buf = Storage::Heap(v);
            return Ok(());
        }
        if let Storage::Heap(v) = &mut col.buf {
            // Grows to the largest column seen (doubling), then is reused as is; new storage
            // starts at the size the field's column had in the pool's last batch, and an
            // eighth more (batches of varying samples would otherwise double half the time).
            // A new buffer is allocated zeroed, not zero-filled (memory fresh from the system
            // is zero already, and the allocator knows it), and only the bytes in use are
            // copied.
            let want = if v.is_empty() {
                let last = match (&self.pool, &col.name) {
                    (Some(p), Some(name)) => p.size_of(name),
                    _ => 0,
                };
                end.max(last + last / 8)
            } else {
                end.max(v.len() * 2)
            };
            let mut grown = zeroed(want).or_else(|_| zeroed(end))?;
            grown[..col.len].copy_from_slice(&v[..col.len]);
            *v = grown;
        }
        Ok(())
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
        if let Some(pool) = &self.pool {
            pool.note_sizes(&shell);
        }
        Batch {
            epoch,
            number,
            shell: Some(shell),
            pool: self.pool.take().unwrap_or_default(),
            device: Vec::new(),
            staged: Vec::new(),
            next_field: Default::default(),
            born: crate::fork::generation(),
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

/// `len` zero bytes, allocated zeroed (fresh pages from the system are zero already, so a
/// large column costs no fill), or `Err(len)` when they cannot be had.
fn zeroed(len: usize) -> Result<Vec<u8>, usize> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| len)?;
    // SAFETY: `layout` has a non-zero size; a non-null pointer from alloc_zeroed is `len`
    // initialised (zero) bytes allocated by the global allocator with u8's alignment, which
    // is what Vec::from_raw_parts requires for a Vec<u8> of that length and capacity.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return Err(len);
        }
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}

/// A fixed-width column of a batch too large to allocate (see [`BatchBuilder::fixed`]).
#[derive(Debug, Clone)]
pub struct ColumnTooLarge {
    /// The column.
    pub name: Arc<str>,
    /// The batch's rows.
    pub rows: usize,
    /// Bytes a row of it takes.
    pub row_bytes: usize,
}

/// The batch's error: the sizes chosen (batch size, image size, seq_len) ask more memory than
/// there is, which no sample is to blame for.
impl From<ColumnTooLarge> for crate::error::Error {
    fn from(e: ColumnTooLarge) -> Self {
        crate::error::Error::invalid_option(e.to_string())
    }
}

impl std::fmt::Display for ColumnTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot allocate column `{}` of a batch: {} rows of {} bytes ({:.1} GB); lower the batch size or the \
             decoded size (image size, seq_len)",
            self.name,
            self.rows,
            self.row_bytes,
            self.rows as f64 * self.row_bytes as f64 / 1e9
        )
    }
}
