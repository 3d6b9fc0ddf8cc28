//! Secrets and paths: credentials never show in `Display`, `Debug` or errors (the tests grep
//! every output for them), and nothing a dataset names (tar members, object names, manifest
//! paths) makes Stoker write or read outside its directories. The CLI's stdout and stderr are
//! checked in crates/stoker-cli/tests/it/secrets.rs.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;
use stoker::SourceOptions;

const SECRETS: [&str; 5] =
    ["AKIDSECRETKEYID77", "sk-very-secret-0451", "session-tok-9183", "azure-acct-key-5521", "PRIVATE-KEY-8812"];

fn assert_clean(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows secret `{s}`: {text}");
    }
}

/// Every file under `dir`, relative.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.insert(p.strip_prefix(dir).unwrap().to_path_buf());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_stay_out_of_options_uris_and_errors() {
    let [ak, sk, tok, az, pk] = SECRETS;
    let query = format!("access_key_id={ak}&secret_access_key={sk}&session_token={tok}&access_key={az}");
    let opts = SourceOptions::from_query(&query).unwrap();
    assert_clean("options Debug", &format!("{opts:?}"));
    let json = format!(r#"{{"service_account": "{{\"private_key\": \"{pk}\"}}", "secret_access_key": "{sk}"}}"#);
    assert_clean("JSON options Debug", &format!("{:?}", SourceOptions::from_json(&json).unwrap()));
    // Percent-encoded keys are the same keys to the query parser, so to the redaction too.
    let encoded = format!("s3://b/p?%73ecret_access_key={sk}&session%5Ftoken={tok}&region=x");
    let parsed = stoker::uri::parse(&encoded).unwrap();
    assert_eq!(parsed.options.secret_access_key.as_deref(), Some(sk));
    assert_clean("display of a URI with encoded keys", &format!("{} {:?}", parsed.display, parsed));
    // Bad option values next to secrets: the error names the option, not the secrets.
    for bad in [
        format!("s3://b/p?{query}&attempts=many"),
        format!("s3://b/p?{query}&colour=red"),
        format!("s3://b/p?{query}&secret_access_key={sk}"),
    ] {
        let e = stoker::uri::parse(&bad).unwrap_err();
        assert_clean("option error", &format!("{e} {e:?}"));
    }
    for bad in [
        format!(r#"{{"secret_access_key": 123456789012345, "x": "{sk}"}}"#),
        r#"{"secret_access_key": 987654321987654}"#.to_string(),
        format!(r#"{{"access_key_id": ["{ak}"], "layout": "zip"}}"#),
    ] {
        let e = SourceOptions::from_json(&bad).unwrap_err();
        let msg = format!("{e} {e:?}");
        assert_clean("JSON option error", &msg);
        assert!(!msg.contains("123456789012345") && !msg.contains("987654321987654"), "{msg}");
    }

    // Opens that fail at every stage: nothing listening, a wrong secret, a missing bucket.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/x")).unwrap();
    std::fs::write(root.path().join("data/x/a.bin"), b"a").unwrap();
    let server = common::s3::serve(root.path()).await;
    let live = server.endpoint();
    for uri in [
        format!("s3://data/x?endpoint={closed}&{query}&attempts=2&backoff_ms=1"),
        format!("s3://data/x?endpoint={live}&{query}"),
        format!("s3://nope/x?endpoint={live}&access_key_id={}&secret_access_key={}", common::s3::AK, sk),
        format!("az://c/x?endpoint={closed}&account=acct&access_key={az}&attempts=1"),
        format!("gs://b/x?service_account=%7B%22private_key%22%3A%22{pk}%22%7D&attempts=1"),
        format!("{closed}/x/s-{{0..1}}.tar?attempts=1&secret_access_key={sk}"),
    ] {
        let e = stoker::open(&uri, Default::default()).await.expect_err(&uri);
        assert_clean(&format!("open error for {}", stoker::uri::redact(&uri)), &format!("{e} {e:?}"));
    }
    // A source that opened and then fails: Display, Debug and the read error.
    let ok = stoker::open(
        &format!(
            "s3://data/x?endpoint={live}&access_key_id={}&secret_access_key={}&session_token={tok}",
            common::s3::AK,
            common::s3::SK
        ),
        Default::default(),
    )
    .await;
    if let Ok(src) = ok {
        assert_clean("source", &format!("{src} {src:?}"));
        drop(server);
        if let Err(e) = src.get(0).await {
            assert_clean("read error", &format!("{e} {e:?}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_members_naming_other_places_write_nothing_there() {
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("ds");
    std::fs::create_dir(&dir).unwrap();
    // Member names as a hostile archive has them; the tar crate's builder refuses them, so the
    // header's name field is written directly.
    let names = ["../escape.bin", "/tmp/stoker-abs-escape.bin", "a/../../up.bin", "ok.bin", "./dot.bin"];
    let mut b = tar::Builder::new(Vec::new());
    for (i, n) in names.iter().enumerate() {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..n.len()].copy_from_slice(n.as_bytes());
        h.set_size(3);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, &[b'0' + i as u8; 3][..]).unwrap();
    }
    std::fs::write(dir.join("evil.tar"), b.into_inner().unwrap()).unwrap();
    let index_dir = outer.path().join("index");
    let before = tree(outer.path());
    for extra in ["&write_sidecar=false", ""] {
        let uri = format!("{}?index_dir={}{extra}", dir.display(), index_dir.display());
        let src = open(&uri).await;
        let keys: Vec<String> = futures::future::join_all((0..src.len()).map(|i| src.get(i)))
            .await
            .into_iter()
            .map(|s| s.unwrap().key)
            .collect();
        assert_eq!(keys.len(), names.len(), "{keys:?}");
    }
    let added: Vec<_> = tree(outer.path()).difference(&before).cloned().collect();
    assert!(!Path::new("/tmp/stoker-abs-escape.bin").exists());
    for p in &added {
        let s = p.to_string_lossy();
        let inside = (s.starts_with("ds/") && s.ends_with(".stoker-idx.json")) || s.starts_with("index");
        assert!(inside, "only indexes, next to the shard or in index_dir: {added:?}");
    }
    assert!(added.iter().any(|p| p.starts_with("index/")), "{added:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_naming_paths_outside_the_dataset_is_refused() {
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("ds");
    std::fs::create_dir(&dir).unwrap();
    tar_dir(&dir, 1, 3);
    write_tar(&outer.path().join("outside.tar"), &tar_samples(5, 2));
    stoker::index(dir.to_str().unwrap(), Default::default()).await.unwrap();
    let manifest = dir.join(".stoker-manifest.json");
    let original = std::fs::read_to_string(&manifest).unwrap();
    for evil in ["../outside.tar", "/etc/passwd.tar", "./shard-0000.tar", "a//b.tar"] {
        std::fs::write(&manifest, original.replace("shard-0000.tar", evil)).unwrap();
        let e = stoker::open(dir.to_str().unwrap(), Default::default()).await.unwrap_err().to_string();
        assert!(e.contains(".stoker-manifest.json") && e.contains("inside the dataset"), "{evil}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_cache_entries_stay_in_the_cache_directory_whatever_the_object_name() {
    use stoker::cache::{block_key, BlockCache, CacheConfig};
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("cache");
    let cache = BlockCache::new(CacheConfig {
        memory_bytes: 0,
        block: 4096,
        disk_dir: Some(dir.clone()),
        disk_bytes: Some(1 << 20),
        ..Default::default()
    })
    .unwrap();
    let long = "x/".repeat(3000);
    let names = ["../../escape", "/etc/passwd", "a/../../b", "..", "", long.as_str(), "nul\0byte", "ü/..\\..\\win"];
    for (i, n) in names.iter().enumerate() {
        let data = bytes::Bytes::from(vec![i as u8; 4096]);
        let got = cache.get_or_fetch(block_key(n, "v1", 0), 4096, || async move { Ok(data) }).await.unwrap();
        assert_eq!(got[0], i as u8);
    }
    cache.flush().await;
    let all = tree(outer.path());
    for p in &all {
        let s = p.to_string_lossy();
        let ok = s == "cache"
            || s == "cache/.evict.lock"
            || (s.starts_with("cache/")
                && p.components().count() <= 3
                && (outer.path().join(p).is_dir() || s.ends_with(".blk")));
        assert!(ok, "unexpected {s} in {all:?}");
    }
    assert_eq!(all.iter().filter(|p| p.to_string_lossy().ends_with(".blk")).count(), names.len());
}
