//! Already-tokenized corpora: Megatron-style indexed datasets, a `.bin` of tokens beside its
//! `.idx` (see [`idx`]), as Megatron-LM, NeMo and GPT-NeoX preprocessing writes them.
//!
//! A sequence of the index is a document (Megatron's GPT datasets read them so) and a sample:
//! its one field `tokens` holds the document's tokens as stored (little-endian, the index's
//! dtype). Packing into training sequences ([`crate::tokens`]) reads the same corpus through
//! [`TokenDocs`]: any span of any document, so a sequence that takes 2,048 tokens of a long
//! document reads those, not the document. Every byte comes through the [`Store`].

mod buf;
mod flat;
mod idx;
mod litdata;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

pub use self::buf::{TokenBuf, TokenSlots};
use self::flat::FileDocs;
pub(crate) use self::idx::write as write_idx;
pub(crate) use self::idx::Index;
use super::{check_index, Capability, DynSampleSource, SampleSource, SourceInfo};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::store::{Cancel, IoCounters, MapAdvice, MappedObject, Object, ObjectInfo, Store};
use crate::uri::{Layout, SourceOptions};

/// The suffix of the index files this layout is opened from; the tokens are in the file of
/// the same name ending `.bin`.
pub(crate) const IDX_SUFFIX: &str = ".idx";

/// Documents of tokens, as packing reads them: lengths known up front, any span readable.
#[async_trait]
pub trait TokenDocs: fmt::Debug + fmt::Display + Send + Sync {
    /// Number of documents.
    fn documents(&self) -> u64;

    /// Tokens in document `doc` (`doc < documents()`).
    fn tokens_in(&self, doc: u64) -> u64;

    /// Ask the memory system for what [`tokens_in`](Self::tokens_in)`(doc)` will read, a few
    /// documents ahead of asking it (a pass over documents in shuffled order reads lengths at
    /// random places of an index: each a cache miss, which then overlap). Changes nothing.
    fn prefetch_len(&self, doc: u64) {
        let _ = doc;
    }

    /// Documents per shard (file), in order: shard shuffles keep a shard's documents together.
    fn shard_sizes(&self) -> Vec<u64>;

    /// Append the tokens of each `(document, token span)` in turn to `out`, at its width (a
    /// token too big for int32 ids is an error). Spans past a document's end are an error.
    async fn read_into(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenBuf) -> Result<()>;

    /// Whether [`read_now`](Self::read_now) serves every document (local files, read in
    /// place): the loader then builds each batch whole on its own producer threads instead
    /// of hopping between the runtime and a blocking thread for every read.
    fn reads_in_place(&self) -> bool {
        false
    }

    /// [`read_into`](Self::read_into) on the calling blocking thread, for documents that
    /// [`reads_in_place`](Self::reads_in_place), each piece's tokens straight into its slot of
    /// the batch ([`TokenSlots`]); refused otherwise.
    fn read_now(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenSlots<'_>) -> Result<()> {
        let _ = (pieces, out);
        Err(Error::internal("read_now on token documents that are not read in place"))
    }

    /// Requests and bytes the store under it has served.
    fn io_counters(&self) -> Option<IoCounters> {
        None
    }
}

/// One `.bin`/`.idx` pair.
#[derive(Debug)]
struct TokenFile {
    /// The common prefix, as keys show it (`path/name` without `.idx`, `.bin` or `.npy`).
    name: String,
    bin: Object,
    index: FileDocs,
}

/// A Megatron indexed dataset of one or more `.bin`/`.idx` pairs, read through a [`Store`].
pub(crate) struct TokensSource {
    store: Store,
    files: Vec<TokenFile>,
    /// Where each file's documents start in the whole, then the total.
    starts: Vec<u64>,
    display: String,
    /// Local files mapped for [`TokenDocs::read_now`], by file number: the most recently used
    /// [`MAPPED_FILES`], so a corpus of thousands of files holds a bounded number of maps (a
    /// map holds no descriptor).
    maps: std::sync::Mutex<lru::LruCache<usize, Arc<MappedObject>>>,
    /// How they are mapped: decided for all the `.bin` files together, which an epoch reads
    /// whole.
    advice: MapAdvice,
}

/// Local token files a source keeps mapped at once.
const MAPPED_FILES: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(64) {
    Some(n) => n,
    None => unreachable!(),
};

impl fmt::Debug for TokensSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokensSource").field("source", &self.display).field("files", &self.files.len()).finish()
    }
}

impl fmt::Display for TokensSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

