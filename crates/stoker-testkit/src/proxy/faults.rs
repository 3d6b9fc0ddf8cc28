//! The faults themselves: a reset connection and a body cut short.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::BoxError;

/// Returned by the service to make hyper drop the connection; the socket's
/// `Drop` then turns the close into a TCP RST.
#[derive(Debug)]
pub(super) struct InjectedReset;

impl std::fmt::Display for InjectedReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected connection reset")
    }
}

impl std::error::Error for InjectedReset {}

/// Why a truncated body ended: makes hyper abort the connection, so the
/// client sees fewer bytes than `Content-Length` promised.
#[derive(Debug)]
struct Truncated;

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected truncation")
    }
}

impl std::error::Error for Truncated {}

/// How long the cut body waits before failing, so hyper flushes the bytes
/// already queued: failing at once can discard them, and the client would
/// see no body at all instead of half of it.
const TRUNCATE_FLUSH_DELAY: Duration = Duration::from_millis(20);

/// Passes through the first `limit` bytes of a body, then fails.
///
/// With an unknown length (chunked upstream) `limit` is `None` and half of
/// the first data frame is sent.
pub(super) struct TruncatedBody {
    inner: Incoming,
    limit: Option<u64>,
    /// Set once the limit is reached: the delay before the final error.
    ending: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl TruncatedBody {
    pub(super) fn new(inner: Incoming, limit: Option<u64>) -> Self {
        Self { inner, limit, ending: None }
    }

    fn start_ending(&mut self) {
        self.ending = Some(Box::pin(tokio::time::sleep(TRUNCATE_FLUSH_DELAY)));
    }
}

impl Body for TruncatedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(sleep) = this.ending.as_mut() {
            return match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(Truncated)))),
                Poll::Pending => Poll::Pending,
            };
        }
        if this.limit == Some(0) {
            this.start_ending();
            return self.poll_frame(cx);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            // Upstream ended before the cut (short body): still fail, the
            // client was promised the declared length.
            Poll::Ready(None) => {
                this.start_ending();
                return self.poll_frame(cx);
            }
            Poll::Pending => return Poll::Pending,
        };
        let Ok(mut data) = frame.into_data() else {
            // Trailers: drop them, the body is cut anyway.
            this.start_ending();
            return self.poll_frame(cx);
        };
        let keep = match this.limit {
            Some(limit) => limit.min(data.len() as u64),
            None => data.len() as u64 / 2,
        };
        // `keep` is at most `data.len()`, so it fits in usize.
        data.truncate(usize::try_from(keep).unwrap_or(data.len()));
        match &mut this.limit {
            Some(limit) => *limit -= keep,
            None => this.limit = Some(0),
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    /// Unknown on purpose: hyper then frames the response with the upstream's
    /// `Content-Length` header instead of the (shorter) real length.
    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A client socket that can be closed with a TCP RST instead of a FIN.
///
/// hyper owns the socket while serving, so the service cannot close it
/// directly; it sets `reset` and returns an error, hyper drops the
/// connection, and `Drop` here sets `SO_LINGER` to 0 right before the close.
pub(super) struct ResettableStream {
    pub(super) inner: TcpStream,
    pub(super) reset: Arc<AtomicBool>,
}

impl ResettableStream {
    fn resetting(&self) -> bool {
        self.reset.load(Ordering::SeqCst)
    }
}

impl Drop for ResettableStream {
    fn drop(&mut self) {
        if self.resetting() {
            // If this fails the close is a FIN: still a failed request.
            let _ = socket2::SockRef::from(&self.inner).set_linger(Some(Duration::ZERO));
        }
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.resetting() {
            // Nothing may reach the client after a reset was decided.
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.resetting() {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.resetting() {
            // A shutdown would send a FIN first; the client must see only the RST.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
