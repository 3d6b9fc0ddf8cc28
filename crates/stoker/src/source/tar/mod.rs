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
use crate::store::{ranges, IoCounters, ObjectInfo, Store};
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
    /// How a batch's sample spans merge into reads (the coalescing gap, `max_read`).
    policy: ranges::Policy,
    concurrency: usize,
    /// Shard bytes read ahead ([`SampleSource::read_ahead`]), served before the store.
    held: Arc<HeldSpans>,
}

struct Shard {
    index: ShardIndex,
    names: Vec<Arc<str>>,
    /// The cache's version key for this shard's bytes (fixed once indexed).
    version: String,
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
        let loads: Vec<_> = shards
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let idx = known.get_mut(i).and_then(Option::take);
                tar_index::for_open(&store, s, opts, idx)
            })
            .collect();
        let indexes: Vec<ShardIndex> =
            futures::stream::iter(loads).buffered(opts.concurrency().min(8)).try_collect().await?;
        let mut pool = HashMap::new();
        let mut starts = Vec::with_capacity(indexes.len() + 1);
        let mut total = 0usize;
        let shards: Vec<Shard> = indexes
            .into_iter()
            .map(|index| {
                starts.push(total);
                total += index.len();
                Shard { names: tar_index::intern_names(&index, &mut pool), version: version_of(&index), index }
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
        let gap = opts.coalesce_gap(store.is_remote());
        Ok(TarSource {
            inner: Arc::new(Inner {
                store,
                display,
                shards,
                starts,
                policy: ranges::Policy::new(gap, opts.max_read()),
                concurrency: opts.concurrency(),
                held: Arc::default(),
            }),
        })
    }
}

/// What the block cache keys a shard's bytes by.
fn version_of(idx: &ShardIndex) -> String {
    crate::store::version_key(idx.e_tag.as_deref(), idx.modified_us, idx.size)
}

