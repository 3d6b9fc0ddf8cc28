//! `ShardWriter`, the writer of distributed packing (the Ray datasink): shards that read back
//! as written, a rerun that keeps what landed and replaces what changed, a job record that
//! refuses foreign destinations, and a finish that drops stale shards and writes the manifest.

use bytes::Bytes;
use stoker::pack::{ShardWriter, JOB_FILE};
use stoker::{ErrorKind, Field, Sample};

fn samples(range: std::ops::Range<usize>, tag: &str) -> Vec<Sample> {
    range
        .map(|i| Sample {
            key: format!("dir/{i:04}"),
            fields: vec![
                Field { name: "bin".into(), data: Bytes::from(format!("{tag}{i}").repeat(i % 7 + 1)) },
                Field { name: "CLS".into(), data: Bytes::from((i % 10).to_string()) },
            ],
        })
        .collect()
}

#[tokio::test]
async fn shards_read_back_reruns_keep_what_landed_and_finish_drops_stale_shards() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().display().to_string();
    let w = ShardWriter::open(&dest, Default::default()).unwrap();
    let settings = serde_json::json!({"shard_size": 4});
    w.begin(&settings, "p", false).await.unwrap();
    let a = w.write("p-000000-0000.tar", &samples(0..4, "a")).await.unwrap();
    let b = w.write("p-000000-0001.tar", &samples(4..8, "a")).await.unwrap();
    let stale = w.write("p-000001-0000.tar", &samples(8..10, "a")).await.unwrap();
    assert!(!a.kept && !b.kept && !stale.kept && a.samples == 4);
    assert_eq!(std::fs::metadata(dir.path().join("p-000000-0000.tar")).unwrap().len(), a.bytes);

    // A rerun of the same job: same settings resume; same bytes kept, other bytes replaced.
    w.begin(&settings, "p", false).await.unwrap();
    let again = w.write("p-000000-0000.tar", &samples(0..4, "a")).await.unwrap();
    assert!(again.kept && again.bytes == a.bytes);
    let changed = w.write("p-000000-0001.tar", &samples(4..8, "b")).await.unwrap();
    assert!(!changed.kept);
    // What a task killed while writing leaves: its shard's temporary file. Finish removes a
    // job file's, and leaves another's.
    std::fs::write(dir.path().join(".p-000003-0000.tar.partial"), b"cut").unwrap();
    std::fs::write(dir.path().join(".mine.tar.partial"), b"x").unwrap();
    let report = w.finish("p", &["p-000000-0000.tar".into(), "p-000000-0001.tar".into()]).await.unwrap();
    assert!(!dir.path().join(".p-000003-0000.tar.partial").exists());
    assert!(dir.path().join(".mine.tar.partial").exists());
    std::fs::remove_file(dir.path().join(".mine.tar.partial")).unwrap();
    assert_eq!((report.objects, report.samples), (2, 8));
    assert!(report.checksums, "every member's checksum recorded");
    assert!(
        !dir.path().join("p-000001-0000.tar").exists()
            && !dir.path().join("p-000001-0000.tar.stoker-idx.json").exists()
    );

    let src = stoker::open(&dest, Default::default()).await.unwrap();
    let got = src.get_many(&(0..8).collect::<Vec<_>>()).await.unwrap();
    let want: Vec<Sample> = samples(0..4, "a").into_iter().chain(samples(4..8, "b")).collect();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.key, w.key);
        let fields: Vec<(&str, &[u8])> = g.fields.iter().map(|f| (&*f.name, &f.data[..])).collect();
        // Field names come back lower-case, as every tar reader sees them.
        assert_eq!(fields, [("bin", &w.fields[0].data[..]), ("cls", &w.fields[1].data[..])]);
    }
    // The manifest's checksums hold: a verifying open finds nothing wrong.
    let opts = stoker::SourceOptions { checksums: Some(true), ..Default::default() };
    let verified = stoker::open(&dest, opts).await.unwrap();
    assert_eq!(verified.get_many(&(0..8).collect::<Vec<_>>()).await.unwrap().len(), 8);

    // A rerun: the last run's manifest goes at once (one that dies midway must not look
    // whole), a task's 10,000th shard is the job's (dropped as stale), a shard another hand
    // put there is refused unless forced.
    w.write("p-000000-10000.tar", &samples(8..9, "c")).await.unwrap();
    std::fs::copy(dir.path().join("p-000000-0000.tar"), dir.path().join("someone-else.tar")).unwrap();
    let e = w.begin(&settings, "p", false).await.unwrap_err();
    assert!(e.to_string().contains("someone-else.tar"), "{e}");
    std::fs::remove_file(dir.path().join("someone-else.tar")).unwrap();
    w.begin(&settings, "p", false).await.unwrap();
    assert!(!dir.path().join(stoker::source::manifest::MANIFEST).exists());
    let report = w.finish("p", &["p-000000-0000.tar".into(), "p-000000-0001.tar".into()]).await.unwrap();
    assert_eq!((report.objects, report.samples), (2, 8));
    assert!(!dir.path().join("p-000000-10000.tar").exists());

    // Another job's settings are refused, unless forced.
    let other = serde_json::json!({"shard_size": 5});
    let e = w.begin(&other, "p", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(e.to_string().contains("a finished write with other settings"), "{e}");
    // Forced, the earlier job's files go (and its manifest); a file named otherwise stays.
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    w.begin(&other, "q", true).await.unwrap();
    let mut left: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, [JOB_FILE, "notes.txt"]);
}

