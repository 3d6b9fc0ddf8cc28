//! The disk half of the block cache: `dir/ab/<32 hex>.blk` files that several processes on a
//! node may share (DataLoader workers, ranks) and the next run reuses.
//!
//! Crash safety: an entry is written to a temporary file named after its writer's pid and
//! renamed into place, so a reader sees a whole block or none, whenever the writer dies. A
//! SIGKILL loses nothing the kernel has accepted (the page cache survives the process), so
//! there is no fsync. Temporary files of dead writers are removed when a cache is opened.
//!
//! Trust: every entry carries a trailer of digests ([`super::seal`]) and is verified before
//! any of its bytes is served, whole ([`DiskCache::read`]) or chunk by chunk (the hit path,
//! [`BlockFile`]). An entry that fails (flipped bits, a file cut short after a power loss,
//! another block's file in its place, an older unsealed format) is removed, counted as
//! corrupt when it was damage, and fetched again from the store: a damaged cache costs a
//! request, never a wrong byte and never an error blamed on the remote object.
//!
//! What to drop is decided in memory ([`Ranks`]: by the reader's plan, else least recently
//! used), from the entries this process wrote or read and those a scan of the directory
//! found; the scan is repeated at most once a second while writing, to see what the other
//! processes wrote and removed. Each process evicts by what it knows, one at a time (an
//! advisory lock): the processes of one job read the same order, so their plans agree; a
//! process without a plan evicts least recently used. Either way the directory stays near
//! its limit and every entry served is whole. Reads do not touch files: recency is kept in
//! memory, and an entry's modification time (the order a new process starts from) is
//! refreshed at most once per process.
//!
//! Room: whatever its limit, the cache leaves its disk a floor of free space
//! ([`super::room`]): before each write it evicts what must go for the block to fit above
//! the floor, and skips the block when even that is not enough (a disk others filled).
//!
//! A directory that cannot be used never fails a read: one that cannot be created disables
//! the disk cache, one that cannot be written (read-only, full) is only read from, each with
//! one warning per process.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::files::{open_entry, remove_stale_tmp, scan, write_entry};
use super::policy::{Plan, Ranks};
use super::room::{default_limit, disk_of, SpaceQuery};
use super::seal::{self, BlockFile, FileId, Refused, Verified};

/// After a failed write, writes pause this long (a full disk must not cost a failed write of
/// every block).
const WRITE_PAUSE: Duration = Duration::from_secs(30);
/// Block files the hit path keeps open.
const OPEN_FILES: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(128) {
    Some(n) => n,
    None => unreachable!(),
};

/// How often a writing process rescans the directory for the other processes' entries: after
/// this long, or after writing this share of the limit, whichever comes first.
const RESCAN: Duration = Duration::from_secs(1);
const RESCAN_SHARE: u64 = 16;

/// Print `message` to standard error once per process for each `flag`: a cache problem is
/// worth saying, not worth failing a read over or repeating for every block.
pub(crate) fn warn_once(flag: &AtomicBool, message: impl FnOnce() -> String) {
    if !flag.swap(true, Relaxed) {
        eprintln!("stoker: warning: {}", message());
    }
}

static WARNED_OPEN: AtomicBool = AtomicBool::new(false);
static WARNED_WRITE: AtomicBool = AtomicBool::new(false);
static WARNED_ROOM: AtomicBool = AtomicBool::new(false);

