//! From a URI and options to what opening needs, decided once: where the bytes are (a store,
//! or an LMDB environment's directory), the layout, what is there (a listing, or a
//! manifest's), and the shard indexes already known. [`open`](super::open),
//! [`index`](super::index) and [`diagnose`](crate::diagnose::diagnose) all come through here,
//! so they cannot disagree about what a URI names.
//!
//! Layout inference is [`infer`] (over [`Layout::of_shard_name`]'s table of shard suffixes)
//! and the LMDB rule is [`lmdb_dir`]; nothing else decides either. A new layout is one row in
//! that table (when its files are recognised by name) and one arm in [`construct`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::lmdb::DATA_FILE;
use super::tar_index::{self, ShardIndex};
use super::{jsonl, manifest, mix, parquet, records, tokens, DynSampleSource, LmdbSource, ObjectsSource, TarSource};
use crate::error::{Error, Result};
use crate::store::{ObjectInfo, Store};
use crate::uri::{self, Layout, Location, RemoteLocation, SourceOptions, INDEX_FILE};

mod sniff;
mod unfinished;

use sniff::sniff_indexes;
use unfinished::unfinished;
pub(crate) use unfinished::{PACK_RECORD, WRITE_RECORD};

/// A URI read, with the options that apply to it: the step before any I/O.
///
/// [`diagnose`](crate::diagnose::diagnose) changes the options between this step and opening
/// (to force the cache off over the URI's own query), which is why it is a step of its own.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    /// The URI as given, credentials redacted.
    pub display: String,
    /// The options passed in, overridden by the URI's query.
    pub options: SourceOptions,
    target: Target,
    /// A listing taken by another process that opened the same URI ([`super::snapshot`]):
    /// used in place of listing a directory or prefix.
    listing: Option<Box<manifest::Manifest>>,
    /// The record ([`PACK_RECORD`] or [`WRITE_RECORD`]) of the pack or write indexing its own
    /// unfinished output ([`Request::own_output`]): that record does not refuse it.
    own_record: Option<&'static str>,
}

#[derive(Clone, Debug)]
enum Target {
    /// A mix file or inline mix: its sources are resolved one by one when it opens.
    Mix(String),
    At(Location),
}

/// What a [`Request`] resolved to.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The URI as given, credentials redacted.
    pub display: String,
    /// The options in force.
    pub options: SourceOptions,
    /// The layout, forced or inferred.
    pub layout: Layout,
    /// Where the bytes are.
    pub place: Place,
}

/// Where a resolved source's bytes are.
#[derive(Debug)]
pub(crate) enum Place {
    /// An LMDB environment: the directory holding `data.mdb`.
    LmdbDir(PathBuf),
    /// Files or objects in a store.
    Store {
        store: Store,
        /// The files of the layout (a sharded layout's shards only), each looked up once.
        listing: Vec<ObjectInfo>,
        /// Indexes of the shards, from a manifest written for this layout.
        known: Option<Vec<ShardIndex>>,
        /// Whether the URI named a whole directory or prefix (listed, or read from its
        /// manifest) rather than files picked by name, pattern or list.
        whole: bool,
    },
}

impl Request {
    /// Read `uri`; the options in its query override `options`. A mix's options are per
    /// source, inside its file, so a mix URI has no query (inline JSON may hold a `?`).
    pub(crate) fn new(uri: &str, options: SourceOptions) -> Result<Self> {
        if mix::is_mix_uri(uri) {
            return Ok(Request {
                display: uri::redact(uri),
                options,
                target: Target::Mix(uri.to_string()),
                listing: None,
                own_record: None,
            });
        }
        let parsed = uri::parse(uri)?;
        Ok(Request {
            display: parsed.display,
            options: options.merged(parsed.options),
            target: Target::At(parsed.location),
            listing: None,
            own_record: None,
        })
    }

    /// The same request, made by the pack or write that keeps `record` in the output it
    /// names, to index it before it records itself finished: that record is not refused (the
    /// other tool's still is).
    pub(crate) fn own_output(self, record: &'static str) -> Self {
        Request { own_record: Some(record), ..self }
    }

