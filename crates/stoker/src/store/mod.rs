//! Where bytes live, and the one owner of I/O.
//!
//! Layout code and `pack` ask a [`Store`] for listings, metadata files and writes by path
//! relative to the store root, and read data through one verb: [`Store::read`], the byte
//! spans of an [`Object`] pinned to one version (`store::object` has the read plan and the
//! version rule). They never open files, send requests, merge ranges or ask which backend
//! they have, so what a store counts ([`IoCounters`]) is everything read. A store is one of
//! two backends: a local directory (positioned reads on blocking threads, into recycled
//! buffers or straight into a batch) or a remote object store (every read through the read
//! path and block cache, [`crate::cache::RemoteReader`], and every request through the fetch
//! layer, [`crate::fetch`]). Which reads to merge and how to split them is decided once, in
//! [`ranges`].

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::ObjectStoreExt;

use crate::cache::RemoteReader;
use crate::error::{Error, Result};

mod blocking;
mod direct;
mod fingerprint;
mod local;
mod lock;
mod mapped;
mod object;
mod remote;
mod upload;
mod walk;
mod write;

/// Range merging and splitting (at the crate root: the fetch layer and the caches use it too).
pub use crate::ranges;
pub use crate::small_file::{read_capped, SMALL_FILE_BYTES};
pub use blocking::BlockReader;
pub(crate) use blocking::Cancel;
// HDF5 files are read through the blocking reader (the hdf5 crate reads synchronously).
#[cfg(feature = "hdf5")]
pub(crate) use blocking::RangeReader;
pub(crate) use direct::{gone, is_gone, DirectReader};
pub(crate) use local::{create_fresh, is_temp_name, publish, temp_name, temp_target};
pub(crate) use lock::lock_dest;
pub(crate) use mapped::{MapAdvice, MappedObject};
pub use object::Object;
pub use write::ObjectWriter;

/// An object in a store: its path relative to the store root and what identifies its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the store root, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, microseconds since the Unix epoch.
    pub modified_us: i64,
    /// The store's version tag, if it has one (local: inode, mtime and size).
    pub e_tag: Option<String>,
    /// Whether this comes from a manifest or index written earlier, not from this run's
    /// listing or lookup: reads check it with the store once (see [`Store::object`]).
    pub recorded: bool,
}

impl ObjectInfo {
    /// What a read of this version expects of the store's answer (its size, tag and time).
    pub(crate) fn expect(&self) -> crate::fetch::Expect {
        crate::fetch::Expect { size: self.size, e_tag: self.e_tag.clone(), modified_us: self.modified_us }
    }

    /// An object named (in a URI or a listing) that is not there, kept under a damage policy
    /// that skips what cannot be read: size 0 and no version, so its read fails (nothing is
    /// there, or something of another size now) and the policy skips it, reported as damage.
    pub(crate) fn missing(path: String) -> Self {
        ObjectInfo { path, size: 0, modified_us: 0, e_tag: None, recorded: false }
    }
}

pub use crate::stats::IoCounters;

/// The most bytes [`Store::get`] reads of one file: an index, a manifest or a list of names
/// is read whole into memory, and a dataset whose index is larger (a million MDS shards take
/// about 450 MB) is better split into directories with an index each.
pub const MAX_WHOLE_FILE: u64 = 1 << 30;

/// A cheaply cloneable handle on a store rooted at a directory or prefix.
#[derive(Clone)]
pub struct Store(Arc<Inner>);

struct Inner {
    backend: Backend,
    /// Display form of the root (a path or a redacted URI).
    root: String,
    /// How [`Store::read`] merges the spans it is asked for (the source's `coalesce_gap`
    /// and `max_read`).
    policy: ranges::Policy,
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// Where the bytes are: the one switch between local and remote I/O.
enum Backend {
    /// A local directory.
    Local(local::Local),
    /// A remote object store: `prefix` is the path inside it every relative path is under.
    Remote { reader: Arc<RemoteReader>, prefix: String },
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("root", &self.0.root).finish_non_exhaustive()
    }
}

impl fmt::Display for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.root)
    }
}

