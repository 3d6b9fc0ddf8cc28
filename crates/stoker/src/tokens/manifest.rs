//! The manifest of a pre-tokenized directory (what made it, its finished parts) and the checks
//! that tell a rerun which parts to keep.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::store::Store;

/// The manifest a pre-tokenized directory keeps, written after every part.
pub const MANIFEST: &str = ".stoker-tokens.json";

/// What a directory of parts holds, and what made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizedManifest {
    /// The source, as shown (credentials redacted).
    pub source: String,
    /// Documents in the source.
    pub documents: u64,
    /// The tokenizer's fingerprint (xxh64 of its `tokenizer.json`).
    pub tokenizer: String,
    /// The token appended to every document, if any.
    pub append_eos: Option<u32>,
    /// The field the text was taken from (`None`: the samples' only field).
    #[serde(default)]
    pub field: Option<String>,
    /// Documents per part.
    pub documents_per_part: u64,
    /// The source's version when the run began (its files' sizes and times or entity tags:
    /// [`crate::SampleSource::fingerprint`]), hex: a rerun over a source changed since is
    /// another job, not one to finish. `None` where the layout does not say, and in manifests
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_version: Option<String>,
    /// Parts finished so far, in order.
    pub parts: Vec<Part>,
}

/// One finished part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// File name without `.bin` / `.idx`.
    pub name: String,
    /// Documents in it.
    pub documents: u64,
    /// Documents (numbered as in the source) written empty under `skip_errors`, and why: the
    /// first [`LISTED_SKIPS`] of the part (a file of millions of bad lines would otherwise
    /// keep a message for each, in memory and in this manifest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<(u64, String)>,
    /// How many documents were written empty in all (see [`Part::skipped_documents`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_count: u64,
    /// Tokens in it.
    pub tokens: u64,
    /// Size of its `.bin`.
    pub bin_bytes: u64,
    /// xxh64 of its `.bin`, hex.
    pub bin_xxh64: String,
    /// xxh64 of its `.idx`, hex (`None` in manifests written before it was kept): a pointer
    /// changed in place cuts the tokens into other documents without changing a count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idx_xxh64: Option<String>,
}

