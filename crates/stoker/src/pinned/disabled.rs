//! Build without the `cuda` feature: heap buffers only, and every CUDA entry
//! point reports [`PinnedError::CudaUnavailable`], so callers compile unchanged.

use std::convert::Infallible;
use std::sync::Arc;

use super::{heap_buffers, CopierConfig, CopyEvent, HostBuffer, PinnedError, PoolConfig};

const NOT_BUILT: &str = "this binary was built without the `cuda` cargo feature; \
     rebuild with `--features cuda`, or pass device=None for the CPU path";

fn unavailable() -> PinnedError {
    PinnedError::CudaUnavailable { reason: NOT_BUILT.to_owned() }
}

pub(super) type HostStorage = Vec<u8>;

pub(super) fn allocate_host(cfg: &PoolConfig) -> Result<Vec<HostStorage>, PinnedError> {
    match cfg.device {
        None => heap_buffers(cfg),
        Some(_) => Err(unavailable()),
    }
}

/// Always `false`: this build cannot talk to a CUDA driver.
pub fn cuda_driver_available() -> bool {
    false
}

/// Host-to-device copier; cannot be constructed in a build without `cuda`.
#[derive(Debug)]
pub struct GpuCopier {
    never: Infallible,
}

impl GpuCopier {
    /// Always fails with [`PinnedError::CudaUnavailable`] (or `Config` for a bad config).
    pub fn new(cfg: CopierConfig) -> Result<Self, PinnedError> {
        cfg.validate()?;
        Err(unavailable())
    }

    /// Unreachable: no `GpuCopier` exists in this build.
    pub fn copy(&self, _host: &mut HostBuffer) -> Result<DeviceBatch, PinnedError> {
        match self.never {}
    }

    /// Unreachable: no `GpuCopier` exists in this build.
    pub fn buffer_bytes(&self) -> usize {
        match self.never {}
    }

    /// Unreachable: no `GpuCopier` exists in this build.
    pub fn ring_stats(&self) -> super::PoolStats {
        match self.never {}
    }
}

/// A batch on the device; cannot exist in a build without `cuda`.
#[derive(Debug)]
pub struct DeviceBatch {
    never: Infallible,
}

impl DeviceBatch {
    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn len(&self) -> usize {
        match self.never {}
    }

    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }

    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn slot_id(&self) -> usize {
        match self.never {}
    }

    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn device_ptr(&self) -> u64 {
        match self.never {}
    }

    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn is_ready(&self) -> bool {
        match self.never {}
    }

    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn wait(&self) -> Result<(), PinnedError> {
        match self.never {}
    }

    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn copy_event(&self) -> Arc<dyn CopyEvent> {
        match self.never {}
    }

    /// Unreachable: no `DeviceBatch` exists in this build.
    pub fn fence(&mut self, _ev: Arc<dyn CopyEvent>) {
        match self.never {}
    }
}
