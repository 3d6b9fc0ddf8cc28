//! Per-shard tar indexes: built by walking headers only, kept as a JSON sidecar.
//!
//! An index lists each sample's key and, per field, the payload's byte range in the shard, so
//! `get(i)` reads exactly that sample's bytes. The sidecar records the shard's size, mtime and
//! version tag; when any of them changes the index is stale and is rebuilt.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sample::{is_webdataset_meta, split_key};
use crate::store::{ObjectInfo, Store};
use crate::uri::SourceOptions;

/// Suffix of sidecar index files written next to shards.
pub(crate) const SIDECAR_SUFFIX: &str = ".stoker-idx.json";
const FORMAT: &str = "stoker-tar-index";
const VERSION: u32 = 1;
/// Header walks read this much at a time: one page, so payloads between headers are skipped.
const HEADER_BLOCK: usize = 4096;
const REMOTE_HEADER_BLOCK: usize = 1 << 20;

/// The index of one shard, as stored in its sidecar.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ShardIndex {
    format: String,
    version: u32,
    /// Shard path relative to the store root.
    pub shard: String,
    pub size: u64,
    pub modified_us: i64,
    pub e_tag: Option<String>,
    /// Field names; `fields` refers to them by position.
    pub names: Vec<String>,
    /// One key per sample.
    pub keys: Vec<String>,
    /// Sample `i` owns `fields[starts[i]..starts[i + 1]]`.
    pub starts: Vec<u32>,
    /// `(name id, payload offset, payload length)` per field.
    pub fields: Vec<(u32, u64, u64)>,
    /// Per field, a digest of the tar header in front of its payload (see [`check_header`]);
    /// empty in indexes written before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<u32>,
}

impl ShardIndex {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn sample_fields(&self, i: usize) -> &[(u32, u64, u64)] {
        &self.fields[self.starts[i] as usize..self.starts[i + 1] as usize]
    }

    /// The byte span covering all of sample `i`'s payloads and the header in front of each,
    /// so a read can check that the shard still holds what was indexed.
    pub fn span(&self, i: usize) -> Range<u64> {
        let f = self.sample_fields(i);
        let start = f.iter().map(|x| x.1).min().unwrap_or(HEADER);
        let end = f.iter().map(|x| x.1 + x.2).max().unwrap_or(start);
        start - HEADER..end
    }

    /// Check the header in front of field `field` (a global field number) of sample `key`:
    /// `header` is the 512 bytes before its payload. A shard rewritten after it was indexed,
    /// even at the same size and modification time, fails here rather than yield other bytes.
    pub fn check_header(&self, field: usize, key: &str, header: &[u8]) -> std::result::Result<(), String> {
        let (name, _, len) = self.fields[field];
        let ext = &self.names[name as usize];
        let ok = match self.headers.get(field) {
            Some(&digest) => header.len() == HEADER as usize && header_digest(header) == digest,
            // Older indexes: at least a valid header announcing a file of this size.
            None => {
                header.len() == HEADER as usize && {
                    let h = tar::Header::from_byte_slice(header);
                    h.cksum().ok() == Some(header_checksum(header))
                        && h.entry_size().ok() == Some(len)
                        && (h.entry_type().is_file() || h.entry_type().is_contiguous())
                }
            }
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "the tar header in front of sample `{key}` field `{ext}` is not the one indexed: the shard was \
                 rewritten after it was indexed, keeping its size and time stamp; delete its index \
                 `{}{SIDECAR_SUFFIX}` (next to it or in the index_dir) and reopen, or run `stoker index` again \
                 if the dataset has a manifest",
                self.shard.rsplit('/').next().unwrap_or(&self.shard)
            ))
        }
    }

    pub(crate) fn matches(&self, info: &ObjectInfo) -> bool {
        self.format == FORMAT
            && self.version == VERSION
            && self.size == info.size
            && self.modified_us == info.modified_us
            && self.e_tag == info.e_tag
    }

    /// Check the internal consistency of a loaded index (a sidecar may be damaged or edited).
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.format != FORMAT || self.version != VERSION {
            return Err(format!("format {} v{} is not {FORMAT} v{VERSION}", self.format, self.version));
        }
        self.validate()
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.starts.len() != self.keys.len() + 1 || self.starts.first() != Some(&0) {
            return Err("sample table is inconsistent".into());
        }
        if self.starts.windows(2).any(|w| w[0] >= w[1])
            || *self.starts.last().unwrap_or(&0) as usize != self.fields.len()
        {
            return Err("field table is inconsistent".into());
        }
        if !self.headers.is_empty() && self.headers.len() != self.fields.len() {
            return Err("header table is inconsistent".into());
        }
        // Members follow each other in the archive, each behind its own header.
        let mut next_free = 0u64;
        for &(name, off, len) in &self.fields {
            if off < next_free.saturating_add(HEADER) {
                return Err(format!("field at {off} overlaps the field or header before it"));
            }
            next_free = off.saturating_add(len);
            if name as usize >= self.names.len() {
                return Err(format!("field name id {name} out of range"));
            }
            if off.checked_add(len).is_none_or(|end| end > self.size) {
                return Err(format!("field at {off}+{len} runs past the shard end {}", self.size));
            }
        }
        Ok(())
    }
}

