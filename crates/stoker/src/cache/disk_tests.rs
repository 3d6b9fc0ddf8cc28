//! Tests of the disk cache (`super`).

use super::*;

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
fn the_hit_path_reads_any_span_verified_and_refuses_a_damaged_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path(), Some(1 << 30)).unwrap();
    let c = seal::CHUNK as usize;
    let data: Vec<u8> = (0..5 * c + 123).map(|i| (i * 13 % 251) as u8).collect();
    cache.write(3, &data);
    let f = cache.open_block(3, data.len() as u64).unwrap();
    let n = data.len();
    // Inside one chunk, across chunk edges, whole chunks, up to the short last chunk.
    for (at, len) in [(0, 1), (5, 10), (c - 1, 2), (c, c), (c / 2, 3 * c), (0, n), (n - 1, 1), (4 * c, n - 4 * c)] {
        let mut dst = vec![0u8; len];
        assert!(f.read_verified(&mut dst, at as u64).unwrap(), "{at}+{len}");
        assert_eq!(dst, &data[at..at + len], "{at}+{len}");
    }
    let mut past = vec![0u8; 2];
    assert!(f.read_verified(&mut past, n as u64 - 1).is_err());
    // One flipped byte in chunk 2: reads that touch it are refused, others still verify.
    let mut file = std::fs::read(cache.path(3)).unwrap();
    file[2 * c + 7] ^= 0x80;
    std::fs::write(cache.path(3), &file).unwrap();
    let fresh = DiskCache::open(dir.path(), Some(1 << 30)).unwrap();
    let f = fresh.open_block(3, data.len() as u64).unwrap();
    let mut dst = vec![0u8; 10];
    assert!(f.read_verified(&mut dst, 0).unwrap());
    assert!(!f.read_verified(&mut dst, 2 * c as u64 + 100).unwrap(), "an edge chunk checked");
    let mut dst = vec![0u8; 3 * c];
    assert!(!f.read_verified(&mut dst, c as u64).unwrap(), "a whole chunk checked");
    // The whole-block path refuses it too, counts it and drops the file.
    assert!(fresh.read(3, data.len()).is_none());
    assert_eq!(fresh.corrupt.load(Relaxed), 1);
    assert!(!cache.path(3).exists());
}

#[test]
fn a_block_this_process_wrote_is_not_hashed_again_but_another_file_in_its_place_is() {
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path(), Some(1 << 30)).unwrap();
    let c = seal::CHUNK as usize;
    let data: Vec<u8> = (0..3 * c + 5).map(|i| (i * 7 % 253) as u8).collect();
    let (len, chunks) = (data.len() as u64, seal::chunks(data.len() as u64));
    cache.write(7, &data);
    // Its digests were taken from these bytes as they were written: to this process, that
    // file is verified.
    let id = |c: &DiskCache| FileId::of(&std::fs::metadata(c.path(7)).unwrap());
    assert!(cache.verified_of(7, id(&cache), len).all(chunks.clone()));
    assert_eq!(cache.read(7, data.len()).as_deref(), Some(&data[..]));
    // Another process, or the next run, checks it.
    let other = DiskCache::open(dir.path(), Some(1 << 30)).unwrap();
    assert!(!other.verified_of(7, id(&other), len).all(chunks.clone()));
    // A damaged file put in its place (another identity) is checked, refused and dropped.
    let mut bytes = std::fs::read(cache.path(7)).unwrap();
    bytes[c + 1] ^= 1;
    let swap = dir.path().join("swap");
    std::fs::write(&swap, &bytes).unwrap();
    std::fs::rename(&swap, cache.path(7)).unwrap();
    assert!(cache.read(7, data.len()).is_none());
    assert_eq!(cache.corrupt.load(Relaxed), 1);
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
