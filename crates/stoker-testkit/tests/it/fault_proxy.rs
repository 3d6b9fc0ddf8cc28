//! The fault proxy, in front of the real S3 server and of a small fixture
//! HTTP server (for framing details S3 cannot show, such as chunked bodies).

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use futures::TryStreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use stoker_testkit::proxy::{self, FaultConfig, ProxyConfig, ProxyHandle, ProxyStats, SLOWDOWN_BODY};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

async fn start_proxy(upstream: SocketAddr, faults: FaultConfig) -> ProxyHandle {
    let config = ProxyConfig { faults, ..ProxyConfig::new(upstream) };
    proxy::serve(config).await.expect("start proxy")
}

/// S3 server + proxy + a client that talks through the proxy.
struct Stack {
    s3: TestS3,
    proxy: ProxyHandle,
}

impl Stack {
    async fn start(faults: FaultConfig) -> Self {
        let s3 = start_s3().await;
        let proxy = start_proxy(s3.server.addr(), faults).await;
        Self { s3, proxy }
    }

    /// Writes directly to the S3 server, bypassing the proxy's faults.
    async fn seed_object(&self, key: &str, data: Vec<u8>) {
        store(&self.s3.server.endpoint()).put(&Path::from(key), PutPayload::from(data)).await.expect("seed object");
    }

    fn proxied_store(&self) -> Arc<object_store::aws::AmazonS3> {
        store(&self.proxy.endpoint())
    }
}

// ---------------------------------------------------------------------------
// Fixture upstream: /echo streams the request body back chunked; /blob/N and
// /chunked-blob/N return N pattern bytes with Content-Length / chunked.
// ---------------------------------------------------------------------------

type FixtureBody = BoxBody<Bytes, Infallible>;

struct Fixture {
    addr: SocketAddr,
    /// TCP connections accepted, to observe upstream keep-alive.
    connections: Arc<AtomicU64>,
}

fn chunked(data: Vec<u8>, parts: usize) -> FixtureBody {
    let size = data.len().div_ceil(parts.max(1)).max(1);
    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
        data.chunks(size).map(|c| Ok(Frame::data(Bytes::copy_from_slice(c)))).collect();
    // A stream body has no known length, so hyper sends it chunked.
    StreamBody::new(futures::stream::iter(frames)).boxed()
}

async fn fixture_handle(req: Request<Incoming>) -> Result<Response<FixtureBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let host = req.headers().get("host").cloned();
    let te = req.headers().get("transfer-encoding").cloned();
    let cl = req.headers().get("content-length").cloned();
    let n = |prefix: &str| path.strip_prefix(prefix).and_then(|n| n.parse::<usize>().ok());
    let mut resp = if path == "/echo" {
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        Response::new(chunked(body.to_vec(), 2))
    } else if let Some(len) = n("/blob/") {
        Response::new(Full::new(Bytes::from(pattern(len))).boxed())
    } else if let Some(len) = n("/chunked-blob/") {
        Response::new(chunked(pattern(len), 4))
    } else {
        let mut r = Response::new(Full::new(Bytes::from_static(b"not found")).boxed());
        *r.status_mut() = hyper::StatusCode::NOT_FOUND;
        r
    };
    for (name, value) in [("x-echo-host", host), ("x-echo-te", te), ("x-echo-cl", cl)] {
        if let Some(v) = value {
            resp.headers_mut().insert(name, v);
        }
    }
    Ok(resp)
}

async fn start_fixture() -> Fixture {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicU64::new(0));
    let counter = connections.clone();
    // Ends with the test's runtime.
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service_fn(fixture_handle))
                    .await;
            });
        }
    });
    Fixture { addr, connections }
}

/// Reads until EOF or error; returns the bytes and whether it ended in an error.
async fn read_until_closed(stream: &mut TcpStream) -> (Vec<u8>, Option<std::io::Error>) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Some(e)),
        }
    }
}

fn split_head(raw: &[u8]) -> (String, &[u8]) {
    let pos = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("response has a header block");
    (String::from_utf8_lossy(&raw[..pos]).to_lowercase(), &raw[pos + 4..])
}

