//! Resolving URIs: layouts inferred, manifests and listing snapshots in place of listings.

use super::*;

/// A directory holding `files` (empty files: resolving never reads a payload).
fn dir_with(files: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        let path = dir.path().join(f);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }
    dir
}

async fn resolve(uri: &str) -> Result<Resolved> {
    Request::new(uri, SourceOptions::default())?.resolve().await
}

fn names(r: &Resolved) -> Vec<&str> {
    match &r.place {
        Place::Store { listing, .. } => listing.iter().map(|o| o.path.as_str()).collect(),
        Place::LmdbDir(_) => Vec::new(),
    }
}

fn path(dir: &tempfile::TempDir, rest: &str) -> String {
    format!("{}{rest}", dir.path().display())
}

#[tokio::test]
async fn tar_shards_are_inferred_from_names() {
    let dir = dir_with(&["s-0.tar", "s-1.tar", "README.md", ".hidden.tar", "s-0.tar.stoker-idx.json"]);
    let r = resolve(&path(&dir, "")).await.unwrap();
    assert_eq!(r.layout, Layout::Tar);
    assert_eq!(names(&r), ["s-0.tar", "s-1.tar"], "shards only: no README, hidden file or sidecar");
    assert!(matches!(r.place, Place::Store { whole: true, known: None, .. }));

    let r = resolve(&path(&dir, "/s-{0..1}.tar")).await.unwrap();
    assert_eq!((r.layout, names(&r)), (Layout::Tar, vec!["s-0.tar", "s-1.tar"]));
    assert!(matches!(r.place, Place::Store { whole: false, .. }), "a pattern is not the whole directory");

    let r = resolve(&path(&dir, "/s-1.tar")).await.unwrap();
    assert_eq!((r.layout, names(&r)), (Layout::Tar, vec!["s-1.tar"]));
}

#[tokio::test]
async fn a_directory_of_files_is_objects() {
    let dir = dir_with(&["a/1.jpg", "b/2.jpg", ".git/config"]);
    let r = resolve(&path(&dir, "")).await.unwrap();
    assert_eq!(r.layout, Layout::Objects);
    let mut got = names(&r);
    got.sort();
    assert_eq!(got, ["a/1.jpg", "b/2.jpg"]);
    let r = resolve(&path(&dir, "/{a,b}/{1,2}.jpg")).await;
    assert!(r.is_err(), "a pattern naming a file that is not there fails at resolve");
    let r = resolve(&path(&dir, "/a/1.jpg")).await.unwrap();
    assert_eq!((r.layout, names(&r)), (Layout::Objects, vec!["1.jpg"]));
}

#[tokio::test]
async fn an_explicit_layout_wins_over_inference() {
    let dir = dir_with(&["s-0.tar", "x.jpg"]);
    let r = resolve(&path(&dir, "?layout=objects")).await.unwrap();
    assert_eq!(r.layout, Layout::Objects);
    assert_eq!(names(&r).len(), 2, "objects keeps every file, shards included");
    // Options passed in lose to the query.
    let tar = SourceOptions { layout: Some(Layout::Tar), ..Default::default() };
    let r = Request::new(&path(&dir, "?layout=objects"), tar).unwrap().resolve().await.unwrap();
    assert_eq!(r.layout, Layout::Objects);
    // A directory of plain files forced to tar holds no shards: said plainly.
    let plain = dir_with(&["x.jpg"]);
    let e = resolve(&path(&plain, "?layout=tar")).await.unwrap_err();
    assert!(matches!(e, Error::Empty { .. }) && e.to_string().contains("no tar shards"), "{e}");
}

