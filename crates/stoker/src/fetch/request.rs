//! One attempt at one ranged request: a slot under the in-flight limit (one semaphore over
//! everything a fetcher reads, so parallel batches, read-ahead and hedges cannot flood the
//! store), a time limit, and a length check (a short body is a transient failure).

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::Bytes;
use object_store::path::Path as ObjPath;

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
            let got = self.store.get_opts(path, opts).await?;
            // The answer's own version, checked before its body is read: a weak or missing
            // tag sends no precondition, so this is what keeps other bytes out.
            if let Some(why) = expect.and_then(|x| x.differs(&got.meta)) {
                return Ok(Err(why));
            }
            got.bytes().await.map(Ok)
        };
        let result = tokio::time::timeout(self.cfg.timeout, request).await;
        let bytes = match result {
            Err(_) => {
                self.limit.throttled();
                return Err(Failure::transient(format!("timed out after {:?}", self.cfg.timeout)));
            }
            Ok(Ok(Err(changed))) => return Err(Failure::changed(changed)),
            Ok(Err(e)) => {
                let failure = classify(e);
                if failure.transient {
                    // A throttled or failing store is saturated, whatever its latency says.
                    self.limit.throttled();
                }
                return Err(failure);
            }
            Ok(Ok(Ok(b))) => b,
        };
        self.record(started.elapsed());
        self.limit.done(&slot, started.elapsed().as_nanos() as u64, bytes.len() as u64);
        self.counters.bytes.fetch_add(bytes.len() as u64, Relaxed);
        if bytes.len() as u64 != want {
            return Err(Failure::transient(format!("the body had {} bytes, {want} were promised", bytes.len())));
        }
        Ok(bytes)
    }
}
