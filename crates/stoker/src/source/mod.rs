//! The [`SampleSource`] trait, what a source can do ([`Capability`]), and [`open`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};

use crate::batch::BatchBuilder;
use crate::error::{Error, Result};
use crate::sample::{Sample, SampleMeta};
use crate::store::{IoCounters, ObjectInfo, Store};
use crate::uri::{self, Layout, Location, RemoteLocation, SourceOptions};

pub mod lmdb;
pub mod manifest;
pub mod mix;
pub mod objects;
pub mod read_ahead;
pub mod tar;
pub(crate) mod tar_index;

pub use self::lmdb::LmdbSource;
pub use self::mix::{MixSource, MixSpec};
pub use self::objects::ObjectsSource;
pub use self::read_ahead::ReadAhead;
pub use self::tar::TarSource;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceInfo {
    /// The layout in use.
    pub layout: Layout,
    /// Number of shards (tar files); 1 for an LMDB environment; objects for the objects layout.
    pub shards: usize,
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

    /// The shard sample `index` lives in, so samplers and caches can keep shard locality.
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

pub(crate) fn check_index(index: usize, len: usize) -> Result<()> {
    if index >= len {
        return Err(Error::IndexOutOfRange { index, len });
    }
    Ok(())
}

/// Files that are never samples or shards: hidden files (any path component starting with
/// a dot) and Stoker's own sidecar indexes.
pub(crate) fn is_dataset_file(path: &str) -> bool {
    !path.split('/').any(|c| c.starts_with('.')) && !path.ends_with(tar_index::SIDECAR_SUFFIX)
}

/// Open the source a URI names. Options in the URI query override those passed in.
///
/// The layout is inferred unless forced with `?layout=`: a directory holding `data.mdb` is
/// LMDB; `.tar` files or a brace pattern are tar shards; anything else is one file per
/// sample. A mix file (`NAME.mix.json`, `NAME.mix.toml`, `mix:PATH` or `mix:{JSON}`) opens
/// a [`MixSource`] over the sources it lists, with `options` under each source's own.
pub async fn open(uri: &str, options: SourceOptions) -> Result<Arc<DynSampleSource>> {
    if mix::is_mix_uri(uri) {
        return mix::open_uri(uri, options).await;
    }
    let parsed = uri::parse(uri)?;
    let opts = options.merged(parsed.options);
    let display = parsed.display;
    match parsed.location {
        Location::Local(path) => open_local(&path, opts, display).await,
        Location::LocalPattern(paths) => open_pattern(&paths, opts, display).await,
        Location::Remote(loc) => open_remote(&loc, opts, display).await,
    }
}

async fn open_remote(loc: &RemoteLocation, opts: SourceOptions, display: String) -> Result<Arc<DynSampleSource>> {
    if opts.layout == Some(Layout::Lmdb) {
        return Err(Error::NotSupported {
            what: format!(
                "{display}: LMDB is memory-mapped and needs a local directory; copy it to local disk, or convert \
                 it to tar shards (which read well remotely)"
            ),
        });
    }
    let store = Store::remote(loc, &opts, &display)?;
    let names: Option<Vec<String>> = match (&loc.names, &opts.list) {
        (Some(n), _) => Some(n.clone()),
        (None, Some(list)) => {
            let text = store.get(list).await?;
            let text = String::from_utf8_lossy(&text);
            Some(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_string)
                    .collect(),
            )
        }
        (None, None) if loc.scheme.starts_with("http") => {
            return Err(Error::InvalidUri {
                uri: display,
                reason: "HTTP servers cannot be listed: name the shards with a brace pattern \
                         (https://host/data/train-{0000..0099}.tar) or give ?list=FILE with one object name per line"
                    .into(),
            })
        }
        (None, None) => None,
    };
    let listing: Vec<ObjectInfo> = match names {
        Some(names) => head_all(&store, &names, opts.concurrency(), shards_may_be_missing(&opts, &names)).await?,
        None => return Ok(open_listed(store, &opts, display, false).await?.source),
    };
    let layout = inferred_layout(&opts, &listing);
    from_listing(store, layout, listing, opts, display).await
}

