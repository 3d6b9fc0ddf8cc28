//! Shards of length-prefixed records named by an `index.json`: MosaicML Streaming's MDS and
//! LitData's optimized chunks.
//!
//! Both lay a shard out the same way: `u32` item count, `u32` offsets (one more than items),
//! then the items. Uncompressed shards are read like tar shards: the offset table once (one
//! ranged read, kept), then just the wanted items' bytes, merged across small gaps. A shard
//! compressed as a whole is fetched once, its recorded hashes checked, decompressed, and kept
//! in a bytes-bounded cache so the samples of one shard decompress it once. LitData's framed
//! zstd (`compression_level="batch"`, its default for zstd) is read frame by frame the same
//! way. Every byte comes through the [`Store`], local or remote.
//!
//! Uncompressed MDS shards list hashes too, but checking them means reading the whole
//! shard; random access does not, so they are checked only where a shard is read whole.

#[cfg(feature = "parquet")]
mod arrow;
#[cfg(not(feature = "parquet"))]
#[path = "arrow_without.rs"]
mod arrow;
mod codec;
mod index;
mod litdata;
mod mds;
pub(crate) mod numbers;
mod table;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use self::codec::Codec;
use self::index::IndexError;
use self::numbers::{float_text, int_text};
use self::table::Table;
use super::spill::{Kept, Spill};
use super::{check_index, Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::store::{IoCounters, Object, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// The column (MDS) or leaf (LitData) whose strings are the keys.
const KEY: &str = "__key__";

/// How one shard's bytes are stored.
#[derive(Debug)]
enum Storage {
    /// As written: offsets and items read by range (its hashes, which need the whole file,
    /// are not checked).
    Raw,
    /// As written, each item compressed on its own (LitData `compression_level="sample"`).
    RawItems(Codec),
    /// The whole file (`path`) compressed; hashes of that file.
    Whole { path: String, codec: Codec, hashes: Vec<(String, String)> },
    /// LitData's framed zstd.
    Framed,
}

/// How a shard's items become samples.
#[derive(Debug, Clone)]
enum Decode {
    Mds(Arc<mds::Mds>),
    Litdata(Arc<litdata::Litdata>),
}

/// One shard as its index describes it.
#[derive(Debug)]
struct ShardSpec {
    /// The uncompressed file (what `Raw` and `RawItems` read).
    path: String,
    /// Key prefix for samples without a `__key__`.
    stem: String,
    samples: usize,
    /// Size of the uncompressed file, when the index says.
    size: Option<u64>,
    storage: Storage,
    decode: Decode,
}

/// Open the dataset whose `index.json` files are `indexes` (in `store`) as one source.
pub(crate) async fn open(
    layout: Layout,
    store: Store,
    mut indexes: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    indexes.sort_by(|a, b| a.path.cmp(&b.path));
    let wanted: Option<Vec<String>> = opts.column_list().map(|l| l.into_iter().map(str::to_string).collect());
    let mut shards = Vec::new();
    for index in &indexes {
        let bytes = store.get(&index.path).await?;
        let bad = |reason: String| Error::BadIndex {
            path: store.describe(&index.path),
            reason: format!("{reason}; write the dataset again with its writer, or point at the right directory"),
        };
        let dir = index.path.rsplit_once('/').map_or(String::new(), |(d, _)| format!("{d}/"));
        let w: Option<Vec<&str>> = wanted.as_ref().map(|w| w.iter().map(String::as_str).collect());
        let found = match layout {
            Layout::Mds => mds::shards(&bytes, &dir, w.as_deref()),
            _ => litdata::shards(&bytes, &dir, w.as_deref()),
        };
        let found = found.map_err(|e| {
            let why = match e {
                IndexError::Json(e) => return bad(format!("not a valid {layout} index.json ({e})")),
                IndexError::Layout(why) => why,
            };
            if why.starts_with("columns:") {
                Error::InvalidOption { message: format!("{}: {why}", store.describe(&index.path)) }
            } else if why.contains("pickle") || why.contains("encrypted") || why.contains("item loader") {
                Error::NotSupported { what: format!("{}: {why}", store.describe(&index.path)) }
            } else {
                bad(why)
            }
        })?;
        // Every item takes four bytes of its shard's offset table at least: a count the
        // shard's size cannot hold is a lie, refused before anything is sized by it (a
        // sampler's order, an offset table).
        if let Some(s) = found.iter().find(|s| s.size.is_some_and(|b| (s.samples as u128 + 2) * 4 > u128::from(b))) {
            return Err(bad(format!(
                "shard {} claims {} samples, more than its {} bytes can hold",
                s.path,
                s.samples,
                s.size.unwrap_or(0)
            )));
        }
        // An empty shard is its count, one offset and (MDS) the columns' JSON that MDSWriter
        // puts before the samples, the offset pointing past it to the end: one claiming no
        // samples in more bytes is a lie that would drop its samples unread. (MDSWriter
        // writes such a shard when the first sample is over the size limit.)
        for s in found.iter().filter(|s| s.samples == 0 && s.size.is_some_and(|b| b > 8)) {
            let size = s.size.unwrap_or(0);
            let empty = match &s.storage {
                Storage::Raw => {
                    let head = store.read_span(&store.open_object(&s.path).await?, 0..8).await?;
                    let word =
                        |at: usize| u64::from(u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]));
                    head.len() == 8 && word(0) == 0 && word(4) == size
                }
                // Compressed, it is not opened here: the columns' JSON is small.
                _ => size <= 8 + (64 << 10),
            };
            if !empty {
                return Err(bad(format!("shard {} claims no samples in its {size} bytes", s.path)));
            }
        }
        shards.extend(found);
    }
    let mut starts = vec![0usize];
    for s in &shards {
        let next = starts.last().copied().unwrap_or(0).checked_add(s.samples);
        starts.push(next.ok_or_else(|| Error::BadIndex {
            path: display.clone(),
            reason: "its shards claim more samples than can be counted; write the dataset again".into(),
        })?);
    }
    if starts.last() == Some(&0) {
        return Err(Error::Empty { uri: display, reason: format!("the {layout} index lists no samples") });
    }
    let tables = shards.iter().map(|_| OnceCell::new()).collect();
    // The shards' versions from one listing where the store lists cheaply; the others are
    // looked up when first read.
    let listed = store.listed_versions().await;
    let wanted = wanted.map(|w| w.into_iter().collect());
    let inner = Arc::new(Inner {
        layout,
        store,
        display,
        shards,
        starts,
        tables,
        listed,
        pinned: Mutex::new(HashMap::new()),
        kept: Mutex::new(Kept::new(opts.decoded_budget())),
        decoded_budget: opts.decode_cap(),
        spill: opts.spill_dir().map(|d| Arc::new(Spill::new(d))),
        wanted,
        concurrency: opts.concurrency(),
    });
    // A build without the Arrow reader learns at open, not at the first read, that LitData's
    // chunks are Arrow tables (their first chunk's table says): a Loader that skips bad
    // samples would otherwise skip every one, and an epoch would end empty without a word.
    #[cfg(not(feature = "parquet"))]
    if layout == Layout::Litdata {
        if let Err(e) = inner.table(0).await {
            if e.kind() == crate::error::ErrorKind::Unsupported {
                return Err(e);
            }
        }
    }
    Ok(Arc::new(RecordsSource { inner }))
}

