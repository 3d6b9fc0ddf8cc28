//! How a disk cache block proves it is the block it claims to be.
//!
//! A block file is the block's bytes followed by a trailer: one XXH3-64 digest per
//! [`CHUNK`] of the bytes, then a fixed tail naming the block (its cache key and length)
//! and a digest of the trailer itself. The bytes stay at offset 0, so the hit path reads a
//! sample at the same offset as before and verifies only the chunks it touches.
//!
//! What this catches, before a byte is served: bytes flipped or zeroed on disk (a chunk's
//! digest), a file cut short or grown (its length), a file of another block or another
//! version of the object put in its place (the key in the tail), a trailer damaged itself
//! (the tail's digest), and files written by an older Stoker without a trailer (no magic).
//! It guards against damage, not against an adversary who can write the cache directory
//! (who could as well write a matching trailer).

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use twox_hash::XxHash3_64;

/// Bytes covered by one digest: a read verifies whole chunks, so this bounds the extra
/// bytes a small read touches (at most two chunks) against the trailer's size (8 bytes per
/// chunk: 1 KiB for a 1 MiB block).
pub(crate) const CHUNK: u64 = 8 << 10;

/// The chunks of a block of `len` bytes (the last one short).
pub(crate) fn chunks(len: u64) -> std::ops::Range<u64> {
    0..len.div_ceil(CHUNK)
}
/// The fixed end of a trailer: magic, key, length, digest of the rest of the trailer.
const TAIL: usize = 8 + 16 + 8 + 8;
const MAGIC: &[u8; 8] = b"stkblk02";

/// Bytes of the trailer of a block of `len` bytes.
pub(crate) fn trailer_len(len: u64) -> u64 {
    len.div_ceil(CHUNK) * 8 + TAIL as u64
}

/// Bytes of the file that holds a block of `len` bytes.
pub(crate) fn file_len(len: u64) -> u64 {
    len + trailer_len(len)
}

/// The trailer to write after block `key`'s bytes `data`.
#[cfg(test)]
pub(crate) fn trailer(key: u128, data: &[u8]) -> Vec<u8> {
    let mut t = Trailer::new(data.len() as u64);
    t.add(data);
    t.finish(key)
}

/// A trailer built piece by piece as the block's bytes are written: each piece is hashed
/// just before it is copied to the file, while it is in the CPU's cache (hashing the whole
/// block first read every byte from memory twice).
pub(crate) struct Trailer {
    t: Vec<u8>,
    len: u64,
}

impl Trailer {
    /// For a block of `len` bytes.
    pub(crate) fn new(len: u64) -> Self {
        Trailer { t: Vec::with_capacity(trailer_len(len) as usize), len }
    }

    /// The block's next bytes: whole chunks (a multiple of [`CHUNK`]), but for its end.
    pub(crate) fn add(&mut self, piece: &[u8]) {
        debug_assert!(
            self.t.len() as u64 * CHUNK / 8 + piece.len() as u64 == self.len
                || (piece.len() as u64).is_multiple_of(CHUNK),
            "a piece before the block's last is whole chunks"
        );
        for chunk in piece.chunks(CHUNK as usize) {
            self.t.extend_from_slice(&XxHash3_64::oneshot(chunk).to_le_bytes());
        }
    }

    /// The trailer of block `key`, once all its bytes were added.
    pub(crate) fn finish(self, key: u128) -> Vec<u8> {
        let (mut t, len) = (self.t, self.len);
        t.extend_from_slice(MAGIC);
        t.extend_from_slice(&key.to_le_bytes());
        t.extend_from_slice(&len.to_le_bytes());
        let own = XxHash3_64::oneshot(&t);
        t.extend_from_slice(&own.to_le_bytes());
        t
    }
}

/// Why a block file was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Written without a trailer (an older Stoker): not damage, just a block to fetch again.
    Unsealed,
    /// Its trailer or bytes do not verify: damage, counted.
    Damaged,
}

/// The chunk digests of block `key` of `len` bytes from its `trailer`, once the trailer
/// verifies and names that block.
pub(crate) fn open_trailer(key: u128, len: u64, trailer: &[u8]) -> Result<Vec<u64>, Refused> {
    if trailer.len() as u64 != trailer_len(len) {
        return Err(Refused::Damaged);
    }
    let (body, own) = trailer.split_at(trailer.len() - 8);
    let tail = &body[body.len() - (TAIL - 8)..];
    if &tail[..8] != MAGIC {
        return Err(Refused::Damaged);
    }
    let own = u64::from_le_bytes(own.try_into().map_err(|_| Refused::Damaged)?);
    let named_key = u128::from_le_bytes(tail[8..24].try_into().map_err(|_| Refused::Damaged)?);
    let named_len = u64::from_le_bytes(tail[24..32].try_into().map_err(|_| Refused::Damaged)?);
    if XxHash3_64::oneshot(body) != own || named_key != key || named_len != len {
        return Err(Refused::Damaged);
    }
    let sums = &body[..body.len() - (TAIL - 8)];
    Ok(sums.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect())
}

