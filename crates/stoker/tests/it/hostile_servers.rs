//! Servers that stall, lie or send the client elsewhere cost an error (or a retry) within
//! bounds, never a hang, never bytes past what was asked, never the store's requests sent to
//! another host (issue 24): the test kit's HTTP server stalls mid-body, sends more than the
//! range, and redirects, in front of itself or of the embedded S3 server.
//!
//! Time bounds here are hang guards several times the configured stall and deadline; what
//! the tests assert is counted: attempts the server saw, retries, stalls.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::s3::{uri as s3_uri, with_proxy, SK};
use common::*;
use stoker::{DynSampleSource, Error};
use stoker_testkit::http::{self, HttpConfig, HttpHandle};
use stoker_testkit::proxy::FaultPatch;

/// Five objects of 40 KiB under `root/obj`.
fn objects(root: &Path) -> Vec<Vec<u8>> {
    let dir = root.join("obj");
    std::fs::create_dir_all(&dir).unwrap();
    (0..5)
        .map(|i| {
            let data = payload(i, 40 << 10);
            std::fs::write(dir.join(format!("f{i}.bin")), &data).unwrap();
            data
        })
        .collect()
}

async fn serve(root: &Path) -> HttpHandle {
    http::serve(HttpConfig::new(root)).await.unwrap()
}

/// The objects over HTTP with `extra` options; no hedging, so each attempt is one request.
async fn source(server: &HttpHandle, extra: &str) -> Arc<DynSampleSource> {
    open(&format!("{}/obj/f{{0..4}}.bin?disk_cache=false&hedge_ms=0&backoff_ms=5{extra}", server.endpoint())).await
}

