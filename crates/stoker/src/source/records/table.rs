//! Where a shard's items are: its offset table (read once), a LitData framed chunk's frames,
//! or a shard compressed as a whole (fetched once, its hashes checked, decompressed and kept);
//! and the items' bytes read through them.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::arrow::ArrowIndex;
use super::codec::{self, Codec};
use super::{Decode, Inner, Storage};
use crate::error::{Error, Result};

/// Where a shard's items are.
#[derive(Debug)]
pub(super) enum Table {
    /// Absolute offsets in the file (or in the decompressed whole shard).
    Offsets(Vec<u32>),
    /// Framed: offsets into the concatenated uncompressed items, and the frames.
    Frames { offsets: Vec<u32>, frames: Vec<Frame> },
    /// LitData's Arrow-footer chunk: every item is a row of the Arrow IPC file after the
    /// (empty) items.
    Arrow(ArrowIndex),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Frame {
    pub(super) first: usize,
    pub(super) items: usize,
    pub(super) at: u64,
    pub(super) len: u64,
    pub(super) raw_len: usize,
}

pub(super) fn le_u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

impl Inner {
    /// Where the Arrow IPC file of an Arrow-footer chunk of `size` bytes lies.
    async fn arrow_span(&self, shard: usize, size: u64) -> Result<Range<u64>> {
        let s = &self.shards[shard];
        let tail_at = size.checked_sub(12).ok_or_else(|| self.corrupt(shard, String::new(), "too short".into()))?;
        let tail = self.read_range(&s.path, tail_at..size).await.map_err(|e| self.short(shard, e))?;
        if &tail[4..] != b"LDARW01\0" {
            return Err(self.corrupt(
                shard,
                String::new(),
                "its items are empty and no Arrow footer (LDARW01) follows them".into(),
            ));
        }
        let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
        let start = tail_at.checked_sub(len).ok_or_else(|| {
            self.corrupt(shard, String::new(), "its Arrow footer claims more bytes than the chunk has".into())
        })?;
        Ok(start..tail_at)
    }

    /// Check `offsets` (of `n` items) for order and bounds (`end`, when known).
    pub(super) fn check_offsets(&self, shard: usize, offsets: &[u32], n: usize, end: Option<u64>) -> Result<()> {
        if offsets.len() != n + 1 {
            return Err(self.corrupt(shard, String::new(), format!("{} offsets for {n} items", offsets.len())));
        }
        if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
            return Err(self.corrupt(shard, format!("item {i}"), "its offsets run backwards".into()));
        }
        if let (Some(end), Some(&last)) = (end, offsets.last()) {
            if u64::from(last) > end {
                return Err(self.corrupt(
                    shard,
                    format!("item {}", n.saturating_sub(1)),
                    format!("it ends at byte {last} of a {end}-byte shard (the shard is truncated)"),
                ));
            }
        }
        Ok(())
    }

