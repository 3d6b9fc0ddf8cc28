//! The `tar` layout: WebDataset shards with per-shard indexes, read by byte range.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::read_ahead::HeldSpans;
use super::tar_index::{self, ShardIndex};
use super::{check_index, copy_into, fill_blocking, Capability, ReadAhead, SampleSource, SampleUses, SourceInfo};
use crate::batch::BatchBuilder;
use crate::error::{Error, Result};
use crate::sample::{Field, Sample, SampleMeta};
use crate::store::{IoCounters, Object, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

mod direct;

/// WebDataset tar shards. Sample order: shards in the order given (sorted for directories,
/// expansion order for brace patterns), members in archive order.
pub struct TarSource {
    inner: Arc<Inner>,
}

/// The shared state; blocking readers hold it past the borrow of `&self`.
struct Inner {
    store: Store,
    display: String,
    shards: Vec<Shard>,
    /// `starts[s]` is the global index of shard `s`'s first sample; one extra entry at the end.
    starts: Vec<usize>,
    concurrency: usize,
    /// Shard bytes read ahead ([`SampleSource::read_ahead`]), served before the store.
    held: Arc<HeldSpans>,
}

struct Shard {
    index: ShardIndex,
    names: Vec<Arc<str>>,
    /// The shard as the store reads it, pinned to the version it was listed (or recorded) at.
    obj: Object,
}

impl TarSource {
    /// Index (or load the indexes of) `shards` in `store` and open them as one source.
    pub async fn open(store: Store, shards: Vec<ObjectInfo>, opts: &SourceOptions, display: String) -> Result<Self> {
        Self::open_with(store, shards, opts, display, None).await
    }

    /// Like [`open`](Self::open), with indexes already at hand (from a manifest).
    pub(crate) async fn open_with(
        store: Store,
        shards: Vec<ObjectInfo>,
        opts: &SourceOptions,
        display: String,
        known: Option<Vec<ShardIndex>>,
    ) -> Result<Self> {
        if shards.is_empty() {
            return Err(Error::Empty { uri: display, reason: "no .tar shards found".into() });
        }
        // Known indexes (from a manifest, or just built by `index`) are kept while they match
        // the shard as listed; one that does not (rewritten since) is loaded or rebuilt.
        let known = known.filter(|k| k.len() == shards.len() && k.iter().zip(&shards).all(|(i, s)| i.shard == s.path));
        let mut known = known.map(|k| k.into_iter().map(Some).collect::<Vec<_>>()).unwrap_or_default();
        let known: Vec<Option<ShardIndex>> =
            (0..shards.len()).map(|i| known.get_mut(i).and_then(Option::take)).collect();
        let known = std::sync::Mutex::new(known);
        let indexes = tar_index::walk_all(shards.len(), opts.concurrency().min(8), |i, cancel| {
            let idx = known.lock().unwrap_or_else(|e| e.into_inner())[i].take();
            let (store, info) = (&store, &shards[i]);
            async move { tar_index::for_open(store, info, opts, idx, &cancel).await }
        })
        .await?;
        let mut pool = HashMap::new();
        let mut starts = Vec::with_capacity(indexes.len() + 1);
        let mut total = 0usize;
        let shards: Vec<Shard> = indexes
            .into_iter()
            .zip(&shards)
            .map(|(index, info)| {
                starts.push(total);
                total += index.len();
                Shard { names: tar_index::intern_names(&index, &mut pool), obj: store.object(info), index }
            })
            .collect();
        starts.push(total);
        if total == 0 {
            let damaged = shards.iter().filter(|s| !s.index.damage.is_empty()).count();
            // The first damage says why (a wrong path or missing credentials shows up here).
            let first = shards.iter().find_map(|s| s.index.damage.first());
            let why = match first {
                Some(d) if damaged > 0 => format!(", {damaged} of them damaged or unreadable; the first: {d}"),
                _ => String::new(),
            };
            return Err(Error::Empty {
                uri: display,
                reason: format!("{} shard(s) hold no samples{why}", shards.len()),
            });
        }
        Ok(TarSource {
            inner: Arc::new(Inner {
                store,
                display,
                shards,
                starts,
                concurrency: opts.concurrency(),
                held: Arc::default(),
            }),
        })
    }
}

impl Inner {
    /// Byte spans of a shard: those read ahead from memory, the rest through the store.
    async fn read(&self, shard: usize, spans: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let mut out: Vec<Option<Bytes>> = spans.iter().map(|r| self.held.get(shard, r)).collect();
        let missing: Vec<usize> = (0..spans.len()).filter(|&i| out[i].is_none()).collect();
        if !missing.is_empty() {
            let wanted: Vec<Range<u64>> = missing.iter().map(|&i| spans[i].clone()).collect();
            let got = self.store.read(&self.shards[shard].obj, &wanted).await?;
            for (i, b) in missing.into_iter().zip(got) {
                out[i] = Some(b);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    fn len(&self) -> usize {
        *self.starts.last().unwrap_or(&0)
    }

    /// The shard indexes, for writing a manifest.
    pub(crate) fn indexes(&self) -> Vec<ShardIndex> {
        self.shards.iter().map(|s| s.index.clone()).collect()
    }

    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let shard = self.starts.partition_point(|&s| s <= index) - 1;
        Ok((shard, index - self.starts[shard]))
    }

    /// Cut sample `local` of `shard` out of `buf` (which starts at byte `buf_start` of the
    /// shard and covers the sample's span), checking each field's tar header first.
    fn assemble(&self, shard: usize, local: usize, buf: &Bytes, buf_start: u64) -> Result<Sample> {
        let s = &self.shards[shard];
        let key = &s.index.keys[local];
        let first = s.index.starts[local] as usize;
        let fields = s
            .index
            .sample_fields(local)
            .iter()
            .enumerate()
            .map(|(j, &(name, off, len))| {
                let at = (off - buf_start) as usize;
                self.check_header(shard, first + j, key, off, &buf[at - tar_index::HEADER as usize..at])?;
                let data = buf.slice(at..at + len as usize);
                self.check_sum(shard, first + j, key, &data)?;
                Ok(Field { name: s.names[name as usize].clone(), data })
            })
            .collect::<Result<_>>()?;
        Ok(Sample { key: key.clone(), fields })
    }

    /// Check the header in front of the payload at `off` (global field number `field`).
    fn check_header(&self, shard: usize, field: usize, key: &str, off: u64, header: &[u8]) -> Result<()> {
        let index = &self.shards[shard].index;
        index.check_header(field, key, header).map_err(|reason| Error::CorruptTar {
            shard: self.store.describe(&index.shard),
            offset: off - tar_index::HEADER,
            reason,
        })
    }

    /// Check the payload of global field number `field` against its recorded checksum.
    fn check_sum(&self, shard: usize, field: usize, key: &str, data: &[u8]) -> Result<()> {
        let index = &self.shards[shard].index;
        index.check_sum(field, data).map_err(|reason| Error::CorruptData {
            shard: self.store.describe(&index.shard),
            key: key.to_string(),
            field: index.names[index.fields[field].0 as usize].clone(),
            reason,
        })
    }

    /// Damage stepped over when the shards were opened, naming each shard in full.
    fn damage(&self) -> Vec<crate::stats::Damage> {
        let all = self.shards.iter().flat_map(|s| s.index.damage.iter());
        all.map(|d| crate::stats::Damage { shard: self.store.describe(&d.shard), ..d.clone() }).collect()
    }

    /// Samples `indices` (with their positions in the output) grouped by shard, in shard
    /// order.
    fn by_shard(&self, indices: &[usize]) -> Result<std::collections::BTreeMap<usize, Vec<(usize, usize)>>> {
        let mut by: std::collections::BTreeMap<usize, Vec<(usize, usize)>> = std::collections::BTreeMap::new();
        for (pos, &i) in indices.iter().enumerate() {
            let (shard, local) = self.locate(i)?;
            by.entry(shard).or_default().push((pos, local));
        }
        Ok(by)
    }
}

impl Inner {
    /// Read the spans of `indices` per shard, shards in the order `indices` first reach
    /// them; hold them until the guard is dropped.
    async fn read_ahead(&self, indices: &[usize]) -> Result<ReadAhead> {
        let mut order: Vec<usize> = Vec::new();
        let mut spans: HashMap<usize, Vec<Range<u64>>> = HashMap::new();
        for &i in indices {
            let (shard, local) = self.locate(i)?;
            let list = spans.entry(shard).or_insert_with(|| {
                order.push(shard);
                Vec::new()
            });
            list.push(self.shards[shard].index.span(local));
        }
        let mut planned: Vec<(usize, Vec<Range<u64>>)> =
            order.into_iter().map(|shard| (shard, spans.remove(&shard).unwrap_or_default())).collect();
        let spanned: u64 = planned.iter().flat_map(|(_, wanted)| wanted).map(|r| r.end - r.start).sum();
        // A span that can be read with no request (a local shard, or blocks the disk cache
        // holds) gains nothing from being held: its batches read it from the file (the hit
        // path, [`Inner::read_into`]), which costs less than a copy in memory. So only the
        // rest is read ahead, and a window with nothing else not at all. A block evicted before
        // its batch reads it (by another process sharing the cache) sends that batch the usual
        // way, which fetches it: slower, never wrong.
        for (shard, wanted) in &mut planned {
            let obj = &self.shards[*shard].obj;
            wanted.retain(|r| !self.store.servable_directly(obj, [r]));
        }
        planned.retain(|(_, wanted)| !wanted.is_empty());
        if planned.is_empty() {
            return Ok(ReadAhead::none());
        }
        let reads = planned.into_iter().map(|(shard, wanted)| async move {
            let got = self.store.read(&self.shards[shard].obj, &wanted).await?;
            Ok::<_, Error>(wanted.into_iter().zip(got).map(move |(r, b)| (shard, r, b)).collect::<Vec<_>>())
        });
        // Shards are requested in the order they are needed; the fetch layer bounds how many
        // requests are in flight.
        let held: Vec<Vec<_>> = futures::stream::iter(reads).buffered(self.concurrency).try_collect().await?;
        let held: Vec<_> = held.into_iter().flatten().collect();
        // (Without a tokio runtime to run it on, the window keeps its bytes to its end.)
        let stored = self.store.stored().zip(tokio::runtime::Handle::try_current().ok());
        let shards: HashMap<usize, Object> = match stored {
            Some(_) => held.iter().map(|(s, _, _)| (*s, self.shards[*s].obj.clone())).collect(),
            None => HashMap::new(),
        };
        let (ahead, id) = self.held.hold(held);
        if let Some((stored, runtime)) = stored {
            // What the disk cache took, the window's batches read from its files once it is on
            // disk (the hit path), as they do a window the cache held before: the memory copy
            // goes then. Held to the window's end, two windows of bytes sat in memory twice (in
            // the process and in the page cache). In the background: the read-ahead goes on to
            // the next window meanwhile, paced as before by what it fetched.
            let (store, spans) = (self.store.clone(), Arc::downgrade(&self.held));
            runtime.spawn(async move {
                stored.await;
                if let Some(spans) = spans.upgrade() {
                    spans.let_go(id, |s, r| shards.get(&s).is_some_and(|o| store.servable_directly(o, [r])));
                }
            });
        }
        Ok(ahead.spanning(spanned))
    }
}

impl TarSource {
    pub(crate) fn indexes(&self) -> Vec<ShardIndex> {
        self.inner.indexes()
    }
}

impl fmt::Debug for TarSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TarSource")
            .field("uri", &self.inner.display)
            .field("shards", &self.inner.shards.len())
            .field("samples", &self.len())
            .finish()
    }
}

impl fmt::Display for TarSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tar:{}", self.inner.display)
    }
}

