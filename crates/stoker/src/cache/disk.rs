//! The disk half of the block cache: `dir/ab/<32 hex>.blk` files that several processes on a
//! node may share (DataLoader workers, ranks) and the next run reuses.
//!
//! Crash safety: an entry is written to a temporary file named after its writer's pid and
//! renamed into place, so a reader sees a whole block or none, whenever the writer dies. A
//! SIGKILL loses nothing the kernel has accepted (the page cache survives the process), so
//! there is no fsync: after a power loss an entry can only be missing or of the wrong length,
//! and an entry of the wrong length is a miss. Temporary files of dead writers are removed
//! when a cache is opened.
//!
//! A directory that cannot be used never fails a read: one that cannot be created disables
//! the disk cache, one that cannot be written (read-only, full) is only read from, each with
//! one warning per process.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

/// The largest default size: beyond this a disk cache rarely pays for the space it takes.
pub(crate) const DEFAULT_MAX: u64 = 50 << 30;
/// The smallest default size (unless the disk is nearly full).
pub(crate) const DEFAULT_MIN: u64 = 256 << 20;
/// Temporary files older than this are removed at open even if a process of that pid lives
/// (pids are reused, and a writer in another pid namespace is not visible in `/proc`).
const STALE_TMP: Duration = Duration::from_secs(600);
/// After a failed write, writes pause this long (a full disk must not cost a failed write of
/// every block).
const WRITE_PAUSE: Duration = Duration::from_secs(30);

/// Print `message` to standard error once per process for each `flag`: a cache problem is
/// worth saying, not worth failing a read over or repeating for every block.
pub(crate) fn warn_once(flag: &AtomicBool, message: impl FnOnce() -> String) {
    if !flag.swap(true, Relaxed) {
        eprintln!("stoker: warning: {}", message());
    }
}

static WARNED_OPEN: AtomicBool = AtomicBool::new(false);
static WARNED_WRITE: AtomicBool = AtomicBool::new(false);

/// The default size of a disk cache in `dir` that holds `used` bytes: 10% of the space the
/// cache could have (the disk's free space plus what it holds already, so the size is the
/// same run after run), between [`DEFAULT_MIN`] (at most half that space) and [`DEFAULT_MAX`].
pub(crate) fn default_limit(dir: &Path, used: u64) -> u64 {
    let free = match rustix::fs::statvfs(dir) {
        Ok(s) => s.f_bavail.saturating_mul(s.f_frsize),
        Err(_) => return DEFAULT_MIN,
    };
    let room = free.saturating_add(used);
    (room / 10).clamp(DEFAULT_MIN.min(room / 2), DEFAULT_MAX).max(1)
}

pub(crate) struct DiskCache {
    dir: PathBuf,
    limit: u64,
    /// Entries are served but not written (a read-only or unwritable directory).
    read_only: bool,
    /// This process's estimate of the directory's size; other processes write too, so it is
    /// refreshed from a scan at most once a second (`last_scan`, ms since `born`).
    used: AtomicU64,
    born: std::time::Instant,
    last_scan: AtomicU64,
    /// No write before this many ms since `born` (after a failed write).
    writes_paused_until: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) evictions: AtomicU64,
    /// Temporary files of dead writers removed when the cache was opened.
    pub(crate) stale_removed: u64,
}

