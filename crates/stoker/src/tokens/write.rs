//! Pre-tokenizing: any text source written as a Megatron indexed dataset (`.bin` + `.idx`),
//! tokenized on all cores, in parts that a rerun keeps (each checked by its recorded size and
//! xxh64 checksum), so an interrupted run goes on where it stopped.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use super::manifest::{read_manifest, resume_or_refuse, write_manifest, xxh64, Part, Skipped, TokenizedManifest};
use crate::decode::TextTokenizer;
use crate::error::{Error, Result};
use crate::source::tokens::write_idx;
use crate::source::DynSampleSource;
use crate::store::Store;

/// Documents tokenized per batch handed to the tokenizer's threads.
const CHUNK: usize = 512;

/// Where the documents' ids come from.
#[derive(Clone)]
enum Ids {
    /// Text, tokenized.
    Text(Arc<TextTokenizer>),
    /// Arrays of token ids already (`.npy` 1-D integer arrays: MDS `ndarray` columns, Parquet
    /// integer lists, LitData numpy or tensor leaves), copied.
    Arrays,
}

/// What the manifest records as the tokenizer of arrays copied as they are.
const ARRAYS: &str = "arrays";

/// How to pre-tokenize.
#[derive(Clone, Debug)]
pub struct TokenizeOptions {
    /// The sample field holding the text (default: the sample's only field).
    pub field: Option<String>,
    /// Token appended to every document as it is written (Megatron's `--append-eod`).
    pub append_eos: Option<u32>,
    /// Documents per part file (`NAME-00000.bin` ...); a rerun redoes at most one part.
    pub documents_per_part: u64,
    /// Part files are `{name}-{part:05}.bin` / `.idx`.
    pub name: String,
    /// A document whose stored bytes are damaged or not what the run reads (a JSONL line that
    /// is not JSON or lacks the field, text that is not UTF-8, an array that is not ids) is
    /// written empty and recorded in its part's `skipped`, instead of failing the run. Errors
    /// of the store (I/O, remote) still fail it: a later run resumes. Not part of what a
    /// directory holds: a run that stopped at a bad document resumes with it on.
    pub skip_errors: bool,
    /// Replace another job's parts (the ones its manifest names) instead of refusing them.
    pub force: bool,
}

impl Default for TokenizeOptions {
    fn default() -> Self {
        TokenizeOptions {
            field: None,
            append_eos: None,
            documents_per_part: 1 << 20,
            name: "tokens".into(),
            skip_errors: false,
            force: false,
        }
    }
}

/// Tokenize every document of `src` with `tok` into Megatron parts in `dest`, keeping parts a
/// previous run of the same job finished. Returns the manifest. `progress` hears documents done.
pub async fn pretokenize(
    src: Arc<DynSampleSource>,
    tok: Arc<TextTokenizer>,
    dest: &Path,
    opts: &TokenizeOptions,
    progress: &(dyn Fn(u64) + Send + Sync),
) -> Result<TokenizedManifest> {
    write_parts(src, Ids::Text(tok), dest, opts, progress).await
}

/// [`pretokenize`] for a source whose documents are token ids already: field `opts.field`
/// (else the samples' only field) of every sample is a 1-D integer `.npy` array (what Stoker
/// makes of MDS `ndarray` columns, Parquet integer lists and LitData numpy leaves), copied into
/// int32 parts. `opts.append_eos` is appended to each.
pub async fn pack_arrays(
    src: Arc<DynSampleSource>,
    dest: &Path,
    opts: &TokenizeOptions,
    progress: &(dyn Fn(u64) + Send + Sync),
) -> Result<TokenizedManifest> {
    write_parts(src, Ids::Arrays, dest, opts, progress).await
}

/// The work of [`pretokenize`] and [`pack_arrays`], compiled here (see the note at the crate's
/// `pub use`s).
fn write_parts<'a>(
    src: Arc<DynSampleSource>,
    ids: Ids,
    dest: &'a Path,
    opts: &'a TokenizeOptions,
    progress: &'a (dyn Fn(u64) + Send + Sync),
) -> futures::future::BoxFuture<'a, Result<TokenizedManifest>> {
    use futures::FutureExt;
    write_parts_here(src, ids, dest, opts, progress).boxed()
}

