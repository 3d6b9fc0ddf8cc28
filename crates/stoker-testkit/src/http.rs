//! A static file server over a directory that behaves as common HTTP servers do, in the ways
//! that matter to a reader of ranged bytes:
//!
//! * entity tags strong (`"…"`), weak (`W/"…"`, what nginx and Apache send for files) or
//!   absent, made from the file's modification time and size, so a file replaced in place
//!   gets a new tag;
//! * `If-Match` checked strictly when asked (RFC 9110's strong comparison: a weak tag never
//!   matches, so nginx answers `412` to a client that sends one back);
//! * `Range: bytes=a-b` answered `206` with `Content-Range`, `Last-Modified` in HTTP date form;
//! * no listing: WebDAV's `PROPFIND` answered `501 Not Implemented` (Python's `http.server`) or
//!   `405 Method Not Allowed` (nginx);
//! * injected `500 Internal Server Error`s: the next N GETs, or every GET of matching paths;
//! * bodies that stall halfway for a while ([`HttpControl::stall_next`]), ranged answers
//!   longer than the range asked for, their `Content-Length` saying so while `Content-Range`
//!   names the range ([`HttpControl::send_extra`]), and `302` redirects of every request to
//!   another server ([`HttpControl::redirect_to`]): what a broken or hostile server does.
//!
//! [`HttpControl`] changes the faults while it runs and counts requests by method.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::ServerHandle;

/// What entity tags the server sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tags {
    /// `"<mtime>-<size>"`.
    Strong,
    /// `W/"<mtime>-<size>"`, as nginx and Apache send for static files.
    Weak,
    /// None at all: only `Last-Modified` and the size tell versions apart.
    None,
    /// Neither a tag nor a `Last-Modified` (as Go's `http.ServeContent` with a zero time):
    /// only the size tells versions apart.
    Nothing,
}

/// How the server answers a listing (`PROPFIND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoListing {
    /// `501 Not Implemented`, as Python's `http.server` does.
    NotImplemented,
    /// `405 Method Not Allowed`, as nginx does.
    NotAllowed,
}

/// How to run the server.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// The directory served at `/`.
    pub root: PathBuf,
    /// Entity tags.
    pub tags: Tags,
    /// Answer `412` to an `If-Match` that does not strongly match the current tag.
    pub strict_if_match: bool,
    /// The answer to a listing.
    pub listing: NoListing,
    /// Address to bind (port 0: a free one on loopback).
    pub listen: SocketAddr,
}

impl HttpConfig {
    /// Serve `root` with strong tags, strict `If-Match`, `501` to listings, on a free port.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HttpConfig {
            root: root.into(),
            tags: Tags::Strong,
            strict_if_match: true,
            listing: NoListing::NotImplemented,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }

    /// With these entity tags.
    pub fn with_tags(mut self, tags: Tags) -> Self {
        self.tags = tags;
        self
    }

    /// With this answer to listings.
    pub fn with_listing(mut self, listing: NoListing) -> Self {
        self.listing = listing;
        self
    }
}

/// Faults and counters of a running server.
#[derive(Debug, Default)]
pub struct HttpControl {
    fail_next: AtomicU64,
    fail_matching: std::sync::Mutex<Option<String>>,
    gets: AtomicU64,
    heads: AtomicU64,
    listings: AtomicU64,
    failed: AtomicU64,
    precondition_failed: AtomicU64,
    if_match_sent: AtomicU64,
    stall_next: AtomicU64,
    stall_ms: AtomicU64,
    stalled: AtomicU64,
    extra: AtomicU64,
    sent: AtomicU64,
    redirect: std::sync::Mutex<Option<String>>,
    redirected: AtomicU64,
    refuse_head: std::sync::atomic::AtomicBool,
    encoding: std::sync::Mutex<Option<String>>,
}

impl HttpControl {
    /// Answer the next `n` GET requests with `500`.
    pub fn fail_next(&self, n: u64) {
        self.fail_next.store(n, Relaxed);
    }

