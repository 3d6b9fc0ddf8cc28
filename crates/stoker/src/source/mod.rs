//! The [`SampleSource`] trait, what a source can do ([`Capability`]), and [`open`], which
//! goes through the one resolver (`resolve.rs`) as [`index`] does.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};

use crate::batch::BatchBuilder;
use crate::error::{Error, Result};
use crate::sample::{Sample, SampleMeta};
use crate::store::IoCounters;
use crate::uri::{Layout, SourceOptions};

#[cfg(feature = "hdf5")]
pub(crate) mod hdf5;
#[cfg(not(feature = "hdf5"))]
pub(crate) use self::without::hdf5;
mod index;
pub(crate) mod jsonl;
pub mod lmdb;
pub mod manifest;
pub mod mix;
pub(crate) mod npy;
pub mod objects;
#[cfg(feature = "parquet")]
pub(crate) mod parquet;
#[cfg(not(feature = "parquet"))]
pub(crate) use self::without::parquet;
pub mod read_ahead;
pub(crate) mod records;
pub(crate) mod resolve;
pub(crate) mod span_file;
pub(crate) mod span_index;
// Kept batches of Parquet, HDF5 and LitData Arrow tables: idle in a build without them.
#[cfg_attr(not(all(feature = "parquet", feature = "hdf5")), allow(dead_code))]
pub(crate) mod spill;
pub mod tar;
pub(crate) mod tar_index;
pub(crate) mod tfrecord;
pub(crate) mod tokens;
#[cfg(not(all(feature = "parquet", feature = "hdf5")))]
mod without;

pub(crate) use self::index::index_with;
pub use self::index::{index, index_with_progress, IndexReport};
pub(crate) use self::resolve::{PACK_RECORD, WRITE_RECORD};

pub use self::lmdb::LmdbSource;
pub use self::mix::{MixSource, MixSpec};
pub use self::objects::ObjectsSource;
pub use self::read_ahead::ReadAhead;
pub use self::tar::TarSource;
pub use self::tokens::{TokenBuf, TokenDocs, TokenSlots};

/// What a source can do, so callers and the conformance suite adapt to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capability {
    /// `get(i)` costs about the same for every `i` (no sequential scan to reach it).
    pub random_access: bool,
    /// `get_many` merges the byte ranges of nearby samples into fewer store requests.
    pub coalesced_reads: bool,
    /// `locality(i)` names the shard sample `i` lives in.
    pub locality: bool,
    /// `meta(i)` answers from an index or listing without reading payloads.
    pub cheap_meta: bool,
    /// Bytes are on the local machine (file system or mmap).
    pub local: bool,
}

/// A short description of an opened source.
///
/// The layout is a name, not a closed enum, so a source outside this crate describes itself
/// as what it is ([`SourceInfo::new`]) instead of claiming to be one of Stoker's layouts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceInfo {
    /// The layout's name: `objects`, `tar`, `lmdb` or `mix` for Stoker's own
    /// ([`Layout::as_str`]), anything else for a third-party source.
    pub layout: std::borrow::Cow<'static, str>,
    /// Number of shards (tar files); 1 for an LMDB environment; objects for the objects layout.
    pub shards: usize,
}

impl SourceInfo {
    /// A source of the layout named `layout` with `shards` shards (see the fields).
    pub fn new(layout: impl Into<std::borrow::Cow<'static, str>>, shards: usize) -> Self {
        SourceInfo { layout: layout.into(), shards }
    }

    /// The description of one of Stoker's own layouts.
    pub fn of(layout: Layout, shards: usize) -> Self {
        SourceInfo::new(layout.as_str(), shards)
    }

    /// Which of Stoker's own layouts this is, if it is one.
    pub fn known_layout(&self) -> Option<Layout> {
        Layout::ALL.iter().copied().find(|l| l.as_str() == self.layout)
    }
}