// ---------------------------------------------------------------------------

#[tokio::test]
async fn passthrough_with_signed_requests_and_stats() {
    bounded(async {
        let stack = Stack::start(FaultConfig::default()).await;
        let store = stack.proxied_store();
        let data = pattern(50_000);
        // Signed PUT/GET/HEAD/LIST through the proxy: Host is preserved, so
        // signatures still verify at the upstream.
        store.put(&Path::from("p/a.bin"), PutPayload::from(data.clone())).await.unwrap();
        let got = store.get(&Path::from("p/a.bin")).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], &data[..]);
        let range = store.get_range(&Path::from("p/a.bin"), 10..20).await.unwrap();
        assert_eq!(&range[..], &data[10..20]);
        assert_eq!(store.head(&Path::from("p/a.bin")).await.unwrap().size, 50_000);
        let listed: Vec<_> = store.list(Some(&Path::from("p"))).try_collect().await.unwrap();
        assert_eq!(listed.len(), 1);

        // Control endpoints are neither counted nor forwarded.
        let before = proxy_stats(stack.proxy.addr()).await;
        let after = proxy_stats(stack.proxy.addr()).await;
        assert_eq!(before, after);
        assert_eq!(after, ProxyStats { requests: 5, forwarded: 5, ..ProxyStats::default() });
        assert_eq!(after, stack.proxy.control.stats());

        let reset = raw_request(stack.proxy.addr(), "POST", "/__proxy/stats/reset", b"").await.unwrap();
        assert_eq!(reset.status, 200);
        assert_eq!(proxy_stats(stack.proxy.addr()).await, ProxyStats::default());
        let unknown = raw_request(stack.proxy.addr(), "GET", "/__proxy/nope", b"").await.unwrap();
        assert_eq!(unknown.status, 404);
    })
    .await;
}

#[tokio::test]
async fn slowdown_answers_503_without_contacting_upstream() {
    bounded(async {
        let stack = Stack::start(FaultConfig { slowdown: 1.0, ..FaultConfig::default() }).await;
        stack.seed_object("obj", pattern(1000)).await;
        let store = stack.proxied_store();
        for _ in 0..3 {
            let err = store.get(&Path::from("obj")).await.unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("503"), "{msg}");
            assert!(msg.contains("SlowDown"), "{msg}");
        }
        let raw = raw_request(stack.proxy.addr(), "GET", "/train/obj", b"").await.unwrap();
        assert_eq!(raw.status, 503);
        assert_eq!(raw.header("content-type"), Some("application/xml"));
        assert_eq!(raw.body, SLOWDOWN_BODY.as_bytes());
        // PUTs are throttled too.
        let put = store.put(&Path::from("new"), PutPayload::from(b"x".to_vec())).await;
        assert!(put.is_err());

        let stats = proxy_stats(stack.proxy.addr()).await;
        assert_eq!((stats.requests, stats.slowdowns, stats.forwarded), (5, 5, 0));
    })
    .await;
}