pub(crate) struct DiskCache {
    pub(super) dir: PathBuf,
    limit: u64,
    /// The numbers of the disk it lives on, asked before every write: whatever the limit,
    /// the cache leaves the floor of free space [`super::room`] keeps.
    space: SpaceQuery,
    /// Entries are served but not written (a read-only or unwritable directory).
    pub(super) read_only: bool,
    /// Whether entries are verified before they are served (always, but for measuring the
    /// check: [`seal::UNVERIFIED_ENV`]).
    verify: bool,
    /// The entries known to this process, in eviction order.
    ranks: Mutex<Ranks>,
    /// Entries whose modification time this process refreshed or wrote (once each is enough).
    stamped: Mutex<HashSet<u128>>,
    /// Block files recently opened by the hit path, so a block read by batch after batch is
    /// not opened again for each. An entry's bytes never change (its key names the object's
    /// version), so a file open here reads right even after another process evicted it; it
    /// only keeps that file's space until it leaves this small set, and this process's own
    /// evictions close it at once.
    files: Mutex<lru::LruCache<u128, Arc<BlockFile>>>,
    /// Per entry, the chunks this process has verified (see [`Verified`]): dropped with the
    /// entry.
    verified: Mutex<std::collections::HashMap<u128, Arc<Verified>>>,
    born: std::time::Instant,
    /// Ms since `born` of the last scan of the directory, and bytes this process wrote since.
    last_scan: AtomicU64,
    written_since_scan: AtomicU64,
    /// No write before this many ms since `born` (after a failed write).
    writes_paused_until: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) evictions: AtomicU64,
    /// Blocks not written because the plan would have made them the first to go.
    pub(crate) bypassed: AtomicU64,
    /// Entries that failed verification (damaged, cut short, another block's): dropped and
    /// fetched again.
    pub(crate) corrupt: AtomicU64,
    /// Blocks not written because the disk had no room above its floor, even after eviction.
    pub(crate) no_room: AtomicU64,
    /// Temporary files of dead writers removed when the cache was opened.
    pub(crate) stale_removed: u64,
}

impl DiskCache {
    /// The cache in `dir` with `limit` bytes (`None`: [`default_limit`]); `None` when the
    /// directory cannot be made (after a warning).
    pub(crate) fn open(dir: &Path, limit: Option<u64>) -> Option<Self> {
        Self::open_on(dir, limit, disk_of(dir.to_path_buf()))
    }

    /// [`open`](Self::open), on a disk whose numbers `space` gives (a test's stand-in).
    pub(crate) fn open_on(dir: &Path, limit: Option<u64>, space: SpaceQuery) -> Option<Self> {
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
        let mut found = scan(dir);
        // Least recently written (or read, see `stamp`) first: the order a new process starts from.
        found.sort_by_key(|e| e.modified);
        let mut ranks = Ranks::default();
        for (i, e) in found.iter().enumerate() {
            ranks.insert(e.key, e.len, Some(i as u64));
        }
        if !seal::verifying() {
            eprintln!(
                "stoker: warning: {}=1: the disk cache in {} serves blocks WITHOUT checking them (for measuring \
                 the check only)",
                seal::UNVERIFIED_ENV,
                dir.display()
            );
        }
        let cache = DiskCache {
            dir: dir.to_path_buf(),
            limit: limit.unwrap_or_else(|| default_limit(dir, ranks.bytes())).max(1),
            space,
            read_only: writable.is_err(),
            verify: seal::verifying(),
            ranks: Mutex::new(ranks),
            stamped: Mutex::new(HashSet::new()),
            files: Mutex::new(lru::LruCache::new(OPEN_FILES)),
            verified: Mutex::new(std::collections::HashMap::new()),
            born: std::time::Instant::now(),
            last_scan: AtomicU64::new(0),
            written_since_scan: AtomicU64::new(0),
            writes_paused_until: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            bypassed: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            no_room: AtomicU64::new(0),
            stale_removed,
        };
        // Earlier processes may have left it over the limit (each saw only its own writes),
        // and the disk may have filled since: what it holds below the floor is given back.
        if !cache.read_only {
            cache.evict(0);
            cache.make_room(0);
        }
        Some(cache)
    }

    /// The size limit in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    pub(super) fn ranks(&self) -> std::sync::MutexGuard<'_, Ranks> {
        self.ranks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Evict by `plan` from now on (`None`: least recently used), and write only blocks it
    /// reads again before they would go ([`super::admission`]).
    pub(crate) fn set_plan(&self, plan: Option<Arc<Plan>>) {
        let admission = plan.clone().map(|p| super::admission::admit(p, self.limit, seal::file_len));
        self.ranks().set_plan(plan, admission);
    }

