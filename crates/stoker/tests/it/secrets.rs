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
    // A write and a delete to an endpoint whose userinfo holds a secret, nothing listening:
    // the errors, printed as `unwrap` prints them (Debug) and with their chains of sources,
    // do not show it (object_store's own Debug held the request URL as given).
    let parsed = stoker::uri::parse(&format!(
        "s3://data/x?endpoint=http://user:{sk}@127.0.0.1:{}&access_key_id={ak}&secret_access_key={sk}&attempts=1",
        free_port()
    ))
    .unwrap();
    let stoker::uri::Location::Remote(loc) = &parsed.location else { panic!("a remote URI") };
    let store = stoker::store::Store::remote(loc, &parsed.options, &parsed.display).unwrap();
    let shown = |e: &stoker::Error| {
        let mut shown = format!("{e} {e:?}");
        let mut next: Option<&dyn std::error::Error> = std::error::Error::source(e);
        while let Some(cause) = next {
            shown += &format!(" / {cause} {cause:?}");
            next = cause.source();
        }
        shown
    };
    let e = store.put("y.bin", bytes::Bytes::from_static(b"y")).await.unwrap_err();
    assert_clean("write error", &shown(&e));
    let e = store.delete("y.bin").await.unwrap_err();
    assert!(matches!(e, stoker::Error::Store { .. }), "{}", shown(&e));
    assert_clean("delete error", &shown(&e));

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
        let got = cache.get_or_fetch(block_key(n, "v1", 4096, 0), 4096, || async move { Ok(data) }).await.unwrap();
        assert_eq!(got[0], i as u8);
    }
    cache.flush().await;
    let all = tree(outer.path());
    for p in &all {
        let s = p.to_string_lossy();
        let ok = s == "cache"
            || s == "cache/.evict.lock"
            || s == "cache/.leases.lock"
            || (s.starts_with("cache/")
                && p.components().count() <= 3
                && (outer.path().join(p).is_dir() || s.ends_with(".blk")));
        assert!(ok, "unexpected {s} in {all:?}");
    }
    assert_eq!(all.iter().filter(|p| p.to_string_lossy().ends_with(".blk")).count(), names.len());
}

/// The one secret the test below plants everywhere: the embedded S3 server's real secret key,
/// so the reads that use it succeed and their stats, manifests and cache files exist to grep.
const PLANTED: &str = "planted-secret-6633";
/// A userinfo's user name (often an access key id): redacted with the password.
const PLANTED_USER: &str = "planted-user-2291";
/// A secret written as a number, which parsers quote in their type errors.
const PLANTED_NUMBER: &str = "663312345678";

/// Every file under `dir` whose name or bytes hold a planted secret.
fn files_holding_a_secret(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            // Another test's spill or cache file may vanish while this one looks.
            let bytes = std::fs::read(&p).unwrap_or_default();
            let name = p.to_string_lossy();
            if [PLANTED, PLANTED_USER, PLANTED_NUMBER]
                .iter()
                .any(|s| name.contains(s) || memchr::memmem::find(&bytes, s.as_bytes()).is_some())
            {
                out.push(p);
            }
        }
    }
    out
}

/// A Parquet file of two row groups: a `key` and a `data` column.
fn write_parquet(path: &Path, rows: usize) {
    use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
    use std::sync::Arc;
    let keys: Vec<String> = (0..rows).map(|i| format!("k{i:03}")).collect();
    let data: Vec<Vec<u8>> = (0..rows).map(|i| payload(i, 200)).collect();
    let batch = RecordBatch::try_from_iter([
        ("key", Arc::new(StringArray::from(keys)) as ArrayRef),
        ("data", Arc::new(BinaryArray::from_iter_values(data)) as ArrayRef),
    ])
    .unwrap();
    let props =
        parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(rows / 2)).build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Read every sample through a Loader; its stats, as JSON and Debug.
async fn read_all(src: std::sync::Arc<stoker::DynSampleSource>) -> String {
    use futures::StreamExt;
    let loader = stoker::Loader::new(src, stoker::LoaderConfig::new(8)).unwrap();
    let mut stream = loader.epoch(0).unwrap();
    let mut n = 0;
    while let Some(b) = stream.next().await {
        n += b.unwrap().len();
    }
    assert!(n > 0, "read nothing");
    let stats = loader.stats();
    format!("{} {stats:?}", serde_json::to_string(&stats).unwrap())
}