/// A job's output before its `finish` is part of a dataset: reading it, or indexing it as a
/// whole, is refused by name until the job finishes.
#[tokio::test]
async fn a_job_that_did_not_finish_is_not_read_as_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().display().to_string();
    let w = ShardWriter::open(&dest, Default::default()).unwrap();
    w.begin(&serde_json::json!({"shard_size": 4}), "p", false).await.unwrap();
    w.write("p-000000-0000.tar", &samples(0..4, "a")).await.unwrap();
    let refused = [
        stoker::open(&dest, Default::default()).await.map(|_| ()).unwrap_err(),
        stoker::source::index(&dest, Default::default()).await.map(|_| ()).unwrap_err(),
    ];
    for e in refused {
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains(JOB_FILE) && e.to_string().contains("rerun that write"), "{e}");
    }
    let report = w.finish("p", &["p-000000-0000.tar".into()]).await.unwrap();
    assert_eq!(report.samples, 4);
    assert_eq!(stoker::open(&dest, Default::default()).await.unwrap().len(), 4);
    // Listed again (no manifest), the finished record is no reason to refuse.
    std::fs::remove_file(dir.path().join(stoker::source::manifest::MANIFEST)).unwrap();
    assert_eq!(stoker::open(&dest, Default::default()).await.unwrap().len(), 4);
    // Nor is a file of that name that is not a job's record.
    std::fs::write(dir.path().join(JOB_FILE), b"{\"complete\": \"no\"}").unwrap();
    assert_eq!(stoker::open(&dest, Default::default()).await.unwrap().len(), 4);

    // Another tool's unfinished record does not outlive a job forced over it: a `stoker pack`
    // died here, then a forced job wrote the destination and finished.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join(".stoker-pack.json"), b"{\"complete\": false}").unwrap();
    let dest = other.path().display().to_string();
    let w = ShardWriter::open(&dest, Default::default()).unwrap();
    w.begin(&serde_json::json!({"shard_size": 4}), "p", true).await.unwrap();
    w.write("p-000000-0000.tar", &samples(0..4, "a")).await.unwrap();
    w.finish("p", &["p-000000-0000.tar".into()]).await.unwrap();
    std::fs::remove_file(other.path().join(stoker::source::manifest::MANIFEST)).unwrap();
    assert_eq!(stoker::open(&dest, Default::default()).await.unwrap().len(), 4);
}

#[tokio::test]
async fn foreign_destinations_bad_names_and_bad_keys_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    let w = ShardWriter::open(&dir.path().display().to_string(), Default::default()).unwrap();
    let e = w.begin(&serde_json::json!({}), "p", false).await.unwrap_err();
    assert!(e.to_string().contains("it holds `notes.txt`"), "{e}");
    assert!(!dir.path().join(JOB_FILE).exists());

    let e = w.write("../p-000000-0000.tar", &samples(0..2, "a")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let mut twice = samples(0..2, "a");
    twice[1].key = twice[0].key.clone();
    let e = w.write("p-000000-0000.tar", &twice).await.unwrap_err();
    assert!(e.to_string().contains("share the key `dir/0000`"), "{e}");
    let mut escaping = samples(0..2, "a");
    escaping[1].key = "/etc/passwd".into();
    let e = w.write("p-000000-0000.tar", &escaping).await.unwrap_err();
    assert!(e.to_string().contains("absolute path"), "{e}");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["notes.txt"], "a refused shard leaves nothing behind");

    let e = w.finish("p", &[]).await.unwrap_err();
    assert!(e.to_string().contains("`begin` was not called"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_streamed_to_s3_lands_in_one_put_and_an_equal_rerun_keeps_it() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data")).unwrap();
    let h = crate::common::s3::serve(root.path()).await;
    let dest = crate::common::s3::uri(&h.endpoint(), "out", "");
    let w = ShardWriter::open(&dest, Default::default()).unwrap();
    let write = |tag: &'static str| {
        let w = w.clone();
        async move {
            let mut s = w.shard("p-000000-0000.tar", 1 << 20).unwrap();
            let s = tokio::task::spawn_blocking(move || {
                for x in samples(0..6, tag) {
                    let fields: Vec<(&str, &[u8])> = x.fields.iter().map(|f| (&*f.name, &f.data[..])).collect();
                    s.add(&x.key, &fields).unwrap();
                }
                s
            })
            .await
            .unwrap();
            assert_eq!(s.samples(), 6);
            let size = s.bytes();
            let done = s.finish().await.unwrap();
            assert_eq!(done.bytes, size, "the size announced is the size written");
            done
        }
    };
    let first = write("a").await;
    assert!(!first.kept);
    let on_disk = root.path().join("data/out/p-000000-0000.tar");
    assert_eq!(std::fs::metadata(&on_disk).unwrap().len(), first.bytes);
    let modified = std::fs::metadata(&on_disk).unwrap().modified().unwrap();
    assert!(write("a").await.kept, "the same bytes again: the object there is kept");
    assert_eq!(std::fs::metadata(&on_disk).unwrap().modified().unwrap(), modified, "and not written again");
    // Same sizes, other bytes ("b" for "a"): replaced, and read back as the new samples.
    assert!(!write("b").await.kept);
    let opts = stoker::SourceOptions { checksums: Some(true), ..Default::default() };
    let src = stoker::open(&dest, opts).await.unwrap();
    let got = src.get_many(&(0..6).collect::<Vec<_>>()).await.unwrap();
    for (g, want) in got.iter().zip(samples(0..6, "b")) {
        assert_eq!((g.key.as_str(), &g.fields[0].data), (want.key.as_str(), &want.fields[0].data));
    }
}