    /// Whether a missing block is worth fetching whole (see [`Ranks::worth_fetching_whole`]).
    pub(crate) fn worth_fetching_whole(&self, key: u128, len: u64, piece: u64) -> bool {
        // A block that cannot be stored is not worth fetching beyond what is asked.
        let whole = !self.read_only && self.ranks().worth_fetching_whole(key, len, piece, self.limit);
        if !whole {
            self.bypassed.fetch_add(1, Relaxed);
        }
        whole
    }

    /// Whether the entry is there as far as this process knows (no file system call).
    pub(crate) fn contains(&self, key: u128) -> bool {
        self.ranks().contains(key)
    }

    pub(crate) fn path(&self, key: u128) -> PathBuf {
        let hex = format!("{key:032x}");
        self.dir.join(&hex[..2]).join(format!("{hex}.blk"))
    }

    /// Block `key`'s file opened for reading; `None` when it is not there, after refusing
    /// (as damage) what is there in its place when that is not a regular file.
    fn open_file(&self, key: u128) -> Option<std::fs::File> {
        open_entry(&self.path(key), false)
            .inspect_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    self.refuse(key, Refused::Damaged);
                }
            })
            .ok()
    }

    /// Block `key`'s file, holding `len` bytes, for the hit path (kept open for the next
    /// read), its trailer verified; `None` when it is not there, or refused (and dropped).
    pub(crate) fn open_block(&self, key: u128, len: u64) -> Option<Arc<BlockFile>> {
        if let Some(f) = self.files.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Some(f.clone());
        }
        let file = self.open_file(key)?;
        let meta = file.metadata().ok()?;
        let on_disk = meta.len();
        let checked = if on_disk == len {
            Err(Refused::Unsealed)
        } else if on_disk != seal::file_len(len) {
            Err(Refused::Damaged)
        } else {
            let mut trailer = vec![0u8; seal::trailer_len(len) as usize];
            match file.read_exact_at(&mut trailer, len) {
                Ok(()) => seal::open_trailer(key, len, &trailer),
                Err(_) => Err(Refused::Damaged),
            }
        };
        match checked {
            Ok(sums) => {
                let verified = self.verified_of(key, FileId::of(&meta), len);
                let file = Arc::new(BlockFile { file, sums, len, verify: self.verify, verified });
                self.files.lock().unwrap_or_else(|e| e.into_inner()).put(key, file.clone());
                Some(file)
            }
            Err(why) => {
                self.refuse(key, why);
                None
            }
        }
    }

    /// A whole block, verified, or `None` (absent, or refused and dropped: never a torn or
    /// damaged read), in a recycled buffer.
    pub(crate) fn read(&self, key: u128, len: usize) -> Option<Bytes> {
        let Some(file) = self.open_file(key) else {
            // Another process evicted it.
            self.ranks().remove(key);
            return None;
        };
        let Ok(meta) = file.metadata() else { return None };
        let on_disk = meta.len();
        let whole = seal::file_len(len as u64);
        if on_disk != whole {
            self.refuse(key, if on_disk == len as u64 { Refused::Unsealed } else { Refused::Damaged });
            return None;
        }
        let mut buf = crate::buffer::take(whole as usize);
        let verified = self.verified_of(key, FileId::of(&meta), len as u64);
        let chunks = seal::chunks(len as u64);
        let checked = match file.read_exact_at(&mut buf[..whole as usize], 0) {
            Ok(()) if !self.verify || verified.all(chunks.clone()) => Ok(()),
            Ok(()) => seal::check_file(key, len as u64, &buf[..whole as usize]),
            Err(_) => Err(Refused::Damaged),
        };
        if let Err(why) = checked {
            self.refuse(key, why);
            return None;
        }
        verified.mark(chunks);
        self.used(key, len as u64);
        Some(crate::buffer::freeze(buf, len))
    }

    /// Drop entry `key`, which failed verification: from memory, from the open files, and
    /// from the directory (unless read-only), so the next read fetches it again; damage is
    /// counted.
    pub(crate) fn refuse(&self, key: u128, why: Refused) {
        if why == Refused::Damaged {
            self.corrupt.fetch_add(1, Relaxed);
        }
        self.ranks().remove(key);
        self.verified.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        self.files.lock().unwrap_or_else(|e| e.into_inner()).pop(&key);
        if !self.read_only {
            // An empty directory in a block's place goes too, or every write of the block
            // would fail on it (one that holds files is left: it is not the cache's).
            let path = self.path(key);
            if std::fs::remove_file(&path).is_err() {
                let _ = std::fs::remove_dir(&path);
            }
        }
    }

    /// What this process verified of entry `key` as file `id` (a fresh record when the file is
    /// not the one verified before).
    fn verified_of(&self, key: u128, id: FileId, len: u64) -> Arc<Verified> {
        let mut map = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some(v) if v.is_of(id) => v.clone(),
            _ => {
                let v = Arc::new(Verified::new(id, len));
                map.insert(key, v.clone());
                v
            }
        }
    }

    /// Entry `key` of `len` bytes was read: recency and plan position in memory, and the
    /// file's modification time once per process, so the next process that opens the cache
    /// starts from a sensible order without a write per read.
    pub(crate) fn used(&self, key: u128, len: u64) {
        let len = seal::file_len(len);
        {
            let mut r = self.ranks();
            if r.contains(key) {
                r.touch(key);
            } else {
                r.insert(key, len, None);
            }
        }
        if !self.read_only && self.stamped.lock().unwrap_or_else(|e| e.into_inner()).insert(key) {
            if let Ok(f) = open_entry(&self.path(key), true) {
                let _ = f.set_modified(SystemTime::now());
            }
        }
    }

    /// Whether to store block `key` of `len` bytes, decided when it arrives (by the plan at
    /// that moment): not when it is there already, writes are off or paused, or the plan
    /// would drop it first (Belady's bypass). An admitted block counts as held from now on;
    /// [`store`](Self::store) writes it.
    pub(crate) fn admit(&self, key: u128, len: u64) -> bool {
        let len = seal::file_len(len);
        let now = self.born.elapsed().as_millis() as u64;
        if self.read_only || now < self.writes_paused_until.load(Relaxed) {
            return false;
        }
        let mut r = self.ranks();
        if r.contains(key) {
            return false;
        }
        if !r.admitted(key) || (r.bytes() + len > self.limit && !r.worth_storing(key)) {
            self.bypassed.fetch_add(1, Relaxed);
            return false;
        }
        r.insert(key, len, None);
        true
    }

    /// Write an admitted block, best effort: a failure (full disk, a directory gone
    /// read-only) drops it, is warned about once, pauses writes for a while and is otherwise
    /// ignored.
    pub(crate) fn store(&self, key: u128, data: &[u8]) {
        if !self.make_room(seal::file_len(data.len() as u64)) {
            self.ranks().remove(key);
            self.no_room.fetch_add(1, Relaxed);
            warn_once(&WARNED_ROOM, || {
                format!(
                    "the disk holding the disk cache in {} is nearly full (the cache leaves 5% of it free, at most \
                     1 GiB, whatever disk_cache_bytes says): blocks that do not fit are not stored, reads go on \
                     without them; free space there, or set disk_cache_dir= to a roomier disk",
                    self.dir.display()
                )
            });
            return;
        }
        let written = match write_entry(&self.path(key), &self.dir, key, data) {
            Ok(id) => id,
            Err(e) => {
                self.ranks().remove(key);
                // A directory holding files in this block's place (not the cache's to remove)
                // costs this block, not every write for a while.
                if matches!(e.kind(), std::io::ErrorKind::IsADirectory | std::io::ErrorKind::DirectoryNotEmpty) {
                    return;
                }
                let now = self.born.elapsed().as_millis() as u64;
                self.writes_paused_until.store(now + WRITE_PAUSE.as_millis() as u64, Relaxed);
                warn_once(&WARNED_WRITE, || {
                    format!(
                        "cannot write to the disk cache in {} ({e}); reads go on without storing new blocks there",
                        self.dir.display()
                    )
                });
                return;
            }
        };
        // Its digests were taken from the bytes just written, by this process: to this process
        // the file is verified, as one it read and checked would be (the same file, by its
        // identity; replaced or changed, it is checked again). The next epoch reads it without
        // hashing it again.
        let len = data.len() as u64;
        self.verified_of(key, written, len).mark(seal::chunks(len));
        self.writes.fetch_add(1, Relaxed);
        {
            // A rescan while the file was being written may have taken it for gone.
            let mut r = self.ranks();
            if !r.contains(key) {
                r.insert(key, seal::file_len(data.len() as u64), None);
            }
        }
        self.stamped.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
        self.written_since_scan.fetch_add(seal::file_len(data.len() as u64), Relaxed);
        self.rescan_now_and_then();
        self.evict(0);
    }

    /// [`admit`](Self::admit), then [`store`](Self::store).
    #[cfg(test)]
    pub(crate) fn write(&self, key: u128, data: &[u8]) {
        if self.admit(key, data.len() as u64) {
            self.store(key, data);
        }
    }

    /// What the other processes sharing the directory wrote and removed since the last look:
    /// once a [`RESCAN`] period, or sooner when this process wrote a good share of the limit
    /// (the others may have written as much, and the limit is for all of them).
    fn rescan_now_and_then(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.last_scan.load(Relaxed);
        let due = now.saturating_sub(last) >= RESCAN.as_millis() as u64
            || self.written_since_scan.load(Relaxed) >= self.limit / RESCAN_SHARE;
        if !due || self.last_scan.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
            return;
        }
        self.written_since_scan.store(0, Relaxed);
        // Entries used while the scan runs may be missing from it (written after it passed
        // their directory): only those known before it began can be found gone.
        let before = self.ranks().tick();
        let found = scan(&self.dir);
        let on_disk: HashSet<u128> = found.iter().map(|e| e.key).collect();
        let mut r = self.ranks();
        for e in &found {
            if !r.contains(e.key) {
                // Written by another process just now, as far as this one can tell.
                r.insert(e.key, e.len, None);
            }
        }
        for key in r.keys_used_by(before).filter(|k| !on_disk.contains(k)).collect::<Vec<_>>() {
            r.remove(key);
        }
    }

    /// Drop entries, next victim first, until `incoming` more bytes fit under the limit.
    fn evict(&self, incoming: u64) {
        if self.ranks().bytes() + incoming <= self.limit {
            return;
        }
        self.evict_to(self.limit.saturating_sub(incoming));
    }

    /// Whether `incoming` more bytes fit on the disk above its floor ([`super::room`]), after
    /// evicting what must go to make them fit (all of it, at worst). The disk is asked again
    /// after each round: other writers, and readers holding evicted files open, move its
    /// numbers too. A disk whose numbers cannot be had is taken to have room.
    fn make_room(&self, incoming: u64) -> bool {
        loop {
            let Some(space) = (self.space)() else { return true };
            let short = space.shortfall(incoming);
            if short == 0 {
                return true;
            }
            let held = self.ranks().bytes();
            if held == 0 || self.evict_to(held.saturating_sub(short)) == 0 {
                return false;
            }
        }
    }

    /// Drop entries, next victim first, until the cache holds at most `cap` bytes; returns
    /// how many went. One process at a time; the others skip (and try again at their next
    /// write).
    fn evict_to(&self, cap: u64) -> usize {
        let Ok(lock) = std::fs::File::options().create(true).truncate(false).write(true).open(lock_path(&self.dir))
        else {
            return 0;
        };
        if lock.try_lock().is_err() {
            return 0;
        }
        let victims: Vec<u128> = {
            let mut r = self.ranks();
            let mut out = Vec::new();
            while r.bytes() > cap {
                let Some((key, _)) = r.victim() else { break };
                r.remove(key);
                out.push(key);
            }
            out
        };
        {
            // An open file would keep an evicted entry's space.
            let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
            let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            for key in &victims {
                files.pop(key);
                verified.remove(key);
            }
        }
        let gone = victims.len();
        for key in victims {
            // Readers that already opened the file keep reading it; new ones see a miss. One
            // that another process removed first is gone all the same.
            match std::fs::remove_file(self.path(key)) {
                Ok(()) => {
                    self.evictions.fetch_add(1, Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => {}
            }
        }
        let _ = lock.unlock();
        gone
    }
}

fn lock_path(dir: &Path) -> PathBuf {
    dir.join(".evict.lock")
}

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
