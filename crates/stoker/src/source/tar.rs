//! The `tar` layout: WebDataset shards with per-shard indexes, read by byte range.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::tar_index::{self, ShardIndex};
use super::{check_index, Capability, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::{Field, Sample, SampleMeta};
use crate::store::{IoCounters, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// WebDataset tar shards. Sample order: shards in the order given (sorted for directories,
/// expansion order for brace patterns), members in archive order.
pub struct TarSource {
    store: Store,
    display: String,
    shards: Vec<Shard>,
    /// `starts[s]` is the global index of shard `s`'s first sample; one extra entry at the end.
    starts: Vec<usize>,
    gap: u64,
    max_read: u64,
    concurrency: usize,
}

struct Shard {
    index: ShardIndex,
    names: Vec<Arc<str>>,
}

/// One coalesced read: a byte range of a shard and the samples carved out of it.
struct Read {
    shard: usize,
    range: Range<u64>,
    /// `(position in the output, sample index within the shard)`.
    members: Vec<(usize, usize)>,
}

impl TarSource {
    /// Index (or load the indexes of) `shards` in `store` and open them as one source.
    pub async fn open(store: Store, shards: Vec<ObjectInfo>, opts: &SourceOptions, display: String) -> Result<Self> {
        if shards.is_empty() {
            return Err(Error::Empty { uri: display, reason: "no .tar shards found".into() });
        }
        let indexes: Vec<ShardIndex> =
            futures::stream::iter(shards.iter().map(|s| tar_index::load_or_build(&store, s, opts)))
                .buffered(opts.concurrency().min(8))
                .try_collect()
                .await?;
        let mut pool = HashMap::new();
        let mut starts = Vec::with_capacity(indexes.len() + 1);
        let mut total = 0usize;
        let shards: Vec<Shard> = indexes
            .into_iter()
            .map(|index| {
                starts.push(total);
                total += index.len();
                Shard { names: tar_index::intern_names(&index, &mut pool), index }
            })
            .collect();
        starts.push(total);
        if total == 0 {
            return Err(Error::Empty { uri: display, reason: format!("{} shard(s) hold no samples", shards.len()) });
        }
        Ok(TarSource {
            store,
            display,
            shards,
            starts,
            gap: opts.coalesce_gap(),
            max_read: opts.max_read(),
            concurrency: opts.concurrency(),
        })
    }

    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let shard = self.starts.partition_point(|&s| s <= index) - 1;
        Ok((shard, index - self.starts[shard]))
    }

    fn assemble(&self, shard: usize, local: usize, buf: &Bytes, buf_start: u64) -> Sample {
        let s = &self.shards[shard];
        let fields = s
            .index
            .sample_fields(local)
            .iter()
            .map(|&(name, off, len)| {
                let at = (off - buf_start) as usize;
                Field { name: s.names[name as usize].clone(), data: buf.slice(at..at + len as usize) }
            })
            .collect();
        Sample { key: s.index.keys[local].clone(), fields }
    }

    /// Group the wanted samples by shard and merge nearby spans into capped reads.
    fn plan(&self, indices: &[usize]) -> Result<Vec<Read>> {
        let mut wanted: Vec<(usize, Range<u64>, usize, usize)> = Vec::with_capacity(indices.len());
        for (pos, &i) in indices.iter().enumerate() {
            let (shard, local) = self.locate(i)?;
            wanted.push((shard, self.shards[shard].index.span(local), pos, local));
        }
        wanted.sort_unstable_by_key(|w| (w.0, w.1.start));
        let mut reads: Vec<Read> = Vec::new();
        for (shard, span, pos, local) in wanted {
            if let Some(r) = reads.last_mut() {
                let merged_end = r.range.end.max(span.end);
                if r.shard == shard
                    && span.start <= r.range.end + self.gap
                    && merged_end - r.range.start <= self.max_read
                {
                    r.range.end = merged_end;
                    r.members.push((pos, local));
                    continue;
                }
            }
            reads.push(Read { shard, range: span, members: vec![(pos, local)] });
        }
        Ok(reads)
    }
}

impl fmt::Debug for TarSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TarSource")
            .field("uri", &self.display)
            .field("shards", &self.shards.len())
            .field("samples", &self.len())
            .finish()
    }
}

impl fmt::Display for TarSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tar:{}", self.display)
    }
}

#[async_trait]
impl SampleSource for TarSource {
    fn len(&self) -> usize {
        *self.starts.last().unwrap_or(&0)
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: true,
            local: self.store.local_root().is_some(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo { layout: Layout::Tar, shards: self.shards.len() }
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        let (shard, local) = self.locate(index)?;
        let span = self.shards[shard].index.span(local);
        let buf = self.store.get_range(&self.shards[shard].index.shard, span.clone()).await?;
        Ok(self.assemble(shard, local, &buf, span.start))
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let reads = self.plan(indices)?;
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut done = futures::stream::iter(reads.into_iter().map(|r| async move {
            let buf = self.store.get_range(&self.shards[r.shard].index.shard, r.range.clone()).await?;
            Ok::<_, Error>((r, buf))
        }))
        .buffer_unordered(self.concurrency);
        while let Some((r, buf)) = done.try_next().await? {
            for &(pos, local) in &r.members {
                out[pos] = Some(self.assemble(r.shard, local, &buf, r.range.start));
            }
        }
        Ok(out.into_iter().map(|s| s.expect("every planned sample is assembled")).collect())
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.locate(index).ok().map(|(shard, _)| shard)
    }

    async fn meta(&self, index: usize) -> Result<SampleMeta> {
        let (shard, local) = self.locate(index)?;
        let s = &self.shards[shard];
        Ok(SampleMeta {
            key: s.index.keys[local].clone(),
            fields: s
                .index
                .sample_fields(local)
                .iter()
                .map(|&(n, _, len)| (s.names[n as usize].clone(), len))
                .collect(),
        })
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.store.counters())
    }
}
