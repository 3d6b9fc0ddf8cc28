//! Parquet sources: files written by pyarrow and Hugging Face `datasets`, local and over S3.

use crate::common;

use std::path::Path;

use common::s3::{uri, SK};
use common::*;
use stoker::conformance::run_all;
use stoker::{Error, Layout, Sample};

/// Write `kind` with the real writer into `dir`; the samples it holds.
fn fixture(kind: &str, dir: &Path) -> Vec<Sample> {
    script_fixture(&writers_python(), "write_parquet.py", &[kind], dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_and_hf_datasets_files_read_back_field_by_field_local_and_over_s3() {
    let root = tempfile::tempdir().unwrap();
    let (a, hf) = (root.path().join("data/pa"), root.path().join("data/hf"));
    let (want_a, want_hf) = (fixture("pyarrow", &a), fixture("hf", &hf));
    for (dir, want) in [(&a, &want_a), (&hf, &want_hf)] {
        let src = open(dir.to_str().unwrap()).await;
        assert_eq!(src.info().known_layout(), Some(Layout::Parquet));
        run_all(src, want, "parquet", &[]).await;
    }
    // Row groups are the shards: 23 rows in groups of 6 and 17 rows in groups of 6.
    let src = open(a.to_str().unwrap()).await;
    assert_eq!(src.info().shards, 4 + 3);
    assert_eq!(src.locality(0), Some(0));
    assert_eq!(src.locality(6), Some(1));
    assert_eq!(src.locality(23), Some(4));
    assert!(src.location(23).unwrap().contains("part-00001.parquet"), "{:?}", src.location(23));

    let server = common::s3::serve(root.path()).await;
    for (path, want) in [("pa", &want_a), ("hf/train-00000-of-00001.parquet", &want_hf)] {
        let src = open(&uri(&server.endpoint(), path, "")).await;
        assert_eq!(src.info().known_layout(), Some(Layout::Parquet));
        run_all(src, want, "s3://data/", &[SK]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_project_and_a_random_row_reads_only_its_pages() {
    let root = tempfile::tempdir().unwrap();
    let want = fixture("pyarrow", root.path());
    let dir = root.path().display();
    let src = open(&format!("{dir}?columns=cls,emb")).await;
    for (i, w) in want.iter().enumerate() {
        let got = src.get(i).await.unwrap();
        let kept: Vec<_> = w.fields.iter().filter(|f| matches!(&*f.name, "cls" | "emb")).cloned().collect();
        assert_eq!((got.key.as_str(), &got.fields), (w.key.as_str(), &kept));
    }
    let e = stoker::open(&format!("{dir}?columns=cls,nope"), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::InvalidOption { .. }) && e.to_string().contains("nope"), "{e}");
    assert!(e.to_string().contains("jpg") && e.to_string().contains("emb"), "the real columns are listed: {e}");

    // One row of a row group holding ~190 KiB of images: only its pages are read.
    let src = open(&format!("{dir}?columns=jpg")).await;
    let before = src.io_counters().unwrap().bytes;
    let got = src.get(2).await.unwrap();
    assert_eq!(
        got,
        Sample { fields: want[2].fields.iter().filter(|f| &*f.name == "jpg").cloned().collect(), ..want[2].clone() }
    );
    let read = src.io_counters().unwrap().bytes - before;
    let group: u64 =
        want[..6].iter().flat_map(|s| s.fields.iter()).filter(|f| &*f.name == "jpg").map(|f| f.data.len() as u64).sum();
    assert!(read < group / 2, "one row read {read} bytes of a row group of {group}");

    // Batches of a data set that fits the decoded-group budget decode each group once: a
    // second shuffled pass reads nothing.
    let src = open(&dir.to_string()).await;
    let mut order: Vec<usize> = (0..want.len()).collect();
    order.reverse();
    for pass in 0..2 {
        let before = src.io_counters().unwrap().requests;
        for chunk in order.chunks(5) {
            let got = src.get_many(chunk).await.unwrap();
            for (&i, g) in chunk.iter().zip(&got) {
                assert_eq!(g, &want[i]);
            }
        }
        let requests = src.io_counters().unwrap().requests - before;
        assert!((pass == 0) == (requests > 0), "pass {pass}: {requests} requests");
        order.rotate_left(3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parquet_is_a_clear_error() {
    let root = tempfile::tempdir().unwrap();
    let want = fixture("pyarrow", root.path());
    assert!(!want.is_empty());
    let file = root.path().join("part-00001.parquet");
    let bytes = std::fs::read(&file).unwrap();
    // A footer cut short.
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let e = stoker::open(root.path().to_str().unwrap(), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::BadIndex { .. }), "{e:?}");
    assert!(e.to_string().contains("part-00001.parquet") && e.to_string().contains("truncated"), "{e}");
    // Garbage named .parquet.
    std::fs::write(&file, b"not parquet at all, just text that is long enough").unwrap();
    let e = stoker::open(root.path().to_str().unwrap(), Default::default()).await.unwrap_err();
    assert!(e.to_string().contains("part-00001.parquet") && e.to_string().contains("not Parquet"), "{e}");
    std::fs::remove_file(&file).unwrap();

    // A column with no field form is refused, naming it; columns= leaving it out reads.
    let py = writers_python();
    let out = root.path().join("map");
    std::fs::create_dir_all(&out).unwrap();
    let script = format!(
        "import pyarrow as pa, pyarrow.parquet as pq\n\
         t = pa.table({{'m': pa.array([[('a', 1)], [('b', 2)]], type=pa.map_(pa.string(), pa.int32())), 'x': [1, 2]}})\n\
         pq.write_table(t, '{}/m.parquet')\n",
        out.display()
    );
    let ok = std::process::Command::new(&py).arg("-c").arg(&script).status().unwrap();
    assert!(ok.success());
    let e = stoker::open(out.to_str().unwrap(), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::NotSupported { .. }) && e.to_string().contains("`m`"), "{e}");
    assert!(e.to_string().contains("columns="), "{e}");
    let src = open(&format!("{}?columns=x", out.display())).await;
    assert_eq!(src.get(1).await.unwrap().field("x").map(|b| b.to_vec()), Some(b"2".to_vec()));

    // Columns that would share a field (one hiding the other in every sample), and a
    // `__key__` column that is not text, are refused naming them.
    let cases = [
        ("dup", "pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=['x', 'x'])", "field `x`"),
        (
            "path",
            "pa.table({'a': pa.array([{'bytes': b'1', 'path': 'p'}] * 2), 'a.path': ['q', 'r']})",
            "field `a.path`",
        ),
        ("intkey", "pa.table({'__key__': [1, 2], 'x': [1, 2]})", "keys are text"),
    ];
    for (name, table, why) in cases {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "import pyarrow as pa, pyarrow.parquet as pq\npq.write_table({table}, '{}/t.parquet')\n",
            dir.display()
        );
        assert!(std::process::Command::new(&py).arg("-c").arg(&script).status().unwrap().success(), "{name}");
        let e = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err();
        assert!(e.to_string().contains(why) && e.to_string().contains("t.parquet"), "{name}: {e}");
    }
}

/// A shuffled pass reading `order` in batches of `batch` through `get_many`, checking every
/// sample; the bytes the source read from its store.
async fn shuffled_pass(src: &stoker::DynSampleSource, want: &[Sample], order: &[usize], batch: usize) -> u64 {
    let before = src.io_counters().unwrap().bytes;
    for chunk in order.chunks(batch) {
        let got = src.get_many(chunk).await.unwrap();
        for (&i, g) in chunk.iter().zip(&got) {
            assert_eq!(g, &want[i], "sample {i}");
        }
    }
    src.io_counters().unwrap().bytes - before
}

/// Shards decoded whole that memory cannot keep (Parquet row groups, LitData record batches)
/// are spilled with their unread rows: a shuffled pass then decodes each shard about once,
/// where without the spill (`disk_cache=false`, the control) it decodes them again and again.
/// A sequential pass reads right either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_dropped_from_memory_with_rows_unread_are_spilled_not_decoded_again() {
    let root = tempfile::tempdir().unwrap();
    let (pq, ld) = (root.path().join("pq"), root.path().join("ld"));
    let want_pq = fixture("pyarrow", &pq);
    let want_ld = script_fixture(&writers_python(), "write_records.py", &["litdata-rows"], &ld);
    let cache = root.path().join("cache");
    for (dir, want, files) in [(&pq, &want_pq, "parquet"), (&ld, &want_ld, "bin")] {
        let size: u64 = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == files))
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        // A stride walk: every batch takes rows of several shards, and each shard is
        // touched again much later.
        let n = want.len();
        let order: Vec<usize> = (0..n).map(|i| (i * 7) % n).collect();
        assert_eq!(order.iter().collect::<std::collections::HashSet<_>>().len(), n, "a permutation");
        let base = format!("{}?decoded_bytes=1&disk_cache_dir={}", dir.display(), cache.display());
        let spilled = shuffled_pass(&*open(&base).await, want, &order, 4).await;
        let control = shuffled_pass(&*open(&format!("{base}&disk_cache=false")).await, want, &order, 4).await;
        assert!(spilled <= size + size / 4, "{files}: with the spill {spilled} bytes read of {size}");
        assert!(control >= 2 * spilled, "{files}: without it {control} bytes, with it {spilled}");
        eprintln!("{files}: {size} bytes; a shuffled pass read {spilled} with the spill, {control} without");
        let sequential: Vec<usize> = (0..n).collect();
        shuffled_pass(&*open(&base).await, want, &sequential, 4).await;
        run_all(open(&base).await, want, "decoded_bytes=1", &[]).await;
    }
}

/// Every row group decoded whole is also written to the spill, so the next pass, sequential
/// too, reads the file no more (with the spill's writes done); without the spill
/// (`disk_cache=false`, the control) every pass reads and decodes the file again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sequential_pass_over_parquet_reads_the_spill_not_the_file() {
    let root = tempfile::tempdir().unwrap();
    let pq = root.path().join("pq");
    let want = fixture("pyarrow", &pq);
    let cache = root.path().join("cache");
    let sequential: Vec<usize> = (0..want.len()).collect();
    // Nothing stays decoded in memory: what a later pass gets without a decode is the spill's.
    let base = format!("{}?decoded_bytes=1&disk_cache_dir={}", pq.display(), cache.display());
    for (options, spilled) in [("", true), ("&disk_cache=false", false)] {
        let src = open(&format!("{base}{options}")).await;
        let first = shuffled_pass(&*src, &want, &sequential, 4).await;
        assert!(first > 0, "{options}: the first pass read the files");
        src.flush().await;
        let second = shuffled_pass(&*src, &want, &sequential, 4).await;
        if spilled {
            assert_eq!(second, 0, "the second pass read {second} bytes of the files");
        } else {
            assert!(second >= first / 2, "without the spill the second pass read {second} bytes, the first {first}");
        }
    }
}

