//! Manifests: one small object at the root of a dataset holding its object list and, for
//! tar shards, every shard's index. With one, opening a prefix of 1e5 objects is one GET
//! instead of a listing plus a sidecar read per shard. `stoker index URI` writes it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::tar_index::ShardIndex;
use crate::error::{Error, Result};
use crate::store::{ObjectInfo, Store};
use crate::uri::Layout;

/// The manifest's name at the dataset root (hidden, so never listed as a sample).
pub const MANIFEST: &str = ".stoker-manifest.json";
const FORMAT: &str = "stoker-manifest";
const VERSION: u32 = 1;
/// A listing snapshot of names only: a version of its own, so a Stoker from before them
/// (a Ray worker older than its driver) refuses it by its version instead of reading no
/// objects and calling the directory empty.
const NAMES_VERSION: u32 = 2;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Object {
    path: String,
    size: u64,
    modified_us: i64,
    e_tag: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Manifest {
    format: String,
    version: u32,
    pub layout: Layout,
    objects: Vec<Object>,
    /// One index per tar shard, in `objects` order (empty for other layouts).
    pub tar: Vec<ShardIndex>,
    /// A local directory's files by path alone, sorted, in place of `objects` (only in a
    /// listing snapshot of the `objects` layout, [`Manifest::names_only`]): whoever opens from
    /// it looks them up, so a Ray driver lists 10^5 files without looking up each and every
    /// read task looks up its own part, in parallel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    names: Vec<String>,
}

impl Manifest {
    pub(crate) fn new(layout: Layout, listing: &[ObjectInfo], tar: Vec<ShardIndex>) -> Self {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            layout,
            objects: listing
                .iter()
                .map(|o| Object {
                    path: o.path.clone(),
                    size: o.size,
                    modified_us: o.modified_us,
                    e_tag: o.e_tag.clone(),
                })
                .collect(),
            tar,
            names: Vec::new(),
        }
    }

    /// A listing snapshot of a local directory read one file a sample: its files' `names`
    /// (sorted) only, looked up by whoever opens from it ([`Manifest::take_names`]).
    pub(crate) fn names_only(names: Vec<String>) -> Self {
        Manifest {
            format: FORMAT.into(),
            version: NAMES_VERSION,
            layout: Layout::Objects,
            objects: Vec::new(),
            tar: Vec::new(),
            names,
        }
    }

    /// The names of a names-only snapshot, moved out; `None` for a listing with sizes and
    /// versions.
    pub(crate) fn take_names(&mut self) -> Option<Vec<String>> {
        (!self.names.is_empty()).then(|| std::mem::take(&mut self.names))
    }

    /// The parts of this listing that hold the sample runs `spans`, for the `objects` layout
    /// (one object a sample, in path order, as [`ObjectsSource`](super::ObjectsSource) numbers
    /// them): each the objects (or names) of its run only. `None` for the other layouts; a span
    /// that is not a run of the samples is an error.
    pub(crate) fn sample_spans(&self, spans: &[std::ops::Range<usize>]) -> Option<Result<Vec<Manifest>>> {
        if self.layout != Layout::Objects || !self.tar.is_empty() {
            return None;
        }
        // The ones a source opened from it keeps (all, in a snapshot taken by opening).
        let mut objects: Vec<&Object> = self.objects.iter().filter(|o| Layout::Objects.holds(&o.path)).collect();
        objects.sort_by(|a, b| a.path.cmp(&b.path));
        // Names are sorted already (`parse` refuses them otherwise).
        let names: Vec<&String> = self.names.iter().filter(|n| Layout::Objects.holds(n)).collect();
        let samples = objects.len() + names.len();
        let part = |span: &std::ops::Range<usize>| {
            if span.start >= span.end || span.end > samples {
                return Err(Error::invalid_option(format!(
                    "samples {}..{} are not a run of the snapshot's {samples} samples",
                    span.start, span.end
                )));
            }
            // One of the two is empty: a snapshot holds objects looked up, or names.
            let run = |all: usize| span.start.min(all)..span.end.min(all);
            Ok(Manifest {
                format: self.format.clone(),
                version: self.version,
                layout: self.layout,
                objects: objects[run(objects.len())].iter().map(|&o| o.clone()).collect(),
                tar: Vec::new(),
                names: names[run(names.len())].iter().map(|&n| n.clone()).collect(),
            })
        };
        Some(spans.iter().map(part).collect())
    }

    /// The objects as a listing, moved out (a snapshot of 10^5 objects is opened by every
    /// Ray read task: its paths and tags are not copied again).
    pub(crate) fn take_listing(&mut self) -> Vec<ObjectInfo> {
        std::mem::take(&mut self.objects)
            .into_iter()
            .map(|o| ObjectInfo {
                path: o.path,
                size: o.size,
                modified_us: o.modified_us,
                e_tag: o.e_tag,
                recorded: true,
            })
            .collect()
    }
}

