//! The layouts a build leaves out (the `parquet` and `hdf5` features): opening one is an
//! error naming the feature and what to do, so the rest of the library is the same in every
//! build.

use crate::error::Error;

/// The error for `display`, a source of `what` that needs `feature`.
pub(crate) fn refused(display: &str, what: &str, feature: &str) -> Error {
    Error::NotSupported {
        what: format!(
            "{display}: reading {what} needs the `{feature}` feature, which this build of Stoker was compiled without \
             (build it with default features, e.g. `cargo run --release -p stoker-cli` without `--no-default-features`, \
             or install the Python wheel, which has every format)"
        ),
    }
}

/// Parquet files, without the `parquet` feature.
#[cfg(not(feature = "parquet"))]
pub(crate) mod parquet {
    use std::sync::Arc;

    use super::refused;
    use crate::error::Result;
    use crate::source::DynSampleSource;
    use crate::store::{ObjectInfo, Store};
    use crate::uri::SourceOptions;

    /// Refused: see [`refused`].
    pub(crate) async fn open(
        _: Store,
        _: Vec<ObjectInfo>,
        _: &SourceOptions,
        display: String,
    ) -> Result<Arc<DynSampleSource>> {
        Err(refused(&display, "Parquet files", "parquet"))
    }
}

/// HDF5 files, without the `hdf5` feature.
#[cfg(not(feature = "hdf5"))]
pub(crate) mod hdf5 {
    use std::sync::Arc;

    use super::refused;
    use crate::error::Result;
    use crate::source::DynSampleSource;
    use crate::store::{ObjectInfo, Store};
    use crate::uri::SourceOptions;

    /// Refused: see [`refused`].
    pub(crate) async fn open(
        _: Store,
        _: Vec<ObjectInfo>,
        _: &SourceOptions,
        display: String,
    ) -> Result<Arc<DynSampleSource>> {
        Err(refused(&display, "HDF5 files", "hdf5"))
    }
}
