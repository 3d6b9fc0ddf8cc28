//! A link of limited bandwidth shared by every response body the proxy forwards.
//!
//! On one machine the S3 server, the proxy and the client share the cores, so a benchmark's
//! bound is what the CPUs allow; a real node reads over a network link whose rate is the
//! limit, with cores to spare. Pacing the response bodies through one shared link of
//! `link_mib_s` models that: each data frame is held until the link would have carried it,
//! every connection taking its turn on the same link, as on one network interface.
//!
//! Tokio's timers fire on whole milliseconds, late by up to one. So that a connection sending
//! small frames is not held to one frame a millisecond, a frame due within [`TICK`] goes at
//! once (the link's schedule still counts it), and up to one [`TICK`] of idle time is credited
//! back to the next booking, which makes up for the timer waking late.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::{BoxError, ProxyBody};

/// The timers' resolution: frames due within it are not waited for, and idle time up to it
/// is not lost.
const TICK: Duration = Duration::from_millis(1);

/// The link's schedule: when it is next free to carry a byte.
#[derive(Debug, Default)]
pub(super) struct Link {
    next_free: Mutex<Option<Instant>>,
}

impl Link {
    /// Books `bytes` on the link at `mib_s` MiB/s after what is already booked, and returns
    /// when they have been carried. A link idle for longer than [`TICK`] starts at most one
    /// tick back: longer idle time is not banked as a burst, as a real link's is not.
    pub(super) fn book(&self, bytes: usize, mib_s: u64) -> Instant {
        let now = Instant::now();
        let mut next = self.next_free.lock().unwrap_or_else(|e| e.into_inner());
        let floor = now.checked_sub(TICK).unwrap_or(now);
        let start = next.map_or(now, |t| t.max(floor));
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
                if done <= Instant::now() + TICK {
                    return Poll::Ready(Some(Ok(frame)));
                }
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
    use http_body_util::{BodyExt, StreamBody};

    #[tokio::test(start_paused = true)]
    async fn bookings_queue_on_one_link_and_long_idle_time_is_not_banked() {
        let link = Link::default();
        let t0 = Instant::now();
        assert_eq!(link.book(1 << 20, 4), t0 + Duration::from_millis(250));
        // A second connection's frame waits for the first.
        assert_eq!(link.book(1 << 20, 4), t0 + Duration::from_millis(500));
        tokio::time::advance(Duration::from_secs(5)).await;
        let t1 = Instant::now();
        // Idle for seconds: one tick of it is credited, no more.
        assert_eq!(link.book(1 << 19, 4), t1 - TICK + Duration::from_millis(125));
    }

    /// A body of `frames` data frames of `size` bytes each, paced on `link` at `mib_s`.
    fn body(link: &Arc<Link>, frames: usize, size: usize, mib_s: u64) -> PacedBody {
        let chunks = (0..frames).map(move |_| Ok::<_, BoxError>(Frame::data(Bytes::from(vec![7u8; size]))));
        let inner = StreamBody::new(futures::stream::iter(chunks)).boxed();
        PacedBody::new(inner, link.clone(), mib_s)
    }

    async fn drain(mut b: PacedBody) -> usize {
        let mut n = 0;
        while let Some(frame) = b.frame().await {
            n += frame.unwrap().into_data().map_or(0, |d| d.len());
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn small_frames_go_at_the_links_rate_and_two_bodies_share_it() {
        let link = Arc::new(Link::default());
        // 1 MiB in 64 frames of 16 KiB at 64 MiB/s: 15.6 ms of link time, give or take the
        // ticks credited and released early. Waiting a timer tick for each frame would take
        // 64 ms.
        let t = Instant::now();
        assert_eq!(drain(body(&link, 64, 16 << 10, 64)).await, 1 << 20);
        let one = t.elapsed();
        assert!(one >= Duration::from_micros(13_600) && one <= Duration::from_micros(17_700), "{one:?}");
        // Two such bodies at once take twice as long: they share the link (a link each would
        // carry both in 15.6 ms).
        tokio::time::advance(Duration::from_secs(1)).await;
        let t = Instant::now();
        let (a, b) = tokio::join!(drain(body(&link, 64, 16 << 10, 64)), drain(body(&link, 64, 16 << 10, 64)));
        assert_eq!((a, b), (1 << 20, 1 << 20));
        let two = t.elapsed();
        assert!(two >= Duration::from_micros(29_200) && two <= Duration::from_micros(33_300), "{two:?}");
    }
}
