//! The layouts over Google Cloud Storage: a real fake-gcs-server (the Go emulator that
//! integration/setup.sh installs) as a child process on loopback. Same conformance suite as
//! the local layouts and S3.
//!
//! The server loads the fixtures at start (`-data DIR`: each directory a bucket, each file an
//! object); object_store reaches it through a service-account JSON with `gcs_base_url` and
//! `disable_oauth`, given inline or as a file path.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::*;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use stoker::conformance::run_all;
use stoker::{Error, Layout, Sample};

/// Stands for the private key of a real service account, which must never be shown. Never
/// parsed (OAuth is off for the emulator); alphanumeric, so it reads the same percent-encoded
/// in a URI and a search for it finds that form too.
const PRIVATE_KEY: &str = "stokerGcsPrivateKeyS3cr3tDoNotPrint";

/// A fake-gcs-server serving the fixtures.
struct Gcs {
    /// Declared first: dropped (killed) before its directory goes.
    _server: Killed,
    port: u16,
    root: tempfile::TempDir,
    /// Samples written under `data/tar` (3 shards) and `data/objects`.
    tar: Vec<Sample>,
    objects: Vec<Sample>,
}

impl Gcs {
    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The service-account JSON that points object_store at this server.
    fn service_account(&self) -> String {
        serde_json::json!({
            "gcs_base_url": self.base_url(),
            "disable_oauth": true,
            "client_email": "stoker-test@example.invalid",
            "private_key": PRIVATE_KEY,
            "private_key_id": "stoker-test-key-id",
        })
        .to_string()
    }

    /// A `gs://` URI with the service account as a key file (written next to the fixtures).
    fn uri(&self, bucket_and_path: &str) -> String {
        let file = self.root.path().join("service-account.json");
        if !file.exists() {
            std::fs::write(&file, self.service_account()).unwrap();
        }
        let path = utf8_percent_encode(file.to_str().unwrap(), NON_ALPHANUMERIC).to_string();
        format!("gs://{bucket_and_path}?allow_http=true&disk_cache=false&service_account={path}")
    }

    /// The same with the service account's JSON inline in the query.
    fn inline_uri(&self, bucket_and_path: &str) -> String {
        let sa = utf8_percent_encode(&self.service_account(), NON_ALPHANUMERIC).to_string();
        format!("gs://{bucket_and_path}?allow_http=true&disk_cache=false&service_account={sa}")
    }
}

/// Start the server over `root/buckets` on a free loopback port and wait until it answers.
fn start(root: &Path) -> (Killed, u16) {
    let bin = installed_tool("STOKER_FAKE_GCS", ".venv/bin/fake-gcs-server", "fake-gcs-server");
    let command = |port: u16| {
        let mut c = Command::new(&bin);
        c.args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port.to_string()])
            // object_store speaks the XML API, which the server routes by this Host header.
            .args(["-public-host", &format!("127.0.0.1:{port}")])
            .args(["-backend", "memory", "-log-level", "warn", "-data"])
            .arg(root.join("buckets"));
        c
    };
    start_server("fake-gcs-server", root, command, |port| http_status(port, "/storage/v1/b") == Some(200))
}

/// Write the fixtures and start a server over them.
fn server() -> Gcs {
    let root = tempfile::tempdir().unwrap();
    let bucket = root.path().join("buckets/data");
    std::fs::create_dir_all(bucket.join("tar")).unwrap();
    std::fs::create_dir_all(bucket.join("objects")).unwrap();
    let tar = tar_dir(&bucket.join("tar"), 3, 7);
    // Includes a `.DS_Store` that the listing returns and the source must skip.
    let objects = objects_dir(&bucket.join("objects"));
    let (server, port) = start(root.path());
    Gcs { _server: server, port, root, tar, objects }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_tar_and_objects_over_gcs() {
    let s = server();
    let src = open(&s.uri("data/tar")).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Tar));
    assert_eq!(src.info().shards, 3);
    run_all(src, &s.tar, "gs://data/tar", &[PRIVATE_KEY]).await;

    let src = open(&s.uri("data/objects")).await;
    assert_eq!(src.info().known_layout(), Some(Layout::Objects));
    run_all(src, &s.objects, "gs://data/objects", &[PRIVATE_KEY]).await;

    // A brace pattern names shards without listing.
    let src = open(&s.uri("data/tar/shard-{0001..0002}.tar")).await;
    run_all(src, &s.tar[7..], "shard-{0001..0002}.tar", &[PRIVATE_KEY]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_service_account_never_shows() {
    let s = server();
    let uri = s.inline_uri("data/tar");
    let src = open(&uri).await;
    assert_eq!(src.len(), s.tar.len(), "the inline service account reaches the server");
    let shown = format!("{src} {src:?}");
    assert!(
        !shown.contains(PRIVATE_KEY),
        "the service account's private key shows in the source's Display/Debug (uri::redact does not treat \
         `service_account` as a secret): {shown}"
    );
    run_all(src, &s.tar, "gs://data/tar", &[PRIVATE_KEY]).await;

    // Errors that quote the URI do not quote the key either.
    let e = stoker::open(&s.inline_uri("data/nothing-here"), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e:?}");
    assert!(!e.to_string().contains(PRIVATE_KEY), "{e}");
    let broken = utf8_percent_encode(&format!("{{\"private_key\":\"{PRIVATE_KEY}\""), NON_ALPHANUMERIC).to_string();
    let e = stoker::open(&format!("gs://data/tar?allow_http=true&service_account={broken}"), Default::default())
        .await
        .unwrap_err();
    assert!(!e.to_string().contains(PRIVATE_KEY), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_fails_clearly() {
    let s = server();
    let src = open(&s.uri("data/tar")).await;
    assert!(!format!("{src} {src:?}").contains(PRIVATE_KEY));

    // Real GCS answers 404 for a missing bucket; fake-gcs-server answers 500 ("no bucket
    // named ..."), which is retried like any 5xx: keep the retries short.
    for uri in [s.uri("no-such-bucket/tar"), s.inline_uri("no-such-bucket/tar")] {
        let e = stoker::open(&format!("{uri}&attempts=2&backoff_ms=5"), Default::default()).await.unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("gs://no-such-bucket/tar"), "the error names the bucket: {msg}");
        assert!(msg.contains("no bucket named no-such-bucket"), "the error says why: {msg}");
        assert!(!msg.contains(PRIVATE_KEY) && !format!("{e:?}").contains(PRIVATE_KEY), "{msg}");
    }

    // No credentials anywhere (the tests never set GOOGLE_* variables).
    let google_env = ["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY"];
    if google_env.iter().chain(&["GOOGLE_APPLICATION_CREDENTIALS"]).all(|k| std::env::var_os(k).is_none()) {
        let e = stoker::open("gs://data/tar?allow_http=true", Default::default()).await.unwrap_err();
        assert!(e.to_string().contains("GOOGLE_APPLICATION_CREDENTIALS"), "{e}");
    }

    let e = stoker::open(&s.uri("data/nothing-here"), Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e:?}");
}