    /// Answer every GET of a path containing `part` with `500` (`Some("")`: every GET;
    /// `None`: stop).
    pub fn fail_always(&self, part: Option<&str>) {
        *self.fail_matching.lock().unwrap_or_else(|e| e.into_inner()) = part.map(str::to_string);
    }

    /// The next `n` GETs with a body (`u64::MAX`: every one) send half of it, then nothing
    /// for `pause`, then the rest: a server that stalls mid-body.
    pub fn stall_next(&self, n: u64, pause: Duration) {
        self.stall_ms.store(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX), Relaxed);
        self.stall_next.store(n, Relaxed);
    }

    /// Answer every ranged GET with `n` zeros more than asked, announced by `Content-Length`
    /// while `Content-Range` names the range asked for (0: stop).
    pub fn send_extra(&self, n: u64) {
        self.extra.store(n, Relaxed);
    }

    /// Answer every request with `302 Found` to the same path and query under `base`
    /// (`http://host:port`; `None`: stop).
    pub fn redirect_to(&self, base: Option<&str>) {
        *self.redirect.lock().unwrap_or_else(|e| e.into_inner()) = base.map(str::to_string);
    }

    /// Answer every HEAD with `405 Method Not Allowed` (GET still served), as some servers do.
    pub fn refuse_head(&self, refuse: bool) {
        self.refuse_head.store(refuse, Relaxed);
    }

    /// Label every answer `Content-Encoding: enc` (the bytes unchanged: a client must refuse
    /// the label, not decode); `None`: stop.
    pub fn encode_as(&self, enc: Option<&str>) {
        *self.encoding.lock().unwrap_or_else(|e| e.into_inner()) = enc.map(str::to_string);
    }

    /// Body bytes handed to connections (to the socket's buffers, not necessarily read).
    pub fn sent(&self) -> u64 {
        self.sent.load(Relaxed)
    }

    /// Answers that stalled mid-body.
    pub fn stalled(&self) -> u64 {
        self.stalled.load(Relaxed)
    }

    /// Requests answered with a redirect.
    pub fn redirected(&self) -> u64 {
        self.redirected.load(Relaxed)
    }

    /// GET requests received.
    pub fn gets(&self) -> u64 {
        self.gets.load(Relaxed)
    }

    /// HEAD requests received.
    pub fn heads(&self) -> u64 {
        self.heads.load(Relaxed)
    }

    /// Listing requests (`PROPFIND`) received.
    pub fn listings(&self) -> u64 {
        self.listings.load(Relaxed)
    }

    /// Requests answered with an injected `500`.
    pub fn failed(&self) -> u64 {
        self.failed.load(Relaxed)
    }

    /// Requests answered `412 Precondition Failed`.
    pub fn precondition_failed(&self) -> u64 {
        self.precondition_failed.load(Relaxed)
    }

    /// Requests that carried an `If-Match`.
    pub fn if_match_sent(&self) -> u64 {
        self.if_match_sent.load(Relaxed)
    }

    fn inject(&self, path: &str) -> bool {
        let matching = self.fail_matching.lock().unwrap_or_else(|e| e.into_inner());
        if matching.as_deref().is_some_and(|m| path.contains(m)) {
            return true;
        }
        self.fail_next.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
    }
}

/// A running server: its address, its control, the means to stop it.
#[derive(Debug)]
pub struct HttpHandle {
    /// The server.
    pub server: ServerHandle,
    /// Its faults and counters.
    pub control: Arc<HttpControl>,
}

impl HttpHandle {
    /// `http://IP:PORT`.
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }
}

/// Start serving `config.root`.
pub async fn serve(config: HttpConfig) -> io::Result<HttpHandle> {
    let control = Arc::new(HttpControl::default());
    let listener = TcpListener::bind(config.listen).await?;
    let config = Arc::new(config);
    let shared = control.clone();
    let server = crate::spawn_accept_loop(listener, move |socket, graceful| {
        let (config, control) = (config.clone(), shared.clone());
        let svc = service_fn(move |req| {
            let (config, control) = (config.clone(), control.clone());
            async move { Ok::<_, Infallible>(answer(&config, &control, &req)) }
        });
        let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(socket), svc);
        let conn = graceful.watch(conn);
        Box::pin(async move {
            let _ = conn.await;
        })
    })?;
    Ok(HttpHandle { server, control })
}