/// Where the sidecar of `shard` lives next to it, in the store.
pub(crate) fn sidecar_path(shard: &str) -> String {
    format!("{shard}{SIDECAR_SUFFIX}")
}

/// Where the index of `shard` goes when it cannot live next to the shard: a local cache
/// directory, named by a hash of the shard's full location so equal basenames never collide.
fn cache_path(store: &Store, shard: &str) -> String {
    let full = store.describe(shard);
    let base = shard.rsplit('/').next().unwrap_or(shard);
    format!("{:016x}-{base}{SIDECAR_SUFFIX}", fnv1a(full.as_bytes()))
}

/// The size of a tar header block.
pub(crate) const HEADER: u64 = 512;

/// What an index records of a member's header: a 32-bit digest of its 512 bytes. Checked on
/// every read, so it goes a word at a time (FNV-style multiply, rotated so high bits reach
/// the low ones); it guards against changed files, not adversaries.
fn header_digest(header: &[u8]) -> u32 {
    let h = header.chunks(8).fold(0xcbf29ce484222325u64, |h, w| {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        (h ^ u64::from_le_bytes(word)).wrapping_mul(0x100000001b3).rotate_left(23)
    });
    (h ^ (h >> 32)) as u32
}

/// The tar checksum of a header: its bytes summed with the checksum field read as spaces.
fn header_checksum(header: &[u8]) -> u32 {
    header.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { b as u32 }).sum()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Load a fresh index for `info` from its sidecar or the cache dir, or build and save one.
pub(crate) async fn load_or_build(store: &Store, info: &ObjectInfo, opts: &SourceOptions) -> Result<ShardIndex> {
    let cache_dir = opts.index_cache_dir();
    let sidecar = sidecar_path(&info.path);
    let cached = cache_path(store, &info.path);
    if let Some(idx) = load_if_fresh(store, &sidecar, info).await {
        return Ok(idx);
    }
    let cache_store = if cache_dir.is_dir() { Store::local(&cache_dir).ok() } else { None };
    if let Some(cs) = &cache_store {
        if let Some(idx) = load_if_fresh(cs, &cached, info).await {
            return Ok(idx);
        }
    }
    let (s, i) = (store.clone(), info.clone());
    let idx = tokio::task::spawn_blocking(move || build(&s, &i)).await.map_err(Error::task)??;
    let json = Bytes::from(serde_json::to_vec(&idx).map_err(|e| Error::Task(e.to_string()))?);
    // An index is an optimisation: failing to save it must not fail the open.
    let saved_next_to_shard = opts.write_sidecar.unwrap_or(true) && store.put(&sidecar, json.clone()).await.is_ok();
    if !saved_next_to_shard && std::fs::create_dir_all(&cache_dir).is_ok() {
        if let Ok(cs) = Store::local(&cache_dir) {
            let _ = cs.put(&cached, json).await;
        }
    }
    Ok(idx)
}

async fn load_if_fresh(store: &Store, path: &str, info: &ObjectInfo) -> Option<ShardIndex> {
    let bytes = store.get(path).await.ok()?;
    let idx: ShardIndex = serde_json::from_slice(&bytes).ok()?;
    // A stale or damaged sidecar is rebuilt, never trusted.
    // One without header digests predates them: rebuilding it costs one header walk.
    (idx.shard == info.path
        && idx.matches(info)
        && (idx.fields.is_empty() || !idx.headers.is_empty())
        && idx.validate().is_ok())
    .then_some(idx)
}

/// Walk the headers of one shard (blocking) and group members into samples as webdataset does.
pub(crate) fn build(store: &Store, info: &ObjectInfo) -> Result<ShardIndex> {
    // Remote header walks read bigger blocks: a request costs a round trip, bytes are cheap.
    let block = if store.is_remote() { REMOTE_HEADER_BLOCK } else { HEADER_BLOCK };
    let reader = store.blocking_reader(&info.path, info.size, block)?;
    build_from(reader, info, &store.describe(&info.path))
}

