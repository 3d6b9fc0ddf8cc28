//! Convert any source into WebDataset tar shards or an LMDB environment.
//!
//! Packing many small files into a few big shards is the standard cure for a GPU starved by
//! per-file opens and requests. [`pack`] reads any [`SampleSource`](crate::SampleSource)
//! (files, tar shards, LMDB, a remote prefix) and writes:
//!
//! - **tar**: `PREFIX-000000.tar`, … in WebDataset layout (member `KEY.FIELD`, members of a
//!   sample adjacent), readable by the `webdataset` Python library and by `tar`, then each
//!   shard's sidecar index and the dataset manifest (as [`crate::index`] writes them). Remote
//!   destinations (`s3://…`) work: each shard is sent in 8 MiB parts of a multipart upload
//!   as it is written (an object appears whole or not at all), a few parts in flight; a store
//!   without multipart uploads (HTTP) gets each shard in one PUT, at most 1 GiB of shards in
//!   flight.
//! - **lmdb**: `data.mdb` in the destination directory, one record per sample: key = the
//!   sample key's bytes ([`unescape_key`](crate::sample::unescape_key): an LMDB source's keys,
//!   UTF-8 or not, are written back exactly), value = the raw bytes of its one field. Records are in key byte order, which
//!   is the order Stoker's `lmdb` layout reads them. LMDB has no field names; Stoker names the
//!   field `data` (or `?field=NAME`), and the plan file records the source's field name.
//!   Samples with several fields are refused with a message asking for `field` (keep one) or
//!   the tar layout (keeps all): packing them into one value would need a container format
//!   that neither py-lmdb users nor Stoker's reader could use directly.
//!
//! ## Samples and keys
//!
//! Without `group`, every source sample becomes one output sample with the same key and
//! fields. Two consecutive samples with one key (e.g. `0001.jpg` and `0001.cls` from a
//! directory of files, which the objects layout reads as two samples) would merge in a
//! reader of the tar, so that is an error that names the key and suggests `group`. With
//! `group`, samples sharing a key anywhere in the source become one sample, at the place the
//! key first appears, with the fields of each in source order (a field name twice is an error).
//!
//! Keys are never rewritten but for one case: a key whose member name could escape the shard's
//! directory (absolute, `..`, `.`, empty components, backslashes), holds control characters, or
//! would split back into a different key and field (a dot in its last component) is an error
//! naming it. The case: a byte that is not UTF-8 (an LMDB key's, `\xNN` in the sample key) is
//! named `%NN` in a tar, and two keys that would share a name are an error. Field names are
//! written lower-case, as readers see them.
//!
//! ## Interruption and reruns
//!
//! The plan (every output key, field and size, and the shard boundaries) is made up front
//! from sample metadata, so it does not depend on timing, and it is saved as
//! `.stoker-pack.json` in the destination before any data. Shards are written under a hidden
//! temporary name, synced, then renamed; a name in final form is always a whole shard.
//! Rerunning the same command on the same source finds the plan, keeps the finished shards
//! (each still at the version its landing record names, or hashing as it landed) and writes
//! the rest, giving the same bytes as an uninterrupted run. Until a pack completes, its
//! destination is not opened as a dataset (its plan says `complete: false`). LMDB
//! is written with a commit every chunk into a hidden working environment, resumed from its
//! last committed key, and published as a compacted copy renamed to `data.mdb` (the same
//! records in the same order as an uninterrupted run; LMDB leaves stale bytes in the slack of
//! its pages, so the file is not byte-identical). A destination
//! holding anything else (a different plan, or files not written by `pack`) is refused unless
//! `force` is set.

use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::source::DynSampleSource;
use crate::store::Store;
use crate::uri::{self, Layout, Location, SourceOptions};

mod lmdb_out;
mod names;
mod plan;
mod shard;
mod stream;
mod tar_out;
mod tar_sink;

pub use shard::{ShardWriter, ShardWritten, TokenDtype, JOB_FILE};
pub use stream::ShardStream;

use plan::{PlanFile, PLAN_FILE};

