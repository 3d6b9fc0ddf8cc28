//! Tar shards from samples in hand: the writer behind distributed packing (the Ray datasink),
//! where each task holds its own rows and no plan of the whole dataset exists.
//!
//! A shard is the same WebDataset tar [`pack`](super::pack) writes (same member names, same
//! refusals, fixed metadata so the same samples always give the same bytes), streamed as it is
//! written ([`ShardStream`]: a local file under a temporary name renamed whole, a remote object
//! in parts of a multipart upload), then indexed with the payload checksums computed from the
//! bytes as they passed. A shard already there with the same bytes is left alone, so a rerun
//! of an interrupted job replaces only what did not land.

use bytes::Bytes;

use super::names;
pub use super::stream::ShardWritten;
use super::stream::{sample_members, ShardStream, TAR_END};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::source::tar_index;
use crate::store::Store;
use crate::uri::{self, SourceOptions};

/// Writes tar shards into one destination (a local directory, created if missing, or a remote
/// prefix such as `s3://bucket/shards/`).
///
/// ```no_run
/// # async fn demo() -> stoker::Result<()> {
/// use stoker::pack::ShardWriter;
/// use stoker::{Field, Sample};
/// let out = ShardWriter::open("./shards", Default::default())?;
/// let samples = vec![Sample {
///     key: "cat/0001".into(),
///     fields: vec![Field { name: "jpg".into(), data: bytes::Bytes::from_static(b"...") }],
/// }];
/// let shard = out.write("train-000000.tar", &samples).await?;
/// assert!(!shard.kept);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ShardWriter {
    out: Store,
    uri: String,
    shown: String,
    options: SourceOptions,
}

/// The record of a job writing into a destination, so a rerun knows the shards there are its
/// own and a different job is not mixed into them.
pub const JOB_FILE: &str = crate::source::WRITE_RECORD;

#[derive(serde::Serialize, serde::Deserialize)]
struct JobFile {
    /// The settings the caller gave [`ShardWriter::begin`] (shard size, naming...).
    settings: serde_json::Value,
    /// The prefix the job names its files by.
    #[serde(default)]
    prefix: Option<String>,
    /// Whether [`ShardWriter::finish`] completed.
    complete: bool,
}

impl ShardWriter {
    /// A writer for `dest` (options such as `?endpoint=` in its query or in `options`).
    pub fn open(dest: &str, options: SourceOptions) -> Result<Self> {
        let parsed = uri::parse(dest)?;
        let shown = parsed.display.clone();
        let options = options.merged(parsed.options);
        let out = super::dest_store(parsed.location, &options, &shown)?;
        Ok(ShardWriter { out, uri: dest.to_string(), shown, options })
    }