/// MDS or LitData shards as one source.
pub(crate) struct RecordsSource {
    inner: Arc<Inner>,
}

struct Inner {
    layout: Layout,
    store: Store,
    display: String,
    shards: Vec<ShardSpec>,
    starts: Vec<usize>,
    /// Per shard, its item table once read.
    tables: Vec<OnceCell<Arc<Table>>>,
    /// Objects by path, as listed at open (see [`Store::listed_versions`]).
    listed: HashMap<String, ObjectInfo>,
    /// The shard files read so far, each pinned to its version for the rest of the run.
    pinned: Mutex<HashMap<String, Object>>,
    kept: Mutex<KeptBytes>,
    /// Most bytes one decompression may produce (`decoded_bytes`, at least 16 MiB).
    decoded_budget: usize,
    /// LitData record batches dropped from `kept` with rows still unread, as samples (see
    /// `source::spill`); `None` with `disk_cache=false`.
    #[cfg_attr(not(feature = "parquet"), allow(dead_code))]
    spill: Option<Arc<Spill>>,
    wanted: Option<Vec<String>>,
    concurrency: usize,
}

/// Decompressed shards (`(shard, usize::MAX)`), frames and LitData record batches
/// (`(shard, batch)`, with their rows), within `decoded_bytes`.
type KeptBytes = Kept<(usize, usize), Bytes>;

