//! Errors of the pinned-memory pool and the GPU copier (here, below every module that
//! reports them; `crate::pinned` re-exports it).

/// Errors from the pinned-memory pool and the GPU copier.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinnedError {
    /// CUDA cannot be used here: no driver, no device, or a build without the
    /// `cuda` feature. Callers usually fall back to `device: None`.
    #[error("CUDA unavailable: {reason}")]
    CudaUnavailable {
        /// Human-readable explanation, including what to do about it.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA error in {op}: {message}")]
    Cuda {
        /// The operation that failed, e.g. `"memcpy_htod"`.
        op: &'static str,
        /// The driver's description of the failure.
        message: String,
    },
    /// A length larger than the buffer's fixed capacity was requested.
    #[error("requested {requested} bytes but the buffer holds only {capacity}")]
    TooLarge {
        /// Bytes asked for.
        requested: usize,
        /// Fixed capacity of the buffer.
        capacity: usize,
    },
    /// The pool or copier configuration cannot work (zero sizes, allocation failure).
    #[error("invalid configuration: {message}")]
    Config {
        /// What is wrong with the configuration.
        message: String,
    },
}
