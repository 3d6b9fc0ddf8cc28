//! Bounds on the answers object_store reads whole: an error's text, a listing page, the
//! answer to a write. Stoker reads object bytes itself, within the range asked for
//! (`body`); these object_store collects into one buffer, which it sizes first by the
//! length the server claims. A hostile or broken server claiming a terabyte made that one
//! allocation abort the process, and one sending without end (a 503 whose body never stops)
//! filled memory until the read's deadline.
//!
//! So every answer passes through [`Bounded`] on its way to object_store:
//! - an error's body is cut at [`ERROR_BODY`]: only its text is wanted, and Stoker clips
//!   that to 4 KiB anyway;
//! - a listing page, or the answer to anything but a read, may be at most [`PAGE`]
//!   (a page of 1,000 S3 keys, or 5,000 Azure blobs, takes a few MB), a WebDAV listing
//!   (one answer for the whole tree) [`WHOLE_LISTING`]: more is an error;
//! - a read's body (a GET of an object, ranged or whole) is left alone.
//!
//! Each also claims at most its bound as the body's size, which is what object_store sizes
//! its buffer by.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use object_store::client::{HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpResponseBody, HttpService};

/// The most of an error answer's body object_store is given (the rest is dropped).
pub(crate) const ERROR_BODY: u64 = 64 << 10;

/// The most a listing page or a write's answer may be: more fails the request.
pub(crate) const PAGE: u64 = 64 << 20;

/// The most a WebDAV listing (`PROPFIND`, the whole tree in one answer) may be.
pub(crate) const WHOLE_LISTING: u64 = 1 << 30;

/// An HTTP service whose answers are [`Bounded`] (see the module docs).
#[derive(Debug)]
pub(crate) struct BoundedAnswers<S>(pub(crate) S);

#[async_trait::async_trait]
impl<S: HttpService> HttpService for BoundedAnswers<S> {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let read = matches!(req.method().as_str(), "GET" | "HEAD") && !is_listing(req.uri().query());
        // A WebDAV listing (object_store's HTTP store) is one answer for the whole tree, not
        // pages: as large as a file read whole may be.
        let page = if req.method().as_str() == "PROPFIND" { WHOLE_LISTING } else { PAGE };
        let res = self.0.call(req).await?;
        let over = match (res.status().is_success(), read) {
            (false, _) => Over::Cut(ERROR_BODY),
            (true, false) => Over::Fail(page),
            (true, true) => return encoded(res),
        };
        let (parts, body) = res.into_parts();
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(Bounded::new(body, over))))
    }
}

/// An answer in a content encoding nobody asked for (see [`encoded`]): found among an
/// error's causes by `retry::classify`, which fails it at once (another attempt gets the
/// same).
#[derive(Debug)]
pub(crate) struct EncodedAnswer(String);

impl std::fmt::Display for EncodedAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server sent the object's bytes encoded (Content-Encoding: {}), which Stoker does not decode (a range \
             of encoded bytes is no range of the object): store it without a Content-Encoding (compressed data under \
             a name that says so, such as .jsonl.gz), or serve it as stored",
            self.0
        )
    }
}

impl std::error::Error for EncodedAnswer {}

/// `res`, unless its body is in a content encoding (gzip, br...): Stoker asks for the bytes
/// as stored and does not decode them, and a range of encoded bytes is no range of the object.
/// A server that encodes anyway (an object uploaded with `Content-Encoding: gzip`, a proxy)
/// would have its encoded bytes delivered as the sample, or blamed as damage.
fn encoded(res: HttpResponse) -> Result<HttpResponse, HttpError> {
    let Some(enc) = res.headers().get("content-encoding") else { return Ok(res) };
    let enc = String::from_utf8_lossy(enc.as_bytes()).trim().to_string();
    if enc.is_empty() || enc.eq_ignore_ascii_case("identity") {
        return Ok(res);
    }
    let enc: String = enc.chars().take(64).filter(|c| !c.is_control()).collect();
    Err(HttpError::new(HttpErrorKind::Decode, EncodedAnswer(enc)))
}

/// Whether a request's query asks for a listing (S3 and GCS `list-type=2`, Azure
/// `comp=list`).
fn is_listing(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("list-type=") || kv == "comp=list"))
}

/// What a body longer than its bound becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Over {
    /// Ends after this many bytes (an error's text: the start is what is wanted).
    Cut(u64),
    /// Fails after this many bytes (a page or an answer cut short would be read wrong).
    Fail(u64),
}

/// A body of at most its bound (see [`Over`]), claiming no more than that as its size.
pub(crate) struct Bounded<B> {
    inner: B,
    over: Over,
    /// Bytes still allowed.
    left: u64,
    /// Ended early (cut) or failed: no frame follows.
    done: bool,
}