/// A random-access collection of samples.
///
/// Required: [`len`](Self::len), [`capability`](Self::capability), [`info`](Self::info) and
/// [`get`](Self::get). The provided [`get_many`](Self::get_many) runs gets concurrently;
/// ranged layouts override it to read coalesced ranges. Errors name what failed.
#[async_trait]
pub trait SampleSource: fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether the source has no samples (opening an empty location is an error, so this is
    /// mostly false).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What this source can do.
    fn capability(&self) -> Capability;

    /// Layout and shard count.
    fn info(&self) -> SourceInfo;

    /// Sample `index`; an index past the end is [`Error::IndexOutOfRange`].
    async fn get(&self, index: usize) -> Result<Sample>;

    /// Samples at `indices`, in that order (duplicates allowed).
    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        get_concurrently(self, indices, DEFAULT_CONCURRENCY).await
    }

    /// Read samples `indices` straight into a batch being built, in order: one copy from
    /// storage into the batch's column buffers.
    ///
    /// On error the rows completed so far stay in `out`, the failing sample is not in it and
    /// later ones are not read. The provided version reads with `get_many` and copies; local
    /// layouts override it to skip the intermediate buffers.
    async fn get_many_into(&self, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
        copy_into(self, indices, out).await
    }

    /// Fetch the bytes of samples `indices` now, with few large requests, and serve later
    /// reads of them from memory until the returned [`ReadAhead`] is dropped: how a loader
    /// streams the shards a window of [`Order::ShardShuffle`](crate::sampler::Order) will
    /// need, in the order it needs them. Sources that gain nothing from it (local files,
    /// LMDB, one object per sample) hold nothing, which is the provided behaviour.
    async fn read_ahead(&self, _indices: &[usize]) -> Result<ReadAhead> {
        Ok(ReadAhead::none())
    }

    /// Tell the caches under this source which samples a reader will read, and when, so the
    /// disk cache drops what is needed furthest ahead ([`crate::cache::policy`]). `uses`
    /// calls its sink with `(time, sample index)` in non-decreasing time and may be called
    /// more than once; `clock` is the reader's time in the same units, advanced as it reads.
    /// The Loader calls this at the start of every epoch with the rest of the epoch and the
    /// next one. Returns whether a cache follows the plan; the provided version has no cache
    /// to tell (false).
    fn plan_reads(&self, _uses: SampleUses<'_>, _clock: Arc<AtomicU64>) -> bool {
        false
    }

    /// Called by the Loader before the first read of a run that reads all of the source's
    /// samples on this node: a source whose remote data fits whole in its disk cache may let
    /// the cache take bigger blocks, as every block will be read whole anyway (see
    /// [`crate::cache::BlockCache::widen_block`]). Returns whether it did; the provided
    /// version has no cache (false).
    fn fit_cache_blocks(&self) -> bool {
        false
    }

    /// The shard sample `index` lives in, so samplers and caches can keep shard locality.
    /// Shards are runs of consecutive indices, numbered in index order: the shard never
    /// decreases as `index` grows (the Loader finds a shard's end by bisection).
    fn locality(&self, _index: usize) -> Option<usize> {
        None
    }

    /// Where sample `index` lives, for error messages (e.g. `shard train-007.tar`), when the
    /// source's own name does not say it.
    fn location(&self, _index: usize) -> Option<String> {
        None
    }

    /// Key and field sizes of sample `index`; cheap when [`Capability::cheap_meta`] is set.
    async fn meta(&self, index: usize) -> Result<SampleMeta> {
        Ok(self.get(index).await?.meta())
    }

    /// Requests and bytes the underlying store has served, when the source reads a store.
    fn io_counters(&self) -> Option<IoCounters> {
        None
    }

    /// Wait until what reads wrote behind them (a remote store's disk cache blocks) is on
    /// disk, so another process, or the next epoch's hit path, finds it there.
    async fn flush(&self) {}

    /// A digest of what this source reads: every object's location and version (size, and
    /// entity tag or modification time), for caches derived from its samples (the tokens of
    /// a text corpus), which a changed or another file must not be served from. `None` where
    /// the layout does not say.
    fn fingerprint(&self) -> Option<u64> {
        None
    }

    /// Damage stepped over when the source was opened under `on_damage=skip`: what is not
    /// part of it. Empty for a healthy source and for layouts that cannot step over damage.
    fn damage(&self) -> Vec<crate::stats::Damage> {
        Vec::new()
    }

    /// The mix this source is, if it is one: the Loader then follows its plan instead of a
    /// plain order over the indices.
    fn as_mix(&self) -> Option<&MixSource> {
        None
    }

    /// The token documents this source is, if it holds tokens (a Megatron `.bin`/`.idx`
    /// dataset): what [`crate::tokens`] packs into training sequences.
    fn as_tokens(&self) -> Option<&dyn TokenDocs> {
        None
    }
}

/// A type-erased source, as [`open`] returns it.
pub type DynSampleSource = dyn SampleSource;

