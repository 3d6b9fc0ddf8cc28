//! How much of its disk a cache may take. The disk cache and the spill of decoded shards
//! never leave less than a floor of free space on their disk, whatever `disk_cache_bytes`
//! says: a limit larger than the disk (or a disk that other writers fill meanwhile) must not
//! leave it full, failing whatever else writes there (checkpoints, logs). A write that would
//! go below the floor is skipped (best effort, said once); the disk cache first evicts to
//! make room, and gives space back when it finds the disk below the floor.
//!
//! The floor is 5% of the disk, at most 1 GiB: on a small disk a share, on a big one enough
//! for any single writer's burst without holding back a large cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest default size: beyond this a disk cache rarely pays for the space it takes.
pub(crate) const DEFAULT_MAX: u64 = 50 << 30;
/// The smallest default size (unless the disk is nearly full).
pub(crate) const DEFAULT_MIN: u64 = 256 << 20;
/// The floor is this share of the disk (1/20: 5%)...
const FLOOR_SHARE: u64 = 20;
/// ...and at most this.
pub(crate) const FLOOR_MAX: u64 = 1 << 30;

/// A disk's numbers, as `statvfs` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Space {
    /// Bytes an unprivileged writer may still write (`f_bavail`: root's reserve excluded).
    pub(crate) free: u64,
    /// The disk's size.
    pub(crate) total: u64,
}

impl Space {
    /// The numbers of the disk holding `dir`, `None` when they cannot be had (or are no
    /// numbers: a file system that reports a size of 0, as some FUSE ones do, would
    /// otherwise look full).
    pub(crate) fn of(dir: &Path) -> Option<Space> {
        let s = rustix::fs::statvfs(dir).ok()?;
        let space = Space { free: s.f_bavail.saturating_mul(s.f_frsize), total: s.f_blocks.saturating_mul(s.f_frsize) };
        (space.total > 0).then_some(space)
    }

    /// Free space a cache never takes.
    pub(crate) fn floor(&self) -> u64 {
        (self.total / FLOOR_SHARE).min(FLOOR_MAX)
    }

    /// Bytes a cache may still write.
    pub(crate) fn headroom(&self) -> u64 {
        self.free.saturating_sub(self.floor())
    }

    /// Bytes to free before `incoming` more fit above the floor (0: they fit).
    pub(crate) fn shortfall(&self, incoming: u64) -> u64 {
        self.floor().saturating_add(incoming).saturating_sub(self.free)
    }
}

/// Where a cache learns its disk's numbers: the file system, or a test's stand-in disk.
pub(crate) type SpaceQuery = Arc<dyn Fn() -> Option<Space> + Send + Sync>;

/// The numbers of the disk holding `dir`, asked each time.
pub(crate) fn disk_of(dir: PathBuf) -> SpaceQuery {
    Arc::new(move || Space::of(&dir))
}

/// The default size of a disk cache in `dir` that holds `used` bytes: 10% of the space the
/// cache could have (the disk's headroom above the floor plus what it holds already, so the
/// size is the same run after run), between [`DEFAULT_MIN`] (at most half that space) and
/// [`DEFAULT_MAX`].
pub(crate) fn default_limit(dir: &Path, used: u64) -> u64 {
    match Space::of(dir) {
        Some(space) => limit_for(space, used),
        None => DEFAULT_MIN,
    }
}

fn limit_for(space: Space, used: u64) -> u64 {
    let room = space.headroom().saturating_add(used);
    (room / 10).clamp(DEFAULT_MIN.min(room / 2), DEFAULT_MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_floor_is_five_percent_at_most_a_gib() {
        let disk = |total| Space { free: total, total };
        assert_eq!(disk(10 * GIB).floor(), GIB / 2);
        assert_eq!(disk(20 * GIB).floor(), GIB);
        assert_eq!(disk(4000 * GIB).floor(), GIB, "a big disk keeps 1 GiB, not 200");
        let nearly_full = Space { free: GIB / 4, total: 10 * GIB };
        assert_eq!(nearly_full.headroom(), 0);
        assert_eq!(nearly_full.shortfall(0), GIB / 4, "below the floor: a quarter GiB to give back");
        assert_eq!(nearly_full.shortfall(GIB), GIB / 4 + GIB);
        let roomy = Space { free: 3 * GIB, total: 10 * GIB };
        assert_eq!((roomy.headroom(), roomy.shortfall(GIB), roomy.shortfall(3 * GIB)), (5 * GIB / 2, 0, GIB / 2));
    }

    #[test]
    fn the_default_size_is_a_tenth_of_the_room_within_bounds() {
        // 100 GiB free of 1 TiB: a tenth of what is above the 1 GiB floor.
        assert_eq!(limit_for(Space { free: 100 * GIB, total: 1024 * GIB }, 0), 99 * GIB / 10);
        // What the cache holds counts as room: the size does not shrink as it fills.
        assert_eq!(limit_for(Space { free: 90 * GIB, total: 1024 * GIB }, 10 * GIB), 99 * GIB / 10);
        assert_eq!(limit_for(Space { free: 4000 * GIB, total: 8000 * GIB }, 0), DEFAULT_MAX);
        // A nearly full disk: at most half of what is left above the floor, never above it.
        assert_eq!(limit_for(Space { free: GIB + (200 << 20), total: 1024 * GIB }, 0), 100 << 20);
        assert_eq!(limit_for(Space { free: GIB / 2, total: 1024 * GIB }, 0), 1);

        let dir = tempfile::tempdir().unwrap();
        let here = Space::of(dir.path()).unwrap();
        assert_eq!(default_limit(dir.path(), 0), limit_for(here, 0));
        assert!(default_limit(dir.path(), GIB) >= default_limit(dir.path(), 0));
    }
}