fn status(code: StatusCode) -> Response<Paced> {
    let mut r = Response::new(Paced::whole(Bytes::new()));
    *r.status_mut() = code;
    r
}

fn answer(config: &HttpConfig, control: &Arc<HttpControl>, req: &Request<Incoming>) -> Response<Paced> {
    let redirect = control.redirect.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(base) = redirect {
        control.redirected.fetch_add(1, Relaxed);
        let target = format!("{base}{}", req.uri().path_and_query().map_or("/", |pq| pq.as_str()));
        let mut r = status(StatusCode::FOUND);
        if let Ok(v) = target.parse() {
            r.headers_mut().insert(header::LOCATION, v);
        }
        return r;
    }
    let head = match *req.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ if req.method().as_str() == "PROPFIND" => {
            control.listings.fetch_add(1, Relaxed);
            return status(match config.listing {
                NoListing::NotImplemented => StatusCode::NOT_IMPLEMENTED,
                NoListing::NotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            });
        }
        _ => return status(StatusCode::METHOD_NOT_ALLOWED),
    };
    (if head { &control.heads } else { &control.gets }).fetch_add(1, Relaxed);
    if head && control.refuse_head.load(Relaxed) {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    if !head && control.inject(req.uri().path()) {
        control.failed.fetch_add(1, Relaxed);
        return status(StatusCode::INTERNAL_SERVER_ERROR);
    }
    let Some(path) = file_path(&config.root, req.uri().path()) else { return status(StatusCode::NOT_FOUND) };
    // One read of the file and its metadata: a file replaced meanwhile is answered whole,
    // old or new, never a mix.
    let Ok(data) = std::fs::read(&path) else { return status(StatusCode::NOT_FOUND) };
    let Ok(meta) = std::fs::metadata(&path) else { return status(StatusCode::NOT_FOUND) };
    let modified = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
    let size = data.len() as u64;
    let opaque = format!("\"{:x}-{size:x}\"", modified.as_nanos());
    let tag = match config.tags {
        Tags::Strong => Some(opaque.clone()),
        Tags::Weak => Some(format!("W/{opaque}")),
        Tags::None | Tags::Nothing => None,
    };
    if let Some(want) = req.headers().get(header::IF_MATCH).and_then(|v| v.to_str().ok()) {
        control.if_match_sent.fetch_add(1, Relaxed);
        // Strong comparison: both tags strong and equal (or `*`).
        let matches = want
            .split(',')
            .map(str::trim)
            .any(|w| w == "*" || (tag.as_deref() == Some(w) && config.tags == Tags::Strong && !w.starts_with("W/")));
        if config.strict_if_match && !matches {
            control.precondition_failed.fetch_add(1, Relaxed);
            return status(StatusCode::PRECONDITION_FAILED);
        }
    }
    let range = req.headers().get(header::RANGE).and_then(|v| v.to_str().ok()).and_then(|r| parse_range(r, size));
    let mut extra = 0;
    let (code, body, content_range) = match range {
        Some(Ok((a, b))) => {
            extra = control.extra.load(Relaxed);
            (StatusCode::PARTIAL_CONTENT, data[a as usize..=b as usize].to_vec(), Some(format!("bytes {a}-{b}/{size}")))
        }
        Some(Err(())) => {
            let mut r = status(StatusCode::RANGE_NOT_SATISFIABLE);
            if let Ok(v) = format!("bytes */{size}").parse() {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
        None => (StatusCode::OK, data, None),
    };
    let len = body.len() as u64 + extra;
    let stall = !head && len > 1 && control.stall_next.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok();
    let body = match (head, stall) {
        (true, _) => Paced::whole(Bytes::new()),
        (false, false) => Paced::whole(Bytes::from(body)),
        (false, true) => {
            control.stalled.fetch_add(1, Relaxed);
            Paced::stalling(Bytes::from(body), Duration::from_millis(control.stall_ms.load(Relaxed)))
        }
    };
    let body = if head { body } else { body.counted(extra, control.clone()) };
    let mut r = Response::new(body);
    *r.status_mut() = code;
    let h = r.headers_mut();
    let mut set = |k: header::HeaderName, v: String| {
        if let Ok(v) = v.parse() {
            h.insert(k, v);
        }
    };
    set(header::CONTENT_LENGTH, len.to_string());
    if config.tags != Tags::Nothing {
        set(header::LAST_MODIFIED, http_date(modified.as_secs()));
    }
    set(header::ACCEPT_RANGES, "bytes".into());
    if let Some(enc) = control.encoding.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        set(header::CONTENT_ENCODING, enc);
    }
    if let Some(t) = tag {
        set(header::ETAG, t);
    }
    if let Some(c) = content_range {
        set(header::CONTENT_RANGE, c);
    }
    r
}

/// A body sent whole, or in two halves with a pause between them (a stall mid-body), then
/// any zeros added past what was asked, made as they are sent; what it hands to the
/// connection is counted.
struct Paced {
    first: Option<Bytes>,
    pause: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    rest: Option<Bytes>,
    zeros: u64,
    len: u64,
    sent: Option<Arc<HttpControl>>,
}

/// What the added zeros are cut from.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

impl Paced {
    fn whole(b: Bytes) -> Self {
        Paced {
            len: b.len() as u64,
            first: Some(b),
            pause: Duration::ZERO,
            sleep: None,
            rest: None,
            zeros: 0,
            sent: None,
        }
    }

    fn stalling(mut b: Bytes, pause: Duration) -> Self {
        let len = b.len() as u64;
        let rest = b.split_off(b.len() / 2);
        Paced { rest: Some(rest), pause, len, ..Paced::whole(b) }
    }

    /// With `n` zeros after the body, and what is sent counted in `control`.
    fn counted(mut self, n: u64, control: Arc<HttpControl>) -> Self {
        self.zeros = n;
        self.len += n;
        self.sent = Some(control);
        self
    }

    fn frame(&self, b: Bytes) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(c) = &self.sent {
            c.sent.fetch_add(b.len() as u64, Relaxed);
        }
        Poll::Ready(Some(Ok(Frame::data(b))))
    }
}