impl DiskCache {
    /// The cache in `dir` with `limit` bytes (`None`: [`default_limit`]); `None` when the
    /// directory cannot be made (after a warning).
    pub(crate) fn open(dir: &Path, limit: Option<u64>) -> Option<Self> {
        if let Err(e) = std::fs::create_dir_all(dir) {
            warn_once(&WARNED_OPEN, || {
                format!(
                    "cannot create the disk cache directory {} ({e}); reading without a disk cache (set \
                     disk_cache_dir= to another directory, or disk_cache=false)",
                    dir.display()
                )
            });
            return None;
        }
        let writable = std::fs::File::options().create(true).truncate(false).write(true).open(lock_path(dir));
        if let Err(e) = &writable {
            warn_once(&WARNED_OPEN, || {
                format!(
                    "the disk cache directory {} is not writable ({e}); its entries are read but no new ones are \
                     written",
                    dir.display()
                )
            });
        }
        let stale_removed = if writable.is_ok() { remove_stale_tmp(dir) } else { 0 };
        let used = scan(dir).iter().map(|(_, len, _)| len).sum();
        let cache = DiskCache {
            dir: dir.to_path_buf(),
            limit: limit.unwrap_or_else(|| default_limit(dir, used)).max(1),
            read_only: writable.is_err(),
            used: AtomicU64::new(used),
            born: std::time::Instant::now(),
            last_scan: AtomicU64::new(0),
            writes_paused_until: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            stale_removed,
        };
        // Earlier processes may have left it over the limit (each saw only its own writes).
        if used > cache.limit && !cache.read_only {
            cache.evict();
        }
        Some(cache)
    }

    /// The size limit in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    pub(crate) fn path(&self, key: u128) -> PathBuf {
        let hex = format!("{key:032x}");
        self.dir.join(&hex[..2]).join(format!("{hex}.blk"))
    }

    /// A whole block, or `None` (absent, or the wrong length: never a torn read).
    pub(crate) fn read(&self, key: u128, len: usize) -> Option<Bytes> {
        let path = self.path(key);
        let data = std::fs::read(&path).ok()?;
        if data.len() != len {
            if !self.read_only {
                let _ = std::fs::remove_file(&path);
            }
            return None;
        }
        // Reading refreshes the entry's age for least-recently-used eviction.
        if let Ok(f) = std::fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(Bytes::from(data))
    }

    /// Store a block, best effort: a failure (full disk, a directory gone read-only) is
    /// warned about once, pauses writes for a while and is otherwise ignored.
    pub(crate) fn write(&self, key: u128, data: &[u8]) {
        let now = self.born.elapsed().as_millis() as u64;
        if self.read_only || now < self.writes_paused_until.load(Relaxed) {
            return;
        }
        if let Err(e) = self.try_write(key, data) {
            self.writes_paused_until.store(now + WRITE_PAUSE.as_millis() as u64, Relaxed);
            warn_once(&WARNED_WRITE, || {
                format!(
                    "cannot write to the disk cache in {} ({e}); reads go on without storing new blocks there",
                    self.dir.display()
                )
            });
        }
    }

    fn try_write(&self, key: u128, data: &[u8]) -> std::io::Result<()> {
        let path = self.path(key);
        if path.exists() {
            return Ok(());
        }
        let parent = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent)?;
        // A unique temporary name per writer, with its pid so a dead writer's leftovers are
        // recognised; the rename makes the entry appear whole.
        let tmp = parent.join(format!(".{key:032x}.{}.{:x}.tmp", std::process::id(), unique()));
        let written = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(data));
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.writes.fetch_add(1, Relaxed);
        let mut used = self.used.fetch_add(data.len() as u64, Relaxed) + data.len() as u64;
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.last_scan.load(Relaxed);
        if now.saturating_sub(last) >= 1000 && self.last_scan.compare_exchange(last, now, Relaxed, Relaxed).is_ok() {
            // What the other processes sharing the directory wrote since.
            used = scan(&self.dir).iter().map(|(_, len, _)| len).sum();
            self.used.store(used, Relaxed);
        }
        if used > self.limit {
            self.evict();
        }
        Ok(())
    }

    /// Trim to 90% of the limit, oldest first. One process at a time; the others skip.
    fn evict(&self) {
        let Ok(lock) = std::fs::File::options().create(true).truncate(false).write(true).open(lock_path(&self.dir))
        else {
            return;
        };
        if lock.try_lock().is_err() {
            return;
        }
        let mut entries = scan(&self.dir);
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        entries.sort_by_key(|(_, _, modified)| *modified);
        let target = self.limit / 10 * 9;
        for (path, len, _) in entries {
            if total <= target {
                break;
            }
            // Readers that already opened the file keep reading it; new ones see a miss.
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                self.evictions.fetch_add(1, Relaxed);
            }
        }
        self.used.store(total, Relaxed);
        let _ = lock.unlock();
    }
}

