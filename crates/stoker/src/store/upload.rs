//! A remote object written in parts as it grows ([`Parts`], behind
//! [`ObjectWriter`](super::ObjectWriter)): a multipart upload, so a writer holds a few parts,
//! not the object. It still appears whole or not at all (the store publishes it at the
//! upload's completion, and an upload given up is aborted). Where parts cannot be sent (no
//! runtime to send them on, or a store without multipart uploads) the object is gathered
//! for one PUT.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::fetch::write_limit;

/// Bytes a part: above every store's minimum (5 MiB on S3), and every part but the last the
/// same size, as some stores (R2) require.
pub(crate) const PART: usize = 8 << 20;

/// Parts sent at once; with the one being filled, what a writer holds.
const IN_FLIGHT: usize = 3;

/// A remote object being written; see the module docs.
pub(crate) struct Parts {
    /// The runtime the parts are sent on; `None`: the object is gathered whole.
    handle: Option<Handle>,
    objects: Arc<dyn ObjectStore>,
    location: ObjPath,
    /// The part being filled.
    buf: Vec<u8>,
    state: State,
    in_flight: VecDeque<JoinHandle<object_store::Result<()>>>,
    /// The fetch layer's attempt limit (`timeout_ms`), from which each request's comes
    /// ([`crate::fetch::write_limit`]).
    timeout: Duration,
    /// Bytes handed to the upload's parts so far.
    sent: u64,
}

/// Send `part` of `upload` on `handle`'s runtime, within its time limit, counting its bytes
/// into `sent`.
fn send_part(
    handle: &Handle,
    upload: &mut dyn MultipartUpload,
    part: PutPayload,
    timeout: Duration,
    sent: &mut u64,
) -> JoinHandle<object_store::Result<()>> {
    let len = part.content_length() as u64;
    *sent += len;
    handle.spawn(within(write_limit(timeout, len), "a part", upload.put_part(part)))
}

/// `request` (what it is: `what`) within `limit`, else an error saying so: object_store's
/// own timeouts are off for Stoker's stores, and a write whose answer never comes (a
/// stalled proxy, a black-holed connection) would otherwise be waited for without end.
async fn within<T>(
    limit: Duration,
    what: &str,
    request: impl std::future::Future<Output = object_store::Result<T>>,
) -> object_store::Result<T> {
    tokio::time::timeout(limit, request).await.unwrap_or_else(|_| {
        Err(object_store::Error::Generic {
            store: "stoker",
            source: format!("no answer to {what} within {limit:?} (timeout_ms)").into(),
        })
    })
}

enum State {
    /// No part is full yet: an object smaller than a part is sent in one PUT.
    Unstarted,
    /// In a mutex only to make the writer `Sync` (an upload is `Send` alone); reached through
    /// `&mut`, never locked.
    Uploading(Mutex<Box<dyn MultipartUpload>>),
    /// No runtime, or a store without multipart uploads (HTTP): the object is gathered here
    /// for one PUT.
    Whole(Vec<u8>),
    Done,
}

impl Parts {
    /// A writer of `location` in `objects` (about `size_hint` bytes), its requests run on
    /// `handle`'s runtime (the writes come from threads that may block, outside it); without
    /// one, the object is gathered for one PUT.
    pub(crate) fn new(
        handle: Option<Handle>,
        objects: Arc<dyn ObjectStore>,
        location: ObjPath,
        size_hint: u64,
        timeout: Duration,
    ) -> Self {
        let state = match handle {
            Some(_) => State::Unstarted,
            // At most 1 GiB reserved ahead: a hint is not a promise, and a reservation too
            // large to make would abort the process.
            None => State::Whole(Vec::with_capacity(size_hint.min(1 << 30) as usize)),
        };
        Parts { handle, objects, location, buf: Vec::new(), state, in_flight: VecDeque::new(), timeout, sent: 0 }
    }

    /// Take some of `data`; blocking (waits while [`IN_FLIGHT`] parts are being sent).
    pub(crate) fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if let State::Whole(v) = &mut self.state {
            v.extend_from_slice(data);
            return Ok(data.len());
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(PART);
        }
        let n = data.len().min(PART - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == PART {
            self.send_part()?;
        }
        Ok(n)
    }

