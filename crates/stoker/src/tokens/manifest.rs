//! The manifest of a pre-tokenized directory (what made it, its finished parts) and the checks
//! that tell a rerun which parts to keep.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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

/// The manifest's parts whose files are whole (size and checksum); the first that is not ends
/// the list (it and those after it are written again).
pub(super) fn kept_parts(dest: &Path, mut m: TokenizedManifest) -> TokenizedManifest {
    let whole = m
        .parts
        .iter()
        .take_while(|p| {
            holds(&dest.join(format!("{}.bin", p.name)), p.bin_bytes, &p.bin_xxh64)
                && dest.join(format!("{}.idx", p.name)).exists()
        })
        .count();
    m.parts.truncate(whole);
    m
}

/// Whether `path` is a file of `len` bytes whose xxh64 is `xxh64` (hex), read a MiB at a time:
/// a part is gigabytes (a million documents by default), and a rerun checks every kept one.
/// A file of another size is not read at all.
fn holds(path: &Path, len: u64, xxh64: &str) -> bool {
    use std::hash::Hasher;
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    if f.metadata().map(|m| m.len()).ok() != Some(len) {
        return false;
    }
    let (mut hasher, mut buf, mut seen) = (twox_hash::XxHash64::with_seed(0), vec![0u8; 1 << 20], 0u64);
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.write(&buf[..n]);
                seen += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
        // Grown since its size was read: not the part the manifest recorded.
        if seen > len {
            return false;
        }
    }
    seen == len && format!("{:016x}", hasher.finish()) == xxh64
}

pub(super) fn write_manifest(dest: &Path, m: &TokenizedManifest) -> Result<()> {
    let json = serde_json::to_vec_pretty(m).map_err(|e| Error::internal(e.to_string()))?;
    write_atomic(&dest.join(MANIFEST), &json)
}

pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp: PathBuf = path.with_extension("tmp");
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(|e| Error::io(tmp.display(), e))
        // Renamed and the directory synced: the manifest never names a part a crash could lose.
        .and_then(|()| crate::store::publish(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
