//! The layouts over Azure Blob Storage: a real Azurite (the Azure Storage emulator that
//! integration/setup.sh installs from npm) as a child process on loopback. Same conformance
//! suite as the local layouts and S3.
//!
//! Azurite serves the well-known development account `devstoreaccount1` path-style
//! (`http://127.0.0.1:PORT/devstoreaccount1/CONTAINER/BLOB`). object_store cannot create a
//! container, so a few lines of Node (which runs Azurite anyway) send the signed
//! `PUT ?restype=container`; the fixtures are then uploaded with object_store itself.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::{ObjectStoreExt, PutPayload};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use stoker::conformance::run_all;
use stoker::{Error, Layout, Sample, SourceOptions};

/// Azurite's well-known development account and key (public, documented by Microsoft).
const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// A valid base64 key that is not the account's.
const WRONG_KEY: &str = "c3Rva2VyV3JvbmdLZXlEb05vdFByaW50U3Rva2VyV3JvbmdLZXlEb05vdFByaW50";
const CONTAINER: &str = "data";

/// Strings that must never be shown for `key`: the key, and a part of it that reads the same
/// percent-encoded (the key has `/` and `=`), so a search also finds an encoded copy.
fn hidden(key: &str) -> [&str; 2] {
    [key, &key[..24]]
}

/// An Azurite holding the fixtures in container `data`.
struct Azurite {
    /// Declared first: dropped (killed) before its directory goes.
    _server: Killed,
    port: u16,
    _root: tempfile::TempDir,
    /// Samples written under `tar` (3 shards) and `objects`.
    tar: Vec<Sample>,
    objects: Vec<Sample>,
}

impl Azurite {
    /// The account's endpoint: Azurite takes the account from the first path segment.
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// An `az://` URI in emulator mode, with `key` (the account's unless testing a wrong one).
    fn uri(&self, path: &str, key: &str) -> String {
        let (endpoint, key) = (enc(&self.endpoint()), enc(key));
        format!("az://{CONTAINER}/{path}?use_emulator=true&disk_cache=false&endpoint={endpoint}&access_key={key}")
    }

    /// The same as a plain account endpoint, account and key (how a non-emulator server is set).
    fn plain_uri(&self, path: &str) -> String {
        let (endpoint, key) = (enc(&self.endpoint()), enc(KEY));
        format!("az://{CONTAINER}/{path}?disk_cache=false&endpoint={endpoint}&account={ACCOUNT}&access_key={key}")
    }
}