impl Store {
    fn new(backend: Backend, root: String, policy: ranges::Policy) -> Self {
        Store(Arc::new(Inner { backend, root, policy, requests: AtomicU64::new(0), bytes: AtomicU64::new(0) }))
    }

    /// A store over a local directory, which must exist, reading with the default plan.
    pub fn local(dir: &Path) -> Result<Self> {
        Self::local_for(dir, &crate::uri::SourceOptions::default())
    }

    /// A store over a local directory, which must exist, reading as `opts` say
    /// (`coalesce_gap`, `max_read`).
    pub fn local_for(dir: &Path, opts: &crate::uri::SourceOptions) -> Result<Self> {
        let local = local::Local::new(dir)?;
        let root = local.dir().display().to_string();
        Ok(Store::new(Backend::Local(local), root, ranges::Policy::new(opts.coalesce_gap(false), opts.max_read())))
    }

    /// The local directory behind this store, if it is local.
    pub fn local_root(&self) -> Option<&Path> {
        match &self.0.backend {
            Backend::Local(l) => Some(l.dir()),
            Backend::Remote { .. } => None,
        }
    }

    /// A human-readable location of `path` for messages (`/data/shards/a.tar`).
    pub fn describe(&self, path: &str) -> String {
        if path.is_empty() {
            self.0.root.clone()
        } else {
            format!("{}/{}", self.0.root.trim_end_matches('/'), path)
        }
    }

    /// Wait until the disk cache's blocks written behind reads are on disk (a no-op for a
    /// local store, or without a cache).
    pub async fn flush(&self) {
        if let Backend::Remote { reader, .. } = &self.0.backend {
            if let Some(cache) = reader.cache() {
                cache.flush().await;
            }
        }
    }

    /// A future that is done once what reads have fetched so far is in the disk cache (the
    /// writes behind them landed), and can then be read with no request
    /// ([`servable_directly`](Self::servable_directly)); `None` where nothing fetched is kept
    /// on disk (a local store, or no disk cache).
    pub(crate) fn stored(&self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let disk = self.remote_reader()?.cache()?.disk_limit().is_some();
        let store = self.clone();
        disk.then_some(async move { store.flush().await })
    }

    /// Requests and bytes served so far.
    pub fn counters(&self) -> IoCounters {
        let mut c = IoCounters {
            requests: self.0.requests.load(Ordering::Relaxed),
            bytes: self.0.bytes.load(Ordering::Relaxed),
            ..Default::default()
        };
        if let Some(f) = self.fetch_counters() {
            c.remote_requests = f.requests.load(Ordering::Relaxed);
            c.remote_bytes = f.bytes.load(Ordering::Relaxed);
            c.retries = f.retries.load(Ordering::Relaxed);
            c.hedges = f.hedges.load(Ordering::Relaxed);
            c.hedge_wins = f.hedge_wins.load(Ordering::Relaxed);
        }
        if let Some(r) = self.remote_reader() {
            let limit = r.fetcher().limit();
            c.in_flight_limit = limit.current() as u64;
            c.peak_in_flight = limit.peak() as u64;
            c.in_flight_waits = limit.waits();
        }
        if let Some(k) = self.cache_counters() {
            c.cache_hits = k.hits.load(Ordering::Relaxed);
            c.cache_misses = k.misses.load(Ordering::Relaxed);
            c.disk_hits = k.disk_hits.load(Ordering::Relaxed);
            c.disk_direct = k.disk_direct.load(Ordering::Relaxed);
            c.cache_corrupt = k.disk_corrupt.load(Ordering::Relaxed);
            c.disk_writes = k.disk_writes.load(Ordering::Relaxed);
            c.lease_waits = k.lease_waits.load(Ordering::Relaxed);
            c.disk_behind = k.disk_behind.load(Ordering::Relaxed);
        }
        c
    }

