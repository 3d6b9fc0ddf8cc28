//! Build with the `cuda` feature: page-locked host buffers and async
//! host-to-device copies on a dedicated stream, through cudarc's driver API.
//!
//! libcuda is loaded at run time, so this build still runs (CPU path only) on
//! machines without an NVIDIA driver.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, DriverError, PinnedHostSlice,
};

use super::{
    heap_buffers, CopierConfig, CopyEvent, HostBuffer, HostBytes, Lease, PinnedError, PoolConfig, PoolStats, Recycler,
};

const NO_DRIVER: &str = "no CUDA driver found (libcuda.so); run on a machine with an NVIDIA \
     driver, or pass device=None for the CPU path";

fn cuda_err(op: &'static str) -> impl FnOnce(DriverError) -> PinnedError {
    move |e| PinnedError::Cuda { op, message: e.to_string() }
}

/// Whether libcuda can be loaded. Checked once; every cudarc call is gated on
/// it because cudarc panics when the library is missing.
pub fn cuda_driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate library names and closes them again.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn open_context(ordinal: usize) -> Result<Arc<CudaContext>, PinnedError> {
    if !cuda_driver_available() {
        return Err(PinnedError::CudaUnavailable { reason: NO_DRIVER.to_owned() });
    }
    // cudarc panics on a driver too old to export a symbol it loads; turn that
    // into the same recoverable error (only effective with panic=unwind).
    match catch_unwind(AssertUnwindSafe(|| CudaContext::new(ordinal))) {
        Ok(Ok(ctx)) => Ok(ctx),
        Ok(Err(e)) => Err(PinnedError::CudaUnavailable { reason: format!("cannot open CUDA device {ordinal}: {e}") }),
        Err(_) => Err(PinnedError::CudaUnavailable {
            reason: "the CUDA driver (libcuda.so) lacks a required entry point; \
                     update the NVIDIA driver, or pass device=None for the CPU path"
                .to_owned(),
        }),
    }
}

/// Page-locked allocation plus a cached pointer to it, so byte access needs no
/// driver call (cudarc's accessors synchronize an event on every use).
pub(super) struct PinnedBytes {
    ptr: NonNull<u8>,
    len: usize,
    _alloc: PinnedHostSlice<u8>,
}

// SAFETY: `ptr` points into `_alloc`, which is owned uniquely by this value and
// is itself Send + Sync; access follows ordinary `&`/`&mut` rules.
unsafe impl Send for PinnedBytes {}
// SAFETY: as above; `&PinnedBytes` only gives out `&[u8]`.
unsafe impl Sync for PinnedBytes {}

impl PinnedBytes {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, PinnedError> {
        // PORTABLE, not cudarc's default WRITECOMBINED: the CPU also reads these
        // buffers, and reads of write-combined memory are uncached and very slow.
        // SAFETY: the memory is uninitialised; it is zeroed below before any read.
        let mut alloc = unsafe {
            ctx.alloc_pinned_with_flags::<u8>(len, sys::CU_MEMHOSTALLOC_PORTABLE).map_err(cuda_err("cuMemHostAlloc"))?
        };
        let raw = alloc.as_mut_ptr().map_err(cuda_err("cuMemHostAlloc"))?;
        let ptr = NonNull::new(raw).ok_or_else(|| PinnedError::Cuda {
            op: "cuMemHostAlloc",
            message: "driver returned a null pointer".to_owned(),
        })?;
        // SAFETY: `ptr` is valid for `len` writable bytes and not yet shared.
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        Ok(PinnedBytes { ptr, len, _alloc: alloc })
    }
}

/// Heap or page-locked bytes behind a `HostBuffer`.
pub(super) enum HostStorage {
    Heap(Vec<u8>),
    Pinned(PinnedBytes),
}

