//! The disk cache on a stand-in disk: whatever `disk_cache_bytes` says, it never leaves the
//! disk below its floor of free space ([`super::room`]), evicts to stay above it, skips
//! what cannot fit, and gives space back when others filled the disk. The stand-in's free
//! space is its size less what other writers hold less the cache directory's real files, so
//! every write and eviction of the cache moves it as on a real disk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::disk::DiskCache;
use super::room::{Space, SpaceQuery};

const MIB: u64 = 1 << 20;

/// Bytes in the files under `dir`.
fn held(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => held(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// A disk of `total` bytes holding the cache directory `dir` and `others` bytes of others.
fn stand_in(dir: PathBuf, total: u64, others: Arc<AtomicU64>) -> SpaceQuery {
    Arc::new(move || Some(Space { free: total.saturating_sub(others.load(Relaxed) + held(&dir)), total }))
}

#[test]
fn a_limit_larger_than_the_disk_never_takes_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    // 100 MiB, 80 of them taken by others: the floor is 5 MiB, so the cache may hold ~15.
    let others = Arc::new(AtomicU64::new(80 * MIB));
    let space = stand_in(dir.path().to_path_buf(), 100 * MIB, others.clone());
    let cache = DiskCache::open_on(dir.path(), Some(1 << 40), space.clone()).unwrap();
    let block = vec![7u8; MIB as usize];
    for key in 0..40u128 {
        cache.write(key, &block);
        let s = space().unwrap();
        assert!(s.free >= s.floor(), "after block {key}: {} free, floor {}", s.free, s.floor());
    }
    let s = space().unwrap();
    assert!(s.free - s.floor() < 2 * MIB, "it still uses the room there is: {} above the floor", s.free - s.floor());
    assert!(cache.evictions.load(Relaxed) >= 25, "older blocks made room: {}", cache.evictions.load(Relaxed));
    assert_eq!(cache.no_room.load(Relaxed), 0, "eviction was always enough");
    assert!(cache.read(39, MIB as usize).is_some(), "the newest block is there");

    // Others fill the disk past the floor: the next block cannot fit, whatever is evicted.
    others.store(96 * MIB, Relaxed);
    cache.write(100, &block);
    assert_eq!(cache.no_room.load(Relaxed), 1);
    assert!(cache.read(100, MIB as usize).is_none(), "skipped, not half-written");
    assert_eq!(held_blocks(dir.path()), 0, "everything it held went to make room");

    // A cache opened on a disk already below its floor gives back what it holds.
    others.store(80 * MIB, Relaxed);
    for key in 200..210u128 {
        cache.write(key, &block);
    }
    assert!(held_blocks(dir.path()) >= 10 * MIB);
    others.store(92 * MIB, Relaxed);
    let reopened = DiskCache::open_on(dir.path(), Some(1 << 40), space.clone()).unwrap();
    let s = space().unwrap();
    assert!(s.free >= s.floor(), "{} free, floor {}", s.free, s.floor());
    assert!(reopened.evictions.load(Relaxed) > 0);
}

/// Bytes of block files under `dir` (the lock file and the like excluded).
fn held_blocks(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| held(&e.path())).sum()
}

#[test]
fn a_disk_whose_numbers_cannot_be_had_is_written_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open_on(dir.path(), Some(8 * MIB), Arc::new(|| None)).unwrap();
    cache.write(1, &[1u8; 1000]);
    assert!(cache.read(1, 1000).is_some());
    assert_eq!(cache.no_room.load(Relaxed), 0);
}