    /// Count reads served (every read method of the store and its readers calls this).
    fn count(&self, requests: u64, bytes: u64) {
        self.0.requests.fetch_add(requests, Ordering::Relaxed);
        self.0.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn obj_path(&self, path: &str) -> ObjPath {
        let full = match &self.0.backend {
            Backend::Remote { prefix, .. } if !prefix.is_empty() => format!("{prefix}/{path}"),
            _ => path.to_string(),
        };
        ObjPath::parse(&full).unwrap_or_else(|_| ObjPath::from(full.as_str()))
    }

    fn remote_reader(&self) -> Option<&Arc<RemoteReader>> {
        match &self.0.backend {
            Backend::Remote { reader, .. } => Some(reader),
            Backend::Local(_) => None,
        }
    }

    /// Whether bytes come over the network (through the fetch layer).
    pub fn is_remote(&self) -> bool {
        self.remote_reader().is_some()
    }

    /// The fetch layer's counters, for remote stores.
    pub(crate) fn fetch_counters(&self) -> Option<&crate::fetch::FetchCounters> {
        self.remote_reader().map(|r| r.fetcher().counters())
    }

    /// Cache counters, when this store has a block cache.
    pub(crate) fn cache_counters(&self) -> Option<&crate::cache::CacheCounters> {
        self.remote_reader()?.cache().map(|c| c.counters())
    }

    fn err(&self, path: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                what: self.describe(path),
                hint: Some("the object disappeared or was renamed since the source was opened".into()),
            },
            source => Error::Store { path: self.describe(path), source: source.into() },
        }
    }

    /// Every object under the root (recursively), sorted by path.
    pub async fn list(&self) -> Result<Vec<ObjectInfo>> {
        let mut out: Vec<ObjectInfo> = match &self.0.backend {
            Backend::Local(l) => l.list_all(local_walks()).await?,
            Backend::Remote { reader, prefix } => {
                let (under, strip) =
                    if prefix.is_empty() { (None, 0) } else { (Some(self.obj_path("")), prefix.len() + 1) };
                let found = reader.fetcher().list(under.as_ref(), &self.describe("")).await?;
                found.into_iter().map(|m| info(m, strip)).collect()
            }
        };
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The paths of every file under a local root (recursively), sorted, none looked up: the
    /// listing [`Store::list`] gives without sizes and versions, in a fraction of its time
    /// (each directory entry says what it is). `None` for a remote store, whose listing gives
    /// those anyway. [`Store::stat_names`] looks them up later, in parts.
    pub(crate) async fn list_names(&self) -> Result<Option<Vec<String>>> {
        match &self.0.backend {
            Backend::Local(l) => {
                let mut names: Vec<String> = l.list_all(local_walks()).await?;
                names.sort();
                Ok(Some(names))
            }
            Backend::Remote { .. } => Ok(None),
        }
    }

    /// Size and version of each of `names` under a local root, in order, as [`Store::list`]
    /// gives them: the other half of [`Store::list_names`]. A name gone since it was listed
    /// is [`Error::NotFound`]; with `missing_ok` it is listed with size 0 instead (its read
    /// then fails, and the damage policy skips it). A remote store is refused: its listing
    /// gave sizes and versions already.
    pub(crate) async fn stat_names(&self, names: Vec<String>, missing_ok: bool) -> Result<Vec<ObjectInfo>> {
        let Backend::Local(l) = &self.0.backend else {
            return Err(Error::invalid_option(format!(
                "{}: a listing of names only is looked up in a local directory, and this store is remote; list it \
                 again",
                self.describe("")
            )));
        };
        let names = std::sync::Arc::new(names);
        let found = l.stat_names(names.clone(), local_walks()).await?;
        names
            .iter()
            .zip(found)
            .map(|(path, info)| match info {
                Some(info) => Ok(info),
                None if missing_ok => Ok(ObjectInfo::missing(path.clone())),
                None => Err(Error::NotFound {
                    what: self.describe(path),
                    hint: Some("listed when the source was opened, and gone since: open it again".into()),
                }),
            })
            .collect()
    }

    /// Versions of the objects under the root from one listing, by path, where one listing
    /// costs less than a lookup per object (a remote store: one request lists a thousand);
    /// empty where a lookup is as cheap (a local stat) or the store cannot list (an HTTP
    /// server, a bucket without list permission): objects are then looked up
    /// ([`Store::open_object`]) when first read.
    pub async fn listed_versions(&self) -> std::collections::HashMap<String, ObjectInfo> {
        match &self.0.backend {
            Backend::Local(_) => Default::default(),
            Backend::Remote { .. } => {
                self.list().await.map(|l| l.into_iter().map(|o| (o.path.clone(), o)).collect()).unwrap_or_default()
            }
        }
    }

    /// The names directly under the root (files, and the first component of anything
    /// deeper), sorted, hidden ones included: what a writer checks before filling it.
    pub async fn entries(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = match &self.0.backend {
            Backend::Local(l) => l.entries()?,
            Backend::Remote { .. } => self
                .list()
                .await?
                .into_iter()
                .map(|o| o.path.split('/').next().unwrap_or_default().to_string())
                .collect(),
        };
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Size and version of one object.
    pub async fn head(&self, path: &str) -> Result<ObjectInfo> {
        let m = match &self.0.backend {
            Backend::Local(l) => {
                let obj = self.obj_path(path);
                l.not_special(&obj, || self.describe(path))?;
                l.fs().head(&obj).await.map_err(|e| self.err(path, e))?
            }
            Backend::Remote { reader, .. } => reader.fetcher().head(&self.obj_path(path), &self.describe(path)).await?,
        };
        Ok(ObjectInfo { path: path.to_string(), ..info(m, 0) })
    }

    /// A whole small file read once (an index, a manifest, a list of names): no version to
    /// hold it to, and at most [`MAX_WHOLE_FILE`] bytes (see [`Store::get_at_most`]). Data
    /// goes through [`Store::read`].
    pub async fn get(&self, path: &str) -> Result<Bytes> {
        self.get_at_most(path, MAX_WHOLE_FILE).await
    }

    /// [`Store::get`] of a file that may be at most `most` bytes long. A longer one is
    /// [`Error::BadIndex`], refused by its size before its bytes are read (a remote answer's
    /// body is cut off at the size it claims): a file that only describes data is never
    /// larger, so one that is is the wrong file or a hostile one, and reading it whole would
    /// take its size in memory.
    pub async fn get_at_most(&self, path: &str, most: u64) -> Result<Bytes> {
        let shown = self.describe(path);
        let bytes = match &self.0.backend {
            Backend::Local(l) => l.read_whole_at_most(self.obj_path(path), shown, most).await?,
            Backend::Remote { reader, .. } => reader.fetcher().get(&self.obj_path(path), &shown, None, most).await?,
        };
        self.count(1, bytes.len() as u64);
        Ok(bytes)
    }

    /// Count what was read and check every range came back whole.
    fn checked(&self, path: &str, ranges: &[Range<u64>], out: Vec<Bytes>) -> Result<Vec<Bytes>> {
        self.count(ranges.len() as u64, out.iter().map(|b| b.len() as u64).sum());
        self.lengths_checked(path, ranges, out)
    }

    /// `out` if each read is as long as its range; a short one is an error.
    fn lengths_checked(&self, path: &str, ranges: &[Range<u64>], out: Vec<Bytes>) -> Result<Vec<Bytes>> {
        for (r, b) in ranges.iter().zip(&out) {
            let want = r.end.saturating_sub(r.start);
            if b.len() as u64 != want {
                return Err(Error::Io {
                    path: self.describe(path),
                    source: io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("asked for bytes {}..{} ({want} bytes) but got {}", r.start, r.end, b.len()),
                    ),
                });
            }
        }
        Ok(out)
    }

    /// Tell the cache what a reader will read and when (see [`RemoteReader::plan_reads`]),
    /// for `objects` at their pinned versions. Local stores have no cache: false.
    pub fn plan_reads(&self, objects: &[&Object], uses: crate::cache::policy::Uses<'_>, clock: Arc<AtomicU64>) -> bool {
        let Some(reader) = self.remote_reader() else { return false };
        let objects: Vec<(ObjPath, String, u64)> =
            objects.iter().map(|o| (self.obj_path(o.path()), o.version_key(), o.size())).collect();
        reader.plan_reads(&objects, uses, clock)
    }

    /// Before a run that reads every block of `objects`: let the cache take bigger blocks
    /// when they fit whole in the disk cache (see [`RemoteReader::widen_blocks_for`]).
    /// Local stores have no cache: false.
    pub fn widen_cache_blocks(&self, objects: &[&Object]) -> bool {
        self.remote_reader().is_some_and(|r| r.widen_blocks_for(objects.iter().map(|o| o.size()).sum()))
    }

    /// Whether `spans` of `obj` can be read with no request: a local file, or every block of
    /// them in the disk cache as far as this process knows (no file system call). What the
    /// hit path ([`Store::direct_reader`]) needs.
    pub(crate) fn servable_directly<'a>(&self, obj: &Object, spans: impl IntoIterator<Item = &'a Range<u64>>) -> bool {
        let Some(reader) = self.remote_reader() else { return true };
        let Some(cache) = reader.cache() else { return false };
        let bs = cache.block_for_read();
        let (path, version) = (self.obj_path(obj.path()), obj.version_key());
        spans.into_iter().filter(|r| r.end > r.start).all(|r| {
            (r.start / bs..=(r.end - 1) / bs)
                .all(|b| cache.on_disk(crate::cache::block_key(path.as_ref(), &version, bs, b)))
        })
    }

    /// Write a whole object atomically (local: a staged file renamed into place; remote: one
    /// PUT). Not synced: for files that can be rebuilt (indexes); [`Store::writer`] syncs.
    pub async fn put(&self, path: &str, bytes: Bytes) -> Result<()> {
        match &self.0.backend {
            Backend::Local(l) => {
                // Written aside under a hidden temporary name and renamed whole: object_store's
                // own put stages at `NAME#N`, which a process killed mid-write left beside the
                // data, in plain sight. Not synced: what comes through here (index sidecars, an
                // index_dir's copies) is built again when lost.
                let (to, shown) = (l.file(&self.obj_path(path))?, self.describe(path));
                tokio::task::spawn_blocking(move || local::put_aside(&to, &bytes).map_err(|e| Error::io(shown, e)))
                    .await
                    .map_err(Error::task)?
            }
            // Retried, each attempt within a time limit, as reads are.
            Backend::Remote { reader, .. } => {
                reader.fetcher().put(&self.obj_path(path), &self.describe(path), bytes).await
            }
        }
    }

    /// Remove an object; one that is not there is no error.
    pub async fn delete(&self, path: &str) -> Result<()> {
        let r = match &self.0.backend {
            Backend::Local(l) => l.fs().delete(&self.obj_path(path)).await,
            Backend::Remote { reader, .. } => reader.fetcher().objects().delete(&self.obj_path(path)).await,
        };
        match r {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(path, e)),
        }
    }
}