    /// The same request, listing a directory or prefix from `snapshot` (what
    /// [`super::snapshot`] took) instead of the store.
    pub(crate) fn with_listing(self, snapshot: &[u8]) -> Result<Self> {
        let m = manifest::parse(snapshot, &format!("the listing snapshot of {}", self.display))?;
        Ok(Request { listing: Some(Box::new(m)), ..self })
    }

    /// A local directory read one file a sample, without a manifest: the paths of its files,
    /// sorted, none looked up ([`Store::list_names`]): what a listing snapshot of names only
    /// holds. `None` for anything else (remote, a manifest, another layout, a listing given),
    /// which [`Request::resolve`] lists as usual. Refused as an open would refuse it: empty, or
    /// holding an unfinished pack's output.
    pub(crate) async fn names_only(&self) -> Result<Option<Vec<String>>> {
        let Target::At(location @ Location::Local(path)) = &self.target else { return Ok(None) };
        let opts = &self.options;
        let objects = matches!(opts.layout, None | Some(Layout::Objects));
        let pair = megatron_prefix(path).is_some();
        if self.listing.is_some() || self.own_record.is_some() || !objects || pair || !local_meta(path)?.is_dir() {
            return Ok(None);
        }
        if lmdb_dir(location, opts.layout, &self.display)?.is_some() {
            return Ok(None);
        }
        // A manifest is read instead of any listing (one read, what resolving does): looked
        // for before the directory is listed.
        if opts.manifest.unwrap_or(true) && path.join(manifest::MANIFEST).exists() {
            return Ok(None);
        }
        let store = Store::local_for(path, opts)?;
        let Some(all) = store.list_names().await? else { return Ok(None) };
        let listed = |path: &str| all.binary_search_by(|n| n.as_str().cmp(path)).is_ok();
        unfinished(&store, listed, &self.display, None).await?;
        let names: Vec<String> = all.into_iter().filter(|n| is_dataset_file(n)).collect();
        if listed_layout(&store, opts, &names.iter().map(String::as_str).collect::<Vec<_>>()).await? != Layout::Objects
        {
            return Ok(None);
        }
        let names: Vec<String> = names.into_iter().filter(|n| Layout::Objects.holds(n)).collect();
        if names.is_empty() {
            return Err(Error::Empty {
                uri: self.display.clone(),
                reason: "no files found (hidden files and Stoker indexes are ignored)".into(),
            });
        }
        Ok(Some(names))
    }

    /// Whether this names a mix (several sources) rather than one location.
    pub(crate) fn is_mix(&self) -> bool {
        matches!(self.target, Target::Mix(_))
    }

    /// The same location under other options.
    pub(crate) fn with_options(self, options: SourceOptions) -> Self {
        Request { options, ..self }
    }

    /// Resolve and construct the source.
    pub(crate) async fn open(self) -> Result<Arc<DynSampleSource>> {
        match self.target {
            Target::Mix(uri) => mix::open_uri(&uri, self.options).await,
            Target::At(_) => construct(self.resolve().await?).await,
        }
    }

    /// Find where the bytes are, the layout and what is there.
    pub(crate) async fn resolve(self) -> Result<Resolved> {
        let Request { display, options: opts, target, listing: given, own_record } = self;
        let location = match target {
            Target::At(location) => location,
            Target::Mix(_) => {
                return Err(Error::invalid_option(format!(
                    "{display} is a mix: it names several sources, not one location; open it, or give one of its \
                     sources"
                )))
            }
        };
        if opts.layout == Some(Layout::Mix) {
            return Err(Error::invalid_option(format!(
                "{display}: layout=mix names no files; a mix is opened from a mix file (NAME.mix.json or \
                 NAME.mix.toml) or `mix:{{...}}`"
            )));
        }
        if let Some(dir) = lmdb_dir(&location, opts.layout, &display)? {
            return Ok(Resolved { display, options: opts, layout: Layout::Lmdb, place: Place::LmdbDir(dir) });
        }
        let (store, names) = match &location {
            Location::Local(path) => {
                let path = &megatron_prefix(path).unwrap_or_else(|| path.clone());
                if local_meta(path)?.is_file() {
                    let (parent, name) = split_file(path);
                    (Store::local_for(&parent, &opts)?, Some(vec![name]))
                } else {
                    (Store::local_for(path, &opts)?, None)
                }
            }
            Location::LocalPattern(paths) => {
                let root = common_dir(paths);
                let rel = paths.iter().map(|p| p.strip_prefix(&root).unwrap_or(p).to_string_lossy().into_owned());
                (Store::local_for(&root, &opts)?, Some(rel.collect()))
            }
            Location::Remote(loc) => {
                let store = Store::remote(loc, &opts, &display)?;
                let names = remote_names(&store, loc, &opts, &display).await?;
                (store, names)
            }
        };
        let (layout, listing, known) = match names {
            Some(names) => named(&store, names, &opts, &display).await?,
            None => listed(&store, &opts, given.map(|m| *m), &display, own_record).await?,
        };
        if listing.is_empty() {
            let reason = match layout {
                Layout::Objects => "no files found (hidden files and Stoker indexes are ignored)".to_string(),
                other => format!("no {other} shards found"),
            };
            return Err(Error::Empty { uri: display, reason });
        }
        let whole = matches!(&location, Location::Local(p) if p.is_dir())
            || matches!(&location, Location::Remote(loc) if loc.names.is_none() && opts.list.is_none());
        Ok(Resolved { display, options: opts, layout, place: Place::Store { store, listing, known, whole } })
    }
}