    /// Start (or resume) a job: record `settings` in the destination ([`JOB_FILE`]). Until
    /// [`finish`](Self::finish) marks the job complete, opening the destination as a dataset
    /// is refused (some of its shards may be missing).
    ///
    /// A destination holding the record of a job with the same settings is resumed (shards
    /// already there with the right bytes will be kept). One holding a job with other settings,
    /// or files not written by a job, is refused unless `force` is set; with `force`, an earlier
    /// job's files (those named `{its prefix}-DDDDDD-DDDD`, their indexes, the manifest) are
    /// removed first, and other files are left (tar shards among them join the manifest).
    /// `prefix` is the one this job names its files by (see [`finish`](Self::finish)).
    pub async fn begin(&self, settings: &serde_json::Value, prefix: &str, force: bool) -> Result<()> {
        let fail = |reason: String| Error::Pack { dest: self.shown.clone(), reason };
        match self.job().await? {
            Some(old) if old.settings == *settings => {
                // A shard another hand put there would be indexed as the job's at `finish`.
                if !force {
                    let old_prefix = old.prefix.as_deref().unwrap_or(prefix);
                    if let Some(found) = super::stray_shard(&self.out, |p| is_job_file_name(p, old_prefix)).await? {
                        return Err(fail(format!(
                            "it holds `{found}`, which the write there did not make; move it away, or pass force to \
                             keep it (it joins the manifest)"
                        )));
                    }
                }
                // The manifest is written at `finish` only: a rerun that dies midway must not
                // leave the last run's, which readers would take for the whole dataset.
                self.out.delete(crate::source::manifest::MANIFEST).await?;
            }
            Some(old) if force => {
                let old_prefix = old.prefix.as_deref().unwrap_or(prefix);
                self.remove_job_files(old_prefix, &Default::default()).await?;
                self.out.delete(crate::source::manifest::MANIFEST).await?;
                self.out.delete(crate::source::PACK_RECORD).await?;
            }
            Some(old) => {
                return Err(fail(format!(
                    "it holds {} write with other settings ({}, not {settings}); rerun with the same settings to \
                     finish it, pass force to replace it, or choose another destination",
                    if old.complete { "a finished" } else { "an unfinished" },
                    old.settings
                )))
            }
            // An unfinished `stoker pack` left here would have the destination refused as
            // unfinished once this job is done.
            None if force => self.out.delete(crate::source::PACK_RECORD).await?,
            None => {
                let entries = self.out.entries().await?;
                if let Some(found) = entries.iter().find(|n| !crate::store::is_temp_name(n)) {
                    return Err(fail(format!(
                        "it is not empty (it holds `{found}`) and was not written by this writer; choose an empty or \
                         new destination, or pass force to write into it anyway"
                    )));
                }
            }
        }
        let job = JobFile { settings: settings.clone(), prefix: Some(prefix.to_string()), complete: false };
        self.save_job(&job).await
    }

    /// Remove the files named as a job with `prefix` names them, but for the stems in `keep`.
    async fn remove_job_files(&self, prefix: &str, keep: &std::collections::HashSet<String>) -> Result<()> {
        for name in self.out.entries().await? {
            // A job file's temporary file, left by a task killed while writing it (a local
            // destination's; a remote one's unfinished upload is the store's to expire).
            if crate::store::temp_target(&name).is_some_and(|t| is_job_file_name(t, prefix)) {
                self.out.delete(&name).await?;
                continue;
            }
            if is_job_file_name(&name, prefix) && !keep.contains(&stem(&name)) {
                if name.ends_with(".tar") {
                    self.out.delete(&tar_index::sidecar_path(&name)).await?;
                }
                self.out.delete(&name).await?;
            }
        }
        Ok(())
    }

    /// End a job whose shards are `written` (the names [`write`](Self::write) and
    /// [`write_tokens`](Self::write_tokens) returned): remove the shards (and token pairs)
    /// named `{prefix}-{task:06}-{n:04}.tar` (`.bin`, `.idx`), the names a job gives its
    /// files, that an earlier run left and this one did not write (a rerun over changed data),
    /// build the manifest, and mark the job complete. Files named otherwise are left.
    pub async fn finish(&self, prefix: &str, written: &[String]) -> Result<crate::source::IndexReport> {
        let Some(mut job) = self.job().await? else {
            return Err(Error::Pack {
                dest: self.shown.clone(),
                reason: format!("{JOB_FILE} is missing: `begin` was not called, or another job removed it"),
            });
        };
        let written: std::collections::HashSet<String> = written.iter().map(|n| stem(n)).collect();
        self.remove_job_files(prefix, &written).await?;
        let opts = SourceOptions { checksums: Some(true), ..self.options.clone() };
        let report =
            crate::source::index_with(&self.uri, opts, &|_, _| {}, &Default::default(), Some(JOB_FILE)).await?;
        job.complete = true;
        self.save_job(&job).await?;
        Ok(report)
    }

    async fn job(&self) -> Result<Option<JobFile>> {
        let bytes = match self.out.get(JOB_FILE).await {
            Ok(b) => b,
            Err(e) if e.kind() == crate::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| Error::Pack {
            dest: self.shown.clone(),
            reason: format!("{JOB_FILE} is not a job record ({e}); delete it, or pass force"),
        })
    }

    async fn save_job(&self, job: &JobFile) -> Result<()> {
        let json = serde_json::to_vec(job).map_err(|e| Error::internal(format!("{JOB_FILE}: {e}")))?;
        self.out.put_whole(JOB_FILE, Bytes::from(json)).await
    }

