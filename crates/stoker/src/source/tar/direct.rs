//! Batches read straight into their buffers ([`SampleSource::get_many_into`]) through the
//! store's direct reader: from local shard files, or over a remote store from the disk
//! cache's block files when every block the batch needs is there (the hit path: a warm epoch
//! reads like a local one, one positioned read per sample or coalesced span, no request, no
//! copy but into the batch).
//!
//! [`SampleSource::get_many_into`]: crate::source::SampleSource::get_many_into

use std::io;
use std::ops::Range;

use super::{tar_index, Inner};
use crate::batch::BatchBuilder;
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::store::DirectReader;

/// Samples at least this big are read straight into the batch, one read per field.
const DIRECT_MIN: u64 = 32 << 10;
/// Smaller samples are read in coalesced spans of at most this size, small enough to stay in
/// the CPU cache for the copy into the batch that follows.
const SMALL_SPAN: u64 = 256 << 10;

impl Inner {
    /// Whether every sample of `indices` is held in memory by a window's read-ahead or can be
    /// read with no request (a local shard, or its blocks in the disk cache): the batch is read
    /// on a blocking thread ([`read_into`](Self::read_into), [`read_samples`](Self::read_samples)),
    /// each sample from where it is.
    pub(super) fn all_direct_or_held(&self, indices: &[usize]) -> bool {
        indices.iter().all(|&i| match self.locate(i) {
            Ok((shard, local)) => {
                let s = &self.shards[shard];
                let span = s.index.span(local);
                self.held.get(shard, &span).is_some() || self.store.servable_directly(&s.obj, [&span])
            }
            Err(_) => false,
        })
    }

    /// Whether these spans (shard, ranges) can all be read with no request.
    pub(super) fn spans_direct<'a>(&self, spans: impl IntoIterator<Item = (usize, &'a [Range<u64>])>) -> bool {
        spans.into_iter().all(|(shard, ranges)| self.store.servable_directly(&self.shards[shard].obj, ranges))
    }

    /// The error of a direct read of `shard` that failed at byte `at`: a block gone from the
    /// disk cache meanwhile (the caller reads the usual way), or a shard shorter than its
    /// index.
    fn direct_failure(&self, shard: usize, at: u64, e: io::Error) -> Error {
        let path = self.shards[shard].obj.path();
        if crate::cache::is_gone(&e) {
            return crate::store::gone(&self.store, path);
        }
        Error::CorruptTar {
            shard: self.store.describe(path),
            offset: at,
            reason: "the shard is shorter than its index says: it changed since it was indexed; reopen the source"
                .into(),
        }
    }

    /// Samples `indices` (all valid, located as `located`) read with `reader` (blocking): each
    /// from the bytes a window's read-ahead holds (a slice, no copy), or else from its file,
    /// spans gathered: the hit path for callers that want samples rather than a batch (the
    /// decoding loader, a mix). A block gone meanwhile fails as in [`Inner::read_into`].
    pub(super) fn read_samples(&self, mut reader: DirectReader, located: &[(usize, usize)]) -> Result<Vec<Sample>> {
        let mut held: Vec<Option<bytes::Bytes>> = Vec::with_capacity(located.len());
        let mut spans = Vec::with_capacity(located.len());
        let mut read_of = vec![usize::MAX; located.len()];
        for (pos, &(shard, local)) in located.iter().enumerate() {
            let span = self.shards[shard].index.span(local);
            held.push(self.held.get(shard, &span));
            if held[pos].is_none() {
                reader.open(shard, &self.shards[shard].obj)?;
                read_of[pos] = spans.len();
                spans.push((shard, span));
            }
        }
        let gathered = reader.gather(&spans, u64::MAX).map_err(|(shard, at, e)| self.direct_failure(shard, at, e))?;
        located
            .iter()
            .zip(held)
            .zip(read_of)
            .map(|((&(shard, local), held), i)| {
                let span = self.shards[shard].index.span(local);
                let buf = held.unwrap_or_else(|| gathered.bytes(i, (span.end - span.start) as usize));
                self.assemble(shard, local, &buf, span.start)
            })
            .collect()
    }

    /// Read `indices` (all valid) into `out`, in order (blocking), with `reader`: each sample
    /// from the bytes a window's read-ahead holds, or else from its file. From the disk
    /// cache, a block gone meanwhile fails the read as an I/O error for which
    /// [`crate::cache::is_gone`] holds; the rows before it stay in `out`.
    pub(super) fn read_into(&self, mut reader: DirectReader, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        let located: Vec<(usize, usize)> = indices.iter().map(|&i| self.locate(i)).collect::<Result<_>>()?;
        let held: Vec<Option<bytes::Bytes>> =
            located.iter().map(|&(shard, local)| self.held.get(shard, &self.shards[shard].index.span(local))).collect();
        // A batch touches few shards: each read from its file is opened once.
        for (&(shard, _), held) in located.iter().zip(&held) {
            if held.is_none() {
                reader.open(shard, &self.shards[shard].obj)?;
            }
        }
        let failed = |shard: usize, at: u64, e: io::Error| self.direct_failure(shard, at, e);
        // Small samples: their spans are read first, coalesced, then copied out of them.
        let mut small: Vec<(usize, Range<u64>)> = Vec::new();
        let mut small_of = vec![usize::MAX; indices.len()];
        for (pos, &(shard, local)) in located.iter().enumerate() {
            let span = self.shards[shard].index.span(local);
            if held[pos].is_none() && span.end - span.start < DIRECT_MIN {
                small_of[pos] = small.len();
                small.push((shard, span));
            }
        }
        let gathered = reader.gather(&small, SMALL_SPAN).map_err(|(shard, at, e)| failed(shard, at, e))?;
        for (pos, &(shard, local)) in located.iter().enumerate() {
            let s = &self.shards[shard];
            out.begin(indices[pos] as u64, &s.index.keys[local]);
            let fields = s.index.sample_fields(local);
            let (key, first) = (&s.index.keys[local], s.index.starts[local] as usize);
            // The sample's whole span in memory: held, or gathered with its small neighbours.
            let in_memory = match (&held[pos], small_of[pos]) {
                (Some(b), _) => Some((&b[..], s.index.span(local).start)),
                (None, i) if i != usize::MAX => {
                    let span = &small[i].1;
                    Some((gathered.get(i, (span.end - span.start) as usize), span.start))
                }
                _ => None,
            };
            let result = if let Some((buf, start)) = in_memory {
                fields.iter().enumerate().try_for_each(|(j, &(name, off, len))| {
                    let at = (off - start) as usize;
                    self.check_header(shard, first + j, key, off, &buf[at - tar_index::HEADER as usize..at])?;
                    let dst = out.field(&s.names[name as usize], len as usize);
                    dst.copy_from_slice(&buf[at..at + len as usize]);
                    // Checked in the batch, right after the copy, while the bytes are in cache.
                    self.check_sum(shard, first + j, key, dst)
                })
            } else {
                fields.iter().enumerate().try_for_each(|(j, &(name, off, len))| {
                    let mut header = [0u8; tar_index::HEADER as usize];
                    let at = off - tar_index::HEADER;
                    reader.read_exact_at(shard, &mut header, at).map_err(|e| failed(shard, at, e))?;
                    self.check_header(shard, first + j, key, off, &header)?;
                    let dst = out.field(&s.names[name as usize], len as usize);
                    reader.read_exact_at(shard, dst, off).map_err(|e| failed(shard, off, e))?;
                    self.check_sum(shard, first + j, key, dst)
                })
            };
            if let Err(e) = result {
                out.abandon_row();
                return Err(e);
            }
        }
        Ok(())
    }
}
