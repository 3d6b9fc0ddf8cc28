//! Tests of what a read does when the disk cache's writes fall behind it
//! ([`crate::uri::Behind`]): the write-behind budget taken by the test stands for a disk that
//! has not kept up.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{BlockCache, CacheConfig, WRITE_BEHIND_KIB};
use crate::uri::Behind;

fn cache(dir: &std::path::Path, behind: Behind) -> BlockCache {
    let cfg = CacheConfig {
        block: 4096,
        disk_dir: Some(dir.into()),
        disk_bytes: Some(1 << 20),
        behind,
        ..Default::default()
    };
    BlockCache::new(cfg).unwrap()
}

/// Block 7 through `c`, counting fetches in `fetches`.
async fn get(c: &BlockCache, fetches: &Arc<AtomicUsize>) -> crate::error::Result<Bytes> {
    let f = fetches.clone();
    c.get_or_fetch(7, 4096, move || async move {
        f.fetch_add(1, Relaxed);
        Ok(Bytes::from(vec![7u8; 4096]))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_reads_on_without_storing_and_a_later_read_fetches_and_stores() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), Behind::Skip);
    let fetches = Arc::new(AtomicUsize::new(0));
    // The disk is behind: every byte of the write-behind budget is waiting.
    let held = c.write_budget.clone().acquire_many_owned(WRITE_BEHIND_KIB).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), get(&c, &fetches)).await.expect("the read does not wait");
    assert_eq!(got.unwrap()[0], 7);
    let s = c.snapshot();
    assert_eq!((s.disk_writes, s.disk_behind), (0, 1), "{s:?}");
    assert!(!c.contains(7), "a skipped block is not counted as held");
    drop(held);
    // The disk caught up: the next read fetches the block again and stores it.
    get(&c, &fetches).await.unwrap();
    c.flush().await;
    assert_eq!(fetches.load(Relaxed), 2);
    assert_eq!(c.snapshot().disk_writes, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_holds_the_read_until_the_disk_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(cache(dir.path(), Behind::Wait));
    let held = c.write_budget.clone().acquire_many_owned(WRITE_BEHIND_KIB).await.unwrap();
    let c2 = c.clone();
    let read = tokio::spawn(async move {
        c2.get_or_fetch(7, 4096, || async { Ok(Bytes::from(vec![7u8; 4096])) }).await.map(|b| b[0])
    });
    tokio::pin!(read);
    assert!(tokio::time::timeout(Duration::from_millis(200), &mut read).await.is_err(), "the read waits");
    drop(held);
    assert_eq!(read.await.unwrap().unwrap(), 7);
    c.flush().await;
    assert_eq!(c.snapshot().disk_writes, 1);
}
