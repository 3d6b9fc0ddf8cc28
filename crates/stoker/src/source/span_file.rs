//! Files whose samples are spans found by walking them once (JSONL lines, TFRecord records),
//! plain or compressed as a whole (`.gz`, `.zst`), with their span index kept on disk
//! ([`super::span_index`]).
//!
//! A plain file's spans are read by range through the store. A compressed file cannot be read
//! by range, so it is decompressed once per process (by the walk, or at its first read when
//! its index was found) into an unnamed file of this process's own (freed by the kernel when
//! the process ends), and spans are read from there. What decompression may produce is
//! bounded ([`MAX_RATIO`] times the compressed size, plus [`SLACK`]), so a bomb is an error
//! naming the file, not a full disk.

use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use super::span_index::{self, Kind, Places, SpanIndex};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::store::{Cancel, Object, ObjectInfo, Store};
use crate::uri::SourceOptions;

/// Compressed data expands 3-10x; a whole-file stream that expands more than this is refused.
pub(crate) const MAX_RATIO: u64 = 64;
/// Allowed beyond [`MAX_RATIO`] times the compressed size (tiny files compress badly).
pub(crate) const SLACK: u64 = 64 << 20;

/// A layout's walk of one file's (decompressed) bytes: hands each span to `span` and
/// returns how many bytes the data held. An error names what is wrong at which byte.
pub(crate) type Scan = fn(&mut dyn Read, &mut dyn FnMut(u64, u64) -> std::io::Result<()>) -> std::io::Result<u64>;

/// Spans of a file (start, end), or why they cannot be had.
pub(crate) type SpansOr = std::result::Result<Vec<(u64, u64)>, String>;

/// A sidecar's spans agree with the file, or why not.
pub(crate) type Checked = std::result::Result<(), String>;

/// Reads ranges of a file (merged as the store's read plan merges them).
pub(crate) type ReadRanges<'a> = &'a dyn Fn(&[Range<u64>]) -> Result<Vec<Bytes>>;

/// An index another tool writes beside a file, read at a first open in place of the walk (the
/// `tfrecord` package's `.tfindex`): the names it may have and how its bytes become the file's
/// spans. It is as untrusted as the file: it must cover the whole file in order, without gaps
/// or overlaps, and a few spans are checked against the file's own framing; one that does not
/// fit is set aside with a warning and the file walked. (A span it gets wrong that the checks
/// miss still cannot deliver wrong data where the layout checks each span's checksum, as
/// TFRecord does: it is that record's checksum error.)
pub(crate) struct Sidecar {
    /// The paths to look for, for the file at this path, in order.
    pub(crate) names: fn(&str) -> Vec<String>,
    /// The largest sidecar worth reading for a file of this many bytes.
    pub(crate) max_len: fn(u64) -> u64,
    /// The file's spans from the sidecar's bytes and the file's size, or why they cannot be.
    pub(crate) parse: fn(&[u8], u64) -> SpansOr,
    /// Check some of the spans against the file (read through `read`): why not, if not.
    pub(crate) check: fn(&[(u64, u64)], ReadRanges) -> Checked,
}

/// Where a file's spans are read from.
enum Body {
    /// The file itself, by range through the store.
    Store,
    /// The file compressed as a whole, decompressed once into an unnamed local file: by the
    /// walk, or at the first read that wants it.
    Compressed(tokio::sync::OnceCell<Arc<std::fs::File>>),
}

/// One file and its span index.
struct SpanFile {
    /// The file's path relative to the root.
    path: String,
    obj: Object,
    body: Body,
    spans: Arc<SpanIndex>,
}

/// Whether `path` is compressed as a whole (by its name).
pub(crate) fn compressed(path: &str) -> bool {
    path.ends_with(".gz") || path.ends_with(".zst")
}

/// The files of one source, in path order, each with its span index, and where each file's
/// samples start in the whole: what the layouts of span files (JSONL, TFRecord) share.
pub(crate) struct SpanFiles {
    store: Store,
    files: Vec<SpanFile>,
    /// Each file's path without its layout's suffix, as keys show it.
    names: Vec<String>,
    starts: Vec<u64>,
    /// Where compressed files are decompressed to.
    spill_dir: PathBuf,
}