fn data(s: &stoker::Sample) -> &[u8] {
    &s.fields[0].data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_midway_is_abandoned_and_retried() {
    let root = tempfile::tempdir().unwrap();
    let want = objects(root.path());
    let server = serve(root.path()).await;
    let src = source(&server, "&stall_ms=600&attempts=3").await;

    // A pause shorter than the stall timeout is a slow body, not a stalled one (by a margin a
    // loaded CI machine's late timers cannot eat).
    server.control.stall_next(1, Duration::from_millis(50));
    assert_eq!(data(&src.get(0).await.unwrap()), &want[0][..]);
    assert_eq!((server.control.stalled(), src.io_counters().unwrap().retries), (1, 0));

    // Half the body, then nothing for a minute: abandoned after 600 ms, the retry reads it.
    server.control.stall_next(1, Duration::from_secs(60));
    let started = Instant::now();
    assert_eq!(data(&src.get(1).await.unwrap()), &want[1][..]);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!((server.control.stalled(), src.io_counters().unwrap().retries), (2, 1));

    // Stalling every time: the read fails after its three attempts, each cut at the stall.
    server.control.stall_next(u64::MAX, Duration::from_secs(60));
    let gets = server.control.gets();
    let started = Instant::now();
    let e = src.get(2).await.expect_err("every attempt stalls");
    let took = started.elapsed();
    let msg = e.to_string();
    assert!(msg.contains("stalled") && msg.contains("3 attempt") && msg.contains("f2.bin"), "{msg}");
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(server.control.gets() - gets, 3);
    // Three stalls of 600 ms and two short backoffs; before, each attempt waited 60 s.
    assert!(took >= Duration::from_millis(1800) && took < Duration::from_secs(10), "{took:?}");
}

/// Three tar shards of eight samples under `root/tar`, over HTTP with `extra` options: every
/// sample is a ranged read.
async fn tar_source(server: &HttpHandle, root: &Path, extra: &str) -> (Arc<DynSampleSource>, Vec<stoker::Sample>) {
    std::fs::create_dir_all(root.join("tar")).unwrap();
    let want = tar_dir(&root.join("tar"), 3, 8);
    let index = root.join("index");
    let uri = format!(
        "{}/tar/shard-{{0000..0002}}.tar?disk_cache=false&hedge_ms=0&backoff_ms=5&index_dir={}{extra}",
        server.endpoint(),
        index.display()
    );
    (open(&uri).await, want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_fails_at_its_deadline_whatever_attempts_are_left() {
    let root = tempfile::tempdir().unwrap();
    let server = serve(root.path()).await;
    let (src, want) = tar_source(&server, root.path(), "&stall_ms=400&attempts=100&deadline_ms=3000").await;
    // A slow body within the stall timeout is read.
    server.control.stall_next(1, Duration::from_millis(30));
    assert_eq!(src.get(3).await.unwrap(), want[3]);
    server.control.stall_next(u64::MAX, Duration::from_secs(60));
    let gets = server.control.gets();
    let started = Instant::now();
    let e = src.get(0).await.expect_err("every attempt stalls");
    let took = started.elapsed();
    let msg = e.to_string();
    assert!(msg.contains("deadline") && msg.contains("deadline_ms") && msg.contains("shard-0000.tar"), "{msg}");
    assert!(e.is_retryable(), "{e:?}");
    let tried = server.control.gets() - gets;
    assert!((3..=8).contains(&tried), "3 s of 400 ms stalls is about 7 attempts, not 100: {tried}");
    // Each attempt waited its 400 ms; the read gives up at the deadline or when the next
    // backoff would end past it.
    assert!(took >= Duration::from_millis(400) * tried as u32 && took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_the_range_is_cut_off_and_retried() {
    let root = tempfile::tempdir().unwrap();
    let server = serve(root.path()).await;
    let (src, want) = tar_source(&server, root.path(), "&attempts=2").await;
    // Every ranged answer has 256 MiB more than asked, its Content-Length saying so and its
    // Content-Range naming the range: the reader stops at the range and tries again.
    server.control.send_extra(256 << 20);
    let (gets, sent) = (server.control.gets(), server.control.sent());
    let e = src.get(5).await.expect_err("every answer is too long");
    let msg = e.to_string();
    assert!(msg.contains("more than the") && msg.contains("2 attempt"), "{msg}");
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(server.control.gets() - gets, 2);
    // Read to its end, each answer is 256 MiB; cut off at the range, the rest is never
    // taken from the server (what it sent is what the sockets' buffers held).
    let sent = server.control.sent() - sent;
    assert!(sent < 64 << 20, "{} MiB left the server for two samples' bytes", sent >> 20);
    server.control.send_extra(0);
    assert_eq!(src.get(5).await.unwrap(), want[5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_source_follows_a_redirect_to_another_host() {
    let root = tempfile::tempdir().unwrap();
    let want = objects(root.path());
    let mirror = serve(root.path()).await;
    let empty = tempfile::tempdir().unwrap();
    let front = serve(empty.path()).await;
    // `localhost` rather than the address the front has: another host by name and port.
    let port = mirror.server.addr().port();
    front.control.redirect_to(Some(&format!("http://localhost:{port}")));
    let src = source(&front, "").await;
    for (i, w) in want.iter().enumerate() {
        assert_eq!(data(&src.get(i).await.unwrap()), &w[..]);
    }
    assert!(front.control.redirected() >= 5 && mirror.control.gets() >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_endpoint_that_redirects_to_another_host_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data/obj");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.bin"), payload(1, 1000)).unwrap();
    let s3 = common::s3::serve(root.path()).await;
    // The other host: the real server, behind a proxy that counts what reaches it.
    let other = with_proxy(&s3, FaultPatch::default()).await;
    let empty = tempfile::tempdir().unwrap();
    let front = serve(empty.path()).await;
    let target = other.endpoint().replace("http://", "http://user:hunter2@");
    front.control.redirect_to(Some(&target));
    for path in ["obj/a.bin", "obj/"] {
        let before = front.control.redirected();
        let e: Error = stoker::open(&s3_uri(&front.endpoint(), path, ""), Default::default())
            .await
            .expect_err("a redirect to another host is refused");
        let msg = e.to_string();
        let shown = format!("{}/data", other.endpoint());
        assert!(msg.contains("redirected") && msg.contains(&shown) && msg.contains("endpoint"), "{path}: {msg}");
        assert!(!msg.contains("hunter2") && !msg.contains(SK), "{path}: credentials shown: {msg}");
        assert!(!format!("{e:?}").contains("hunter2"), "{path}");
        assert!(!e.is_retryable(), "{path}: asking again cannot help: {e:?}");
        assert_eq!(front.control.redirected() - before, 1, "{path}: refused at once, not retried");
    }
    assert_eq!(other.control.stats().requests, 0, "nothing reached the other host");
}

/// An S3-compatible server whose listing never moves on: every `ListObjectsV2` answer is the
/// same page of three objects with the same continuation token (RunPod's, Huawei OBS's and
/// some Ceph versions' listings have done so). `pages` counts the pages served.
async fn repeating_lister(pages: Arc<std::sync::atomic::AtomicU64>) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            let pages = pages.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    // One request at a time on the connection (keep-alive): headers only.
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let listing = got[..end]
                        .split(|&b| b == b'\n')
                        .next()
                        .is_some_and(|line| line.windows(11).any(|w| w == b"list-type=2"));
                    got.drain(..end);
                    if !listing {
                        // Anything else (a manifest looked for): not there.
                        let none = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
                        if conn.write_all(none.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let contents: String = (0..3)
                        .map(|i| {
                            format!(
                                "<Contents><Key>p/o{i}.bin</Key><Size>10</Size>\
                                 <LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>\"e{i}\"</ETag></Contents>"
                            )
                        })
                        .collect();
                    let body = format!(
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name><Prefix>p/</Prefix>\
                         <KeyCount>3</KeyCount><IsTruncated>true</IsTruncated>{contents}\
                         <NextContinuationToken>again</NextContinuationToken></ListBucketResult>"
                    );
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(body.as_bytes()).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A listing that repeats its page is an error naming the object listed twice, after one
/// page more: before, it listed forever (memory growing a page at a time) or, repeating once,
/// gave those objects' samples twice an epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_repeats_its_page_is_an_error_not_a_loop() {
    let pages = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let addr = repeating_lister(pages.clone()).await;
    let uri = format!("s3://b/p/?endpoint=http://{addr}&anonymous=true&disk_cache=false&layout=objects");
    let opened = tokio::time::timeout(Duration::from_secs(60), stoker::open(&uri, Default::default()))
        .await
        .expect("the open ended instead of listing forever");
    let e = opened.err().unwrap();
    let msg = e.to_string();
    assert!(msg.contains("p/o0.bin twice") && msg.contains("does not move on"), "{msg}");
    assert!(!e.is_retryable(), "{e:?}");
    let pages = pages.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(pages, 2, "the second page gave it away, and a retry would list the same");
}

/// A server that tells versions apart by nothing but their size (no entity tag, no
/// `Last-Modified`): what one run cached of a shard is not served to the next, which may be
/// reading a replaced shard of the same size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tag_or_time_a_cached_block_serves_its_run_only() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("tar")).unwrap();
    let want = tar_dir(&root.path().join("tar"), 3, 8);
    let server = http::serve(HttpConfig::new(root.path()).with_tags(http::Tags::Nothing)).await.unwrap();
    let cache = tempfile::tempdir().unwrap();
    let uri = format!(
        "{}/tar/shard-{{0000..0002}}.tar?disk_cache_dir={}&index_dir={}&hedge_ms=0",
        server.endpoint(),
        cache.path().join("blocks").display(),
        cache.path().join("index").display()
    );
    let first = open(&uri).await;
    assert_eq!(first.get_many(&(0..want.len()).collect::<Vec<_>>()).await.unwrap(), want);
    first.flush().await;
    drop(first);
    let blocks = files_under(cache.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "blk")).count();
    assert!(blocks > 0, "the run cached what it read");
    // Shard 1 replaced by other payloads of the same sizes (the same headers): nothing the
    // server says tells it from the first.
    let replaced: Vec<stoker::Sample> = want[8..16]
        .iter()
        .map(|s| {
            let mut s = s.clone();
            for f in &mut s.fields {
                f.data = f.data.iter().map(|b| b ^ 0x5a).collect::<Vec<u8>>().into();
            }
            s
        })
        .collect();
    let shard = root.path().join("tar/shard-0001.tar");
    let size = std::fs::metadata(&shard).unwrap().len();
    write_tar(&shard, &replaced);
    assert_eq!(std::fs::metadata(&shard).unwrap().len(), size);
    // A later run (another process) over the same cache reads the shard as it is now.
    let later = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "hostile_servers::without_tag_or_time_the_later_run", "--nocapture"])
        .env("STOKER_LATER_RUN_URI", &uri)
        .env("STOKER_LATER_RUN_WANT", hex(&replaced[0].fields[0].data))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&later.stdout).to_string() + &String::from_utf8_lossy(&later.stderr);
    assert!(later.status.success() && out.contains("1 passed"), "{out}");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The later run of [`without_tag_or_time_a_cached_block_serves_its_run_only`], in a process
/// of its own (skipped when run alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tag_or_time_the_later_run() {
    let (Ok(uri), Ok(want)) = (std::env::var("STOKER_LATER_RUN_URI"), std::env::var("STOKER_LATER_RUN_WANT")) else {
        return;
    };
    let src = open(&uri).await;
    let got = src.get_many(&[8]).await.unwrap();
    assert!(hex(data(&got[0])) == want, "the later run was served the earlier run's cached bytes");
}

/// A server that takes writes and answers each with the next of `answers` (status lines), or
/// never answers once they run out; `writes` counts the requests whose body it read.
async fn writes_answered(
    answers: Vec<&'static str>,
    writes: Arc<std::sync::atomic::AtomicU64>,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answers = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(answers)));
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            let (answers, writes) = (answers.clone(), writes.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let end = loop {
                        if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
                        .unwrap_or(0);
                    while got.len() < end + len {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    got.drain(..end + len);
                    writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(status) = answers.lock().unwrap().pop_front() else {
                        // No answer, ever: the connection stays open.
                        std::future::pending::<()>().await;
                        return;
                    };
                    let reply = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nETag: \"w\"\r\n\r\n");
                    if conn.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A remote store over `addr` with `extra` options.
pub(crate) fn store_at(addr: std::net::SocketAddr, extra: &str) -> stoker::store::Store {
    let parsed = stoker::uri::parse(&format!("http://{addr}/data/x.bin?{extra}")).unwrap();
    let stoker::uri::Location::Remote(loc) = &parsed.location else { panic!("a remote URI") };
    stoker::store::Store::remote(loc, &parsed.options, &parsed.display).unwrap()
}

/// A write is retried as a read is (a 503 costs an attempt, not the write), and a write
/// whose answer never comes fails at its time limit instead of waiting without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_retried_and_one_never_answered_ends() {
    let writes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let addr = writes_answered(vec!["503 Service Unavailable", "201 Created"], writes.clone()).await;
    let store = store_at(addr, "backoff_ms=5");
    store.put("y.bin", bytes::Bytes::from_static(b"y")).await.unwrap();
    assert_eq!(writes.load(std::sync::atomic::Ordering::Relaxed), 2, "the 503 was retried");

    let writes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let addr = writes_answered(vec![], writes.clone()).await;
    let store = store_at(addr, "timeout_ms=300&attempts=2&backoff_ms=5");
    let started = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(30), store.put("y.bin", bytes::Bytes::from_static(b"y")))
        .await
        .expect("the write ended")
        .unwrap_err();
    assert!(e.to_string().contains("no answer to the write"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(writes.load(std::sync::atomic::Ordering::Relaxed), 2, "both attempts");
    // A writer's requests have the same limit: an object whose write is never answered fails
    // too.
    let mut w = store.writer("z.bin", 1024).unwrap();
    // Written from a thread that may block, as the writer's users do.
    let w = tokio::task::spawn_blocking(move || {
        std::io::Write::write_all(&mut w, &[7u8; 1024]).unwrap();
        w
    })
    .await
    .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(60), w.finish()).await.expect("the write ended").unwrap_err();
    assert!(e.to_string().contains("no answer to"), "{e}");
}

/// A listing of many pages through a store that answers 503 to two requests in five: each
/// failed page is asked again from the last name listed, so the listing completes (restarted
/// from the start on every failure, ten pages almost never all passed in six attempts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_listing_picks_up_after_a_failed_page() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data/many");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..10_000 {
        std::fs::write(dir.join(format!("o{i:05}.bin")), [i as u8]).unwrap();
    }
    let s3 = common::s3::serve(root.path()).await;
    let faults = FaultPatch { slowdown: Some(0.4), seed: Some(7), ..Default::default() };
    let front = with_proxy(&s3, faults).await;
    let uri = s3_uri(&front.endpoint(), "many", "&layout=objects&manifest=false&backoff_ms=1");
    let src = open(&uri).await;
    assert_eq!(src.len(), 10_000, "every object listed once");
    assert!(src.io_counters().unwrap().retries > 0, "pages failed and were asked again");
}

/// A server that refuses HEAD (405) but serves GET: sizes and versions come from the answer
/// to a one-byte GET, and every object reads right (object_store took the 405 for "not found").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_head_is_read_through_get() {
    let root = tempfile::tempdir().unwrap();
    let want = objects(root.path());
    let server = serve(root.path()).await;
    server.control.refuse_head(true);
    let src = source(&server, "").await;
    for (i, w) in want.iter().enumerate() {
        assert_eq!(data(&src.get(i).await.unwrap()), &w[..]);
    }
    assert!(server.control.heads() >= 5, "HEAD was asked first");
}