/// How to pack. [`Default`] is tar shards of up to 256 MiB named `shard-000000.tar`, ….
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackOptions {
    /// `Layout::Tar` or `Layout::Lmdb`.
    pub layout: Layout,
    /// Tar: a shard closes before the sample that would take it past this many bytes (a
    /// sample bigger than this gets a shard of its own).
    pub shard_size: u64,
    /// Tar: at most this many samples per shard.
    pub samples_per_shard: Option<usize>,
    /// Tar: shard names are `{prefix}-{000000}.tar`.
    pub prefix: String,
    /// Merge samples sharing a key into one sample with several fields.
    pub group: bool,
    /// Keep only this field of every sample (required for LMDB when samples have several).
    pub field: Option<String>,
    /// Write into a destination holding something else (a different pack's files are
    /// removed first; other files are left, and with tar become part of the index).
    pub force: bool,
    /// Shards written at once (tar); reads of the source overlap writes either way.
    pub jobs: usize,
    /// Options for the destination store (endpoint, credentials) when it is remote.
    pub dest_options: SourceOptions,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            layout: Layout::Tar,
            shard_size: 256 << 20,
            samples_per_shard: None,
            prefix: "shard".into(),
            group: false,
            field: None,
            force: false,
            jobs: std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8),
            dest_options: SourceOptions::default(),
        }
    }
}

impl PackOptions {
    /// Defaults for `layout`.
    pub fn new(layout: Layout) -> Self {
        PackOptions { layout, ..Default::default() }
    }
}

/// What [`pack`] did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PackReport {
    /// The destination, credentials redacted.
    pub dest: String,
    /// The layout written.
    pub layout: Layout,
    /// Output samples.
    pub samples: usize,
    /// Tar shards (1 for LMDB).
    pub shards: usize,
    /// Payload bytes over all samples.
    pub payload_bytes: u64,
    /// Bytes of the shards or of `data.mdb` (headers and padding included).
    pub written_bytes: u64,
    /// Shards already complete from an earlier, interrupted run and kept as they were.
    pub resumed_shards: usize,
    /// Samples written by this run (the rest were already there).
    pub written_samples: usize,
    /// Wall time.
    pub seconds: f64,
}

/// Hooks for showing progress. Every method has an empty default; `()` ignores everything.
pub trait PackProgress: Send + Sync {
    /// The plan is made: how many samples and payload bytes the whole job has.
    fn planned(&self, _samples: u64, _bytes: u64) {}
    /// `samples` samples with `bytes` payload bytes are done (written now, or found complete).
    fn advance(&self, _samples: u64, _bytes: u64) {}
    /// A named step after the data: `indexing`, `compacting`.
    fn stage(&self, _what: &str) {}
}

impl PackProgress for () {}

/// Pack `src` into `dest` (a local directory, created if missing, or a remote prefix for tar;
/// options such as `?endpoint=` go in its query or in [`PackOptions::dest_options`]).
///
/// The whole plan is made from sample metadata before anything is written, so a source that
/// cannot be packed as asked leaves the destination untouched. Calling it again with the same
/// source and options after an interruption finishes the job; on a finished pack it only
/// re-checks (nothing is rewritten unless it changed since it landed). See the
/// [module docs](self) for the output layout,
/// grouping, names and reruns.
///
/// ```no_run
/// # async fn demo() -> stoker::Result<()> {
/// use stoker::pack::{pack, PackOptions};
/// let src = stoker::open("./images", Default::default()).await?;
/// let opts = PackOptions { group: true, prefix: "train".into(), ..PackOptions::default() };
/// let report = pack(src, "./shards", &opts, &()).await?;
/// println!("{} samples in {} shards", report.samples, report.shards);
/// # Ok(()) }
/// ```
pub async fn pack(
    src: Arc<DynSampleSource>,
    dest: &str,
    opts: &PackOptions,
    progress: &dyn PackProgress,
) -> Result<PackReport> {
    pack_boxed(src, dest, opts, progress).await
}

/// [`pack`], compiled here (see the note at the crate's `pub use`s). Not `Send`-boxed: rustc
/// cannot prove the writers' closures `Send` for every lifetime there (a known limitation of
/// higher-ranked closures); callers await it where they are, as they always have.
fn pack_boxed<'a>(
    src: Arc<DynSampleSource>,
    dest: &'a str,
    opts: &'a PackOptions,
    progress: &'a dyn PackProgress,
) -> futures::future::LocalBoxFuture<'a, Result<PackReport>> {
    use futures::FutureExt;
    pack_here(src, dest, opts, progress).boxed_local()
}

