//! The Python exception hierarchy and the mapping from Stoker's errors onto it.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(_stoker, StokerError, PyException, "Any error from Stoker.");
create_exception!(_stoker, NotFoundError, StokerError, "A path, object or bucket does not exist, or holds no samples.");
create_exception!(_stoker, InvalidInputError, StokerError, "A bad URI, option, index or configuration.");
create_exception!(_stoker, CorruptDataError, StokerError, "A shard, index or LMDB file is damaged.");
create_exception!(
    _stoker,
    DecodeError,
    CorruptDataError,
    "A sample's field could not be decoded (corrupt, truncated, unsupported or oversized image; bad label or array)."
);
create_exception!(_stoker, RemoteError, StokerError, "A remote store failed (after retries when transient).");
create_exception!(_stoker, CudaUnavailableError, StokerError, "CUDA was asked for but cannot be used here.");

/// The Python exception for a Stoker error, chosen by its [`kind`](stoker::Error::kind): the
/// same whether or not the error reached us through a single-flight cache. A Python callback's
/// own exception (a `step` that raised) becomes the `__cause__`.
pub(crate) fn err(e: stoker::Error) -> PyErr {
    use stoker::ErrorKind as K;
    let msg = e.to_string();
    let py_err = match e.kind() {
        K::NotFound | K::Empty => NotFoundError::new_err(msg),
        K::InvalidInput | K::Unsupported => InvalidInputError::new_err(msg),
        K::Corrupt => CorruptDataError::new_err(msg),
        K::Decode => DecodeError::new_err(msg),
        K::Remote => RemoteError::new_err(msg),
        K::CudaUnavailable => CudaUnavailableError::new_err(msg),
        // Io, Conflict, Cuda, Callback, Resource, Internal, and kinds added later.
        _ => StokerError::new_err(msg),
    };
    if let Some(cause) = python_cause(&e) {
        Python::attach(|py| py_err.set_cause(py, Some(cause.clone_ref(py))));
    }
    py_err
}

/// The Python exception a callback raised, if `e` is that callback's failure.
fn python_cause(mut e: &stoker::Error) -> Option<&PyErr> {
    while let stoker::Error::Shared(inner) = e {
        e = inner;
    }
    match e {
        stoker::Error::Callback { source, .. } => source.downcast_ref::<PyErr>(),
        _ => None,
    }
}
