//! `index`: build or refresh a dataset's shard indexes and write its manifest.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::resolve::{self, Place, Request, Resolved};
use super::{manifest, tar_index, DynSampleSource, TarSource};
use crate::error::{Error, Result};
use crate::store::{ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// What `index` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    index_boxed(uri, options, progress).await
}

/// [`index_with_progress`], compiled here (see the note at the crate's `pub use`s).
fn index_boxed<'a>(
    uri: &'a str,
    options: SourceOptions,
    progress: &'a (dyn Fn(usize, usize) + Send + Sync),
) -> futures::future::BoxFuture<'a, Result<IndexReport>> {
    use futures::FutureExt;
    async move { index_with(uri, options, progress, &Default::default(), None).await }.boxed()
}

/// [`index_with_progress`], given checksums already known per shard path (`pack` computed
/// them as it wrote the shards). `own_output`: the record of the pack or write that made the
/// directory and indexes it as its last step, before it records itself finished (anyone else
/// is refused an unfinished one).
pub(crate) async fn index_with(
    uri: &str,
    options: SourceOptions,
    progress: &(dyn Fn(usize, usize) + Send + Sync),
    known_sums: &HashMap<String, Vec<u64>>,
    own_output: Option<&'static str>,
) -> Result<IndexReport> {
    let mut request = Request::new(uri, options)?;
    if let Some(record) = own_output {
        request = request.own_output(record);
    }
    // Always from the truth: list and re-check every shard, ignoring an old manifest.
    request.options.manifest = Some(false);
    let resolved = request.resolve().await?;
    let (store, listing, whole) = match &resolved.place {
        Place::LmdbDir(_) => {
            return Err(Error::NotSupported {
                what: format!("{}: LMDB keeps its own index; there is nothing to build", resolved.display),
            })
        }
        Place::Store { store, listing, whole, .. } => (store.clone(), listing.clone(), *whole),
    };
    if !whole {
        return Err(Error::InvalidUri {
            uri: resolved.display,
            reason: "`index` takes a directory or prefix (the manifest goes at its root), not a pattern or file".into(),
        });
    }
    let layout = resolved.layout;
    // The source is opened from the indexes just built, so its sample count and damage are
    // what later opens from the manifest will see, and the manifest records the indexes it holds.
    let (source, tar): (Arc<DynSampleSource>, _) = match layout {
        Layout::Tar => {
            let indexes = index_shards(&store, &listing, &resolved.options, progress, known_sums).await?;
            let Resolved { display, options, .. } = resolved;
            let tar = TarSource::open_with(store.clone(), listing.clone(), &options, display, Some(indexes)).await?;
            let indexes = tar.indexes();
            (Arc::new(tar), indexes)
        }
        _ => {
            progress(listing.len(), listing.len());
            (resolve::construct(resolved).await?, Vec::new())
        }
    };
    let checksums = !tar.is_empty() && tar.iter().all(|t| t.fields.is_empty() || !t.sums.is_empty());
    let m = manifest::Manifest::new(layout, &listing, tar);
    let bytes = manifest::save(&store, &m).await?;
    Ok(IndexReport {
        manifest: store.describe(manifest::MANIFEST),
        manifest_bytes: bytes,
        layout,
        objects: listing.len(),
        samples: source.len(),
        checksums,
        damage: source.damage(),
    })
}

/// Every shard's index, loaded or built, `progress` told as each is ready.
async fn index_shards(
    store: &Store,
    shards: &[ObjectInfo],
    opts: &SourceOptions,
    progress: &(dyn Fn(usize, usize) + Send + Sync),
    known_sums: &HashMap<String, Vec<u64>>,
) -> Result<Vec<tar_index::ShardIndex>> {
    let total = shards.len();
    let done = AtomicUsize::new(0);
    tar_index::walk_all(total, opts.concurrency().min(8), |i, cancel| {
        let (s, done) = (&shards[i], &done);
        async move {
            let idx = index_shard(store, s, opts, known_sums.get(&s.path), &cancel).await?;
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
            Ok(idx)
        }
    })
    .await
}

/// The index of one shard: with `sums` (the XXH3-64s `pack` computed as it wrote the shard)
/// recorded without reading the payloads again.
async fn index_shard(
    store: &Store,
    info: &ObjectInfo,
    opts: &SourceOptions,
    sums: Option<&Vec<u64>>,
    cancel: &crate::store::Cancel,
) -> Result<tar_index::ShardIndex> {
    let Some(sums) = sums else { return tar_index::for_open(store, info, opts, None, cancel).await };
    let headers_only = SourceOptions { checksums: None, ..opts.clone() };
    let mut idx = tar_index::for_open(store, info, &headers_only, None, cancel).await?;
    if idx.sums.is_empty() && idx.damage.is_empty() && sums.len() == idx.fields.len() {
        idx.sums = sums.clone();
        idx.digest = tar_index::PayloadDigest::Xxh3;
        tar_index::save(store, &idx, opts).await;
    } else if idx.sums.is_empty() && opts.checksums == Some(true) {
        // Not the members `pack` wrote (a foreign file in the destination): read them.
        return tar_index::for_open(store, info, opts, None, cancel).await;
    }
    Ok(idx)
}