async fn write_parts_here(
    src: Arc<DynSampleSource>,
    ids: Ids,
    dest: &Path,
    opts: &TokenizeOptions,
    progress: &(dyn Fn(u64) + Send + Sync),
) -> Result<TokenizedManifest> {
    if let Some(e) = opts.append_eos.filter(|&e| e > i32::MAX as u32) {
        return Err(Error::invalid_option(format!("append_eos {e}: token ids are below 2^31")));
    }
    if crate::uri::writes_into(&src.to_string(), &dest.display().to_string()) {
        return Err(Error::Pack {
            dest: dest.display().to_string(),
            reason: format!("it is where the source {src} reads (or inside it); write the parts to another directory"),
        });
    }
    std::fs::create_dir_all(dest).map_err(|e| Error::io(dest.display(), e))?;
    let _held = crate::store::lock_dest(dest, &dest.display().to_string())?;
    let out = Store::local(dest)?;
    let n = src.len() as u64;
    let per = opts.documents_per_part.max(1);
    let want = TokenizedManifest {
        source: src.to_string(),
        documents: n,
        tokenizer: match &ids {
            Ids::Text(tok) => format!("{:016x}", tok.fingerprint()),
            Ids::Arrays => ARRAYS.into(),
        },
        append_eos: opts.append_eos,
        field: opts.field.clone(),
        documents_per_part: per,
        source_version: src.fingerprint().map(|v| format!("{v:016x}")),
        parts: Vec::new(),
    };
    let mut done = resume_or_refuse(&out, want, opts.force, &opts.name, dest).await?;
    // uint16 when every id fits (the vocabulary's size bounds them; the check below catches a
    // vocabulary with gaps), int32 otherwise.
    let wide = match &ids {
        Ids::Text(tok) => tok.vocab_size() > 1 << 16 || opts.append_eos.is_some_and(|e| e > u32::from(u16::MAX)),
        // Their widths are known only once read: int32 holds every id there is.
        Ids::Arrays => true,
    };
    progress(done.parts.iter().map(|p| p.documents).sum());
    for p in done.parts.len() as u64..n.div_ceil(per) {
        let docs = p * per..((p + 1) * per).min(n);
        let name = format!("{}-{p:05}", opts.name);
        let part = write_part(&src, &ids, (&out, dest), &name, docs, wide, opts, progress).await?;
        done.parts.push(part);
        write_manifest(&out, &done).await?;
    }
    if n == 0 {
        write_manifest(&out, &done).await?;
    }
    Ok(done)
}

