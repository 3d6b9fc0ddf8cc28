//! Answers a server may size as it likes: a file read whole that says it is huge, a listing
//! page or an error claiming a terabyte, an error whose body never ends. Each costs an error
//! within bounded memory, never the process: object_store sizes the buffer it collects such
//! a body into by the length claimed (a terabyte aborted the process), and read an error's
//! body until it ended.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use stoker::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::hostile_servers::store_at;

/// What a [`server`] answers each request with.
#[derive(Clone, Copy)]
enum Answer {
    /// 200 with a body said to be this long, of which 1 KiB comes, then nothing (the
    /// connection stays open).
    Claims(u64),
    /// 200 to a listing (an S3 `list-type=2` request; 404 to anything else) said to be this
    /// long, of which 1 MiB comes, then the connection closes.
    ListingClaims(u64),
    /// 503, with a chunked body sent until the client stops reading (256 MiB at most, then
    /// nothing more).
    EndlessError,
    /// 200 to a listing (404 to anything else), with a chunked body as [`Answer::EndlessError`]'s.
    EndlessListing,
}

/// A server answering every request as `answer` says; `asked` counts requests, `sent` the
/// body bytes written.
async fn server(answer: Answer, asked: Arc<AtomicU64>, sent: Arc<AtomicU64>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            let (asked, sent) = (asked.clone(), sent.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                asked.fetch_add(1, Relaxed);
                let line = String::from_utf8_lossy(got.split(|&b| b == b'\n').next().unwrap_or_default()).into_owned();
                let (head, first, then_wait) = match answer {
                    Answer::Claims(n) => (format!("200 OK\r\nContent-Length: {n}"), 1 << 10, true),
                    Answer::ListingClaims(n) if line.contains("list-type=2") => {
                        (format!("200 OK\r\nContent-Type: application/xml\r\nContent-Length: {n}"), 1 << 20, false)
                    }
                    Answer::ListingClaims(_) => ("404 Not Found\r\nContent-Length: 0".into(), 0, false),
                    Answer::EndlessError => ("503 Slow Down\r\nTransfer-Encoding: chunked".into(), 0, false),
                    Answer::EndlessListing if line.contains("list-type=2") => {
                        ("200 OK\r\nContent-Type: application/xml\r\nTransfer-Encoding: chunked".into(), 0, false)
                    }
                    Answer::EndlessListing => ("404 Not Found\r\nContent-Length: 0".into(), 0, false),
                };
                let head = format!("HTTP/1.1 {head}\r\nETag: \"e\"\r\n\r\n");
                if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(&vec![b'<'; first]).await.is_err() {
                    return;
                }
                sent.fetch_add(first as u64, Relaxed);
                if then_wait {
                    std::future::pending::<()>().await;
                }
                let endless = matches!(answer, Answer::EndlessError)
                    || matches!(answer, Answer::EndlessListing) && line.contains("list-type=2");
                if endless {
                    let chunk = format!("10000\r\n{}\r\n", "x".repeat(1 << 16));
                    // Up to 256 MiB, then silence: enough to tell a body read to its end from
                    // one cut short, without a regression filling the test machine's memory.
                    while sent.load(Relaxed) < 256 << 20 && conn.write_all(chunk.as_bytes()).await.is_ok() {
                        sent.fetch_add(1 << 16, Relaxed);
                    }
                    std::future::pending::<()>().await;
                }
            });
        }
    });
    addr
}

/// Open the S3 bucket `b/p/` at `addr` as files, `attempts` at the listing, within a hang
/// guard of `secs`.
async fn open_listing(
    addr: std::net::SocketAddr,
    attempts: u32,
    secs: u64,
) -> stoker::Result<Arc<stoker::DynSampleSource>> {
    let uri = format!(
        "s3://b/p/?endpoint=http://{addr}&anonymous=true&disk_cache=false&layout=objects&attempts={attempts}&backoff_ms=5"
    );
    tokio::time::timeout(Duration::from_secs(secs), stoker::open(&uri, Default::default()))
        .await
        .expect("the open ended")
}

fn counters() -> (Arc<AtomicU64>, Arc<AtomicU64>) {
    (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)))
}

/// An index, manifest or name list is read whole into memory: one whose answer says it is
/// larger than such a file can be is refused by that size, at the first answer, before its
/// body is read (before, a hostile server's `index.json` took as much memory as it sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_read_whole_that_says_it_is_huge_is_refused_unread() {
    let (asked, sent) = counters();
    let addr = server(Answer::Claims(40 << 30), asked.clone(), sent).await;
    // Were the body read, it would stall after 1 KiB and fail as a stall, not as too large.
    let store = store_at(addr, "hedge_ms=0&backoff_ms=5&attempts=1&stall_ms=300");
    let got = tokio::time::timeout(Duration::from_secs(60), store.get("index.json")).await.expect("an answer");
    let e = got.unwrap_err();
    assert!(matches!(e, Error::BadIndex { .. }) && !e.is_retryable(), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("index.json") && msg.contains(&format!("{} bytes, more than", 40u64 << 30)), "{msg}");
    assert_eq!(asked.load(Relaxed), 1, "a size that cannot change is not asked again");
    // Under the most asked for, the same answer is read (and its body, which stalls, is the
    // error): the size alone decides.
    let e = store.get_at_most("index.json", 50 << 30).await.unwrap_err();
    assert!(!matches!(e, Error::BadIndex { .. }), "{e:?}");
}

/// A listing page that claims a terabyte (and is cut off after 1 MiB) is a failed listing:
/// before, object_store reserved the terabyte it claimed and the process aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_page_claiming_a_terabyte_is_an_error_not_an_abort() {
    let (asked, sent) = counters();
    let addr = server(Answer::ListingClaims(1 << 40), asked.clone(), sent).await;
    let Err(e) = open_listing(addr, 2, 60).await else { panic!("a listing cut short listed something") };
    assert!(asked.load(Relaxed) >= 1, "{e}");
}

/// A 503 whose body never ends: object_store read it until the read's deadline (gigabytes
/// over loopback); now its first 64 KiB are the error's text and the rest is left unread, so
/// the server gets to send little more than the sockets' buffers hold, each attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_answer_without_end_is_cut_short() {
    let (asked, sent) = counters();
    let addr = server(Answer::EndlessError, asked.clone(), sent.clone()).await;
    let store = store_at(addr, "hedge_ms=0&backoff_ms=5&attempts=2&deadline_ms=10000");
    let got = tokio::time::timeout(Duration::from_secs(60), store.get("x.bin")).await.expect("an answer");
    let e = got.unwrap_err();
    assert!(e.to_string().contains("503"), "{e}");
    assert_eq!(asked.load(Relaxed), 2, "{e}");
    let sent = sent.load(Relaxed);
    assert!(sent < 2 * (32 << 20), "{sent} bytes of error body were taken");
}

/// A listing page without end fails once past the most a page may be (64 MiB), each attempt:
/// before, it was read until memory or the deadline ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_page_without_end_fails_at_its_bound() {
    let (asked, sent) = counters();
    let addr = server(Answer::EndlessListing, asked.clone(), sent.clone()).await;
    let Err(e) = open_listing(addr, 1, 120).await else { panic!("a listing without end listed something") };
    assert!(asked.load(Relaxed) >= 1, "{e}");
    let sent = sent.load(Relaxed);
    assert!(sent < 200 << 20, "{sent} bytes of one listing page were taken: {e}");
}