impl Inner {
    /// One byte range of a shard; remote shards go through the block cache when configured,
    /// keyed by the shard's version so a rewritten shard is never served stale.
    async fn read(&self, shard: usize, range: Range<u64>) -> Result<Bytes> {
        if let Some(held) = self.held.get(shard, &range) {
            return Ok(held);
        }
        let idx = &self.shards[shard].index;
        let version = &self.shards[shard].version;
        // A weak tag names equivalent content, not these bytes: no precondition on it.
        let e_tag = idx.e_tag.as_deref().filter(|t| !t.starts_with("W/"));
        let mut got =
            self.store.get_ranges_versioned(&idx.shard, std::slice::from_ref(&range), idx.size, version, e_tag).await?;
        Ok(got.pop().unwrap_or_default())
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

    /// Group the wanted samples by shard and merge nearby spans into capped reads.
    fn plan(&self, indices: &[usize], policy: &ranges::Policy) -> Result<Vec<Read>> {
        // Per shard, in shard order: the wanted spans and (position in the output, sample).
        type Wanted = (Vec<Range<u64>>, Vec<(usize, usize)>);
        let mut by_shard: std::collections::BTreeMap<usize, Wanted> = std::collections::BTreeMap::new();
        for (pos, &i) in indices.iter().enumerate() {
            let (shard, local) = self.locate(i)?;
            let (spans, members) = by_shard.entry(shard).or_default();
            spans.push(self.shards[shard].index.span(local));
            members.push((pos, local));
        }
        let mut reads: Vec<Read> = Vec::new();
        for (shard, (spans, members)) in by_shard {
            let merged = ranges::merge(&spans, policy);
            let first = reads.len();
            reads.extend(merged.reads.into_iter().map(|range| Read { shard, range, members: Vec::new() }));
            for (j, member) in members.into_iter().enumerate() {
                match merged.of[j] {
                    Some(k) => reads[first + k].members.push(member),
                    // An empty span (never from a valid index) is a read of nothing.
                    None => reads.push(Read { shard, range: spans[j].clone(), members: vec![member] }),
                }
            }
        }
        Ok(reads)
    }
}

impl Inner {
    /// Read the spans of `indices` per shard, merged across gaps up to the coalescing gap
    /// and not capped (the fetch layer splits large ranges into parallel parts), shards in
    /// the order `indices` first reach them; hold them until the guard is dropped.
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
        let planned: Vec<(usize, Vec<Range<u64>>)> = order
            .into_iter()
            .map(|shard| {
                let wanted = spans.remove(&shard).unwrap_or_default();
                let merged = ranges::merge(&wanted, &ranges::Policy::uncapped(self.policy.gap)).reads;
                (shard, merged)
            })
            .collect();
        // A window the disk cache holds whole needs no request: its batches read the block
        // files directly (the hit path), which costs less than holding a copy in memory.
        if self.spans_cached(planned.iter().map(|(shard, merged)| (*shard, &merged[..]))) {
            return Ok(ReadAhead::none());
        }
        let reads = planned.into_iter().map(|(shard, merged)| async move {
            let s = &self.shards[shard];
            let e_tag = s.index.e_tag.as_deref().filter(|t| !t.starts_with("W/"));
            let got = self.store.get_ranges_versioned(&s.index.shard, &merged, s.index.size, &s.version, e_tag).await?;
            Ok::<_, Error>(merged.into_iter().zip(got).map(move |(r, b)| (shard, r, b)).collect::<Vec<_>>())
        });
        // Shards are requested in the order they are needed; the fetch layer bounds how many
        // requests are in flight.
        let held: Vec<Vec<_>> = futures::stream::iter(reads).buffered(self.concurrency).try_collect().await?;
        Ok(self.held.hold(held.into_iter().flatten().collect()))
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
        let buf = self.inner.read(shard, span.clone()).await?;
        self.inner.assemble(shard, local, &buf, span.start)
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        // A remote batch the disk cache holds whole is read from the block files like a
        // local one (the hit path of get_many_into, for callers that want samples: decoding
        // loaders, mixes), not block by block through the cache's read path; merged across
        // local-disk gaps only, since a gap there costs bytes read, not a round trip.
        if self.inner.store.is_remote() && self.inner.all_cached(indices) {
            if let Some(reader) = self.inner.store.direct_reader() {
                let local = ranges::Policy::new(ranges::LOCAL_GAP, self.inner.policy.max_merged);
                let reads = self.inner.plan(indices, &local)?;
                let spans: Vec<(usize, Range<u64>)> = reads.iter().map(|r| (r.shard, r.range.clone())).collect();
                let inner = self.inner.clone();
                let got =
                    tokio::task::spawn_blocking(move || inner.read_spans(reader, &spans)).await.map_err(Error::task)?;
                match got {
                    Ok(bufs) => {
                        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
                        for (r, buf) in reads.iter().zip(bufs) {
                            for &(pos, local) in &r.members {
                                out[pos] = Some(self.inner.assemble(r.shard, local, &buf, r.range.start)?);
                            }
                        }
                        return Ok(out.into_iter().map(|s| s.expect("every planned sample is assembled")).collect());
                    }
                    // Another process evicted a block meanwhile: the usual way.
                    Err(e) if crate::store::is_gone(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let reads = self.inner.plan(indices, &self.inner.policy)?;
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut done = futures::stream::iter(reads.into_iter().map(|r| async move {
            let buf = self.inner.read(r.shard, r.range.clone()).await?;
            Ok::<_, Error>((r, buf))
        }))
        .buffer_unordered(self.inner.concurrency);
        while let Some((r, buf)) = done.try_next().await? {
            for &(pos, local) in &r.members {
                out[pos] = Some(self.inner.assemble(r.shard, local, &buf, r.range.start)?);
            }
        }
        Ok(out.into_iter().map(|s| s.expect("every planned sample is assembled")).collect())
    }

    async fn get_many_into(&self, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        for &i in indices {
            check_index(i, self.len())?;
        }
        // Local shards, or remote ones when the disk cache holds the whole batch (the hit
        // path), are read straight into the batch; anything else the usual way.
        let direct = !self.inner.store.is_remote() || self.inner.all_cached(indices);
        let Some(reader) = self.inner.store.direct_reader().filter(|_| direct) else {
            return copy_into(self, indices, out).await;
        };
        let before = out.rows();
        let (inner, idx) = (self.inner.clone(), indices.to_vec());
        match fill_blocking(out, move |b| inner.read_into(reader, &idx, b)).await {
            // Another process evicted a block meanwhile: the rest of the batch the usual way.
            Err(e) if crate::store::is_gone(&e) => {
                let done = out.rows() - before;
                copy_into(self, &indices[done..], out).await
            }
            other => other,
        }
    }

    async fn read_ahead(&self, indices: &[usize]) -> Result<ReadAhead> {
        // Local shards are read at page-cache speed with positioned reads: nothing to gain.
        if self.inner.store.local_root().is_some() {
            return Ok(ReadAhead::none());
        }
        self.inner.read_ahead(indices).await
    }

    fn plan_reads(&self, uses: SampleUses<'_>, clock: Arc<std::sync::atomic::AtomicU64>) -> bool {
        let inner = &self.inner;
        if inner.store.local_root().is_some() {
            return false;
        }
        let objects: Vec<(&str, &str, u64)> =
            inner.shards.iter().map(|s| (s.index.shard.as_str(), s.version.as_str(), s.index.size)).collect();
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

    async fn flush(&self) {
        self.inner.store.flush().await
    }

    fn damage(&self) -> Vec<crate::stats::Damage> {
        self.inner.damage()
    }
}