async fn open_local(path: &Path, opts: SourceOptions, display: String) -> Result<Arc<DynSampleSource>> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            what: path.display().to_string(),
            hint: Some(
                "no such file or directory; check the path (relative paths start at the working directory)".into(),
            ),
        },
        _ => Error::io(path.display(), e),
    })?;
    if meta.is_file() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if opts.layout == Some(Layout::Lmdb) || name == "data.mdb" {
            return Ok(Arc::new(LmdbSource::open(parent, &opts, display)?));
        }
        let store = Store::local(parent)?;
        let layout = opts.layout.unwrap_or(if name.ends_with(".tar") { Layout::Tar } else { Layout::Objects });
        let info = store.head(&name).await?;
        return from_listing(store, layout, vec![info], opts, display).await;
    }
    let has_mdb = path.join("data.mdb").is_file();
    if opts.layout == Some(Layout::Lmdb) || (opts.layout.is_none() && has_mdb) {
        return Ok(Arc::new(LmdbSource::open(path, &opts, display)?));
    }
    let store = Store::local(path)?;
    Ok(open_listed(store, &opts, display, false).await?.source)
}

async fn open_pattern(paths: &[PathBuf], opts: SourceOptions, display: String) -> Result<Arc<DynSampleSource>> {
    if opts.layout == Some(Layout::Lmdb) {
        return Err(Error::invalid_option(format!(
            "{display}: a brace pattern names tar shards or files, not an LMDB environment; give the LMDB directory"
        )));
    }
    let root = common_dir(paths);
    let store = Store::local(&root)?;
    let rel: Vec<String> =
        paths.iter().map(|p| p.strip_prefix(&root).unwrap_or(p).to_string_lossy().into_owned()).collect();
    let layout =
        opts.layout.unwrap_or(if rel.iter().all(|p| p.ends_with(".tar")) { Layout::Tar } else { Layout::Objects });
    let listing = head_all(&store, &rel, opts.concurrency(), shards_may_be_missing(&opts, &rel)).await?;
    from_listing(store, layout, listing, opts, display).await
}

async fn from_listing(
    store: Store,
    layout: Layout,
    listing: Vec<ObjectInfo>,
    opts: SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    Ok(build(store, layout, listing, &opts, display, None, false).await?.source)
}

/// A source, and when asked for (by `index`) what a manifest needs to describe it.
struct Opened {
    source: Arc<DynSampleSource>,
    store: Store,
    layout: Layout,
    /// Objects (all files, or the shards) and the tar indexes; only kept for a manifest.
    described: Option<(Vec<ObjectInfo>, Vec<tar_index::ShardIndex>)>,
}

async fn build(
    store: Store,
    layout: Layout,
    listing: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
    known: Option<Vec<tar_index::ShardIndex>>,
    describe: bool,
) -> Result<Opened> {
    match layout {
        Layout::Objects => {
            let kept = describe.then(|| (listing.clone(), Vec::new()));
            let source = Arc::new(ObjectsSource::new(store.clone(), listing, opts, display)?);
            Ok(Opened { source, store, layout, described: kept })
        }
        Layout::Tar => {
            let shards: Vec<ObjectInfo> = listing.into_iter().filter(|o| o.path.ends_with(".tar")).collect();
            let kept = describe.then(|| shards.clone());
            let tar = TarSource::open_with(store.clone(), shards, opts, display, known).await?;
            let described = kept.map(|shards| (shards, tar.indexes()));
            Ok(Opened { source: Arc::new(tar), store, layout, described })
        }
        Layout::Lmdb => unreachable!("LMDB is opened before listing"),
        Layout::Mix => Err(Error::invalid_option(format!(
            "{display}: layout=mix names no files; a mix is opened from a mix file (NAME.mix.json or \
             NAME.mix.toml) or `mix:{{...}}`"
        ))),
    }
}

/// Open a directory or prefix: from its manifest when there is one (one read, no listing),
/// else by listing it.
async fn open_listed(store: Store, opts: &SourceOptions, display: String, describe: bool) -> Result<Opened> {
    if opts.manifest.unwrap_or(true) {
        if let Some(m) = manifest::load(&store).await? {
            let layout = opts.layout.unwrap_or(m.layout);
            let mut listing = m.listing();
            if layout == Layout::Tar && store.local_root().is_some() {
                // Local shards are stat'ed again (cheap, concurrent): one rewritten since
                // `stoker index` no longer matches its index and is re-indexed, not read at its
                // old offsets. Remote reads carry the indexed entity tag instead (If-Match),
                // so a remote manifest stays one GET.
                let shards: Vec<String> =
                    listing.iter().filter(|o| o.path.ends_with(".tar")).map(|o| o.path.clone()).collect();
                listing = head_all(&store, &shards, opts.concurrency(), shards_may_be_missing(opts, &shards)).await?;
            }
            let known = (layout == m.layout).then_some(m.tar);
            return build(store, layout, listing, opts, display, known, describe).await;
        }
    }
    let listing: Vec<ObjectInfo> = store.list().await?.into_iter().filter(|o| is_dataset_file(&o.path)).collect();
    let layout = inferred_layout(opts, &listing);
    build(store, layout, listing, opts, display, None, describe).await
}

