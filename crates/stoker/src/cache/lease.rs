//! Node-wide fetch leases: the processes sharing a disk cache directory (the ranks of a job on
//! one node, DataLoader workers) fetch each missing block once between them, not once each.
//!
//! Before fetching a block it will store, a process takes the block's lease: an advisory lock
//! (`flock`) on one of [`STRIPES`] files in `dir/.leases/`, chosen by the block's key. It holds
//! the lease until the block is on disk. A process that finds the lease taken waits for it,
//! then looks in the directory again: usually the block is there, read from disk instead of
//! fetched again. Ranks of a shard shuffle walk the same window of shards at once, so without
//! this each of `n` ranks fetches most blocks itself (`n` times the data per node).
//!
//! A lease is only ever a saving, never needed for a correct read: a lock that cannot be
//! taken (a file system without `flock`, a read-only directory) or a wait longer than
//! [`WAIT`] (a holder stopped, not dead: the kernel frees the lock of a process that dies) goes
//! on without it, and fetches. Stripes, not one file per block, keep the directory small and
//! never need removing (removing a lock file races with its next taker); two blocks sharing a
//! stripe only make one wait for the other's fetch.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Lock files per cache directory.
const STRIPES: u128 = 4096;
/// The longest a process waits for another's fetch of a block before fetching it itself.
const WAIT: Duration = Duration::from_secs(60);

/// A block's fetch lease, held until dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    _file: File,
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
    /// Nobody: no lease to be had.
    Unleased,
}

impl super::BlockCache {
    /// Whether missing block `key` is free to fetch for the node: `Mine` (this fetch holds its
    /// lease, [`lease`], and should fetch it), `Theirs` (another fetch holds it: better
    /// waited for, alone, than fetched along with other blocks), `Unleased` (no disk cache
    /// to share, or no lease to be had). Never waits.
    pub(crate) fn claim(&self, key: u128) -> Claim {
        match &self.disk {
            Some(d) if !d.read_only => match try_take(&d.dir, key) {
                Ok(Some(l)) => Claim::Mine(l),
                Ok(None) => Claim::Theirs,
                Err(()) => Claim::Unleased,
            },
            _ => Claim::Unleased,
        }
    }
}

fn stripe(dir: &Path, key: u128) -> PathBuf {
    dir.join(".leases").join(format!("{:03x}.lease", key % STRIPES))
}

fn open(dir: &Path, key: u128) -> Option<File> {
    let path = stripe(dir, key);
    let open = |p: &Path| File::options().create(true).truncate(false).write(true).open(p);
    open(&path)
        .or_else(|_| {
            std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
            open(&path)
        })
        .ok()
}

/// Block `key`'s lease in cache directory `dir` if nobody holds it: `Ok(Some)` taken,
/// `Ok(None)` held by another fetch (of this process or another), `Err` no lease to be had.
pub(crate) fn try_take(dir: &Path, key: u128) -> Result<Option<Lease>, ()> {
    let file = open(dir, key).ok_or(())?;
    match file.try_lock() {
        Ok(()) => Ok(Some(Lease { _file: file })),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(_)) => Err(()),
    }
}

/// Take block `key`'s lease in cache directory `dir`, waiting (off the async threads) while
/// another process, or another fetch of this one, holds it.
pub(crate) async fn take(dir: &Path, key: u128) -> Took {
    match try_take(dir, key) {
        Ok(Some(lease)) => return Took::Free(lease),
        Ok(None) => {}
        Err(()) => return Took::Without,
    }
    let Some(file) = open(dir, key) else { return Took::Without };
    // The waiting thread outlives a wait that ran out: it takes the lock when it comes free,
    // finds nobody to hand it to, and drops it at once.
    let waiting = tokio::task::spawn_blocking(move || file.lock().map(|()| file));
    match tokio::time::timeout(WAIT, waiting).await {
        Ok(Ok(Ok(file))) => Took::AfterWait(Lease { _file: file }),
        _ => Took::Without,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_lease_makes_the_next_taker_wait_until_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let Took::Free(first) = take(dir.path(), 7).await else { panic!("nobody held it") };
        // Polled here, not spawned, so its first look (lock taken: wait) is done before the
        // holder lets go.
        let second = take(dir.path(), 7 + STRIPES); // the same stripe
        tokio::pin!(second);
        let waited = tokio::time::timeout(Duration::from_millis(100), &mut second).await;
        assert!(waited.is_err(), "the second taker waits while the lease is held");
        // Another block's lease is not held up by it.
        assert!(matches!(take(dir.path(), 8).await, Took::Free(_)));
        drop(first);
        assert!(matches!(second.await, Took::AfterWait(_)));
    }

    #[tokio::test]
    async fn a_directory_without_room_for_leases_fetches_without_one() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the lease directory should be.
        std::fs::write(dir.path().join(".leases"), b"").unwrap();
        assert!(matches!(take(dir.path(), 1).await, Took::Without));
    }
}
