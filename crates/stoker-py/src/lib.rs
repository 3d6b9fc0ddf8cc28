//! `stoker._stoker`: the native half of the Python package.
//!
//! One tokio runtime per process, created lazily and created again after `fork` (a runtime's
//! threads do not survive fork; the inherited one is leaked, never used or dropped). Sources
//! are reopened per process for the same reason (connection pools, LMDB handles). Every
//! blocking call releases the GIL and, while waiting, checks for Ctrl-C.

use pyo3::prelude::*;

mod diagnose;
mod dlpack;
mod errors;
mod loader;
mod order;
mod runtime;
mod source;

use errors::{
    CorruptDataError, CudaUnavailableError, DecodeError, InvalidInputError, NotFoundError, RemoteError, StokerError,
};

#[pymodule]
fn _stoker(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<source::Source>()?;
    m.add_function(wrap_pyfunction!(diagnose::diagnose, m)?)?;
    m.add_class::<loader::Loader>()?;
    m.add_class::<loader::Epoch>()?;
    m.add_class::<loader::Batch>()?;
    m.add_class::<dlpack::DlPack>()?;
    m.add("StokerError", py.get_type::<StokerError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("CorruptDataError", py.get_type::<CorruptDataError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("RemoteError", py.get_type::<RemoteError>())?;
    m.add("CudaUnavailableError", py.get_type::<CudaUnavailableError>())?;
    Ok(())
}
