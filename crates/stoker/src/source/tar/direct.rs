//! Batches read straight into their buffers ([`SampleSource::get_many_into`]): from local
//! shard files, or over a remote store from the disk cache's block files when every block
//! the batch needs is there (the hit path: a warm epoch reads like a local one, one
//! positioned read per sample or coalesced span, no request, no copy but into the batch).
//!
//! [`SampleSource::get_many_into`]: crate::source::SampleSource::get_many_into

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::{tar_index, Inner};
use crate::batch::BatchBuilder;
use crate::cache::CachedObject;
use crate::error::{Error, Result};

/// Samples at least this big are read straight into the batch, one read per field.
const DIRECT_MIN: u64 = 32 << 10;
/// Smaller samples are read in coalesced spans of at most this size, small enough to stay in
/// the CPU cache for the copy into the batch that follows.
const SMALL_SPAN: u64 = 256 << 10;

/// Where a batch's shard bytes are read from.
pub(super) enum ShardFiles {
    /// Local shard files under this root.
    Local(std::path::PathBuf),
    /// The disk cache (remote shards whose blocks are all cached).
    Cached,
}

/// The shards a batch touches, each opened once.
enum Open {
    Local(HashMap<usize, std::fs::File>),
    Cached(HashMap<usize, CachedObject>),
}

impl Open {
    fn read_exact_at(&mut self, shard: usize, dst: &mut [u8], at: u64) -> io::Result<()> {
        match self {
            Open::Local(files) => files[&shard].read_exact_at(dst, at),
            Open::Cached(objects) => objects.get_mut(&shard).expect("opened").read_exact_at(dst, at),
        }
    }
}

impl Inner {
    /// Whether the disk cache holds every block of samples `indices` and none of them is held
    /// in memory (a window read ahead serves its batches faster from there).
    pub(super) fn all_cached(&self, indices: &[usize]) -> bool {
        indices.iter().all(|&i| match self.locate(i) {
            Ok((shard, local)) => {
                let s = &self.shards[shard];
                let span = s.index.span(local);
                self.held.get(shard, &span).is_none() && self.store.on_disk(&s.index.shard, &s.version, [&span])
            }
            Err(_) => false,
        })
    }

    /// Whether the disk cache holds every block of these spans (shard, ranges).
    pub(super) fn spans_cached<'a>(&self, spans: impl IntoIterator<Item = (usize, &'a [Range<u64>])>) -> bool {
        spans.into_iter().all(|(shard, ranges)| {
            let s = &self.shards[shard];
            self.store.on_disk(&s.index.shard, &s.version, ranges)
        })
    }

    /// Read `indices` (all valid) into `out`, in order (blocking). From the disk cache, a
    /// block gone meanwhile fails the read as an I/O error for which
    /// [`crate::cache::is_gone`] holds; the rows before it stay in `out`.
    pub(super) fn read_into(&self, files: ShardFiles, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        let located: Vec<(usize, usize)> = indices.iter().map(|&i| self.locate(i)).collect::<Result<_>>()?;
        // A batch touches few shards: open each once.
        let mut open = match &files {
            ShardFiles::Local(root) => {
                let mut map = HashMap::new();
                for &(shard, _) in &located {
                    if let std::collections::hash_map::Entry::Vacant(slot) = map.entry(shard) {
                        let path = root.join(&self.shards[shard].index.shard);
                        slot.insert(std::fs::File::open(&path).map_err(|e| Error::io(path.display(), e))?);
                    }
                }
                Open::Local(map)
            }
            ShardFiles::Cached => {
                let mut map = HashMap::new();
                for &(shard, _) in &located {
                    if let std::collections::hash_map::Entry::Vacant(slot) = map.entry(shard) {
                        let s = &self.shards[shard];
                        let object = self.store.cached_object(&s.index.shard, &s.version, s.index.size);
                        slot.insert(object.ok_or_else(|| self.gone(shard))?);
                    }
                }
                Open::Cached(map)
            }
        };
        let failed = |shard: usize, at: u64, e: io::Error| {
            if crate::cache::is_gone(&e) {
                return self.gone(shard);
            }
            Error::CorruptTar {
                shard: self.store.describe(&self.shards[shard].index.shard),
                offset: at,
                reason: "the shard is shorter than its index says: it changed since it was indexed; reopen the source"
                    .into(),
            }
        };
        // Small samples: plan coalesced spans over all of them first, then read those spans.
        let mut small: Vec<(usize, Range<u64>, usize)> = located
            .iter()
            .enumerate()
            .filter_map(|(pos, &(shard, local))| {
                let span = self.shards[shard].index.span(local);
                (span.end - span.start < DIRECT_MIN).then_some((shard, span, pos))
            })
            .collect();
        small.sort_unstable_by_key(|(shard, span, _)| (*shard, span.start));
        let mut spans: Vec<(usize, Range<u64>)> = Vec::new();
        let mut span_of = vec![usize::MAX; indices.len()];
        for (shard, span, pos) in small {
            match spans.last_mut() {
                Some((s, r))
                    if *s == shard && span.start <= r.end + self.gap && span.end.max(r.end) - r.start <= SMALL_SPAN =>
                {
                    r.end = r.end.max(span.end);
                }
                _ => spans.push((shard, span)),
            }
            span_of[pos] = spans.len() - 1;
        }
        let mut span_bufs = Vec::with_capacity(spans.len());
        for (shard, r) in &spans {
            let mut buf = crate::buffer::take((r.end - r.start) as usize);
            let want = (r.end - r.start) as usize;
            open.read_exact_at(*shard, &mut buf[..want], r.start).map_err(|e| failed(*shard, r.start, e))?;
            self.store.count(1, want as u64);
            span_bufs.push(buf);
        }
        for (pos, &(shard, local)) in located.iter().enumerate() {
            let s = &self.shards[shard];
            out.begin(indices[pos] as u64, &s.index.keys[local]);
            let fields = s.index.sample_fields(local);
            let (key, first) = (&s.index.keys[local], s.index.starts[local] as usize);
            let result = if span_of[pos] != usize::MAX {
                let (buf, start) = (&span_bufs[span_of[pos]], spans[span_of[pos]].1.start);
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
                    open.read_exact_at(shard, &mut header, at).map_err(|e| failed(shard, at, e))?;
                    self.check_header(shard, first + j, key, off, &header)?;
                    let dst = out.field(&s.names[name as usize], len as usize);
                    open.read_exact_at(shard, dst, off).map_err(|e| failed(shard, off, e))?;
                    self.store.count(1, len);
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

    /// The error of a read from the disk cache whose block went missing.
    fn gone(&self, shard: usize) -> Error {
        Error::Io {
            path: self.store.describe(&self.shards[shard].index.shard),
            source: io::Error::new(io::ErrorKind::NotFound, crate::cache::Gone),
        }
    }
}

/// Whether `e` is [`Inner::read_into`] finding a block gone from the disk cache.
pub(super) fn is_gone(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if crate::cache::is_gone(source))
}
