//! `stoker._stoker`: the native half of the Python package.
//!
//! One tokio runtime per process, created lazily and created again after `fork` (a runtime's
//! threads do not survive fork; the inherited one is leaked, never used or dropped). Sources
//! are reopened per process for the same reason (connection pools, LMDB handles). Every
//! blocking call releases the GIL and, while waiting, checks for Ctrl-C.

use pyo3::prelude::*;

/// mimalloc, not glibc's malloc, for the extension's own (Rust) allocations. Decoding formats
/// stored in big pages (a Parquet column chunk of 64 KiB images is one 64 MiB page) allocates
/// and frees buffers of tens of MiB per shard; glibc serves each from a fresh `mmap` (its
/// threshold stops at 32 MiB), so every page of every buffer faults and is zeroed again, which
/// took half the CPU of a sequential Parquet epoch. mimalloc keeps freed pages for reuse, as
/// pyarrow's allocator does. Built with `local_dynamic_tls` (the extension is `dlopen`ed, and
/// the static TLS block is not its to claim) and `no_thp` (no huge-page advice on its arenas;
/// nothing process-wide is changed, see the CLI's main.rs). Python's own objects keep using
/// the interpreter's allocator: this is Rust's global allocator, nothing is interposed.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod diagnose;
mod dlpack;
mod errors;
mod loader;
mod order;
mod runtime;
mod secrets;
mod source;
mod tokens;
mod write;

use errors::{
    CorruptDataError, CudaUnavailableError, DecodeError, InvalidInputError, NotFoundError, RemoteError, StokerError,
};

#[pymodule]
fn _stoker(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<source::Source>()?;
    m.add_function(wrap_pyfunction!(diagnose::diagnose, m)?)?;
    m.add_function(wrap_pyfunction!(order::cache_block_for, m)?)?;
    m.add_function(wrap_pyfunction!(secrets::redact, m)?)?;
    m.add_function(wrap_pyfunction!(secrets::redact_text, m)?)?;
    m.add_function(wrap_pyfunction!(secrets::is_secret_option, m)?)?;
    m.add_class::<loader::Loader>()?;
    m.add_class::<loader::Epoch>()?;
    m.add_class::<loader::Batch>()?;
    m.add_class::<tokens::TokenLoader>()?;
    m.add_class::<tokens::TokenEpoch>()?;
    m.add_class::<dlpack::DlPack>()?;
    m.add_class::<write::ShardWriter>()?;
    m.add_class::<write::ShardStream>()?;
    m.add_function(wrap_pyfunction!(write::index, m)?)?;
    m.add_function(wrap_pyfunction!(write::pack, m)?)?;
    m.add_function(wrap_pyfunction!(write::demo, m)?)?;
    m.add("StokerError", py.get_type::<StokerError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("CorruptDataError", py.get_type::<CorruptDataError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("RemoteError", py.get_type::<RemoteError>())?;
    m.add("CudaUnavailableError", py.get_type::<CudaUnavailableError>())?;
    Ok(())
}