/// Whether `path` is an `.npy` of tokens: not one of the index caches Megatron keeps beside
/// its data (`*_doc_idx.npy`, `*_sample_idx.npy`, `*_shuffle_idx.npy`; Megatron-Core's
/// `*-document_index.npy`, `*-sample_index.npy`, `*-shuffle_index.npy`).
pub(crate) fn flat_npy(path: &str) -> bool {
    const CACHES: [&str; 6] = [
        "_doc_idx.npy",
        "_sample_idx.npy",
        "_shuffle_idx.npy",
        "document_index.npy",
        "sample_index.npy",
        "shuffle_index.npy",
    ];
    path.ends_with(".npy") && !CACHES.iter().any(|c| path.ends_with(c))
}

/// Open the token files of `listing` (sorted by path: their documents come in that order):
/// each `.idx` with its `.bin`; with the `separator` option, also flat arrays (a `.bin` without
/// an `.idx`, or an `.npy` not named as Megatron's index caches are), split into documents
/// after every separator token.
pub(crate) async fn open(
    store: Store,
    mut listing: Vec<ObjectInfo>,
    opts: &SourceOptions,
    display: String,
) -> Result<Arc<DynSampleSource>> {
    listing.sort_by(|a, b| a.path.cmp(&b.path));
    let paired: std::collections::HashSet<String> =
        listing.iter().filter_map(|o| o.path.strip_suffix(IDX_SUFFIX).map(|n| format!("{n}.bin"))).collect();
    let flat: Vec<&ObjectInfo> = listing
        .iter()
        .filter(|o| (o.path.ends_with(".bin") && !paired.contains(&o.path)) || flat_npy(&o.path))
        .collect();
    if !flat.is_empty() && opts.separator.is_none() && !listing.iter().any(|o| o.path.ends_with(IDX_SUFFIX)) {
        return Err(Error::invalid_option(format!(
            "{display}: {} is a flat token file (no .idx beside it): give separator= (the token that ends each \
             document, e.g. 50256 for GPT-2's <|endoftext|>) and, for a raw .bin, token_dtype= (default uint16)",
            store.describe(&flat[0].path)
        )));
    }
    // Without a separator, a .bin beside indexed ones is a dataset part whose .idx is missing
    // (a partial copy), not something to leave out: its documents would be missing from every
    // epoch without a word. (.npy files are left out: Megatron keeps its own index caches as
    // .npy beside the data.)
    if opts.separator.is_none() {
        if let Some(lone) = flat.iter().find(|o| o.path.ends_with(".bin")) {
            let name = lone.path.strip_suffix(".bin").unwrap_or(&lone.path);
            return Err(Error::BadIndex {
                path: store.describe(&lone.path),
                reason: format!(
                    "it has no index beside it ({} is missing): copy the dataset's .idx files too; or, for a flat \
                     token array, give separator= (the token that ends each document)",
                    store.describe(&format!("{name}{IDX_SUFFIX}"))
                ),
            });
        }
    }
    let mut files = Vec::with_capacity(listing.len());
    let mut starts = vec![0u64];
    for info in &listing {
        if let (Some(sep), true) = (opts.separator, flat.iter().any(|f| f.path == info.path)) {
            let file = open_flat(&store, info, sep, opts).await?;
            starts.push(starts.last().copied().unwrap_or(0) + file.index.len() as u64);
            files.push(file);
            continue;
        }
        if !info.path.ends_with(IDX_SUFFIX) {
            continue;
        }
        let name = info.path.strip_suffix(IDX_SUFFIX).unwrap_or(&info.path).to_string();
        let bin_path = format!("{name}.bin");
        let bin_info = store.head(&bin_path).await.map_err(|e| match e {
            Error::NotFound { .. } => Error::BadIndex {
                path: store.describe(&info.path),
                reason: format!(
                    "its tokens file {} is missing (or not a plain file): an indexed dataset is a .bin beside its .idx",
                    store.describe(&bin_path)
                ),
            },
            other => other,
        })?;
        let idx_obj = store.object(info);
        let bad = |reason: String| Error::BadIndex {
            path: store.describe(&info.path),
            reason: format!("{reason}; write the dataset again (Megatron's preprocess_data.py, or `stoker pack`)"),
        };
        let head = store.read_span(&idx_obj, 0..info.size.min(idx::HEADER)).await?;
        Index::header(&head, info.size).map_err(bad)?;
        let bytes = store.read_all(&idx_obj).await?;
        let index = Index::parse(bytes, bin_info.size).map_err(bad)?;
        starts.push(starts.last().copied().unwrap_or(0) + index.len() as u64);
        files.push(TokenFile { name, bin: store.object(&bin_info), index: FileDocs::Megatron(index) });
    }
    Ok(Arc::new(TokensSource::new(store, files, starts, display)))
}