/// Whether `data`, the block's bytes from chunk `first` on (whole chunks, the last one
/// possibly the block's short final chunk), matches `sums`.
pub(crate) fn chunks_match(sums: &[u64], first: usize, data: &[u8]) -> bool {
    data.chunks(CHUNK as usize)
        .enumerate()
        .all(|(i, c)| sums.get(first + i).is_some_and(|&want| XxHash3_64::oneshot(c) == want))
}

/// Check a whole block file (`file` holds the bytes then the trailer) of block `key` of
/// `len` bytes.
pub(crate) fn check_file(key: u128, len: u64, file: &[u8]) -> Result<(), Refused> {
    if file.len() as u64 == len {
        return Err(Refused::Unsealed);
    }
    if file.len() as u64 != file_len(len) {
        return Err(Refused::Damaged);
    }
    let (data, trailer) = file.split_at(len as usize);
    let sums = open_trailer(key, len, trailer)?;
    if chunks_match(&sums, 0, data) {
        Ok(())
    } else {
        Err(Refused::Damaged)
    }
}

/// A block file open for the hit path, its trailer verified ([`super::disk::DiskCache::open_block`]).
pub(crate) struct BlockFile {
    pub(super) file: std::fs::File,
    /// Digest of each [`CHUNK`] of the block.
    pub(super) sums: Vec<u64>,
    /// The block's length (the file is longer by its trailer).
    pub(super) len: u64,
    /// Whether reads check the digests (off only under [`UNVERIFIED_ENV`]).
    pub(super) verify: bool,
    /// The chunks of this file this process has verified already.
    pub(super) verified: Arc<Verified>,
}

/// What tells one block file on disk from another: a file replaced, or rewritten in place,
/// has another identity (inode, size or modification time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    modified_ns: i128,
}

impl FileId {
    pub(crate) fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            modified_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }
}

/// The chunks of one block file (one [`FileId`]) that this process has read and verified.
/// A chunk is hashed when it is first read from the file; later reads of it (the next
/// epoch's) serve it as the verified bytes it is, so a warm epoch pays for the check once
/// per process, not once per read. Another process, the next run, or the same file changed
/// on disk (another identity) verify again.
pub(crate) struct Verified {
    id: FileId,
    bits: Box<[AtomicU64]>,
}