#[tokio::test]
async fn latency_jitter_and_spikes_delay_requests() {
    bounded(async {
        let stack = Stack::start(FaultConfig { latency_ms: 50, ..FaultConfig::default() }).await;
        stack.seed_object("obj", pattern(1000)).await;
        let store = stack.proxied_store();
        let t = Instant::now();
        let got = store.get(&Path::from("obj")).await.unwrap().bytes().await.unwrap();
        let elapsed = t.elapsed();
        assert_eq!(got.len(), 1000);
        assert!(elapsed >= Duration::from_millis(50), "GET took {elapsed:?}");

        // Spikes: every request gets latency + spike.
        stack
            .proxy
            .control
            .apply(&proxy::FaultPatch {
                latency_ms: Some(0),
                spike_prob: Some(1.0),
                spike_ms: Some(120),
                ..Default::default()
            })
            .unwrap();
        let t = Instant::now();
        store.head(&Path::from("obj")).await.unwrap();
        let elapsed = t.elapsed();
        assert!(elapsed >= Duration::from_millis(120), "spiked HEAD took {elapsed:?}");

        // Jitter: each delay is in [10, 10 + 40] ms, and not all the same.
        stack
            .proxy
            .control
            .apply(&proxy::FaultPatch {
                latency_ms: Some(10),
                jitter_ms: Some(40),
                spike_prob: Some(0.0),
                ..Default::default()
            })
            .unwrap();
        let mut times = Vec::new();
        for _ in 0..6 {
            let t = Instant::now();
            let r = raw_request(stack.proxy.addr(), "GET", "/train/obj", b"").await.unwrap();
            times.push(t.elapsed());
            assert_eq!(r.status, 403, "unsigned request should reach S3 and be refused");
        }
        assert!(times.iter().all(|t| *t >= Duration::from_millis(10)), "{times:?}");
        let spread = *times.iter().max().unwrap() - *times.iter().min().unwrap();
        assert!(spread >= Duration::from_millis(5), "no jitter visible: {times:?}");

        let stats = proxy_stats(stack.proxy.addr()).await;
        assert_eq!(stats.spikes, 1);
        assert_eq!(stats.requests, 8);
        assert_eq!(stats.forwarded, 8);
    })
    .await;
}

#[tokio::test]
async fn truncate_cuts_object_store_gets() {
    bounded(async {
        let stack = Stack::start(FaultConfig { truncate: 1.0, ..FaultConfig::default() }).await;
        let data = pattern(100_000);
        stack.seed_object("big.bin", data.clone()).await;
        let store = stack.proxied_store();
        let result = match store.get(&Path::from("big.bin")).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        };
        match result {
            Err(_) => {}
            Ok(bytes) => assert!(bytes.len() < data.len(), "truncation had no effect"),
        }
        // Only GET/HEAD are cut: a PUT goes through intact.
        store.put(&Path::from("up.bin"), PutPayload::from(data.clone())).await.expect("PUT is never truncated");
        assert_eq!(std::fs::read(stack.s3.dir.path().join(BUCKET).join("up.bin")).unwrap(), data);

        let stats = proxy_stats(stack.proxy.addr()).await;
        assert_eq!(stats.truncations, 1);
        assert_eq!(stats.forwarded, 2);
    })
    .await;
}

