//! Listings: every object under a prefix, page after page, picked up after the last name
//! listed when a page fails, and refused when the store names an object twice.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::ObjectMeta;

use super::retry::{classify_listing, Failure};
use super::Fetcher;
use crate::error::Result;

/// What a listing has found so far, kept across its attempts.
#[derive(Default)]
struct Listed {
    all: Vec<ObjectMeta>,
    /// Where each name was listed, by a hash of it (see [`Fetcher::list_from`]).
    seen: HashMap<u64, usize>,
    /// A name came after a greater one: the store does not list in name order (S3 Express
    /// directory buckets), so a failed page cannot be picked up after the last name.
    unordered: bool,
}

impl Fetcher {
    /// Every object under `prefix`. A page that fails is asked again from the last name
    /// listed (stores list in name order; one found not to is listed again from the start),
    /// not the whole listing from the start: a listing of
    /// thousands of pages would otherwise fail at a failure rate of a fraction of a percent.
    /// Attempts are counted between names: a run of attempts that ran out having listed more
    /// starts anew from there. A server that answers that it cannot list (405, 501: a plain
    /// HTTP server has no listing) is not asked again: the error says how to name the data
    /// instead.
    pub async fn list(&self, prefix: Option<&ObjPath>, shown: &str) -> Result<Vec<ObjectMeta>> {
        let state = Mutex::new(Listed::default());
        let listed = || state.lock().unwrap_or_else(|e| e.into_inner()).all.len();
        loop {
            let before = listed();
            // A listing may page through millions of names: no deadline over all of it, but
            // each page must come within the stall timeout.
            let run = self.retrying(shown, || "listing".to_string(), None, || self.list_from(prefix, &state)).await;
            match run {
                Ok(()) => return Ok(std::mem::take(&mut state.lock().unwrap_or_else(|e| e.into_inner()).all)),
                Err(e) if e.is_retryable() && listed() > before => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt: the objects under `prefix` after the last one in `state`, into it.
    async fn list_from(&self, prefix: Option<&ObjPath>, state: &Mutex<Listed>) -> std::result::Result<(), Failure> {
        self.counters.requests.fetch_add(1, Relaxed);
        let last = {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            if s.unordered {
                *s = Listed::default();
            }
            s.all.last().map(|m| m.location.clone())
        };
        let mut pages = match &last {
            None => self.store.list(prefix),
            Some(after) => self.store.list_with_offset(prefix, after),
        };
        loop {
            let meta = match tokio::time::timeout(self.cfg.stall, pages.next()).await {
                Err(_) => {
                    let n = state.lock().unwrap_or_else(|e| e.into_inner()).all.len();
                    return Err(Failure::transient(format!(
                        "the listing stalled: nothing for {:?} after {n} names (stall_ms); abandoned",
                        self.cfg.stall
                    )));
                }
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return Err(classify_listing(e)),
                Ok(Some(Ok(meta))) => meta,
            };
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            // A listing names each object once, and one that names an object again is not
            // moving on (a server that repeats a page or its continuation token): it would
            // list forever, or list those objects twice, their samples twice an epoch.
            let key = twox_hash::XxHash3_64::oneshot(meta.location.as_ref().as_bytes());
            if let Some(&i) = s.seen.get(&key) {
                if s.all[i].location == meta.location {
                    return Err(Failure::fatal(format!(
                        "the listing named {} twice, after {} names: the store's listing does not move on (it \
                         repeats a page or its continuation token); name the objects instead (a brace pattern, or \
                         list= a file of names)",
                        meta.location,
                        s.all.len()
                    )));
                }
            }
            if s.all.last().is_some_and(|prev| prev.location.as_ref() >= meta.location.as_ref()) {
                s.unordered = true;
            }
            let at = s.all.len();
            s.seen.insert(key, at);
            s.all.push(meta);
        }
    }
}
