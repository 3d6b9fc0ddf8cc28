//! A link of limited bandwidth shared by every response the proxy sends.
//!
//! On one machine the S3 server, the proxy and the client share the cores, so a benchmark's
//! bound is what the CPUs allow; a real node reads over a network link whose rate is the
//! limit, with cores to spare. Pacing the response bodies through one shared link of
//! `link_mib_s` models that: each data frame is held until the link would have carried it,
//! every connection taking its turn on the same link, as on one network interface.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::{BoxError, ProxyBody};

/// The link's schedule: when it is next free to carry a byte.
#[derive(Debug, Default)]
pub(super) struct Link {
    next_free: Mutex<Option<Instant>>,
}

impl Link {
    /// Books `bytes` on the link at `mib_s` MiB/s after what is already booked, and returns
    /// when they have been carried. An idle link starts now: time it sat idle is not banked
    /// as a burst, as a real link's idle time is not.
    pub(super) fn book(&self, bytes: usize, mib_s: u64) -> Instant {
        let now = Instant::now();
        let mut next = self.next_free.lock().unwrap_or_else(|e| e.into_inner());
        let start = next.map_or(now, |t| t.max(now));
        let took = Duration::from_secs_f64(bytes as f64 / (mib_s.max(1) as f64 * (1u64 << 20) as f64));
        let done = start + took;
        *next = Some(done);
        done
    }
}

/// A body whose data frames each wait for their turn on a shared [`Link`].
pub(super) struct PacedBody {
    inner: ProxyBody,
    link: Arc<Link>,
    mib_s: u64,
    /// The frame booked on the link, and the wait until it has been carried.
    held: Option<(Frame<Bytes>, Pin<Box<Sleep>>)>,
}

impl PacedBody {
    pub(super) fn new(inner: ProxyBody, link: Arc<Link>, mib_s: u64) -> Self {
        Self { inner, link, mib_s, held: None }
    }
}

impl Body for PacedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some((frame, mut sleep)) = this.held.take() {
            if sleep.as_mut().poll(cx).is_pending() {
                this.held = Some((frame, sleep));
                return Poll::Pending;
            }
            return Poll::Ready(Some(Ok(frame)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, Bytes::len);
                if n == 0 {
                    return Poll::Ready(Some(Ok(frame)));
                }
                let done = this.link.book(n, this.mib_s);
                this.held = Some((frame, Box::pin(tokio::time::sleep_until(done))));
                self.poll_frame(cx)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    /// The inner body's: pacing changes when bytes arrive, not how many.
    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        if let Some(n) = self.held.as_ref().and_then(|(f, _)| f.data_ref()).map(|d| d.len() as u64) {
            // Upper first: a lower bound above the upper one panics.
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + n);
            }
            hint.set_lower(hint.lower() + n);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bookings_queue_on_one_link_and_idle_time_is_not_banked() {
        let link = Link::default();
        let t0 = Instant::now();
        assert_eq!(link.book(1 << 20, 4), t0 + Duration::from_millis(250));
        // A second connection's frame waits for the first.
        assert_eq!(link.book(1 << 20, 4), t0 + Duration::from_millis(500));
        tokio::time::advance(Duration::from_secs(5)).await;
        let t1 = Instant::now();
        assert_eq!(link.book(1 << 19, 4), t1 + Duration::from_millis(125));
    }
}
