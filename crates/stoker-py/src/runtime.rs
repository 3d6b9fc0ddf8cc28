//! One tokio runtime per process, made anew after `fork`, and blocking on it with the GIL
//! released and Ctrl-C answered.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::StokerError;

/// A runtime and the process that made it.
type OwnedRuntime = (u32, Arc<tokio::runtime::Runtime>);

/// The process's runtime, made anew in a forked child.
pub(crate) fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
    static RT: OnceLock<Mutex<Option<OwnedRuntime>>> = OnceLock::new();
    let mut slot = RT.get_or_init(|| Mutex::new(None)).lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(rt.clone());
        }
        // Inherited across fork: its worker threads are gone. Dropping it would wait for them
        // forever, so it is leaked.
        if let Some((_, old)) = slot.take() {
            std::mem::forget(old);
        }
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("stoker")
            .build()
            .map_err(|e| StokerError::new_err(format!("cannot start the I/O runtime: {e}")))?,
    );
    *slot = Some((pid, rt.clone()));
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
