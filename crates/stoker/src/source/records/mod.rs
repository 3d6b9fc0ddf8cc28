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

mod codec;
mod litdata;
mod mds;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use self::codec::Codec;
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
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a valid {layout} index.json ({e})")))?;
        let dir = index.path.rsplit_once('/').map_or(String::new(), |(d, _)| format!("{d}/"));
        let w: Option<Vec<&str>> = wanted.as_ref().map(|w| w.iter().map(String::as_str).collect());
        let found = match layout {
            Layout::Mds => mds::shards(&json, &dir, w.as_deref()),
            _ => litdata::shards(&json, &dir, w.as_deref()),
        };
        let found = found.map_err(|why| {
            if why.starts_with("columns:") {
                Error::InvalidOption { message: format!("{}: {why}", store.describe(&index.path)) }
            } else if why.contains("pickle") || why.contains("encrypted") || why.contains("item loader") {
                Error::NotSupported { what: format!("{}: {why}", store.describe(&index.path)) }
            } else {
                bad(why)
            }
        })?;
        shards.extend(found);
    }
    let mut starts = vec![0usize];
    for s in &shards {
        starts.push(starts.last().copied().unwrap_or(0) + s.samples);
    }
    if starts.last() == Some(&0) {
        return Err(Error::Empty { uri: display, reason: format!("the {layout} index lists no samples") });
    }
    let tables = shards.iter().map(|_| OnceCell::new()).collect();
    // The shards' versions from one listing where the store lists cheaply; the others are
    // looked up when first read.
    let listed = store.listed_versions().await;
    let wanted = wanted.map(|w| w.into_iter().collect());
    Ok(Arc::new(RecordsSource {
        inner: Arc::new(Inner {
            layout,
            store,
            display,
            shards,
            starts,
            tables,
            listed,
            pinned: Mutex::new(HashMap::new()),
            kept: Mutex::new(Kept::new(opts.decoded_budget())),
            spill: opts.spill_dir().map(|d| Arc::new(Spill::new(d))),
            wanted,
            concurrency: opts.concurrency(),
        }),
    }))
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
    /// LitData record batches dropped from `kept` with rows still unread, as samples (see
    /// `source::spill`); `None` with `disk_cache=false`.
    spill: Option<Arc<Spill>>,
    wanted: Option<Vec<String>>,
    concurrency: usize,
}

/// Where a shard's items are.
#[derive(Debug)]
enum Table {
    /// Absolute offsets in the file (or in the decompressed whole shard).
    Offsets(Vec<u32>),
    /// Framed: offsets into the concatenated uncompressed items, and the frames.
    Frames { offsets: Vec<u32>, frames: Vec<Frame> },
    /// LitData's Arrow-footer chunk: every item is a row of the Arrow IPC file after the
    /// (empty) items.
    Arrow(ArrowIndex),
}

/// Where the record batches of an Arrow-footer chunk lie, from its IPC footer and the
/// batches' message headers (read once; a read then fetches only the batches it needs).
#[derive(Debug)]
struct ArrowIndex {
    schema: arrow_schema::SchemaRef,
    version: arrow_ipc::MetadataVersion,
    /// Dictionary blocks (absolute byte ranges), read with every batch that needs them.
    dictionaries: Vec<(arrow_ipc::Block, Range<u64>)>,
    /// Per record batch: its block, its absolute byte range, and its first row.
    batches: Vec<(arrow_ipc::Block, Range<u64>, usize)>,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    first: usize,
    items: usize,
    at: u64,
    len: u64,
    raw_len: usize,
}

/// Decompressed shards (`(shard, usize::MAX)`), frames and LitData record batches
/// (`(shard, batch)`, with their rows), within `decoded_bytes`.
type KeptBytes = Kept<(usize, usize), Bytes>;