/// A shard name from an index names a file in the dataset's directory (or below it): not an
/// absolute path, no `..` (an index naming `../../etc/passwd` would read outside it).
pub(in crate::source) fn inside(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.starts_with('/') || name.split(['/', '\\']).any(|part| part == "..") {
        return Err(format!("the shard name `{name}` is not a file in the dataset's directory"));
    }
    Ok(())
}

impl Inner {
    /// The shard file `path`, pinned to its version: as listed at open, else looked up now.
    async fn object(&self, path: &str) -> Result<Object> {
        if let Some(o) = self.pinned.lock().unwrap_or_else(|e| e.into_inner()).get(path) {
            return Ok(o.clone());
        }
        let obj = match self.listed.get(path) {
            Some(info) => self.store.object(info),
            None => self.store.open_object(path).await?,
        };
        // Two first reads may both have looked it up: the first pin stays.
        Ok(self.pinned.lock().unwrap_or_else(|e| e.into_inner()).entry(path.to_string()).or_insert(obj).clone())
    }

    /// Byte ranges of shard file `path`.
    async fn read_ranges(&self, path: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.store.read(&self.object(path).await?, ranges).await
    }

    async fn read_range(&self, path: &str, range: Range<u64>) -> Result<Bytes> {
        Ok(self.read_ranges(path, std::slice::from_ref(&range)).await?.pop().unwrap_or_default())
    }

    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let s = self.starts.partition_point(|&x| x <= index) - 1;
        Ok((s, index - self.starts[s]))
    }

    fn corrupt(&self, shard: usize, key: String, why: String) -> Error {
        Error::CorruptData {
            shard: self.store.describe(&self.shards[shard].path),
            key,
            field: String::new(),
            reason: format!("{why}: the shard is damaged or does not match its index; write it again"),
        }
    }

    /// Items `items` (sorted, distinct) of `shard` as samples, in that order.
    async fn samples(&self, shard: usize, items: &[usize]) -> Result<Vec<Sample>> {
        let table = self.table(shard).await?;
        if let Table::Arrow(index) = &*table {
            return self.arrow_samples(shard, index, items).await;
        }
        let got = self.items(shard, items).await?;
        items.iter().zip(&got).map(|(&item, data)| self.sample(shard, item, data)).collect()
    }

    fn sample(&self, shard: usize, item: usize, data: &[u8]) -> Result<Sample> {
        let s = &self.shards[shard];
        let wanted: Option<Vec<&str>> = self.wanted.as_ref().map(|w| w.iter().map(String::as_str).collect());
        let decoded = match &s.decode {
            Decode::Mds(d) => d.decode(data, wanted.as_deref()),
            Decode::Litdata(d) => d.decode(data, wanted.as_deref()),
        };
        let fallback = || format!("{}/{item:06}", s.stem);
        let (key, fields) = decoded.map_err(|why| self.corrupt(shard, fallback(), why))?;
        Ok(Sample { key: key.unwrap_or_else(fallback), fields })
    }
}

impl fmt::Debug for RecordsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordsSource")
            .field("layout", &self.inner.layout)
            .field("uri", &self.inner.display)
            .field("shards", &self.inner.shards.len())
            .field("samples", &self.inner.len())
            .finish()
    }
}

impl fmt::Display for RecordsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.inner.layout, self.inner.display)
    }
}

#[async_trait]
impl SampleSource for RecordsSource {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: false,
            local: self.inner.store.local_root().is_some(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(self.inner.layout, self.inner.shards.len())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        let (shard, item) = self.inner.locate(index)?;
        let mut got = self.inner.samples(shard, &[item]).await?;
        got.pop().ok_or_else(|| Error::internal("records: a sample read came back empty"))
    }