/// The source a resolution describes: one constructor per layout.
pub(crate) async fn construct(r: Resolved) -> Result<Arc<DynSampleSource>> {
    let Resolved { display, options: opts, layout, place } = r;
    Ok(match (layout, place) {
        (_, Place::LmdbDir(dir)) => Arc::new(LmdbSource::open(&dir, &opts, display)?),
        (Layout::Objects, Place::Store { store, listing, .. }) => {
            Arc::new(ObjectsSource::new(store, listing, &opts, display)?)
        }
        (Layout::Tar, Place::Store { store, listing, known, .. }) => {
            Arc::new(TarSource::open_with(store, listing, &opts, display, known).await?)
        }
        (Layout::Parquet, Place::Store { store, listing, .. }) => parquet::open(store, listing, &opts, display).await?,
        (Layout::Litdata, Place::Store { store, listing, .. }) => match tokens::litdata_tokens(&store, &listing).await?
        {
            Some(first) => tokens::open_litdata(store, listing, display, first).await?,
            None => records::open(layout, store, listing, &opts, display).await?,
        },
        (Layout::Mds, Place::Store { store, listing, .. }) => {
            records::open(layout, store, listing, &opts, display).await?
        }
        (Layout::Tokens, Place::Store { store, listing, .. }) => tokens::open(store, listing, &opts, display).await?,
        (Layout::Jsonl, Place::Store { store, listing, .. }) => jsonl::open(store, listing, &opts, display).await?,
        (Layout::Tfrecord, Place::Store { store, listing, .. }) => {
            super::tfrecord::open(store, listing, &opts, display).await?
        }
        (Layout::Hdf5, Place::Store { store, listing, .. }) => {
            super::hdf5::open(store, listing, &opts, display).await?
        }
        (Layout::Lmdb | Layout::Mix, Place::Store { .. }) => {
            return Err(Error::internal(format!("{display}: resolved to {layout} over a store, which cannot be")))
        }
    })
}

/// Layout inference: the layout `forced` by the options, else the first sharded layout any
/// of `names` is a shard of (a listing holding `.tar` files is tar shards), else one file
/// per sample.
pub(crate) fn infer<'a>(forced: Option<Layout>, names: impl IntoIterator<Item = &'a str>) -> Layout {
    forced.unwrap_or_else(|| names.into_iter().find_map(Layout::of_shard_name).unwrap_or(Layout::Objects))
}

