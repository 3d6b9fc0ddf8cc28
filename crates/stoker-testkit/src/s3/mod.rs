//! An S3 endpoint over a local directory (`s3s` + `s3s-fs`).
//!
//! Each top-level subdirectory of the root is a bucket. Requests are
//! path-style (`http://127.0.0.1:PORT/bucket/key`), which is what
//! `object_store`'s `AmazonS3Builder` sends with
//! `with_virtual_hosted_style_request(false)`.
//!
//! The service is built the same way as the stock `s3s-fs` binary, with two
//! differences that matter for tests: `TCP_NODELAY` on every connection, and
//! a SigV4 region check (real S3 rejects a signature scoped to another
//! region; `s3s` alone accepts any region, which would hide a client
//! misconfiguration). GetObject bodies are streamed in large reads (see
//! [`S3ServerConfig::get_read_bytes`]): `s3s-fs` alone reads 4 KiB at a time, which
//! made large reads measure the server.

mod get;

use std::net::SocketAddr;
use std::path::PathBuf;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::{S3Service, S3ServiceBuilder};
use tokio::net::TcpListener;

use crate::ServerHandle;

/// Access key / secret key pair for SigV4 authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id (`AWS_ACCESS_KEY_ID`).
    pub access_key: String,
    /// The secret access key (`AWS_SECRET_ACCESS_KEY`).
    pub secret_key: String,
}

/// Settings for [`serve`].
#[derive(Debug, Clone)]
pub struct S3ServerConfig {
    /// Directory served; each subdirectory is a bucket. Must exist.
    pub root: PathBuf,
    /// Address to bind; port 0 picks a free port.
    pub addr: SocketAddr,
    /// When set, every request must carry a valid SigV4 signature made with
    /// these keys. When `None`, only unsigned requests are accepted (`s3s`
    /// answers signed requests with `NotImplemented` when it has no keys), so
    /// clients must use `with_skip_signature(true)`.
    pub credentials: Option<Credentials>,
    /// Region a SigV4 signature must be scoped to (real S3 rejects others).
    pub region: String,
    /// Buckets to create (as subdirectories of `root`) before serving.
    pub buckets: Vec<String>,
    /// Bytes per file read when streaming a GetObject body (default 1 MiB; at least 4 KiB).
    /// `None` keeps `s3s-fs`'s own GetObject, which reads 4 KiB at a time (about 50 MiB/s a
    /// stream here against about 450 MiB/s with 1 MiB reads): only for measuring that.
    pub get_read_bytes: Option<usize>,
}

/// [`S3ServerConfig::get_read_bytes`]'s default.
pub const DEFAULT_GET_READ_BYTES: usize = 1 << 20;

impl S3ServerConfig {
    /// Defaults: `127.0.0.1:0`, no auth, `us-east-1`, no extra buckets.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            credentials: None,
            region: "us-east-1".to_owned(),
            buckets: Vec::new(),
            get_read_bytes: Some(DEFAULT_GET_READ_BYTES),
        }
    }

    /// Requires SigV4 signatures made with these keys.
    pub fn with_credentials(mut self, access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        self.credentials = Some(Credentials { access_key: access_key.into(), secret_key: secret_key.into() });
        self
    }

    /// Adds a bucket to create at start.
    pub fn with_bucket(mut self, name: impl Into<String>) -> Self {
        self.buckets.push(name.into());
        self
    }
}