fn enc(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

/// Start Azurite's blob service in memory on a free loopback port and wait until it answers.
fn start(root: &Path) -> (Killed, u16) {
    let bin = installed_tool("STOKER_AZURITE", "integration/node_modules/.bin/azurite-blob", "azurite-blob");
    let command = |port: u16| {
        let mut c = Command::new(&bin);
        c.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .args(["--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--loose", "--silent"])
            // Nothing is written with in-memory persistence; were anything, it goes here.
            .current_dir(root);
        c
    };
    // Any answer (an unsigned request is refused) means it is serving.
    start_server("azurite-blob", root, command, |port| http_status(port, &format!("/{ACCOUNT}?comp=list")).is_some())
}

/// Create a container with a SharedKey-signed `PUT ?restype=container`, in Node.
const CREATE_CONTAINER_JS: &str = r#"
const [port, account, key, container] = process.argv.slice(1);
const crypto = require("crypto"), http = require("http");
const date = new Date().toUTCString(), version = "2021-08-06";
// VERB, eleven empty standard headers, the x-ms-* headers, the resource (account in the path).
const toSign = "PUT\n" + "\n".repeat(11) + `x-ms-date:${date}\nx-ms-version:${version}\n` +
  `/${account}/${account}/${container}\nrestype:container`;
const sig = crypto.createHmac("sha256", Buffer.from(key, "base64")).update(toSign, "utf8").digest("base64");
const req = http.request({
  host: "127.0.0.1", port, method: "PUT", path: `/${account}/${container}?restype=container`,
  headers: { "x-ms-date": date, "x-ms-version": version, "Content-Length": 0,
             Authorization: `SharedKey ${account}:${sig}` },
}, (res) => {
  let body = "";
  res.on("data", (d) => (body += d));
  res.on("end", () => {
    if (res.statusCode === 201) process.exit(0);
    console.error(`HTTP ${res.statusCode}: ${body}`);
    process.exit(1);
  });
});
req.setTimeout(10000, () => req.destroy(new Error("no answer within 10 s")));
req.on("error", (e) => { console.error(e.message); process.exit(1); });
req.end();
"#;

fn create_container(port: u16, container: &str) {
    let out = Command::new("node")
        .arg("-e")
        .arg(CREATE_CONTAINER_JS)
        .args([&port.to_string(), ACCOUNT, KEY, container])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run node: {e}; Azurite and these tests need Node.js on PATH"));
    assert!(out.status.success(), "creating container {container}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Every file under `dir`, as (`/`-separated relative path, absolute path).
fn files(dir: &Path, rel: &str, out: &mut Vec<(String, PathBuf)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = format!("{rel}{}", e.file_name().to_str().unwrap());
        if e.file_type().unwrap().is_dir() {
            files(&e.path(), &format!("{name}/"), out);
        } else {
            out.push((name, e.path()));
        }
    }
}

/// Write the fixtures, start a server and upload them into container `data`.
async fn server() -> Azurite {
    // The fixtures' own client (below) is built before any of Stoker's, which install the
    // process's TLS provider: without one, reqwest panics (these tests run alone then failed).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    std::fs::create_dir_all(data.join("tar")).unwrap();
    std::fs::create_dir_all(data.join("objects")).unwrap();
    let tar = tar_dir(&data.join("tar"), 3, 7);
    // Includes a `.DS_Store` that the listing returns and the source must skip.
    let objects = objects_dir(&data.join("objects"));
    let (server, port) = start(root.path());
    create_container(port, CONTAINER);
    let store = MicrosoftAzureBuilder::new()
        .with_account(ACCOUNT)
        .with_access_key(KEY)
        .with_container_name(CONTAINER)
        .with_endpoint(format!("http://127.0.0.1:{port}/{ACCOUNT}"))
        .with_allow_http(true)
        .build()
        .unwrap();
    let mut all = Vec::new();
    files(&data, "", &mut all);
    for (name, path) in all {
        let bytes = std::fs::read(&path).unwrap();
        store
            .put(&object_store::path::Path::from(name.as_str()), PutPayload::from(bytes))
            .await
            .unwrap_or_else(|e| panic!("uploading {name} to Azurite: {e}"));
    }
    Azurite { _server: server, port, _root: root, tar, objects }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_tar_and_objects_over_azure() {
    let s = server().await;
    let src = open(&s.uri("tar", KEY)).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Tar));
    assert_eq!(src.info().shards, 3);
    run_all(src, &s.tar, "az://data/tar", &hidden(KEY)).await;

    // A plain endpoint, account and key reach the same server.
    let src = open(&s.plain_uri("objects")).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Objects));
    run_all(src, &s.objects, "az://data/objects", &hidden(KEY)).await;

    // A brace pattern names shards without listing; emulator mode defaults the account and key
    // and takes the endpoint with or without the account in its path.
    let bare = enc(&format!("http://127.0.0.1:{}", s.port));
    let src = open(&format!("az://data/tar/shard-{{0001..0002}}.tar?use_emulator=true&endpoint={bare}")).await;
    run_all(src, &s.tar[7..], "shard-{0001..0002}.tar", &hidden(KEY)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_never_show_and_a_wrong_key_fails_clearly() {
    let s = server().await;
    for uri in [s.uri("tar", KEY), s.plain_uri("tar")] {
        let src = open(&uri).await;
        let shown = format!("{src} {src:?}");
        assert!(hidden(KEY).iter().all(|k| !shown.contains(k)), "{shown}");
    }
    let opts = SourceOptions::from_query(&format!("account={ACCOUNT}&access_key={}", enc(KEY))).unwrap();
    assert!(hidden(KEY).iter().all(|k| !format!("{opts:?}").contains(k)), "{opts:?}");

    let e = stoker::open(&s.uri("tar", WRONG_KEY), Default::default()).await.unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("az://data/tar") && msg.contains("credentials"), "{msg}");
    assert!(hidden(WRONG_KEY).iter().all(|k| !msg.contains(k) && !format!("{e:?}").contains(k)), "{msg}");
    assert!(!e.is_retryable(), "a wrong key stays wrong: {e:?}");

    // A key that is not even base64 fails when the store is built, without quoting it.
    let e = stoker::open(&s.uri("tar", "notBase64KeyDoNotPrint!"), Default::default()).await.unwrap_err();
    assert!(!e.to_string().contains("notBase64KeyDoNotPrint"), "{e}");

    let e = stoker::open(&s.uri("nothing-here", KEY), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_replaced_after_indexing_fails_its_etag_precondition() {
    let s = server().await;
    let src = open(&s.uri("tar", KEY)).await;
    assert_eq!(src.get(0).await.unwrap(), s.tar[0]);
    // Overwrite the first shard: Azurite gives it a new ETag, and reads carry the old one.
    let store = MicrosoftAzureBuilder::new()
        .with_account(ACCOUNT)
        .with_access_key(KEY)
        .with_container_name(CONTAINER)
        .with_endpoint(s.endpoint())
        .with_allow_http(true)
        .build()
        .unwrap();
    let shard = tempfile::NamedTempFile::new().unwrap();
    write_tar(shard.path(), &tar_samples(9, 7));
    let bytes = std::fs::read(shard.path()).unwrap();
    store.put(&object_store::path::Path::from("tar/shard-0000.tar"), PutPayload::from(bytes)).await.unwrap();
    let e = src.get(1).await.unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("shard-0000.tar") && msg.contains("entity tag") && msg.contains("reopen"), "{msg}");
    assert!(!e.is_retryable(), "{e:?}");
    assert_eq!(src.get(7).await.unwrap(), s.tar[7], "the other shards still read");
    // Reopening lists the new tag and re-indexes.
    let fresh = open(&s.uri("tar", KEY)).await;
    assert_eq!(fresh.get(1).await.unwrap(), tar_samples(9, 7)[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_larger_than_a_part_is_written_to_azure_in_blocks() {
    use bytes::Bytes;
    let s = server().await;
    let dest = s.uri("written", KEY);
    let w = stoker::pack::ShardWriter::open(&dest, Default::default()).unwrap();
    // 18 samples of 1 MiB: two whole 8 MiB parts (Azure blocks) and a last one.
    let big: Vec<Sample> = (0..18u8)
        .map(|i| Sample {
            key: format!("s/{i:03}"),
            fields: vec![stoker::Field { name: "bin".into(), data: Bytes::from(vec![i; 1 << 20]) }],
        })
        .collect();
    let done = w.write("p-000000-0000.tar", &big).await.unwrap();
    assert!(done.bytes > 2 * (8 << 20) && !done.kept, "{done:?}");
    let opts = SourceOptions { checksums: Some(true), ..Default::default() };
    let back = stoker::open(&dest, opts).await.unwrap();
    let got = back.get_many(&(0..18).collect::<Vec<_>>()).await.unwrap();
    for (g, want) in got.iter().zip(&big) {
        assert!(g.key == want.key && g.fields[0].data == want.fields[0].data, "{}", g.key);
    }
    assert!(w.write("p-000000-0000.tar", &big).await.unwrap().kept, "a rerun keeps it");
}