/// [`build`] over any reader of the shard's `info.size` bytes; `shard` names it in errors.
pub(crate) fn build_from<R: io::Read + io::Seek>(reader: R, info: &ObjectInfo, shard: &str) -> Result<ShardIndex> {
    let corrupt = |offset: u64, reason: String| Error::CorruptTar { shard: shard.to_string(), offset, reason };
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries_with_seek().map_err(|e| corrupt(0, e.to_string()))?;

    let mut idx = ShardIndex {
        format: FORMAT.into(),
        version: VERSION,
        shard: info.path.clone(),
        size: info.size,
        modified_us: info.modified_us,
        e_tag: info.e_tag.clone(),
        names: Vec::new(),
        keys: Vec::new(),
        starts: vec![0],
        fields: Vec::new(),
        headers: Vec::new(),
    };
    let mut name_ids: HashMap<String, u32> = HashMap::new();
    // Where the next header should start: the error offset when a header fails to parse.
    let mut next_header = 0u64;
    let mut open_key: Option<String> = None;
    for entry in entries {
        let entry = entry.map_err(|e| corrupt(next_header, describe_tar_error(&e)))?;
        let data_pos = entry.raw_file_position();
        let size = entry.size();
        let end = data_pos
            .checked_add(size)
            .ok_or_else(|| corrupt(entry.raw_header_position(), "member size overflows".into()))?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if end > info.size {
            return Err(corrupt(
                entry.raw_header_position(),
                format!(
                    "member `{name}` claims {size} bytes at offset {data_pos}, past the end of the shard ({} bytes): \
                     the shard is truncated; re-copy or re-pack it",
                    info.size
                ),
            ));
        }
        next_header = end.div_ceil(512) * 512;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) || is_webdataset_meta(&name) {
            continue;
        }
        let Some((key, ext)) = split_key(&name) else { continue };
        let ext = ext.to_ascii_lowercase();
        if open_key.as_deref() != Some(key) {
            if open_key.is_some() {
                idx.starts.push(idx.fields.len() as u32);
            }
            idx.keys.push(key.to_string());
            open_key = Some(key.to_string());
        }
        let next_id = name_ids.len() as u32;
        let id = *name_ids.entry(ext.clone()).or_insert_with(|| {
            idx.names.push(ext.clone());
            next_id
        });
        let sample_start = *idx.starts.last().unwrap_or(&0) as usize;
        if idx.fields[sample_start..].iter().any(|f| f.0 == id) {
            return Err(corrupt(
                entry.raw_header_position(),
                format!("member `{name}`: sample `{key}` already has a `{ext}` field (webdataset rejects duplicate file names too)"),
            ));
        }
        if data_pos != entry.raw_header_position() + HEADER {
            return Err(corrupt(
                entry.raw_header_position(),
                format!("member `{name}`: its payload does not follow its header"),
            ));
        }
        idx.fields.push((id, data_pos, size));
        idx.headers.push(header_digest(entry.header().as_bytes()));
    }
    if open_key.is_some() {
        idx.starts.push(idx.fields.len() as u32);
    }
    // The tar crate stops quietly at end of file; a shard cut exactly at a member boundary
    // would look complete. Writers (tar, Python's tarfile, webdataset) always end with zero
    // blocks, so their absence means truncation.
    if next_header + 512 > info.size {
        return Err(corrupt(
            next_header,
            "the shard ends without the end-of-archive marker (zero blocks): it was probably truncated; \
             re-copy or re-pack it"
                .into(),
        ));
    }
    Ok(idx)
}

fn describe_tar_error(e: &io::Error) -> String {
    // The tar crate quotes raw header bytes in some messages; garbage must not reach a
    // terminal, so keep printable ASCII and cut it short.
    let msg: String = e.to_string().chars().filter(|c| c.is_ascii_graphic() || *c == ' ').take(80).collect();
    let advice = "not a tar file, or a damaged header; re-pack the shard or leave it out";
    if msg.contains("entire block") {
        "the shard ends in the middle of a header: it is truncated; re-copy or re-pack it".into()
    } else if msg.contains("checksum mismatch") {
        format!("header checksum mismatch: {advice}")
    } else {
        format!("cannot parse the header ({msg}): {advice}")
    }
}

/// Resolve an index's name ids into shared names, interning across shards.
pub(crate) fn intern_names(idx: &ShardIndex, pool: &mut HashMap<String, Arc<str>>) -> Vec<Arc<str>> {
    idx.names.iter().map(|n| pool.entry(n.clone()).or_insert_with(|| Arc::from(n.as_str())).clone()).collect()
}