/// The LMDB rule: LMDB is memory-mapped, so it is a local directory holding `data.mdb`
/// (named by the directory or by `data.mdb` itself), opened as LMDB unless another layout is
/// forced; `layout=lmdb` makes a local path's directory LMDB and is an error anywhere else.
pub(crate) fn lmdb_dir(location: &Location, forced: Option<Layout>, display: &str) -> Result<Option<PathBuf>> {
    let lmdb = forced == Some(Layout::Lmdb);
    match location {
        Location::Remote(_) if lmdb => Err(Error::NotSupported {
            what: format!(
                "{display}: LMDB is memory-mapped and needs a local directory; copy it to local disk, or convert it \
                 to tar shards (which read well remotely)"
            ),
        }),
        Location::LocalPattern(_) if lmdb => Err(Error::invalid_option(format!(
            "{display}: a brace pattern names tar shards or files, not an LMDB environment; give the LMDB directory"
        ))),
        Location::Local(path) if forced.is_none() || lmdb => {
            if path.is_dir() {
                Ok((lmdb || path.join(DATA_FILE).is_file()).then(|| path.clone()))
            } else if path.is_file() && (lmdb || path.file_name().is_some_and(|n| n == DATA_FILE)) {
                Ok(Some(split_file(path).0))
            } else {
                Ok(None)
            }
        }
        _ => Ok(None),
    }
}

/// The `.idx` of the Megatron pair a local `path` names by its data prefix (`/data/corpus` for
/// `corpus.bin` and `corpus.idx`, as Megatron-LM's `--data-path` takes it), when nothing is
/// at `path` itself.
fn megatron_prefix(path: &Path) -> Option<PathBuf> {
    let mut idx = path.as_os_str().to_owned();
    idx.push(tokens::IDX_SUFFIX);
    let idx = PathBuf::from(idx);
    (!path.exists() && idx.is_file()).then_some(idx)
}

/// A local path's metadata, or an error saying it is not there.
fn local_meta(path: &Path) -> Result<std::fs::Metadata> {
    std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            what: path.display().to_string(),
            hint: Some(
                "no such file or directory; check the path (relative paths start at the working directory)".into(),
            ),
        },
        _ => Error::io(path.display(), e),
    })
}

/// A file's directory (`.` for a bare name) and its name.
fn split_file(path: &Path) -> (PathBuf, String) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    (parent.to_path_buf(), name)
}

/// The objects a remote URI names (by pattern, as one file, or with `?list=`), or `None`
/// when the prefix is to be listed.
async fn remote_names(
    store: &Store,
    loc: &RemoteLocation,
    opts: &SourceOptions,
    display: &str,
) -> Result<Option<Vec<String>>> {
    match (&loc.names, &opts.list) {
        (Some(n), _) => Ok(Some(n.clone())),
        (None, Some(list)) => {
            let text = store.get(list).await?;
            let text = String::from_utf8_lossy(&text);
            let names = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
            Ok(Some(names.map(str::to_string).collect()))
        }
        (None, None) if loc.scheme.starts_with("http") => Err(Error::InvalidUri {
            uri: display.to_string(),
            reason: "HTTP servers cannot be listed: name the shards with a brace pattern \
                     (https://host/data/train-{0000..0099}.tar) or give ?list=FILE with one object name per line"
                .into(),
        }),
        (None, None) => Ok(None),
    }
}

/// Files picked by name: the layout from the names, then every name looked up once, so a
/// typo in a pattern fails at open, not mid-epoch.
async fn named(
    store: &Store,
    names: Vec<String>,
    opts: &SourceOptions,
    display: &str,
) -> Result<(Layout, Vec<ObjectInfo>, Option<Vec<ShardIndex>>)> {
    let mut layout = infer(opts.layout, names.iter().map(String::as_str));
    if opts.layout.is_none() && layout == Layout::Objects {
        let indexes = names.iter().map(String::as_str).filter(|n| Layout::Mds.holds(n));
        let beside: Vec<&str> = names.iter().map(String::as_str).collect();
        // Only `index.json` named: an index no reader takes is refused, not read as a file.
        let alone = !names.is_empty() && names.iter().all(|n| n.rsplit('/').next() == Some(INDEX_FILE));
        layout = sniff_indexes(store, indexes, &beside, alone).await?.unwrap_or(layout);
    }
    // A Megatron pair named by its `.bin` (a flat token file is one only with `separator=`).
    let names = match megatron_bins(store, layout, opts, &names).await? {
        Some(idx) => {
            layout = Layout::Tokens;
            idx
        }
        None => names,
    };
    if let Some(stray) = names.iter().find(|n| !layout.holds(n)) {
        // A file named on purpose is never dropped in silence.
        return Err(Error::invalid_option(format!(
            "{display} names `{stray}`, which is not a {layout} shard; name only shards, or give ?layout=objects to \
             read each file as one sample"
        )));
    }
    // Under `on_damage=skip` a shard that does not exist is damage like any other.
    let missing_ok = opts.skip_damage() && layout != Layout::Objects;
    let listing = head_all(store, &names, opts.concurrency(), missing_ok).await.map_err(|e| match e {
        // Named by the URI, not seen before: it never was there (the store's hint says it
        // disappeared since the source was opened).
        Error::NotFound { what, .. } => Error::NotFound {
            what,
            hint: Some(if layout == Layout::Objects {
                "the URI names it (a brace range or list) and it does not exist: check the range".into()
            } else {
                "the URI names it (a brace range or list) and it does not exist: check the range, or open with \
                 on_damage=skip to read the shards that do"
                    .into()
            }),
        },
        e => e,
    })?;
    Ok((layout, listing, None))
}