/// What [`SampleSource::plan_reads`] is told: calls its sink with `(time, sample index)` for
/// every read, in non-decreasing time.
pub type SampleUses<'a> = &'a (dyn Fn(&mut dyn FnMut(u64, usize)) + Sync);

const DEFAULT_CONCURRENCY: usize = 32;

/// Run `get` for every index with up to `concurrency` in flight, keeping order.
pub async fn get_concurrently<S: SampleSource + ?Sized>(
    src: &S,
    indices: &[usize],
    concurrency: usize,
) -> Result<Vec<Sample>> {
    let gets: Vec<_> = indices.iter().map(|&i| src.get(i)).collect();
    futures::stream::iter(gets).buffered(concurrency.max(1)).try_collect().await
}

/// `get_many`, then copy each sample into `out`: the provided `get_many_into`.
pub async fn copy_into<S: SampleSource + ?Sized>(src: &S, indices: &[usize], out: &mut BatchBuilder) -> Result<()> {
    let samples = src.get_many(indices).await?;
    for (s, &i) in samples.iter().zip(indices) {
        out.push_sample(i as u64, s);
    }
    Ok(())
}

/// Run `f` on a blocking thread with the builder moved in and back (it must be `'static`
/// there); the caller's builder is left empty meanwhile, which costs no allocation.
pub(crate) async fn fill_blocking<F>(out: &mut BatchBuilder, f: F) -> Result<()>
where
    F: FnOnce(&mut BatchBuilder) -> Result<()> + Send + 'static,
{
    let mut b = std::mem::take(out);
    let (b, res) = tokio::task::spawn_blocking(move || {
        let r = f(&mut b);
        (b, r)
    })
    .await
    .map_err(Error::task)?;
    *out = b;
    res
}

/// Which file holds document `doc` of files whose documents start at `starts` (then the
/// total), and its number there; `None` past the end.
pub(crate) fn locate(starts: &[u64], doc: u64) -> Option<(usize, usize)> {
    if doc >= *starts.last()? {
        return None;
    }
    let f = starts.partition_point(|&s| s <= doc) - 1;
    Some((f, (doc - starts[f]) as usize))
}

pub(crate) fn check_index(index: usize, len: usize) -> Result<()> {
    if index >= len {
        return Err(Error::IndexOutOfRange { index, len });
    }
    Ok(())
}

/// Open the source a URI names. Options in the URI query override those passed in.
///
/// The layout is inferred unless forced with `?layout=`: a directory holding `data.mdb` is
/// LMDB; `.tar` files or a brace pattern of them are tar shards; `.parquet` files are Parquet;
/// an `index.json` written by MosaicML Streaming or LitData is MDS or LitData; anything else
/// is one file per sample (`source/resolve.rs` holds the rules). A mix file (`NAME.mix.json`, `NAME.mix.toml`,
/// `mix:PATH` or `mix:{JSON}`) opens a [`MixSource`] over the sources it lists, with
/// `options` under each source's own.
pub async fn open(uri: &str, options: SourceOptions) -> Result<Arc<DynSampleSource>> {
    open_boxed(uri, options).await
}

/// [`open`], compiled here (see the note at the crate's `pub use`s).
fn open_boxed(uri: &str, options: SourceOptions) -> BoxFuture<'_, Result<Arc<DynSampleSource>>> {
    async move { resolve::Request::new(uri, options)?.open().await }.boxed()
}

/// Open `uri` as [`open`] does and take a snapshot of what it listed (the layout, every
/// object with its size and version, the shard indexes known), for processes that open the
/// same source again ([`open_with_listing`]): Ray read tasks, each opening the source, list a
/// directory or prefix of 10^5 objects once between them instead of once each. `None` where
/// opening lists nothing (named files, patterns, LMDB, mixes).
pub async fn open_and_snapshot(uri: &str, options: SourceOptions) -> Result<(Arc<DynSampleSource>, Option<Vec<u8>>)> {
    open_and_snapshot_boxed(uri, options).await
}

/// A source and the snapshot of its listing ([`open_and_snapshot`]).
type Snapshotted = (Arc<DynSampleSource>, Option<Vec<u8>>);

/// [`open_and_snapshot`], compiled here.
fn open_and_snapshot_boxed(uri: &str, options: SourceOptions) -> BoxFuture<'_, Result<Snapshotted>> {
    open_and_snapshot_here(uri, options).boxed()
}