impl<B> Bounded<B> {
    pub(crate) fn new(inner: B, over: Over) -> Self {
        let left = match over {
            Over::Cut(n) | Over::Fail(n) => n,
        };
        Bounded { inner, over, left, done: false }
    }
}

/// The error a body that outgrows [`Over::Fail`] ends with.
#[derive(Debug)]
struct TooLong(u64);

impl std::fmt::Display for TooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the answer's body is longer than the {} bytes a listing page or a write's answer may be", self.0)
    }
}

impl std::error::Error for TooLong {}

impl<B> Body for Bounded<B>
where
    B: Body<Data = Bytes, Error = HttpError> + Unpin,
{
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let frame = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            other => return Poll::Ready(other),
        };
        let mut data = match frame.into_data() {
            Ok(data) => data,
            // Trailers: no bytes to count.
            Err(frame) => return Poll::Ready(Some(Ok(frame))),
        };
        let len = data.len() as u64;
        if len > self.left {
            self.done = true;
            match self.over {
                Over::Fail(most) => {
                    return Poll::Ready(Some(Err(HttpError::new(HttpErrorKind::Decode, TooLong(most)))));
                }
                // `left` fits in usize: it is at most the length of `data`.
                Over::Cut(_) => data.truncate(self.left as usize),
            }
        }
        self.left -= data.len() as u64;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    /// The inner body's claim, within the bound: object_store allocates by its lower end.
    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        if let Over::Cut(_) = self.over {
            hint.set_upper(inner.upper().unwrap_or(self.left).min(self.left));
        }
        hint.set_lower(inner.lower().min(self.left).min(hint.upper().unwrap_or(u64::MAX)));
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// A body of `pieces`, claiming `claim` bytes.
    struct Pieces {
        pieces: std::collections::VecDeque<Bytes>,
        claim: u64,
    }

    impl Body for Pieces {
        type Data = Bytes;
        type Error = HttpError;
        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
            Poll::Ready(self.pieces.pop_front().map(|p| Ok(Frame::data(p))))
        }
        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(self.claim)
        }
    }

    fn pieces(n: usize, each: usize, claim: u64) -> Pieces {
        Pieces { pieces: (0..n).map(|i| Bytes::from(vec![i as u8; each])).collect(), claim }
    }

    async fn collect(
        body: impl Body<Data = Bytes, Error = HttpError> + Send + Sync + 'static,
    ) -> Vec<Result<Bytes, HttpError>> {
        HttpResponseBody::new(body).bytes_stream().collect().await
    }

    #[tokio::test]
    async fn an_error_body_is_cut_at_its_bound_and_claims_no_more() {
        let b = Bounded::new(pieces(5, 40, 1 << 40), Over::Cut(100));
        assert_eq!((b.size_hint().lower(), b.size_hint().upper()), (100, Some(100)));
        let got: Vec<u8> = collect(b).await.into_iter().flat_map(|p| p.unwrap().to_vec()).collect();
        assert_eq!(got, [vec![0u8; 40], vec![1u8; 40], vec![2u8; 20]].concat());
        // Under its bound, a body is as it was.
        let b = Bounded::new(pieces(2, 40, 80), Over::Cut(100));
        assert_eq!((b.size_hint().lower(), b.size_hint().upper()), (80, Some(80)));
        assert_eq!(collect(b).await.len(), 2);
    }

    #[tokio::test]
    async fn a_page_over_its_bound_fails_and_claims_no_more() {
        let b = Bounded::new(pieces(5, 40, 1 << 40), Over::Fail(100));
        assert_eq!((b.size_hint().lower(), b.size_hint().upper()), (100, None));
        let got = collect(b).await;
        assert_eq!(got.len(), 3, "two pieces, then the error, then nothing");
        assert!(got[..2].iter().all(Result::is_ok));
        let e = got[2].as_ref().unwrap_err();
        assert!(e.to_string().contains("longer than the 100 bytes"), "{e}");
        // Exactly at its bound, it is whole.
        let got = collect(Bounded::new(pieces(2, 50, 100), Over::Fail(100))).await;
        assert!(got.len() == 2 && got.iter().all(Result::is_ok));
    }

    #[test]
    fn listings_are_told_by_their_query() {
        for q in ["list-type=2&prefix=a", "prefix=a&list-type=2", "restype=container&comp=list"] {
            assert!(is_listing(Some(q)), "{q}");
        }
        for q in [None, Some("x-id=GetObject"), Some("comp=listx"), Some("partNumber=1&uploadId=u")] {
            assert!(!is_listing(q), "{q:?}");
        }
    }
}
