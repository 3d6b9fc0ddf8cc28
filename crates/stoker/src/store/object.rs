//! The one read path. A layout names an object at one version ([`Object`]) and the byte
//! spans of the samples it needs; the store plans the reads (merging spans by the source's
//! `coalesce_gap` and `max_read`), picks the path (a local positioned read, or the remote
//! read path with its memory and disk caches and the fetch layer), applies the version rule,
//! and hands back each span's bytes. No layout merges ranges, picks a cache or asks which
//! store it has.
//!
//! The version rule, for every layout and store:
//! - every read of an object within a run is pinned to one version: the one listed or
//!   looked up this run, else the one a manifest or index recorded, until a read confirms it;
//! - a strong entity tag is sent as the precondition, a weak one or none never is, and every
//!   answer's size, tag and time are compared with the pinned version
//!   ([`crate::fetch::Expect`]): a change mid-run is [`Error::Changed`] naming the object,
//!   never other bytes;
//! - a version that only a manifest or index recorded (data copied to the store by another
//!   tool has new entity tags) is checked once, when the store refuses it: an object of the
//!   recorded size is adopted at the version the store has now (the layouts check what they
//!   read against their indexes, tar headers and digests), one of another size is an error;
//! - local files are read where they are: a file damaged or cut short in place after it was
//!   indexed is damage, which the layouts' own checks find (tar headers, payload digests,
//!   offset tables against the length read), sample by sample, so the samples before a cut
//!   stay readable; a file of one sample (the objects layout) is held to its size.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{version_key, Backend, ObjectInfo, Store};
use crate::error::{Error, Result};
use crate::fetch::Expect;
use crate::ranges;

/// An object as a layout reads it: its path, size and the version every read is pinned to
/// (see the module docs). Cheap to clone; clones share the pin.
#[derive(Clone)]
pub struct Object(Arc<Pinned>);

struct Pinned {
    path: String,
    size: u64,
    version: Mutex<Version>,
    /// Held while one read checks a recorded version with the store, so the others wait for
    /// its answer instead of asking again.
    refresh: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Version {
    expect: Expect,
    /// What the block cache keys this version's bytes by.
    key: String,
    /// Whether this run's store confirmed it (listed, looked up, or read under it).
    confirmed: bool,
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object").field("path", &self.0.path).field("size", &self.0.size).finish_non_exhaustive()
    }
}

impl Object {
    fn new(info: &ObjectInfo, confirmed: bool) -> Self {
        Object(Arc::new(Pinned {
            path: info.path.clone(),
            size: info.size,
            version: Mutex::new(Version::of(info, confirmed)),
            refresh: tokio::sync::Mutex::new(()),
        }))
    }

    /// Path relative to the store root.
    pub fn path(&self) -> &str {
        &self.0.path
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.0.size
    }

    /// What the block cache keys the pinned version's bytes by.
    pub fn version_key(&self) -> String {
        self.version().key
    }

    /// The version every read is held to (see the module docs).
    pub(crate) fn pinned(&self) -> Expect {
        self.version().expect
    }

    fn version(&self) -> Version {
        self.0.version.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A read under `key` succeeded: the version is this run's from now on.
    fn confirm(&self, key: &str) {
        let mut v = self.0.version.lock().unwrap_or_else(|e| e.into_inner());
        if v.key == key {
            v.confirmed = true;
        }
    }
}

impl Version {
    fn of(info: &ObjectInfo, confirmed: bool) -> Self {
        Version {
            expect: info.expect(),
            key: version_key(info.e_tag.as_deref(), info.modified_us, info.size),
            confirmed,
        }
    }
}

/// Local files [`Store::read_all_many`] reads in turn on one blocking thread.
const LOCAL_RUN: usize = 32;

impl Store {
    /// `info`'s object, pinned to its version: one listed or looked up in this run is held
    /// to it; one [`recorded`](ObjectInfo::recorded) by a manifest or index is checked with
    /// the store the first time the store refuses it (see the module docs).
    pub fn object(&self, info: &ObjectInfo) -> Object {
        Object::new(info, !info.recorded)
    }

    /// Look an object up (one request for a remote store) and pin its version.
    pub async fn open_object(&self, path: &str) -> Result<Object> {
        Ok(self.object(&self.head(path).await?))
    }

