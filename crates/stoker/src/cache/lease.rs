//! Node-wide fetch leases: the processes sharing a disk cache directory (the ranks of a job on
//! one node, DataLoader workers) fetch each missing block once between them, not once each.
//!
//! Before fetching a block it will store, a process takes the block's lease: an advisory
//! lock on one byte of `dir/.leases.lock`, at an offset drawn from the block's key (Linux
//! open-file-description locks, `F_OFD_SETLK`: held per open file, so two fetches of one
//! process exclude each other as two processes do, and freed by the kernel when the holder
//! closes it or dies). It holds the lease until the block is on disk. A process that finds the
//! lease taken waits for it, then looks in the directory again: usually the block is there,
//! read from disk instead of fetched again. Ranks of a shard shuffle walk the same window of
//! shards at once, so without this each of `n` ranks fetches most blocks itself (`n` times the
//! data per node).
//!
//! One file of byte locks, not a lock file per block (or per stripe of blocks): creating
//! files is what costs most when a cache fills (the file system's inode allocation, measured
//! at about a sixth of a cold epoch's CPU), lock files could never be removed safely (removing
//! one races with its next taker), and two blocks contend only if their keys agree in 62 bits.
//!
//! A lease is only ever a saving, never needed for a correct read: a lock that cannot be
//! taken (a file system without these locks, a read-only directory, another system than
//! Linux) or a wait longer than [`WAIT`] (a holder stopped, not dead) goes on without it, and
//! fetches.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::disk::DiskCache;
use super::CacheCounters;

/// The longest a process waits for another's fetch of a block before fetching it itself.
const WAIT: Duration = Duration::from_secs(60);

/// A block's fetch lease, held until dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    file: File,
    key: u128,
}

impl Drop for Lease {
    /// Unlocked, not only closed: an open-file-description lock lasts while any descriptor of
    /// that open file does, and a process forked while this lease was held (DataLoader fork
    /// workers) has a copy of its descriptor that it never closes. Closing alone left the
    /// block's lease held for the child's whole life, and every fetch of the block, in every
    /// process of the node, waited [`WAIT`] for it.
    fn drop(&mut self) {
        unlock(&self.file, self.key);
    }
}

/// What taking a lease found.
#[derive(Debug)]
pub(crate) enum Took {
    /// Taken at once: nobody else was fetching the block.
    Free(Lease),
    /// Taken after another holder let go: it has probably stored the block.
    AfterWait(Lease),
    /// No lease (no lock to be had, or the wait ran out): fetch without one.
    Without,
}

/// Who may fetch a missing block for the node ([`BlockCache::claim`]).
#[derive(Debug)]
pub(crate) enum Claim {
    /// This fetch: it holds the lease.
    Mine(Lease),
    /// Another fetch holds the lease.
    Theirs,
    /// Nobody holds it, and the block is on disk: another process stored it since this one
    /// last looked (it knows of other processes' blocks only from its rescans). Read, not
    /// fetched: a run of blocks fetched together must not fetch it again along with the rest.
    Stored,
    /// Nobody: no lease to be had.
    Unleased,
}

impl super::BlockCache {
    /// Whether missing block `key` is free to fetch for the node: `Mine` (this fetch holds its
    /// lease, [`lease`], and should fetch it), `Theirs` (another fetch holds it: better
    /// waited for, alone, than fetched along with other blocks), `Stored` (on disk after all),
    /// `Unleased` (no disk cache to share, or no lease to be had). Never waits.
    pub(crate) fn claim(&self, key: u128) -> Claim {
        let Some(disk) = self.disk.as_deref() else { return Claim::Unleased };
        match disk.lease_dir().map(|dir| try_take(dir, key)) {
            // Checked with the lease held: whoever stored it let go of it after the write.
            Some(Claim::Mine(_)) if disk.on_disk(key) => Claim::Stored,
            Some(claim) => claim,
            None => Claim::Unleased,
        }
    }
}

