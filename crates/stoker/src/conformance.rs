//! The shared test suite every source must pass.
//!
//! Each check is a plain `pub async fn` taking a source and what it should contain; each
//! layout's (and later each store's) tests call [`run_all`]. Checks panic with a message
//! naming the source and the sample on failure, like `assert!` in a test.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::batch::BatchPool;
use crate::error::Error;
use crate::sample::Sample;
use crate::source::DynSampleSource;

/// Run every check. `display_must_contain` is a part of the URI that `Display` must show;
/// `secrets` are strings that must never appear in `Display` or `Debug`.
pub async fn run_all(src: Arc<DynSampleSource>, expected: &[Sample], display_must_contain: &str, secrets: &[&str]) {
    check_len(&*src, expected).await;
    check_every_sample(&*src, expected).await;
    check_get_many(&*src, expected).await;
    check_get_many_into(&*src, expected).await;
    check_concurrent_gets(src.clone(), expected).await;
    check_out_of_range(&*src).await;
    check_meta(&*src, expected).await;
    check_capability(&*src).await;
    check_display(&*src, display_must_contain, secrets);
}

fn same(src: &DynSampleSource, index: usize, got: &Sample, want: &Sample) {
    assert_eq!(got.key, want.key, "{src}: key of sample {index}");
    let names = |s: &Sample| s.field_names().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{src}: field names of sample {index} ({})", want.key);
    for (g, w) in got.fields.iter().zip(&want.fields) {
        assert!(g.data == w.data, "{src}: bytes of field `{}` of sample {index} ({}) differ", w.name, want.key);
    }
}

/// The source has exactly the expected number of samples.
pub async fn check_len(src: &DynSampleSource, expected: &[Sample]) {
    assert_eq!(src.len(), expected.len(), "{src}: number of samples");
    assert_eq!(src.is_empty(), expected.is_empty(), "{src}: is_empty");
}

/// `get(i)` returns every sample's key, field names and bytes.
pub async fn check_every_sample(src: &DynSampleSource, expected: &[Sample]) {
    for (i, want) in expected.iter().enumerate() {
        let got = src.get(i).await.unwrap_or_else(|e| panic!("{src}: get({i}) failed: {e}"));
        same(src, i, &got, want);
    }
}

/// `get_many` equals individual gets, in the order asked, for forward, reversed, scattered
/// and repeated indices, and for an empty request.
pub async fn check_get_many(src: &DynSampleSource, expected: &[Sample]) {
    let n = expected.len();
    let forward: Vec<usize> = (0..n).collect();
    let reversed: Vec<usize> = (0..n).rev().collect();
    // A fixed scatter with repeats: stride through the source twice.
    let scattered: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).chain((0..n.min(5)).map(|i| i % n)).collect();
    for (what, idx) in [("forward", &forward), ("reversed", &reversed), ("scattered", &scattered)] {
        let got = src.get_many(idx).await.unwrap_or_else(|e| panic!("{src}: get_many({what}) failed: {e}"));
        assert_eq!(got.len(), idx.len(), "{src}: get_many({what}) length");
        for (g, &i) in got.iter().zip(idx.iter()) {
            same(src, i, g, &expected[i]);
        }
    }
    let none = src.get_many(&[]).await.unwrap_or_else(|e| panic!("{src}: get_many([]) failed: {e}"));
    assert!(none.is_empty(), "{src}: get_many([]) must be empty");
}

/// `get_many_into` writes the same keys and bytes as `get` into a batch, in order, and a bad
/// index leaves only the rows before it.
pub async fn check_get_many_into(src: &DynSampleSource, expected: &[Sample]) {
    let n = expected.len();
    let pool = BatchPool::new(2);
    let order: Vec<usize> = (0..n).rev().chain(0..n.min(3)).collect();
    let mut b = pool.builder();
    src.get_many_into(&order, &mut b).await.unwrap_or_else(|e| panic!("{src}: get_many_into failed: {e}"));
    let batch = b.finish(0, 0);
    assert_eq!(batch.len(), order.len(), "{src}: get_many_into rows");
    for (row, &i) in order.iter().enumerate() {
        let want = &expected[i];
        assert_eq!(batch.indices()[row], i as u64, "{src}: get_many_into index of row {row}");
        assert_eq!(batch.key(row), Some(want.key.as_str()), "{src}: get_many_into key of row {row}");
        for f in &want.fields {
            let col = batch.field(&f.name).unwrap_or_else(|| panic!("{src}: get_many_into lost field {}", f.name));
            assert!(col.get(row) == Some(&f.data[..]), "{src}: get_many_into bytes of `{}` in row {row}", f.name);
        }
    }
    let mut b = pool.builder();
    let bad = src.get_many_into(&[0, n], &mut b).await;
    assert!(matches!(bad, Err(Error::IndexOutOfRange { .. })), "{src}: get_many_into with a bad index should fail");
    assert!(b.rows() <= 1, "{src}: rows after a failed get_many_into");
}