#[allow(clippy::too_many_arguments)]
async fn write_part(
    src: &Arc<DynSampleSource>,
    how: &Ids,
    (out, dest): (&Store, &Path),
    name: &str,
    docs: std::ops::Range<u64>,
    wide: bool,
    opts: &TokenizeOptions,
    progress: &(dyn Fn(u64) + Send + Sync),
) -> Result<Part> {
    let bin_name = format!("{name}.bin");
    // Through the store's writer: sent to the disk and synced in the background as it grows
    // (a part is gigabytes: its publishing sync then waits for the last stretch only),
    // published whole (synced, renamed, the directory synced), and removed if the part fails.
    let mut bin = out.writer(&bin_name, 0)?;
    // What an earlier version left of a part it failed to write (it named its temporary files
    // so); this version's writer removes its own.
    let _ = std::fs::remove_file(dest.join(format!(".{name}.bin.tmp")));
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    let (mut sizes, mut bytes) = (Vec::with_capacity((docs.end - docs.start) as usize), 0u64);
    let mut at = docs.start;
    let mut skipped = Skipped::default();
    while at < docs.end {
        let upto = (at + CHUNK as u64).min(docs.end);
        let indices: Vec<usize> = (at as usize..upto as usize).collect();
        let samples = read(src, &indices, opts.skip_errors, &mut skipped).await?;
        let field = opts.field.as_deref();
        // A skipped document stays empty: its EOS is not added either.
        let mut empty = Vec::with_capacity(samples.len());
        let ids = match how {
            Ids::Text(tok) => {
                let mut texts = Vec::with_capacity(samples.len());
                for (s, &i) in samples.iter().zip(&indices) {
                    let text = s.as_ref().map(|s| text_of(s, field, &**src)).transpose();
                    let text = kept(text, i as u64, opts.skip_errors, &mut skipped)?.flatten();
                    empty.push(text.is_none());
                    texts.push(text.unwrap_or("").to_string());
                }
                let t = tok.clone();
                tokio::task::spawn_blocking(move || {
                    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                    t.encode_batch(&refs)
                })
                .await
                .map_err(Error::task)??
            }
            Ids::Arrays => {
                let mut out = Vec::with_capacity(samples.len());
                for (s, &i) in samples.iter().zip(&indices) {
                    let ids = s.as_ref().map(|s| array_of(s, field, &**src)).transpose();
                    let ids = kept(ids, i as u64, opts.skip_errors, &mut skipped)?.flatten();
                    empty.push(ids.is_none());
                    out.push(ids.unwrap_or_default());
                }
                out
            }
        };
        let mut buf = Vec::new();
        for (mut doc, empty) in ids.into_iter().zip(empty) {
            if empty {
                doc.clear();
            } else {
                doc.extend(opts.append_eos);
            }
            sizes.push(doc.len() as u64);
            buf.clear();
            for &t in &doc {
                if wide {
                    // int32 token files (Megatron's widest for ids): an id past 2^31 would be
                    // written as a negative one, and read back as damage.
                    let t = i32::try_from(t).map_err(|_| {
                        Error::invalid_option(format!(
                            "token id {t} is past 2^31 - 1, which int32 token files cannot hold (a tokenizer \
                             vocabulary with ids no embedding has rows for, or arrays that are not token ids)"
                        ))
                    })?;
                    buf.extend_from_slice(&t.to_le_bytes());
                } else {
                    let t = u16::try_from(t).map_err(|_| {
                        Error::invalid_option(format!(
                            "token id {t} does not fit the uint16 this tokenizer's vocabulary size chose: its ids have \
                             gaps; write the corpus with another tokenizer.json or report it"
                        ))
                    })?;
                    buf.extend_from_slice(&t.to_le_bytes());
                }
            }
            hasher.write(&buf);
            bin.write_all(&buf).map_err(|e| out.write_error(&bin_name, e))?;
            bytes += buf.len() as u64;
        }
        progress(upto - at);
        at = upto;
    }
    if sizes.iter().any(|&s| s > i32::MAX as u64) {
        return Err(Error::invalid_option(format!("{name}: a document of more than 2^31 tokens")));
    }
    let (code, item) = if wide { (4, 4) } else { (8, 2) };
    bin.finish().await?;
    let idx = write_idx(code, &sizes, item);
    let idx_xxh64 = Some(xxh64(&idx));
    out.put_whole(&format!("{name}.idx"), idx.into()).await?;
    use std::hash::Hasher;
    Ok(Part {
        name: name.to_string(),
        documents: docs.end - docs.start,
        skipped_count: skipped.count,
        skipped: skipped.listed,
        tokens: sizes.iter().sum(),
        bin_bytes: bytes,
        bin_xxh64: format!("{:016x}", hasher.finish()),
        idx_xxh64,
    })
}

/// Samples `indices` of `src`; with `skip`, one whose bytes are bad (damaged, or not what the
/// layout holds) is `None` and recorded in `skipped`.
async fn read(
    src: &Arc<DynSampleSource>,
    indices: &[usize],
    skip: bool,
    skipped: &mut Skipped,
) -> Result<Vec<Option<crate::Sample>>> {
    match src.get_many(indices).await {
        Ok(s) => Ok(s.into_iter().map(Some).collect()),
        Err(e) if !skip || !bad_data(&e) => Err(e),
        // One by one, to find which.
        Err(_) => {
            let mut out = Vec::with_capacity(indices.len());
            for &i in indices {
                out.push(kept(src.get(i).await.map(Some), i as u64, true, skipped)?.flatten());
            }
            Ok(out)
        }
    }
}