impl Verified {
    pub(crate) fn new(id: FileId, len: u64) -> Self {
        let chunks = len.div_ceil(CHUNK) as usize;
        Verified { id, bits: (0..chunks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Whether this records file `id`.
    pub(crate) fn is_of(&self, id: FileId) -> bool {
        self.id == id
    }

    /// Whether every chunk in `chunks` was verified.
    pub(crate) fn all(&self, chunks: std::ops::Range<u64>) -> bool {
        chunks.into_iter().all(|c| {
            let (w, b) = ((c / 64) as usize, c % 64);
            self.bits.get(w).is_some_and(|x| x.load(Ordering::Relaxed) & (1 << b) != 0)
        })
    }

    /// Record `chunks` as verified.
    pub(crate) fn mark(&self, chunks: std::ops::Range<u64>) {
        for c in chunks {
            if let Some(x) = self.bits.get((c / 64) as usize) {
                x.fetch_or(1 << (c % 64), Ordering::Relaxed);
            }
        }
    }
}

/// Set to `1`, disk caches opened after it serve their blocks without checking their digests.
/// It exists for one purpose, measuring what the check costs (`cache_verify_bench`), and says
/// so on standard error whenever a cache opens under it: damaged blocks would then reach
/// training as data.
pub const UNVERIFIED_ENV: &str = "STOKER_UNVERIFIED_CACHE_FOR_BENCHMARKS";

/// Whether caches opened now verify their blocks (see [`UNVERIFIED_ENV`]).
pub(crate) fn verifying() -> bool {
    std::env::var(UNVERIFIED_ENV).map_or(true, |v| v != "1")
}

thread_local! {
    /// Where chunks cut by a read's edges are read and verified before their wanted part is
    /// copied out (at most one chunk).
    static EDGE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl BlockFile {
    /// Fill `dst` with the block's bytes from offset `at`, verifying every chunk it touches:
    /// whole chunks are read straight into `dst` and checked there, a chunk cut by either end
    /// of the read is read whole aside. `Ok(false)`: a chunk did not verify (`dst` holds
    /// unverified bytes, and must not be used).
    pub(crate) fn read_verified(&self, dst: &mut [u8], at: u64) -> io::Result<bool> {
        let end = at + dst.len() as u64;
        if end > self.len {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of a cached block"));
        }
        let chunks = at / CHUNK..end.div_ceil(CHUNK);
        if !self.verify || self.verified.all(chunks.clone()) {
            self.file.read_exact_at(dst, at)?;
            return Ok(true);
        }
        // The end of the whole chunks inside the read: the block's end counts as a chunk end.
        let whole_end = if end == self.len { end } else { end / CHUNK * CHUNK };
        let mut pos = at;
        while pos < end {
            let c = pos / CHUNK;
            let chunk_start = c * CHUNK;
            let out = (pos - at) as usize;
            if pos == chunk_start && whole_end > pos {
                let d = &mut dst[out..(whole_end - at) as usize];
                self.file.read_exact_at(d, pos)?;
                if !chunks_match(&self.sums, c as usize, d) {
                    return Ok(false);
                }
                pos = whole_end;
                continue;
            }
            let chunk_end = (chunk_start + CHUNK).min(self.len);
            let upto = chunk_end.min(end);
            let ok = EDGE.with(|edge| -> io::Result<bool> {
                let mut edge = edge.borrow_mut();
                let n = (chunk_end - chunk_start) as usize;
                if edge.len() < n {
                    edge.resize(n, 0);
                }
                self.file.read_exact_at(&mut edge[..n], chunk_start)?;
                if !chunks_match(&self.sums, c as usize, &edge[..n]) {
                    return Ok(false);
                }
                let from = (pos - chunk_start) as usize;
                dst[out..out + (upto - pos) as usize].copy_from_slice(&edge[from..from + (upto - pos) as usize]);
                Ok(true)
            })?;
            if !ok {
                return Ok(false);
            }
            pos = upto;
        }
        self.verified.mark(chunks);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(key: u128, data: &[u8]) -> Vec<u8> {
        let mut f = data.to_vec();
        f.extend(trailer(key, data));
        f
    }

    #[test]
    fn a_sealed_block_verifies_and_every_kind_of_damage_is_refused() {
        let data: Vec<u8> = (0..(3 * CHUNK + 100)).map(|i| (i * 31 % 251) as u8).collect();
        let len = data.len() as u64;
        let f = sealed(9, &data);
        assert_eq!(f.len() as u64, file_len(len));
        assert_eq!(check_file(9, len, &f), Ok(()));
        // Any flipped bit, in the bytes or the trailer.
        for at in [0, CHUNK as usize, len as usize - 1, len as usize, f.len() - 1, f.len() - 30] {
            let mut bad = f.clone();
            bad[at] ^= 0x04;
            assert_eq!(check_file(9, len, &bad), Err(Refused::Damaged), "flip at {at}");
        }
        // Cut short, grown, another block's file, another length, no trailer.
        assert_eq!(check_file(9, len, &f[..f.len() - 1]), Err(Refused::Damaged));
        assert_eq!(check_file(9, len, &[&f[..], b"x"].concat()), Err(Refused::Damaged));
        assert_eq!(check_file(10, len, &f), Err(Refused::Damaged));
        assert_eq!(check_file(9, len, &sealed(9, &data[..data.len() - 8])), Err(Refused::Damaged));
        assert_eq!(check_file(9, len, &data), Err(Refused::Unsealed));
    }

    #[test]
    fn chunks_verify_one_by_one() {
        let data: Vec<u8> = (0..(2 * CHUNK + 10)).map(|i| (i % 7) as u8).collect();
        let t = trailer(1, &data);
        let sums = open_trailer(1, data.len() as u64, &t).unwrap();
        assert_eq!(sums.len(), 3);
        let c = CHUNK as usize;
        assert!(chunks_match(&sums, 1, &data[c..]));
        assert!(chunks_match(&sums, 2, &data[2 * c..]));
        assert!(!chunks_match(&sums, 0, &data[c..2 * c]), "a chunk checked against another's digest");
        let mut bad = data[c..2 * c].to_vec();
        bad[5] ^= 1;
        assert!(!chunks_match(&sums, 1, &bad));
        assert!(!chunks_match(&sums, 3, &data[..c]), "a chunk past the block has no digest");
    }
}