/// One secret planted in every place a user can put one through the library (URI query,
/// endpoint userinfo, options, a mix file, an inline mix, an options file), with reads that
/// succeed and opens and parses that fail: no text the library gives back, and no file it
/// writes (manifests and indexes in the bucket, the disk cache, the spill), holds it. The
/// environment and the CLI's stdout and stderr are checked in crates/stoker-cli/tests/it/secrets.rs,
/// Python in crates/stoker-py/tests/test_secrets.py.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_planted_everywhere_shows_nowhere() {
    use stoker_testkit::s3::{serve, S3ServerConfig};
    let ak = common::s3::AK;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("data/ds")).unwrap();
    std::fs::create_dir_all(root.path().join("data/pq")).unwrap();
    tar_dir(&root.path().join("data/ds"), 2, 6);
    write_parquet(&root.path().join("data/pq/rows.parquet"), 40);
    let server = serve(S3ServerConfig::new(root.path()).with_credentials(ak, PLANTED)).await.unwrap();
    let ep = server.endpoint();
    let with_userinfo = ep.replacen("http://", &format!("http://{PLANTED_USER}:{PLANTED}@"), 1);
    let work = tempfile::tempdir().unwrap();
    let (cache, index) = (work.path().join("cache"), work.path().join("index"));
    let local = format!("disk_cache_dir={}&index_dir={}", cache.display(), index.display());
    let creds = format!("access_key_id={ak}&secret_access_key={PLANTED}");
    let mut said: Vec<(String, String)> = Vec::new();
    let mut say = |what: &str, text: String| said.push((what.to_string(), text));

    // The URI's query: a tar dataset and a Parquet file (decoded into the spill), read whole,
    // indexed (a manifest and indexes written to the bucket).
    for path in ["ds", "pq/rows.parquet"] {
        let uri = format!("s3://data/{path}?endpoint={ep}&{creds}&{local}&decoded_bytes=1");
        let src = stoker::open(&uri, Default::default()).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        say("source", format!("{src} {src:?} {:?}", src.info()));
        say("stats", read_all(src.clone()).await);
        src.flush().await;
        say("parsed URI", format!("{:?}", stoker::uri::parse(&uri).unwrap()));
    }
    let report = stoker::index(&format!("s3://data/ds?endpoint={ep}&{creds}&{local}"), Default::default()).await;
    say("index report", format!("{report:?}"));

    // The endpoint's userinfo, in the query (plain and percent-encoded) and in options; and
    // one a URL parser reads another way (a `/` in the password).
    let encoded: String = url::form_urlencoded::byte_serialize(with_userinfo.as_bytes()).collect();
    let broken = format!("http://{PLANTED_USER}:pl/{PLANTED}@127.0.0.1:1");
    // Nothing listens there: the listing fails with the transport's error, which names the URL.
    let closed = format!("http://{PLANTED_USER}:{PLANTED}@127.0.0.1:{}", free_port());
    let mut opened = Vec::new();
    for endpoint in [with_userinfo.clone(), encoded, broken, closed] {
        // No disk cache: a read after the server is gone must go to the endpoint and fail.
        let uri = format!("s3://data/ds?endpoint={endpoint}&{creds}&disk_cache=false&attempts=1");
        match stoker::open(&uri, Default::default()).await {
            Ok(src) => {
                say("source over a userinfo endpoint", format!("{src} {src:?}"));
                opened.push(src);
            }
            Err(e) => say("open over a userinfo endpoint", format!("{e} {e:?}")),
        }
        say("parse", format!("{:?}", stoker::uri::parse(&uri).map(|u| u.display)));
        say("redact", stoker::uri::redact(&uri));
    }
    let opts = SourceOptions {
        endpoint: Some(with_userinfo.clone()),
        secret_access_key: Some(PLANTED.into()),
        ..Default::default()
    };
    say("options Debug", format!("{opts:?}"));
    match stoker::open("s3://nope/x?attempts=1&disk_cache=false", opts).await {
        Ok(src) => say("source from options", format!("{src} {src:?}")),
        Err(e) => say("open from options", format!("{e} {e:?}")),
    }

    // A mix file, and an inline mix, that open and read.
    let opts_toml = format!(
        "endpoint = \"{ep}\", access_key_id = \"{ak}\", secret_access_key = \"{PLANTED}\", disk_cache_dir = \"{}\"",
        cache.display()
    );
    let mix = work.path().join("good.mix.toml");
    std::fs::write(&mix, format!("[[sources]]\nuri = \"s3://data/ds\"\nweight = 1.0\noptions = {{ {opts_toml} }}\n"))
        .unwrap();
    let src = stoker::open(mix.to_str().unwrap(), Default::default()).await.unwrap();
    say("mix source", format!("{src} {src:?}"));
    say("mix stats", read_all(src).await);
    let inline = format!(
        r#"mix:{{"sources": [{{"uri": "s3://data/ds?{creds}&endpoint={with_userinfo}", "weight": 1,
            "options": {{"endpoint": "{ep}", "session_token": "{PLANTED}"}}}}]}}"#
    );
    match stoker::open(&inline, Default::default()).await {
        Ok(src) => say("inline mix", format!("{src} {src:?}")),
        Err(e) => say("inline mix error", format!("{e} {e:?}")),
    }

    // Mix files and options files that do not parse: the secret is on the failing line, in
    // an inline table, of the wrong type, or in text that is not TOML or JSON at all.
    let bad_texts = [
        format!("[[sources]]\nuri = \"s3://data/ds\"\nweight = 1.0\noptions = {{ secret_access_key = \"{PLANTED}\", region = \"x\" junk }}\n"),
        format!("[[sources]]\nuri = \"s3://data/ds?secret_access_key={PLANTED}\" junk\nweight = 1.0\n"),
        format!("[[sources]]\nuri = \"s3://data/ds\"\nweight = 1.0\noptions = {{ secret_access_key = {PLANTED_NUMBER} }}\n"),
        format!("[[sources]]\nuri = \"s3://data/ds\"\nweight = 1\noptions = {{ endpoint = \"{with_userinfo}\", bogus = 1 }}\n"),
        format!("secret_access_key = \"{PLANTED}\"\nbogus_option = 1\n"),
        format!("secret_access_key = {PLANTED_NUMBER}\n"),
        format!("session_token = '''{PLANTED}\n"),
        format!("endpoint = \"{with_userinfo}\" x\n"),
    ];
    for (i, text) in bad_texts.iter().enumerate() {
        let path = work.path().join(format!("bad{i}.mix.toml"));
        std::fs::write(&path, text).unwrap();
        let e = stoker::open(path.to_str().unwrap(), Default::default()).await.expect_err(text);
        say(&format!("mix file {i}"), format!("{e} {e:?}"));
        let e = SourceOptions::from_toml(text).expect_err(text);
        say(&format!("options TOML {i}"), format!("{e} {e:?}"));
    }
    for text in [
        format!(
            r#"{{"sources": [{{"uri": "s3://x", "weight": 1, "options": {{"secret_access_key": {PLANTED_NUMBER}}}}}]}}"#
        ),
        format!(r#"{{"sources": [{{"uri": "s3://x", "weight": 1, "options": {{"secret_access_key": "{PLANTED}" "#),
        format!(r#"{{"endpoint": "{with_userinfo}", "attempts": "many"}}"#),
    ] {
        let e = stoker::open(&format!("mix:{text}"), Default::default()).await.expect_err(&text);
        say("inline mix JSON", format!("{e} {e:?}"));
        if let Err(e) = SourceOptions::from_json(&text) {
            say("options JSON", format!("{e} {e:?}"));
        }
    }
    drop(server);
    assert!(!opened.is_empty(), "a userinfo endpoint works for object_store");
    for src in opened {
        // Small shards may have been read whole while opening; a read that fails must not tell.
        if let Err(e) = src.get(src.len() - 1).await {
            say("read over a userinfo endpoint", format!("{e} {e:?} {:?}", std::error::Error::source(&e)));
        }
    }

    for (what, text) in &said {
        for s in [PLANTED, PLANTED_USER, PLANTED_NUMBER] {
            assert!(!text.contains(s), "{what} shows `{s}`: {text}");
        }
    }
    // The mix and options files are where the user wrote the secret; nothing else may hold it.
    let spill = std::path::Path::new(&std::env::var("STOKER_CACHE_DIR").unwrap_or_default()).join("spill");
    for dir in [root.path(), cache.as_path(), index.as_path(), spill.as_path()] {
        let found = files_holding_a_secret(dir);
        assert!(found.is_empty(), "files holding the secret: {found:?}");
    }
    assert!(files_holding_a_secret(&cache).is_empty() && cache.exists(), "the disk cache was used");
    assert!(root.path().join("data/ds/.stoker-manifest.json").exists(), "a manifest was written");
}