impl Part {
    /// Documents written empty under `skip_errors`, listed or not (a manifest written before
    /// the count lists them all).
    pub fn skipped_documents(&self) -> u64 {
        self.skipped_count.max(self.skipped.len() as u64)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Reasons a part keeps for its documents written empty ([`Part::skipped`]).
pub const LISTED_SKIPS: usize = 100;

/// A reason is cut to this many bytes: an error may quote what it found.
const REASON_BYTES: usize = 1000;

/// Documents written empty under `skip_errors` while a part is written: the first
/// [`LISTED_SKIPS`] with their reasons, and how many.
#[derive(Debug, Default)]
pub(crate) struct Skipped {
    pub(crate) listed: Vec<(u64, String)>,
    pub(crate) count: u64,
}

impl Skipped {
    /// Document `doc` was bad, for `why`.
    pub(crate) fn note(&mut self, doc: u64, why: String) {
        self.count += 1;
        if self.listed.len() < LISTED_SKIPS {
            let mut why = why;
            if why.len() > REASON_BYTES {
                let cut = (0..=REASON_BYTES).rev().find(|&i| why.is_char_boundary(i)).unwrap_or(0);
                why.truncate(cut);
                why.push_str("...");
            }
            self.listed.push((doc, why));
        }
    }
}

/// The manifest in `out`, if there is one: read as a store reads every file it holds whole
/// (a regular file, of bounded size: see [`Store::get`]).
pub(super) async fn read_manifest(out: &Store) -> Result<Option<TokenizedManifest>> {
    let b = match out.get(MANIFEST).await {
        Ok(b) => b,
        Err(e) if e.kind() == crate::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&b).map(Some).map_err(|e| Error::BadIndex {
        path: out.describe(MANIFEST),
        reason: format!("not a token manifest ({e}); remove the directory and run again"),
    })
}

/// The manifest's parts whose files are whole (size, then checksum, read through `out` a MiB
/// at a time: a part is gigabytes, a million documents by default), each with an index of
/// its documents that fits its tokens; the first that is not ends the list (it and those
/// after it are written again). A part of another size is not read.
async fn kept_parts(out: &Store, mut m: TokenizedManifest) -> Result<TokenizedManifest> {
    use crate::source::tokens::{Index, IDX_SUFFIX};
    // The kept parts' index sums: as many as the parts kept.
    let mut idx_sums = Vec::new();
    for p in &m.parts {
        let Some(bin) = out.head(&format!("{}.bin", p.name)).await.ok().filter(|b| b.size == p.bin_bytes) else {
            break;
        };
        // The checksum covers the tokens only: an index from another part (or none) would cut
        // them into other documents. This part's counts its documents and every token.
        let fits = |i: Index| {
            let tokens = (0..i.len()).try_fold(0u64, |n, k| n.checked_add(i.size(k)));
            i.len() as u64 == p.documents
                && tokens == Some(p.tokens)
                && p.tokens.checked_mul(i.ty.size() as u64) == Some(bin.size)
        };
        let Some(idx) = out.get(&format!("{}{IDX_SUFFIX}", p.name)).await.ok() else { break };
        let idx_sum = xxh64(&idx);
        if p.idx_xxh64.as_ref().is_some_and(|want| *want != idx_sum) || !Index::parse(idx, bin.size).is_ok_and(fits) {
            break;
        }
        let (store, want) = (out.clone(), p.bin_xxh64.clone());
        let same = tokio::task::spawn_blocking(move || {
            use std::hash::Hasher;
            let mut hasher = twox_hash::XxHash64::with_seed(0);
            store.read_pieces(&bin, |b| hasher.write(b)) && format!("{:016x}", hasher.finish()) == want
        })
        .await
        .map_err(Error::task)?;
        if !same {
            break;
        }
        idx_sums.push(idx_sum);
    }
    m.parts.truncate(idx_sums.len());
    // A manifest from before the indexes were summed: the ones kept are, from now on.
    for (p, sum) in m.parts.iter_mut().zip(idx_sums) {
        p.idx_xxh64.get_or_insert(sum);
    }
    Ok(m)
}

/// What a run of the job `want` starts from in `out` (the directory `dest`): the parts of its
/// own earlier run still whole ([`kept_parts`]), brought up to what a manifest keeps now; with
/// `force`, nothing, another job's parts removed; refused when another job's are there, or a
/// file the dataset's reader would take that this run does not write (another pair, a part
/// past the last: see [`foreign_file`]). Nothing is removed before every check has passed.
pub(super) async fn resume_or_refuse(
    out: &Store,
    want: TokenizedManifest,
    force: bool,
    name: &str,
    dest: &std::path::Path,
) -> Result<TokenizedManifest> {
    let refuse = |reason: String| Error::Pack { dest: dest.display().to_string(), reason };
    // A manifest written before versions were kept cannot tell: its source is taken as it is.
    let same_job = |m: &TokenizedManifest| {
        let version = m.source_version.clone().or(want.source_version.clone());
        TokenizedManifest { parts: Vec::new(), source_version: version, ..m.clone() } == want
    };
    let found = read_manifest(out).await?;
    if let Some(m) = found.as_ref().filter(|m| !same_job(m) && !force) {
        let changed = TokenizedManifest { source_version: want.source_version.clone(), ..m.clone() };
        let what = match same_job(&changed) {
            true => "this job, whose source has changed since (a file rewritten: its time or size moved)",
            false => "another job",
        };
        return Err(refuse(format!(
            "it holds tokens of {what} ({} documents of {}, tokenizer {}); use an empty directory, or pass --force \
             to replace them",
            m.documents, m.source, m.tokenizer
        )));
    }
    let parts = want.documents.div_ceil(want.documents_per_part.max(1));
    let old: Vec<&str> = found.iter().flat_map(|m| m.parts.iter().map(|p| p.name.as_str())).collect();
    if let Some(file) = foreign_file(out, name, parts, &old, found.is_none()).await? {
        return Err(refuse(format!(
            "it holds `{file}`, which this pack does not write; move it away, or use an empty or new directory"
        )));
    }
    Ok(match found {
        Some(m) if same_job(&m) => {
            let mut kept = kept_parts(out, m).await?;
            kept.source_version = want.source_version;
            kept
        }
        Some(m) => {
            remove_parts(out, &m).await?;
            want
        }
        // No manifest: nothing of a token pack but an interrupted first part.
        None => want,
    })
}

/// xxh64 of `bytes`, hex, as the manifest keeps it.
pub(super) fn xxh64(bytes: &[u8]) -> String {
    format!("{:016x}", twox_hash::XxHash64::oneshot(0, bytes))
}

/// The number of the part `file` (a `.bin` or `.idx` named `{name}-NNNNN`) is, if it is one.
fn part_of(file: &str, name: &str) -> Option<u64> {
    let stem = file.strip_suffix(".bin").or_else(|| file.strip_suffix(crate::source::tokens::IDX_SUFFIX))?;
    let digits = stem.strip_prefix(name)?.strip_prefix('-')?;
    (digits.len() >= 5 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

/// A file in `out` that a run writing `parts` parts named `name` does not write, nor the
/// manifest's earlier job (its parts `old`, which `--force` replaces): with a manifest, one
/// that the dataset's reader would take (another pair, a part past the last; a README or
/// Megatron's `.npy` index caches beside the pairs are left be); without one (a first run),
/// any (a directory of someone else's). Hidden files (the manifest, temporary files) aside.
async fn foreign_file(out: &Store, name: &str, parts: u64, old: &[&str], strict: bool) -> Result<Option<String>> {
    use crate::uri::Layout;
    let own = |e: &str| {
        let stem = e.strip_suffix(".bin").or_else(|| e.strip_suffix(crate::source::tokens::IDX_SUFFIX));
        part_of(e, name).is_some_and(|p| p < parts) || stem.is_some_and(|s| old.contains(&s))
    };
    let read =
        |e: &str| strict || (Layout::Tokens.holds(e) && !e.ends_with(".npy")) || crate::source::tokens::flat_npy(e);
    Ok(out.entries().await?.into_iter().find(|e| !e.starts_with('.') && !own(e) && read(e)))
}

/// Remove the parts `m` names and the manifest (`force` over another job's directory).
async fn remove_parts(out: &Store, m: &TokenizedManifest) -> Result<()> {
    for p in &m.parts {
        out.delete(&format!("{}.bin", p.name)).await?;
        out.delete(&format!("{}{}", p.name, crate::source::tokens::IDX_SUFFIX)).await?;
    }
    out.delete(MANIFEST).await
}

/// Write the manifest, whole or not at all (synced, renamed, the directory synced: it never
/// names a part a crash could lose).
pub(super) async fn write_manifest(out: &Store, m: &TokenizedManifest) -> Result<()> {
    let json = serde_json::to_vec_pretty(m).map_err(|e| Error::internal(e.to_string()))?;
    out.put_whole(MANIFEST, json.into()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_keeps_the_first_reasons_cut_short_and_counts_every_bad_document() {
        let mut s = Skipped::default();
        // A two-byte character across the cut (one byte of ASCII first): it falls on a
        // character boundary, not in the middle of one.
        let long = format!("a{}", "é".repeat(REASON_BYTES));
        for d in 0..(LISTED_SKIPS as u64 + 50) {
            s.note(d, if d == 0 { long.clone() } else { format!("bad {d}") });
        }
        assert_eq!((s.count, s.listed.len()), (LISTED_SKIPS as u64 + 50, LISTED_SKIPS));
        assert!(s.listed[0].1.len() <= REASON_BYTES + 3 && s.listed[0].1.ends_with("..."), "{}", s.listed[0].1.len());
        assert_eq!(s.listed[1], (1, "bad 1".to_string()));
        let part = |skipped: Vec<(u64, String)>, skipped_count| Part {
            name: "p".into(),
            documents: 200,
            skipped,
            skipped_count,
            tokens: 0,
            bin_bytes: 0,
            bin_xxh64: String::new(),
            idx_xxh64: None,
        };
        assert_eq!(part(s.listed, s.count).skipped_documents(), 150);
        // A manifest from before the count: its list is the count.
        let old: Part = serde_json::from_str(
            r#"{"name":"p","documents":3,"skipped":[[1,"x"],[2,"y"]],"tokens":0,"bin_bytes":0,"bin_xxh64":""}"#,
        )
        .unwrap();
        assert_eq!(old.skipped_documents(), 2);
        // A part with nothing skipped writes neither field.
        let json = serde_json::to_string(&part(Vec::new(), 0)).unwrap();
        assert!(!json.contains("skipped"), "{json}");
    }
}