#[tokio::test]
async fn the_lmdb_rule() {
    let dir = dir_with(&["data.mdb", "lock.mdb"]);
    let r = resolve(&path(&dir, "")).await.unwrap();
    assert_eq!(r.layout, Layout::Lmdb);
    assert!(matches!(&r.place, Place::LmdbDir(d) if d == dir.path()));
    // Named by its data file: the directory holding it.
    let r = resolve(&path(&dir, "/data.mdb")).await.unwrap();
    assert!(matches!(&r.place, Place::LmdbDir(d) if d == dir.path()), "{r:?}");
    // Another layout forced: the files are read as files.
    let r = resolve(&path(&dir, "?layout=objects")).await.unwrap();
    assert_eq!((r.layout, names(&r).len()), (Layout::Objects, 2));
    // layout=lmdb makes a local directory LMDB (the constructor then says data.mdb is missing)...
    let plain = dir_with(&["x.bin"]);
    let r = resolve(&path(&plain, "?layout=lmdb")).await.unwrap();
    assert!(matches!(&r.place, Place::LmdbDir(d) if d == plain.path()));
    // ...and is an error where LMDB cannot be.
    let e = resolve(&path(&plain, "/x-{0..1}.bin?layout=lmdb")).await.unwrap_err();
    assert!(e.to_string().contains("LMDB directory"), "{e}");
    let e = resolve("s3://bucket/env?layout=lmdb").await.unwrap_err();
    assert!(matches!(e, Error::NotSupported { .. }) && e.to_string().contains("local directory"), "{e}");
}

#[tokio::test]
async fn a_manifest_stands_in_for_the_listing() {
    let dir = dir_with(&["a.jpg"]);
    let store = Store::local(dir.path()).unwrap();
    // The manifest lists a file the directory does not hold: what resolves is what it says.
    let listed = vec![ObjectInfo { path: "gone.jpg".into(), size: 7, modified_us: 0, e_tag: None, recorded: false }];
    manifest::save(&store, &manifest::Manifest::new(Layout::Objects, &listed, Vec::new())).await.unwrap();
    let r = resolve(&path(&dir, "")).await.unwrap();
    assert_eq!((r.layout, names(&r)), (Layout::Objects, vec!["gone.jpg"]));
    assert!(matches!(r.place, Place::Store { whole: true, known: Some(_), .. }));
    let r = resolve(&path(&dir, "?manifest=false")).await.unwrap();
    assert_eq!(names(&r), ["a.jpg"], "without it the directory is listed");
}

#[tokio::test]
async fn unknown_layouts_and_empty_matches_are_clear_errors() {
    let dir = dir_with(&[".only-hidden"]);
    let e = resolve(&path(&dir, "?layout=zip")).await.unwrap_err();
    assert!(["zip", "objects", "tar", "lmdb"].iter().all(|w| e.to_string().contains(w)), "{e}");
    let e = resolve(&path(&dir, "")).await.unwrap_err();
    assert!(matches!(e, Error::Empty { .. }) && e.to_string().contains("no files found"), "{e}");
    let e = resolve(&path(&dir, "?layout=mix")).await.unwrap_err();
    assert!(e.to_string().contains("mix file"), "{e}");
    let e = resolve("/definitely/not/here").await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    // A pattern naming a file outside the layout it implies: never dropped in silence.
    let mixed = dir_with(&["s-0.tar", "s-1.jpg"]);
    let e = resolve(&path(&mixed, "/s-{0.tar,1.jpg}")).await.unwrap_err();
    assert!(e.to_string().contains("s-1.jpg") && e.to_string().contains("layout=objects"), "{e}");
    let e = resolve("mix:{\"sources\": []}").await.unwrap_err();
    assert!(e.to_string().contains("is a mix"), "{e}");
}