#[tokio::test]
async fn truncate_sends_full_headers_then_half_the_body() {
    bounded(async {
        let fixture = start_fixture().await;
        let proxy = start_proxy(fixture.addr, FaultConfig { truncate: 1.0, ..FaultConfig::default() }).await;

        // Content-Length body: the promised length, about half of it sent.
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(b"GET /blob/102400 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let (raw, _) = read_until_closed(&mut s).await;
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("content-length: 102400"), "{head}");
        assert!((40_000..=60_000).contains(&body.len()), "expected about half of 102400 bytes, got {}", body.len());
        assert_eq!(body, &pattern(102_400)[..body.len()]);

        // Chunked body: cut before the terminating zero-size chunk.
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(b"GET /chunked-blob/4000 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let (raw, _) = read_until_closed(&mut s).await;
        let (head, body) = split_head(&raw);
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        assert!(!body.ends_with(b"0\r\n\r\n"), "chunked body was not cut");

        // HEAD: headers intact, then the connection closes.
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(b"HEAD /blob/1000 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let (raw, err) = read_until_closed(&mut s).await;
        assert!(err.is_none(), "{err:?}");
        let (head, body) = split_head(&raw);
        assert!(head.contains("content-length: 1000"), "{head}");
        assert!(body.is_empty());

        // POST is never truncated.
        let echo = raw_request(proxy.addr(), "POST", "/echo", b"payload").await.unwrap();
        assert_eq!(echo.body, b"payload");
        assert_eq!(proxy.control.stats().truncations, 3);
    })
    .await;
}

#[tokio::test]
async fn reset_aborts_with_tcp_rst() {
    bounded(async {
        let stack = Stack::start(FaultConfig { reset: 1.0, ..FaultConfig::default() }).await;
        stack.seed_object("obj", pattern(1000)).await;
        let store = stack.proxied_store();
        assert!(store.get(&Path::from("obj")).await.is_err());
        assert!(store.put(&Path::from("x"), PutPayload::from(b"x".to_vec())).await.is_err());

        let mut s = TcpStream::connect(stack.proxy.addr()).await.unwrap();
        s.write_all(b"GET /train/obj HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let (raw, err) = read_until_closed(&mut s).await;
        assert!(raw.is_empty(), "nothing may be sent before the reset");
        let kind = err.map(|e| e.kind());
        assert_eq!(kind, Some(std::io::ErrorKind::ConnectionReset), "expected RST, not FIN");

        let stats = proxy_stats(stack.proxy.addr()).await;
        assert_eq!((stats.requests, stats.resets, stats.forwarded), (3, 3, 0));
        assert!(!stack.s3.dir.path().join(BUCKET).join("x").exists());
    })
    .await;
}

#[tokio::test]
async fn runtime_reconfiguration_over_http() {
    bounded(async {
        let stack = Stack::start(FaultConfig::default()).await;
        stack.seed_object("obj", pattern(1000)).await;
        let store = stack.proxied_store();
        let addr = stack.proxy.addr();
        store.get(&Path::from("obj")).await.expect("no faults yet");

        let resp = proxy_configure(addr, r#"{"slowdown": 1.0, "latency-ms": 5}"#).await;
        assert_eq!(resp.status, 200);
        let cfg: FaultConfig = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!((cfg.slowdown, cfg.latency_ms, cfg.reset), (1.0, 5, 0.0));
        let err = store.get(&Path::from("obj")).await.unwrap_err();
        assert!(err.to_string().contains("503"), "{err}");

        // Invalid updates are refused and change nothing.
        for bad in [r#"{"slowdown": 2.0}"#, r#"{"slowdwn": 0.0}"#, "not json", r#"{"latency_ms": -1}"#] {
            let resp = proxy_configure(addr, bad).await;
            assert_eq!(resp.status, 400, "{bad} was accepted");
        }
        let current = raw_request(addr, "GET", "/__proxy/config", b"").await.unwrap();
        let current: FaultConfig = serde_json::from_slice(&current.body).unwrap();
        assert_eq!(current, cfg);

        let resp = proxy_configure(addr, r#"{"slowdown": 0, "reset": 1.0}"#).await;
        assert_eq!(resp.status, 200);
        assert!(store.get(&Path::from("obj")).await.is_err());
        let resp = proxy_configure(addr, r#"{"reset": 0}"#).await;
        assert_eq!(resp.status, 200);
        store.get(&Path::from("obj")).await.expect("faults off again");

        let stats = proxy_stats(addr).await;
        assert_eq!((stats.requests, stats.forwarded, stats.slowdowns, stats.resets), (4, 2, 1, 1));
    })
    .await;
}

#[tokio::test]
async fn link_rate_paces_bodies_on_one_shared_link() {
    bounded(async {
        let stack = Stack::start(FaultConfig::default()).await;
        let (a, b) = (pattern(1 << 20), pattern((1 << 20) + 7));
        stack.seed_object("a", a.clone()).await;
        stack.seed_object("b", b.clone()).await;
        let store = stack.proxied_store();
        store.head(&Path::from("a")).await.expect("no limit yet");

        let resp = proxy_configure(stack.proxy.addr(), r#"{"link-mib-s": 8}"#).await;
        assert_eq!(resp.status, 200);
        let cfg: FaultConfig = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(cfg.link_mib_s, 8);

        // Two GETs at once share the link: 2 MiB at 8 MiB/s take 250 ms, less the few
        // milliseconds the link gives back for its timers, where a link per connection would
        // carry both in 125 ms.
        let t = Instant::now();
        let get = |key: &'static str| {
            let store = store.clone();
            async move { store.get(&Path::from(key)).await?.bytes().await }
        };
        let (got_a, got_b) = tokio::try_join!(get("a"), get("b")).unwrap();
        let elapsed = t.elapsed();
        assert_eq!((&got_a[..], &got_b[..]), (&a[..], &b[..]), "paced bodies must arrive whole");
        assert!(elapsed >= Duration::from_millis(240), "two 1 MiB GETs at 8 MiB/s took {elapsed:?}");
    })
    .await;
}

async fn status_sequence(proxy: SocketAddr, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(raw_request(proxy, "GET", "/blob/10", b"").await.unwrap().status);
    }
    out
}

#[tokio::test]
async fn same_seed_gives_same_fault_sequence() {
    bounded(async {
        let fixture = start_fixture().await;
        let faults = |seed| FaultConfig { slowdown: 0.5, seed, ..FaultConfig::default() };
        let a = start_proxy(fixture.addr, faults(42)).await;
        let b = start_proxy(fixture.addr, faults(42)).await;
        let c = start_proxy(fixture.addr, faults(43)).await;
        let seq_a = status_sequence(a.addr(), 30).await;
        let seq_b = status_sequence(b.addr(), 30).await;
        let seq_c = status_sequence(c.addr(), 30).await;
        assert_eq!(seq_a, seq_b);
        assert_ne!(seq_a, seq_c);
        assert!(seq_a.contains(&200) && seq_a.contains(&503), "{seq_a:?}");

        // Setting the seed at runtime restarts the sequence.
        assert_eq!(proxy_configure(a.addr(), r#"{"seed": 42}"#).await.status, 200);
        assert_eq!(status_sequence(a.addr(), 30).await, seq_b);
    })
    .await;
}

#[tokio::test]
async fn keep_alive_and_chunked_bodies_both_ways() {
    bounded(async {
        let fixture = start_fixture().await;
        let proxy = start_proxy(fixture.addr, FaultConfig::default()).await;
        let stream = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut conn = BufReader::new(stream);

        // 1: chunked request body, chunked response body.
        conn.get_mut()
            .write_all(
                b"POST /echo HTTP/1.1\r\nHost: client-host\r\nTransfer-Encoding: chunked\r\n\r\n\
                  6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n",
            )
            .await
            .unwrap();
        let r1 = read_response(&mut conn, false).await.unwrap();
        assert_eq!(r1.status, 200);
        assert_eq!(r1.body, b"hello world");
        assert_eq!(r1.header("transfer-encoding"), Some("chunked"));
        assert_eq!(r1.header("x-echo-host"), Some("client-host"), "Host must be preserved");
        assert_eq!(r1.header("x-echo-te"), Some("chunked"));

        // 2: Content-Length request on the same client connection.
        conn.get_mut()
            .write_all(b"PUT /echo HTTP/1.1\r\nHost: client-host\r\nContent-Length: 5\r\n\r\nabcde")
            .await
            .unwrap();
        let r2 = read_response(&mut conn, false).await.unwrap();
        assert_eq!(r2.body, b"abcde");
        assert_eq!(r2.header("x-echo-cl"), Some("5"));

        // 3: Content-Length response.
        conn.get_mut().write_all(b"GET /blob/3000 HTTP/1.1\r\nHost: client-host\r\n\r\n").await.unwrap();
        let r3 = read_response(&mut conn, false).await.unwrap();
        assert_eq!(r3.header("content-length"), Some("3000"));
        assert_eq!(r3.body, pattern(3000));

        // Sequential requests reuse one pooled upstream connection.
        assert_eq!(fixture.connections.load(Ordering::SeqCst), 1);
        let stats = proxy.control.stats();
        assert_eq!((stats.requests, stats.forwarded), (3, 3));
    })
    .await;
}

#[tokio::test]
async fn unreachable_upstream_gives_502() {
    bounded(async {
        // Bind and drop to get a loopback port with nothing listening.
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let proxy = start_proxy(dead, FaultConfig::default()).await;
        let resp = raw_request(proxy.addr(), "GET", "/x", b"").await.unwrap();
        assert_eq!(resp.status, 502);
        let stats = proxy.control.stats();
        assert_eq!((stats.forwarded, stats.upstream_errors), (1, 1));
        proxy.shutdown().await;
    })
    .await;
}
