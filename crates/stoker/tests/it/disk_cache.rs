//! The disk cache across processes: on by default for remote sources in the user's cache
//! directory and reused by the next process; and crash-safe: writers SIGKILLed at random
//! moments mid-write never leave an entry that is later served torn.
//!
//! The processes are this test binary again (`current_exe`), running one `#[ignore]`d test
//! selected by its full name ([`test_name`]), with what it needs in environment variables.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use stoker::cache::{BlockCache, CacheConfig};
use stoker_testkit::rng::XorShift64;

/// The harness's name for this module's test `name`: its module path in the test binary
/// (`disk_cache::name`), without the crate.
fn test_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}

/// Blocks big enough that writing one takes a while, so random kills land mid-write.
const BLOCK: usize = 8 << 20;
/// Keys the writers cycle through, and the blocks the directory holds: writers keep writing
/// new entries and evicting old ones.
const KEYS: u128 = 40;
const HELD: u64 = 6;
const KILLS: usize = 100;
/// Kills that must land mid-write; on a loaded machine a kill lands after the write more
/// often, so the test goes on killing (up to [`MAX_KILLS`]) until this many did.
const MID_WRITE: u64 = KILLS as u64 / 5;
const MAX_KILLS: usize = 4 * KILLS;

/// The bytes block `key` must hold: a pseudo-random base rotated by the key, stamped with it
/// (cheap to make in a debug build, different for every key).
fn content(base: &[u8], key: u128) -> Bytes {
    let at = (key as usize * 4099) % base.len();
    let mut v = Vec::with_capacity(base.len());
    v.extend_from_slice(&base[at..]);
    v.extend_from_slice(&base[..at]);
    v[..16].copy_from_slice(&key.to_le_bytes());
    Bytes::from(v)
}

fn base() -> Vec<u8> {
    let mut rng = XorShift64::new(99);
    (0..BLOCK / 8).flat_map(|_| rng.next_u64().to_le_bytes()).collect()
}

fn cache(dir: &std::path::Path) -> BlockCache {
    let cfg = CacheConfig {
        memory_bytes: 0,
        block: BLOCK as u64,
        disk_dir: Some(dir.to_path_buf()),
        disk_bytes: Some(HELD * BLOCK as u64),
        ..Default::default()
    };
    BlockCache::new(cfg).unwrap()
}

/// Whether a temporary file (a write in progress) is in the cache directory.
fn has_tmp(dir: &std::path::Path) -> bool {
    let subs = std::fs::read_dir(dir).into_iter().flatten().flatten().filter(|e| e.path().is_dir());
    subs.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .any(|f| f.file_name().to_string_lossy().ends_with(".tmp"))
}