    /// The bytes of each of `spans` of `obj`, in the order asked (an empty span is empty):
    /// the spans are merged into reads under the source's read plan, read through the path
    /// the store has (local file, or remote through the caches), under the version rule, and
    /// cut back into spans without a copy. A short read is an error.
    pub async fn read(&self, obj: &Object, spans: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.within(obj, spans)?;
        let plan = ranges::merge(spans, &self.0.policy);
        // The remote path merges requests itself (runs of missing cache blocks, ranges closer
        // than the gap) and cuts each span from what it fetched, as a slice of the part or
        // block it lies in: merging here too would join a window's samples into one buffer
        // per shard, a copy of every byte (and of every gap's, and with several ranks on a
        // node, of every rank's samples). Reads are counted as planned, as requested.
        let asked = matches!(self.0.backend, Backend::Remote { .. }).then(|| ranges::Merged::each(spans));
        let read = asked.as_ref().unwrap_or(&plan);
        let got = self.read_planned(obj, &read.reads).await?;
        self.count(plan.reads.len() as u64, got.iter().map(|b| b.len() as u64).sum());
        let got = self.lengths_checked(obj.path(), &read.reads, got)?;
        Ok(read.cut(spans, &got))
    }

    /// One span of `obj` (see [`read`](Self::read)).
    pub async fn read_span(&self, obj: &Object, span: Range<u64>) -> Result<Bytes> {
        Ok(self.read(obj, std::slice::from_ref(&span)).await?.pop().unwrap_or_default())
    }

    /// The whole of `obj`, in one request for a remote store, around the caches (a file
    /// read once, such as a shard compressed as a whole, would only push out blocks that are
    /// read again), under the version rule; a local file is held to its size.
    pub async fn read_all(&self, obj: &Object) -> Result<Bytes> {
        let out = match &self.0.backend {
            Backend::Local(l) => {
                let (path, shown) = (self.obj_path(obj.path()), self.describe(obj.path()));
                l.read(path, shown, None, Some(obj.size())).await?.pop().unwrap_or_default()
            }
            Backend::Remote { reader, .. } => {
                let (path, shown) = (&self.obj_path(obj.path()), &self.describe(obj.path()));
                self.under_version(obj, |v| async move {
                    reader.fetcher().get(path, shown, Some(&v.expect), u64::MAX).await
                })
                .await?
            }
        };
        Ok(self.checked(obj.path(), std::slice::from_ref(&(0..obj.size())), vec![out])?.pop().unwrap_or_default())
    }