async fn pack_here(
    src: Arc<DynSampleSource>,
    dest: &str,
    opts: &PackOptions,
    progress: &dyn PackProgress,
) -> Result<PackReport> {
    let started = Instant::now();
    if !matches!(opts.layout, Layout::Tar | Layout::Lmdb) {
        return Err(Error::invalid_option(format!("pack writes `tar` or `lmdb` ({} is what it reads)", opts.layout)));
    }
    check_prefix(&opts.prefix)?;
    let parsed = uri::parse(dest)?;
    let shown = parsed.display.clone();
    // A mix reads where each of its sources reads.
    let reads: Vec<String> = match src.as_mix() {
        Some(m) => m.sources().map(|s| s.to_string()).collect(),
        None => vec![src.to_string()],
    };
    if let Some(read) = reads.iter().find(|r| uri::writes_into(r, dest)) {
        return Err(Error::Pack {
            dest: shown,
            reason: format!(
                "it is where the source {read} reads (or inside it): the pack would write among the samples it \
                 reads, and --force would delete or overwrite an earlier pack's shards before reading them; write \
                 to another directory, then move it into place"
            ),
        });
    }
    if let Location::Remote(loc) = &parsed.location {
        // An object store keeps `.`, `..` and empty segments as names (encoded), where a
        // listing of the prefix then cuts the pack's own shard names short.
        if loc.prefix.contains("//") || loc.prefix.split('/').any(|seg| seg == "." || seg == "..") {
            return Err(Error::Pack {
                dest: shown,
                reason: "its path has an empty, `.` or `..` segment, which an object store keeps as a name: name the \
                         prefix plainly"
                    .into(),
            });
        }
    }
    // Planning first: a source that cannot be packed as asked leaves no trace at DEST.
    let metas = plan::metas(&src).await?;
    let mut plan = plan::make(metas, opts, &src.to_string(), &shown)?;
    plan.file.source_version = src.fingerprint().map(|v| format!("{v:016x}"));
    if opts.layout == Layout::Lmdb && matches!(parsed.location, Location::Remote(_)) {
        return Err(Error::NotSupported {
            what: format!("{shown}: LMDB is written to a local directory; pack it locally and copy it"),
        });
    }
    let dest_opts = opts.dest_options.clone().merged(parsed.options);
    let out = dest_store(parsed.location, &dest_opts, &shown)?;
    let _held = out.local_root().map(|dir| crate::store::lock_dest(dir, &shown)).transpose()?;
    let fail = |reason: String| Error::Pack { dest: shown.clone(), reason };

    let previous = read_plan(&out).await.map_err(|r| fail(format!("{PLAN_FILE}: {r}")))?;
    // A plan from before versions were kept cannot tell: its source is taken as it is.
    let same_source = |old: &PlanFile| old.source_version.is_none() || old.source_version == plan.file.source_version;
    let resume = match previous {
        Some(old) if old.fingerprint == plan.file.fingerprint && same_source(&old) => {
            // A tar shard that came into the destination since would be indexed into the
            // pack's manifest as its own.
            if !opts.force && opts.layout == Layout::Tar {
                // This run's shards (the same names as the earlier run's, the fingerprint being
                // the same), not the list in the file found there, which nothing vouches for.
                if let Some(found) = stray_of(&out, &plan.file).await? {
                    return Err(fail(format!(
                        "it holds `{found}`, which the pack there did not write; move it away (or pass --force to \
                         keep it, and index it with the pack)"
                    )));
                }
            }
            true
        }
        // Only the source changed: the same shards under the same names, each written again
        // over its old self (which a remote store, where nothing is removed, needs).
        Some(old) if opts.force && old.fingerprint == plan.file.fingerprint => false,
        Some(old) if opts.force => {
            remove_pack(&out, &old).await.map_err(fail)?;
            false
        }
        Some(old) => {
            let (what, force) = match old.fingerprint == plan.file.fingerprint {
                true => ("whose source has changed since (a file rewritten: its time or size moved)", "pass --force"),
                false if out.local_root().is_none() => {
                    ("with other contents or settings", "delete the prefix (a remote pack is not replaced in place)")
                }
                false => ("with other contents or settings", "pass --force"),
            };
            return Err(fail(format!(
                "it holds {} pack of {} samples from {} {what}; rerun with the same source and options to finish \
                 it, {force} to replace it, or choose another destination",
                if old.complete { "a finished" } else { "an unfinished" },
                old.samples,
                old.source
            )));
        }
        None => {
            if !opts.force {
                if let Some(found) = foreign_entry(&out).await? {
                    return Err(fail(format!(
                        "it is not empty (it holds `{found}`) and was not written by `stoker pack`; choose an empty \
                         or new destination, or pass --force to write into it anyway"
                    )));
                }
            }
            false
        }
    };
    if opts.force && opts.layout == Layout::Tar {
        // A shard writer's unfinished job left here (a failed Ray write) would have the
        // destination refused as unfinished once this pack is done.
        out.delete(crate::source::WRITE_RECORD).await?;
    }
    write_plan(&out, &plan.file).await?;
    let total = plan.file.payload_bytes;
    progress.planned(plan.outs.len() as u64, total);

    let done = match opts.layout {
        Layout::Tar => tar_out::write(&src, &out, &plan, opts, resume, progress, &shown).await?,
        _ => lmdb_out::write(&src, &out, &plan, opts.field.as_deref(), resume, progress, &shown).await?,
    };
    if opts.layout == Layout::Tar {
        // The index lists the destination again: a shard that came in while this pack wrote
        // would join its manifest as its own (nothing locks a remote prefix).
        if !opts.force {
            if let Some(found) = stray_of(&out, &plan.file).await? {
                return Err(fail(format!(
                    "`{found}` came into it while the pack wrote, and would be indexed as one of its shards; move it \
                     away and rerun (the shards written are kept)"
                )));
            }
        }
        progress.stage("indexing");
        let index_uri = match out.local_root() {
            Some(p) => p.display().to_string(),
            None => dest.to_string(),
        };
        // Every member gets the checksum computed from the bytes as they were written: now,
        // or by the earlier run that landed a shard kept (its landing record).
        let index_opts = SourceOptions { checksums: Some(true), ..opts.dest_options.clone() };
        crate::source::index_with(&index_uri, index_opts, &|_, _| {}, &done.sums, Some(PLAN_FILE)).await?;
    }
    plan.file.complete = true;
    write_plan(&out, &plan.file).await?;
    Ok(PackReport {
        dest: shown,
        layout: opts.layout,
        samples: plan.outs.len(),
        shards: if opts.layout == Layout::Tar { plan.file.shards.len() } else { 1 },
        payload_bytes: total,
        written_bytes: done.bytes,
        resumed_shards: done.resumed,
        written_samples: done.written_samples,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The store of a destination: a local directory (created if missing) or a remote prefix;
/// a pattern or list of names is refused. `shown` names it in errors.
pub(crate) fn dest_store(location: Location, options: &SourceOptions, shown: &str) -> Result<Store> {
    match location {
        Location::Local(path) => {
            std::fs::create_dir_all(&path).map_err(|e| match e.kind() {
                // A file there, or a link to nowhere: a bare "File exists" says neither.
                std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => Error::Pack {
                    dest: shown.to_string(),
                    reason: format!(
                        "{} or a directory above it is not a directory ({e}); a pack writes a directory of files: \
                         name a new or empty one",
                        path.display()
                    ),
                },
                _ => Error::io(path.display(), e),
            })?;
            Store::local(&path)
        }
        Location::Remote(loc) if loc.names.is_none() => Store::remote(&loc, options, shown),
        _ => Err(Error::InvalidUri {
            uri: shown.to_string(),
            reason: "the destination is a directory or prefix, not a pattern or list of names".into(),
        }),
    }
}

/// A shard prefix names files directly in the destination, visible to globs like `*.tar`.
fn check_prefix(prefix: &str) -> Result<()> {
    check_plain("shard prefix", prefix)
}

/// `name` (a shard prefix, a shard or token file's name or stem: `what`) names a file directly
/// in the destination: non-empty, not hidden, no path separator or control character.
pub(crate) fn check_plain(what: &str, name: &str) -> Result<()> {
    let bad = name.is_empty() || name.starts_with('.') || name.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(Error::invalid_option(format!(
            "{what} `{}` must be a plain file name: non-empty, not starting with `.`, without `/`, `\\` or control \
             characters",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// A store without multipart uploads (HTTP) gets each shard gathered in memory for one PUT:
/// bound how many shards are written at once to a remote destination.
const REMOTE_BYTES_IN_FLIGHT: u64 = 1 << 30;

/// What the writers report back.
pub(crate) struct Written {
    bytes: u64,
    resumed: usize,
    written_samples: usize,
    /// Per shard, the XXH3-64 of each member in archive order: computed as it was written, now
    /// or (a shard kept at a resume) by the run that wrote it.
    sums: std::collections::HashMap<String, Vec<u64>>,
}

/// The plan an earlier run left in `out`, if any.
async fn read_plan(out: &Store) -> std::result::Result<Option<PlanFile>, String> {
    let bytes = match out.get(PLAN_FILE).await {
        Ok(b) => b,
        Err(e) if e.kind() == crate::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    PlanFile::parse(&bytes)
        .map(Some)
        .map_err(|e| format!("{e}; delete it and the pack it describes, or choose another destination"))
}

/// Save the plan, synced and renamed into place (see [`Store::writer`]).
async fn write_plan(out: &Store, p: &PlanFile) -> Result<()> {
    out.put_whole(PLAN_FILE, bytes::Bytes::from(p.to_json())).await
}

/// Something in the destination that `pack` did not write, if any.
async fn foreign_entry(out: &Store) -> Result<Option<String>> {
    Ok(out.entries().await?.into_iter().find(|name| !is_own_temp(name)))
}

/// A shard anywhere under the destination `out` (a file a sharded layout reads as one, as
/// indexing the destination would) that `owns` does not claim: at a resume, one that would
/// join the manifest as the earlier run's. A README or notes beside the shards are not read,
/// and stay; temporary files are hidden.
pub(crate) async fn stray_shard(out: &Store, owns: impl Fn(&str) -> bool) -> Result<Option<String>> {
    let shard = |p: &str| crate::source::resolve::is_dataset_file(p) && Layout::of_shard_name(p).is_some();
    Ok(out.list().await?.into_iter().map(|o| o.path).find(|p| shard(p) && !owns(p)))
}

/// A [`stray_shard`] of `out` that `plan`'s shards do not name.
async fn stray_of(out: &Store, plan: &PlanFile) -> Result<Option<String>> {
    let own: std::collections::HashSet<&str> = plan.shards.iter().map(|s| s.name.as_str()).collect();
    stray_shard(out, |p| own.contains(p)).await
}

/// Remove what an earlier pack wrote (its plan names it all), for `force`.
async fn remove_pack(out: &Store, old: &PlanFile) -> std::result::Result<(), String> {
    let Some(dir) = out.local_root() else {
        return Err("replacing an earlier pack on a remote store is not supported: delete the prefix first, \
                    or choose another destination"
            .into());
    };
    let mut names: Vec<String> =
        vec![crate::source::manifest::MANIFEST.into(), lmdb_out::DATA.into(), tar_out::record_name(lmdb_out::DATA)];
    for s in &old.shards {
        names.push(crate::source::tar_index::sidecar_path(&s.name));
        names.push(tar_out::record_name(&s.name));
        names.push(crate::store::temp_name(&s.name));
        names.push(s.name.clone());
    }
    for n in names {
        out.delete(&n).await.map_err(|e| format!("removing {n}: {e}"))?;
    }
    lmdb_out::remove_work(dir).map_err(|e| format!("removing the LMDB working copy: {e}"))
}

/// Temporary files of an interrupted pack (and its plan) do not make a destination foreign.
fn is_own_temp(name: &str) -> bool {
    name == PLAN_FILE || name == lmdb_out::WORK_DIR || crate::store::is_temp_name(name) || tar_out::is_record_name(name)
}

/// Output samples read per request to the source: enough to let ranged sources coalesce,
/// small enough to keep memory bounded with several shards in flight.
const CHUNK_SAMPLES: usize = 256;
const CHUNK_BYTES: u64 = 8 << 20;

/// Split `outs` into consecutive runs to read at once.
pub(crate) fn chunks(outs: &[plan::Out]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, o) in outs.iter().enumerate() {
        if i > start && (i - start >= CHUNK_SAMPLES || bytes + o.payload() > CHUNK_BYTES) {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += o.payload();
    }
    if start < outs.len() {
        out.push(start..outs.len());
    }
    out
}

/// Read the samples `outs` are made of and return each one's kept fields (plan names, in plan
/// order). A sample whose fields no longer match the plan is an error: the source changed
/// since it was planned, and writing it would break the shard sizes the plan promised.
pub(crate) async fn fetch(
    src: &DynSampleSource,
    outs: &[plan::Out],
    field: Option<&str>,
    dest: &str,
) -> Result<Vec<Vec<crate::sample::Field>>> {
    let idx: Vec<usize> = outs.iter().flat_map(|o| o.parts.iter().copied()).collect();
    let mut samples = src.get_many(&idx).await?.into_iter();
    let mut got = Vec::with_capacity(outs.len());
    for o in outs {
        let mut fields: Vec<crate::sample::Field> = Vec::with_capacity(o.fields.len());
        for _ in &o.parts {
            let s = samples.next().ok_or_else(|| Error::internal("the source returned fewer samples than asked"))?;
            fields.extend(s.fields.into_iter().filter(|f| field.is_none_or(|k| &*f.name == k)));
        }
        let same = fields.len() == o.fields.len()
            && fields.iter().zip(&o.fields).all(|(f, (_, size))| f.data.len() as u64 == *size);
        if !same {
            return Err(Error::Pack {
                dest: dest.to_string(),
                reason: format!(
                    "sample `{}` of {src} changed while packing (its fields or sizes differ from when it was planned); \
                     rerun when the source is stable",
                    crate::sample::display_key(&o.key)
                ),
            });
        }
        for (f, (name, _)) in fields.iter_mut().zip(&o.fields) {
            f.name = name.clone();
        }
        got.push(fields);
    }
    Ok(got)
}
