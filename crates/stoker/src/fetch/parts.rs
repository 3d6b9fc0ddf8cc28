//! Multipart uploads through the fetch layer: every request retried as reads are. The parts
//! are numbered by the caller ([`MultipartStore`]), so a part whose attempt failed (a 503, a
//! reset, no answer within its limit) is sent again under the same number; the upload object
//! object_store hands out numbers parts by call, and a failed one could not be retried.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjPath;
use object_store::{MultipartId, PutPayload};

use super::retry::{classify_write, http_status, Failure};
use super::{write_limit, Fetcher};
use crate::error::Result;

impl Fetcher {
    /// The same fetcher, writing objects in parts through `store` (the store it reads, as a
    /// [`MultipartStore`]). Without one, objects are written in one PUT.
    pub fn with_multipart(mut self, store: Arc<dyn MultipartStore>) -> Self {
        self.multipart = Some(store);
        self
    }

    /// Whether objects can be written in parts ([`with_multipart`](Self::with_multipart)).
    pub(crate) fn has_multipart(&self) -> bool {
        self.multipart.is_some()
    }

    fn parts_store(&self) -> Result<&Arc<dyn MultipartStore>> {
        self.multipart.as_ref().ok_or_else(|| crate::Error::internal("this store writes no parts"))
    }

    /// Start an upload of `path` (`shown` names it in errors), retried within the deadline.
    pub(crate) async fn start_upload(&self, path: &ObjPath, shown: &str) -> Result<MultipartId> {
        let store = self.parts_store()?;
        let limit = self.cfg.timeout;
        let what = || "starting a multipart upload".to_string();
        self.retrying(shown, what, Some(self.cfg.deadline), || async {
            self.counters.requests.fetch_add(1, Relaxed);
            answer(limit, "starting the upload", store.create_multipart(path)).await
        })
        .await
    }

    /// Send part `idx` of upload `id`, retried within the deadline (each attempt sends the
    /// same bytes under the same number, which replaces what an earlier attempt may have
    /// left), and no attempt started once `stop` is set (the upload was given up).
    pub(crate) async fn put_part(
        &self,
        path: &ObjPath,
        shown: &str,
        (id, idx): (&MultipartId, usize),
        part: PutPayload,
        stop: &AtomicBool,
    ) -> Result<PartId> {
        let store = self.parts_store()?;
        let bytes = part.content_length() as u64;
        let limit = write_limit(self.cfg.timeout, bytes);
        let what = || format!("part {} of a multipart upload", idx + 1);
        self.retrying(shown, what, Some(write_limit(self.cfg.deadline, bytes)), || async {
            if stop.load(Relaxed) {
                return Err(Failure::fatal("the upload was given up"));
            }
            self.counters.requests.fetch_add(1, Relaxed);
            answer(limit, "a part", store.put_part(path, id, idx, part.clone())).await
        })
        .await
    }

    /// Put the parts of upload `id` together as the object (`bytes` long). Retried only after
    /// an answer that says the store did not do it (500 InternalError, 503 SlowDown, or S3's
    /// 200 whose body is such an error): a request without an answer, or a gateway's 502 or
    /// 504, may have completed the upload, and a second attempt would then fail.
    pub(crate) async fn complete_upload(
        &self,
        path: &ObjPath,
        shown: &str,
        id: &MultipartId,
        parts: Vec<PartId>,
        bytes: u64,
    ) -> Result<()> {
        let store = self.parts_store()?;
        // A store may take minutes to put a large object's parts together.
        let limit = write_limit(self.cfg.timeout, bytes);
        let what = || "completing a multipart upload".to_string();
        self.retrying(shown, what, None, || {
            // Every attempt names every part (a list taken by the first would leave the next
            // one completing an empty object).
            let parts = parts.clone();
            async move {
                self.counters.requests.fetch_add(1, Relaxed);
                let r = answer(limit, "completing the upload", store.complete_multipart(path, id, parts)).await;
                // object_store's text for an error in a 200's body (S3 sends the status before
                // it knows): it reports only InternalError and SlowDown so.
                let answered = |f: &Failure| {
                    matches!(http_status(&f.message), Some(500 | 503))
                        || f.message.contains("Server returned error response:")
                };
                r.map(drop).map_err(|f| Failure { transient: f.transient && answered(&f), ..f })
            }
        })
        .await
    }

    /// Give upload `id` up: the parts sent are discarded by the store. Retried within twice
    /// the attempt limit (a store throttling the parts likely throttles this too); one that
    /// still fails leaves them to the bucket's lifecycle rules.
    pub(crate) async fn abort_upload(&self, path: &ObjPath, shown: &str, id: &MultipartId) {
        let Ok(store) = self.parts_store() else { return };
        let limit = self.cfg.timeout;
        let what = || "aborting a multipart upload".to_string();
        let _ = self
            .retrying(shown, what, Some(limit.saturating_mul(2)), || async {
                self.counters.requests.fetch_add(1, Relaxed);
                match answer(limit, "aborting the upload", store.abort_multipart(path, id)).await {
                    // Gone already: nothing is left to discard.
                    Err(f) if f.missing => Ok(()),
                    other => other,
                }
            })
            .await;
    }
}

/// `request` (`what`) within `limit`, its failure classified as a write's.
pub(super) async fn answer<T>(
    limit: std::time::Duration,
    what: &str,
    request: impl std::future::Future<Output = object_store::Result<T>>,
) -> std::result::Result<T, Failure> {
    match tokio::time::timeout(limit, request).await {
        Err(_) => Err(Failure::transient(format!("no answer to {what} within {limit:?} (timeout_ms)"))),
        Ok(Err(e)) => Err(classify_write(e)),
        Ok(Ok(v)) => Ok(v),
    }
}