/// Why [`serve`] could not start.
#[derive(Debug)]
pub enum ServeError {
    /// The configuration is unusable (bad root, bucket name or region).
    Config(String),
    /// Binding or another I/O step failed.
    Io(std::io::Error),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(msg) => f.write_str(msg),
            Self::Io(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for ServeError {}

impl From<std::io::Error> for ServeError {
    fn from(err: std::io::Error) -> Self {
        Self::Io(err)
    }
}

/// Checks a bucket name against S3's rules (3-63 chars of `a-z0-9.-`,
/// alphanumeric at both ends, no `..`).
///
/// Besides matching S3, this keeps `--bucket ../x` from creating
/// directories outside the root.
///
/// # Errors
/// Returns a message saying which rule the name breaks.
pub fn validate_bucket_name(name: &str) -> Result<(), String> {
    let ok_len = (3..=63).contains(&name.len());
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    let ok_ends = name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok_len && ok_chars && ok_ends && !name.contains("..") {
        Ok(())
    } else {
        Err(format!(
            "invalid bucket name {name:?}: use 3-63 characters from a-z, 0-9, '.', '-', starting and ending with a letter or digit"
        ))
    }
}

/// Prefixes an I/O error's message, keeping its kind for callers that match on it.
fn with_context(err: std::io::Error, what: String) -> ServeError {
    ServeError::Io(std::io::Error::new(err.kind(), format!("{what}: {err}")))
}

/// Builds the `s3s` service as `s3s-fs`'s own binary does (path-style only, optional
/// single-key auth), with GetObject bodies read in large chunks unless asked otherwise.
fn build_service(config: &S3ServerConfig) -> Result<S3Service, ServeError> {
    let cannot = |e: &dyn std::fmt::Debug| ServeError::Config(format!("cannot serve {}: {e:?}", config.root.display()));
    let fs = s3s_fs::FileSystem::new(&config.root).map_err(|e| cannot(&e))?;
    let mut builder = match config.get_read_bytes {
        Some(n) => S3ServiceBuilder::new(get::LargeReads::new(fs, &config.root, n).map_err(|e| cannot(&e))?),
        None => S3ServiceBuilder::new(fs),
    };
    if let Some(creds) = &config.credentials {
        builder.set_auth(SimpleAuth::from_single(creds.access_key.clone(), creds.secret_key.clone()));
    }
    // No `set_host`: without a domain every request is parsed path-style.
    Ok(builder.build())
}

/// Validates the config, creates the requested buckets, binds, and starts
/// serving in a background task.
///
/// # Errors
/// [`ServeError::Config`] for a missing root, bad bucket name or empty
/// region; [`ServeError::Io`] if binding or creating a bucket fails.
pub fn serve(config: S3ServerConfig) -> crate::Boxed<Result<ServerHandle, ServeError>> {
    Box::pin(serve_here(config))
}

/// [`serve`]'s body. Boxed there so that the server's code (hyper's and s3s's generics) is
/// compiled with this crate, beside the library, not again in each binary that awaits it.
async fn serve_here(config: S3ServerConfig) -> Result<ServerHandle, ServeError> {
    if !config.root.is_dir() {
        return Err(ServeError::Config(format!("root {} is not an existing directory", config.root.display())));
    }
    if config.region.is_empty() || !config.region.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(ServeError::Config(format!("invalid region {:?}", config.region)));
    }
    if let Some(c) = &config.credentials {
        if c.access_key.is_empty() || c.secret_key.is_empty() {
            return Err(ServeError::Config("access key and secret key must not be empty".into()));
        }
    }
    for bucket in &config.buckets {
        validate_bucket_name(bucket).map_err(ServeError::Config)?;
        let dir = config.root.join(bucket);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| with_context(e, format!("cannot create bucket directory {}", dir.display())))?;
    }

    let service = build_service(&config)?;
    let region: std::sync::Arc<str> = config.region.clone().into();
    let listener =
        TcpListener::bind(config.addr).await.map_err(|e| with_context(e, format!("cannot bind {}", config.addr)))?;

    crate::spawn_accept_loop(listener, move |socket, graceful| {
        let service = service.clone();
        let region = region.clone();
        let svc = service_fn(move |req: http::Request<Incoming>| {
            let service = service.clone();
            let region = region.clone();
            async move {
                if let Some(resp) = check_region(&req, &region) {
                    return Ok(resp);
                }
                service.call(req.map(s3s::Body::from)).await
            }
        });
        // `auto` serves HTTP/1.1 and h2c like the stock binary.
        let conn = ConnBuilder::new(TokioExecutor::new()).serve_connection(TokioIo::new(socket), svc).into_owned();
        let conn = graceful.watch(conn);
        Box::pin(async move {
            // Client disconnects surface here; they are normal for tests.
            let _ = conn.await;
        })
    })
    .map_err(ServeError::Io)
}

/// Extracts the region from a SigV4 credential scope
/// (`AKID/20240101/REGION/s3/aws4_request`).
fn scope_region(credential: &str) -> Option<&str> {
    credential.split('/').nth(2)
}

/// Returns the region a SigV4 request is signed for, from the
/// `Authorization` header or a presigned URL's `X-Amz-Credential`.
fn request_region(req: &http::Request<Incoming>) -> Option<String> {
    if let Some(auth) = req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let cred = auth
            .strip_prefix("AWS4-HMAC-SHA256")?
            .split(',')
            .find_map(|part| part.trim().strip_prefix("Credential="))?;
        return scope_region(cred).map(str::to_owned);
    }
    let query = req.uri().query()?;
    query.split('&').find_map(|pair| {
        let value = pair.strip_prefix("X-Amz-Credential=")?;
        // The scope is percent-encoded in URLs ('/' as %2F).
        let decoded = value.replace("%2F", "/").replace("%2f", "/");
        scope_region(&decoded).map(str::to_owned)
    })
}

/// Rejects a request signed for a region other than `expected`, with the
/// error real S3 returns (`400 AuthorizationHeaderMalformed`).
fn check_region(req: &http::Request<Incoming>, expected: &str) -> Option<s3s::HttpResponse> {
    let got = request_region(req)?;
    if got == expected {
        return None;
    }
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AuthorizationHeaderMalformed</Code>\
         <Message>The authorization header is malformed; the region '{got}' is wrong; expecting '{expected}'</Message>\
         <Region>{expected}</Region></Error>"
    );
    let mut resp = http::Response::new(s3s::Body::from(body));
    *resp.status_mut() = http::StatusCode::BAD_REQUEST;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket", "a.b-c", "0day"] {
            assert!(validate_bucket_name(ok).is_ok(), "{ok}");
        }
        for bad in ["ab", "../etc", "Upper", "a..b", "-ab", "ab-", "a/b", "", &"x".repeat(64)] {
            assert!(validate_bucket_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scope_region_parses() {
        assert_eq!(scope_region("AK/20240101/eu-west-1/s3/aws4_request"), Some("eu-west-1"));
        assert_eq!(scope_region("garbage"), None);
    }
}