    /// The destination, credentials redacted.
    pub fn dest(&self) -> &str {
        &self.shown
    }

    /// Start writing the tar shard `name` (a plain file name ending in `.tar`) one sample at
    /// a time (see [`ShardStream`]); `size_hint` is about the bytes it will have (0 if
    /// unknown: what is reserved where a remote shard must be gathered for one PUT). Call it
    /// on the runtime that is to send a remote shard's parts (see [`Store::writer`]).
    pub fn shard(&self, name: &str, size_hint: u64) -> Result<ShardStream> {
        check_name(name)?;
        let writer = self.out.writer(name, size_hint)?;
        Ok(ShardStream::new(self.out.clone(), self.shown.clone(), self.options.clone(), name, writer))
    }

    /// Write `samples`, in order, as the tar shard `name` (a plain file name ending in `.tar`),
    /// and its sidecar index with every member's checksum: a [`ShardStream`] given them all.
    ///
    /// A sample key or field name that would not read back as written (see the
    /// [module docs](super)), two adjacent samples with one key (a reader would merge them), or
    /// a field name twice in a sample is an error naming it, and nothing is written. A shard
    /// already under `name` with the same bytes is kept ([`ShardWritten::kept`]); one with
    /// other bytes is replaced.
    pub async fn write(&self, name: &str, samples: &[Sample]) -> Result<ShardWritten> {
        check_name(name)?;
        let fail = |reason: String| Error::Pack { dest: self.shown.clone(), reason: format!("{name}: {reason}") };
        // Every sample checked before a byte is written.
        let mut previous = None;
        let mut size = TAR_END;
        for s in samples {
            let members = sample_members(previous, &s.key, s.fields.iter().map(|f| &*f.name)).map_err(fail)?;
            size +=
                members.iter().zip(&s.fields).map(|(m, f)| names::member_bytes(m, f.data.len() as u64)).sum::<u64>();
            previous = Some(&s.key);
        }
        let mut stream = self.shard(name, size)?;
        let samples = samples.to_vec();
        let stream = tokio::task::spawn_blocking(move || {
            for s in &samples {
                let fields: Vec<(&str, &[u8])> = s.fields.iter().map(|f| (&*f.name, &f.data[..])).collect();
                stream.add(&s.key, &fields)?;
            }
            Ok::<_, Error>(stream)
        })
        .await
        .map_err(Error::task)??;
        stream.finish().await
    }

    /// Write `docs` (each a document's tokens, little-endian of `dtype`) as the Megatron
    /// indexed dataset `{stem}.bin` + `{stem}.idx`, one document per sequence, as Megatron's
    /// `IndexedDatasetBuilder` writes it. The `.bin` lands first and the `.idx` last, each
    /// whole, so an `.idx` (what readers open) always has its tokens. A pair already there
    /// with the same bytes is kept. [`ShardWritten::name`] is the `.idx`; `payload_bytes`
    /// counts the tokens' bytes.
    pub async fn write_tokens(&self, stem: &str, dtype: TokenDtype, docs: &[Bytes]) -> Result<ShardWritten> {
        super::check_plain("token file stem", stem)?;
        let item = dtype.size();
        if let Some(i) = docs.iter().position(|d| d.len() % item != 0) {
            return Err(Error::invalid_option(format!(
                "{stem}: document {i} has {} bytes, not a whole number of {item}-byte tokens",
                docs[i].len()
            )));
        }
        if let Some(i) = docs.iter().position(|d| d.len() / item > i32::MAX as usize) {
            return Err(Error::invalid_option(format!(
                "{stem}: document {i} has {} tokens; an .idx records at most 2^31 - 1 per document",
                docs[i].len() / item
            )));
        }
        let sizes: Vec<u64> = docs.iter().map(|d| (d.len() / item) as u64).collect();
        let idx = Bytes::from(crate::source::tokens::write_idx(dtype.code(), &sizes, item));
        let bin = Bytes::from(docs.concat());
        let (bin_name, idx_name) = (format!("{stem}.bin"), format!("{stem}.idx"));
        let kept = self.holds(&bin_name, &bin).await && self.holds(&idx_name, &idx).await;
        if !kept {
            // An old `.idx` goes first: beside a new `.bin` it would point into the wrong bytes.
            self.out.delete(&idx_name).await?;
            for (name, bytes) in [(&bin_name, &bin), (&idx_name, &idx)] {
                self.out.put_whole(name, bytes.clone()).await?;
            }
        }
        Ok(ShardWritten {
            name: idx_name,
            bytes: (bin.len() + idx.len()) as u64,
            samples: docs.len(),
            payload_bytes: bin.len() as u64,
            kept,
        })
    }