impl HostBytes for HostStorage {
    fn bytes(&self) -> &[u8] {
        match self {
            HostStorage::Heap(v) => v,
            // SAFETY: valid, initialised allocation of `len` bytes owned by `p`.
            HostStorage::Pinned(p) => unsafe { std::slice::from_raw_parts(p.ptr.as_ptr(), p.len) },
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            HostStorage::Heap(v) => v,
            // SAFETY: as in `bytes`, and `&mut self` guarantees exclusivity.
            HostStorage::Pinned(p) => unsafe { std::slice::from_raw_parts_mut(p.ptr.as_ptr(), p.len) },
        }
    }
    fn pinned(&self) -> bool {
        matches!(self, HostStorage::Pinned(_))
    }
}

pub(super) fn allocate_host(cfg: &PoolConfig) -> Result<Vec<HostStorage>, PinnedError> {
    match cfg.device {
        None => Ok(heap_buffers(cfg)?.into_iter().map(HostStorage::Heap).collect()),
        Some(ordinal) => {
            let ctx = open_context(ordinal)?;
            (0..cfg.buffers).map(|_| PinnedBytes::new(&ctx, cfg.buffer_bytes).map(HostStorage::Pinned)).collect()
        }
    }
}

/// A [`CopyEvent`] backed by a recorded [`CudaEvent`].
#[derive(Debug)]
pub struct CudaCopyEvent {
    event: CudaEvent,
}

impl CudaCopyEvent {
    /// Records all work queued on `stream` so far.
    pub fn record(stream: &CudaStream) -> Result<Self, PinnedError> {
        // BLOCKING_SYNC so waiting threads sleep instead of spinning a core the
        // loader needs for decoding.
        let flags = Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC);
        let event = stream.record_event(flags).map_err(cuda_err("record_event"))?;
        Ok(CudaCopyEvent { event })
    }

    /// The underlying event, e.g. for `CudaStream::wait`.
    pub fn event(&self) -> &CudaEvent {
        &self.event
    }
}

impl CopyEvent for CudaCopyEvent {
    fn is_complete(&self) -> bool {
        self.event.try_is_complete().unwrap_or(false)
    }
    fn wait(&self) -> Result<(), PinnedError> {
        self.event.synchronize().map_err(cuda_err("cuEventSynchronize"))
    }
}

/// One device buffer of the ring, with its address cached so handing it out
/// needs no driver call.
struct DeviceSlot {
    buf: CudaSlice<u8>,
    ptr: sys::CUdeviceptr,
}

/// Copies host batches to the GPU on its own stream into a ring of device buffers.
pub struct GpuCopier {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ring: Arc<Recycler<DeviceSlot>>,
    buffer_bytes: usize,
}

impl GpuCopier {
    /// Opens the device, creates the copy stream and allocates the ring.
    pub fn new(cfg: CopierConfig) -> Result<Self, PinnedError> {
        cfg.validate()?;
        let ctx = open_context(cfg.device)?;
        let stream = ctx.new_stream().map_err(cuda_err("new_stream"))?;
        let mut slots = Vec::with_capacity(cfg.ring);
        for _ in 0..cfg.ring {
            let buf = stream.alloc_zeros::<u8>(cfg.buffer_bytes).map_err(cuda_err("alloc_zeros"))?;
            let ptr = {
                let (ptr, _sync) = buf.device_ptr(&stream);
                ptr
            };
            slots.push(DeviceSlot { buf, ptr });
        }
        stream.synchronize().map_err(cuda_err("synchronize"))?;
        Ok(GpuCopier { ctx, stream, ring: Recycler::new(slots), buffer_bytes: cfg.buffer_bytes })
    }

