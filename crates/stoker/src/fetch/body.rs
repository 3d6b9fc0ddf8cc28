//! Reading an answer's body as it streams in, under two rules a `.bytes()` cannot keep:
//!
//! * a body that sends nothing for the stall timeout is abandoned (a transient failure,
//!   retried): the timer restarts on every piece, so a slow but moving body is never cut,
//!   while a server that stops mid-body costs seconds, not the attempt's whole time limit;
//! * a body is never held past the bytes asked for: memory is bounded by the range, whatever
//!   `Content-Length` claims, and a body longer than the range (a lying length, a server that
//!   sends more) is cut off and is a transient failure, as a short one is.

use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;

use super::retry::{classify, Failure};

/// What a piece of a body may cost: the bytes asked for, what to reserve up front.
pub(super) struct Bound {
    /// A body longer than this is cut off and fails.
    pub(super) most: u64,
    /// Bytes reserved before the first piece arrives when the body comes in pieces: the range
    /// asked for (never a size only the server claims, which can be anything).
    pub(super) reserve: usize,
}

/// Whole-object reads reserve at most this much before the bytes are there: their length is
/// the server's claim, and memory follows what arrives.
pub(super) const RESERVE_UNASKED: usize = 4 << 20;

/// The body of `stream`, at most `bound.most` bytes, each piece within `stall` of the last.
pub(super) async fn read(
    mut stream: BoxStream<'static, object_store::Result<Bytes>>,
    bound: Bound,
    stall: Duration,
) -> Result<Bytes, Failure> {
    let mut first: Option<Bytes> = None;
    // A body in pieces is joined into a recycled buffer: a fresh multi-MiB one per response
    // cost page faults and zeroing (13% of a cold epoch's CPU in a profile), more than the
    // copy itself.
    let mut joined: Option<Vec<u8>> = None;
    let mut filled = 0usize;
    let mut got = 0u64;
    loop {
        let piece = match tokio::time::timeout(stall, stream.next()).await {
            Err(_) => {
                return Err(Failure::transient(format!(
                    "the body stalled: no bytes for {stall:?} after {got} of them (stall_ms); abandoned"
                )))
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(classify(e)),
            Ok(Some(Ok(piece))) => piece,
        };
        got += piece.len() as u64;
        if got > bound.most {
            // Dropping the stream here closes the connection: nothing past the range is read.
            return Err(Failure::transient(format!(
                "the server sent more than the {} bytes asked for; the body was cut off there",
                bound.most
            )));
        }
        // One piece is the common answer: kept as it is, no copy.
        if first.is_none() && joined.is_none() {
            first = Some(piece);
            continue;
        }
        let buf = joined.get_or_insert_with(|| crate::buffer::take(bound.reserve));
        for p in first.take().iter().chain(std::iter::once(&piece)) {
            let end = filled + p.len();
            if end > buf.len() {
                // More than reserved (a whole object longer than the reservation): grow.
                buf.resize(end, 0);
            }
            buf[filled..end].copy_from_slice(p);
            filled = end;
        }
    }
    Ok(match (first, joined) {
        (_, Some(buf)) => crate::buffer::freeze(buf, filled),
        (Some(only), None) => only,
        (None, None) => Bytes::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(p: Vec<&'static [u8]>) -> BoxStream<'static, object_store::Result<Bytes>> {
        futures::stream::iter(p.into_iter().map(|b| Ok(Bytes::from_static(b)))).boxed()
    }

    fn bound(most: u64) -> Bound {
        Bound { most, reserve: most as usize }
    }

    #[tokio::test]
    async fn pieces_are_joined_and_a_longer_body_is_cut_off() {
        let s = Duration::from_secs(5);
        assert_eq!(read(pieces(vec![b"abc"]), bound(3), s).await.ok().unwrap(), &b"abc"[..]);
        assert_eq!(read(pieces(vec![b"ab", b"", b"c"]), bound(3), s).await.ok().unwrap(), &b"abc"[..]);
        assert_eq!(read(pieces(vec![]), bound(3), s).await.ok().unwrap(), &b""[..]);
        // No stall timeout at all (stall_ms=0) is a wait, not an overflow.
        assert_eq!(read(pieces(vec![b"a", b"b"]), bound(3), Duration::MAX).await.ok().unwrap(), &b"ab"[..]);
        let e = read(pieces(vec![b"ab", b"cd"]), bound(3), s).await.err().unwrap();
        assert!(e.transient && e.message.contains("more than the 3 bytes"), "{}", e.message);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_sending_is_abandoned_but_a_slow_one_is_not() {
        use futures::stream;
        let slow = stream::iter(0..5)
            .then(|_| async {
                tokio::time::sleep(Duration::from_millis(80)).await;
                Ok(Bytes::from_static(b"x"))
            })
            .boxed();
        let got = read(slow, bound(5), Duration::from_millis(100)).await.ok().unwrap();
        assert_eq!(got, &b"xxxxx"[..], "each piece within the stall timeout: 400 ms in all is fine");
        let stops = stream::iter(vec![Ok(Bytes::from_static(b"xy"))]).chain(stream::pending()).boxed();
        let e = read(stops, bound(5), Duration::from_millis(100)).await.err().unwrap();
        assert!(e.transient && e.message.contains("stalled") && e.message.contains("after 2"), "{}", e.message);
    }
}