/// The first index (by path) of the LitData dataset indexed by `listing`, with its bytes, if
/// it is of token chunks (`TokensLoader`): documents of tokens, opened as the tokens layout.
pub(crate) async fn litdata_tokens(
    store: &crate::store::Store,
    listing: &[crate::store::ObjectInfo],
) -> Result<Option<(String, bytes::Bytes)>> {
    let Some(first) = listing.iter().min_by(|a, b| a.path.cmp(&b.path)) else { return Ok(None) };
    let bytes = store.get(&first.path).await?;
    Ok(litdata::holds_tokens(&bytes).then(|| (first.path.clone(), bytes)))
}

/// LitData token chunks (`TokensLoader`) of the `index.json` files `indexes` (by path: their
/// chunks come in that order, each index's in its own), one document an item. `read` is an
/// index already read (path and bytes), not fetched again.
pub(crate) async fn open_litdata(
    store: Store,
    mut indexes: Vec<ObjectInfo>,
    display: String,
    read: (String, Bytes),
) -> Result<Arc<DynSampleSource>> {
    indexes.sort_by(|a, b| a.path.cmp(&b.path));
    let (mut files, mut starts) = (Vec::new(), vec![0u64]);
    for index in &indexes {
        let bytes = match &read {
            (path, bytes) if *path == index.path => bytes.clone(),
            _ => store.get(&index.path).await?,
        };
        for file in litdata::chunks(&store, &index.path, &bytes).await? {
            starts.push(starts.last().copied().unwrap_or(0) + file.index.len() as u64);
            files.push(file);
        }
    }
    Ok(Arc::new(TokensSource::new(store, files, starts, display)))
}

/// A flat token file: its header (an `.npy`'s) read, then its documents found.
async fn open_flat(store: &Store, info: &ObjectInfo, separator: i64, opts: &SourceOptions) -> Result<TokenFile> {
    let obj = store.object(info);
    let bad = |reason: String| Error::BadIndex { path: store.describe(&info.path), reason };
    let (ty, header) = if info.path.ends_with(".npy") {
        let head = store.read_span(&obj, 0..info.size.min(4096)).await?;
        let (ty, header, n) =
            flat::npy_header(&head).map_err(|e| bad(format!("{e}; flat token files are 1-D integer arrays")))?;
        if n.checked_mul(ty.size() as u64).and_then(|b| b.checked_add(header)) != Some(info.size) {
            return Err(bad(format!("its header says {n} tokens but the file holds {} bytes", info.size)));
        }
        (ty, header)
    } else {
        let name = opts.token_dtype.as_deref().unwrap_or("uint16");
        let ty = flat::type_named(name)
            .ok_or_else(|| Error::invalid_option(format!("token_dtype={name}: not an integer type numpy names")))?;
        (ty, 0)
    };
    if !ty.holds(separator) {
        return Err(Error::invalid_option(format!(
            "separator={separator} cannot occur in {} tokens of {}",
            ty.name(),
            store.describe(&info.path)
        )));
    }
    let (s, o, cancel) = (store.clone(), obj.clone(), Cancel::default());
    let _guard = cancel.on_drop();
    let docs = tokio::task::spawn_blocking(move || flat::walk(&s, &o, ty, header, separator, cancel))
        .await
        .map_err(Error::task)??;
    let name = info.path.rsplit_once('.').map_or(info.path.as_str(), |(n, _)| n).to_string();
    Ok(TokenFile { name, bin: obj, index: FileDocs::Flat(docs) })
}

impl TokensSource {
    fn new(store: Store, files: Vec<TokenFile>, starts: Vec<u64>, display: String) -> Self {
        let maps = std::sync::Mutex::new(lru::LruCache::new(MAPPED_FILES));
        let advice = MapAdvice::for_files(files.iter().map(|f| f.bin.size()).sum());
        TokensSource { store, files, starts, display, maps, advice }
    }

