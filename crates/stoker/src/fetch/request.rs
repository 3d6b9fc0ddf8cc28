//! One attempt at one ranged request: a slot under the in-flight limit (one semaphore over
//! everything a fetcher reads, so parallel batches, read-ahead and hedges cannot flood the
//! store), a time limit, a stall timeout on the answer and on every piece of its body, and a
//! length check (a short body, or a longer one cut off at the range, is a transient failure).

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::Bytes;
use object_store::path::Path as ObjPath;

use super::body::{self, Bound};
use super::retry::{classify, Failure};
use super::{Expect, Fetcher};

impl Fetcher {
    pub(super) async fn attempt(
        &self,
        path: &ObjPath,
        range: Range<u64>,
        expect: Option<&Expect>,
    ) -> std::result::Result<Bytes, Failure> {
        let slot =
            self.limit.acquire().await.ok_or_else(|| Failure::fatal("the fetcher's in-flight limit was closed"))?;
        self.counters.requests.fetch_add(1, Relaxed);
        let started = Instant::now();
        let want = range.end - range.start;
        let request = async {
            let opts = object_store::GetOptions {
                if_match: expect.and_then(Expect::if_match).map(str::to_string),
                range: Some(range.clone().into()),
                ..Default::default()
            };
            let got = self.answer(self.store.get_opts(path, opts)).await?;
            // The answer's own version, checked before its body is read: a weak or missing
            // tag sends no precondition, so this is what keeps other bytes out.
            if let Some(why) = expect.and_then(|x| x.differs(&got.meta)) {
                return Err(Failure::changed(why));
            }
            // The range asked for bounds the body, not the length the server announces.
            let bound = Bound { most: want, reserve: usize::try_from(want).unwrap_or(usize::MAX) };
            body::read(got.into_stream(), bound, self.cfg.stall).await
        };
        let bytes = match tokio::time::timeout(self.cfg.timeout, request).await {
            Err(_) => {
                self.limit.throttled();
                return Err(Failure::transient(format!("timed out after {:?} (timeout_ms)", self.cfg.timeout)));
            }
            Ok(Err(failure)) => {
                if failure.transient {
                    // A throttled, failing or stalling store is saturated, whatever its
                    // latency says.
                    self.limit.throttled();
                }
                return Err(failure);
            }
            Ok(Ok(b)) => b,
        };
        self.record(started.elapsed());
        self.limit.done(&slot, started.elapsed().as_nanos() as u64, bytes.len() as u64);
        self.counters.bytes.fetch_add(bytes.len() as u64, Relaxed);
        if bytes.len() as u64 != want {
            return Err(Failure::transient(format!("the body had {} bytes, {want} were promised", bytes.len())));
        }
        Ok(bytes)
    }

    /// The answer to a request (its status and headers), or a transient failure when none
    /// comes within the stall timeout.
    pub(super) async fn answer<T>(
        &self,
        request: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> std::result::Result<T, Failure> {
        use futures::FutureExt;
        // object_store panics on a request it cannot build (a URI over the http crate's
        // 64 KiB, say): the names checked before a request ([`super::name_fits`]) should rule
        // that out, and any other such panic becomes this request's error, not the process's.
        let request = std::panic::AssertUnwindSafe(request).catch_unwind();
        match tokio::time::timeout(self.cfg.stall, request).await {
            Err(_) => Err(Failure::transient(format!("no answer within {:?} (stall_ms); abandoned", self.cfg.stall))),
            Ok(Err(panic)) => Err(Failure::fatal(format!(
                "the HTTP client could not make this request ({}): a bug, please report it",
                crate::error::panic_message(panic)
            ))),
            Ok(Ok(r)) => r.map_err(classify),
        }
    }
}
