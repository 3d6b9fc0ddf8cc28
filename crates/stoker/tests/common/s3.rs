//! The embedded S3 server (s3s-fs over a directory, in-process on loopback) and the fault
//! proxy in front of it, as the remote tests start them.

use stoker_testkit::proxy::{self, FaultPatch, ProxyConfig};
use stoker_testkit::s3::{self, S3ServerConfig};
use stoker_testkit::ServerHandle;

/// The test server's access key id and secret key (the secret must never be printed).
pub const AK: &str = "stoker-test-key";
pub const SK: &str = "s3cr3t-do-not-print";

/// Serve `root` (one directory per bucket) with the test credentials.
pub async fn serve(root: &std::path::Path) -> ServerHandle {
    s3::serve(S3ServerConfig::new(root).with_credentials(AK, SK)).await.unwrap()
}

/// `s3://data/{path}` at `endpoint` with the test credentials and `extra` options (`&k=v`).
///
/// The disk cache is off unless `extra` sets it up: it is on by default for remote sources
/// and outlives a test, so a test counting requests would see the hits of an earlier run.
pub fn uri(endpoint: &str, path: &str, extra: &str) -> String {
    let cache = if extra.contains("disk_cache") { "" } else { "&disk_cache=false" };
    format!("s3://data/{path}?endpoint={endpoint}&access_key_id={AK}&secret_access_key={SK}{cache}{extra}")
}

/// The fault proxy in front of `upstream`, with `faults` applied.
pub async fn with_proxy(upstream: &ServerHandle, faults: FaultPatch) -> proxy::ProxyHandle {
    let p = proxy::serve(ProxyConfig::new(upstream.addr())).await.unwrap();
    p.control.apply(&faults).unwrap();
    p
}
