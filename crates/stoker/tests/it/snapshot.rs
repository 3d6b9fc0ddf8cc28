//! Listing snapshots: a source opened in one process from the listing another took gives the
//! same samples without listing (what Ray read tasks do), and a damaged snapshot is refused.

use stoker::loader::list_for_tasks;
use stoker::source::{open_and_snapshot, open_with_listing, snapshot_spans};
use stoker::{DamagePolicy, ErrorKind, SourceOptions};

fn samples(src: &stoker::DynSampleSource) -> Vec<(String, Vec<u8>)> {
    (0..src.len())
        .map(|i| {
            let s = futures::executor::block_on(src.get(i)).unwrap();
            (s.key.clone(), s.fields.iter().flat_map(|f| f.data.to_vec()).collect())
        })
        .collect()
}

/// Files `dD/NNN.bin` for N in 0..n, `per_dir` to a directory, file N holding N repeated
/// `base + N` times; written last to first, so directory order is not path order.
fn files_in_dirs(n: usize, per_dir: usize, base: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for i in (0..n).rev() {
        std::fs::create_dir_all(dir.path().join(format!("d{}", i / per_dir))).unwrap();
        std::fs::write(dir.path().join(format!("d{}/{i:03}.bin", i / per_dir)), vec![i as u8; base + i]).unwrap();
    }
    dir
}