    /// Each of `objs` whole, as [`read_all`](Self::read_all) reads one, in order, `concurrency`
    /// reads at once. Local files go in runs of 32, each run read one file after
    /// another on one blocking thread: a blocking task a file cost two thread handoffs a file,
    /// and a packer reading small files spent more of its time switching threads than reading
    /// them. The runs still go in parallel, which a network file system's latency needs.
    pub async fn read_all_many(&self, objs: Vec<Object>, concurrency: usize) -> Result<Vec<Bytes>> {
        use futures::{StreamExt, TryStreamExt};
        if !self.reads_whole_directly() {
            let reads: Vec<_> = objs.iter().map(|o| self.read_all(o)).collect();
            return futures::stream::iter(reads).buffered(concurrency.max(1)).try_collect().await;
        }
        let runs: Vec<Vec<Object>> = objs.chunks(LOCAL_RUN).map(<[_]>::to_vec).collect();
        let runs = runs.into_iter().map(|run| {
            let store = self.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    let mut reader = store.direct_reader().ok_or_else(|| Error::internal("a local store's reader"))?;
                    run.iter()
                        .map(|obj| {
                            // Allocated fallibly: a file too large for memory is an error
                            // naming it, not an abort.
                            let len = usize::try_from(obj.size()).unwrap_or(usize::MAX);
                            let mut data =
                                crate::buffer::try_take(len).map_err(|e| Error::io(store.describe(obj.path()), e))?;
                            reader.read_whole(obj, &mut data[..len])?;
                            Ok(crate::buffer::freeze(data, len))
                        })
                        .collect::<Result<Vec<Bytes>>>()
                })
                .await
                .map_err(Error::task)?
            }
        });
        let read: Vec<Vec<Bytes>> = futures::stream::iter(runs).buffered(concurrency.max(1)).try_collect().await?;
        Ok(read.into_iter().flatten().collect())
    }

    /// `span` of `obj` read once (an index walk over a shard): around the caches, which it
    /// would only fill with blocks nobody asked to keep, under the version rule.
    pub(crate) async fn read_once(&self, obj: &Object, span: Range<u64>) -> Result<Bytes> {
        let spans = std::slice::from_ref(&span);
        self.within(obj, spans)?;
        let out = match &self.0.backend {
            Backend::Local(_) => return self.read_span(obj, span).await,
            Backend::Remote { reader, .. } => {
                let (path, shown) = (&self.obj_path(obj.path()), &self.describe(obj.path()));
                self.under_version(obj, |v| async move { reader.get_ranges(path, shown, spans, Some(&v.expect)).await })
                    .await?
            }
        };
        Ok(self.checked(obj.path(), spans, out)?.pop().unwrap_or_default())
    }

    /// Refuse spans that do not lie inside `obj` before anything is allocated for them: they
    /// come from an index, a footer or an offset table, and one that claims more than the
    /// object holds is damage (or a lie), never a reason to allocate it.
    pub(super) fn within(&self, obj: &Object, spans: &[Range<u64>]) -> Result<()> {
        match spans.iter().find(|s| s.start > s.end || s.end > obj.size()) {
            None => Ok(()),
            Some(s) => Err(Error::CorruptData {
                shard: self.describe(obj.path()),
                key: String::new(),
                field: String::new(),
                reason: format!(
                    "bytes {}..{} were asked for, past the end of its {} bytes: the file is shorter than its \
                     index, footer or offset table says (truncated, or they lie); write it again, or leave it out",
                    s.start,
                    s.end,
                    obj.size()
                ),
            }),
        }
    }

    /// `reads` (sorted, disjoint: a plan's) of `obj` by the store's path, one buffer each,
    /// not yet counted nor checked.
    async fn read_planned(&self, obj: &Object, reads: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let out = match &self.0.backend {
            Backend::Local(l) => {
                let (path, shown) = (self.obj_path(obj.path()), self.describe(obj.path()));
                // Held to its size, as `read_all` is: a file replaced since it was looked up
                // (or since a manifest recorded it) at another size holds other bytes at the
                // planned offsets, and formats without checksums would deliver them.
                l.read(path, shown, Some(reads.to_vec()), Some(obj.size())).await?
            }
            Backend::Remote { reader, .. } => {
                let (path, shown) = (&self.obj_path(obj.path()), &self.describe(obj.path()));
                self.under_version(obj, |v| async move {
                    reader.get_ranges_cached(path, shown, reads, &v.key, &v.expect).await
                })
                .await?
            }
        };
        Ok(out)
    }

    /// Run `read` under `obj`'s pinned version. When the store says the object is not that
    /// version and the version was only recorded (a manifest's or an index's), look the
    /// object up once: at the recorded size it is adopted at its current version and read
    /// again; at another size the read fails as [`Error::Changed`].
    async fn under_version<T, F, Fut>(&self, obj: &Object, read: F) -> Result<T>
    where
        F: Fn(Version) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let v = obj.version();
        match read(v.clone()).await {
            Ok(out) => {
                if !v.confirmed {
                    obj.confirm(&v.key);
                }
                Ok(out)
            }
            Err(e) if is_changed(&e) && !v.confirmed => {
                let _one_at_a_time = obj.0.refresh.lock().await;
                let now = obj.version();
                let v = if now.key != v.key || now.confirmed {
                    // Another read checked meanwhile.
                    now
                } else {
                    let head = self.head(obj.path()).await?;
                    if head.size != obj.size() {
                        return Err(Error::Changed {
                            object: self.describe(obj.path()),
                            reason: format!(
                                "it is {} bytes, not the {} its manifest or index recorded",
                                head.size,
                                obj.size()
                            ),
                        });
                    }
                    let fresh = Version::of(&head, true);
                    *obj.0.version.lock().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
                    fresh
                };
                read(v).await
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether `e` says an object is not the version a read expects.
pub(crate) fn is_changed(e: &Error) -> bool {
    match e {
        Error::Changed { .. } => true,
        Error::Shared(inner) => is_changed(inner),
        _ => false,
    }
}