    /// A whole compressed shard, decompressed (hashes checked), kept for its other samples.
    pub(super) async fn whole(&self, shard: usize) -> Result<Bytes> {
        if let Some(b) = self.kept.lock().unwrap_or_else(|e| e.into_inner()).get((shard, usize::MAX), &[]) {
            return Ok(b);
        }
        let Storage::Whole { path, codec, hashes } = &self.shards[shard].storage else {
            return Err(Error::internal("records: a whole read of a shard stored otherwise"));
        };
        let zipped = self.store.read_all(&self.object(path).await?).await?;
        let (store, path, codec, hashes) = (self.store.clone(), path.clone(), *codec, hashes.clone());
        let claimed = self.shards[shard].size.map(|s| usize::try_from(s).unwrap_or(usize::MAX));
        let limit = self.decoded_budget;
        let raw = tokio::task::spawn_blocking(move || {
            for (algo, want) in &hashes {
                if let Some(got) = codec::hex_digest(algo, &zipped) {
                    if &got != want {
                        return Err(Error::CorruptData {
                            shard: store.describe(&path),
                            key: String::new(),
                            field: String::new(),
                            reason: format!(
                                "its {algo} is {got}, not the {want} its index records: the file was damaged since \
                                 it was written; restore it from a good copy"
                            ),
                        });
                    }
                }
            }
            codec.decompress(&zipped, claimed, limit).map_err(|why| why.error(store.describe(&path), String::new()))
        })
        .await
        .map_err(Error::task)??;
        let raw = Bytes::from(raw);
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).put((shard, usize::MAX), raw.clone(), raw.len(), 0, &[]);
        Ok(raw)
    }

    /// The item table of `shard`, read once.
    pub(super) async fn table(&self, shard: usize) -> Result<Arc<Table>> {
        self.tables[shard]
            .get_or_try_init(|| async {
                let s = &self.shards[shard];
                let n = s.samples;
                // Saturating: a lying count makes a span past the shard, which the store refuses.
                let header = (n as u64).saturating_add(1).saturating_mul(4).saturating_add(4);
                let table = match &s.storage {
                    Storage::Raw | Storage::RawItems(_) => {
                        let b = self.read_range(&s.path, 0..header).await.map_err(|e| self.short(shard, e))?;
                        self.count_matches(shard, &b)?;
                        let offsets = le_u32s(&b[4..]);
                        self.check_offsets(shard, &offsets, n, s.size)?;
                        let empty = n > 0 && offsets.iter().all(|&o| u64::from(o) == header);
                        match (&s.decode, s.size) {
                            // LitData keeps rows of flat dicts as an Arrow IPC file after the
                            // (then empty) items, named by a trailer.
                            (Decode::Litdata(_), Some(size)) if empty => {
                                let span = self.arrow_span(shard, size).await?;
                                Table::Arrow(self.arrow_index(shard, span).await?)
                            }
                            _ => Table::Offsets(offsets),
                        }
                    }
                    Storage::Whole { .. } => {
                        let raw = self.whole(shard).await?;
                        let b = raw.get(..header as usize).ok_or_else(|| {
                            self.corrupt(shard, String::new(), "the shard is shorter than its offset table".into())
                        })?;
                        self.count_matches(shard, b)?;
                        let offsets = le_u32s(&b[4..]);
                        self.check_offsets(shard, &offsets, n, Some(raw.len() as u64))?;
                        Table::Offsets(offsets)
                    }
                    Storage::Framed => self.frames(shard).await?,
                };
                Ok::<_, Error>(Arc::new(table))
            })
            .await
            .cloned()
    }

    /// A read past a shard's end is a truncated shard, named as such.
    pub(super) fn short(&self, shard: usize, e: Error) -> Error {
        match e {
            Error::NotFound { .. } => e,
            Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.corrupt(shard, String::new(), "the shard is shorter than its index says (truncated)".into())
            }
            other => other,
        }
    }

    pub(super) fn count_matches(&self, shard: usize, b: &[u8]) -> Result<()> {
        let n = self.shards[shard].samples;
        let count = b.get(..4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize);
        if count != Some(n) {
            return Err(self.corrupt(
                shard,
                String::new(),
                format!("it holds {} items, its index says {n}", count.map_or("no".into(), |c| c.to_string())),
            ));
        }
        Ok(())
    }

    /// The frame table of a LitData framed-zstd chunk.
    pub(super) async fn frames(&self, shard: usize) -> Result<Table> {
        let s = &self.shards[shard];
        let prefix = self.read_range(&s.path, 0..24).await.map_err(|e| self.short(shard, e))?;
        if &prefix[..8] != b"LDFZ01\0\0" {
            return Err(self.corrupt(shard, String::new(), "no LDFZ01 magic at the start of a framed chunk".into()));
        }
        let u = |at: usize| u32::from_le_bytes([prefix[at], prefix[at + 1], prefix[at + 2], prefix[at + 3]]) as usize;
        let (n, n_frames) = (u(12), u(20));
        if n != s.samples {
            return Err(self.corrupt(
                shard,
                String::new(),
                format!("it holds {n} items, its index says {}", s.samples),
            ));
        }
        let len = 4 * (n as u64 + 1) + 24 * n_frames as u64;
        let b = self.read_range(&s.path, 24..24 + len).await.map_err(|e| self.short(shard, e))?;
        let offsets = le_u32s(&b[..4 * (n + 1)]);
        self.check_offsets(shard, &offsets, n, None)?;
        let frames = b[4 * (n + 1)..]
            .chunks_exact(24)
            .map(|f| {
                let u32_at = |at: usize| u32::from_le_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
                Frame {
                    first: u32_at(0) as usize,
                    items: u32_at(4) as usize,
                    at: u64::from_le_bytes(f[8..16].try_into().unwrap_or_default()),
                    len: u64::from(u32_at(16)),
                    raw_len: u32_at(20) as usize,
                }
            })
            .collect::<Vec<_>>();
        let covered: usize = frames.iter().map(|f| f.items).sum();
        if covered != n || frames.iter().any(|f| f.first + f.items > n) {
            return Err(self.corrupt(shard, String::new(), "its frames do not cover its items".into()));
        }
        Ok(Table::Frames { offsets, frames })
    }

    /// Frame `f` of `shard`, decompressed and kept.
    pub(super) async fn frame(&self, shard: usize, f: usize, frame: Frame) -> Result<Bytes> {
        if let Some(b) = self.kept.lock().unwrap_or_else(|e| e.into_inner()).get((shard, f), &[]) {
            return Ok(b);
        }
        let s = &self.shards[shard];
        let end = frame
            .at
            .checked_add(frame.len)
            .ok_or_else(|| self.corrupt(shard, String::new(), format!("frame {f} claims bytes past 2^64")))?;
        let z = self.read_range(&s.path, frame.at..end).await.map_err(|e| self.short(shard, e))?;
        let raw = Codec::Zstd
            .decompress(&z, Some(frame.raw_len), self.decoded_budget)
            .map_err(|why| why.error(self.store.describe(&s.path), format!("frame {f}")))?;
        let raw = Bytes::from(raw);
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).put((shard, f), raw.clone(), raw.len(), 0, &[]);
        Ok(raw)
    }

    /// Items `items` (sorted, distinct) of `shard`, their bytes in that order.
    pub(super) async fn items(&self, shard: usize, items: &[usize]) -> Result<Vec<Bytes>> {
        let table = self.table(shard).await?;
        let s = &self.shards[shard];
        match (&*table, &s.storage) {
            (Table::Offsets(off), Storage::Whole { .. }) => {
                let raw = self.whole(shard).await?;
                Ok(items.iter().map(|&i| raw.slice(off[i] as usize..off[i + 1] as usize)).collect())
            }
            (Table::Offsets(off), _) => {
                let wanted: Vec<Range<u64>> = items.iter().map(|&i| u64::from(off[i])..u64::from(off[i + 1])).collect();
                let got = self.read_ranges(&s.path, &wanted).await.map_err(|e| self.short(shard, e))?;
                let mut out = Vec::with_capacity(items.len());
                for b in got {
                    out.push(match &s.storage {
                        Storage::RawItems(codec) => Bytes::from(
                            codec
                                .decompress(&b, None, self.decoded_budget)
                                .map_err(|why| why.error(self.store.describe(&s.path), String::new()))?,
                        ),
                        _ => b,
                    });
                }
                Ok(out)
            }
            (Table::Arrow(_), _) => Err(Error::internal("records: item bytes of an Arrow-footer chunk")),
            (Table::Frames { offsets, frames }, _) => {
                let mut out = Vec::with_capacity(items.len());
                for &i in items {
                    let f = frames
                        .iter()
                        .position(|fr| fr.first <= i && i < fr.first + fr.items)
                        .ok_or_else(|| self.corrupt(shard, format!("item {i}"), "no frame holds it".into()))?;
                    let raw = self.frame(shard, f, frames[f]).await?;
                    let base = offsets[frames[f].first] as usize;
                    let (a, b) = (offsets[i] as usize - base, offsets[i + 1] as usize - base);
                    out.push(raw.get(a..b).map(|_| raw.slice(a..b)).ok_or_else(|| {
                        self.corrupt(shard, format!("item {i}"), "it lies past its frame's end".into())
                    })?);
                }
                Ok(out)
            }
        }
    }
}