    /// Per shard the batch touches, its items in one (merged) read; shards at once.
    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut by_shard: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for (pos, &i) in indices.iter().enumerate() {
            let (shard, item) = self.inner.locate(i)?;
            by_shard.entry(shard).or_default().push((item, pos));
        }
        let reads = by_shard.into_iter().map(|(shard, mut wanted)| async move {
            wanted.sort_unstable();
            let mut items: Vec<usize> = wanted.iter().map(|&(i, _)| i).collect();
            items.dedup();
            let got = self.inner.samples(shard, &items).await?;
            let mut out = Vec::with_capacity(wanted.len());
            for (item, pos) in wanted {
                let at =
                    items.binary_search(&item).map_err(|_| Error::internal("records: a planned item is missing"))?;
                out.push((pos, got[at].clone()));
            }
            Ok::<_, Error>(out)
        });
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut done = futures::stream::iter(reads).buffer_unordered(self.inner.concurrency.min(16));
        while let Some(samples) = done.try_next().await? {
            for (pos, s) in samples {
                out[pos] = Some(s);
            }
        }
        out.into_iter().map(|s| s.ok_or_else(|| Error::internal("records: a planned sample was not read"))).collect()
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.inner.locate(index).ok().map(|(s, _)| s)
    }

    fn location(&self, index: usize) -> Option<String> {
        let (s, _) = self.inner.locate(index).ok()?;
        Some(format!("shard {}", self.inner.shards[s].path))
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.inner.store.counters())
    }

    /// Each shard's file, at the version listed at open where the store lists (the store
    /// looks a local one up).
    fn fingerprint(&self) -> Option<u64> {
        let files = self.inner.shards.iter().map(|s| match &s.storage {
            Storage::Whole { path, .. } => path.as_str(),
            _ => s.path.as_str(),
        });
        Some(self.inner.store.fingerprint(files.map(|f| (f, self.inner.listed.get(f).map(ObjectInfo::expect)))))
    }

    async fn flush(&self) {
        self.inner.store.flush().await
    }
}

/// The fuzz target `records_codec`: a codec, a claimed size, compressed bytes; what comes
/// out must hold to the claim and to a 1 MiB limit.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_codec(data: &[u8]) {
    const LIMIT: usize = 1 << 20;
    let Some((&pick, rest)) = data.split_first() else { return };
    let Some((claim, z)) = rest.split_at_checked(4) else { return };
    let claim = u32::from_le_bytes([claim[0], claim[1], claim[2], claim[3]]) as usize;
    let codec = [Codec::Zstd, Codec::Gzip, Codec::Bzip2, Codec::Brotli, Codec::Snappy][usize::from(pick) % 5];
    let claimed = (claim != 0).then_some(claim);
    if let Ok(out) = codec.decompress(z, claimed, LIMIT) {
        assert!(out.len() <= LIMIT, "{codec:?}: {} bytes out past the limit", out.len());
        if let Some(c) = claimed {
            assert_eq!(out.len(), c, "{codec:?}: not the size claimed");
        }
    }
}

/// The fuzz target `records_index`: the first byte picks MDS or LitData; the rest, up to a
/// NUL, is an `index.json`, and what follows is one item of each shard it lists.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let (json, item) = rest.split_at(rest.iter().position(|&b| b == 0).unwrap_or(rest.len()));
    let wanted: Option<&[&str]> = if pick & 2 == 2 { Some(&["a", "b"]) } else { None };
    let shards = if pick & 1 == 0 { mds::shards(json, "d/", wanted) } else { litdata::shards(json, "d/", wanted) };
    let Ok(shards) = shards else { return };
    for s in shards.iter().take(4) {
        let decoded = match &s.decode {
            Decode::Mds(d) => d.decode(item, wanted),
            Decode::Litdata(d) => d.decode(item, wanted),
        };
        if let Ok((_, fields)) = decoded {
            assert!(fields.iter().all(|f| wanted.is_none_or(|w| w.contains(&&*f.name))), "projection kept others");
        }
    }
}