/// Two tar shards of three samples each, `s-0.tar` and `s-1.tar`.
fn two_tar_shards() -> tempfile::TempDir {
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
    dir
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
    // A file listed twice (out of order, or next to itself) would be read twice.
    for (from, to) in [("d0/000.bin", "d1/003.bin"), ("d0/002.bin", "d0/000.bin")] {
        let twice = String::from_utf8(snap.clone()).unwrap().replacen(from, to, 1);
        assert_ne!(twice.as_bytes(), &snap[..]);
        let e = open_with_listing(&uri, Default::default(), twice.as_bytes()).await.unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}

#[tokio::test]
async fn tar_shards_opened_from_a_snapshot_keep_their_indexes() {
    let dir = two_tar_shards();
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
    // Listed in directory order, numbered in path order: the parts follow the numbering.
    let dir = files_in_dirs(7, 3, 3);
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

/// A local directory of files listed for tasks is listed by name only (nothing looked up on
/// the driver), and each task's part, looked up where it opens, gives the whole source's run:
/// the same keys, bytes and sizes. A file gone between the two is named at the task's open
/// (or, under `on_damage=skip`, skipped as damage when read).
#[tokio::test]
async fn a_directory_listed_for_tasks_by_name_gives_each_part_its_files_looked_up_there() {
    let dir = files_in_dirs(9, 4, 5);
    std::fs::write(dir.path().join(".hidden"), b"not a sample").unwrap();
    std::os::unix::fs::symlink(dir.path().join("d0/001.bin"), dir.path().join("d2/linked.bin")).unwrap();
    let uri = dir.path().display().to_string();
    let whole = stoker::open(&uri, Default::default()).await.unwrap();
    let all = samples(&*whole);
    assert_eq!(all.len(), 10);
    let listed = list_for_tasks(&uri, Default::default()).await.unwrap();
    assert_eq!((listed.samples, listed.shard_starts.clone()), (10, vec![0]));
    let snap = listed.snapshot.expect("a listed directory has a snapshot");
    let text = String::from_utf8(snap.clone()).unwrap();
    assert!(text.contains("\"names\"") && !text.contains("e_tag") && !text.contains(".hidden"), "{text}");
    let runs = [0..3, 3..4, 4..10];
    let parts = snapshot_spans(&snap, &runs).unwrap().expect("files are one object a sample");
    for (run, part) in runs.iter().zip(&parts) {
        let src = open_with_listing(&uri, Default::default(), part).await.unwrap();
        assert_eq!(samples(&*src), all[run.clone()], "samples {run:?}");
        for (k, i) in run.clone().enumerate() {
            let (a, b) = (src.meta(k).await.unwrap(), whole.meta(i).await.unwrap());
            assert_eq!((a.key, a.fields), (b.key, b.fields), "sample {i}");
        }
    }
    // The whole snapshot opens too (a read in one task).
    assert_eq!(samples(&*open_with_listing(&uri, Default::default(), &snap).await.unwrap()), all);

    // Gone since the listing: named at the open, or skipped when read under on_damage=skip.
    std::fs::remove_file(dir.path().join("d0/002.bin")).unwrap();
    let e = open_with_listing(&uri, Default::default(), &parts[0]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("002.bin") && e.to_string().contains("gone since"), "{e}");
    let skip = SourceOptions { on_damage: Some(DamagePolicy::Skip), ..Default::default() };
    let src = open_with_listing(&uri, skip, &parts[0]).await.unwrap();
    assert_eq!(src.len(), 3, "the part keeps its numbering");
    assert!(src.get(2).await.is_err(), "the gone file is not read as an empty sample");
    // Nor one put back before its read: it is held to what the open found (nothing there).
    std::fs::write(dir.path().join("d0/002.bin"), b"back again").unwrap();
    assert!(src.get(2).await.is_err(), "a file put back since the open is not read");
    assert_eq!(src.get(1).await.unwrap().fields[0].data.len(), 6);
}

/// What a names-only snapshot may hold, checked: paths inside the dataset, names alone (not
/// beside objects or shards), read as files (not under another layout), and looked up in a
/// local directory only.
#[tokio::test]
async fn a_snapshot_of_names_that_escape_mix_or_change_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.bin"), b"a").unwrap();
    std::fs::write(dir.path().join("b.bin"), b"b").unwrap();
    let uri = dir.path().display().to_string();
    let snap = list_for_tasks(&uri, Default::default()).await.unwrap().snapshot.unwrap();
    let text = String::from_utf8(snap).unwrap();
    let escaping = text.replacen("a.bin", "../a.bin", 1);
    let e = open_with_listing(&uri, Default::default(), escaping.as_bytes()).await.unwrap_err();
    assert!(e.to_string().contains("not a plain path inside the dataset"), "{e}");
    let both = text.replacen(
        "\"objects\":[]",
        "\"objects\":[{\"path\":\"a.bin\",\"size\":1,\"modified_us\":0,\"e_tag\":null}]",
        1,
    );
    assert_ne!(both, text);
    let e = open_with_listing(&uri, Default::default(), both.as_bytes()).await.unwrap_err();
    assert!(e.to_string().contains("by name only and also as objects"), "{e}");
    let tar = SourceOptions { layout: Some(stoker::Layout::Tar), ..Default::default() };
    let e = open_with_listing(&uri, tar, text.as_bytes()).await.unwrap_err();
    assert!(e.to_string().contains("layout=tar was asked"), "{e}");
    // A name twice would be two samples of one file; out of order, the parts would differ.
    for (from, to) in [("\"b.bin\"", "\"a.bin\""), ("\"a.bin\",\"b.bin\"", "\"b.bin\",\"a.bin\"")] {
        let changed = text.replacen(from, to, 1);
        assert_ne!(changed, text);
        let e = open_with_listing(&uri, Default::default(), changed.as_bytes()).await.unwrap_err();
        assert!(e.to_string().contains("not sorted, or `"), "{e}");
    }
    // Names under the version of snapshots without them (what a Stoker from before them would
    // write, or read as no objects at all) are refused by their version.
    let old = text.replacen("\"version\":2", "\"version\":1", 1);
    assert_ne!(old, text);
    let e = open_with_listing(&uri, Default::default(), old.as_bytes()).await.unwrap_err();
    assert!(e.to_string().contains("v1 is not stoker-manifest v2"), "{e}");
    // Names to look up belong to snapshots only: a dataset's manifest holding them is refused.
    std::fs::write(dir.path().join(".stoker-manifest.json"), &text).unwrap();
    let e = stoker::open(&uri, Default::default()).await.unwrap_err();
    assert!(e.to_string().contains("lists files by name only"), "{e}");
}

/// Only a directory of files is listed by name: tar shards, a directory with a manifest and
/// named files get the snapshot (or none) an open takes, and an unfinished pack's output is
/// refused here as an open refuses it.
#[tokio::test]
async fn listing_for_tasks_looks_up_what_is_not_a_directory_of_files_and_refuses_what_an_open_refuses() {
    let dir = two_tar_shards();
    let uri = dir.path().display().to_string();
    let listed = list_for_tasks(&uri, Default::default()).await.unwrap();
    assert_eq!((listed.samples, listed.shard_starts), (6, vec![0, 3]));
    let text = String::from_utf8(listed.snapshot.unwrap()).unwrap();
    assert!(text.contains("e_tag") && !text.contains("\"names\""), "shards are looked up: {text}");

    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("a.bin"), b"a").unwrap();
    let uri = files.path().display().to_string();
    stoker::source::index(&uri, Default::default()).await.unwrap();
    let text = String::from_utf8(list_for_tasks(&uri, Default::default()).await.unwrap().snapshot.unwrap()).unwrap();
    assert!(text.contains("e_tag") && !text.contains("\"names\""), "a manifest is read, not a listing: {text}");
    let named = files.path().join("a.bin").display().to_string();
    assert!(list_for_tasks(&named, Default::default()).await.unwrap().snapshot.is_none());

    std::fs::write(files.path().join(".stoker-pack.json"), br#"{"complete": false}"#).unwrap();
    std::fs::remove_file(files.path().join(".stoker-manifest.json")).unwrap();
    let e = list_for_tasks(&uri, Default::default()).await.unwrap_err();
    assert!(e.to_string().contains("did not finish"), "{e}");
    let empty = tempfile::tempdir().unwrap();
    let e = list_for_tasks(&empty.path().display().to_string(), Default::default()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Empty, "{e}");
}