/// 25 samples of 1 MiB: three whole 8 MiB parts and a last one.
fn big_samples() -> Vec<Sample> {
    (0..25u8)
        .map(|i| Sample {
            key: format!("s/{i:03}"),
            fields: vec![Field { name: "bin".into(), data: Bytes::from(vec![i; 1 << 20]) }],
        })
        .collect()
}

/// The object a remote write of `samples` left (in the S3 server's directory, at `remote`) is
/// the tar a local write of the same samples gives.
async fn assert_written_as_locally(remote: &std::path::Path, samples: &[Sample]) {
    let local = tempfile::tempdir().unwrap();
    let lw = ShardWriter::open(&local.path().display().to_string(), Default::default()).unwrap();
    lw.write("p-000000-0000.tar", samples).await.unwrap();
    let got = std::fs::read(remote).unwrap();
    assert!(got == std::fs::read(local.path().join("p-000000-0000.tar")).unwrap(), "the same bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_larger_than_a_part_goes_to_s3_in_parts_and_one_given_up_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data")).unwrap();
    let h = crate::common::s3::serve(root.path()).await;
    let w = ShardWriter::open(&crate::common::s3::uri(&h.endpoint(), "big", ""), Default::default()).unwrap();
    let big = big_samples();
    let done = w.write("p-000000-0000.tar", &big).await.unwrap();
    assert!(done.bytes > 3 * (8 << 20) && !done.kept, "{done:?}");
    assert_written_as_locally(&root.path().join("data/big/p-000000-0000.tar"), &big).await;
    assert!(w.write("p-000000-0000.tar", &big).await.unwrap().kept, "a rerun keeps it");

    // A shard given up after two parts were sent: nothing under its name, no part kept.
    let mut s = w.shard("p-000000-0001.tar", 0).unwrap();
    let s = tokio::task::spawn_blocking(move || {
        for x in &big[..20] {
            s.add(&x.key, &[("bin", &x.fields[0].data[..])]).unwrap();
        }
        s
    })
    .await
    .unwrap();
    s.abort().await;
    assert!(!root.path().join("data/big/p-000000-0001.tar").exists());
    let parts: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".upload_id-"))
        .collect();
    assert!(parts.is_empty(), "parts left on the server: {parts:?}");
}

/// A store that answers 503 SlowDown to half of its requests, part uploads and their
/// completion included: each refused request is sent again (a part under its own number), and
/// the shard lands whole, with the bytes a local write of the same samples gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_refused_with_503s_are_sent_again_and_the_shard_lands_whole() {
    use stoker_testkit::proxy::FaultPatch;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data")).unwrap();
    let h = crate::common::s3::serve(root.path()).await;
    let faults = FaultPatch { slowdown: Some(0.5), seed: Some(3), ..Default::default() };
    let proxy = crate::common::s3::with_proxy(&h, faults).await;
    let uri = crate::common::s3::uri(&proxy.endpoint(), "flaky", "&attempts=30&backoff_ms=1");
    let w = ShardWriter::open(&uri, Default::default()).unwrap();
    let big = big_samples();
    let done = w.write("p-000000-0000.tar", &big).await.unwrap();
    assert!(done.bytes > 3 * (8 << 20), "{done:?}");
    assert_written_as_locally(&root.path().join("data/flaky/p-000000-0000.tar"), &big).await;
    // The upload's requests come first (its start, four parts, its completion), and the
    // proxy's faults follow the order requests arrive in (seeded): with this seed some of
    // them were refused and sent again.
    let log = proxy.control.recent_requests();
    let upload: Vec<&str> = log
        .iter()
        .filter(|r| r.path.ends_with("flaky/p-000000-0000.tar") && matches!(r.method.as_str(), "POST" | "PUT"))
        .map(|r| r.method.as_str())
        .collect();
    assert!(upload.len() > 6, "no request of the upload was refused and sent again: {upload:?}");
    assert!(proxy.control.stats().slowdowns > 0);
}