/// `got`, or under `skip` `None` with the document recorded when its data is bad.
fn kept<T>(got: Result<Option<T>>, doc: u64, skip: bool, skipped: &mut Skipped) -> Result<Option<Option<T>>> {
    match got {
        Ok(v) => Ok(Some(v)),
        Err(e) if skip && bad_data(&e) => {
            skipped.note(doc, e.to_string());
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether `e` is about a document's own bytes (skippable), not the store or the run: damage,
/// undecodable bytes, or a document without the field (a Parquet null, an MDS sample without
/// the column).
fn bad_data(e: &Error) -> bool {
    matches!(e.kind(), crate::error::ErrorKind::Corrupt | crate::error::ErrorKind::Decode)
        || matches!(e, Error::MissingField { .. })
}

/// The token ids of a sample: field `field` (else its only field), a 1-D integer `.npy`
/// array of ids in `0..2^31`.
fn array_of(s: &crate::Sample, field: Option<&str>, src: &DynSampleSource) -> Result<Vec<u32>> {
    use crate::batch::Dtype;
    let bytes = field_of(s, field, src)?;
    let name = match field {
        Some(f) => f.to_string(),
        None => s.fields.first().map_or_else(String::new, |f| f.name.to_string()),
    };
    let bad = |reason: String| Error::CorruptData {
        shard: src.to_string(),
        key: s.key.clone(),
        field: name.clone(),
        reason: format!("{reason}; packing reads 1-D integer arrays of token ids here, or text with a tokenizer"),
    };
    let h = crate::decode::parse_npy(bytes).map_err(&bad)?;
    let [n] = h.shape[..] else { return Err(bad(format!("the array has shape {:?}", h.shape))) };
    let size = h.dtype.size();
    let data = h
        .data_bytes()
        .and_then(|b| bytes.get(h.data_offset..h.data_offset.checked_add(b)?))
        .ok_or_else(|| bad("the array is cut short".into()))?;
    let mut out = Vec::with_capacity(n);
    for v in data.chunks_exact(size) {
        let mut le = [0u8; 8];
        le[..size].copy_from_slice(v);
        if h.big_endian {
            le[..size].reverse();
        }
        let negative = le[size - 1] & 0x80 != 0;
        let id: i64 = match h.dtype {
            Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => {
                let u = u64::from_le_bytes(le);
                i64::try_from(u).map_err(|_| bad(format!("token id {u} is not in 0..2^31")))?
            }
            Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => {
                if negative {
                    le[size..].fill(0xff);
                }
                i64::from_le_bytes(le)
            }
            other => return Err(bad(format!("the array is {other}, not integers"))),
        };
        out.push(
            u32::try_from(id)
                .ok()
                .filter(|&t| t <= i32::MAX as u32)
                .ok_or_else(|| bad(format!("token id {id} is not in 0..2^31")))?,
        );
    }
    Ok(out)
}

/// Field `field` of a sample, else its only field.
fn field_of<'a>(s: &'a crate::Sample, field: Option<&str>, src: &DynSampleSource) -> Result<&'a [u8]> {
    Ok(match field {
        // A Parquet row whose column is null has no field at all: the document's damage (the
        // skip policy counts it), named with its source.
        Some(f) => s.field(f).ok_or_else(|| {
            let has: Vec<&str> = s.field_names().collect();
            Error::CorruptData {
                shard: src.to_string(),
                key: s.key.clone(),
                field: f.to_string(),
                reason: format!(
                    "no value (a null?); the sample has: {} (if every sample says so, field= names no field of \
                     this source)",
                    if has.is_empty() { "none".to_string() } else { has.join(", ") }
                ),
            }
        })?,
        None if s.fields.len() == 1 => &s.fields[0].data,
        None => {
            return Err(Error::invalid_option(format!(
                "{src}: sample {} has fields {}; say which holds the documents (field=)",
                s.key,
                s.field_names().collect::<Vec<_>>().join(", ")
            )))
        }
    })
}

/// The text of a sample: field `field`, else its only field; UTF-8.
fn text_of<'a>(s: &'a crate::Sample, field: Option<&str>, src: &DynSampleSource) -> Result<&'a str> {
    let bytes = field_of(s, field, src)?;
    std::str::from_utf8(bytes).map_err(|e| Error::CorruptData {
        shard: src.to_string(),
        key: s.key.clone(),
        field: field.unwrap_or("text").to_string(),
        reason: format!("the text is not UTF-8: {e}"),
    })
}

