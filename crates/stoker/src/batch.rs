//! Batches: per field one contiguous buffer plus offsets (an Arrow-style binary column), the
//! keys and sample indices, all in recycled storage.
//!
//! A batch's payload lives in one buffer (field columns one after another), so a GPU copy is
//! one transfer. When the batch drops, its buffer and vectors go back to the pool: in steady
//! state assembling a batch allocates nothing.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::sample::Sample;

/// Field columns start at this alignment inside the batch buffer, so dense views of them can
/// be reinterpreted without copies.
const ALIGN: usize = 64;

/// One field across a batch.
#[derive(Debug, Default)]
struct Column {
    name: Option<Arc<str>>,
    /// Byte range of this column in the batch buffer.
    range: Range<usize>,
    /// `offsets[i]..offsets[i + 1]` is sample `i`'s value, relative to the column start.
    offsets: Vec<u64>,
    /// Samples that lack this field (their value is empty).
    missing: usize,
}

/// Reusable storage of a batch.
#[derive(Debug, Default)]
struct Shell {
    buf: Vec<u8>,
    len: usize,
    indices: Vec<u64>,
    keys: String,
    key_ends: Vec<usize>,
    columns: Vec<Column>,
    used_columns: usize,
}

/// Recycles batch storage. Cloning shares the pool.
#[derive(Clone, Debug, Default)]
pub struct BatchPool {
    free: Arc<Mutex<Vec<Shell>>>,
    max_kept: usize,
}

impl BatchPool {
    /// A pool that keeps up to `max_kept` idle batches' storage.
    pub fn new(max_kept: usize) -> Self {
        BatchPool { free: Arc::default(), max_kept: max_kept.max(1) }
    }

    fn take(&self) -> Shell {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default()
    }

    fn give(&self, shell: Shell) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max_kept {
            free.push(shell);
        }
    }

    /// Idle batch storages held for reuse.
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Assemble `samples` (drawn from sample `indices`) into a batch.
    ///
    /// Field columns appear in order of first appearance in the batch; a sample that lacks a
    /// field has an empty value there and the column counts it as missing.
    pub fn assemble(&self, epoch: u64, number: u64, indices: &[u64], samples: &[Sample]) -> Batch {
        let mut s = self.take();
        s.indices.clear();
        s.indices.extend_from_slice(indices);
        s.keys.clear();
        s.key_ends.clear();
        for sample in samples {
            s.keys.push_str(&sample.key);
            s.key_ends.push(s.keys.len());
        }
        // Pass 1: the columns and their sizes, without allocating (columns are reused).
        s.used_columns = 0;
        for sample in samples {
            for f in &sample.fields {
                let found = s.columns[..s.used_columns].iter().position(|c| c.name.as_deref() == Some(&*f.name));
                let c = match found {
                    Some(c) => c,
                    None => {
                        if s.used_columns == s.columns.len() {
                            s.columns.push(Column::default());
                        }
                        let col = &mut s.columns[s.used_columns];
                        col.name = Some(f.name.clone());
                        col.range = 0..0;
                        s.used_columns += 1;
                        s.used_columns - 1
                    }
                };
                s.columns[c].range.end += f.data.len();
            }
        }
        let mut at = 0;
        for col in &mut s.columns[..s.used_columns] {
            let size = col.range.end;
            col.range = at..at + size;
            at = (at + size).div_ceil(ALIGN) * ALIGN;
        }
        s.len = at;
        if s.buf.len() < at {
            // Grows once to the largest batch seen; after that the buffer is reused as is.
            s.buf.resize(at, 0);
        }
        // Pass 2: copy each field into its column.
        let Shell { buf, columns, used_columns, .. } = &mut s;
        for col in &mut columns[..*used_columns] {
            col.offsets.clear();
            col.offsets.push(0);
            col.missing = 0;
            let name = col.name.as_deref().unwrap_or_default();
            let mut w = col.range.start;
            for sample in samples {
                match sample.fields.iter().find(|f| &*f.name == name) {
                    Some(f) => {
                        buf[w..w + f.data.len()].copy_from_slice(&f.data);
                        w += f.data.len();
                    }
                    None => col.missing += 1,
                }
                col.offsets.push((w - col.range.start) as u64);
            }
        }
        Batch { epoch, number, shell: Some(s), pool: self.clone() }
    }
}