/// Parquet files, MDS shards and LitData chunks on S3 are read through the block cache like
/// tar shards: after one pass (and the cache's write-behind), a second pass, also by a new
/// source as the next run would open, fetches nothing from the store and reads right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_formats_go_through_the_disk_cache_and_the_next_pass_fetches_nothing() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let mut sets = vec![("pq", fixture("pyarrow", &data.join("pq")))];
    for kind in ["mds", "litdata-rows"] {
        sets.push((kind, script_fixture(&writers_python(), "write_records.py", &[kind], &data.join(kind))));
    }
    let server = common::s3::serve(root.path()).await;
    let cache = root.path().join("cache");
    for (path, want) in &sets {
        let u = uri(&server.endpoint(), path, &format!("&disk_cache_dir={}", cache.display()));
        let order: Vec<usize> = (0..want.len()).rev().collect();
        let first = open(&u).await;
        let fetched = |s: &stoker::DynSampleSource| s.io_counters().unwrap().remote_bytes;
        shuffled_pass(&*first, want, &order, 5).await;
        first.flush().await;
        assert!(fetched(&*first) > 0, "{path}: the first pass fetched");
        let before = fetched(&*first);
        shuffled_pass(&*first, want, &order, 3).await;
        assert_eq!(fetched(&*first), before, "{path}: a second pass fetched bytes again");
        let next = open(&u).await;
        let at_open = fetched(&*next);
        shuffled_pass(&*next, want, &order, 7).await;
        assert_eq!(fetched(&*next), at_open, "{path}: the next run's pass fetched bytes again");
    }
}