impl SpanFiles {
    /// The files of `listing` (sorted by path here), each with its `kind` index found on disk,
    /// or made from a `sidecar` beside a plain file, or built by walking it with `scan`,
    /// several at once. `suffixes` are the layout's file name endings, cut off for keys.
    pub(crate) async fn open(
        store: Store,
        mut listing: Vec<ObjectInfo>,
        opts: &SourceOptions,
        kind: &'static Kind,
        (scan, sidecar): (Scan, Option<&'static Sidecar>),
        suffixes: &[&str],
    ) -> Result<Self> {
        listing.sort_by(|a, b| a.path.cmp(&b.path));
        // Decompressed copies go where decoded shards spill (the temporary directory when the
        // disk cache is off: a compressed file has to be decompressed somewhere to be read).
        let spill_dir = opts.spill_dir().unwrap_or_else(std::env::temp_dir);
        let opened = super::tar_index::walk_all(listing.len(), opts.concurrency().min(8), |i, cancel| {
            let (info, store, dir) = (listing[i].clone(), store.clone(), spill_dir.clone());
            let places = Places::of(kind, &store, &info.path, opts);
            async move {
                tokio::task::spawn_blocking(move || index(&store, &info, &places, dir, cancel, (scan, sidecar)))
                    .await
                    .map_err(Error::task)?
            }
        })
        .await?;
        let (mut files, mut names, mut starts) = (Vec::new(), Vec::new(), vec![0u64]);
        for (info, (spans, copy)) in listing.iter().zip(opened) {
            let body = match compressed(&info.path) {
                false => Body::Store,
                true => Body::Compressed(tokio::sync::OnceCell::new_with(copy.map(Arc::new))),
            };
            let suffix = suffixes.iter().filter(|s| info.path.ends_with(**s)).max_by_key(|s| s.len()).copied();
            names.push(info.path.strip_suffix(suffix.unwrap_or("")).unwrap_or(&info.path).to_string());
            starts.push(starts.last().copied().unwrap_or(0) + spans.len());
            files.push(SpanFile { path: info.path.clone(), obj: store.object(info), body, spans: Arc::new(spans) });
        }
        Ok(SpanFiles { store, files, names, starts, spill_dir })
    }

    /// Samples in all files.
    pub(crate) fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0) as usize
    }

    /// How many files.
    pub(crate) fn count(&self) -> usize {
        self.files.len()
    }

    /// The files' digest (see [`SampleSource::fingerprint`](super::SampleSource::fingerprint)).
    pub(crate) fn fingerprint(&self) -> u64 {
        self.store.fingerprint(self.files.iter().map(|f| (f.obj.path(), Some(f.obj.pinned()))))
    }

    /// The file and the span in it of sample `i`.
    pub(crate) fn locate(&self, i: u64) -> Option<(usize, usize)> {
        super::locate(&self.starts, i)
    }

    /// The key of span `s` of file `f`: `<file without suffix>/<span, 9 digits>`.
    pub(crate) fn key(&self, f: usize, s: usize) -> String {
        format!("{}/{s:09}", self.names[f])
    }

    /// File `f`'s full location, for messages.
    pub(crate) fn describe(&self, f: usize) -> String {
        self.store.describe(&self.files[f].path)
    }

    /// The store the files are read through.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Random access by span, neighbours merged, a file a shard.
    pub(crate) fn capability(&self) -> super::Capability {
        super::Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: false,
            local: !self.store.is_remote(),
        }
    }

    /// The file (shard) of sample `i`.
    pub(crate) fn locality(&self, i: usize) -> Option<usize> {
        self.locate(i as u64).map(|(f, _)| f)
    }

    /// Where sample `i` lies, for messages.
    pub(crate) fn location(&self, i: usize) -> Option<String> {
        self.locate(i as u64).map(|(f, _)| format!("file {}", self.describe(f)))
    }

    /// The bytes of spans `which` of file `f`, with where each starts.
    pub(crate) async fn read(&self, f: usize, which: &[usize]) -> Result<Vec<(u64, Bytes)>> {
        self.files[f].read(&self.store, &self.spill_dir, which).await
    }

    /// Samples `indices`, read a file at a time (so the store merges neighbours), each made by
    /// `make(file, span in file, where the span starts, its bytes)`; in the order asked.
    pub(crate) async fn get_many(
        &self,
        indices: &[usize],
        mut make: impl FnMut(usize, usize, u64, Bytes) -> Result<Sample>,
    ) -> Result<Vec<Sample>> {
        let mut located = Vec::with_capacity(indices.len());
        for &i in indices {
            super::check_index(i, self.len())?;
            located.push(self.locate(i as u64).ok_or_else(|| Error::internal("a checked index not found"))?);
        }
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut order: Vec<usize> = (0..located.len()).collect();
        order.sort_by_key(|&i| located[i]);
        for group in order.chunk_by(|&a, &b| located[a].0 == located[b].0) {
            let f = located[group[0]].0;
            let which: Vec<usize> = group.iter().map(|&i| located[i].1).collect();
            for (&i, (at, bytes)) in group.iter().zip(self.read(f, &which).await?) {
                out[i] = Some(make(f, located[i].1, at, bytes)?);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }
}

/// The span index of `info`: the one kept on disk if it is whole and of this version of the
/// file, else made from a sidecar that fits the file, else built by a walk (which also leaves a
/// compressed file's decompressed copy).
fn index(
    store: &Store,
    info: &ObjectInfo,
    places: &Places,
    spill_dir: PathBuf,
    cancel: Cancel,
    (scan, sidecar): (Scan, Option<&'static Sidecar>),
) -> Result<(SpanIndex, Option<std::fs::File>)> {
    let version = span_index::version(info);
    if let Some(found) = places.find(version) {
        return Ok((found, None));
    }
    let fail = |e: std::io::Error| Error::io(format!("the index of {}", store.describe(&info.path)), e);
    let mut writer = span_index::Writer::create(places, &spill_dir).map_err(fail)?;
    if let Some(spans) = sidecar.filter(|_| !compressed(&info.path)).and_then(|s| from_sidecar(store, info, s)) {
        for (start, end) in spans {
            writer.push(start, end).map_err(fail)?;
        }
        return Ok((writer.finish(version, info.size).map_err(fail)?, None));
    }
    let (copy, len) = walk(store, &store.object(info), spill_dir, cancel, scan, &mut |s, e| writer.push(s, e))?;
    Ok((writer.finish(version, len).map_err(fail)?, copy))
}

/// The spans of `info` from the first of its sidecars found, if that one fits the file (else a
/// warning names it and why, and the caller walks the file). Runs on a blocking thread.
fn from_sidecar(store: &Store, info: &ObjectInfo, sidecar: &Sidecar) -> Option<Vec<(u64, u64)>> {
    let rt = tokio::runtime::Handle::current();
    // The first that exists (any error reading its size counts as absent: the walk is the
    // authority, a sidecar only saves reading the file).
    let (name, found) =
        (sidecar.names)(&info.path).into_iter().find_map(|n| Some((n.clone(), rt.block_on(store.head(&n)).ok()?)))?;
    let fits = || -> SpansOr {
        // Checked by its listed size, and the read refuses an answer of more (the file may
        // have grown since, or a server may say otherwise).
        let most = (sidecar.max_len)(info.size);
        let too_big = |len: u64| {
            (len > most)
                .then(|| format!("{len} bytes, more than an index of a {}-byte file can need ({most})", info.size))
        };
        if let Some(why) = too_big(found.size) {
            return Err(why);
        }
        let bytes = rt.block_on(store.get_at_most(&name, most)).map_err(|e| e.to_string())?;
        let spans = (sidecar.parse)(&bytes, info.size)?;
        let reader = store.range_reader(&store.object(info)).map_err(|e| e.to_string())?;
        (sidecar.check)(&spans, &|ranges| reader.read_many(ranges))?;
        Ok(spans)
    };
    fits()
        .inspect_err(|why| {
            eprintln!(
                "stoker: warning: {} does not fit {}: {why}; reading the whole file to find its records instead",
                store.describe(&name),
                store.describe(&info.path)
            )
        })
        .ok()
}

/// Walk `obj` once with `scan`, handing each span to `span`; for a compressed file, leave its
/// decompressed copy. Returns the copy and the length of the (decompressed) data.
fn walk(
    store: &Store,
    obj: &Object,
    spill_dir: PathBuf,
    cancel: Cancel,
    scan: Scan,
    span: &mut dyn FnMut(u64, u64) -> std::io::Result<()>,
) -> Result<(Option<std::fs::File>, u64)> {
    let shown = store.describe(obj.path());
    let mut reader = store.blocking_reader(obj, true, cancel)?;
    let path = obj.path();
    let bad = |why: String| Error::CorruptData {
        shard: shown.clone(),
        key: String::new(),
        field: String::new(),
        reason: why,
    };
    let (copy, len) = if compressed(path) {
        let file = std::fs::create_dir_all(&spill_dir)
            .and_then(|()| super::spill::unnamed_file(&spill_dir))
            .map_err(|e| Error::io(spill_dir.display(), e))?;
        let decoder: Box<dyn Read + '_> = if path.ends_with(".gz") {
            Box::new(flate2::read::MultiGzDecoder::new(&mut reader))
        } else {
            Box::new(zstd::stream::read::Decoder::new(&mut reader).map_err(|e| bad(format!("not zstd: {e}")))?)
        };
        let limit = obj.size().saturating_mul(MAX_RATIO).saturating_add(SLACK);
        let mut tee = Tee { inner: decoder, copy: file, at: 0, limit };
        let len = scan(&mut tee, span).map_err(|e| {
            let why = e.to_string();
            // flate2's words for bytes after the last member that do not start another one.
            if tee.at > 0 && why.contains("invalid gzip header") {
                bad(format!(
                    "after {} bytes of good text it holds bytes that are not gzip (data appended to the file, or \
                     damage): {why}",
                    tee.at
                ))
            } else {
                bad(why)
            }
        })?;
        let Tee { copy, .. } = tee;
        (Some(copy), len)
    } else {
        (None, scan(&mut reader, span).map_err(|e| bad(e.to_string()))?)
    };
    if let Some(e) = reader.failure() {
        return Err(e);
    }
    Ok((copy, len))
}

/// A reader that copies what it reads to `copy` and refuses more than `limit` bytes.
struct Tee<'a> {
    inner: Box<dyn Read + 'a>,
    copy: std::fs::File,
    at: u64,
    limit: u64,
}

