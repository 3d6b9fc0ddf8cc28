//! A fault-injecting HTTP/1.1 reverse proxy.
//!
//! Put it between an S3 client and [`crate::s3`] to make the pipeline see
//! what real object stores do under load: added latency with jitter, rare
//! latency spikes (for hedged requests), `503 SlowDown`, connections reset
//! mid-request, and bodies cut short; and, for benchmarks, a link of limited
//! bandwidth that every forwarded response body shares.
//!
//! Every proxied request draws the same five random numbers from one seeded
//! RNG, in arrival order, whatever the knobs are set to; the fault pattern
//! for a given seed and request order is therefore reproducible.
//!
//! Control endpoints, answered by the proxy itself and never forwarded nor
//! counted:
//!
//! * `GET /__proxy/stats`: counters as JSON ([`ProxyStats`]).
//! * `POST /__proxy/stats/reset`: zero the counters.
//! * `GET /__proxy/config`: current [`FaultConfig`] as JSON.
//! * `POST /__proxy/config`: JSON [`FaultPatch`] with any subset of the knobs;
//!   answers the new config, or `400` (config unchanged) if invalid.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::net::TcpListener;

use crate::rng::XorShift64;
use crate::ServerHandle;

mod config;
mod faults;
mod link;

pub use config::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;
use faults::{InjectedReset, ResettableStream, TruncatedBody};
use link::{Link, PacedBody};

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    forwarded: AtomicU64,
    slowdowns: AtomicU64,
    resets: AtomicU64,
    truncations: AtomicU64,
    spikes: AtomicU64,
    upstream_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct FaultState {
    config: FaultConfig,
    rng: XorShift64,
}

struct Shared {
    upstream: SocketAddr,
    faults: Mutex<FaultState>,
    counters: Counters,
    /// The last [`LOG_LEN`] requests, oldest first.
    log: Mutex<std::collections::VecDeque<LoggedRequest>>,
    client: Client<HttpConnector, Incoming>,
    /// The link response bodies share when `link_mib_s` is set.
    link: Arc<Link>,
}

/// Requests kept in the log ([`ProxyControl::recent_requests`]).
pub const LOG_LEN: usize = 4096;

/// One request as the proxy received it, for tests that check what a client asked for and
/// in which order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoggedRequest {
    /// `GET`, `HEAD`, `PUT`...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The `Range` header, if any (`bytes=0-1023`).
    pub range: Option<String>,
}

/// What to do with one request, drawn up front.
struct Decision {
    delay: Duration,
    /// The link's rate when the request was taken (0: no limit).
    link_mib_s: u64,
    spike: bool,
    slowdown: bool,
    reset: bool,
    truncate: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // A panic while holding this lock cannot leave the state torn (plain
        // field writes), so a poisoned lock is still usable.
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn decide(&self) -> Decision {
        let mut guard = self.lock();
        let FaultState { config: c, rng } = &mut *guard;
        // Always five draws in this order, so the sequence depends only on the
        // seed and request order, not on which knobs happen to be on.
        let jitter = rng.up_to(c.jitter_ms);
        let spike = rng.chance(c.spike_prob);
        let slowdown = rng.chance(c.slowdown);
        let reset = rng.chance(c.reset);
        let truncate = rng.chance(c.truncate);
        let spike_ms = if spike { c.spike_ms } else { 0 };
        Decision {
            delay: Duration::from_millis(c.latency_ms + jitter + spike_ms),
            link_mib_s: c.link_mib_s,
            spike,
            slowdown,
            reset,
            truncate,
        }
    }
}

/// In-process access to a running proxy's counters and knobs; the same
/// operations as the HTTP control endpoints.
#[derive(Clone)]
pub struct ProxyControl {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ProxyControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyControl").field("upstream", &self.shared.upstream).finish_non_exhaustive()
    }
}