    fn send_part(&mut self) -> io::Result<()> {
        // Only a writer with a runtime fills parts (one without gathers the object whole).
        let Some(handle) = self.handle.clone() else { return Err(io::Error::other("no runtime to send parts on")) };
        if let State::Unstarted = self.state {
            let (objects, location) = (self.objects.clone(), self.location.clone());
            let limit = self.timeout;
            // Spawned, not run here: on a current-thread runtime only its own thread drives
            // the requests' IO.
            let start = handle
                .spawn(async move { within(limit, "starting the upload", objects.put_multipart(&location)).await });
            match handle.block_on(start).map_err(io::Error::other)? {
                Ok(upload) => self.state = State::Uploading(Mutex::new(upload)),
                Err(object_store::Error::NotImplemented { .. }) => {
                    let mut whole = std::mem::take(&mut self.buf);
                    whole.reserve(PART);
                    self.state = State::Whole(whole);
                    return Ok(());
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
        let State::Uploading(upload) = &mut self.state else { return Err(io::Error::other("the upload ended")) };
        let upload = upload.get_mut().unwrap_or_else(|e| e.into_inner());
        let part = PutPayload::from(Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(PART))));
        let task = send_part(&handle, upload.as_mut(), part, self.timeout, &mut self.sent);
        self.in_flight.push_back(task);
        while self.in_flight.len() > IN_FLIGHT {
            let oldest = self.in_flight.pop_front().expect("more than IN_FLIGHT parts");
            handle.block_on(oldest).map_err(io::Error::other)?.map_err(io::Error::other)?;
        }
        Ok(())
    }

    /// Send what is left and publish the object. An upload that fails, or whose `finish` is
    /// dropped before it ends, is aborted (once its parts in flight have ended).
    pub(crate) async fn finish(mut self) -> object_store::Result<()> {
        let last = std::mem::take(&mut self.buf);
        if let State::Uploading(_) = self.state {
            let r = self.complete(last).await;
            match &r {
                Ok(()) => self.state = State::Done,
                Err(_) => {
                    // The parts sent so far are the store's until aborted (S3 keeps and bills
                    // them); a failure to abort leaves them to the bucket's lifecycle rules.
                    if let Some(stop) = self.stopper() {
                        stop.await;
                    }
                }
            }
            return r;
        }
        let whole = match std::mem::replace(&mut self.state, State::Done) {
            State::Whole(mut v) => {
                v.extend_from_slice(&last);
                v
            }
            _ => last,
        };
        let limit = write_limit(self.timeout, whole.len() as u64);
        within(limit, "the write", self.objects.put(&self.location, PutPayload::from(Bytes::from(whole))))
            .await
            .map(drop)
    }

    /// The last part sent, every part waited for (a failed one leaves the others in flight,
    /// for the abort to wait for), the upload completed.
    async fn complete(&mut self, last: Vec<u8>) -> object_store::Result<()> {
        let State::Uploading(upload) = &mut self.state else { return Ok(()) };
        let upload = upload.get_mut().unwrap_or_else(|e| e.into_inner());
        if !last.is_empty() {
            // An upload was started on the writer's runtime, so it has one.
            let Some(handle) = &self.handle else {
                return Err(object_store::Error::Generic {
                    store: "stoker",
                    source: "no runtime to send parts on".into(),
                });
            };
            let part = PutPayload::from(Bytes::from(last));
            let task = send_part(handle, upload.as_mut(), part, self.timeout, &mut self.sent);
            self.in_flight.push_back(task);
        }
        while let Some(part) = self.in_flight.pop_front() {
            part.await??;
        }
        // A store may take minutes to put a large object's parts together: the limit grows
        // with the object.
        let limit = write_limit(self.timeout, self.sent);
        within(limit, "completing the upload", upload.complete()).await.map(drop)
    }
}

impl Parts {
    /// Give the object up: nothing appears, and the parts sent are discarded once those still
    /// being sent have ended (a part that lands after the abort would be kept, and billed).
    pub(crate) async fn abort(mut self) {
        if let Some(stop) = self.stopper() {
            stop.await;
        }
    }

    fn stopper(&mut self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let State::Uploading(upload) = std::mem::replace(&mut self.state, State::Done) else { return None };
        let mut upload = upload.into_inner().unwrap_or_else(|e| e.into_inner());
        let parts: Vec<_> = self.in_flight.drain(..).collect();
        let limit = self.timeout;
        Some(async move {
            for part in parts {
                let _ = part.await;
            }
            let _ = within(limit, "aborting the upload", upload.abort()).await;
        })
    }
}

impl Drop for Parts {
    fn drop(&mut self) {
        // Given up without `finish` or `abort` (an error, a panic): the abort runs on.
        // (Only an upload has something to stop, and only a writer with a runtime uploads.)
        if let (Some(stop), Some(handle)) = (self.stopper(), &self.handle) {
            handle.spawn(stop);
        }
    }
}
