//! Batches read straight into their buffers ([`SampleSource::get_many_into`]) through the
//! store's direct reader: from local shard files, or over a remote store from the disk
//! cache's block files when every block the batch needs is there (the hit path: a warm epoch
//! reads like a local one, one positioned read per sample or coalesced span, no request, no
//! copy but into the batch).
//!
//! [`SampleSource::get_many_into`]: crate::source::SampleSource::get_many_into

use std::io;
use std::ops::Range;

use bytes::Bytes;

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

/// A sample of a batch on the hit path: where it lies, and the bytes of its span when a
/// window's read-ahead holds them (`None`: read from its file).
pub(super) struct Placed {
    shard: usize,
    local: usize,
    held: Option<Bytes>,
}

impl Inner {
    /// Each sample of `indices` placed, when every one is held in memory by a window's
    /// read-ahead or can be read with no request (a local shard, or its blocks in the disk
    /// cache): the batch is then read on a blocking thread ([`read_into`](Self::read_into),
    /// [`read_samples`](Self::read_samples)), each sample from where it is. `None` otherwise,
    /// an invalid index included (the usual way reports it).
    pub(super) fn place_direct(&self, indices: &[usize]) -> Option<Vec<Placed>> {
        indices
            .iter()
            .map(|&i| {
                let (shard, local) = self.locate(i).ok()?;
                let s = &self.shards[shard];
                let span = s.index.span(local);
                let held = self.held.get(shard, &span);
                (held.is_some() || self.store.servable_directly(&s.obj, [&span])).then_some(Placed {
                    shard,
                    local,
                    held,
                })
            })
            .collect()
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

    /// Samples placed as `placed` ([`place_direct`](Self::place_direct)) read with `reader`
    /// (blocking): each
    /// from the bytes a window's read-ahead holds (a slice, no copy), or else from its file,
    /// spans gathered: the hit path for callers that want samples rather than a batch (the
    /// decoding loader, a mix). A block gone meanwhile fails as in [`Inner::read_into`].
    pub(super) fn read_samples(&self, mut reader: DirectReader, placed: Vec<Placed>) -> Result<Vec<Sample>> {
        let mut spans = Vec::with_capacity(placed.len());
        let mut read_of = vec![usize::MAX; placed.len()];
        for (pos, p) in placed.iter().enumerate() {
            if p.held.is_none() {
                reader.open(p.shard, &self.shards[p.shard].obj)?;
                read_of[pos] = spans.len();
                spans.push((p.shard, self.shards[p.shard].index.span(p.local)));
            }
        }
        let gathered = reader.gather(&spans, u64::MAX).map_err(|(shard, at, e)| self.direct_failure(shard, at, e))?;
        placed
            .into_iter()
            .zip(read_of)
            .map(|(Placed { shard, local, held }, i)| {
                let span = self.shards[shard].index.span(local);
                let buf = held.unwrap_or_else(|| gathered.bytes(i, (span.end - span.start) as usize));
                self.assemble(shard, local, &buf, span.start)
            })
            .collect()
    }

    /// Read `indices` (all valid, placed as `placed`) into `out`, in order (blocking), with
    /// `reader`: each sample from the bytes a window's read-ahead holds, or else from its file.
    /// From the disk cache, a block gone meanwhile fails the read as an I/O error for which
    /// [`crate::cache::is_gone`] holds; the rows before it stay in `out`.
    pub(super) fn read_into(
        &self,
        mut reader: DirectReader,
        indices: &[usize],
        placed: &[Placed],
        out: &mut BatchBuilder,
    ) -> Result<()> {
        // A batch touches few shards: each read from its file is opened once.
        for p in placed.iter().filter(|p| p.held.is_none()) {
            reader.open(p.shard, &self.shards[p.shard].obj)?;
        }
        let failed = |shard: usize, at: u64, e: io::Error| self.direct_failure(shard, at, e);
        // Small samples: their spans are read first, coalesced, then copied out of them.
        let mut small: Vec<(usize, Range<u64>)> = Vec::new();
        let mut small_of = vec![usize::MAX; indices.len()];
        for (pos, p) in placed.iter().enumerate() {
            let span = self.shards[p.shard].index.span(p.local);
            if p.held.is_none() && span.end - span.start < DIRECT_MIN {
                small_of[pos] = small.len();
                small.push((p.shard, span));
            }
        }
        let gathered = reader.gather(&small, SMALL_SPAN).map_err(|(shard, at, e)| failed(shard, at, e))?;
        for (pos, &Placed { shard, local, ref held }) in placed.iter().enumerate() {
            let s = &self.shards[shard];
            out.begin(indices[pos] as u64, &s.index.keys[local]);
            let fields = s.index.sample_fields(local);
            let (key, first) = (&s.index.keys[local], s.index.starts[local] as usize);
            // The sample's whole span in memory: held, or gathered with its small neighbours.
            let in_memory = match (held, small_of[pos]) {
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