/// An answer labelled with a content encoding (an object uploaded with `Content-Encoding:
/// gzip`) is refused at once, saying so: Stoker asks for bytes as stored, and encoded bytes
/// were delivered as the sample, or blamed as a damaged shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_a_content_encoding_is_refused_not_delivered() {
    let root = tempfile::tempdir().unwrap();
    objects(root.path());
    let server = serve(root.path()).await;
    let src = source(&server, "&attempts=5").await;
    server.control.encode_as(Some("gzip"));
    let before = server.control.gets();
    let e = src.get(1).await.unwrap_err().to_string();
    assert!(e.contains("Content-Encoding: gzip") && e.contains("f1.bin"), "{e}");
    assert_eq!(server.control.gets() - before, 1, "not retried: another attempt gets the same");
    server.control.encode_as(Some("identity"));
    assert!(src.get(1).await.is_ok());
}

/// A name too long to request (a list file's line of 70,000 bytes) is an error naming its
/// length, not a panic in the HTTP client (a URI past 64 KiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_too_long_to_request_is_an_error_not_a_panic() {
    let root = tempfile::tempdir().unwrap();
    objects(root.path());
    std::fs::write(root.path().join("obj/list.txt"), format!("f0.bin\n{}.bin\n", "n".repeat(70_000))).unwrap();
    let server = serve(root.path()).await;
    let uri = format!("{}/obj?list=list.txt&layout=objects", server.endpoint());
    let e = stoker::open(&uri, Default::default()).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::NotSupported { .. }) && msg.contains("70008 bytes") && msg.len() < 1000, "{msg}");
}