/// The layout options force, else `tar` when the listing holds `.tar` files, else `objects`.
fn inferred_layout(opts: &SourceOptions, listing: &[ObjectInfo]) -> Layout {
    opts.layout.unwrap_or(if listing.iter().any(|o| o.path.ends_with(".tar")) { Layout::Tar } else { Layout::Objects })
}

/// Every named object's size and version, `concurrency` at a time. Checking each name once
/// at open makes a typo in a pattern fail there, not mid-epoch.
/// Look up every object a pattern or list names. With `missing_ok` (tar shards under
/// `on_damage=skip`), a shard that does not exist is listed with size 0: opening then finds
/// it unreadable and skips it whole, reported like any damage, instead of failing the open.
async fn head_all(store: &Store, names: &[String], concurrency: usize, missing_ok: bool) -> Result<Vec<ObjectInfo>> {
    // Futures collected first: a lazy `map` over borrowed names makes the whole open future
    // fail the compiler's higher-ranked Send check (it could not be spawned).
    let heads: Vec<_> = names
        .iter()
        .map(|p| async move {
            match store.head(p).await {
                Err(e) if missing_ok && e.kind() == crate::ErrorKind::NotFound => {
                    Ok(ObjectInfo { path: p.clone(), size: 0, modified_us: 0, e_tag: None })
                }
                other => other,
            }
        })
        .collect();
    futures::stream::iter(heads).buffered(concurrency).try_collect().await
}

/// Whether names from a pattern or list are tar shards whose absence the skip policy covers.
fn shards_may_be_missing(opts: &SourceOptions, names: &[String]) -> bool {
    opts.skip_damage() && opts.layout.unwrap_or(Layout::Tar) == Layout::Tar && names.iter().all(|n| n.ends_with(".tar"))
}

/// What `index` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexReport {
    /// Where the manifest went.
    pub manifest: String,
    /// Its size in bytes.
    pub manifest_bytes: u64,
    /// The layout recorded.
    pub layout: Layout,
    /// Objects (files or shards) listed.
    pub objects: usize,
    /// Samples.
    pub samples: usize,
    /// Whether every tar member's payload has a recorded checksum.
    pub checksums: bool,
    /// Damage stepped over (with `on_damage=skip`).
    pub damage: Vec<crate::stats::Damage>,
}

/// Build or refresh the indexes of a directory or prefix (tar sidecars) and write its
/// manifest, so later opens read one small object instead of listing.
pub async fn index(uri: &str, options: SourceOptions) -> Result<IndexReport> {
    index_with_progress(uri, options, &|_, _| {}).await
}

/// [`index`], calling `progress(done, total)` each time a shard's index is loaded or built
/// (once with `(n, n)` for layouts without per-shard indexes).
pub async fn index_with_progress(
    uri: &str,
    options: SourceOptions,
    progress: &(dyn Fn(usize, usize) + Send + Sync),
) -> Result<IndexReport> {
    index_with(uri, options, progress, &Default::default()).await
}

/// The index of one shard for `index`: with `sums` (the XXH3-64s `pack` computed as it
/// wrote the shard) recorded without reading the payloads again.
async fn index_shard(
    store: &Store,
    info: &ObjectInfo,
    opts: &SourceOptions,
    sums: Option<&Vec<u64>>,
) -> Result<tar_index::ShardIndex> {
    let Some(sums) = sums else { return tar_index::for_open(store, info, opts, None).await };
    let headers_only = SourceOptions { checksums: None, ..opts.clone() };
    let mut idx = tar_index::for_open(store, info, &headers_only, None).await?;
    if idx.sums.is_empty() && idx.damage.is_empty() && sums.len() == idx.fields.len() {
        idx.sums = sums.clone();
        idx.digest = tar_index::PayloadDigest::Xxh3;
        tar_index::save(store, &idx, opts).await;
    } else if idx.sums.is_empty() && opts.checksums == Some(true) {
        // Not the members `pack` wrote (a foreign file in the destination): read them.
        return tar_index::for_open(store, info, opts, None).await;
    }
    Ok(idx)
}