impl http_body::Body for Paced {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            return this.frame(b);
        }
        if this.rest.is_some() {
            let pause = this.pause;
            let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if let Some(b) = this.rest.take() {
                return this.frame(b);
            }
        }
        if this.zeros > 0 {
            let n = this.zeros.min(ZEROS.len() as u64);
            this.zeros -= n;
            return this.frame(Bytes::from_static(&ZEROS[..n as usize]));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_none() && self.zeros == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

/// The file under `root` for a request path, never outside it.
fn file_path(root: &Path, uri_path: &str) -> Option<PathBuf> {
    let decoded = percent_decode(uri_path.trim_start_matches('/'))?;
    let rel = Path::new(&decoded);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let p = root.join(rel);
    p.is_file().then_some(p)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` of a `size`-byte file: `Err` when unsatisfiable,
/// `None` when not a single range this server reads (answered whole, as servers may).
fn parse_range(r: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = r.strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (size.saturating_sub(n), size.checked_sub(1)?)
        }
        (a, "") => (a.parse().ok()?, size.saturating_sub(1)),
        (a, b) => (a.parse().ok()?, b.parse::<u64>().ok()?.min(size.saturating_sub(1))),
    };
    Some(if start >= size || end < start { Err(()) } else { Ok((start, end)) })
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) of `secs` since the Unix epoch.
fn http_date(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_ranges() {
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(parse_range("bytes=2-5", 10), Some(Ok((2, 5))));
        assert_eq!(parse_range("bytes=8-", 10), Some(Ok((8, 9))));
        assert_eq!(parse_range("bytes=-3", 10), Some(Ok((7, 9))));
        assert_eq!(parse_range("bytes=5-100", 10), Some(Ok((5, 9))));
        assert_eq!(parse_range("bytes=10-12", 10), Some(Err(())));
        assert_eq!(parse_range("bytes=0-1,4-5", 10), None);
        assert!(file_path(Path::new("/tmp"), "/../etc/passwd").is_none());
    }
}