    /// Local file `f` mapped (see [`MappedObject`]), from the maps kept or mapped now.
    fn mapped(&self, f: usize) -> Result<Arc<MappedObject>> {
        if let Some(m) = self.maps.lock().unwrap_or_else(|e| e.into_inner()).get(&f) {
            return Ok(m.clone());
        }
        // Mapped outside the lock: another thread mapping the same file meanwhile costs a
        // second map, not a wait.
        let m = Arc::new(self.store.map_local(&self.files[f].bin, self.advice)?);
        let evicted = self.maps.lock().unwrap_or_else(|e| e.into_inner()).push(f, m.clone());
        // Unmapped outside the lock (an unmap makes every core drop its cached translations).
        drop(evicted);
        Ok(m)
    }

    /// The file holding document `doc` and its number there.
    fn locate(&self, doc: u64) -> Option<(usize, usize)> {
        super::locate(&self.starts, doc)
    }

    /// Byte spans in file `f` of `(sequence, token span)` pieces.
    fn spans(&self, f: usize, pieces: impl Iterator<Item = (usize, Range<u64>)>) -> Vec<Range<u64>> {
        let file = &self.files[f];
        let item = file.index.ty().size() as u64;
        pieces
            .map(|(s, t)| {
                let at = file.index.pointer(s);
                at + t.start * item..at + t.end * item
            })
            .collect()
    }

    /// Each `(document, token span)` as `(file, document in it, span)`, checked against the
    /// index.
    fn located(&self, pieces: &[(u64, Range<u64>)]) -> Result<Vec<(usize, usize, Range<u64>)>> {
        let mut located = Vec::with_capacity(pieces.len());
        for (doc, span) in pieces {
            let (f, s) = self.locate(*doc).ok_or_else(|| Error::internal(format!("document {doc} out of range")))?;
            // A batch's pieces are documents at random places of the index: all their lengths
            // and offsets are asked for before the first is read (below), so the misses
            // overlap instead of coming in turn.
            self.files[f].index.prefetch(s, true);
            located.push((f, s, span.clone()));
        }
        for ((f, s, span), (doc, _)) in located.iter().zip(pieces) {
            if span.start > span.end || span.end > self.files[*f].index.size(*s) {
                return Err(Error::internal(format!("tokens {span:?} of document {doc} are past its end")));
            }
        }
        Ok(located)
    }

    /// Token `t` of file `f` is not an id at the ids' `width` (see [`buf::bad_token`]).
    fn bad_token(&self, f: usize, t: i64, width: usize) -> Error {
        buf::bad_token(t, width, self.store.describe(self.files[f].bin.path()), &self.files[f].name)
    }

    fn damaged(&self, f: usize, what: String) -> Error {
        Error::CorruptData {
            shard: self.store.describe(self.files[f].bin.path()),
            key: self.files[f].name.clone(),
            field: "tokens".into(),
            reason: what,
        }
    }
}

#[async_trait]
impl TokenDocs for TokensSource {
    fn documents(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    fn tokens_in(&self, doc: u64) -> u64 {
        self.locate(doc).map_or(0, |(f, s)| self.files[f].index.size(s))
    }

    fn prefetch_len(&self, doc: u64) {
        if let Some((f, s)) = self.locate(doc) {
            self.files[f].index.prefetch(s, false);
        }
    }

    fn shard_sizes(&self) -> Vec<u64> {
        self.files.iter().map(|f| f.index.len() as u64).collect()
    }

    async fn read_into(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenBuf) -> Result<()> {
        // Pieces of one file are read in one call, so the store merges neighbours; the
        // tokens go out in the order asked.
        let located = self.located(pieces)?;
        let mut read: Vec<Option<Bytes>> = vec![None; pieces.len()];
        for group in by_file(&located).chunk_by(|&a, &b| located[a].0 == located[b].0) {
            let f = located[group[0]].0;
            let spans = self.spans(f, group.iter().map(|&i| (located[i].1, located[i].2.clone())));
            let got = self.store.read(&self.files[f].bin, &spans).await?;
            for (&i, bytes) in group.iter().zip(got) {
                read[i] = Some(bytes);
            }
        }
        for ((f, _, span), bytes) in located.iter().zip(read) {
            let ty = self.files[*f].index.ty();
            let bytes = bytes.unwrap_or_default();
            let n = (span.end - span.start) as usize;
            if bytes.len() != n * ty.size() {
                return Err(self.damaged(*f, format!("read {} bytes for {n} tokens", bytes.len())));
            }
            let width = out.width();
            out.extend(ty, &bytes[..n * ty.size()]).map_err(|t| self.bad_token(*f, t, width))?;
        }
        Ok(())
    }

    fn reads_in_place(&self) -> bool {
        !self.store.is_remote()
    }

    fn read_now(&self, pieces: &[(u64, Range<u64>)], out: &mut TokenSlots<'_>) -> Result<()> {
        // Straight from each file's map into the batch: the pieces grouped by file (one map
        // lookup and one size check per file per batch), each copied, widened to the ids'
        // width, into its own slot.
        let located = self.located(pieces)?;
        for group in by_file(&located).chunk_by(|&a, &b| located[a].0 == located[b].0) {
            let f = located[group[0]].0;
            let ty = self.files[f].index.ty();
            let spans = self.spans(f, group.iter().map(|&i| (located[i].1, located[i].2.clone())));
            let mut slot = group.iter();
            self.mapped(f)?.spans(&spans, |bytes| match slot.next() {
                Some(&i) => out.put_at(i, ty, bytes, |t, width| self.bad_token(f, t, width)),
                None => Err(Error::internal("more spans than pieces")),
            })?;
        }
        Ok(())
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.store.counters())
    }
}