/// Many tasks reading at once all get the right bytes.
pub async fn check_concurrent_gets(src: Arc<DynSampleSource>, expected: &[Sample]) {
    let expected: Arc<Vec<Sample>> = Arc::new(expected.to_vec());
    let tasks = 16;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (src, expected) = (src.clone(), expected.clone());
            tokio::spawn(async move {
                for i in (t..expected.len()).step_by(tasks) {
                    let got = src.get(i).await.unwrap_or_else(|e| panic!("{src}: concurrent get({i}) failed: {e}"));
                    same(&*src, i, &got, &expected[i]);
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap_or_else(|e| panic!("a concurrent reader task failed: {e}"));
    }
}

/// An index past the end is an `IndexOutOfRange` error, for `get`, `get_many` and `meta`.
pub async fn check_out_of_range(src: &DynSampleSource) {
    let n = src.len();
    for bad in [n, n + 1, usize::MAX] {
        match src.get(bad).await {
            Err(Error::IndexOutOfRange { index, len }) => assert_eq!((index, len), (bad, n), "{src}"),
            other => panic!("{src}: get({bad}) should be IndexOutOfRange, got {other:?}"),
        }
        assert!(
            matches!(src.meta(bad).await, Err(Error::IndexOutOfRange { .. })),
            "{src}: meta({bad}) should be IndexOutOfRange"
        );
    }
    let mixed = [0, n];
    assert!(
        matches!(src.get_many(&mixed).await, Err(Error::IndexOutOfRange { .. })),
        "{src}: get_many with one bad index should fail"
    );
}

/// `meta(i)` agrees with the sample's key and field sizes.
pub async fn check_meta(src: &DynSampleSource, expected: &[Sample]) {
    for (i, want) in expected.iter().enumerate() {
        let got = src.meta(i).await.unwrap_or_else(|e| panic!("{src}: meta({i}) failed: {e}"));
        assert_eq!(got, want.meta(), "{src}: meta({i})");
    }
}

/// What `capability()` claims holds: locality names shards, coalescing saves requests.
pub async fn check_capability(src: &DynSampleSource) {
    let cap = src.capability();
    let info = src.info();
    let n = src.len();
    assert!(cap.random_access, "{src}: every source here is random access");
    if cap.locality {
        let shards: BTreeSet<usize> = (0..n)
            .map(|i| src.locality(i).unwrap_or_else(|| panic!("{src}: claims locality but locality({i}) is None")))
            .collect();
        assert!(shards.iter().all(|&s| s < info.shards), "{src}: locality names a shard past {}", info.shards);
        assert!(src.locality(n).is_none(), "{src}: locality past the end must be None");
    } else {
        assert!((0..n).all(|i| src.locality(i).is_none()), "{src}: no locality claimed but locality(i) answers");
    }
    if cap.coalesced_reads && n >= 4 {
        let before = src.io_counters().unwrap_or_else(|| panic!("{src}: coalescing sources must count requests"));
        let run: Vec<usize> = (0..n.min(64)).collect();
        src.get_many(&run).await.unwrap_or_else(|e| panic!("{src}: get_many failed: {e}"));
        let after = src.io_counters().unwrap_or_default();
        let requests = after.requests - before.requests;
        assert!(
            requests < run.len() as u64,
            "{src}: claims coalesced reads but {} adjacent samples took {requests} requests",
            run.len()
        );
    }
}

/// `Display` and `Debug` show where the source is and never a secret.
pub fn check_display(src: &DynSampleSource, must_contain: &str, secrets: &[&str]) {
    let shown = src.to_string();
    let debug = format!("{src:?}");
    assert!(shown.contains(must_contain), "Display `{shown}` should contain `{must_contain}`");
    for s in secrets {
        assert!(!shown.contains(s), "Display leaks a secret: {shown}");
        assert!(!debug.contains(s), "Debug leaks a secret: {debug}");
    }
}