impl Read for Tee<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if self.at + n as u64 > self.limit {
            return Err(std::io::Error::other(format!(
                "it decompresses to more than {} bytes ({MAX_RATIO} times its size): a decompression bomb, or not \
                 what its name says",
                self.limit
            )));
        }
        self.copy.write_all(&buf[..n])?;
        self.at += n as u64;
        Ok(n)
    }
}

impl SpanFile {
    /// The bytes of spans `which`, with where each starts.
    async fn read(&self, store: &Store, spill_dir: &std::path::Path, which: &[usize]) -> Result<Vec<(u64, Bytes)>> {
        let shown = store.describe(&self.path);
        let fail = move |what: &str, e: std::io::Error| Error::io(format!("{what} of {shown}"), e);
        let Body::Compressed(copy) = &self.body else {
            // Looked up in place, not on a blocking thread: 16 bytes a span of a local file
            // read whole at open (so in the page cache), where a hop to the blocking pool and
            // back costs more than the read itself (the store's read makes one hop already).
            let spans = self.spans.spans(which).map_err(|e| fail("the index", e))?;
            let got = store.read(&self.obj, &spans).await?;
            return Ok(spans.iter().map(|s| s.start).zip(got).collect());
        };
        let copy = self.decompressed(store, spill_dir, copy).await?.clone();
        let (index, want) = (self.spans.clone(), which.to_vec());
        tokio::task::spawn_blocking(move || {
            let spans = index.spans(&want).map_err(|e| fail("the index", e))?;
            spans
                .iter()
                .map(|s| {
                    // Fallible: a span's length comes from the data. A recycled buffer may
                    // be longer than the span (rounded up, or pooled): only the span's bytes
                    // are read and kept.
                    let len = (s.end - s.start) as usize;
                    let v = crate::buffer::try_take(len)
                        .and_then(|mut v| copy.read_exact_at(&mut v[..len], s.start).map(|()| v))
                        .map_err(|e| fail("the decompressed copy", e))?;
                    Ok((s.start, crate::buffer::freeze(v, len)))
                })
                .collect()
        })
        .await
        .map_err(Error::task)?
    }