#[tokio::test]
async fn indexed_layouts_are_told_by_their_index() {
    let dir = dir_with(&["shard.00000.mds", "shard.00001.mds"]);
    std::fs::write(dir.path().join("index.json"), br#"{"shards": [{"format": "mds", "raw_data": {}}], "version": 2}"#)
        .unwrap();
    let r = resolve(&path(&dir, "")).await.unwrap();
    assert_eq!((r.layout, names(&r)), (Layout::Mds, vec!["index.json"]), "the index alone is listed");
    let r = resolve(&path(&dir, "/index.json")).await.unwrap();
    assert_eq!((r.layout, names(&r)), (Layout::Mds, vec!["index.json"]));

    let lit = dir_with(&["chunk-0-0.bin"]);
    std::fs::write(lit.path().join("index.json"), br#"{"chunks": [], "config": {"data_format": ["bytes"]}}"#).unwrap();
    assert_eq!(resolve(&path(&lit, "")).await.unwrap().layout, Layout::Litdata);

    // An index.json of something else is a file like any other.
    let other = dir_with(&["a.jpg"]);
    std::fs::write(other.path().join("index.json"), b"{\"pages\": 3}").unwrap();
    assert_eq!(resolve(&path(&other, "")).await.unwrap().layout, Layout::Objects);
    // But named alone, the index's dataset was meant: not one sample of its JSON (unless
    // asked for as a file).
    let Err(e) = resolve(&path(&other, "/index.json")).await else { panic!("an index no reader takes") };
    let e = e.to_string();
    assert!(e.contains("index.json") && e.contains("layout=objects"), "{e}");
    assert_eq!(resolve(&path(&other, "/index.json?layout=objects")).await.unwrap().layout, Layout::Objects);
    let pq = dir_with(&["train-0.parquet", "train-1.parquet", "README.md"]);
    let r = resolve(&path(&pq, "")).await.unwrap();
    assert_eq!((r.layout, names(&r).len()), (Layout::Parquet, 2));
}

#[test]
fn inference_order() {
    assert_eq!(infer(None, ["a.jpg", "b.tar"]), Layout::Tar);
    assert_eq!(infer(None, ["a.jpg", "b.cls"]), Layout::Objects);
    assert_eq!(infer(None, []), Layout::Objects);
    assert_eq!(infer(Some(Layout::Objects), ["b.tar"]), Layout::Objects);
}

#[test]
fn common_dir_of_patterns() {
    let p = |v: &[&str]| common_dir(&v.iter().map(PathBuf::from).collect::<Vec<_>>());
    assert_eq!(p(&["/d/a/x.tar", "/d/a/y.tar"]), PathBuf::from("/d/a"));
    assert_eq!(p(&["/d/train/x.tar", "/d/val/y.tar"]), PathBuf::from("/d"));
    assert_eq!(p(&["x.tar", "y.tar"]), PathBuf::from("."));
}

#[test]
fn hidden_and_sidecar_files_are_not_data() {
    assert!(is_dataset_file("a/b.jpg"));
    assert!(!is_dataset_file(".DS_Store") && !is_dataset_file("a.jsonl.stoker-lines"));
    assert!(!is_dataset_file("a.tfrecord.stoker-records"));
    assert!(!is_dataset_file("a/.git/config"));
    assert!(!is_dataset_file(&format!("s.tar{}", tar_index::SIDECAR_SUFFIX)));
}

/// An index below another is left out (MosaicML's `merge_index` keeps the subdirectories'
/// own beside the root's, which names their shards: read too, every sample came twice);
/// indexes side by side with none above them are all read.
#[test]
fn only_the_indexes_not_below_another_are_read() {
    let info = |p: &str| ObjectInfo { path: p.to_string(), size: 1, modified_us: 0, e_tag: None, recorded: false };
    let kept = |layout: Layout, paths: &[&str]| -> Vec<String> {
        topmost_indexes(layout, paths.iter().map(|p| info(p)).collect()).into_iter().map(|o| o.path).collect()
    };
    let merged = ["a/index.json", "b/index.json", "index.json", "b/c/index.json"];
    assert_eq!(kept(Layout::Mds, &merged), ["index.json"]);
    assert_eq!(kept(Layout::Litdata, &merged[..2]), ["a/index.json", "b/index.json"]);
    assert_eq!(
        kept(Layout::Mds, &["b/index.json", "b/c/index.json", "bc/index.json"]),
        ["b/index.json", "bc/index.json"]
    );
    assert_eq!(kept(Layout::Tar, &["a/index.json", "index.json"]).len(), 2, "not an index layout");
}