/// The token source for a text source: its documents tokenized with `tok` once, into a
/// directory of the user's cache named by what made it (the source's files at their versions,
/// its count, three of its documents, the tokenizer's hash, the field), then read as a
/// Megatron dataset. Without a tokenizer, the documents must be arrays of ids already (see
/// [`pack_arrays`]: MDS `ndarray` columns, Parquet integer lists), copied once the same way;
/// a source of anything else is refused at its first document.
///
/// This is how ranks agree on sequence boundaries for text: packing needs every document's
/// token count before the first batch, and the only way to know it is to tokenize. Processes
/// sharing the cache directory (the ranks of a node) take a lock on it: the first tokenizes
/// (on all cores, resumable part by part), the others wait and then read its files; another
/// node tokenizes the same text into the same ids. A directory already complete is opened at
/// once. LMDB and HDF5 give no file versions: docs/tokens.md says what that means.
///
/// With `skip_errors`, documents whose bytes are bad are written empty (see
/// [`TokenizeOptions::skip_errors`]); how many, and the first reasons, are said on stderr.
pub async fn tokenized(
    src: Arc<DynSampleSource>,
    tok: Option<Arc<TextTokenizer>>,
    field: Option<String>,
    cache: &Path,
    skip_errors: bool,
) -> Result<Arc<DynSampleSource>> {
    tokenized_boxed(src, tok, field, cache, skip_errors).await
}

/// [`tokenized`], compiled here (see the note at the crate's `pub use`s).
fn tokenized_boxed(
    src: Arc<DynSampleSource>,
    tok: Option<Arc<TextTokenizer>>,
    field: Option<String>,
    cache: &Path,
    skip_errors: bool,
) -> futures::future::BoxFuture<'_, Result<Arc<DynSampleSource>>> {
    use futures::FutureExt;
    tokenized_here(src, tok, field, cache, skip_errors).boxed()
}