/// Little-endian integer of `descr`'s width (`<i8`, `|u1`, ...) as decimal text.
fn int_text(descr: &str, v: &[u8]) -> Option<String> {
    Some(match (descr, v.len()) {
        ("|i1", 1) => (v[0] as i8).to_string(),
        ("|u1", 1) => v[0].to_string(),
        ("<i2", 2) => i16::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<u2", 2) => u16::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<i4", 4) => i32::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<u4", 4) => u32::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<i8", 8) => i64::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<u8", 8) => u64::from_le_bytes(v.try_into().ok()?).to_string(),
        _ => return None,
    })
}

/// Little-endian float of `descr`'s width as its shortest round-trip text.
fn float_text(descr: &str, v: &[u8]) -> Option<String> {
    Some(match (descr, v.len()) {
        ("<f2", 2) => f16_to_f32(u16::from_le_bytes(v.try_into().ok()?)).to_string(),
        ("<f4", 4) => f32::from_le_bytes(v.try_into().ok()?).to_string(),
        ("<f8", 8) => f64::from_le_bytes(v.try_into().ok()?).to_string(),
        _ => return None,
    })
}

/// IEEE half to single precision (exact: every half is a single).
fn f16_to_f32(h: u16) -> f32 {
    let (sign, exp, frac) = ((h >> 15) as u32, ((h >> 10) & 0x1f) as u32, (h & 0x3ff) as u32);
    let bits = match (exp, frac) {
        (0, 0) => sign << 31,
        (0, f) => {
            // Subnormal: normalise.
            let shift = f.leading_zeros() - 21;
            ((sign << 31) | ((113 - shift) << 23)) | ((f << (shift + 13)) & 0x7f_ffff)
        }
        (0x1f, f) => (sign << 31) | (0xff << 23) | (f << 13),
        (e, f) => (sign << 31) | ((e + 112) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

fn le_u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
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

    /// Check `offsets` (of `n` items) for order and bounds (`end`, when known).
    fn check_offsets(&self, shard: usize, offsets: &[u32], n: usize, end: Option<u64>) -> Result<()> {
        if offsets.len() != n + 1 {
            return Err(self.corrupt(shard, String::new(), format!("{} offsets for {n} items", offsets.len())));
        }
        if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
            return Err(self.corrupt(shard, format!("item {i}"), "its offsets run backwards".into()));
        }
        if let (Some(end), Some(&last)) = (end, offsets.last()) {
            if u64::from(last) > end {
                return Err(self.corrupt(
                    shard,
                    format!("item {}", n.saturating_sub(1)),
                    format!("it ends at byte {last} of a {end}-byte shard (the shard is truncated)"),
                ));
            }
        }
        Ok(())
    }

    /// A whole compressed shard, decompressed (hashes checked), kept for its other samples.
    async fn whole(&self, shard: usize) -> Result<Bytes> {
        if let Some(b) = self.kept.lock().unwrap_or_else(|e| e.into_inner()).get((shard, usize::MAX), &[]) {
            return Ok(b);
        }
        let Storage::Whole { path, codec, hashes } = &self.shards[shard].storage else {
            return Err(Error::internal("records: a whole read of a shard stored otherwise"));
        };
        let zipped = self.store.read_all(&self.object(path).await?).await?;
        let (store, path, codec, hashes) = (self.store.clone(), path.clone(), *codec, hashes.clone());
        let hint = self.shards[shard].size.unwrap_or(0) as usize;
        let raw = tokio::task::spawn_blocking(move || {
            for (algo, want) in &hashes {
                if let Some(got) = codec::hex_digest(algo, &zipped) {
                    if &got != want {
                        return Err(Error::CorruptData {
                            shard: store.describe(&path),
                            key: String::new(),
                            field: String::new(),
                            reason: format!(
                                "its {algo} is {got}, not the {want} its index records: the file was damaged since \
                                 it was written; restore it from a good copy"
                            ),
                        });
                    }
                }
            }
            codec.decompress(&zipped, hint).map_err(|why| Error::CorruptData {
                shard: store.describe(&path),
                key: String::new(),
                field: String::new(),
                reason: format!("{why}: the file is truncated or damaged; restore it from a good copy"),
            })
        })
        .await
        .map_err(Error::task)??;
        let raw = Bytes::from(raw);
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).put((shard, usize::MAX), raw.clone(), raw.len(), 0, &[]);
        Ok(raw)
    }

    /// The item table of `shard`, read once.
    async fn table(&self, shard: usize) -> Result<Arc<Table>> {
        self.tables[shard]
            .get_or_try_init(|| async {
                let s = &self.shards[shard];
                let n = s.samples;
                let header = 4 + 4 * (n as u64 + 1);
                let table = match &s.storage {
                    Storage::Raw | Storage::RawItems(_) => {
                        let b = self.read_range(&s.path, 0..header).await.map_err(|e| self.short(shard, e))?;
                        self.count_matches(shard, &b)?;
                        let offsets = le_u32s(&b[4..]);
                        self.check_offsets(shard, &offsets, n, s.size)?;
                        let empty = n > 0 && offsets.iter().all(|&o| u64::from(o) == header);
                        match (&s.decode, s.size) {
                            // LitData keeps rows of flat dicts as an Arrow IPC file after the
                            // (then empty) items, named by a trailer.
                            (Decode::Litdata(_), Some(size)) if empty => {
                                let span = self.arrow_span(shard, size).await?;
                                Table::Arrow(self.arrow_index(shard, span).await?)
                            }
                            _ => Table::Offsets(offsets),
                        }
                    }
                    Storage::Whole { .. } => {
                        let raw = self.whole(shard).await?;
                        let b = raw.get(..header as usize).ok_or_else(|| {
                            self.corrupt(shard, String::new(), "the shard is shorter than its offset table".into())
                        })?;
                        self.count_matches(shard, b)?;
                        let offsets = le_u32s(&b[4..]);
                        self.check_offsets(shard, &offsets, n, Some(raw.len() as u64))?;
                        Table::Offsets(offsets)
                    }
                    Storage::Framed => self.frames(shard).await?,
                };
                Ok::<_, Error>(Arc::new(table))
            })
            .await
            .cloned()
    }

    /// A read past a shard's end is a truncated shard, named as such.
    fn short(&self, shard: usize, e: Error) -> Error {
        match e {
            Error::NotFound { .. } => e,
            Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.corrupt(shard, String::new(), "the shard is shorter than its index says (truncated)".into())
            }
            other => other,
        }
    }

    fn count_matches(&self, shard: usize, b: &[u8]) -> Result<()> {
        let n = self.shards[shard].samples;
        let count = b.get(..4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize);
        if count != Some(n) {
            return Err(self.corrupt(
                shard,
                String::new(),
                format!("it holds {} items, its index says {n}", count.map_or("no".into(), |c| c.to_string())),
            ));
        }
        Ok(())
    }

    /// Where the Arrow IPC file of an Arrow-footer chunk of `size` bytes lies.
    async fn arrow_span(&self, shard: usize, size: u64) -> Result<Range<u64>> {
        let s = &self.shards[shard];
        let tail_at = size.checked_sub(12).ok_or_else(|| self.corrupt(shard, String::new(), "too short".into()))?;
        let tail = self.read_range(&s.path, tail_at..size).await.map_err(|e| self.short(shard, e))?;
        if &tail[4..] != b"LDARW01\0" {
            return Err(self.corrupt(
                shard,
                String::new(),
                "its items are empty and no Arrow footer (LDARW01) follows them".into(),
            ));
        }
        let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
        let start = tail_at.checked_sub(len).ok_or_else(|| {
            self.corrupt(shard, String::new(), "its Arrow footer claims more bytes than the chunk has".into())
        })?;
        Ok(start..tail_at)
    }

    /// The record batches of the Arrow IPC file at `span` of `shard`: its footer, then each
    /// batch's message header (for its row count), in one merged read.
    async fn arrow_index(&self, shard: usize, span: Range<u64>) -> Result<ArrowIndex> {
        let path = &self.shards[shard].path;
        let bad = |why: String| self.corrupt(shard, String::new(), format!("its Arrow footer does not read: {why}"));
        let trailer_at =
            span.end.checked_sub(10).filter(|&t| t >= span.start).ok_or_else(|| bad("too short".into()))?;
        let trailer = self.read_range(path, trailer_at..span.end).await.map_err(|e| self.short(shard, e))?;
        let trailer: [u8; 10] = trailer[..].try_into().map_err(|_| bad("a short trailer".into()))?;
        let footer_len = arrow_ipc::reader::read_footer_length(trailer).map_err(|e| bad(e.to_string()))? as u64;
        let footer_at = trailer_at
            .checked_sub(footer_len)
            .filter(|&f| f >= span.start)
            .ok_or_else(|| bad("its footer length".into()))?;
        let footer_bytes = self.read_range(path, footer_at..trailer_at).await.map_err(|e| self.short(shard, e))?;
        let footer = arrow_ipc::root_as_footer(&footer_bytes).map_err(|e| bad(e.to_string()))?;
        let fb_schema = footer.schema().ok_or_else(|| bad("no schema".into()))?;
        let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| bad(e.to_string()))?);
        let range = |b: &arrow_ipc::Block| -> Result<Range<u64>> {
            let at = u64::try_from(b.offset()).ok().and_then(|o| span.start.checked_add(o));
            let len =
                u64::try_from(b.metaDataLength()).ok().zip(u64::try_from(b.bodyLength()).ok()).map(|(m, l)| m + l);
            match (at, len) {
                (Some(at), Some(len)) if at.checked_add(len).is_some_and(|e| e <= footer_at) => Ok(at..at + len),
                _ => Err(bad("a block lies outside the file".into())),
            }
        };
        let dictionaries =
            footer.dictionaries().iter().flatten().map(|b| Ok((*b, range(b)?))).collect::<Result<Vec<_>>>()?;
        let blocks: Vec<arrow_ipc::Block> = footer.recordBatches().iter().flatten().copied().collect();
        let heads: Vec<Range<u64>> = blocks
            .iter()
            .map(|b| {
                let r = range(b)?;
                Ok(r.start..r.start + u64::try_from(b.metaDataLength()).unwrap_or(0))
            })
            .collect::<Result<_>>()?;
        let got = self.read_ranges(path, &heads).await.map_err(|e| self.short(shard, e))?;
        let mut batches = Vec::with_capacity(blocks.len());
        let mut first = 0usize;
        for ((b, head), meta) in blocks.iter().zip(&heads).zip(&got) {
            if head.is_empty() {
                return Err(bad("an empty batch header".into()));
            }
            // An encapsulated message: continuation marker, length, then the flatbuffer.
            let body =
                if meta.len() >= 8 && meta[..4] == [0xff; 4] { &meta[8..] } else { meta.get(4..).unwrap_or(&[]) };
            let message = arrow_ipc::root_as_message(body).map_err(|e| bad(e.to_string()))?;
            let header = message.header_as_record_batch().ok_or_else(|| bad("a block is not a record batch".into()))?;
            batches.push((*b, range(b)?, first));
            first += usize::try_from(header.length()).map_err(|_| bad("a negative row count".into()))?;
        }
        if first != self.shards[shard].samples {
            return Err(bad(format!("its batches hold {first} rows, its index says {}", self.shards[shard].samples)));
        }
        Ok(ArrowIndex { schema, version: footer.version(), dictionaries, batches })
    }

    /// Items `items` (sorted, distinct) of an Arrow-footer chunk, as samples: only the record
    /// batches holding them are read (and kept) and decoded.
    async fn arrow_samples(&self, shard: usize, index: &ArrowIndex, items: &[usize]) -> Result<Vec<Sample>> {
        let mut out = Vec::with_capacity(items.len());
        let mut i = 0;
        while i < items.len() {
            let k = index.batches.partition_point(|(_, _, first)| *first <= items[i]).saturating_sub(1);
            let first = index.batches[k].2;
            let end = index.batches.get(k + 1).map_or(self.shards[shard].samples, |b| b.2);
            let mut j = i;
            while j < items.len() && items[j] < end {
                j += 1;
            }
            let rows: Vec<usize> = items[i..j].iter().map(|&item| item - first).collect();
            if rows.is_empty() {
                return Err(self.corrupt(
                    shard,
                    String::new(),
                    format!("item {} lies past its batch's rows", items[i]),
                ));
            }
            out.extend(self.arrow_batch_rows(shard, index, k, &rows).await?);
            i = j;
        }
        Ok(out)
    }

    /// Rows `rows` (sorted, distinct) of record batch `k` of an Arrow-footer chunk: from the
    /// kept batch bytes, the spill, or read (and kept) now.
    async fn arrow_batch_rows(
        &self,
        shard: usize,
        index: &ArrowIndex,
        k: usize,
        rows: &[usize],
    ) -> Result<Vec<Sample>> {
        let cached = self.kept.lock().unwrap_or_else(|e| e.into_inner()).get((shard, k), rows);
        let bytes = match cached {
            Some(b) => b,
            None => {
                if let Some(got) = self.spilled(shard, k, rows).await {
                    return got;
                }
                let s = &self.shards[shard];
                let range = index.batches[k].1.clone();
                let b = self.read_range(&s.path, range).await.map_err(|e| self.short(shard, e))?;
                let n = index.batches.get(k + 1).map_or(s.samples, |b| b.2) - index.batches[k].2;
                let dropped =
                    self.kept.lock().unwrap_or_else(|e| e.into_inner()).put((shard, k), b.clone(), b.len(), n, rows);
                for ((d_shard, d_k), d_bytes) in dropped {
                    self.spill_batch(d_shard, d_k, d_bytes).await;
                }
                b
            }
        };
        self.arrow_rows(shard, index, k, bytes, rows).await
    }

    /// Rows `rows` of record batch `k` (its bytes `bytes`) of an Arrow-footer chunk.
    async fn arrow_rows(
        &self,
        shard: usize,
        index: &ArrowIndex,
        k: usize,
        bytes: Bytes,
        rows: &[usize],
    ) -> Result<Vec<Sample>> {
        let s = &self.shards[shard];
        let shown = self.store.describe(&s.path);
        let bad = |why: String| self.corrupt(shard, String::new(), format!("its Arrow footer does not read: {why}"));
        let wanted: Option<Vec<&str>> = self.wanted.as_ref().map(|w| w.iter().map(String::as_str).collect());
        let (columns, key_column) = crate::source::parquet::values::plan(&index.schema, wanted.as_deref(), &shown)?;
        let key_name = key_column.map(|k| index.schema.field(k).name().clone());
        let mut decoder = arrow_ipc::reader::FileDecoder::new(index.schema.clone(), index.version);
        for (block, range) in &index.dictionaries {
            let b = self.read_range(&s.path, range.clone()).await.map_err(|e| self.short(shard, e))?;
            decoder.read_dictionary(block, &arrow_buffer::Buffer::from(b)).map_err(|e| bad(e.to_string()))?;
        }
        let (block, _, first) = &index.batches[k];
        let b = decoder
            .read_record_batch(block, &arrow_buffer::Buffer::from(bytes))
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("an empty record batch".into()))?;
        let mut out = Vec::with_capacity(rows.len());
        for &r in rows {
            let item = first + r;
            if r >= b.num_rows() {
                return Err(bad(format!("item {item} lies past its batch's rows")));
            }
            let key = key_name
                .as_ref()
                .and_then(|n| b.column_by_name(n))
                .and_then(|c| crate::source::parquet::values::key_of(c, r))
                .unwrap_or_else(|| format!("{}/{item:06}", s.stem));
            let mut fields = Vec::with_capacity(columns.len());
            for col in &columns {
                let Some(array) = b.column_by_name(&col.name) else { continue };
                col.push_fields(array, r, &mut fields).map_err(|why| self.corrupt(shard, key.clone(), why))?;
            }
            out.push(Sample { key, fields });
        }
        Ok(out)
    }

    /// Rows `rows` of record batch `k` of `shard` from the spill, when it is there.
    async fn spilled(&self, shard: usize, k: usize, rows: &[usize]) -> Option<Result<Vec<Sample>>> {
        self.spill.as_ref()?.get((shard, k), rows).await
    }

    /// Write record batch `k` of `shard` (dropped from memory with rows unread) to the spill
    /// as samples; a batch that does not decode is left to be reported when read.
    async fn spill_batch(&self, shard: usize, k: usize, bytes: Bytes) {
        let Some(spill) = &self.spill else { return };
        let Ok(table) = self.table(shard).await else { return };
        let Table::Arrow(index) = &*table else { return };
        let n = index.batches.get(k + 1).map_or(self.shards[shard].samples, |b| b.2) - index.batches[k].2;
        let all: Vec<usize> = (0..n).collect();
        if let Ok(samples) = self.arrow_rows(shard, index, k, bytes, &all).await {
            spill.put((shard, k), samples).await;
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

    /// The frame table of a LitData framed-zstd chunk.
    async fn frames(&self, shard: usize) -> Result<Table> {
        let s = &self.shards[shard];
        let prefix = self.read_range(&s.path, 0..24).await.map_err(|e| self.short(shard, e))?;
        if &prefix[..8] != b"LDFZ01\0\0" {
            return Err(self.corrupt(shard, String::new(), "no LDFZ01 magic at the start of a framed chunk".into()));
        }
        let u = |at: usize| u32::from_le_bytes([prefix[at], prefix[at + 1], prefix[at + 2], prefix[at + 3]]) as usize;
        let (n, n_frames) = (u(12), u(20));
        if n != s.samples {
            return Err(self.corrupt(
                shard,
                String::new(),
                format!("it holds {n} items, its index says {}", s.samples),
            ));
        }
        let len = 4 * (n as u64 + 1) + 24 * n_frames as u64;
        let b = self.read_range(&s.path, 24..24 + len).await.map_err(|e| self.short(shard, e))?;
        let offsets = le_u32s(&b[..4 * (n + 1)]);
        self.check_offsets(shard, &offsets, n, None)?;
        let frames = b[4 * (n + 1)..]
            .chunks_exact(24)
            .map(|f| {
                let u32_at = |at: usize| u32::from_le_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
                Frame {
                    first: u32_at(0) as usize,
                    items: u32_at(4) as usize,
                    at: u64::from_le_bytes(f[8..16].try_into().unwrap_or_default()),
                    len: u64::from(u32_at(16)),
                    raw_len: u32_at(20) as usize,
                }
            })
            .collect::<Vec<_>>();
        let covered: usize = frames.iter().map(|f| f.items).sum();
        if covered != n || frames.iter().any(|f| f.first + f.items > n) {
            return Err(self.corrupt(shard, String::new(), "its frames do not cover its items".into()));
        }
        Ok(Table::Frames { offsets, frames })
    }

    /// Frame `f` of `shard`, decompressed and kept.
    async fn frame(&self, shard: usize, f: usize, frame: Frame) -> Result<Bytes> {
        if let Some(b) = self.kept.lock().unwrap_or_else(|e| e.into_inner()).get((shard, f), &[]) {
            return Ok(b);
        }
        let s = &self.shards[shard];
        let z = self.read_range(&s.path, frame.at..frame.at + frame.len).await.map_err(|e| self.short(shard, e))?;
        let raw =
            Codec::Zstd.decompress(&z, frame.raw_len).map_err(|why| self.corrupt(shard, format!("frame {f}"), why))?;
        let raw = Bytes::from(raw);
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).put((shard, f), raw.clone(), raw.len(), 0, &[]);
        Ok(raw)
    }

    /// Items `items` (sorted, distinct) of `shard`, their bytes in that order.
    async fn items(&self, shard: usize, items: &[usize]) -> Result<Vec<Bytes>> {
        let table = self.table(shard).await?;
        let s = &self.shards[shard];
        match (&*table, &s.storage) {
            (Table::Offsets(off), Storage::Whole { .. }) => {
                let raw = self.whole(shard).await?;
                Ok(items.iter().map(|&i| raw.slice(off[i] as usize..off[i + 1] as usize)).collect())
            }
            (Table::Offsets(off), _) => {
                let wanted: Vec<Range<u64>> = items.iter().map(|&i| u64::from(off[i])..u64::from(off[i + 1])).collect();
                let got = self.read_ranges(&s.path, &wanted).await.map_err(|e| self.short(shard, e))?;
                let mut out = Vec::with_capacity(items.len());
                for b in got {
                    out.push(match &s.storage {
                        Storage::RawItems(codec) => {
                            Bytes::from(codec.decompress(&b, 0).map_err(|why| self.corrupt(shard, String::new(), why))?)
                        }
                        _ => b,
                    });
                }
                Ok(out)
            }
            (Table::Arrow(_), _) => Err(Error::internal("records: item bytes of an Arrow-footer chunk")),
            (Table::Frames { offsets, frames }, _) => {
                let mut out = Vec::with_capacity(items.len());
                for &i in items {
                    let f = frames
                        .iter()
                        .position(|fr| fr.first <= i && i < fr.first + fr.items)
                        .ok_or_else(|| self.corrupt(shard, format!("item {i}"), "no frame holds it".into()))?;
                    let raw = self.frame(shard, f, frames[f]).await?;
                    let base = offsets[frames[f].first] as usize;
                    let (a, b) = (offsets[i] as usize - base, offsets[i + 1] as usize - base);
                    out.push(raw.get(a..b).map(|_| raw.slice(a..b)).ok_or_else(|| {
                        self.corrupt(shard, format!("item {i}"), "it lies past its frame's end".into())
                    })?);
                }
                Ok(out)
            }
        }
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

    async fn flush(&self) {
        self.inner.store.flush().await
    }
}

/// The fuzz target `records_index`: the first byte picks MDS or LitData; the rest, up to a
/// NUL, is an `index.json`, and what follows is one item of each shard it lists.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let (json, item) = rest.split_at(rest.iter().position(|&b| b == 0).unwrap_or(rest.len()));
    let Ok(index) = serde_json::from_slice::<serde_json::Value>(json) else { return };
    let wanted: Option<&[&str]> = if pick & 2 == 2 { Some(&["a", "b"]) } else { None };
    let shards = if pick & 1 == 0 { mds::shards(&index, "d/", wanted) } else { litdata::shards(&index, "d/", wanted) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_widen_exactly() {
        for (h, want) in
            [(0x3c00u16, 1.0f32), (0xc000, -2.0), (0x3555, 0.333_251_95), (0x0001, 5.960_464_5e-8), (0x7bff, 65504.0)]
        {
            assert_eq!(f16_to_f32(h), want, "{h:#x}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    }

    #[test]
    fn numbers_become_text() {
        assert_eq!(int_text("<i8", &(-42i64).to_le_bytes()).unwrap(), "-42");
        assert_eq!(int_text("|u1", &[200]).unwrap(), "200");
        assert!(int_text("<i4", &[1, 2]).is_none());
        assert_eq!(float_text("<f8", &0.1f64.to_le_bytes()).unwrap(), "0.1");
        assert_eq!(float_text("<f4", &2.0f32.to_le_bytes()).unwrap(), "2");
    }
}
