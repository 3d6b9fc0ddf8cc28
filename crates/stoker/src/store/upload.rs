//! A remote object written in parts as it grows ([`Parts`], behind
//! [`ObjectWriter`](super::ObjectWriter)): a multipart upload, so a writer holds a few parts,
//! not the object. It still appears whole or not at all (the store publishes it at the
//! upload's completion, and an upload given up is aborted). Every request goes through the
//! fetch layer and is retried as reads are: a part is numbered by the writer, so one whose
//! attempt failed is sent again under its number ([`Fetcher::put_part`]). Where parts cannot
//! be sent (no runtime to send them on, or a store without multipart uploads) the object is
//! gathered for one PUT.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use object_store::multipart::PartId;
use object_store::path::Path as ObjPath;
use object_store::{MultipartId, PutPayload};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::fetch::Fetcher;

/// Bytes a part: above every store's minimum (5 MiB on S3), and every part but the last the
/// same size, as some stores (R2) require.
pub(crate) const PART: usize = 8 << 20;

/// Parts sent at once; with the one being filled, what a writer holds.
const IN_FLIGHT: usize = 3;

/// A remote object being written; see the module docs.
pub(crate) struct Parts {
    /// The runtime the parts are sent on; `None`: the object is gathered whole.
    handle: Option<Handle>,
    fetcher: Arc<Fetcher>,
    location: ObjPath,
    /// The object, credentials redacted, for errors.
    shown: String,
    /// The part being filled.
    buf: Vec<u8>,
    state: State,
    /// Parts being sent, in order.
    in_flight: VecDeque<JoinHandle<Result<PartId>>>,
    /// Parts the store has taken, in order.
    landed: Vec<PartId>,
    /// Bytes handed to the upload's parts so far.
    sent: u64,
    /// Set when the upload is given up: its parts in flight start no further attempt.
    stop: Arc<AtomicBool>,
}

enum State {
    /// No part is full yet: an object smaller than a part is sent in one PUT.
    Unstarted,
    Uploading(MultipartId),
    /// No runtime, or a store without multipart uploads (HTTP): the object is gathered here
    /// for one PUT.
    Whole(Vec<u8>),
    Done,
}

impl Parts {
    /// A writer of `location` (`shown` in errors) through `fetcher` (about `size_hint`
    /// bytes), its requests run on `handle`'s runtime (the writes come from threads that may
    /// block, outside it); without one, the object is gathered for one PUT.
    pub(crate) fn new(
        handle: Option<Handle>,
        fetcher: Arc<Fetcher>,
        location: ObjPath,
        shown: String,
        size_hint: u64,
    ) -> Self {
        let state = match handle {
            Some(_) => State::Unstarted,
            // At most 1 GiB reserved ahead: a hint is not a promise, and a reservation too
            // large to make would abort the process.
            None => State::Whole(Vec::with_capacity(size_hint.min(1 << 30) as usize)),
        };
        Parts {
            handle,
            fetcher,
            location,
            shown,
            buf: Vec::new(),
            state,
            in_flight: VecDeque::new(),
            landed: Vec::new(),
            sent: 0,
            stop: Arc::new(AtomicBool::new(false)),
        }
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
            if !self.fetcher.has_multipart() {
                let mut whole = std::mem::take(&mut self.buf);
                whole.reserve(PART);
                self.state = State::Whole(whole);
                return Ok(());
            }
            let (fetcher, location, shown) = (self.fetcher.clone(), self.location.clone(), self.shown.clone());
            // Spawned, not run here: on a current-thread runtime only its own thread drives
            // the requests' IO.
            let start = handle.spawn(async move { fetcher.start_upload(&location, &shown).await });
            let id = handle.block_on(start).map_err(io::Error::other)?.map_err(io::Error::other)?;
            self.state = State::Uploading(id);
        }
        let part = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(PART)));
        self.spawn_part(&handle, part)?;
        while self.in_flight.len() > IN_FLIGHT {
            let oldest = self.in_flight.pop_front().expect("more than IN_FLIGHT parts");
            let id = handle.block_on(oldest).map_err(io::Error::other)?.map_err(io::Error::other)?;
            self.landed.push(id);
        }
        Ok(())
    }

    /// Send `part` as the upload's next part on `handle`'s runtime.
    fn spawn_part(&mut self, handle: &Handle, part: Bytes) -> io::Result<()> {
        let State::Uploading(id) = &self.state else { return Err(io::Error::other("the upload ended")) };
        let idx = self.landed.len() + self.in_flight.len();
        self.sent += part.len() as u64;
        let (fetcher, location, shown, id) =
            (self.fetcher.clone(), self.location.clone(), self.shown.clone(), id.clone());
        let stop = self.stop.clone();
        let task = handle
            .spawn(async move { fetcher.put_part(&location, &shown, (&id, idx), PutPayload::from(part), &stop).await });
        self.in_flight.push_back(task);
        Ok(())
    }

    /// Send what is left and publish the object. An upload that fails, or whose `finish` is
    /// dropped before it ends, is aborted (once its parts in flight have ended).
    pub(crate) async fn finish(mut self) -> Result<()> {
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
        self.fetcher.put(&self.location, &self.shown, Bytes::from(whole)).await
    }

    /// The last part sent, every part waited for (a failed one leaves the others in flight,
    /// for the abort to wait for), the upload completed.
    async fn complete(&mut self, last: Vec<u8>) -> Result<()> {
        if !last.is_empty() {
            // An upload was started on the writer's runtime, so it has one.
            let Some(handle) = self.handle.clone() else { return Err(Error::internal("no runtime to send parts on")) };
            self.spawn_part(&handle, Bytes::from(last)).map_err(|e| Error::internal(e.to_string()))?;
        }
        while let Some(part) = self.in_flight.pop_front() {
            let id = part.await.map_err(Error::task)??;
            self.landed.push(id);
        }
        let State::Uploading(id) = &self.state else { return Err(Error::internal("the upload ended")) };
        let parts = std::mem::take(&mut self.landed);
        self.fetcher.complete_upload(&self.location, &self.shown, id, parts, self.sent).await
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
        let State::Uploading(id) = std::mem::replace(&mut self.state, State::Done) else { return None };
        // Parts in flight end the attempt under way (one that lands after the abort would be
        // kept, and billed), but start no other.
        self.stop.store(true, Relaxed);
        let parts: Vec<_> = self.in_flight.drain(..).collect();
        let (fetcher, location, shown) = (self.fetcher.clone(), self.location.clone(), self.shown.clone());
        Some(async move {
            for part in parts {
                let _ = part.await;
            }
            fetcher.abort_upload(&location, &shown, &id).await;
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