    /// Whether `name` already holds exactly `tar` (a missing or unreadable object does not).
    async fn holds(&self, name: &str, tar: &[u8]) -> bool {
        match self.out.head(name).await {
            Ok(info) if info.size == tar.len() as u64 => self.out.get(name).await.is_ok_and(|b| b[..] == *tar),
            _ => false,
        }
    }
}

/// The token type of [`ShardWriter::write_tokens`]: Megatron's choice, `U16` for vocabularies
/// up to 65,535 ids, `I32` above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenDtype {
    /// 2-byte unsigned ids (Megatron dtype code 8).
    U16,
    /// 4-byte signed ids (Megatron dtype code 4).
    I32,
}

impl TokenDtype {
    fn code(self) -> u8 {
        match self {
            TokenDtype::U16 => 8,
            TokenDtype::I32 => 4,
        }
    }

    /// Bytes per token.
    pub fn size(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::I32 => 4,
        }
    }
}

/// A file name without its extension.
fn stem(name: &str) -> String {
    name.rsplit_once('.').map_or(name.to_string(), |(s, _)| s.to_string())
}

/// Whether `name` is one a job names its files by: `{prefix}-{task:06}-{n:04}` (or more
/// digits) and `.tar`,
/// `.bin` or `.idx`. Only such names are removed as stale, so files of other origins (a
/// user's `shard-000001.tar` in a destination written with `force`) are never touched.
fn is_job_file_name(name: &str, prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else { return false };
    let Some((stem, ext)) = rest.rsplit_once('.') else { return false };
    // At least so many digits: a task's 10,000th shard is `-10000`, the millionth task `1000000-`.
    let digits = |s: &str, n: usize| s.len() >= n && s.bytes().all(|b| b.is_ascii_digit());
    matches!(ext, "tar" | "bin" | "idx") && stem.split_once('-').is_some_and(|(t, k)| digits(t, 6) && digits(k, 4))
}

/// A shard name is a plain file name in the destination ending in `.tar`, visible to globs
/// like `*.tar`.
fn check_name(name: &str) -> Result<()> {
    match name.strip_suffix(".tar") {
        Some(stem) => super::check_plain("shard name", stem),
        None => Err(Error::invalid_option(format!("shard name `{}` must end in `.tar`", name.escape_debug()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn only_the_names_a_job_gives_are_stale_candidates() {
        for ours in ["p-000001-0000.tar", "p-123456-9999.bin", "p-000000-0001.idx"] {
            assert!(is_job_file_name(ours, "p"), "{ours}");
        }
        assert!(is_job_file_name("p-000000-10000.tar", "p") && is_job_file_name("p-1000000-0000.idx", "p"));
        for other in ["p-000001.tar", "p-00001-0000.tar", "p-000001-0000.tar.stoker-idx.json", "q-000001-0000.tar"] {
            assert!(!is_job_file_name(other, "p"), "{other}");
        }
        assert!(!is_job_file_name("p-000001-000a.tar", "p") && !is_job_file_name("p-x-000001-0000.tar", "p"));
    }

    #[test]
    fn shard_names_are_plain_tar_file_names() {
        for bad in ["", ".tar", ".hidden.tar", "a/b.tar", "a.tgz", "a\n.tar", "a\\b.tar"] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
        check_name("train-000001.tar").unwrap();
    }
}
