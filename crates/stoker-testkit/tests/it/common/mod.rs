//! Helpers shared by the integration tests.
//!
//! Everything talks to real servers on 127.0.0.1; the raw HTTP helpers exist
//! because some faults (RST, short bodies) are only observable below the
//! level of an HTTP client library.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{ClientOptions, RetryConfig};
use stoker_testkit::s3::{self, S3ServerConfig};
use stoker_testkit::ServerHandle;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub const ACCESS_KEY: &str = "stoker-test-ak";
pub const SECRET_KEY: &str = "stoker-test-secret";
pub const BUCKET: &str = "train";

/// Upper bound for any single test body, so a hang fails instead of stalling CI.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `fut` with [`TEST_TIMEOUT`].
pub async fn bounded<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, fut).await.expect("test exceeded its time limit")
}

/// An in-process S3 server over a fresh temp dir with [`BUCKET`] and keys.
pub struct TestS3 {
    pub dir: tempfile::TempDir,
    pub server: ServerHandle,
}

pub async fn start_s3() -> TestS3 {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = S3ServerConfig::new(dir.path()).with_credentials(ACCESS_KEY, SECRET_KEY).with_bucket(BUCKET);
    let server = s3::serve(config).await.expect("start s3 server");
    TestS3 { dir, server }
}

/// Client options with short timeouts: everything is local, and a stuck
/// request must fail the test quickly.
pub fn client_options() -> ClientOptions {
    ClientOptions::new().with_timeout(Duration::from_secs(5)).with_connect_timeout(Duration::from_secs(2))
}

/// No retries, so injected faults reach the test instead of being retried away.
pub fn no_retry() -> RetryConfig {
    RetryConfig { max_retries: 0, retry_timeout: Duration::from_secs(1), ..RetryConfig::default() }
}

/// A path-style, plain-HTTP S3 client for `endpoint`, as Stoker configures it.
pub fn s3_builder(endpoint: &str) -> AmazonS3Builder {
    // Client options first: `with_client_options` replaces the whole set,
    // including the `allow_http` flag that `with_allow_http` stores there.
    AmazonS3Builder::new()
        .with_client_options(client_options())
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_retry(no_retry())
}

/// [`s3_builder`] with the test keys.
pub fn store(endpoint: &str) -> Arc<AmazonS3> {
    Arc::new(
        s3_builder(endpoint)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .build()
            .expect("build store"),
    )
}

/// Deterministic, non-repeating-looking test bytes.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Reads one response (Content-Length or chunked framing) from `r`.
/// `head` tells that the request was HEAD (no body whatever the headers say).
pub async fn read_response(r: &mut BufReader<TcpStream>, head: bool) -> std::io::Result<RawResponse> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').ok_or_else(|| std::io::Error::other("bad header"))?;
        headers.push((n.trim().to_owned(), v.trim().to_owned()));
    }
    let mut resp = RawResponse { status, headers, body: Vec::new() };
    if head {
        return Ok(resp);
    }
    if resp.header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            line.clear();
            r.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim(), 16).map_err(std::io::Error::other)?;
            if size == 0 {
                line.clear();
                r.read_line(&mut line).await?; // final CRLF (no trailers expected)
                break;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).await?;
            resp.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().map_err(std::io::Error::other)?;
        resp.body = vec![0; len];
        r.read_exact(&mut resp.body).await?;
    }
    Ok(resp)
}

/// Sends one request on a fresh connection (`Connection: close`) and reads
/// the response.
pub async fn raw_request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> std::io::Result<RawResponse> {
    raw_request_with(addr, method, path, &[], body).await
}

/// [`raw_request`] with extra request headers.
pub async fn raw_request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<RawResponse> {
    let stream = TcpStream::connect(addr).await?;
    let mut r = BufReader::new(stream);
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    r.get_mut().write_all(req.as_bytes()).await?;
    r.get_mut().write_all(body).await?;
    read_response(&mut r, method == "HEAD").await
}

/// `GET /__proxy/stats` parsed.
pub async fn proxy_stats(proxy: SocketAddr) -> stoker_testkit::proxy::ProxyStats {
    let resp = raw_request(proxy, "GET", "/__proxy/stats", b"").await.expect("stats request");
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    serde_json::from_slice(&resp.body).expect("stats JSON")
}

/// `POST /__proxy/config` with `json`; returns the response.
pub async fn proxy_configure(proxy: SocketAddr, json: &str) -> RawResponse {
    raw_request(proxy, "POST", "/__proxy/config", json.as_bytes()).await.expect("config request")
}