    /// Queues a copy of `host.filled()` into a free device buffer and returns
    /// at once; `host` is fenced so the pool will not reuse it mid-copy.
    ///
    /// Blocks while every device buffer is held by un-dropped [`DeviceBatch`]es
    /// (or fenced by them), so don't hold `ring` batches on the calling thread.
    pub fn copy(&self, host: &mut HostBuffer) -> Result<DeviceBatch, PinnedError> {
        let len = host.len();
        if len > self.buffer_bytes {
            return Err(PinnedError::TooLarge { requested: len, capacity: self.buffer_bytes });
        }
        let mut slot = self.ring.acquire().map_err(|_| super::all_lost())?;
        self.stream.memcpy_htod(host.filled(), &mut slot.item_mut().buf).map_err(cuda_err("memcpy_htod"))?;
        let event = match CudaCopyEvent::record(&self.stream) {
            Ok(ev) => Arc::new(ev),
            Err(e) => {
                // Without an event the copy may still be reading `host`: drain the
                // stream so the buffer is safe to reuse before reporting.
                let _ = self.stream.synchronize();
                return Err(e);
            }
        };
        host.fence(event.clone());
        slot.fence(event.clone());
        Ok(DeviceBatch { slot, len, event })
    }

    /// Capacity of each device buffer in bytes.
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// Counters of the device ring.
    pub fn ring_stats(&self) -> PoolStats {
        self.ring.stats()
    }

    /// The dedicated copy stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's (primary) context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl std::fmt::Debug for GpuCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCopier")
            .field("device", &self.ctx.ordinal())
            .field("buffer_bytes", &self.buffer_bytes)
            .field("ring", &self.ring.stats())
            .finish()
    }
}

/// A batch in device memory, valid once its copy event completes.
///
/// Wait with [`DeviceBatch::wait`] (host) or [`DeviceBatch::stream_wait`]
/// (device) before reading. Dropping it returns the device buffer to the ring;
/// if kernels still read it, fence it first ([`DeviceBatch::release_after`]).
pub struct DeviceBatch {
    slot: Lease<DeviceSlot>,
    len: usize,
    event: Arc<CudaCopyEvent>,
}

impl DeviceBatch {
    /// Bytes copied.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether zero bytes were copied.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Which ring buffer holds the data (`0..ring`).
    pub fn slot_id(&self) -> usize {
        self.slot.slot().id
    }

    /// Raw device address of the data (`CUdeviceptr`), for foreign kernels or frameworks.
    pub fn device_ptr(&self) -> u64 {
        self.slot.item().ptr
    }

    /// The copied bytes as a cudarc view; cudarc's event tracking orders kernels using it.
    pub fn view(&self) -> CudaView<'_, u8> {
        self.slot.item().buf.slice(..self.len)
    }

    /// Whether the copy has completed.
    pub fn is_ready(&self) -> bool {
        self.event.is_complete()
    }

    /// Blocks the calling thread until the copy has completed.
    pub fn wait(&self) -> Result<(), PinnedError> {
        self.event.wait()
    }

    /// Makes `stream` wait for the copy without blocking the host.
    pub fn stream_wait(&self, stream: &CudaStream) -> Result<(), PinnedError> {
        stream.wait(self.event.event()).map_err(cuda_err("stream_wait"))
    }

    /// The copy's completion event.
    pub fn copy_event(&self) -> Arc<dyn CopyEvent> {
        self.event.clone()
    }

    /// The copy's completion event as a cudarc event.
    pub fn cuda_event(&self) -> &CudaEvent {
        self.event.event()
    }

    /// Keeps the device buffer out of the ring until `ev` completes, even after drop.
    pub fn fence(&mut self, ev: Arc<dyn CopyEvent>) {
        self.slot.fence(ev);
    }

    /// Fences with an event recorded on `stream` now: call after queuing the
    /// kernels that read this batch, then drop it.
    pub fn release_after(&mut self, stream: &CudaStream) -> Result<(), PinnedError> {
        let ev = CudaCopyEvent::record(stream)?;
        self.fence(Arc::new(ev));
        Ok(())
    }
}

impl std::fmt::Debug for DeviceBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch")
            .field("slot", &self.slot_id())
            .field("len", &self.len)
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr()))
            .finish()
    }
}
