//! Per-shard tar indexes: built by walking headers only, kept as a JSON sidecar.
//!
//! An index lists each sample's key and, per field, the payload's byte range in the shard, so
//! `get(i)` reads exactly that sample's bytes. The sidecar records the shard's size, mtime and
//! version tag; when any of them changes the index is stale and is rebuilt.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::stats::Damage;
use crate::store::{Cancel, ObjectInfo, Store};
use crate::uri::SourceOptions;

mod walk;

// The fuzz targets drive the walk and its resync directly.
#[cfg(feature = "fuzzing")]
pub(crate) use walk::{build_from, plausible_header, resync};
pub(crate) use walk::{build_with, Walk};

/// Suffix of sidecar index files written next to shards.
pub(crate) const SIDECAR_SUFFIX: &str = ".stoker-idx.json";
const FORMAT: &str = "stoker-tar-index";
const VERSION: u32 = 1;

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
    /// Per field, the digest of its payload (`stoker pack`, `stoker index --checksums`) of
    /// kind `digest`; empty when not recorded, and then reads cannot tell damaged payload
    /// bytes. Indexes from before XXH3 hold CRC32Cs under the key `crcs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty", alias = "crcs")]
    pub sums: Vec<u64>,
    /// What `sums` holds; indexes without the key are the older CRC32C ones.
    #[serde(default)]
    pub digest: PayloadDigest,
    /// Damage the walk stepped over (only under `on_damage=skip`): the samples listed are
    /// what survived it. Opening without the skip policy fails on an index holding any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub damage: Vec<Damage>,
}

/// The digest recorded per tar member's payload.
///
/// XXH3-64 for everything written now: at 64 KiB samples a hardware CRC32C (~13 GB/s on one
/// core here) cost 10-20% of a Loader reading from the page cache, XXH3 (~34 GB/s, AVX2
/// chosen at run time) well under half that. Both catch any random damage but with
/// probability 2^-32 (CRC32C) or 2^-64 (XXH3-64) of missing it; CRC32C also catches every
/// burst of up to 32 bits for certain. Older indexes keep their CRC32Cs and are checked with
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PayloadDigest {
    /// CRC32C (Castagnoli), what indexes recorded before XXH3.
    #[default]
    Crc32c,
    /// XXH3, 64 bits, seed 0.
    Xxh3,
}

impl PayloadDigest {
    /// The digest of `data`.
    pub(crate) fn of(self, data: &[u8]) -> u64 {
        match self {
            PayloadDigest::Crc32c => crc32c::crc32c(data) as u64,
            PayloadDigest::Xxh3 => twox_hash::XxHash3_64::oneshot(data),
        }
    }

    /// How errors name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PayloadDigest::Crc32c => "CRC32C",
            PayloadDigest::Xxh3 => "XXH3-64",
        }
    }

    fn hex_width(self) -> usize {
        match self {
            PayloadDigest::Crc32c => 8,
            PayloadDigest::Xxh3 => 16,
        }
    }

    /// A digest fed piece by piece (indexing reads members in parts).
    pub(crate) fn hasher(self) -> DigestHasher {
        match self {
            PayloadDigest::Crc32c => DigestHasher::Crc32c(0),
            PayloadDigest::Xxh3 => DigestHasher::Xxh3(Box::default()),
        }
    }
}

/// [`PayloadDigest::hasher`]'s state.
pub(crate) enum DigestHasher {
    Crc32c(u32),
    Xxh3(Box<twox_hash::XxHash3_64>),
}

impl DigestHasher {
    pub(crate) fn update(&mut self, data: &[u8]) {
        match self {
            DigestHasher::Crc32c(c) => *c = crc32c::crc32c_append(*c, data),
            DigestHasher::Xxh3(h) => std::hash::Hasher::write(&mut **h, data),
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        match self {
            DigestHasher::Crc32c(c) => *c as u64,
            DigestHasher::Xxh3(h) => std::hash::Hasher::finish(&**h),
        }
    }
}

impl ShardIndex {
    /// An index of `info` with no samples yet.
    pub(crate) fn empty(info: &ObjectInfo) -> Self {
        ShardIndex {
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
            sums: Vec::new(),
            digest: PayloadDigest::Xxh3,
            damage: Vec::new(),
        }
    }