fn lock_path(dir: &Path) -> PathBuf {
    dir.join(".evict.lock")
}

fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Relaxed)
        ^ (SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64))
}

/// Remove temporary files whose writer is gone: its pid is not running (when `/proc` says),
/// or the file is older than [`STALE_TMP`]. Returns how many were removed.
fn remove_stale_tmp(dir: &Path) -> u64 {
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
fn tmp_writer(name: &str) -> Option<u32> {
    let mut parts = name.strip_prefix('.')?.strip_suffix(".tmp")?.split('.');
    let (key, pid, _unique) = (parts.next()?, parts.next()?, parts.next()?);
    (key.len() == 32 && parts.next().is_none()).then_some(())?;
    pid.parse().ok()
}

/// Every block file: path, length, modification time.
pub(crate) fn scan(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !sub.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for f in std::fs::read_dir(sub.path()).into_iter().flatten().flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "blk") {
                if let Ok(m) = f.metadata() {
                    out.push((p, m.len(), m.modified().unwrap_or(std::time::UNIX_EPOCH)));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_carry_their_writer() {
        let key = format!("{:032x}", 7u128);
        assert_eq!(tmp_writer(&format!(".{key}.4242.1f.tmp")), Some(4242));
        assert_eq!(tmp_writer(&format!("{key}.blk")), None);
        assert_eq!(tmp_writer(".short.1.2.tmp"), None);
        assert_eq!(tmp_writer(&format!(".{key}.notapid.2.tmp")), None);
    }

    #[test]
    fn dead_writers_leftovers_go_at_open_and_live_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("00");
        std::fs::create_dir_all(&sub).unwrap();
        let key = format!("{:032x}", 1u128);
        // No process has pid u32::MAX - 1 (above pid_max), this one is alive.
        let dead = sub.join(format!(".{key}.{}.1.tmp", u32::MAX - 1));
        let alive = sub.join(format!(".{key}.{}.2.tmp", std::process::id()));
        std::fs::write(&dead, b"torn").unwrap();
        std::fs::write(&alive, b"being written").unwrap();
        let cache = DiskCache::open(dir.path(), Some(1 << 20)).unwrap();
        assert_eq!(cache.stale_removed, 1);
        assert!(!dead.exists() && alive.exists());
    }

    #[test]
    fn the_default_size_is_a_tenth_of_the_room_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let limit = default_limit(dir.path(), 0);
        let s = rustix::fs::statvfs(dir.path()).unwrap();
        let free = s.f_bavail * s.f_frsize;
        assert!(limit <= DEFAULT_MAX && limit <= free.max(1), "{limit} of {free}");
        assert!(limit >= DEFAULT_MIN.min(free / 2), "{limit} of {free}");
        // What the cache holds counts as room: the size does not shrink as it fills.
        assert!(default_limit(dir.path(), 1 << 30) >= limit);
    }

    #[cfg(unix)]
    #[test]
    fn an_unwritable_directory_is_read_not_written() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let writer = DiskCache::open(dir.path(), Some(1 << 20)).unwrap();
        writer.write(5, &[5u8; 100]);
        std::fs::remove_file(lock_path(dir.path())).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
        // Root ignores permissions: nothing to check there.
        if std::fs::File::create(dir.path().join("probe")).is_ok() {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            return;
        }
        let reader = DiskCache::open(dir.path(), Some(1 << 20)).unwrap();
        assert!(reader.read_only);
        assert_eq!(reader.read(5, 100).as_deref(), Some(&[5u8; 100][..]));
        reader.write(6, &[6u8; 100]);
        assert!(reader.read(6, 100).is_none());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}