async fn tokenized_here(
    src: Arc<DynSampleSource>,
    tok: Option<Arc<TextTokenizer>>,
    field: Option<String>,
    cache: &Path,
    skip_errors: bool,
) -> Result<Arc<DynSampleSource>> {
    use std::hash::Hasher;
    let n = src.len();
    if n == 0 {
        // Said of the source, not of the empty cache directory it would be tokenized into.
        return Err(Error::Empty { uri: src.to_string(), reason: "it holds no documents to tokenize".into() });
    }
    let mut h = twox_hash::XxHash64::with_seed(0);
    h.write(src.to_string().as_bytes());
    // Every file at its version where the layout says (edited in place, or another corpus
    // under the same relative path: tokenized afresh).
    h.write_u64(src.fingerprint().unwrap_or_default());
    h.write_u64(n as u64);
    match &tok {
        Some(t) => {
            h.write_u64(t.fingerprint());
            // How long texts are cut before tokenizing changes their ids: a cache written under
            // another cut must not be served as this one's.
            h.write_u64(crate::decode::PIECE_BYTES as u64);
        }
        None => h.write(ARRAYS.as_bytes()),
    }
    h.write(field.as_deref().unwrap_or("").as_bytes());
    h.write_u8(skip_errors as u8);
    let probes = vec![0, n / 2, n - 1];
    let probed: Vec<_> =
        read(&src, &probes, skip_errors, &mut Skipped::default()).await?.into_iter().flatten().collect();
    for s in &probed {
        for f in &s.fields {
            h.write(&f.data);
        }
    }
    // Without a tokenizer the documents must be arrays of ids: the first that reads is checked,
    // so a text source is refused at once rather than written empty (under skip_errors) or
    // failed at its first document deep in the pass.
    if let (None, Some(first)) = (&tok, probed.first()) {
        array_of(first, field.as_deref(), &*src).map_err(|e| {
            Error::invalid_option(format!(
                "{src} ({} layout) holds no token documents: packing reads tokenized corpora (Megatron .bin/.idx, \
                 LitData token chunks, arrays of ids), or text with a tokenizer (tokenizer=); its first document: {e}",
                src.info().layout
            ))
        })?;
    }
    let dir = cache.join(format!("{:016x}", h.finish()));
    std::fs::create_dir_all(cache).map_err(|e| Error::io(cache.display(), e))?;
    let lock_path = cache.join(format!("{:016x}.lock", h.finish()));
    // Not `File::create`: it truncates, and follows a link planted at the lock's name.
    let lock = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::File::options()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&lock_path)
    };
    let lock = lock.map_err(|e| Error::io(lock_path.display(), e))?;
    // Blocking: another rank may hold it for the whole tokenizing pass.
    let lock = tokio::task::spawn_blocking(move || lock.lock().map(|()| Unlocking(lock)))
        .await
        .map_err(Error::task)?
        .map_err(|e| Error::io(lock_path.display(), e))?;
    let opts = TokenizeOptions { field, skip_errors, ..TokenizeOptions::default() };
    // A finished directory opens at once, its parts held to their sizes and their indexes
    // there (checksums are checked when a run resumes, which reads them anyway).
    // None in a directory not made yet, or one that cannot be read: the tokens are written.
    let out = dir.is_dir().then(|| Store::local(&dir).ok()).flatten();
    let manifest = match out {
        Some(out) => read_manifest(&out).await.ok().flatten(),
        None => None,
    };
    let finished = manifest.filter(|m| {
        m.parts.iter().map(|p| p.documents).sum::<u64>() == n as u64
            && m.parts.iter().all(|p| {
                std::fs::metadata(dir.join(format!("{}.bin", p.name))).is_ok_and(|md| md.len() == p.bin_bytes)
                    && dir.join(format!("{}{}", p.name, crate::source::tokens::IDX_SUFFIX)).is_file()
            })
    });
    let ids = tok.map_or(Ids::Arrays, Ids::Text);
    let done = match finished {
        Some(m) => Ok(m),
        None => write_parts(src.clone(), ids, &dir, &opts, &|_| {}).await,
    };
    drop(lock);
    let parts = done?.parts;
    let bad: u64 = parts.iter().map(Part::skipped_documents).sum();
    if bad > 0 {
        let first = parts.iter().flat_map(|p| &p.skipped).take(5).map(|(d, why)| format!("  document {d}: {why}"));
        eprintln!(
            "stoker: warning: {bad} of {n} documents of {src} were bad and are packed empty (skip_errors):\n{}{}",
            first.collect::<Vec<_>>().join("\n"),
            if bad > 5 { "\n  ..." } else { "" }
        );
    }
    let opened = crate::source::open(&dir.display().to_string(), Default::default()).await?;
    // What was opened must be the source's documents, one for one: a part changed since
    // would otherwise shift every document after it.
    if opened.len() != n {
        return Err(Error::BadIndex {
            path: dir.display().to_string(),
            reason: format!(
                "the tokenized copy of {src} holds {} documents where the source has {n}: it was changed since it \
                 was written; remove the directory to tokenize again",
                opened.len()
            ),
        });
    }
    Ok(opened)
}

/// A held `flock`, unlocked when dropped, not only closed: the lock belongs to the open file,
/// which a process forked meanwhile (a DataLoader fork worker) shares through its copy of the
/// descriptor, never closed; closing alone left the lock held for the child's life, and every
/// rank that tokenizes the corpus next waited for it.
struct Unlocking(std::fs::File);

impl Drop for Unlocking {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}
