//! Listing snapshots: a source opened in one process from the listing another took gives the
//! same samples without listing (what Ray read tasks do), and a damaged snapshot is refused.

use stoker::source::{open_and_snapshot, open_with_listing, snapshot_spans};
use stoker::ErrorKind;

fn samples(src: &stoker::DynSampleSource) -> Vec<(String, Vec<u8>)> {
    (0..src.len())
        .map(|i| {
            let s = futures::executor::block_on(src.get(i)).unwrap();
            (s.key.clone(), s.fields.iter().flat_map(|f| f.data.to_vec()).collect())
        })
        .collect()
}

#[tokio::test]
async fn a_source_opened_from_a_snapshot_reads_what_the_snapshot_listed() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5 {
        std::fs::create_dir_all(dir.path().join(format!("d{}", i % 2))).unwrap();
        std::fs::write(dir.path().join(format!("d{}/{i:03}.bin", i % 2)), vec![i as u8; 10 + i]).unwrap();
    }
    let uri = dir.path().display().to_string();
    let (first, snap) = open_and_snapshot(&uri, Default::default()).await.unwrap();
    let snap = snap.expect("a directory is listed, so it has a snapshot");
    // A file added later is not in the snapshot: a process opening from it sees what the first
    // one saw (and does not list the directory).
    std::fs::write(dir.path().join("d0/999.bin"), b"late").unwrap();
    let again = open_with_listing(&uri, Default::default(), &snap).await.unwrap();
    assert_eq!(again.len(), 5);
    assert_eq!(samples(&*again), samples(&*first));
    assert_eq!(stoker::open(&uri, Default::default()).await.unwrap().len(), 6, "a plain open lists");

    // Named files list nothing: no snapshot.
    let one = dir.path().join("d0/000.bin").display().to_string();
    assert!(open_and_snapshot(&one, Default::default()).await.unwrap().1.is_none());

    // A damaged snapshot, or one naming a path outside the dataset, is refused.
    let e = open_with_listing(&uri, Default::default(), b"{not json").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    let escaping = String::from_utf8(snap.clone()).unwrap().replacen("d0/000.bin", "../000.bin", 1);
    let e = open_with_listing(&uri, Default::default(), escaping.as_bytes()).await.unwrap_err();
    assert!(e.to_string().contains("not a plain path inside the dataset"), "{e}");
}

#[tokio::test]
async fn tar_shards_opened_from_a_snapshot_keep_their_indexes() {
    let dir = tempfile::tempdir().unwrap();
    for s in 0..2 {
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..3 {
            let data = format!("shard {s} sample {i}");
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, format!("{s}{i:03}.txt"), data.as_bytes()).unwrap();
        }
        std::fs::write(dir.path().join(format!("s-{s}.tar")), b.into_inner().unwrap()).unwrap();
    }
    let uri = dir.path().display().to_string();
    let (first, snap) = open_and_snapshot(&uri, Default::default()).await.unwrap();
    let snap = snap.unwrap();
    let again = open_with_listing(&uri, Default::default(), &snap).await.unwrap();
    assert_eq!(again.len(), 6);
    assert_eq!(samples(&*again), samples(&*first));
    // Samples are not one object each: no parts, every reader takes the whole snapshot.
    assert!(snapshot_spans(&snap, &[0..3, 3..6]).unwrap().is_none());
}

#[tokio::test]
async fn each_part_of_a_snapshot_of_files_holds_its_run_of_samples_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    // Listed in directory order, numbered in path order: the parts follow the numbering.
    for i in (0..7).rev() {
        std::fs::create_dir_all(dir.path().join(format!("d{}", i / 3))).unwrap();
        std::fs::write(dir.path().join(format!("d{}/{i:03}.bin", i / 3)), vec![i as u8; 3 + i]).unwrap();
    }
    let uri = dir.path().display().to_string();
    let (whole, snap) = open_and_snapshot(&uri, Default::default()).await.unwrap();
    let (snap, all) = (snap.unwrap(), samples(&*whole));
    let runs = [0..2, 2..3, 3..7];
    let parts = snapshot_spans(&snap, &runs).unwrap().expect("files are one object a sample");
    assert_eq!(parts.len(), 3);
    for (run, part) in runs.iter().zip(&parts) {
        assert!(part.len() < snap.len(), "a part holds less than the whole listing");
        let src = open_with_listing(&uri, Default::default(), part).await.unwrap();
        assert_eq!(samples(&*src), all[run.clone()], "samples {run:?}");
    }
    // Runs that are not runs of the source's samples are refused, not cut short.
    for (start, end) in [(0, 0), (5, 3), (6, 8)] {
        let e = snapshot_spans(&snap, std::slice::from_ref(&(start..end))).unwrap_err();
        assert!(e.to_string().contains("not a run of the snapshot's 7 samples"), "{start}..{end}: {e}");
    }
    let one = std::slice::from_ref(&(0..1));
    assert_eq!(snapshot_spans(b"{not json", one).unwrap_err().kind(), ErrorKind::Corrupt);
}