/// A batch of samples in columnar form. Dropping it recycles its storage.
#[derive(Debug)]
pub struct Batch {
    /// The epoch it belongs to.
    pub epoch: u64,
    /// Its position in the epoch run (0 for the first batch this rank delivers).
    pub number: u64,
    shell: Option<Shell>,
    pool: BatchPool,
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
        s.columns[..s.used_columns].iter().map(|c| c.name.as_deref().unwrap_or_default())
    }

    /// The column of field `name`.
    pub fn field(&self, name: &str) -> Option<FieldColumn<'_>> {
        let s = self.shell();
        let col = s.columns[..s.used_columns].iter().find(|c| c.name.as_deref() == Some(name))?;
        Some(FieldColumn {
            name: col.name.as_deref().unwrap_or_default(),
            data: &s.buf[col.range.clone()],
            offsets: &col.offsets,
            missing: col.missing,
        })
    }

    /// The columns in order.
    pub fn fields(&self) -> impl Iterator<Item = FieldColumn<'_>> {
        let names: Vec<&str> = self.field_names().collect();
        names.into_iter().filter_map(move |n| self.field(n))
    }

    /// The whole payload buffer (all columns, aligned), e.g. for one host-to-device copy.
    pub fn payload(&self) -> &[u8] {
        let s = self.shell();
        &s.buf[..s.len]
    }

    /// Payload bytes (sum of all values, without alignment padding).
    pub fn payload_bytes(&self) -> u64 {
        let s = self.shell();
        s.columns[..s.used_columns].iter().map(|c| c.range.len() as u64).sum()
    }

    /// Byte range of field `name`'s column inside [`payload`](Self::payload).
    pub fn column_range(&self, name: &str) -> Option<Range<usize>> {
        let s = self.shell();
        s.columns[..s.used_columns].iter().find(|c| c.name.as_deref() == Some(name)).map(|c| c.range.clone())
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
        let samples = [
            s("a", &[("jpg", b"12345"), ("cls", b"1")]),
            s("b", &[("jpg", b"xy"), ("cls", b"2")]),
            s("c", &[("cls", b"3")]),
        ];
        let b = pool.assemble(0, 0, &[7, 8, 9], &samples);
        assert_eq!(b.len(), 3);
        assert_eq!(b.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(b.indices(), [7, 8, 9]);
        assert_eq!(b.field_names().collect::<Vec<_>>(), ["jpg", "cls"]);
        let jpg = b.field("jpg").unwrap();
        assert_eq!(
            (jpg.get(0).unwrap(), jpg.get(1).unwrap(), jpg.get(2).unwrap()),
            (&b"12345"[..], &b"xy"[..], &b""[..])
        );
        assert_eq!(jpg.missing, 1);
        assert!(jpg.dense().is_none());
        let cls = b.field("cls").unwrap();
        assert_eq!(cls.dense(), Some((&b"123"[..], 1)));
        assert_eq!(b.column_range("cls").unwrap().start % ALIGN, 0);
        assert_eq!(b.payload_bytes(), 10);
        assert!(b.field("png").is_none());
    }

    #[test]
    fn storage_is_recycled() {
        let pool = BatchPool::new(2);
        let samples = [s("a", &[("x", &[1u8; 1000])])];
        let first = pool.assemble(0, 0, &[0], &samples);
        let ptr = first.payload().as_ptr();
        drop(first);
        assert_eq!(pool.idle(), 1);
        let again = pool.assemble(0, 1, &[0], &samples);
        assert_eq!(again.payload().as_ptr(), ptr, "the same buffer is reused");
        // A batch with other fields reuses the storage too and shows only its own columns.
        drop(again);
        let other = pool.assemble(0, 2, &[1], &[s("b", &[("y", b"z")])]);
        assert_eq!(other.field_names().collect::<Vec<_>>(), ["y"]);
    }
}