impl DiskCache {
    /// Where this cache's leases are taken: its directory, unless it is only read (a process
    /// that stores nothing has nothing to share).
    pub(super) fn lease_dir(&self) -> Option<&Path> {
        (!self.read_only).then_some(self.dir.as_path())
    }

    /// Whether block `key` has a file in the directory now, whoever wrote it (one `stat`;
    /// not verified: a damaged one is refused when read).
    pub(super) fn on_disk(&self, key: u128) -> bool {
        std::fs::symlink_metadata(self.path(key)).is_ok()
    }
}

/// A miss of block `key` (`len` bytes) in disk cache `d`: the block as stored (by another
/// process, or earlier), or else the lease to fetch it under (`held`, if the caller holds it
/// already; `None` when none is to be had). Another process on the node may be fetching it:
/// this waits for it and reads what it stored, rather than fetch it again.
pub(super) async fn stored_or_lease(
    d: &Arc<DiskCache>,
    key: u128,
    len: usize,
    held: Option<Lease>,
    counters: &CacheCounters,
) -> Result<Bytes, Option<Lease>> {
    let from_disk = || {
        let d = d.clone();
        tokio::task::spawn_blocking(move || d.read(key, len))
    };
    if let Ok(Some(b)) = from_disk().await {
        return Ok(b);
    }
    let Some(dir) = d.lease_dir().filter(|_| held.is_none()) else { return Err(held) };
    // Looked at again once the lease is held, whether it was taken at once or not: a holder
    // that stored the block may have let go of it since the first look.
    match take(dir, key).await {
        // A stat first: nearly always absent, and a read is a trip to the blocking pool.
        Took::Free(l) if !d.on_disk(key) => Err(Some(l)),
        Took::Free(l) => from_disk().await.ok().flatten().ok_or(Some(l)),
        Took::AfterWait(l) => match from_disk().await {
            Ok(Some(b)) => {
                counters.lease_waits.fetch_add(1, Relaxed);
                Ok(b)
            }
            _ => Err(Some(l)),
        },
        Took::Without => Err(None),
    }
}

/// The lock file of cache directory `dir`, opened anew (each lease its own open file).
fn open(dir: &Path) -> Option<File> {
    File::options().create(true).truncate(false).write(true).open(dir.join(".leases.lock")).ok()
}

/// The byte of the lock file that stands for block `key`.
fn byte(key: u128) -> i64 {
    (key as u64 >> 2) as i64
}

/// Lock block `key`'s byte of `file`, waiting for it with `wait`: `Ok(false)` when another
/// open file holds it and `wait` is off.
#[cfg(target_os = "linux")]
fn lock(file: &File, key: u128) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero is a valid `flock` (plain integers); the fields that matter are set.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as _;
    l.l_whence = libc::SEEK_SET as _;
    l.l_start = byte(key);
    l.l_len = 1;
    // SAFETY: `file` is open for the call's length, and `l` outlives it.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &l) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn lock(_: &File, _: u128) -> std::io::Result<bool> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Let go of block `key`'s byte of `file` (best effort: closing the file lets go too, when no
/// forked copy of it is left).
#[cfg(target_os = "linux")]
fn unlock(file: &File, key: u128) {
    use std::os::fd::AsRawFd;
    // SAFETY: as in `lock`.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_UNLCK as _;
    l.l_whence = libc::SEEK_SET as _;
    l.l_start = byte(key);
    l.l_len = 1;
    // SAFETY: as in `lock`.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &l) };
}

#[cfg(not(target_os = "linux"))]
fn unlock(_: &File, _: u128) {}

/// Block `key`'s lease in cache directory `dir` if nobody holds it, without waiting.
fn try_take(dir: &Path, key: u128) -> Claim {
    let Some(file) = open(dir) else { return Claim::Unleased };
    match lock(&file, key) {
        Ok(true) => Claim::Mine(Lease { file, key }),
        Ok(false) => Claim::Theirs,
        Err(_) => Claim::Unleased,
    }
}

