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

/// A module `$module` whose `open` refuses `$what` for want of feature `$feature`, in place of
/// the layout's own module (the resolver calls `open` alike in every build).
macro_rules! left_out {
    ($module:ident, $feature:literal, $what:literal) => {
        #[cfg(not(feature = $feature))]
        #[doc = concat!($what, ", without the `", $feature, "` feature.")]
        pub(crate) mod $module {
            use std::sync::Arc;

            use crate::error::Result;
            use crate::source::DynSampleSource;
            use crate::store::{ObjectInfo, Store};
            use crate::uri::SourceOptions;

            /// Refused: see [`refused`](super::refused).
            pub(crate) async fn open(
                _: Store,
                _: Vec<ObjectInfo>,
                _: &SourceOptions,
                display: String,
            ) -> Result<Arc<DynSampleSource>> {
                Err(super::refused(&display, $what, $feature))
            }
        }
    };
}

left_out!(parquet, "parquet", "Parquet files");
left_out!(hdf5, "hdf5", "HDF5 files");