    /// The index of a shard that could not be read at all, skipped whole under
    /// `on_damage=skip`: no samples, and one damage entry saying why (`error`, whose cause
    /// it counts under: a remote failure is not damage) and that the count is unknown.
    pub(crate) fn unreadable(info: &ObjectInfo, error: &Error) -> Self {
        let (cause, reason) = (error.skip_cause(), error.to_string());
        let damage = Damage {
            shard: info.path.clone(),
            cause,
            start: 0,
            end: info.size,
            key_before: None,
            key_after: None,
            dropped: Vec::new(),
            samples_lost: None,
            reason,
        };
        ShardIndex { damage: vec![damage], ..Self::empty(info) }
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn sample_fields(&self, i: usize) -> &[(u32, u64, u64)] {
        &self.fields[self.starts[i] as usize..self.starts[i + 1] as usize]
    }

    /// The byte span covering all of sample `i`'s payloads and the header in front of each,
    /// so a read can check that the shard still holds what was indexed.
    pub(crate) fn span(&self, i: usize) -> Range<u64> {
        let f = self.sample_fields(i);
        let start = f.iter().map(|x| x.1).min().unwrap_or(HEADER);
        let end = f.iter().map(|x| x.1 + x.2).max().unwrap_or(start);
        start - HEADER..end
    }

    /// Check the header in front of field `field` (a global field number) of sample `key`:
    /// `header` is the 512 bytes before its payload. A shard rewritten after it was indexed,
    /// even at the same size and modification time, fails here rather than yield other bytes.
    pub(crate) fn check_header(&self, field: usize, key: &str, header: &[u8]) -> std::result::Result<(), String> {
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
                 rewritten or damaged after it was indexed, keeping its size and time stamp; rewritten on purpose, \
                 delete its index `{}{SIDECAR_SUFFIX}` (next to it or in the index_dir) and reopen, or run \
                 `stoker index` again if the dataset has a manifest; damaged (indexing it again fails), restore \
                 it from a copy, or delete it and rerun the `stoker pack` that wrote it",
                self.shard.rsplit('/').next().unwrap_or(&self.shard)
            ))
        }
    }

    /// Check the payload of field `field` (a global field number) against its recorded
    /// digest, if there is one: `Err` says what differs. Runs right after the bytes land in
    /// the batch, while they are still in the CPU cache.
    pub(crate) fn check_sum(&self, field: usize, data: &[u8]) -> std::result::Result<(), String> {
        let Some(&want) = self.sums.get(field) else { return Ok(()) };
        let got = self.digest.of(data);
        if got == want {
            return Ok(());
        }
        let (name, width) = (self.digest.name(), self.digest.hex_width());
        Err(format!(
            "{name} {got:0width$x} of its {} bytes is not the {want:0width$x} recorded when the shard was written: \
             the bytes were damaged since; restore the shard from a good copy or re-pack it",
            data.len()
        ))
    }

    /// Take the checksums of `old`, an index of this shard from before it changed, when every
    /// member is where it was behind the same header: the shard was modified in place
    /// without moving a member, which is exactly when payload damage must still show
    /// (bit rot, a partial overwrite). Anything else that changed the shard is a rewrite, and
    /// its checksums describe other bytes.
    pub(crate) fn keep_checksums_of(&mut self, old: &ShardIndex) {
        let same = self.sums.is_empty()
            && !old.sums.is_empty()
            && old.keys == self.keys
            && old.starts == self.starts
            && old.fields == self.fields
            && old.headers == self.headers;
        if same {
            self.sums = old.sums.clone();
            self.digest = old.digest;
        }
    }

    /// The error for the first damage recorded, for opening without the skip policy.
    pub(crate) fn damage_error(&self, shown: &str) -> Option<Error> {
        self.damage.first().map(|d| Error::CorruptTar {
            shard: shown.to_string(),
            offset: d.start,
            reason: format!(
                "{}; open with on_damage=skip (Python: skip_errors=True) to keep the samples around it",
                d.reason
            ),
        })
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
        if !self.sums.is_empty() && self.sums.len() != self.fields.len() {
            return Err("checksum table is inconsistent".into());
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
pub(crate) fn header_digest(header: &[u8]) -> u32 {
    let h = header.chunks(8).fold(0xcbf29ce484222325u64, |h, w| {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        (h ^ u64::from_le_bytes(word)).wrapping_mul(0x100000001b3).rotate_left(23)
    });
    (h ^ (h >> 32)) as u32
}

/// The tar checksum of a header: its bytes summed with the checksum field read as spaces.
pub(crate) fn header_checksum(header: &[u8]) -> u32 {
    header.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { b as u32 }).sum()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Load a fresh index for `info` from its sidecar or the cache dir, or build and save one.
/// `previous` is an index of this shard known to be stale (from a manifest).
pub(crate) async fn load_or_build(
    store: &Store,
    info: &ObjectInfo,
    opts: &SourceOptions,
    previous: Option<ShardIndex>,
    cancel: &Cancel,
) -> Result<ShardIndex> {
    let cache_dir = opts.index_cache_dir();
    let want_crcs = opts.checksums == Some(true);
    let usable = |idx: &ShardIndex| !want_crcs || idx.fields.is_empty() || !idx.sums.is_empty();
    let mut stale = previous;
    let side = load_checked(store, &sidecar_path(&info.path), info).await;
    let cache_store = if cache_dir.is_dir() { Store::local(&cache_dir).ok() } else { None };
    let cached = match &cache_store {
        Some(cs) => load_checked(cs, &cache_path(store, &info.path), info).await,
        None => None,
    };
    for idx in [side, cached].into_iter().flatten() {
        if idx.matches(info) && usable(&idx) {
            return Ok(idx);
        }
        stale = stale.or(Some(idx));
    }
    let (s, i) = (store.clone(), info.clone());
    let walk = Walk { skip: opts.skip_damage(), checksums: want_crcs };
    let cancel = cancel.clone();
    let mut idx = tokio::task::spawn_blocking(move || build(&s, &i, walk, cancel)).await.map_err(Error::task)??;
    // A damaged shard is walked again on every open: what looked like damage may have been a
    // passing read failure, which a saved index would make permanent.
    if !idx.damage.is_empty() {
        return Ok(idx);
    }
    if let Some(old) = stale {
        idx.keep_checksums_of(&old);
    }
    save(store, &idx, opts).await;
    Ok(idx)
}

/// Save `idx` as a sidecar next to its shard, else in the index cache dir. An index is an
/// optimisation: failing to save it must not fail the open.
pub(crate) async fn save(store: &Store, idx: &ShardIndex, opts: &SourceOptions) {
    let cache_dir = opts.index_cache_dir();
    let (sidecar, cached) = (sidecar_path(&idx.shard), cache_path(store, &idx.shard));
    let Ok(json) = serde_json::to_vec(idx) else { return };
    let json = Bytes::from(json);
    let saved_next_to_shard = opts.write_sidecar.unwrap_or(true) && store.put(&sidecar, json.clone()).await.is_ok();
    if !saved_next_to_shard && std::fs::create_dir_all(&cache_dir).is_ok() {
        if let Ok(cs) = Store::local(&cache_dir) {
            let _ = cs.put(&cached, json).await;
        }
    }
}

/// The index of shard `info` for opening it: `known` (from a manifest) when it still matches,
/// else loaded or built. Under `on_damage=skip` a shard that cannot be read at all gets an
/// empty index recording why; without it, an index holding damage is an error.
pub(crate) async fn for_open(
    store: &Store,
    info: &ObjectInfo,
    opts: &SourceOptions,
    known: Option<ShardIndex>,
    cancel: &Cancel,
) -> Result<ShardIndex> {
    let got = match known {
        Some(idx) if idx.matches(info) => Ok(idx),
        stale => load_or_build(store, info, opts, stale, cancel).await,
    };
    match got {
        Ok(idx) if !opts.skip_damage() => match idx.damage_error(&store.describe(&idx.shard)) {
            Some(e) => Err(e),
            None => Ok(idx),
        },
        Ok(idx) => Ok(idx),
        Err(e) if opts.skip_damage() => Ok(ShardIndex::unreadable(info, &e)),
        Err(e) => Err(e),
    }
}

/// The sidecar at `path` if it parses and is consistent, fresh or not: a damaged sidecar is
/// rebuilt, never trusted, and a stale one only lends its checksums (see
/// [`ShardIndex::keep_checksums_of`]). One without header digests predates them: rebuilding
/// it costs one header walk.
async fn load_checked(store: &Store, path: &str, info: &ObjectInfo) -> Option<ShardIndex> {
    // Every field costs the shard a 512-byte header, and its sidecar entry less than twice
    // that even with a name escaped to six bytes a character: a sidecar larger than this is
    // not one, and is rebuilt unread.
    let most = info.size.saturating_mul(2).saturating_add(1 << 20);
    let bytes = store.get_at_most(path, most).await.ok()?;
    let idx: ShardIndex = serde_json::from_slice(&bytes).ok()?;
    (idx.shard == info.path && (idx.fields.is_empty() || !idx.headers.is_empty()) && idx.validate().is_ok())
        .then_some(idx)
}

/// Walk the headers of one shard (blocking) and group members into samples as webdataset
/// does. A read the store failed (a remote failure after its retries) is that failure, not
/// damage: the walk would take it for a bad header.
pub(crate) fn build(store: &Store, info: &ObjectInfo, walk: Walk, cancel: Cancel) -> Result<ShardIndex> {
    let mut reader = store.blocking_reader(&store.object(info), walk.checksums, cancel.clone())?;
    let walked = build_with(&mut reader, info, &store.describe(&info.path), walk);
    match reader.failure() {
        Some(e) => Err(e),
        // What a walk told to stop made of its last read is not the shard's state.
        None if cancel.is_set() => Err(Error::internal(format!("the walk of {} was given up", info.path))),
        None => walked,
    }
}

/// Run `walk(i, cancel)` for `i` in `0..count`, `limit` at once, and return their indexes in
/// order. On the first error the others are told to stop at their next read, and every walk
/// has ended before that error is returned: a walk left running on a blocking thread would
/// go on retrying, and sleep on a runtime that may be shutting down. Dropping this future
/// tells them to stop as well.
pub(crate) async fn walk_all<T, F, Fut>(count: usize, limit: usize, walk: F) -> Result<Vec<T>>
where
    F: Fn(usize, Cancel) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    use futures::StreamExt;
    let cancel = Cancel::default();
    let _stop_when_dropped = cancel.on_drop();
    let walks = (0..count).map(|i| {
        let w = walk(i, cancel.clone());
        async move { (i, w.await) }
    });
    let mut done = futures::stream::iter(walks).buffer_unordered(limit.max(1));
    let mut out: Vec<Option<T>> = (0..count).map(|_| None).collect();
    let mut first_error = None;
    while let Some((i, r)) = done.next().await {
        match r {
            Ok(idx) => out[i] = Some(idx),
            Err(e) if first_error.is_none() => {
                cancel.cancel();
                first_error = Some(e);
            }
            Err(_) => {}
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out.into_iter().flatten().collect()),
    }
}

/// Resolve an index's name ids into shared names, interning across shards.
pub(crate) fn intern_names(idx: &ShardIndex, pool: &mut HashMap<String, Arc<str>>) -> Vec<Arc<str>> {
    idx.names.iter().map(|n| pool.entry(n.clone()).or_insert_with(|| Arc::from(n.as_str())).clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(payloads: &[&[u8]], digest: PayloadDigest) -> ShardIndex {
        let info = ObjectInfo { path: "a.tar".into(), size: 1 << 20, modified_us: 0, e_tag: None, recorded: false };
        let mut idx = ShardIndex::empty(&info);
        idx.names = vec!["bin".into()];
        for (i, p) in payloads.iter().enumerate() {
            idx.keys.push(format!("{i:04}"));
            idx.fields.push((0, 512 + i as u64 * 4096, p.len() as u64));
            idx.starts.push(idx.fields.len() as u32);
            idx.sums.push(digest.of(p));
        }
        idx.digest = digest;
        idx
    }

    #[test]
    fn new_indexes_record_xxh3_and_catch_a_flipped_bit() {
        let (a, mut b) = (b"first payload".to_vec(), vec![7u8; 3000]);
        let idx = index_of(&[&a, &b], PayloadDigest::Xxh3);
        let json: serde_json::Value = serde_json::to_value(&idx).unwrap();
        assert_eq!(json["digest"], "xxh3");
        assert_eq!(json["sums"][1].as_u64(), Some(twox_hash::XxHash3_64::oneshot(&b)));
        assert!(idx.check_sum(0, &a).is_ok() && idx.check_sum(1, &b).is_ok());
        b[1234] ^= 0x10;
        let e = idx.check_sum(1, &b).unwrap_err();
        assert!(e.contains("XXH3-64") && e.contains("3000 bytes"), "{e}");
    }

    #[test]
    fn indexes_written_before_xxh3_are_checked_with_their_crc32cs() {
        let payload = vec![3u8; 777];
        let idx = index_of(&[&payload], PayloadDigest::Crc32c);
        // How those indexes were stored: `crcs` of u32 and no `digest` key.
        let mut json: serde_json::Value = serde_json::to_value(&idx).unwrap();
        let obj = json.as_object_mut().unwrap();
        obj.remove("digest");
        let sums = obj.remove("sums").unwrap();
        obj.insert("crcs".into(), sums);
        let old: ShardIndex = serde_json::from_value(json).unwrap();
        assert_eq!(old.digest, PayloadDigest::Crc32c);
        assert_eq!(old.sums, vec![crc32c::crc32c(&payload) as u64]);
        assert!(old.check_sum(0, &payload).is_ok());
        let mut bad = payload.clone();
        bad[0] ^= 1;
        assert!(old.check_sum(0, &bad).unwrap_err().contains("CRC32C"));
    }

    #[test]
    fn streamed_digests_equal_one_shot_ones() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for kind in [PayloadDigest::Crc32c, PayloadDigest::Xxh3] {
            let mut h = kind.hasher();
            for part in data.chunks(4093) {
                h.update(part);
            }
            assert_eq!(h.finish(), kind.of(&data), "{kind:?}");
        }
    }
}