/// Take block `key`'s lease in cache directory `dir`, waiting (off the async threads) while
/// another process, or another fetch of this one, holds it.
pub(crate) async fn take(dir: &Path, key: u128) -> Took {
    match try_take(dir, key) {
        Claim::Mine(lease) => return Took::Free(lease),
        // (`Stored` is `claim`'s word, never `try_take`'s.)
        Claim::Theirs | Claim::Stored => {}
        Claim::Unleased => return Took::Without,
    }
    let Some(file) = open(dir) else { return Took::Without };
    // Asked again and again without blocking, on a timer: a blocking wait on a thread of its
    // own outlived a wait that ran out (a holder stopped, not dead), and a runtime being shut
    // down waits for its blocking threads: it hung until the holder went on. The first looks
    // are soon after (a fetch of one block by another process takes tens of milliseconds).
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut pause = Duration::from_millis(2);
    loop {
        match lock(&file, key) {
            Ok(true) => return Took::AfterWait(Lease { file, key }),
            Ok(false) => {}
            Err(_) => return Took::Without,
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Took::Without;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// The longest pause between two looks at a lease another process holds.
const POLL_MAX: Duration = Duration::from_millis(25);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_lease_makes_the_next_taker_wait_until_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let Took::Free(first) = take(dir.path(), 7).await else { panic!("nobody held it") };
        // Polled here, not spawned, so its first look (lock taken: wait) is done before the
        // holder lets go.
        let second = take(dir.path(), 7);
        tokio::pin!(second);
        let waited = tokio::time::timeout(Duration::from_millis(100), &mut second).await;
        assert!(waited.is_err(), "the second taker waits while the lease is held");
        // Another block's lease is not held up by it.
        assert!(matches!(take(dir.path(), 8).await, Took::Free(_)));
        drop(first);
        assert!(matches!(second.await, Took::AfterWait(_)));
    }

    /// A runtime shut down while one of its reads waits for a lease another process holds
    /// (stopped, not dead) ends at once: the wait is no blocking thread it must wait for.
    #[test]
    fn a_wait_for_a_lease_held_elsewhere_does_not_hold_up_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let holder = tokio::runtime::Runtime::new().unwrap();
        let Took::Free(held) = holder.block_on(take(dir.path(), 7)) else { panic!("nobody held it") };
        let waiter = tokio::runtime::Runtime::new().unwrap();
        let path = dir.path().to_path_buf();
        waiter.spawn(async move { take(&path, 7).await });
        std::thread::sleep(Duration::from_millis(50));
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(waiter);
            let _ = done.send(());
        });
        let quick = ended.recv_timeout(Duration::from_secs(5)).is_ok();
        drop(held); // lets a blocked waiter (the previous design) go, so the test ends either way
        assert!(quick, "the runtime's shutdown waited for the lease's holder");
    }

    #[tokio::test]
    async fn a_directory_without_room_for_leases_fetches_without_one() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the lock file should be.
        std::fs::create_dir(dir.path().join(".leases.lock")).unwrap();
        assert!(matches!(take(dir.path(), 1).await, Took::Without));
    }

    /// A process forked while a lease is held (a DataLoader's fork workers) keeps a copy of
    /// the lease's descriptor for its whole life; the lease must still end when its holder
    /// drops it.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_lease_ends_when_dropped_though_a_forked_child_has_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let Claim::Mine(lease) = try_take(dir.path(), 7) else { panic!("nobody held it") };
        let mut fds = [0; 2];
        // SAFETY: a pipe into a two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only makes async-signal-safe calls (read, _exit): it waits for the
        // parent's word, holding its copies of every descriptor meanwhile, then leaves.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let mut b = 0u8;
            unsafe {
                libc::read(fds[0], (&raw mut b).cast(), 1);
                libc::_exit(0);
            }
        }
        drop(lease);
        let after = try_take(dir.path(), 7);
        // SAFETY: the child's pipe and pid, ours to end.
        unsafe {
            libc::write(fds[1], [1u8].as_ptr().cast(), 1);
            libc::waitpid(child, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(matches!(after, Claim::Mine(_)), "the dropped lease was still held: {after:?}");
    }
}