/// [`index_with_progress`], given checksums already known per shard path.
pub(crate) async fn index_with(
    uri: &str,
    options: SourceOptions,
    progress: &(dyn Fn(usize, usize) + Send + Sync),
    known_sums: &std::collections::HashMap<String, Vec<u64>>,
) -> Result<IndexReport> {
    let parsed = uri::parse(uri)?;
    let mut opts = options.merged(parsed.options);
    // Always from the truth: list and re-check every shard, ignoring an old manifest.
    opts.manifest = Some(false);
    let display = parsed.display;
    let store = match &parsed.location {
        Location::Local(p) if p.join("data.mdb").is_file() || opts.layout == Some(Layout::Lmdb) => {
            return Err(Error::NotSupported {
                what: format!("{display}: LMDB keeps its own index; there is nothing to build"),
            })
        }
        Location::Local(p) if p.is_dir() => Store::local(p)?,
        Location::Remote(loc) if loc.names.is_none() && opts.list.is_none() => Store::remote(loc, &opts, &display)?,
        _ => {
            return Err(Error::InvalidUri {
                uri: display,
                reason: "`index` takes a directory or prefix (the manifest goes at its root), not a pattern or file"
                    .into(),
            })
        }
    };
    let listing: Vec<ObjectInfo> = store.list().await?.into_iter().filter(|o| is_dataset_file(&o.path)).collect();
    let layout = inferred_layout(&opts, &listing);
    let known = match layout {
        Layout::Tar => {
            let shards: Vec<&ObjectInfo> = listing.iter().filter(|o| o.path.ends_with(".tar")).collect();
            let total = shards.len();
            let loads: Vec<_> = shards.iter().map(|s| index_shard(&store, s, &opts, known_sums.get(&s.path))).collect();
            let done = std::sync::atomic::AtomicUsize::new(0);
            let indexes: Vec<tar_index::ShardIndex> = futures::stream::iter(loads)
                .buffered(opts.concurrency().min(8))
                .inspect_ok(|_| progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1, total))
                .try_collect()
                .await?;
            Some(indexes)
        }
        _ => {
            progress(listing.len(), listing.len());
            None
        }
    };
    let opened = build(store, layout, listing, &opts, display, known, true).await?;
    let (listing, tar) = opened.described.unwrap_or_default();
    let objects = listing.len();
    let checksums = !tar.is_empty() && tar.iter().all(|t| t.fields.is_empty() || !t.sums.is_empty());
    let m = manifest::Manifest::new(opened.layout, &listing, tar);
    let bytes = manifest::save(&opened.store, &m).await?;
    Ok(IndexReport {
        manifest: opened.store.describe(manifest::MANIFEST),
        manifest_bytes: bytes,
        layout: opened.layout,
        objects,
        samples: opened.source.len(),
        checksums,
        damage: opened.source.damage(),
    })
}

/// The deepest directory containing every path's parent.
fn common_dir(paths: &[PathBuf]) -> PathBuf {
    let mut parents = paths.iter().map(|p| p.parent().unwrap_or(Path::new("")).to_path_buf());
    let mut common = parents.next().unwrap_or_default();
    for p in parents {
        while !p.starts_with(&common) {
            if !common.pop() {
                break;
            }
        }
    }
    if common.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        common
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_dir_of_patterns() {
        let p = |v: &[&str]| common_dir(&v.iter().map(PathBuf::from).collect::<Vec<_>>());
        assert_eq!(p(&["/d/a/x.tar", "/d/a/y.tar"]), PathBuf::from("/d/a"));
        assert_eq!(p(&["/d/train/x.tar", "/d/val/y.tar"]), PathBuf::from("/d"));
        assert_eq!(p(&["x.tar", "y.tar"]), PathBuf::from("."));
    }

    #[test]
    fn hidden_and_sidecar_files_are_not_data() {
        assert!(is_dataset_file("a/b.jpg"));
        assert!(!is_dataset_file(".DS_Store"));
        assert!(!is_dataset_file("a/.git/config"));
        assert!(!is_dataset_file(&format!("s.tar{}", tar_index::SIDECAR_SUFFIX)));
    }
}