#[async_trait]
impl SampleSource for TarSource {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: true,
            local: self.inner.store.local_root().is_some(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Tar, self.inner.shards.len())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        let (shard, local) = self.inner.locate(index)?;
        let span = self.inner.shards[shard].index.span(local);
        let buf = self.inner.read(shard, std::slice::from_ref(&span)).await?.pop().unwrap_or_default();
        self.inner.assemble(shard, local, &buf, span.start)
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        // A batch that needs no request (local shards, or a remote batch the disk cache holds
        // whole, but for samples a window's read-ahead holds) is read from the files and the
        // held bytes on a blocking thread (the hit path of get_many_into, for callers that want
        // samples: decoding loaders, mixes), not through the read path.
        if let Some(reader) = self.inner.store.direct_reader() {
            if let Some(placed) = self.inner.place_direct(indices) {
                let inner = self.inner.clone();
                let got = tokio::task::spawn_blocking(move || inner.read_samples(reader, placed))
                    .await
                    .map_err(Error::task)?;
                match got {
                    // Another process evicted a block meanwhile: the usual way.
                    Err(e) if crate::store::is_gone(&e) => {}
                    other => return other,
                }
            }
        }
        let by_shard = self.inner.by_shard(indices)?;
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut done = futures::stream::iter(by_shard.into_iter().map(|(shard, members)| async move {
            let spans: Vec<Range<u64>> =
                members.iter().map(|&(_, local)| self.inner.shards[shard].index.span(local)).collect();
            let got = self.inner.read(shard, &spans).await?;
            Ok::<_, Error>((shard, members, spans, got))
        }))
        .buffer_unordered(self.inner.concurrency);
        while let Some((shard, members, spans, got)) = done.try_next().await? {
            for ((&(pos, local), span), buf) in members.iter().zip(&spans).zip(&got) {
                out[pos] = Some(self.inner.assemble(shard, local, buf, span.start)?);
            }
        }
        Ok(out.into_iter().map(|s| s.expect("every planned sample is assembled")).collect())
    }

    async fn get_many_into(&self, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        for &i in indices {
            check_index(i, self.len())?;
        }
        // Local shards, or remote ones when the disk cache holds the whole batch (the hit
        // path) but for samples held in memory by a window's read-ahead, are read straight
        // into the batch; anything else the usual way. Without a direct reader (a remote store
        // with no disk cache) there is nothing to place.
        let direct = self.inner.store.direct_reader().and_then(|r| Some((self.inner.place_direct(indices)?, r)));
        let Some((placed, reader)) = direct else {
            return copy_into(self, indices, out).await;
        };
        let before = out.rows();
        let (inner, idx) = (self.inner.clone(), indices.to_vec());
        match fill_blocking(out, move |b| inner.read_into(reader, &idx, &placed, b)).await {
            // Another process evicted a block meanwhile: the rest of the batch the usual way.
            Err(e) if crate::store::is_gone(&e) => {
                let done = out.rows() - before;
                copy_into(self, &indices[done..], out).await
            }
            other => other,
        }
    }

    async fn read_ahead(&self, indices: &[usize]) -> Result<ReadAhead> {
        self.inner.read_ahead(indices).await
    }

    fn plan_reads(&self, uses: SampleUses<'_>, clock: Arc<std::sync::atomic::AtomicU64>) -> bool {
        let inner = &self.inner;
        let objects: Vec<&Object> = inner.shards.iter().map(|s| &s.obj).collect();
        // A sample's reads are its span in its shard.
        let spans = |sink: &mut dyn FnMut(u64, usize, Range<u64>)| {
            uses(&mut |t, i| {
                if let Ok((shard, local)) = inner.locate(i) {
                    sink(t, shard, inner.shards[shard].index.span(local));
                }
            })
        };
        inner.store.plan_reads(&objects, &spans, clock)
    }

    fn fit_cache_blocks(&self) -> bool {
        let objects: Vec<&Object> = self.inner.shards.iter().map(|s| &s.obj).collect();
        self.inner.store.widen_cache_blocks(&objects)
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.inner.locate(index).ok().map(|(shard, _)| shard)
    }

    fn location(&self, index: usize) -> Option<String> {
        let (shard, _) = self.inner.locate(index).ok()?;
        Some(format!("shard {}", self.inner.shards[shard].index.shard))
    }

    async fn meta(&self, index: usize) -> Result<SampleMeta> {
        let (shard, local) = self.inner.locate(index)?;
        let s = &self.inner.shards[shard];
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
        Some(self.inner.store.counters())
    }

    fn fingerprint(&self) -> Option<u64> {
        Some(self.inner.store.fingerprint(self.inner.shards.iter().map(|s| (s.obj.path(), Some(s.obj.pinned())))))
    }

    async fn flush(&self) {
        self.inner.store.flush().await
    }

    fn damage(&self) -> Vec<crate::stats::Damage> {
        self.inner.damage()
    }
}