/// The `.idx` names of Megatron pairs `names` gives by their `.bin` files: `Some` when every
/// name is a `.bin`, the first has its `.idx` beside it, the layout is inferred as one file a
/// sample (a lone `.bin` is no shard) or forced to tokens, and no `separator=` makes them flat
/// token files. The rest are looked up with the pairs (concurrently; a missing one is damage
/// like any missing shard). Locally the first is only a probe: one it cannot look up leaves the
/// names as files. A remote store is asked only under `layout=tokens` (a request to a server
/// that may redirect, refuse or answer 403 for a name it does not hold, for a `.bin` that is
/// otherwise one file), and what it answers but "not found" is the open's error.
async fn megatron_bins(
    store: &Store,
    layout: Layout,
    opts: &SourceOptions,
    names: &[String],
) -> Result<Option<Vec<String>>> {
    let inferred = opts.layout.is_none() && layout == Layout::Objects && !store.is_remote();
    let forced = opts.layout == Some(Layout::Tokens) && opts.separator.is_none();
    if !(inferred || forced) || names.is_empty() || !names.iter().all(|n| n.ends_with(".bin")) {
        return Ok(None);
    }
    let idx: Vec<String> = names.iter().map(|n| format!("{}{}", &n[..n.len() - 4], tokens::IDX_SUFFIX)).collect();
    match store.head(&idx[0]).await {
        Ok(_) => Ok(Some(idx)),
        Err(e) if store.is_remote() && e.kind() != crate::ErrorKind::NotFound => Err(e),
        Err(_) => Ok(None),
    }
}

/// A directory or prefix: from its manifest when there is one (one read, no listing), else
/// by listing it. A listed one that a `stoker pack` or a shard writer's job has not finished
/// is refused (see [`unfinished`]; `display` names it), but for the record `own` (the pack or
/// job indexing its own output).
async fn listed(
    store: &Store,
    opts: &SourceOptions,
    given: Option<manifest::Manifest>,
    display: &str,
    own: Option<&'static str>,
) -> Result<(Layout, Vec<ObjectInfo>, Option<Vec<ShardIndex>>)> {
    let found = match given {
        None if opts.manifest.unwrap_or(true) => manifest::load(store).await?,
        given => given,
    };
    if let Some(mut m) = found {
        let layout = opts.layout.unwrap_or(m.layout);
        if let Some(names) = m.take_names() {
            // A snapshot of names only ([`Request::names_only`]): looked up here, in parallel
            // with the other readers of the same directory, each its own part.
            if layout != Layout::Objects {
                return Err(Error::invalid_option(format!(
                    "{display}: its listing snapshot names files read one a sample, and layout={layout} was asked; \
                     open it with the options the snapshot was taken with"
                )));
            }
            let names = names.into_iter().filter(|n| layout.holds(n)).collect();
            return Ok((layout, store.stat_names(names, opts.skip_damage()).await?, None));
        }
        let mut listing: Vec<ObjectInfo> = m.take_listing().into_iter().filter(|o| layout.holds(&o.path)).collect();
        if layout != Layout::Objects && store.local_root().is_some() {
            // Local shards are stat'ed again (cheap, concurrent): one rewritten since
            // `stoker index` no longer matches its index and is re-indexed, not read at its
            // old offsets. Remote reads carry the indexed entity tag instead (If-Match),
            // so a remote manifest stays one GET.
            let shards: Vec<String> = listing.into_iter().map(|o| o.path).collect();
            listing = head_all(store, &shards, opts.concurrency(), opts.skip_damage()).await?;
        }
        // A snapshot of shards not indexed yet holds no indexes: they are loaded or built.
        let unindexed = layout == Layout::Tar && m.tar.is_empty();
        let known = (layout == m.layout && !unindexed).then_some(m.tar);
        return Ok((layout, topmost_indexes(layout, listing), known));
    }
    let all = store.list().await?;
    unfinished(store, |record| all.iter().any(|o| o.path == record), display, own).await?;
    let listing: Vec<ObjectInfo> = all.into_iter().filter(|o| is_dataset_file(&o.path)).collect();
    let layout = listed_layout(store, opts, &listing.iter().map(|o| o.path.as_str()).collect::<Vec<_>>()).await?;
    Ok((layout, topmost_indexes(layout, listing.into_iter().filter(|o| layout.holds(&o.path)).collect()), None))
}