impl ProxyControl {
    /// A snapshot of the counters.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            requests: get(&c.requests),
            forwarded: get(&c.forwarded),
            slowdowns: get(&c.slowdowns),
            resets: get(&c.resets),
            truncations: get(&c.truncations),
            spikes: get(&c.spikes),
            upstream_errors: get(&c.upstream_errors),
        }
    }

    /// Sets all counters to zero and empties the request log.
    pub fn reset_stats(&self) {
        let c = &self.shared.counters;
        for a in [&c.requests, &c.forwarded, &c.slowdowns, &c.resets, &c.truncations, &c.spikes, &c.upstream_errors] {
            a.store(0, Ordering::Relaxed);
        }
        self.shared.log.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The last [`LOG_LEN`] proxied requests (control requests excluded), in arrival order.
    pub fn recent_requests(&self) -> Vec<LoggedRequest> {
        self.shared.log.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    /// The current fault settings.
    pub fn config(&self) -> FaultConfig {
        self.shared.lock().config.clone()
    }

    /// Applies `patch`; a `seed` in it restarts the RNG sequence.
    ///
    /// # Errors
    /// If the result is invalid (see [`FaultConfig::validate`]); the
    /// settings are then left unchanged.
    pub fn apply(&self, patch: &FaultPatch) -> Result<FaultConfig, String> {
        let mut state = self.shared.lock();
        let next = state.config.patched(patch);
        next.validate()?;
        if let Some(seed) = patch.seed {
            state.rng = XorShift64::new(seed);
        }
        state.config = next.clone();
        Ok(next)
    }
}

/// A running proxy: its server handle plus in-process control.
#[derive(Debug)]
pub struct ProxyHandle {
    /// The listening server.
    pub server: ServerHandle,
    /// Counters and knobs.
    pub control: ProxyControl,
}

impl ProxyHandle {
    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://IP:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// Stops the proxy (see [`ServerHandle::shutdown`]).
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

/// Binds and starts the proxy in a background task.
///
/// # Errors
/// An invalid fault config (as `InvalidInput`) or a bind failure.
pub fn serve(config: ProxyConfig) -> crate::Boxed<io::Result<ProxyHandle>> {
    Box::pin(serve_here(config))
}

/// [`serve`]'s body, boxed there for the reason `s3::serve` gives.
async fn serve_here(config: ProxyConfig) -> io::Result<ProxyHandle> {
    config.faults.validate().map_err(|msg| io::Error::new(io::ErrorKind::InvalidInput, msg))?;

    let mut connector = HttpConnector::new();
    // Same reason as on the accept side: no Nagle stalls on small requests.
    connector.set_nodelay(true);
    // Idle upstream connections are reused (keep-alive is the pool's default).
    let client = Client::builder(TokioExecutor::new()).build(connector);

    let shared = Arc::new(Shared {
        upstream: config.upstream,
        faults: Mutex::new(FaultState { rng: XorShift64::new(config.faults.seed), config: config.faults }),
        counters: Counters::default(),
        log: Mutex::default(),
        client,
        link: Arc::default(),
    });
    let control = ProxyControl { shared: shared.clone() };

    let listener = TcpListener::bind(config.listen).await?;
    let server = crate::spawn_accept_loop(listener, move |socket, graceful| {
        let reset = Arc::new(AtomicBool::new(false));
        let io = TokioIo::new(ResettableStream { inner: socket, reset: reset.clone() });
        let shared = shared.clone();
        let svc = service_fn(move |req| handle(shared.clone(), reset.clone(), req));
        let conn = hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(io, svc);
        let conn = graceful.watch(conn);
        Box::pin(async move {
            // Errors here are injected faults or client disconnects.
            let _ = conn.await;
        })
    })?;
    Ok(ProxyHandle { server, control })
}

async fn handle(
    shared: Arc<Shared>,
    reset_flag: Arc<AtomicBool>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, InjectedReset> {
    if req.uri().path().starts_with(CONTROL_PREFIX) {
        return Ok(control(&shared, req).await);
    }
    let c = &shared.counters;
    bump(&c.requests);
    {
        let range = req.headers().get(header::RANGE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let logged = LoggedRequest { method: req.method().to_string(), path: req.uri().path().to_owned(), range };
        let mut log = shared.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() == LOG_LEN {
            log.pop_front();
        }
        log.push_back(logged);
    }

    let d = shared.decide();
    if d.spike {
        bump(&c.spikes);
    }
    if !d.delay.is_zero() {
        tokio::time::sleep(d.delay).await;
    }
    if d.slowdown {
        bump(&c.slowdowns);
        return Ok(slowdown_response());
    }
    if d.reset {
        bump(&c.resets);
        reset_flag.store(true, Ordering::SeqCst);
        return Err(InjectedReset);
    }

    let truncate = d.truncate && matches!(*req.method(), Method::GET | Method::HEAD);
    let is_head = req.method() == Method::HEAD;
    let upstream_req = match upstream_request(shared.upstream, req) {
        Ok(r) => r,
        Err(msg) => return Ok(text_response(StatusCode::BAD_REQUEST, msg)),
    };
    bump(&c.forwarded);
    let resp = match shared.client.request(upstream_req).await {
        Ok(resp) => resp,
        Err(err) => {
            bump(&c.upstream_errors);
            return Ok(text_response(StatusCode::BAD_GATEWAY, format!("upstream error: {err}")));
        }
    };

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = if truncate {
        bump(&c.truncations);
        let declared =
            parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if is_head || declared == Some(0) {
            // Nothing to cut (HEAD, empty body): end the connection right after
            // the headers instead, which is what a dying server looks like there.
            parts.headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            body.map_err(BoxError::from).boxed()
        } else {
            TruncatedBody::new(body, declared.map(|n| n / 2)).boxed()
        }
    } else {
        body.map_err(BoxError::from).boxed()
    };
    Ok(Response::from_parts(parts, paced(&shared, d.link_mib_s, body)))
}

/// `body` through the shared link at `mib_s` MiB/s, or as it is when there is no limit.
fn paced(shared: &Shared, mib_s: u64, body: ProxyBody) -> ProxyBody {
    if mib_s == 0 {
        return body;
    }
    PacedBody::new(body, shared.link.clone(), mib_s).boxed()
}

/// Rewrites a client request for the upstream: absolute URI, hop-by-hop
/// headers removed. `Host` is kept because SigV4 signs it; changing it would
/// make every signed request fail at the upstream.
fn upstream_request(upstream: SocketAddr, req: Request<Incoming>) -> Result<Request<Incoming>, String> {
    let (mut parts, body) = req.into_parts();
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    parts.uri = format!("http://{upstream}{pq}").parse().map_err(|e| format!("bad request target: {e}"))?;
    strip_hop_by_hop(&mut parts.headers);
    // hyper already answered any `Expect: 100-continue` on our side.
    parts.headers.remove(header::EXPECT);
    Ok(Request::from_parts(parts, body))
}

/// Removes headers that apply to one connection only (RFC 9110 §7.6.1),
/// including any named in `Connection`; hyper re-frames each side itself.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

fn full(body: impl Into<Bytes>) -> ProxyBody {
    Full::new(body.into()).map_err(|never: Infallible| match never {}).boxed()
}

fn slowdown_response() -> Response<ProxyBody> {
    let mut resp = Response::new(full(SLOWDOWN_BODY));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml"));
    resp
}

fn text_response(status: StatusCode, msg: impl Into<String>) -> Response<ProxyBody> {
    let mut resp = Response::new(full(msg.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}

fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<ProxyBody> {
    // Serializing these plain structs cannot fail; fall back to `{}` anyway.
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Largest accepted `POST /__proxy/config` body.
const MAX_CONTROL_BODY: usize = 64 * 1024;

async fn control(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let ctl = ProxyControl { shared: shared.clone() };
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/__proxy/stats") => json_response(StatusCode::OK, &ctl.stats()),
        (Method::POST, "/__proxy/stats/reset") => {
            ctl.reset_stats();
            json_response(StatusCode::OK, &ctl.stats())
        }
        (Method::GET, "/__proxy/config") => json_response(StatusCode::OK, &ctl.config()),
        (Method::POST, "/__proxy/config") => {
            let bytes = match Limited::new(req.into_body(), MAX_CONTROL_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return text_response(StatusCode::BAD_REQUEST, format!("cannot read body: {e}\n")),
            };
            let patch: FaultPatch = match serde_json::from_slice(&bytes) {
                Ok(p) => p,
                Err(e) => return text_response(StatusCode::BAD_REQUEST, format!("invalid config JSON: {e}\n")),
            };
            match ctl.apply(&patch) {
                Ok(cfg) => json_response(StatusCode::OK, &cfg),
                Err(msg) => text_response(StatusCode::BAD_REQUEST, format!("{msg}\n")),
            }
        }
        _ => text_response(
            StatusCode::NOT_FOUND,
            "control endpoints: GET /__proxy/stats, POST /__proxy/stats/reset, GET|POST /__proxy/config\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_bad_knobs() {
        assert!(FaultConfig::default().validate().is_ok());
        let bad = FaultConfig { slowdown: 1.5, ..FaultConfig::default() };
        assert!(bad.validate().unwrap_err().contains("slowdown"));
        let bad = FaultConfig { spike_prob: -0.1, ..FaultConfig::default() };
        assert!(bad.validate().unwrap_err().contains("spike_prob"));
        let bad = FaultConfig { latency_ms: MAX_DELAY_MS + 1, ..FaultConfig::default() };
        assert!(bad.validate().unwrap_err().contains("latency_ms"));
    }

    #[test]
    fn patch_accepts_both_spellings_and_rejects_typos() {
        let p: FaultPatch = serde_json::from_str(r#"{"latency-ms": 5, "spike_ms": 7, "slowdown": 0.5}"#).unwrap();
        assert_eq!(p.latency_ms, Some(5));
        assert_eq!(p.spike_ms, Some(7));
        let cfg = FaultConfig::default().patched(&p);
        assert_eq!((cfg.latency_ms, cfg.spike_ms, cfg.slowdown, cfg.reset), (5, 7, 0.5, 0.0));
        assert!(serde_json::from_str::<FaultPatch>(r#"{"slowdwn": 1.0}"#).is_err());
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-custom"));
        h.insert("x-custom", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:1"));
        h.insert("x-amz-date", HeaderValue::from_static("20240101T000000Z"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "x-amz-date"]);
    }
}