/// An object's listing entry, its path relative to the root (the first `strip` bytes of
/// its location are the prefix and its `/`).
/// What the block cache keys an object's bytes by: its entity tag when the store gives one,
/// else its modification time, with its size. A server that gives neither (object_store reads
/// a missing time as the epoch) leaves nothing to tell this version from the next of the same
/// size: such an object's key is this process's own, so what is kept of it (disk cache
/// blocks, indexes) serves this run and no later one, which could be reading a replaced object.
pub(crate) fn version_key(e_tag: Option<&str>, modified_us: i64, size: u64) -> String {
    match e_tag {
        Some(tag) => format!("{tag}/{size}"),
        None if modified_us == 0 => format!("unversioned-{:016x}/{size}", run_nonce()),
        None => format!("{modified_us}/{size}"),
    }
}

/// A number of this process's own, the same for its whole life (see [`version_key`]).
fn run_nonce() -> u64 {
    static N: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        twox_hash::XxHash3_64::oneshot(
            &[now.as_nanos().to_le_bytes(), u128::from(std::process::id()).to_le_bytes()].concat(),
        )
    })
}

/// Blocking walks a local listing (or its lookups) runs at once: one a core, at least two
/// (a walk waits on the disk as often as on the CPU).
fn local_walks() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

fn info(m: object_store::ObjectMeta, strip: usize) -> ObjectInfo {
    ObjectInfo {
        path: m.location.as_ref().get(strip..).unwrap_or_default().to_string(),
        size: m.size,
        modified_us: m.last_modified.timestamp_micros(),
        e_tag: m.e_tag,
        recorded: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_store_lists_reads_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b.bin"), b"0123456789").unwrap();
        std::fs::write(dir.path().join("a.bin"), b"xy").unwrap();
        let s = Store::local(dir.path()).unwrap();
        let l = s.list().await.unwrap();
        assert_eq!(l.iter().map(|o| o.path.as_str()).collect::<Vec<_>>(), ["a.bin", "sub/b.bin"]);
        assert_eq!(s.entries().await.unwrap(), ["a.bin", "sub"]);
        let b = s.open_object("sub/b.bin").await.unwrap();
        assert_eq!(&s.read_span(&b, 2..5).await.unwrap()[..], b"234");
        // Spans closer than the local gap are one read, cut back into the spans asked for.
        let r = s.read(&b, &[8..10, 0..1, 4..4]).await.unwrap();
        assert_eq!((&r[0][..], &r[1][..], &r[2][..]), (&b"89"[..], &b"0"[..], &b""[..]));
        assert_eq!(s.counters(), IoCounters { requests: 2, bytes: 13, ..Default::default() });
        assert!(s.read_span(&b, 5..20).await.is_err(), "a short read must be an error");
        assert!(matches!(s.get("nope").await, Err(Error::NotFound { .. })));
        // A file that changed size since it was looked up is refused, not read: whole, or a
        // span whose bytes would be the new file's at the old offsets.
        assert_eq!(&s.read_all(&b).await.unwrap()[..], b"0123456789");
        std::fs::write(dir.path().join("sub/b.bin"), b"ab0123456789").unwrap();
        let e = s.read_all(&b).await.unwrap_err();
        assert!(matches!(e, Error::Changed { .. }), "{e}");
        let e = s.read_span(&b, 2..5).await.unwrap_err();
        assert!(matches!(e, Error::Changed { .. }) && e.to_string().contains("sub/b.bin"), "{e}");
        // Rewritten back at its size, it is read again: a rewrite at the same size is not this
        // check's to find (tar members' headers and the formats' checksums find it).
        std::fs::write(dir.path().join("sub/b.bin"), b"0123456789").unwrap();
        assert_eq!(&s.read_span(&b, 2..5).await.unwrap()[..], b"234");
    }

    #[tokio::test]
    async fn a_file_read_whole_is_held_to_its_most() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.json"), b"0123456789").unwrap();
        let s = Store::local(dir.path()).unwrap();
        assert_eq!(&s.get_at_most("index.json", 10).await.unwrap()[..], b"0123456789");
        let e = s.get_at_most("index.json", 9).await.unwrap_err();
        assert!(matches!(e, Error::BadIndex { .. }) && e.kind() == crate::ErrorKind::Corrupt, "{e:?}");
        let text = e.to_string();
        assert!(text.contains("index.json") && text.contains("10 bytes, more than the 9"), "{text}");
        // Refused before a byte of it was read.
        assert_eq!(s.counters().bytes, 10);
        // A FIFO in an index's place is refused at once (opening it to read would wait for a
        // writer without end), and so is a directory.
        let fifo = dir.path().join("fifo.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = s.get("fifo.json").await.unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::create_dir(dir.path().join("d.json")).unwrap();
        assert!(s.get("d.json").await.unwrap_err().to_string().contains("not a regular file"));
        // Nor does a head of one wait (object_store's own opens the file): a token file or a
        // chunk an index names is looked up so.
        let e = tokio::time::timeout(std::time::Duration::from_secs(20), s.head("fifo.json")).await.expect("no wait");
        assert!(e.unwrap_err().to_string().contains("not a regular file"));
        // A directory is not found, as before (a brace expansion's missing names may be skipped).
        assert_eq!(s.head("d.json").await.unwrap_err().kind(), crate::ErrorKind::NotFound);
        assert_eq!(s.head("index.json").await.unwrap().size, 10);
    }
}
