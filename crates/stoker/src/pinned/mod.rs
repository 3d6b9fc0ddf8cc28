//! Reusable host staging buffers and host-to-device copies for batch assembly.
//!
//! The loader fills a [`HostBuffer`] from a [`HostPool`], hands it to a
//! [`GpuCopier`], and drops it. A buffer whose copy is still in flight is
//! *fenced* with a [`CopyEvent`]; dropping it parks it on a pending list and it
//! is only handed out again once that event has completed, so DMA never reads
//! a buffer the CPU is already overwriting.
//!
//! With the `cuda` feature the pool can hand out page-locked memory and
//! [`GpuCopier`] works; without it the same API exists, the CPU path works,
//! and everything CUDA returns [`PinnedError::CudaUnavailable`]. Callers need
//! no `cfg` of their own.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use crate::error::PinnedError;

mod recycler;
use recycler::{Lease, Recycler};

#[cfg(feature = "conformance")]
mod fake;
#[cfg(feature = "conformance")]
pub use fake::FakeEvent;

#[cfg(feature = "cuda")]
#[path = "enabled.rs"]
mod imp;
#[cfg(not(feature = "cuda"))]
#[path = "disabled.rs"]
mod imp;

#[cfg(feature = "cuda")]
pub use imp::CudaCopyEvent;
pub use imp::{cuda_driver_available, DeviceBatch, GpuCopier};

/// Completion signal of asynchronous work that reads a buffer (a GPU copy).
pub trait CopyEvent: Send + Sync {
    /// Non-blocking check. Errors count as "not complete"; [`CopyEvent::wait`] reports them.
    fn is_complete(&self) -> bool;
    /// Blocks until the work has completed.
    fn wait(&self) -> Result<(), PinnedError>;
}

/// Sizes of a [`HostPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Capacity of every buffer, in bytes.
    pub buffer_bytes: usize,
    /// Number of buffers, all allocated up front.
    pub buffers: usize,
    /// `Some(ordinal)`: page-locked memory usable by that CUDA device. `None`: heap memory.
    pub device: Option<usize>,
}

/// Sizes of a [`GpuCopier`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopierConfig {
    /// CUDA device ordinal.
    pub device: usize,
    /// Capacity of every device buffer, in bytes.
    pub buffer_bytes: usize,
    /// Number of device buffers; bounds how many batches can be in flight.
    pub ring: usize,
}

/// Snapshot of a pool's counters.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Buffers the pool was created with.
    pub buffers: usize,
    /// Ready to hand out.
    pub free: usize,
    /// Returned, but their fence has not been seen complete yet.
    pub pending: usize,
    /// Held by callers.
    pub in_use: usize,
    /// Successful acquisitions so far.
    pub acquires: u64,
    /// Acquisitions that had to block.
    pub waits: u64,
    /// Acquisitions blocked now (waiting for a buffer or its fence).
    pub waiting: usize,
    /// Buffers withdrawn because waiting on their fence failed: they may still
    /// be read by the device, so they are never reused.
    pub lost: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks, so a poisoned state is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn zero_sized(what: &str) -> PinnedError {
    PinnedError::Config { message: format!("{what} must be at least 1") }
}

impl PoolConfig {
    fn validate(&self) -> Result<(), PinnedError> {
        match (self.buffers, self.buffer_bytes) {
            (0, _) => Err(zero_sized("buffers")),
            (_, 0) => Err(zero_sized("buffer_bytes")),
            _ => Ok(()),
        }
    }
}

impl CopierConfig {
    fn validate(&self) -> Result<(), PinnedError> {
        match (self.ring, self.buffer_bytes) {
            (0, _) => Err(zero_sized("ring")),
            (_, 0) => Err(zero_sized("buffer_bytes")),
            _ => Ok(()),
        }
    }
}

/// Heap buffers for the CPU path; fallible so absurd sizes become an error, not an abort.
fn heap_buffers(cfg: &PoolConfig) -> Result<Vec<Vec<u8>>, PinnedError> {
    (0..cfg.buffers)
        .map(|_| {
            let mut v = Vec::new();
            v.try_reserve_exact(cfg.buffer_bytes).map_err(|e| PinnedError::Config {
                message: format!("cannot allocate {} bytes: {e}", cfg.buffer_bytes),
            })?;
            v.resize(cfg.buffer_bytes, 0);
            Ok(v)
        })
        .collect()
}

/// Byte storage behind a [`HostBuffer`]; heap or page-locked.
trait HostBytes: Send {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
    fn pinned(&self) -> bool;
}

impl HostBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
    fn pinned(&self) -> bool {
        false
    }
}

