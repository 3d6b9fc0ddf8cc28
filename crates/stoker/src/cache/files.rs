//! The disk cache directory's files: entries named `<32 hex>.blk` in two-hex subdirectories,
//! temporary files named after their writer's pid, and what a scan of them finds.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use super::DEFAULT_BLOCK;

/// The cache key of block number `block`, of `block_size` bytes, of one version of an object.
/// Blocks of different sizes have different keys, so readers with different block sizes can
/// share a disk cache (each finds its own blocks, neither takes the other's for damage); the
/// default size is left out of the key, so caches written before sizes were keyed stay valid.
pub fn block_key(object: &str, version: &str, block_size: u64, block: u64) -> u128 {
    let size = (block_size != DEFAULT_BLOCK).then_some(block_size.to_le_bytes());
    let h = |seed: u64| {
        let mut x = seed;
        let sized = size.iter().flatten().copied();
        for b in object.bytes().chain([0]).chain(version.bytes()).chain([0]).chain(block.to_le_bytes()).chain(sized) {
            x = (x ^ b as u64).wrapping_mul(0x100000001b3);
        }
        x
    };
    ((h(0xcbf29ce484222325) as u128) << 64) | h(0x84222325cbf29ce4) as u128
}

/// Temporary files older than this are removed at open even if a process of that pid lives
/// (pids are reused, and a writer in another pid namespace is not visible in `/proc`).
const STALE_TMP: Duration = Duration::from_secs(600);

pub(super) fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Relaxed)
        ^ (SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64))
}

/// Remove temporary files whose writer is gone: its pid is not running (when `/proc` says),
/// or the file is older than [`STALE_TMP`]. Returns how many were removed.
pub(super) fn remove_stale_tmp(dir: &Path) -> u64 {
    let proc_visible = Path::new("/proc/self").exists();
    let mut removed = 0;
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !sub.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for f in std::fs::read_dir(sub.path()).into_iter().flatten().flatten() {
            let name = f.file_name();
            let Some(pid) = tmp_writer(&name.to_string_lossy()) else { continue };
            let old = f
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
            let dead = proc_visible && !Path::new("/proc").join(pid.to_string()).exists();
            if (old || dead) && std::fs::remove_file(f.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// The writer's pid in a temporary entry's name (`.<32 hex>.<pid>.<hex>.tmp`).
pub(super) fn tmp_writer(name: &str) -> Option<u32> {
    let mut parts = name.strip_prefix('.')?.strip_suffix(".tmp")?.split('.');
    let (key, pid, _unique) = (parts.next()?, parts.next()?, parts.next()?);
    (key.len() == 32 && parts.next().is_none()).then_some(())?;
    pid.parse().ok()
}

/// An entry found on disk.
pub(crate) struct Found {
    pub(crate) key: u128,
    pub(crate) len: u64,
    pub(crate) modified: SystemTime,
}

/// Every entry in the directory (files named `<32 hex>.blk` in its subdirectories).
pub(crate) fn scan(dir: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !sub.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for f in std::fs::read_dir(sub.path()).into_iter().flatten().flatten() {
            let name = f.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".blk")).filter(|h| h.len() == 32) else {
                continue;
            };
            // Only regular files are entries (what else bears the name is refused when read).
            if !f.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let (Ok(key), Ok(m)) = (u128::from_str_radix(hex, 16), f.metadata()) else { continue };
            out.push(Found { key, len: m.len(), modified: m.modified().unwrap_or(std::time::UNIX_EPOCH) });
        }
    }
    out
}

/// Open cache entry `path` for reading (or, with `write`, for writing its metadata), as a
/// regular file only: a FIFO or device put in a block's place must not block the read
/// forever (an `open` of a FIFO waits for a writer), and a symlink is not followed (the cache
/// writes none). A symlink fails to open, like a missing entry; anything that is not a
/// regular file is `InvalidData`, for the caller to refuse.
pub(crate) fn open_entry(path: &Path, write: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::options()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file"));
    }
    Ok(file)
}

