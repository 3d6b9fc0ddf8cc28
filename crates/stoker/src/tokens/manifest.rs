//! The manifest of a pre-tokenized directory (what made it, its finished parts) and the checks
//! that tell a rerun which parts to keep.

use std::path::Path;

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
    /// Documents (numbered as in the source) written empty under `skip_errors`, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<(u64, String)>,
    /// Tokens in it.
    pub tokens: u64,
    /// Size of its `.bin`.
    pub bin_bytes: u64,
    /// xxh64 of its `.bin`, hex.
    pub bin_xxh64: String,
}

pub(super) fn read_manifest(dest: &Path) -> Result<Option<TokenizedManifest>> {
    let path = dest.join(MANIFEST);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| Error::BadIndex {
            path: path.display().to_string(),
            reason: format!("not a token manifest ({e}); remove the directory and run again"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path.display(), e)),
    }
}

/// The manifest's parts whose files are whole (size, then checksum, read through `out` a MiB
/// at a time: a part is gigabytes, a million documents by default); the first that is not
/// ends the list (it and those after it are written again). A part of another size is not
/// read.
pub(super) async fn kept_parts(out: &Store, mut m: TokenizedManifest) -> Result<TokenizedManifest> {
    let mut whole = 0;
    for p in &m.parts {
        let (bin, idx) = (out.head(&format!("{}.bin", p.name)).await, out.head(&format!("{}.idx", p.name)).await);
        let Some(bin) = bin.ok().filter(|b| b.size == p.bin_bytes && idx.is_ok()) else { break };
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
        whole += 1;
    }
    m.parts.truncate(whole);
    Ok(m)
}

/// Write the manifest, whole or not at all (synced, renamed, the directory synced: it never
/// names a part a crash could lose).
pub(super) async fn write_manifest(out: &Store, m: &TokenizedManifest) -> Result<()> {
    let json = serde_json::to_vec_pretty(m).map_err(|e| Error::internal(e.to_string()))?;
    out.put_whole(MANIFEST, json.into()).await
}