/// The layout of a listed directory or prefix whose dataset files are `paths`: forced by the
/// options, or inferred from the names, and for one file a sample, from an `index.json` at
/// the root if there is one.
async fn listed_layout(store: &Store, opts: &SourceOptions, paths: &[&str]) -> Result<Layout> {
    let layout = infer(opts.layout, paths.iter().copied());
    if opts.layout.is_some() || layout != Layout::Objects {
        return Ok(layout);
    }
    // Only the index at the root: one in a subdirectory may belong to files read as files.
    let root = paths.iter().copied().filter(|p| *p == INDEX_FILE);
    let beside: Vec<&str> = paths.iter().copied().filter(|p| !p.contains('/')).collect();
    Ok(sniff_indexes(store, root, &beside, false).await?.unwrap_or(layout))
}

/// For a layout read from `index.json` files (MDS, LitData): the indexes not below another
/// one. An index names its shards wherever they lie, and MosaicML's `merge_index` writes one at
/// the root naming the shards of subdirectories that keep their own: read as well, those
/// would give every sample twice. (MosaicML Streaming reads only the root's.)
fn topmost_indexes(layout: Layout, listing: Vec<ObjectInfo>) -> Vec<ObjectInfo> {
    if !layout.is_indexed() {
        return listing;
    }
    let dirs: std::collections::HashSet<String> =
        listing.iter().filter_map(|o| o.path.strip_suffix(INDEX_FILE)).map(str::to_string).collect();
    let below_another = |path: &str| {
        let dir = path.strip_suffix(INDEX_FILE).unwrap_or(path);
        dir.char_indices().filter(|&(_, c)| c == '/').any(|(i, _)| i + 1 < dir.len() && dirs.contains(&dir[..=i]))
            || (!dir.is_empty() && dirs.contains(""))
    };
    listing.into_iter().filter(|o| !below_another(&o.path)).collect()
}

/// Files that are never samples or shards: hidden files (any path component starting with
/// a dot) and Stoker's own sidecar indexes.
pub(crate) fn is_dataset_file(path: &str) -> bool {
    let sidecar = path.ends_with(tar_index::SIDECAR_SUFFIX) || super::span_index::is_index(path);
    !sidecar && !path.split('/').any(|c| c.starts_with('.'))
}

/// Look up every named object, `concurrency` at a time. With `missing_ok` (shards under
/// `on_damage=skip`), one that does not exist is listed with size 0: opening then finds it
/// unreadable and skips it whole, reported like any damage, instead of failing the open.
async fn head_all(store: &Store, names: &[String], concurrency: usize, missing_ok: bool) -> Result<Vec<ObjectInfo>> {
    // Futures collected first: a lazy `map` over borrowed names makes the whole open future
    // fail the compiler's higher-ranked Send check (it could not be spawned).
    let heads: Vec<_> = names
        .iter()
        .map(|p| async move {
            match store.head(p).await {
                Err(e) if missing_ok && e.kind() == crate::ErrorKind::NotFound => Ok(ObjectInfo::missing(p.clone())),
                other => other,
            }
        })
        .collect();
    futures::stream::iter(heads).buffered(concurrency).try_collect().await
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
mod tests;