/// The most one `write` call hands the kernel. The page cache takes folios as large as a
/// write (up to 2 MiB and more), and on a VM that gives free memory back to its host (virtio
/// free page reporting, as Firecracker and many clouds do) exactly those high orders are the
/// pages handed back, each faulted in again from the host on first touch. Writing 1 GiB to a
/// new file there (each run after 5 s idle, system time): in 8 MiB writes 2.8-3.2 s, 1 MiB
/// 1.0-1.8 s, 512 KiB 0.25-0.9 s, 64-128 KiB 0.24-0.30 s; a cold epoch through the disk
/// cache read at 0.57-1.06x (median 0.68x) the link's bound with 1 MiB pieces, 0.67-0.83x
/// (median 0.80x) with these, eight alternating rounds. On other machines a 128 KiB write
/// costs no more than a larger one (a syscall per 128 KiB is noise beside the copy).
pub(crate) const WRITE_PIECE: usize = 128 << 10;

/// Write entry `key` (its bytes, then their trailer) at `path` in cache directory `dir`: to a
/// temporary file named after this writer's pid (so a dead writer's leftovers are
/// recognised), then renamed into place, so readers see the whole entry or none. Returns the
/// written file's identity (a rename keeps it).
pub(super) fn write_entry(path: &Path, dir: &Path, key: u128, data: &[u8]) -> std::io::Result<super::seal::FileId> {
    use std::io::Write;
    let parent = path.parent().unwrap_or(dir);
    let tmp = parent.join(format!(".{key:032x}.{}.{:x}.tmp", std::process::id(), unique()));
    // The entry's directory is made when the file cannot be created for want of it, not by a
    // mkdir before every write: in a profiled cold epoch those mkdirs (each finding the
    // directory there, under its parent's lock) took 5% of the Loader's time.
    let file = match std::fs::File::create(&tmp) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(parent)?;
            std::fs::File::create(&tmp)
        }
        other => other,
    };
    let written = file.and_then(|mut f| {
        // Pieces of whole chunks, so each is hashed for the trailer right before its write.
        const _: () = assert!((WRITE_PIECE as u64).is_multiple_of(super::seal::CHUNK));
        let mut trailer = super::seal::Trailer::new(data.len() as u64);
        for piece in data.chunks(WRITE_PIECE) {
            trailer.add(piece);
            f.write_all(piece)?;
        }
        f.write_all(&trailer.finish(key))?;
        f.metadata().map(|m| super::seal::FileId::of(&m))
    });
    match written.and_then(|id| std::fs::rename(&tmp, path).map(|()| id)) {
        Ok(id) => Ok(id),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_makes_its_directory_when_missing_and_writes_into_one_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = |key: u128| dir.path().join(format!("{:02x}", key >> 120)).join(format!("{key:032x}.blk"));
        let (a, b) = (0xab << 120 | 1, 0xab << 120 | 2);
        write_entry(&path(a), dir.path(), a, b"first").unwrap();
        write_entry(&path(b), dir.path(), b, b"second, same directory").unwrap();
        for (key, data) in [(a, &b"first"[..]), (b, &b"second, same directory"[..])] {
            let bytes = std::fs::read(path(key)).unwrap();
            assert_eq!(&bytes[..data.len()], data, "the entry's bytes, then its trailer");
        }
        let names: Vec<_> =
            std::fs::read_dir(path(a).parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
    }

    #[test]
    fn blocks_of_other_sizes_have_other_keys() {
        let key = |size, b| block_key("shard-0.tar", "v1", size, b);
        assert_ne!(key(DEFAULT_BLOCK, 0), key(super::super::ORDERED_BLOCK, 0));
        assert_ne!(key(4096, 1), key(8192, 1));
        assert_ne!(key(4096, 0), key(4096, 1));
        assert_ne!(key(4096, 0), block_key("shard-0.tar", "v2", 4096, 0));
        // The default size's keys are those written before sizes were keyed (FNV-1a over
        // object, NUL, version, NUL, block number): existing caches stay valid.
        let old = |seed: u64| {
            let mut x = seed;
            for b in b"shard-0.tar\0v1\0".iter().copied().chain(3u64.to_le_bytes()) {
                x = (x ^ b as u64).wrapping_mul(0x100000001b3);
            }
            x
        };
        assert_eq!(key(DEFAULT_BLOCK, 3), ((old(0xcbf29ce484222325) as u128) << 64) | old(0x84222325cbf29ce4) as u128);
    }

    #[test]
    fn temporary_names_carry_their_writer() {
        let key = format!("{:032x}", 7u128);
        assert_eq!(tmp_writer(&format!(".{key}.4242.1f.tmp")), Some(4242));
        assert_eq!(tmp_writer(&format!("{key}.blk")), None);
        assert_eq!(tmp_writer(".short.1.2.tmp"), None);
        assert_eq!(tmp_writer(&format!(".{key}.notapid.2.tmp")), None);
    }
}
