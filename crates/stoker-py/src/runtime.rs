//! One tokio runtime per process, made anew after `fork`, and blocking on it with the GIL
//! released and Ctrl-C answered.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::StokerError;

/// A value made by one process: dropped in that process, leaked in a process forked from it.
///
/// What a source, a loader or a runtime holds may wait, when dropped, for threads of the
/// process that made it (a runtime's workers, a cache's writes behind reads, decoding
/// threads), or take locks those threads held at the fork. Those threads do not exist in a
/// forked child, so dropping it there could wait forever; it is left as it is instead (its
/// memory is the parent's, copied on write).
pub(crate) struct Local<T> {
    /// The process generation it was made in (`stoker::fork`: no system call to ask).
    born: u32,
    value: ManuallyDrop<T>,
}

impl<T> Local<T> {
    /// `value`, made by this process.
    pub(crate) fn new(value: T) -> Self {
        Local { born: stoker::fork::generation(), value: ManuallyDrop::new(value) }
    }

    /// The value, if this process made it.
    pub(crate) fn here(&self) -> Option<&T> {
        (self.born == stoker::fork::generation()).then_some(&*self.value)
    }

    /// The value, if this process made it.
    pub(crate) fn here_mut(&mut self) -> Option<&mut T> {
        (self.born == stoker::fork::generation()).then_some(&mut *self.value)
    }

    /// The value, if this process made it, taken out (`None`, and left undropped, if not).
    pub(crate) fn into_inner(self) -> Option<T> {
        let mut me = ManuallyDrop::new(self);
        if me.born != stoker::fork::generation() {
            return None;
        }
        // SAFETY: taken once; `me` is never dropped, so the value is not dropped twice.
        Some(unsafe { ManuallyDrop::take(&mut me.value) })
    }

    /// The value, whichever process made it: only to read what it knows (a resume state),
    /// never to run it.
    pub(crate) fn inherited(&self) -> &T {
        &self.value
    }
}

impl<T> Drop for Local<T> {
    fn drop(&mut self) {
        if self.born == stoker::fork::generation() {
            // SAFETY: dropped once, here; never used again.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
    }
}

/// The process's runtime, made anew in a forked child.
pub(crate) fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
    static RT: OnceLock<Mutex<Option<Local<Arc<tokio::runtime::Runtime>>>>> = OnceLock::new();
    let mut slot = RT.get_or_init(|| Mutex::new(None)).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = slot.as_ref().and_then(Local::here) {
        return Ok(rt.clone());
    }
    // One inherited across fork is replaced (and leaked: its worker threads are gone, and
    // dropping it would wait for them forever).
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("stoker")
            .build()
            .map_err(|e| StokerError::new_err(format!("cannot start the I/O runtime: {e}")))?,
    );
    *slot = Some(Local::new(rt.clone()));
    Ok(rt)
}

/// Run `fut` on the runtime with the GIL released, checking for Ctrl-C every 100 ms.
pub(crate) fn block_on<T: Send>(py: Python<'_>, fut: impl std::future::Future<Output = T> + Send) -> PyResult<T> {
    let rt = runtime()?;
    let mut fut = Box::pin(fut);
    loop {
        let step =
            py.detach(|| rt.block_on(async { tokio::time::timeout(Duration::from_millis(100), &mut fut).await }));
        match step {
            Ok(v) => return Ok(v),
            Err(_) => py.check_signals()?,
        }
    }
}