/// Indices of `located` pieces, grouped by file (in asked order within a file).
fn by_file(located: &[(usize, usize, Range<u64>)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..located.len()).collect();
    order.sort_by_key(|&i| located[i].0);
    order
}

#[async_trait]
impl SampleSource for TokensSource {
    fn len(&self) -> usize {
        self.documents() as usize
    }

    fn capability(&self) -> Capability {
        Capability {
            random_access: true,
            coalesced_reads: true,
            locality: true,
            cheap_meta: true,
            local: !self.store.is_remote(),
        }
    }

    fn info(&self) -> SourceInfo {
        SourceInfo::of(Layout::Tokens, self.files.len())
    }

    async fn get(&self, index: usize) -> Result<Sample> {
        Ok(self.get_many(&[index]).await?.pop().unwrap_or_else(|| Sample::single("", "tokens", Bytes::new())))
    }

    async fn get_many(&self, indices: &[usize]) -> Result<Vec<Sample>> {
        let mut located = Vec::with_capacity(indices.len());
        for &i in indices {
            check_index(i, self.len())?;
            located.push(self.locate(i as u64).ok_or_else(|| Error::internal("a checked index not found"))?);
        }
        let mut out: Vec<Option<Sample>> = vec![None; indices.len()];
        let mut by_file: Vec<usize> = (0..located.len()).collect();
        by_file.sort_by_key(|&i| located[i]);
        for group in by_file.chunk_by(|&a, &b| located[a].0 == located[b].0) {
            let f = located[group[0]].0;
            let file = &self.files[f];
            let spans = self.spans(f, group.iter().map(|&i| (located[i].1, 0..file.index.size(located[i].1))));
            let got = self.store.read(&file.bin, &spans).await?;
            for (&i, bytes) in group.iter().zip(got) {
                out[i] = Some(Sample::single(format!("{}/{:09}", file.name, located[i].1), "tokens", bytes));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn locality(&self, index: usize) -> Option<usize> {
        self.locate(index as u64).map(|(f, _)| f)
    }

    fn location(&self, index: usize) -> Option<String> {
        self.locate(index as u64).map(|(f, _)| format!("file {}", self.store.describe(self.files[f].bin.path())))
    }

    async fn meta(&self, index: usize) -> Result<crate::sample::SampleMeta> {
        check_index(index, self.len())?;
        let (f, s) = self.locate(index as u64).ok_or_else(|| Error::internal("a checked index not found"))?;
        let file = &self.files[f];
        let bytes = file.index.size(s) * file.index.ty().size() as u64;
        Ok(crate::sample::SampleMeta { key: format!("{}/{s:09}", file.name), fields: vec![("tokens".into(), bytes)] })
    }

    fn io_counters(&self) -> Option<IoCounters> {
        Some(self.store.counters())
    }

    fn as_tokens(&self) -> Option<&dyn TokenDocs> {
        Some(self)
    }
}

/// See [`crate::fuzzing::token_index`].
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    if pick % 2 == 1 {
        let _ = super::jsonl::text_field(rest, "text");
        return;
    }
    if rest.len() < 8 {
        return;
    }
    let bin_len = u64::from_le_bytes(rest[..8].try_into().unwrap_or_default()) % (1 << 40);
    if let Ok(idx) = Index::parse(Bytes::copy_from_slice(&rest[8..]), bin_len) {
        for i in 0..idx.len() {
            let end = idx.pointer(i) + idx.size(i) * idx.ty.size() as u64;
            assert!(end <= bin_len, "sequence {i} ends at {end}, past {bin_len}");
        }
    }
}