    /// The decompressed copy of this compressed file, made at the first read that wants it
    /// when the walk was skipped (its index was found on disk).
    async fn decompressed<'a>(
        &self,
        store: &Store,
        spill_dir: &std::path::Path,
        copy: &'a tokio::sync::OnceCell<Arc<std::fs::File>>,
    ) -> Result<&'a Arc<std::fs::File>> {
        copy.get_or_try_init(|| async {
            let (s, obj, dir) = (store.clone(), self.obj.clone(), spill_dir.to_path_buf());
            let want = self.spans.data_len();
            let cancel = Cancel::default();
            let _stop = cancel.on_drop();
            let all: Scan = |r, _| std::io::copy(r, &mut std::io::sink());
            let (copy, len) = tokio::task::spawn_blocking(move || walk(&s, &obj, dir, cancel, all, &mut |_, _| Ok(())))
                .await
                .map_err(Error::task)??;
            match copy {
                Some(copy) if len == want => Ok(Arc::new(copy)),
                _ => Err(Error::CorruptData {
                    shard: store.describe(&self.path),
                    key: String::new(),
                    field: String::new(),
                    reason: format!(
                        "it decompresses to {len} bytes where its index says {want}: the file changed without \
                         changing its size or time; delete its index (`{}{}`) and reopen",
                        self.path,
                        self.spans.suffix()
                    ),
                }),
            }
        })
        .await
    }
}