/// The most bytes of a manifest read: a tar dataset's holds every sample's index (about 150
/// bytes a sample of two fields), so 4 GiB is some 27 million samples; one larger is read
/// whole into memory no more (`manifest=false` lists and indexes the shards instead).
pub(crate) const MAX_MANIFEST: u64 = 4 << 30;

/// The manifest at the store root, if there is a usable one. A manifest that does not parse
/// is an error (it would otherwise silently cost a full listing on every start).
pub(crate) async fn load(store: &Store) -> Result<Option<Manifest>> {
    let bytes = match store.get_at_most(MANIFEST, MAX_MANIFEST).await {
        Ok(b) => b,
        Err(e) if e.kind() == crate::ErrorKind::NotFound => return Ok(None),
        Err(Error::BadIndex { path, reason }) => {
            let reason =
                format!("{reason}; or open it with manifest=false, which lists and indexes its shards instead");
            return Err(Error::BadIndex { path, reason });
        }
        Err(e) => return Err(e),
    };
    let m = parse(&bytes, &store.describe(MANIFEST))?;
    if !m.names.is_empty() {
        // Names to look up are what a listing snapshot passes between processes; a manifest
        // at a dataset's root records what was indexed, sizes and versions included.
        return Err(Error::BadIndex {
            path: store.describe(MANIFEST),
            reason: "it lists files by name only, as only a listing snapshot does; rebuild it with `stoker index`, \
                     or open with ?manifest=false"
                .into(),
        });
    }
    Ok(Some(m))
}

/// Parse and check a manifest's bytes; `shown` names it in errors.
pub(crate) fn parse(bytes: &[u8], shown: &str) -> Result<Manifest> {
    let bad = |reason: String| Error::BadIndex {
        path: shown.to_string(),
        reason: format!("{reason}; rebuild it with `stoker index`, or open with ?manifest=false"),
    };
    let m: Manifest = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    let version = if m.names.is_empty() { VERSION } else { NAMES_VERSION };
    if m.format != FORMAT || m.version != version {
        return Err(bad(format!("format {} v{} is not {FORMAT} v{version}", m.format, m.version)));
    }
    // Paths are relative to the dataset root: one that climbs out of it (or is absolute) would
    // read, and index next to, files the dataset does not own.
    if !m.names.is_empty() && (m.layout != Layout::Objects || !m.objects.is_empty() || !m.tar.is_empty()) {
        return Err(bad("it lists files by name only and also as objects or shards, which no listing does".into()));
    }
    // Names come sorted, each once (a walk's paths): a name twice would be read as two samples.
    if let Some(w) = m.names.windows(2).find(|w| w[0] >= w[1]) {
        return Err(bad(format!("its names are not sorted, or `{}` is listed twice", w[1].escape_debug())));
    }
    let names = m.names.iter();
    for path in m.objects.iter().map(|o| &o.path).chain(m.tar.iter().map(|t| &t.shard)).chain(names) {
        if !is_clean_relative(path) {
            return Err(bad(format!("object path `{}` is not a plain path inside the dataset", path.escape_debug())));
        }
    }
    // A path twice would be read twice, its samples delivered twice an epoch (no listing
    // gives one twice): a manifest or snapshot that says so was damaged or made by hand.
    if let Some(twice) = listed_twice(m.objects.iter().map(|o| o.path.as_str())) {
        return Err(bad(format!("it lists `{}` twice", twice.escape_debug())));
    }
    // No indexes at all: a listing snapshot taken before the shards were indexed.
    if m.layout == Layout::Tar && !m.tar.is_empty() {
        let shards = m.objects.iter().filter(|o| Layout::Tar.holds(&o.path)).count();
        if shards != m.tar.len() {
            return Err(bad(format!("it lists {shards} shards but holds {} indexes", m.tar.len())));
        }
        for idx in &m.tar {
            idx.check().map_err(|r| bad(format!("index of {}: {r}", idx.shard)))?;
        }
    }
    Ok(m)
}

/// A path `paths` holds more than once. Listings come sorted, checked in one pass; anything
/// else is sorted first.
fn listed_twice<'a>(paths: impl Iterator<Item = &'a str> + Clone) -> Option<&'a str> {
    let mut ahead = paths.clone();
    ahead.next();
    if paths.clone().zip(ahead).all(|(a, b)| a < b) {
        return None;
    }
    let mut all: Vec<&str> = paths.collect();
    all.sort_unstable();
    all.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// A `/`-separated relative path with no empty, `.` or `..` component and no NUL.
pub(crate) fn is_clean_relative(path: &str) -> bool {
    !path.is_empty() && !path.contains('\0') && path.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Write `m` at the store root, whole or not at all, synced before it is renamed into place:
/// a manifest a crash left empty would not parse, and one that does not parse is an error
/// at every open (a pack's plan, synced too, may already say it is complete).
pub(crate) async fn save(store: &Store, m: &Manifest) -> Result<u64> {
    let json = serde_json::to_vec(m).map_err(|e| Error::internal(format!("cannot serialise the manifest: {e}")))?;
    let n = json.len() as u64;
    store.put_whole(MANIFEST, Bytes::from(json)).await?;
    Ok(n)
}