/// The child: write blocks through the real cache until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by sigkill_mid_write_never_leaves_a_torn_entry"]
async fn child_writes_blocks_until_killed() {
    let Some(dir) = std::env::var_os("STOKER_TEST_KILL_DIR") else { return };
    let seed: u64 = std::env::var("STOKER_TEST_KILL_SEED").unwrap().parse().unwrap();
    // Made once by the parent: generating it takes longer than the writes in a debug build.
    let base = Arc::new(std::fs::read(std::env::var_os("STOKER_TEST_KILL_BASE").unwrap()).unwrap());
    let cache = cache(std::path::Path::new(&dir));
    println!("ready");
    let mut rng = XorShift64::new(seed);
    loop {
        let key = rng.up_to(KEYS as u64 - 1) as u128;
        let base = base.clone();
        cache.get_or_fetch(key, BLOCK, move || async move { Ok(content(&base, key)) }).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_write_never_leaves_a_torn_entry() {
    let dir = tempfile::tempdir().unwrap();
    let base = Arc::new(base());
    let base_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(base_file.path(), &base[..]).unwrap();
    let mut rng = XorShift64::new(2024);
    let (mut stale, mut from_disk) = (0u64, 0u64);
    let mut kills = 0;
    for kill in 0..MAX_KILLS {
        if kill >= KILLS && stale >= MID_WRITE {
            break;
        }
        kills += 1;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                test_name("child_writes_blocks_until_killed").as_str(),
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("STOKER_TEST_KILL_DIR", dir.path())
            .env("STOKER_TEST_KILL_SEED", kill.to_string())
            .env("STOKER_TEST_KILL_BASE", base_file.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("ready") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the child exited before writing");
        }
        // The moment of the kill is random: anywhere in the first writes, or (every other
        // time, so that many kills land mid-write) shortly after a write has begun.
        if kill % 2 == 1 {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !has_tmp(dir.path()) && std::time::Instant::now() < deadline {
                std::hint::spin_loop();
            }
            // Spun, not slept: a sleep on a busy machine would often outlast the write.
            let at = std::time::Instant::now() + Duration::from_micros(rng.up_to(300));
            while std::time::Instant::now() < at {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(Duration::from_micros(rng.up_to(40_000)));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        // The next process: removes the dead writer's temporary file, and every entry it
        // serves is whole and right.
        let reader = cache(dir.path());
        stale += reader.snapshot().disk_stale_removed;
        // Entries live in the two-hex subdirectories.
        let entry_dirs = |e: &std::fs::DirEntry| e.path().is_dir() && !e.file_name().to_string_lossy().starts_with('.');
        for sub in std::fs::read_dir(dir.path()).unwrap().flatten().filter(entry_dirs) {
            for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                assert!(!name.ends_with(".tmp"), "kill {kill}: {name} left behind");
                let key = u128::from_str_radix(name.trim_end_matches(".blk"), 16).unwrap();
                let what = format!("kill {kill}: entry {name} was not served");
                let got = reader.get_or_fetch(key, BLOCK, || async move { panic!("{what}") }).await.unwrap();
                assert!(got == content(&base, key), "kill {kill}: block {key} is not what was written");
                from_disk += 1;
            }
        }
    }
    // The kills really landed mid-write, and the entries written before them were served.
    assert!(stale >= MID_WRITE, "only {stale} of {kills} kills interrupted a write");
    assert!(from_disk > 0, "no entry of the killed writers was served");
    eprintln!("{stale} of {kills} kills interrupted a write; {from_disk} blocks served from the disk afterwards");
}

/// The child: read every sample of the remote source at `STOKER_TEST_URI` with the default
/// options (the environment says where the user cache is) and print the cache counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the_disk_cache_is_on_by_default_and_the_next_process_reuses_it"]
async fn child_reads_everything_with_defaults() {
    let Ok(uri) = std::env::var("STOKER_TEST_URI") else { return };
    let src = stoker::open(&uri, Default::default()).await.unwrap();
    let all: Vec<usize> = (0..src.len()).collect();
    let samples = src.get_many(&all).await.unwrap();
    assert_eq!(samples.len(), src.len());
    let io = src.io_counters().unwrap();
    println!("counters {} {}", io.cache_misses, io.disk_hits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_cache_is_on_by_default_and_the_next_process_reuses_it() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/tar")).unwrap();
    tar_dir(&root.path().join("data/tar"), 3, 10);
    let server = common::s3::serve(root.path()).await;
    let user_cache = tempfile::tempdir().unwrap();
    // No cache option at all: the URI the user would write.
    let uri = format!(
        "s3://data/tar?endpoint={}&access_key_id={}&secret_access_key={}",
        server.endpoint(),
        common::s3::AK,
        common::s3::SK
    );
    let run = |uri: String, dir: std::path::PathBuf| {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                test_name("child_reads_everything_with_defaults").as_str(),
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("STOKER_TEST_URI", uri)
            .env("STOKER_CACHE_DIR", dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        // The test harness prints its own words around the child's line.
        let line = text.split("counters ").nth(1).and_then(|r| r.lines().next()).unwrap_or_else(|| panic!("{text}"));
        let n: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        (n[0], n[1])
    };
    let dir = user_cache.path().to_path_buf();
    let (u, d) = (uri.clone(), dir.clone());
    let (misses, disk_hits) = tokio::task::spawn_blocking(move || run(u, d)).await.unwrap();
    assert!(misses > 0 && disk_hits == 0, "a cold cache: {misses} misses, {disk_hits} disk hits");
    let blocks = std::fs::read_dir(dir.join("blocks")).unwrap().count();
    assert!(blocks > 0, "the blocks went to $STOKER_CACHE_DIR/blocks");
    let (misses2, disk_hits2) = tokio::task::spawn_blocking(move || run(uri, dir)).await.unwrap();
    assert_eq!(disk_hits2, misses2, "the second process read every block from the first one's cache");
    assert_eq!(misses2, misses);
    server.shutdown().await;
}

/// A cache directory that cannot be made (a file is in the way) costs a warning, not a read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_cache_directory_never_fails_a_read() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/tar")).unwrap();
    let samples = tar_dir(&root.path().join("data/tar"), 2, 5);
    let server = common::s3::serve(root.path()).await;
    let blocker = root.path().join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let extra = format!("&disk_cache_dir={}", blocker.join("blocks").display());
    let src = open(&common::s3::uri(&server.endpoint(), "tar", &extra)).await;
    let got = src.get_many(&(0..src.len()).collect::<Vec<_>>()).await.unwrap();
    assert_eq!(got, samples);
    assert_eq!(src.io_counters().unwrap().disk_hits, 0);
    server.shutdown().await;
}

/// Readers with different block sizes (a Loader in storage order takes 8 MiB blocks, one in
/// a shuffle of all samples 1 MiB) share one directory: each finds its own blocks, and
/// neither takes the other's entry, of another length at the same offset, for damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_with_other_block_sizes_share_one_directory() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use stoker::cache::block_key;
    let dir = tempfile::tempdir().unwrap();
    let sized = |block: u64| {
        let cfg = CacheConfig {
            block,
            disk_dir: Some(dir.path().to_path_buf()),
            disk_bytes: Some(1 << 20),
            ..Default::default()
        };
        BlockCache::new(cfg).unwrap()
    };
    let fetches = Arc::new(AtomicUsize::new(0));
    async fn read_in(c: &BlockCache, fetches: &Arc<AtomicUsize>, block: u64, fill: u8) -> Bytes {
        let f = fetches.clone();
        let fetch = move || async move {
            f.fetch_add(1, Relaxed);
            Ok(Bytes::from(vec![fill; block as usize]))
        };
        c.get_or_fetch(block_key("shard-0.tar", "v1", block, 0), block as usize, fetch).await.unwrap()
    }
    let read = |c, block, fill| read_in(c, &fetches, block, fill);
    let (small, big) = (sized(4096), sized(16384));
    assert_eq!(read(&small, 4096, 1).await, vec![1u8; 4096]);
    small.flush().await;
    assert_eq!(read(&big, 16384, 2).await, vec![2u8; 16384], "its own block, fetched");
    big.flush().await;
    assert_eq!(fetches.load(Relaxed), 2);
    // Fresh caches on the same directory (the next run): both blocks from disk, none damaged.
    let (small, big) = (sized(4096), sized(16384));
    assert_eq!(read(&small, 4096, 9).await, vec![1u8; 4096]);
    assert_eq!(read(&big, 16384, 9).await, vec![2u8; 16384]);
    assert_eq!(fetches.load(Relaxed), 2, "both read from the disk cache");
    for c in [&small, &big] {
        let s = c.snapshot();
        assert_eq!((s.disk_hits, s.disk_corrupt), (1, 0), "{s:?}");
    }
}