/// A pool of fixed-size host buffers, allocated once and reused forever.
///
/// Cloning is cheap and shares the same buffers. The memory is freed when the
/// last handle and the last [`HostBuffer`] are gone, and only after every
/// pending fence has completed (that drop blocks on them).
#[derive(Clone)]
pub struct HostPool {
    inner: Arc<Recycler<imp::HostStorage>>,
    buffer_bytes: usize,
}

impl HostPool {
    /// Allocates every buffer up front; page-locked when `cfg.device` is `Some`.
    pub fn new(cfg: PoolConfig) -> Result<Self, PinnedError> {
        cfg.validate()?;
        let storage = imp::allocate_host(&cfg)?;
        Ok(HostPool { inner: Recycler::new(storage), buffer_bytes: cfg.buffer_bytes })
    }

    /// Blocks until a buffer is free; when only fenced buffers remain, waits on the oldest fence.
    ///
    /// Fails with [`PinnedError::Cuda`] once every buffer was lost to failed fence waits (see
    /// [`PoolStats::lost`]): the CUDA context is unusable and nothing will come back.
    pub fn acquire(&self) -> Result<HostBuffer, PinnedError> {
        self.inner.acquire().map(HostBuffer::new).map_err(|_| all_lost())
    }

    /// A free buffer if there is one right now.
    pub fn try_acquire(&self) -> Option<HostBuffer> {
        self.inner.try_acquire().map(HostBuffer::new)
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        self.inner.stats()
    }

    /// Capacity of each buffer in bytes.
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }
}

/// The error for a pool or ring whose every buffer was withdrawn after failed copy events.
pub(crate) fn all_lost() -> PinnedError {
    PinnedError::Cuda {
        op: "acquire",
        message: "every buffer of this pool was lost to failed copy events; the CUDA context is unusable \
                  (recreate the loader, or use device=None)"
            .to_owned(),
    }
}

impl fmt::Debug for HostPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostPool").field("buffer_bytes", &self.buffer_bytes).field("stats", &self.stats()).finish()
    }
}

/// A buffer on loan from a [`HostPool`]; returns there on drop.
///
/// Derefs to all `buffer_bytes` bytes; [`HostBuffer::len`] is the part in use
/// (and shadows the slice's `len`). Mutable access first waits for any fence,
/// so the CPU never writes bytes a copy is still reading.
pub struct HostBuffer {
    lease: Lease<imp::HostStorage>,
    len: usize,
}

impl HostBuffer {
    fn new(lease: Lease<imp::HostStorage>) -> Self {
        HostBuffer { lease, len: 0 }
    }

    /// Stable identity of the underlying buffer within its pool (`0..buffers`).
    pub fn id(&self) -> usize {
        self.lease.slot().id
    }

    /// Fixed capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.lease.item().bytes().len()
    }

    /// Bytes in use, as set by [`HostBuffer::set_len`]; 0 when acquired.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Marks the first `len` bytes as in use.
    pub fn set_len(&mut self, len: usize) -> Result<(), PinnedError> {
        let capacity = self.capacity();
        if len > capacity {
            return Err(PinnedError::TooLarge { requested: len, capacity });
        }
        self.len = len;
        Ok(())
    }

    /// The bytes in use, `&self[..self.len()]`.
    pub fn filled(&self) -> &[u8] {
        &self.lease.item().bytes()[..self.len]
    }

    /// Whether this is page-locked memory.
    pub fn is_pinned(&self) -> bool {
        self.lease.item().pinned()
    }

    /// Records asynchronous work reading this buffer; it is not reused (nor
    /// mutably borrowed) until `ev` completes. Reclaim order follows fence order.
    pub fn fence(&mut self, ev: Arc<dyn CopyEvent>) {
        self.lease.fence(ev);
    }

    /// Whether fences not yet seen complete remain.
    pub fn is_fenced(&self) -> bool {
        self.lease.open_fences() > 0
    }

    /// Blocks until every fence completed; use it to handle wait errors instead
    /// of the panic in `deref_mut`.
    pub fn wait_fences(&mut self) -> Result<(), PinnedError> {
        self.lease.wait_fences()
    }
}

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // Reading while a host-to-device copy also reads is harmless: no wait.
        self.lease.item().bytes()
    }
}

impl DerefMut for HostBuffer {
    /// # Panics
    /// If waiting on a fence fails; call [`HostBuffer::wait_fences`] first to handle that.
    fn deref_mut(&mut self) -> &mut [u8] {
        if let Err(e) = self.lease.wait_fences() {
            panic!("cannot write a HostBuffer whose copy failed to complete: {e}");
        }
        self.lease.item_mut().bytes_mut()
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("id", &self.id())
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("open_fences", &self.lease.open_fences())
            .finish()
    }
}
