//! One attempt at one ranged request: a slot under the in-flight limit (one semaphore over
//! everything a fetcher reads, so parallel batches, read-ahead and hedges cannot flood the
//! store), a time limit, and a length check (a short body is a transient failure).

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::ObjectStoreExt;

use super::retry::{classify, Failure};
use super::Fetcher;

impl Fetcher {
    pub(super) async fn attempt(
        &self,
        path: &ObjPath,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> std::result::Result<Bytes, Failure> {
        let slot = self.limit.acquire().await.ok_or_else(|| Failure {
            transient: false,
            missing: false,
            message: "the fetcher's in-flight limit was closed".into(),
            hint: None,
        })?;
        self.counters.requests.fetch_add(1, Relaxed);
        let started = Instant::now();
        let want = range.end - range.start;
        let request = async {
            match if_match {
                None => self.store.get_range(path, range.clone()).await,
                Some(tag) => {
                    let opts = object_store::GetOptions {
                        if_match: Some(tag.to_string()),
                        range: Some(range.clone().into()),
                        ..Default::default()
                    };
                    self.store.get_opts(path, opts).await?.bytes().await
                }
            }
        };
        let result = tokio::time::timeout(self.cfg.timeout, request).await;
        let bytes = match result {
            Err(_) => {
                self.limit.throttled();
                return Err(Failure {
                    transient: true,
                    missing: false,
                    message: format!("timed out after {:?}", self.cfg.timeout),
                    hint: None,
                });
            }
            Ok(Err(e)) => {
                let failure = classify(e);
                if failure.transient {
                    // A throttled or failing store is saturated, whatever its latency says.
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
            return Err(Failure {
                transient: true,
                missing: false,
                message: format!("the body had {} bytes, {want} were promised", bytes.len()),
                hint: None,
            });
        }
        Ok(bytes)
    }
}
