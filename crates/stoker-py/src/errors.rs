//! The Python exception hierarchy and the mapping from Stoker's errors onto it.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(_stoker, StokerError, PyException, "Any error from Stoker.");
create_exception!(_stoker, NotFoundError, StokerError, "A path, object or bucket does not exist.");
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

pub(crate) fn err(e: stoker::Error) -> PyErr {
    use stoker::Error as E;
    let msg = e.to_string();
    match e {
        E::NotFound { .. } | E::Empty { .. } => NotFoundError::new_err(msg),
        E::InvalidUri { .. }
        | E::InvalidOption { .. }
        | E::IndexOutOfRange { .. }
        | E::MissingField { .. }
        | E::MixSchema { .. } => InvalidInputError::new_err(msg),
        E::Sampler(_) | E::NotSupported { .. } => InvalidInputError::new_err(msg),
        E::CorruptTar { .. } | E::CorruptData { .. } | E::BadIndex { .. } | E::Lmdb { .. } => {
            CorruptDataError::new_err(msg)
        }
        E::Decode { .. } => DecodeError::new_err(msg),
        E::Fetch { .. } | E::Store { .. } | E::Shared(_) => RemoteError::new_err(msg),
        E::Pinned(stoker::pinned::PinnedError::CudaUnavailable { .. }) => CudaUnavailableError::new_err(msg),
        _ => StokerError::new_err(msg),
    }
}