async fn open_and_snapshot_here(uri: &str, options: SourceOptions) -> Result<Snapshotted> {
    let request = resolve::Request::new(uri, options)?;
    if request.is_mix() {
        return Ok((request.open().await?, None));
    }
    let resolved = request.resolve().await?;
    let snapshot = match &resolved.place {
        resolve::Place::Store { listing, known, whole: true, .. } => {
            let m = manifest::Manifest::new(resolved.layout, listing, known.clone().unwrap_or_default());
            Some(serde_json::to_vec(&m).map_err(|e| Error::internal(format!("listing snapshot: {e}")))?)
        }
        _ => None,
    };
    // What was resolved is what a process opening from the snapshot resolves: the same layout,
    // objects and known indexes.
    Ok((resolve::construct(resolved).await?, snapshot))
}

/// For a local directory read one file a sample (10^5 or 10^8 images), without a manifest:
/// its samples and a listing snapshot of its files' names only, for [`open_with_listing`] in
/// other processes; no file is looked up (for 100,000 files, a quarter of the time of a
/// listing that looks each up), and each process looks up the files of its own part
/// ([`snapshot_spans`]) when it opens from it. `None` for anything else (remote, other
/// layouts, a manifest): [`open_and_snapshot`] takes those. Refused as an open refuses it:
/// an empty directory, or one holding an unfinished pack's output.
pub async fn names_snapshot(uri: &str, options: SourceOptions) -> Result<Option<NamesSnapshot>> {
    names_snapshot_boxed(uri, options).await
}

/// A [`names_snapshot`]: the samples, and the snapshot's bytes.
pub type NamesSnapshot = (usize, Vec<u8>);

/// [`names_snapshot`], compiled here.
fn names_snapshot_boxed(uri: &str, options: SourceOptions) -> BoxFuture<'_, Result<Option<NamesSnapshot>>> {
    async move {
        let Some(names) = resolve::Request::new(uri, options)?.names_only().await? else { return Ok(None) };
        let samples = names.len();
        let snapshot = serde_json::to_vec(&manifest::Manifest::names_only(names))
            .map_err(|e| Error::internal(format!("listing snapshot: {e}")))?;
        Ok(Some((samples, snapshot)))
    }
    .boxed()
}

/// Open `uri` with the listing `snapshot` that [`open_and_snapshot`] took in another process,
/// instead of listing its directory or prefix again. Objects are read as listed then (sizes
/// and versions included): a file removed or rewritten since fails its read, as it would
/// after any open. Local shards are looked up again, as with a manifest, and so are the files
/// of a snapshot of names only ([`names_snapshot`]): one gone since fails the open, naming it
/// (under `on_damage=skip`, its read fails and it is skipped); one rewritten since is read as
/// it is at this open (its size and version are taken here, not when the names were listed).
pub async fn open_with_listing(uri: &str, options: SourceOptions, snapshot: &[u8]) -> Result<Arc<DynSampleSource>> {
    open_with_listing_boxed(uri, options, snapshot).await
}

/// [`open_with_listing`], compiled here.
fn open_with_listing_boxed<'a>(
    uri: &'a str,
    options: SourceOptions,
    snapshot: &'a [u8],
) -> BoxFuture<'a, Result<Arc<DynSampleSource>>> {
    async move { resolve::Request::new(uri, options)?.with_listing(snapshot)?.open().await }.boxed()
}

/// The parts of a listing snapshot ([`open_and_snapshot`]) that readers of the sample runs
/// `spans` of the whole source need, one per run, each for [`open_with_listing`]: for the
/// `objects` layout (one object a sample, in path order), the objects of that run's samples,
/// so the source opened from a part holds exactly them, numbered from 0 (sample `span.start`
/// of the whole is sample 0 of its part). `None` for the other layouts, whose samples are not
/// one object each: their readers take the whole snapshot. With parts, each Ray read task of a
/// directory of 10^7 files parses its own share of the listing, not the whole of it.
pub fn snapshot_spans(snapshot: &[u8], spans: &[std::ops::Range<usize>]) -> Result<Option<Vec<Vec<u8>>>> {
    let m = manifest::parse(snapshot, "the listing snapshot")?;
    let Some(parts) = m.sample_spans(spans) else { return Ok(None) };
    parts?
        .iter()
        .map(|part| serde_json::to_vec(part).map_err(|e| Error::internal(format!("listing snapshot part: {e}"))))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}
